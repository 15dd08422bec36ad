//! Phase 2 of a pass: the distinct units of work and rendering them. A unit is a
//! workload's plain manifests, or one template output, under one list of overlays
//! and one set of custom scopes; clusters that share a unit share its resources.
//! Template outputs are kept as text until the last unit reading them has rendered;
//! an output read as values is filled in from its stencil where one takes it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use flotilla_core::bundle::Resource;
use flotilla_core::diagnostic::Diagnostic;

use super::Interner;
use super::plan::{Plan, Written};
use crate::kyaml;
use crate::load::{Cluster, Fleet, Overlay, SourcedDocument, Workload};
use crate::patch::PatchLimits;
use crate::scope::{self, CustomScopes};
use crate::shape::Shape;
use crate::stencil::StencilUnit;
use crate::transform;

/// A resource with where it came from, for duplicate-identity messages.
pub(super) struct SourcedResource {
    pub(super) resource: Arc<Resource>,
    pub(super) file: Arc<str>,
    pub(super) line: u64,
}

pub(super) type UnitResult = Result<Vec<SourcedResource>, Vec<Diagnostic>>;

/// The distinct units of work and who uses them. A unit is a workload's plain
/// manifests, or one template output, under one list of overlays and one set of
/// custom scopes (its group); clusters that share a unit share its resources.
pub(super) struct Units {
    /// The distinct (workload, overlays, custom scopes) of the clusters' plans.
    pub(super) groups: Vec<UnitGroup>,
    pub(super) keys: Vec<UnitKey>,
    /// Per unit, the indices of the clusters that use it.
    pub(super) users: Vec<Vec<usize>>,
    /// Per cluster, the units it is made of, in workload order.
    pub(super) per_cluster: Vec<Vec<usize>>,
    /// Per cluster, the group of each of its plans.
    pub(super) plan_groups: Vec<Vec<usize>>,
}

/// What a cluster's workload is rendered under: the same for every cluster with
/// the same overlays and custom scopes.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub(super) struct UnitGroup {
    pub(super) workload: usize,
    pub(super) overlays: Vec<usize>,
    pub(super) scope: usize,
}

/// One distinct piece of rendering work (see [`Units`]).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct UnitKey {
    pub(super) group: usize,
    /// `None` for the workload's plain manifests, else a template output.
    pub(super) output: Option<usize>,
}

