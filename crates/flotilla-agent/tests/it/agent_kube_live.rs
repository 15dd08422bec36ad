//! The kube sink against a real Kubernetes API. These tests need a cluster, so they
//! are ignored by default; run them against a throwaway k3d or kind cluster:
//!
//! ```text
//! k3d cluster create flotilla-test        # or: kind create cluster --name flotilla-test
//! cargo test -p flotilla-agent --test it agent_kube_live -- --ignored --test-threads 1
//! k3d cluster delete flotilla-test        # or: kind delete cluster --name flotilla-test
//! ```
//!
//! They use the current kubeconfig context (KUBECONFIG or ~/.kube/config) as a cluster
//! admin, make namespaces and CRDs of their own (named after the test and the time),
//! and delete them at the end. The last one installs the agent's ClusterRole from
//! `deploy/agent.yaml` and applies as its ServiceAccount, with a token from the
//! TokenRequest API, so the shipped RBAC is checked against a real authorizer.

use crate::support as agent_support;

use std::time::Duration;

use agent_support::bundle;
use agent_support::kube::{crd, kube_config_map, kube_namespace, object, prune_list, served};
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::kube::{KubeOptions, KubeSink};
use flotilla_core::status::ResourceState;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{nanos:x}")
}

async fn admin() -> kube::Client {
    kube::Client::try_default()
        .await
        .expect("a cluster in the current kubeconfig context (see the top of this file)")
}

fn api(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// The sink, with its ledger in `namespace` (which the test makes first).
fn sink(client: &kube::Client, ledger_namespace: &str, options: KubeOptions) -> KubeSink {
    KubeSink::with_client(
        client.clone(),
        KubeOptions {
            inventory_namespace: Some(ledger_namespace.to_string()),
            ..options
        },
    )
}

async fn apply_as_admin(client: &kube::Client, object: &Value, plural: &str) {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let name = object["metadata"]["name"].as_str().expect("name");
    let namespace = object["metadata"]["namespace"].as_str();
    api(client, api_version, kind, plural, namespace)
        .patch(
            name,
            &PatchParams::apply("flotilla-live-test").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|err| panic!("{kind} {name}: {err}"));
}

/// Waits up to a minute for `done`.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut done: impl FnMut() -> F,
) {
    for _ in 0..120 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{what} did not happen within a minute");
}

