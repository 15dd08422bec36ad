//! Where bundles are applied: the [`Sink`] trait and its two implementations,
//! [`kube::KubeSink`] (server-side apply through the Kubernetes API) and
//! [`dir::DirSink`] (one file per resource, for auto-deploy manifest folders).

pub mod dir;
pub mod drift;
pub mod kube;

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::cache::InventoryEntry;
use flotilla_core::bundle::{Bundle, Digest, Resource, ResourceKey, is_tenancy_object};
use flotilla_core::status::{ResourceState, ResourceStatus};

/// The label every object flotilla applies carries, with the cluster's name.
pub const CLUSTER_LABEL: &str = "flotilla.dev/cluster";
/// The annotation holding the digest of the bundle an object was last applied from.
pub const DIGEST_ANNOTATION: &str = "flotilla.dev/bundle-digest";
/// An object annotated with this set to `disabled` is never pruned; set to `allow` on a
/// Namespace or a CustomResourceDefinition, it may be (those are kept otherwise, since
/// deleting them deletes everything in them).
pub const PRUNE_ANNOTATION: &str = "flotilla.dev/prune";

/// Metadata the API server sets, dropped before applying: applied back, a stale
/// `resourceVersion` makes the write conditional (409), and `managedFields` is refused.
pub use flotilla_core::bundle::SERVER_SET_METADATA;

/// What one apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// One line per resource of the bundle, then one per resource pruned or kept back.
    pub resources: Vec<ResourceStatus>,
    /// True when every resource was applied (whatever its health) and nothing left to
    /// prune needs another try; only then is the bundle "applied". Otherwise the agent
    /// tries again later.
    pub complete: bool,
    /// A summary for humans.
    pub message: String,
    /// Objects the bundle no longer holds that could not be pruned yet (refused for
    /// now, or still needed); they stay in the inventory so a later apply tries again.
    pub kept: Vec<InventoryEntry>,
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

    /// Gives the sink the agent's stop signal, so that an apply under way ends soon
    /// and cleanly when the agent is asked to stop. Sinks whose applies are quick
    /// need not listen.
    fn watch_stop(&mut self, _stop: StopSignal) {}

    /// Gives the sink a key only this agent holds (derived from its own age identity),
    /// for what it keeps on the cluster about what it applied: nothing it records
    /// there (a Helm release's fingerprint) is then a plain hash over a Secret's
    /// values, which whoever reads ConfigMaps but not Secrets could test guesses
    /// against.
    fn keep_private(&mut self, _key: [u8; 32]) {}

    /// Tells the sink, before an apply, what the state folder's inventory lists: what
    /// flotilla applied through this sink before. A sink that keeps its own record
    /// takes it over when it has none yet.
    fn recall(&mut self, _applied_before: &[InventoryEntry]) {}

    /// Tells the sink, before its first apply, which bundle it last applied completely
    /// (the state folder keeps it): prune takes from it the phase of each object that
    /// left the bundle and the delete hooks of a Helm release that left it. A sink
    /// remembers the bundles it then applies completely itself.
    fn recall_applied(&mut self, _bundle: Option<Arc<Bundle>>) {}

    /// Looks for drift in what the sink applied of `bundle` (the bundle it last applied
    /// completely) and deals with it as each workload's drift policy says
    /// ([`drift`]). Sinks that cannot look answer [`drift::DriftCheck::Unavailable`],
    /// and the agent applies the bundle again instead.
    fn check_drift<'a>(
        &'a mut self,
        _bundle: &'a Bundle,
    ) -> impl Future<Output = drift::DriftCheck> + Send + 'a {
        std::future::ready(drift::DriftCheck::Unavailable)
    }
}

/// Raised once when the agent is asked to stop (SIGTERM); cloned by whoever must notice.
#[derive(Clone, Debug)]
pub struct StopSignal {
    raised: watch::Sender<bool>,
}

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal {
            raised: watch::channel(false).0,
        }
    }
}

impl StopSignal {
    pub fn raise(&self) {
        self.raised.send_replace(true);
    }

    pub fn is_raised(&self) -> bool {
        *self.raised.borrow()
    }

    /// Completes once the signal is raised.
    pub async fn raised(&self) {
        let mut receiver = self.raised.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = receiver.wait_for(|raised| *raised).await;
    }
}

