//! The order workloads are applied in on a cluster (`spec.dependsOn`) and what the
//! agent does with drift (`spec.drift`, overlays' `spec.drift`): the dependency graph
//! is checked for cycles once per fleet, and per cluster the bundle's metadata gets
//! its phases (one per level of the graph), each resource's workload and the drift
//! policies that are not the default.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::sync::Arc;

use flotilla_core::bundle::{BundleMeta, DriftPolicy, HookMark, Resource, TENANCY_WORKLOAD};

use crate::tenancy::TENANCY_POSITION;
use flotilla_core::diagnostic::Diagnostic;

use crate::fleet::{Cluster, Fleet};
use crate::select::{overlay_applies_to, overlay_selects};

/// Reports every cycle of `spec.dependsOn` once, at the first workload of the cycle
/// (by name) and the line of its dependency that closes it, naming the whole cycle.
/// Unknown names are reported where references are checked, and skipped here.
pub(crate) fn check_cycles(fleet: &Fleet, diagnostics: &mut Vec<Diagnostic>) {
    let index: HashMap<&str, usize> = fleet
        .workloads
        .iter()
        .enumerate()
        .map(|(i, w)| (w.name.as_str(), i))
        .collect();
    let edges: Vec<Vec<(usize, u64)>> = fleet
        .workloads
        .iter()
        .map(|w| {
            w.depends_on
                .iter()
                .filter_map(|d| {
                    index
                        .get(d.value.as_str())
                        .map(|&i| (i, d.referenced.line()))
                })
                .collect()
        })
        .collect();
    // Depth-first search without recursion: 0 unvisited, 1 on the path, 2 done.
    let mut color = vec![0u8; edges.len()];
    let mut reported: BTreeSet<Vec<usize>> = BTreeSet::new();
    for start in 0..edges.len() {
        if color[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        color[start] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            let Some(&(to, _)) = edges[node].get(*next) else {
                color[node] = 2;
                path.pop();
                continue;
            };
            *next += 1;
            match color[to] {
                0 => {
                    color[to] = 1;
                    path.push((to, 0));
                }
                1 => {
                    let from = path.iter().position(|&(n, _)| n == to).unwrap_or(0);
                    let cycle: Vec<usize> = path[from..].iter().map(|&(n, _)| n).collect();
                    report_cycle(fleet, &edges, cycle, &mut reported, diagnostics);
                }
                _ => {}
            }
        }
    }
}

fn report_cycle(
    fleet: &Fleet,
    edges: &[Vec<(usize, u64)>],
    mut cycle: Vec<usize>,
    reported: &mut BTreeSet<Vec<usize>>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    // Start the cycle at its first workload by name (the fleet's workloads are sorted
    // by name, so the smallest index), so that each cycle is told the same way once.
    let first = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
    cycle.rotate_left(first);
    if !reported.insert(cycle.clone()) {
        return;
    }
    let names: Vec<&str> = cycle
        .iter()
        .chain(cycle.first())
        .map(|&w| fleet.workloads[w].name.as_str())
        .collect();
    let from = cycle[0];
    let to = cycle.get(1).copied().unwrap_or(from);
    let line = edges[from]
        .iter()
        .find(|&&(t, _)| t == to)
        .map(|&(_, line)| line);
    let message = if cycle.len() == 1 {
        format!("workload {} depends on itself in spec.dependsOn", names[0])
    } else {
        format!(
            "spec.dependsOn makes a cycle: {} (workloads in a cycle can never be applied in order)",
            names.join(" → ")
        )
    };
    diagnostics.push(
        Diagnostic::error(message)
            .in_file(&fleet.workloads[from].file)
            .at_line(line)
            .for_workload(&fleet.workloads[from].name),
    );
}

/// The drift policy of workload `workload` on `cluster` (a member of `groups`): the
/// workload's own, then every overlay that selects the cluster, applies to the
/// workload and sets one, in overlay order (the last wins).
pub(crate) fn drift_policy(
    fleet: &Fleet,
    cluster: &Cluster,
    groups: &[usize],
    workload: usize,
) -> DriftPolicy {
    let of = &fleet.workloads[workload];
    fleet
        .overlays
        .iter()
        .rev()
        .filter(|o| o.drift.is_some())
        .find(|o| overlay_applies_to(o, of) && overlay_selects(o, cluster, groups, fleet))
        .and_then(|o| o.drift)
        .unwrap_or(of.drift)
}

/// The bundle metadata of one cluster, or `None` when its workloads need none (no
/// dependencies between them, every drift policy the default, no Helm hooks and no
/// tenant's workload):
/// then the bundle and its digest are what they were before flotilla knew of any.
///
/// `targeted` lists the workloads that target the cluster (fleet indices, sorted);
/// `resources` are the bundle's, and `resource_workloads` gives each one's workload
/// as a position in `targeted`. A dependency on a workload that does not target the
/// cluster is an error for the cluster naming both.
pub(crate) fn bundle_meta(
    fleet: &Fleet,
    cluster: &Cluster,
    groups: &[usize],
    targeted: &[usize],
    resources: &[Arc<Resource>],
    resource_workloads: &[u32],
) -> Result<Option<BundleMeta>, Vec<Diagnostic>> {
    let hooks = hook_marks(fleet, targeted, resources, resource_workloads);
    let has_dependencies = targeted
        .iter()
        .any(|&w| !fleet.workloads[w].depends_on.is_empty());
    let mut drift = BTreeMap::new();
    for &w in targeted {
        let policy = drift_policy(fleet, cluster, groups, w);
        if policy != DriftPolicy::default() {
            drift.insert(fleet.workloads[w].name.clone(), policy);
        }
    }
    let tenants = crate::tenancy::marks(fleet, targeted);
    let tenant_rules = fleet.signed_tenant_rules.clone();
    if !has_dependencies
        && drift.is_empty()
        && hooks.is_empty()
        && tenants.is_empty()
        && tenant_rules.is_none()
    {
        return Ok(None);
    }
    let tenancy = resource_workloads.contains(&TENANCY_POSITION);
    let phases = if has_dependencies {
        let mut phases = phases(fleet, cluster, targeted)?;
        // What tenants need (their ServiceAccounts and RoleBindings) comes first.
        if let (true, Some(first)) = (tenancy, phases.first_mut()) {
            first.insert(0, TENANCY_WORKLOAD.to_string());
        }
        phases
    } else {
        Vec::new()
    };
    let workloads = resource_workloads
        .iter()
        .map(|&p| match targeted.get(p as usize) {
            Some(&w) => fleet.workloads[w].name.clone(),
            None if p == TENANCY_POSITION => TENANCY_WORKLOAD.to_string(),
            None => String::new(),
        })
        .collect();
    Ok(Some(BundleMeta {
        workloads,
        phases,
        drift,
        hooks,
        tenants,
        tenant_rules,
    }))
}

