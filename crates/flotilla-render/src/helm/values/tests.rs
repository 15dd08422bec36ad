//! Expected values and warnings checked against Helm v4's engine.

use std::collections::BTreeMap;

use super::*;
use crate::helm::yaml::{from_yaml_map, to_yaml};

fn chart(files: &[(&str, &str)]) -> Chart {
    Chart::from_files(
        files
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect(),
    )
    .expect("loads")
}

fn values(text: &str) -> BTreeMap<String, Value> {
    from_yaml_map(text).expect("parses")
}

fn family() -> Chart {
    chart(&[
        (
            "Chart.yaml",
            "apiVersion: v2\nname: top\nversion: 1.0.0\ndependencies:\n- name: db\n  version: 1.x\n  condition: db.enabled\n- name: cache\n  version: ~1.0.0\n  alias: redis\n  tags: [extras]\n- name: lib\n  version: '>= 1.0.0, < 2'\n  import-values:\n  - data\n  - child: exported.port\n    parent: libPort\n",
        ),
        (
            "values.yaml",
            "global: {region: eu, nested: {a: 1}}\ndb: {enabled: true}\nkeep: {x: 1, y: 2}\ntable: {a: 1}\n",
        ),
        ("templates/a.yaml", ""),
        ("templates/_helpers.tpl", ""),
        ("templates/NOTES.txt", ""),
        (
            "charts/db/Chart.yaml",
            "apiVersion: v2\nname: db\nversion: 1.0.0\n",
        ),
        (
            "charts/db/values.yaml",
            "enabled: true\nglobal: {region: us, nested: {b: 2}}\nport: 5432\n",
        ),
        ("charts/db/templates/s.yaml", ""),
        ("charts/db/crds/c.yaml", "kind: CustomResourceDefinition"),
        (
            "charts/cache/Chart.yaml",
            "apiVersion: v2\nname: cache\nversion: 1.0.0\n",
        ),
        ("charts/cache/templates/c.yaml", ""),
        (
            "charts/lib/Chart.yaml",
            "apiVersion: v2\nname: lib\nversion: 1.0.0\ntype: library\n",
        ),
        (
            "charts/lib/values.yaml",
            "exports: {data: {fromLib: yes}}\nexported: {port: 80}\n",
        ),
        ("charts/lib/templates/_lib.tpl", ""),
    ])
}

fn rendered(plan: &RenderPlan) -> Vec<&str> {
    plan.templates
        .iter()
        .filter(|t| t.rendered)
        .map(|t| t.name.as_str())
        .collect()
}

#[test]
fn dependencies_are_enabled_by_condition_and_tags() {
    let chart = family();
    let planned = plan(&chart, BTreeMap::new()).expect("plans");
    assert_eq!(
        rendered(&planned),
        [
            "top/charts/db/templates/s.yaml",
            "top/charts/redis/templates/c.yaml",
            "top/templates/NOTES.txt",
            "top/templates/a.yaml"
        ]
    );
    assert_eq!(
        planned
            .crds
            .iter()
            .map(|c| c.0.as_str())
            .collect::<Vec<_>>(),
        ["top/charts/db/crds/c.yaml"]
    );
    assert_eq!(planned.templates.len(), 6);
    let planned = plan(
        &chart,
        values("db: {enabled: false}\ntags: {extras: false}"),
    )
    .expect("plans");
    assert_eq!(
        rendered(&planned),
        ["top/templates/NOTES.txt", "top/templates/a.yaml"]
    );
}

#[test]
fn values_coalesce_with_globals_nulls_and_imports() {
    let chart = family();
    let mut warnings = Vec::new();
    let planned =
        plan(&chart, values("keep: {x: null}\ntable: 5\ndb: {port: 1}\n")).expect("plans");
    warnings.extend(planned.warnings.clone());
    let top = to_yaml(&planned.charts[0].values).expect("writes");
    assert_eq!(
        top,
        "db:\n  enabled: true\n  global:\n    nested:\n      a: 1\n      b: 2\n    region: eu\n  port: 1\nfromLib: true\nglobal:\n  nested:\n    a: 1\n  region: eu\nkeep:\n  \"true\": 2\nlib:\n  exported:\n    port: 80\n  exports:\n    data:\n      fromLib: true\n  global:\n    nested:\n      a: 1\n    region: eu\nlibPort: 80\nredis:\n  global:\n    nested:\n      a: 1\n    region: eu\ntable: 5"
    );
    let db = &planned.charts[1];
    assert_eq!(db.path, "top/charts/db");
    assert_eq!(
        to_yaml(&db.values).expect("writes"),
        "enabled: true\nglobal:\n  nested:\n    a: 1\n    b: 2\n  region: eu\nport: 1"
    );
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn a_table_over_a_scalar_warns_as_helm_does() {
    let mut warnings = Vec::new();
    let merged = coalesce_tables(
        values("a: {b: 1}"),
        values("a: {b: {c: 1}}"),
        "",
        &mut warnings,
    );
    assert_eq!(to_yaml(&Value::map(merged)).expect("writes"), "a:\n  b: 1");
    let merged = coalesce_tables(
        values("a: {b: {c: 1}}"),
        values("a: {b: 2}"),
        "",
        &mut warnings,
    );
    assert_eq!(
        to_yaml(&Value::map(merged)).expect("writes"),
        "a:\n  b:\n    c: 1"
    );
    assert_eq!(
        warnings,
        [
            "warning: cannot overwrite table with non table for a.b (map[c:1])",
            "warning: destination for a.b is a table. Ignoring non-table value (2)"
        ]
    );
}

#[test]
fn version_ranges_match_as_helm_matches_them() {
    assert!(version_in_range("2.x.x", "2.31.10"));
    assert!(!version_in_range("7.x.x", "8.0.0"));
    assert!(version_in_range("^1.2", "1.9.0"));
    assert!(!version_in_range("~1.2.3", "1.3.0"));
    assert!(version_in_range(">= 1.0.0, < 2", "1.5.0"));
    assert!(version_in_range("1.0.0 || 2.x", "2.1.0"));
    assert!(!version_in_range("", "1.0.0"));
}
