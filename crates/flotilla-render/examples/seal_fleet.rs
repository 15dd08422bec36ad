//! Secrets sealed per cluster at fleet scale: renders in-process a fleet of N
//! clusters, each with its own agent key (`spec.agentKey`), and one workload of S
//! Secrets (and as many ConfigMaps) for every cluster, with the hub's seed (so every
//! Secret is sealed to its cluster's key), alternately with the same fleet without
//! keys, R times each; prints both medians and their ratio (BENCHMARKS.md). The
//! first sealed render works out every agent's age header (two X25519 operations
//! each); the process keeps them, as the hub's render process does between commits,
//! so the later ones do not: the first is reported on its own, the medians are of
//! the later runs. The process also keeps each sealed Secret for the next render,
//! as the hub's does, so a later render of unchanged Secrets seals none; with
//! `--rotate` every run changes every Secret's value (a password rotated fleet-wide,
//! the most a commit can ask), so every run seals all of them anew.
//!
//!
//! With `--kept DIR` the agents' keys and the headers the first render worked out
//! are kept in `DIR` (as the hub keeps headers in its state folder), and a later
//! run with the same `DIR` starts from them: its first render is that of a new
//! render process of a hub that has rendered this fleet before.
//!
//! With `--only sealed` or `--only plain` the process renders that fleet alone, so
//! that neither render runs in a process holding what the other kept (the sealed
//! Secrets and headers, the allocator's state): run both, one after the other, and
//! divide. Each of them also reports the CPU time of its renders (all threads of
//! the process, from Linux's `/proc/self/task/*/schedstat`), steadier than the
//! time on the clock on a shared machine.
//!
//! With `--since` each render after the first is made as the hub's render process
//! makes the render of a new commit: since the one before (`render_since`), taking
//! the parsed files and what did not change from it.
//!
//! ```text
//! seal_fleet [--clusters N] [--secrets S] [--runs R] [--rotate] [--kept DIR] [--since]
//!            [--only sealed|plain]
//! ```

use std::time::{Duration, Instant};

/// The allocator of the hub's render process (the `flotilla` binary's): a sealed
/// render allocates each cluster's sealed Secrets, and the system allocator's cost
/// for that is not the hub's.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, RenderOutput, render_since, render_with};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

/// The fleet; `generation` is written into every password.
fn fleet(
    clusters: usize,
    secrets: usize,
    keys: Option<&[String]>,
    generation: usize,
) -> FleetSnapshot {
    let mut files: Vec<(String, String)> = Vec::new();
    for i in 0..clusters {
        let key = keys.map_or(String::new(), |k| format!("  agentKey: {}\n", k[i]));
        files.push((
            format!("clusters/site-{i:05}.yaml"),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: site-{i:05}\n  labels: {{kind: site}}\nspec:\n{key}  vars: {{}}\n"
            ),
        ));
    }
    files.push((
        "workloads/pos/workload.yaml".into(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: pos\nspec:\n  namespace: pos\n  targets:\n    - clusterSelector: {{matchLabels: {{kind: site}}}}\n"
        ),
    ));
    for s in 0..secrets {
        files.push((
            format!("workloads/pos/manifests/secret-{s}.yaml"),
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: credentials-{s}\ntype: Opaque\nstringData:\n  username: pos-{s}\n  password: a-long-enough-password-{s}-{generation}-0123456789\n"
            ),
        ));
        files.push((
            format!("workloads/pos/manifests/config-{s}.yaml"),
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{s}\ndata:\n  level: \"{s}\"\n"
            ),
        ));
    }
    FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

