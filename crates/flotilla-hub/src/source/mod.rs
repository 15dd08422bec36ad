//! Where fleet snapshots come from: a Git commit (read straight from the object
//! database through git2, so what is rendered is exactly the commit) or a plain
//! folder (for local editing). This is the only module that knows git2.

pub mod follow;

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use git2::{ObjectType, Repository, Tree};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::{FleetSnapshot, is_fleet_file};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: not a Git repository ({message}); pass --rev only with a Git repository")]
    NotARepository { path: String, message: String },
    #[error("revision {rev:?} not found in {repo}: {message}")]
    UnknownRevision {
        repo: String,
        rev: String,
        message: String,
    },
    #[error("--path {0:?} must be a relative path inside the repository, without \"..\"")]
    PathEscapes(String),
    #[error("--path {path:?} does not exist at {revision}")]
    NoSuchPath { path: String, revision: String },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("Git error in {repo}: {message}")]
    Git { repo: String, message: String },
}

/// Checks a fleet-root subpath: relative, no `..`, no root. Returns its parts.
pub fn checked_subpath(path: &str) -> Result<Vec<String>, SourceError> {
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            _ => return Err(SourceError::PathEscapes(path.to_string())),
        }
    }
    Ok(parts)
}

/// Reads a snapshot from a Git repository at `rev` (any revision Git understands).
pub fn from_git(repo_path: &Path, rev: &str, subpath: &str) -> Result<FleetSnapshot, SourceError> {
    let repo = open_repository(repo_path)?;
    snapshot_of_rev(&repo, rev, subpath)
}

pub fn open_repository(repo_path: &Path) -> Result<Repository, SourceError> {
    Repository::open(repo_path)
        .or_else(|_| Repository::discover(repo_path))
        .map_err(|err| SourceError::NotARepository {
            path: repo_path.display().to_string(),
            message: err.message().to_string(),
        })
}

/// The commit a revision names, as a 40-hex string.
pub fn resolve(repo: &Repository, rev: &str) -> Result<git2::Oid, SourceError> {
    let repo_name = repo.path().display().to_string();
    repo.revparse_single(rev)
        .and_then(|object| object.peel_to_commit())
        .map(|commit| commit.id())
        .map_err(|err| SourceError::UnknownRevision {
            repo: repo_name,
            rev: rev.to_string(),
            message: err.message().to_string(),
        })
}

/// The name to show for a revision: the branch's short name where `rev` names one.
fn branch_label(repo: &Repository, rev: &str) -> String {
    if rev == "HEAD"
        && let Ok(head) = repo.head()
        && let Ok(name) = head.shorthand()
    {
        return name.to_string();
    }
    rev.to_string()
}

pub fn snapshot_of_rev(
    repo: &Repository,
    rev: &str,
    subpath: &str,
) -> Result<FleetSnapshot, SourceError> {
    snapshot_of_rev_within(repo, rev, subpath, &Limits::default())
}

pub fn snapshot_of_rev_within(
    repo: &Repository,
    rev: &str,
    subpath: &str,
    limits: &Limits,
) -> Result<FleetSnapshot, SourceError> {
    let oid = resolve(repo, rev)?;
    let label = branch_label(repo, rev);
    snapshot_of_commit_within(repo, oid, &label, subpath, limits)
}

/// Reads every fleet file under `subpath` of a commit's tree, within the default
/// [`Limits`].
pub fn snapshot_of_commit(
    repo: &Repository,
    oid: git2::Oid,
    label: &str,
    subpath: &str,
) -> Result<FleetSnapshot, SourceError> {
    snapshot_of_commit_within(repo, oid, label, subpath, &Limits::default())
}

