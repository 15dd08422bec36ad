//! Exponential back-off with full jitter, and the sleeper the network-facing loops wait
//! on (injectable, so tests observe every wait without spending it).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How an agent waits after failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The ceiling of the first wait; each failure doubles it.
    pub base: Duration,
    /// No wait is longer than this (except what a server asks for with Retry-After).
    pub cap: Duration,
    /// The longest wait after the hub refused the token (401, 403). Short: the one
    /// who fixes the token file is waiting for the agent to take it (the file is read
    /// again before the next request), and a refused request costs the hub little.
    pub auth_retry: Duration,
}

/// The default of [`BackoffPolicy::auth_retry`].
pub const AUTH_RETRY: Duration = Duration::from_secs(30);

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(5 * 60),
            auth_retry: AUTH_RETRY,
        }
    }
}

/// The floor of every wait, so that a jitter of zero never turns into a busy loop.
const MIN_WAIT: Duration = Duration::from_millis(50);
/// A Retry-After longer than this is treated as this (a misconfigured server must not
/// silence an agent for days).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);

/// The state of one back-off sequence: how many failures in a row.
#[derive(Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    failures: u32,
    rng: StdRng,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy) -> Backoff {
        Backoff::with_rng(policy, StdRng::from_os_rng())
    }

    pub fn with_rng(policy: BackoffPolicy, rng: StdRng) -> Backoff {
        Backoff {
            policy,
            failures: 0,
            rng,
        }
    }

    /// A success: the next failure starts from the base again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The ceiling of the next wait: `min(cap, base * 2^failures)`.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.failures.min(31)).unwrap_or(u32::MAX);
        self.policy
            .base
            .checked_mul(factor)
            .unwrap_or(self.policy.cap)
            .min(self.policy.cap)
    }

    /// The wait after one more failure: uniformly random between zero and the
    /// ceiling ("full jitter"), but at least what the server asked for.
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        let jittered = self.jitter(Duration::ZERO, ceiling).max(MIN_WAIT);
        match retry_after {
            Some(asked) => jittered.max(asked.min(MAX_RETRY_AFTER)),
            None => jittered,
        }
    }

    /// The wait after an authentication failure: the ceiling doubles from the base
    /// as for any failure, but stops at `auth_retry`; the wait is between half and all
    /// of it, so agents refused together do not all come back together.
    pub fn auth_delay(&mut self) -> Duration {
        let ceiling = self.ceiling().min(self.policy.auth_retry);
        self.failures = self.failures.saturating_add(1);
        self.jitter(ceiling / 2, ceiling).max(MIN_WAIT)
    }

    fn jitter(&mut self, low: Duration, high: Duration) -> Duration {
        if high <= low {
            return low;
        }
        let nanos = self
            .rng
            .random_range(low.as_nanos() as u64..=high.as_nanos() as u64);
        Duration::from_nanos(nanos)
    }
}

/// A boxed future, as the sleeper returns.
pub type SleepFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Something that waits. The agent's loops wait through this, so tests can record
/// every wait and let it pass at once.
pub trait Sleeper: Send + Sync {
    fn sleep(&self, duration: Duration) -> SleepFuture;
}

/// Waits on the tokio clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioSleeper;

impl Sleeper for TokioSleeper {
    fn sleep(&self, duration: Duration) -> SleepFuture {
        Box::pin(tokio::time::sleep(duration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff::with_rng(BackoffPolicy::default(), StdRng::seed_from_u64(7))
    }

    #[test]
    fn waits_grow_exponentially_up_to_the_cap_with_full_jitter() {
        let mut backoff = backoff();
        let mut ceilings = Vec::new();
        for _ in 0..12 {
            let ceiling = backoff.ceiling();
            let delay = backoff.next_delay(None);
            assert!(delay <= ceiling.max(MIN_WAIT), "{delay:?} > {ceiling:?}");
            ceilings.push(ceiling.as_secs());
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    #[test]
    fn jitter_spreads_waits_over_the_whole_range() {
        // Many agents failing together must not retry together: over many draws at
        // the cap, waits land in every fifth of the range.
        let mut backoff = backoff();
        let mut fifths = [0u32; 5];
        for _ in 0..500 {
            backoff.failures = 20;
            let delay = backoff.next_delay(None);
            let fifth = (delay.as_secs_f64() / 60.0).floor() as usize;
            fifths[fifth.min(4)] += 1;
        }
        assert!(fifths.iter().all(|&n| n > 50), "{fifths:?}");
    }

    #[test]
    fn retry_after_is_a_floor_and_is_bounded() {
        let mut backoff = backoff();
        assert!(backoff.next_delay(Some(Duration::from_secs(7))) >= Duration::from_secs(7));
        assert_eq!(
            backoff.next_delay(Some(Duration::from_secs(10 * 24 * 3600))),
            MAX_RETRY_AFTER
        );
    }

    #[test]
    fn reset_starts_again_from_the_base() {
        let mut backoff = backoff();
        for _ in 0..6 {
            backoff.next_delay(None);
        }
        backoff.reset();
        assert!(backoff.next_delay(None) <= Duration::from_secs(1));
    }

    #[test]
    fn authentication_failures_retry_from_a_second_doubling_to_thirty() {
        let mut backoff = backoff();
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            let ceiling = backoff.ceiling().min(AUTH_RETRY);
            let delay = backoff.auth_delay();
            assert!(
                delay >= ceiling / 2 && delay <= ceiling,
                "{delay:?} outside {ceiling:?}"
            );
            ceilings.push(ceiling.as_secs());
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
