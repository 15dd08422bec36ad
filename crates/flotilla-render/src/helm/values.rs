//! Values as Helm computes them for a render, and what is rendered with them.
//!
//! [`plan`] does what Helm's install does before it executes templates: it enables or
//! disables dependencies (`condition`: the first path that holds a boolean decides;
//! `tags`: any true tag enables, else any false one disables), renames aliased
//! subcharts, imports values (`import-values`, both the `child`/`parent` form and the
//! `exports.` string form), and coalesces the user's values over the charts' defaults
//! (`chartutil.CoalesceValues`: maps merged deeply, a user `null` deletes a default,
//! `global` copied down into every subchart), with Helm's warnings.
//!
//! Public API: [`plan`] → [`RenderPlan`] (`charts`: each enabled chart with its scoped
//! `.Values`; `templates`: every template with the name Helm gives it; `crds`),
//! [`ScopedChart`], [`Template`], [`ValuesError`], [`coalesce_tables`].
//!
//! `values.schema.json` validation is [`crate::helm::schema`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::helm::chart::{Chart, ChartType, File, ImportValue, Metadata};
use crate::helm::gotmpl::Value;

type Map = BTreeMap<String, Value>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValuesError {
    #[error("{chart}: type mismatch on {subchart}: the values under {subchart:?} must be a map")]
    TypeMismatch { chart: String, subchart: String },
}

/// One enabled chart of a render.
#[derive(Debug, Clone)]
pub struct ScopedChart {
    /// Where its templates are named: `top`, `top/charts/sub`, ...
    pub path: String,
    /// Its Chart.yaml (with the alias as its name where it has one).
    pub metadata: Metadata,
    /// Its `.Values`.
    pub values: Value,
    /// What its `.Files` holds.
    pub files: Vec<File>,
    /// Its values.schema.json, as bytes.
    pub schema: Option<Arc<[u8]>>,
    /// Index into [`RenderPlan::charts`] of the chart it is a dependency of.
    pub parent: Option<usize>,
}

/// A template of an enabled chart.
#[derive(Debug, Clone)]
pub struct Template {
    /// As Helm names it: `top/templates/x.yaml`, `top/charts/sub/templates/y.yaml`.
    pub name: String,
    /// Index into [`RenderPlan::charts`].
    pub chart: usize,
    pub data: Arc<[u8]>,
    /// Whether Helm writes its output: not a partial (`_x.tpl`), not a library's.
    pub rendered: bool,
}

/// What a render needs.
#[derive(Debug, Clone)]
pub struct RenderPlan {
    pub charts: Vec<ScopedChart>,
    /// Sorted by name; partials included (other templates `include` them).
    pub templates: Vec<Template>,
    /// `crds/` files of the enabled charts, named like templates.
    pub crds: Vec<(String, File)>,
    /// Helm's coalescing and condition warnings.
    pub warnings: Vec<String>,
}

/// Plans a render of `chart` with the user's values.
pub fn plan(chart: &Chart, user_values: Map) -> Result<RenderPlan, ValuesError> {
    let mut warnings = Vec::new();
    let mut chart = chart.clone();
    let top = coalesce_values(&chart, user_values.clone(), &mut Vec::new())?;
    enable_dependencies(&mut chart, &top, "", &mut warnings);
    import_values(&mut chart, &mut warnings);
    let values = coalesce_values(&chart, user_values, &mut warnings)?;
    let mut planned = RenderPlan {
        charts: Vec::new(),
        templates: Vec::new(),
        crds: Vec::new(),
        warnings,
    };
    collect(
        &chart,
        chart.name().to_string(),
        Value::map(values),
        None,
        &mut planned,
    );
    planned.templates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(planned)
}

fn collect(
    chart: &Chart,
    path: String,
    values: Value,
    parent: Option<usize>,
    planned: &mut RenderPlan,
) {
    let index = planned.charts.len();
    let library = chart.metadata.chart_type == ChartType::Library;
    for template in &chart.templates {
        let base = template.name.rsplit('/').next().unwrap_or(&template.name);
        planned.templates.push(Template {
            name: format!("{path}/{}", template.name),
            chart: index,
            data: Arc::clone(&template.data),
            rendered: !base.starts_with('_') && !library,
        });
    }
    for crd in chart.crds() {
        planned
            .crds
            .push((format!("{path}/{}", crd.name), crd.clone()));
    }
    planned.charts.push(ScopedChart {
        path: path.clone(),
        metadata: chart.metadata.clone(),
        values: values.clone(),
        files: chart.files.clone(),
        schema: chart.schema.clone(),
        parent,
    });
    for sub in &chart.subcharts {
        let sub_values = match &values {
            Value::Map(map) => map
                .get(sub.name())
                .unwrap_or_else(|| Value::map(Map::new())),
            _ => Value::map(Map::new()),
        };
        collect(
            sub,
            format!("{path}/charts/{}", sub.name()),
            sub_values,
            Some(index),
            planned,
        );
    }
}

