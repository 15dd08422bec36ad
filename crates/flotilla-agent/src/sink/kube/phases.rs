//! Apply phases. The renderer puts a bundle's workloads in phases, one per level of
//! their `spec.dependsOn` graph. The kube sink applies one phase at a time, and the next
//! only once every resource of this one that has a health rule ([`super::health`]) is
//! healthy: it looks again every `crd_poll`, for at most `phase_timeout`. A phase that
//! fails, or is not healthy in time, holds the later ones back: they are not applied,
//! the apply is incomplete, and the agent tries again later (then the phases already
//! healthy pass at once, on the apply's own answers). A bundle of one phase is applied
//! without waiting, as bundles without dependencies always were. Within its phase, a
//! Helm release's due hooks run before and after its resources ([`super::hooks`]); a
//! hook that fails holds back everything not applied yet.
//!
//! Prune goes the other way, after the last phase: what left the bundle is deleted
//! phase by phase in reverse, by the phase its workload had in the bundle last applied
//! completely (the last phase's objects first, their dependencies last). A phase's
//! deletions are all accepted, and its objects that were still there being deleted
//! (finalizers, a Namespace terminating) gone, before the next phase's start; a Helm
//! release that leaves runs its `pre-delete` hooks before its objects are deleted and
//! its `post-delete` hooks after. A `pre-delete` hook that fails keeps its release, and
//! the phases before it, in place; the apply is incomplete and tried again.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;

use super::failure::Failure;
use super::hooks::{Hooks, Leaving, When};
use super::ledger::Ledger;
use super::{Line, Run, has_health_rule, job_run, prune, read_health};
use crate::cache::InventoryEntry;
use crate::sink::{apply_phases, prune_phases};
use flotilla_core::bundle::{Bundle, Resource, ResourceKey};
use flotilla_core::status::{ResourceState, ResourceStatus};

/// Whether a resource is one a phase's pre hooks may stand on: a Namespace, a
/// CustomResourceDefinition, or what flotilla makes for a tenant (the ServiceAccount
/// its objects are applied as, and its bindings).
fn is_groundwork(bundle: &Bundle, resource: &Resource) -> bool {
    let key = &resource.key;
    if matches!(
        (key.group(), key.kind()),
        ("", "Namespace") | ("apiextensions.k8s.io", "CustomResourceDefinition")
    ) {
        return true;
    }
    let Some(meta) = bundle.meta.as_deref() else {
        return false;
    };
    bundle
        .resources
        .binary_search_by(|r| r.key.cmp(&resource.key))
        .ok()
        .and_then(|index| meta.workloads.get(index))
        .is_some_and(|workload| workload == flotilla_core::bundle::TENANCY_WORKLOAD)
}

/// Whether the resource of `bundle` with this identity is groundwork ([`is_groundwork`]).
fn is_groundwork_key(bundle: &Bundle, key: &ResourceKey) -> bool {
    bundle
        .resources
        .binary_search_by(|r| (*r.key).cmp(key))
        .is_ok_and(|index| is_groundwork(bundle, &bundle.resources[index]))
}

/// What keeps objects out of a phase's prune: hooks of the bundle last applied, and
/// the releases whose `pre-delete` hooks failed.
struct Held<'a, 'b> {
    previous_hooks: &'a HashSet<ResourceKey>,
    leaving: &'a Leaving<'b>,
    kept: &'a [(&'b str, String)],
}

impl Pruned {
    /// Leaves `entry` in place, still listed for the next try.
    fn leave(&mut self, entry: &InventoryEntry, message: String) {
        self.lines.push(ResourceStatus::new(
            entry.shared_key(),
            ResourceState::Applied,
            message,
        ));
        self.retained.push(entry.clone());
    }
}

