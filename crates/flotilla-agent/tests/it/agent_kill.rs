//! The real `flotilla-agent` binary, killed with SIGKILL at random moments while it
//! writes, many times over: every time, the state folder it leaves must be one it
//! starts from, and in the end it converges on the published bundle.

use crate::support as agent_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_support::*;
use flotilla_core::bundle::{Bundle, verify_document};
use rand::Rng;
use serde_json::Value;

fn numbered_bundle(generation: usize) -> Bundle {
    // Bundles of a few dozen resources that differ in content and in membership, so
    // every switch writes and removes files.
    let values = (0..40)
        .filter(|i| !(i + generation).is_multiple_of(5))
        .map(|i| {
            config_map(
                &format!("cm-{i:02}"),
                &format!("generation {generation} {}", "x".repeat(2000)),
            )
        })
        .chain(std::iter::once(namespace("demo")))
        .collect();
    bundle("edge-1", values)
}

fn spawn_agent(publish: &Path, state: &Path, target: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flotilla-agent"))
        .args(["--cluster", "edge-1", "--wait", "50ms"])
        .arg("--server")
        .arg(format!("file://{}", publish.display()))
        .arg("--state-dir")
        .arg(state)
        .arg("--sink")
        .arg(format!("dir:{}", target.display()))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the agent binary starts")
}

/// What a start needs from the state folder: every file present is whole.
fn assert_startable(state: &Path, iteration: usize) {
    if let Ok(bytes) = std::fs::read(state.join("bundle.json")) {
        verify_document(&bytes, Some("edge-1")).unwrap_or_else(|err| {
            panic!("iteration {iteration}: the kept bundle does not verify: {err}")
        });
    }
    for name in ["inventory.json", "status.json", "dir-sink.json"] {
        if let Ok(bytes) = std::fs::read(state.join(name)) {
            serde_json::from_slice::<Value>(&bytes)
                .unwrap_or_else(|err| panic!("iteration {iteration}: {name} is torn: {err}"));
        }
    }
}

#[test]
fn killed_at_random_moments_it_always_starts_again_and_converges() {
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    std::fs::write(target.path().join("operator.yaml"), "kind: Mine\n").expect("writes");
    let mut rng = flotilla_testkit::seeded_rng("agent kill test");

    for iteration in 0..30 {
        publish(publish_dir.path(), &numbered_bundle(iteration));
        let mut agent = spawn_agent(publish_dir.path(), state.path(), target.path());
        std::thread::sleep(Duration::from_millis(rng.random_range(5..150)));
        if iteration.is_multiple_of(3) {
            // Change the bundle under a running agent too, so kills also land while it
            // replaces one bundle by another.
            publish(publish_dir.path(), &numbered_bundle(iteration + 100));
            std::thread::sleep(Duration::from_millis(rng.random_range(0..40)));
        }
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("iteration {iteration}: the agent exited by itself with {status}");
        }
        agent.kill().expect("SIGKILL");
        agent.wait().expect("reaped");
        assert_startable(state.path(), iteration);
    }

    let last = numbered_bundle(1000);
    publish(publish_dir.path(), &last);
    let mut agent = spawn_agent(publish_dir.path(), state.path(), target.path());
    let expected: Vec<String> = last
        .resources
        .iter()
        .map(|r| flotilla_agent::sink::dir::file_name(&r.key))
        .chain(std::iter::once("operator.yaml".to_string()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let started = Instant::now();
    let converged = loop {
        let status = stored_status(state.path());
        let applied = status
            .as_ref()
            .and_then(|s| s["report"]["applied"].as_str().map(str::to_string));
        if applied.as_deref() == Some(last.digest.as_str()) && yaml_names(target.path()) == expected
        {
            break true;
        }
        if started.elapsed() > Duration::from_secs(30) {
            break false;
        }
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("the agent exited after the kills with {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let still_running = agent.try_wait().expect("polls").is_none();
    agent.kill().expect("SIGKILL");
    agent.wait().expect("reaped");
    assert!(converged, "files: {:?}", yaml_names(target.path()));
    assert!(still_running);
    assert_eq!(
        std::fs::read_to_string(target.path().join("operator.yaml")).expect("untouched"),
        "kind: Mine\n"
    );
    // No temporary file is left in the target folder, and every file is whole.
    let leftovers: Vec<String> = std::fs::read_dir(target.path())
        .expect("lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| flotilla_fs::is_temporary(n) || n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    for resource in &last.resources {
        let name = flotilla_agent::sink::dir::file_name(&resource.key);
        let text = std::fs::read_to_string(target.path().join(&name)).expect("reads");
        let value: Value = serde_saphyr::from_str(&text).expect("whole YAML");
        let expected = resource.value();
        assert_eq!(value["metadata"]["name"], expected["metadata"]["name"]);
        assert_eq!(value.get("data"), expected.get("data"), "{name}");
    }
}
