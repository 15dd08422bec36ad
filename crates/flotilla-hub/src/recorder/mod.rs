//! The hub's one writer. Request handlers and background tasks read the [`View`];
//! every change — a render recorded, a status report, an operator's action, a
//! rollout's timer, a token or session, the store read back — goes through the
//! [`Recorder`], which owns the active rollouts, the lease and every store write, and
//! updates the view after each write.
//!
//! - [`rollouts`]: renders and reports decided by the pure decisions of
//!   `flotilla_core::rollout`, written in one transaction, then applied.
//! - [`reload`]: the store read into memory, at start and when the database moved on.
//! - [`lease`]: which of several hubs on one database records and decides.
//! - [`view`]: what the handlers read.
//! - [`workloads`]: each resource's workload per digest, as this hub's renders said.

pub mod lease;
pub mod reload;
pub mod rollouts;
pub mod view;
pub mod workloads;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;
use tokio::sync::{Notify, watch};

use crate::HubError;
use crate::auth::{AuthError, Grant, TokenTable};
use crate::metrics::Metrics;
use crate::store::{ObjectError, Store, StoreError, StoredStatus};
use flotilla_core::bundle::Digest;
use flotilla_core::status::StatusReport;
use flotilla_render::RenderOutput;
pub use lease::{Lease, PeerTiming, ROLLOUT_LEASE};
use rollouts::RolloutBook;
use view::latest_of;
pub use view::{
    ClusterBundle, Encoding, InstallReport, Latest, Membership, Pulse, Served, Settings, View,
};

/// What the request handlers and the background tasks share: the view they read,
/// the recorder that changes it, and what neither owns (settings, metrics, the
/// shutdown signal, the follower's wake-up, the first answers' permits).
/// How long a hub may be silent (no heartbeat) before the store forgets it.
pub const SILENT_HUBS_FORGOTTEN_AFTER: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

pub struct Shared {
    pub view: Arc<View>,
    pub recorder: Recorder,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// Set once on shutdown; held long-polls return at once.
    pub shutdown: watch::Sender<bool>,
    /// Wakes the follower: a webhook, a file-system event.
    pub look_now: Arc<Notify>,
    /// How many documents are read and compressed at once for a first answer (see
    /// [`answer_permits`]): after a commit that changes every cluster, 10,000 woken
    /// long-polls each make one.
    pub answering: tokio::sync::Semaphore,
}

