//! The JSON report: a stable shape for tools, documented in `docs/diff.md`.
//! Fields are only ever added to it; `format` names the version of the shape.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ClusterStatus, Counts, FleetDiff};
use flotilla_core::diagnostic::Diagnostic;

/// The version of the JSON shape.
pub const FORMAT: &str = "flotilla.dev/diff/v1";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    format: &'static str,
    base: SideReport<'a>,
    head: SideReport<'a>,
    changed: Vec<&'a str>,
    added: Vec<&'a str>,
    removed: Vec<&'a str>,
    failed: Vec<&'a str>,
    unchanged: usize,
    errors: Vec<SidedDiagnostic<'a>>,
    clusters: BTreeMap<&'a str, ClusterReport<'a>>,
    groups: Vec<GroupReport<'a>>,
    totals: CountsReport,
    fleet_groups: BTreeMap<&'a str, CountsReport>,
    /// The rollout plan: every wave of every policy of HEAD, in order.
    waves: Vec<WaveReport<'a>>,
    /// Changed clusters no policy governs: they change at once.
    at_once: &'a [String],
    /// Changed clusters that are paused.
    paused: &'a [String],
    /// Helm workloads whose chart changed (absent when none did).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    charts: Vec<ChartReport<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChartReport<'a> {
    workload: &'a str,
    base: Option<&'a str>,
    head: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WaveReport<'a> {
    policy: &'a str,
    name: &'a str,
    clusters: &'a [String],
    bake: String,
    max_failed: flotilla_core::rollout::Budget,
    max_parallel: Option<flotilla_core::rollout::Budget>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SideReport<'a> {
    revision: &'a str,
    clean: bool,
    warnings: &'a [Diagnostic],
}

#[derive(Serialize)]
struct SidedDiagnostic<'a> {
    side: &'static str,
    #[serde(flatten)]
    diagnostic: &'a Diagnostic,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterReport<'a> {
    status: &'static str,
    before: Option<&'a str>,
    after: Option<&'a str>,
    fleet_groups: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<usize>,
    /// For an added or changed cluster: its rollout policy and wave (both null when it
    /// changes at once), and whether it is paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wave: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    paused: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupReport<'a> {
    status: &'static str,
    before_unknown: bool,
    title: String,
    clusters: &'a [String],
    shared_groups: &'a [String],
    whole_groups: &'a [String],
    resources: Vec<ResourceReport<'a>>,
    /// The apply order before and after, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    order: Option<OrderReport<'a>>,
    /// Workloads whose drift policy changed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    drift: Vec<DriftReport<'a>>,
}

#[derive(Serialize)]
struct OrderReport<'a> {
    before: &'a [Vec<String>],
    after: &'a [Vec<String>],
}

#[derive(Serialize)]
struct DriftReport<'a> {
    workload: &'a str,
    before: &'static str,
    after: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceReport<'a> {
    change: &'static str,
    /// The key as people read it: `Deployment.apps pos-api/pos-api`.
    resource: String,
    api_group: &'a str,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    diff: Option<&'a str>,
}

#[derive(Serialize)]
struct CountsReport {
    clusters: usize,
    changed: usize,
    added: usize,
    removed: usize,
    unchanged: usize,
    failed: usize,
}

impl From<&Counts> for CountsReport {
    fn from(c: &Counts) -> Self {
        CountsReport {
            clusters: c.clusters,
            changed: c.changed,
            added: c.added,
            removed: c.removed,
            unchanged: c.unchanged,
            failed: c.failed,
        }
    }
}

fn side(side: &super::Side) -> SideReport<'_> {
    SideReport {
        revision: &side.revision,
        clean: side.is_clean(),
        warnings: &side.warnings,
    }
}

/// The report as pretty JSON, ending in a newline.
pub fn report(diff: &FleetDiff) -> Result<String, serde_json::Error> {
    let names = |status: ClusterStatus| {
        diff.with_status(status)
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
    };
    let errors = diff
        .head
        .errors
        .iter()
        .map(|d| ("head", d))
        .chain(diff.base.errors.iter().map(|d| ("base", d)))
        .map(|(side, diagnostic)| SidedDiagnostic { side, diagnostic })
        .collect();
    let report = Report {
        format: FORMAT,
        base: side(&diff.base),
        head: side(&diff.head),
        changed: names(ClusterStatus::Changed),
        added: names(ClusterStatus::Added),
        removed: names(ClusterStatus::Removed),
        failed: names(ClusterStatus::Failed),
        unchanged: diff.totals.unchanged,
        errors,
        clusters: diff
            .clusters
            .iter()
            .filter(|c| c.status != ClusterStatus::Unchanged)
            .map(|c| {
                (
                    c.name.as_str(),
                    ClusterReport {
                        status: c.status.as_str(),
                        before: c.before.as_ref().map(|d| d.as_str()),
                        after: c.after.as_ref().map(|d| d.as_str()),
                        fleet_groups: &c.fleet_groups,
                        group: c.group,
                        policy: c.rollout.as_ref().map(|r| match r {
                            super::Rollout::Wave { policy, .. } => Some(policy.as_str()),
                            _ => None,
                        }),
                        wave: c.rollout.as_ref().map(|r| match r {
                            super::Rollout::Wave { wave, .. } => Some(wave.as_str()),
                            _ => None,
                        }),
                        paused: c.rollout == Some(super::Rollout::Paused),
                    },
                )
            })
            .collect(),
        groups: diff
            .groups
            .iter()
            .map(|g| GroupReport {
                status: g.status.as_str(),
                before_unknown: g.before_unknown,
                title: g.title(),
                clusters: &g.clusters,
                shared_groups: &g.shared_groups,
                whole_groups: &g.whole_groups,
                resources: g
                    .resources
                    .iter()
                    .map(|r| ResourceReport {
                        change: r.kind.as_str(),
                        resource: r.key.to_string(),
                        api_group: r.key.group(),
                        kind: r.key.kind(),
                        namespace: r.key.namespace(),
                        name: r.key.name(),
                        diff: r.diff.as_deref(),
                    })
                    .collect(),
                order: g
                    .meta
                    .as_ref()
                    .and_then(|m| m.phases.as_ref())
                    .map(|(before, after)| OrderReport { before, after }),
                drift: g
                    .meta
                    .iter()
                    .flat_map(|m| &m.drift)
                    .map(|(workload, was, is)| DriftReport {
                        workload,
                        before: was.as_str(),
                        after: is.as_str(),
                    })
                    .collect(),
            })
            .collect(),
        totals: (&diff.totals).into(),
        fleet_groups: diff
            .fleet_groups
            .iter()
            .map(|(name, counts)| (name.as_str(), counts.into()))
            .collect(),
        waves: diff
            .plan
            .waves
            .iter()
            .map(|w| WaveReport {
                policy: &w.policy,
                name: &w.name,
                clusters: &w.clusters,
                bake: flotilla_core::rollout::format_duration(w.bake),
                max_failed: w.max_failed,
                max_parallel: w.max_parallel,
            })
            .collect(),
        at_once: &diff.plan.at_once,
        paused: &diff.plan.paused,
        charts: diff
            .chart_changes()
            .into_iter()
            .map(|c| ChartReport {
                workload: c.workload,
                base: c.base,
                head: c.head,
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&report)?;
    text.push('\n');
    Ok(text)
}
