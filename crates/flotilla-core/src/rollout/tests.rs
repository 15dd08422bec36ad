//! The decision table: scenarios a fleet operator would recognise, each a script of
//! reports, silences and time passing, with what must be served and recorded.

use std::time::Duration;

use super::*;
use crate::bundle::Digest;
use crate::model::WindowSpec;

pub(super) const MINUTE: Millis = 60_000;
pub(super) const OFFLINE_AFTER: Millis = 5 * MINUTE;
/// 2025-01-15T00:00:00Z, a Wednesday.
pub(super) const T0: Millis = 1_736_899_200_000;

pub(super) fn digest(c: char) -> Digest {
    Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
}

pub(super) fn wave(
    name: &str,
    bake_minutes: u64,
    max_failed: Budget,
    max_parallel: Option<Budget>,
) -> WavePlan {
    WavePlan {
        name: name.into(),
        bake: Duration::from_secs(bake_minutes * 60),
        max_failed,
        max_parallel,
    }
}

pub(super) fn policy(waves: Vec<WavePlan>) -> Policy {
    Policy {
        name: "stores".into(),
        file: "rollouts/stores.yaml".into(),
        waves,
        offline: OfflinePolicy::Skip,
        on_failure: FailurePolicy::Halt,
        progress_deadline: None,
        windows: Vec::new(),
    }
}

/// A rollout being driven by a script. Every cluster that is not silenced is seen
/// (a heartbeat or a poll) each minute; time moves a minute at a time, with a
/// decision after each.
pub(super) struct Sim {
    pub rollout: Rollout,
    pub obs: Vec<Observation>,
    pub silenced: Vec<bool>,
    pub now: Millis,
    pub log: Vec<String>,
}

impl Sim {
    /// Members as (cluster, wave); every cluster was seen just now, so all are online.
    pub fn new(policy: Policy, members: &[(&str, usize)], forced: bool) -> Sim {
        let mut list: Vec<Member> = members
            .iter()
            .map(|(name, wave)| {
                Member::new(name.to_string(), *wave, Some(digest('a')), digest('b'))
            })
            .collect();
        list.sort_by_key(|m| m.wave);
        let (rollout, step) = Rollout::start(policy, "main@sha1:2".into(), forced, list, T0);
        let obs = vec![
            Observation {
                report: Some(Report {
                    health: Health::Elsewhere,
                    at: T0,
                }),
                last_seen: Some(T0),
                fetched_at: None,
            };
            rollout.members.len()
        ];
        let mut sim = Sim {
            silenced: vec![false; rollout.members.len()],
            rollout,
            obs,
            now: T0,
            log: Vec::new(),
        };
        sim.record(step);
        sim
    }

    pub fn index(&self, cluster: &str) -> usize {
        self.rollout
            .members
            .iter()
            .position(|m| m.cluster == cluster)
            .unwrap_or_else(|| panic!("no member {cluster}"))
    }

    pub fn record(&mut self, step: Step) -> Step {
        self.log
            .extend(step.events.iter().map(|e| e.message.clone()));
        step
    }

    pub fn decide(&mut self) -> Step {
        let step = decide(&mut self.rollout, &self.obs, self.now, OFFLINE_AFTER);
        self.record(step)
    }

    /// [`Sim::decide`] by a hub that settles until `settle` (its start plus
    /// `OFFLINE_AFTER`).
    pub fn decide_settling(&mut self, settle: Millis) -> Step {
        let step = decide_with(
            &mut self.rollout,
            &self.obs,
            self.now,
            OFFLINE_AFTER,
            Some(settle),
        );
        self.record(step)
    }

    /// Moves time on minute by minute; returns the last step.
    pub fn advance(&mut self, minutes: i64) -> Step {
        let mut last = Step::default();
        for _ in 0..minutes {
            self.now += MINUTE;
            for (index, silenced) in self.silenced.iter().enumerate() {
                if !silenced {
                    self.obs[index].last_seen = Some(self.now);
                }
            }
            last = self.decide();
        }
        last
    }

