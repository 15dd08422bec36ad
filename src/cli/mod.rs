//! The command line: clap definitions, the validated settings built from them, and
//! one function per subcommand. `main` only calls [`main`].

mod diff;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Exit code for "ran fine, nothing to report".
pub const EXIT_OK: u8 = 0;
/// Exit code for "ran fine, and the answer is no" (invalid fleet, changes found).
pub const EXIT_FINDINGS: u8 = 1;
/// Exit code for "could not run".
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "flotilla",
    version,
    about = "GitOps fleet reconciler for edge Kubernetes",
    long_about = "flotilla renders one canonical, content-hashed bundle per cluster from a fleet \
                  repository, serves bundles to edge agents, applies them at the edge, and shows \
                  reviewers what a change does to every cluster."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render every cluster's bundle and print it, or write it to a folder.
    Render(RenderArgs),
    /// Check the fleet and report every error at once (exit 0 valid, 1 invalid, 2 could not run).
    Validate(ValidateArgs),
    /// Show what a change does to every cluster: BASE and HEAD rendered and compared
    /// (exit 0 no cluster changes, 1 changes, 2 HEAD does not render or could not run).
    Diff(diff::DiffArgs),
    /// Write the JSON Schemas of flotilla's kinds (Cluster, Group, Workload, Overlay).
    #[command(hide = true)]
    Schemas(SchemasArgs),
}

/// Where the fleet is read from.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The fleet repository: a Git repository or a plain folder.
    #[arg(long, default_value = ".", value_name = "PATH")]
    pub repo: PathBuf,
    /// The Git revision to read (default: HEAD for a Git repository; a plain folder is read as it is on disk).
    #[arg(long, value_name = "REV")]
    pub rev: Option<String>,
    /// The fleet root inside the repository.
    #[arg(
        long,
        default_value = "",
        value_name = "SUBDIR",
        hide_default_value = true
    )]
    pub path: String,
    /// Read the files on disk even in a Git repository (uncommitted edits included).
    #[arg(long, conflicts_with = "rev")]
    pub worktree: bool,
}

impl SourceArgs {
    pub fn location(&self) -> crate::source::Location {
        crate::source::Location {
            repo: self.repo.clone(),
            rev: self.rev.clone(),
            path: self.path.clone(),
            worktree: self.worktree,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Render only this cluster (repeatable).
    #[arg(long = "cluster", value_name = "NAME")]
    pub clusters: Vec<String>,
    /// How to print bundles on standard output.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,
    /// Write DIR/<cluster>.json (the served Bundle document) instead of printing, and
    /// print one summary line per cluster.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Args)]
pub struct SchemasArgs {
    /// Folder to write cluster.json, group.json, workload.json and overlay.json into.
    #[arg(long, default_value = "schemas", value_name = "DIR")]
    pub out: PathBuf,
}

/// Parses the command line, runs the subcommand and turns errors into exit code 2.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

pub fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Render(args) => render::run_render(&args),
        Command::Validate(args) => render::run_validate(&args),
        Command::Schemas(args) => render::run_schemas(&args),
        Command::Diff(args) => diff::run_diff(&args),
    }
}
