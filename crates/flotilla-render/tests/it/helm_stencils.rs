//! Helm releases filled in from a stencil (a release rendered once with stand-ins
//! for the strings its clusters differ in) are the releases rendered on their own:
//! whole renders with stencils and without, compared bundle by bundle, on charts
//! that carry a cluster's string along (taken) and charts that look at it
//! (refused, so rendered on their own), and on charts of the Helm corpus in
//! ../shared (which it skips, saying so, when the corpus is absent).

use std::collections::BTreeMap;
use std::sync::Arc;

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, RenderOutput, render_with};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

/// A fleet of `sites` clusters, each with its own overlay giving the chart values
/// `per_cluster(name)`, and one Helm workload of the chart at `chart`.
fn fleet(
    chart: &str,
    clusters: &[&str],
    per_cluster: impl Fn(&str) -> String,
    chart_files: &[(&str, &str)],
) -> FleetSnapshot {
    let values_files = if chart_files
        .iter()
        .any(|(p, _)| *p == "workloads/app/values.yaml")
    {
        "    valuesFiles: [values.yaml]\n"
    } else {
        ""
    };
    let mut files: Vec<(String, String)> = vec![(
        "workloads/app/workload.yaml".into(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: apps\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: {chart}\n{values_files}"
        ),
    )];
    for name in clusters {
        files.push((
            format!("clusters/{name}.yaml"),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: {name}\n"),
        ));
        files.push((
            format!("overlays/{name}.yaml"),
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: {name}\nspec:\n  clusters: [{name}]\n  helmValues:\n{}",
                indent(&per_cluster(name), 4)
            ),
        ));
    }
    for (path, text) in chart_files {
        files.push((path.to_string(), text.to_string()));
    }
    FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

fn render(snapshot: &FleetSnapshot, stencils: bool) -> RenderOutput {
    render_with(
        snapshot,
        &RenderOptions {
            helm_without_stencils: !stencils,
            ..RenderOptions::default()
        },
    )
}

/// Renders with stencils and without; asserts the same bundles and diagnostics,
/// and returns how many releases came from a stencil.
fn compare(what: &str, snapshot: &FleetSnapshot) -> usize {
    let with = render(snapshot, true);
    let without = render(snapshot, false);
    assert_eq!(without.helm_stencil_releases, 0, "{what}");
    let messages =
        |o: &RenderOutput| -> Vec<String> { o.diagnostics.iter().map(|d| d.to_string()).collect() };
    assert_eq!(messages(&with), messages(&without), "{what}: diagnostics");
    assert_eq!(
        with.bundles.keys().collect::<Vec<_>>(),
        without.bundles.keys().collect::<Vec<_>>(),
        "{what}: clusters"
    );
    for (cluster, bundle) in &with.bundles {
        let other = &without.bundles[cluster];
        if bundle.digest != other.digest {
            let text = |b: &flotilla_core::bundle::Bundle| -> String {
                b.resources
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.canonical).into_owned() + "\n")
                    .collect()
            };
            let (ours, theirs) = (text(bundle), text(other));
            panic!(
                "{what}: {cluster}'s bundle differs with a stencil:\n{ours}\nwithout:\n{theirs}"
            );
        }
    }
    with.helm_stencil_releases
}

const CHART: &str = "apiVersion: v2\nname: site\nversion: 1.0.0\n";

