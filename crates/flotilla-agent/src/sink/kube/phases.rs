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

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;

use super::failure::Failure;
use super::hooks::{Hooks, When};
use super::ledger::Ledger;
use super::{Line, Run, has_health_rule, job_ran, read_health};
use crate::sink::apply_phases;
use flotilla_core::bundle::{Bundle, Resource};
use flotilla_core::status::{ResourceState, ResourceStatus};

impl Run {
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
            let (ran, failed) = self.run_hooks(bundle, &pre, &defined).await;
            lines.extend(ran);
            if let Some(reason) = failed {
                let pending: Vec<&Arc<Resource>> = phase
                    .iter()
                    .copied()
                    .chain(post.iter().map(|due| due.resource))
                    .collect();
                lines.extend(held_back(&pending, &format!("not applied: {reason}")));
                let summary = hook_stopped(bundle, &phases, index, &mut lines, &reason);
                return (lines, Some(summary));
            }
            let mut applied = self.apply_all(ledger, bundle, &phase, &mut defined).await;
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
            let finished: Vec<(String, String)> = hooks
                .releases_of(bundle, &phase)
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
        ledger: &Ledger,
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
                    let ran = job_ran(Some(ledger), resource);
                    let (state, message) = read_health(
                        &self.api,
                        &mut self.discovery,
                        resource,
                        ran,
                        self.users.user(&resource.key),
                    )
                    .await?;
                    lines[i].status = ResourceStatus::new(&resource.key, state, message);
                }
                Ok::<(), Failure>(())
            };
            if let Err(failure) = reads.await {
                let key = &phase[first].key;
                let described = failure.describe("get", &key.kind);
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
