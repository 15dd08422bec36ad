//! `values.schema.json` as Helm v4 checks it: each enabled chart's values against
//! its own schema, with the JSON Schema keywords charts use (`type`, also a list of
//! types; `properties`, `required`, `additionalProperties`, `items`, `enum`, `const`,
//! `minimum`/`maximum` and their exclusive forms, `minLength`/`maxLength`, `pattern`,
//! `minItems`/`maxItems`, `oneOf`/`anyOf`/`allOf`/`not`, `$ref` to `#/definitions/..`
//! and `#/$defs/..`), and Helm's report of what failed:
//!
//! ```text
//! values don't meet the specifications of the schema(s) in the following chart(s):
//! mychart:
//! - at '/replicas': got string, want integer
//! ```
//!
//! Public API: [`validate_plan`]`(&RenderPlan) -> Result<(), String>`.
//! Known difference: failures of several properties come in the properties' byte
//! order, where Helm lists them in the schema's order. Keywords beyond these (`if`/`then`, `dependencies`, formats, remote `$ref`s) are
//! not checked.

use std::fmt::Write as _;

use serde_json::Value as Json;

use crate::helm::gotmpl::Value;
use crate::helm::values::RenderPlan;

/// How deep `$ref`s and nested schemas may go before the schema counts as broken.
const MAX_DEPTH: usize = 200;

/// One failure: where in the values, what, and the failures it groups.
#[derive(Debug)]
struct Failure {
    at: String,
    message: String,
    causes: Vec<Failure>,
}

/// Checks every planned chart that has a schema; the error is Helm's whole message.
pub fn validate_plan(planned: &RenderPlan) -> Result<(), String> {
    let mut report = String::new();
    for chart in &planned.charts {
        let Some(schema) = &chart.schema else {
            continue;
        };
        let schema: Json = match serde_json::from_slice(schema) {
            Ok(schema) => schema,
            Err(e) => {
                let _ = writeln!(
                    report,
                    "{}:\n- values.schema.json is no JSON: {e}",
                    chart.metadata.name
                );
                continue;
            }
        };
        let instance = to_json(&chart.values);
        let mut failures = Vec::new();
        Checker { root: &schema }.check(&schema, &instance, "", 0, &mut failures);
        let top = match failures.len() {
            0 => continue,
            1 => failures.remove(0),
            _ => Failure {
                at: String::new(),
                message: "validation failed".to_string(),
                causes: failures,
            },
        };
        let _ = writeln!(report, "{}:", chart.metadata.name);
        if top.causes.is_empty() {
            write_failure(&mut report, &top, 0);
        } else {
            for cause in &top.causes {
                write_failure(&mut report, cause, 0);
            }
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "values don't meet the specifications of the schema(s) in the following chart(s):\n{report}"
        ))
    }
}

fn write_failure(out: &mut String, failure: &Failure, depth: usize) {
    let _ = writeln!(
        out,
        "{}- at '{}': {}",
        "  ".repeat(depth),
        failure.at,
        failure.message
    );
    for cause in &failure.causes {
        write_failure(out, cause, depth + 1);
    }
}

/// Values as the JSON Helm validates (numbers stay numbers; objects have no schema).
fn to_json(value: &Value) -> Json {
    match value {
        Value::Nil | Value::Missing => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) | Value::Int64(i) => Json::from(*i),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::String(s) => Json::String(s.to_string()),
        Value::Bytes(b) => Json::String(String::from_utf8_lossy(b).into_owned()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(map) => Json::Object(
            map.entries()
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
        Value::Object(o) => Json::String(o.display()),
    }
}

struct Checker<'s> {
    root: &'s Json,
}

