//! From a snapshot's files to a typed, cross-checked fleet: every file parsed,
//! names checked against file names, references between objects resolved, and every
//! problem collected as a diagnostic rather than stopping at the first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rayon::prelude::*;
use regex::Regex;
use serde::de::DeserializeOwned;

use super::kustomize;
use super::yaml::{self, YamlDocument};
use flotilla_core::diagnostic::{Diagnostic, did_you_mean};
use flotilla_core::model::{
    ClusterDoc, GroupDoc, ImageOverride, LabelSelector, Located, OverlayDoc, Patch, Target, Vars,
    WorkloadDoc, parse_selector,
};
use flotilla_core::snapshot::{FleetSnapshot, KUSTOMIZATION_FILE_NAMES};

const API_VERSION: &str = flotilla_core::bundle::API_VERSION;

#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub vars: Vars,
    pub file: String,
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
    pub images: Vec<ImageOverride>,
    pub patches: Vec<CompiledPatch>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
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

/// The fleet as the renderer uses it: every list sorted (clusters, groups and
/// workloads by name; overlays by priority, then name).
#[derive(Debug, Default)]
pub struct Fleet {
    pub clusters: Vec<Cluster>,
    pub groups: Vec<Group>,
    pub workloads: Vec<Workload>,
    pub overlays: Vec<Overlay>,
}

/// What one file turned out to be.
enum Loaded {
    Cluster(Cluster),
    Group(Group),
    Workload(Workload),
    Overlay(Overlay),
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

/// Parses and cross-checks every file of the snapshot. Files parse in parallel;
/// the result does not depend on the order they finish in.
pub fn load(snapshot: &FleetSnapshot, diagnostics: &mut Vec<Diagnostic>) -> Fleet {
    let parsed: Vec<(Loaded, Vec<Diagnostic>)> = snapshot
        .files
        .par_iter()
        .map(|(path, text)| {
            let mut found = Vec::new();
            let loaded = load_file(path, text, &mut found);
            (loaded, found)
        })
        .collect();
    let mut fleet = Fleet::default();
    let mut manifests: BTreeMap<String, Vec<SourcedDocument>> = BTreeMap::new();
    let mut templates: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (loaded, found) in parsed {
        diagnostics.extend(found);
        match loaded {
            Loaded::Cluster(cluster) => fleet.clusters.push(cluster),
            Loaded::Group(group) => fleet.groups.push(group),
            Loaded::Workload(workload) => fleet.workloads.push(workload),
            Loaded::Overlay(overlay) => fleet.overlays.push(overlay),
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
    // A workload that is a kustomize base is built once here, for every cluster.
    let built: Vec<Option<Result<Vec<SourcedDocument>, Vec<Diagnostic>>>> = fleet
        .workloads
        .par_iter()
        .map(|workload| build_kustomization(snapshot, &workload.name))
        .collect();
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
    check_duplicates(&fleet, diagnostics);
    check_references(snapshot, &fleet, diagnostics);
    fleet
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
        _ => None,
    };
    loaded.unwrap_or(Loaded::Nothing)
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
header!(ClusterDoc, GroupDoc, WorkloadDoc, OverlayDoc);

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
    })
}

fn load_group(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Group> {
    let doc: GroupDoc = parse_kind(path, text, "Group", diagnostics)?;
    check_selector(path, "spec.selector", &doc.spec.selector, diagnostics);
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
    let mut ok = check_name(path, "folder name", &doc.metadata.name, folder, diagnostics);
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
    })
}

fn load_overlay(path: &str, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Option<Overlay> {
    let doc: OverlayDoc = parse_kind(path, text, "Overlay", diagnostics)?;
    let spec = doc.spec;
    let before = diagnostics.len();
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
        images: spec.images,
        patches,
        labels: spec.labels,
        annotations: spec.annotations,
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

fn check_duplicates(fleet: &Fleet, diagnostics: &mut Vec<Diagnostic>) {
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
