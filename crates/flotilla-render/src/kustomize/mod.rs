//! Workloads that are kustomize bases, built as `kubectl kustomize` (kustomize v5)
//! builds them, from the files of the snapshot only: nothing is fetched, no plugin
//! runs (kustomize's builtin transformers and generators configured in YAML are
//! built; exec and Go plugins and KRM functions are refused).
//!
//! A build follows kustomize's order. For one kustomization: its `resources` (files,
//! and folders with their own kustomization, built first, recursively), its
//! generators (`configMapGenerator`, `secretGenerator`), its `components` (applied to
//! what has been gathered so far), then its transformers: `patchesStrategicMerge`,
//! `patches`, `namespace`, `namePrefix`, `nameSuffix`, `labels` and `commonLabels`,
//! `commonAnnotations`, `patchesJson6902`, `replicas`, `images`, and the builtin
//! transformers configured under `transformers:` ([`builtin`]; the builtin generators
//! of `generators:` run after the generator fields). At the top, once:
//! generated names get their content hash, and references to renamed objects are
//! updated (see [`nameref`]).
//!
//! Like kustomize, every resource remembers the identities it had before a rename,
//! and the prefixes and suffixes given to it, so that references written against an
//! old name find the new one.

mod builtin;
mod fieldspec;
pub mod file;
mod generate;
mod nameref;
mod transform;

use std::sync::Arc;

use serde_json::Value;

use crate::fleet::SourcedDocument;
use crate::scope::{CustomScopes, is_cluster_scoped};
use crate::yaml;
use file::Kustomization;
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;

/// A build error: the kustomization file (or resource file) and line it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub file: String,
    pub line: Option<u64>,
    pub message: String,
}

impl Error {
    fn into_diagnostic(self) -> Diagnostic {
        Diagnostic::error(self.message)
            .in_file(self.file)
            .at_line(self.line)
    }
}

/// An identity a resource had before a transformer renamed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PreviousId {
    kind: String,
    name: String,
    /// Effective namespace (see [`Resource::effective_namespace`]).
    namespace: String,
}

/// How a generated resource meets one of the same name from a base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behavior {
    Create,
    Merge,
    Replace,
}

/// A resource during a build.
#[derive(Debug, Clone)]
struct Resource {
    value: Value,
    /// Where it came from (a manifest, or the generator's line).
    file: Arc<str>,
    line: u64,
    previous: Vec<PreviousId>,
    prefixes: Vec<String>,
    suffixes: Vec<String>,
    /// A generated ConfigMap or Secret whose name gets a content hash.
    needs_hash: bool,
    /// The hash keys of the SOPS files a generated object was made from (sorted,
    /// no repeats): its content hash is then keyed with them.
    hash_keys: Vec<[u8; 32]>,
    behavior: Behavior,
}

/// kustomize's placeholder namespace of cluster-scoped kinds.
const NOT_NAMESPACED: &str = "_non_namespaceable_";

fn str_at<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// (group, version) of an `apiVersion`.
fn group_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

impl Resource {
    fn new(value: Value, file: Arc<str>, line: u64) -> Resource {
        Resource {
            value,
            file,
            line,
            previous: Vec::new(),
            prefixes: Vec::new(),
            suffixes: Vec::new(),
            needs_hash: false,
            hash_keys: Vec::new(),
            behavior: Behavior::Create,
        }
    }

    fn api_version(&self) -> &str {
        str_at(&self.value, "/apiVersion")
    }

    fn group(&self) -> &str {
        group_version(self.api_version()).0
    }

    fn version(&self) -> &str {
        group_version(self.api_version()).1
    }

    fn kind(&self) -> &str {
        str_at(&self.value, "/kind")
    }

    fn name(&self) -> &str {
        str_at(&self.value, "/metadata/name")
    }

    fn namespace(&self) -> &str {
        str_at(&self.value, "/metadata/namespace")
    }

    fn is_cluster_scoped_kind(group: &str, kind: &str) -> bool {
        is_cluster_scoped(group, kind, &CustomScopes::new())
    }

