//! The pure renderer: a fleet snapshot in, one canonical bundle per cluster and a list
//! of diagnostics out. It opens no files, sockets or Git objects.
//!
//! For one cluster and workload the order of work is: merge the variables, render
//! the templates, parse the manifests, set the default namespace, then apply every
//! matching overlay in (priority, name) order.
//!
//! Work is shared where the result cannot differ: plain manifests are parsed once per
//! file, identical template outputs are rendered once as one unit (and parsed inside
//! it, so no output's tree outlives its unit), and the resources of a workload
//! are rendered once per distinct (workload, overlays, custom scopes, template
//! outputs) combination, however many clusters share it. A template whose outputs
//! differ only in the values of its holes is transformed once per (workload,
//! overlays, custom scopes) into stencils, and each cluster's values are filled in
//! (see [`stencil`]). Clusters render in parallel.

pub mod diff;
mod fleet;
pub mod formats;
pub mod helm;
pub mod inputs;
pub mod kustomize;
pub mod kyaml;
pub mod load;
mod openapi;
mod order;
pub mod patch;
mod pipeline;
pub mod progress;
mod release;
mod rollouts;
pub mod scope;
pub mod seal;
mod select;
pub mod shape;
pub mod sops;
pub mod stencil;
mod strategic;
pub mod template;
pub mod tenancy;
pub mod transform;
pub mod yaml;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use flotilla_core::bundle::Bundle;
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::rollout::RolloutPlan;
use flotilla_core::snapshot::FleetSnapshot;
use inputs::ClusterInputs;
use pipeline::render_inner;

/// What to render.
#[derive(Default)]
pub struct RenderOptions<'a> {
    /// Render only these clusters (all when empty). Unknown names are errors.
    pub clusters: BTreeSet<String>,
    /// Called with (clusters done, clusters in all) as bundles complete.
    pub progress: Option<&'a (dyn Fn(usize, usize) + Sync)>,
    /// The budgets to render within (template fuel and output, resource size, the
    /// render's deadline).
    pub limits: Limits,
    /// Set from another thread to abandon the render: it stops at the next unit of
    /// work and reports that it was cancelled.
    pub cancel: Option<&'a AtomicBool>,
    /// Keep each bundle's digest only, dropping its resources as soon as they are
    /// hashed, for a caller that needs none (`validate`): a fleet of per-cluster
    /// templates then never holds every cluster's resources at once. Such bundles
    /// are not for serving, diffing or rendering since.
    pub digests_only: bool,
    /// The secret seed Helm charts' generating functions (`randAlphaNum`, `genCA`,
    /// ...) derive their values from; without one the public seed is used, and a
    /// warning says so where a chart generated a value.
    pub helm_seed: Option<[u8; 32]>,
    /// How SOPS documents in the fleet are read: opened with the hub's keys, or left
    /// as ciphertext (a review without them).
    pub sops: sops::SopsKeys,
    /// Render every Helm release on its own, never filled in from a release
    /// rendered once with stand-ins for the strings clusters differ in (the
    /// default): for tests and benchmarks that compare the two.
    pub helm_without_stencils: bool,
}

/// The result of rendering one snapshot.
#[derive(Debug, Default)]
pub struct RenderOutput {
    /// The revision the snapshot was read from.
    pub revision: String,
    /// Whether the fleet was read in part (a budget stopped the read), so that nothing
    /// was rendered: no cluster is known to have come or gone, only why.
    pub incomplete: bool,
    /// One bundle per cluster that rendered without error.
    pub bundles: BTreeMap<String, Bundle>,
    /// Errors and warnings, sorted by file and line.
    pub diagnostics: Vec<Diagnostic>,
    /// The groups each cluster belongs to (by name), for reports.
    pub memberships: BTreeMap<String, Vec<String>>,
    /// Each cluster's labels (`metadata.labels`), for the hub's pages.
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Which rollout policy and wave each cluster belongs to, and the paused clusters.
    pub rollouts: RolloutPlan,
    /// Where each bundle came from, for [`render_since`] (empty for a render of
    /// named clusters).
    pub provenance: Provenance,
    /// The cluster files this render parsed, which a render since it need not
    /// parse again (`None` for a render of named clusters).
    pub parsed: Option<Arc<load::ParsedClusters>>,
    /// Whether a Helm chart generated values from the public seed (no
    /// [`RenderOptions::helm_seed`] was given): such values are not secret, so a
    /// render that serves them (`publish`) refuses.
    pub generated_from_public_seed: bool,
    /// Some cluster names an agent key (`spec.agentKey`) but the render had no hub
    /// seed, so nothing was sealed: such a render must not be published.
    pub unsealed_for_agent_keys: bool,
    /// The agent key (`spec.agentKey`) of each cluster with a bundle that names one:
    /// what its Secrets are encrypted for in other fleets' formats ([`formats`]).
    pub agent_keys: BTreeMap<String, seal::AgentKey>,
    /// Per Helm workload, the chart it renders as `name version` (and its path in
    /// the fleet), for reports.
    pub charts: BTreeMap<String, String>,
    /// How many Helm releases were filled in from a release rendered once with
    /// stand-ins for the strings their clusters differ in, rather than rendered on
    /// their own (see [`RenderOptions::helm_without_stencils`]). A count for
    /// benchmarks and tests: the hub's render process does not pass it on.
    pub helm_stencil_releases: usize,
    /// The SOPS files the render opened: hashes published over their values
    /// (kustomize's name suffixes, the digests of a Helm release) are keyed
    /// (see [`flotilla_core::snapshot::FleetSnapshot::hash_keys`]), which `validate`
    /// says. The hub's render process does not pass it on.
    pub sops_files: Vec<String>,
}

