//! Rollouts on the hub: it gathers the inputs of the pure decision
//! ([`flotilla_core::rollout::decide`]), calls it, records the result and applies it.
//!
//! - A clean render ([`Shared::record_render`]) serves ungoverned and new clusters at
//!   once, starts one rollout per policy whose clusters it changes (superseding the
//!   running one), and lets clusters that left a policy leave its rollout.
//! - Every status report ([`Shared::report_to_rollouts`]), every operator action and the
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::HubError;
use super::state::{ClusterBundle, Latest, Pulse, Served, Shared};
use crate::store::rollouts::MemberRow;
use crate::store::{
    Commit, Fence, RenderedCluster, RolloutWrite, ServedChange, Store, StoreError, StoredRollout,
    StoredStatus,
};
use flotilla_core::bundle::Digest;
use flotilla_core::rollout::view::{EventView, RolloutView};
use flotilla_core::rollout::{
    ActionError, Member, Millis, Observation, Report, Rollout, Serve, Step, decide_with, judge,
    order_key,
};
use flotilla_render::RenderOutput;

/// How many ended rollouts `GET /v1/rollouts` lists after the active ones.
pub const RECENT_ROLLOUTS: i64 = 20;

/// The revisions of a member's previous digest and of its target.
type Revisions = (Option<String>, String);

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
    fn new(shared: &Shared, stored: StoredRollout) -> Active {
        let statuses = shared.statuses.read().unwrap_or_else(|e| e.into_inner());
        Active::with(stored, &statuses, |cluster| shared.pulse(cluster))
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

    /// Brings the observations up to date with the pulses (polls and reports seen).
    fn refresh(&mut self) {
        for (observation, pulse) in self.observations.iter_mut().zip(&self.pulses) {
            observation.last_seen = pulse.seen();
            observation.fetched_at = pulse.fetched();
        }
    }

    fn view(&self, now: Millis, offline_after: Millis, detail: bool) -> RolloutView {
        RolloutView::of(
            self.id,
            &self.rollout,
            &self.observations,
            now,
            offline_after,
            detail,
        )
    }
}

/// The rollouts' state on the hub.
#[derive(Default)]
pub struct Engine {
    active: tokio::sync::Mutex<Vec<Active>>,
    /// Wakes the timer: a decision may have moved the next deadline, or a cluster
    /// fetched the new digest.
    pub wake: Notify,
    superseded: AtomicU64,
    decisions: AtomicU64,
    /// No wave is released before this time (ms; 0: no such limit): a hub started with
    /// no record of when its clusters were last seen first gives them the offline
    /// threshold to be heard from.
    release_not_before: std::sync::atomic::AtomicI64,
    /// The active rollouts as last decided, for `/metrics` and `/v1/fleet` without a lock.
    views: arc_swap::ArcSwap<Vec<RolloutView>>,
    /// The store's version of the rollouts held in `active` (see
    /// [`Store::rollouts_version`]): a decision is written only while the store is
    /// still at it.
    version: std::sync::atomic::AtomicI64,
}

impl Engine {
    pub fn hold_releases_until(&self, at: Millis) {
        self.release_not_before.store(at, Ordering::Relaxed);
    }

    fn release_not_before(&self) -> Option<Millis> {
        Some(self.release_not_before.load(Ordering::Relaxed)).filter(|&at| at > 0)
    }

    /// Rollouts superseded since the hub started.
    pub fn superseded(&self) -> u64 {
        self.superseded.load(Ordering::Relaxed)
    }

    /// Decisions taken since the hub started.
    pub fn decisions(&self) -> u64 {
        self.decisions.load(Ordering::Relaxed)
    }

