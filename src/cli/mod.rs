//! The command line: clap definitions, the validated settings built from them, and
//! one function per subcommand. `main` only calls [`main`].

mod diff;
mod hub;
mod init;
mod key;
mod manual;
mod memory;
pub mod remote;
mod render;
mod rollout;
mod source;
mod status;

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
    /// Make the key pair that signs served bundles (`key generate --out KEY`).
    Key(key::KeyArgs),
    /// Run the edge agent: pull this cluster's bundle, verify, keep, apply, prune, report.
    Agent(flotilla_agent::cli::AgentArgs),
    /// Show the fleet from a running hub (or its database): counts by state, render errors,
    /// rollouts, the clusters that need attention and the drifted ones (exit 0 none
    /// failed, 1 some failed, 2 could not ask).
    Status(status::StatusArgs),
    /// Watch and steer rollouts on a running hub (or its database): list, show, pause,
    /// resume, promote, abort.
    Rollout(rollout::RolloutArgs),
    /// Write a new fleet repository: a cluster, a group, a workload, an overlay, the
    /// JSON Schemas its files point at, and a CI job that validates and diffs.
    Init(init::InitArgs),
    /// Print a shell completion script for bash, zsh, fish, elvish or powershell.
    Completions(manual::CompletionsArgs),
    /// Print the man page (or write every page into a folder).
    Man(manual::ManArgs),
    /// Write the JSON Schemas of flotilla's kinds (Cluster, Group, Workload, Overlay).
    #[command(hide = true)]
    Schemas(SchemasArgs),
    /// Render one snapshot read from standard input (what `serve` runs for each commit).
    #[command(hide = true, name = "render-worker")]
    RenderWorker(RenderWorkerArgs),
}

#[derive(Debug, Args)]
pub struct RenderWorkerArgs {
    /// This process's data-segment limit (RLIMIT_DATA), in bytes.
    #[arg(long, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// The file of sealing headers kept in the hub's state folder.
    #[arg(long, value_name = "FILE")]
    pub sealing_headers: Option<std::path::PathBuf>,
}

/// Where the fleet is read from. Inside a Git repository, a commit is read (HEAD
/// unless --rev says otherwise), whether --repo is the repository's top or a folder
/// inside it; outside one, or with --worktree, the files on disk.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The fleet: a folder inside a Git repository (read at a commit) or in none (read
    /// from disk). `--repo fleet` and `--repo . --path fleet` read the same files.
    #[arg(long, default_value = ".", value_name = "PATH")]
    pub repo: PathBuf,
    /// The Git revision to read [default: HEAD].
    #[arg(long, value_name = "REV")]
    pub rev: Option<String>,
    /// The fleet root, relative to --repo.
    #[arg(
        long,
        default_value = "",
        value_name = "SUBDIR",
        hide_default_value = true
    )]
    pub path: String,
    /// Read the files on disk even inside a Git repository (uncommitted edits included).
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
    /// The most fuel one template may use for one cluster: one for each instruction
    /// and for each 64 bytes of data it builds or writes.
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
    /// The most memory a render may take: `serve` renders each commit in a process of
    /// its own under this cap, and one that needs more ends there and is reported as a
    /// failed render; `render`, `validate`, `diff` and `publish` cap their own process
    /// and stop with an error (fuel raised past what memory holds, say: the
    /// lines "still rendering FILE for cluster NAME" name the template). Bytes, or with KiB, MiB or
    /// GiB; 0 for no limit.
    #[arg(long, env = "FLOTILLA_RENDER_MEMORY", default_value = "4GiB", value_name = "SIZE",
          value_parser = parse_size)]
    pub render_memory: u64,
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

/// `--decryption-key`: the age identities the fleet's SOPS files are opened with.
#[derive(Debug, Args)]
pub struct DecryptionArgs {
    /// An age identity file (from `flotilla key generate --age` or `age-keygen`,
    /// mode 0600) to open the fleet's SOPS files with; repeat it while a key is
    /// rotated. `TENANT=FILE` gives a tenant identities of its own: that tenant's
    /// SOPS files then open only with them, and the others' never do. Without one, SOPS files are read as their ciphertext (with a
    /// warning) by render, validate and diff, and are render errors for serve and
    /// publish.
    #[arg(
        long = "decryption-key",
        env = "FLOTILLA_DECRYPTION_KEY",
        value_name = "FILE",
        value_delimiter = ','
    )]
    pub decryption_keys: Vec<PathBuf>,
}