/// Reads every fleet file under `subpath` of a commit's tree, within `limits`: no file
/// larger than `max_file_bytes` and no more than `max_fleet_bytes` in all.
pub fn snapshot_of_commit_within(
    repo: &Repository,
    oid: git2::Oid,
    label: &str,
    subpath: &str,
    limits: &Limits,
) -> Result<FleetSnapshot, SourceError> {
    let git_error = |err: git2::Error| SourceError::Git {
        repo: repo.path().display().to_string(),
        message: err.message().to_string(),
    };
    let revision = format!("{label}@sha1:{oid}");
    let commit = repo.find_commit(oid).map_err(git_error)?;
    let root_tree = commit.tree().map_err(git_error)?;
    let parts = checked_subpath(subpath)?;
    let tree = if parts.is_empty() {
        root_tree
    } else {
        let entry = root_tree
            .get_path(Path::new(&parts.join("/")))
            .map_err(|_| SourceError::NoSuchPath {
                path: subpath.to_string(),
                revision: revision.clone(),
            })?;
        entry
            .to_object(repo)
            .and_then(|o| o.peel_to_tree())
            .map_err(|_| SourceError::NoSuchPath {
                path: subpath.to_string(),
                revision: revision.clone(),
            })?
    };
    let mut snapshot = FleetSnapshot {
        revision,
        ..FleetSnapshot::default()
    };
    let mut walker = GitWalker {
        repo,
        root: &tree,
        files: Files::new(&mut snapshot, limits),
    };
    walker.walk(&tree)?;
    Ok(snapshot)
}

/// The files of a snapshot being read, and what reading them has cost so far.
struct Files<'a> {
    snapshot: &'a mut FleetSnapshot,
    limits: &'a Limits,
    bytes_read: u64,
    /// Set once the fleet's budget is spent: nothing more is read.
    exhausted: bool,
}

impl<'a> Files<'a> {
    fn new(snapshot: &'a mut FleetSnapshot, limits: &'a Limits) -> Files<'a> {
        Files {
            snapshot,
            limits,
            bytes_read: 0,
            exhausted: false,
        }
    }

    fn problem(&mut self, diagnostic: Diagnostic) {
        self.snapshot.problems.push(diagnostic);
    }

    /// Whether a file of `size` bytes may be read at all (it is not too large and the
    /// budget is not spent); reports why not. Counts nothing.
    fn may_read(&mut self, path: &str, size: u64) -> bool {
        if self.exhausted {
            return false;
        }
        if size > self.limits.max_file_bytes {
            self.problem(
                Diagnostic::error(format!(
                    "file is {size} bytes, over the limit of {} bytes (--max-file-bytes); it was not read",
                    self.limits.max_file_bytes
                ))
                .in_file(path),
            );
            return false;
        }
        true
    }

    /// Whether a file of `size` bytes may be read, counting it; reports why not. Every path
    /// counts against the fleet's budget, even one whose content Git stores once
    /// for many paths: what costs is reading and parsing it, once per path.
    fn admit(&mut self, path: &str, size: u64) -> bool {
        if !self.may_read(path, size) {
            return false;
        }
        self.bytes_read = self.bytes_read.saturating_add(size);
        if self.bytes_read > self.limits.max_fleet_bytes {
            self.exhausted = true;
            self.problem(
                Diagnostic::error(format!(
                    "the fleet's files come to more than {} bytes (--max-fleet-bytes, every path \
                     counted) with this one; it and the files after it were not read",
                    self.limits.max_fleet_bytes
                ))
                .in_file(path),
            );
            return false;
        }
        true
    }

    /// Adds a file's content, if it is admitted and is UTF-8 text.
    fn add(&mut self, path: &str, content: &[u8]) {
        if !self.admit(path, content.len() as u64) {
            return;
        }
        match std::str::from_utf8(content) {
            Ok(text) => {
                self.snapshot
                    .files
                    .insert(path.to_string(), Arc::from(text));
            }
            Err(err) => self.problem(
                Diagnostic::error(format!("file is not UTF-8 text ({err})")).in_file(path),
            ),
        }
    }
}

struct GitWalker<'a> {
    repo: &'a Repository,
    root: &'a Tree<'a>,
    files: Files<'a>,
}

const SYMLINK_MODE: i32 = 0o120000;

