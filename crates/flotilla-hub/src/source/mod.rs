//! Where fleet snapshots come from: a Git commit (read straight from the object
//! database through git2, so what is rendered is exactly the commit) or a plain
//! folder (for local editing). This is the only module that knows git2.

pub mod follow;

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use git2::{ObjectType, Repository, Tree};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::{FleetSnapshot, is_fleet_file, is_packed_chart};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{path}: not a Git repository ({message}); pass --rev only with a Git repository")]
    NotARepository { path: String, message: String },
    #[error(
        "{path}: Git refuses to read this repository: {message}; if you trust it, allow it \
         with `git config --global --add safe.directory {workdir}`, or run flotilla as the \
         user who owns it"
    )]
    NotOwned {
        path: String,
        message: String,
        workdir: String,
    },
    #[error(
        "{repo} has no commit yet: commit the fleet (git add, git commit), or add --worktree to \
         read the files on disk"
    )]
    NoCommit { repo: String },
    #[error("revision {rev:?} not found in {repo}: {message}")]
    UnknownRevision {
        repo: String,
        rev: String,
        message: String,
    },
    #[error("--path {0:?} must be a relative path inside the repository, without \"..\"")]
    PathEscapes(String),
    #[error("the fleet root {path:?} does not exist at {revision}{hint}")]
    NoSuchPath {
        path: String,
        revision: String,
        /// What to do, when there is more to say: starts with "; ".
        hint: String,
    },
    #[error(
        "no fleet in {looked}: there is no clusters/<name>.yaml there (a fleet root holds \
         clusters/, groups/, workloads/ and overlays/; check --repo and --path){hint}"
    )]
    NoClusters {
        looked: String,
        /// The fleets found below, as the `--path` that reads them: starts with "; ".
        hint: String,
    },
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

/// Opens the Git repository at `repo_path` or around it (as `git` finds it from a
/// folder inside a work tree). A repository Git refuses for its owner is an error
/// that says how to allow it, never a reason to read the folder some other way.
/// Whether the commit `new` is `old` or descends from it in the repository at
/// `repo_path` (both as hexadecimal ids); `None` when either cannot be looked up.
pub fn descends(repo_path: &Path, new: &str, old: &str) -> Option<bool> {
    let repository = open_repository(repo_path).ok()?;
    let new = git2::Oid::from_str(new).ok()?;
    let old = git2::Oid::from_str(old).ok()?;
    Some(new == old || repository.graph_descendant_of(new, old).ok()?)
}

pub fn open_repository(repo_path: &Path) -> Result<Repository, SourceError> {
    match discover(repo_path)? {
        Some(repository) => Ok(repository),
        None => Err(SourceError::NotARepository {
            path: repo_path.display().to_string(),
            message: "no Git repository here or in any parent folder".into(),
        }),
    }
}

/// The Git repository `path` is in (itself, or the work tree or bare repository
/// around it), `None` when there is none.
pub fn discover(path: &Path) -> Result<Option<Repository>, SourceError> {
    match Repository::open(path).or_else(|_| Repository::discover(path)) {
        Ok(repository) => Ok(Some(repository)),
        Err(err) if err.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(err) if err.code() == git2::ErrorCode::Owner => Err(not_owned(path, &err)),
        Err(err) => Err(SourceError::NotARepository {
            path: path.display().to_string(),
            message: err.message().to_string(),
        }),
    }
}

/// libgit2's ownership check failed: say so, with the path `safe.directory` needs
/// (the repository's top folder, which libgit2 names in its message).
fn not_owned(path: &Path, err: &git2::Error) -> SourceError {
    let message = err.message().to_string();
    let named = message
        .split('\'')
        .nth(1)
        .map(|p| p.trim_end_matches('/').to_string())
        .filter(|p| !p.is_empty());
    let workdir = named.unwrap_or_else(|| {
        path.canonicalize()
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string()
    });
    SourceError::NotOwned {
        path: path.display().to_string(),
        message,
        workdir,
    }
}

/// The branch a repository's HEAD is on, whether it has a commit yet or not; `None`
/// when HEAD is detached.
pub fn head_branch(repository: &Repository) -> Option<String> {
    let head = repository.find_reference("HEAD").ok()?;
    let target = head.symbolic_target().ok()??;
    target.strip_prefix("refs/heads/").map(str::to_string)
}

