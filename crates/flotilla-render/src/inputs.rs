//! What each cluster's bundle is made from, as digests: a cluster's own part and one
//! per workload that targets it. Two snapshots in which a cluster has the same
//! inputs give it the same bundle (with the same limits), so a render after a commit
//! need only render the clusters whose inputs changed ([`crate::render_since`]), and
//! of those, when only some workloads' parts changed and no custom scope is in play,
//! only those workloads: the others' resources are the same.
//!
//! A cluster's bundle is a function of: its own file; the groups it belongs to
//! (their names and files, which carry their variables); the workloads that target
//! it (the workload file, its parsed manifests and kustomize output as the renderer
//! sees them, and its templates' text); the overlays that select it (their files);
//! and, for every cluster, the files the snapshot skipped (a manifest or kustomize
//! input too large to read is an error where it is used) and the tenants' files. A
//! template that includes, imports or extends another can reach any template the renderer compiles, so when
//! any template does, every templated workload depends on all of them (which ones,
//! and their text). Templates cannot otherwise see each other: `debug()`, which
//! prints the engine's state, is taken out of the engine.
//! Anything a cluster's bundle does not depend on (rollout policies, other clusters,
//! files the renderer does not read) is left out, so changing it reaches no cluster.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rayon::prelude::*;
use sha2::{Digest as _, Sha256};

use flotilla_core::snapshot::FleetSnapshot;

use crate::load::{Cluster, Fleet};
use crate::select::{selecting_overlays, targeted_workloads};

/// A sha256 digest of some of what a bundle is made from.
pub type InputDigest = [u8; 32];

/// The workloads that target a cluster, each with the digest of its own part.
pub type WorkloadInputs = Arc<[(Arc<str>, InputDigest)]>;

/// What one cluster's bundle is made from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterInput {
    /// All but the workloads' own parts: the cluster's file, its groups, the
    /// overlays that select it, and which workloads target it.
    pub own: InputDigest,
    /// The workloads that target it, in the fleet's order, each with the digest of
    /// its own part (its file, manifests, kustomize output and templates). Clusters
    /// targeted by the same workloads share one list.
    pub workloads: WorkloadInputs,
}

/// Per cluster, what its bundle is made from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterInputs {
    pub clusters: BTreeMap<String, ClusterInput>,
}

impl ClusterInputs {
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }
}

