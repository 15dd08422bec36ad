//! A corpus of bad fleets under `tests/it/bad/<case>/`, each a small fleet folder read
//! through `flotilla_hub::source` and rendered, with the exact diagnostics a user sees
//! (file, line, message, cluster, workload) in `tests/it/bad/<case>/expected.txt`, one
//! per line. A case folder may hold a `path` file: the `--path` to read it with.
//!
//! After a deliberate change to a message, rewrite the expected files with
//! `FLOTILLA_BLESS=1 cargo test --test bad_inputs` and review the diff.
//!
//! Besides the exact text, every case checks what must hold for any bad input: every
//! diagnostic names a file, a fleet with an error is not clean and gives no bundle to
//! a cluster an error names, and a fleet with only warnings still renders.
//! A property test at the end feeds random and mutated files of every kind to the
//! renderer and checks it returns without panicking.

use std::path::{Path, PathBuf};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_hub::source::{self, Location};
use flotilla_render::{RenderOutput, render};
use pretty_assertions::assert_eq;
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/bad")
}

/// What a case produced: the lines a user would read, and the render if there was one.
struct Outcome {
    lines: Vec<String>,
    output: Option<RenderOutput>,
}

fn run(case: &str) -> Outcome {
    let dir = corpus().join(case);
    assert!(dir.is_dir(), "no case folder {}", dir.display());
    let path = std::fs::read_to_string(dir.join("path"))
        .map(|p| p.trim().to_string())
        .unwrap_or_default();
    let location = Location {
        repo: dir,
        rev: None,
        path,
        worktree: true,
    };
    match source::read(&location) {
        Err(err) => Outcome {
            lines: vec![format!("cannot read the fleet: {err}")],
            output: None,
        },
        Ok(snapshot) => {
            let output = render(&snapshot);
            Outcome {
                lines: output
                    .diagnostics
                    .iter()
                    .map(Diagnostic::to_string)
                    .collect(),
                output: Some(output),
            }
        }
    }
}

/// Machine-specific text in messages (absolute paths) is written as `$BAD` (the
/// corpus folder) in the expected files.
fn generalise(line: &str) -> String {
    let bad = corpus()
        .canonicalize()
        .expect("the corpus folder exists")
        .display()
        .to_string();
    line.replace(&bad, "$BAD")
}

/// Renders the case and asserts its exact diagnostics and the invariants every bad
/// input must keep. Returns the render for further checks.
fn check(case: &str) -> Option<RenderOutput> {
    let outcome = run(case);
    let actual: Vec<String> = outcome.lines.iter().map(|l| generalise(l)).collect();
    let expected_path = corpus().join(case).join("expected.txt");
    if std::env::var_os("FLOTILLA_BLESS").is_some() {
        let text: String = actual.iter().map(|line| format!("{line}\n")).collect();
        std::fs::write(&expected_path, text).expect("write expected.txt");
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|err| {
        panic!(
            "{}: {err}\nthe case {case} printed:\n{}",
            expected_path.display(),
            actual.join("\n")
        )
    });
    let expected: Vec<&str> = expected.lines().collect();
    assert_eq!(actual, expected, "diagnostics of tests/it/bad/{case}");

    if let Some(output) = &outcome.output {
        for diagnostic in &output.diagnostics {
            assert!(
                diagnostic.file.is_some(),
                "{case}: a diagnostic names no file: {diagnostic}"
            );
        }
        if output.errors().next().is_some() {
            assert!(!output.is_clean());
            for error in output.errors() {
                if let Some(cluster) = &error.cluster
                    && let Some(name) = cluster.split(' ').next()
                {
                    assert!(
                        !output.bundles.contains_key(name),
                        "{case}: cluster {name} has an error and still got a bundle"
                    );
                }
            }
        } else {
            assert!(output.is_clean());
            assert!(
                !output.bundles.is_empty(),
                "{case}: a fleet with only warnings still renders"
            );
        }
    }
    outcome.output
}

macro_rules! cases {
    ($($test:ident => $case:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check($case);
            }
        )*
        const CASES: &[&str] = &[$($case,)*];
    };
}

