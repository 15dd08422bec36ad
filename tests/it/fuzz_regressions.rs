//! Every input the fuzz targets were seeded with (`fuzz/seeds/<target>/`) and every
//! finding of theirs (`fuzz/regressions/<target>/`, one file per finding, named for
//! what it found) runs through the same checks as the fuzzer's, on every
//! `cargo test`: a finding fixed once stays fixed, without a fuzzer installed.

#[path = "../../fuzz/checks/mod.rs"]
mod checks;

use std::path::Path;

fn run(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut ran = 0;
    for folder in ["seeds", "regressions"] {
        let dir = root.join(folder).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            let data = std::fs::read(&path).expect("read the input");
            // On a thread with the stack a render or rayon thread has (2 MiB), in a
            // debug build whose frames are larger: no input may need more.
            let name = path.display().to_string();
            std::thread::Builder::new()
                .stack_size(2 * 1024 * 1024)
                .spawn(move || check(&data))
                .expect("thread")
                .join()
                .unwrap_or_else(|_| panic!("{name} fails the {target} check"));
            ran += 1;
        }
    }
    assert!(ran > 0, "no input for the {target} target");
}

#[test]
fn yaml() {
    run("yaml", checks::yaml);
}

#[test]
fn patch() {
    run("patch", checks::patch);
}

#[test]
fn template() {
    run("template", checks::template);
}

#[test]
fn render_workload() {
    run("render_workload", checks::render_workload);
}

#[test]
fn bundle_document() {
    run("bundle_document", checks::bundle_document);
}

#[test]
fn status_report() {
    run("status_report", checks::status_report);
}
