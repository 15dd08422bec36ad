//! kustomize's builtin transformers and generators configured in YAML: the entries of
//! a kustomization's `transformers:` and `generators:`, each a file name or an inline
//! YAML document with `apiVersion: builtin`, a kind such as `LabelTransformer`, a
//! `metadata.name`, and the kind's own fields (most with `fieldSpecs`). They run no
//! program: each is read here into a value that the transformers and generators
//! flotilla builds for the kustomization's own fields carry out, with the field
//! specs the configuration gives (kustomize adds no default ones to a configuration).
//!
//! Real plugins are refused, saying which kind: a document with another
//! `apiVersion` is an exec or Go plugin that kustomize would find in its plugin
//! folder and run, and one annotated `config.kubernetes.io/function` is a KRM
//! function (a container, an executable or a Starlark script).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Error;
use super::fieldspec::FieldSpec;
use super::file::{
    self, FieldSpecDoc, GeneratorDoc, ImageDoc, Kustomization, PatchDoc, ReplicaDoc, SelectorDoc,
};
use crate::yaml;
use flotilla_core::model::Located;
use flotilla_core::snapshot::FleetSnapshot;

/// A builtin transformer's configuration.
#[derive(Debug)]
pub enum Transformer {
    /// `LabelTransformer`.
    Labels {
        labels: BTreeMap<String, String>,
        specs: Vec<FieldSpec>,
    },
    /// `AnnotationsTransformer`.
    Annotations {
        annotations: BTreeMap<String, String>,
        specs: Vec<FieldSpec>,
    },
    /// `PrefixSuffixTransformer`, `PrefixTransformer`, `SuffixTransformer`.
    PrefixSuffix {
        prefix: String,
        suffix: String,
        specs: Vec<FieldSpec>,
    },
    /// `ImageTagTransformer`.
    ImageTag {
        image: ImageDoc,
        specs: Vec<FieldSpec>,
    },
    /// `NamespaceTransformer`: the namespace is its `metadata.namespace`.
    Namespace {
        namespace: String,
        rule: NamespaceRule,
    },
    /// `PatchTransformer`: a `patches` entry.
    Patch(PatchDoc),
    /// `PatchStrategicMergeTransformer`: `patchesStrategicMerge` entries (`paths`)
    /// and inline patches (`patches`).
    StrategicMerge {
        paths: Vec<String>,
        patches: Option<String>,
    },
    /// `PatchJson6902Transformer`: a `patchesJson6902` entry.
    Json6902(PatchDoc),
    /// `ReplicaCountTransformer`.
    Replicas {
        replica: ReplicaDoc,
        specs: Vec<FieldSpec>,
    },
}

/// How the namespace transformer treats what it finds.
#[derive(Debug, Clone)]
pub struct NamespaceRule {
    /// Fields besides `metadata.namespace` that take the namespace.
    pub specs: Vec<FieldSpec>,
    /// Set only namespaces that are missing or empty.
    pub unset_only: bool,
    pub subjects: Subjects,
}

/// Which RoleBinding and ClusterRoleBinding subjects get the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subjects {
    /// Subjects named `default` (kustomize's `defaultOnly`, its default).
    DefaultOnly,
    /// Every subject of kind ServiceAccount.
    AllServiceAccounts,
    None,
}

/// A builtin generator's configuration: a `configMapGenerator` or `secretGenerator`
/// entry (the generator kustomization's `generatorOptions` do not apply to).
#[derive(Debug)]
pub enum Generator {
    ConfigMap(GeneratorDoc),
    Secret(GeneratorDoc),
}

/// One configuration and where it was given.
#[derive(Debug)]
pub struct Config<T> {
    pub value: T,
    /// The kustomization's line that lists it.
    pub line: u64,
    /// For messages: `transformers: labels.yaml (LabelTransformer labels)`.
    pub label: String,
    /// The hash keys of the SOPS files it may hold decrypted values of (see
    /// [`Kustomization::sops_keys`]; every SOPS file's for one a folder built).
    pub hash_keys: Vec<[u8; 32]>,
}

/// Which list an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Transformers,
    Generators,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Transformers => "transformers",
            Field::Generators => "generators",
        }
    }
}

