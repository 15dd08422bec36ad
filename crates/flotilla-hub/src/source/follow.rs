//! What the hub needs to follow a repository: which kind of thing `--repo` names,
//! the commit a branch points at, a snapshot of that commit, the paths to watch for
//! new commits, and a bare mirror of a remote repository (through the `git` command,
//! since git2 here is built without network support).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::{BlobTexts, SourceError, open_repository, resolve, snapshot_of_commit_reusing};
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;

/// What `--repo` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepoKind {
    /// A Git repository on this machine (a work tree or a bare repository).
    Git,
    /// A plain folder, read as it is on disk.
    Folder,
}

/// Whether `repo` is a remote repository URL rather than a path: `https://…`,
/// `ssh://…`, `git://…`, `file://…`, or the `user@host:path` form.
pub fn is_remote(repo: &str) -> bool {
    if repo.contains("://") {
        return true;
    }
    // user@host:path, the short SSH form, but not a Windows drive or a local path.
    match (repo.find('@'), repo.find(':'), repo.find('/')) {
        (Some(at), Some(colon), slash) => at < colon && slash.is_none_or(|s| colon < s),
        _ => false,
    }
}

/// A local `--repo` and `--path` as the hub follows them: the folder to read or
/// the repository to follow, and the fleet root inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalSource {
    pub kind: RepoKind,
    /// The folder (for [`RepoKind::Folder`]) or the repository's top folder.
    pub root: PathBuf,
    /// The fleet root inside `root`.
    pub subpath: String,
}

/// Where a local source is, by the rule `flotilla render` reads by: a path inside a
/// Git work tree follows that repository's commits (so `--repo fleet` and `--repo .
/// --path fleet` follow the same thing); a folder in no repository, or any folder with
/// `worktree`, is read from disk. A repository Git refuses for its owner is an error.
pub fn local_source(
    repo: &Path,
    subpath: &str,
    worktree: bool,
) -> Result<LocalSource, SourceError> {
    let folder = || LocalSource {
        kind: RepoKind::Folder,
        root: repo.to_path_buf(),
        subpath: subpath.to_string(),
    };
    if worktree {
        super::checked_subpath(subpath)?;
        return Ok(folder());
    }
    match super::locate(repo, subpath)? {
        super::Root::Folder { .. } => Ok(folder()),
        super::Root::Git {
            repository,
            subpath,
        } => Ok(LocalSource {
            kind: RepoKind::Git,
            root: repository
                .workdir()
                .unwrap_or_else(|| repository.path())
                .to_path_buf(),
            subpath,
        }),
    }
}

/// A branch tip: the name to show and the commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tip {
    pub label: String,
    pub commit: String,
}

impl Tip {
    /// `<branch>@sha1:<commit>`, the revision written into bundles.
    pub fn revision(&self) -> String {
        format!("{}@sha1:{}", self.label, self.commit)
    }
}

/// The commit `branch` points at (`HEAD` when no branch is given).
pub fn tip(repo_path: &Path, branch: Option<&str>) -> Result<Tip, SourceError> {
    let repo = open_repository(repo_path)?;
    match branch {
        Some(branch) => {
            let oid = resolve(&repo, &format!("refs/heads/{branch}"))?;
            Ok(Tip {
                label: branch.to_string(),
                commit: oid.to_string(),
            })
        }
        None => {
            let oid = resolve(&repo, "HEAD")?;
            let label = repo
                .head()
                .ok()
                .and_then(|h| h.shorthand().ok().map(str::to_string))
                .unwrap_or_else(|| "HEAD".to_string());
            Ok(Tip {
                label,
                commit: oid.to_string(),
            })
        }
    }
}

/// The message of the commit at a tip (for the `Flotilla-Rollout` trailer).
pub fn commit_message(repo_path: &Path, tip: &Tip) -> Result<String, SourceError> {
    let repo = open_repository(repo_path)?;
    let git_error = |err: git2::Error| SourceError::Git {
        repo: repo_path.display().to_string(),
        message: err.message().to_string(),
    };
    let oid = git2::Oid::from_str(&tip.commit).map_err(git_error)?;
    let commit = repo.find_commit(oid).map_err(git_error)?;
    Ok(String::from_utf8_lossy(commit.message_bytes()).into_owned())
}

/// A commit as people read it: the first line of its message and who wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitText {
    /// The first line of the message, trimmed (at most [`MAX_SUBJECT_CHARS`]).
    pub subject: String,
    pub author: String,
    pub author_email: String,
}

/// The longest subject kept; a longer one ends in `…`.
pub const MAX_SUBJECT_CHARS: usize = 200;

/// The subject and author of `commit` (40 hex digits) in the repository at `repo_path`.
pub fn commit_text(repo_path: &Path, commit: &str) -> Result<CommitText, SourceError> {
    let repo = open_repository(repo_path)?;
    let git_error = |err: git2::Error| SourceError::Git {
        repo: repo_path.display().to_string(),
        message: err.message().to_string(),
    };
    let oid = git2::Oid::from_str(commit).map_err(git_error)?;
    let found = repo.find_commit(oid).map_err(git_error)?;
    let message = String::from_utf8_lossy(found.message_bytes());
    let first = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut subject: String = first.chars().take(MAX_SUBJECT_CHARS).collect();
    if first.chars().count() > MAX_SUBJECT_CHARS {
        subject.push('…');
    }
    let author = found.author();
    Ok(CommitText {
        subject,
        author: String::from_utf8_lossy(author.name_bytes()).into_owned(),
        author_email: String::from_utf8_lossy(author.email_bytes()).into_owned(),
    })
}

