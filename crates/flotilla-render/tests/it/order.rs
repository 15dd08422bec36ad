//! `spec.dependsOn` and `spec.drift` in the rendered bundle: the phases and each
//! resource's workload in the bundle's metadata, cycles and dependencies on workloads
//! that do not target a cluster as errors, drift policies from workloads and
//! overlays, and a bundle that needs no metadata keeping the digest it had.

use flotilla_core::bundle::{Bundle, DriftPolicy};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, RenderOutput, render, render_since};

fn cluster(name: &str, site: &str) -> (String, String) {
    (
        format!("clusters/{name}.yaml"),
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    site: {site}\n"
        ),
    )
}

/// A workload targeting clusters with the label `site` in `sites`, one ConfigMap
/// named after it, and the given extra spec lines.
fn workload(name: &str, sites: &str, extra: &str) -> Vec<(String, String)> {
    vec![
        (
            format!("workloads/{name}/workload.yaml"),
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  namespace: apps\n  targets:\n    - clusterSelector:\n        matchExpressions:\n          - {{key: site, operator: In, values: [{sites}]}}\n{extra}"
            ),
        ),
        (
            format!("workloads/{name}/manifests/{name}.yaml"),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: b\n"),
        ),
    ]
}

fn fleet(parts: Vec<Vec<(String, String)>>) -> FleetSnapshot {
    let files: Vec<(String, String)> = parts.into_iter().flatten().collect();
    FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

fn errors(output: &RenderOutput) -> Vec<String> {
    output
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(ToString::to_string)
        .collect()
}

fn phases(bundle: &Bundle) -> Vec<Vec<String>> {
    bundle
        .meta
        .as_ref()
        .map(|m| m.phases.clone())
        .unwrap_or_default()
}

/// The workload of each resource, by resource name.
fn workloads_by_name(bundle: &Bundle) -> Vec<(String, String)> {
    let meta = bundle.meta.as_ref().expect("meta");
    bundle
        .resources
        .iter()
        .zip(&meta.workloads)
        .map(|(r, w)| (r.key.name().to_string(), w.clone()))
        .collect()
}

#[test]
fn a_chain_of_dependencies_gives_a_phase_per_level() {
    let output = render(&fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("cert-manager", "shop", ""),
        workload("ingress", "shop", "  dependsOn: [cert-manager]\n"),
        workload("app", "shop", "  dependsOn: [ingress, cert-manager]\n"),
        workload("metrics", "shop", ""),
    ]));
    assert!(errors(&output).is_empty(), "{:?}", errors(&output));
    let bundle = &output.bundles["shop-1"];
    assert_eq!(
        phases(bundle),
        vec![
            vec!["cert-manager".to_string(), "metrics".to_string()],
            vec!["ingress".to_string()],
            vec!["app".to_string()],
        ]
    );
    assert_eq!(
        workloads_by_name(bundle),
        [
            ("app", "app"),
            ("cert-manager", "cert-manager"),
            ("ingress", "ingress"),
            ("metrics", "metrics")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(bundle.resource_phases(), vec![2, 0, 1, 0]);
    assert!(bundle.meta.as_ref().is_some_and(|m| m.drift.is_empty()));
}

#[test]
fn without_dependencies_or_drift_policies_a_bundle_has_no_metadata_and_the_same_digest() {
    let plain = render(&fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("a", "shop", ""),
        workload("b", "shop", ""),
    ]));
    let explicit = render(&fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("a", "shop", "  drift: correct\n  dependsOn: []\n"),
        workload("b", "shop", ""),
    ]));
    let bundle = &plain.bundles["shop-1"];
    assert!(bundle.meta.is_none());
    assert!(explicit.bundles["shop-1"].meta.is_none());
    assert_eq!(bundle.digest, explicit.bundles["shop-1"].digest);
    // The digest of the resource list alone, as before bundles had metadata.
    let list = Bundle::from_sorted("shop-1", bundle.resources.clone());
    assert_eq!(bundle.digest, list.digest);
    assert!(bundle.canonical_body().starts_with(b"["));
}

#[test]
fn a_cycle_is_an_error_naming_it() {
    let output = render(&fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("a", "shop", "  dependsOn: [c]\n"),
        workload("b", "shop", "  dependsOn: [a]\n"),
        workload("c", "shop", "  dependsOn:\n    - b\n"),
        workload("d", "shop", "  dependsOn: [d]\n"),
    ]));
    let errors = errors(&output);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("workloads/a/workload.yaml:") && e.contains("a → c → b → a")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("workloads/d/workload.yaml") && e.contains("depends on itself")),
        "{errors:?}"
    );
    assert_eq!(errors.len(), 2, "each cycle once: {errors:?}");
    assert!(output.bundles.is_empty());
}

