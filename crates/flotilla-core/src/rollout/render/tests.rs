//! The render decision as a table of scenarios (each rule of a clean render: held and
//! new clusters, paused, supersede, leave, the immediate trailer, an empty store) and
//! as properties over random fleets and sequences of commits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::rollout::tests::{MINUTE, OFFLINE_AFTER, T0, digest, policy, wave};
use crate::rollout::{Budget, Health, Placement, Report, Rollout, RolloutState, WaveState};

/// A rollout the simulated hub runs.
struct Tracked {
    rollout: Rollout,
    revisions: Vec<Revisions>,
    observations: Vec<Observation>,
}

/// A hub reduced to what a render decision reads and writes: the decision is applied
/// as the hub applies it.
struct Hub {
    plan: RolloutPlan,
    served: HashMap<String, ServedEntry>,
    latest: HashMap<String, Arc<Latest>>,
    running: Vec<Tracked>,
    /// (policy, revision) of every rollout ever started.
    started: BTreeSet<(String, String)>,
    now: Millis,
    release_not_before: Option<Millis>,
    /// Clusters whose agents have reported.
    reported: BTreeSet<String>,
}

impl Hub {
    /// A fleet governed by the policy `stores` (waves `canary` then `rest`): each
    /// cluster as (name, wave) — `None` for an ungoverned cluster.
    fn new(clusters: &[(&str, Option<usize>)]) -> Hub {
        let stores = policy(vec![
            wave("canary", 15, Budget::Count(0), None),
            wave("rest", 0, Budget::Count(0), None),
        ]);
        let placements: BTreeMap<String, Placement> = clusters
            .iter()
            .filter_map(|(name, wave)| {
                wave.map(|w| (name.to_string(), Placement { policy: 0, wave: w }))
            })
            .collect();
        Hub {
            plan: RolloutPlan {
                policies: vec![stores],
                placements,
                paused: BTreeSet::new(),
            },
            served: HashMap::new(),
            latest: HashMap::new(),
            running: Vec::new(),
            started: BTreeSet::new(),
            now: T0,
            release_not_before: None,
            reported: BTreeSet::new(),
        }
    }

    fn pause(&mut self, cluster: &str) {
        self.plan.placements.remove(cluster);
        self.plan.paused.insert(cluster.to_string());
    }

    /// Records a clean render of `revision` giving each cluster listed the digest
    /// `digest(c)` (clusters not listed are not in the fleet any more).
    fn render(&mut self, revision: &str, digests: &[(&str, char)], forced: bool) -> RenderDecision {
        // The hub keeps only the rollouts that have not ended.
        self.running.retain(|t| t.rollout.state.is_active());
        self.now += MINUTE;
        let latest: HashMap<String, Arc<Latest>> = digests
            .iter()
            .map(|&(name, c)| {
                let d = digest(c);
                let revision = match self.latest.get(name) {
                    Some(old) if old.digest == d => old.revision.clone(),
                    _ => revision.to_string(),
                };
                let place = self.plan.place(name);
                let entry = Latest {
                    digest: d,
                    revision,
                    policy: place.map(|(p, _)| p.name.clone()),
                    wave: place.map(|(_, w)| w.name.clone()),
                    paused: self.plan.paused.contains(name),
                };
                (name.to_string(), Arc::new(entry))
            })
            .collect();
        let existing: BTreeSet<String> = self
            .started
            .iter()
            .filter(|(_, r)| r == revision)
            .map(|(p, _)| p.clone())
            .collect();
        let input = RenderInput {
            revision,
            forced,
            now: self.now,
            offline_after: OFFLINE_AFTER,
            release_not_before: self.release_not_before,
            plan: &self.plan,
            served: &self.served,
            old_latest: &self.latest,
            latest: &latest,
            existing: &existing,
        };
        let now = self.now;
        let reported = &self.reported;
        let mut running: Vec<Running<'_>> = self
            .running
            .iter_mut()
            .map(|t| Running {
                rollout: &mut t.rollout,
                revisions: &t.revisions,
                observations: &t.observations,
            })
            .collect();
        // Every cluster was seen a moment ago; some have reported (about another digest).
        let decision = decide_render(&input, &mut running, |cluster, _| Observation {
            report: reported.contains(cluster).then_some(Report {
                health: Health::Elsewhere,
                at: now,
            }),
            last_seen: Some(now),
            fetched_at: None,
        });
        drop(running);
        for name in &decision.removed {
            self.served.remove(name);
        }
        for change in &decision.served {
            self.served.insert(
                change.cluster.clone(),
                ServedEntry {
                    digest: change.digest.clone(),
                    revision: change.revision.clone(),
                    hold: change.hold,
                },
            );
        }
        for s in &decision.started {
            self.started
                .insert((s.rollout.policy.name.clone(), s.rollout.revision.clone()));
            self.running.push(Tracked {
                rollout: s.rollout.clone(),
                revisions: s.revisions.clone(),
                observations: s.observations.clone(),
            });
        }
        self.latest = latest;
        decision
    }