/// The Helm hooks among the resources of Helm workloads (`spec.helm`): resources
/// whose `helm.sh/hook` annotation names an install, upgrade or delete event. Test
/// hooks (kept with `skipTests: false`) are not hooks here, and stay plain resources
/// (those with an unknown or only rollback events never reach the bundle). Only
/// resources whose bytes hold `helm.sh/hook` are parsed.
fn hook_marks(
    fleet: &Fleet,
    targeted: &[usize],
    resources: &[Arc<Resource>],
    resource_workloads: &[u32],
) -> Vec<HookMark> {
    const ANNOTATION: &[u8] = b"helm.sh/hook";
    let helm = |p: u32| {
        targeted
            .get(p as usize)
            .is_some_and(|&w| fleet.workloads[w].helm_spec.is_some())
    };
    resources
        .iter()
        .zip(resource_workloads)
        .enumerate()
        .filter(|(_, (resource, p))| {
            helm(**p)
                && resource
                    .canonical
                    .windows(ANNOTATION.len())
                    .any(|w| w == ANNOTATION)
        })
        .filter_map(|(index, (resource, _))| hook_mark(index, &resource.value()))
        .collect()
}

/// The hook mark of one resource, from its `helm.sh/hook`, `helm.sh/hook-weight` and
/// `helm.sh/hook-delete-policy` annotations, read as Helm reads them (comma-separated,
/// spaces trimmed, a weight that is not a number is 0); `None` when it names none of
/// the events flotilla runs.
fn hook_mark(index: usize, resource: &serde_json::Value) -> Option<HookMark> {
    let annotations = resource.pointer("/metadata/annotations")?;
    let annotation = |name: &str| annotations.get(name).and_then(serde_json::Value::as_str);
    let known = |list: &str, of: &[&str]| -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for name in list.split(',').map(str::trim) {
            if of.contains(&name) && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        names
    };
    let events = known(annotation("helm.sh/hook")?, &HookMark::EVENTS);
    if events.is_empty() {
        return None;
    }
    let weight = annotation("helm.sh/hook-weight")
        .and_then(|w| w.trim().parse().ok())
        .unwrap_or(0);
    let delete_policies = match annotation("helm.sh/hook-delete-policy") {
        Some(policies) => known(policies, &HookMark::DELETE_POLICIES),
        None => vec!["before-hook-creation".to_string()],
    };
    Some(HookMark {
        resource: index,
        events,
        weight,
        delete_policies,
    })
}

/// The targeted workloads by level of the dependency graph: a workload's level is one
/// more than its highest dependency's, and 0 without dependencies.
fn phases(
    fleet: &Fleet,
    cluster: &Cluster,
    targeted: &[usize],
) -> Result<Vec<Vec<String>>, Vec<Diagnostic>> {
    let position: HashMap<&str, usize> = targeted
        .iter()
        .enumerate()
        .map(|(p, &w)| (fleet.workloads[w].name.as_str(), p))
        .collect();
    let mut errors = Vec::new();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); targeted.len()];
    for (p, &w) in targeted.iter().enumerate() {
        let workload = &fleet.workloads[w];
        for dependency in &workload.depends_on {
            match position.get(dependency.value.as_str()) {
                Some(&d) => edges[p].push(d),
                None if fleet.workloads.iter().any(|o| o.name == dependency.value) => errors.push(
                    Diagnostic::error(format!(
                        "workload {} depends on workload {}, which does not target cluster {}: \
                             target it there too, or remove the dependency",
                        workload.name, dependency.value, cluster.name
                    ))
                    .in_file(&workload.file)
                    .at_line(Some(dependency.referenced.line()))
                    .for_cluster(&cluster.name)
                    .for_workload(&workload.name),
                ),
                // An unknown name is reported once for the fleet.
                None => {}
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // Levels by repeated relaxation: at most one round per workload; a cycle (already
    // reported for the fleet) would keep raising levels, and is cut off there.
    let mut level = vec![0usize; targeted.len()];
    for _ in 0..=targeted.len() {
        let mut changed = false;
        for p in 0..targeted.len() {
            let wanted = edges[p].iter().map(|&d| level[d] + 1).max().unwrap_or(0);
            if wanted > level[p] {
                level[p] = wanted.min(targeted.len());
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let count = level.iter().max().map_or(0, |m| m + 1);
    let mut phases = vec![Vec::new(); count];
    for (p, &w) in targeted.iter().enumerate() {
        phases[level[p]].push(fleet.workloads[w].name.clone());
    }
    phases.retain(|phase| !phase.is_empty());
    Ok(phases)
}
