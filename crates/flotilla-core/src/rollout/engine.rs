//! One rollout's state and the decision that moves it on.
//!
//! [`decide`] looks at the released waves (who fetched the new digest, who is healthy
//! on it and since when, who failed or went silent), halts the rollout when a wave
//! fails (serving its clusters their previous digest again under `onFailure:
//! rollback`), completes waves whose clusters baked, releases the next wave (inside a
//! window), and lets clusters take the new digest a few at a time (`maxParallel`). It
//! returns what changed: which clusters are now served which digest, the events to
//! record, the members to persist and when to look again if nothing else happens.
//!
//! A cluster is served the new digest from the moment it is *admitted* until it is
//! rolled back; every change of what a cluster is served is one [`Serve`] in a
//! [`Step`], so the caller has one place to apply them.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Millis, OfflinePolicy, Policy, format_duration};
use crate::bundle::Digest;
use crate::model::FailurePolicy;
use crate::status::{ResourceState, StatusReport};

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutState {
    /// Waves are being released as earlier ones bake.
    Progressing,
    /// An operator (or a wave whose clusters were all offline) stopped releases.
    Paused,
    /// A wave failed or missed its deadline: no later wave is released.
    Halted,
    /// Every wave completed.
    Complete,
    /// A newer commit started a new rollout of the same policy.
    Superseded,
    /// An operator ended it and every released cluster got its previous digest back.
    Aborted,
}

impl RolloutState {
    /// Progressing, paused or halted: not ended, so it can still act or be acted on.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            RolloutState::Progressing | RolloutState::Paused | RolloutState::Halted
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Paused => "paused",
            RolloutState::Halted => "halted",
            RolloutState::Complete => "complete",
            RolloutState::Superseded => "superseded",
            RolloutState::Aborted => "aborted",
        }
    }

    pub const ALL: [RolloutState; 6] = [
        RolloutState::Progressing,
        RolloutState::Paused,
        RolloutState::Halted,
        RolloutState::Complete,
        RolloutState::Superseded,
        RolloutState::Aborted,
    ];

    pub fn parse(text: &str) -> Option<RolloutState> {
        RolloutState::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl fmt::Display for RolloutState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a wave stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaveState {
    Waiting,
    Released,
    Complete,
    Failed,
}

impl WaveState {
    pub fn as_str(self) -> &'static str {
        match self {
            WaveState::Waiting => "waiting",
            WaveState::Released => "released",
            WaveState::Complete => "complete",
            WaveState::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<WaveState> {
        [
            WaveState::Waiting,
            WaveState::Released,
            WaveState::Complete,
            WaveState::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// One wave of a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wave {
    pub name: String,
    pub state: WaveState,
    pub released_at: Option<Millis>,
    pub completed_at: Option<Millis>,
    /// When a released wave that is not complete fails (`progressDeadline`).
    pub deadline: Option<Millis>,
}

/// One changing cluster of a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub cluster: String,
    /// Index into the rollout's waves.
    pub wave: usize,
    /// The digest it was served when the rollout started (`None`: a new cluster).
    pub previous: Option<Digest>,
    /// The digest the rollout's revision renders for it.
    pub target: Digest,
    /// It had not been seen within the offline threshold when its wave was released.
    pub offline_at_release: bool,
    /// Since when it is served the new digest.
    pub admitted_at: Option<Millis>,
    /// It was sent the new digest, or reported it: from then on, silence is failure.
    pub fetched: bool,
    /// Since when it is healthy on the new digest without a break.
    pub healthy_since: Option<Millis>,
    /// When it completed its bake (it stays done).
    pub baked_at: Option<Millis>,
    /// Whether it counts as failed now.
    pub failed: bool,
    /// It is served its previous digest again (rollback or abort).
    pub rolled_back: bool,
    /// It left the rollout (removed from the fleet or the policy, or paused).
    pub left: bool,
}

impl Member {
    pub fn new(cluster: String, wave: usize, previous: Option<Digest>, target: Digest) -> Member {
        Member {
            cluster,
            wave,
            previous,
            target,
            offline_at_release: false,
            admitted_at: None,
            fetched: false,
            healthy_since: None,
            baked_at: None,
            failed: false,
            rolled_back: false,
            left: false,
        }
    }

    /// Whether it is served the new digest now.
    pub fn serves_target(&self) -> bool {
        self.admitted_at.is_some() && !self.rolled_back && !self.left
    }

    fn takes_part(&self) -> bool {
        !self.left
    }
}

/// What a status report says about one cluster and the digest a rollout brings it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Applied, no resource failed or progressing.
    Healthy,
    /// Applied (or being applied), some resource still progressing.
    Progressing,
    /// Tried and not applied, or applied with a failed resource (as `/v1/fleet`).
    Failed,
    /// The report is about another digest.
    Elsewhere,
}

/// Judges a report against the digest a rollout brings.
pub fn judge(report: &StatusReport, target: &Digest) -> Health {
    if report.failed_for(target) {
        return Health::Failed;
    }
    if report.applied.as_ref() == Some(target) {
        let progressing = report
            .resources
            .iter()
            .any(|r| r.state == ResourceState::Progressing);
        if progressing {
            Health::Progressing
        } else {
            Health::Healthy
        }
    } else if report.attempted.as_ref() == Some(target) {
        Health::Progressing
    } else {
        Health::Elsewhere
    }
}

/// A cluster's latest report, judged against its target, and when it arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub health: Health,
    pub at: Millis,
}

/// What the hub knows of one member now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    pub report: Option<Report>,
    /// The last report or authenticated poll of its bundle.
    pub last_seen: Option<Millis>,
    /// The last time the hub sent it (or confirmed with a 304) the digest it serves it.
    pub fetched_at: Option<Millis>,
}

