//! The hub's TLS: its certificate, and with `--client-ca` client certificates bound to
//! clusters.
//!
//! A client certificate must be signed by the `--client-ca`; one that is not ends the
//! handshake. The paths that must stay reachable without one — `/healthz`, `/readyz`
//! and `/metrics` (probes and scrapers) and `/v1/hooks/git` (HMAC-signed by the Git
//! host) — are answered without a certificate; every other path needs one, and a
//! cluster's paths (`/v1/clusters/{cluster}/…`) need a certificate whose DNS names
//! (subject alternative names) include that cluster's name. The common name is not
//! read, as in every current TLS client. The bearer token is checked as well: the
//! certificate narrows what a token can do, it never replaces one. Operator paths
//! (`/v1/fleet`, `/v1/rollouts`, the web page) take any certificate of the CA, with an
//! admin token.

use std::path::Path;
use std::sync::Arc;

use axum::response::Response;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::HubError;
use flotilla_core::api::routes;

/// The TLS files `serve` is given.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// Requires client certificates signed by this CA (PEM), bound to clusters.
    pub client_ca: Option<std::path::PathBuf>,
}

/// The rustls server configuration for these files, with the ring provider.
pub fn server_config(files: &TlsFiles) -> Result<rustls::ServerConfig, HubError> {
    let tls_error = |message: String| HubError::Tls {
        cert: files.cert.display().to_string(),
        key: files.key.display().to_string(),
        message,
    };
    let certs = read_certificates(&files.cert).map_err(tls_error)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|err| tls_error(format!("cannot read the private key: {err}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| tls_error(err.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let ca_error = |message: String| HubError::ClientCa {
                path: ca.display().to_string(),
                message,
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certificates(ca).map_err(ca_error)? {
                roots
                    .add(cert)
                    .map_err(|err| ca_error(format!("not a usable CA certificate: {err}")))?;
            }
            // Verified when presented; whether one is needed depends on the path.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|err| ca_error(err.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|err| tls_error(err.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("{} is not PEM: {err}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// Paths answered without a client certificate.
const OPEN_PATHS: [&str; 4] = [
    routes::HEALTHZ,
    routes::READYZ,
    routes::METRICS,
    routes::GIT_HOOK,
];

/// With client certificates required: the answer refusing a request for `path` from
/// a client that presented `certificate` (verified against the CA during the
/// handshake), or `None` to let it through to the routes.
pub(crate) fn refuse(path: &str, certificate: Option<&CertificateDer<'_>>) -> Option<Response> {
    if OPEN_PATHS.contains(&path) {
        return None;
    }
    let Some(certificate) = certificate else {
        return Some(error(
            http::StatusCode::UNAUTHORIZED,
            "this hub requires a client certificate signed by its --client-ca: give the agent \
             --client-cert and --client-key"
                .to_string(),
        ));
    };
    let cluster = path
        .strip_prefix("/v1/clusters/")
        .and_then(|rest| rest.split('/').next());
    match cluster {
        Some(cluster) if !names_cluster(certificate, cluster) => Some(error(
            http::StatusCode::FORBIDDEN,
            format!(
                "the client certificate is not for cluster {cluster:?}: a cluster's paths need a \
                 certificate with {cluster:?} among its DNS names (subject alternative names)"
            ),
        )),
        _ => None,
    }
}

/// Whether the certificate's DNS names include `cluster`.
fn names_cluster(certificate: &CertificateDer<'_>, cluster: &str) -> bool {
    let Ok(name) = ServerName::try_from(cluster) else {
        return false;
    };
    if !matches!(name, ServerName::DnsName(_)) {
        return false;
    }
    webpki::EndEntityCert::try_from(certificate)
        .is_ok_and(|cert| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

fn error(status: http::StatusCode, message: String) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
