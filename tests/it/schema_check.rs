//! The schema check of rendered resources through the real binary, on copies of
//! `fleet-example/`: `replica: 3` in a Deployment is a warning by default (and fails
//! `validate --strict`), an error under `validation: strict`, nothing under `off`;
//! a custom resource is checked against the CRD the fleet ships; an unknown
//! Kubernetes version takes the nearest schema, with a warning.

use std::process::Command;

struct Fleet {
    dir: tempfile::TempDir,
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Fleet {
    /// A copy of fleet-example with the `replica: 3` typo in kuard's Deployment
    /// (which red and blue run).
    fn with_typo() -> Fleet {
        let dir = tempfile::tempdir().expect("a folder");
        let copied = Command::new("cp")
            .args([
                "-r",
                concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example/."),
            ])
            .arg(dir.path())
            .status()
            .expect("cp runs");
        assert!(copied.success());
        let fleet = Fleet { dir };
        fleet.edit(
            "workloads/kuard/manifests/deployment.yaml",
            "  replicas: 1\n",
            "  replica: 3\n",
        );
        fleet
    }

    fn edit(&self, file: &str, from: &str, to: &str) {
        let path = self.dir.path().join(file);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains(from), "{file} does not contain {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).expect("write");
    }

    fn write(&self, file: &str, text: &str) {
        let path = self.dir.path().join(file);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    fn settings(&self, spec: &str) {
        self.write(
            "flotilla.yaml",
            &format!("apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n{spec}"),
        );
    }

    fn validate(&self, strict: bool) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        command.arg("validate").arg("--repo").arg(self.dir.path());
        if strict {
            command.arg("--strict");
        }
        let output = command.output().expect("flotilla runs");
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// The typo's finding: the Deployment's file and line, the field, the clusters.
const TYPO: &str = "workloads/kuard/manifests/deployment.yaml:1: {severity}Deployment.apps kuard/kuard: spec.replica: unknown field (did you mean \"replicas\"?) (Kubernetes 1.36 schema)";

fn typo(severity: &str) -> String {
    TYPO.replace("{severity}", severity)
}

#[test]
fn the_replica_typo_is_a_warning_by_default_and_fails_validate_strict() {
    let fleet = Fleet::with_typo();
    let relaxed = fleet.validate(false);
    assert_eq!(relaxed.code, Some(0), "{}", relaxed.stderr);
    assert!(
        relaxed.stderr.contains(&typo("warning: ")),
        "{}",
        relaxed.stderr
    );
    assert!(
        relaxed.stderr.contains(
            "a warning because spec.validation in flotilla.yaml is warn, the default: set it to strict to make schema problems errors (cluster blue and 1 other cluster, workload kuard)"
        ),
        "{}",
        relaxed.stderr
    );
    assert!(relaxed.stdout.contains("1 warning"), "{}", relaxed.stdout);

    let strict = fleet.validate(true);
    assert_eq!(strict.code, Some(1), "{}", strict.stderr);
    assert!(
        strict.stderr.contains(&typo("warning: ")),
        "{}",
        strict.stderr
    );
    assert!(
        strict.stderr.contains("the fleet is invalid"),
        "{}",
        strict.stderr
    );
}

#[test]
fn under_validation_strict_the_typo_is_an_error() {
    let fleet = Fleet::with_typo();
    fleet.settings("  validation: strict\n");
    let run = fleet.validate(false);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "{} (cluster blue and 1 other cluster, workload kuard)",
            typo("")
        )),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("a warning because"), "{}", run.stderr);
}

#[test]
fn under_validation_off_nothing_is_checked() {
    let fleet = Fleet::with_typo();
    fleet.settings("  validation: off\n");
    let run = fleet.validate(true);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(!run.stderr.contains("spec.replica"), "{}", run.stderr);
}

