//! What happens to one manifest document for one cluster: identity checks, the
//! default namespace, then every matching overlay in order (patches, images, labels
//! and annotations).

use serde_json::{Map, Value};

use super::load::{CompiledPatch, Overlay, PatchAction, SourcedDocument, Workload};
use super::patch::{self, PatchLimits};
use super::scope::{CustomScopes, is_cluster_scoped};
use super::strategic;
use flotilla_core::bundle::{MAX_NESTING_DEPTH, ResourceKey, nests_deeper_than};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::model::ImageOverride;
use flotilla_core::names;

/// Renders one document, its patches applied within `limits`: returns the final
/// resource or the error that stopped it. Every overlay patch whose target matched
/// the resource is marked in `matched` (`matched[overlay position][patch index]`), so
/// that a target that never matches can be reported.
pub fn transform(
    document: SourcedDocument,
    workload: &Workload,
    overlays: &[&Overlay],
    scopes: &CustomScopes,
    limits: &PatchLimits,
    matched: &mut [Vec<bool>],
) -> Result<(ResourceKey, Value), Diagnostic> {
    let located = |message: String| {
        Diagnostic::error(message)
            .in_file(&*document.file)
            .at_line(Some(document.line))
    };
    let mut value = document.value;
    let key = identity(&value).map_err(located)?;
    let cluster_scoped = is_cluster_scoped(key.group(), key.kind(), scopes);
    if cluster_scoped && !key.namespace().is_empty() {
        return Err(located(format!(
            "{} is cluster-scoped and must not set metadata.namespace",
            key
        )));
    }
    if !cluster_scoped
        && key.namespace().is_empty()
        && let Some(namespace) = &workload.namespace
        && let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut)
    {
        metadata.insert("namespace".into(), Value::String(namespace.clone()));
    }
    for (position, overlay) in overlays.iter().enumerate() {
        for (index, patch) in overlay.patches.iter().enumerate() {
            if !patch_matches(patch, &value) {
                continue;
            }
            if let Some(flags) = matched.get_mut(position)
                && let Some(flag) = flags.get_mut(index)
            {
                *flag = true;
            }
            let before = identity(&value).map_err(&located)?;
            let result = match &patch.action {
                PatchAction::JsonPatch(ops) => {
                    // On an error the resource is dropped: no need to keep it whole.
                    patch::apply_json_patch_in_place(&mut value, ops, limits)
                        .map_err(|err| err.to_string())
                }
                PatchAction::MergePatch(merge) => {
                    patch::apply_merge_patch(&mut value, merge);
                    Ok(())
                }
                PatchAction::StrategicMerge(merge) => match strategic::apply(&mut value, merge) {
                    Ok(strategic::Outcome::Patched) => Ok(()),
                    Ok(strategic::Outcome::Deleted) => Err(
                        "`$patch: delete` at the top of an overlay's patch would remove the resource; an overlay changes resources, it does not remove them".to_string(),
                    ),
                    Err(err) => Err(err.to_string()),
                },
            };
            // A patch must leave a resource with an identity, and cannot move a
            // cluster-scoped resource into a namespace (the manifest cannot either).
            let result = result.and_then(|()| {
                let key = identity(&value)?;
                if !key.namespace().is_empty() && is_cluster_scoped(key.group(), key.kind(), scopes)
                {
                    return Err(format!(
                        "{key} is cluster-scoped and must not set metadata.namespace"
                    ));
                }
                Ok(())
            });
            if let Err(reason) = result {
                return Err(Diagnostic::error(format!(
                    "patch of overlay {:?} on {} (from {}:{}) failed: {reason}",
                    overlay.name, before, document.file, document.line
                ))
                .in_file(&overlay.file)
                .at_line(Some(patch.line)));
            }
        }
        if !overlay.images.is_empty() {
            rewrite_images(&mut value, &overlay.images);
        }
        add_metadata(&mut value, "labels", &overlay.labels);
        add_metadata(&mut value, "annotations", &overlay.annotations);
    }
    let key = identity(&value).map_err(located)?;
    // Patches check depth as they go and YAML is read no deeper; this is the last
    // word, so the hub never serves what the agent refuses.
    if nests_deeper_than(&value, MAX_NESTING_DEPTH) {
        return Err(located(format!(
            "{key} nests arrays and objects deeper than {MAX_NESTING_DEPTH} levels"
        )));
    }
    Ok((key, value))
}

