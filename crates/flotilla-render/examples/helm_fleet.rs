//! Helm at fleet scale: renders fleets of Helm workloads in-process and prints how
//! long each render took (and the process's peak RSS), for BENCHMARKS.md and as a
//! harness for `perf record` (build it with `--profile profiling`, which keeps
//! symbols).
//!
//! Charts are read at run time from a chart archive (`source.tar.gz` of the corpus in
//! `../shared/testdata/helm-charts/<id>/`, or any `helm package`/`helm pull` `.tgz`)
//! into the fleet snapshot in memory: nothing of a chart is kept in this repository.
//!
//! ```text
//! helm_fleet one CHART.tgz [--clusters N] [--runs R] [--per-cluster overlay|j2]
//!     [--values JSON] [--release NAME] [--namespace NS] [--packed] [--digests-only]
//!     [--without-stencils] [--write DIR]
//! helm_fleet shared CHART.tgz[=JSON]... [--clusters N] [--groups G] [--copies K]
//!     [--runs R] [--digests-only] [--write DIR]
//! ```
//!
//! `one`: one chart, one workload targeting N clusters, every cluster with its own
//! values: `--values` (a JSON object; default Bitnami's `commonLabels` and
//! `commonAnnotations`) with `{cluster}` replaced by the cluster's name, set by an
//! overlay per cluster (`helmValues`, `--per-cluster overlay`, the default) or by a
//! values file `site.yaml.j2` that writes `{{ cluster.name }}` (`--per-cluster j2`).
//! `--packed` puts the chart in the fleet as a packed `.tgz` (else unpacked into a
//! folder). `--without-stencils` renders every release on its own, never filled in
//! from a stencil (the render's default), for a side-by-side comparison.
//!
//! `shared`: K workloads of each chart (default 4; 5 charts make 20 workloads), every
//! one targeting all N clusters, with values set per group (G region groups, default
//! 10) by an overlay per group and chart: the chart's JSON (default as for `one`) with
//! `{group}` replaced by the group's name. It renders that fleet once, writes each
//! workload's resources of each group as plain manifests (a plain workload per
//! workload and group, targeting the group), checks that both fleets give every
//! cluster the same bundle digest, then renders the Helm fleet and the plain fleet
//! alternately, R times each, and prints both medians and their ratio.
//!
//! `--write DIR` also writes the (Helm) fleet to DIR (for `flotilla validate --repo`).
//! `--digests-only` renders as `flotilla validate` does (bundles keep their digest
//! only); the default keeps every bundle, as the hub does.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
/// The allocator of the hub's render process (the `flotilla` binary's), so that the
/// render is timed as the hub runs it.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::{Duration, Instant};

use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, RenderOutput, render_with};
use std::sync::atomic::{AtomicBool, Ordering};

/// Bitnami's charts take labels and annotations for every resource in these.
const DEFAULT_VALUES: &str = r#"{"commonLabels": {"example.com/site": "{cluster}"}, "commonAnnotations": {"example.com/site": "{cluster}"}}"#;

const REGIONS_DEFAULT: usize = 10;

const USAGE: &str = "usage: helm_fleet one CHART.tgz [--clusters N] [--runs R] [--per-cluster overlay|j2] [--values JSON] [--release NAME] [--namespace NS] [--packed] [--digests-only] [--without-stencils] [--write DIR]\n       helm_fleet shared CHART.tgz[=JSON]... [--clusters N] [--groups G] [--copies K] [--runs R] [--digests-only] [--write DIR]";

