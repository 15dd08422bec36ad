//! Following the repository: find out whether there is something new to render,
//! render it off the request path, and install it when it renders cleanly.
//!
//! A local repository is watched with `notify` (HEAD, refs, packed-refs), so a commit
//! is seen within milliseconds; a plain folder is watched recursively; a remote URL is
//! mirrored into the state directory and fetched every poll interval (with jitter) or
//! when the webhook says so. A slow poll backs up the watchers in every case.
//!
//! **Force-push** (several hubs on one database). A hub records a render only when its
//! commit descends from the recorded one, so a hub that is behind never moves the
//! fleet back. A tip that does not descend from it — the branch was force-pushed, or
//! this hub is behind — is rendered, its objects written, and counted: each hub
//! records in the database the tip it sees and how many of its polls in a row saw it
//! (a poll that cannot read the repository neither counts nor resets; another tip
//! starts again at one). Once every live hub (see `crate::peers`) has seen the same
//! tip for [`FORCE_PUSH_POLLS`] polls in a row, the lease holder records it (in the
//! one transaction that checks the recorded commit did not move meanwhile) and every
//! hub serves it. Each step is logged, and `GET /v1/fleet` shows the pending tip with
//! every live hub's count. A hub alone on its database takes a force-push at its first
//! poll, as any other commit: nothing can be behind it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher as _};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot, watch};

use super::HubError;
use super::fleet::{ForcePush, ForcePushHub, InstallError};
use crate::recorder::Shared;
use crate::source::follow::{self as git, RepoKind, Tip};
use crate::source::{BlobTexts, SourceError, from_folder_within};
use flotilla_core::bundle::Digest;
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::sops::SopsKeys;
use flotilla_render::{RenderOptions, RenderOutput, render_since, render_with};

use crate::render_worker::{
    KeptHeaders, RenderSession, RenderWorker, Rendered, SEALING_HEADERS_FILE,
};

/// How long a `git clone` or `git fetch` may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);

/// How long past its own deadline a render is waited for before the hub gives up on
/// it. The render stops itself at its deadline between units of work, so this only
/// matters when one unit runs long.
const RENDER_GRACE: Duration = Duration::from_secs(5);

/// The file in the state dir that says a render is under way. One left behind by a
/// render in the hub's own process means the hub died while rendering (killed, out of
/// memory, a crash); a commit the hub died on twice is not rendered again, so that a
/// commit that kills the hub cannot keep it in a crash loop. One left behind by a
/// render in a render process does not count: that render cannot take the hub down
/// (its memory is capped, its crashes are its own and reported as render errors), so
/// the hub was stopped by something else (an operator, a reboot) and renders the
/// commit again.
const RENDER_MARKER: &str = "render-in-progress.json";
/// How many times the hub may die rendering one commit before it stops trying.
const RENDER_ATTEMPTS: u32 = 2;

#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct RenderMarker {
    /// The commit (or, for a folder, a digest of its files) being rendered.
    source: String,
    attempts: u32,
    /// Rendered in a render process: a marker left behind is not counted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    in_child: bool,
}

/// How many polls in a row every live hub must see a force-pushed tip before it is
/// recorded.
pub const FORCE_PUSH_POLLS: i64 = 3;

/// The default of [`crate::HubConfig::keep_render`]: 256 MiB, six times what the
/// render of 10,000 clusters with one per-cluster template a workload weighs (41
/// MiB), about half of one where every manifest is a per-cluster template (439 MiB).
pub const DEFAULT_KEEP_RENDER: u64 = 256 * 1024 * 1024;

/// About what a render weighs in memory: each distinct resource (its canonical
/// bytes, its identity and their boxes) and each bundle's list of them.
fn weight(output: &RenderOutput) -> u64 {
    let mut seen: std::collections::HashSet<*const flotilla_core::bundle::Resource> =
        std::collections::HashSet::new();
    // Identities are shared too (every cluster's copy of a per-cluster template's
    // resource has the same one).
    let mut keys: std::collections::HashSet<*const flotilla_core::bundle::ResourceKey> =
        std::collections::HashSet::new();
    let mut bytes = 0u64;
    for bundle in output.bundles.values() {
        bytes += 128 + 8 * bundle.resources.len() as u64;
        for resource in &bundle.resources {
            if seen.insert(Arc::as_ptr(resource)) {
                bytes += 48 + resource.canonical.len() as u64;
                let key = &resource.key;
                if keys.insert(Arc::as_ptr(key)) {
                    // The Arc's box and counts, then the one buffer of its four parts.
                    bytes += (std::mem::size_of::<flotilla_core::bundle::ResourceKey>() + 16)
                        as u64
                        + (key.group().len()
                            + key.kind().len()
                            + key.namespace().len()
                            + key.name().len()) as u64;
                }
            }
        }
    }
    // Each cluster's provenance (a workload per resource, a digest and a name per
    // workload: lists that clusters share are counted once), its memberships and
    // labels.
    let mut lists: std::collections::HashSet<*const u8> = std::collections::HashSet::new();
    for (name, input) in &output.provenance.inputs.clusters {
        bytes += 128 + 2 * name.len() as u64;
        if lists.insert(input.workloads.as_ptr().cast()) {
            bytes += 48 * input.workloads.len() as u64;
        }
    }
    for found in output.provenance.clusters.values() {
        if lists.insert(found.patch_matches.as_ptr().cast()) {
            bytes += 48 * found.patch_matches.len() as u64;
        }
        if lists.insert(found.resource_workloads.as_ptr().cast()) {
            bytes += 4 * found.resource_workloads.len() as u64;
        }
        let weight = |w: &flotilla_core::diagnostic::Diagnostic| {
            160 + (w.message.len()
                + w.file.as_ref().map_or(0, String::len)
                + w.workload.as_ref().map_or(0, String::len)) as u64
        };
        if lists.insert(found.warnings.as_ptr().cast()) {
            bytes += found.warnings.iter().map(weight).sum::<u64>();
        }
        if lists.insert(found.release_warnings.as_ptr().cast()) {
            bytes += found
                .release_warnings
                .iter()
                .map(|(_, w)| 8 + weight(w))
                .sum::<u64>();
        }
    }
    bytes += output.parsed.as_ref().map_or(0, |p| p.weight());
    for (name, groups) in &output.memberships {
        bytes += 64 + name.len() as u64 + groups.iter().map(|g| 32 + g.len() as u64).sum::<u64>();
    }
    for labels in output.labels.values() {
        bytes += labels
            .iter()
            .map(|(k, v)| 64 + (k.len() + v.len()) as u64)
            .sum::<u64>();
    }
    bytes
}

