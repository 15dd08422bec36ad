//! The edge agent: pulls its cluster's bundle, verifies it, keeps it, applies it,
//! prunes what left it, and reports.
//!
//! Three loops share the work:
//! - the **poller** long-polls the hub (or re-reads a `file://` folder) with the last
//!   digest as `If-None-Match`, verifies each new bundle (recomputed digest, and the
//!   ETag when it is a flotilla digest), stores it as last-known-good, and hands it
//!   on; a hub may send a change as a delta against the stored bundle ([`delta`]),
//!   rebuilt and then verified as a full document, and any doubt about one means
//!   the next request asks for the full document; it backs off with full jitter on failures, honouring `Retry-After`;
//! - the **applier** (the caller's task) applies the last-known-good bundle at boot
//!   without waiting for the hub, then every new bundle, retries failed applies with
//!   back-off, looks for drift on `--resync` (the sink compares what it applied with
//!   what is there, and corrects or reports it as each workload's policy says,
//!   [`sink::drift`]; a sink that cannot look applies the bundle again), and follows
//!   rollouts until they are healthy;
//! - the **reporter** posts the latest status report, keeps it in the state folder
//!   until the hub has it, and retries; a newer report replaces an unsent one, and a
//!   report equal to the one the hub already has (a resync that changed nothing) is
//!   not sent again. The hub counts the agent's authenticated polls as the agent
//!   being seen, so an idle agent sends no reports at all; `--heartbeat` (off by
//!   default) resends the last report on a schedule, for hubs that need it.
//!
//! The agent depends on `flotilla-core` and on no crate of the renderer or the hub: it
//! trusts digests, not the server. With trusted keys (`--trust-key`) it also trusts
//! only bundles a trusted key signed, with a sequence that never goes back.

/// The version of this agent, sent with every report.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The bundle features this agent understands, named in every bundle request (the
/// `Flotilla-Features` header) and in its reports: a hub serves it no bundle that
/// needs another.
pub const FEATURES: &[&str] = &[
    flotilla_core::bundle::features::META,
    flotilla_core::bundle::features::PHASES,
    flotilla_core::bundle::features::DRIFT,
    flotilla_core::bundle::features::SEALED,
    flotilla_core::bundle::features::HOOKS,
    flotilla_core::bundle::features::TENANTS,
    flotilla_core::bundle::features::TENANT_CLUSTER_ROLES,
];

pub mod backoff;
pub mod cache;
pub mod cli;
pub mod client;
pub mod delta;
pub mod logging;
pub mod sealed;
pub mod sink;
pub mod tenancy;
#[cfg(test)]
pub(crate) mod testing;
pub mod wait;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use backoff::{Backoff, BackoffPolicy, Sleeper, TokioSleeper};
use cache::{Inventory, StateDir};
use client::{FailureKind, Fetched, HubClient, Server};
use flotilla_core::status::{ResourceState, ResourceStatus, StatusReport};
use sink::drift::DriftCheck;
use sink::{ApplyOutcome, Sink, StopSignal};
use wait::{Wait, Waits};

use flotilla_core::bundle::{self, Bundle, Digest};
use flotilla_core::signing::{Held, TrustedKeys};

/// The agent's settings, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub server: Server,
    pub cluster: String,
    /// Required for an http(s) server; a `file://` folder needs none.
    pub token_file: Option<PathBuf>,
    pub state_dir: PathBuf,
    /// How long a hub may hold a poll (`auto`: as long as the path to it allows, up
    /// to 4 minutes); a folder is re-read once per wait (55 s with `auto`).
    pub wait: Wait,
    /// How often the agent looks for drift (and corrects or reports it, as each
    /// workload's policy says); zero disables it.
    pub resync: Duration,
    /// How long the agent stays silent before it sends its last report again; zero (the
    /// default) never does: the hub counts the agent's polls as it being seen.
    pub heartbeat: Duration,
    /// Speak HTTP/2 to an `http://` hub without asking first (`https://` negotiates it).
    pub http2: bool,
    pub backoff: BackoffPolicy,
    /// A CA to trust besides the system's store, and a client certificate.
    pub tls: client::TlsOptions,
    /// The keys whose signatures the agent accepts; empty: digests are checked only.
    pub trusted: TrustedKeys,
    /// `--tenant-policy`: tenant rules enforced instead of those a bundle carries.
    pub tenant_policy: Option<tenancy::TenantPolicy>,
    /// `--tenant-key`: enforce the tenant rules a bundle carries signed by this key
    /// (and refuse a bundle without them).
    pub tenant_key: Option<flotilla_core::signing::PublicKey>,
    /// How an `oci://` server is reached (credentials, plain HTTP to a loopback one).
    pub registry: flotilla_oci::RegistryOptions,
    /// The hub that receives the reports of an agent whose bundles come from a
    /// registry or a folder (which cannot take reports); `None`: they are only kept.
    pub report_to: Option<url::Url>,
}

impl AgentConfig {
    /// Settings with the defaults of the command line: `--wait auto --resync 10m
    /// --heartbeat 0`, back-off capped at 5 minutes.
    pub fn new(server: Server, cluster: &str, state_dir: PathBuf) -> AgentConfig {
        AgentConfig {
            server,
            cluster: cluster.to_string(),
            token_file: None,
            state_dir,
            wait: Wait::Auto,
            resync: Duration::from_secs(600),
            heartbeat: Duration::ZERO,
            http2: false,
            backoff: BackoffPolicy::default(),
            tls: client::TlsOptions::default(),
            trusted: TrustedKeys::default(),
            tenant_policy: None,
            tenant_key: None,
            registry: flotilla_oci::RegistryOptions::default(),
            report_to: None,
        }
    }
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    State(#[from] cache::StateError),
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("{0}")]
    ClusterName(String),
}

/// How long an apply under way may take to wind down once the agent is asked to
/// stop: the request in flight is abandoned at once, and what the apply learnt is
/// recorded.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How often a rollout that is still progressing is looked at again, at first and at most.
const HEALTH_FIRST: Duration = Duration::from_secs(5);
const HEALTH_MAX: Duration = Duration::from_secs(60);

/// What the poller hands the applier.
#[derive(Debug)]
enum Event {
    /// A new, verified bundle, already stored as last-known-good, and how it came
    /// when that is worth a word in the report (as a delta, or in full after a delta
    /// that failed).
    Bundle(Arc<Bundle>, Option<String>),
    /// A bundle that was refused; the last-known-good stays.
    Refused {
        claimed: Option<Digest>,
        message: String,
    },
    /// After a refusal, the server offers the bundle held again (signed anew, or as
    /// it was): the refusal no longer stands.
    OfferedAgain(Digest),
}

