//! The lease that names the one hub, of several on a database, that records renders
//! and decides rollouts, and the timing of the hubs' heartbeats and polls.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::clock::DatabaseClock;
use crate::store::{Fence, Store, StoreError};

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

    /// The fence every write of the holder carries (none when alone). A hub that
    /// lost the lease while it worked (epoch 0) still fences its write, with an epoch
    /// no lease has, so the store refuses it: without a fence the write would go
    /// through unchecked.
    pub fn fence(&self) -> Option<Fence> {
        let epoch = self.epoch.load(Ordering::Acquire);
        self.shared.then(|| Fence {
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

    pub(in crate::recorder) fn lose(&self) {
        self.epoch.store(0, Ordering::Release);
    }

    /// Held at `epoch` until `valid_until_ms` on this process's clock.
    pub(in crate::recorder) fn hold(&self, epoch: i64, valid_until_ms: i64) {
        self.valid_until_ms.store(valid_until_ms, Ordering::Release);
        self.epoch.store(epoch, Ordering::Release);
    }

    pub(in crate::recorder) fn ask_render_again(&self) {
        self.render_again.store(true, Ordering::Release);
    }
}

/// Milliseconds since this process started: a clock that only moves forward.
pub(crate) fn monotonic_ms() -> i64 {
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
/// the database's time from the same round trip. `serve` calls it once at start,
/// before the recorder exists; afterwards [`Recorder::heartbeat`](super::Recorder::heartbeat).
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
