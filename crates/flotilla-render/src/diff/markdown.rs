//! The markdown report, for a pull-request comment: a summary table, then one
//! `<details>` section per change group, kept under a byte limit because hosts
//! reject longer comments (GitHub at 65,536 characters).
//!
//! The report is assembled from whole blocks, so no code fence or `<details>` is
//! ever cut open. When not everything fits, every change group is first given its
//! smallest form (its title, up to 20 clusters, its resources without diffs), since
//! knowing which clusters a change touches matters more than reading one diff;
//! then, largest group first, each gets back its diffs, resource by resource, and
//! its full cluster list, while room remains. A note at the top says what was cut.

use std::fmt::Write as _;

use super::{ChangeGroup, ClusterDiff, ClusterStatus, FleetDiff, plural};
use flotilla_core::diagnostic::Diagnostic;

/// The default `--max-bytes`: under GitHub's limit, with room for a bot's own text.
pub const DEFAULT_MAX_BYTES: usize = 60_000;
/// The smallest `--max-bytes` that leaves room for the summary and the note.
pub const MIN_MAX_BYTES: usize = 4_000;
/// Cluster lists longer than this are folded into their own `<details>`.
const UNFOLDED_CLUSTERS: usize = 5;
/// Clusters listed per group when the full list does not fit.
const FOLDED_CLUSTERS: usize = 20;
/// Diagnostics listed per side at most.
const DIAGNOSTICS_SHOWN: usize = 20;
/// Bytes kept free for the note on what was cut.
const NOTE_RESERVE: usize = 1_500;
/// Longest group title repeated in the note.
const NOTE_TITLE_CHARS: usize = 60;

#[derive(Clone, Copy, Debug)]
pub struct MarkdownOptions {
    /// The report is at most this many bytes (UTF-8); values below
    /// [`MIN_MAX_BYTES`] are raised to it.
    pub max_bytes: usize,
}

