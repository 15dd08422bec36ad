//! The kube sink against a mocked Kubernetes API (tower-test, as kube-rs tests
//! itself): every test states the exact, ordered requests an apply makes.

use std::pin::pin;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tower_test::mock;

use super::*;
use crate::cache::InventoryEntry;
use crate::sink::{DIGEST_ANNOTATION, PRUNE_ANNOTATION};
use crate::testing::bundle_of;

type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Responder = Box<dyn FnOnce(&Value) -> (u16, Value) + Send>;

/// One expected request, written `METHOD path?query [content-type]`, and its answer.
struct Exchange {
    expect: String,
    respond: Responder,
}

fn on(expect: &str, respond: impl FnOnce(&Value) -> (u16, Value) + Send + 'static) -> Exchange {
    Exchange {
        expect: expect.to_string(),
        respond: Box::new(respond),
    }
}

/// Answers with `body`.
fn reply(body: Value) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    move |_| (200, body)
}

/// Answers a PATCH with the applied object, plus `extra` merged at the top level
/// (a status, a generation), as a server returns the object after applying it.
fn echo(extra: Value) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    move |sent| {
        let mut object = sent.clone();
        if let (Some(object), Some(extra)) = (object.as_object_mut(), extra.as_object()) {
            for (key, value) in extra {
                object.insert(key.clone(), value.clone());
            }
        }
        (200, object)
    }
}

fn fail(
    code: u16,
    reason: &str,
    message: &str,
) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    move |_| (code, body)
}

fn resources(group_version: &str, kinds: &[(&str, &str, bool)]) -> Value {
    let list: Vec<Value> = kinds
        .iter()
        .map(|(plural, kind, namespaced)| {
            json!({"name": plural, "singularName": "", "namespaced": namespaced,
                   "kind": kind, "verbs": ["get", "patch", "delete"]})
        })
        .chain(std::iter::once(
            json!({"name": "deployments/status", "singularName": "",
            "namespaced": true, "kind": "Deployment", "verbs": ["get"]}),
        ))
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
           "resources": list})
}

fn core_resources() -> Value {
    resources(
        "v1",
        &[
            ("namespaces", "Namespace", false),
            ("configmaps", "ConfigMap", true),
            ("secrets", "Secret", true),
        ],
    )
}

fn apps_resources() -> Value {
    resources("apps/v1", &[("deployments", "Deployment", true)])
}

fn crd_resources() -> Value {
    resources(
        "apiextensions.k8s.io/v1",
        &[(
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
        )],
    )
}

fn widget_resources() -> Value {
    resources("example.com/v1", &[("widgets", "Widget", true)])
}

/// Serves `scenario` in order while the sink runs, answering anything unexpected
/// with a 500; returns every request seen (line and JSON body), expected or not.
async fn serve(handle: Handle, scenario: Vec<Exchange>) -> Vec<(String, Value)> {
    let mut handle = pin!(handle);
    let mut scenario = scenario.into_iter();
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(600), handle.next_request()).await;
        let Ok(Some((request, send))) = next else {
            return seen;
        };
        let mut line = format!(
            "{} {}",
            request.method(),
            request
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or_default()
        );
        if let Some(content_type) = request.headers().get(http::header::CONTENT_TYPE) {
            line = format!("{line} [{}]", content_type.to_str().unwrap_or("?"));
        }
        let bytes = request
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (status, answer) = match scenario.next() {
            Some(exchange) if exchange.expect == line => (exchange.respond)(&body),
            _ => fail(500, "Unexpected", "the test did not expect this request")(&body),
        };
        seen.push((line, body));
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
                .expect("a valid response"),
        );
    }
}

fn lines(seen: &[(String, Value)]) -> Vec<&str> {
    seen.iter().map(|(line, _)| line.as_str()).collect()
}

const APPLY: &str = "?&fieldManager=flotilla [application/apply-patch+yaml]";

fn crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"kind": "Widget", "plural": "widgets"},
                    "versions": [{"name": "v1", "served": true, "storage": true}]}})
}

fn namespace() -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "demo"}, "data": {"k": "v"}})
}

fn deployment(replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "demo"},
           "spec": {"replicas": replicas,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}})
}

fn widget() -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
           "metadata": {"name": "w1", "namespace": "demo"}, "spec": {"size": 3}})
}

fn established(is: bool) -> Value {
    let status = if is { "True" } else { "False" };
    json!({"status": {"conditions": [{"type": "Established", "status": status}]}})
}

