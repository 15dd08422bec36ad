//! What each fuzz target checks, one function per target. The same functions run
//! every kept finding as a regression test (tests/it/fuzz_regressions.rs includes
//! this file), so a finding fixed once stays fixed.
//!
//! Every check holds for any input: no panic, no stack overflow, and the budgets
//! hold (nesting depth, sizes); where an input is accepted, what comes out is
//! consistent (a rendered bundle verifies as an agent verifies it, a report reads
//! back as it was written).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use flotilla_core::bundle::{
    Bundle, MAX_NESTING_DEPTH, approximate_json_size, nests_deeper_than, verify_document,
};
use flotilla_core::limits::Limits;
use flotilla_core::model::{ClusterDoc, GroupDoc, OverlayDoc, Vars, WorkloadDoc};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_core::status::StatusReport;
use flotilla_render::patch::{PatchLimits, apply_json_patch_within, apply_merge_patch};
use flotilla_render::template::{ClusterContext, Context, Templates, WorkloadContext};
use flotilla_render::{RenderOptions, render_with, yaml};

/// Small budgets, so each input runs fast and a breach is found fast.
fn limits() -> Limits {
    Limits {
        template_fuel: 20_000,
        max_template_output_bytes: 64 * 1024,
        max_resource_bytes: 64 * 1024,
        render_timeout: Duration::from_secs(10),
        ..Limits::default()
    }
}

/// YAML reading: every document read nests no deeper than the shared limit, and
/// the typed readers of flotilla's own kinds never panic.
pub fn yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match yaml::parse_documents(text) {
        Ok(documents) => {
            for document in documents {
                assert!(!nests_deeper_than(&document.value, MAX_NESTING_DEPTH));
                assert!(document.line >= 1);
            }
        }
        Err(err) => assert!(!err.message.is_empty()),
    }
    let _ = yaml::parse::<ClusterDoc>(text);
    let _ = yaml::parse::<GroupDoc>(text);
    let _ = yaml::parse::<WorkloadDoc>(text);
    let _ = yaml::parse::<OverlayDoc>(text);
}

/// RFC 6902 and RFC 7396 patches. Input: a JSON document, a NUL byte, a JSON patch
/// (without the NUL, the patch is applied to a small Kubernetes object). A JSON
/// Patch is atomic and keeps the document within its limits; a merge patch
/// never panics.
pub fn patch(data: &[u8]) {
    let (doc, ops) = match data.iter().position(|&b| b == 0) {
        Some(split) => (&data[..split], &data[split + 1..]),
        None => (&b""[..], data),
    };
    let doc: Value = if doc.is_empty() {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}})
    } else {
        match serde_json::from_slice(doc) {
            Ok(doc) => doc,
            Err(_) => return,
        }
    };
    let Ok(ops) = serde_json::from_slice::<Value>(ops) else {
        return;
    };
    let patch_limits = PatchLimits {
        max_depth: MAX_NESTING_DEPTH,
        max_bytes: 64 * 1024,
    };
    let before_size = approximate_json_size(&doc, usize::MAX);
    let before_deep = nests_deeper_than(&doc, MAX_NESTING_DEPTH);
    let mut patched = doc.clone();
    match apply_json_patch_within(&mut patched, &ops, &patch_limits) {
        Ok(()) => {
            if !before_deep {
                assert!(!nests_deeper_than(&patched, MAX_NESTING_DEPTH));
            }
            let size = approximate_json_size(&patched, usize::MAX);
            assert!(
                size <= patch_limits.max_bytes.max(before_size),
                "a patch grew the document to {size} bytes"
            );
        }
        Err(err) => {
            assert_eq!(patched, doc, "a failed patch leaves the document as it was");
            assert!(!err.to_string().is_empty());
        }
    }
    let mut merged = doc;
    apply_merge_patch(&mut merged, &ops);
}