struct Args {
    command: String,
    charts: Vec<(PathBuf, Option<String>)>,
    clusters: usize,
    runs: usize,
    groups: usize,
    copies: usize,
    per_cluster: String,
    values: String,
    release: Option<String>,
    namespace: Option<String>,
    packed: bool,
    digests_only: bool,
    write: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        command: it.next().ok_or("no command")?,
        charts: Vec::new(),
        clusters: 10_000,
        runs: 1,
        groups: REGIONS_DEFAULT,
        copies: 4,
        per_cluster: "overlay".to_string(),
        values: DEFAULT_VALUES.to_string(),
        release: None,
        namespace: None,
        packed: false,
        digests_only: false,
        write: None,
    };
    let number = |value: Option<String>, flag: &str| -> Result<usize, String> {
        value
            .ok_or(format!("{flag} needs a number"))?
            .parse()
            .map_err(|_| format!("{flag} needs a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--clusters" => args.clusters = number(it.next(), "--clusters")?,
            "--runs" => args.runs = number(it.next(), "--runs")?,
            "--groups" => args.groups = number(it.next(), "--groups")?,
            "--copies" => args.copies = number(it.next(), "--copies")?,
            "--per-cluster" => args.per_cluster = it.next().ok_or("--per-cluster needs a mode")?,
            "--values" => args.values = it.next().ok_or("--values needs JSON")?,
            "--release" => args.release = Some(it.next().ok_or("--release needs a name")?),
            "--namespace" => args.namespace = Some(it.next().ok_or("--namespace needs a name")?),
            "--packed" => args.packed = true,
            "--digests-only" => args.digests_only = true,
            "--without-stencils" => WITHOUT_STENCILS.store(true, Ordering::Relaxed),
            "--write" => args.write = Some(it.next().ok_or("--write needs a folder")?.into()),
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            chart => match chart.split_once('=') {
                Some((path, json)) => args.charts.push((path.into(), Some(json.to_string()))),
                None => args.charts.push((chart.into(), None)),
            },
        }
    }
    if args.charts.is_empty() {
        return Err("name a chart archive".to_string());
    }
    if !matches!(args.per_cluster.as_str(), "overlay" | "j2") {
        return Err("--per-cluster is overlay or j2".to_string());
    }
    Ok(args)
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("helm_fleet: {message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    match args.command.as_str() {
        "one" => one(&args),
        "shared" => shared(&args),
        other => {
            eprintln!("helm_fleet: unknown command {other}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

/// A chart archive read into memory: its name (the archive's top folder) and its
/// files below that folder.
struct ChartFiles {
    name: String,
    archive: Vec<u8>,
    files: Vec<(String, Vec<u8>)>,
}

fn read_chart(path: &Path) -> ChartFiles {
    let archive =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive.as_slice()));
    let mut name = String::new();
    let mut files = Vec::new();
    for entry in tar.entries().expect("a tar.gz archive") {
        let mut entry = entry.expect("a tar entry");
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let entry_path = entry.path().expect("a path").to_string_lossy().into_owned();
        let Some((top, inside)) = entry_path.split_once('/') else {
            continue;
        };
        if name.is_empty() {
            name = top.to_string();
        }
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).expect("an entry's bytes");
        files.push((inside.to_string(), bytes));
    }
    assert!(!name.is_empty(), "{} holds no chart", path.display());
    ChartFiles {
        name,
        archive,
        files,
    }
}

/// Puts a chart into the snapshot: unpacked into `charts/NAME/` (text files as
/// files, packed subcharts as binaries), or packed as `charts/NAME.tgz`. Returns
/// the chart's path relative to a workload's folder.
fn add_chart(snapshot: &mut FleetSnapshot, chart: &ChartFiles, packed: bool) -> String {
    if packed {
        let path = format!("charts/{}.tgz", chart.name);
        snapshot
            .binaries
            .insert(path, Arc::from(chart.archive.as_slice()));
        return format!("../../charts/{}.tgz", chart.name);
    }
    for (inside, bytes) in &chart.files {
        let path = format!("charts/{}/{inside}", chart.name);
        if inside.ends_with(".tgz") {
            snapshot.binaries.insert(path, Arc::from(bytes.as_slice()));
        } else if let Ok(text) = std::str::from_utf8(bytes) {
            snapshot.files.insert(path, Arc::from(text));
        } else {
            snapshot
                .skipped
                .insert(path, "not text (helm_fleet)".to_string());
        }
    }
    format!("../../charts/{}", chart.name)
}

fn cluster_name(index: usize) -> String {
    format!("edge-{index:05}")
}

fn region(index: usize, regions: usize) -> String {
    format!("r{:02}", index % regions)
}

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

/// N clusters in `regions` region groups.
fn clusters_and_groups(files: &mut BTreeMap<String, String>, clusters: usize, regions: usize) {
    for c in 0..clusters {
        let name = cluster_name(c);
        files.insert(
            format!("clusters/{name}.yaml"),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    region: {}\nspec:\n  vars:\n    site: \"{c}\"\n",
                region(c, regions)
            ),
        );
    }
    for r in 0..regions {
        let region = region(r, regions);
        files.insert(
            format!("groups/{region}.yaml"),
            format!(
                "{HEADER}kind: Group\nmetadata:\n  name: {region}\nspec:\n  selector:\n    matchLabels:\n      region: {region}\n"
            ),
        );
    }
}