impl Observation {
    fn online(&self, now: Millis, offline_after: Millis) -> bool {
        self.last_seen
            .is_some_and(|seen| now.saturating_sub(seen) <= offline_after)
    }

    fn health(&self) -> Health {
        self.report.map_or(Health::Elsewhere, |r| r.health)
    }
}

/// Something a decision did, for the rollout's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at: Millis,
    pub message: String,
    /// The id of the token of the operator who acted; `None` for the hub's own decisions.
    pub by: Option<String>,
    /// The role of that token (`operator`, `admin`; with `@tenant` for a tenant's
    /// token), set by the hub; `None` for the hub's own decisions and for actions
    /// recorded before tokens had roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// A change of what one member is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// The new digest (its wave was released and it was admitted).
    Target,
    /// Its previous digest again (rollback or abort).
    Previous,
}

/// What one decision (or operator action) changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Members (indices) whose served digest changes, in order.
    pub serve: Vec<(usize, Serve)>,
    pub events: Vec<Event>,
    /// Members whose recorded state changed.
    pub dirty: Vec<usize>,
    /// Whether the rollout or one of its waves changed.
    pub changed: bool,
    /// When to decide again if no report, poll or action comes first.
    pub next_check: Option<Millis>,
}

impl Step {
    fn event(&mut self, at: Millis, message: String) {
        self.events.push(Event {
            at,
            message,
            by: None,
            role: None,
        });
        self.changed = true;
    }

    fn touch(&mut self, member: usize) {
        if self.dirty.last() != Some(&member) {
            self.dirty.push(member);
        }
    }

    fn finish(mut self) -> Step {
        self.dirty.sort_unstable();
        self.dirty.dedup();
        self
    }
}

/// Why an operator action was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ActionError(pub String);

/// One rollout: the policy it runs by (as it was when it started), its waves and its
/// changing clusters (sorted by wave, then by [`super::order_key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollout {
    pub policy: Policy,
    pub revision: String,
    /// Started by a commit with `Flotilla-Rollout: immediate`.
    pub forced: bool,
    pub state: RolloutState,
    /// Why it is paused, halted or ended, in a sentence.
    pub reason: Option<String>,
    pub started_at: Millis,
    pub ended_at: Option<Millis>,
    pub waves: Vec<Wave>,
    pub members: Vec<Member>,
}