cases! {
    malformed_yaml => "malformed-yaml",
    duplicate_yaml_key => "duplicate-yaml-key",
    empty_cluster_file => "empty-cluster-file",
    alias_bomb => "alias-bomb",
    unknown_field_with_did_you_mean => "unknown-field-did-you-mean",
    unknown_field_in_spec => "unknown-field-in-spec",
    wrong_api_version => "wrong-api-version",
    wrong_kind => "wrong-kind",
    cluster_name_not_file_name => "cluster-name-not-file-name",
    workload_name_not_folder_name => "workload-name-not-folder-name",
    undefined_template_variable => "undefined-template-variable",
    template_syntax_error => "template-syntax-error",
    tenant_template_loads_another_tenants_file => "tenant-template-loads-another-tenants-file",
    template_renders_invalid_yaml => "template-renders-invalid-yaml",
    same_template_error_on_many_clusters => "same-template-error-on-many-clusters",
    patch_on_missing_path => "patch-on-missing-path",
    patch_test_op_fails => "patch-test-op-fails",
    patch_removes_name => "patch-removes-name",
    bad_patch_target => "bad-patch-target",
    image_override_changes_nothing => "image-override-changes-nothing",
    duplicate_resource_across_workloads => "duplicate-resource-across-workloads",
    duplicate_resource_in_one_file => "duplicate-resource-in-one-file",
    duplicate_overlay_names => "duplicate-overlay-names",
    unknown_group_in_target => "unknown-group-in-target",
    target_with_two_entries => "target-with-two-entries",
    unknown_cluster_in_overlay => "unknown-cluster-in-overlay",
    unknown_group_and_workload_in_overlay => "unknown-group-and-workload-in-overlay",
    overlay_selects_no_one => "overlay-selects-no-one",
    selector_matches_nothing_is_a_warning => "selector-matches-nothing-is-a-warning",
    exported_manifest_is_a_warning => "exported-manifest-is-a-warning",
    bad_match_expressions => "bad-match-expressions",
    manifests_without_workload => "manifests-without-workload",
    manifest_without_name => "manifest-without-name",
    manifest_without_kind => "manifest-without-kind",
    manifest_is_not_a_mapping => "manifest-is-not-a-mapping",
    cluster_scoped_kind_with_namespace => "cluster-scoped-kind-with-namespace",
    every_error_at_once => "every-error-at-once",
    path_escape => "path-escape",
    symlink_outside_the_fleet => "symlink-outside-the-fleet",
    rollout_policy_errors => "rollout-policy-errors",
    rollout_wave_selects_no_cluster_is_a_warning => "rollout-wave-selects-no-cluster-is-a-warning",
    kustomization_among_manifests => "kustomization-among-manifests",
    fleet_yaml_among_manifests => "fleet-yaml-among-manifests",
    overlay_patch_puts_namespace_on_cluster_scoped_kind => "overlay-patch-puts-namespace-on-cluster-scoped-kind",
    patch_target_matches_nothing_is_a_warning => "patch-target-matches-nothing-is-a-warning",
    strategic_overlay_patch_errors => "strategic-overlay-patch-errors",
    kustomization_without_workload => "kustomization-without-workload",
    kustomize_resources_refused => "kustomize-resources-refused",
    kustomize_plugins_and_unsupported_fields => "kustomize-plugins-and-unsupported-fields",
    kustomize_kustomization_file_problems => "kustomize-kustomization-file-problems",
    kustomize_bases_and_components => "kustomize-bases-and-components",
    kustomize_patch_errors => "kustomize-patch-errors",
    kustomize_generator_errors => "kustomize-generator-errors",
    kustomize_transformer_errors => "kustomize-transformer-errors",
    manifest_with_infinity => "manifest-with-infinity",
    patch_nests_too_deep => "patch-nests-too-deep",
    patch_grows_too_large => "patch-grows-too-large",
    template_runs_out_of_fuel => "template-runs-out-of-fuel",
    template_output_too_large => "template-output-too-large",
    template_builds_huge_string => "template-builds-huge-string",
    manifest_nests_too_deep => "manifest-nests-too-deep",
    invalid_resource_names => "invalid-resource-names",
    invalid_fleet_names => "invalid-fleet-names",
    invalid_labels => "invalid-labels",
    cluster_defined_twice => "cluster-defined-twice",
    workload_without_targets_is_a_warning => "workload-without-targets-is-a-warning",
    builtin_kind_not_served => "builtin-kind-not-served",
}

#[test]
fn every_case_folder_is_run() {
    let mut folders: Vec<String> = std::fs::read_dir(corpus())
        .expect("tests/it/bad exists")
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // `_outside` holds files the symlink cases point at; the positive cases
        // have tests of their own below.
        .filter(|name| !name.starts_with('_') && !POSITIVE.contains(&name.as_str()))
        .collect();
    folders.sort();
    let mut cases: Vec<&str> = CASES.to_vec();
    cases.sort();
    assert_eq!(folders, cases, "add new case folders to the cases! table");
}

const POSITIVE: &[&str] = &["cluster-scoped-crd-gets-no-namespace"];

/// A CRD with `scope: Cluster` in the same bundle makes its custom resources
/// cluster-scoped: they get no default namespace, while the workload's namespaced
/// resources still do.
#[test]
fn cluster_scoped_crd_gets_no_namespace() {
    let output = check("cluster-scoped-crd-gets-no-namespace").expect("renders");
    let bundle = &output.bundles["edge-1"];
    let namespace = |kind: &str| {
        let resource = bundle
            .resources
            .iter()
            .find(|r| r.key.kind() == kind)
            .unwrap_or_else(|| panic!("the bundle holds a {kind}"));
        resource.value()["metadata"].get("namespace").cloned()
    };
    assert_eq!(namespace("Site"), None);
    assert_eq!(namespace("CustomResourceDefinition"), None);
    assert_eq!(namespace("Deployment"), Some(Value::from("web")));
}

