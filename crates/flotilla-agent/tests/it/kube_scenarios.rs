//! The kube sink against the fake API server (crates/flotilla-kube-fake), which answers
//! as a real one does: one scenario per way the sink used to misbehave on a real
//! cluster, each named after the way it used to fail.

use crate::support as agent_support;

use std::time::Duration;

use agent_support::kube::*;
use agent_support::{bundle, publish};
use flotilla_agent::cache::InventoryEntry;
use flotilla_agent::client::Server;
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::kube::KubeOptions;
use flotilla_agent::{Agent, AgentConfig, AgentError};
use flotilla_core::status::{ResourceState, StatusReport};
use flotilla_kube_fake::{FakeApiServer, Fault};
use serde_json::{Value, json};

fn cm(name: &str, value: &str) -> Value {
    kube_config_map("demo", name, value)
}

fn job(name: &str, command: &str, extra: Value) -> Value {
    let mut spec = json!({"backoffLimit": 1,
        "template": {"spec": {"restartPolicy": "Never",
                              "containers": [{"name": "run", "image": "busybox:1.36", "command": ["sh", "-c", command]}]}}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    object("batch/v1", "Job", "demo", name, json!({"spec": spec}))
}

/// Runs an agent that reads its bundles from a publish folder and applies them with
/// the kube sink to `fake`; returns its reports and a way to stop it.
struct RunningAgent {
    reports: tokio::sync::watch::Receiver<Option<StatusReport>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), AgentError>>,
}

impl RunningAgent {
    fn start(
        fake: &FakeApiServer,
        publish: &std::path::Path,
        state: &std::path::Path,
        cluster: &str,
    ) -> RunningAgent {
        let mut config = AgentConfig::new(
            Server::File(publish.to_path_buf()),
            cluster,
            state.to_path_buf(),
        );
        config.resync = Duration::ZERO;
        let agent = Agent::new(config, sink(fake, options()));
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

    async fn report_for(&mut self, digest: &flotilla_core::bundle::Digest) -> StatusReport {
        self.reports
            .wait_for(|r| {
                r.as_ref()
                    .is_some_and(|r| r.applied.as_ref() == Some(digest))
            })
            .await
            .expect("a report")
            .clone()
            .expect("present")
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("joined").expect("the agent ran");
    }
}

// Defect 1: an unhealthy workload is reported failed, but the bundle is applied, its
// leftovers pruned, and `applied` moves.
#[tokio::test(start_paused = true)]
async fn an_unhealthy_workload_is_reported_failed_but_the_bundle_is_applied() {
    let fake = FakeApiServer::new();
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let first = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            cm("old", "1"),
            job("migrate", "exit 1", json!({})),
        ],
    );
    publish(publish_dir.path(), &first);
    let mut agent = RunningAgent::start(&fake, publish_dir.path(), state.path(), "edge-1");
    agent.report_for(&first.digest).await;

    // The Job fails (its controller says so).
    fake.set_status(
        "batch/v1",
        "Job",
        "demo",
        "migrate",
        json!({"failed": 2, "conditions": [
        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}),
    );
    let second = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            cm("new", "1"),
            job("migrate", "exit 1", json!({})),
            deployment("demo", "web", 1),
        ],
    );
    publish(publish_dir.path(), &second);
    let report = agent.report_for(&second.digest).await;

    assert_eq!(report.attempted, Some(second.digest.clone()));
    assert!(
        !report.is_success(),
        "a failed workload is a failure to report"
    );
    let state_of = |report: &StatusReport, kind: &str, name: &str| {
        report
            .resources
            .iter()
            .find(|r| r.key.kind() == kind && r.key.name() == name)
            .map(|r| (r.state, r.message.clone()))
            .expect("a line")
    };
    assert_eq!(
        state_of(&report, "Job", "migrate"),
        (
            ResourceState::Failed,
            "Job has reached the specified backoff limit".into()
        )
    );
    assert_eq!(
        state_of(&report, "ConfigMap", "old").0,
        ResourceState::Pruned
    );
    assert!(
        fake.get("v1", "ConfigMap", "demo", "old").is_none(),
        "the leftover was pruned"
    );
    assert!(report.message.contains("1 failed"), "{}", report.message);
    assert!(
        !report.message.contains("failed to apply"),
        "{}",
        report.message
    );

    // The Deployment, progressing after the apply, misses its progress deadline: the
    // agent follows its health and reports it failed, the bundle still applied.
    assert_eq!(
        state_of(&report, "Deployment", "web").0,
        ResourceState::Progressing
    );
    fake.update("apps/v1", "Deployment", "demo", "web", |d| {
        d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "conditions": [{"type": "Progressing",
            "status": "False", "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"web-5d\" has timed out progressing."}]});
    });
    let followed = agent
        .reports
        .wait_for(|r| {
            r.as_ref().is_some_and(|r| {
                r.resources
                    .iter()
                    .any(|l| l.key.name() == "web" && l.state == ResourceState::Failed)
            })
        })
        .await
        .expect("a report")
        .clone()
        .expect("present");
    agent.stop().await;
    assert_eq!(followed.applied, Some(second.digest.clone()));
    assert!(
        state_of(&followed, "Deployment", "web")
            .1
            .starts_with("progress deadline exceeded")
    );
}

// Defect 2: a 500 for one object fails that object alone.
#[tokio::test(start_paused = true)]
async fn a_typed_patch_error_fails_one_object_and_the_rest_is_applied() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, options());
    let mut bad_env = deployment("demo", "bad", 1);
    bad_env["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "MODE", "value": "a"}, {"name": "MODE", "value": "b"}]);
    let mut undeclared = cm("typo", "1");
    undeclared["dta"] = json!({"k": "v"});
    let bundle = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            undeclared,
            cm("good", "1"),
            bad_env,
            deployment("demo", "fine", 1),
        ],
    );
    let outcome = sink.apply(&bundle, &[]).await;

    assert!(!outcome.complete);
    let (state, message) = line(&outcome, "ConfigMap", "typo");
    assert_eq!(state, ResourceState::Failed);
    assert!(message.contains("500 failed to create typed patch object (demo/typo; /v1, Kind=ConfigMap): .dta: field not declared in schema"), "{message}");
    let (state, message) = line(&outcome, "Deployment", "bad");
    assert_eq!(state, ResourceState::Failed);
    assert!(
        message.contains("duplicate entries for key [name=\"MODE\"]"),
        "{message}"
    );
    assert_eq!(
        line(&outcome, "ConfigMap", "good").0,
        ResourceState::Applied
    );
    assert_eq!(
        line(&outcome, "Deployment", "fine").0,
        ResourceState::Progressing
    );
    assert!(
        !outcome.message.contains("stopped early"),
        "{}",
        outcome.message
    );
    assert!(fake.get("apps/v1", "Deployment", "demo", "fine").is_some());
}

