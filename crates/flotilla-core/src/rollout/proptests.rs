//! Property tests: random policies, fleets and scripts of reports, silences, polls,
//! time and operator actions; after every step the invariants of a rollout must hold.

use std::time::Duration;

use proptest::prelude::*;

use super::tests::{MINUTE, OFFLINE_AFTER, Sim, T0, policy, wave};
use super::*;
use crate::model::WindowSpec;

#[derive(Clone, Copy, Debug)]
enum Act {
    Minutes(i64),
    Report(usize, Health),
    Poll(usize),
    Silence(usize),
    Pause,
    Resume,
    Promote,
    Abort,
}

fn health() -> impl Strategy<Value = Health> {
    prop_oneof![
        4 => Just(Health::Healthy),
        2 => Just(Health::Progressing),
        1 => Just(Health::Failed),
        1 => Just(Health::Elsewhere),
    ]
}

fn act(members: usize, operator: bool) -> impl Strategy<Value = Act> {
    let common = prop_oneof![
        3 => (1i64..40).prop_map(Act::Minutes),
        6 => (0..members, health()).prop_map(|(m, h)| Act::Report(m, h)),
        2 => (0..members).prop_map(Act::Poll),
        1 => (0..members).prop_map(Act::Silence),
    ];
    if operator {
        prop_oneof![
            12 => common,
            1 => Just(Act::Pause),
            1 => Just(Act::Resume),
            1 => Just(Act::Promote),
            1 => prop_oneof![1 => Just(Act::Abort), 3 => Just(Act::Resume)],
        ]
        .boxed()
    } else {
        common.boxed()
    }
}

fn budget() -> impl Strategy<Value = Budget> {
    prop_oneof![
        (0u32..3).prop_map(Budget::Count),
        (0u32..60).prop_map(Budget::Percent)
    ]
}

fn parallel() -> impl Strategy<Value = Option<Budget>> {
    prop_oneof![
        Just(None),
        (1u32..3).prop_map(|c| Some(Budget::Count(c))),
        (10u32..60).prop_map(|p| Some(Budget::Percent(p))),
    ]
}

#[derive(Clone, Debug)]
struct Scenario {
    policy: Policy,
    members: Vec<(String, usize)>,
    never_seen: Vec<bool>,
    forced: bool,
    acts: Vec<Act>,
}

fn scenario(operator: bool) -> impl Strategy<Value = Scenario> {
    (
        1usize..=4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u64..3,
        any::<bool>(),
    )
        .prop_flat_map(
            move |(waves, wait, rollback, windowed, deadline_hours, forced)| {
                let wave_plans = prop::collection::vec((0u64..40, budget(), parallel()), waves);
                let members = prop::collection::vec((0..waves, prop::bool::weighted(0.15)), 1..14);
                (wave_plans, members).prop_flat_map(move |(plans, members)| {
                    let count = members.len();
                    let mut policy = policy(
                        plans
                            .iter()
                            .enumerate()
                            .map(|(i, (bake, failed, parallel))| {
                                wave(&format!("w{i}"), *bake, *failed, *parallel)
                            })
                            .collect(),
                    );
                    if wait {
                        policy.offline = OfflinePolicy::Wait;
                    }
                    if rollback {
                        policy.on_failure = FailurePolicy::Rollback;
                    }
                    if deadline_hours > 0 {
                        policy.progress_deadline = Some(Duration::from_secs(deadline_hours * 3600));
                    }
                    if windowed {
                        policy.windows = vec![
                            Window::from_spec(&WindowSpec {
                                days: vec![],
                                start: "01:00".into(),
                                end: "02:30".into(),
                                tz: Some("Europe/Berlin".into()),
                            })
                            .expect("window"),
                        ];
                    }
                    let named: Vec<(String, usize)> = members
                        .iter()
                        .enumerate()
                        .map(|(i, (w, _))| (format!("c{i}"), *w))
                        .collect();
                    let never_seen: Vec<bool> = members.iter().map(|(_, n)| *n).collect();
                    prop::collection::vec(act(count, operator), 1..60).prop_map(move |acts| {
                        Scenario {
                            policy: policy.clone(),
                            members: named.clone(),
                            never_seen: never_seen.clone(),
                            forced,
                            acts,
                        }
                    })
                })
            },
        )
}

