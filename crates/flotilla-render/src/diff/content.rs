//! How one resource is shown in a diff: its YAML (with `apiVersion`, `kind` and
//! `metadata` first, the rest in key order), with the values of a Secret's `data`
//! and `stringData`, and its annotations and labels that hold them (such as
//! `kubectl.kubernetes.io/last-applied-configuration`), replaced by markers, and a
//! unified diff of two such texts.

use std::borrow::Cow;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use similar::TextDiff;

use flotilla_core::secret::{VALUE_FIELDS, is_secret, revealing_metadata};

/// Shown instead of a Secret value that is the same on both sides (or exists on one).
pub const REDACTED: &str = "<redacted>";
/// Shown on the HEAD side instead of a Secret value that differs from BASE's.
pub const REDACTED_CHANGED: &str = "<redacted, changed>";

/// A unified diff of two versions of a resource (either may be absent), without
/// file headers, with `context` lines around each change. Secret values are replaced
/// by markers before diffing, so they cannot reach the text.
pub fn resource_diff(before: Option<&Value>, after: Option<&Value>, context: usize) -> String {
    let (before, after) = redact_pair(before, after);
    let old = before.as_deref().map(to_yaml).unwrap_or_default();
    let new = after.as_deref().map(to_yaml).unwrap_or_default();
    TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(context)
        .missing_newline_hint(false)
        .to_string()
}

/// The YAML text of a resource as a reviewer reads it.
pub fn to_yaml(value: &Value) -> String {
    let text = match value {
        Value::Object(map) => serde_saphyr::to_string(&KubernetesOrder(map)),
        other => serde_saphyr::to_string(other),
    };
    // Any JSON value can be written as YAML; should the writer refuse one anyway,
    // pretty JSON is still a readable, diffable text.
    let mut text = text.unwrap_or_else(|_| serde_json::to_string_pretty(value).unwrap_or_default());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// Serialises an object with the keys a Kubernetes reader looks for first.
struct KubernetesOrder<'a>(&'a Map<String, Value>);

const LEADING_KEYS: [&str; 3] = ["apiVersion", "kind", "metadata"];

