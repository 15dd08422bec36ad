//! Drift: the kube sink against the fake API server (which keeps field ownership,
//! defaults and, when asked, mutates applies as a webhook would), the dir sink against
//! a folder, and the agent putting what they find into its report.

use crate::support as agent_support;

use std::collections::BTreeMap;
use std::time::Duration;

use agent_support::kube::*;
use agent_support::{config_map, config_map_file, namespace, namespace_file, publish};
use flotilla_agent::client::Server;
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::dir::DirSink;
use flotilla_agent::sink::drift::DriftCheck;
use flotilla_agent::sink::kube::{KubeOptions, KubeSink};
use flotilla_agent::{Agent, AgentConfig};
use flotilla_core::bundle::{Bundle, BundleMeta, DriftPolicy};
use flotilla_core::status::{DriftAction, DriftedResource, StatusReport};
use flotilla_kube_fake::FakeApiServer;
use serde_json::{Value, json};

/// A bundle of `(workload, resource)` pairs; the workloads in `report` have the drift
/// policy `report`, the others the default, `correct`.
fn bundle_with(values: Vec<(&str, Value)>, report: &[&str]) -> Bundle {
    let meta = BundleMeta {
        drift: report
            .iter()
            .map(|w| (w.to_string(), DriftPolicy::Report))
            .collect::<BTreeMap<_, _>>(),
        ..BundleMeta::default()
    };
    bundle_of_workloads("edge-1", values, meta)
}

async fn applied(fake: &FakeApiServer, bundle: &Bundle) -> KubeSink {
    let mut sink = sink(fake, options());
    let outcome = sink.apply(bundle, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    sink
}

async fn check(sink: &mut impl Sink, bundle: &Bundle) -> Vec<DriftedResource> {
    match sink.check_drift(bundle).await {
        DriftCheck::Checked { drift, .. } => drift,
        other => panic!("the check did not complete: {other:?}"),
    }
}

fn drifted(
    kind: &str,
    namespace: &str,
    name: &str,
    fields: &[&str],
    managers: &[&str],
    deleted: bool,
    action: DriftAction,
) -> DriftedResource {
    DriftedResource {
        group: String::new(),
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
        fields: fields.iter().map(|f| f.to_string()).collect(),
        managers: managers.iter().map(|m| m.to_string()).collect(),
        deleted,
        action,
    }
}

fn cm(name: &str, value: &str) -> Value {
    kube_config_map("demo", name, value)
}

/// What another manager writes (an `Update`, as `kubectl edit` does): it then owns
/// the fields it set.
fn edit(fake: &FakeApiServer, name: &str, data: Value) {
    fake.insert(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "demo"}, "data": data}),
        "kubectl-edit",
    );
}

fn live_value(fake: &FakeApiServer, name: &str, field: &str) -> Value {
    fake.get("v1", "ConfigMap", "demo", name)
        .map(|cm| cm["data"][field].clone())
        .unwrap_or(Value::Null)
}

fn writes(fake: &FakeApiServer) -> Vec<String> {
    requests(fake)
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect()
}

#[tokio::test]
async fn a_change_to_a_field_flotilla_does_not_apply_is_not_drift() {
    let fake = FakeApiServer::new();
    let bundle = bundle_with(
        vec![("app", kube_namespace("demo")), ("app", cm("cfg", "1"))],
        &[],
    );
    let mut sink = applied(&fake, &bundle).await;
    edit(&fake, "cfg", json!({"other": "added by hand"}));
    fake.insert(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "cfg", "namespace": "demo", "annotations": {"note": "x"}}}),
        "kubectl-annotate",
    );
    fake.set_status("v1", "ConfigMap", "demo", "cfg", json!({"seen": true}));
    fake.clear_exchanges();
    assert_eq!(check(&mut sink, &bundle).await, []);
    // Nothing was written: the other manager's fields stay.
    assert_eq!(writes(&fake), Vec::<String>::new());
    assert_eq!(live_value(&fake, "cfg", "other"), "added by hand");
}