impl DecryptionArgs {
    /// The keys, read; `None` when none was given.
    pub fn keys(
        &self,
    ) -> anyhow::Result<Option<std::sync::Arc<flotilla_render::sops::DecryptionKeys>>> {
        if self.decryption_keys.is_empty() {
            return Ok(None);
        }
        key::read_decryption_keys(&self.decryption_keys).map(|k| Some(std::sync::Arc::new(k)))
    }

    /// How `render`, `validate` and `diff` read SOPS files: opened with the keys
    /// given, else as ciphertext.
    pub fn review(&self) -> anyhow::Result<flotilla_render::sops::SopsKeys> {
        Ok(match self.keys()? {
            Some(keys) => flotilla_render::sops::SopsKeys::Open(keys),
            None => flotilla_render::sops::SopsKeys::Unopened,
        })
    }

    /// How `serve` and `publish` read them: always opened (with no key, each is an
    /// error).
    pub fn hub(&self) -> anyhow::Result<std::sync::Arc<flotilla_render::sops::DecryptionKeys>> {
        Ok(self.keys()?.unwrap_or_default())
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
    /// print one summary line per cluster; with --format flux, DIR/<cluster>.tar.gz;
    /// with --format manifestwork, DIR/<cluster>.yaml.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// What to write: flotilla's Bundle documents; per cluster, the layer of a Flux
    /// OCIRepository artifact (a tar.gz of YAML, Secrets as SOPS for the cluster's
    /// agentKey; needs --out); or Open Cluster Management ManifestWorks. See
    /// docs/formats.md.
    #[arg(long, value_enum, default_value_t = RenderFormat::Bundle)]
    pub format: RenderFormat,
    /// With --format manifestwork: the most bytes of manifests one ManifestWork holds,
    /// as OCM's webhook counts them (500KiB is OCM's default since 2023; older hubs
    /// accept 50KiB). A cluster's resources are split across several works.
    #[arg(long, default_value = "500KiB", value_name = "SIZE", value_parser = parse_bytes)]
    pub manifestwork_max_bytes: u64,
    /// With --format manifestwork: write Secrets in plain text into ManifestWorks
    /// (without it, a cluster with Secrets is refused).
    #[arg(long)]
    pub allow_plain_secrets: bool,
    #[command(flatten)]
    pub decryption: DecryptionArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// What `flotilla render` writes.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum RenderFormat {
    /// flotilla's Bundle documents.
    Bundle,
    /// The layer of a Flux OCIRepository artifact, per cluster.
    Flux,
    /// Open Cluster Management ManifestWorks.
    Manifestwork,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Count warnings as errors (a patch target that matches nothing, a group that
    /// selects no cluster, ...): exit 1 if there is any.
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub decryption: DecryptionArgs,
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
use flotilla_hub::store::{Database, ObjectsUrl};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The fleet: a folder inside a local Git repository (its commits are followed), a
    /// folder in none (watched on disk), or a remote URL (https://, ssh://, file://,
    /// user@host:path), which is mirrored into the state dir. A token in an https://
    /// URL is given to git by a credential helper, never in its arguments or the
    /// mirror's config (docs/scaling.md); FLOTILLA_REPO keeps it off the command line.
    #[arg(
        long,
        env = "FLOTILLA_REPO",
        default_value = ".",
        value_name = "PATH|URL"
    )]
    pub repo: String,
    /// The branch to follow [default: the repository's HEAD].
    #[arg(long, value_name = "BRANCH")]
    pub branch: Option<String>,
    /// The fleet root, relative to --repo.
    #[arg(
        long,
        default_value = "",
        value_name = "SUBDIR",
        hide_default_value = true
    )]
    pub path: String,
    /// Serve the files on disk even inside a Git repository (rendered again whenever
    /// they change, uncommitted edits included).
    #[arg(long, conflicts_with = "branch")]
    pub worktree: bool,
    /// Where the hub keeps bundles, status and tokens (created at the first start).
    #[arg(long, env = "FLOTILLA_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Where the bundles' objects are kept: the state dir by default,
    /// file:///path (a folder several hubs share) or s3://bucket/prefix (S3 or an
    /// S3-compatible store; region, endpoint and credentials from AWS_REGION,
    /// AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "FLOTILLA_OBJECTS", value_name = "URL", value_parser = parse_objects)]
    pub objects: Option<ObjectsUrl>,
    #[command(flatten)]
    pub s3_sse: S3SseArgs,
    /// Also push what is served to this repository of an OCI registry, on every change,
    /// as `publish --oci` does: REGISTRY/REPOSITORY (agents may then use --server
    /// oci://REGISTRY/REPOSITORY). Credentials as for `publish --oci`.
    #[arg(long, env = "FLOTILLA_OCI", value_name = "REGISTRY/REPOSITORY")]
    pub oci: Option<String>,
    #[command(flatten)]
    pub oci_access: OciArgs,
    /// The address to listen on: loopback by default; the container image sets
    /// FLOTILLA_LISTEN=0.0.0.0:8080.
    #[arg(long, env = "FLOTILLA_LISTEN", default_value = "127.0.0.1:8080", value_name = "ADDR", value_parser = hub::parse_listen)]
    pub listen: std::net::SocketAddr,
    /// How often to look for new commits (with 10% jitter); a local repository is also watched.
    #[arg(long, default_value = "15s", value_name = "DURATION")]
    pub poll_interval: humantime::Duration,
    /// How long an agent may stay silent before its cluster counts as offline.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub offline_after: humantime::Duration,
    /// The longest a `?wait=` long-poll is held (keep it under --offline-after: a
    /// held poll counts as seen when it begins and when it is answered).
    #[arg(long, default_value = "4m", value_name = "DURATION")]
    pub max_wait: humantime::Duration,
    /// How many digests to keep per cluster for /v1/clusters/{cluster}/bundles/{digest}.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub history: usize,
    /// How long to keep a rollout that ended (its waves, clusters and events) for
    /// `flotilla rollout` and the web page; the latest rollout of each policy, and
    /// those of the revision served, are kept whatever their age.
    #[arg(long, default_value = "90d", value_name = "DURATION")]
    pub keep_rollouts: humantime::Duration,
    /// A file holding the secret of POST /v1/hooks/git (GitHub-style X-Hub-Signature-256).
    #[arg(long, value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key for --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM) on every path but the
    /// health, metrics and webhook ones; a cluster's paths need a certificate whose DNS
    /// names include the cluster (needs --tls-cert).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// How long a client has to finish the TLS handshake and send a request's headers
    /// (and an HTTP/1.1 connection may wait for its next request).
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub header_timeout: humantime::Duration,
    /// How long a connection may stay open with no request in flight (a held long-poll
    /// is a request in flight: only --max-wait ends it).
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub idle_timeout: humantime::Duration,
    /// The most connections held at once [default: the open-file limit, raised to its
    /// hard limit at start, less a quarter of it, at most 1,024, for the hub's own
    /// files]. At the cap, a connection still sending a request's body after a second,
    /// or else the one idle the longest, is closed to make room.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// How long a webhook's body may take to arrive (its HMAC covers the body, so it
    /// is read before the hub knows who sent it); a slower one is answered 408 and its
    /// connection closed.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub webhook_body_timeout: humantime::Duration,
    /// How many webhook bodies are read at once; one more is answered 503 at once.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_webhook_bodies: usize,
    /// How many long-polls of one cluster are held at once; a new one ends the oldest
    /// (answered 304, as when its wait ends).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub max_polls_per_cluster: usize,
    /// Sign every served bundle with this private key (from `flotilla key generate`);
    /// agents with `--trust-key` accept only bundles it signed.
    #[arg(long, env = "FLOTILLA_SIGNING_KEY", value_name = "KEY")]
    pub signing_key: Option<PathBuf>,
    /// Log as text lines or as JSON objects (one per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub decryption: DecryptionArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// The most memory the hub may spend keeping its last render, so that the next
    /// commit renders only the clusters and workloads it changes. A heavier render is
    /// not kept, and every commit is rendered in full; 0 keeps none. See
    /// docs/scaling.md for what renders weigh.
    #[arg(long, env = "FLOTILLA_KEEP_RENDER", default_value = "256MiB", value_name = "SIZE",
          value_parser = parse_size, help_heading = "Budgets")]
    pub keep_render: u64,
    /// Render on a thread of the hub's own instead of a child process: no memory limit,
    /// and a render that exhausts memory takes the hub down (for debugging).
    #[arg(long, help_heading = "Budgets")]
    pub render_in_process: bool,
}

