//! Artifacts as a registry holds them: blobs and an OCI image manifest naming them,
//! and the one kind flotilla pulls back, a cluster's bundle.
//!
//! A bundle artifact's manifest is deterministic: the same bundle, cluster, revision
//! and signature give the same bytes, so publishing an unchanged fleet again leaves
//! every tag's digest as it was (no creation time is written, for that reason).

use std::collections::BTreeMap;
use std::sync::Arc;

use flotilla_core::bundle::{BundleSignature, Digest, MAX_BUNDLE_BYTES, document_bytes};

use crate::{MANIFEST_MEDIA_TYPE, OciError};

/// The artifact type of a flotilla bundle.
pub const BUNDLE_ARTIFACT_TYPE: &str = "application/vnd.flotilla.bundle.v1";
/// The media type of its one layer: the bundle's canonical body (the resources, or
/// `{"meta":…,"resources":…}`), whose sha256 is the flotilla digest.
pub const BUNDLE_LAYER_MEDIA_TYPE: &str = "application/vnd.flotilla.bundle.v1+json";
/// The annotations that carry what differs between clusters sharing one layer.
pub const CLUSTER_ANNOTATION: &str = "dev.flotilla.bundle.cluster";
pub const REVISION_ANNOTATION: &str = "dev.flotilla.bundle.revision";
/// The document's `signature` object, as JSON.
pub const SIGNATURE_ANNOTATION: &str = "dev.flotilla.bundle.signature";

/// The empty config blob (`{}`) that artifacts without a config name.
pub const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
pub const EMPTY_DIGEST: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

/// The longest manifest read back (distribution refuses manifests over 4 MiB).
pub const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;

/// One blob: its bytes, their digest and media type.
#[derive(Debug, Clone)]
pub struct Blob {
    pub media_type: String,
    pub digest: Digest,
    pub bytes: Arc<[u8]>,
}

impl Blob {
    pub fn new(media_type: &str, bytes: impl Into<Arc<[u8]>>) -> Blob {
        let bytes = bytes.into();
        Blob {
            media_type: media_type.to_string(),
            digest: Digest::of(&bytes),
            bytes,
        }
    }

    /// The empty config, `{}`.
    pub fn empty() -> Blob {
        Blob::new(EMPTY_MEDIA_TYPE, &b"{}"[..])
    }

    fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.as_str().to_string(),
            size: self.bytes.len() as u64,
        }
    }
}

/// An artifact to push: a config blob, layers and annotations, under an artifact type
/// when it has one (a manifest without `artifactType` is what `flux push artifact`
/// writes, and what tools that predate the field expect).
#[derive(Debug, Clone)]
pub struct Artifact {
    pub artifact_type: Option<String>,
    pub config: Blob,
    pub layers: Vec<Blob>,
    pub annotations: BTreeMap<String, String>,
}

impl Artifact {
    /// The OCI image manifest naming the blobs (deterministic bytes).
    pub fn manifest(&self) -> Vec<u8> {
        let manifest = ImageManifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.to_string(),
            artifact_type: self.artifact_type.clone(),
            config: self.config.descriptor(),
            layers: self.layers.iter().map(Blob::descriptor).collect(),
            annotations: self.annotations.clone(),
        };
        // A struct of strings and numbers always serialises.
        serde_json::to_vec(&manifest).unwrap_or_default()
    }

    /// Every blob the manifest names, config first.
    pub fn blobs(&self) -> impl Iterator<Item = &Blob> {
        std::iter::once(&self.config).chain(&self.layers)
    }

    /// A cluster's bundle: its canonical body as the one layer, the cluster, revision
    /// and signature as annotations.
    pub fn bundle(
        cluster: &str,
        revision: &str,
        body: impl Into<Arc<[u8]>>,
        signature: Option<&BundleSignature>,
    ) -> Artifact {
        let mut annotations = BTreeMap::new();
        annotations.insert(CLUSTER_ANNOTATION.to_string(), cluster.to_string());
        annotations.insert(REVISION_ANNOTATION.to_string(), revision.to_string());
        if let Some(signature) = signature {
            annotations.insert(
                SIGNATURE_ANNOTATION.to_string(),
                serde_json::to_string(signature).unwrap_or_default(),
            );
        }
        Artifact {
            artifact_type: Some(BUNDLE_ARTIFACT_TYPE.to_string()),
            config: Blob::empty(),
            layers: vec![Blob::new(BUNDLE_LAYER_MEDIA_TYPE, body)],
            annotations,
        }
    }
}

