//! One pass over some clusters, in three phases: plan each cluster ([`plan`]: its
//! workloads, overlays and template outputs), render every distinct unit of work once
//! ([`units`]), and assemble each cluster's bundle ([`assemble`]). A pass gives up
//! when the render should stop, and asks for a cluster rendered in part to be
//! rendered whole when its changed workloads reach the others.
//!
//! [`plan`]: super::plan
//! [`units`]: super::units
//! [`assemble`]: super::assemble

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;

use super::HelmContext;
use super::assemble::{Assembled, ClusterDone, Ranks, Tenancy, UnitChecks, UnitsDone, assemble};
use super::plan::{ClusterPlan, Compiled, Written, intern_outputs, plan_cluster};
use super::since::Job;
use super::stop::Stop;
use super::units::{
    OutputTexts, StencilSlots, UnitContext, UnitResult, Units, custom_scopes, plan_units,
    render_unit, report_unit_errors, scopes_defined_by,
};
use crate::load::{Cluster, Fleet, Overlay};
use crate::openapi::Checker;
use crate::patch::PatchLimits;
use crate::scope::{self, CustomScopes};
use crate::shape::Shape;
use crate::stencil::{self, StencilUnit};
use crate::template::{self, Templates, WorkloadContext};
use crate::tenancy::{self, PlatformObjects, Verdict};
use flotilla_core::model::Validation;

/// Everything a render shares between its clusters.
pub(super) struct Shared<'a> {
    pub(super) fleet: &'a Fleet,
    pub(super) templates: &'a Templates,
    pub(super) template_paths: &'a [&'a String],
    pub(super) shapes: &'a [Option<Shape>],
    /// Per template, whether its outputs are read as the values in its shape's
    /// holes (it has a shape, and no output of it could be a CRD).
    pub(super) valued: &'a [bool],
    /// Per workload, the index of its first template in `template_paths`.
    pub(super) first_template: &'a [usize],
    pub(super) patch_limits: &'a PatchLimits,
    pub(super) limits: &'a Limits,
    pub(super) stop: &'a Stop<'a>,
    pub(super) progress: Option<&'a (dyn Fn(usize, usize) + Sync)>,
    pub(super) digests_only: bool,
    pub(super) helm: &'a HelmContext<'a>,
    /// Seals Secrets to clusters' agent keys (the hub's renders only).
    pub(super) sealer: Option<&'a crate::seal::Sealer>,
    /// Values decrypted from SOPS files, looked for outside Secrets.
    pub(super) sops_secrets: &'a [crate::sops::SopsSecret],
}

/// What rendering some clusters gave.
pub(super) struct Pass {
    /// Per cluster rendered, what assembling it gave.
    pub(super) assembled: Vec<Assembled>,
    /// Errors of template renders and units, each for its cluster.
    pub(super) diagnostics: Vec<Diagnostic>,
    /// The overlays some unit used, and the (overlay, patch) pairs that matched.
    pub(super) used_overlays: BTreeSet<usize>,
    pub(super) matched: BTreeSet<(usize, usize)>,
}

impl Pass {
    /// Whether the render must be of every cluster: a cluster's error (its message
    /// counts the clusters that share it, which needs them all), a warning of a
    /// cluster rendered in part (`in_part`), whose unchanged workloads' warnings
    /// are not known, or a warning that depends on more than its cluster's inputs.
    /// Other clusters' warnings are kept in their provenance, and those of clusters
    /// not rendered again are taken from the render before.
    pub(super) fn needs_every_cluster(&self, in_part: &dyn Fn(&str) -> bool) -> bool {
        self.assembled.iter().any(|assembled| match assembled {
            Ok((_, found)) => found.warnings_beyond_inputs,
            Err(_) => true,
        }) || self.diagnostics.iter().any(|d| {
            d.cluster
                .as_deref()
                .is_some_and(|cluster| d.is_error() || in_part(cluster))
        })
    }