/// The CRD as the server returns it, Established or not yet.
fn crd_with(is_established: bool) -> Value {
    let mut object = crd();
    object["status"] = established(is_established)["status"].clone();
    object
}

fn rolled_out(replicas: i64, available: i64) -> Value {
    json!({"metadata": {"name": "web", "namespace": "demo", "generation": 2},
           "status": {"observedGeneration": 2, "replicas": replicas,
                      "updatedReplicas": replicas, "availableReplicas": available}})
}

/// A live object as a GET returns it, labelled for `cluster` (or not) and annotated.
fn live(object: Value, cluster: Option<&str>, annotations: Value) -> Value {
    let mut object = object;
    if let Some(cluster) = cluster {
        object["metadata"]["labels"] = json!({CLUSTER_LABEL: cluster});
    }
    object["metadata"]["annotations"] = annotations;
    object
}

fn states(outcome: &ApplyOutcome) -> Vec<(String, ResourceState)> {
    outcome
        .resources
        .iter()
        .map(|r| (format!("{}/{}", r.kind, r.name), r.state))
        .collect()
}

fn sink() -> (KubeSink, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        KubeSink::with_client(kube::Client::new(service, "default"), false),
        handle,
    )
}

#[tokio::test(start_paused = true)]
async fn first_apply_installs_definitions_waits_for_them_then_namespaces_then_the_rest() {
    let (mut sink, handle) = sink();
    let bundle = bundle_of(
        "edge-1",
        vec![
            config_map("cfg"),
            namespace(),
            crd(),
            deployment(2),
            widget(),
        ],
    );
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    let scenario = vec![
        on("GET /apis/apiextensions.k8s.io/v1", reply(crd_resources())),
        on(&format!("PATCH {crd_path}{APPLY}"), echo(json!({}))),
        on(&format!("GET {crd_path}"), reply(crd_with(false))),
        on(&format!("GET {crd_path}"), reply(crd_with(true))),
        on("GET /api/v1", reply(core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo{APPLY}"),
            echo(json!({})),
        ),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/cfg{APPLY}"),
            echo(json!({})),
        ),
        on("GET /apis/apps/v1", reply(apps_resources())),
        on(
            &format!("PATCH /apis/apps/v1/namespaces/demo/deployments/web{APPLY}"),
            echo(rolled_out(2, 1)),
        ),
        on("GET /apis/example.com/v1", reply(widget_resources())),
        on(
            &format!("PATCH /apis/example.com/v1/namespaces/demo/widgets/w1{APPLY}"),
            echo(json!({})),
        ),
    ];
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, scenario));
    let started = tokio::time::Instant::now();
    let outcome = sink.apply(&bundle, &[]).await;
    let waited = started.elapsed();
    drop(sink);
    let seen = server.await.expect("server ran");

    assert_eq!(lines(&seen), expected);
    assert!(outcome.complete, "{outcome:?}");
    assert_eq!(
        states(&outcome),
        [
            (
                "CustomResourceDefinition/widgets.example.com".into(),
                ResourceState::Applied
            ),
            ("Namespace/demo".into(), ResourceState::Applied),
            ("ConfigMap/cfg".into(), ResourceState::Applied),
            ("Deployment/web".into(), ResourceState::Progressing),
            ("Widget/w1".into(), ResourceState::Applied),
        ]
    );
    assert_eq!(outcome.resources[3].message, "1 of 2 replicas available");
    assert!(
        waited >= Duration::from_secs(1),
        "polled the CRD once a second: {waited:?}"
    );
    // Every object carries the cluster label and the bundle digest.
    let (_, deployment_body) = &seen[8];
    assert_eq!(
        deployment_body["metadata"]["labels"][CLUSTER_LABEL],
        "edge-1"
    );
    assert_eq!(
        deployment_body["metadata"]["annotations"][DIGEST_ANNOTATION],
        bundle.digest.as_str()
    );
    assert_eq!(deployment_body["spec"]["replicas"], 2);
    // A cluster-scoped object is sent without a namespace.
    assert_eq!(seen[5].1["metadata"].get("namespace"), None);
}

