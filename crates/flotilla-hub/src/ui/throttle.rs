//! Failed logins to the web page, throttled per client: a token bucket per client
//! address that each failed login empties by one and that refills with time. A
//! client with an empty bucket is answered `429` with `Retry-After` before its token
//! is even looked at, so guessing admin tokens costs time; a good login costs nothing.
//!
//! Clients are told apart by their address: an IPv4 address, or the /64 network of an
//! IPv6 one (one machine is usually given a whole /64, and could otherwise change
//! address at every attempt). Behind a reverse proxy every client has the proxy's
//! address, so the proxy's own limits are the ones that tell clients apart there.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

/// Failed logins a client may make at once.
pub const BURST: u32 = 10;
/// Then one more failed login per this many milliseconds (10 a minute).
pub const REFILL_MS: u64 = 6_000;
/// The most clients remembered; beyond it the ones that have been quiet longest go.
const MAX_CLIENTS: usize = 10_000;

/// Who is throttled: an IPv4 address or an IPv6 /64 network; `None` for a request
/// that came without an address (a router served by other means).
pub type Client = Option<IpAddr>;

/// The client a peer address counts as.
pub fn client_of(peer: Option<IpAddr>) -> Client {
    peer.map(|ip| match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        },
    })
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Failed logins left, in thousandths (so refills need no floating point).
    milli: u64,
    /// When `milli` was last brought up to date.
    at_ms: u64,
}

const FULL: u64 = BURST as u64 * 1000;

impl Bucket {
    /// The bucket at `now_ms`, refilled for the time since it was last seen.
    fn at(self, now_ms: u64) -> Bucket {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        let refill = elapsed.saturating_mul(1000) / REFILL_MS;
        Bucket {
            milli: self.milli.saturating_add(refill).min(FULL),
            at_ms: now_ms.max(self.at_ms),
        }
    }
}

/// The failed logins of every client.
#[derive(Debug, Default)]
pub struct LoginThrottle {
    buckets: Mutex<HashMap<Client, Bucket>>,
}

impl LoginThrottle {
    /// Counts an attempt to log in of `client` before its token is looked at, so
    /// that attempts sent at once cannot all pass while the first ones are looked
    /// up: `Err(seconds)` to wait when its bucket is empty; otherwise whether this
    /// attempt emptied it. A login that succeeds gives its attempt back
    /// ([`LoginThrottle::succeeded`]): only failed ones cost.
    pub fn attempt(&self, client: Client, now_ms: u64) -> Result<bool, u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_CLIENTS && !buckets.contains_key(&client) {
            forget_quietest(&mut buckets, now_ms);
        }
        let bucket = buckets.get(&client).map_or(
            Bucket {
                milli: FULL,
                at_ms: now_ms,
            },
            |b| b.at(now_ms),
        );
        if bucket.milli < 1000 {
            let missing = 1000 - bucket.milli;
            return Err((missing * REFILL_MS).div_ceil(1000 * 1000).max(1));
        }
        let after = Bucket {
            milli: bucket.milli - 1000,
            ..bucket
        };
        buckets.insert(client, after);
        Ok(after.milli < 1000)
    }

    /// Gives back the attempt of a login of `client` that succeeded.
    pub fn succeeded(&self, client: Client, now_ms: u64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(&client) {
            let now = bucket.at(now_ms);
            *bucket = Bucket {
                milli: (now.milli + 1000).min(FULL),
                ..now
            };
        }
    }
}

/// Drops the buckets that are full again, or else the quarter seen longest ago.
fn forget_quietest(buckets: &mut HashMap<Client, Bucket>, now_ms: u64) {
    buckets.retain(|_, bucket| bucket.at(now_ms).milli < FULL);
    if buckets.len() >= MAX_CLIENTS {
        let mut times: Vec<u64> = buckets.values().map(|b| b.at_ms).collect();
        times.sort_unstable();
        let cut = times[times.len() / 4];
        buckets.retain(|_, bucket| bucket.at_ms > cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_burst_then_one_attempt_per_refill() {
        let throttle = LoginThrottle::default();
        let (a, b) = (
            client_of(Some([10, 0, 0, 1].into())),
            client_of(Some([10, 0, 0, 2].into())),
        );
        // Counted as they come, before any is looked up: a burst sent at once on
        // one connection gets no more than its bucket.
        for n in 1..=BURST {
            assert_eq!(throttle.attempt(a, 0), Ok(n == BURST), "attempt {n}");
        }
        assert_eq!(throttle.attempt(a, 0), Err(REFILL_MS / 1000));
        assert_eq!(
            throttle.attempt(b, 0),
            Ok(false),
            "another client is not held back"
        );
        assert_eq!(throttle.attempt(a, REFILL_MS - 1), Err(1));
        assert_eq!(
            throttle.attempt(a, REFILL_MS),
            Ok(true),
            "one attempt, and empty again"
        );
        assert_eq!(
            throttle.attempt(a, REFILL_MS + BURST as u64 * REFILL_MS),
            Ok(false)
        );
    }

    #[test]
    fn a_login_that_succeeds_costs_nothing() {
        let throttle = LoginThrottle::default();
        let c = client_of(Some([10, 0, 0, 3].into()));
        for n in 0..BURST * 3 {
            assert_eq!(throttle.attempt(c, 0), Ok(false), "login {n}");
            throttle.succeeded(c, 0);
        }
    }

    #[test]
    fn an_ipv6_network_counts_as_one_client() {
        let one: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().expect("ip");
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().expect("ip");
        assert_eq!(client_of(Some(one)), client_of(Some(other)));
        assert_ne!(client_of(Some(one)), client_of(Some(elsewhere)));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().expect("ip");
        assert_eq!(
            client_of(Some(mapped)),
            client_of(Some([10, 0, 0, 1].into()))
        );
    }
}
