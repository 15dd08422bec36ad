//! A resource filled in from a stencil is exactly what rendering its template's
//! output gives (parsing it, transforming it under the overlays, writing it as
//! canonical JSON): on generated manifest templates, values that YAML reads in many
//! ways, and overlays whose patches, images, labels and selectors touch the values
//! or leave them alone. And whole renders of generated fleets are the same with
//! stencils as without.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use flotilla_core::bundle::{ResourceKey, to_canonical_vec};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::kyaml;
use flotilla_render::load::{self, Overlay, SourcedDocument, Workload};
use flotilla_render::patch::PatchLimits;
use flotilla_render::scope::CustomScopes;
use flotilla_render::shape::Shape;
use flotilla_render::stencil::{self, SLACK};
use flotilla_render::{RenderOptions, RenderOutput, render, render_with, transform};

use crate::yaml_values::value;

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

/// Values of every kind, with more of those a plain scalar takes (most values in
/// the shape tests' list are refused there, and the output then parsed).
fn site_value() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => value(),
        3 => "[a-z0-9][a-z0-9._-]{0,6}",
        2 => proptest::sample::select(&["0755", "yes", "1.0", "1e3", "true", "null", "08", "2001-12-14", "0x1F", "12"][..])
            .prop_map(str::to_string),
        // Those the overlays' targets, patches and selectors look for.
        2 => proptest::sample::select(&["web", "x", "main", "apps/v1", "1"][..])
            .prop_map(str::to_string),
    ]
}

/// A manifest template with values (`{{ v }}`, `{{ w }}`, `{{ u }}`) in the places
/// overlays read, write or leave alone: the name and namespace, labels,
/// annotations, data, replicas, a container's image and environment, a list, and
/// maybe a second document.
fn manifest() -> impl Strategy<Value = String> {
    let pick = |options: &'static [&'static str]| proptest::sample::select(options);
    (
        (
            pick(&["n", "n", "n", "n-{{ v }}"]),
            pick(&["", "", "  namespace: ns1\n", "  namespace: {{ w }}\n"]),
            pick(&["web", "web", "{{ v }}", "'{{ w }}'", "\"{{ u }}\""]),
            pick(&["x", "\"{{ v }}\"", "{{ u }}", "'a-{{ w }}'"]),
            pick(&["y", "y-{{ w }}", "\"{{ v }}\""]),
        ),
        (
            any::<bool>(),
            pick(&["2", "{{ v }}", "\"{{ w }}\""]),
            pick(&["nginx:1", "nginx:{{ w }}", "{{ u }}", "\"nginx:{{ v }}\""]),
            pick(&["\"{{ v }}\"", "info", "{{ u }}"]),
            pick(&["\"{{ v }}\"", "{{ v }}", "'{{ u }}'", "[{{ v }}, b]", "{x: {{ w }}}"]),
            pick(&["main", "main", "{{ v }}"]),
            pick(&["", "", "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: second\ndata:\n  x: \"{{ u }}\"\n"]),
        ),
    )
        .prop_map(
            |((name, namespace, label, a, b), (deployment, replicas, image, env, data, container, second))| {
                let head = |kind: &str, api: &str| {
                    // A value in `apiVersion` only when the name has none, so that
                    // an output read as values can have a valid identity.
                    let api = if name == "n" && label.contains("{{ u }}") { "{{ u }}" } else { api };
                    format!(
                        "apiVersion: {api}\nkind: {kind}\nmetadata:\n  name: {name}\n{namespace}  labels:\n    app: {label}\n  annotations:\n    a: {a}\n    b: {b}\n"
                    )
                };
                let body = if deployment {
                    format!(
                        "{}spec:\n  replicas: {replicas}\n  template:\n    spec:\n      containers:\n        - name: {container}\n          image: {image}\n          env:\n            - name: LEVEL\n              value: {env}\n",
                        head("Deployment", "apps/v1")
                    )
                } else {
                    format!(
                        "{}data:\n  k: {data}\n  image: {image}\n  plain: {env}\n",
                        head("ConfigMap", "v1")
                    )
                };
                format!("{body}{second}")
            },
        )
}