impl Rollout {
    /// A new rollout, not yet decided on: call [`decide`] to release its first wave.
    pub fn start(
        policy: Policy,
        revision: String,
        forced: bool,
        members: Vec<Member>,
        now: Millis,
    ) -> (Rollout, Step) {
        let waves = policy
            .waves
            .iter()
            .map(|w| Wave {
                name: w.name.clone(),
                state: WaveState::Waiting,
                released_at: None,
                completed_at: None,
                deadline: None,
            })
            .collect();
        let mut step = Step::default();
        step.event(
            now,
            format!(
                "started for {revision}: {} changing cluster{}{}",
                members.len(),
                plural(members.len()),
                if forced {
                    " (forced by Flotilla-Rollout: immediate: every wave at once)"
                } else {
                    ""
                }
            ),
        );
        step.dirty = (0..members.len()).collect();
        let rollout = Rollout {
            policy,
            revision,
            forced,
            state: RolloutState::Progressing,
            reason: None,
            started_at: now,
            ended_at: None,
            waves,
            members,
        };
        (rollout, step)
    }

    /// The members of one wave, as a range of indices.
    pub fn wave_members(&self, wave: usize) -> std::ops::Range<usize> {
        let start = self.members.partition_point(|m| m.wave < wave);
        let end = self.members.partition_point(|m| m.wave <= wave);
        start..end
    }

    /// Ends it because a newer commit started a rollout of the same policy. Every
    /// cluster keeps what it is served.
    pub fn supersede(&mut self, by_revision: &str, now: Millis) -> Step {
        let mut step = Step::default();
        if !self.state.is_active() {
            return step;
        }
        self.state = RolloutState::Superseded;
        self.reason = Some(format!("superseded by {by_revision}"));
        self.ended_at = Some(now);
        step.event(
            now,
            format!("superseded by {by_revision}; every cluster keeps what it is served until its wave in the new rollout is released"),
        );
        step.finish()
    }

    /// A cluster leaves: removed from the fleet or the policy, or paused.
    pub fn leave(&mut self, member: usize, why: &str, now: Millis) -> Step {
        let mut step = Step::default();
        let Some(m) = self.members.get_mut(member) else {
            return step;
        };
        if m.left {
            return step;
        }
        m.left = true;
        m.failed = false;
        let message = format!("{} left the rollout ({why})", m.cluster);
        step.touch(member);
        step.event(now, message);
        step.finish()
    }

    /// `pause`: no wave is released and no cluster admitted until `resume`.
    pub fn pause(&mut self, by: &str, now: Millis) -> Result<Step, ActionError> {
        if self.state != RolloutState::Progressing {
            return Err(ActionError(format!(
                "the rollout is {}; only a progressing rollout can be paused",
                self.state
            )));
        }
        self.state = RolloutState::Paused;
        self.reason = Some(format!("paused by {by}"));
        Ok(operator_step(now, by, "paused".to_string()))
    }

    /// `resume`: a paused rollout goes on; a halted one re-releases its failed wave
    /// with a new deadline (its clusters take the new digest again; failures so far
    /// still count).
    pub fn resume(&mut self, by: &str, now: Millis) -> Result<Step, ActionError> {
        match self.state {
            RolloutState::Paused => {
                self.state = RolloutState::Progressing;
                self.reason = None;
                Ok(operator_step(now, by, "resumed".to_string()))
            }
            RolloutState::Halted => {
                let mut step = Step::default();
                let mut names = Vec::new();
                for wave in 0..self.waves.len() {
                    if self.waves[wave].state != WaveState::Failed {
                        continue;
                    }
                    let w = &mut self.waves[wave];
                    w.state = WaveState::Released;
                    w.deadline = self.policy.progress_deadline.map(|d| now + millis(d));
                    names.push(w.name.clone());
                    for index in self.wave_members(wave) {
                        let m = &mut self.members[index];
                        if m.rolled_back {
                            // It gets another try at the new digest; a cluster that
                            // kept it keeps counting with the failure it reports.
                            m.rolled_back = false;
                            m.admitted_at = None;
                            m.healthy_since = None;
                            m.failed = false;
                            m.fetched = false;
                            step.touch(index);
                        }
                    }
                }
                self.state = RolloutState::Progressing;
                self.reason = None;
                step.events.push(Event {
                    at: now,
                    message: format!(
                        "resumed: wave {} released again{}",
                        names.join(", "),
                        self.policy
                            .progress_deadline
                            .map(|d| format!(" with a new deadline ({})", format_duration(d)))
                            .unwrap_or_default()
                    ),
                    by: Some(by.to_string()),
                    role: None,
                });
                step.changed = true;
                Ok(step.finish())
            }
            other => Err(ActionError(format!(
                "the rollout is {other}; only a paused or halted rollout can be resumed"
            ))),
        }
    }

