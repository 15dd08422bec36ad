//! Rollouts on the hub: it gathers the inputs of the pure decision
//! ([`flotilla_core::rollout::decide`]), calls it, records the result and applies it.
//!
//! - A clean render ([`Recorder::record_render`]) serves ungoverned and new clusters at
//!   once, starts one rollout per policy whose clusters it changes (superseding the
//!   running one), and lets clusters that left a policy leave its rollout.
//! - Every status report ([`Recorder::report_to_rollouts`]), every operator action and the
//!   timer (the next bake end, deadline, silence or window) decide again.
//! - Every decision is written in one transaction (rollout, waves, changed clusters,
//!   events, and what clusters are served, through [`ServedChange`], the one way what
//!   a cluster is served changes) before the in-memory snapshot is swapped and the
//!   long-polls of the clusters concerned are woken.
//!
//! Decisions are taken one at a time (an async mutex), with every time from the hub's
//! clock (with several hubs on one database, the database's clock: see
//! [`crate::clock::DatabaseClock`]), and the state they act on is the store's, so a
//! restarted hub goes on where it was.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Notify;

use super::reload::Reload;
use super::{ClusterBundle, Latest, Pulse, Recorder, Served, Shared};
use crate::HubError;
use crate::store::rollouts::MemberRow;
use crate::store::{
    Commit, Fence, RenderedCluster, RolloutWrite, ServedChange, Store, StoreError, StoredRollout,
    StoredStatus,
};
use flotilla_core::access::Role;
use flotilla_core::bundle::Digest;
use flotilla_core::rollout::render::{
    RenderDecision, RenderInput, Revisions, Running, Started, decide_render, merge_steps,
    served_changes,
};
use flotilla_core::rollout::view::{EventView, RolloutView};
use flotilla_core::rollout::{
    ActionError, Millis, Observation, Report, Rollout, Step, decide_with, judge,
};
use flotilla_render::RenderOutput;

/// How many ended rollouts `GET /v1/rollouts` lists after the active ones.
pub const RECENT_ROLLOUTS: i64 = 20;

/// One rollout that has not ended, with what the hub knows of its clusters.
struct Active {
    id: i64,
    rollout: Rollout,
    /// Per member: (revision of its previous digest, revision of its target).
    revisions: Vec<Revisions>,
    index: HashMap<String, usize>,
    observations: Vec<Observation>,
    pulses: Vec<Arc<Pulse>>,
}

impl Active {
    fn new(recorder: &Recorder, stored: StoredRollout) -> Active {
        let statuses = recorder.view.statuses();
        Active::with(stored, &statuses, |cluster| recorder.view.pulse(cluster))
    }

    /// A rollout with its clusters' last reports and pulses.
    fn with(
        stored: StoredRollout,
        statuses: &HashMap<String, StoredStatus>,
        pulse: impl Fn(&str) -> Arc<Pulse>,
    ) -> Active {
        let index = stored
            .rollout
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.cluster.clone(), i))
            .collect();
        let pulses = stored
            .rollout
            .members
            .iter()
            .map(|m| pulse(&m.cluster))
            .collect();
        let observations = stored
            .rollout
            .members
            .iter()
            .map(|m| Observation {
                report: statuses.get(&m.cluster).map(|s| Report {
                    health: judge(&s.report, &m.target),
                    at: s.received_at_ms,
                }),
                last_seen: None,
                fetched_at: None,
            })
            .collect();
        Active {
            id: stored.id,
            rollout: stored.rollout,
            revisions: stored.revisions,
            index,
            observations,
            pulses,
        }
    }

    /// A rollout a render started, with the id it is recorded under, and the step
    /// that started it.
    fn started(id: i64, started: Started, pulse: impl Fn(&str) -> Arc<Pulse>) -> (Active, Step) {
        let rollout = started.rollout;
        let index = rollout
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.cluster.clone(), i))
            .collect();
        let pulses = rollout.members.iter().map(|m| pulse(&m.cluster)).collect();
        let active = Active {
            id,
            rollout,
            revisions: started.revisions,
            index,
            observations: started.observations,
            pulses,
        };
        (active, started.step)
    }

    /// Brings the observations up to date with the pulses (polls and reports seen).
    fn refresh(&mut self) {
        for (observation, pulse) in self.observations.iter_mut().zip(&self.pulses) {
            observation.last_seen = pulse.seen();
            observation.fetched_at = pulse.fetched();
        }
    }

    /// Its view; `release_not_before` as [`RolloutBook`] holds it (`None` read
    /// straight from a store, with no hub that started).
    fn view(
        &self,
        now: Millis,
        offline_after: Millis,
        release_not_before: Option<Millis>,
        detail: bool,
    ) -> RolloutView {
        RolloutView::of(
            self.id,
            &self.rollout,
            &self.observations,
            (now, offline_after, release_not_before),
            detail,
        )
    }
}

