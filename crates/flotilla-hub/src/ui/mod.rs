//! The web page at `/ui/` (docs/ui.md): the fleet, a page per cluster and per
//! rollout, server-rendered HTML behind a login with a person's token. The page
//! shows who is logged in and offers only what the token's role may do; a tenant's
//! token sees its tenant's clusters and rollouts. The server refuses the rest
//! whatever the page offers.
//!
//! - [`session`]: login, the session cookie, form tokens and the origin check;
//! - [`page`]: view models and templates (pure: the benchmark builds pages with it);
//! - [`throttle`]: failed logins, throttled per client.
//!
//! Every page but the login redirects to it without a session, before it reads
//! anything of the fleet. Rollout actions go through the same engine as the API's
//! and are recorded with the id and role of the token that opened the session.

pub mod page;
pub mod session;
pub mod throttle;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use serde::Deserialize;

use crate::auth::{Grant, Person, TokenTable};
use crate::recorder::Shared;
use crate::recorder::rollouts::{Action, ActionRefused};
use crate::scope::TenantView;
use crate::store::StoredSession;
use flotilla_core::access::RolloutAccess;
use page::FleetQuery;

/// The web page's routes.
pub mod routes {
    pub const HOME: &str = "/ui/";
    pub const LOGIN: &str = "/ui/login";
    pub const LOGOUT: &str = "/ui/logout";
    pub const FLEET_JSON: &str = "/ui/fleet.json";
    pub const CLUSTER: &str = "/ui/clusters/{cluster}";
    pub const CLUSTER_BUNDLE: &str = "/ui/clusters/{cluster}/bundle";
    pub const ROLLOUT: &str = "/ui/rollouts/{id}";
    pub const ROLLOUT_ACTION: &str = "/ui/rollouts/{id}/{action}";
    pub const STYLE: &str = "/ui/assets/style.css";
    pub const SCRIPT: &str = "/ui/assets/ui.js";
}

#[derive(Clone)]
struct Ui {
    shared: Arc<Shared>,
    /// Served over TLS: the cookie is marked Secure.
    secure: bool,
    throttle: Arc<throttle::LoginThrottle>,
}