    /// Each rendered cluster's warnings, without its name, sorted.
    pub(super) fn warnings_by_cluster(&self) -> HashMap<String, Vec<Diagnostic>> {
        let mut found: HashMap<String, Vec<Diagnostic>> = HashMap::new();
        for d in self.diagnostics.iter().filter(|d| !d.is_error()) {
            if let Some(cluster) = &d.cluster {
                found.entry(cluster.clone()).or_default().push(Diagnostic {
                    cluster: None,
                    ..d.clone()
                });
            }
        }
        // Sorted, not deduplicated: the same warning twice for one cluster counts
        // twice when warnings are folded, as in a render of every cluster.
        for warnings in found.values_mut() {
            warnings.sort();
        }
        found
    }
}

/// What a pass over some clusters came to.
pub(super) enum Passed {
    Done(Pass),
    /// These clusters (positions in the pass) were rendered in part, and their
    /// changed workloads brought a custom scope or a resource another workload
    /// has: render them whole.
    Widen(Vec<usize>),
    Stopped,
}

/// Renders `clusters` (with the groups each belongs to), each as its job says.
pub(super) fn render_clusters(
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
        sealer,
        sops_secrets,
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
                .definitions()
                .iter()
                .filter_map(scope::cluster_scoped_crd)
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
    let metas = super::units::MetaCache::default();
    let secrets = super::units::SecretMemo::default();
    let context = UnitContext {
        metas: &metas,
        fleet,
        template_paths,
        shapes,
        patch_limits,
        max_resource_bytes: limits.max_resource_bytes,
        sealer,
        secrets: &secrets,
        sops_secrets,
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
    let tenancy = judge_tenancy(fleet, &units, &rendered, &slots, &stencils);
    let checker = (fleet.settings.validation != Validation::Off).then(|| {
        let crds: Vec<&Arc<flotilla_core::bundle::Resource>> = rendered
            .iter()
            .filter_map(|unit| unit.as_ref().ok())
            .flatten()
            .filter(|r| r.resource.key.kind() == "CustomResourceDefinition")
            .map(|r| &r.resource)
            .collect();
        Checker::new(fleet.settings.validation, crds)
    });
    let checked = match &checker {
        Some(checker) => check_units(checker, fleet, clusters, &units, &rendered),
        None => Vec::new(),
    };
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
        tenancy: &tenancy,
        checker: checker.as_ref(),
        checked: &checked,
    };

    // Phase 3, per cluster: gather (filling in the outputs of its own), check
    // identities, sort and hash.
    let done = AtomicUsize::new(0);
    let total = clusters.len();
    let assembled: Vec<Option<ClusterDone>> = clusters
        .par_iter()
        .zip(units.per_cluster.par_iter().zip(memberships.par_iter()))
        .zip(jobs.par_iter().zip(cluster_scope.par_iter()))
        .zip(
            plans_per_cluster
                .par_iter()
                .zip(units.plan_groups.par_iter()),
        )
        .map(
            |(((cluster, (unit_list, member_of)), (job, &scope)), (plans, groups))| {
                if stop.now() {
                    return Some(ClusterDone::default());
                }
                let custom_scopes = !scope_table[scope].is_empty();
                let mut result = assemble(
                    fleet,
                    (cluster, member_of, job, custom_scopes),
                    (unit_list, plans, groups),
                    &units_done,
                    stop,
                );
                // A cluster that fails still reports its releases' warnings (one
                // assembled keeps them in its provenance).
                if let Some(ClusterDone {
                    assembled: Err(_),
                    errors,
                    ..
                }) = &mut result
                {
                    errors.extend(
                        plans
                            .iter()
                            .filter_map(|plan| plan.release_warnings.as_deref())
                            .flatten()
                            .map(|d| d.clone().for_cluster(&cluster.name)),
                    );
                }
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
            },
        )
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

/// The tenants' rules judged once for what clusters share (see
/// [`crate::tenancy::Verdict`]): each resource of a tenant's unit of work and of a
/// tenant's stencil, and the objects added for the namespaces those resources are
/// in. Nothing without tenants.
fn judge_tenancy(
    fleet: &Fleet,
    units: &Units,
    rendered: &[UnitResult],
    slots: &StencilSlots,
    stencils: &[Option<StencilUnit>],
) -> Tenancy {
    if fleet.tenants.is_empty() {
        return Tenancy::default();
    }
    let tenant_of = |group: usize| fleet.workloads[units.groups[group].workload].tenant;
    let verdicts: Vec<Vec<Verdict>> = units
        .keys
        .par_iter()
        .zip(rendered.par_iter())
        .map(|(key, unit)| match (tenant_of(key.group), unit) {
            (Some(t), Ok(resources)) => resources
                .iter()
                .map(|r| tenancy::judge(&fleet.tenants[t], &r.resource))
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    let stencil_verdicts: Vec<Vec<Verdict>> = slots
        .keys
        .par_iter()
        .zip(stencils.par_iter())
        .map(|(&(group, _), stencil)| match (tenant_of(group), stencil) {
            (Some(t), Some(stencil)) => stencil
                .resources
                .iter()
                .map(|r| tenancy::judge_key(&fleet.tenants[t], &r.key))
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    let unit_namespaces = units
        .keys
        .iter()
        .zip(rendered)
        .filter_map(|(key, unit)| Some((tenant_of(key.group)?, unit.as_ref().ok()?)));
    let unit_namespaces = unit_namespaces.flat_map(|(t, resources)| {
        resources
            .iter()
            .map(move |r| (t, r.resource.key.namespace()))
    });
    let stencil_namespaces = slots
        .keys
        .iter()
        .zip(stencils)
        .filter_map(|(&(group, _), stencil)| Some((tenant_of(group)?, stencil.as_ref()?)))
        .flat_map(|(t, stencil)| {
            stencil
                .resources
                .iter()
                .map(move |r| (t, r.key.namespace()))
        });
    // The CRDs of every unit, whoever's: a tenant's ClusterRole names the resources
    // of the custom kinds its `spec.clusterScoped` lists (a cluster's own outputs
    // add theirs as it is assembled).
    let crds = rendered
        .iter()
        .filter_map(|unit| unit.as_ref().ok())
        .flatten()
        .filter(|r| r.resource.key.kind() == "CustomResourceDefinition")
        .filter_map(|r| scope::crd_plural(&r.resource.value()))
        .collect();
    let objects = PlatformObjects::new(
        fleet,
        unit_namespaces
            .chain(stencil_namespaces)
            .filter(|(_, namespace)| !namespace.is_empty()),
        crds,
    );
    Tenancy {
        verdicts,
        stencil_verdicts,
        objects,
    }
}

/// Each unit's resources checked against the schemas of every minor version its
/// clusters run, once for all of them (see [`crate::openapi::Checker`]).
fn check_units(
    checker: &Checker,
    fleet: &Fleet,
    clusters: &[&Cluster],
    units: &Units,
    rendered: &[UnitResult],
) -> Vec<UnitChecks> {
    let minors: Vec<crate::openapi::Minor> = clusters
        .iter()
        .map(|cluster| {
            let spec = cluster
                .kubernetes
                .as_ref()
                .or(fleet.settings.kubernetes.as_ref());
            crate::openapi::minor_for(spec, crate::release::DEFAULT_KUBE_VERSION).minor
        })
        .collect();
    units
        .users
        .par_iter()
        .zip(rendered.par_iter())
        .map(|(users, unit)| {
            let Ok(resources) = unit else {
                return Vec::new();
            };
            let wanted: BTreeSet<crate::openapi::Minor> =
                users.iter().map(|&c| minors[c]).collect();
            wanted
                .into_iter()
                .map(|minor| {
                    let outcomes = resources
                        .iter()
                        .map(|r| checker.check(&r.resource, minor))
                        .collect();
                    (minor, outcomes)
                })
                .collect()
        })
        .collect()
}