impl Run {
    /// Prunes `entries`, adding their lines (and what stays listed) to `pruned`;
    /// returns those still being deleted.
    async fn prune_entries(
        &mut self,
        ledger: &Ledger,
        entries: &[&InventoryEntry],
        context: &prune::Context<'_>,
        held: &Held<'_, '_>,
        pruned: &mut Pruned,
    ) -> Vec<((ResourceKey, super::discovery::Found), InventoryEntry)> {
        let mut lingering = Vec::new();
        for &entry in entries {
            let key = entry.key();
            // Hooks are outside prune: a leaving release's delete hooks report
            // themselves; any other is left in place, without a look.
            if held.previous_hooks.contains(key) {
                if !held.leaving.runs(key) {
                    pruned.lines.push(ResourceStatus::new(
                        entry.shared_key(),
                        ResourceState::Applied,
                        format!("left in place: {}", prune::HOOK_KEPT),
                    ));
                }
                continue;
            }
            let blocked = held
                .leaving
                .release_of(key)
                .and_then(|release| held.kept.iter().find(|(r, _)| *r == release));
            if let Some((release, reason)) = blocked {
                pruned.leave(
                    entry,
                    format!("left in place: release {release} is not deleted: {reason}"),
                );
                continue;
            }
            let line = self.prune_one(ledger, entry, context).await;
            if line.retain {
                pruned.retained.push(entry.clone());
            }
            if let Some(found) = line.lingering {
                lingering.push(((key.clone(), found), entry.clone()));
            }
            pruned.lines.push(line.status);
        }
        lingering
    }

    /// Applies the bundle phase by phase, each release's due Helm hooks around its
    /// resources ([`super::hooks`]). Returns every resource's line and, when a phase or
    /// a hook held the later ones back, the apply's summary saying why.
    pub(super) async fn apply_in_phases(
        &mut self,
        ledger: &mut Ledger,
        bundle: &Bundle,
        hooks: &Hooks<'_>,
    ) -> (Vec<Line>, Option<String>) {
        let phases = apply_phases(bundle);
        let mut lines = Vec::with_capacity(bundle.resources.len());
        let mut defined = HashSet::new();
        for (index, phase) in phases.iter().enumerate() {
            let (hook_resources, phase): (Vec<&Arc<Resource>>, Vec<&Arc<Resource>>) =
                phase.iter().copied().partition(|r| hooks.is_hook(&r.key));
            lines.extend(hooks.idle_lines(&hook_resources));
            let post = hooks.due(&hook_resources, When::Post);
            let pre = hooks.due(&hook_resources, When::Pre);
            // What pre hooks stand on goes first: the phase's Namespaces and CRDs, and
            // the ServiceAccounts and bindings a tenant's objects are applied as (a
            // hook in a Namespace of its own release's workload, or applied as the
            // tenant, would otherwise be refused on a first install, for ever).
            let (ground, phase): (Vec<&Arc<Resource>>, Vec<&Arc<Resource>>) = if pre.is_empty() {
                (Vec::new(), phase)
            } else {
                phase
                    .iter()
                    .copied()
                    .partition(|r| is_groundwork(bundle, r))
            };
            let grounded = self.apply_all(ledger, bundle, &ground, &mut defined).await;
            let (ran, failed) = self.run_hooks(bundle, &pre, &defined).await;
            if let Some(reason) = failed {
                lines.extend(grounded);
                lines.extend(ran);
                let pending: Vec<&Arc<Resource>> = phase
                    .iter()
                    .copied()
                    .chain(post.iter().map(|due| due.resource))
                    .collect();
                lines.extend(held_back(&pending, &format!("not applied: {reason}")));
                let summary = hook_stopped(bundle, &phases, index, &mut lines, &reason);
                return (lines, Some(summary));
            }
            lines.extend(ran);
            let phase: Vec<&Arc<Resource>> = ground.into_iter().chain(phase).collect();
            let mut applied = grounded;
            applied.extend(
                self.apply_all(ledger, bundle, &phase[applied.len()..], &mut defined)
                    .await,
            );
            // A release's post hooks run once all of its resources were applied.
            let unapplied: HashSet<&str> = phase
                .iter()
                .zip(&applied)
                .filter(|(_, line)| line.apply_error)
                .filter_map(|(resource, _)| hooks.release_of(bundle, &resource.key))
                .collect();
            let (post, skipped): (Vec<_>, Vec<_>) = post
                .into_iter()
                .partition(|due| !unapplied.contains(due.release));
            applied.extend(held_back(
                &skipped.iter().map(|due| due.resource).collect::<Vec<_>>(),
                "not run: its release's resources were not all applied",
            ));
            let (ran, failed) = self.run_hooks(bundle, &post, &defined).await;
            let mut hook_lines = ran;
            if let Some(reason) = failed {
                lines.extend(applied);
                lines.extend(hook_lines);
                let summary = hook_stopped(bundle, &phases, index, &mut lines, &reason);
                return (lines, Some(summary));
            }
            // The phase's releases, hooks included: a release made of hooks alone is
            // recorded too, and its install hooks do not run again at every apply.
            let whole: Vec<&Arc<Resource>> = phase.iter().chain(&hook_resources).copied().collect();
            let finished: Vec<(String, String)> = hooks
                .releases_of(bundle, &whole)
                .into_iter()
                .filter(|(release, _)| !unapplied.contains(release.as_str()))
                .collect();
            ledger.releases.extend(finished);
            let later = &phases[index + 1..];
            let blocker = if later.iter().any(|p| !p.is_empty()) && self.stopped.is_none() {
                self.wait_healthy(ledger, &phase, &mut applied).await
            } else {
                None
            };
            lines.extend(applied);
            lines.append(&mut hook_lines);
            let Some(reason) = blocker else {
                continue;
            };
            let held = phase_name(bundle, index);
            for (number, phase) in later.iter().enumerate() {
                let message = format!(
                    "not applied: {} waits for {held}: {reason}",
                    phase_name(bundle, index + 1 + number)
                );
                lines.extend(held_back(phase, &message));
            }
            let summary = format!(
                "stopped after phase {} of {}: {} waits for {held}: {reason}; nothing was pruned",
                index + 1,
                phases.len(),
                phase_name(bundle, index + 1),
            );
            return (lines, Some(summary));
        }
        (lines, None)
    }
}

