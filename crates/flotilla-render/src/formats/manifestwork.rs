//! A cluster's bundle as Open Cluster Management `ManifestWork`s.
//!
//! OCM's hub delivers the resources of a `ManifestWork`
//! (`work.open-cluster-management.io/v1`) in the namespace named after a managed
//! cluster to that cluster's work agent, which applies them. [`manifest_works`] puts
//! a bundle's resources, in bundle order, into works named `flotilla-<cluster>-1`,
//! `-2`, … in the namespace `<cluster>`: a new work starts where the next resource
//! would take the manifests of the current one over `max_bytes`.
//!
//! OCM's validating webhook refuses a work whose manifests together exceed a limit:
//! 50 KiB (51,200 bytes) when it was introduced, configurable and 500 KiB (512,000
//! bytes) by default since 2023 ([`DEFAULT_MAX_BYTES`]). It sums each manifest's
//! protobuf size: the manifest's JSON as Go writes it, plus a few bytes of framing.
//! [`manifest_size`] counts that from the canonical JSON: Go escapes `<`, `>` and `&`
//! as `\u003c` and writes U+2028 and U+2029 escaped, and each manifest's framing is
//! counted as [`FRAMING_BYTES`], a bound on it for any manifest under 2 MiB.
//!
//! A work carries its resources in plain text, Secrets included: a bundle with a
//! Secret is refused unless the caller allows plain Secrets.

use flotilla_core::bundle::{Bundle, Resource};
use serde_json::{Value, json};

/// The `apiVersion` of the works written.
pub const API_VERSION: &str = "work.open-cluster-management.io/v1";
/// The limit of OCM's webhook since 2023 (its default, 500 KiB).
pub const DEFAULT_MAX_BYTES: usize = 500 * 1024;
/// The limit before it could be configured (50 KiB): what older hubs accept.
pub const LEGACY_MAX_BYTES: usize = 50 * 1024;
/// The most protobuf framing OCM's webhook counts for one manifest of less than
/// 2 MiB (two field tags and two length varints of up to three bytes).
pub const FRAMING_BYTES: usize = 8;
/// The label every work carries.
pub const MANAGED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "flotilla");
/// The annotation naming the bundle's digest.
pub const DIGEST_ANNOTATION: &str = "flotilla.dev/digest";
/// The annotation naming the revision the bundle was rendered from.
pub const REVISION_ANNOTATION: &str = "flotilla.dev/revision";

/// How works are made.
#[derive(Clone, Copy, Debug)]
pub struct ManifestWorkOptions {
    /// The most bytes of manifests one work may hold, as OCM's webhook counts them.
    pub max_bytes: usize,
    /// Write Secrets in plain text; without it, a bundle with a Secret is refused.
    pub allow_plain_secrets: bool,
}

impl Default for ManifestWorkOptions {
    fn default() -> ManifestWorkOptions {
        ManifestWorkOptions {
            max_bytes: DEFAULT_MAX_BYTES,
            allow_plain_secrets: false,
        }
    }
}

/// Why a cluster's works could not be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestWorkError {
    #[error(
        "cluster {cluster}: a ManifestWork holds Secrets in plain text, and the bundle has {}: {}; pass --allow-plain-secrets to write them anyway",
        if secrets.len() == 1 { "one" } else { "several" },
        secrets.join(", ")
    )]
    PlainSecrets {
        cluster: String,
        secrets: Vec<String>,
    },
    #[error(
        "cluster {cluster}: the Secret {secret} is sealed for flotilla's agent, which OCM's work agent cannot open; make the works from a render of the plain fleet"
    )]
    Sealed { cluster: String, secret: String },
    #[error(
        "cluster {cluster}: the resource {resource} is {bytes} bytes as OCM counts it, more than one ManifestWork may hold ({max} bytes; --manifestwork-max-bytes, within what the OCM hub's webhook accepts)"
    )]
    TooLarge {
        cluster: String,
        resource: String,
        bytes: usize,
        max: usize,
    },
}

/// The works of `bundle` (rendered from `revision`), in order.
pub fn manifest_works(
    bundle: &Bundle,
    revision: &str,
    options: &ManifestWorkOptions,
) -> Result<Vec<Value>, ManifestWorkError> {
    let cluster = &bundle.cluster;
    let secrets: Vec<&Resource> = bundle
        .resources
        .iter()
        .map(|r| &**r)
        .filter(|r| super::is_secret(r))
        .collect();
    if let Some(sealed) = secrets.iter().find(|r| super::is_sealed(r)) {
        return Err(ManifestWorkError::Sealed {
            cluster: cluster.clone(),
            secret: sealed.key.to_string(),
        });
    }
    if !options.allow_plain_secrets && !secrets.is_empty() {
        return Err(ManifestWorkError::PlainSecrets {
            cluster: cluster.clone(),
            secrets: secrets.iter().map(|r| r.key.to_string()).collect(),
        });
    }
    let mut parts: Vec<Vec<Value>> = Vec::new();
    let mut current: Vec<Value> = Vec::new();
    let mut current_bytes = 0;
    for resource in &bundle.resources {
        let bytes = manifest_size(resource);
        if bytes > options.max_bytes {
            return Err(ManifestWorkError::TooLarge {
                cluster: cluster.clone(),
                resource: resource.key.to_string(),
                bytes,
                max: options.max_bytes,
            });
        }
        if current_bytes + bytes > options.max_bytes {
            parts.push(std::mem::take(&mut current));
            current_bytes = 0;
        }
        current.push(resource.value());
        current_bytes += bytes;
    }
    if !current.is_empty() {
        parts.push(current);
    }
    Ok(parts
        .into_iter()
        .enumerate()
        .map(|(index, manifests)| {
            json!({
                "apiVersion": API_VERSION,
                "kind": "ManifestWork",
                "metadata": {
                    "name": format!("flotilla-{cluster}-{}", index + 1),
                    "namespace": cluster,
                    "labels": { MANAGED_BY_LABEL.0: MANAGED_BY_LABEL.1 },
                    "annotations": {
                        DIGEST_ANNOTATION: bundle.digest.as_str(),
                        REVISION_ANNOTATION: revision,
                    },
                },
                "spec": { "workload": { "manifests": manifests } },
            })
        })
        .collect())
}

/// The bytes OCM's webhook counts for `resource` as a manifest: its JSON as Go's
/// encoder writes it, and [`FRAMING_BYTES`].
pub fn manifest_size(resource: &Resource) -> usize {
    let text = &resource.canonical;
    let escaped_html = text
        .iter()
        .filter(|&&b| matches!(b, b'<' | b'>' | b'&'))
        .count();
    // U+2028 and U+2029 are E2 80 A8 / E2 80 A9 in UTF-8 (3 bytes), `\u2028` (6) in Go.
    let separators = text
        .windows(3)
        .filter(|w| w[0] == 0xE2 && w[1] == 0x80 && (w[2] == 0xA8 || w[2] == 0xA9))
        .count();
    text.len() + 5 * escaped_html + 3 * separators + FRAMING_BYTES
}