impl GitWalker<'_> {
    /// Walks the tree with a stack of folders still to read, never recursing, so a
    /// tree thousands of folders deep cannot overflow the stack.
    fn walk(&mut self, root: &Tree<'_>) -> Result<(), SourceError> {
        let mut folders: Vec<(Tree<'_>, String)> = vec![(root.clone(), String::new())];
        while let Some((tree, prefix)) = folders.pop() {
            if self.files.exhausted {
                break;
            }
            // Subfolders go on the stack in reverse, so files are read in a fixed
            // order (a folder's files, then its subfolders by name) and the file
            // that breaks a budget is always the same one.
            let mut subfolders = Vec::new();
            for entry in tree.iter() {
                let Ok(name) = entry.name() else {
                    self.files.problem(
                        Diagnostic::error("a file name is not valid UTF-8; it was skipped")
                            .in_file(&prefix),
                    );
                    continue;
                };
                let path = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                };
                match entry.kind() {
                    Some(ObjectType::Tree) => {
                        if name.starts_with('.') {
                            continue;
                        }
                        let Ok(subtree) = entry.to_object(self.repo).and_then(|o| o.peel_to_tree())
                        else {
                            self.files.problem(
                                Diagnostic::error("cannot read this folder from Git")
                                    .in_file(&path),
                            );
                            continue;
                        };
                        subfolders.push((subtree, path));
                    }
                    Some(ObjectType::Blob) if is_fleet_file(&path) => {
                        self.read_blob(&path, entry.id(), entry.filemode());
                    }
                    _ => {}
                }
            }
            folders.extend(subfolders.into_iter().rev());
        }
        Ok(())
    }

    fn read_blob(&mut self, path: &str, id: git2::Oid, mode: i32) {
        // The size is known from the object's header, before its content is read.
        if let Ok(size) = self.size_of(id)
            && !self.files.may_read(path, size)
        {
            return;
        }
        let Ok(blob) = self.repo.find_blob(id) else {
            self.files
                .problem(Diagnostic::error("cannot read this file from Git").in_file(path));
            return;
        };
        if mode == SYMLINK_MODE {
            self.read_symlink(path, blob.content());
        } else {
            self.files.add(path, blob.content());
        }
    }

    fn size_of(&self, id: git2::Oid) -> Result<u64, git2::Error> {
        let odb = self.repo.odb()?;
        let (size, _) = odb.read_header(id)?;
        Ok(size as u64)
    }

    /// A symlink is followed only when its target stays inside the fleet root.
    fn read_symlink(&mut self, path: &str, target: &[u8]) {
        let target = String::from_utf8_lossy(target);
        let Some(resolved) = resolve_inside(path, &target) else {
            self.files.problem(
                Diagnostic::error(format!(
                    "symlink to {target:?} points outside the fleet root; it was not read"
                ))
                .in_file(path),
            );
            return;
        };
        let blob = self
            .root
            .get_path(Path::new(&resolved))
            .ok()
            .filter(|e| e.filemode() != SYMLINK_MODE)
            .and_then(|e| self.repo.find_blob(e.id()).ok());
        match blob {
            Some(blob) => self.files.add(path, blob.content()),
            None => self.files.problem(
                Diagnostic::error(format!(
                    "symlink to {target:?} does not lead to a file in the fleet"
                ))
                .in_file(path),
            ),
        }
    }
}