/// An OCI image manifest as JSON has it: what [`Artifact::manifest`] writes, and what
/// a reader of any artifact (not only a bundle) gets back from [`ImageManifest::parse`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageManifest {
    /// Reads an image manifest (`digest` names it in the error), checking only that it
    /// is one: schema version 2 and, when given, the OCI manifest media type.
    pub fn parse(bytes: &[u8], digest: &str) -> Result<ImageManifest, OciError> {
        let bad = |reason: String| OciError::NotAnImageManifest {
            digest: digest.to_string(),
            reason,
        };
        let manifest: ImageManifest =
            serde_json::from_slice(bytes).map_err(|err| bad(err.to_string()))?;
        if manifest.schema_version != 2
            || (!manifest.media_type.is_empty() && manifest.media_type != MANIFEST_MEDIA_TYPE)
        {
            return Err(bad(format!(
                "its media type is {:?}, not {MANIFEST_MEDIA_TYPE}",
                manifest.media_type
            )));
        }
        Ok(manifest)
    }
}

/// A blob as a manifest names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

/// A bundle artifact's manifest, read back: where its layer is and what the
/// annotations say. Nothing in it is trusted yet: the agent verifies the document
/// [`BundleManifest::document`] makes as it verifies one from a hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleManifest {
    pub layer: Digest,
    pub layer_size: u64,
    pub cluster: String,
    pub revision: String,
    pub signature: Option<BundleSignature>,
}

impl BundleManifest {
    /// Reads the manifest `bytes` (whose digest is `digest`, for messages).
    pub fn parse(bytes: &[u8], digest: &str) -> Result<BundleManifest, OciError> {
        let bad = |reason: String| OciError::NotABundle {
            digest: digest.to_string(),
            reason,
        };
        let manifest: ImageManifest = serde_json::from_slice(bytes)
            .map_err(|err| bad(format!("not an OCI image manifest: {err}")))?;
        if manifest.schema_version != 2
            || (!manifest.media_type.is_empty() && manifest.media_type != MANIFEST_MEDIA_TYPE)
        {
            return Err(bad(format!(
                "its media type is {:?}, not {MANIFEST_MEDIA_TYPE}",
                manifest.media_type
            )));
        }
        if manifest.artifact_type.as_deref() != Some(BUNDLE_ARTIFACT_TYPE) {
            return Err(bad(format!(
                "its artifact type is {:?}, not {BUNDLE_ARTIFACT_TYPE}",
                manifest.artifact_type.unwrap_or_default()
            )));
        }
        let [layer] = manifest.layers.as_slice() else {
            return Err(bad(format!(
                "it has {} layers, not one",
                manifest.layers.len()
            )));
        };
        if layer.media_type != BUNDLE_LAYER_MEDIA_TYPE {
            return Err(bad(format!(
                "its layer's media type is {:?}, not {BUNDLE_LAYER_MEDIA_TYPE}",
                layer.media_type
            )));
        }
        let layer_digest = Digest::parse(&layer.digest).map_err(|_| {
            bad(format!(
                "its layer's digest {:?} is not sha256",
                layer.digest
            ))
        })?;
        if layer.size > MAX_BUNDLE_BYTES as u64 {
            return Err(bad(format!(
                "its layer is {} bytes, over the limit of {MAX_BUNDLE_BYTES}",
                layer.size
            )));
        }
        let annotation = |key: &str| manifest.annotations.get(key).cloned();
        let cluster = annotation(CLUSTER_ANNOTATION)
            .ok_or_else(|| bad(format!("it has no {CLUSTER_ANNOTATION} annotation")))?;
        let revision = annotation(REVISION_ANNOTATION)
            .ok_or_else(|| bad(format!("it has no {REVISION_ANNOTATION} annotation")))?;
        let signature = annotation(SIGNATURE_ANNOTATION)
            .map(|text| {
                serde_json::from_str::<BundleSignature>(&text)
                    .map_err(|err| bad(format!("its {SIGNATURE_ANNOTATION} annotation: {err}")))
            })
            .transpose()?;
        Ok(BundleManifest {
            layer: layer_digest,
            layer_size: layer.size,
            cluster,
            revision,
            signature,
        })
    }

