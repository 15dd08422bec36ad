//! From a snapshot's files to a typed, cross-checked fleet: every file parsed,
//! names checked against file names, references between objects resolved, and every
//! problem collected as a diagnostic rather than stopping at the first.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rayon::prelude::*;
use regex::Regex;
use serde::de::DeserializeOwned;

use super::kustomize;
use super::yaml::{self, YamlDocument};
use flotilla_core::bundle::TENANCY_WORKLOAD;
use flotilla_core::diagnostic::{Diagnostic, did_you_mean};
use flotilla_core::model::{
    ClusterDoc, FleetSettingsDoc, GroupDoc, LabelSelector, Located, OverlayDoc, Patch,
    RolloutPolicyDoc, TenantDoc, WorkloadDoc, parse_selector,
};
use flotilla_core::names;
use flotilla_core::rollout::{self, Budget, Policy, WavePlan, Window};
use flotilla_core::snapshot::{FleetSnapshot, KUSTOMIZATION_FILE_NAMES};

// The fleet's types are read here and used by the rest of the renderer; they are
// named here too, as before they had a module of their own.
pub use crate::fleet::{
    Cluster, CompiledPatch, Fleet, Group, Overlay, PatchAction, RolloutPolicy, SourcedDocument,
    Tenant, WaveSelection, Workload,
};

const API_VERSION: &str = flotilla_core::bundle::API_VERSION;

/// What one file turned out to be.
enum Loaded {
    Cluster(Cluster),
    Group(Group),
    Workload(Workload),
    Overlay(Overlay),
    RolloutPolicy(RolloutPolicy),
    Tenant(Tenant),
    Settings(flotilla_core::model::FleetSettings),
    Manifest {
        workload: String,
        documents: Vec<SourcedDocument>,
    },
    Template {
        workload: String,
        path: String,
    },
    Nothing,
}

/// The cluster files a load read without a problem, by path, with their text: a
/// load given them takes each cluster file whose text is the same from here instead
/// of parsing it again (a cluster file is read from its path and text alone).
#[derive(Debug, Default)]
pub struct ParsedClusters {
    files: HashMap<String, ParsedCluster>,
}

/// A cluster file's text and what it reads as; a load that takes it from an earlier
/// one keeps the same entry.
type ParsedCluster = Arc<(Arc<str>, Cluster)>;

impl ParsedClusters {
    /// About how many bytes it holds.
    pub fn weight(&self) -> u64 {
        self.files
            .iter()
            .map(|(path, entry)| {
                let (text, cluster) = &**entry;
                let labels: usize = cluster
                    .labels
                    .iter()
                    .map(|(k, v)| 64 + k.len() + v.len())
                    .sum();
                (256 + 2 * path.len() + text.len() + labels + 2 * cluster.name.len()) as u64
            })
            .sum()
    }

    fn get(&self, path: &str, text: &Arc<str>) -> Option<&ParsedCluster> {
        let entry = self.files.get(path)?;
        (Arc::ptr_eq(&entry.0, text) || *entry.0 == **text).then_some(entry)
    }
}

/// Parses and cross-checks every file of the snapshot. Files parse in parallel;
/// the result does not depend on the order they finish in.
pub fn load(snapshot: &FleetSnapshot, diagnostics: &mut Vec<Diagnostic>) -> Fleet {
    let tenants = TenantFiles::read(snapshot);
    load_reusing(snapshot, diagnostics, None, tenants).0
}

/// The fleet's Tenant files (`tenants/<name>.yaml`), each read once for a render:
/// what each loads as and the problems found in it, by path.
#[derive(Default)]
pub struct TenantFiles {
    files: BTreeMap<String, TenantFile>,
}

struct TenantFile {
    /// The name and `spec.workloads` of a file that parses as a Tenant, whether or
    /// not it passes the checks.
    claims: Option<(String, Vec<String>)>,
    /// The tenant, if the file has no problem.
    tenant: Option<Tenant>,
    diagnostics: Vec<Diagnostic>,
}

impl TenantFiles {
    /// Reads every Tenant file of `snapshot`.
    pub fn read(snapshot: &FleetSnapshot) -> TenantFiles {
        let files = snapshot
            .files
            .iter()
            .filter(|(path, _)| is_tenant_file(path))
            .map(|(path, text)| {
                let mut diagnostics = Vec::new();
                let doc: Option<TenantDoc> = parse_kind(path, text, "Tenant", &mut diagnostics);
                let claims = doc.as_ref().map(|doc| {
                    let workloads = doc.spec.workloads.iter().map(|w| w.value.clone());
                    (doc.metadata.name.clone(), workloads.collect())
                });
                let tenant = doc.and_then(|doc| check_tenant(path, text, doc, &mut diagnostics));
                let file = TenantFile {
                    claims,
                    tenant,
                    diagnostics,
                };
                (path.clone(), file)
            })
            .collect();
        TenantFiles { files }
    }

    /// Each Tenant file's name and the workloads (names or globs) it claims, for a
    /// file that parses as a Tenant even if a check of it fails.
    pub fn claims(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.files
            .values()
            .filter_map(|file| file.claims.as_ref())
            .map(|(name, workloads)| (name.as_str(), workloads.as_slice()))
    }
}

fn is_tenant_file(path: &str) -> bool {
    path.strip_prefix("tenants/")
        .is_some_and(|file| !file.contains('/') && is_yaml(file))
}

