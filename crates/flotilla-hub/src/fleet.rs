//! The fleet summary of `GET /v1/fleet`: per cluster its desired and applied digest
//! and state, counts per state, and the render status. Pure: it takes the time as an
//! argument, so tests move time without sleeping.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use crate::store::StoredStatus;
use flotilla_core::bundle::Digest;
use flotilla_core::diagnostic::Diagnostic;

use super::clock::rfc3339;

/// Where a cluster stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterState {
    /// The agent applied the desired digest and reported no failed resource.
    InSync,
    /// The agent was seen recently, has not applied the desired digest, and has
    /// reported no error for it.
    Pending,
    /// The agent reported an error for the desired digest.
    Failed,
    /// The agent has not reported for longer than the offline threshold.
    Offline,
    /// No report ever arrived.
    NeverSeen,
}

impl ClusterState {
    pub const ALL: [ClusterState; 5] = [
        ClusterState::InSync,
        ClusterState::Pending,
        ClusterState::Failed,
        ClusterState::Offline,
        ClusterState::NeverSeen,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::InSync => "in-sync",
            ClusterState::Pending => "pending",
            ClusterState::Failed => "failed",
            ClusterState::Offline => "offline",
            ClusterState::NeverSeen => "never-seen",
        }
    }
}

/// The state of one cluster. Offline is decided first, so a cluster that is out of
/// reach is never counted as failed.
pub fn state_of(
    desired: &Digest,
    status: Option<&StoredStatus>,
    now_ms: i64,
    offline_after: Duration,
) -> ClusterState {
    let Some(status) = status else {
        return ClusterState::NeverSeen;
    };
    let silent_ms = now_ms.saturating_sub(status.received_at_ms);
    if silent_ms > i64::try_from(offline_after.as_millis()).unwrap_or(i64::MAX) {
        return ClusterState::Offline;
    }
    if status.report.failed_for(desired) {
        return ClusterState::Failed;
    }
    if status.report.applied.as_ref() == Some(desired) {
        ClusterState::InSync
    } else {
        ClusterState::Pending
    }
}