/// The value at a dotted path (`a.b.c`) of a values tree.
fn path_value(values: &Map, path: &str) -> Option<Value> {
    let mut parts = path.split('.');
    let mut current = values.get(parts.next()?)?.clone();
    for part in parts {
        match current {
            Value::Map(map) => current = map.get(part)?,
            _ => return None,
        }
    }
    Some(current)
}

/// Helm's `processDependencyEnabled`: aliases applied, disabled dependencies removed,
/// recursively (`values` are the top chart's coalesced values; `path` leads to this
/// chart's within them).
fn enable_dependencies(chart: &mut Chart, values: &Map, path: &str, warnings: &mut Vec<String>) {
    let subcharts = std::mem::take(&mut chart.subcharts);
    let mut kept = Vec::new();
    // Charts in charts/ that no dependency takes (by name and version range) stay as
    // they are: rendered unless a disabled dependency has their name.
    let mut untaken = Vec::new();
    for sub in &subcharts {
        if !chart
            .metadata
            .dependencies
            .iter()
            .any(|d| d.name == sub.name() && version_in_range(&d.version, &sub.metadata.version))
        {
            untaken.push(sub.clone());
        }
    }
    let mut disabled = Vec::new();
    for dependency in &chart.metadata.dependencies {
        let name = dependency.alias.as_deref().unwrap_or(&dependency.name);
        let sub = subcharts.iter().find(|s| {
            s.name() == dependency.name
                && version_in_range(&dependency.version, &s.metadata.version)
        });
        let mut enabled = true;
        // Tags: any true one enables, else any false one disables.
        let tags: Vec<bool> = dependency
            .tags
            .iter()
            .filter_map(|tag| match path_value(values, &format!("tags.{tag}")) {
                Some(Value::Bool(b)) => Some(b),
                _ => None,
            })
            .collect();
        if tags.contains(&true) {
            enabled = true;
        } else if tags.contains(&false) {
            enabled = false;
        }
        for condition in dependency
            .condition
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
        {
            match path_value(values, &format!("{path}{condition}")) {
                Some(Value::Bool(b)) => {
                    enabled = b;
                    break;
                }
                Some(_) => warnings.push(format!(
                    "Condition path '{path}{condition}' for chart {} returned non-bool value",
                    dependency.name
                )),
                None => {}
            }
        }
        if !enabled {
            disabled.push(name.to_string());
        } else if let Some(sub) = sub {
            let mut sub = sub.clone();
            sub.metadata.name = name.to_string();
            kept.push(sub);
        }
    }
    kept.retain(|sub| !disabled.iter().any(|name| name == sub.name()));
    untaken.retain(|sub| !disabled.iter().any(|name| name == sub.name()));
    kept.splice(0..0, untaken);
    for sub in &mut kept {
        let sub_path = format!("{path}{}.", sub.name());
        enable_dependencies(sub, values, &sub_path, warnings);
    }
    chart.subcharts = kept;
}

/// Masterminds semver's `Constraint.Check` as Helm's `IsCompatibleRange` uses it:
/// alternatives (`||`), each a list of comparisons (`,` or spaces) with `=`, `!=`,
/// `>`, `<`, `>=`, `<=`, `~`, `^` and `x`/`*` wildcards. An empty or unreadable
/// constraint or version matches nothing, as in Helm.
pub fn version_in_range(constraint: &str, version: &str) -> bool {
    let Some(version) = parse_version(version) else {
        return false;
    };
    let constraint = constraint.trim();
    if constraint.is_empty() {
        return false;
    }
    constraint.split("||").any(|alternative| {
        let mut terms = Vec::new();
        let mut pending = String::new();
        for token in alternative.split([',', ' ']).filter(|t| !t.is_empty()) {
            // `>= 1.0` is written with a space after the operator.
            if token.chars().all(|c| "<>=!~^".contains(c)) {
                pending.push_str(token);
                continue;
            }
            terms.push(format!("{pending}{token}"));
            pending.clear();
        }
        !terms.is_empty() && terms.iter().all(|term| term_matches(term, version))
    })
}

type Version = (u64, u64, u64);

fn parse_version(text: &str) -> Option<Version> {
    let text = text.trim().trim_start_matches('v');
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((major, minor, patch))
}

