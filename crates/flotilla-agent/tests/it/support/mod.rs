//! Helpers shared by the agent's integration tests: bundles, a `flotilla publish`-style
//! folder, and a sleeper that records waits instead of spending them.
#![allow(dead_code)]

pub mod kube;

use std::collections::BTreeMap;
use std::path::Path;
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

/// A bundle of `(workload, resource)` pairs with these apply phases, as the renderer
/// makes one for workloads with `spec.dependsOn`.
pub fn phased_bundle(cluster: &str, values: Vec<(&str, Value)>, phases: &[&[&str]]) -> Bundle {
    let mut pairs: Vec<(String, Arc<Resource>)> = values
        .into_iter()
        .map(|(workload, value)| {
            let key = ResourceKey::of(&value).expect("test resources have an identity");
            (workload.to_string(), Arc::new(Resource::new(key, &value)))
        })
        .collect();
    pairs.sort_by(|a, b| a.1.key.cmp(&b.1.key));
    let (workloads, resources) = pairs.into_iter().unzip();
    let meta = flotilla_core::bundle::BundleMeta {
        workloads,
        phases: phases
            .iter()
            .map(|phase| phase.iter().map(|w| w.to_string()).collect())
            .collect(),
        ..Default::default()
    };
    Bundle::from_sorted_with_meta(cluster, resources, Some(meta))
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

/// Writes `document` where `flotilla publish` puts a cluster's current bundle,
/// atomically (as publish does), so a reader never sees half a file.
pub fn publish_document(root: &Path, cluster: &str, document: &[u8]) {
    let dir = root.join("v1").join("clusters").join(cluster);
    std::fs::create_dir_all(&dir).expect("creates the publish folder");
    let tmp = dir.join(".bundle.tmp");
    std::fs::write(&tmp, document).expect("writes");
    std::fs::rename(&tmp, dir.join("bundle")).expect("renames");
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