/// The routes of the web page; `secure` when the hub serves HTTPS.
pub fn router(shared: Arc<Shared>, secure: bool) -> Router {
    Router::new()
        .route("/ui", get(|| async { redirect(routes::HOME) }))
        .route(routes::HOME, get(fleet))
        .route(routes::LOGIN, get(login_form).post(login))
        .route(routes::LOGOUT, post(logout))
        .route(routes::FLEET_JSON, get(fleet_json))
        .route(routes::CLUSTER, get(cluster))
        .route(routes::CLUSTER_BUNDLE, get(cluster_bundle))
        .route(routes::ROLLOUT, get(rollout))
        .route(routes::ROLLOUT_ACTION, post(rollout_action))
        .route(
            routes::STYLE,
            get(|| async { asset(page::STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            routes::SCRIPT,
            get(|| async { asset(page::SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .with_state(Ui {
            shared,
            secure,
            throttle: Arc::default(),
        })
}

/// What every page answer carries: no caching, no framing, only the hub's own
/// scripts and styles.
fn harden(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self' 'unsafe-inline'; script-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
}

fn html(status: StatusCode, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    harden(&mut response);
    response
}

fn page_result(result: Result<String, page::PageError>) -> Response {
    match result {
        Ok(body) => html(StatusCode::OK, body),
        Err(err) => {
            tracing::error!("{err}");
            let mut response =
                Response::new(Body::from("the page could not be built; see the hub's log"));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            harden(&mut response);
            response
        }
    }
}

fn error(status: StatusCode, message: &str, csrf: Option<&str>) -> Response {
    match page::error_page(message, csrf) {
        Ok(body) => html(status, body),
        Err(err) => page_result(Err(err)),
    }
}

fn redirect(to: &str) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(value) = HeaderValue::from_str(to) {
        response.headers_mut().insert(LOCATION, value);
    }
    harden(&mut response);
    response
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = Response::new(Body::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    harden(&mut response);
    response.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

/// The person whose live token opened a session (a revoked token's sessions end with
/// it; a cluster's token never opens one).
fn person_live(tokens: &TokenTable, token_id: &str) -> Option<Person> {
    tokens.grant_of_id(token_id)?.person().cloned()
}

/// A session and the person whose token opened it.
struct Login {
    session: StoredSession,
    person: Person,
    visitor: page::Visitor,
}

impl Login {
    fn csrf(&self) -> Option<&str> {
        Some(&self.session.csrf)
    }

    /// What this person sees of the fleet when the token is a tenant's.
    async fn tenant_view(&self, shared: &Arc<Shared>) -> Option<TenantView> {
        let tenant = self.person.tenant.clone()?;
        Some(TenantView::read(shared, tenant).await)
    }
}

/// The request's session, or the answer to give instead (a redirect to the login).
async fn session(ui: &Ui, headers: &HeaderMap) -> Result<Login, Response> {
    let Some(id) = session::cookie_id(headers) else {
        return Err(redirect(routes::LOGIN));
    };
    let now = ui.shared.settings.clock.now_ms();
    match ui
        .shared
        .view
        .reads()
        .session(&session::id_hash(&id), now)
        .await
    {
        Ok(Some(session)) => match person_live(&ui.shared.view.tokens(), &session.token_id) {
            Some(person) => {
                let visitor = page::Visitor {
                    csrf: session.csrf.clone(),
                    token: session.token_id.clone(),
                    role: person.label(),
                    steers: person.role.steers(),
                    reads_bundles: person.role.reads_bundles() && person.tenant.is_none(),
                };
                Ok(Login {
                    session,
                    person,
                    visitor,
                })
            }
            None => Err(redirect(routes::LOGIN)),
        },
        Ok(None) => Err(redirect(routes::LOGIN)),
        Err(err) => {
            tracing::error!("cannot read the web page's sessions: {err}");
            Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the hub cannot read its store; see its log",
                None,
            ))
        }
    }
}

fn not_ready() -> Response {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the hub is starting and has not loaded its store yet; this page reloads shortly",
        None,
    );
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(5));
    response
}

async fn login_form(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    if session(&ui, &headers).await.is_ok() {
        return redirect(routes::HOME);
    }
    page_result(page::login_page(None))
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login(
    State(ui): State<Ui>,
    peer: Option<axum::Extension<crate::listen::Peer>>,
    headers: HeaderMap,
    uri: Uri,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    if !session::same_origin(&headers, uri.authority().map(|a| a.as_str())) {
        return error(
            StatusCode::FORBIDDEN,
            "this form must be sent from the hub's own page",
            None,
        );
    }
    let peer = peer.map(|axum::Extension(peer)| peer.0.ip());
    let client = throttle::client_of(peer);
    let shown = peer.map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
    let now_ms = || u64::try_from(ui.shared.settings.clock.now_ms()).unwrap_or(0);
    let emptied = match ui.throttle.attempt(client, now_ms()) {
        Ok(emptied) => emptied,
        Err(wait) => {
            tracing::debug!(peer = %shown, "login to the web page refused: too many failed logins");
            let mut response = error(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("too many failed logins from this address; try again in {wait} s"),
                None,
            );
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(wait));
            return response;
        }
    };
    let token = form.map(|Form(f)| f.token).unwrap_or_default();
    // Every attempt was counted against the client above (a login that succeeds
    // gives it back); a failed one is logged with its address and the reason, never
    // with the token it tried.
    let refused = |status: StatusCode, message: &str| {
        tracing::warn!(peer = %shown, status = status.as_u16(), "failed login to the web page: {message}");
        if emptied {
            tracing::warn!(peer = %shown, "too many failed logins to the web page: this client's next ones are answered 429 until its budget refills");
        }
        match page::login_page(Some(message)) {
            Ok(body) => html(status, body),
            Err(err) => page_result(Err(err)),
        }
    };
    let Ok(header) = HeaderValue::from_str(&format!("Bearer {}", token.trim())) else {
        return refused(StatusCode::UNAUTHORIZED, "that is not a token");
    };
    let token_id = match ui.shared.recorder.grant_with_id(Some(&header)).await {
        Ok((Grant::Person(_), id)) => id,
        Ok((Grant::Cluster(_), _)) => {
            return refused(
                StatusCode::FORBIDDEN,
                "that is a cluster's token; the page needs a person's token (flotilla token create --role viewer|operator|admin)",
            );
        }
        Err(_) => return refused(StatusCode::UNAUTHORIZED, "the token is unknown or revoked"),
    };
    ui.throttle.succeeded(client, now_ms());
    let new = session::new_session(&token_id, ui.shared.settings.clock.now_ms());
    if let Err(err) = ui.shared.recorder.open_session(&new.stored).await {
        tracing::error!("cannot record a web page session: {err}");
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the hub cannot write its store; see its log",
            None,
        );
    }
    tracing::info!(token = %token_id, "logged in to the web page");
    let mut response = redirect(routes::HOME);
    if let Ok(cookie) = HeaderValue::from_str(&session::set_cookie(&new.id, ui.secure)) {
        response.headers_mut().insert(SET_COOKIE, cookie);
    }
    response
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// Checks a state-changing request: a session, the hub's own origin, the session's
/// form token.
async fn check_post(
    ui: &Ui,
    headers: &HeaderMap,
    uri: &Uri,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Result<Login, Response> {
    let login = session(ui, headers).await?;
    if !session::same_origin(headers, uri.authority().map(|a| a.as_str())) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "this form must be sent from the hub's own page",
            login.csrf(),
        ));
    }
    let sent = form.map(|Form(f)| f.csrf).unwrap_or_default();
    if !session::same_token(&sent, &login.session.csrf) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "the form is out of date or was not sent by this page; reload it and try again",
            login.csrf(),
        ));
    }
    Ok(login)
}

