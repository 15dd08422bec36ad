//! How long the agent asks the hub to hold each poll.
//!
//! An idle agent's cost on the wire is one poll per wait, so the longer a poll is held
//! the less an idle site pays. How long a poll may be held is not the agent's or the
//! hub's to decide alone: a proxy or load balancer on the way may end a request that
//! has been silent for longer than its idle timeout (60 s for nginx's
//! `proxy_read_timeout` and AWS load balancers, 30 s on some cloud balancers, 100 s
//! at some CDNs), and a NAT may forget a silent connection.
//!
//! With `--wait auto` (the default) the agent asks for [`LONGEST_WAIT`] and learns
//! from the path: a held poll that ends in an error before its wait is up, at least
//! [`SHORTEST_CUT`] after it was sent (a gateway's 502 or 504, or the connection
//! closed), was cut by something on the way after that long, so polls are held a
//! little less from then on ([`CUT_MARGIN`] less, never under [`FLOOR`]) and the
//! cut poll is asked again at once. A poll that gets no answer at all (the request
//! timed out) says nothing of when the path failed: polls are then held at most
//! [`SAFE_WAIT`]. Paths change (an agent moves, a balancer is reconfigured, or the
//! cut was the hub dying), so a shortened agent asks for the longest wait again once
//! every [`RETRY_LONGER`]; if that poll is answered, the longest wait is kept.
//!
//! With a fixed `--wait D` the agent asks for `D` every time and learns nothing.
//! Either way, a server that answers at once (a static server or a folder, which
//! cannot hold a poll) is asked again only after the rest of the wait (`D`, or
//! [`SAFE_WAIT`] with `auto`), never in a busy loop.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tokio::time::Instant;

/// The longest the agent asks a poll to be held with `--wait auto`: under the hub's
/// default `--offline-after` (5 minutes), with a minute to spare, since a cluster
/// whose poll is held counts as seen when the poll began and when it is answered.
pub const LONGEST_WAIT: Duration = Duration::from_secs(240);
/// The wait of a path that went silent: under the 60 s idle timeouts common proxies
/// and load balancers apply by default, with 5 s to spare for the round trip.
pub const SAFE_WAIT: Duration = Duration::from_secs(55);
/// A failure sooner than this after the poll was sent is an ordinary failure (a
/// refused connection, a hub restarting), not a path cutting a held poll.
pub const SHORTEST_CUT: Duration = Duration::from_secs(15);
/// How much shorter than the cut the next polls are held.
pub const CUT_MARGIN: Duration = Duration::from_secs(5);
/// The shortest wait the agent learns.
pub const FLOOR: Duration = Duration::from_secs(10);
/// How long a shortened wait is kept before the longest is tried again.
pub const RETRY_LONGER: Duration = Duration::from_secs(3600);
/// A server that answers an unchanged poll sooner than this did not hold it.
const HELD: Duration = Duration::from_secs(10);

/// The `--wait` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Hold polls as long as the path to the hub allows, up to [`LONGEST_WAIT`].
    #[default]
    Auto,
    /// Ask for this wait every time.
    Fixed(Duration),
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Auto => f.write_str("auto"),
            Wait::Fixed(wait) => write!(f, "{}", humantime::format_duration(*wait)),
        }
    }
}

impl FromStr for Wait {
    type Err = String;

    fn from_str(text: &str) -> Result<Wait, String> {
        if text == "auto" {
            return Ok(Wait::Auto);
        }
        let wait = humantime::parse_duration(text)
            .map_err(|err| format!("{err} (write `auto`, or a duration like 30s or 2m)"))?;
        if wait.is_zero() {
            return Err("a wait must be longer than 0s".to_string());
        }
        Ok(Wait::Fixed(wait))
    }
}

/// How a poll that was not answered ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Something on the way ended it: a gateway's 502 or 504, or the connection
    /// closed or reset.
    Cut,
    /// No answer came before the agent gave up on it.
    Silent,
    /// Any other failure: the hub's own error, a refused connection, a bad answer.
    Other,
}

/// The wait the poller asks for, and what it learnt of the path.
#[derive(Debug)]
pub struct Waits {
    setting: Wait,
    /// What polls are held for now (with `auto`: the longest, or what was learnt).
    current: Duration,
    /// When `current` was last shortened (with `auto`).
    shortened: Option<Instant>,
    /// Whether the poll in flight tries the longest wait again.
    retrying: bool,
}

