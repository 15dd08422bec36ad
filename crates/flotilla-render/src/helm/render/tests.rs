//! Tiny charts rendered end to end. Every expected output was checked against Helm
//! v4 (helm-python-sdk 0.2.2, Helm SDK v4.2.3) with the same chart and values.

use std::collections::BTreeMap;

use super::*;

struct FixedHost;

impl Host for FixedHost {
    fn template_name(&self) -> &str {
        ""
    }
    fn generated_bytes(&mut self, _: &str, _: &[Value], len: usize) -> Vec<u8> {
        vec![7; len]
    }
    fn now_unix(&self) -> i64 {
        0
    }
    fn warn(&mut self, _: String) {}
}

fn chart(files: &[(&str, &str)]) -> Chart {
    let files: BTreeMap<String, Vec<u8>> = files
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    Chart::from_files(files).expect("chart loads")
}

fn release() -> Release {
    Release {
        name: "rel".to_string(),
        namespace: "ns".to_string(),
        revision: 1,
        is_install: true,
        capabilities: Capabilities {
            kube_version: "v1.36.0".to_string(),
            api_versions: vec!["v1".to_string(), "apps/v1".to_string()],
        },
    }
}

fn render(files: &[(&str, &str)], values: &str) -> Result<Vec<(String, String)>, HelmError> {
    let values = Value::map(yaml::from_yaml_map(values).expect("values"));
    render_release(
        &chart(files),
        &release(),
        &values,
        &mut FixedHost,
        &Budget::default(),
    )
    .map(|r| r.templates)
}

const CHART_YAML: &str = "apiVersion: v2\nname: t\nversion: 0.1.0\nappVersion: \"1.2\"\n";

#[test]
fn set_changes_the_map_every_holder_sees() {
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            ("values.yaml", "a: 1\n"),
            (
                "templates/a.yaml",
                "{{ $_ := set .Values \"x\" 1 }}{{ .Values.x }}\n{{ $d := dict \"k\" 1 }}{{ $e := $d }}{{ $_ := set $e \"k\" 2 }}{{ $d.k }}\n",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(
        out,
        [("t/templates/a.yaml".to_string(), "1\n2\n".to_string())]
    );
}

#[test]
fn a_render_never_changes_the_charts_values() {
    let files = [
        ("Chart.yaml", CHART_YAML),
        ("values.yaml", "m:\n  k: 1\n"),
        (
            "templates/a.yaml",
            "{{ .Values.m.k }}{{ $_ := set .Values.m \"k\" 2 }}",
        ),
    ];
    let prepared = PreparedChart::new(chart(&files));
    for _ in 0..2 {
        let out = prepared
            .render(
                &release(),
                &Value::map(BTreeMap::new()),
                &mut FixedHost,
                &Budget::default(),
            )
            .expect("renders");
        assert_eq!(out.templates[0].1, "1");
    }
}

#[test]
fn builtin_objects_as_helm_shows_them() {
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            ("values.yaml", ""),
            ("files/a.txt", "one\ntwo\n"),
            ("files/b.conf", "x"),
            (
                "templates/a.yaml",
                concat!(
                    "{{ .Release.Name }} {{ .Release.Namespace }} {{ .Release.Revision }} {{ .Release.IsInstall }} {{ .Release.Service }}\n",
                    "{{ .Chart.Name }} {{ .Chart.Version }} {{ .Chart.AppVersion }} {{ .Chart.APIVersion }}\n",
                    "{{ .Capabilities.KubeVersion }} {{ .Capabilities.KubeVersion.Major }} {{ .Capabilities.KubeVersion.Minor }} {{ .Capabilities.APIVersions.Has \"apps/v1\" }} {{ .Capabilities.APIVersions.Has \"x/v1\" }}\n",
                    "{{ .Template.Name }} {{ .Template.BasePath }}\n",
                    "{{ .Files.Get \"files/a.txt\" | quote }} {{ .Files.Lines \"files/a.txt\" }} {{ .Files.Get \"none\" | quote }}\n",
                    "{{ (.Files.Glob \"files/*.txt\").AsConfig }}\n",
                    "{{ (.Files.Glob \"files/*\").AsSecrets }}\n",
                ),
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(
        out[0].1,
        concat!(
            "rel ns 1 true Helm\n",
            "t 0.1.0 1.2 v2\n",
            "v1.36.0 1 36 true false\n",
            "t/templates/a.yaml t/templates\n",
            "\"one\\ntwo\\n\" [one two] \"\"\n",
            "a.txt: |\n  one\n  two\n",
            "a.txt: b25lCnR3bwo=\nb.conf: eA==\n",
        )
    );
}

#[test]
fn templates_come_in_helms_order_partials_unrendered_and_parent_defines_win() {
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            ("templates/_h.tpl", "{{ define \"n\" }}parent{{ end }}"),
            ("templates/a.yaml", "{{ include \"n\" . }}"),
            ("templates/b.yaml", "{{ .Values.missing }}"),
            (
                "charts/sub/Chart.yaml",
                "apiVersion: v2\nname: sub\nversion: 0.1.0\n",
            ),
            (
                "charts/sub/templates/_h.tpl",
                "{{ define \"n\" }}sub{{ end }}",
            ),
            ("charts/sub/templates/c.yaml", "{{ include \"n\" . }}"),
        ],
        "{}",
    )
    .expect("renders");
    let names: Vec<(&str, &str)> = out.iter().map(|(n, o)| (n.as_str(), o.as_str())).collect();
    assert_eq!(
        names,
        [
            ("t/charts/sub/templates/c.yaml", "parent"),
            ("t/templates/b.yaml", ""),
            ("t/templates/a.yaml", "parent"),
        ]
    );
}

