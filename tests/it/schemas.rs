//! The JSON Schemas under `schemas/`: they match what the Rust types generate, they
//! are useful to an editor (constant apiVersion and kind, descriptions, no unknown
//! properties), every fleet-example file names the right one in its
//! `yaml-language-server` modeline and validates against it, and documents the
//! renderer refuses are refused by the schemas too.
//!
//! Validation uses a small draft-07 validator below that knows exactly the keywords
//! flotilla's schemas use and panics on any other, so a new keyword cannot be
//! silently ignored. (The `jsonschema` crate would do, but it more than doubles the
//! test build time.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn checked_in(name: &str) -> Value {
    let path = Path::new(ROOT).join("schemas").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| {
        panic!(
            "cannot read {}: {err}; run `cargo run -- schemas --out schemas` and commit the result",
            path.display()
        )
    });
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{} is not valid JSON: {err}", path.display()))
}

fn schema_for(kind: &str) -> Value {
    checked_in(&format!("{}.json", kind.to_lowercase()))
}

#[test]
fn checked_in_schemas_match_the_rust_types() {
    let generated = flotilla_core::model::schemas();
    let mut stale = Vec::new();
    for (name, schema) in &generated {
        if checked_in(name) != *schema {
            stale.push(format!("schemas/{name}"));
        }
    }
    assert!(
        stale.is_empty(),
        "{} out of date with the types in src/model: run `cargo run -- schemas --out schemas` and commit the result",
        stale.join(", ")
    );
    let expected: BTreeSet<String> = generated.iter().map(|(n, _)| n.to_string()).collect();
    let present: BTreeSet<String> = std::fs::read_dir(Path::new(ROOT).join("schemas"))
        .expect("schemas/ exists")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        present, expected,
        "schemas/ holds files the types do not generate; remove them"
    );
}

#[test]
fn schemas_are_useful_to_an_editor() {
    for kind in ["Cluster", "Group", "Workload", "Overlay", "RolloutPolicy"] {
        let schema = schema_for(kind);
        assert_eq!(
            schema["$schema"], "http://json-schema.org/draft-07/schema#",
            "{kind}: yaml-language-server fully supports draft-07"
        );
        assert_eq!(schema["title"], kind);
        assert_eq!(
            schema["$id"],
            format!(
                "https://flotilla.dev/schemas/v1alpha1/{}.json",
                kind.to_lowercase()
            ),
            "{kind}: editors and catalogues tell schemas apart by $id"
        );
        assert_eq!(
            schema["properties"]["apiVersion"]["const"],
            "flotilla.dev/v1alpha1"
        );
        assert_eq!(schema["properties"]["kind"]["const"], kind);
        let mut objects = vec![("(root)".to_string(), &schema)];
        if let Some(definitions) = schema["definitions"].as_object() {
            objects.extend(definitions.iter().map(|(name, s)| (name.clone(), s)));
        }
        for (name, object) in objects {
            let Some(properties) = object.get("properties").and_then(Value::as_object) else {
                continue;
            };
            assert_eq!(
                object["additionalProperties"],
                Value::Bool(false),
                "{kind} {name}: unknown fields are errors, so the schema must say so"
            );
            for (property, property_schema) in properties {
                assert!(
                    described(&schema, property_schema),
                    "{kind} {name}.{property} has no description; add a doc comment in src/model"
                );
            }
        }
    }
}

/// Whether a property's schema, or the definition it refers to, has a description.
fn described(root: &Value, schema: &Value) -> bool {
    if schema.get("description").is_some() {
        return true;
    }
    let reference = schema
        .get("$ref")
        .or_else(|| schema.get("allOf").and_then(|all| all.get(0)?.get("$ref")));
    reference
        .and_then(Value::as_str)
        .and_then(|r| resolve(root, r).get("description"))
        .is_some()
}

