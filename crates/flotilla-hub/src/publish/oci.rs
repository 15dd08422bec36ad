//! `publish --oci REGISTRY/REPOSITORY`: each cluster's bundle pushed as an OCI
//! artifact tagged with the cluster's name.
//!
//! The layer is the bundle's canonical body, so clusters with the same bundle share
//! one blob, uploaded once (and not at all when the registry has it). What differs
//! between them (cluster, revision, signature) is in the manifest's annotations. The
//! tag's previous manifest is read first: when it holds the same bundle its revision
//! is kept, as a folder keeps a digest's first document, so an unchanged cluster gets
//! the same manifest bytes and its tag does not move; and with a signing key its
//! signature, when it verifies with the key, continues the sequence. Tags of clusters
//! that left the fleet stay: registries do not all allow deleting.
//!
//! With `--format flux`, each cluster also gets a Flux `OCIRepository` artifact
//! under the tag `<cluster>-flux` ([`push_flux`]): the manifest `flux push artifact`
//! writes (no `artifactType`; Flux's config media type and empty config; one
//! `tar.gz` layer from [`flux_layer`]), annotated with the revision, the source when
//! known, and the cluster. A cluster name is a DNS-1123 label (at most 63
//! characters of `[a-z0-9-]`), so `<cluster>-flux` is always a valid tag; a cluster
//! whose Flux tag is another cluster's name (`edge` and `edge-flux`) would overwrite
//! that cluster's bundle, and is refused.

use std::collections::BTreeMap;

use flotilla_core::signing::SigningKey;
use flotilla_oci::artifact::{
    BUNDLE_LAYER_MEDIA_TYPE, BundleManifest, CLUSTER_ANNOTATION, ImageManifest,
};
use flotilla_oci::{Artifact, Blob, Registry, valid_tag};
use flotilla_render::RenderOutput;
use flotilla_render::formats::flux::{
    CONFIG, CONFIG_MEDIA_TYPE, LAYER_MEDIA_TYPE, REVISION_ANNOTATION, SOURCE_ANNOTATION, flux_layer,
};
use flotilla_render::sops::SopsWriter;
use futures::StreamExt as _;

use super::{
    Claims, Document, PublishError, Published, check_names, next_sequence, now_ms, verified,
};

/// How many clusters' manifests are read and pushed at once.
const IN_FLIGHT: usize = 16;

pub(super) async fn push_documents(
    documents: Vec<Document>,
    registry: &Registry,
    signer: Option<&SigningKey>,
) -> Result<Published, PublishError> {
    check_names(&documents)?;
    let mut published = Published {
        clusters: documents.len(),
        ..Published::default()
    };
    // Each distinct bundle's layer first, one at a time, so that clusters sharing a
    // bundle never upload it twice; then the clusters' manifests, several at once.
    let mut layers = std::collections::BTreeMap::new();
    for document in &documents {
        layers.entry(document.digest.as_str()).or_insert(document);
    }
    for blob in std::iter::once(Blob::empty()).chain(
        layers
            .values()
            .map(|d| Blob::new(BUNDLE_LAYER_MEDIA_TYPE, d.body.as_slice())),
    ) {
        let uploaded = registry
            .ensure_blob(&blob)
            .await
            .map_err(|source| PublishError::Oci {
                // The first blob is the empty config every manifest names: the first
                // cluster's bundle is the one that could not be pushed.
                cluster: layers
                    .values()
                    .find(|d| d.digest == blob.digest)
                    .or_else(|| layers.values().next())
                    .map_or_else(String::new, |d| d.cluster.clone()),
                repository: registry.repository().to_string(),
                source: Box::new(source),
            })?;
        published.uploaded_blobs += usize::from(uploaded);
    }
    let mut pushes = futures::stream::iter(documents.into_iter().map(|document| async move {
        let mut warnings = Vec::new();
        let pushed = push_document(document, registry, signer, &mut warnings).await;
        (pushed, warnings)
    }))
    .buffer_unordered(IN_FLIGHT);
    while let Some((pushed, warnings)) = pushes.next().await {
        published.warnings.extend(warnings);
        let pushed = pushed?;
        published.uploaded_blobs += pushed.uploaded;
        if pushed.changed {
            published.written += 1;
        } else {
            published.unchanged += 1;
        }
    }
    Ok(published)
}

