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
pub mod helm;
pub mod inputs;
pub mod kustomize;
pub mod kyaml;
pub mod load;
pub mod patch;
pub mod release;
pub mod rollouts;
pub mod scope;
pub mod shape;
pub mod stencil;
pub mod strategic;
pub mod template;
pub mod transform;
pub mod yaml;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde_json::{Map, Value};

use flotilla_core::bundle::{Bundle, Resource, ResourceKey};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::model::{Target, Vars};
use flotilla_core::rollout::RolloutPlan;
use flotilla_core::snapshot::FleetSnapshot;
use inputs::ClusterInputs;
use load::{Cluster, Fleet, Overlay, SourcedDocument, Workload};
use patch::PatchLimits;
use scope::CustomScopes;
use shape::Shape;
use stencil::StencilUnit;
use template::{ClusterContext, Context, Templates, WorkloadContext};

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
}

/// The result of rendering one snapshot.
#[derive(Debug, Default)]
pub struct RenderOutput {
    /// The revision the snapshot was read from.
    pub revision: String,
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
    /// Per Helm workload, the chart it renders as `name version` (and its path in
    /// the fleet), for reports.
    pub charts: BTreeMap<String, String>,
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

/// Where one bundle's parts came from. Workloads are named by their position in
/// the cluster's [`inputs::ClusterInput::workloads`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterProvenance {
    /// For each resource of the bundle, in order, the workload it came from
    /// (clusters with the same list may share it).
    pub resource_workloads: Arc<[u32]>,
    /// The overlay patches whose target matched a resource here: (overlay file,
    /// index of the patch, workload).
    pub patch_matches: PatchMatches,
    /// Whether a CRD of its workloads made some kind cluster-scoped: every
    /// workload's resources then depend on every other's.
    pub custom_scopes: bool,
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

/// A resource with where it came from, for duplicate-identity messages.
struct Rendered {
    resource: Arc<Resource>,
    file: Arc<str>,
    line: u64,
}

/// One (cluster, workload) pair to render.
struct Plan {
    workload: usize,
    overlays: Vec<usize>,
    /// Indices into the table of distinct template outputs.
    outputs: Vec<usize>,
    /// The outputs read as values that no other cluster has: filled in from their
    /// stencils as the cluster is assembled, not units.
    filled: Vec<OwnOutput>,
}

/// A template and the values in its holes for one cluster.
type OwnOutput = (usize, Box<[Box<str>]>);

/// What one template wrote for one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Written {
    /// The output's text, parsed by the units that read it.
    Text(String),
    /// The values in the holes of the template's shape: the output is the
    /// template's literal text with these in its holes, which YAML reads as the
    /// shape's documents (see [`Shape::values`]), and its resources are filled in
    /// from stencils (see [`stencil`]).
    Values(Box<[Box<str>]>),
    /// A Helm release's documents, rendered once for every cluster with the same
    /// input.
    Release(Arc<release::ReleaseOutput>),
}

impl Default for Written {
    fn default() -> Written {
        Written::Text(String::new())
    }
}

/// Whether a render should stop: it was cancelled, or its deadline passed. Workers
/// ask between units of work (a template render, a unit, a cluster's assembly);
/// template fuel bounds the work inside one unit. The files being rendered when the
/// deadline passed are named in the error.
struct Stop<'a> {
    cancel: Option<&'a AtomicBool>,
    deadline: Instant,
    timeout: Duration,
    stopped: AtomicBool,
    /// What each worker thread of the pool is on (and, last, any other thread):
    /// each locks only its own, so a million template renders do not contend.
    slots: Box<[Mutex<Slot>]>,
    /// The files in flight when the deadline passed.
    culprits: Mutex<Vec<String>>,
}

/// The file a worker is on or was on last, and since when.
#[derive(Default)]
struct Slot {
    file: String,
    busy: bool,
    started: Option<Instant>,
}

impl<'a> Stop<'a> {
    fn new(options: &RenderOptions<'a>) -> Stop<'a> {
        Stop {
            cancel: options.cancel,
            deadline: Instant::now() + options.limits.render_timeout,
            timeout: options.limits.render_timeout,
            stopped: AtomicBool::new(false),
            slots: (0..=rayon::current_num_threads())
                .map(|_| Mutex::default())
                .collect(),
            culprits: Mutex::default(),
        }
    }

    /// Asks whether to stop; the first worker to find the deadline passed notes
    /// which files were in flight (or, with none, the one started last).
    fn now(&self) -> bool {
        self.at(Instant::now())
    }

    /// [`Stop::now`] at the time `now`.
    fn at(&self, now: Instant) -> bool {
        if self.stopped.load(Ordering::Relaxed) {
            return true;
        }
        let cancelled = self.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        if !cancelled && now < self.deadline {
            return false;
        }
        if !self.stopped.swap(true, Ordering::Relaxed) && !cancelled {
            let slots: Vec<_> = self.slots.iter().map(lock).collect();
            let mut culprits: BTreeSet<String> = slots
                .iter()
                .filter(|slot| slot.busy)
                .map(|slot| slot.file.clone())
                .collect();
            if culprits.is_empty()
                && let Some(last) = slots
                    .iter()
                    .filter(|slot| slot.started.is_some())
                    .max_by_key(|slot| slot.started)
            {
                culprits.insert(last.file.clone());
            }
            *lock(&self.culprits) = culprits.into_iter().collect();
        }
        true
    }

    /// Runs `work` on `file` unless the render should stop, noting the file as in
    /// flight meanwhile.
    fn run<T>(&self, file: &str, work: impl FnOnce() -> T) -> Option<T> {
        let now = Instant::now();
        if self.at(now) {
            return None;
        }
        let index = rayon::current_thread_index().unwrap_or(usize::MAX);
        let slot = &self.slots[index.min(self.slots.len() - 1)];
        // A worker waiting inside `work` may take up other work on this thread:
        // what it was on comes back after.
        let outer = {
            let mut slot = lock(slot);
            let outer = slot.busy.then(|| std::mem::take(&mut slot.file));
            slot.file.clear();
            slot.file.push_str(file);
            slot.busy = true;
            slot.started = Some(now);
            outer
        };
        let result = work();
        let mut slot = lock(slot);
        match outer {
            Some(outer) => slot.file = outer,
            None => slot.busy = false,
        }
        Some(result)
    }

    /// The output of a render that stopped: what was found before, and why it stopped.
    fn abandoned(
        &self,
        snapshot: &FleetSnapshot,
        mut diagnostics: Vec<Diagnostic>,
    ) -> RenderOutput {
        let cancelled = self.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        let culprits = lock(&self.culprits).clone();
        if cancelled {
            diagnostics.push(Diagnostic::error("the render was cancelled"));
        } else if culprits.is_empty() {
            diagnostics.push(Diagnostic::error(format!(
                "the render took longer than {} (--render-timeout) and was abandoned",
                humanize(self.timeout)
            )));
        }
        for file in culprits {
            diagnostics.push(
                Diagnostic::error(format!(
                    "the render took longer than {} (--render-timeout) and was abandoned while \
                     this file was being rendered",
                    humanize(self.timeout)
                ))
                .in_file(file.as_str()),
            );
        }
        diagnostics.sort();
        diagnostics.dedup();
        RenderOutput {
            revision: snapshot.revision.clone(),
            diagnostics,
            ..RenderOutput::default()
        }
    }
}

/// A lock, whatever a panicking holder left behind.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A duration as a person writes it: `30s`, `1500ms`.
fn humanize(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
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
        && previous.diagnostics.iter().all(|d| d.cluster.is_none());
    // Parsed files can be taken from any render.
    let parsed = previous.parsed.as_deref();
    render_inner(
        snapshot,
        options,
        (reusable.then_some(previous), parsed),
        fetch,
    )
}

/// One cluster's bundle and where its parts came from, or its errors.
type Assembled = Result<(Bundle, ClusterProvenance), Vec<Diagnostic>>;

/// What rendering some clusters gave.
struct Pass {
    /// Per cluster rendered, what assembling it gave.
    assembled: Vec<Assembled>,
    /// Errors of template renders and units, each for its cluster.
    diagnostics: Vec<Diagnostic>,
    /// The overlays some unit used, and the (overlay, patch) pairs that matched.
    used_overlays: BTreeSet<usize>,
    matched: BTreeSet<(usize, usize)>,
}

impl Pass {
    /// Whether any problem belongs to one cluster: its message then counts the
    /// clusters that share it, which only a render of all of them can do.
    fn has_cluster_problems(&self) -> bool {
        self.diagnostics.iter().any(|d| d.cluster.is_some())
            || self.assembled.iter().any(Result::is_err)
    }
}

/// What a pass over some clusters came to.
enum Passed {
    Done(Pass),
    /// These clusters (positions in the pass) were rendered in part, and their
    /// changed workloads brought a custom scope or a resource another workload
    /// has: render them whole.
    Widen(Vec<usize>),
    Stopped,
}

/// How much of one cluster to render again.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Redo {
    All,
    /// Only these workloads (positions in its targeted list); the others' resources
    /// are the previous bundle's.
    Workloads(Vec<usize>),
    Nothing,
}

/// How much of a cluster `previous` leaves to render again, given its new inputs.
fn redo_since(previous: &RenderOutput, name: &str, input: &inputs::ClusterInput) -> Redo {
    let (Some(before), Some(kept), true) = (
        previous.provenance.inputs.clusters.get(name),
        previous.provenance.clusters.get(name),
        previous.bundles.contains_key(name),
    ) else {
        return Redo::All;
    };
    if before == input {
        return Redo::Nothing;
    }
    let same_workloads = before.workloads.len() == input.workloads.len()
        && before
            .workloads
            .iter()
            .zip(input.workloads.iter())
            .all(|(a, b)| a.0 == b.0);
    if before.own != input.own || !same_workloads || kept.custom_scopes {
        return Redo::All;
    }
    Redo::Workloads(
        (0..input.workloads.len())
            .filter(|&w| before.workloads[w].1 != input.workloads[w].1)
            .collect(),
    )
}