/// One agent: a sink, a server, a state folder.
pub struct Agent<S: Sink> {
    config: AgentConfig,
    sink: S,
    sleeper: Arc<dyn Sleeper>,
    reports: watch::Sender<Option<StatusReport>>,
}

impl<S: Sink> Agent<S> {
    pub fn new(config: AgentConfig, sink: S) -> Agent<S> {
        Agent {
            config,
            sink,
            sleeper: Arc::new(TokioSleeper),
            reports: watch::channel(None).0,
        }
    }

    /// Replaces the sleeper the poller and reporter wait on (tests record waits).
    pub fn with_sleeper(mut self, sleeper: Arc<dyn Sleeper>) -> Agent<S> {
        self.sleeper = sleeper;
        self
    }

    /// Every status report the agent makes, latest first (for tests and embedding).
    pub fn reports(&self) -> watch::Receiver<Option<StatusReport>> {
        self.reports.subscribe()
    }

    /// Runs until `shutdown` completes. Errors only if the agent cannot start; once
    /// running, every failure is retried.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let Agent {
            config,
            mut sink,
            sleeper,
            reports,
        } = self;
        sink::check_cluster_name(&config.cluster).map_err(AgentError::ClusterName)?;
        let stop = StopSignal::default();
        sink.watch_stop(stop.clone());
        let state = Arc::new(StateDir::open(&config.state_dir)?);
        let last_known_good = state.load_document(&config.cluster)?;
        let document = last_known_good.as_ref().map(|(bytes, _)| bytes.clone());
        let last_known_good = last_known_good.map(|(_, document)| document);
        // The stored document was checked when it arrived; its sequence is the one held,
        // or the one kept beside it when that is higher (the document was damaged and
        // set aside, or is older than the last one taken): a sequence never goes back.
        let held = last_known_good.as_ref().and_then(|document| {
            document.signature.as_ref().map(|signature| Held {
                sequence: signature.sequence,
                digest: document.bundle.digest.clone(),
            })
        });
        let held = match (held, state.load_held()) {
            (Some(held), Some(kept)) if kept.sequence > held.sequence => Some(kept),
            (None, kept) => kept,
            (held, _) => held,
        };
        let last_known_good = last_known_good.map(|document| Arc::new(document.bundle));
        let mut inventory = state.load_inventory();
        let sink_id = sink.id();
        if inventory.sink != sink_id {
            if !inventory.entries.is_empty() {
                tracing::warn!(
                    previous = %inventory.sink, now = %sink_id,
                    "the sink changed; what the previous sink applied will not be pruned"
                );
            }
            inventory = Inventory {
                sink: sink_id,
                applied: None,
                entries: Vec::new(),
            };
        }
        let mut client = HubClient::with_tls(
            config.server.clone(),
            &config.cluster,
            config.token_file.as_deref(),
            &config.tls,
        )?;
        if config.http2 {
            client = client.with_http2_prior_knowledge()?;
        }
        client = client.with_registry_options(config.registry.clone())?;
        // The stored document is the one held: a folder that still names it (its
        // `deltas/current.sha256`) is unchanged from the first poll on, without
        // reading the document again beside the one held. Not from a registry, nor
        // over HTTP: its first
        // answer, the document, shows whether the server is a mirror and gives its
        // ETag (from the second poll on the sha256 is read there too). Nor with
        // `--trust-key` or tenant rules, which may have changed since the document
        // was taken: the first poll judges it again, and reports a refusal.
        let judged_again = !config.trusted.is_empty()
            || config.tenant_policy.is_some()
            || config.tenant_key.is_some();
        if let Some(document) = &document
            && matches!(config.server, Server::File(_))
            && !judged_again
        {
            client.fetched_document(document);
        }
        // Reports go where bundles come from, or to --report-to.
        let report_client = match &config.report_to {
            Some(hub) => HubClient::with_tls(
                Server::Http(hub.clone()),
                &config.cluster,
                config.token_file.as_deref(),
                &config.tls,
            )?,
            None => client.clone(),
        };
        // Made once the command line is known good, before the hub is asked anything.
        let (identity, made) = sealed::AgentIdentity::load_or_make(&state)?;
        announce_key(&config.cluster, &identity, made);
        sink.keep_private(identity.private_key("release fingerprints"));
        tracing::info!(
            cluster = %config.cluster, server = %config.server,
            state_dir = %config.state_dir.display(),
            last_known_good = last_known_good.as_ref().map(|b| b.digest.to_string()).unwrap_or_else(|| "none".into()),
            "flotilla agent starting"
        );
        if config.trusted.is_empty() {
            tracing::info!(
                "no --trust-key: bundles are checked against their digests only, not for who signed them"
            );
        } else {
            tracing::info!(
                trusted_keys = %config.trusted.ids().join(","),
                held_sequence = held.as_ref().map(|h| h.sequence).unwrap_or(0),
                "accepting only bundles signed by a trusted key with a sequence that does not go back"
            );
        }

        let stored = state.load_status();
        let first_report = match &stored {
            Some(stored) if !stored.sent => Some(Arc::new(stored.report.clone())),
            _ => None,
        };
        let (report_tx, report_rx) = watch::channel(first_report);
        let reporter = Reporter {
            client: report_client,
            to_bundle_server: config.report_to.is_none(),
            state: state.clone(),
            backoff: Backoff::new(config.backoff),
            sleeper: sleeper.clone(),
            heartbeat: config.heartbeat,
        };
        let reporter = tokio::spawn(reporter.run(report_rx));

        let (events_tx, events_rx) = mpsc::channel(4);
        let mut poller = Poller {
            client,
            cluster: config.cluster.clone(),
            state: state.clone(),
            waits: Waits::new(config.wait),
            backoff: Backoff::new(config.backoff),
            sleeper: sleeper.clone(),
            events: events_tx,
            current: last_known_good.as_ref().map(|b| b.digest.clone()),
            document,
            etag: None,
            trusted: config.trusted.clone(),
            tenant_policy: config.tenant_policy.clone(),
            tenant_key: config.tenant_key.clone(),
            held,
            // A report kept from before naming another bundle than the one applied (a
            // refusal) is cleared once the bundle held is offered again.
            refused: stored.as_ref().is_some_and(|s| {
                s.report.attempted.is_some() && s.report.attempted != s.report.applied
            }),
            offer_delta: true,
            bad_delta: None,
            taken_delta: None,
            sent: last_known_good
                .as_ref()
                .map_or_else(Weak::new, Arc::downgrade),
            attempts: report_tx.subscribe(),
        };
        // With `--trust-key` or tenant rules, which may have changed since the stored
        // bundle was taken, it is judged again before it is applied at boot: one they
        // refuse is not applied (nor kept in line by drift checks), and the refusal
        // is reported; the agent waits for a bundle they accept.
        let refused_at_boot = match &poller.document {
            Some(document) if judged_again => match poller.judge(document, None) {
                Verdict::Refused(claimed, message) => Some((claimed, message)),
                _ => None,
            },
            _ => None,
        };
        if refused_at_boot.is_some() {
            // The refused bundle is not the one running: the next bundle the flags
            // accept is taken and applied, even one of the same digest (signed now,
            // say), which the poller would otherwise answer as "the same". Its
            // sequence stays held: an older document (a mirror replaying one) is
            // still refused, while the same digest at that sequence, or any newer
            // one, is accepted.
            poller.current = None;
            poller.document = None;
            poller.taken_delta = None;
            poller.client.forget_fetched_document();
        }
        let poller = tokio::spawn(poller.run());

        let mut last_report = stored
            .map(|s| s.report)
            .unwrap_or_else(|| StatusReport::empty("starting; no bundle yet", AGENT_VERSION));
        let desired = match refused_at_boot {
            Some((claimed, message)) => {
                tracing::error!("{message}");
                last_report.attempted = claimed.or(last_report.attempted.take());
                last_report.message = message;
                None
            }
            None => last_known_good,
        };
        // What the next prune needs of the bundle last applied, offline too.
        if let Some(applied) = state.load_applied(&config.cluster, inventory.applied.as_ref()) {
            match identity.open(&applied) {
                Ok(opened) => sink.recall_applied(Some(Arc::new(opened))),
                Err(err) => {
                    tracing::warn!(error = %err, "cannot open the bundle last applied; the next prune goes in one step")
                }
            }
        }
        let applier = Applier {
            config: &config,
            sink,
            state: &state,
            inventory,
            desired,
            report: Arc::new(last_report),
            report_tx,
            observers: reports,
            backoff: Backoff::new(config.backoff),
            identity,
            delivery: None,
        };
        applier.run(events_rx, shutdown, stop).await;
        poller.abort();
        reporter.abort();
        // Waited for until they are gone, with the state folder they hold: an agent
        // started again on it at once (in the same process) finds it unlocked.
        let _ = poller.await;
        let _ = reporter.await;
        tracing::info!("flotilla agent stopped");
        Ok(())
    }
}

