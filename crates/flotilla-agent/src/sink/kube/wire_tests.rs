//! What the kube sink puts on the wire, against a mocked transport (tower-test, as
//! kube-rs tests itself): every test states the exact, ordered requests of an apply,
//! answered as a real API server answers them (201 and no status for an object an
//! apply creates). How the sink behaves against a server's answers is tested against
//! the fake API server, in `tests/it/kube_scenarios.rs`.

use std::pin::pin;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tower_test::mock;

use super::*;
use crate::sink::{CLUSTER_LABEL, DIGEST_ANNOTATION};
use crate::testing::{bundle_of, merge};

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

fn reply(code: u16, body: Value) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    move |_| (code, body)
}

/// Answers an apply with the object applied plus `extra` (a uid, a generation), as
/// the server returns it: `code` 201 when it created the object, 200 when it updated.
fn echo(code: u16, extra: Value) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    move |sent| {
        let mut object = sent.clone();
        merge(&mut object, &extra);
        (code, object)
    }
}

fn not_found(resource: &str, name: &str) -> impl FnOnce(&Value) -> (u16, Value) + Send + 'static {
    reply(
        404,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{resource} {name:?} not found"), "reason": "NotFound",
               "details": {"name": name, "kind": resource}, "code": 404}),
    )
}

fn resources(group_version: &str, kinds: &[(&str, &str, bool)]) -> Value {
    let list: Vec<Value> = kinds
        .iter()
        .map(|(plural, kind, namespaced)| {
            json!({"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind,
                   "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        })
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
        ],
    )
}

/// Serves `scenario` in order while the sink runs, answering anything unexpected
/// with a 500; returns every request seen (line and JSON body).
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
            _ => (
                500,
                json!({"kind": "Status", "message": "the test did not expect this request", "code": 500}),
            ),
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
const LEDGER: &str = "/api/v1/namespaces/flotilla-system/configmaps/flotilla-inventory-edge-1";

fn sink(options: KubeOptions) -> (KubeSink, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        KubeSink::with_client(kube::Client::new(service, "flotilla-system"), options),
        handle,
    )
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "demo"}, "data": {"k": "v"}})
}

fn ledger_of(seen: &Value) -> Value {
    serde_json::from_str(
        seen["data"]["inventory.json"]
            .as_str()
            .expect("the inventory"),
    )
    .expect("json")
}