#[tokio::test]
async fn a_field_flotilla_applies_changed_by_another_manager_is_corrected_or_reported_by_policy() {
    let fake = FakeApiServer::new();
    let bundle = bundle_with(
        vec![
            ("base", kube_namespace("demo")),
            ("app", cm("app", "1")),
            ("tuned", cm("tuned", "1")),
        ],
        &["tuned"],
    );
    let mut sink = applied(&fake, &bundle).await;
    edit(&fake, "app", json!({"k": "2"}));
    edit(&fake, "tuned", json!({"k": "2"}));
    fake.clear_exchanges();
    assert_eq!(
        check(&mut sink, &bundle).await,
        [
            drifted(
                "ConfigMap",
                "demo",
                "app",
                &["data.k"],
                &["kubectl-edit"],
                false,
                DriftAction::Corrected
            ),
            drifted(
                "ConfigMap",
                "demo",
                "tuned",
                &["data.k"],
                &["kubectl-edit"],
                false,
                DriftAction::Reported
            ),
        ]
    );
    // Only the drifted object under `correct` was applied again.
    assert_eq!(
        writes(&fake),
        ["PATCH /api/v1/namespaces/demo/configmaps/app"]
    );
    assert_eq!(live_value(&fake, "app", "k"), "1");
    assert_eq!(live_value(&fake, "tuned", "k"), "2");
    // The corrected object is in step again; the reported one still drifts, and is
    // still left alone.
    fake.clear_exchanges();
    assert_eq!(
        check(&mut sink, &bundle).await,
        [drifted(
            "ConfigMap",
            "demo",
            "tuned",
            &["data.k"],
            &["kubectl-edit"],
            false,
            DriftAction::Reported
        )]
    );
    assert_eq!(writes(&fake), Vec::<String>::new());
}