fn snapshot_of(files: BTreeMap<String, String>) -> FleetSnapshot {
    let mut snapshot = FleetSnapshot::from_files(std::iter::empty());
    snapshot.files = files
        .into_iter()
        .map(|(path, text)| (path, Arc::from(text)))
        .collect();
    snapshot
}

fn options(digests_only: bool) -> RenderOptions<'static> {
    RenderOptions {
        limits: Limits {
            render_timeout: Duration::from_secs(3600),
            ..Limits::default()
        },
        digests_only,
        helm_without_stencils: WITHOUT_STENCILS.load(Ordering::Relaxed),
        ..RenderOptions::default()
    }
}

/// `--without-stencils`: every release rendered on its own.
static WITHOUT_STENCILS: AtomicBool = AtomicBool::new(false);

/// The process's peak resident set so far (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn render_timed(snapshot: &FleetSnapshot, digests_only: bool) -> (RenderOutput, f64) {
    let started = Instant::now();
    let output = render_with(snapshot, &options(digests_only));
    let seconds = started.elapsed().as_secs_f64();
    if let Some(error) = output.errors().next() {
        panic!("the fleet did not render: {error}");
    }
    (output, seconds)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn resources(output: &RenderOutput) -> usize {
    output.bundles.values().map(|b| b.resources.len()).sum()
}

fn write_fleet(snapshot: &FleetSnapshot, out: &Path) {
    let files = snapshot
        .files
        .iter()
        .map(|(p, t)| (p, t.as_bytes()))
        .chain(snapshot.binaries.iter().map(|(p, b)| (p, &b[..])));
    for (path, bytes) in files {
        let path = out.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("a folder");
        }
        std::fs::write(&path, bytes).expect("a file written");
    }
    eprintln!("wrote the fleet to {}", out.display());
}

