//! A fake Kubernetes API server for flotilla's tests.
//!
//! No API server can run where flotilla's tests run, so this one answers as a real one
//! does in the ways that matter to a client that applies, watches health and prunes:
//!
//! - **discovery** (`/api`, `/apis`, per group and version), built-in groups and the
//!   served versions of Established CustomResourceDefinitions ([`catalog`]);
//! - **server-side apply**: 201 when the apply creates, 200 when it updates; no status
//!   on a new object, `metadata.generation` 1 and raised when the spec changes, status
//!   kept on updates; field ownership, with 409 and the real message shape on a
//!   conflict with another manager; 409 when the applied object carries a stale
//!   `resourceVersion`; 400 when it carries `managedFields`; 500 for objects the typed
//!   patch cannot be built for; 422 for invalid labels and for a change of a Job's
//!   pod template;
//! - **authorization** by RBAC rules, per verb, including `create` on an apply that
//!   creates and the `escalate` and `bind` checks on RBAC objects ([`rbac`]);
//!   **impersonation** (`Impersonate-User`): the caller needs `impersonate` on the
//!   ServiceAccount, and the request then holds the rules the stored RoleBindings and
//!   ClusterRoleBindings grant that ServiceAccount;
//! - **admission**: the namespace must exist and must not be Terminating; `default`,
//!   `kube-system` and `kube-public` may not be deleted; a validating or mutating
//!   webhook whose Service is missing fails the objects it matches with a 500;
//! - **deletion**: `preconditions` (uid, resourceVersion) answered 409 when they do not
//!   hold; objects with finalizers get a `deletionTimestamp` and stay; a Namespace goes
//!   Terminating and a second delete answers 409; 404 once gone;
//! - **mutating admission** set by a test ([`FakeApiServer::mutate_applies`]), on
//!   every apply;
//! - a bearer token, when one is set (401 otherwise), and faults injected by tests
//!   (any status, a request that never answers, a dropped connection).
//!
//! Each behaviour names, in a comment, the Kubernetes source or documentation it
//! follows. What it leaves out: lists are atomic in field ownership, no conversion
//! between versions beyond `apiVersion`, no garbage collection of owned objects, no
//! watch, and a deleted CRD takes its custom resources with it at once.
//!
//! Use it in process with [`FakeApiServer::client`] (paused tokio time works), or over
//! HTTPS with [`FakeApiServer::serve_https`].

mod catalog;
mod https;
mod rbac;
mod request;
mod status;
mod store;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use http::{HeaderMap, Method, Uri};
use serde_json::{Value, json};

pub use catalog::version_priority;
use catalog::{Generation, KindInfo, served_kinds};
pub use https::HttpsServer;
pub use rbac::{Attributes, Rule};
use request::{ResourceRequest, Target, query_value};
use status::ApiError;
use store::{ObjKey, Operation, Owner, Stored, TIMESTAMP};

/// The identity requests are made as (a service account in the agent's namespace).
pub const DEFAULT_USER: &str = "system:serviceaccount:flotilla-system:flotilla-agent";

/// Namespaces the NamespaceLifecycle admission plugin refuses to delete
/// (`staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go`,
/// `immortalNamespaces`).
pub const IMMORTAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// One request the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub method: String,
    pub path: String,
    pub query: String,
    pub code: u16,
}

impl Exchange {
    /// `METHOD path` (without the query).
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// One authorization decision: what was asked and whether the rules allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Who asked: the caller, or the user it impersonates.
    pub user: String,
    pub attributes: Attributes,
    /// The index of the rule that allowed it; `None` when refused.
    pub rule: Option<usize>,
}

/// A fault a test stages: the next matching requests get this answer instead.
#[derive(Debug, Clone)]
pub struct Fault {
    method: Option<String>,
    path_contains: String,
    times: usize,
    answer: FaultAnswer,
}

#[derive(Debug, Clone)]
enum FaultAnswer {
    Status(u16, String, String),
    Hang,
    Disconnect,
}

impl Fault {
    /// Answer with a `Status` of this code, reason and message.
    pub fn status(code: u16, reason: &str, message: &str) -> Fault {
        Fault::with(FaultAnswer::Status(code, reason.into(), message.into()))
    }

    /// Never answer (a hung connection).
    pub fn hang() -> Fault {
        Fault::with(FaultAnswer::Hang)
    }

    /// Drop the connection without an answer (in process: a transport error).
    pub fn disconnect() -> Fault {
        Fault::with(FaultAnswer::Disconnect)
    }

    fn with(answer: FaultAnswer) -> Fault {
        Fault {
            method: None,
            path_contains: String::new(),
            times: 1,
            answer,
        }
    }

    /// Only for requests with this method whose path contains `path_contains`.
    pub fn on(mut self, method: &str, path_contains: &str) -> Fault {
        self.method = Some(method.to_string());
        self.path_contains = path_contains.to_string();
        self
    }

    /// For this many matching requests (default 1; `usize::MAX` for all).
    pub fn times(mut self, times: usize) -> Fault {
        self.times = times;
        self
    }
}

/// A change a test makes just before a matching request is answered (a controller or
/// a person acting at the worst moment).
type Hook = Box<dyn FnOnce(&FakeApiServer) + Send>;

/// A mutating admission webhook: changes every object an apply writes.
type Mutation = Arc<dyn Fn(&mut Value) + Send + Sync>;

/// What the fake does with one request.
#[derive(Debug)]
pub(crate) enum Answer {
    Reply(u16, Value),
    Hang,
    Disconnect,
}

/// The fake API server. Clones share one state.
#[derive(Clone)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        FakeApiServer::new()
    }
}

struct State {
    objects: BTreeMap<ObjKey, Stored>,
    next_version: u64,
    next_uid: u64,
    user: String,
    /// `None`: everything is allowed (a cluster admin).
    rules: Option<Vec<Rule>>,
    token: Option<String>,
    faults: Vec<Fault>,
    hooks: Vec<(String, String, Hook)>,
    exchanges: Vec<Exchange>,
    checks: Vec<Check>,
    /// On which read after its creation a CRD is Established; `None`: never.
    establish_after: Option<u32>,
    mutations: Vec<Mutation>,
}

