//! Helm hooks (`meta.hooks`) with the kube sink against the fake API server: a
//! release's pre-install Job completes before the release is applied; a change to the
//! release runs its pre-upgrade hook, deleting the previous Job first
//! (`before-hook-creation`); an unchanged release runs none; a failing hook stops the
//! apply naming it; hooks are neither checked for drift nor pruned. A release that
//! leaves the bundle runs its pre-delete hooks before its objects are deleted and its
//! post-delete hooks after; a pre-delete hook that fails keeps the release.

use crate::support as agent_support;

use std::time::Duration;

use agent_support::kube::*;
use agent_support::phased_bundle;
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::drift::DriftCheck;
use flotilla_agent::sink::kube::KubeOptions;
use flotilla_core::bundle::{Bundle, HookMark};
use flotilla_core::status::ResourceState::{Applied, Failed, Healthy, Progressing, Pruned};
use flotilla_kube_fake::FakeApiServer;
use serde_json::{Value, json};

const POLL: Duration = Duration::from_millis(100);

fn quick() -> KubeOptions {
    KubeOptions {
        crd_poll: POLL,
        phase_timeout: Duration::from_millis(500),
        ..options()
    }
}

const JOB: &str = "/apis/batch/v1/namespaces/demo/jobs/web-migrate";
const WEB: &str = "/apis/apps/v1/namespaces/demo/deployments/web";
const NAMESPACE: &str = "/api/v1/namespaces/demo";

/// The migration Job of release `web`, a `pre-install,pre-upgrade` hook.
fn migrate_job(image: &str) -> Value {
    object(
        "batch/v1",
        "Job",
        "demo",
        "web-migrate",
        json!({"metadata": {"annotations": {"helm.sh/hook": "pre-install,pre-upgrade"}},
               "spec": {"template": {"spec": {"restartPolicy": "Never",
                        "containers": [{"name": "migrate", "image": image}]}}}}),
    )
}

/// Release `web` (its Deployment, and the migration Job as a hook with the given
/// delete policies) after workload `base` (the namespace and a ConfigMap).
fn release(replicas: i64, base_value: &str, delete_policies: &[&str]) -> Bundle {
    with_hooks(
        phased_bundle(
            "edge-1",
            vec![
                ("base", kube_namespace("demo")),
                ("base", kube_config_map("demo", "base", base_value)),
                ("web", deployment("demo", "web", replicas)),
                ("web", migrate_job("ghcr.io/example/migrate:1")),
            ],
            &[&["base"], &["web"]],
        ),
        &[(
            "web-migrate",
            &["pre-install", "pre-upgrade"],
            delete_policies,
        )],
    )
}

/// The bundle with hook marks added for the named resources.
fn with_hooks(bundle: Bundle, hooks: &[(&str, &[&str], &[&str])]) -> Bundle {
    let mut meta = bundle.meta.as_deref().cloned().unwrap_or_default();
    for (index, resource) in bundle.resources.iter().enumerate() {
        if let Some((_, events, policies)) = hooks.iter().find(|(n, ..)| *n == resource.key.name())
        {
            meta.hooks.push(HookMark {
                resource: index,
                events: events.iter().map(|e| e.to_string()).collect(),
                weight: 0,
                delete_policies: policies.iter().map(|p| p.to_string()).collect(),
            });
        }
    }
    Bundle::from_sorted_with_meta("edge-1", bundle.resources.clone(), Some(meta))
}

/// The requests for the bundle's objects, without discovery and the ledger.
fn object_requests(fake: &FakeApiServer) -> Vec<String> {
    requests(fake)
        .into_iter()
        .filter(|l| !l.contains("/configmaps/flotilla-inventory-"))
        .collect()
}

/// Makes the Job finish (`Complete` or `Failed`) as its controller would, just
/// before the `read`th read of it is answered (counted from 1).
fn finish_at_read(fake: &FakeApiServer, read: usize, condition: &'static str) {
    fake.before("GET", "/jobs/web-migrate", move |fake| {
        if read > 1 {
            finish_at_read(fake, read - 1, condition);
            return;
        }
        let status = json!({"conditions": [{"type": condition, "status": "True",
                                            "message": format!("the job is {condition}")}]});
        assert!(fake.set_status("batch/v1", "Job", "demo", "web-migrate", status));
    });
}

