//! Time as the hub sees it, injectable so tests can move it without sleeping.

use std::sync::Mutex;
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