async fn logout(
    State(ui): State<Ui>,
    headers: HeaderMap,
    uri: Uri,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let login = match check_post(&ui, &headers, &uri, form).await {
        Ok(login) => login,
        Err(response) => return response,
    };
    if let Err(err) = ui
        .shared
        .recorder
        .close_session(&login.session.id_hash)
        .await
    {
        tracing::error!("cannot end a web page session: {err}");
    }
    let mut response = redirect(routes::LOGIN);
    if let Ok(cookie) = HeaderValue::from_str(&session::clear_cookie(ui.secure)) {
        response.headers_mut().insert(SET_COOKIE, cookie);
    }
    response
}

async fn fleet(
    State(ui): State<Ui>,
    headers: HeaderMap,
    query: Result<Query<FleetQuery>, QueryRejection>,
) -> Response {
    let login = match session(&ui, &headers).await {
        Ok(login) => login,
        Err(response) => return response,
    };
    if !ui.shared.view.is_ready() {
        return not_ready();
    }
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let tenant = login.tenant_view(&ui.shared).await;
    // Only the rows shown are copied while the fleet is held; the page renders after.
    let model = ui.shared.view.with_fleet(|lines, now| match &tenant {
        Some(tenant) => {
            let theirs: Vec<_> = lines
                .iter()
                .filter(|l| tenant.sees(l.name))
                .copied()
                .collect();
            page::FleetModel::new(&theirs, &query, now, Some(tenant))
        }
        None => page::FleetModel::new(lines, &query, now, None),
    });
    let mut render = ui.shared.view.render_status();
    let mut rollouts = ui.shared.view.active_rollouts().to_vec();
    if let Some(tenant) = &tenant {
        render = tenant.render_status(render);
        rollouts = tenant.visible(&ui.shared, rollouts).await;
    }
    page_result(page::fleet_page(
        &model,
        &render,
        &rollouts,
        &query,
        &login.visitor,
    ))
}

