//! A kustomization's transformers, in kustomize's order: `patchesStrategicMerge`,
//! `patches`, `namespace`, `namePrefix`, `nameSuffix`, `labels` and `commonLabels`,
//! `commonAnnotations`, `patchesJson6902`, `replicas`, `images`, then the builtin
//! transformers configured under `transformers:` (see [`super::builtin`]), each by
//! the same code with its own field specs.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::builtin::{self, Config, NamespaceRule, Subjects, Transformer};
use super::fieldspec::{self, Create, FieldSpec};
use super::file::{ImageDoc, Kustomization, PatchDoc, ReplicaDoc, SelectorDoc};
use super::{Accumulator, Error, Resource, group_version};
use crate::{patch, strategic, yaml};
use flotilla_core::model::{LabelSelector, parse_selector};
use flotilla_core::snapshot::FleetSnapshot;

pub fn run(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    accumulator: &mut Accumulator,
    build_folder: builtin::BuildFolder,
) -> Result<(), Error> {
    let doc = &kustomization.doc;
    // Read first, so that a refused plugin is reported before any other problem.
    let builtins = builtin::transformers(snapshot, kustomization, build_folder)?;
    for entry in &doc.patches_strategic_merge {
        let line = Some(entry.referenced.line());
        apply_strategic_merge_entry(
            snapshot,
            kustomization,
            line,
            &entry.value,
            "patchesStrategicMerge entry",
            accumulator,
        )?;
    }
    // Each entry of `patches` (or, with `json_only`, of `patchesJson6902`).
    let patch_entries = |entries: &[flotilla_core::model::Located<PatchDoc>],
                         field: &str,
                         json_only: bool,
                         accumulator: &mut Accumulator|
     -> Result<(), Error> {
        for entry in entries {
            let line = Some(entry.referenced.line());
            let keys = patch_keys(snapshot, kustomization, &entry.value);
            tainting(accumulator, &keys, |accumulator| {
                apply_patch_entry(
                    snapshot,
                    kustomization,
                    line,
                    &entry.value,
                    field,
                    json_only,
                    accumulator,
                )
            })?;
        }
        Ok(())
    };
    patch_entries(&doc.patches, "patches", false, accumulator)?;
    if let Some(namespace) = doc.namespace.as_deref().filter(|n| !n.is_empty()) {
        set_namespace(
            namespace,
            &NamespaceRule::kustomization_field(),
            accumulator,
        );
    }
    if let Some(prefix) = doc.name_prefix.as_deref().filter(|p| !p.is_empty()) {
        rename(accumulator, |resource| {
            resource.prefixes.push(prefix.to_string());
            format!("{prefix}{}", resource.name())
        });
    }
    if let Some(suffix) = doc.name_suffix.as_deref().filter(|s| !s.is_empty()) {
        rename(accumulator, |resource| {
            resource.suffixes.push(suffix.to_string());
            format!("{}{suffix}", resource.name())
        });
    }
    for entry in &doc.labels {
        let label = &entry.value;
        let mut specs: Vec<FieldSpec> = label.fields.iter().map(FieldSpec::from_doc).collect();
        if label.include_selectors {
            fieldspec::merge_all(&mut specs, &fieldspec::common_labels());
        } else {
            if label.include_templates {
                fieldspec::merge_all(&mut specs, &fieldspec::metadata_labels());
            }
            fieldspec::merge_all(
                &mut specs,
                &[FieldSpec::new("metadata/labels", None, None, None, true)],
            );
        }
        set_entries(&label.pairs, &specs, accumulator).map_err(|message| {
            kustomization.error(Some(entry.referenced.line()), format!("labels: {message}"))
        })?;
    }
    if !doc.common_labels.is_empty() {
        set_entries(&doc.common_labels, &fieldspec::common_labels(), accumulator).map_err(
            |message| {
                kustomization.error(
                    kustomization.key_line("commonLabels"),
                    format!("commonLabels: {message}"),
                )
            },
        )?;
    }
    if !doc.common_annotations.is_empty() {
        set_entries(
            &doc.common_annotations,
            &fieldspec::common_annotations(),
            accumulator,
        )
        .map_err(|message| {
            kustomization.error(
                kustomization.key_line("commonAnnotations"),
                format!("commonAnnotations: {message}"),
            )
        })?;
    }
    patch_entries(&doc.patches_json6902, "patchesJson6902", true, accumulator)?;
    for entry in &doc.replicas {
        let line = Some(entry.referenced.line());
        set_replicas(&entry.value, &fieldspec::replicas(), accumulator)
            .map_err(|message| kustomization.error(line, format!("replicas: {message}")))?;
    }
    for entry in doc.images.iter().chain(&doc.image_tags) {
        let line = Some(entry.referenced.line());
        let image = ImageRule::new(&entry.value).map_err(|m| kustomization.error(line, m))?;
        for resource in &mut accumulator.resources {
            image.apply(resource, &fieldspec::images());
        }
    }
    // kustomize runs the transformers configured under `transformers:` after those
    // of the kustomization's own fields, in the order they are listed.
    for config in &builtins {
        tainting(accumulator, &config.hash_keys, |accumulator| {
            run_builtin(snapshot, kustomization, config, accumulator)
        })?;
    }
    Ok(())
}

