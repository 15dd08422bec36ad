//! The text report, for a terminal (with colour) or a log.

use std::fmt::Write as _;

use super::{ChangeGroup, ClusterDiff, ClusterStatus, Counts, FleetDiff, plural};
use flotilla_core::bundle::Digest;
use flotilla_core::diagnostic::Diagnostic;

/// At most this many clusters are listed per change group; JSON lists them all.
pub const CLUSTERS_SHOWN: usize = 20;

#[derive(Clone, Copy, Debug, Default)]
pub struct TextOptions {
    /// ANSI colours: on for a terminal unless `NO_COLOR` is set.
    pub colour: bool,
}

struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
    fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
    fn red(&self, text: &str) -> String {
        self.paint("31", text)
    }
    fn green(&self, text: &str) -> String {
        self.paint("32", text)
    }
    fn cyan(&self, text: &str) -> String {
        self.paint("36", text)
    }
    fn yellow(&self, text: &str) -> String {
        self.paint("33", text)
    }
}

pub fn report(diff: &FleetDiff, options: &TextOptions) -> String {
    let style = Style { on: options.colour };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {} -> {}",
        style.bold("flotilla diff"),
        diff.base.revision,
        diff.head.revision
    );
    if diff.head_is_broken() {
        let failed = diff.totals.failed;
        let _ = writeln!(
            out,
            "\n{} with {} error{}; the hub would not serve it.{}",
            style.red(&style.bold("HEAD does not render")),
            diff.head.errors.len(),
            plural(diff.head.errors.len()),
            if failed > 0 {
                format!(
                    "\n{failed} cluster{} did not render at all: {}.",
                    plural(failed),
                    diff.failed_names(CLUSTERS_SHOWN)
                )
            } else {
                String::new()
            }
        );
        write_diagnostics(&mut out, &diff.head.errors);
        if diff.has_changes() {
            let _ = writeln!(
                out,
                "The changes below are those of the clusters HEAD did render."
            );
        }
    }
    if !diff.base.is_clean() {
        let _ = writeln!(
            out,
            "\n{} with {} error{} (the \"before\" side is what BASE renders despite them):",
            style.yellow("BASE does not render"),
            diff.base.errors.len(),
            plural(diff.base.errors.len())
        );
        write_diagnostics(&mut out, &diff.base.errors);
    }
    if !diff.head.warnings.is_empty() {
        let _ = writeln!(
            out,
            "\n{} on HEAD:",
            style.yellow(&format!(
                "{} warning{}",
                diff.head.warnings.len(),
                plural(diff.head.warnings.len())
            ))
        );
        write_diagnostics(&mut out, &diff.head.warnings);
    }

    if diff.has_changes() {
        write_plan(&mut out, diff, &style);
    }
    write_chart_changes(&mut out, diff, &style);
    let _ = writeln!(out, "\n{}", style.bold(&summary_line(&diff.totals)));
    write_table(&mut out, diff);
    if !diff.has_changes() {
        return out;
    }
    for group in &diff.groups {
        write_group(&mut out, diff, group, &style);
    }
    out
}

/// The Helm workloads whose chart changed, one line each.
fn write_chart_changes(out: &mut String, diff: &FleetDiff, style: &Style) {
    let changes = diff.chart_changes();
    if changes.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n{}", style.bold("Helm charts"));
    for change in changes {
        let _ = writeln!(
            out,
            "  {}: {} -> {}",
            change.workload,
            change.base.unwrap_or("(none)"),
            change.head.unwrap_or("(none)")
        );
    }
}

/// Names, at most [`CLUSTERS_SHOWN`] of them.
fn some_names(names: &[String]) -> String {
    let mut shown: Vec<&str> = names
        .iter()
        .take(CLUSTERS_SHOWN)
        .map(String::as_str)
        .collect();
    let more = names.len().saturating_sub(CLUSTERS_SHOWN);
    let more_text = format!("and {more} more");
    if more > 0 {
        shown.push(&more_text);
    }
    shown.join(", ")
}

/// The rollout plan: per policy each wave with the clusters it changes, its bake,
/// failure budget and parallelism; then what changes at once and what is paused.
fn write_plan(out: &mut String, diff: &FleetDiff, style: &Style) {
    let plan = &diff.plan;
    if !plan.has_policies() && plan.paused.is_empty() {
        let _ = writeln!(
            out,
            "\n{} no rollout policy: every changed cluster changes at once.",
            style.bold("Rollout plan:")
        );
        return;
    }
    let _ = writeln!(out, "\n{}", style.bold("Rollout plan"));
    let mut policy: Option<&str> = None;
    let mut number = 0;
    let width = plan.waves.iter().map(|w| w.name.len()).max().unwrap_or(0);
    for wave in &plan.waves {
        if policy != Some(wave.policy.as_str()) {
            let _ = writeln!(out, "  policy {} ({})", wave.policy, wave.file);
            policy = Some(&wave.policy);
            number = 0;
        }
        number += 1;
        let count = wave.clusters.len();
        let _ = writeln!(
            out,
            "    {number}. {:width$}  {:>4} changed cluster{:1}  bake {:<8} maxFailed {:<4} maxParallel {}",
            wave.name,
            count,
            plural(count),
            flotilla_core::rollout::format_duration(wave.bake),
            wave.max_failed.to_string(),
            wave.max_parallel
                .map_or_else(|| "all".to_string(), |b| b.to_string())
        );
    }
    if !plan.at_once.is_empty() {
        let count = plan.at_once.len();
        let _ = writeln!(
            out,
            "  at once (no rollout policy): {count} cluster{}: {}",
            plural(count),
            some_names(&plan.at_once)
        );
    }
    if !plan.paused.is_empty() {
        let count = plan.paused.len();
        let _ = writeln!(
            out,
            "  paused (spec.paused; they keep what they run): {count} cluster{}: {}",
            plural(count),
            some_names(&plan.paused)
        );
    }
}

