//! A cluster's bundle as the layer of a Flux `OCIRepository` artifact.
//!
//! `flux push artifact` packs a folder of manifests as an OCI artifact: an image
//! manifest whose config has the media type [`CONFIG_MEDIA_TYPE`] and whose one layer,
//! [`LAYER_MEDIA_TYPE`], is a `tar.gz` of the folder. Flux's source-controller pulls
//! such an artifact (it reads the first layer, or the one `spec.layerSelector` names),
//! unpacks it, and the kustomize-controller applies the YAML found at the
//! `Kustomization`'s `spec.path` (generating a `kustomization.yaml` when there is
//! none). [`flux_layer`] writes that layer for one cluster:
//!
//! - one file per resource, in bundle order, named `NNNN-<kind>-<namespace>-<name>.yaml`
//!   (lower case, cut to 100 bytes; the number keeps names unique and the order
//!   visible), each a single YAML document;
//! - a `Secret` as a SOPS document whose `data` and `stringData` values are encrypted
//!   for the cluster's `spec.agentKey` (an age recipient), which the
//!   kustomize-controller decrypts with `spec.decryption.provider: sops` and the
//!   agent's age identity in the referenced Secret (an annotation or label that
//!   copies a value, such as `kubectl`'s last-applied configuration, is encrypted
//!   too); a cluster with Secrets and no `agentKey` is refused;
//! - entries as reproducible archives have them: regular files, mode 0644, owner 0,
//!   modification time 0, and a gzip header without a time or name, so a bundle
//!   without Secrets gives the same bytes on every run.
//!
//! A bundle with Secrets gives the same bytes when the [`SopsWriter`]'s seed and time
//! are the same: [`sops_seed`] derives a seed from the operator's own decryption
//! identity for that (`publish --oci --format flux`), and [`STABLE_TIME`] is the time.

use flotilla_core::bundle::Bundle;

use crate::seal::AgentKey;
use crate::sops::SopsWriter;

/// The media type of the artifact's manifest (an OCI image manifest).
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of the config blob `flux push artifact` writes.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.cncf.flux.config.v1+json";
/// The media type of the layer: [`flux_layer`]'s bytes.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.cncf.flux.content.v1.tar+gzip";
/// The config blob: an empty JSON object (source-controller reads nothing from it).
pub const CONFIG: &[u8] = b"{}";
/// The manifest annotation Flux shows as the artifact's revision; flotilla's
/// `<branch>@sha1:<commit>` is the form `flux push artifact --revision` takes.
pub const REVISION_ANNOTATION: &str = "org.opencontainers.image.revision";
/// The manifest annotation Flux shows as the artifact's source.
pub const SOURCE_ANNOTATION: &str = "org.opencontainers.image.source";

/// The `lastmodified` time written with a [`sops_seed`]: a fixed one, so that the same
/// Secret gives the same document from one publish to the next (sops reads the time
/// only into its MAC; nothing on the cluster compares it with a clock).
pub const STABLE_TIME: u64 = 0;

/// What [`sops_seed`] derives its seed for (HKDF's `info`), so that the seed is of no
/// use for anything else the identity keys.
const SOPS_SEED_PURPOSE: &[u8] = b"flotilla flux layer sops seed v1";

/// A secret seed for the SOPS documents of Flux layers, derived (HKDF-SHA256) from the
/// first age identity of `keys`, the key the operator already holds to open the
/// fleet's SOPS files; `None` without one.
///
/// Reused, the seed makes an unchanged Secret encrypt to the same document, so its
/// cluster's layer and tag stay as they were. The seed is as secret as the identity:
/// without it nobody can recompute an encryption to test a guessed value against
/// it, and HKDF's output reveals nothing of the identity. Replacing the first
/// identity (a rotation) gives every Secret a new encryption once.
pub fn sops_seed(keys: &crate::sops::DecryptionKeys) -> Option<[u8; 32]> {
    let identity = keys.identity_lines().into_iter().next()?;
    let hkdf = hkdf::Hkdf::<sha2::Sha256>::new(None, identity.as_bytes());
    let mut seed = [0u8; 32];
    // 32 bytes are far below HKDF-SHA256's limit of 8160.
    hkdf.expand(SOPS_SEED_PURPOSE, &mut seed).ok()?;
    Some(seed)
}

/// The longest file name in the layer: what a plain (ustar) tar header holds.
const MAX_FILE_NAME: usize = 100;

/// Why a cluster's layer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FluxError {
    #[error(
        "cluster {cluster}: the Secret {secret} cannot go to Flux in plain text, and the cluster has no spec.agentKey to encrypt it for (give clusters/{cluster}.yaml an agentKey, an age recipient age1…, and the cluster's kustomize-controller its identity)"
    )]
    NoAgentKey { cluster: String, secret: String },
    #[error(
        "cluster {cluster}: the Secret {secret} is sealed for flotilla's agent, which Flux cannot open; make the Flux layer from a render of the plain fleet"
    )]
    Sealed { cluster: String, secret: String },
    #[error("cluster {cluster}: the Secret {secret} cannot be written as SOPS: {reason}")]
    Sops {
        cluster: String,
        secret: String,
        reason: crate::sops::SopsWriteError,
    },
    #[error("cluster {cluster}: {file} cannot be written into the layer: {reason}")]
    Archive {
        cluster: String,
        file: String,
        reason: String,
    },
    #[error("cluster {cluster}: the resource {resource} cannot be written as YAML: {reason}")]
    Yaml {
        cluster: String,
        resource: String,
        reason: String,
    },
}

