//! Helm hooks from a real chart, end to end: traefik's `hub-manager` chart (from the
//! Helm corpus in `../shared/testdata/helm-charts`) holds a migration Job annotated
//! `pre-install,pre-upgrade` with `before-hook-creation,hook-succeeded`. flotilla
//! renders the chart, marks the Job as a hook in the bundle's metadata, and the agent's
//! kube sink, against the fake API server, runs the Job to completion before it applies
//! the release's Deployment, deletes it once it succeeded, and on the next digest after
//! a failed run replaces the failed Job (`before-hook-creation`) before running it
//! again. Skips (and says so) when `../shared` is absent; under `FLOTILLA_CI=1` that
//! fails instead.

use std::io::Read as _;
use std::time::Duration;

use flotilla_agent::sink::Sink;
use flotilla_agent::sink::kube::{KubeOptions, KubeSink};
use flotilla_core::bundle::Bundle;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_core::status::ResourceState;
use flotilla_kube_fake::FakeApiServer;
use serde_json::json;

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
const JOB: &str = "/apis/batch/v1/namespaces/traefik-hub/jobs/hub-manager-migration";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/traefik-hub/deployments/hub-manager";

/// The chart's files as the fleet holds them (`charts/hub-manager/...`), from the
/// corpus's copy of the chart; `None` (a skip) without the corpus.
fn chart_files(test: &str) -> Option<Vec<(String, String)>> {
    let corpus = match flotilla_testkit::shared_testdata("helm-charts") {
        Ok(path) => path,
        Err(reason) => {
            flotilla_testkit::can_run(test, Some(reason));
            return None;
        }
    };
    let archive = std::fs::File::open(corpus.join("traefik-hub-manager/source.tar.gz"))
        .expect("the corpus holds the hub-manager chart");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut files = Vec::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("an entry");
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().expect("a path").to_string_lossy().into_owned();
        let mut text = String::new();
        if entry.read_to_string(&mut text).is_ok() {
            files.push((format!("charts/{path}"), text));
        }
    }
    assert!(
        files
            .iter()
            .any(|(p, _)| p.ends_with("templates/migration-job.yaml")),
        "the chart has its migration Job: {:?}",
        files.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    Some(files)
}

