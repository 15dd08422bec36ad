//! `flotilla diff` end to end: commit pairs made in a temporary Git repository from a
//! copy of `fleet-example/`, the real binary run on them, its report snapshotted in
//! all three formats and its exit code checked.

use std::path::{Path, PathBuf};
use std::process::Command;

use git2::{IndexAddOption, Repository, RepositoryInitOptions, Signature, Time};

/// A fleet repository with three tagged commits: `example` (fleet-example as it is),
/// `base` and `head`.
struct FleetRepo {
    dir: tempfile::TempDir,
    repo: Repository,
}

impl FleetRepo {
    fn new() -> FleetRepo {
        let dir = tempfile::tempdir().expect("temp dir");
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("fleet-example"),
            dir.path(),
        );
        let mut options = RepositoryInitOptions::new();
        options.initial_head("main");
        let repo = Repository::init_opts(dir.path(), &options).expect("git init");
        let fleet = FleetRepo { dir, repo };
        fleet.commit("example");
        fleet
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn write(&self, file: &str, text: &str) {
        let path = self.path(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// Replaces `from` (which must be there) by `to` in `file`.
    fn edit(&self, file: &str, from: &str, to: &str) {
        let text = std::fs::read_to_string(self.path(file)).expect("read");
        assert!(text.contains(from), "{file} does not contain {from:?}");
        self.write(file, &text.replacen(from, to, 1));
    }

    fn remove(&self, file: &str) {
        std::fs::remove_file(self.path(file)).expect("remove");
    }

    /// Commits the whole tree with a fixed author and time, so commit ids are the
    /// same on every run, and tags the commit.
    fn commit(&self, tag: &str) {
        let mut index = self.repo.index().expect("index");
        index
            .add_all(["*"], IndexAddOption::DEFAULT, None)
            .expect("add");
        index.update_all(["*"], None).expect("update (removals)");
        index.write().expect("write index");
        let tree = self
            .repo
            .find_tree(index.write_tree().expect("tree"))
            .expect("find tree");
        let signature = Signature::new(
            "flotilla tests",
            "tests@flotilla.dev",
            &Time::new(1_700_000_000, 0),
        )
        .expect("signature");
        let parent = self.repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let oid = self
            .repo
            .commit(Some("HEAD"), &signature, &signature, tag, &tree, &parents)
            .expect("commit");
        self.repo
            .reference(&format!("refs/tags/{tag}"), oid, true, "tag")
            .expect("tag");
    }

    fn diff(&self, args: &[&str]) -> Run {
        let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("diff")
            .args(args)
            .arg("--repo")
            .arg(self.dir.path())
            .env_remove("NO_COLOR")
            .output()
            .expect("run flotilla");
        Run {
            stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
            stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
            code: output.status.code().expect("exit code"),
        }
    }
}

struct Run {
    stdout: String,
    stderr: String,
    code: i32,
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read fleet-example") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

const FORMATS: [&str; 3] = ["text", "markdown", "json"];

/// Builds `base` from fleet-example with `base_edit`, `head` from `base` with
/// `head_edit`, runs `flotilla diff base head` in every format, snapshots the
/// reports and checks the exit code. Returns the reports.
fn check(
    name: &str,
    base_edit: impl FnOnce(&FleetRepo),
    head_edit: impl FnOnce(&FleetRepo),
    expected_code: i32,
) -> Vec<String> {
    let fleet = FleetRepo::new();
    base_edit(&fleet);
    fleet.commit("base");
    head_edit(&fleet);
    fleet.commit("head");
    FORMATS
        .iter()
        .map(|format| {
            let run = fleet.diff(&["base", "head", "--format", format]);
            assert_eq!(
                run.code, expected_code,
                "{name} ({format}): exit code\nstdout:\n{}\nstderr:\n{}",
                run.stdout, run.stderr
            );
            assert_eq!(run.stderr, "", "{name} ({format}) wrote to stderr");
            if *format == "markdown" {
                assert_well_formed_markdown(&run.stdout);
                assert!(run.stdout.len() <= 60_000);
            }
            if *format == "json" {
                let value: serde_json::Value =
                    serde_json::from_str(&run.stdout).expect("the json report parses");
                assert_eq!(value["format"], "flotilla.dev/diff/v1");
            }
            assert!(
                !run.stdout.contains('\u{1b}'),
                "no colour when stdout is not a terminal"
            );
            insta::with_settings!({
                snapshot_suffix => *format,
                prepend_module_to_snapshot => false,
            }, {
                insta::assert_snapshot!(name, without_commit_ids(&run.stdout));
            });
            run.stdout
        })
        .collect()
}

/// Commit ids are fixed by the fixed commit time, but they are noise in a snapshot.
fn without_commit_ids(report: &str) -> String {
    let commit = regex::Regex::new(r"sha1:[0-9a-f]{40}").expect("regex");
    commit.replace_all(report, "sha1:[commit]").into_owned()
}

/// Every code fence and `<details>` that opens also closes, in order.
fn assert_well_formed_markdown(text: &str) {
    let mut fence: Option<String> = None;
    let mut depth: i64 = 0;
    for line in text.lines() {
        let ticks: String = line.chars().take_while(|&c| c == '`').collect();
        match &fence {
            Some(open) if line == open => fence = None,
            Some(_) => continue,
            None if ticks.len() >= 3 => fence = Some(ticks),
            None => {
                depth += line.matches("<details>").count() as i64;
                depth -= line.matches("</details>").count() as i64;
                assert!(depth >= 0, "</details> without <details>:\n{text}");
            }
        }
    }
    assert_eq!(fence, None, "a code fence is left open:\n{text}");
    assert_eq!(depth, 0, "a <details> is left open:\n{text}");
}

fn nothing(_: &FleetRepo) {}

#[test]
fn one_cluster_overlay_changes_one_cluster() {
    let reports = check(
        "one_cluster_overlay",
        nothing,
        |fleet| {
            fleet.edit(
                "overlays/sites/store-us-002-big-cache.yaml",
                "value: 200Gi",
                "value: 300Gi",
            )
        },
        1,
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(json["changed"], serde_json::json!(["store-us-002"]));
    assert_eq!(json["unchanged"], 13);
}

#[test]
fn group_overlay_changes_its_group_once() {
    let reports = check(
        "group_overlay",
        nothing,
        |fleet| {
            fleet.edit(
                "overlays/tiers/tier-canary.yaml",
                "replicas: 1",
                "replicas: 2",
            )
        },
        1,
    );
    assert!(
        reports[0].contains(
            "the same change on 3 clusters (canary, fixed-sites; every cluster of canary)"
        ),
        "{}",
        reports[0]
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(json["groups"].as_array().map(Vec::len), Some(1));
}

#[test]
fn image_bump_for_a_region() {
    let reports = check(
        "region_image_bump",
        nothing,
        |fleet| {
            fleet.edit(
                "overlays/regions/mirror-eu.yaml",
                "      newName: registry.eu.example.com/fluent/fluent-bit\n",
                "      newName: registry.eu.example.com/fluent/fluent-bit\n      newTag: 3.1.5\n",
            )
        },
        1,
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(
        json["changed"],
        serde_json::json!([
            "plant-eu-01",
            "store-eu-001",
            "store-eu-002",
            "store-eu-003"
        ])
    );
    assert_eq!(json["groups"][0]["wholeGroups"], serde_json::json!(["eu"]));
}

#[test]
fn workload_added() {
    check(
        "workload_added",
        nothing,
        |fleet| {
            fleet.write(
                "workloads/node-exporter/workload.yaml",
                "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: node-exporter\n\
                 spec:\n  namespace: monitoring\n  targets:\n    - group: us\n",
            );
            fleet.write(
                "workloads/node-exporter/manifests/namespace.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: monitoring\n",
            );
            fleet.write(
                "workloads/node-exporter/manifests/daemonset.yaml",
                "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: node-exporter\nspec:\n\
                 \x20 selector:\n    matchLabels: {app: node-exporter}\n  template:\n\
                 \x20   metadata:\n      labels: {app: node-exporter}\n    spec:\n\
                 \x20     containers:\n        - name: node-exporter\n\
                 \x20         image: quay.io/prometheus/node-exporter:v1.8.2\n",
            );
        },
        1,
    );
}

#[test]
fn cluster_removed() {
    let reports = check(
        "cluster_removed",
        nothing,
        |fleet| fleet.remove("clusters/store-apac-002.yaml"),
        1,
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(json["removed"], serde_json::json!(["store-apac-002"]));
    assert_eq!(json["changed"], serde_json::json!([]));
}

#[test]
fn a_change_that_renders_identically_exits_0() {
    let reports = check(
        "renders_identically",
        nothing,
        |fleet| {
            fleet.edit("clusters/red.yaml", "# ", "# Reworded comment. ");
            fleet.write(
                "workloads/kuard/manifests/service.yaml",
                "# The same service, written differently.\napiVersion: v1\nkind: Service\n\
                 metadata:\n  labels: {app.kubernetes.io/name: kuard}\n  name: kuard\n\
                 spec:\n  ports: [{name: http, port: 80, targetPort: http}]\n\
                 \x20 selector: {app.kubernetes.io/name: kuard}\n",
            );
        },
        0,
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(json["unchanged"], 14);
}

#[test]
fn broken_head_is_the_headline_and_exits_2() {
    let reports = check(
        "broken_head",
        nothing,
        |fleet| {
            fleet.edit(
                "workloads/pos-api/manifests/configmap.yaml.j2",
                "vars.checkoutLanes",
                "vars.checkoutLane",
            );
            // A real change next to the error, so the diff of what did render shows.
            fleet.edit(
                "overlays/demo/kuard-red.yaml",
                "newTag: red",
                "newTag: purple",
            );
        },
        2,
    );
    for report in &reports[..2] {
        let headline = report.find("HEAD does not render").expect("headline");
        let first_group = report.find("kuard-amd64:purple").expect("red's change");
        assert!(headline < first_group, "{report}");
        assert!(
            report.contains("workloads/pos-api/manifests/configmap.yaml.j2:17:"),
            "{report}"
        );
    }
}

#[test]
fn broken_base_is_reported_without_hiding_heads_diff() {
    let reports = check(
        "broken_base",
        |fleet| {
            fleet.edit(
                "workloads/pos-api/manifests/configmap.yaml.j2",
                "vars.checkoutLanes",
                "vars.checkoutLane",
            )
        },
        |fleet| {
            fleet.edit(
                "workloads/pos-api/manifests/configmap.yaml.j2",
                "vars.checkoutLane",
                "vars.checkoutLanes",
            )
        },
        1,
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(json["base"]["clean"], false);
    assert_eq!(json["changed"].as_array().map(Vec::len), Some(7));
    assert!(
        reports[0].contains("BASE does not render"),
        "{}",
        reports[0]
    );
}

const SECRET_BASE: &str = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pos-api-db\ntype: Opaque\n\
data:\n  username: cG9zLWFwaS11c2Vy\n  password: aHVudGVyMi1iYXNl\n  legacy: b2xkLXNlY3JldA==\n\
stringData:\n  gateway-token: s3cr3t-gateway-base\n";

const SECRET_HEAD: &str = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pos-api-db\ntype: Opaque\n\
data:\n  username: cG9zLWFwaS11c2Vy\n  password: aHVudGVyMi1oZWFk\n  pin: MTIzNA==\n\
stringData:\n  gateway-token: s3cr3t-gateway-head\n";

/// Every secret value of both versions, encoded and decoded.
const SECRET_VALUES: [&str; 10] = [
    "cG9zLWFwaS11c2Vy",
    "pos-api-user",
    "aHVudGVyMi1iYXNl",
    "aHVudGVyMi1oZWFk",
    "hunter2",
    "b2xkLXNlY3JldA==",
    "old-secret",
    "MTIzNA==",
    "s3cr3t",
    "gateway-base",
];

fn assert_no_secret(report: &str) {
    for value in SECRET_VALUES {
        assert!(
            !report.contains(value),
            "secret value {value:?} leaked:\n{report}"
        );
    }
}

#[test]
fn secret_values_never_appear() {
    let reports = check(
        "secret_change",
        |fleet| fleet.write("workloads/pos-api/manifests/secret.yaml", SECRET_BASE),
        |fleet| fleet.write("workloads/pos-api/manifests/secret.yaml", SECRET_HEAD),
        1,
    );
    for report in &reports {
        assert_no_secret(report);
        assert!(report.contains("<redacted, changed>"), "{report}");
    }
    assert!(
        reports[0].contains("+  password: <redacted, changed>"),
        "{}",
        reports[0]
    );
    assert!(
        reports[0].contains("    username: <redacted>"),
        "{}",
        reports[0]
    );

    // The same Secret added to, and removed from, the fleet.
    let fleet = FleetRepo::new();
    fleet.write("workloads/pos-api/manifests/secret.yaml", SECRET_BASE);
    fleet.commit("with-secret");
    for (base, head) in [("example", "with-secret"), ("with-secret", "example")] {
        for format in FORMATS {
            let run = fleet.diff(&[base, head, "--format", format]);
            assert_eq!(run.code, 1, "{}", run.stderr);
            assert_no_secret(&run.stdout);
            assert!(
                run.stdout.contains("Secret pos-api/pos-api-db"),
                "{}",
                run.stdout
            );
        }
    }
}

/// `SECRET` with annotations that copy its values: a `kubectl apply` record of an
/// earlier version (`last_applied`) and one value, decoded (`copied`).
fn annotated_secret(secret: &str, last_applied: &str, copied: &str) -> String {
    secret.replacen(
        "  name: pos-api-db\n",
        &format!(
            "  name: pos-api-db\n  annotations:\n    \
             kubectl.kubernetes.io/last-applied-configuration: '{last_applied}'\n    \
             copied: {copied}\n    team: payments\n"
        ),
        1,
    )
}

#[test]
fn secret_values_in_a_secrets_annotations_never_appear_and_validate_warns() {
    let last_applied = |password: &str, token: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"pos-api-db"}},"data":{{"password":"{password}"}},"stringData":{{"gateway-token":"{token}"}}}}"#
        )
    };
    let fleet = FleetRepo::new();
    let path = "workloads/pos-api/manifests/secret.yaml";
    fleet.write(
        path,
        &annotated_secret(
            SECRET_BASE,
            &last_applied("b2xkLXNlY3JldA==", "s3cr3t-gateway-older"),
            "hunter2-base",
        ),
    );
    fleet.commit("base");
    fleet.write(
        path,
        &annotated_secret(
            SECRET_HEAD,
            &last_applied("aHVudGVyMi1iYXNl", "s3cr3t-gateway-base"),
            "hunter2-head",
        ),
    );
    fleet.commit("head");
    for format in FORMATS {
        let run = fleet.diff(&["base", "head", "--format", format]);
        assert_eq!(run.code, 1, "{format}: {}", run.stderr);
        assert_no_secret(&run.stdout);
        assert_no_secret(&run.stderr);
        assert!(
            run.stdout.contains("last-applied-configuration")
                && run.stdout.contains("<redacted, changed>")
                && run.stdout.contains("team: payments"),
            "{format}: the annotations are named, their values hidden:\n{}",
            run.stdout
        );
    }

    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["validate", "--repo"])
        .arg(fleet.dir.path())
        .output()
        .expect("flotilla validate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "a warning, not an error: {stderr}");
    assert!(
        stderr.contains(&format!(
            "{path}:1: warning: Secret pos-api/pos-api-db carries its values in its metadata"
        )) && stderr.contains("annotation \"kubectl.kubernetes.io/last-applied-configuration\"")
            && stderr.contains("annotation \"copied\"")
            && !stderr.contains("annotation \"team\""),
        "{stderr}"
    );
    assert_no_secret(&stderr);
}

#[test]
fn markdown_is_cut_at_max_bytes() {
    let fleet = FleetRepo::new();
    fleet.commit("base");
    // An annotation on every resource of every cluster: a large report.
    fleet.edit(
        "overlays/fleet/managed-by-flotilla.yaml",
        "example.com/owner: platform-team",
        "example.com/owner: platform-team-emea",
    );
    fleet.commit("head");
    let full = fleet.diff(&["base", "head", "--format", "markdown"]);
    assert_eq!(full.code, 1);
    assert!(full.stdout.len() > 9_000, "the change is big enough to cut");
    assert!(!full.stdout.contains("This comment was cut"));

    let cut = fleet.diff(&[
        "base",
        "head",
        "--format",
        "markdown",
        "--max-bytes",
        "9000",
    ]);
    assert_eq!(cut.code, 1);
    assert!(cut.stdout.len() <= 9_000, "{} bytes", cut.stdout.len());
    assert!(
        cut.stdout
            .contains("This comment was cut to stay under 9000 bytes")
    );
    assert_well_formed_markdown(&cut.stdout);
    insta::with_settings!({
        prepend_module_to_snapshot => false,
    }, {
        insta::assert_snapshot!("markdown_cut", without_commit_ids(&cut.stdout));
    });

    // Every size keeps the promise: never over the limit, never a broken block.
    for max in (4_000..full.stdout.len() + 1_000).step_by(1_500) {
        let run = fleet.diff(&[
            "base",
            "head",
            "--format",
            "markdown",
            "--max-bytes",
            &max.to_string(),
        ]);
        assert!(run.stdout.len() <= max, "{} > {max}", run.stdout.len());
        assert_well_formed_markdown(&run.stdout);
    }

    let refused = fleet.diff(&["base", "head", "--format", "markdown", "--max-bytes", "100"]);
    assert_eq!(
        refused.code, 2,
        "a limit too small to hold a summary is refused"
    );
}

/// A diff too large for the report is left out, and the smaller diffs after it in
/// the same change group are still shown (they were all left out with it).
#[test]
fn markdown_leaves_out_a_diff_too_large_and_shows_the_smaller_ones_after_it() {
    let fleet = FleetRepo::new();
    fleet.commit("base");
    let data: String = (0..300)
        .map(|i| format!("  k{i}: \"{}\"\n", "x".repeat(250)))
        .collect();
    fleet.write(
        "workloads/telemetry-agent/manifests/big.yaml",
        &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n{data}"),
    );
    fleet.edit(
        "workloads/kuard/manifests/deployment.yaml",
        "replicas: 1",
        "replicas: 2",
    );
    fleet.commit("head");
    let run = fleet.diff(&["base", "head", "--format", "markdown"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.len() <= 60_000, "{} bytes", run.stdout.len());
    assert_well_formed_markdown(&run.stdout);
    // Every group holding both shows the Deployment's diff and leaves out the
    // ConfigMap's.
    let blocks: Vec<&str> = run
        .stdout
        .split("<details>\n<summary><b>")
        .skip(1)
        .filter(|block| block.contains("ConfigMap") && block.contains("Deployment"))
        .collect();
    assert!(!blocks.is_empty(), "{}", run.stdout);
    for block in blocks {
        assert!(block.contains("+  replicas: 2"), "{block}");
        assert!(!block.contains(&"x".repeat(250)), "{block}");
        assert!(
            block.contains("*The diff of 1 resource was left out to fit the size limit.*"),
            "{block}"
        );
    }
}

#[test]
fn worktree_compares_head_with_uncommitted_edits() {
    let fleet = FleetRepo::new();
    let clean = fleet.diff(&["--worktree"]);
    assert_eq!(clean.code, 0, "{}{}", clean.stdout, clean.stderr);
    fleet.edit(
        "overlays/demo/kuard-red.yaml",
        "newTag: red",
        "newTag: purple",
    );
    let run = fleet.diff(&["--worktree", "--format", "json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(json["changed"], serde_json::json!(["red"]));
    assert!(
        json["head"]["revision"]
            .as_str()
            .is_some_and(|r| r.starts_with("folder:")),
        "{json}"
    );
}

#[test]
fn unknown_revision_exits_2_with_a_message() {
    let fleet = FleetRepo::new();
    let run = fleet.diff(&["example", "no-such-branch"]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty());
    assert!(
        run.stderr.contains("no-such-branch"),
        "the error names the revision: {}",
        run.stderr
    );
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let fleet = FleetRepo::new();
    fleet.edit(
        "overlays/demo/kuard-red.yaml",
        "newTag: red",
        "newTag: purple",
    );
    fleet.commit("head");
    let coloured = fleet.diff(&["example", "head", "--color", "always"]);
    assert!(
        coloured.stdout.contains("\u{1b}[32m+"),
        "{}",
        coloured.stdout
    );
    let plain = fleet.diff(&["example", "head"]);
    assert!(!plain.stdout.contains('\u{1b}'));
}

#[test]
fn a_change_outside_the_fleet_files_has_no_changes_and_names_both_revisions() {
    let fleet = FleetRepo::new();
    fleet.write("README.md", "# notes, not fleet files\n");
    fleet.write("clusters/notes.txt", "not YAML, so not read\n");
    fleet.commit("docs");
    let run = fleet.diff(&["example", "docs", "--format", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(json["unchanged"], 14);
    let base = json["base"]["revision"].as_str().unwrap_or_default();
    let head = json["head"]["revision"].as_str().unwrap_or_default();
    assert!(base.starts_with("example@sha1:"), "{base}");
    assert!(head.starts_with("docs@sha1:"), "{head}");
    assert_ne!(base[8..], head[5..], "two different commits");
}

/// The plan leads the report: a change to the edge sites that run the telemetry agent
/// with the default flush interval (governed by fleet-example's `edge-sites` policy:
/// canaries, then the rest three at a time), to `blue` (no policy: at once) and to a
/// paused store.
#[test]
fn the_rollout_plan_leads_the_report() {
    let reports = check(
        "rollout_plan",
        |fleet| {
            fleet.edit(
                "clusters/store-eu-003.yaml",
                "spec:\n",
                "spec:\n  paused: true\n",
            )
        },
        |fleet| {
            fleet.edit(
                "workloads/telemetry-agent/workload.yaml",
                "flushSeconds: 5",
                "flushSeconds: 15",
            )
        },
        1,
    );
    let text = &reports[0];
    let plan = text.find("Rollout plan").expect("a plan");
    let summary = text.find("clusters changed").expect("a summary");
    assert!(plan < summary, "the plan comes first:\n{text}");
    assert!(
        text.contains("1. canary")
            && text.contains("3 changed clusters  bake 15m")
            && text.contains("2. rest")
            && text.contains("6 changed clusters  bake 10m      maxFailed 10%  maxParallel 3"),
        "{text}"
    );
    assert!(
        text.contains("at once (no rollout policy): 1 cluster: blue"),
        "{text}"
    );
    assert!(
        text.contains("paused (spec.paused; they keep what they run): 1 cluster: store-eu-003"),
        "{text}"
    );
    assert!(
        text.contains("(edge-sites/canary)") && text.contains("(at once)"),
        "{text}"
    );
    let markdown = &reports[1];
    assert!(
        markdown.contains("| edge-sites | canary | 3: `store-apac-001`, `store-eu-001`, `store-us-001` | 15m | 0 | all |"),
        "{markdown}"
    );
    let json: serde_json::Value = serde_json::from_str(&reports[2]).expect("json");
    assert_eq!(json["waves"][0]["policy"], "edge-sites");
    assert_eq!(json["waves"][0]["name"], "canary");
    assert_eq!(
        json["waves"][0]["clusters"],
        serde_json::json!(["store-apac-001", "store-eu-001", "store-us-001"])
    );
    assert_eq!(json["waves"][0]["bake"], "15m");
    assert_eq!(json["waves"][0]["maxFailed"], 0);
    assert_eq!(json["waves"][0]["maxParallel"], serde_json::Value::Null);
    assert_eq!(json["waves"][1]["maxFailed"], "10%");
    assert_eq!(json["waves"][1]["maxParallel"], 3);
    // Six: the vehicles' flush interval is their own (an overlay), and the paused
    // store is in no wave.
    assert_eq!(
        json["waves"][1]["clusters"].as_array().map(Vec::len),
        Some(6)
    );
    assert_eq!(json["atOnce"], serde_json::json!(["blue"]));
    assert_eq!(json["paused"], serde_json::json!(["store-eu-003"]));
    assert_eq!(json["clusters"]["store-eu-001"]["wave"], "canary");
    assert_eq!(json["clusters"]["blue"]["policy"], serde_json::Value::Null);
    assert_eq!(json["clusters"]["store-eu-003"]["paused"], true);
}

/// A workload that `dependsOn` another shows as a change of apply order on the
/// clusters both go to; a cycle, and a dependency on a workload that does not go to
/// a cluster, break HEAD with messages naming them, in `diff` as in `validate`.
#[test]
fn dependencies_show_as_an_order_and_their_mistakes_break_head() {
    let fleet = FleetRepo::new();
    fleet.commit("base");
    fleet.write(
        "workloads/kuard-config/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: kuard-config\n\
         spec:\n  namespace: kuard\n  targets:\n    - group: kuard-demo\n",
    );
    fleet.write(
        "workloads/kuard-config/manifests/config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kuard-config\ndata:\n  colour: any\n",
    );
    let kuard = std::fs::read_to_string(fleet.path("workloads/kuard/workload.yaml"))
        .expect("kuard's workload");
    fleet.write(
        "workloads/kuard/workload.yaml",
        &format!("{kuard}  dependsOn: [kuard-config]\n"),
    );
    fleet.commit("ordered");
    let run = fleet.diff(&["base", "ordered"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("apply order: flotilla-tenancy, kuard-config → kuard (was: all at once)"),
        "{}",
        run.stdout
    );

    fleet.write(
        "workloads/kuard-config/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: kuard-config\n\
         spec:\n  namespace: kuard\n  targets:\n    - group: kuard-demo\n  dependsOn: [kuard]\n",
    );
    fleet.commit("cycle");
    let run = fleet.diff(&["base", "cycle"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("spec.dependsOn makes a cycle: kuard → kuard-config → kuard"),
        "{}",
        run.stdout
    );
    let validate = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["validate", "--repo"])
        .arg(fleet.dir.path())
        .output()
        .expect("flotilla runs");
    let stderr = String::from_utf8_lossy(&validate.stderr);
    assert_eq!(validate.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("workloads/kuard/workload.yaml:")
            && stderr.contains("spec.dependsOn makes a cycle: kuard → kuard-config → kuard"),
        "{stderr}"
    );

    fleet.write(
        "workloads/kuard-config/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: kuard-config\n\
         spec:\n  namespace: kuard\n  targets:\n    - cluster: red\n",
    );
    fleet.commit("not-everywhere");
    let run = fleet.diff(&["base", "not-everywhere"]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains(
            "workload kuard depends on workload kuard-config, which does not target cluster blue"
        ),
        "{}",
        run.stdout
    );
}

/// Under `validation: strict` a schema problem in HEAD is a render error: `diff`
/// says HEAD does not render (exit 2) and names the file, cluster and field.
#[test]
fn a_schema_problem_under_strict_is_a_head_that_does_not_render() {
    let fleet = FleetRepo::new();
    fleet.commit("base");
    fleet.write(
        "flotilla.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n  validation: strict\n",
    );
    fleet.edit(
        "workloads/kuard/manifests/deployment.yaml",
        "  replicas: 1\n",
        "  replica: 3\n",
    );
    fleet.commit("head");
    let run = fleet.diff(&["base", "head"]);
    assert_eq!(
        run.code, 2,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let report = format!("{}{}", run.stdout, run.stderr);
    assert!(
        report.contains("workloads/kuard/manifests/deployment.yaml:1: Deployment.apps kuard/kuard: spec.replica: unknown field (did you mean \"replicas\"?) (Kubernetes 1.36 schema) (cluster blue and 1 other cluster, workload kuard)"),
        "{report}"
    );
}

/// A BASE whose render passes `--render-memory` (a list doubled, with fuel raised past
/// what memory holds) stops the diff with exit code 2, and the error says it was BASE's render and
/// which template: the pull request that removes the template knows why.
#[test]
fn a_base_past_the_memory_cap_stops_the_diff_naming_base() {
    let fleet = FleetRepo::new();
    let doubled = "{% set l = l + l %}\n".repeat(40);
    fleet.write(
        "workloads/kuard/manifests/grow.yaml.j2",
        &format!(
            "{{% set l = [1] %}}\n{doubled}apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: grow\ndata:\n  n: \"{{{{ l | length }}}}\"\n"
        ),
    );
    fleet.commit("base");
    fleet.remove("workloads/kuard/manifests/grow.yaml.j2");
    fleet.commit("head");
    // Fuel enough for a list of billions of items: only the memory cap stops it.
    let run = fleet.diff(&[
        "base",
        "head",
        "--render-memory",
        "512MiB",
        "--template-fuel",
        "100000000000",
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(
        run.stderr.contains("error: the render of BASE (base) needed more than 512 MiB of memory (--render-memory) and was stopped (it was rendering workloads/kuard/manifests/grow.yaml.j2 for cluster "),
        "{}",
        run.stderr
    );
}
