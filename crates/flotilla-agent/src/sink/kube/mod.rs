//! The `kube` sink: server-side apply through the Kubernetes API with kube-rs. This is
//! the only module that knows kube-rs.
//!
//! One apply:
//! 1. reads the **ledger** (the inventory kept in the cluster, [`ledger`]) once, and
//!    records in it what the apply is about to touch;
//! 2. applies the bundle phase by phase ([`phases`]: a phase waits until the one before
//!    is healthy), and within a phase CustomResourceDefinitions, waiting until each is
//!    Established; then Namespaces; then everything else; admission webhooks and
//!    APIServices last. Every object is sent without the metadata the server sets,
//!    labelled with the cluster, annotated with the bundle digest, with field manager
//!    `flotilla` (forcing conflicts only when asked). The answer says whether flotilla
//!    created the object (201) or found it (200), and how healthy it is ([`health`]);
//! 3. only when every object was applied (healthy or not), deletes what the previous
//!    inventory held and the bundle does not, as [`prune`] decides: phase by phase in
//!    reverse, by the phases of the bundle last applied completely, and each phase in
//!    reverse apply order ([`phases`]);
//! 4. records the outcome in the ledger.
//!
//! A Helm release's hooks run around its resources in its phase, only when the release
//! is installed or upgraded, and around its prune when it leaves the bundle ([`hooks`]).
//!
//! An error the API server gives for one object (invalid, forbidden, a conflict, a
//! 500 from a webhook or a typed patch) fails that object alone. No answer, 401, 429,
//! 502, 503, 504, or five 500s in a row stop the apply, and the agent tries again
//! later; server-side apply is idempotent, so the next attempt resumes. A workload that
//! is unhealthy is reported `failed`, but does not stop the rest of its phase from being
//! applied; it holds the later phases back.

mod discovery;
mod drift;
mod failure;
mod health;
mod hooks;
mod ledger;
mod phases;
mod prune;
#[cfg(test)]
mod wire_tests;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, GetParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;
use tokio::time::Instant;

use super::{
    ApplyOutcome, CLUSTER_LABEL, Sink, StopSignal, apply_order, apply_rank, tenancy_first_rank,
    with_flotilla_metadata,
};
use crate::cache::InventoryEntry;
use discovery::{Discovery, Found};
use failure::{ApiStatus, Failure, SERVER_ERRORS_BEFORE_STOP};
use flotilla_core::bundle::{
    Bundle, Digest, Resource, ResourceKey, api_group, tenant_service_account,
};
use flotilla_core::status::{ResourceState, ResourceStatus};
pub use health::{has_health_rule, health};
use ledger::{Ledger, SaveError};

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "flotilla";

/// Namespaces Kubernetes itself needs (the API server refuses to delete the first
/// three, and recreates `kube-node-lease`); flotilla never prunes them.
pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

/// The kube sink's settings.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Take over fields another field manager owns (`--force-conflicts`).
    pub force_conflicts: bool,
    /// Prune Namespaces and CustomResourceDefinitions without the
    /// `flotilla.dev/prune: allow` annotation (`--prune-namespaces-and-crds`).
    pub prune_namespaces_and_crds: bool,
    /// The longest wait for one answer of the API server (`--kube-timeout`).
    pub request_timeout: Duration,
    /// How long a CRD may take to become Established.
    pub crd_timeout: Duration,
    /// How often a CRD is looked at while waiting, and the workloads of a phase.
    pub crd_poll: Duration,
    /// How long the workloads of an apply phase may take to become healthy before the
    /// later phases are held back (`--phase-timeout`).
    pub phase_timeout: Duration,
    /// Where the ledger is kept; the client's namespace when `None` (in a cluster, the
    /// agent's own namespace).
    pub inventory_namespace: Option<String>,
    /// Apply a tenant's namespaced resources as the tenant's ServiceAccount
    /// (`--impersonate-tenants`, see [`Users`]).
    pub impersonate_tenants: bool,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            force_conflicts: false,
            prune_namespaces_and_crds: false,
            request_timeout: Duration::from_secs(30),
            crd_timeout: Duration::from_secs(60),
            crd_poll: Duration::from_secs(1),
            phase_timeout: Duration::from_secs(600),
            inventory_namespace: None,
            impersonate_tenants: false,
        }
    }
}

