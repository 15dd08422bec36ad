//! Rendered resources checked against their kinds' schemas, as the API server would
//! decode them: a built-in kind against the Kubernetes OpenAPI schema of the
//! cluster's minor version (compiled in, `schemas/kubernetes.json.gz`, made by
//! `schemas/generate.py`), a custom resource against the `openAPIV3Schema` of a
//! CustomResourceDefinition the fleet ships. Unknown fields, values of the wrong
//! type and missing required fields are found, each with its field path.
//!
//! The check never reports what the API server accepts: `null` is taken for any
//! field, an integral number such as `3.0` for an integer, a number for a quantity,
//! and the parts of a schema it does not model (`anyOf`, `oneOf`, `not`, formats,
//! enums, patterns, bounds) are not checked at all.
//!
//! [`Checker`] checks each distinct resource (by its canonical bytes) once per
//! minor version and render, as the fleet shares resources between clusters.

mod schema;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use std::sync::{Arc, Mutex};

use serde_json::Value;

use flotilla_core::bundle::Resource;
use flotilla_core::model::{KubernetesSpec, Validation};

pub(crate) use schema::CustomKinds;
use schema::{Builtin, Node};

/// A minor version of Kubernetes 1.x.
pub(crate) type Minor = u32;

/// One problem of one resource: where in it (`spec.replica`) and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Finding {
    pub(crate) path: String,
    pub(crate) problem: Problem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// A field the schema does not have, with the closest one it has.
    Unknown { suggestion: Option<String> },
    /// A value of another type than the schema's (`expected`, `found`).
    WrongType {
        expected: &'static str,
        found: &'static str,
    },
    /// A kind of one of Kubernetes' own API groups that the version does not serve
    /// as written: what it serves instead, or the closest kind.
    NotServed(String),
    /// A required field that is absent.
    Missing,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.problem {
            Problem::Unknown {
                suggestion: Some(s),
            } => write!(f, "{}: unknown field (did you mean {s:?}?)", self.path),
            Problem::Unknown { suggestion: None } => write!(f, "{}: unknown field", self.path),
            Problem::WrongType { expected, found } => {
                write!(f, "{}: expected {expected}, found {found}", self.path)
            }
            Problem::Missing => write!(f, "{}: required field missing", self.path),
            Problem::NotServed(what) => write!(f, "{}: {what}", self.path),
        }
    }
}

/// What checking one resource came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Checked against its schema: these problems (none when it is valid).
    Checked(Vec<Finding>),
    /// A custom resource whose kind no CustomResourceDefinition of the fleet defines
    /// (`group/version/Kind`): not checked.
    NoDefinition(String),
    /// Not checked: a built-in group's kind the schemas do not have, or a CRD's
    /// version without a schema.
    Unchecked,
}

/// The minor version a cluster's resources are checked against, and whether it is
/// not the one asked for (a version outside the compiled-in ones takes the nearest,
/// an unreadable one the default).
pub(crate) struct MinorChoice {
    pub(crate) minor: Minor,
    /// `Some(asked)` when the version asked for has no schema of its own.
    pub(crate) instead_of: Option<String>,
}

/// The minor version whose schema checks a cluster of `spec` (its own
/// `spec.kubernetes`, else the fleet's), from `default` when neither names one.
pub(crate) fn minor_for(spec: Option<&KubernetesSpec>, default: &str) -> MinorChoice {
    let asked = spec.and_then(|s| s.version.as_deref()).unwrap_or(default);
    let known = Builtin::get().minors();
    let parsed = parse_minor(asked);
    let fallback = parse_minor(default).unwrap_or(known.last().copied().unwrap_or(0));
    let wanted = parsed.unwrap_or(fallback);
    let nearest = known
        .iter()
        .copied()
        .min_by_key(|m| (m.abs_diff(wanted), std::cmp::Reverse(*m)))
        .unwrap_or(wanted);
    MinorChoice {
        minor: nearest,
        instead_of: (parsed != Some(nearest)).then(|| asked.to_string()),
    }
}

