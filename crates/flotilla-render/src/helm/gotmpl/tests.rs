//! Table tests of the template engine. Every expected output and error message was
//! checked against the real Helm v4 engine (a one-template chart rendered with the
//! values shown; Helm's own rewording of errors undone where it applies).

use std::collections::BTreeMap;

use super::*;

struct TestHost;

impl Host for TestHost {
    fn template_name(&self) -> &str {
        "t/templates/a.yaml"
    }
    fn generated_bytes(&mut self, _: &str, _: &[Value], len: usize) -> Vec<u8> {
        vec![0; len]
    }
    fn now_unix(&self) -> i64 {
        0
    }
    fn warn(&mut self, _: String) {}
}

fn quote(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let parts: Vec<String> = args
        .iter()
        .filter(|a| !matches!(a, Value::Nil | Value::Missing))
        .map(|a| fmt::quote_go(&fmt::display(a)))
        .collect();
    Ok(Value::string(parts.join(" ")))
}

fn upper(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    match args {
        [Value::String(s)] => Ok(Value::string(s.to_uppercase())),
        [_] => Err(FuncError::wrong_type(0, "string")),
        _ => Err(FuncError::new("wrong number of args")),
    }
}

fn test_funcs() -> Funcs {
    [("quote", quote as Func), ("upper", upper as Func)]
        .into_iter()
        .collect()
}

/// The values of the test chart: `num: 3`, `s: str`, `l: [a, 1, 2.5, null]`,
/// `mm: {a: {b: 1}}`, `nul: null`.
fn values() -> Value {
    let json = serde_json::json!({
        "num": 3, "s": "str", "l": ["a", 1, 2.5, null], "mm": {"a": {"b": 1}}, "nul": null,
    });
    let mut top = BTreeMap::new();
    top.insert("Values".to_string(), Value::from_json(&json));
    Value::map(top)
}

const NAME: &str = "t/templates/a.yaml";

fn render_with(templates: &[(&str, &str)], budget: &Budget) -> Result<String, String> {
    let funcs = test_funcs();
    let mut set = TemplateSet::new();
    for (name, text) in templates {
        set.parse(name, text, &funcs).map_err(|e| e.to_string())?;
    }
    set.execute(NAME, &values(), &funcs, &mut TestHost, budget)
        .map(|out| helm_clean_output(&out))
        .map_err(|e| e.to_string())
}

fn render(text: &str) -> Result<String, String> {
    render_with(&[(NAME, text)], &Budget::default())
}

#[track_caller]
fn check(cases: &[(&str, &str)]) {
    for (text, want) in cases {
        let got = match render(text) {
            Ok(s) => s,
            Err(e) => format!("ERR {e}"),
        };
        assert_eq!(&got, want, "template: {text}");
    }
}

#[test]
fn prints_values_as_go_does() {
    check(&[
        (
            "{{ 1.5e3 }} {{ 0x1F }} {{ 1_000 }} {{ 0o17 }} {{ 017 }} {{ 'a' }} {{ 1e6 }} {{ 0.0001 }} {{ 1e-5 }} {{ -0.0 }} {{ 100.0 }} {{ 123456789.0 }}",
            "1500 31 1000 15 15 97 1e+06 0.0001 1e-05 -0 100 1.23456789e+08",
        ),
        (
            "{{ .Values.l }}|{{ .Values.mm }}|{{ .Values.num }}",
            "[a 1 2.5 <nil>]|map[a:map[b:1]]|3",
        ),
        ("[{{ .Values.missing }}][{{ .Values.nul }}]", "[][]"),
        (
            r#"{{ print 1 2 "a" 3 4 .Values.l nil }}|{{ println 1 "a" }}|{{ printf "%d %s %v %5.2f|%-5s|%05d|%x|%q|%T" 3 "s" .Values.mm 3.14159 "ab" 42 "hi" "q" .Values.num }}"#,
            "1 2a3 4 [a 1 2.5 <nil>] <nil>|1 a\n|3 s map[a:map[b:1]]  3.14|ab   |00042|6869|\"q\"|float64",
        ),
        (
            r#"{{ printf "%d" "x" }}|{{ printf "%d" }}|{{ printf "x" 3 }}|{{ printf "%!" }}|{{ printf "%z" 3 }}"#,
            "%!d(string=x)|%!d(MISSING)|x%!(EXTRA int=3)|%!!(MISSING)|%!z(int=3)",
        ),
        (
            r#"{{ .Values.num | printf "%v" "x" }}"#,
            "x%!(EXTRA float64=3)",
        ),
        (
            r#"{{ html "<a&\"'>" }}|{{ js "<a&\"'>\\ é" }}|{{ urlquery "a b&c/é" }}"#,
            r#"&lt;a&amp;&#34;&#39;&gt;|\u003Ca\u0026\"\'\u003E\\ é|a+b%26c%2F%C3%A9"#,
        ),
        ("{{ 1 | not }}", "false"),
    ]);
}