    fn serves(&self, cluster: &str) -> (char, bool) {
        let entry = self.served.get(cluster).expect("served");
        let c = entry.digest.to_string().chars().last().expect("a digest");
        (c, entry.hold)
    }

    /// The newest rollout that has not ended.
    fn rollout(&self) -> &Rollout {
        &self
            .running
            .iter()
            .rev()
            .find(|t| t.rollout.state.is_active())
            .expect("a running rollout")
            .rollout
    }
}

/// The fleet of most scenarios: two ungoverned demo clusters, one canary and two
/// stores of the policy `stores`.
fn fleet() -> Hub {
    Hub::new(&[
        ("red", None),
        ("blue", None),
        ("canary", Some(0)),
        ("store-1", Some(1)),
        ("store-2", Some(1)),
    ])
}

const ALL: [&str; 5] = ["red", "blue", "canary", "store-1", "store-2"];

fn every(c: char) -> Vec<(&'static str, char)> {
    ALL.iter().map(|&n| (n, c)).collect()
}

/// The fleet after a first render of `a` at r1 whose rollout completed: every cluster
/// served `a` and known to run it.
fn settled() -> Hub {
    let mut hub = fleet();
    for name in ALL {
        hub.served.insert(
            name.to_string(),
            ServedEntry {
                digest: digest('a'),
                revision: "main@r1".into(),
                hold: false,
            },
        );
    }
    hub.render("main@r1", &every('a'), false);
    hub
}

#[test]
fn ungoverned_clusters_change_at_once_and_governed_ones_wait_for_their_wave() {
    let mut hub = settled();
    let decision = hub.render("main@r2", &every('b'), false);
    assert_eq!(hub.serves("red"), ('b', false));
    assert_eq!(hub.serves("blue"), ('b', false));
    // The canary wave is released at once; the stores wait for it to bake.
    assert_eq!(hub.serves("canary"), ('b', false));
    assert_eq!(hub.serves("store-1"), ('a', false));
    assert_eq!(hub.serves("store-2"), ('a', false));
    assert_eq!(decision.started.len(), 1);
    let rollout = hub.rollout();
    assert_eq!(rollout.revision, "main@r2");
    assert_eq!(rollout.members.len(), 3);
    assert_eq!(rollout.waves[0].state, WaveState::Released);
    assert_eq!(rollout.waves[1].state, WaveState::Waiting);
}

#[test]
fn a_first_render_serves_new_clusters_held_on_what_their_agents_run() {
    let mut hub = fleet();
    let decision = hub.render("main@r1", &every('a'), false);
    // Ungoverned: served, not held. Governed and new: held until their wave.
    assert_eq!(hub.serves("red"), ('a', false));
    assert_eq!(hub.serves("store-1"), ('a', true));
    assert_eq!(hub.serves("store-2"), ('a', true));
    // The canary's wave is released at once, so it is served without a hold.
    assert_eq!(hub.serves("canary"), ('a', false));
    let members = &decision.started[0].rollout.members;
    assert!(
        members.iter().all(|m| m.previous.is_none()),
        "new clusters have no previous digest"
    );
}

#[test]
fn a_held_cluster_that_reported_keeps_its_digest_until_its_wave() {
    // A hub on an empty store serves its governed clusters held; their agents report
    // what they run. A new commit must not move them to it before their wave: a poll
    // without If-None-Match (an agent that lost its state, curl) would get it.
    let mut hub = fleet();
    hub.render("main@r1", &every('a'), false);
    for name in ["store-1", "store-2"] {
        hub.reported.insert(name.to_string());
    }
    hub.render("main@r2", &every('b'), false);
    assert_eq!(hub.serves("store-1"), ('a', true));
    assert_eq!(hub.serves("store-2"), ('a', true));
    let member = hub
        .rollout()
        .members
        .iter()
        .find(|m| m.cluster == "store-1")
        .expect("member");
    assert_eq!(
        member.previous,
        Some(digest('a')),
        "what it runs is its previous digest"
    );
    // A cluster that never said anything is still new: it follows HEAD while held.
    let mut quiet = fleet();
    quiet.render("main@r1", &every('a'), false);
    quiet.render("main@r2", &every('b'), false);
    assert_eq!(quiet.serves("store-1"), ('b', true));
}

