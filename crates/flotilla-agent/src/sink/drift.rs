//! Drift: how a sink tells that an object it applied was changed on the cluster, and
//! what the agent does about it. Pure: the sinks read the live objects (or files) and
//! carry out what is decided here.
//!
//! - **What is compared.** The leaves of the object flotilla applied ([`leaves`]):
//!   every scalar, every list of scalars (atomic, as server-side apply treats it) and
//!   every empty map, under its path (`spec.template.spec.containers[name=web].image`,
//!   `data.key`; list items keyed by `name` when every item has one, else by index;
//!   a key that holds `.`, `[` or `]` is quoted: `metadata.labels["app.kubernetes.io/name"]`).
//!   `apiVersion`, `kind`, `metadata.name`, `metadata.namespace`, `status` and what
//!   the server sets are never leaves. The sink keeps a [`Fingerprint`] of the object
//!   the server *returned* for flotilla's apply (one 64-bit hash per leaf), so what
//!   mutating webhooks and defaulting set on every apply is in the fingerprint and is
//!   not drift; a later difference at a leaf is.
//! - **Who changed it.** [`owners`] reads the live object's `metadata.managedFields`
//!   for the managers, other than flotilla, that own a drifted path.
//! - **What is done.** [`Memory::decide`], per drifted resource, by its workload's
//!   policy: `correct` puts it back, `report` leaves it; a path that drifts again at
//!   the check right after flotilla corrected it is *fought over*: reported
//!   `fighting`, and no longer corrected until the bundle's digest changes.
//! - **What is said.** [`Memory::level`]: a drifted resource is logged at `info`
//!   (corrected) or `warn` (left) when its line differs from the last check's, and at
//!   `debug` while it stays the same, so drift left on a cluster is said once, not at
//!   every resync.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hasher};

use serde_json::Value;

use flotilla_core::bundle::{Digest, DriftPolicy, ResourceKey};
use flotilla_core::status::{DriftAction, DriftedResource, ResourceStatus};

/// What a drift check found; see [`super::Sink::check_drift`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftCheck {
    /// The sink cannot look for drift (or has nothing recorded of this bundle): the
    /// agent applies the bundle again instead, as a resync always did.
    Unavailable,
    /// The check could not finish (the API server did not answer, say); the agent
    /// keeps its report and looks again at the next resync.
    Failed(String),
    /// The resources that drifted and what was done about each, and the health of
    /// the resources read on the way (the sink reads them anyway).
    Checked {
        drift: Vec<DriftedResource>,
        health: Vec<ResourceStatus>,
    },
}

/// The marker path of a resource whose file differs from what the dir sink wrote in
/// a way no applied field shows (a comment, a field added, YAML that does not parse).
pub const FILE_CONTENT: &str = "(file content)";

/// One step of a path into an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// A map key.
    Key(&'a str),
    /// The item of a list whose `name` is this.
    Named(&'a str),
    /// The item of a list at this index.
    Index(usize),
}

/// Calls `visit` with the path and value of every leaf of `applied`, in a fixed order
/// (the same object always gives the same order).
pub fn leaves<'a>(applied: &'a Value, mut visit: impl FnMut(&[Step<'a>], &'a Value)) {
    let Some(map) = applied.as_object() else {
        return;
    };
    let mut path = Vec::new();
    for (key, value) in map {
        match key.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                let Some(metadata) = value.as_object() else {
                    continue;
                };
                path.push(Step::Key("metadata"));
                for (field, value) in metadata {
                    if field == "name"
                        || field == "namespace"
                        || super::SERVER_SET_METADATA.contains(&field.as_str())
                    {
                        continue;
                    }
                    path.push(Step::Key(field));
                    walk(value, &mut path, &mut visit);
                    path.pop();
                }
                path.pop();
            }
            _ => {
                path.push(Step::Key(key));
                walk(value, &mut path, &mut visit);
                path.pop();
            }
        }
    }
}

fn walk<'a>(
    value: &'a Value,
    path: &mut Vec<Step<'a>>,
    visit: &mut impl FnMut(&[Step<'a>], &'a Value),
) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                path.push(Step::Key(key));
                walk(child, path, visit);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
            let named = items.iter().all(|item| item["name"].is_string());
            for (index, item) in items.iter().enumerate() {
                path.push(match item["name"].as_str() {
                    Some(name) if named => Step::Named(name),
                    _ => Step::Index(index),
                });
                walk(item, path, visit);
                path.pop();
            }
        }
        _ => visit(path, value),
    }
}