    /// A report arrives now; if it names the target, the cluster fetched it.
    pub fn report(&mut self, cluster: &str, health: Health) -> Step {
        let i = self.index(cluster);
        self.silenced[i] = false;
        self.obs[i].report = Some(Report {
            health,
            at: self.now,
        });
        self.obs[i].last_seen = Some(self.now);
        self.decide()
    }

    /// A poll that fetched what is served now (polls trigger no decision).
    pub fn poll(&mut self, cluster: &str) {
        let i = self.index(cluster);
        self.obs[i].last_seen = Some(self.now);
        self.obs[i].fetched_at = Some(self.now);
    }

    /// The cluster is not heard from again (it was last seen when it was last seen).
    pub fn silence(&mut self, cluster: &str) {
        let i = self.index(cluster);
        self.silenced[i] = true;
    }

    /// The cluster has never been seen.
    pub fn never_seen(&mut self, cluster: &str) {
        let i = self.index(cluster);
        self.silenced[i] = true;
        self.obs[i].last_seen = None;
        self.obs[i].report = None;
    }

    /// The clusters served the new digest, sorted.
    pub fn serving(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .rollout
            .members
            .iter()
            .filter(|m| m.serves_target())
            .map(|m| m.cluster.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    pub fn wave_states(&self) -> Vec<WaveState> {
        self.rollout.waves.iter().map(|w| w.state).collect()
    }

    pub fn logged(&self, needle: &str) -> bool {
        self.log.iter().any(|line| line.contains(needle))
    }
}

use WaveState::{Complete as Done, Failed as WaveFailed, Released, Waiting};

fn canary_then_rest(bake: u64) -> Policy {
    policy(vec![
        wave("canary", bake, Budget::Count(0), None),
        wave("rest", 0, Budget::Count(0), None),
    ])
}

const FLEET: &[(&str, usize)] = &[("c1", 0), ("r1", 1), ("r2", 1), ("r3", 1)];

#[test]
fn canaries_get_the_change_first_and_alone() {
    let mut sim = Sim::new(canary_then_rest(15), FLEET, false);
    let step = sim.decide();
    assert_eq!(sim.serving(), ["c1"]);
    assert_eq!(sim.wave_states(), [Released, Waiting]);
    assert_eq!(step.serve, [(sim.index("c1"), Serve::Target)]);
    assert!(sim.logged("released wave canary (1 changing cluster): the first wave"));
}

#[test]
fn the_next_wave_only_after_the_bake() {
    let mut sim = Sim::new(canary_then_rest(15), FLEET, false);
    sim.decide();
    sim.advance(2);
    sim.report("c1", Health::Progressing);
    sim.advance(1);
    let step = sim.report("c1", Health::Healthy);
    // Healthy at T0+3m: the bake ends at T0+18m, and the hub looks again by then.
    assert!(step.next_check.is_some_and(|at| at <= T0 + 18 * MINUTE));
    sim.advance(14);
    assert_eq!(sim.serving(), ["c1"], "14 minutes baked is not 15");
    sim.advance(1);
    assert_eq!(sim.wave_states(), [Done, Released]);
    assert_eq!(sim.serving(), ["c1", "r1", "r2", "r3"]);
    assert!(sim.logged("released wave rest (3 changing clusters): wave canary baked"));
}

#[test]
fn an_unhealthy_report_restarts_the_bake() {
    let mut sim = Sim::new(canary_then_rest(10), FLEET, false);
    sim.decide();
    sim.report("c1", Health::Healthy);
    sim.advance(8);
    sim.report("c1", Health::Progressing);
    sim.advance(1);
    sim.report("c1", Health::Healthy);
    sim.advance(9);
    assert_eq!(
        sim.wave_states(),
        [Released, Waiting],
        "the bake began again at minute 9"
    );
    sim.advance(1);
    assert_eq!(sim.wave_states(), [Done, Released]);
}

#[test]
fn too_many_failures_halt_and_rollback_serves_the_previous_digest() {
    for on_failure in [FailurePolicy::Halt, FailurePolicy::Rollback] {
        let mut policy = canary_then_rest(15);
        policy.on_failure = on_failure;
        let mut sim = Sim::new(policy, FLEET, false);
        sim.decide();
        let step = sim.report("c1", Health::Failed);
        assert_eq!(sim.rollout.state, RolloutState::Halted);
        assert_eq!(sim.wave_states(), [WaveFailed, Waiting]);
        assert!(sim.logged("c1 failed: its report for the new digest failed"));
        assert!(sim.logged(
            "halted: wave canary: 1 failed cluster (c1), more than maxFailed 0 allows (0)"
        ));
        if on_failure == FailurePolicy::Rollback {
            assert_eq!(step.serve, [(sim.index("c1"), Serve::Previous)]);
            assert!(sim.serving().is_empty());
        } else {
            assert!(step.serve.is_empty());
            assert_eq!(sim.serving(), ["c1"]);
        }
        // Nothing more is released, whatever happens.
        sim.advance(60);
        assert_eq!(sim.wave_states(), [WaveFailed, Waiting]);
    }
}

#[test]
fn failures_within_the_budget_let_the_wave_complete() {
    let policy = policy(vec![wave("all", 0, Budget::Percent(34), None)]);
    let mut sim = Sim::new(policy, &[("a", 0), ("b", 0), ("c", 0)], false);
    sim.decide();
    sim.report("a", Health::Failed);
    sim.report("b", Health::Healthy);
    assert_eq!(sim.rollout.state, RolloutState::Progressing);
    sim.report("c", Health::Healthy);
    assert_eq!(sim.rollout.state, RolloutState::Complete);
    assert!(sim.logged("1 failed within maxFailed 34%"));
}

#[test]
fn offline_skip_serves_the_change_and_neither_blocks_nor_fails() {
    let mut sim = Sim::new(
        canary_then_rest(0),
        &[("c1", 0), ("c2", 0), ("r1", 1)],
        false,
    );
    sim.never_seen("c2");
    sim.decide();
    assert_eq!(
        sim.serving(),
        ["c1", "c2"],
        "a skipped cluster is served the change"
    );
    assert!(sim.logged("1 offline at release and skipped"));
    sim.report("c1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Done, Released]);
    assert_eq!(sim.rollout.state, RolloutState::Progressing);
}

#[test]
fn a_wave_whose_clusters_were_all_skipped_pauses_for_an_operator() {
    let mut sim = Sim::new(canary_then_rest(0), FLEET, false);
    sim.never_seen("c1");
    sim.decide();
    assert_eq!(sim.rollout.state, RolloutState::Paused);
    // Never heard from is said so, not called offline.
    assert!(sim.logged("1 offline at release and skipped (none of them ever heard from)"));
    assert!(sim.logged("no changing cluster of wave canary has ever been heard from"));
    // A canary heard from once, silent past the threshold, is offline.
    let mut silent = Sim::new(canary_then_rest(0), FLEET, false);
    let c1 = silent.index("c1");
    silent.silence("c1");
    silent.obs[c1].last_seen = Some(T0 - OFFLINE_AFTER - MINUTE);
    silent.decide();
    assert_eq!(silent.rollout.state, RolloutState::Paused);
    assert!(silent.logged("1 offline at release and skipped): the first wave"));
    assert!(silent.logged("every changing cluster of wave canary was offline"));
    sim.advance(30);
    assert_eq!(
        sim.wave_states()[1],
        Waiting,
        "nothing released while paused"
    );
    let step = sim.rollout.resume("op-1", sim.now).expect("resumes");
    sim.record(step);
    sim.decide();
    assert_eq!(sim.wave_states()[1], Released);
}

#[test]
fn a_last_wave_whose_clusters_were_all_skipped_completes_and_says_so() {
    let mut sim = Sim::new(canary_then_rest(0), FLEET, false);
    for name in ["r1", "r2", "r3"] {
        sim.never_seen(name);
    }
    sim.decide();
    sim.poll("c1");
    sim.report("c1", Health::Healthy);
    sim.advance(1);
    // No later wave to hold back: not paused, and the end says who did not take it.
    assert_eq!(sim.rollout.state, RolloutState::Complete, "{:#?}", sim.log);
    assert!(!sim.logged("paused"));
    assert!(sim.logged("wave rest complete: 0 clusters baked, 3 skipped (offline at release"));
    assert!(sim.logged(
        "complete: every wave done; 3 clusters skipped (offline at release) take the change when they come back"
    ));
}

#[test]
fn offline_wait_blocks_until_healthy_or_the_deadline() {
    let mut policy = canary_then_rest(0);
    policy.offline = OfflinePolicy::Wait;
    policy.progress_deadline = Some(Duration::from_secs(3600));
    let mut sim = Sim::new(policy.clone(), &[("c1", 0), ("c2", 0), ("r1", 1)], false);
    sim.never_seen("c2");
    sim.decide();
    sim.report("c1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Released, Waiting], "c2 blocks the wave");
    sim.advance(20);
    sim.report("c2", Health::Healthy);
    assert_eq!(sim.wave_states(), [Done, Released], "c2 came back healthy");

    let mut sim = Sim::new(policy, &[("c1", 0), ("c2", 0), ("r1", 1)], false);
    sim.never_seen("c2");
    sim.decide();
    sim.report("c1", Health::Healthy);
    sim.advance(59);
    assert_eq!(sim.rollout.state, RolloutState::Progressing);
    sim.advance(1);
    assert_eq!(sim.rollout.state, RolloutState::Halted);
    assert!(sim.logged("not complete by its progress deadline (1h after release)"));
}

#[test]
fn a_canary_that_goes_silent_after_taking_the_change_fails() {
    let mut sim = Sim::new(canary_then_rest(30), FLEET, false);
    sim.decide();
    sim.advance(1);
    sim.poll("c1"); // takes the new digest
    sim.silence("c1");
    sim.advance(5);
    assert_eq!(
        sim.rollout.state,
        RolloutState::Progressing,
        "5 minutes is not offline yet"
    );
    sim.advance(1);
    assert!(sim.logged("c1 failed: it went silent after taking the new digest"));
    assert_eq!(sim.rollout.state, RolloutState::Halted);
}

#[test]
fn a_skipped_cluster_that_comes_back_takes_the_change_and_then_goes_silent_fails() {
    let policy = policy(vec![wave("all", 30, Budget::Count(0), None)]);
    let mut sim = Sim::new(policy, &[("a", 0), ("b", 0)], false);
    sim.never_seen("b");
    sim.decide();
    assert!(sim.rollout.members[sim.index("b")].offline_at_release);
    sim.advance(1);
    sim.poll("b");
    sim.report("b", Health::Progressing);
    sim.silence("b");
    sim.advance(6);
    assert!(sim.logged("b failed: it went silent after taking the new digest"));
    assert_eq!(sim.rollout.state, RolloutState::Halted);
}

#[test]
fn max_parallel_lets_a_few_change_at_a_time() {
    let policy = policy(vec![wave(
        "all",
        0,
        Budget::Count(0),
        Some(Budget::Count(2)),
    )]);
    let names = [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0)];
    let mut sim = Sim::new(policy, &names, false);
    sim.decide();
    let first = sim.serving().len();
    assert_eq!(first, 2);
    let admitted: Vec<String> = sim.serving().iter().map(|s| s.to_string()).collect();
    sim.report(&admitted[0], Health::Progressing);
    assert_eq!(sim.serving().len(), 2, "progressing is not healthy yet");
    sim.report(&admitted[0], Health::Healthy);
    assert_eq!(sim.serving().len(), 3);
    assert!(sim.logged("maxParallel 2"));
}

#[test]
fn waves_are_released_only_inside_a_window() {
    let mut policy = canary_then_rest(0);
    // 02:00-05:00 in Berlin on weekdays; T0 is Wednesday 01:00 in Berlin.
    policy.windows = vec![
        Window::from_spec(&WindowSpec {
            days: vec![
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri,
            ],
            start: "02:00".into(),
            end: "05:00".into(),
            tz: Some("Europe/Berlin".into()),
        })
        .expect("window"),
    ];
    let mut sim = Sim::new(policy, FLEET, false);
    let step = sim.decide();
    assert!(sim.serving().is_empty(), "outside the window");
    assert_eq!(step.next_check, Some(T0 + 60 * MINUTE));
    sim.advance(60);
    assert_eq!(sim.serving(), ["c1"]);
    sim.report("c1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Done, Released]);
    // A forced rollout ignores windows.
    let mut forced = Sim::new(sim.rollout.policy.clone(), FLEET, true);
    forced.now = T0 - 10 * MINUTE;
    forced.decide();
    assert_eq!(forced.serving().len(), 4);
}

#[test]
fn a_forced_rollout_releases_every_wave_at_once_and_ignores_max_parallel() {
    let policy = policy(vec![
        wave("canary", 60, Budget::Count(0), Some(Budget::Count(1))),
        wave("rest", 60, Budget::Count(0), Some(Budget::Count(1))),
    ]);
    let mut sim = Sim::new(policy, FLEET, true);
    sim.decide();
    assert_eq!(sim.wave_states(), [Released, Released]);
    assert_eq!(sim.serving(), ["c1", "r1", "r2", "r3"]);
    assert!(sim.logged("forced"));
}

#[test]
fn pause_resume_promote_and_abort() {
    let mut sim = Sim::new(canary_then_rest(60), FLEET, false);
    sim.decide();
    let step = sim.rollout.pause("op-1", sim.now).expect("pauses");
    assert_eq!(step.events[0].by.as_deref(), Some("op-1"));
    sim.record(step);
    assert!(
        sim.rollout.pause("op-1", sim.now).is_err(),
        "already paused"
    );
    sim.report("c1", Health::Healthy);
    sim.advance(61);
    assert_eq!(sim.wave_states(), [Done, Waiting], "baked, but paused");
    let step = sim.rollout.resume("op-1", sim.now).expect("resumes");
    sim.record(step);
    sim.decide();
    assert_eq!(sim.wave_states(), [Done, Released]);

    let mut sim = Sim::new(canary_then_rest(60), FLEET, false);
    sim.decide();
    let obs = sim.obs.clone();
    let step = sim
        .rollout
        .promote("op-2", sim.now, OFFLINE_AFTER, &obs)
        .expect("promotes");
    assert_eq!(step.events[0].by.as_deref(), Some("op-2"));
    assert!(step.events[0].message.contains("promoted by op-2"));
    sim.record(step);
    sim.decide();
    assert_eq!(sim.serving(), ["c1", "r1", "r2", "r3"]);
    assert!(
        sim.rollout
            .promote("op-2", sim.now, OFFLINE_AFTER, &obs)
            .is_err(),
        "nothing left to promote"
    );
    let step = sim.rollout.abort("op-3", sim.now).expect("aborts");
    assert_eq!(step.serve.len(), 4);
    assert!(step.serve.iter().all(|(_, s)| *s == Serve::Previous));
    assert_eq!(sim.rollout.state, RolloutState::Aborted);
    assert!(
        sim.rollout.resume("op-3", sim.now).is_err(),
        "an aborted rollout stays aborted"
    );
    assert!(sim.serving().is_empty());
}

#[test]
fn resume_re_releases_a_halted_wave_with_a_new_deadline() {
    let mut policy = canary_then_rest(0);
    policy.on_failure = FailurePolicy::Rollback;
    policy.progress_deadline = Some(Duration::from_secs(600));
    let mut sim = Sim::new(policy, FLEET, false);
    sim.decide();
    sim.report("c1", Health::Failed);
    assert_eq!(sim.rollout.state, RolloutState::Halted);
    assert!(sim.serving().is_empty());
    // The cluster is fixed; its agent reports the previous digest healthy.
    sim.advance(5);
    sim.report("c1", Health::Elsewhere);
    let step = sim.rollout.resume("op-1", sim.now).expect("resumes");
    sim.record(step);
    let step = sim.decide();
    assert_eq!(step.serve, [(sim.index("c1"), Serve::Target)]);
    assert_eq!(sim.rollout.waves[0].deadline, Some(sim.now + 10 * MINUTE));
    sim.report("c1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Done, Released]);
}

#[test]
fn a_cluster_that_leaves_neither_blocks_nor_fails() {
    let mut sim = Sim::new(
        canary_then_rest(0),
        &[("c1", 0), ("c2", 0), ("r1", 1)],
        false,
    );
    sim.decide();
    sim.report("c2", Health::Failed);
    assert_eq!(sim.rollout.state, RolloutState::Halted);

    let mut sim = Sim::new(
        canary_then_rest(0),
        &[("c1", 0), ("c2", 0), ("r1", 1)],
        false,
    );
    sim.decide();
    let i = sim.index("c2");
    let step = sim.rollout.leave(i, "removed from the fleet", sim.now);
    sim.record(step);
    sim.report("c1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Done, Released]);
    assert!(sim.logged("c2 left the rollout (removed from the fleet)"));
}

#[test]
fn supersede_keeps_what_every_cluster_is_served() {
    let mut sim = Sim::new(canary_then_rest(0), FLEET, false);
    sim.decide();
    let step = sim.rollout.supersede("main@sha1:3", sim.now);
    assert!(step.serve.is_empty());
    assert_eq!(sim.rollout.state, RolloutState::Superseded);
    assert_eq!(sim.serving(), ["c1"]);
    assert_eq!(
        sim.decide(),
        Step::default(),
        "an ended rollout decides nothing"
    );
}

#[test]
fn an_empty_wave_completes_at_release_and_the_whole_rollout_completes() {
    let policy = policy(vec![
        wave("canary", 10, Budget::Count(0), None),
        wave("rest", 0, Budget::Count(0), None),
    ]);
    let mut sim = Sim::new(policy, &[("r1", 1)], false);
    sim.decide();
    assert_eq!(sim.wave_states(), [Done, Released]);
    sim.report("r1", Health::Healthy);
    assert_eq!(sim.rollout.state, RolloutState::Complete);
    assert_eq!(sim.rollout.ended_at, Some(sim.now));
}

#[test]
fn judge_reads_reports_as_the_fleet_summary_does() {
    use crate::status::{ResourceStatus, StatusReport};
    let report = |applied: Option<char>, attempted: Option<char>, state: Option<ResourceState>| {
        StatusReport {
            applied: applied.map(digest),
            attempted: attempted.map(digest),
            resources: state
                .map(|state| {
                    vec![ResourceStatus {
                        key: std::sync::Arc::new(crate::bundle::ResourceKey::new(
                            "apps",
                            "Deployment",
                            "pos",
                            "api",
                        )),
                        state,
                        message: String::new(),
                    }]
                })
                .unwrap_or_default(),
            message: String::new(),
            agent_version: String::new(),
            drift: Vec::new(),
            features: Vec::new(),
        }
    };
    use crate::status::ResourceState;
    let target = digest('b');
    assert_eq!(
        judge(&report(Some('b'), Some('b'), None), &target),
        Health::Healthy
    );
    assert_eq!(
        judge(
            &report(Some('b'), Some('b'), Some(ResourceState::Healthy)),
            &target
        ),
        Health::Healthy
    );
    assert_eq!(
        judge(
            &report(Some('b'), Some('b'), Some(ResourceState::Progressing)),
            &target
        ),
        Health::Progressing
    );
    assert_eq!(
        judge(
            &report(Some('b'), Some('b'), Some(ResourceState::Failed)),
            &target
        ),
        Health::Failed
    );
    assert_eq!(
        judge(&report(Some('a'), Some('b'), None), &target),
        Health::Failed
    );
    assert_eq!(
        judge(&report(Some('a'), Some('a'), None), &target),
        Health::Elsewhere
    );
    assert_eq!(judge(&report(None, None, None), &target), Health::Elsewhere);
    // Drift is a flag beside the state, never a health: whatever the agent did about
    // it, a report judges as the same report without it.
    for action in [
        crate::status::DriftAction::Corrected,
        crate::status::DriftAction::Reported,
        crate::status::DriftAction::Fighting,
    ] {
        for state in [
            None,
            Some(ResourceState::Healthy),
            Some(ResourceState::Progressing),
        ] {
            let plain = report(Some('b'), Some('b'), state);
            let drifted = StatusReport {
                drift: vec![crate::status::DriftedResource {
                    group: "apps".into(),
                    kind: "Deployment".into(),
                    namespace: "pos".into(),
                    name: "api".into(),
                    fields: vec!["spec.replicas".into()],
                    managers: vec!["kubectl-edit".into()],
                    deleted: false,
                    action,
                }],
                ..plain.clone()
            };
            assert_eq!(
                judge(&drifted, &target),
                judge(&plain, &target),
                "{action:?}"
            );
        }
    }
}

#[test]
fn a_hub_that_just_started_releases_nothing_before_it_can_judge_who_is_offline() {
    let mut sim = Sim::new(canary_then_rest(0), FLEET, false);
    for name in ["c1", "r1", "r2", "r3"] {
        sim.never_seen(name);
    }
    let settle = T0 + OFFLINE_AFTER;
    let step = sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Waiting, Waiting]);
    assert_eq!(step.next_check, Some(settle));
    // The canary is heard from meanwhile: it is online at release and takes part.
    sim.now = settle;
    let i = sim.index("c1");
    sim.obs[i].last_seen = Some(settle - MINUTE);
    sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Released, Waiting]);
    assert!(!sim.rollout.members[i].offline_at_release);
    assert_eq!(sim.rollout.state, RolloutState::Progressing);
}

#[test]
fn a_hub_back_from_downtime_judges_nobody_on_contacts_from_before_it_started() {
    // A 10-minute bake from the canary's healthy report at T0.
    let mut sim = Sim::new(canary_then_rest(10), FLEET, false);
    sim.decide();
    sim.poll("c1");
    sim.report("c1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Released, Waiting]);
    // The hub is down for eight minutes: every contact it holds is older than the
    // threshold when it starts again.
    sim.now += 8 * MINUTE;
    let settle = sim.now + OFFLINE_AFTER;
    sim.decide_settling(settle);
    let c1 = sim.index("c1");
    assert!(!sim.rollout.members[c1].failed, "not judged silent at once");
    assert_eq!(sim.rollout.state, RolloutState::Progressing);
    assert_eq!(
        settling_until(&sim.rollout, &sim.obs, sim.now, OFFLINE_AFTER, Some(settle)),
        Some(settle),
        "a contact from before the start, older than the threshold, cannot be judged"
    );
    // After a short stop, the contacts from before it are recent enough to judge.
    let mut quick = Sim::new(canary_then_rest(10), FLEET, false);
    quick.decide();
    quick.now += 2 * MINUTE;
    assert_eq!(
        settling_until(
            &quick.rollout,
            &quick.obs,
            quick.now,
            OFFLINE_AFTER,
            Some(quick.now + OFFLINE_AFTER)
        ),
        None
    );
    // The canary is heard from again, the others are not: the canary's bake ends, and
    // the next wave waits for the threshold, the others' contacts being old.
    sim.now = T0 + 11 * MINUTE;
    assert!(sim.now < settle);
    sim.obs[c1].last_seen = Some(sim.now);
    sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Done, Waiting]);
    // Past the threshold with no word from the others: released, and they are offline.
    sim.now = settle + MINUTE;
    sim.obs[c1].last_seen = Some(sim.now);
    sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Done, Released]);
    assert!(sim.logged("3 offline at release and skipped"));
    // A canary silent past the threshold after the start is judged so.
    let mut silent = Sim::new(canary_then_rest(30), FLEET, false);
    silent.decide();
    silent.poll("c1");
    silent.report("c1", Health::Healthy);
    silent.now += 8 * MINUTE;
    let settle = silent.now + OFFLINE_AFTER;
    silent.now = settle + MINUTE;
    silent.decide_settling(settle);
    assert!(silent.rollout.members[silent.index("c1")].failed);
}

