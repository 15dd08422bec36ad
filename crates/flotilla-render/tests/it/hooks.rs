//! Helm hooks in the rendered bundle: the resources of a Helm workload that carry
//! `helm.sh/hook` are marked in the bundle's metadata (events, weight, delete
//! policies) for the agent to run around their release; test hooks and a plain
//! workload's annotated resources are not; a chart without hooks gives a bundle
//! without metadata.

use flotilla_core::bundle::{Bundle, HookMark, features};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOutput, render};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

const MIGRATE: &str = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ .Release.Name }}-migrate\n  annotations:\n    \"helm.sh/hook\": pre-install, pre-upgrade\n    \"helm.sh/hook-weight\": \"-5\"\n    \"helm.sh/hook-delete-policy\": hook-succeeded,before-hook-creation\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: migrate\n          image: ghcr.io/example/migrate\n";
const NOTIFY: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-notify\n  annotations:\n    helm.sh/hook: post-install\n";
const TEST: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{ .Release.Name }}-test\n  annotations:\n    helm.sh/hook: test\nspec:\n  containers:\n    - name: t\n      image: busybox\n";
const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  replicas: 1\n";

/// A fleet of one cluster, a Helm workload `web` of a chart holding the given
/// templates, and a plain workload `plain` whose ConfigMap carries a hook annotation.
fn fleet(templates: &[(&str, &str)]) -> FleetSnapshot {
    let mut files: Vec<(String, String)> = vec![
        (
            "clusters/edge.yaml".into(),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: edge\n"),
        ),
        (
            "workloads/web/workload.yaml".into(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: web\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: ../../charts/web\n    skipTests: false\n"
            ),
        ),
        (
            "workloads/plain/workload.yaml".into(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: plain\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        ),
        (
            "workloads/plain/manifests/cm.yaml".into(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain\n  annotations:\n    helm.sh/hook: pre-install\n".into(),
        ),
        (
            "charts/web/Chart.yaml".into(),
            "apiVersion: v2\nname: web\nversion: 1.0.0\n".into(),
        ),
    ];
    for (name, text) in templates {
        files.push((format!("charts/web/templates/{name}"), text.to_string()));
    }
    FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

fn bundle(output: &RenderOutput) -> &Bundle {
    let errors: Vec<String> = output
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(ToString::to_string)
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    output.bundles.get("edge").expect("a bundle for edge")
}

/// The hook marks by resource name.
fn marks(bundle: &Bundle) -> Vec<(String, HookMark)> {
    let meta = bundle
        .meta
        .as_deref()
        .expect("a bundle with hooks has meta");
    meta.hooks
        .iter()
        .map(|h| {
            (
                bundle.resources[h.resource].key.name().to_string(),
                h.clone(),
            )
        })
        .collect()
}

#[test]
fn a_charts_hooks_are_marked_with_events_weight_and_delete_policies() {
    let output = render(&fleet(&[
        ("migrate.yaml", MIGRATE),
        ("notify.yaml", NOTIFY),
        ("test.yaml", TEST),
        ("deployment.yaml", DEPLOYMENT),
    ]));
    let bundle = bundle(&output);
    let marks = marks(bundle);
    let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let migrate = marks
        .iter()
        .find(|(name, _)| name == "web-migrate")
        .map(|(_, mark)| mark)
        .expect("the migration Job is a hook");
    assert_eq!(
        bundle.resources[migrate.resource].key.kind(),
        "Job",
        "the mark points at the Job"
    );
    assert_eq!(migrate.events, strings(&["pre-install", "pre-upgrade"]));
    assert_eq!(migrate.weight, -5);
    assert_eq!(
        migrate.delete_policies,
        strings(&["hook-succeeded", "before-hook-creation"])
    );
    let notify = marks
        .iter()
        .find(|(name, _)| name == "web-notify")
        .map(|(_, mark)| mark)
        .expect("the ConfigMap is a hook");
    assert_eq!(notify.events, strings(&["post-install"]));
    assert_eq!(notify.weight, 0);
    assert_eq!(
        notify.delete_policies,
        strings(&["before-hook-creation"]),
        "Helm's default delete policy"
    );
    // The test hook, the Deployment and the plain workload's annotated ConfigMap are
    // resources of the bundle, not hooks.
    let names: Vec<&str> = marks.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for name in ["web-test", "web", "plain"] {
        assert!(
            bundle.resources.iter().any(|r| r.key.name() == name),
            "{name} is in the bundle"
        );
    }
    let meta = bundle.meta.as_deref().expect("meta");
    assert_eq!(meta.workloads.len(), bundle.resources.len());
    assert!(meta.phases.is_empty(), "no dependencies, no phases");
    assert_eq!(
        features::needed_by_body(&bundle.canonical_body()),
        Some(vec![features::META, features::HOOKS])
    );
}

#[test]
fn a_chart_without_hooks_gives_a_bundle_without_metadata() {
    let output = render(&fleet(&[
        ("deployment.yaml", DEPLOYMENT),
        ("test.yaml", TEST),
    ]));
    let bundle = bundle(&output);
    assert!(bundle.meta.is_none(), "{:?}", bundle.meta);
    assert_eq!(
        bundle.digest,
        flotilla_core::bundle::Digest::of(&bundle.canonical_body())
    );
    assert!(bundle.canonical_body().starts_with(b"["));
}