/// The JSON Schema type names a value has (`integer` is also a `number`).
fn type_of(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

fn is_integer(value: &Json) -> bool {
    value.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn has_type(value: &Json, name: &str) -> bool {
    match name {
        "integer" => is_integer(value),
        other => type_of(value) == other,
    }
}

/// A value in a message: strings in single quotes, the rest as JSON.
fn quoted(value: &Json) -> String {
    match value {
        Json::String(s) => format!("'{s}'"),
        Json::Number(n) => number_text(n),
        other => other.to_string(),
    }
}

fn number_text(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        Some(f) => format!("{f}"),
        None => n.to_string(),
    }
}

fn pointer(at: &str, key: &str) -> String {
    format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"))
}

impl<'s> Checker<'s> {
    /// The schema a local `$ref` names, if it is one flotilla follows.
    fn resolve(&self, reference: &str) -> Option<&'s Json> {
        let path = reference.strip_prefix('#')?;
        if path.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(path)
    }

    /// Appends the failures of `value` against `schema` at `at` to `out`: one
    /// failure, or a `validation failed` group where a schema fails in several ways.
    fn check(&self, schema: &Json, value: &Json, at: &str, depth: usize, out: &mut Vec<Failure>) {
        let mut failures = Vec::new();
        self.keywords(schema, value, at, depth, &mut failures);
        match failures.len() {
            0 => {}
            1 => out.extend(failures),
            _ => out.push(Failure {
                at: at.to_string(),
                message: "validation failed".to_string(),
                causes: failures,
            }),
        }
    }

    fn keywords(
        &self,
        schema: &Json,
        value: &Json,
        at: &str,
        depth: usize,
        out: &mut Vec<Failure>,
    ) {
        let fail = |message: String| Failure {
            at: at.to_string(),
            message,
            causes: Vec::new(),
        };
        let schema = match schema {
            Json::Bool(true) => return,
            Json::Bool(false) => {
                out.push(fail("false schema".to_string()));
                return;
            }
            Json::Object(schema) => schema,
            _ => return,
        };
        if depth > MAX_DEPTH {
            out.push(fail("the schema nests too deep (a $ref loop?)".to_string()));
            return;
        }
        if let Some(Json::String(reference)) = schema.get("$ref") {
            match self.resolve(reference) {
                Some(target) => self.keywords(target, value, at, depth + 1, out),
                None => out.push(fail(format!("cannot resolve $ref '{reference}'"))),
            }
        }
        if let Some(types) = schema.get("type") {
            let names: Vec<&str> = match types {
                Json::String(t) => vec![t.as_str()],
                Json::Array(list) => list.iter().filter_map(Json::as_str).collect(),
                _ => Vec::new(),
            };
            if !names.is_empty() && !names.iter().any(|t| has_type(value, t)) {
                out.push(fail(format!(
                    "got {}, want {}",
                    type_of(value),
                    names.join(" or ")
                )));
            }
        }
        if let Some(Json::Array(options)) = schema.get("enum")
            && !options.iter().any(|o| json_equal(o, value))
        {
            let list: Vec<String> = options.iter().map(quoted).collect();
            out.push(fail(format!("value must be one of {}", list.join(", "))));
        }
        if let Some(constant) = schema.get("const")
            && !json_equal(constant, value)
        {
            out.push(fail(format!("value must be {}", quoted(constant))));
        }
        if let Json::Number(n) = value {
            let x = n.as_f64().unwrap_or(0.0);
            let bound = |key: &str| schema.get(key).and_then(Json::as_f64);
            let shown = |key: &str| schema.get(key).map(quoted).unwrap_or_default();
            let got = number_text(n);
            if bound("minimum").is_some_and(|m| x < m) {
                out.push(fail(format!(
                    "minimum: got {got}, want {}",
                    shown("minimum")
                )));
            }
            if bound("maximum").is_some_and(|m| x > m) {
                out.push(fail(format!(
                    "maximum: got {got}, want {}",
                    shown("maximum")
                )));
            }
            if bound("exclusiveMinimum").is_some_and(|m| x <= m) {
                out.push(fail(format!(
                    "exclusiveMinimum: got {got}, want {}",
                    shown("exclusiveMinimum")
                )));
            }
            if bound("exclusiveMaximum").is_some_and(|m| x >= m) {
                out.push(fail(format!(
                    "exclusiveMaximum: got {got}, want {}",
                    shown("exclusiveMaximum")
                )));
            }
        }
        if let Json::String(s) = value {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Json::as_u64)
                && len < min
            {
                out.push(fail(format!("minLength: got {len}, want {min}")));
            }
            if let Some(max) = schema.get("maxLength").and_then(Json::as_u64)
                && len > max
            {
                out.push(fail(format!("maxLength: got {len}, want {max}")));
            }
            if let Some(Json::String(pattern)) = schema.get("pattern") {
                match regex::Regex::new(pattern) {
                    Ok(re) if !re.is_match(s) => {
                        out.push(fail(format!("'{s}' does not match pattern '{pattern}'")));
                    }
                    Ok(_) => {}
                    Err(_) => out.push(fail(format!("invalid pattern '{pattern}'"))),
                }
            }
        }
        if let Json::Array(items) = value {
            let count = items.len() as u64;
            if let Some(min) = schema.get("minItems").and_then(Json::as_u64)
                && count < min
            {
                out.push(fail(format!("minItems: got {count}, want {min}")));
            }
            if let Some(max) = schema.get("maxItems").and_then(Json::as_u64)
                && count > max
            {
                out.push(fail(format!("maxItems: got {count}, want {max}")));
            }
            match schema.get("items") {
                Some(Json::Array(tuple)) => {
                    for (i, (item, sub)) in items.iter().zip(tuple).enumerate() {
                        self.check(sub, item, &format!("{at}/{i}"), depth + 1, out);
                    }
                }
                Some(sub) => {
                    for (i, item) in items.iter().enumerate() {
                        self.check(sub, item, &format!("{at}/{i}"), depth + 1, out);
                    }
                }
                None => {}
            }
        }
        if let Json::Object(map) = value {
            if let Some(Json::Array(required)) = schema.get("required") {
                let missing: Vec<String> = required
                    .iter()
                    .filter_map(Json::as_str)
                    .filter(|k| !map.contains_key(*k))
                    .map(|k| format!("'{k}'"))
                    .collect();
                match missing.len() {
                    0 => {}
                    1 => out.push(fail(format!("missing property {}", missing[0]))),
                    _ => out.push(fail(format!("missing properties {}", missing.join(", ")))),
                }
            }
            let properties = schema.get("properties").and_then(Json::as_object);
            let patterns: Vec<(regex::Regex, &Json)> = schema
                .get("patternProperties")
                .and_then(Json::as_object)
                .map(|p| {
                    p.iter()
                        .filter_map(|(k, s)| regex::Regex::new(k).ok().map(|re| (re, s)))
                        .collect()
                })
                .unwrap_or_default();
            let mut additional = Vec::new();
            for (key, item) in map {
                let mut known = false;
                if let Some(sub) = properties.and_then(|p| p.get(key)) {
                    known = true;
                    self.check(sub, item, &pointer(at, key), depth + 1, out);
                }
                for (re, sub) in &patterns {
                    if re.is_match(key) {
                        known = true;
                        self.check(sub, item, &pointer(at, key), depth + 1, out);
                    }
                }
                if !known {
                    additional.push((key, item));
                }
            }
            match schema.get("additionalProperties") {
                Some(Json::Bool(false)) if !additional.is_empty() => {
                    let names: Vec<String> =
                        additional.iter().map(|(k, _)| format!("'{k}'")).collect();
                    out.push(fail(format!(
                        "additional properties {} not allowed",
                        names.join(", ")
                    )));
                }
                Some(sub @ Json::Object(_)) => {
                    for (key, item) in additional {
                        self.check(sub, item, &pointer(at, key), depth + 1, out);
                    }
                }
                _ => {}
            }
        }
        if let Some(Json::Array(all)) = schema.get("allOf") {
            let mut causes = Vec::new();
            for sub in all {
                self.check(sub, value, at, depth + 1, &mut causes);
            }
            if !causes.is_empty() {
                out.push(Failure {
                    at: at.to_string(),
                    message: "allOf failed".to_string(),
                    causes,
                });
            }
        }
        if let Some(Json::Array(any)) = schema.get("anyOf") {
            let mut causes = Vec::new();
            let matched = any.iter().any(|sub| {
                let before = causes.len();
                self.check(sub, value, at, depth + 1, &mut causes);
                causes.len() == before
            });
            if !matched {
                out.push(Failure {
                    at: at.to_string(),
                    message: "anyOf failed".to_string(),
                    causes,
                });
            }
        }
        if let Some(Json::Array(one)) = schema.get("oneOf") {
            let mut causes = Vec::new();
            let mut matched = Vec::new();
            for (i, sub) in one.iter().enumerate() {
                let before = causes.len();
                self.check(sub, value, at, depth + 1, &mut causes);
                if causes.len() == before {
                    matched.push(i.to_string());
                }
            }
            match matched.len() {
                0 => out.push(Failure {
                    at: at.to_string(),
                    message: "oneOf failed, none matched".to_string(),
                    causes,
                }),
                1 => {}
                _ => out.push(fail(format!(
                    "oneOf failed, subschemas {} matched",
                    matched.join(", ")
                ))),
            }
        }
        if let Some(not) = schema.get("not") {
            let mut causes = Vec::new();
            self.check(not, value, at, depth + 1, &mut causes);
            if causes.is_empty() {
                out.push(fail("not failed".to_string()));
            }
        }
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
fn json_equal(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        (Json::Array(x), Json::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests;
