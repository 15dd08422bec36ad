//! Helm workloads in a fleet: a small chart of our own rendered per cluster with its
//! values merged from the chart, values files (a `.j2` one per cluster), the
//! workload and the overlays; the release namespace as the default; overlays'
//! patches on the chart's resources; CRDs and test hooks; values generated from the
//! seed; and the errors a bad `spec.helm` gives.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::{RenderOptions, RenderOutput, render_with};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";

/// A chart of our own: a Deployment and a ConfigMap (its data from `toYaml`), a
/// Secret with a generated password, a test hook, a CRD and a helper.
fn chart() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "charts/web/Chart.yaml",
            "apiVersion: v2\nname: web\nversion: 1.2.3\nappVersion: \"4.5\"\n",
        ),
        (
            "charts/web/values.yaml",
            "replicas: 1\nimage:\n  repository: ghcr.io/example/web\n  tag: stable\nsettings:\n  color: blue\n  size: 10\npassword: \"\"\n",
        ),
        (
            "charts/web/templates/_helpers.tpl",
            "{{- define \"web.fullname\" -}}\n{{ .Release.Name }}-{{ .Chart.Name }}\n{{- end -}}\n",
        ),
        (
            "charts/web/templates/deployment.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ include \"web.fullname\" . }}\n  labels:\n    app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}\n    kube: {{ .Capabilities.KubeVersion.Version | quote }}\nspec:\n  replicas: {{ .Values.replicas }}\n  template:\n    spec:\n      containers:\n        - name: web\n          image: \"{{ .Values.image.repository }}:{{ .Values.image.tag }}\"\n",
        ),
        (
            "charts/web/templates/configmap.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ include \"web.fullname\" . }}\n  namespace: {{ .Release.Namespace }}\ndata:\n  settings.yaml: |\n{{ toYaml .Values.settings | indent 4 }}\n{{- if .Capabilities.APIVersions.Has \"monitoring.coreos.com/v1\" }}\n  monitoring: \"on\"\n{{- end }}\n",
        ),
        (
            "charts/web/templates/secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ include \"web.fullname\" . }}\nstringData:\n  password: {{ .Values.password | default (randAlphaNum 16) | quote }}\n",
        ),
        (
            "charts/web/templates/tests/test-connection.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{ include \"web.fullname\" . }}-test\n  annotations:\n    \"helm.sh/hook\": test\nspec:\n  containers:\n    - name: wget\n      image: busybox\n",
        ),
        (
            "charts/web/templates/NOTES.txt",
            "Thank you for installing {{ .Chart.Name }}.\n",
        ),
        (
            "charts/web/crds/widgets.yaml",
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  scope: Namespaced\n  names: {kind: Widget, plural: widgets}\n  versions: [{name: v1, served: true, storage: true}]\n",
        ),
    ]
}

fn fleet(workload_helm: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = vec![
        (
            "clusters/store-1.yaml".into(),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: store-1\n  labels: {{kind: store}}\nspec:\n  vars: {{size: 3}}\n  kubernetes: {{version: 1.31.4, apiVersions: [monitoring.coreos.com/v1]}}\n"
            ),
        ),
        (
            "clusters/store-2.yaml".into(),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: store-2\n  labels: {{kind: store}}\nspec:\n  vars: {{size: 3}}\n"
            ),
        ),
        (
            "clusters/lab.yaml".into(),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: lab\n  labels: {{kind: lab}}\nspec:\n  vars: {{size: 7}}\n"
            ),
        ),
        (
            "groups/stores.yaml".into(),
            format!(
                "{HEADER}kind: Group\nmetadata:\n  name: stores\nspec:\n  selector: {{matchLabels: {{kind: store}}}}\n"
            ),
        ),
        (
            "workloads/web/workload.yaml".into(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: web\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n  helm:\n{workload_helm}"
            ),
        ),
    ];
    for (path, text) in chart().into_iter().chain(extra.iter().copied()) {
        files.push((path.to_string(), text.to_string()));
    }
    files
}

fn render(files: &[(String, String)], seed: Option<[u8; 32]>) -> RenderOutput {
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    render_with(
        &snapshot,
        &RenderOptions {
            helm_seed: seed,
            ..RenderOptions::default()
        },
    )
}