/// The hash keys of the SOPS files a patch entry's text comes from: its file, or
/// the kustomization for an inline patch (see [`Kustomization::sops_keys`]).
fn patch_keys(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    doc: &PatchDoc,
) -> Vec<[u8; 32]> {
    let path = doc
        .path
        .as_deref()
        .and_then(|path| kustomization.resolve(None, path).ok());
    kustomization.sops_keys(snapshot, path.as_deref())
}

/// Runs `apply` (a patch whose text holds decrypted values of the SOPS files with
/// hash keys `keys`), then adds those keys to each generated object it changed:
/// the object's name suffix is a hash of its data, which the patch may have set
/// to a decrypted value (docs/secrets.md, "Hashes over decrypted values are
/// keyed"). When the patch removed an object, every generated one counts as
/// changed.
fn tainting(
    accumulator: &mut Accumulator,
    keys: &[[u8; 32]],
    apply: impl FnOnce(&mut Accumulator) -> Result<(), Error>,
) -> Result<(), Error> {
    if keys.is_empty() {
        return apply(accumulator);
    }
    let before: Vec<Option<Value>> = accumulator
        .resources
        .iter()
        .map(|r| r.needs_hash.then(|| r.value.clone()))
        .collect();
    apply(accumulator)?;
    let kept_all = accumulator.resources.len() == before.len();
    for (index, resource) in accumulator.resources.iter_mut().enumerate() {
        if resource.needs_hash && (!kept_all || before[index].as_ref() != Some(&resource.value)) {
            resource.hash_keys =
                crate::seal::key_set(resource.hash_keys.iter().chain(keys).copied());
        }
    }
    Ok(())
}

/// One builtin transformer configuration, carried out by the transformer of the
/// kustomization field it configures, with the configuration's field specs.
fn run_builtin(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    config: &Config<Transformer>,
    accumulator: &mut Accumulator,
) -> Result<(), Error> {
    let line = Some(config.line);
    let label = config.label.as_str();
    let error = |message: String| kustomization.error(line, format!("{label}: {message}"));
    match &config.value {
        Transformer::Labels { labels, specs } => {
            set_entries(labels, specs, accumulator).map_err(error)
        }
        Transformer::Annotations { annotations, specs } => {
            set_entries(annotations, specs, accumulator).map_err(error)
        }
        Transformer::PrefixSuffix {
            prefix,
            suffix,
            specs,
        } => add_prefix_suffix(prefix, suffix, specs, accumulator).map_err(error),
        Transformer::ImageTag { image, specs } => {
            let image = ImageRule::new(image).map_err(error)?;
            for resource in &mut accumulator.resources {
                image.apply(resource, specs);
            }
            Ok(())
        }
        Transformer::Namespace { namespace, rule } => {
            if !namespace.is_empty() {
                set_namespace(namespace, rule, accumulator);
            }
            Ok(())
        }
        // The patch may be read from a file of its own (`path:`).
        Transformer::Patch(patch) | Transformer::Json6902(patch) => {
            let json_only = matches!(config.value, Transformer::Json6902(_));
            let keys = patch_keys(snapshot, kustomization, patch);
            tainting(accumulator, &keys, |accumulator| {
                apply_patch_entry(
                    snapshot,
                    kustomization,
                    line,
                    patch,
                    label,
                    json_only,
                    accumulator,
                )
            })
        }
        Transformer::StrategicMerge { paths, patches } => {
            for path in paths {
                apply_strategic_merge_entry(
                    snapshot,
                    kustomization,
                    line,
                    path,
                    label,
                    accumulator,
                )?;
            }
            if let Some(patches) = patches.as_deref().filter(|p| !p.trim().is_empty()) {
                // Written in the configuration: tainted by its file (the caller).
                apply_strategic_merge_text(kustomization, line, patches, label, accumulator)?;
            }
            Ok(())
        }
        Transformer::Replicas { replica, specs } => {
            set_replicas(replica, specs, accumulator).map_err(error)
        }
    }
}