/// A memory budget: [`parse_bytes`], at least 64 MiB, or 0 (none).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text)?;
    if bytes != 0 && bytes < 64 << 20 {
        return Err(format!(
            "{:?} is less than 64MiB, too little to render even a small fleet (0 means none)",
            text.trim()
        ));
    }
    Ok(bytes)
}

/// A size in bytes: a number, or a number with KiB, MiB or GiB (or K, M, G).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (bytes, or a number with KiB, MiB or GiB)"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use KiB, MiB or GiB (or none for bytes)"
            ));
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The folder to write v1/clusters/<cluster>/bundle and bundles/<digest> into.
    /// It is locked while publish writes: a second publish to it is refused.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present_any = ["objects", "oci"],
        conflicts_with_all = ["objects", "oci"]
    )]
    pub out: Option<PathBuf>,
    /// Write the same layout into an object store instead of --out:
    /// s3://bucket/prefix (for a CDN to front; region, endpoint and credentials from
    /// the AWS environment variables) or file:///path.
    #[arg(long, value_name = "URL", value_parser = parse_objects)]
    pub objects: Option<ObjectsUrl>,
    #[command(flatten)]
    pub s3_sse: S3SseArgs,
    /// Push each cluster's bundle to this repository of an OCI registry instead, as
    /// an artifact tagged with the cluster's name: REGISTRY/REPOSITORY (like
    /// registry.example:5000/fleet/bundles). Credentials come from the Docker
    /// configuration file ($DOCKER_CONFIG/config.json or ~/.docker/config.json) or
    /// --oci-username and --oci-password-file.
    #[arg(long, value_name = "REGISTRY/REPOSITORY", conflicts_with = "objects")]
    pub oci: Option<String>,
    #[command(flatten)]
    pub oci_access: OciArgs,
    /// What --oci pushes: bundle (each cluster's bundle, for flotilla's agent), or
    /// flux (that, and each cluster's Flux OCIRepository artifact under the tag
    /// <cluster>-flux: a tar.gz of YAML, Secrets as SOPS for the cluster's
    /// agentKey; not with --state-dir). See docs/oci.md.
    #[arg(long, value_enum, default_value_t = PublishFormat::Bundle, requires = "oci")]
    pub format: PublishFormat,
    /// With --format flux: the source the Flux artifacts name
    /// (org.opencontainers.image.source), such as the fleet repository's URL.
    #[arg(long, value_name = "URL")]
    pub flux_source: Option<String>,
    /// The hub's state dir: publish what the hub serves each cluster (so rollouts
    /// hold on the mirror) instead of HEAD's render for every cluster at once.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The hub's database, when it is not the file in --state-dir (the objects are
    /// still read from --state-dir).
    #[arg(long, env = "FLOTILLA_DATABASE", value_name = "URL", requires = "state_dir", value_parser = parse_database)]
    pub database: Option<Database>,
    /// Where the hub keeps its objects (its `serve --objects`), when not in
    /// --state-dir: the served bundles are read from there.
    #[arg(long, env = "FLOTILLA_OBJECTS", value_name = "URL", requires = "state_dir", value_parser = parse_objects)]
    pub hub_objects: Option<ObjectsUrl>,
    /// Sign each cluster's current bundle with this private key (from `flotilla key
    /// generate`), continuing the sequence of the previous output in --out when its
    /// signature verifies with this key (otherwise it is ignored, with a warning).
    #[arg(long, env = "FLOTILLA_SIGNING_KEY", value_name = "KEY")]
    pub signing_key: Option<PathBuf>,
    /// Beside each cluster's bundle, write deltas to it from the last N bundles this
    /// output gave the cluster (and from the current one), at
    /// v1/clusters/<cluster>/deltas/<digest>: an agent polling a static mirror then
    /// fetches what changed, not the whole bundle; 0 writes none (and removes them:
    /// the folder then holds only the current bundle's sha256). Not for --oci, whose
    /// agents take each bundle from the registry whole
    #[arg(long, value_name = "N", default_value_t = 3, conflicts_with = "oci")]
    pub deltas: usize,
    #[command(flatten)]
    pub decryption: DecryptionArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// What `publish --oci` pushes.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum PublishFormat {
    /// Each cluster's bundle, for flotilla's agent.
    Bundle,
    /// Each cluster's bundle and its Flux OCIRepository artifact.
    Flux,
}

