//! Time as the hub sees it, injectable so tests can move it without sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;

    /// For a clock moved by hand: notified each time it moves, so that timers set on
    /// it (the rollouts' next bake end, say) look again. `None` for the wall clock.
    fn advanced(&self) -> Option<&Notify> {
        None
    }

    /// Milliseconds since the Unix epoch, as the store records times.
    fn now_ms(&self) -> i64 {
        to_ms(self.now())
    }
}

pub fn to_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The wall clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
    advanced: Notify,
}

impl ManualClock {
    pub fn new(start: SystemTime) -> ManualClock {
        ManualClock {
            now: Mutex::new(start),
            advanced: Notify::new(),
        }
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
        drop(now);
        self.advanced.notify_one();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn advanced(&self) -> Option<&Notify> {
        Some(&self.advanced)
    }
}

/// The wall clock moved by a fixed amount: a machine whose clock is wrong (tests
/// inject it to check that several hubs decide on the database's clock).
#[derive(Debug)]
pub struct SkewedClock {
    /// Milliseconds added to the wall clock (negative: behind).
    pub skew_ms: i64,
}

impl Clock for SkewedClock {
    fn now(&self) -> SystemTime {
        let skew = Duration::from_millis(self.skew_ms.unsigned_abs());
        if self.skew_ms >= 0 {
            SystemTime::now() + skew
        } else {
            SystemTime::now() - skew
        }
    }
}

/// Several hubs on one database: the database's clock, kept on each hub as an offset
/// from its own clock. The offset is sampled at every heartbeat (the database answers
/// with its time, taken as that of the middle of the round trip), so every hub decides
/// on the same time within a round trip, whatever its own clock says. Between samples
/// time moves with the hub's own clock; a new sample may move it by the round trip's
/// jitter, either way.
pub struct DatabaseClock {
    local: Arc<dyn Clock>,
    offset_ms: AtomicI64,
}

impl DatabaseClock {
    /// Until the first sample, the hub's own clock.
    pub fn new(local: Arc<dyn Clock>) -> DatabaseClock {
        DatabaseClock {
            local,
            offset_ms: AtomicI64::new(0),
        }
    }

    /// The hub's own clock, in milliseconds since the Unix epoch (for timing a sample).
    pub fn local_ms(&self) -> i64 {
        self.local.now_ms()
    }

    /// Takes the database's time `database_ms`, read by a request sent at `sent_ms`
    /// and answered at `answered_ms` on the hub's own clock.
    pub fn sample(&self, database_ms: i64, sent_ms: i64, answered_ms: i64) {
        let middle = sent_ms + (answered_ms.saturating_sub(sent_ms)) / 2;
        self.offset_ms
            .store(database_ms.saturating_sub(middle), Ordering::Release);
    }

    /// How far the database's clock is ahead of the hub's own (negative: behind).
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for DatabaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseClock")
            .field("offset_ms", &self.offset_ms())
            .finish_non_exhaustive()
    }
}

impl Clock for DatabaseClock {
    fn now(&self) -> SystemTime {
        let local = self.local.now();
        let offset = self.offset_ms();
        let by = Duration::from_millis(offset.unsigned_abs());
        if offset >= 0 {
            local + by
        } else {
            local.checked_sub(by).unwrap_or(UNIX_EPOCH)
        }
    }

    fn advanced(&self) -> Option<&Notify> {
        self.local.advanced()
    }
}

/// An RFC 3339 timestamp for JSON output.
pub fn rfc3339(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_clock_is_the_hubs_own_moved_by_the_sampled_offset() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let local = Arc::new(ManualClock::new(start));
        let clock = DatabaseClock::new(local.clone());
        assert_eq!(clock.now(), start, "the hub's own clock until a sample");
        // The database is an hour behind; the answer took 40 ms.
        let own = to_ms(start);
        clock.sample(own - 3_600_000 + 20, own, own + 40);
        assert_eq!(clock.offset_ms(), -3_600_000);
        assert_eq!(clock.now_ms(), own - 3_600_000);
        // It moves with the hub's own clock between samples.
        local.advance(Duration::from_secs(90));
        assert_eq!(clock.now_ms(), own - 3_600_000 + 90_000);
        assert!(
            clock.advanced().is_some(),
            "timers still wake on a manual clock"
        );
        // Ahead now.
        let own = local.now_ms();
        clock.sample(own + 5_000, own, own);
        assert_eq!(clock.now_ms(), own + 5_000);
    }

    #[test]
    fn a_skewed_clock_is_the_wall_clock_moved() {
        let ahead = SkewedClock { skew_ms: 7_200_000 }.now_ms() - SystemClock.now_ms();
        assert!((7_199_000..=7_201_000).contains(&ahead), "{ahead}");
        let behind = SkewedClock { skew_ms: -60_000 }.now_ms() - SystemClock.now_ms();
        assert!((-61_000..=-59_000).contains(&behind), "{behind}");
    }
}
