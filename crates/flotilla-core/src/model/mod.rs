//! The fleet repository's own kinds (apiVersion `flotilla.dev/v1alpha1`): Cluster,
//! Group, Workload, Overlay and RolloutPolicy, as serde types with JSON Schemas, and
//! Kubernetes label selectors.
//!
//! These types only describe documents; reading them from files, with file and line
//! in every error, is done by `flotilla_render`'s loader.

mod rollout_policy;
mod selector;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use rollout_policy::{
    FailurePolicy, OfflinePolicy, RolloutPolicyDoc, RolloutPolicySpec, WaveSpec, Weekday,
    WindowSpec,
};
pub use selector::{LabelSelector, Operator, Requirement, SelectorParseError, parse_selector};

/// Free-form variables, merged deeply (maps merge, everything else is replaced).
pub type Vars = Map<String, Value>;

/// A string with the line it was read from, so later checks can point at it.
pub type Located<T> = serde_saphyr::Spanned<T>;

/// The name, labels and annotations of a Cluster, Group, Workload or Overlay.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// The object's name. For a Cluster or a Group it must equal the file stem, for
    /// a Workload the folder name; overlay names must be unique.
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
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `Cluster`.
    #[schemars(extend("const" = "Cluster"))]
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: ClusterSpec,
}

/// What a cluster brings to the templates of the workloads it runs.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Variables for templates; they override workload and group variables.
    #[serde(default)]
    pub vars: Vars,
    /// A paused cluster keeps the digest it is served: no rollout and no new render
    /// reaches it until this is false again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The Kubernetes version and API versions Helm charts see as `.Capabilities`
    /// for this cluster; the fleet settings' `spec.kubernetes` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSpec>,
    /// The public key (`age1…`) of this cluster's agent, which it prints at its first
    /// start: its Secrets are sealed to it in every bundle, so only that agent can
    /// read their values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_key: Option<String>,
}

/// What a cluster's API server offers, as Helm charts see it in `.Capabilities`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSpec {
    /// The server's version, `1.31.4` or `v1.31.4` (`.Capabilities.KubeVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// API versions beyond the built-in ones, `monitoring.coreos.com/v1` or
    /// `monitoring.coreos.com/v1/ServiceMonitor`
    /// (`.Capabilities.APIVersions.Has`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_versions: Vec<String>,
}

/// `flotilla.yaml` at the fleet root: fleet-wide settings, each with a default, so
/// the file is optional.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "FleetSettings")]
pub struct FleetSettingsDoc {
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `FleetSettings`.
    #[schemars(extend("const" = "FleetSettings"))]
    pub kind: String,
    /// Only `name` is read (any name will do); labels and annotations are notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(default)]
    pub spec: FleetSettings,
}

/// The fleet-wide settings.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetSettings {
    /// How rendered resources are checked against their kinds' schemas: `strict`
    /// (a problem is an error), `warn` (the default) or `off`.
    #[serde(default)]
    pub validation: Validation,
    /// Whether every cluster that receives a Secret must name its agent's key
    /// (`spec.agentKey`); default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_agent_keys: bool,
    /// What Helm charts see as `.Capabilities` on clusters whose file names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSpec>,
}

/// `spec.validation` of the fleet settings.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Validation {
    Strict,
    #[default]
    Warn,
    Off,
}

/// `groups/<name>.yaml`: a named set of clusters chosen by a label selector.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Group")]
pub struct GroupDoc {
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `Group`.
    #[schemars(extend("const" = "Group"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: GroupSpec,
}

/// Which clusters a group holds, and the variables it gives them.
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
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `Workload`.
    #[schemars(extend("const" = "Workload"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: WorkloadSpec,
}

/// Where a workload goes, and its defaults.
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
    /// A Helm chart this workload renders, per cluster, as `helm template` would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<HelmSpec>,
    /// Workloads applied before this one on every cluster both target: the agent
    /// applies this workload once theirs are healthy. Each must target every cluster
    /// this one targets; a cycle is an error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub depends_on: Vec<Located<String>>,
    /// What the agent does when an object of this workload is changed on the cluster:
    /// `correct` (the default: put it back and report it) or `report` (leave it and
    /// report it). Overlays may set it for some clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<crate::bundle::DriftPolicy>,
}

/// `spec.helm` of a workload: a chart inside the fleet and how to render it.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HelmSpec {
    /// The chart: a folder holding `Chart.yaml`, or a packed chart (`.tgz`), as a
    /// path relative to the workload's folder that stays inside the fleet root
    /// (`chart`, `../../charts/ingress-nginx`). Charts are never fetched.
    pub chart: String,
    /// Not supported: charts are never fetched at render. Vendor the chart into the
    /// repository (`helm pull REPO/CHART --untar`) and name its folder in `chart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// `.Release.Name`; the workload's name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_name: Option<String>,
    /// `.Release.Namespace`, and the namespace of namespaced resources the chart
    /// leaves without one; the workload's `spec.namespace` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Values over the chart's `values.yaml` and the values files.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub values: Vars,
    /// Values files, relative to the workload's folder, merged in order over the
    /// chart's `values.yaml`; a file ending in `.j2` is rendered per cluster first,
    /// with the context manifest templates get.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values_files: Vec<String>,
    /// Whether the files of the charts' `crds/` folders go into the bundle.
    #[serde(default = "yes", rename = "includeCRDs")]
    pub include_crds: bool,
    /// Whether the chart's test hooks (`helm.sh/hook: test`) are left out.
    #[serde(default = "yes")]
    pub skip_tests: bool,
}

