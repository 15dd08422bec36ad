//! The hub's HTTP API, version 1 (documented in docs/api.md).
//!
//! The bundle path is the hot one: it reads the in-memory [`Served`] snapshot and the
//! in-memory token table, and answers a matching `If-None-Match` with a 304 without
//! touching the disk or the database.
//!
//! No body is read before the request is known to be allowed where a token decides
//! it: a status report without a valid token is refused at once and its connection
//! closed. The webhook's HMAC covers its body, so its bodies are bounded instead
//! ([`RequestLimits`]): in size, in the time to receive one, and in how many are read
//! at once. Held long-polls are bounded per cluster: a new one ends the oldest.
//!
//! [`Served`]: crate::recorder::Served

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::HttpBody as _;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{
    DefaultBodyLimit, Extension, FromRequest, FromRequestParts, Path, Request, State,
};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hmac::{Hmac, Mac};
use http::header::{
    ACCEPT_ENCODING, AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH,
    CONTENT_TYPE, ETAG, IF_NONE_MATCH, RETRY_AFTER, USER_AGENT, VARY, WWW_AUTHENTICATE,
};
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::auth::{Grant, Person};
use crate::delta;
use crate::recorder::rollouts::{Action, ActionRefused};
use crate::recorder::{ClusterBundle, Encoding, ReportRefused, Shared};
use crate::scope::TenantView;
use flotilla_core::access::RolloutAccess;
use flotilla_core::api;
use flotilla_core::bundle::{Digest, document_bytes, features};
use flotilla_core::dcz;
use flotilla_core::status::StatusReport;

/// The largest status report accepted.
pub const STATUS_BODY_LIMIT: usize = 1024 * 1024;
/// The largest webhook payload accepted (push payloads are far smaller).
pub const HOOK_BODY_LIMIT: usize = 4 * 1024 * 1024;

pub static X_FLOTILLA_REVISION: HeaderName =
    HeaderName::from_static(flotilla_core::api::REVISION_HEADER);
pub static X_HUB_SIGNATURE_256: HeaderName = HeaderName::from_static("x-hub-signature-256");

const JSON: HeaderValue = HeaderValue::from_static("application/json");
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
/// The current bundle changes with each commit: caches must ask again each time.
const REVALIDATE: HeaderValue = HeaderValue::from_static("private, no-cache");
/// A bundle named by its digest never changes.
const IMMUTABLE: HeaderValue = HeaderValue::from_static("private, max-age=31536000, immutable");
const VARY_ENCODING: HeaderValue = HeaderValue::from_static("Accept-Encoding");
const VARY_DICTIONARY: HeaderValue =
    HeaderValue::from_static("Accept-Encoding, Available-Dictionary");

type SharedState = State<Arc<Shared>>;

/// The limits on what requests may hold. [`RequestLimits::default`] gives the
/// documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// How long a webhook's body (at most [`HOOK_BODY_LIMIT`]) may take to arrive; its
    /// HMAC covers the body, so it is read before it is known to come from the Git host.
    pub webhook_body_timeout: Duration,
    /// How many webhook bodies are read at once; one more is answered 503 at once.
    pub max_webhook_bodies: usize,
    /// How many long-polls of one cluster are held at once; a new one ends the oldest,
    /// answered as a poll whose wait ended.
    pub max_polls_per_cluster: usize,
}

impl Default for RequestLimits {
    fn default() -> RequestLimits {
        RequestLimits {
            webhook_body_timeout: Duration::from_secs(10),
            max_webhook_bodies: 8,
            max_polls_per_cluster: 4,
        }
    }
}

/// What the request limits keep count of: the webhook bodies being read and the polls
/// held for each cluster.
struct Gates {
    limits: RequestLimits,
    webhook_bodies: tokio::sync::Semaphore,
    /// When webhooks may wake the follower next ([`HookPacer`]).
    hook_pacer: Arc<std::sync::Mutex<HookPacer>>,
    polls: Arc<HeldPolls>,
    /// The deltas made for agents that run an earlier digest (RFC 9842 `dcz`).
    deltas: Arc<delta::Deltas>,
}

type GatesExtension = Extension<Arc<Gates>>;