/// The resources of a cluster's bundle by `kind/namespace/name`.
fn resources(output: &RenderOutput, cluster: &str) -> BTreeMap<String, Value> {
    let bundle = output
        .bundles
        .get(cluster)
        .unwrap_or_else(|| panic!("no bundle for {cluster}: {:#?}", output.diagnostics));
    bundle
        .resources
        .iter()
        .map(|r| {
            let value = r.value();
            let key = format!(
                "{}/{}/{}",
                value["kind"].as_str().unwrap_or_default(),
                value["metadata"]["namespace"].as_str().unwrap_or_default(),
                value["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, value)
        })
        .collect()
}

fn errors(output: &RenderOutput) -> Vec<String> {
    output
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_chart_renders_per_cluster_with_values_merged_in_order() {
    let files = fleet(
        "    chart: ../../charts/web\n    values: {image: {tag: \"2.0\"}}\n    valuesFiles: [site.yaml, cluster.yaml.j2]\n",
        &[
            (
                "workloads/web/site.yaml",
                "replicas: 2\nimage:\n  tag: from-file\nsettings:\n  color: red\n",
            ),
            (
                "workloads/web/cluster.yaml.j2",
                "settings:\n  size: {{ vars.size }}\n  site: {{ cluster.name }}\n",
            ),
            (
                "overlays/stores.yaml",
                "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: stores\nspec:\n  groups: [stores]\n  helmValues: {replicas: 5}\n  labels: {tier: store}\n  patches:\n    - target: {kind: Deployment}\n      merge: {spec: {paused: false}}\n",
            ),
        ],
    );
    let output = render(&files, None);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let store = resources(&output, "store-1");
    let deployment = &store["Deployment/shop/web-web"];
    // The overlay's helmValues win over the values files; the inline tag over the file's.
    assert_eq!(deployment["spec"]["replicas"], json!(5));
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        json!("ghcr.io/example/web:2.0")
    );
    // The overlay's labels and patches apply to the chart's resources.
    assert_eq!(deployment["metadata"]["labels"]["tier"], json!("store"));
    assert_eq!(deployment["spec"]["paused"], json!(false));
    // The cluster's own Kubernetes version and API versions are its capabilities.
    assert_eq!(deployment["metadata"]["labels"]["kube"], json!("v1.31.4"));
    assert_eq!(
        store["ConfigMap/shop/web-web"]["data"],
        json!({"settings.yaml": "color: red\nsite: store-1\nsize: 3\n", "monitoring": "on"})
    );
    let lab = resources(&output, "lab");
    assert_eq!(lab["Deployment/shop/web-web"]["spec"]["replicas"], json!(2));
    assert_eq!(
        lab["Deployment/shop/web-web"]["metadata"]["labels"]["kube"],
        json!("v1.36.0"),
        "Helm's default version where the cluster names none"
    );
    assert_eq!(
        lab["ConfigMap/shop/web-web"]["data"],
        json!({"settings.yaml": "color: red\nsite: lab\nsize: 7\n"})
    );
    // The release namespace goes to namespaced resources that name none; the CRD is
    // cluster-scoped; NOTES.txt and the test hook make nothing.
    assert!(lab.contains_key("CustomResourceDefinition//widgets.example.com"));
    assert!(lab.contains_key("Secret/shop/web-web"));
    assert!(!lab.keys().any(|k| k.contains("test")), "{:?}", lab.keys());
    assert_eq!(lab.len(), 4, "{:?}", lab.keys());
}

#[test]
fn release_name_namespace_crds_and_tests_are_settings() {
    let files = fleet(
        "    chart: ../../charts/web\n    releaseName: shop\n    namespace: other\n    includeCRDs: false\n    skipTests: false\n",
        &[],
    );
    let output = render(&files, None);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let lab = resources(&output, "lab");
    let keys: Vec<&String> = lab.keys().collect();
    assert_eq!(
        keys,
        [
            "ConfigMap/other/shop-web",
            "Deployment/other/shop-web",
            "Pod/other/shop-web-test",
            "Secret/other/shop-web"
        ]
    );
}

#[test]
fn generated_values_come_from_the_seed_cluster_and_release() {
    let files = fleet("    chart: ../../charts/web\n", &[]);
    let password = |output: &RenderOutput, cluster: &str| {
        resources(output, cluster)["Secret/shop/web-web"]["stringData"]["password"]
            .as_str()
            .expect("a password")
            .to_string()
    };
    let public = render(&files, None);
    let again = render(&files, None);
    assert_eq!(password(&public, "lab"), password(&again, "lab"));
    assert_eq!(public.bundles["lab"].digest, again.bundles["lab"].digest);
    assert_eq!(password(&public, "lab").len(), 16);
    assert_ne!(password(&public, "lab"), password(&public, "store-2"));
    assert!(
        public
            .diagnostics
            .iter()
            .any(|d| !d.is_error() && d.message.contains("public seed")),
        "{:#?}",
        public.diagnostics
    );
    let secret = render(&files, Some([7; 32]));
    assert_ne!(password(&public, "lab"), password(&secret, "lab"));
    assert!(
        !secret
            .diagnostics
            .iter()
            .any(|d| d.message.contains("public seed"))
    );
    // A value set by the user is used, and nothing is generated.
    let set = fleet(
        "    chart: ../../charts/web\n    values: {password: hunter2}\n",
        &[],
    );
    let output = render(&set, None);
    assert_eq!(password(&output, "lab"), "hunter2");
    assert_eq!(password(&output, "store-2"), "hunter2");
}

/// A `spec.helm`, the files to add, and what the error must say.
type BadCase<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

#[test]
fn a_bad_helm_spec_is_an_error_naming_the_file() {
    let cases: &[BadCase<'_>] = &[
        (
            "    chart: ../../../outside\n",
            &[],
            "leads out of the fleet root",
        ),
        ("    chart: nothing-here\n", &[], "holds no Chart.yaml"),
        (
            "    chart: oci://registry.example/charts/web\n",
            &[],
            "never fetches charts",
        ),
        (
            "    chart: web\n    repo: https://charts.example\n",
            &[],
            "helm pull --repo https://charts.example web --untar",
        ),
        (
            "    chart: ../../charts/web\n    valuesFiles: [missing.yaml]\n",
            &[],
            "workloads/web/missing.yaml does not exist",
        ),
        (
            "    chart: ../../charts/web\n    values: {replicas: 1}\n",
            &[(
                "charts/web/templates/broken.yaml",
                "x: {{ include \"no.such\" . }}\n",
            )],
            "no template \"no.such\"",
        ),
        (
            "    chart: ../../charts/web\n",
            &[(
                "charts/web/templates/fail.yaml",
                "{{ fail \"set a domain\" }}\n",
            )],
            "set a domain",
        ),
        (
            "    chart: ../../charts/web\n    valuez: {}\n",
            &[],
            "unknown field",
        ),
        (
            "    chart: ../../charts/web\n",
            &[(
                "charts/web/templates/loop.yaml",
                "{{- define \"loop\" }}{{ include \"loop\" . }}{{ end }}{{ include \"loop\" . }}\n",
            )],
            "loop.yaml",
        ),
        (
            "    chart: ../../charts/web\n",
            &[(
                "charts/web/templates/huge.yaml",
                "x: {{ repeat 1000000000 \"x\" }}\n",
            )],
            "huge.yaml",
        ),
    ];
    for (helm, extra, expected) in cases {
        let output = render(&fleet(helm, extra), None);
        let errors = errors(&output);
        assert!(
            errors
                .iter()
                .any(|e| e.contains(expected) && e.contains(".yaml")),
            "{helm}: expected an error with {expected:?}, got {errors:#?}"
        );
        assert!(
            output.bundles.is_empty() || !output.bundles.contains_key("lab") || errors.is_empty()
        );
    }
}

#[test]
fn a_bad_helm_field_is_an_error_at_its_line() {
    // The `spec.helm` to try, and the key whose line the error must name.
    let cases = [
        ("    chart: oci://registry.example/charts/web\n", "chart"),
        ("    chart: nothing-here\n", "chart"),
        ("    chart: ../../../outside\n", "chart"),
        ("    chart: web\n    repo: https://charts.example\n", "repo"),
        (
            "    chart: ../../charts/web\n    valuesFiles: [missing.yaml]\n",
            "valuesFiles",
        ),
        // A key of the same name in `values:` comes first: the field's own line is named.
        (
            "    values:\n      image:\n        repo: nginx\n      chart: x\n    chart: web\n    repo: https://charts.example\n",
            "repo",
        ),
    ];
    for (helm, key) in cases {
        let files = fleet(helm, &[]);
        let workload = &files
            .iter()
            .find(|(path, _)| path == "workloads/web/workload.yaml")
            .expect("the workload file")
            .1;
        let line = workload
            .lines()
            .position(|line| line.starts_with(&format!("    {key}:")))
            .expect("the key")
            + 1;
        let errors = errors(&render(&files, None));
        let at = format!("workloads/web/workload.yaml:{line}: spec.helm.");
        assert!(
            errors.iter().any(|e| e.starts_with(&at)),
            "{helm}: expected an error starting {at:?}, got {errors:#?}"
        );
    }
}

#[test]
fn a_missing_dependency_names_chart_yaml() {
    let files = fleet(
        "    chart: ../../charts/app\n",
        &[
            (
                "charts/app/Chart.yaml",
                "apiVersion: v2\nname: app\nversion: 0.1.0\ndependencies:\n  - name: redis\n    version: 1.x\n    repository: https://charts.example\n",
            ),
            (
                "charts/app/templates/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\n",
            ),
        ],
    );
    let output = render(&files, None);
    let errors = errors(&output);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("charts/app/Chart.yaml") && e.contains("missing in charts/")),
        "{errors:#?}"
    );
}