fn yes() -> bool {
    true
}

/// One entry of `spec.targets`: exactly one of `group`, `cluster` or `clusterSelector`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1, "maxProperties" = 1))]
pub struct Target {
    /// Every member of this group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// This one cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Every cluster whose labels match; `{}` selects every cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
}

/// `overlays/**/*.yaml`: changes applied to the workloads of the clusters it selects.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Overlay")]
pub struct OverlayDoc {
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `Overlay`.
    #[schemars(extend("const" = "Overlay"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: OverlaySpec,
}

/// Whom an overlay selects (at least one of `clusters`, `groups` or
/// `clusterSelector`) and what it changes.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("anyOf" = [
    {"required": ["clusters"], "properties": {"clusters": {"minItems": 1}}},
    {"required": ["groups"], "properties": {"groups": {"minItems": 1}}},
    {"required": ["clusterSelector"]}
]))]
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
    /// Values for the Helm charts of the workloads it applies to, merged deeply over
    /// their `spec.helm` values (and earlier overlays' helmValues).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub helm_values: Vars,
    /// Image overrides with kustomize `images` semantics.
    #[serde(default)]
    pub images: Vec<ImageOverride>,
    /// The drift policy (`correct` or `report`) of the workloads it applies to, on the
    /// clusters it selects, over the workload's own `spec.drift`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<crate::bundle::DriftPolicy>,
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

/// `tenants/<name>.yaml`: a team that owns some workloads (and overlays), and where
/// their resources may go. Every rule is enforced when the fleet renders and again
/// by the agent; a workload named by no tenant is the platform's.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "Tenant")]
pub struct TenantDoc {
    /// Always `flotilla.dev/v1alpha1`.
    #[schemars(extend("const" = "flotilla.dev/v1alpha1"))]
    pub api_version: String,
    /// Always `Tenant`.
    #[schemars(extend("const" = "Tenant"))]
    pub kind: String,
    pub metadata: Metadata,
    pub spec: TenantSpec,
}

/// What a tenant owns and may do.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TenantSpec {
    /// The workloads it owns: names or globs (`shop-*`). A workload may belong to one
    /// tenant only.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub workloads: Vec<Located<String>>,
    /// The overlays it owns: names or globs. They act only on its workloads.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub overlays: Vec<Located<String>>,
    /// The clusters its workloads may target (every cluster when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// The namespaces its resources may be in: names or globs (`team-a-*`). Its
    /// resources may also be these `Namespace` objects themselves.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub namespaces: Vec<Located<String>>,
    /// The cluster-scoped kinds it may write (`CustomResourceDefinition`,
    /// `ClusterRole`, ...); none when left out.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub cluster_scoped: Vec<Located<String>>,
    /// ClusterRoles its RoleBindings and ClusterRoleBindings may refer to, besides
    /// the ClusterRoles its own workloads ship (`view`, say). `cluster-admin`,
    /// `admin` and `edit` are refused unless listed here.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub cluster_roles: Vec<Located<String>>,
    /// Files outside its own folders that its workloads may read: globs
    /// (`charts/**` for charts the platform vets). Its own folders are those of its
    /// workloads (`workloads/<name>/`) and its overlays' files.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub shared_paths: Vec<Located<String>>,
    /// The Pod Security level its `Namespace` objects enforce
    /// (`pod-security.kubernetes.io/enforce`): `restricted` when left out, since a
    /// privileged pod escapes every namespace rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,
}

/// A Pod Security Standards level (`pod-security.kubernetes.io/enforce`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PodSecurityLevel {
    /// The hardened level: no privilege escalation, non-root, a seccomp profile.
    #[default]
    Restricted,
    /// Stops the known privilege escalations (host namespaces, privileged pods).
    Baseline,
    /// No restriction.
    Privileged,
}

impl PodSecurityLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Restricted => "restricted",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Privileged => "privileged",
        }
    }
}