/// The kinds flotilla builds, by list.
const TRANSFORMER_KINDS: &[&str] = &[
    "AnnotationsTransformer",
    "ImageTagTransformer",
    "LabelTransformer",
    "NamespaceTransformer",
    "PatchJson6902Transformer",
    "PatchStrategicMergeTransformer",
    "PatchTransformer",
    "PrefixSuffixTransformer",
    "PrefixTransformer",
    "ReplicaCountTransformer",
    "SuffixTransformer",
];
const GENERATOR_KINDS: &[&str] = &["ConfigMapGenerator", "SecretGenerator"];
/// kustomize's other builtin kinds, which flotilla does not build.
const OTHER_BUILTIN_KINDS: &[&str] = &[
    "HashTransformer",
    "HelmChartInflationGenerator",
    "IAMPolicyGenerator",
    "ReplacementTransformer",
    "SortOrderTransformer",
    "ValueAddTransformer",
];

/// The annotations that make a document a KRM function.
const FUNCTION_ANNOTATIONS: &[&str] = &["config.kubernetes.io/function", "config.k8s.io/function"];

/// Builds a folder listed as an entry (its kustomization, at the given line of the
/// listing one) and returns its output: the configurations it holds.
pub type BuildFolder<'a> = &'a mut dyn FnMut(u64, &str) -> Result<Vec<Value>, Error>;

/// The transformer configurations of a kustomization, in the order it lists them.
pub fn transformers(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    build_folder: BuildFolder,
) -> Result<Vec<Config<Transformer>>, Error> {
    read(
        snapshot,
        kustomization,
        &kustomization.doc.transformers,
        Field::Transformers,
        transformer,
        build_folder,
    )
}

/// The generator configurations of a kustomization, in the order it lists them.
pub fn generators(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    build_folder: BuildFolder,
) -> Result<Vec<Config<Generator>>, Error> {
    read(
        snapshot,
        kustomization,
        &kustomization.doc.generators,
        Field::Generators,
        generator,
        build_folder,
    )
}

/// A document of an entry: where it is, for messages, and its value.
struct Document {
    source: String,
    value: Value,
}

fn read<T>(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    entries: &[Located<String>],
    field: Field,
    build: fn(&str, Value) -> Result<T, String>,
    build_folder: BuildFolder,
) -> Result<Vec<Config<T>>, Error> {
    let mut configs = Vec::new();
    for entry in entries {
        let line = entry.referenced.line();
        let error = |message: String| {
            kustomization.error(Some(line), format!("{}: {message}", field.name()))
        };
        let (documents, hash_keys) =
            match documents(snapshot, kustomization, &entry.value).map_err(error)? {
                Entry::Documents(documents) => {
                    let path = (!entry.value.contains('\n'))
                        .then(|| file::resolve_path(&kustomization.dir, &entry.value).ok())
                        .flatten();
                    (
                        documents,
                        kustomization.sops_keys(snapshot, path.as_deref()),
                    )
                }
                // What a folder builds may come from any file its kustomization reads.
                Entry::Folder(dir) => (
                    build_folder(line, &dir)?
                        .into_iter()
                        .map(|value| Document {
                            source: entry.value.clone(),
                            value,
                        })
                        .collect(),
                    crate::seal::key_set(snapshot.hash_keys.values().copied()),
                ),
            };
        for document in documents {
            let (kind, name) = classify(&document, field).map_err(error)?;
            let label = format!("{}: {} ({kind} {name})", field.name(), document.source);
            let value = build(&kind, document.value).map_err(|message| {
                kustomization.error(Some(line), format!("{label}: {message}"))
            })?;
            configs.push(Config {
                value,
                line,
                label,
                hash_keys: hash_keys.clone(),
            });
        }
    }
    Ok(configs)
}

/// What an entry names.
enum Entry {
    Documents(Vec<Document>),
    /// A folder with a kustomization (resolved): its output are the configurations.
    Folder(String),
}