/// How `publish --oci` reaches the registry.
#[derive(Debug, Args)]
pub struct OciArgs {
    /// The registry's user name (with --oci-password-file), instead of the Docker
    /// configuration file's credentials.
    #[arg(long, value_name = "USER", requires = "oci_password_file")]
    pub oci_username: Option<String>,
    /// A file holding the password or token of --oci-username (never on the command line).
    #[arg(long, value_name = "FILE", requires = "oci_username")]
    pub oci_password_file: Option<PathBuf>,
    /// Speak plain HTTP to the registry: only for a registry on this machine
    /// (localhost, 127.0.0.1, ::1).
    #[arg(long, requires = "oci")]
    pub oci_plain_http: bool,
    /// A PEM file of CA certificates to trust for the registry besides the system's
    /// trust store (which honours SSL_CERT_FILE and SSL_CERT_DIR).
    #[arg(long, value_name = "PEM", requires = "oci")]
    pub ca_file: Option<PathBuf>,
}

/// `--s3-sse`, for `serve` and `publish` with `--objects s3://…`.
#[derive(Debug, Args)]
pub struct S3SseArgs {
    /// Server-side encryption asked of S3 for every object written with --objects
    /// s3://…: none (no header: for S3-compatible stores that refuse it), aes256
    /// (SSE-S3) or kms:KEY (SSE-KMS with that key id or ARN) [default: as
    /// AWS_SERVER_SIDE_ENCRYPTION says, else none]. Checked at start by writing a
    /// small object with it.
    #[arg(long = "s3-sse", value_name = "none|aes256|kms:KEY")]
    pub sse: Option<flotilla_hub::store::objects::S3Sse>,
}

