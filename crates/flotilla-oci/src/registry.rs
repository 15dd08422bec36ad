//! The distribution API's client: blobs and manifests of one repository, with the
//! registry's authentication challenges answered on the way.
//!
//! A bearer token is kept for the lifetime its token service gave it (`expires_in`,
//! 60 seconds when it says none, as the distribution token specification has it) and
//! fetched again just before it ends (at nine tenths of it), so a client that polls
//! costs one token request per token lifetime and no refused request; a 401 still
//! answers with a new token (a token revoked early, a registry that wants another
//! scope).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{self, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use url::Url;

use flotilla_core::bundle::Digest;

use crate::artifact::{Artifact, Blob, MAX_MANIFEST_BYTES};
use crate::auth::{Challenge, Credentials};
use crate::reference::valid_tag;
use crate::{MANIFEST_MEDIA_TYPE, OciError, Repository};

/// The longest one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The header in which registries name a manifest's digest.
const CONTENT_DIGEST: &str = "docker-content-digest";
/// A token's lifetime when its token service names none (the distribution token
/// specification's default).
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// The longest a token is kept, whatever its token service says.
const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How to reach a registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Plain HTTP instead of HTTPS; refused unless the registry is on this machine.
    pub plain_http: bool,
    /// Credentials for basic authentication or for the registry's token service.
    pub credentials: Option<Credentials>,
}

/// A client for one repository in one registry. Clones share the connection pool,
/// the authorization won from the registry and the blobs known to be there.
#[derive(Debug, Clone)]
pub struct Registry {
    repository: Repository,
    /// `<scheme>://<registry>/v2/<name>/`.
    base: Url,
    http: reqwest::Client,
    credentials: Option<Credentials>,
    /// The `Authorization` value the registry last accepted or asked for.
    authorization: Arc<Mutex<Option<Authorization>>>,
    /// Blobs this client saw in the repository (pushed or found): not asked again.
    known_blobs: Arc<Mutex<HashSet<String>>>,
    /// How far the tests moved this client's clock forward.
    #[cfg(test)]
    skew: Arc<Mutex<Duration>>,
}

/// An `Authorization` value, and for a bearer token where to renew it and when.
#[derive(Debug, Clone)]
struct Authorization {
    value: HeaderValue,
    renewal: Option<Renewal>,
}

/// How to fetch a bearer token again, and when.
#[derive(Debug, Clone)]
struct Renewal {
    realm: String,
    service: Option<String>,
    scope: String,
    /// Nine tenths into the token's lifetime, counted from when it was asked for.
    due: Instant,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest, which the tag now names.
    pub manifest: Digest,
    /// How many blobs were uploaded (those already in the repository were not).
    pub uploaded: usize,
    /// Whether the tag moved (false: it named this manifest already).
    pub changed: bool,
}

impl Registry {
    /// A client for `repository` over `http` (whose TLS settings the caller chose).
    pub fn new(
        repository: Repository,
        http: reqwest::Client,
        options: RegistryOptions,
    ) -> Result<Registry, OciError> {
        if options.plain_http && !repository.is_loopback() {
            return Err(OciError::PlainHttpNotLoopback {
                host: repository.host().to_string(),
            });
        }
        let scheme = if options.plain_http { "http" } else { "https" };
        let base = Url::parse(&format!(
            "{scheme}://{}/v2/{}/",
            repository.api_host(),
            repository.name
        ))
        .map_err(|err| OciError::BadReference {
            text: repository.to_string(),
            reason: err.to_string(),
        })?;
        Ok(Registry {
            repository,
            base,
            http,
            credentials: options.credentials,
            authorization: Arc::default(),
            known_blobs: Arc::default(),
            #[cfg(test)]
            skew: Arc::default(),
        })
    }

    pub fn repository(&self) -> &Repository {
        &self.repository
    }

    fn url(&self, path: &str) -> Url {
        // `path` is made here of a digest or a checked tag: it always joins.
        self.base.join(path).unwrap_or_else(|_| self.base.clone())
    }

    fn manifest_url(&self, reference: &str) -> Result<Url, OciError> {
        if !valid_tag(reference) && Digest::parse(reference).is_err() {
            return Err(OciError::BadReference {
                text: format!("{}:{reference}", self.repository),
                reason: "a tag is letters, digits, '_', '.' and '-' (at most 128), not starting with '.' or '-'".into(),
            });
        }
        Ok(self.url(&format!("manifests/{reference}")))
    }

