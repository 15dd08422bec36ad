//! A rollout as the API shows it (`GET /v1/rollouts`, `GET /v1/rollouts/{id}`): the
//! one wire shape, serialized by the hub and read by `flotilla rollout` (and anything
//! else that reads the API).

use serde::{Deserialize, Serialize};

use super::engine::{Event, Health, Observation, Rollout, RolloutState, WaveState};
use super::{Millis, OfflinePolicy, format_duration};
use crate::bundle::Digest;

/// One rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutView {
    pub id: i64,
    pub policy: String,
    pub revision: String,
    pub state: RolloutState,
    /// Why it is paused, halted or ended.
    #[serde(default)]
    pub reason: Option<String>,
    /// Started by a commit with `Flotilla-Rollout: immediate`.
    pub forced: bool,
    pub started_at: String,
    #[serde(default)]
    pub ended_at: Option<String>,
    /// While set, no wave is released before this time: the hub started on a store
    /// that knows no cluster's last contact and waits to hear from its clusters (it
    /// ends sooner once every member has been seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settling_until: Option<String>,
    pub waves: Vec<WaveView>,
    /// Every decision, oldest first (`GET /v1/rollouts/{id}` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventView>,
    /// Every changing cluster (`GET /v1/rollouts/{id}` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<MemberView>,
}

/// One wave and its progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaveView {
    pub name: String,
    pub state: WaveState,
    /// Changing clusters in it (those that left not counted).
    pub clusters: usize,
    /// Of those, healthy on the new digest now.
    pub in_sync: usize,
    pub failed: usize,
    /// Seen before, but not within the offline threshold now.
    pub offline: usize,
    /// Never seen (since the hub started on a store that knew no last contact): the
    /// word the cluster list uses for them too.
    #[serde(default)]
    pub never_seen: usize,
    #[serde(default)]
    pub released_at: Option<String>,
    #[serde(default)]
    pub completed_at: Option<String>,
    #[serde(default)]
    pub deadline: Option<String>,
    pub bake: String,
    pub max_failed: String,
    /// `None`: every cluster of the wave at once.
    #[serde(default)]
    pub max_parallel: Option<String>,
}

/// One recorded decision or operator action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    pub at: String,
    pub message: String,
    /// The token id of the operator who acted; `null` for the hub's own decisions.
    #[serde(default)]
    pub by: Option<String>,
    /// That token's role (`operator`, `admin`, or `operator@TENANT` for a tenant's
    /// token); absent for the hub's own decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// One changing cluster of a rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    pub name: String,
    pub wave: String,
    /// waiting, serving, healthy, baked, failed, skipped, rolled-back or left.
    pub state: String,
    /// The digest it was served when the rollout started (`null`: a new cluster).
    #[serde(default)]
    pub previous: Option<Digest>,
    pub target: Digest,
}

/// An RFC 3339 time (UTC) for the API.
pub fn rfc3339(at: Millis) -> String {
    jiff::Timestamp::from_millisecond(at)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl RolloutView {
    /// The view of a rollout; `detail` adds its clusters (events are the caller's).
    /// `release_not_before` is what the hub passes to `decide_with` (see
    /// [`super::settling_until`]).
    pub fn of(
        id: i64,
        rollout: &Rollout,
        observations: &[Observation],
        (now, offline_after, release_not_before): (Millis, Millis, Option<Millis>),
        detail: bool,
    ) -> RolloutView {
        // While the hub settles, a contact from before its start counts as made at its
        // start, as the decisions count it (see `decide_with`).
        let credit_from = release_not_before
            .filter(|&at| now < at)
            .map_or(Millis::MIN, |at| at.saturating_sub(offline_after));
        let last_seen = |index: usize| observations.get(index).and_then(|o| o.last_seen);
        let silent = |index: usize| {
            last_seen(index).is_some_and(|seen| now - seen.max(credit_from) > offline_after)
        };
        let healthy = |index: usize| {
            observations
                .get(index)
                .and_then(|o| o.report)
                .is_some_and(|r| r.health == Health::Healthy)
        };
        let ended = !rollout.state.is_active();
        let waves = rollout
            .waves
            .iter()
            .enumerate()
            .map(|(w, wave)| {
                let plan = &rollout.policy.waves[w];
                let range = rollout.wave_members(w);
                let taking_part = || range.clone().filter(|&i| !rollout.members[i].left);
                WaveView {
                    name: wave.name.clone(),
                    state: wave.state,
                    clusters: taking_part().count(),
                    in_sync: taking_part()
                        .filter(|&i| {
                            let member = &rollout.members[i];
                            // Healthy on the target now (a new cluster's agent may run
                            // it before its wave is released), unless rolled back; and
                            // once the rollout ended, also each that baked on it, so an
                            // ended rollout keeps its counts after its clusters move on.
                            (!member.rolled_back && healthy(i))
                                || (ended && member.baked_at.is_some())
                        })
                        .count(),
                    failed: taking_part().filter(|&i| rollout.members[i].failed).count(),
                    offline: taking_part().filter(|&i| silent(i)).count(),
                    never_seen: taking_part().filter(|&i| last_seen(i).is_none()).count(),
                    released_at: wave.released_at.map(rfc3339),
                    completed_at: wave.completed_at.map(rfc3339),
                    deadline: wave.deadline.map(rfc3339),
                    bake: format_duration(plan.bake),
                    max_failed: plan.max_failed.to_string(),
                    max_parallel: plan.max_parallel.map(|b| b.to_string()),
                }
            })
            .collect();
        let clusters = if detail {
            rollout
                .members
                .iter()
                .enumerate()
                .map(|(index, m)| {
                    let skipped =
                        m.offline_at_release && rollout.policy.offline == OfflinePolicy::Skip;
                    let state = if m.left {
                        "left"
                    } else if m.rolled_back {
                        "rolled-back"
                    } else if m.failed {
                        "failed"
                    } else if m.baked_at.is_some() {
                        "baked"
                    } else if m.serves_target() && healthy(index) {
                        "healthy"
                    } else if skipped {
                        "skipped"
                    } else if m.serves_target() {
                        "serving"
                    } else {
                        "waiting"
                    };
                    MemberView {
                        name: m.cluster.clone(),
                        wave: rollout.waves[m.wave].name.clone(),
                        state: state.to_string(),
                        previous: m.previous.clone(),
                        target: m.target.clone(),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        RolloutView {
            id,
            policy: rollout.policy.name.clone(),
            revision: rollout.revision.clone(),
            state: rollout.state,
            reason: rollout.reason.clone(),
            forced: rollout.forced,
            started_at: rfc3339(rollout.started_at),
            ended_at: rollout.ended_at.map(rfc3339),
            settling_until: (rollout.state == RolloutState::Progressing)
                .then(|| {
                    super::settling_until(
                        rollout,
                        observations,
                        now,
                        offline_after,
                        release_not_before,
                    )
                })
                .flatten()
                .map(rfc3339),
            waves,
            events: Vec::new(),
            clusters,
        }
    }
}

impl From<&Event> for EventView {
    fn from(event: &Event) -> EventView {
        EventView {
            at: rfc3339(event.at),
            message: event.message.clone(),
            by: event.by.clone(),
            role: event.role.clone(),
        }
    }
}