    /// The active rollouts, as of the last decision.
    pub fn active_views(&self) -> Arc<Vec<RolloutView>> {
        self.views.load_full()
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
    let served = step
        .serve
        .iter()
        .map(|&(i, serve)| served_change(&rollout.members[i], &active.revisions[i], serve, latest))
        .collect();
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

/// What a member is served after a step: its new digest, or its previous one (a new
/// cluster, which had none, goes back to being held on what its agent runs).
fn served_change(
    member: &Member,
    revisions: &Revisions,
    serve: Serve,
    latest: &HashMap<String, Arc<Latest>>,
) -> ServedChange {
    match (serve, &member.previous) {
        (Serve::Target, _) => ServedChange {
            cluster: member.cluster.clone(),
            digest: member.target.clone(),
            revision: revisions.1.clone(),
            hold: false,
        },
        (Serve::Previous, Some(previous)) => ServedChange {
            cluster: member.cluster.clone(),
            digest: previous.clone(),
            revision: revisions.0.clone().unwrap_or_else(|| revisions.1.clone()),
            hold: false,
        },
        (Serve::Previous, None) => {
            let fresh = latest.get(&member.cluster);
            ServedChange {
                cluster: member.cluster.clone(),
                digest: fresh.map_or_else(|| member.target.clone(), |l| l.digest.clone()),
                revision: fresh.map_or_else(|| revisions.1.clone(), |l| l.revision.clone()),
                hold: true,
            }
        }
    }
}

fn offline_after(shared: &Shared) -> Millis {
    Millis::try_from(shared.settings.offline_after.as_millis()).unwrap_or(Millis::MAX)
}

/// Brings a rollout's observations up to date and decides.
fn decide_now(shared: &Shared, a: &mut Active, now: Millis) -> Step {
    a.refresh();
    decide_with(
        &mut a.rollout,
        &a.observations,
        now,
        offline_after(shared),
        shared.rollouts.release_not_before(),
    )
}

/// An operator's action on one rollout, and nothing it leads to: the same on a hub
/// and straight on the store.
fn act(
    a: &mut Active,
    action: Action,
    by: &str,
    now: Millis,
    offline: Millis,
) -> Result<Step, ActionError> {
    a.refresh();
    match action {
        Action::Pause => a.rollout.pause(by, now),
        Action::Resume => a.rollout.resume(by, now),
        Action::Promote => {
            let observations = a.observations.clone();
            a.rollout.promote(by, now, offline, &observations)
        }
        Action::Abort => a.rollout.abort(by, now),
    }
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

impl Shared {
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
            self.sync_from_store().await?;
        }
        self.rollouts.wake.notify_one();
        Ok(true)
    }

    fn publish_views(&self, active: &[Active]) {
        let now = self.settings.clock.now_ms();
        let views: Vec<RolloutView> = active
            .iter()
            .map(|a| a.view(now, offline_after(self), false))
            .collect();
        self.rollouts.views.store(Arc::new(views));
    }

    /// Records a clean render: what HEAD renders per cluster, what changes for whom at
    /// once, and the rollouts it starts, supersedes or leaves; in one transaction.
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
        let served = self.served.load_full();
        let old_latest = self.latest.load_full();
        let plan = &output.rollouts;
        let mut commit = Commit {
            revision: Some(output.revision.clone()),
            history: self.settings.history,
            now_ms: now,
            fence: self.lease.fence(),
            expect_revision,
            ..Commit::default()
        };
        let version = self.rollouts.version.load(Ordering::Acquire);

        // What HEAD renders for each cluster. A digest a cluster was served before
        // keeps the revision it was first served with (looked up in one batch).
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
        let looking = std::time::Instant::now();
        let mut in_history = self.store.revisions_in_history(&new_digests).await?;
        let lookup = looking.elapsed();
        drop(new_digests);
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
                commit.rendered.push(RenderedCluster {
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
        let removed: BTreeSet<String> = served
            .clusters
            .keys()
            .chain(old_latest.keys())
            .filter(|name| !output.bundles.contains_key(*name))
            .cloned()
            .collect();
        commit.removed = removed.iter().cloned().collect();

        // At once: ungoverned clusters get HEAD's render; new clusters are held on what
        // their agent runs (a fresh agent gets HEAD's render) unless ungoverned.
        let mut now_served: HashMap<&str, (Digest, bool)> = HashMap::new();
        for (name, entry) in &latest {
            let current = served.clusters.get(name);
            let governed = entry.policy.is_some();
            let change = match current {
                None => Some(entry.paused || governed),
                Some(_) if entry.paused => None,
                Some(c) if !governed && (c.digest != entry.digest || c.hold) => Some(false),
                Some(c) if governed && c.hold && c.digest != entry.digest => Some(true),
                Some(_) => None,
            };
            if let Some(hold) = change {
                commit.served.push(ServedChange {
                    cluster: name.clone(),
                    digest: entry.digest.clone(),
                    revision: entry.revision.clone(),
                    hold,
                });
                now_served.insert(name, (entry.digest.clone(), hold));
            } else if let Some(c) = current {
                now_served.insert(name, (c.digest.clone(), c.hold));
            }
        }
        let changing = |name: &str, entry: &Latest| -> bool {
            entry.policy.is_some()
                && !entry.paused
                && now_served
                    .get(name)
                    .is_none_or(|(digest, hold)| *hold || *digest != entry.digest)
        };
        // A policy is touched by this commit when one of its clusters changes and
        // what HEAD renders for it is new (or it is new to the policy).
        let mut touched: BTreeSet<&str> = BTreeSet::new();
        for (name, entry) in &latest {
            if !changing(name, entry) {
                continue;
            }
            let new_here = old_latest.get(name).is_none_or(|old| {
                old.digest != entry.digest || old.policy != entry.policy || old.paused
            });
            if new_here && let Some(policy) = &entry.policy {
                touched.insert(policy);
            }
        }

        let mut writes = Vec::new();
        let mut served_changes: Vec<ServedChange> = Vec::new();
        // Running rollouts: clusters that left, and supersede.
        for a in active.iter_mut() {
            let mut steps = Vec::new();
            for i in 0..a.rollout.members.len() {
                let member = &a.rollout.members[i];
                if member.left {
                    continue;
                }
                let why = match latest.get(&member.cluster) {
                    None => Some("removed from the fleet".to_string()),
                    Some(l) if l.paused => Some("paused (spec.paused)".to_string()),
                    Some(l) if l.policy.as_deref() != Some(&a.rollout.policy.name) => {
                        Some(format!(
                            "no longer governed by rollout policy {}",
                            a.rollout.policy.name
                        ))
                    }
                    _ => None,
                };
                if let Some(why) = why {
                    steps.push(a.rollout.leave(i, &why, now));
                }
            }
            if touched.contains(a.rollout.policy.name.as_str())
                && a.rollout.revision != output.revision
            {
                steps.push(a.rollout.supersede(&output.revision, now));
                self.rollouts.superseded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    rollout = a.id,
                    policy = %a.rollout.policy.name,
                    by = %output.revision,
                    "superseded by a newer commit"
                );
            }
            if !a.rollout.state.is_active() || !steps.is_empty() {
                // A rollout whose clusters all left may complete now.
                steps.push(decide_now(self, a, now));
            }
            let merged = merge_steps(steps);
            if merged.changed || !merged.dirty.is_empty() || !merged.serve.is_empty() {
                let (write, served) = write_of(a, &merged, false, &latest);
                writes.push(write);
                served_changes.extend(served);
            }
        }

        // New rollouts.
        let mut started = 0;
        let mut next_id = self.store.next_rollout_id().await?;
        let mut new_actives = Vec::new();
        for policy in &plan.policies {
            if !touched.contains(policy.name.as_str()) {
                continue;
            }
            if self
                .store
                .rollout_exists(&policy.name, &output.revision)
                .await?
            {
                continue;
            }
            let mut members: Vec<(Member, Revisions, [u8; 32])> = Vec::new();
            for (name, placement) in &plan.placements {
                let Some(entry) = latest.get(name) else {
                    continue;
                };
                if plan.policies.get(placement.policy).map(|p| &p.name) != Some(&policy.name)
                    || !changing(name, entry)
                {
                    continue;
                }
                let current = served.clusters.get(name).filter(|c| !c.hold);
                members.push((
                    Member::new(
                        name.clone(),
                        placement.wave,
                        current.map(|c| c.digest.clone()),
                        entry.digest.clone(),
                    ),
                    (current.map(|c| c.revision.clone()), entry.revision.clone()),
                    order_key(&policy.name, name),
                ));
            }
            if members.is_empty() {
                continue;
            }
            members.sort_by(|a, b| (a.0.wave, &a.2).cmp(&(b.0.wave, &b.2)));
            let (list, revisions): (Vec<Member>, Vec<_>) =
                members.into_iter().map(|(m, r, _)| (m, r)).unzip();
            let (rollout, start) =
                Rollout::start(policy.clone(), output.revision.clone(), forced, list, now);
            let mut a = Active::new(
                self,
                StoredRollout {
                    id: next_id,
                    rollout,
                    revisions,
                },
            );
            next_id += 1;
            let first = decide_now(self, &mut a, now);
            let merged = merge_steps(vec![start, first]);
            let (write, served) = write_of(&a, &merged, true, &latest);
            tracing::info!(
                rollout = a.id,
                policy = %policy.name,
                revision = %output.revision,
                clusters = a.rollout.members.len(),
                forced,
                "rollout started"
            );
            writes.push(write);
            served_changes.extend(served);
            new_actives.push(a);
            started += 1;
        }

        // Later changes of a cluster win over earlier ones within this commit.
        commit.served.extend(served_changes);
        let mut last: HashMap<String, ServedChange> = HashMap::new();
        for change in commit.served.drain(..) {
            last.insert(change.cluster.clone(), change);
        }
        commit.served = last.into_values().collect();
        commit.served.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        commit.rollouts = writes;
        if !commit.rollouts.is_empty() {
            commit.rollouts_version = Some(version);
        }
        let committing = std::time::Instant::now();
        let planning = committing.saturating_duration_since(looking) - lookup;
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
        self.latest.store(Arc::new(latest));
        self.apply_served(&commit.served, &sequences, &removed, commit.now_ms);
        tracing::debug!(
            lookup_ms = lookup.as_millis() as u64,
            plan_ms = planning.as_millis() as u64,
            commit_ms = swapping.saturating_duration_since(committing).as_millis() as u64,
            swap_ms = swapping.elapsed().as_millis() as u64,
            "render recorded"
        );
        let outcome = RenderOutcome {
            served_changes: commit.served.len(),
            removed: removed.len(),
            rollouts_started: started,
            swapped_at: Some(std::time::Instant::now()),
        };
        if !removed.is_empty() {
            let mut statuses = self.statuses.write().unwrap_or_else(|e| e.into_inner());
            for name in &removed {
                statuses.remove(name);
            }
        }
        active.extend(new_actives);
        active.retain(|a| a.rollout.state.is_active());
        self.rollouts.decisions.fetch_add(1, Ordering::Relaxed);
        self.publish_views(&active);
        drop(active);
        self.rollouts.wake.notify_one();
        self.delete_objects(&unreferenced).await;
        Ok(outcome)
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
        let current = self.served.load_full();
        let mut next = Served {
            clusters: current.clusters.clone(),
        };
        for name in removed {
            next.clusters.remove(name);
        }
        for change in changes {
            let pulse = self.pulse(&change.cluster);
            next.clusters.insert(
                change.cluster.clone(),
                Arc::new(ClusterBundle::serving(
                    change.cluster.clone(),
                    change.digest.clone(),
                    change.revision.clone(),
                    change.hold,
                    pulse,
                    sequences.get(&change.cluster).copied().unwrap_or(0),
                    Some(now_ms),
                )),
            );
        }
        self.swap(next);
    }

    /// Deletes the objects a commit left unreferenced, on a hub alone on its database.
    /// With several hubs, garbage collection takes them once they have been
    /// unreferenced for long enough ([`Shared::collect_garbage`]).
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
        let latest = self.latest.load_full();
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
        self.rollouts
            .decisions
            .fetch_add(steps.len() as u64, Ordering::Relaxed);
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

    /// An operator's `pause`, `resume`, `promote` or `abort`, recorded with the id of
    /// the token that asked for it.
    pub async fn rollout_action(
        &self,
        id: i64,
        action: Action,
        by: &str,
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
        let acted = act(a, action, by, now, offline)?;
        let then = decide_now(self, a, now);
        let step = merge_steps(vec![acted, then]);
        tracing::info!(rollout = id, ?action, by, "operator action");
        let view = a.view(now, offline, true);
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
                .map(|a| a.view(now, offline_after(self), false))
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
        a.view(now, offline_after(self), detail)
    }

    /// `GET /v1/rollouts/{id}`: one rollout with its clusters and every event.
    pub async fn rollout_detail(&self, id: i64) -> Result<Option<RolloutView>, HubError> {
        let now = self.settings.clock.now_ms();
        let view = {
            let active = self.rollouts.active.lock().await;
            active
                .iter()
                .find(|a| a.id == id)
                .map(|a| a.view(now, offline_after(self), true))
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
        let pulses: Vec<(String, i64)> = {
            let pulses = self.pulses.lock().unwrap_or_else(|e| e.into_inner());
            pulses
                .iter()
                .filter_map(|(name, pulse)| Some((name.clone(), pulse.seen()?)))
                .filter(|(name, seen)| written.get(name) != Some(seen))
                .collect()
        };
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
/// ([`Shared::pick_up_rollout_changes`] reads it within a second anyway), so the
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
            .map(|stored| observed.active(stored).view(now, offline, false))
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
            .view(now, millis(offline_after), true);
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
            let latest = crate::state::latest_of(rendered);
            let now = store.database_now_ms().await.map_err(HubError::from)?;
            let mut a = observed.active(stored);
            // The action alone: what follows from it (a bake ends, a wave fails, the
            // next is released) is the lease holder's to decide, on the reports and
            // polls it sees first-hand; this side sees polls only as the hubs last
            // wrote them (every 30 s), too late to judge who is offline.
            let step = act(&mut a, action, by, now, offline)?;
            let view = a.view(now, offline, true);
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

/// Several steps of one rollout as one.
fn merge_steps(steps: Vec<Step>) -> Step {
    let mut merged = Step::default();
    for step in steps {
        merged.serve.extend(step.serve);
        merged.events.extend(step.events);
        merged.dirty.extend(step.dirty);
        merged.changed |= step.changed;
        merged.next_check = match (merged.next_check, step.next_check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    merged.dirty.sort_unstable();
    merged.dirty.dedup();
    merged
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
        if let Err(err) = shared.pick_up_rollout_changes().await {
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
        let next = match shared.tick_rollouts().await {
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
            if let Err(err) = shared.flush_seen(&mut written).await {
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
            _ = shared.rollouts.wake.notified() => {}
            _ = async {
                match clock.advanced() {
                    Some(notify) => notify.notified().await,
                    None => std::future::pending().await,
                }
            } => {}
            _ = shutdown.changed() => {
                let _ = shared.flush_seen(&mut written).await;
                return;
            }
        }
    }
}