/// Why the sink could not connect to the Kubernetes API.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "cannot find a Kubernetes API to apply to (in-cluster service account or kubeconfig): {0}; \
         run the agent in the cluster, or set KUBECONFIG"
    )]
    Config(#[source] kube::config::InferConfigError),
    #[error("cannot make a client for the Kubernetes API: {0}")]
    Client(#[source] kube::Error),
}

/// Why the cluster's inventory (the ledger ConfigMap) could not be read or
/// written: nothing of the bundle is applied then, and the next apply tries again.
#[derive(Debug, thiserror::Error)]
enum InventoryError {
    #[error("cannot read the cluster's inventory (ConfigMap {namespace}/{name}): {described}")]
    Read {
        namespace: String,
        name: String,
        /// What the API server said, and what to do about it.
        described: String,
    },
    /// The ledger's own message says which ConfigMap and why (see
    /// [`SaveError::Failed`]).
    #[error("{0}")]
    Write(String),
    #[error("the cluster's inventory is not open")]
    NotOpen,
}

/// Why a CRD of the bundle was not seen Established: its custom resources are not
/// applied then.
#[derive(Debug, thiserror::Error)]
enum EstablishError {
    #[error("cannot read it back to see it established: {0}")]
    Unreadable(String),
    #[error("not Established after {}s; its custom resources cannot be applied", .0.as_secs())]
    NotEstablished(Duration),
    /// The agent was asked to stop while it waited; what the pause said.
    #[error("{0}")]
    Stopped(String),
}

/// Requests to the API server, each with its own timeout, abandoned when the agent
/// is asked to stop.
#[derive(Clone)]
pub(crate) struct Api {
    client: kube::Client,
    timeout: Duration,
    stop: StopSignal,
    /// The user every request impersonates (`Impersonate-User`), if any.
    user: Option<Arc<str>>,
}

impl Api {
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Runs `request` with the timeout and the stop signal; the outer error says it
    /// got no answer.
    pub async fn guard<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, Failure> {
        tokio::select! {
            biased;
            () = self.stop.raised() => Err(Failure::Stopped),
            answer = tokio::time::timeout(self.timeout, request) => {
                answer.map_err(|_| Failure::Timeout(self.timeout))
            }
        }
    }

    /// Sends one request; an answer of 400 or more is a failure.
    async fn send(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<(u16, Value), Failure> {
        let mut request = request.map_err(|err| Failure::Transport(err.to_string()))?;
        if let Some(user) = &self.user {
            let value = http::HeaderValue::from_str(user)
                .map_err(|err| Failure::Transport(format!("cannot impersonate {user:?}: {err}")))?;
            request.headers_mut().insert(IMPERSONATE_USER, value);
        }
        let client = self.client.clone();
        let exchange = async move {
            let response = client.send(request.map(kube::client::Body::from)).await?;
            let code = response.status().as_u16();
            let body = response.into_body().collect_bytes().await?;
            Ok((code, body))
        };
        let (code, body) = self.guard(exchange).await?.map_err(Failure::from_kube)?;
        if code >= 400 {
            return Err(Failure::Api(ApiStatus::from_body(code, &body)));
        }
        Ok((code, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    fn request(resource: &ApiResource, namespace: Option<&str>) -> kube::core::Request {
        kube::core::Request::new(<DynamicObject as kube::Resource>::url_path(
            resource, namespace,
        ))
    }

    pub async fn get(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, Failure> {
        let request = Api::request(resource, namespace).get(name, &GetParams::default());
        self.send(request).await.map(|(_, body)| body)
    }

    /// Server-side apply; answers the status code (201 created, 200 updated) and the
    /// object.
    pub async fn apply(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
        object: &Value,
        force: bool,
    ) -> Result<(u16, Value), Failure> {
        let mut params = PatchParams::apply(FIELD_MANAGER);
        if force {
            params = params.force();
        }
        let request = Api::request(resource, namespace).patch(name, &params, &Patch::Apply(object));
        self.send(request).await
    }

    /// Deletes in the background, on condition that the object still has this uid and
    /// resourceVersion (so an object made again meanwhile is not deleted).
    async fn delete(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &str,
        uid: Option<String>,
        resource_version: Option<String>,
    ) -> Result<Value, Failure> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid,
                resource_version,
            }),
            ..DeleteParams::default()
        };
        let request = Api::request(resource, namespace).delete(name, &params);
        self.send(request).await.map(|(_, body)| body)
    }

    /// The same, deaf to the stop signal: for the last write of an apply, which
    /// records what it learnt.
    fn unstoppable(&self) -> Api {
        Api {
            stop: StopSignal::default(),
            ..self.clone()
        }
    }

    /// The same, impersonating `user` (the agent itself when `None`).
    fn acting_as(&self, user: Option<&str>) -> Api {
        Api {
            user: user.map(Arc::from),
            ..self.clone()
        }
    }
}

/// The header that makes the API server treat a request as another user's.
const IMPERSONATE_USER: &str = "impersonate-user";

/// Who each resource of a bundle is applied as. With `--impersonate-tenants`, a
/// tenant's namespaced resource is applied as the tenant's ServiceAccount in its
/// namespace, `system:serviceaccount:<namespace>:flotilla-tenant-<tenant>`, which
/// the bundle creates there (bound to the ClusterRole `flotilla-tenant`), so that
/// the API server itself keeps the tenant within what that role allows. A tenant's
/// cluster-scoped resources (its `Namespace`s aside) are applied as its
/// ServiceAccount in the first namespace the bundle gives it one in, which the
/// bundle's ClusterRoleBinding `flotilla-tenant-<tenant>` binds to the ClusterRole
/// of the same name on the kinds of `spec.clusterScoped`. A bundle without that
/// ServiceAccount (a hub older than this agent) still names one, in the first of the
/// tenant's namespaces: without a binding, the API server refuses it. Everything else
/// is applied as the agent: the platform's resources, and the tenant's `Namespace`
/// objects (the platform sets their Pod Security level).
#[derive(Clone, Debug, Default)]
pub(crate) struct Users(Arc<HashMap<ResourceKey, Arc<str>>>);

impl Users {
    pub(crate) fn of(bundle: &Bundle, impersonate: bool) -> Users {
        let Some(meta) = bundle.meta.as_deref().filter(|_| impersonate) else {
            return Users::default();
        };
        let tenant_of: HashMap<&str, &str> = meta
            .tenants
            .iter()
            .flat_map(|(tenant, mark)| {
                mark.workloads
                    .iter()
                    .map(move |w| (w.as_str(), tenant.as_str()))
            })
            .collect();
        let cluster_namespace = |tenant: &str| -> String {
            crate::tenancy::cluster_binding_namespace(bundle, tenant)
                .or_else(|| {
                    meta.tenants
                        .get(tenant)
                        .and_then(|mark| mark.namespaces.first())
                        .map(String::as_str)
                })
                .unwrap_or(tenant)
                .to_string()
        };
        let mut cluster_namespaces: HashMap<&str, String> = HashMap::new();
        let users = bundle
            .resources
            .iter()
            .zip(&meta.workloads)
            .filter(|(resource, _)| {
                let key = &resource.key;
                !(key.namespace().is_empty() && key.group().is_empty() && key.kind() == "Namespace")
            })
            .filter_map(|(resource, workload)| {
                let tenant: &str = tenant_of.get(workload.as_str())?;
                let namespace = match resource.key.namespace() {
                    "" => cluster_namespaces
                        .entry(tenant)
                        .or_insert_with(|| cluster_namespace(tenant))
                        .clone(),
                    namespace => namespace.to_string(),
                };
                let user = format!(
                    "system:serviceaccount:{namespace}:{}",
                    tenant_service_account(tenant)
                );
                Some(((*resource.key).clone(), Arc::from(user)))
            })
            .collect();
        Users(Arc::new(users))
    }

    pub(crate) fn user(&self, key: &ResourceKey) -> Option<&str> {
        self.0.get(key).map(|user| &**user)
    }
}

/// Applies bundles to a Kubernetes cluster.
pub struct KubeSink {
    api: Api,
    options: KubeOptions,
    ledger_namespace: String,
    /// The ledger, once read; and as it was last written.
    ledger: Option<Ledger>,
    saved: Option<Ledger>,
    /// Why the ledger as `saved` is not in the cluster (it outgrew its ConfigMap),
    /// for the reports while it stays so.
    outgrown: Option<String>,
    /// What the state folder says flotilla applied before (see [`Sink::recall`]).
    applied_before: Vec<InventoryEntry>,
    /// The server's answers to the last applies, for drift checks.
    drift: drift::Tracker,
    /// The bundle last applied completely, when it has metadata: prune takes the phase
    /// of what left the bundle, and the delete hooks of a release that left, from it.
    last_applied: Option<Arc<Bundle>>,
    /// The agent's own key ([`Sink::keep_private`]).
    private_key: Option<[u8; 32]>,
}

impl std::fmt::Debug for KubeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSink")
            .field("options", &self.options)
            .field("ledger_namespace", &self.ledger_namespace)
            .finish_non_exhaustive()
    }
}

