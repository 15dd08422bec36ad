//! Phase 3 of a pass, per cluster: its units' resources and its own outputs
//! gathered, sorted by identity (each identity ranked once for every cluster),
//! checked for duplicates, merged with the previous bundle's for a cluster rendered
//! in part, and hashed; then the render's output collected from the bundles.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use rayon::prelude::*;

use flotilla_core::bundle::{
    BUNDLE_ENVELOPE_BYTES, Bundle, MAX_BUNDLE_BYTES, Resource, ResourceKey, resource_list_bytes,
};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;

use super::plan::{Plan, Written};
use super::since::Job;
use super::stop::Stop;
use super::units::{
    SourcedResource, StencilSlots, UnitContext, UnitGroup, UnitKey, UnitResult, fill,
    matched_pairs, render_output,
};
use super::warnings::fold_cluster_repeats;
use crate::load::{Cluster, Fleet};
use crate::scope::CustomScopes;
use crate::select::targeted_workloads;
use crate::stencil::StencilUnit;
use crate::tenancy::{PlatformObjects, Verdict};
use crate::{ClusterProvenance, RenderOutput};

/// One cluster's bundle and where its parts came from, or its errors.
pub(super) type Assembled = Result<(Bundle, ClusterProvenance), Vec<Diagnostic>>;

/// Every distinct resource identity gets its rank in bundle order once, so that per
/// cluster, sorting and the duplicate check compare integers, not strings.
pub(super) struct Ranks<'r> {
    /// The rank of each identity rendered by a unit or a stencil.
    pub(super) of_key: HashMap<&'r ResourceKey, u32, foldhash::fast::RandomState>,
    /// Per unit, the rank of each of its resources.
    pub(super) units: Vec<Vec<u32>>,
    /// Per stencil slot, the rank of each of its resources.
    pub(super) stencils: Vec<Vec<u32>>,
}

impl<'r> Ranks<'r> {
    pub(super) fn of(rendered: &'r [UnitResult], stencils: &'r [Option<StencilUnit>]) -> Ranks<'r> {
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

/// What phase 2 rendered: per unit, its key, resources, their ranks and the
/// (overlay, patch) pairs that matched; each overlay's file; and what filling in a
/// cluster's own outputs needs.
pub(super) struct UnitsDone<'a> {
    pub(super) keys: &'a [UnitKey],
    pub(super) groups: &'a [UnitGroup],
    pub(super) rendered: &'a [UnitResult],
    pub(super) ranks: &'a Ranks<'a>,
    pub(super) matched: &'a [Vec<(usize, usize)>],
    pub(super) overlay_files: &'a [Arc<str>],
    pub(super) slots: &'a StencilSlots,
    pub(super) stencils: &'a [Option<StencilUnit>],
    pub(super) scope_table: &'a [CustomScopes],
    pub(super) context: &'a UnitContext<'a>,
    pub(super) tenancy: &'a Tenancy,
    /// The schema check (`None` under `validation: off`).
    pub(super) checker: Option<&'a crate::openapi::Checker>,
    /// Per unit, what checking its resources found, per minor version its clusters
    /// run (empty without a checker).
    pub(super) checked: &'a [UnitChecks],
}

/// One unit's resources checked: per minor version, each resource's outcome.
pub(super) type UnitChecks = Vec<(crate::openapi::Minor, Vec<Arc<crate::openapi::Outcome>>)>;

/// The tenants' rules judged once for what clusters share (see
/// [`crate::tenancy::Verdict`]); empty without tenants.
#[derive(Default)]
pub(super) struct Tenancy {
    /// Per unit, the verdict on each of its resources (none for the platform's).
    pub(super) verdicts: Vec<Vec<Verdict>>,
    /// Per stencil slot, the verdict on each of its resources, by identity.
    pub(super) stencil_verdicts: Vec<Vec<Verdict>>,
    /// The objects added for the tenants' namespaces.
    pub(super) objects: PlatformObjects,
}