/// The CPU time the process's threads have run for (Linux; zero elsewhere).
fn cpu_time() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let nanos: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (clusters, secrets, runs) = (
        arg("--clusters", 10_000),
        arg("--secrets", 5),
        arg("--runs", 6).max(2),
    );
    let kept = args
        .iter()
        .position(|a| a == "--kept")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let generated = || -> Vec<String> {
        (0..clusters)
            .map(|_| age::x25519::Identity::generate().to_public().to_string())
            .collect()
    };
    let keys: Vec<String> = match &kept {
        Some(dir) => {
            std::fs::create_dir_all(dir).expect("the --kept folder");
            let keys_file = dir.join("agent-keys");
            match std::fs::read_to_string(&keys_file) {
                Ok(text) if text.lines().count() == clusters => {
                    text.lines().map(str::to_string).collect()
                }
                _ => {
                    let keys = generated();
                    std::fs::write(&keys_file, keys.join("\n")).expect("keys written");
                    keys
                }
            }
        }
        None => generated(),
    };
    let headers_file = kept.as_ref().map(|dir| dir.join("sealing-headers"));
    if let Some(Ok(file)) = headers_file.as_ref().map(std::fs::read) {
        let offered = flotilla_render::seal::offer_headers(&file);
        eprintln!("offered {offered} kept headers");
    }
    let rotate = args.iter().any(|a| a == "--rotate");
    let options = RenderOptions {
        helm_seed: Some([7; 32]),
        ..RenderOptions::default()
    };
    let since = args.iter().any(|a| a == "--since");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    assert!(
        matches!(only, None | Some("sealed" | "plain")),
        "--only sealed or --only plain"
    );
    let (mut with_keys, mut without) = (Vec::new(), Vec::new());
    let mut cpu = Vec::new();
    let (mut last_sealed, mut last_plain): (Option<RenderOutput>, Option<RenderOutput>) =
        (None, None);
    for run in 0..runs {
        let generation = if rotate { run } else { 0 };
        let sealed = fleet(clusters, secrets, Some(&keys), generation);
        let plain = fleet(clusters, secrets, None, generation);
        for (snapshot, times, last, what) in [
            (&sealed, &mut with_keys, &mut last_sealed, "sealed"),
            (&plain, &mut without, &mut last_plain, "plain"),
        ] {
            if only.is_some_and(|only| only != what) {
                continue;
            }
            let (started, cpu_started) = (Instant::now(), cpu_time());
            let output = match last.as_ref().filter(|_| since) {
                Some(previous) => render_since(previous, snapshot, &options),
                None => render_with(snapshot, &options),
            };
            let took = started.elapsed();
            cpu.push(cpu_time().saturating_sub(cpu_started));
            assert!(
                output.is_clean() || what == "plain",
                "{:?}",
                output.diagnostics.first()
            );
            assert_eq!(output.bundles.len(), clusters);
            eprintln!("run {run}: {what} {took:?}");
            times.push(took);
            if let (Some(path), 0, "sealed") = (&headers_file, run, what) {
                let seed = options.helm_seed.expect("a seed");
                let file = flotilla_render::seal::Sealer::from_hub_seed(&seed).kept_headers();
                std::fs::write(path, file).expect("headers written");
            }
            *last = since.then_some(output);
        }
    }
    if let Some(only) = only {
        let mut times = if only == "sealed" { with_keys } else { without };
        let first = times.remove(0);
        let first_cpu = cpu.remove(0);
        println!(
            "{clusters} clusters x {secrets} Secrets{}, {only} fleet alone: first render {first:?}; \
             later {:?} (median of {}); CPU time: first {first_cpu:?}, later {:?}",
            if rotate {
                ", every Secret changed at every run"
            } else {
                ""
            },
            median(times),
            runs - 1,
            median(cpu),
        );
        return;
    }
    let first = with_keys.remove(0);
    without.remove(0);
    let (a, b) = (median(with_keys), median(without));
    println!(
        "{clusters} clusters x {secrets} Secrets{}: first sealed render {first:?}; later: sealed {a:?}, \
         without keys {b:?} (medians of {}); ratio {:.2} (first: {:.2})",
        if rotate {
            ", every Secret changed at every run"
        } else {
            ""
        },
        runs - 1,
        a.as_secs_f64() / b.as_secs_f64(),
        first.as_secs_f64() / b.as_secs_f64()
    );
}
