//! The kustomize corpus: every folder under `tests/kustomize/` is a small fleet root
//! whose `workloads/app/` is a kustomize base (a kustomization with its resources,
//! patches and generator inputs, and sometimes bases and components elsewhere in the
//! fleet). Each is built by flotilla as a workload and by `kubectl kustomize` on the
//! same folder, and the two are compared resource by resource.
//!
//! Without `kubectl` the comparison prints that it skips and why, and passes; in CI
//! (`FLOTILLA_CI=1`) it fails instead. What does not need kubectl (every case builds
//! without a diagnostic) runs everywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use flotilla_core::bundle::{ResourceKey, write_canonical};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kustomize")
}

fn cases() -> Vec<String> {
    let mut cases: Vec<String> = std::fs::read_dir(corpus())
        .expect("tests/kustomize exists")
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    cases
}

fn read_tree(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("read folder") {
        let entry = entry.expect("entry");
        let path = entry.path();
        if path.is_dir() {
            read_tree(root, &path, files);
        } else {
            let relative = path
                .strip_prefix(root)
                .expect("inside the case")
                .to_string_lossy()
                .replace('\\', "/");
            files.insert(relative, std::fs::read_to_string(&path).expect("text file"));
        }
    }
}

/// flotilla's resources for a case, by identity, as canonical JSON.
fn flotilla_output(case: &str) -> Result<BTreeMap<ResourceKey, String>, String> {
    let root = corpus().join(case);
    let mut files = BTreeMap::new();
    read_tree(&root, &root, &mut files);
    // The cluster names an agent key, so its Secrets raise no warning; rendered
    // without the hub's seed, nothing is sealed and the output is kustomize's.
    files.insert(
        "clusters/edge.yaml".into(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge\nspec:\n  agentKey: age1saxr9k92hutdtlw48l79eaa2ew9p8u9zy77r4flnh2nf48y8hersq7yrux\n".into(),
    );
    // kustomize's test data is not all valid Kubernetes (integers among a
    // container's args, made-up fields): builds are compared, the schema check is off.
    files.insert(
        "flotilla.yaml".into(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n  validation: off\n".into(),
    );
    files.insert(
        "workloads/app/workload.yaml".into(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  targets:\n    - cluster: edge\n".into(),
    );
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let output = render(&snapshot);
    if !output.diagnostics.is_empty() {
        return Err(output
            .diagnostics
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n"));
    }
    Ok(output.bundles["edge"]
        .resources
        .iter()
        .map(|r| {
            let text = String::from_utf8(r.canonical.to_vec()).expect("UTF-8");
            ((*r.key).clone(), text)
        })
        .collect())
}

fn canonical(value: &Value) -> String {
    let mut bytes = Vec::new();
    write_canonical(&mut bytes, value);
    String::from_utf8(bytes).expect("UTF-8")
}

/// kubectl kustomize's resources for a case, by identity, as canonical JSON.
fn kustomize_output(case: &str) -> Result<BTreeMap<ResourceKey, String>, String> {
    let dir = corpus().join(case).join("workloads/app");
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .map_err(|err| format!("kubectl: {err}"))?;
    if !output.status.success() {
        return Err(format!(
            "kubectl kustomize failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = String::from_utf8(output.stdout).map_err(|e| e.to_string())?;
    // kustomize's output is read as kustomize reads YAML (`- tRUE` is a string).
    let documents = flotilla_render::yaml::parse_documents(&text)
        .map_err(|err| format!("not YAML: {}\n{text}", err.message))?;
    let mut resources = BTreeMap::new();
    for document in documents {
        let key = ResourceKey::of(&document.value).ok_or("a resource without identity")?;
        resources.insert(key, canonical(&document.value));
    }
    Ok(resources)
}

/// The differences between two outputs, one line per resource.
fn differences(
    ours: &BTreeMap<ResourceKey, String>,
    theirs: &BTreeMap<ResourceKey, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for (key, value) in ours {
        match theirs.get(key) {
            None => found.push(format!("  only flotilla has {key}")),
            Some(other) if other != value => found.push(format!(
                "  {key} differs\n    flotilla:  {value}\n    kustomize: {other}"
            )),
            Some(_) => {}
        }
    }
    for key in theirs.keys().filter(|k| !ours.contains_key(*k)) {
        found.push(format!("  only kustomize has {key}"));
    }
    found
}

#[test]
fn the_corpus_has_at_least_thirty_cases() {
    let cases = cases();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    for case in &cases {
        assert!(
            corpus()
                .join(case)
                .join("workloads/app/kustomization.yaml")
                .is_file(),
            "{case} has no workloads/app/kustomization.yaml"
        );
    }
}

#[test]
fn every_case_builds_without_a_diagnostic() {
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|case| match flotilla_output(case) {
            Ok(resources) if resources.is_empty() => Some(format!("{case}: no resources")),
            Ok(_) => None,
            Err(diagnostics) => Some(format!("{case}:\n{diagnostics}")),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_case_matches_kubectl_kustomize_resource_by_resource() {
    if !flotilla_testkit::can_run(
        "kustomize_corpus: every case compared with `kubectl kustomize`",
        flotilla_testkit::command_works("kubectl", &["version", "--client"]).err(),
    ) {
        return;
    }
    let cases = cases();
    let mut failures = Vec::new();
    for case in &cases {
        let ours = match flotilla_output(case) {
            Ok(resources) => resources,
            Err(diagnostics) => {
                failures.push(format!("{case}: flotilla failed:\n{diagnostics}"));
                continue;
            }
        };
        let theirs = match kustomize_output(case) {
            Ok(resources) => resources,
            Err(err) => {
                failures.push(format!("{case}: {err}"));
                continue;
            }
        };
        let found = differences(&ours, &theirs);
        if !found.is_empty() {
            failures.push(format!("{case}:\n{}", found.join("\n")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from kubectl kustomize:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!(
        "kustomize corpus: {} cases, each identical to kubectl kustomize",
        cases.len()
    );
}