/// Each fleet file's first line: `# yaml-language-server: $schema=<relative path>`.
fn modeline_schema(file: &Path, text: &str) -> PathBuf {
    let first = text.lines().next().unwrap_or("");
    let relative = first
        .strip_prefix("# yaml-language-server: $schema=")
        .unwrap_or_else(|| {
            panic!(
                "{}: the first line must be a yaml-language-server schema modeline",
                file.display()
            )
        });
    let path = file.parent().expect("a file has a folder").join(relative);
    path.canonicalize().unwrap_or_else(|err| {
        panic!(
            "{}: the modeline names {relative}, which does not exist: {err}",
            file.display()
        )
    })
}

fn fleet_files(root: &Path) -> Vec<(PathBuf, &'static str)> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable folder") {
            let path = entry.expect("readable entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let parts: Vec<&str> = relative.split('/').collect();
            let kind = match parts.as_slice() {
                ["clusters", f] if f.ends_with(".yaml") => "Cluster",
                ["groups", f] if f.ends_with(".yaml") => "Group",
                ["workloads", _, "workload.yaml"] => "Workload",
                ["overlays", .., f] if f.ends_with(".yaml") => "Overlay",
                ["rollouts", f] if f.ends_with(".yaml") => "RolloutPolicy",
                _ => continue,
            };
            files.push((path, kind));
        }
    }
    files.sort();
    files
}

#[test]
fn every_fleet_example_file_names_its_schema_and_validates() {
    let root = Path::new(ROOT).join("fleet-example");
    let files = fleet_files(&root);
    assert!(
        files.len() >= 30,
        "expected the whole fleet-example, found {} files",
        files.len()
    );
    let mut kinds = BTreeSet::new();
    for (file, kind) in files {
        kinds.insert(kind);
        let text = std::fs::read_to_string(&file).expect("readable file");
        let schema_path = modeline_schema(&file, &text);
        let expected = Path::new(ROOT)
            .join("schemas")
            .join(format!("{}.json", kind.to_lowercase()))
            .canonicalize()
            .expect("schema exists");
        assert_eq!(
            schema_path,
            expected,
            "{}: the modeline names the wrong schema",
            file.display()
        );
        let document: Value =
            serde_saphyr::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        let errors = validate(&schema_for(kind), &document);
        assert!(
            errors.is_empty(),
            "{} does not validate against its schema:\n{}",
            file.display(),
            errors.join("\n")
        );
    }
    assert_eq!(kinds.len(), 5, "every kind is exercised");
}