// Defect 2: many 500s in a row stop the apply (the server is in trouble), as do 503s.
#[tokio::test(start_paused = true)]
async fn five_server_errors_in_a_row_or_one_unavailable_answer_stop_the_apply() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, options());
    let names: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    let bundle = bundle(
        "edge-1",
        std::iter::once(kube_namespace("demo"))
            .chain(names.iter().map(|n| cm(n, "1")))
            .collect(),
    );
    fake.fail(
        Fault::status(
            500,
            "InternalError",
            "Internal error occurred: etcdserver: leader changed",
        )
        .on("PATCH", "/configmaps/c")
        .times(usize::MAX),
    );
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(!outcome.complete);
    let attempted = requests(&fake)
        .iter()
        .filter(|r| r.starts_with("PATCH /api/v1/namespaces/demo/configmaps/c"))
        .count();
    assert_eq!(attempted, 5, "stopped after five 500s in a row");
    let (state, message) = line(&outcome, "ConfigMap", "c7");
    assert_eq!(state, ResourceState::Failed);
    assert!(message.starts_with("not attempted"), "{message}");
    assert!(
        outcome
            .message
            .contains("5 requests in a row were answered 500"),
        "{}",
        outcome.message
    );

    let fake = FakeApiServer::new();
    let mut sink = agent_support::kube::sink(&fake, options());
    fake.fail(
        Fault::status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
        .on("PATCH", "/configmaps/c1"),
    );
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(!outcome.complete);
    assert!(
        line(&outcome, "ConfigMap", "c2")
            .1
            .starts_with("not attempted")
    );
    // A connection cut stops it too.
    fake.fail(Fault::disconnect().on("PATCH", "/configmaps/c3"));
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(!outcome.complete);
    let (_, message) = line(&outcome, "ConfigMap", "c3");
    assert!(
        message.contains("no answer from the Kubernetes API"),
        "{message}"
    );
    assert!(
        line(&outcome, "ConfigMap", "c4")
            .1
            .starts_with("not attempted")
    );
    // The next attempt resumes and completes.
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
}

// Defect 2: an admission webhook is registered after the workload that serves it, and
// a webhook that is down fails only the objects it is called for.
#[tokio::test(start_paused = true)]
async fn webhooks_are_applied_after_what_serves_them_and_a_broken_one_fails_only_its_objects() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, options());
    let webhook = |name: &str, service: &str, resources: Value| {
        object(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "",
            name,
            json!({"webhooks": [{"name": format!("{name}.example.com"), "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": "hooks", "name": service, "path": "/validate"}},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["", "apps"], "apiVersions": ["v1"],
                           "resources": resources}]}]}),
        )
    };
    let service = object(
        "v1",
        "Service",
        "hooks",
        "validator",
        json!({"spec": {"ports": [{"port": 443}]}}),
    );
    // In bundle order the webhook (group admissionregistration.k8s.io) sorts before the
    // Service it calls: applied first, it would refuse the Service itself.
    let bundle = bundle(
        "edge-1",
        vec![
            webhook(
                "check",
                "validator",
                json!(["services", "deployments", "configmaps"]),
            ),
            kube_namespace("hooks"),
            service,
            deployment("hooks", "validator", 1),
            kube_config_map("hooks", "settings", "1"),
        ],
    );
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let order: Vec<String> = requests(&fake)
        .into_iter()
        .filter(|r| r.starts_with("PATCH"))
        .collect();
    assert!(
        order[order.len() - 2].contains("validatingwebhookconfigurations/check"),
        "{order:#?}"
    );

    // A second webhook whose Service does not exist fails what it matches, alone.
    fake.insert(webhook("broken", "missing", json!(["secrets"])), "helm");
    let next = bundle_with(
        &bundle,
        vec![
            kube_config_map("hooks", "more", "1"),
            object("v1", "Secret", "hooks", "s", json!({})),
        ],
    );
    let outcome = sink.apply(&next, &[]).await;
    assert!(!outcome.complete);
    let (state, message) = line(&outcome, "Secret", "s");
    assert_eq!(state, ResourceState::Failed);
    assert!(
        message
            .contains("500 Internal error occurred: failed calling webhook \"broken.example.com\""),
        "{message}"
    );
    assert_eq!(
        line(&outcome, "ConfigMap", "more").0,
        ResourceState::Applied
    );
}

fn bundle_with(
    base: &flotilla_core::bundle::Bundle,
    more: Vec<Value>,
) -> flotilla_core::bundle::Bundle {
    let values = base
        .resources
        .iter()
        .map(|r| r.value())
        .chain(more)
        .collect();
    bundle(&base.cluster, values)
}

// Defect 3: prune deletes only what flotilla created; Namespaces and CRDs only when
// allowed and unused.
#[tokio::test(start_paused = true)]
async fn prune_deletes_what_flotilla_created_and_leaves_what_it_adopted() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    fake.insert(cm("theirs", "1"), "kubectl");
    let mut sink = sink(&fake, options());
    // Server-side apply adopts an object whose fields agree: the apply answers 200.
    let first = bundle(
        "edge-1",
        vec![kube_namespace("demo"), cm("theirs", "1"), cm("mine", "1")],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    let second = bundle("edge-1", vec![cm("kept", "1")]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(line(&outcome, "ConfigMap", "mine").0, ResourceState::Pruned);
    let (state, message) = line(&outcome, "ConfigMap", "theirs");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("existed before flotilla first applied it"),
        "{message}"
    );
    // The namespace existed too (flotilla adopted it), and the bundle still uses it.
    let (state, message) = line(&outcome, "Namespace", "demo");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("existed before flotilla first applied it"),
        "{message}"
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "theirs").is_some());
    assert!(fake.get("v1", "ConfigMap", "demo", "mine").is_none());
    assert!(fake.get("v1", "Namespace", "", "demo").is_some());
}

