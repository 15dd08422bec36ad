//! The warnings a render gives about the fleet as a whole: groups, targets and
//! overlays that select no cluster, workloads without targets, overlay patches whose target matches no resource
//! (in a full render and in one since a previous render), and the same problem met
//! on many clusters folded into one diagnostic.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::diagnostic::Diagnostic;

use super::since::Redo;
use crate::Provenance;
use crate::load::{self, Cluster, Fleet, Overlay};
use crate::select::{overlay_applies_to, selecting_overlays, targets};

pub(super) fn warn_about_empty_selections(
    fleet: &Fleet,
    clusters: &[&Cluster],
    memberships: &[Vec<usize>],
    diagnostics: &mut Vec<Diagnostic>,
) {
    for (index, group) in fleet.groups.iter().enumerate() {
        if !memberships.iter().any(|m| m.contains(&index)) {
            diagnostics.push(
                Diagnostic::warning(format!("group {:?} selects no cluster", group.name))
                    .in_file(&group.file),
            );
        }
    }
    for workload in &fleet.workloads {
        if workload.targets.is_empty() {
            diagnostics.push(
                Diagnostic::warning(format!(
                    "workload {:?} has no targets: it goes to no cluster (spec.targets lists the groups, clusters or cluster selectors it goes to)",
                    workload.name
                ))
                .in_file(&workload.file),
            );
        }
        for target in &workload.targets {
            let hit = clusters
                .iter()
                .zip(memberships)
                .any(|(cluster, groups)| targets(&target.value, cluster, groups, fleet));
            if !hit {
                diagnostics.push(
                    Diagnostic::warning("this target selects no cluster")
                        .in_file(&workload.file)
                        .at_line(Some(target.referenced.line())),
                );
            }
        }
    }
    let mut selected = vec![false; fleet.overlays.len()];
    for (cluster, groups) in clusters.iter().zip(memberships) {
        for o in selecting_overlays(fleet, cluster, groups) {
            selected[o] = true;
        }
    }
    for (overlay, hit) in fleet.overlays.iter().zip(selected) {
        if !hit {
            diagnostics.push(
                Diagnostic::warning(format!("overlay {:?} selects no cluster", overlay.name))
                    .in_file(&overlay.file),
            );
        }
    }
}

/// kustomize fails on a patch whose target matches nothing; an overlay is shared by
/// many clusters, so such a patch is a warning (an error under `validate --strict`),
/// given when no cluster has a resource it matches.
fn unmatched_patch_warning(overlay: &Overlay, patch: &load::CompiledPatch) -> Diagnostic {
    Diagnostic::warning(format!(
        "the target of this patch of overlay {:?} matches no resource on any cluster it applies to",
        overlay.name
    ))
    .in_file(&overlay.file)
    .at_line(Some(patch.line))
}

/// The warnings for the patches of used overlays that matched nothing.
pub(super) fn unmatched_patches(
    fleet: &Fleet,
    used: &BTreeSet<usize>,
    matched: &BTreeSet<(usize, usize)>,
) -> Vec<Diagnostic> {
    let mut warnings = Vec::new();
    for &index in used {
        let overlay = &fleet.overlays[index];
        for (patch_index, patch) in overlay.patches.iter().enumerate() {
            if !matched.contains(&(index, patch_index)) {
                warnings.push(unmatched_patch_warning(overlay, patch));
            }
        }
    }
    warnings
}

/// The patch warnings of a render that rendered only some clusters, or some
/// workloads of them, and kept the rest of `previous`. An overlay that applies to a
/// cluster not rendered whole has an unchanged file (a changed one changes the own
/// inputs of every cluster it selects), so its patches are named by file alike on
/// both sides: a patch matches somewhere if some cluster's provenance says so.
pub(super) fn unmatched_patches_since(
    fleet: &Fleet,
    (clusters, targeted, selecting): (&[&Cluster], &[Vec<usize>], &[Vec<usize>]),
    redo: &[Redo],
    used_in_pass: &BTreeSet<usize>,
    provenance: &Provenance,
) -> Vec<Diagnostic> {
    // Per overlay with patches, the clusters it selects.
    let mut selected: Vec<Vec<usize>> = vec![Vec::new(); fleet.overlays.len()];
    for (c, overlays) in selecting.iter().enumerate() {
        for &o in overlays {
            if !fleet.overlays[o].patches.is_empty() {
                selected[o].push(c);
            }
        }
    }
    let mut warnings = Vec::new();
    for (index, overlay) in fleet.overlays.iter().enumerate() {
        if overlay.patches.is_empty() {
            continue;
        }
        // Used, as in the units of a full render: by a unit of this pass, or by a
        // cluster not rendered whole that it selects, with a workload it applies to.
        let used = used_in_pass.contains(&index)
            || selected[index].iter().any(|&c| {
                redo[c] != Redo::All
                    && targeted[c]
                        .iter()
                        .any(|&w| overlay_applies_to(overlay, &fleet.workloads[w]))
            });
        if !used {
            continue;
        }
        // A patch matched somewhere if it did on some cluster the overlay selects:
        // usually the first one looked at.
        let mut unmatched = vec![true; overlay.patches.len()];
        let mut left = unmatched.len();
        for &c in &selected[index] {
            let Some(found) = provenance.clusters.get(&clusters[c].name) else {
                continue;
            };
            for (file, patch, _) in found.patch_matches.iter() {
                if **file == *overlay.file
                    && let Some(slot) = unmatched.get_mut(*patch as usize)
                    && *slot
                {
                    *slot = false;
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
        for (patch, unmatched) in overlay.patches.iter().zip(unmatched) {
            if unmatched {
                warnings.push(unmatched_patch_warning(overlay, patch));
            }
        }
    }
    warnings
}

/// The same problem met on many clusters is reported once, naming the first cluster
/// and how many others share it, so a broken group does not bury everything else.
pub(super) fn fold_cluster_repeats(diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut folded: BTreeMap<Diagnostic, (String, usize)> = BTreeMap::new();
    let mut plain = Vec::new();
    for diagnostic in diagnostics {
        match diagnostic.cluster.clone() {
            Some(cluster) => {
                let key = Diagnostic {
                    cluster: None,
                    ..diagnostic
                };
                let entry = folded.entry(key).or_insert_with(|| (cluster.clone(), 0));
                if cluster < entry.0 {
                    entry.0 = cluster;
                }
                entry.1 += 1;
            }
            None => plain.push(diagnostic),
        }
    }
    for (mut diagnostic, (first, count)) in folded {
        diagnostic.cluster = Some(if count > 1 {
            format!(
                "{first} and {} other cluster{}",
                count - 1,
                if count > 2 { "s" } else { "" }
            )
        } else {
            first
        });
        plain.push(diagnostic);
    }
    plain.sort();
    plain.dedup();
    plain
}
