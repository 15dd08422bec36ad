//! A kustomization file as kustomize v5 reads it: the fields flotilla builds, the
//! fields it refuses (remote and plugin machinery), and paths resolved inside the
//! fleet root.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Error;
use crate::yaml;
use flotilla_core::model::Located;
use flotilla_core::snapshot::{FleetSnapshot, KUSTOMIZATION_FILE_NAMES};

/// `kustomization.yaml`, or a `Component`'s file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KustomizationDoc {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
    #[serde(default)]
    pub resources: Vec<Located<String>>,
    #[serde(default)]
    pub bases: Vec<Located<String>>,
    #[serde(default)]
    pub components: Vec<Located<String>>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name_prefix: Option<String>,
    #[serde(default)]
    pub name_suffix: Option<String>,
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: Vec<Located<LabelDoc>>,
    #[serde(default)]
    pub common_annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub images: Vec<Located<ImageDoc>>,
    #[serde(default)]
    pub image_tags: Vec<Located<ImageDoc>>,
    #[serde(default)]
    pub replicas: Vec<Located<ReplicaDoc>>,
    #[serde(default, deserialize_with = "patch_entries::<false, _>")]
    pub patches: Vec<Located<PatchDoc>>,
    #[serde(default)]
    pub patches_strategic_merge: Vec<Located<String>>,
    #[serde(default, deserialize_with = "patch_entries::<true, _>")]
    pub patches_json6902: Vec<Located<PatchDoc>>,
    #[serde(default)]
    pub config_map_generator: Vec<Located<GeneratorDoc>>,
    #[serde(default)]
    pub secret_generator: Vec<Located<GeneratorDoc>>,
    #[serde(default)]
    pub generator_options: Option<GeneratorOptions>,
    /// Only orders kustomize's output; a bundle has its own order.
    #[serde(default)]
    pub sort_options: Option<serde_json::Value>,
    /// Configurations of kustomize's builtin generators (`apiVersion: builtin`): file
    /// names or inline YAML documents. Real plugins are refused when read.
    #[serde(default)]
    pub generators: Vec<Located<String>>,
    /// Configurations of kustomize's builtin transformers, as for `generators`.
    #[serde(default)]
    pub transformers: Vec<Located<String>>,
    // Refused: each would run code, fetch, or change what kustomize knows about kinds.
    #[serde(default)]
    pub validators: Option<serde_json::Value>,
    #[serde(default)]
    pub configurations: Option<serde_json::Value>,
    #[serde(default)]
    pub crds: Option<serde_json::Value>,
    #[serde(default)]
    pub openapi: Option<serde_json::Value>,
    #[serde(default)]
    pub vars: Option<serde_json::Value>,
    #[serde(default)]
    pub replacements: Option<serde_json::Value>,
    #[serde(default)]
    pub helm_charts: Option<serde_json::Value>,
    #[serde(default)]
    pub helm_globals: Option<serde_json::Value>,
    #[serde(default)]
    pub helm_chart_inflation_generator: Option<serde_json::Value>,
    #[serde(default)]
    pub build_metadata: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LabelDoc {
    #[serde(default)]
    pub pairs: BTreeMap<String, String>,
    #[serde(default)]
    pub include_selectors: bool,
    #[serde(default)]
    pub include_templates: bool,
    #[serde(default)]
    pub fields: Vec<FieldSpecDoc>,
}

/// A field a transformer touches: a `/`-separated path (`[]` marks a list), on the
/// kinds given (all when empty), created when missing if `create`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FieldSpecDoc {
    pub path: String,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub create: bool,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageDoc {
    pub name: String,
    #[serde(default)]
    pub new_name: Option<String>,
    #[serde(default)]
    pub new_tag: Option<String>,
    #[serde(default)]
    pub digest: Option<String>,
    #[serde(default)]
    pub tag_suffix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicaDoc {
    pub name: String,
    pub count: i64,
}

/// A `patches` or `patchesJson6902` entry. kustomize reads only a mapping here; a
/// bare file name (`- patch.yaml`, as `patchesStrategicMerge` takes it) is refused
/// with the form kustomize expects instead of the parser's "expected a mapping".
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PatchDoc {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub patch: Option<String>,
    #[serde(default)]
    pub target: Option<SelectorDoc>,
    #[serde(default)]
    pub options: BTreeMap<String, bool>,
}

/// Deserializes the entries of `patches` (or, with `JSON6902`, `patchesJson6902`),
/// refusing a bare string entry with the mapping kustomize wants in its place.
fn patch_entries<'de, const JSON6902: bool, D>(
    deserializer: D,
) -> Result<Vec<Located<PatchDoc>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let entries: Vec<Located<PatchEntry<JSON6902>>> = Deserialize::deserialize(deserializer)?;
    Ok(entries
        .into_iter()
        .map(|entry| Located {
            value: entry.value.0,
            referenced: entry.referenced,
            defined: entry.defined,
        })
        .collect())
}

struct PatchEntry<const JSON6902: bool>(PatchDoc);