impl KubeSink {
    /// Connects the way kube-rs finds a cluster: the in-cluster service account, or
    /// the kubeconfig (KUBECONFIG, ~/.kube/config). Every request gets
    /// `options.request_timeout` (not kube-rs's default of 295 s for reads).
    pub async fn connect(options: KubeOptions) -> Result<KubeSink, ConnectError> {
        let mut config = kube::Config::infer().await.map_err(ConnectError::Config)?;
        config.read_timeout = Some(options.request_timeout);
        config.write_timeout = Some(options.request_timeout);
        config.connect_timeout = Some(options.request_timeout.min(Duration::from_secs(10)));
        let client = kube::Client::try_from(config).map_err(ConnectError::Client)?;
        Ok(KubeSink::with_client(client, options))
    }

    pub fn with_client(client: kube::Client, options: KubeOptions) -> KubeSink {
        let ledger_namespace = options
            .inventory_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        KubeSink {
            api: Api {
                client,
                timeout: options.request_timeout,
                stop: StopSignal::default(),
                user: None,
            },
            options,
            ledger_namespace,
            ledger: None,
            saved: None,
            outgrown: None,
            applied_before: Vec::new(),
            private_key: None,
            drift: drift::Tracker::default(),
            last_applied: None,
        }
    }

    /// Reads the ledger the first time (or when the cluster changed).
    async fn open_ledger(&mut self, cluster: &str) -> Result<(), InventoryError> {
        if self.ledger.as_ref().is_some_and(|l| l.cluster == cluster) {
            return Ok(());
        }
        self.outgrown = None;
        match Ledger::load(&self.api, &self.ledger_namespace, cluster).await {
            Ok(Some(ledger)) => {
                self.saved = Some(ledger.clone());
                self.ledger = Some(ledger);
            }
            Ok(None) => {
                // No ledger yet: what the state folder lists was applied by an agent
                // that kept none.
                let mut ledger = Ledger::new(cluster);
                ledger.adopt_inventory(&self.applied_before);
                self.saved = None;
                self.ledger = Some(ledger);
            }
            Err(failure) => {
                return Err(InventoryError::Read {
                    namespace: self.ledger_namespace.clone(),
                    name: ledger::configmap_name(cluster),
                    described: failure.describe("get", "configmaps"),
                });
            }
        }
        Ok(())
    }

    /// Writes the ledger if it changed since it was last written. A ledger too big
    /// for a ConfigMap is not an error of the apply: it is logged, and the state
    /// folder's inventory carries on alone (returned as a note for the report).
    async fn save_ledger(&mut self, api: &Api) -> Result<Option<String>, InventoryError> {
        let Some(ledger) = &self.ledger else {
            return Ok(None);
        };
        if self.saved.as_ref() == Some(ledger) {
            return Ok(self.outgrown.clone());
        }
        match ledger.save(api, &self.ledger_namespace).await {
            Ok(()) => {
                self.saved = Some(ledger.clone());
                self.outgrown = None;
                Ok(None)
            }
            Err(SaveError::TooBig(note)) => {
                // Not sent again (nor serialised) until the ledger changes.
                tracing::error!("{note}");
                self.saved = Some(ledger.clone());
                self.outgrown = Some(note.clone());
                Ok(Some(note))
            }
            Err(SaveError::Failed(message)) => Err(InventoryError::Write(message)),
        }
    }

    /// What to prune: the state folder's list, and what the ledger lists that the
    /// bundle does not hold (the state folder may have been lost).
    fn prune_candidates(&self, bundle: &Bundle, prune: &[InventoryEntry]) -> Vec<InventoryEntry> {
        let mut candidates = prune.to_vec();
        let Some(ledger) = &self.ledger else {
            return candidates;
        };
        let mut known: HashSet<ResourceKey> =
            bundle.resources.iter().map(|r| (*r.key).clone()).collect();
        known.extend(prune.iter().map(|e| e.key().clone()));
        let forgotten: Vec<InventoryEntry> = ledger
            .entries()
            .iter()
            .filter(|e| !known.contains(&e.key()))
            .map(ledger::LedgerEntry::inventory_entry)
            .collect();
        if !forgotten.is_empty() {
            tracing::warn!(
                objects = forgotten.len(),
                inventory = %format!("{}/{}", self.ledger_namespace, ledger::configmap_name(&bundle.cluster)),
                "the cluster's inventory lists objects the state folder does not: was the state folder lost? \
                 Keep it on persistent storage; the objects are pruned as the cluster's inventory says"
            );
            candidates.extend(forgotten);
        }
        candidates
    }

