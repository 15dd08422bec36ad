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
            .find(|r| r.key.kind == kind)
            .unwrap_or_else(|| panic!("the bundle holds a {kind}"));
        resource.value["metadata"].get("namespace").cloned()
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
            "workloads/web/manifests/big.yaml: file is {} bytes, over the limit of {} bytes; it was not read",
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
    if !commit_all(repo.path()) {
        eprintln!("skipping: the git command is not available");
        return;
    }
    let location = Location {
        repo: repo.path().to_path_buf(),
        rev: Some("HEAD".into()),
        path: "fleet".into(),
        worktree: false,
    };
    let snapshot = source::read(&location).expect("the commit is readable");
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
        ]
    );
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
