//! Apply phases (`spec.dependsOn`) with the kube sink against the fake API server: a
//! phase is applied once the one before is healthy, a phase that is not holds the later
//! ones back, and a restart resumes where the last attempt stopped. What leaves the
//! bundle is pruned in reverse phase order, each phase gone before the next, by the
//! phases of the bundle last applied (kept in the state folder across restarts).

use crate::support as agent_support;

use std::time::Duration;

use agent_support::kube::*;
use agent_support::{bundle, phased_bundle, publish};
use flotilla_agent::client::Server;
use flotilla_agent::sink::kube::KubeOptions;
use flotilla_agent::sink::{Sink, StopSignal};
use flotilla_agent::{Agent, AgentConfig};
use flotilla_core::bundle::Bundle;
use flotilla_core::status::ResourceState::{Applied, Failed, Healthy, Progressing, Pruned};
use flotilla_core::status::StatusReport;
use flotilla_kube_fake::FakeApiServer;
use serde_json::json;
use tokio::time::Instant;

const POLL: Duration = Duration::from_millis(100);
const PHASE_TIMEOUT: Duration = Duration::from_millis(300);

/// Looks every 100 ms, and gives a phase 300 ms.
fn quick() -> KubeOptions {
    KubeOptions {
        crd_poll: POLL,
        phase_timeout: PHASE_TIMEOUT,
        ..options()
    }
}

/// What the Deployment controller writes once `demo/name` is rolled out.
fn make_available(fake: &FakeApiServer, name: &str) {
    let status = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                        "availableReplicas": 1});
    assert!(fake.set_status("apps/v1", "Deployment", "demo", name, status));
}

/// The requests for the bundle's objects, in order: without discovery and the ledger.
fn object_requests(fake: &FakeApiServer) -> Vec<String> {
    requests(fake)
        .into_iter()
        .filter(|l| !l.contains("/configmaps/flotilla-inventory-"))
        .collect()
}

const CRD: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
const NAMESPACE: &str = "/api/v1/namespaces/demo";
const WIDGET: &str = "/apis/example.com/v1/namespaces/demo/widgets/w1";
const DB: &str = "/apis/apps/v1/namespaces/demo/deployments/db";
const WEB_CONFIG: &str = "/api/v1/namespaces/demo/configmaps/web";
const WEB: &str = "/apis/apps/v1/namespaces/demo/deployments/web";

/// `app` depends on `db`, which depends on `operator` (a CRD and a custom resource).
fn chain() -> Bundle {
    phased_bundle(
        "edge-1",
        vec![
            ("operator", kube_namespace("demo")),
            (
                "operator",
                crd(
                    "example.com",
                    "Widget",
                    "widgets",
                    json!([served("v1", true)]),
                ),
            ),
            (
                "operator",
                object(
                    "example.com/v1",
                    "Widget",
                    "demo",
                    "w1",
                    json!({"spec": {}}),
                ),
            ),
            ("db", deployment("demo", "db", 1)),
            ("app", kube_config_map("demo", "web", "1")),
            ("app", deployment("demo", "web", 1)),
        ],
        &[&["operator"], &["db"], &["app"]],
    )
}

/// `app` depends on `db`.
fn two_phases() -> Bundle {
    phased_bundle(
        "edge-1",
        vec![
            ("db", kube_namespace("demo")),
            ("db", deployment("demo", "db", 1)),
            ("app", kube_config_map("demo", "web", "1")),
            ("app", deployment("demo", "web", 1)),
        ],
        &[&["db"], &["app"]],
    )
}

