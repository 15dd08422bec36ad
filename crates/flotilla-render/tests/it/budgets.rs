//! Property tests: deep, wide and large YAML, generated templates and generated
//! patches, rendered in a small fleet. Whatever is generated, the render returns
//! (no panic, no stack overflow: the renderer's threads have their usual stacks),
//! every error names a file, and what renders stays within the budgets: no resource
//! deeper than the shared nesting limit or larger than its size limit, no template
//! output larger than its cap.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use flotilla_core::bundle::{MAX_NESTING_DEPTH, nesting_depth, verify_document};
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, RenderOutput, render_with};

fn limits() -> Limits {
    Limits {
        template_fuel: 50_000,
        max_template_output_bytes: 64 * 1024,
        max_resource_bytes: 64 * 1024,
        render_timeout: Duration::from_secs(60),
        ..Limits::default()
    }
}

/// Renders a fleet of two clusters and one workload made of `manifests` (file name
/// → text), with `overlay` if given, and checks what must hold for any input.
fn render_fleet(manifests: &[(&str, String)], overlay: Option<String>) -> RenderOutput {
    let mut files: Vec<(String, String)> = vec![
        (
            "clusters/edge-1.yaml".into(),
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge-1\n  labels: {region: eu}\nspec:\n  vars: {n: 3, name: one}\n".into(),
        ),
        (
            "clusters/edge-2.yaml".into(),
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge-2\n  labels: {region: eu}\nspec:\n  vars: {n: 5, name: two}\n".into(),
        ),
        (
            "workloads/w/workload.yaml".into(),
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: w\n  targets:\n    - clusterSelector: {}\n".into(),
        ),
    ];
    for (name, text) in manifests {
        files.push((format!("workloads/w/manifests/{name}"), text.clone()));
    }
    if let Some(overlay) = overlay {
        files.push(("overlays/o.yaml".into(), overlay));
    }
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let limits = limits();
    let output = render_with(
        &snapshot,
        &RenderOptions {
            limits: limits.clone(),
            ..RenderOptions::default()
        },
    );
    for diagnostic in &output.diagnostics {
        assert!(
            diagnostic.file.is_some(),
            "an error without a file: {diagnostic}"
        );
    }
    for (cluster, bundle) in &output.bundles {
        for resource in &bundle.resources {
            assert!(nesting_depth(&resource.value()) <= MAX_NESTING_DEPTH);
            assert!(resource.canonical.len() <= limits.max_resource_bytes);
        }
        verify_document(&bundle.document("r"), Some(cluster)).expect("the agent accepts it");
    }
    output
}

fn errors(output: &RenderOutput) -> Vec<String> {
    output.errors().map(|d| d.to_string()).collect()
}