impl S3SseArgs {
    /// `objects` with the chosen encryption; an error when one is chosen for objects
    /// that are not in S3.
    pub fn apply(&self, objects: Option<ObjectsUrl>) -> anyhow::Result<Option<ObjectsUrl>> {
        match (&self.sse, objects) {
            (None, objects) => Ok(objects),
            (Some(sse), Some(ObjectsUrl::S3(location))) => {
                Ok(Some(ObjectsUrl::S3(location.with_sse(sse))))
            }
            (Some(_), _) => anyhow::bail!("--s3-sse applies to --objects s3://… only"),
        }
    }
}

/// `--database URL`, for the commands that open the hub's store.
#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// Where the hub keeps tokens, status and rollouts: the SQLite file flotilla.db in
    /// the state dir by default, sqlite:///path/to/file.db, or
    /// postgres://user:password@host:port/database, a server several hubs share.
    #[arg(long, env = "FLOTILLA_DATABASE", value_name = "URL", value_parser = parse_database)]
    pub database: Option<Database>,
}

impl DatabaseArgs {
    pub fn database(&self) -> Database {
        self.database.clone().unwrap_or(Database::StateDir)
    }
}

fn parse_role(text: &str) -> Result<flotilla_core::access::Role, String> {
    flotilla_core::access::Role::parse(text).map_err(|err| err.to_string())
}

fn parse_database(url: &str) -> Result<Database, String> {
    url.parse()
}