/// What the invariants need to know about one step.
struct Checked<'a> {
    before: &'a Rollout,
    after: &'a Rollout,
    step: &'a Step,
    observations: &'a [Observation],
    now: Millis,
    action: Option<&'a Act>,
}

fn check_step(c: &Checked<'_>) -> Result<(), TestCaseError> {
    let policy = &c.after.policy;
    // 1. Never back to an older digest unless the policy rolls back or an operator aborts.
    for (index, serve) in &c.step.serve {
        if *serve == Serve::Previous {
            let allowed = policy.on_failure == FailurePolicy::Rollback
                || matches!(c.action, Some(Act::Abort));
            prop_assert!(
                allowed,
                "member {index} sent back without rollback or abort"
            );
        }
    }
    for (before, after) in c.before.members.iter().zip(&c.after.members) {
        if before.serves_target() && !after.serves_target() && !after.left {
            prop_assert!(
                c.step.serve.iter().any(|(_, s)| *s == Serve::Previous),
                "{} stopped being served the new digest without a recorded rollback",
                after.cluster
            );
        }
    }
    let promoted = matches!(c.action, Some(Act::Promote));
    for (w, (before, after)) in c.before.waves.iter().zip(&c.after.waves).enumerate() {
        let released_now = before.state == WaveState::Waiting && after.state != WaveState::Waiting;
        if !released_now || c.after.forced {
            continue;
        }
        // 2. No wave before the previous one baked (unless promoted).
        if !promoted && w > 0 {
            prop_assert!(
                c.after.waves[..w]
                    .iter()
                    .all(|x| x.state == WaveState::Complete),
                "wave {w} released before the earlier ones completed"
            );
        }
        // 3. Nothing released outside a window (unless forced or promoted).
        if !promoted {
            prop_assert!(
                policy.in_window(c.now),
                "wave {w} released outside its window"
            );
        }
    }
    // 4. A forced rollout releases everything at once.
    if c.after.forced
        && c.action.is_none()
        && c.before.waves.iter().all(|w| w.state == WaveState::Waiting)
    {
        prop_assert!(
            c.after.waves.iter().all(|w| w.state != WaveState::Waiting),
            "a forced rollout left a wave waiting"
        );
        prop_assert!(
            c.after
                .members
                .iter()
                .all(|m| m.admitted_at.is_some() || m.left),
            "a forced rollout left a cluster waiting"
        );
    }
    // 5. maxParallel is never exceeded by an admission.
    if !c.after.forced {
        for (w, plan) in policy.waves.iter().enumerate() {
            let Some(budget) = plan.max_parallel else {
                continue;
            };
            let range = c.after.wave_members(w);
            let admitted_now = range.clone().any(|i| {
                c.before.members[i].admitted_at.is_none()
                    && c.after.members[i].admitted_at.is_some()
                    && !c.after.members[i].offline_at_release
            });
            if !admitted_now {
                continue;
            }
            let skip = policy.offline == OfflinePolicy::Skip;
            let busy = range
                .clone()
                .filter(|&i| {
                    let m = &c.after.members[i];
                    m.serves_target()
                        && !(skip && m.offline_at_release)
                        && m.healthy_since.is_none()
                        && m.baked_at.is_none()
                })
                .count();
            let taking_part = range.filter(|&i| !c.after.members[i].left).count();
            prop_assert!(
                busy <= budget.parallel(taking_part),
                "wave {w}: {busy} clusters changing at once, maxParallel {budget}"
            );
        }
    }
    // 6. A cluster that goes silent after taking the new digest counts as failed.
    if c.action.is_none() && c.after.state.is_active() {
        for (w, wave) in c.after.waves.iter().enumerate() {
            if wave.state != WaveState::Released {
                continue;
            }
            for i in c.after.wave_members(w) {
                let m = &c.after.members[i];
                let silent = c.observations[i]
                    .last_seen
                    .is_none_or(|seen| c.now - seen > OFFLINE_AFTER);
                if m.serves_target() && m.fetched && m.baked_at.is_none() && silent {
                    prop_assert!(
                        m.failed,
                        "{} went silent after taking the change",
                        m.cluster
                    );
                }
            }
        }
    }
    Ok(())
}