#[tokio::test(start_paused = true)]
async fn each_phase_is_applied_once_the_one_before_is_established_and_healthy() {
    // The CRD is Established on its third read; the Deployment's controller rolls `db`
    // out by the time the agent first looks.
    let fake = FakeApiServer::new().establish_crds_after(Some(3));
    fake.before("GET", "/deployments/db", |fake| make_available(fake, "db"));
    let outcome = sink(&fake, quick()).apply(&chain(), &[]).await;

    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        line(&outcome, "Deployment", "db"),
        (Healthy, "1 of 1 replicas available".into()),
        "the report has the health the wait saw"
    );
    // The last phase is not waited for: its health is followed as any bundle's is.
    assert_eq!(line(&outcome, "Deployment", "web").0, Progressing);
    let patch = |path: &str| format!("PATCH {path}");
    let get = |path: &str| format!("GET {path}");
    assert_eq!(
        object_requests(&fake),
        [
            patch(CRD),
            get(CRD),
            get(CRD),
            get(CRD),
            patch(NAMESPACE),
            patch(WIDGET),
            // Phase 2 only after the CRD was read Established (phase 1 waits for it).
            patch(DB),
            get(DB),
            // Phase 3 only after `db` was read available.
            patch(WEB_CONFIG),
            patch(WEB),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_phase_not_healthy_in_time_holds_the_later_phases_back() {
    let fake = FakeApiServer::new();
    let started = Instant::now();
    let outcome = sink(&fake, quick()).apply(&two_phases(), &[]).await;

    assert!(!outcome.complete, "the agent tries again later");
    let waits = "phase 2 (workloads app) waits for phase 1 (workloads db): Deployment.apps demo/db is \
                 not healthy after 300ms (--phase-timeout): waiting for the controller to observe generation 1";
    assert_eq!(
        outcome.message,
        format!("stopped after phase 1 of 2: {waits}; nothing was pruned")
    );
    assert_eq!(line(&outcome, "Namespace", "demo").0, Applied);
    assert_eq!(line(&outcome, "Deployment", "db").0, Progressing);
    for kind in ["ConfigMap", "Deployment"] {
        assert_eq!(
            line(&outcome, kind, "web"),
            (Failed, format!("not applied: {waits}"))
        );
    }
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            format!("PATCH {DB}"),
            format!("GET {DB}"),
            format!("GET {DB}"),
            format!("GET {DB}"),
        ],
        "db is looked at every 100 ms for 300 ms, and nothing of phase 2 is sent"
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "web").is_none());
    assert_eq!(started.elapsed(), PHASE_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn a_failed_workload_holds_the_later_phases_back_at_once() {
    let fake = FakeApiServer::new();
    fake.before("GET", "/deployments/db", |fake| {
        let status = json!({"observedGeneration": 1, "conditions": [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": "ReplicaSet \"db-5d\" has timed out progressing."}]});
        fake.set_status("apps/v1", "Deployment", "demo", "db", status);
    });
    let options = KubeOptions {
        phase_timeout: Duration::from_secs(600),
        ..quick()
    };
    let started = Instant::now();
    let outcome = sink(&fake, options).apply(&two_phases(), &[]).await;

    assert!(!outcome.complete);
    assert!(
        outcome.message.contains(
            "phase 2 (workloads app) waits for phase 1 (workloads db): Deployment.apps demo/db failed: \
             progress deadline exceeded: ReplicaSet \"db-5d\" has timed out progressing."
        ),
        "{}",
        outcome.message
    );
    assert_eq!(started.elapsed(), POLL, "one look is enough");
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_none());
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_healthy_phases_pass_at_once_and_the_rest_is_applied() {
    let fake = FakeApiServer::new();
    let before = bundle(
        "edge-1",
        vec![kube_namespace("demo"), kube_config_map("demo", "old", "1")],
    );
    assert!(sink(&fake, quick()).apply(&before, &[]).await.complete);
    let next = two_phases();
    let prune = prune_list(&before, &next);

    let held = sink(&fake, quick()).apply(&next, &prune).await;
    assert!(!held.complete, "{held:#?}");
    assert!(
        fake.get("v1", "ConfigMap", "demo", "old").is_some(),
        "nothing is pruned until the last phase is applied"
    );

    // `db` rolls out while the agent is away; a new agent applies the stored bundle.
    make_available(&fake, "db");
    fake.clear_exchanges();
    let outcome = sink(&fake, quick()).apply(&next, &prune).await;

    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(line(&outcome, "Deployment", "db").0, Healthy);
    assert_eq!(line(&outcome, "ConfigMap", "web").0, Applied);
    assert_eq!(line(&outcome, "ConfigMap", "old").0, Pruned);
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            // The apply's answer says `db` is available: no wait, no read.
            format!("PATCH {DB}"),
            format!("PATCH {WEB_CONFIG}"),
            format!("PATCH {WEB}"),
            "GET /api/v1/namespaces/demo/configmaps/old".to_string(),
            "DELETE /api/v1/namespaces/demo/configmaps/old".to_string(),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_bundle_of_one_phase_is_applied_without_waiting() {
    let fake = FakeApiServer::new();
    // Two workloads without dependencies between them: one phase.
    let bundle = phased_bundle(
        "edge-1",
        vec![
            ("db", kube_namespace("demo")),
            ("db", deployment("demo", "db", 1)),
            ("app", deployment("demo", "web", 1)),
        ],
        &[&["app", "db"]],
    );
    let outcome = sink(&fake, quick()).apply(&bundle, &[]).await;

    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(line(&outcome, "Deployment", "db").0, Progressing);
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            format!("PATCH {DB}"),
            format!("PATCH {WEB}"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn stopping_the_agent_ends_a_phase_wait_promptly() {
    let fake = FakeApiServer::new();
    let options = KubeOptions {
        phase_timeout: Duration::from_secs(600),
        crd_poll: Duration::from_secs(1),
        ..options()
    };
    let mut sink = sink(&fake, options);
    let stop = StopSignal::default();
    sink.watch_stop(stop.clone());
    let started = Instant::now();
    let raise = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        stop.raise();
    });
    let outcome = sink.apply(&two_phases(), &[]).await;
    raise.await.expect("raised");

    assert_eq!(started.elapsed(), Duration::from_millis(2500));
    assert!(!outcome.complete);
    assert!(
        outcome.message.contains("the agent is stopping"),
        "{}",
        outcome.message
    );
    let (state, message) = line(&outcome, "Deployment", "web");
    assert_eq!(state, Failed);
    assert!(message.starts_with("not attempted"), "{message}");
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_none());
}

