//! Which clusters a render covers, and which workloads and overlays apply to a
//! cluster: by name, group membership or label selector. Shared by the render and
//! by [`crate::inputs`].

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::model::Target;

use crate::RenderOptions;
use crate::fleet::{Cluster, Fleet, Overlay, Workload};

/// The clusters to render (all, or those `options` names; unknown names are errors)
/// and, for each, the indices of the groups it belongs to.
pub(crate) fn select_clusters<'f>(
    fleet: &'f Fleet,
    options: &RenderOptions<'_>,
    diagnostics: &mut Vec<Diagnostic>,
) -> (Vec<&'f Cluster>, Vec<Vec<usize>>) {
    for name in &options.clusters {
        if !fleet.clusters.iter().any(|c| &c.name == name) {
            diagnostics.push(Diagnostic::error(format!(
                "no cluster named {name:?} in the fleet"
            )));
        }
    }
    let clusters: Vec<&Cluster> = fleet
        .clusters
        .iter()
        .filter(|c| options.clusters.is_empty() || options.clusters.contains(&c.name))
        .collect();
    let memberships = clusters
        .iter()
        .map(|cluster| {
            (0..fleet.groups.len())
                .filter(|&g| fleet.groups[g].selector.matches(&cluster.labels))
                .collect()
        })
        .collect();
    (clusters, memberships)
}

/// The indices of the workloads that target `cluster` (a member of `groups`).
pub(crate) fn targeted_workloads(fleet: &Fleet, cluster: &Cluster, groups: &[usize]) -> Vec<usize> {
    (0..fleet.workloads.len())
        .filter(|&w| {
            fleet.workloads[w]
                .targets
                .iter()
                .any(|t| targets(&t.value, cluster, groups, fleet))
        })
        .collect()
}

pub(crate) fn targets(target: &Target, cluster: &Cluster, groups: &[usize], fleet: &Fleet) -> bool {
    if let Some(name) = &target.cluster {
        return *name == cluster.name;
    }
    if let Some(group) = &target.group {
        return groups.iter().any(|&g| fleet.groups[g].name == *group);
    }
    target
        .cluster_selector
        .as_ref()
        .is_some_and(|selector| selector.matches(&cluster.labels))
}

pub(crate) fn overlay_selects(
    overlay: &Overlay,
    cluster: &Cluster,
    groups: &[usize],
    fleet: &Fleet,
) -> bool {
    overlay.clusters.iter().any(|c| c.value == cluster.name)
        || overlay
            .groups
            .iter()
            .any(|name| groups.iter().any(|&g| fleet.groups[g].name == name.value))
        || overlay
            .cluster_selector
            .as_ref()
            .is_some_and(|selector| selector.matches(&cluster.labels))
}

/// Whether an overlay acts on a workload: one it names (or any, when it names none),
/// and only its tenant's when a tenant owns it.
pub(crate) fn overlay_applies_to(overlay: &Overlay, workload: &Workload) -> bool {
    overlay.tenant.is_none_or(|t| workload.tenant == Some(t))
        && overlay
            .workloads
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n.value == workload.name))
}