/// On install the first read is the one before the Job is created, the second the
/// first look at it.
fn finish_at_second_read(fake: &FakeApiServer, condition: &'static str) {
    finish_at_read(fake, 2, condition);
}

fn job_image(fake: &FakeApiServer) -> Option<String> {
    fake.get("batch/v1", "Job", "demo", "web-migrate")
        .map(|job| {
            job.pointer("/spec/template/spec/containers/0/image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        })
}

#[tokio::test(start_paused = true)]
async fn a_pre_install_job_completes_before_its_release_is_applied_and_runs_again_on_upgrade_only()
{
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let patch = |path: &str| format!("PATCH {path}");
    let get = |path: &str| format!("GET {path}");

    // Install: the Job is created, read until it completes, then the Deployment.
    finish_at_second_read(&fake, "Complete");
    let installed = release(1, "1", &["before-hook-creation"]);
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "Job", "web-migrate");
    assert_eq!(state, Healthy);
    assert!(message.contains("pre-install of release web"), "{message}");
    assert_eq!(
        object_requests(&fake),
        [
            patch(NAMESPACE),
            patch("/api/v1/namespaces/demo/configmaps/base"),
            get(JOB),
            patch(JOB),
            get(JOB),
            patch(WEB),
        ]
    );

    // Upgrade: the release changed, so the previous Job is deleted, made again and
    // waited for before the Deployment is applied.
    fake.clear_exchanges();
    // Read, deleted, read gone, created, read: the third read sees it complete.
    finish_at_read(&fake, 3, "Complete");
    let upgraded = release(2, "1", &["before-hook-creation"]);
    let outcome = sink.apply(&upgraded, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        line(&outcome, "Job", "web-migrate")
            .1
            .contains("pre-upgrade of release web"),
        "{outcome:#?}"
    );
    let requests = object_requests(&fake);
    let job_and_web: Vec<&String> = requests
        .iter()
        .filter(|r| r.ends_with(JOB) || r.ends_with(WEB))
        .collect();
    assert_eq!(
        job_and_web,
        [
            &get(JOB),
            &format!("DELETE {JOB}"),
            &get(JOB),
            &patch(JOB),
            &get(JOB),
            &patch(WEB),
        ]
    );
    assert!(
        fake.get("batch/v1", "Job", "demo", "web-migrate")
            .is_some_and(|job| job.pointer("/status/conditions").is_some()),
        "the new Job ran and is kept (no hook-succeeded policy)"
    );

    // The same bundle again (a resync), and a bundle that changes only another
    // workload: the release did not change, so no hook runs.
    for unchanged in [upgraded.clone(), release(2, "2", &["before-hook-creation"])] {
        fake.clear_exchanges();
        let outcome = sink.apply(&unchanged, &[]).await;
        assert!(outcome.complete, "{outcome:#?}");
        assert!(
            object_requests(&fake).iter().all(|r| !r.contains("/jobs/")),
            "{:?}",
            object_requests(&fake)
        );
        assert_eq!(
            line(&outcome, "Job", "web-migrate"),
            (
                Applied,
                "Helm hook (pre-install, pre-upgrade): not run, release web did not change".into()
            )
        );
        assert_eq!(line(&outcome, "Deployment", "web").0, Progressing);
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_fails_or_does_not_complete_stops_the_apply_naming_it() {
    let fake = FakeApiServer::new();
    finish_at_second_read(&fake, "Failed");
    let outcome = sink(&fake, quick())
        .apply(&release(1, "1", &["hook-failed"]), &[])
        .await;
    assert!(!outcome.complete, "{outcome:#?}");
    assert!(
        outcome.message.contains(
            "Helm hook Job.batch demo/web-migrate (pre-install of release web) failed: the job is Failed"
        ),
        "{}",
        outcome.message
    );
    assert_eq!(line(&outcome, "Job", "web-migrate").0, Failed);
    let (state, message) = line(&outcome, "Deployment", "web");
    assert_eq!(state, Failed);
    assert!(message.starts_with("not applied: Helm hook"), "{message}");
    let requests = object_requests(&fake);
    assert!(!requests.contains(&format!("PATCH {WEB}")), "{requests:?}");
    assert!(
        requests.contains(&format!("DELETE {JOB}")),
        "hook-failed deletes the failed Job: {requests:?}"
    );
    assert_eq!(job_image(&fake), None);

    // A Job that never completes is given --phase-timeout.
    let fake = FakeApiServer::new();
    let outcome = sink(&fake, quick())
        .apply(&release(1, "1", &["before-hook-creation"]), &[])
        .await;
    assert!(!outcome.complete, "{outcome:#?}");
    assert!(
        outcome
            .message
            .contains("not complete after 500ms (--phase-timeout)"),
        "{}",
        outcome.message
    );
    assert!(!object_requests(&fake).contains(&format!("PATCH {WEB}")));
}

#[tokio::test(start_paused = true)]
async fn hooks_are_not_checked_for_drift_and_never_pruned() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    finish_at_second_read(&fake, "Complete");
    let installed = release(1, "1", &["before-hook-creation"]);
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");

    // Someone changes the Job: not drift, as flotilla does not follow hooks.
    fake.insert(migrate_job("ghcr.io/example/other:9"), "kubectl-edit");
    match sink.check_drift(&installed).await {
        DriftCheck::Checked { drift, .. } => {
            assert!(drift.iter().all(|d| d.name != "web-migrate"), "{drift:#?}")
        }
        other => panic!("the check did not complete: {other:?}"),
    }
    assert_eq!(job_image(&fake).as_deref(), Some("ghcr.io/example/other:9"));

    // The release's next version has no hook: the Job stays.
    let without = phased_bundle(
        "edge-1",
        vec![
            ("base", kube_namespace("demo")),
            ("base", kube_config_map("demo", "base", "1")),
            ("web", deployment("demo", "web", 1)),
        ],
        &[&["base"], &["web"]],
    );
    let outcome = sink
        .apply(&without, &prune_list(&installed, &without))
        .await;
    assert!(outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "Job", "web-migrate");
    assert_eq!(state, Applied);
    assert!(message.contains("a Helm hook"), "{message}");
    assert!(job_image(&fake).is_some(), "the hook Job is not pruned");
}

#[tokio::test(start_paused = true)]
async fn post_hooks_run_after_the_release_and_hook_succeeded_deletes_the_job() {
    let fake = FakeApiServer::new();
    finish_at_second_read(&fake, "Complete");
    let notify = kube_config_map("demo", "web-notify", "installed");
    let bundle = with_hooks(
        phased_bundle(
            "edge-1",
            vec![
                ("base", kube_namespace("demo")),
                ("web", deployment("demo", "web", 1)),
                ("web", migrate_job("ghcr.io/example/migrate:1")),
                ("web", notify),
            ],
            &[&["base"], &["web"]],
        ),
        &[
            ("web-migrate", &["pre-install"], &["hook-succeeded"]),
            ("web-notify", &["post-install"], &["before-hook-creation"]),
        ],
    );
    let outcome = sink(&fake, quick()).apply(&bundle, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    const NOTIFY: &str = "/api/v1/namespaces/demo/configmaps/web-notify";
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            // Without before-hook-creation (a policy given replaces Helm's default)
            // the Job is created at once, then read until it completes.
            format!("PATCH {JOB}"),
            format!("GET {JOB}"),
            format!("GET {JOB}"),
            // hook-succeeded: read, deleted, read gone.
            format!("GET {JOB}"),
            format!("DELETE {JOB}"),
            format!("GET {JOB}"),
            format!("PATCH {WEB}"),
            // The post-install hook once the release is applied, without waiting
            // for the Deployment.
            format!("GET {NOTIFY}"),
            format!("PATCH {NOTIFY}"),
        ]
    );
    assert_eq!(job_image(&fake), None, "the Job that succeeded is deleted");
    let (state, message) = line(&outcome, "Job", "web-migrate");
    assert_eq!(state, Healthy);
    assert!(message.ends_with("; deleted (hook-succeeded)"), "{message}");
    assert_eq!(
        line(&outcome, "ConfigMap", "web-notify").0,
        Applied,
        "a post hook other than a Job or Pod is done once applied"
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "web-notify").is_some());
}

const CLEANUP: &str = "/apis/batch/v1/namespaces/demo/jobs/web-cleanup";
const FAREWELL: &str = "/api/v1/namespaces/demo/configmaps/web-farewell";
const CACHE: &str = "/api/v1/namespaces/demo/configmaps/cache";

/// Makes the cleanup Job finish (`Complete` or `Failed`) just before the `read`th read
/// of it is answered (counted from 1).
fn finish_cleanup_at_read(fake: &FakeApiServer, read: usize, condition: &'static str) {
    fake.before("GET", "/jobs/web-cleanup", move |fake| {
        if read > 1 {
            finish_cleanup_at_read(fake, read - 1, condition);
            return;
        }
        let status = json!({"conditions": [{"type": condition, "status": "True",
                                            "message": format!("the job is {condition}")}]});
        assert!(fake.set_status("batch/v1", "Job", "demo", "web-cleanup", status));
    });
}

/// Workload `base`, then release `web` (its Deployment, a cleanup Job run on
/// `cleanup_event` and a `post-delete` ConfigMap) beside workload `cache`, which has no
/// hooks.
fn leaving_release(cleanup_event: &'static str) -> Bundle {
    let cleanup = object(
        "batch/v1",
        "Job",
        "demo",
        "web-cleanup",
        json!({"metadata": {"annotations": {"helm.sh/hook": cleanup_event}},
               "spec": {"template": {"spec": {"restartPolicy": "Never",
                        "containers": [{"name": "cleanup", "image": "ghcr.io/example/cleanup:1"}]}}}}),
    );
    let mut farewell = kube_config_map("demo", "web-farewell", "gone");
    farewell["metadata"]["annotations"] = json!({"helm.sh/hook": "post-delete"});
    with_hooks(
        phased_bundle(
            "edge-1",
            vec![
                ("base", kube_namespace("demo")),
                ("web", deployment("demo", "web", 1)),
                ("web", cleanup),
                ("web", farewell),
                ("cache", kube_config_map("demo", "cache", "1")),
            ],
            &[&["base"], &["cache", "web"]],
        ),
        &[
            ("web-cleanup", &[cleanup_event], &["before-hook-creation"]),
            ("web-farewell", &["post-delete"], &["before-hook-creation"]),
        ],
    )
}

fn base_only() -> Bundle {
    phased_bundle(
        "edge-1",
        vec![("base", kube_namespace("demo"))],
        &[&["base"]],
    )
}

#[tokio::test(start_paused = true)]
async fn a_leaving_release_runs_its_pre_delete_hook_before_its_prune_and_post_delete_after() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let installed = leaving_release("pre-delete");
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        object_requests(&fake)
            .iter()
            .all(|r| !r.contains("web-cleanup") && !r.contains("web-farewell")),
        "delete hooks do not run on install: {:?}",
        object_requests(&fake)
    );

    fake.clear_exchanges();
    // Read (none yet), created, read: complete.
    finish_cleanup_at_read(&fake, 2, "Complete");
    let next = base_only();
    let outcome = sink.apply(&next, &prune_list(&installed, &next)).await;

    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(
        object_requests(&fake),
        [
            format!("PATCH {NAMESPACE}"),
            // The pre-delete hook, waited for until it completes...
            format!("GET {CLEANUP}"),
            format!("PATCH {CLEANUP}"),
            format!("GET {CLEANUP}"),
            // ... then the phase's objects, in reverse apply order...
            format!("GET {WEB}"),
            format!("DELETE {WEB}"),
            format!("GET {CACHE}"),
            format!("DELETE {CACHE}"),
            // ... then the post-delete hook.
            format!("GET {FAREWELL}"),
            format!("PATCH {FAREWELL}"),
        ]
    );
    let (state, message) = line(&outcome, "Job", "web-cleanup");
    assert_eq!(state, Healthy);
    assert!(message.contains("pre-delete of release web"), "{message}");
    let (state, message) = line(&outcome, "ConfigMap", "web-farewell");
    assert_eq!(state, Applied);
    assert!(message.contains("post-delete of release web"), "{message}");
    assert_eq!(line(&outcome, "Deployment", "web").0, Pruned);
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_none());
    assert!(
        fake.get("v1", "ConfigMap", "demo", "web-farewell")
            .is_some(),
        "a hook is never pruned"
    );

    // The release is gone: the next apply runs no hook again.
    fake.clear_exchanges();
    let outcome = sink.apply(&next, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(object_requests(&fake), [format!("PATCH {NAMESPACE}")]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_pre_delete_hook_keeps_its_release_and_the_next_try_deletes_it() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let installed = leaving_release("pre-delete");
    assert!(sink.apply(&installed, &[]).await.complete);

    fake.clear_exchanges();
    finish_cleanup_at_read(&fake, 2, "Failed");
    let next = base_only();
    let prune = prune_list(&installed, &next);
    let outcome = sink.apply(&next, &prune).await;

    assert!(!outcome.complete, "{outcome:#?}");
    assert!(
        outcome.message.contains(
            "release web is not deleted: Helm hook Job.batch demo/web-cleanup (pre-delete of release web) \
             failed: the job is Failed"
        ),
        "{}",
        outcome.message
    );
    assert_eq!(line(&outcome, "Job", "web-cleanup").0, Failed);
    let (state, message) = line(&outcome, "Deployment", "web");
    assert_eq!(state, Applied);
    assert!(
        message.starts_with("left in place: release web is not deleted"),
        "{message}"
    );
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_some());
    assert!(
        fake.get("v1", "ConfigMap", "demo", "web-farewell")
            .is_none(),
        "no post-delete hook for a release that was not deleted"
    );
    // Only that release is kept: the other workload of its phase goes.
    assert_eq!(line(&outcome, "ConfigMap", "cache").0, Pruned);
    assert!(
        !object_requests(&fake).contains(&format!("DELETE {WEB}")),
        "{:?}",
        object_requests(&fake)
    );

    // The next try runs the hook again (the failed Job deleted first, as
    // before-hook-creation says) and, once it completes, deletes the release.
    fake.clear_exchanges();
    finish_cleanup_at_read(&fake, 3, "Complete");
    let outcome = sink.apply(&next, &prune).await;
    assert!(outcome.complete, "{outcome:#?}");
    let requests = object_requests(&fake);
    let order: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("DELETE") || r.starts_with("PATCH"))
        .collect();
    assert_eq!(
        order,
        [
            &format!("PATCH {NAMESPACE}"),
            &format!("DELETE {CLEANUP}"),
            &format!("PATCH {CLEANUP}"),
            &format!("DELETE {WEB}"),
            &format!("PATCH {FAREWELL}"),
        ]
    );
    assert!(fake.get("apps/v1", "Deployment", "demo", "web").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_failed_post_delete_hook_is_reported_once_its_release_is_gone() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let installed = leaving_release("post-delete");
    assert!(sink.apply(&installed, &[]).await.complete);

    fake.clear_exchanges();
    finish_cleanup_at_read(&fake, 2, "Failed");
    let next = base_only();
    let outcome = sink.apply(&next, &prune_list(&installed, &next)).await;

    // The release is deleted: the apply is done, and says what failed after it.
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        outcome.message.ends_with(
            "Helm hook Job.batch demo/web-cleanup (post-delete of release web) failed: the job is Failed"
        ),
        "{}",
        outcome.message
    );
    assert_eq!(line(&outcome, "Job", "web-cleanup").0, Failed);
    assert_eq!(line(&outcome, "Deployment", "web").0, Pruned);
    let requests = object_requests(&fake);
    let web = requests
        .iter()
        .position(|r| *r == format!("DELETE {WEB}"))
        .expect("the release is deleted");
    let cleanup = requests
        .iter()
        .position(|r| *r == format!("PATCH {CLEANUP}"))
        .expect("the hook runs");
    assert!(
        web < cleanup,
        "post-delete runs after the release: {requests:?}"
    );

    // Not run again: the release is gone.
    fake.clear_exchanges();
    assert!(sink.apply(&next, &[]).await.complete);
    assert_eq!(object_requests(&fake), [format!("PATCH {NAMESPACE}")]);
}