    async fn apply_bundle(&mut self, bundle: &Bundle, prune: &[InventoryEntry]) -> ApplyOutcome {
        if let Err(err) = self.open_ledger(&bundle.cluster).await {
            return nothing_applied(bundle, &err);
        }
        let candidates = self.prune_candidates(bundle, prune);
        let hooks = match &self.ledger {
            Some(ledger) => hooks::Hooks::plan(bundle, ledger, self.private_key.as_ref()),
            None => hooks::Hooks::default(),
        };
        if let Some(ledger) = &mut self.ledger {
            // Hooks are not in the inventory: never pruned, never checked for drift.
            let entries: Vec<InventoryEntry> = bundle
                .resources
                .iter()
                .filter(|r| !hooks.is_hook(&r.key))
                .map(|r| InventoryEntry::of(r))
                .collect();
            ledger.intend(&entries);
        }
        let api = self.api.clone();
        let mut note = match self.save_ledger(&api).await {
            Ok(note) => note,
            Err(err) => return nothing_applied(bundle, &err),
        };
        let Some(mut ledger) = self.ledger.take() else {
            return nothing_applied(bundle, &InventoryError::NotOpen);
        };
        let mut run = Run {
            api: self.api.clone(),
            users: Users::of(bundle, self.options.impersonate_tenants),
            options: self.options.clone(),
            discovery: Discovery::default(),
            stopped: None,
            server_errors: 0,
            answers: Vec::new(),
            ledger_namespace: self.ledger_namespace.clone(),
            ledger_written: Instant::now(),
            ledger_flush: true,
        };
        let (lines, held) = run.apply_in_phases(&mut ledger, bundle, &hooks).await;
        self.drift.record(bundle, std::mem::take(&mut run.answers));
        let apply_errors = lines.iter().filter(|l| l.apply_error).count();
        let stopped_applying = run.stopped.clone();

        let mut pruned = Vec::new();
        let retained;
        let mut prune_held = None;
        if apply_errors == 0 && stopped_applying.is_none() {
            let mut context = prune::Context::new(
                bundle,
                self.options.prune_namespaces_and_crds,
                &self.ledger_namespace,
            );
            // The objects this apply just applied, by uid: an old identity that
            // names one of them is the same object under its new identity.
            context.applied_uids = bundle
                .resources
                .iter()
                .filter_map(|r| ledger.entry(&r.key)?.uid.clone())
                .collect();
            let previous = self.last_applied.clone();
            let outcome = run
                .prune_in_phases(&ledger, bundle, previous.as_deref(), &candidates, &context)
                .await;
            pruned = outcome.lines;
            retained = outcome.retained;
            prune_held = outcome.held;
            note = outcome.note.or(note);
        } else {
            retained = candidates.clone();
        }
        // An apply cut short keeps the cluster's record of every candidate it did
        // not delete, one left in place (adopted, still pending) included: the state
        // folder's inventory still lists it, so it is a candidate again, and its
        // record is what keeps the next prune from taking it for one flotilla made.
        // A complete apply keeps only what it retained, as the inventory does.
        let cut_short = apply_errors > 0
            || stopped_applying.is_some()
            || run.stopped.is_some()
            || prune_held.is_some();
        let known: Vec<InventoryEntry> = if cut_short {
            // Deleted, but not one still being deleted that the prune retained.
            let lingering: HashSet<&ResourceKey> =
                retained.iter().map(InventoryEntry::key).collect();
            let deleted: HashSet<&ResourceKey> = pruned
                .iter()
                .filter(|status| status.state == ResourceState::Pruned)
                .map(ResourceStatus::key)
                .filter(|key| !lingering.contains(key))
                .collect();
            candidates
                .iter()
                .filter(|entry| !deleted.contains(entry.key()))
                .cloned()
                .collect()
        } else {
            retained.clone()
        };
        ledger.settle(bundle, &known);
        self.ledger = Some(ledger);
        let saved = self.save_ledger(&self.api.unstoppable()).await;

        let mut complete = apply_errors == 0 && run.stopped.is_none() && prune_held.is_none();
        let mut message = match (held, prune_held) {
            (Some(held), _) if stopped_applying.is_none() => held,
            (_, Some(prune_held)) if run.stopped.is_none() => prune_held,
            _ => summary(
                bundle.resources.len(),
                &lines,
                &pruned,
                stopped_applying.as_deref(),
                run.stopped.as_deref(),
            ),
        };
        match saved {
            Ok(later) => note = later.or(note),
            Err(problem) => {
                complete = false;
                message = format!("{message}; {problem}");
            }
        }
        if let Some(note) = note {
            message = format!("{message}; {note}");
        }
        if complete {
            self.last_applied = crate::sink::worth_keeping(bundle);
        }
        let mut resources: Vec<ResourceStatus> = lines.into_iter().map(|l| l.status).collect();
        resources.extend(pruned);
        ApplyOutcome {
            resources,
            complete,
            message,
            kept: retained,
        }
    }

    async fn bundle_health(&mut self, bundle: &Bundle) -> Option<Vec<ResourceStatus>> {
        let mut discovery = Discovery::default();
        let mut failures_seen = false;
        let users = Users::of(bundle, self.options.impersonate_tenants);
        let mut statuses = Vec::with_capacity(bundle.resources.len());
        let hooks = bundle.meta.as_deref().map(|meta| {
            meta.hooks
                .iter()
                .filter_map(|h| bundle.resources.get(h.resource))
                .map(|r| &*r.key)
                .collect::<HashSet<&ResourceKey>>()
        });
        for resource in apply_order(bundle) {
            let key = &resource.key;
            if hooks.as_ref().is_some_and(|hooks| hooks.contains(&**key)) {
                // A hook ran (or not) when its release was applied; it is not followed.
                statuses.push(ResourceStatus::new(
                    key,
                    ResourceState::Applied,
                    "a Helm hook",
                ));
                continue;
            }
            if !has_health_rule(key) {
                statuses.push(ResourceStatus::new(key, ResourceState::Applied, ""));
                continue;
            }
            let job = job_run(self.ledger.as_ref(), resource);
            let (state, message) =
                read_health(&self.api, &mut discovery, resource, job, users.user(key))
                    .await
                    .ok()?;
            // A Job seen failed: once its TTL removes it, it is still reported so.
            if job == JobRun::Ran
                && state == ResourceState::Failed
                && let Some(ledger) = &mut self.ledger
            {
                failures_seen |=
                    ledger.record_failure(key, Digest::of(&resource.canonical).as_str());
            }
            statuses.push(ResourceStatus::new(key, state, message));
        }
        if failures_seen && let Err(err) = self.save_ledger(&self.api.unstoppable()).await {
            tracing::warn!("cannot record a failed Job in the cluster's inventory: {err}");
        }
        Some(statuses)
    }
}

/// Reads the health of one resource that has a health rule from the API server. A
/// failure that stops a run (no answer, 401, 429, 502-504, the agent stopping) is an
/// error; any other reads as progressing, with what the server said.
async fn read_health(
    api: &Api,
    discovery: &mut Discovery,
    resource: &Resource,
    job: JobRun,
    user: Option<&str>,
) -> Result<(ResourceState, String), Failure> {
    let key = &resource.key;
    let unreadable = |failure: Failure| {
        if failure.stops_run() {
            return Err(failure);
        }
        Ok((
            ResourceState::Progressing,
            format!(
                "cannot read its health: {}",
                failure.describe("get", key.kind())
            ),
        ))
    };
    let found = match discovery
        .resolve(api, &api_version_of(resource), key.kind())
        .await
    {
        Ok(Some(found)) => found,
        Ok(None) => return Ok((ResourceState::Failed, "its kind is not served".into())),
        Err(failure) => return unreadable(failure),
    };
    let namespace = found.namespaced.then_some(key.namespace());
    match api
        .acting_as(user)
        .get(&found.resource, namespace, key.name())
        .await
    {
        Ok(live) => Ok(health(key, &live)),
        Err(failure) if failure.is_not_found() => Ok(if job != JobRun::None {
            let (state, message) = job_removed(job);
            (state, message.into())
        } else {
            (
                ResourceState::Failed,
                "it is gone (deleted since it was applied); the next resync applies it again"
                    .into(),
            )
        }),
        Err(failure) => unreadable(failure),
    }
}