/// The applier's state.
/// Says which key Secrets must be sealed to: on its first start the agent prints the
/// line to add to its Cluster file (and logs it on every start).
fn announce_key(cluster: &str, identity: &sealed::AgentIdentity, made: bool) {
    let recipient = identity.recipient();
    if made {
        eprintln!(
            "made this agent's key (in its state dir, {}); to seal cluster {cluster}'s Secrets to it, add to clusters/{cluster}.yaml:\n  spec:\n    agentKey: {recipient}",
            sealed::KEY_FILE
        );
    }
    tracing::info!(agent_key = %recipient, "Secrets sealed to this key are opened here (spec.agentKey: {recipient})");
}

struct Applier<'a, S: Sink> {
    config: &'a AgentConfig,
    sink: S,
    state: &'a StateDir,
    inventory: Inventory,
    desired: Option<Arc<Bundle>>,
    /// The latest report, shared with the reporter (a report lists every resource).
    report: Arc<StatusReport>,
    /// To the reporter: one copy of the report, shared (a report lists every resource).
    report_tx: watch::Sender<Option<Arc<StatusReport>>>,
    observers: watch::Sender<Option<StatusReport>>,
    backoff: Backoff,
    /// Opens the Secrets sealed to this agent, in memory, just before they apply.
    identity: sealed::AgentIdentity,
    /// How the bundle being applied came, said in the report after the apply's message.
    delivery: Option<String>,
}