/// A clean render of a tip that does not descend from the recorded commit, waiting
/// for every live hub to see that tip for [`FORCE_PUSH_POLLS`] polls in a row.
struct PendingForcePush {
    output: Arc<RenderOutput>,
    duration: Duration,
    forced: bool,
    /// This hub's polls in a row that saw the tip.
    polls: i64,
}

/// Where the fleet comes from, as given on the command line.
#[derive(Clone, Debug, Default)]
pub struct SourceSpec {
    /// A path (Git repository or plain folder) or a remote URL.
    pub repo: String,
    /// The branch to follow; `None` follows `HEAD`.
    pub branch: Option<String>,
    /// The fleet root inside the repository.
    pub path: String,
    /// Serve the files on disk even inside a Git work tree.
    pub worktree: bool,
}

#[derive(Clone, Debug)]
enum Origin {
    Local {
        path: PathBuf,
        kind: RepoKind,
        subpath: String,
    },
    Remote {
        url: String,
        mirror: PathBuf,
    },
}

impl Origin {
    fn of(spec: &SourceSpec, state_dir: &Path) -> Origin {
        if git::is_remote(&spec.repo) {
            return Origin::Remote {
                url: spec.repo.clone(),
                mirror: state_dir.join("repository.git"),
            };
        }
        let path = PathBuf::from(&spec.repo);
        match git::local_source(&path, &spec.path, spec.worktree) {
            Ok(local) => Origin::Local {
                path: local.root,
                kind: local.kind,
                subpath: local.subpath,
            },
            // A repository Git refuses is followed as a repository all the same: every
            // look reports why it cannot be read, instead of serving its files.
            Err(SourceError::NotOwned { .. }) => Origin::Local {
                path,
                kind: RepoKind::Git,
                subpath: spec.path.clone(),
            },
            // A path that does not exist yet is taken for a folder; reading it reports
            // why it cannot be read, and the follower tries again on the next poll.
            Err(_) => Origin::Local {
                path,
                kind: RepoKind::Folder,
                subpath: spec.path.clone(),
            },
        }
    }

    /// The fleet root inside what is followed.
    fn subpath<'a>(&'a self, spec: &'a SourceSpec) -> &'a str {
        match self {
            Origin::Local { subpath, .. } => subpath,
            Origin::Remote { .. } => &spec.path,
        }
    }
}

/// How the follower renders.
pub struct RenderSetup {
    pub limits: Limits,
    /// Render in a child process (see [`crate::render_worker`]); on a thread without.
    pub worker: Option<RenderWorker>,
    /// The largest last render kept to render the next commit since.
    pub keep_render: u64,
    /// The identities SOPS files are opened with.
    pub decryption: Arc<flotilla_render::sops::DecryptionKeys>,
}

pub struct Follower {
    shared: Arc<Shared>,
    origin: Origin,
    spec: SourceSpec,
    limits: Limits,
    /// Renders in a child process under a memory limit, kept between commits; on a
    /// thread of the hub's own without one.
    render_session: Option<RenderSession>,
    state_dir: PathBuf,
    poll_interval: Duration,
    last_commit: Option<String>,
    last_files: Option<BTreeMap<String, Arc<str>>>,
    /// The texts of the last commit read, by blob id: reading the next one reads only
    /// the files it changed.
    blob_texts: BlobTexts,
    last_source_error: Option<String>,
    /// Why the last install failed, until one succeeds (logged once per cause).
    last_install_error: Option<String>,
    pending: Option<PendingForcePush>,
    /// The last clean render, if it weighs at most `keep_render`: the next commit
    /// renders only what changed since.
    last_output: Option<Arc<RenderOutput>>,
    keep_render: u64,
    /// The store's Helm seed, read before the first render.
    helm_seed: Option<[u8; 32]>,
    decryption: Arc<flotilla_render::sops::DecryptionKeys>,
    /// The sealing headers kept in the state folder, for renders on the hub's own
    /// thread (a render process keeps its own).
    sealing_headers: Arc<std::sync::Mutex<KeptHeaders>>,
}

