//! Rollouts: how a change travels through the fleet in waves, gated by health.
//!
//! - [`Policy`]: a checked RolloutPolicy (waves with bake, failure budget and
//!   parallelism; offline and failure handling; deadline; windows), and
//!   [`RolloutPlan`]: which policy and wave each cluster of one render belongs to.
//! - [`Rollout`] and [`decide`]: the state of one rollout and the pure decision
//!   that moves it on, given the clusters' latest reports and the time: which waves
//!   are released, which clusters are served the new digest, whether the rollout is
//!   complete or halted (and why), and what to record. Operator actions (pause,
//!   resume, promote, abort) are pure too.
//! - [`window`]: release windows in local time (IANA zones through jiff).
//! - [`view`]: the rollout as the API shows it (`GET /v1/rollouts/{id}`), shared by
//!   the hub and the command line.
//!
//! Nothing here reads a clock, a file or a database: time is an argument, so the same
//! inputs always give the same decision.

mod engine;
pub mod render;
pub mod view;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

pub use crate::model::{FailurePolicy, OfflinePolicy, Weekday};
pub use engine::{
    ActionError, Event, Health, Member, Observation, Report, Rollout, RolloutState, Serve, Step,
    Wave, WaveState, decide, decide_with, judge, settling_until,
};
pub use window::Window;

/// Milliseconds since the Unix epoch on the hub's clock: the unit of every time here.
pub type Millis = i64;

/// The trailer that makes a commit's rollout release every wave at once.
pub const FORCE_TRAILER: &str = "Flotilla-Rollout";

/// Whether a commit message carries `Flotilla-Rollout: immediate` as a trailer (a
/// line of its last paragraph).
pub fn is_forced(message: &str) -> bool {
    let trimmed = message.trim_end();
    let last_paragraph = trimmed.rsplit("\n\n").next().unwrap_or(trimmed);
    last_paragraph.lines().any(|line| {
        line.split_once(':').is_some_and(|(key, value)| {
            key.trim().eq_ignore_ascii_case(FORCE_TRAILER)
                && value.trim().eq_ignore_ascii_case("immediate")
        })
    })
}

/// A failure budget or a parallelism: a count, or a share of the wave's clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Budget {
    Count(u32),
    Percent(u32),
}

impl Budget {
    /// Parses `2` or `"5%"` (as YAML gives them); the error says what is expected.
    pub fn from_value(value: &serde_json::Value) -> Result<Budget, String> {
        let expected = || {
            format!(
                "{} is neither a count (2) nor a share of the wave (\"5%\")",
                compact(value)
            )
        };
        match value {
            serde_json::Value::Number(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Budget::Count)
                .ok_or_else(expected),
            serde_json::Value::String(text) => Budget::parse(text).ok_or_else(expected),
            _ => Err(expected()),
        }
    }

    fn parse(text: &str) -> Option<Budget> {
        let text = text.trim();
        match text.strip_suffix('%') {
            Some(number) if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) => {
                number
                    .parse()
                    .ok()
                    .filter(|&p| p <= 100)
                    .map(Budget::Percent)
            }
            Some(_) => None,
            None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse().ok().map(Budget::Count)
            }
            None => None,
        }
    }

    /// As a failure budget of a wave of `clusters`: a share is rounded down.
    pub fn failures_allowed(self, clusters: usize) -> usize {
        match self {
            Budget::Count(count) => count as usize,
            Budget::Percent(percent) => clusters * percent as usize / 100,
        }
    }

    /// As a parallelism over a wave of `clusters`: a share is rounded down, and at
    /// least one cluster always changes.
    pub fn parallel(self, clusters: usize) -> usize {
        match self {
            Budget::Count(count) => count as usize,
            Budget::Percent(percent) => clusters * percent as usize / 100,
        }
        .max(1)
    }
}

fn compact(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Count(count) => write!(f, "{count}"),
            Budget::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}

impl Serialize for Budget {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Budget::Count(count) => serializer.serialize_u32(*count),
            Budget::Percent(_) => serializer.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Budget::from_value(&value).map_err(serde::de::Error::custom)
    }
}

/// Parses a policy duration: `15m`, `1h30m`, `90s`, `2d`, or the number 0 (seconds).
pub fn parse_duration(value: &serde_json::Value) -> Result<Duration, String> {
    match value {
        serde_json::Value::Number(n) => n.as_u64().map(Duration::from_secs).ok_or_else(|| {
            format!(
                "{} is not a duration; write it like 15m or 1h30m",
                compact(value)
            )
        }),
        serde_json::Value::String(text) => humantime::parse_duration(text.trim())
            .map_err(|_| format!("{text:?} is not a duration; write it like 15m or 1h30m")),
        other => Err(format!(
            "{} is not a duration; write it like 15m or 1h30m",
            compact(other)
        )),
    }
}