/// Runs an agent that reads its bundle from `publish` and applies it to `fake`, until
/// `until` accepts a report; then stops it and returns that report.
async fn run_agent_until(
    fake: &FakeApiServer,
    publish: &std::path::Path,
    state: &std::path::Path,
    until: impl Fn(&StatusReport) -> bool,
) -> StatusReport {
    let mut config = AgentConfig::new(
        Server::File(publish.to_path_buf()),
        "edge-1",
        state.to_path_buf(),
    );
    config.resync = Duration::ZERO;
    let agent = Agent::new(config, sink(fake, quick()));
    let mut reports = agent.reports();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    let report = reports
        .wait_for(|r| r.as_ref().is_some_and(&until))
        .await
        .expect("a report")
        .clone()
        .expect("present");
    let _ = stop.send(());
    task.await.expect("joined").expect("the agent ran");
    report
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_resumes_the_phases_of_its_stored_bundle_without_the_hub() {
    let fake = FakeApiServer::new();
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let next = two_phases();
    publish(publish_dir.path(), &next);

    let held = run_agent_until(&fake, publish_dir.path(), state.path(), |r| {
        r.attempted.as_ref() == Some(&next.digest)
    })
    .await;
    assert_eq!(held.applied, None, "{held:#?}");
    assert!(
        held.message
            .starts_with("stopped after phase 1 of 2: phase 2 (workloads app) waits for phase 1 (workloads db): Deployment.apps demo/db"),
        "{}",
        held.message
    );

    // The hub goes away; `db` rolls out; the agent restarts from its state folder.
    drop(publish_dir);
    make_available(&fake, "db");
    let gone = tempfile::tempdir().expect("tempdir");
    let applied = run_agent_until(&fake, &gone.path().join("nothing"), state.path(), |r| {
        r.applied.as_ref() == Some(&next.digest)
    })
    .await;
    let state_of = |kind: &str, name: &str| {
        applied
            .resources
            .iter()
            .find(|r| r.key.kind() == kind && r.key.name() == name)
            .map(|r| r.state)
    };
    assert_eq!(state_of("Deployment", "db"), Some(Healthy), "{applied:#?}");
    assert_eq!(state_of("ConfigMap", "web"), Some(Applied));
    assert_eq!(state_of("Deployment", "web"), Some(Progressing));
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_some());
}

/// `app` depends on `db`, which depends on `base`. The app's ConfigMap has a finalizer,
/// so that deleting it takes a while.
fn three_phases() -> Bundle {
    phased_bundle(
        "edge-1",
        vec![
            ("base", kube_namespace("demo")),
            ("db", kube_config_map("demo", "db", "1")),
            ("db", deployment("demo", "db", 1)),
            (
                "app",
                object(
                    "v1",
                    "ConfigMap",
                    "demo",
                    "web",
                    json!({"metadata": {"finalizers": ["example.com/hold"]}, "data": {"k": "1"}}),
                ),
            ),
            ("app", deployment("demo", "web", 1)),
        ],
        &[&["base"], &["db"], &["app"]],
    )
}

/// What is left of [`three_phases`] once `db` and `app` leave it.
fn base_only() -> Bundle {
    phased_bundle(
        "edge-1",
        vec![("base", kube_namespace("demo"))],
        &[&["base"]],
    )
}

const DB_CONFIG: &str = "/api/v1/namespaces/demo/configmaps/db";