#[tokio::test(start_paused = true)]
async fn an_update_prunes_what_left_in_reverse_order_but_not_protected_or_foreign_objects() {
    let (mut sink, handle) = sink();
    let previous = bundle_of(
        "edge-1",
        vec![
            crd(),
            namespace(),
            config_map("cfg"),
            config_map("foreign"),
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "kept", "namespace": "demo"}}),
            deployment(2),
            widget(),
        ],
    );
    let bundle = bundle_of("edge-1", vec![crd(), namespace(), deployment(3)]);
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    let scenario = vec![
        on("GET /apis/apiextensions.k8s.io/v1", reply(crd_resources())),
        on(&format!("PATCH {crd_path}{APPLY}"), echo(established(true))),
        on("GET /api/v1", reply(core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo{APPLY}"),
            echo(json!({})),
        ),
        on("GET /apis/apps/v1", reply(apps_resources())),
        on(
            &format!("PATCH /apis/apps/v1/namespaces/demo/deployments/web{APPLY}"),
            echo(rolled_out(3, 3)),
        ),
        on("GET /apis/example.com/v1", reply(widget_resources())),
        on(
            "GET /apis/example.com/v1/namespaces/demo/widgets/w1",
            reply(live(widget(), Some("edge-1"), json!({}))),
        ),
        on(
            "DELETE /apis/example.com/v1/namespaces/demo/widgets/w1? [application/json]",
            reply(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})),
        ),
        on(
            "GET /api/v1/namespaces/demo/secrets/kept",
            reply(live(
                json!({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "kept", "namespace": "demo"}}),
                Some("edge-1"),
                json!({PRUNE_ANNOTATION: "disabled"}),
            )),
        ),
        on(
            "GET /api/v1/namespaces/demo/configmaps/foreign",
            reply(live(config_map("foreign"), None, json!({}))),
        ),
        on(
            "GET /api/v1/namespaces/demo/configmaps/cfg",
            reply(live(config_map("cfg"), Some("edge-1"), json!({}))),
        ),
        on(
            "DELETE /api/v1/namespaces/demo/configmaps/cfg? [application/json]",
            reply(live(config_map("cfg"), Some("edge-1"), json!({}))),
        ),
    ];
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, scenario));
    let prune = crate::cache::Inventory {
        sink: "kube".into(),
        applied: Some(previous.digest.clone()),
        entries: InventoryEntry::of_bundle(&previous),
    }
    .left_out_of(&bundle);
    let outcome = sink.apply(&bundle, &prune).await;
    drop(sink);
    let seen = server.await.expect("server ran");

    assert_eq!(lines(&seen), expected);
    assert!(outcome.complete, "{outcome:?}");
    assert_eq!(
        states(&outcome),
        [
            (
                "CustomResourceDefinition/widgets.example.com".into(),
                ResourceState::Applied
            ),
            ("Namespace/demo".into(), ResourceState::Applied),
            ("Deployment/web".into(), ResourceState::Healthy),
            ("Widget/w1".into(), ResourceState::Pruned),
            ("Secret/kept".into(), ResourceState::Applied),
            ("ConfigMap/foreign".into(), ResourceState::Applied),
            ("ConfigMap/cfg".into(), ResourceState::Pruned),
        ]
    );
    assert!(outcome.resources[4].message.contains("prune: disabled"));
    assert!(outcome.resources[5].message.contains("does not own it"));
    assert_eq!(seen[8].1["propagationPolicy"], "Background");
    assert!(outcome.message.contains("pruned 2"), "{}", outcome.message);
}

fn failing_then_resuming_scenarios() -> (Vec<Exchange>, Vec<Exchange>) {
    let first = vec![
        on("GET /api/v1", reply(core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo{APPLY}"),
            echo(json!({})),
        ),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/cfg{APPLY}"),
            echo(json!({})),
        ),
        on("GET /apis/apps/v1", reply(apps_resources())),
        on(
            &format!("PATCH /apis/apps/v1/namespaces/demo/deployments/web{APPLY}"),
            fail(503, "ServiceUnavailable", "etcd is unavailable"),
        ),
    ];
    let second = vec![
        on("GET /api/v1", reply(core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo{APPLY}"),
            echo(json!({})),
        ),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/cfg{APPLY}"),
            echo(json!({})),
        ),
        on("GET /apis/apps/v1", reply(apps_resources())),
        on(
            &format!("PATCH /apis/apps/v1/namespaces/demo/deployments/web{APPLY}"),
            echo(rolled_out(2, 2)),
        ),
        on("GET /apis/example.com/v1", reply(widget_resources())),
        on(
            &format!("PATCH /apis/example.com/v1/namespaces/demo/widgets/w1{APPLY}"),
            echo(json!({})),
        ),
        on(
            "GET /api/v1/namespaces/demo/configmaps/old",
            reply(live(config_map("old"), Some("edge-1"), json!({}))),
        ),
        on(
            "DELETE /api/v1/namespaces/demo/configmaps/old? [application/json]",
            reply(live(config_map("old"), Some("edge-1"), json!({}))),
        ),
    ];
    (first, second)
}