/// Makes `dir` a new Git repository whose first branch is `branch`, whatever Git's
/// own default (`init.defaultBranch`) says.
pub fn init_repository(dir: &Path, branch: &str) -> Result<(), SourceError> {
    let mut options = git2::RepositoryInitOptions::new();
    options.initial_head(branch);
    Repository::init_opts(dir, &options)
        .map(drop)
        .map_err(|err| SourceError::Git {
            repo: dir.display().to_string(),
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

/// Reads every file under `subpath` of a commit's tree, within the default
/// [`Limits`].
pub fn snapshot_of_commit(
    repo: &Repository,
    oid: git2::Oid,
    label: &str,
    subpath: &str,
) -> Result<FleetSnapshot, SourceError> {
    snapshot_of_commit_within(repo, oid, label, subpath, &Limits::default())
}

/// Reads every file under `subpath` of a commit's tree, within `limits`: no file
/// larger than `max_file_bytes` and no more than `max_fleet_bytes` in all.
pub fn snapshot_of_commit_within(
    repo: &Repository,
    oid: git2::Oid,
    label: &str,
    subpath: &str,
    limits: &Limits,
) -> Result<FleetSnapshot, SourceError> {
    snapshot_of_commit_reusing(repo, oid, label, subpath, limits, &mut BlobTexts::default())
}

/// The text of the files read from Git by one snapshot, by blob id: the next
/// snapshot (of a later commit, or another side of a diff) takes from it every file
/// Git stores as the same blob instead of reading and checking it again, so reading
/// a commit costs what it changed, plus walking its folders. A snapshot taken with
/// it is the one taken without: the limits count every path as before.
#[derive(Clone, Debug, Default)]
pub struct BlobTexts {
    texts: HashMap<git2::Oid, Arc<str>>,
}

impl BlobTexts {
    /// How many texts it holds.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}

/// [`snapshot_of_commit_within`], taking the files whose blobs `texts` holds from
/// it; `texts` then holds this snapshot's texts (and no others).
pub fn snapshot_of_commit_reusing(
    repo: &Repository,
    oid: git2::Oid,
    label: &str,
    subpath: &str,
    limits: &Limits,
    texts: &mut BlobTexts,
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
                hint: String::new(),
            })?;
        entry
            .to_object(repo)
            .and_then(|o| o.peel_to_tree())
            .map_err(|_| SourceError::NoSuchPath {
                path: subpath.to_string(),
                revision: revision.clone(),
                hint: String::new(),
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
        known: &texts.texts,
        read: HashMap::new(),
    };
    walker.walk(&tree)?;
    let read = walker.read;
    texts.texts = read;
    keep_chart_binaries(&mut snapshot);
    Ok(snapshot)
}

/// Binary files are held only where a Helm chart may use them: packed charts, and
/// files inside a chart folder (one whose `Chart.yaml` was read), which Helm loads
/// (an image a chart ships, often listed in its `.helmignore`). Any other binary
/// file stays only noted as skipped.
fn keep_chart_binaries(snapshot: &mut FleetSnapshot) {
    let files = &snapshot.files;
    let in_chart = |path: &str| {
        let mut dir = path;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if files.contains_key(&format!("{parent}/Chart.yaml")) {
                return true;
            }
            dir = parent;
        }
        files.contains_key("Chart.yaml")
    };
    let mut kept = Vec::new();
    snapshot.binaries.retain(|path, _| {
        if is_packed_chart(path) {
            return true;
        }
        let keep = in_chart(path);
        if keep {
            kept.push(path.clone());
        }
        keep
    });
    for path in kept {
        snapshot.skipped.remove(&path);
    }
}

/// The files of a snapshot being read, and what reading them has cost so far.
///
/// A fleet file (YAML under the fleet's folders) that cannot be read is a problem;
/// any other file is only noted as skipped, since it matters only if a kustomization
/// refers to it.
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

    /// Records that `path` was read through a symlink to `target`.
    fn link(&mut self, path: &str, target: &str) {
        self.snapshot
            .links
            .insert(path.to_string(), target.to_string());
    }

    /// A file that was not read: a problem for a fleet file, else only noted.
    fn refuse(&mut self, path: &str, reason: String) {
        if is_fleet_file(path) {
            self.problem(Diagnostic::error(reason).in_file(path));
        } else {
            self.snapshot.skipped.insert(path.to_string(), reason);
        }
    }

    /// Whether a file of `size` bytes may be read at all (it is not too large and the
    /// budget is not spent); reports why not. Counts nothing.
    fn may_read(&mut self, path: &str, size: u64) -> bool {
        if self.exhausted {
            return false;
        }
        if size > self.limits.max_file_bytes {
            let reason = format!(
                "file is {size} bytes, over the limit of {} bytes (--max-file-bytes)",
                self.limits.max_file_bytes
            );
            if is_fleet_file(path) {
                self.problem(Diagnostic::error(format!("{reason}; it was not read")).in_file(path));
            } else {
                self.snapshot.skipped.insert(path.to_string(), reason);
            }
            return false;
        }
        true
    }

    /// Whether a file of `size` bytes may be read, counting it; reports why not. Every
    /// path counts against the fleet's budget, even one whose content Git stores once
    /// for many paths: what costs is reading and parsing it, once per path.
    fn admit(&mut self, path: &str, size: u64) -> bool {
        if !self.may_read(path, size) {
            return false;
        }
        self.bytes_read = self.bytes_read.saturating_add(size);
        if self.bytes_read > self.limits.max_fleet_bytes {
            self.exhausted = true;
            self.snapshot.incomplete = true;
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

    /// Adds a file's content, if it is admitted and is UTF-8 text; returns the text
    /// it added.
    fn add(&mut self, path: &str, content: &[u8]) -> Option<Arc<str>> {
        if !self.admit(path, content.len() as u64) {
            return None;
        }
        match std::str::from_utf8(content) {
            Ok(text) => {
                let text: Arc<str> = Arc::from(text);
                self.snapshot.files.insert(path.to_string(), text.clone());
                return Some(text);
            }
            Err(err) if is_fleet_file(path) => self.problem(
                Diagnostic::error(format!("file is not UTF-8 text ({err})")).in_file(path),
            ),
            Err(_) if is_packed_chart(path) => {
                self.snapshot
                    .binaries
                    .insert(path.to_string(), Arc::from(content));
            }
            // Held until the whole tree is read: kept if it lies in a chart (see
            // [`keep_chart_binaries`]), else only noted as skipped.
            Err(_) => {
                self.snapshot
                    .binaries
                    .insert(path.to_string(), Arc::from(content));
                self.snapshot
                    .skipped
                    .insert(path.to_string(), "file is not UTF-8 text".to_string());
            }
        }
        None
    }

    /// Adds a file whose text is known already (from an earlier snapshot), if it is
    /// admitted, as [`Files::add`] would its content.
    fn add_text(&mut self, path: &str, text: &Arc<str>) -> bool {
        if !self.admit(path, text.len() as u64) {
            return false;
        }
        self.snapshot.files.insert(path.to_string(), text.clone());
        true
    }
}

struct GitWalker<'a> {
    repo: &'a Repository,
    root: &'a Tree<'a>,
    files: Files<'a>,
    /// Texts of blobs the last snapshot read, by id.
    known: &'a HashMap<git2::Oid, Arc<str>>,
    /// Texts of the blobs this walk added, by id.
    read: HashMap<git2::Oid, Arc<str>>,
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
                // A name that is not UTF-8 is read with U+FFFD in place of what is
                // not, as a folder's is: a file or folder of the fleet so named is then
                // refused by the render (its name), never silently left out.
                let name = String::from_utf8_lossy(entry.name_bytes());
                let name: &str = &name;
                if let Some(reason) = refused_entry_name(name) {
                    // Git itself never writes such an entry; a tree that holds one
                    // was made by hand, and reading it would make a path no
                    // folder holds (`a/b.yaml`) or hide a folder (`..`).
                    let folder = if prefix.is_empty() { "." } else { &prefix };
                    self.files.problem(
                        Diagnostic::error(format!(
                            "the Git tree holds an entry named {} ({reason}), which `git fsck` \
                             refuses; it was not read and this commit is not rendered",
                            flotilla_core::names::shown(name)
                        ))
                        .in_file(folder),
                    );
                    continue;
                }
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
                    Some(ObjectType::Blob) => {
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
        // A blob read before, by the last snapshot or for another path of this one.
        if mode != SYMLINK_MODE
            && let Some(text) = self.read.get(&id).or_else(|| self.known.get(&id)).cloned()
        {
            if self.files.add_text(path, &text) {
                self.read.insert(id, text);
            }
            return;
        }
        // The size is known from the object's header, before its content is read.
        if let Ok(size) = self.size_of(id)
            && !self.files.may_read(path, size)
        {
            return;
        }
        let Ok(blob) = self.repo.find_blob(id) else {
            self.files
                .refuse(path, "cannot read this file from Git".to_string());
            return;
        };
        if mode == SYMLINK_MODE {
            self.read_symlink(path, blob.content());
        } else if let Some(text) = self.files.add(path, blob.content()) {
            self.read.insert(id, text);
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
            self.files.refuse(
                path,
                format!("symlink to {target:?} points outside the fleet root; it was not read"),
            );
            return;
        };
        let entry = self
            .root
            .get_path(Path::new(&resolved))
            .ok()
            .filter(|e| e.filemode() != SYMLINK_MODE);
        // The target's size is checked before it is read, as any file's is.
        if let Some(entry) = &entry
            && let Ok(size) = self.size_of(entry.id())
            && !self.files.may_read(path, size)
        {
            return;
        }
        let blob = entry.and_then(|e| self.repo.find_blob(e.id()).ok());
        match blob {
            Some(blob) => {
                if self.files.add(path, blob.content()).is_some() {
                    self.files.link(path, &resolved);
                }
            }
            None => self.files.refuse(
                path,
                format!("symlink to {target:?} does not lead to a file in the fleet"),
            ),
        }
    }
}

/// Why `git fsck` refuses a tree entry's name, if it does: an entry names one file or
/// folder, so it is never empty, never holds `/`, is never `.` or `..`, and is never
/// Git's own folder.
fn refused_entry_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("an empty name")
    } else if name.contains('/') {
        Some("a name holding '/'")
    } else if name == "." || name == ".." {
        Some("a name for a folder itself or the one above it")
    } else if name.eq_ignore_ascii_case(".git") {
        Some("the name of Git's own folder")
    } else {
        None
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
    let canonical_root = root
        .canonicalize()
        .map_err(|err| match similar_folder(&root) {
            Some(found) if err.kind() == std::io::ErrorKind::NotFound => SourceError::Io {
                path: root.display().to_string(),
                message: format!("no such folder (did you mean {}?)", found.display()),
            },
            _ => io(&root, err),
        })?;
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
            let hidden = name.starts_with('.');
            let rel = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            let file_type = entry.file_type().map_err(|e| io(&path, e))?;
            if hidden && file_type.is_dir() {
                // `.git` and the like; hidden files (`.env`) are read.
                continue;
            }
            let (real, is_dir) = if file_type.is_symlink() {
                match path.canonicalize() {
                    Ok(real) if real.starts_with(&canonical_root) => {
                        let is_dir = real.is_dir();
                        (real, is_dir)
                    }
                    Ok(real) => {
                        let reason = format!(
                            "symlink to {} points outside the fleet root; it was not read",
                            real.display()
                        );
                        if real.is_dir() && !hidden {
                            files.problem(Diagnostic::error(reason).in_file(&rel));
                        } else {
                            files.refuse(&rel, reason);
                        }
                        continue;
                    }
                    Err(_) => {
                        files.refuse(&rel, "broken symlink".into());
                        continue;
                    }
                }
            } else {
                (path.clone(), file_type.is_dir())
            };
            if is_dir && hidden {
                continue;
            }
            if is_dir {
                // A symlinked folder inside the root is read through its real path,
                // which is always a subfolder, so there are no cycles to follow.
                if !file_type.is_symlink() {
                    subfolders.push((real, rel));
                }
                continue;
            }
            let metadata = std::fs::metadata(&real).map_err(|e| io(&real, e))?;
            if !metadata.is_file() {
                // A named pipe or a device: reading it could wait for ever.
                files.refuse(&rel, "not a regular file; it was not read".into());
                continue;
            }
            if !files.may_read(&rel, metadata.len()) {
                continue;
            }
            let content = std::fs::read(&real).map_err(|e| io(&real, e))?;
            if files.add(&rel, &content).is_some()
                && file_type.is_symlink()
                && let Ok(target) = real.strip_prefix(&canonical_root)
            {
                let target: Vec<String> = target
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                files.link(&rel, &target.join("/"));
            }
        }
        stack.extend(subfolders.into_iter().rev());
    }
    keep_chart_binaries(&mut snapshot);
    Ok(snapshot)
}