/// The value at `path` in `object`, if there is one.
pub fn lookup<'v>(object: &'v Value, path: &[Step<'_>]) -> Option<&'v Value> {
    path.iter().try_fold(object, |node, step| match *step {
        Step::Key(key) => node.as_object()?.get(key),
        Step::Named(name) => node
            .as_array()?
            .iter()
            .find(|item| item["name"].as_str() == Some(name)),
        Step::Index(index) => node.as_array()?.get(index),
    })
}

/// A path as the report shows it: `spec.template.spec.containers[name=web].image`.
pub fn format_path(path: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) if key.is_empty() || key.contains(['.', '[', ']', '"']) => {
                out.push_str(&format!("[{}]", Value::String((*key).to_string())));
            }
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Named(name) => out.push_str(&format!("[name={name}]")),
            Step::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// The hash of what is at a leaf: an empty map counts by its presence alone (fields
/// others add under it are theirs), anything else by its value; nothing there has a
/// hash of its own.
fn leaf_hash(value: Option<&Value>) -> u64 {
    let mut hasher = DefaultHasher::new();
    match value {
        None => hasher.write_u8(0),
        Some(Value::Object(_)) => hasher.write_u8(1),
        Some(value) => {
            hasher.write_u8(2);
            let _ = serde_json::to_writer(HashWriter(&mut hasher), value);
        }
    }
    hasher.finish()
}

struct HashWriter<'h>(&'h mut DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the server answered for one applied object, at the applied leaves: a hash of
/// the applied object (so a fingerprint is only ever compared against the object it
/// was taken for) and one hash per leaf, in [`leaves`] order. Eight bytes a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    applied: u64,
    answer: Box<[u64]>,
}

impl Fingerprint {
    /// The fingerprint of `answer`, the object the server returned for `applied`.
    pub fn of(applied: &Value, answer: &Value) -> Fingerprint {
        let mut hashes = Vec::new();
        leaves(applied, |path, _| {
            hashes.push(leaf_hash(lookup(answer, path)))
        });
        Fingerprint {
            applied: object_hash(applied),
            answer: hashes.into_boxed_slice(),
        }
    }

    /// Whether this fingerprint was taken for this applied object.
    pub fn is_of(&self, applied: &Value) -> bool {
        self.applied == object_hash(applied)
    }

    /// The paths of the applied leaves whose value in `live` differs from the
    /// answer's. `None` when the fingerprint is not of `applied`.
    pub fn drifted(&self, applied: &Value, live: &Value) -> Option<Vec<String>> {
        if !self.is_of(applied) {
            return None;
        }
        let mut drifted = Vec::new();
        let mut index = 0;
        leaves(applied, |path, _| {
            if self.answer.get(index) != Some(&leaf_hash(lookup(live, path))) {
                drifted.push(format_path(path));
            }
            index += 1;
        });
        Some(drifted)
    }
}

fn object_hash(value: &Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    let _ = serde_json::to_writer(HashWriter(&mut hasher), value);
    hasher.finish()
}

/// The paths of the applied leaves whose value in `found` differs from `applied`'s
/// (for a sink that compares with what it wrote, not with an answer).
pub fn differing_paths(applied: &Value, found: &Value) -> Vec<String> {
    let mut drifted = Vec::new();
    leaves(applied, |path, value| {
        if leaf_hash(Some(value)) != leaf_hash(lookup(found, path)) {
            drifted.push(format_path(path));
        }
    });
    drifted
}

/// The field managers other than `me` that own at least one of the leaves of
/// `applied` at `paths` in the live object's `metadata.managedFields`, sorted.
pub fn owners(live: &Value, applied: &Value, paths: &[String], me: &str) -> Vec<String> {
    let wanted: HashSet<&str> = paths.iter().map(String::as_str).collect();
    let mut steps: Vec<Vec<Step<'_>>> = Vec::new();
    leaves(applied, |path, _| {
        if wanted.contains(format_path(path).as_str()) {
            steps.push(path.to_vec());
        }
    });
    let mut managers: Vec<String> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let manager = entry["manager"].as_str()?;
            let owns = manager != me
                && steps
                    .iter()
                    .any(|path| owns(&entry["fieldsV1"], live, path));
            owns.then(|| manager.to_string())
        })
        .collect();
    managers.sort();
    managers.dedup();
    managers
}