/// One cluster to render: the fleet indices of the workloads that target it, and,
/// when only some of them are rendered, those (positions in `targeted`) and the
/// previous bundle the others come from.
struct Job<'a> {
    targeted: &'a [usize],
    only: Option<(&'a [usize], &'a Bundle, &'a ClusterProvenance)>,
}

/// Everything a render shares between its clusters.
struct Shared<'a> {
    fleet: &'a Fleet,
    templates: &'a Templates,
    template_paths: &'a [&'a String],
    shapes: &'a [Option<Shape>],
    /// Per template, whether its outputs are read as the values in its shape's
    /// holes (it has a shape, and no output of it could be a CRD).
    valued: &'a [bool],
    /// Per workload, the index of its first template in `template_paths`.
    first_template: &'a [usize],
    patch_limits: &'a PatchLimits,
    limits: &'a Limits,
    stop: &'a Stop<'a>,
    progress: Option<&'a (dyn Fn(usize, usize) + Sync)>,
    digests_only: bool,
    helm: &'a HelmContext<'a>,
}

/// What rendering a fleet's Helm workloads needs: the releases made so far, the
/// seed and time, and per workload the index of its release's output among the
/// render's template paths (after every `.j2` template's).
struct HelmContext<'a> {
    cache: release::ReleaseCache,
    settings: release::ReleaseSettings<'a>,
    release_template: Vec<Option<usize>>,
}

fn render_inner(
    snapshot: &FleetSnapshot,
    options: &RenderOptions<'_>,
    (previous, parsed): (Option<&RenderOutput>, Option<&load::ParsedClusters>),
    fetch: &mut FetchBundles<'_>,
) -> RenderOutput {
    let stop = Stop::new(options);
    let limits = &options.limits;
    let patch_limits = PatchLimits {
        max_bytes: limits.max_resource_bytes,
        ..PatchLimits::default()
    };
    let mut diagnostics = snapshot.problems.clone();
    let (fleet, parsed) = load::load_reusing(snapshot, &mut diagnostics, parsed);
    let mut template_paths: Vec<&String> =
        fleet.workloads.iter().flat_map(|w| &w.templates).collect();
    // Helm values files that are templates are compiled with the manifests'.
    let values_templates = fleet
        .workloads
        .iter()
        .filter_map(|w| w.helm.as_deref())
        .flat_map(|r| &r.values_files)
        .filter_map(|file| match file {
            release::ValuesFile::Template { path } => Some(path),
            release::ValuesFile::Static { .. } => None,
        });
    let templates = Templates::compile_with(
        snapshot,
        template_paths.iter().copied().chain(values_templates),
        limits,
        &mut diagnostics,
    );
    // Each template's shape, read once: most outputs are then read without parsing.
    let mut shapes: Vec<Option<Shape>> = template_paths
        .par_iter()
        .map(|path| {
            snapshot
                .files
                .get(*path)
                .and_then(|source| Shape::of_template(source))
        })
        .collect();
    // Each Helm release's output is one more "template", named by its chart.
    let release_template: Vec<Option<usize>> = fleet
        .workloads
        .iter()
        .map(|w| {
            let release = w.helm.as_deref()?;
            template_paths.push(&release.chart_path);
            shapes.push(None);
            Some(template_paths.len() - 1)
        })
        .collect();
    let helm = HelmContext {
        cache: release::ReleaseCache::default(),
        settings: release::ReleaseSettings {
            seed: options.helm_seed.as_ref().unwrap_or(&release::PUBLIC_SEED),
            now: release::DEFAULT_NOW,
            budget: helm::gotmpl::Budget {
                max_output: limits.max_template_output_bytes,
                ..helm::gotmpl::Budget::default()
            },
        },
        release_template,
    };
    let first_template: Vec<usize> = fleet
        .workloads
        .iter()
        .scan(0, |next, workload| {
            let first = *next;
            *next += workload.templates.len();
            Some(first)
        })
        .collect();
    let valued: Vec<bool> = shapes
        .iter()
        .map(|shape| shape.as_ref().is_some_and(|s| !s.may_define_crd()))
        .collect();
    if stop.now() {
        return stop.abandoned(snapshot, diagnostics);
    }
    let (clusters, memberships) = select_clusters(&fleet, options, &mut diagnostics);
    // Selections are judged only when every file loaded: with a broken cluster file
    // "selects no cluster" would be a guess.
    let judge_selections =
        options.clusters.is_empty() && !diagnostics.iter().any(Diagnostic::is_error);
    if judge_selections {
        warn_about_empty_selections(&fleet, &clusters, &memberships, &mut diagnostics);
    }
    let rollout_plan = rollouts::plan(&fleet, &mut diagnostics, judge_selections);
    let (inputs, found) = if options.clusters.is_empty() {
        inputs::of_fleet(snapshot, &fleet, &clusters, &memberships)
    } else {
        let targeted = clusters
            .iter()
            .zip(&memberships)
            .map(|(cluster, groups)| targeted_workloads(&fleet, cluster, groups))
            .collect();
        let found = inputs::Found {
            targeted,
            selecting: Vec::new(),
        };
        (ClusterInputs::default(), found)
    };
    let targeted = &found.targeted;
    let shared = Shared {
        fleet: &fleet,
        templates: &templates,
        template_paths: &template_paths,
        shapes: &shapes,
        valued: &valued,
        first_template: &first_template,
        patch_limits: &patch_limits,
        limits,
        stop: &stop,
        progress: options.progress,
        digests_only: options.digests_only,
        helm: &helm,
    };

    // With a previous render, only the clusters whose inputs changed, and of those
    // only the changed workloads where that is sound. A problem of one cluster is
    // reported with how many clusters share it, which needs them all: then every
    // cluster is rendered.
    let mut redo: Vec<Redo> = clusters
        .iter()
        .map(|cluster| match previous {
            Some(previous) => redo_since(previous, &cluster.name, &inputs.clusters[&cluster.name]),
            None => Redo::All,
        })
        .collect();
    // The previous bundles of the clusters rendered in part, asked for once; without
    // them those clusters are rendered whole.
    let partial_names: Vec<String> = (0..clusters.len())
        .filter(|&i| matches!(redo[i], Redo::Workloads(_)))
        .map(|i| clusters[i].name.clone())
        .collect();
    let mut fetched: BTreeMap<String, Bundle> = BTreeMap::new();
    if let Some(previous) = previous
        && !partial_names.is_empty()
    {
        if let Some(bundles) = fetch(&partial_names)
            && bundles.len() == partial_names.len()
        {
            // Only a bundle that is the previous one (by digest) is merged with.
            fetched = partial_names
                .into_iter()
                .zip(bundles)
                .filter(|(name, bundle)| previous.bundles[name].digest == bundle.digest)
                .collect();
        }
        for (i, cluster) in clusters.iter().enumerate() {
            if matches!(redo[i], Redo::Workloads(_)) && !fetched.contains_key(&cluster.name) {
                redo[i] = Redo::All;
            }
        }
    }
    let (chosen, pass, whole) = loop {
        let chosen: Vec<usize> = (0..clusters.len())
            .filter(|&i| redo[i] != Redo::Nothing)
            .collect();
        let some_clusters: Vec<&Cluster> = chosen.iter().map(|&i| clusters[i]).collect();
        let some_memberships: Vec<Vec<usize>> =
            chosen.iter().map(|&i| memberships[i].clone()).collect();
        let jobs: Vec<Job<'_>> = chosen
            .iter()
            .map(|&i| Job {
                targeted: &targeted[i],
                only: match (&redo[i], previous) {
                    (Redo::Workloads(only), Some(previous)) => Some((
                        only.as_slice(),
                        &fetched[&clusters[i].name],
                        &previous.provenance.clusters[&clusters[i].name],
                    )),
                    _ => None,
                },
            })
            .collect();
        let whole = redo.iter().all(|r| *r == Redo::All);
        match render_clusters(&shared, &some_clusters, &some_memberships, &jobs) {
            Passed::Stopped => return stop.abandoned(snapshot, diagnostics),
            Passed::Widen(positions) => {
                for position in positions {
                    redo[chosen[position]] = Redo::All;
                }
            }
            Passed::Done(pass) if !whole && pass.has_cluster_problems() => {
                redo.fill(Redo::All);
            }
            Passed::Done(pass) => break (chosen, pass, whole),
        }
    };
    let judge_patches = options.clusters.is_empty()
        && !diagnostics
            .iter()
            .chain(&pass.diagnostics)
            .any(Diagnostic::is_error);
    let rendered: Vec<&Cluster> = chosen.iter().map(|&i| clusters[i]).collect();
    let mut kept = Vec::new();
    let mut provenance = Provenance::default();
    let mut assembled = Vec::with_capacity(pass.assembled.len());
    // Clusters whose resources came from the same workloads in the same order share
    // one list.
    let mut lists: HashSet<Arc<[u32]>, foldhash::fast::RandomState> = HashSet::default();
    let mut matches: HashSet<PatchMatches, foldhash::fast::RandomState> = HashSet::default();
    for (cluster, result) in rendered.iter().zip(pass.assembled) {
        assembled.push(result.map(|(bundle, mut found)| {
            if !inputs.is_empty() {
                found.resource_workloads = interned(&mut lists, found.resource_workloads);
                found.patch_matches = interned(&mut matches, found.patch_matches);
                provenance.clusters.insert(cluster.name.clone(), found);
            }
            bundle
        }));
    }
    if let Some(previous) = previous {
        for i in (0..clusters.len()).filter(|&i| redo[i] == Redo::Nothing) {
            let name = &clusters[i].name;
            kept.push(previous.bundles[name].clone());
            provenance
                .clusters
                .insert(name.clone(), previous.provenance.clusters[name].clone());
        }
    }
    let patch_warnings = match previous {
        _ if !judge_patches => Vec::new(),
        Some(_) if !whole => unmatched_patches_since(
            &fleet,
            (&clusters, targeted, &found.selecting),
            &redo,
            &pass.used_overlays,
            &provenance,
        ),
        _ => unmatched_patches(&fleet, &pass.used_overlays, &pass.matched),
    };
    diagnostics.extend(pass.diagnostics);
    diagnostics.extend(patch_warnings);
    diagnostics.extend(helm.cache.take_warnings());
    let generated_from_public_seed = options.helm_seed.is_none() && helm.cache.generated_any();
    if generated_from_public_seed {
        diagnostics.push(Diagnostic::warning(
            "a Helm chart generated values (randAlphaNum, genCA, ...) from flotilla's public seed: anyone can compute them; the hub uses its own secret seed",
        ));
    }
    let mut output = collect_output(
        snapshot,
        &fleet,
        (&clusters, &memberships),
        rendered.into_iter().zip(assembled),
        kept,
        diagnostics,
    );
    output.rollouts = rollout_plan;
    output.generated_from_public_seed = generated_from_public_seed;
    output.charts = fleet
        .workloads
        .iter()
        .filter_map(|w| {
            let release = w.helm.as_deref()?;
            let chart = release.chart.as_ref()?.chart();
            Some((
                w.name.clone(),
                format!(
                    "{} {} ({})",
                    chart.metadata.name, chart.metadata.version, release.chart_path
                ),
            ))
        })
        .collect();
    if options.clusters.is_empty() {
        output.parsed = Some(Arc::new(parsed));
    }
    provenance.inputs = inputs;
    // A cluster whose bundle `collect_output` dropped has no provenance either.
    provenance
        .clusters
        .retain(|name, _| output.bundles.contains_key(name));
    output.provenance = provenance;
    output
}