/// What assembling one cluster gave, and what rendering its own outputs found: the
/// errors (for the cluster and workload) and the (overlay, patch) pairs that
/// matched.
pub(super) struct ClusterDone {
    pub(super) assembled: Assembled,
    pub(super) errors: Vec<Diagnostic>,
    pub(super) matched: Vec<(usize, usize)>,
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
type Ranked<'a> = (u32, &'a SourcedResource, usize);

/// One cluster's bundle from its units and its own outputs (filled in from their
/// stencils, or rendered from their text when a stencil does not take them), sorted
/// and checked for duplicate identities, with where its parts came from. A cluster
/// rendered in part keeps its previous bundle's resources of the other workloads;
/// `None` when a resource of its changed workloads has the identity of one of those
/// (rendered whole, the error names both).
pub(super) fn assemble(
    fleet: &Fleet,
    (cluster, groups, job, custom_scopes): (&Cluster, &[usize], &Job<'_>, bool),
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
    // With each, its tenant's verdict when its stencil had one.
    let mut own: Vec<(u32, SourcedResource, usize, Option<&Verdict>)> = Vec::new();
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
                let verdicts = units.tenancy.stencil_verdicts.get(slot);
                own.extend(
                    ranks
                        .iter()
                        .zip(filled)
                        .enumerate()
                        .map(|(i, (&rank, item))| {
                            let verdict = verdicts.and_then(|v| v.get(i));
                            (rank, item, plan.workload, verdict)
                        }),
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
                    (rank.copied().unwrap_or(u32::MAX), item, plan.workload, None)
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
            .map(|(rank, item, workload, _)| (*rank, item, *workload)),
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
    if !fleet.tenants.is_empty() {
        // The units' resources with their verdicts, then the cluster's own outputs
        // (the order of a cluster's errors is not kept: they are sorted).
        let of_units = unit_list.iter().flat_map(|&unit| {
            let workload = units.groups[units.keys[unit].group].workload;
            let verdicts = units.tenancy.verdicts.get(unit);
            let resources = units.rendered[unit].as_deref().unwrap_or_default();
            resources.iter().enumerate().map(move |(i, item)| {
                let verdict = verdicts.and_then(|v| v.get(i));
                (&*item.resource, &*item.file, item.line, workload, verdict)
            })
        });
        let of_own = own.iter().map(|(_, item, workload, verdict)| {
            (&*item.resource, &*item.file, item.line, *workload, *verdict)
        });
        done.errors.extend(crate::tenancy::check_cluster(
            fleet,
            cluster,
            job.targeted,
            of_units.chain(of_own),
        ));
    }
    // Whether some of the cluster's diagnostics depend on more than its inputs: the
    // schema check's findings (its custom kinds are those of the CRDs of the units
    // rendered with it; not its note on the Kubernetes version) and decrypted values
    // outside Secrets (those of every SOPS file).
    let mut beyond_inputs = false;
    if let Some(checker) = units.checker {
        let (found, beyond) = schema_problems(checker, fleet, cluster, (unit_list, units), &own);
        beyond_inputs |= beyond;
        done.errors.extend(found);
    }
    done.errors.extend(secret_values_in_metadata(
        &ranked,
        &cluster.name,
        units.context,
    ));
    done.errors
        .extend(unsealed_secrets(fleet, cluster, &ranked));
    if !units.context.sops_secrets.is_empty() {
        let found = secrets_outside_secrets(units.context.sops_secrets, fleet, cluster, &ranked);
        beyond_inputs |= !found.is_empty();
        done.errors.extend(found);
    }
    if !errors.is_empty() {
        done.assembled = match job.only {
            Some(_) => return None,
            None => Err(errors),
        };
        return Some(done);
    }
    let mut fresh: Vec<(Arc<Resource>, u32)> = ranked
        .into_iter()
        .zip(repeated)
        .filter(|(_, repeated)| !repeated)
        .map(|((_, item, workload), _)| (item.resource.clone(), position(workload)))
        .collect();
    if let Some(sealing) = units.context.sealer.zip(cluster.agent_key.as_ref()) {
        seal_all(&mut fresh, sealing, units.context.secrets);
    }
    let fresh = fresh.into_iter();
    // The warnings of the releases rendered now, and of those kept.
    let mut release_warnings: Vec<(u32, Diagnostic)> = plans
        .iter()
        .filter_map(|plan| Some((position(plan.workload), plan.release_warnings.as_ref()?)))
        .flat_map(|(w, warnings)| warnings.iter().map(move |d| (w, d.clone())))
        .collect();
    let (resources, resource_workloads): (Vec<Arc<Resource>>, Vec<u32>) = match job.only {
        None => fresh.unzip(),
        Some((changed, previous, kept)) => {
            let is_changed = |w: u32| changed.contains(&(w as usize));
            release_warnings.extend(
                kept.release_warnings
                    .iter()
                    .filter(|(w, _)| !is_changed(*w))
                    .cloned(),
            );
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
    let (resources, resource_workloads) = match crate::tenancy::with_platform_objects(
        fleet,
        cluster,
        job.targeted,
        (resources, resource_workloads),
        &units.tenancy.objects,
    ) {
        Ok(lists) => lists,
        Err(errors) => {
            done.assembled = Err(errors);
            return Some(done);
        }
    };
    if let Some(error) = too_large(cluster, &resources) {
        done.assembled = Err(vec![error]);
        return Some(done);
    }
    let meta = match crate::order::bundle_meta(
        fleet,
        cluster,
        groups,
        job.targeted,
        &resources,
        &resource_workloads,
    ) {
        Ok(meta) => meta,
        Err(errors) => {
            done.assembled = Err(errors);
            return Some(done);
        }
    };
    patch_matches.sort();
    patch_matches.dedup();
    release_warnings.sort();
    done.assembled = Ok((
        Bundle::from_sorted_with_shared_meta(
            cluster.name.clone(),
            resources,
            units.context.metas.shared(meta).as_ref(),
        ),
        ClusterProvenance {
            resource_workloads: resource_workloads.into(),
            patch_matches: patch_matches.into(),
            custom_scopes,
            // Filled in from the pass's diagnostics by the render.
            warnings: Arc::from([]),
            release_warnings: release_warnings.into(),
            warnings_beyond_inputs: beyond_inputs,
        },
    ));
    Some(done)
}

/// An error at the cluster's file when its bundle would not fit in the served
/// document an agent accepts: the hub would serve it and the agent refuse it, every
/// time it asks.
fn too_large(cluster: &Cluster, resources: &[Arc<Resource>]) -> Option<Diagnostic> {
    let limit = MAX_BUNDLE_BYTES - BUNDLE_ENVELOPE_BYTES;
    let size = resource_list_bytes(resources);
    if size <= limit {
        return None;
    }
    // The first of the largest, in bundle order.
    let largest = resources
        .iter()
        .rev()
        .max_by_key(|r| r.canonical.len())
        .map(|r| {
            format!(
                "; its largest resource is {} ({} bytes)",
                r.key,
                r.canonical.len()
            )
        })
        .unwrap_or_default();
    Some(
        Diagnostic::error(format!(
            "the bundle of cluster {} is {size} bytes as JSON, over the limit of {limit} bytes for \
             a bundle's resources (an agent accepts a bundle of at most {MAX_BUNDLE_BYTES} bytes){largest}",
            cluster.name
        ))
        .in_file(&cluster.file)
        .for_cluster(&cluster.name),
    )
}

/// A cluster without `spec.agentKey` whose bundle has Secrets: a warning (an error
/// with the fleet setting `requireAgentKeys`) at its first Secret, once per cluster
/// (folded with the other clusters that share it).
fn unsealed_secrets(fleet: &Fleet, cluster: &Cluster, ranked: &[Ranked<'_>]) -> Option<Diagnostic> {
    if cluster.agent_key.is_some() {
        return None;
    }
    let (_, first, _) = ranked.iter().find(|(_, item, _)| {
        item.resource.key.kind() == "Secret" && item.resource.key.group().is_empty()
    })?;
    let message = "a Secret for a cluster with no spec.agentKey: its values are served and stored as plain text; add the public key the cluster's agent printed at its first start to its Cluster file to seal them to that agent";
    let diagnostic = if fleet.settings.require_agent_keys {
        Diagnostic::error(format!("{message} (flotilla.yaml sets requireAgentKeys)"))
    } else {
        Diagnostic::warning(message)
    };
    Some(
        diagnostic
            .in_file(&*first.file)
            .at_line(Some(first.line))
            .for_cluster(&cluster.name),
    )
}

/// The schema check's findings for one cluster's resources, each at the resource's
/// file and line with its field path: errors under `validation: strict`, else
/// warnings that say how to make them errors. Under `strict`, a warning for each
/// custom kind no CRD of the fleet defines (not checked), and for a Kubernetes
/// version without a schema of its own (the nearest is used). With them, whether
/// there is any but that note on the version, which depends on the cluster's
/// inputs alone; the others are counted as depending on more (a custom kind's
/// schema comes from the CRDs rendered with the cluster).
fn schema_problems(
    checker: &crate::openapi::Checker,
    fleet: &Fleet,
    cluster: &Cluster,
    (unit_list, units): (&[usize], &UnitsDone<'_>),
    own: &[(u32, SourcedResource, usize, Option<&Verdict>)],
) -> (Vec<Diagnostic>, bool) {
    use crate::openapi::{CustomKinds, Outcome};
    use flotilla_core::model::Validation;
    let strict = checker.mode() == Validation::Strict;
    let spec = cluster
        .kubernetes
        .as_ref()
        .or(fleet.settings.kubernetes.as_ref());
    let choice = crate::openapi::minor_for(spec, crate::release::DEFAULT_KUBE_VERSION);
    let mut found = Vec::new();
    if let Some(asked) = &choice.instead_of {
        let file = if cluster.kubernetes.is_some() {
            cluster.file.as_str()
        } else {
            "flotilla.yaml"
        };
        let known = crate::openapi::known_minors();
        found.push(
            Diagnostic::warning(format!(
                "Kubernetes version {asked:?} has no schema in flotilla (it has 1.{} to 1.{}): resources are checked against 1.{}, the nearest",
                known.first().copied().unwrap_or_default(),
                known.last().copied().unwrap_or_default(),
                choice.minor
            ))
            .in_file(file)
            .for_cluster(&cluster.name),
        );
    }
    // What comes before this depends only on the cluster's inputs.
    let of_inputs = found.len();
    // CRDs this cluster renders from its own outputs are not among the units' (rare).
    let own_crds: Vec<serde_json::Value> = own
        .iter()
        .filter(|(_, item, _, _)| {
            item.resource.key.kind() == "CustomResourceDefinition" && !checker.knows(&item.resource)
        })
        .map(|(_, item, _, _)| item.resource.value())
        .collect();
    let extra = (!own_crds.is_empty()).then(|| CustomKinds::of(&own_crds));
    // The units' resources were checked once for every cluster; the cluster's own
    // outputs are checked here (each distinct one once per render).
    let of_units = unit_list.iter().flat_map(|&unit| {
        let workload = units.groups[units.keys[unit].group].workload;
        let resources = units.rendered[unit].as_deref().unwrap_or_default();
        let outcomes = units.checked[unit]
            .iter()
            .find(|(minor, _)| *minor == choice.minor)
            .map(|(_, outcomes)| outcomes.as_slice())
            .unwrap_or_default();
        resources
            .iter()
            .zip(outcomes)
            .map(move |(item, outcome)| (item, workload, Some(outcome)))
    });
    let of_own = own
        .iter()
        .map(|(_, item, workload, _)| (item, *workload, None));
    let mut unchecked_kinds = std::collections::BTreeSet::new();
    for (item, workload, known) in of_units.chain(of_own) {
        let checked_here;
        let outcome: &Outcome = match (known, &extra) {
            (Some(outcome), None) => outcome,
            (None, None) => {
                checked_here = checker.check(&item.resource, choice.minor);
                &checked_here
            }
            (_, Some(extra)) => {
                checked_here = Arc::new(checker.check_with(&item.resource, choice.minor, extra));
                &checked_here
            }
        };
        match outcome {
            Outcome::Checked(findings) => {
                for finding in findings {
                    let message = format!(
                        "{}: {finding} (Kubernetes 1.{} schema)",
                        item.resource.key, choice.minor
                    );
                    let diagnostic = if strict {
                        Diagnostic::error(message)
                    } else {
                        Diagnostic::warning(format!(
                            "{message}; a warning because spec.validation in flotilla.yaml is warn, the default: set it to strict to make schema problems errors"
                        ))
                    };
                    found.push(
                        diagnostic
                            .in_file(&*item.file)
                            .at_line(Some(item.line))
                            .for_cluster(&cluster.name)
                            .for_workload(&fleet.workloads[workload].name),
                    );
                }
            }
            Outcome::NoDefinition(gvk) if strict => {
                if unchecked_kinds.insert(gvk.clone()) {
                    found.push(
                        Diagnostic::warning(format!(
                            "{}: not checked against a schema: no CustomResourceDefinition in the fleet defines {gvk}",
                            item.resource.key
                        ))
                        .in_file(&*item.file)
                        .at_line(Some(item.line))
                        .for_cluster(&cluster.name),
                    );
                }
            }
            Outcome::NoDefinition(_) | Outcome::Unchecked => {}
        }
    }
    let beyond_inputs = found.len() > of_inputs;
    (found, beyond_inputs)
}

/// A warning for each resource that is not a Secret but holds a value decrypted from
/// a SOPS file: it travels and is stored in plain text. Names the SOPS file, the
/// resource (at its file and line) and the field. A tenant's resource is looked at
/// for the values of its own files and the platform's only: a warning about another
/// tenant's value would tell it, line by line, whether a guess was right.
fn secrets_outside_secrets(
    secrets: &[crate::sops::SopsSecret],
    fleet: &Fleet,
    cluster: &Cluster,
    ranked: &[Ranked<'_>],
) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    for (_, item, workload) in ranked {
        if item.resource.key.kind() == "Secret" && item.resource.key.group().is_empty() {
            continue;
        }
        let tenant = fleet
            .workloads
            .get(*workload)
            .and_then(|w| w.tenant)
            .and_then(|t| fleet.tenants.get(t))
            .map(|t| t.name.as_str());
        let canonical = &item.resource.canonical;
        for secret in secrets {
            if tenant.is_some() && secret.tenant.is_some() && secret.tenant.as_deref() != tenant {
                continue;
            }
            let needle = secret.escaped.as_bytes();
            if needle.is_empty() || !canonical.windows(needle.len()).any(|w| w == needle) {
                continue;
            }
            let field = field_holding(&item.resource.value(), &secret.escaped)
                .unwrap_or_else(|| "a field".to_string());
            let message = format!(
                "a value decrypted from the SOPS file {} is in {} at {field}, which is not a Secret: it travels and is stored in plain text",
                secret.file, item.resource.key
            );
            // Named with its workload: a tenant's warning is then cleared of the
            // values of its own files and the platform's only, never another's.
            let mut diagnostic = Diagnostic::warning(message)
                .in_file(&*item.file)
                .at_line(Some(item.line))
                .for_cluster(&cluster.name);
            if let Some(workload) = fleet.workloads.get(*workload) {
                diagnostic = diagnostic.for_workload(&workload.name);
            }
            // Two values in one field are one warning.
            if !found.contains(&diagnostic) {
                found.push(diagnostic);
            }
        }
    }
    found
}

/// The path (`spec.template…`) of the first string in `value` whose JSON form holds
/// `escaped`.
fn field_holding(value: &serde_json::Value, escaped: &str) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(text) => serde_json::to_string(text)
            .ok()
            .filter(|json| json.contains(escaped))
            .map(|_| String::new()),
        Value::Object(map) => map.iter().find_map(|(key, inner)| {
            field_holding(inner, escaped).map(|rest| {
                if rest.is_empty() {
                    key.clone()
                } else if rest.starts_with('[') {
                    format!("{key}{rest}")
                } else {
                    format!("{key}.{rest}")
                }
            })
        }),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, inner)| {
            field_holding(inner, escaped).map(|rest| {
                if rest.is_empty() {
                    format!("[{i}]")
                } else {
                    format!("[{i}].{rest}")
                }
            })
        }),
        _ => None,
    }
}

/// The cluster's Secrets among `resources` with their values sealed to its agent.
fn seal_all(
    resources: &mut [(Arc<Resource>, u32)],
    (sealer, recipient): (&crate::seal::Sealer, &crate::seal::AgentKey),
    secrets: &super::units::SecretMemo,
) {
    let facts: Vec<(usize, _)> = resources
        .iter()
        .enumerate()
        .filter(|(_, (resource, _))| {
            resource.key.kind() == "Secret" && resource.key.group().is_empty()
        })
        .map(|(i, (resource, _))| (i, secrets.facts(resource, Some(sealer))))
        .collect();
    let (at, prepared): (Vec<usize>, Vec<_>) = facts
        .iter()
        .filter_map(|(i, facts)| {
            let prepared = facts.prepared.as_ref()?;
            Some((*i, (prepared, &resources[*i].0.key)))
        })
        .unzip();
    if prepared.is_empty() {
        return;
    }
    let sealed = sealer.sealed_resources(&prepared, recipient);
    for (i, sealed) in at.into_iter().zip(sealed) {
        resources[i].0 = sealed;
    }
}

/// A warning for each Secret of a cluster whose annotations or labels hold one of its
/// values (`kubectl.kubernetes.io/last-applied-configuration` copied from a cluster,
/// say): diffs and the web page hide them, but they reach the cluster and anyone who
/// can read the Secret's metadata there.
fn secret_values_in_metadata(
    ranked: &[Ranked<'_>],
    cluster: &str,
    context: &super::units::UnitContext<'_>,
) -> Vec<Diagnostic> {
    ranked
        .iter()
        .filter(|(_, item, _)| item.resource.key.kind() == "Secret" && item.resource.key.group().is_empty())
        .filter_map(|(_, item, _)| {
            let facts = context.secrets.facts(&item.resource, context.sealer);
            let names: Vec<String> = facts
                .revealing
                .iter()
                .map(|(map, key)| format!("{} {key:?}", map.trim_end_matches('s')))
                .collect();
            (!names.is_empty()).then(|| {
                Diagnostic::warning(format!(
                    "{} carries its values in its metadata ({}); flotilla hides them in diffs and the web page, \
                     but they are applied as written: remove them from the manifest",
                    item.resource.key,
                    names.join(", ")
                ))
                .in_file(&*item.file)
                .at_line(Some(item.line))
                .for_cluster(cluster)
            })
        })
        .collect()
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

/// The bundles of clusters that rendered without error and the bundles `kept` from
/// a previous render, every cluster's group memberships and labels, and every
/// diagnostic. An error that belongs to no single cluster leaves no bundle.
pub(super) fn collect_output<'c>(
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
    // An error of a tenant's workload that names no cluster (a broken manifest, a
    // file outside the tenant's folders) fails only the clusters the workload
    // targets: one tenant's mistake does not hold the others' clusters.
    let tenant_workload = |d: &Diagnostic| -> Option<usize> {
        if !d.is_error() || d.cluster.is_some() {
            return None;
        }
        let name = d.workload.as_deref()?;
        let w = fleet
            .workloads
            .binary_search_by(|w| w.name.as_str().cmp(name))
            .ok()?;
        fleet.workloads[w].tenant.map(|_| w)
    };
    let broken_workloads: BTreeSet<usize> =
        diagnostics.iter().filter_map(tenant_workload).collect();
    // Owned names, because `diagnostics` grows in the loop below.
    let mut failed: BTreeSet<String> = diagnostics
        .iter()
        .filter(|d| d.is_error())
        .filter_map(|d| d.cluster.clone())
        .collect();
    if !broken_workloads.is_empty() {
        for (cluster, groups) in clusters.iter().zip(memberships) {
            if targeted_workloads(fleet, cluster, groups)
                .iter()
                .any(|w| broken_workloads.contains(w))
            {
                failed.insert(cluster.name.clone());
            }
        }
    }
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
        .any(|d| d.is_error() && d.cluster.is_none() && tenant_workload(d).is_none())
    {
        output.bundles.clear();
    }
    output.diagnostics = fold_cluster_repeats(diagnostics);
    output
}
