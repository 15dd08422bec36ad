//! The fleet as the renderer uses it, once its files are read (see
//! [`crate::load`]): clusters, groups, workloads with their manifests, overlays
//! with their compiled patches, and rollout policies.

use std::collections::BTreeMap;
use std::sync::Arc;

use regex::Regex;

use flotilla_core::bundle::DriftPolicy;
use flotilla_core::model::{
    FleetSettings, HelmSpec, ImageOverride, KubernetesSpec, LabelSelector, Located,
    PodSecurityLevel, Target, Vars,
};
use flotilla_core::rollout::Policy;

#[derive(Clone, Debug)]
pub struct Cluster {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub vars: Vars,
    pub file: String,
    /// `spec.paused`: it keeps the digest it is served.
    pub paused: bool,
    /// `spec.kubernetes`: what its Helm charts see as `.Capabilities`.
    pub kubernetes: Option<KubernetesSpec>,
    /// `spec.agentKey`: its Secrets are sealed to this key.
    pub agent_key: Option<crate::seal::AgentKey>,
}

#[derive(Debug)]
pub struct Group {
    pub name: String,
    pub selector: LabelSelector,
    pub vars: Vars,
    pub file: String,
}

#[derive(Debug)]
pub struct Workload {
    pub name: String,
    pub namespace: Option<String>,
    pub targets: Vec<Located<Target>>,
    pub vars: Vars,
    pub file: String,
    /// Plain manifests, parsed once for every cluster.
    pub documents: Arc<Vec<SourcedDocument>>,
    /// Template files (`*.j2`), by path; rendered per cluster.
    pub templates: Vec<String>,
    /// `spec.helm` as written, read into [`Workload::helm`] once the snapshot's
    /// files are at hand.
    pub helm_spec: Option<HelmSpec>,
    /// The Helm release it renders per cluster.
    pub helm: Option<Arc<HelmRelease>>,
    /// `spec.dependsOn`: workloads applied before it.
    pub depends_on: Vec<Located<String>>,
    /// `spec.drift`, before overlays.
    pub drift: DriftPolicy,
    /// The tenant that owns it (an index into [`Fleet::tenants`]); `None`: the
    /// platform's.
    pub tenant: Option<usize>,
}

/// A manifest document with the file and line it came from.
#[derive(Debug, Clone)]
pub struct SourcedDocument {
    pub value: serde_json::Value,
    pub file: Arc<str>,
    pub line: u64,
}

#[derive(Debug)]
pub struct Overlay {
    pub name: String,
    pub file: String,
    pub priority: i64,
    pub clusters: Vec<Located<String>>,
    pub groups: Vec<Located<String>>,
    pub cluster_selector: Option<LabelSelector>,
    pub workloads: Option<Vec<Located<String>>>,
    pub vars: Vars,
    /// `spec.helmValues`: merged over the values of the Helm workloads it applies to.
    pub helm_values: Vars,
    pub images: Vec<ImageOverride>,
    /// `spec.drift`: the drift policy it sets.
    pub drift: Option<DriftPolicy>,
    pub patches: Vec<CompiledPatch>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The tenant that owns it: then it acts only on that tenant's workloads.
    pub tenant: Option<usize>,
}

/// A tenant (`tenants/<name>.yaml`) as read: see [`crate::tenancy`].
#[derive(Debug)]
pub struct Tenant {
    pub name: String,
    pub file: String,
    pub workloads: Vec<Located<String>>,
    pub overlays: Vec<Located<String>>,
    pub cluster_selector: Option<LabelSelector>,
    pub namespaces: Vec<Located<String>>,
    pub cluster_scoped: Vec<Located<String>>,
    pub cluster_roles: Vec<Located<String>>,
    pub shared_paths: Vec<Located<String>>,
    pub pod_security: PodSecurityLevel,
}

/// A patch with its target's regular expressions and selectors compiled.
#[derive(Debug)]
pub struct CompiledPatch {
    pub line: u64,
    pub group: Option<Regex>,
    pub version: Option<Regex>,
    pub kind: Option<Regex>,
    pub name: Option<Regex>,
    pub namespace: Option<Regex>,
    pub label_selector: Option<LabelSelector>,
    pub annotation_selector: Option<LabelSelector>,
    pub action: PatchAction,
}

#[derive(Debug)]
pub enum PatchAction {
    JsonPatch(serde_json::Value),
    MergePatch(serde_json::Value),
    StrategicMerge(serde_json::Value),
}