    fn cluster_scoped(&self) -> bool {
        Self::is_cluster_scoped_kind(self.group(), self.kind())
    }

    /// kustomize's effective namespace: none for cluster-scoped kinds, `default`
    /// for a namespaced resource that names none.
    fn effective_namespace_of(group: &str, kind: &str, namespace: &str) -> String {
        if Self::is_cluster_scoped_kind(group, kind) {
            NOT_NAMESPACED.to_string()
        } else if namespace.is_empty() {
            "default".to_string()
        } else {
            namespace.to_string()
        }
    }

    fn effective_namespace(&self) -> String {
        Self::effective_namespace_of(self.group(), self.kind(), self.namespace())
    }

    fn current_id(&self) -> PreviousId {
        PreviousId {
            kind: self.kind().to_string(),
            name: self.name().to_string(),
            namespace: self.effective_namespace(),
        }
    }

    /// The identity it was read or generated with.
    fn original_id(&self) -> PreviousId {
        self.previous
            .first()
            .cloned()
            .unwrap_or_else(|| self.current_id())
    }

    /// Every identity it has had, the current one last.
    fn all_ids(&self) -> impl Iterator<Item = PreviousId> + '_ {
        self.previous
            .iter()
            .cloned()
            .chain(std::iter::once(self.current_id()))
    }

    fn store_previous_id(&mut self) {
        let id = self.current_id();
        self.previous.push(id);
    }

    fn set_name(&mut self, name: String) {
        if let Some(metadata) = self
            .value
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
        {
            metadata.insert("name".into(), Value::String(name));
        }
    }

    fn string_map(&self, field: &str) -> std::collections::BTreeMap<String, String> {
        self.value
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .map(|(k, v)| {
                        let text = match v {
                            Value::String(s) => s.clone(),
                            Value::Null => String::new(),
                            other => other.to_string(),
                        };
                        (k.clone(), text)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `Kind namespace/name` for messages.
    fn describe(&self) -> String {
        let group = self.group();
        let kind = if group.is_empty() {
            self.kind().to_string()
        } else {
            format!("{}.{group}", self.kind())
        };
        match self.namespace() {
            "" => format!("{kind}/{}", self.name()),
            namespace => format!("{kind} {namespace}/{}", self.name()),
        }
    }

    fn origin(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Two resources have the same identity (kind, group, version, name, effective
/// namespace).
fn same_id(a: &Resource, b: &Resource) -> bool {
    a.api_version() == b.api_version()
        && a.kind() == b.kind()
        && a.name() == b.name()
        && a.effective_namespace() == b.effective_namespace()
}

/// The resources gathered so far, in order.
#[derive(Default)]
struct Accumulator {
    resources: Vec<Resource>,
}

impl Accumulator {
    /// Adds a resource; one with the same identity already there is an error.
    fn append(&mut self, resource: Resource, at: &Error) -> Result<(), Error> {
        if let Some(existing) = self.resources.iter().find(|r| same_id(r, &resource)) {
            return Err(Error {
                message: format!(
                    "{} is defined twice: at {} and at {}",
                    resource.describe(),
                    existing.origin(),
                    resource.origin()
                ),
                ..at.clone()
            });
        }
        self.resources.push(resource);
        Ok(())
    }
}

/// How deep kustomizations may include one another.
const MAX_DEPTH: usize = 64;

/// One build: the snapshot and the kustomizations being built (for cycles).
struct Build<'s> {
    snapshot: &'s FleetSnapshot,
    stack: Vec<String>,
}

/// Builds the kustomization in folder `dir` (its file is `file`) and returns its
/// resources, each with the file and line it came from.
pub fn build(
    snapshot: &FleetSnapshot,
    dir: &str,
    file: &str,
) -> Result<Vec<SourcedDocument>, Vec<Diagnostic>> {
    let mut build = Build {
        snapshot,
        stack: Vec::new(),
    };
    let into_diagnostics = |errors: Vec<Error>| -> Vec<Diagnostic> {
        errors.into_iter().map(Error::into_diagnostic).collect()
    };
    let kustomization = file::load(snapshot, dir, file).map_err(into_diagnostics)?;
    if kustomization.is_component {
        return Err(vec![
            kustomization
                .error(
                    kustomization.key_line("kind"),
                    "a workload's kustomization must be a Kustomization; a Component is listed under `components:` of one",
                )
                .into_diagnostic(),
        ]);
    }
    let accumulated = build
        .accumulate(&kustomization, Accumulator::default())
        .map_err(|err| into_diagnostics(vec![err]))?;
    let mut resources = accumulated.resources;
    generate::add_hashes(&mut resources);
    nameref::fix(&mut resources).map_err(|err| into_diagnostics(vec![err.at(&kustomization)]))?;
    Ok(resources
        .into_iter()
        .filter(|r| {
            r.value
                .pointer("/metadata/annotations/config.kubernetes.io~1local-config")
                .and_then(Value::as_str)
                != Some("true")
        })
        .map(|r| SourcedDocument {
            value: r.value,
            file: r.file,
            line: r.line,
        })
        .collect())
}

/// An error that belongs to the top kustomization as a whole (updating references
/// after every rename). It is shown at the first field of the top kustomization
/// that renames objects.
struct TopError(String);

impl TopError {
    fn at(self, kustomization: &Kustomization) -> Error {
        let line = [
            "namePrefix",
            "nameSuffix",
            "namespace",
            "configMapGenerator",
            "secretGenerator",
            "resources",
        ]
        .iter()
        .find_map(|key| kustomization.key_line(key));
        kustomization.error(line, self.0)
    }
}

impl Build<'_> {
    /// kustomize's `accumulateTarget`: resources, generators, components, then
    /// transformers, onto `accumulator`.
    fn accumulate(
        &mut self,
        kustomization: &Kustomization,
        mut accumulator: Accumulator,
    ) -> Result<Accumulator, Error> {
        self.stack.push(kustomization.dir.clone());
        let result = self.accumulate_inner(kustomization, &mut accumulator);
        self.stack.pop();
        result.map(|()| accumulator)
    }

    fn accumulate_inner(
        &mut self,
        kustomization: &Kustomization,
        accumulator: &mut Accumulator,
    ) -> Result<(), Error> {
        let doc = &kustomization.doc;
        for entry in doc.resources.iter().chain(&doc.bases) {
            self.add_resource(kustomization, entry, accumulator)?;
        }
        let snapshot = self.snapshot;
        generate::run(snapshot, kustomization, accumulator, &mut |line, dir| {
            self.build_configurations(kustomization, line, dir)
        })?;
        for entry in &doc.components {
            let line = Some(entry.referenced.line());
            let dir = self.local_path(kustomization, line, &entry.value)?;
            let component = self.sub_kustomization(kustomization, line, &dir)?;
            if !component.is_component {
                return Err(kustomization.error(
                    line,
                    format!(
                        "{} is a Kustomization; `components:` lists folders whose kustomization has kind Component",
                        entry.value
                    ),
                ));
            }
            let taken = std::mem::take(accumulator);
            *accumulator = self.accumulate(&component, taken)?;
        }
        transform::run(snapshot, kustomization, accumulator, &mut |line, dir| {
            self.build_configurations(kustomization, line, dir)
        })
    }

    /// The documents a folder listed under `transformers:` or `generators:` builds
    /// (its kustomization's output): the configurations, as kustomize reads them.
    fn build_configurations(
        &mut self,
        kustomization: &Kustomization,
        line: u64,
        dir: &str,
    ) -> Result<Vec<Value>, Error> {
        let sub = self.sub_kustomization(kustomization, Some(line), dir)?;
        if sub.is_component {
            return Err(kustomization.error(
                Some(line),
                format!("{dir} is a Component; a folder of configurations holds a Kustomization"),
            ));
        }
        let built = self.accumulate(&sub, Accumulator::default())?;
        Ok(built.resources.into_iter().map(|r| r.value).collect())
    }

    /// A path of this kustomization that is local (not a URL), resolved.
    fn local_path(
        &self,
        kustomization: &Kustomization,
        line: Option<u64>,
        path: &str,
    ) -> Result<String, Error> {
        if file::is_remote(path) {
            return Err(kustomization.error(
                line,
                format!(
                    "{path:?} is a remote resource; flotilla never fetches: vendor it into the fleet repository and refer to it by a relative path"
                ),
            ));
        }
        kustomization.resolve(line, path)
    }

    fn sub_kustomization(
        &self,
        kustomization: &Kustomization,
        line: Option<u64>,
        dir: &str,
    ) -> Result<Kustomization, Error> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(kustomization.error(
                line,
                format!(
                    "kustomizations nest more than {MAX_DEPTH} deep here; flotilla stops there"
                ),
            ));
        }
        if self.stack.iter().any(|d| d == dir) {
            let mut cycle = self.stack.clone();
            cycle.push(dir.to_string());
            return Err(kustomization.error(
                line,
                format!(
                    "kustomizations include each other in a cycle: {}",
                    cycle.join(" -> ")
                ),
            ));
        }
        let found = file::find_in(self.snapshot, dir).map_err(|m| kustomization.error(line, m))?;
        let Some(path) = found else {
            return Err(kustomization.error(
                line,
                if file::is_dir(self.snapshot, dir) {
                    format!("{dir} is a folder without a kustomization file (kustomization.yaml)")
                } else {
                    format!("{dir} does not exist in the fleet")
                },
            ));
        };
        file::load(self.snapshot, dir, &path).map_err(|mut errors| {
            // The first problem of the included file is the one to fix first.
            let first = errors.remove(0);
            Error {
                message: format!(
                    "{} (included from {}:{})",
                    first.message,
                    kustomization.file,
                    line.unwrap_or(0)
                ),
                ..first
            }
        })
    }

    fn add_resource(
        &mut self,
        kustomization: &Kustomization,
        entry: &flotilla_core::model::Located<String>,
        accumulator: &mut Accumulator,
    ) -> Result<(), Error> {
        let line = Some(entry.referenced.line());
        let at = kustomization.error(line, String::new());
        let path = self.local_path(kustomization, line, &entry.value)?;
        if let Some(text) = self.snapshot.files.get(&path) {
            for resource in read_resources(&path, text).map_err(|message| {
                kustomization.error(line, format!("resource {}: {message}", entry.value))
            })? {
                accumulator.append(resource, &at)?;
            }
            return Ok(());
        }
        if let Some(reason) = self.snapshot.skipped.get(&path) {
            return Err(kustomization.error(
                line,
                format!("resource {} cannot be used: {reason}", entry.value),
            ));
        }
        let sub = self.sub_kustomization(kustomization, line, &path)?;
        if sub.is_component {
            return Err(kustomization.error(
                line,
                format!(
                    "{} is a Component; list it under `components:`, not `resources:`",
                    entry.value
                ),
            ));
        }
        let built = self.accumulate(&sub, Accumulator::default())?;
        for resource in built.resources {
            accumulator.append(resource, &at)?;
        }
        Ok(())
    }
}

/// The resources of one manifest file: every document, with `...List` kinds that
/// carry `items` expanded into their items.
fn read_resources(path: &str, text: &str) -> Result<Vec<Resource>, String> {
    let documents = yaml::parse_documents(text).map_err(|err| match err.line {
        Some(line) => format!("line {line}: {}", err.message),
        None => err.message,
    })?;
    let file: Arc<str> = Arc::from(path);
    let mut resources = Vec::new();
    for document in documents {
        let value = document.value;
        if !value.is_object() {
            return Err(format!(
                "line {}: a resource must be a YAML mapping (a Kubernetes object)",
                document.line
            ));
        }
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("List")
            && let Some(items) = value.get("items")
        {
            match items {
                Value::Array(items) => {
                    for item in items {
                        resources.push(Resource::new(item.clone(), file.clone(), document.line));
                    }
                }
                Value::Null => {}
                _ => {
                    return Err(format!(
                        "line {}: the items of a {kind} must be a list",
                        document.line
                    ));
                }
            }
            continue;
        }
        resources.push(Resource::new(value, file.clone(), document.line));
    }
    Ok(resources)
}