fn identity(value: &Value) -> Result<ResourceKey, String> {
    let Some(object) = value.as_object() else {
        return Err("a manifest must be a YAML mapping (a Kubernetes object)".into());
    };
    let field = |name: &str| {
        object
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if field("apiVersion").is_none() {
        return Err("manifest has no apiVersion".into());
    }
    if field("kind").is_none() {
        return Err("manifest has no kind".into());
    }
    let kind = field("kind").unwrap_or_default();
    if kind == "List" || (kind.ends_with("List") && object.contains_key("items")) {
        return Err(format!(
            "a {kind} is not expanded here: write each of its items as a document of its own (separated by ---), or list the file in a kustomization's resources, which expands it"
        ));
    }
    let metadata = object.get("metadata");
    match metadata.and_then(|m| m.get("name")) {
        Some(Value::String(name)) if !name.is_empty() => {}
        Some(name @ (Value::Number(_) | Value::Bool(_))) => {
            return Err(format!(
                "metadata.name must be a string, not {name}: quote it (name: \"{name}\")"
            ));
        }
        Some(name) if !name.is_null() && !name.is_string() => {
            return Err("metadata.name must be a string".into());
        }
        _ => {
            let generated = metadata.is_some_and(|m| m.get("generateName").is_some());
            return Err(if generated {
                "manifest has no metadata.name (generateName is not supported: a bundle must name what it applies)".into()
            } else {
                "manifest has no metadata.name".into()
            });
        }
    }
    if let Some(namespace) = object.get("metadata").and_then(|m| m.get("namespace"))
        && !namespace.is_string()
    {
        return Err("metadata.namespace must be a string".into());
    }
    let key =
        ResourceKey::of(value).ok_or_else(|| "manifest has no usable identity".to_string())?;
    check_names(&key)?;
    Ok(key)
}

/// The kind, name and namespace by the API server's rules: a name that would be
/// refused there is refused here, with the file and line, and no name that passes
/// can hold `/`, `..`, NUL or a line break.
fn check_names(key: &ResourceKey) -> Result<(), String> {
    if let Err(invalid) = names::kind(key.kind()) {
        return Err(format!(
            "kind {} is not valid: it {invalid}",
            names::shown(key.kind())
        ));
    }
    if let Err(invalid) = names::resource_name(key.group(), key.kind(), key.name()) {
        return Err(format!(
            "metadata.name {} is not a valid name for a {}: it {invalid}",
            names::shown(key.name()),
            key.kind()
        ));
    }
    if !key.namespace().is_empty()
        && let Err(invalid) = names::dns1123_label(key.namespace())
    {
        return Err(format!(
            "metadata.namespace {} is not valid: it {invalid}",
            names::shown(key.namespace())
        ));
    }
    Ok(())
}

fn patch_matches(patch: &CompiledPatch, value: &Value) -> bool {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (group, version) = match api_version.rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let metadata = value.get("metadata");
    let text = |field: &str| {
        metadata
            .and_then(|m| m.get(field))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let string_map = |field: &str| {
        metadata
            .and_then(|m| m.get(field))
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    };
    patch.group.as_ref().is_none_or(|r| r.is_match(group))
        && patch.version.as_ref().is_none_or(|r| r.is_match(version))
        && patch.kind.as_ref().is_none_or(|r| r.is_match(kind))
        && patch.name.as_ref().is_none_or(|r| r.is_match(text("name")))
        && patch
            .namespace
            .as_ref()
            .is_none_or(|r| r.is_match(text("namespace")))
        && patch
            .label_selector
            .as_ref()
            .is_none_or(|s| s.matches(&string_map("labels")))
        && patch
            .annotation_selector
            .as_ref()
            .is_none_or(|s| s.matches(&string_map("annotations")))
}

fn add_metadata(
    value: &mut Value,
    field: &str,
    entries: &std::collections::BTreeMap<String, String>,
) {
    if entries.is_empty() {
        return;
    }
    let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let target = metadata
        .entry(field)
        .or_insert_with(|| Value::Object(Map::new()));
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(map) = target.as_object_mut() {
        for (key, entry) in entries {
            map.insert(key.clone(), Value::String(entry.clone()));
        }
    }
}

/// kustomize `images` semantics: every container (`containers`, `initContainers`,
/// `ephemeralContainers`, at any depth, so pod templates and CronJobs are covered)
/// whose image name equals an override's `name` is rewritten.
pub fn rewrite_images(value: &mut Value, overrides: &[ImageOverride]) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if matches!(
                    key.as_str(),
                    "containers" | "initContainers" | "ephemeralContainers"
                ) && let Value::Array(containers) = child
                {
                    for container in containers.iter_mut() {
                        if let Some(Value::String(image)) = container.get_mut("image") {
                            for image_override in overrides {
                                if let Some(new) = apply_image_override(image, image_override) {
                                    *image = new;
                                }
                            }
                        }
                    }
                }
                rewrite_images(child, overrides);
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite_images(item, overrides);
            }
        }
        _ => {}
    }
}