/// Resolves a symlink target relative to the link's folder; `None` if it leaves the root.
fn resolve_inside(link_path: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = link_path.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

/// Reads a snapshot from a folder on disk (the working tree, uncommitted edits
/// included), within the default [`Limits`].
pub fn from_folder(repo_path: &Path, subpath: &str) -> Result<FleetSnapshot, SourceError> {
    from_folder_within(repo_path, subpath, &Limits::default())
}

/// Reads a snapshot from a folder on disk, within `limits`.
pub fn from_folder_within(
    repo_path: &Path,
    subpath: &str,
    limits: &Limits,
) -> Result<FleetSnapshot, SourceError> {
    let parts = checked_subpath(subpath)?;
    let root: PathBuf = parts
        .iter()
        .fold(repo_path.to_path_buf(), |p, part| p.join(part));
    let io = |path: &Path, err: std::io::Error| SourceError::Io {
        path: path.display().to_string(),
        message: err.to_string(),
    };
    let canonical_root = root.canonicalize().map_err(|e| io(&root, e))?;
    if !canonical_root.is_dir() {
        return Err(SourceError::Io {
            path: root.display().to_string(),
            message: "not a folder".into(),
        });
    }
    let mut snapshot = FleetSnapshot {
        revision: format!("folder:{}", root.display()),
        ..FleetSnapshot::default()
    };
    let mut files = Files::new(&mut snapshot, limits);
    let mut stack = vec![(canonical_root.clone(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        if files.exhausted {
            break;
        }
        // In name order, subfolders pushed in reverse: files are read in a fixed
        // order (as from Git), so the file that breaks a budget is always the same one.
        let mut entries = std::fs::read_dir(&dir)
            .map_err(|e| io(&dir, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io(&dir, e))?;
        entries.sort_by_key(|entry| entry.file_name());
        let mut subfolders = Vec::new();
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            let file_type = entry.file_type().map_err(|e| io(&path, e))?;
            let (real, is_dir) = if file_type.is_symlink() {
                match path.canonicalize() {
                    Ok(real) if real.starts_with(&canonical_root) => {
                        let is_dir = real.is_dir();
                        (real, is_dir)
                    }
                    Ok(real) => {
                        if is_fleet_file(&rel) || real.is_dir() {
                            files.problem(
                                Diagnostic::error(format!(
                                    "symlink to {} points outside the fleet root; it was not read",
                                    real.display()
                                ))
                                .in_file(&rel),
                            );
                        }
                        continue;
                    }
                    Err(_) => {
                        if is_fleet_file(&rel) {
                            files.problem(Diagnostic::error("broken symlink").in_file(&rel));
                        }
                        continue;
                    }
                }
            } else {
                (path.clone(), file_type.is_dir())
            };
            if is_dir {
                // A symlinked folder inside the root is read through its real path,
                // which is always a subfolder, so there are no cycles to follow.
                if !file_type.is_symlink() {
                    subfolders.push((real, rel));
                }
                continue;
            }
            if !is_fleet_file(&rel) {
                continue;
            }
            let size = std::fs::metadata(&real).map_err(|e| io(&real, e))?.len();
            if !files.may_read(&rel, size) {
                continue;
            }
            let content = std::fs::read(&real).map_err(|e| io(&real, e))?;
            files.add(&rel, &content);
        }
        stack.extend(subfolders.into_iter().rev());
    }
    Ok(snapshot)
}

/// Where to read a fleet from, as the command line gives it.
#[derive(Clone, Debug)]
pub struct Location {
    pub repo: PathBuf,
    /// A Git revision; `None` means `HEAD` for a repository and the files for a folder.
    pub rev: Option<String>,
    /// The fleet root inside the repository.
    pub path: String,
    /// Read the files on disk even when `repo` is a Git repository.
    pub worktree: bool,
}

/// Reads a snapshot within the default [`Limits`]. A Git repository is read at `rev`
/// (default `HEAD`) from its object database; a plain folder is read from disk. A
/// folder inside a repository given with `--rev` is read from that repository at
/// that revision.
pub fn read(location: &Location) -> Result<FleetSnapshot, SourceError> {
    read_within(location, &Limits::default())
}

/// Reads a snapshot (as [`read`] does) within `limits`.
pub fn read_within(location: &Location, limits: &Limits) -> Result<FleetSnapshot, SourceError> {
    let Location {
        repo,
        rev,
        path,
        worktree,
    } = location;
    if *worktree {
        return from_folder_within(repo, path, limits);
    }
    if let Ok(repository) = Repository::open(repo) {
        return snapshot_of_rev_within(&repository, rev.as_deref().unwrap_or("HEAD"), path, limits);
    }
    let Some(rev) = rev else {
        return from_folder_within(repo, path, limits);
    };
    let repository = open_repository(repo)?;
    let workdir = repository
        .workdir()
        .ok_or_else(|| SourceError::NotARepository {
            path: repo.display().to_string(),
            message: "a bare repository has no folders to be inside of".into(),
        })?;
    let inside = repo
        .canonicalize()
        .ok()
        .and_then(|full| {
            let base = workdir.canonicalize().ok()?;
            full.strip_prefix(&base)
                .ok()
                .map(|p| p.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let joined = match (inside.is_empty(), path.is_empty()) {
        (true, _) => path.clone(),
        (false, true) => inside,
        (false, false) => format!("{inside}/{path}"),
    };
    snapshot_of_rev_within(&repository, rev, &joined, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subpaths_must_stay_inside() {
        assert!(checked_subpath("fleet/prod").is_ok());
        assert!(checked_subpath("../x").is_err());
        assert!(checked_subpath("/etc").is_err());
        assert!(checked_subpath("a/../../b").is_err());
    }

    #[test]
    fn symlink_targets_resolve_relative_to_the_link() {
        assert_eq!(
            resolve_inside("overlays/a.yaml", "../clusters/x.yaml").as_deref(),
            Some("clusters/x.yaml")
        );
        assert_eq!(resolve_inside("overlays/a.yaml", "../../etc/passwd"), None);
        assert_eq!(resolve_inside("a.yaml", "/etc/passwd"), None);
    }
}
