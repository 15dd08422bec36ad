//! Snapshot tests of the rendered fleet-example: one snapshot per cluster of its
//! bundle's resources (as YAML, to be read in review), and a summary of every
//! cluster's digest, resource count and groups. A change to the renderer or to the
//! example that changes what any cluster receives shows up here as a diff.
//!
//! Update with `cargo insta review` (or `INSTA_UPDATE=always cargo test --test
//! render_example`) after checking the diff is what you meant.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use flotilla_hub::source;
use flotilla_render::{RenderOutput, render};
use serde::Serialize;
use serde_json::Value;

fn example_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example"))
}

fn render_example() -> RenderOutput {
    let snapshot = source::from_folder(example_root(), "").expect("fleet-example is readable");
    let output = render(&snapshot);
    let diagnostics: Vec<String> = output.diagnostics.iter().map(|d| d.to_string()).collect();
    assert!(
        diagnostics.is_empty(),
        "fleet-example must render without errors or warnings:\n{}",
        diagnostics.join("\n")
    );
    output
}

#[derive(Serialize)]
struct ClusterSummary {
    digest: String,
    resources: usize,
    groups: Vec<String>,
}

#[test]
fn summary_of_every_cluster() {
    let output = render_example();
    let summary: BTreeMap<&str, ClusterSummary> = output
        .bundles
        .iter()
        .map(|(cluster, bundle)| {
            (
                cluster.as_str(),
                ClusterSummary {
                    digest: bundle.digest.to_string(),
                    resources: bundle.resources.len(),
                    groups: output.memberships.get(cluster).cloned().unwrap_or_default(),
                },
            )
        })
        .collect();
    let clusters = std::fs::read_dir(example_root().join("clusters"))
        .expect("clusters/ exists")
        .count();
    assert_eq!(summary.len(), clusters, "every cluster has a bundle");
    insta::assert_yaml_snapshot!("summary", summary);
}

#[test]
fn bundle_of_every_cluster() {
    let output = render_example();
    for (cluster, bundle) in &output.bundles {
        let resources: Vec<Value> = bundle.resources.iter().map(|r| r.value()).collect();
        insta::assert_yaml_snapshot!(format!("bundle-{cluster}"), resources);
    }
}

/// The kuard demo: one workload, delivered to both red and blue, differing only in
/// the image tag red's overlay sets.
#[test]
fn kuard_reaches_red_and_blue_with_their_own_colour() {
    let output = render_example();
    let image = |cluster: &str| {
        output.bundles[cluster]
            .resources
            .iter()
            .find(|r| r.key.kind() == "Deployment" && r.key.name() == "kuard")
            .and_then(|r| {
                r.value()
                    .pointer("/spec/template/spec/containers/0/image")?
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_else(|| panic!("{cluster} runs kuard"))
    };
    assert_eq!(image("red"), "gcr.io/kuar-demo/kuard-amd64:red");
    assert_eq!(image("blue"), "gcr.io/kuar-demo/kuard-amd64:blue");
}

/// The served document of every cluster verifies (the agent's check), and rendering
/// the same files from a Git commit gives the same digests as from the folder.
#[test]
fn a_commit_of_the_example_renders_the_same_digests_and_verifies() {
    let output = render_example();
    for (cluster, bundle) in &output.bundles {
        let document = bundle.document(&output.revision);
        let verified = flotilla_core::bundle::verify_document(&document, Some(cluster))
            .unwrap_or_else(|err| panic!("{cluster}: {err}"));
        assert_eq!(verified.digest, bundle.digest);
    }

    let repo = tempfile::tempdir().expect("temp dir");
    copy_tree(example_root(), &repo.path().join("fleet"));
    if !git(repo.path(), &["init", "-q", "-b", "main"]) {
        eprintln!("skipping the Git half: the git command is not available");
        return;
    }
    assert!(git(repo.path(), &["add", "-A"]));
    assert!(git(
        repo.path(),
        &[
            "-c",
            "user.name=flotilla test",
            "-c",
            "user.email=test@flotilla.invalid",
            "commit",
            "-q",
            "-m",
            "fleet",
        ]
    ));
    let location = source::Location {
        repo: repo.path().to_path_buf(),
        rev: None,
        path: "fleet".into(),
        worktree: false,
    };
    let snapshot = source::read(&location).expect("the commit is readable");
    assert!(
        snapshot.revision.starts_with("main@sha1:"),
        "{}",
        snapshot.revision
    );
    let from_git = render(&snapshot);
    assert!(from_git.is_clean(), "{:?}", from_git.diagnostics);
    let digests = |o: &RenderOutput| -> BTreeMap<String, String> {
        o.bundles
            .iter()
            .map(|(c, b)| (c.clone(), b.digest.to_string()))
            .collect()
    };
    assert_eq!(digests(&from_git), digests(&output));
}

fn git(dir: &Path, args: &[&str]) -> bool {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_SYSTEM", "/dev/null")
        .status()
        .is_ok_and(|s| s.success())
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create folder");
    for entry in std::fs::read_dir(from).expect("read folder") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}