/// A kustomize-style image override: the containers whose image name equals `name`
/// get a new name, a new tag, or a digest.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("anyOf" = [
    {"required": ["newName"]},
    {"required": ["newTag"]},
    {"required": ["digest"]}
]))]
pub struct ImageOverride {
    /// The image name to match, without tag or digest (`ghcr.io/example/app`).
    pub name: String,
    /// Replaces the name, keeping the tag and digest unless they are overridden too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_name: Option<String>,
    /// Replaces the tag (and drops any digest, unless `digest` is given too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tag: Option<String>,
    /// Pins the image to a digest (`sha256:...`), dropping any tag unless `newTag`
    /// is given too (then the image is `name:newTag@digest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A patch: a target and exactly one of `ops` (RFC 6902), `merge` (RFC 7396) or
/// `strategic` (a strategic merge patch).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["ops"]}, {"required": ["merge"]}, {"required": ["strategic"]}]))]
pub struct Patch {
    /// Which resources the patch applies to; absent means every resource.
    #[serde(default)]
    pub target: PatchTarget,
    /// An RFC 6902 JSON Patch: a list of operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("items" = {
        "type": "object",
        "required": ["op", "path"],
        "properties": {
            "op": {"enum": ["add", "remove", "replace", "move", "copy", "test"]},
            "path": {"type": "string", "description": "A JSON Pointer (RFC 6901), `/spec/replicas`."},
            "from": {"type": "string", "description": "For `move` and `copy`: the JSON Pointer to take the value from."},
            "value": {"description": "For `add`, `replace` and `test`."}
        },
        "additionalProperties": false
    }))]
    pub ops: Option<Vec<Value>>,
    /// An RFC 7396 JSON Merge Patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<Value>,
    /// A strategic merge patch, as kustomize applies it: lists of the built-in kinds
    /// merge by their keys (`containers` and `env` by `name`, `ports` by
    /// `containerPort`, `volumeMounts` by `mountPath`, ...), other lists are replaced;
    /// `$patch: delete|replace` and `$setElementOrder/<list>` are understood.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("type" = "object"))]
    pub strategic: Option<Value>,
}

/// kustomize patch-target semantics: every field given must match; `group`,
/// `version`, `kind`, `name` and `namespace` are anchored regular expressions
/// (`kind: Deployment|StatefulSet`), `labelSelector` and `annotationSelector` use the
/// Kubernetes selector syntax (`app=web,tier in (a,b)`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PatchTarget {
    /// An anchored regular expression over the API group (`apps`; `""` for the core
    /// group of `v1` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// An anchored regular expression over the API version (`v1`, `v1(beta1)?`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// An anchored regular expression over the kind (`Deployment|StatefulSet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// An anchored regular expression over `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An anchored regular expression over `metadata.namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A label selector in string form (`app=web,tier in (a,b),!legacy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// An annotation selector in string form, like `labelSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation_selector: Option<String>,
}

/// The JSON Schemas of the six kinds, by file name under `schemas/`.
///
/// They are draft-07 schemas, the newest draft the `yaml-language-server` modelines
/// in a fleet's files fully support. Optional fields are given as their plain type
/// without `null`: the parser reads an explicit null as "absent", but in a fleet file
/// an empty value (`newTag:`) is nearly always a mistake an editor should flag.
///
/// Each has an `$id` under [`SCHEMA_BASE`] (`…/v1alpha1/cluster.json`), so that
/// editors and schema catalogues can tell them apart and refer to them by name.
pub fn schemas() -> Vec<(&'static str, Value)> {
    fn schema<T: JsonSchema>() -> Value {
        let mut settings = schemars::generate::SchemaSettings::draft07();
        settings.transforms.insert(0, Box::new(drop_null));
        let schema = settings.into_generator().into_root_schema_for::<T>();
        serde_json::to_value(schema).unwrap_or(Value::Null)
    }
    let mut all = vec![
        ("cluster.json", schema::<ClusterDoc>()),
        ("group.json", schema::<GroupDoc>()),
        ("workload.json", schema::<WorkloadDoc>()),
        ("overlay.json", schema::<OverlayDoc>()),
        ("rolloutpolicy.json", schema::<RolloutPolicyDoc>()),
        ("fleetsettings.json", schema::<FleetSettingsDoc>()),
        ("tenant.json", schema::<TenantDoc>()),
    ];
    for (name, schema) in &mut all {
        if let Value::Object(object) = schema {
            object.insert("$id".into(), Value::String(format!("{SCHEMA_BASE}{name}")));
        }
    }
    all
}

/// Where the `$id` of every schema of this API version starts.
pub const SCHEMA_BASE: &str = "https://flotilla.dev/schemas/v1alpha1/";

/// Turns `Option<T>`'s `T or null` into plain `T`: `"type": ["string", "null"]`
/// becomes `"type": "string"`, and `"anyOf": [T, {"type": "null"}]` becomes `T`.
fn drop_null(schema: &mut schemars::Schema) {
    schemars::transform::transform_subschemas(&mut drop_null, schema);
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = object.get("type") {
        let rest: Vec<Value> = types
            .iter()
            .filter(|t| t.as_str() != Some("null"))
            .cloned()
            .collect();
        if rest.len() < types.len() {
            let single = match rest.as_slice() {
                [one] => one.clone(),
                _ => Value::Array(rest),
            };
            object.insert("type".into(), single);
        }
    }
    let null_schema = serde_json::json!({"type": "null"});
    if let Some(Value::Array(alternatives)) = object.get("anyOf")
        && alternatives.len() == 2
        && alternatives.contains(&null_schema)
        && let Some(Value::Object(other)) = alternatives.iter().find(|a| **a != null_schema)
    {
        let other = other.clone();
        object.remove("anyOf");
        for (key, value) in other {
            object.entry(key).or_insert(value);
        }
    }
}