/// Cluster `edge` with workload `base` (the release's Namespace) and the Helm workload
/// `hub-manager` after it, with `replicas` replicas.
fn render(chart: &[(String, String)], replicas: u32) -> Bundle {
    let mut files: Vec<(String, String)> = vec![
        (
            "clusters/edge.yaml".into(),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: edge\n"),
        ),
        (
            "workloads/base/workload.yaml".into(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: base\nspec:\n  namespace: traefik-hub\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        ),
        (
            "workloads/base/manifests/namespace.yaml".into(),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: traefik-hub\n".into(),
        ),
        (
            "workloads/hub-manager/workload.yaml".into(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: hub-manager\nspec:\n  namespace: traefik-hub\n  dependsOn: [base]\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: ../../charts/hub-manager\n    values:\n      deployment:\n        replicas: {replicas}\n"
            ),
        ),
    ];
    files.extend(chart.iter().cloned());
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let output = flotilla_render::render(&snapshot);
    let errors: Vec<String> = output
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(ToString::to_string)
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    output
        .bundles
        .get("edge")
        .expect("a bundle for edge")
        .clone()
}

/// A kube sink talking to `fake`, looking at what it waits for every 100 ms.
fn sink(fake: &FakeApiServer) -> KubeSink {
    KubeSink::with_client(
        fake.client_in("flotilla-system"),
        KubeOptions {
            crd_poll: Duration::from_millis(100),
            crd_timeout: Duration::from_secs(10),
            phase_timeout: Duration::from_secs(5),
            ..KubeOptions::default()
        },
    )
}

/// Makes the Job finish (`Complete` or `Failed`) as its controller would, just before
/// the `read`th read of it is answered (counted from 1).
fn finish_job_at_read(fake: &FakeApiServer, read: usize, condition: &'static str) {
    fake.before("GET", "/jobs/hub-manager-migration", move |fake| {
        if read > 1 {
            finish_job_at_read(fake, read - 1, condition);
            return;
        }
        let status = json!({"conditions": [{"type": condition, "status": "True",
                                            "message": format!("the job is {condition}")}]});
        assert!(fake.set_status(
            "batch/v1",
            "Job",
            "traefik-hub",
            "hub-manager-migration",
            status
        ));
    });
}

/// The requests for the Job and the Deployment, in order.
fn job_and_deployment(fake: &FakeApiServer) -> Vec<String> {
    fake.exchanges()
        .iter()
        .map(|e| e.line())
        .filter(|l| l.ends_with(JOB) || l.ends_with(DEPLOYMENT))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_real_charts_pre_install_job_runs_before_its_release_and_is_replaced_on_the_next_digest()
{
    let test =
        "a_real_charts_pre_install_job_runs_before_its_release_and_is_replaced_on_the_next_digest";
    let Some(chart) = chart_files(test) else {
        return;
    };
    let patch = |path: &str| format!("PATCH {path}");
    let get = |path: &str| format!("GET {path}");
    let delete = |path: &str| format!("DELETE {path}");

    // The render marks the chart's Job as a hook, with the chart's events and policies.
    let first = render(&chart, 1);
    let meta = first.meta.as_deref().expect("a bundle with hooks has meta");
    let marks: Vec<(String, Vec<String>, Vec<String>)> = meta
        .hooks
        .iter()
        .map(|h| {
            (
                first.resources[h.resource].key.name().to_string(),
                h.events.clone(),
                h.delete_policies.clone(),
            )
        })
        .collect();
    assert_eq!(
        marks,
        [(
            "hub-manager-migration".to_string(),
            vec!["pre-install".to_string(), "pre-upgrade".to_string()],
            vec![
                "before-hook-creation".to_string(),
                "hook-succeeded".to_string()
            ]
        )]
    );

    // The first run of the migration fails: the Deployment is not applied, the report
    // names the Job, and the failed Job is kept (no hook-failed policy) to be looked at.
    let fake = FakeApiServer::new();
    let mut sink = sink(&fake);
    finish_job_at_read(&fake, 2, "Failed");
    let outcome = sink.apply(&first, &[]).await;
    assert!(!outcome.complete, "{outcome:#?}");
    assert!(
        outcome
            .message
            .contains("Helm hook Job.batch traefik-hub/hub-manager-migration (pre-install of release hub-manager) failed"),
        "{}",
        outcome.message
    );
    assert_eq!(
        job_and_deployment(&fake),
        [get(JOB), patch(JOB), get(JOB)],
        "the Deployment is not applied after a failed pre-install hook"
    );
    assert!(
        fake.get("batch/v1", "Job", "traefik-hub", "hub-manager-migration")
            .is_some()
    );

    // The next digest (two replicas): the release is still not installed, so its
    // pre-install hook runs again; before-hook-creation deletes the failed Job first.
    // The new Job completes, then the Deployment is applied, then hook-succeeded
    // deletes the Job.
    let second = render(&chart, 2);
    assert_ne!(second.digest, first.digest);
    fake.clear_exchanges();
    // Read, deleted, read gone, created, read: the third read sees it complete.
    finish_job_at_read(&fake, 3, "Complete");
    let outcome = sink.apply(&second, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let requests = job_and_deployment(&fake);
    assert_eq!(
        requests,
        [
            get(JOB),
            delete(JOB),
            get(JOB),
            patch(JOB),
            get(JOB),
            // hook-succeeded: read, deleted, read gone.
            get(JOB),
            delete(JOB),
            get(JOB),
            patch(DEPLOYMENT),
        ]
    );
    let job = outcome
        .resources
        .iter()
        .find(|r| r.key.name() == "hub-manager-migration")
        .expect("a line for the Job");
    assert_eq!(job.state, ResourceState::Healthy, "{job:?}");
    assert!(
        job.message.contains("pre-install of release hub-manager")
            && job.message.ends_with("; deleted (hook-succeeded)"),
        "{}",
        job.message
    );
    assert!(
        fake.get("batch/v1", "Job", "traefik-hub", "hub-manager-migration")
            .is_none(),
        "the Job that succeeded is deleted"
    );
    let deployment = fake
        .get("apps/v1", "Deployment", "traefik-hub", "hub-manager")
        .expect("the release's Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
}
