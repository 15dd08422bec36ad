//! The real agent, in process, against a small HTTP server that plays the hub's part
//! of the API (ETag, If-None-Match → 304, ?wait, status POST) and can be told to
//! fail: back-off, Retry-After, 401/403, refused bundles, reports kept while the hub
//! is away. Waits are recorded by a sleeper instead of spent.

use crate::support as agent_support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_support::*;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use flotilla_agent::backoff::BackoffPolicy;
use flotilla_agent::client::Server;
use flotilla_agent::sink::dir::DirSink;
use flotilla_agent::wait::{LONGEST_WAIT, SAFE_WAIT};
use flotilla_agent::{Agent, AgentConfig};
use flotilla_core::bundle::{Bundle, Digest};
use flotilla_core::signing::{SigningKey, TrustedKeys, signed_document_bytes};
use flotilla_core::status::StatusReport;
use serde_json::Value;
use tokio::sync::{Notify, oneshot, watch};

/// How the fake hub answers bundle requests.
#[derive(Clone, Debug, PartialEq)]
enum Mode {
    Normal,
    /// Every bundle request fails with this status (and Retry-After, if given).
    Fail(u16, Option<u64>),
}

#[derive(Default)]
struct HubState {
    document: Option<Vec<u8>>,
    /// The ETag served; by default the quoted digest of the document.
    etag_override: Option<String>,
    mode: Option<Mode>,
    /// Modes for the next requests, each for a number of requests, before `mode`.
    script: std::collections::VecDeque<(Mode, usize)>,
    statuses_fail: bool,
    /// Bundle requests: (If-None-Match, wait, status code answered).
    requests: Vec<(Option<String>, Option<String>, u16)>,
    /// Status reports accepted.
    statuses: Vec<Value>,
    /// Status reports refused while statuses_fail was set.
    statuses_refused: usize,
    token: String,
}

#[derive(Clone)]
struct FakeHub {
    state: Arc<Mutex<HubState>>,
    changed: Arc<Notify>,
    url: url::Url,
}

