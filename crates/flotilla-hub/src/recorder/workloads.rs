//! Which workload each resource of a bundle comes from, as the hub's own renders
//! said, per bundle digest ([`RenderedWorkloads`]). A bundle names its resources'
//! workloads (`meta.workloads`) only when its agent needs them, so the web page asks
//! here for the others. Clusters served one digest share its list, and the lists
//! share their names: a fleet of 10,000 clusters with a few distinct digests keeps a
//! few lists.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use flotilla_core::bundle::{Digest, TENANCY_WORKLOAD};
use flotilla_render::tenancy::TENANCY_POSITION;
use flotilla_render::{ClusterProvenance, RenderOutput, inputs::ClusterInput};

/// A bundle's workloads: each resource's, in bundle order.
pub type WorkloadList = Arc<[Arc<str>]>;

/// Per bundle digest the hub rendered, the workload of each of its resources. Only
/// bundles without metadata are kept: the others name their workloads themselves.
#[derive(Clone, Debug, Default)]
pub struct RenderedWorkloads {
    by_digest: HashMap<Digest, WorkloadList>,
}

impl RenderedWorkloads {
    /// The workloads of a digest's resources, if a render of this hub made it.
    pub fn of(&self, digest: &Digest) -> Option<&WorkloadList> {
        self.by_digest.get(digest)
    }

    /// These, and the lists of `output`'s bundles. A digest `output` renders takes
    /// its list from `output`: a workload renamed without a change to its resources
    /// leaves a bundle without metadata its digest, and the page shows the new name.
    pub fn with_render(&self, output: &RenderOutput) -> RenderedWorkloads {
        let mut by_digest = self.by_digest.clone();
        let mut lists = Lists::default();
        let mut done: HashSet<&Digest> = HashSet::new();
        for (cluster, bundle) in &output.bundles {
            if bundle.meta.is_some() || !done.insert(&bundle.digest) {
                continue;
            }
            let (Some(found), Some(input)) = (
                output.provenance.clusters.get(cluster),
                output.provenance.inputs.clusters.get(cluster),
            ) else {
                continue;
            };
            match lists.list(found, input) {
                Some(list) if list.len() == bundle.resources.len() => {
                    by_digest.insert(bundle.digest.clone(), list);
                }
                // A list the render does not give in full names nothing rather than
                // the wrong workloads.
                _ => {
                    by_digest.remove(&bundle.digest);
                }
            }
        }
        RenderedWorkloads { by_digest }
    }

    /// Only the lists still wanted once `output` is installed: those of the digests it
    /// renders (a rollout serves them wave by wave) and of those some cluster is
    /// `served` (a rollout holds them). The rest are dropped, so the lists a hub
    /// keeps are bounded by one render and what is served.
    pub fn pruned<'a>(
        &self,
        output: &'a RenderOutput,
        served: impl IntoIterator<Item = &'a Digest>,
    ) -> RenderedWorkloads {
        let mut wanted: HashSet<&Digest> = output.bundles.values().map(|b| &b.digest).collect();
        wanted.extend(served);
        RenderedWorkloads {
            by_digest: self
                .by_digest
                .iter()
                .filter(|(digest, _)| wanted.contains(digest))
                .map(|(digest, list)| (digest.clone(), list.clone()))
                .collect(),
        }
    }

    /// How many digests have a list.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// About how many bytes these lists take: the map's table (a digest and a
    /// pointer to its list a slot, and a control byte), each digest's text, then each
    /// distinct list and each distinct name once; not the allocator's own overhead.
    pub fn weight(&self) -> usize {
        let mut lists: HashSet<*const Arc<str>> = HashSet::new();
        let mut names: HashSet<*const u8> = HashSet::new();
        let mut bytes = self.by_digest.capacity() * (size_of::<(Digest, WorkloadList)>() + 1);
        for (digest, list) in &self.by_digest {
            bytes += digest.as_str().len();
            if lists.insert(list.as_ptr()) {
                // An `Arc`'s two counters, then the list's pointers.
                bytes += 2 * size_of::<usize>() + size_of_val::<[Arc<str>]>(list);
                for name in list.iter() {
                    if names.insert(name.as_ptr()) {
                        bytes += 2 * size_of::<usize>() + name.len();
                    }
                }
            }
        }
        bytes
    }
}

/// The lists of one render, each made once: clusters that share their provenance's
/// lists (`resource_workloads` and the workloads targeting them) share the result,
/// lists with the same names are one list, and every name is one `Arc`.
#[derive(Default)]
struct Lists {
    by_source: HashMap<(*const u32, *const u8), Option<WorkloadList>>,
    distinct: HashSet<WorkloadList>,
    names: HashMap<Arc<str>, Arc<str>>,
}

