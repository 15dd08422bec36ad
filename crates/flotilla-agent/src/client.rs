//! Talking to the hub: conditional, long-polling GETs of the cluster's bundle and POSTs
//! of status reports over HTTP(S) (reqwest with rustls), reading the same paths from
//! a `file://` folder laid out by `flotilla publish`, or asking an OCI registry
//! (`oci://`, where `publish --oci` pushed) for the cluster's tag: one HEAD per poll,
//! and the manifest and layer, by digest, only when the tag moved.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};
use url::Url;

use flotilla_core::api;
// A bundle larger than the limit the renderer keeps is refused.
use flotilla_core::bundle::{Digest, MAX_BUNDLE_BYTES, features};
use flotilla_core::dcz;
use flotilla_core::status::StatusReport;

use crate::wait::Ending;

/// How much longer than the long-poll wait a request may take before it is abandoned.
const REQUEST_GRACE: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a connection stays silent before TCP probes it. The HTTP library's
/// default (15 s) would send a probe and its acknowledgement, about 100 bytes with
/// their TCP/IP headers, every 15 s of a held poll: more than the poll itself. A
/// held poll is silent for up to its wait, and the request's own timeout finds a
/// dead connection, so probes start only past the longest wait `auto` asks for.
const TCP_KEEPALIVE: Duration = Duration::from_secs(300);
/// How long an unused connection is kept for the next request. The HTTP library's
/// default (90 s) counts a held poll's time as unused on an HTTP/2 connection, so
/// every poll held longer than that would open a new connection (a TCP handshake and
/// the HTTP/2 preface and settings, and with TLS a handshake of several KB).
const POOL_IDLE: Duration = Duration::from_secs(300);

/// Where bundles come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Server {
    /// A hub (or a static web server holding `flotilla publish` output) at this base URL.
    Http(Url),
    /// A `flotilla publish` folder on a local path (an air-gapped site).
    File(PathBuf),
    /// A repository of an OCI registry holding `publish --oci` artifacts, tagged by
    /// cluster.
    Oci(flotilla_oci::Repository),
}

impl Server {
    /// Parses `http://…`, `https://…`, `file:///…` or `oci://REGISTRY/REPOSITORY`.
    pub fn parse(text: &str) -> Result<Server, ClientError> {
        if text.starts_with("oci://") {
            return flotilla_oci::Repository::parse(text)
                .map(Server::Oci)
                .map_err(|err| ClientError::BadServer {
                    url: text.to_string(),
                    reason: err.to_string(),
                });
        }
        let url = Url::parse(text).map_err(|err| ClientError::BadServer {
            url: text.to_string(),
            reason: err.to_string(),
        })?;
        match url.scheme() {
            "http" | "https" => Ok(Server::Http(url)),
            "file" => url
                .to_file_path()
                .map(Server::File)
                .map_err(|()| ClientError::BadServer {
                    url: text.to_string(),
                    reason: "a file:// URL needs an absolute local path, like file:///srv/fleet"
                        .into(),
                }),
            other => Err(ClientError::BadServer {
                url: text.to_string(),
                reason: format!("unsupported scheme {other:?}: use http, https, file or oci"),
            }),
        }
    }

    /// True when the server can receive status reports (a hub, not a folder).
    pub fn accepts_status(&self) -> bool {
        matches!(self, Server::Http(_))
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Server::Http(url) => write!(f, "{url}"),
            Server::File(path) => write!(f, "file://{}", path.display()),
            Server::Oci(repository) => write!(f, "oci://{repository}"),
        }
    }
}