async fn push_document(
    document: Document,
    registry: &Registry,
    signer: Option<&SigningKey>,
    warnings: &mut Vec<String>,
) -> Result<flotilla_oci::Pushed, PublishError> {
    let Document {
        cluster,
        digest,
        revision,
        body,
        hub_sequence,
    } = document;
    let failed = |source| PublishError::Oci {
        cluster: cluster.clone(),
        repository: registry.repository().to_string(),
        source: Box::new(source),
    };
    let shown = format!("{}:{cluster}", registry.repository());
    let previous = registry.get_manifest(&cluster).await.map_err(failed)?;
    let (now, before) = match previous {
        None => (None, None),
        Some((bytes, manifest_digest)) => {
            match BundleManifest::parse(&bytes, manifest_digest.as_str()) {
                Ok(manifest) if manifest.cluster == cluster => {
                    (Some(manifest_digest), Some(manifest))
                }
                Ok(manifest) => {
                    warnings.push(format!(
                        "{shown} held the bundle of cluster {:?}; it is written over",
                        manifest.cluster
                    ));
                    (Some(manifest_digest), None)
                }
                Err(err) => {
                    warnings.push(format!("{shown}: {err}; it is written over"));
                    (Some(manifest_digest), None)
                }
            }
        }
    };
    // What the previous manifest's signature vouches for, when publishing signed.
    let held = match (signer, &before) {
        (Some(key), Some(manifest)) => {
            let claims = Claims {
                digest: manifest.layer.as_str().to_string(),
                revision: manifest.revision.clone(),
                signature: manifest.signature.clone(),
            };
            verified(&cluster, claims, key, &shown, warnings)
        }
        _ => None,
    };
    // The same bundle keeps the revision it was first published with; when signing,
    // only a revision the key signed before: whoever may push to the registry must
    // not have the key sign a revision of their choosing.
    let revision = match &before {
        Some(manifest) if manifest.layer == digest && (signer.is_none() || held.is_some()) => {
            manifest.revision.clone()
        }
        _ => revision,
    };
    let signature = match signer {
        None => None,
        Some(key) => {
            let sequence = next_sequence(held.as_ref(), &digest, now_ms(), &shown)?
                .max(hub_sequence.unwrap_or(0));
            Some(key.sign(&cluster, &digest, &revision, sequence))
        }
    };
    let artifact = Artifact::bundle(&cluster, &revision, body, signature.as_ref());
    debug_assert_eq!(artifact.layers[0].digest, digest);
    registry
        .push_over(&cluster, &artifact, now.as_ref())
        .await
        .map_err(failed)
}

/// What a cluster's name is followed by in the tag of its Flux artifact.
pub const FLUX_TAG_SUFFIX: &str = "-flux";

/// The tag of `cluster`'s Flux artifact.
pub fn flux_tag(cluster: &str) -> String {
    format!("{cluster}{FLUX_TAG_SUFFIX}")
}

/// Pushes the Flux artifact of every cluster of `output` (a render with its Secrets in
/// plain text) that can have one; the others are refused, each with its reason.
///
/// The revision annotation is kept from the tag's previous manifest when that has
/// the same layer, as for bundles: a commit that does not change a cluster does not
/// move its Flux tag, and Flux does not fetch and apply it again.
pub(super) async fn push_flux(
    output: &RenderOutput,
    registry: &Registry,
    sops: &SopsWriter,
    source: Option<&str>,
) -> Result<Published, PublishError> {
    let mut published = Published::default();
    let mut layers = Vec::with_capacity(output.bundles.len());
    for (cluster, bundle) in &output.bundles {
        let tag = flux_tag(cluster);
        if !valid_tag(&tag) {
            published.refused.push(format!(
                "cluster {cluster}: {tag:?} is not a valid OCI tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}); its Flux artifact was not pushed"
            ));
        } else if output.bundles.contains_key(&tag) {
            published.refused.push(format!(
                "cluster {cluster}: its Flux artifact's tag {tag} is the bundle tag of the cluster {tag}; rename one of the two clusters"
            ));
        } else {
            match flux_layer(bundle, output.agent_keys.get(cluster), sops) {
                Ok(layer) => layers.push((cluster.as_str(), tag, layer)),
                Err(err) => published.refused.push(err.to_string()),
            }
        }
    }
    published.clusters = layers.len();
    let config = Blob::new(CONFIG_MEDIA_TYPE, CONFIG);
    if !layers.is_empty() {
        let uploaded =
            registry
                .ensure_blob(&config)
                .await
                .map_err(|source| PublishError::OciFlux {
                    cluster: layers[0].0.to_string(),
                    repository: registry.repository().to_string(),
                    source: Box::new(source),
                })?;
        published.uploaded_blobs += usize::from(uploaded);
    }
    let revision = output.revision.as_str();
    let config = &config;
    let mut pushes = futures::stream::iter(layers.into_iter().map(|(cluster, tag, layer)| {
        async move {
            let failed = |source| PublishError::OciFlux {
                cluster: cluster.to_string(),
                repository: registry.repository().to_string(),
                source: Box::new(source),
            };
            let layer = Blob::new(LAYER_MEDIA_TYPE, layer);
            let (now, kept) = match registry.get_manifest(&tag).await.map_err(failed)? {
                None => (None, None),
                Some((bytes, digest)) => {
                    // Whatever the tag held is replaced; its revision is kept only
                    // when it named the same layer.
                    let kept = ImageManifest::parse(&bytes, digest.as_str())
                        .ok()
                        .filter(|m| {
                            matches!(m.layers.as_slice(), [only] if only.digest == layer.digest.as_str())
                        })
                        .and_then(|m| m.annotations.get(REVISION_ANNOTATION).cloned());
                    (Some(digest), kept)
                }
            };
            let mut annotations = BTreeMap::new();
            annotations.insert(
                REVISION_ANNOTATION.to_string(),
                kept.unwrap_or_else(|| revision.to_string()),
            );
            if let Some(source) = source {
                annotations.insert(SOURCE_ANNOTATION.to_string(), source.to_string());
            }
            annotations.insert(CLUSTER_ANNOTATION.to_string(), cluster.to_string());
            let artifact = Artifact {
                artifact_type: None,
                config: config.clone(),
                layers: vec![layer],
                annotations,
            };
            registry
                .push_over(&tag, &artifact, now.as_ref())
                .await
                .map_err(failed)
        }
    }))
    .buffer_unordered(IN_FLIGHT);
    while let Some(pushed) = pushes.next().await {
        let pushed = pushed?;
        published.uploaded_blobs += pushed.uploaded;
        if pushed.changed {
            published.written += 1;
        } else {
            published.unchanged += 1;
        }
    }
    Ok(published)
}