/// A prune cut short (a delete refused with 503) is tried again with the same list:
/// an adopted object it left in place the first time is left in place again, never
/// taken for flotilla's because its record went with the first try.
#[tokio::test(start_paused = true)]
async fn an_adopted_object_stays_after_a_prune_that_was_cut_short_is_tried_again() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    fake.insert(cm("theirs", "1"), "kubectl");
    let mut sink = sink(&fake, options());
    let first = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            cm("theirs", "1"),
            cm("other", "1"),
            cm("mine", "1"),
        ],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    let second = bundle("edge-1", vec![kube_namespace("demo"), cm("kept", "1")]);
    let gone = prune_list(&first, &second);
    // Pruned in reverse apply order: `theirs` is left in place, then `other`'s
    // delete is refused and the prune stops.
    fake.fail(
        Fault::status(503, "ServiceUnavailable", "try again").on("DELETE", "configmaps/other"),
    );
    let cut_short = sink.apply(&second, &gone).await;
    assert!(!cut_short.complete, "{cut_short:#?}");
    assert_eq!(
        line(&cut_short, "ConfigMap", "theirs").0,
        ResourceState::Applied
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "theirs").is_some());
    // The agent keeps its inventory of before and tries again.
    let again = sink.apply(&second, &gone).await;
    assert!(again.complete, "{again:#?}");
    let (state, message) = line(&again, "ConfigMap", "theirs");
    assert_eq!(state, ResourceState::Applied, "{message}");
    assert!(
        message.contains("existed before flotilla first applied it"),
        "{message}"
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "theirs").is_some());
    assert!(fake.get("v1", "ConfigMap", "demo", "other").is_none());
    assert!(fake.get("v1", "ConfigMap", "demo", "mine").is_none());
}

#[tokio::test(start_paused = true)]
async fn namespaces_and_definitions_are_pruned_only_when_allowed_and_unused() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, options());
    let widgets = crd(
        "example.com",
        "Widget",
        "widgets",
        json!([served("v1", true)]),
    );
    let widget = object(
        "example.com/v1",
        "Widget",
        "team",
        "w1",
        json!({"spec": {"size": 1}}),
    );
    let first = bundle(
        "edge-1",
        vec![
            widgets.clone(),
            kube_namespace("team"),
            widget.clone(),
            kube_config_map("team", "cfg", "1"),
        ],
    );
    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");

    // The CRD and the Namespace leave the bundle, but a Widget and a ConfigMap in
    // the namespace stay: both are kept, and listed for a later try.
    let second = bundle(
        "edge-1",
        vec![widget.clone(), kube_config_map("team", "cfg", "1")],
    );
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        line(&outcome, "CustomResourceDefinition", "widgets.example.com")
            .1
            .contains("the bundle still holds Widget resources")
    );
    assert!(
        line(&outcome, "Namespace", "team")
            .1
            .contains("resources of the bundle are still in it")
    );
    let kept: Vec<&str> = outcome.kept.iter().map(|e| e.name()).collect();
    assert_eq!(kept, ["team", "widgets.example.com"]);

    // Everything goes: without the opt-in, Namespace and CRD stay, for good.
    let third = bundle("edge-1", vec![kube_namespace("other")]);
    let mut candidates = prune_list(&second, &third);
    candidates.extend(outcome.kept.clone());
    let outcome = sink.apply(&third, &candidates).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(line(&outcome, "Widget", "w1").0, ResourceState::Pruned);
    assert!(
        line(&outcome, "Namespace", "team")
            .1
            .contains("deleting a Namespace deletes everything in it")
    );
    assert!(
        line(&outcome, "CustomResourceDefinition", "widgets.example.com")
            .1
            .contains("--prune-namespaces-and-crds")
    );
    assert!(outcome.kept.is_empty());
    assert!(fake.get("v1", "Namespace", "", "team").is_some());

    // With the opt-in they are deleted: the Namespace goes Terminating.
    let mut allowed = sink_with_prune(&fake);
    let outcome = allowed.apply(&third, &candidates).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        line(&outcome, "Namespace", "team"),
        (
            ResourceState::Pruned,
            "deleted; the namespace is terminating".into()
        )
    );
    assert_eq!(
        line(&outcome, "CustomResourceDefinition", "widgets.example.com").0,
        ResourceState::Pruned
    );
    assert_eq!(
        fake.get("v1", "Namespace", "", "team")
            .expect("terminating")["status"]["phase"],
        "Terminating"
    );
    assert!(
        fake.get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "widgets.example.com"
        )
        .is_none()
    );
}

fn sink_with_prune(fake: &FakeApiServer) -> flotilla_agent::sink::kube::KubeSink {
    sink(
        fake,
        KubeOptions {
            prune_namespaces_and_crds: true,
            ..options()
        },
    )
}

// Defect 3: a delete names the object it means: one changed or made again since it
// was read is not deleted.
#[tokio::test(start_paused = true)]
async fn an_object_changed_between_the_read_and_the_delete_is_not_deleted() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, options());
    let first = bundle(
        "edge-1",
        vec![kube_namespace("demo"), cm("old", "1"), cm("again", "1")],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    // Someone deletes "again" and makes it anew (with flotilla's label, say by a restore).
    fake.remove("v1", "ConfigMap", "demo", "again");
    let mut restored = cm("again", "1");
    restored["metadata"]["labels"] = json!({"flotilla.dev/cluster": "edge-1"});
    fake.insert(restored, "velero");
    // A controller writes to "old" just after the agent read it.
    fake.before("DELETE", "/configmaps/old", |fake| {
        fake.update("v1", "ConfigMap", "demo", "old", |cm| {
            cm["data"]["k"] = json!("2")
        });
    });
    let second = bundle("edge-1", vec![kube_namespace("demo")]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "ConfigMap", "old");
    assert_eq!(state, ResourceState::Applied);
    assert!(message.contains("409 conflict: Operation cannot be fulfilled on configmaps \"old\": Precondition failed: ResourceVersion"), "{message}");
    assert!(
        line(&outcome, "ConfigMap", "again")
            .1
            .contains("made again by someone else")
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "old").is_some());
    assert!(fake.get("v1", "ConfigMap", "demo", "again").is_some());
    // "old" stays listed and goes at the next apply.
    let kept: Vec<&str> = outcome.kept.iter().map(|e| e.name()).collect();
    assert_eq!(kept, ["old"]);
    let outcome = sink.apply(&second, &outcome.kept).await;
    assert_eq!(line(&outcome, "ConfigMap", "old").0, ResourceState::Pruned);
}