/// The summary of an apply a failed hook stopped in phase `index`; the later phases
/// get their lines.
fn hook_stopped(
    bundle: &Bundle,
    phases: &[Vec<&Arc<Resource>>],
    index: usize,
    lines: &mut Vec<Line>,
    reason: &str,
) -> String {
    for phase in &phases[index + 1..] {
        lines.extend(held_back(phase, &format!("not applied: {reason}")));
    }
    let place = if phases.len() > 1 {
        format!(" in {}", phase_name(bundle, index))
    } else {
        String::new()
    };
    format!("stopped{place}: {reason}; nothing was pruned")
}

impl Run {
    /// Waits until every resource of the phase that has a health rule is healthy, and
    /// updates its line. Returns why the phase is not ready: a resource of it failed
    /// to apply, failed, or was not healthy by the deadline. Returns `None` when it is
    /// ready, and when the run stopped while it waited (`self.stopped` says why).
    async fn wait_healthy(
        &mut self,
        ledger: &mut Ledger,
        phase: &[&Arc<Resource>],
        lines: &mut [Line],
    ) -> Option<String> {
        if let Some(line) = lines.iter().find(|l| l.apply_error) {
            return Some(format!(
                "{} was not applied: {}",
                line.status.key(),
                line.status.message
            ));
        }
        // The apply's answers come first: a phase healthy already costs no request.
        let mut watched: Vec<usize> = (0..phase.len())
            .filter(|&i| has_health_rule(&phase[i].key))
            .collect();
        let deadline = Instant::now() + self.options.phase_timeout;
        loop {
            if let Some(&i) = watched
                .iter()
                .find(|&&i| lines[i].status.state == ResourceState::Failed)
            {
                // A Job seen failed did not run: it is applied (so run) again by the
                // next try, even if its TTL removes it meanwhile.
                for &j in &watched {
                    if lines[j].status.state == ResourceState::Failed
                        && super::is_job(&phase[j].key)
                    {
                        ledger.forget_run(&phase[j].key);
                    }
                }
                return Some(format!(
                    "{} failed: {}",
                    phase[i].key, lines[i].status.message
                ));
            }
            watched.retain(|&i| lines[i].status.state == ResourceState::Progressing);
            let &first = watched.first()?;
            if Instant::now() + self.options.crd_poll > deadline {
                return Some(format!(
                    "{} is not healthy after {} (--phase-timeout): {}",
                    phase[first].key,
                    humantime::format_duration(self.options.phase_timeout),
                    lines[first].status.message
                ));
            }
            let reads = async {
                self.pause(self.options.crd_poll).await?;
                for &i in &watched {
                    let resource = phase[i];
                    let job = job_run(Some(ledger), resource);
                    let (state, message) = read_health(
                        &self.api,
                        &mut self.discovery,
                        resource,
                        job,
                        self.users.user(&resource.key),
                    )
                    .await?;
                    lines[i].status = ResourceStatus::new(&resource.key, state, message);
                }
                Ok::<(), Failure>(())
            };
            if let Err(failure) = reads.await {
                let key = &phase[first].key;
                let described = failure.describe("get", key.kind());
                self.note(key, &failure, &described);
                return None;
            }
        }
    }
}