/// Where to read a fleet from, as the command line gives it.
#[derive(Clone, Debug)]
pub struct Location {
    pub repo: PathBuf,
    /// A Git revision; `None` means `HEAD` inside a Git repository.
    pub rev: Option<String>,
    /// The fleet root, relative to `repo`.
    pub path: String,
    /// Read the files on disk even inside a Git repository.
    pub worktree: bool,
}

/// Where `--repo` and `--path` point once Git has been asked.
pub enum Root {
    /// Inside a Git repository (a work tree or a bare repository): the fleet root is
    /// `subpath` in the repository's tree. `--repo fleet` and `--repo . --path fleet`
    /// name the same root.
    Git {
        repository: Repository,
        subpath: String,
    },
    /// In no Git repository: a folder, read as it is on disk.
    Folder { path: PathBuf },
}

/// Finds what `repo` and `subpath` name. A path inside a Git work tree is a path in
/// that repository's tree, wherever the work tree's top is.
pub fn locate(repo: &Path, subpath: &str) -> Result<Root, SourceError> {
    let parts = checked_subpath(subpath)?;
    if !repo.exists() {
        return Err(SourceError::Io {
            path: repo.display().to_string(),
            message: format!(
                "no such folder or Git repository{}",
                similar_folder(repo)
                    .map(|found| format!(" (did you mean {}?)", found.display()))
                    .unwrap_or_default()
            ),
        });
    }
    let Some(repository) = discover(repo)? else {
        return Ok(Root::Folder {
            path: parts
                .iter()
                .fold(repo.to_path_buf(), |p, part| p.join(part)),
        });
    };
    let inside = match repository.workdir() {
        Some(workdir) => relative_inside(repo, workdir).unwrap_or_default(),
        None => String::new(),
    };
    let mut joined: Vec<String> = checked_subpath(&inside)?;
    joined.extend(parts);
    Ok(Root::Git {
        repository,
        subpath: joined.join("/"),
    })
}