impl Follower {
    pub fn new(
        shared: Arc<Shared>,
        spec: SourceSpec,
        state_dir: &Path,
        poll_interval: Duration,
        setup: RenderSetup,
    ) -> Follower {
        let RenderSetup {
            limits,
            worker,
            keep_render,
            decryption,
        } = setup;
        Follower {
            origin: Origin::of(&spec, state_dir),
            shared,
            spec,
            limits,
            render_session: worker.map(|w| {
                let mut session = RenderSession::new(w, decryption.clone());
                session.keep_sealing_headers(state_dir.join(SEALING_HEADERS_FILE));
                session
            }),
            sealing_headers: Arc::new(std::sync::Mutex::new(KeptHeaders::in_state_dir(state_dir))),
            state_dir: state_dir.to_path_buf(),
            poll_interval,
            last_commit: None,
            last_files: None,
            blob_texts: BlobTexts::default(),
            last_source_error: None,
            last_install_error: None,
            pending: None,
            last_output: None,
            keep_render,
            helm_seed: None,
            decryption,
        }
    }

    /// Runs until shutdown.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let _watcher = self.watch();
        let settle = match &self.origin {
            Origin::Local {
                kind: RepoKind::Folder,
                ..
            } => Duration::from_millis(100),
            _ => Duration::from_millis(20),
        };
        loop {
            self.check_until(&mut shutdown).await;
            if *shutdown.borrow() {
                break;
            }
            self.shared.recorder.set_ready();
            let delay = self
                .poll_interval
                .mul_f64(rand::random_range(0.9..1.1))
                .max(Duration::from_millis(10));
            let next_poll = tokio::time::Instant::now() + delay;
            loop {
                // A force-pushed tip this hub has seen enough: the other hubs' counts
                // are looked at between polls too, so the holder records it as soon
                // as the last hub's poll agrees.
                let waiting = self
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.polls >= FORCE_PUSH_POLLS);
                tokio::select! {
                    _ = self.shared.look_now.notified() => {
                        // Let a burst of file-system events (a commit touches several
                        // files) settle before reading.
                        tokio::time::sleep(settle).await;
                        break;
                    }
                    _ = tokio::time::sleep_until(next_poll) => break,
                    _ = tokio::time::sleep(self.shared.settings.peers.sync_interval), if waiting => {
                        self.weigh_force_push(false).await;
                    }
                    _ = shutdown.changed() => return,
                }
            }
            if *shutdown.borrow() {
                break;
            }
        }
    }

    /// Sets up the file-system watcher for a local source. Without one (it can fail,
    /// e.g. when inotify watches run out) the poll still finds new commits.
    fn watch(&self) -> Option<notify::RecommendedWatcher> {
        let Origin::Local { path, kind, .. } = &self.origin else {
            return None;
        };
        let root = path.canonicalize().unwrap_or_else(|_| path.clone());
        let paths = match kind {
            RepoKind::Git => git::watch_paths(path).ok()?,
            RepoKind::Folder => vec![(root.clone(), true)],
        };
        let look_now: Arc<Notify> = self.shared.look_now.clone();
        let folder_root = (*kind == RepoKind::Folder).then_some(root);
        let handler = move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if event.kind.is_access() {
                return;
            }
            if let Some(root) = &folder_root
                && !event.paths.is_empty()
                && event.paths.iter().all(|p| hidden_below(root, p))
            {
                return;
            }
            look_now.notify_one();
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(watcher) => watcher,
            Err(err) => {
                tracing::warn!(
                    "cannot watch {} for changes ({err}); polling every {}",
                    path.display(),
                    humantime::format_duration(self.poll_interval)
                );
                return None;
            }
        };
        for (watched, recursive) in paths {
            let mode = if recursive {
                RecursiveMode::Recursive
            } else {
                RecursiveMode::NonRecursive
            };
            if let Err(err) = watcher.watch(&watched, mode) {
                tracing::warn!(
                    "cannot watch {} for changes ({err}); polling every {}",
                    watched.display(),
                    humantime::format_duration(self.poll_interval)
                );
            }
        }
        Some(watcher)
    }

    /// Looks once: reads what is new, renders it and installs it if it is clean.
    pub async fn check(&mut self) {
        let (_keep, mut never) = watch::channel(false);
        self.check_until(&mut never).await;
    }

    /// [`Follower::check`], given up at once when `shutdown` changes.
    async fn check_until(&mut self, shutdown: &mut watch::Receiver<bool>) {
        self.look_until(shutdown).await;
        self.describe_served().await;
    }

    /// Reads what is new, renders it and installs it if it is clean.
    async fn look_until(&mut self, shutdown: &mut watch::Receiver<bool>) {
        if self.shared.recorder.lease().take_render_again() {
            // This hub just took the rollout lease: record HEAD if the last holder
            // did not get to it.
            self.last_commit = None;
            self.last_files = None;
        }
        let (snapshot, forced) = match self.next_snapshot().await {
            Ok(Some(found)) => found,
            Ok(None) => {
                // The same tip as the last poll: one more poll that saw it.
                if let Some(pending) = &mut self.pending {
                    pending.polls += 1;
                    self.weigh_force_push(true).await;
                }
                return;
            }
            Err(err) => {
                let message = err.to_string();
                if self.last_source_error.as_deref() != Some(&message) {
                    tracing::error!("cannot read the fleet repository: {message}");
                }
                self.last_source_error = Some(message.clone());
                self.shared
                    .recorder
                    .update_render_status(|r| r.source_error = Some(message));
                return;
            }
        };
        if self.last_source_error.take().is_some() {
            tracing::info!("the fleet repository can be read again");
        }
        self.shared
            .recorder
            .update_render_status(|r| r.source_error = None);
        let revision = snapshot.revision.clone();
        match self.render_and_install(snapshot, forced, shutdown).await {
            Ok(()) => {
                // Installed (which clears the error shown), or not installable for a
                // reason the render status shows (render errors, a force-push).
                let shown = self.shared.view.install_failing();
                if !shown && self.last_install_error.take().is_some() {
                    tracing::info!(revision = %revision, "the new bundles are installed again");
                }
            }
            Err(err) => {
                self.show_install_error(&revision, &err);
                // Try the same commit again next time.
                self.last_commit = None;
                self.last_files = None;
            }
        }
    }

    /// Shows in the render status (`/v1/fleet`, the page, `/readyz`) that installing
    /// `revision` failed, and why; logged once per cause. A race with another writer
    /// is only logged.
    fn show_install_error(&mut self, revision: &str, err: &HubError) {
        if err.is_another_writer() {
            // Another hub wrote first; nothing is wrong with this one.
            tracing::warn!(revision = %revision, "the new bundles are not installed: {err}");
            return;
        }
        let message = err.to_string();
        if self.last_install_error.as_deref() != Some(&message) {
            tracing::error!(revision = %revision, "cannot install the new bundles: {message}");
        }
        self.last_install_error = Some(message.clone());
        let now_ms = self.shared.settings.clock.now_ms();
        self.shared.recorder.update_render_status(|r| {
            r.install_error = Some(InstallError::after(
                r.install_error.as_ref(),
                revision,
                message,
                now_ms,
            ));
        });
    }

    async fn render_and_install(
        &mut self,
        snapshot: FleetSnapshot,
        forced: bool,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), HubError> {
        let revision = snapshot.revision.clone();
        // Charts' generated values come from the store's seed, never the public one:
        // without it the commit is not rendered now (it is tried again).
        let seed = match self.helm_seed {
            Some(seed) => seed,
            None => {
                let seed = self.shared.recorder.helm_seed().await?;
                if let Some(session) = &mut self.render_session {
                    session.set_helm_seed(seed);
                }
                self.helm_seed = Some(seed);
                seed
            }
        };
        let Some(marker) = self.mark_attempt(&snapshot) else {
            return Ok(());
        };
        let rendered = self.render_off_runtime(snapshot, seed, shutdown).await;
        // Whatever the outcome, the hub did not die rendering it.
        let _ = std::fs::remove_file(&marker);
        let (output, duration) = match self.finished(rendered) {
            Ok(done) => done,
            Err(None) => return Ok(()),
            Err(Some((message, waited))) => {
                // Whatever went wrong may have to do with rendering since the kept
                // render: the next commit is rendered in full.
                self.last_output = None;
                let output = failed_output(&revision, message);
                self.shared.recorder.record_failed_render(&output, waited);
                return Ok(());
            }
        };
        if !output.is_clean() {
            self.shared.recorder.record_failed_render(&output, duration);
            return Ok(());
        }
        self.install_and_keep(output, duration, forced).await
    }

    /// Counts an attempt at rendering this snapshot in the state dir's marker, which a
    /// hub that dies rendering it leaves behind. Returns the marker's path, or `None`
    /// (and records why) when the hub already stopped too often rendering it.
    fn mark_attempt(&self, snapshot: &FleetSnapshot) -> Option<PathBuf> {
        let source = render_source(snapshot);
        let marker = self.state_dir.join(RENDER_MARKER);
        let attempts = read_marker(&marker)
            .filter(|m| m.source == source && !m.in_child)
            .map_or(0, |m| m.attempts);
        let in_child = self.render_session.is_some();
        if attempts >= RENDER_ATTEMPTS {
            self.shared.recorder.record_failed_render(
                &failed_output(
                    &snapshot.revision,
                    format!(
                        "the hub stopped {attempts} times while rendering this commit (killed, out \
                         of memory or a crash), so it is not rendered again; the last good bundles \
                         stay served: push a commit that changes the fleet"
                    ),
                ),
                Duration::ZERO,
            );
            return None;
        }
        write_marker(
            &marker,
            &RenderMarker {
                source,
                attempts: if in_child { 1 } else { attempts + 1 },
                in_child,
            },
        );
        Some(marker)
    }

    /// A render's outcome: its output and how long it took, or, for a render that
    /// failed as a whole, one error saying why and how long was waited for it
    /// (`None`: the hub is shutting down).
    fn finished(
        &self,
        rendered: Rendered,
    ) -> Result<(RenderOutput, Duration), Option<(String, Duration)>> {
        let message = match rendered {
            Rendered::Done(output, duration) => return Ok((*output, duration)),
            Rendered::ShuttingDown => return Err(None),
            Rendered::Abandoned(waited, on) => {
                let on = on
                    .map(|on| format!(" (it was rendering {on} for a long time)"))
                    .unwrap_or_default();
                return Err(Some((
                    format!(
                        "the render of this commit took longer than {} (--render-timeout) and was \
                         abandoned{on}; the last good bundles stay served",
                        humantime::format_duration(self.limits.render_timeout)
                    ),
                    waited,
                )));
            }
            Rendered::OutOfMemory(on) => {
                let limit = self
                    .render_session
                    .as_ref()
                    .and_then(RenderSession::memory_limit)
                    .unwrap_or_default();
                let cause = match on {
                    Some(on) => format!("it was rendering {on} for a long time"),
                    None => "templates that write large outputs for many clusters, or a \
                             fleet larger than the limit allows"
                        .to_string(),
                };
                format!(
                    "the render of this commit needed more than {} of memory \
                     (--render-memory) and was stopped ({cause}); the last good bundles \
                     stay served",
                    human_bytes(limit)
                )
            }
            Rendered::CannotStart(message) => format!(
                "cannot start the render process ({message}): restart the hub (was \
                 its binary replaced or removed?), or give it --render-in-process; \
                 the last good bundles stay served"
            ),
            Rendered::Panicked(message) => format!(
                "the render failed unexpectedly (a flotilla bug, please report it): {message}"
            ),
        };
        Err(Some((message, Duration::ZERO)))
    }

    /// Installs a clean render and, if the hub can afford to keep it (weighed beside
    /// the install), keeps it so the next render need render only what changed since
    /// (see `render_since`: any clean render of the whole fleet will do).
    async fn install_and_keep(
        &mut self,
        output: RenderOutput,
        duration: Duration,
        forced: bool,
    ) -> Result<(), HubError> {
        let output = Arc::new(output);
        self.last_output = None;
        let weighing = (self.keep_render > 0).then(|| {
            let weighed = output.clone();
            tokio::task::spawn_blocking(move || weight(&weighed))
        });
        let installed = self.install_render(output.clone(), duration, forced).await;
        if let Some(weighing) = weighing {
            let weight = weighing.await.unwrap_or(u64::MAX);
            if weight <= self.keep_render {
                tracing::debug!(revision = %output.revision, weight, "kept for the next commit");
                // The render process, which answered it, keeps it too.
                if let Some(session) = &mut self.render_session {
                    session.keeps(&output);
                }
                self.last_output = Some(output);
            } else {
                tracing::info!(
                    revision = %output.revision,
                    weight,
                    keep_render = self.keep_render,
                    "this render is not kept (--keep-render): the next commit is rendered in full"
                );
            }
        }
        installed
    }

    /// Installs a clean render: recorded (with several hubs, only when its commit
    /// descends from the one recorded), or held as a pending force-push.
    async fn install_render(
        &mut self,
        output: Arc<RenderOutput>,
        duration: Duration,
        forced: bool,
    ) -> Result<(), HubError> {
        for warning in output.warnings() {
            tracing::warn!(revision = %output.revision, "{warning}");
        }
        // Several hubs: record a render only when its commit descends from the one
        // recorded, so a hub that is behind never moves the fleet back. The recorded
        // revision is compared again inside the transaction that records.
        let expect = if self.shared.recorder.lease().is_shared() {
            let recorded = self.shared.view.reads().revision().await?;
            if let Some(recorded) = &recorded
                && *recorded != output.revision
                && !self.descends(&output.revision, recorded).await
            {
                self.shared.recorder.install_objects_only(&output).await?;
                let polls = match &self.pending {
                    Some(p) if p.output.revision == output.revision => p.polls + 1,
                    _ => 1,
                };
                tracing::warn!(
                    revision = %output.revision,
                    recorded = %recorded,
                    "this commit does not descend from the one recorded (a force-push, or this hub is behind); \
                     it is recorded once every live hub has seen it for {FORCE_PUSH_POLLS} polls in a row"
                );
                self.pending = Some(PendingForcePush {
                    output,
                    duration,
                    forced,
                    polls,
                });
                self.weigh_force_push(true).await;
                return Ok(());
            }
            self.forget_force_push().await;
            Some(recorded)
        } else {
            None
        };
        self.install_and_log(&output, duration, forced, expect)
            .await
    }

    /// Installs a clean render (recorded if this hub holds the lease, with `expect`
    /// the recorded revision the transaction checks) and logs what it did.
    async fn install_and_log(
        &self,
        output: &RenderOutput,
        duration: Duration,
        forced: bool,
        expect: Option<Option<String>>,
    ) -> Result<(), HubError> {
        let report = self
            .shared
            .recorder
            .install(output, duration, forced, expect)
            .await?;
        self.shared.recorder.forget_history().await;
        self.shared.recorder.collect_garbage().await;
        tracing::info!(
            revision = %report.revision,
            clusters = report.clusters,
            changed = report.changed,
            removed = report.removed,
            rollouts_started = report.rollouts_started,
            objects_written = report.objects_written,
            render_ms = report.render_duration.as_millis() as u64,
            install_ms = report.install_duration.as_millis() as u64,
            objects_ms = report.objects_duration.as_millis() as u64,
            record_ms = report.record_duration.map(|d| d.as_millis() as u64),
            "serving the new render"
        );
        Ok(())
    }

    /// Renders on a thread of its own, never on the async runtime's threads: the hub
    /// keeps answering meanwhile, and neither a render past its deadline nor one in
    /// progress at shutdown holds it. Such a render is told to stop (it does at its
    /// next unit of work) and left to finish on its own; the process does not wait
    /// for it to exit.
    async fn render_off_runtime(
        &mut self,
        snapshot: FleetSnapshot,
        helm_seed: [u8; 32],
        shutdown: &mut watch::Receiver<bool>,
    ) -> Rendered {
        let patience = self.limits.render_timeout + RENDER_GRACE;
        if let Some(session) = &mut self.render_session {
            // Renders in the render process (see [`crate::render_worker`]), ended at
            // the deadline and its grace, or when the hub stops.
            let stop = async {
                let _ = shutdown.changed().await;
            };
            let previous = self.last_output.clone();
            return session
                .render(snapshot, previous, &self.limits, patience, stop)
                .await;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let (done, result) = oneshot::channel();
        let limits = self.limits.clone();
        let stop = cancel.clone();
        let previous = self.last_output.clone();
        let decryption = self.decryption.clone();
        let sealing_secret = decryption.sealing_secret();
        let sealing_headers = self.sealing_headers.clone();
        let spawned = std::thread::Builder::new()
            .name("flotilla-render".into())
            .spawn(move || {
                let headers = || sealing_headers.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(err) = headers().offer() {
                    tracing::warn!("{err}");
                }
                let started = Instant::now();
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let options = RenderOptions {
                        limits,
                        cancel: Some(&stop),
                        helm_seed: Some(helm_seed),
                        sops: SopsKeys::Open(decryption),
                        ..RenderOptions::default()
                    };
                    match &previous {
                        Some(previous) => render_since(previous, &snapshot, &options),
                        None => render_with(&snapshot, &options),
                    }
                }));
                if let Err(err) = headers().keep(&helm_seed, sealing_secret.as_ref()) {
                    tracing::warn!("{err}");
                }
                let _ = done.send(match outcome {
                    Ok(output) => Rendered::Done(Box::new(output), started.elapsed()),
                    Err(panic) => Rendered::Panicked(panic_message(&panic)),
                });
            });
        if let Err(err) = spawned {
            return Rendered::Panicked(format!("cannot start a render thread: {err}"));
        }
        // A wall-clock timer on a thread of its own: the render's deadline is real
        // time, whatever the runtime's clock says (tests pause it).
        let patience = self.limits.render_timeout + RENDER_GRACE;
        let (expired, timer) = oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(patience);
            let _ = expired.send(());
        });
        let started = Instant::now();
        let outcome = tokio::select! {
            result = result => result.unwrap_or_else(|_| Rendered::Panicked("the render thread ended without a result".into())),
            _ = timer => Rendered::Abandoned(started.elapsed(), None),
            _ = shutdown.changed() => Rendered::ShuttingDown,
        };
        if !matches!(outcome, Rendered::Done(..)) {
            cancel.store(true, Ordering::Relaxed);
        }
        outcome
    }

    /// The snapshot to render, and whether its commit forces an immediate rollout
    /// (`Flotilla-Rollout: immediate`); `None` when nothing changed since the last look.
    async fn next_snapshot(&mut self) -> Result<Option<(FleetSnapshot, bool)>, SourceError> {
        match self.origin.clone() {
            Origin::Remote { url, mirror } => {
                git::mirror(&url, &mirror, FETCH_TIMEOUT).await?;
                self.snapshot_of_tip(mirror).await
            }
            Origin::Local {
                path,
                kind: RepoKind::Git,
                ..
            } => self.snapshot_of_tip(path).await,
            Origin::Local {
                path,
                kind: RepoKind::Folder,
                subpath,
            } => {
                let limits = self.limits.clone();
                let snapshot = tokio::task::spawn_blocking(move || {
                    from_folder_within(&path, &subpath, &limits)
                })
                .await
                .map_err(|e| SourceError::Io {
                    path: git::RemoteUrl::parse(&self.spec.repo).shown,
                    message: e.to_string(),
                })??;
                if self.last_files.as_ref() == Some(&snapshot.files) && snapshot.problems.is_empty()
                {
                    return Ok(None);
                }
                self.last_files = Some(snapshot.files.clone());
                Ok(Some((snapshot, false)))
            }
        }
    }

    async fn snapshot_of_tip(
        &mut self,
        repo: PathBuf,
    ) -> Result<Option<(FleetSnapshot, bool)>, SourceError> {
        let branch = self.spec.branch.clone();
        let subpath = self.origin.subpath(&self.spec).to_string();
        let last = self.last_commit.clone();
        let limits = self.limits.clone();
        // Taken for the read and put back after it (lost only if the read panics).
        let mut texts = std::mem::take(&mut self.blob_texts);
        let (texts, result) = tokio::task::spawn_blocking(move || {
            let mut read =
                || -> Result<Option<(Tip, FleetSnapshot, bool, git::CommitText)>, SourceError> {
                    let tip = git::tip(&repo, branch.as_deref())?;
                    if last.as_deref() == Some(tip.commit.as_str()) {
                        return Ok(None);
                    }
                    let snapshot =
                        git::snapshot_at_reusing(&repo, &tip, &subpath, &limits, &mut texts)?;
                    let forced =
                        flotilla_core::rollout::is_forced(&git::commit_message(&repo, &tip)?);
                    // Read before the render, so the commit's subject is known by the time
                    // its bundles are served.
                    let text = git::commit_text(&repo, &tip.commit)?;
                    Ok(Some((tip, snapshot, forced, text)))
                };
            let result = read();
            (texts, result)
        })
        .await
        .map_err(|e| SourceError::Io {
            path: git::RemoteUrl::parse(&self.spec.repo).shown,
            message: e.to_string(),
        })?;
        self.blob_texts = texts;
        let result = result?;
        Ok(result.map(|(tip, snapshot, forced, text)| {
            let summary = commit_summary(&snapshot.revision, text);
            self.shared
                .recorder
                .update_render_status(|r| r.know_commit(summary));
            self.last_commit = Some(tip.commit);
            (snapshot, forced)
        }))
    }
}