/// An object of a leaving release still being deleted after `--phase-timeout` (a
/// finalizer) holds its `post-delete` hooks back, and the release stays leaving: once
/// the object is gone, the next try runs them.
#[tokio::test(start_paused = true)]
async fn post_delete_hooks_held_back_by_an_object_still_being_deleted_run_at_the_next_try() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let installed = leaving_release("post-delete");
    assert!(sink.apply(&installed, &[]).await.complete);
    assert!(fake.update("apps/v1", "Deployment", "demo", "web", |web| {
        web["metadata"]["finalizers"] = json!(["example.com/hold"]);
    }));

    let next = base_only();
    let prune = prune_list(&installed, &next);
    let outcome = sink.apply(&next, &prune).await;
    assert!(!outcome.complete, "{outcome:#?}");
    let (state, message) = line(&outcome, "ConfigMap", "web-farewell");
    assert_eq!(state, Failed);
    assert!(message.starts_with("not run: "), "{message}");
    assert!(
        fake.get("v1", "ConfigMap", "demo", "web-farewell")
            .is_none()
    );

    // The finalizer goes; the next try (the agent's inventory still lists what it
    // was pruning) runs the release's post-delete hooks.
    fake.remove_finalizers("apps/v1", "Deployment", "demo", "web");
    finish_cleanup_at_read(&fake, 2, "Complete");
    let outcome = sink.apply(&next, &prune).await;
    assert!(outcome.complete, "{outcome:#?}");
    for (kind, name) in [("ConfigMap", "web-farewell"), ("Job", "web-cleanup")] {
        let (state, message) = line(&outcome, kind, name);
        assert_ne!(state, Failed, "{message}");
        assert!(message.contains("post-delete of release web"), "{message}");
    }
    assert!(
        fake.get("v1", "ConfigMap", "demo", "web-farewell")
            .is_some()
    );
}