#[tokio::test]
async fn a_deleted_object_is_drift_and_is_created_again_under_correct() {
    let fake = FakeApiServer::new();
    let bundle = bundle_with(
        vec![
            ("base", kube_namespace("demo")),
            ("app", cm("app", "1")),
            ("tuned", cm("tuned", "1")),
        ],
        &["tuned"],
    );
    let mut sink = applied(&fake, &bundle).await;
    assert!(fake.remove("v1", "ConfigMap", "demo", "app"));
    assert!(fake.remove("v1", "ConfigMap", "demo", "tuned"));
    assert_eq!(
        check(&mut sink, &bundle).await,
        [
            drifted(
                "ConfigMap",
                "demo",
                "app",
                &[],
                &[],
                true,
                DriftAction::Corrected
            ),
            drifted(
                "ConfigMap",
                "demo",
                "tuned",
                &[],
                &[],
                true,
                DriftAction::Reported
            ),
        ]
    );
    assert_eq!(live_value(&fake, "app", "k"), "1");
    assert!(fake.get("v1", "ConfigMap", "demo", "tuned").is_none());
    // Created again, it is flotilla's: a later bundle without it prunes it.
    let next = bundle_with(vec![("base", kube_namespace("demo"))], &[]);
    let outcome = sink.apply(&next, &prune_list(&bundle, &next)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert!(fake.get("v1", "ConfigMap", "demo", "app").is_none());
}

#[tokio::test]
async fn a_value_the_server_sets_on_every_apply_is_not_drift() {
    let fake = FakeApiServer::new();
    // A mutating webhook that rewrites a field flotilla applies, on every apply.
    fake.mutate_applies(|object| {
        if object["kind"] == "ConfigMap" && object["data"]["k"].is_string() {
            object["data"]["k"] = json!("mutated");
        }
    });
    let bundle = bundle_with(
        vec![("app", kube_namespace("demo")), ("app", cm("cfg", "1"))],
        &[],
    );
    let mut sink = applied(&fake, &bundle).await;
    assert_eq!(live_value(&fake, "cfg", "k"), "mutated");
    fake.clear_exchanges();
    assert_eq!(check(&mut sink, &bundle).await, []);
    assert_eq!(writes(&fake), Vec::<String>::new());
    // A change after the webhook's is drift all the same.
    edit(&fake, "cfg", json!({"k": "by hand"}));
    assert_eq!(
        check(&mut sink, &bundle).await,
        [drifted(
            "ConfigMap",
            "demo",
            "cfg",
            &["data.k"],
            &["kubectl-edit"],
            false,
            DriftAction::Corrected
        )]
    );
    assert_eq!(live_value(&fake, "cfg", "k"), "mutated");
}

#[tokio::test]
async fn a_field_fought_over_is_reported_fighting_and_not_corrected_in_a_loop() {
    let fake = FakeApiServer::new();
    let bundle = bundle_with(
        vec![("app", kube_namespace("demo")), ("app", cm("cfg", "1"))],
        &[],
    );
    // The next bundle changes the field while the other manager holds it: applying
    // it takes the field over (`--force-conflicts`), as a correction does.
    let mut sink = sink(
        &fake,
        KubeOptions {
            force_conflicts: true,
            ..options()
        },
    );
    assert!(sink.apply(&bundle, &[]).await.complete);
    let corrected = drifted(
        "ConfigMap",
        "demo",
        "cfg",
        &["data.k"],
        &["kubectl-edit"],
        false,
        DriftAction::Corrected,
    );
    let fighting = DriftedResource {
        action: DriftAction::Fighting,
        ..corrected.clone()
    };
    edit(&fake, "cfg", json!({"k": "theirs"}));
    assert_eq!(
        check(&mut sink, &bundle).await,
        std::slice::from_ref(&corrected)
    );
    assert_eq!(live_value(&fake, "cfg", "k"), "1");
    // The other manager puts its value back after the correction.
    edit(&fake, "cfg", json!({"k": "theirs"}));
    fake.clear_exchanges();
    assert_eq!(
        check(&mut sink, &bundle).await,
        std::slice::from_ref(&fighting)
    );
    assert_eq!(live_value(&fake, "cfg", "k"), "theirs");
    // And it stays so, with nothing written, for as long as the bundle is the same.
    assert_eq!(check(&mut sink, &bundle).await, [fighting]);
    assert_eq!(writes(&fake), Vec::<String>::new());
    // A new bundle starts afresh.
    let next = bundle_with(
        vec![("app", kube_namespace("demo")), ("app", cm("cfg", "2"))],
        &[],
    );
    assert!(sink.apply(&next, &[]).await.complete);
    edit(&fake, "cfg", json!({"k": "theirs"}));
    assert_eq!(check(&mut sink, &next).await, [corrected]);
    assert_eq!(live_value(&fake, "cfg", "k"), "2");
}

#[tokio::test]
async fn detection_over_n_resources_makes_at_most_n_requests() {
    let fake = FakeApiServer::new();
    let mut values = vec![("app", kube_namespace("demo"))];
    let names: Vec<String> = (0..20).map(|i| format!("cfg-{i}")).collect();
    values.extend(names.iter().map(|name| ("app", cm(name, "1"))));
    values.push(("app", deployment("demo", "web", 2)));
    let bundle = bundle_with(values, &[]);
    let mut sink = applied(&fake, &bundle).await;
    fake.clear_exchanges();
    assert_eq!(check(&mut sink, &bundle).await, []);
    let exchanges = fake.exchanges();
    assert!(
        exchanges.len() <= bundle.resources.len() && exchanges.iter().all(|e| e.method == "GET"),
        "{} resources, {} requests: {exchanges:#?}",
        bundle.resources.len(),
        exchanges.len()
    );
}

#[tokio::test]
async fn the_dir_sink_reports_files_edited_or_deleted_by_hand() {
    let target = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let mut sink = DirSink::new(target.path(), state.path(), false);
    let bundle = bundle_with(
        vec![
            ("base", namespace("demo")),
            ("app", config_map("app", "1")),
            ("app", config_map("note", "1")),
            ("tuned", config_map("tuned", "1")),
        ],
        &["tuned"],
    );
    assert!(sink.apply(&bundle, &[]).await.complete);
    let read = |name: &str| std::fs::read_to_string(target.path().join(name)).ok();
    assert_eq!(check(&mut sink, &bundle).await, []);

    let app = target.path().join(config_map_file("app"));
    let written = read(&config_map_file("app")).expect("written");
    std::fs::write(
        &app,
        written
            .replace("value: '1'", "value: '2'")
            .replace("value: \"1\"", "value: \"2\""),
    )
    .expect("edits");
    assert_ne!(
        read(&config_map_file("app")).as_deref(),
        Some(written.as_str()),
        "the edit changed the file"
    );
    let note = target.path().join(config_map_file("note"));
    let noted = read(&config_map_file("note")).expect("written");
    std::fs::write(&note, format!("{noted}# a comment\n")).expect("edits");
    std::fs::remove_file(target.path().join(config_map_file("tuned"))).expect("removes");
    std::fs::remove_file(target.path().join(namespace_file("demo"))).expect("removes");

    assert_eq!(
        check(&mut sink, &bundle).await,
        [
            drifted(
                "ConfigMap",
                "demo",
                "app",
                &["data.value"],
                &[],
                false,
                DriftAction::Corrected
            ),
            drifted(
                "ConfigMap",
                "demo",
                "note",
                &["(file content)"],
                &[],
                false,
                DriftAction::Corrected
            ),
            drifted(
                "ConfigMap",
                "demo",
                "tuned",
                &[],
                &[],
                true,
                DriftAction::Reported
            ),
            drifted(
                "Namespace",
                "",
                "demo",
                &[],
                &[],
                true,
                DriftAction::Corrected
            ),
        ]
    );
    assert_eq!(read(&config_map_file("app")), Some(written));
    assert_eq!(read(&config_map_file("note")), Some(noted));
    assert!(read(&namespace_file("demo")).is_some());
    assert_eq!(read(&config_map_file("tuned")), None);
    assert_eq!(
        check(&mut sink, &bundle).await,
        [drifted(
            "ConfigMap",
            "demo",
            "tuned",
            &[],
            &[],
            true,
            DriftAction::Reported
        )]
    );
}

async fn next_report(
    reports: &mut tokio::sync::watch::Receiver<Option<StatusReport>>,
) -> StatusReport {
    reports.changed().await.expect("the agent runs");
    reports.borrow_and_update().clone().expect("a report")
}

/// The agent puts what the checks find in its report, and a check that finds what
/// the last one found changes nothing in it (so it is not sent again).
#[tokio::test(start_paused = true)]
async fn the_agent_reports_drift_found_at_each_resync() {
    let fake = FakeApiServer::new();
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let bundle = bundle_with(
        vec![("app", kube_namespace("demo")), ("app", cm("cfg", "1"))],
        &[],
    );
    publish(publish_dir.path(), &bundle);
    let mut config = AgentConfig::new(
        Server::File(publish_dir.path().to_path_buf()),
        "edge-1",
        state.path().to_path_buf(),
    );
    config.resync = Duration::from_secs(60);
    let agent = Agent::new(config, sink(&fake, options()));
    let mut reports = agent.reports();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    let first = reports
        .wait_for(|r| {
            r.as_ref()
                .is_some_and(|r| r.applied.as_ref() == Some(&bundle.digest))
        })
        .await
        .expect("the agent runs")
        .clone()
        .expect("a report");
    assert!(
        first.features.iter().any(|f| f == "drift"),
        "{:?}",
        first.features
    );
    assert_eq!(first.drift, []);

    // Another manager changes the field just before each of the next two checks read
    // it: corrected the first time, fought over the second.
    let corrected = drifted(
        "ConfigMap",
        "demo",
        "cfg",
        &["data.k"],
        &["kubectl-edit"],
        false,
        DriftAction::Corrected,
    );
    fake.before("GET", "/configmaps/cfg", |fake| {
        edit(fake, "cfg", json!({"k": "theirs"}))
    });
    let second = next_report(&mut reports).await;
    assert_eq!(second.drift, std::slice::from_ref(&corrected));
    assert!(!second.is_drifted(), "corrected drift does not remain");
    assert_eq!(live_value(&fake, "cfg", "k"), "1");
    fake.before("GET", "/configmaps/cfg", |fake| {
        edit(fake, "cfg", json!({"k": "theirs"}))
    });
    let third = next_report(&mut reports).await;
    let fighting = DriftedResource {
        action: DriftAction::Fighting,
        ..corrected
    };
    assert_eq!(third.drift, [fighting]);
    assert!(third.is_drifted());
    // The next check finds the same: the report does not change, nothing is written.
    fake.clear_exchanges();
    let fourth = next_report(&mut reports).await;
    assert_eq!(fourth, third);
    assert_eq!(writes(&fake), Vec::<String>::new());
    assert_eq!(live_value(&fake, "cfg", "k"), "theirs");
    let _ = stop.send(());
    task.await.expect("joined").expect("ran");
}