/// A `patchesStrategicMerge` entry: a file of patches, or the patches inline.
fn apply_strategic_merge_entry(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    line: Option<u64>,
    entry: &str,
    label: &str,
    accumulator: &mut Accumulator,
) -> Result<(), Error> {
    let path = kustomization
        .resolve(line, entry)
        .ok()
        .filter(|path| snapshot.files.contains_key(path));
    let text = match &path {
        Some(path) => snapshot.files[path].to_string(),
        None => entry.to_string(),
    };
    let keys = kustomization.sops_keys(snapshot, path.as_deref());
    tainting(accumulator, &keys, |accumulator| {
        apply_strategic_merge_text(kustomization, line, &text, label, accumulator)
    })
}

fn apply_strategic_merge_text(
    kustomization: &Kustomization,
    line: Option<u64>,
    text: &str,
    label: &str,
    accumulator: &mut Accumulator,
) -> Result<(), Error> {
    let patches = strategic_patches(text)
        .map_err(|message| kustomization.error(line, format!("{label}: {message}")))?;
    for patch in patches {
        apply_untargeted(kustomization, line, &patch, accumulator, &BTreeMap::new())?;
    }
    Ok(())
}

/// Sets `spec.replicas` (or the fields of `specs`) of the resources with the name.
fn set_replicas(
    replica: &ReplicaDoc,
    specs: &[FieldSpec],
    accumulator: &mut Accumulator,
) -> Result<(), String> {
    let mut found = false;
    for resource in &mut accumulator.resources {
        let (group, version) = group_version(resource.api_version());
        let (group, version) = (group.to_string(), version.to_string());
        let named = resource.all_ids().any(|id| id.name == replica.name);
        for spec in specs {
            let kind_matches = resource
                .all_ids()
                .any(|id| spec.selects(&group, &version, &id.kind));
            if !named || !kind_matches {
                continue;
            }
            found = true;
            fieldspec::visit(&mut resource.value, spec, Create::Scalar, &mut |field| {
                *field = Value::from(replica.count);
                Ok(())
            })?;
        }
    }
    if !found {
        let kinds: Vec<&str> = specs
            .iter()
            .map(|spec| spec.kind.as_deref().unwrap_or("resource"))
            .collect();
        let kinds = match kinds.as_slice() {
            [] => "resource (the configuration gives no fieldSpecs)".to_string(),
            [one] => (*one).to_string(),
            [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
        };
        return Err(format!("no {kinds} is named {:?}", replica.name));
    }
    Ok(())
}

/// A prefix and a suffix on the fields of `specs` (`metadata/name` renames, and is
/// remembered for references), for every resource but CRDs, APIServices and
/// Namespaces, selected by the kind it was read with.
fn add_prefix_suffix(
    prefix: &str,
    suffix: &str,
    specs: &[FieldSpec],
    accumulator: &mut Accumulator,
) -> Result<(), String> {
    for resource in &mut accumulator.resources {
        let original = resource.original_id();
        let (group, version) = group_version(resource.api_version());
        let (group, version) = (group.to_string(), version.to_string());
        if skips_renames(&original.kind, &group) {
            continue;
        }
        for spec in specs
            .iter()
            .filter(|s| s.selects(&group, &version, &original.kind))
        {
            if spec.path == "metadata/name" {
                if !prefix.is_empty() {
                    resource.prefixes.push(prefix.to_string());
                }
                if !suffix.is_empty() {
                    resource.suffixes.push(suffix.to_string());
                }
                if prefix.is_empty() && suffix.is_empty() {
                    continue;
                }
                let name = format!("{prefix}{}{suffix}", resource.name());
                resource.store_previous_id();
                resource.set_name(name);
                continue;
            }
            let description = resource.describe();
            fieldspec::visit(&mut resource.value, spec, Create::Nothing, &mut |field| {
                if let Value::String(text) = field {
                    *text = format!("{prefix}{text}{suffix}");
                }
                Ok(())
            })
            .map_err(|message| format!("{description}: {message}"))?;
        }
    }
    Ok(())
}

/// Parses a patch that must be strategic: one or more YAML maps.
fn strategic_patches(text: &str) -> Result<Vec<Value>, String> {
    let documents = yaml::parse_documents(text).map_err(|err| match err.line {
        Some(line) => format!("line {line} of the patch: {}", err.message),
        None => err.message,
    })?;
    if documents.is_empty() {
        return Err("the patch is empty".into());
    }
    documents
        .into_iter()
        .map(|d| match d.value {
            Value::Object(_) => Ok(d.value),
            other => Err(format!(
                "a strategic merge patch must be a YAML mapping, not {}",
                kind_of(&other)
            )),
        })
        .collect()
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Array(_) => "a list",
        Value::String(_) => "a string",
        Value::Object(_) => "a mapping",
        _ => "a single value",
    }
}