impl<'de, const JSON6902: bool> Deserialize<'de> for PatchEntry<JSON6902> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry<const JSON6902: bool>;
        impl<'de, const JSON6902: bool> serde::de::Visitor<'de> for Entry<JSON6902> {
            type Value = PatchEntry<JSON6902>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping with `path:` (a file) or `patch:` (inline)")
            }

            fn visit_str<E: serde::de::Error>(self, file: &str) -> Result<Self::Value, E> {
                Err(E::custom(if JSON6902 {
                    format!(
                        "patchesJson6902: an entry is a mapping, not a file name: write `- path: {file}` \
                         with the `target:` it changes"
                    )
                } else {
                    format!(
                        "patches: an entry is a mapping, not a file name: write `- path: {file}` \
                         (kustomize takes bare file names only under patchesStrategicMerge)"
                    )
                }))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                PatchDoc::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(PatchEntry)
            }
        }
        deserializer.deserialize_any(Entry::<JSON6902>)
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SelectorDoc {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub label_selector: Option<String>,
    #[serde(default)]
    pub annotation_selector: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GeneratorDoc {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub behavior: Option<String>,
    #[serde(default)]
    pub literals: Vec<String>,
    #[serde(default)]
    pub files: Vec<String>,
    #[serde(default)]
    pub envs: Vec<String>,
    #[serde(default)]
    pub env: Option<String>,
    #[serde(default)]
    pub options: Option<GeneratorOptions>,
    /// Secrets only.
    #[serde(default, rename = "type")]
    pub secret_type: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GeneratorOptions {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub disable_name_suffix_hash: bool,
    #[serde(default)]
    pub immutable: bool,
}

/// A kustomization file read and checked.
pub struct Kustomization {
    /// The folder, relative to the fleet root (`workloads/web`).
    pub dir: String,
    /// The file, relative to the fleet root.
    pub file: String,
    pub text: String,
    pub doc: KustomizationDoc,
    pub is_component: bool,
}

impl Kustomization {
    /// The line of a top-level key, for errors about it.
    pub fn key_line(&self, key: &str) -> Option<u64> {
        key_line(&self.text, key)
    }

    pub fn error(&self, line: Option<u64>, message: impl Into<String>) -> Error {
        Error {
            file: self.file.clone(),
            line,
            message: message.into(),
        }
    }

    /// The hash keys of the SOPS files whose text a value written in this
    /// kustomization came from: its own file's, when it is a SOPS file (its
    /// literals, inline patches and inline configurations are then decrypted
    /// values), and `path`'s, the file a value was read from, when it is one.
    pub fn sops_keys(&self, snapshot: &FleetSnapshot, path: Option<&str>) -> Vec<[u8; 32]> {
        crate::seal::key_set(
            [Some(self.file.as_str()), path]
                .into_iter()
                .flatten()
                .filter_map(|file| snapshot.hash_keys.get(file).copied()),
        )
    }

    /// Resolves a path given in this kustomization against its folder.
    pub fn resolve(&self, line: Option<u64>, path: &str) -> Result<String, Error> {
        resolve_path(&self.dir, path).map_err(|reason| self.error(line, reason))
    }
}

/// The line of a top-level key, found by reading the text.
pub fn key_line(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .position(|line| {
            line.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|index| index as u64 + 1)
}

/// Joins `path` to `dir` and normalises it; refuses absolute paths and paths that
/// leave the fleet root.
pub fn resolve_path(dir: &str, path: &str) -> Result<String, String> {
    if path.starts_with('/') {
        return Err(format!(
            "{path:?} is an absolute path; give paths relative to the kustomization, inside the fleet"
        ));
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!(
                        "{path:?} leads outside the fleet root; a kustomization may only use files of the fleet"
                    ));
                }
            }
            other => parts.push(other),
        }
    }
    Ok(parts.join("/"))
}

/// Whether a `resources` entry names something to fetch rather than a local path.
pub fn is_remote(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.contains("://")
        || lower.starts_with("git::")
        || lower.starts_with("git@")
        || lower.starts_with("github.com/")
        || lower.starts_with("gitlab.com/")
        || lower.starts_with("bitbucket.org/")
        || lower.contains("?ref=")
        || lower.contains(".git//")
}

/// The kustomization file of a folder, if it has one; more than one is an error.
pub fn find_in(snapshot: &FleetSnapshot, dir: &str) -> Result<Option<String>, String> {
    let found: Vec<String> = KUSTOMIZATION_FILE_NAMES
        .iter()
        .map(|name| join(dir, name))
        .filter(|path| snapshot.files.contains_key(path))
        .collect();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.into_iter().next()),
        _ => Err(format!(
            "{dir} holds more than one kustomization file ({}); keep one",
            found.join(", ")
        )),
    }
}

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether any file of the snapshot is under `dir`.
pub fn is_dir(snapshot: &FleetSnapshot, dir: &str) -> bool {
    let prefix = format!("{dir}/");
    snapshot
        .files
        .range(prefix.clone()..)
        .next()
        .is_some_and(|(path, _)| path.starts_with(&prefix))
        || snapshot
            .skipped
            .keys()
            .any(|path| path.starts_with(&prefix))
}

