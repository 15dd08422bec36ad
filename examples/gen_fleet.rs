//! Generates a synthetic fleet repository for benchmarks.
//!
//! ```text
//! cargo run --release --example gen_fleet -- --clusters 10000 --workloads 20 --resources 5 OUT
//!     [--git] [--kustomize K]
//! ```
//!
//! Clusters spread over 10 regions with 5% canaries; one group per region and per
//! tier; workloads of `R` resources each (Deployments, Services, ConfigMaps), one in
//! four with a template that uses cluster variables; overlays: an image mirror per
//! region, a patch per tier, and a cluster-specific overlay for 1% of clusters.
//! `--git` makes OUT a Git repository with one commit. `--kustomize K` also writes
//! `OUT-kustomize/`, a kustomize layout equivalent for the first K clusters (bases
//! per workload, one overlay per cluster) to compare against `kubectl kustomize`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Args {
    clusters: usize,
    workloads: usize,
    resources: usize,
    out: PathBuf,
    git: bool,
    kustomize: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        clusters: 100,
        workloads: 20,
        resources: 5,
        out: PathBuf::new(),
        git: false,
        kustomize: 0,
    };
    let mut it = std::env::args().skip(1);
    let number = |value: Option<String>, flag: &str| -> Result<usize, String> {
        value
            .ok_or(format!("{flag} needs a number"))?
            .parse()
            .map_err(|_| format!("{flag} needs a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--clusters" => args.clusters = number(it.next(), "--clusters")?,
            "--workloads" => args.workloads = number(it.next(), "--workloads")?,
            "--resources" => args.resources = number(it.next(), "--resources")?,
            "--kustomize" => args.kustomize = number(it.next(), "--kustomize")?,
            "--git" => args.git = true,
            "-h" | "--help" => return Err(String::new()),
            other if !other.starts_with('-') => args.out = PathBuf::from(other),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if args.out.as_os_str().is_empty() {
        return Err("missing OUT folder".into());
    }
    Ok(args)
}

const REGIONS: usize = 10;

fn region(index: usize) -> String {
    format!("r{:02}", index % REGIONS)
}

fn tier(index: usize) -> &'static str {
    if index.is_multiple_of(20) { "canary" } else { "stable" }
}

fn cluster_name(index: usize) -> String {
    format!("edge-{index:05}")
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create folder");
    }
    std::fs::write(path, text).expect("write file");
}

fn deployment(workload: usize, index: usize) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: w{workload:02}-app{index}
  labels:
    app: w{workload:02}-app{index}
    tier: backend
spec:
  replicas: 2
  selector:
    matchLabels:
      app: w{workload:02}-app{index}
  template:
    metadata:
      labels:
        app: w{workload:02}-app{index}
    spec:
      containers:
        - name: main
          image: registry.example.com/team/w{workload:02}-app:1.{index}.0
          ports:
            - containerPort: 8080
          env:
            - name: LOG_LEVEL
              value: info
            - name: FEATURE_FLAGS
              value: "a,b,c"
          resources:
            requests:
              cpu: 50m
              memory: 64Mi
"#
    )
}

fn service(workload: usize, index: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: w{workload:02}-svc{index}
  labels:
    app: w{workload:02}-app{index}
spec:
  selector:
    app: w{workload:02}-app{index}
  ports:
    - port: 80
      targetPort: 8080
"#
    )
}

fn config_map(workload: usize, index: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: w{workload:02}-config{index}
data:
  settings.yaml: |
    cache: 256
    upstream: https://api.example.com/w{workload:02}
    retries: 3
"#
    )
}