    /// `promote`: releases the next waiting wave now, without waiting for the bake or
    /// a window.
    pub fn promote(
        &mut self,
        by: &str,
        now: Millis,
        offline_after: Millis,
        observations: &[Observation],
    ) -> Result<Step, ActionError> {
        if !matches!(self.state, RolloutState::Progressing | RolloutState::Paused) {
            return Err(ActionError(format!(
                "the rollout is {}; resume it first (only a progressing or paused rollout can be promoted)",
                self.state
            )));
        }
        let Some(next) = self
            .waves
            .iter()
            .position(|w| w.state == WaveState::Waiting)
        else {
            return Err(ActionError(
                "every wave is released already; nothing to promote".to_string(),
            ));
        };
        self.state = RolloutState::Progressing;
        self.reason = None;
        let mut step = Step::default();
        let reason = format!("promoted by {by}");
        release(
            self,
            next,
            &reason,
            now,
            offline_after,
            observations,
            &mut step,
        );
        if let Some(event) = step.events.first_mut() {
            event.by = Some(by.to_string());
        }
        Ok(step.finish())
    }

    /// `abort`: ends it for good; every released cluster gets its previous digest.
    pub fn abort(&mut self, by: &str, now: Millis) -> Result<Step, ActionError> {
        if !self.state.is_active() {
            return Err(ActionError(format!(
                "the rollout is {} already; only an active rollout can be aborted",
                self.state
            )));
        }
        let mut step = Step::default();
        let mut rolled_back = 0;
        for (index, m) in self.members.iter_mut().enumerate() {
            if m.serves_target() {
                m.rolled_back = true;
                step.serve.push((index, Serve::Previous));
                step.touch(index);
                rolled_back += 1;
            }
        }
        self.state = RolloutState::Aborted;
        self.reason = Some(format!("aborted by {by}"));
        self.ended_at = Some(now);
        step.events.push(Event {
            at: now,
            message: format!(
                "aborted: {rolled_back} released cluster{} served {} previous digest again",
                plural(rolled_back),
                if rolled_back == 1 { "its" } else { "their" }
            ),
            by: Some(by.to_string()),
            role: None,
        });
        step.changed = true;
        Ok(step.finish())
    }
}