/// A chart whose template is `body` (after a ConfigMap's header).
fn chart_with(body: &str) -> Vec<(&'static str, String)> {
    vec![
        ("charts/site/Chart.yaml", CHART.to_string()),
        (
            "charts/site/values.yaml",
            "site: none\nlabels: {}\n".to_string(),
        ),
        (
            "charts/site/templates/_helpers.tpl",
            "{{- define \"site.labels\" -}}\napp: site\n{{- with .Values.labels }}\n{{ toYaml . }}\n{{- end }}\n{{- end -}}\n".to_string(),
        ),
        (
            "charts/site/templates/cm.yaml",
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: site\n  labels:\n    {{{{- include \"site.labels\" . | nindent 4 }}}}\n{body}"
            ),
        ),
    ]
}

const CLUSTERS: &[&str] = &["alpha", "bravo", "charlie", "d-4"];

fn site_fleet(body: &str, per_cluster: impl Fn(&str) -> String) -> FleetSnapshot {
    let files = chart_with(body);
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    fleet("../../charts/site", CLUSTERS, per_cluster, &files)
}

#[test]
fn strings_a_chart_only_carries_come_from_one_stencil() {
    let carried = [
        "data:\n  site: {{ .Values.site }}\n",
        "data:\n  site: {{ .Values.site | quote }}\n  again: {{ printf \"%s\" .Values.site | squote }}\n",
        "data:\n  back: {{ index (toPrettyJson .Values.labels | fromJson | toYaml | fromYaml) \"example.com/site\" | quote }}\n",
        "data:\n  {{- $d := dict \"k\" .Values.site }}\n  site: {{ get $d \"k\" | default \"x\" }}\n  {{- if contains \"{{\" (toJson .Values.labels) }}\n  templated: yes\n  {{- end }}\n",
        "data:\n  site: {{ index (tpl (toYaml .Values.labels) . | fromYaml) \"example.com/site\" | quote }}\n",
    ];
    for (number, body) in carried.iter().enumerate() {
        let snapshot = site_fleet(body, |name| {
            format!("site: {name}\nlabels:\n  example.com/site: {name}\n")
        });
        let filled = compare(&format!("carried #{number}"), &snapshot);
        // The first cluster's release is rendered on its own, the three others are
        // filled in.
        assert_eq!(filled, CLUSTERS.len() - 1, "carried #{number}: {body}");
    }
}

#[test]
fn strings_a_chart_looks_at_or_embeds_are_rendered_per_cluster_and_the_same() {
    let inspected = [
        "data:\n  site: {{ .Values.site | upper }}\n",
        "data:\n  site: {{ .Values.site | sha256sum | upper }}\n",
        "data:\n  long: {{ len .Values.site | quote }}\n",
        "data:\n  {{- if eq .Values.site \"bravo\" }}\n  bravo: yes\n  {{- end }}\n",
        "data:\n  {{ .Values.site }}: key\n",
        "data:\n  name: site-{{ .Values.site }}\n",
        // Carried, but into a longer string (a block of YAML text): not a whole
        // string of the output, so not filled in.
        "data:\n  all: |\n{{ toYaml .Values | indent 4 }}\n",
        "data:\n  short: {{ .Values.site | trunc 3 }}\n",
        "data:\n  at: {{ index .Values.labels .Values.site | default \"none\" | quote }}\n",
        "data:\n  odd: {{ regexReplaceAll \"[^a-z]\" .Values.site \"\" }}\n",
        "data:\n  dash: {{ contains \"-\" .Values.site | quote }}\n",
    ];
    for (number, body) in inspected.iter().enumerate() {
        let snapshot = site_fleet(body, |name| {
            format!("site: {name}\nlabels:\n  example.com/site: {name}\n")
        });
        let filled = compare(&format!("inspected #{number}"), &snapshot);
        assert_eq!(filled, 0, "inspected #{number}: {body}");
    }
}

/// [`site_fleet`] with one more template, `deploy.yaml`.
fn site_fleet_and(body: &str, deploy: &str) -> FleetSnapshot {
    let mut files = chart_with(body);
    files.push(("charts/site/templates/deploy.yaml", deploy.to_string()));
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    fleet(
        "../../charts/site",
        CLUSTERS,
        |name| format!("site: {name}\nlabels:\n  example.com/site: {name}\n"),
        &files,
    )
}

#[test]
fn a_checksum_over_a_file_that_carries_the_strings_is_worked_out_per_cluster() {
    let snapshot = site_fleet_and(
        "data:\n  site: {{ .Values.site | quote }}\n",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: site\nspec:\n  template:\n    metadata:\n      annotations:\n        checksum/config: {{ include (print $.Template.BasePath \"/cm.yaml\") . | sha256sum }}\n        twice: {{ include (print $.Template.BasePath \"/cm.yaml\") . | sha256sum | sha256sum | quote }}\n        fixed: {{ \"constant\" | sha256sum }}\n",
    );
    assert_eq!(compare("checksum", &snapshot), CLUSTERS.len() - 1);
    // A checksum that is part of a longer string is not a whole string of the
    // output: rendered per cluster, and the same.
    let snapshot = site_fleet_and(
        "data:\n  site: {{ .Values.site }}\n",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sum\ndata:\n  sum: sha-{{ .Values.site | sha256sum }}\n",
    );
    assert_eq!(compare("checksum in a longer string", &snapshot), 0);
}

#[test]
fn strings_yaml_reads_otherwise_are_rendered_on_their_own() {
    // A value that YAML reads as a number, a boolean or null, or that is not a
    // plain word, is never put where a stand-in was.
    let names = ["alpha", "bravo", "charlie", "d-4"];
    let odd = |name: &str| -> String {
        match name {
            "bravo" => "\"123\"".into(),
            "charlie" => "\"yes\"".into(),
            "d-4" => "\"two words\"".into(),
            _ => name.into(),
        }
    };
    let snapshot = site_fleet("data:\n  site: {{ .Values.site }}\n", |name| {
        format!("site: {}\n", odd(name))
    });
    let filled = compare("odd strings", &snapshot);
    // Only alpha's string is a plain word. The workload's reference values are the
    // first cluster's to reach the release cache (the render runs clusters in
    // parallel): when that is alpha, no release is filled in; when it is another,
    // alpha's may be, which is as right (compare checked every bundle). No odd
    // string is ever filled in.
    assert!(filled <= 1, "{filled} releases filled in");
    assert_eq!(names.len(), CLUSTERS.len());
}

#[test]
fn a_chart_with_a_values_schema_is_rendered_per_cluster() {
    let mut files = chart_with("data:\n  site: {{ .Values.site }}\n");
    files.push((
        "charts/site/values.schema.json",
        "{\"type\": \"object\", \"properties\": {\"site\": {\"type\": \"string\", \"maxLength\": 5}}}"
            .to_string(),
    ));
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    let snapshot = fleet(
        "../../charts/site",
        CLUSTERS,
        |name| format!("site: {name}\n"),
        &files,
    );
    assert_eq!(compare("schema", &snapshot), 0);
}

/// The corpus charts compared by default (a debug build renders a chart in about
/// two seconds): the two of the fleet-scale benchmark, charts filled from a
/// stencil, and charts that are not. `FLOTILLA_STENCIL_CORPUS=all` compares every
/// chart.
const SAMPLE: &[&str] = &[
    "bitnami-fluentd",
    "bitnami-haproxy",
    "bitnami-memcached",
    "bitnami-metrics-server",
    "bitnami-airflow",
    "cert-manager-pebble",
    "grafana-loki-canary",
    "prom-label-proxy",
    "prometheus-statsd-exporter",
    "traefik-hub-manager",
];

/// Corpus charts with their first values file and each cluster's name in the
/// labels and annotations the charts take from their values (`commonLabels`,
/// `podLabels`, ...): the same bundles with stencils and without.
#[test]
fn corpus_charts_render_the_same_from_stencils() {
    let all = std::env::var("FLOTILLA_STENCIL_CORPUS").is_ok_and(|v| v == "all");
    let root = match flotilla_testkit::shared_testdata("helm-charts") {
        Ok(path) => path,
        Err(reason) => {
            flotilla_testkit::can_run("corpus_charts_render_the_same_from_stencils", Some(reason));
            return;
        }
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("manifest.json")).expect("manifest.json"))
            .expect("manifest.json is JSON");
    let clusters = ["site-a", "site-b"];
    let mut filled_in = BTreeMap::new();
    for entry in manifest["charts"].as_array().expect("charts") {
        let id = entry["id"].as_str().expect("id");
        if !all && !SAMPLE.contains(&id) {
            continue;
        }
        let source = std::fs::read(root.join(entry["source"].as_str().expect("source")))
            .expect("source.tar.gz");
        let Some((_, details)) = entry["renders"].as_object().and_then(|r| r.iter().next()) else {
            continue;
        };
        let values_path = root.join(details["values"].as_str().expect("values"));
        let values = std::fs::read_to_string(&values_path).expect("values file");
        let keys = [
            "commonLabels",
            "commonAnnotations",
            "podLabels",
            "podAnnotations",
            "customLabels",
        ];
        let mut snapshot = fleet(
            "../../charts/chart.tgz",
            &clusters,
            |name| {
                keys.iter()
                    .map(|key| format!("{key}:\n  example.com/site: {name}\n"))
                    .collect()
            },
            &[("workloads/app/values.yaml", values.as_str())],
        );
        snapshot
            .binaries
            .insert("charts/chart.tgz".into(), Arc::from(source.as_slice()));
        filled_in.insert(id.to_string(), compare(id, &snapshot));
    }
    let taken = filled_in.values().filter(|&&n| n > 0).count();
    println!(
        "{taken} of {} corpus charts filled from a stencil: {filled_in:?}",
        filled_in.len()
    );
    assert!(
        filled_in.len() >= SAMPLE.len(),
        "the corpus lacks charts of the sample: {filled_in:?}"
    );
    // Both charts of the fleet-scale benchmark take a stencil (their
    // `checksum/config` annotations are derived sites).
    for id in ["bitnami-fluentd", "bitnami-haproxy"] {
        assert_eq!(filled_in.get(id), Some(&1), "{id}: {filled_in:?}");
    }
    assert!(taken > 0, "no corpus chart was filled in from a stencil");
}
