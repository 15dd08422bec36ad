//! What flotilla's `+` costs a render (template/lists.rs makes every `+` a call that
//! charges fuel for joined lists): CLUSTERS clusters, one workload whose one template
//! writes 20 values, each an addition (`+`) or, to compare with, a subtraction (`-`,
//! minijinja's own instruction). Prints how long the render took.
//!
//! `cargo run -p flotilla-render --release --example template_add -- + 10000` against
//! `… -- - 10000`, timed as whole processes side by side.

/// The allocator of the hub's render process (the `flotilla` binary's).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, render_with};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [op, clusters] = args.as_slice() else {
        panic!("usage: template_add +|- CLUSTERS");
    };
    assert!(op == "+" || op == "-", "the operator is + or -");
    let clusters: usize = clusters.parse().expect("CLUSTERS is a number");
    let mut files = Vec::new();
    for c in 0..clusters {
        files.push((
            format!("clusters/c{c}.yaml"),
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c{c}\n  \
                 labels: {{site: shop}}\nspec:\n  vars:\n    n: {c}\n"
            ),
        ));
    }
    files.push((
        "workloads/w/workload.yaml".to_string(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: w\nspec:\n  \
         namespace: w\n  targets:\n    - clusterSelector: {matchLabels: {site: shop}}\n"
            .to_string(),
    ));
    let mut template =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: numbers\ndata:\n".to_string();
    for j in 0..20 {
        let _ = writeln!(template, "  a{j}: \"{{{{ cluster.vars.n {op} {j} }}}}\"");
    }
    files.push(("workloads/w/manifests/cm.yaml.j2".to_string(), template));
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let options = RenderOptions {
        limits: Limits {
            render_timeout: Duration::from_secs(3600),
            ..Limits::default()
        },
        ..RenderOptions::default()
    };
    let started = Instant::now();
    let output = render_with(&snapshot, &options);
    assert!(output.is_clean(), "{:?}", output.diagnostics.first());
    println!(
        "{clusters} clusters, 20 values with `{op}`: {} bundles in {:.3} s",
        output.bundles.len(),
        started.elapsed().as_secs_f64()
    );
}