#[test]
fn a_dependency_that_does_not_target_the_cluster_is_an_error_for_that_cluster() {
    let output = render(&fleet(vec![
        vec![cluster("shop-1", "shop"), cluster("truck-1", "truck")],
        workload("database", "shop", ""),
        workload("app", "shop, truck", "  dependsOn: [database]\n"),
    ]));
    let errors = errors(&output);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("workloads/app/workload.yaml:")
            && errors[0].contains(
                "workload app depends on workload database, which does not target cluster truck-1"
            ),
        "{errors:?}"
    );
    assert!(!output.bundles.contains_key("truck-1"));
    assert_eq!(
        phases(&output.bundles["shop-1"]),
        vec![vec!["database".to_string()], vec!["app".to_string()]]
    );
}

#[test]
fn an_unknown_dependency_is_an_error_at_its_line() {
    let output = render(&fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("database", "shop", ""),
        workload("app", "shop", "  dependsOn:\n    - databse\n"),
    ]));
    let errors = errors(&output);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("workloads/app/workload.yaml:")
                && e.contains("unknown workload \"databse\"")
                && e.contains("did you mean \"database\"")),
        "{errors:?}"
    );
}

#[test]
fn drift_policies_come_from_the_workload_and_overlays_per_cluster() {
    let overlay = (
        "overlays/trucks-report.yaml".to_string(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: trucks-report\nspec:\n  clusterSelector:\n    matchLabels: {site: truck}\n  workloads: [app]\n  drift: report\n".to_string(),
    );
    let output = render(&fleet(vec![
        vec![
            cluster("shop-1", "shop"),
            cluster("truck-1", "truck"),
            overlay,
        ],
        workload("app", "shop, truck", ""),
        workload("tools", "shop, truck", "  drift: report\n"),
    ]));
    assert!(errors(&output).is_empty(), "{:?}", errors(&output));
    let policies = |cluster: &str| {
        output.bundles[cluster]
            .meta
            .as_ref()
            .map(|m| m.drift.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        policies("shop-1"),
        [("tools".to_string(), DriftPolicy::Report)].into()
    );
    assert_eq!(
        policies("truck-1"),
        [
            ("app".to_string(), DriftPolicy::Report),
            ("tools".to_string(), DriftPolicy::Report)
        ]
        .into()
    );
    // Drift policies alone give no phases.
    assert!(phases(&output.bundles["truck-1"]).is_empty());
}

#[test]
fn an_incremental_render_sees_a_new_dependency() {
    let before = fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("database", "shop", ""),
        workload("app", "shop", ""),
    ]);
    let after = fleet(vec![
        vec![cluster("shop-1", "shop")],
        workload("database", "shop", ""),
        workload("app", "shop", "  dependsOn: [database]\n"),
    ]);
    let first = render(&before);
    let second = render_since(&first, &after, &RenderOptions::default());
    let whole = render(&after);
    assert_eq!(
        second.bundles["shop-1"].digest,
        whole.bundles["shop-1"].digest
    );
    assert_ne!(
        first.bundles["shop-1"].digest,
        second.bundles["shop-1"].digest
    );
    assert_eq!(phases(&second.bundles["shop-1"]).len(), 2);
}

#[test]
fn diff_shows_a_changed_order_and_drift_policy_without_a_resource_change() {
    let base = render(&fleet(vec![
        vec![cluster("shop-1", "shop"), cluster("shop-2", "shop")],
        workload("database", "shop", ""),
        workload("app", "shop", ""),
    ]));
    let head = render(&fleet(vec![
        vec![cluster("shop-1", "shop"), cluster("shop-2", "shop")],
        workload("database", "shop", ""),
        workload("app", "shop", "  dependsOn: [database]\n  drift: report\n"),
    ]));
    let diff = flotilla_render::diff::diff(&base, &head, &Default::default());
    assert_eq!(diff.groups.len(), 1, "both clusters read the same");
    let group = &diff.groups[0];
    assert!(group.resources.is_empty());
    assert_eq!(
        group.resource_summary(),
        "apply order changed, drift policy changed"
    );
    let text = flotilla_render::diff::text::report(&diff, &Default::default());
    assert!(
        text.contains("apply order: database → app (was: all at once)"),
        "{text}"
    );
    assert!(text.contains("drift of app: correct → report"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&flotilla_render::diff::json::report(&diff).expect("json"))
            .expect("JSON");
    assert_eq!(
        json["groups"][0]["order"],
        serde_json::json!({"before": [], "after": [["database"], ["app"]]})
    );
    assert_eq!(
        json["groups"][0]["drift"],
        serde_json::json!([{"workload": "app", "before": "correct", "after": "report"}])
    );
    let markdown = flotilla_render::diff::markdown::report(&diff, &Default::default());
    assert!(
        markdown.contains("- apply order: database → app (was: all at once)"),
        "{markdown}"
    );
}