#[test]
fn a_crd_two_charts_ship_byte_for_byte_is_kept_once_with_a_warning() {
    let mut files = fleet("    chart: ../../charts/web\n", &[]);
    files.push((
        "workloads/shop/workload.yaml".into(),
        format!("{HEADER}kind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: shop\n  targets:\n    - cluster: lab\n  helm:\n    chart: ../../charts/web\n    releaseName: second\n"),
    ));
    let output = render(&files, None);
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let lab = resources(&output, "lab");
    assert!(lab.contains_key("CustomResourceDefinition//widgets.example.com"));
    assert!(lab.contains_key("Deployment/shop/second-web"));
    assert!(
        output.diagnostics.iter().any(|d| !d.is_error()
            && d.message.contains("widgets.example.com")
            && d.message.contains("kept once")),
        "{:#?}",
        output.diagnostics
    );
    // Different content under one identity stays an error.
    files.push((
        "workloads/shop/manifests/crd.yaml".into(),
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  scope: Cluster\n  names: {kind: Widget, plural: widgets}\n  versions: [{name: v1, served: true, storage: true}]\n".into(),
    ));
    let output = render(&files, None);
    assert!(
        errors(&output).iter().any(|e| e.contains("defined twice")),
        "{:#?}",
        output.diagnostics
    );
}