/// Files over the size limit are refused, not read (the file is made here rather
/// than checked in).
#[test]
fn file_over_the_size_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_tree(
        &corpus().join("cluster-scoped-crd-gets-no-namespace"),
        dir.path(),
    );
    let big = dir.path().join("workloads/web/manifests/big.yaml");
    let mut text =
        String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  blob: \"");
    let size = flotilla_core::snapshot::MAX_FILE_BYTES as usize + 1 - text.len() - 2;
    text.push_str(&"x".repeat(size));
    text.push_str("\"\n");
    std::fs::write(&big, &text).expect("write the big file");
    let snapshot = source::from_folder(dir.path(), "").expect("readable");
    let output = render(&snapshot);
    let lines: Vec<String> = output
        .diagnostics
        .iter()
        .map(Diagnostic::to_string)
        .collect();
    assert_eq!(
        lines,
        [format!(
            "workloads/web/manifests/big.yaml: file is {} bytes, over the limit of {} bytes (--max-file-bytes); it was not read",
            flotilla_core::snapshot::MAX_FILE_BYTES + 1,
            flotilla_core::snapshot::MAX_FILE_BYTES
        )]
    );
    assert!(
        !output.is_clean(),
        "a fleet with an unread file must not be served"
    );
}

/// In a Git commit, a symlink entry is followed only when it stays inside the
/// fleet root.
#[test]
fn git_symlink_outside_the_fleet() {
    let repo = tempfile::tempdir().expect("temp dir");
    let fleet = repo.path().join("fleet");
    copy_tree(
        &corpus().join("cluster-scoped-crd-gets-no-namespace"),
        &fleet,
    );
    std::fs::write(repo.path().join("secret.yaml"), "kind: Secret\n").expect("write");
    let link = |target: &str, path: &str| {
        std::os::unix::fs::symlink(target, fleet.join(path)).expect("symlink");
    };
    link("../../secret.yaml", "clusters/edge-2.yaml");
    link("/etc/hostname", "clusters/edge-3.yaml");
    link("edge-1.yaml", "clusters/edge-4.yaml");
    // A link to a file over the size limit: refused by the target's size, unread.
    let big = format!(
        "# {}\n",
        "x".repeat(flotilla_core::snapshot::MAX_FILE_BYTES as usize)
    );
    std::fs::write(fleet.join("big.txt"), big).expect("write");
    link("../../../big.txt", "workloads/web/manifests/big.yaml");
    if !commit_all(repo.path()) {
        eprintln!("skipping: the git command is not available");
        return;
    }
    let snapshot = head_of(repo.path(), "fleet");
    let output = render(&snapshot);
    let lines: Vec<String> = output
        .diagnostics
        .iter()
        .map(Diagnostic::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            "clusters/edge-2.yaml: symlink to \"../../secret.yaml\" points outside the fleet root; it was not read",
            "clusters/edge-3.yaml: symlink to \"/etc/hostname\" points outside the fleet root; it was not read",
            // The link inside the fleet is read: a second cluster file that names
            // edge-1, under the file name edge-4.
            "clusters/edge-4.yaml: metadata.name \"edge-1\" does not match the file name \"edge-4\"",
            format!(
                "workloads/web/manifests/big.yaml: file is {} bytes, over the limit of {} bytes (--max-file-bytes); it was not read",
                flotilla_core::snapshot::MAX_FILE_BYTES + 3,
                flotilla_core::snapshot::MAX_FILE_BYTES
            )
            .as_str(),
        ]
    );
    // Each file read through a link is recorded with the file it leads to.
    assert_eq!(
        snapshot
            .links
            .get("clusters/edge-4.yaml")
            .map(String::as_str),
        Some("clusters/edge-1.yaml")
    );
    assert_eq!(snapshot.links.len(), 1, "{:?}", snapshot.links);
}