const KUSTOMIZATION_API: &str = "kustomize.config.k8s.io/v1beta1";
const COMPONENT_API: &str = "kustomize.config.k8s.io/v1alpha1";

/// Reads and checks the kustomization file at `file` (in folder `dir`).
pub fn load(snapshot: &FleetSnapshot, dir: &str, file: &str) -> Result<Kustomization, Vec<Error>> {
    let error = |line: Option<u64>, message: String| Error {
        file: file.to_string(),
        line,
        message,
    };
    let Some(text) = snapshot.files.get(file) else {
        return Err(vec![error(
            None,
            "the kustomization file cannot be read".into(),
        )]);
    };
    let doc: KustomizationDoc = match yaml::parse::<Option<KustomizationDoc>>(text) {
        Ok(Some(doc)) => doc,
        Ok(None) => KustomizationDoc::default(),
        Err(err) => return Err(vec![error(err.line, err.message)]),
    };
    let mut errors = Vec::new();
    let kind = doc.kind.as_deref().unwrap_or("Kustomization");
    let is_component = kind == "Component";
    if kind != "Kustomization" && !is_component {
        errors.push(error(
            key_line(text, "kind"),
            format!("kind must be Kustomization or Component, not {kind:?}"),
        ));
    }
    let wanted_api = if is_component {
        COMPONENT_API
    } else {
        KUSTOMIZATION_API
    };
    if let Some(api) = &doc.api_version
        && api != wanted_api
    {
        errors.push(error(
            key_line(text, "apiVersion"),
            format!("apiVersion of a {kind} must be {wanted_api:?}, not {api:?}"),
        ));
    }
    let refused: [(&str, bool, &str); 10] = [
        (
            "validators",
            doc.validators.is_some(),
            "validator plugins run programs",
        ),
        (
            "configurations",
            doc.configurations.is_some(),
            "custom transformer configurations are not supported",
        ),
        (
            "crds",
            doc.crds.is_some(),
            "CRD name-reference configurations are not supported",
        ),
        (
            "openapi",
            doc.openapi.is_some(),
            "custom OpenAPI schemas are not supported",
        ),
        (
            "vars",
            doc.vars.is_some(),
            "vars are not supported (kustomize deprecates them)",
        ),
        (
            "replacements",
            doc.replacements.is_some(),
            "replacements are not supported",
        ),
        (
            "helmCharts",
            doc.helm_charts.is_some(),
            "Helm charts are not inflated",
        ),
        (
            "helmGlobals",
            doc.helm_globals.is_some(),
            "Helm charts are not inflated",
        ),
        (
            "helmChartInflationGenerator",
            doc.helm_chart_inflation_generator.is_some(),
            "Helm charts are not inflated",
        ),
        (
            "buildMetadata",
            doc.build_metadata.is_some(),
            "build metadata annotations are not supported",
        ),
    ];
    for (field, present, why) in refused {
        if present {
            errors.push(error(
                key_line(text, field),
                format!(
                    "{field}: {why}; flotilla builds kustomizations without plugins (render the result into the repository instead, see docs/migrating.md)"
                ),
            ));
        }
    }
    let empty = doc.resources.is_empty()
        && doc.bases.is_empty()
        && doc.components.is_empty()
        && doc.config_map_generator.is_empty()
        && doc.secret_generator.is_empty()
        && doc.patches.is_empty()
        && doc.patches_strategic_merge.is_empty()
        && doc.patches_json6902.is_empty()
        && doc.namespace.is_none()
        && doc.name_prefix.is_none()
        && doc.name_suffix.is_none()
        && doc.common_labels.is_empty()
        && doc.labels.is_empty()
        && doc.common_annotations.is_empty()
        && doc.images.is_empty()
        && doc.image_tags.is_empty()
        && doc.replicas.is_empty()
        && doc.generators.is_empty()
        && doc.transformers.is_empty();
    if empty && errors.is_empty() {
        errors.push(error(None, "the kustomization is empty".into()));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Kustomization {
        dir: dir.to_string(),
        file: file.to_string(),
        text: text.to_string(),
        doc,
        is_component,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_root() {
        assert_eq!(
            resolve_path("workloads/web", "../../bases/app"),
            Ok("bases/app".into())
        );
        assert_eq!(
            resolve_path("workloads/web", "./patch.yaml"),
            Ok("workloads/web/patch.yaml".into())
        );
        assert!(resolve_path("workloads/web", "../../../etc").is_err());
        assert!(resolve_path("workloads/web", "/etc/passwd").is_err());
        assert!(is_remote("https://github.com/org/repo//deploy?ref=v1"));
        assert!(is_remote("git::https://example.com/repo.git"));
        assert!(is_remote("github.com/org/repo/deploy?ref=main"));
        assert!(!is_remote("../base"));
    }
}
