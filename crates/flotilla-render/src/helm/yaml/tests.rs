//! Expected texts were checked against Helm v4's engine (`toYaml`, `fromYaml` printed
//! with `printf "%T %v"`).

use std::collections::BTreeMap;

use super::*;
use crate::helm::gotmpl::Value;

fn s(text: &str) -> Value {
    Value::string(text)
}

fn map(entries: &[(&str, Value)]) -> Value {
    Value::map(
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

#[test]
fn strings_are_quoted_as_go_yaml_quotes_them() {
    let cases = [
        ("1", "\"1\""),
        ("true", "\"true\""),
        ("yes", "\"yes\""),
        ("~", "\"~\""),
        ("", "\"\""),
        ("a: b", "'a: b'"),
        ("#x", "'#x'"),
        (" lead", "' lead'"),
        ("ü", "ü"),
        ("line1\nline2", "|-\n  line1\n  line2"),
        ("line1\nline2\n", "|\n  line1\n  line2"),
        ("2001-12-14", "\"2001-12-14\""),
        ("12:30", "\"12:30\""),
        ("0x1F", "\"0x1F\""),
        ("1e3", "\"1e3\""),
        ("<<", "<<"),
        ("=", "="),
        ("-", "'-'"),
        ("a#b", "a#b"),
        ("?a", "?a"),
        ("a ", "'a '"),
        ("\ta", "\"\\ta\""),
        ("'s'", "'''s'''"),
        ("\n", "|2+\n"),
        ("trailing \nx", "\"trailing \\nx\""),
        (" lead\nx", "|2-\n   lead\n  x"),
        ("a\r\nb", "\"a\\r\\nb\""),
        ("\u{1}", "\"\\x01\""),
        ("\u{1F600}", "\"\\U0001F600\""),
        ("\u{FEFF}ab", "\"\\uFEFF\\x61\\x62\""),
        ("1.2.3", "1.2.3"),
        ("08", "\"08\""),
        ("---", "'---'"),
        ("yes please", "yes please"),
    ];
    for (input, expected) in cases {
        assert_eq!(to_yaml(&s(input)).expect("writes"), expected, "{input:?}");
    }
}

#[test]
fn long_lines_fold_at_eighty_columns() {
    let words = vec!["word"; 30].join(" ");
    assert_eq!(
        to_yaml(&Value::list(vec![s(&words)])).expect("writes"),
        "- word word word word word word word word word word word word word word word word\n  word word word word word word word word word word word word word word"
    );
    let tabbed = format!("\t{}", vec!["w"; 50].join(" "));
    assert_eq!(
        to_yaml(&s(&tabbed)).expect("writes"),
        "\"\\tw w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w\n  w w w w w w w w w w\""
    );
    let long_key = "x".repeat(130);
    assert_eq!(
        to_yaml(&map(&[
            (&long_key, Value::Float(1.0)),
            ("a\nb", Value::Float(2.0))
        ]))
        .expect("writes"),
        format!("? |-\n  a\n  b\n: 2\n? {long_key}\n: 1")
    );
}

#[test]
fn numbers_go_through_json() {
    let numbers = [
        1e20,
        1.5e20,
        12345678901234567890.0,
        1e-7,
        0.000001,
        123456789.123,
        -0.0,
        3.0,
        0.5,
        1e21,
    ];
    let list = Value::list(numbers.iter().map(|f| Value::Float(*f)).collect());
    assert_eq!(
        to_yaml(&list).expect("writes"),
        "- 1e+20\n- 1.5e+20\n- 12345678901234567000\n- 1e-07\n- 1e-06\n- 1.23456789123e+08\n- 0\n- 3\n- 0.5\n- 1e+21"
    );
    assert!(to_yaml(&Value::Float(f64::NAN)).is_err());
}

#[test]
fn collections_keys_and_empties() {
    let keys = [
        "a10", "a9", "a_", "aB", "a0", "a00", "a01", "Z", "b", "1", "10", "2", "-x", "", "é", "n",
    ];
    let value = Value::map(
        keys.iter()
            .enumerate()
            .map(|(i, k)| (k.to_string(), Value::Int(i as i64)))
            .collect(),
    );
    assert_eq!(
        to_yaml(&value).expect("writes"),
        "\"\": 13\n-x: 12\n\"1\": 9\n\"2\": 11\n\"10\": 10\nZ: 7\na_: 2\na0: 4\na00: 5\na01: 6\na9: 1\na10: 0\naB: 3\nb: 8\n\"n\": 15\né: 14"
    );
    let nested = map(&[
        ("o", Value::Nil),
        ("p", Value::list(vec![])),
        ("q", Value::map(BTreeMap::new())),
        (
            "r",
            Value::list(vec![
                Value::Float(1.0),
                Value::list(vec![Value::Float(2.0), Value::Float(3.0)]),
                map(&[("a", Value::Float(1.0)), ("b", Value::Bool(true))]),
            ]),
        ),
        ("s", map(&[("t", Value::list(vec![s("x")]))])),
        ("u", Value::Bytes(b"hi!?".to_vec().into())),
    ]);
    assert_eq!(
        marshal(&nested).expect("writes"),
        "o: null\np: []\nq: {}\nr:\n- 1\n- - 2\n  - 3\n- a: 1\n  b: true\ns:\n  t:\n  - x\nu: aGkhPw==\n"
    );
    assert_eq!(
        marshal(&Value::map(BTreeMap::new())).expect("writes"),
        "{}\n"
    );
    assert_eq!(to_yaml(&s("a\nb\n\n")).expect("writes"), "|+\n  a\n  b\n");
}

fn printed(value: &Value) -> String {
    match value {
        Value::Float(f) => format!("float64 {f}"),
        Value::String(t) => format!("string {t}"),
        Value::Bool(b) => format!("bool {b}"),
        Value::Map(m) => format!("map {:?}", m.keys()),
        other => format!("{other:?}"),
    }
}

#[test]
fn values_read_as_helm_reads_them() {
    let text = "b: &a {x: 1, y: 2}\nc:\n  x: 0\n  <<: *a\n  y: 3\nd:\n  <<: [{p: 1}, {p: 2, q: 2}]\ne: yes\nyes: 1\nf: 0755\ng: 2001-12-14\nh: 1_000\ni: 0x1F\nj: 1e3\nl: .5\nm: 1.0\nn: ~\no: 08\n1: a\n1.5: b\nz: 1\nz: 2\np: 0o17\nq: 0b11\nr: 1:30\ns: +1\nu: =\nv: !!str 12\nw: !!binary aGk=\nx: 2001-12-14T21:59:43.10-05:00\nno: off\naa: 1e400\n3.14159265358979323: c\n";
    let values = from_yaml_map(text).expect("reads");
    let shown: Vec<String> = values
        .iter()
        .map(|(k, v)| format!("{k}={}", printed(v)))
        .collect();
    assert_eq!(
        shown,
        [
            "1=string a",
            "1.5=string b",
            "3.1415927=string c",
            "aa=string 1e400",
            "b=map [\"true\", \"x\"]",
            "c=map [\"true\", \"x\"]",
            "d=map [\"p\", \"q\"]",
            "e=bool true",
            "f=float64 493",
            "false=bool false",
            "g=string 2001-12-14",
            "h=float64 1000",
            "i=float64 31",
            "j=float64 1000",
            "l=float64 0.5",
            "m=float64 1",
            "o=float64 8",
            "p=float64 15",
            "q=float64 3",
            "r=string 1:30",
            "s=float64 1",
            "true=float64 1",
            "u=string =",
            "v=string 12",
            "w=string hi",
            "x=string 2001-12-14T21:59:43.10-05:00",
            "z=float64 2",
        ]
    );
    let Value::Map(c) = &values["c"] else {
        panic!("c is a map")
    };
    assert_eq!(printed(&c.get("x").expect("key")), "float64 1");
    assert_eq!(printed(&c.get("true").expect("key")), "float64 3");
    let Value::Map(d) = &values["d"] else {
        panic!("d is a map")
    };
    assert_eq!(printed(&d.get("p").expect("key")), "float64 1");
}

#[test]
fn read_errors_are_worded_as_go_words_them() {
    let err = |text: &str| from_yaml_map(text).expect_err("fails").message;
    assert_eq!(
        err("a: .inf"),
        "error converting YAML to JSON: json: unsupported value: +Inf"
    );
    assert_eq!(
        err("- 1"),
        "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal array into Go value of type map[string]interface {}"
    );
    assert_eq!(
        err("a: !!int x"),
        "error converting YAML to JSON: yaml: cannot decode !!str `x` as a !!int"
    );
    assert_eq!(
        err("~: 1"),
        "error converting YAML to JSON: unsupported map key of type: %!s(<nil>), key: <nil>, value: 1"
    );
    assert!(err("a: [").starts_with("error converting YAML to JSON: yaml: line 1"));
    assert!(from_yaml_map("").expect("reads").is_empty());
    assert_eq!(from_yaml_map("a: 1\n---\nb: 2").expect("reads").len(), 1);
    assert_eq!(from_yaml_array("- 1\n- a").expect("reads").len(), 2);
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n";
    assert!(err(bomb).contains("excessive aliasing"));
}

#[test]
fn manifests_split_and_read_as_kubernetes_reads_them() {
    let text = "\n---\n# only a comment\n---# rbac\napiVersion: v1\nkind: A\n---\n\n--- \nb: =\nc: 1.0\nd: 1.5\ne: yes\n";
    let parts = split_manifests(text);
    assert_eq!(
        parts,
        [
            "# only a comment\n",
            "# rbac\napiVersion: v1\nkind: A\n",
            "b: =\nc: 1.0\nd: 1.5\ne: yes\n"
        ]
    );
    assert_eq!(parse_manifest(&parts[0]).expect("reads"), None);
    assert_eq!(
        parse_manifest(&parts[2]).expect("reads"),
        Some(serde_json::json!({"b": "=", "c": 1, "d": 1.5, "e": true}))
    );
}