fn operator_step(now: Millis, by: &str, message: String) -> Step {
    Step {
        events: vec![Event {
            at: now,
            message,
            by: Some(by.to_string()),
            role: None,
        }],
        changed: true,
        ..Step::default()
    }
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

fn millis(duration: std::time::Duration) -> Millis {
    Millis::try_from(duration.as_millis()).unwrap_or(Millis::MAX)
}

/// Moves a rollout on. `observations` has one entry per member (same index);
/// `offline_after` is how long a cluster may stay silent before it counts as offline.
///
/// The same rollout, observations and time always give the same step.
pub fn decide(
    rollout: &mut Rollout,
    observations: &[Observation],
    now: Millis,
    offline_after: Millis,
) -> Step {
    decide_with(rollout, observations, now, offline_after, None)
}

/// Until when a rollout's waves are held because the hub has just started
/// (`release_not_before`, its start plus `offline_after`) and cannot tell yet whether
/// some member is offline: one never heard from, or last heard from before the start
/// and longer ago than `offline_after` (nobody could reach the hub while it was down;
/// a recent contact, written by another hub or just before a restart, can be judged).
/// `None` once that time has passed, once every member can be judged, or for a forced
/// rollout (which admits everyone at once whatever is known of them).
pub fn settling_until(
    rollout: &Rollout,
    observations: &[Observation],
    now: Millis,
    offline_after: Millis,
    release_not_before: Option<Millis>,
) -> Option<Millis> {
    let at = release_not_before.filter(|&at| now < at)?;
    let started = at.saturating_sub(offline_after);
    let all_known = !observations.is_empty()
        && observations.iter().all(|o| {
            o.last_seen
                .is_some_and(|seen| seen >= started || now.saturating_sub(seen) <= offline_after)
        });
    (!rollout.forced && !all_known).then_some(at)
}

/// [`decide`] for a hub that started at `release_not_before` minus `offline_after`.
/// Until `release_not_before` it cannot tell an offline cluster from one it has not
/// heard from yet: while it was down (or before it existed) nobody could reach it. So
/// it releases no wave (whether a cluster is offline is judged at release) while a
/// member cannot be judged (see [`settling_until`]), and it judges no cluster silent
/// on a contact from before it started: such a contact counts as made at its start.
pub fn decide_with(
    rollout: &mut Rollout,
    observations: &[Observation],
    now: Millis,
    offline_after: Millis,
    release_not_before: Option<Millis>,
) -> Step {
    let mut step = Step::default();
    if !rollout.state.is_active() || observations.len() != rollout.members.len() {
        return step;
    }
    let settling = settling_until(
        rollout,
        observations,
        now,
        offline_after,
        release_not_before,
    );
    // While the hub settles, a contact from before its start counts as made at its
    // start (after that, doing so changes nothing: both are past the threshold).
    let credited: Vec<Observation>;
    let observations = match release_not_before.filter(|&at| now < at) {
        Some(at) => {
            let started = at.saturating_sub(offline_after);
            credited = observations
                .iter()
                .map(|o| Observation {
                    last_seen: o.last_seen.map(|seen| seen.max(started)),
                    ..*o
                })
                .collect();
            &credited[..]
        }
        None => observations,
    };
    for wave in 0..rollout.waves.len() {
        if rollout.waves[wave].state == WaveState::Released {
            observe(rollout, wave, observations, now, offline_after, &mut step);
        }
    }
    for wave in 0..rollout.waves.len() {
        let judging = matches!(
            rollout.state,
            RolloutState::Progressing | RolloutState::Paused
        );
        if judging && rollout.waves[wave].state == WaveState::Released {
            judge_wave(rollout, wave, now, &mut step);
        }
    }
    let settled = settling.is_none();
    if rollout.state == RolloutState::Progressing && settled {
        release_ready(rollout, observations, now, offline_after, &mut step);
    }
    if rollout.state == RolloutState::Progressing {
        for wave in 0..rollout.waves.len() {
            if rollout.waves[wave].state == WaveState::Released {
                admit(rollout, wave, now, &mut step);
            }
        }
    }
    if rollout.state.is_active() && rollout.waves.iter().all(|w| w.state == WaveState::Complete) {
        rollout.state = RolloutState::Complete;
        rollout.reason = None;
        rollout.ended_at = Some(now);
        let skipped = rollout
            .members
            .iter()
            .filter(|m| {
                m.takes_part() && m.baked_at.is_none() && rollout_skipped(&rollout.policy, m)
            })
            .count();
        step.event(
            now,
            if skipped > 0 {
                format!(
                    "complete: every wave done; {skipped} cluster{} skipped (offline at release) take the change when they come back",
                    plural(skipped)
                )
            } else {
                "complete: every wave baked".to_string()
            },
        );
    }
    step.next_check = next_check(rollout, observations, now, offline_after, settled);
    if !settled
        && rollout.state == RolloutState::Progressing
        && let Some(at) = release_not_before
    {
        step.next_check = Some(step.next_check.map_or(at, |n| n.min(at)));
    }
    step.finish()
}

/// Updates what the hub knows of each member of a released wave: fetched, healthy
/// since when, baked, failed.
fn observe(
    rollout: &mut Rollout,
    wave: usize,
    observations: &[Observation],
    now: Millis,
    offline_after: Millis,
    step: &mut Step,
) {
    let bake = millis(rollout.policy.waves[wave].bake);
    let skip = rollout.policy.offline == OfflinePolicy::Skip;
    for index in rollout.wave_members(wave) {
        let o = &observations[index];
        let m = &mut rollout.members[index];
        if !m.serves_target() {
            continue;
        }
        let Some(admitted_at) = m.admitted_at else {
            continue;
        };
        let before = (m.fetched, m.healthy_since, m.baked_at, m.failed);
        let health = o.health();
        let online = o.online(now, offline_after);
        if !m.fetched
            && (o.fetched_at.is_some_and(|at| at >= admitted_at) || health != Health::Elsewhere)
        {
            m.fetched = true;
        }
        if online && health == Health::Healthy {
            if m.healthy_since.is_none() {
                let reported = o.report.map_or(now, |r| r.at);
                m.healthy_since = Some(reported.max(admitted_at));
            }
        } else {
            m.healthy_since = None;
        }
        if m.baked_at.is_none() && m.healthy_since.is_some_and(|since| now - since >= bake) {
            m.baked_at = Some(now);
        }
        let skipped = skip && m.offline_at_release;
        let report_failed = health == Health::Failed && (!skipped || m.fetched);
        let went_silent = !online && m.baked_at.is_none() && (!m.offline_at_release || m.fetched);
        let failed = report_failed || went_silent;
        if failed && !m.failed {
            let why = if report_failed {
                "its report for the new digest failed"
            } else {
                "it went silent after taking the new digest"
            };
            let message = format!("{} failed: {why}", m.cluster);
            step.event(now, message);
        }
        m.failed = failed;
        if before != (m.fetched, m.healthy_since, m.baked_at, m.failed) {
            step.touch(index);
        }
    }
}

/// Halts on too many failures or a missed deadline; completes a baked wave.
fn judge_wave(rollout: &mut Rollout, wave: usize, now: Millis, step: &mut Step) {
    let plan = rollout.policy.waves[wave].clone();
    let range = rollout.wave_members(wave);
    let members = &rollout.members[range.clone()];
    let taking_part = members.iter().filter(|m| m.takes_part()).count();
    let failed: Vec<&str> = members
        .iter()
        .filter(|m| m.takes_part() && m.failed)
        .map(|m| m.cluster.as_str())
        .collect();
    let allowed = plan.max_failed.failures_allowed(taking_part);
    if failed.len() > allowed {
        let shown: Vec<&str> = failed.iter().take(5).copied().collect();
        let reason = format!(
            "wave {}: {} failed cluster{} ({}{}), more than maxFailed {} allows ({})",
            plan.name,
            failed.len(),
            plural(failed.len()),
            shown.join(", "),
            if failed.len() > shown.len() {
                ", …"
            } else {
                ""
            },
            plan.max_failed,
            allowed
        );
        halt(rollout, wave, reason, now, step);
        return;
    }
    let complete = members.iter().all(|m| {
        !m.takes_part() || m.failed || rollout_skipped(&rollout.policy, m) || m.baked_at.is_some()
    });
    if complete {
        let w = &mut rollout.waves[wave];
        w.state = WaveState::Complete;
        w.completed_at = Some(now);
        let skipped = members
            .iter()
            .filter(|m| {
                m.takes_part() && m.baked_at.is_none() && rollout_skipped(&rollout.policy, m)
            })
            .count();
        let message = format!(
            "wave {} complete: {} cluster{} baked{}{}",
            plan.name,
            members
                .iter()
                .filter(|m| m.takes_part() && m.baked_at.is_some())
                .count(),
            plural(taking_part),
            if skipped > 0 {
                format!(
                    ", {skipped} skipped (offline at release: served the change, which they take when they come back)"
                )
            } else {
                String::new()
            },
            if failed.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} failed within maxFailed {}",
                    failed.len(),
                    plan.max_failed
                )
            }
        );
        step.event(now, message);
        return;
    }
    if let Some(deadline) = rollout.waves[wave].deadline
        && now >= deadline
    {
        let reason = format!(
            "wave {} is not complete by its progress deadline ({} after release)",
            plan.name,
            rollout
                .policy
                .progress_deadline
                .map(format_duration)
                .unwrap_or_default()
        );
        halt(rollout, wave, reason, now, step);
    }
}