/// Hooks of one weight and one name run as Helm runs them (the ServiceAccount before
/// the Job that uses it), and those whose policy is `hook-succeeded` are deleted only
/// once every hook of the event has succeeded, the last first: the ServiceAccount is
/// still there while its Job runs.
#[tokio::test(start_paused = true)]
async fn succeeded_hooks_are_deleted_after_every_hook_of_the_event_has_run() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let account = object("v1", "ServiceAccount", "demo", "web-migrate", json!({}));
    let installed = with_hooks(
        phased_bundle(
            "edge-1",
            vec![
                ("base", kube_namespace("demo")),
                ("web", deployment("demo", "web", 1)),
                ("web", migrate_job("ghcr.io/example/migrate:1")),
                ("web", account),
            ],
            &[&["base"], &["web"]],
        ),
        &[("web-migrate", &["pre-install"], &["hook-succeeded"])],
    );
    finish_at_read(&fake, 1, "Complete");
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let requests = object_requests(&fake);
    const ACCOUNT: &str = "/api/v1/namespaces/demo/serviceaccounts/web-migrate";
    let first = |line: String| {
        requests
            .iter()
            .position(|r| *r == line)
            .unwrap_or_else(|| panic!("no {line} in {requests:#?}"))
    };
    let order = [
        first(format!("PATCH {ACCOUNT}")),
        first(format!("PATCH {JOB}")),
        first(format!("GET {JOB}")),
        first(format!("DELETE {JOB}")),
        first(format!("DELETE {ACCOUNT}")),
        first(format!("PATCH {WEB}")),
    ];
    assert!(order.is_sorted(), "{order:?} in {requests:#?}");
    for kind in ["ServiceAccount", "Job"] {
        let (_, message) = line(&outcome, kind, "web-migrate");
        assert!(message.ends_with("; deleted (hook-succeeded)"), "{message}");
    }
    assert!(
        fake.get("v1", "ServiceAccount", "demo", "web-migrate")
            .is_none()
    );
}

