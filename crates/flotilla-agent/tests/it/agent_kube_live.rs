//! The kube sink against a real Kubernetes API. These tests need a cluster, so they
//! are ignored by default; run them against a throwaway k3d or kind cluster:
//!
//! ```text
//! k3d cluster create flotilla-test        # or: kind create cluster --name flotilla-test
//! cargo test --test agent_kube_live -- --ignored --test-threads 1
//! k3d cluster delete flotilla-test        # or: kind delete cluster --name flotilla-test
//! ```
//!
//! They use the current kubeconfig context (KUBECONFIG or ~/.kube/config), create a
//! namespace and a CRD of their own, and delete them at the end.

use crate::support as agent_support;

use std::time::Duration;

use agent_support::bundle;
use flotilla_agent::cache::{Inventory, InventoryEntry};
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::kube::KubeSink;
use flotilla_core::status::ResourceState;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{nanos:x}")
}

fn crd(group: &str) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("widgets.{group}")},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                      "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn object(api_version: &str, kind: &str, namespace: &str, name: &str, rest: Value) -> Value {
    let mut value = json!({"apiVersion": api_version, "kind": kind,
                           "metadata": {"name": name, "namespace": namespace}});
    if let (Some(map), Some(rest)) = (value.as_object_mut(), rest.as_object()) {
        map.extend(rest.clone());
    }
    value
}

async fn client() -> kube::Client {
    kube::Client::try_default()
        .await
        .expect("a cluster in the current kubeconfig context (see the top of this file)")
}

fn api(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn applies_waits_for_the_crd_prunes_and_reads_health_on_a_live_cluster() {
    let client = client().await;
    let namespace = unique("flotilla-test");
    let group = format!("{}.flotilla.dev", unique("t"));
    let mut sink = KubeSink::with_client(client.clone(), false);

    let deployment = object(
        "apps/v1",
        "Deployment",
        &namespace,
        "web",
        json!({"spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "pause",
                                              "image": "registry.k8s.io/pause:3.9"}]}}}}),
    );
    let first = bundle(
        "live",
        vec![
            crd(&group),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            object(
                "v1",
                "ConfigMap",
                &namespace,
                "settings",
                json!({"data": {"k": "v"}}),
            ),
            deployment.clone(),
            object(
                &format!("{group}/v1"),
                "Widget",
                &namespace,
                "w1",
                json!({"spec": {"size": 1}}),
            ),
        ],
    );
    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");

    let config_maps = api(
        &client,
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        Some(&namespace),
    );
    let live = config_maps.get("settings").await.expect("applied");
    assert_eq!(
        live.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("flotilla.dev/cluster"))
            .map(String::as_str),
        Some("live")
    );
    let managers: Vec<String> = live
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert!(managers.contains(&"flotilla".to_string()), "{managers:?}");

    // The Deployment becomes healthy once its pod runs (the pause image is tiny).
    let mut healthy = false;
    for _ in 0..120 {
        let health = sink.health(&first).await.expect("health readable");
        if health
            .iter()
            .any(|h| h.kind == "Deployment" && h.state == ResourceState::Healthy)
        {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(healthy, "the Deployment never became healthy");

    // The next bundle drops the ConfigMap and the Widget: both are pruned.
    let second = bundle(
        "live",
        vec![
            crd(&group),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            deployment,
        ],
    );
    let prune = Inventory {
        sink: "kube".into(),
        applied: Some(first.digest.clone()),
        entries: InventoryEntry::of_bundle(&first),
    }
    .left_out_of(&second);
    let outcome = sink.apply(&second, &prune).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 2, "{outcome:#?}");
    let gone = config_maps.get_opt("settings").await.expect("readable");
    assert!(
        gone.is_none_or(|cm| cm.metadata.deletion_timestamp.is_some()),
        "the ConfigMap was pruned"
    );

    // Clean up: the namespace and the CRD.
    let _ = api(&client, "", "v1", "Namespace", "namespaces", None)
        .delete(&namespace, &DeleteParams::background())
        .await;
    let _ = api(
        &client,
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        None,
    )
    .delete(&format!("widgets.{group}"), &DeleteParams::background())
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_object_annotated_prune_disabled_survives_on_a_live_cluster() {
    let client = client().await;
    let namespace = unique("flotilla-test");
    let mut sink = KubeSink::with_client(client.clone(), false);
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    let kept = object(
        "v1",
        "ConfigMap",
        &namespace,
        "kept",
        json!({"metadata": {"name": "kept", "namespace": namespace,
                            "annotations": {"flotilla.dev/prune": "disabled"}}}),
    );
    let first = bundle("live", vec![ns.clone(), kept]);
    assert!(sink.apply(&first, &[]).await.complete);
    let second = bundle("live", vec![ns]);
    let prune = InventoryEntry::of_bundle(&first)
        .into_iter()
        .filter(|e| e.kind == "ConfigMap")
        .collect::<Vec<_>>();
    let outcome = sink.apply(&second, &prune).await;
    assert!(outcome.complete, "{outcome:#?}");
    let config_maps = api(
        &client,
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        Some(&namespace),
    );
    assert!(
        config_maps
            .get_opt("kept")
            .await
            .expect("readable")
            .is_some()
    );
    let _ = api(&client, "", "v1", "Namespace", "namespaces", None)
        .delete(&namespace, &DeleteParams::background())
        .await;
}