/// One chart, one workload, N clusters, values of its own for every cluster.
fn one(args: &Args) {
    let started = Instant::now();
    let chart = read_chart(&args.charts[0].0);
    let release = args.release.clone().unwrap_or_else(|| chart.name.clone());
    let namespace = args.namespace.clone().unwrap_or_else(|| release.clone());
    let mut files = BTreeMap::new();
    clusters_and_groups(&mut files, args.clusters, REGIONS_DEFAULT);
    let mut snapshot = FleetSnapshot::default();
    let chart_path = add_chart(&mut snapshot, &chart, args.packed);
    let values_files = if args.per_cluster == "j2" {
        files.insert(
            format!("workloads/{release}/site.yaml.j2"),
            args.values.replace("{cluster}", "{{ cluster.name }}") + "\n",
        );
        "\n    valuesFiles: [site.yaml.j2]"
    } else {
        for c in 0..args.clusters {
            let name = cluster_name(c);
            files.insert(
                format!("overlays/sites/{name}.yaml"),
                format!(
                    "{HEADER}kind: Overlay\nmetadata:\n  name: site-{name}\nspec:\n  clusters: [{name}]\n  workloads: [{release}]\n  helmValues: {}\n",
                    args.values.replace("{cluster}", &name)
                ),
            );
        }
        ""
    };
    files.insert(
        format!("workloads/{release}/workload.yaml"),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: {release}\nspec:\n  namespace: {namespace}\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: {chart_path}{values_files}\n"
        ),
    );
    let mut fleet = snapshot_of(files);
    fleet.files.append(&mut snapshot.files);
    fleet.binaries = snapshot.binaries;
    fleet.skipped = snapshot.skipped;
    if let Some(out) = &args.write {
        write_fleet(&fleet, out);
    }
    println!(
        "chart {} ({} files{}), {} clusters, values per cluster by {}, snapshot built in {:.3} s",
        chart.name,
        chart.files.len(),
        if args.packed { ", packed" } else { "" },
        args.clusters,
        args.per_cluster,
        started.elapsed().as_secs_f64()
    );
    let mut times = Vec::new();
    for run in 0..args.runs {
        let (output, seconds) = render_timed(&fleet, args.digests_only);
        if run == 0 {
            for warning in output.warnings().take(5) {
                eprintln!("warning: {warning}");
            }
        }
        times.push(seconds);
        println!(
            "run {}: {} bundles ({} releases from stencils), {} resources in {seconds:.3} s ({:.1} µs a release), peak RSS {:.0} MiB",
            run + 1,
            output.bundles.len(),
            output.helm_stencil_releases,
            resources(&output),
            seconds * 1e6 / args.clusters as f64,
            peak_rss_mib()
        );
    }
    let median = median(&times);
    println!(
        "median of {}: {median:.3} s, {:.1} µs a release; peak RSS {:.0} MiB",
        times.len(),
        median * 1e6 / args.clusters as f64,
        peak_rss_mib()
    );
}

/// The charts' values for a group: each chart's JSON with `{group}` (and
/// `{cluster}`, as in `one`) replaced by the group's name.
fn group_values(json: &str, group: &str) -> String {
    json.replace("{group}", group).replace("{cluster}", group)
}