/// `path` relative to `workdir` with `/` separators, when it lies inside it and is
/// not the Git folder itself.
fn relative_inside(path: &Path, workdir: &Path) -> Option<String> {
    let full = path.canonicalize().ok()?;
    let base = workdir.canonicalize().ok()?;
    let relative = full.strip_prefix(&base).ok()?;
    if relative
        .components()
        .next()
        .is_some_and(|c| c.as_os_str() == ".git")
    {
        return None;
    }
    Some(
        relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/"),
    )
}

/// Reads a snapshot, by one rule: inside a Git repository the fleet is read from a
/// commit (`rev`, default `HEAD`), straight from the object database, whether
/// `repo` is the work tree's top or a folder inside it; outside any repository, and
/// with `worktree`, it is read from the files on disk. A fleet with no cluster file is
/// an error that says where it looked.
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
    let (snapshot, looked) = if *worktree {
        let snapshot = from_folder_within(repo, path, limits)?;
        (snapshot, folder_name(repo, path))
    } else {
        match locate(repo, path)? {
            Root::Folder { path: root } => {
                if let Some(rev) = rev {
                    return Err(SourceError::NotARepository {
                        path: repo.display().to_string(),
                        message: format!(
                            "--rev {rev} needs one, and neither this folder nor a parent is in Git"
                        ),
                    });
                }
                (
                    from_folder_within(repo, path, limits)?,
                    folder_name(&root, ""),
                )
            }
            Root::Git {
                repository,
                subpath,
            } => {
                let snapshot =
                    commit_snapshot(&repository, rev.as_deref(), &subpath, repo, path, limits)?;
                let looked = git_name(&repository, &subpath, &snapshot.revision);
                (snapshot, looked)
            }
        }
    };
    require_clusters(&snapshot, looked).map_err(|err| match err {
        SourceError::NoClusters { looked, .. } => SourceError::NoClusters {
            looked,
            hint: fleets_below_hint(location),
        },
        other => other,
    })?;
    Ok(snapshot)
}