/// [`load`], taking the cluster files `known` holds with the same text from it and
/// the Tenant files from `tenants` (read from the same snapshot); also returns the
/// cluster files this load read without a problem.
pub fn load_reusing(
    snapshot: &FleetSnapshot,
    diagnostics: &mut Vec<Diagnostic>,
    known: Option<&ParsedClusters>,
    tenants: TenantFiles,
) -> (Fleet, ParsedClusters) {
    // Each file as loaded, with the entry to keep for a cluster file read cleanly.
    let parsed: Vec<(&String, Option<ParsedCluster>, Loaded, Vec<Diagnostic>)> = snapshot
        .files
        .par_iter()
        .map(|(path, text)| {
            if let Some(entry) = known.and_then(|k| k.get(path, text)) {
                let cluster = Loaded::Cluster(entry.1.clone());
                return (path, Some(entry.clone()), cluster, Vec::new());
            }
            if let Some(file) = tenants.files.get(path.as_str()) {
                // Its tenant joins the fleet below.
                return (path, None, Loaded::Nothing, file.diagnostics.clone());
            }
            let mut found = Vec::new();
            let loaded = load_file(path, text, &mut found);
            let entry = match (&loaded, found.is_empty()) {
                (Loaded::Cluster(cluster), true) => Some(Arc::new((text.clone(), cluster.clone()))),
                _ => None,
            };
            (path, entry, loaded, found)
        })
        .collect();
    let mut fleet = Fleet::default();
    let mut clusters = ParsedClusters::default();
    let mut manifests: BTreeMap<String, Vec<SourcedDocument>> = BTreeMap::new();
    let mut templates: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, entry, loaded, found) in parsed {
        if let Some(entry) = entry {
            clusters.files.insert(path.clone(), entry);
        }
        diagnostics.extend(found);
        match loaded {
            Loaded::Cluster(cluster) => fleet.clusters.push(cluster),
            Loaded::Group(group) => fleet.groups.push(group),
            Loaded::Workload(workload) => fleet.workloads.push(workload),
            Loaded::Overlay(overlay) => fleet.overlays.push(overlay),
            Loaded::RolloutPolicy(policy) => fleet.rollout_policies.push(policy),
            Loaded::Tenant(tenant) => fleet.tenants.push(tenant),
            Loaded::Settings(settings) => fleet.settings = settings,
            Loaded::Manifest {
                workload,
                documents,
            } => manifests.entry(workload).or_default().extend(documents),
            Loaded::Template { workload, path } => {
                templates.entry(workload).or_default().push(path)
            }
            Loaded::Nothing => {}
        }
    }
    fleet
        .tenants
        .extend(tenants.files.into_values().filter_map(|file| file.tenant));
    fleet.tenants.sort_by(|a, b| a.name.cmp(&b.name));
    crate::tenancy::assign(&mut fleet, diagnostics);
    if let Some(text) = snapshot.files.get(crate::tenancy::SIGNED_RULES_FILE) {
        fleet.signed_tenant_rules = crate::tenancy::signed_rules(text, &fleet.tenants, diagnostics);
    }
    // A symlink counts as the file it leads to: one in a tenant's folders that leads
    // outside what the tenant may read is refused, whoever reads it (its manifests,
    // its kustomizations, its charts).
    if !snapshot.links.is_empty() {
        for t in 0..fleet.tenants.len() {
            let fence = crate::tenancy::Fence::of(&fleet, t);
            for (path, target) in &snapshot.links {
                if fence.owns(path) && !fence.allows(target) {
                    let workload = path
                        .strip_prefix("workloads/")
                        .and_then(|rest| rest.split('/').next());
                    let mut error = Diagnostic::error(format!(
                        "a symlink to {target}; {}",
                        fence.refusal(target)
                    ))
                    .in_file(path);
                    if let Some(workload) = workload {
                        error = error.for_workload(workload);
                    }
                    diagnostics.push(error);
                }
            }
        }
    }
    // A tenant's kustomizations see only the files the tenant may read.
    let fenced: Vec<Option<FleetSnapshot>> = (0..fleet.tenants.len())
        .map(|t| {
            fleet
                .workloads
                .iter()
                .any(|w| {
                    w.tenant == Some(t)
                        && kustomize::file::find_in(snapshot, &format!("workloads/{}", w.name))
                            .is_ok_and(|found| found.is_some())
                })
                .then(|| crate::tenancy::Fence::of(&fleet, t).snapshot(snapshot))
        })
        .collect();
    // A workload that is a kustomize base is built once here, for every cluster.
    let built: Vec<Option<Result<Vec<SourcedDocument>, Vec<Diagnostic>>>> = fleet
        .workloads
        .par_iter()
        .map(|workload| {
            let seen = workload
                .tenant
                .and_then(|t| fenced[t].as_ref())
                .unwrap_or(snapshot);
            build_kustomization(seen, &workload.name)
        })
        .collect();
    // A Helm workload's chart is read once here, for every cluster.
    let releases: Vec<Option<(crate::release::HelmRelease, Vec<Diagnostic>)>> = fleet
        .workloads
        .par_iter()
        .map(|workload| {
            let spec = workload.helm_spec.as_ref()?;
            let mut found = Vec::new();
            let release = crate::release::read(
                snapshot,
                &workload.name,
                &workload.file,
                workload.namespace.as_deref(),
                spec,
                &mut found,
            );
            Some((release, found))
        })
        .collect();
    for (w, release) in releases.iter().enumerate() {
        if let (Some((release, _)), Some(t)) = (release, fleet.workloads[w].tenant) {
            let fence = crate::tenancy::Fence::of(&fleet, t);
            let workload = &fleet.workloads[w];
            let text = snapshot.files.get(&workload.file);
            for path in release.inputs.iter().filter(|p| !fence.allows(p)) {
                diagnostics.push(
                    Diagnostic::error(fence.refusal(path))
                        .in_file(&workload.file)
                        .at_line(text.and_then(|t| key_line_anywhere(t, "helm")))
                        .for_workload(&workload.name),
                );
            }
        }
    }
    for (workload, release) in fleet.workloads.iter_mut().zip(releases) {
        if let Some((release, found)) = release {
            diagnostics.extend(found);
            // Resources the chart leaves without a namespace go to the release's.
            workload.namespace = Some(release.namespace.clone());
            workload.helm = Some(Arc::new(release));
        }
    }
    for (workload, built) in fleet.workloads.iter_mut().zip(built) {
        let mut documents = manifests.remove(&workload.name).unwrap_or_default();
        match built {
            Some(Ok(resources)) => documents.extend(resources),
            Some(Err(errors)) => diagnostics.extend(
                errors
                    .into_iter()
                    .map(|d| d.for_workload(workload.name.clone())),
            ),
            None => {}
        }
        workload.documents = Arc::new(documents);
        workload.templates = templates.remove(&workload.name).unwrap_or_default();
    }
    for path in snapshot.files.keys() {
        if let ["workloads", name, file] = path.split('/').collect::<Vec<_>>().as_slice()
            && KUSTOMIZATION_FILE_NAMES.contains(file)
            && !snapshot
                .files
                .contains_key(&format!("workloads/{name}/workload.yaml"))
        {
            diagnostics.push(
                Diagnostic::error(format!(
                    "a kustomization for workload {name:?}, but there is no workloads/{name}/workload.yaml"
                ))
                .in_file(path),
            );
        }
    }
    let orphans = manifests
        .into_iter()
        .filter_map(|(workload, documents)| Some((workload, documents.first()?.file.to_string())))
        .chain(
            templates
                .into_iter()
                .filter_map(|(workload, paths)| Some((workload, paths.first()?.clone()))),
        );
    for (workload, path) in orphans {
        // A workload.yaml that exists but failed to load has been reported already.
        if snapshot
            .files
            .contains_key(&format!("workloads/{workload}/workload.yaml"))
        {
            continue;
        }
        diagnostics.push(
            Diagnostic::error(format!(
                "manifests for workload {workload:?}, but there is no workloads/{workload}/workload.yaml"
            ))
            .in_file(path),
        );
    }
    fleet.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    fleet.groups.sort_by(|a, b| a.name.cmp(&b.name));
    fleet.workloads.sort_by(|a, b| a.name.cmp(&b.name));
    fleet
        .overlays
        .sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
    check_duplicates(&mut fleet, diagnostics);
    check_references(snapshot, &fleet, diagnostics);
    crate::order::check_cycles(&fleet, diagnostics);
    check_policy_references(snapshot, &fleet, diagnostics);
    (fleet, clusters)
}