pub fn router(shared: Arc<Shared>, limits: RequestLimits) -> Router {
    let gates = Arc::new(Gates {
        limits,
        webhook_bodies: tokio::sync::Semaphore::new(limits.max_webhook_bodies),
        hook_pacer: Arc::default(),
        polls: Arc::default(),
        deltas: Arc::new(delta::Deltas::new()),
    });
    tokio::spawn(delta::make_ahead(shared.clone(), gates.deltas.clone()));
    ENDPOINTS
        .iter()
        .fold(
            Router::new().route(INDEX, get(index)),
            |router, endpoint| router.route(endpoint.path, (endpoint.handler)()),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(Extension(gates))
        .with_state(shared)
}

/// One endpoint of the API: the router routes it and `GET /` lists it, both from
/// [`ENDPOINTS`], so the index cannot leave out a route.
struct Endpoint {
    method: &'static str,
    path: &'static str,
    auth: &'static str,
    what: &'static str,
    handler: fn() -> axum::routing::MethodRouter<Arc<Shared>>,
}

const CLUSTER_TOKEN: &str = "the cluster's token (an admin token reads too)";
const PERSON_TOKEN: &str =
    "a person's token: viewer, operator or admin (a tenant's token sees its tenant's part)";
const STEERING_TOKEN: &str = "an operator's or admin's token (a tenant's only for rollouts that change nothing but its workloads)";

/// Every endpoint of the API, in the order of docs/api.md's table.
const ENDPOINTS: &[Endpoint] = {
    use flotilla_core::api::routes;
    &[
        Endpoint {
            method: "GET",
            path: routes::BUNDLE,
            auth: CLUSTER_TOKEN,
            what: "the cluster's current bundle; ETag is its digest, If-None-Match answers 304, ?wait=30s long-polls",
            handler: || get(get_bundle),
        },
        Endpoint {
            method: "GET",
            path: routes::BUNDLE_BY_DIGEST,
            auth: CLUSTER_TOKEN,
            what: "an earlier bundle of the cluster, by digest (immutable)",
            handler: || get(get_bundle_at),
        },
        Endpoint {
            method: "POST",
            path: routes::STATUS,
            auth: "the cluster's token",
            what: "the agent's status report",
            handler: || post(post_status).layer(DefaultBodyLimit::max(STATUS_BODY_LIMIT)),
        },
        Endpoint {
            method: "GET",
            path: routes::FLEET,
            auth: PERSON_TOKEN,
            what: "every cluster's desired and applied digest, state and last report; render errors",
            handler: || get(get_fleet),
        },
        Endpoint {
            method: "GET",
            path: routes::ROLLOUTS,
            auth: PERSON_TOKEN,
            what: "the rollouts under way, then the most recent ended ones",
            handler: || get(get_rollouts),
        },
        Endpoint {
            method: "GET",
            path: routes::ROLLOUT,
            auth: PERSON_TOKEN,
            what: "one rollout, with its events and its clusters",
            handler: || get(get_rollout),
        },
        Endpoint {
            method: "POST",
            path: routes::ROLLOUT_ACTION,
            auth: STEERING_TOKEN,
            what: "steer a rollout: {action} is pause, resume, promote or abort",
            handler: || post(post_rollout_action),
        },
        Endpoint {
            method: "POST",
            path: routes::GIT_HOOK,
            auth: "an HMAC signature (X-Hub-Signature-256)",
            what: "a push happened: look for a new commit now",
            handler: || post(post_hook).layer(DefaultBodyLimit::max(HOOK_BODY_LIMIT)),
        },
        Endpoint {
            method: "GET",
            path: routes::HEALTHZ,
            auth: "none",
            what: "liveness",
            handler: || get(healthz),
        },
        Endpoint {
            method: "GET",
            path: routes::READYZ,
            auth: "none",
            what: "readiness: 200 once bundles are served",
            handler: || get(readyz),
        },
        Endpoint {
            method: "GET",
            path: routes::METRICS,
            auth: "none",
            what: "Prometheus text format",
            handler: || get(metrics),
        },
    ]
};

/// The long-polls held for each cluster, oldest first.
#[derive(Default)]
struct HeldPolls {
    next_id: AtomicU64,
    held: Mutex<HashMap<String, VecDeque<PollEnd>>>,
}

/// A held poll's id, and what ends it.
type PollEnd = (u64, Arc<Notify>);

/// One held poll, counted until dropped; `ended` wakes it when newer polls of its
/// cluster pushed it out.
struct HeldPoll {
    polls: Arc<HeldPolls>,
    cluster: String,
    id: u64,
    ended: Arc<Notify>,
}

impl HeldPolls {
    /// Counts a poll of `cluster`, ending the oldest held ones beyond `cap`.
    fn hold(self: &Arc<Self>, cluster: &str, cap: usize) -> HeldPoll {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ended = Arc::new(Notify::new());
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let polls = held.entry(cluster.to_string()).or_default();
        polls.push_back((id, ended.clone()));
        while polls.len() > cap.max(1) {
            if let Some((_, older)) = polls.pop_front() {
                // Stored if that poll is not waiting yet: it ends when it begins to.
                older.notify_one();
            }
        }
        HeldPoll {
            polls: self.clone(),
            cluster: cluster.to_string(),
            id,
            ended,
        }
    }
}

impl Drop for HeldPoll {
    fn drop(&mut self) {
        let mut held = self.polls.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(polls) = held.get_mut(&self.cluster) {
            polls.retain(|(id, _)| *id != self.id);
            if polls.is_empty() {
                held.remove(&self.cluster);
            }
        }
    }
}

/// A refusal answered without reading the request's body: on HTTP/1 the connection
/// is closed after it, so whatever of the body is still on its way is never read.
fn refused_unread(err: ApiError, request: &Request) -> Response {
    let unread = !request.body().is_end_stream();
    closing(
        err.into_response(),
        unread && request.version() <= Version::HTTP_11,
    )
}

/// `response`, with `Connection: close` when `close` (on HTTP/1 only: HTTP/2 has no
/// such header).
fn closing(mut response: Response, close: bool) -> Response {
    if close {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Every error the API returns: JSON `{"error": "..."}` with a status code.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    fn not_ready() -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the hub is starting and has not loaded its store yet; retry shortly",
            )
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&json!({ "error": self.message })).unwrap_or_default();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, JSON);
        headers.insert(CACHE_CONTROL, NO_STORE);
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, JSON);
    response.headers_mut().insert(CACHE_CONTROL, NO_STORE);
    response
}

fn path_error(rejection: PathRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, rejection.body_text())
}

/// A path's parameters, rejected with the API's own error (400, with axum's reason).
struct ApiPath<T>(T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(path_error)
    }
}

/// A hub that has loaded its store: 503, with `Retry-After`, while it starts.
struct Ready;

impl FromRequestParts<Arc<Shared>> for Ready {
    type Rejection = ApiError;

    async fn from_request_parts(_: &mut Parts, shared: &Arc<Shared>) -> Result<Self, ApiError> {
        if shared.view.is_ready() {
            Ok(Ready)
        } else {
            Err(ApiError::not_ready())
        }
    }
}

/// The grant of the request's bearer token, on a ready hub (503 while it starts, 401
/// for a missing or unknown token), and the token's id.
struct Token {
    grant: Grant,
    id: String,
}

impl FromRequestParts<Arc<Shared>> for Token {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> Result<Self, ApiError> {
        let Ready = Ready::from_request_parts(parts, shared).await?;
        let (grant, id) = shared
            .recorder
            .grant_with_id(parts.headers.get(AUTHORIZATION))
            .await
            .map_err(|err| ApiError::new(StatusCode::UNAUTHORIZED, err.message()))?;
        Ok(Token { grant, id })
    }
}

/// What a request for people is about, for the error a token that may not gets.
trait ForPeople {
    const WHAT: &'static str;
}

/// A person's token (any role; a tenant's too), recorded with operator actions, on a
/// hub that has loaded its store: the checks every path for people makes (503 while
/// starting, 401, 403 for a cluster's token).
struct Reader<W> {
    person: Person,
    token_id: String,
    about: std::marker::PhantomData<W>,
}

impl<W: ForPeople> FromRequestParts<Arc<Shared>> for Reader<W> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> Result<Self, ApiError> {
        match Token::from_request_parts(parts, shared).await? {
            Token {
                grant: Grant::Cluster(_),
                ..
            } => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "{} needs a person's token, not a cluster's (`flotilla token create --role viewer|operator|admin`)",
                    W::WHAT
                ),
            )),
            Token {
                grant: Grant::Person(person),
                id,
            } => Ok(Reader {
                person,
                token_id: id,
                about: std::marker::PhantomData,
            }),
        }
    }
}

/// A person's token whose role steers rollouts (operator or admin): 403 for a viewer.
struct Steerer<W>(Reader<W>);

impl<W: ForPeople> FromRequestParts<Arc<Shared>> for Steerer<W> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> Result<Self, ApiError> {
        let reader = Reader::<W>::from_request_parts(parts, shared).await?;
        if !reader.person.role.steers() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "{} needs an operator's or admin's token; this token is a {}'s (read only)",
                    W::WHAT,
                    reader.person.role
                ),
            ));
        }
        Ok(Steerer(reader))
    }
}

struct TheFleetSummary;
impl ForPeople for TheFleetSummary {
    const WHAT: &'static str = "the fleet summary";
}

struct TheRollouts;
impl ForPeople for TheRollouts {
    const WHAT: &'static str = "the rollouts";
}

struct ARollout;
impl ForPeople for ARollout {
    const WHAT: &'static str = "a rollout";
}

struct SteeringARollout;
impl ForPeople for SteeringARollout {
    const WHAT: &'static str = "steering a rollout";
}

/// A path whose first parameter names a cluster.
trait ClusterPath: serde::de::DeserializeOwned + Send {
    fn cluster(&self) -> &str;
}