    /// The digest of the manifest `reference` (a tag) names, with one HEAD; `None`
    /// when there is no such tag.
    pub async fn head_manifest(&self, reference: &str) -> Result<Option<Digest>, OciError> {
        let url = self.manifest_url(reference)?;
        let response = self
            .send(|http| {
                http.head(url.clone())
                    .header(header::ACCEPT, MANIFEST_MEDIA_TYPE)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = checked(response, &url).await?;
        let named = response
            .headers()
            .get(CONTENT_DIGEST)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok());
        match named {
            Some(digest) => Ok(Some(digest)),
            // A registry that does not say: the manifest is read to know.
            None => Ok(self
                .get_manifest(reference)
                .await?
                .map(|(_, digest)| digest)),
        }
    }

    /// The manifest `reference` (a tag or a digest) names and its digest; `None` when
    /// there is none. A manifest asked for by digest must match it.
    pub async fn get_manifest(
        &self,
        reference: &str,
    ) -> Result<Option<(Vec<u8>, Digest)>, OciError> {
        let url = self.manifest_url(reference)?;
        let response = self
            .send(|http| {
                http.get(url.clone())
                    .header(header::ACCEPT, MANIFEST_MEDIA_TYPE)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = checked(response, &url).await?;
        let bytes = read_limited(response, &url, "the manifest", MAX_MANIFEST_BYTES).await?;
        let digest = Digest::of(&bytes);
        if let Ok(asked) = Digest::parse(reference)
            && asked != digest
        {
            return Err(OciError::DigestMismatch {
                what: "the manifest",
                url: url.to_string(),
                expected: asked.to_string(),
                actual: digest.to_string(),
            });
        }
        Ok(Some((bytes, digest)))
    }

    /// The blob `digest`, at most `limit` bytes, checked against its digest.
    pub async fn get_blob(&self, digest: &Digest, limit: usize) -> Result<Vec<u8>, OciError> {
        let url = self.url(&format!("blobs/{digest}"));
        let response = self.send(|http| http.get(url.clone())).await?;
        let response = checked(response, &url).await?;
        let bytes = read_limited(response, &url, "the blob", limit).await?;
        let actual = Digest::of(&bytes);
        if actual != *digest {
            return Err(OciError::DigestMismatch {
                what: "the blob",
                url: url.to_string(),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Whether the repository holds the blob `digest`.
    pub async fn has_blob(&self, digest: &Digest) -> Result<bool, OciError> {
        let url = self.url(&format!("blobs/{digest}"));
        let response = self.send(|http| http.head(url.clone())).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        checked(response, &url).await.map(|_| true)
    }

    /// Uploads `blob` whole: a POST opens the upload, a PUT with the digest closes it.
    pub async fn upload_blob(&self, blob: &Blob) -> Result<(), OciError> {
        let start = self.url("blobs/uploads/");
        let response = self
            .send(|http| http.post(start.clone()).header(header::CONTENT_LENGTH, "0"))
            .await?;
        let response = checked(response, &start).await?;
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| OciError::Status {
                url: start.to_string(),
                status: response.status().as_u16(),
                message: "the registry opened an upload without a Location".into(),
            })?;
        let mut put = start.join(location).map_err(|err| OciError::Status {
            url: start.to_string(),
            status: response.status().as_u16(),
            message: format!("the upload's Location {location:?} is not a URL: {err}"),
        })?;
        // Credentials and the bundle go only where the registry is: an upload on
        // another origin (a proxy's `http://` Location for an `https://` registry,
        // say) would carry the Authorization header there in clear or to a stranger.
        if put.origin() != start.origin() {
            return Err(OciError::Status {
                url: start.to_string(),
                status: response.status().as_u16(),
                message: format!(
                    "the registry opened an upload at {put}, which is not on the registry's own \
                     scheme, host and port; credentials and the bundle are not sent there (a \
                     registry behind a TLS proxy must be told its public URL)"
                ),
            });
        }
        put.query_pairs_mut()
            .append_pair("digest", blob.digest.as_str());
        let bytes = blob.bytes.clone();
        let response = self
            .send(|http| {
                http.put(put.clone())
                    .header(header::CONTENT_TYPE, "application/octet-stream")
                    .body(bytes.to_vec())
            })
            .await?;
        checked(response, &put).await.map(|_| ())
    }

    /// Puts `manifest` under `tag`; its digest.
    pub async fn put_manifest(&self, tag: &str, manifest: &[u8]) -> Result<Digest, OciError> {
        let url = self.manifest_url(tag)?;
        let response = self
            .send(|http| {
                http.put(url.clone())
                    .header(header::CONTENT_TYPE, MANIFEST_MEDIA_TYPE)
                    .body(manifest.to_vec())
            })
            .await?;
        checked(response, &url).await?;
        Ok(Digest::of(manifest))
    }

    /// Pushes `artifact` under `tag`: the blobs the repository lacks, then the
    /// manifest, unless the tag names that manifest already.
    pub async fn push(&self, tag: &str, artifact: &Artifact) -> Result<Pushed, OciError> {
        let now = self.head_manifest(tag).await?;
        self.push_over(tag, artifact, now.as_ref()).await
    }

    /// [`Registry::push`] when the caller knows what the tag names now (`None`: nothing).
    pub async fn push_over(
        &self,
        tag: &str,
        artifact: &Artifact,
        now: Option<&Digest>,
    ) -> Result<Pushed, OciError> {
        let manifest = artifact.manifest();
        let digest = Digest::of(&manifest);
        if now == Some(&digest) {
            // A registry keeps no manifest without its blobs: they are all there.
            return Ok(Pushed {
                manifest: digest,
                uploaded: 0,
                changed: false,
            });
        }
        let mut uploaded = 0;
        for blob in artifact.blobs() {
            if self.ensure_blob(blob).await? {
                uploaded += 1;
            }
        }
        if let Err(err) = self.put_manifest(tag, &manifest).await {
            // A blob this client pushed once may have been deleted since (a registry's
            // garbage collection of untagged images): look for each one again next time.
            if let Ok(mut known) = self.known_blobs.lock() {
                known.clear();
            }
            return Err(err);
        }
        Ok(Pushed {
            manifest: digest,
            uploaded,
            changed: true,
        })
    }

    /// Makes sure the repository holds `blob`: uploaded unless this client saw it
    /// there already or a HEAD finds it. Whether it was uploaded.
    pub async fn ensure_blob(&self, blob: &Blob) -> Result<bool, OciError> {
        if self.knows(&blob.digest) {
            return Ok(false);
        }
        let upload = !self.has_blob(&blob.digest).await?;
        if upload {
            self.upload_blob(blob).await?;
        }
        if let Ok(mut known) = self.known_blobs.lock() {
            known.insert(blob.digest.as_str().to_string());
        }
        Ok(upload)
    }

    fn knows(&self, digest: &Digest) -> bool {
        self.known_blobs
            .lock()
            .is_ok_and(|known| known.contains(digest.as_str()))
    }

    fn authorization(&self) -> Option<Authorization> {
        self.authorization.lock().ok().and_then(|held| held.clone())
    }

    fn set_authorization(&self, value: Authorization) {
        if let Ok(mut held) = self.authorization.lock() {
            *held = Some(value);
        }
    }

    #[cfg(not(test))]
    fn now(&self) -> Instant {
        Instant::now()
    }

    #[cfg(test)]
    fn now(&self) -> Instant {
        Instant::now() + self.skew.lock().map(|skew| *skew).unwrap_or_default()
    }

    /// The `Authorization` value to send: the one held, its bearer token fetched
    /// again first when its time is up.
    async fn current_authorization(&self) -> Result<Option<HeaderValue>, OciError> {
        let Some(held) = self.authorization() else {
            return Ok(None);
        };
        match held.renewal {
            Some(renewal) if self.now() >= renewal.due => {
                let renewed = self
                    .bearer(&renewal.realm, renewal.service, renewal.scope)
                    .await?;
                let value = renewed.value.clone();
                self.set_authorization(renewed);
                Ok(Some(value))
            }
            _ => Ok(Some(held.value)),
        }
    }

    /// A bearer token for `scope` from the token service at `realm`, with when to
    /// renew it.
    async fn bearer(
        &self,
        realm: &str,
        service: Option<String>,
        scope: String,
    ) -> Result<Authorization, OciError> {
        let asked = self.now();
        let (token, lifetime) = self.token(realm, service.as_deref(), &scope).await?;
        Ok(Authorization {
            value: header_value(&format!("Bearer {token}"))?,
            renewal: Some(Renewal {
                realm: realm.to_string(),
                service,
                scope,
                due: asked + (lifetime - lifetime / 10),
            }),
        })
    }

    /// Sends a request built by `build`, answering one authentication challenge: a
    /// 401 with `WWW-Authenticate` is met (basic credentials, or a token from the
    /// registry's token service) and the request is sent once more.
    async fn send(
        &self,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, OciError> {
        let mut answered = false;
        loop {
            let mut request = build(&self.http).timeout(REQUEST_TIMEOUT);
            if let Some(value) = self.current_authorization().await? {
                request = request.header(header::AUTHORIZATION, value);
            }
            let request = request
                .build()
                .map_err(|err| OciError::Client(err.to_string()))?;
            let url = request.url().clone();
            let response = self
                .http
                .execute(request)
                .await
                .map_err(|err| unreachable(&url, &err))?;
            if response.status() != StatusCode::UNAUTHORIZED || answered {
                return Ok(response);
            }
            answered = true;
            let challenge = response
                .headers()
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .and_then(Challenge::parse);
            let value = match challenge {
                Some(Challenge::Basic) => match &self.credentials {
                    Some(credentials) => Authorization {
                        value: header_value(&credentials.basic())?,
                        renewal: None,
                    },
                    None => return Ok(response),
                },
                Some(Challenge::Bearer {
                    realm,
                    service,
                    scope,
                }) => {
                    let scope = scope
                        .unwrap_or_else(|| format!("repository:{}:pull", self.repository.name));
                    self.bearer(&realm, service, scope).await?
                }
                None => return Ok(response),
            };
            self.set_authorization(value);
        }
    }

    /// A token from the registry's token service, for `scope`, and its lifetime.
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<(String, Duration), OciError> {
        let url = Url::parse(realm).map_err(|err| OciError::Status {
            url: self.base.to_string(),
            status: 401,
            message: format!("the registry's token realm {realm:?} is not a URL: {err}"),
        })?;
        let realm_on_loopback = match url.host() {
            Some(url::Host::Domain(host)) => host == "localhost",
            Some(url::Host::Ipv4(address)) => address.is_loopback(),
            Some(url::Host::Ipv6(address)) => address.is_loopback(),
            None => false,
        };
        if url.scheme() != "https"
            && !(url.scheme() == "http" && self.base.scheme() == "http" && realm_on_loopback)
        {
            return Err(OciError::Status {
                url: self.base.to_string(),
                status: 401,
                message: format!(
                    "the registry's token realm {realm} is not https; credentials are not sent there"
                ),
            });
        }
        // The query of a token request by GET, with the credentials as Basic.
        let get = |mut url: Url| {
            {
                let mut query = url.query_pairs_mut();
                if let Some(service) = service {
                    query.append_pair("service", service);
                }
                query.append_pair("scope", scope);
            }
            let mut request = self.http.request(Method::GET, url.clone());
            if let Some(credentials) = &self.credentials {
                request = request.header(header::AUTHORIZATION, credentials.basic());
            }
            (request, url)
        };
        let send = |request: RequestBuilder, url: Url| async move {
            request
                .timeout(REQUEST_TIMEOUT)
                .send()
                .await
                .map_err(|err| unreachable(&url, &err))
        };
        let (response, url) = match self
            .credentials
            .as_ref()
            .and_then(Credentials::identity_token)
        {
            // An identity token (a refresh token, as `az acr login` and some `docker
            // login`s leave) is exchanged by OAuth2 for an access token, as Docker
            // does; a token service without OAuth2 (404 to the POST, or 400, 401 or
            // 405 as some answer it) is asked by GET, as Docker and containerd do.
            Some(refresh_token) => {
                let mut form = vec![
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh_token),
                    ("client_id", "flotilla"),
                    ("scope", scope),
                ];
                if let Some(service) = service {
                    form.push(("service", service));
                }
                let body = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(form)
                    .finish();
                let post = self
                    .http
                    .request(Method::POST, url.clone())
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(body);
                let response = send(post, url.clone()).await?;
                if matches!(response.status().as_u16(), 400 | 401 | 404 | 405) {
                    let (request, url) = get(url);
                    (send(request, url.clone()).await?, url)
                } else {
                    (response, url)
                }
            }
            None => {
                let (request, url) = get(url);
                (send(request, url.clone()).await?, url)
            }
        };
        let response = checked(response, &url).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
            expires_in: Option<u64>,
        }
        let body = read_limited(response, &url, "the token", 64 * 1024).await?;
        let token: Token = serde_json::from_slice(&body).map_err(|err| OciError::Status {
            url: url.to_string(),
            status: 200,
            message: format!("not a token response: {err}"),
        })?;
        let lifetime = token
            .expires_in
            .filter(|seconds| *seconds > 0)
            .map_or(DEFAULT_TOKEN_LIFETIME, Duration::from_secs)
            .min(MAX_TOKEN_LIFETIME);
        token
            .token
            .or(token.access_token)
            .filter(|t| !t.is_empty())
            .map(|token| (token, lifetime))
            .ok_or_else(|| OciError::Status {
                url: url.to_string(),
                status: 200,
                message: "the token service answered without a token".into(),
            })
    }
}

fn header_value(text: &str) -> Result<HeaderValue, OciError> {
    let mut value = HeaderValue::from_str(text)
        .map_err(|_| OciError::Client("credentials that cannot go in a header".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

/// The response when it is a success, else the registry's error as an [`OciError`].
async fn checked(response: Response, url: &Url) -> Result<Response, OciError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = error_text(response).await;
    let mut message = registry_message(&text);
    match status.as_u16() {
        401 => message.push_str(
            " (the registry wants credentials: log in with `docker login`, which writes them to \
             the Docker configuration file, or give them with the --oci-username and \
             --oci-password-file flags)",
        ),
        403 => message.push_str(" (the credentials are not allowed to do this here)"),
        _ => {}
    }
    Err(OciError::Status {
        url: url.to_string(),
        status: status.as_u16(),
        message,
    })
}

/// The distribution API's error body (`{"errors":[{"code","message"}]}`), or the
/// start of a text one.
fn registry_message(body: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: Option<String>,
        message: Option<String>,
    }
    if let Ok(errors) = serde_json::from_str::<Errors>(body)
        && !errors.errors.is_empty()
    {
        return errors
            .errors
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.code.as_deref().unwrap_or("ERROR"),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
    }
    let trimmed = body.trim();
    if trimmed.is_empty() {
        "no message".into()
    } else {
        trimmed.chars().take(300).collect()
    }
}

/// The most of an error's body that is read: its message is cut to 300 characters.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The start of an error answer's body (at most [`MAX_ERROR_BODY`] bytes, after any
/// decompression), as text: a registry's error may be as large as it likes.
async fn error_text(mut response: Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_ERROR_BODY - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

async fn read_limited(
    mut response: Response,
    url: &Url,
    what: &'static str,
    limit: usize,
) -> Result<Vec<u8>, OciError> {
    let too_large = || OciError::TooLarge {
        what,
        url: url.to_string(),
        limit,
    };
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| unreachable(url, &err))?
    {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn unreachable(url: &Url, err: &reqwest::Error) -> OciError {
    let mut reason = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    if url.scheme() == "https" && reason.contains("InvalidContentType") {
        reason.push_str(
            " (the registry answers in plain HTTP, not TLS: for a registry on this \
             machine give --oci-plain-http)",
        );
    }
    if reason.contains("UnknownIssuer") {
        reason.push_str(
            " (the registry's certificate is signed by a CA not trusted here: give it with \
             --ca-file, or add it to the system's trust store or SSL_CERT_FILE)",
        );
    }
    OciError::Unreachable {
        url: url.to_string(),
        reason,
        timed_out: err.is_timeout(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, StatusCode as AxumStatus};
    use axum::response::IntoResponse;
    use axum::routing::get;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const DIGEST: &str = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

    /// A registry on loopback whose manifests want `wanted` as `Authorization`, whose
    /// challenge is `challenge` (with `{base}` replaced by its URL), and whose token
    /// service hands `Bearer t0k` to the basic credentials robot:pw. Its address and
    /// the number of tokens handed out.
    async fn registry(wanted: String, challenge: &'static str) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address").to_string();
        let base = format!("http://{address}");
        let tokens = Arc::new(AtomicUsize::new(0));
        let handed = tokens.clone();
        let app = axum::Router::new()
            .route(
                "/v2/fleet/bundles/manifests/{tag}",
                get(move |headers: HeaderMap| async move {
                    let given = headers.get("authorization").and_then(|v| v.to_str().ok());
                    if given == Some(wanted.as_str()) {
                        ([(CONTENT_DIGEST, DIGEST)], "{}").into_response()
                    } else {
                        (
                            AxumStatus::UNAUTHORIZED,
                            [("www-authenticate", challenge.replace("{base}", &base))],
                            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
                        )
                            .into_response()
                    }
                }),
            )
            .route(
                "/token",
                get(
                    move |headers: HeaderMap,
                          query: axum::extract::Query<BTreeMap<String, String>>| async move {
                        let basic = robot().expect("some").basic();
                        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
                        if given != Some(basic.as_str())
                            || query.get("scope").map(String::as_str)
                                != Some("repository:fleet/bundles:pull")
                            || query.get("service").map(String::as_str) != Some("test")
                        {
                            return AxumStatus::UNAUTHORIZED.into_response();
                        }
                        handed.fetch_add(1, Ordering::SeqCst);
                        r#"{"token":"t0k","expires_in":300}"#.into_response()
                    },
                )
                .post(
                    // OAuth2: an identity (refresh) token exchanged for an access token.
                    move |form: axum::extract::Form<BTreeMap<String, String>>| async move {
                        let wanted = [
                            ("grant_type", "refresh_token"),
                            ("refresh_token", "id-t0k"),
                            ("scope", "repository:fleet/bundles:pull"),
                            ("service", "test"),
                        ];
                        if wanted
                            .iter()
                            .any(|(k, v)| form.get(*k).map(String::as_str) != Some(*v))
                        {
                            return AxumStatus::UNAUTHORIZED.into_response();
                        }
                        r#"{"access_token":"t0k","expires_in":300}"#.into_response()
                    },
                ),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (address, tokens)
    }

    fn client(address: &str, credentials: Option<Credentials>) -> Registry {
        Registry::new(
            Repository::parse(&format!("{address}/fleet/bundles")).expect("parses"),
            reqwest::Client::new(),
            RegistryOptions {
                plain_http: true,
                credentials,
            },
        )
        .expect("a client")
    }

    fn robot() -> Option<Credentials> {
        Some(Credentials {
            username: "robot".into(),
            password: "pw".into(),
        })
    }

    #[tokio::test]
    async fn a_bearer_challenge_is_answered_with_a_token_that_is_then_reused() {
        let (address, tokens) = registry(
            "Bearer t0k".into(),
            r#"Bearer realm="{base}/token",service="test",scope="repository:fleet/bundles:pull""#,
        )
        .await;
        let registry = client(&address, robot());
        for _ in 0..3 {
            let digest = registry.head_manifest("edge-1").await.expect("answers");
            assert_eq!(digest.map(|d| d.to_string()).as_deref(), Some(DIGEST));
        }
        assert_eq!(
            tokens.load(Ordering::SeqCst),
            1,
            "one token for three requests"
        );

        // Without credentials the token service refuses, and the error says so.
        let err = client(&address, None)
            .head_manifest("edge-1")
            .await
            .expect_err("refused");
        assert_eq!(err.status(), Some(401), "{err}");
    }

    #[tokio::test]
    async fn an_identity_token_is_exchanged_for_an_access_token() {
        let (address, tokens) = registry(
            "Bearer t0k".into(),
            r#"Bearer realm="{base}/token",service="test",scope="repository:fleet/bundles:pull""#,
        )
        .await;
        let config = tempfile::tempdir().expect("tempdir");
        let path = config.path().join("config.json");
        // As `az acr login` writes it: a placeholder user beside the identity token.
        use base64::Engine as _;
        let placeholder = base64::engine::general_purpose::STANDARD
            .encode("00000000-0000-0000-0000-000000000000:");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"{address}":{{"auth":"{placeholder}","identitytoken":"id-t0k"}}}}}}"#
            ),
        )
        .expect("writes");
        let credentials = Credentials::from_docker_config(&path, &address).expect("reads");
        let digest = client(&address, credentials)
            .head_manifest("edge-1")
            .await
            .expect("answers");
        assert_eq!(digest.map(|d| d.to_string()).as_deref(), Some(DIGEST));
        assert_eq!(
            tokens.load(Ordering::SeqCst),
            0,
            "no basic credentials sent"
        );
    }

    /// What the registry of [`expiring_tokens_registry`] counted.
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    struct Counts {
        /// Manifest requests, whatever their answer.
        manifests: usize,
        /// Manifest requests refused with a 401.
        refused: usize,
        /// Tokens handed out.
        tokens: usize,
    }

    /// A registry whose token service hands the credentials robot:pw a new token each
    /// time, valid for `lifetime` on the clock `clock` (which the test moves), and
    /// whose manifests refuse a token that is unknown or expired on that clock.
    async fn expiring_tokens_registry(
        clock: Arc<Mutex<Duration>>,
        lifetime: Duration,
    ) -> (String, Arc<Mutex<Counts>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address").to_string();
        let challenge = format!(
            r#"Bearer realm="http://{address}/token",service="test",scope="repository:fleet/bundles:pull""#
        );
        let counts = Arc::new(Mutex::new(Counts::default()));
        // Each token's name, and until when it is valid.
        let issued: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
        let now = move || *clock.lock().expect("the clock");
        let (manifest_now, manifest_counts, manifest_issued) =
            (now.clone(), counts.clone(), issued.clone());
        let (token_counts, token_issued) = (counts.clone(), issued.clone());
        let app = axum::Router::new()
            .route(
                "/v2/fleet/bundles/manifests/{tag}",
                get(move |headers: HeaderMap| async move {
                    let given = headers.get("authorization").and_then(|v| v.to_str().ok());
                    let valid = manifest_issued.lock().expect("issued").iter().any(
                        |(token, until)| {
                            given == Some(format!("Bearer {token}").as_str())
                                && manifest_now() < *until
                        },
                    );
                    let mut counts = manifest_counts.lock().expect("counts");
                    counts.manifests += 1;
                    if valid {
                        ([(CONTENT_DIGEST, DIGEST)], "{}").into_response()
                    } else {
                        counts.refused += 1;
                        (
                            AxumStatus::UNAUTHORIZED,
                            [("www-authenticate", challenge.clone())],
                            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
                        )
                            .into_response()
                    }
                }),
            )
            .route(
                "/token",
                get(
                    move |headers: HeaderMap,
                          query: axum::extract::Query<BTreeMap<String, String>>| async move {
                        let basic = robot().expect("some").basic();
                        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
                        if given != Some(basic.as_str())
                            || query.get("scope").map(String::as_str)
                                != Some("repository:fleet/bundles:pull")
                            || query.get("service").map(String::as_str) != Some("test")
                        {
                            return AxumStatus::UNAUTHORIZED.into_response();
                        }
                        let mut counts = token_counts.lock().expect("counts");
                        counts.tokens += 1;
                        let token = format!("t0k-{}", counts.tokens);
                        token_issued
                            .lock()
                            .expect("issued")
                            .push((token.clone(), now() + lifetime));
                        serde_json::json!({"token": token, "expires_in": lifetime.as_secs()})
                            .to_string()
                            .into_response()
                    },
                ),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (address, counts)
    }

    #[tokio::test]
    async fn a_bearer_token_is_kept_for_its_lifetime_and_fetched_again_just_before_it_ends() {
        let clock: Arc<Mutex<Duration>> = Arc::default();
        let lifetime = Duration::from_secs(300);
        let (address, counts) = expiring_tokens_registry(clock.clone(), lifetime).await;
        let mut registry = client(&address, robot());
        registry.skew = clock.clone();
        let poll_at = |seconds: u64| {
            *clock.lock().expect("the clock") = Duration::from_secs(seconds);
            let registry = registry.clone();
            async move {
                let digest = registry.head_manifest("edge-1").await.expect("answers");
                assert_eq!(digest.map(|d| d.to_string()).as_deref(), Some(DIGEST));
            }
        };
        let counts = || *counts.lock().expect("counts");

        // The first request meets the challenge: refused, a token, the request again.
        poll_at(0).await;
        let first = Counts {
            manifests: 2,
            refused: 1,
            tokens: 1,
        };
        assert_eq!(counts(), first);
        // Within the token's lifetime, a poll is one request.
        for seconds in [60, 120, 180, 240] {
            poll_at(seconds).await;
        }
        assert_eq!(
            counts(),
            Counts {
                manifests: 6,
                ..first
            }
        );
        // Past nine tenths of it, the token is fetched again before the request, which
        // the registry then takes at once: one token request, no refused request.
        poll_at(280).await;
        assert_eq!(
            counts(),
            Counts {
                manifests: 7,
                refused: 1,
                tokens: 2
            }
        );
        // Where the first token has expired the second is kept; and so on, a token per
        // lifetime and never a refused request.
        for seconds in [310, 400, 500, 560, 600] {
            poll_at(seconds).await;
        }
        assert_eq!(
            counts(),
            Counts {
                manifests: 12,
                refused: 1,
                tokens: 3
            }
        );
    }

    #[tokio::test]
    async fn a_basic_challenge_is_answered_with_the_credentials_only_when_there_are_some() {
        let basic = robot().expect("some").basic();
        let (address, _) = registry(basic, r#"Basic realm="test""#).await;
        let digest = client(&address, robot())
            .head_manifest("edge-1")
            .await
            .expect("answers");
        assert_eq!(digest.map(|d| d.to_string()).as_deref(), Some(DIGEST));
        let err = client(&address, None)
            .head_manifest("edge-1")
            .await
            .expect_err("refused");
        assert_eq!(err.status(), Some(401));
        assert!(err.to_string().contains("docker login"), "{err}");
        let wrong = Some(Credentials {
            username: "robot".into(),
            password: "not-it".into(),
        });
        let err = client(&address, wrong)
            .head_manifest("edge-1")
            .await
            .expect_err("refused");
        assert!(!err.to_string().contains("not-it"), "{err}");
    }

    /// What [`pushing_registry`] counted.
    #[derive(Default)]
    struct PushCounts {
        heads: AtomicUsize,
        uploads: AtomicUsize,
        manifests: AtomicUsize,
    }

    /// A registry on loopback that lacks every blob, opens uploads at `location`
    /// (`{base}` replaced by its URL), takes them, and refuses the first
    /// `refused_manifests` manifests with BLOB_UNKNOWN (as after a garbage
    /// collection) and `endless` error bodies when asked to. Its address and counts.
    async fn pushing_registry(
        location: &'static str,
        refused_manifests: usize,
        endless: bool,
    ) -> (String, Arc<PushCounts>) {
        use axum::routing::{post, put};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address").to_string();
        let base = format!("http://{address}");
        let counts = Arc::new(PushCounts::default());
        let (heads, uploads, manifests) = (counts.clone(), counts.clone(), counts.clone());
        let app = axum::Router::new()
            .route(
                "/v2/fleet/bundles/blobs/{digest}",
                axum::routing::head(move || async move {
                    heads.heads.fetch_add(1, Ordering::SeqCst);
                    AxumStatus::NOT_FOUND
                }),
            )
            .route(
                "/v2/fleet/bundles/blobs/uploads/",
                post(move || async move {
                    (
                        AxumStatus::ACCEPTED,
                        [("location", location.replace("{base}", &base))],
                    )
                }),
            )
            .route(
                "/upload",
                put(move || async move {
                    uploads.uploads.fetch_add(1, Ordering::SeqCst);
                    AxumStatus::CREATED
                }),
            )
            .route(
                "/v2/fleet/bundles/manifests/{tag}",
                put(move || async move {
                    let n = manifests.manifests.fetch_add(1, Ordering::SeqCst);
                    if endless {
                        let chunk = axum::body::Bytes::from(vec![b'x'; 64 * 1024]);
                        let stream = futures::stream::repeat_with(move || {
                            Ok::<_, std::io::Error>(chunk.clone())
                        });
                        return (
                            AxumStatus::INTERNAL_SERVER_ERROR,
                            axum::body::Body::from_stream(stream),
                        )
                            .into_response();
                    }
                    if n < refused_manifests {
                        return (
                            AxumStatus::BAD_REQUEST,
                            r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#,
                        )
                            .into_response();
                    }
                    AxumStatus::CREATED.into_response()
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (address, counts)
    }

    fn artifact() -> Artifact {
        Artifact {
            artifact_type: None,
            config: Blob::empty(),
            layers: vec![Blob::new("application/octet-stream", b"layer".to_vec())],
            annotations: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn blobs_are_looked_for_again_after_the_registry_refused_a_manifest() {
        let (address, counts) = pushing_registry("{base}/upload", 1, false).await;
        let registry = client(&address, None);
        registry
            .push_over("edge-1", &artifact(), None)
            .await
            .expect_err("BLOB_UNKNOWN");
        assert_eq!(counts.heads.load(Ordering::SeqCst), 2, "config and layer");
        // Pushed again: the blobs pushed before are not taken for granted.
        registry
            .push_over("edge-1", &artifact(), None)
            .await
            .expect("pushed");
        assert_eq!(counts.heads.load(Ordering::SeqCst), 4);
        assert_eq!(counts.uploads.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_upload_on_another_origin_gets_neither_credentials_nor_the_bundle() {
        for location in ["http://127.0.0.2:9/upload", "https://localhost:1/upload"] {
            let (address, counts) = pushing_registry(location, 0, false).await;
            let err = client(&address, robot())
                .push_over("edge-1", &artifact(), None)
                .await
                .expect_err("refused");
            assert!(
                err.to_string()
                    .contains("which is not on the registry's own scheme, host and port"),
                "{err}"
            );
            assert_eq!(counts.uploads.load(Ordering::SeqCst), 0);
        }
    }

    #[tokio::test]
    async fn an_error_body_is_read_only_so_far() {
        let (address, _) = pushing_registry("{base}/upload", 0, true).await;
        let started = Instant::now();
        let err = tokio::time::timeout(
            Duration::from_secs(20),
            client(&address, None).push_over("edge-1", &artifact(), None),
        )
        .await
        .expect("answers without reading the endless body")
        .expect_err("500");
        assert_eq!(err.status(), Some(500), "{err}");
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn a_plain_http_token_service_must_be_on_this_machine_too() {
        let (address, tokens) = registry(
            "Bearer t0k".into(),
            r#"Bearer realm="http://registry.example/token",service="test",scope="repository:fleet/bundles:pull""#,
        )
        .await;
        let err = client(&address, robot())
            .head_manifest("edge-1")
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("is not https"), "{err}");
        assert_eq!(tokens.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn plain_http_is_only_for_this_machine() {
        let refused = Registry::new(
            Repository::parse("registry.example/fleet/bundles").expect("parses"),
            reqwest::Client::new(),
            RegistryOptions {
                plain_http: true,
                credentials: None,
            },
        )
        .expect_err("refused");
        assert!(
            matches!(refused, OciError::PlainHttpNotLoopback { .. }),
            "{refused}"
        );
    }
}