fn parse_objects(url: &str) -> Result<ObjectsUrl, String> {
    url.parse()
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it once, alone on stdout (`> FILE` keeps just the token);
    /// only its hash is kept. A cluster's token (give CLUSTER) is its agent's; a
    /// person's token has a role (--role).
    Create {
        /// The cluster whose bundles the token reads.
        #[arg(value_name = "CLUSTER")]
        cluster: Option<String>,
        /// A person's token with this role: viewer (reads /v1/fleet, /v1/rollouts and
        /// the web page), operator (also pauses, resumes, promotes and aborts rollouts)
        /// or admin (also reads every bundle).
        #[arg(long, value_name = "ROLE", value_parser = parse_role)]
        role: Option<flotilla_core::access::Role>,
        /// Limit a viewer's or operator's token to one tenant: it sees only the
        /// tenant's workloads and the clusters they target, and steers only rollouts
        /// that change nothing else.
        #[arg(long, value_name = "TENANT", requires = "role")]
        tenant: Option<String>,
        /// Make an admin token; the same as --role admin.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke a token by its id (from `token list`) or by the token itself.
    Revoke {
        /// The token's id, as `token list` shows it, or the token itself (flt_…).
        #[arg(value_name = "ID")]
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List tokens: id, what they grant, when made, whether revoked.
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// The hub's store, for the `token` commands.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The hub's state dir (the one `flotilla serve --state-dir` uses; the hub picks up
    /// token changes within a second).
    #[arg(long, env = "FLOTILLA_STATE_DIR", default_value = DEFAULT_STATE_DIR, value_name = "DIR")]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Create the state dir when it does not exist yet (before the hub's first start).
    #[arg(long)]
    pub init: bool,
}

/// Parses the command line, runs the subcommand and turns errors into exit code 2.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        // A closed pipe (`flotilla render | head`) is the reader's choice, not an error,
        // whether it was met writing text or JSON.
        Err(err)
            if err.chain().any(|cause| {
                let kind = cause
                    .downcast_ref::<std::io::Error>()
                    .map(std::io::Error::kind)
                    .or_else(|| {
                        cause
                            .downcast_ref::<serde_json::Error>()
                            .and_then(serde_json::Error::io_error_kind)
                    });
                kind == Some(std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::from(EXIT_OK)
        }
        Err(err) => {
            eprintln!("error: {}", flotilla_agent::logging::error_line(&err));
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
        Command::Key(args) => key::run_key(&args),
        Command::Agent(args) => flotilla_agent::cli::run_agent(&args).map(|()| EXIT_OK),
        Command::Rollout(args) => rollout::run_rollout(&args),
        Command::Status(args) => status::run_status(&args),
        Command::Init(args) => init::run_init(&args),
        Command::Completions(args) => manual::run_completions(&args),
        Command::Man(args) => manual::run_man(&args),
        Command::RenderWorker(args) => {
            flotilla_hub::render_worker::run_worker(
                args.memory_limit,
                args.sealing_headers.as_deref(),
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )?;
            Ok(EXIT_OK)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn sizes_read_with_or_without_a_unit() {
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("768MiB"), Ok(768 << 20));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        // 0: none (no cap on a render's memory, no render kept).
        assert_eq!(parse_size("0"), Ok(0));
        assert!(
            parse_size("1 TB")
                .expect_err("unknown unit")
                .contains("unknown unit")
        );
        assert!(
            parse_size("GiB")
                .expect_err("no number")
                .contains("is not a size")
        );
        assert!(
            parse_size("1MiB")
                .expect_err("too small")
                .contains("less than 64MiB")
        );
        assert!(
            parse_size("99999999999G")
                .expect_err("overflow")
                .contains("too large")
        );
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `--help` explains every flag and positional argument of every subcommand.
    #[test]
    fn every_argument_of_every_subcommand_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    let name = match arg.get_long() {
                        Some(long) => format!("--{long}"),
                        None => id.to_uppercase(),
                    };
                    missing.push(format!("{path} {name}"));
                }
            }
            for sub in command.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(format!("{sub_path} (the subcommand itself)"));
                }
                walk(sub, &sub_path, missing);
            }
        }
        let command = Cli::command();
        let mut missing = Vec::new();
        walk(&command, "flotilla", &mut missing);
        assert!(
            missing.is_empty(),
            "without help text (add a doc comment):\n{}",
            missing.join("\n")
        );
        // The walk reaches nested subcommands and positional arguments.
        let token = command.find_subcommand("token").expect("token");
        let revoke = token.find_subcommand("revoke").expect("revoke");
        assert!(revoke.get_arguments().any(|a| a.get_id() == "id"));
    }
}
