//! Several hubs on one PostgreSQL database.
//!
//! Every hub follows the repository, renders each commit and writes its objects, and
//! serves what the database records. One hub at a time — the holder of the
//! [`ROLLOUT_LEASE`] in the database, renewed on the database's clock and taken over
//! by another hub when it lapses — records renders and takes rollout decisions; each
//! of its writes checks the lease's epoch in the same transaction ([`Fence`]), so a
//! hub that lost the lease without noticing writes nothing. A render is recorded only
//! when its commit descends from the one recorded (checked by the follower, and the
//! recorded revision compared again inside the transaction).
//!
//! Every hub polls one row ([`Store::changes`]) and, when it moved, reads what is
//! served, the reports and the rollouts again ([`Shared::sync_from_store`]) and wakes
//! the long-polls of the clusters whose bundle changed. A poll answered 304 still
//! touches neither the database nor the objects.
//!
//! Every hub writes a heartbeat to the `hubs` table every third of the lease's length
//! ([`heartbeat`]); a hub is **live** while its heartbeat is younger than the lease's
//! length on the database's clock (a hub that stops cleanly leaves the table at once).
//! The heartbeat's answer is the database's time, from which each hub keeps the
//! offset of the database's clock ([`DatabaseClock`]): every time that decides (bake,
//! deadlines, offline, reports' arrival) is the database's, so hubs whose own clocks
//! disagree still decide alike. The live hubs are those that must agree before a
//! force-pushed tip is recorded (see `crate::follow`).
//!
//! With the embedded SQLite file there is one hub: it always holds the lease, its own
//! clock decides, and nothing here runs.
//!
//! [`DatabaseClock`]: crate::clock::DatabaseClock
//!
//! [`Store::changes`]: crate::store::Store::changes

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::HubError;
use crate::clock::DatabaseClock;
use crate::state::{Served, Shared};
use crate::store::{Fence, Store, StoreError, StoredStatus};

/// The lease that names the hub recording renders and deciding rollouts.
pub const ROLLOUT_LEASE: &str = "rollouts";

/// This hub's view of the lease.
#[derive(Debug)]
pub struct Lease {
    /// Whether several hubs may share the database (PostgreSQL).
    shared: bool,
    /// This hub's name in the lease table: random per process.
    holder: String,
    /// The epoch held; 0 when not held.
    epoch: AtomicI64,
    /// Until when (ms on this machine's monotonic-ish clock) the hub may act on it
    /// without renewing: a hub that cannot reach the database stops deciding.
    valid_until_ms: AtomicI64,
    /// Set when this hub takes the lease: the follower renders HEAD again even if
    /// it saw it before (it did not record it then).
    render_again: std::sync::atomic::AtomicBool,
}