impl ClusterPath for String {
    fn cluster(&self) -> &str {
        self
    }
}

impl ClusterPath for (String, String) {
    fn cluster(&self) -> &str {
        &self.0
    }
}

/// A read of the bundles of the cluster the path names, with a token that may read
/// it: the path's parameters, the cluster's current bundle and whether the token is
/// the cluster's own (whose polls count as the cluster being seen). A cluster token
/// reads only its own cluster (403 for any other); an admin token reads any. 404 only
/// when the cluster the token may read is not served.
struct ClusterRead<P> {
    path: P,
    entry: Arc<ClusterBundle>,
    own: bool,
}

impl<P: ClusterPath> FromRequestParts<Arc<Shared>> for ClusterRead<P> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> Result<Self, ApiError> {
        let ApiPath(path) = ApiPath::<P>::from_request_parts(parts, shared).await?;
        let cluster = path.cluster();
        let own = match Token::from_request_parts(parts, shared).await?.grant {
            Grant::Cluster(own) if *own != *cluster => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "this token belongs to cluster {own:?} and cannot read cluster {cluster:?}"
                    ),
                ));
            }
            Grant::Cluster(_) => true,
            Grant::Person(person) if person.role.reads_bundles() && person.tenant.is_none() => {
                false
            }
            // Before the cluster is looked up: the answer tells nothing of the fleet.
            Grant::Person(person) => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "{}'s token never reads bundles (they may hold Secrets); use an admin token",
                        person.role.with_article()
                    ),
                ));
            }
        };
        let entry = shared.view.served_to(cluster).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no cluster named {cluster:?} is served (is it in the fleet repository, and did its last commit render?)"),
            )
        })?;
        Ok(ClusterRead { path, entry, own })
    }
}

/// The cluster the path names, for a status report with the cluster's own token: 403
/// for another cluster's token or an admin token, 404 when the cluster is not served.
struct ClusterReport {
    cluster: String,
}

impl FromRequestParts<Arc<Shared>> for ClusterReport {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> Result<Self, ApiError> {
        let ApiPath(cluster) = ApiPath::<String>::from_request_parts(parts, shared).await?;
        match Token::from_request_parts(parts, shared).await?.grant {
            Grant::Cluster(own) if *own == *cluster => {}
            Grant::Cluster(own) => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "this token belongs to cluster {own:?} and cannot report for cluster {cluster:?}"
                    ),
                ));
            }
            Grant::Person(_) => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "a person's token cannot report status; use the cluster's own token",
                ));
            }
        }
        if shared.view.served_to(&cluster).is_none() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no cluster named {cluster:?} is served"),
            ));
        }
        Ok(ClusterReport { cluster })
    }
}

async fn get_bundle(
    State(shared): SharedState,
    Extension(gates): GatesExtension,
    read: Result<ClusterRead<String>, ApiError>,
    request: Request,
) -> Response {
    let response = match read {
        Ok(read) => {
            // A long-poll may be held for minutes: keep copies, not the request.
            let (parts, _) = request.into_parts();
            let query = parts.uri.query().map(str::to_owned);
            let headers = owned_headers(&parts.headers);
            drop(parts);
            current_bundle(&shared, &gates, read, &headers, query.as_deref())
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
        Err(err) => err.into_response(),
    };
    shared.metrics.count_bundle_response(response.status());
    response
}

/// Copies of a request's headers that share no memory with it. hyper's header values
/// and URI are slices of the connection's read buffer; while a request is in flight,
/// hyper reads into a new buffer (to notice the client going away), so a held poll that
/// kept its request's headers would keep a second buffer of 8 KiB alive for as long as
/// it is held: about 80 MB for 10,000 agents.
fn owned_headers(headers: &HeaderMap) -> HeaderMap {
    let mut owned = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let copy = match HeaderValue::from_bytes(value.as_bytes()) {
            Ok(mut copy) => {
                copy.set_sensitive(value.is_sensitive());
                copy
            }
            // Never for a value hyper parsed; the shared one is as right, only larger.
            Err(_) => value.clone(),
        };
        owned.append(name.clone(), copy);
    }
    owned
}

async fn current_bundle(
    shared: &Arc<Shared>,
    gates: &Gates,
    read: ClusterRead<String>,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    let ClusterRead {
        path: cluster,
        entry,
        own,
    } = read;
    if own {
        shared.recorder.saw(&entry, shared.settings.clock.now_ms());
    }
    let wait = parse_wait(query)?;
    let if_none_match = headers.get(IF_NONE_MATCH);
    let named = agent_features(headers);
    if let Some(named) = named {
        let missing = missing_features(shared, &entry, named).await?;
        if own {
            shared.recorder.agent_lacks(&entry, &missing);
        }
        if !missing.is_empty() {
            return Ok(behind(shared, &entry, if_none_match, wait, &missing).await);
        }
    }
    let Some(mut etag) = if_none_match.and_then(|value| unchanged_etag(value, &entry)) else {
        return sent(shared, &gates.deltas, entry, headers, own, false).await;
    };
    let mut entry = entry;
    if let (Some(wait), Some(value)) = (wait, if_none_match) {
        let wait = wait.min(shared.settings.max_wait);
        let held = gates
            .polls
            .hold(&cluster, gates.limits.max_polls_per_cluster);
        match wait_for_change(shared, &cluster, value, wait, &held).await {
            Change::Changed(newer) => {
                // The token was checked when the poll began, minutes ago maybe: one
                // revoked since gets no bundle.
                shared
                    .recorder
                    .grant_with_id(headers.get(AUTHORIZATION))
                    .await
                    .map_err(|err| ApiError::new(StatusCode::UNAUTHORIZED, err.message()))?;
                // What it changed to may need a feature the agent lacks.
                if let Some(named) = named {
                    let missing = missing_features(shared, &newer, named).await?;
                    if own {
                        shared.recorder.agent_lacks(&newer, &missing);
                    }
                    if !missing.is_empty() {
                        return Ok(behind(shared, &newer, if_none_match, None, &missing).await);
                    }
                }
                return sent(shared, &gates.deltas, newer, headers, own, true).await;
            }
            Change::Gone => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("cluster {cluster:?} was removed from the fleet repository"),
                ));
            }
            Change::Unchanged(latest, latest_etag) => {
                entry = latest;
                etag = latest_etag;
            }
        }
    }
    if own {
        let now = shared.settings.clock.now_ms();
        if etag == entry.etag {
            shared.recorder.fetched(&entry, now);
        } else {
            shared.recorder.saw(&entry, now);
        }
    }
    let mut response = not_modified(&entry, REVALIDATE);
    if etag != entry.etag {
        // Held on what the agent runs: its own ETag back, and no revision (the hub
        // may not know which commit produced it).
        response.headers_mut().insert(ETAG, etag);
        response.headers_mut().remove(&X_FLOTILLA_REVISION);
    }
    Ok(response)
}