/// Builds `workloads/<name>/` if it holds a kustomization file.
fn build_kustomization(
    snapshot: &FleetSnapshot,
    name: &str,
) -> Option<Result<Vec<SourcedDocument>, Vec<Diagnostic>>> {
    let dir = format!("workloads/{name}");
    match kustomize::file::find_in(snapshot, &dir) {
        Ok(Some(file)) => Some(kustomize::build(snapshot, &dir, &file)),
        Ok(None) => None,
        Err(message) => Some(Err(vec![
            Diagnostic::error(message).in_file(format!("{dir}/kustomization.yaml")),
        ])),
    }
}

/// A file among a workload's manifests that is not a manifest but the file of
/// another tool: what it is and where it belongs.
fn misplaced_tool_file(path: &str, workload: &str, file: &str, text: &str) -> Option<String> {
    let folder = path.rsplit_once('/').map_or("", |(dir, _)| dir);
    let relative = folder
        .strip_prefix(&format!("workloads/{workload}/"))
        .unwrap_or(folder);
    let is_kustomization = KUSTOMIZATION_FILE_NAMES.contains(&file)
        || text.lines().any(|line| {
            // A top-level key only: an indented one may be text inside a block scalar.
            line.strip_prefix("apiVersion:").is_some_and(|v| {
                v.trim()
                    .trim_matches(['"', '\''])
                    .starts_with("kustomize.config.k8s.io/")
            })
        });
    if is_kustomization {
        return Some(format!(
            "this is a kustomization, not a Kubernetes manifest: flotilla builds a workload's kustomize base from workloads/{workload}/kustomization.yaml; move it there (with its paths made relative to workloads/{workload}/), or list this folder there under `resources: [{relative}]`"
        ));
    }
    if file == "fleet.yaml" || file == "fleet.yml" {
        return Some(format!(
            "this is a Fleet bundle file (fleet.yaml), not a Kubernetes manifest: in flotilla its namespace is spec.namespace of workloads/{workload}/workload.yaml, its targets are spec.targets there, and its targetCustomizations are groups and overlays (see docs/migrating.md); remove it from the manifests"
        ));
    }
    None
}

fn load_file(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Loaded {
    let parts: Vec<&str> = path.split('/').collect();
    let loaded = match parts.as_slice() {
        ["clusters", file] if is_yaml(file) => {
            load_cluster(path, text, diagnostics).map(Loaded::Cluster)
        }
        ["groups", file] if is_yaml(file) => load_group(path, text, diagnostics).map(Loaded::Group),
        ["workloads", _, "workload.yaml"] => {
            load_workload(path, text, diagnostics).map(Loaded::Workload)
        }
        ["workloads", workload, "manifests", .., file] if file.ends_with(".j2") => {
            Some(Loaded::Template {
                workload: workload.to_string(),
                path: path.to_string(),
            })
        }
        ["workloads", workload, "manifests", .., file]
            if (is_yaml(file) || KUSTOMIZATION_FILE_NAMES.contains(file))
                && let Some(message) = misplaced_tool_file(path, workload, file, text) =>
        {
            diagnostics.push(
                Diagnostic::error(message)
                    .in_file(path)
                    .for_workload(*workload),
            );
            None
        }
        ["workloads", workload, "manifests", .., file] if is_yaml(file) => {
            match yaml::parse_documents(text) {
                Ok(parsed) => {
                    for document in &parsed {
                        warn_about_server_set_fields(path, workload, document, diagnostics);
                    }
                    let file: Arc<str> = Arc::from(path);
                    let documents = parsed
                        .into_iter()
                        .map(|YamlDocument { value, line }| SourcedDocument {
                            value,
                            file: file.clone(),
                            line,
                        })
                        .collect();
                    Some(Loaded::Manifest {
                        workload: workload.to_string(),
                        documents,
                    })
                }
                Err(err) => {
                    diagnostics.push(
                        Diagnostic::error(err.message)
                            .in_file(path)
                            .at_line(err.line)
                            .for_workload(*workload),
                    );
                    None
                }
            }
        }
        ["overlays", .., file] if is_yaml(file) => {
            load_overlay(path, text, diagnostics).map(Loaded::Overlay)
        }
        ["rollouts", file] if is_yaml(file) => {
            load_rollout_policy(path, text, diagnostics).map(Loaded::RolloutPolicy)
        }
        ["tenants", file] if is_yaml(file) => {
            load_tenant(path, text, diagnostics).map(Loaded::Tenant)
        }
        ["flotilla.yaml"] => load_settings(path, text, diagnostics).map(Loaded::Settings),
        _ => None,
    };
    loaded.unwrap_or(Loaded::Nothing)
}

/// Fields the API server sets, which a manifest exported with `kubectl get -o yaml`
/// carries: the agent drops them before applying, but they do not belong in a fleet.
fn warn_about_server_set_fields(
    path: &str,
    workload: &str,
    document: &YamlDocument,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let mut found: Vec<String> = flotilla_core::bundle::SERVER_SET_METADATA
        .iter()
        .filter(|field| {
            document
                .value
                .pointer(&format!("/metadata/{field}"))
                .is_some()
        })
        .map(|field| format!("metadata.{field}"))
        .collect();
    if document.value.get("status").is_some() {
        found.push("status".to_string());
    }
    if !found.is_empty() {
        diagnostics.push(
            Diagnostic::warning(format!(
                "{} {} set by the Kubernetes API server (exported with `kubectl get -o yaml`?); \
                 the agent drops them before applying: remove them from the manifest",
                found.join(", "),
                if found.len() == 1 { "is" } else { "are" }
            ))
            .in_file(path)
            .at_line(Some(document.line))
            .for_workload(workload),
        );
    }
}

fn is_yaml(file: &str) -> bool {
    file.ends_with(".yaml") || file.ends_with(".yml")
}

fn file_stem(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".yaml")
        .or_else(|| file.strip_suffix(".yml"))
        .unwrap_or(file)
}

