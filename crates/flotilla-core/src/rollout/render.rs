//! What a clean render changes: the pure decision the hub takes when it records one.
//!
//! Given what each cluster is served, what the previous and the new clean render give
//! it, the rollout plan, the running rollouts and the time, [`decide_render`] says
//! what is served now (ungoverned clusters at once, new clusters held on what their
//! agents run), which running rollouts lose members or are superseded, and which new
//! rollouts start, with the first decision on each. The hub gathers those inputs,
//! writes the [`RenderDecision`] in one transaction and then applies it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::Rollout;
use super::{Member, Millis, Observation, RolloutPlan, Serve, Step, decide_with, order_key};
use crate::bundle::Digest;

/// What the latest clean render gives one cluster, and where the rollout plan puts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latest {
    pub digest: Digest,
    /// The revision that first rendered this digest for this cluster.
    pub revision: String,
    pub policy: Option<String>,
    pub wave: Option<String>,
    pub paused: bool,
}

/// What one cluster is served now, as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServedRef<'a> {
    pub digest: &'a Digest,
    pub revision: &'a str,
    /// A new cluster whose wave is not released: an agent naming the digest it runs
    /// keeps it; a fresh agent gets `digest`.
    pub hold: bool,
}

/// What every cluster is served now: the hub's in-memory table, or a map in tests.
pub trait ServedState {
    fn served(&self, cluster: &str) -> Option<ServedRef<'_>>;
    /// Every cluster that is served something.
    fn served_names(&self) -> Box<dyn Iterator<Item = &str> + '_>;
}

/// A cluster's served entry, owned (for tests and tools).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedEntry {
    pub digest: Digest,
    pub revision: String,
    pub hold: bool,
}

impl ServedState for HashMap<String, ServedEntry> {
    fn served(&self, cluster: &str) -> Option<ServedRef<'_>> {
        self.get(cluster).map(|e| ServedRef {
            digest: &e.digest,
            revision: &e.revision,
            hold: e.hold,
        })
    }

    fn served_names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        Box::new(self.keys().map(String::as_str))
    }
}

/// One change of what a cluster is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedChange {
    pub cluster: String,
    pub digest: Digest,
    pub revision: String,
    pub hold: bool,
}

/// The revisions of a member's previous digest and of its target.
pub type Revisions = (Option<String>, String);

/// A rollout that has not ended, as the decision sees it: it may change the rollout
/// (a member leaves, a newer commit supersedes it) and reads what is known of its
/// members.
pub struct Running<'a> {
    pub rollout: &'a mut Rollout,
    /// Per member, the revisions of its previous digest and of its target.
    pub revisions: &'a [Revisions],
    /// Per member, its latest report and when it was last seen and fetched.
    pub observations: &'a [Observation],
}

/// Everything a clean render's decision depends on.
pub struct RenderInput<'a, S: ServedState> {
    /// The revision the render is of.
    pub revision: &'a str,
    /// The commit carries `Flotilla-Rollout: immediate`.
    pub forced: bool,
    pub now: Millis,
    pub offline_after: Millis,
    /// No wave is released before this time (a hub on a new store).
    pub release_not_before: Option<Millis>,
    pub plan: &'a RolloutPlan,
    pub served: &'a S,
    /// What the previous clean render gave each cluster.
    pub old_latest: &'a HashMap<String, Arc<Latest>>,
    /// What this render gives each cluster (every cluster of the fleet).
    pub latest: &'a HashMap<String, Arc<Latest>>,
    /// The policies that already have a rollout for this revision, in any state (a
    /// restart or a second hub never starts one twice; an aborted one stays aborted).
    pub existing: &'a BTreeSet<String>,
}

/// A rollout this render starts, with the first decision on it.
#[derive(Debug)]
pub struct Started {
    pub rollout: Rollout,
    pub revisions: Vec<Revisions>,
    pub observations: Vec<Observation>,
    /// Its start and first decision, merged.
    pub step: Step,
}

/// What recording a clean render changes.
#[derive(Debug, Default)]
pub struct RenderDecision {
    /// What clusters are served now, one change per cluster (a later change of a
    /// cluster within the decision wins), sorted by cluster.
    pub served: Vec<ServedChange>,
    /// Clusters served something or rendered before and no longer in the fleet.
    pub removed: BTreeSet<String>,
    /// Per running rollout (index into the `running` given) what changed, for those
    /// with something to record.
    pub steps: Vec<(usize, Step)>,
    /// The running rollouts (indices) this render superseded.
    pub superseded: Vec<usize>,
    pub started: Vec<Started>,
}