/// The documents of an entry: an inline YAML document (kustomize takes an entry
/// that reads as one), or the documents of the file it names; or the folder it
/// names.
fn documents(
    snapshot: &FleetSnapshot,
    kustomization: &Kustomization,
    entry: &str,
) -> Result<Entry, String> {
    let (text, source) = if entry.contains('\n') {
        (entry.to_string(), "the inline entry".to_string())
    } else {
        if file::is_remote(entry) {
            return Err(format!(
                "{entry:?} is remote; flotilla never fetches: vendor the configuration into the fleet repository and refer to it by a relative path"
            ));
        }
        let path = file::resolve_path(&kustomization.dir, entry)?;
        match snapshot.files.get(&path) {
            Some(text) => (text.to_string(), entry.to_string()),
            None => {
                if let Some(reason) = snapshot.skipped.get(&path) {
                    return Err(format!("{entry} cannot be used: {reason}"));
                }
                if file::find_in(snapshot, &path)?.is_some() {
                    return Ok(Entry::Folder(path));
                }
                if file::is_dir(snapshot, &path) {
                    return Err(format!(
                        "{entry} is a folder without a kustomization file (kustomization.yaml)"
                    ));
                }
                return Err(format!("{entry} does not exist in the fleet"));
            }
        }
    };
    let documents = yaml::parse_documents(&text).map_err(|err| match err.line {
        Some(at) => format!("{source}, line {at}: {}", err.message),
        None => format!("{source}: {}", err.message),
    })?;
    if documents.is_empty() {
        return Err(format!("{source} holds no configuration"));
    }
    let several = documents.len() > 1;
    Ok(Entry::Documents(
        documents
            .into_iter()
            .map(|document| Document {
                source: if several {
                    format!("{source}, line {}", document.line)
                } else {
                    source.clone()
                },
                value: document.value,
            })
            .collect(),
    ))
}

/// The kind and name of a builtin configuration; a real plugin, or a builtin kind
/// flotilla does not build, is refused with what it is.
fn classify(document: &Document, field: Field) -> Result<(String, String), String> {
    let source = &document.source;
    let value = &document.value;
    if !value.is_object() {
        return Err(format!(
            "{source}: a configuration must be a YAML mapping with apiVersion, kind and metadata.name"
        ));
    }
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind, name) = (text("/apiVersion"), text("/kind"), text("/metadata/name"));
    let what = format!(
        "{} {}",
        nonempty(kind, "(no kind)"),
        nonempty(name, "(no name)")
    );
    let never_runs = "flotilla never runs programs at render: run it in CI and commit its output, or express the change with builtin transformers or patches";
    let annotations = value.pointer("/metadata/annotations");
    for annotation in FUNCTION_ANNOTATIONS {
        if let Some(spec) = annotations.and_then(|a| a.get(*annotation)) {
            return Err(format!(
                "{source}: {what} is {} (annotation {annotation}), a program kustomize would run; {never_runs}",
                describe_function(spec)
            ));
        }
    }
    if api_version != "builtin" {
        return Err(format!(
            "{source}: {what} (apiVersion {}) is an exec or Go plugin, a program kustomize would look up in its plugin folder and run; {never_runs} (kustomize's own transformers and generators, `apiVersion: builtin`, are built)",
            nonempty(api_version, "missing"),
        ));
    }
    if name.is_empty() {
        return Err(format!(
            "{source}: the builtin {} needs a metadata.name",
            nonempty(kind, "configuration")
        ));
    }
    let (own, other, other_field) = match field {
        Field::Transformers => (TRANSFORMER_KINDS, GENERATOR_KINDS, Field::Generators),
        Field::Generators => (GENERATOR_KINDS, TRANSFORMER_KINDS, Field::Transformers),
    };
    if own.contains(&kind) {
        return Ok((kind.to_string(), name.to_string()));
    }
    if other.contains(&kind) {
        return Err(format!(
            "{source}: {kind} is not one of the {}; list it under `{}:`",
            field.name(),
            other_field.name()
        ));
    }
    if OTHER_BUILTIN_KINDS.contains(&kind) {
        return Err(format!(
            "{source}: the builtin {kind} is not built by flotilla; it builds {}",
            own.join(", ")
        ));
    }
    Err(format!(
        "{source}: kustomize has no builtin {}; the builtin {} are {}",
        nonempty(kind, "configuration without a kind"),
        field.name(),
        own.join(", ")
    ))
}

fn nonempty<'a>(text: &'a str, otherwise: &'a str) -> &'a str {
    if text.is_empty() { otherwise } else { text }
}

/// What a KRM function's annotation says it runs.
fn describe_function(spec: &Value) -> String {
    let spec = match spec {
        Value::String(text) => yaml::parse_documents(text)
            .ok()
            .and_then(|documents| documents.into_iter().next())
            .map(|d| d.value)
            .unwrap_or(Value::Null),
        other => other.clone(),
    };
    let at = |pointer: &str| spec.pointer(pointer).and_then(Value::as_str);
    if spec.get("container").is_some() {
        match at("/container/image") {
            Some(image) => format!("a containerised KRM function (image {image})"),
            None => "a containerised KRM function".to_string(),
        }
    } else if spec.get("exec").is_some() {
        match at("/exec/path") {
            Some(path) => format!("an exec KRM function (program {path})"),
            None => "an exec KRM function".to_string(),
        }
    } else if spec.get("starlark").is_some() {
        "a Starlark KRM function".to_string()
    } else {
        "a KRM function".to_string()
    }
}