// Defect 4: a 403 names the verb and the resource, including `create` for an apply
// that creates and `escalate` for a role.
#[tokio::test(start_paused = true)]
async fn a_forbidden_apply_says_which_verb_is_missing() {
    let fake = FakeApiServer::new().with_rules(&json!([
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"], "resourceNames": ["flotilla-inventory-edge-1"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create"]}
    ]));
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(&fake, options());
    let role = object(
        "rbac.authorization.k8s.io/v1",
        "Role",
        "demo",
        "reader",
        json!({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
    );
    let bundle = bundle("edge-1", vec![cm("new", "1"), role]);
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(!outcome.complete);
    let (_, message) = line(&outcome, "ConfigMap", "new");
    assert!(
        message.contains(
            "cannot create resource \"configmaps\" in API group \"\" in the namespace \"demo\""
        ),
        "{message}"
    );
    assert!(
        message.contains("needs `create` on configmaps"),
        "{message}"
    );
    let (_, message) = line(&outcome, "Role", "reader");
    assert!(
        message.contains("is attempting to grant RBAC permissions not currently held"),
        "{message}"
    );
    assert!(
        message.contains("`escalate` on roles and clusterroles"),
        "{message}"
    );
}

// Defect 5: a prune that cannot succeed leaves the object in place and does not block.
#[tokio::test(start_paused = true)]
async fn prunes_that_cannot_succeed_do_not_block_the_bundle() {
    let fake = FakeApiServer::new();
    let mut sink = sink_with_prune(&fake);
    let first = bundle(
        "edge-1",
        vec![
            kube_namespace("old-team"),
            kube_namespace("demo"),
            object(
                "v1",
                "ConfigMap",
                "demo",
                "guarded",
                json!({"metadata": {"finalizers": ["example.com/backup"]}}),
            ),
        ],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    // The namespace is already being deleted by someone, held by a finalizer.
    fake.update("v1", "Namespace", "", "old-team", |ns| {
        ns["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        ns["status"]["phase"] = json!("Terminating");
    });
    // A state folder from an older agent also lists kube-public (it was applied once).
    let kube_public = InventoryEntry::new("v1", "Namespace", "", "kube-public");
    let second = bundle("edge-1", vec![kube_namespace("demo")]);
    let mut candidates = prune_list(&first, &second);
    candidates.push(kube_public);
    let outcome = sink.apply(&second, &candidates).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        line(&outcome, "Namespace", "old-team"),
        (
            ResourceState::Pruned,
            "terminating: its deletion is under way".into()
        )
    );
    assert!(
        line(&outcome, "Namespace", "kube-public")
            .1
            .contains("a namespace Kubernetes itself needs")
    );
    assert_eq!(
        line(&outcome, "ConfigMap", "guarded"),
        (
            ResourceState::Pruned,
            "deleted; waiting for its finalizers".into()
        )
    );
    let deletes: Vec<String> = requests(&fake)
        .into_iter()
        .filter(|r| r.starts_with("DELETE"))
        .collect();
    assert_eq!(
        deletes,
        ["DELETE /api/v1/namespaces/demo/configmaps/guarded"],
        "no delete for the terminating or system namespace"
    );

    // Without `delete` on namespaces the refusal leaves it in place and is retried later.
    let fake = FakeApiServer::new().with_rules(&json!([
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "patch", "create"]},
        {"apiGroups": ["*"], "resources": ["configmaps"], "verbs": ["delete"]}]));
    let mut sink = sink_with_prune(&fake);
    let first = bundle(
        "edge-1",
        vec![kube_namespace("old-team"), kube_namespace("demo")],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "Namespace", "old-team");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("left in place: the delete was refused: 403")
            && message.contains("needs `delete` on namespaces"),
        "{message}"
    );
    assert_eq!(outcome.kept.len(), 1);
}

// Defect 6: a kind whose version is no longer served is found in another version.
#[tokio::test(start_paused = true)]
async fn an_object_of_a_version_no_longer_served_is_found_in_another_and_pruned() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, options());
    let widgets = |versions: Value| crd("example.com", "Widget", "widgets", versions);
    let hpa = object(
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
        "demo",
        "web",
        json!({"spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 3}}),
    );
    let widget = object(
        "example.com/v1beta1",
        "Widget",
        "demo",
        "w1",
        json!({"spec": {"size": 1}}),
    );
    let first = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            widgets(json!([served("v1beta1", true), served("v1", false)])),
            widget,
            hpa,
        ],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    // The CRD stops serving v1beta1; the inventory of an older agent says the HPA was
    // applied as autoscaling/v2beta2 (no longer served since Kubernetes 1.26).
    let mut v1 = served("v1", true);
    v1["storage"] = json!(true);
    let mut v1beta1 = served("v1beta1", false);
    v1beta1["served"] = json!(false);
    let second = bundle(
        "edge-1",
        vec![kube_namespace("demo"), widgets(json!([v1beta1, v1]))],
    );
    let mut candidates = prune_list(&first, &second);
    for entry in &mut candidates {
        if entry.kind() == "HorizontalPodAutoscaler" {
            let older = InventoryEntry::new(
                "autoscaling/v2beta2",
                entry.kind(),
                entry.namespace(),
                entry.name(),
            );
            *entry = older;
        }
    }
    candidates.push(InventoryEntry::new(
        "gone.example.com/v1",
        "Gizmo",
        "demo",
        "g",
    ));
    let outcome = sink.apply(&second, &candidates).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(line(&outcome, "Widget", "w1").0, ResourceState::Pruned);
    assert_eq!(
        line(&outcome, "HorizontalPodAutoscaler", "web").0,
        ResourceState::Pruned
    );
    assert!(
        fake.get("autoscaling/v2", "HorizontalPodAutoscaler", "demo", "web")
            .is_none()
    );
    assert!(fake.get("example.com/v1", "Widget", "demo", "w1").is_none());
    // A kind served in no version is not claimed as pruned.
    let (state, message) = line(&outcome, "Gizmo", "g");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("is not served in any version"),
        "{message}"
    );
}

// Defect 7: metadata the server sets is not sent back; a real conflict suggests
// --force-conflicts, and forcing takes the field over.
#[tokio::test(start_paused = true)]
async fn exported_manifests_apply_and_only_field_conflicts_suggest_forcing() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(&fake, options());
    let first = bundle("edge-1", vec![cm("exported", "1")]);
    assert!(sink.apply(&first, &[]).await.complete);
    // The manifest as `kubectl get -o yaml` prints it, now stale.
    let mut exported = fake
        .get("v1", "ConfigMap", "demo", "exported")
        .expect("applied");
    exported["data"]["k"] = json!("2");
    fake.update("v1", "ConfigMap", "demo", "exported", |cm| {
        cm["metadata"]["annotations"]["touched"] = json!("yes")
    });
    let second = bundle("edge-1", vec![exported]);
    let outcome = sink.apply(&second, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        fake.get("v1", "ConfigMap", "demo", "exported")
            .expect("there")["data"]["k"],
        "2"
    );

    fake.insert(cm("shared", "kubectl's"), "kubectl");
    let third = bundle("edge-1", vec![cm("shared", "flotilla's")]);
    let outcome = sink.apply(&third, &[]).await;
    assert!(!outcome.complete);
    let (_, message) = line(&outcome, "ConfigMap", "shared");
    assert!(
        message
            .contains("Apply failed with 1 conflict: conflict with \"kubectl\" using v1: .data.k"),
        "{message}"
    );
    assert!(message.contains("--force-conflicts"), "{message}");
    let mut forced = sink_forced(&fake);
    assert!(forced.apply(&third, &[]).await.complete);
    assert_eq!(
        fake.get("v1", "ConfigMap", "demo", "shared")
            .expect("there")["data"]["k"],
        "flotilla's"
    );
}

