//! The command line: clap definitions, the validated settings built from them, and
//! one function per subcommand. `main` only calls [`main`].

mod diff;
mod hub;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use flotilla_core::limits::Limits;

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
    /// Follow a fleet repository, render every new commit and serve bundles to agents.
    Serve(ServeArgs),
    /// Write every bundle as static files under the API's paths (for nginx, a CDN or a USB stick).
    Publish(PublishArgs),
    /// Create, revoke and list the tokens agents and operators use with the hub.
    Token(TokenArgs),
    /// Run the edge agent: pull this cluster's bundle, verify, keep, apply, prune, report.
    Agent(flotilla_agent::cli::AgentArgs),
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
    pub fn location(&self) -> flotilla_hub::source::Location {
        flotilla_hub::source::Location {
            repo: self.repo.clone(),
            rev: self.rev.clone(),
            path: self.path.clone(),
            worktree: self.worktree,
        }
    }
}

/// The budgets of reading and rendering a fleet (docs/security.md): a fleet that
/// breaks one is reported with the file that did, and nothing past it is read or
/// rendered.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Budgets")]
pub struct LimitArgs {
    /// The largest fleet file read; larger ones are refused.
    #[arg(long, env = "FLOTILLA_MAX_FILE_BYTES", value_name = "BYTES",
          default_value_t = Limits::default().max_file_bytes)]
    pub max_file_bytes: u64,
    /// The most bytes read across all fleet files, every path counted (even paths
    /// whose content Git stores once).
    #[arg(long, env = "FLOTILLA_MAX_FLEET_BYTES", value_name = "BYTES",
          default_value_t = Limits::DEFAULT_MAX_FLEET_BYTES)]
    pub max_fleet_bytes: u64,
    /// The most instructions one template may run for one cluster.
    #[arg(long, env = "FLOTILLA_TEMPLATE_FUEL", value_name = "N",
          default_value_t = Limits::DEFAULT_TEMPLATE_FUEL)]
    pub template_fuel: u64,
    /// The most bytes one template may write for one cluster.
    #[arg(long = "max-template-output", env = "FLOTILLA_MAX_TEMPLATE_OUTPUT",
          value_name = "BYTES", default_value_t = Limits::DEFAULT_MAX_TEMPLATE_OUTPUT_BYTES)]
    pub max_template_output: usize,
    /// The largest rendered resource (canonical JSON); no patch may grow one past it.
    #[arg(long, env = "FLOTILLA_MAX_RESOURCE_BYTES", value_name = "BYTES",
          default_value_t = Limits::DEFAULT_MAX_RESOURCE_BYTES)]
    pub max_resource_bytes: usize,
    /// How long a whole render may take before it is abandoned and reported.
    #[arg(
        long,
        env = "FLOTILLA_RENDER_TIMEOUT",
        value_name = "DURATION",
        default_value = "30s"
    )]
    pub render_timeout: humantime::Duration,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            max_file_bytes: self.max_file_bytes,
            max_fleet_bytes: self.max_fleet_bytes,
            template_fuel: self.template_fuel,
            max_template_output_bytes: self.max_template_output,
            max_resource_bytes: self.max_resource_bytes,
            render_timeout: self.render_timeout.into(),
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
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct SchemasArgs {
    /// Folder to write cluster.json, group.json, workload.json and overlay.json into.
    #[arg(long, default_value = "schemas", value_name = "DIR")]
    pub out: PathBuf,
}

/// Where the hub keeps its state unless told otherwise.
pub const DEFAULT_STATE_DIR: &str = ".flotilla-state";

pub use flotilla_agent::logging::{LogFormat, init_logging};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The fleet repository: a local Git repository, a plain folder, or a remote URL
    /// (https://, ssh://, file://, user@host:path), which is mirrored into the state dir.
    #[arg(long, default_value = ".", value_name = "PATH|URL")]
    pub repo: String,
    /// The branch to follow (default: the repository's HEAD).
    #[arg(long, value_name = "BRANCH")]
    pub branch: Option<String>,
    /// The fleet root inside the repository.
    #[arg(
        long,
        default_value = "",
        value_name = "SUBDIR",
        hide_default_value = true
    )]
    pub path: String,
    /// Where the hub keeps bundles, status and tokens.
    #[arg(long, env = "FLOTILLA_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR", value_parser = hub::parse_listen)]
    pub listen: std::net::SocketAddr,
    /// How often to look for new commits (with 10% jitter); a local repository is also watched.
    #[arg(long, default_value = "15s", value_name = "DURATION")]
    pub poll_interval: humantime::Duration,
    /// How long an agent may stay silent before its cluster counts as offline.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub offline_after: humantime::Duration,
    /// The longest a `?wait=` long-poll is held.
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub max_wait: humantime::Duration,
    /// How many digests to keep per cluster for /v1/clusters/{cluster}/bundles/{digest}.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub history: usize,
    /// A file holding the secret of POST /v1/hooks/git (GitHub-style X-Hub-Signature-256).
    #[arg(long, value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Log as text lines or as JSON objects (one per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The folder to write v1/clusters/<cluster>/bundle and bundles/<digest> into.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it once (its last word on stdout); only its hash is kept.
    Create {
        /// The cluster whose bundles the token reads.
        #[arg(value_name = "CLUSTER")]
        cluster: Option<String>,
        /// Make an admin token (reads /v1/fleet and every bundle) instead.
        #[arg(long)]
        admin: bool,
        #[arg(long, env = "FLOTILLA_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
        state_dir: PathBuf,
    },
    /// Revoke a token by its id (from `token list`) or by the token itself.
    Revoke {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(long, env = "FLOTILLA_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
        state_dir: PathBuf,
    },
    /// List tokens: id, what they grant, when made, whether revoked.
    List {
        #[arg(long, env = "FLOTILLA_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
        state_dir: PathBuf,
    },
}

/// Parses the command line, runs the subcommand and turns errors into exit code 2.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        // A closed pipe (`flotilla render | head`) is the reader's choice, not an error.
        Err(err)
            if err.chain().any(|cause| {
                cause
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::from(EXIT_OK)
        }
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
        Command::Serve(args) => hub::run_serve(&args),
        Command::Publish(args) => hub::run_publish(&args),
        Command::Token(args) => hub::run_token(&args),
        Command::Agent(args) => flotilla_agent::cli::run_agent(&args).map(|()| EXIT_OK),
    }
}
