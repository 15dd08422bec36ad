//! The objects the fake holds, and the field ownership that server-side apply keeps
//! for them (`metadata.managedFields`).
//!
//! Ownership is kept per leaf field, as structured-merge-diff keeps it, with one
//! simplification: a list is one leaf (the fake does not merge lists by key). That is
//! enough for what flotilla's tests need: conflicts with another manager (409), fields
//! a manager stops applying being removed, `force` taking fields over.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// Where an object is kept: API group, plural resource, namespace (`""` when
/// cluster-scoped) and name. Versions share storage, as they do in etcd.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub name: String,
}

/// How a manager last wrote its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

/// The fields one manager owns.
#[derive(Debug, Clone)]
pub struct Owner {
    pub operation: Operation,
    pub api_version: String,
    pub paths: BTreeSet<FieldPath>,
}

/// A path to a leaf field, one element per map key.
pub type FieldPath = Vec<String>;

/// One stored object.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The object as stored, without `metadata.managedFields` (rendered on output).
    pub object: Value,
    pub owners: BTreeMap<String, Owner>,
    /// For a CustomResourceDefinition: reads left before it is Established.
    pub establish_in: Option<u32>,
}

impl Stored {
    /// The object as the API returns it, with `metadata.managedFields`.
    pub fn render(&self) -> Value {
        let mut object = self.object.clone();
        let entries: Vec<Value> = self
            .owners
            .iter()
            .map(|(manager, owner)| {
                let mut fields = Map::new();
                for path in &owner.paths {
                    let mut node = &mut fields;
                    for key in path {
                        let entry = node
                            .entry(format!("f:{key}"))
                            .or_insert_with(|| Value::Object(Map::new()));
                        if !entry.is_object() {
                            *entry = Value::Object(Map::new());
                        }
                        node = match entry.as_object_mut() {
                            Some(map) => map,
                            None => break,
                        };
                    }
                }
                json!({"manager": manager,
                       "operation": if owner.operation == Operation::Apply { "Apply" } else { "Update" },
                       "apiVersion": owner.api_version, "time": TIMESTAMP,
                       "fieldsType": "FieldsV1", "fieldsV1": Value::Object(fields)})
            })
            .collect();
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert("managedFields".into(), Value::Array(entries));
        }
        object
    }
}

/// The one time the fake's clock shows: objects are created and deleted "now".
pub const TIMESTAMP: &str = "2025-01-01T00:00:00Z";

/// Fields of `metadata` the server sets; never owned by a manager.
pub const SYSTEM_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
];

/// The leaf fields of an applied configuration and their values: everything but
/// apiVersion, kind, the system fields of metadata and, when the kind has a status
/// subresource, status (which the main resource resets).
pub fn leaves(config: &Value, skip_status: bool) -> Vec<(FieldPath, Value)> {
    let mut out = Vec::new();
    if let Some(map) = config.as_object() {
        for (key, value) in map {
            match key.as_str() {
                "apiVersion" | "kind" => {}
                "status" if skip_status => {}
                "metadata" => {
                    if let Some(metadata) = value.as_object() {
                        for (mk, mv) in metadata {
                            if !SYSTEM_METADATA.contains(&mk.as_str()) {
                                flatten(mv, vec!["metadata".into(), mk.clone()], &mut out);
                            }
                        }
                    }
                }
                _ => flatten(value, vec![key.clone()], &mut out),
            }
        }
    }
    out
}

fn flatten(value: &Value, path: FieldPath, out: &mut Vec<(FieldPath, Value)>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (key, child) in map {
                let mut next = path.clone();
                next.push(key.clone());
                flatten(child, next, out);
            }
        }
        _ => out.push((path, value.clone())),
    }
}

/// A field path as the API server prints it: `.spec.replicas`.
pub fn print_path(path: &FieldPath) -> String {
    path.iter().map(|key| format!(".{key}")).collect()
}

pub fn get_path<'v>(value: &'v Value, path: &FieldPath) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, key| node.get(key))
}

pub fn remove_path(value: &mut Value, path: &FieldPath) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = value;
    for key in parents {
        match node.get_mut(key) {
            Some(child) => node = child,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
    }
}

/// Merges `config` into `live`: maps key by key, anything else replaced.
pub fn merge(live: &mut Value, config: &Value) {
    match (live.as_object_mut(), config.as_object()) {
        (Some(live_map), Some(config_map)) => {
            for (key, value) in config_map {
                match live_map.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        live_map.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        _ => *live = config.clone(),
    }
}

/// The label-value rule of `staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go`
/// (`IsValidLabelValue`): at most 63 characters, alphanumerics, `-`, `_` and `.`,
/// starting and ending with an alphanumeric. Returns the error text, if any.
pub fn label_value_error(value: &str) -> Option<String> {
    if value.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let valid = value.is_empty()
        || (value.starts_with(alnum)
            && value.ends_with(alnum)
            && value
                .chars()
                .all(|c| alnum(c) || matches!(c, '-' | '_' | '.')));
    (!valid).then(|| {
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', \
         and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', \
         regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_skip_what_the_server_owns() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "d", "resourceVersion": "4", "labels": {"a": "1"}},
            "data": {"k": "v", "e": {}}, "status": {"x": 1}});
        let paths: Vec<String> = leaves(&config, true)
            .iter()
            .map(|(p, _)| print_path(p))
            .collect();
        assert_eq!(paths, [".data.e", ".data.k", ".metadata.labels.a"]);
    }

    #[test]
    fn label_values_follow_kubernetes() {
        assert_eq!(label_value_error("edge-7"), None);
        assert_eq!(label_value_error(""), None);
        assert!(label_value_error(&"a".repeat(64)).is_some());
        assert!(label_value_error("-edge").is_some());
        assert!(label_value_error("edge 7").is_some());
    }
}