#[test]
fn one_change_per_cluster_and_the_last_one_wins() {
    let mut hub = fleet();
    let decision = hub.render("main@r1", &every('a'), false);
    let canary: Vec<&ServedChange> = decision
        .served
        .iter()
        .filter(|c| c.cluster == "canary")
        .collect();
    // Held at once as a new cluster, then served by its released wave: one change.
    assert_eq!(canary.len(), 1);
    assert!(!canary[0].hold);
    let names: Vec<&str> = decision.served.iter().map(|c| c.cluster.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "changes are sorted by cluster");
}

#[test]
fn a_paused_cluster_keeps_its_digest_and_leaves_the_running_rollout() {
    let mut hub = settled();
    hub.render("main@r2", &every('b'), false);
    hub.pause("store-1");
    let decision = hub.render("main@r2", &every('b'), false);
    assert_eq!(hub.serves("store-1"), ('a', false));
    assert!(decision.started.is_empty());
    let rollout = hub.rollout();
    let member = rollout
        .members
        .iter()
        .find(|m| m.cluster == "store-1")
        .expect("member");
    assert!(member.left);
}

#[test]
fn a_newer_commit_supersedes_the_running_rollout_and_nobody_goes_back() {
    let mut hub = settled();
    hub.render("main@r2", &every('b'), false);
    let decision = hub.render("main@r3", &every('c'), false);
    assert_eq!(decision.superseded, vec![0]);
    assert_eq!(decision.steps[0].1.events.len(), 1);
    // The canary runs r2's digest until the new rollout's canary wave serves r3's;
    // the stores keep r1's: nobody is served an older digest than before.
    assert_eq!(hub.serves("canary"), ('c', false));
    assert_eq!(hub.serves("store-1"), ('a', false));
    let rollout = hub.rollout();
    assert_eq!(rollout.revision, "main@r3");
    let canary = rollout
        .members
        .iter()
        .find(|m| m.cluster == "canary")
        .expect("member");
    assert_eq!(canary.previous, Some(digest('b')));
}

#[test]
fn a_commit_that_changes_no_governed_cluster_does_not_supersede() {
    let mut hub = settled();
    hub.render("main@r2", &every('b'), false);
    let decision = hub.render(
        "main@r3",
        &[
            ("red", 'e'),
            ("blue", 'e'),
            ("canary", 'b'),
            ("store-1", 'b'),
            ("store-2", 'b'),
        ],
        false,
    );
    assert!(decision.superseded.is_empty());
    assert!(decision.started.is_empty());
    assert_eq!(hub.rollout().revision, "main@r2");
    assert_eq!(hub.rollout().state, RolloutState::Progressing);
    assert_eq!(hub.serves("red"), ('e', false));
}

#[test]
fn a_cluster_removed_from_the_fleet_leaves_the_rollout_and_is_forgotten() {
    let mut hub = settled();
    hub.render("main@r2", &every('b'), false);
    let decision = hub.render(
        "main@r2",
        &[
            ("red", 'b'),
            ("blue", 'b'),
            ("canary", 'b'),
            ("store-1", 'b'),
        ],
        false,
    );
    assert_eq!(decision.removed, BTreeSet::from(["store-2".to_string()]));
    assert!(!hub.served.contains_key("store-2"));
    let member = hub
        .rollout()
        .members
        .iter()
        .find(|m| m.cluster == "store-2")
        .expect("member");
    assert!(member.left);
}

#[test]
fn a_cluster_whose_render_is_reverted_leaves_the_rollout_instead_of_taking_the_old_render() {
    let mut hub = settled();
    hub.render("main@r2", &every('b'), false);
    // r3 renders for store-1 what it is served again (r1's digest): nothing changes,
    // nothing is superseded, and r2's rollout must not serve it r2's digest later.
    let mut digests = every('b');
    digests[3] = ("store-1", 'a');
    let decision = hub.render("main@r3", &digests, false);
    assert!(decision.superseded.is_empty());
    let member = hub
        .rollout()
        .members
        .iter()
        .find(|m| m.cluster == "store-1")
        .expect("member");
    assert!(member.left, "store-1 stays in r2's rollout");
    assert_eq!(hub.serves("store-1"), ('a', false));
}

#[test]
fn a_forced_commit_releases_every_wave_at_once() {
    let mut hub = settled();
    let decision = hub.render("main@r2", &every('b'), true);
    for name in ALL {
        assert_eq!(hub.serves(name), ('b', false), "{name}");
    }
    assert!(decision.started[0].rollout.forced);
}

#[test]
fn a_rollout_that_exists_for_the_revision_is_not_started_again() {
    let mut hub = settled();
    hub.started.insert(("stores".into(), "main@r2".into()));
    let decision = hub.render("main@r2", &every('b'), false);
    assert!(decision.started.is_empty());
    // Without a rollout, governed clusters keep what they run.
    assert_eq!(hub.serves("canary"), ('a', false));
    assert_eq!(hub.serves("red"), ('b', false));
}