/// The bundle features the requesting agent names (a bit set, see
/// `flotilla_core::bundle::features::bits`): those of its `Flotilla-Features` header,
/// or none for a flotilla agent older than the header. `None` for any other client
/// (curl, a browser, a mirror): it gets every bundle as it is.
fn agent_features(headers: &HeaderMap) -> Option<u8> {
    if let Some(value) = headers.get(features::HEADER) {
        let text = value.to_str().unwrap_or_default();
        return Some(features::bits(features::parse(text)));
    }
    let agent = headers.get(USER_AGENT)?.to_str().ok()?;
    agent.starts_with("flotilla-agent/").then_some(0)
}

/// The features the entry's bundle needs that the agent did not name.
async fn missing_features(
    shared: &Arc<Shared>,
    entry: &Arc<ClusterBundle>,
    named: u8,
) -> Result<Vec<&'static str>, ApiError> {
    let every = features::bits(features::ALL);
    if named & every == every {
        return Ok(Vec::new());
    }
    let lacking = |needs: &[&'static str]| -> Vec<&'static str> {
        needs
            .iter()
            .copied()
            .filter(|need| named & features::bits([*need]) == 0)
            .collect()
    };
    if let Some(needs) = entry.known_needs() {
        return Ok(lacking(needs));
    }
    let (shared_for_read, entry_for_read) = (shared.clone(), entry.clone());
    let needs = tokio::task::spawn_blocking(move || {
        shared_for_read.view.reads().needs_blocking(&entry_for_read)
    })
    .await
    .map_err(|err| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
    .map_err(|err| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the stored bundle of cluster {:?} cannot be read: {err}",
                entry.name
            ),
        )
    })?;
    Ok(lacking(&needs))
}

/// The answer to an agent that lacks features the cluster's bundle needs: it keeps
/// what it runs. With an `If-None-Match`, a 304 naming what it runs, after the wait it
/// asked for (or sooner, when what the cluster is served changes); without one (it
/// runs nothing yet), a 409 saying what to upgrade.
async fn behind(
    shared: &Shared,
    entry: &ClusterBundle,
    if_none_match: Option<&HeaderValue>,
    wait: Option<Duration>,
    missing: &[&str],
) -> Response {
    let runs = if_none_match.and_then(named_digest);
    tracing::warn!(
        cluster = %entry.name,
        digest = %entry.digest,
        "the cluster's bundle needs bundle features its agent does not name ({}): it keeps what it runs until its agent is upgraded",
        missing.join(", ")
    );
    let Some(runs) = runs else {
        return ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "cluster {:?} is served a bundle that needs bundle features this agent does not name ({}); upgrade flotilla-agent",
                entry.name,
                missing.join(", ")
            ),
        )
        .into_response();
    };
    if let Some(wait) = wait {
        let wait = wait.min(shared.settings.max_wait);
        let mut generation = shared.view.generations();
        let mut shutdown = shared.shutdown.subscribe();
        if !*shutdown.borrow() {
            tokio::select! {
                _ = generation.changed() => {}
                _ = shutdown.changed() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
    let mut response = not_modified(entry, REVALIDATE);
    response.headers_mut().insert(ETAG, runs);
    response.headers_mut().remove(&X_FLOTILLA_REVISION);
    response
}

/// A 200 with the entry's bundle; for the cluster's own token it marks the cluster
/// as having fetched what it is served, and tells the rollouts when that is the
/// digest HEAD renders for it (so a silence after taking it counts). A request that
/// names the digest it runs (`Available-Dictionary`) and accepts `dcz` gets the
/// delta from it when one is made (a long-poll a change `woken` waits a little for
/// it), else the full document.
async fn sent(
    shared: &Arc<Shared>,
    deltas: &Arc<delta::Deltas>,
    entry: Arc<ClusterBundle>,
    headers: &HeaderMap,
    own: bool,
    woken: bool,
) -> Result<Response, ApiError> {
    let delta = match delta::requested(headers) {
        Some(base) => delta::answer(shared, deltas, &entry, &base, woken).await,
        None => None,
    };
    let response = match delta {
        Some(body) => delta_response(shared, &entry, body),
        None => full_response(shared, entry.clone(), headers, REVALIDATE).await?,
    };
    if own {
        shared
            .recorder
            .fetched(&entry, shared.settings.clock.now_ms());
        let governed_latest = shared
            .view
            .latest()
            .get(&entry.name)
            .is_some_and(|l| l.policy.is_some() && l.digest == entry.digest);
        if governed_latest && !entry.hold {
            shared.recorder.wake_rollouts();
        }
    }
    Ok(response)
}

/// The ETag a 304 carries when `If-None-Match` says the agent has what it should
/// keep: the entry's own ETag, or, for a held cluster, the digest the agent names
/// (it keeps what it runs until its wave is released). `None`: send the bundle.
fn unchanged_etag(value: &HeaderValue, entry: &ClusterBundle) -> Option<HeaderValue> {
    if etag_matches(value, entry) {
        return Some(entry.etag.clone());
    }
    if !entry.hold {
        return None;
    }
    named_digest(value)
}

/// The ETag of the first digest an `If-None-Match` value names: what the agent runs.
fn named_digest(value: &HeaderValue) -> Option<HeaderValue> {
    let text = value.to_str().ok()?;
    text.split(',').find_map(|part| {
        let part = part.trim();
        let part = part.strip_prefix("W/").unwrap_or(part);
        let digest = Digest::parse(part.trim_matches('"')).ok()?;
        HeaderValue::from_str(&format!("\"{digest}\"")).ok()
    })
}

enum Change {
    Changed(Arc<ClusterBundle>),
    Gone,
    /// Still unchanged when the wait ended: the entry then, and the ETag to answer.
    Unchanged(Arc<ClusterBundle>, HeaderValue),
}

/// Holds a request until its `If-None-Match` no longer matches what the cluster is
/// served, the wait ends, newer polls of the cluster end it (beyond
/// [`RequestLimits::max_polls_per_cluster`]), or the hub shuts down.
async fn wait_for_change(
    shared: &Shared,
    cluster: &str,
    if_none_match: &HeaderValue,
    wait: Duration,
    held: &HeldPoll,
) -> Change {
    let deadline = Instant::now() + wait;
    // Subscribe before looking, so a change between the look and the wait still wakes us.
    let mut generation = shared.view.generations();
    let mut shutdown = shared.shutdown.subscribe();
    let _held = shared.metrics.long_poll_started();
    loop {
        let Some(entry) = shared.view.served_to(cluster) else {
            return Change::Gone;
        };
        let Some(etag) = unchanged_etag(if_none_match, &entry) else {
            return Change::Changed(entry);
        };
        if *shutdown.borrow() {
            return Change::Unchanged(entry, etag);
        }
        tokio::select! {
            changed = generation.changed() => {
                if changed.is_err() {
                    return Change::Unchanged(entry, etag);
                }
            }
            _ = shutdown.changed() => return Change::Unchanged(entry, etag),
            _ = tokio::time::sleep_until(deadline) => return Change::Unchanged(entry, etag),
            _ = held.ended.notified() => return Change::Unchanged(entry, etag),
        }
    }
}

/// `?wait=30s` (any humantime duration, or plain seconds).
fn parse_wait(query: Option<&str>) -> Result<Option<Duration>, ApiError> {
    let Some(query) = query else {
        return Ok(None);
    };
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "wait" {
            continue;
        }
        let parsed = value
            .parse::<u64>()
            .map(Duration::from_secs)
            .or_else(|_| humantime::parse_duration(value));
        return parsed.map(Some).map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("wait={value:?} is not a duration; write it like wait=30s"),
            )
        });
    }
    Ok(None)
}