/// The list in `lists` equal to `list` (added if there is none).
fn interned<T: Eq + std::hash::Hash + ?Sized>(
    lists: &mut HashSet<Arc<T>, foldhash::fast::RandomState>,
    list: Arc<T>,
) -> Arc<T> {
    match lists.get(&list) {
        Some(known) => known.clone(),
        None => {
            lists.insert(list.clone());
            list
        }
    }
}

/// Renders `clusters` (with the groups each belongs to), each as its job says.
fn render_clusters(
    shared: &Shared<'_>,
    clusters: &[&Cluster],
    memberships: &[Vec<usize>],
    jobs: &[Job<'_>],
) -> Passed {
    let Shared {
        fleet,
        templates,
        template_paths,
        shapes,
        valued,
        first_template,
        patch_limits,
        limits,
        stop,
        progress,
        digests_only,
        helm,
    } = *shared;
    let mut diagnostics = Vec::new();
    let templates = Compiled {
        engine: templates,
        handles: template_paths
            .iter()
            .map(|path| templates.template(path))
            .collect(),
        workloads: fleet
            .workloads
            .iter()
            .map(|workload| {
                template::value_of(&WorkloadContext {
                    name: &workload.name,
                    namespace: workload.namespace.as_deref(),
                })
            })
            .collect(),
    };
    let templates = &templates;
    // Phase 1, per cluster: which workloads and overlays apply, and the template
    // outputs for them; distinct outputs are parsed once each.
    let cluster_plans: Vec<ClusterPlan> = clusters
        .par_iter()
        .zip(memberships.par_iter())
        .zip(jobs.par_iter())
        .map(|((cluster, groups), job)| {
            let only: Option<Vec<usize>> = job
                .only
                .map(|(positions, _, _)| positions.iter().map(|&p| job.targeted[p]).collect());
            plan_cluster(
                (fleet, templates, shapes, valued, helm),
                cluster,
                groups,
                only.as_deref(),
                stop,
            )
        })
        .collect();
    if stop.now() {
        return Passed::Stopped;
    }
    let (plans_per_cluster, outputs) = intern_outputs(cluster_plans, &mut diagnostics);
    let output_scopes: Vec<CustomScopes> = outputs
        .par_iter()
        .map(|(template, written)| match written {
            Written::Text(text) => scopes_defined_by(template_paths[*template], text),
            // Its template's kinds are its own text, none a CRD.
            Written::Values(_) => CustomScopes::new(),
            Written::Release(output) => output
                .documents
                .iter()
                .filter_map(|d| scope::cluster_scoped_crd(&d.value))
                .collect(),
        })
        .collect();
    let (cluster_scope, scope_table) = custom_scopes(fleet, &plans_per_cluster, &output_scopes);
    // A cluster rendered in part had no custom scope; if its changed workloads
    // bring one, every workload's resources may change.
    let widen: Vec<usize> = (0..jobs.len())
        .filter(|&k| jobs[k].only.is_some() && !scope_table[cluster_scope[k]].is_empty())
        .collect();
    if !widen.is_empty() {
        return Passed::Widen(widen);
    }

    // Phase 2: every distinct unit of work, rendered once; and the stencils of the
    // templates read as values, made once per template and unit group.
    let units = plan_units(&plans_per_cluster, &cluster_scope);
    let outputs = OutputTexts::new(outputs, &units.keys);
    let slots = StencilSlots::new(fleet, &units.groups, first_template, valued);
    let mut wanted = vec![false; slots.keys.len()];
    for key in &units.keys {
        if let Some(output) = key.output
            && let Some(slot) = slots.of(key.group, outputs.templates[output])
        {
            wanted[slot] = true;
        }
    }
    for (plans, groups) in plans_per_cluster.iter().zip(&units.plan_groups) {
        for (plan, &group) in plans.iter().zip(groups) {
            for (template, _) in &plan.filled {
                if let Some(slot) = slots.of(group, *template) {
                    wanted[slot] = true;
                }
            }
        }
    }
    let stencils: Vec<Option<StencilUnit>> = slots
        .keys
        .par_iter()
        .zip(wanted.par_iter())
        .map(|(&(group, template), &wanted)| {
            if !wanted {
                return None;
            }
            let group = &units.groups[group];
            let path: Arc<str> = Arc::from(template_paths[template].as_str());
            let shape = shapes[template].as_ref()?;
            let overlays: Vec<&Overlay> =
                group.overlays.iter().map(|&o| &fleet.overlays[o]).collect();
            let under = stencil::Under {
                workload: &fleet.workloads[group.workload],
                overlays: &overlays,
                scopes: &scope_table[group.scope],
                limits: patch_limits,
            };
            stop.run(&path, || stencil::compile(shape, &path, &under))
                .flatten()
        })
        .collect();
    if stop.now() {
        return Passed::Stopped;
    }
    let context = UnitContext {
        fleet,
        template_paths,
        shapes,
        patch_limits,
        max_resource_bytes: limits.max_resource_bytes,
    };
    let (rendered, matched): (Vec<UnitResult>, Vec<Vec<(usize, usize)>>) = units
        .keys
        .par_iter()
        .map(|key| {
            let group = &units.groups[key.group];
            let file = match key.output {
                Some(output) => template_paths[outputs.templates[output]].as_str(),
                None => fleet.workloads[group.workload].file.as_str(),
            };
            stop.run(file, || {
                let scopes = &scope_table[group.scope];
                let stencil = key
                    .output
                    .and_then(|output| slots.of(key.group, outputs.templates[output]))
                    .and_then(|slot| stencils[slot].as_ref());
                render_unit(&context, (group, scopes), (&outputs, key.output), stencil)
            })
            .unwrap_or_else(|| (Err(Vec::new()), Vec::new()))
        })
        .unzip();
    drop(outputs);
    if stop.now() {
        return Passed::Stopped;
    }
    report_unit_errors(fleet, clusters, &units, &rendered, &mut diagnostics);
    let used_overlays = units
        .groups
        .iter()
        .flat_map(|group| group.overlays.iter().copied())
        .collect();
    let ranks = Ranks::of(&rendered, &stencils);
    let overlay_files: Vec<Arc<str>> = fleet
        .overlays
        .iter()
        .map(|o| Arc::from(o.file.as_str()))
        .collect();
    let units_done = UnitsDone {
        keys: &units.keys,
        groups: &units.groups,
        rendered: &rendered,
        ranks: &ranks,
        matched: &matched,
        overlay_files: &overlay_files,
        slots: &slots,
        stencils: &stencils,
        scope_table: &scope_table,
        context: &context,
    };

    // Phase 3, per cluster: gather (filling in the outputs of its own), check
    // identities, sort and hash.
    let done = AtomicUsize::new(0);
    let total = clusters.len();
    let assembled: Vec<Option<ClusterDone>> = clusters
        .par_iter()
        .zip(units.per_cluster.par_iter())
        .zip(jobs.par_iter().zip(cluster_scope.par_iter()))
        .zip(
            plans_per_cluster
                .par_iter()
                .zip(units.plan_groups.par_iter()),
        )
        .map(|(((cluster, unit_list), (job, &scope)), (plans, groups))| {
            if stop.now() {
                return Some(ClusterDone::default());
            }
            let custom_scopes = !scope_table[scope].is_empty();
            let mut result = assemble(
                fleet,
                (cluster, job, custom_scopes),
                (unit_list, plans, groups),
                &units_done,
                stop,
            );
            if digests_only
                && let Some(ClusterDone {
                    assembled: Ok((bundle, _)),
                    ..
                }) = &mut result
            {
                bundle.resources = Vec::new();
            }
            let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(progress) = progress {
                progress(finished, total);
            }
            result
        })
        .collect();
    if stop.now() {
        return Passed::Stopped;
    }
    let widen: Vec<usize> = (0..assembled.len())
        .filter(|&k| assembled[k].is_none())
        .collect();
    if !widen.is_empty() {
        return Passed::Widen(widen);
    }
    let mut matched: BTreeSet<(usize, usize)> = matched.into_iter().flatten().collect();
    let assembled = assembled
        .into_iter()
        .flatten()
        .map(|done| {
            diagnostics.extend(done.errors);
            matched.extend(done.matched);
            done.assembled
        })
        .collect();
    Passed::Done(Pass {
        assembled,
        diagnostics,
        used_overlays,
        matched,
    })
}

/// Assigns dense ids to distinct keys in the order they are first seen. Keys can be
/// whole template outputs, so the hash is a fast one (foldhash, seeded at random, as
/// the keys come from the fleet's authors); SipHash was a tenth of a templated
/// fleet's render.
struct Interner<K> {
    ids: HashMap<K, usize, foldhash::fast::RandomState>,
}

impl<K: std::hash::Hash + Eq + Clone + Default> Interner<K> {
    fn new() -> Self {
        Interner {
            ids: HashMap::default(),
        }
    }

    fn intern(&mut self, key: K) -> usize {
        let next = self.ids.len();
        *self.ids.entry(key).or_insert(next)
    }

    /// The distinct keys, indexed by their ids.
    fn into_table(self) -> Vec<K> {
        let mut table = vec![K::default(); self.ids.len()];
        for (key, id) in self.ids {
            table[id] = key;
        }
        table
    }
}

/// The clusters to render (all, or those `options` names; unknown names are errors)
/// and, for each, the indices of the groups it belongs to.
fn select_clusters<'f>(
    fleet: &'f Fleet,
    options: &RenderOptions<'_>,
    diagnostics: &mut Vec<Diagnostic>,
) -> (Vec<&'f Cluster>, Vec<Vec<usize>>) {
    for name in &options.clusters {
        if !fleet.clusters.iter().any(|c| &c.name == name) {
            diagnostics.push(Diagnostic::error(format!(
                "no cluster named {name:?} in the fleet"
            )));
        }
    }
    let clusters: Vec<&Cluster> = fleet
        .clusters
        .iter()
        .filter(|c| options.clusters.is_empty() || options.clusters.contains(&c.name))
        .collect();
    let memberships = clusters
        .iter()
        .map(|cluster| {
            (0..fleet.groups.len())
                .filter(|&g| fleet.groups[g].selector.matches(&cluster.labels))
                .collect()
        })
        .collect();
    (clusters, memberships)
}