/// In a commit, a name that is not UTF-8 is read with U+FFFD in its place, as a
/// folder's is: a file in docs/ does not stop the render; a fleet file or folder so
/// named is refused by the render with its name, never silently left out.
#[test]
fn git_file_names_that_are_not_utf8() {
    use std::os::unix::ffi::OsStrExt as _;
    let repo = tempfile::tempdir().expect("temp dir");
    let fleet = repo.path().join("fleet");
    copy_tree(
        &corpus().join("cluster-scoped-crd-gets-no-namespace"),
        &fleet,
    );
    let latin1 = |path: &str| {
        let mut name = path.as_bytes().to_vec();
        name.extend_from_slice(b"caf\xe9");
        fleet.join(std::ffi::OsStr::from_bytes(&name))
    };
    std::fs::create_dir_all(fleet.join("docs")).expect("mkdir");
    std::fs::write(latin1("docs/").with_extension("md"), "notes\n").expect("write");
    if !commit_all(repo.path()) {
        eprintln!("skipping: the git command is not available");
        return;
    }
    let snapshot = head_of(repo.path(), "fleet");
    assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);
    assert!(render(&snapshot).is_clean());

    // A workload whose folder's name is not UTF-8.
    let folder = latin1("workloads/");
    std::fs::create_dir_all(&folder).expect("mkdir");
    std::fs::write(
        folder.join("workload.yaml"),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: cafe\nspec:\n  targets:\n    - clusterSelector: {}\n",
    )
    .expect("write");
    assert!(commit_all(repo.path()));
    let output = render(&head_of(repo.path(), "fleet"));
    assert!(!output.is_clean());
    assert!(
        output
            .diagnostics
            .iter()
            .any(|d| d.file.as_deref() == Some("workloads/caf\u{fffd}/workload.yaml")),
        "{:#?}",
        output.diagnostics
    );
}

/// In a folder, a named pipe is not read (reading it would wait for ever), and a file
/// read through a symlink is recorded with its target.
#[test]
fn folder_fifo_and_symlink() {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_tree(
        &corpus().join("cluster-scoped-crd-gets-no-namespace"),
        dir.path(),
    );
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("workloads/web/manifests/pipe.yaml"))
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: mkfifo is not available");
        return;
    }
    std::os::unix::fs::symlink("edge-1.yaml", dir.path().join("clusters/edge-4.yaml"))
        .expect("symlink");
    let snapshot = source::from_folder(dir.path(), "").expect("readable");
    let lines: Vec<String> = snapshot
        .problems
        .iter()
        .map(Diagnostic::to_string)
        .collect();
    assert_eq!(
        lines,
        ["workloads/web/manifests/pipe.yaml: not a regular file; it was not read"]
    );
    assert_eq!(
        snapshot
            .links
            .get("clusters/edge-4.yaml")
            .map(String::as_str),
        Some("clusters/edge-1.yaml")
    );
}

/// Binary files of a Helm chart (an image its `.helmignore` lists, a key a template
/// encodes with `b64enc`) are read, from a folder and from a commit, as Helm loads
/// them; a binary file outside any chart is only skipped. A chart with one failed
/// whole ("could not be read: file is not UTF-8 text").
#[test]
fn binary_files_in_a_chart_are_read_and_others_are_skipped() {
    let repo = tempfile::tempdir().expect("temp dir");
    let fleet = repo.path().join("fleet");
    copy_tree(
        &corpus().join("cluster-scoped-crd-gets-no-namespace"),
        &fleet,
    );
    let key: &[u8] = b"\x00\x01\xfe\xffkeystore\x80";
    let write = |path: &str, bytes: &[u8]| {
        let path = fleet.join(path);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    };
    write(
        "charts/logo/Chart.yaml",
        b"apiVersion: v2\nname: logo\nversion: 0.1.0\n",
    );
    write("charts/logo/.helmignore", b"img/\n");
    write("charts/logo/img/logo.png", b"\x89PNG\r\n\x1a\n\x00\xff");
    write("charts/logo/files/key.bin", key);
    write(
        "charts/logo/templates/cm.yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: logo\n  annotations:\n    checksum/key: {{ .Files.Get \"files/key.bin\" | sha256sum }}\nbinaryData:\n  key: {{ .Files.Get \"files/key.bin\" | b64enc }}\n",
    );
    write(
        "workloads/logo/workload.yaml",
        b"apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: logo\nspec:\n  namespace: logo\n  targets:\n    - clusterSelector: {}\n  helm:\n    chart: ../../charts/logo\n",
    );
    write("docs/picture.png", b"\x89PNG\x00\xff");
    let check = |snapshot: FleetSnapshot| {
        assert!(snapshot.problems.is_empty(), "{:?}", snapshot.problems);
        assert!(snapshot.binaries.contains_key("charts/logo/files/key.bin"));
        assert!(!snapshot.binaries.contains_key("docs/picture.png"));
        assert!(snapshot.skipped.contains_key("docs/picture.png"));
        let output = render(&snapshot);
        assert!(output.is_clean(), "{:#?}", output.diagnostics);
        let config_map = output.bundles["edge-1"]
            .resources
            .iter()
            .map(|r| r.value())
            .find(|v| v["kind"] == "ConfigMap" && v["metadata"]["name"] == "logo")
            .expect("the chart's ConfigMap");
        use base64::Engine as _;
        assert_eq!(
            config_map["binaryData"]["key"],
            base64::engine::general_purpose::STANDARD.encode(key)
        );
        // Other functions take the file's bytes too, as Go's string of them.
        assert_eq!(
            config_map["metadata"]["annotations"]["checksum/key"],
            flotilla_core::bundle::Digest::of(key).hex()
        );
    };
    check(source::from_folder(&fleet, "").expect("readable"));
    if !commit_all(repo.path()) {
        eprintln!("SKIPPED: the git command is not available: the commit's half is not run");
        return;
    }
    check(head_of(repo.path(), "fleet"));
}