#[test]
fn a_packed_chart_renders_like_its_folder() {
    let folder = render(&fleet("    chart: ../../charts/web\n", &[]), None);
    // The same chart packed as `helm package` packs it: one top folder, the chart.
    let mut archive = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    for (path, text) in chart() {
        let inside = path.strip_prefix("charts/").expect("under charts/");
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive
            .append_data(&mut header, inside, text.as_bytes())
            .expect("append");
    }
    let bytes = archive
        .into_inner()
        .and_then(|gz| gz.finish())
        .expect("archive");
    let files: Vec<(String, String)> = fleet("    chart: ../../packed/web-1.2.3.tgz\n", &[])
        .into_iter()
        .filter(|(path, _)| !path.starts_with("charts/"))
        .collect();
    let mut snapshot =
        FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    snapshot
        .binaries
        .insert("packed/web-1.2.3.tgz".into(), bytes.into());
    let packed = render_with(&snapshot, &RenderOptions::default());
    assert!(errors(&packed).is_empty(), "{:#?}", packed.diagnostics);
    for cluster in ["lab", "store-1", "store-2"] {
        assert_eq!(
            resources(&packed, cluster),
            resources(&folder, cluster),
            "{cluster}"
        );
    }
    // A packed chart that is no archive is an error naming it.
    snapshot
        .binaries
        .insert("packed/web-1.2.3.tgz".into(), b"not gzip".to_vec().into());
    let broken = render_with(&snapshot, &RenderOptions::default());
    assert!(
        errors(&broken)
            .iter()
            .any(|e| e.contains("packed/web-1.2.3.tgz") && e.contains("cannot read the archive")),
        "{:#?}",
        broken.diagnostics
    );
}