impl Waits {
    pub fn new(setting: Wait) -> Waits {
        let current = match setting {
            Wait::Auto => LONGEST_WAIT,
            Wait::Fixed(wait) => wait,
        };
        Waits {
            setting,
            current,
            shortened: None,
            retrying: false,
        }
    }

    /// The wait to ask for the next poll.
    pub fn next(&mut self, now: Instant) -> Duration {
        self.retrying = self.setting == Wait::Auto
            && self.current < LONGEST_WAIT
            && self
                .shortened
                .is_some_and(|at| now.saturating_duration_since(at) >= RETRY_LONGER);
        if self.retrying {
            LONGEST_WAIT
        } else {
            self.current
        }
    }

    /// After a poll asked with `asked` was answered `elapsed` after it was sent: how
    /// long to pause before the next one when nothing changed.
    pub fn answered(&mut self, asked: Duration, elapsed: Duration) -> Duration {
        if self.retrying {
            self.retrying = false;
            self.current = LONGEST_WAIT;
            self.shortened = None;
            tracing::info!(
                wait = %humantime::format_duration(LONGEST_WAIT),
                "a poll held for the longest wait was answered: polls are held that long again"
            );
        }
        match self.setting {
            Wait::Fixed(_) => asked.saturating_sub(elapsed),
            // The server held the poll (up to what it allows): ask again at once.
            Wait::Auto if elapsed >= HELD => Duration::ZERO,
            // The server cannot hold polls: ask once per safe wait.
            Wait::Auto => SAFE_WAIT.saturating_sub(elapsed),
        }
    }

    /// After a poll asked with `asked` failed `elapsed` after it was sent, as
    /// `ending`: whether the path cut a held poll, so that the poller asks again at
    /// once (holding polls as long as [`Waits::next`] now says) rather than backing
    /// off as for any other failure.
    pub fn failed(
        &mut self,
        asked: Duration,
        elapsed: Duration,
        ending: Ending,
        now: Instant,
    ) -> bool {
        let retrying = std::mem::take(&mut self.retrying);
        if self.setting != Wait::Auto || elapsed < SHORTEST_CUT {
            return false;
        }
        let learnt = match ending {
            Ending::Other => return false,
            Ending::Cut if elapsed < asked => {
                whole_seconds(elapsed.saturating_sub(CUT_MARGIN)).max(FLOOR)
            }
            Ending::Cut => return false,
            Ending::Silent => SAFE_WAIT.min(asked),
        };
        if learnt >= asked {
            return false;
        }
        let was = self.current;
        self.current = if retrying { learnt.min(was) } else { learnt };
        self.shortened = Some(now);
        if self.current < was || !retrying {
            tracing::info!(
                asked = %humantime::format_duration(asked),
                after = %humantime::format_duration(whole_seconds(elapsed)),
                wait = %humantime::format_duration(self.current),
                "a held poll was ended on the way to the hub (a proxy's or load balancer's idle timeout?): polls are held shorter"
            );
        } else {
            tracing::debug!(
                asked = %humantime::format_duration(asked),
                wait = %humantime::format_duration(self.current),
                "the longest wait is still cut on the way to the hub"
            );
        }
        true
    }
}