/// The snapshot of `path` in the HEAD commit of the repository at `repo`.
fn head_of(repo: &Path, path: &str) -> FleetSnapshot {
    let location = Location {
        repo: repo.to_path_buf(),
        rev: Some("HEAD".into()),
        path: path.into(),
        worktree: false,
    };
    source::read(&location).expect("the commit is readable")
}

fn commit_all(dir: &Path) -> bool {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_SYSTEM", "/dev/null")
            .status()
            .is_ok_and(|s| s.success())
    };
    git(&["init", "-q", "-b", "main"])
        && git(&["add", "-A"])
        && git(&[
            "-c",
            "user.name=flotilla test",
            "-c",
            "user.email=test@flotilla.invalid",
            "commit",
            "-q",
            "-m",
            "fleet",
        ])
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create folder");
    for entry in std::fs::read_dir(from).expect("read folder") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else if entry.file_name() != "expected.txt" {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

mod never_panics {
    //! Bad input never panics: random bytes, YAML-looking noise and mutations of
    //! valid files, put in the place of each kind of fleet file, always come back
    //! as a render (with diagnostics), never as a panic.

    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    const VALID: &[(&str, &str)] = &[
        (
            "clusters/edge-1.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge-1\n  labels: {region: eu}\nspec:\n  vars: {site: S1, replicas: 2}\n",
        ),
        (
            "groups/eu.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Group\nmetadata:\n  name: eu\nspec:\n  selector:\n    matchExpressions:\n      - {key: region, operator: In, values: [eu]}\n  vars: {mirror: eu.example.com}\n",
        ),
        (
            "workloads/web/workload.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: web\nspec:\n  namespace: web\n  targets:\n    - group: eu\n    - clusterSelector: {matchLabels: {region: eu}}\n  vars: {replicas: 1}\n",
        ),
        (
            "workloads/web/manifests/deployment.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  replicas: 1\n  template:\n    spec:\n      containers:\n        - {name: web, image: nginx:1.27}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: web\n",
        ),
        (
            "workloads/web/manifests/config.yaml.j2",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-{{ cluster.name }}\ndata:\n  site: \"{{ cluster.vars.site }}\"\n  replicas: \"{{ vars.replicas }}\"\n{% for k, v in cluster.labels|items %}  {{ k }}: \"{{ v }}\"\n{% endfor %}",
        ),
        (
            "workloads/api/workload.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: api\nspec:\n  namespace: api\n  targets:\n    - group: eu\n",
        ),
        (
            "workloads/api/kustomization.yaml",
            "namePrefix: edge-\nresources:\n  - base\nconfigMapGenerator:\n  - name: settings\n    literals: [MODE=blue]\n    envs: [app.env]\npatches:\n  - path: patch.yaml\n  - target: {kind: Deployment}\n    patch: |-\n      - {op: add, path: /spec/paused, value: false}\n",
        ),
        (
            "workloads/api/base/kustomization.yaml",
            "resources: [deployment.yaml]\ncommonLabels: {app: api}\n",
        ),
        (
            "workloads/api/base/deployment.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  template:\n    spec:\n      containers:\n        - name: api\n          image: api:1\n          envFrom: [{configMapRef: {name: settings}}]\n",
        ),
        (
            "workloads/api/patch.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api}\nspec:\n  template:\n    spec:\n      containers:\n        - name: api\n          env: [{name: A, value: b}]\n",
        ),
        ("workloads/api/app.env", "LOG=debug\n"),
        (
            "overlays/eu.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: eu\nspec:\n  groups: [eu]\n  images:\n    - {name: nginx, newName: mirror/nginx, newTag: '1.28'}\n  patches:\n    - target: {kind: Deployment, labelSelector: 'app in (web)'}\n      ops:\n        - {op: add, path: /spec/replicas, value: 3}\n    - target: {kind: ConfigMap, name: 'web-.*'}\n      merge: {data: {extra: 'yes'}}\n    - target: {kind: Deployment|StatefulSet, name: web}\n      strategic: {spec: {template: {spec: {containers: [{name: web, env: [{name: X, value: y}]}]}}}}\n  labels: {team: edge}\n",
        ),
    ];

    fn fleet_with(path: &str, text: &str) -> FleetSnapshot {
        let mut snapshot = FleetSnapshot::from_files(VALID.iter().copied());
        snapshot.files.insert(path.to_string(), text.into());
        snapshot
    }

    /// Text made of YAML's structural pieces, so the parser gets past the first byte.
    fn yamlish() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("\n".to_string()),
            Just("  ".to_string()),
            Just("- ".to_string()),
            Just(": ".to_string()),
            Just("---\n".to_string()),
            Just("&a ".to_string()),
            Just("*a".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(", ".to_string()),
            Just("!!str ".to_string()),
            Just("? ".to_string()),
            Just("|\n".to_string()),
            Just("\"".to_string()),
            Just("'".to_string()),
            Just("#".to_string()),
            Just("{{ ".to_string()),
            Just(" }}".to_string()),
            Just("{% if x %}".to_string()),
            Just("{% endif %}".to_string()),
            Just("apiVersion: flotilla.dev/v1alpha1\n".to_string()),
            Just("kind: Cluster\n".to_string()),
            Just("metadata:\n  name: edge-1\n".to_string()),
            Just("spec:\n".to_string()),
            Just("~".to_string()),
            Just("1e309".to_string()),
            Just("-0".to_string()),
            "[a-zA-Z0-9_./-]{1,8}",
        ];
        prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
    }

    /// A valid file with a few characters deleted, replaced or inserted.
    fn mutated(index: usize) -> impl Strategy<Value = String> {
        let text = VALID[index].1.to_string();
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<char>()), 1..6).prop_map(
            move |edits| {
                let mut chars: Vec<char> = text.chars().collect();
                for (at, action, c) in edits {
                    if chars.is_empty() {
                        chars.push(c);
                        continue;
                    }
                    let i = at.index(chars.len());
                    match action {
                        0 => {
                            chars.remove(i);
                        }
                        1 => chars[i] = c,
                        _ => chars.insert(i, c),
                    }
                }
                chars.into_iter().collect()
            },
        )
    }

    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            yamlish(),
            prop::collection::vec(any::<u8>(), 0..200)
                .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            "\\PC{0,200}",
        ]
    }

    /// 64 cases by default to keep the suite fast; `PROPTEST_CASES=5000` searches harder.
    fn config() -> ProptestConfig {
        let mut config = ProptestConfig::default();
        if std::env::var_os("PROPTEST_CASES").is_none() {
            config.cases = 64;
        }
        config
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn random_text_in_any_file(index in 0..VALID.len(), text in any_text()) {
            let output = render(&fleet_with(VALID[index].0, &text));
            for diagnostic in &output.diagnostics {
                prop_assert!(diagnostic.file.is_some(), "{}", diagnostic);
            }
        }

        #[test]
        fn mutated_valid_files(
            (index, text) in (0..VALID.len()).prop_flat_map(|i| (Just(i), mutated(i)))
        ) {
            let output = render(&fleet_with(VALID[index].0, &text));
            for diagnostic in &output.diagnostics {
                prop_assert!(diagnostic.file.is_some(), "{}", diagnostic);
            }
        }
    }

    #[test]
    fn the_valid_fleet_renders_cleanly() {
        // The mutations start from a fleet that works, so they reach deep code.
        let output = render(&FleetSnapshot::from_files(VALID.iter().copied()));
        assert!(output.is_clean(), "{:?}", output.diagnostics);
        // web's Deployment, Namespace and ConfigMap; api's Deployment and ConfigMap.
        assert_eq!(output.bundles["edge-1"].resources.len(), 5);
    }
}