fn sink_forced(fake: &FakeApiServer) -> flotilla_agent::sink::kube::KubeSink {
    sink(
        fake,
        KubeOptions {
            force_conflicts: true,
            ..options()
        },
    )
}

// Defect 8: a Job that finished and was removed (ttlSecondsAfterFinished) is not
// created again for the same manifest; a changed manifest runs again.
#[tokio::test(start_paused = true)]
async fn a_finished_job_removed_by_its_ttl_is_not_run_again() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(&fake, options());
    let first = bundle(
        "edge-1",
        vec![job(
            "seed",
            "echo seeded",
            json!({"ttlSecondsAfterFinished": 0}),
        )],
    );
    assert!(sink.apply(&first, &[]).await.complete);
    fake.set_status(
        "batch/v1",
        "Job",
        "demo",
        "seed",
        json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}),
    );
    let health = sink.health(&first).await.expect("readable");
    assert_eq!(health[0].state, ResourceState::Healthy);
    // The TTL controller deletes it.
    assert!(fake.remove("batch/v1", "Job", "demo", "seed"));
    fake.clear_exchanges();
    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "Job", "seed");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("creates a Job again only when its manifest changes"),
        "{message}"
    );
    assert!(fake.get("batch/v1", "Job", "demo", "seed").is_none());
    assert!(
        !requests(&fake)
            .iter()
            .any(|r| r.starts_with("PATCH /apis/batch")),
        "{:#?}",
        requests(&fake)
    );
    assert_eq!(
        sink.health(&first).await.expect("readable")[0].state,
        ResourceState::Applied
    );

    let second = bundle(
        "edge-1",
        vec![job(
            "seed",
            "echo seeded again",
            json!({"ttlSecondsAfterFinished": 0}),
        )],
    );
    let outcome = sink.apply(&second, &[]).await;
    assert_eq!(line(&outcome, "Job", "seed").0, ResourceState::Progressing);
    assert!(
        fake.get("batch/v1", "Job", "demo", "seed").is_some(),
        "a new manifest runs again"
    );
}

// Defect 8 and 12: right after a spec change the server returns the old status and a
// raised generation, so the workload is progressing, never healthy at once.
#[tokio::test(start_paused = true)]
async fn right_after_a_change_a_workload_is_progressing() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(&fake, options());
    let first = bundle("edge-1", vec![deployment("demo", "web", 2)]);
    let outcome = sink.apply(&first, &[]).await;
    assert_eq!(
        line(&outcome, "Deployment", "web"),
        (
            ResourceState::Progressing,
            "waiting for the controller to observe generation 1".into()
        )
    );
    fake.set_status("apps/v1", "Deployment", "demo", "web",
        json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}));
    assert_eq!(
        sink.health(&first).await.expect("readable")[0].state,
        ResourceState::Healthy
    );
    let second = bundle("edge-1", vec![deployment("demo", "web", 3)]);
    let outcome = sink.apply(&second, &[]).await;
    assert_eq!(
        line(&outcome, "Deployment", "web"),
        (
            ResourceState::Progressing,
            "waiting for the controller to observe generation 2".into()
        )
    );
}

// Defect 9: with the state folder lost, the cluster's inventory still prunes.
#[tokio::test(start_paused = true)]
async fn a_lost_state_folder_does_not_leak_objects() {
    let fake = FakeApiServer::new();
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let first = bundle(
        "edge-1",
        vec![kube_namespace("demo"), cm("a", "1"), cm("b", "1")],
    );
    publish(publish_dir.path(), &first);
    {
        let state = tempfile::tempdir().expect("tempdir");
        let mut agent = RunningAgent::start(&fake, publish_dir.path(), state.path(), "edge-1");
        agent.report_for(&first.digest).await;
        agent.stop().await;
        // The state folder is lost with this tempdir.
    }
    assert!(
        fake.get(
            "v1",
            "ConfigMap",
            AGENT_NAMESPACE,
            "flotilla-inventory-edge-1"
        )
        .is_some()
    );
    let second = bundle("edge-1", vec![kube_namespace("demo"), cm("a", "1")]);
    publish(publish_dir.path(), &second);
    let state = tempfile::tempdir().expect("tempdir");
    let mut agent = RunningAgent::start(&fake, publish_dir.path(), state.path(), "edge-1");
    let report = agent.report_for(&second.digest).await;
    agent.stop().await;
    assert!(
        fake.get("v1", "ConfigMap", "demo", "b").is_none(),
        "{report:#?}"
    );
    assert!(
        report
            .resources
            .iter()
            .any(|r| r.key.name() == "b" && r.state == ResourceState::Pruned)
    );
}

// Defect 10: a cluster name that cannot be a label value is refused at start; the
// API server would refuse every object.
#[tokio::test(start_paused = true)]
async fn a_cluster_name_that_is_no_label_value_is_refused_at_start() {
    let fake = FakeApiServer::new();
    let long = "edge-".repeat(13);
    // What the API server does with it: every write is invalid.
    let mut sink = sink(&fake, options());
    let outcome = sink.apply(&bundle(&long, vec![cm("a", "1")]), &[]).await;
    assert!(!outcome.complete);
    assert!(
        outcome.message.contains("422")
            && outcome
                .message
                .contains("must be no more than 63 characters"),
        "{}",
        outcome.message
    );

    let fake = FakeApiServer::new();
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let agent = RunningAgent::start(&fake, publish_dir.path(), state.path(), &long);
    let err = agent.task.await.expect("joined").expect_err("refused");
    assert!(matches!(err, AgentError::ClusterName(_)), "{err}");
    assert!(err.to_string().contains("65 characters"), "{err}");
    assert!(fake.exchanges().is_empty(), "nothing was sent");
}

