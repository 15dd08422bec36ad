//! The render decision as a table of scenarios (each rule of a clean render: held and
//! new clusters, paused, supersede, leave — removed, paused, moved to another policy,
//! reverted —, the immediate trailer, an empty store) and as properties over random
//! fleets of several policies and sequences of commits, some rendered again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::rollout::tests::{MINUTE, OFFLINE_AFTER, T0, digest, policy, wave};
use crate::rollout::{Budget, Health, Placement, Policy, Report, Rollout, RolloutState, WaveState};

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
    /// No cluster has been seen yet (a hub just started on a new store).
    unheard: bool,
}

impl Hub {
    /// A fleet governed by the policy `stores` (waves `canary` then `rest`): each
    /// cluster as (name, wave) — `None` for an ungoverned cluster.
    fn new(clusters: &[(&str, Option<usize>)]) -> Hub {
        let placed: Vec<(&str, Option<(usize, usize)>)> = clusters
            .iter()
            .map(|&(name, wave)| (name, wave.map(|w| (0, w))))
            .collect();
        Hub::with_policies(&["stores"], &placed)
    }

    /// A fleet governed by the policies named, each with the waves `canary` then
    /// `rest`: each cluster as (name, (policy, wave)) — `None` for an ungoverned one.
    fn with_policies(policies: &[&str], clusters: &[(&str, Option<(usize, usize)>)]) -> Hub {
        let policies = policies
            .iter()
            .map(|&name| Policy {
                name: name.into(),
                file: format!("rollouts/{name}.yaml"),
                ..policy(vec![
                    wave("canary", 15, Budget::Count(0), None),
                    wave("rest", 0, Budget::Count(0), None),
                ])
            })
            .collect();
        let placements: BTreeMap<String, Placement> = clusters
            .iter()
            .filter_map(|&(name, place)| {
                place.map(|(policy, wave)| (name.to_string(), Placement { policy, wave }))
            })
            .collect();
        Hub {
            plan: RolloutPlan {
                policies,
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
            unheard: false,
        }
    }

    fn pause(&mut self, cluster: &str) {
        self.plan.placements.remove(cluster);
        self.plan.paused.insert(cluster.to_string());
    }

    /// The next commit's policies govern `cluster` by the policy at index `policy`.
    fn move_to(&mut self, cluster: &str, policy: usize, wave: usize) {
        self.plan
            .placements
            .insert(cluster.to_string(), Placement { policy, wave });
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
        let last_seen = (!self.unheard).then_some(now);
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
            last_seen,
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
    settle(fleet())
}

/// `hub` after a first render of `a` at r1 to every cluster of [`ALL`], each served
/// `a` and known to run it.
fn settle(mut hub: Hub) -> Hub {
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
fn a_new_cluster_that_is_already_paused_is_held_and_joins_no_rollout() {
    let mut hub = settled();
    // store-3 comes into the fleet with `spec.paused: true`: it has nothing to keep,
    // so it is served HEAD's render, held (an agent naming what it runs keeps it).
    hub.plan.paused.insert("store-3".into());
    let mut digests = every('b');
    digests.push(("store-3", 'b'));
    let decision = hub.render("main@r2", &digests, false);
    assert_eq!(hub.serves("store-3"), ('b', true));
    assert_eq!(decision.started.len(), 1, "the stores' rollout starts");
    assert!(
        decision.started[0]
            .rollout
            .members
            .iter()
            .all(|m| m.cluster != "store-3"),
        "a paused cluster is in no wave"
    );
    // Still paused, it keeps that digest when a newer commit renders another.
    digests = every('c');
    digests.push(("store-3", 'c'));
    let decision = hub.render("main@r3", &digests, false);
    assert_eq!(hub.serves("store-3"), ('b', true));
    assert!(
        decision.served.iter().all(|c| c.cluster != "store-3"),
        "nothing changes for a paused cluster"
    );
    assert!(
        hub.rollout().members.iter().all(|m| m.cluster != "store-3"),
        "r3's rollout leaves it out too"
    );
}

#[test]
fn a_member_moved_to_another_policy_leaves_its_rollout_and_joins_one_of_that_policy() {
    // The stores of the usual fleet, and a second policy, `kiosks`, that governs
    // nothing yet.
    let mut hub = settle(Hub::with_policies(
        &["stores", "kiosks"],
        &[
            ("red", None),
            ("blue", None),
            ("canary", Some((0, 0))),
            ("store-1", Some((0, 1))),
            ("store-2", Some((0, 1))),
        ],
    ));
    hub.render("main@r2", &every('b'), false);
    assert_eq!(hub.serves("store-2"), ('a', false), "its wave waits");
    // r3 renders the same bundles, and moves store-2 to the first wave of `kiosks`.
    hub.move_to("store-2", 1, 0);
    let decision = hub.render("main@r3", &every('b'), false);
    // No store changes: r2's rollout goes on, without store-2.
    assert!(decision.superseded.is_empty());
    let stores = &hub.running[0].rollout;
    assert_eq!(
        (stores.policy.name.as_str(), stores.revision.as_str()),
        ("stores", "main@r2")
    );
    assert_eq!(stores.state, RolloutState::Progressing);
    let member = stores
        .members
        .iter()
        .find(|m| m.cluster == "store-2")
        .expect("member");
    assert!(member.left, "store-2 left the stores' rollout");
    let (_, step) = decision
        .steps
        .iter()
        .find(|(i, _)| *i == 0)
        .expect("a step for r2's rollout");
    assert!(
        step.events.iter().any(|e| e.message
            == "store-2 left the rollout (no longer governed by rollout policy stores)"),
        "{:?}",
        step.events
    );
    // It changes in a rollout of `kiosks` for r3, from the digest it runs.
    assert_eq!(decision.started.len(), 1);
    let kiosks = &decision.started[0].rollout;
    assert_eq!(
        (kiosks.policy.name.as_str(), kiosks.revision.as_str()),
        ("kiosks", "main@r3")
    );
    let members: Vec<(&str, Option<&Digest>)> = kiosks
        .members
        .iter()
        .map(|m| (m.cluster.as_str(), m.previous.as_ref()))
        .collect();
    assert_eq!(members, vec![("store-2", Some(&digest('a')))]);
    // Its first wave is released at once; store-1 still waits in r2's rollout.
    assert_eq!(hub.serves("store-2"), ('b', false));
    assert_eq!(hub.serves("store-1"), ('a', false));
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
    hub.unheard = true;
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
    /// Instead of a new commit, one of the sequence's earlier commits is rendered
    /// again (the branch reset to it, or the same commit recorded twice): its
    /// revision, bundles and trailer.
    again: Option<usize>,
}

fn commit(clusters: usize) -> impl Strategy<Value = Commit> {
    (
        proptest::collection::vec(
            prop_oneof![1 => Just(None), 6 => proptest::char::range('a', 'd').prop_map(Some)],
            clusters,
        ),
        proptest::bool::weighted(0.15),
        proptest::collection::vec(proptest::bool::weighted(0.3), clusters),
        proptest::option::weighted(0.25, any::<usize>()),
    )
        .prop_map(|(digests, forced, reports, again)| Commit {
            digests,
            forced,
            reports,
            again,
        })
}

/// The number of policies, each cluster's (policy, wave) — `None` when ungoverned —
/// and the commits.
type Scenario = (usize, Vec<Option<(usize, usize)>>, Vec<Commit>);

fn scenario() -> impl Strategy<Value = Scenario> {
    (1usize..4, 2usize..7).prop_flat_map(|(policies, n)| {
        (
            Just(policies),
            proptest::collection::vec(
                prop_oneof![1 => Just(None), 3 => (0..policies, 0usize..2).prop_map(Some)],
                n,
            ),
            proptest::collection::vec(commit(n), 1..7),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn render_decisions_keep_their_invariants((policies, places, commits) in scenario()) {
        check_renders(policies, &places, &commits)?;
    }
}

/// Renders the scenario's commits in turn and checks each decision's invariants.
fn check_renders(
    policies: usize,
    places: &[Option<(usize, usize)>],
    commits: &[Commit],
) -> Result<(), TestCaseError> {
    let policy_names: Vec<String> = (0..policies).map(|i| format!("p{i}")).collect();
    let policy_names: Vec<&str> = policy_names.iter().map(String::as_str).collect();
    let names: Vec<String> = (0..places.len()).map(|i| format!("c{i}")).collect();
    let clusters: Vec<(&str, Option<(usize, usize)>)> = names
        .iter()
        .map(String::as_str)
        .zip(places.iter().copied())
        .collect();
    let mut hub = Hub::with_policies(&policy_names, &clusters);
    // What each commit of the sequence rendered: its revision, bundles and trailer.
    let mut rendered: Vec<(String, Vec<Option<char>>, bool)> = Vec::new();
    for (n, commit) in commits.iter().enumerate() {
        let (revision, bundles, forced) = match commit.again {
            Some(earlier) if n > 0 => rendered[earlier % n].clone(),
            _ => (format!("main@r{n}"), commit.digests.clone(), commit.forced),
        };
        rendered.push((revision.clone(), bundles.clone(), forced));
        let digests: Vec<(&str, char)> = names
            .iter()
            .zip(&bundles)
            .filter_map(|(name, d)| d.map(|c| (name.as_str(), c)))
            .collect();
        for (name, reports) in names.iter().zip(&commit.reports) {
            if *reports {
                hub.reported.insert(name.clone());
            }
        }
        let before = hub.served.clone();
        let reported = hub.reported.clone();
        let started_before = hub.started.clone();
        let decision = hub.render(&revision, &digests, forced);

        // One rollout per policy and revision, over the whole sequence: a commit
        // rendered again starts none that it started before.
        let mut seen = started_before;
        for s in &decision.started {
            prop_assert!(
                seen.insert((s.rollout.policy.name.clone(), s.rollout.revision.clone())),
                "a second rollout of {} for {}",
                s.rollout.policy.name,
                s.rollout.revision
            );
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
            prop_assert_eq!(&change.revision, &latest.revision);
            // A governed cluster whose running digest the hub knew is served a
            // new digest only by a rollout that admitted it (its wave released).
            let known = before
                .get(&change.cluster)
                .filter(|e| !e.hold || reported.contains(&change.cluster));
            if let (Some(known), Some(_)) = (known, &latest.policy)
                && known.digest != change.digest
            {
                let admitted = hub.running.iter().any(|t| {
                    t.rollout
                        .members
                        .iter()
                        .any(|m| m.cluster == change.cluster && m.serves_target())
                }) || decision.started.iter().any(|s| {
                    s.rollout
                        .members
                        .iter()
                        .any(|m| m.cluster == change.cluster && m.serves_target())
                });
                prop_assert!(
                    admitted,
                    "{} served {} before its wave",
                    change.cluster,
                    change.digest
                );
            }
        }
        // A superseded rollout has ended and serves nobody anything.
        for (i, step) in &decision.steps {
            if decision.superseded.contains(i) {
                prop_assert!(step.serve.is_empty());
            }
        }
        // A superseded rollout is marked so. That a supersede never sends one of its
        // members back is the check above: every change serves HEAD's render (its
        // digest, and the revision that first rendered that digest, which may be
        // older than the one served before when HEAD went back to a commit or
        // returned to its content), never a digest HEAD no longer renders.
        for &i in &decision.superseded {
            prop_assert_eq!(hub.running[i].rollout.state, RolloutState::Superseded);
        }
    }
    Ok(())
}

#[test]
fn a_supersede_after_a_reset_does_not_send_a_cluster_back() {
    let commit = |digests: [Option<char>; 4], forced, again: Option<usize>| Commit {
        digests: digests.to_vec(),
        forced,
        reports: vec![false; 4],
        again,
    };
    let commits = [
        commit([Some('c'), Some('b'), None, Some('a')], false, None),
        commit([None, None, None, Some('b')], false, None),
        commit([None; 4], false, Some(0)),
        commit([None, Some('c'), None, Some('a')], false, None),
        commit([None, Some('a'), None, Some('a')], true, None),
    ];
    let places = [Some((0, 0)), Some((0, 0)), None, Some((0, 1))];
    check_renders(1, &places, &commits).expect("the invariants hold");
}