fn rollout_skipped(policy: &Policy, member: &Member) -> bool {
    member.offline_at_release && policy.offline == OfflinePolicy::Skip
}

fn halt(rollout: &mut Rollout, wave: usize, reason: String, now: Millis, step: &mut Step) {
    rollout.state = RolloutState::Halted;
    rollout.waves[wave].state = WaveState::Failed;
    step.event(now, format!("halted: {reason}"));
    rollout.reason = Some(reason);
    if rollout.policy.on_failure != FailurePolicy::Rollback {
        return;
    }
    let mut count = 0;
    for index in rollout.wave_members(wave) {
        let m = &mut rollout.members[index];
        if m.serves_target() {
            m.rolled_back = true;
            m.healthy_since = None;
            step.serve.push((index, Serve::Previous));
            step.touch(index);
            count += 1;
        }
    }
    let name = rollout.waves[wave].name.clone();
    step.event(
        now,
        format!(
            "rolled back: {count} cluster{} of wave {name} served {} previous digest again (onFailure: rollback)",
            plural(count),
            if count == 1 { "its" } else { "their" }
        ),
    );
}

/// Releases every wave whose turn has come: the first at once, each next one when all
/// before it completed, all of them at once when forced; inside a window unless forced.
fn release_ready(
    rollout: &mut Rollout,
    observations: &[Observation],
    now: Millis,
    offline_after: Millis,
    step: &mut Step,
) {
    while rollout.state == RolloutState::Progressing {
        let Some(next) = rollout
            .waves
            .iter()
            .position(|w| w.state == WaveState::Waiting)
        else {
            return;
        };
        let earlier_done = rollout.waves[..next]
            .iter()
            .all(|w| w.state == WaveState::Complete);
        let reason = if rollout.forced {
            "forced: every wave at once".to_string()
        } else if !earlier_done || !rollout.policy.in_window(now) {
            return;
        } else if next == 0 {
            "the first wave".to_string()
        } else {
            format!("wave {} baked", rollout.waves[next - 1].name)
        };
        release(
            rollout,
            next,
            &reason,
            now,
            offline_after,
            observations,
            step,
        );
        // A wave that completed at release lets the next one go in the same step.
    }
}

