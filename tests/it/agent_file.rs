//! The real agent, in process, reading a `flotilla publish` folder through `file://`
//! (an air-gapped site) and writing through the `dir` sink, all in temp folders.
//! Time is paused: the agent's waits pass as soon as nothing else can run.

use crate::support::agent as agent_support;

use std::path::Path;
use std::time::Duration;

use agent_support::*;
use flotilla_agent::client::Server;
use flotilla_agent::sink::dir::DirSink;
use flotilla_agent::wait::Wait;
use flotilla_agent::{Agent, AgentConfig};
use flotilla_core::bundle::Digest;
use flotilla_core::status::{ResourceState, StatusReport};
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

struct Running {
    reports: watch::Receiver<Option<StatusReport>>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), flotilla_agent::AgentError>>,
}

impl Running {
    /// Waits (in paused time, so at once unless the agent is stuck) for a report.
    async fn until(&mut self, what: &str, test: impl Fn(&StatusReport) -> bool) -> StatusReport {
        let wait = self.reports.wait_for(|r| r.as_ref().is_some_and(&test));
        let found = match tokio::time::timeout(Duration::from_secs(3600), wait).await {
            Ok(Ok(report)) => report.clone(),
            _ => None,
        };
        match found {
            Some(report) => report,
            None => panic!(
                "the agent never reported {what}; last report: {:?}",
                self.reports.borrow()
            ),
        }
    }

    async fn applied(&mut self, digest: &Digest) -> StatusReport {
        self.until(&format!("applied {digest}"), |r| {
            r.applied.as_ref() == Some(digest) && r.attempted.as_ref() == Some(digest)
        })
        .await
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("the agent task did not panic")
            .expect("the agent ran");
    }
}

fn start(publish: &Path, state: &Path, target: &Path) -> Running {
    let mut config = AgentConfig::new(
        Server::File(publish.to_path_buf()),
        "edge-1",
        state.to_path_buf(),
    );
    config.wait = Wait::Fixed(Duration::from_secs(5));
    let agent = Agent::new(config, DirSink::new(target, state, false));
    let reports = agent.reports();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    Running {
        reports,
        stop,
        task,
    }
}

struct Dirs {
    publish: tempfile::TempDir,
    state: tempfile::TempDir,
    target: tempfile::TempDir,
}

fn dirs() -> Dirs {
    Dirs {
        publish: tempfile::tempdir().expect("tempdir"),
        state: tempfile::tempdir().expect("tempdir"),
        target: tempfile::tempdir().expect("tempdir"),
    }
}

impl Dirs {
    fn start(&self) -> Running {
        start(self.publish.path(), self.state.path(), self.target.path())
    }
}