/// The rollouts' state on the hub.
#[derive(Default)]
pub struct RolloutBook {
    active: tokio::sync::Mutex<Vec<Active>>,
    /// Wakes the timer: a decision may have moved the next deadline, or a cluster
    /// fetched the new digest.
    pub wake: Notify,
    /// The hub's start plus the offline threshold (ms; 0: not set): before it, no wave
    /// is released unless every member was seen since the start, and a contact from
    /// before the start counts as made at it (see `decide_with`).
    release_not_before: std::sync::atomic::AtomicI64,
    /// The store's version of the rollouts held in `active` (see
    /// [`Store::rollouts_version`]): a decision is written only while the store is
    /// still at it.
    version: std::sync::atomic::AtomicI64,
}

impl RolloutBook {
    pub fn hold_releases_until(&self, at: Millis) {
        self.release_not_before.store(at, Ordering::Relaxed);
    }

    fn release_not_before(&self) -> Option<Millis> {
        Some(self.release_not_before.load(Ordering::Relaxed)).filter(|&at| at > 0)
    }
}

/// An operator action on a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
    Promote,
    Abort,
}

impl Action {
    pub fn parse(text: &str) -> Option<Action> {
        match text {
            "pause" => Some(Action::Pause),
            "resume" => Some(Action::Resume),
            "promote" => Some(Action::Promote),
            "abort" => Some(Action::Abort),
            _ => None,
        }
    }
}