async fn fleet_json(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let login = match session(&ui, &headers).await {
        Ok(login) => login,
        Err(_) => {
            let mut response = Response::new(Body::from(r#"{"error":"log in at /ui/login"}"#));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            harden(&mut response);
            return response;
        }
    };
    let tenant = login.tenant_view(&ui.shared).await;
    let (counts, drifted) = ui.shared.view.with_fleet(|lines, _| {
        let theirs: Vec<_> = lines
            .iter()
            .filter(|l| tenant.as_ref().is_none_or(|t| t.sees(l.name)))
            .copied()
            .collect();
        let drifted = theirs.iter().filter(|l| l.drifted()).count();
        (crate::fleet::Counts::of(&theirs), drifted)
    });
    let mut render = ui.shared.view.render_status();
    let mut rollouts = ui.shared.view.active_rollouts().to_vec();
    if let Some(tenant) = &tenant {
        render = tenant.render_status(render);
        rollouts = tenant.visible(&ui.shared, rollouts).await;
    }
    let body = serde_json::json!({
        "stamp": page::stamp(&render, &counts, drifted, &rollouts),
        "drifted": drifted,
        "revision": render.served_revision,
        "counts": counts.by_name(),
    });
    let mut response = Response::new(Body::from(body.to_string()));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    harden(&mut response);
    response
}

async fn cluster(State(ui): State<Ui>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let login = match session(&ui, &headers).await {
        Ok(login) => login,
        Err(response) => return response,
    };
    let not_served = || {
        error(
            StatusCode::NOT_FOUND,
            &format!("no cluster named {name:?} is served"),
            login.csrf(),
        )
    };
    let Some(mut summary) = ui.shared.view.fleet_summary_of(&name) else {
        return not_served();
    };
    let tenant = login.tenant_view(&ui.shared).await;
    if let Some(tenant) = &tenant {
        // A cluster the tenant is not on is answered as one that does not exist.
        match tenant.cluster(summary) {
            Some(theirs) => summary = theirs,
            None => return not_served(),
        }
    }
    let history = match ui.shared.view.reads().history(&name).await {
        Ok(history) => history
            .into_iter()
            .map(|(d, r)| (d.to_string(), r))
            .collect::<Vec<_>>(),
        Err(err) => {
            tracing::error!("cannot read the history of {name}: {err}");
            Vec::new()
        }
    };
    let runs = served_resources(&ui.shared, &name, tenant.as_ref()).await;
    let runs = runs.as_ref().map(|(resources, reported_on)| page::Runs {
        resources,
        reported_on: reported_on.clone(),
    });
    page_result(page::cluster_page(&summary, &history, runs, &login.visitor))
}

/// What the bundle served to `cluster` holds (only the tenant's resources for a
/// tenant's token), with each resource's state in its agent's last report, and the
/// digest that report is about when it is not the one served. `None` when the bundle
/// cannot be read.
async fn served_resources(
    shared: &Arc<Shared>,
    cluster: &str,
    tenant: Option<&TenantView>,
) -> Option<(Vec<page::ServedResource>, Option<String>)> {
    let entry = shared.view.served_to(cluster)?;
    let digest = entry.digest.clone();
    let reader = shared.clone();
    let read =
        tokio::task::spawn_blocking(move || reader.view.reads().object_blocking(&digest)).await;
    let body = match read {
        Ok(Ok(body)) => body,
        Ok(Err(err)) => {
            tracing::error!(%cluster, digest = %entry.digest, "cannot read the bundle to list what runs: {err}");
            return None;
        }
        Err(err) => {
            tracing::error!(%cluster, "reading the bundle to list what runs stopped: {err}");
            return None;
        }
    };
    let Some(bundle) = flotilla_core::access::ScopedBundle::parse(&body) else {
        tracing::error!(%cluster, digest = %entry.digest, "the stored bundle is not a bundle");
        return None;
    };
    let report = shared
        .view
        .statuses()
        .get(cluster)
        .map(|s| s.report.clone());
    let reported_on = report
        .as_ref()
        .and_then(|r| r.applied.as_ref().or(r.attempted.as_ref()))
        .filter(|d| **d != entry.digest)
        .map(ToString::to_string);
    let rendered = shared.view.rendered_workloads(&entry.digest);
    let resources = page::served_resources(&bundle, rendered.as_deref(), report.as_ref(), |key| {
        tenant.is_none_or(|t| t.owns_resource(cluster, key))
    });
    Some((resources, reported_on))
}

async fn cluster_bundle(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let login = match session(&ui, &headers).await {
        Ok(login) => login,
        Err(response) => return response,
    };
    // Before the cluster is looked up: the answer tells nothing of the fleet.
    if !login.visitor.reads_bundles {
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "{}'s token never reads bundles (they may hold Secrets); log in with an admin token",
                login.person.role.with_article()
            ),
            login.csrf(),
        );
    }
    let Some(entry) = ui.shared.view.served_to(&name) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("no cluster named {name:?} is served"),
            login.csrf(),
        );
    };
    let shared = ui.shared.clone();
    let read = tokio::task::spawn_blocking(move || {
        let document = shared
            .view
            .reads()
            .document(&entry, None)
            .map_err(|e| e.to_string())?;
        let mut value: serde_json::Value =
            serde_json::from_slice(&document).map_err(|e| e.to_string())?;
        page::redact_secrets(&mut value);
        Ok::<_, String>(page::bundle_sections(value))
    })
    .await;
    match read {
        Ok(Ok((sections, rest))) => {
            let digest = ui
                .shared
                .view
                .served_to(&name)
                .map(|c| c.digest.to_string())
                .unwrap_or_default();
            page_result(page::bundle_page(
                &name,
                &digest,
                (&sections, &rest),
                &login.visitor,
            ))
        }
        Ok(Err(err)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot read the bundle of {name}: {err}"),
            login.csrf(),
        ),
        Err(err) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &err.to_string(),
            login.csrf(),
        ),
    }
}

