//! The fleet repository's own kinds (apiVersion `flotilla.dev/v1alpha1`): Cluster,
//! Group, Workload and Overlay, as serde types with JSON Schemas, and Kubernetes
//! label selectors.
//!
//! These types only describe documents; reading them from files, with file and line
//! in every error, is done by [`crate::render::load`].

mod selector;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use selector::{LabelSelector, Operator, Requirement, SelectorParseError, parse_selector};

/// Free-form variables, merged deeply (maps merge, everything else is replaced).
pub type Vars = Map<String, Value>;

/// A string with the line it was read from, so later checks can point at it.
pub type Located<T> = serde_saphyr::Spanned<T>;

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The object's name. For a Cluster it must equal the file stem, for a Workload
    /// the folder name.
    pub name: String,
    /// Labels; on a Cluster these are what groups and selectors match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Free-form notes for humans; flotilla ignores them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `clusters/<name>.yaml`: one edge cluster.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Cluster")]
pub struct ClusterDoc {
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    #[schemars(extend("const" = "Cluster"))]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: ClusterSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Variables for templates; they override workload and group variables.
    #[serde(default)]
    pub vars: Vars,
}

/// `groups/<name>.yaml`: a named set of clusters chosen by a label selector.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Group")]
pub struct GroupDoc {
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    #[schemars(extend("const" = "Group"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: GroupSpec,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupSpec {
    /// Which clusters belong to the group (Kubernetes label-selector semantics; `{}`
    /// selects every cluster).
    pub selector: LabelSelector,
    /// Variables for the group's members; they override workload variables.
    #[serde(default)]
    pub vars: Vars,
}

/// `workloads/<name>/workload.yaml`: a set of manifests and where they go.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Workload")]
pub struct WorkloadDoc {
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    #[schemars(extend("const" = "Workload"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: WorkloadSpec,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// The namespace given to namespaced resources that name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Where the workload goes: a cluster is targeted if any entry matches it.
    #[serde(default)]
    #[schemars(with = "Vec<Target>")]
    pub targets: Vec<Located<Target>>,
    /// Default variables for the workload's templates.
    #[serde(default)]
    pub vars: Vars,
}

/// One entry of `spec.targets`: exactly one of `group`, `cluster` or `clusterSelector`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Target {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
}

/// `overlays/**/*.yaml`: changes applied to the workloads of the clusters it selects.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Overlay")]
pub struct OverlayDoc {
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    #[schemars(extend("const" = "Overlay"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: OverlaySpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OverlaySpec {
    /// Cluster names this overlay selects.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub clusters: Vec<Located<String>>,
    /// Group names whose members this overlay selects.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub groups: Vec<Located<String>>,
    /// A label selector over clusters; `{}` selects every cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// Workload names this overlay applies to; absent means every workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<String>>")]
    pub workloads: Option<Vec<Located<String>>>,
    /// Overlays apply in ascending priority, then by name; later ones win.
    #[serde(default)]
    pub priority: i64,
    /// Variables that override the workload's, the groups' and the cluster's.
    #[serde(default)]
    pub vars: Vars,
    /// Image overrides with kustomize `images` semantics.
    #[serde(default)]
    pub images: Vec<ImageOverride>,
    /// Patches applied to the resources their target selects.
    #[serde(default)]
    #[schemars(with = "Vec<Patch>")]
    pub patches: Vec<Located<Patch>>,
    /// Labels added to every resource's metadata.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to every resource's metadata.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A kustomize-style image override: the containers whose image name equals `name`
/// get a new name, a new tag, or a digest.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageOverride {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A patch: a target and exactly one of `ops` (RFC 6902) or `merge` (RFC 7396).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Patch {
    /// Which resources the patch applies to; absent means every resource.
    #[serde(default)]
    pub target: PatchTarget,
    /// An RFC 6902 JSON Patch: a list of operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<Value>>,
    /// An RFC 7396 JSON Merge Patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<Value>,
}

/// kustomize patch-target semantics: every field given must match; `name` and
/// `namespace` are anchored regular expressions, `labelSelector` and
/// `annotationSelector` use the Kubernetes selector syntax (`app=web,tier in (a,b)`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PatchTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_selector: Option<String>,
}

/// The JSON Schemas of the four kinds, by file name under `schemas/`.
pub fn schemas() -> Vec<(&'static str, Value)> {
    fn schema<T: JsonSchema>() -> Value {
        serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
    }
    vec![
        ("cluster.json", schema::<ClusterDoc>()),
        ("group.json", schema::<GroupDoc>()),
        ("workload.json", schema::<WorkloadDoc>()),
        ("overlay.json", schema::<OverlayDoc>()),
    ]
}
