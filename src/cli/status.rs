//! `flotilla status`: the fleet as a running hub sees it, like `kubectl get`: counts by
//! state, the served and attempted revision with any render error, active rollouts
//! with each wave's progress, then the clusters that need attention (failed with
//! their failed resources, offline with how long, pending longest first, never seen,
//! and drifted ones in any state). Drift is a column of its own, not a state; with
//! `--cluster` each drifted resource gets a line with its field paths and managers.
//!
//! With `--database` the same view is read straight from the hub's database (see
//! [`remote::Fleet`]); the database records neither the fleet's groups nor the last
//! render's errors, which a hub keeps in memory.
//!
//! Exit 0 when no cluster is failed, 1 when some cluster is failed, 2 when the hub
//! (or its database) cannot be asked.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal as _;

use anyhow::bail;
use clap::Args;
use serde::{Deserialize, Serialize};

use super::remote::{self, HubArgs, Output};
use super::rollout::{Paint, short_revision, table_painted, waves_line};
use super::{EXIT_FINDINGS, EXIT_OK};
use flotilla_core::rollout::view::RolloutView;
use flotilla_hub::fleet::{ClusterState, CommitSummary, Drift, attention_key};

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub hub: HubArgs,
    /// Only clusters in this state (repeatable): in-sync, pending, waiting, paused,
    /// failed, offline, never-seen. With a filter every matching cluster is listed.
    #[arg(long = "state", value_name = "STATE", value_parser = parse_state)]
    pub states: Vec<ClusterState>,
    /// Only clusters in this fleet group (repeatable).
    #[arg(long = "group", value_name = "GROUP")]
    pub groups: Vec<String>,
    /// Only this cluster (repeatable). Each drifted resource of the clusters listed
    /// gets a line: what changed, who changed it, what the agent did.
    #[arg(long = "cluster", value_name = "NAME")]
    pub clusters: Vec<String>,
    /// Only drifted clusters: changed on the cluster since flotilla applied them, and
    /// not put back (drift is not a state: they keep theirs).
    #[arg(long)]
    pub drifted: bool,
}

fn parse_state(text: &str) -> Result<ClusterState, String> {
    ClusterState::parse(text).ok_or_else(|| {
        let states: Vec<&str> = ClusterState::ALL.iter().map(|s| s.as_str()).collect();
        format!("no state {text:?}; the states are {}", states.join(", "))
    })
}

/// `GET /v1/fleet`, as this command reads it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Fleet {
    revision: Option<String>,
    /// The served commit's subject and author (absent when the hub has not read them,
    /// from older hubs and from the database).
    #[serde(default)]
    commit: Option<CommitSummary>,
    attempted_revision: Option<String>,
    #[serde(default)]
    render_errors: Vec<RenderError>,
    /// The last render attempt's warnings (absent when there are none, and from
    /// older hubs).
    #[serde(default)]
    render_warnings: RenderWarnings,
    source_error: Option<String>,
    /// The newest clean render could not be installed (absent from older hubs).
    #[serde(default)]
    install_error: Option<InstallError>,
    #[serde(default)]
    counts: BTreeMap<String, usize>,
    /// Per Helm workload, its chart (`name version (path)`).
    #[serde(default)]
    charts: BTreeMap<String, String>,
    clusters: Vec<Cluster>,
}

/// A render error or warning: `text` for the table; `-o json` passes on the hub's
/// other fields (`severity`, `file`, `line`, `message`, …) as they came.
#[derive(Debug, Deserialize, Serialize)]
struct RenderError {
    text: String,
    #[serde(flatten)]
    fields: serde_json::Map<String, serde_json::Value>,
}

/// `renderWarnings`: how many, and the first of them.
#[derive(Debug, Default, Deserialize, Serialize)]
struct RenderWarnings {
    total: usize,
    shown: Vec<RenderError>,
}

/// How many render warnings the text report lists (all are in `-o json`, up to what
/// the hub gives).
const WARNINGS_LISTED: usize = 5;