impl<S: Sink> Applier<'_, S> {
    async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        shutdown: impl Future<Output = ()>,
        stop: StopSignal,
    ) {
        tokio::pin!(shutdown);
        let far_future = || Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
        // At boot the last-known-good bundle is applied at once, hub or no hub.
        let mut apply_now = self.desired.is_some();
        let mut check_now = false;
        let mut retry_at: Option<Instant> = None;
        let mut resync_at = far_future();
        let mut health_at: Option<Instant> = None;
        let mut health_interval = HEALTH_FIRST;
        if self.desired.is_none() {
            self.publish();
        }
        loop {
            if apply_now && let Some(bundle) = self.desired.clone() {
                apply_now = false;
                let complete = {
                    let apply = self.apply(&bundle);
                    tokio::pin!(apply);
                    tokio::select! {
                        complete = &mut apply => complete,
                        () = &mut shutdown => {
                            // SIGTERM during an apply: the sink abandons the request in
                            // flight, records what it learnt and returns.
                            stop.raise();
                            if tokio::time::timeout(STOP_GRACE, apply).await.is_err() {
                                tracing::warn!("the apply did not wind down in time; stopping anyway");
                            }
                            return;
                        }
                    }
                };
                if complete {
                    self.backoff.reset();
                    retry_at = None;
                    if !self.config.resync.is_zero() {
                        resync_at = Instant::now() + self.config.resync;
                    }
                    health_interval = HEALTH_FIRST;
                    health_at = self.progressing().then(|| Instant::now() + health_interval);
                } else {
                    let delay = self.backoff.next_delay(None);
                    tracing::warn!(
                        retry_in = ?delay,
                        "the bundle was not applied completely; trying again"
                    );
                    retry_at = Some(Instant::now() + delay);
                    health_at = None;
                }
            }
            if check_now {
                check_now = false;
                let reapply = {
                    let check = self.check_drift();
                    tokio::pin!(check);
                    tokio::select! {
                        reapply = &mut check => reapply,
                        () = &mut shutdown => {
                            stop.raise();
                            if tokio::time::timeout(STOP_GRACE, check).await.is_err() {
                                tracing::warn!("the drift check did not wind down in time; stopping anyway");
                            }
                            return;
                        }
                    }
                };
                if reapply {
                    tracing::info!("resync: applying the current bundle again");
                    apply_now = true;
                    continue;
                }
                resync_at = Instant::now() + self.config.resync;
                if health_at.is_none() && self.progressing() {
                    health_interval = HEALTH_FIRST;
                    health_at = Some(Instant::now() + health_interval);
                }
            }
            tokio::select! {
                () = &mut shutdown => return,
                event = events.recv() => match event {
                    Some(Event::Bundle(bundle, delivery)) => {
                        tracing::info!(digest = %bundle.digest, resources = bundle.resources.len(), delivery = delivery.as_deref().unwrap_or("full document"), "new bundle");
                        self.desired = Some(bundle);
                        self.delivery = delivery;
                        self.backoff.reset();
                        retry_at = None;
                        apply_now = true;
                    }
                    Some(Event::Refused { claimed, message }) => {
                        let report = Arc::make_mut(&mut self.report);
                        report.attempted = claimed.or(report.attempted.take());
                        report.message = message;
                        self.publish();
                    }
                    Some(Event::OfferedAgain(digest)) => {
                        if self.report.applied.as_ref() == Some(&digest)
                            && self.report.attempted.as_ref() != Some(&digest)
                        {
                            let report = Arc::make_mut(&mut self.report);
                            report.attempted = Some(digest.clone());
                            report.message = format!(
                                "the server offers the bundle {digest} this agent runs again, and no other: what it offered before is no longer offered"
                            );
                            self.publish();
                        }
                    }
                    None => {
                        tracing::error!("the poller stopped; the agent stops");
                        return;
                    }
                },
                () = tokio::time::sleep_until(retry_at.unwrap_or_else(far_future)), if retry_at.is_some() => {
                    retry_at = None;
                    apply_now = true;
                }
                () = tokio::time::sleep_until(resync_at), if self.desired.is_some() && retry_at.is_none() => {
                    resync_at = far_future();
                    check_now = true;
                }
                () = tokio::time::sleep_until(health_at.unwrap_or_else(far_future)), if health_at.is_some() => {
                    self.refresh_health().await;
                    health_interval = (health_interval * 2).min(HEALTH_MAX);
                    health_at = self.progressing().then(|| Instant::now() + health_interval);
                }
            }
        }
    }

    /// Applies one bundle: records the intent in the inventory, applies and prunes,
    /// records the result, and reports. Returns true when the apply was complete.
    async fn apply(&mut self, bundle: &Bundle) -> bool {
        // Sealed Secrets are opened first: one that cannot be means nothing is
        // applied (never an empty Secret), and what runs is kept.
        let opened = match self.identity.open(bundle) {
            Ok(opened) => opened,
            Err(err) => {
                let message = format!("nothing applied: {err}; keeping what runs");
                tracing::error!(digest = %bundle.digest, "{message}");
                let failed = bundle
                    .resources
                    .iter()
                    .filter_map(|r| {
                        let key = r.key.to_string();
                        let failure = err.failures.iter().find(|f| f.secret == key)?;
                        Some(ResourceStatus::new(
                            &r.key,
                            ResourceState::Failed,
                            failure.reason.clone(),
                        ))
                    })
                    .collect();
                self.report = Arc::new(StatusReport {
                    applied: self.inventory.applied.clone(),
                    attempted: Some(bundle.digest.clone()),
                    resources: failed,
                    message,
                    agent_version: AGENT_VERSION.to_string(),
                    drift: Vec::new(),
                    features: crate::FEATURES.iter().map(|f| f.to_string()).collect(),
                });
                self.publish();
                return false;
            }
        };
        let received = bundle;
        let bundle = &opened;
        let prune = self.inventory.left_out_of(bundle);
        let intent = Inventory {
            sink: self.inventory.sink.clone(),
            applied: self.inventory.applied.clone(),
            entries: self.inventory.union_with(bundle),
        };
        let outcome = match self.state.save_inventory(&intent) {
            Ok(()) => {
                let applied_before = std::mem::replace(&mut self.inventory, intent);
                self.sink.recall(&applied_before.entries);
                drop(applied_before);
                self.sink.apply(bundle, &prune).await
            }
            Err(err) => ApplyOutcome {
                resources: Vec::new(),
                complete: false,
                message: format!("nothing applied: {err}"),
                kept: Vec::new(),
            },
        };
        let mut complete = outcome.complete;
        if complete {
            // The intent recorded before the apply begins with the bundle's entries
            // (`Inventory::union_with`): they are taken over, not made again. What
            // could not be pruned yet stays listed, so a later apply tries again.
            let mut entries = std::mem::take(&mut self.inventory.entries);
            let ours = bundle.resources.len().min(entries.len());
            let left = entries.split_off(ours);
            entries.extend(outcome.kept.iter().cloned());
            let done = Inventory {
                sink: self.inventory.sink.clone(),
                applied: Some(bundle.digest.clone()),
                entries,
            };
            match self.state.save_inventory(&done) {
                Ok(()) => {
                    self.inventory = done;
                    if let Err(err) = self.state.save_applied(received) {
                        tracing::warn!(error = %err, "cannot keep the bundle applied for the next prune; it will go in one step");
                    }
                }
                Err(err) => {
                    tracing::error!(error = %err, "applied, but cannot record it; will apply again");
                    // The inventory stays the intent.
                    let mut entries = done.entries;
                    entries.truncate(ours);
                    entries.extend(left);
                    self.inventory.entries = entries;
                    complete = false;
                }
            }
        }
        if complete {
            tracing::info!(digest = %bundle.digest, "{}", outcome.message);
        } else {
            tracing::error!(digest = %bundle.digest, "{}", outcome.message);
        }
        let message = match &self.delivery {
            Some(delivery) => format!("{} ({delivery})", outcome.message),
            None => outcome.message,
        };
        self.report = Arc::new(StatusReport {
            applied: self.inventory.applied.clone(),
            attempted: Some(bundle.digest.clone()),
            resources: outcome.resources,
            message,
            agent_version: AGENT_VERSION.to_string(),
            drift: Vec::new(),
            features: crate::FEATURES.iter().map(|f| f.to_string()).collect(),
        });
        self.publish();
        complete
    }

    fn progressing(&self) -> bool {
        self.report
            .resources
            .iter()
            .any(|r| r.state == ResourceState::Progressing)
    }

    /// Looks at the health of the applied bundle again and reports if it changed.
    async fn refresh_health(&mut self) {
        let Some(bundle) = self.desired.clone() else {
            return;
        };
        if self.report.attempted.as_ref() != Some(&bundle.digest) {
            return;
        }
        let Some(fresh) = self.sink.health(&bundle).await else {
            return;
        };
        if self.merge_health(fresh) {
            tracing::info!(
                healthy = self
                    .report
                    .resources
                    .iter()
                    .filter(|r| r.state == ResourceState::Healthy)
                    .count(),
                progressing = self
                    .report
                    .resources
                    .iter()
                    .filter(|r| r.state == ResourceState::Progressing)
                    .count(),
                "rollout progressed"
            );
            self.publish();
        }
    }

    /// Looks for drift in the applied bundle and reports what the sink found and did.
    /// Returns true when the bundle must be applied instead: the sink cannot look, or
    /// the bundle is not the one applied.
    async fn check_drift(&mut self) -> bool {
        let Some(bundle) = self.desired.clone() else {
            return false;
        };
        if self.report.applied.as_ref() != Some(&bundle.digest)
            || self.report.attempted.as_ref() != Some(&bundle.digest)
        {
            return true;
        }
        // Sealed Secrets are compared (and corrected) as they were applied: opened.
        let Ok(opened) = self.identity.open(&bundle) else {
            return true;
        };
        match self.sink.check_drift(&opened).await {
            DriftCheck::Unavailable => true,
            DriftCheck::Failed(message) => {
                tracing::warn!("{message}; looking again at the next resync");
                false
            }
            DriftCheck::Checked { drift, health } => {
                tracing::debug!(drifted = drift.len(), "resync: looked for drift");
                self.merge_health(health);
                if self.report.drift != drift {
                    Arc::make_mut(&mut self.report).drift = drift;
                }
                // An unchanged report is not sent again (see the reporter).
                self.publish();
                false
            }
        }
    }

    /// Puts fresh health lines into the report; returns whether any changed.
    fn merge_health(&mut self, fresh: Vec<ResourceStatus>) -> bool {
        let mut changed = false;
        for status in fresh {
            // The report is shared with the reporter: copied only when a line changes.
            if let Some(index) = self
                .report
                .resources
                .iter()
                .position(|r| r.state != ResourceState::Pruned && r.key == status.key)
                && self.report.resources[index] != status
            {
                Arc::make_mut(&mut self.report).resources[index] = status;
                changed = true;
            }
        }
        changed
    }

    fn publish(&self) {
        self.report_tx.send_replace(Some(self.report.clone()));
        // Observers subscribe before the agent runs (`Agent::reports`), so one that is
        // not there now never will be: an agent nobody embeds keeps no copy for them.
        if self.observers.receiver_count() > 0 {
            self.observers.send_replace(Some((*self.report).clone()));
        }
    }
}