/// The fleet files of a commit, within `limits`, taking from `texts` the files whose
/// blobs it holds (see [`BlobTexts`]); `texts` then holds this commit's.
pub fn snapshot_at_reusing(
    repo_path: &Path,
    tip: &Tip,
    subpath: &str,
    limits: &Limits,
    texts: &mut BlobTexts,
) -> Result<FleetSnapshot, SourceError> {
    let repo = open_repository(repo_path)?;
    let oid = git2::Oid::from_str(&tip.commit).map_err(|err| SourceError::Git {
        repo: repo_path.display().to_string(),
        message: err.message().to_string(),
    })?;
    snapshot_of_commit_reusing(&repo, oid, &tip.label, subpath, limits, texts)
}

/// What to watch so that a new commit, a branch switch or a `git gc` is seen: the Git
/// folder itself (HEAD), the common folder (packed-refs) and its refs, recursively.
/// Each entry is (path, recursive).
pub fn watch_paths(repo_path: &Path) -> Result<Vec<(PathBuf, bool)>, SourceError> {
    let repo = open_repository(repo_path)?;
    let git_dir = repo.path().to_path_buf();
    let common = repo.commondir().to_path_buf();
    let mut paths = vec![(git_dir.clone(), false)];
    if common != git_dir {
        paths.push((common.clone(), false));
    }
    let refs = common.join("refs");
    if refs.is_dir() {
        paths.push((refs, true));
    }
    Ok(paths)
}

/// Keeps a bare mirror of `url` at `mirror`: clones it the first time, fetches every
/// branch after that. Gives up after `timeout`.
pub async fn mirror(url: &str, mirror: &Path, timeout: Duration) -> Result<(), SourceError> {
    if mirror.join("HEAD").is_file() {
        run_git(
            &[
                "-C",
                &mirror.display().to_string(),
                "remote",
                "set-url",
                "origin",
                url,
            ],
            timeout,
        )
        .await?;
        run_git(
            &[
                "-C",
                &mirror.display().to_string(),
                "fetch",
                "--prune",
                "--quiet",
                "origin",
                "+refs/heads/*:refs/heads/*",
            ],
            timeout,
        )
        .await
    } else {
        let partial = mirror.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        if let Some(parent) = mirror.parent() {
            std::fs::create_dir_all(parent).map_err(|err| SourceError::Io {
                path: parent.display().to_string(),
                message: err.to_string(),
            })?;
        }
        run_git(
            &[
                "clone",
                "--bare",
                "--quiet",
                "--",
                url,
                &partial.display().to_string(),
            ],
            timeout,
        )
        .await?;
        std::fs::rename(&partial, mirror).map_err(|err| SourceError::Io {
            path: mirror.display().to_string(),
            message: err.to_string(),
        })
    }
}

async fn run_git(args: &[&str], timeout: Duration) -> Result<(), SourceError> {
    let shown = format!("git {}", args.join(" "));
    let child = tokio::process::Command::new("git")
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| SourceError::Git {
            repo: shown.clone(),
            message: format!("cannot run git ({err}); install Git to follow a remote repository"),
        })?;
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| SourceError::Git {
            repo: shown.clone(),
            message: format!("gave up after {}", humantime::format_duration(timeout)),
        })?
        .map_err(|err| SourceError::Git {
            repo: shown.clone(),
            message: err.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(SourceError::Git {
            repo: shown,
            message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_urls_from_paths() {
        assert!(is_remote("https://example.invalid/fleet.git"));
        assert!(is_remote("file:///srv/fleet.git"));
        assert!(is_remote("git@example.invalid:org/fleet.git"));
        assert!(!is_remote("fleet-example"));
        assert!(!is_remote("/srv/fleet"));
        assert!(!is_remote("./a@b/c:d"));
    }

    #[test]
    fn a_commit_is_told_by_its_first_line_and_its_author() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init_bare(dir.path()).expect("init");
        let tree = repo
            .find_tree(
                repo.treebuilder(None)
                    .expect("builder")
                    .write()
                    .expect("tree"),
            )
            .expect("tree");
        let author =
            git2::Signature::now("platform team", "platform@example.invalid").expect("sig");
        let committer = git2::Signature::now("a bot", "bot@example.invalid").expect("sig");
        let commit = |message: &str| {
            repo.commit(None, &author, &committer, message, &tree, &[])
                .expect("commit")
                .to_string()
        };
        let text = commit_text(
            dir.path(),
            &commit("\n  Raise the shop's replicas  \n\nBecause the sale starts.\n"),
        )
        .expect("read");
        assert_eq!(
            text,
            CommitText {
                subject: "Raise the shop's replicas".into(),
                author: "platform team".into(),
                author_email: "platform@example.invalid".into(),
            }
        );
        let long =
            commit_text(dir.path(), &commit(&"x".repeat(MAX_SUBJECT_CHARS + 1))).expect("read");
        assert_eq!(long.subject, format!("{}…", "x".repeat(MAX_SUBJECT_CHARS)));
        assert!(
            commit_text(dir.path(), &"0".repeat(40)).is_err(),
            "an unknown commit"
        );
    }
}