/// K workloads of each chart, values per group; then the same fleet as plain
/// manifests; both rendered alternately.
fn shared(args: &Args) {
    let charts: Vec<(ChartFiles, String)> = args
        .charts
        .iter()
        .map(|(path, json)| {
            (
                read_chart(path),
                json.clone().unwrap_or_else(|| DEFAULT_VALUES.to_string()),
            )
        })
        .collect();
    let mut files = BTreeMap::new();
    clusters_and_groups(&mut files, args.clusters, args.groups);
    let mut chart_snapshot = FleetSnapshot::default();
    // The Helm workloads: (name, namespace).
    let mut workloads: Vec<(String, String)> = Vec::new();
    for (chart, json) in &charts {
        let chart_path = add_chart(&mut chart_snapshot, chart, false);
        let names: Vec<String> = (0..args.copies)
            .map(|k| format!("{}-{k}", chart.name))
            .collect();
        for name in &names {
            files.insert(
                format!("workloads/{name}/workload.yaml"),
                format!(
                    "{HEADER}kind: Workload\nmetadata:\n  name: {name}\nspec:\n  namespace: {name}\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: {chart_path}\n"
                ),
            );
            workloads.push((name.clone(), name.clone()));
        }
        for r in 0..args.groups {
            let group = region(r, args.groups);
            files.insert(
                format!("overlays/groups/{}-{group}.yaml", chart.name),
                format!(
                    "{HEADER}kind: Overlay\nmetadata:\n  name: {}-{group}\nspec:\n  groups: [{group}]\n  workloads: [{}]\n  helmValues: {}\n",
                    chart.name,
                    names.join(", "),
                    group_values(json, &group)
                ),
            );
        }
    }
    let mut helm = snapshot_of(files.clone());
    helm.files.append(&mut chart_snapshot.files);
    helm.binaries = chart_snapshot.binaries;
    helm.skipped = chart_snapshot.skipped;
    if let Some(out) = &args.write {
        write_fleet(&helm, out);
    }
    println!(
        "{} charts × {} workloads = {} Helm workloads, {} clusters in {} groups, values per group",
        charts.len(),
        args.copies,
        workloads.len(),
        args.clusters,
        args.groups
    );

    // The plain fleet: for each workload and group, the resources the Helm fleet
    // gave the group's first cluster, as manifests of a workload targeting the group.
    let (output, seconds) = render_timed(&helm, false);
    println!(
        "helm fleet, first render: {} bundles, {} resources in {seconds:.3} s",
        output.bundles.len(),
        resources(&output)
    );
    let mut plain_files: BTreeMap<String, String> = files
        .into_iter()
        .filter(|(path, _)| path.starts_with("clusters/") || path.starts_with("groups/"))
        .collect();
    let mut manifest_bytes = 0;
    for r in 0..args.groups.min(args.clusters) {
        let group = region(r, args.groups);
        let cluster = cluster_name(r);
        let bundle = &output.bundles[&cluster];
        let provenance = &output.provenance.clusters[&cluster];
        let inputs = &output.provenance.inputs.clusters[&cluster];
        for (name, namespace) in &workloads {
            let plain = format!("{name}-{group}");
            plain_files.insert(
                format!("workloads/{plain}/workload.yaml"),
                format!(
                    "{HEADER}kind: Workload\nmetadata:\n  name: {plain}\nspec:\n  namespace: {namespace}\n  targets:\n    - group: {group}\n"
                ),
            );
            let index = inputs
                .workloads
                .iter()
                .position(|(w, _)| &**w == name.as_str())
                .expect("the workload targets the cluster") as u32;
            let mine = bundle
                .resources
                .iter()
                .zip(provenance.resource_workloads.iter())
                .filter(|(_, w)| **w == index);
            for (i, (resource, _)) in mine.enumerate() {
                let yaml = serde_saphyr::to_string(&resource.value()).expect("YAML");
                manifest_bytes += yaml.len();
                plain_files.insert(format!("workloads/{plain}/manifests/r{i:03}.yaml"), yaml);
            }
        }
    }
    let plain = snapshot_of(plain_files);
    println!(
        "plain fleet: {} workloads ({} per group), {} manifest files, {:.1} MB of manifests",
        workloads.len() * args.groups,
        workloads.len(),
        plain
            .files
            .keys()
            .filter(|p| p.contains("/manifests/"))
            .count(),
        manifest_bytes as f64 / 1e6
    );
    let (plain_output, _) = render_timed(&plain, false);
    let differing = output
        .bundles
        .iter()
        .filter(|(cluster, bundle)| {
            plain_output
                .bundles
                .get(*cluster)
                .is_none_or(|other| other.digest != bundle.digest)
        })
        .count();
    assert_eq!(
        plain_output.bundles.len(),
        output.bundles.len(),
        "both fleets render every cluster"
    );
    assert_eq!(
        differing, 0,
        "the plain fleet gives {differing} clusters another bundle"
    );
    println!(
        "both fleets give all {} clusters the same bundle digest",
        output.bundles.len()
    );
    drop((output, plain_output));

    let (mut helm_times, mut plain_times) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        let (_, a) = render_timed(&helm, args.digests_only);
        let (_, b) = render_timed(&plain, args.digests_only);
        println!(
            "run {}: helm {a:.3} s, plain {b:.3} s, ratio {:.2}",
            run + 1,
            a / b
        );
        helm_times.push(a);
        plain_times.push(b);
    }
    let ratios: Vec<f64> = helm_times
        .iter()
        .zip(&plain_times)
        .map(|(a, b)| a / b)
        .collect();
    println!(
        "median of {}: helm {:.3} s, plain {:.3} s, ratio of medians {:.2}, median ratio {:.2}; peak RSS {:.0} MiB",
        args.runs,
        median(&helm_times),
        median(&plain_times),
        median(&helm_times) / median(&plain_times),
        median(&ratios),
        peak_rss_mib()
    );
}
