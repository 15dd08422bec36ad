//! Render benchmarks on the synthetic fleet (`examples/support/synthetic.rs`).
//!
//! `cargo bench --bench render`. The 10,000-cluster figures in BENCHMARKS.md are
//! whole-process timings of `flotilla validate` on a generated repository; this
//! benchmark follows the same work in-process at 1,000 clusters, fast enough to run
//! often.

#[path = "../examples/support/synthetic.rs"]
mod synthetic;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;

fn snapshot(clusters: usize, workloads: usize, resources: usize) -> FleetSnapshot {
    let files = synthetic::fleet(clusters, workloads, resources);
    FleetSnapshot::from_files(files.0.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

fn bench_render(c: &mut Criterion) {
    let mut group = c.benchmark_group("render");
    group.sample_size(10);
    for clusters in [100, 1_000] {
        let snapshot = snapshot(clusters, 20, 5);
        group.throughput(Throughput::Elements(clusters as u64));
        group.bench_function(format!("{clusters}x20x5"), |b| {
            b.iter(|| {
                let output = render(&snapshot);
                assert!(output.is_clean());
                output.bundles.len()
            })
        });
    }
    group.finish();
}

fn bench_canonical(c: &mut Criterion) {
    let snapshot = snapshot(1, 20, 5);
    let output = render(&snapshot);
    let values: Vec<serde_json::Value> = output
        .bundles
        .values()
        .flat_map(|b| b.resources.iter().map(|r| r.value()))
        .collect();
    let bytes: usize = values
        .iter()
        .map(|v| flotilla_core::bundle::to_canonical_vec(v).len())
        .sum();
    let mut group = c.benchmark_group("canonical");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("100 resources", |b| {
        b.iter(|| {
            values
                .iter()
                .map(|v| flotilla_core::bundle::to_canonical_vec(v).len())
                .sum::<usize>()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_render, bench_canonical);
criterion_main!(benches);