/// Documents the renderer refuses; the schema must refuse them too, so an editor
/// shows the mistake before a render does.
#[test]
fn schemas_refuse_what_the_renderer_refuses() {
    let header = |kind: &str, name: &str| {
        format!("apiVersion: flotilla.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\n")
    };
    let cases: Vec<(&str, &str, String)> = vec![
        (
            "misspelt metadata field",
            "clusters/a.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: a\n  lables: {x: y}\n".into(),
        ),
        (
            "wrong kind",
            "clusters/a.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Group\nmetadata:\n  name: a\n".into(),
        ),
        (
            "wrong apiVersion",
            "clusters/a.yaml",
            "apiVersion: flotilla.dev/v1\nkind: Cluster\nmetadata:\n  name: a\n".into(),
        ),
        (
            "missing metadata.name",
            "clusters/a.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  labels: {x: y}\n"
                .into(),
        ),
        (
            "label value that is not a string",
            "clusters/a.yaml",
            format!("{}  labels:\n    tier: [a, b]\n", header("Cluster", "a")),
        ),
        (
            "In without values",
            "groups/g.yaml",
            format!(
                "{}spec:\n  selector:\n    matchExpressions:\n      - {{key: tier, operator: In}}\n",
                header("Group", "g")
            ),
        ),
        (
            "Exists with values",
            "groups/g.yaml",
            format!(
                "{}spec:\n  selector:\n    matchExpressions:\n      - {{key: tier, operator: Exists, values: [a]}}\n",
                header("Group", "g")
            ),
        ),
        (
            "unknown operator",
            "groups/g.yaml",
            format!(
                "{}spec:\n  selector:\n    matchExpressions:\n      - {{key: tier, operator: Equals, values: [a]}}\n",
                header("Group", "g")
            ),
        ),
        (
            "group without a selector",
            "groups/g.yaml",
            format!("{}spec: {{}}\n", header("Group", "g")),
        ),
        (
            "target with two kinds of entry",
            "workloads/w/workload.yaml",
            format!(
                "{}spec:\n  targets:\n    - {{group: g, cluster: a}}\n",
                header("Workload", "w")
            ),
        ),
        (
            "empty target",
            "workloads/w/workload.yaml",
            format!("{}spec:\n  targets:\n    - {{}}\n", header("Workload", "w")),
        ),
        (
            "overlay that selects nothing",
            "overlays/o.yaml",
            format!("{}spec:\n  labels: {{a: b}}\n", header("Overlay", "o")),
        ),
        (
            "overlay with an empty cluster list",
            "overlays/o.yaml",
            format!("{}spec:\n  clusters: []\n", header("Overlay", "o")),
        ),
        (
            "image override that changes nothing",
            "overlays/o.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  images:\n    - name: nginx\n",
                header("Overlay", "o")
            ),
        ),
        (
            "patch with both ops and merge",
            "overlays/o.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  patches:\n    - ops: []\n      merge: {{}}\n",
                header("Overlay", "o")
            ),
        ),
        (
            "patch with neither ops nor merge",
            "overlays/o.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  patches:\n    - target: {{kind: Deployment}}\n",
                header("Overlay", "o")
            ),
        ),
        (
            "misspelt patch target field",
            "overlays/o.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  patches:\n    - target: {{knd: Deployment}}\n      merge: {{}}\n",
                header("Overlay", "o")
            ),
        ),
        (
            "policy without waves",
            "rollouts/p.yaml",
            format!("{}spec:\n  clusterSelector: {{}}\n  waves: []\n", header("RolloutPolicy", "p")),
        ),
        (
            "percent outside 1-100",
            "rollouts/p.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  waves:\n    - {{name: a, percent: 120}}\n",
                header("RolloutPolicy", "p")
            ),
        ),
        (
            "percent with a selection",
            "rollouts/p.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  waves:\n    - {{name: a, percent: 10, clusterSelector: {{}}}}\n",
                header("RolloutPolicy", "p")
            ),
        ),
        (
            "maxFailed that is neither a count nor N%",
            "rollouts/p.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  waves:\n    - {{name: a, maxFailed: some}}\n",
                header("RolloutPolicy", "p")
            ),
        ),
        (
            "unknown offline policy",
            "rollouts/p.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  offline: ignore\n  waves:\n    - {{name: a}}\n",
                header("RolloutPolicy", "p")
            ),
        ),
        (
            "window time that is not HH:MM",
            "rollouts/p.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  waves:\n    - {{name: a}}\n  windows:\n    - {{start: \"2am\", end: \"05:00\"}}\n",
                header("RolloutPolicy", "p")
            ),
        ),
        (
            "misspelt wave field",
            "rollouts/p.yaml",
            format!(
                "{}spec:\n  clusterSelector: {{}}\n  waves:\n    - {{name: a, bak: 5m}}\n",
                header("RolloutPolicy", "p")
            ),
        ),
        (
            "paused that is not a boolean",
            "clusters/a.yaml",
            format!("{}spec:\n  paused: sometimes\n", header("Cluster", "a")),
        ),
    ];
    for (what, path, text) in &cases {
        let kind = match path.split('/').next() {
            Some("clusters") => "Cluster",
            Some("groups") => "Group",
            Some("workloads") => "Workload",
            Some("rollouts") => "RolloutPolicy",
            _ => "Overlay",
        };
        let document: Value =
            serde_saphyr::from_str(text).unwrap_or_else(|err| panic!("{what}: {err}"));
        assert!(
            !validate(&schema_for(kind), &document).is_empty(),
            "{what}: the {kind} schema accepts a document the renderer refuses:\n{text}"
        );
        let output = render(&FleetSnapshot::from_files([(*path, text.as_str())]));
        assert!(
            output.errors().any(|d| d.file.as_deref() == Some(*path)),
            "{what}: the renderer accepts it (diagnostics: {:?})",
            output.diagnostics
        );
    }
}

