//! Phase 1 of a pass, per cluster: which workloads and overlays apply to it, their
//! merged variables, and what each template (or Helm release) wrote for it; then
//! every distinct output is given one id, and an output read as values that no other
//! cluster has is kept with its cluster's plan instead.

use std::collections::HashSet;
use std::sync::Arc;

use rayon::prelude::*;
use serde_json::{Map, Value};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::model::Vars;

use super::stop::Stop;
use super::{HelmContext, Interner};
use crate::load::{Cluster, Fleet, Workload};
use crate::release;
use crate::select::{overlay_applies_to, selecting_overlays, targets};
use crate::shape::Shape;
use crate::template::{self, ClusterContext, Context, Templates};

/// One (cluster, workload) pair to render.
pub(super) struct Plan {
    pub(super) workload: usize,
    pub(super) overlays: Vec<usize>,
    /// Indices into the table of distinct template outputs.
    pub(super) outputs: Vec<usize>,
    /// The outputs read as values that no other cluster has: filled in from their
    /// stencils as the cluster is assembled, not units.
    pub(super) filled: Vec<OwnOutput>,
    /// The warnings of the workload's Helm release for this cluster, if it has one.
    pub(super) release_warnings: Option<Arc<[Diagnostic]>>,
}

/// A template and the values in its holes for one cluster.
type OwnOutput = (usize, Box<[Box<str>]>);

/// What one template wrote for one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Written {
    /// The output's text, parsed by the units that read it.
    Text(String),
    /// The values in the holes of the template's shape: the output is the
    /// template's literal text with these in its holes, which YAML reads as the
    /// shape's documents (see [`Shape::values`]), and its resources are filled in
    /// from stencils (see [`stencil`](crate::stencil)).
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

pub(super) type ClusterPlan = (Vec<Plan>, Vec<(usize, Written)>, Vec<Diagnostic>);

/// The template engine and each template of the render, looked up once (a lookup
/// takes a lock in the engine): `None` where a template failed to compile; and each
/// workload's part of the templates' context.
pub(super) struct Compiled<'t> {
    pub(super) engine: &'t Templates,
    pub(super) handles: Vec<Option<minijinja::Template<'t, 't>>>,
    pub(super) workloads: Vec<minijinja::Value>,
}

/// Plans one cluster's workloads, or only those in `only` (fleet indices).
pub(super) fn plan_cluster(
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
    let matching_overlays: Vec<usize> = selecting_overlays(fleet, cluster, groups);
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
        let mut release_warnings = None;
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
                    (index, release),
                    &overlays,
                )
            }) else {
                return (plans, texts, diagnostics);
            };
            match rendered {
                Ok(output) => {
                    release_warnings = Some(Arc::clone(output.warnings()));
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
            release_warnings,
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
    (index, release): (usize, &release::HelmRelease),
    overlays: &[usize],
) -> Result<Arc<release::ReleaseOutput>, Diagnostic> {
    let workload = &fleet.workloads[index];
    let static_input = cluster.kubernetes.is_none()
        && release
            .values_files
            .iter()
            .all(|f| matches!(f, release::ValuesFile::Static { .. }));
    if static_input && let Some(output) = lock(&helm.by_overlays).get(&(index, overlays.to_vec())) {
        return Ok(Arc::clone(output));
    }
    // The context of the `.j2` values files, made once for all of them.
    let mut context: Option<minijinja::Value> = None;
    let mut values = Map::new();
    for file in &release.values_files {
        match file {
            release::ValuesFile::Static { values: those, .. } => {
                release::merge_values(&mut values, those);
            }
            release::ValuesFile::Template { path } => {
                let context = context.get_or_insert_with(|| {
                    let vars = template::value_of(&merged_vars(
                        fleet, workload, cluster, groups, overlays,
                    ));
                    let cluster_part = template::value_of(&ClusterContext {
                        name: &cluster.name,
                        labels: &cluster.labels,
                        vars: &cluster.vars,
                    });
                    Context::from_parts(&cluster_part, &templates.workloads[index], &vars)
                });
                let Some(template) = templates.engine.template(path) else {
                    return Err(Diagnostic::error(
                        "this values template did not compile (reported above)",
                    )
                    .in_file(path.as_str()));
                };
                let text = templates.engine.render_template(&template, path, context)?;
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
    let own;
    let capabilities = match &cluster.kubernetes {
        None => &helm.default_capabilities,
        Some(spec) => {
            own = release::capabilities(Some(spec), fleet.settings.kubernetes.as_ref());
            &own
        }
    };
    // A tenant's release hashes over its own decrypted values and the platform's.
    let tenant_settings;
    let settings = match workload.tenant.and_then(|t| helm.tenant_hashings.get(t)) {
        Some(hashing) => {
            tenant_settings = release::ReleaseSettings {
                seed: helm.settings.seed,
                hashing,
                release_keys: &[],
                now: helm.settings.now,
                budget: helm.settings.budget.clone(),
            };
            &tenant_settings
        }
        None => &helm.settings,
    };
    let (outcome, per_cluster) = helm.cache.render(
        settings,
        (&workload.name, release),
        &cluster.name,
        &values,
        capabilities,
    );
    if static_input
        && !per_cluster
        && let Ok(output) = &outcome
    {
        lock(&helm.by_overlays).insert((index, overlays.to_vec()), Arc::clone(output));
    }
    outcome
}

/// A lock, whatever a panicking holder left behind.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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

/// Deep merge: maps merge key by key, anything else is replaced by the later value.
fn merge_vars(base: &mut Map<String, Value>, later: &Map<String, Value>) {
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

/// Gives every distinct (template, output) one id, rewrites each plan's outputs
/// to those ids, and returns the plans and the table of distinct outputs. An
/// output read as values that no other cluster has moves to its plan's `filled`
/// instead: with per-cluster templates most outputs are such, and they need no
/// table or unit of their own.
pub(super) fn intern_outputs(
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
