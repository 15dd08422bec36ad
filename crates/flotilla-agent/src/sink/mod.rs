//! Where bundles are applied: the [`Sink`] trait and its two implementations,
//! [`kube::KubeSink`] (server-side apply through the Kubernetes API) and
//! [`dir::DirSink`] (one file per resource, for auto-deploy manifest folders).

pub mod dir;
pub mod kube;

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use super::cache::InventoryEntry;
use flotilla_core::bundle::{Bundle, Digest, Resource, ResourceKey};
use flotilla_core::status::{ResourceState, ResourceStatus};

/// The label every object flotilla applies carries, with the cluster's name.
pub const CLUSTER_LABEL: &str = "flotilla.dev/cluster";
/// The annotation holding the digest of the bundle an object was last applied from.
pub const DIGEST_ANNOTATION: &str = "flotilla.dev/bundle-digest";
/// An object annotated with this set to `disabled` is never pruned.
pub const PRUNE_ANNOTATION: &str = "flotilla.dev/prune";

/// What one apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// One line per resource of the bundle, then one per resource pruned or kept back.
    pub resources: Vec<ResourceStatus>,
    /// True when every resource was applied and everything to prune was pruned; only
    /// then is the bundle "applied". Otherwise the agent tries again later.
    pub complete: bool,
    /// A summary for humans.
    pub message: String,
}

impl ApplyOutcome {
    /// The number of resources in a given state.
    pub fn count(&self, state: ResourceState) -> usize {
        self.resources.iter().filter(|r| r.state == state).count()
    }
}

/// A place bundles are applied to. Applying is idempotent: applying the same bundle
/// twice leaves things as applying it once, which is what makes retries and resyncs
/// safe.
pub trait Sink: Send {
    /// Names the sink and its target, so an inventory is only ever pruned by the sink
    /// that made it (`kube`, `dir:/path`).
    fn id(&self) -> String;

    /// Applies `bundle`, and then, if every resource was applied, removes what
    /// `prune` lists (objects a previous bundle held and this one does not).
    fn apply<'a>(
        &'a mut self,
        bundle: &'a Bundle,
        prune: &'a [InventoryEntry],
    ) -> impl Future<Output = ApplyOutcome> + Send + 'a;

    /// Reads the health of the bundle's resources again without changing anything;
    /// `None` when the sink cannot observe health.
    fn health<'a>(
        &'a mut self,
        bundle: &'a Bundle,
    ) -> impl Future<Output = Option<Vec<ResourceStatus>>> + Send + 'a;
}

/// Apply order: CustomResourceDefinitions, then Namespaces, then everything else, each
/// in bundle order. Kinds a CRD defines and objects in a namespace can then be applied.
pub fn apply_rank(key: &ResourceKey) -> u8 {
    match (key.group.as_str(), key.kind.as_str()) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => 0,
        ("", "Namespace") => 1,
        _ => 2,
    }
}

/// The bundle's resources in apply order.
pub fn apply_order(bundle: &Bundle) -> Vec<&Arc<Resource>> {
    let mut ordered: Vec<&Arc<Resource>> = bundle.resources.iter().collect();
    // A stable sort keeps bundle order within each rank.
    ordered.sort_by_key(|r| apply_rank(&r.key));
    ordered
}

/// Prune order: the reverse of apply order, so objects go before their namespace and
/// custom resources before their definition.
pub fn prune_order(entries: &[InventoryEntry]) -> Vec<InventoryEntry> {
    let mut ordered = entries.to_vec();
    ordered.sort_by(|a, b| {
        let (ka, kb) = (a.key(), b.key());
        (apply_rank(&kb), kb).cmp(&(apply_rank(&ka), ka))
    });
    ordered
}

/// The object as flotilla applies it: labelled with the cluster, and annotated with
/// the bundle digest when one is given.
pub fn with_flotilla_metadata(value: &Value, cluster: &str, digest: Option<&Digest>) -> Value {
    let mut value = value.clone();
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        insert_string(metadata, "labels", CLUSTER_LABEL, cluster);
        if let Some(digest) = digest {
            insert_string(metadata, "annotations", DIGEST_ANNOTATION, digest.as_str());
        }
    }
    value
}

fn insert_string(
    metadata: &mut serde_json::Map<String, Value>,
    field: &str,
    key: &str,
    text: &str,
) {
    let entry = metadata
        .entry(field)
        .or_insert_with(|| Value::Object(Default::default()));
    if !entry.is_object() {
        *entry = Value::Object(Default::default());
    }
    if let Some(map) = entry.as_object_mut() {
        map.insert(key.to_string(), Value::String(text.to_string()));
    }
}

/// True when the object's annotations say it must never be pruned.
pub fn prune_disabled(object: &Value) -> bool {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(PRUNE_ANNOTATION))
        .and_then(Value::as_str)
        == Some("disabled")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::bundle_of;
    use serde_json::json;

    fn object(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Value {
        let mut metadata = json!({"name": name});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        json!({"apiVersion": api_version, "kind": kind, "metadata": metadata})
    }

    fn sample() -> Bundle {
        bundle_of(
            "edge-1",
            vec![
                object("v1", "ConfigMap", Some("demo"), "cfg"),
                object("v1", "Namespace", None, "demo"),
                object(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    "widgets.example.com",
                ),
                object("apps/v1", "Deployment", Some("demo"), "web"),
                object("example.com/v1", "Widget", Some("demo"), "w1"),
            ],
        )
    }

    #[test]
    fn definitions_and_namespaces_are_applied_first_and_pruned_last() {
        let bundle = sample();
        let applied: Vec<&str> = apply_order(&bundle)
            .iter()
            .map(|r| r.key.name.as_str())
            .collect();
        assert_eq!(applied, ["widgets.example.com", "demo", "cfg", "web", "w1"]);
        let pruned: Vec<String> = prune_order(&InventoryEntry::of_bundle(&bundle))
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(pruned, ["w1", "web", "cfg", "demo", "widgets.example.com"]);
    }

    #[test]
    fn metadata_gets_the_cluster_label_and_digest_annotation() {
        let digest = Digest::of(b"d");
        let value = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "x", "labels": {"app": "a"}}});
        let labelled = with_flotilla_metadata(&value, "edge-1", Some(&digest));
        assert_eq!(
            labelled["metadata"],
            json!({"name": "x", "labels": {"app": "a", "flotilla.dev/cluster": "edge-1"},
                   "annotations": {"flotilla.dev/bundle-digest": digest.as_str()}})
        );
        assert!(!prune_disabled(&labelled));
        let kept = json!({"metadata": {"annotations": {"flotilla.dev/prune": "disabled"}}});
        assert!(prune_disabled(&kept));
    }
}
