//! Field specs: which field of which kinds a transformer sets (`spec/selector` of a
//! `Service`), kustomize's default tables, and the walk that finds the fields.

use serde_json::{Map, Value};

use super::file::FieldSpecDoc;

/// A field of the kinds a spec selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    pub group: Option<String>,
    pub version: Option<String>,
    pub kind: Option<String>,
    pub path: String,
    pub create: bool,
}

impl FieldSpec {
    pub fn new(
        path: &str,
        kind: Option<&str>,
        group: Option<&str>,
        version: Option<&str>,
        create: bool,
    ) -> FieldSpec {
        FieldSpec {
            group: group.map(String::from),
            version: version.map(String::from),
            kind: kind.map(String::from),
            path: path.to_string(),
            create,
        }
    }

    pub fn from_doc(doc: &FieldSpecDoc) -> FieldSpec {
        FieldSpec {
            group: doc.group.clone().filter(|g| !g.is_empty()),
            version: doc.version.clone().filter(|v| !v.is_empty()),
            kind: doc.kind.clone().filter(|k| !k.is_empty()),
            path: doc.path.clone(),
            create: doc.create,
        }
    }

    /// Whether the spec applies to a resource of this group, version and kind.
    pub fn selects(&self, group: &str, version: &str, kind: &str) -> bool {
        self.group.as_deref().is_none_or(|g| g == group)
            && self.version.as_deref().is_none_or(|v| v == version)
            && self.kind.as_deref().is_none_or(|k| k == kind)
    }

    fn segments(&self) -> Vec<String> {
        split_path(&self.path)
    }
}

/// Adds each spec not already present (same path and kinds).
pub fn merge_all(specs: &mut Vec<FieldSpec>, more: &[FieldSpec]) {
    for spec in more {
        if !specs.iter().any(|s| {
            s.path == spec.path
                && s.group == spec.group
                && s.version == spec.version
                && s.kind == spec.kind
        }) {
            specs.push(spec.clone());
        }
    }
}

/// Splits a field path at `/`, where `\/` is a slash inside a name
/// (`metadata/annotations/example.com\/key`).
pub fn split_path(path: &str) -> Vec<String> {
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'/') => {
                current.push('/');
                chars.next();
            }
            '/' => segments.push(std::mem::take(&mut current)),
            other => current.push(other),
        }
    }
    segments.push(current);
    segments
}

/// What a missing leaf is created as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Create {
    Map,
    Scalar,
    Nothing,
}

/// Visits every value at `spec`'s path in `value` (lists on the way are entered
/// element by element), creating missing maps on the way when the spec says so.
pub fn visit(
    value: &mut Value,
    spec: &FieldSpec,
    create: Create,
    set: &mut dyn FnMut(&mut Value) -> Result<(), String>,
) -> Result<(), String> {
    let segments = spec.segments();
    walk(value, &segments, spec.create, create, set)
        .map_err(|reason| format!("field {}: {reason}", spec.path))
}

fn walk(
    value: &mut Value,
    path: &[String],
    create_missing: bool,
    create: Create,
    set: &mut dyn FnMut(&mut Value) -> Result<(), String>,
) -> Result<(), String> {
    let Some((first, rest)) = path.split_first() else {
        return set(value);
    };
    match value {
        Value::Null => Ok(()),
        Value::Array(items) => {
            for item in items {
                walk(item, path, create_missing, create, set)?;
            }
            Ok(())
        }
        Value::Object(map) => {
            let (name, is_list) = match first.strip_suffix("[]") {
                Some(name) => (name, true),
                None => (first.as_str(), false),
            };
            let wants = if !create_missing || create == Create::Nothing || is_list {
                None
            } else if rest.is_empty() {
                Some(create)
            } else {
                Some(Create::Map)
            };
            let child = match (map.get_mut(name), wants) {
                (Some(child), _) => child,
                (None, Some(kind)) => map.entry(name).or_insert(match kind {
                    Create::Map => Value::Object(Map::new()),
                    _ => Value::Null,
                }),
                (None, None) => return Ok(()),
            };
            if child.is_null() && wants == Some(Create::Map) {
                *child = Value::Object(Map::new());
            }
            walk(child, rest, create_missing, create, set)
        }
        _ => Err("expected a map or a list on the way".into()),
    }
}