/// The poller's state.
struct Poller {
    client: HubClient,
    cluster: String,
    state: Arc<StateDir>,
    waits: Waits,
    backoff: Backoff,
    sleeper: Arc<dyn Sleeper>,
    events: mpsc::Sender<Event>,
    /// The digest of the last-known-good bundle.
    current: Option<Digest>,
    /// The last-known-good document as stored, which the bundle the applier runs is
    /// made of (its resources are parts of it): the base of the next delta, at no
    /// cost beyond what runs.
    document: Option<Arc<Vec<u8>>>,
    /// The ETag that bundle came with, sent back as `If-None-Match`.
    etag: Option<String>,
    /// The keys whose signatures are accepted (none: digests only).
    trusted: TrustedKeys,
    /// `--tenant-policy`, if given.
    tenant_policy: Option<tenancy::TenantPolicy>,
    /// `--tenant-key`, if given.
    tenant_key: Option<flotilla_core::signing::PublicKey>,
    /// The sequence and digest of the last signed bundle accepted.
    held: Option<Held>,
    /// The last bundle offered was refused (and the report says so).
    refused: bool,
    /// Whether the next request offers the stored bundle as the base of a delta; off
    /// for one request after a delta failed.
    offer_delta: bool,
    /// Why the last delta failed, said with the full bundle that follows it.
    bad_delta: Option<String>,
    /// The sha256 of the last delta taken against the bundle this agent runs: the
    /// same delta again (a mirror's delta from that bundle to itself, read at every
    /// poll from a mirror without `deltas/current.sha256`) is the same document, not
    /// rebuilt and parsed again.
    taken_delta: Option<Digest>,
    /// The bundle last handed to the applier, while the applier has it: the next
    /// bundle takes the identities the two share from it.
    sent: Weak<Bundle>,
    /// The applier's reports: a mirror is read again only once the bundle handed over
    /// was attempted.
    attempts: watch::Receiver<Option<Arc<StatusReport>>>,
}

/// How long a mirror's next read waits at most for the applier to finish with the
/// bundle it was handed.
const MIRROR_WAITS_FOR_APPLY: Duration = Duration::from_secs(600);

/// What the report says of a bundle that came as a delta.
const AS_DELTA: &str = "received as a delta";

enum Verdict {
    New(Bundle, Option<Held>),
    Same,
    /// The bundle held, signed again with a higher sequence: stored, not applied again.
    Resigned(Held),
    Refused(Option<Digest>, String),
}