/// A template: compiled and rendered within fuel and an output cap, with a context
/// like the renderer's; its output, if any, is read as YAML.
pub fn template(data: &[u8]) {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let path = "workloads/w/manifests/t.yaml.j2".to_string();
    let snapshot = FleetSnapshot::from_files([(path.as_str(), source)]);
    let limits = limits();
    let mut diagnostics = Vec::new();
    let templates = Templates::compile_with(&snapshot, [&path], &limits, &mut diagnostics);
    // Every template minijinja parses has each `+` made a call that charges fuel
    // (template/lists.rs): a refusal to do so is a defect of that rewrite.
    assert!(
        !diagnostics
            .iter()
            .any(|d| d.to_string().contains("flotilla could not")),
        "{diagnostics:?}"
    );
    let vars: Vars = serde_json::from_value(json!({
        "replicas": 3, "image": {"name": "nginx", "tag": "1.27"},
        "list": [1, "two", {"three": 3.5}], "flag": true, "empty": null
    }))
    .unwrap_or_default();
    let labels = [("region".to_string(), "eu".to_string())]
        .into_iter()
        .collect();
    let context = Context {
        cluster: ClusterContext {
            name: "edge-1",
            labels: &labels,
            vars: &vars,
        },
        workload: WorkloadContext {
            name: "w",
            namespace: Some("w"),
        },
        vars: &vars,
    };
    if let Some(Ok(text)) = templates.render(&path, &context.to_value()) {
        assert!(text.len() <= limits.max_template_output_bytes);
        if let Ok(documents) = yaml::parse_documents(&text) {
            for document in documents {
                assert!(!nests_deeper_than(&document.value, MAX_NESTING_DEPTH));
            }
        }
    }
}

/// Rendering one workload from a small snapshot. Input: up to three parts split at
/// lines `%%`: a manifest file, a template file and an overlay file, in a fleet of
/// two clusters, a group and the workload. Every diagnostic names a file, and every
/// bundle of a clean render verifies exactly as an agent verifies it: the hub never
/// serves what its agents refuse.
pub fn render_workload(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.splitn(3, "\n%%\n");
    let manifest = parts.next().unwrap_or_default();
    let template = parts.next().unwrap_or_default();
    let overlay = parts.next().unwrap_or_default();
    let cluster = |name: &str, tier: &str| {
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels: {{region: eu, tier: {tier}}}\nspec:\n  vars: {{replicas: 2, tier: {tier}}}\n"
        )
    };
    let (c1, c2) = (cluster("edge-1", "canary"), cluster("edge-2", "stable"));
    let files = [
        ("clusters/edge-1.yaml", c1.as_str()),
        ("clusters/edge-2.yaml", c2.as_str()),
        (
            "groups/eu.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Group\nmetadata:\n  name: eu\nspec:\n  selector:\n    matchLabels: {region: eu}\n",
        ),
        (
            "workloads/w/workload.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: w\n  targets:\n    - group: eu\n  vars: {replicas: 1}\n",
        ),
        ("workloads/w/manifests/m.yaml", manifest),
        ("workloads/w/manifests/t.yaml.j2", template),
        ("overlays/o.yaml", overlay),
    ];
    let snapshot = FleetSnapshot::from_files(files);
    let options = RenderOptions {
        limits: limits(),
        ..RenderOptions::default()
    };
    let output = render_with(&snapshot, &options);
    for diagnostic in &output.diagnostics {
        assert!(diagnostic.file.is_some(), "no file: {diagnostic}");
    }
    if !output.is_clean() {
        return;
    }
    for (name, bundle) in &output.bundles {
        for resource in &bundle.resources {
            assert!(resource.canonical.len() <= options.limits.max_resource_bytes);
        }
        let verified = verify_document(&bundle.document("main@sha1:0"), Some(name))
            .expect("the agent accepts every bundle the renderer produces");
        assert_eq!(verified.digest, bundle.digest);
    }
}

/// The served Bundle document as an agent receives it: verification never panics,
/// and a verified bundle, served again, verifies to the same digest.
pub fn bundle_document(data: &[u8]) {
    let Ok(bundle) = verify_document(data, None) else {
        return;
    };
    let again = Bundle::new(
        bundle.cluster.clone(),
        bundle.resources.iter().map(Arc::clone).collect(),
    );
    assert_eq!(again.digest, bundle.digest);
    let verified = verify_document(&bundle.document("main@sha1:0"), Some(&bundle.cluster))
        .expect("a verified bundle verifies again");
    assert_eq!(verified.digest, bundle.digest);
}

/// The agent's status report as the hub parses it: parsing and the limit check never
/// panic, and a report that parses reads back equal once written.
pub fn status_report(data: &[u8]) {
    let Ok(report) = serde_json::from_slice::<StatusReport>(data) else {
        return;
    };
    let _ = report.check_limits();
    let _ = report.is_success();
    if let Some(digest) = &report.attempted {
        let _ = report.failed_for(digest);
    }
    let written = serde_json::to_vec(&report).expect("a report serialises");
    let read: StatusReport = serde_json::from_slice(&written).expect("and reads back");
    assert_eq!(read, report);
}