#[tokio::test(start_paused = true)]
async fn a_rendered_bundle_from_a_publish_folder_becomes_one_file_per_resource() {
    let snapshot = flotilla_hub::source::from_folder(Path::new("fleet-example"), "")
        .expect("reads the example fleet");
    let output = flotilla_render::render(&snapshot);
    assert!(output.is_clean(), "the example fleet renders");
    let (cluster, rendered) = output
        .bundles
        .iter()
        .find(|(_, b)| b.resources.len() >= 3)
        .expect("a cluster with a few resources");
    let dirs = dirs();
    publish_document(
        dirs.publish.path(),
        cluster,
        &rendered.document(&output.revision),
    );
    let mut config = AgentConfig::new(
        Server::File(dirs.publish.path().to_path_buf()),
        cluster,
        dirs.state.path().to_path_buf(),
    );
    config.wait = Wait::Fixed(Duration::from_secs(5));
    let agent = Agent::new(
        config,
        DirSink::new(dirs.target.path(), dirs.state.path(), false),
    );
    let reports = agent.reports();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    let mut running = Running {
        reports,
        stop,
        task,
    };
    let report = running.applied(&rendered.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert_eq!(report.resources.len(), rendered.resources.len());

    let files = yaml_files(dirs.target.path());
    assert_eq!(files.len(), rendered.resources.len());
    for resource in &rendered.resources {
        let name = flotilla_agent::sink::dir::file_name(&resource.key);
        let text = files.get(&name).unwrap_or_else(|| panic!("{name} written"));
        let mut written: Value = serde_saphyr::from_str(text).expect("valid YAML");
        assert_eq!(
            written["metadata"]["labels"]["flotilla.dev/cluster"],
            cluster.as_str()
        );
        // Apart from the cluster label, the file holds the resource as rendered.
        let labels = written["metadata"]["labels"]
            .as_object_mut()
            .expect("labels");
        labels.remove("flotilla.dev/cluster");
        if labels.is_empty() {
            written["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("labels");
        }
        assert_eq!(written, resource.value(), "{name}");
    }
    // The last-known-good bundle is the published document, byte for byte.
    assert_eq!(
        std::fs::read(dirs.state.path().join("bundle.json")).expect("kept"),
        rendered.document(&output.revision)
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_resource_that_leaves_the_bundle_loses_its_file() {
    let dirs = dirs();
    std::fs::write(dirs.target.path().join("operator.yaml"), "kind: Mine\n").expect("writes");
    let first = bundle(
        "edge-1",
        vec![
            config_map("a", "1"),
            config_map("b", "1"),
            namespace("demo"),
        ],
    );
    publish(dirs.publish.path(), &first);
    let mut running = dirs.start();
    running.applied(&first.digest).await;
    assert_eq!(
        yaml_names(dirs.target.path()),
        [
            namespace_file("demo"),
            config_map_file("a"),
            config_map_file("b"),
            "operator.yaml".to_string(),
        ]
    );

    let second = bundle("edge-1", vec![config_map("b", "2"), namespace("demo")]);
    publish(dirs.publish.path(), &second);
    let report = running.applied(&second.digest).await;
    assert_eq!(
        yaml_names(dirs.target.path()),
        [
            namespace_file("demo"),
            config_map_file("b"),
            "operator.yaml".to_string(),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dirs.target.path().join("operator.yaml")).expect("kept"),
        "kind: Mine\n"
    );
    let pruned: Vec<&str> = report
        .resources
        .iter()
        .filter(|r| r.state == ResourceState::Pruned)
        .map(|r| r.key.name())
        .collect();
    assert_eq!(pruned, ["a"]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_tampered_bundle_is_refused_and_the_last_known_good_stays() {
    let dirs = dirs();
    let good = bundle("edge-1", vec![config_map("a", "good")]);
    publish(dirs.publish.path(), &good);
    let mut running = dirs.start();
    running.applied(&good.digest).await;
    let kept_document = std::fs::read(dirs.state.path().join("bundle.json")).expect("kept");

    // Someone changes a value in the published file but keeps the digest.
    let tampered = String::from_utf8(good.document("main@sha1:test"))
        .expect("utf-8")
        .replace("\"good\"", "\"evil\"");
    publish_document(dirs.publish.path(), "edge-1", tampered.as_bytes());
    let refused = running
        .until("a refusal", |r| r.message.contains("digest mismatch"))
        .await;
    assert!(
        refused.message.contains("keeping the last-known-good"),
        "{}",
        refused.message
    );
    assert_eq!(refused.applied, Some(good.digest.clone()));

    let file = std::fs::read_to_string(dirs.target.path().join(config_map_file("a")))
        .expect("still there");
    assert!(file.contains("good") && !file.contains("evil"), "{file}");
    assert_eq!(
        std::fs::read(dirs.state.path().join("bundle.json")).expect("kept"),
        kept_document
    );
    running.stop().await;
    let stored = stored_status(dirs.state.path()).expect("status kept");
    assert!(
        stored["report"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("digest mismatch")),
        "{stored}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_applies_its_last_known_good_bundle_with_no_source_at_all() {
    let dirs = dirs();
    let good = bundle("edge-1", vec![config_map("a", "1"), namespace("demo")]);
    publish(dirs.publish.path(), &good);
    let mut running = dirs.start();
    running.applied(&good.digest).await;
    running.stop().await;

    // The site reboots offline: the source is gone and so are the applied files.
    std::fs::remove_dir_all(dirs.publish.path().join("v1")).expect("source gone");
    for name in yaml_names(dirs.target.path()) {
        std::fs::remove_file(dirs.target.path().join(name)).expect("removes");
    }
    let mut running = dirs.start();
    let report = running.applied(&good.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert_eq!(
        yaml_names(dirs.target.path()),
        [namespace_file("demo"), config_map_file("a")]
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_damaged_state_folder_still_starts_and_recovers_from_the_source() {
    let dirs = dirs();
    let good = bundle("edge-1", vec![config_map("a", "1")]);
    publish(dirs.publish.path(), &good);
    // What a power cut on a bad disk could leave: garbage in every state file, and
    // temporary files half written.
    for name in [
        "bundle.json",
        "inventory.json",
        "status.json",
        "dir-sink.json",
    ] {
        std::fs::write(dirs.state.path().join(name), b"\0\0garbage").expect("writes");
        std::fs::write(dirs.state.path().join(format!(".{name}.tmp")), b"{").expect("writes");
    }
    let mut running = dirs.start();
    running.applied(&good.digest).await;
    assert_eq!(yaml_names(dirs.target.path()), [config_map_file("a")]);
    running.stop().await;
    assert!(dirs.state.path().join("bundle.json.damaged").exists());
}