/// What an overlay does: patches (JSON, merge, strategic; some reading or copying
/// values, some on the values' places), images, labels and annotations, targets
/// with selectors.
const OVERLAY_BODIES: &[&str] = &[
    "  patches:\n    - target: {kind: Deployment}\n      ops:\n        - {op: replace, path: /spec/replicas, value: 3}\n",
    "  patches:\n    - target: {}\n      ops:\n        - {op: add, path: /metadata/annotations/added, value: z}\n",
    "  patches:\n    - target: {}\n      ops:\n        - {op: replace, path: /metadata/annotations/a, value: over}\n",
    "  patches:\n    - target: {}\n      ops:\n        - {op: remove, path: /metadata/annotations/a}\n",
    "  patches:\n    - target: {kind: ConfigMap}\n      ops:\n        - {op: replace, path: /data/k, value: r}\n",
    "  patches:\n    - target: {kind: ConfigMap}\n      ops:\n        - {op: test, path: /data/k, value: \"1\"}\n",
    "  patches:\n    - target: {kind: ConfigMap}\n      ops:\n        - {op: copy, from: /data/k, path: /data/copied}\n",
    "  patches:\n    - target: {}\n      ops:\n        - {op: move, from: /metadata/annotations/a, path: /metadata/annotations/moved}\n",
    "  patches:\n    - target: {name: second}\n      ops:\n        - {op: add, path: /metadata/name, value: renamed}\n",
    "  patches:\n    - target: {kind: Deployment}\n      ops:\n        - {op: add, path: /spec/template/spec/containers/0/env/0, value: {name: FIRST, value: one}}\n",
    "  patches:\n    - target: {kind: Deployment}\n      ops:\n        - {op: add, path: /spec/template/spec/containers/0/image/x, value: 1}\n",
    "  patches:\n    - target: {kind: ConfigMap}\n      merge:\n        data:\n          k: m\n",
    "  patches:\n    - target: {}\n      merge:\n        metadata:\n          annotations:\n            b: {nested: 1}\n",
    "  patches:\n    - target: {}\n      merge:\n        metadata:\n          labels: null\n",
    "  patches:\n    - target: {kind: Deployment}\n      strategic:\n        spec:\n          template:\n            spec:\n              containers:\n                - name: main\n                  image: patched\n",
    "  images:\n    - name: nginx\n      newTag: \"2\"\n",
    "  labels:\n    app: relabelled\n",
    "  annotations:\n    a: overwritten\n",
    // The stand-ins' markers, spelt with escapes, in a value an overlay adds.
    "  annotations:\n    marked: \"\\uE0000\\uE001\"\n",
    "  patches:\n    - target: {labelSelector: app=web}\n      merge:\n        metadata:\n          annotations:\n            selected: \"yes\"\n",
    "  patches:\n    - target: {annotationSelector: a=x}\n      merge:\n        metadata:\n          annotations:\n            chosen: \"yes\"\n",
    "  patches:\n    - target: {name: \"n.*\"}\n      ops:\n        - {op: add, path: /metadata/labels/named, value: \"true\"}\n",
];

/// An overlay: its priority and one or two bodies.
type OverlaySpec = (i64, Vec<&'static str>);
type Overlays = Vec<OverlaySpec>;

/// Up to three overlays of one or two bodies each, with priorities.
fn overlays() -> impl Strategy<Value = Overlays> {
    proptest::collection::vec(
        (
            -1i64..2,
            proptest::collection::vec(proptest::sample::select(OVERLAY_BODIES), 1..3),
        ),
        0..4,
    )
}

/// The overlay file of `bodies` (their patches under one `patches:`), selecting
/// the clusters `selector` matches.
fn overlay_file(index: usize, priority: i64, bodies: &[&str], selector: &str) -> String {
    let mut patches = String::new();
    let mut rest = String::new();
    for body in bodies {
        match body.strip_prefix("  patches:\n") {
            Some(items) => patches.push_str(items),
            None if !rest.contains(body.lines().next().unwrap_or_default()) => rest.push_str(body),
            None => {}
        }
    }
    let patches = if patches.is_empty() {
        String::new()
    } else {
        format!("  patches:\n{patches}")
    };
    format!(
        "{HEADER}kind: Overlay\nmetadata:\n  name: o{index}\nspec:\n  clusterSelector: {selector}\n  priority: {priority}\n{rest}{patches}"
    )
}

/// The template's output with these values for `{{ v }}`, `{{ w }}` and `{{ u }}`.
fn output(template: &str, [v, w, u]: [&str; 3]) -> String {
    template
        .replace("{{ v }}", v)
        .replace("{{ w }}", w)
        .replace("{{ u }}", u)
}

/// One output rendered as the renderer renders an output without a stencil: each
/// document parsed, transformed and written; with the patches that matched.
type Slow = Result<(Vec<(ResourceKey, Vec<u8>)>, Vec<Vec<bool>>), ()>;

fn render_output(
    text: &str,
    file: &Arc<str>,
    (workload, overlays): (&Workload, &[&Overlay]),
    limits: &PatchLimits,
    max_resource_bytes: usize,
) -> Slow {
    let documents = kyaml::read_documents(text).map_err(|_| ())?;
    let mut matched: Vec<Vec<bool>> = overlays
        .iter()
        .map(|o| vec![false; o.patches.len()])
        .collect();
    let mut resources = Vec::new();
    for document in documents {
        let sourced = SourcedDocument {
            value: document.value,
            file: file.clone(),
            line: document.line,
        };
        let (key, value) = transform::transform(
            sourced,
            workload,
            overlays,
            &CustomScopes::new(),
            limits,
            &mut matched,
        )
        .map_err(|_| ())?;
        let bytes = to_canonical_vec(&value);
        if bytes.len() > max_resource_bytes {
            return Err(());
        }
        resources.push((key, bytes));
    }
    Ok((resources, matched))
}

/// How the cases of the stencil property went.
#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    no_shape: usize,
    values_refused: usize,
    no_stencil: usize,
    unreadable: usize,
    not_filled: usize,
    filled: usize,
}

