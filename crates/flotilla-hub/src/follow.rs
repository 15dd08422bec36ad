//! Following the repository: find out whether there is something new to render,
//! render it off the request path, and install it when it renders cleanly.
//!
//! A local repository is watched with `notify` (HEAD, refs, packed-refs), so a commit
//! is seen within milliseconds; a plain folder is watched recursively; a remote URL is
//! mirrored into the state directory and fetched every poll interval (with jitter) or
//! when the webhook says so. A slow poll backs up the watchers in every case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::{Notify, watch};

use super::HubError;
use super::state::Shared;
use crate::source::follow::{self as git, RepoKind, Tip};
use crate::source::{SourceError, from_folder};
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;

/// How long a `git clone` or `git fetch` may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);

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

pub struct Follower {
    shared: Arc<Shared>,
    origin: Origin,
    spec: SourceSpec,
    poll_interval: Duration,
    last_commit: Option<String>,
    last_files: Option<BTreeMap<String, Arc<str>>>,
    last_source_error: Option<String>,
}

impl Follower {
    pub fn new(
        shared: Arc<Shared>,
        spec: SourceSpec,
        state_dir: &Path,
        poll_interval: Duration,
    ) -> Follower {
        Follower {
            origin: Origin::of(&spec, state_dir),
            shared,
            spec,
            poll_interval,
            last_commit: None,
            last_files: None,
            last_source_error: None,
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
            self.check().await;
            self.shared.ready.store(true, Ordering::Relaxed);
            let delay = self
                .poll_interval
                .mul_f64(rand::random_range(0.9..1.1))
                .max(Duration::from_millis(10));
            tokio::select! {
                _ = self.shared.look_now.notified() => {
                    // Let a burst of file-system events (a commit touches several
                    // files) settle before reading.
                    tokio::time::sleep(settle).await;
                }
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => break,
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
        let (snapshot, forced) = match self.next_snapshot().await {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(err) => {
                let message = err.to_string();
                if self.last_source_error.as_deref() != Some(&message) {
                    tracing::error!("cannot read the fleet repository: {message}");
                }
                self.last_source_error = Some(message.clone());
                self.shared
                    .update_render_status(|r| r.source_error = Some(message));
                return;
            }
        };
        if self.last_source_error.take().is_some() {
            tracing::info!("the fleet repository can be read again");
        }
        self.shared.update_render_status(|r| r.source_error = None);
        if let Err(err) = self.render_and_install(snapshot, forced).await {
            tracing::error!("cannot install the new bundles: {err}");
            // Try the same commit again next time.
            self.last_commit = None;
            self.last_files = None;
        }
    }

    async fn render_and_install(
        &self,
        snapshot: FleetSnapshot,
        forced: bool,
    ) -> Result<(), HubError> {
        let (output, duration) = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let output = render(&snapshot);
            (output, started.elapsed())
        })
        .await
        .map_err(|e| HubError::Task(e.to_string()))?;
        if !output.is_clean() {
            self.shared.record_failed_render(&output, duration);
            return Ok(());
        }
        for warning in output.warnings() {
            tracing::warn!(revision = %output.revision, "{warning}");
        }
        let report = self.shared.install(output, duration, forced).await?;
        tracing::info!(
            revision = %report.revision,
            clusters = report.clusters,
            changed = report.changed,
            removed = report.removed,
            rollouts_started = report.rollouts_started,
            objects_written = report.objects_written,
            render_ms = report.render_duration.as_millis() as u64,
            install_ms = report.install_duration.as_millis() as u64,
            "serving the new render"
        );
        Ok(())
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
                let snapshot = tokio::task::spawn_blocking(move || from_folder(&path, &subpath))
                    .await
                    .map_err(|e| SourceError::Io {
                        path: self.spec.repo.clone(),
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
        let result = tokio::task::spawn_blocking(
            move || -> Result<Option<(Tip, FleetSnapshot, bool)>, SourceError> {
                let tip = git::tip(&repo, branch.as_deref())?;
                if last.as_deref() == Some(tip.commit.as_str()) {
                    return Ok(None);
                }
                let snapshot = git::snapshot_at(&repo, &tip, &subpath)?;
                let forced = flotilla_core::rollout::is_forced(&git::commit_message(&repo, &tip)?);
                Ok(Some((tip, snapshot, forced)))
            },
        )
        .await
        .map_err(|e| SourceError::Io {
            path: self.spec.repo.clone(),
            message: e.to_string(),
        })??;
        Ok(result.map(|(tip, snapshot, forced)| {
            self.last_commit = Some(tip.commit);
            (snapshot, forced)
        }))
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
