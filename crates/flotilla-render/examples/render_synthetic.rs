//! Renders a synthetic fleet in-process and prints how long it took: a harness for
//! `perf record` (build it with `--profile profiling`, which keeps symbols).
//!
//! `cargo run -p flotilla-render --profile profiling --example render_synthetic --
//! CLUSTERS TEMPLATED_PERCENT [RUNS]` renders CLUSTERS × 20 workloads × 5 resources,
//! TEMPLATED_PERCENT of the manifests per-cluster templates (as `gen_fleet
//! --templated`).

#[path = "../../../examples/support/synthetic.rs"]
mod synthetic;

/// The allocator of the hub's render process (the `flotilla` binary's), so that the
/// render is timed as the hub runs it.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::{Duration, Instant};

use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, render_with};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("numbers: CLUSTERS TEMPLATED_PERCENT [RUNS]")
        })
        .collect();
    let (clusters, percent, runs) = match args.as_slice() {
        [c, p] => (*c, *p, 1),
        [c, p, r] => (*c, *p, *r),
        _ => panic!("usage: render_synthetic CLUSTERS TEMPLATED_PERCENT [RUNS]"),
    };
    let files = synthetic::fleet_templated(clusters, 20, 5, percent);
    let snapshot = FleetSnapshot::from_files(files.0.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let options = RenderOptions {
        limits: Limits {
            render_timeout: Duration::from_secs(3600),
            ..Limits::default()
        },
        ..RenderOptions::default()
    };
    for _ in 0..runs {
        let started = Instant::now();
        let output = render_with(&snapshot, &options);
        assert!(output.is_clean(), "{:?}", output.diagnostics.first());
        println!(
            "{clusters} clusters, {percent}% templated: {} bundles in {:.3} s",
            output.bundles.len(),
            started.elapsed().as_secs_f64()
        );
    }
}