/// A `patches` (or, `json_only`, `patchesJson6902`) entry; `field` names it in
/// messages.
fn apply_patch_entry(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    line: Option<u64>,
    doc: &PatchDoc,
    field: &str,
    json_only: bool,
    accumulator: &mut Accumulator,
) -> Result<(), Error> {
    let error = |message: String| kustomization.error(line, message);
    let (text, source) = match (&doc.patch, &doc.path) {
        (Some(patch), None) if !patch.trim().is_empty() => {
            (patch.clone(), "the inline patch".to_string())
        }
        (None, Some(path)) => {
            let resolved = kustomization.resolve(line, path)?;
            match snapshot.files.get(&resolved) {
                Some(text) => (text.to_string(), format!("patch file {path}")),
                None => {
                    let why = snapshot.skipped.get(&resolved).map_or_else(
                        || "it does not exist in the fleet".to_string(),
                        Clone::clone,
                    );
                    return Err(error(format!(
                        "{field}: patch file {path} cannot be read: {why}"
                    )));
                }
            }
        }
        (Some(_), Some(_)) => {
            return Err(error(format!(
                "{field}: give the patch inline (`patch:`) or in a file (`path:`), not both"
            )));
        }
        _ => {
            return Err(error(format!(
                "{field}: give `patch:` (inline) or `path:` (a file)"
            )));
        }
    };
    // Parsed as written: trimming would cut the final newline of a `|` block scalar
    // that ends the file, which kustomize keeps.
    let documents = yaml::parse_documents(&text).map_err(|err| {
        error(match err.line {
            Some(at) => format!("{source}, line {at}: {}", err.message),
            None => format!("{source}: {}", err.message),
        })
    })?;
    let is_json = matches!(documents.as_slice(), [only] if only.value.is_array());
    if is_json {
        let Some(target) = &doc.target else {
            return Err(error(format!(
                "{field}: a JSON 6902 patch needs a `target` to say which resources it changes"
            )));
        };
        if json_only && target.name.as_deref().is_none_or(str::is_empty) {
            return Err(error(format!("{field}: the target needs a name")));
        }
        let ops = &documents[0].value;
        let selector = Selector::compile(target).map_err(&error)?;
        for resource in accumulator.resources.iter_mut() {
            if !selector.matches(resource) {
                continue;
            }
            let description = resource.describe();
            let origin = resource.origin();
            if !json_only {
                resource.store_previous_id();
            }
            patch::apply_json_patch(&mut resource.value, ops).map_err(|err| {
                error(format!("{source} on {description} (from {origin}): {err}"))
            })?;
        }
        return Ok(());
    }
    if json_only {
        return Err(error(format!(
            "{field}: the patch must be a list of RFC 6902 operations"
        )));
    }
    let patches = documents
        .into_iter()
        .map(|d| match d.value {
            Value::Object(_) => Ok(d.value),
            other => Err(error(format!(
                "{source}: a patch is a list of RFC 6902 operations or a strategic merge patch (a mapping), not {}",
                kind_of(&other)
            ))),
        })
        .collect::<Result<Vec<Value>, Error>>()?;
    match &doc.target {
        Some(target) => {
            if patches.len() > 1 {
                return Err(error(format!(
                    "{source} holds {} strategic merge patches; with a `target` give one",
                    patches.len()
                )));
            }
            let selector = Selector::compile(target).map_err(&error)?;
            let mut kept = Vec::with_capacity(accumulator.resources.len());
            for mut resource in std::mem::take(&mut accumulator.resources) {
                if selector.matches(&resource) {
                    let deleted = apply_strategic(&mut resource, &patches[0], &doc.options)
                        .map_err(|m| error(format!("{source}: {m}")))?;
                    if deleted {
                        continue;
                    }
                }
                kept.push(resource);
            }
            accumulator.resources = kept;
        }
        None => {
            for patch in &patches {
                apply_untargeted(kustomization, line, patch, accumulator, &doc.options)?;
            }
        }
    }
    Ok(())
}