/// Where a render's bundles came from: what [`render_since`] compares and reuses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Provenance {
    /// What each cluster's bundle is made from.
    pub inputs: ClusterInputs,
    /// Per cluster with a bundle, where its parts came from.
    pub clusters: BTreeMap<String, ClusterProvenance>,
}

/// The overlay patches whose target matched a resource of a bundle: (overlay file,
/// index of the patch, workload).
pub type PatchMatches = Arc<[(Arc<str>, u32, u32)]>;

/// A cluster's Helm release warnings, each with its workload's position.
pub type ReleaseWarnings = Arc<[(u32, Diagnostic)]>;

/// Where one bundle's parts came from. Workloads are named by their position in
/// the cluster's [`inputs::ClusterInput::workloads`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterProvenance {
    /// For each resource of the bundle, in order, the workload it came from
    /// (clusters with the same list may share it); `u32::MAX - 1` for the objects
    /// the render adds for tenants' namespaces (workload `flotilla-tenancy`).
    pub resource_workloads: Arc<[u32]>,
    /// The overlay patches whose target matched a resource here: (overlay file,
    /// index of the patch, workload).
    pub patch_matches: PatchMatches,
    /// Whether a CRD of its workloads made some kind cluster-scoped: every
    /// workload's resources then depend on every other's.
    pub custom_scopes: bool,
    /// The warnings of this cluster's render, without the cluster's name (sorted;
    /// clusters with the same list may share it): a render since this one that
    /// leaves the cluster as it was reports them again.
    pub warnings: Arc<[Diagnostic]>,
    /// The warnings of its Helm releases (each with the position of its workload, as
    /// in `resource_workloads`; without the cluster's name; sorted): a function of
    /// each release's input, so a render since this one keeps those of the workloads
    /// it does not render again, as it keeps their resources.
    pub release_warnings: ReleaseWarnings,
    /// Whether some of those warnings depend on more than the cluster's inputs (the
    /// schema check's, whose custom kinds come from other workloads' CRDs; decrypted
    /// values outside Secrets, from every SOPS file): a render since this one then
    /// renders every cluster.
    pub warnings_beyond_inputs: bool,
}

impl RenderOutput {
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.is_error())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| !d.is_error())
    }

    /// A clean render has no errors; only a clean render may replace what is served.
    pub fn is_clean(&self) -> bool {
        self.errors().next().is_none()
    }
}

/// Renders every cluster of the snapshot.
pub fn render(snapshot: &FleetSnapshot) -> RenderOutput {
    render_with(snapshot, &RenderOptions::default())
}

pub fn render_with(snapshot: &FleetSnapshot, options: &RenderOptions<'_>) -> RenderOutput {
    render_inner(snapshot, options, (None, None), &mut |_| None)
}

/// Renders `snapshot` as [`render_with`] does, rendering only the clusters whose
/// inputs (see [`inputs`]) differ from `previous`'s, and of those only the changed
/// workloads where no custom scope is in play, taking the rest from `previous`. The
/// output is the one a full render gives: the same bundles, memberships, rollout
/// plan and diagnostics. `previous` must be a clean render of the whole fleet made
/// with the same limits; otherwise (or with `options.clusters` set) this is a full
/// render.
pub fn render_since(
    previous: &RenderOutput,
    snapshot: &FleetSnapshot,
    options: &RenderOptions<'_>,
) -> RenderOutput {
    render_since_fetching(previous, snapshot, options, &mut |names| {
        names
            .iter()
            .map(|name| previous.bundles.get(name).cloned())
            .collect()
    })
}

/// Asked for the previous bundles of the named clusters; `None` if it cannot give
/// them all.
pub type FetchBundles<'f> = dyn FnMut(&[String]) -> Option<Vec<Bundle>> + 'f;

/// [`render_since`] where `previous` may hold its bundles as digests only (no
/// resources): the resources of the clusters rendered in part, which are merged with
/// what is rendered again, are asked of `fetch`, once, when known. The bundles of
/// clusters not rendered again are `previous`'s, as they are: with digests only,
/// the caller knows them by digest.
pub fn render_since_fetching(
    previous: &RenderOutput,
    snapshot: &FleetSnapshot,
    options: &RenderOptions<'_>,
    fetch: &mut FetchBundles<'_>,
) -> RenderOutput {
    let reusable = options.clusters.is_empty()
        && previous.is_clean()
        && !previous.provenance.inputs.is_empty()
        && !previous
            .provenance
            .clusters
            .values()
            .any(|c| c.warnings_beyond_inputs);
    // Parsed files can be taken from any render.
    let parsed = previous.parsed.as_deref();
    render_inner(
        snapshot,
        options,
        (reusable.then_some(previous), parsed),
        fetch,
    )
}