fn spec(
    path: &str,
    kind: Option<&str>,
    group: Option<&str>,
    version: Option<&str>,
    create: bool,
) -> FieldSpec {
    FieldSpec::new(path, kind, group, version, create)
}

/// Where kustomize puts labels on metadata: every resource's, and the pod (and
/// claim) templates of the workload kinds.
pub fn metadata_labels() -> Vec<FieldSpec> {
    vec![
        spec("metadata/labels", None, None, None, true),
        spec(
            "spec/template/metadata/labels",
            Some("ReplicationController"),
            None,
            Some("v1"),
            true,
        ),
        spec(
            "spec/template/metadata/labels",
            Some("Deployment"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/labels",
            Some("ReplicaSet"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/labels",
            Some("DaemonSet"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/labels",
            Some("StatefulSet"),
            Some("apps"),
            None,
            true,
        ),
        spec(
            "spec/volumeClaimTemplates[]/metadata/labels",
            Some("StatefulSet"),
            Some("apps"),
            None,
            true,
        ),
        spec(
            "spec/template/metadata/labels",
            Some("Job"),
            Some("batch"),
            None,
            true,
        ),
        spec(
            "spec/jobTemplate/metadata/labels",
            Some("CronJob"),
            Some("batch"),
            None,
            true,
        ),
        spec(
            "spec/jobTemplate/spec/template/metadata/labels",
            Some("CronJob"),
            Some("batch"),
            None,
            true,
        ),
    ]
}

/// `commonLabels` (and `labels` with `includeSelectors`): metadata, templates, and
/// the selectors that must keep selecting the labelled pods.
pub fn common_labels() -> Vec<FieldSpec> {
    let mut specs = vec![
        spec("spec/selector", Some("Service"), None, Some("v1"), true),
        spec(
            "spec/selector",
            Some("ReplicationController"),
            None,
            Some("v1"),
            true,
        ),
        spec(
            "spec/selector/matchLabels",
            Some("Deployment"),
            None,
            None,
            true,
        ),
    ];
    let affinity = [
        "spec/template/spec/affinity/podAffinity/preferredDuringSchedulingIgnoredDuringExecution/podAffinityTerm/labelSelector/matchLabels",
        "spec/template/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/labelSelector/matchLabels",
        "spec/template/spec/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/podAffinityTerm/labelSelector/matchLabels",
        "spec/template/spec/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution/labelSelector/matchLabels",
        "spec/template/spec/topologySpreadConstraints/labelSelector/matchLabels",
    ];
    for path in affinity {
        specs.push(spec(path, Some("Deployment"), Some("apps"), None, false));
    }
    specs.push(spec(
        "spec/selector/matchLabels",
        Some("ReplicaSet"),
        None,
        None,
        true,
    ));
    specs.push(spec(
        "spec/selector/matchLabels",
        Some("DaemonSet"),
        None,
        None,
        true,
    ));
    specs.push(spec(
        "spec/selector/matchLabels",
        Some("StatefulSet"),
        Some("apps"),
        None,
        true,
    ));
    for path in affinity {
        specs.push(spec(path, Some("StatefulSet"), Some("apps"), None, false));
    }
    specs.extend([
        spec(
            "spec/selector/matchLabels",
            Some("Job"),
            Some("batch"),
            None,
            false,
        ),
        spec(
            "spec/jobTemplate/spec/selector/matchLabels",
            Some("CronJob"),
            Some("batch"),
            None,
            false,
        ),
        spec(
            "spec/selector/matchLabels",
            Some("PodDisruptionBudget"),
            Some("policy"),
            None,
            false,
        ),
        spec(
            "spec/podSelector/matchLabels",
            Some("NetworkPolicy"),
            Some("networking.k8s.io"),
            None,
            false,
        ),
        spec(
            "spec/ingress/from/podSelector/matchLabels",
            Some("NetworkPolicy"),
            Some("networking.k8s.io"),
            None,
            false,
        ),
        spec(
            "spec/egress/to/podSelector/matchLabels",
            Some("NetworkPolicy"),
            Some("networking.k8s.io"),
            None,
            false,
        ),
    ]);
    specs.extend(metadata_labels());
    specs
}

/// `commonAnnotations`: metadata, and the pod templates of the workload kinds.
pub fn common_annotations() -> Vec<FieldSpec> {
    vec![
        spec("metadata/annotations", None, None, None, true),
        spec(
            "spec/template/metadata/annotations",
            Some("ReplicationController"),
            None,
            Some("v1"),
            true,
        ),
        spec(
            "spec/template/metadata/annotations",
            Some("Deployment"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/annotations",
            Some("ReplicaSet"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/annotations",
            Some("DaemonSet"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/annotations",
            Some("StatefulSet"),
            None,
            None,
            true,
        ),
        spec(
            "spec/template/metadata/annotations",
            Some("Job"),
            Some("batch"),
            None,
            true,
        ),
        spec(
            "spec/jobTemplate/metadata/annotations",
            Some("CronJob"),
            Some("batch"),
            None,
            true,
        ),
        spec(
            "spec/jobTemplate/spec/template/metadata/annotations",
            Some("CronJob"),
            Some("batch"),
            None,
            true,
        ),
    ]
}

/// `replicas`: the kinds with `spec.replicas` kustomize sets.
pub fn replicas() -> Vec<FieldSpec> {
    [
        "Deployment",
        "ReplicationController",
        "ReplicaSet",
        "StatefulSet",
    ]
    .into_iter()
    .map(|kind| spec("spec/replicas", Some(kind), None, None, true))
    .collect()
}

/// `namespace`, besides every namespaced resource's `metadata/namespace` and the
/// binding subjects: a v1 Namespace's name, an APIService's service, a CRD's
/// conversion webhook service (where it has one).
pub fn namespaces() -> Vec<FieldSpec> {
    vec![
        spec("metadata/name", Some("Namespace"), None, None, true),
        spec(
            "spec/service/namespace",
            Some("APIService"),
            Some("apiregistration.k8s.io"),
            None,
            true,
        ),
        spec(
            "spec/conversion/webhook/clientConfig/service/namespace",
            Some("CustomResourceDefinition"),
            None,
            None,
            false,
        ),
    ]
}

/// `images`, besides the search for `containers` and `initContainers` anywhere.
pub fn images() -> Vec<FieldSpec> {
    [
        "spec/containers[]/image",
        "spec/initContainers[]/image",
        "spec/template/spec/containers[]/image",
        "spec/template/spec/initContainers[]/image",
    ]
    .into_iter()
    .map(|path| spec(path, None, None, None, true))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_split_with_escaped_slashes() {
        assert_eq!(
            split_path("metadata/annotations/example.com\\/key"),
            ["metadata", "annotations", "example.com/key"]
        );
    }

    #[test]
    fn walks_lists_and_creates_maps() {
        let mut value = json!({"spec": {"volumeClaimTemplates": [{"metadata": {}}, {}]}});
        let spec = FieldSpec::new(
            "spec/volumeClaimTemplates[]/metadata/labels",
            None,
            None,
            None,
            true,
        );
        visit(&mut value, &spec, Create::Map, &mut |labels| {
            labels
                .as_object_mut()
                .ok_or("not a map")?
                .insert("a".into(), json!("b"));
            Ok(())
        })
        .expect("walks");
        // `[]` segments are entered, not created.
        assert_eq!(
            value,
            json!({"spec": {"volumeClaimTemplates": [{"metadata": {"labels": {"a": "b"}}}, {"metadata": {"labels": {"a": "b"}}}]}})
        );
    }
}