impl FakeHub {
    async fn start() -> FakeHub {
        let state = Arc::new(Mutex::new(HubState {
            token: "flt_good".into(),
            ..HubState::default()
        }));
        let changed = Arc::new(Notify::new());
        let app = axum::Router::new()
            .route("/v1/clusters/edge-1/bundle", get(serve_bundle))
            .route("/v1/clusters/edge-1/status", post(take_status))
            .with_state((state.clone(), changed.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeHub {
            state,
            changed,
            url: url::Url::parse(&format!("http://{address}/")).expect("url"),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HubState) -> T) -> T {
        f(&mut self.state.lock().expect("lock"))
    }

    fn serve(&self, bundle: &Bundle) {
        self.with(|s| s.document = Some(bundle.document("main@sha1:test")));
        self.changed.notify_waiters();
    }

    fn serve_document(&self, document: Vec<u8>) {
        self.with(|s| s.document = Some(document));
        self.changed.notify_waiters();
    }

    fn set_mode(&self, mode: Mode) {
        self.with(|s| s.mode = Some(mode));
    }

    fn requests(&self) -> Vec<(Option<String>, Option<String>, u16)> {
        self.with(|s| s.requests.clone())
    }

    fn statuses(&self) -> Vec<Value> {
        self.with(|s| s.statuses.clone())
    }
}

type Shared = (Arc<Mutex<HubState>>, Arc<Notify>);

fn current_etag(state: &HubState) -> Option<String> {
    let document = state.document.as_ref()?;
    if let Some(etag) = &state.etag_override {
        return Some(etag.clone());
    }
    let value: Value = serde_json::from_slice(document).ok()?;
    Some(format!("\"{}\"", value["digest"].as_str()?))
}

async fn serve_bundle(
    State((state, changed)): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let if_none_match = headers
        .get("if-none-match")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let authorised = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let wait = query.get("wait").cloned();
    let record = |state: &Arc<Mutex<HubState>>, code: u16| {
        state
            .lock()
            .expect("lock")
            .requests
            .push((if_none_match.clone(), wait.clone(), code));
    };
    let (mode, token) = {
        let mut s = state.lock().expect("lock");
        let scripted = match s.script.front_mut() {
            Some((mode, remaining)) => {
                let mode = mode.clone();
                *remaining -= 1;
                if *remaining == 0 {
                    s.script.pop_front();
                }
                Some(mode)
            }
            None => None,
        };
        let mode = scripted.unwrap_or_else(|| s.mode.clone().unwrap_or(Mode::Normal));
        (mode, s.token.clone())
    };
    if authorised.as_deref() != Some(&format!("Bearer {token}")) {
        record(&state, 401);
        return (StatusCode::UNAUTHORIZED, r#"{"message":"bad token"}"#).into_response();
    }
    if let Mode::Fail(code, retry_after) = mode {
        record(&state, code);
        let status = StatusCode::from_u16(code).expect("status");
        let mut response = (status, r#"{"message":"hub trouble"}"#).into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", seconds.to_string().parse().expect("value"));
        }
        return response;
    }
    // Hold a long-poll while nothing changed (briefly, to keep the tests fast).
    let notified = changed.notified();
    let unchanged = {
        let s = state.lock().expect("lock");
        if_none_match.is_some() && if_none_match == current_etag(&s)
    };
    if unchanged && wait.is_some() {
        let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
    }
    let s = state.lock().expect("lock");
    let (Some(document), Some(etag)) = (s.document.clone(), current_etag(&s)) else {
        drop(s);
        record(&state, 404);
        return (StatusCode::NOT_FOUND, r#"{"message":"no bundle"}"#).into_response();
    };
    drop(s);
    if if_none_match.as_deref() == Some(etag.as_str()) {
        record(&state, 304);
        return StatusCode::NOT_MODIFIED.into_response();
    }
    record(&state, 200);
    ([("etag", etag)], document).into_response()
}

async fn take_status(
    State((state, _)): State<Shared>,
    axum::Json(body): axum::Json<Value>,
) -> StatusCode {
    let mut s = state.lock().expect("lock");
    if s.statuses_fail {
        s.statuses_refused += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    s.statuses.push(body);
    StatusCode::NO_CONTENT
}

struct Running {
    reports: watch::Receiver<Option<StatusReport>>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), flotilla_agent::AgentError>>,
    sleeper: Arc<RecordingSleeper>,
}

impl Running {
    async fn until(&mut self, what: &str, test: impl Fn(&StatusReport) -> bool) -> StatusReport {
        let wait = self.reports.wait_for(|r| r.as_ref().is_some_and(&test));
        let found = match tokio::time::timeout(Duration::from_secs(20), wait).await {
            Ok(Ok(report)) => report.clone(),
            _ => None,
        };
        match found {
            Some(report) => report,
            None => panic!(
                "the agent never reported {what}; last report: {:?}",
                self.reports.borrow()
            ),
        }
    }

    async fn applied(&mut self, digest: &Digest) -> StatusReport {
        self.until(&format!("applied {digest}"), |r| {
            r.applied.as_ref() == Some(digest) && r.attempted.as_ref() == Some(digest)
        })
        .await
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("no panic").expect("the agent ran");
    }
}

struct Site {
    state: tempfile::TempDir,
    target: tempfile::TempDir,
    token_file: std::path::PathBuf,
}

fn site(token: &str) -> Site {
    let state = tempfile::tempdir().expect("tempdir");
    let token_file = state.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("writes token");
    Site {
        state,
        target: tempfile::tempdir().expect("tempdir"),
        token_file,
    }
}

fn start(hub: &FakeHub, site: &Site, policy: BackoffPolicy) -> Running {
    start_trusting(hub, site, policy, TrustedKeys::default())
}

fn start_trusting(
    hub: &FakeHub,
    site: &Site,
    policy: BackoffPolicy,
    trusted: TrustedKeys,
) -> Running {
    start_configured(hub, site, |config| {
        config.backoff = policy;
        config.trusted = trusted;
    })
}

/// The agent with its test settings, changed by `configure`.
fn start_configured(
    hub: &FakeHub,
    site: &Site,
    configure: impl FnOnce(&mut AgentConfig),
) -> Running {
    let mut config = AgentConfig::new(
        Server::Http(hub.url.clone()),
        "edge-1",
        site.state.path().join("agent"),
    );
    config.token_file = Some(site.token_file.clone());
    configure(&mut config);
    let sleeper = Arc::new(RecordingSleeper::default());
    let agent = Agent::new(
        config,
        DirSink::new(site.target.path(), &site.state.path().join("agent"), false),
    )
    .with_sleeper(sleeper.clone());
    let reports = agent.reports();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    Running {
        reports,
        stop,
        task,
        sleeper,
    }
}

/// Waits (in real time, briefly) until `test` holds.
async fn eventually(what: &str, test: impl Fn() -> bool) {
    for _ in 0..2000 {
        if test() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn polls_conditionally_with_wait_and_takes_a_change_at_once() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    agent.applied(&a.digest).await;
    eventually("a conditional poll", || {
        hub.requests().iter().any(|(inm, _, _)| inm.is_some())
    })
    .await;

    let b = bundle("edge-1", vec![config_map("a", "2")]);
    hub.serve(&b);
    agent.applied(&b.digest).await;
    agent.stop().await;

    let requests = hub.requests();
    // `--wait auto` asks for the longest wait while nothing cuts it.
    let wait = format!("{}s", LONGEST_WAIT.as_secs());
    assert_eq!(
        requests[0],
        (None, Some(wait.clone()), 200),
        "a fresh agent asks without If-None-Match"
    );
    assert!(
        requests
            .iter()
            .all(|(_, asked, _)| asked.as_deref() == Some(wait.as_str()))
    );
    let quoted_a = format!("\"{}\"", a.digest);
    assert!(
        requests[1..].iter().all(|(inm, _, code)| {
            (inm.as_deref() == Some(quoted_a.as_str()) && (*code == 304 || *code == 200))
                || (inm.as_deref() == Some(format!("\"{}\"", b.digest).as_str()) && *code == 304)
        }),
        "{requests:?}"
    );
    assert_eq!(
        requests.iter().filter(|(_, _, code)| *code == 200).count(),
        2,
        "one 200 per new bundle: {requests:?}"
    );
    let statuses = hub.statuses();
    let last = statuses.last().expect("reported");
    assert_eq!(last["applied"], b.digest.as_str());
    assert_eq!(last["attempted"], b.digest.as_str());
    assert_eq!(last["agentVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(last["resources"][0]["kind"], "ConfigMap");
    assert_eq!(last["resources"][0]["state"], "applied");
}

#[tokio::test]
async fn a_failing_hub_is_retried_with_capped_jittered_back_off_honouring_retry_after() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    hub.with(|s| {
        s.script.push_back((Mode::Fail(503, Some(7)), 3));
        s.script.push_back((Mode::Fail(500, None), 6));
    });
    let site = site("flt_good");
    let policy = BackoffPolicy {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(10),
        auth_retry: Duration::from_secs(300),
    };
    let mut agent = start(&hub, &site, policy);
    agent.applied(&a.digest).await;
    let before = 3;
    let waits = agent.sleeper.waits();
    agent.stop().await;

    for wait in &waits[..3] {
        assert!(
            *wait >= Duration::from_secs(7),
            "Retry-After: 7 honoured: {waits:?}"
        );
    }
    // After the 503s, the back-off keeps growing from where it was (ceilings 8s,
    // then the 10s cap), with full jitter below the ceiling.
    let ceilings = [8, 10, 10, 10, 10, 10];
    for (wait, ceiling) in waits[before..before + 6].iter().zip(ceilings) {
        assert!(
            *wait <= Duration::from_secs(ceiling) && *wait >= Duration::from_millis(50),
            "{wait:?} within (0, {ceiling}s]: {waits:?}"
        );
    }
    let distinct: std::collections::HashSet<&Duration> = waits[before..before + 6].iter().collect();
    assert!(distinct.len() > 1, "jittered, not fixed: {waits:?}");
}

#[tokio::test]
async fn an_unreachable_hub_is_retried_without_busy_looping_and_the_cap_holds() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let address = listener.local_addr().expect("address");
    drop(listener);
    let site = site("flt_good");
    let mut config = AgentConfig::new(
        Server::Http(url::Url::parse(&format!("http://{address}/")).expect("url")),
        "edge-1",
        site.state.path().join("agent"),
    );
    config.token_file = Some(site.token_file.clone());
    config.backoff.cap = Duration::from_secs(20);
    let sleeper = Arc::new(RecordingSleeper::default());
    let agent = Agent::new(
        config,
        DirSink::new(site.target.path(), site.state.path(), false),
    )
    .with_sleeper(sleeper.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    eventually("twelve retries", || sleeper.waits().len() >= 12).await;
    let _ = stop.send(());
    task.await.expect("no panic").expect("ran");
    let waits = sleeper.waits();
    for (attempt, wait) in waits.iter().take(12).enumerate() {
        let ceiling = Duration::from_secs(1 << attempt.min(5)).min(Duration::from_secs(20));
        assert!(
            *wait >= Duration::from_millis(50) && *wait <= ceiling,
            "attempt {attempt}: {wait:?} not in [50ms, {ceiling:?}]"
        );
    }
}

#[tokio::test]
async fn a_refused_token_is_retried_soon_and_a_rotated_token_file_is_picked_up() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_stale-token");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    eventually("eight refusals", || agent.sleeper.waits().len() >= 8).await;
    // The operator puts the right token in the file; no restart is needed.
    std::fs::write(&site.token_file, "flt_good\n").expect("rotates");
    agent.applied(&a.digest).await;
    let waits = agent.sleeper.waits();
    agent.stop().await;
    // From a second, doubling, to at most 30 s: the one fixing the token waits little.
    let ceilings = [1, 2, 4, 8, 16, 30, 30, 30];
    for (wait, ceiling) in waits[..8].iter().zip(ceilings) {
        let ceiling = Duration::from_secs(ceiling);
        assert!(
            *wait >= ceiling / 2 && *wait <= ceiling,
            "401 is retried within half to all of {ceiling:?}: {waits:?}"
        );
    }
    let codes: Vec<u16> = hub.requests().iter().map(|r| r.2).collect();
    assert_eq!(&codes[..8], [401; 8]);
    assert!(codes.contains(&200));
}

#[tokio::test]
async fn a_bundle_whose_etag_disagrees_with_its_content_is_refused_and_reported() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    let other = bundle("edge-1", vec![config_map("a", "other")]);
    hub.serve(&a);
    hub.with(|s| s.etag_override = Some(format!("\"{}\"", other.digest)));
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    let refused = agent
        .until("a refusal", |r| r.message.contains("ETag"))
        .await;
    assert_eq!(refused.applied, None);
    assert_eq!(refused.attempted, Some(other.digest.clone()));
    eventually("the refusal reaches the hub", || {
        hub.statuses()
            .iter()
            .any(|s| s["message"].as_str().is_some_and(|m| m.contains("ETag")))
    })
    .await;
    assert!(yaml_names(site.target.path()).is_empty(), "nothing applied");
    assert!(
        !site.state.path().join("agent/bundle.json").exists(),
        "nothing kept"
    );
    let waits_while_refused = agent.sleeper.waits();
    assert!(
        waits_while_refused
            .iter()
            .all(|w| *w >= Duration::from_millis(50)),
        "a refused bundle is retried with back-off: {waits_while_refused:?}"
    );

    hub.with(|s| s.etag_override = None);
    agent.applied(&a.digest).await;
    agent.stop().await;
    assert_eq!(yaml_names(site.target.path()), [config_map_file("a")]);
}

/// A bundle nested deeper than any flotilla renders (as only a forged or broken
/// server could send) is refused with the reason, and reported against the digest
/// its ETag names, so the hub shows the cluster failed on it rather than pending.
#[tokio::test]
async fn a_bundle_nested_too_deep_is_refused_and_reported_against_its_etag() {
    let hub = FakeHub::start().await;
    let mut deep = serde_json::json!("leaf");
    for _ in 0..200 {
        deep = serde_json::json!([deep]);
    }
    let mut resource = config_map("deep", "x");
    resource["data"] = serde_json::json!({ "nested": deep });
    let forged = bundle("edge-1", vec![resource]);
    hub.serve(&forged);
    hub.with(|s| s.etag_override = Some(format!("\"{}\"", forged.digest)));
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    let refused = agent
        .until("a refusal", |r| {
            r.message.contains("deeper than 100 levels")
        })
        .await;
    assert_eq!(refused.applied, None);
    assert_eq!(refused.attempted, Some(forged.digest.clone()));
    assert!(yaml_names(site.target.path()).is_empty(), "nothing applied");
    agent.stop().await;
}

/// A bundle over the agent's size limit is refused before its body is read, and
/// reported against the digest its ETag names: the hub shows why the cluster keeps
/// what it runs instead of showing it pending for ever.
#[tokio::test]
async fn a_bundle_over_the_size_limit_is_refused_and_reported_against_its_etag() {
    let hub = FakeHub::start().await;
    let claimed = bundle("edge-1", vec![config_map("big", "x")]).digest;
    let mut huge = b"{\"pad\":\"".to_vec();
    huge.resize(flotilla_core::bundle::MAX_BUNDLE_BYTES + 16, b'x');
    huge.extend_from_slice(b"\"}");
    hub.serve_document(huge);
    hub.with(|s| s.etag_override = Some(format!("\"{claimed}\"")));
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    let refused = agent
        .until("a refusal", |r| r.message.contains("is larger than"))
        .await;
    assert_eq!(refused.applied, None);
    assert_eq!(refused.attempted, Some(claimed));
    assert!(
        refused
            .message
            .contains("keeping the last-known-good bundle"),
        "{}",
        refused.message
    );
    assert!(yaml_names(site.target.path()).is_empty(), "nothing applied");
    agent.stop().await;
}

/// A hub that will not serve this agent its bundle (409: the bundle needs features
/// the agent does not name) is answered with a report saying so.
#[tokio::test]
async fn a_hub_that_says_the_agent_is_too_old_gets_a_report_saying_so() {
    let hub = FakeHub::start().await;
    hub.serve(&bundle("edge-1", vec![config_map("a", "1")]));
    hub.set_mode(Mode::Fail(409, None));
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    let refused = agent
        .until("a refusal", |r| r.message.contains("answered 409"))
        .await;
    assert_eq!(refused.applied, None);
    assert!(
        refused.message.contains("hub trouble"),
        "{}",
        refused.message
    );
    agent.stop().await;
}

#[tokio::test]
async fn reports_are_kept_while_the_hub_refuses_them_and_only_the_latest_is_sent() {
    let hub = FakeHub::start().await;
    hub.with(|s| s.statuses_fail = true);
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    agent.applied(&a.digest).await;
    eventually("a refused report", || hub.with(|s| s.statuses_refused) >= 1).await;
    let b = bundle("edge-1", vec![config_map("a", "2")]);
    hub.serve(&b);
    agent.applied(&b.digest).await;
    eventually("the report of b kept", || {
        stored_status(&site.state.path().join("agent"))
            .is_some_and(|s| s["sent"] == false && s["report"]["applied"] == b.digest.as_str())
    })
    .await;
    assert!(hub.statuses().is_empty());

    hub.with(|s| s.statuses_fail = false);
    eventually("a report accepted", || !hub.statuses().is_empty()).await;
    eventually("the kept report marked sent", || {
        stored_status(&site.state.path().join("agent")).is_some_and(|s| s["sent"] == true)
    })
    .await;
    agent.stop().await;
    let statuses = hub.statuses();
    assert!(
        statuses.iter().all(|s| s["applied"] == b.digest.as_str()),
        "only the latest report is sent: {statuses:?}"
    );
}

#[tokio::test]
async fn after_an_outage_the_agent_catches_up_with_one_request() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    agent.applied(&a.digest).await;

    hub.set_mode(Mode::Fail(502, None));
    let before = hub.requests().len();
    eventually("failed polls", || hub.requests().len() >= before + 3).await;
    // Two commits land while the agent cannot reach the hub.
    hub.serve(&bundle("edge-1", vec![config_map("a", "2")]));
    let c = bundle("edge-1", vec![config_map("a", "3")]);
    hub.serve(&c);
    let outage_end = hub.requests().len();
    hub.set_mode(Mode::Normal);
    agent.applied(&c.digest).await;
    agent.stop().await;

    let after: Vec<u16> = hub.requests()[outage_end..].iter().map(|r| r.2).collect();
    assert_eq!(
        after.iter().filter(|code| **code == 200).count(),
        1,
        "one 200 brings the latest bundle: {after:?}"
    );
    let applied: Vec<Value> = hub.statuses();
    assert!(
        applied.iter().all(|s| s["applied"].is_null()
            || s["applied"] == a.digest.as_str()
            || s["applied"] == c.digest.as_str()),
        "the bundle in between was never applied: {applied:?}"
    );
}

#[tokio::test]
async fn a_server_that_answers_at_once_is_asked_once_per_wait() {
    // A static web server (nginx over `flotilla publish` output) answers 304 at once
    // instead of holding the request (this fake holds it 200 ms at most): the agent
    // must pace itself to one request per wait (55 s with `--wait auto`), not loop.
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_good");
    let mut agent = start(&hub, &site, BackoffPolicy::default());
    agent.applied(&a.digest).await;
    eventually("three paced polls", || agent.sleeper.waits().len() >= 3).await;
    let waits = agent.sleeper.waits();
    agent.stop().await;
    assert!(
        waits
            .iter()
            .all(|w| *w > SAFE_WAIT - Duration::from_secs(1) && *w <= SAFE_WAIT),
        "the rest of the safe wait after each 304: {waits:?}"
    );
    let codes: Vec<u16> = hub.requests().iter().map(|r| r.2).collect();
    assert!(codes[1..].iter().all(|c| *c == 304), "{codes:?}");
}

#[tokio::test]
async fn an_idle_agent_sends_no_report_when_a_resync_changes_nothing() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_good");
    let mut config = AgentConfig::new(
        Server::Http(hub.url.clone()),
        "edge-1",
        site.state.path().join("agent"),
    );
    config.token_file = Some(site.token_file.clone());
    config.resync = Duration::from_millis(50);
    let agent = Agent::new(
        config,
        DirSink::new(site.target.path(), &site.state.path().join("agent"), false),
    );
    let mut reports = agent.reports();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    // Every apply and every drift check publishes a report: wait for the first apply
    // and three resyncs.
    let mut applies = 0;
    while applies < 4 {
        tokio::time::timeout(Duration::from_secs(20), reports.changed())
            .await
            .expect("the agent applies and resyncs")
            .expect("the agent runs");
        let applied = reports
            .borrow_and_update()
            .as_ref()
            .is_some_and(|r| r.applied.as_ref() == Some(&a.digest));
        applies += usize::from(applied);
    }
    eventually("the applied report reaches the hub", || {
        hub.statuses()
            .iter()
            .any(|s| s["applied"] == a.digest.as_str())
    })
    .await;
    let _ = stop.send(());
    task.await.expect("no panic").expect("ran");
    let statuses = hub.statuses();
    let sent: Vec<&Value> = statuses
        .iter()
        .filter(|s| s["applied"] == a.digest.as_str())
        .collect();
    // The first apply wrote the file ("1 written"); every resync finds no drift and
    // leaves the report as it was: one report, sent once.
    assert_eq!(
        sent.len(),
        1,
        "resyncs that change nothing are not reported again: {sent:?}"
    );
    let message = sent[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("1 written, 0 unchanged"), "{sent:?}");
}

#[tokio::test]
async fn an_idle_agent_reports_again_on_its_heartbeat_so_the_hub_knows_it_is_alive() {
    let hub = FakeHub::start().await;
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    hub.serve(&a);
    let site = site("flt_good");
    let mut config = AgentConfig::new(
        Server::Http(hub.url.clone()),
        "edge-1",
        site.state.path().join("agent"),
    );
    config.token_file = Some(site.token_file.clone());
    config.heartbeat = Duration::from_millis(100);
    let agent = Agent::new(
        config,
        DirSink::new(site.target.path(), &site.state.path().join("agent"), false),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    eventually("the applied report and three heartbeats", || {
        hub.statuses()
            .iter()
            .filter(|s| s["applied"] == a.digest.as_str())
            .count()
            >= 4
    })
    .await;
    let _ = stop.send(());
    task.await.expect("no panic").expect("ran");
    let statuses = hub.statuses();
    let applied: Vec<&Value> = statuses
        .iter()
        .skip_while(|s| s["applied"] != a.digest.as_str())
        .collect();
    assert!(
        applied.windows(2).all(|pair| pair[0] == pair[1]),
        "a heartbeat repeats the last report: {applied:?}"
    );
}

/// A bundle's document signed by `key` with `sequence`.
fn signed(bundle: &Bundle, key: &SigningKey, sequence: u64) -> Vec<u8> {
    let revision = "main@sha1:test";
    let signature = key.sign(&bundle.cluster, &bundle.digest, revision, sequence);
    signed_document_bytes(
        &bundle.cluster,
        &bundle.digest,
        revision,
        &bundle.canonical_body(),
        Some(&signature),
    )
}

/// The agent applies only bundles a trusted key signed with a sequence that goes up
/// (or the same bundle again); every other document is refused with the reason,
/// reported, and the last good bundle stays applied and kept.
#[tokio::test]
async fn a_trusting_agent_applies_only_signed_bundles_whose_sequence_goes_up() {
    let hub = FakeHub::start().await;
    let key = SigningKey::from_seed([1; 32]);
    let stranger = SigningKey::from_seed([2; 32]);
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    let b = bundle("edge-1", vec![config_map("b", "1")]);
    let c = bundle("edge-1", vec![config_map("c", "1")]);
    let site = site("flt_good");
    let kept = site.state.path().join("agent/bundle.json");
    hub.serve_document(signed(&a, &key, 1));
    let mut agent = start_trusting(
        &hub,
        &site,
        BackoffPolicy::default(),
        TrustedKeys::new(vec![key.public_key()]),
    );
    agent.applied(&a.digest).await;
    hub.serve_document(signed(&b, &key, 2));
    agent.applied(&b.digest).await;

    // Forged content whose digest was recomputed, under B's genuine signature.
    let forged = signed_document_bytes(
        "edge-1",
        &c.digest,
        "main@sha1:test",
        &c.canonical_body(),
        Some(&key.sign("edge-1", &b.digest, "main@sha1:test", 3)),
    );
    let refusals: Vec<(&str, Vec<u8>, &Digest)> = vec![
        ("does not verify", forged, &c.digest),
        ("does not trust", signed(&c, &stranger, 3), &c.digest),
        ("is older than the 2", signed(&a, &key, 1), &a.digest),
        (
            "two bundles signed with one sequence",
            signed(&c, &key, 2),
            &c.digest,
        ),
        ("is not signed", c.document("main@sha1:test"), &c.digest),
    ];
    for (reason, document, offered) in refusals {
        hub.serve_document(document);
        let refused = agent.until(reason, |r| r.message.contains(reason)).await;
        assert_eq!(refused.applied, Some(b.digest.clone()), "{reason}");
        assert_eq!(refused.attempted.as_ref(), Some(offered), "{reason}");
        assert!(
            refused
                .message
                .contains("keeping the last-known-good bundle"),
            "{}",
            refused.message
        );
        assert_eq!(
            yaml_names(site.target.path()),
            [config_map_file("b")],
            "{reason}"
        );
        let stored =
            flotilla_core::bundle::verify_document(&std::fs::read(&kept).expect("kept"), None)
                .expect("verifies");
        assert_eq!(
            stored.digest, b.digest,
            "{reason}: the last good bundle stays kept"
        );
    }
    eventually("the refusals reach the hub", || {
        hub.statuses().iter().any(|s| {
            s["message"]
                .as_str()
                .is_some_and(|m| m.contains("is not signed"))
        })
    })
    .await;

    // A genuine rollback: the older bundle re-served with a higher sequence.
    hub.serve_document(signed(&a, &key, 4));
    agent.applied(&a.digest).await;
    assert_eq!(yaml_names(site.target.path()), [config_map_file("a")]);
    agent.stop().await;
}

/// The sequence held is the stored bundle's: a restarted agent still refuses what is
/// older, and during a key rotation it trusts both keys it is given.
#[tokio::test]
async fn a_restarted_agent_keeps_its_sequence_and_trusts_both_keys_while_they_rotate() {
    let hub = FakeHub::start().await;
    let old = SigningKey::from_seed([1; 32]);
    let new = SigningKey::from_seed([3; 32]);
    let a = bundle("edge-1", vec![config_map("a", "1")]);
    let b = bundle("edge-1", vec![config_map("b", "1")]);
    let site = site("flt_good");
    hub.serve_document(signed(&a, &old, 7));
    let mut agent = start_trusting(
        &hub,
        &site,
        BackoffPolicy::default(),
        TrustedKeys::new(vec![old.public_key()]),
    );
    agent.applied(&a.digest).await;
    agent.stop().await;

    let both = TrustedKeys::new(vec![old.public_key(), new.public_key()]);
    hub.serve_document(signed(&b, &new, 6));
    let mut agent = start_trusting(&hub, &site, BackoffPolicy::default(), both.clone());
    agent
        .until("a refusal of the older sequence", |r| {
            r.message.contains("is older than the 7")
        })
        .await;
    assert_eq!(yaml_names(site.target.path()), [config_map_file("a")]);
    hub.serve_document(signed(&b, &new, 8));
    agent.applied(&b.digest).await;
    agent.stop().await;
}

/// A bundle signed with a trusted key whose tenant's resource lies in `kube-system`
/// (a hub that renders without the rule, or a tampered mirror with the key) is
/// refused and reported, and nothing of it applied. With a local tenant policy, a
/// bundle whose marks were stripped (so the hub's marks would allow anything) is
/// refused all the same.
#[tokio::test]
async fn a_signed_bundle_that_puts_a_tenants_resource_into_kube_system_is_refused() {
    use flotilla_core::bundle::{BundleMeta, TenantMark};
    let key = SigningKey::from_seed([7; 32]);
    let with_meta = |namespace: &str, tenants: bool| {
        let plain = bundle(
            "edge-1",
            vec![serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "shop", "namespace": namespace}, "data": {"a": "b"}})],
        );
        let meta = BundleMeta {
            workloads: vec!["shop".into()],
            tenants: if tenants {
                [(
                    "team-a".to_string(),
                    TenantMark {
                        workloads: vec!["shop".into()],
                        namespaces: vec!["team-a".into()],
                        cluster_scoped: Vec::new(),
                    },
                )]
                .into()
            } else {
                Default::default()
            },
            ..BundleMeta::default()
        };
        Bundle::from_sorted_with_meta("edge-1", plain.resources.clone(), Some(meta))
    };
    let good = with_meta("team-a", true);
    let forged = with_meta("kube-system", true);
    let hub = FakeHub::start().await;
    let site = site("flt_good");
    hub.serve_document(signed(&good, &key, 1));
    let trusted = TrustedKeys::new(vec![key.public_key()]);
    let mut agent = start_configured(&hub, &site, |config| config.trusted = trusted.clone());
    agent.applied(&good.digest).await;
    hub.serve_document(signed(&forged, &key, 2));
    let refused = agent
        .until("the refusal", |r| r.message.contains("tenant"))
        .await;
    assert!(
        refused.message.contains(
            "ConfigMap kube-system/shop of tenant \"team-a\" (workload \"shop\") breaks the tenant's rules: namespace \"kube-system\" is not the tenant's"
        ),
        "{}",
        refused.message
    );
    assert_eq!(refused.applied, Some(good.digest.clone()));
    assert_eq!(refused.attempted, Some(forged.digest.clone()));
    eventually("the refusal reaches the hub", || {
        hub.statuses().iter().any(|s| {
            s["message"]
                .as_str()
                .is_some_and(|m| m.contains("breaks the tenant's rules"))
        })
    })
    .await;
    agent.stop().await;

    // The hub strips the marks: only a local policy still catches it.
    let stripped = with_meta("kube-system", false);
    let policy_file = site.state.path().join("tenants.yaml");
    std::fs::write(
        &policy_file,
        "apiVersion: flotilla.dev/v1alpha1\nkind: TenantPolicy\nplatformWorkloads: [agent]\ntenants:\n  team-a:\n    workloads: [\"shop*\"]\n    namespaces: [team-a]\n",
    )
    .expect("writes the policy");
    let policy = flotilla_agent::tenancy::TenantPolicy::read(&policy_file).expect("policy");
    hub.serve_document(signed(&stripped, &key, 3));
    let mut agent = start_configured(&hub, &site, |config| {
        config.trusted = trusted;
        config.tenant_policy = Some(policy);
    });
    let refused = agent
        .until("the refusal", |r| r.message.contains("tenant"))
        .await;
    assert_eq!(refused.applied, Some(good.digest.clone()));
    assert_eq!(refused.attempted, Some(stripped.digest.clone()));
    agent.stop().await;
}