impl Poller {
    async fn run(mut self) {
        loop {
            let started = Instant::now();
            let wait = self.waits.next(started);
            let if_none_match = self
                .etag
                .clone()
                .or_else(|| self.current.as_ref().map(|d| format!("\"{d}\"")));
            let offer = std::mem::replace(&mut self.offer_delta, true);
            self.client
                .offer_dictionary(self.current.clone().filter(|_| offer));
            let fetched = self
                .client
                .fetch_bundle(if_none_match.as_deref(), wait)
                .await;
            // A delta is rebuilt into the document it stands for, then verified as one.
            let mut delta_seen = None;
            // The answer gives back the bundle held (a delta that rebuilds it).
            let mut held_again = false;
            // A mirror whose `current.sha256` names another document than the one held
            // has changed: a delta there that gives back the held document is a stale
            // file (a folder refreshed without deleting an older publish's deltas).
            let stale = |agent: &Self| {
                // Not when it names the document held (back after a refused one).
                let held = agent.document.as_deref().map(|d| Digest::of(d));
                let named = agent
                    .client
                    .mirror_names_another()
                    .filter(|n| Some(*n) != held.as_ref());
                named.map(|named| {
                    format!(
                        "the mirror's delta from the bundle held gives it back unchanged, but its deltas/current.sha256 names {named}: a delta file left from an older publish"
                    )
                })
            };
            let (fetched, as_delta) = match fetched {
                Ok(Fetched::Delta { body, .. })
                    if self.taken_delta.is_some()
                        && self.taken_delta == Some(Digest::of(&body)) =>
                {
                    if let Some(why) = stale(&self) {
                        self.taken_delta = None;
                        self.delta_failed(why, offer).await;
                        continue;
                    }
                    (Ok(Fetched::NotModified), false)
                }
                Ok(Fetched::Delta { body, etag }) => {
                    delta_seen = Some(Digest::of(&body));
                    let rebuilt = self.rebuild(&body);
                    drop(body);
                    match rebuilt {
                        Ok(Some(body)) => (Ok(Fetched::Bundle { body, etag }), true),
                        Ok(None) => {
                            if let Some(why) = stale(&self) {
                                self.delta_failed(why, offer).await;
                                continue;
                            }
                            held_again = true;
                            self.taken_delta = delta_seen.take();
                            // The document held is the mirror's again (after one it
                            // refused, say): its sha256 is what the next poll compares.
                            if let Some(document) = &self.document {
                                self.client.fetched_document(document);
                            }
                            (Ok(Fetched::NotModified), false)
                        }
                        Err(err) => {
                            self.delta_failed(err.to_string(), offer).await;
                            continue;
                        }
                    }
                }
                other => (other, false),
            };
            let delay = match fetched {
                Ok(Fetched::Delta { .. }) => Duration::ZERO,
                Ok(Fetched::NotModified) => {
                    self.backoff.reset();
                    // A hub's 304 names the bundle held (its ETag was asked for); a
                    // mirror's or a registry's "unchanged", or a document sent again
                    // and judged unchanged here, may be the refused one still.
                    let from_hub =
                        self.client.server_said_not_modified() && !self.client.is_mirror();
                    if (held_again || from_hub) && !self.offered_again().await {
                        return;
                    }
                    self.waits.answered(wait, started.elapsed())
                }
                Ok(Fetched::Bundle { body, etag }) => {
                    // Shared with the bundle made of it, not copied.
                    let body = Arc::new(body);
                    // A document rebuilt from a delta and held (stored, or the one
                    // held already) is the one to compare the next whole document
                    // with, not the one fetched whole before it; one refused or not
                    // stored is judged again when it comes whole.
                    let held_rebuilt = |client: &mut client::HubClient| {
                        if as_delta {
                            client.fetched_document(&body);
                        }
                    };
                    match self.judge(&body, etag.as_deref()) {
                        Verdict::Refused(_, message) if as_delta => {
                            self.delta_failed(message, offer).await;
                            continue;
                        }
                        Verdict::New(bundle, held) => match self.state.save_bundle(&body) {
                            Ok(()) => {
                                held_rebuilt(&mut self.client);
                                self.backoff.reset();
                                self.keep_held(held.as_ref());
                                self.held = held;
                                self.current = Some(bundle.digest.clone());
                                self.document = Some(body);
                                self.etag = etag;
                                // A delta against the bundle run before names another base.
                                self.taken_delta = None;
                                let delivery = if as_delta {
                                    Some(AS_DELTA.to_string())
                                } else {
                                    self.bad_delta.take().map(|why| {
                                        format!("fetched in full after a delta that failed: {why}")
                                    })
                                };
                                let bundle = Arc::new(bundle);
                                let digest = bundle.digest.clone();
                                self.sent = Arc::downgrade(&bundle);
                                if self
                                    .events
                                    .send(Event::Bundle(bundle, delivery))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                                if self.client.is_mirror() {
                                    // A mirror cannot hold a poll: asked again once per
                                    // wait, as when nothing changed, and not before the
                                    // applier has attempted this bundle (it takes no
                                    // other before), so that the next read's base and
                                    // document (on a mirror without `current.sha256`,
                                    // its delta from this bundle to itself is rebuilt
                                    // once) never join what an apply of many resources
                                    // holds.
                                    let attempted = |report: &Option<Arc<StatusReport>>| {
                                        report
                                            .as_ref()
                                            .is_some_and(|r| r.attempted.as_ref() == Some(&digest))
                                    };
                                    let _ = tokio::time::timeout(
                                        MIRROR_WAITS_FOR_APPLY,
                                        self.attempts.wait_for(attempted),
                                    )
                                    .await;
                                    self.waits.answered(wait, started.elapsed())
                                } else {
                                    // Ask again at once: the conditional long-poll waits
                                    // for the next change.
                                    Duration::ZERO
                                }
                            }
                            Err(err) => {
                                let message = format!(
                                    "bundle {} not applied: cannot store it as last-known-good: {err}",
                                    bundle.digest
                                );
                                tracing::error!("{message}");
                                // Not kept: the same document is taken again, after
                                // the back-off, not answered "not modified".
                                self.client.forget_fetched_document();
                                if !self.refuse(Some(bundle.digest), message).await {
                                    return;
                                }
                                self.backoff.next_delay(None)
                            }
                        },
                        Verdict::Same => {
                            held_rebuilt(&mut self.client);
                            self.backoff.reset();
                            self.etag = etag;
                            self.taken_delta = delta_seen;
                            if !self.offered_again().await {
                                return;
                            }
                            self.waits.answered(wait, started.elapsed())
                        }
                        Verdict::Resigned(held) => {
                            self.backoff.reset();
                            self.etag = etag;
                            if !self.offered_again().await {
                                return;
                            }
                            match self.state.save_bundle(&body) {
                                Ok(()) => {
                                    held_rebuilt(&mut self.client);
                                    self.keep_held(Some(&held));
                                    self.held = Some(held);
                                    self.document = Some(body);
                                }
                                Err(err) => tracing::warn!(
                                    error = %err,
                                    "cannot store the bundle's newer signature; the older one stays held"
                                ),
                            }
                            self.waits.answered(wait, started.elapsed())
                        }
                        Verdict::Refused(claimed, message) => {
                            tracing::error!("{message}");
                            if !self.refuse(claimed, message).await {
                                return;
                            }
                            self.backoff.next_delay(None)
                        }
                    }
                }
                // A held poll cut on the way (a proxy's idle timeout): asked again
                // at once, held shorter.
                Err(err)
                    if err.kind() == FailureKind::Transient
                        && self.waits.failed(
                            wait,
                            started.elapsed(),
                            err.ending(),
                            Instant::now(),
                        ) =>
                {
                    Duration::ZERO
                }
                // Answered with what this agent cannot take: reported, so the hub
                // shows why, while it keeps what it runs.
                Err(err) if err.is_refusal() => {
                    let message = format!("{err}; keeping the last-known-good bundle");
                    tracing::error!("{message}");
                    let claimed = err.refused_digest();
                    if !self.refuse(claimed, message).await {
                        return;
                    }
                    self.backoff.next_delay(err.retry_after())
                }
                Err(err) => match err.kind() {
                    FailureKind::Auth => {
                        let delay = self.backoff.auth_delay();
                        tracing::error!(
                            error = %err, retry_in = ?delay,
                            "the hub refused this agent's token; it keeps running the last-known-good bundle"
                        );
                        delay
                    }
                    FailureKind::Transient => {
                        let delay = self.backoff.next_delay(err.retry_after());
                        tracing::warn!(error = %err, retry_in = ?delay, failures = self.backoff.failures(), "cannot fetch the bundle");
                        delay
                    }
                },
            };
            if !delay.is_zero() {
                self.sleeper.sleep(delay).await;
            }
        }
    }