/// Whether a `fieldsV1` set holds the field at `path` of `live`: `f:key` for map keys,
/// `k:{"name":"web"}` for keyed list items (any key fields, matched against the live
/// item), `v:` for set items. A field owned as a whole (an empty set where the path
/// goes on: an atomic list or map) holds everything under it.
fn owns(fields: &Value, live: &Value, path: &[Step<'_>]) -> bool {
    let mut node = fields;
    let mut object = Some(live);
    for (depth, step) in path.iter().enumerate() {
        let Some(map) = node.as_object() else {
            return false;
        };
        if depth > 0 && map.is_empty() {
            return true;
        }
        let item = object.and_then(|o| lookup(o, std::slice::from_ref(step)));
        let child = match *step {
            Step::Key(key) => map.get(&format!("f:{key}")),
            Step::Named(_) | Step::Index(_) => item.and_then(|item| list_member(map, item)),
        };
        match child {
            Some(child) => node = child,
            None => return false,
        }
        object = item;
    }
    true
}

/// The member of a fieldsV1 list set that names `item`.
fn list_member<'f>(set: &'f serde_json::Map<String, Value>, item: &Value) -> Option<&'f Value> {
    set.iter().find_map(|(member, child)| {
        if let Some(keys) = member.strip_prefix("k:") {
            let keys: Value = serde_json::from_str(keys).ok()?;
            let keys = keys.as_object()?;
            (!keys.is_empty() && keys.iter().all(|(k, v)| item.get(k) == Some(v))).then_some(child)
        } else if let Some(value) = member.strip_prefix("v:") {
            (serde_json::from_str::<Value>(value).ok()? == *item).then_some(child)
        } else {
            None
        }
    })
}

/// What a sink found about one resource: the paths that drifted, or that it is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub fields: Vec<String>,
    pub deleted: bool,
}

impl Found {
    /// The line of the report, never a value.
    pub fn report(
        self,
        key: &ResourceKey,
        managers: Vec<String>,
        action: DriftAction,
    ) -> DriftedResource {
        DriftedResource {
            group: key.group().to_string(),
            kind: key.kind().to_string(),
            namespace: key.namespace().to_string(),
            name: key.name().to_string(),
            fields: self.fields,
            managers,
            deleted: self.deleted,
            action,
        }
    }

    /// The marks it leaves in a resource's memory: one per path, or one for "gone".
    fn marks(&self) -> HashSet<u64> {
        if self.deleted {
            return HashSet::from([leaf_hash(None)]);
        }
        self.fields
            .iter()
            .map(|field| {
                let mut hasher = DefaultHasher::new();
                hasher.write(field.as_bytes());
                hasher.finish()
            })
            .collect()
    }
}

/// What the agent remembers of past checks: per resource, what it corrected at the
/// last check, and whether another manager fights over it. Forgotten when the
/// bundle's digest changes.
#[derive(Debug, Default)]
pub struct Memory {
    digest: Option<Digest>,
    resources: HashMap<ResourceKey, Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    /// What the last check corrected (hashes of paths).
    corrected: HashSet<u64>,
    fighting: bool,
    /// The report line the last check logged for it.
    said: Option<DriftedResource>,
}

impl Memory {
    /// Starts a check of the bundle with this digest: a new digest forgets the past.
    pub fn start(&mut self, digest: &Digest) {
        if self.digest.as_ref() != Some(digest) {
            self.digest = Some(digest.clone());
            self.resources.clear();
        }
    }

    /// Decides what to do with a drifted resource under `policy`: `Corrected` means
    /// "correct it" (the sink then calls [`Memory::corrected`] if it could).
    pub fn decide(&mut self, key: &ResourceKey, policy: DriftPolicy, found: &Found) -> DriftAction {
        let remembered = self.resources.entry(key.clone()).or_default();
        let previous = std::mem::take(&mut remembered.corrected);
        if policy == DriftPolicy::Report {
            return DriftAction::Reported;
        }
        if !remembered.fighting && !previous.is_disjoint(&found.marks()) {
            remembered.fighting = true;
            tracing::warn!(
                resource = %key, fields = %found.fields.join(","), deleted = found.deleted,
                "changed again right after flotilla corrected it: another manager fights over it; \
                 reported, and no longer corrected until the bundle changes"
            );
        }
        if remembered.fighting {
            DriftAction::Fighting
        } else {
            DriftAction::Corrected
        }
    }