/// A strategic merge patch without a target applies to the resource with the patch's
/// own identity (any identity the resource has had counts).
fn apply_untargeted(
    kustomization: &Kustomization,
    line: Option<u64>,
    patch: &Value,
    accumulator: &mut Accumulator,
    options: &BTreeMap<String, bool>,
) -> Result<(), Error> {
    let text = |pointer: &str| patch.pointer(pointer).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind, name, namespace) = (
        text("/apiVersion"),
        text("/kind"),
        text("/metadata/name"),
        text("/metadata/namespace"),
    );
    if kind.is_empty() || name.is_empty() {
        return Err(kustomization.error(
            line,
            "a strategic merge patch without a `target` must name its resource (apiVersion, kind and metadata.name)",
        ));
    }
    let (group, _) = group_version(api_version);
    let wanted_namespace = Resource::effective_namespace_of(group, kind, namespace);
    let matches: Vec<usize> = accumulator
        .resources
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.api_version() == api_version
                && r.all_ids().any(|id| {
                    id.kind == kind && id.name == name && id.namespace == wanted_namespace
                })
        })
        .map(|(index, _)| index)
        .collect();
    let id = if namespace.is_empty() {
        format!("{kind} {name} ({api_version})")
    } else {
        format!("{kind} {namespace}/{name} ({api_version})")
    };
    let index = match matches.as_slice() {
        [one] => *one,
        [] => {
            return Err(kustomization.error(
                line,
                format!("no resource matches the strategic merge patch for {id}"),
            ));
        }
        _ => {
            return Err(kustomization.error(
                line,
                format!("more than one resource matches the strategic merge patch for {id}"),
            ));
        }
    };
    let deleted = apply_strategic(&mut accumulator.resources[index], patch, options)
        .map_err(|message| kustomization.error(line, message))?;
    if deleted {
        accumulator.resources.remove(index);
    }
    Ok(())
}

/// Applies a strategic merge patch as kustomize does: with the resource's apiVersion,
/// keeping its kind, name and namespace unless the options allow a change. Returns
/// whether the patch deleted the resource.
fn apply_strategic(
    resource: &mut Resource,
    patch: &Value,
    options: &BTreeMap<String, bool>,
) -> Result<bool, String> {
    let allow_name = options.get("allowNameChange").copied().unwrap_or(false);
    let allow_kind = options.get("allowKindChange").copied().unwrap_or(false);
    let (kind, name, namespace) = (
        resource.kind().to_string(),
        resource.name().to_string(),
        resource.value.pointer("/metadata/namespace").cloned(),
    );
    if allow_name || allow_kind {
        resource.store_previous_id();
    }
    let mut patch = patch.clone();
    if let Some(map) = patch.as_object_mut() {
        map.insert(
            "apiVersion".into(),
            Value::String(resource.api_version().to_string()),
        );
    }
    let description = resource.describe();
    let origin = resource.origin();
    let outcome = strategic::apply(&mut resource.value, &patch)
        .map_err(|err| format!("strategic merge patch on {description} (from {origin}): {err}"))?;
    if outcome == strategic::Outcome::Deleted {
        return Ok(true);
    }
    if let Some(map) = resource.value.as_object_mut() {
        if !allow_kind {
            map.insert("kind".into(), Value::String(kind));
        }
        let metadata = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(metadata) = metadata.as_object_mut() {
            if !allow_name {
                metadata.insert("name".into(), Value::String(name));
            }
            match namespace {
                Some(namespace) => {
                    metadata.insert("namespace".into(), namespace);
                }
                None => {
                    metadata.remove("namespace");
                }
            }
        }
    }
    Ok(false)
}