impl Lease {
    /// One hub alone on its database: always the holder, never fenced.
    pub fn alone() -> Lease {
        Lease {
            shared: false,
            holder: String::new(),
            epoch: AtomicI64::new(0),
            valid_until_ms: AtomicI64::new(0),
            render_again: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A hub on a database others may share: holds nothing until it takes the lease.
    pub fn shared() -> Lease {
        Lease {
            shared: true,
            holder: format!("hub-{:016x}", rand::random::<u64>()),
            epoch: AtomicI64::new(0),
            valid_until_ms: AtomicI64::new(0),
            render_again: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn is_shared(&self) -> bool {
        self.shared
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether this hub may record renders and decide rollouts now.
    pub fn holds(&self) -> bool {
        !self.shared
            || (self.epoch.load(Ordering::Acquire) > 0
                && monotonic_ms() < self.valid_until_ms.load(Ordering::Acquire))
    }

    /// The fence every write of the holder carries (none when alone).
    pub fn fence(&self) -> Option<Fence> {
        let epoch = self.epoch.load(Ordering::Acquire);
        (self.shared && epoch > 0).then(|| Fence {
            lease: ROLLOUT_LEASE.to_string(),
            holder: self.holder.clone(),
            epoch,
        })
    }

    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the follower should render HEAD again (once per taking of the lease).
    pub fn take_render_again(&self) -> bool {
        self.render_again.swap(false, Ordering::AcqRel)
    }

    fn lose(&self) {
        self.epoch.store(0, Ordering::Release);
    }
}

/// Milliseconds since this process started: a clock that only moves forward.
fn monotonic_ms() -> i64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    i64::try_from(start.elapsed().as_millis()).unwrap_or(i64::MAX)
}

/// How the hubs keep in step: the lease's length and how often the database is
/// looked at for changes.
#[derive(Clone, Copy, Debug)]
pub struct PeerTiming {
    /// How long a lease lasts unless renewed (renewed every third of it).
    pub lease_ttl: Duration,
    /// How often the one row that says "something changed" is read.
    pub sync_interval: Duration,
}

impl Default for PeerTiming {
    fn default() -> PeerTiming {
        PeerTiming {
            lease_ttl: Duration::from_secs(15),
            sync_interval: Duration::from_secs(1),
        }
    }
}

/// Marks this hub live in the database and, given the hub's database clock, samples
/// the database's time from the same round trip.
pub async fn heartbeat(
    store: &Store,
    holder: &str,
    clock: Option<&DatabaseClock>,
) -> Result<(), StoreError> {
    let sent = clock.map(DatabaseClock::local_ms);
    let database_ms = store.heartbeat(holder).await?;
    if let (Some(clock), Some(sent)) = (clock, sent) {
        clock.sample(database_ms, sent, clock.local_ms());
    }
    Ok(())
}

/// Takes and renews the lease; when this hub becomes the holder it first reads the
/// rollouts back from the database (another hub may have moved them on).
pub async fn run_lease(shared: Arc<Shared>, timing: PeerTiming) {
    let mut shutdown = shared.shutdown.subscribe();
    let ttl_ms = i64::try_from(timing.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    loop {
        let beat = heartbeat(
            &shared.store,
            shared.lease.holder(),
            shared.settings.database_clock.as_deref(),
        )
        .await;
        if let Err(err) = beat {
            tracing::warn!("cannot write this hub's heartbeat: {err}");
            shared.metrics.database_error();
        }
        let asked_at = monotonic_ms();
        match shared
            .store
            .acquire_lease(ROLLOUT_LEASE, shared.lease.holder(), ttl_ms)
            .await
        {
            Ok(Some(epoch)) => {
                let previous = shared.lease.epoch();
                if previous != epoch {
                    // Not ours a moment ago: read what the last holder decided first.
                    shared.lease.lose();
                    if let Err(err) = shared.sync_from_store().await {
                        tracing::warn!(
                            "took the rollout lease but cannot read the database: {err}"
                        );
                        continue_after(&mut shutdown, timing.lease_ttl / 3).await;
                        continue;
                    }
                    if let Err(err) = shared.load_rollouts().await {
                        tracing::warn!(
                            "took the rollout lease but cannot read the rollouts: {err}"
                        );
                        continue_after(&mut shutdown, timing.lease_ttl / 3).await;
                        continue;
                    }
                    tracing::info!(
                        epoch,
                        holder = shared.lease.holder(),
                        "this hub now records renders and decides rollouts"
                    );
                    shared.lease.render_again.store(true, Ordering::Release);
                }
                // Valid for the lease's length less a margin, counted from before the
                // request: the database's clock decides, this only errs early.
                shared
                    .lease
                    .valid_until_ms
                    .store(asked_at + ttl_ms * 2 / 3, Ordering::Release);
                shared.lease.epoch.store(epoch, Ordering::Release);
                shared.metrics.lease_held(true);
                shared.rollouts.wake.notify_one();
                if previous != epoch {
                    shared.look_now.notify_one();
                }
            }
            Ok(None) => {
                if shared.lease.epoch() != 0 {
                    tracing::warn!("another hub took the rollout lease over");
                }
                shared.lease.lose();
                shared.metrics.lease_held(false);
            }
            Err(err) => {
                tracing::warn!("cannot renew the rollout lease: {err}");
                shared.metrics.database_error();
            }
        }
        if !continue_after(&mut shutdown, timing.lease_ttl / 3).await {
            // No longer among the live hubs that must see a force-push.
            let _ = shared.store.leave(shared.lease.holder()).await;
            if shared.lease.epoch() != 0 {
                let _ = shared
                    .store
                    .release_lease(ROLLOUT_LEASE, shared.lease.holder())
                    .await;
            }
            return;
        }
    }
}

/// Sleeps `every`; false when the hub is shutting down.
async fn continue_after(
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    every: Duration,
) -> bool {
    if *shutdown.borrow() {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(every) => true,
        _ = shutdown.changed() => false,
    }
}

/// Reads one row every `sync_interval` and the rest when it moved.
pub async fn run_sync(shared: Arc<Shared>, timing: PeerTiming) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut seen: Option<i64> = None;
    loop {
        if !continue_after(&mut shutdown, timing.sync_interval).await {
            return;
        }
        match shared.store.changes().await {
            Ok(current) if Some(current) == seen => shared.metrics.database_ok(),
            Ok(current) => match shared.sync_from_store().await {
                Ok(()) => {
                    seen = Some(current);
                    shared.metrics.database_ok();
                }
                Err(err) => {
                    tracing::warn!("cannot read what the database records: {err}");
                    shared.metrics.database_error();
                }
            },
            Err(err) => {
                tracing::warn!("cannot reach the database; serving what this hub has: {err}");
                shared.metrics.database_error();
            }
        }
    }
}

impl Shared {
    /// Brings this hub in step with the database: what each cluster is served (a
    /// cluster whose bundle did not change keeps its entry, so its ETag and cached
    /// bytes stay; one whose object this hub has not written yet keeps what it had
    /// until its own render writes it), what HEAD renders, the reports and when
    /// clusters were seen, and, on a hub without the lease, the rollouts. The holder
    /// decides again on the reports other hubs received.
    pub async fn sync_from_store(&self) -> Result<(), HubError> {
        for (cluster, at) in self.store.seen().await? {
            self.pulse(&cluster).see(at);
        }
        let statuses = self.store.statuses().await?;
        let mut new_reports: Vec<StoredStatus> = Vec::new();
        {
            let mut known = self.statuses.write().unwrap_or_else(|e| e.into_inner());
            for status in &statuses {
                if known.get(&status.cluster) != Some(status) {
                    new_reports.push(status.clone());
                }
                self.pulse(&status.cluster).see(status.received_at_ms);
            }
            *known = statuses
                .into_iter()
                .map(|s| (s.cluster.clone(), s))
                .collect();
        }

        let recorded = self.store.clusters().await?;
        let since = self.store.served_since().await?;
        let current = self.served.load_full();
        let mut next = Served::default();
        let mut changed = false;
        for cluster in recorded {
            let existing = current.clusters.get(&cluster.name);
            let same = existing.is_some_and(|e| {
                e.digest == cluster.digest
                    && e.hold == cluster.hold
                    && e.revision == cluster.revision
                    && e.sequence == cluster.sequence
            });
            if same {
                if let Some(entry) = existing {
                    next.clusters.insert(cluster.name.clone(), entry.clone());
                }
                continue;
            }
            // Not written here yet (objects in each hub's own state dir): keep what is
            // served until this hub's render writes it. Shared objects are written
            // before the holder records them, and are not asked for.
            if self.store.objects.known_missing(&cluster.digest) {
                if let Some(entry) = existing {
                    next.clusters.insert(cluster.name.clone(), entry.clone());
                }
                continue;
            }
            changed = true;
            let since = since.get(&cluster.name).copied();
            next.clusters
                .insert(cluster.name.clone(), self.serve_stored(cluster, since));
        }
        if changed || next.clusters.len() != current.clusters.len() {
            self.swap(next);
        }

        self.load_latest().await?;
        let revision = self.store.revision().await?;
        self.update_render_status(|r| {
            if r.force_push.as_ref().map(|f| &f.revision) == revision.as_ref() {
                // The force-pushed tip was recorded (by the lease holder).
                r.force_push = None;
            }
            r.served_revision = revision;
        });

        if self.lease.holds() {
            for status in new_reports {
                self.report_to_rollouts(&status.cluster, &status.report, status.received_at_ms)
                    .await?;
            }
        } else {
            self.load_rollouts().await?;
        }
        Ok(())
    }
}