    /// Records that `found` was corrected at this check.
    pub fn corrected(&mut self, key: &ResourceKey, found: &Found) {
        self.resources.entry(key.clone()).or_default().corrected = found.marks();
    }

    /// Records that the resource did not drift at this check.
    pub fn settled(&mut self, key: &ResourceKey) {
        if let Some(remembered) = self.resources.get_mut(key) {
            remembered.corrected.clear();
            remembered.said = None;
            if !remembered.fighting {
                self.resources.remove(key);
            }
        }
    }

    /// The level at which this check's line for a drifted resource is logged: `info`
    /// when it was corrected, `warn` when it is left, and `debug` when the last check
    /// logged the same line (drift left on the cluster is said once, not at every
    /// resync; it is said again once it changes, or after it went away and came back).
    pub fn level(&mut self, drifted: &DriftedResource) -> tracing::Level {
        let remembered = self.resources.entry(drifted.key()).or_default();
        if remembered.said.as_ref() == Some(drifted) {
            return tracing::Level::DEBUG;
        }
        remembered.said = Some(drifted.clone());
        match drifted.action {
            DriftAction::Corrected => tracing::Level::INFO,
            _ => tracing::Level::WARN,
        }
    }

    /// Logs one drifted resource at its [`Memory::level`]: its identity, paths and
    /// managers, never values.
    pub fn log(&mut self, drifted: &DriftedResource) {
        let resource = drifted.key();
        let fields = drifted.fields.join(",");
        let managers = drifted.managers.join(",");
        let deleted = drifted.deleted;
        let action = drifted.action;
        let message = match action {
            DriftAction::Corrected => "drift corrected",
            _ => "drift left on the cluster",
        };
        match self.level(drifted) {
            tracing::Level::INFO => {
                tracing::info!(%resource, %fields, %managers, deleted, %action, "{message}")
            }
            tracing::Level::WARN => {
                tracing::warn!(%resource, %fields, %managers, deleted, %action, "{message}")
            }
            _ => tracing::debug!(
                %resource, %fields, %managers, deleted, %action,
                "{message} (as at the last check)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(applied: &Value) -> Vec<String> {
        let mut out = Vec::new();
        leaves(applied, |path, _| out.push(format_path(path)));
        out
    }

    fn deployment(image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "demo", "resourceVersion": "7",
                            "labels": {"app.kubernetes.io/name": "web"}},
               "spec": {"replicas": 2, "template": {"spec": {
                   "containers": [{"name": "web", "image": image, "args": ["-v", "1"]}],
                   "tolerations": [{"key": "a"}],
                   "volumes": []}}},
               "status": {"replicas": 2}})
    }

    #[test]
    fn leaves_are_named_by_dotted_paths_with_keyed_list_items() {
        assert_eq!(
            paths(&deployment("nginx:1")),
            [
                r#"metadata.labels["app.kubernetes.io/name"]"#,
                "spec.replicas",
                "spec.template.spec.containers[name=web].args",
                "spec.template.spec.containers[name=web].image",
                "spec.template.spec.containers[name=web].name",
                "spec.template.spec.tolerations[0].key",
                "spec.template.spec.volumes",
            ]
        );
    }

    #[test]
    fn drift_is_a_difference_from_the_answer_at_the_applied_leaves() {
        let applied = deployment("nginx:1");
        // A webhook rewrote the image on apply, and the server set fields of its own.
        let mut answer = deployment("mirror/nginx:1");
        answer["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        let fingerprint = Fingerprint::of(&applied, &answer);
        let mut live = answer.clone();
        live["spec"]["strategy"] = json!({"type": "Recreate"});
        live["metadata"]["resourceVersion"] = json!("9");
        live["status"] = json!({"replicas": 1});
        assert_eq!(fingerprint.drifted(&applied, &live), Some(vec![]));
        live["spec"]["replicas"] = json!(5);
        live["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["-v"]);
        assert_eq!(
            fingerprint.drifted(&applied, &live),
            Some(vec![
                "spec.replicas".to_string(),
                "spec.template.spec.containers[name=web].args".to_string()
            ])
        );
        // A fingerprint is only compared with the object it was taken for.
        assert_eq!(fingerprint.drifted(&deployment("nginx:2"), &live), None);
    }

    #[test]
    fn the_managers_of_drifted_paths_come_from_managed_fields() {
        let applied = deployment("nginx:1");
        let mut live = deployment("nginx:2");
        live["metadata"]["managedFields"] = json!([
            {"manager": "flotilla", "operation": "Apply", "fieldsV1": {
                "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}}},
            {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {
                "f:spec": {"f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"web\"}": {"f:image": {}}}}}}}},
            {"manager": "hpa", "operation": "Update", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            {"manager": "atomic", "operation": "Update", "fieldsV1": {
                "f:spec": {"f:template": {"f:spec": {"f:tolerations": {}}}}}}
        ]);
        let image = ["spec.template.spec.containers[name=web].image".to_string()];
        assert_eq!(
            owners(&live, &applied, &image, "flotilla"),
            ["kubectl-edit"]
        );
        let replicas = ["spec.replicas".to_string()];
        assert_eq!(owners(&live, &applied, &replicas, "flotilla"), ["hpa"]);
        let toleration = ["spec.template.spec.tolerations[0].key".to_string()];
        assert_eq!(owners(&live, &applied, &toleration, "flotilla"), ["atomic"]);
        assert!(owners(&live, &applied, &[], "flotilla").is_empty());
    }

    #[test]
    fn a_path_drifting_again_right_after_a_correction_is_fought_over() {
        let key = ResourceKey::of(&deployment("x")).expect("identity");
        let replicas = Found {
            fields: vec!["spec.replicas".into()],
            deleted: false,
        };
        let image = Found {
            fields: vec!["spec.template.spec.containers[name=web].image".into()],
            deleted: false,
        };
        let mut memory = Memory::default();
        memory.start(&Digest::of(b"a"));
        assert_eq!(
            memory.decide(&key, DriftPolicy::Report, &replicas),
            DriftAction::Reported
        );
        assert_eq!(
            memory.decide(&key, DriftPolicy::Correct, &replicas),
            DriftAction::Corrected
        );
        memory.corrected(&key, &replicas);
        // Another path at the next check is drift of its own.
        assert_eq!(
            memory.decide(&key, DriftPolicy::Correct, &image),
            DriftAction::Corrected
        );
        memory.corrected(&key, &image);
        memory.settled(&key);
        assert_eq!(
            memory.decide(&key, DriftPolicy::Correct, &image),
            DriftAction::Corrected
        );
        memory.corrected(&key, &image);
        // The same path again: fighting, and it stays so.
        assert_eq!(
            memory.decide(&key, DriftPolicy::Correct, &image),
            DriftAction::Fighting
        );
        memory.settled(&key);
        assert_eq!(
            memory.decide(&key, DriftPolicy::Correct, &replicas),
            DriftAction::Fighting
        );
        // Until the bundle changes.
        memory.start(&Digest::of(b"b"));
        assert_eq!(
            memory.decide(&key, DriftPolicy::Correct, &image),
            DriftAction::Corrected
        );
    }

    #[test]
    fn drift_left_on_the_cluster_is_said_once_then_at_debug_until_it_changes() {
        use tracing::Level;
        let key = ResourceKey::of(&deployment("x")).expect("identity");
        let found = |field: &str| Found {
            fields: vec![field.to_string()],
            deleted: false,
        };
        let line =
            |field: &str, action| found(field).report(&key, vec!["kubectl-edit".into()], action);
        let mut memory = Memory::default();
        memory.start(&Digest::of(b"a"));
        let check = |memory: &mut Memory, field: &str, policy| {
            let action = memory.decide(&key, policy, &found(field));
            memory.level(&line(field, action))
        };
        // Left under `report`: said at warn once, then at debug at every resync.
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Report),
            Level::WARN
        );
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Report),
            Level::DEBUG
        );
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Report),
            Level::DEBUG
        );
        // Another field drifts too: the line changed, so it is said again.
        assert_eq!(
            check(&mut memory, "spec.paused", DriftPolicy::Report),
            Level::WARN
        );
        // Gone, then back: said again.
        memory.settled(&key);
        assert_eq!(
            check(&mut memory, "spec.paused", DriftPolicy::Report),
            Level::WARN
        );
        // Corrected at info; the same field back right after is fought over: warn once.
        memory.settled(&key);
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Correct),
            Level::INFO
        );
        memory.corrected(&key, &found("spec.replicas"));
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Correct),
            Level::WARN
        );
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Correct),
            Level::DEBUG
        );
        // A new bundle forgets what was said.
        memory.start(&Digest::of(b"b"));
        assert_eq!(
            check(&mut memory, "spec.replicas", DriftPolicy::Report),
            Level::WARN
        );
    }
}