impl FakeApiServer {
    /// A fake that allows everything, with the namespaces every cluster has.
    pub fn new() -> FakeApiServer {
        let fake = FakeApiServer {
            state: Arc::new(Mutex::new(State {
                objects: BTreeMap::new(),
                next_version: 1000,
                next_uid: 1,
                user: DEFAULT_USER.to_string(),
                rules: None,
                token: None,
                faults: Vec::new(),
                hooks: Vec::new(),
                exchanges: Vec::new(),
                checks: Vec::new(),
                establish_after: Some(1),
                mutations: Vec::new(),
            })),
        };
        for name in [
            "default",
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "flotilla-system",
        ] {
            fake.insert(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                "kube-apiserver",
            );
        }
        fake
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Authorizes requests by these RBAC rules (the `rules` of a ClusterRole, JSON),
    /// instead of allowing everything.
    pub fn with_rules(self, rules: &Value) -> FakeApiServer {
        self.lock().rules = Some(Rule::of_role(&json!({"rules": rules})));
        self
    }

    /// Requires `Authorization: Bearer TOKEN` (401 otherwise).
    pub fn with_token(self, token: &str) -> FakeApiServer {
        self.lock().token = Some(token.to_string());
        self
    }

    /// A new CRD becomes Established on this read after its creation (1: the first
    /// read sees it Established), or never.
    pub fn establish_crds_after(self, reads: Option<u32>) -> FakeApiServer {
        self.lock().establish_after = reads;
        self
    }

    /// A kube client that talks to this fake in process (no network).
    pub fn client(&self) -> kube::Client {
        self.client_in("default")
    }

    /// The same, with `namespace` as the client's default namespace.
    pub fn client_in(&self, namespace: &str) -> kube::Client {
        self.client_with(namespace, None)
    }

    /// A client whose every request impersonates `user` (`Impersonate-User`), as
    /// kube-rs's `AuthInfo::impersonate` makes one.
    pub fn impersonating_client(&self, user: &str) -> kube::Client {
        self.client_with("default", Some(user.to_string()))
    }

    fn client_with(&self, namespace: &str, user: Option<String>) -> kube::Client {
        let fake = self.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let fake = fake.clone();
            let user = user.clone();
            async move {
                let (mut parts, body) = request.into_parts();
                if let Some(value) = user.and_then(|u| http::HeaderValue::from_str(&u).ok()) {
                    parts.headers.insert("impersonate-user", value);
                }
                let bytes = body.collect_bytes().await?;
                match fake.answer(&parts.method, &parts.uri, &parts.headers, &bytes) {
                    Answer::Reply(code, body) => http::Response::builder()
                        .status(code)
                        .header(http::header::CONTENT_TYPE, "application/json")
                        .body(kube::client::Body::from(
                            serde_json::to_vec(&body).unwrap_or_default(),
                        ))
                        .map_err(|err| -> tower::BoxError { Box::new(err) }),
                    Answer::Hang => std::future::pending().await,
                    Answer::Disconnect => Err("connection reset by the fake API server".into()),
                }
            }
        });
        kube::Client::new(service, namespace)
    }

    /// Changes every object a server-side apply writes, after defaulting, as a
    /// mutating admission webhook would (the change is the applier's, as the real
    /// server attributes it).
    pub fn mutate_applies(&self, mutation: impl Fn(&mut Value) + Send + Sync + 'static) {
        self.lock().mutations.push(Arc::new(mutation));
    }

    /// Stages a fault for the next matching requests.
    pub fn fail(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Runs `change` once, just before the first request with this method whose path
    /// contains `path_contains` is answered.
    pub fn before(
        &self,
        method: &str,
        path_contains: &str,
        change: impl FnOnce(&FakeApiServer) + Send + 'static,
    ) {
        self.lock().hooks.push((
            method.to_string(),
            path_contains.to_string(),
            Box::new(change),
        ));
    }

    /// Every request answered so far, in order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.lock().exchanges.clone()
    }

    /// Forgets the requests answered so far.
    pub fn clear_exchanges(&self) {
        self.lock().exchanges.clear();
    }

    /// Every authorization decision so far, in order.
    pub fn checks(&self) -> Vec<Check> {
        self.lock().checks.clone()
    }

    /// Creates or updates an object as another client would (an `Update` by
    /// `manager`, which then owns every field it set). `status` is kept as given, as
    /// a controller would have written it.
    pub fn insert(&self, object: Value, manager: &str) -> Value {
        let mut state = self.lock();
        let Some(info) = state.kind_of_object(&object) else {
            panic!("the fake does not serve {object}");
        };
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = if info.namespaced {
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let key = ObjKey {
            group: info.group.clone(),
            plural: info.plural.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let version = state.version();
        let paths = store::leaves(&object, false)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let owner = Owner {
            operation: Operation::Update,
            api_version: info.api_version(),
            paths,
        };
        let mut stored = match state.objects.remove(&key) {
            Some(mut existing) => {
                let status = existing.object.get("status").cloned();
                store::merge(&mut existing.object, &object);
                if object.get("status").is_none()
                    && let Some(status) = status
                {
                    existing.object["status"] = status;
                }
                existing
            }
            None => {
                let uid = state.uid();
                let mut created = object.clone();
                created["metadata"]["uid"] = json!(uid);
                created["metadata"]["creationTimestamp"] = json!(TIMESTAMP);
                if info.namespaced {
                    created["metadata"]["namespace"] = json!(namespace);
                }
                if info.generation != Generation::Untracked {
                    created["metadata"]["generation"] = json!(1);
                }
                prepare_for_create(&info, &mut created);
                Stored {
                    object: created,
                    owners: BTreeMap::new(),
                    establish_in: None,
                }
            }
        };
        stored.object["metadata"]["resourceVersion"] = json!(version);
        defaults(&info, &mut stored.object);
        stored.owners.insert(manager.to_string(), owner);
        let rendered = stored.render();
        state.objects.insert(key, stored);
        rendered
    }

    /// The object as a GET returns it, if it exists.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let state = self.lock();
        let key = state.key_of(api_version, kind, namespace, name)?;
        state.objects.get(&key).map(Stored::render)
    }

    /// Every object of a kind, rendered.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let state = self.lock();
        let Some(info) = state.kind_info(api_version, kind) else {
            return Vec::new();
        };
        state
            .objects
            .iter()
            .filter(|(key, _)| key.group == info.group && key.plural == info.plural)
            .map(|(_, stored)| stored.render())
            .collect()
    }

    /// Changes an object as a controller would (its status, say); bumps its
    /// resourceVersion. Returns false if there is no such object.
    pub fn update(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> bool {
        let mut state = self.lock();
        let Some(key) = state.key_of(api_version, kind, namespace, name) else {
            return false;
        };
        let version = state.version();
        match state.objects.get_mut(&key) {
            Some(stored) => {
                change(&mut stored.object);
                stored.object["metadata"]["resourceVersion"] = json!(version);
                true
            }
            None => false,
        }
    }

    /// Deletes an object at once, as a controller would (the TTL controller deleting
    /// a finished Job); returns whether it existed.
    pub fn remove(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let mut state = self.lock();
        match state.key_of(api_version, kind, namespace, name) {
            Some(key) => state.objects.remove(&key).is_some(),
            None => false,
        }
    }

    /// Sets an object's `status`, as its controller would.
    pub fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        status: Value,
    ) -> bool {
        self.update(api_version, kind, namespace, name, |object| {
            object["status"] = status
        })
    }

    /// Removes an object's finalizers; if it was being deleted, it goes.
    pub fn remove_finalizers(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let mut state = self.lock();
        let Some(key) = state.key_of(api_version, kind, namespace, name) else {
            return;
        };
        let gone = match state.objects.get_mut(&key) {
            Some(stored) => {
                if let Some(metadata) = stored.object["metadata"].as_object_mut() {
                    metadata.remove("finalizers");
                }
                stored.object["metadata"].get("deletionTimestamp").is_some()
            }
            None => false,
        };
        if gone {
            state.objects.remove(&key);
        }
    }

    /// Does what the namespace controller does for a Terminating namespace: deletes
    /// everything in it, then the namespace itself.
    pub fn finish_namespace_termination(&self, name: &str) {
        let mut state = self.lock();
        state.objects.retain(|key, _| {
            key.namespace != name
                && !(key.group.is_empty() && key.plural == "namespaces" && key.name == name)
        });
    }

    /// Answers one request.
    pub(crate) fn answer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Answer {
        let path = uri.path().to_string();
        let query = uri.query().unwrap_or_default().to_string();
        let hook = {
            let mut state = self.lock();
            let index = state
                .hooks
                .iter()
                .position(|(m, p, _)| m == method.as_str() && path.contains(p.as_str()));
            index.map(|i| state.hooks.remove(i).2)
        };
        if let Some(hook) = hook {
            hook(self);
        }
        let mut state = self.lock();
        let answer = state.answer(method.as_str(), &path, &query, headers, body);
        let code = match &answer {
            Answer::Reply(code, _) => *code,
            Answer::Hang | Answer::Disconnect => 0,
        };
        state.exchanges.push(Exchange {
            method: method.to_string(),
            path,
            query,
            code,
        });
        answer
    }
}

impl State {
    fn version(&mut self) -> String {
        self.next_version += 1;
        self.next_version.to_string()
    }