/// `3 clusters changed, 1 added, 0 removed, 10 unchanged` (and failed, if any).
pub(crate) fn summary_line(totals: &Counts) -> String {
    let mut line = format!(
        "{} cluster{} changed, {} added, {} removed, {} unchanged",
        totals.changed,
        plural(totals.changed),
        totals.added,
        totals.removed,
        totals.unchanged
    );
    if totals.failed > 0 {
        let _ = write!(line, ", {} not rendered on HEAD", totals.failed);
    }
    line
}

fn write_diagnostics(out: &mut String, diagnostics: &[Diagnostic]) {
    for diagnostic in diagnostics {
        let _ = writeln!(out, "  {diagnostic}");
    }
}

fn write_table(out: &mut String, diff: &FleetDiff) {
    let show_failed = diff.totals.failed > 0;
    let mut rows: Vec<(String, &Counts)> = vec![("(all clusters)".to_string(), &diff.totals)];
    rows.extend(
        diff.fleet_groups
            .iter()
            .map(|(name, counts)| (name.clone(), counts)),
    );
    let width = rows
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0)
        .max(11);
    let _ = write!(
        out,
        "\n{:width$}  clusters  changed  added  removed  unchanged",
        "fleet group"
    );
    if show_failed {
        out.push_str("  not rendered");
    }
    out.push('\n');
    for (name, counts) in rows {
        let _ = write!(
            out,
            "{name:width$}  {:>8}  {:>7}  {:>5}  {:>7}  {:>9}",
            counts.clusters, counts.changed, counts.added, counts.removed, counts.unchanged
        );
        if show_failed {
            let _ = write!(out, "  {:>12}", counts.failed);
        }
        out.push('\n');
    }
}

pub(crate) fn short(digest: Option<&Digest>) -> String {
    digest.map_or_else(|| "(none)".to_string(), |d| format!("sha256:{}", d.short()))
}

fn members<'a>(diff: &'a FleetDiff, group: &'a ChangeGroup) -> Vec<&'a ClusterDiff> {
    group
        .clusters
        .iter()
        .filter_map(|name| {
            diff.clusters
                .binary_search_by(|c| c.name.as_str().cmp(name))
                .ok()
                .map(|i| &diff.clusters[i])
        })
        .collect()
}

fn write_group(out: &mut String, diff: &FleetDiff, group: &ChangeGroup, style: &Style) {
    let _ = writeln!(
        out,
        "\n{}",
        style.bold(&format!(
            "== {}: {} ==",
            group.title(),
            group.resource_summary()
        ))
    );
    let members = members(diff, group);
    let width = members.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for cluster in members.iter().take(CLUSTERS_SHOWN) {
        let label = cluster
            .rollout
            .as_ref()
            .filter(|_| diff.plan.has_policies() || !diff.plan.paused.is_empty())
            .map(|r| format!("  ({})", r.label()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:width$}  {} -> {}{label}",
            cluster.name,
            short(cluster.before.as_ref()),
            short(cluster.after.as_ref())
        );
    }
    if members.len() > CLUSTERS_SHOWN {
        let _ = writeln!(
            out,
            "  ... and {} more (--format json lists every cluster)",
            members.len() - CLUSTERS_SHOWN
        );
    }
    for line in group.meta.iter().flat_map(super::MetaChange::lines) {
        let _ = writeln!(out, "  {}", style.cyan(&line));
    }
    if group.status == ClusterStatus::Removed {
        let _ = writeln!(out, "  the hub stops serving these bundles:");
    }
    if group.before_unknown {
        let _ = writeln!(
            out,
            "  BASE did not render these clusters, so there is nothing to compare with; on HEAD they hold:"
        );
        for resource in &group.resources {
            let _ = writeln!(out, "    {}", resource.key);
        }
        return;
    }
    for resource in &group.resources {
        let marker = match resource.kind {
            super::ResourceChangeKind::Added => style.green("added"),
            super::ResourceChangeKind::Removed => style.red("removed"),
            super::ResourceChangeKind::Changed => style.cyan("changed"),
        };
        let _ = writeln!(out, "  {marker} {}", resource.key);
        if let Some(text) = &resource.diff {
            for line in text.lines() {
                let painted = if line.starts_with("@@") {
                    style.cyan(line)
                } else if line.starts_with('+') {
                    style.green(line)
                } else if line.starts_with('-') {
                    style.red(line)
                } else {
                    line.to_string()
                };
                let _ = writeln!(out, "    {painted}");
            }
        }
    }
}