impl Default for MarkdownOptions {
    fn default() -> Self {
        MarkdownOptions {
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// How much of a change group is shown.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Layout {
    /// Every cluster, or at most [`FOLDED_CLUSTERS`].
    all_clusters: bool,
    /// Which of the resources that have a diff show it, in order (those past the
    /// end do not).
    diffs: Vec<bool>,
}

impl Layout {
    /// Every cluster folded, no diff shown.
    fn smallest() -> Layout {
        Layout {
            all_clusters: false,
            diffs: Vec::new(),
        }
    }

    /// How many diffs it shows.
    fn shown(&self) -> usize {
        self.diffs.iter().filter(|&&shown| shown).count()
    }
}

/// What had to be left out, for the note.
#[derive(Default)]
struct Cuts {
    diagnostics: usize,
    table_rows: usize,
    plan_rows: usize,
    /// Groups (indices) shown with a shortened cluster list.
    shortened: Vec<usize>,
    /// Groups shown with some or all of their diffs left out.
    without_diffs: Vec<usize>,
    /// Groups not shown at all.
    omitted: Vec<usize>,
}

impl Cuts {
    fn any(&self) -> bool {
        self.diagnostics + self.table_rows + self.plan_rows > 0
            || !self.shortened.is_empty()
            || !self.without_diffs.is_empty()
            || !self.omitted.is_empty()
    }
}

pub fn report(diff: &FleetDiff, options: &MarkdownOptions) -> String {
    let max_bytes = options.max_bytes.max(MIN_MAX_BYTES);
    let mut cuts = Cuts::default();
    let mut budget = max_bytes - NOTE_RESERVE;

    let mut head = header(diff);
    budget = budget.saturating_sub(head.len());
    if diff.head_is_broken() {
        let block = diagnostics_block(
            "CAUTION",
            &format!(
                "**HEAD does not render** ({} error{}): the hub would not serve it.{}{}",
                diff.head.errors.len(),
                plural(diff.head.errors.len()),
                failed_sentence(diff),
                if diff.has_changes() {
                    " The changes below are those of the clusters HEAD did render."
                } else {
                    ""
                }
            ),
            &diff.head.errors,
            budget / 2,
            &mut cuts,
        );
        budget = budget.saturating_sub(block.len());
        head.push_str(&block);
    }
    if !diff.base.is_clean() {
        let block = diagnostics_block(
            "WARNING",
            &format!(
                "**BASE does not render** ({} error{}): the \"before\" side is what BASE renders despite them.",
                diff.base.errors.len(),
                plural(diff.base.errors.len())
            ),
            &diff.base.errors,
            budget / 3,
            &mut cuts,
        );
        budget = budget.saturating_sub(block.len());
        head.push_str(&block);
    }
    let charts = chart_block(diff);
    budget = budget.saturating_sub(charts.len());
    head.push_str(&charts);
    if diff.has_changes() {
        let plan = plan_block(diff, budget / 3, &mut cuts);
        budget = budget.saturating_sub(plan.len());
        head.push_str(&plan);
    }
    let table = table(diff, budget / 2, &mut cuts);
    budget = budget.saturating_sub(table.len());
    head.push_str(&table);

    // First pass: every group that fits, in its smallest form.
    let mut blocks: Vec<(usize, String)> = Vec::new();
    for (index, group) in diff.groups.iter().enumerate() {
        let block = group_block(diff, group, &Layout::smallest());
        if block.len() <= budget {
            budget -= block.len();
            blocks.push((index, block));
        } else {
            cuts.omitted.push(index);
        }
    }
    // Second pass: diffs back, one resource per group per round, so that every
    // group shows its first diff before any shows its tenth. A diff that does not
    // fit is left out, and the group's later (smaller) ones are still tried.
    let mut layouts = vec![Layout::smallest(); blocks.len()];
    let texts: Vec<Vec<&str>> = blocks
        .iter()
        .map(|(index, _)| diff_texts(&diff.groups[*index]))
        .collect();
    // Per group, the shortest diff that did not fit: the budget only shrinks, so a
    // diff as long is not tried again (a group of thousands of diffs near the end of
    // the budget is not rebuilt once per diff).
    let mut too_long = vec![usize::MAX; blocks.len()];
    let mut open = true;
    while open {
        open = false;
        for (slot, (index, block)) in blocks.iter_mut().enumerate() {
            let group = &diff.groups[*index];
            let tried = layouts[slot].diffs.len();
            let Some(text) = texts[slot].get(tried) else {
                continue;
            };
            open = true;
            let mut next = layouts[slot].clone();
            // A diff longer than what is left cannot fit: not even tried.
            next.diffs
                .push(text.len() <= budget && text.len() < too_long[slot]);
            if next.diffs[tried]
                && let Some(grown) = replace_if_fits(diff, group, &next, block, &mut budget)
            {
                *block = grown;
            } else {
                if next.diffs[tried] {
                    too_long[slot] = text.len();
                }
                next.diffs[tried] = false;
            }
            layouts[slot] = next;
        }
    }
    // Last, full cluster lists where they were folded.
    for (slot, (index, block)) in blocks.iter_mut().enumerate() {
        let group = &diff.groups[*index];
        if group.clusters.len() > FOLDED_CLUSTERS {
            let next = Layout {
                all_clusters: true,
                ..layouts[slot].clone()
            };
            match replace_if_fits(diff, group, &next, block, &mut budget) {
                Some(grown) => *block = grown,
                None => cuts.shortened.push(*index),
            }
        }
        if layouts[slot].shown() < texts[slot].len() {
            cuts.without_diffs.push(*index);
        }
    }

    // The note's size is known only now; should it outgrow its reserve, the last
    // groups make room for it.
    loop {
        let note = if cuts.any() {
            note(diff, &cuts, max_bytes)
        } else {
            String::new()
        };
        let size = head.len() + note.len() + blocks.iter().map(|(_, b)| b.len()).sum::<usize>();
        if size <= max_bytes || blocks.is_empty() {
            let mut out = head;
            out.push_str(&note);
            for (_, block) in blocks {
                out.push_str(&block);
            }
            return out;
        }
        if let Some((index, _)) = blocks.pop() {
            cuts.shortened.retain(|&i| i != index);
            cuts.without_diffs.retain(|&i| i != index);
            cuts.omitted.push(index);
            cuts.omitted.sort_unstable();
        }
    }
}

fn header(diff: &FleetDiff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### flotilla diff: {}\n",
        super::text::summary_line(&diff.totals)
    );
    let _ = writeln!(
        out,
        "{} → {}\n",
        code(&clip(&diff.base.revision, 200)),
        code(&clip(&diff.head.revision, 200))
    );
    if !diff.has_changes() && diff.totals.failed == 0 {
        out.push_str("No cluster's bundle changes.\n\n");
    }
    out
}

fn failed_sentence(diff: &FleetDiff) -> String {
    match diff.totals.failed {
        0 => String::new(),
        n => format!(
            " {n} cluster{} did not render at all: {}.",
            plural(n),
            escape_html(&diff.failed_names(FOLDED_CLUSTERS))
        ),
    }
}

/// An alert with as many diagnostics (in a text fence) as fit in `budget`.
fn diagnostics_block(
    alert: &str,
    headline: &str,
    diagnostics: &[Diagnostic],
    budget: usize,
    cuts: &mut Cuts,
) -> String {
    let intro = format!("> [!{alert}]\n> {headline}\n\n");
    let lines: Vec<String> = diagnostics
        .iter()
        .map(|d| clip(&d.to_string(), 500))
        .collect();
    let fence = fence_for(&lines.join("\n"));
    let mut body = String::new();
    let mut shown = 0;
    for line in lines.iter().take(DIAGNOSTICS_SHOWN) {
        if intro.len() + body.len() + line.len() + 2 * fence.len() + 40 > budget {
            break;
        }
        body.push_str(line);
        body.push('\n');
        shown += 1;
    }
    let left = diagnostics.len() - shown;
    if left > 0 {
        let _ = writeln!(body, "... and {left} more");
        cuts.diagnostics += left;
    }
    format!("{intro}{fence}text\n{body}{fence}\n\n")
}

/// At most this many clusters are named per wave of the plan.
const PLAN_NAMES: usize = 5;

fn names(list: &[String]) -> String {
    let mut text = list
        .iter()
        .take(PLAN_NAMES)
        .map(|n| code(n))
        .collect::<Vec<_>>()
        .join(", ");
    if list.len() > PLAN_NAMES {
        let _ = write!(text, " and {} more", list.len() - PLAN_NAMES);
    }
    text
}

/// The rollout plan: a table of every wave (as many rows as fit in `budget`), then what
/// changes at once and what is paused.
/// The Helm workloads whose chart changed, as a short list.
fn chart_block(diff: &FleetDiff) -> String {
    let changes = diff.chart_changes();
    if changes.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n**Helm charts**\n\n");
    for change in changes {
        out.push_str(&format!(
            "- `{}`: {} → {}\n",
            change.workload,
            change
                .base
                .map_or("(none)".to_string(), |c| format!("`{c}`")),
            change
                .head
                .map_or("(none)".to_string(), |c| format!("`{c}`"))
        ));
    }
    out
}

fn plan_block(diff: &FleetDiff, budget: usize, cuts: &mut Cuts) -> String {
    let plan = &diff.plan;
    if !plan.has_policies() && plan.paused.is_empty() {
        return "**Rollout plan:** no rollout policy; every changed cluster changes at once.\n\n"
            .to_string();
    }
    let mut out = String::from("**Rollout plan**\n\n");
    let mut tail = String::new();
    if !plan.at_once.is_empty() {
        let _ = writeln!(
            tail,
            "- **at once** (no rollout policy): {} cluster{}: {}",
            plan.at_once.len(),
            plural(plan.at_once.len()),
            names(&plan.at_once)
        );
    }
    if !plan.paused.is_empty() {
        let _ = writeln!(
            tail,
            "- **paused** (`spec.paused`; they keep what they run): {} cluster{}: {}",
            plan.paused.len(),
            plural(plan.paused.len()),
            names(&plan.paused)
        );
    }
    if !tail.is_empty() {
        tail.push('\n');
    }
    if plan.has_policies() {
        out.push_str(
            "| policy | wave | changed clusters | bake | maxFailed | maxParallel |\n| :-- | :-- | --: | :-- | :-- | :-- |\n",
        );
        let mut left = 0;
        for wave in &plan.waves {
            let clusters = if wave.clusters.is_empty() {
                "0".to_string()
            } else {
                format!("{}: {}", wave.clusters.len(), names(&wave.clusters))
            };
            let row = format!(
                "| {} | {} | {clusters} | {} | {} | {} |\n",
                escape_cell(&wave.policy),
                escape_cell(&wave.name),
                flotilla_core::rollout::format_duration(wave.bake),
                wave.max_failed,
                wave.max_parallel
                    .map_or_else(|| "all".to_string(), |b| b.to_string())
            );
            if out.len() + row.len() + tail.len() + 80 > budget {
                left += 1;
                continue;
            }
            out.push_str(&row);
        }
        if left > 0 {
            cuts.plan_rows += left;
            let _ = writeln!(
                out,
                "| *{left} wave{} not listed* | | | | | |",
                plural(left)
            );
        }
        out.push('\n');
    }
    out.push_str(&tail);
    out
}

fn table(diff: &FleetDiff, budget: usize, cuts: &mut Cuts) -> String {
    let show_failed = diff.totals.failed > 0;
    let row = |name: &str, c: &super::Counts| {
        let mut line = format!(
            "| {name} | {} | {} | {} | {} | {} |",
            c.clusters, c.changed, c.added, c.removed, c.unchanged
        );
        if show_failed {
            let _ = write!(line, " {} |", c.failed);
        }
        line.push('\n');
        line
    };
    let mut out =
        String::from("| fleet group | clusters | changed | added | removed | unchanged |");
    if show_failed {
        out.push_str(" not rendered |");
    }
    out.push_str("\n| :-- | --: | --: | --: | --: | --: |");
    if show_failed {
        out.push_str(" --: |");
    }
    out.push('\n');
    out.push_str(&row("**all clusters**", &diff.totals));
    // When not every row fits, only fleet groups with changes are listed.
    let rows: Vec<String> = diff
        .fleet_groups
        .iter()
        .map(|(name, counts)| row(&escape_cell(name), counts))
        .collect();
    let all: usize = rows.iter().map(String::len).sum();
    let kept: Vec<&String> = if out.len() + all + 2 <= budget {
        rows.iter().collect()
    } else {
        let mut size = out.len() + 80;
        diff.fleet_groups
            .values()
            .zip(&rows)
            .filter(|(counts, _)| counts.touched())
            .map(|(_, row)| row)
            .take_while(|row| {
                size += row.len();
                size <= budget
            })
            .collect()
    };
    for row in &kept {
        out.push_str(row);
    }
    let left = rows.len() - kept.len();
    if left > 0 {
        cuts.table_rows += left;
        let _ = writeln!(
            out,
            "| *{left} fleet group{} not listed* | | | | | |{}",
            plural(left),
            if show_failed { " |" } else { "" }
        );
    }
    out.push('\n');
    out
}

/// The diffs of `group`'s resources that have one, in order.
fn diff_texts(group: &ChangeGroup) -> Vec<&str> {
    group
        .resources
        .iter()
        .filter_map(|r| r.diff.as_deref())
        .collect()
}

/// The block of `group` in `layout`, if it fits in place of `current`; the budget
/// is updated when it does.
fn replace_if_fits(
    diff: &FleetDiff,
    group: &ChangeGroup,
    layout: &Layout,
    current: &str,
    budget: &mut usize,
) -> Option<String> {
    let block = group_block(diff, group, layout);
    let room = *budget + current.len();
    (block.len() <= room).then(|| {
        *budget = room - block.len();
        block
    })
}

fn group_block(diff: &FleetDiff, group: &ChangeGroup, layout: &Layout) -> String {
    let mut out = format!(
        "<details>\n<summary><b>{}</b>: {}</summary>\n\n",
        escape_html(&group.title()),
        escape_html(&group.resource_summary())
    );
    // Only the clusters shown are looked up: a group may hold thousands.
    let shown = if layout.all_clusters {
        group.clusters.len()
    } else {
        FOLDED_CLUSTERS.min(group.clusters.len())
    };
    let members: Vec<&ClusterDiff> = group.clusters[..shown]
        .iter()
        .filter_map(|name| {
            diff.clusters
                .binary_search_by(|c| c.name.as_str().cmp(name))
                .ok()
                .map(|i| &diff.clusters[i])
        })
        .collect();
    let labelled = diff.plan.has_policies() || !diff.plan.paused.is_empty();
    let digests = |c: &ClusterDiff| {
        let label = c
            .rollout
            .as_ref()
            .filter(|_| labelled)
            .map(|r| format!(" ({})", escape_cell(&r.label())))
            .unwrap_or_default();
        format!(
            "{} → {}{label}",
            code(&super::text::short(c.before.as_ref())),
            code(&super::text::short(c.after.as_ref()))
        )
    };
    let total = group.clusters.len();
    match members.as_slice() {
        [one] if total == 1 => {
            let _ = writeln!(out, "{}: {}\n", code(&one.name), digests(one));
        }
        many => {
            let fold = total > UNFOLDED_CLUSTERS;
            if fold {
                let _ = writeln!(out, "<details>\n<summary>{total} clusters</summary>\n");
            }
            out.push_str("| cluster | digest |\n| :-- | :-- |\n");
            for member in many {
                let _ = writeln!(out, "| {} | {} |", code(&member.name), digests(member));
            }
            if many.len() < total {
                let _ = writeln!(
                    out,
                    "| *... and {} more (`--format json` lists them all)* | |",
                    total - many.len()
                );
            }
            out.push('\n');
            if fold {
                out.push_str("</details>\n\n");
            }
        }
    }
    let meta_lines: Vec<String> = group
        .meta
        .iter()
        .flat_map(super::MetaChange::lines)
        .collect();
    if !meta_lines.is_empty() {
        for line in meta_lines {
            let _ = writeln!(out, "- {}", escape_html(&line));
        }
        out.push('\n');
    }
    if group.status == ClusterStatus::Removed {
        out.push_str("The hub stops serving these bundles:\n\n");
    }
    if group.before_unknown {
        out.push_str(
            "BASE did not render these clusters, so there is nothing to compare with; on HEAD they hold:\n\n",
        );
    }
    let mut nth_diff = 0;
    let mut hidden = 0;
    let mut listed = false;
    for resource in &group.resources {
        let shown = resource.diff.is_some() && layout.diffs.get(nth_diff) == Some(&true);
        nth_diff += usize::from(resource.diff.is_some());
        match &resource.diff {
            Some(text) if shown => {
                if listed {
                    out.push('\n');
                    listed = false;
                }
                let fence = fence_for(text);
                let _ = writeln!(
                    out,
                    "**{}** {}\n\n{fence}diff\n{text}{fence}\n",
                    resource.kind.as_str(),
                    code(&resource.key.to_string())
                );
            }
            diff_text => {
                hidden += usize::from(diff_text.is_some());
                if group.before_unknown {
                    let _ = writeln!(out, "- {}", code(&resource.key.to_string()));
                } else {
                    let _ = writeln!(
                        out,
                        "- {} {}",
                        resource.kind.as_str(),
                        code(&resource.key.to_string())
                    );
                }
                listed = true;
            }
        }
    }
    if listed {
        out.push('\n');
    }
    if hidden > 0 {
        let _ = writeln!(
            out,
            "*The diff{} of {hidden} resource{} left out to fit the size limit.*\n",
            plural(hidden),
            if hidden == 1 { " was" } else { "s were" }
        );
    }
    out.push_str("</details>\n\n");
    out
}

fn note(diff: &FleetDiff, cuts: &Cuts, max_bytes: usize) -> String {
    let mut out = format!(
        "> [!NOTE]\n> This comment was cut to stay under {max_bytes} bytes; \
         run `flotilla diff` locally (or use `--format json`) for the full report.\n"
    );
    let list = |titles: &[usize]| {
        let mut text = titles
            .iter()
            .take(3)
            .map(|&i| clip(&diff.groups[i].title(), NOTE_TITLE_CHARS))
            .collect::<Vec<_>>()
            .join("; ");
        if titles.len() > 3 {
            let _ = write!(text, "; and {} more", titles.len() - 3);
        }
        escape_html(&text)
    };
    if !cuts.omitted.is_empty() {
        let _ = writeln!(
            out,
            "> - {} change group{} not shown: {}",
            cuts.omitted.len(),
            plural(cuts.omitted.len()),
            list(&cuts.omitted)
        );
    }
    if !cuts.without_diffs.is_empty() {
        let _ = writeln!(
            out,
            "> - {} change group{} shown without some or all of their diffs: {}",
            cuts.without_diffs.len(),
            plural(cuts.without_diffs.len()),
            list(&cuts.without_diffs)
        );
    }
    if !cuts.shortened.is_empty() {
        let _ = writeln!(
            out,
            "> - {} change group{} with a shortened cluster list: {}",
            cuts.shortened.len(),
            plural(cuts.shortened.len()),
            list(&cuts.shortened)
        );
    }
    if cuts.diagnostics > 0 {
        let _ = writeln!(out, "> - {} diagnostics not listed", cuts.diagnostics);
    }
    if cuts.plan_rows > 0 {
        let _ = writeln!(
            out,
            "> - {} wave{} left out of the rollout plan",
            cuts.plan_rows,
            plural(cuts.plan_rows)
        );
    }
    if cuts.table_rows > 0 {
        let _ = writeln!(
            out,
            "> - {} fleet group{} left out of the table",
            cuts.table_rows,
            plural(cuts.table_rows)
        );
    }
    out.push('\n');
    out
}

/// A code fence longer than any run of backticks in `text`.
fn fence_for(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    "`".repeat((longest + 1).max(3))
}

/// An inline code span that survives backticks and table pipes in `text`.
fn code(text: &str) -> String {
    let text = text.replace('|', "\\|");
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn escape_cell(text: &str) -> String {
    escape_html(text).replace('|', "\\|")
}

/// At most `chars` characters of `text`, marked with an ellipsis when cut.
fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((index, _)) => format!("{}…", &text[..index]),
        None => text.to_string(),
    }
}