/// The fields of a configuration besides apiVersion, kind and metadata, read as
/// `T` (unknown fields are refused: kustomize would ignore a misspelt one).
fn fields<T: DeserializeOwned>(mut value: Value) -> Result<T, String> {
    if let Some(map) = value.as_object_mut() {
        for key in ["apiVersion", "kind", "metadata"] {
            map.remove(key);
        }
    }
    serde_json::from_value(value).map_err(|err| err.to_string())
}

fn specs_of(docs: &[FieldSpecDoc]) -> Vec<FieldSpec> {
    docs.iter().map(FieldSpec::from_doc).collect()
}

/// A configuration whose `fieldSpecs` kustomize requires.
fn required_specs(docs: Option<Vec<FieldSpecDoc>>) -> Result<Vec<FieldSpec>, String> {
    match docs {
        Some(docs) => Ok(specs_of(&docs)),
        None => {
            Err("fieldSpecs is required (kustomize refuses this configuration without it)".into())
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LabelsConfig {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    field_specs: Vec<FieldSpecDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AnnotationsConfig {
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    field_specs: Vec<FieldSpecDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrefixSuffixConfig {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    suffix: String,
    #[serde(default)]
    field_specs: Option<Vec<FieldSpecDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrefixConfig {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    field_specs: Option<Vec<FieldSpecDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SuffixConfig {
    #[serde(default)]
    suffix: String,
    #[serde(default)]
    field_specs: Option<Vec<FieldSpecDoc>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImageTagConfig {
    image_tag: ImageDoc,
    #[serde(default)]
    field_specs: Vec<FieldSpecDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NamespaceConfig {
    #[serde(default)]
    field_specs: Vec<FieldSpecDoc>,
    #[serde(default)]
    unset_only: bool,
    #[serde(default)]
    set_role_binding_subjects: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StrategicMergeConfig {
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    patches: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Json6902Config {
    #[serde(default)]
    target: Option<SelectorDoc>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    json_op: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReplicaCountConfig {
    replica: ReplicaDoc,
    #[serde(default)]
    field_specs: Vec<FieldSpecDoc>,
}

fn transformer(kind: &str, value: Value) -> Result<Transformer, String> {
    let namespace = value
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Ok(match kind {
        "LabelTransformer" => {
            let config: LabelsConfig = fields(value)?;
            Transformer::Labels {
                labels: config.labels,
                specs: specs_of(&config.field_specs),
            }
        }
        "AnnotationsTransformer" => {
            let config: AnnotationsConfig = fields(value)?;
            Transformer::Annotations {
                annotations: config.annotations,
                specs: specs_of(&config.field_specs),
            }
        }
        "PrefixSuffixTransformer" => {
            let config: PrefixSuffixConfig = fields(value)?;
            Transformer::PrefixSuffix {
                prefix: config.prefix,
                suffix: config.suffix,
                specs: required_specs(config.field_specs)?,
            }
        }
        "PrefixTransformer" => {
            let config: PrefixConfig = fields(value)?;
            Transformer::PrefixSuffix {
                prefix: config.prefix,
                suffix: String::new(),
                specs: required_specs(config.field_specs)?,
            }
        }
        "SuffixTransformer" => {
            let config: SuffixConfig = fields(value)?;
            Transformer::PrefixSuffix {
                prefix: String::new(),
                suffix: config.suffix,
                specs: required_specs(config.field_specs)?,
            }
        }
        "ImageTagTransformer" => {
            let config: ImageTagConfig = fields(value)?;
            Transformer::ImageTag {
                image: config.image_tag,
                specs: specs_of(&config.field_specs),
            }
        }
        "NamespaceTransformer" => {
            let config: NamespaceConfig = fields(value)?;
            let subjects = match config.set_role_binding_subjects.as_deref() {
                None | Some("") | Some("defaultOnly") => Subjects::DefaultOnly,
                Some("allServiceAccounts") => Subjects::AllServiceAccounts,
                Some("none") => Subjects::None,
                Some(other) => {
                    return Err(format!(
                        "setRoleBindingSubjects {other:?} is none of defaultOnly, allServiceAccounts or none"
                    ));
                }
            };
            Transformer::Namespace {
                namespace,
                rule: NamespaceRule {
                    specs: specs_of(&config.field_specs),
                    unset_only: config.unset_only,
                    subjects,
                },
            }
        }
        "PatchTransformer" => Transformer::Patch(fields(value)?),
        "PatchStrategicMergeTransformer" => {
            let config: StrategicMergeConfig = fields(value)?;
            if config.paths.is_empty() && config.patches.as_deref().is_none_or(str::is_empty) {
                return Err("give `paths:` (files) or `patches:` (inline)".into());
            }
            Transformer::StrategicMerge {
                paths: config.paths,
                patches: config.patches,
            }
        }
        "PatchJson6902Transformer" => {
            let config: Json6902Config = fields(value)?;
            Transformer::Json6902(PatchDoc {
                path: config.path,
                patch: config.json_op,
                target: config.target,
                options: BTreeMap::new(),
            })
        }
        "ReplicaCountTransformer" => {
            let config: ReplicaCountConfig = fields(value)?;
            Transformer::Replicas {
                replica: config.replica,
                specs: specs_of(&config.field_specs),
            }
        }
        other => return Err(format!("{other} is not a builtin transformer")),
    })
}

fn generator(kind: &str, value: Value) -> Result<Generator, String> {
    let metadata = |field: &str| {
        value
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .map(String::from)
    };
    let (name, namespace) = (metadata("name"), metadata("namespace"));
    let mut doc: GeneratorDoc = fields(value)?;
    // As in kustomize, a name or namespace among the generator's fields wins over
    // the configuration's metadata.
    if doc.name.as_deref().is_none_or(str::is_empty) {
        doc.name = name;
    }
    if doc.namespace.as_deref().is_none_or(str::is_empty) {
        doc.namespace = namespace;
    }
    Ok(match kind {
        "ConfigMapGenerator" => {
            if doc.secret_type.is_some() {
                return Err(
                    "`type` is a field of SecretGenerator, not of ConfigMapGenerator".into(),
                );
            }
            Generator::ConfigMap(doc)
        }
        "SecretGenerator" => Generator::Secret(doc),
        other => return Err(format!("{other} is not a builtin generator")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn document(value: Value) -> Document {
        Document {
            source: "t.yaml".into(),
            value,
        }
    }

    #[test]
    fn real_plugins_are_refused_by_what_they_are() {
        let exec = document(json!({
            "apiVersion": "someteam.example.com/v1",
            "kind": "SedTransformer",
            "metadata": {"name": "sed"},
        }));
        let message = classify(&exec, Field::Transformers).expect_err("refused");
        assert!(message.contains("exec or Go plugin"), "{message}");
        assert!(message.contains("never runs programs"), "{message}");
        let function = document(json!({
            "apiVersion": "builtin",
            "kind": "LabelTransformer",
            "metadata": {"name": "fn", "annotations": {
                "config.kubernetes.io/function": "container:\n  image: example.com/fn:v1\n"
            }},
        }));
        let message = classify(&function, Field::Transformers).expect_err("refused");
        assert!(
            message.contains("containerised KRM function (image example.com/fn:v1)"),
            "{message}"
        );
        let builtin = document(json!({
            "apiVersion": "builtin",
            "kind": "LabelTransformer",
            "metadata": {"name": "labels"},
        }));
        assert_eq!(
            classify(&builtin, Field::Transformers),
            Ok(("LabelTransformer".into(), "labels".into()))
        );
        let message = classify(&builtin, Field::Generators).expect_err("refused");
        assert!(
            message.contains("list it under `transformers:`"),
            "{message}"
        );
    }

    #[test]
    fn a_generator_takes_its_name_from_metadata() {
        let generated = generator(
            "ConfigMapGenerator",
            json!({"apiVersion": "builtin", "kind": "ConfigMapGenerator",
                   "metadata": {"name": "settings", "namespace": "shop"}, "literals": ["a=b"]}),
        )
        .expect("reads");
        let Generator::ConfigMap(doc) = generated else {
            panic!("a ConfigMap generator");
        };
        assert_eq!(doc.name.as_deref(), Some("settings"));
        assert_eq!(doc.namespace.as_deref(), Some("shop"));
        assert_eq!(doc.literals, ["a=b"]);
    }
}