#[test]
fn the_validator_itself_catches_mistakes() {
    let schema = serde_json::json!({
        "type": "object",
        "required": ["a"],
        "additionalProperties": false,
        "properties": {"a": {"type": "integer"}, "b": {"enum": ["x"]}}
    });
    assert!(validate(&schema, &serde_json::json!({"a": 1})).is_empty());
    assert_eq!(validate(&schema, &serde_json::json!({"a": 1.5})).len(), 1);
    assert_eq!(validate(&schema, &serde_json::json!({"b": "x"})).len(), 1);
    assert_eq!(
        validate(&schema, &serde_json::json!({"a": 1, "c": 0})).len(),
        1
    );
    assert_eq!(
        validate(&schema, &serde_json::json!({"a": 1, "b": "y"})).len(),
        1
    );
    let bounded = serde_json::json!({
        "type": "object",
        "properties": {
            "n": {"minimum": 1, "maximum": 100},
            "t": {"pattern": "^[0-9]+%$"}
        },
        "not": {"required": ["x"]}
    });
    assert!(validate(&bounded, &serde_json::json!({"n": 5, "t": "5%"})).is_empty());
    assert_eq!(validate(&bounded, &serde_json::json!({"n": 0})).len(), 1);
    assert_eq!(validate(&bounded, &serde_json::json!({"n": 101})).len(), 1);
    assert_eq!(validate(&bounded, &serde_json::json!({"t": "5"})).len(), 1);
    assert_eq!(validate(&bounded, &serde_json::json!({"x": 1})).len(), 1);
}

// A small draft-07 validator for the keywords flotilla's schemas use.

fn validate(schema: &Value, instance: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(schema, schema, instance, "", &mut errors);
    errors
}

fn resolve<'a>(root: &'a Value, reference: &str) -> &'a Value {
    let name = reference
        .strip_prefix("#/definitions/")
        .unwrap_or_else(|| panic!("unsupported $ref {reference:?}"));
    root["definitions"]
        .get(name)
        .unwrap_or_else(|| panic!("$ref {reference:?} names no definition"))
}

fn type_matches(name: &str, instance: &Value) -> bool {
    match name {
        "object" => instance.is_object(),
        "array" => instance.is_array(),
        "string" => instance.is_string(),
        "boolean" => instance.is_boolean(),
        "null" => instance.is_null(),
        "number" => instance.is_number(),
        "integer" => instance.is_i64() || instance.is_u64(),
        other => panic!("unknown type {other:?}"),
    }
}