#[test]
fn a_hub_on_a_new_store_releases_no_wave_before_its_clusters_were_heard_from() {
    let mut hub = fleet();
    hub.release_not_before = Some(T0 + OFFLINE_AFTER);
    let decision = hub.render("main@r1", &every('a'), false);
    let rollout = &decision.started[0].rollout;
    assert!(rollout.waves.iter().all(|w| w.state == WaveState::Waiting));
    for name in ["canary", "store-1", "store-2"] {
        assert_eq!(hub.serves(name), ('a', true), "{name} is held");
    }
    assert_eq!(
        decision.started[0].step.next_check,
        Some(T0 + OFFLINE_AFTER)
    );
}

// Properties: random fleets and sequences of commits.

#[derive(Clone, Debug)]
struct Commit {
    /// Per cluster of the universe: its digest letter, or not in the fleet.
    digests: Vec<Option<char>>,
    forced: bool,
    /// Per cluster: its agent reports before this commit.
    reports: Vec<bool>,
}

fn commit(clusters: usize) -> impl Strategy<Value = Commit> {
    (
        proptest::collection::vec(
            prop_oneof![1 => Just(None), 6 => proptest::char::range('a', 'd').prop_map(Some)],
            clusters,
        ),
        proptest::bool::weighted(0.15),
        proptest::collection::vec(proptest::bool::weighted(0.3), clusters),
    )
        .prop_map(|(digests, forced, reports)| Commit {
            digests,
            forced,
            reports,
        })
}

fn scenario() -> impl Strategy<Value = (Vec<Option<usize>>, Vec<Commit>)> {
    (2usize..7).prop_flat_map(|n| {
        (
            proptest::collection::vec(
                prop_oneof![1 => Just(None), 3 => (0usize..2).prop_map(Some)],
                n,
            ),
            proptest::collection::vec(commit(n), 1..6),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn render_decisions_keep_their_invariants((waves, commits) in scenario()) {
        let names: Vec<String> = (0..waves.len()).map(|i| format!("c{i}")).collect();
        let clusters: Vec<(&str, Option<usize>)> =
            names.iter().map(String::as_str).zip(waves.iter().copied()).collect();
        let mut hub = Hub::new(&clusters);
        for (n, commit) in commits.iter().enumerate() {
            let revision = format!("main@r{n}");
            let digests: Vec<(&str, char)> = names
                .iter()
                .zip(&commit.digests)
                .filter_map(|(name, d)| d.map(|c| (name.as_str(), c)))
                .collect();
            for (name, reports) in names.iter().zip(&commit.reports) {
                if *reports {
                    hub.reported.insert(name.clone());
                }
            }
            let before = hub.served.clone();
            let reported = hub.reported.clone();
            let decision = hub.render(&revision, &digests, commit.forced);

            // One rollout per policy and revision.
            let mut seen = BTreeSet::new();
            for s in &decision.started {
                prop_assert!(seen.insert((s.rollout.policy.name.clone(), s.rollout.revision.clone())));
            }
            // One change per cluster, and only to clusters of the fleet.
            let changed: BTreeSet<&str> = decision.served.iter().map(|c| c.cluster.as_str()).collect();
            prop_assert_eq!(changed.len(), decision.served.len());
            for change in &decision.served {
                let latest = hub.latest.get(&change.cluster);
                prop_assert!(latest.is_some(), "{} is not in the fleet", change.cluster);
                let latest = latest.expect("checked");
                // A render never serves anything but HEAD's render of a cluster.
                prop_assert_eq!(&change.digest, &latest.digest);
                // A governed cluster whose running digest the hub knew is served a
                // new digest only by a rollout that admitted it (its wave released).
                let known = before
                    .get(&change.cluster)
                    .filter(|e| !e.hold || reported.contains(&change.cluster));
                if let (Some(known), Some(_)) = (known, &latest.policy)
                    && known.digest != change.digest
                {
                    let admitted = hub.running.iter().any(|t| {
                        t.rollout.members.iter().any(|m| m.cluster == change.cluster && m.serves_target())
                    }) || decision.started.iter().any(|s| {
                        s.rollout.members.iter().any(|m| m.cluster == change.cluster && m.serves_target())
                    });
                    prop_assert!(admitted, "{} served {} before its wave", change.cluster, change.digest);
                }
            }
            // A superseded rollout has ended and serves nobody anything.
            for (i, step) in &decision.steps {
                if decision.superseded.contains(i) {
                    prop_assert!(step.serve.is_empty());
                }
            }
        }
    }
}