#[test]
fn yaml_functions_and_their_error_forms() {
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            (
                "templates/a.yaml",
                "{{ toYaml .Values }}\n{{ (fromYaml \"a: [\").Error | empty | not }}\n{{ fromYamlArray \"- 1\\n- b\" }}\n{{ kindOf (genCA \"x\" 1) }}",
            ),
        ],
        "b:\n  c: [1, x]\n",
    )
    .expect("renders");
    assert_eq!(out[0].1, "b:\n  c:\n  - 1\n  - x\ntrue\n[1 b]\nstruct");
}

#[test]
fn a_missing_map_through_a_variable_is_an_empty_map() {
    // Bitnami's `$secret := (lookup ...).data` then `hasKey $secret "k"`.
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            (
                "templates/a.yaml",
                "{{ $s := (lookup \"v1\" \"Secret\" \"ns\" \"n\").data }}{{ hasKey $s \"k\" }}",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(out[0].1, "false");
}

#[test]
fn null_defaults_leave_no_key() {
    // Checked against Helm v4: the chart's nulls are dropped at every depth.
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            (
                "values.yaml",
                "a:\n  b: null\n  c: 1\nd: null\ne:\n  f:\n    g: null\n",
            ),
            (
                "templates/a.yaml",
                "{{ toYaml .Values }}|{{ hasKey .Values.a \"b\" }}",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(out[0].1, "a:\n  c: 1\ne:\n  f: {}|false");
}

#[test]
fn files_without_entries_are_false() {
    // Checked against Helm v4: `.Files.Glob` that matches nothing is false in `if`.
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            ("files/a.txt", "a"),
            (
                "templates/a.yaml",
                "{{ if .Files.Glob \"none/*\" }}yes{{ else }}no{{ end }} {{ if .Files.Glob \"files/*\" }}yes{{ end }}",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(out[0].1, "no yes");
}

#[test]
fn a_map_holding_itself_ends_without_a_crash() {
    // Go recurses until its stack overflows here; flotilla prints the inner map as
    // `<cycle>`, and toYaml and toJson fail (their error form is an empty string).
    let cases = [
        ("{{ $d }}", "map[s:<cycle>]"),
        ("{{ toYaml $d }}", ""),
        ("{{ toJson $d }}", ""),
        ("{{ deepCopy $d }}", "map[s:map[s:<cycle>]]"),
    ];
    for (use_it, want) in cases {
        let text = format!("{{{{ $d := dict }}}}{{{{ $_ := set $d \"s\" $d }}}}{use_it}");
        let out = render(
            &[("Chart.yaml", CHART_YAML), ("templates/a.yaml", &text)],
            "{}",
        )
        .expect("renders");
        assert_eq!(out[0].1, want, "{use_it}");
    }
}

#[test]
fn globs_match_as_helms_files_glob() {
    let cases = [
        ("files/*.txt", "files/a.txt", true),
        ("files/*", "files/sub/a.txt", false),
        ("files/**", "files/sub/a.txt", true),
        ("**.conf", "a/b/c.conf", true),
        ("files/?.txt", "files/a.txt", true),
        ("files/[ab].txt", "files/b.txt", true),
        ("files/[!ab].txt", "files/b.txt", false),
        ("files/{a,b}.txt", "files/b.txt", true),
        ("files/{a,b}.txt", "files/c.txt", false),
        ("files/\\*", "files/*", true),
        ("files/\\*", "files/a", false),
    ];
    for (pattern, path, want) in cases {
        assert_eq!(
            glob_match(pattern.as_bytes(), path.as_bytes()),
            want,
            "{pattern} {path}"
        );
    }
    // Many stars against a long name finish at once (no backtracking).
    let stars = "*a".repeat(40);
    let long = "a".repeat(60) + "b";
    assert!(!glob_match(stars.as_bytes(), long.as_bytes()));
}

#[test]
fn to_toml_writes_as_helm_does() {
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            (
                "values.yaml",
                "a:\n  b: x\n  c: 1\n  d: [1, 2]\n  e:\n    f: true\n  g:\n    - {h: 1}\n    - {h: 2}\nz: 1.5\ns: \"q\\\"\\n\"\nm: {}\nn2: [a, b]\n",
            ),
            (
                "templates/a.yaml",
                "{{ toToml .Values }}|{{ toToml (dict \"i\" 1 \"l\" (list 1 \"a\")) }}|{{ toToml \"x\" }}",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(
        out[0].1,
        "n2 = [\"a\", \"b\"]\ns = \"q\\\"\\n\"\nz = 1.5\n\n[a]\n  b = \"x\"\n  c = 1.0\n  d = [1.0, 2.0]\n  [a.e]\n    f = true\n\n  [[a.g]]\n    h = 1.0\n\n  [[a.g]]\n    h = 2.0\n\n[m]\n|i = 1\nl = [1, \"a\"]\n|\"x\""
    );
}

#[test]
fn subcharts_and_kinds_as_helm_shows_them() {
    let out = render(
        &[
            ("Chart.yaml", CHART_YAML),
            ("charts/sub/Chart.yaml", "apiVersion: v2\nname: sub\nversion: 0.1.0\n"),
            (
                "templates/y.yaml",
                "{{ .Subcharts.sub.Chart.Name }} {{ .Subcharts.sub.Values.global }} {{ kindOf .Release }} {{ kindOf .Chart }} {{ kindOf .Capabilities }} {{ kindOf .Files }} {{ typeOf .Files }} {{ .Capabilities.HelmVersion.Version }} {{ .Chart.Type }}|{{ .Chart.Keywords }}|{{ .Chart.Maintainers }}|{{ .Chart.Annotations }}|{{ .Chart.Deprecated }}",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(
        out[0].1,
        "sub map[] map map ptr map engine.files v4.2 |[]|[]|map[]|false"
    );
}

/// Many releases of one chart render in parallel from one prepared chart.
#[test]
fn a_prepared_chart_is_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<PreparedChart>();
}

#[test]
fn the_chart_is_a_map_of_go_field_names() {
    let out = render(
        &[
            (
                "Chart.yaml",
                "apiVersion: v2\nname: t\nversion: 0.1.0\nappVersion: \"1.2\"\nkeywords: [a]\nmaintainers:\n  - name: m\n    email: e\n",
            ),
            (
                "templates/y.yaml",
                "{{ typeOf .Chart }} {{ typeOf .Capabilities }} {{ typeOf .Capabilities.KubeVersion }} {{ kindOf .Capabilities.KubeVersion }} {{ typeOf .Capabilities.APIVersions }}|{{ .Chart }}|{{ index .Chart.Maintainers 0 }}",
            ),
        ],
        "{}",
    )
    .expect("renders");
    assert_eq!(
        out[0].1,
        "map[string]interface {} *common.Capabilities common.KubeVersion struct common.VersionSet|map[APIVersion:v2 Annotations:map[] AppVersion:1.2 Condition: Dependencies:[] Deprecated:false Description: Home: Icon: IsRoot:true Keywords:[a] KubeVersion: Maintainers:[map[Email:e Name:m URL:]] Name:t Sources:[] Tags: Type: Version:0.1.0]|map[Email:e Name:m URL:]"
    );
}

#[test]
fn errors_are_worded_as_helm_words_them() {
    let cases = [
        (
            "x: {{ fail \"boom\" }}",
            "execution error at (t/templates/a.yaml:1:6): boom",
        ),
        (
            "x: {{ .Values.a.b.c }}",
            "t/templates/a.yaml:1:13\n  executing \"t/templates/a.yaml\" at <.Values.a.b.c>:\n    nil pointer evaluating interface {}.b",
        ),
    ];
    for (text, want) in cases {
        let err = render(
            &[("Chart.yaml", CHART_YAML), ("templates/a.yaml", text)],
            "{}",
        )
        .expect_err("fails");
        assert_eq!(err.to_string(), want, "{text}");
    }
}