impl Serialize for KubernetesOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for key in LEADING_KEYS {
            if let Some(value) = self.0.get(key) {
                map.serialize_entry(key, value)?;
            }
        }
        for (key, value) in self.0 {
            if !LEADING_KEYS.contains(&key.as_str()) {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// Replaces every value under a Secret's `data` and `stringData`, and every
/// annotation or label of it that holds one (see [`revealing_metadata`]), by a marker.
/// A key whose value differs between the sides shows [`REDACTED_CHANGED`] on the HEAD side,
/// so the diff says that it changed without saying what it was or became. No hash of
/// the value is shown either: a short hash of a low-entropy secret (a PIN, a port, a
/// word) is as good as the value to anyone who tries the candidates.
pub fn redact_pair<'a>(
    before: Option<&'a Value>,
    after: Option<&'a Value>,
) -> (Option<Cow<'a, Value>>, Option<Cow<'a, Value>>) {
    if !before.into_iter().chain(after).any(is_secret) {
        return (before.map(Cow::Borrowed), after.map(Cow::Borrowed));
    }
    let mut redacted_before = before.cloned();
    let mut redacted_after = after.cloned();
    // An annotation or label that holds a value on either side is hidden on both,
    // whole: it shows that it changed, not what it holds.
    let revealing: Vec<(&str, String)> = before
        .into_iter()
        .chain(after)
        .flat_map(revealing_metadata)
        .collect();
    for (map, key) in &revealing {
        let pointer = format!(
            "/metadata/{map}/{}",
            key.replace('~', "~0").replace('/', "~1")
        );
        let old = before.and_then(|v| v.pointer(&pointer));
        if let Some(value) = redacted_before
            .as_mut()
            .and_then(|v| v.pointer_mut(&pointer))
        {
            *value = redact_field(value, None);
        }
        if let Some(value) = redacted_after
            .as_mut()
            .and_then(|v| v.pointer_mut(&pointer))
        {
            *value = redact_field(value, Some(old));
        }
    }
    for field in VALUE_FIELDS {
        let old = before.and_then(|v| v.get(field));
        if let Some(value) = redacted_before.as_mut().and_then(|v| v.get_mut(field)) {
            *value = redact_field(value, None);
        }
        if let Some(value) = redacted_after.as_mut().and_then(|v| v.get_mut(field)) {
            *value = redact_field(value, Some(old));
        }
    }
    (
        redacted_before.map(Cow::Owned),
        redacted_after.map(Cow::Owned),
    )
}

/// Redacts one field. `compare_with` is `None` on the BASE side, and on the HEAD side
/// the BASE value of the same field (itself `None` when BASE has no such field or no
/// such resource).
fn redact_field(value: &Value, compare_with: Option<Option<&Value>>) -> Value {
    let marker = |new: &Value, old: Option<&Value>| {
        let changed = compare_with.is_some() && old.is_some_and(|old| old != new);
        Value::String(if changed { REDACTED_CHANGED } else { REDACTED }.to_string())
    };
    match value {
        Value::Object(entries) => {
            let old_entries = compare_with.flatten().and_then(Value::as_object);
            Value::Object(
                entries
                    .iter()
                    .map(|(key, new)| {
                        let old = old_entries.and_then(|o| o.get(key));
                        (key.clone(), marker(new, old))
                    })
                    .collect(),
            )
        }
        // Not a map (so not valid for a Secret), but it may still hold a value.
        other => marker(other, compare_with.flatten()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn yaml_puts_kubernetes_header_keys_first() {
        let text = to_yaml(&json!({
            "spec": {"replicas": 1},
            "metadata": {"name": "x"},
            "kind": "Deployment",
            "apiVersion": "apps/v1",
            "data": {"a": "b"},
        }));
        let keys: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with(' '))
            .map(|l| l.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(keys, ["apiVersion", "kind", "metadata", "data", "spec"]);
    }

    #[test]
    fn multi_line_strings_diff_line_by_line() {
        let before = json!({"data": {"conf": "a: 1\nb: 2\nc: 3\n"}});
        let after = json!({"data": {"conf": "a: 1\nb: 5\nc: 3\n"}});
        let diff = resource_diff(Some(&before), Some(&after), 0);
        assert!(diff.contains("-    b: 2\n"), "{diff}");
        assert!(diff.contains("+    b: 5\n"), "{diff}");
    }

    #[test]
    fn secret_values_become_markers_that_show_change() {
        let before = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"same": "c2FtZQ==", "old": "b2xk", "gone": "Z29uZQ=="},
            "stringData": {"token": "hunter2"}});
        let after = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"same": "c2FtZQ==", "old": "bmV3", "new": "bmV3ZXI="},
            "stringData": {"token": "hunter3"}});
        let diff = resource_diff(Some(&before), Some(&after), 10);
        for secret in ["c2FtZQ==", "b2xk", "Z29uZQ==", "bmV3", "bmV3ZXI=", "hunter"] {
            assert!(!diff.contains(secret), "{secret} leaked:\n{diff}");
        }
        assert!(diff.contains("+  old: <redacted, changed>"), "{diff}");
        assert!(diff.contains("-  old: <redacted>"), "{diff}");
        assert!(diff.contains("+  new: <redacted>"), "{diff}");
        assert!(diff.contains("-  gone: <redacted>"), "{diff}");
        assert!(diff.contains("   same: <redacted>"), "{diff}");
        assert!(diff.contains("+  token: <redacted, changed>"), "{diff}");
    }

    #[test]
    fn annotations_that_hold_secret_values_become_markers() {
        let last_applied = |password: &str| {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                   "data": {"password": password}})
            .to_string()
        };
        let secret = |password: &str| {
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "s", "annotations": {
                       "kubectl.kubernetes.io/last-applied-configuration": last_applied(password),
                       "team": "shop"}},
                   "data": {"password": password}})
        };
        // aHVudGVyMg== and aHVudGVyMw== are hunter2 and hunter3.
        let diff = resource_diff(
            Some(&secret("aHVudGVyMg==")),
            Some(&secret("aHVudGVyMw==")),
            3,
        );
        assert!(
            !diff.contains("aHVudGVy") && !diff.contains("hunter"),
            "{diff}"
        );
        assert!(
            diff.contains(
                "+    kubectl.kubernetes.io/last-applied-configuration: <redacted, changed>"
            ),
            "{diff}"
        );
        assert!(diff.contains("team: shop"), "{diff}");
    }

    #[test]
    fn only_core_secrets_are_redacted() {
        let custom = json!({"apiVersion": "example.com/v1", "kind": "Secret", "data": {"a": "b"}});
        assert!(!is_secret(&custom));
        assert!(is_secret(
            &json!({"apiVersion": "v1", "kind": "Secret", "data": {}})
        ));
        assert!(to_yaml(&custom).contains("a: b"));
    }

    #[test]
    fn a_secret_field_that_is_not_a_map_is_redacted_whole() {
        let before = json!({"apiVersion": "v1", "kind": "Secret", "data": "aGVsbG8="});
        let after = json!({"apiVersion": "v1", "kind": "Secret", "data": "d29ybGQ="});
        let diff = resource_diff(Some(&before), Some(&after), 3);
        assert!(
            !diff.contains("aGVsbG8=") && !diff.contains("d29ybGQ="),
            "{diff}"
        );
        assert!(diff.contains("+data: <redacted, changed>"), "{diff}");
    }
}