#[test]
fn an_unknown_validation_value_is_an_error_at_its_line() {
    let fleet = Fleet::with_typo();
    fleet.settings("  validation: loose\n");
    let run = fleet.validate(false);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("flotilla.yaml:4:"), "{}", run.stderr);
    assert!(run.stderr.contains("loose"), "{}", run.stderr);
}

#[test]
fn an_unknown_kubernetes_version_takes_the_nearest_with_a_warning() {
    let fleet = Fleet::with_typo();
    fleet.edit(
        "clusters/blue.yaml",
        "  vars: {}\n",
        "  vars: {}\n  kubernetes:\n    version: v1.45.2\n",
    );
    let run = fleet.validate(false);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "clusters/blue.yaml: warning: Kubernetes version \"v1.45.2\" has no schema in flotilla (it has 1.25 to 1.37): resources are checked against 1.37, the nearest (cluster blue)"
        ),
        "{}",
        run.stderr
    );
    // blue's resources are checked against 1.37, red's against the default 1.36.
    assert!(
        run.stderr.contains(
            "spec.replica: unknown field (did you mean \"replicas\"?) (Kubernetes 1.37 schema)"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("(Kubernetes 1.36 schema); a warning because spec.validation in flotilla.yaml is warn, the default: set it to strict to make schema problems errors (cluster red, workload kuard)"),
        "{}",
        run.stderr
    );
}

const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: backups.example.com
spec:
  group: example.com
  names: {kind: Backup, plural: backups, singular: backup, listKind: BackupList}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [schedule]
              properties:
                schedule: {type: string}
                keep: {type: integer}
";

#[test]
fn a_custom_resource_is_checked_against_the_crd_the_fleet_ships() {
    let fleet = Fleet::with_typo();
    fleet.settings("  validation: strict\n");
    fleet.edit(
        "workloads/kuard/manifests/deployment.yaml",
        "  replica: 3\n",
        "  replicas: 3\n",
    );
    // In a workload of the platform's (a tenant may not ship CRDs).
    fleet.write("workloads/telemetry-agent/manifests/crd.yaml", CRD);
    fleet.write(
        "workloads/telemetry-agent/manifests/backup.yaml",
        "apiVersion: example.com/v1\nkind: Backup\nmetadata:\n  name: nightly\nspec:\n  schedule: \"@daily\"\n  keep: \"7\"\n  retain: 3\n",
    );
    fleet.write(
        "workloads/telemetry-agent/manifests/monitor.yaml",
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: kuard\nspec:\n  anything: 1\n",
    );
    let run = fleet.validate(false);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    for expected in [
        "workloads/telemetry-agent/manifests/backup.yaml:1: Backup.example.com telemetry/nightly: spec.keep: expected an integer, found a string (Kubernetes 1.36 schema) (cluster ",
        "workloads/telemetry-agent/manifests/backup.yaml:1: Backup.example.com telemetry/nightly: spec.retain: unknown field (Kubernetes 1.36 schema) (cluster ",
        // A kind no CRD of the fleet defines is not checked, and says so under strict.
        "workloads/telemetry-agent/manifests/monitor.yaml:1: warning: ServiceMonitor.monitoring.coreos.com telemetry/kuard: not checked against a schema: no CustomResourceDefinition in the fleet defines monitoring.coreos.com/v1/ServiceMonitor (cluster ",
        "2 errors, 1 warning: the fleet is invalid",
    ] {
        assert!(
            run.stderr.contains(expected),
            "{expected}\nnot in\n{}",
            run.stderr
        );
    }
    assert!(!run.stderr.contains("spec.replica"), "{}", run.stderr);
}

#[test]
fn fleet_example_has_no_schema_findings_in_any_mode() {
    let fleet = Fleet::with_typo();
    fleet.edit(
        "workloads/kuard/manifests/deployment.yaml",
        "  replica: 3\n",
        "  replicas: 1\n",
    );
    fleet.settings("  validation: strict\n");
    let run = fleet.validate(true);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("0 warnings"), "{}", run.stdout);
}