/// A failed line for each resource, with the same message: what an apply that
/// stopped did not reach.
fn held_back(resources: &[&Arc<Resource>], message: &str) -> Vec<Line> {
    resources
        .iter()
        .map(|resource| Line {
            status: ResourceStatus::new(&resource.key, ResourceState::Failed, message.to_string()),
            apply_error: true,
        })
        .collect()
}

/// "phase 2 (workloads ingress, dns)", numbered from 1 as people count.
fn phase_name(bundle: &Bundle, index: usize) -> String {
    let workloads = bundle
        .meta
        .as_ref()
        .and_then(|meta| meta.phases.get(index))
        .map(|workloads| workloads.join(", "))
        .unwrap_or_default();
    if workloads.is_empty() {
        format!("phase {}", index + 1)
    } else {
        format!("phase {} (workloads {workloads})", index + 1)
    }
}

/// What prune did: a line per object (and per delete hook), what stays in the
/// inventory, and why prune stopped before the end, if it did.
pub(super) struct Pruned {
    pub lines: Vec<ResourceStatus>,
    pub retained: Vec<InventoryEntry>,
    pub held: Option<String>,
    /// A `post-delete` hook that failed: its release is gone, so it is reported, not
    /// tried again.
    pub note: Option<String>,
}

impl Run {
    /// Prunes `candidates` phase by phase in reverse, with the delete hooks of the
    /// releases that leave. `previous` is the bundle last applied completely.
    pub(super) async fn prune_in_phases(
        &mut self,
        ledger: &Ledger,
        bundle: &Bundle,
        previous: Option<&Bundle>,
        candidates: &[InventoryEntry],
        context: &prune::Context<'_>,
    ) -> Pruned {
        let leaving = previous
            .map(|previous| Leaving::plan(previous, bundle, ledger))
            .unwrap_or_default();
        let groups = prune_phases(candidates, previous);
        let previous_hooks: HashSet<ResourceKey> = previous
            .and_then(|p| Some((p, p.meta.as_deref()?)))
            .map(|(p, meta)| {
                meta.hooks
                    .iter()
                    .filter_map(|h| p.resources.get(h.resource))
                    .map(|r| (*r.key).clone())
                    .collect()
            })
            .unwrap_or_default();
        let last = previous.map_or(0, |p| p.phase_count() - 1);
        let mut pruned = Pruned {
            lines: Vec::new(),
            retained: Vec::new(),
            held: None,
            note: None,
        };
        let mut post_failures = Vec::new();
        for phase in (0..=last).rev() {
            let entries: &[InventoryEntry] = groups
                .iter()
                .find(|(p, _)| *p == phase)
                .map_or(&[][..], |(_, group)| group.as_slice());
            let releases = leaving.in_phase(phase);
            if let Some(reason) = pruned.held.clone() {
                for entry in entries {
                    pruned.leave(entry, format!("left in place for now: {reason}"));
                }
                continue;
            }
            // Each leaving release's pre-delete hooks; one that fails keeps its release.
            let mut kept: Vec<(&str, String)> = Vec::new();
            for release in &releases {
                let (ran, failed) = self
                    .run_leaving_hooks(previous.unwrap_or(bundle), leaving.pre(release))
                    .await;
                pruned.lines.extend(ran.into_iter().map(|l| l.status));
                if let Some(reason) = failed {
                    kept.push((*release, reason));
                }
            }
            // What a post-delete hook may stand on (the Namespace, the tenant's
            // ServiceAccount and bindings it is applied as) goes after the hooks, and
            // stays while a release of the phase is kept (its objects are pruned as
            // its tenant on the next try).
            let has_post = releases.iter().any(|r| !leaving.post(r).is_empty());
            let hold_groundwork = has_post || !kept.is_empty();
            let (groundwork, members): (Vec<&InventoryEntry>, Vec<&InventoryEntry>) =
                entries.iter().partition(|entry| {
                    hold_groundwork
                        && !previous_hooks.contains(entry.key())
                        && previous.is_some_and(|p| is_groundwork_key(p, entry.key()))
                });
            let on_hold = Held {
                previous_hooks: &previous_hooks,
                leaving: &leaving,
                kept: &kept,
            };
            let (mut lingering, mut lingering_entries): (Vec<_>, Vec<_>) = self
                .prune_entries(ledger, &members, context, &on_hold, &mut pruned)
                .await
                .into_iter()
                .unzip();
            let later = groups.iter().any(|(p, _)| *p < phase)
                || (0..phase).any(|p| !leaving.in_phase(p).is_empty());
            let mut waited = None;
            if (later || has_post) && self.stopped.is_none() {
                waited = self.wait_gone(&lingering).await;
            }
            // Still being deleted when the wait ended: kept in the records, so that
            // the next try waits for them again and their release is still seen
            // leaving (its post-delete hooks run once they are gone).
            if waited.is_some() {
                pruned.retained.append(&mut lingering_entries);
            }
            for release in releases
                .iter()
                .filter(|r| !kept.iter().any(|(k, _)| k == *r))
            {
                if leaving.post(release).is_empty() {
                    continue;
                }
                if let Some(reason) = &waited {
                    for due in leaving.post(release) {
                        pruned.lines.push(ResourceStatus::new(
                            &due.resource.key,
                            ResourceState::Failed,
                            format!("not run: {reason}"),
                        ));
                    }
                    continue;
                }
                let (ran, failed) = self
                    .run_leaving_hooks(previous.unwrap_or(bundle), leaving.post(release))
                    .await;
                pruned.lines.extend(ran.into_iter().map(|l| l.status));
                post_failures.extend(failed);
            }
            if let Some((release, reason)) = kept.first() {
                for &entry in &groundwork {
                    pruned.leave(
                        entry,
                        format!("left in place: release {release} is not deleted: {reason}"),
                    );
                }
            } else if let Some(reason) = waited.as_ref().filter(|_| !groundwork.is_empty()) {
                // The post-delete hooks wait for the next try: so does what they need.
                for &entry in &groundwork {
                    pruned.leave(entry, format!("left in place for now: {reason}"));
                }
            } else if !groundwork.is_empty() {
                let (gone, gone_entries): (Vec<_>, Vec<_>) = self
                    .prune_entries(ledger, &groundwork, context, &on_hold, &mut pruned)
                    .await
                    .into_iter()
                    .unzip();
                (lingering, lingering_entries) = (gone, gone_entries);
                if later && waited.is_none() && self.stopped.is_none() {
                    waited = self.wait_gone(&lingering).await;
                    if waited.is_some() {
                        pruned.retained.append(&mut lingering_entries);
                    }
                }
            }
            let step = if last > 0 {
                format!("{} ", phase_name(previous.unwrap_or(bundle), phase))
            } else {
                String::new()
            };
            if let Some((release, reason)) = kept.first() {
                pruned.held = Some(format!(
                    "{step}was not pruned completely: release {release} is not deleted: {reason}"
                ));
            } else if let Some(reason) = waited {
                pruned.held = Some(format!("{step}was not pruned completely: {reason}"));
            }
        }
        if let Some(held) = &pruned.held {
            pruned.held = Some(format!(
                "applied {} resources, but {held}; what it keeps, and the phases before it, are \
                 left in place and pruned on the next try",
                bundle.resources.len()
            ));
        }
        pruned.note = post_failures.into_iter().next();
        pruned
    }

