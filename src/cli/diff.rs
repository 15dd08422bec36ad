//! `flotilla diff`: render two revisions of the fleet and report what changes for
//! every cluster. Reading and rendering happen here; comparing and formatting are
//! the pure [`flotilla_render::diff`].

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use super::{EXIT_ERROR, EXIT_FINDINGS, EXIT_OK};
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_hub::source::{self, Location};
use flotilla_render::diff::markdown::{DEFAULT_MAX_BYTES, MIN_MAX_BYTES, MarkdownOptions};
use flotilla_render::diff::text::TextOptions;
use flotilla_render::diff::{DiffOptions, FleetDiff};
use flotilla_render::{RenderOptions, render_since, render_with};

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DiffFormat {
    /// For a terminal or a log (coloured on a terminal).
    Text,
    /// For a pull-request comment: a summary table and one folded section per change.
    Markdown,
    /// For tools: the shape documented in docs/diff.md.
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ColourChoice {
    /// Colour when standard output is a terminal and NO_COLOR is not set.
    Auto,
    Always,
    Never,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The revision to compare from (any Git revision; with --worktree, default HEAD).
    #[arg(value_name = "BASE", required_unless_present = "worktree")]
    pub base: Option<String>,
    /// The revision to compare to [default: HEAD].
    #[arg(value_name = "HEAD", conflicts_with = "worktree")]
    pub head: Option<String>,
    /// The fleet repository (a Git repository, or a folder inside one).
    #[arg(long, default_value = ".", value_name = "PATH")]
    pub repo: PathBuf,
    /// The fleet root inside the repository.
    #[arg(
        long,
        default_value = "",
        value_name = "SUBDIR",
        hide_default_value = true
    )]
    pub path: String,
    /// Compare BASE with the files on disk (uncommitted edits included).
    #[arg(long)]
    pub worktree: bool,
    /// How to print the report.
    #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
    /// Keep a markdown report under this many bytes (hosts reject longer comments).
    #[arg(long, default_value_t = DEFAULT_MAX_BYTES as u64, value_name = "N",
          value_parser = clap::value_parser!(u64).range(MIN_MAX_BYTES as u64..))]
    pub max_bytes: u64,
    /// Lines of unchanged YAML shown around each change.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub context: usize,
    /// When to colour the text report.
    #[arg(long, value_enum, default_value_t = ColourChoice::Auto, value_name = "WHEN")]
    pub color: ColourChoice,
    #[command(flatten)]
    pub decryption: super::DecryptionArgs,
    #[command(flatten)]
    pub limits: super::LimitArgs,
}

/// Reads and renders BASE and HEAD (in parallel), prints the report, and returns 0
/// when no cluster changes, 1 when some do, 2 when HEAD does not render.
pub fn run_diff(args: &DiffArgs) -> anyhow::Result<u8> {
    let base_rev = args.base.clone().unwrap_or_else(|| "HEAD".to_string());
    let base_location = Location {
        repo: args.repo.clone(),
        rev: Some(base_rev.clone()),
        path: args.path.clone(),
        worktree: false,
    };
    let (head_location, head_name) = if args.worktree {
        let location = Location {
            rev: None,
            worktree: true,
            ..base_location.clone()
        };
        (location, "the working tree".to_string())
    } else {
        let rev = args.head.clone().unwrap_or_else(|| "HEAD".to_string());
        let location = Location {
            rev: Some(rev.clone()),
            ..base_location.clone()
        };
        (location, format!("HEAD ({rev})"))
    };

    let limits = args.limits.limits();
    let render_options = RenderOptions {
        limits: limits.clone(),
        sops: args.decryption.review()?,
        ..RenderOptions::default()
    };
    let render = |snapshot: &FleetSnapshot| render_with(snapshot, &render_options);
    let base_name = format!("BASE ({base_rev})");
    let (base_snapshot, head_snapshot) = std::thread::scope(|scope| {
        let base_job =
            scope.spawn(|| super::source::read_base(&base_location, &base_name, &limits));
        let head = read(&head_location, &head_name, &limits);
        let base = base_job
            .join()
            .map_err(|_| anyhow::anyhow!("reading {base_name} failed unexpectedly"))?;
        anyhow::Ok((base?, head?))
    })?;
    let (base_snapshot, base_note) = base_snapshot;
    if let Some(note) = base_note {
        eprintln!("{note}");
    }
    super::source::warn_for_diff(&head_location, &base_rev, args.head.as_deref());

    let options = DiffOptions {
        context: args.context,
    };
    // BASE's and HEAD's renders share the cap.
    let capped = super::memory::cap(args.limits.render_memory)?;
    let (diff, outputs) = if base_snapshot.files == head_snapshot.files
        && base_snapshot.problems == head_snapshot.problems
    {
        // The same files render the same (the renderer is pure): one render serves
        // both sides of a change that touches nothing in the fleet.
        capped.rendering(&format!("{base_name} and {head_name}"));
        let output = render(&base_snapshot);
        let mut diff = flotilla_render::diff::diff(&output, &output, &options);
        diff.head.revision = head_snapshot.revision.clone();
        (diff, vec![output])
    } else {
        // HEAD in full, then BASE only where a cluster's inputs differ from HEAD's
        // (the others have HEAD's bundles): a change that reaches a few clusters
        // costs about one render.
        capped.rendering(&head_name);
        let head = render(&head_snapshot);
        capped.rendering(&base_name);
        let base = render_since(&head, &base_snapshot, &render_options);
        (
            flotilla_render::diff::diff(&base, &head, &options),
            vec![base, head],
        )
    };
    drop(capped);

    let report = match args.format {
        DiffFormat::Text => flotilla_render::diff::text::report(
            &diff,
            &TextOptions {
                colour: wants_colour(args.color),
            },
        ),
        DiffFormat::Markdown => flotilla_render::diff::markdown::report(
            &diff,
            &MarkdownOptions {
                max_bytes: usize::try_from(args.max_bytes).unwrap_or(usize::MAX),
            },
        ),
        DiffFormat::Json => flotilla_render::diff::json::report(&diff)?,
    };
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout
        .write_all(report.as_bytes())
        .and_then(|()| stdout.flush())
        && err.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(err).context("cannot write the report");
    }
    let code = exit_code(&diff);
    // The process ends right after this. Freeing two renders' worth of small
    // allocations one by one costs about a fifth of a render's time; the system
    // takes the memory back at exit in one go.
    std::mem::forget((outputs, diff, base_snapshot, head_snapshot));
    Ok(code)
}

fn read(location: &Location, name: &str, limits: &Limits) -> anyhow::Result<FleetSnapshot> {
    source::read_within(location, limits).with_context(|| format!("cannot read {name}"))
}

/// 2 when HEAD does not render (CI must stop), 1 when clusters change, else 0.
pub fn exit_code(diff: &FleetDiff) -> u8 {
    if diff.head_is_broken() {
        EXIT_ERROR
    } else if diff.has_changes() {
        EXIT_FINDINGS
    } else {
        EXIT_OK
    }
}

fn wants_colour(choice: ColourChoice) -> bool {
    match choice {
        ColourChoice::Always => true,
        ColourChoice::Never => false,
        ColourChoice::Auto => {
            std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    }
}