/// The layer of every cluster of `output` (a render of the plain fleet), in cluster
/// order, or the error of every cluster that cannot have one.
///
/// For pushing: a secret seed that is reused ([`sops_seed`]) and [`STABLE_TIME`] make
/// an unchanged fleet give the same layers, so a publish that changes nothing pushes
/// nothing new.
pub fn flux_layers(
    output: &crate::RenderOutput,
    sops: &SopsWriter,
) -> Result<Vec<(String, Vec<u8>)>, Vec<FluxError>> {
    let mut layers = Vec::with_capacity(output.bundles.len());
    let mut errors = Vec::new();
    for (cluster, bundle) in &output.bundles {
        match flux_layer(bundle, output.agent_keys.get(cluster), sops) {
            Ok(layer) => layers.push((cluster.clone(), layer)),
            Err(err) => errors.push(err),
        }
    }
    if errors.is_empty() {
        Ok(layers)
    } else {
        Err(errors)
    }
}

/// The layer (`tar.gz` bytes) of `bundle`'s Flux artifact; its Secrets are encrypted
/// with `sops` for `agent_key`.
pub fn flux_layer(
    bundle: &Bundle,
    agent_key: Option<&AgentKey>,
    sops: &SopsWriter,
) -> Result<Vec<u8>, FluxError> {
    let files = flux_files(bundle, agent_key, sops)?;
    let gzip = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::best());
    let mut archive = tar::Builder::new(gzip);
    archive.mode(tar::HeaderMode::Deterministic);
    for (name, text) in &files {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        archive
            .append_data(&mut header, name, text.as_bytes())
            .map_err(|e| archive_error(bundle, name, &e))?;
    }
    let finished = archive
        .into_inner()
        .and_then(flate2::write::GzEncoder::finish);
    finished.map_err(|e| archive_error(bundle, "the archive's end", &e))
}

/// The files of the layer, in order: (name, YAML text).
pub fn flux_files(
    bundle: &Bundle,
    agent_key: Option<&AgentKey>,
    sops: &SopsWriter,
) -> Result<Vec<(String, String)>, FluxError> {
    let cluster = &bundle.cluster;
    let mut files = Vec::with_capacity(bundle.resources.len());
    for (index, resource) in bundle.resources.iter().enumerate() {
        let key = &resource.key;
        let mut stem = format!(
            "{:04}-{}-{}-{}",
            index + 1,
            file_part(key.kind()),
            file_part(if key.namespace().is_empty() {
                "_"
            } else {
                key.namespace()
            }),
            file_part(key.name())
        );
        // A tar header holds a name of 100 bytes; the number keeps cut names unique.
        stem.truncate(MAX_FILE_NAME - ".yaml".len());
        let name = format!("{stem}.yaml");
        let text = if super::is_secret(resource) {
            if super::is_sealed(resource) {
                return Err(FluxError::Sealed {
                    cluster: cluster.clone(),
                    secret: key.to_string(),
                });
            }
            let value = resource.value();
            if value.get("data").is_none() && value.get("stringData").is_none() {
                yaml(&value, cluster, &key.to_string())?
            } else {
                let Some(recipient) = agent_key else {
                    return Err(FluxError::NoAgentKey {
                        cluster: cluster.clone(),
                        secret: key.to_string(),
                    });
                };
                // Annotations or labels that copy a value (kubectl's last-applied
                // configuration) are encrypted with the values.
                let copies: Vec<String> = flotilla_core::secret::revealing_metadata(&value)
                    .into_iter()
                    .map(|(_, key)| key)
                    .collect();
                sops.encrypt_also(&value, recipient, &key.to_string(), &copies)
                    .map_err(|reason| FluxError::Sops {
                        cluster: cluster.clone(),
                        secret: key.to_string(),
                        reason,
                    })?
            }
        } else {
            yaml(&resource.value(), cluster, &key.to_string())?
        };
        files.push((name, text));
    }
    Ok(files)
}

fn archive_error(bundle: &Bundle, file: &str, err: &std::io::Error) -> FluxError {
    FluxError::Archive {
        cluster: bundle.cluster.clone(),
        file: file.to_string(),
        reason: err.to_string(),
    }
}

fn yaml(value: &serde_json::Value, cluster: &str, resource: &str) -> Result<String, FluxError> {
    serde_saphyr::to_string(value).map_err(|e| FluxError::Yaml {
        cluster: cluster.to_string(),
        resource: resource.to_string(),
        reason: e.to_string(),
    })
}

/// A name as part of a file name: lower case, `[a-z0-9.-]`, anything else `_`.
fn file_part(text: &str) -> String {
    text.chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            _ => '_',
        })
        .collect()
}