#[test]
fn trims_spaces_and_skips_comments() {
    check(&[
        ("a  {{- 1 -}}  \n b", "a1b"),
        ("a {{- /* c */ -}} b", "ab"),
        ("a {{/* c */}} b", "a  b"),
        ("{{ .Values.s\n}}", "str"),
    ]);
}

#[test]
fn ranges_over_lists_maps_and_integers() {
    check(&[
        ("{{ range $i := 3 }}{{ $i }}{{ end }}", "012"),
        ("{{ range 0 }}x{{ else }}e{{ end }}", "e"),
        (
            "{{ range $i, $v := .Values.l }}{{ $i }}={{ $v }},{{ end }}",
            "0=a,1=1,2=2.5,3=,",
        ),
        (
            "{{ range $k, $v := .Values.mm }}{{ $k }}:{{ $v.b }}{{ end }}",
            "a:1",
        ),
        (
            "{{ range .Values.l }}{{ if eq (printf \"%v\" .) \"a\" }}{{ continue }}{{ end }}{{ . }}{{ break }}{{ end }}",
            "1",
        ),
        (
            "{{ range .Values.missing }}x{{ else }}none{{ end }}",
            "none",
        ),
    ]);
}

#[test]
fn scopes_variables_like_go() {
    check(&[
        (
            "{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}",
            "2",
        ),
        (
            "{{ $x := 1 }}{{ if true }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}",
            "21",
        ),
        (
            "{{ $n := 0 }}{{ range .Values.l }}{{ $n = . }}{{ end }}{{ $n }}",
            "",
        ),
        (
            "{{ with .Values.s }}{{ . }}{{ else }}no{{ end }}|{{ with .Values.missing }}x{{ else with .Values.num }}{{ . }}{{ end }}",
            "str|3",
        ),
        (
            "{{ if .Values.missing }}a{{ else if .Values.s }}b{{ else }}c{{ end }}",
            "b",
        ),
    ]);
}