#[test]
fn generated_values_stay_when_another_workload_changes() {
    let before = fleet("    chart: ../../charts/web\n", &[]);
    let mut after = before.clone();
    after.push((
        "workloads/other/workload.yaml".into(),
        format!("{HEADER}kind: Workload\nmetadata:\n  name: other\nspec:\n  namespace: other\n  targets:\n    - clusterSelector: {{}}\n"),
    ));
    after.push((
        "workloads/other/manifests/cm.yaml".into(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\n".into(),
    ));
    let first = render(&before, Some([3; 32]));
    let snapshot = FleetSnapshot::from_files(after.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let options = RenderOptions {
        helm_seed: Some([3; 32]),
        ..RenderOptions::default()
    };
    let since = flotilla_render::render_since(&first, &snapshot, &options);
    let whole = render(&after, Some([3; 32]));
    for cluster in ["lab", "store-1", "store-2"] {
        let secret =
            |output: &RenderOutput| resources(output, cluster)["Secret/shop/web-web"].clone();
        assert_eq!(secret(&first), secret(&since), "{cluster}");
        assert_eq!(secret(&first), secret(&whole), "{cluster}");
        assert_eq!(since.bundles[cluster].digest, whole.bundles[cluster].digest);
    }
}

#[test]
fn diff_and_the_json_report_name_a_charts_new_version() {
    let base = render(&fleet("    chart: ../../charts/web\n", &[]), None);
    let head_files: Vec<(String, String)> = fleet("    chart: ../../charts/web\n", &[])
        .into_iter()
        .map(|(path, text)| match path.as_str() {
            "charts/web/Chart.yaml" => (path, text.replace("version: 1.2.3", "version: 1.3.0")),
            _ => (path, text),
        })
        .collect();
    let head = render(&head_files, None);
    let diff = flotilla_render::diff::diff(&base, &head, &Default::default());
    let text = flotilla_render::diff::text::report(
        &diff,
        &flotilla_render::diff::text::TextOptions { colour: false },
    );
    assert!(
        text.contains("Helm charts\n  web: web 1.2.3 (charts/web) -> web 1.3.0 (charts/web)\n"),
        "{text}"
    );
    let markdown = flotilla_render::diff::markdown::report(&diff, &Default::default());
    assert!(
        markdown.contains("- `web`: `web 1.2.3 (charts/web)` → `web 1.3.0 (charts/web)`"),
        "{markdown}"
    );
    let json: Value =
        serde_json::from_str(&flotilla_render::diff::json::report(&diff).expect("json"))
            .expect("valid JSON");
    assert_eq!(
        json["charts"],
        json!([{"workload": "web", "base": "web 1.2.3 (charts/web)", "head": "web 1.3.0 (charts/web)"}])
    );
    // No change, no section.
    let same = flotilla_render::diff::diff(&base, &base, &Default::default());
    let json: Value =
        serde_json::from_str(&flotilla_render::diff::json::report(&same).expect("json"))
            .expect("valid JSON");
    assert!(json.get("charts").is_none());
}

#[test]
fn validate_names_each_template_that_generates_a_value() {
    let output = render(&fleet("    chart: ../../charts/web\n", &[]), None);
    let warnings: Vec<String> = output
        .diagnostics
        .iter()
        .filter(|d| !d.is_error() && d.message.starts_with("randAlphaNum generates a value"))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "once, not once per cluster: {warnings:#?}"
    );
    assert!(
        warnings[0]
            .starts_with("charts/web/templates/secret.yaml: warning: randAlphaNum generates"),
        "{warnings:#?}"
    );
    // With the hub's seed it is no news.
    let output = render(&fleet("    chart: ../../charts/web\n", &[]), Some([1; 32]));
    assert!(
        !output
            .diagnostics
            .iter()
            .any(|d| d.message.contains("generates a value"))
    );
}

#[test]
fn a_missing_value_a_chart_prints_is_a_warning() {
    let output = render(
        &fleet(
            "    chart: ../../charts/web\n",
            &[(
                "charts/web/templates/typo.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: typo\ndata:\n  color: \"{{ .Values.settings.colour }}\"\n",
            )],
        ),
        Some([1; 32]),
    );
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    // Printed as Helm prints it: nothing.
    assert_eq!(
        resources(&output, "lab")["ConfigMap/shop/typo"]["data"]["color"],
        json!("")
    );
    let warnings: Vec<String> = output
        .diagnostics
        .iter()
        .filter(|d| !d.is_error() && d.message.contains("is missing"))
        .map(ToString::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].starts_with("charts/web/templates/typo.yaml: warning: web/templates/typo.yaml: a value the template prints is missing"),
        "{warnings:#?}"
    );
}