/// Whether an `If-None-Match` value names the entry's ETag (weak or strong, in a list,
/// `*`, or the bare digest without quotes).
fn etag_matches(value: &HeaderValue, entry: &ClusterBundle) -> bool {
    let value = value.as_bytes();
    let etag = entry.etag.as_bytes();
    if value == etag {
        return true;
    }
    value.split(|&b| b == b',').any(|part| {
        let part = part.trim_ascii();
        let part = part.strip_prefix(b"W/").unwrap_or(part);
        part == etag || part == b"*" || part == entry.digest.as_str().as_bytes()
    })
}

fn choose_encoding(headers: &HeaderMap) -> Encoding {
    let Some(value) = headers.get(ACCEPT_ENCODING).and_then(|v| v.to_str().ok()) else {
        return Encoding::Identity;
    };
    let (mut gzip, mut zstd) = (false, false);
    for name in flotilla_core::api::accepted_encodings(value) {
        if name.eq_ignore_ascii_case("zstd") {
            zstd = true;
        } else if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            gzip = true;
        }
    }
    if zstd {
        Encoding::Zstd
    } else if gzip {
        Encoding::Gzip
    } else {
        Encoding::Identity
    }
}

fn bundle_headers(response: &mut Response, entry: &ClusterBundle, cache: HeaderValue) {
    let headers = response.headers_mut();
    headers.insert(ETAG, entry.etag.clone());
    headers.insert(X_FLOTILLA_REVISION.clone(), entry.revision_header.clone());
    headers.insert(CACHE_CONTROL, cache);
    headers.insert(VARY, VARY_ENCODING);
}

fn not_modified(entry: &ClusterBundle, cache: HeaderValue) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NOT_MODIFIED;
    bundle_headers(&mut response, entry, cache);
    response
}

async fn full_response(
    shared: &Arc<Shared>,
    entry: Arc<ClusterBundle>,
    headers: &HeaderMap,
    cache: HeaderValue,
) -> Result<Response, ApiError> {
    let encoding = choose_encoding(headers);
    let body = match entry.cached(encoding) {
        Some(body) => body,
        None => {
            // The semaphore is never closed.
            let _permit = shared.answering.acquire().await.ok();
            // Another request may have made it meanwhile.
            if let Some(body) = entry.cached(encoding) {
                shared
                    .metrics
                    .bundle_bytes_sent(&entry.name, encoding_name(encoding), body.len());
                return Ok(bundle_response(&entry, body, encoding, cache));
            }
            let shared = shared.clone();
            let entry = entry.clone();
            tokio::task::spawn_blocking(move || {
                shared
                    .view
                    .reads()
                    .document(&entry, shared.settings.signing_key.as_deref())
                    .map(|document| entry.encoded(encoding, &document))
                    .map_err(|err| {
                        tracing::error!(cluster = %entry.name, "cannot serve the bundle: {err}");
                        ApiError::new(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!(
                                "the stored bundle of cluster {:?} cannot be read: {err}",
                                entry.name
                            ),
                        )
                    })
            })
            .await
            .map_err(|err| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))??
        }
    };
    shared
        .metrics
        .bundle_bytes_sent(&entry.name, encoding_name(encoding), body.len());
    Ok(bundle_response(&entry, body, encoding, cache))
}

/// A 200 with a delta (RFC 9842 `dcz`): it differs with the dictionary the request
/// names, so no cache may give it to another.
fn delta_response(shared: &Shared, entry: &ClusterBundle, body: Bytes) -> Response {
    shared
        .metrics
        .bundle_bytes_sent(&entry.name, dcz::ENCODING, body.len());
    let mut response = Response::new(Body::from(body));
    bundle_headers(&mut response, entry, REVALIDATE);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, JSON);
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(dcz::ENCODING));
    headers.insert(VARY, VARY_DICTIONARY);
    response
}

fn encoding_name(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Identity => "identity",
        Encoding::Gzip => "gzip",
        Encoding::Zstd => "zstd",
    }
}

fn bundle_response(
    entry: &ClusterBundle,
    body: Bytes,
    encoding: Encoding,
    cache: HeaderValue,
) -> Response {
    let mut response = Response::new(Body::from(body));
    bundle_headers(&mut response, entry, cache);
    response.headers_mut().insert(CONTENT_TYPE, JSON);
    if let Some(value) = encoding.header() {
        response.headers_mut().insert(CONTENT_ENCODING, value);
    }
    response
}

async fn get_bundle_at(
    State(shared): SharedState,
    read: Result<ClusterRead<(String, String)>, ApiError>,
    headers: HeaderMap,
) -> Response {
    let response = match read {
        Ok(read) => bundle_at(&shared, read, &headers)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(err) => err.into_response(),
    };
    shared.metrics.count_bundle_response(response.status());
    response
}

