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
fn errors_fail_validate_with_or_without_strict() {
    for strict in [false, true] {
        let output = validate("kustomize-transformer-errors", strict);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("the fleet is invalid"), "{stderr}");
    }
}