/// Deep nesting is refused by the parser's limits instead of overflowing the stack,
/// in flotilla's own files, in manifests and in template output.
#[test]
fn deep_nesting_is_refused_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for path in [
        "clusters/edge-1.yaml",
        "workloads/web/manifests/deep.yaml",
        "workloads/web/manifests/deep.yaml.j2",
    ] {
        let output = render(&FleetSnapshot::from_files([
            (
                "workloads/web/workload.yaml",
                "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: web\nspec:\n  targets:\n    - clusterSelector: {}\n",
            ),
            (
                "clusters/edge-2.yaml",
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge-2\n",
            ),
            (path, deep.as_str()),
        ]));
        assert!(
            output.errors().any(|d| d.file.as_deref() == Some(path)),
            "{path}: {:?}",
            output.diagnostics
        );
    }
}

/// The fleet every generated case below starts from: one cluster, one group, one
/// workload with a ConfigMap.
fn small_fleet(to: &Path) {
    copy_tree(&corpus().join("template-runs-out-of-fuel"), to);
    std::fs::remove_file(to.join("workloads/web/manifests/config.yaml.j2")).expect("remove");
    std::fs::write(
        to.join("workloads/web/manifests/config.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\ndata:\n  a: \"1\"\n",
    )
    .expect("write the ConfigMap");
}

fn lines(output: &RenderOutput) -> Vec<String> {
    output
        .diagnostics
        .iter()
        .map(Diagnostic::to_string)
        .collect()
}

/// A Git tree 4,000 folders deep used to overflow the stack of the recursive tree
/// walk; the walk keeps its own stack now, and the overlay at the bottom is read.
#[test]
fn git_tree_thousands_of_folders_deep() {
    let dir = tempfile::tempdir().expect("temp dir");
    small_fleet(dir.path());
    if !commit_all(dir.path()) {
        eprintln!("skipping: the git command is not available");
        return;
    }
    let repo = git2::Repository::open(dir.path()).expect("open");
    let overlay = "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: deep\nspec:\n  clusterSelector: {}\n  labels: {depth: \"4000\"}\n";
    let blob = repo.blob(overlay.as_bytes()).expect("blob");
    let mut builder = repo.treebuilder(None).expect("tree builder");
    builder.insert("deep.yaml", blob, 0o100644).expect("insert");
    let mut tree = builder.write().expect("tree");
    for _ in 0..4000 {
        let mut builder = repo.treebuilder(None).expect("tree builder");
        builder.insert("d", tree, 0o040000).expect("insert");
        tree = builder.write().expect("tree");
    }
    let head = repo.head().expect("head").peel_to_commit().expect("commit");
    let mut root = repo
        .treebuilder(Some(&head.tree().expect("tree")))
        .expect("builder");
    root.insert("overlays", tree, 0o040000).expect("insert");
    let root = repo
        .find_tree(root.write().expect("root"))
        .expect("root tree");
    let signature = git2::Signature::now("flotilla test", "test@flotilla.invalid").expect("sig");
    repo.commit(
        Some("HEAD"),
        &signature,
        &signature,
        "deep",
        &root,
        &[&head],
    )
    .expect("commit");

    let snapshot = head_of(dir.path(), "");
    let deep_path = format!("overlays/{}deep.yaml", "d/".repeat(4000));
    assert!(snapshot.files.contains_key(&deep_path));
    let output = render(&snapshot);
    assert!(output.is_clean(), "{:?}", lines(&output));
    let bundle = &output.bundles["edge-1"];
    assert_eq!(
        bundle.resources[0].value()["metadata"]["labels"]["depth"],
        "4000"
    );
}

/// 400 paths to one 4 MB blob: Git stores it once, but every path is read and
/// parsed, so every path counts against the fleet's budget (256 MiB by default).
#[test]
fn fleet_budget_counts_every_path_to_a_shared_blob() {
    let dir = tempfile::tempdir().expect("temp dir");
    small_fleet(dir.path());
    if !commit_all(dir.path()) {
        eprintln!("skipping: the git command is not available");
        return;
    }
    let repo = git2::Repository::open(dir.path()).expect("open");
    let mut content = String::from("# one of 400 paths to the same blob\n");
    content.push_str(&"#".repeat(4_000_000 - content.len() - 1));
    content.push('\n');
    let blob = repo.blob(content.as_bytes()).expect("blob");
    let head = repo.head().expect("head").peel_to_commit().expect("commit");
    let head_tree = head.tree().expect("tree");
    let manifests_id = head_tree
        .get_path(Path::new("workloads/web/manifests"))
        .expect("manifests")
        .id();
    let mut manifests = repo
        .treebuilder(Some(&repo.find_tree(manifests_id).expect("tree")))
        .expect("builder");
    for index in 0..400 {
        manifests
            .insert(format!("f{index:03}.yaml"), blob, 0o100644)
            .expect("insert");
    }
    let manifests = manifests.write().expect("manifests");
    let web_id = head_tree
        .get_path(Path::new("workloads/web"))
        .expect("web")
        .id();
    let mut web = repo
        .treebuilder(Some(&repo.find_tree(web_id).expect("tree")))
        .expect("builder");
    web.insert("manifests", manifests, 0o040000)
        .expect("insert");
    let web = web.write().expect("web");
    let mut workloads = repo.treebuilder(None).expect("builder");
    workloads.insert("web", web, 0o040000).expect("insert");
    let workloads = workloads.write().expect("workloads");
    let mut root = repo.treebuilder(Some(&head_tree)).expect("builder");
    root.insert("workloads", workloads, 0o040000)
        .expect("insert");
    let root = repo
        .find_tree(root.write().expect("root"))
        .expect("root tree");
    let signature = git2::Signature::now("flotilla test", "test@flotilla.invalid").expect("sig");
    repo.commit(
        Some("HEAD"),
        &signature,
        &signature,
        "400 paths",
        &root,
        &[&head],
    )
    .expect("commit");

    let snapshot = head_of(dir.path(), "");
    let problems: Vec<String> = snapshot
        .problems
        .iter()
        .map(Diagnostic::to_string)
        .collect();
    assert_eq!(
        problems,
        [
            "workloads/web/manifests/f067.yaml: the fleet's files come to more than 268435456 bytes \
          (--max-fleet-bytes, every path counted) with this one; it and the files after it were not read"
        ]
    );
    let read: u64 = snapshot.files.values().map(|text| text.len() as u64).sum();
    assert!(read <= flotilla_core::limits::Limits::DEFAULT_MAX_FLEET_BYTES);
    let shared = snapshot
        .files
        .keys()
        .filter(|path| path.contains("/f"))
        .count();
    assert_eq!(
        shared, 67,
        "the 67 paths within the budget are read, none after"
    );
    // Rendered, the fleet read in part gives that one error, not one for each file
    // read (each of them is four megabytes of comments, no overlay).
    assert!(snapshot.incomplete);
    let output = render(&snapshot);
    assert_eq!(lines(&output), problems);
    assert!(output.bundles.is_empty());
}

/// A resource may not be larger than the API server would accept (3 MiB by default).
#[test]
fn resource_over_the_size_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    small_fleet(dir.path());
    let mut text =
        String::from("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  blob: \"");
    text.push_str(&"x".repeat(3_500_000));
    text.push_str("\"\n");
    std::fs::write(dir.path().join("workloads/web/manifests/big.yaml"), &text).expect("write");
    let snapshot = source::from_folder(dir.path(), "").expect("readable");
    let output = render(&snapshot);
    assert_eq!(
        lines(&output),
        [
            "workloads/web/manifests/big.yaml:1: ConfigMap web/big is 3500101 bytes as JSON, over the \
          limit of 3145728 bytes for one resource (--max-resource-bytes) (cluster edge-1, workload web)"
        ]
    );
    assert!(output.bundles.is_empty());
}