/// Gives every distinct (template, output) one id, rewrites each plan's outputs
/// to those ids, and returns the plans and the table of distinct outputs. An
/// output read as values that no other cluster has moves to its plan's `filled`
/// instead: with per-cluster templates most outputs are such, and they need no
/// table or unit of their own.
fn intern_outputs(
    cluster_plans: Vec<ClusterPlan>,
    diagnostics: &mut Vec<Diagnostic>,
) -> (Vec<Vec<Plan>>, Vec<(usize, Written)>) {
    let shared = shared_values(&cluster_plans);
    let mut outputs = Interner::new();
    let mut plans_per_cluster = Vec::with_capacity(cluster_plans.len());
    for (index, (mut plans, texts, plan_diagnostics)) in cluster_plans.into_iter().enumerate() {
        diagnostics.extend(plan_diagnostics);
        let mut ids: Vec<Option<usize>> = Vec::with_capacity(texts.len());
        let mut alone: Vec<Option<OwnOutput>> = Vec::with_capacity(texts.len());
        for (position, (template, written)) in texts.into_iter().enumerate() {
            match written {
                Written::Values(values) if !shared.contains(&(index as u32, position as u32)) => {
                    ids.push(None);
                    alone.push(Some((template, values)));
                }
                written => {
                    ids.push(Some(outputs.intern((template, written))));
                    alone.push(None);
                }
            }
        }
        for plan in &mut plans {
            let locals = std::mem::take(&mut plan.outputs);
            for local in locals {
                match ids[local] {
                    Some(id) => plan.outputs.push(id),
                    None => plan.filled.extend(alone[local].take()),
                }
            }
        }
        plans_per_cluster.push(plans);
    }
    (plans_per_cluster, outputs.into_table())
}

/// The outputs read as values that some other cluster has too, as (cluster,
/// position in its outputs): those are shared as units. Found by sorting hashes
/// (in parallel), not by a table of every output.
fn shared_values(
    cluster_plans: &[ClusterPlan],
) -> HashSet<(u32, u32), foldhash::fast::RandomState> {
    let state = foldhash::fast::RandomState::default();
    let mut hashes: Vec<(u64, u32, u32)> = cluster_plans
        .par_iter()
        .enumerate()
        .flat_map_iter(|(cluster, (_, texts, _))| {
            let state = &state;
            texts
                .iter()
                .enumerate()
                .filter(|(_, (_, written))| matches!(written, Written::Values(_)))
                .map(move |(position, key)| {
                    (
                        std::hash::BuildHasher::hash_one(state, key),
                        cluster as u32,
                        position as u32,
                    )
                })
        })
        .collect();
    hashes.par_sort_unstable();
    let key = |&(_, cluster, position): &(u64, u32, u32)| {
        &cluster_plans[cluster as usize].1[position as usize]
    };
    let mut shared = HashSet::default();
    for run in hashes
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|run| run.len() > 1)
    {
        // Equal hashes are almost always equal outputs; each is compared anyway.
        let mut kinds: Vec<(&(u64, u32, u32), bool)> = Vec::new();
        for entry in run {
            match kinds.iter_mut().find(|(first, _)| key(first) == key(entry)) {
                Some((first, many)) => {
                    if !*many {
                        shared.insert((first.1, first.2));
                        *many = true;
                    }
                    shared.insert((entry.1, entry.2));
                }
                None => kinds.push((entry, false)),
            }
        }
    }
    shared
}

/// The custom cluster-scoped kinds of each cluster, from the CRDs its workloads carry:
/// per cluster an id into the returned table of distinct sets.
fn custom_scopes(
    fleet: &Fleet,
    plans_per_cluster: &[Vec<Plan>],
    output_scopes: &[CustomScopes],
) -> (Vec<usize>, Vec<CustomScopes>) {
    let static_scopes: Vec<CustomScopes> = fleet
        .workloads
        .iter()
        .map(|w| {
            w.documents
                .iter()
                .filter_map(|d| scope::cluster_scoped_crd(&d.value))
                .collect()
        })
        .collect();
    let mut distinct = Interner::new();
    let cluster_scope = plans_per_cluster
        .iter()
        .map(|plans| {
            let mut scopes = CustomScopes::new();
            for plan in plans {
                scopes.extend(static_scopes[plan.workload].iter().cloned());
                for &output in &plan.outputs {
                    scopes.extend(output_scopes[output].iter().cloned());
                }
            }
            distinct.intern(scopes)
        })
        .collect();
    (cluster_scope, distinct.into_table())
}

/// The cluster-scoped kinds the CRDs of one template output define. Only an output
/// whose text could hold a CRD is parsed here: a `kind` of `CustomResourceDefinition`
/// is spelt out in the text, or written with a YAML escape (a backslash) in a
/// double-quoted scalar; no other YAML form (folding, block scalars, aliases, tags)
/// makes that word from text without it. An output that does not parse defines none
/// (its error is reported by the units that read it).
fn scopes_defined_by(path: &str, text: &str) -> CustomScopes {
    if !text.contains("CustomResourceDefinition") && !text.contains('\\') {
        return CustomScopes::new();
    }
    match parse_output(path, None, text) {
        Ok(documents) => documents
            .iter()
            .filter_map(|d| scope::cluster_scoped_crd(&d.value))
            .collect(),
        Err(_) => CustomScopes::new(),
    }
}

/// The distinct template outputs during phase 2. Each is kept as text (or as the
/// values in its template's holes) and parsed by the unit that reads it (a parsed
/// tree is several times the size of its text), and is freed as soon as the last
/// unit reading it has rendered, so a fleet of per-cluster templates never holds
/// every output at once, as text or as a tree.
struct OutputTexts {
    /// Per output, its template (an index into the render's template paths).
    templates: Vec<usize>,
    texts: Vec<Mutex<Option<Arc<Written>>>>,
    /// Per output, how many units have yet to read it.
    readers_left: Vec<AtomicUsize>,
}

impl OutputTexts {
    fn new(outputs: Vec<(usize, Written)>, units: &[UnitKey]) -> OutputTexts {
        let readers_left: Vec<AtomicUsize> = outputs.iter().map(|_| AtomicUsize::new(0)).collect();
        for output in units.iter().filter_map(|key| key.output) {
            readers_left[output].fetch_add(1, Ordering::Relaxed);
        }
        let (templates, texts) = outputs
            .into_iter()
            .map(|(template, written)| (template, Mutex::new(Some(Arc::new(written)))))
            .unzip();
        OutputTexts {
            templates,
            texts,
            readers_left,
        }
    }