impl Follower {
    /// Counts a poll that saw the pending force-pushed tip (`polled`; otherwise only
    /// looks at the other hubs' counts): writes this hub's count, reads every live
    /// hub's, shows them in `/v1/fleet`, and records the tip when this hub holds the
    /// lease and every live hub has seen it [`FORCE_PUSH_POLLS`] times in a row. A
    /// hub that finds it recorded serves it. Errors are logged; the next poll tries
    /// again.
    async fn weigh_force_push(&mut self, polled: bool) {
        if let Err(err) = self.try_weigh_force_push(polled).await {
            tracing::error!("cannot weigh the force-pushed tip: {err}");
        }
    }

    async fn try_weigh_force_push(&mut self, polled: bool) -> Result<(), HubError> {
        let Some(pending) = &self.pending else {
            return Ok(());
        };
        let tip = pending.output.revision.clone();
        let polls = pending.polls;
        let store = self.shared.view.reads();
        let hub = self.shared.recorder.lease().holder().to_string();
        let recorded = store.revision().await?;
        if recorded.as_deref() == Some(tip.as_str()) {
            tracing::info!(revision = %tip, "the force-pushed commit is recorded; serving it");
            return self.take_force_push(recorded).await;
        }
        if let Some(recorded) = &recorded
            && self.descends(&tip, recorded).await
        {
            // Another commit was recorded meanwhile, and this tip descends from it.
            return self.take_force_push(Some(recorded.clone())).await;
        }
        if polled {
            self.shared.recorder.see_tip(Some(&tip), polls).await?;
        }
        let live_ms =
            i64::try_from(self.shared.settings.peers.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        let live = store.live_hubs(live_ms).await?;
        let hubs: Vec<ForcePushHub> = live
            .iter()
            .map(|s| ForcePushHub {
                hub: s.hub.clone(),
                polls: if s.tip.as_deref() == Some(tip.as_str()) {
                    s.polls
                } else {
                    0
                },
                this_hub: s.hub == hub,
            })
            .collect();
        let agreed = hubs.iter().filter(|h| h.polls >= FORCE_PUSH_POLLS).count();
        let everyone = hubs.iter().any(|h| h.this_hub) && agreed == hubs.len();
        let recorded = recorded.unwrap_or_default();
        if polled {
            tracing::info!(
                revision = %tip,
                recorded = %recorded,
                polls,
                hubs_agreeing = agreed,
                live_hubs = hubs.len(),
                "force-pushed tip seen by this hub for {polls} poll(s) in a row; {agreed} of {} live hub(s) have seen it {FORCE_PUSH_POLLS} times",
                hubs.len()
            );
        }
        self.shared.recorder.update_render_status(|r| {
            r.force_push = Some(ForcePush {
                revision: tip.clone(),
                recorded: recorded.clone(),
                polls_needed: FORCE_PUSH_POLLS,
                hubs,
            });
        });
        if everyone && self.shared.recorder.lease().holds() {
            tracing::info!(
                revision = %tip,
                recorded = %recorded,
                "every live hub has seen the force-pushed tip for {FORCE_PUSH_POLLS} polls in a row; recording it"
            );
            return self.take_force_push(Some(recorded)).await;
        }
        Ok(())
    }

    /// Installs the pending force-pushed render (recorded if this hub holds the lease
    /// and `recorded` is still what the database records) and forgets it.
    async fn take_force_push(&mut self, recorded: Option<String>) -> Result<(), HubError> {
        let Some(pending) = &self.pending else {
            return Ok(());
        };
        // Kept until recorded: if the transaction finds the recorded commit moved, the
        // tip stays pending and the next poll weighs it again.
        let revision = pending.output.revision.clone();
        let installed = self
            .install_and_log(
                &pending.output,
                pending.duration,
                pending.forced,
                Some(recorded),
            )
            .await;
        if let Err(err) = installed {
            // The tip stays pending: a later poll weighs it and installs it again.
            self.show_install_error(&revision, &err);
            return Err(err);
        }
        self.forget_force_push().await;
        Ok(())
    }

    /// No force-pushed tip pending any more: this hub's count is cleared in the
    /// database and `/v1/fleet`.
    async fn forget_force_push(&mut self) {
        let shown = self.shared.view.render_status().force_push.is_some();
        if self.pending.take().is_none() && !shown {
            return;
        }
        self.shared
            .recorder
            .update_render_status(|r| r.force_push = None);
        if let Err(err) = self.shared.recorder.see_tip(None, 0).await {
            tracing::warn!("cannot clear this hub's force-push count: {err}");
        }
    }

    /// The Git repository this hub reads commits from (a remote's mirror); `None` for
    /// a plain folder.
    fn git_repository(&self) -> Option<PathBuf> {
        match &self.origin {
            Origin::Remote { mirror, .. } => Some(mirror.clone()),
            Origin::Local {
                path,
                kind: RepoKind::Git,
                ..
            } => Some(path.clone()),
            Origin::Local { .. } => None,
        }
    }

    /// Reads the subject and author of the served commit when the render status does
    /// not have them: served before this hub started, recorded by another hub, or
    /// forgotten behind newer commits that did not render. A commit this hub has not
    /// fetched yet is tried again at the next look.
    async fn describe_served(&self) {
        let status = self.shared.view.render_status();
        let Some(revision) = status.served_revision.clone() else {
            return;
        };
        if status.served_commit().is_some() {
            return;
        }
        let (Some(repo), Some((_, commit))) =
            (self.git_repository(), revision.rsplit_once("@sha1:"))
        else {
            return;
        };
        let commit = commit.to_string();
        match tokio::task::spawn_blocking(move || git::commit_text(&repo, &commit)).await {
            Ok(Ok(text)) => {
                let summary = commit_summary(&revision, text);
                self.shared
                    .recorder
                    .update_render_status(|r| r.know_commit(summary));
            }
            Ok(Err(err)) => {
                tracing::debug!(revision = %revision, "cannot read the served commit's subject yet: {err}");
            }
            Err(err) => tracing::warn!("reading the served commit's subject stopped: {err}"),
        }
    }

    /// Whether the commit of `revision` descends from (or is) the commit of
    /// `recorded`, in the repository this hub follows; false when either is unknown
    /// here (this hub has not fetched it yet: it is behind).
    async fn descends(&self, revision: &str, recorded: &str) -> bool {
        let Some(repo) = self.git_repository() else {
            return true;
        };
        let commit = |r: &str| r.rsplit_once("@sha1:").map(|(_, c)| c.to_string());
        let (Some(new), Some(old)) = (commit(revision), commit(recorded)) else {
            return false;
        };
        tokio::task::spawn_blocking(move || crate::source::descends(&repo, &new, &old))
            .await
            .ok()
            .flatten()
            .unwrap_or(false)
    }
}

/// A commit's subject and author beside its revision.
fn commit_summary(revision: &str, text: git::CommitText) -> crate::fleet::CommitSummary {
    crate::fleet::CommitSummary {
        revision: revision.to_string(),
        subject: text.subject,
        author: text.author,
        author_email: text.author_email,
    }
}

/// Whether `path` lies under a hidden entry (`.git`, `.flotilla-state`, an editor's
/// swap file) of `root`; the fleet reader skips those, so their changes do not matter.
fn hidden_below(root: &Path, path: &Path) -> bool {
    path.strip_prefix(root).is_ok_and(|rel| {
        rel.components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
    })
}

/// `4 GiB`, `512 MiB`, or bytes when not a whole number of either.
pub fn human_bytes(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes >= 1024 * MIB && bytes.is_multiple_of(1024 * MIB) {
        format!("{} GiB", bytes / (1024 * MIB))
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// A render that failed as a whole, with one error saying why.
fn failed_output(revision: &str, message: String) -> RenderOutput {
    RenderOutput {
        revision: revision.to_string(),
        diagnostics: vec![Diagnostic::error(message)],
        ..RenderOutput::default()
    }
}

/// What identifies the content being rendered: the revision of a commit, or for a
/// folder (whose revision never changes) a digest of its files.
fn render_source(snapshot: &FleetSnapshot) -> String {
    if !snapshot.revision.starts_with("folder:") {
        return snapshot.revision.clone();
    }
    let mut listing = Vec::new();
    for (path, text) in &snapshot.files {
        listing.extend_from_slice(path.as_bytes());
        listing.push(0);
        listing.extend_from_slice(Digest::of(text.as_bytes()).as_str().as_bytes());
        listing.push(0);
    }
    format!("{}@{}", snapshot.revision, Digest::of(&listing))
}

fn read_marker(path: &Path) -> Option<RenderMarker> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn write_marker(path: &Path, marker: &RenderMarker) {
    let written = serde_json::to_vec(marker)
        .map_err(std::io::Error::other)
        .and_then(|bytes| flotilla_fs::write_atomically(path, &bytes, flotilla_fs::Mode::Private));
    if let Err(err) = written {
        tracing::warn!(
            "cannot record the render in progress in {}: {err}",
            path.display()
        );
    }
}
