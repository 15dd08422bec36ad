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

/// The overlays that select a cluster (see [`overlay_selects`]), in the fleet's
/// order.
pub(crate) fn selecting_overlays(fleet: &Fleet, cluster: &Cluster, groups: &[usize]) -> Vec<usize> {
    let index = fleet.overlay_index();
    let mut selecting: Vec<usize> = index
        .by_cluster
        .get(&cluster.name)
        .into_iter()
        .flatten()
        .copied()
        .collect();
    for &g in groups {
        if let Some(overlays) = index.by_group.get(&fleet.groups[g].name) {
            selecting.extend(overlays);
        }
    }
    selecting.extend(index.by_selector.iter().copied().filter(|&o| {
        fleet.overlays[o]
            .cluster_selector
            .as_ref()
            .is_some_and(|selector| selector.matches(&cluster.labels))
    }));
    selecting.sort_unstable();
    selecting.dedup();
    selecting
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

#[cfg(test)]
mod tests {
    use flotilla_core::snapshot::FleetSnapshot;

    use super::*;

    /// The index finds exactly the overlays [`overlay_selects`] finds, in order:
    /// overlays naming clusters, groups, selecting by labels, and several at once.
    #[test]
    fn the_overlay_index_selects_what_each_overlay_selects() {
        const H: &str = "apiVersion: flotilla.dev/v1alpha1\n";
        let mut files = vec![(
            "groups/eu.yaml".to_string(),
            format!(
                "{H}kind: Group\nmetadata:\n  name: eu\nspec:\n  selector: {{matchLabels: {{region: eu}}}}\n"
            ),
        )];
        for (name, region) in [("a", "eu"), ("b", "eu"), ("c", "us"), ("d", "us")] {
            files.push((
                format!("clusters/{name}.yaml"),
                format!(
                    "{H}kind: Cluster\nmetadata:\n  name: {name}\n  labels: {{region: {region}}}\n"
                ),
            ));
        }
        for (name, spec) in [
            ("by-name", "clusters: [a, c]"),
            ("by-group", "groups: [eu]"),
            ("by-label", "clusterSelector: {matchLabels: {region: us}}"),
            (
                "all-three",
                "clusters: [d]\n  groups: [eu]\n  clusterSelector: {matchLabels: {region: eu}}",
            ),
            ("nobody", "clusters: [zz]"),
        ] {
            files.push((
                format!("overlays/{name}.yaml"),
                format!("{H}kind: Overlay\nmetadata:\n  name: {name}\nspec:\n  {spec}\n"),
            ));
        }
        let snapshot =
            FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        let mut diagnostics = Vec::new();
        let fleet = crate::load::load(&snapshot, &mut diagnostics);
        let (clusters, memberships) =
            select_clusters(&fleet, &RenderOptions::default(), &mut diagnostics);
        assert_eq!(clusters.len(), 4, "{diagnostics:?}");
        let mut seen = 0;
        for (cluster, groups) in clusters.iter().zip(&memberships) {
            let expected: Vec<usize> = (0..fleet.overlays.len())
                .filter(|&o| overlay_selects(&fleet.overlays[o], cluster, groups, &fleet))
                .collect();
            assert_eq!(
                selecting_overlays(&fleet, cluster, groups),
                expected,
                "{}",
                cluster.name
            );
            seen += expected.len();
        }
        // a: by-name, by-group, all-three; b: by-group, all-three; c: by-name,
        // by-label; d: by-label, all-three.
        assert_eq!(seen, 9);
    }
}