/// Why an operator action did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ActionRefused {
    #[error("no rollout with id {0}")]
    NotFound(i64),
    #[error("{0}")]
    Conflict(#[from] ActionError),
    #[error(transparent)]
    Hub(#[from] HubError),
}

/// What recording a render did.
#[derive(Debug, Default)]
pub struct RenderOutcome {
    pub served_changes: usize,
    pub removed: usize,
    pub rollouts_started: usize,
    /// When the render was recorded and what is served swapped (the long-polls woken).
    pub swapped_at: Option<std::time::Instant>,
}

/// The record of a step of one rollout, and the served changes it makes.
fn write_of(
    active: &Active,
    step: &Step,
    insert: bool,
    latest: &HashMap<String, Arc<Latest>>,
) -> (RolloutWrite, Vec<ServedChange>) {
    let rollout = &active.rollout;
    let members = step
        .dirty
        .iter()
        .map(|&i| MemberRow {
            ordinal: i,
            member: rollout.members[i].clone(),
            previous_revision: active.revisions[i].0.clone(),
            target_revision: active.revisions[i].1.clone(),
        })
        .collect();
    let served = served_changes(rollout, &active.revisions, step, latest);
    let write = RolloutWrite {
        id: active.id,
        insert,
        policy: rollout.policy.name.clone(),
        revision: rollout.revision.clone(),
        plan: serde_json::to_string(&rollout.policy).unwrap_or_default(),
        forced: rollout.forced,
        state: rollout.state,
        reason: rollout.reason.clone(),
        started_at: rollout.started_at,
        ended_at: rollout.ended_at,
        waves: rollout.waves.clone(),
        members,
        events: step.events.clone(),
    };
    (write, served)
}

fn offline_after(recorder: &Recorder) -> Millis {
    Millis::try_from(recorder.settings.offline_after.as_millis()).unwrap_or(Millis::MAX)
}

/// Brings a rollout's observations up to date and decides.
fn decide_now(recorder: &Recorder, a: &mut Active, now: Millis) -> Step {
    a.refresh();
    decide_with(
        &mut a.rollout,
        &a.observations,
        now,
        offline_after(recorder),
        recorder.rollouts.release_not_before(),
    )
}

/// An operator's action on one rollout, and nothing it leads to: the same on a hub
/// and straight on the store. Its events record the token's id and role.
fn act(
    a: &mut Active,
    action: Action,
    (by, role): (&str, &str),
    now: Millis,
    offline: Millis,
) -> Result<Step, ActionError> {
    a.refresh();
    let mut step = match action {
        Action::Pause => a.rollout.pause(by, now),
        Action::Resume => a.rollout.resume(by, now),
        Action::Promote => {
            let observations = a.observations.clone();
            a.rollout.promote(by, now, offline, &observations)
        }
        Action::Abort => a.rollout.abort(by, now),
    }?;
    for event in step.events.iter_mut().filter(|e| e.by.is_some()) {
        event.role = Some(role.to_string());
    }
    Ok(step)
}

/// The one transaction that records some rollouts' steps and what they serve,
/// written only while the rollouts are at `version`.
fn steps_commit(
    active: &[Active],
    steps: &[(usize, Step)],
    latest: &HashMap<String, Arc<Latest>>,
    history: usize,
    now_ms: Millis,
    fence: Option<Fence>,
    version: i64,
) -> Commit {
    let mut commit = Commit {
        history,
        now_ms,
        fence,
        rollouts_version: Some(version),
        ..Commit::default()
    };
    for (index, step) in steps {
        if !(step.changed || !step.dirty.is_empty() || !step.serve.is_empty()) {
            continue;
        }
        let (write, served) = write_of(&active[*index], step, false, latest);
        commit.rollouts.push(write);
        commit.served.extend(served);
    }
    commit
}

impl Recorder {
    /// Loads the rollouts that have not ended (at start).
    pub(crate) async fn load_rollouts(&self) -> Result<(), HubError> {
        let mut active = self.rollouts.active.lock().await;
        self.reload_rollouts(&mut active).await?;
        if !active.is_empty() {
            tracing::info!(
                rollouts = active.len(),
                "going on with the rollouts in the store"
            );
        }
        Ok(())
    }

    /// Reads the active rollouts back from the store, with their version (read
    /// first: a write that lands between the two reads makes the next decision
    /// refused and read again, never lost).
    async fn reload_rollouts(&self, active: &mut Vec<Active>) -> Result<(), HubError> {
        let version = self.store.rollouts_version().await?;
        let stored = self.store.active_rollouts().await?;
        *active = stored.into_iter().map(|s| Active::new(self, s)).collect();
        self.rollouts.version.store(version, Ordering::Release);
        self.publish_views(active);
        Ok(())
    }

    /// Something beside this hub changed the rollouts (an operator's action written
    /// straight into the database): read what is served and the rollouts again, and
    /// decide on them. Returns whether they had changed.
    pub async fn pick_up_rollout_changes(&self) -> Result<bool, HubError> {
        let known = || self.rollouts.version.load(Ordering::Acquire);
        if self.store.rollouts_version().await? == known() {
            return Ok(false);
        }
        let mut active = self.rollouts.active.lock().await;
        if self.store.rollouts_version().await? == known() {
            // This hub's own decision, recorded meanwhile.
            return Ok(false);
        }
        self.reload_rollouts(&mut active).await?;
        drop(active);
        tracing::info!("the rollouts were changed in the database; read them again");
        if self.lease.holds() {
            // Promote and abort change what clusters are served.
            self.reload(Reload::Changed).await?;
        }
        self.rollouts.wake.notify_one();
        Ok(true)
    }

    fn publish_views(&self, active: &[Active]) {
        let now = self.settings.clock.now_ms();
        let views: Vec<RolloutView> = active
            .iter()
            .map(|a| {
                a.view(
                    now,
                    offline_after(self),
                    self.rollouts.release_not_before(),
                    false,
                )
            })
            .collect();
        self.view.set_rollouts(views);
    }

    /// Records a clean render: what HEAD renders per cluster, what changes for whom at
    /// once, and the rollouts it starts, supersedes or leaves ([`decide_render`]), in
    /// one transaction; then swaps in what is served.
    pub(crate) async fn record_render(
        &self,
        output: &RenderOutput,
        forced: bool,
        now: Millis,
        expect_revision: Option<Option<String>>,
    ) -> Result<RenderOutcome, HubError> {
        let mut active = self.rollouts.active.lock().await;
        if !self.lease.holds() {
            // Another hub records renders; this one serves what it records.
            return Ok(RenderOutcome::default());
        }
        let served = self.view.served();
        let old_latest = self.view.latest();
        let looking = std::time::Instant::now();
        let (latest, rendered) = self.latest_of_render(output, &old_latest).await?;
        let lookup = looking.elapsed();
        let existing = self.store.rollout_policies_of(&output.revision).await?;
        let version = self.rollouts.version.load(Ordering::Acquire);
        let input = RenderInput {
            revision: &output.revision,
            forced,
            now,
            offline_after: offline_after(self),
            release_not_before: self.rollouts.release_not_before(),
            plan: &output.rollouts,
            served: served.as_ref(),
            old_latest: &old_latest,
            latest: &latest,
            existing: &existing,
        };
        let decision = self.decide_render(&input, &mut active);
        let (commit, new_actives) = self
            .render_commit(
                output,
                expect_revision,
                &input,
                decision,
                &active,
                rendered,
                version,
            )
            .await?;
        let committing = std::time::Instant::now();
        let (unreferenced, sequences) = match self.store.commit_with_sequences(&commit).await {
            Ok(written) => written,
            Err(err) => {
                // What is in memory may be ahead of the store: read it back.
                self.reload_rollouts(&mut active).await?;
                return Err(err.into());
            }
        };
        if !commit.rollouts.is_empty() {
            self.rollouts.version.store(version + 1, Ordering::Release);
        }
        let swapping = std::time::Instant::now();
        let removed: BTreeSet<String> = commit.removed.iter().cloned().collect();
        self.view.set_latest(latest);
        self.apply_served(&commit.served, &sequences, &removed, commit.now_ms);
        log_record_timings(looking, lookup, committing, swapping);
        let outcome = RenderOutcome {
            served_changes: commit.served.len(),
            removed: removed.len(),
            rollouts_started: new_actives.len(),
            swapped_at: Some(std::time::Instant::now()),
        };
        self.forget_statuses(&removed);
        active.extend(new_actives);
        active.retain(|a| a.rollout.state.is_active());
        self.view.count_decisions(1);
        self.publish_views(&active);
        drop(active);
        self.rollouts.wake.notify_one();
        self.delete_objects(&unreferenced).await;
        Ok(outcome)
    }

    /// What HEAD renders for each cluster, and the rows of `rendered` that change. A
    /// digest a cluster was served before keeps the revision it was first served with
    /// (looked up in one batch).
    async fn latest_of_render(
        &self,
        output: &RenderOutput,
        old_latest: &HashMap<String, Arc<Latest>>,
    ) -> Result<(HashMap<String, Arc<Latest>>, Vec<RenderedCluster>), HubError> {
        let new_digests: Vec<(&str, &Digest)> = output
            .bundles
            .iter()
            .filter(|(name, bundle)| {
                old_latest
                    .get(*name)
                    .is_none_or(|p| p.digest != bundle.digest)
            })
            .map(|(name, bundle)| (name.as_str(), &bundle.digest))
            .collect();
        let mut in_history = self.store.revisions_in_history(&new_digests).await?;
        drop(new_digests);
        let plan = &output.rollouts;
        let mut rendered = Vec::new();
        let mut latest: HashMap<String, Arc<Latest>> = HashMap::with_capacity(output.bundles.len());
        for (name, bundle) in &output.bundles {
            let previous = old_latest.get(name);
            let revision = match previous {
                Some(p) if p.digest == bundle.digest => p.revision.clone(),
                _ => in_history
                    .remove(&(name.clone(), bundle.digest.clone()))
                    .unwrap_or_else(|| output.revision.clone()),
            };
            let place = plan.place(name);
            let entry = Latest {
                digest: bundle.digest.clone(),
                revision,
                policy: place.map(|(p, _)| p.name.clone()),
                wave: place.map(|(_, w)| w.name.clone()),
                paused: plan.paused.contains(name),
            };
            if previous.map(|p| p.as_ref()) != Some(&entry) {
                rendered.push(RenderedCluster {
                    cluster: name.clone(),
                    digest: entry.digest.clone(),
                    revision: entry.revision.clone(),
                    policy: entry.policy.clone(),
                    wave: entry.wave.clone(),
                    paused: entry.paused,
                });
            }
            latest.insert(name.clone(), Arc::new(entry));
        }
        Ok((latest, rendered))
    }

    /// Calls the pure decision on the running rollouts, brought up to date with the
    /// polls and reports seen, and logs the rollouts it supersedes.
    fn decide_render(
        &self,
        input: &RenderInput<'_, Served>,
        active: &mut [Active],
    ) -> RenderDecision {
        for a in active.iter_mut() {
            a.refresh();
        }
        let mut running: Vec<Running<'_>> = active
            .iter_mut()
            .map(|a| Running {
                rollout: &mut a.rollout,
                revisions: &a.revisions,
                observations: &a.observations,
            })
            .collect();
        let statuses = self.view.statuses();
        let decision = decide_render(input, &mut running, |cluster, target| {
            let pulse = self.view.pulse(cluster);
            Observation {
                report: statuses.get(cluster).map(|s| Report {
                    health: judge(&s.report, target),
                    at: s.received_at_ms,
                }),
                last_seen: pulse.seen(),
                fetched_at: pulse.fetched(),
            }
        });
        drop(statuses);
        for &i in &decision.superseded {
            self.view.count_superseded();
            tracing::info!(
                rollout = active[i].id,
                policy = %active[i].rollout.policy.name,
                by = %input.revision,
                "superseded by a newer commit"
            );
        }
        decision
    }

    /// The transaction that records a render's decision, and the rollouts it starts
    /// (given their ids).
    #[allow(clippy::too_many_arguments)]
    async fn render_commit(
        &self,
        output: &RenderOutput,
        expect_revision: Option<Option<String>>,
        input: &RenderInput<'_, Served>,
        decision: RenderDecision,
        active: &[Active],
        rendered: Vec<RenderedCluster>,
        version: i64,
    ) -> Result<(Commit, Vec<Active>), HubError> {
        let mut writes: Vec<RolloutWrite> = decision
            .steps
            .iter()
            .map(|(i, step)| write_of(&active[*i], step, false, input.latest).0)
            .collect();
        let mut new_actives = Vec::with_capacity(decision.started.len());
        if !decision.started.is_empty() {
            let mut next_id = self.store.next_rollout_id().await?;
            for started in decision.started {
                let (a, first) = Active::started(next_id, started, |c| self.view.pulse(c));
                next_id += 1;
                tracing::info!(
                    rollout = a.id,
                    policy = %a.rollout.policy.name,
                    revision = %output.revision,
                    clusters = a.rollout.members.len(),
                    forced = input.forced,
                    "rollout started"
                );
                writes.push(write_of(&a, &first, true, input.latest).0);
                new_actives.push(a);
            }
        }
        let commit = Commit {
            revision: Some(output.revision.clone()),
            rendered,
            removed: decision.removed.into_iter().collect(),
            served: decision.served,
            rollouts_version: (!writes.is_empty()).then_some(version),
            rollouts: writes,
            history: self.settings.history,
            now_ms: input.now,
            fence: self.lease.fence(),
            expect_revision,
        };
        Ok((commit, new_actives))
    }

    /// Forgets the reports of clusters no longer in the fleet.
    fn forget_statuses(&self, removed: &BTreeSet<String>) {
        if removed.is_empty() {
            return;
        }
        let mut statuses = self.view.statuses_mut();
        for name in removed {
            statuses.remove(name);
        }
    }

    /// Swaps in what clusters are served now (and wakes the long-polls).
    fn apply_served(
        &self,
        changes: &[ServedChange],
        sequences: &HashMap<String, u64>,
        removed: &BTreeSet<String>,
        now_ms: i64,
    ) {
        if changes.is_empty() && removed.is_empty() {
            return;
        }
        let current = self.view.served();
        let mut next = Served {
            clusters: current.clusters.clone(),
        };
        for name in removed {
            next.clusters.remove(name);
        }
        for change in changes {
            let pulse = self.view.pulse(&change.cluster);
            let entry = ClusterBundle::serving(
                change.cluster.clone(),
                change.digest.clone(),
                change.revision.clone(),
                change.hold,
                pulse,
                sequences.get(&change.cluster).copied().unwrap_or(0),
                Some(now_ms),
            )
            .replacing(current.clusters.get(&change.cluster).map(|e| &**e));
            next.clusters
                .insert(change.cluster.clone(), Arc::new(entry));
        }
        self.view.swap(next);
    }

    /// Deletes the objects a commit left unreferenced, on a hub alone on its database.
    /// With several hubs, garbage collection takes them once they have been
    /// unreferenced for long enough ([`Recorder::collect_garbage`]).
    async fn delete_objects(&self, digests: &[Digest]) {
        if self.lease.is_shared() {
            return;
        }
        for digest in digests {
            if let Err(err) = self.store.objects.remove(digest).await {
                tracing::warn!(%digest, "cannot delete an object nothing refers to: {err}");
            }
        }
    }

    /// Writes the steps of some rollouts and applies what they serve.
    async fn commit_steps(
        &self,
        active: &mut [Active],
        steps: Vec<(usize, Step)>,
    ) -> Result<(), HubError> {
        let latest = self.view.latest();
        let version = self.rollouts.version.load(Ordering::Acquire);
        let commit = steps_commit(
            active,
            &steps,
            &latest,
            self.settings.history,
            self.settings.clock.now_ms(),
            self.lease.fence(),
            version,
        );
        if commit.rollouts.is_empty() {
            return Ok(());
        }
        let (unreferenced, sequences) = self.store.commit_with_sequences(&commit).await?;
        self.rollouts.version.store(version + 1, Ordering::Release);
        self.apply_served(&commit.served, &sequences, &BTreeSet::new(), commit.now_ms);
        self.delete_objects(&unreferenced).await;
        Ok(())
    }

    /// A status report arrived: the rollout it concerns decides again.
    pub async fn report_to_rollouts(
        &self,
        cluster: &str,
        report: &flotilla_core::status::StatusReport,
        at: Millis,
    ) -> Result<(), HubError> {
        if !self.lease.holds() {
            // The lease holder reads the report from the database and decides.
            return Ok(());
        }
        let mut active = self.rollouts.active.lock().await;
        let now = self.settings.clock.now_ms();
        let mut steps = Vec::new();
        for (index, a) in active.iter_mut().enumerate() {
            let Some(&i) = a.index.get(cluster) else {
                continue;
            };
            if a.rollout.members[i].left {
                continue;
            }
            a.observations[i].report = Some(Report {
                health: judge(report, &a.rollout.members[i].target),
                at,
            });
            let step = decide_now(self, a, now);
            steps.push((index, step));
        }
        if steps.is_empty() {
            return Ok(());
        }
        self.finish(&mut active, steps, true).await
    }

    /// Records the steps; `wake` tells the timer that the next deadline may have moved
    /// (not needed when the timer itself decided).
    async fn finish(
        &self,
        active: &mut Vec<Active>,
        steps: Vec<(usize, Step)>,
        wake: bool,
    ) -> Result<(), HubError> {
        self.view.count_decisions(steps.len() as u64);
        let result = self.commit_steps(active, steps).await;
        if result.is_err() {
            // What is in memory may be ahead of the store: read it back.
            self.reload_rollouts(active).await?;
        }
        active.retain(|a| a.rollout.state.is_active());
        self.publish_views(active);
        if wake {
            self.rollouts.wake.notify_one();
        }
        result
    }

    /// Decides every active rollout again (on the timer); returns when to do it next.
    pub async fn tick_rollouts(&self) -> Result<Option<Millis>, HubError> {
        if !self.lease.holds() {
            return Ok(None);
        }
        let mut active = self.rollouts.active.lock().await;
        let now = self.settings.clock.now_ms();
        let mut steps = Vec::new();
        let mut next: Option<Millis> = None;
        for (index, a) in active.iter_mut().enumerate() {
            let step = decide_now(self, a, now);
            if let Some(at) = step.next_check {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            steps.push((index, step));
        }
        self.finish(&mut active, steps, false).await?;
        Ok(next)
    }

    /// An operator's `pause`, `resume`, `promote` or `abort`, recorded with the id and
    /// role of the token that asked for it.
    pub async fn rollout_action(
        &self,
        id: i64,
        action: Action,
        (by, role): (&str, &str),
    ) -> Result<RolloutView, ActionRefused> {
        if !self.lease.holds() {
            return Err(ActionRefused::Conflict(ActionError(
                "this hub does not hold the rollout lease (another hub decides rollouts); \
                 send the action to the hub whose /readyz says \"rolloutLease\": true"
                    .into(),
            )));
        }
        let mut active = self.rollouts.active.lock().await;
        let now = self.settings.clock.now_ms();
        let Some(index) = active.iter().position(|a| a.id == id) else {
            drop(active);
            return Err(
                match self.store.rollout(id).await.map_err(HubError::from)? {
                    Some(stored) => ended(&stored),
                    None => ActionRefused::NotFound(id),
                },
            );
        };
        let offline = offline_after(self);
        let a = &mut active[index];
        let acted = act(a, action, (by, role), now, offline)?;
        let then = decide_now(self, a, now);
        let step = merge_steps(vec![acted, then]);
        tracing::info!(rollout = id, ?action, by, role, "operator action");
        let view = a.view(now, offline, self.rollouts.release_not_before(), true);
        self.finish(&mut active, vec![(index, step)], true).await?;
        drop(active);
        Ok(with_events(&self.store, view)
            .await
            .map_err(HubError::from)?)
    }

    /// `GET /v1/rollouts`: the active rollouts, then the most recent ended ones.
    pub async fn rollout_list(&self) -> Result<Vec<RolloutView>, HubError> {
        let now = self.settings.clock.now_ms();
        let mut views: Vec<RolloutView> = {
            let active = self.rollouts.active.lock().await;
            active
                .iter()
                .rev()
                .map(|a| {
                    a.view(
                        now,
                        offline_after(self),
                        self.rollouts.release_not_before(),
                        false,
                    )
                })
                .collect()
        };
        for stored in self.store.recent_rollouts(RECENT_ROLLOUTS).await? {
            views.push(self.ended_view(stored, now, false));
        }
        Ok(views)
    }

    fn ended_view(&self, stored: StoredRollout, now: Millis, detail: bool) -> RolloutView {
        let mut a = Active::new(self, stored);
        a.refresh();
        a.view(
            now,
            offline_after(self),
            self.rollouts.release_not_before(),
            detail,
        )
    }

    /// `GET /v1/rollouts/{id}`: one rollout with its clusters and every event.
    pub async fn rollout_detail(&self, id: i64) -> Result<Option<RolloutView>, HubError> {
        let now = self.settings.clock.now_ms();
        let view = {
            let active = self.rollouts.active.lock().await;
            active.iter().find(|a| a.id == id).map(|a| {
                a.view(
                    now,
                    offline_after(self),
                    self.rollouts.release_not_before(),
                    true,
                )
            })
        };
        let view = match view {
            Some(view) => view,
            None => match self.store.rollout(id).await? {
                Some(stored) => self.ended_view(stored, now, true),
                None => return Ok(None),
            },
        };
        Ok(Some(with_events(&self.store, view).await?))
    }

    /// Writes when each cluster was last seen, for a restarted hub.
    pub async fn flush_seen(&self, written: &mut HashMap<String, i64>) -> Result<(), HubError> {
        let pulses: Vec<(String, i64)> = self
            .view
            .seen_times()
            .into_iter()
            .filter(|(name, seen)| written.get(name) != Some(seen))
            .collect();
        if pulses.is_empty() {
            return Ok(());
        }
        self.store.put_seen(&pulses).await?;
        written.extend(pulses);
        Ok(())
    }
}

/// An action refused because the rollout has ended.
fn ended(stored: &StoredRollout) -> ActionRefused {
    ActionRefused::Conflict(ActionError(format!(
        "the rollout is {} and can no longer be changed",
        stored.rollout.state
    )))
}

/// A rollout's view with every one of its events.
async fn with_events(store: &Store, mut view: RolloutView) -> Result<RolloutView, StoreError> {
    view.events = store
        .rollout_events(view.id)
        .await?
        .iter()
        .map(EventView::from)
        .collect();
    Ok(view)
}

/// The rollouts read and steered straight on the store, with no hub in between
/// (`flotilla rollout --database`): for an operator on the database's host, or
/// when every hub is down. An action is the hub's own ([`act`], written by
/// [`steps_commit`]) on the rollout as the store holds it, timed on the database's
/// clock (the hubs decide what follows from it), and written only while the rollouts are at the version it read: a hub's
/// decision taken meanwhile makes it read and decide again, and a hub's next
/// decision on what it held before is refused and read again
/// ([`Recorder::pick_up_rollout_changes`] reads it within a second anyway), so the
/// operator's action is neither lost nor overwritten.
pub mod in_store {
    use super::*;

    /// How many times an action is read and decided again when a hub wrote the
    /// rollouts between its read and its write.
    const ATTEMPTS: usize = 10;

    /// The clusters as the store records them: their last reports, and when each
    /// was last seen (as the hubs last wrote it).
    struct Observed {
        statuses: HashMap<String, StoredStatus>,
        pulses: HashMap<String, Arc<Pulse>>,
    }

    impl Observed {
        async fn read(store: &Store) -> Result<Observed, StoreError> {
            let statuses = store.statuses_by_cluster().await?;
            let mut pulses: HashMap<String, Arc<Pulse>> = HashMap::new();
            for (cluster, at) in store.seen().await? {
                pulses.entry(cluster).or_default().see(at);
            }
            for status in statuses.values() {
                pulses
                    .entry(status.cluster.clone())
                    .or_default()
                    .see(status.received_at_ms);
            }
            Ok(Observed { statuses, pulses })
        }

        fn active(&self, stored: StoredRollout) -> Active {
            let mut a = Active::with(stored, &self.statuses, |cluster| {
                self.pulses.get(cluster).cloned().unwrap_or_default()
            });
            a.refresh();
            a
        }
    }

    fn millis(duration: Duration) -> Millis {
        Millis::try_from(duration.as_millis()).unwrap_or(Millis::MAX)
    }

    /// `GET /v1/rollouts` from the store: the active rollouts, newest first, then the
    /// most recent ended ones.
    pub async fn list(
        store: &Store,
        offline_after: Duration,
    ) -> Result<Vec<RolloutView>, StoreError> {
        let now = store.database_now_ms().await?;
        let observed = Observed::read(store).await?;
        let offline = millis(offline_after);
        let active = store.active_rollouts().await?.into_iter().rev();
        let ended = store.recent_rollouts(RECENT_ROLLOUTS).await?;
        Ok(active
            .chain(ended)
            .map(|stored| observed.active(stored).view(now, offline, None, false))
            .collect())
    }

    /// `GET /v1/rollouts/{id}` from the store.
    pub async fn detail(
        store: &Store,
        id: i64,
        offline_after: Duration,
    ) -> Result<Option<RolloutView>, StoreError> {
        let Some(stored) = store.rollout(id).await? else {
            return Ok(None);
        };
        let now = store.database_now_ms().await?;
        let observed = Observed::read(store).await?;
        let view = observed
            .active(stored)
            .view(now, millis(offline_after), None, true);
        Ok(Some(with_events(store, view).await?))
    }

    /// `POST /v1/rollouts/{id}/{action}` on the store, recorded as done `by`.
    pub async fn action(
        store: &Store,
        id: i64,
        action: Action,
        by: &str,
        offline_after: Duration,
    ) -> Result<RolloutView, ActionRefused> {
        let offline = millis(offline_after);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let version = store.rollouts_version().await.map_err(HubError::from)?;
            let stored = match store.rollout(id).await.map_err(HubError::from)? {
                None => return Err(ActionRefused::NotFound(id)),
                Some(stored) if !stored.rollout.state.is_active() => return Err(ended(&stored)),
                Some(stored) => stored,
            };
            let observed = Observed::read(store).await.map_err(HubError::from)?;
            let rendered = store.rendered().await.map_err(HubError::from)?;
            let latest = crate::recorder::view::latest_of(rendered);
            let now = store.database_now_ms().await.map_err(HubError::from)?;
            let mut a = observed.active(stored);
            // The action alone: what follows from it (a bake ends, a wave fails, the
            // next is released) is the lease holder's to decide, on the reports and
            // polls it sees first-hand; this side sees polls only as the hubs last
            // wrote them (every 30 s), too late to judge who is offline.
            // Whoever reaches the database itself can do anything a hub can: the
            // fleet's admin.
            let step = act(&mut a, action, (by, Role::Admin.as_str()), now, offline)?;
            let view = a.view(now, offline, None, true);
            // The history of what clusters were served is trimmed by the hubs, to
            // their own `--history`.
            let commit = steps_commit(
                std::slice::from_ref(&a),
                &[(0, step)],
                &latest,
                usize::MAX,
                now,
                None,
                version,
            );
            match store.commit(&commit).await {
                Ok(_) => return Ok(with_events(store, view).await.map_err(HubError::from)?),
                Err(StoreError::RolloutsMoved { .. }) if attempt < ATTEMPTS => {
                    tracing::debug!(
                        rollout = id,
                        attempt,
                        "a hub decided meanwhile; deciding again"
                    );
                }
                Err(err) => return Err(HubError::from(err).into()),
            }
        }
    }
}

/// How long recording a render took, in its parts: the lookup of revisions, the
/// decision, the commit and the swap.
fn log_record_timings(
    looking: std::time::Instant,
    lookup: Duration,
    committing: std::time::Instant,
    swapping: std::time::Instant,
) {
    tracing::debug!(
        lookup_ms = lookup.as_millis() as u64,
        plan_ms = (committing.saturating_duration_since(looking) - lookup).as_millis() as u64,
        commit_ms = swapping.saturating_duration_since(committing).as_millis() as u64,
        swap_ms = swapping.elapsed().as_millis() as u64,
        "render recorded"
    );
}

/// Looks every `every` whether the rollouts were changed beside this hub (an
/// operator's action written straight into the database) and takes the change up.
pub async fn run_watch(shared: Arc<Shared>, every: Duration) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(err) = shared.recorder.pick_up_rollout_changes().await {
            tracing::warn!("cannot look for changes of the rollouts in the database: {err}");
        }
    }
}