/// A configuration error found before anything was fetched.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid --server {url:?}: {reason}")]
    BadServer { url: String, reason: String },
    #[error(
        "the token file {path} does not exist: make one with `flotilla token create {cluster} > \
         {path}` (where the hub keeps its --state-dir)"
    )]
    NoTokenFile { path: String, cluster: String },
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the token file {path} is empty; put the token from `flotilla token create` in it")]
    EmptyToken { path: PathBuf },
    #[error(
        "the token file {path} does not hold a flotilla token (flt_…){found}; write just the \
         token into it: `flotilla token create CLUSTER > FILE`"
    )]
    NotAToken { path: PathBuf, found: String },
    #[error("--token-file is required with an http(s) server")]
    NoToken,
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("--ca-file {path}: {reason}")]
    CaFile { path: PathBuf, reason: String },
    #[error("--client-cert {cert} / --client-key {key}: {reason}")]
    ClientCert {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("{flag} needs an https:// server, not {server}")]
    TlsFlagWithoutTls { flag: &'static str, server: String },
    #[error(transparent)]
    Oci(#[from] flotilla_oci::OciError),
}

/// How the agent authenticates the hub and itself over TLS. The system's trust store
/// (with `SSL_CERT_FILE` and `SSL_CERT_DIR` honoured) is always trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// A PEM file of CA certificates trusted besides the system's store.
    pub ca_file: Option<PathBuf>,
    /// This cluster's client certificate and its private key (PEM), for a hub that
    /// requires them (`serve --client-ca`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl TlsOptions {
    /// Refuses TLS settings for a server that does not use TLS.
    pub fn check(&self, server: &Server) -> Result<(), ClientError> {
        let is_https = matches!(server, Server::Http(url) if url.scheme() == "https");
        let is_oci = matches!(server, Server::Oci(_));
        let flags = [
            ("--ca-file", self.ca_file.is_some() && !is_oci),
            ("--client-cert", self.client_cert.is_some()),
        ];
        for (flag, given) in flags {
            if given && !is_https {
                return Err(ClientError::TlsFlagWithoutTls {
                    flag,
                    server: server.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Adds the trusted CAs and the client certificate to an HTTP client being built
    /// (the agent's, and the operator commands' that talk to a hub).
    pub fn apply(
        &self,
        mut builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, ClientError> {
        if let Some(path) = &self.ca_file {
            let ca_error = |reason: String| ClientError::CaFile {
                path: path.clone(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|err| ca_error(err.to_string()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|err| ca_error(format!("not PEM certificates: {err}")))?;
            if certs.is_empty() {
                return Err(ca_error("holds no PEM certificate".into()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &self.client_cert {
            let cert_error = |reason: String| ClientError::ClientCert {
                cert: cert.clone(),
                key: key.clone(),
                reason,
            };
            let mut pem = std::fs::read(cert).map_err(|err| cert_error(err.to_string()))?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).map_err(|err| cert_error(err.to_string()))?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|err| cert_error(format!("not a PEM certificate and key: {err}")))?;
            builder = builder.identity(identity);
        }
        Ok(builder)
    }
}

/// What one fetch brought back.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetched {
    /// The bundle has not changed (304, or a folder whose file is unchanged).
    NotModified,
    /// A bundle document, not yet verified, and the ETag it came with.
    Bundle { body: Vec<u8>, etag: Option<String> },
    /// A delta (RFC 9842 `dcz`) against the bundle named by
    /// [`HubClient::offer_dictionary`], not yet rebuilt or verified.
    Delta { body: Vec<u8>, etag: Option<String> },
}

/// Why a fetch or a report failed. Every variant says what to do next by its kind:
/// see [`FetchError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot reach {server}: {reason}")]
    Unreachable {
        server: String,
        reason: String,
        /// How the request ended when no answer had begun (`Other` once one had).
        ending: Ending,
    },
    #[error("{server} answered {status}: {message}")]
    Status {
        server: String,
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("cannot read {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{server}: {source}")]
    Registry {
        server: String,
        source: flotilla_oci::OciError,
        /// The digest of the bundle refused, when the manifest named it (its layer's):
        /// the layer was too large or did not match it.
        claimed: Option<Digest>,
    },
    #[error("the bundle from {server} is larger than {MAX_BUNDLE_BYTES} bytes; refusing it")]
    TooLarge {
        server: String,
        /// The ETag it came with (on HTTP), which names its digest.
        etag: Option<String>,
    },
}

/// How the agent should react to a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Network trouble, 5xx, 429, a missing file: back off and try again.
    Transient,
    /// 401 or 403: the token is wrong. Say so loudly and retry slowly.
    Auth,
}

impl FetchError {
    pub fn kind(&self) -> FailureKind {
        match self {
            FetchError::Status { status, .. } if *status == 401 || *status == 403 => {
                FailureKind::Auth
            }
            FetchError::Registry { source, .. } if matches!(source.status(), Some(401 | 403)) => {
                FailureKind::Auth
            }
            _ => FailureKind::Transient,
        }
    }

    /// How a request that got no answer ended: cut on the way (a gateway's 502 or
    /// 504, the connection closed before an answer), silent (timed out), or else.
    pub fn ending(&self) -> Ending {
        match self {
            FetchError::Unreachable { ending, .. } => *ending,
            FetchError::Status { status, .. } if *status == 502 || *status == 504 => Ending::Cut,
            _ => Ending::Other,
        }
    }

    /// Whether the server answered, but with what this agent cannot take: a bundle
    /// over its size limit, or a refusal saying why (`409`: the bundle needs a newer
    /// agent). The agent reports it, so the hub shows why, and keeps what it runs.
    pub fn is_refusal(&self) -> bool {
        match self {
            FetchError::TooLarge { .. } | FetchError::Status { status: 409, .. } => true,
            FetchError::Registry { source, .. } => source.is_bad_content(),
            _ => false,
        }
    }

    /// The digest the refused bundle's ETag names, if it named one.
    fn refused_etag(&self) -> Option<&str> {
        match self {
            FetchError::TooLarge { etag, .. } => etag.as_deref(),
            _ => None,
        }
    }

    /// The digest of the refused bundle, if its answer named one: the ETag of an
    /// HTTP answer, the layer a registry's manifest points at.
    pub fn refused_digest(&self) -> Option<Digest> {
        match self {
            FetchError::Registry { claimed, .. } => claimed.clone(),
            _ => self.refused_etag().and_then(crate::digest_of_etag),
        }
    }

    /// The wait the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            FetchError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A reader that keeps a copy of what is read from it.
struct Copied<'a, R> {
    from: R,
    into: &'a mut Vec<u8>,
}

impl<R: Read> Read for Copied<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.from.read(buf)?;
        self.into.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// A client for one cluster's paths on one server. Clones share the connection pool.
#[derive(Debug, Clone)]
pub struct HubClient {
    server: Server,
    cluster: String,
    token: Option<Token>,
    http: reqwest::Client,
    /// The digest of the raw document last returned, to answer "not modified" for
    /// servers that cannot (a folder, a static server that ignores If-None-Match).
    last_body: Option<Digest>,
    /// The digest whose bundle the agent holds, offered to a hub as the dictionary of a
    /// delta (`Available-Dictionary`); `None`: full documents only.
    dictionary: Option<Digest>,
    /// The registry client of an `oci://` server.
    registry: Option<flotilla_oci::Registry>,
    /// Whether the server is a static mirror (a folder, or an HTTP server whose
    /// bundle answers carry no `X-Flotilla-Revision`): its deltas are files of their
    /// own, `v1/clusters/<cluster>/deltas/<base>` (`publish --deltas`).
    mirror: bool,
    /// The base whose delta the mirror did not have: not asked for again while the
    /// agent holds that base (a mirror published without deltas costs one request
    /// more per change, not per poll).
    no_delta_from: Option<Digest>,
    /// The document (by its sha256) held when the mirror had no
    /// `deltas/current.sha256` (output of an older flotilla): not asked for again until
    /// another is taken.
    no_sha256_for: Option<Digest>,
    /// The document (by its sha256) the mirror's `deltas/current.sha256` named at the
    /// last poll, when it named one other than the document held: a delta that then
    /// rebuilds the held document is a stale file (left from an older publish), not
    /// news that nothing changed.
    mirror_named_other: Option<Digest>,
    /// The last bundle request was answered 304 by the server itself (a hub's answer
    /// that the bundle held, whose ETag was asked for, is still the one it serves),
    /// not judged unchanged here from a document sent again.
    server_not_modified: bool,
    /// The document last handed up again only so that the caller learns the static
    /// server's ETag for it (see [`HubClient::fetch_bundle`]).
    etag_asked_for: Option<Digest>,
    /// Whether the hub said, in its answer to a report, that it takes gzip bodies
    /// (`Accept-Encoding` on a response, RFC 7694): later reports are compressed. A
    /// report lists every resource's state, so it is often the largest thing an agent
    /// sends; a hub that never said so gets them as they are.
    gzip_reports: bool,
}

/// Reports smaller than this go as they are: gzip's framing and the header would
/// cost about as much as they save.
const GZIP_REPORTS_FROM: usize = 512;

/// `bytes` as one gzip member.
/// The report as JSON, gzipped when `gzip` and it comes to [`GZIP_REPORTS_FROM`] bytes
/// or more: (body, whether gzipped). A gzipped report is compressed as it is
/// serialised, never held whole as text (a report of 100,000 resources is about 10 MB
/// of JSON and a few hundred KB gzipped).
fn report_body(report: &StatusReport, gzip: bool) -> (Vec<u8>, bool) {
    let plain = || serde_json::to_vec(report).expect("a report serializes");
    if !gzip {
        return (plain(), false);
    }
    /// Counts the bytes written through it.
    struct Counted<W>(W, usize);
    impl<W: std::io::Write> std::io::Write for Counted<W> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let written = self.0.write(bytes)?;
            self.1 += written;
            Ok(written)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Buffered: the serialiser writes in small pieces, the encoder is best fed larger.
    let mut buffered = std::io::BufWriter::with_capacity(32 * 1024, Counted(encoder, 0));
    serde_json::to_writer(&mut buffered, report).expect("a report serializes into memory");
    let counted = buffered
        .into_inner()
        .map_err(std::io::IntoInnerError::into_error)
        .expect("writing into memory");
    if counted.1 < GZIP_REPORTS_FROM {
        // Small: sent as it is (serialised again, cheaply).
        return (plain(), false);
    }
    (counted.0.finish().expect("writing into memory"), true)
}

/// Whether a response's `Accept-Encoding` (RFC 7694) names gzip.
fn takes_gzip(headers: &reqwest::header::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(api::accepted_encodings)
        .any(|coding| coding.eq_ignore_ascii_case("gzip"))
}

#[derive(Debug, Clone)]
struct Token {
    path: PathBuf,
    value: String,
    /// Set after a 401/403 so the file is read again before the next request: a
    /// rotated token is picked up without restarting the agent.
    stale: bool,
}

impl HubClient {
    pub fn new(
        server: Server,
        cluster: &str,
        token_file: Option<&Path>,
    ) -> Result<HubClient, ClientError> {
        HubClient::with_tls(server, cluster, token_file, &TlsOptions::default())
    }

    /// [`HubClient::new`] with a CA to trust and a client certificate.
    pub fn with_tls(
        server: Server,
        cluster: &str,
        token_file: Option<&Path>,
        tls: &TlsOptions,
    ) -> Result<HubClient, ClientError> {
        tls.check(&server)?;
        let token = match token_file {
            Some(path) => Some(Token {
                path: path.to_path_buf(),
                value: read_token(path).map_err(|err| match err {
                    ClientError::TokenFile { path, source }
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        ClientError::NoTokenFile {
                            path: path.display().to_string(),
                            cluster: cluster.to_string(),
                        }
                    }
                    other => other,
                })?,
                stale: false,
            }),
            None if matches!(server, Server::Http(_)) => return Err(ClientError::NoToken),
            None => None,
        };
        // A hub reached over TLS is never left for plain HTTP: a redirect to an
        // `http://` address is refused rather than followed in clear.
        let https_only = matches!(&server, Server::Http(url) if url.scheme() == "https");
        let http = tls.apply(http_client().https_only(https_only))?.build()?;
        let registry = match &server {
            Server::Oci(repository) => Some(flotilla_oci::Registry::new(
                repository.clone(),
                http.clone(),
                flotilla_oci::RegistryOptions::default(),
            )?),
            _ => None,
        };
        let mirror = matches!(server, Server::File(_));
        Ok(HubClient {
            server,
            cluster: cluster.to_string(),
            token,
            http,
            last_body: None,
            dictionary: None,
            mirror,
            no_delta_from: None,
            etag_asked_for: None,
            no_sha256_for: None,
            mirror_named_other: None,
            server_not_modified: false,
            registry,
            gzip_reports: false,
        })
    }

    /// How an `oci://` server is reached: credentials, and plain HTTP for a registry
    /// on this machine. Nothing for other servers.
    pub fn with_registry_options(
        mut self,
        options: flotilla_oci::RegistryOptions,
    ) -> Result<HubClient, ClientError> {
        if let Server::Oci(repository) = &self.server {
            self.registry = Some(flotilla_oci::Registry::new(
                repository.clone(),
                self.http.clone(),
                options,
            )?);
        }
        Ok(self)
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Speaks HTTP/2 to an `http://` server from the first byte (prior knowledge), for
    /// hubs reached without TLS. An `https://` server is offered HTTP/2 in the TLS
    /// handshake anyway and chooses. On a kept connection HTTP/2 compresses repeated
    /// headers to a few bytes, which is most of what an idle agent sends.
    pub fn with_http2_prior_knowledge(mut self) -> Result<HubClient, ClientError> {
        if matches!(&self.server, Server::Http(url) if url.scheme() == "http") {
            self.http = http_client().http2_prior_knowledge().build()?;
        }
        Ok(self)
    }

    /// Whether the server is a static mirror (a folder, or a web server holding
    /// `publish` output, as its last answer showed), which cannot hold a poll.
    pub fn is_mirror(&self) -> bool {
        self.mirror
    }

    /// Whether the last bundle request was answered 304 by the server itself.
    pub fn server_said_not_modified(&self) -> bool {
        self.server_not_modified
    }

    /// Offers the bundle of `digest` as the base of deltas in the next requests to a
    /// hub (`Available-Dictionary`, and `dcz` in `Accept-Encoding`); `None` asks for
    /// full documents only.
    pub fn offer_dictionary(&mut self, digest: Option<Digest>) {
        self.dictionary = digest;
    }

    /// Notes `document`, rebuilt from a delta and held, as the document last
    /// fetched: a server that later offers these very bytes again is answered "not
    /// modified", and one that goes back to the document before them is not.
    pub fn fetched_document(&mut self, document: &[u8]) {
        self.last_body = Some(Digest::of(document));
    }

    /// Forgets the document last fetched (one the caller could not keep): the next
    /// one is taken as new even when it is byte for byte the same.
    pub fn forget_fetched_document(&mut self) {
        self.last_body = None;
    }

    /// Whether `body` is byte for byte the document fetched last, while the caller
    /// holds a bundle (`if_none_match`); remembers `body` otherwise.
    fn unchanged(&mut self, body: &[u8], if_none_match: Option<&str>) -> bool {
        self.unchanged_digest(Digest::of(body), if_none_match)
    }

    /// [`HubClient::unchanged`] of a document whose digest is `seen`.
    fn unchanged_digest(&mut self, seen: Digest, if_none_match: Option<&str>) -> bool {
        if if_none_match.is_some() && self.last_body.as_ref() == Some(&seen) {
            return true;
        }
        self.last_body = Some(seen);
        false
    }

    /// Fetches the cluster's bundle unless its ETag is still `if_none_match`; a hub
    /// holds the request up to `wait` for a change.
    pub async fn fetch_bundle(
        &mut self,
        if_none_match: Option<&str>,
        wait: Duration,
    ) -> Result<Fetched, FetchError> {
        self.server_not_modified = false;
        if self.mirror_unchanged(if_none_match).await? {
            return Ok(Fetched::NotModified);
        }
        if let Some(delta) = self.fetch_mirror_delta().await {
            return Ok(delta);
        }
        match &self.server {
            Server::Http(base) => {
                let mut url = api_url(base, &api::bundle(&self.cluster));
                if !wait.is_zero() {
                    url.query_pairs_mut()
                        .append_pair("wait", &format!("{}s", wait.as_secs().max(1)));
                }
                let mut request = self
                    .http
                    .get(url)
                    .timeout(wait + REQUEST_GRACE)
                    .header(header::ACCEPT, "application/json")
                    .header(features::HEADER, crate::FEATURES.join(", "));
                if let Some(etag) = if_none_match {
                    request = request.header(header::IF_NONE_MATCH, etag);
                }
                if let Some(value) = self.dictionary.as_ref().and_then(dcz::available_dictionary) {
                    // Set here, the HTTP client leaves Accept-Encoding alone; it still
                    // decodes gzip itself and hands a dcz body over as it came.
                    request = request
                        .header(dcz::AVAILABLE_DICTIONARY, value)
                        .header(header::ACCEPT_ENCODING, "gzip, dcz");
                }
                request = self.authorise(request);
                let response = request.send().await.map_err(|err| self.unanswered(err))?;
                let status = response.status();
                if status == StatusCode::NOT_MODIFIED {
                    self.server_not_modified = true;
                    return Ok(Fetched::NotModified);
                }
                if !status.is_success() {
                    return Err(self.status_error(response).await);
                }
                let etag = response
                    .headers()
                    .get(header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                // A hub names the revision of every bundle it sends; a static server
                // does not.
                self.mirror = !response.headers().contains_key(api::REVISION_HEADER);
                let delta = response
                    .headers()
                    .get(header::CONTENT_ENCODING)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(dcz::ENCODING.as_bytes()));
                let body = self.read_limited(response).await?;
                if delta {
                    return Ok(Fetched::Delta { body, etag });
                }
                // A server that ignores If-None-Match (a plain static server) sends the
                // same document again: answered as "not modified" without parsing it,
                // unless it has an ETag of its own while it was asked with the
                // bundle's digest (the agent does not know that ETag yet, after a
                // restart say): then the caller takes the document (judged as the same
                // bundle) and learns the ETag, so that the server answers the next
                // polls with 304 and no body.
                let learns_etag = etag
                    .as_deref()
                    .is_some_and(|etag| Some(etag) != if_none_match)
                    && if_none_match
                        .is_some_and(|asked| Digest::parse(asked.trim_matches('"')).is_ok());
                if self.unchanged(&body, if_none_match) {
                    // Once per document: one the caller refuses gives it no ETag to
                    // keep, and is not judged again at every poll.
                    let seen = self.last_body.clone();
                    if !learns_etag || self.etag_asked_for == seen {
                        return Ok(Fetched::NotModified);
                    }
                    self.etag_asked_for = seen;
                }
                Ok(Fetched::Bundle { body, etag })
            }
            Server::File(root) => {
                let path = in_folder(root, &api::bundle(&self.cluster));
                let file_error = |source| FetchError::File {
                    path: path.clone(),
                    source,
                };
                let too_large = || FetchError::TooLarge {
                    server: self.server.to_string(),
                    etag: None,
                };
                let mut file = std::fs::File::open(&path).map_err(file_error)?;
                let size = file.metadata().map_err(file_error)?.len();
                if size > MAX_BUNDLE_BYTES as u64 {
                    return Err(too_large());
                }
                // A folder is read again once per wait and is mostly unchanged: its
                // digest is taken as it is read, and the document is held only when
                // it changed (a bundle near the size limit would otherwise be read
                // into memory, and dropped, every time).
                if if_none_match.is_some()
                    && let Some(last) = &self.last_body
                {
                    if Digest::of_reader(&file).map_err(file_error)? == *last {
                        return Ok(Fetched::NotModified);
                    }
                    file.rewind().map_err(file_error)?;
                }
                // Hashed as it is read: the digest is of these very bytes.
                let mut body = Vec::with_capacity(size as usize);
                let seen = Digest::of_reader(Copied {
                    from: file.take(MAX_BUNDLE_BYTES as u64 + 1),
                    into: &mut body,
                })
                .map_err(file_error)?;
                if body.len() > MAX_BUNDLE_BYTES {
                    return Err(too_large());
                }
                if self.unchanged_digest(seen, if_none_match) {
                    return Ok(Fetched::NotModified);
                }
                Ok(Fetched::Bundle { body, etag: None })
            }
            Server::Oci(_) => self.fetch_from_registry(if_none_match).await,
        }
    }

    /// The document the mirror's `deltas/current.sha256` named at this poll, when it
    /// is not the one held (see [`HubClient::mirror_named_other`]).
    pub fn mirror_names_another(&self) -> Option<&Digest> {
        self.mirror_named_other.as_ref()
    }

    /// Whether a static mirror's `deltas/current.sha256` names the document this agent
    /// took (or refused) last, while it holds a bundle: then nothing changed, and
    /// neither the document nor a delta is read (a mirror's delta from a bundle to
    /// itself would have to be rebuilt, a document as large as the bundle, to find
    /// that out). A mirror without the file (404, or 403 from a bucket that hides
    /// missing keys) is asked for it again only once another document is taken; a
    /// mirror that does not answer at all is an error, as the document's request
    /// would be.
    async fn mirror_unchanged(&mut self, if_none_match: Option<&str>) -> Result<bool, FetchError> {
        /// `sha256:`, 64 hexadecimal digits and a newline; anything longer is not one.
        const LONGEST: usize = 128;
        self.mirror_named_other = None;
        let Some(held) = self.last_body.clone() else {
            return Ok(false);
        };
        if !self.mirror || if_none_match.is_none() || self.no_sha256_for.as_ref() == Some(&held) {
            return Ok(false);
        }
        let segments = api::current_sha256(&self.cluster);
        let text = match &self.server {
            Server::File(root) => {
                use std::io::Read as _;
                let path = in_folder(root, &segments);
                let mut text = Vec::new();
                match std::fs::File::open(&path)
                    .and_then(|file| file.take(LONGEST as u64 + 1).read_to_end(&mut text))
                {
                    Ok(_) => Some(text),
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
                    // Read as the document would be, which says what is wrong.
                    Err(_) => return Ok(false),
                }
            }
            Server::Http(server) => {
                let request = self.mirror_file_request(api_url(server, &segments));
                let mut response = request.send().await.map_err(|err| self.unanswered(err))?;
                match response.status() {
                    status if status.is_success() => {
                        let mut text = Vec::new();
                        while let Some(chunk) = response.chunk().await.transpose() {
                            let Ok(chunk) = chunk else {
                                // Cut off: this poll reads the document's way.
                                return Ok(false);
                            };
                            text.extend_from_slice(&chunk);
                            if text.len() > LONGEST {
                                break;
                            }
                        }
                        Some(text)
                    }
                    StatusCode::NOT_FOUND | StatusCode::FORBIDDEN | StatusCode::GONE => None,
                    // Refused otherwise: the document's request says why.
                    _ => return Ok(false),
                }
            }
            Server::Oci(_) => return Ok(false),
        };
        let named = text
            .filter(|text| text.len() <= LONGEST)
            .and_then(|text| Digest::parse(String::from_utf8_lossy(&text).trim()).ok());
        self.mirror_named_other = named.clone().filter(|named| *named != held);
        Ok(match named {
            Some(named) => named == held,
            None => {
                tracing::debug!(
                    server = %self.server, cluster = %self.cluster,
                    "the mirror has no deltas/current.sha256 (or not one); reading its delta or document"
                );
                self.no_sha256_for = Some(held);
                false
            }
        })
    }

    /// From a static mirror, the delta from the bundle offered as the dictionary to
    /// the current one, when the mirror has it; `None`: fetch the document (no
    /// mirror, nothing offered, no such delta, or it could not be read).
    async fn fetch_mirror_delta(&mut self) -> Option<Fetched> {
        let base = self.dictionary.clone()?;
        if !self.mirror || self.no_delta_from.as_ref() == Some(&base) {
            return None;
        }
        let segments = api::delta(&self.cluster, base.as_str());
        let body = match &self.server {
            Server::File(root) => {
                // Read no further than a bundle may be: a delta over it is refused below.
                use std::io::Read as _;
                let path = in_folder(root, &segments);
                let mut body = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|file| {
                        file.take(MAX_BUNDLE_BYTES as u64 + 1)
                            .read_to_end(&mut body)
                    })
                    .ok()
                    .map(|_| body)
            }
            Server::Http(server) => {
                let request = self.mirror_file_request(api_url(server, &segments));
                let response = request.send().await.ok()?;
                if response.status().is_success() {
                    self.read_limited(response).await.ok()
                } else {
                    None
                }
            }
            Server::Oci(_) => None,
        };
        match body {
            Some(body) if body.len() <= MAX_BUNDLE_BYTES => {
                Some(Fetched::Delta { body, etag: None })
            }
            _ => {
                tracing::debug!(base = %base, "the mirror has no delta from the bundle this agent runs; fetching the bundle");
                self.no_delta_from = Some(base);
                None
            }
        }
    }

    /// The cluster's tag asked for with a HEAD; its manifest and layer fetched by
    /// digest only when the tag names another manifest than `if_none_match`'s. The
    /// "ETag" is the manifest's digest as `"oci:sha256:…"` (no flotilla digest, so it
    /// is not compared with the bundle's), and the document is the one a hub would
    /// serve, rebuilt from the layer and the annotations, for the caller to verify.
    async fn fetch_from_registry(
        &mut self,
        if_none_match: Option<&str>,
    ) -> Result<Fetched, FetchError> {
        let server = self.server.to_string();
        let Some(registry) = &self.registry else {
            return Err(FetchError::Unreachable {
                server,
                reason: "no registry client".into(),
                ending: Ending::Other,
            });
        };
        let failed = |source: flotilla_oci::OciError| match source {
            flotilla_oci::OciError::Unreachable { reason, .. } => FetchError::Unreachable {
                server: server.clone(),
                reason,
                ending: Ending::Other,
            },
            source => FetchError::Registry {
                server: server.clone(),
                source,
                claimed: None,
            },
        };
        let no_tag = || FetchError::Status {
            server: server.clone(),
            status: 404,
            message: format!(
                "the registry has no tag {:?} (has `flotilla publish --oci` pushed this cluster?)",
                self.cluster
            ),
            retry_after: None,
        };
        let Some(manifest_digest) = registry
            .head_manifest(&self.cluster)
            .await
            .map_err(failed)?
        else {
            return Err(no_tag());
        };
        let etag = format!("\"oci:{manifest_digest}\"");
        if if_none_match == Some(etag.as_str()) {
            return Ok(Fetched::NotModified);
        }
        let Some((bytes, _)) = registry
            .get_manifest(manifest_digest.as_str())
            .await
            .map_err(failed)?
        else {
            return Err(no_tag());
        };
        let manifest =
            flotilla_oci::artifact::BundleManifest::parse(&bytes, manifest_digest.as_str())
                .map_err(failed)?;
        // No more than the manifest says the layer holds (its digest is checked after).
        let layer_limit = usize::try_from(manifest.layer_size)
            .unwrap_or(usize::MAX)
            .min(MAX_BUNDLE_BYTES);
        let layer = registry
            .get_blob(&manifest.layer, layer_limit)
            .await
            .map_err(|source| match failed(source) {
                FetchError::Registry { server, source, .. } => FetchError::Registry {
                    server,
                    source,
                    claimed: Digest::parse(manifest.layer.as_str()).ok(),
                },
                other => other,
            })?;
        Ok(Fetched::Bundle {
            body: manifest.document(&layer),
            etag: Some(etag),
        })
    }

    /// Posts a status report to the hub. A folder has nowhere to post to: the
    /// report is only kept in the state folder.
    pub async fn send_status(&mut self, report: &StatusReport) -> Result<(), FetchError> {
        let Server::Http(base) = &self.server else {
            return Ok(());
        };
        let url = api_url(base, &api::status(&self.cluster));
        let (body, gzipped) = report_body(report, self.gzip_reports);
        let mut request = self
            .http
            .post(url)
            .timeout(REQUEST_GRACE)
            .header(header::CONTENT_TYPE, "application/json");
        if gzipped {
            request = request.header(header::CONTENT_ENCODING, "gzip");
        }
        request = request.body(body);
        let request = self.authorise(request);
        let response = request.send().await.map_err(|err| self.unanswered(err))?;
        if response.status().is_success() {
            self.gzip_reports = takes_gzip(response.headers());
            Ok(())
        } else {
            Err(self.status_error(response).await)
        }
    }

    /// A GET of one of a static mirror's own files (its sha256, a delta), as it is
    /// stored: small, or compressed already.
    fn mirror_file_request(&mut self, url: Url) -> reqwest::RequestBuilder {
        let request = self
            .http
            .get(url)
            .timeout(REQUEST_GRACE)
            .header(header::ACCEPT_ENCODING, "identity");
        self.authorise(request)
    }

    fn authorise(&mut self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let Some(token) = &mut self.token else {
            return request;
        };
        if token.stale {
            match read_token(&token.path) {
                Ok(value) => token.value = value,
                Err(err) => tracing::error!(error = %err, "keeping the previous token"),
            }
            token.stale = false;
        }
        request.bearer_auth(&token.value)
    }

    /// A request that failed before any answer began: a connection that could not
    /// be made, one that went silent (timed out), or one ended on the way.
    fn unanswered(&self, err: reqwest::Error) -> FetchError {
        let ending = if err.is_connect() {
            Ending::Other
        } else if err.is_timeout() {
            Ending::Silent
        } else {
            Ending::Cut
        };
        self.unreachable(err, ending)
    }

    fn unreachable(&self, err: reqwest::Error, ending: Ending) -> FetchError {
        let reason = if err.is_timeout() {
            "the request timed out".to_string()
        } else {
            let chain = error_chain(&err);
            let hint = tls_hint(&chain);
            chain + hint
        };
        FetchError::Unreachable {
            server: self.server.to_string(),
            reason,
            ending,
        }
    }

    async fn status_error(&mut self, response: reqwest::Response) -> FetchError {
        let status = response.status();
        if (status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN)
            && let Some(token) = &mut self.token
        {
            token.stale = true;
        }
        let retry_after = retry_after(response.headers());
        let url = response.url().to_string();
        let text = response.text().await.unwrap_or_default();
        let mut message = error_message(&text);
        match status.as_u16() {
            401 => message.push_str(
                " (the token was not accepted: check --token-file, or create one with `flotilla token create`)",
            ),
            403 => message.push_str(&format!(
                " (the token is not valid for cluster {:?}: check --cluster and --token-file)",
                self.cluster
            )),
            404 => message.push_str(&format!(
                " (the hub does not serve cluster {:?}: is it in the fleet repository?)",
                self.cluster
            )),
            _ => {}
        }
        FetchError::Status {
            server: url,
            status: status.as_u16(),
            message,
            retry_after,
        }
    }

    async fn read_limited(&self, mut response: reqwest::Response) -> Result<Vec<u8>, FetchError> {
        let etag = response
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let too_large = || FetchError::TooLarge {
            server: self.server.to_string(),
            etag: etag.clone(),
        };
        if response
            .content_length()
            .is_some_and(|n| n > MAX_BUNDLE_BYTES as u64)
        {
            return Err(too_large());
        }
        // Sized once when the length is announced (within the limit, checked above):
        // growing by doubling would ask for up to twice the body, and copy it.
        let announced = response.content_length().unwrap_or(0) as usize;
        let mut body = Vec::with_capacity(announced);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| self.unreachable(err, Ending::Other))?
        {
            if body.len() + chunk.len() > MAX_BUNDLE_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// `<base>/v1/clusters/<cluster>/<leaf>`, keeping any path prefix of the base URL.
/// `base` followed by the API path `segments` (each percent-encoded as needed).
/// The HTTP client's settings. One client per agent: its pool keeps the connection
/// between polls and reports, so an idle agent opens no new connections.
fn http_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!("flotilla-agent/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_keepalive(TCP_KEEPALIVE)
        .pool_idle_timeout(POOL_IDLE)
}

/// The file a path of the API names under a mirror's folder.
fn in_folder(root: &Path, segments: &[&str]) -> PathBuf {
    segments
        .iter()
        .fold(root.to_path_buf(), |path, segment| path.join(segment))
}

fn api_url(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    url.set_query(None);
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    url
}

fn read_token(path: &Path) -> Result<String, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientError::TokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ClientError::EmptyToken {
            path: path.to_path_buf(),
        });
    }
    if !flotilla_core::api::is_token(token) {
        // Say what is there without printing a secret: a token among other words
        // is named by its position only.
        let words = token.split_whitespace().count();
        let found = match token
            .split_whitespace()
            .position(flotilla_core::api::is_token)
        {
            Some(at) => format!(
                ": it holds {words} words, and the token is word {} of them",
                at + 1
            ),
            None if words > 1 => format!(": it holds {words} words"),
            None => String::new(),
        };
        return Err(ClientError::NotAToken {
            path: path.to_path_buf(),
            found,
        });
    }
    Ok(token.to_string())
}

/// Reads `Retry-After` as seconds or as an HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date =
        time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc2822).ok()?;
    let delta = date - time::OffsetDateTime::now_utc();
    Some(Duration::try_from(delta).unwrap_or(Duration::ZERO))
}

/// The message of a JSON error body (`{"message": …}` or `{"error": …}`), or the
/// start of a text one.
fn error_message(body: &str) -> String {
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(body) {
        for field in ["message", "error"] {
            if let Some(text) = value.get(field).and_then(serde_json::Value::as_str) {
                return text.to_string();
            }
        }
    }
    // An HTML error page (a web server's or a proxy's) is said by its title, and any
    // other text on one line.
    let lower = body.to_ascii_lowercase();
    let text = match (lower.find("<title>"), lower.find("</title>")) {
        (Some(start), Some(end)) if start + 7 <= end => &body[start + 7..end],
        _ => body,
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        "no message".to_string()
    } else {
        text.chars().take(300).collect()
    }
}

/// What to do about a TLS failure, from the words rustls uses.
fn tls_hint(chain: &str) -> &'static str {
    if chain.contains("UnknownIssuer") {
        " (the hub's certificate is signed by a CA this agent does not trust: give the \
         site's CA with --ca-file, or add it to the system's trust store or SSL_CERT_FILE)"
    } else if chain.contains("NotValidForName") {
        " (the hub's certificate does not name the host in --server: use the name the \
         certificate was made for)"
    } else if chain.contains("alert") && chain.contains("UnknownCA") {
        " (the hub refused this agent's client certificate: --client-cert must be signed \
         by the CA the hub was given with --client-ca)"
    } else if chain.contains("CertificateRequired") {
        " (the hub requires a client certificate: give --client-cert and --client-key)"
    } else {
        ""
    }
}

/// An error and its causes on one line (reqwest hides the useful part in sources).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{Query, State};
    use axum::http::{HeaderMap as AxumHeaders, StatusCode as AxumStatus};
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    #[test]
    fn an_error_page_is_said_by_its_title_and_other_text_on_one_line() {
        let page = "<!DOCTYPE HTML>\n<html>\n<head>\n<title>Error response</title>\n</head>\n<body><p>Error code: 501</p></body></html>\n";
        assert_eq!(error_message(page), "Error response");
        assert_eq!(error_message("bad\n  gateway\n"), "bad gateway");
        assert_eq!(
            error_message(r#"{"error": "no such cluster"}"#),
            "no such cluster"
        );
        assert_eq!(error_message(" \n"), "no message");
    }

    /// What the hub saw of one request: path, If-None-Match, wait, Authorization.
    type Request = (String, Option<String>, Option<String>, Option<String>);

    #[derive(Default)]
    struct Seen {
        requests: Vec<Request>,
        statuses: Vec<serde_json::Value>,
    }

    type Shared = Arc<Mutex<Seen>>;

    /// A registry whose layer does not match the digest its manifest names: the
    /// refusal names that digest, the one the agent attempted.
    #[tokio::test]
    async fn a_registry_refusal_names_the_digest_its_manifest_claimed() {
        use flotilla_oci::artifact::Artifact;
        let layer = br#"[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}]"#;
        let artifact = Artifact::bundle("edge-1", "main@sha1:1", layer.to_vec(), None);
        let claimed = artifact.layers[0].digest.clone();
        let manifest = artifact.manifest();
        let manifest_digest = Digest::of(&manifest).to_string();
        let mut served = layer.to_vec();
        served[2] = b'k';
        let app = axum::Router::new()
            .route(
                "/v2/fleet/bundles/manifests/{reference}",
                get(move || async move {
                    (
                        [
                            ("docker-content-digest", manifest_digest.clone()),
                            (
                                "content-type",
                                "application/vnd.oci.image.manifest.v1+json".to_string(),
                            ),
                        ],
                        manifest.clone(),
                    )
                }),
            )
            .route(
                "/v2/fleet/bundles/blobs/{digest}",
                get(move || async move { served.clone() }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let server = Server::parse(&format!("oci://{address}/fleet/bundles")).expect("url");
        let mut client = HubClient::new(server, "edge-1", None)
            .expect("client")
            .with_registry_options(flotilla_oci::RegistryOptions {
                plain_http: true,
                ..Default::default()
            })
            .expect("plain HTTP on loopback");
        let Err(err) = client.fetch_from_registry(None).await else {
            panic!("a layer that does not match its digest was taken");
        };
        assert!(err.is_refusal(), "{err}");
        assert_eq!(
            err.refused_digest().map(|d| d.to_string()),
            Some(claimed.to_string()),
            "{err}"
        );
    }

    async fn bundle(
        State(seen): State<Shared>,
        Query(query): Query<HashMap<String, String>>,
        headers: AxumHeaders,
    ) -> axum::response::Response {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let auth = header("authorization");
        seen.lock().expect("lock").requests.push((
            "bundle".into(),
            header("if-none-match"),
            query.get("wait").cloned(),
            auth.clone(),
        ));
        match auth.as_deref() {
            Some("Bearer flt_good") => {}
            Some("Bearer flt_other-cluster") => {
                return (AxumStatus::FORBIDDEN, r#"{"message":"forbidden"}"#).into_response();
            }
            Some("Bearer flt_busy") => {
                return (
                    AxumStatus::SERVICE_UNAVAILABLE,
                    [("retry-after", "17")],
                    "try later",
                )
                    .into_response();
            }
            _ => {
                return (AxumStatus::UNAUTHORIZED, r#"{"message":"no token"}"#).into_response();
            }
        }
        if header("if-none-match").as_deref() == Some("\"sha256:current\"") {
            return AxumStatus::NOT_MODIFIED.into_response();
        }
        ([("etag", "\"sha256:current\"")], "{\"doc\":1}").into_response()
    }

    async fn status(
        State(seen): State<Shared>,
        axum::Json(body): axum::Json<serde_json::Value>,
    ) -> AxumStatus {
        seen.lock().expect("lock").statuses.push(body);
        AxumStatus::NO_CONTENT
    }

    async fn start_hub() -> (Url, Shared) {
        let seen: Shared = Arc::default();
        let app = axum::Router::new()
            .route("/prefix/v1/clusters/{cluster}/bundle", get(bundle))
            .route("/prefix/v1/clusters/{cluster}/status", post(status))
            .with_state(seen.clone());
        let url = serve_app(app).await.join("prefix/").expect("url");
        (url, seen)
    }

    /// Serves `app` on a free loopback port; its base URL.
    async fn serve_app(app: axum::Router) -> Url {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Url::parse(&format!("http://{address}/")).expect("url")
    }

    /// A client for cluster `edge-1` of the hub at `url`, with `token`.
    fn client_for(url: Url, dir: &Path, token: &str) -> HubClient {
        HubClient::new(Server::Http(url), "edge-1", Some(&token_file(dir, token))).expect("client")
    }

    fn token_file(dir: &Path, token: &str) -> PathBuf {
        let path = dir.join("token");
        std::fs::write(&path, format!("{token}\n")).expect("writes token");
        path
    }

    #[tokio::test]
    async fn http2_is_spoken_to_a_plain_http_hub_only_when_asked() {
        let versions: Arc<Mutex<Vec<axum::http::Version>>> = Arc::default();
        let record = versions.clone();
        let app = axum::Router::new().route(
            "/v1/clusters/{cluster}/bundle",
            get(move |request: axum::extract::Request| {
                record.lock().expect("lock").push(request.version());
                async { ([("etag", "\"sha256:current\"")], "{\"doc\":1}") }
            }),
        );
        let url = serve_app(app).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let token = token_file(dir.path(), "flt_good");
        let mut plain =
            HubClient::new(Server::Http(url.clone()), "edge-1", Some(&token)).expect("client");
        let mut http2 = HubClient::new(Server::Http(url), "edge-1", Some(&token))
            .and_then(HubClient::with_http2_prior_knowledge)
            .expect("client");
        for http2_client in [false, true, true] {
            let client = if http2_client { &mut http2 } else { &mut plain };
            let fetched = client
                .fetch_bundle(None, Duration::from_secs(1))
                .await
                .expect("fetches");
            assert!(matches!(fetched, Fetched::Bundle { .. }), "{fetched:?}");
        }
        assert_eq!(
            *versions.lock().expect("lock"),
            [
                axum::http::Version::HTTP_11,
                axum::http::Version::HTTP_2,
                axum::http::Version::HTTP_2
            ]
        );
    }

    #[tokio::test]
    async fn conditional_long_poll_gets_the_bundle_then_304() {
        let (url, seen) = start_hub().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut client = client_for(url, dir.path(), "flt_good");
        let first = client
            .fetch_bundle(None, Duration::from_secs(30))
            .await
            .expect("fetches");
        assert_eq!(
            first,
            Fetched::Bundle {
                body: b"{\"doc\":1}".to_vec(),
                etag: Some("\"sha256:current\"".into())
            }
        );
        let second = client
            .fetch_bundle(Some("\"sha256:current\""), Duration::from_secs(30))
            .await
            .expect("fetches");
        assert_eq!(second, Fetched::NotModified);
        let requests = seen.lock().expect("lock").requests.clone();
        assert_eq!(
            requests,
            [
                (
                    "bundle".to_string(),
                    None,
                    Some("30s".to_string()),
                    Some("Bearer flt_good".to_string())
                ),
                (
                    "bundle".to_string(),
                    Some("\"sha256:current\"".to_string()),
                    Some("30s".to_string()),
                    Some("Bearer flt_good".to_string())
                ),
            ]
        );
    }

    #[tokio::test]
    async fn errors_are_classified_and_carry_retry_after() {
        let (url, _seen) = start_hub().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let token = token_file(dir.path(), "flt_nonsense");
        let mut client =
            HubClient::new(Server::Http(url.clone()), "edge-1", Some(&token)).expect("client");
        let err = client
            .fetch_bundle(None, Duration::ZERO)
            .await
            .expect_err("401");
        assert_eq!(err.kind(), FailureKind::Auth);
        assert!(err.to_string().contains("401"), "{err}");
        assert!(err.to_string().contains("--token-file"), "{err}");

        // A rotated token file is read again after a 401.
        std::fs::write(&token, "flt_other-cluster").expect("rotates");
        let err = client
            .fetch_bundle(None, Duration::ZERO)
            .await
            .expect_err("403");
        assert_eq!(err.kind(), FailureKind::Auth);
        assert!(err.to_string().contains("403"), "{err}");

        std::fs::write(&token, "flt_busy").expect("rotates");
        let err = client
            .fetch_bundle(None, Duration::ZERO)
            .await
            .expect_err("503 with Retry-After");
        assert_eq!(err.kind(), FailureKind::Transient);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(17)));
        assert!(err.to_string().contains("503"), "{err}");
    }

    #[tokio::test]
    async fn an_unreachable_hub_is_a_transient_failure() {
        // Bind then drop a listener so the port is (almost certainly) closed.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let dir = tempfile::tempdir().expect("tempdir");
        let url = Url::parse(&format!("http://{address}/")).expect("url");
        let mut client = client_for(url, dir.path(), "flt_good");
        let err = client
            .fetch_bundle(None, Duration::ZERO)
            .await
            .expect_err("unreachable");
        assert!(matches!(err, FetchError::Unreachable { .. }), "{err}");
        assert_eq!(err.kind(), FailureKind::Transient);
        // A connection that cannot be made says nothing of the path cutting polls.
        assert_eq!(err.ending(), Ending::Other);
    }

    /// How a poll that got no answer ended, as `--wait auto` learns from it: a
    /// connection closed on the way and a gateway's 504 are cuts, the hub's own 503
    /// is not.
    #[tokio::test]
    async fn a_poll_ended_on_the_way_is_told_from_the_hubs_own_errors() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            for answer in [None, Some("504 Gateway Time-out"), Some("502 Bad Gateway")] {
                let (mut socket, _) = listener.accept().await.expect("accepts");
                let mut request = vec![0; 4096];
                let _ = socket.read(&mut request).await;
                if let Some(status) = answer {
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: 5\r\nconnection: close\r\n\r\n<p/>\n"
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                }
                // Dropped: closed with no answer (the first), or after it.
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let url = Url::parse(&format!("http://{address}/")).expect("url");
        let mut client = client_for(url, dir.path(), "flt_good");
        for expected in ["closed", "504", "502"] {
            let err = client
                .fetch_bundle(Some("\"sha256:x\""), Duration::from_secs(30))
                .await
                .expect_err(expected);
            assert_eq!(err.ending(), Ending::Cut, "{expected}: {err}");
            assert_eq!(err.kind(), FailureKind::Transient);
        }

        let (url, _seen) = start_hub().await;
        let mut client = client_for(url, dir.path(), "flt_busy");
        let err = client
            .fetch_bundle(None, Duration::ZERO)
            .await
            .expect_err("503");
        assert_eq!(err.ending(), Ending::Other, "{err}");
    }

    #[tokio::test]
    async fn status_reports_are_posted_as_json() {
        let (url, seen) = start_hub().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut client = client_for(url, dir.path(), "flt_good");
        client
            .send_status(&StatusReport::empty("hello", crate::AGENT_VERSION))
            .await
            .expect("sent");
        let statuses = seen.lock().expect("lock").statuses.clone();
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0]["message"], "hello");
    }

    /// Reports are gzipped only after the hub said, on its answer to one, that it
    /// takes gzip (RFC 7694); a hub that does not say so gets them as they are.
    #[tokio::test]
    async fn reports_are_gzipped_once_the_hub_says_it_takes_gzip() {
        type Seen = Arc<Mutex<Vec<(Option<String>, serde_json::Value)>>>;
        async fn status(
            State((seen, says)): State<(Seen, bool)>,
            headers: AxumHeaders,
            body: axum::body::Bytes,
        ) -> axum::response::Response {
            use std::io::Read as _;
            let coding = headers
                .get("content-encoding")
                .map(|v| v.to_str().expect("ascii").to_string());
            let mut json = Vec::new();
            match coding.as_deref() {
                Some("gzip") => {
                    flate2::read::GzDecoder::new(&body[..])
                        .read_to_end(&mut json)
                        .expect("gzip");
                }
                _ => json = body.to_vec(),
            }
            let report = serde_json::from_slice(&json).expect("a JSON report");
            seen.lock().expect("lock").push((coding, report));
            let mut answer = AxumStatus::OK.into_response();
            if says {
                answer
                    .headers_mut()
                    .insert("accept-encoding", "gzip, zstd".parse().expect("value"));
            }
            answer
        }
        let large = StatusReport {
            resources: (0..50)
                .map(|i| flotilla_core::status::ResourceStatus {
                    key: std::sync::Arc::new(flotilla_core::bundle::ResourceKey::new(
                        "",
                        "ConfigMap",
                        "shop",
                        format!("config-{i}"),
                    )),
                    state: flotilla_core::status::ResourceState::Applied,
                    message: String::new(),
                })
                .collect(),
            ..StatusReport::empty("applied 50 resources", crate::AGENT_VERSION)
        };
        let small = StatusReport::empty("hello", crate::AGENT_VERSION);
        for says in [true, false] {
            let seen: Seen = Arc::default();
            let app = axum::Router::new()
                .route("/v1/clusters/{cluster}/status", post(status))
                .with_state((seen.clone(), says));
            let url = serve_app(app).await;
            let dir = tempfile::tempdir().expect("tempdir");
            let mut client = client_for(url, dir.path(), "flt_good");
            for report in [&large, &large, &small] {
                client.send_status(report).await.expect("sent");
            }
            let seen = seen.lock().expect("lock").clone();
            let codings: Vec<Option<&str>> = seen.iter().map(|(c, _)| c.as_deref()).collect();
            let expected = match says {
                // The first before the hub said so; a small one is not worth it.
                true => vec![None, Some("gzip"), None],
                false => vec![None, None, None],
            };
            assert_eq!(codings, expected, "the hub says it takes gzip: {says}");
            assert_eq!(seen[1].1["resources"].as_array().map(Vec::len), Some(50));
            assert_eq!(seen[1].1, serde_json::to_value(&large).expect("json"));
        }
    }

    #[tokio::test]
    async fn a_folder_answers_not_modified_until_its_file_changes() {
        let root = tempfile::tempdir().expect("tempdir");
        let folder = root.path().join("v1/clusters/edge-1");
        std::fs::create_dir_all(&folder).expect("mkdir");
        std::fs::write(folder.join("bundle"), b"one").expect("writes");
        let server = Server::parse(&format!("file://{}", root.path().display())).expect("url");
        assert!(!server.accepts_status());
        let mut client = HubClient::new(server, "edge-1", None).expect("client");
        let wait = Duration::from_secs(1);
        assert!(matches!(
            client.fetch_bundle(Some("x"), wait).await,
            Ok(Fetched::Bundle { .. })
        ));
        assert_eq!(
            client.fetch_bundle(Some("x"), wait).await.expect("reads"),
            Fetched::NotModified
        );
        std::fs::write(folder.join("bundle"), b"two").expect("writes");
        assert_eq!(
            client.fetch_bundle(Some("x"), wait).await.expect("reads"),
            Fetched::Bundle {
                body: b"two".to_vec(),
                etag: None
            }
        );
        std::fs::remove_file(folder.join("bundle")).expect("removes");
        let err = client
            .fetch_bundle(Some("x"), wait)
            .await
            .expect_err("gone");
        assert_eq!(err.kind(), FailureKind::Transient);
    }

    #[test]
    fn server_urls_are_checked() {
        assert!(matches!(
            Server::parse("https://hub.example:8443"),
            Ok(Server::Http(_))
        ));
        assert_eq!(
            Server::parse("file:///srv/fleet").expect("file"),
            Server::File(PathBuf::from("/srv/fleet"))
        );
        assert_eq!(
            Server::parse("oci://registry.example:5000/fleet/bundles")
                .expect("oci")
                .to_string(),
            "oci://registry.example:5000/fleet/bundles"
        );
        assert!(!Server::parse("oci://r/a").expect("oci").accepts_status());
        let err = Server::parse("oci://registry.example").expect_err("refused");
        assert!(err.to_string().contains("REGISTRY/REPOSITORY"), "{err}");
        let err = Server::parse("ftp://x").expect_err("refused");
        assert!(err.to_string().contains("ftp"), "{err}");
        assert!(Server::parse("not a url").is_err());
        let err = HubClient::new(Server::parse("http://h").expect("url"), "c", None)
            .expect_err("token needed");
        assert!(matches!(err, ClientError::NoToken));
    }

    #[test]
    fn a_token_file_must_hold_just_a_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = || Server::parse("http://h").expect("url");
        let refused = |text: &str| {
            let path = token_file(dir.path(), text);
            HubClient::new(server(), "c", Some(&path))
                .expect_err("refused")
                .to_string()
                .replace(&dir.path().display().to_string(), "$DIR")
        };
        assert_eq!(
            refused("created token 0a1b for cluster red (shown once): flt_0a1b"),
            "the token file $DIR/token does not hold a flotilla token (flt_…): it holds 9 words, \
             and the token is word 9 of them; write just the token into it: \
             `flotilla token create CLUSTER > FILE`"
        );
        assert_eq!(
            refused("hunter2"),
            "the token file $DIR/token does not hold a flotilla token (flt_…); write just the \
             token into it: `flotilla token create CLUSTER > FILE`"
        );
        let path = token_file(dir.path(), "  flt_0a1b\n");
        assert!(HubClient::new(server(), "c", Some(&path)).is_ok());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(header::RETRY_AFTER, "120".parse().expect("value"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(120)));
        let future = time::OffsetDateTime::now_utc() + time::Duration::seconds(90);
        let date = future
            .format(&time::format_description::well_known::Rfc2822)
            .expect("formats")
            .replace("+0000", "GMT");
        headers.insert(header::RETRY_AFTER, date.parse().expect("value"));
        let wait = retry_after(&headers).expect("parses an HTTP date");
        assert!(
            wait > Duration::from_secs(80) && wait <= Duration::from_secs(90),
            "{wait:?}"
        );
        headers.insert(header::RETRY_AFTER, "soon".parse().expect("value"));
        assert_eq!(retry_after(&headers), None);
    }
}