#[tokio::test(start_paused = true)]
async fn a_failure_mid_way_stops_the_apply_prunes_nothing_and_the_next_try_completes() {
    let bundle = bundle_of(
        "edge-1",
        vec![namespace(), config_map("cfg"), deployment(2), widget()],
    );
    let old = bundle_of("edge-1", vec![config_map("old")]);
    let prune = InventoryEntry::of_bundle(&old);
    let (first, second) = failing_then_resuming_scenarios();

    let (mut sink, handle) = sink();
    let expected: Vec<String> = first.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, first));
    let outcome = sink.apply(&bundle, &prune).await;
    drop(sink);
    assert_eq!(lines(&server.await.expect("server ran")), expected);
    assert!(!outcome.complete);
    assert_eq!(
        states(&outcome),
        [
            ("Namespace/demo".into(), ResourceState::Applied),
            ("ConfigMap/cfg".into(), ResourceState::Applied),
            ("Deployment/web".into(), ResourceState::Failed),
            ("Widget/w1".into(), ResourceState::Failed),
        ]
    );
    assert!(outcome.resources[2].message.contains("etcd is unavailable"));
    assert!(outcome.resources[3].message.starts_with("not attempted"));
    assert!(
        outcome.message.contains("nothing was pruned"),
        "{}",
        outcome.message
    );
    assert!(
        outcome.message.contains("stopped early"),
        "{}",
        outcome.message
    );

    let (mut sink, handle) = self::sink();
    let expected: Vec<String> = second.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, second));
    let outcome = sink.apply(&bundle, &prune).await;
    drop(sink);
    assert_eq!(lines(&server.await.expect("server ran")), expected);
    assert!(outcome.complete, "{outcome:?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 1);
    assert_eq!(outcome.count(ResourceState::Healthy), 1);
}

#[tokio::test(start_paused = true)]
async fn an_object_the_server_rejects_fails_alone_and_the_rest_is_applied() {
    let (mut sink, handle) = sink();
    let bundle = bundle_of("edge-1", vec![config_map("bad"), config_map("good")]);
    let scenario = vec![
        on("GET /api/v1", reply(core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/bad{APPLY}"),
            fail(422, "Invalid", "data[k]: Invalid value"),
        ),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/good{APPLY}"),
            echo(json!({})),
        ),
    ];
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, scenario));
    let prune = InventoryEntry::of_bundle(&bundle_of("edge-1", vec![config_map("old")]));
    let outcome = sink.apply(&bundle, &prune).await;
    drop(sink);
    assert_eq!(lines(&server.await.expect("server ran")), expected);
    assert!(!outcome.complete);
    assert_eq!(
        states(&outcome),
        [
            ("ConfigMap/bad".into(), ResourceState::Failed),
            ("ConfigMap/good".into(), ResourceState::Applied),
        ]
    );
    assert!(
        outcome.resources[0]
            .message
            .contains("422 data[k]: Invalid value")
    );
}

