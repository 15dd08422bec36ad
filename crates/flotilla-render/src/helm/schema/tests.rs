//! Schemas checked as Helm v4 checks them: every expected report was produced by
//! Helm v4 (helm-python-sdk 0.2.2) with the same schema and values.

use std::collections::BTreeMap;

use crate::helm::chart::Chart;
use crate::helm::values::plan;
use crate::helm::yaml::from_yaml_map;

use super::validate_plan;

const SCHEMA: &str = r##"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","required":["name"],
 "properties":{"replicas":{"type":"integer","minimum":1},"name":{"type":"string","minLength":2,"pattern":"^[a-z]+$"},
 "mode":{"enum":["a","b"]},"tags":{"type":"array","items":{"type":"string"}},"port":{"type":["integer","string"]},
 "obj":{"type":"object","additionalProperties":false,"properties":{"x":{"$ref":"#/definitions/x"}}}},
 "definitions":{"x":{"type":"boolean"}}}"##;

fn check(values: &str) -> Result<(), String> {
    let files: BTreeMap<String, Vec<u8>> = [
        ("Chart.yaml", "apiVersion: v2\nname: t\nversion: 0.1.0\n"),
        ("values.schema.json", SCHEMA),
        ("templates/a.yaml", "x: 1\n"),
        (
            "charts/sub/Chart.yaml",
            "apiVersion: v2\nname: sub\nversion: 0.1.0\n",
        ),
        (
            "charts/sub/values.schema.json",
            r#"{"type":"object","properties":{"num":{"type":"integer"}}}"#,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
    .collect();
    let chart = Chart::from_files(files).expect("chart");
    let planned = plan(&chart, from_yaml_map(values).expect("values")).expect("plan");
    validate_plan(&planned)
}

const HEAD: &str =
    "values don't meet the specifications of the schema(s) in the following chart(s):\n";

#[test]
fn valid_values_pass() {
    assert_eq!(check("name: ab\nreplicas: 2\nport: http\n"), Ok(()));
}

#[test]
fn failures_are_reported_as_helm_reports_them() {
    let cases = [
        ("{}", "t:\n- at '': missing property 'name'\n"),
        (
            "name: ab\nreplicas: 0\n",
            "t:\n- at '/replicas': minimum: got 0, want 1\n",
        ),
        (
            "name: A\n",
            "t:\n- at '/name': minLength: got 1, want 2\n- at '/name': 'A' does not match pattern '^[a-z]+$'\n",
        ),
        (
            "name: ab\nmode: c\n",
            "t:\n- at '/mode': value must be one of 'a', 'b'\n",
        ),
        (
            "name: ab\ntags: [1]\n",
            "t:\n- at '/tags/0': got number, want string\n",
        ),
        (
            "name: ab\nobj: {x: 1, w: 2}\n",
            "t:\n- at '/obj/x': got number, want boolean\n- at '/obj': additional properties 'w' not allowed\n",
        ),
        (
            "name: ab\nmode: c\nobj: {x: 1, w: 2}\n",
            "t:\n- at '/mode': value must be one of 'a', 'b'\n- at '/obj': validation failed\n  - at '/obj/x': got number, want boolean\n  - at '/obj': additional properties 'w' not allowed\n",
        ),
        (
            "name: ab\nsub: {num: s}\n",
            "sub:\n- at '/num': got string, want integer\n",
        ),
    ];
    for (values, want) in cases {
        assert_eq!(
            check(values),
            Err(format!("{HEAD}{want}")),
            "values {values:?}"
        );
    }
}