/// `1.31` from `v1.31.4`, `1.31.4` or `1.31`; `None` for another major version or
/// an unreadable one.
fn parse_minor(version: &str) -> Option<Minor> {
    let version = version.strip_prefix('v').unwrap_or(version);
    let mut parts = version.split('.');
    if parts.next()? != "1" {
        return None;
    }
    let minor = parts.next()?;
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The minor versions with a compiled-in schema, oldest first.
pub(crate) fn known_minors() -> &'static [Minor] {
    Builtin::get().minors()
}

/// Checks resources for one render: the fleet's custom kinds, and what was found
/// for each distinct resource and minor version.
pub(crate) struct Checker {
    mode: Validation,
    custom: CustomKinds,
    crds: std::collections::HashSet<ByBytes, foldhash::fast::RandomState>,
    /// Per (minor version, 128-bit hash of a resource's canonical bytes), what its
    /// check found. The hash is two seeded 64-bit hashes (seeds chosen at random per
    /// render, so a fleet's author cannot aim for a collision); keeping the bytes
    /// themselves would keep every cluster's own resources alive for the render.
    memo: Mutex<Memo>,
    seeds: (foldhash::fast::RandomState, foldhash::fast::RandomState),
}

/// What the checks of a render found, by minor version and resource hash.
type Memo = HashMap<(Minor, u64, u64), Arc<Outcome>, foldhash::fast::RandomState>;

/// A resource compared and hashed by its canonical bytes.
#[derive(Clone)]
struct ByBytes(Arc<Resource>);

impl PartialEq for ByBytes {
    fn eq(&self, other: &Self) -> bool {
        self.0.canonical == other.0.canonical
    }
}
impl Eq for ByBytes {}
impl std::hash::Hash for ByBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.canonical.hash(state);
    }
}