    /// What `output` is, for a unit that reads it; `None` only if every reader
    /// already had it, which the counts rule out.
    fn text(&self, output: usize) -> Option<Arc<Written>> {
        self.texts[output]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A unit is done with `output`: the last reader frees its text.
    fn done_with(&self, output: usize) {
        if self.readers_left[output].fetch_sub(1, Ordering::AcqRel) == 1 {
            self.texts[output]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
        }
    }
}

/// The distinct units of work and who uses them. A unit is a workload's plain
/// manifests, or one template output, under one list of overlays and one set of
/// custom scopes (its group); clusters that share a unit share its resources.
struct Units {
    /// The distinct (workload, overlays, custom scopes) of the clusters' plans.
    groups: Vec<UnitGroup>,
    keys: Vec<UnitKey>,
    /// Per unit, the indices of the clusters that use it.
    users: Vec<Vec<usize>>,
    /// Per cluster, the units it is made of, in workload order.
    per_cluster: Vec<Vec<usize>>,
    /// Per cluster, the group of each of its plans.
    plan_groups: Vec<Vec<usize>>,
}

fn plan_units(plans_per_cluster: &[Vec<Plan>], cluster_scope: &[usize]) -> Units {
    let mut groups = Interner::new();
    let mut keys = Interner::new();
    let mut users: Vec<Vec<usize>> = Vec::new();
    let mut per_cluster = Vec::with_capacity(plans_per_cluster.len());
    let mut plan_groups = Vec::with_capacity(plans_per_cluster.len());
    for (index, plans) in plans_per_cluster.iter().enumerate() {
        let mut units = Vec::with_capacity(plans.len());
        let mut own_groups = Vec::with_capacity(plans.len());
        for plan in plans {
            let group = groups.intern(UnitGroup {
                workload: plan.workload,
                overlays: plan.overlays.clone(),
                scope: cluster_scope[index],
            });
            own_groups.push(group);
            let sources = std::iter::once(None).chain(plan.outputs.iter().map(|&o| Some(o)));
            for source in sources {
                let id = keys.intern(UnitKey {
                    group,
                    output: source,
                });
                if id == users.len() {
                    users.push(Vec::new());
                }
                users[id].push(index);
                units.push(id);
            }
        }
        per_cluster.push(units);
        plan_groups.push(own_groups);
    }
    Units {
        groups: groups.into_table(),
        keys: keys.into_table(),
        users,
        per_cluster,
        plan_groups,
    }
}

/// Where the stencil of each (unit group, template) is: every group of a workload
/// with templates read as values has a slot per template of the workload.
struct StencilSlots {
    /// Per group, its first slot.
    first: Vec<Option<usize>>,
    /// Per slot, its (group, template).
    keys: Vec<(usize, usize)>,
}

impl StencilSlots {
    fn new(
        fleet: &Fleet,
        groups: &[UnitGroup],
        first_template: &[usize],
        valued: &[bool],
    ) -> StencilSlots {
        let mut keys = Vec::new();
        let first = groups
            .iter()
            .enumerate()
            .map(|(index, group)| {
                let from = first_template[group.workload];
                let templates = from..from + fleet.workloads[group.workload].templates.len();
                if !valued[templates.clone()].contains(&true) {
                    return None;
                }
                let start = keys.len();
                keys.extend(templates.map(|template| (index, template)));
                Some(start)
            })
            .collect();
        StencilSlots { first, keys }
    }

    /// The slot of a template's stencil in a group (of the template's workload).
    fn of(&self, group: usize, template: usize) -> Option<usize> {
        let first = self.first[group]?;
        let (_, first_template) = self.keys[first];
        // A Helm release's output is no template of the workload's and has none.
        let slot = first + template.checked_sub(first_template)?;
        (self.keys.get(slot)? == &(group, template)).then_some(slot)
    }
}

/// A unit's errors are every user's errors.
fn report_unit_errors(
    fleet: &Fleet,
    clusters: &[&Cluster],
    units: &Units,
    rendered: &[Result<Vec<Rendered>, Vec<Diagnostic>>],
    diagnostics: &mut Vec<Diagnostic>,
) {
    for (id, unit) in rendered.iter().enumerate() {
        let Err(unit_diagnostics) = unit else {
            continue;
        };
        let workload = &fleet.workloads[units.groups[units.keys[id].group].workload].name;
        for diagnostic in unit_diagnostics {
            for &user in &units.users[id] {
                diagnostics.push(
                    diagnostic
                        .clone()
                        .for_cluster(&clusters[user].name)
                        .for_workload(workload),
                );
            }
        }
    }
}

/// Every distinct resource identity gets its rank in bundle order once, so that per
/// cluster, sorting and the duplicate check compare integers, not strings.
struct Ranks<'r> {
    /// The rank of each identity rendered by a unit or a stencil.
    of_key: HashMap<&'r ResourceKey, u32, foldhash::fast::RandomState>,
    /// Per unit, the rank of each of its resources.
    units: Vec<Vec<u32>>,
    /// Per stencil slot, the rank of each of its resources.
    stencils: Vec<Vec<u32>>,
}

impl<'r> Ranks<'r> {
    fn of(rendered: &'r [UnitResult], stencils: &'r [Option<StencilUnit>]) -> Ranks<'r> {
        // Distinct first: with per-cluster templates every cluster renders the same
        // identities, and sorting a million of them compared strings for a tenth of
        // the render.
        let unit_keys = rendered
            .iter()
            .flatten()
            .flatten()
            .map(|r| &*r.resource.key);
        let stencil_keys = stencils
            .iter()
            .flatten()
            .flat_map(|s| &s.resources)
            .map(|r| &*r.key);
        let mut of_key: HashMap<&ResourceKey, u32, foldhash::fast::RandomState> =
            unit_keys.chain(stencil_keys).map(|key| (key, 0)).collect();
        let mut keys: Vec<&ResourceKey> = of_key.keys().copied().collect();
        keys.sort_unstable();
        for (rank, key) in keys.into_iter().enumerate() {
            of_key.insert(key, rank as u32);
        }
        let units = rendered
            .par_iter()
            .map(|unit| match unit {
                Ok(rendered) => rendered.iter().map(|r| of_key[&*r.resource.key]).collect(),
                Err(_) => Vec::new(),
            })
            .collect();
        let stencils = stencils
            .iter()
            .map(|stencil| match stencil {
                Some(stencil) => stencil.resources.iter().map(|r| of_key[&*r.key]).collect(),
                None => Vec::new(),
            })
            .collect();
        Ranks {
            of_key,
            units,
            stencils,
        }
    }
}

/// The bundles of clusters that rendered without error and the bundles `kept` from
/// a previous render, every cluster's group memberships and labels, and every
/// diagnostic. An error that belongs to no single cluster leaves no bundle.
fn collect_output<'c>(
    snapshot: &FleetSnapshot,
    fleet: &Fleet,
    (clusters, memberships): (&[&Cluster], &[Vec<usize>]),
    assembled: impl Iterator<Item = (&'c Cluster, Result<Bundle, Vec<Diagnostic>>)>,
    kept: Vec<Bundle>,
    mut diagnostics: Vec<Diagnostic>,
) -> RenderOutput {
    let mut output = RenderOutput {
        revision: snapshot.revision.clone(),
        ..RenderOutput::default()
    };
    // Owned names, because `diagnostics` grows in the loop below.
    let failed: BTreeSet<String> = diagnostics
        .iter()
        .filter(|d| d.is_error())
        .filter_map(|d| d.cluster.clone())
        .collect();
    for bundle in kept {
        output.bundles.insert(bundle.cluster.clone(), bundle);
    }
    for (cluster, result) in assembled {
        match result {
            Ok(bundle) if !failed.contains(&cluster.name) => {
                output.bundles.insert(cluster.name.clone(), bundle);
            }
            Ok(_) => {}
            Err(cluster_diagnostics) => diagnostics.extend(cluster_diagnostics),
        }
    }
    for (cluster, groups) in clusters.iter().zip(memberships) {
        output.memberships.insert(
            cluster.name.clone(),
            groups
                .iter()
                .map(|&g| fleet.groups[g].name.clone())
                .collect(),
        );
        output
            .labels
            .insert(cluster.name.clone(), cluster.labels.clone());
    }
    // An error that belongs to no single cluster (a broken overlay or group file,
    // say) may have changed what every cluster gets, so no bundle is trustworthy.
    if diagnostics
        .iter()
        .any(|d| d.is_error() && d.cluster.is_none())
    {
        output.bundles.clear();
    }
    output.diagnostics = fold_cluster_repeats(diagnostics);
    output
}

/// The indices of the workloads that target `cluster` (a member of `groups`).
fn targeted_workloads(fleet: &Fleet, cluster: &Cluster, groups: &[usize]) -> Vec<usize> {
    (0..fleet.workloads.len())
        .filter(|&w| {
            fleet.workloads[w]
                .targets
                .iter()
                .any(|t| targets(&t.value, cluster, groups, fleet))
        })
        .collect()
}

fn targets(target: &Target, cluster: &Cluster, groups: &[usize], fleet: &Fleet) -> bool {
    if let Some(name) = &target.cluster {
        return *name == cluster.name;
    }
    if let Some(group) = &target.group {
        return groups.iter().any(|&g| fleet.groups[g].name == *group);
    }
    target
        .cluster_selector
        .as_ref()
        .is_some_and(|selector| selector.matches(&cluster.labels))
}

fn overlay_selects(overlay: &Overlay, cluster: &Cluster, groups: &[usize], fleet: &Fleet) -> bool {
    overlay.clusters.iter().any(|c| c.value == cluster.name)
        || overlay
            .groups
            .iter()
            .any(|name| groups.iter().any(|&g| fleet.groups[g].name == name.value))
        || overlay
            .cluster_selector
            .as_ref()
            .is_some_and(|selector| selector.matches(&cluster.labels))
}

fn overlay_applies_to(overlay: &Overlay, workload: &Workload) -> bool {
    overlay
        .workloads
        .as_ref()
        .is_none_or(|names| names.iter().any(|n| n.value == workload.name))
}