async fn bundle_at(
    shared: &Arc<Shared>,
    read: ClusterRead<(String, String)>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let ClusterRead {
        path: (cluster, digest),
        entry: current,
        ..
    } = read;
    let cluster = cluster.as_str();
    let digest = Digest::parse(&digest)
        .map_err(|err| ApiError::new(StatusCode::BAD_REQUEST, err.to_string()))?;
    // A bundle by digest is history and carries no signature; the current one is the
    // same document as `/bundle` only when the hub does not sign.
    if digest == current.digest && shared.settings.signing_key.is_none() {
        if headers
            .get(IF_NONE_MATCH)
            .is_some_and(|value| etag_matches(value, &current))
        {
            return Ok(not_modified(&current, IMMUTABLE));
        }
        return full_response(shared, current, headers, IMMUTABLE).await;
    }
    let revision = if digest == current.digest {
        Some(current.revision.clone())
    } else {
        shared
            .view
            .reads()
            .revision_in_history(cluster, &digest)
            .await
            .map_err(|err| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
    };
    let revision = revision.ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "cluster {cluster:?} has no bundle {digest}; the hub keeps the last {} digests of each cluster",
                    shared.settings.history
                ),
            )
        })?;
    let entry = ClusterBundle::new(cluster.to_string(), digest, revision);
    if headers
        .get(IF_NONE_MATCH)
        .is_some_and(|value| etag_matches(value, &entry))
    {
        return Ok(not_modified(&entry, IMMUTABLE));
    }
    let shared_for_read = shared.clone();
    let digest = entry.digest.clone();
    let canonical =
        tokio::task::spawn_blocking(move || shared_for_read.view.reads().object_blocking(&digest))
            .await
            .map_err(|err| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
            .map_err(|err| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    let document = document_bytes(&entry.name, &entry.digest, &entry.revision, &canonical);
    let mut response = Response::new(Body::from(document));
    bundle_headers(&mut response, &entry, IMMUTABLE);
    response.headers_mut().insert(CONTENT_TYPE, JSON);
    Ok(response)
}

/// The report's checks are an extractor's, made before a byte of the body is read: a
/// refusal is answered at once and, on HTTP/1, its connection closed (a client without
/// the cluster's token cannot hold a connection by sending a body slowly).
async fn post_status(
    State(shared): SharedState,
    report: Result<ClusterReport, ApiError>,
    request: Request,
) -> Response {
    match report {
        Ok(ClusterReport { cluster }) => store_status(&shared, &cluster, request)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(err) => refused_unread(err, &request),
    }
}

/// Whether the request says its body is JSON: `application/json`, with or without
/// parameters such as `; charset=utf-8`.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

async fn store_status(
    shared: &Arc<Shared>,
    cluster: &str,
    request: Request,
) -> Result<Response, Response> {
    if !is_json(request.headers()) {
        return Err(refused_unread(
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a status report must be sent as Content-Type: application/json",
            ),
            &request,
        ));
    }
    let coding = match ReportCoding::of(request.headers()) {
        Ok(coding) => coding,
        Err(err) => return Err(with_report_encodings(refused_unread(err, &request))),
    };
    let body =
        Bytes::from_request(request, shared)
            .await
            .map_err(|rejection: BytesRejection| {
                ApiError::new(rejection.status(), rejection.body_text()).into_response()
            })?;
    let body = coding.decode(body).map_err(IntoResponse::into_response)?;
    stored_status(shared, cluster, &body)
        .await
        .map(with_report_encodings)
        .map_err(IntoResponse::into_response)
}

/// How a status report's body is encoded (`Content-Encoding`): as it is, or
/// compressed by an agent the hub told it may (see [`api::REPORT_ENCODINGS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReportCoding {
    Identity,
    Gzip,
    Zstd,
}

impl ReportCoding {
    fn of(headers: &HeaderMap) -> Result<ReportCoding, ApiError> {
        let Some(value) = headers.get(CONTENT_ENCODING) else {
            return Ok(ReportCoding::Identity);
        };
        let value = value.to_str().unwrap_or("").trim();
        match value.to_ascii_lowercase().as_str() {
            "" | "identity" => Ok(ReportCoding::Identity),
            "gzip" | "x-gzip" => Ok(ReportCoding::Gzip),
            "zstd" => Ok(ReportCoding::Zstd),
            _ => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "a status report's Content-Encoding may be {} (or none), not {value:?}",
                    api::REPORT_ENCODINGS
                ),
            )),
        }
    }

    /// The report's JSON: a compressed body may unpack to at most the limit of a
    /// plain one ([`STATUS_BODY_LIMIT`]), so a small body cannot make the hub hold a
    /// large one.
    fn decode(self, body: Bytes) -> Result<Bytes, ApiError> {
        use std::io::Read as _;
        let limit = STATUS_BODY_LIMIT as u64;
        let mut out = Vec::new();
        let read = match self {
            ReportCoding::Identity => return Ok(body),
            ReportCoding::Gzip => flate2::read::MultiGzDecoder::new(&body[..])
                .take(limit + 1)
                .read_to_end(&mut out),
            ReportCoding::Zstd => zstd::stream::read::Decoder::new(&body[..])
                .and_then(|decoder| decoder.take(limit + 1).read_to_end(&mut out)),
        };
        read.map_err(|err| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the status report's compressed body cannot be read: {err}"),
            )
        })?;
        if out.len() as u64 > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a status report unpacks to at most {STATUS_BODY_LIMIT} bytes"),
            ));
        }
        Ok(Bytes::from(out))
    }
}

/// `response` naming the codings a report may come in (RFC 7694).
fn with_report_encodings(mut response: Response) -> Response {
    response.headers_mut().insert(
        ACCEPT_ENCODING,
        HeaderValue::from_static(api::REPORT_ENCODINGS),
    );
    response
}

async fn stored_status(
    shared: &Arc<Shared>,
    cluster: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let report: StatusReport = serde_json::from_slice(body).map_err(|err| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the status report is not valid: {err} (see docs/api.md for its shape)"),
        )
    })?;
    report
        .check_limits()
        .map_err(|message| ApiError::new(StatusCode::BAD_REQUEST, message))?;
    shared
        .recorder
        .report(cluster, report)
        .await
        .map_err(|err| match err {
            ReportRefused::NotServed(_) => ApiError::new(StatusCode::NOT_FOUND, err.to_string()),
            ReportRefused::Store(err) => {
                tracing::error!(cluster, "cannot store a status report: {err}");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
            }
        })?;
    let summary = shared.view.fleet_summary_of(cluster);
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "cluster": cluster,
            "desired": summary.as_ref().map(|c| &c.desired),
            "state": summary.as_ref().map(|c| c.state),
        }),
    ))
}

/// `GET /v1/fleet[?drifted=true|false]`: the filter narrows the cluster list only. A
/// tenant's token sees the clusters its tenant is on, and of them its own resources.
async fn get_fleet(
    State(shared): SharedState,
    reader: Reader<TheFleetSummary>,
    filter: Result<
        axum::extract::Query<crate::fleet::FleetFilter>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Response, ApiError> {
    let axum::extract::Query(filter) = filter.map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the fleet's filter is drifted=true or drifted=false",
        )
    })?;
    let mut summary = shared.view.fleet_summary();
    if let Some(tenant) = reader.person.tenant {
        summary = TenantView::read(&shared, tenant).await.fleet(summary);
    }
    filter.apply(&mut summary);
    Ok(json_response(StatusCode::OK, &summary))
}

fn hub_error(err: impl ToString) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
}

fn no_rollout(id: i64) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no rollout with id {id} (GET /v1/rollouts lists them)"),
    )
}

async fn get_rollouts(State(shared): SharedState, reader: Reader<TheRollouts>) -> Response {
    let result = async {
        let mut rollouts = shared.recorder.rollout_list().await.map_err(hub_error)?;
        if let Some(tenant) = reader.person.tenant {
            rollouts = TenantView::read(&shared, tenant)
                .await
                .visible(&shared, rollouts)
                .await;
        }
        Ok::<_, ApiError>(json_response(
            StatusCode::OK,
            &json!({ "rollouts": rollouts }),
        ))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

fn rollout_id(text: &str) -> Result<i64, ApiError> {
    text.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{text:?} is not a rollout id (GET /v1/rollouts lists them)"),
        )
    })
}