async fn delete_quietly(api: Api<DynamicObject>, name: &str) {
    let _ = api.delete(name, &DeleteParams::background()).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn applies_waits_for_the_crd_prunes_and_reads_health_on_a_live_cluster() {
    let client = admin().await;
    let namespace = unique("flotilla-test");
    let group = format!("{}.flotilla.dev", unique("t"));
    let cluster = unique("live");
    let mut sink = sink(&client, &namespace, KubeOptions::default());

    let deployment = agent_support::kube::deployment(&namespace, "web", 1);
    let first = bundle(
        &cluster,
        vec![
            crd(&group, "Widget", "widgets", json!([served("v1", true)])),
            kube_namespace(&namespace),
            kube_config_map(&namespace, "settings", "v"),
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
    // A Deployment the apply just created is progressing, never healthy at once.
    let web = outcome
        .resources
        .iter()
        .find(|r| r.key.name() == "web")
        .expect("a line");
    assert_eq!(web.state, ResourceState::Progressing, "{web:?}");

    let config_maps = api(&client, "v1", "ConfigMap", "configmaps", Some(&namespace));
    let live = config_maps.get("settings").await.expect("applied");
    assert_eq!(
        live.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("flotilla.dev/cluster"))
            .map(String::as_str),
        Some(cluster.as_str())
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
            .any(|h| h.key.kind() == "Deployment" && h.state == ResourceState::Healthy)
        {
            healthy = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(healthy, "the Deployment never became healthy");

    // The next bundle drops the ConfigMap and the Widget: both are pruned, with their
    // uid and resourceVersion as preconditions.
    let second = bundle(
        &cluster,
        vec![
            crd(&group, "Widget", "widgets", json!([served("v1", true)])),
            kube_namespace(&namespace),
            deployment,
        ],
    );
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 2, "{outcome:#?}");
    let gone = config_maps.get_opt("settings").await.expect("readable");
    assert!(
        gone.is_none_or(|cm| cm.metadata.deletion_timestamp.is_some()),
        "the ConfigMap was pruned"
    );

    delete_quietly(
        api(&client, "v1", "Namespace", "namespaces", None),
        &namespace,
    )
    .await;
    delete_quietly(
        api(
            &client,
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            None,
        ),
        &format!("widgets.{group}"),
    )
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_object_annotated_prune_disabled_survives_on_a_live_cluster() {
    let client = admin().await;
    let namespace = unique("flotilla-test");
    let cluster = unique("live");
    let mut sink = sink(&client, &namespace, KubeOptions::default());
    let kept = object(
        "v1",
        "ConfigMap",
        &namespace,
        "kept",
        json!({"metadata": {"annotations": {"flotilla.dev/prune": "disabled"}}}),
    );
    let first = bundle(&cluster, vec![kube_namespace(&namespace), kept]);
    assert!(sink.apply(&first, &[]).await.complete);
    let second = bundle(&cluster, vec![kube_namespace(&namespace)]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    let config_maps = api(&client, "v1", "ConfigMap", "configmaps", Some(&namespace));
    assert!(
        config_maps
            .get_opt("kept")
            .await
            .expect("readable")
            .is_some()
    );
    delete_quietly(
        api(&client, "v1", "Namespace", "namespaces", None),
        &namespace,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn prunes_a_namespace_and_a_crd_only_when_allowed_on_a_live_cluster() {
    let client = admin().await;
    let ledger_namespace = unique("flotilla-ledger");
    let namespace = unique("flotilla-test");
    let group = format!("{}.flotilla.dev", unique("p"));
    let cluster = unique("live");
    apply_as_admin(&client, &kube_namespace(&ledger_namespace), "namespaces").await;
    let definition = crd(&group, "Gadget", "gadgets", json!([served("v1", true)]));
    let first = bundle(
        &cluster,
        vec![
            definition,
            kube_namespace(&namespace),
            object(
                &format!("{group}/v1"),
                "Gadget",
                &namespace,
                "g1",
                json!({"spec": {}}),
            ),
        ],
    );
    let mut sink = sink(&client, &ledger_namespace, KubeOptions::default());
    assert!(sink.apply(&first, &[]).await.complete);

    // Without the opt-in the Namespace and the CRD stay.
    let second = bundle(&cluster, vec![kube_namespace(&ledger_namespace)]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    let namespaces = api(&client, "v1", "Namespace", "namespaces", None);
    let crds = api(
        &client,
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        None,
    );
    assert!(
        namespaces
            .get_opt(&namespace)
            .await
            .expect("readable")
            .is_some()
    );
    assert!(
        crds.get_opt(&format!("gadgets.{group}"))
            .await
            .expect("readable")
            .is_some()
    );

    // With it, both go (the Namespace through Terminating).
    let mut allowed = sink_with(
        &client,
        &ledger_namespace,
        KubeOptions {
            prune_namespaces_and_crds: true,
            ..KubeOptions::default()
        },
    );
    let candidates: Vec<_> = prune_list(&first, &second)
        .into_iter()
        .filter(|e| e.kind() == "Namespace" || e.kind() == "CustomResourceDefinition")
        .collect();
    let outcome = allowed.apply(&second, &candidates).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 2, "{outcome:#?}");
    eventually("the namespace and the CRD are gone", || {
        let (namespaces, crds, namespace, crd_name) = (
            namespaces.clone(),
            crds.clone(),
            namespace.clone(),
            format!("gadgets.{group}"),
        );
        async move {
            namespaces
                .get_opt(&namespace)
                .await
                .ok()
                .flatten()
                .is_none()
                && crds.get_opt(&crd_name).await.ok().flatten().is_none()
        }
    })
    .await;
    delete_quietly(namespaces, &ledger_namespace).await;
}

fn sink_with(client: &kube::Client, ledger_namespace: &str, options: KubeOptions) -> KubeSink {
    sink(client, ledger_namespace, options)
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_shipped_rbac_is_enough_for_the_kube_sink_on_a_live_cluster() {
    let client = admin().await;
    // The ServiceAccount, ClusterRole and binding exactly as deploy/agent.yaml ships them.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/agent.yaml");
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(&path).expect("reads")).expect("YAML");
    for kind in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    ] {
        let document = documents
            .iter()
            .find(|d| d["kind"] == kind)
            .expect("in deploy/agent.yaml");
        let plural = format!("{}s", kind.to_lowercase());
        apply_as_admin(&client, document, &plural).await;
    }
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), "flotilla-system");
    let request =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .expect("a TokenRequest");
    let token = accounts
        .create_token_request("flotilla-agent", &PostParams::default(), &request)
        .await
        .expect("a token for the agent's ServiceAccount")
        .status
        .expect("issued")
        .token;
    let mut config = kube::Config::infer().await.expect("the kubeconfig");
    config.auth_info = serde_json::from_value(json!({"token": token})).expect("auth info");
    config.default_namespace = "flotilla-system".into();
    let restricted = kube::Client::try_from(config).expect("a client");

    let namespace = unique("flotilla-test");
    let cluster = unique("live");
    let rbac = |kind: &str, ns: &str, name: &str, rest: Value| {
        object("rbac.authorization.k8s.io/v1", kind, ns, name, rest)
    };
    let first = bundle(
        &cluster,
        vec![
            kube_namespace(&namespace),
            kube_config_map(&namespace, "settings", "v"),
            rbac(
                "Role",
                &namespace,
                "pod-reader",
                json!({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
            ),
            rbac(
                "RoleBinding",
                &namespace,
                "pod-reader",
                json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]}),
            ),
        ],
    );
    let mut sink = KubeSink::with_client(restricted, KubeOptions::default());
    let outcome = sink.apply(&first, &[]).await;
    assert!(
        outcome.complete,
        "the shipped ClusterRole is not enough: {outcome:#?}"
    );
    let second = bundle(&cluster, vec![kube_namespace(&namespace)]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 3, "{outcome:#?}");
    delete_quietly(
        api(&client, "v1", "Namespace", "namespaces", None),
        &namespace,
    )
    .await;
    delete_quietly(
        api(
            &client,
            "v1",
            "ConfigMap",
            "configmaps",
            Some("flotilla-system"),
        ),
        &format!("flotilla-inventory-{cluster}"),
    )
    .await;
}