/// The `apiVersion` and `kind` every flotilla document carries.
trait Header {
    fn header(&self) -> (&str, &str);
}

macro_rules! header {
    ($($doc:ty),*) => {$(
        impl Header for $doc {
            fn header(&self) -> (&str, &str) {
                (&self.api_version, &self.kind)
            }
        }
    )*};
}
header!(
    ClusterDoc,
    GroupDoc,
    WorkloadDoc,
    OverlayDoc,
    RolloutPolicyDoc,
    FleetSettingsDoc,
    TenantDoc
);

/// Parses a file as one of flotilla's kinds. A wrong apiVersion or kind is reported
/// as such, rather than as the unknown fields that usually follow from it.
fn parse_kind<T: DeserializeOwned + Header>(
    path: &str,
    text: &str,
    kind: &str,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<T> {
    let wrong_kind = |api_version: Option<&str>, found: Option<&str>| {
        (api_version != Some(API_VERSION) || found != Some(kind)).then(|| {
            Diagnostic::error(format!(
                "expected apiVersion {API_VERSION:?} and kind {kind:?}, found {} and {}",
                describe(api_version),
                describe(found)
            ))
            .in_file(path)
            .at_line(key_line(
                text,
                if api_version != Some(API_VERSION) {
                    "apiVersion"
                } else {
                    "kind"
                },
            ))
        })
    };
    let typed_error = match yaml::parse::<T>(text) {
        Ok(value) => {
            let (api_version, found) = value.header();
            if let Some(diagnostic) = wrong_kind(Some(api_version), Some(found)) {
                diagnostics.push(diagnostic);
                return None;
            }
            return Some(value);
        }
        Err(err) => err,
    };
    // Only a file that failed to parse is read a second time, for the better message.
    match yaml::parse::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(header)) => {
            let field = |name: &str| header.get(name).and_then(|v| v.as_str());
            if let Some(diagnostic) = wrong_kind(field("apiVersion"), field("kind")) {
                diagnostics.push(diagnostic);
                return None;
            }
        }
        Ok(_) => {
            diagnostics.push(
                Diagnostic::error(format!("expected a {kind} object (a YAML mapping)"))
                    .in_file(path),
            );
            return None;
        }
        Err(_) => {}
    }
    diagnostics.push(
        Diagnostic::error(typed_error.message)
            .in_file(path)
            .at_line(typed_error.line),
    );
    None
}

/// The line of a top-level key, found by reading the text (the parser's typed
/// result no longer knows it).
fn key_line(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .position(|line| {
            line.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|index| index as u64 + 1)
}

fn describe(value: Option<&str>) -> String {
    value.map_or_else(|| "nothing".to_string(), |v| format!("{v:?}"))
}

/// A cluster, group, workload or overlay name must be a DNS-1123 label: it becomes
/// a file name, a URL path segment and a label value.
fn check_label(
    path: &str,
    text: &str,
    what: &str,
    name: &str,
    diagnostics: &mut Vec<Diagnostic>,
) -> bool {
    match names::dns1123_label(name) {
        Ok(()) => true,
        Err(invalid) => {
            diagnostics.push(
                Diagnostic::error(format!(
                    "metadata.name {} is not a valid {what} name: it {invalid}",
                    names::shown(name)
                ))
                .in_file(path)
                .at_line(metadata_name_line(text)),
            );
            false
        }
    }
}

/// The line of `metadata.name` in a block-style document, found by reading the text
/// (the typed result no longer knows it): the first `name:` below `metadata:`.
fn metadata_name_line(text: &str) -> Option<u64> {
    let lines: Vec<&str> = text.lines().collect();
    let metadata = lines.iter().position(|line| {
        line.strip_prefix("metadata")
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
    })?;
    lines[metadata + 1..]
        .iter()
        .take_while(|line| line.trim().is_empty() || line.starts_with([' ', '\t', '#']))
        .position(|line| line.trim_start().starts_with("name:"))
        .map(|offset| (metadata + offset + 2) as u64)
}

/// Labels must be valid Kubernetes label keys and values: a cluster's are what
/// templates may copy into resources, an overlay's are written into every resource
/// it applies to, and an API server refuses any other. Each refused label is an
/// error at its line.
fn check_labels(
    path: &str,
    text: &str,
    field: LabelField,
    labels: &BTreeMap<String, String>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let mut lines: Option<BTreeMap<String, u64>> = None;
    for (key, value) in labels {
        let mut problems = Vec::new();
        if let Err(invalid) = names::label_key(key) {
            problems.push(format!(
                "{}: the key {} is not a valid label key: it {invalid}",
                field.name(),
                names::shown(key)
            ));
        }
        if let Err(invalid) = names::label_value(value) {
            problems.push(format!(
                "{}: the value {} of label {} is not a valid label value: it {invalid}",
                field.name(),
                names::shown(value),
                names::shown(key)
            ));
        }
        if problems.is_empty() {
            continue;
        }
        let lines = lines.get_or_insert_with(|| label_lines(text, field));
        for problem in problems {
            diagnostics.push(
                Diagnostic::error(problem)
                    .in_file(path)
                    .at_line(lines.get(key).copied()),
            );
        }
    }
}

/// Where a document's labels are: a cluster's under `metadata`, an overlay's (those
/// it adds to resources) under `spec`.
#[derive(Clone, Copy)]
enum LabelField {
    Metadata,
    Spec,
}

impl LabelField {
    fn name(self) -> &'static str {
        match self {
            LabelField::Metadata => "metadata.labels",
            LabelField::Spec => "spec.labels",
        }
    }
}