pub(super) fn plan_units(plans_per_cluster: &[Vec<Plan>], cluster_scope: &[usize]) -> Units {
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

/// The custom cluster-scoped kinds of each cluster, from the CRDs its workloads carry:
/// per cluster an id into the returned table of distinct sets.
pub(super) fn custom_scopes(
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
pub(super) fn scopes_defined_by(path: &str, text: &str) -> CustomScopes {
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
pub(super) struct OutputTexts {
    /// Per output, its template (an index into the render's template paths).
    pub(super) templates: Vec<usize>,
    texts: Vec<Mutex<Option<Arc<Written>>>>,
    /// Per output, how many units have yet to read it.
    readers_left: Vec<AtomicUsize>,
}

impl OutputTexts {
    pub(super) fn new(outputs: Vec<(usize, Written)>, units: &[UnitKey]) -> OutputTexts {
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

/// Where the stencil of each (unit group, template) is: every group of a workload
/// with templates read as values has a slot per template of the workload.
pub(super) struct StencilSlots {
    /// Per group, its first slot.
    first: Vec<Option<usize>>,
    /// Per slot, its (group, template).
    pub(super) keys: Vec<(usize, usize)>,
}

impl StencilSlots {
    pub(super) fn new(
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
    pub(super) fn of(&self, group: usize, template: usize) -> Option<usize> {
        let first = self.first[group]?;
        let (_, first_template) = self.keys[first];
        // A Helm release's output is no template of the workload's and has none.
        let slot = first + template.checked_sub(first_template)?;
        (self.keys.get(slot)? == &(group, template)).then_some(slot)
    }
}

/// What rendering a unit needs besides its key.
/// The bundle metadata of the clusters assembled so far, each distinct one made once
/// (with its canonical bytes) and shared by every bundle that has it.
#[derive(Default)]
pub(super) struct MetaCache(
    std::sync::Mutex<
        std::collections::HashMap<
            flotilla_core::bundle::BundleMeta,
            flotilla_core::bundle::SharedMeta,
            foldhash::fast::RandomState,
        >,
    >,
);

impl MetaCache {
    /// The shared copy of `meta` (`None` for none).
    pub(super) fn shared(
        &self,
        meta: Option<flotilla_core::bundle::BundleMeta>,
    ) -> Option<flotilla_core::bundle::SharedMeta> {
        let meta = meta.filter(|m| !m.is_empty())?;
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(shared) = known.get(&meta) {
            return Some(shared.clone());
        }
        let shared = flotilla_core::bundle::SharedMeta::new(meta.clone())?;
        known.insert(meta, shared.clone());
        Some(shared)
    }
}

/// What assembling a cluster learns from each distinct Secret, worked out once per
/// pass however many clusters hold it: the metadata entries that repeat its values,
/// and, when the pass seals, its [`crate::seal::Prepared`] parts. Known by the
/// Secret's canonical bytes, hashed with foldhash (seeded at random): each Secret of
/// each cluster is looked up here.
#[derive(Default)]
pub(super) struct SecretMemo(Mutex<SecretFactsMap>);

type SecretFactsMap =
    std::collections::HashMap<Box<[u8]>, Arc<SecretFacts>, foldhash::fast::RandomState>;

/// See [`SecretMemo`].
pub(super) struct SecretFacts {
    key: Arc<flotilla_core::bundle::ResourceKey>,
    pub(super) revealing: Vec<(&'static str, String)>,
    pub(super) prepared: Option<crate::seal::Prepared>,
}

impl SecretMemo {
    /// The facts of `resource`, a core Secret; its preparation for sealing only with
    /// a `sealer`, which is the same for every call of one pass.
    pub(super) fn facts(
        &self,
        resource: &Resource,
        sealer: Option<&crate::seal::Sealer>,
    ) -> Arc<SecretFacts> {
        let memo = |map: &SecretFactsMap| {
            map.get(&*resource.canonical)
                .filter(|facts| facts.key == resource.key)
                .cloned()
        };
        if let Some(found) = memo(&self.0.lock().unwrap_or_else(|e| e.into_inner())) {
            return found;
        }
        let value = resource.value();
        let facts = Arc::new(SecretFacts {
            key: resource.key.clone(),
            revealing: flotilla_core::secret::revealing_metadata(&value),
            prepared: sealer.and_then(|s| s.prepare(&value, &resource.key.to_string())),
        });
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(Box::<[u8]>::from(&*resource.canonical))
            .or_insert_with(|| facts.clone());
        facts
    }
}

pub(super) struct UnitContext<'a> {
    pub(super) metas: &'a MetaCache,
    pub(super) fleet: &'a Fleet,
    pub(super) template_paths: &'a [&'a String],
    pub(super) shapes: &'a [Option<Shape>],
    pub(super) patch_limits: &'a PatchLimits,
    pub(super) max_resource_bytes: usize,
    pub(super) sealer: Option<&'a crate::seal::Sealer>,
    pub(super) secrets: &'a SecretMemo,
    pub(super) sops_secrets: &'a [crate::sops::SopsSecret],
}

/// Renders one unit (of a group with its custom scopes, reading `output` of
/// `outputs` or the workload's plain manifests); also returns the (overlay, patch)
/// pairs whose target matched one of its resources.
pub(super) fn render_unit(
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
pub(super) fn render_output(
    unit: &UnitContext<'_>,
    (group, scopes): (&UnitGroup, &CustomScopes),
    (template, written): (usize, &Written),
    stencil: Option<&StencilUnit>,
) -> (UnitResult, Vec<(usize, usize)>) {
    let path = unit.template_paths[template];
    let shape = unit.shapes[template].as_ref();
    let parsed = match written {
        Written::Text(text) => parse_output(path, shape, text),
        Written::Release(output) => Ok(output.documents()),
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
pub(super) fn matched_pairs(group: &UnitGroup, flags: &[Vec<bool>]) -> Vec<(usize, usize)> {
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
pub(super) fn fill(
    stencil: &StencilUnit,
    shape: &Shape,
    values: &[Box<str>],
    max_resource_bytes: usize,
) -> Option<Vec<SourcedResource>> {
    let scalars = shape.scalars(values)?;
    let filled = stencil.fill(&scalars, max_resource_bytes)?;
    Some(
        stencil
            .resources
            .iter()
            .zip(filled)
            .map(|(resource, canonical)| SourcedResource {
                resource: Arc::new(Resource {
                    key: resource.key.clone(),
                    canonical: canonical.into(),
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
                rendered.push(SourcedResource {
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

/// The documents of a template's output: read through the template's shape when it
/// has one that fits this output (see [`shape`](crate::shape)), else parsed.
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

/// A unit's errors are every user's errors.
pub(super) fn report_unit_errors(
    fleet: &Fleet,
    clusters: &[&Cluster],
    units: &Units,
    rendered: &[Result<Vec<SourcedResource>, Vec<Diagnostic>>],
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