/// A patch target: regular expressions over group, version, kind, name and
/// namespace (empty ones match anything), and label and annotation selectors.
pub struct Selector {
    group: Option<Regex>,
    version: Option<Regex>,
    kind: Option<Regex>,
    name: Option<Regex>,
    namespace: Option<Regex>,
    labels: Option<LabelSelector>,
    annotations: Option<LabelSelector>,
}

impl Selector {
    pub fn compile(doc: &SelectorDoc) -> Result<Selector, String> {
        let regex = |field: &str, pattern: &Option<String>| -> Result<Option<Regex>, String> {
            match pattern.as_deref() {
                None | Some("") => Ok(None),
                Some(pattern) => Regex::new(&format!("^(?:{pattern})$"))
                    .map(Some)
                    .map_err(|err| {
                        format!(
                            "target.{field}: invalid regular expression {pattern:?}: {}",
                            err.to_string()
                                .lines()
                                .last()
                                .unwrap_or_default()
                                .trim_start_matches("error: ")
                        )
                    }),
            }
        };
        let selector =
            |field: &str, text: &Option<String>| -> Result<Option<LabelSelector>, String> {
                match text.as_deref() {
                    None | Some("") => Ok(None),
                    Some(text) => parse_selector(text)
                        .map(Some)
                        .map_err(|err| format!("target.{field}: {err}")),
                }
            };
        Ok(Selector {
            group: regex("group", &doc.group)?,
            version: regex("version", &doc.version)?,
            kind: regex("kind", &doc.kind)?,
            name: regex("name", &doc.name)?,
            namespace: regex("namespace", &doc.namespace)?,
            labels: selector("labelSelector", &doc.label_selector)?,
            annotations: selector("annotationSelector", &doc.annotation_selector)?,
        })
    }

    /// kustomize's `Select`: namespace and name match the original or the current
    /// ones; group, version and kind the current ones.
    fn matches(&self, resource: &Resource) -> bool {
        let original = resource.original_id();
        let current = resource.current_id();
        let any = |regex: &Option<Regex>, a: &str, b: &str| {
            regex
                .as_ref()
                .is_none_or(|r| r.is_match(a) || r.is_match(b))
        };
        let one =
            |regex: &Option<Regex>, value: &str| regex.as_ref().is_none_or(|r| r.is_match(value));
        any(&self.namespace, &original.namespace, &current.namespace)
            && any(&self.name, &original.name, &current.name)
            && one(&self.group, resource.group())
            && one(&self.version, resource.version())
            && one(&self.kind, resource.kind())
            && self
                .labels
                .as_ref()
                .is_none_or(|s| s.matches(&resource.string_map("labels")))
            && self
                .annotations
                .as_ref()
                .is_none_or(|s| s.matches(&resource.string_map("annotations")))
    }
}

impl NamespaceRule {
    /// The kustomization's `namespace:` field: kustomize's default field specs (a v1
    /// Namespace's name, an APIService's service, a CRD's conversion webhook
    /// service) and the subjects named `default`.
    fn kustomization_field() -> NamespaceRule {
        NamespaceRule {
            specs: fieldspec::namespaces(),
            unset_only: false,
            subjects: Subjects::DefaultOnly,
        }
    }
}