/// The fleet with a template of the chart that calls `lookup` (a warning of every
/// release), without schema checks (the chart's Deployment has no selector).
fn looking_up() -> Vec<(String, String)> {
    let mut files = fleet(
        "    chart: ../../charts/web\n",
        &[(
            "charts/web/templates/lookup.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: looked-up\ndata:\n  found: {{ len (lookup \"v1\" \"Secret\" \"shop\" \"db\") | quote }}\n",
        )],
    );
    files.push((
        "flotilla.yaml".into(),
        format!("{HEADER}kind: FleetSettings\nspec:\n  validation: off\n"),
    ));
    files
}

/// A chart's warnings (here `lookup`'s, and a value generated from the public seed)
/// are kept with the clusters whose releases met them: a render since the one
/// before that renders none of those clusters again reports them as a full render
/// does.
#[test]
fn a_render_since_the_last_keeps_the_warnings_of_the_releases_it_does_not_render_again() {
    let files = looking_up();
    let snapshot = |files: &[(String, String)]| {
        FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
    };
    for seed in [None, Some([7; 32])] {
        let options = RenderOptions {
            helm_seed: seed,
            ..RenderOptions::default()
        };
        let first = render_with(&snapshot(&files), &options);
        assert!(first.is_clean(), "{:#?}", first.diagnostics);
        assert!(
            first
                .warnings()
                .any(|d| d.message.contains("lookup v1 Secret shop/db")),
            "{:#?}",
            first.diagnostics
        );
        // A file no cluster reads, then one cluster's own file: the render since
        // renders no cluster, then one, and warns as a full render does.
        let mut unread = files.clone();
        unread.push(("notes.md".into(), "hello\n".into()));
        let mut one = unread.clone();
        for (path, text) in &mut one {
            if path == "clusters/lab.yaml" {
                *text = text.replace("size: 7", "size: 8");
            }
        }
        let mut previous = first;
        for next in [unread, one] {
            let full = render_with(&snapshot(&next), &options);
            let since = flotilla_render::render_since(&previous, &snapshot(&next), &options);
            assert_eq!(since.diagnostics, full.diagnostics, "seed {seed:?}");
            assert_eq!(
                since.generated_from_public_seed, full.generated_from_public_seed,
                "seed {seed:?}"
            );
            assert_eq!(full.generated_from_public_seed, seed.is_none());
            previous = since;
        }
    }
}