/// The outcome of the last render attempt.
#[derive(Clone, Debug, Default)]
pub struct RenderStatus {
    /// The commit of the last clean render, whose bundles are served.
    pub served_revision: Option<String>,
    /// The last commit rendered, clean or not.
    pub attempted_revision: Option<String>,
    pub attempted_at_ms: Option<i64>,
    pub duration: Option<Duration>,
    /// The errors of the last attempt; empty when it was clean.
    pub errors: Vec<Diagnostic>,
    pub warnings: usize,
    /// Why the repository could not be read or fetched, if it could not.
    pub source_error: Option<String>,
    pub renders_clean: u64,
    pub renders_failed: u64,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetSummary {
    /// The commit whose bundles are served.
    pub revision: Option<String>,
    /// The last commit the hub tried to render.
    pub attempted_revision: Option<String>,
    pub attempted_at: Option<String>,
    /// Errors of the last render attempt, each with file and line: while this is not
    /// empty the hub keeps serving the last good bundles.
    pub render_errors: Vec<RenderError>,
    pub source_error: Option<String>,
    pub counts: BTreeMap<&'static str, usize>,
    pub clusters: Vec<ClusterSummary>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderError {
    /// `file:line: message (cluster c, workload w)`, as `flotilla validate` prints it.
    pub text: String,
    #[serde(flatten)]
    pub diagnostic: Diagnostic,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    pub name: String,
    pub state: ClusterState,
    pub desired: Digest,
    pub desired_revision: String,
    pub applied: Option<Digest>,
    pub attempted: Option<Digest>,
    pub last_seen: Option<String>,
    pub message: Option<String>,
    pub agent_version: Option<String>,
    /// Resources the agent reported as failed.
    pub failed_resources: Vec<String>,
}

/// One served cluster, as the summary needs it.
pub struct Desired<'a> {
    pub name: &'a str,
    pub digest: &'a Digest,
    pub revision: &'a str,
}

pub fn summarize<'a>(
    desired: impl IntoIterator<Item = Desired<'a>>,
    statuses: &HashMap<String, StoredStatus>,
    render: &RenderStatus,
    now_ms: i64,
    offline_after: Duration,
) -> FleetSummary {
    let mut counts: BTreeMap<&'static str, usize> =
        ClusterState::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    let mut clusters: Vec<ClusterSummary> = desired
        .into_iter()
        .map(|d| {
            let status = statuses.get(d.name);
            let state = state_of(d.digest, status, now_ms, offline_after);
            *counts.entry(state.as_str()).or_default() += 1;
            ClusterSummary {
                name: d.name.to_string(),
                state,
                desired: d.digest.clone(),
                desired_revision: d.revision.to_string(),
                applied: status.and_then(|s| s.report.applied.clone()),
                attempted: status.and_then(|s| s.report.attempted.clone()),
                last_seen: status.map(|s| rfc3339(s.received_at_ms)),
                message: status.map(|s| s.report.message.clone()),
                agent_version: status.map(|s| s.report.agent_version.clone()),
                failed_resources: status
                    .map(|s| {
                        s.report
                            .resources
                            .iter()
                            .filter(|r| r.state == flotilla_core::status::ResourceState::Failed)
                            .map(|r| {
                                let kind = if r.group.is_empty() {
                                    r.kind.clone()
                                } else {
                                    format!("{}.{}", r.kind, r.group)
                                };
                                if r.namespace.is_empty() {
                                    format!("{kind}/{}: {}", r.name, r.message)
                                } else {
                                    format!("{kind} {}/{}: {}", r.namespace, r.name, r.message)
                                }
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    FleetSummary {
        revision: render.served_revision.clone(),
        attempted_revision: render.attempted_revision.clone(),
        attempted_at: render.attempted_at_ms.map(rfc3339),
        render_errors: render
            .errors
            .iter()
            .map(|d| RenderError {
                text: d.to_string(),
                diagnostic: d.clone(),
            })
            .collect(),
        source_error: render.source_error.clone(),
        counts,
        clusters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::status::{ResourceStatus, StatusReport};

    fn digest(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    fn seen(at_ms: i64, applied: Option<char>, attempted: Option<char>) -> StoredStatus {
        StoredStatus {
            cluster: "c".into(),
            report: StatusReport {
                applied: applied.map(digest),
                attempted: attempted.map(digest),
                resources: vec![],
                message: String::new(),
                agent_version: String::new(),
            },
            received_at_ms: at_ms,
        }
    }

    const FIVE_MINUTES: Duration = Duration::from_secs(300);

    fn check(status: Option<StoredStatus>, now_ms: i64, expect: ClusterState) {
        assert_eq!(
            state_of(&digest('a'), status.as_ref(), now_ms, FIVE_MINUTES),
            expect
        );
    }

    #[test]
    fn states_follow_the_reports_and_the_clock() {
        check(None, 0, ClusterState::NeverSeen);
        check(
            Some(seen(0, Some('a'), Some('a'))),
            1_000,
            ClusterState::InSync,
        );
        check(
            Some(seen(0, Some('b'), Some('b'))),
            1_000,
            ClusterState::Pending,
        );
        check(
            Some(seen(0, Some('b'), Some('a'))),
            1_000,
            ClusterState::Failed,
        );
        // Exactly at the threshold it is still online; past it, offline, even when failed.
        check(
            Some(seen(0, Some('a'), Some('a'))),
            300_000,
            ClusterState::InSync,
        );
        check(
            Some(seen(0, Some('b'), Some('a'))),
            300_001,
            ClusterState::Offline,
        );
        let mut unhealthy = seen(0, Some('a'), Some('a'));
        unhealthy.report.resources.push(ResourceStatus {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: "pos".into(),
            name: "api".into(),
            state: flotilla_core::status::ResourceState::Failed,
            message: "ImagePullBackOff".into(),
        });
        check(Some(unhealthy), 1_000, ClusterState::Failed);
    }
}
