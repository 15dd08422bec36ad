//! Generates a synthetic fleet repository for benchmarks.
//!
//! ```text
//! cargo run --release --example gen_fleet -- --clusters 10000 --workloads 20 --resources 5 OUT
//!     [--git] [--kustomize K] [--kustomize-bases] [--templated PERCENT] [--tenants T]
//! ```
//!
//! The fleet is described in `examples/support/synthetic.rs`. `--git` makes OUT a
//! Git repository with one commit. `--kustomize K` also writes `OUT-kustomize/`, a
//! kustomize layout equivalent for the first K clusters (a base per workload, an
//! overlay per cluster), to compare against `kubectl kustomize`.
//! `--kustomize-bases` makes every workload of OUT a kustomize base (a name prefix,
//! a ConfigMap generator and two patches each), and writes `OUT-plain/`, the same
//! fleet with each base built into plain manifests by flotilla: both render the same
//! bundles, so they compare the cost of building kustomize bases.
//! `--templated PERCENT` makes PERCENT of the manifests per-cluster templates (an
//! annotation with the cluster's `site` variable) and the rest literal (the same
//! annotation with a fixed value): `--templated 100` and `--templated 0` are the
//! templated and the literal fleet of the same 100 resources a cluster.
//! `--tenants T` adds T tenants (`tenants/team-<t>.yaml`) that share the workloads
//! between them (workload `w` belongs to team `w mod T`), each with its workloads'
//! namespaces and a cluster selector every cluster matches, so that every resource
//! is checked against a tenant's rules and none breaks them.

#[path = "support/synthetic.rs"]
mod synthetic;

use std::path::{Path, PathBuf};
use std::process::Command;

struct Args {
    clusters: usize,
    workloads: usize,
    resources: usize,
    out: PathBuf,
    git: bool,
    kustomize: usize,
    kustomize_bases: bool,
    templated: Option<usize>,
    tenants: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        clusters: 100,
        workloads: 20,
        resources: 5,
        out: PathBuf::new(),
        git: false,
        kustomize: 0,
        kustomize_bases: false,
        templated: None,
        tenants: 0,
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
            "--templated" => {
                let percent = number(it.next(), "--templated")?;
                if percent > 100 {
                    return Err("--templated takes a percentage from 0 to 100".into());
                }
                args.templated = Some(percent);
            }
            "--git" => args.git = true,
            "--tenants" => args.tenants = number(it.next(), "--tenants")?,
            "--kustomize-bases" => args.kustomize_bases = true,
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

fn write_all(root: &Path, files: &synthetic::Files) {
    if root.exists() {
        std::fs::remove_dir_all(root).expect("remove the old folder");
    }
    for (path, text) in &files.0 {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create folder");
        }
        std::fs::write(&path, text).expect("write file");
    }
}

/// The fleet with each workload's kustomization built (by flotilla's renderer) into
/// one manifest file, and the kustomization and its inputs left out.
fn built_into_manifests(files: &synthetic::Files, workloads: usize) -> synthetic::Files {
    let snapshot = flotilla_core::snapshot::FleetSnapshot::from_files(
        files.0.iter().map(|(p, t)| (p.as_str(), t.as_str())),
    );
    let mut plain = synthetic::Files::default();
    for (path, text) in &files.0 {
        let parts: Vec<&str> = path.split('/').collect();
        if !matches!(
            parts.as_slice(),
            ["workloads", _, "kustomization.yaml"] | ["workloads", _, "base", _]
        ) {
            plain.0.push((path.clone(), text.clone()));
        }
    }
    for w in 0..workloads {
        let dir = format!("workloads/w{w:02}");
        let documents = flotilla_render::kustomize::build(
            &snapshot,
            &dir,
            &format!("{dir}/kustomization.yaml"),
        )
        .unwrap_or_else(|errors| panic!("{dir} does not build: {errors:?}"));
        let mut text = String::new();
        for document in documents {
            text.push_str("---\n");
            text.push_str(
                &serde_saphyr::to_string(&document.value).expect("a resource serialises"),
            );
        }
        plain.0.push((format!("{dir}/manifests/built.yaml"), text));
    }
    plain
}

/// `tenants/team-<t>.yaml` for `tenants` teams sharing `workloads` workloads.
fn write_tenants(root: &Path, tenants: usize, workloads: usize) {
    let dir = root.join("tenants");
    std::fs::create_dir_all(&dir).expect("creates tenants/");
    for t in 0..tenants {
        let owned: Vec<usize> = (0..workloads).filter(|w| w % tenants == t).collect();
        let list = |prefix: &str| {
            owned
                .iter()
                .map(|w| format!("{prefix}w{w:02}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Tenant\nmetadata:\n  name: team-{t}\nspec:\n  workloads: [{}]\n  clusterSelector:\n    matchExpressions:\n      - {{key: region, operator: Exists}}\n  namespaces: [{}]\n",
            list(""),
            list("ns-")
        );
        std::fs::write(dir.join(format!("team-{t}.yaml")), text).expect("writes a tenant");
    }
}

fn git(dir: &Path, arguments: &[&str]) {
    let status = Command::new("git")
        .args(arguments)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "flotilla-bench")
        .env("GIT_AUTHOR_EMAIL", "bench@flotilla.invalid")
        .env("GIT_COMMITTER_NAME", "flotilla-bench")
        .env("GIT_COMMITTER_EMAIL", "bench@flotilla.invalid")
        .status()
        .expect("run git");
    assert!(status.success(), "git {arguments:?} failed");
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!(
                "{message}\nusage: gen_fleet --clusters N --workloads W --resources R OUT [--git] [--kustomize K] [--kustomize-bases] [--templated PERCENT] [--tenants T]"
            );
            std::process::exit(2);
        }
    };
    if args.kustomize_bases {
        let files =
            synthetic::fleet_with_kustomize_bases(args.clusters, args.workloads, args.resources);
        let plain = PathBuf::from(format!("{}-plain", args.out.display()));
        write_all(&plain, &built_into_manifests(&files, args.workloads));
        write_all(&args.out, &files);
    } else if let Some(percent) = args.templated {
        write_all(
            &args.out,
            &synthetic::fleet_templated(args.clusters, args.workloads, args.resources, percent),
        );
    } else {
        write_all(
            &args.out,
            &synthetic::fleet(args.clusters, args.workloads, args.resources),
        );
    }
    if args.tenants > 0 {
        write_tenants(&args.out, args.tenants, args.workloads);
    }
    if args.kustomize > 0 {
        let root = PathBuf::from(format!("{}-kustomize", args.out.display()));
        write_all(
            &root,
            &synthetic::kustomize(
                args.clusters,
                args.workloads,
                args.resources,
                args.kustomize,
            ),
        );
    }
    if args.git {
        git(&args.out, &["init", "-q", "-b", "main"]);
        git(&args.out, &["add", "-A"]);
        git(&args.out, &["commit", "-q", "-m", "generated fleet"]);
    }
    eprintln!(
        "wrote {} clusters × {} workloads × {} resources to {}",
        args.clusters,
        args.workloads,
        args.resources,
        args.out.display()
    );
}