/// A rollout as the person sees it, and whether its token may steer it; `None` when
/// there is none, or a tenant's token does not see it.
async fn rollout_for(
    ui: &Ui,
    login: &Login,
    id: i64,
) -> Result<Option<(flotilla_core::rollout::view::RolloutView, bool)>, Response> {
    let view = match ui.shared.recorder.rollout_detail(id).await {
        Ok(Some(view)) => view,
        Ok(None) => return Ok(None),
        Err(err) => {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &err.to_string(),
                login.csrf(),
            ));
        }
    };
    let steers = login.person.role.steers();
    let Some(tenant) = login.tenant_view(&ui.shared).await else {
        return Ok(Some((view, steers)));
    };
    let scope = tenant.rollout(&ui.shared, &view).await;
    Ok(match scope.access {
        RolloutAccess::Hidden => None,
        access => Some((
            scope.cut(view),
            steers && access == RolloutAccess::Steerable,
        )),
    })
}

async fn rollout(State(ui): State<Ui>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let login = match session(&ui, &headers).await {
        Ok(login) => login,
        Err(response) => return response,
    };
    let Ok(id) = id.parse::<i64>() else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("{id:?} is not a rollout id"),
            login.csrf(),
        );
    };
    match rollout_for(&ui, &login, id).await {
        Ok(Some((view, steerable))) => {
            page_result(page::rollout_page(&view, &login.visitor, steerable))
        }
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            &format!("no rollout with id {id}"),
            login.csrf(),
        ),
        Err(response) => response,
    }
}

async fn rollout_action(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    uri: Uri,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let login = match check_post(&ui, &headers, &uri, form).await {
        Ok(login) => login,
        Err(response) => return response,
    };
    let csrf = login.csrf();
    let (Ok(id), Some(action)) = (id.parse::<i64>(), Action::parse(&action)) else {
        return error(StatusCode::NOT_FOUND, "no such rollout or action", csrf);
    };
    if !login.person.role.steers() {
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "a {}'s token reads only; steering a rollout needs an operator's or admin's token",
                login.person.role
            ),
            csrf,
        );
    }
    match rollout_for(&ui, &login, id).await {
        Ok(Some((_, true))) => {}
        Ok(Some((_, false))) => {
            return error(
                StatusCode::FORBIDDEN,
                &format!(
                    "rollout {id} changes more than your tenant's workloads; only a token for the whole fleet steers it"
                ),
                csrf,
            );
        }
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                &format!("no rollout with id {id}"),
                csrf,
            );
        }
        Err(response) => return response,
    }
    let role = login.person.label();
    match ui
        .shared
        .recorder
        .rollout_action(id, action, (&login.session.token_id, &role))
        .await
    {
        Ok(_) => redirect(&format!("/ui/rollouts/{id}")),
        Err(ActionRefused::NotFound(id)) => error(
            StatusCode::NOT_FOUND,
            &format!("no rollout with id {id}"),
            csrf,
        ),
        Err(ActionRefused::Conflict(err)) => error(StatusCode::CONFLICT, &err.to_string(), csrf),
        Err(ActionRefused::Hub(err)) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string(), csrf)
        }
    }
}

impl IntoResponse for page::PageError {
    fn into_response(self) -> Response {
        page_result(Err(self))
    }
}