// Defect 11: each request has its own timeout.
#[tokio::test(start_paused = true)]
async fn a_request_that_never_answers_times_out_on_its_own_timeout() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(
        &fake,
        KubeOptions {
            request_timeout: Duration::from_secs(20),
            ..options()
        },
    );
    fake.fail(Fault::hang().on("PATCH", "/configmaps/a"));
    let started = tokio::time::Instant::now();
    let outcome = sink
        .apply(&bundle("edge-1", vec![cm("a", "1"), cm("b", "1")]), &[])
        .await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(20) && waited < Duration::from_secs(60),
        "{waited:?}"
    );
    assert!(
        line(&outcome, "ConfigMap", "a")
            .1
            .contains("no answer from the Kubernetes API within 20s")
    );
    assert!(
        line(&outcome, "ConfigMap", "b")
            .1
            .starts_with("not attempted")
    );
}

// Defect 11: a 401 ends the run at once and says so.
#[tokio::test(start_paused = true)]
async fn unauthorized_ends_the_run_at_once() {
    let fake = FakeApiServer::new().with_token("the-right-one");
    let mut sink = sink(&fake, options());
    let outcome = sink
        .apply(
            &bundle(
                "edge-1",
                vec![kube_namespace("demo"), cm("a", "1"), cm("b", "1")],
            ),
            &[],
        )
        .await;
    assert!(!outcome.complete);
    assert_eq!(fake.exchanges().len(), 1, "one refused request is enough");
    assert!(
        outcome
            .message
            .contains("refused the agent's credentials (401 Unauthorized)"),
        "{}",
        outcome.message
    );

    let fake = FakeApiServer::new();
    let mut sink = agent_support::kube::sink(&fake, options());
    fake.fail(Fault::status(401, "Unauthorized", "Unauthorized").on("PATCH", "/configmaps/a"));
    let outcome = sink
        .apply(
            &bundle(
                "edge-1",
                vec![kube_namespace("demo"), cm("a", "1"), cm("b", "1")],
            ),
            &[],
        )
        .await;
    assert!(
        line(&outcome, "ConfigMap", "b")
            .1
            .starts_with("not attempted")
    );
    assert!(
        outcome.message.contains("stopped early"),
        "{}",
        outcome.message
    );
}

// Defect 11: SIGTERM stops an apply under way promptly, and what it learnt is kept.
#[tokio::test(start_paused = true)]
async fn stopping_the_agent_ends_an_apply_under_way_promptly() {
    let fake = FakeApiServer::new();
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let bundle = bundle(
        "edge-1",
        vec![kube_namespace("demo"), cm("a", "1"), cm("b", "1")],
    );
    publish(publish_dir.path(), &bundle);
    fake.fail(Fault::hang().on("PATCH", "/configmaps/b"));
    let agent = RunningAgent::start(&fake, publish_dir.path(), state.path(), "edge-1");
    // Wait until the apply hangs on "b".
    for _ in 0..1000 {
        if fake
            .exchanges()
            .iter()
            .any(|e| e.path.ends_with("/configmaps/b"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = tokio::time::Instant::now();
    agent.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // The cluster's inventory records that flotilla created "a".
    let ledger = fake
        .get(
            "v1",
            "ConfigMap",
            AGENT_NAMESPACE,
            "flotilla-inventory-edge-1",
        )
        .expect("kept");
    let entries: Value =
        serde_json::from_str(ledger["data"]["inventory.json"].as_str().expect("text"))
            .expect("json");
    let a = entries["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["name"] == "a")
        .expect("a");
    assert_eq!(a["origin"], "created");
}

// Secrets sealed to the agent's key are applied with their plain values, opened in
// memory: the API server receives the values, the agent's state folder never does.
#[tokio::test(start_paused = true)]
async fn a_sealed_secret_is_applied_opened_and_its_values_stay_out_of_the_state_folder() {
    use base64::Engine as _;
    use flotilla_core::bundle::SEALED_SECRET_FIELD;
    let fake = FakeApiServer::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let publish_dir = dir.path().join("publish");
    let state = dir.path().join("state");
    // The key the agent makes at its first start, made here beforehand.
    std::fs::create_dir_all(&state).expect("state folder");
    let identity = age::x25519::Identity::generate();
    {
        use age::secrecy::ExposeSecret as _;
        std::fs::write(
            state.join(flotilla_agent::sealed::KEY_FILE),
            format!("{}\n", identity.to_string().expose_secret()),
        )
        .expect("key");
    }
    let plain = br#"{"stringData":{"password":"correct-horse-battery"}}"#;
    let sealed = age::encrypt(&identity.to_public(), plain).expect("seals");
    let secret = object(
        "v1",
        "Secret",
        "demo",
        "db",
        json!({SEALED_SECRET_FIELD: {"sealed": base64::engine::general_purpose::STANDARD.encode(sealed)}}),
    );
    let sealed_bundle = bundle("edge-1", vec![kube_namespace("demo"), secret]);
    publish(&publish_dir, &sealed_bundle);
    let mut agent = RunningAgent::start(&fake, &publish_dir, &state, "edge-1");
    let report = agent.report_for(&sealed_bundle.digest).await;
    assert!(
        report
            .resources
            .iter()
            .all(|r| r.state != ResourceState::Failed),
        "{report:#?}"
    );
    let applied = fake.get("v1", "Secret", "demo", "db").expect("the Secret");
    assert_eq!(applied["stringData"]["password"], "correct-horse-battery");
    assert!(applied.get(SEALED_SECRET_FIELD).is_none(), "{applied}");
    agent.stop().await;
    for entry in std::fs::read_dir(&state).expect("state folder") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        assert!(
            !bytes.windows(21).any(|w| w == b"correct-horse-battery"),
            "{} holds the plain value",
            path.display()
        );
    }
}

/// A Job that failed, holding the phase after it, and was then removed by its TTL is
/// applied (so run) again by the next try, not taken for one that ran.
#[tokio::test(start_paused = true)]
async fn a_failed_job_removed_by_its_ttl_runs_again() {
    let fake = FakeApiServer::new();
    let quick = KubeOptions {
        crd_poll: Duration::from_millis(20),
        phase_timeout: Duration::from_millis(500),
        ..options()
    };
    let mut sink = sink(&fake, quick);
    // Phase `migrate` (a Job running `command`) between `base` and `app`.
    let migrating = |command: &str| {
        agent_support::phased_bundle(
            "edge-1",
            vec![
                ("base", kube_namespace("demo")),
                (
                    "migrate",
                    job(
                        "migrate",
                        command,
                        json!({"ttlSecondsAfterFinished": 60, "backoffLimit": 0}),
                    ),
                ),
                ("app", deployment("demo", "web", 1)),
            ],
            &[&["base"], &["migrate"], &["app"]],
        )
    };
    // The Job fails at the next read of it, as its controller would say.
    let fail_at_next_read = |fake: &FakeApiServer| {
        fake.before("GET", "/jobs/migrate", |fake| {
            let failed = json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                "message": "BackoffLimitExceeded"}]});
            assert!(fake.set_status("batch/v1", "Job", "demo", "migrate", failed));
        });
    };
    let phased = migrating("migrate");
    fail_at_next_read(&fake);
    let outcome = sink.apply(&phased, &[]).await;
    assert!(!outcome.complete, "{outcome:#?}");
    assert_eq!(line(&outcome, "Job", "migrate").0, ResourceState::Failed);
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_none());
    // The TTL controller removes the failed Job; the next try creates it again.
    assert!(fake.remove("batch/v1", "Job", "demo", "migrate"));
    fake.clear_exchanges();
    let outcome = sink.apply(&phased, &[]).await;
    let (_, message) = line(&outcome, "Job", "migrate");
    assert!(!message.contains("ran and was removed"), "{message}");
    assert!(
        fake.get("batch/v1", "Job", "demo", "migrate").is_some(),
        "run again: {:#?}",
        requests(&fake)
    );

    // It fails again, seen while the next phase waits, and this time stays; its image
    // is fixed: the failed Job is deleted and made again from the new manifest (a pod
    // template cannot change).
    fail_at_next_read(&fake);
    let outcome = sink.apply(&phased, &[]).await;
    assert!(!outcome.complete, "{outcome:#?}");
    let fixed = migrating("migrate --fixed");
    fake.clear_exchanges();
    let _ = sink.apply(&fixed, &[]).await;
    let requests = requests(&fake);
    const MIGRATE: &str = "/apis/batch/v1/namespaces/demo/jobs/migrate";
    let position = |line: String| requests.iter().position(|r| *r == line);
    let (deleted, applied) = (
        position(format!("DELETE {MIGRATE}")),
        position(format!("PATCH {MIGRATE}")),
    );
    assert!(deleted.is_some() && deleted < applied, "{requests:#?}");
    let live = fake
        .get("batch/v1", "Job", "demo", "migrate")
        .expect("made again");
    assert!(live.to_string().contains("migrate --fixed"), "{live}");
}