/// Whether this Job was applied from exactly this manifest before.
fn job_ran(ledger: Option<&Ledger>, resource: &Resource) -> bool {
    job_run(ledger, resource) != JobRun::None
}

/// What the ledger says of a Job's run from its current manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobRun {
    /// Not a Job, or none run from this manifest.
    None,
    Ran,
    /// Ran, and a health read saw it fail.
    Failed,
}

fn job_run(ledger: Option<&Ledger>, resource: &Resource) -> JobRun {
    if !is_job(&resource.key) {
        return JobRun::None;
    }
    let Some(entry) = ledger.and_then(|l| l.entry(&resource.key)) else {
        return JobRun::None;
    };
    let manifest = Digest::of(&resource.canonical);
    if entry.ran.as_deref() != Some(manifest.as_str()) {
        JobRun::None
    } else if entry.failed.as_deref() == Some(manifest.as_str()) {
        JobRun::Failed
    } else {
        JobRun::Ran
    }
}

/// The state and message of a Job that ran from its manifest and is gone now.
fn job_removed(run: JobRun) -> (ResourceState, &'static str) {
    match run {
        JobRun::Failed => (ResourceState::Failed, JOB_FAILED_REMOVED),
        _ => (ResourceState::Applied, JOB_REMOVED),
    }
}

/// The report's one line about an apply: what failed to apply (and why it stopped),
/// or how healthy the applied bundle is and what prune did.
fn summary(
    total: usize,
    lines: &[Line],
    pruned: &[ResourceStatus],
    stopped_applying: Option<&str>,
    stopped: Option<&str>,
) -> String {
    let apply_errors = lines.iter().filter(|l| l.apply_error).count();
    if apply_errors > 0 || stopped_applying.is_some() {
        let mut message =
            format!("{apply_errors} of {total} resources failed to apply; nothing was pruned");
        if let Some(reason) = stopped_applying {
            message.push_str(&format!(" (stopped early: {reason})"));
        } else if let Some(first) = lines.iter().find(|l| l.apply_error) {
            message.push_str(&format!(
                "; first: {}: {}",
                first.status.key(),
                first.status.message
            ));
        }
        return message;
    }
    if let Some(reason) = stopped {
        return format!("applied {total} resources, but pruning stopped early: {reason}");
    }
    let count = |state| lines.iter().filter(|l| l.status.state == state).count();
    let mut message = format!(
        "applied {total} resources ({} healthy, {} progressing, {} failed), pruned {}",
        count(ResourceState::Healthy),
        count(ResourceState::Progressing),
        count(ResourceState::Failed),
        pruned
            .iter()
            .filter(|p| p.state == ResourceState::Pruned)
            .count()
    );
    let left = pruned
        .iter()
        .filter(|p| p.state == ResourceState::Applied)
        .count();
    if left > 0 {
        message.push_str(&format!(", {left} left in place"));
    }
    if let Some(first) = lines
        .iter()
        .find(|l| l.status.state == ResourceState::Failed)
    {
        message.push_str(&format!(
            "; failed: {}: {}",
            first.status.key(),
            first.status.message
        ));
    }
    message
}

const JOB_REMOVED: &str = "ran and was removed after it finished (ttlSecondsAfterFinished); flotilla creates \
                           a Job again only when its manifest changes";
const JOB_FAILED_REMOVED: &str = "failed, and was removed since (ttlSecondsAfterFinished); flotilla creates \
                                  a Job again only when its manifest changes";

fn nothing_applied(bundle: &Bundle, message: &dyn std::fmt::Display) -> ApplyOutcome {
    ApplyOutcome {
        resources: bundle
            .resources
            .iter()
            .map(|r| {
                ResourceStatus::new(
                    &r.key,
                    ResourceState::Failed,
                    format!("not attempted: {message}"),
                )
            })
            .collect(),
        complete: false,
        message: format!("nothing applied: {message}"),
        kept: Vec::new(),
    }
}

impl Sink for KubeSink {
    fn id(&self) -> String {
        "kube".to_string()
    }

    fn keep_private(&mut self, key: [u8; 32]) {
        self.private_key = Some(key);
    }

    fn apply<'a>(
        &'a mut self,
        bundle: &'a Bundle,
        prune: &'a [InventoryEntry],
    ) -> impl std::future::Future<Output = ApplyOutcome> + Send + 'a {
        self.apply_bundle(bundle, prune)
    }

    fn health<'a>(
        &'a mut self,
        bundle: &'a Bundle,
    ) -> impl std::future::Future<Output = Option<Vec<ResourceStatus>>> + Send + 'a {
        self.bundle_health(bundle)
    }

    fn watch_stop(&mut self, stop: StopSignal) {
        self.api.stop = stop;
    }

    fn recall(&mut self, applied_before: &[InventoryEntry]) {
        self.applied_before = applied_before.to_vec();
    }

    fn recall_applied(&mut self, bundle: Option<Arc<Bundle>>) {
        self.last_applied = bundle;
    }

    fn check_drift<'a>(
        &'a mut self,
        bundle: &'a Bundle,
    ) -> impl std::future::Future<Output = super::drift::DriftCheck> + Send + 'a {
        self.detect_drift(bundle)
    }
}

/// One resource's line of the report, and whether it failed to apply (as opposed to
/// being applied and unhealthy).
struct Line {
    status: ResourceStatus,
    apply_error: bool,
}

/// One object considered for pruning, whether it stays in the inventory, and its kind
/// when it was still there, being deleted, at the last look (finalizers, a Namespace
/// terminating).
struct PruneLine {
    status: ResourceStatus,
    retain: bool,
    lingering: Option<Found>,
}

/// The state of one apply.
struct Run {
    api: Api,
    /// Who each resource of the bundle is applied as.
    users: Users,
    options: KubeOptions,
    discovery: Discovery,
    /// Why the apply stopped early, if it did.
    stopped: Option<String>,
    /// 500 answers in a row.
    server_errors: u32,
    /// What the server answered each apply, for drift checks.
    answers: Vec<drift::Answered>,
    /// The namespace of the cluster's inventory ([`Run::flush_ledger`]).
    ledger_namespace: String,
    /// When the inventory was last written during this apply.
    ledger_written: Instant,
    /// Whether to write it during the apply (not once it outgrew its ConfigMap).
    ledger_flush: bool,
}