/// A bundle larger than an agent accepts is a render error naming the cluster, so
/// the hub never serves a bundle its agents would refuse every time they ask.
#[test]
fn bundle_over_the_agents_limit() {
    use flotilla_core::bundle::{BUNDLE_ENVELOPE_BYTES, MAX_BUNDLE_BYTES};
    let dir = tempfile::tempdir().expect("temp dir");
    small_fleet(dir.path());
    // Each ConfigMap is within the limit for one resource; together they are not
    // within the limit for a bundle.
    let blob = "x".repeat(3_000_000);
    let count = MAX_BUNDLE_BYTES / blob.len() + 1;
    for index in 0..count {
        std::fs::write(
            dir.path()
                .join(format!("workloads/web/manifests/big-{index:02}.yaml")),
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big-{index:02}\ndata:\n  blob: {blob}\n"
            ),
        )
        .expect("write");
    }
    let snapshot = source::from_folder(dir.path(), "").expect("readable");
    let output = render(&snapshot);
    let limit = MAX_BUNDLE_BYTES - BUNDLE_ENVELOPE_BYTES;
    assert_eq!(
        lines(&output),
        [format!(
            "clusters/edge-1.yaml: the bundle of cluster edge-1 is 69002523 bytes as JSON, over \
             the limit of {limit} bytes for a bundle's resources (an agent accepts a bundle of at \
             most {MAX_BUNDLE_BYTES} bytes); its largest resource is ConfigMap web/big-00 \
             (3000104 bytes) (cluster edge-1)"
        )]
    );
    assert!(output.bundles.is_empty());
    assert!(!output.is_clean());
}