    fn uid(&mut self) -> String {
        self.next_uid += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
    }

    fn crds(&self) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| {
                k.group == "apiextensions.k8s.io" && k.plural == "customresourcedefinitions"
            })
            .map(|(_, s)| s.object.clone())
            .collect()
    }

    fn kinds(&self) -> Vec<KindInfo> {
        served_kinds(&self.crds())
    }

    fn kind_info(&self, api_version: &str, kind: &str) -> Option<KindInfo> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.kinds()
            .into_iter()
            .find(|k| k.group == group && k.version == version && k.kind == kind)
    }

    fn kind_of_object(&self, object: &Value) -> Option<KindInfo> {
        self.kind_info(object["apiVersion"].as_str()?, object["kind"].as_str()?)
    }

    fn key_of(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<ObjKey> {
        let info = self.kind_info(api_version, kind)?;
        Some(ObjKey {
            group: info.group,
            plural: info.plural,
            namespace: if info.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        })
    }

    fn answer(
        &mut self,
        method: &str,
        path: &str,
        query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Answer {
        // Authentication comes first (`filters/authentication.go`): a missing or wrong
        // token is a 401 whatever the request.
        if let Some(token) = &self.token {
            let presented = headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if presented != Some(token.as_str()) {
                let error = status::unauthorized();
                return Answer::Reply(error.code, error.body);
            }
        }
        if let Some(index) = self.faults.iter().position(|f| {
            f.times > 0
                && f.method.as_deref().is_none_or(|m| m == method)
                && path.contains(&f.path_contains)
        }) {
            let fault = &mut self.faults[index];
            fault.times -= 1;
            return match fault.answer.clone() {
                FaultAnswer::Status(code, reason, message) => {
                    let error = status::other(code, &reason, &message);
                    Answer::Reply(error.code, error.body)
                }
                FaultAnswer::Hang => Answer::Hang,
                FaultAnswer::Disconnect => Answer::Disconnect,
            };
        }
        let target = request::parse(method, path, query);
        let impersonated = match self.impersonation(headers, &target) {
            Ok(impersonated) => impersonated,
            Err(error) => return Answer::Reply(error.code, error.body),
        };
        // The request runs as the impersonated user, with the rules its bindings grant.
        let caller = impersonated.map(|(user, rules)| {
            (
                std::mem::replace(&mut self.user, user),
                self.rules.replace(rules),
            )
        });
        let result = match target {
            // Discovery is open to every authenticated user (the `system:discovery`
            // ClusterRole of `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`).
            Target::Discovery {
                group,
                version,
                core,
            } => self.discovery(group, version, core),
            Target::Resource(request) => self.resource(request, query, headers, body),
            Target::Other => Err(status::no_such_resource()),
        };
        if let Some((user, rules)) = caller {
            self.user = user;
            self.rules = rules;
        }
        match result {
            Ok((code, body)) => Answer::Reply(code, body),
            Err(error) => Answer::Reply(error.code, error.body),
        }
    }

    fn discovery(
        &self,
        group: Option<String>,
        version: Option<String>,
        core: bool,
    ) -> Result<(u16, Value), ApiError> {
        let kinds = self.kinds();
        let document = match (core, group, version) {
            (true, None, None) => Some(catalog::core_versions()),
            (false, None, None) => Some(catalog::group_list(&kinds)),
            (false, Some(group), None) => catalog::group(&kinds, &group),
            (_, Some(group), Some(version)) => catalog::resource_list(&kinds, &group, &version),
            _ => None,
        };
        document
            .map(|d| (200, d))
            .ok_or_else(status::no_such_resource)
    }

    /// The user an `Impersonate-User` header names and the rules it holds for this
    /// request, once the caller was allowed to impersonate it
    /// (`staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go`: the
    /// caller needs `impersonate` on `serviceaccounts` (name, namespace) for a
    /// `system:serviceaccount:<namespace>:<name>`, on `users` otherwise). Only
    /// ServiceAccounts get rules here: those of the RoleBindings in the request's
    /// namespace and of the ClusterRoleBindings that name it as a subject
    /// (`plugin/pkg/auth/authorizer/rbac/rbac.go`, `VisitRulesFor`). `None` without
    /// the header.
    fn impersonation(
        &mut self,
        headers: &HeaderMap,
        target: &Target,
    ) -> Result<Option<(String, Vec<Rule>)>, ApiError> {
        let Some(user) = headers.get("impersonate-user") else {
            return Ok(None);
        };
        let user = user.to_str().unwrap_or_default().to_string();
        let account = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
            .map(|(namespace, name)| (namespace.to_string(), name.to_string()));
        let attributes = match &account {
            Some((namespace, name)) => Attributes {
                verb: "impersonate".into(),
                group: String::new(),
                resource: "serviceaccounts".into(),
                name: name.clone(),
                namespace: namespace.clone(),
            },
            None => Attributes {
                verb: "impersonate".into(),
                group: String::new(),
                resource: "users".into(),
                name: user.clone(),
                namespace: String::new(),
            },
        };
        self.authorize(attributes)?;
        let namespace = match target {
            Target::Resource(request) => request.namespace.as_str(),
            _ => "",
        };
        let rules = match &account {
            Some((account_namespace, name)) => {
                self.service_account_rules(account_namespace, name, namespace)
            }
            None => Vec::new(),
        };
        Ok(Some((user, rules)))
    }

    /// The rules ServiceAccount `namespace/name` holds in `request_namespace` (at the
    /// cluster scope when empty): its ClusterRoleBindings' roles everywhere, its
    /// RoleBindings' roles in their own namespace.
    fn service_account_rules(
        &self,
        namespace: &str,
        name: &str,
        request_namespace: &str,
    ) -> Vec<Rule> {
        const RBAC: &str = "rbac.authorization.k8s.io";
        let names_it = |binding: &Value, binding_namespace: &str| {
            binding["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|subject| {
                    subject["kind"] == "ServiceAccount"
                        && subject["name"] == name
                        && subject["namespace"].as_str().unwrap_or(binding_namespace) == namespace
                })
        };
        let mut rules = Vec::new();
        for (key, stored) in &self.objects {
            if key.group != RBAC {
                continue;
            }
            let in_scope = match key.plural.as_str() {
                "clusterrolebindings" => true,
                "rolebindings" => {
                    !request_namespace.is_empty() && key.namespace == request_namespace
                }
                _ => false,
            };
            if !in_scope || !names_it(&stored.object, &key.namespace) {
                continue;
            }
            let role_ref = &stored.object["roleRef"];
            let (plural, role_namespace) = match role_ref["kind"].as_str() {
                Some("ClusterRole") => ("clusterroles", String::new()),
                Some("Role") if key.plural == "rolebindings" => ("roles", key.namespace.clone()),
                _ => continue,
            };
            let role = self.objects.get(&ObjKey {
                group: RBAC.into(),
                plural: plural.into(),
                namespace: role_namespace,
                name: role_ref["name"].as_str().unwrap_or_default().to_string(),
            });
            if let Some(role) = role {
                rules.extend(Rule::of_role(&role.object));
            }
        }
        rules
    }

    /// Asks the authorizer; records the decision.
    fn authorize(&mut self, attributes: Attributes) -> Result<(), ApiError> {
        let rule = match &self.rules {
            None => Some(0),
            Some(rules) => rbac::allows(rules, &attributes),
        };
        self.checks.push(Check {
            user: self.user.clone(),
            attributes: attributes.clone(),
            rule,
        });
        if rule.is_some() {
            return Ok(());
        }
        // `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`,
        // `forbiddenMessage`.
        let scope = if attributes.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", attributes.namespace)
        };
        let resource = attributes
            .resource
            .split_once('/')
            .map_or(attributes.resource.as_str(), |(resource, _)| resource);
        Err(status::forbidden(
            &attributes.group,
            resource,
            &attributes.name,
            &format!(
                "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
                self.user, attributes.verb, attributes.resource, attributes.group
            ),
        ))
    }

    fn resource(
        &mut self,
        request: ResourceRequest,
        query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(u16, Value), ApiError> {
        let kinds = self.kinds();
        let Some(info) = kinds.into_iter().find(|k| {
            k.group == request.group && k.version == request.version && k.plural == request.resource
        }) else {
            return Err(status::no_such_resource());
        };
        let resource = if request.subresource.is_empty() {
            request.resource.clone()
        } else {
            format!("{}/{}", request.resource, request.subresource)
        };
        // The authorization filter runs before any handler (`filters/authorization.go`).
        self.authorize(Attributes {
            verb: request.verb.clone(),
            group: request.group.clone(),
            resource,
            name: request.name.clone(),
            namespace: request.namespace.clone(),
        })?;
        if !request.subresource.is_empty() {
            return Err(status::no_such_resource());
        }
        let key = ObjKey {
            group: info.group.clone(),
            plural: info.plural.clone(),
            namespace: if info.namespaced {
                request.namespace.clone()
            } else {
                String::new()
            },
            name: request.name.clone(),
        };
        match request.verb.as_str() {
            "get" => self.get(&info, &key),
            "list" => Ok((200, self.list(&info, &request.namespace, query))),
            "patch" => self.apply(&info, &key, query, headers, body),
            "delete" => self.delete(&info, &key, body),
            verb => Err(status::other(
                405,
                "MethodNotAllowed",
                &format!(
                    "the fake API server does not implement {verb} (flotilla's agent does not use it)"
                ),
            )),
        }
    }

    fn get(&mut self, info: &KindInfo, key: &ObjKey) -> Result<(u16, Value), ApiError> {
        let version = self.version();
        let Some(stored) = self.objects.get_mut(key) else {
            return Err(status::not_found(&info.group, &info.plural, &key.name));
        };
        // The establishing controller marks a CRD Established shortly after its names
        // are accepted (`apiextensions-apiserver/pkg/controller/establish/establishing_controller.go`);
        // here that happens on a chosen read.
        if let Some(reads) = stored.establish_in {
            if reads <= 1 {
                stored.establish_in = None;
                let names = stored.object["spec"]["names"].clone();
                stored.object["status"] = json!({
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "lastTransitionTime": TIMESTAMP},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "lastTransitionTime": TIMESTAMP}],
                    "acceptedNames": names, "storedVersions": []});
                stored.object["metadata"]["resourceVersion"] = json!(version);
            } else {
                stored.establish_in = Some(reads - 1);
            }
        }
        let mut object = stored.render();
        object["apiVersion"] = json!(info.api_version());
        Ok((200, object))
    }

    fn list(&mut self, info: &KindInfo, namespace: &str, query: &str) -> Value {
        let selector: Vec<(String, String)> = query_value(query, "labelSelector")
            .unwrap_or_default()
            .split(',')
            .filter_map(|term| {
                term.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(key, _)| {
                key.group == info.group
                    && key.plural == info.plural
                    && (namespace.is_empty() || key.namespace == namespace)
            })
            .filter(|(_, stored)| {
                selector
                    .iter()
                    .all(|(k, v)| stored.object["metadata"]["labels"][k].as_str() == Some(v))
            })
            .map(|(_, stored)| {
                let mut object = stored.render();
                object["apiVersion"] = json!(info.api_version());
                object
            })
            .collect();
        json!({"kind": format!("{}List", info.kind), "apiVersion": info.api_version(),
               "metadata": {"resourceVersion": self.next_version.to_string()}, "items": items})
    }

    /// Server-side apply (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go`).
    fn apply(
        &mut self,
        info: &KindInfo,
        key: &ObjKey,
        query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(u16, Value), ApiError> {
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if content_type.split(';').next() != Some("application/apply-patch+yaml") {
            return Err(status::other(
                415,
                "UnsupportedMediaType",
                "the fake API server implements only server-side apply (application/apply-patch+yaml)",
            ));
        }
        // `ValidatePatchOptions`: apply needs a field manager.
        let Some(manager) = query_value(query, "fieldManager").filter(|m| !m.is_empty()) else {
            return Err(status::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[(
                    "fieldManager".into(),
                    "Required value: is required for apply patch".into(),
                )],
            ));
        };
        let force = query_value(query, "force").as_deref() == Some("true");
        let config: Value = serde_json::from_slice(body)
            .map_err(|err| status::bad_request(format!("error decoding YAML: {err}")))?;
        // The managed-fields admission refuses an apply that carries managedFields
        // (`staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/fieldmanager.go`).
        if config["metadata"].get("managedFields").is_some() {
            return Err(status::bad_request("metadata.managedFields must be nil"));
        }
        // `checkName` and `EnsureObjectNamespaceMatchesRequestNamespace` in patch.go.
        let body_name = config["metadata"]["name"].as_str().unwrap_or_default();
        if body_name != key.name {
            return Err(status::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                key.name
            )));
        }
        if let Some(namespace) = config["metadata"]["namespace"].as_str()
            && namespace != key.namespace
        {
            return Err(status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if let Some(error) = typed_patch_error(info, key, &config) {
            return Err(status::untyped_500(error));
        }
        match self.objects.get(key).cloned() {
            None => self.apply_create(info, key, &manager, config),
            Some(existing) => self.apply_update(info, key, &manager, force, config, existing),
        }
    }

    fn apply_create(
        &mut self,
        info: &KindInfo,
        key: &ObjKey,
        manager: &str,
        config: Value,
    ) -> Result<(u16, Value), ApiError> {
        // patch.go, `applyPatch`: a uid in an apply that creates is a conflict.
        if let Some(uid) = config["metadata"]["uid"].as_str() {
            return Err(status::conflict(
                &info.group,
                &info.plural,
                &key.name,
                &format!(
                    "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                ),
            ));
        }
        self.admit_namespace(info, key)?;
        self.check_escalation(info, key, &config)?;
        // patch.go wipes the system fields of an object that an apply creates
        // (`rest.WipeObjectMetaSystemFields`); the strategy's PrepareForCreate clears
        // status and sets generation 1 (`pkg/registry/apps/deployment/strategy.go`).
        let mut object = without_server_fields(&config, info.status);
        object["apiVersion"] = json!(info.api_version());
        object["metadata"]["name"] = json!(key.name);
        if info.namespaced {
            object["metadata"]["namespace"] = json!(key.namespace);
        }
        object["metadata"]["uid"] = json!(self.uid());
        object["metadata"]["creationTimestamp"] = json!(TIMESTAMP);
        if info.generation != Generation::Untracked {
            object["metadata"]["generation"] = json!(1);
        }
        prepare_for_create(info, &mut object);
        defaults(info, &mut object);
        for mutation in &self.mutations {
            mutation(&mut object);
        }
        validate(info, key, &object)?;
        // patch.go authorizes `create` when the apply creates (`withAuthorization` on
        // `createValidation`), after the object passed validation.
        self.authorize(Attributes {
            verb: "create".into(),
            group: info.group.clone(),
            resource: info.plural.clone(),
            name: key.name.clone(),
            namespace: key.namespace.clone(),
        })?;
        self.call_webhooks(info, "CREATE")?;
        object["metadata"]["resourceVersion"] = json!(self.version());
        let paths = store::leaves(&config, info.status)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let mut owners = BTreeMap::new();
        owners.insert(
            manager.to_string(),
            Owner {
                operation: Operation::Apply,
                api_version: info.api_version(),
                paths,
            },
        );
        let establish_in = (info.kind == "CustomResourceDefinition")
            .then_some(self.establish_after)
            .flatten();
        let stored = Stored {
            object,
            owners,
            establish_in,
        };
        let rendered = stored.render();
        self.objects.insert(key.clone(), stored);
        Ok((201, rendered))
    }

    fn apply_update(
        &mut self,
        info: &KindInfo,
        key: &ObjKey,
        manager: &str,
        force: bool,
        config: Value,
        existing: Stored,
    ) -> Result<(u16, Value), ApiError> {
        let leaves = store::leaves(&config, info.status);
        let mut owners = existing.owners.clone();
        // Conflicts: a field another manager owns whose value the apply changes
        // (https://kubernetes.io/docs/reference/using-api/server-side-apply/#conflicts).
        let mut conflicts: Vec<(String, store::FieldPath)> = Vec::new();
        for (path, value) in &leaves {
            for (other, owner) in &owners {
                if other != manager
                    && owner.paths.contains(path)
                    && store::get_path(&existing.object, path) != Some(value)
                {
                    conflicts.push((other.clone(), path.clone()));
                }
            }
        }
        if !conflicts.is_empty() {
            if !force {
                return Err(apply_conflict(&owners, &conflicts));
            }
            for (other, path) in &conflicts {
                if let Some(owner) = owners.get_mut(other) {
                    owner.paths.remove(path);
                }
            }
            owners.retain(|_, owner| !owner.paths.is_empty());
        }
        let mut object = existing.object.clone();
        let new_paths: std::collections::BTreeSet<store::FieldPath> =
            leaves.iter().map(|(p, _)| p.clone()).collect();
        if let Some(previous) = owners.get(manager) {
            for path in previous.paths.difference(&new_paths) {
                if !owners
                    .iter()
                    .any(|(m, o)| m != manager && o.paths.contains(path))
                {
                    store::remove_path(&mut object, path);
                }
            }
        }
        store::merge(&mut object, &without_server_fields(&config, info.status));
        // The registry keeps status on writes to the main resource (ResetFieldsFor).
        match existing.object.get("status") {
            Some(status) if info.status => object["status"] = status.clone(),
            _ => {}
        }
        object["apiVersion"] = json!(info.api_version());
        // The store compares resourceVersions after the patch is applied
        // (`registry/generic/registry/store.go`, `Update`, OptimisticLockErrorMsg).
        if let Some(version) = config["metadata"]["resourceVersion"].as_str()
            && Some(version) != existing.object["metadata"]["resourceVersion"].as_str()
        {
            return Err(status::conflict(
                &info.group,
                &info.plural,
                &key.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        for system in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
        ] {
            if let Some(value) = existing.object["metadata"].get(system) {
                object["metadata"][system] = value.clone();
            }
        }
        if let Some(uid) = config["metadata"]["uid"].as_str()
            && Some(uid) != existing.object["metadata"]["uid"].as_str()
        {
            return Err(status::invalid(
                &info.group,
                &info.kind,
                &key.name,
                &[(
                    "metadata.uid".into(),
                    format!("Invalid value: {uid:?}: field is immutable"),
                )],
            ));
        }
        self.check_escalation(info, key, &config)?;
        defaults(info, &mut object);
        for mutation in &self.mutations {
            mutation(&mut object);
        }
        immutable_fields(info, key, &existing.object, &object)?;
        if generation_changes(info.generation, &existing.object, &object) {
            let generation = existing.object["metadata"]["generation"]
                .as_i64()
                .unwrap_or(0);
            object["metadata"]["generation"] = json!(generation + 1);
        }
        validate(info, key, &object)?;
        self.call_webhooks(info, "UPDATE")?;
        owners.insert(
            manager.to_string(),
            Owner {
                operation: Operation::Apply,
                api_version: info.api_version(),
                paths: new_paths,
            },
        );
        let changed = object != existing.object
            || owners
                .iter()
                .map(|(m, o)| (m, &o.paths))
                .ne(existing.owners.iter().map(|(m, o)| (m, &o.paths)));
        if changed {
            object["metadata"]["resourceVersion"] = json!(self.version());
        }
        let stored = Stored {
            object,
            owners,
            establish_in: existing.establish_in,
        };
        let rendered = stored.render();
        self.objects.insert(key.clone(), stored);
        Ok((200, rendered))
    }

    /// The NamespaceLifecycle admission plugin: no content in a namespace that does not
    /// exist (404) or is being terminated (403 with a NamespaceTerminating cause).
    fn admit_namespace(&self, info: &KindInfo, key: &ObjKey) -> Result<(), ApiError> {
        if !info.namespaced {
            return Ok(());
        }
        let namespace_key = ObjKey {
            group: String::new(),
            plural: "namespaces".into(),
            namespace: String::new(),
            name: key.namespace.clone(),
        };
        let Some(namespace) = self.objects.get(&namespace_key) else {
            return Err(status::not_found("", "namespaces", &key.namespace));
        };
        if namespace.object["status"]["phase"].as_str() == Some("Terminating") {
            let mut error = status::forbidden(
                &info.group,
                &info.plural,
                &key.name,
                &format!(
                    "unable to create new content in namespace {} because it is being terminated",
                    key.namespace
                ),
            );
            error.body["details"]["causes"] = json!([{"reason": "NamespaceTerminating",
                "message": format!("namespace {} is being terminated", key.namespace),
                "field": "metadata.namespace"}]);
            return Err(error);
        }
        Ok(())
    }

    /// The escalation checks of RBAC objects (`pkg/registry/rbac/escalation_check.go`):
    /// a role needs `escalate` or every permission it grants; a binding needs `bind` on
    /// its role or every permission of that role.
    fn check_escalation(
        &mut self,
        info: &KindInfo,
        key: &ObjKey,
        config: &Value,
    ) -> Result<(), ApiError> {
        const RBAC: &str = "rbac.authorization.k8s.io";
        if info.group != RBAC || self.rules.is_none() {
            return Ok(());
        }
        let (verb, resource, name, wanted) = match info.kind.as_str() {
            "Role" | "ClusterRole" => (
                "escalate",
                info.plural.clone(),
                key.name.clone(),
                Rule::of_role(config),
            ),
            "RoleBinding" | "ClusterRoleBinding" => {
                let role_kind = config["roleRef"]["kind"].as_str().unwrap_or_default();
                let role_name = config["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let (plural, namespace) = if role_kind == "ClusterRole" {
                    ("clusterroles", String::new())
                } else {
                    ("roles", key.namespace.clone())
                };
                let role = self.objects.get(&ObjKey {
                    group: RBAC.into(),
                    plural: plural.into(),
                    namespace,
                    name: role_name.clone(),
                });
                // A binding to a role that does not exist grants nothing yet, but the
                // rule resolver cannot confirm it either: it needs `bind`.
                let wanted = role.map(|r| Rule::of_role(&r.object)).unwrap_or_else(|| {
                    vec![Rule {
                        api_groups: vec!["*".into()],
                        resources: vec!["*".into()],
                        verbs: vec!["*".into()],
                        resource_names: Vec::new(),
                    }]
                });
                ("bind", plural.to_string(), role_name, wanted)
            }
            _ => return Ok(()),
        };
        let attributes = Attributes {
            verb: verb.into(),
            group: RBAC.into(),
            resource,
            name,
            namespace: key.namespace.clone(),
        };
        let held = self.rules.clone().unwrap_or_default();
        let rule = rbac::allows(&held, &attributes);
        self.checks.push(Check {
            user: self.user.clone(),
            attributes,
            rule,
        });
        if rule.is_some() {
            return Ok(());
        }
        let missing = rbac::missing(&held, &wanted);
        if missing.is_empty() {
            return Ok(());
        }
        // `pkg/registry/rbac/validation/rule.go`, `ConfirmNoEscalation`.
        Err(status::forbidden(
            &info.group,
            &info.plural,
            &key.name,
            &format!(
                "user {:?} (groups=[\"system:serviceaccounts\" \"system:serviceaccounts:flotilla-system\" \"system:authenticated\"]) \
                 is attempting to grant RBAC permissions not currently held:\n{}",
                self.user,
                missing.join("\n")
            ),
        ))
    }

    /// Validating and mutating admission webhooks whose Service is missing fail the
    /// objects their rules match with a 500, unless `failurePolicy: Ignore`
    /// (`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/errors/statuserror.go`:
    /// "failed calling webhook"). Webhook configurations themselves are never sent to
    /// webhooks.
    fn call_webhooks(&self, info: &KindInfo, operation: &str) -> Result<(), ApiError> {
        if info.group == "admissionregistration.k8s.io" {
            return Ok(());
        }
        let any = |list: &Value, wanted: &str| {
            list.as_array()
                .into_iter()
                .flatten()
                .any(|v| v.as_str() == Some("*") || v.as_str() == Some(wanted))
        };
        for (config_key, stored) in &self.objects {
            if config_key.group != "admissionregistration.k8s.io" {
                continue;
            }
            for webhook in stored.object["webhooks"].as_array().into_iter().flatten() {
                if webhook["failurePolicy"].as_str() == Some("Ignore") {
                    continue;
                }
                let matched = webhook["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|rule| {
                        any(&rule["operations"], operation)
                            && any(&rule["apiGroups"], &info.group)
                            && any(&rule["resources"], &info.plural)
                    });
                let service = &webhook["clientConfig"]["service"];
                let (Some(namespace), Some(name)) =
                    (service["namespace"].as_str(), service["name"].as_str())
                else {
                    continue;
                };
                let present = self.objects.contains_key(&ObjKey {
                    group: String::new(),
                    plural: "services".into(),
                    namespace: namespace.into(),
                    name: name.into(),
                });
                if matched && !present {
                    let path = service["path"].as_str().unwrap_or("/");
                    let port = service["port"].as_i64().unwrap_or(443);
                    return Err(status::internal(&format!(
                        "failed calling webhook {:?}: failed to call webhook: Post \"https://{name}.{namespace}.svc:{port}{path}?timeout=10s\": service {name:?} not found",
                        webhook["name"].as_str().unwrap_or_default()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Deletion (`registry/generic/registry/store.go`, `Delete`, and the Namespace
    /// storage of `pkg/registry/core/namespace/storage/storage.go`).
    fn delete(
        &mut self,
        info: &KindInfo,
        key: &ObjKey,
        body: &[u8],
    ) -> Result<(u16, Value), ApiError> {
        let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        if info.group.is_empty()
            && info.plural == "namespaces"
            && IMMORTAL_NAMESPACES.contains(&key.name.as_str())
        {
            return Err(status::forbidden(
                "",
                "namespaces",
                &key.name,
                "this namespace may not be deleted",
            ));
        }
        let version = self.version();
        let Some(stored) = self.objects.get_mut(key) else {
            return Err(status::not_found(&info.group, &info.plural, &key.name));
        };
        // Storage preconditions (`staging/src/k8s.io/apiserver/pkg/storage/interfaces.go`,
        // `Preconditions.Check`), answered as conflicts.
        let meta = &stored.object["metadata"];
        if let Some(uid) = options["preconditions"]["uid"].as_str()
            && Some(uid) != meta["uid"].as_str()
        {
            return Err(status::conflict(
                &info.group,
                &info.plural,
                &key.name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = options["preconditions"]["resourceVersion"].as_str()
            && Some(rv) != meta["resourceVersion"].as_str()
        {
            return Err(status::conflict(
                &info.group,
                &info.plural,
                &key.name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta["resourceVersion"].as_str().unwrap_or_default()
                ),
            ));
        }
        let being_deleted = meta.get("deletionTimestamp").is_some();
        let uid = meta["uid"].as_str().unwrap_or_default().to_string();
        if info.group.is_empty() && info.plural == "namespaces" {
            if !being_deleted {
                stored.object["metadata"]["deletionTimestamp"] = json!(TIMESTAMP);
                stored.object["status"]["phase"] = json!("Terminating");
                stored.object["metadata"]["resourceVersion"] = json!(version);
                return Ok((200, stored.render()));
            }
            if stored.object["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
            {
                return Err(status::conflict(
                    "",
                    "namespaces",
                    &key.name,
                    "The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system.",
                ));
            }
        }
        if info.kind == "CustomResourceDefinition" {
            // The CRD finalizer deletes every custom resource of the definition, then
            // the definition (`apiextensions-apiserver/pkg/controller/finalizer/crd_finalizer.go`);
            // the fake does it at once.
            let group = stored.object["spec"]["group"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let plural = stored.object["spec"]["names"]["plural"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            stored.object["metadata"]["deletionTimestamp"] = json!(TIMESTAMP);
            let rendered = stored.render();
            self.objects
                .retain(|k, _| !(k.group == group && k.plural == plural));
            self.objects.remove(key);
            return Ok((200, rendered));
        }
        if stored.object["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
        {
            if !being_deleted {
                stored.object["metadata"]["deletionTimestamp"] = json!(TIMESTAMP);
                stored.object["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                stored.object["metadata"]["resourceVersion"] = json!(version);
            }
            return Ok((200, stored.render()));
        }
        self.objects.remove(key);
        Ok((
            200,
            status::deleted(&info.group, &info.plural, &key.name, &uid),
        ))
    }
}

fn apply_conflict(
    owners: &BTreeMap<String, Owner>,
    conflicts: &[(String, store::FieldPath)],
) -> ApiError {
    // `printManager`: an Update manager is printed with the apiVersion it used.
    let print = |manager: &str| match owners.get(manager) {
        Some(owner) if owner.operation == Operation::Update => {
            format!("{manager:?} using {}", owner.api_version)
        }
        _ => format!("{manager:?}"),
    };
    let message = if conflicts.len() == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            print(&conflicts[0].0),
            store::print_path(&conflicts[0].1)
        )
    } else {
        let mut by_manager: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (manager, path) in conflicts {
            by_manager
                .entry(manager)
                .or_default()
                .push(store::print_path(path));
        }
        let mut lines = Vec::new();
        for (manager, paths) in by_manager {
            lines.push(format!("conflicts with {}:", print(manager)));
            lines.extend(paths.into_iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes = conflicts
        .iter()
        .map(|(manager, path)| {
            (
                store::print_path(path),
                format!("conflict with {}", print(manager)),
            )
        })
        .collect();
    status::apply_conflict(message, causes)
}

/// The applied configuration without what the server sets or the main resource resets.
fn without_server_fields(config: &Value, has_status: bool) -> Value {
    let mut object = config.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in store::SYSTEM_METADATA {
            if !matches!(*field, "name" | "namespace") {
                metadata.remove(*field);
            }
        }
    }
    if has_status && let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    object
}

/// What each kind's PrepareForCreate sets (`pkg/registry/core/namespace/strategy.go`:
/// phase Active and the `kubernetes` finalizer; `pkg/registry/core/service/strategy.go`:
/// an empty load-balancer status).
fn prepare_for_create(info: &KindInfo, object: &mut Value) {
    match (info.group.as_str(), info.kind.as_str()) {
        ("", "Namespace") => {
            object["spec"]["finalizers"] = json!(["kubernetes"]);
            object["status"] = json!({"phase": "Active"});
        }
        ("", "Service") => object["status"] = json!({"loadBalancer": {}}),
        _ => {}
    }
}

/// The defaults flotilla's health rules read (`pkg/apis/apps/v1/defaults.go`): one
/// replica, RollingUpdate strategies, a StatefulSet partition of 0.
fn defaults(info: &KindInfo, object: &mut Value) {
    if info.group != "apps" {
        return;
    }
    let spec = &mut object["spec"];
    if !spec.is_object() {
        return;
    }
    if matches!(info.kind.as_str(), "Deployment" | "StatefulSet") && spec.get("replicas").is_none()
    {
        spec["replicas"] = json!(1);
    }
    if info.kind == "StatefulSet" {
        if spec.get("updateStrategy").is_none() {
            spec["updateStrategy"] = json!({"type": "RollingUpdate"});
        }
        if spec["updateStrategy"]["type"] == "RollingUpdate"
            && spec["updateStrategy"].get("rollingUpdate").is_none()
        {
            spec["updateStrategy"]["rollingUpdate"] = json!({"partition": 0});
        }
    }
    if info.kind == "DaemonSet" && spec.get("updateStrategy").is_none() {
        spec["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}});
    }
}

/// Fields an update cannot change: a Job's pod template (`ValidateJobUpdate` in
/// `pkg/apis/batch/validation`; the mutable scheduling directives of a suspended
/// Job are not modelled).
fn immutable_fields(
    info: &KindInfo,
    key: &ObjKey,
    existing: &Value,
    updated: &Value,
) -> Result<(), ApiError> {
    if info.group == "batch" && info.kind == "Job" {
        let (before, after) = (&existing["spec"]["template"], &updated["spec"]["template"]);
        if before != after {
            return Err(status::invalid(
                &info.group,
                &info.kind,
                &key.name,
                &[(
                    "spec.template".into(),
                    format!("Invalid value: core.PodTemplateSpec{{{after}}}: field is immutable"),
                )],
            ));
        }
    }
    Ok(())
}

fn generation_changes(rule: Generation, old: &Value, new: &Value) -> bool {
    let without = |object: &Value, keys: &[&str]| {
        let mut object = object.clone();
        if let Some(map) = object.as_object_mut() {
            for key in keys {
                map.remove(*key);
            }
        }
        object
    };
    match rule {
        Generation::Untracked => false,
        Generation::Spec => old.get("spec") != new.get("spec"),
        Generation::SpecAndAnnotations => {
            old.get("spec") != new.get("spec")
                || old["metadata"].get("annotations") != new["metadata"].get("annotations")
        }
        Generation::AllButMetadataAndStatus => {
            without(old, &["metadata", "status"]) != without(new, &["metadata", "status"])
        }
        Generation::AllButMetadata => without(old, &["metadata"]) != without(new, &["metadata"]),
    }
}

/// Validation the strategies share (`ValidateObjectMeta`): label values.
fn validate(info: &KindInfo, key: &ObjKey, object: &Value) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    for value in object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flat_map(|labels| labels.values())
    {
        let text = value.as_str().unwrap_or_default();
        if let Some(problem) = store::label_value_error(text) {
            errors.push((
                "metadata.labels".to_string(),
                format!("Invalid value: {text:?}: {problem}"),
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(status::invalid(&info.group, &info.kind, &key.name, &errors))
    }
}

/// Problems that make the typed patch object impossible to build: a field the schema
/// does not declare, duplicate keys in a list merged by key
/// (`staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/structuredmerge.go`;
/// the API server answers them with a 500, kubernetes/kubernetes#122480).
fn typed_patch_error(info: &KindInfo, key: &ObjKey, config: &Value) -> Option<String> {
    let mut errors = Vec::new();
    if let (Some(fields), Some(map)) = (info.fields, config.as_object()) {
        for field in map.keys() {
            if !matches!(field.as_str(), "apiVersion" | "kind" | "metadata")
                && !fields.contains(&field.as_str())
            {
                errors.push(format!(".{field}: field not declared in schema"));
            }
        }
    }
    let containers = config
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array);
    let mut seen_containers = Vec::new();
    for container in containers.into_iter().flatten() {
        let name = container["name"].as_str().unwrap_or_default();
        if seen_containers.contains(&name) {
            errors.push(format!(
                ".spec.template.spec.containers: duplicate entries for key [name={name:?}]"
            ));
        }
        seen_containers.push(name);
        let mut seen_env = Vec::new();
        for variable in container["env"].as_array().into_iter().flatten() {
            let variable = variable["name"].as_str().unwrap_or_default();
            if seen_env.contains(&variable) {
                errors.push(format!(
                    ".spec.template.spec.containers[name={name:?}].env: duplicate entries for key [name={variable:?}]"
                ));
            }
            seen_env.push(variable);
        }
    }
    if errors.is_empty() {
        return None;
    }
    let gvk = format!("{}/{}, Kind={}", info.group, info.version, info.kind);
    let text = if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("errors:\n  {}", errors.join("\n  "))
    };
    Some(format!(
        "failed to create typed patch object ({}/{}; {gvk}): {text}",
        key.namespace, key.name
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{
        Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions,
    };
    use kube::core::GroupVersionKind;

    fn api(
        fake: &FakeApiServer,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        ns: Option<&str>,
    ) -> Api<DynamicObject> {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        match ns {
            Some(ns) => Api::namespaced_with(fake.client(), ns, &resource),
            None => Api::all_with(fake.client(), &resource),
        }
    }

    fn code(err: kube::Error) -> (u16, String) {
        match err {
            kube::Error::Api(response) => (response.code, response.message),
            other => panic!("not an API error: {other}"),
        }
    }

    fn last_code(fake: &FakeApiServer) -> u16 {
        fake.exchanges().last().map(|e| e.code).unwrap_or_default()
    }

    #[tokio::test]
    async fn apply_creates_with_201_then_updates_with_200_bumping_generation_and_keeping_status() {
        let fake = FakeApiServer::new();
        let deployments = api(
            &fake,
            "apps",
            "v1",
            "Deployment",
            "deployments",
            Some("default"),
        );
        let deployment = |replicas: i64| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"}, "spec": {"replicas": replicas}})
        };
        let apply = PatchParams::apply("flotilla");
        let created = deployments
            .patch("web", &apply, &Patch::Apply(deployment(2)))
            .await
            .expect("created");
        assert_eq!(last_code(&fake), 201);
        assert_eq!(created.metadata.generation, Some(1));
        assert!(
            created.data.get("status").is_none(),
            "no status on a new object"
        );
        fake.set_status(
            "apps/v1",
            "Deployment",
            "default",
            "web",
            json!({"observedGeneration": 1}),
        );
        let before = deployments.get("web").await.expect("reads");
        let same = deployments
            .patch("web", &apply, &Patch::Apply(deployment(2)))
            .await
            .expect("applied");
        assert_eq!(last_code(&fake), 200);
        // An apply that changes nothing writes nothing.
        assert_eq!(same.metadata.generation, Some(1));
        assert_eq!(
            same.metadata.resource_version,
            before.metadata.resource_version
        );
        let changed = deployments
            .patch("web", &apply, &Patch::Apply(deployment(3)))
            .await
            .expect("applied");
        assert_eq!(changed.metadata.generation, Some(2));
        assert_eq!(changed.data["status"], json!({"observedGeneration": 1}));
    }

    #[tokio::test]
    async fn conflicts_stale_versions_and_managed_fields_are_refused_as_the_api_server_does() {
        let fake = FakeApiServer::new();
        fake.insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"},
                           "data": {"k": "theirs"}}), "kubectl");
        let config_maps = api(&fake, "", "v1", "ConfigMap", "configmaps", Some("default"));
        let mine = |extra: Value| {
            let mut object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "mine"}});
            if let (Some(object), Some(extra)) =
                (object["metadata"].as_object_mut(), extra.as_object())
            {
                object.extend(extra.clone());
            }
            object
        };
        let err = config_maps
            .patch(
                "c",
                &PatchParams::apply("flotilla"),
                &Patch::Apply(mine(json!({}))),
            )
            .await
            .expect_err("conflict");
        assert_eq!(
            code(err),
            (
                409,
                "Apply failed with 1 conflict: conflict with \"kubectl\" using v1: .data.k".into()
            )
        );
        let err = config_maps
            .patch(
                "c",
                &PatchParams::apply("flotilla"),
                &Patch::Apply(mine(json!({"managedFields": []}))),
            )
            .await
            .expect_err("refused");
        assert_eq!(
            code(err),
            (400, "metadata.managedFields must be nil".into())
        );
        let forced = config_maps
            .patch(
                "c",
                &PatchParams::apply("flotilla").force(),
                &Patch::Apply(mine(json!({}))),
            )
            .await
            .expect("forced");
        assert_eq!(forced.data["data"]["k"], "mine");
        let err = config_maps
            .patch(
                "c",
                &PatchParams::apply("flotilla"),
                &Patch::Apply(mine(json!({"resourceVersion": "1"}))),
            )
            .await
            .expect_err("stale");
        assert_eq!(code(err).0, 409);
    }

    #[tokio::test]
    async fn deletion_honours_preconditions_finalizers_and_the_namespace_lifecycle() {
        let fake = FakeApiServer::new();
        let namespaces = api(&fake, "", "v1", "Namespace", "namespaces", None);
        let err = namespaces
            .delete("kube-system", &DeleteParams::default())
            .await
            .expect_err("immortal");
        assert_eq!(
            code(err),
            (
                403,
                "namespaces \"kube-system\" is forbidden: this namespace may not be deleted".into()
            )
        );

        fake.insert(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
            "kubectl",
        );
        let config_maps = api(&fake, "", "v1", "ConfigMap", "configmaps", Some("team"));
        fake.insert(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team",
                           "finalizers": ["example.com/keep"]}}), "kubectl");
        let wrong = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some("nope".into()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let err = config_maps
            .delete("c", &wrong)
            .await
            .expect_err("precondition");
        assert!(code(err).1.starts_with("Operation cannot be fulfilled on configmaps \"c\": Precondition failed: UID in precondition: nope"));
        config_maps
            .delete("c", &DeleteParams::default())
            .await
            .expect("deleting");
        let held = config_maps.get("c").await.expect("still there");
        assert!(held.metadata.deletion_timestamp.is_some());
        fake.remove_finalizers("v1", "ConfigMap", "team", "c");
        assert_eq!(code(config_maps.get("c").await.expect_err("gone")).0, 404);

        namespaces
            .delete("team", &DeleteParams::default())
            .await
            .expect("terminating");
        let err = config_maps
            .patch(
                "d",
                &PatchParams::apply("flotilla"),
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}}),
                ),
            )
            .await
            .expect_err("no new content");
        assert_eq!(code(err), (403, "configmaps \"d\" is forbidden: unable to create new content in namespace team because it is being terminated".into()));
        let err = namespaces
            .delete("team", &DeleteParams::default())
            .await
            .expect_err("already terminating");
        assert_eq!(code(err).0, 409);
        fake.finish_namespace_termination("team");
        assert_eq!(code(namespaces.get("team").await.expect_err("gone")).0, 404);
    }

    #[tokio::test]
    async fn rules_decide_per_verb_and_an_apply_that_creates_needs_create() {
        let fake = FakeApiServer::new().with_rules(
            &json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]),
        );
        let config_maps = api(&fake, "", "v1", "ConfigMap", "configmaps", Some("default"));
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        let err = config_maps
            .patch("c", &PatchParams::apply("flotilla"), &Patch::Apply(object))
            .await
            .expect_err("create refused");
        assert_eq!(
            code(err).1,
            format!(
                "configmaps \"c\" is forbidden: User \"{DEFAULT_USER}\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""
            )
        );
        let err = config_maps
            .delete("c", &DeleteParams::default())
            .await
            .expect_err("delete refused");
        assert_eq!(code(err).0, 403);
        let verbs: Vec<(String, bool)> = fake
            .checks()
            .iter()
            .map(|c| (c.attributes.verb.clone(), c.rule.is_some()))
            .collect();
        assert_eq!(
            verbs,
            [
                ("patch".into(), true),
                ("create".into(), false),
                ("delete".into(), false)
            ]
        );
    }

    #[tokio::test]
    async fn an_impersonated_service_account_holds_what_its_bindings_grant_where_they_grant_it() {
        let caller_rules = json!([
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "create", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}
        ]);
        let fake = FakeApiServer::new().with_rules(&caller_rules);
        for namespace in ["shop", "other"] {
            fake.insert(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
                "kubectl",
            );
        }
        fake.insert(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "tenant"},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}]}),
            "kubectl",
        );
        fake.insert(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "tenant", "namespace": "shop"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tenant"},
                   "subjects": [{"kind": "ServiceAccount", "name": "team", "namespace": "shop"}]}),
            "kubectl",
        );
        let user = "system:serviceaccount:shop:team";
        let config_map = |ns: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}});
        let as_team = |ns: &str| {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("", "v1", "ConfigMap"),
                "configmaps",
            );
            Api::<DynamicObject>::namespaced_with(fake.impersonating_client(user), ns, &resource)
        };
        as_team("shop")
            .patch(
                "c",
                &PatchParams::apply("flotilla"),
                &Patch::Apply(config_map("shop")),
            )
            .await
            .expect("the RoleBinding in shop grants it");
        let err = as_team("shop")
            .delete("c", &DeleteParams::default())
            .await
            .expect_err("the role does not grant delete");
        assert_eq!(
            code(err),
            (
                403,
                format!(
                    "configmaps \"c\" is forbidden: User \"{user}\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"shop\""
                )
            )
        );
        let err = as_team("other")
            .patch(
                "c",
                &PatchParams::apply("flotilla"),
                &Patch::Apply(config_map("other")),
            )
            .await
            .expect_err("no binding in other");
        assert_eq!(code(err).0, 403);
        assert!(fake.get("v1", "ConfigMap", "other", "c").is_none());
        // The caller's own rules are left as they were: it may still delete.
        api(&fake, "", "v1", "ConfigMap", "configmaps", Some("shop"))
            .delete("c", &DeleteParams::default())
            .await
            .expect("the caller holds delete");
        let checks: Vec<(String, String, bool)> = fake
            .checks()
            .iter()
            .map(|c| (c.user.clone(), c.attributes.verb.clone(), c.rule.is_some()))
            .collect();
        let caller = DEFAULT_USER.to_string();
        let team = user.to_string();
        assert_eq!(
            checks,
            [
                (caller.clone(), "impersonate".into(), true),
                (team.clone(), "patch".into(), true),
                (team.clone(), "create".into(), true),
                (caller.clone(), "impersonate".into(), true),
                (team.clone(), "delete".into(), false),
                (caller.clone(), "impersonate".into(), true),
                (team.clone(), "patch".into(), false),
                (caller.clone(), "delete".into(), true),
            ]
        );
    }

    #[tokio::test]
    async fn a_caller_without_impersonate_cannot_act_as_a_service_account() {
        let fake = FakeApiServer::new().with_rules(
            &json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "create", "patch"]}]),
        );
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "ConfigMap"),
            "configmaps",
        );
        let config_maps = Api::<DynamicObject>::namespaced_with(
            fake.impersonating_client("system:serviceaccount:default:team"),
            "default",
            &resource,
        );
        let err = config_maps.get("c").await.expect_err("refused");
        assert_eq!(
            code(err),
            (
                403,
                format!(
                    "serviceaccounts \"team\" is forbidden: User \"{DEFAULT_USER}\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"default\""
                )
            )
        );
    }
}
