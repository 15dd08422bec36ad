//! Helpers for the kube sink's tests against the fake API server.

use std::time::Duration;

use flotilla_agent::cache::{Inventory, InventoryEntry};
use flotilla_agent::sink::ApplyOutcome;
use flotilla_agent::sink::kube::{KubeOptions, KubeSink};
use flotilla_core::bundle::Bundle;
use flotilla_core::status::ResourceState;
use flotilla_kube_fake::FakeApiServer;
use serde_json::{Value, json};

/// The agent's namespace, where the ledger lives.
pub const AGENT_NAMESPACE: &str = "flotilla-system";

pub fn options() -> KubeOptions {
    KubeOptions {
        crd_timeout: Duration::from_secs(10),
        ..KubeOptions::default()
    }
}

/// A kube sink talking to `fake` in process, from the agent's namespace.
pub fn sink(fake: &FakeApiServer, options: KubeOptions) -> KubeSink {
    KubeSink::with_client(fake.client_in(AGENT_NAMESPACE), options)
}

/// What a complete apply of `previous` leaves to prune when `next` comes.
pub fn prune_list(previous: &Bundle, next: &Bundle) -> Vec<InventoryEntry> {
    Inventory {
        sink: "kube".into(),
        applied: Some(previous.digest.clone()),
        entries: InventoryEntry::of_bundle(previous),
    }
    .left_out_of(next)
}

/// The state and message of the report line for `kind/name`.
pub fn line(outcome: &ApplyOutcome, kind: &str, name: &str) -> (ResourceState, String) {
    outcome
        .resources
        .iter()
        .find(|r| r.key.kind() == kind && r.key.name() == name)
        .map(|r| (r.state, r.message.clone()))
        .unwrap_or_else(|| panic!("no line for {kind}/{name} in {outcome:#?}"))
}

pub fn object(api_version: &str, kind: &str, namespace: &str, name: &str, rest: Value) -> Value {
    let mut value = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if !namespace.is_empty() {
        value["metadata"]["namespace"] = json!(namespace);
    }
    if let (Some(map), Some(rest)) = (value.as_object_mut(), rest.as_object()) {
        for (key, child) in rest {
            if key == "metadata" {
                if let (Some(meta), Some(extra)) =
                    (map["metadata"].as_object_mut(), child.as_object())
                {
                    meta.extend(extra.clone());
                }
            } else {
                map.insert(key.clone(), child.clone());
            }
        }
    }
    value
}

pub fn kube_namespace(name: &str) -> Value {
    object("v1", "Namespace", "", name, json!({}))
}

pub fn kube_config_map(namespace: &str, name: &str, value: &str) -> Value {
    object(
        "v1",
        "ConfigMap",
        namespace,
        name,
        json!({"data": {"k": value}}),
    )
}

pub fn deployment(namespace: &str, name: &str, replicas: i64) -> Value {
    object(
        "apps/v1",
        "Deployment",
        namespace,
        name,
        json!({"spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.9"}]}}}}),
    )
}

pub fn crd(group: &str, kind: &str, plural: &str, versions: Value) -> Value {
    object(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "",
        &format!("{plural}.{group}"),
        json!({"spec": {"group": group, "scope": "Namespaced",
                        "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
                        "versions": versions}}),
    )
}

pub fn served(name: &str, storage: bool) -> Value {
    json!({"name": name, "served": true, "storage": storage,
           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
}

/// The requests the fake answered, as `METHOD path`, without discovery.
pub fn requests(fake: &FakeApiServer) -> Vec<String> {
    fake.exchanges()
        .iter()
        .map(|e| e.line())
        .filter(|l| {
            // Discovery paths have at most three segments (`/apis/apps/v1`).
            let path = l.split_once(' ').map(|(_, p)| p).unwrap_or_default();
            path.split('/').count() > 4
        })
        .collect()
}

/// A bundle with one tenant, `shop` (workload `shop-web`, namespace `shop`), as the
/// renderer makes it: the platform's Namespace `shop` and ConfigMap
/// `flotilla-system/platform`, the tenant's ConfigMap `shop/settings`, and (when
/// `bound`) the ServiceAccount and RoleBinding `flotilla-tenant-shop` the render adds
/// for the tenant's namespace (workload `flotilla-tenancy`).
pub fn tenant_bundle(bound: bool, settings: &str) -> Bundle {
    use flotilla_core::bundle::{BundleMeta, TENANCY_WORKLOAD, TenantMark};
    let mut values = vec![
        ("base", kube_namespace("shop")),
        ("base", kube_config_map(AGENT_NAMESPACE, "platform", "1")),
        ("shop-web", kube_config_map("shop", "settings", settings)),
    ];
    if bound {
        values.push((
            TENANCY_WORKLOAD,
            object(
                "v1",
                "ServiceAccount",
                "shop",
                "flotilla-tenant-shop",
                json!({}),
            ),
        ));
        values.push((
            TENANCY_WORKLOAD,
            object(
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
                "shop",
                "flotilla-tenant-shop",
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flotilla-tenant"},
                       "subjects": [{"kind": "ServiceAccount", "name": "flotilla-tenant-shop", "namespace": "shop"}]}),
            ),
        ));
    }
    let meta = BundleMeta {
        tenants: [(
            "shop".to_string(),
            TenantMark {
                workloads: vec!["shop-web".into()],
                namespaces: vec!["shop".into()],
                cluster_scoped: Vec::new(),
            },
        )]
        .into(),
        ..Default::default()
    };
    bundle_of_workloads("edge-tenants", values, meta)
}

/// A bundle of `(workload, resource)` pairs (any order) with `meta` (whose
/// `workloads` this fills in), as the renderer makes one.
pub fn bundle_of_workloads(
    cluster: &str,
    values: Vec<(&str, Value)>,
    meta: flotilla_core::bundle::BundleMeta,
) -> Bundle {
    use flotilla_core::bundle::{BundleMeta, Resource, ResourceKey};
    use std::sync::Arc;
    let mut pairs: Vec<(String, Arc<Resource>)> = values
        .into_iter()
        .map(|(workload, value)| {
            let key = ResourceKey::of(&value).expect("test resources have an identity");
            (workload.to_string(), Arc::new(Resource::new(key, &value)))
        })
        .collect();
    pairs.sort_by(|a, b| a.1.key.cmp(&b.1.key));
    let (workloads, resources) = pairs.into_iter().unzip();
    let meta = BundleMeta { workloads, ..meta };
    Bundle::from_sorted_with_meta(cluster, resources, Some(meta))
}