/// kustomize's namespace transformer: every namespaced resource is moved into the
/// namespace (replacing the one it names unless `unset_only`), the fields of the
/// rule's specs follow (`metadata/name` only of `v1` kinds), and so do the binding
/// subjects the rule names.
fn set_namespace(namespace: &str, rule: &NamespaceRule, accumulator: &mut Accumulator) {
    let set = |field: &mut Value| {
        let unset = match field {
            Value::Null => true,
            Value::String(text) => text.is_empty(),
            _ => false,
        };
        if unset || !rule.unset_only {
            *field = Value::String(namespace.to_string());
        }
    };
    for resource in &mut accumulator.resources {
        resource.store_previous_id();
        let cluster_scoped = resource.cluster_scoped();
        let (group, version) = group_version(resource.api_version());
        let (group, version, kind, api_version) = (
            group.to_string(),
            version.to_string(),
            resource.kind().to_string(),
            resource.api_version().to_string(),
        );
        let Some(map) = resource.value.as_object_mut() else {
            continue;
        };
        if !cluster_scoped {
            let metadata = map
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(metadata) = metadata.as_object_mut() {
                set(metadata.entry("namespace").or_insert(Value::Null));
            }
        }
        let binding = kind == "RoleBinding" || kind == "ClusterRoleBinding";
        for spec in &rule.specs {
            let skipped = spec.path == "metadata/namespace"
                || (spec.path == "metadata/name" && api_version != "v1")
                || (binding && spec.path == "subjects");
            if skipped || !spec.selects(&group, &version, &kind) {
                continue;
            }
            // A field that is not a string where a namespace belongs is left as it is,
            // as kustomize leaves it.
            let _ = fieldspec::visit(&mut resource.value, spec, Create::Scalar, &mut |field| {
                set(field);
                Ok(())
            });
        }
        if binding
            && rule.subjects != Subjects::None
            && let Some(Value::Array(subjects)) = resource.value.get_mut("subjects")
        {
            for subject in subjects.iter_mut() {
                let text = |key: &str| subject.get(key).and_then(Value::as_str).map(String::from);
                let chosen = match rule.subjects {
                    Subjects::DefaultOnly => text("name").as_deref() == Some("default"),
                    Subjects::AllServiceAccounts => {
                        text("kind").as_deref() == Some("ServiceAccount")
                    }
                    Subjects::None => false,
                };
                if chosen && let Some(subject) = subject.as_object_mut() {
                    set(subject.entry("namespace").or_insert(Value::Null));
                }
            }
        }
    }
}

/// `namePrefix` and `nameSuffix`: every resource but CRDs, APIServices and
/// Namespaces (by the kind it was read with).
fn rename(accumulator: &mut Accumulator, new_name: impl Fn(&mut Resource) -> String) {
    for resource in &mut accumulator.resources {
        let original = resource.original_id();
        if skips_renames(&original.kind, resource.group()) {
            continue;
        }
        let name = new_name(resource);
        resource.store_previous_id();
        resource.set_name(name);
    }
}

/// Whether prefixes and suffixes leave a resource of this (original) kind alone.
fn skips_renames(kind: &str, group: &str) -> bool {
    kind == "CustomResourceDefinition"
        || kind == "Namespace"
        || (kind == "APIService" && group == "apiregistration.k8s.io")
}

/// Sets every `key: value` at every field of `specs` that applies to a resource.
fn set_entries(
    entries: &BTreeMap<String, String>,
    specs: &[FieldSpec],
    accumulator: &mut Accumulator,
) -> Result<(), String> {
    if entries.is_empty() {
        return Ok(());
    }
    for resource in &mut accumulator.resources {
        let (group, version) = group_version(resource.api_version());
        let (group, version, kind) = (
            group.to_string(),
            version.to_string(),
            resource.kind().to_string(),
        );
        let description = resource.describe();
        for spec in specs.iter().filter(|s| s.selects(&group, &version, &kind)) {
            fieldspec::visit(&mut resource.value, spec, Create::Map, &mut |field| {
                if field.is_null() {
                    *field = Value::Object(Map::new());
                }
                let Some(map) = field.as_object_mut() else {
                    return Err("expected a map".into());
                };
                for (key, value) in entries {
                    map.insert(key.clone(), Value::String(value.clone()));
                }
                Ok(())
            })
            .map_err(|message| format!("{description}: {message}"))?;
        }
    }
    Ok(())
}

/// An `images` entry: which images it matches and what it makes of them.
struct ImageRule {
    pattern: Regex,
    image: ImageDoc,
}

impl ImageRule {
    fn new(image: &ImageDoc) -> Result<ImageRule, String> {
        // kustomize uses the name as a regular expression, followed by an optional
        // tag and digest.
        let pattern = Regex::new(&format!(
            "^{}(:[a-zA-Z0-9_.{{}}-]*)?(@sha256:[a-zA-Z0-9_.{{}}-]*)?$",
            image.name
        ))
        .map_err(|err| {
            format!(
                "images: the name {:?} is not usable as kustomize uses it (a regular expression): {}",
                image.name,
                err.to_string().lines().last().unwrap_or_default()
                    .trim_start_matches("error: ")
            )
        })?;
        Ok(ImageRule {
            pattern,
            image: image.clone(),
        })
    }