/// Deep merge: maps merge key by key, anything else is replaced by the later value.
pub fn merge_vars(base: &mut Map<String, Value>, later: &Map<String, Value>) {
    for (key, value) in later {
        match (base.get_mut(key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => {
                merge_vars(existing, incoming)
            }
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

type ClusterPlan = (Vec<Plan>, Vec<(usize, Written)>, Vec<Diagnostic>);

/// The template engine and each template of the render, looked up once (a lookup
/// takes a lock in the engine): `None` where a template failed to compile; and each
/// workload's part of the templates' context.
struct Compiled<'t> {
    engine: &'t Templates,
    handles: Vec<Option<minijinja::Template<'t, 't>>>,
    workloads: Vec<minijinja::Value>,
}

/// Plans one cluster's workloads, or only those in `only` (fleet indices).
fn plan_cluster(
    (fleet, templates, shapes, valued, helm): (
        &Fleet,
        &Compiled<'_>,
        &[Option<Shape>],
        &[bool],
        &HelmContext<'_>,
    ),
    cluster: &Cluster,
    groups: &[usize],
    only: Option<&[usize]>,
    stop: &Stop<'_>,
) -> ClusterPlan {
    let mut plans = Vec::new();
    let mut texts = Vec::new();
    let mut diagnostics = Vec::new();
    let mut cluster_part: Option<minijinja::Value> = None;
    // The merged variables already made, by the workload's own and its overlays.
    let mut known_vars: Vec<(&Vars, Vec<usize>, minijinja::Value)> = Vec::new();
    let matching_overlays: Vec<usize> = (0..fleet.overlays.len())
        .filter(|&o| overlay_selects(&fleet.overlays[o], cluster, groups, fleet))
        .collect();
    let mut template_offset = 0;
    for (index, workload) in fleet.workloads.iter().enumerate() {
        let first_template = template_offset;
        template_offset += workload.templates.len();
        if only.is_some_and(|only| !only.contains(&index)) {
            continue;
        }
        if !workload
            .targets
            .iter()
            .any(|t| targets(&t.value, cluster, groups, fleet))
        {
            continue;
        }
        let overlays: Vec<usize> = matching_overlays
            .iter()
            .copied()
            .filter(|&o| overlay_applies_to(&fleet.overlays[o], workload))
            .collect();
        let mut outputs = Vec::new();
        if !workload.templates.is_empty() {
            // Converted once for the workload's templates, not once per template;
            // its parts once for the cluster, and for workloads with the same
            // variables and overlays.
            let cluster_part = cluster_part.get_or_insert_with(|| {
                template::value_of(&ClusterContext {
                    name: &cluster.name,
                    labels: &cluster.labels,
                    vars: &cluster.vars,
                })
            });
            let found = known_vars
                .iter()
                .find(|(vars, those, _)| **vars == workload.vars && *those == overlays);
            let vars = match found {
                Some((_, _, vars)) => vars.clone(),
                None => {
                    let merged = merged_vars(fleet, workload, cluster, groups, &overlays);
                    let vars = template::value_of(&merged);
                    known_vars.push((&workload.vars, overlays.clone(), vars.clone()));
                    vars
                }
            };
            let context = Context::from_parts(cluster_part, &templates.workloads[index], &vars);
            for (offset, path) in workload.templates.iter().enumerate() {
                let template = &templates.handles[first_template + offset];
                let Some(rendered) = stop.run(path, || {
                    let template = template.as_ref()?;
                    Some(templates.engine.render_template(template, path, &context))
                }) else {
                    return (plans, texts, diagnostics);
                };
                match rendered {
                    Some(Ok(text)) => {
                        let template = first_template + offset;
                        let values = match &shapes[template] {
                            Some(shape) if valued[template] => shape.values(&text),
                            _ => None,
                        };
                        let written = match values {
                            Some(values) => {
                                Written::Values(values.into_iter().map(Box::from).collect())
                            }
                            None => Written::Text(text),
                        };
                        outputs.push(texts.len());
                        texts.push((template, written));
                    }
                    Some(Err(diagnostic)) => {
                        diagnostics.push(
                            diagnostic
                                .for_cluster(&cluster.name)
                                .for_workload(&workload.name),
                        );
                    }
                    None => {}
                }
            }
        }
        // A chart that could not be read was reported when the fleet was loaded.
        if let (Some(release), Some(template)) = (&workload.helm, helm.release_template[index])
            && release.chart.is_some()
        {
            let path = release.chart_path.as_str();
            let Some(rendered) = stop.run(path, || {
                render_release(
                    fleet,
                    templates,
                    helm,
                    (cluster, groups),
                    (workload, release),
                    &overlays,
                )
            }) else {
                return (plans, texts, diagnostics);
            };
            match rendered {
                Ok(output) => {
                    outputs.push(texts.len());
                    texts.push((template, Written::Release(output)));
                }
                Err(diagnostic) => diagnostics.push(
                    diagnostic
                        .for_cluster(&cluster.name)
                        .for_workload(&workload.name),
                ),
            }
        }
        plans.push(Plan {
            workload: index,
            overlays,
            outputs,
            filled: Vec::new(),
        });
    }
    (plans, texts, diagnostics)
}

/// A Helm workload's release for one cluster: its values merged (values files in
/// order, `.j2` ones rendered for the cluster first, then `spec.helm.values`, then
/// each overlay's `helmValues` in overlay order), rendered once per distinct input.
fn render_release(
    fleet: &Fleet,
    templates: &Compiled<'_>,
    helm: &HelmContext<'_>,
    (cluster, groups): (&Cluster, &[usize]),
    (workload, release): (&Workload, &release::HelmRelease),
    overlays: &[usize],
) -> Result<Arc<release::ReleaseOutput>, Diagnostic> {
    let mut values = Map::new();
    for file in &release.values_files {
        match file {
            release::ValuesFile::Static { values: those, .. } => {
                release::merge_values(&mut values, those);
            }
            release::ValuesFile::Template { path } => {
                let vars =
                    template::value_of(&merged_vars(fleet, workload, cluster, groups, overlays));
                let cluster_part = template::value_of(&ClusterContext {
                    name: &cluster.name,
                    labels: &cluster.labels,
                    vars: &cluster.vars,
                });
                let index = fleet
                    .workloads
                    .iter()
                    .position(|w| std::ptr::eq(w, workload))
                    .unwrap_or_default();
                let context =
                    Context::from_parts(&cluster_part, &templates.workloads[index], &vars);
                let Some(template) = templates.engine.template(path) else {
                    return Err(Diagnostic::error(
                        "this values template did not compile (reported above)",
                    )
                    .in_file(path.as_str()));
                };
                let text = templates
                    .engine
                    .render_template(&template, path, &context)?;
                let those = release::values_map(&text).map_err(|message| {
                    Diagnostic::error(format!("the rendered values file: {message}"))
                        .in_file(path.as_str())
                })?;
                release::merge_values(&mut values, &those);
            }
        }
    }
    release::merge_values(&mut values, &release.values);
    for &overlay in overlays {
        release::merge_values(&mut values, &fleet.overlays[overlay].helm_values);
    }
    let capabilities = release::capabilities(
        cluster.kubernetes.as_ref(),
        fleet.settings.kubernetes.as_ref(),
    );
    helm.cache.render(
        &helm.settings,
        (&workload.name, release),
        &cluster.name,
        &values,
        &capabilities,
    )
}

fn merged_vars(
    fleet: &Fleet,
    workload: &Workload,
    cluster: &Cluster,
    groups: &[usize],
    overlays: &[usize],
) -> Vars {
    let mut vars = workload.vars.clone();
    for &group in groups {
        merge_vars(&mut vars, &fleet.groups[group].vars);
    }
    merge_vars(&mut vars, &cluster.vars);
    for &overlay in overlays {
        merge_vars(&mut vars, &fleet.overlays[overlay].vars);
    }
    vars
}

/// The documents of a template's output: read through the template's shape when it
/// has one that fits this output (see [`shape`]), else parsed.
fn parse_output(
    path: &str,
    shape: Option<&Shape>,
    text: &str,
) -> Result<Vec<SourcedDocument>, Diagnostic> {
    let file: Arc<str> = Arc::from(path);
    let sourced = |documents: Vec<kyaml::Document>| {
        documents
            .into_iter()
            .map(|d| SourcedDocument {
                value: d.value,
                file: file.clone(),
                line: d.line,
            })
            .collect()
    };
    if let Some(documents) = shape.and_then(|shape| shape.read(text)) {
        return Ok(sourced(documents));
    }
    kyaml::read_documents(text).map(sourced).map_err(|err| {
        let at = err
            .line
            .map(|l| format!(" at line {l} of the rendered output"))
            .unwrap_or_default();
        Diagnostic::error(format!(
            "the rendered template is not valid YAML{at}: {}",
            err.message
        ))
        .in_file(path)
    })
}

/// What a cluster's workload is rendered under: the same for every cluster with
/// the same overlays and custom scopes.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
struct UnitGroup {
    workload: usize,
    overlays: Vec<usize>,
    scope: usize,
}

/// One distinct piece of rendering work (see [`Units`]).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
struct UnitKey {
    group: usize,
    /// `None` for the workload's plain manifests, else a template output.
    output: Option<usize>,
}

type UnitResult = Result<Vec<Rendered>, Vec<Diagnostic>>;

/// What rendering a unit needs besides its key.
struct UnitContext<'a> {
    fleet: &'a Fleet,
    template_paths: &'a [&'a String],
    shapes: &'a [Option<Shape>],
    patch_limits: &'a PatchLimits,
    max_resource_bytes: usize,
}

/// Renders one unit (of a group with its custom scopes, reading `output` of
/// `outputs` or the workload's plain manifests); also returns the (overlay, patch)
/// pairs whose target matched one of its resources.
fn render_unit(
    unit: &UnitContext<'_>,
    (group, scopes): (&UnitGroup, &CustomScopes),
    (outputs, output): (&OutputTexts, Option<usize>),
    stencil: Option<&StencilUnit>,
) -> (UnitResult, Vec<(usize, usize)>) {
    let Some(output) = output else {
        // The workload's own manifests are shared by its units and copied.
        let documents = unit.fleet.workloads[group.workload].documents.to_vec();
        return transform_in_group(unit, (group, scopes), documents);
    };
    // A template's output was read for this unit and is used up.
    let template = outputs.templates[output];
    let written = outputs.text(output);
    outputs.done_with(output);
    match written.as_deref() {
        Some(written) => render_output(unit, (group, scopes), (template, written), stencil),
        None => (
            Err(vec![
                Diagnostic::error(
                    "internal error: this template's output was freed before every unit had read it",
                )
                .in_file(unit.template_paths[template].as_str()),
            ]),
            Vec::new(),
        ),
    }
}

/// Renders what `template` wrote for a cluster, in a group: an output read as
/// values is filled in from `stencil` when there is one and it takes them, and
/// otherwise (like any other output) parsed and transformed.
fn render_output(
    unit: &UnitContext<'_>,
    (group, scopes): (&UnitGroup, &CustomScopes),
    (template, written): (usize, &Written),
    stencil: Option<&StencilUnit>,
) -> (UnitResult, Vec<(usize, usize)>) {
    let path = unit.template_paths[template];
    let shape = unit.shapes[template].as_ref();
    let parsed = match written {
        Written::Text(text) => parse_output(path, shape, text),
        Written::Release(output) => Ok(output.documents.clone()),
        Written::Values(values) => {
            if let (Some(stencil), Some(shape)) = (stencil, shape)
                && let Some(filled) = fill(stencil, shape, values, unit.max_resource_bytes)
            {
                return (Ok(filled), matched_pairs(group, &stencil.matched));
            }
            match shape {
                Some(shape) => parse_output(path, Some(shape), &shape.text_with(values)),
                None => Err(Diagnostic::error(
                    "internal error: a template without a shape had its output read as values",
                )
                .in_file(path.as_str())),
            }
        }
    };
    match parsed {
        Ok(documents) => transform_in_group(unit, (group, scopes), documents),
        Err(diagnostic) => (Err(vec![diagnostic]), Vec::new()),
    }
}

/// Transforms documents under a group's overlays; also returns the (overlay,
/// patch) pairs that matched.
fn transform_in_group(
    unit: &UnitContext<'_>,
    (group, scopes): (&UnitGroup, &CustomScopes),
    documents: Vec<SourcedDocument>,
) -> (UnitResult, Vec<(usize, usize)>) {
    let fleet = unit.fleet;
    let workload = &fleet.workloads[group.workload];
    let overlays: Vec<&Overlay> = group.overlays.iter().map(|&o| &fleet.overlays[o]).collect();
    let mut flags: Vec<Vec<bool>> = overlays
        .iter()
        .map(|overlay| vec![false; overlay.patches.len()])
        .collect();
    let result = transform_documents(unit, scopes, documents, workload, &overlays, &mut flags);
    (result, matched_pairs(group, &flags))
}

/// The (overlay, patch) pairs a group's flags mark as matched.
fn matched_pairs(group: &UnitGroup, flags: &[Vec<bool>]) -> Vec<(usize, usize)> {
    group
        .overlays
        .iter()
        .zip(flags)
        .flat_map(|(&overlay, flags)| {
            flags
                .iter()
                .enumerate()
                .filter(|(_, hit)| **hit)
                .map(move |(patch, _)| (overlay, patch))
        })
        .collect()
}

/// The resources of an output read as `values`, filled in from its stencil; `None`
/// when a scalar cannot be read or the stencil does not take them (the output is
/// then rendered from its text, which says why).
fn fill(
    stencil: &StencilUnit,
    shape: &Shape,
    values: &[Box<str>],
    max_resource_bytes: usize,
) -> Option<Vec<Rendered>> {
    let scalars = shape.scalars(values)?;
    let filled = stencil.fill(&scalars, max_resource_bytes)?;
    Some(
        stencil
            .resources
            .iter()
            .zip(filled)
            .map(|(resource, canonical)| Rendered {
                resource: Arc::new(Resource {
                    key: resource.key.clone(),
                    canonical: canonical.into_boxed_slice(),
                }),
                file: resource.file.clone(),
                line: resource.line,
            })
            .collect(),
    )
}

fn transform_documents(
    unit: &UnitContext<'_>,
    scopes: &CustomScopes,
    documents: Vec<SourcedDocument>,
    workload: &Workload,
    overlays: &[&Overlay],
    flags: &mut [Vec<bool>],
) -> UnitResult {
    let mut rendered = Vec::with_capacity(documents.len());
    let mut errors = Vec::new();
    for document in documents {
        let (file, line) = (document.file.clone(), document.line);
        match transform::transform(
            document,
            workload,
            overlays,
            scopes,
            unit.patch_limits,
            flags,
        ) {
            Ok((key, value)) => {
                let resource = Resource::new(key, &value);
                if resource.canonical.len() > unit.max_resource_bytes {
                    errors.push(
                        Diagnostic::error(format!(
                            "{} is {} bytes as JSON, over the limit of {} bytes for one resource \
                             (--max-resource-bytes)",
                            resource.key,
                            resource.canonical.len(),
                            unit.max_resource_bytes
                        ))
                        .in_file(&*file)
                        .at_line(Some(line)),
                    );
                    continue;
                }
                rendered.push(Rendered {
                    resource: Arc::new(resource),
                    file,
                    line,
                });
            }
            Err(diagnostic) => errors.push(diagnostic),
        }
    }
    if errors.is_empty() {
        Ok(rendered)
    } else {
        Err(errors)
    }
}

/// What phase 2 rendered: per unit, its key, resources, their ranks and the
/// (overlay, patch) pairs that matched; each overlay's file; and what filling in a
/// cluster's own outputs needs.
struct UnitsDone<'a> {
    keys: &'a [UnitKey],
    groups: &'a [UnitGroup],
    rendered: &'a [UnitResult],
    ranks: &'a Ranks<'a>,
    matched: &'a [Vec<(usize, usize)>],
    overlay_files: &'a [Arc<str>],
    slots: &'a StencilSlots,
    stencils: &'a [Option<StencilUnit>],
    scope_table: &'a [CustomScopes],
    context: &'a UnitContext<'a>,
}