/// A folder beside the missing `path` whose name is close to its name: the path a
/// mistyped `--repo fleet-exmaple` meant.
pub fn similar_folder(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let folders: Vec<String> = std::fs::read_dir(parent)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|folder| !folder.starts_with('.'))
        .collect();
    let best = flotilla_core::diagnostic::did_you_mean(name, folders.iter().map(String::as_str))?;
    Some(path.with_file_name(best))
}

/// How deep below the fleet root a command looks for fleets it could have meant.
const FLEET_SEARCH_DEPTH: usize = 2;

/// For a location that holds no fleet: the `--path` of each fleet in a folder below
/// it (at most [`FLEET_SEARCH_DEPTH`] levels down), read where the fleet was read from
/// (the commit, or the disk), as "; did you mean --path P?"; empty when there is none.
fn fleets_below_hint(location: &Location) -> String {
    let mut found = if location.worktree {
        fleets_below_on_disk(&location.repo, &location.path)
    } else {
        match locate(&location.repo, &location.path) {
            Ok(Root::Folder { path }) => fleets_below_on_disk(&path, ""),
            Ok(Root::Git {
                repository,
                subpath,
            }) => fleets_below_in_git(&repository, location.rev.as_deref(), &subpath),
            Err(_) => Vec::new(),
        }
    };
    found.sort();
    let paths: Vec<String> = found
        .iter()
        .take(3)
        .map(|below| {
            let path = [location.path.trim_matches('/'), below.as_str()]
                .iter()
                .filter(|part| !part.is_empty() && **part != ".")
                .copied()
                .collect::<Vec<_>>()
                .join("/");
            format!("--path {path}")
        })
        .collect();
    if paths.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", paths.join(" or "))
    }
}

/// Whether a folder's listing (`(name, is folder)`) names a `clusters` folder.
fn holds_clusters_folder(entries: &[(String, bool)]) -> bool {
    entries
        .iter()
        .any(|(name, is_dir)| *is_dir && name == "clusters")
}

fn fleets_below_on_disk(repo: &Path, subpath: &str) -> Vec<String> {
    let root = checked_subpath(subpath)
        .unwrap_or_default()
        .iter()
        .fold(repo.to_path_buf(), |p, part| p.join(part));
    let list = |dir: &Path| -> Vec<(String, bool)> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                        e.file_name().into_string().ok().map(|name| (name, is_dir))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    search_fleets(String::new(), &list(&root), FLEET_SEARCH_DEPTH, &|below| {
        list(&root.join(below))
    })
}