#[test]
fn settling_ends_as_soon_as_every_member_has_been_seen() {
    let mut sim = Sim::new(canary_then_rest(0), FLEET, false);
    let names: Vec<String> = sim
        .rollout
        .members
        .iter()
        .map(|m| m.cluster.clone())
        .collect();
    for name in &names {
        sim.never_seen(name);
    }
    let settle = T0 + OFFLINE_AFTER;
    // Nobody heard from yet: settling, and the view says until when.
    sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Waiting, Waiting]);
    assert_eq!(
        settling_until(&sim.rollout, &sim.obs, sim.now, OFFLINE_AFTER, Some(settle)),
        Some(settle)
    );
    let view = crate::rollout::view::RolloutView::of(
        1,
        &sim.rollout,
        &sim.obs,
        (sim.now, OFFLINE_AFTER, Some(settle)),
        false,
    );
    assert_eq!(
        view.settling_until,
        Some(crate::rollout::view::rfc3339(settle))
    );
    // The waves count them as never seen, the cluster list's word, not as offline.
    let counts = |view: &crate::rollout::view::RolloutView| -> Vec<(usize, usize, usize)> {
        view.waves
            .iter()
            .map(|w| (w.clusters, w.never_seen, w.offline))
            .collect()
    };
    assert_eq!(counts(&view), [(1, 1, 0), (3, 3, 0)]);
    // All but one heard from: still settling.
    sim.now += MINUTE;
    for name in &names[1..] {
        let i = sim.index(name);
        sim.obs[i].last_seen = Some(sim.now);
    }
    sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Waiting, Waiting]);
    // The last one too, long before the threshold: the first wave is released now.
    let i = sim.index(&names[0]);
    sim.obs[i].last_seen = Some(sim.now);
    assert!(sim.now < settle);
    sim.decide_settling(settle);
    assert_eq!(sim.wave_states(), [Released, Waiting]);
    assert_eq!(
        settling_until(&sim.rollout, &sim.obs, sim.now, OFFLINE_AFTER, Some(settle)),
        None
    );
    let view = crate::rollout::view::RolloutView::of(
        1,
        &sim.rollout,
        &sim.obs,
        (sim.now, OFFLINE_AFTER, Some(settle)),
        false,
    );
    assert_eq!(view.settling_until, None);
    assert_eq!(counts(&view), [(1, 0, 0), (3, 0, 0)]);
    // One falls silent past the threshold: offline, as it was seen before.
    sim.now += OFFLINE_AFTER + MINUTE;
    for name in &names[1..] {
        let i = sim.index(name);
        sim.obs[i].last_seen = Some(sim.now);
    }
    let view = crate::rollout::view::RolloutView::of(
        1,
        &sim.rollout,
        &sim.obs,
        (sim.now, OFFLINE_AFTER, Some(settle)),
        false,
    );
    let silent = sim.rollout.wave_members(0).contains(&sim.index(&names[0]));
    let expected = match silent {
        true => [(1, 0, 1), (3, 0, 0)],
        false => [(1, 0, 0), (3, 0, 1)],
    };
    assert_eq!(counts(&view), expected);
}