fn check_stencil_case(
    tally: &mut Tally,
    (template, bodies, values): (&str, &[OverlaySpec], [&str; 3]),
    (limits, max_resource_bytes): (&PatchLimits, usize),
) {
    tally.cases += 1;
    let Some(shape) = Shape::of_template(template) else {
        tally.no_shape += 1;
        return;
    };
    let mut files = vec![(
        "workloads/w/workload.yaml".to_string(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: ns-w\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    )];
    for (index, (priority, bodies)) in bodies.iter().enumerate() {
        files.push((
            format!("overlays/o{index}.yaml"),
            overlay_file(index, *priority, bodies, "{}"),
        ));
    }
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let mut diagnostics = Vec::new();
    let fleet = load::load(&snapshot, &mut diagnostics);
    assert!(
        diagnostics.iter().all(|d| !d.is_error()),
        "the generated overlays load: {diagnostics:?}\n{files:?}"
    );
    let workload = &fleet.workloads[0];
    let overlays: Vec<&Overlay> = fleet.overlays.iter().collect();
    let file: Arc<str> = Arc::from("workloads/w/manifests/t.yaml.j2");
    let text = output(template, values);
    let Some(hole_values) = shape.values(&text) else {
        tally.values_refused += 1;
        return;
    };
    let slow = render_output(
        &text,
        &file,
        (workload, &overlays),
        limits,
        max_resource_bytes,
    );
    let scopes = CustomScopes::new();
    let under = stencil::Under {
        workload,
        overlays: &overlays,
        scopes: &scopes,
        limits,
    };
    let Some(unit) = stencil::compile(&shape, &file, &under) else {
        tally.no_stencil += 1;
        return;
    };
    let Some(scalars) = shape.scalars(&hole_values) else {
        tally.unreadable += 1;
        return;
    };
    let Some(filled) = unit.fill(&scalars, max_resource_bytes) else {
        tally.not_filled += 1;
        return;
    };
    tally.filled += 1;
    let fast: Vec<(ResourceKey, Vec<u8>)> = unit
        .resources
        .iter()
        .map(|r| (*r.key).clone())
        .zip(filled)
        .collect();
    let shown = |resources: &[(ResourceKey, Vec<u8>)]| -> Vec<(String, String)> {
        resources
            .iter()
            .map(|(k, b)| (k.to_string(), String::from_utf8_lossy(b).into_owned()))
            .collect()
    };
    let context =
        format!("template:\n{template}\nvalues: {values:?}\noutput:\n{text}\noverlays: {bodies:?}");
    let Ok((resources, matched)) = slow else {
        panic!("filled from a stencil where rendering the output fails\n{context}");
    };
    assert_eq!(shown(&fast), shown(&resources), "{context}");
    assert_eq!(unit.matched, matched, "matched patches\n{context}");
}

/// Cases where the overlays read a value, each of which a rule of the stencils
/// must send back to rendering the output: a strategic merge keyed by a value, a
/// label and an annotation selector matching values, images rewritten in a value,
/// and a value in `apiVersion`.
const READ_VALUES: &[(&str, &str, [&str; 3])] = &[
    (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: n\nspec:\n  template:\n    spec:\n      containers:\n        - name: {{ v }}\n          image: nginx:1\n",
        "  patches:\n    - target: {kind: Deployment}\n      strategic:\n        spec:\n          template:\n            spec:\n              containers:\n                - name: main\n                  image: patched\n",
        ["main", "", ""],
    ),
    (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: n\n  labels:\n    app: {{ v }}\n",
        "  patches:\n    - target: {labelSelector: app=web}\n      merge:\n        metadata:\n          annotations:\n            selected: \"yes\"\n",
        ["web", "", ""],
    ),
    (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: n\n  annotations:\n    a: \"{{ v }}\"\n",
        "  patches:\n    - target: {annotationSelector: a=x}\n      merge:\n        metadata:\n          annotations:\n            chosen: \"yes\"\n",
        ["x", "", ""],
    ),
    (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: n\nspec:\n  template:\n    spec:\n      containers:\n        - name: main\n          image: {{ u }}\n",
        "  images:\n    - name: nginx\n      newTag: \"2\"\n",
        ["", "", "nginx"],
    ),
    (
        "apiVersion: {{ u }}\nkind: ConfigMap\nmetadata:\n  name: n\n",
        "  patches:\n    - target: {group: apps}\n      merge:\n        data:\n          grouped: \"yes\"\n",
        ["", "", "apps/v1"],
    ),
];

#[test]
fn a_resource_filled_from_a_stencil_is_what_rendering_its_output_gives() {
    let mut runner = TestRunner::new(Config::default());
    let strategy = (
        manifest(),
        overlays(),
        site_value(),
        site_value(),
        site_value(),
    );
    let mut tally = Tally::default();
    let limits = PatchLimits::default();
    for (template, body, values) in READ_VALUES {
        check_stencil_case(
            &mut tally,
            (template, &[(0, vec![*body])], *values),
            (&limits, 3 * 1024 * 1024),
        );
    }
    for _ in 0..4000 {
        let tree = strategy.new_tree(&mut runner).expect("a case");
        let (template, bodies, v, w, u) = tree.current();
        check_stencil_case(
            &mut tally,
            (&template, &bodies, [&v, &w, &u]),
            (&limits, 3 * 1024 * 1024),
        );
    }
    eprintln!("{tally:?}");
    // Both sides must be exercised: many resources filled, and many stencils
    // refused by the rules (the output then rendered as before).
    assert!(tally.filled > tally.cases / 8, "{tally:?}");
    assert!(tally.no_stencil > tally.cases / 10, "{tally:?}");
}

#[test]
fn values_that_outgrow_a_patched_stencil_are_rendered_from_their_text() {
    // Tight limits: a patch may take the document to the limit with the stand-ins
    // and past it with the values. Values from one character to far more than
    // the slack.
    let limits = PatchLimits {
        max_bytes: SLACK + 900,
        ..PatchLimits::default()
    };
    let mut runner = TestRunner::new(Config::default());
    let long = prop_oneof![
        Just("1".to_string()),
        (1usize..4).prop_map(|n| "x".repeat(n * 30_000)),
        (1usize..300).prop_map(|n| "y".repeat(n)),
    ];
    let strategy = (manifest(), overlays(), long.clone(), long.clone(), long);
    let mut tally = Tally::default();
    for _ in 0..600 {
        let tree = strategy.new_tree(&mut runner).expect("a case");
        let (template, bodies, v, w, u) = tree.current();
        check_stencil_case(
            &mut tally,
            (&template, &bodies, [&v, &w, &u]),
            (&limits, SLACK + 2000),
        );
    }
    // And a value copied by a patch, which is counted twice against the limit.
    let copied = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: n\ndata:\n  k: \"{{ v }}\"\n";
    let copy = "  patches:\n    - target: {kind: ConfigMap}\n      ops:\n        - {op: copy, from: /data/k, path: /data/copied}\n";
    // (found by this test) A copy the next patch replaces: the value is twice in
    // the document between the two.
    let replace = "  patches:\n    - target: {kind: ConfigMap}\n      merge:\n        data:\n          k: m\n";
    for length in [10, 20_000, 40_000, 60_000] {
        let value = "z".repeat(length);
        for bodies in [vec![copy], vec![copy, replace]] {
            check_stencil_case(
                &mut tally,
                (copied, &[(0, bodies)], [&value, "", ""]),
                (&limits, 3 * SLACK),
            );
        }
    }
    eprintln!("{tally:?}");
    assert!(tally.filled > 20, "{tally:?}");
    assert!(tally.not_filled > 20, "{tally:?}");
}

/// A value as a YAML double-quoted scalar: printable ASCII as it is, anything else
/// escaped, so the cluster file reads back exactly this text.
fn quoted(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push_str(&format!("\\U{:08X}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// A fleet of four clusters (labels `app` of `web` or `api`, their own values of
/// `v`, `w` and `u`), a workload of one or two of the templates, and overlays
/// selecting all clusters or those of one label.
fn fleet(
    templates: &[String],
    bodies: &Overlays,
    values: &[[String; 3]],
    hide_shapes: bool,
) -> FleetSnapshot {
    let mut files = vec![(
        "workloads/w/workload.yaml".to_string(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: ns-w\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    )];
    for (index, [v, w, u]) in values.iter().enumerate() {
        let app = if index % 2 == 0 { "web" } else { "api" };
        files.push((
            format!("clusters/c{index}.yaml"),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: c{index}\n  labels:\n    app: {app}\nspec:\n  vars:\n    v: {}\n    w: {}\n    u: {}\n",
                quoted(v),
                quoted(w),
                quoted(u)
            ),
        ));
    }
    for (index, template) in templates.iter().enumerate() {
        // Each template names its resources apart from the other's.
        let text = output(
            template,
            [
                "{{ cluster.vars.v }}",
                "{{ cluster.vars.w }}",
                "{{ cluster.vars.u }}",
            ],
        )
        .replace("name: n", &format!("name: t{index}"))
        .replace("name: second", &format!("name: second{index}"));
        let text = if hide_shapes {
            format!("{{# no shape #}}{text}")
        } else {
            text
        };
        files.push((format!("workloads/w/manifests/t{index}.yaml.j2"), text));
    }
    for (index, (priority, bodies)) in bodies.iter().enumerate() {
        let selector = match index % 3 {
            0 => "{}",
            1 => "{matchLabels: {app: web}}",
            _ => "{matchLabels: {app: api}}",
        };
        files.push((
            format!("overlays/o{index}.yaml"),
            overlay_file(index, *priority, bodies, selector),
        ));
    }
    FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

/// Everything a render says: each bundle's cluster, digest and resources, and the
/// diagnostics.
type Seen = (Vec<(String, String, Vec<String>)>, Vec<String>);

fn seen(output: &RenderOutput) -> Seen {
    let bundles = output
        .bundles
        .values()
        .map(|b| {
            (
                b.cluster.clone(),
                b.digest.to_string(),
                b.resources
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.canonical).into_owned())
                    .collect(),
            )
        })
        .collect();
    let diagnostics = output.diagnostics.iter().map(ToString::to_string).collect();
    (bundles, diagnostics)
}

#[test]
fn a_fleet_renders_the_same_with_stencils_as_without() {
    let mut runner = TestRunner::new(Config::default());
    let cluster_values = proptest::collection::vec((site_value(), site_value(), site_value()), 4);
    let strategy = (
        proptest::collection::vec(manifest(), 1..3),
        overlays(),
        cluster_values,
    );
    let (mut clean, mut failed) = (0, 0);
    for _ in 0..300 {
        let tree = strategy.new_tree(&mut runner).expect("a case");
        let (templates, bodies, values) = tree.current();
        let values: Vec<[String; 3]> = values.into_iter().map(|(v, w, u)| [v, w, u]).collect();
        let snapshot = fleet(&templates, &bodies, &values, false);
        let with = render(&snapshot);
        let without = render(&fleet(&templates, &bodies, &values, true));
        assert_eq!(
            seen(&with),
            seen(&without),
            "templates: {templates:#?}\noverlays: {bodies:?}\nvalues: {values:?}"
        );
        // And keeping digests only gives the same digests and diagnostics.
        let digests = render_with(
            &snapshot,
            &RenderOptions {
                digests_only: true,
                ..RenderOptions::default()
            },
        );
        let (bundles, diagnostics) = seen(&digests);
        let (expected, expected_diagnostics) = seen(&with);
        let digests_of = |bundles: Vec<(String, String, Vec<String>)>| -> Vec<(String, String)> {
            bundles.into_iter().map(|(c, d, _)| (c, d)).collect()
        };
        assert!(bundles.iter().all(|(_, _, resources)| resources.is_empty()));
        assert_eq!(digests_of(bundles), digests_of(expected));
        assert_eq!(diagnostics, expected_diagnostics);
        if with.is_clean() {
            clean += 1;
        } else {
            failed += 1;
        }
    }
    // Renders that succeed and renders with errors both occur.
    assert!(clean > 30 && failed > 30, "{clean} clean, {failed} failed");
}