fn check(root: &Value, schema: &Value, instance: &Value, at: &str, errors: &mut Vec<String>) {
    let object = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            errors.push(format!("{at}: nothing is allowed here"));
            return;
        }
        Value::Object(object) => object,
        other => panic!("not a schema: {other}"),
    };
    for (keyword, value) in object {
        match keyword.as_str() {
            "$schema" | "$id" | "title" | "description" | "default" | "format" | "definitions" => {}
            "$ref" => check(
                root,
                resolve(root, value.as_str().expect("$ref is a string")),
                instance,
                at,
                errors,
            ),
            "type" => {
                let ok = match value {
                    Value::String(name) => type_matches(name, instance),
                    Value::Array(names) => names
                        .iter()
                        .any(|n| type_matches(n.as_str().expect("type name"), instance)),
                    other => panic!("bad type {other}"),
                };
                if !ok {
                    errors.push(format!("{at}: expected type {value}, found {instance}"));
                }
            }
            "const" => {
                if instance != value {
                    errors.push(format!("{at}: expected {value}, found {instance}"));
                }
            }
            "enum" => {
                if !value.as_array().expect("enum is a list").contains(instance) {
                    errors.push(format!("{at}: {instance} is not one of {value}"));
                }
            }
            "required" => {
                if let Some(map) = instance.as_object() {
                    for name in value.as_array().expect("required is a list") {
                        let name = name.as_str().expect("required names are strings");
                        if !map.contains_key(name) {
                            errors.push(format!("{at}: missing required property {name:?}"));
                        }
                    }
                }
            }
            "properties" => {
                if let Some(map) = instance.as_object() {
                    for (name, property) in value.as_object().expect("properties is a map") {
                        if let Some(child) = map.get(name) {
                            check(root, property, child, &format!("{at}/{name}"), errors);
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(map) = instance.as_object() {
                    let known = object.get("properties").and_then(Value::as_object);
                    for (name, child) in map {
                        if known.is_none_or(|k| !k.contains_key(name)) {
                            check(root, value, child, &format!("{at}/{name}"), errors);
                        }
                    }
                }
            }
            "items" => {
                if let Some(items) = instance.as_array() {
                    for (index, item) in items.iter().enumerate() {
                        check(root, value, item, &format!("{at}/{index}"), errors);
                    }
                }
            }
            "minimum" | "maximum" => {
                let limit = value.as_f64().expect("a number");
                if let Some(number) = instance.as_f64() {
                    let ok = if keyword == "minimum" {
                        number >= limit
                    } else {
                        number <= limit
                    };
                    if !ok {
                        errors.push(format!("{at}: {keyword} {limit}, found {number}"));
                    }
                }
            }
            "pattern" => {
                let pattern =
                    regex::Regex::new(value.as_str().expect("a pattern")).expect("a valid pattern");
                if let Some(text) = instance.as_str()
                    && !pattern.is_match(text)
                {
                    errors.push(format!("{at}: {text:?} does not match {pattern}"));
                }
            }
            "not" => {
                let mut sub_errors = Vec::new();
                check(root, value, instance, at, &mut sub_errors);
                if sub_errors.is_empty() {
                    errors.push(format!("{at}: matches a schema it must not ({value})"));
                }
            }
            "minItems" | "maxItems" | "minProperties" | "maxProperties" => {
                let limit = value.as_u64().expect("a count") as usize;
                let count = match keyword.as_str() {
                    "minItems" | "maxItems" => instance.as_array().map(Vec::len),
                    _ => instance.as_object().map(|m| m.len()),
                };
                if let Some(count) = count {
                    let ok = if keyword.starts_with("min") {
                        count >= limit
                    } else {
                        count <= limit
                    };
                    if !ok {
                        errors.push(format!("{at}: {keyword} {limit}, found {count}"));
                    }
                }
            }
            "allOf" | "anyOf" | "oneOf" => {
                let passing = value
                    .as_array()
                    .expect("a list of schemas")
                    .iter()
                    .filter(|sub| {
                        let mut sub_errors = Vec::new();
                        check(root, sub, instance, at, &mut sub_errors);
                        sub_errors.is_empty()
                    })
                    .count();
                let total = value.as_array().map_or(0, Vec::len);
                let ok = match keyword.as_str() {
                    "allOf" => passing == total,
                    "anyOf" => passing >= 1,
                    _ => passing == 1,
                };
                if !ok {
                    errors.push(format!(
                        "{at}: {keyword} not satisfied ({passing} of {total} match)"
                    ));
                }
            }
            other => panic!(
                "the test validator does not know the keyword {other:?}; teach it before using it in a schema"
            ),
        }
    }
}
