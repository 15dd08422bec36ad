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
//! served, the reports and the rollouts again ([`Recorder::reload`](crate::recorder::Recorder::reload)) and wakes
//! the long-polls of the clusters whose bundle changed. A poll answered 304 still
//! touches neither the database nor the objects.
//!
//! Every hub writes a heartbeat to the `hubs` table every third of the lease's length
//! ([`Recorder::heartbeat`](crate::recorder::Recorder::heartbeat)); a hub is **live** while its heartbeat is younger than the lease's
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
use std::time::Duration;

use crate::recorder::Shared;
use crate::recorder::lease::monotonic_ms;
use crate::recorder::reload::Reload;
pub use crate::recorder::{Lease, PeerTiming, ROLLOUT_LEASE};

/// Takes and renews the lease; when this hub becomes the holder it first reads the
/// rollouts back from the database (another hub may have moved them on).
pub async fn run_lease(shared: Arc<Shared>, timing: PeerTiming) {
    let mut shutdown = shared.shutdown.subscribe();
    let ttl_ms = i64::try_from(timing.lease_ttl.as_millis()).unwrap_or(i64::MAX);
    loop {
        if let Err(err) = shared.recorder.heartbeat().await {
            tracing::warn!("cannot write this hub's heartbeat: {err}");
            shared.metrics.database_error();
        }
        let asked_at = monotonic_ms();
        match shared.recorder.ask_for_lease(ttl_ms).await {
            Ok(Some(epoch)) => {
                // Valid for the lease's length less a margin, counted from before the
                // request: the database's clock decides, this only errs early.
                match shared
                    .recorder
                    .lease_granted(epoch, asked_at + ttl_ms * 2 / 3)
                    .await
                {
                    Ok(true) => shared.look_now.notify_one(),
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(
                            "took the rollout lease but cannot read the database: {err}"
                        );
                        continue_after(&mut shutdown, timing.lease_ttl / 3).await;
                        continue;
                    }
                }
            }
            Ok(None) => shared.recorder.lease_lost(),
            Err(err) => {
                tracing::warn!("cannot renew the rollout lease: {err}");
                shared.metrics.database_error();
            }
        }
        if !continue_after(&mut shutdown, timing.lease_ttl / 3).await {
            // No longer among the live hubs that must see a force-push.
            shared.recorder.leave().await;
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
        match shared.view.reads().changes().await {
            Ok(current) if Some(current) == seen => shared.metrics.database_ok(),
            Ok(current) => match shared.recorder.reload(Reload::Changed).await {
                Ok(_) => {
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