    /// The document a delta stands for, rebuilt against the stored bundle (which must
    /// be the one this agent runs); `None` when it is the stored document byte for
    /// byte (a mirror's delta from the bundle it serves to itself): nothing new.
    fn rebuild(&self, body: &[u8]) -> Result<Option<Vec<u8>>, delta::DeltaError> {
        // The document held, as served, holds the base's canonical body when it has no
        // metadata: used where it lies, it costs no read, no parse and no copy beyond
        // what runs. `decode` checks its digest.
        if let Some(document) = &self.document
            && let Some(dictionary) = bundle::resource_list_in_document(document)
        {
            match delta::decode(body, self.current.as_ref(), dictionary) {
                Err(delta::DeltaError::NoBase(_)) => {}
                Ok(rebuilt) if rebuilt == **document => return Ok(None),
                rebuilt => return rebuilt.map(Some),
            }
        }
        // With metadata, the body is written out of the stored document (in place,
        // while it is used).
        let mut stored = match self.state.load_document_bytes() {
            Ok(Some(stored)) => stored,
            Ok(None) => return Err(delta::DeltaError::NoBase("there is none".into())),
            Err(err) => return Err(delta::DeltaError::NoBase(err.to_string())),
        };
        match bundle::with_body_in_document(&mut stored, |dictionary| {
            delta::decode(body, self.current.as_ref(), dictionary)
        }) {
            None | Some(Err(delta::DeltaError::NoBase(_))) => {}
            Some(Ok(rebuilt)) if rebuilt == stored => return Ok(None),
            Some(rebuilt) => return rebuilt.map(Some),
        }
        drop(stored);
        // Stored in another layout (or damaged): read and verified as any document.
        let dictionary = match self.state.load_document(&self.cluster) {
            Ok(Some((_, document))) if Some(&document.bundle.digest) == self.current.as_ref() => {
                document.bundle.canonical_body()
            }
            Ok(Some(_)) => {
                return Err(delta::DeltaError::NoBase(
                    "it is not the bundle this agent runs".into(),
                ));
            }
            Ok(None) => return Err(delta::DeltaError::NoBase("there is none".into())),
            Err(err) => return Err(delta::DeltaError::NoBase(err.to_string())),
        };
        delta::decode(body, self.current.as_ref(), &dictionary).map(Some)
    }

    /// Keeps the sequence of a signed bundle just stored beside it (`held.json`), so
    /// that it stays held should the bundle's file be damaged and set aside; a bundle
    /// taken unsigned (no `--trust-key`) holds none, and the file goes.
    fn keep_held(&self, held: Option<&Held>) {
        let kept = match held {
            Some(held) => self.state.save_held(held),
            None => self.state.forget_held(),
        };
        if let Err(err) = kept {
            tracing::warn!(error = %err, "cannot keep the sequence held beside the bundle");
        }
    }

    /// A delta that could not be rebuilt or verified: nothing of it is kept, and the
    /// next request, at once, asks for the full document. A server that sends a delta
    /// it was not asked for is waited for as after any failure.
    async fn delta_failed(&mut self, why: String, asked: bool) {
        tracing::warn!(
            "a delta from {} failed ({why}); fetching the full document",
            self.client.server()
        );
        self.offer_delta = false;
        self.bad_delta = Some(why);
        if !asked {
            self.sleeper.sleep(self.backoff.next_delay(None)).await;
        }
    }

    /// Verifies a received document.
    fn judge(&self, body: &Arc<Vec<u8>>, etag: Option<&str>) -> Verdict {
        let previous = self.sent.upgrade();
        let verified =
            bundle::verify_shared_document_after(body, Some(&self.cluster), previous.as_deref());
        drop(previous);
        let document = match verified {
            Ok(document) => document,
            Err(err) => {
                // A document too broken to name its digest (too deep to read, say) is
                // still reported against the digest its ETag names, so the hub shows
                // the cluster failed on it rather than pending.
                return Verdict::Refused(
                    claimed_digest(body).or_else(|| etag.and_then(digest_of_etag)),
                    format!(
                        "refused the bundle from {}: {err}; keeping the last-known-good bundle",
                        self.client.server()
                    ),
                );
            }
        };
        if let Some(etag_digest) = etag.and_then(digest_of_etag)
            && etag_digest != document.bundle.digest
        {
            return Verdict::Refused(
                Some(etag_digest.clone()),
                format!(
                    "refused the bundle from {}: its ETag says {etag_digest} but its resources hash to {}; keeping the last-known-good bundle",
                    self.client.server(),
                    document.bundle.digest
                ),
            );
        }
        let bundle = document.bundle;
        if let Err(why) = self.keeps_tenant_rules(&bundle) {
            return Verdict::Refused(
                Some(bundle.digest.clone()),
                format!(
                    "refused the bundle {} from {}: {why}; keeping the last-known-good bundle",
                    bundle.digest,
                    self.client.server()
                ),
            );
        }
        if self.trusted.is_empty() {
            return if self.current.as_ref() == Some(&bundle.digest) {
                Verdict::Same
            } else {
                Verdict::New(bundle, None)
            };
        }
        if let Err(err) = self.trusted.check(
            &self.cluster,
            &bundle.digest,
            &document.revision,
            document.signature.as_ref(),
            self.held.as_ref(),
        ) {
            return Verdict::Refused(
                Some(bundle.digest.clone()),
                format!(
                    "refused the bundle {} from {}: {err}; keeping the last-known-good bundle",
                    bundle.digest,
                    self.client.server()
                ),
            );
        }
        // A trusted document is signed (an unsigned one was refused above).
        let held = document.signature.map(|signature| Held {
            sequence: signature.sequence,
            digest: bundle.digest.clone(),
        });
        if self.current.as_ref() == Some(&bundle.digest) {
            match held {
                Some(held) if self.held.as_ref() != Some(&held) => Verdict::Resigned(held),
                _ => Verdict::Same,
            }
        } else {
            Verdict::New(bundle, held)
        }
    }