/// Splits `registry:5000/repo/name:tag@sha256:...` into (name, tag, digest).
pub fn split_image(image: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[slash..].rfind(':') {
        Some(colon) => (
            &rest[..slash + colon],
            Some(&rest[slash + colon + 1..]),
            digest,
        ),
        None => (rest, None, digest),
    }
}

fn apply_image_override(image: &str, image_override: &ImageOverride) -> Option<String> {
    let (name, tag, digest) = split_image(image);
    if name != image_override.name {
        return None;
    }
    let new_name = image_override.new_name.as_deref().unwrap_or(name);
    // As in kustomize, a new tag and a digest given together are both kept.
    if let (Some(new_tag), Some(new_digest)) = (&image_override.new_tag, &image_override.digest) {
        return Some(format!("{new_name}:{new_tag}@{new_digest}"));
    }
    Some(if let Some(new_digest) = &image_override.digest {
        format!("{new_name}@{new_digest}")
    } else if let Some(new_tag) = &image_override.new_tag {
        format!("{new_name}:{new_tag}")
    } else {
        let mut out = new_name.to_string();
        if let Some(tag) = tag {
            out.push(':');
            out.push_str(tag);
        }
        if let Some(digest) = digest {
            out.push('@');
            out.push_str(digest);
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_image_references() {
        assert_eq!(split_image("nginx"), ("nginx", None, None));
        assert_eq!(split_image("nginx:1.25"), ("nginx", Some("1.25"), None));
        assert_eq!(
            split_image("localhost:5000/a/b:v1@sha256:00"),
            ("localhost:5000/a/b", Some("v1"), Some("sha256:00"))
        );
        assert_eq!(
            split_image("localhost:5000/a/b"),
            ("localhost:5000/a/b", None, None)
        );
    }

    #[test]
    fn overrides_follow_kustomize() {
        let image = |name: &str,
                     new_name: Option<&str>,
                     new_tag: Option<&str>,
                     digest: Option<&str>| ImageOverride {
            name: name.into(),
            new_name: new_name.map(Into::into),
            new_tag: new_tag.map(Into::into),
            digest: digest.map(Into::into),
        };
        assert_eq!(
            apply_image_override("nginx:1", &image("nginx", Some("mirror/nginx"), None, None))
                .as_deref(),
            Some("mirror/nginx:1")
        );
        assert_eq!(
            apply_image_override("nginx:1", &image("nginx", None, Some("2"), None)).as_deref(),
            Some("nginx:2")
        );
        assert_eq!(
            apply_image_override("nginx:1", &image("nginx", None, None, Some("sha256:ab")))
                .as_deref(),
            Some("nginx@sha256:ab")
        );
        assert_eq!(
            apply_image_override(
                "nginx:1@sha256:ab",
                &image("nginx", None, Some("2"), Some("sha256:cd"))
            )
            .as_deref(),
            Some("nginx:2@sha256:cd")
        );
        assert_eq!(
            apply_image_override("nginxx:1", &image("nginx", None, Some("2"), None)),
            None
        );
    }
}