#[test]
fn defines_templates_and_blocks() {
    check(&[
        (
            r#"{{ define "x" }}[{{ . }}]{{ end }}{{ template "x" 1 }}{{ block "y" 2 }}<{{ . }}>{{ end }}"#,
            "[1]<2>",
        ),
        (
            r#"{{ define "x" }}{{ .nope }}{{ end }}[{{ include "x" . | quote }}][{{ .Values.missing | quote }}][{{ printf "%v" .Values.missing }}]"#,
            r#"[""][][<nil>]"#,
        ),
        (
            r#"{{ define "x" }}{{ .nope }}{{ end }}[{{ include "x" . | len }}][{{ tpl "{{ .nope }}" . | len }}]"#,
            "[10][0]",
        ),
        (
            r#"{{ tpl "{{ define \"d\" }}D{{ end }}{{ include \"d\" . }}{{ .Values.s }}" . }}"#,
            "Dstr",
        ),
        (
            r#"{{ define "a" }}{{ end }}{{ define "a" }}x{{ end }}{{ template "a" }}"#,
            "x",
        ),
    ]);
    // A later file's define replaces an earlier one.
    let out = render_with(
        &[
            ("t/templates/_a.tpl", r#"{{ define "x" }}first{{ end }}"#),
            ("t/templates/_b.tpl", r#"{{ define "x" }}second{{ end }}"#),
            (NAME, r#"{{ include "x" . }}"#),
        ],
        &Budget::default(),
    );
    assert_eq!(out.as_deref(), Ok("second"));
}

#[test]
fn reports_execution_errors_as_go_does() {
    let exec = |p: &str, m: &str| format!("ERR template: {NAME}:{p}: executing \"{NAME}\" at {m}");
    check(&[
        (
            "{{ eq .Values.num 3 }}",
            &exec(
                "1:3",
                "<eq .Values.num 3>: error calling eq: incompatible types for comparison: float64 and int",
            ),
        ),
        (
            "{{ .Values.missing.foo }}",
            &exec(
                "1:10",
                "<.Values.missing.foo>: nil pointer evaluating interface {}.foo",
            ),
        ),
        (
            "{{ .Values.s.foo }}",
            &exec(
                "1:10",
                "<.Values.s.foo>: can't evaluate field foo in type interface {}",
            ),
        ),
        (
            "{{ upper .Values.missing }}",
            &exec(
                "1:16",
                "<.Values.missing>: wrong type for value; expected string; got interface {}",
            ),
        ),
        (
            "{{ upper .Values.num }}",
            &exec(
                "1:16",
                "<.Values.num>: wrong type for value; expected string; got float64",
            ),
        ),
        (
            "{{ upper 3 }}",
            &exec("1:9", "<3>: expected string; found 3"),
        ),
        (
            "{{ $x := .Values.missing }}{{ upper $x }}",
            &exec("1:36", "<$x>: invalid value; expected string"),
        ),
        (
            r#"{{ range "abc" }}{{ . }}{{ end }}"#,
            &exec("1:9", r#"<"abc">: range can't iterate over abc"#),
        ),
        (
            "{{ range $i, $v := 3 }}{{ end }}",
            &exec(
                "1:19",
                "<3>: can't use 3 to iterate over more than one variable",
            ),
        ),
        (
            "{{ not }}",
            &exec("1:3", "<not>: wrong number of args for not: want 1 got 0"),
        ),
        (
            "{{ len 3 }}",
            &exec("1:3", "<len 3>: error calling len: len of type int"),
        ),
        (
            "{{ index .Values.l 5 }}",
            &exec(
                "1:3",
                "<index .Values.l 5>: error calling index: index out of range: 5",
            ),
        ),
        (
            "{{ lt .Values.missing 1 }}",
            &exec(
                "1:3",
                "<lt .Values.missing 1>: error calling lt: invalid type for comparison",
            ),
        ),
        (
            "{{ call .Values.s }}",
            &exec(
                "1:3",
                "<call .Values.s>: error calling call: non-function .Values.s of type string",
            ),
        ),
        (
            r#"{{ "a" | .Values.s }}"#,
            &exec("1:16", "<.Values.s>: s is not a method but has arguments"),
        ),
        (
            r#"{{ template "zz" }}"#,
            &exec("1:12", r#"<{{template "zz"}}>: template "zz" not defined"#),
        ),
        (
            r#"{{ include "zz" . }}"#,
            &exec(
                "1:3",
                r#"<include "zz" .>: error calling include: template: no template "zz" associated with template "gotpl""#,
            ),
        ),
    ]);
    check(&[(
        "{{ eq .Values.missing .Values.m2 }}|{{ eq .Values.missing \"x\" }}|{{ eq nil nil }}|{{ and 1 0 2 }}|{{ or 0 \"\" 5 }}",
        "true|false|true|0|5",
    )]);
}

#[test]
fn reports_parse_errors_as_go_does() {
    let parse = |m: &str| format!("ERR template: {NAME}:1: {m}");
    check(&[
        ("{{ if }}{{ end }}", &parse("missing value for if")),
        ("{{ .a } }}", &parse(r#"unexpected "}" in operand"#)),
        ("{{ $x }}", &parse(r#"undefined variable "$x""#)),
        ("{{ foo }}", &parse(r#"function "foo" not defined"#)),
        ("{{ if 1 }}", &parse("unexpected EOF")),
        ("{{ end }}", &parse("unexpected {{end}}")),
        ("{{ 0x1G }}", &parse(r#"bad number syntax: "0x1G""#)),
        (
            "{{ 3 | 4 }}",
            &parse("non executable command in pipeline stage 2"),
        ),
        (r#"{{ "\q" }}"#, &parse("invalid syntax")),
        ("{{ (1 }}", &parse("unclosed left paren")),
        ("{{ 1) }}", &parse("unexpected right paren")),
        (
            "{{ range $i, $v, $w := . }}{{end}}",
            &parse("too many declarations in range"),
        ),
        ("{{ break }}", &parse("{{break}} outside {{range}}")),
        (
            r#"{{ define "a" }}x{{ end }}{{ define "a" }}y{{ end }}"#,
            &parse(r#"template: multiple definition of template "a""#),
        ),
    ]);
}

#[test]
fn rewords_errors_as_helm_does() {
    let funcs = test_funcs();
    let mut set = TemplateSet::new();
    set.parse(NAME, "{{ .Values.missing.foo }}", &funcs)
        .expect("parses");
    let err = set
        .execute(NAME, &values(), &funcs, &mut TestHost, &Budget::default())
        .expect_err("fails");
    assert_eq!(
        err.helm_message(),
        "t/templates/a.yaml:1:10\n  executing \"t/templates/a.yaml\" at <.Values.missing.foo>:\n    nil pointer evaluating interface {}.foo"
    );
    set.parse(NAME, r#"{{ include "zz" . }}"#, &funcs)
        .expect("parses");
    let err = set
        .execute(NAME, &values(), &funcs, &mut TestHost, &Budget::default())
        .expect_err("fails");
    assert_eq!(
        err.helm_message(),
        "t/templates/a.yaml:1:3\n  executing \"t/templates/a.yaml\" at <include \"zz\" .>:\n    error calling include:\ntemplate: no template \"zz\" associated with template \"gotpl\""
    );
    let parse_err = set.parse(NAME, "{{ if }}", &funcs).expect_err("fails");
    assert_eq!(
        parse_err.helm_message(),
        "parse error at (t/templates/a.yaml:1): missing value for if"
    );
}

#[test]
fn budgets_stop_hostile_templates() {
    let small = Budget {
        fuel: 100_000,
        ..Budget::default()
    };
    let err = render_with(&[(NAME, "{{ range 1000000000000 }}{{ end }}")], &small)
        .expect_err("runs out of fuel");
    assert!(err.contains("out of fuel"), "{err}");

    let err = render_with(
        &[(
            NAME,
            r#"{{ define "r" }}{{ include "r" . }}{{ end }}{{ include "r" . }}"#,
        )],
        &Budget::default(),
    )
    .expect_err("recursion ends");
    assert!(
        err.contains("exceeded maximum template depth (100)"),
        "{err}"
    );

    let tiny = Budget {
        max_output: 10,
        ..Budget::default()
    };
    let err = render_with(&[(NAME, "{{ range 100 }}abc{{ end }}")], &tiny).expect_err("too big");
    assert!(err.contains("output too large"), "{err}");
}

#[test]
fn infinite_recursion_fits_a_small_stack() {
    let handle = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            render_with(
                &[(NAME, r#"{{ define "r" }}{{ if true }}{{ with . }}{{ template "r" (print .) }}{{ end }}{{ end }}{{ end }}{{ template "r" 1 }}"#)],
                &Budget::default(),
            )
        })
        .expect("thread starts");
    let result = handle.join().expect("no stack overflow");
    assert!(result.is_err_and(|e| e.contains("exceeded maximum")));
}

#[test]
fn sets_are_shared_between_threads() {
    fn check<T: Send + Sync>() {}
    check::<TemplateSet>();
    check::<Funcs>();
}