/// The DELETE requests, in order.
fn deletes(fake: &FakeApiServer) -> Vec<String> {
    object_requests(fake)
        .into_iter()
        .filter(|r| r.starts_with("DELETE "))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn what_leaves_is_pruned_in_reverse_phase_order_each_phase_gone_before_the_next() {
    let fake = FakeApiServer::new();
    fake.before("GET", "/deployments/db", |fake| make_available(fake, "db"));
    let mut sink = sink(&fake, quick());
    let applied = three_phases();
    let outcome = sink.apply(&applied, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");

    // The app's ConfigMap stays, terminating, until its finalizer is removed just
    // before its third read (read, deleted, read still there, read gone).
    fake.clear_exchanges();
    fake.before("GET", "/configmaps/web", |fake| {
        fake.before("GET", "/configmaps/web", |fake| {
            fake.before("GET", "/configmaps/web", |fake| {
                fake.remove_finalizers("v1", "ConfigMap", "demo", "web")
            })
        })
    });
    let next = base_only();
    let outcome = sink.apply(&next, &prune_list(&applied, &next)).await;

    assert!(outcome.complete, "{outcome:#?}");
    let get = |path: &str| format!("GET {path}");
    let delete = |path: &str| format!("DELETE {path}");
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            // Phase 3 (app) first, in reverse apply order...
            get(WEB),
            delete(WEB),
            get(WEB_CONFIG),
            delete(WEB_CONFIG),
            // ... and gone before phase 2 (db) starts.
            get(WEB_CONFIG),
            get(WEB_CONFIG),
            get(DB),
            delete(DB),
            get(DB_CONFIG),
            delete(DB_CONFIG),
        ]
    );
    for (kind, name) in [
        ("Deployment", "web"),
        ("ConfigMap", "web"),
        ("Deployment", "db"),
        ("ConfigMap", "db"),
    ] {
        assert_eq!(line(&outcome, kind, name).0, Pruned, "{kind} {name}");
    }
    assert!(fake.get("v1", "ConfigMap", "demo", "web").is_none());
    assert!(fake.get("apps/v1", "Deployment", "demo", "db").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_phase_still_being_deleted_in_time_holds_the_earlier_phases_prune_back() {
    let fake = FakeApiServer::new();
    fake.before("GET", "/deployments/db", |fake| make_available(fake, "db"));
    let mut sink = sink(&fake, quick());
    let applied = three_phases();
    assert!(sink.apply(&applied, &[]).await.complete);

    // The finalizer is never removed.
    let next = base_only();
    let prune = prune_list(&applied, &next);
    let outcome = sink.apply(&next, &prune).await;

    assert!(!outcome.complete, "{outcome:#?}");
    assert!(
        outcome.message.contains(
            "phase 3 (workloads app) was not pruned completely: ConfigMap demo/web is still being deleted after 300ms (--phase-timeout)"
        ),
        "{}",
        outcome.message
    );
    let (state, message) = line(&outcome, "Deployment", "db");
    assert_eq!(state, Applied);
    assert!(message.starts_with("left in place for now"), "{message}");
    assert!(fake.get("apps/v1", "Deployment", "demo", "db").is_some());
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_none());

    // Once the finalizer goes, the next try prunes the rest.
    fake.remove_finalizers("v1", "ConfigMap", "demo", "web");
    fake.clear_exchanges();
    let outcome = sink.apply(&next, &prune).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        deletes(&fake),
        [format!("DELETE {DB}"), format!("DELETE {DB_CONFIG}")]
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_resumes_the_prune_in_the_phases_of_the_bundle_it_applied_last() {
    let fake = FakeApiServer::new();
    fake.before("GET", "/deployments/db", |fake| make_available(fake, "db"));
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let applied = three_phases();
    publish(publish_dir.path(), &applied);
    run_agent_until(&fake, publish_dir.path(), state.path(), |r| {
        r.applied.as_ref() == Some(&applied.digest)
    })
    .await;

    // The next bundle: the app's ConfigMap is not gone in time, so its dependencies
    // are left for the next try.
    let next = base_only();
    publish(publish_dir.path(), &next);
    let held = run_agent_until(&fake, publish_dir.path(), state.path(), |r| {
        r.attempted.as_ref() == Some(&next.digest)
    })
    .await;
    assert!(
        held.message
            .contains("phase 3 (workloads app) was not pruned completely"),
        "{}",
        held.message
    );
    assert!(fake.get("apps/v1", "Deployment", "demo", "db").is_some());

    // The finalizer goes; the hub goes away; a new agent process (a sink that
    // remembers nothing) resumes from its state folder, in the phases of the bundle it
    // last applied completely.
    fake.remove_finalizers("v1", "ConfigMap", "demo", "web");
    drop(publish_dir);
    fake.clear_exchanges();
    let gone = tempfile::tempdir().expect("tempdir");
    let report = run_agent_until(&fake, &gone.path().join("nothing"), state.path(), |r| {
        r.applied.as_ref() == Some(&next.digest)
    })
    .await;
    assert!(report.message.contains("pruned 4"), "{}", report.message);
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            // Phase 3 (app), already gone...
            format!("GET {WEB}"),
            format!("GET {WEB_CONFIG}"),
            // ... then phase 2 (db). By key alone, both Deployments would come
            // before both ConfigMaps.
            format!("GET {DB}"),
            format!("DELETE {DB}"),
            format!("GET {DB_CONFIG}"),
            format!("DELETE {DB_CONFIG}"),
        ]
    );
}