/// A Job whose manifest changed (a new image for a migration) is deleted and created
/// from the new manifest: its pod template cannot be changed in place.
#[tokio::test(start_paused = true)]
async fn a_job_whose_manifest_changed_is_replaced_and_runs_again() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(&fake, options());
    let first = bundle("edge-1", vec![job("seed", "echo seeded", json!({}))]);
    assert!(sink.apply(&first, &[]).await.complete);
    fake.clear_exchanges();
    let second = bundle("edge-1", vec![job("seed", "echo seeded again", json!({}))]);
    let outcome = sink.apply(&second, &[]).await;
    assert!(!outcome.resources.is_empty(), "{outcome:#?}");
    let requests = requests(&fake);
    let position = |line: &str| requests.iter().position(|r| r == line);
    const SEED: &str = "/apis/batch/v1/namespaces/demo/jobs/seed";
    let (deleted, applied) = (
        position(&format!("DELETE {SEED}")),
        position(&format!("PATCH {SEED}")),
    );
    assert!(deleted.is_some() && deleted < applied, "{requests:#?}");
    let live = fake
        .get("batch/v1", "Job", "demo", "seed")
        .expect("made again");
    assert!(live.to_string().contains("echo seeded again"), "{live}");
}

/// The fake API server after flotilla ran Job `seed` (`echo seeded`) in `demo` and the
/// cluster's copy of its inventory was lost.
async fn seed_job_run_and_ledger_lost() -> FakeApiServer {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let first = bundle("edge-1", vec![job("seed", "echo seeded", json!({}))]);
    assert!(sink(&fake, options()).apply(&first, &[]).await.complete);
    assert!(fake.remove(
        "v1",
        "ConfigMap",
        AGENT_NAMESPACE,
        "flotilla-inventory-edge-1"
    ));
    fake
}

/// A Job whose run flotilla has no record of (its ledger was lost, or an agent
/// without one applied it) is replaced the same way when its manifest changes, if
/// it carries the cluster's label; a Job someone else made is left as it is, and
/// the API server's refusal reported.
#[tokio::test(start_paused = true)]
async fn a_job_whose_run_was_not_recorded_is_replaced_when_its_manifest_changes() {
    let fake = seed_job_run_and_ledger_lost().await;
    // Someone else's Job, with the name the next bundle also gives one.
    fake.insert(job("theirs", "echo theirs", json!({})), "kubectl");
    let second = bundle(
        "edge-1",
        vec![
            job("seed", "echo seeded again", json!({})),
            job("theirs", "echo ours", json!({})),
        ],
    );
    // Forced, so that their Job meets the refusal of its template rather than a
    // conflict of field managers.
    let outcome = sink_forced(&fake).apply(&second, &[]).await;
    let (state, message) = line(&outcome, "Job", "seed");
    assert_ne!(state, ResourceState::Failed, "{message}");
    let live = fake
        .get("batch/v1", "Job", "demo", "seed")
        .expect("made again");
    assert!(live.to_string().contains("echo seeded again"), "{live}");
    let (state, message) = line(&outcome, "Job", "theirs");
    assert_eq!(state, ResourceState::Failed);
    assert!(message.contains("field is immutable"), "{message}");
    let theirs = fake.get("batch/v1", "Job", "demo", "theirs").expect("left");
    assert!(theirs.to_string().contains("echo theirs"), "{theirs}");
}

