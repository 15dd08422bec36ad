//! The render behind [`crate::render_with`] and [`crate::render_since`]: the fleet
//! loaded and its templates compiled, the clusters selected, the clusters (or
//! workloads) to render again chosen ([`since`]), passes over them ([`pass`]) until
//! one completes, and the output collected with the fleet's warnings
//! ([`warnings`]). Every step asks [`stop`] whether to go on.
//!
//! - `stop` — the render's deadline and cancel flag.
//! - `since` — how much of each cluster a previous render leaves to render again.
//! - `pass` — one pass over some clusters: `plan` (phase 1, per cluster), `units`
//!   (phase 2, every distinct unit of work once) and `assemble` (phase 3, per
//!   cluster, and the render's output).
//! - `warnings` — empty selections, unmatched patches, repeats folded.

mod assemble;
mod pass;
mod plan;
mod since;
mod stop;
mod units;
mod warnings;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use rayon::prelude::*;

use flotilla_core::bundle::Bundle;
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;

use assemble::collect_output;
use pass::{Passed, Shared, render_clusters};
use since::{Job, Redo, redo_since};
use stop::Stop;
use warnings::{unmatched_patches, unmatched_patches_since, warn_about_empty_selections};

use crate::inputs::{self, ClusterInputs};
use crate::load::{self, Cluster};
use crate::patch::PatchLimits;
use crate::select::{select_clusters, targeted_workloads};
use crate::shape::Shape;
use crate::template::Templates;
use crate::{
    ClusterProvenance, FetchBundles, PatchMatches, Provenance, ReleaseWarnings, RenderOptions,
    RenderOutput,
};
use crate::{helm, release, rollouts};

/// What rendering a fleet's Helm workloads needs: the releases made so far, the
/// seed and time, and per workload the index of its release's output among the
/// render's template paths (after every `.j2` template's).
struct HelmContext<'a> {
    cache: release::ReleaseCache,
    settings: release::ReleaseSettings<'a>,
    /// The hashing of each tenant's releases, by the tenant's index (the platform's
    /// is in `settings`).
    tenant_hashings: &'a [crate::seal::SecretHashing],
    release_template: Vec<Option<usize>>,
    /// The capabilities of every cluster whose file names no `spec.kubernetes`,
    /// made once for the render.
    default_capabilities: helm::render::Capabilities,
    /// The release of each (workload, overlays) whose values are merged from static
    /// files and overlays only, for clusters with the default capabilities: the same
    /// input for every such cluster, so its output is looked up here before the
    /// values are merged and keyed (kept only when it does not depend on the
    /// cluster, as a generating chart's does).
    by_overlays: std::sync::Mutex<ReleasesByOverlays>,
}

/// A release output by its workload and the overlays that apply to it.
type ReleasesByOverlays =
    std::collections::HashMap<(usize, Vec<usize>), Arc<release::ReleaseOutput>>;