/// A rollout as the person sees it, with what a tenant's token may do with it: 404
/// for a rollout a tenant's token does not see, as for one that does not exist.
async fn rollout_for(
    shared: &Arc<Shared>,
    person: &Person,
    id: i64,
) -> Result<(flotilla_core::rollout::view::RolloutView, RolloutAccess), ApiError> {
    let view = shared
        .recorder
        .rollout_detail(id)
        .await
        .map_err(hub_error)?
        .ok_or_else(|| no_rollout(id))?;
    let Some(tenant) = person.tenant.clone() else {
        return Ok((view, RolloutAccess::Steerable));
    };
    let scope = TenantView::read(shared, tenant)
        .await
        .rollout(shared, &view)
        .await;
    match scope.access {
        RolloutAccess::Hidden => Err(no_rollout(id)),
        access => Ok((scope.cut(view), access)),
    }
}

async fn get_rollout(
    State(shared): SharedState,
    ApiPath(id): ApiPath<String>,
    reader: Reader<ARollout>,
) -> Response {
    let result = async {
        let id = rollout_id(&id)?;
        let (view, _) = rollout_for(&shared, &reader.person, id).await?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &view))
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn post_rollout_action(
    State(shared): SharedState,
    ApiPath((id, action)): ApiPath<(String, String)>,
    Steerer(steerer): Steerer<SteeringARollout>,
) -> Response {
    let by = steerer.token_id;
    let role = steerer.person.label();
    let result = async {
        let id = rollout_id(&id)?;
        let action = Action::parse(&action).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no action {action:?}; the actions are pause, resume, promote and abort"),
            )
        })?;
        if let Some(tenant) = &steerer.person.tenant {
            let (_, access) = rollout_for(&shared, &steerer.person, id).await?;
            if access != RolloutAccess::Steerable {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "rollout {id} changes more than tenant {tenant:?}'s workloads; only a token for the whole fleet steers it"
                    ),
                ));
            }
        }
        match shared.recorder.rollout_action(id, action, (&by, &role)).await {
            Ok(view) => {
                let view = match steerer.person.tenant.clone() {
                    Some(tenant) => TenantView::read(&shared, tenant)
                        .await
                        .rollout(&shared, &view)
                        .await
                        .cut(view),
                    None => view,
                };
                Ok(json_response(StatusCode::OK, &view))
            }
            Err(ActionRefused::NotFound(id)) => Err(no_rollout(id)),
            Err(ActionRefused::Conflict(err)) => {
                Err(ApiError::new(StatusCode::CONFLICT, err.to_string()))
            }
            Err(ActionRefused::Hub(err)) => Err(hub_error(err)),
        }
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn post_hook(
    State(shared): SharedState,
    Extension(gates): GatesExtension,
    request: Request,
) -> Response {
    let result = check_hook(&shared, &gates, request).await;
    shared.metrics.webhook(result.is_ok());
    match result {
        Ok(()) => {
            // The payload is not read: it only says "look now".
            let pace = lock_pacer(&gates.hook_pacer).pace(tokio::time::Instant::now());
            match pace {
                Pace::Now => shared.look_now.notify_one(),
                Pace::At(at) => {
                    let (shared, pacer) = (shared.clone(), gates.hook_pacer.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at).await;
                        lock_pacer(&pacer).fired(tokio::time::Instant::now());
                        shared.look_now.notify_one();
                    });
                }
                Pace::Due => {}
            }
            json_response(
                StatusCode::ACCEPTED,
                &json!({ "status": "fetch scheduled" }),
            )
        }
        Err(refusal) => refusal,
    }
}

/// How often webhooks may make the hub look for a new commit: at most once every
/// [`HookPacer::GAP`]; deliveries in between share one look at the end of the gap.
/// A signature proves who sent a body, not when: a captured delivery sent again and
/// again made the hub fetch back to back, each fetch as soon as the last ended.
#[derive(Default)]
struct HookPacer {
    /// When the next look may start.
    next: Option<tokio::time::Instant>,
    /// A look is due at `next` already.
    deferred: bool,
}

/// What an accepted webhook does.
#[derive(Debug, PartialEq, Eq)]
enum Pace {
    /// Wakes the follower now.
    Now,
    /// Wakes it at this instant (the end of the gap).
    At(tokio::time::Instant),
    /// A look is due already; it covers this delivery too.
    Due,
}

impl HookPacer {
    const GAP: Duration = Duration::from_secs(5);

    fn pace(&mut self, now: tokio::time::Instant) -> Pace {
        match self.next {
            _ if self.deferred => Pace::Due,
            Some(next) if now < next => {
                self.deferred = true;
                Pace::At(next)
            }
            _ => {
                self.next = Some(now + Self::GAP);
                Pace::Now
            }
        }
    }

    /// A deferred look started at `now`.
    fn fired(&mut self, now: tokio::time::Instant) {
        self.deferred = false;
        self.next = Some(now + Self::GAP);
    }
}

fn lock_pacer(pacer: &std::sync::Mutex<HookPacer>) -> std::sync::MutexGuard<'_, HookPacer> {
    pacer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Checks a webhook: everything its headers tell first (answered without reading the
/// body), then its body within the [`RequestLimits`], then its signature.
async fn check_hook(shared: &Arc<Shared>, gates: &Gates, request: Request) -> Result<(), Response> {
    let Some(secret) = &shared.settings.webhook_secret else {
        return Err(refused_unread(
            ApiError::new(
                StatusCode::NOT_FOUND,
                "the webhook is off; start the hub with --webhook-secret-file to turn it on",
            ),
            &request,
        ));
    };
    let signature = request
        .headers()
        .get(&X_HUB_SIGNATURE_256)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(|hex_text| hex::decode(hex_text.trim()).ok());
    let Some(signature) = signature else {
        return Err(refused_unread(
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or malformed X-Hub-Signature-256 header (expected sha256=<hex HMAC of the body>)",
            ),
            &request,
        ));
    };
    let length = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = length.filter(|&length| length > HOOK_BODY_LIMIT as u64) {
        return Err(refused_unread(
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the webhook's body is {length} bytes; the hub reads at most {HOOK_BODY_LIMIT}"
                ),
            ),
            &request,
        ));
    }
    let Ok(_reading) = gates.webhook_bodies.try_acquire() else {
        let busy = ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the hub is already reading {} webhook bodies; retry shortly",
                    gates.limits.max_webhook_bodies
                ),
            )
        };
        return Err(refused_unread(busy, &request));
    };
    let close = request.version() <= Version::HTTP_11;
    let timeout = gates.limits.webhook_body_timeout;
    let body = match tokio::time::timeout(timeout, Bytes::from_request(request, shared)).await {
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) => {
            return Err(ApiError::new(rejection.status(), rejection.body_text()).into_response());
        }
        Err(_) => {
            let late = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the webhook's body did not arrive within {}",
                    humantime::format_duration(timeout)
                ),
            );
            return Err(closing(late.into_response(), close));
        }
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|err| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response()
    })?;
    mac.update(&body);
    // verify_slice compares in constant time.
    mac.verify_slice(&signature).map_err(|_| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the X-Hub-Signature-256 signature does not match the body and the webhook secret",
        )
        .into_response()
    })
}