/// A Job that no later phase waits on, seen failed by a status report and then
/// removed by its TTL, is still reported failed, not as a run that finished; it is
/// not created again for the same manifest.
#[tokio::test(start_paused = true)]
async fn a_job_seen_failed_by_a_report_and_removed_by_its_ttl_is_still_reported_failed() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let mut sink = sink(&fake, options());
    let bundle = bundle(
        "edge-1",
        vec![job(
            "seed",
            "exit 1",
            json!({"ttlSecondsAfterFinished": 60, "backoffLimit": 0}),
        )],
    );
    assert!(sink.apply(&bundle, &[]).await.complete);
    let failed = json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                        "message": "BackoffLimitExceeded"}]});
    assert!(fake.set_status("batch/v1", "Job", "demo", "seed", failed));
    let report_line = |statuses: &[flotilla_core::status::ResourceStatus]| {
        statuses
            .iter()
            .find(|s| s.key.name() == "seed")
            .map(|s| (s.state, s.message.clone()))
            .expect("the Job's line")
    };
    let health = sink.health(&bundle).await.expect("health");
    assert_eq!(report_line(&health).0, ResourceState::Failed);

    // The TTL controller removes it.
    assert!(fake.remove("batch/v1", "Job", "demo", "seed"));
    let health = sink.health(&bundle).await.expect("health");
    let (state, message) = report_line(&health);
    assert_eq!(state, ResourceState::Failed, "{message}");
    assert!(message.starts_with("failed, and was removed"), "{message}");
    // A resync reports the same, and runs nothing.
    let outcome = sink.apply(&bundle, &[]).await;
    let (state, message) = line(&outcome, "Job", "seed");
    assert_eq!(state, ResourceState::Failed, "{message}");
    assert!(message.starts_with("failed, and was removed"), "{message}");
    assert!(fake.get("batch/v1", "Job", "demo", "seed").is_none());
    // A new agent (the ledger read back from the cluster) says the same.
    let mut restarted = agent_support::kube::sink(&fake, options());
    let outcome = restarted.apply(&bundle, &[]).await;
    assert!(
        line(&outcome, "Job", "seed")
            .1
            .starts_with("failed, and was removed")
    );
}

/// The Job checked as flotilla's (its label) is the one deleted: one made again by
/// someone else between that read and the delete is left, and the Job reported.
#[tokio::test(start_paused = true)]
async fn a_job_made_again_by_someone_else_before_its_replacement_is_left() {
    let fake = seed_job_run_and_ledger_lost().await;
    // After the read that finds flotilla's label, before the delete's own read.
    fake.before("GET", "/jobs/seed", |fake| {
        fake.before("GET", "/jobs/seed", |fake| {
            assert!(fake.remove("batch/v1", "Job", "demo", "seed"));
            fake.insert(job("seed", "echo theirs", json!({})), "kubectl");
        })
    });
    let second = bundle("edge-1", vec![job("seed", "echo seeded again", json!({}))]);
    let outcome = sink_forced(&fake).apply(&second, &[]).await;
    let (state, message) = line(&outcome, "Job", "seed");
    assert_eq!(state, ResourceState::Failed, "{message}");
    assert!(
        message.contains("made again since it was read"),
        "{message}"
    );
    let live = fake.get("batch/v1", "Job", "demo", "seed").expect("left");
    assert!(live.to_string().contains("echo theirs"), "{live}");
}

/// An apply killed after it created objects (the agent's process died before it
/// recorded the API server's answers at its end) leaves them pending in the cluster's
/// inventory, and the next apply adopts those it finds: it cannot tell that the
/// killed apply made them. A long apply therefore writes the inventory every few
/// seconds: here the bundle's CRD takes seconds to be established before the
/// ConfigMaps are applied, so the answer for `mine`, the first after that wait, is
/// written before the kill,
/// while the apply waits on `zulu`. After a restart, a bundle without them prunes
/// what flotilla made and leaves `theirs`, which someone else made before.
#[tokio::test(start_paused = true)]
async fn an_apply_killed_midway_has_written_what_it_made_before() {
    let fake = FakeApiServer::new().establish_crds_after(Some(3));
    fake.insert(kube_namespace("demo"), "kubectl");
    fake.insert(cm("theirs", "1"), "kubectl");
    let widgets = crd(
        "example.com",
        "Widget",
        "widgets",
        json!([served("v1", true)]),
    );
    let first = bundle(
        "edge-1",
        vec![
            widgets.clone(),
            cm("mine", "1"),
            cm("theirs", "1"),
            cm("zulu", "1"),
        ],
    );
    // The process dies while its apply waits for the API server's answer on `zulu`.
    fake.fail(Fault::hang().on("PATCH", "/configmaps/zulu"));
    {
        let mut killed = sink(&fake, options());
        let cut = tokio::time::timeout(Duration::from_secs(10), killed.apply(&first, &[])).await;
        assert!(cut.is_err(), "the apply was still waiting");
    }
    assert!(fake.get("v1", "ConfigMap", "demo", "mine").is_some());
    assert!(fake.get("v1", "ConfigMap", "demo", "zulu").is_none());
    // A new process applies the same bundle, then one without those ConfigMaps.
    let mut sink = sink(&fake, options());
    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let second = bundle("edge-1", vec![widgets, cm("kept", "1")]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    for name in ["mine", "zulu"] {
        assert_eq!(
            line(&outcome, "ConfigMap", name).0,
            ResourceState::Pruned,
            "{name}"
        );
        assert!(
            fake.get("v1", "ConfigMap", "demo", name).is_none(),
            "{name}"
        );
    }
    let (state, message) = line(&outcome, "ConfigMap", "theirs");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("existed before flotilla first applied it"),
        "{message}"
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "theirs").is_some());
}

/// An apply that finished with an object refused (422) leaves it pending too; if
/// someone then makes that object (with kubectl), the next apply, in a new process,
/// adopts it: it was not made by flotilla, and no later bundle prunes it.
#[tokio::test(start_paused = true)]
async fn an_object_someone_made_after_a_refused_apply_is_adopted() {
    let fake = FakeApiServer::new();
    fake.insert(kube_namespace("demo"), "kubectl");
    let first = bundle(
        "edge-1",
        vec![kube_namespace("demo"), cm("mine", "1"), cm("late", "1")],
    );
    fake.fail(Fault::status(422, "Invalid", "refused once").on("PATCH", "/configmaps/late"));
    let outcome = sink(&fake, options()).apply(&first, &[]).await;
    assert_eq!(line(&outcome, "ConfigMap", "late").0, ResourceState::Failed);
    assert!(fake.get("v1", "ConfigMap", "demo", "late").is_none());
    fake.insert(cm("late", "1"), "kubectl");
    let mut sink = sink(&fake, options());
    assert!(sink.apply(&first, &[]).await.complete);
    let second = bundle("edge-1", vec![kube_namespace("demo"), cm("kept", "1")]);
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert_eq!(line(&outcome, "ConfigMap", "mine").0, ResourceState::Pruned);
    let (state, message) = line(&outcome, "ConfigMap", "late");
    assert_eq!(state, ResourceState::Applied);
    assert!(
        message.contains("existed before flotilla first applied it"),
        "{message}"
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "late").is_some());
}
