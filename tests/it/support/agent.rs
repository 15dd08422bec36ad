//! Helpers shared by the agent's integration tests: bundles, a `flotilla publish`-style
//! folder, and a sleeper that records waits instead of spending them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_agent::backoff::{SleepFuture, Sleeper};
use flotilla_core::bundle::{Bundle, Resource, ResourceKey};
use serde_json::{Value, json};

/// A bundle of the given resources, as the renderer would make it.
pub fn bundle(cluster: &str, values: Vec<Value>) -> Bundle {
    let resources = values
        .into_iter()
        .map(|value| {
            let key = ResourceKey::of(&value).expect("test resources have an identity");
            Arc::new(Resource::new(key, &value))
        })
        .collect();
    Bundle::new(cluster, resources)
}

pub fn config_map(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "demo"}, "data": {"value": value}})
}

pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// The file the dir sink writes for a ConfigMap in namespace `demo`.
pub fn config_map_file(name: &str) -> String {
    flotilla_agent::sink::dir::file_name(&ResourceKey::new("", "ConfigMap", "demo", name))
}

/// The file the dir sink writes for a Namespace.
pub fn namespace_file(name: &str) -> String {
    flotilla_agent::sink::dir::file_name(&ResourceKey::new("", "Namespace", "", name))
}

/// Writes `document` where `flotilla publish` puts a cluster's current bundle, as
/// publish does: its sha256 in the deltas folder first (an agent that holds the
/// document the sha256 names takes the folder as unchanged), then the document,
/// each atomically, so a reader never sees half a file.
pub fn publish_document(root: &Path, cluster: &str, document: &[u8]) {
    let dir = root.join("v1").join("clusters").join(cluster);
    std::fs::create_dir_all(&dir).expect("creates the publish folder");
    let put = |path: PathBuf, bytes: &[u8]| {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).expect("writes");
        std::fs::rename(&tmp, path).expect("renames");
    };
    use flotilla_core::api;
    let deltas = dir.join(api::DELTAS);
    std::fs::create_dir_all(&deltas).expect("creates the deltas folder");
    put(
        deltas.join(api::CURRENT_SHA256),
        api::current_sha256_text(document).as_bytes(),
    );
    put(dir.join(api::CURRENT_BUNDLE), document);
}

pub fn publish(root: &Path, bundle: &Bundle) {
    publish_document(root, &bundle.cluster, &bundle.document("main@sha1:test"));
}

/// The `.yaml` files of a folder and their contents.
pub fn yaml_files(dir: &Path) -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".yaml")
                .then(|| (name, std::fs::read_to_string(e.path()).unwrap_or_default()))
        })
        .collect()
}

/// The names of the `.yaml` files of a folder.
pub fn yaml_names(dir: &Path) -> Vec<String> {
    yaml_files(dir).into_keys().collect()
}

/// The status the agent keeps in its state folder.
pub fn stored_status(state_dir: &Path) -> Option<Value> {
    let bytes = std::fs::read(state_dir.join("status.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Records every wait and lets it pass almost at once (a millisecond of real time,
/// so a loop of failures cannot spin the CPU).
#[derive(Default)]
pub struct RecordingSleeper {
    waits: Mutex<Vec<Duration>>,
}

impl RecordingSleeper {
    pub fn waits(&self) -> Vec<Duration> {
        self.waits.lock().expect("lock").clone()
    }
}

impl Sleeper for RecordingSleeper {
    fn sleep(&self, duration: Duration) -> SleepFuture {
        self.waits.lock().expect("lock").push(duration);
        Box::pin(tokio::time::sleep(Duration::from_millis(1)))
    }
}

/// The real agent, in process, writing through the `dir` sink into a folder: its
/// reports as they come, and a way to stop it.
pub struct RunningAgent {
    pub reports: tokio::sync::watch::Receiver<Option<flotilla_core::status::StatusReport>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), flotilla_agent::AgentError>>,
}

impl RunningAgent {
    /// Starts an agent with `config`, writing manifests into `target`.
    pub fn start(config: flotilla_agent::AgentConfig, target: &Path) -> RunningAgent {
        let state = config.state_dir.clone();
        let agent = flotilla_agent::Agent::new(
            config,
            flotilla_agent::sink::dir::DirSink::new(target, &state, false),
        );
        let reports = agent.reports();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(async {
            let _ = stopped.await;
        }));
        RunningAgent {
            reports,
            stop,
            task,
        }
    }

    /// Whether the agent has stopped (it ends only when told to, or on an error).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// The first report that passes `test`, within a minute; the test fails naming
    /// `what` and the last report (or how the agent stopped) otherwise.
    pub async fn until(
        &mut self,
        what: &str,
        test: impl Fn(&flotilla_core::status::StatusReport) -> bool,
    ) -> flotilla_core::status::StatusReport {
        let wait = self.reports.wait_for(|r| r.as_ref().is_some_and(&test));
        let found = match tokio::time::timeout(Duration::from_secs(60), wait).await {
            Ok(Ok(report)) => report.clone(),
            _ => None,
        };
        if found.is_none() && self.task.is_finished() {
            panic!(
                "the agent stopped before it reported {what}: {:?}",
                (&mut self.task).await
            );
        }
        found.unwrap_or_else(|| {
            panic!(
                "the agent never reported {what}; last report: {:?}",
                self.reports.borrow()
            )
        })
    }

    /// The report that the agent applied `digest` (and attempted nothing newer).
    pub async fn applied(
        &mut self,
        digest: &flotilla_core::bundle::Digest,
    ) -> flotilla_core::status::StatusReport {
        self.until(&format!("applied {digest}"), |r| {
            r.applied.as_ref() == Some(digest) && r.attempted.as_ref() == Some(digest)
        })
        .await
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("the agent task did not panic")
            .expect("the agent ran");
    }
}