fn release(
    rollout: &mut Rollout,
    wave: usize,
    reason: &str,
    now: Millis,
    offline_after: Millis,
    observations: &[Observation],
    step: &mut Step,
) {
    let skip = rollout.policy.offline == OfflinePolicy::Skip;
    let deadline = rollout.policy.progress_deadline.map(|d| now + millis(d));
    let name = rollout.waves[wave].name.clone();
    {
        let w = &mut rollout.waves[wave];
        w.state = WaveState::Released;
        w.released_at = Some(now);
        w.deadline = deadline;
    }
    let range = rollout.wave_members(wave);
    let mut changing = 0;
    let mut offline = 0;
    let mut never_seen = 0;
    for index in range.clone() {
        let observed = observations.get(index);
        let online = observed.is_some_and(|o| o.online(now, offline_after));
        let m = &mut rollout.members[index];
        if m.left {
            continue;
        }
        changing += 1;
        m.offline_at_release = !online;
        if !online {
            offline += 1;
            if observed.is_none_or(|o| o.last_seen.is_none()) {
                never_seen += 1;
            }
            if skip {
                // Served the change at once: it takes it when it comes back.
                m.admitted_at = Some(now);
                step.serve.push((index, Serve::Target));
            }
        }
        step.touch(index);
    }
    step.event(
        now,
        format!(
            "released wave {name} ({changing} changing cluster{}{}): {reason}",
            plural(changing),
            if offline > 0 {
                format!(
                    ", {offline} offline at release{}{}",
                    if skip { " and skipped" } else { ", waited for" },
                    match never_seen {
                        0 => String::new(),
                        n if n == offline => " (none of them ever heard from)".into(),
                        n => format!(" ({n} of them never heard from)"),
                    }
                )
            } else {
                String::new()
            }
        ),
    );
    if changing == 0 {
        let w = &mut rollout.waves[wave];
        w.state = WaveState::Complete;
        w.completed_at = Some(now);
        step.event(
            now,
            format!("wave {name} complete: no cluster changes in it"),
        );
    } else if skip && offline == changing && !rollout.forced && wave + 1 < rollout.waves.len() {
        // Nobody took the change, so no later wave is released before an operator
        // says so. The last wave has no later one: it completes as its clusters come
        // back (see `judge_wave`), with nothing for an operator to decide.
        rollout.state = RolloutState::Paused;
        let reason = if never_seen == offline {
            format!(
                "no changing cluster of wave {name} has ever been heard from (no agent polled or reported), so none could take the change; resume or promote once their agents run"
            )
        } else {
            format!(
                "every changing cluster of wave {name} was offline when it was released; resume or promote once they are back"
            )
        };
        step.event(now, format!("paused: {reason}"));
        rollout.reason = Some(reason);
    }
}

