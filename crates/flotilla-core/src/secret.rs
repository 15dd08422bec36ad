//! Where a Secret's values are, so that reports and the web page can hide them all.
//!
//! A core `Secret` keeps its values under `data` (base64) and `stringData`. They can
//! also travel in its metadata: `kubectl apply` writes the whole object, values
//! included, into the annotation `kubectl.kubernetes.io/last-applied-configuration`,
//! and a manifest copied from a cluster carries it. [`revealing_metadata`] names each
//! annotation or label of a Secret that holds a value of it (as written, decoded from
//! base64 or encoded to it; values of [`MIN_COPIED_LEN`] bytes or more, since a
//! shorter one, `1` or `no`, is found in text by chance) or a JSON object with `data`
//! or `stringData` of its own (the last-applied configuration of an earlier version,
//! whose values differ).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;

use crate::bundle::api_group;

/// The fields of a Secret whose values are secret.
pub const VALUE_FIELDS: [&str; 2] = ["data", "stringData"];

/// The shortest value looked for inside annotations and labels.
pub const MIN_COPIED_LEN: usize = 4;

/// The metadata maps whose values may carry a Secret's values.
pub const METADATA_MAPS: [&str; 2] = ["annotations", "labels"];

/// Whether a resource is a core `Secret` (API group `""`).
pub fn is_secret(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some("Secret")
        && value
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| api_group(v).is_empty())
}

/// The annotations and labels of a Secret that hold one of its values, as
/// `(map, key)` with `map` one of [`METADATA_MAPS`]; none for any other resource.
pub fn revealing_metadata(resource: &Value) -> Vec<(&'static str, String)> {
    if !is_secret(resource) {
        return Vec::new();
    }
    let values = secret_values(resource);
    let mut found = Vec::new();
    for map in METADATA_MAPS {
        let Some(entries) = resource
            .get("metadata")
            .and_then(|m| m.get(map))
            .and_then(Value::as_object)
        else {
            continue;
        };
        for (key, value) in entries {
            let text = match value {
                Value::String(text) => text.as_str(),
                _ => continue,
            };
            if values.iter().any(|v| text.contains(v.as_str())) || embeds_values(text) {
                found.push((map, key.clone()));
            }
        }
    }
    found
}

/// Every value of the Secret in the forms it may be copied in: as written,
/// and `data`'s decoded from base64 (when text), `stringData`'s encoded to it.
fn secret_values(resource: &Value) -> Vec<String> {
    let mut values = Vec::new();
    for field in VALUE_FIELDS {
        let Some(entries) = resource.get(field).and_then(Value::as_object) else {
            continue;
        };
        for value in entries.values().filter_map(Value::as_str) {
            if value.is_empty() {
                continue;
            }
            values.push(value.to_string());
            if field == "data" {
                let decoded = BASE64.decode(value.as_bytes()).ok();
                if let Some(text) = decoded.and_then(|bytes| String::from_utf8(bytes).ok()) {
                    values.push(text);
                }
            } else {
                values.push(BASE64.encode(value.as_bytes()));
            }
        }
    }
    values.retain(|v| v.len() >= MIN_COPIED_LEN);
    values
}

/// Whether `text` is a JSON object with `data` or `stringData` (at its top, as in a
/// last-applied configuration): values of some version of the Secret.
fn embeds_values(text: &str) -> bool {
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') {
        return false;
    }
    serde_json::from_str::<Value>(trimmed)
        .ok()
        .and_then(|value| value.as_object().cloned())
        .is_some_and(|object| VALUE_FIELDS.iter().any(|f| object.contains_key(*f)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "s", "annotations": annotations,
                            "labels": {"app": "shop"}},
               "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "s3cr3t-token"}})
    }

    #[test]
    fn annotations_holding_a_value_in_any_form_are_named() {
        let last_applied = json!({"apiVersion": "v1", "kind": "Secret",
            "data": {"password": "b2xkLXZhbHVl"}})
        .to_string();
        let resource = secret(json!({
            "kubectl.kubernetes.io/last-applied-configuration": last_applied,
            "copied-raw": "password=aHVudGVyMg==",
            "copied-decoded": "the password is hunter2",
            "copied-encoded": "czNjcjN0LXRva2Vu",
            "copied-string": "token s3cr3t-token",
            "harmless": "owned by the shop team",
        }));
        let mut found: Vec<String> = revealing_metadata(&resource)
            .into_iter()
            .map(|(map, key)| format!("{map}/{key}"))
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                "annotations/copied-decoded",
                "annotations/copied-encoded",
                "annotations/copied-raw",
                "annotations/copied-string",
                "annotations/kubectl.kubernetes.io/last-applied-configuration",
            ]
        );
    }

    #[test]
    fn a_short_value_found_by_chance_is_not_looked_for() {
        let resource = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "annotations": {"replicas": "1 of 3", "debug": "no"}},
            "data": {"enabled": "MQ=="}, "stringData": {"debug": "no"}});
        assert!(revealing_metadata(&resource).is_empty());
    }

    #[test]
    fn only_core_secrets_are_read() {
        let mut resource = secret(json!({"copied": "hunter2"}));
        resource["kind"] = json!("ConfigMap");
        assert!(revealing_metadata(&resource).is_empty());
        let mut resource = secret(json!({"copied": "hunter2"}));
        resource["apiVersion"] = json!("example.com/v1");
        assert!(revealing_metadata(&resource).is_empty());
    }
}