#[tokio::test(start_paused = true)]
async fn conflicts_are_reported_unless_forced_and_unknown_kinds_fail_clearly() {
    let (mut sink, handle) = sink();
    let bundle = bundle_of("edge-1", vec![config_map("cfg"), widget()]);
    let scenario = vec![
        on("GET /api/v1", reply(core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/cfg{APPLY}"),
            fail(
                409,
                "Conflict",
                "Apply failed with 1 conflict: conflict with \"kubectl\"",
            ),
        ),
        on(
            "GET /apis/example.com/v1",
            fail(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        ),
    ];
    let server = tokio::spawn(serve(handle, scenario));
    let outcome = sink.apply(&bundle, &[]).await;
    drop(sink);
    assert_eq!(server.await.expect("server ran").len(), 3);
    assert!(outcome.resources[0].message.contains("--force-conflicts"));
    assert!(
        outcome.resources[1]
            .message
            .contains("does not serve kind Widget in example.com/v1"),
        "{}",
        outcome.resources[1].message
    );

    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let mut forced = KubeSink::with_client(kube::Client::new(service, "default"), true);
    let bundle = bundle_of("edge-1", vec![config_map("cfg")]);
    let scenario = vec![
        on("GET /api/v1", reply(core_resources())),
        on(
            "PATCH /api/v1/namespaces/demo/configmaps/cfg?&force=true&fieldManager=flotilla [application/apply-patch+yaml]",
            echo(json!({})),
        ),
    ];
    let server = tokio::spawn(serve(handle, scenario));
    let outcome = forced.apply(&bundle, &[]).await;
    drop(forced);
    let seen = server.await.expect("server ran");
    assert_eq!(
        lines(&seen)[1],
        "PATCH /api/v1/namespaces/demo/configmaps/cfg?&force=true&fieldManager=flotilla [application/apply-patch+yaml]"
    );
    assert!(outcome.complete, "{outcome:?}");
}

#[tokio::test(start_paused = true)]
async fn a_definition_that_never_becomes_established_fails_after_the_timeout() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let mut sink = KubeSink::with_client(kube::Client::new(service, "default"), false)
        .with_crd_timeout(Duration::from_secs(3));
    let bundle = bundle_of("edge-1", vec![crd()]);
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    let not_yet = || reply(crd_with(false));
    let scenario = vec![
        on("GET /apis/apiextensions.k8s.io/v1", reply(crd_resources())),
        on(&format!("PATCH {crd_path}{APPLY}"), echo(json!({}))),
        on(&format!("GET {crd_path}"), not_yet()),
        on(&format!("GET {crd_path}"), not_yet()),
        on(&format!("GET {crd_path}"), not_yet()),
        on(&format!("GET {crd_path}"), not_yet()),
    ];
    let server = tokio::spawn(serve(handle, scenario));
    let outcome = sink.apply(&bundle, &[]).await;
    drop(sink);
    assert_eq!(server.await.expect("server ran").len(), 6);
    assert!(!outcome.complete);
    assert!(
        outcome.resources[0]
            .message
            .contains("not Established after 3s"),
        "{}",
        outcome.resources[0].message
    );
}

#[tokio::test(start_paused = true)]
async fn health_is_read_again_for_workloads_only() {
    let (mut sink, handle) = sink();
    let bundle = bundle_of("edge-1", vec![config_map("cfg"), deployment(2)]);
    let scenario = vec![
        on("GET /apis/apps/v1", reply(apps_resources())),
        on(
            "GET /apis/apps/v1/namespaces/demo/deployments/web",
            reply({
                let mut d = deployment(2);
                d["metadata"]["generation"] = json!(2);
                d["status"] = rolled_out(2, 2)["status"].clone();
                d
            }),
        ),
    ];
    let server = tokio::spawn(serve(handle, scenario));
    let health = sink.health(&bundle).await.expect("health read");
    drop(sink);
    assert_eq!(server.await.expect("server ran").len(), 2);
    let states: Vec<ResourceState> = health.iter().map(|h| h.state).collect();
    assert_eq!(states, [ResourceState::Applied, ResourceState::Healthy]);
}

#[test]
fn health_rules_per_kind() {
    let key = |group: &str, kind: &str| ResourceKey {
        group: group.into(),
        kind: kind.into(),
        namespace: "demo".into(),
        name: "x".into(),
    };
    let check = |group: &str, kind: &str, object: Value, expect: ResourceState, says: &str| {
        let (state, message) = health(&key(group, kind), &object);
        assert_eq!((state, message.as_str()), (expect, says), "{kind} {object}");
    };
    use ResourceState::*;
    check("", "ConfigMap", json!({}), Applied, "");
    check(
        "apps",
        "Deployment",
        json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 2}}),
        Progressing,
        "waiting for the controller to observe generation 3",
    );
    check(
        "apps",
        "Deployment",
        json!({"spec": {"replicas": 3}, "status": {"replicas": 4, "updatedReplicas": 3, "availableReplicas": 3}}),
        Progressing,
        "1 old replicas terminating",
    );
    check(
        "apps",
        "Deployment",
        json!({"status": {"conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}),
        Failed,
        "progress deadline exceeded",
    );
    check(
        "apps",
        "Deployment",
        json!({"status": {"replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}}),
        Healthy,
        "1 of 1 replicas available",
    );
    check(
        "apps",
        "StatefulSet",
        json!({"spec": {"replicas": 2}, "status": {"updatedReplicas": 2, "readyReplicas": 1}}),
        Progressing,
        "1 of 2 replicas ready",
    );
    check(
        "apps",
        "StatefulSet",
        json!({"spec": {"replicas": 2, "updateStrategy": {"type": "OnDelete"}}, "status": {"readyReplicas": 2}}),
        Healthy,
        "2 of 2 replicas ready",
    );
    check(
        "apps",
        "DaemonSet",
        json!({"status": {"desiredNumberScheduled": 3, "updatedNumberScheduled": 2, "numberAvailable": 3}}),
        Progressing,
        "2 of 3 pods updated",
    );
    check(
        "apps",
        "DaemonSet",
        json!({"status": {"desiredNumberScheduled": 3, "updatedNumberScheduled": 3, "numberAvailable": 3}}),
        Healthy,
        "3 of 3 pods available",
    );
    check(
        "batch",
        "Job",
        json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
        Healthy,
        "completed",
    );
    check(
        "batch",
        "Job",
        json!({"status": {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}}),
        Failed,
        "BackoffLimitExceeded",
    );
    check(
        "batch",
        "Job",
        json!({"status": {}}),
        Progressing,
        "running",
    );
}

/// The whole agent with the kube sink: a failed apply is reported as failed (the
/// bundle attempted, nothing applied), and after the back-off the next try completes
/// and is reported as applied.
#[tokio::test(start_paused = true)]
async fn the_agent_reports_a_failure_mid_way_and_resumes_after_back_off() {
    use crate::client::Server;
    use crate::{Agent, AgentConfig};

    let bundle = bundle_of(
        "edge-1",
        vec![namespace(), config_map("cfg"), deployment(2), widget()],
    );
    let publish = tempfile::tempdir().expect("tempdir");
    let folder = publish.path().join("v1/clusters/edge-1");
    std::fs::create_dir_all(&folder).expect("mkdir");
    std::fs::write(folder.join("bundle"), bundle.document("main@sha1:1")).expect("publishes");
    let state = tempfile::tempdir().expect("tempdir");
    // The previous run applied a bundle with ConfigMap "old" in it.
    let old = bundle_of("edge-1", vec![config_map("old")]);
    std::fs::write(
        state.path().join("inventory.json"),
        serde_json::to_vec(&crate::cache::Inventory {
            sink: "kube".into(),
            applied: Some(old.digest.clone()),
            entries: InventoryEntry::of_bundle(&old),
        })
        .expect("json"),
    )
    .expect("writes inventory");

    let (first, second) = failing_then_resuming_scenarios();
    let mut scenario = first;
    scenario.extend(second);
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let (sink, handle) = sink();
    let server = tokio::spawn(serve(handle, scenario));

    let mut config = AgentConfig::new(
        Server::File(publish.path().to_path_buf()),
        "edge-1",
        state.path().to_path_buf(),
    );
    config.resync = Duration::ZERO;
    let agent = Agent::new(config, sink);
    let mut reports = agent.reports();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));

    let failed = reports
        .wait_for(|r| r.as_ref().is_some_and(|r| r.attempted.is_some()))
        .await
        .expect("a report")
        .clone()
        .expect("present");
    let started = tokio::time::Instant::now();
    assert_eq!(failed.attempted, Some(bundle.digest.clone()));
    assert_eq!(
        failed.applied,
        Some(old.digest.clone()),
        "the old bundle is still the applied one"
    );
    assert!(!failed.is_success());
    assert!(
        failed.message.contains("etcd is unavailable") || failed.message.contains("stopped early"),
        "{}",
        failed.message
    );

    let done = reports
        .wait_for(|r| {
            r.as_ref()
                .is_some_and(|r| r.applied.as_ref() == Some(&bundle.digest))
        })
        .await
        .expect("a report")
        .clone()
        .expect("present");
    assert!(
        started.elapsed() > Duration::ZERO,
        "the retry waited for its back-off"
    );
    assert!(done.is_success(), "{done:?}");
    assert_eq!(
        done.resources
            .iter()
            .filter(|r| r.state == ResourceState::Pruned)
            .count(),
        1
    );

    let _ = stop.send(());
    running.await.expect("joined").expect("agent ran");
    assert_eq!(lines(&server.await.expect("server ran")), expected);
    let inventory: crate::cache::Inventory =
        serde_json::from_slice(&std::fs::read(state.path().join("inventory.json")).expect("reads"))
            .expect("json");
    assert_eq!(inventory.applied, Some(bundle.digest.clone()));
    assert_eq!(inventory.entries, InventoryEntry::of_bundle(&bundle));
}
