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

use flotilla_core::signing::SigningKey;
use flotilla_oci::artifact::{BUNDLE_LAYER_MEDIA_TYPE, BundleManifest};
use flotilla_oci::{Artifact, Blob, Registry};
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
                cluster: layers
                    .values()
                    .find(|d| d.digest == blob.digest)
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
    // The same bundle keeps the revision it was first published with.
    let revision = match &before {
        Some(manifest) if manifest.layer == digest => manifest.revision.clone(),
        _ => revision,
    };
    let signature = match signer {
        None => None,
        Some(key) => {
            let held = before.and_then(|manifest| {
                let claims = Claims {
                    digest: manifest.layer.as_str().to_string(),
                    revision: manifest.revision,
                    signature: manifest.signature,
                };
                verified(&cluster, claims, key, &shown, warnings)
            });
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