/// How often a long apply writes the cluster's inventory with the answers it has so
/// far. An agent killed in the middle of an apply leaves the objects it was about to
/// apply pending there; the next apply adopts those that exist, and never prunes
/// them, since it cannot tell whether that apply created them. Writing every few
/// seconds leaves only the answers of the last few seconds before the kill unknown.
const LEDGER_FLUSH_EVERY: Duration = Duration::from_secs(2);

fn is_job(key: &ResourceKey) -> bool {
    key.group() == "batch" && key.kind() == "Job"
}

fn is_established(crd: &Value) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Established" && c["status"] == "True")
}

fn qualified(found: &Found) -> String {
    if found.resource.group.is_empty() {
        found.resource.plural.clone()
    } else {
        format!("{}.{}", found.resource.plural, found.resource.group)
    }
}

fn crd_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions")
}

fn api_version_of(resource: &Resource) -> String {
    resource.api_version().unwrap_or_else(|| "v1".to_string())
}

impl Run {
    /// Writes the cluster's inventory when [`LEDGER_FLUSH_EVERY`] has passed since it
    /// was last written in this apply. A write that fails is logged and the apply
    /// goes on: the write at its end tries again.
    async fn flush_ledger(&mut self, ledger: &Ledger) {
        if !self.ledger_flush || self.ledger_written.elapsed() < LEDGER_FLUSH_EVERY {
            return;
        }
        match ledger.save(&self.api, &self.ledger_namespace).await {
            Ok(()) => {}
            Err(SaveError::TooBig(_)) => self.ledger_flush = false,
            Err(SaveError::Failed(message)) => {
                tracing::warn!("{message}; the apply goes on, and writes it again at its end");
            }
        }
        self.ledger_written = Instant::now();
    }

    /// Server-side apply of `object`, as the user `key` is applied as.
    async fn apply_as_its_user(
        &self,
        key: &ResourceKey,
        found: &Found,
        namespace: Option<&str>,
        object: &Value,
    ) -> Result<(u16, Value), Failure> {
        self.api_for(key)
            .apply(
                &found.resource,
                namespace,
                key.name(),
                object,
                self.options.force_conflicts,
            )
            .await
    }

    /// The API as the user resource `key` is applied as ([`Users`]).
    fn api_for(&self, key: &ResourceKey) -> Api {
        self.api.acting_as(self.users.user(key))
    }

    /// Notes a failure: it may stop the apply, and 500s are counted.
    fn note(&mut self, key: &ResourceKey, failure: &Failure, described: &str) {
        if failure.code() == Some(500) {
            self.server_errors += 1;
            if self.server_errors >= SERVER_ERRORS_BEFORE_STOP && self.stopped.is_none() {
                self.stopped = Some(format!(
                    "{} requests in a row were answered 500, the last for {key}: {described}; the API server \
                     or an admission webhook is in trouble",
                    self.server_errors
                ));
            }
        } else {
            self.server_errors = 0;
        }
        if failure.stops_run() && self.stopped.is_none() {
            self.stopped = Some(format!("{key}: {described}"));
        }
    }

    fn apply_failed(
        &mut self,
        key: &ResourceKey,
        what: &str,
        verb: &str,
        resource: &str,
        failure: Failure,
    ) -> Line {
        let described = failure.describe(verb, resource);
        self.note(key, &failure, &described);
        Line {
            status: ResourceStatus::new(key, ResourceState::Failed, format!("{what}: {described}")),
            apply_error: true,
        }
    }

    /// Waits, unless the agent is asked to stop.
    async fn pause(&self, duration: Duration) -> Result<(), Failure> {
        tokio::select! {
            () = self.api.stop.raised() => Err(Failure::Stopped),
            () = tokio::time::sleep(duration) => Ok(()),
        }
    }