/// What assembling one cluster gave, and what rendering its own outputs found: the
/// errors (for the cluster and workload) and the (overlay, patch) pairs that
/// matched.
struct ClusterDone {
    assembled: Assembled,
    errors: Vec<Diagnostic>,
    matched: Vec<(usize, usize)>,
}

impl Default for ClusterDone {
    /// Nothing assembled, as for a render that stopped.
    fn default() -> ClusterDone {
        ClusterDone {
            assembled: Err(Vec::new()),
            errors: Vec::new(),
            matched: Vec::new(),
        }
    }
}

/// A resource of a cluster with its rank (`u32::MAX` when its identity has none:
/// it came from an output rendered as text in assembly) and the workload it came
/// from.
type Ranked<'a> = (u32, &'a Rendered, usize);

/// One cluster's bundle from its units and its own outputs (filled in from their
/// stencils, or rendered from their text when a stencil does not take them), sorted
/// and checked for duplicate identities, with where its parts came from. A cluster
/// rendered in part keeps its previous bundle's resources of the other workloads;
/// `None` when a resource of its changed workloads has the identity of one of those
/// (rendered whole, the error names both).
fn assemble(
    fleet: &Fleet,
    (cluster, job, custom_scopes): (&Cluster, &Job<'_>, bool),
    (unit_list, plans, plan_groups): (&[usize], &[Plan], &[usize]),
    units: &UnitsDone<'_>,
    stop: &Stop<'_>,
) -> Option<ClusterDone> {
    let position = |workload: usize| -> u32 {
        let found = job.targeted.binary_search(&workload);
        found.map_or(u32::MAX, |p| p as u32)
    };
    let mut done = ClusterDone::default();
    // The cluster's own outputs first, so that the list below can borrow them.
    let mut own: Vec<(u32, Rendered, usize)> = Vec::new();
    let mut patch_matches = Vec::new();
    for (plan, &group) in plans.iter().zip(plan_groups) {
        let first = done.matched.len();
        for (template, values) in &plan.filled {
            let slot = units.slots.of(group, *template);
            let stencil = slot.and_then(|slot| units.stencils[slot].as_ref());
            let shape = units.context.shapes[*template].as_ref();
            if let (Some(slot), Some(stencil), Some(shape)) = (slot, stencil, shape)
                && let Some(filled) = fill(stencil, shape, values, units.context.max_resource_bytes)
            {
                let ranks = &units.ranks.stencils[slot];
                own.extend(
                    ranks
                        .iter()
                        .zip(filled)
                        .map(|(&rank, item)| (rank, item, plan.workload)),
                );
                done.matched
                    .extend(matched_pairs(&units.groups[group], &stencil.matched));
                continue;
            }
            // Not filled in: rendered from its text, as a unit would.
            let file = units.context.template_paths[*template].as_str();
            let group_of = &units.groups[group];
            let scopes = &units.scope_table[group_of.scope];
            let written = Written::Values(values.clone());
            let (result, matched) = stop.run(file, || {
                render_output(
                    units.context,
                    (group_of, scopes),
                    (*template, &written),
                    None,
                )
            })?;
            done.matched.extend(matched);
            match result {
                Ok(rendered) => own.extend(rendered.into_iter().map(|item| {
                    let rank = units.ranks.of_key.get(&*item.resource.key);
                    (rank.copied().unwrap_or(u32::MAX), item, plan.workload)
                })),
                Err(errors) => done.errors.extend(errors.into_iter().map(|diagnostic| {
                    diagnostic
                        .for_cluster(&cluster.name)
                        .for_workload(&fleet.workloads[plan.workload].name)
                })),
            }
        }
        patch_matches.extend(done.matched[first..].iter().map(|&(o, p)| {
            (
                units.overlay_files[o].clone(),
                p as u32,
                position(plan.workload),
            )
        }));
    }
    let mut ranked: Vec<Ranked<'_>> = Vec::new();
    for &unit in unit_list {
        let workload = units.groups[units.keys[unit].group].workload;
        patch_matches.extend(
            units.matched[unit]
                .iter()
                .map(|&(o, p)| (units.overlay_files[o].clone(), p as u32, position(workload))),
        );
        let Ok(rendered) = &units.rendered[unit] else {
            continue;
        };
        ranked.extend(
            units.ranks.units[unit]
                .iter()
                .zip(rendered)
                .map(|(&rank, item)| (rank, item, workload)),
        );
    }
    ranked.extend(
        own.iter()
            .map(|(rank, item, workload)| (*rank, item, *workload)),
    );
    // A stable sort keeps equal identities in workload order, so the duplicate is
    // reported at the later one.
    let ranked_all = ranked.iter().all(|(rank, _, _)| *rank != u32::MAX);
    if ranked_all {
        ranked.sort_by_key(|(rank, _, _)| *rank);
    } else {
        ranked.sort_by(|a, b| a.1.resource.key.cmp(&b.1.resource.key));
    }
    let mut errors = Vec::new();
    // A resource two workloads carry byte for byte (the same CRD shipped by two
    // charts) is kept once, with a warning.
    let mut repeated = vec![false; ranked.len()];
    for (index, pair) in ranked.windows(2).enumerate() {
        let ((rank, first, first_workload), (next_rank, item, workload)) = (pair[0], pair[1]);
        let same = if ranked_all {
            rank == next_rank
        } else {
            first.resource.key == item.resource.key
        };
        if same && workload != first_workload && first.resource.canonical == item.resource.canonical
        {
            repeated[index + 1] = true;
            done.errors.push(
                Diagnostic::warning(format!(
                    "{} is defined by two workloads, {} and {}, byte for byte the same: it is kept once",
                    item.resource.key,
                    fleet.workloads[first_workload].name,
                    fleet.workloads[workload].name,
                ))
                .in_file(&*item.file)
                .at_line(Some(item.line))
                .for_cluster(&cluster.name),
            );
        } else if same {
            errors.push(
                Diagnostic::error(format!(
                    "{} is defined twice for this cluster: here (workload {}) and at {}:{} (workload {})",
                    item.resource.key,
                    fleet.workloads[workload].name,
                    first.file,
                    first.line,
                    fleet.workloads[first_workload].name
                ))
                .in_file(&*item.file)
                .at_line(Some(item.line))
                .for_cluster(&cluster.name),
            );
        }
    }
    if !errors.is_empty() {
        done.assembled = match job.only {
            Some(_) => return None,
            None => Err(errors),
        };
        return Some(done);
    }
    let fresh = ranked
        .into_iter()
        .zip(repeated)
        .filter(|(_, repeated)| !repeated)
        .map(|((_, item, workload), _)| (item.resource.clone(), position(workload)));
    let (resources, resource_workloads): (Vec<Arc<Resource>>, Vec<u32>) = match job.only {
        None => fresh.unzip(),
        Some((changed, previous, kept)) => {
            let is_changed = |w: u32| changed.contains(&(w as usize));
            patch_matches.extend(
                kept.patch_matches
                    .iter()
                    .filter(|(_, _, w)| !is_changed(*w))
                    .cloned(),
            );
            let old = previous
                .resources
                .iter()
                .zip(kept.resource_workloads.iter())
                .filter(|(_, w)| !is_changed(**w))
                .map(|(r, &w)| (r.clone(), w));
            merge_by_key(old, fresh)?
        }
    };
    patch_matches.sort();
    patch_matches.dedup();
    done.assembled = Ok((
        Bundle::from_sorted(cluster.name.clone(), resources),
        ClusterProvenance {
            resource_workloads: resource_workloads.into(),
            patch_matches: patch_matches.into(),
            custom_scopes,
        },
    ));
    Some(done)
}

/// Merges two lists of resources, each in key order, into one; `None` when both
/// have a key.
fn merge_by_key(
    a: impl Iterator<Item = (Arc<Resource>, u32)>,
    b: impl Iterator<Item = (Arc<Resource>, u32)>,
) -> Option<(Vec<Arc<Resource>>, Vec<u32>)> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    let mut resources = Vec::new();
    let mut workloads = Vec::new();
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(x), Some(y)) => match x.0.key.cmp(&y.0.key) {
                std::cmp::Ordering::Less => true,
                std::cmp::Ordering::Greater => false,
                std::cmp::Ordering::Equal => return None,
            },
        };
        let (resource, workload) = if take_a { a.next() } else { b.next() }?;
        resources.push(resource);
        workloads.push(workload);
    }
    Some((resources, workloads))
}