/// The labels of a document, each with its value's line: read again only when a
/// label was refused, since the typed document no longer knows its lines.
#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct LabelLines {
    metadata: LabelSection,
    spec: LabelSection,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct LabelSection {
    labels: BTreeMap<String, Located<String>>,
}

fn label_lines(text: &str, field: LabelField) -> BTreeMap<String, u64> {
    let Ok(lines) = yaml::parse::<LabelLines>(text) else {
        return BTreeMap::new();
    };
    let section = match field {
        LabelField::Metadata => lines.metadata,
        LabelField::Spec => lines.spec,
    };
    section
        .labels
        .into_iter()
        .map(|(key, value)| (key, value.referenced.line()))
        .collect()
}

fn check_name(
    path: &str,
    what: &str,
    name: &str,
    expected: &str,
    diagnostics: &mut Vec<Diagnostic>,
) -> bool {
    if name == expected {
        return true;
    }
    diagnostics.push(
        Diagnostic::error(format!(
            "metadata.name {name:?} does not match the {what} {expected:?}"
        ))
        .in_file(path),
    );
    false
}

fn check_selector(
    path: &str,
    field: &str,
    selector: &LabelSelector,
    diagnostics: &mut Vec<Diagnostic>,
) {
    for problem in selector.problems() {
        diagnostics.push(Diagnostic::error(format!("{field}: {problem}")).in_file(path));
    }
}