/// Lets clusters of a released wave take the new digest, at most `maxParallel` of
/// them not yet healthy on it at a time (all of them when forced).
fn admit(rollout: &mut Rollout, wave: usize, now: Millis, step: &mut Step) {
    let plan = &rollout.policy.waves[wave];
    let range = rollout.wave_members(wave);
    let taking_part = rollout.members[range.clone()]
        .iter()
        .filter(|m| m.takes_part())
        .count();
    let limit = match (rollout.forced, plan.max_parallel) {
        (false, Some(budget)) => budget.parallel(taking_part),
        _ => usize::MAX,
    };
    let skip = rollout.policy.offline == OfflinePolicy::Skip;
    let mut busy = rollout.members[range.clone()]
        .iter()
        .filter(|m| {
            m.serves_target()
                && !(skip && m.offline_at_release)
                && m.healthy_since.is_none()
                && m.baked_at.is_none()
        })
        .count();
    let mut admitted = Vec::new();
    for index in range {
        if busy >= limit {
            break;
        }
        let m = &mut rollout.members[index];
        if m.left || m.admitted_at.is_some() {
            continue;
        }
        m.admitted_at = Some(now);
        step.serve.push((index, Serve::Target));
        step.touch(index);
        admitted.push(index);
        busy += 1;
    }
    if !admitted.is_empty() {
        let names: Vec<&str> = admitted
            .iter()
            .take(5)
            .map(|&i| rollout.members[i].cluster.as_str())
            .collect();
        let message = format!(
            "serving the new digest to {} cluster{} of wave {} ({}{}){}",
            admitted.len(),
            plural(admitted.len()),
            rollout.waves[wave].name,
            names.join(", "),
            if admitted.len() > names.len() {
                ", …"
            } else {
                ""
            },
            if limit < usize::MAX {
                format!(
                    ", maxParallel {}",
                    rollout.policy.waves[wave]
                        .max_parallel
                        .map(|b| b.to_string())
                        .unwrap_or_default()
                )
            } else {
                String::new()
            }
        );
        step.event(now, message);
    }
}

/// The earliest time the decision can change without a new report, poll or action:
/// a bake ending, a cluster going silent, a deadline, a window opening.
fn next_check(
    rollout: &Rollout,
    observations: &[Observation],
    now: Millis,
    offline_after: Millis,
    releasing: bool,
) -> Option<Millis> {
    if !rollout.state.is_active() {
        return None;
    }
    let mut next: Option<Millis> = None;
    let mut consider = |at: Millis| {
        let at = at.max(now + 1);
        next = Some(next.map_or(at, |n| n.min(at)));
    };
    for (wave_index, wave) in rollout.waves.iter().enumerate() {
        if wave.state != WaveState::Released {
            continue;
        }
        if let Some(deadline) = wave.deadline {
            consider(deadline);
        }
        let bake = millis(rollout.policy.waves[wave_index].bake);
        for index in rollout.wave_members(wave_index) {
            let m = &rollout.members[index];
            if !m.serves_target() || m.baked_at.is_some() {
                continue;
            }
            if let Some(since) = m.healthy_since {
                consider(since.saturating_add(bake));
            }
            if let Some(seen) = observations[index].last_seen
                && now - seen <= offline_after
            {
                consider(seen.saturating_add(offline_after).saturating_add(1));
            }
        }
    }
    if releasing
        && rollout.state == RolloutState::Progressing
        && !rollout.forced
        && let Some(next_wave) = rollout
            .waves
            .iter()
            .position(|w| w.state == WaveState::Waiting)
        && rollout.waves[..next_wave]
            .iter()
            .all(|w| w.state == WaveState::Complete)
        && let Some(opening) = rollout.policy.next_window(now)
    {
        consider(opening);
    }
    next
}