fn warn_about_empty_selections(
    fleet: &Fleet,
    clusters: &[&Cluster],
    memberships: &[Vec<usize>],
    diagnostics: &mut Vec<Diagnostic>,
) {
    for (index, group) in fleet.groups.iter().enumerate() {
        if !memberships.iter().any(|m| m.contains(&index)) {
            diagnostics.push(
                Diagnostic::warning(format!("group {:?} selects no cluster", group.name))
                    .in_file(&group.file),
            );
        }
    }
    for workload in &fleet.workloads {
        for target in &workload.targets {
            let hit = clusters
                .iter()
                .zip(memberships)
                .any(|(cluster, groups)| targets(&target.value, cluster, groups, fleet));
            if !hit {
                diagnostics.push(
                    Diagnostic::warning("this target selects no cluster")
                        .in_file(&workload.file)
                        .at_line(Some(target.referenced.line())),
                );
            }
        }
    }
    for overlay in &fleet.overlays {
        let hit = clusters
            .iter()
            .zip(memberships)
            .any(|(cluster, groups)| overlay_selects(overlay, cluster, groups, fleet));
        if !hit {
            diagnostics.push(
                Diagnostic::warning(format!("overlay {:?} selects no cluster", overlay.name))
                    .in_file(&overlay.file),
            );
        }
    }
}

/// kustomize fails on a patch whose target matches nothing; an overlay is shared by
/// many clusters, so such a patch is a warning (an error under `validate --strict`),
/// given when no cluster has a resource it matches.
fn unmatched_patch_warning(overlay: &Overlay, patch: &load::CompiledPatch) -> Diagnostic {
    Diagnostic::warning(format!(
        "the target of this patch of overlay {:?} matches no resource on any cluster it applies to",
        overlay.name
    ))
    .in_file(&overlay.file)
    .at_line(Some(patch.line))
}

/// The warnings for the patches of used overlays that matched nothing.
fn unmatched_patches(
    fleet: &Fleet,
    used: &BTreeSet<usize>,
    matched: &BTreeSet<(usize, usize)>,
) -> Vec<Diagnostic> {
    let mut warnings = Vec::new();
    for &index in used {
        let overlay = &fleet.overlays[index];
        for (patch_index, patch) in overlay.patches.iter().enumerate() {
            if !matched.contains(&(index, patch_index)) {
                warnings.push(unmatched_patch_warning(overlay, patch));
            }
        }
    }
    warnings
}

/// The patch warnings of a render that rendered only some clusters, or some
/// workloads of them, and kept the rest of `previous`. An overlay that applies to a
/// cluster not rendered whole has an unchanged file (a changed one changes the own
/// inputs of every cluster it selects), so its patches are named by file alike on
/// both sides: a patch matches somewhere if some cluster's provenance says so.
fn unmatched_patches_since(
    fleet: &Fleet,
    (clusters, targeted, selecting): (&[&Cluster], &[Vec<usize>], &[Vec<usize>]),
    redo: &[Redo],
    used_in_pass: &BTreeSet<usize>,
    provenance: &Provenance,
) -> Vec<Diagnostic> {
    // Per overlay with patches, the clusters it selects.
    let mut selected: Vec<Vec<usize>> = vec![Vec::new(); fleet.overlays.len()];
    for (c, overlays) in selecting.iter().enumerate() {
        for &o in overlays {
            if !fleet.overlays[o].patches.is_empty() {
                selected[o].push(c);
            }
        }
    }
    let mut warnings = Vec::new();
    for (index, overlay) in fleet.overlays.iter().enumerate() {
        if overlay.patches.is_empty() {
            continue;
        }
        // Used, as in the units of a full render: by a unit of this pass, or by a
        // cluster not rendered whole that it selects, with a workload it applies to.
        let used = used_in_pass.contains(&index)
            || selected[index].iter().any(|&c| {
                redo[c] != Redo::All
                    && targeted[c]
                        .iter()
                        .any(|&w| overlay_applies_to(overlay, &fleet.workloads[w]))
            });
        if !used {
            continue;
        }
        // A patch matched somewhere if it did on some cluster the overlay selects:
        // usually the first one looked at.
        let mut unmatched = vec![true; overlay.patches.len()];
        let mut left = unmatched.len();
        for &c in &selected[index] {
            let Some(found) = provenance.clusters.get(&clusters[c].name) else {
                continue;
            };
            for (file, patch, _) in found.patch_matches.iter() {
                if **file == *overlay.file
                    && let Some(slot) = unmatched.get_mut(*patch as usize)
                    && *slot
                {
                    *slot = false;
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
        for (patch, unmatched) in overlay.patches.iter().zip(unmatched) {
            if unmatched {
                warnings.push(unmatched_patch_warning(overlay, patch));
            }
        }
    }
    warnings
}

/// The same problem met on many clusters is reported once, naming the first cluster
/// and how many others share it, so a broken group does not bury everything else.
fn fold_cluster_repeats(diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut folded: BTreeMap<Diagnostic, (String, usize)> = BTreeMap::new();
    let mut plain = Vec::new();
    for diagnostic in diagnostics {
        match diagnostic.cluster.clone() {
            Some(cluster) => {
                let key = Diagnostic {
                    cluster: None,
                    ..diagnostic
                };
                let entry = folded.entry(key).or_insert_with(|| (cluster.clone(), 0));
                if cluster < entry.0 {
                    entry.0 = cluster;
                }
                entry.1 += 1;
            }
            None => plain.push(diagnostic),
        }
    }
    for (mut diagnostic, (first, count)) in folded {
        diagnostic.cluster = Some(if count > 1 {
            format!(
                "{first} and {} other cluster{}",
                count - 1,
                if count > 2 { "s" } else { "" }
            )
        } else {
            first
        });
        plain.push(diagnostic);
    }
    plain.sort();
    plain.dedup();
    plain
}