    /// Applies `resources` (some of the bundle's, in apply order) and returns one line
    /// per resource, in the same order; CRDs are waited for until Established. The
    /// kinds the CRDs define are added to `defined`.
    async fn apply_all(
        &mut self,
        ledger: &mut Ledger,
        bundle: &Bundle,
        resources: &[&Arc<Resource>],
        defined: &mut HashSet<(String, String)>,
    ) -> Vec<Line> {
        // A tenant's ClusterRole and ClusterRoleBinding come first, with the CRDs: a
        // CRD may be the tenant's, applied as it (`--impersonate-tenants`).
        let (definitions, others): (Vec<&Arc<Resource>>, Vec<&Arc<Resource>>) = resources
            .iter()
            .copied()
            .partition(|r| tenancy_first_rank(&r.key).0 == 0);
        let mut lines = Vec::with_capacity(resources.len());
        let mut waiting = Vec::new();
        for resource in &definitions {
            let (line, live) = self
                .apply_one(ledger, bundle, resource, &HashSet::new())
                .await;
            let is_crd = apply_rank(&resource.key) == 0;
            if is_crd && live.as_ref().is_some_and(|live| !is_established(live)) {
                waiting.push(lines.len());
            }
            lines.push(line);
        }
        for index in waiting {
            if self.stopped.is_some() {
                break;
            }
            let key = Arc::clone(&lines[index].status.key);
            if let Err(err) = self.wait_established(&key).await {
                lines[index] = Line {
                    status: ResourceStatus::new(&key, ResourceState::Failed, err.to_string()),
                    apply_error: true,
                };
            }
        }
        // The kinds the bundle's own, established, CRDs define: discovery may take a
        // moment to serve them.
        defined.extend(
            definitions
                .iter()
                .zip(&lines)
                .filter(|(r, line)| !line.apply_error && apply_rank(&r.key) == 0)
                .flat_map(|(crd, _)| {
                    let crd = crd.value();
                    let spec = &crd["spec"];
                    let group = spec["group"].as_str().unwrap_or_default().to_string();
                    let kind = spec["names"]["kind"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    spec["versions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|v| v["served"].as_bool() == Some(true))
                        .filter_map(|v| v["name"].as_str())
                        .map(move |version| (format!("{group}/{version}"), kind.clone()))
                        .collect::<Vec<_>>()
                }),
        );
        for resource in &others {
            let (line, _) = self.apply_one(ledger, bundle, resource, defined).await;
            lines.push(line);
        }
        lines
    }

    /// Finds a kind to apply; a kind one of the bundle's CRDs defines is looked for
    /// again until it is served or the CRD timeout passes.
    async fn resolve_for_apply(
        &mut self,
        api_version: &str,
        kind: &str,
        defined: &HashSet<(String, String)>,
    ) -> Result<Option<Found>, Failure> {
        let found = self.discovery.resolve(&self.api, api_version, kind).await?;
        if found.is_some() || !defined.contains(&(api_version.to_string(), kind.to_string())) {
            return Ok(found);
        }
        let deadline = Instant::now() + self.options.crd_timeout;
        while Instant::now() + self.options.crd_poll <= deadline {
            self.pause(self.options.crd_poll).await?;
            self.discovery.forget(api_version);
            if let Some(found) = self.discovery.resolve(&self.api, api_version, kind).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Applies one resource; returns its line and, on success, the object as the
    /// server returned it.
    async fn apply_one(
        &mut self,
        ledger: &mut Ledger,
        bundle: &Bundle,
        resource: &Resource,
        defined: &HashSet<(String, String)>,
    ) -> (Line, Option<Value>) {
        let key = &resource.key;
        if let Some(reason) = &self.stopped {
            let message = format!("not attempted: the apply stopped early ({reason})");
            return (
                Line {
                    status: ResourceStatus::new(key, ResourceState::Failed, message),
                    apply_error: true,
                },
                None,
            );
        }
        let api_version = api_version_of(resource);
        let found = match self
            .resolve_for_apply(&api_version, key.kind(), defined)
            .await
        {
            Ok(Some(found)) => found,
            Ok(None) => {
                let message = format!(
                    "the API server does not serve kind {} in {api_version} (is its CustomResourceDefinition installed?)",
                    key.kind()
                );
                return (
                    Line {
                        status: ResourceStatus::new(key, ResourceState::Failed, message),
                        apply_error: true,
                    },
                    None,
                );
            }
            Err(failure) => {
                return (
                    self.apply_failed(key, "cannot discover its API", "get", &api_version, failure),
                    None,
                );
            }
        };
        let namespace = found.namespaced.then_some(key.namespace());
        let resource_name = qualified(&found);
        let manifest = Digest::of(&resource.canonical);
        // A Job runs once per manifest: one that finished and was removed
        // (ttlSecondsAfterFinished) is not created again by a resync.
        if is_job(key)
            && ledger.entry(key).and_then(|e| e.ran.as_deref()) == Some(manifest.as_str())
        {
            match self
                .api_for(key)
                .get(&found.resource, namespace, key.name())
                .await
            {
                Ok(_) => {}
                Err(failure) if failure.is_not_found() => {
                    let (state, message) = job_removed(job_run(Some(ledger), resource));
                    return (
                        Line {
                            status: ResourceStatus::new(key, state, message),
                            apply_error: false,
                        },
                        None,
                    );
                }
                Err(failure) => {
                    return (
                        self.apply_failed(key, "cannot read it", "get", &resource_name, failure),
                        None,
                    );
                }
            }
        }
        // A Job's pod template cannot change (the API server answers 422): a Job
        // flotilla ran from another manifest is deleted (its pods with it) and created
        // from the new one, which runs it again.
        if is_job(key)
            && ledger
                .entry(key)
                .and_then(|e| e.ran.as_deref())
                .is_some_and(|ran| ran != manifest.as_str())
            && let Err(message) = self.delete_hook(&found, namespace, key).await
        {
            return (job_not_replaced(key, &message), None);
        }
        let object = applied_object(bundle, resource, found.namespaced);
        let user = self.users.user(key).map(str::to_string);
        let mut answer = self
            .apply_as_its_user(key, &found, namespace, &object)
            .await;
        // The same for a Job whose run from another manifest is not recorded (the
        // ledger was lost, or an older agent applied it): the API server refuses
        // the new pod template. A Job that carries this cluster's label was applied
        // by flotilla, so it is replaced the same way; anyone else's (no label, or
        // one the ledger says flotilla adopted) stays, and the refusal is reported.
        if is_job(key)
            && answer
                .as_ref()
                .is_err_and(|failure| failure.is_immutable("spec.template"))
        {
            match self
                .api_for(key)
                .get(&found.resource, namespace, key.name())
                .await
            {
                Ok(live)
                    if live
                        .pointer("/metadata/labels")
                        .and_then(|labels| labels.get(CLUSTER_LABEL))
                        .and_then(Value::as_str)
                        == Some(bundle.cluster.as_str())
                        && ledger
                            .entry(key)
                            .is_none_or(|e| e.origin != ledger::Origin::Adopted) =>
                {
                    let checked = live.pointer("/metadata/uid").and_then(Value::as_str);
                    if let Err(message) = self.delete_object(&found, namespace, key, checked).await
                    {
                        return (job_not_replaced(key, &message), None);
                    }
                    answer = self
                        .apply_as_its_user(key, &found, namespace, &object)
                        .await;
                }
                _ => {}
            }
        }
        match answer {
            Ok((code, live)) => {
                self.server_errors = 0;
                let uid = live.pointer("/metadata/uid").and_then(Value::as_str);
                ledger.record_apply(&InventoryEntry::of(resource), code == 201, uid);
                ledger.record_user(key, user.as_deref());
                if is_job(key) {
                    ledger.record_run(key, &manifest);
                }
                self.flush_ledger(ledger).await;
                self.answers
                    .push(drift::Answered::of(key, &found, &object, &live));
                let (state, message) = health(key, &live);
                (
                    Line {
                        status: ResourceStatus::new(key, state, message),
                        apply_error: false,
                    },
                    Some(live),
                )
            }
            Err(failure) => (
                self.apply_failed(key, "apply failed", "patch", &resource_name, failure),
                None,
            ),
        }
    }

    /// Waits until the CRD is Established.
    async fn wait_established(&mut self, key: &ResourceKey) -> Result<(), EstablishError> {
        let deadline = Instant::now() + self.options.crd_timeout;
        loop {
            match self.api.get(&crd_resource(), None, key.name()).await {
                Ok(crd) if is_established(&crd) => return Ok(()),
                Ok(_) => {}
                Err(failure) => {
                    let described =
                        failure.describe("get", "customresourcedefinitions.apiextensions.k8s.io");
                    self.note(key, &failure, &described);
                    return Err(EstablishError::Unreadable(described));
                }
            }
            if Instant::now() + self.options.crd_poll > deadline {
                return Err(EstablishError::NotEstablished(self.options.crd_timeout));
            }
            if let Err(failure) = self.pause(self.options.crd_poll).await {
                let described = failure.describe("get", "customresourcedefinitions");
                self.note(key, &failure, &described);
                return Err(EstablishError::Stopped(described));
            }
        }
    }

    /// Finds the kind of an object to prune: in the version it was applied with, or
    /// (that version no longer served) in any served version of its group.
    async fn find_for_prune(&mut self, entry: &InventoryEntry) -> Result<Option<Found>, Failure> {
        if let Some(found) = self
            .discovery
            .resolve(&self.api, entry.api_version(), entry.kind())
            .await?
        {
            return Ok(Some(found));
        }
        self.discovery
            .resolve_in_group(&self.api, api_group(entry.api_version()), entry.kind())
            .await
    }

    /// Prunes one object the bundle no longer holds, as [`prune::judge`] decides.
    async fn prune_one(
        &mut self,
        ledger: &Ledger,
        entry: &InventoryEntry,
        context: &prune::Context<'_>,
    ) -> PruneLine {
        let key = entry.key();
        let line = |state, message: String, retain| PruneLine {
            status: ResourceStatus::new(entry.shared_key(), state, message),
            retain,
            lingering: None,
        };
        if let Some(reason) = &self.stopped {
            return line(
                ResourceState::Failed,
                format!("not pruned yet: the apply stopped early ({reason})"),
                true,
            );
        }
        let failed = |run: &mut Run, what: &str, verb: &str, resource: &str, failure: Failure| {
            let described = failure.describe(verb, resource);
            run.note(key, &failure, &described);
            if failure.stops_run() {
                line(ResourceState::Failed, format!("{what}: {described}"), true)
            } else {
                line(
                    ResourceState::Applied,
                    format!("left in place: {what}: {described}"),
                    true,
                )
            }
        };
        let found = match self.find_for_prune(entry).await {
            Ok(Some(found)) => found,
            Ok(None) => {
                // Not "gone": the objects of a kind that is not served any more may
                // still be stored; flotilla cannot see them, so it does not claim them.
                return line(
                    ResourceState::Applied,
                    format!(
                        "left in place: kind {} is not served in any version of {} any more, so flotilla cannot \
                         see or delete it (if its CustomResourceDefinition was deleted, it went with it)",
                        entry.kind(),
                        entry.api_version()
                    ),
                    false,
                );
            }
            Err(failure) => {
                return failed(
                    self,
                    "cannot discover its API to prune it",
                    "get",
                    entry.api_version(),
                    failure,
                );
            }
        };
        let resource_name = qualified(&found);
        let namespace = found.namespaced.then_some(entry.namespace());
        // An object applied as a tenant's ServiceAccount is deleted as it too.
        let api = self
            .api
            .acting_as(ledger.entry(key).and_then(|e| e.user.as_deref()));
        let live = match api.get(&found.resource, namespace, entry.name()).await {
            Ok(live) => live,
            Err(failure) if failure.is_not_found() => {
                return line(ResourceState::Pruned, "already gone".into(), false);
            }
            Err(failure) => {
                return failed(
                    self,
                    "cannot read it to prune it",
                    "get",
                    &resource_name,
                    failure,
                );
            }
        };
        match prune::judge(entry, ledger.entry(key), &live, context) {
            prune::Verdict::Gone(why) => PruneLine {
                lingering: Some(found),
                ..line(ResourceState::Pruned, why, false)
            },
            prune::Verdict::Keep { reason, retry } => line(
                ResourceState::Applied,
                format!("left in place: {reason}"),
                retry,
            ),
            prune::Verdict::Delete {
                uid,
                resource_version,
            } => {
                match api
                    .delete(
                        &found.resource,
                        namespace,
                        entry.name(),
                        uid,
                        resource_version,
                    )
                    .await
                {
                    Ok(answer) => {
                        self.server_errors = 0;
                        let after = prune::after_delete(&answer);
                        let lingering = (!after.is_empty()).then_some(found);
                        PruneLine {
                            lingering,
                            ..line(ResourceState::Pruned, after, false)
                        }
                    }
                    Err(failure) if failure.is_not_found() => {
                        line(ResourceState::Pruned, "already gone".into(), false)
                    }
                    Err(failure) => failed(
                        self,
                        "the delete was refused",
                        "delete",
                        &resource_name,
                        failure,
                    ),
                }
            }
        }
    }
}

/// The line of a Job that could not be deleted to be created from its new manifest.
fn job_not_replaced(key: &ResourceKey, message: &str) -> Line {
    Line {
        status: ResourceStatus::new(
            key,
            ResourceState::Failed,
            format!(
                "cannot delete the Job run from its previous manifest, to run the new one: {message}"
            ),
        ),
        apply_error: true,
    }
}

/// The object as the kube sink applies it: flotilla's label and digest annotation on
/// it, and no namespace on a cluster-scoped object (the API server rejects one).
fn applied_object(bundle: &Bundle, resource: &Resource, namespaced: bool) -> Value {
    let mut object =
        with_flotilla_metadata(resource.value(), &bundle.cluster, Some(&bundle.digest));
    if !namespaced && let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut)
    {
        metadata.remove("namespace");
    }
    object
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    fn line(name: &str, state: ResourceState, apply_error: bool, message: &str) -> Line {
        let key = ResourceKey::new("", "ConfigMap", "demo", name);
        Line {
            status: ResourceStatus::new(&key, state, message),
            apply_error,
        }
    }

    #[test]
    fn the_summary_names_the_first_apply_error_not_the_first_unhealthy_object() {
        let lines = [
            line(
                "sick",
                ResourceState::Failed,
                false,
                "progress deadline exceeded",
            ),
            line(
                "bad",
                ResourceState::Failed,
                true,
                "apply failed: 422 invalid",
            ),
        ];
        assert_eq!(
            summary(2, &lines, &[], None, None),
            "1 of 2 resources failed to apply; nothing was pruned; first: ConfigMap demo/bad: apply failed: 422 invalid"
        );
        let healthy = [line("ok", ResourceState::Healthy, false, "")];
        assert_eq!(
            summary(1, &healthy, &[], None, Some("503 unavailable")),
            "applied 1 resources, but pruning stopped early: 503 unavailable"
        );
        let left = ResourceStatus::new(
            &lines[0].status.key,
            ResourceState::Applied,
            "left in place: …",
        );
        assert_eq!(
            summary(2, &lines[..1], &[left], None, None),
            "applied 2 resources (0 healthy, 0 progressing, 1 failed), pruned 0, 1 left in place; failed: ConfigMap demo/sick: progress deadline exceeded"
        );
    }
}