fn run(scenario: &Scenario) -> Result<Sim, TestCaseError> {
    let members: Vec<(&str, usize)> = scenario
        .members
        .iter()
        .map(|(n, w)| (n.as_str(), *w))
        .collect();
    let mut sim = Sim::new(scenario.policy.clone(), &members, scenario.forced);
    for ((name, _), never) in scenario.members.iter().zip(&scenario.never_seen) {
        if *never {
            sim.never_seen(name);
        }
    }
    let step_and_check = |sim: &mut Sim, act: Option<&Act>| -> Result<(), TestCaseError> {
        let before = sim.rollout.clone();
        let step = match act {
            None => sim.decide(),
            Some(Act::Pause) => sim.rollout.pause("op", sim.now).unwrap_or_default(),
            Some(Act::Resume) => sim.rollout.resume("op", sim.now).unwrap_or_default(),
            Some(Act::Promote) => {
                let obs = sim.obs.clone();
                sim.rollout
                    .promote("op", sim.now, OFFLINE_AFTER, &obs)
                    .unwrap_or_default()
            }
            Some(Act::Abort) => sim.rollout.abort("op", sim.now).unwrap_or_default(),
            Some(other) => panic!("not an action: {other:?}"),
        };
        check_step(&Checked {
            before: &before,
            after: &sim.rollout,
            step: &step,
            observations: &sim.obs,
            now: sim.now,
            action: act,
        })
    };
    step_and_check(&mut sim, None)?;
    for act in &scenario.acts {
        match act {
            Act::Minutes(minutes) => {
                for _ in 0..*minutes {
                    sim.now += MINUTE;
                    for (index, silenced) in sim.silenced.iter().enumerate() {
                        if !silenced {
                            sim.obs[index].last_seen = Some(sim.now);
                        }
                    }
                    step_and_check(&mut sim, None)?;
                }
            }
            Act::Report(m, health) => {
                let name = scenario.members[*m].0.clone();
                let i = sim.index(&name);
                sim.silenced[i] = false;
                sim.obs[i].report = Some(Report {
                    health: *health,
                    at: sim.now,
                });
                sim.obs[i].last_seen = Some(sim.now);
                step_and_check(&mut sim, None)?;
            }
            Act::Poll(m) => {
                let name = scenario.members[*m].0.clone();
                sim.poll(&name);
            }
            Act::Silence(m) => {
                let name = scenario.members[*m].0.clone();
                sim.silence(&name);
            }
            action => {
                step_and_check(&mut sim, Some(action))?;
                step_and_check(&mut sim, None)?;
            }
        }
    }
    Ok(sim)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every invariant, under any script including operator actions.
    #[test]
    fn invariants_hold_under_any_script(scenario in scenario(true)) {
        run(&scenario)?;
    }

    /// Clusters that are offline (never seen) under `offline: skip`, while every other
    /// cluster is healthy, never halt a rollout.
    #[test]
    fn offline_clusters_under_skip_never_halt(
        scenario in scenario(false),
        offline in prop::collection::vec(any::<bool>(), 14),
    ) {
        let mut scenario = scenario;
        scenario.policy.offline = OfflinePolicy::Skip;
        scenario.policy.progress_deadline = None;
        scenario.never_seen = (0..scenario.members.len()).map(|i| offline[i]).collect();
        let count = scenario.members.len();
        // The online clusters report healthy whenever they take part; the offline
        // ones are never heard from.
        scenario.acts = (0..count)
            .filter(|&i| !offline[i])
            .flat_map(|i| [Act::Report(i, Health::Healthy), Act::Minutes(10)])
            .chain([Act::Minutes(40)])
            .collect();
        scenario.acts = scenario.acts.repeat(scenario.policy.waves.len() + 1);
        let sim = run(&scenario)?;
        prop_assert_ne!(sim.rollout.state, RolloutState::Halted, "log: {:#?}", sim.log);
    }

    /// The decision is a function of its inputs: replaying a script gives the same log.
    #[test]
    fn decisions_are_deterministic(scenario in scenario(true)) {
        let first = run(&scenario)?;
        let second = run(&scenario)?;
        prop_assert_eq!(first.log, second.log);
        prop_assert_eq!(first.rollout, second.rollout);
    }
}

#[test]
fn the_window_used_by_the_properties_is_open_part_of_the_day() {
    let w = Window::from_spec(&WindowSpec {
        days: vec![],
        start: "01:00".into(),
        end: "02:30".into(),
        tz: Some("Europe/Berlin".into()),
    })
    .expect("window");
    // T0 is 01:00 in Berlin: open; two hours later: closed.
    assert!(w.contains(T0));
    assert!(!w.contains(T0 + 120 * MINUTE));
}