fn fleets_below_in_git(repository: &Repository, rev: Option<&str>, subpath: &str) -> Vec<String> {
    let Ok(tree) = repository
        .revparse_single(rev.unwrap_or("HEAD"))
        .and_then(|object| object.peel_to_tree())
    else {
        return Vec::new();
    };
    let tree_at = |path: &str| -> Option<Tree<'_>> {
        if path.is_empty() {
            return Some(tree.clone());
        }
        tree.get_path(Path::new(path))
            .ok()?
            .to_object(repository)
            .ok()?
            .peel_to_tree()
            .ok()
    };
    let list = |path: &str| -> Vec<(String, bool)> {
        tree_at(path)
            .map(|tree| {
                tree.iter()
                    .filter_map(|entry| {
                        let is_dir = entry.kind() == Some(ObjectType::Tree);
                        entry.name().ok().map(|name| (name.to_string(), is_dir))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let join = |below: &str| -> String {
        [subpath, below]
            .iter()
            .filter(|part| !part.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("/")
    };
    search_fleets(
        String::new(),
        &list(subpath),
        FLEET_SEARCH_DEPTH,
        &|below| list(&join(below)),
    )
}

/// The folders below `at` (whose listing is `entries`), down to `depth` levels, that
/// hold a `clusters` folder; hidden folders are passed over.
fn search_fleets(
    at: String,
    entries: &[(String, bool)],
    depth: usize,
    list: &dyn Fn(&str) -> Vec<(String, bool)>,
) -> Vec<String> {
    let mut found = Vec::new();
    if depth == 0 {
        return found;
    }
    for (name, is_dir) in entries {
        if !is_dir || name.starts_with('.') {
            continue;
        }
        let below = if at.is_empty() {
            name.clone()
        } else {
            format!("{at}/{name}")
        };
        let listing = list(&below);
        if holds_clusters_folder(&listing) {
            found.push(below);
        } else {
            found.extend(search_fleets(below, &listing, depth - 1, list));
        }
    }
    found
}

fn commit_snapshot(
    repository: &Repository,
    rev: Option<&str>,
    subpath: &str,
    repo: &Path,
    path: &str,
    limits: &Limits,
) -> Result<FleetSnapshot, SourceError> {
    let rev = rev.unwrap_or("HEAD");
    if rev == "HEAD"
        && let Err(err) = repository.head()
        && err.code() == git2::ErrorCode::UnbornBranch
    {
        return Err(SourceError::NoCommit {
            repo: repository
                .workdir()
                .unwrap_or_else(|| repository.path())
                .display()
                .to_string(),
        });
    }
    match snapshot_of_rev_within(repository, rev, subpath, limits) {
        Err(SourceError::NoSuchPath {
            path: missing,
            revision,
            ..
        }) => {
            let on_disk = checked_subpath(path)
                .map(|parts| {
                    parts
                        .iter()
                        .fold(repo.to_path_buf(), |p, part| p.join(part))
                })
                .is_ok_and(|folder| folder.is_dir());
            let hint = if on_disk && repository.workdir().is_some() {
                "; it is on disk but not in that commit: commit it, or add --worktree to read the files on disk".to_string()
            } else {
                String::new()
            };
            Err(SourceError::NoSuchPath {
                path: missing,
                revision,
                hint,
            })
        }
        other => other,
    }
}

fn folder_name(repo: &Path, subpath: &str) -> String {
    let root = checked_subpath(subpath)
        .unwrap_or_default()
        .iter()
        .fold(repo.to_path_buf(), |p, part| p.join(part));
    root.canonicalize().unwrap_or(root).display().to_string()
}

fn git_name(repository: &Repository, subpath: &str, revision: &str) -> String {
    let top = repository.workdir().unwrap_or_else(|| repository.path());
    let top = top.display().to_string();
    let top = top.trim_end_matches('/');
    if subpath.is_empty() {
        format!("{top} at {revision}")
    } else {
        format!("{top}/{subpath} at {revision}")
    }
}

/// A fleet needs at least one cluster file; without one, `--repo` or `--path` is
/// almost certainly wrong, and a CI job that checks nothing must not pass.
fn require_clusters(snapshot: &FleetSnapshot, looked: String) -> Result<(), SourceError> {
    let is_cluster = |path: &str| path.starts_with("clusters/");
    let found = snapshot.files.keys().any(|path| is_cluster(path))
        || snapshot
            .problems
            .iter()
            .any(|problem| problem.file.as_deref().is_some_and(is_cluster));
    if found {
        Ok(())
    } else {
        Err(SourceError::NoClusters {
            looked,
            hint: String::new(),
        })
    }
}

/// How a fleet file on disk differs from the commit that was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DiskChange {
    Modified,
    New,
    Deleted,
}

impl DiskChange {
    /// The word `git status` uses.
    pub fn label(self) -> &'static str {
        match self {
            DiskChange::Modified => "modified:",
            DiskChange::New => "new file:",
            DiskChange::Deleted => "deleted:",
        }
    }
}

/// The files of the fleet root (paths relative to it; hidden folders aside) whose content
/// on disk differs from the commit that [`read`] reads for `location`, when that
/// commit is the one `HEAD` points at in a work tree: edits, staged or not, new files and deleted ones,
/// as `git status` sees them (ignored files are left out). `None` when the question
/// does not arise (files on disk were read, a bare repository, another revision).
pub fn disk_changes(location: &Location) -> Result<Option<Vec<(DiskChange, String)>>, SourceError> {
    if location.worktree {
        return Ok(None);
    }
    let Root::Git {
        repository,
        subpath,
    } = locate(&location.repo, &location.path)?
    else {
        return Ok(None);
    };
    if repository.is_bare() || repository.workdir().is_none() {
        return Ok(None);
    }
    let Ok(head) = resolve(&repository, "HEAD") else {
        return Ok(None);
    };
    if let Some(rev) = &location.rev
        && resolve(&repository, rev).ok() != Some(head)
    {
        return Ok(None);
    }
    let mut options = git2::StatusOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    if !subpath.is_empty() {
        options.pathspec(&subpath);
    }
    let statuses = repository
        .statuses(Some(&mut options))
        .map_err(|err| SourceError::Git {
            repo: repository.path().display().to_string(),
            message: err.message().to_string(),
        })?;
    let prefix = if subpath.is_empty() {
        String::new()
    } else {
        format!("{subpath}/")
    };
    let mut changes = Vec::new();
    for entry in statuses.iter() {
        let Ok(path) = entry.path() else { continue };
        let Some(relative) = path.strip_prefix(prefix.as_str()) else {
            continue;
        };
        // Every file of the fleet root counts, not only those read by their path: a
        // chart's files (its `.helmignore` too), a values file, a kustomization's
        // `.env`, `tenants/rules.signed.json`. Hidden folders are not read.
        let folders = relative.rsplit_once('/').map_or("", |(folders, _)| folders);
        if folders.split('/').any(|part| part.starts_with('.')) {
            continue;
        }
        if let Some(change) = change_of(entry.status()) {
            changes.push((change, relative.to_string()));
        }
    }
    changes.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(Some(changes))
}

/// A `git status` entry as a difference between the commit and the disk.
fn change_of(status: git2::Status) -> Option<DiskChange> {
    use git2::Status;
    let in_commit = !status.intersects(Status::INDEX_NEW | Status::WT_NEW)
        || status.contains(Status::INDEX_DELETED | Status::WT_NEW);
    // Deleted on disk, or removed with `git rm` (and not put back as a new file).
    let gone = status.contains(Status::WT_DELETED)
        || (status.contains(Status::INDEX_DELETED) && !status.contains(Status::WT_NEW));
    let on_disk = !gone;
    match (in_commit, on_disk) {
        (false, true) => Some(DiskChange::New),
        (true, false) => Some(DiskChange::Deleted),
        (false, false) => None,
        (true, true) if status.is_empty() || status == Status::CURRENT => None,
        (true, true) => Some(DiskChange::Modified),
    }
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
    fn git_status_entries_say_how_the_disk_differs_from_the_commit() {
        use git2::Status;
        let check = |status: Status, expect: Option<DiskChange>| {
            assert_eq!(change_of(status), expect, "{status:?}");
        };
        check(Status::WT_MODIFIED, Some(DiskChange::Modified));
        check(Status::INDEX_MODIFIED, Some(DiskChange::Modified));
        check(Status::WT_NEW, Some(DiskChange::New));
        check(Status::INDEX_NEW, Some(DiskChange::New));
        check(Status::WT_DELETED, Some(DiskChange::Deleted));
        check(Status::INDEX_DELETED, Some(DiskChange::Deleted));
        // Staged as new, then deleted: neither in the commit nor on disk.
        check(Status::INDEX_NEW | Status::WT_DELETED, None);
        // `git rm --cached`: in the commit and still on disk.
        check(
            Status::INDEX_DELETED | Status::WT_NEW,
            Some(DiskChange::Modified),
        );
        check(Status::CURRENT, None);
    }

    /// Commits `files` (path, content; `None` removes) on top of `parent`.
    fn commit(
        repo: &Repository,
        parent: Option<git2::Oid>,
        files: &[(&str, Option<&[u8]>)],
    ) -> git2::Oid {
        let mut index = repo.index().expect("index");
        if let Some(parent) = parent {
            let tree = repo
                .find_commit(parent)
                .expect("parent")
                .tree()
                .expect("tree");
            index.read_tree(&tree).expect("read tree");
        }
        for (path, content) in files {
            match content {
                Some(content) => {
                    let blob = repo.blob(content).expect("blob");
                    let entry = git2::IndexEntry {
                        ctime: git2::IndexTime::new(0, 0),
                        mtime: git2::IndexTime::new(0, 0),
                        dev: 0,
                        ino: 0,
                        mode: 0o100644,
                        uid: 0,
                        gid: 0,
                        file_size: content.len() as u32,
                        id: blob,
                        flags: 0,
                        flags_extended: 0,
                        path: path.as_bytes().to_vec(),
                    };
                    index.add(&entry).expect("add");
                }
                None => index.remove_path(Path::new(path)).expect("remove"),
            }
        }
        let tree = repo
            .find_tree(index.write_tree_to(repo).expect("tree"))
            .expect("tree");
        let who = git2::Signature::now("flotilla test", "test@flotilla.invalid").expect("sig");
        let parents: Vec<git2::Commit<'_>> = parent
            .map(|p| repo.find_commit(p).expect("parent"))
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
        repo.commit(None, &who, &who, "test", &tree, &parents)
            .expect("commit")
    }

    #[test]
    fn a_snapshot_reusing_the_last_ones_texts_is_the_one_read_afresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init_bare(dir.path()).expect("init");
        let cluster = |site: &str| {
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: a\nspec:\n  vars:\n    site: {site}\n"
            )
        };
        let first = commit(
            &repo,
            None,
            &[
                ("clusters/a.yaml", Some(cluster("1").as_bytes())),
                ("clusters/b.yaml", Some(b"same: text\n")),
                ("clusters/c.yaml", Some(b"same: text\n")),
                ("notes/binary.bin", Some(&[0xff, 0xfe, 0x00])),
                ("README.md", Some(b"readme\n")),
            ],
        );
        let second = commit(
            &repo,
            Some(first),
            &[
                ("clusters/a.yaml", Some(cluster("2").as_bytes())),
                ("README.md", None),
                ("clusters/d.yaml", Some(b"same: text\n")),
            ],
        );
        let limits = Limits::default();
        let mut texts = BlobTexts::default();
        let before = snapshot_of_commit_reusing(&repo, first, "main", "", &limits, &mut texts)
            .expect("read");
        // Text blobs only (the binary one is skipped, not kept); one per blob.
        assert_eq!(texts.len(), 3);
        let after = snapshot_of_commit_reusing(&repo, second, "main", "", &limits, &mut texts)
            .expect("read");
        let fresh = snapshot_of_commit_within(&repo, second, "main", "", &limits).expect("read");
        assert_eq!(after.files, fresh.files);
        assert_eq!(after.skipped, fresh.skipped);
        assert_eq!(after.problems, fresh.problems);
        assert_eq!(after.revision, fresh.revision);
        // Paths to one blob share its text; an unchanged blob is the last snapshot's
        // text, even at a new path.
        assert!(Arc::ptr_eq(
            &before.files["clusters/b.yaml"],
            &before.files["clusters/c.yaml"]
        ));
        assert!(Arc::ptr_eq(
            &before.files["clusters/b.yaml"],
            &after.files["clusters/d.yaml"]
        ));
        assert!(Arc::ptr_eq(
            &before.files["clusters/c.yaml"],
            &after.files["clusters/c.yaml"]
        ));
        assert!(after.files["clusters/a.yaml"].contains("site: 2"));
        // Only this commit's texts are kept for the next one.
        assert_eq!(texts.len(), 2);

        // The fleet's budget counts every path, taken from the last snapshot or not.
        let tight = Limits {
            max_fleet_bytes: fresh.files.values().map(|t| t.len() as u64).sum::<u64>() - 1,
            ..Limits::default()
        };
        let mut texts = BlobTexts::default();
        snapshot_of_commit_reusing(&repo, first, "main", "", &limits, &mut texts).expect("read");
        let reused = snapshot_of_commit_reusing(&repo, second, "main", "", &tight, &mut texts)
            .expect("read");
        let fresh = snapshot_of_commit_within(&repo, second, "main", "", &tight).expect("read");
        assert!(!fresh.problems.is_empty());
        assert_eq!(reused.problems, fresh.problems);
        assert_eq!(reused.files, fresh.files);
    }

    /// Writes a tree object as given, entry by entry (mode, name, id), without the
    /// checks git2's tree builder and `git mktree` make on names.
    fn raw_tree(repo: &Repository, entries: &[(&str, &[u8], git2::Oid)]) -> git2::Oid {
        let mut bytes = Vec::new();
        for (mode, name, id) in entries {
            bytes.extend_from_slice(mode.as_bytes());
            bytes.push(b' ');
            bytes.extend_from_slice(name);
            bytes.push(0);
            bytes.extend_from_slice(id.as_bytes());
        }
        repo.odb()
            .expect("odb")
            .write(ObjectType::Tree, &bytes)
            .expect("write tree")
    }

    #[test]
    fn trees_with_entries_git_fsck_refuses_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init_bare(dir.path()).expect("init");
        let cluster = repo
            .blob(b"apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: a\n")
            .expect("blob");
        let planted = repo.blob(b"planted: true\n").expect("blob");
        let clusters = raw_tree(&repo, &[("100644", b"a.yaml", cluster)]);
        let root = raw_tree(
            &repo,
            &[
                ("40000", b"..", clusters),
                ("100644", b".GIT", planted),
                ("40000", b"clusters", clusters),
                ("100644", b"clusters/b.yaml", planted),
            ],
        );
        let tree = repo.find_tree(root).expect("tree");
        let who = git2::Signature::now("flotilla test", "test@flotilla.invalid").expect("sig");
        let commit = repo
            .commit(None, &who, &who, "test", &tree, &[])
            .expect("commit");
        let snapshot =
            snapshot_of_commit_within(&repo, commit, "main", "", &Limits::default()).expect("read");
        // The entry with a slash is not read as a file of a folder it is not in.
        assert!(!snapshot.files.contains_key("clusters/b.yaml"));
        assert!(snapshot.files.contains_key("clusters/a.yaml"));
        let problems: Vec<String> = snapshot.problems.iter().map(|p| p.to_string()).collect();
        for (name, reason) in [
            ("\"..\"", "a name for a folder itself or the one above it"),
            ("\".GIT\"", "the name of Git's own folder"),
            ("\"clusters/b.yaml\"", "a name holding '/'"),
        ] {
            let expected = format!(
                ".: the Git tree holds an entry named {name} ({reason}), which `git fsck` \
                 refuses; it was not read and this commit is not rendered"
            );
            assert!(
                problems.contains(&expected),
                "{expected}\nnot in {problems:#?}"
            );
        }
        assert!(snapshot.problems.iter().all(Diagnostic::is_error));
        assert_eq!(problems.len(), 3, "{problems:#?}");
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