/// Decides what a clean render changes. `observe` tells what is known of a cluster
/// for a digest (its latest report judged against that digest, when it was last seen
/// and fetched): it is asked about held clusters and about the members of the
/// rollouts that start.
pub fn decide_render<S: ServedState>(
    input: &RenderInput<'_, S>,
    running: &mut [Running<'_>],
    observe: impl Fn(&str, &Digest) -> Observation,
) -> RenderDecision {
    let mut decision = RenderDecision {
        removed: removed(input),
        ..RenderDecision::default()
    };
    // A held cluster is new only until the hub knows what it runs: it fetched the
    // digest it is served, or it reported. From then on it keeps that digest until
    // its wave is released, whatever a poll without `If-None-Match` asks.
    let known = |name: &str, served: ServedRef<'_>| {
        let seen = observe(name, served.digest);
        seen.report.is_some() || seen.fetched_at.is_some()
    };
    let (at_once, now_served) = serve_at_once(input, &known);
    let touched = touched_policies(input, &now_served);
    let mut changes = at_once;

    for (index, run) in running.iter_mut().enumerate() {
        let (step, superseded) = move_running(input, run, &touched);
        if superseded {
            decision.superseded.push(index);
        }
        if step.changed || !step.dirty.is_empty() || !step.serve.is_empty() {
            changes.extend(served_changes(
                run.rollout,
                run.revisions,
                &step,
                input.latest,
            ));
            decision.steps.push((index, step));
        }
    }

    for policy in &input.plan.policies {
        if !touched.contains(policy.name.as_str()) || input.existing.contains(&policy.name) {
            continue;
        }
        if let Some(started) = start(input, &now_served, policy, &observe, &known) {
            changes.extend(served_changes(
                &started.rollout,
                &started.revisions,
                &started.step,
                input.latest,
            ));
            decision.started.push(started);
        }
    }

    decision.served = last_change_wins(changes);
    decision
}

/// Clusters served something or rendered before that this render no longer has.
fn removed<S: ServedState>(input: &RenderInput<'_, S>) -> BTreeSet<String> {
    input
        .served
        .served_names()
        .chain(input.old_latest.keys().map(String::as_str))
        .filter(|name| !input.latest.contains_key(*name))
        .map(str::to_string)
        .collect()
}

/// What is served at once, whatever the rollouts: ungoverned clusters get HEAD's
/// render; new clusters are held on what their agents run (a fresh agent gets HEAD's
/// render) unless ungoverned. Returns those changes and, for every cluster, the
/// digest it is served after them and whether it is held.
fn serve_at_once<'a, S: ServedState>(
    input: &RenderInput<'a, S>,
    known: &impl Fn(&str, ServedRef<'_>) -> bool,
) -> (Vec<ServedChange>, HashMap<&'a str, (Digest, bool)>) {
    let mut changes = Vec::new();
    let mut now_served = HashMap::with_capacity(input.latest.len());
    for (name, entry) in input.latest {
        let current = input.served.served(name);
        let governed = entry.policy.is_some();
        // Held, and the hub does not know what its agent runs.
        let new = current.is_some_and(|c| c.hold && !known(name, c));
        let change = match current {
            None => Some(entry.paused || governed),
            Some(_) if entry.paused => None,
            Some(c) if !governed && (*c.digest != entry.digest || c.hold) => Some(false),
            Some(c) if governed && new && *c.digest != entry.digest => Some(true),
            Some(_) => None,
        };
        if let Some(hold) = change {
            changes.push(ServedChange {
                cluster: name.clone(),
                digest: entry.digest.clone(),
                revision: entry.revision.clone(),
                hold,
            });
            now_served.insert(name.as_str(), (entry.digest.clone(), hold));
        } else if let Some(c) = current {
            // Still held (a known cluster too): it changes when its wave is released.
            now_served.insert(name.as_str(), (c.digest.clone(), c.hold));
        }
    }
    (changes, now_served)
}

/// Whether a cluster changes in a rollout of its policy: it is governed, not paused,
/// and held or served another digest than HEAD renders for it.
fn changing(name: &str, entry: &Latest, now_served: &HashMap<&str, (Digest, bool)>) -> bool {
    entry.policy.is_some()
        && !entry.paused
        && now_served
            .get(name)
            .is_none_or(|(digest, hold)| *hold || *digest != entry.digest)
}

/// The policies this commit touches: one of their clusters changes and what HEAD
/// renders for it is new (or it is new to the policy).
fn touched_policies<'a, S: ServedState>(
    input: &RenderInput<'a, S>,
    now_served: &HashMap<&str, (Digest, bool)>,
) -> BTreeSet<&'a str> {
    let mut touched = BTreeSet::new();
    for (name, entry) in input.latest {
        if !changing(name, entry, now_served) {
            continue;
        }
        let new_here = input.old_latest.get(name).is_none_or(|old| {
            old.digest != entry.digest || old.policy != entry.policy || old.paused
        });
        if new_here && let Some(policy) = &entry.policy {
            touched.insert(policy.as_str());
        }
    }
    touched
}