/// A length-prefixed field, so that no two different sequences of fields hash alike.
fn put(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

fn file_digest(snapshot: &FleetSnapshot, path: &str) -> InputDigest {
    let mut hasher = Sha256::new();
    put(&mut hasher, path.as_bytes());
    match (snapshot.files.get(path), snapshot.binaries.get(path)) {
        (Some(text), _) => {
            hasher.update([1]);
            put(&mut hasher, text.as_bytes());
        }
        (None, Some(bytes)) => {
            hasher.update([2]);
            put(&mut hasher, bytes);
        }
        (None, None) => hasher.update([0]),
    }
    hasher.finalize().into()
}

/// A hasher begun with an object's name and its file (path and text).
fn named_file(snapshot: &FleetSnapshot, name: &str, path: &str) -> Sha256 {
    let mut hasher = Sha256::new();
    put(&mut hasher, name.as_bytes());
    hasher.update(file_digest(snapshot, path));
    hasher
}

/// Whether a template's text holds a tag that loads another template
/// (`{% include %}`, `{% import %}`, `{% from %}`, `{% extends %}`). Errs on the
/// side of yes: any such word first in any `{% … %}` counts.
fn loads_other_templates(text: &str) -> bool {
    text.match_indices("{%").any(|(at, _)| {
        let rest = text[at + 2..].trim_start_matches(['-', '+']).trim_start();
        let word: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        matches!(word.as_str(), "include" | "import" | "from" | "extends")
    })
}

/// The digest of every workload's part: its file, its documents as the renderer
/// reads them, and its templates' text (every template's, if any template loads
/// another).
fn workload_digests(snapshot: &FleetSnapshot, fleet: &Fleet) -> Vec<InputDigest> {
    // The templates the renderer compiles: those of the workloads that loaded.
    let templates: Vec<&String> = fleet.workloads.iter().flat_map(|w| &w.templates).collect();
    let shared: Option<InputDigest> = templates
        .iter()
        .any(|path| {
            snapshot
                .files
                .get(*path)
                .is_some_and(|t| loads_other_templates(t))
        })
        .then(|| {
            let mut hasher = Sha256::new();
            put(&mut hasher, &(templates.len() as u64).to_le_bytes());
            for path in &templates {
                hasher.update(file_digest(snapshot, path));
            }
            hasher.finalize().into()
        });
    fleet
        .workloads
        .par_iter()
        .map(|workload| {
            let mut hasher = named_file(snapshot, &workload.name, &workload.file);
            put(
                &mut hasher,
                &(workload.documents.len() as u64).to_le_bytes(),
            );
            for document in workload.documents.iter() {
                put(&mut hasher, document.file.as_bytes());
                put(&mut hasher, &document.line.to_le_bytes());
                // As parsed, not canonical: `80` and `80.0` are one in canonical
                // JSON but not to every step of the render (a strategic merge keys
                // list items by the number as written).
                let parsed = serde_json::to_vec(&document.value).unwrap_or_default();
                put(&mut hasher, &parsed);
            }
            put(
                &mut hasher,
                &(workload.templates.len() as u64).to_le_bytes(),
            );
            for path in &workload.templates {
                hasher.update(file_digest(snapshot, path));
            }
            // A Helm workload: its chart's files and its values files (a `.j2` one's
            // context is the cluster's own part).
            let helm_inputs = workload.helm.as_ref().map_or(&[][..], |r| &r.inputs[..]);
            put(&mut hasher, &(helm_inputs.len() as u64).to_le_bytes());
            for path in helm_inputs {
                hasher.update(file_digest(snapshot, path));
            }
            let templated_values = workload.helm.as_ref().is_some_and(|r| {
                r.values_files
                    .iter()
                    .any(|f| matches!(f, crate::release::ValuesFile::Template { .. }))
            });
            if let (true, Some(shared)) =
                (!workload.templates.is_empty() || templated_values, shared)
            {
                hasher.update(shared);
            }
            hasher.finalize().into()
        })
        .collect()
}

/// What [`of_fleet`] finds, besides the inputs, per cluster (in the order given).
pub(crate) struct Found {
    /// The indices of the workloads that target it.
    pub targeted: Vec<Vec<usize>>,
    /// The indices of the overlays that select it.
    pub selecting: Vec<Vec<usize>>,
}

/// Every cluster's inputs, the workloads that target it and the overlays that
/// select it. `clusters` and `memberships` are every cluster of `fleet` with the
/// indices of the groups it belongs to.
pub(crate) fn of_fleet(
    snapshot: &FleetSnapshot,
    fleet: &Fleet,
    clusters: &[&Cluster],
    memberships: &[Vec<usize>],
) -> (ClusterInputs, Found) {
    let skipped: InputDigest = {
        let mut hasher = Sha256::new();
        for (path, reason) in &snapshot.skipped {
            put(&mut hasher, path.as_bytes());
            put(&mut hasher, reason.as_bytes());
        }
        // Tenants decide which overlays act on which workloads and what their
        // resources may be: they reach every cluster.
        hasher.update(b"tenants");
        for tenant in &fleet.tenants {
            hasher.update(file_digest(snapshot, &tenant.file));
        }
        hasher.update(file_digest(snapshot, crate::tenancy::SIGNED_RULES_FILE));
        hasher.finalize().into()
    };
    let groups: Vec<InputDigest> = fleet
        .groups
        .iter()
        .map(|g| named_file(snapshot, &g.name, &g.file).finalize().into())
        .collect();
    let workloads = workload_digests(snapshot, fleet);
    let overlays: Vec<InputDigest> = fleet
        .overlays
        .iter()
        .map(|o| file_digest(snapshot, &o.file))
        .collect();
    let names: Vec<Arc<str>> = fleet
        .workloads
        .iter()
        .map(|w| Arc::from(w.name.as_str()))
        .collect();
    let found: Vec<(InputDigest, Vec<usize>, Vec<usize>)> = clusters
        .par_iter()
        .zip(memberships.par_iter())
        .map(|(cluster, member_of)| {
            let mut hasher = Sha256::new();
            hasher.update(skipped);
            // The fleet's settings (the Kubernetes version charts see) reach every
            // cluster.
            hasher.update(file_digest(snapshot, "flotilla.yaml"));
            put(&mut hasher, cluster.name.as_bytes());
            hasher.update(file_digest(snapshot, &cluster.file));
            hasher.update(b"groups");
            for &g in member_of {
                hasher.update(groups[g]);
            }
            hasher.update(b"overlays");
            let selecting: Vec<usize> = selecting_overlays(fleet, cluster, member_of);
            for &o in &selecting {
                hasher.update(overlays[o]);
            }
            // Which selecting overlays apply to each workload follows from their
            // files and the workloads' names, both hashed.
            hasher.update(b"workloads");
            let targeted = targeted_workloads(fleet, cluster, member_of);
            for &w in &targeted {
                put(&mut hasher, names[w].as_bytes());
            }
            (hasher.finalize().into(), targeted, selecting)
        })
        .collect();
    let mut inputs = ClusterInputs::default();
    let mut lists: HashMap<&[usize], WorkloadInputs> = HashMap::new();
    for (cluster, (own, targeted, _)) in clusters.iter().zip(&found) {
        let workloads = lists
            .entry(targeted.as_slice())
            .or_insert_with(|| {
                targeted
                    .iter()
                    .map(|&w| (names[w].clone(), workloads[w]))
                    .collect()
            })
            .clone();
        inputs.clusters.insert(
            cluster.name.clone(),
            ClusterInput {
                own: *own,
                workloads,
            },
        );
    }
    drop(lists);
    let (targeted, selecting) = found.into_iter().map(|(_, t, s)| (t, s)).unzip();
    (
        inputs,
        Found {
            targeted,
            selecting,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::loads_other_templates;

    #[test]
    fn finds_tags_that_load_other_templates() {
        for text in [
            "{% include 'a.j2' %}",
            "{%- import 'm.j2' as m %}",
            "{%+ from 'm.j2' import x %}",
            "{%   extends 'base.j2' %}",
            "x: 1\n{% if a %}{% include other %}{% endif %}",
        ] {
            assert!(loads_other_templates(text), "{text}");
        }
        for text in [
            "valueFrom: {{ x }}",
            "{% for from_ in xs %}{% endfor %}",
            "{{ 'include' }}",
            "{% set imported = 1 %}",
            "{% if x %}",
            "{%",
        ] {
            assert!(!loads_other_templates(text), "{text}");
        }
    }
}