impl Checker {
    /// A checker under `mode`, knowing the custom kinds the CustomResourceDefinitions
    /// `crds` define.
    pub(crate) fn new<'r>(
        mode: Validation,
        crds: impl IntoIterator<Item = &'r Arc<Resource>>,
    ) -> Checker {
        let crds: Vec<ByBytes> = crds.into_iter().map(|r| ByBytes(r.clone())).collect();
        let values: Vec<Value> = crds.iter().map(|r| r.0.value()).collect();
        Checker {
            mode,
            custom: CustomKinds::of(&values),
            crds: crds.into_iter().collect(),
            memo: Mutex::default(),
            seeds: Default::default(),
        }
    }

    /// Whether `crd` is one of the CustomResourceDefinitions the checker knows.
    pub(crate) fn knows(&self, crd: &Arc<Resource>) -> bool {
        self.crds.contains(&ByBytes(crd.clone()))
    }

    pub(crate) fn mode(&self) -> Validation {
        self.mode
    }

    /// What checking `resource` against the schemas of `minor` finds; the same
    /// resource is checked once per minor version.
    pub(crate) fn check(&self, resource: &Arc<Resource>, minor: Minor) -> Arc<Outcome> {
        use std::hash::BuildHasher;
        let bytes: &[u8] = &resource.canonical;
        let key = (
            minor,
            self.seeds.0.hash_one(bytes),
            self.seeds.1.hash_one(bytes),
        );
        if let Some(known) = self.lock().get(&key) {
            return known.clone();
        }
        let outcome = Arc::new(check_resource(&resource.value(), minor, &self.custom));
        self.lock().entry(key).or_insert(outcome).clone()
    }

    /// `resource` checked with the custom kinds of `extra` too, not kept: for the
    /// rare cluster that renders CRDs of its own.
    pub(crate) fn check_with(
        &self,
        resource: &Resource,
        minor: Minor,
        extra: &CustomKinds,
    ) -> Outcome {
        let value = resource.value();
        match check_resource(&value, minor, extra) {
            Outcome::NoDefinition(_) => check_resource(&value, minor, &self.custom),
            Outcome::Checked(findings) if is_not_served(&findings) => {
                check_resource(&value, minor, &self.custom)
            }
            outcome => outcome,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memo> {
        // The map is only ever inserted into: a panic elsewhere leaves it whole.
        self.memo.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Checks one resource (a JSON object with `apiVersion` and `kind`).
pub(crate) fn check_resource(resource: &Value, minor: Minor, custom: &CustomKinds) -> Outcome {
    let api_version = resource
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = resource
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let builtin = Builtin::get();
    let Some(version) = builtin.version(minor) else {
        return Outcome::Unchecked;
    };
    let gvk = format!("{api_version}/{kind}");
    let mut findings = Vec::new();
    if let Some(definition) = version.kind(&gvk) {
        let mut walk = Walk {
            version,
            findings: &mut findings,
        };
        walk.node(definition, resource, &mut String::new());
        return Outcome::Checked(findings);
    }
    let candidates = custom.get(&gvk);
    if candidates.is_empty() {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        if let Some(finding) = not_served(version, group, api_version, kind) {
            return Outcome::Checked(vec![finding]);
        }
        return if is_builtin_group(group) {
            Outcome::Unchecked
        } else {
            Outcome::NoDefinition(gvk)
        };
    }
    // Two different CRDs in the fleet may define the kind: the resource is judged
    // by the one it fits best, never reported for a definition it does not use.
    let mut best: Option<Vec<Finding>> = None;
    for schema in candidates {
        let Some(schema) = schema else {
            return Outcome::Unchecked;
        };
        let mut found = Vec::new();
        let mut walk = Walk {
            version,
            findings: &mut found,
        };
        walk.custom_root(schema, resource);
        if best.as_ref().is_none_or(|b| found.len() < b.len()) {
            best = Some(found);
        }
    }
    Outcome::Checked(best.unwrap_or_default())
}

/// Whether `findings` is the one of a kind its group does not serve.
fn is_not_served(findings: &[Finding]) -> bool {
    matches!(
        findings,
        [Finding {
            problem: Problem::NotServed(_),
            ..
        }]
    )
}

/// Why `api_version`/`kind` is refused by the API server of `version`, when `group`
/// is one it serves or one no CRD may define (a group without a dot, which every
/// CRD's has) and the kind is not among its kinds: a misspelt kind, or an API
/// version since removed (`extensions/v1beta1` Deployments). `None` for a group
/// of another API (an aggregated one, or a CRD of a `*.k8s.io` group), which the
/// schemas cannot judge.
fn not_served(
    version: &schema::Version,
    group: &str,
    api_version: &str,
    kind: &str,
) -> Option<Finding> {
    if api_version.is_empty() || kind.is_empty() {
        return None;
    }
    if group.contains('.') && !version.serves_group(group) {
        return None;
    }
    let served_as = version.api_versions_of(kind);
    let (path, what) = if !served_as.is_empty() {
        (
            "apiVersion",
            format!(
                "{kind} is not served as {api_version}; it is served as {}",
                served_as.join(" and ")
            ),
        )
    } else {
        let kinds = version.kinds_of(api_version);
        let what = if kinds.is_empty() {
            format!("no kind {kind:?} is served (nor is {api_version})")
        } else {
            match flotilla_core::diagnostic::did_you_mean(kind, kinds.iter().copied()) {
                Some(closest) => {
                    format!("{api_version} has no kind {kind:?} (did you mean {closest:?}?)")
                }
                None => format!("{api_version} has no kind {kind:?}"),
            }
        };
        ("kind", what)
    };
    Some(Finding {
        path: path.to_string(),
        problem: Problem::NotServed(what),
    })
}

/// Whether `group` is one of Kubernetes' own API groups (no CRD defines its kinds).
fn is_builtin_group(group: &str) -> bool {
    !group.contains('.') || group.ends_with(".k8s.io")
}

/// One walk over a value and its schema, gathering findings.
struct Walk<'a, 'f> {
    version: &'a schema::Version,
    findings: &'f mut Vec<Finding>,
}

const OBJECT_META: &str = "apimachinery.pkg.apis.meta.v1.ObjectMeta";

impl<'a> Walk<'a, '_> {
    fn report(&mut self, path: &str, problem: Problem) {
        let path = if path.is_empty() {
            "(the resource)"
        } else {
            path
        };
        self.findings.push(Finding {
            path: path.to_string(),
            problem,
        });
    }

    /// A custom resource's root: `apiVersion`, `kind` and `metadata` are the API
    /// server's own (`metadata` an ObjectMeta), the rest is the CRD's schema.
    fn custom_root(&mut self, schema: &Node, resource: &Value) {
        let Some(object) = resource.as_object() else {
            return;
        };
        if let Some(meta) = object.get("metadata") {
            let mut path = String::from("metadata");
            self.node(&Node::Ref(OBJECT_META.into()), meta, &mut path);
        }
        let mut path = String::new();
        self.node_except(
            schema,
            resource,
            &mut path,
            &["apiVersion", "kind", "metadata"],
        );
    }

    fn node(&mut self, node: &Node, value: &Value, path: &mut String) {
        self.node_except(node, value, path, &[]);
    }

    /// Checks `value` against `node`; the fields named in `skip` are neither
    /// checked nor unknown (a custom resource's root).
    fn node_except(&mut self, node: &Node, value: &Value, path: &mut String, skip: &[&str]) {
        // The API server takes null for any field it decodes (it is left unset).
        if value.is_null() {
            return;
        }
        match node {
            Node::Any => {}
            Node::Ref(name) => {
                if let Some(target) = self.version.definition(name) {
                    self.node_except(target, value, path, skip);
                }
            }
            Node::String => self.expect(value.is_string(), "a string", value, path),
            Node::Boolean => self.expect(value.is_boolean(), "a boolean", value, path),
            Node::Integer => self.expect(is_integer(value), "an integer", value, path),
            Node::Number => self.expect(value.is_number(), "a number", value, path),
            Node::IntOrString => self.expect(
                value.is_string() || is_integer(value),
                "an integer or a string",
                value,
                path,
            ),
            Node::Quantity => self.expect(
                value.is_string() || value.is_number(),
                "a quantity (a string or a number)",
                value,
                path,
            ),
            Node::AnyObject => self.expect(value.is_object(), "an object", value, path),
            Node::List(items) => {
                let Some(list) = value.as_array() else {
                    return self.expect(false, "a list", value, path);
                };
                for (index, item) in list.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{index}]"));
                    self.node(items, item, path);
                    path.truncate(len);
                }
            }
            Node::Object(object) => {
                let Some(map) = value.as_object() else {
                    return self.expect(false, "an object", value, path);
                };
                for (key, item) in map {
                    if skip.contains(&key.as_str()) {
                        continue;
                    }
                    let len = path.len();
                    push_field(path, key);
                    if let Some(field) = object.fields.get(key) {
                        self.node(field, item, path);
                    } else if let Some(values) = &object.values {
                        self.node(values, item, path);
                    } else if object.open
                        || (object.embedded && matches!(key.as_str(), "apiVersion" | "kind"))
                    {
                    } else if object.embedded && key == "metadata" {
                        self.node(&Node::Ref(OBJECT_META.into()), item, path);
                    } else {
                        let suggestion = flotilla_core::diagnostic::did_you_mean(
                            key,
                            object.fields.keys().map(String::as_str),
                        )
                        .map(str::to_string);
                        let at = path.clone();
                        self.report(&at, Problem::Unknown { suggestion });
                    }
                    path.truncate(len);
                }
                for required in &object.required {
                    if !map.contains_key(required) {
                        let len = path.len();
                        push_field(path, required);
                        let at = path.clone();
                        self.report(&at, Problem::Missing);
                        path.truncate(len);
                    }
                }
            }
        }
    }

    fn expect(&mut self, ok: bool, expected: &'static str, value: &Value, path: &str) {
        if !ok {
            self.report(
                path,
                Problem::WrongType {
                    expected,
                    found: type_name(value),
                },
            );
        }
    }
}

/// Whether the API server decodes `value` into an integer field: a JSON integer,
/// or a number with no fraction (`3.0`), which Kubernetes' YAML-to-JSON step
/// writes as an integer.
fn is_integer(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `path` extended by the field `key`: `.key`, or `["key"]` for a key that is not
/// a plain name (a label such as `app.kubernetes.io/name`).
fn push_field(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push_str(&format!("[{key:?}]"));
    }
}