/// A running rollout after this render: members removed from the fleet, paused or
/// moved to another policy leave it, and a commit that touches its policy supersedes
/// it. Returns what changed and whether it was superseded.
fn move_running<S: ServedState>(
    input: &RenderInput<'_, S>,
    run: &mut Running<'_>,
    touched: &BTreeSet<&str>,
) -> (Step, bool) {
    let rollout = &mut *run.rollout;
    let mut steps = Vec::new();
    let supersede =
        touched.contains(rollout.policy.name.as_str()) && rollout.revision != input.revision;
    for i in 0..rollout.members.len() {
        let member = &rollout.members[i];
        if member.left {
            continue;
        }
        let why = match input.latest.get(&member.cluster) {
            None => Some("removed from the fleet".to_string()),
            Some(l) if l.paused => Some("paused (spec.paused)".to_string()),
            Some(l) if l.policy.as_deref() != Some(&rollout.policy.name) => Some(format!(
                "no longer governed by rollout policy {}",
                rollout.policy.name
            )),
            // A later commit that renders for it what it is served again (a revert)
            // changes nothing and supersedes nothing, but the rollout must not serve it
            // a render HEAD no longer makes.
            Some(l) if l.digest != member.target && !supersede => {
                Some(format!("{} renders another digest for it", input.revision))
            }
            _ => None,
        };
        if let Some(why) = why {
            steps.push(rollout.leave(i, &why, input.now));
        }
    }
    if supersede {
        steps.push(rollout.supersede(input.revision, input.now));
    }
    if !rollout.state.is_active() || !steps.is_empty() {
        // A rollout whose clusters all left may complete now.
        steps.push(decide_with(
            rollout,
            run.observations,
            input.now,
            input.offline_after,
            input.release_not_before,
        ));
    }
    (merge_steps(steps), supersede)
}

/// The rollout this commit starts for one touched policy: its changing clusters, in
/// wave order and, within a wave, in the policy's stable order; `None` when none of
/// its clusters change.
fn start<S: ServedState>(
    input: &RenderInput<'_, S>,
    now_served: &HashMap<&str, (Digest, bool)>,
    policy: &super::Policy,
    observe: &impl Fn(&str, &Digest) -> Observation,
    known: &impl Fn(&str, ServedRef<'_>) -> bool,
) -> Option<Started> {
    let plan = input.plan;
    let mut members: Vec<(Member, Revisions, [u8; 32])> = Vec::new();
    for (name, placement) in &plan.placements {
        let Some(entry) = input.latest.get(name) else {
            continue;
        };
        if plan.policies.get(placement.policy).map(|p| &p.name) != Some(&policy.name)
            || !changing(name, entry, now_served)
        {
            continue;
        }
        // What it runs, if the hub knows: its previous digest, served again on a
        // rollback or an abort.
        let current = input
            .served
            .served(name)
            .filter(|c| !c.hold || known(name, *c));
        members.push((
            Member::new(
                name.clone(),
                placement.wave,
                current.map(|c| c.digest.clone()),
                entry.digest.clone(),
            ),
            (
                current.map(|c| c.revision.to_string()),
                entry.revision.clone(),
            ),
            order_key(&policy.name, name),
        ));
    }
    if members.is_empty() {
        return None;
    }
    members.sort_by(|a, b| (a.0.wave, &a.2).cmp(&(b.0.wave, &b.2)));
    let (list, revisions): (Vec<Member>, Vec<Revisions>) =
        members.into_iter().map(|(m, r, _)| (m, r)).unzip();
    let observations = list
        .iter()
        .map(|m| observe(&m.cluster, &m.target))
        .collect::<Vec<_>>();
    let (mut rollout, begin) = Rollout::start(
        policy.clone(),
        input.revision.to_string(),
        input.forced,
        list,
        input.now,
    );
    let first = decide_with(
        &mut rollout,
        &observations,
        input.now,
        input.offline_after,
        input.release_not_before,
    );
    Some(Started {
        rollout,
        revisions,
        observations,
        step: merge_steps(vec![begin, first]),
    })
}

/// What the members a step serves anew are served.
pub fn served_changes(
    rollout: &Rollout,
    revisions: &[Revisions],
    step: &Step,
    latest: &HashMap<String, Arc<Latest>>,
) -> Vec<ServedChange> {
    step.serve
        .iter()
        .map(|&(i, serve)| served_change(&rollout.members[i], &revisions[i], serve, latest))
        .collect()
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

/// One change per cluster, the last one made, sorted by cluster.
fn last_change_wins(changes: Vec<ServedChange>) -> Vec<ServedChange> {
    let mut last: HashMap<String, ServedChange> = HashMap::with_capacity(changes.len());
    for change in changes {
        last.insert(change.cluster.clone(), change);
    }
    let mut served: Vec<ServedChange> = last.into_values().collect();
    served.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    served
}

/// Several steps of one rollout as one: their changes in order, the earliest next check.
pub fn merge_steps(steps: Vec<Step>) -> Step {
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

#[cfg(test)]
mod tests;