/// A value nested `depth` levels, written in YAML flow or block style.
fn nested_yaml(depth: usize, block: bool, wide: usize) -> String {
    if block {
        let mut text = String::new();
        for level in 0..depth {
            text.push_str(&format!("{}k{level}:\n", "  ".repeat(level + 1)));
        }
        for key in 0..wide.max(1) {
            text.push_str(&format!("{}leaf{key}: {key}\n", "  ".repeat(depth + 1)));
        }
        text
    } else {
        let leaves: Vec<String> = (0..wide.max(1)).map(|k| k.to_string()).collect();
        format!(
            "  {}[{}]{}\n",
            "[".repeat(depth.saturating_sub(1)),
            leaves.join(", "),
            "]".repeat(depth.saturating_sub(1))
        )
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Deep and wide YAML: read when the resource stays within the nesting limit,
    /// refused with a clear error when it does not; never a stack overflow.
    #[test]
    fn deep_and_wide_yaml(depth in 0usize..400, block in any::<bool>(), wide in 0usize..2000) {
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n{}",
            nested_yaml(depth, block, wide)
        );
        let output = render_fleet(&[("c.yaml", text)], None);
        // The resource is one level, `data` one more, then the generated levels.
        let resource_depth = 2 + depth.max(1) - usize::from(!block);
        if resource_depth <= MAX_NESTING_DEPTH {
            prop_assert!(output.is_clean() || errors(&output).iter().all(|e| e.contains("bytes as JSON")), "{:?}", errors(&output));
        } else {
            prop_assert!(errors(&output).iter().any(|e| e.contains("deeper than 100")), "{:?}", errors(&output));
        }
    }

    /// Large values: a resource larger than its limit is refused by name, never
    /// served.
    #[test]
    fn large_values(length in 0usize..200_000, copies in 1usize..4) {
        let value = "x".repeat(length);
        let data: String = (0..copies).map(|i| format!("  k{i}: \"{value}\"\n")).collect();
        let text = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n{data}");
        let output = render_fleet(&[("c.yaml", text)], None);
        // Each value's `"kN":"…",` is its length and 8 bytes; the rest of the JSON
        // (apiVersion, kind, metadata with the workload's namespace, braces) is under
        // 100 bytes. Below that the resource must be served; between it and the limit
        // it may be refused, and then only for its size.
        let size = copies * (length + 8) + 100;
        if size < limits().max_resource_bytes {
            prop_assert!(output.is_clean(), "{:?}", errors(&output));
        }
        if !output.is_clean() {
            prop_assert!(errors(&output).iter().all(|e| e.contains("over the limit of 65536 bytes for one resource")));
        }
    }

    /// Generated templates: loops (nested, long), repeated strings, macros that
    /// call themselves, variables. Each renders or fails with an error naming the
    /// template; none runs away.
    #[test]
    fn generated_templates(parts in proptest::collection::vec(template_part(), 1..8)) {
        let body: String = parts.concat();
        let text = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t-{{{{ cluster.name }}}}\ndata:\n  body: |\n    {body}\n");
        let output = render_fleet(&[("t.yaml.j2", text)], None);
        for error in errors(&output) {
            prop_assert!(error.starts_with("workloads/w/manifests/t.yaml.j2"), "{error}");
        }
    }

    /// Generated RFC 6902 patches over a small key alphabet (copies of the root
    /// included): the patched resource stays within depth and size, and a patch
    /// that cannot apply is reported at the overlay.
    #[test]
    fn generated_patches(ops in proptest::collection::vec(patch_op(), 1..40)) {
        let overlay = format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: o\nspec:\n  clusterSelector: {{}}\n  patches:\n    - target: {{kind: ConfigMap}}\n      ops: {}\n",
            Value::Array(ops)
        );
        let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: \"1\"\n".to_string();
        let output = render_fleet(&[("c.yaml", manifest)], Some(overlay));
        for error in errors(&output) {
            prop_assert!(error.starts_with("overlays/o.yaml:"), "{error}");
        }
    }
}

fn template_part() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u32..200_000).prop_map(|n| format!("{{% for i in range({n}) %}}{{{{ i }}}}{{% endfor %}}")),
        (1u32..2000, 1u32..2000).prop_map(|(a, b)| format!(
            "{{% for i in range({a}) %}}{{% for j in range({b}) %}}{{% endfor %}}{{% endfor %}}"
        )),
        (1u64..200_000_000).prop_map(|n| format!("{{{{ 'x' * {n} }}}}")),
        (1u32..50).prop_map(|n| format!(
            "{{% macro m(k) %}}{{% if k > 0 %}}{{{{ m(k - 1) }}}}{{% endif %}}{{% endmacro %}}{{{{ m({n}) }}}}"
        )),
        Just("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}".to_string()),
        Just("{{ vars.n * 2 }} {{ cluster.vars.name | upper }}".to_string()),
        Just("{{ undefined_variable }}".to_string()),
        Just("{% if %}".to_string()),
        "[a-z{}%#~ ]{0,20}".prop_map(|s| s),
    ]
}

fn patch_op() -> impl Strategy<Value = Value> {
    let path = proptest::collection::vec(
        prop_oneof![Just("data"), Just("a"), Just("b"), Just("0"), Just("-")],
        0..5,
    )
    .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect::<String>());
    prop_oneof![
        (path.clone(), any::<u8>())
            .prop_map(|(p, v)| json!({"op": "add", "path": p, "value": {"v": v, "l": [v]}})),
        (path.clone(), path.clone()).prop_map(|(p, f)| json!({"op": "copy", "from": f, "path": p})),
        (path.clone(), path.clone()).prop_map(|(p, f)| json!({"op": "move", "from": f, "path": p})),
        path.clone()
            .prop_map(|p| json!({"op": "remove", "path": p})),
        (path.clone(), any::<u8>())
            .prop_map(|(p, v)| json!({"op": "replace", "path": p, "value": v})),
        path.clone()
            .prop_map(|p| json!({"op": "copy", "from": "", "path": format!("{p}/c")})),
    ]
}
