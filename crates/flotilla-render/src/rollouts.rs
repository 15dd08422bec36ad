//! The rollout plan of one render: which RolloutPolicy governs each cluster and in
//! which wave the cluster changes. A cluster is governed by at most one policy; it
//! belongs to the first wave that selects it; a `percent` wave takes its share of the
//! governed clusters not in an earlier wave in a stable order (a hash of the policy's
//! and the cluster's names); governed clusters no wave selects form a last wave.
//! Paused clusters are in no wave.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::rollout::{self, Placement, RolloutPlan, WavePlan};

use crate::load::{Cluster, Fleet, RolloutPolicy, WaveSelection};

/// Places every cluster of the fleet. `warn` adds warnings for waves and policies that
/// get no cluster (only meaningful when every file loaded).
pub fn plan(fleet: &Fleet, diagnostics: &mut Vec<Diagnostic>, warn: bool) -> RolloutPlan {
    let mut out = RolloutPlan {
        paused: fleet
            .clusters
            .iter()
            .filter(|c| c.paused)
            .map(|c| c.name.clone())
            .collect(),
        ..RolloutPlan::default()
    };
    if fleet.rollout_policies.is_empty() {
        return out;
    }
    let governing: Vec<Vec<usize>> = fleet
        .clusters
        .iter()
        .map(|cluster| {
            (0..fleet.rollout_policies.len())
                .filter(|&p| fleet.rollout_policies[p].selector.matches(&cluster.labels))
                .collect()
        })
        .collect();
    report_conflicts(fleet, &governing, diagnostics);
    for (index, policy) in fleet.rollout_policies.iter().enumerate() {
        let governed: Vec<&Cluster> = fleet
            .clusters
            .iter()
            .zip(&governing)
            .filter(|(_, policies)| policies.as_slice() == [index])
            .map(|(cluster, _)| cluster)
            .collect();
        if warn && governed.is_empty() {
            diagnostics.push(
                Diagnostic::warning(format!(
                    "rollout policy {:?} governs no cluster",
                    policy.name
                ))
                .in_file(&policy.file),
            );
        }
        let (checked, placements) = place(fleet, index, policy, &governed, diagnostics, warn);
        out.placements.extend(placements);
        out.policies.push(checked);
    }
    out
}

/// One error per pair of policies that govern the same clusters, naming both files.
fn report_conflicts(fleet: &Fleet, governing: &[Vec<usize>], diagnostics: &mut Vec<Diagnostic>) {
    let mut pairs: BTreeMap<(usize, usize), Vec<&str>> = BTreeMap::new();
    for (cluster, policies) in fleet.clusters.iter().zip(governing) {
        if let [first, second, ..] = policies.as_slice() {
            pairs
                .entry((*first, *second))
                .or_default()
                .push(&cluster.name);
        }
    }
    for ((a, b), clusters) in pairs {
        let (a, b) = (&fleet.rollout_policies[a], &fleet.rollout_policies[b]);
        let who = match clusters.len() {
            1 => format!("cluster {} is", clusters[0]),
            n => format!(
                "clusters {} and {} other{} are",
                clusters[0],
                n - 1,
                if n > 2 { "s" } else { "" }
            ),
        };
        diagnostics.push(
            Diagnostic::error(format!(
                "{who} governed by two rollout policies, {} ({}) and {} ({}); a cluster may be governed by one at most: narrow a clusterSelector",
                a.name, a.file, b.name, b.file
            ))
            .in_file(&b.file),
        );
    }
}

fn selects(fleet: &Fleet, wave: &WaveSelection, cluster: &Cluster) -> bool {
    wave.clusters.iter().any(|c| c.value == cluster.name)
        || wave.groups.iter().any(|name| {
            fleet
                .groups
                .iter()
                .find(|g| g.name == name.value)
                .is_some_and(|g| g.selector.matches(&cluster.labels))
        })
        || wave
            .selector
            .as_ref()
            .is_some_and(|s| s.matches(&cluster.labels))
}

fn place(
    fleet: &Fleet,
    index: usize,
    policy: &RolloutPolicy,
    governed: &[&Cluster],
    diagnostics: &mut Vec<Diagnostic>,
    warn: bool,
) -> (rollout::Policy, Vec<(String, Placement)>) {
    let mut remaining: Vec<(&Cluster, [u8; 32])> = governed
        .iter()
        .filter(|c| !c.paused)
        .map(|c| (*c, rollout::order_key(&policy.name, &c.name)))
        .collect();
    remaining.sort_by_key(|entry| entry.1);
    let mut checked = policy.policy.clone();
    let mut placements = Vec::new();
    for (wave_index, wave) in policy.waves.iter().enumerate() {
        let taken: BTreeSet<usize> = if let Some(percent) = wave.percent {
            let count = (remaining.len() * percent as usize).div_ceil(100);
            (0..count.max(1).min(remaining.len())).collect()
        } else if wave.selects_all() {
            (0..remaining.len()).collect()
        } else {
            (0..remaining.len())
                .filter(|&i| selects(fleet, wave, remaining[i].0))
                .collect()
        };
        if warn && taken.is_empty() && !governed.is_empty() {
            diagnostics.push(
                Diagnostic::warning(format!(
                    "wave {:?} selects no cluster (none that an earlier wave does not take already)",
                    checked.waves[wave_index].name
                ))
                .in_file(&policy.file)
                .at_line(Some(wave.line)),
            );
        }
        let mut kept = Vec::with_capacity(remaining.len() - taken.len());
        for (i, entry) in remaining.into_iter().enumerate() {
            if taken.contains(&i) {
                placements.push((
                    entry.0.name.clone(),
                    Placement {
                        policy: index,
                        wave: wave_index,
                    },
                ));
            } else {
                kept.push(entry);
            }
        }
        remaining = kept;
    }
    if !remaining.is_empty()
        && let Some(last) = checked.waves.last().cloned()
    {
        let name = if checked.waves.iter().any(|w| w.name == rollout::REST_WAVE) {
            format!("({})", rollout::REST_WAVE)
        } else {
            rollout::REST_WAVE.to_string()
        };
        let wave_index = checked.waves.len();
        checked.waves.push(WavePlan { name, ..last });
        for (cluster, _) in remaining {
            placements.push((
                cluster.name.clone(),
                Placement {
                    policy: index,
                    wave: wave_index,
                },
            ));
        }
    }
    (checked, placements)
}