#[derive(Debug, Deserialize, Serialize)]
struct InstallError {
    revision: String,
    message: String,
    since: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Cluster {
    name: String,
    state: ClusterState,
    desired: String,
    desired_revision: String,
    latest: Option<String>,
    wave: Option<String>,
    applied: Option<String>,
    last_seen: Option<String>,
    message: Option<String>,
    #[serde(default)]
    failed_resources: Vec<String>,
    /// Some drift of its last report remains on the cluster (absent from older hubs).
    #[serde(default)]
    drifted: bool,
    /// The drift of its last report, corrected drift included.
    #[serde(default)]
    drift: Vec<Drift>,
    /// Bundle features what it is served needs and its agent lacks (absent from
    /// older hubs).
    #[serde(default)]
    needs_newer_agent: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    silent_for_seconds: Option<i64>,
    /// While pending: how long since it was served the digest it has not applied.
    #[serde(default)]
    pending_for_seconds: Option<i64>,
    /// Every other field of the hub's entry (`attempted`, `labels`, `policy`,
    /// `agentVersion`…): `-o json` gives each cluster as `GET /v1/fleet` does.
    #[serde(flatten)]
    other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct Rollouts {
    rollouts: Vec<RolloutView>,
}

/// What `-o json` prints: the fleet summary restricted to the selection, with counts
/// over the selection, and the active rollouts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    revision: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    commit: Option<&'a CommitSummary>,
    attempted_revision: &'a Option<String>,
    render_errors: &'a [RenderError],
    #[serde(skip_serializing_if = "is_zero_warnings")]
    render_warnings: &'a RenderWarnings,
    source_error: &'a Option<String>,
    install_error: &'a Option<InstallError>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    charts: &'a BTreeMap<String, String>,
    counts: BTreeMap<&'static str, usize>,
    failed: usize,
    /// Drifted clusters of the selection.
    drifted: usize,
    rollouts: Vec<&'a RolloutView>,
    clusters: Vec<&'a Cluster>,
}

fn is_zero_warnings(warnings: &&RenderWarnings) -> bool {
    warnings.total == 0
}

pub fn run_status(args: &StatusArgs) -> anyhow::Result<u8> {
    let source = remote::Fleet::new(&args.hub)?;
    if matches!(source, remote::Fleet::Database(_)) && !args.groups.is_empty() {
        bail!(
            "--group needs a hub (--server): the database does not record the fleet's groups \
             (each hub reads them from the repository)"
        );
    }
    let fleet: Fleet = serde_json::from_value(source.fleet()?)?;
    let rollouts: Rollouts = serde_json::from_value(source.rollouts()?)?;
    let mut selected: Vec<&Cluster> = fleet
        .clusters
        .iter()
        .filter(|c| args.states.is_empty() || args.states.contains(&c.state))
        .filter(|c| args.groups.is_empty() || c.groups.iter().any(|g| args.groups.contains(g)))
        .filter(|c| args.clusters.is_empty() || args.clusters.contains(&c.name))
        .filter(|c| !args.drifted || c.drifted)
        .collect();
    selected.sort_by(|a, b| attention(a).cmp(&attention(b)));
    let mut counts: BTreeMap<&'static str, usize> =
        ClusterState::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    for cluster in &selected {
        *counts.entry(cluster.state.as_str()).or_default() += 1;
    }
    let failed = counts[ClusterState::Failed.as_str()];
    let drifted = selected.iter().filter(|c| c.drifted).count();
    let active: Vec<&RolloutView> = rollouts
        .rollouts
        .iter()
        .filter(|r| r.ended_at.is_none())
        .collect();
    let filtered = !(args.states.is_empty()
        && args.groups.is_empty()
        && args.clusters.is_empty()
        && !args.drifted);
    let text = match args.hub.output {
        Output::Json => {
            let report = Report {
                revision: &fleet.revision,
                commit: fleet.commit.as_ref(),
                attempted_revision: &fleet.attempted_revision,
                render_errors: &fleet.render_errors,
                render_warnings: &fleet.render_warnings,
                source_error: &fleet.source_error,
                install_error: &fleet.install_error,
                charts: &fleet.charts,
                counts: counts.clone(),
                failed,
                drifted,
                rollouts: active,
                clusters: selected,
            };
            let mut text = serde_json::to_string_pretty(&report)?;
            text.push('\n');
            text
        }
        Output::Table => {
            let paint = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            let mut text = table(&fleet, &counts, &active, &selected, filtered, paint);
            if !args.clusters.is_empty() {
                text.push_str(&drift_table(&selected));
            }
            text
        }
    };
    print!("{text}");
    Ok(if failed > 0 { EXIT_FINDINGS } else { EXIT_OK })
}

/// Where a cluster stands in the order an operator should look at them (the web
/// page's order): most urgent first, then the longest waiting, then by name.
fn attention(c: &Cluster) -> (usize, std::cmp::Reverse<i64>, &str) {
    attention_key(
        c.state,
        c.silent_for_seconds,
        c.pending_for_seconds,
        &c.name,
    )
}

/// `3m`, `2h5m`, `4d1h`: how long, to the minute (seconds under a minute).
fn ago(seconds: i64) -> String {
    let seconds = seconds.max(0);
    let (d, h, m) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

fn state_colour(state: &str) -> Option<&'static str> {
    match state {
        "failed" => Some("\x1b[31m"),
        "offline" | "never-seen" => Some("\x1b[33m"),
        "pending" | "waiting" | "paused" => Some("\x1b[36m"),
        "in-sync" => Some("\x1b[32m"),
        _ => None,
    }
}

fn table(
    fleet: &Fleet,
    counts: &BTreeMap<&'static str, usize>,
    active: &[&RolloutView],
    selected: &[&Cluster],
    filtered: bool,
    paint: bool,
) -> String {
    let mut out = String::new();
    let served = fleet
        .revision
        .as_deref()
        .map_or("none yet".into(), short_revision);
    let _ = writeln!(out, "revision   {served} (served)");
    if let Some(commit) = &fleet.commit {
        let _ = writeln!(out, "commit     {} ({})", commit.subject, commit.author);
    }
    if let Some(attempted) = &fleet.attempted_revision
        && fleet.revision.as_ref() != Some(attempted)
    {
        let _ = writeln!(
            out,
            "attempted  {} (does not render: {} error{}; the served revision stays)",
            short_revision(attempted),
            fleet.render_errors.len(),
            if fleet.render_errors.len() == 1 {
                ""
            } else {
                "s"
            }
        );
    }
    for error in &fleet.render_errors {
        let _ = writeln!(out, "  {}", error.text);
    }
    let warnings = &fleet.render_warnings;
    if warnings.total > 0 {
        let _ = writeln!(
            out,
            "warnings   {} in the last render{}",
            warnings.total,
            if warnings.total > WARNINGS_LISTED {
                " (`flotilla validate` lists them all)"
            } else {
                ""
            }
        );
        for warning in warnings.shown.iter().take(WARNINGS_LISTED) {
            let _ = writeln!(out, "  {}", warning.text);
        }
        let listed = warnings.shown.len().min(WARNINGS_LISTED);
        if warnings.total > listed {
            let _ = writeln!(out, "  … and {} more", warnings.total - listed);
        }
    }
    if let Some(error) = &fleet.source_error {
        let _ = writeln!(out, "source     {error}");
    }
    if let Some(error) = &fleet.install_error {
        let _ = writeln!(
            out,
            "install    {} cannot be installed (failing since {}; the served revision stays): {}",
            short_revision(&error.revision),
            error.since,
            error.message
        );
    }
    for (workload, chart) in &fleet.charts {
        let _ = writeln!(out, "chart      {chart}: workload {workload}");
    }
    let total: usize = counts.values().sum();
    let by_state: Vec<String> = ClusterState::BY_URGENCY
        .iter()
        .filter(|s| counts.get(s.as_str()).copied().unwrap_or(0) > 0)
        .map(|s| {
            let text = format!("{} {}", counts[s.as_str()], s.as_str());
            match state_colour(s.as_str()).filter(|_| paint) {
                Some(colour) => format!("{colour}{text}\x1b[0m"),
                None => text,
            }
        })
        .collect();
    let _ = writeln!(
        out,
        "clusters   {total}{}{}",
        if by_state.is_empty() { "" } else { ": " },
        by_state.join(", ")
    );
    let drifted = selected.iter().filter(|c| c.drifted).count();
    if drifted > 0 {
        let _ = writeln!(
            out,
            "drifted    {drifted} (changed on the cluster and not put back; their states stay)"
        );
    }
    if !active.is_empty() {
        out.push('\n');
        let rows: Vec<[String; 5]> = active
            .iter()
            .map(|r| {
                [
                    r.id.to_string(),
                    r.policy.clone(),
                    short_revision(&r.revision),
                    r.state.to_string(),
                    waves_line(r),
                ]
            })
            .collect();
        out.push_str(&table_painted(
            &[
                "ROLLOUT",
                "POLICY",
                "REVISION",
                "STATE",
                "WAVES (in sync/changing)",
            ],
            &rows,
            None,
        ));
    }
    let listed: Vec<&&Cluster> = selected
        .iter()
        .filter(|c| filtered || c.state.needs_attention() || c.drifted)
        .collect();
    if listed.is_empty() {
        if !filtered && total > 0 {
            out.push_str("\nno cluster needs attention\n");
        } else if filtered {
            out.push_str("\nno cluster matches\n");
        }
        return out;
    }
    out.push('\n');
    let rows: Vec<[String; 6]> = listed
        .iter()
        .map(|c| {
            let seen = match (c.silent_for_seconds, &c.last_seen) {
                (Some(s), _) => format!("{} ago", ago(s)),
                (None, _) => "never".to_string(),
            };
            let detail = match c.state {
                ClusterState::Failed if !c.failed_resources.is_empty() => {
                    c.failed_resources.join("; ")
                }
                _ if !c.needs_newer_agent.is_empty() => format!(
                    "needs a newer agent: {} is served a bundle that needs {}, which its agent \
                     does not understand; it keeps what it runs{}",
                    c.name,
                    c.needs_newer_agent.join(", "),
                    c.applied
                        .as_deref()
                        .map(|a| format!(" ({})", short_digest(a)))
                        .unwrap_or_default()
                ),
                ClusterState::Offline => format!(
                    "silent for {}{}",
                    c.silent_for_seconds.map_or("ever".into(), ago),
                    c.applied
                        .as_deref()
                        .map(|a| format!(", runs {}", short_digest(a)))
                        .unwrap_or_default()
                ),
                ClusterState::Pending => format!(
                    "to apply {} of {}{}",
                    short_digest(&c.desired),
                    short_revision(&c.desired_revision),
                    c.pending_for_seconds
                        .map(|s| format!(", pending for {}", ago(s)))
                        .unwrap_or_default()
                ),
                ClusterState::Waiting => format!(
                    "runs {}, {} waits for its wave",
                    short_digest(&c.desired),
                    c.latest.as_deref().map(short_digest).unwrap_or_default()
                ),
                ClusterState::NeverSeen => "no report yet: is its agent running?".to_string(),
                // Drift says more than the last message, never more than a failure.
                ClusterState::InSync | ClusterState::Paused if c.drifted => drift_detail(c),
                _ => c.message.clone().unwrap_or_default(),
            };
            [
                c.name.clone(),
                c.state.as_str().to_string(),
                if c.drifted { "yes" } else { "-" }.to_string(),
                c.wave.clone().unwrap_or_else(|| "-".into()),
                seen,
                detail,
            ]
        })
        .collect();
    out.push_str(&table_painted(
        &["CLUSTER", "STATE", "DRIFTED", "WAVE", "LAST SEEN", "DETAIL"],
        &rows,
        paint.then_some((1, state_colour as Paint)),
    ));
    out
}

/// The drift left on a cluster, on one line: `Deployment.apps app/app: spec.replicas
/// by kubectl-edit (reported)`, each resource after the other.
fn drift_detail(c: &Cluster) -> String {
    c.drift
        .iter()
        .filter(|d| d.remains())
        .map(|d| {
            let by = if d.managers.is_empty() {
                String::new()
            } else {
                format!(" by {}", d.managers.join(", "))
            };
            format!("{}: {}{by} ({})", d.resource, d.what(), d.action)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A line per resource of the listed clusters' last reports' drift, corrected drift
/// included: what changed (field paths, never values), who changed it, and what the
/// agent did. Empty when there is none.
fn drift_table(listed: &[&Cluster]) -> String {
    let rows: Vec<[String; 5]> = listed
        .iter()
        .flat_map(|c| {
            c.drift.iter().map(|d| {
                [
                    c.name.clone(),
                    d.resource.clone(),
                    d.action.to_string(),
                    d.what(),
                    if d.managers.is_empty() {
                        "-".to_string()
                    } else {
                        d.managers.join(", ")
                    },
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n");
    out.push_str(&table_painted(
        &["CLUSTER", "DRIFTED RESOURCE", "ACTION", "CHANGED", "BY"],
        &rows,
        None,
    ));
    out
}

/// `sha256:0123456789ab`: enough of a digest to tell it apart in a table.
fn short_digest(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_render_warnings_are_listed_and_the_rest_counted() {
        let fleet = |total: usize| -> Fleet {
            let shown: Vec<serde_json::Value> = (1..=total)
                .map(|n| serde_json::json!({"text": format!("clusters/c{n}.yaml: warning: w{n}")}))
                .collect();
            serde_json::from_value(serde_json::json!({
                "revision": "main@sha1:0123456789abcdef",
                "renderWarnings": {"total": total, "shown": shown},
                "clusters": [],
            }))
            .expect("a fleet")
        };
        let text = |fleet: &Fleet| table(fleet, &BTreeMap::new(), &[], &[], false, false);

        let few = text(&fleet(2));
        assert!(few.contains("warnings   2 in the last render\n"), "{few}");
        assert!(few.contains("  clusters/c2.yaml: warning: w2\n"), "{few}");
        assert!(!few.contains("more"), "{few}");

        let many = text(&fleet(7));
        assert!(
            many.contains("warnings   7 in the last render (`flotilla validate` lists them all)\n"),
            "{many}"
        );
        assert!(many.contains("  clusters/c5.yaml: warning: w5\n"), "{many}");
        assert!(!many.contains("w6"), "{many}");
        assert!(many.contains("  … and 2 more\n"), "{many}");

        // None (and a hub that does not say): no line.
        let none: Fleet =
            serde_json::from_value(serde_json::json!({"revision": null, "clusters": []}))
                .expect("a fleet");
        assert!(!text(&none).contains("warnings"));
    }

    #[test]
    fn durations_read_like_kubectl() {
        for (seconds, expect) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (3600, "1h"),
            (3720, "1h2m"),
            (86_400 * 2 + 3600 * 5 + 7, "2d5h"),
            (86_400, "1d"),
        ] {
            assert_eq!(ago(seconds), expect, "{seconds}s");
        }
    }
}