impl Lists {
    /// Each resource's workload in a bundle with this provenance; `None` when a
    /// resource's workload is not one of `input`'s.
    fn list(&mut self, found: &ClusterProvenance, input: &ClusterInput) -> Option<WorkloadList> {
        let source = (
            found.resource_workloads.as_ptr(),
            input.workloads.as_ptr().cast::<u8>(),
        );
        if let Some(list) = self.by_source.get(&source) {
            return list.clone();
        }
        let names = &mut self.names;
        let mut name_of = |name: &Arc<str>| {
            names
                .entry(name.clone())
                .or_insert_with(|| name.clone())
                .clone()
        };
        let list: Option<Vec<Arc<str>>> = found
            .resource_workloads
            .iter()
            .map(|&position| match input.workloads.get(position as usize) {
                Some((name, _)) => Some(name_of(name)),
                None if position == TENANCY_POSITION => Some(name_of(&Arc::from(TENANCY_WORKLOAD))),
                None => None,
            })
            .collect();
        let list = list.map(|list| match self.distinct.get(list.as_slice()) {
            Some(same) => same.clone(),
            None => {
                let list: WorkloadList = list.into();
                self.distinct.insert(list.clone());
                list
            }
        });
        self.by_source.insert(source, list.clone());
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::snapshot::FleetSnapshot;

    const API: &str = "apiVersion: flotilla.dev/v1alpha1";

    /// A fleet of clusters `c1`, `c2` (labelled `kind: store`) and `c3`; workload `a`
    /// (a ConfigMap carrying `version`) on the stores, workload `b` (a ConfigMap and
    /// a Service) everywhere; `extra` is added to `b`'s spec.
    fn render(version: &str, extra: &str) -> RenderOutput {
        let mut files: Vec<(String, String)> = ["c1", "c2", "c3"]
            .iter()
            .map(|name| {
                let labels = if *name == "c3" { "{}" } else { "{kind: store}" };
                (
                    format!("clusters/{name}.yaml"),
                    format!(
                        "{API}\nkind: Cluster\nmetadata:\n  name: {name}\n  labels: {labels}\n"
                    ),
                )
            })
            .collect();
        for (name, targets, extra) in [
            ("a", "{matchLabels: {kind: store}}", ""),
            ("b", "{}", extra),
        ] {
            files.push((
                format!("workloads/{name}/workload.yaml"),
                format!("{API}\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  namespace: ns\n  targets:\n    - clusterSelector: {targets}\n{extra}"),
            ));
            files.push((
                format!("workloads/{name}/manifests/config.yaml"),
                format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  version: \"{version}\"\n"),
            ));
        }
        files.push((
            "workloads/b/manifests/service.yaml".to_string(),
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: b\nspec:\n  ports: [{port: 80}]\n"
                .to_string(),
        ));
        let snapshot =
            FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        let output = flotilla_render::render(&snapshot);
        assert!(output.is_clean(), "{:?}", output.diagnostics);
        output
    }

    fn names(list: Option<&WorkloadList>) -> Option<Vec<&str>> {
        list.map(|l| l.iter().map(|n| &**n).collect())
    }

    fn digest<'a>(output: &'a RenderOutput, cluster: &str) -> &'a Digest {
        &output.bundles[cluster].digest
    }

    #[test]
    fn a_render_names_the_workload_of_each_resource_of_its_bundles_without_metadata() {
        let v1 = render("1", "");
        assert!(v1.bundles.values().all(|b| b.meta.is_none()));
        let known = RenderedWorkloads::default().with_render(&v1);
        // c1 and c2 are served one digest, c3 another; resources in bundle order
        // (ConfigMap a, ConfigMap b, Service b).
        assert_eq!(digest(&v1, "c1"), digest(&v1, "c2"));
        assert_eq!(known.len(), 2);
        assert_eq!(
            names(known.of(digest(&v1, "c1"))),
            Some(vec!["a", "b", "b"])
        );
        assert_eq!(names(known.of(digest(&v1, "c3"))), Some(vec!["b", "b"]));
        // Names are shared between lists.
        let (stores, c3) = (
            &known.of(digest(&v1, "c1")).expect("c1's list")[1],
            &known.of(digest(&v1, "c3")).expect("c3's list")[0],
        );
        assert!(Arc::ptr_eq(stores, c3));
    }

    #[test]
    fn the_lists_agree_with_what_bundles_with_metadata_say_and_are_not_kept_for_them() {
        let output = render("1", "  drift: report\n");
        let mut lists = Lists::default();
        let mut with_meta = 0;
        for (cluster, bundle) in &output.bundles {
            let Some(meta) = &bundle.meta else { continue };
            with_meta += 1;
            let list = lists
                .list(
                    &output.provenance.clusters[cluster],
                    &output.provenance.inputs.clusters[cluster],
                )
                .expect("a list");
            assert_eq!(
                names(Some(&list)),
                Some(meta.workloads.iter().map(String::as_str).collect()),
                "{cluster}"
            );
        }
        assert_eq!(with_meta, 3, "every bundle carries metadata");
        assert!(RenderedWorkloads::default().with_render(&output).is_empty());
    }

    #[test]
    fn an_install_keeps_the_lists_of_digests_rendered_or_still_served_and_drops_the_rest() {
        let (v1, v2, v3) = (render("1", ""), render("2", ""), render("3", ""));
        let after_v1 = RenderedWorkloads::default().with_render(&v1);
        let after_v1 = after_v1.pruned(&v1, [digest(&v1, "c1"), digest(&v1, "c3")]);
        // v2 is rolled out: c1 and c2 wait on v1's digest, c3 takes v2's at once.
        let widened = after_v1.with_render(&v2);
        let after_v2 = widened.pruned(&v2, [digest(&v1, "c1"), digest(&v2, "c3")]);
        assert_eq!(after_v2.len(), 3, "v1's stores, v2's stores and v2's c3");
        assert_eq!(
            names(after_v2.of(digest(&v1, "c1"))),
            Some(vec!["a", "b", "b"])
        );
        assert!(
            after_v2.of(digest(&v2, "c1")).is_some(),
            "rendered, not yet served"
        );
        assert!(
            after_v2.of(digest(&v1, "c3")).is_none(),
            "served to no cluster"
        );
        // v3 reaches everyone: v1's and v2's lists go.
        let after_v3 = after_v2
            .with_render(&v3)
            .pruned(&v3, [digest(&v3, "c1"), digest(&v3, "c3")]);
        assert_eq!(after_v3.len(), 2);
        assert!(after_v3.of(digest(&v1, "c1")).is_none());
        assert!(after_v3.of(digest(&v2, "c1")).is_none());
        assert!(after_v3.of(digest(&v3, "c3")).is_some());
    }
}