    fn rewrite(&self, current: &str) -> Option<String> {
        if !self.pattern.is_match(current) {
            return None;
        }
        let (name, tag, digest) = split_image(current);
        let mut name = name.to_string();
        let mut tag = tag.to_string();
        let mut digest = digest.to_string();
        let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        if let Some(new_name) = nonempty(&self.image.new_name) {
            name = new_name;
        }
        match (
            nonempty(&self.image.new_tag),
            nonempty(&self.image.digest),
            nonempty(&self.image.tag_suffix),
        ) {
            (Some(new_tag), Some(new_digest), _) => {
                tag = new_tag;
                digest = new_digest;
            }
            (Some(new_tag), None, _) => {
                tag = new_tag;
                digest.clear();
            }
            (None, Some(new_digest), _) => {
                tag.clear();
                digest = new_digest;
            }
            (None, None, Some(suffix)) => {
                tag.push_str(&suffix);
                digest.clear();
            }
            (None, None, None) => {}
        }
        if !tag.is_empty() {
            name.push(':');
            name.push_str(&tag);
        }
        if !digest.is_empty() {
            name.push('@');
            name.push_str(&digest);
        }
        Some(name)
    }

    /// kustomize searches every `containers` and `initContainers` list of a resource
    /// (not of CRDs), then the fields of `specs` (the pod-spec paths for `images`).
    fn apply(&self, resource: &mut Resource, specs: &[FieldSpec]) {
        if resource.kind() == "CustomResourceDefinition" {
            return;
        }
        self.search(&mut resource.value);
        let (group, version) = group_version(resource.api_version());
        let (group, version, kind) = (
            group.to_string(),
            version.to_string(),
            resource.kind().to_string(),
        );
        for spec in specs.iter().filter(|s| s.selects(&group, &version, &kind)) {
            let _ = fieldspec::visit(&mut resource.value, spec, Create::Nothing, &mut |field| {
                if let Value::String(image) = field
                    && let Some(new) = self.rewrite(image)
                {
                    *image = new;
                }
                Ok(())
            });
        }
    }

    fn search(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    self.search(child);
                    if (key == "containers" || key == "initContainers")
                        && let Value::Array(containers) = child
                    {
                        for container in containers {
                            if let Some(Value::String(image)) = container.get_mut("image")
                                && let Some(new) = self.rewrite(image)
                            {
                                *image = new;
                            }
                        }
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.search(item);
                }
            }
            _ => {}
        }
    }
}

/// kustomize's split of an image into name, tag and digest: the tag and digest are
/// looked for after the first `/`.
fn split_image(image: &str) -> (&str, &str, &str) {
    let slash = match image.find('/') {
        Some(at) if at > 0 => at,
        _ => 0,
    };
    let search = &image[slash..];
    let at = search.find('@');
    let colon = search.find(':');
    match (at, colon) {
        (None, None) => (image, "", ""),
        (Some(at), colon) if colon.is_none_or(|c| at < c) => {
            (&image[..slash + at], "", &image[slash + at + 1..])
        }
        (Some(at), Some(colon)) => (
            &image[..slash + colon],
            &image[slash + colon + 1..slash + at],
            &image[slash + at + 1..],
        ),
        (None, Some(colon)) => (&image[..slash + colon], &image[slash + colon + 1..], ""),
        (Some(_), None) => (image, "", ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_split_as_kustomize_splits_them() {
        assert_eq!(split_image("nginx"), ("nginx", "", ""));
        assert_eq!(split_image("nginx:1.25"), ("nginx", "1.25", ""));
        assert_eq!(split_image("nginx@sha256:ab"), ("nginx", "", "sha256:ab"));
        assert_eq!(
            split_image("localhost:5000/a/b:v1@sha256:00"),
            ("localhost:5000/a/b", "v1", "sha256:00")
        );
        assert_eq!(
            split_image("localhost:5000/a/b"),
            ("localhost:5000/a/b", "", "")
        );
    }
}