fn resource(workload: usize, index: usize) -> String {
    match index % 3 {
        0 => deployment(workload, index),
        1 => service(workload, index),
        _ => config_map(workload, index),
    }
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!(
                "{message}\nusage: gen_fleet --clusters N --workloads W --resources R OUT [--git] [--kustomize K]"
            );
            std::process::exit(2);
        }
    };
    let out = &args.out;
    if out.exists() {
        std::fs::remove_dir_all(out).expect("remove old OUT");
    }
    let header = |kind: &str| format!("apiVersion: flotilla.dev/v1alpha1\nkind: {kind}\n");
    for c in 0..args.clusters {
        let name = cluster_name(c);
        write(
            &out.join(format!("clusters/{name}.yaml")),
            &format!(
                "{}metadata:\n  name: {name}\n  labels:\n    region: {}\n    tier: {}\nspec:\n  vars:\n    site: \"{c}\"\n",
                header("Cluster"),
                region(c),
                tier(c)
            ),
        );
    }
    for r in 0..REGIONS {
        let region = region(r);
        write(
            &out.join(format!("groups/{region}.yaml")),
            &format!(
                "{}metadata:\n  name: {region}\nspec:\n  selector:\n    matchLabels:\n      region: {region}\n  vars:\n    mirror: mirror.{region}.example.com\n",
                header("Group")
            ),
        );
        write(
            &out.join(format!("overlays/regions/{region}.yaml")),
            &format!(
                "{}metadata:\n  name: mirror-{region}\nspec:\n  groups: [{region}]\n  priority: 100\n  images:\n{}",
                header("Overlay"),
                (0..args.workloads)
                    .map(|w| format!("    - name: registry.example.com/team/w{w:02}-app\n      newName: mirror.{region}.example.com/team/w{w:02}-app\n"))
                    .collect::<String>()
            ),
        );
    }
    for tier in ["canary", "stable"] {
        write(
            &out.join(format!("groups/{tier}.yaml")),
            &format!(
                "{}metadata:\n  name: {tier}\nspec:\n  selector:\n    matchLabels:\n      tier: {tier}\n",
                header("Group")
            ),
        );
        let replicas = if tier == "canary" { 1 } else { 3 };
        write(
            &out.join(format!("overlays/tiers/{tier}.yaml")),
            &format!(
                "{}metadata:\n  name: tier-{tier}\nspec:\n  groups: [{tier}]\n  priority: 10\n  labels:\n    example.com/tier: {tier}\n  patches:\n    - target: {{kind: Deployment}}\n      ops:\n        - {{op: replace, path: /spec/replicas, value: {replicas}}}\n",
                header("Overlay")
            ),
        );
    }
    for c in (0..args.clusters).step_by(100) {
        let name = cluster_name(c);
        write(
            &out.join(format!("overlays/sites/{name}.yaml")),
            &format!(
                "{}metadata:\n  name: site-{name}\nspec:\n  clusters: [{name}]\n  priority: 20\n  patches:\n    - target: {{kind: ConfigMap}}\n      merge:\n        data:\n          site-override: \"true\"\n",
                header("Overlay")
            ),
        );
    }
    for w in 0..args.workloads {
        let dir = out.join(format!("workloads/w{w:02}"));
        write(
            &dir.join("workload.yaml"),
            &format!(
                "{}metadata:\n  name: w{w:02}\nspec:\n  namespace: ns-w{w:02}\n  targets:\n    - clusterSelector: {{}}\n  vars:\n    cacheSize: 256\n",
                header("Workload")
            ),
        );
        let templated = w.is_multiple_of(4);
        for r in 0..args.resources {
            if templated && r == args.resources - 1 {
                write(
                    &dir.join(format!("manifests/r{r}.yaml.j2")),
                    &format!(
                        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w{w:02}-site\ndata:\n  site: \"{{{{ cluster.vars.site }}}}\"\n  cluster: {{{{ cluster.name }}}}\n  mirror: {{{{ vars.mirror }}}}\n  cache: \"{{{{ vars.cacheSize }}}}\"\n"
                    ),
                );
            } else {
                write(&dir.join(format!("manifests/r{r}.yaml")), &resource(w, r));
            }
        }
    }
    if args.kustomize > 0 {
        write_kustomize(&args);
    }
    if args.git {
        let git = |arguments: &[&str]| {
            let status = Command::new("git")
                .args(arguments)
                .current_dir(out)
                .env("GIT_AUTHOR_NAME", "flotilla-bench")
                .env("GIT_AUTHOR_EMAIL", "bench@flotilla.invalid")
                .env("GIT_COMMITTER_NAME", "flotilla-bench")
                .env("GIT_COMMITTER_EMAIL", "bench@flotilla.invalid")
                .status()
                .expect("run git");
            assert!(status.success(), "git {arguments:?} failed");
        };
        git(&["init", "-q", "-b", "main"]);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "generated fleet"]);
    }
    eprintln!(
        "wrote {} clusters × {} workloads × {} resources to {}",
        args.clusters,
        args.workloads,
        args.resources,
        out.display()
    );
}

/// The same fleet for the first K clusters as kustomize sees it: one base per
/// workload, one overlay folder per cluster with the region's images, the tier's
/// patch and labels. Template manifests have no kustomize equivalent and are
/// written as plain ConfigMaps with the values filled in.
fn write_kustomize(args: &Args) {
    let root = PathBuf::from(format!("{}-kustomize", args.out.display()));
    if root.exists() {
        std::fs::remove_dir_all(&root).expect("remove old kustomize folder");
    }
    for w in 0..args.workloads {
        let dir = root.join(format!("bases/w{w:02}"));
        let mut kustomization = format!("namespace: ns-w{w:02}\nresources:\n");
        for r in 0..args.resources {
            if w.is_multiple_of(4) && r == args.resources - 1 {
                continue;
            }
            write(&dir.join(format!("r{r}.yaml")), &resource(w, r));
            let _ = writeln!(kustomization, "  - r{r}.yaml");
        }
        write(&dir.join("kustomization.yaml"), &kustomization);
    }
    for c in 0..args.kustomize.min(args.clusters) {
        let name = cluster_name(c);
        let region = region(c);
        let tier = tier(c);
        let replicas = if tier == "canary" { 1 } else { 3 };
        let mut text = String::from("resources:\n");
        for w in 0..args.workloads {
            let _ = writeln!(text, "  - ../../bases/w{w:02}");
            if w.is_multiple_of(4) {
                let _ = writeln!(text, "  - site-w{w:02}.yaml");
                write(
                    &root.join(format!("clusters/{name}/site-w{w:02}.yaml")),
                    &format!(
                        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: w{w:02}-site\n  namespace: ns-w{w:02}\ndata:\n  site: \"{c}\"\n  cluster: {name}\n  mirror: mirror.{region}.example.com\n  cache: \"256\"\n"
                    ),
                );
            }
        }
        let _ = write!(
            text,
            "labels:\n  - pairs:\n      example.com/tier: {tier}\npatches:\n  - target: {{kind: Deployment}}\n    patch: |\n      - {{op: replace, path: /spec/replicas, value: {replicas}}}\nimages:\n"
        );
        for w in 0..args.workloads {
            let _ = writeln!(
                text,
                "  - name: registry.example.com/team/w{w:02}-app\n    newName: mirror.{region}.example.com/team/w{w:02}-app"
            );
        }
        write(
            &root.join(format!("clusters/{name}/kustomization.yaml")),
            &text,
        );
    }
}
