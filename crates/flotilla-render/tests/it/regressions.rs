//! Bugs found while bringing real repositories over, each pinned by the behaviour a
//! user would see: YAML scalars read as kustomize reads them, patch targets whose
//! group, version and kind are regular expressions, and a namespace an overlay must
//! not put on a cluster-scoped resource.

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOutput, render};
use serde_json::{Value, json};

const CLUSTER: &str = "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge\n";
const WORKLOAD: &str = "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: shop\n  targets:\n    - cluster: edge\n";

/// Renders one workload's manifests with an optional overlay.
const VALIDATION_OFF: &str =
    "apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n  validation: off\n";

fn render_with(manifests: &str, overlay: Option<&str>) -> RenderOutput {
    let overlay = overlay.map(|spec| {
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: case\nspec:\n  clusters: [edge]\n{spec}"
        )
    });
    // The manifests are as small as each case needs, not complete Kubernetes
    // objects: the schema check (its own tests are the renderer's `openapi`) is off.
    let mut files = vec![
        ("flotilla.yaml", VALIDATION_OFF),
        ("clusters/edge.yaml", CLUSTER),
        ("workloads/app/workload.yaml", WORKLOAD),
        ("workloads/app/manifests/resources.yaml", manifests),
    ];
    if let Some(overlay) = &overlay {
        files.push(("overlays/case.yaml", overlay.as_str()));
    }
    render(&FleetSnapshot::from_files(files))
}

/// The rendered resource of `kind`.
fn resource(output: &RenderOutput, kind: &str) -> Value {
    assert!(
        output.is_clean(),
        "{:?}",
        output
            .diagnostics
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
    output.bundles["edge"]
        .resources
        .iter()
        .find(|r| r.key.kind() == kind)
        .map(|r| r.value())
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn legacy_octal_numbers_are_octal() {
    let output = render_with(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: [{name: c, image: busybox}]\n  volumes:\n    - {name: a, configMap: {name: c, defaultMode: 0755}}\n    - {name: b, secret: {secretName: s, defaultMode: 0644}}\n    - {name: c, secret: {secretName: s, defaultMode: 012}}\n    - {name: d, secret: {secretName: s, defaultMode: \"0644\"}}\n",
        None,
    );
    let pod = resource(&output, "Pod");
    let modes: Vec<&Value> = pod["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| {
            v.pointer("/configMap/defaultMode")
                .or(v.pointer("/secret/defaultMode"))
                .expect("mode")
        })
        .collect();
    assert_eq!(
        modes,
        [&json!(493), &json!(420), &json!(10), &json!("0644")]
    );
}

#[test]
fn yes_on_y_off_stay_strings() {
    let output = render_with(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: yes\n  b: on\n  c: y\n  d: off\n  e: no\n  f: True\nbinaryData: {}\n",
        None,
    );
    let data = resource(&output, "ConfigMap")["data"].clone();
    assert_eq!(
        data,
        json!({"a": "yes", "b": "on", "c": "y", "d": "off", "e": "no", "f": true})
    );
}

const WORKLOADS: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  template:
    spec:
      containers: [{name: web, image: nginx}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  template:
    spec:
      containers: [{name: db, image: postgres}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{port: 80}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  template:
    spec:
      containers: [{name: job, image: busybox}]
";

fn labelled(output: &RenderOutput) -> Vec<String> {
    assert!(output.is_clean(), "{:?}", output.diagnostics);
    output.bundles["edge"]
        .resources
        .iter()
        .filter(|r| r.value().pointer("/metadata/labels/hit").is_some())
        .map(|r| r.key.kind().to_string())
        .collect()
}

#[test]
fn patch_target_group_version_and_kind_are_regular_expressions() {
    let patch = |target: &str| {
        format!(
            "  patches:\n    - target: {target}\n      merge: {{metadata: {{labels: {{hit: \"yes\"}}}}}}\n"
        )
    };
    let cases = [
        (
            "{kind: (Deployment|StatefulSet)}",
            vec!["Deployment", "StatefulSet"],
        ),
        ("{kind: Deploy.*}", vec!["Deployment"]),
        // Anchored: `Set` does not match inside `StatefulSet`.
        ("{kind: Set}", vec![]),
        (
            "{group: apps|batch, version: v1}",
            vec!["Job", "Deployment", "StatefulSet"],
        ),
        // An empty group means the core group only.
        ("{group: \"\"}", vec!["Service"]),
        (
            "{version: v1, kind: \"S.*\"}",
            vec!["Service", "StatefulSet"],
        ),
    ];
    for (target, expected) in cases {
        let output = render_with(WORKLOADS, Some(&patch(target)));
        let mut kinds = labelled(&output);
        kinds.sort();
        let mut expected: Vec<String> = expected.into_iter().map(String::from).collect();
        expected.sort();
        assert_eq!(kinds, expected, "target {target}");
    }
}

#[test]
fn an_overlay_cannot_put_a_namespace_on_a_cluster_scoped_resource() {
    let output = render_with(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\nrules: []\n",
        Some(
            "  patches:\n    - target: {kind: ClusterRole}\n      ops: [{op: add, path: /metadata/namespace, value: shop}]\n",
        ),
    );
    assert!(!output.is_clean());
    let errors: Vec<String> = output.errors().map(ToString::to_string).collect();
    assert!(
        errors[0].contains("is cluster-scoped and must not set metadata.namespace"),
        "{errors:?}"
    );
    assert!(output.bundles.is_empty());
}

#[test]
fn a_patch_target_that_matches_nothing_is_a_warning_at_the_patch() {
    let output = render_with(
        WORKLOADS,
        Some(
            "  patches:\n    - target: {kind: Deployment, name: wbe}\n      merge: {spec: {replicas: 2}}\n    - target: {kind: Deployment, name: web}\n      merge: {spec: {replicas: 2}}\n",
        ),
    );
    assert!(output.is_clean());
    let warnings: Vec<String> = output.warnings().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "overlays/case.yaml:8: warning: the target of this patch of overlay \"case\" matches no resource on any cluster it applies to"
        ]
    );
}

#[test]
fn an_overlay_strategic_patch_merges_lists_by_key() {
    let output = render_with(
        WORKLOADS,
        Some(
            "  patches:\n    - target: {kind: Deployment}\n      strategic:\n        spec:\n          template:\n            spec:\n              containers:\n                - name: web\n                  env: [{name: MODE, value: edge}]\n                - name: sidecar\n                  image: envoy\n",
        ),
    );
    let deployment = resource(&output, "Deployment");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"],
        json!([
            {"name": "web", "image": "nginx", "env": [{"name": "MODE", "value": "edge"}]},
            {"name": "sidecar", "image": "envoy"}
        ])
    );
}