/// The hub's front door.
pub const INDEX: &str = "/";

/// `GET /`: where to go from here, as a JSON index of the endpoints: the API's
/// (every route of [`ENDPOINTS`]) and the web page's entry.
async fn index() -> Response {
    let endpoint = |method: &str, path: &str, auth: &str, what: &str| json!({ "method": method, "path": path, "auth": auth, "what": what });
    let mut endpoints: Vec<serde_json::Value> = ENDPOINTS
        .iter()
        .map(|e| endpoint(e.method, e.path, e.auth, e.what))
        .collect();
    endpoints.push(endpoint(
        "GET",
        crate::ui::routes::HOME,
        "a session: log in there with a person's token (viewer, operator or admin)",
        "the web page: the fleet, each cluster and each rollout (docs/ui.md)",
    ));
    json_response(
        StatusCode::OK,
        &json!({
            "name": "flotilla hub",
            "version": env!("CARGO_PKG_VERSION"),
            "documentation": "docs/api.md in the flotilla repository",
            "endpoints": endpoints,
        }),
    )
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

async fn readyz(State(shared): SharedState) -> Response {
    if shared.view.is_ready() {
        json_response(
            StatusCode::OK,
            &json!({
                "status": "ready",
                "clusters": shared.view.served().clusters.len(),
                // Several hubs: whether this one reaches the database it shares (it
                // keeps serving what it has when it does not) and holds the lease.
                "database": if shared.metrics.database_is_unreachable() { "unreachable" } else { "ok" },
                "rolloutLease": shared.recorder.lease().holds(),
                // Whether the newest clean render was installed. A hub that cannot
                // install one stays ready: it serves the last good bundles. Why it
                // cannot is for people's tokens (`installError` in /v1/fleet): it names
                // paths of the hub's host.
                "install": if shared.view.install_failing() { "failing" } else { "ok" },
            }),
        )
    } else {
        ApiError::not_ready().into_response()
    }
}

async fn metrics(State(shared): SharedState) -> Response {
    let text = shared.metrics.render(
        &shared.view.render_status(),
        &shared.view.fleet_counts(),
        shared.view.tokens().len(),
        &crate::metrics::RolloutFigures {
            active: &shared.view.active_rollouts(),
            superseded: shared.view.rollouts_superseded(),
            decisions: shared.view.rollout_decisions(),
        },
    );
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response.headers_mut().insert(CACHE_CONTROL, NO_STORE);
    response
}

async fn not_found(request: Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: {} (GET / lists them; see docs/api.md)",
            request.uri().path()
        ),
    )
    .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {} (see docs/api.md)",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {

    #[test]
    fn webhooks_wake_the_hub_at_most_once_a_gap_and_those_between_share_the_next() {
        let mut pacer = HookPacer::default();
        let start = tokio::time::Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(pacer.pace(at(0)), Pace::Now);
        // Within the gap: one look at its end, shared by every delivery until then.
        assert_eq!(pacer.pace(at(100)), Pace::At(at(5_000)));
        for ms in [200, 4_000, 5_000, 9_000] {
            assert_eq!(pacer.pace(at(ms)), Pace::Due, "{ms}");
        }
        pacer.fired(at(5_001));
        assert_eq!(pacer.pace(at(6_000)), Pace::At(at(10_001)));
        pacer.fired(at(10_001));
        // After a quiet gap, at once again.
        assert_eq!(pacer.pace(at(20_000)), Pace::Now);
        // A thousand deliveries in a second: two looks.
        let looks = (0..1_000)
            .map(|i| pacer.pace(at(30_000 + i)))
            .filter(|pace| *pace != Pace::Due)
            .count();
        assert_eq!(looks, 2);
    }

    use super::*;

    fn entry() -> ClusterBundle {
        ClusterBundle::new(
            "c".into(),
            Digest::parse(&format!("sha256:{}", "a".repeat(64))).expect("digest"),
            "main@sha1:0".into(),
        )
    }

    /// As hyper parses them: every value a slice of one buffer.
    #[test]
    fn a_held_poll_keeps_copies_of_its_headers_not_the_buffer_they_were_read_into() {
        let buffer = Bytes::from_static(b"Bearer secret\"sha256:ab\"zstd, gzip\xe9t\xe9");
        let mut headers = HeaderMap::new();
        let slice = |range: std::ops::Range<usize>| {
            HeaderValue::from_maybe_shared(buffer.slice(range)).expect("value")
        };
        let mut secret = slice(0..13);
        secret.set_sensitive(true);
        headers.insert(AUTHORIZATION, secret);
        headers.insert(IF_NONE_MATCH, slice(13..24));
        headers.append(ACCEPT_ENCODING, slice(24..34));
        headers.append(ACCEPT_ENCODING, slice(34..37));
        let span = buffer.as_ptr_range();
        assert!(
            headers
                .values()
                .all(|v| span.contains(&v.as_bytes().as_ptr()))
        );

        let owned = owned_headers(&headers);
        assert_eq!(owned, headers);
        assert_eq!(owned.get_all(ACCEPT_ENCODING).iter().count(), 2);
        assert!(owned[AUTHORIZATION].is_sensitive());
        assert!(!owned[IF_NONE_MATCH].is_sensitive());
        for value in owned.values() {
            assert!(
                !span.contains(&value.as_bytes().as_ptr()),
                "{value:?} shares the buffer"
            );
        }
    }

    #[test]
    fn if_none_match_accepts_the_usual_forms() {
        let entry = entry();
        let digest = format!("sha256:{}", "a".repeat(64));
        for value in [
            format!("\"{digest}\""),
            format!("W/\"{digest}\""),
            format!("\"sha256:{}\", \"{digest}\"", "b".repeat(64)),
            digest.clone(),
            "*".to_string(),
        ] {
            assert!(
                etag_matches(&HeaderValue::from_str(&value).expect("header"), &entry),
                "{value}"
            );
        }
        assert!(!etag_matches(
            &HeaderValue::from_str(&format!("\"sha256:{}\"", "b".repeat(64))).expect("header"),
            &entry
        ));
    }

    #[test]
    fn prefers_zstd_then_gzip_and_honours_q_zero() {
        let choose = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                ACCEPT_ENCODING,
                HeaderValue::from_str(value).expect("header"),
            );
            choose_encoding(&headers)
        };
        assert_eq!(choose("gzip, zstd"), Encoding::Zstd);
        assert_eq!(choose("gzip, zstd;q=0"), Encoding::Gzip);
        assert_eq!(choose("br"), Encoding::Identity);
        assert_eq!(choose_encoding(&HeaderMap::new()), Encoding::Identity);
    }

    #[test]
    fn wait_takes_durations_or_seconds() {
        assert_eq!(parse_wait(None).expect("ok"), None);
        assert_eq!(
            parse_wait(Some("wait=30s")).expect("ok"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_wait(Some("x=1&wait=2")).expect("ok"),
            Some(Duration::from_secs(2))
        );
        assert!(parse_wait(Some("wait=soon")).is_err());
    }
}