    /// Whether the bundle keeps its tenants' rules: those signed by `--tenant-key`
    /// (required then), else `--tenant-policy`'s, else the bundle's own marks.
    fn keeps_tenant_rules(&self, bundle: &Bundle) -> Result<(), String> {
        let signed = match &self.tenant_key {
            Some(key) => Some(tenancy::signed_policy(bundle, key)?),
            None => None,
        };
        match tenancy::refusal(bundle, signed.as_ref().or(self.tenant_policy.as_ref())) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    async fn refuse(&mut self, claimed: Option<Digest>, message: String) -> bool {
        self.refused = true;
        self.events
            .send(Event::Refused { claimed, message })
            .await
            .is_ok()
    }

    /// The bundle held was offered again: after a refusal, the report says the
    /// refusal no longer stands. False when the applier is gone.
    async fn offered_again(&mut self) -> bool {
        let Some(current) = self.current.clone().filter(|_| self.refused) else {
            return true;
        };
        self.refused = false;
        self.events.send(Event::OfferedAgain(current)).await.is_ok()
    }
}

/// The digest a document claims, if it has a well-formed one (read without building
/// the document's tree: only the `digest` field is kept).
fn claimed_digest(body: &[u8]) -> Option<Digest> {
    #[derive(serde::Deserialize)]
    struct Claim {
        digest: Option<String>,
    }
    let claim: Claim = serde_json::from_slice(body).ok()?;
    Digest::parse(&claim.digest?).ok()
}

/// The digest in a flotilla ETag (`"sha256:…"`, possibly weak). Other ETags, as a
/// static web server makes them, are not digests and are only echoed back.
fn digest_of_etag(etag: &str) -> Option<Digest> {
    let etag = etag.strip_prefix("W/").unwrap_or(etag);
    Digest::parse(etag.trim_matches('"')).ok()
}

/// The reporter's state.
struct Reporter {
    client: HubClient,
    /// Reports go to the server bundles come from (no `--report-to`), which may be a
    /// static mirror that takes none.
    to_bundle_server: bool,
    state: Arc<StateDir>,
    backoff: Backoff,
    sleeper: Arc<dyn Sleeper>,
    heartbeat: Duration,
}

impl Reporter {
    async fn run(mut self, mut reports: watch::Receiver<Option<Arc<StatusReport>>>) {
        let mut accepts = self.client.server().accepts_status();
        // A report left unsent by the previous run is sent first.
        let mut pending = reports.borrow_and_update().clone();
        // The report in status.json, and whether it is marked sent there.
        let mut kept: Option<(Arc<StatusReport>, bool)> = None;
        let mut last_sent: Option<Arc<StatusReport>> = None;
        let mut heartbeat_due = false;
        loop {
            let Some(report) = pending.take() else {
                // Nothing new: wait for a report, or send the last one again when a
                // heartbeat is set and due.
                let heartbeat = async {
                    match (&last_sent, self.heartbeat.is_zero()) {
                        (Some(_), false) => tokio::time::sleep(self.heartbeat).await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = reports.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        pending = reports.borrow_and_update().clone();
                    }
                    () = heartbeat => {
                        pending = last_sent.clone();
                        heartbeat_due = true;
                    }
                }
                continue;
            };
            if last_sent.as_ref() == Some(&report) && !heartbeat_due {
                // The hub has this report already (a resync that changed nothing).
                continue;
            }
            heartbeat_due = false;
            if kept.as_ref().is_none_or(|(k, _)| *k != report) {
                self.keep(&report, false);
                kept = Some((report.clone(), false));
            }
            if !accepts {
                continue;
            }
            match self.client.send_status(&report).await {
                Ok(()) => {
                    self.backoff.reset();
                    if kept.as_ref().is_some_and(|(_, sent)| !sent) {
                        self.keep(&report, true);
                        kept = Some((report.clone(), true));
                    }
                    last_sent = Some(report);
                }
                // A static web server (a mirror) answers a POST with 405 or 501: it
                // takes no reports, and is not asked again.
                Err(client::FetchError::Status { status, .. })
                    if (status == 405 || status == 501) && self.to_bundle_server =>
                {
                    tracing::info!(
                        status,
                        "the server takes no status reports (a static mirror): they are kept in the state folder's status.json only; give --report-to the hub's URL to send them"
                    );
                    accepts = false;
                }
                Err(err) => {
                    let delay = match err.kind() {
                        FailureKind::Auth => self.backoff.auth_delay(),
                        FailureKind::Transient => self.backoff.next_delay(err.retry_after()),
                    };
                    tracing::warn!(error = %err, retry_in = ?delay, "cannot send the status report; it is kept and sent later");
                    tokio::select! {
                        () = self.sleeper.sleep(delay) => pending = Some(report),
                        changed = reports.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            // Only the latest report matters.
                            pending = reports.borrow_and_update().clone();
                        }
                    }
                }
            }
        }
    }

    fn keep(&self, report: &StatusReport, sent: bool) {
        if let Err(err) = self.state.save_status(sent, report) {
            tracing::error!(error = %err, "cannot keep the status report");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_that_are_digests_are_recognised() {
        let digest = Digest::of(b"x");
        assert_eq!(
            digest_of_etag(&format!("\"{digest}\"")),
            Some(digest.clone())
        );
        assert_eq!(digest_of_etag(&format!("W/\"{digest}\"")), Some(digest));
        assert_eq!(digest_of_etag("\"5f3c-1a2b\""), None);
    }
}