    /// Waits until the objects that were still there being deleted are gone, for at
    /// most `--phase-timeout`; returns why not, if not. Returns `None` too when the run
    /// stopped while it waited (`self.stopped` says why).
    async fn wait_gone(
        &mut self,
        lingering: &[(ResourceKey, super::discovery::Found)],
    ) -> Option<String> {
        let deadline = Instant::now() + self.options.phase_timeout;
        let mut waiting: Vec<usize> = (0..lingering.len()).collect();
        loop {
            let mut still = Vec::new();
            for &i in &waiting {
                let (key, found) = &lingering[i];
                let namespace = found.namespaced.then_some(key.namespace());
                match self.api.get(&found.resource, namespace, key.name()).await {
                    Err(failure) if failure.is_not_found() => {}
                    Ok(_) => still.push(i),
                    Err(failure) => {
                        let described = failure.describe("get", key.kind());
                        self.note(key, &failure, &described);
                        if failure.stops_run() {
                            return None;
                        }
                        still.push(i);
                    }
                }
            }
            waiting = still;
            let &first = waiting.first()?;
            if Instant::now() + self.options.crd_poll > deadline {
                return Some(format!(
                    "{} is still being deleted after {} (--phase-timeout)",
                    lingering[first].0,
                    humantime::format_duration(self.options.phase_timeout)
                ));
            }
            if self.pause(self.options.crd_poll).await.is_err() {
                return None;
            }
        }
    }
}