/// A release whose Namespace is its own (in its phase): on a first install, the
/// Namespace is made before the pre-install hook, which could not be made in it
/// otherwise, and the rest of the release after the hook.
#[tokio::test(start_paused = true)]
async fn a_pre_install_hook_finds_the_namespace_of_its_own_phase_made() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let installed = with_hooks(
        phased_bundle(
            "edge-1",
            vec![
                ("web", kube_namespace("demo")),
                ("web", deployment("demo", "web", 1)),
                ("web", migrate_job("ghcr.io/example/migrate:1")),
            ],
            &[&["web"]],
        ),
        &[("web-migrate", &["pre-install"], &[])],
    );
    finish_at_read(&fake, 1, "Complete");
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let requests = object_requests(&fake);
    let first = |line: String| {
        requests
            .iter()
            .position(|r| *r == line)
            .unwrap_or_else(|| panic!("no {line} in {requests:#?}"))
    };
    let order = [
        first(format!("PATCH {NAMESPACE}")),
        first(format!("PATCH {JOB}")),
        first(format!("PATCH {WEB}")),
    ];
    assert!(order.is_sorted(), "{order:?} in {requests:#?}");
    assert_eq!(line(&outcome, "Job", "web-migrate").0, Healthy);
}

/// A CustomResourceDefinition that a chart marks as a hook is never deleted by its
/// delete policies, as in Helm: deleting it would delete every object of its kind.
#[tokio::test(start_paused = true)]
async fn a_crd_hook_is_never_deleted_by_its_policies() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let bundle = |replicas: i64| {
        with_hooks(
            phased_bundle(
                "edge-1",
                vec![
                    ("base", kube_namespace("demo")),
                    ("web", deployment("demo", "web", replicas)),
                    (
                        "web",
                        crd(
                            "example.com",
                            "Widget",
                            "widgets",
                            json!([served("v1", true)]),
                        ),
                    ),
                ],
                &[&["base"], &["web"]],
            ),
            &[(
                "widgets.example.com",
                &["pre-install", "pre-upgrade"],
                &["before-hook-creation", "hook-succeeded"],
            )],
        )
    };
    for replicas in [1, 2] {
        let outcome = sink.apply(&bundle(replicas), &[]).await;
        assert!(outcome.complete, "{outcome:#?}");
        let (_, message) = line(&outcome, "CustomResourceDefinition", "widgets.example.com");
        assert!(!message.contains("deleted"), "{message}");
    }
    assert!(
        object_requests(&fake)
            .iter()
            .all(|r| !(r.starts_with("DELETE") && r.contains("widgets.example.com"))),
        "{:#?}",
        object_requests(&fake)
    );
    assert!(
        fake.get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "widgets.example.com"
        )
        .is_some()
    );
}

/// A release made of hooks alone (a chart of migrations): its install hook runs at
/// its first apply and not again while the release is unchanged.
#[tokio::test(start_paused = true)]
async fn a_release_of_hooks_alone_runs_its_install_hook_once() {
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake, quick());
    let installed = with_hooks(
        phased_bundle(
            "edge-1",
            vec![
                ("base", kube_namespace("demo")),
                ("web", migrate_job("ghcr.io/example/migrate:1")),
            ],
            &[&["base"], &["web"]],
        ),
        &[("web-migrate", &["pre-install", "pre-upgrade"], &[])],
    );
    finish_at_read(&fake, 1, "Complete");
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(object_requests(&fake).contains(&format!("PATCH {JOB}")));
    fake.clear_exchanges();
    let outcome = sink.apply(&installed, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(
        object_requests(&fake).iter().all(|r| !r.contains("/jobs/")),
        "{:#?}",
        object_requests(&fake)
    );
}