/// A duration as people write it: `15m`, `1h 30m`, `0s`.
pub fn format_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// `Duration` as text in JSON (`"15m"`), for the plan a rollout records.
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::format_duration(*value))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(
            value: &Option<Duration>,
            serializer: S,
        ) -> Result<S::Ok, S::Error> {
            match value {
                Some(duration) => super::serialize(duration, serializer),
                None => serializer.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            deserializer: D,
        ) -> Result<Option<Duration>, D::Error> {
            Option::<String>::deserialize(deserializer)?
                .map(|text| humantime::parse_duration(&text).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

/// One wave of a checked policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WavePlan {
    pub name: String,
    /// How long each changed cluster must stay healthy before the next wave.
    #[serde(with = "duration_text")]
    pub bake: Duration,
    /// More failed clusters than this halt the rollout.
    pub max_failed: Budget,
    /// At most this many clusters not yet healthy on the new digest; `None`: all.
    pub max_parallel: Option<Budget>,
}

/// A checked RolloutPolicy, as a rollout runs by it (recorded when it starts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    pub name: String,
    /// The file it was read from, relative to the fleet root.
    pub file: String,
    pub waves: Vec<WavePlan>,
    pub offline: OfflinePolicy,
    pub on_failure: FailurePolicy,
    #[serde(default, with = "duration_text::option")]
    pub progress_deadline: Option<Duration>,
    #[serde(default)]
    pub windows: Vec<Window>,
}

impl Policy {
    /// Whether `at` lies inside one of the policy's windows (always, without windows).
    pub fn in_window(&self, at: Millis) -> bool {
        self.windows.is_empty() || self.windows.iter().any(|w| w.contains(at))
    }

    /// The first time at or after `at` inside a window.
    pub fn next_window(&self, at: Millis) -> Option<Millis> {
        if self.in_window(at) {
            return Some(at);
        }
        self.windows.iter().filter_map(|w| w.next_opening(at)).min()
    }
}

/// The name of the wave of governed clusters that no declared wave selects.
pub const REST_WAVE: &str = "rest";

/// The key that orders a policy's clusters for `percent` waves and for changing a
/// wave's clusters a few at a time: stable across renders, hubs and machines, and
/// unrelated to the clusters' names' order.
pub fn order_key(policy: &str, cluster: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(policy.as_bytes());
    hasher.update([0]);
    hasher.update(cluster.as_bytes());
    hasher.finalize().into()
}

/// Where one governed cluster goes in a rollout of its policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Index into [`RolloutPlan::policies`].
    pub policy: usize,
    /// Index into that policy's waves.
    pub wave: usize,
}

/// Which policy and wave each cluster of one render belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutPlan {
    /// Every policy of the fleet, by name.
    pub policies: Vec<Policy>,
    /// Every governed cluster that is not paused.
    pub placements: BTreeMap<String, Placement>,
    /// Clusters with `spec.paused: true` (governed or not).
    pub paused: BTreeSet<String>,
}

impl RolloutPlan {
    /// The policy and wave of a cluster, if a policy governs it and it is not paused.
    pub fn place(&self, cluster: &str) -> Option<(&Policy, &WavePlan)> {
        let placement = self.placements.get(cluster)?;
        let policy = self.policies.get(placement.policy)?;
        Some((policy, policy.waves.get(placement.wave)?))
    }

    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod unit {
    use super::*;
    use serde_json::json;

    #[test]
    fn budgets_are_counts_or_shares() {
        assert_eq!(Budget::from_value(&json!(2)), Ok(Budget::Count(2)));
        assert_eq!(Budget::from_value(&json!("5%")), Ok(Budget::Percent(5)));
        assert_eq!(Budget::from_value(&json!("3")), Ok(Budget::Count(3)));
        for bad in [
            json!(-1),
            json!(1.5),
            json!("five"),
            json!("101%"),
            json!("%"),
            json!(true),
        ] {
            let err = Budget::from_value(&bad).expect_err("refused");
            assert!(err.contains("neither a count"), "{err}");
        }
        assert_eq!(Budget::Percent(5).failures_allowed(39), 1);
        assert_eq!(Budget::Percent(10).parallel(5), 1);
        assert_eq!(Budget::Percent(10).parallel(100), 10);
        assert_eq!(Budget::Count(0).failures_allowed(10), 0);
    }

    #[test]
    fn the_force_trailer_is_read_from_the_last_paragraph() {
        assert!(is_forced("fix\n\nFlotilla-Rollout: immediate\n"));
        assert!(is_forced(
            "fix\n\nSigned-off-by: a\nflotilla-rollout:  Immediate"
        ));
        assert!(!is_forced("Flotilla-Rollout: immediate\n\nbody"));
        assert!(!is_forced("fix\n\nFlotilla-Rollout: waves"));
        assert!(is_forced("Flotilla-Rollout: immediate"));
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration(&json!("15m")), Ok(Duration::from_secs(900)));
        assert_eq!(
            parse_duration(&json!("1h30m")),
            Ok(Duration::from_secs(5400))
        );
        assert_eq!(parse_duration(&json!(0)), Ok(Duration::ZERO));
        assert!(parse_duration(&json!("soon")).is_err());
        assert!(parse_duration(&json!(-3)).is_err());
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h 30m");
    }
}