fn whole_seconds(duration: Duration) -> Duration {
    Duration::from_secs(duration.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_setting_is_auto_or_a_duration() {
        assert_eq!("auto".parse::<Wait>(), Ok(Wait::Auto));
        assert_eq!("45s".parse::<Wait>(), Ok(Wait::Fixed(secs(45))));
        assert_eq!("2m".parse::<Wait>(), Ok(Wait::Fixed(secs(120))));
        assert!("0s".parse::<Wait>().is_err());
        assert!(
            "soon"
                .parse::<Wait>()
                .expect_err("refused")
                .contains("auto")
        );
        assert_eq!(Wait::default(), Wait::Auto);
        assert_eq!(Wait::Fixed(secs(90)).to_string(), "1m 30s");
    }

    #[test]
    fn a_fixed_wait_is_asked_every_time_and_paced() {
        let now = Instant::now();
        let mut waits = Waits::new(Wait::Fixed(secs(55)));
        assert_eq!(waits.next(now), secs(55));
        assert_eq!(waits.answered(secs(55), secs(55)), Duration::ZERO);
        assert_eq!(waits.answered(secs(55), secs(1)), secs(54));
        // A cut teaches a fixed wait nothing.
        assert!(!waits.failed(secs(55), secs(30), Ending::Cut, now));
        assert_eq!(waits.next(now + RETRY_LONGER), secs(55));
    }

    #[test]
    fn auto_holds_long_and_asks_again_at_once_after_a_held_answer() {
        let now = Instant::now();
        let mut waits = Waits::new(Wait::Auto);
        assert_eq!(waits.next(now), LONGEST_WAIT);
        assert_eq!(waits.answered(LONGEST_WAIT, LONGEST_WAIT), Duration::ZERO);
        // A hub that holds polls for less (its --max-wait) is asked again at once.
        assert_eq!(waits.answered(LONGEST_WAIT, secs(60)), Duration::ZERO);
        // A server that cannot hold a poll is asked once per safe wait.
        assert_eq!(
            waits.answered(LONGEST_WAIT, Duration::from_millis(200)),
            SAFE_WAIT - Duration::from_millis(200)
        );
        assert_eq!(waits.next(now), LONGEST_WAIT);
    }

    #[test]
    fn a_cut_poll_shortens_the_wait_to_just_under_the_cut() {
        let now = Instant::now();
        let mut waits = Waits::new(Wait::Auto);
        let asked = waits.next(now);
        let cut = Duration::from_millis(60_020);
        assert!(waits.failed(asked, cut, Ending::Cut, now));
        assert_eq!(waits.next(now), secs(55));
        // A second, shorter cut (a 30 s balancer behind it) shortens it further.
        assert!(waits.failed(secs(55), secs(30), Ending::Cut, now));
        assert_eq!(waits.next(now), secs(25));
        // Never under the floor.
        assert!(waits.failed(secs(25), secs(15), Ending::Cut, now));
        assert_eq!(waits.next(now), FLOOR);
    }

    #[test]
    fn quick_failures_and_the_hubs_own_errors_are_ordinary() {
        let now = Instant::now();
        let mut waits = Waits::new(Wait::Auto);
        let asked = waits.next(now);
        // A refused connection, a restart: too soon to be a cut.
        for ending in [Ending::Cut, Ending::Silent, Ending::Other] {
            assert!(!waits.failed(asked, secs(2), ending, now));
        }
        // The hub's own error, however late.
        assert!(!waits.failed(asked, secs(100), Ending::Other, now));
        // A cut at the whole wait or later is not the path's doing.
        assert!(!waits.failed(asked, asked, Ending::Cut, now));
        assert_eq!(waits.next(now), LONGEST_WAIT);
    }

    #[test]
    fn a_silent_path_falls_back_to_the_safe_wait_and_no_lower() {
        let now = Instant::now();
        let mut waits = Waits::new(Wait::Auto);
        let asked = waits.next(now);
        assert!(waits.failed(asked, asked + secs(30), Ending::Silent, now));
        // Silence at the safe wait says nothing more: an ordinary failure.
        assert!(!waits.failed(SAFE_WAIT, SAFE_WAIT + secs(30), Ending::Silent, now));
        assert_eq!(waits.next(now), SAFE_WAIT);
    }

    #[test]
    fn the_longest_wait_is_tried_again_after_a_while() {
        let start = Instant::now();
        let mut waits = Waits::new(Wait::Auto);
        let asked = waits.next(start);
        waits.failed(asked, secs(60), Ending::Cut, start);
        assert_eq!(waits.next(start + RETRY_LONGER - secs(1)), secs(55));
        // Still cut: back to what was learnt, at once, for another while.
        let later = start + RETRY_LONGER;
        assert_eq!(waits.next(later), LONGEST_WAIT);
        assert!(waits.failed(LONGEST_WAIT, secs(60), Ending::Cut, later));
        assert_eq!(waits.next(later + secs(1)), secs(55));
        assert_eq!(waits.next(later + RETRY_LONGER), LONGEST_WAIT);
        // Answered this time: the longest wait is kept.
        assert_eq!(waits.answered(LONGEST_WAIT, LONGEST_WAIT), Duration::ZERO);
        assert_eq!(waits.next(later + RETRY_LONGER * 3), LONGEST_WAIT);
        // An ordinary failure of the retry keeps what was learnt.
        let mut waits = Waits::new(Wait::Auto);
        waits.failed(LONGEST_WAIT, secs(60), Ending::Cut, start);
        assert_eq!(waits.next(later), LONGEST_WAIT);
        assert!(!waits.failed(LONGEST_WAIT, secs(1), Ending::Other, later));
        assert_eq!(
            waits.next(later),
            LONGEST_WAIT,
            "retried while the while is up"
        );
    }
}