impl Shared {
    pub fn new(store: Store, settings: Settings, lease: Lease, metrics: Metrics) -> Shared {
        let store = Arc::new(store);
        let settings = Arc::new(settings);
        // A hub alone on its database holds the lease from the start; one sharing it
        // is told when it takes the lease (`lease_granted`).
        metrics.lease_held(lease.holds());
        let metrics = Arc::new(metrics);
        let view = Arc::new(View::new(store.clone(), settings.clone()));
        let answering = tokio::sync::Semaphore::new(answer_permits(&store));
        Shared {
            recorder: Recorder {
                view: view.clone(),
                settings: settings.clone(),
                metrics: metrics.clone(),
                store,
                rollouts: RolloutBook::default(),
                lease,
                token_recheck: Default::default(),
            },
            view,
            settings,
            metrics,
            shutdown: watch::channel(false).0,
            look_now: Arc::new(Notify::new()),
            answering,
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Every change of what the hub holds goes through here; see the module's doc.
pub struct Recorder {
    view: Arc<View>,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    store: Arc<Store>,
    /// The rollouts: their state, decisions and timer.
    rollouts: RolloutBook,
    /// Whether this hub records renders and decides rollouts (several hubs).
    lease: Lease,
    /// When the store was last asked for tokens because a request brought an
    /// unknown one (see [`Recorder::grant`]).
    token_recheck: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

/// The shortest time between two looks into the store for an unknown token.
const TOKEN_RECHECK: Duration = Duration::from_millis(250);
/// How many bundles' objects are made and written at a time after a render.
const OBJECTS_PER_BATCH: usize = 512;

/// How many first answers are made at once: one per core with objects in a
/// folder (reading one is a page-cache copy; compressing it is the work), 16 with
/// a remote object store (most of a read is waiting). Unbounded, 10,000 woken
/// long-polls took up to the runtime's 512 blocking threads, each with a
/// compressor's buffers of its own, on two cores.
pub fn answer_permits(store: &Store) -> usize {
    if store.objects.is_local() {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    } else {
        16
    }
}

/// Why a status report was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ReportRefused {
    #[error("no cluster named {0:?} is served")]
    NotServed(String),
    #[error(transparent)]
    Store(#[from] crate::StoreError),
}

impl Recorder {
    /// What a request's token grants. A token the table does not know may have been
    /// made a moment ago by `flotilla token create`: the store is asked again before
    /// the token is refused (at most every 250 ms, however many unknown tokens
    /// arrive), so a new token works at once, not only after the next refresh.
    pub async fn grant(&self, header: Option<&HeaderValue>) -> Result<Grant, AuthError> {
        self.grant_with_id(header).await.map(|(grant, _)| grant)
    }

    /// [`Recorder::grant`], with the token's id (recorded with operator actions).
    pub async fn grant_with_id(
        &self,
        header: Option<&HeaderValue>,
    ) -> Result<(Grant, String), AuthError> {
        fn owned((grant, id): (&Grant, &str)) -> (Grant, String) {
            (grant.clone(), id.to_string())
        }
        match self.view.tokens().check_with_id(header) {
            Err(AuthError::Unknown) => {}
            known => return known.map(owned),
        }
        {
            let mut last = self.token_recheck.lock().await;
            if last.is_none_or(|at| at.elapsed() >= TOKEN_RECHECK) {
                *last = Some(tokio::time::Instant::now());
                match self.store.tokens().await {
                    Ok(tokens) => self.view.set_tokens(TokenTable::from_stored(&tokens)),
                    Err(err) => tracing::warn!("cannot look for new tokens: {err}"),
                }
            }
        }
        self.view.tokens().check_with_id(header).map(owned)
    }

    /// Reads what the last clean render gives each cluster back from the store.
    pub async fn load_latest(&self) -> Result<(), crate::StoreError> {
        let latest = latest_of(self.store.rendered().await?);
        self.view.set_latest(latest);
        Ok(())
    }

    /// What is served to a cluster the store records (at start, or read back from a
    /// store several hubs share), `since` when it was first served. The cluster's
    /// pulse is made on first use and kept for as long as the hub runs. Such an entry
    /// names no digest it replaced ([`ClusterBundle::replaced`]): what this hub saw
    /// before may be older than the store's history (another hub may have served
    /// others in between, or trimmed the history to its own `--history`).
    pub(crate) fn serve_stored(
        &self,
        cluster: crate::store::StoredCluster,
        since: Option<i64>,
    ) -> Arc<ClusterBundle> {
        let pulse = self.view.pulse(&cluster.name);
        Arc::new(ClusterBundle::serving(
            cluster.name,
            cluster.digest,
            cluster.revision,
            cluster.hold,
            pulse,
            cluster.sequence,
            since,
        ))
    }

    /// Reads every served object back and deletes any that no longer hashes to its
    /// digest, so the next render writes it again (until then its cluster answers 500,
    /// never the damaged bytes). Runs before the follower starts. Objects in a remote
    /// store are checked as they are read instead (one request per cluster at every
    /// start would be too many).
    pub async fn verify_objects(&self) {
        if !self.store.objects.is_local() {
            return;
        }
        let digests: Vec<Digest> = self
            .view
            .served()
            .clusters
            .values()
            .map(|c| c.digest.clone())
            .collect();
        for digest in digests {
            if let Err(err @ ObjectError::Corrupt { .. }) = self.store.objects.read(&digest).await {
                tracing::error!("{err}");
                let _ = self.store.objects.remove(&digest).await;
            }
        }
    }

    /// Forgets what the store would otherwise keep for ever: rollouts that ended more
    /// than [`Settings::keep_rollouts`] ago (the latest of each policy and those of the
    /// recorded revision stay), and
    /// hubs silent for [`SILENT_HUBS_FORGOTTEN_AFTER`]. Only the rollout lease's
    /// holder (or a hub alone on its database) does it, between renders.
    pub async fn forget_history(&self) {
        if self.lease.is_shared() && !self.lease.holds() {
            return;
        }
        let keep = i64::try_from(self.settings.keep_rollouts.as_millis()).unwrap_or(i64::MAX);
        let ended_before = self.settings.clock.now_ms().saturating_sub(keep);
        match self.store.forget_rollouts(ended_before).await {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(
                rollouts = forgotten,
                keep = %humantime::format_duration(self.settings.keep_rollouts),
                "forgot rollouts that ended longer ago than --keep-rollouts"
            ),
            Err(err) => tracing::warn!("cannot forget old rollouts: {err}"),
        }
        let silent = i64::try_from(SILENT_HUBS_FORGOTTEN_AFTER.as_millis()).unwrap_or(i64::MAX);
        if let Err(err) = self.store.forget_silent_hubs(silent).await {
            tracing::warn!("cannot forget hubs long silent: {err}");
        }
    }

    /// Deletes objects the store does not refer to (see
    /// [`Store::referenced_digests`]). Only the follower writes new objects of renders
    /// this hub records, and it calls this between renders, so no object of a render
    /// being installed is taken. Returns how many objects were deleted.
    ///
    /// Alone on its database, a hub deletes every unreferenced object at once (those a
    /// crash left between writing a render's objects and recording it). With several
    /// hubs only the rollout lease's holder collects, and only objects unreferenced
    /// for at least [`Settings::gc_grace`] on the database's clock: another hub may
    /// have written an object for a render the holder records a moment later.
    pub async fn collect_garbage(&self) -> usize {
        let shared = self.lease.is_shared();
        if shared && !self.lease.holds() {
            return 0;
        }
        let objects = &self.store.objects;
        let unreferenced = match self.unreferenced_objects().await {
            Ok(unreferenced) => unreferenced,
            Err(err) => {
                tracing::warn!("cannot collect unused objects: {err}");
                return 0;
            }
        };
        let due: Vec<Digest> = if shared {
            let grace = i64::try_from(self.settings.gc_grace.as_millis()).unwrap_or(i64::MAX);
            let due = match self.store.mark_unreferenced(&unreferenced, grace).await {
                Ok(due) => due,
                Err(err) => {
                    tracing::warn!("cannot collect unused objects: {err}");
                    return 0;
                }
            };
            // Asked again just before deleting: a rollout step may have named one of
            // them since the listing.
            match self.store.referenced_digests().await {
                Ok(referenced) => due
                    .into_iter()
                    .filter(|d| !referenced.contains(d))
                    .collect(),
                Err(err) => {
                    tracing::warn!("cannot collect unused objects: {err}");
                    return 0;
                }
            }
        } else {
            unreferenced.into_iter().collect()
        };
        let mut deleted = Vec::new();
        for digest in due {
            if shared && !self.lease.holds() {
                break;
            }
            match objects.remove(&digest).await {
                Ok(()) => deleted.push(digest),
                Err(err) => tracing::warn!(%digest, "cannot delete an unused object: {err}"),
            }
        }
        if shared && let Err(err) = self.store.forget_unreferenced(&deleted).await {
            tracing::warn!("cannot record the deleted objects: {err}");
        }
        if !deleted.is_empty() {
            tracing::info!(
                objects = deleted.len(),
                "deleted objects no cluster refers to"
            );
        }
        deleted.len()
    }

    /// The stored objects nothing in the database refers to.
    async fn unreferenced_objects(&self) -> Result<std::collections::BTreeSet<Digest>, HubError> {
        let referenced = self.store.referenced_digests().await?;
        Ok(self
            .store
            .objects
            .list()
            .await?
            .into_iter()
            .filter(|d| !referenced.contains(d))
            .collect())
    }

    /// Writes the objects of a render this hub does not record (several hubs), so it
    /// can serve them when the database says so.
    pub async fn install_objects_only(&self, output: &RenderOutput) -> Result<(), HubError> {
        let written = self.write_objects(output).await?;
        self.metrics.objects_written(written as u64);
        Ok(())
    }

    /// Writes the objects of a render's new digests, off the async threads. Digests a
    /// cluster is served or was last rendered with are there already (referenced
    /// objects are never deleted), unless a file went missing on disk (deleted, or
    /// found corrupt at start): those are written again. New digests are written when
    /// absent (in S3, one HEAD each first).
    async fn write_objects(&self, output: &RenderOutput) -> Result<usize, HubError> {
        self.store.objects.forget_recent();
        let current = self.view.served();
        let latest = self.view.latest();
        let objects_to_write: Vec<(Digest, Arc<flotilla_core::bundle::Bundle>)> = {
            let mut seen = std::collections::BTreeSet::new();
            output
                .bundles
                .values()
                .filter(|b| {
                    let known = latest.get(&b.cluster).is_some_and(|l| l.digest == b.digest)
                        || current
                            .clusters
                            .get(&b.cluster)
                            .is_some_and(|c| c.digest == b.digest);
                    !known || self.store.objects.known_missing(&b.digest)
                })
                .filter(|b| seen.insert(b.digest.clone()))
                .map(|b| (b.digest.clone(), Arc::new(b.clone())))
                .collect()
        };
        if objects_to_write.is_empty() {
            return Ok(0);
        }
        // A batch at a time: the bytes of 10,000 bundles of per-cluster templates are
        // hundreds of megabytes, and need not all be held at once.
        let mut written = 0;
        let mut pending = objects_to_write.into_iter().peekable();
        while pending.peek().is_some() {
            let batch: Vec<_> = pending.by_ref().take(OBJECTS_PER_BATCH).collect();
            let bytes = tokio::task::spawn_blocking(move || {
                batch
                    .iter()
                    .map(|(digest, bundle)| (digest.clone(), bundle.canonical_body()))
                    .collect::<Vec<_>>()
            })
            .await?;
            written += self.store.objects.write_all(bytes).await?;
        }
        Ok(written)
    }

    /// Records a render attempt that had errors: nothing served changes.
    pub fn record_failed_render(&self, output: &RenderOutput, duration: Duration) {
        let errors: Vec<_> = output.errors().cloned().collect();
        for error in &errors {
            tracing::error!(revision = %output.revision, "render error: {error}");
        }
        tracing::error!(
            revision = %output.revision,
            errors = errors.len(),
            "the commit does not render; the last good bundles stay served"
        );
        let now = self.settings.clock.now_ms();
        self.view.update_render_status(|r| {
            r.attempted_revision = Some(output.revision.clone());
            r.attempted_at_ms = Some(now);
            r.duration = Some(duration);
            r.errors = errors;
            r.warnings = output.warnings().cloned().collect();
            r.renders_failed += 1;
        });
    }

    /// Installs a clean render: writes the objects of new digests, then records what
    /// HEAD renders and what changes for whom in one transaction (ungoverned and new
    /// clusters at once; governed ones through a rollout of their policy), then swaps
    /// what is served. A cluster whose served digest does not change keeps its entry
    /// (and its revision), so its ETag and bytes stay the same.
    pub async fn install(
        &self,
        output: &RenderOutput,
        duration: Duration,
        forced: bool,
        expect_revision: Option<Option<String>>,
    ) -> Result<InstallReport, HubError> {
        debug_assert!(output.is_clean());
        let started = Instant::now();
        let written = self.write_objects(output).await?;
        self.metrics.objects_written(written as u64);
        let objects_duration = started.elapsed();

        // Known before anything of the render is served, so the page never finds a
        // served digest of it without its workloads; pruned once what is served moved.
        let workloads = self.view.known_workloads().with_render(output);
        self.view.set_known_workloads(workloads.clone());

        let now = self.settings.clock.now_ms();
        let recording = Instant::now();
        let outcome = self
            .record_render(output, forced, now, expect_revision)
            .await?;
        let record_duration = outcome
            .swapped_at
            .map(|at| at.saturating_duration_since(recording));
        if self.lease.is_shared() && !self.lease.holds() {
            // Another hub records renders: serve what it recorded, now that this
            // hub has the objects too.
            self.reload(reload::Reload::Changed).await?;
        }
        self.view.set_membership(Membership::of_render(output));
        let served = self.view.served();
        self.view.set_known_workloads(
            workloads.pruned(output, served.clusters.values().map(|c| &c.digest)),
        );
        let report = InstallReport {
            revision: output.revision.clone(),
            clusters: output.bundles.len(),
            changed: outcome.served_changes,
            removed: outcome.removed,
            rollouts_started: outcome.rollouts_started,
            objects_written: written,
            objects_duration,
            record_duration,
            render_duration: duration,
            install_duration: started.elapsed(),
        };
        self.view.update_render_status(|r| {
            r.served_revision = Some(output.revision.clone());
            r.attempted_revision = Some(output.revision.clone());
            r.attempted_at_ms = Some(now);
            r.duration = Some(duration);
            r.errors.clear();
            r.install_error = None;
            r.warnings = output.warnings().cloned().collect();
            r.renders_clean += 1;
            r.charts = output.charts.clone();
        });
        Ok(report)
    }
}

impl Recorder {
    /// Writes this hub's heartbeat (several hubs on one database).
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        lease::heartbeat(
            &self.store,
            self.lease.holder(),
            self.settings.database_clock.as_deref(),
        )
        .await
    }

    /// Asks the database for the rollout lease (taken or renewed for `ttl_ms`): its
    /// epoch when this hub holds it.
    pub async fn ask_for_lease(&self, ttl_ms: i64) -> Result<Option<i64>, StoreError> {
        self.store
            .acquire_lease(ROLLOUT_LEASE, self.lease.holder(), ttl_ms)
            .await
    }

    /// The hub stops: it leaves the live hubs and gives the lease back if it held it.
    /// Errors are ignored (the heartbeat and the lease lapse by themselves).
    pub async fn leave(&self) {
        let _ = self.store.leave(self.lease.holder()).await;
        if self.lease.epoch() != 0 {
            let _ = self
                .store
                .release_lease(ROLLOUT_LEASE, self.lease.holder())
                .await;
        }
    }

    /// Records how many polls in a row this hub has seen a force-pushed `tip`
    /// (`None`: none pending).
    pub async fn see_tip(&self, tip: Option<&str>, polls: i64) -> Result<(), StoreError> {
        self.store.see_tip(self.lease.holder(), tip, polls).await
    }

    /// The seed Helm charts' generated values derive from, made on first use.
    pub async fn helm_seed(&self) -> Result<[u8; 32], StoreError> {
        self.store.helm_seed().await
    }

    /// Closes the store's connections (the hub is stopping).
    pub async fn close(&self) {
        self.store.close().await;
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Marks the hub ready to answer: it has something to serve, or tried once.
    pub fn set_ready(&self) {
        self.view.set_ready();
    }

    /// A cluster polled its bundle with its own token.
    pub fn saw(&self, entry: &ClusterBundle, now_ms: i64) {
        entry.pulse.see(now_ms);
    }

    /// A poll of the cluster's own agent found it lacks `missing` features for the
    /// bundle it is served (none: it can take it).
    pub fn agent_lacks(&self, entry: &ClusterBundle, missing: &[&str]) {
        entry.pulse.lack(flotilla_core::bundle::features::bits(
            missing.iter().copied(),
        ));
    }

    /// A poll ended with the cluster holding the digest it is served.
    pub fn fetched(&self, entry: &ClusterBundle, now_ms: i64) {
        entry.pulse.fetch(now_ms);
    }

    /// Wakes the rollouts' timer: a cluster fetched a new digest, so a wave waiting
    /// on it may move on.
    pub fn wake_rollouts(&self) {
        self.rollouts.wake.notify_one();
    }

    /// Records a cluster's status report: in the store, in the view, and in the
    /// rollout it takes part in, which decides again before this returns (so an
    /// agent that reads the fleet next sees the decision). A failed decision is
    /// logged, not returned: the report is recorded.
    pub async fn report(&self, cluster: &str, report: StatusReport) -> Result<(), ReportRefused> {
        let entry = self
            .view
            .served_to(cluster)
            .ok_or_else(|| ReportRefused::NotServed(cluster.to_string()))?;
        let status = StoredStatus {
            cluster: cluster.to_string(),
            report,
            received_at_ms: self.settings.clock.now_ms(),
        };
        self.store.put_status(&status).await?;
        entry.pulse.see(status.received_at_ms);
        self.view
            .statuses_mut()
            .insert(cluster.to_string(), status.clone());
        self.metrics.status_received();
        if let Err(err) = self
            .report_to_rollouts(cluster, &status.report, status.received_at_ms)
            .await
        {
            if err.is_concurrent_change() {
                // Read again and decided by the next report or the rollout timer.
                tracing::info!(cluster, "rollouts changed meanwhile: {err}");
            } else {
                tracing::error!(
                    cluster,
                    "cannot decide on the rollouts after a report: {err}"
                );
            }
        }
        Ok(())
    }

    /// Changes what the view says of renders (the follower's findings).
    pub fn update_render_status(&self, update: impl FnOnce(&mut crate::fleet::RenderStatus)) {
        self.view.update_render_status(update);
    }

    /// Puts in a new table of tokens.
    pub fn set_tokens(&self, tokens: TokenTable) {
        self.view.set_tokens(tokens);
    }

    /// Reloads tokens from the store now.
    pub async fn reload_tokens(&self) -> Result<(), HubError> {
        let tokens = self.store.tokens().await?;
        self.view.set_tokens(TokenTable::from_stored(&tokens));
        Ok(())
    }

    /// Records a web page session.
    pub async fn open_session(
        &self,
        session: &crate::store::StoredSession,
    ) -> Result<(), crate::StoreError> {
        self.store.insert_session(session).await
    }

    /// Ends a web page session.
    pub async fn close_session(&self, id_hash: &str) -> Result<(), crate::StoreError> {
        self.store.delete_session(id_hash).await
    }

    /// The database gave this hub the rollout lease at `epoch`, valid until
    /// `valid_until_ms` on this process's clock. A lease newly taken is acted on only
    /// once the store is read back (the last holder's decisions). Returns whether it
    /// was newly taken.
    pub async fn lease_granted(&self, epoch: i64, valid_until_ms: i64) -> Result<bool, HubError> {
        let newly = self.lease.epoch() != epoch;
        if newly {
            self.lease.lose();
            self.reload(reload::Reload::Changed).await?;
            tracing::info!(
                epoch,
                holder = self.lease.holder(),
                "this hub now records renders and decides rollouts"
            );
            self.lease.ask_render_again();
        }
        self.lease.hold(epoch, valid_until_ms);
        self.metrics.lease_held(true);
        self.rollouts.wake.notify_one();
        Ok(newly)
    }

    /// The database gave the rollout lease to another hub (or none).
    pub fn lease_lost(&self) {
        if self.lease.epoch() != 0 {
            tracing::warn!("another hub took the rollout lease over");
        }
        self.lease.lose();
        self.metrics.lease_held(false);
    }

    /// At start: gives the agents the offline threshold to be heard from before a
    /// wave is released and offline clusters are told apart. The store's record of
    /// when each cluster was last seen stops when the hub stopped (or never began, on
    /// a new store): nobody could reach a hub that was down, so that record cannot
    /// tell an offline cluster from one that has not polled this hub yet.
    pub fn settle_from_now(&self) {
        let offline_after =
            i64::try_from(self.settings.offline_after.as_millis()).unwrap_or(i64::MAX);
        self.rollouts
            .hold_releases_until(self.settings.clock.now_ms().saturating_add(offline_after));
    }
}
