//! The web page's fleet page at 10,000 clusters, built as the `/ui/` handler builds
//! it: every cluster's line judged from what the hub holds in memory, the counts and
//! one page of the cluster list picked from them, then the page rendered. Also the
//! whole fleet summary of `GET /v1/fleet`, for comparison. Prints the page's size;
//! BENCHMARKS.md has the figures.
//!
//! `cargo bench -p flotilla-hub --bench ui_page`

use std::collections::HashMap;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flotilla_core::bundle::Digest;
use flotilla_core::status::{ResourceState, ResourceStatus, StatusReport};
use flotilla_hub::fleet::{Desired, FleetSummary, Line, NO_LABELS, RenderStatus, lines};
use flotilla_hub::store::StoredStatus;
use flotilla_hub::ui::page::{FleetModel, FleetQuery, Visitor, fleet_page};

fn visitor() -> Visitor {
    Visitor {
        csrf: "0".repeat(64),
        token: "0".repeat(12),
        role: "admin".into(),
        steers: true,
        reads_bundles: true,
    }
}

const CLUSTERS: usize = 10_000;
const NOW_MS: i64 = 1_736_899_200_000;

struct Fleet {
    names: Vec<String>,
    digests: Vec<Digest>,
    groups: Vec<Vec<String>>,
    statuses: HashMap<String, StoredStatus>,
}

fn digest(i: usize) -> Digest {
    Digest::parse(&format!("sha256:{i:064x}")).expect("digest")
}

/// 10,000 stores in 20 regions: most in sync, some failed, offline, pending, never seen.
fn fleet() -> Fleet {
    let names: Vec<String> = (0..CLUSTERS).map(|i| format!("store-{i:05}")).collect();
    let digests: Vec<Digest> = (0..CLUSTERS).map(|i| digest(i % 50)).collect();
    let groups = (0..CLUSTERS)
        .map(|i| {
            vec![
                format!("region-{:02}", i % 20),
                if i % 100 == 0 {
                    "canary".into()
                } else {
                    "stable".into()
                },
            ]
        })
        .collect();
    let mut statuses = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        if i % 97 == 0 {
            continue; // never seen
        }
        let applied = if i % 13 == 0 {
            digest(999)
        } else {
            digests[i].clone()
        };
        let failed = i % 41 == 0;
        let received_at_ms = if i % 53 == 0 {
            NOW_MS - 3_600_000
        } else {
            NOW_MS - 20_000
        };
        statuses.insert(
            name.clone(),
            StoredStatus {
                cluster: name.clone(),
                report: StatusReport {
                    applied: Some(applied.clone()),
                    attempted: Some(digests[i].clone()),
                    resources: if failed {
                        vec![ResourceStatus {
                            key: std::sync::Arc::new(flotilla_core::bundle::ResourceKey::new(
                                "apps",
                                "Deployment",
                                "pos",
                                "api",
                            )),
                            state: ResourceState::Failed,
                            message: "ImagePullBackOff: image pos/api:2.4.1 not found".into(),
                        }]
                    } else {
                        vec![]
                    },
                    message: "applied 42 resources".into(),
                    agent_version: "0.1.0".into(),
                    drift: Vec::new(),
                    features: Vec::new(),
                },
                received_at_ms,
            },
        );
    }
    Fleet {
        names,
        digests,
        groups,
        statuses,
    }
}

fn render_status() -> RenderStatus {
    RenderStatus {
        served_revision: Some("main@sha1:0123456789abcdef0123456789abcdef01234567".into()),
        attempted_revision: Some("main@sha1:0123456789abcdef0123456789abcdef01234567".into()),
        ..RenderStatus::default()
    }
}

/// Every cluster's line, as `Shared::with_fleet` makes them.
fn with_lines<R>(fleet: &Fleet, f: impl FnOnce(&[Line<'_>]) -> R) -> R {
    let lines = lines(
        fleet.names.iter().enumerate().map(|(i, name)| Desired {
            name,
            digest: &fleet.digests[i],
            revision: "main@sha1:0123456789abcdef0123456789abcdef01234567",
            hold: false,
            seen_ms: None,
            served_since_ms: Some(NOW_MS - 600_000 - i as i64 * 1_000),
            lacking: 0,
            latest: Some(&fleet.digests[i]),
            policy: Some("stores"),
            wave: Some(if i % 100 == 0 { "canary" } else { "rest" }),
            paused: false,
            groups: &fleet.groups[i],
            labels: &NO_LABELS,
        }),
        &fleet.statuses,
        NOW_MS,
        Duration::from_secs(300),
    );
    f(&lines)
}

fn page(fleet: &Fleet, query: &FleetQuery) -> String {
    let model = with_lines(fleet, |lines| FleetModel::new(lines, query, NOW_MS, None));
    fleet_page(&model, &render_status(), &[], query, &visitor()).expect("page")
}

fn summary(fleet: &Fleet) -> FleetSummary {
    with_lines(fleet, |lines| {
        FleetSummary::of(lines, &render_status(), NOW_MS)
    })
}

fn bench(c: &mut Criterion) {
    let fleet = fleet();
    let all = FleetQuery::default();
    let failed = FleetQuery {
        state: "failed".into(),
        ..FleetQuery::default()
    };
    let last = FleetQuery {
        page: Some(100),
        ..FleetQuery::default()
    };
    for (what, query) in [
        ("first page", &all),
        ("failed", &failed),
        ("page 100", &last),
    ] {
        let html = page(&fleet, query);
        println!(
            "fleet page at {CLUSTERS} clusters, {what}: {} bytes",
            html.len()
        );
    }
    let mut group = c.benchmark_group("ui");
    group.bench_function("fleet page, 10,000 clusters", |b| {
        b.iter(|| page(&fleet, &all))
    });
    group.bench_function("fleet page, 10,000 clusters, state=failed", |b| {
        b.iter(|| page(&fleet, &failed))
    });
    group.bench_function("fleet summary of GET /v1/fleet, 10,000 clusters", |b| {
        b.iter(|| summary(&fleet))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
