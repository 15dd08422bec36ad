//! `flotilla rollout list|show|pause|resume|promote|abort`: watch and steer rollouts on
//! a running hub (an admin token; every action is recorded with the token's id), or
//! straight on the hub's database with `--database` (recorded as `database:USER`).

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use serde::Deserialize;

use super::EXIT_OK;
use super::remote::{Fleet, HubArgs, Output};
use flotilla_core::rollout::view::RolloutView;

#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: RolloutCommand,
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// The active rollouts, then the recent ones, with each wave's progress.
    List {
        #[command(flatten)]
        hub: HubArgs,
    },
    /// One rollout: its waves, its clusters that need attention, and every decision.
    Show {
        /// The rollout's id (from `rollout list`).
        id: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Stop releasing waves and changing clusters until `resume`.
    Pause {
        /// The id of the rollout to pause (from `rollout list`).
        id: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Go on after a pause; after a halt, release the failed wave again with a new deadline.
    Resume {
        /// The id of the rollout to resume (from `rollout list`).
        id: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Release the next wave now, without waiting for the bake or a window.
    Promote {
        /// The id of the rollout to promote (from `rollout list`).
        id: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// End the rollout for good: every cluster it changed gets its previous digest back.
    Abort {
        /// The id of the rollout to abort (from `rollout list`).
        id: u64,
        #[command(flatten)]
        hub: HubArgs,
    },
}

#[derive(Deserialize)]
struct List {
    rollouts: Vec<RolloutView>,
}

pub fn run_rollout(args: &RolloutArgs) -> anyhow::Result<u8> {
    let (hub, action, id) = match &args.command {
        RolloutCommand::List { hub } => (hub, None, None),
        RolloutCommand::Show { id, hub } => (hub, None, Some(*id)),
        RolloutCommand::Pause { id, hub } => (hub, Some("pause"), Some(*id)),
        RolloutCommand::Resume { id, hub } => (hub, Some("resume"), Some(*id)),
        RolloutCommand::Promote { id, hub } => (hub, Some("promote"), Some(*id)),
        RolloutCommand::Abort { id, hub } => (hub, Some("abort"), Some(*id)),
    };
    let client = Fleet::new(hub)?;
    let text = match (action, id) {
        (None, None) => {
            let list = client.rollouts()?;
            match hub.output {
                Output::Json => pretty(&list)?,
                Output::Table => list_table(&serde_json::from_value::<List>(list)?.rollouts),
            }
        }
        (None, Some(id)) => {
            let view = client.rollout(id)?;
            match hub.output {
                Output::Json => pretty(&view)?,
                Output::Table => show(&serde_json::from_value(view)?),
            }
        }
        (Some(action), Some(id)) => {
            let view = client.act(id, action)?;
            match hub.output {
                Output::Json => pretty(&view)?,
                Output::Table => {
                    let view: RolloutView = serde_json::from_value(view)?;
                    format!(
                        "rollout {} of {} is {}{}\n",
                        view.id,
                        view.policy,
                        view.state,
                        view.reason
                            .as_deref()
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default()
                    )
                }
            }
        }
        (Some(_), None) => unreachable_args()?,
    };
    print!("{text}");
    Ok(EXIT_OK)
}

fn unreachable_args() -> anyhow::Result<String> {
    anyhow::bail!("an action needs a rollout id")
}

fn pretty(value: &serde_json::Value) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    Ok(text)
}

/// `canary ✓ 3/3 · rest 2/9 (1 failed)`: each wave's clusters in sync of all.
pub(super) fn waves_line(view: &RolloutView) -> String {
    view.waves
        .iter()
        .map(|w| {
            let mark = match w.state {
                flotilla_core::rollout::WaveState::Complete => " ✓",
                flotilla_core::rollout::WaveState::Failed => " ✗",
                flotilla_core::rollout::WaveState::Released => " ▶",
                flotilla_core::rollout::WaveState::Waiting => "",
            };
            let mut text = format!("{}{mark} {}/{}", w.name, w.in_sync, w.clusters);
            if w.failed > 0 {
                let _ = write!(text, " ({} failed)", w.failed);
            }
            text
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

fn list_table(rollouts: &[RolloutView]) -> String {
    if rollouts.is_empty() {
        return "no rollouts yet: a commit that changes a cluster governed by a RolloutPolicy starts one\n"
            .to_string();
    }
    let rows: Vec<[String; 6]> = rollouts
        .iter()
        .map(|r| {
            [
                r.id.to_string(),
                r.policy.clone(),
                short_revision(&r.revision),
                r.state.to_string(),
                waves_line(r),
                r.started_at.clone(),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "POLICY",
            "REVISION",
            "STATE",
            "WAVES (in sync/changing)",
            "STARTED",
        ],
        &rows,
    )
}

pub(super) fn short_revision(revision: &str) -> String {
    match revision.split_once("@sha1:") {
        Some((branch, commit)) => format!("{branch}@{}", &commit[..commit.len().min(10)]),
        None => revision.to_string(),
    }
}

fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    table_painted(header, rows, None)
}

/// Picks a terminal colour (an ANSI escape) for a cell's text, or none.
pub(super) type Paint = fn(&str) -> Option<&'static str>;

/// Aligned columns, two spaces apart, like `kubectl get`. `painted` colours one
/// column's cells (for a terminal) without changing the alignment.
pub(super) fn table_painted<const N: usize>(
    header: &[&str; N],
    rows: &[[String; N]],
    painted: Option<(usize, Paint)>,
) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>, paint: bool| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            let colour = painted
                .filter(|(column, _)| paint && *column == i)
                .and_then(|(_, paint)| paint(cell));
            let shown = match colour {
                Some(colour) => format!("{colour}{cell}\x1b[0m"),
                None => cell.to_string(),
            };
            if i + 1 == cells.len() {
                text.push_str(&shown);
            } else {
                let pad = width - cell.chars().count();
                let _ = write!(text, "{shown}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), false);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), true);
    }
    out
}

fn show(view: &RolloutView) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "rollout {} of policy {} for {}{}",
        view.id,
        view.policy,
        view.revision,
        if view.forced {
            " (forced: every wave at once)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "state: {}{}",
        view.state,
        view.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "started {}{}{}\n",
        view.started_at,
        view.ended_at
            .as_deref()
            .map(|e| format!(", ended {e}"))
            .unwrap_or_default(),
        view.settling_until
            .as_deref()
            .map(|at| format!(
                "\nsettling: the hub releases no wave by itself before {at} (some of the \
                 rollout's clusters have not been heard from since it started, and until then \
                 it cannot tell an offline cluster from one that has not polled yet; it releases \
                 sooner once every cluster has been seen; `rollout promote` releases the next \
                 wave now)"
            ))
            .unwrap_or_default()
    );
    let rows: Vec<[String; 10]> = view
        .waves
        .iter()
        .map(|w| {
            [
                w.name.clone(),
                w.state.as_str().to_string(),
                w.clusters.to_string(),
                w.in_sync.to_string(),
                w.failed.to_string(),
                w.offline.to_string(),
                w.never_seen.to_string(),
                w.bake.clone(),
                w.max_failed.clone(),
                w.max_parallel.clone().unwrap_or_else(|| "all".to_string()),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "WAVE",
            "STATE",
            "CHANGING",
            "IN SYNC",
            "FAILED",
            "OFFLINE",
            "NEVER SEEN",
            "BAKE",
            "MAX FAILED",
            "MAX PARALLEL",
        ],
        &rows,
    ));
    let attention: Vec<[String; 3]> = view
        .clusters
        .iter()
        .filter(|c| !matches!(c.state.as_str(), "waiting" | "baked" | "healthy"))
        .map(|c| [c.name.clone(), c.wave.clone(), c.state.clone()])
        .collect();
    if !attention.is_empty() {
        out.push('\n');
        out.push_str(&table(&["CLUSTER", "WAVE", "STATE"], &attention));
    }
    if !view.events.is_empty() {
        out.push_str("\nevents:\n");
        for event in &view.events {
            let _ = writeln!(
                out,
                "  {}  {}{}",
                event.at,
                event.message,
                event
                    .by
                    .as_deref()
                    .map(|by| match &event.role {
                        Some(role) => format!(" [token {by}, {role}]"),
                        None => format!(" [token {by}]"),
                    })
                    .unwrap_or_default()
            );
        }
    }
    out
}