/// How often the last-seen times are written to the store.
const SEEN_FLUSH: Duration = Duration::from_secs(30);

/// The rollout timer: decides again at the next bake end, deadline, silence or window
/// (or when woken), and writes last-seen times now and then.
pub async fn run_timer(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut written = HashMap::new();
    let mut last_flush = tokio::time::Instant::now();
    loop {
        let next = match shared.recorder.tick_rollouts().await {
            Ok(next) => next,
            Err(err) if err.is_concurrent_change() => {
                tracing::info!("deciding on the rollouts again: {err}");
                Some(shared.settings.clock.now_ms() + 1_000)
            }
            Err(err) => {
                tracing::error!("cannot decide on the rollouts: {err}");
                Some(shared.settings.clock.now_ms() + 5_000)
            }
        };
        if last_flush.elapsed() >= SEEN_FLUSH {
            if let Err(err) = shared.recorder.flush_seen(&mut written).await {
                tracing::warn!("cannot record when clusters were last seen: {err}");
            }
            last_flush = tokio::time::Instant::now();
        }
        let wait = next
            .map(|at| {
                Duration::from_millis(
                    u64::try_from(at - shared.settings.clock.now_ms()).unwrap_or(0),
                )
            })
            .unwrap_or(SEEN_FLUSH)
            .min(SEEN_FLUSH);
        let clock = shared.settings.clock.clone();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.recorder.rollouts.wake.notified() => {}
            _ = async {
                match clock.advanced() {
                    Some(notify) => notify.notified().await,
                    None => std::future::pending().await,
                }
            } => {}
            _ = shutdown.changed() => {
                let _ = shared.recorder.flush_seen(&mut written).await;
                return;
            }
        }
    }
}