/// A render past its deadline is abandoned between units of work and names the
/// file it was busy with; it does not run on to the end.
#[test]
fn a_render_past_its_deadline_is_abandoned() {
    let dir = tempfile::tempdir().expect("temp dir");
    small_fleet(dir.path());
    // Enough clusters that the deadline falls while templates render, even when a
    // busy machine (the whole suite at once on two cores) slows reading and
    // compiling the fleet: 2,000 clusters take several times the 3 s deadline.
    for index in 2..=2000 {
        std::fs::write(
            dir.path().join(format!("clusters/edge-{index}.yaml")),
            format!("apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge-{index}\n  labels:\n    region: eu\n"),
        )
        .expect("write a cluster");
    }
    // About 600,000 instructions for each cluster: within the fuel, but 2,000 of
    // them take far longer than the deadline.
    std::fs::write(
        dir.path().join("workloads/web/manifests/slow.yaml.j2"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slow\ndata:\n  n: \"{% for i in range(100000) %}{% if i < 0 %}{{ i }}{% endif %}{% endfor %}{{ cluster.name }}\"\n",
    )
    .expect("write the template");
    let snapshot = source::from_folder(dir.path(), "").expect("readable");
    let limits = flotilla_core::limits::Limits {
        render_timeout: std::time::Duration::from_millis(3000),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let output = flotilla_render::render_with(
        &snapshot,
        &flotilla_render::RenderOptions {
            limits,
            ..Default::default()
        },
    );
    let took = started.elapsed();
    assert_eq!(
        lines(&output),
        [
            "workloads/web/manifests/slow.yaml.j2: the render took longer than 3s \
          (--render-timeout) and was abandoned while this file was being rendered"
        ]
    );
    assert!(output.bundles.is_empty());
    assert!(
        took < std::time::Duration::from_secs(10),
        "stopped soon after its deadline: {took:?}"
    );

    let cancel = std::sync::atomic::AtomicBool::new(true);
    let output = flotilla_render::render_with(
        &snapshot,
        &flotilla_render::RenderOptions {
            cancel: Some(&cancel),
            ..Default::default()
        },
    );
    assert_eq!(lines(&output), ["the render was cancelled"]);
}