fn term_matches(term: &str, version: Version) -> bool {
    let operator_len = term
        .find(|c: char| !"<>=!~^".contains(c))
        .unwrap_or(term.len());
    let (operator, rest) = term.split_at(operator_len);
    let rest = rest.trim_start_matches('v');
    let core = rest.split(['-', '+']).next().unwrap_or(rest);
    let parts: Vec<&str> = core.split('.').collect();
    let wild = |p: Option<&&str>| p.is_none_or(|p| matches!(*p, "x" | "X" | "*"));
    let num = |p: Option<&&str>| p.and_then(|p| p.parse::<u64>().ok()).unwrap_or(0);
    if parts.first().is_some_and(|p| matches!(*p, "x" | "X" | "*")) {
        return operator != "!=";
    }
    let Some(major) = parts.first().and_then(|p| p.parse::<u64>().ok()) else {
        return false;
    };
    let minor_wild = wild(parts.get(1));
    let patch_wild = minor_wild || wild(parts.get(2));
    let low = (major, num(parts.get(1)), num(parts.get(2)));
    // The first version past what a wildcard leaves open.
    let high = if minor_wild {
        (major + 1, 0, 0)
    } else if patch_wild {
        (major, low.1 + 1, 0)
    } else {
        (low.0, low.1, low.2 + 1)
    };
    match operator {
        "" | "=" => version >= low && version < high,
        "!=" => !(version >= low && version < high),
        ">" => version >= high,
        ">=" | "=>" => version >= low,
        "<" => version < low,
        "<=" | "=<" => version < high,
        "~" | "~>" => {
            version >= low
                && version
                    < if minor_wild {
                        (major + 1, 0, 0)
                    } else {
                        (major, low.1 + 1, 0)
                    }
        }
        "^" => {
            let upper = if major > 0 || minor_wild {
                (major + 1, 0, 0)
            } else if low.1 > 0 || patch_wild {
                (0, low.1 + 1, 0)
            } else {
                (0, 0, low.2 + 1)
            };
            version >= low && version < upper
        }
        _ => false,
    }
}

/// Helm's `processImportValues`, children first: each import copies a child's
/// (coalesced) value into the parent's defaults, the parent's own defaults winning.
fn import_values(chart: &mut Chart, warnings: &mut Vec<String>) {
    for sub in &mut chart.subcharts {
        import_values(sub, warnings);
    }
    let mut imported = Map::new();
    for dependency in &chart.metadata.dependencies {
        let name = dependency.alias.as_deref().unwrap_or(&dependency.name);
        let Some(sub) = chart.subcharts.iter().find(|s| s.name() == name) else {
            continue;
        };
        let child_values = match coalesce_values(sub, Map::new(), &mut Vec::new()) {
            Ok(values) => values,
            Err(_) => continue,
        };
        for import in &dependency.import_values {
            let (child, parent) = match import {
                ImportValue::Map { child, parent } => (child.clone(), parent.clone()),
                ImportValue::Exports(key) => (format!("exports.{key}"), String::new()),
            };
            match path_value(&child_values, &child) {
                Some(Value::Map(found)) if parent.is_empty() => {
                    imported = coalesce_tables(found.snapshot(), imported, "", warnings);
                }
                Some(found) if !parent.is_empty() => {
                    let mut nested = found.clone();
                    for part in parent.rsplit('.') {
                        nested = Value::map(Map::from([(part.to_string(), nested)]));
                    }
                    if let Value::Map(nested) = nested {
                        imported = coalesce_tables(nested.snapshot(), imported, "", warnings);
                    }
                }
                _ => warnings.push(format!(
                    "ImportValues missing table from chart {}: {child}",
                    sub.name()
                )),
            }
        }
    }
    if !imported.is_empty() {
        let defaults = std::mem::take(&mut chart.values);
        chart.values = coalesce_tables(defaults, imported, "", warnings);
    }
}

/// `chartutil.CoalesceValues`: the user's values over the chart's defaults, then each
/// subchart's under its name, with the parent's `global` copied in.
fn coalesce_values(
    chart: &Chart,
    mut values: Map,
    warnings: &mut Vec<String>,
) -> Result<Map, ValuesError> {
    coalesce_chart_values(chart, &mut values, "", warnings);
    for sub in &chart.subcharts {
        let name = sub.name().to_string();
        let sub_values = match values.remove(&name) {
            None | Some(Value::Nil) => Map::new(),
            Some(Value::Map(map)) => map.snapshot(),
            Some(_) => {
                return Err(ValuesError::TypeMismatch {
                    chart: chart.name().to_string(),
                    subchart: name,
                });
            }
        };
        let mut sub_values = sub_values;
        coalesce_globals(&mut sub_values, &values, warnings);
        let sub_values = coalesce_values(sub, sub_values, warnings)?;
        values.insert(name, Value::map(sub_values));
    }
    Ok(values)
}

