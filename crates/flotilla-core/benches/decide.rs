//! The rollout decision at fleet scale: 10,000 clusters under one policy of four waves
//! (canary 100, tenth 900, half 4,000, rest 5,000), the last wave released and
//! changing 10% at a time, every cluster seen. One iteration is what the hub does
//! after a status report: the report's judgement goes into the observations and the
//! rollout is decided again.
//!
//! ```text
//! cargo bench -p flotilla-core --bench decide
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

use flotilla_core::bundle::Digest;
use flotilla_core::rollout::{
    Budget, FailurePolicy, Health, Member, Observation, OfflinePolicy, Policy, Report, Rollout,
    WavePlan, decide,
};

const CLUSTERS: usize = 10_000;
const OFFLINE_AFTER: i64 = 300_000;
const T0: i64 = 1_736_899_200_000;

fn digest(n: usize) -> Digest {
    Digest::parse(&format!("sha256:{n:064x}")).expect("digest")
}

fn wave(name: &str, bake_minutes: u64, parallel: Option<Budget>) -> WavePlan {
    WavePlan {
        name: name.into(),
        bake: Duration::from_secs(bake_minutes * 60),
        max_failed: Budget::Percent(5),
        max_parallel: parallel,
    }
}

/// The rollout after its first three waves completed, with the last one released.
fn fleet() -> (Rollout, Vec<Observation>, i64) {
    let policy = Policy {
        name: "stores".into(),
        file: "rollouts/stores.yaml".into(),
        waves: vec![
            wave("canary", 15, None),
            wave("tenth", 30, None),
            wave("half", 30, Some(Budget::Percent(10))),
            wave("rest", 30, Some(Budget::Percent(10))),
        ],
        offline: OfflinePolicy::Skip,
        on_failure: FailurePolicy::Halt,
        progress_deadline: Some(Duration::from_secs(4 * 3600)),
        windows: Vec::new(),
    };
    let members: Vec<Member> = (0..CLUSTERS)
        .map(|i| {
            let wave = match i {
                0..100 => 0,
                100..1000 => 1,
                1000..5000 => 2,
                _ => 3,
            };
            Member::new(
                format!("store-{i:05}"),
                wave,
                Some(digest(i)),
                digest(CLUSTERS + i),
            )
        })
        .collect();
    let (mut rollout, _) = Rollout::start(policy, "main@sha1:2".into(), false, members, T0);
    let mut observations = vec![Observation::default(); CLUSTERS];
    let mut now = T0;
    // Every cluster is seen each minute; every admitted cluster reports healthy on the
    // new digest; waves bake one after the other.
    while rollout.waves[3].released_at.is_none() {
        for (i, member) in rollout.members.iter().enumerate() {
            observations[i].last_seen = Some(now);
            if member.admitted_at.is_some() {
                observations[i].report = Some(Report {
                    health: Health::Healthy,
                    at: now,
                });
            }
        }
        decide(&mut rollout, &observations, now, OFFLINE_AFTER);
        now += 60_000;
    }
    (rollout, observations, now)
}

fn bench(c: &mut Criterion) {
    let (mut rollout, mut observations, now) = fleet();
    let last_wave = rollout.wave_members(3);
    let mut next = last_wave.start;
    let mut pass = 0u64;
    c.bench_function(
        "decide after a report (10,000 clusters, 4 waves, last wave released)",
        |b| {
            b.iter(|| {
                // The next cluster of the released wave reports: healthy on one pass over
                // the wave, still progressing on the next, so the decision has work to do
                // (bakes start and stop, clusters are admitted) and the wave never ends.
                let health = if pass.is_multiple_of(2) {
                    Health::Healthy
                } else {
                    Health::Progressing
                };
                observations[next].report = Some(Report { health, at: now });
                observations[next].last_seen = Some(now);
                next += 1;
                if next == last_wave.end {
                    next = last_wave.start;
                    pass += 1;
                }
                black_box(decide(&mut rollout, &observations, now, OFFLINE_AFTER))
            })
        },
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