#[cfg(test)]
mod tests {
    use flotilla_core::snapshot::FleetSnapshot;

    use crate::render;

    fn cluster(name: &str, labels: &str, paused: bool) -> (String, String) {
        (
            format!("clusters/{name}.yaml"),
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  paused: {paused}\n"
            ),
        )
    }

    fn fleet(policy: &str, count: usize) -> FleetSnapshot {
        let mut files: Vec<(String, String)> = (0..count)
            .map(|i| {
                let tier = if i < 2 { "canary" } else { "stable" };
                cluster(
                    &format!("s{i:02}"),
                    &format!("{{tier: {tier}, kind: store}}"),
                    i == 5,
                )
            })
            .collect();
        files.push(cluster("lab", "{kind: lab}", false));
        files.push((
            "groups/canary.yaml".into(),
            "apiVersion: flotilla.dev/v1alpha1\nkind: Group\nmetadata:\n  name: canary\nspec:\n  selector: {matchLabels: {tier: canary}}\n".into(),
        ));
        files.push(("rollouts/stores.yaml".into(), policy.into()));
        FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
    }

    const POLICY: &str = "apiVersion: flotilla.dev/v1alpha1\nkind: RolloutPolicy\nmetadata:\n  name: stores\nspec:\n  clusterSelector: {matchLabels: {kind: store}}\n  waves:\n    - {name: canary, groups: [canary], bake: 15m}\n    - {name: tenth, percent: 10, bake: 30m, maxFailed: \"2%\"}\n    - {name: half, percent: 50, maxParallel: \"10%\"}\n";

    fn wave_of(output: &crate::RenderOutput, cluster: &str) -> Option<String> {
        output
            .rollouts
            .place(cluster)
            .map(|(_, wave)| wave.name.clone())
    }

    #[test]
    fn waves_take_groups_then_shares_then_the_rest() {
        let output = render(&fleet(POLICY, 30));
        assert!(output.is_clean(), "{:?}", output.diagnostics);
        let plan = &output.rollouts;
        assert_eq!(plan.policies.len(), 1);
        let names: Vec<&str> = plan.policies[0]
            .waves
            .iter()
            .map(|w| w.name.as_str())
            .collect();
        assert_eq!(names, ["canary", "tenth", "half", "rest"]);
        let count = |wave: &str| {
            plan.placements
                .keys()
                .filter(|c| wave_of(&output, c).as_deref() == Some(wave))
                .count()
        };
        // 30 stores, one paused: 2 canaries, then 10% of 27 rounded up = 3, then 50% of
        // 24 = 12, and the 12 left form the last wave with the settings of the last one.
        assert_eq!(
            (
                count("canary"),
                count("tenth"),
                count("half"),
                count("rest")
            ),
            (2, 3, 12, 12)
        );
        assert_eq!(wave_of(&output, "s00").as_deref(), Some("canary"));
        assert_eq!(wave_of(&output, "s05"), None, "paused: in no wave");
        assert!(plan.paused.contains("s05"));
        assert_eq!(wave_of(&output, "lab"), None, "not governed");
        assert_eq!(
            plan.policies[0].waves[3].max_parallel,
            plan.policies[0].waves[2].max_parallel
        );
    }

    #[test]
    fn percent_waves_pick_the_clusters_first_in_hash_order() {
        let output = render(&fleet(POLICY, 30));
        let mut tenth: Vec<String> = output
            .rollouts
            .placements
            .keys()
            .filter(|c| wave_of(&output, c).as_deref() == Some("tenth"))
            .cloned()
            .collect();
        tenth.sort();
        // The candidates: stores not paused and not canaries, by sha256(policy, name).
        let mut candidates: Vec<String> = (2..30)
            .filter(|&i| i != 5)
            .map(|i| format!("s{i:02}"))
            .collect();
        candidates.sort_by_key(|c| flotilla_core::rollout::order_key("stores", c));
        let mut expected: Vec<String> = candidates[..3].to_vec();
        expected.sort();
        assert_eq!(tenth, expected);
        assert_eq!(render(&fleet(POLICY, 30)).rollouts, output.rollouts);
    }
}