/// Apply order: CustomResourceDefinitions, then Namespaces, then everything else, each
/// in bundle order, and last the admission webhook configurations and APIServices.
/// Kinds a CRD defines and objects in a namespace can then be applied, and a webhook is
/// registered only after the Service and workload that serve it, so that it cannot
/// refuse the objects applied before it exists.
pub fn apply_rank(key: &ResourceKey) -> u8 {
    match (key.group(), key.kind()) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => 0,
        ("", "Namespace") => 1,
        (
            "admissionregistration.k8s.io",
            "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration",
        )
        | ("apiregistration.k8s.io", "APIService") => 3,
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

/// The bundle's resources in apply order, phase by phase: one list per apply phase
/// (the levels of the workloads' `spec.dependsOn` graph), each in [`apply_order`]. A
/// bundle without phases is one list, in [`apply_order`].
pub fn apply_phases(bundle: &Bundle) -> Vec<Vec<&Arc<Resource>>> {
    let mut phases: Vec<Vec<&Arc<Resource>>> = vec![Vec::new(); bundle.phase_count()];
    let last = phases.len() - 1;
    for (resource, phase) in bundle.resources.iter().zip(bundle.resource_phases()) {
        phases[phase.min(last)].push(resource);
    }
    for phase in &mut phases {
        // A stable sort keeps bundle order within each rank.
        phase.sort_by_key(|r| tenancy_first_rank(&r.key));
    }
    phases
}

/// [`apply_rank`], with the objects made for tenants first in theirs: the tenant's
/// objects may be applied as its ServiceAccounts (`--impersonate-tenants`). A
/// tenant's ClusterRole and ClusterRoleBinding come before everything, CRDs
/// included, which may be the tenant's own (the binding needs neither the namespace
/// nor the ServiceAccount it names to exist).
pub(crate) fn tenancy_first_rank(key: &ResourceKey) -> (u8, bool) {
    let tenancy = is_tenancy_object(key);
    let rank = if tenancy && key.namespace().is_empty() {
        0
    } else {
        apply_rank(key)
    };
    (rank, !tenancy)
}

/// Prune order: the reverse of apply order, so objects go before their namespace and
/// custom resources before their definition.
pub fn prune_order(entries: &[InventoryEntry]) -> Vec<InventoryEntry> {
    let mut ordered = entries.to_vec();
    ordered.sort_by(|a, b| {
        let (ka, kb) = (a.key(), b.key());
        (tenancy_first_rank(kb), kb).cmp(&(tenancy_first_rank(ka), ka))
    });
    ordered
}

/// Prune order, phase by phase: the entries grouped by the apply phase their workload
/// had in `previous`, the bundle that last applied them (it is not in the new bundle),
/// the last phase first and the first phase last, each group in [`prune_order`]. Each
/// group comes with its phase's index in `previous`. An entry `previous` does not hold,
/// or every entry without a `previous`, counts as in its last phase: nothing known
/// depends on it.
pub fn prune_phases(
    entries: &[InventoryEntry],
    previous: Option<&Bundle>,
) -> Vec<(usize, Vec<InventoryEntry>)> {
    let Some(previous) = previous else {
        return if entries.is_empty() {
            Vec::new()
        } else {
            vec![(0, prune_order(entries))]
        };
    };
    let last = previous.phase_count() - 1;
    let phases = previous.resource_phases();
    let mut groups: Vec<Vec<InventoryEntry>> = vec![Vec::new(); last + 1];
    for entry in entries {
        let key = entry.key();
        let phase = previous
            .resources
            .binary_search_by(|r| (*r.key).cmp(key))
            .ok()
            .and_then(|index| phases.get(index).copied())
            .unwrap_or(last);
        groups[phase.min(last)].push(entry.clone());
    }
    groups
        .into_iter()
        .enumerate()
        .rev()
        .filter(|(_, group)| !group.is_empty())
        .map(|(phase, group)| (phase, prune_order(&group)))
        .collect()
}

/// The bundle a sink keeps as the one it last applied completely: only one with
/// metadata (phases, hooks) has anything to tell prune.
pub fn worth_keeping(bundle: &Bundle) -> Option<Arc<Bundle>> {
    bundle.meta.is_some().then(|| Arc::new(bundle.clone()))
}

/// The object as flotilla applies it: without the metadata the API server sets and
/// without `status`, labelled with the cluster, and annotated with the bundle digest
/// when one is given.
pub fn with_flotilla_metadata(mut value: Value, cluster: &str, digest: Option<&Digest>) -> Value {
    if let Some(object) = value.as_object_mut() {
        object.remove("status");
    }
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in SERVER_SET_METADATA {
            metadata.remove(*field);
        }
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

fn prune_annotation(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(PRUNE_ANNOTATION))
        .and_then(Value::as_str)
}

/// True when the object's annotations say it must never be pruned.
pub fn prune_disabled(object: &Value) -> bool {
    prune_annotation(object) == Some("disabled")
}

/// True when the object's annotations allow pruning it even where flotilla otherwise
/// keeps it (a Namespace, a CustomResourceDefinition).
pub fn prune_allowed(object: &Value) -> bool {
    prune_annotation(object) == Some("allow")
}

/// Checks that a cluster name can be the value of the `flotilla.dev/cluster` label every
/// applied object carries: at most 63 characters, letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or digit (Kubernetes' label-value rule). Any other
/// name would make the API server refuse every object (422).
pub fn check_cluster_name(cluster: &str) -> Result<(), String> {
    let alphanumeric = |c: char| c.is_ascii_alphanumeric();
    if cluster.is_empty() || cluster.len() > 63 {
        return Err(format!(
            "cluster name {cluster:?} has {} characters; it must have 1 to 63, since it is the value of the \
             {CLUSTER_LABEL} label on every object flotilla applies",
            cluster.len()
        ));
    }
    let valid = cluster.starts_with(alphanumeric)
        && cluster.ends_with(alphanumeric)
        && cluster
            .chars()
            .all(|c| alphanumeric(c) || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(format!(
            "cluster name {cluster:?} cannot be the value of the {CLUSTER_LABEL} label on the objects flotilla \
             applies: use letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{bundle_of, phased_bundle_of};
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
        let applied: Vec<&str> = apply_order(&bundle).iter().map(|r| r.key.name()).collect();
        assert_eq!(applied, ["widgets.example.com", "demo", "cfg", "web", "w1"]);
        let pruned: Vec<String> = prune_order(&InventoryEntry::of_bundle(&bundle))
            .into_iter()
            .map(|e| e.name().to_string())
            .collect();
        assert_eq!(pruned, ["w1", "web", "cfg", "demo", "widgets.example.com"]);
    }

    #[test]
    fn phases_are_applied_in_order_each_in_apply_order() {
        let bundle = phased_bundle_of(
            "edge-1",
            vec![
                ("app", object("apps/v1", "Deployment", Some("app"), "web")),
                ("app", object("v1", "Namespace", None, "app")),
                ("db", object("apps/v1", "StatefulSet", Some("db"), "pg")),
                ("db", object("v1", "Namespace", None, "db")),
                (
                    "operator",
                    object(
                        "apiextensions.k8s.io/v1",
                        "CustomResourceDefinition",
                        None,
                        "widgets.example.com",
                    ),
                ),
            ],
            &[&["operator"], &["db"], &["app"]],
        );
        let names = |phase: &Vec<&Arc<Resource>>| -> Vec<String> {
            phase.iter().map(|r| r.key.name().to_string()).collect()
        };
        let phases: Vec<Vec<String>> = apply_phases(&bundle).iter().map(names).collect();
        assert_eq!(
            phases,
            [
                vec!["widgets.example.com"],
                vec!["db", "pg"],
                vec!["app", "web"]
            ]
        );
        // Without phases: one phase, in apply order.
        let plain = sample();
        let one: Vec<Vec<String>> = apply_phases(&plain).iter().map(names).collect();
        assert_eq!(one, [names(&apply_order(&plain))]);
    }

    #[test]
    fn prune_goes_in_reverse_phase_order_by_the_bundle_that_last_applied() {
        let previous = phased_bundle_of(
            "edge-1",
            vec![
                (
                    "operator",
                    object(
                        "apiextensions.k8s.io/v1",
                        "CustomResourceDefinition",
                        None,
                        "widgets.example.com",
                    ),
                ),
                (
                    "operator",
                    object("apps/v1", "Deployment", Some("op"), "op"),
                ),
                ("db", object("v1", "Namespace", None, "db")),
                ("db", object("apps/v1", "StatefulSet", Some("db"), "pg")),
                ("app", object("apps/v1", "Deployment", Some("app"), "web")),
                ("app", object("example.com/v1", "Widget", Some("app"), "w")),
            ],
            &[&["operator"], &["db"], &["app"]],
        );
        let mut entries = InventoryEntry::of_bundle(&previous);
        // Not in the bundle that last applied: as in its last phase.
        entries.push(InventoryEntry::new("v1", "ConfigMap", "app", "stray"));
        entries.reverse();
        let groups: Vec<(usize, Vec<String>)> = prune_phases(&entries, Some(&previous))
            .into_iter()
            .map(|(phase, group)| {
                (
                    phase,
                    group.into_iter().map(|e| e.name().to_string()).collect(),
                )
            })
            .collect();
        assert_eq!(
            groups,
            [
                (2, vec!["w".to_string(), "web".into(), "stray".into()]),
                (1, vec!["pg".into(), "db".into()]),
                (0, vec!["op".into(), "widgets.example.com".into()]),
            ]
        );
        // Without the bundle that last applied: one group, in reverse apply order.
        let one = prune_phases(&entries, None);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].1, prune_order(&entries));
        assert!(prune_phases(&[], None).is_empty());
    }

    #[test]
    fn metadata_gets_the_cluster_label_and_digest_annotation() {
        let digest = Digest::of(b"d");
        let value = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "x", "labels": {"app": "a"}}});
        let labelled = with_flotilla_metadata(value.clone(), "edge-1", Some(&digest));
        assert_eq!(
            labelled["metadata"],
            json!({"name": "x", "labels": {"app": "a", "flotilla.dev/cluster": "edge-1"},
                   "annotations": {"flotilla.dev/bundle-digest": digest.as_str()}})
        );
        assert!(!prune_disabled(&labelled));
        let kept = json!({"metadata": {"annotations": {"flotilla.dev/prune": "disabled"}}});
        assert!(prune_disabled(&kept));
        assert!(!prune_allowed(&kept));
        let allowed = json!({"metadata": {"annotations": {"flotilla.dev/prune": "allow"}}});
        assert!(prune_allowed(&allowed));
    }

    #[test]
    fn server_set_metadata_and_status_are_not_applied() {
        // As `kubectl get -o yaml` exports it.
        let exported = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "demo", "resourceVersion": "4711",
                         "uid": "0e1f", "creationTimestamp": "2024-01-01T00:00:00Z",
                         "generation": 3, "managedFields": [{"manager": "kubectl"}]},
            "data": {"k": "v"}, "status": {"phase": "Active"}});
        let applied = with_flotilla_metadata(exported.clone(), "edge-1", None);
        assert_eq!(
            applied,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "x", "namespace": "demo",
                                "labels": {"flotilla.dev/cluster": "edge-1"}},
                   "data": {"k": "v"}})
        );
    }

    #[test]
    fn webhooks_are_applied_last_and_pruned_first() {
        let webhook = object(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            None,
            "check",
        );
        let bundle = bundle_of(
            "edge-1",
            vec![
                webhook,
                object("apps/v1", "Deployment", Some("demo"), "web"),
            ],
        );
        let applied: Vec<&str> = apply_order(&bundle).iter().map(|r| r.key.name()).collect();
        assert_eq!(applied, ["web", "check"]);
        let pruned: Vec<String> = prune_order(&InventoryEntry::of_bundle(&bundle))
            .into_iter()
            .map(|e| e.name().to_string())
            .collect();
        assert_eq!(pruned, ["check", "web"]);
    }

    #[test]
    fn cluster_names_must_be_label_values() {
        for good in ["edge-7", "EDGE_7.north", "a", &"a".repeat(63)] {
            assert_eq!(check_cluster_name(good), Ok(()), "{good}");
        }
        for bad in ["", &"a".repeat(64), "-edge", "edge-", "edge 7", "edge/7"] {
            let err = check_cluster_name(bad).expect_err(bad);
            assert!(err.contains("flotilla.dev/cluster"), "{err}");
        }
    }

    #[tokio::test]
    async fn a_raised_stop_signal_is_seen_by_every_clone() {
        let stop = StopSignal::default();
        let seen = stop.clone();
        assert!(!seen.is_raised());
        stop.raise();
        seen.raised().await;
        assert!(seen.is_raised());
    }
}