fn coalesce_chart_values(
    chart: &Chart,
    values: &mut Map,
    prefix: &str,
    warnings: &mut Vec<String>,
) {
    for (key, default) in &chart.values {
        match values.get(key) {
            Some(Value::Nil) => {
                values.remove(key);
            }
            Some(Value::Map(user)) => match default {
                Value::Map(default) => {
                    let merged = coalesce_tables(
                        user.snapshot(),
                        default.snapshot(),
                        &join(prefix, key),
                        warnings,
                    );
                    values.insert(key.clone(), Value::map(merged));
                }
                Value::Nil => {}
                _ => warnings.push(format!(
                    "warning: skipped value for {}: Not a table.",
                    join(prefix, key)
                )),
            },
            Some(_) => {}
            None => {
                if let Some(default) = without_nulls(default) {
                    values.insert(key.clone(), default);
                }
            }
        }
    }
}

/// A chart's default without its `null`s, at every depth: Helm drops a key whose
/// default is null (`rollingUpdate: null` leaves no `rollingUpdate`), `None` for a
/// null itself.
fn without_nulls(value: &Value) -> Option<Value> {
    match value {
        Value::Nil => None,
        Value::Map(map) => Some(Value::map(
            map.entries()
                .iter()
                .filter_map(|(k, v)| without_nulls(v).map(|v| (k.clone(), v)))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// `coalesceTablesFullKey`: `dst` (higher precedence) over `src`; a `null` in `dst`
/// deletes the key.
pub fn coalesce_tables(mut dst: Map, src: Map, prefix: &str, warnings: &mut Vec<String>) -> Map {
    for (key, value) in src {
        let full = join(prefix, &key);
        match dst.get(&key) {
            None => {
                if let Some(value) = without_nulls(&value) {
                    dst.insert(key, value);
                }
            }
            Some(Value::Nil) => {
                dst.remove(&key);
            }
            Some(Value::Map(existing)) => match value {
                Value::Map(value) => {
                    let merged =
                        coalesce_tables(existing.snapshot(), value.snapshot(), &full, warnings);
                    dst.insert(key, Value::map(merged));
                }
                Value::Nil => {}
                other => warnings.push(format!(
                    "warning: destination for {full} is a table. Ignoring non-table value ({})",
                    go_print(&other)
                )),
            },
            Some(_) => {
                if let Value::Map(_) = value {
                    warnings.push(format!(
                        "warning: cannot overwrite table with non table for {full} ({})",
                        go_print(&value)
                    ));
                }
            }
        }
    }
    dst
}

/// Go's `%v` of a plain value, for warnings.
fn go_print(value: &Value) -> String {
    match value {
        Value::Nil | Value::Missing => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) | Value::Int64(i) => i.to_string(),
        Value::Float(f) => crate::helm::yaml::format_float_v(*f),
        Value::String(s) => s.to_string(),
        Value::List(items) => format!(
            "[{}]",
            items.iter().map(go_print).collect::<Vec<_>>().join(" ")
        ),
        Value::Map(map) => format!(
            "map[{}]",
            map.entries()
                .iter()
                .map(|(k, v)| format!("{k}:{}", go_print(v)))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Value::Bytes(bytes) => format!("{:?}", bytes),
        Value::Object(object) => object.display(),
    }
}

/// `coalesceGlobals`: the parent's `global` over the subchart's.
fn coalesce_globals(sub: &mut Map, parent: &Map, warnings: &mut Vec<String>) {
    let parent_globals = match parent.get("global") {
        Some(Value::Map(map)) => map.snapshot(),
        _ => Map::new(),
    };
    let mut globals = match sub.get("global") {
        Some(Value::Map(map)) => map.snapshot(),
        _ => Map::new(),
    };
    for (key, value) in parent_globals {
        match (&value, globals.get(&key)) {
            (Value::Map(_), None) => {
                globals.insert(key, value);
            }
            (Value::Map(parent_map), Some(Value::Map(sub_map))) => {
                let merged = merge_tables(parent_map.snapshot(), sub_map.snapshot());
                globals.insert(key, Value::map(merged));
            }
            (Value::Map(_), Some(_)) => {
                warnings.push(format!(
                    "Conflict: cannot merge map onto non-map for {key:?}. Skipping."
                ));
            }
            (_, Some(Value::Map(_))) => warnings.push(format!("key {key} is table. Skipping")),
            _ => {
                globals.insert(key, value);
            }
        }
    }
    sub.insert("global".into(), Value::map(globals));
}

/// Merging without deleting nulls: `dst` over `src`.
fn merge_tables(mut dst: Map, src: Map) -> Map {
    for (key, value) in src {
        match (dst.get(&key), value) {
            (None, value) => {
                dst.insert(key, value);
            }
            (Some(Value::Map(existing)), Value::Map(value)) => {
                let merged = merge_tables(existing.snapshot(), value.snapshot());
                dst.insert(key, Value::map(merged));
            }
            _ => {}
        }
    }
    dst
}

#[cfg(test)]
mod tests;