pub(crate) fn render_inner(
    snapshot: &FleetSnapshot,
    options: &RenderOptions<'_>,
    (previous, parsed): (Option<&RenderOutput>, Option<&load::ParsedClusters>),
    fetch: &mut FetchBundles<'_>,
) -> RenderOutput {
    // A fleet read in part (a budget stopped the read) would render into errors
    // about what was not read: the reason it was not is the one error.
    if snapshot.incomplete {
        return RenderOutput {
            revision: snapshot.revision.clone(),
            incomplete: true,
            diagnostics: snapshot.problems.clone(),
            ..RenderOutput::default()
        };
    }
    let stop = Stop::new(options);
    let limits = &options.limits;
    let patch_limits = PatchLimits {
        max_bytes: limits.max_resource_bytes,
        ..PatchLimits::default()
    };
    let mut diagnostics = snapshot.problems.clone();
    let mut sops_secrets = Vec::new();
    // The Tenant files, read once: which tenant owns each SOPS file, then the load.
    let tenants = load::TenantFiles::read(snapshot);
    let opened = crate::sops::open_snapshot(
        snapshot,
        &options.sops,
        &tenants,
        (&mut diagnostics, &mut sops_secrets),
    );
    let snapshot: &FleetSnapshot = &opened;
    let (fleet, parsed) = load::load_reusing(snapshot, &mut diagnostics, parsed, tenants);
    let mut template_paths: Vec<&String> =
        fleet.workloads.iter().flat_map(|w| &w.templates).collect();
    // Helm values files that are templates are compiled with the manifests'.
    let values_templates = fleet.workloads.iter().flat_map(values_templates_of);
    let mut templates = Templates::compile_with(
        snapshot,
        template_paths.iter().copied().chain(values_templates),
        limits,
        &mut diagnostics,
    );
    // A tenant's templates may load only templates inside its fence.
    for tenant in 0..fleet.tenants.len() {
        let owned: Vec<&String> = fleet
            .workloads
            .iter()
            .filter(|w| w.tenant == Some(tenant))
            .flat_map(|w| w.templates.iter().chain(values_templates_of(w)))
            .collect();
        if !owned.is_empty() {
            templates.confine(owned, crate::tenancy::Fence::of(&fleet, tenant), limits);
        }
    }
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
    // What `sha256sum` keys over: for the platform's releases every decrypted value,
    // for a tenant's those of its own files and the platform's (never another
    // tenant's, whose presence in a text would show as a keyed digest).
    let hashing_for = |tenant: Option<&str>| {
        crate::seal::SecretHashing::new(
            sops_secrets
                .iter()
                .filter(|s| tenant.is_none() || s.tenant.is_none() || s.tenant.as_deref() == tenant)
                .map(|s| (s.escaped.as_str(), s.file.as_str())),
            &snapshot.hash_keys,
        )
    };
    let hashing = hashing_for(None);
    // Only when some decrypted value is a tenant's: otherwise every release's is the
    // platform's.
    let tenant_hashings: Vec<crate::seal::SecretHashing> =
        if sops_secrets.iter().any(|s| s.tenant.is_some()) {
            fleet
                .tenants
                .iter()
                .map(|t| hashing_for(Some(t.name.as_str())))
                .collect()
        } else {
            Vec::new()
        };
    let helm = HelmContext {
        tenant_hashings: &tenant_hashings,
        cache: release::ReleaseCache::new(!options.helm_without_stencils),
        settings: release::ReleaseSettings {
            seed: options.helm_seed.as_ref().unwrap_or(&release::PUBLIC_SEED),
            hashing: &hashing,
            release_keys: &[],
            now: release::DEFAULT_NOW,
            budget: helm::gotmpl::Budget {
                max_output: limits.max_template_output_bytes,
                ..helm::gotmpl::Budget::default()
            },
        },
        release_template,
        default_capabilities: release::capabilities(None, fleet.settings.kubernetes.as_ref()),
        by_overlays: Default::default(),
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
    let hub_secret = match &options.sops {
        crate::sops::SopsKeys::Open(keys) => keys.sealing_secret(),
        crate::sops::SopsKeys::Unopened => None,
    };
    let sealer = options
        .helm_seed
        .as_ref()
        .map(|seed| crate::seal::Sealer::new(seed, hub_secret.as_ref()));
    if sealer.is_some() {
        crate::seal::next_render();
    }
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
        sealer: sealer.as_ref(),
        sops_secrets: &sops_secrets,
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
    // A cluster with warnings is rendered whole or not at all: what its unchanged
    // workloads warned of is kept for the cluster, not for each workload.
    if let Some(previous) = previous {
        for (i, cluster) in clusters.iter().enumerate() {
            if matches!(redo[i], Redo::Workloads(_))
                && previous
                    .provenance
                    .clusters
                    .get(&cluster.name)
                    .is_some_and(|p| !p.warnings.is_empty())
            {
                redo[i] = Redo::All;
            }
        }
    }
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
            Passed::Done(pass)
                if !whole && {
                    // Looked up once per warning: a set, not a walk over the clusters.
                    let in_part: HashSet<&str> = chosen
                        .iter()
                        .filter(|&&i| matches!(redo[i], Redo::Workloads(_)))
                        .map(|&i| clusters[i].name.as_str())
                        .collect();
                    pass.needs_every_cluster(&|name| in_part.contains(name))
                } =>
            {
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
    let mut warning_lists: HashSet<Arc<[Diagnostic]>, foldhash::fast::RandomState> =
        HashSet::default();
    let mut warnings = pass.warnings_by_cluster();
    let mut release_lists: HashSet<ReleaseWarnings, foldhash::fast::RandomState> =
        HashSet::default();
    // A cluster's Helm release warnings, reported with its name.
    let release_diagnostics = |name: &str, found: &ClusterProvenance| {
        found
            .release_warnings
            .iter()
            .map(|(_, d)| d.clone().for_cluster(name))
            .collect::<Vec<_>>()
    };
    for (cluster, result) in rendered.iter().zip(pass.assembled) {
        assembled.push(result.map(|(bundle, mut found)| {
            diagnostics.extend(release_diagnostics(&cluster.name, &found));
            if !inputs.is_empty() {
                found.release_warnings = interned(&mut release_lists, found.release_warnings);
                found.resource_workloads = interned(&mut lists, found.resource_workloads);
                found.patch_matches = interned(&mut matches, found.patch_matches);
                let own = warnings.remove(cluster.name.as_str()).unwrap_or_default();
                found.warnings = interned(&mut warning_lists, own.into());
                provenance.clusters.insert(cluster.name.clone(), found);
            }
            bundle
        }));
    }
    if let Some(previous) = previous {
        for i in (0..clusters.len()).filter(|&i| redo[i] == Redo::Nothing) {
            let name = &clusters[i].name;
            kept.push(previous.bundles[name].clone());
            let found = &previous.provenance.clusters[name];
            diagnostics.extend(found.warnings.iter().map(|d| d.clone().for_cluster(name)));
            diagnostics.extend(release_diagnostics(name, found));
            provenance.clusters.insert(name.clone(), found.clone());
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
    // Each template that generated a value from the public seed was warned about.
    let generated_from_public_seed = options.helm_seed.is_none()
        && (helm.cache.generated_any()
            || diagnostics.iter().any(release::generated_from_public_seed));
    let mut output = collect_output(
        snapshot,
        &fleet,
        (&clusters, &memberships),
        rendered.into_iter().zip(assembled),
        kept,
        diagnostics,
    );
    without_decrypted_values(&mut output.diagnostics, &sops_secrets, &fleet);
    output.rollouts = rollout_plan;
    output.generated_from_public_seed = generated_from_public_seed;
    output.helm_stencil_releases = helm.cache.stencil_releases();
    output.sops_files = snapshot.hash_keys.keys().cloned().collect();
    output.unsealed_for_agent_keys =
        options.helm_seed.is_none() && fleet.clusters.iter().any(|c| c.agent_key.is_some());
    output.agent_keys = fleet
        .clusters
        .iter()
        .filter(|c| output.bundles.contains_key(&c.name))
        .filter_map(|c| Some((c.name.clone(), c.agent_key?)))
        .collect();
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

/// The Helm values files of `workload` that are templates.
fn values_templates_of(workload: &load::Workload) -> impl Iterator<Item = &String> {
    workload
        .helm
        .as_deref()
        .into_iter()
        .flat_map(|r| &r.values_files)
        .filter_map(|file| match file {
            release::ValuesFile::Template { path } => Some(path),
            release::ValuesFile::Static { .. } => None,
        })
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

/// What stands in a message for a value decrypted from a SOPS file.
pub const DECRYPTED_VALUE: &str = "(a decrypted value)";

/// Every decrypted value (as found in the SOPS files, and as written inside a JSON
/// string) in the messages of `diagnostics` replaced by [`DECRYPTED_VALUE`]. Errors
/// quote what they stumble on, as Helm's and Go's do (`unsupported map key … value:
/// <the text>`, `parsing time "<the text>"`): a render error is kept by the hub and
/// shown on its page, so a value must never be in one. A diagnostic of a tenant's
/// workload is looked at for the values of that tenant's files and the platform's
/// only: that another tenant's value was taken out of a message the tenant's own
/// template wrote would tell it that its guess was right. Values shorter than
/// [`crate::sops::MIN_TRACKED_SECRET`] are not looked for, as they are not outside
/// Secrets (they would match by chance).
fn without_decrypted_values(
    diagnostics: &mut [Diagnostic],
    secrets: &[crate::sops::SopsSecret],
    fleet: &crate::load::Fleet,
) {
    if secrets.is_empty() || diagnostics.is_empty() {
        return;
    }
    // The finder of the values one tenant (or, for `None`, the platform) may see.
    let finder_for = |tenant: Option<&str>| {
        let mut values: Vec<String> = secrets
            .iter()
            .filter(|s| tenant.is_none() || s.tenant.is_none() || s.tenant.as_deref() == tenant)
            .flat_map(|s| {
                let plain = crate::seal::unescaped(&s.escaped);
                plain.into_iter().chain([s.escaped.clone()])
            })
            .filter(|v| !v.is_empty())
            .collect();
        values.sort_unstable();
        values.dedup();
        // The longest value where several start at one place.
        let finder = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(&values)
            .ok();
        (finder, values.len())
    };
    let tenant_of = |workload: &str| -> Option<&str> {
        let w = fleet
            .workloads
            .binary_search_by(|w| w.name.as_str().cmp(workload))
            .ok()?;
        let t = fleet.workloads[w].tenant?;
        fleet.tenants.get(t).map(|t| t.name.as_str())
    };
    let mut finders: HashMap<Option<&str>, (Option<aho_corasick::AhoCorasick>, usize)> =
        HashMap::new();
    for diagnostic in diagnostics {
        let tenant = diagnostic.workload.as_deref().and_then(tenant_of);
        let (finder, count) = finders.entry(tenant).or_insert_with(|| finder_for(tenant));
        if let Some(finder) = finder
            && finder.is_match(&diagnostic.message)
        {
            diagnostic.message =
                finder.replace_all(&diagnostic.message, &vec![DECRYPTED_VALUE; *count]);
        }
    }
}