/// A cluster whose releases warn is still rendered in part: a commit that changes
/// another of its workloads renders that workload alone, keeps the release (and its
/// warnings) from the render before, and warns as a full render does.
#[test]
fn a_cluster_whose_release_warns_is_rendered_in_part_when_another_workload_changes() {
    let mut files = looking_up();
    // No Secret: a Secret for a cluster without an agent key is a warning of the
    // cluster's own, which has it rendered whole.
    files.retain(|(path, _)| path != "charts/web/templates/secret.yaml");
    files.push((
        "workloads/cfg/workload.yaml".into(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: cfg\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    ));
    let config = |value: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  v: \"{value}\"\n"
        )
    };
    files.push(("workloads/cfg/manifests/cfg.yaml".into(), config("1")));
    let snapshot = |files: &[(String, String)]| {
        FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
    };
    let options = RenderOptions {
        helm_seed: Some([7; 32]),
        ..RenderOptions::default()
    };
    let first = render_with(&snapshot(&files), &options);
    assert!(first.is_clean(), "{:#?}", first.diagnostics);
    let warned = |output: &RenderOutput| {
        output
            .warnings()
            .filter(|d| d.message.contains("lookup v1 Secret shop/db"))
            .map(|d| d.cluster.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        warned(&first),
        [Some("lab and 2 other clusters".to_string())]
    );

    for (path, text) in &mut files {
        if path == "workloads/cfg/manifests/cfg.yaml" {
            *text = config("2");
        }
    }
    let next = snapshot(&files);
    let full = render_with(&next, &options);
    let rendered = std::sync::atomic::AtomicUsize::new(0);
    let progress = |_: usize, _: usize| {
        rendered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let mut asked: Vec<String> = Vec::new();
    let since = flotilla_render::render_since_fetching(
        &first,
        &next,
        &RenderOptions {
            progress: Some(&progress),
            ..options
        },
        &mut |names| {
            asked.extend(names.iter().cloned());
            names
                .iter()
                .map(|n| first.bundles.get(n).cloned())
                .collect()
        },
    );
    // Every cluster rendered in part, once: no cluster rendered whole after all.
    assert_eq!(asked, ["lab", "store-1", "store-2"]);
    assert_eq!(rendered.into_inner(), 3);
    assert_eq!(since.diagnostics, full.diagnostics);
    assert_eq!(since.provenance, full.provenance);
    let digests = |o: &RenderOutput| {
        o.bundles
            .iter()
            .map(|(n, b)| (n.clone(), b.digest.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(digests(&since), digests(&full));
    assert_eq!(
        warned(&since),
        [Some("lab and 2 other clusters".to_string())]
    );
}

/// A cluster that fails to assemble (here, two workloads give it the same object)
/// still reports its releases' warnings beside its error.
#[test]
fn a_cluster_that_fails_still_reports_its_releases_warnings() {
    let mut files = looking_up();
    files.push((
        "workloads/dup/workload.yaml".into(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: dup\nspec:\n  namespace: shop\n  targets:\n    - cluster: lab\n"
        ),
    ));
    files.push((
        "workloads/dup/manifests/cm.yaml".into(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: looked-up\n".into(),
    ));
    let output = render(&files, Some([7; 32]));
    assert!(!output.bundles.contains_key("lab"));
    assert!(output.errors().any(|d| d.cluster.as_deref() == Some("lab")));
    let warned: Vec<Option<String>> = output
        .warnings()
        .filter(|d| d.message.contains("lookup v1 Secret shop/db"))
        .map(|d| d.cluster.clone())
        .collect();
    assert_eq!(warned, [Some("lab and 2 other clusters".to_string())]);
}

/// A cluster's `spec.kubernetes.version` is read as Helm reads `--kube-version`
/// (`1.31` is `v1.31.0`), one that is not a version is an error at its line, and a
/// chart whose `kubeVersion` the cluster's version does not meet is refused for that
/// cluster with Helm's message.
#[test]
fn kubernetes_versions_read_as_helm_reads_them_and_a_charts_kube_version_is_enforced() {
    let with_version = |version: &str, constraint: Option<&str>| {
        let mut files = fleet("    chart: ../../charts/web\n", &[]);
        for (path, text) in &mut files {
            if path == "clusters/store-1.yaml" {
                *text = text.replace("version: 1.31.4", &format!("version: {version:?}"));
            }
            if let Some(constraint) = constraint
                && path == "charts/web/Chart.yaml"
            {
                text.push_str(&format!("kubeVersion: {constraint:?}\n"));
            }
        }
        render(&files, Some([7; 32]))
    };
    let kube_label = |output: &RenderOutput| {
        resources(output, "store-1")["Deployment/shop/web-web"]["metadata"]["labels"]["kube"]
            .clone()
    };
    assert_eq!(kube_label(&with_version("1.31", None)), "v1.31.0");
    assert_eq!(
        kube_label(&with_version("v1.30.2-gke.100", None)),
        "v1.30.2-gke.100"
    );
    let banana = with_version("banana", None);
    assert_eq!(
        errors(&banana),
        [
            "clusters/store-1.yaml:8: spec.kubernetes.version: \"banana\" is not a Kubernetes version (write it as 1.31, 1.31.4 or v1.31.4)"
        ]
    );
    // The chart asks for 1.32 or newer: store-1 (1.31) is refused, the others (the
    // default version) render.
    let refused = with_version("1.31.4", Some(">=1.32.0-0"));
    let refusals: Vec<String> = errors(&refused)
        .into_iter()
        .filter(|e| e.contains("chart requires kubeVersion: >=1.32.0-0 which is incompatible with Kubernetes v1.31.4"))
        .collect();
    assert_eq!(refusals.len(), 1, "{:#?}", refused.diagnostics);
    assert!(refusals[0].contains("store-1"), "{}", refusals[0]);
    assert!(refused.bundles.contains_key("lab"));
    assert!(with_version("1.32.1", Some(">=1.32.0-0")).is_clean());
}

/// A resource whose `helm.sh/hook` names an event Helm does not know (a typo, Helm
/// 2's `crd-install`) or only rollback events is left out of the bundle with a
/// warning, as Helm leaves it out of an install; a hook with an install event among
/// rollback ones is a hook.
#[test]
fn hooks_helm_would_not_install_are_left_out_with_a_warning() {
    let job = |name: &str, hook: &str| {
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  annotations:\n    helm.sh/hook: {hook:?}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: a, image: busybox}}]\n---\n"
        )
    };
    let jobs = [
        job("rollback-only", "pre-rollback"),
        job("typo", "pre-instal"),
        job("helm-two", "crd-install"),
        job("migrate", "pre-install, pre-rollback"),
    ]
    .concat();
    let files = fleet(
        "    chart: ../../charts/web\n",
        &[("charts/web/templates/jobs.yaml", jobs.as_str())],
    );
    let output = render(&files, Some([7; 32]));
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let jobs: Vec<String> = resources(&output, "lab")
        .keys()
        .filter(|k| k.starts_with("Job/"))
        .cloned()
        .collect();
    assert_eq!(jobs, ["Job/shop/migrate"]);
    let warned: Vec<&str> = output
        .warnings()
        .filter(|w| w.message.contains("as Helm leaves it out"))
        .map(|w| w.message.as_str())
        .collect();
    for expected in [
        "charts/web/templates/jobs.yaml: Job rollback-only is left out, as Helm leaves it out: its helm.sh/hook (pre-rollback) runs only on helm rollback",
        "charts/web/templates/jobs.yaml: Job typo is left out, as Helm leaves it out: its helm.sh/hook names the unknown event \"pre-instal\"",
        "charts/web/templates/jobs.yaml: Job helm-two is left out, as Helm leaves it out: its helm.sh/hook names the unknown event \"crd-install\"",
    ] {
        assert!(
            warned.iter().any(|w| w.contains(expected)),
            "{expected}\n{warned:#?}"
        );
    }
    let meta = output.bundles["lab"]
        .meta
        .as_deref()
        .expect("hooks in meta");
    assert_eq!(meta.hooks.len(), 1, "{:?}", meta.hooks);
}

/// `range` and `len` over Helm's map and slice types, as Go templates allow them:
/// `.Files` and `.Files.Glob` (a `map[string][]byte`, paths sorted) and
/// `.Capabilities.APIVersions` (a `[]string`).
#[test]
fn range_and_len_go_over_files_and_api_versions() {
    let template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: listing\ndata:\n{{- range $path, $_ := .Files.Glob \"files/*\" }}\n  {{ base $path }}: {{ $.Files.Get $path | quote }}\n{{- end }}\n  files: {{ len .Files | quote }}\n  first: {{ range $i, $v := .Capabilities.APIVersions }}{{ if eq $i 0 }}{{ $v | quote }}{{ end }}{{ end }}\n  versions: {{ gt (len .Capabilities.APIVersions) 10 | quote }}\n";
    let files = fleet(
        "    chart: ../../charts/web\n",
        &[
            ("charts/web/files/b.txt", "bee\n"),
            ("charts/web/files/a.txt", "ay\n"),
            ("charts/web/templates/listing.yaml", template),
        ],
    );
    let output = render(&files, Some([7; 32]));
    assert!(errors(&output).is_empty(), "{:#?}", output.diagnostics);
    let data = &resources(&output, "lab")["ConfigMap/shop/listing"]["data"];
    assert_eq!(data["a.txt"], "ay\n");
    assert_eq!(data["b.txt"], "bee\n");
    // The two files and crds/widgets.yaml: Helm's `.Files` holds the CRDs' files too.
    assert_eq!(data["files"], "3");
    assert_eq!(data["first"], "v1");
    assert_eq!(data["versions"], "true");
}