    /// The served document this artifact stands for, as a hub would serve it:
    /// `{"apiVersion","kind":"Bundle","cluster","digest","revision","resources"[,
    /// "meta"]}` (with its `signature`), the digest being the layer's.
    /// A layer that is not canonical (spaced out, say) still makes a document that
    /// reads, so the agent refuses it for its digest and names the digest it claimed.
    pub fn document(&self, layer: &[u8]) -> Vec<u8> {
        let mut document = document_bytes(
            &self.cluster,
            &self.layer,
            &self.revision,
            layer.trim_ascii(),
        );
        if let Some(signature) = &self.signature {
            flotilla_core::bundle::add_signature(&mut document, signature);
        }
        document
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_blob_is_the_specifications() {
        let empty = Blob::empty();
        assert_eq!(empty.digest.as_str(), EMPTY_DIGEST);
        assert_eq!(&*empty.bytes, b"{}");
    }

    #[test]
    fn a_bundle_manifest_is_deterministic_and_reads_back() {
        let signature = BundleSignature {
            key_id: "k1".into(),
            sequence: 7,
            sig: "c2ln".into(),
        };
        let body: &[u8] = br#"[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}]"#;
        let artifact = Artifact::bundle("edge-1", "main@sha1:abc", body, Some(&signature));
        let manifest = artifact.manifest();
        assert_eq!(
            manifest,
            Artifact::bundle("edge-1", "main@sha1:abc", body, Some(&signature)).manifest()
        );
        let text = String::from_utf8(manifest.clone()).expect("utf-8");
        assert!(text.starts_with(r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.flotilla.bundle.v1","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}"#), "{text}");
        let read = BundleManifest::parse(&manifest, "m").expect("reads");
        assert_eq!(read.layer, Digest::of(body));
        assert_eq!(
            (read.cluster.as_str(), read.revision.as_str()),
            ("edge-1", "main@sha1:abc")
        );
        assert_eq!(read.signature, Some(signature));
        let document = read.document(body);
        let verified = flotilla_core::bundle::verify_document_parts(&document, Some("edge-1"))
            .expect("verifies");
        assert_eq!(verified.bundle.digest, Digest::of(body));
        assert_eq!(verified.signature.map(|s| s.sequence), Some(7));
    }

    #[test]
    fn an_artifact_without_a_type_writes_none_and_reads_back_as_an_image_manifest() {
        let mut artifact = Artifact::bundle("edge-1", "r", &b"[]"[..], None);
        artifact.artifact_type = None;
        let manifest = artifact.manifest();
        let text = String::from_utf8(manifest.clone()).expect("utf-8");
        assert!(!text.contains("artifactType"), "{text}");
        let read = ImageManifest::parse(&manifest, "m").expect("an image manifest");
        assert_eq!(read.artifact_type, None);
        assert_eq!(read.media_type, MANIFEST_MEDIA_TYPE);
        assert_eq!(read.config.digest, EMPTY_DIGEST);
        assert_eq!(read.layers.len(), 1);
        assert_eq!(read.layers[0].digest, Digest::of(b"[]").as_str());
        assert_eq!(
            read.annotations.get(CLUSTER_ANNOTATION).map(String::as_str),
            Some("edge-1")
        );
        let err = BundleManifest::parse(&manifest, "m").expect_err("not a bundle");
        assert!(err.to_string().contains("artifact type"), "{err}");
        let err = ImageManifest::parse(
            br#"{"schemaVersion":1,"config":{"mediaType":"a","digest":"b","size":0},"layers":[]}"#,
            "m",
        )
        .expect_err("not version 2");
        assert!(
            err.to_string().contains("not an OCI image manifest"),
            "{err}"
        );
    }

    #[test]
    fn other_manifests_are_not_bundles() {
        let mut artifact = Artifact::bundle("edge-1", "r", &b"[]"[..], None);
        artifact.artifact_type = Some("application/vnd.example.other".into());
        let err = BundleManifest::parse(&artifact.manifest(), "m").expect_err("refused");
        assert!(err.to_string().contains("artifact type"), "{err}");
        let mut artifact = Artifact::bundle("edge-1", "r", &b"[]"[..], None);
        artifact.layers.push(Blob::empty());
        assert!(BundleManifest::parse(&artifact.manifest(), "m").is_err());
        let mut artifact = Artifact::bundle("edge-1", "r", &b"[]"[..], None);
        artifact.annotations.remove(REVISION_ANNOTATION);
        assert!(BundleManifest::parse(&artifact.manifest(), "m").is_err());
        assert!(BundleManifest::parse(b"{}", "m").is_err());
    }
}