/// `inSync` per wave: the clusters healthy on the target now, a new cluster's agent
/// that runs it before its wave is released included; and once the rollout ended,
/// also those that baked on it, so its record keeps its counts after its clusters
/// moved on to a later commit.
#[test]
fn in_sync_counts_what_runs_the_target_and_an_ended_rollout_keeps_its_counts() {
    let in_sync = |sim: &Sim| -> Vec<(usize, usize)> {
        crate::rollout::view::RolloutView::of(
            1,
            &sim.rollout,
            &sim.obs,
            (sim.now, OFFLINE_AFTER, None),
            false,
        )
        .waves
        .iter()
        .map(|w| (w.in_sync, w.clusters))
        .collect()
    };
    let mut sim = Sim::new(canary_then_rest(10), FLEET, false);
    sim.decide();
    assert_eq!(sim.wave_states(), [Released, Waiting]);
    // r1's agent runs the target before its wave is released (a new cluster's agent
    // is given it at its first poll): it counts.
    sim.report("r1", Health::Healthy);
    assert_eq!(sim.wave_states(), [Released, Waiting]);
    assert_eq!(in_sync(&sim), [(0, 1), (1, 3)]);
    sim.report("c1", Health::Healthy);
    sim.advance(10);
    assert_eq!(sim.wave_states(), [Done, Released]);
    for cluster in ["r2", "r3"] {
        sim.report(cluster, Health::Healthy);
    }
    assert_eq!(sim.rollout.state, RolloutState::Complete);
    assert_eq!(in_sync(&sim), [(1, 1), (3, 3)]);
    // A later commit: every cluster now reports about another digest. The ended
    // rollout still says what it brought where.
    for cluster in ["c1", "r1", "r2", "r3"] {
        sim.report(cluster, Health::Elsewhere);
    }
    assert_eq!(in_sync(&sim), [(1, 1), (3, 3)]);
}
