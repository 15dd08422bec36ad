//! Apply phases. The renderer puts a bundle's workloads in phases, one per level of
//! their `spec.dependsOn` graph. The kube sink applies one phase at a time, and the next
//! only once every resource of this one that has a health rule ([`super::health`]) is
//! healthy: it looks again every `crd_poll`, for at most `phase_timeout`. A phase that
//! fails, or is not healthy in time, holds the later ones back: they are not applied,
//! the apply is incomplete, and the agent tries again later (then the phases already
//! healthy pass at once, on the apply's own answers). A bundle of one phase is applied
//! without waiting, as bundles without dependencies always were.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;

use super::failure::Failure;
use super::ledger::Ledger;
use super::{Line, Run, has_health_rule, job_ran, read_health};
use crate::sink::apply_phases;
use flotilla_core::bundle::{Bundle, Resource};
use flotilla_core::status::{ResourceState, ResourceStatus};

impl Run {
    /// Applies the bundle phase by phase. Returns every resource's line and, when a
    /// phase held the later ones back, the apply's summary saying why.
    pub(super) async fn apply_in_phases(
        &mut self,
        ledger: &mut Ledger,
        bundle: &Bundle,
    ) -> (Vec<Line>, Option<String>) {
        let phases = apply_phases(bundle);
        let mut lines = Vec::with_capacity(bundle.resources.len());
        let mut defined = HashSet::new();
        for (index, phase) in phases.iter().enumerate() {
            let mut applied = self.apply_all(ledger, bundle, phase, &mut defined).await;
            let later = &phases[index + 1..];
            let blocker = if later.iter().any(|p| !p.is_empty()) && self.stopped.is_none() {
                self.wait_healthy(ledger, phase, &mut applied).await
            } else {
                None
            };
            lines.extend(applied);
            let Some(reason) = blocker else {
                continue;
            };
            let held = phase_name(bundle, index);
            for (number, phase) in later.iter().enumerate() {
                let message = format!(
                    "not applied: {} waits for {held}: {reason}",
                    phase_name(bundle, index + 1 + number)
                );
                lines.extend(phase.iter().map(|resource| Line {
                    status: ResourceStatus::new(
                        &resource.key,
                        ResourceState::Failed,
                        message.clone(),
                    ),
                    apply_error: true,
                }));
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
                    let (state, message) =
                        read_health(&self.api, &mut self.discovery, resource, ran).await?;
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