fn load_cluster(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Cluster> {
    let doc: ClusterDoc = parse_kind(path, text, "Cluster", diagnostics)?;
    if !check_label(path, text, "cluster", &doc.metadata.name, diagnostics) {
        return None;
    }
    // A cluster whose labels are refused is kept, so what names it is not refused
    // too; the error alone keeps the commit from being served.
    check_labels(
        path,
        text,
        LabelField::Metadata,
        &doc.metadata.labels,
        diagnostics,
    );
    check_kube_version(path, text, doc.spec.kubernetes.as_ref(), diagnostics);
    let agent_key = match doc
        .spec
        .agent_key
        .as_deref()
        .map(crate::seal::AgentKey::parse)
    {
        None => None,
        Some(Ok(key)) => Some(key),
        Some(Err(reason)) => {
            diagnostics.push(
                Diagnostic::error(format!("spec.agentKey: {reason}"))
                    .in_file(path)
                    .at_line(key_line_anywhere(text, "agentKey")),
            );
            return None;
        }
    };
    check_name(
        path,
        "file name",
        &doc.metadata.name,
        file_stem(path),
        diagnostics,
    )
    .then(|| Cluster {
        name: doc.metadata.name,
        labels: doc.metadata.labels,
        vars: doc.spec.vars,
        file: path.to_string(),
        paused: doc.spec.paused,
        kubernetes: doc.spec.kubernetes,
        agent_key,
    })
}

/// `flotilla.yaml`: the fleet's settings.
fn load_settings(
    path: &str,
    text: &str,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<flotilla_core::model::FleetSettings> {
    let doc: FleetSettingsDoc = parse_kind(path, text, "FleetSettings", diagnostics)?;
    check_kube_version(path, text, doc.spec.kubernetes.as_ref(), diagnostics);
    Some(doc.spec)
}

/// `spec.kubernetes.version`, read as Helm reads `--kube-version` (`1.31`,
/// `1.31.4`, `v1.31.4-gke.100`): anything else is an error at its line.
fn check_kube_version(
    path: &str,
    text: &str,
    spec: Option<&flotilla_core::model::KubernetesSpec>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    if let Some(version) = spec.and_then(|s| s.version.as_deref())
        && crate::helm::funcs::kube_version(version).is_none()
    {
        diagnostics.push(
            Diagnostic::error(format!(
                "spec.kubernetes.version: {version:?} is not a Kubernetes version (write it as 1.31, 1.31.4 or v1.31.4)"
            ))
            .in_file(path)
            .at_line(key_line_anywhere(text, "kubernetes")),
        );
    }
}

fn load_group(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Group> {
    let doc: GroupDoc = parse_kind(path, text, "Group", diagnostics)?;
    check_selector(path, "spec.selector", &doc.spec.selector, diagnostics);
    if !check_label(path, text, "group", &doc.metadata.name, diagnostics) {
        return None;
    }
    check_name(
        path,
        "file name",
        &doc.metadata.name,
        file_stem(path),
        diagnostics,
    )
    .then(|| Group {
        name: doc.metadata.name,
        selector: doc.spec.selector,
        vars: doc.spec.vars,
        file: path.to_string(),
    })
}

fn load_workload(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Workload> {
    let doc: WorkloadDoc = parse_kind(path, text, "Workload", diagnostics)?;
    let folder = path.split('/').nth(1).unwrap_or_default();
    let mut ok = check_label(path, text, "workload", &doc.metadata.name, diagnostics)
        && check_name(path, "folder name", &doc.metadata.name, folder, diagnostics);
    if doc.metadata.name == TENANCY_WORKLOAD {
        ok = false;
        diagnostics.push(
            Diagnostic::error(format!(
                "the workload name {TENANCY_WORKLOAD} is reserved: flotilla names so the ServiceAccounts and RoleBindings it adds for tenants; rename the workload and its folder"
            ))
            .in_file(path)
            .at_line(key_line_anywhere(text, "name")),
        );
    }
    if let Some(namespace) = &doc.spec.namespace
        && let Err(invalid) = names::dns1123_label(namespace)
    {
        ok = false;
        diagnostics.push(
            Diagnostic::error(format!(
                "spec.namespace {} is not a valid namespace: it {invalid}",
                names::shown(namespace)
            ))
            .in_file(path),
        );
    }
    for target in &doc.spec.targets {
        let set = [
            target.value.group.is_some(),
            target.value.cluster.is_some(),
            target.value.cluster_selector.is_some(),
        ]
        .into_iter()
        .filter(|&b| b)
        .count();
        if set != 1 {
            ok = false;
            diagnostics.push(
                Diagnostic::error(
                    "a target needs exactly one of \"group\", \"cluster\" or \"clusterSelector\"",
                )
                .in_file(path)
                .at_line(Some(target.referenced.line())),
            );
        }
        if let Some(selector) = &target.value.cluster_selector {
            check_selector(
                path,
                "spec.targets[].clusterSelector",
                selector,
                diagnostics,
            );
        }
    }
    ok.then(|| Workload {
        name: doc.metadata.name,
        namespace: doc.spec.namespace,
        targets: doc.spec.targets,
        vars: doc.spec.vars,
        file: path.to_string(),
        documents: Arc::default(),
        templates: Vec::new(),
        helm_spec: doc.spec.helm,
        helm: None,
        depends_on: doc.spec.depends_on,
        drift: doc.spec.drift.unwrap_or_default(),
        tenant: None,
    })
}

fn load_overlay(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Overlay> {
    let doc: OverlayDoc = parse_kind(path, text, "Overlay", diagnostics)?;
    let spec = doc.spec;
    let before = diagnostics.len();
    check_label(path, text, "overlay", &doc.metadata.name, diagnostics);
    check_labels(path, text, LabelField::Spec, &spec.labels, diagnostics);
    if spec.clusters.is_empty() && spec.groups.is_empty() && spec.cluster_selector.is_none() {
        diagnostics.push(
            Diagnostic::error(
                "the overlay selects no clusters: give spec.clusters, spec.groups or spec.clusterSelector (write `clusterSelector: {}` for every cluster)",
            )
            .in_file(path),
        );
    }
    if let Some(selector) = &spec.cluster_selector {
        check_selector(path, "spec.clusterSelector", selector, diagnostics);
    }
    for image in &spec.images {
        if image.new_name.is_none() && image.new_tag.is_none() && image.digest.is_none() {
            diagnostics.push(
                Diagnostic::error(format!(
                    "image {:?}: give at least one of newName, newTag or digest",
                    image.name
                ))
                .in_file(path),
            );
        }
    }
    let patches = spec
        .patches
        .into_iter()
        .filter_map(|patch| compile_patch(path, patch, diagnostics))
        .collect();
    if diagnostics.len() > before {
        return None;
    }
    Some(Overlay {
        name: doc.metadata.name,
        file: path.to_string(),
        priority: spec.priority,
        clusters: spec.clusters,
        groups: spec.groups,
        cluster_selector: spec.cluster_selector,
        workloads: spec.workloads,
        vars: spec.vars,
        helm_values: spec.helm_values,
        images: spec.images,
        drift: spec.drift,
        patches,
        labels: spec.labels,
        annotations: spec.annotations,
        tenant: None,
    })
}

/// `tenants/<name>.yaml`: its name is its file's, its namespaces and cluster roles
/// names or globs, and its selector a valid one.
fn load_tenant(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Tenant> {
    let doc: TenantDoc = parse_kind(path, text, "Tenant", diagnostics)?;
    check_tenant(path, text, doc, diagnostics)
}

/// The checks of a Tenant file that parsed: the tenant, if it passes them.
fn check_tenant(
    path: &str,
    text: &str,
    doc: TenantDoc,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Tenant> {
    let before = diagnostics.len();
    check_name(
        path,
        "file name",
        &doc.metadata.name,
        file_stem(path),
        diagnostics,
    );
    if let Err(invalid) = names::dns1123_label(&doc.metadata.name) {
        diagnostics.push(
            Diagnostic::error(format!(
                "metadata.name {} is not a valid tenant name: it {invalid}",
                names::shown(&doc.metadata.name)
            ))
            .in_file(path),
        );
    }
    let spec = doc.spec;
    if let Some(selector) = &spec.cluster_selector {
        check_selector(path, "spec.clusterSelector", selector, diagnostics);
    }
    if spec.namespaces.is_empty() {
        diagnostics.push(
            Diagnostic::error(
                "the tenant has no namespaces: list in spec.namespaces the namespaces (names or globs, like team-a-*) its resources may be in",
            )
            .in_file(path)
            .at_line(key_line(text, "spec")),
        );
    }
    for namespace in &spec.namespaces {
        let plain = namespace.value.replace(['*', '?'], "x");
        if plain.contains('/') || names::dns1123_label(&plain).is_err() {
            diagnostics.push(
                Diagnostic::error(format!(
                    "spec.namespaces: {} is neither a namespace nor a glob of namespaces",
                    names::shown(&namespace.value)
                ))
                .in_file(path)
                .at_line(Some(namespace.referenced.line())),
            );
        }
    }
    if diagnostics.len() > before {
        return None;
    }
    Some(Tenant {
        name: doc.metadata.name,
        file: path.to_string(),
        workloads: spec.workloads,
        overlays: spec.overlays,
        cluster_selector: spec.cluster_selector,
        namespaces: spec.namespaces,
        cluster_scoped: spec.cluster_scoped,
        cluster_roles: spec.cluster_roles,
        shared_paths: spec.shared_paths,
        pod_security: spec.pod_security.unwrap_or_default(),
    })
}

fn compile_patch(
    path: &str,
    patch: Located<Patch>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<CompiledPatch> {
    let line = patch.referenced.line();
    let Patch {
        target,
        ops,
        merge,
        strategic,
    } = patch.value;
    let error = |message: String| Diagnostic::error(message).in_file(path).at_line(Some(line));
    let action = match (ops, merge, strategic) {
        (Some(ops), None, None) => PatchAction::JsonPatch(serde_json::Value::Array(ops)),
        (None, Some(merge), None) => PatchAction::MergePatch(merge),
        (None, None, Some(strategic @ serde_json::Value::Object(_))) => {
            PatchAction::StrategicMerge(strategic)
        }
        (None, None, Some(_)) => {
            diagnostics.push(error(
                "\"strategic\" must be a mapping: the part of the resource to merge in".into(),
            ));
            return None;
        }
        _ => {
            diagnostics.push(error(
                "a patch needs exactly one of \"ops\" (RFC 6902), \"merge\" (RFC 7396) or \"strategic\" (a strategic merge patch)".into(),
            ));
            return None;
        }
    };
    let mut failed = false;
    let mut regex = |field: &str, pattern: Option<String>| -> Option<Regex> {
        let pattern = pattern?;
        match Regex::new(&format!("^(?:{pattern})$")) {
            Ok(regex) => Some(regex),
            Err(err) => {
                diagnostics.push(error(format!(
                    "target.{field}: invalid regular expression {pattern:?}: {}",
                    // The regex error draws a caret under the pattern over several
                    // lines; a diagnostic is one line, so keep only the reason.
                    err.to_string()
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim_start_matches("error: ")
                )));
                failed = true;
                None
            }
        }
    };
    let group = regex("group", target.group);
    let version = regex("version", target.version);
    let kind = regex("kind", target.kind);
    let name = regex("name", target.name);
    let namespace = regex("namespace", target.namespace);
    let mut selector = |field: &str, text: Option<String>| -> Option<LabelSelector> {
        match parse_selector(&text?) {
            Ok(selector) => Some(selector),
            Err(err) => {
                diagnostics.push(error(format!("target.{field}: {err}")));
                failed = true;
                None
            }
        }
    };
    let label_selector = selector("labelSelector", target.label_selector);
    let annotation_selector = selector("annotationSelector", target.annotation_selector);
    (!failed).then_some(CompiledPatch {
        line,
        group,
        version,
        kind,
        name,
        namespace,
        label_selector,
        annotation_selector,
        action,
    })
}

/// Every fleet object is defined once: two overlays with one name, or a cluster or
/// group defined by two files (`clusters/red.yaml` and `clusters/red.yml`), are
/// errors naming both files. Only the first definition (by file name) is kept.
fn check_duplicates(fleet: &mut Fleet, diagnostics: &mut Vec<Diagnostic>) {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for overlay in &fleet.overlays {
        if let Some(first) = seen.insert(&overlay.name, &overlay.file) {
            diagnostics.push(
                Diagnostic::error(format!(
                    "overlay name {:?} is also used by {first}; overlay names must be unique",
                    overlay.name
                ))
                .in_file(&overlay.file),
            );
        }
    }
    report_twice_defined(
        "cluster",
        &mut fleet.clusters,
        |c| (&c.name, &c.file),
        diagnostics,
    );
    report_twice_defined(
        "group",
        &mut fleet.groups,
        |g| (&g.name, &g.file),
        diagnostics,
    );
    report_twice_defined(
        "workload",
        &mut fleet.workloads,
        |w| (&w.name, &w.file),
        diagnostics,
    );
    report_twice_defined(
        "rollout policy",
        &mut fleet.rollout_policies,
        |p| (&p.name, &p.file),
        diagnostics,
    );
}

/// Reports and drops the later definitions of a name in a list sorted by name.
fn report_twice_defined<T>(
    what: &str,
    items: &mut Vec<T>,
    name_and_file: impl Fn(&T) -> (&String, &String),
    diagnostics: &mut Vec<Diagnostic>,
) {
    items.sort_by(|a, b| name_and_file(a).cmp(&name_and_file(b)));
    let mut kept: Vec<T> = Vec::with_capacity(items.len());
    for item in items.drain(..) {
        if let Some(first) = kept.last() {
            let (first_name, first_file) = name_and_file(first);
            let (name, file) = name_and_file(&item);
            if first_name == name {
                diagnostics.push(
                    Diagnostic::error(format!(
                        "{what} {name:?} is defined twice: here and in {first_file}; keep one of \
                         the two files"
                    ))
                    .in_file(file),
                );
                continue;
            }
        }
        kept.push(item);
    }
    *items = kept;
}

/// Every name a workload target or an overlay refers to must exist.
/// A name whose file exists but failed to load is not reported as unknown: its
/// own error says what is wrong, and a second message would only mislead.
fn check_references(snapshot: &FleetSnapshot, fleet: &Fleet, diagnostics: &mut Vec<Diagnostic>) {
    let clusters: BTreeSet<&str> = fleet.clusters.iter().map(|c| c.name.as_str()).collect();
    let groups: BTreeSet<&str> = fleet.groups.iter().map(|g| g.name.as_str()).collect();
    let workloads: BTreeSet<&str> = fleet.workloads.iter().map(|w| w.name.as_str()).collect();
    let exists = |what: &str, name: &str| match what {
        "cluster" => ["yaml", "yml"].iter().any(|ext| {
            snapshot
                .files
                .contains_key(&format!("clusters/{name}.{ext}"))
        }),
        "group" => ["yaml", "yml"]
            .iter()
            .any(|ext| snapshot.files.contains_key(&format!("groups/{name}.{ext}"))),
        _ => snapshot
            .files
            .contains_key(&format!("workloads/{name}/workload.yaml")),
    };
    let mut check = |file: &str, line: u64, what: &str, name: &str, known: &BTreeSet<&str>| {
        if known.contains(name) || exists(what, name) {
            return;
        }
        let hint = did_you_mean(name, known.iter().copied())
            .map(|best| format!(" (did you mean {best:?}?)"))
            .unwrap_or_default();
        diagnostics.push(
            Diagnostic::error(format!("unknown {what} {name:?}{hint}"))
                .in_file(file)
                .at_line(Some(line)),
        );
    };
    for workload in &fleet.workloads {
        for dependency in &workload.depends_on {
            check(
                &workload.file,
                dependency.referenced.line(),
                "workload",
                &dependency.value,
                &workloads,
            );
        }
        for target in &workload.targets {
            if let Some(group) = &target.value.group {
                check(
                    &workload.file,
                    target.referenced.line(),
                    "group",
                    group,
                    &groups,
                );
            }
            if let Some(cluster) = &target.value.cluster {
                check(
                    &workload.file,
                    target.referenced.line(),
                    "cluster",
                    cluster,
                    &clusters,
                );
            }
        }
    }
    for overlay in &fleet.overlays {
        for cluster in &overlay.clusters {
            check(
                &overlay.file,
                cluster.referenced.line(),
                "cluster",
                &cluster.value,
                &clusters,
            );
        }
        for group in &overlay.groups {
            check(
                &overlay.file,
                group.referenced.line(),
                "group",
                &group.value,
                &groups,
            );
        }
        for workload in overlay.workloads.iter().flatten() {
            check(
                &overlay.file,
                workload.referenced.line(),
                "workload",
                &workload.value,
                &workloads,
            );
        }
    }
}

/// Reads `rollouts/<name>.yaml`, checking every field it can on its own: wave names,
/// `percent` (1–100, not combined with a selection), durations, budgets, windows.
fn load_rollout_policy(
    path: &str,
    text: &str,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<RolloutPolicy> {
    let doc: RolloutPolicyDoc = parse_kind(path, text, "RolloutPolicy", diagnostics)?;
    check_name(
        path,
        "file name",
        &doc.metadata.name,
        file_stem(path),
        diagnostics,
    );
    let spec = doc.spec;
    check_selector(
        path,
        "spec.clusterSelector",
        &spec.cluster_selector,
        diagnostics,
    );
    if spec.waves.is_empty() {
        diagnostics.push(
            Diagnostic::error("spec.waves is empty: give at least one wave")
                .in_file(path)
                .at_line(key_line_anywhere(text, "waves")),
        );
    }
    let mut names: BTreeMap<String, u64> = BTreeMap::new();
    let mut plans = Vec::new();
    let mut selections = Vec::new();
    for located in spec.waves {
        let line = located.referenced.line();
        let wave = located.value;
        let error = |message: String| Diagnostic::error(message).in_file(path).at_line(Some(line));
        let label = if wave.name.is_empty() {
            "a wave".to_string()
        } else {
            format!("wave {:?}", wave.name)
        };
        if wave.name.trim().is_empty() {
            diagnostics.push(error("a wave needs a name".into()));
        } else if let Some(first) = names.insert(wave.name.clone(), line) {
            diagnostics.push(error(format!(
                "{label} is named twice in this policy (also on line {first}); wave names must be unique"
            )));
        }
        let selects =
            wave.groups.is_some() || wave.clusters.is_some() || wave.cluster_selector.is_some();
        let percent = match wave.percent {
            Some(percent) if !(1..=100).contains(&percent) => {
                diagnostics.push(error(format!(
                    "{label}: percent {percent} is outside 1–100"
                )));
                None
            }
            Some(_) if selects => {
                diagnostics.push(error(format!(
                    "{label}: percent takes a share of the governed clusters not in an earlier wave; it cannot be combined with groups, clusters or clusterSelector"
                )));
                None
            }
            Some(percent) => u32::try_from(percent).ok(),
            None => None,
        };
        if let Some(selector) = &wave.cluster_selector {
            check_selector(path, "clusterSelector of a wave", selector, diagnostics);
        }
        let bake = match &wave.bake {
            Some(value) => rollout::parse_duration(value).unwrap_or_else(|message| {
                diagnostics.push(error(format!("{label}: bake: {message}")));
                std::time::Duration::ZERO
            }),
            None => std::time::Duration::ZERO,
        };
        let max_failed = match &wave.max_failed {
            Some(value) => Budget::from_value(value).unwrap_or_else(|message| {
                diagnostics.push(error(format!("{label}: maxFailed: {message}")));
                Budget::Count(0)
            }),
            None => Budget::Count(0),
        };
        let max_parallel = match &wave.max_parallel {
            Some(value) => match Budget::from_value(value) {
                Ok(Budget::Count(0) | Budget::Percent(0)) => {
                    diagnostics.push(error(format!(
                        "{label}: maxParallel 0 would never change a cluster; give at least 1 (or leave it out for all at once)"
                    )));
                    None
                }
                Ok(budget) => Some(budget),
                Err(message) => {
                    diagnostics.push(error(format!("{label}: maxParallel: {message}")));
                    None
                }
            },
            None => None,
        };
        plans.push(WavePlan {
            name: wave.name,
            bake,
            max_failed,
            max_parallel,
        });
        selections.push(WaveSelection {
            line,
            groups: wave.groups.unwrap_or_default(),
            clusters: wave.clusters.unwrap_or_default(),
            selector: wave.cluster_selector,
            percent,
        });
    }
    let progress_deadline = match &spec.progress_deadline {
        Some(value) => match rollout::parse_duration(value) {
            Ok(duration) if duration.is_zero() => {
                diagnostics.push(
                    Diagnostic::error(
                        "progressDeadline 0 would fail every wave at once; give a duration such as 1h, or leave it out",
                    )
                    .in_file(path)
                    .at_line(key_line_anywhere(text, "progressDeadline")),
                );
                None
            }
            Ok(duration) => Some(duration),
            Err(message) => {
                diagnostics.push(
                    Diagnostic::error(format!("progressDeadline: {message}"))
                        .in_file(path)
                        .at_line(key_line_anywhere(text, "progressDeadline")),
                );
                None
            }
        },
        None => None,
    };
    let mut windows = Vec::new();
    for window in &spec.windows {
        match Window::from_spec(&window.value) {
            Ok(checked) => windows.push(checked),
            Err(message) => diagnostics.push(
                Diagnostic::error(format!("window: {message}"))
                    .in_file(path)
                    .at_line(Some(window.referenced.line())),
            ),
        }
    }
    // A policy with errors is kept (the render is not clean anyway), so that its
    // references and overlaps are checked too and every error is reported at once.
    Some(RolloutPolicy {
        name: doc.metadata.name.clone(),
        file: path.to_string(),
        selector: spec.cluster_selector,
        policy: Policy {
            name: doc.metadata.name,
            file: path.to_string(),
            waves: plans,
            offline: spec.offline,
            on_failure: spec.on_failure,
            progress_deadline,
            windows,
        },
        waves: selections,
    })
}

/// The line of the first occurrence of `key:` at any indentation.
fn key_line_anywhere(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .position(|line| {
            line.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|index| index as u64 + 1)
}

/// Every group and cluster a wave names must exist.
fn check_policy_references(
    snapshot: &FleetSnapshot,
    fleet: &Fleet,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let clusters: BTreeSet<&str> = fleet.clusters.iter().map(|c| c.name.as_str()).collect();
    let groups: BTreeSet<&str> = fleet.groups.iter().map(|g| g.name.as_str()).collect();
    let exists = |folder: &str, name: &str| {
        ["yaml", "yml"].iter().any(|ext| {
            snapshot
                .files
                .contains_key(&format!("{folder}/{name}.{ext}"))
        })
    };
    for policy in &fleet.rollout_policies {
        for wave in &policy.waves {
            let named = wave
                .groups
                .iter()
                .map(|g| ("group", "groups", g, &groups))
                .chain(
                    wave.clusters
                        .iter()
                        .map(|c| ("cluster", "clusters", c, &clusters)),
                );
            for (what, folder, name, known) in named {
                if known.contains(name.value.as_str()) || exists(folder, &name.value) {
                    continue;
                }
                let hint = did_you_mean(&name.value, known.iter().copied())
                    .map(|best| format!(" (did you mean {best:?}?)"))
                    .unwrap_or_default();
                diagnostics.push(
                    Diagnostic::error(format!("unknown {what} {:?}{hint}", name.value))
                        .in_file(&policy.file)
                        .at_line(Some(name.referenced.line())),
                );
            }
        }
    }
}
