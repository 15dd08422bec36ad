//! `flotilla validate` end to end: the real binary on fleets from the bad-input
//! corpus, its exit code and what it prints, with and without `--strict`.

use std::path::Path;
use std::process::{Command, Output};

fn validate(case: &str, strict: bool) -> Output {
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/bad")
        .join(case);
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command.arg("validate").arg("--repo").arg(&fleet);
    if strict {
        command.arg("--strict");
    }
    command.output().expect("flotilla runs")
}

const WARNING: &str = "overlays/typo.yaml:8: warning: the target of this patch of overlay \"typo\" matches no resource on any cluster it applies to";

#[test]
fn a_warning_passes_validate_and_fails_validate_strict() {
    let relaxed = validate("patch-target-matches-nothing-is-a-warning", false);
    let stderr = String::from_utf8_lossy(&relaxed.stderr);
    assert_eq!(relaxed.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(WARNING), "{stderr}");
    assert!(
        String::from_utf8_lossy(&relaxed.stdout).starts_with("valid: 1 cluster rendered"),
        "{}",
        String::from_utf8_lossy(&relaxed.stdout)
    );

    let strict = validate("patch-target-matches-nothing-is-a-warning", true);
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(WARNING), "{stderr}");
    assert!(
        stderr.contains("1 warning, which --strict counts as errors: the fleet is invalid"),
        "{stderr}"
    );
}

#[test]
fn a_tenants_template_that_loads_another_tenants_file_fails_validate() {
    let output = validate("tenant-template-loads-another-tenants-file", false);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "workloads/shop/manifests/receipt.yaml.j2:1: tenant \"team-a\" may not read workloads/till/manifests/key.yaml.j2: a tenant's files may refer only to its own workloads' and overlays' folders and to spec.sharedPaths of tenants/team-a.yaml (none) (cluster north, workload shop)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("the fleet is invalid"), "{stderr}");
}

#[test]
fn errors_fail_validate_with_or_without_strict() {
    for strict in [false, true] {
        let output = validate("kustomize-transformer-errors", strict);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("the fleet is invalid"), "{stderr}");
    }
}

/// `flotilla key sign-tenants` signs the Tenant files' rules with the platform's
/// key; a Tenant file changed afterwards makes the fleet invalid until it is signed
/// again, and every bundle carries the signed rules.
#[test]
fn signed_tenant_rules_follow_the_tenant_files() {
    let dir = tempfile::tempdir().expect("a folder");
    let fleet = dir.path().join("fleet");
    let copy = std::process::Command::new("cp")
        .args(["-r", concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example")])
        .arg(&fleet)
        .status()
        .expect("cp runs");
    assert!(copy.success());
    let run = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .output()
            .expect("flotilla runs");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let key = dir.path().join("platform.key");
    let key_arg = key.to_str().expect("utf-8");
    let fleet_arg = fleet.to_str().expect("utf-8");
    let (code, _, stderr) = run(&["key", "generate", "--out", key_arg]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run(&[
        "key",
        "sign-tenants",
        "--key",
        key_arg,
        "--fleet",
        fleet_arg,
        "--platform-workload",
        "edge-cache",
        "--platform-workload",
        "telemetry-agent",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("signed the rules of 2 tenants"), "{stdout}");
    let (code, stdout, stderr) = run(&["validate", "--repo", fleet_arg]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let out = dir.path().join("out");
    let (code, _, stderr) = run(&[
        "render",
        "--repo",
        fleet_arg,
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let plant: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("plant-eu-01.json")).expect("a bundle"))
            .expect("JSON");
    assert_eq!(
        plant["meta"]["tenantRules"]["rules"]["platformWorkloads"],
        serde_json::json!(["edge-cache", "telemetry-agent"])
    );

    // The demo team widens its namespaces without the platform's signature.
    let demo = fleet.join("tenants/demo.yaml");
    let text = std::fs::read_to_string(&demo).expect("reads");
    std::fs::write(
        &demo,
        text.replace("namespaces: [kuard]", "namespaces: [kuard, kube-system]"),
    )
    .expect("writes");
    let (code, stdout, stderr) = run(&["validate", "--repo", fleet_arg]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains(
            "tenants/rules.signed.json: the signed tenant rules differ from the Tenant files for demo"
        ),
        "{stdout}{stderr}"
    );
    let (code, _, stderr) = run(&[
        "key",
        "sign-tenants",
        "--key",
        key_arg,
        "--fleet",
        fleet_arg,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run(&["validate", "--repo", fleet_arg]);
    assert_eq!(code, 0, "{stdout}{stderr}");
}

/// A fleet of one cluster whose one template doubles a list 40 times
/// (`{% set l = l + l %}`, lines 2 to 41) and writes its length.
fn doubling_fleet() -> tempfile::TempDir {
    let fleet = tempfile::tempdir().expect("a folder");
    let write = |path: &str, text: &str| {
        let path = fleet.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("folders");
        std::fs::write(path, text).expect("written");
    };
    write(
        "clusters/red.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: red\n  labels: {site: shop}\n",
    );
    write(
        "workloads/grow/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: grow\nspec:\n  namespace: grow\n  targets:\n    - clusterSelector: {matchLabels: {site: shop}}\n",
    );
    let doubled = "{% set l = l + l %}\n".repeat(40);
    write(
        "workloads/grow/manifests/grow.yaml.j2",
        &format!(
            "{{% set l = [1] %}}\n{doubled}apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: grow\ndata:\n  n: \"{{{{ l | length }}}}\"\n"
        ),
    );
    fleet
}

/// The attack of a list doubled 40 times (`{% set l = l + l %}`): with the default
/// fuel, `validate` refuses it at once, naming the template and line, where minijinja
/// alone copied billions of items without charging fuel until memory ran out.
#[test]
fn a_list_doubled_runs_out_of_fuel_naming_the_line() {
    let fleet = doubling_fleet();
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["validate", "--repo"])
        .arg(fleet.path())
        .output()
        .expect("flotilla runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    // Each join costs a fuel per item, and the list it makes half a fuel per item: the
    // 19th doubling (line 20, 524,288 items) is the first the fuel left would not pay.
    assert!(
        format!("{stdout}{stderr}").contains(
            "workloads/grow/manifests/grow.yaml.j2:20: the template needs more than 1000000 fuel"
        ),
        "{stdout}{stderr}"
    );
}

/// A template that adds a list to itself again and again, with fuel raised past what
/// memory holds: `validate` stops at `--render-memory` with an error naming the
/// template, instead of taking the machine's memory. (With the default fuel the list
/// is refused long before; see `a_list_doubled_runs_out_of_fuel_naming_the_line`.)
#[test]
fn a_template_past_the_memory_cap_stops_validate_naming_it() {
    let fleet = doubling_fleet();
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        // Fuel enough for a list of billions of items: only the memory cap stops it.
        .args([
            "validate",
            "--render-memory",
            "512MiB",
            "--template-fuel",
            "100000000000",
            "--repo",
        ])
        .arg(fleet.path())
        .output()
        .expect("flotilla runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "error: the render needed more than 512 MiB of memory (--render-memory) and was stopped (it was rendering workloads/grow/manifests/grow.yaml.j2 for cluster red)"
        ),
        "{stderr}"
    );
}
