//! OCI registries for flotilla: each cluster's bundle as an OCI artifact.
//!
//! One client, [`Registry`], speaks the OCI distribution API (v2) for both sides:
//! `flotilla publish --oci` pushes blobs and manifests, the edge agent (`--server
//! oci://…`) asks for its cluster's tag with a HEAD and fetches a manifest and a layer
//! only when the tag moved. Authentication is what registries expect: none, HTTP basic,
//! or a bearer token from the registry's token service (its `WWW-Authenticate`
//! challenge), with credentials from the Docker configuration file or given
//! ([`Credentials`]).
//!
//! [`artifact`] says what a flotilla bundle looks like in a registry: an OCI image
//! manifest of artifact type [`artifact::BUNDLE_ARTIFACT_TYPE`] whose one layer is the
//! bundle's canonical body (so the layer's OCI digest is the flotilla digest) and whose
//! annotations carry the cluster, revision and signature. [`Artifact`] is any set of
//! blobs with a manifest; other kinds of artifact are pushed through the same
//! [`Registry::push`].

pub mod artifact;
mod auth;
mod reference;
mod registry;

pub use artifact::{Artifact, Blob};
pub use auth::{Credentials, docker_config_path};
pub use reference::{Repository, valid_tag};
pub use registry::{Pushed, Registry, RegistryOptions};

/// The OCI image manifest's media type (distribution 2.x serves an OCI manifest only
/// to a client that names it in `Accept`).
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// What went wrong talking to a registry, or reading what it holds.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("invalid registry reference {text:?}: {reason}")]
    BadReference { text: String, reason: String },
    #[error(
        "plain HTTP to {host} refused: only a registry on this machine (localhost, 127.0.0.1, ::1) may be reached without TLS"
    )]
    PlainHttpNotLoopback { host: String },
    #[error("cannot read the Docker configuration {path}: {reason}")]
    DockerConfig { path: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        url: String,
        reason: String,
        /// The request timed out (rather than failing to connect or being cut).
        timed_out: bool,
    },
    #[error("{url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{what} from {url} is larger than {limit} bytes; refusing it")]
    TooLarge {
        what: &'static str,
        url: String,
        limit: usize,
    },
    #[error("{what} from {url} does not match its digest: asked for {expected}, got {actual}")]
    DigestMismatch {
        what: &'static str,
        url: String,
        expected: String,
        actual: String,
    },
    #[error("the manifest {digest} is not a flotilla bundle: {reason}")]
    NotABundle { digest: String, reason: String },
    #[error("the manifest {digest} is not an OCI image manifest: {reason}")]
    NotAnImageManifest { digest: String, reason: String },
}

impl OciError {
    /// The HTTP status the registry answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            OciError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the registry answered with content that cannot be taken (too large,
    /// not matching its digest, not a bundle), rather than failing to answer.
    pub fn is_bad_content(&self) -> bool {
        matches!(
            self,
            OciError::TooLarge { .. }
                | OciError::DigestMismatch { .. }
                | OciError::NotABundle { .. }
                | OciError::NotAnImageManifest { .. }
        )
    }
}