/// A RolloutPolicy as read: the checked policy and how its waves select clusters.
#[derive(Debug)]
pub struct RolloutPolicy {
    pub name: String,
    pub file: String,
    pub selector: LabelSelector,
    /// The checked policy (its declared waves; the plan adds a last one if needed).
    pub policy: Policy,
    pub waves: Vec<WaveSelection>,
}

/// How one wave selects clusters.
#[derive(Debug)]
pub struct WaveSelection {
    pub line: u64,
    pub groups: Vec<Located<String>>,
    pub clusters: Vec<Located<String>>,
    pub selector: Option<LabelSelector>,
    pub percent: Option<u32>,
}

impl WaveSelection {
    /// A wave with no selection takes every governed cluster not in an earlier wave.
    pub fn selects_all(&self) -> bool {
        self.groups.is_empty()
            && self.clusters.is_empty()
            && self.selector.is_none()
            && self.percent.is_none()
    }
}

/// The fleet as the renderer uses it: every list sorted (clusters, groups and
/// workloads by name; overlays by priority, then name; rollout policies by name).
#[derive(Debug, Default)]
pub struct Fleet {
    pub clusters: Vec<Cluster>,
    pub groups: Vec<Group>,
    pub workloads: Vec<Workload>,
    pub overlays: Vec<Overlay>,
    pub rollout_policies: Vec<RolloutPolicy>,
    /// Tenants, by name.
    pub tenants: Vec<Tenant>,
    /// `tenants/rules.signed.json`: the tenant rules as the platform's key signed
    /// them, carried in every bundle for agents that take only those.
    pub signed_tenant_rules: Option<flotilla_core::bundle::SignedTenantRules>,
    /// `flotilla.yaml`'s settings (each its default when the file is absent).
    pub settings: FleetSettings,
    /// Which overlays name each cluster and group, made on first use (the overlays
    /// are not changed once the fleet is loaded).
    pub overlay_index: std::sync::OnceLock<OverlayIndex>,
}

/// A workload's Helm release as read from the fleet.
#[derive(Debug)]
pub struct HelmRelease {
    /// The chart's path in the fleet (`charts/ingress`, `workloads/web/chart.tgz`).
    pub chart_path: String,
    /// The chart, parsed; `None` when it could not be read (reported at load).
    pub chart: Option<Arc<crate::helm::render::PreparedChart>>,
    pub release_name: String,
    pub namespace: String,
    pub values: serde_json::Map<String, serde_json::Value>,
    pub values_files: Vec<ValuesFile>,
    pub include_crds: bool,
    pub skip_tests: bool,
    /// Every file the release reads (the chart's and the values files), for the
    /// incremental render's input digests.
    pub inputs: Vec<String>,
}

/// One of `spec.helm.valuesFiles`.
#[derive(Debug)]
pub enum ValuesFile {
    /// A YAML file, parsed once.
    Static {
        path: String,
        values: serde_json::Map<String, serde_json::Value>,
    },
    /// A `.j2` file, rendered per cluster, then parsed.
    Template { path: String },
}

/// Which overlays name each cluster and each group, and which select by labels, so
/// that finding a cluster's overlays costs the overlays that name it (and the label
/// selectors), not a look at every overlay: with an overlay per cluster that was
/// clusters × overlays.
#[derive(Debug, Default)]
pub struct OverlayIndex {
    pub by_cluster: std::collections::HashMap<String, Vec<usize>>,
    pub by_group: std::collections::HashMap<String, Vec<usize>>,
    pub by_selector: Vec<usize>,
}

impl OverlayIndex {
    fn of(overlays: &[Overlay]) -> OverlayIndex {
        let mut index = OverlayIndex::default();
        for (o, overlay) in overlays.iter().enumerate() {
            for name in &overlay.clusters {
                index
                    .by_cluster
                    .entry(name.value.clone())
                    .or_default()
                    .push(o);
            }
            for name in &overlay.groups {
                index
                    .by_group
                    .entry(name.value.clone())
                    .or_default()
                    .push(o);
            }
            if overlay.cluster_selector.is_some() {
                index.by_selector.push(o);
            }
        }
        index
    }
}

impl Fleet {
    /// The fleet's [`OverlayIndex`], made on first use.
    pub fn overlay_index(&self) -> &OverlayIndex {
        self.overlay_index
            .get_or_init(|| OverlayIndex::of(&self.overlays))
    }
}