#[tokio::test(start_paused = true)]
async fn a_first_apply_records_its_intent_then_applies_in_order_and_records_what_it_created() {
    let (mut sink, handle) = sink(KubeOptions::default());
    let mut exported = config_map("cfg");
    // As `kubectl get -o yaml` exports it: the server-set fields must not be sent.
    merge(
        &mut exported,
        &json!({"metadata": {"resourceVersion": "4711", "uid": "0ld", "managedFields": []},
                "status": {}}),
    );
    let bundle = bundle_of(
        "edge-1",
        vec![
            exported,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": "demo"},
                   "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                            "template": {"metadata": {"labels": {"app": "web"}},
                                         "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}),
        ],
    );
    let scenario = vec![
        on(
            &format!("GET {LEDGER}"),
            not_found("configmaps", "flotilla-inventory-edge-1"),
        ),
        on(
            &format!(
                "PATCH {LEDGER}?&force=true&fieldManager=flotilla [application/apply-patch+yaml]"
            ),
            echo(201, json!({"metadata": {"uid": "l1"}})),
        ),
        on("GET /api/v1", reply(200, core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo{APPLY}"),
            echo(
                201,
                json!({"metadata": {"uid": "u-ns"}, "status": {"phase": "Active"}}),
            ),
        ),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/cfg{APPLY}"),
            echo(201, json!({"metadata": {"uid": "u-cfg"}})),
        ),
        on(
            "GET /apis/apps/v1",
            reply(
                200,
                resources("apps/v1", &[("deployments", "Deployment", true)]),
            ),
        ),
        // A Deployment an apply creates has generation 1 and no status yet
        // (`pkg/registry/apps/deployment/strategy.go`, PrepareForCreate).
        on(
            &format!("PATCH /apis/apps/v1/namespaces/demo/deployments/web{APPLY}"),
            echo(201, json!({"metadata": {"uid": "u-web", "generation": 1}})),
        ),
        on(
            &format!(
                "PATCH {LEDGER}?&force=true&fieldManager=flotilla [application/apply-patch+yaml]"
            ),
            echo(200, json!({})),
        ),
    ];
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, scenario));
    let outcome = sink.apply(&bundle, &[]).await;
    drop(sink);
    let seen = server.await.expect("server ran");

    assert_eq!(lines(&seen), expected);
    assert!(outcome.complete, "{outcome:?}");
    let states: Vec<(String, ResourceState, String)> = outcome
        .resources
        .iter()
        .map(|r| (r.key.name().to_string(), r.state, r.message.clone()))
        .collect();
    assert_eq!(
        states,
        [
            ("demo".to_string(), ResourceState::Applied, String::new()),
            ("cfg".to_string(), ResourceState::Applied, String::new()),
            (
                "web".to_string(),
                ResourceState::Progressing,
                "waiting for the controller to observe generation 1".to_string()
            ),
        ]
    );
    // The intent is recorded before anything is applied, with nothing known yet.
    let intent = ledger_of(&seen[1].1);
    assert_eq!(intent["cluster"], "edge-1");
    assert!(
        intent["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .all(|e| e["origin"] == "pending")
    );
    assert_eq!(
        seen[1].1["metadata"]["annotations"]["flotilla.dev/prune"],
        "disabled"
    );
    // Every object carries the cluster label and the bundle digest, and nothing the
    // server sets; a cluster-scoped object has no namespace.
    let (_, config_map_body) = &seen[4];
    assert_eq!(
        config_map_body["metadata"],
        json!({"name": "cfg", "namespace": "demo", "labels": {CLUSTER_LABEL: "edge-1"},
               "annotations": {DIGEST_ANNOTATION: bundle.digest.as_str()}})
    );
    assert_eq!(config_map_body.get("status"), None);
    assert_eq!(seen[3].1["metadata"].get("namespace"), None);
    // The last write records what the apply created, with uids.
    let done = ledger_of(&seen[7].1);
    let origins: Vec<(&str, &str, &str)> = done["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default(),
                e["origin"].as_str().unwrap_or_default(),
                e["uid"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        origins,
        [
            ("cfg", "created", "u-cfg"),
            ("demo", "created", "u-ns"),
            ("web", "created", "u-web")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_prune_deletes_in_the_background_on_condition_that_it_is_the_same_object() {
    let (mut sink, handle) = sink(KubeOptions::default());
    let bundle = bundle_of("edge-1", vec![config_map("cfg")]);
    let old = InventoryEntry::new("v1", "ConfigMap", "demo", "old");
    let ledger = json!({"cluster": "edge-1", "entries": [
        {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "demo", "name": "cfg", "origin": "created", "uid": "u-cfg"},
        {"apiVersion": "v1", "kind": "ConfigMap", "namespace": "demo", "name": "old", "origin": "created", "uid": "u-old"}]});
    let scenario = vec![
        on(
            &format!("GET {LEDGER}"),
            reply(
                200,
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "flotilla-inventory-edge-1", "namespace": "flotilla-system"},
                              "data": {"inventory.json": ledger.to_string()}}),
            ),
        ),
        on("GET /api/v1", reply(200, core_resources())),
        on(
            &format!("PATCH /api/v1/namespaces/demo/configmaps/cfg{APPLY}"),
            echo(200, json!({"metadata": {"uid": "u-cfg"}})),
        ),
        on(
            "GET /api/v1/namespaces/demo/configmaps/old",
            reply(
                200,
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "old", "namespace": "demo", "uid": "u-old",
                                           "resourceVersion": "42", "labels": {CLUSTER_LABEL: "edge-1"}}}),
            ),
        ),
        on(
            "DELETE /api/v1/namespaces/demo/configmaps/old? [application/json]",
            reply(
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
                              "details": {"name": "old", "kind": "configmaps", "uid": "u-old"}}),
            ),
        ),
        on(
            &format!(
                "PATCH {LEDGER}?&force=true&fieldManager=flotilla [application/apply-patch+yaml]"
            ),
            echo(200, json!({})),
        ),
    ];
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, scenario));
    let outcome = sink.apply(&bundle, &[old]).await;
    drop(sink);
    let seen = server.await.expect("server ran");

    assert_eq!(lines(&seen), expected);
    assert!(outcome.complete, "{outcome:?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 1);
    let delete = &seen[4].1;
    assert_eq!(delete["propagationPolicy"], "Background");
    assert_eq!(
        delete["preconditions"],
        json!({"uid": "u-old", "resourceVersion": "42"})
    );
    let ledger = ledger_of(&seen[5].1);
    let names: Vec<&str> = ledger["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["cfg"],
        "the pruned object left the cluster's inventory"
    );
}

#[tokio::test(start_paused = true)]
async fn force_conflicts_is_sent_as_force() {
    let options = KubeOptions {
        force_conflicts: true,
        ..KubeOptions::default()
    };
    let (mut sink, handle) = sink(options);
    let bundle = bundle_of("edge-1", vec![config_map("cfg")]);
    let scenario = vec![
        on(
            &format!("GET {LEDGER}"),
            not_found("configmaps", "flotilla-inventory-edge-1"),
        ),
        on(
            &format!(
                "PATCH {LEDGER}?&force=true&fieldManager=flotilla [application/apply-patch+yaml]"
            ),
            echo(201, json!({})),
        ),
        on("GET /api/v1", reply(200, core_resources())),
        on(
            "PATCH /api/v1/namespaces/demo/configmaps/cfg?&force=true&fieldManager=flotilla [application/apply-patch+yaml]",
            echo(200, json!({"metadata": {"uid": "u"}})),
        ),
        on(
            &format!(
                "PATCH {LEDGER}?&force=true&fieldManager=flotilla [application/apply-patch+yaml]"
            ),
            echo(200, json!({})),
        ),
    ];
    let expected: Vec<String> = scenario.iter().map(|e| e.expect.clone()).collect();
    let server = tokio::spawn(serve(handle, scenario));
    let outcome = sink.apply(&bundle, &[]).await;
    drop(sink);
    assert_eq!(lines(&server.await.expect("server ran")), expected);
    assert!(outcome.complete, "{outcome:?}");
}
