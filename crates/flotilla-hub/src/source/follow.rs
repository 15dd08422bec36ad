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

/// A remote repository's URL with its credentials taken out: git is given the URL
/// without them (so they are never in its arguments, where `ps` shows them, in the
/// mirror's `config`, or in any message that quotes the URL), and the credentials
/// through a helper that answers only the URL's own protocol and host.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The URL without user name or password: what git is given and what is shown.
    pub shown: String,
    credentials: Option<HttpCredentials>,
}

#[derive(Clone, PartialEq, Eq)]
struct HttpCredentials {
    protocol: String,
    /// As git names it to a helper: the host, with the port when it is not the
    /// scheme's own.
    host: String,
    username: String,
    password: String,
}

impl std::fmt::Debug for RemoteUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteUrl")
            .field("shown", &self.shown)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<hidden>"),
            )
            .finish()
    }
}

/// The helper git asks for credentials (`!` runs it with the shell, the action
/// appended): it answers `get` for the protocol and host of the URL only, so a
/// redirect to another host gets nothing.
const CREDENTIAL_HELPER: &str = "!f() { test \"$1\" = get || exit 0; p=; h=; \
    while IFS= read -r l; do case \"$l\" in protocol=*) p=${l#protocol=};; host=*) h=${l#host=};; esac; done; \
    if [ \"$p\" = \"$FLOTILLA_GIT_PROTOCOL\" ] && [ \"$h\" = \"$FLOTILLA_GIT_HOST\" ]; then \
    printf 'username=%s\\npassword=%s\\n' \"$FLOTILLA_GIT_USERNAME\" \"$FLOTILLA_GIT_PASSWORD\"; fi; }; f";

impl RemoteUrl {
    /// Takes the user name and password out of an `http://` or `https://` URL (and
    /// the password out of any other URL that has one); other URLs stay as they are.
    pub fn parse(url: &str) -> RemoteUrl {
        let unchanged = || RemoteUrl {
            shown: url.to_string(),
            credentials: None,
        };
        let Ok(mut parsed) = url::Url::parse(url) else {
            return unchanged();
        };
        let http = matches!(parsed.scheme(), "http" | "https");
        let has_user = http && !parsed.username().is_empty();
        if parsed.password().is_none() && !has_user {
            return unchanged();
        }
        let credentials = http.then(|| HttpCredentials {
            protocol: parsed.scheme().to_string(),
            host: match parsed.port() {
                Some(port) => format!("{}:{port}", parsed.host_str().unwrap_or_default()),
                None => parsed.host_str().unwrap_or_default().to_string(),
            },
            username: percent_decoded(parsed.username()),
            password: parsed.password().map(percent_decoded).unwrap_or_default(),
        });
        let _ = parsed.set_password(None);
        if http {
            let _ = parsed.set_username("");
        }
        RemoteUrl {
            shown: parsed.to_string(),
            credentials,
        }
    }

    /// The environment that gives git the credentials: its list of credential
    /// helpers emptied (so none of the machine's answers first) and this one added.
    /// Settings the hub's own environment gives git (`GIT_CONFIG_COUNT` and its
    /// pairs, a private CA's `http.sslCAInfo`, say) are kept: these two come after.
    fn git_env(&self) -> Vec<(String, String)> {
        let Some(c) = &self.credentials else {
            return Vec::new();
        };
        let given: usize = std::env::var("GIT_CONFIG_COUNT")
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        vec![
            ("GIT_CONFIG_COUNT".into(), (given + 2).to_string()),
            (
                format!("GIT_CONFIG_KEY_{given}"),
                "credential.helper".into(),
            ),
            (format!("GIT_CONFIG_VALUE_{given}"), String::new()),
            (
                format!("GIT_CONFIG_KEY_{}", given + 1),
                "credential.helper".into(),
            ),
            (
                format!("GIT_CONFIG_VALUE_{}", given + 1),
                CREDENTIAL_HELPER.into(),
            ),
            ("FLOTILLA_GIT_PROTOCOL".into(), c.protocol.clone()),
            ("FLOTILLA_GIT_HOST".into(), c.host.clone()),
            ("FLOTILLA_GIT_USERNAME".into(), c.username.clone()),
            ("FLOTILLA_GIT_PASSWORD".into(), c.password.clone()),
        ]
    }
}

/// `%XX` sequences decoded (a URL's user name and password are percent-encoded).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Keeps a bare mirror of `url` at `mirror`: clones it the first time, fetches every
/// branch after that. Gives up after `timeout`. Credentials in the URL reach git
/// only through [`RemoteUrl`]'s helper.
pub async fn mirror(url: &str, mirror: &Path, timeout: Duration) -> Result<(), SourceError> {
    let remote = RemoteUrl::parse(url);
    let env = remote.git_env();
    let url = remote.shown.as_str();
    if mirror.join("HEAD").is_file() {
        remove_stale_locks(mirror);
        run_git(
            &[
                "-C",
                &mirror.display().to_string(),
                "remote",
                "set-url",
                "origin",
                url,
            ],
            &env,
            timeout,
        )
        .await?;
        run_git(
            &[
                "-C",
                &mirror.display().to_string(),
                // A `gc --auto` the fetch starts runs within it, not left running
                // after it, holding locks the next fetch would meet.
                "-c",
                "gc.autoDetach=false",
                "-c",
                "maintenance.autoDetach=false",
                "fetch",
                "--prune",
                "--quiet",
                "origin",
                "+refs/heads/*:refs/heads/*",
            ],
            &env,
            timeout,
        )
        .await?;
        follow_remote_head(mirror, &env, timeout).await
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
            &env,
            timeout,
        )
        .await?;
        // A mirror folder without HEAD is no repository (a clone cut short before
        // this one, by hand or by a full disk): it is replaced.
        if mirror.exists() {
            let _ = std::fs::remove_dir_all(mirror);
        }
        std::fs::rename(&partial, mirror).map_err(|err| SourceError::Io {
            path: mirror.display().to_string(),
            message: err.to_string(),
        })
    }
}

/// Removes the lock files a git killed in the middle of a fetch leaves in the mirror
/// (its refs, `packed-refs`, `config`, `HEAD`), which would otherwise fail every
/// later fetch. Only the hub's follower runs git on the mirror, one command at a
/// time, and the state dir is the hub's alone: no lock here is another's.
fn remove_stale_locks(mirror: &Path) {
    for name in [
        "HEAD.lock",
        "config.lock",
        "packed-refs.lock",
        "shallow.lock",
    ] {
        let _ = std::fs::remove_file(mirror.join(name));
    }
    let mut folders = vec![mirror.join("refs")];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => folders.push(path),
                Ok(_) if path.extension().is_some_and(|e| e == "lock") => {
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
    }
}

/// Points the mirror's HEAD at the remote's default branch, as the remote names it
/// now: the mirror's HEAD is set once by the clone, and a hub following HEAD (no
/// `--branch`) would otherwise follow a renamed default branch's old name, and stop
/// for good once `--prune` removed it. A remote that names no HEAD leaves it as it is.
async fn follow_remote_head(
    mirror: &Path,
    env: &[(String, String)],
    timeout: Duration,
) -> Result<(), SourceError> {
    let folder = mirror.display().to_string();
    let listed = run_git(
        &["-C", &folder, "ls-remote", "--symref", "origin", "HEAD"],
        env,
        timeout,
    )
    .await?;
    let Some(branch) = listed.lines().find_map(|line| {
        let (target, name) = line.strip_prefix("ref: ")?.split_once('\t')?;
        (name == "HEAD" && target.starts_with("refs/heads/")).then_some(target)
    }) else {
        return Ok(());
    };
    let current = run_git(&["-C", &folder, "symbolic-ref", "HEAD"], env, timeout).await?;
    if current.trim() != branch {
        run_git(
            &["-C", &folder, "symbolic-ref", "HEAD", branch],
            env,
            timeout,
        )
        .await?;
    }
    Ok(())
}

/// What keeps ssh (a remote `ssh://` or `git@host:` URL) from asking anything on the
/// terminal the hub was started from: an unknown host key, or a key's passphrase,
/// held a fetch for its whole timeout while ssh waited for an answer on `/dev/tty`.
/// With `SSH_ASKPASS_REQUIRE=force` ssh asks its askpass program instead, `false`
/// unless the environment names one, so an unknown host fails at once ("Host key
/// verification failed"). An environment that sets `SSH_ASKPASS_REQUIRE` itself is
/// left as it is.
fn no_ssh_prompt() -> Vec<(&'static str, String)> {
    if std::env::var_os("SSH_ASKPASS_REQUIRE").is_some() {
        return Vec::new();
    }
    let mut env = vec![("SSH_ASKPASS_REQUIRE", "force".to_string())];
    if std::env::var_os("SSH_ASKPASS").is_none() {
        env.push(("SSH_ASKPASS", "false".to_string()));
    }
    env
}

/// Runs git; its standard output.
async fn run_git(
    args: &[&str],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<String, SourceError> {
    let shown = format!("git {}", args.join(" "));
    let child = tokio::process::Command::new("git")
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("GIT_TERMINAL_PROMPT", "0")
        .envs(no_ssh_prompt())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
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
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
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
    fn credentials_are_taken_out_of_a_remote_url() {
        let remote =
            RemoteUrl::parse("https://robot:s%40cret@git.example.invalid:8443/org/fleet.git");
        assert_eq!(
            remote.shown,
            "https://git.example.invalid:8443/org/fleet.git"
        );
        let env = remote.git_env();
        let value = |key: &str| env.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str());
        assert_eq!(value("FLOTILLA_GIT_HOST"), Some("git.example.invalid:8443"));
        assert_eq!(value("FLOTILLA_GIT_USERNAME"), Some("robot"));
        assert_eq!(value("FLOTILLA_GIT_PASSWORD"), Some("s@cret"));
        assert_eq!(value("FLOTILLA_GIT_PROTOCOL"), Some("https"));
        assert!(!format!("{remote:?}").contains("cret"));
        // A token as the user name; the scheme's own port is not named.
        let remote = RemoteUrl::parse("https://ghp_token@github.example.invalid/org/fleet.git");
        assert_eq!(remote.shown, "https://github.example.invalid/org/fleet.git");
        assert!(remote.git_env().contains(&(
            "FLOTILLA_GIT_HOST".to_string(),
            "github.example.invalid".into()
        )));
        // Nothing to take out: as given, and no helper.
        for url in [
            "https://git.example.invalid/org/fleet.git",
            "git@git.example.invalid:org/fleet.git",
            "ssh://git@git.example.invalid/org/fleet.git",
            "file:///srv/fleet.git",
        ] {
            let remote = RemoteUrl::parse(url);
            assert_eq!(remote.shown, url);
            assert!(remote.git_env().is_empty());
        }
        // An SSH URL's password is taken out (git cannot use it anyway).
        assert_eq!(
            RemoteUrl::parse("ssh://git:pw@git.example.invalid/org/fleet.git").shown,
            "ssh://git@git.example.invalid/org/fleet.git"
        );
    }

    /// A repository served over HTTP (git's dumb protocol: the files of a bare
    /// repository) by a server that wants HTTP basic credentials robot:s3cret.
    /// Its address and how many requests came with them.
    async fn private_http_repository(
        bare: std::path::PathBuf,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use axum::http::{HeaderMap, StatusCode};
        use axum::response::IntoResponse;
        use base64::Engine as _;
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("address").to_string();
        let wanted = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("robot:s3cret")
        );
        let authorized = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = authorized.clone();
        let app = axum::Router::new().route(
            "/fleet.git/{*path}",
            axum::routing::get(
                move |axum::extract::Path(path): axum::extract::Path<String>,
                      headers: HeaderMap| {
                    let (bare, wanted, counted) = (bare.clone(), wanted.clone(), counted.clone());
                    async move {
                        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
                        if given != Some(wanted.as_str()) {
                            return (
                                StatusCode::UNAUTHORIZED,
                                [("www-authenticate", "Basic realm=\"fleet\"")],
                            )
                                .into_response();
                        }
                        counted.fetch_add(1, Ordering::SeqCst);
                        if path.split('/').any(|part| part == "..") {
                            return StatusCode::NOT_FOUND.into_response();
                        }
                        match std::fs::read(bare.join(&path)) {
                            Ok(bytes) => bytes.into_response(),
                            Err(_) => StatusCode::NOT_FOUND.into_response(),
                        }
                    }
                },
            ),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        (address, authorized)
    }

    /// Whether git cannot be run here; says the test skips, if so.
    fn git_missing() -> bool {
        let missing = std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_err();
        if missing {
            eprintln!("SKIPPED: git is not installed; this test runs git itself");
        }
        missing
    }

    /// ssh, run by git for an `ssh://` remote, is told to ask its askpass program (which
    /// refuses) rather than the terminal: an unknown host key fails the fetch at once
    /// instead of holding it until its timeout. The ssh here is a script that records
    /// what it is given and refuses, as ssh does when its askpass answers no.
    #[tokio::test]
    async fn ssh_asks_nothing_on_the_terminal() {
        if git_missing() {
            return;
        }
        if std::env::var_os("SSH_ASKPASS_REQUIRE").is_some() {
            eprintln!(
                "SKIPPED: this environment sets SSH_ASKPASS_REQUIRE itself, which the hub keeps"
            );
            return;
        }
        let work = tempfile::tempdir().expect("tempdir");
        let seen = work.path().join("seen");
        let ssh = work.path().join("ssh");
        std::fs::write(
            &ssh,
            format!(
                "#!/bin/sh\nprintf '%s|%s\\n' \"$SSH_ASKPASS_REQUIRE\" \"$SSH_ASKPASS\" > '{}'\n\
                 echo 'Host key verification failed.' >&2\nexit 255\n",
                seen.display()
            ),
        )
        .expect("script");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let env = vec![("GIT_SSH_COMMAND".to_string(), ssh.display().to_string())];
        let err = run_git(
            &["ls-remote", "ssh://git.example.invalid/fleet.git"],
            &env,
            Duration::from_secs(20),
        )
        .await
        .expect_err("refused");
        assert!(
            err.to_string().contains("Host key verification failed"),
            "{err}"
        );
        let recorded = std::fs::read_to_string(&seen).expect("ssh ran");
        let askpass = std::env::var("SSH_ASKPASS").unwrap_or_else(|_| "false".into());
        assert_eq!(recorded.trim(), format!("force|{askpass}"));
    }

    /// Credentials in the URL reach the server through git's credential helper, and
    /// never the mirror's configuration nor an error message.
    #[tokio::test]
    async fn a_private_repository_is_mirrored_without_its_credentials_anywhere() {
        if git_missing() {
            return;
        }
        let work = tempfile::tempdir().expect("tempdir");
        let source = work.path().join("source");
        let repo = git2::Repository::init(&source).expect("init");
        std::fs::write(source.join("README.md"), "fleet\n").expect("writes");
        let mut index = repo.index().expect("index");
        index.add_path(Path::new("README.md")).expect("adds");
        let tree = repo
            .find_tree(index.write_tree().expect("tree"))
            .expect("tree");
        let who = git2::Signature::now("platform team", "platform@example.invalid").expect("sig");
        repo.commit(Some("HEAD"), &who, &who, "first", &tree, &[])
            .expect("commit");
        let bare = work.path().join("fleet.git");
        let status = std::process::Command::new("git")
            .args(["clone", "--bare", "--quiet"])
            .arg(&source)
            .arg(&bare)
            .status()
            .expect("git runs");
        assert!(status.success());
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(&bare)
            .arg("update-server-info")
            .status()
            .expect("git runs");
        assert!(status.success());
        let (address, authorized) = private_http_repository(bare).await;

        let mirrored = work.path().join("state/repository.git");
        let url = format!("http://robot:s3cret@{address}/fleet.git");
        mirror(&url, &mirrored, Duration::from_secs(60))
            .await
            .expect("mirrors with the credentials");
        assert!(authorized.load(std::sync::atomic::Ordering::SeqCst) > 0);
        // Fetched again, from the mirror as it is now.
        mirror(&url, &mirrored, Duration::from_secs(60))
            .await
            .expect("fetches");
        let config = std::fs::read_to_string(mirrored.join("config")).expect("config");
        assert!(
            !config.contains("s3cret") && !config.contains("robot"),
            "{config}"
        );
        assert!(
            config.contains(&format!("http://{address}/fleet.git")),
            "{config}"
        );

        // A wrong password: refused, and no message quotes it.
        let err = mirror(
            &format!("http://robot:wr0ng@{address}/fleet.git"),
            &work.path().join("other/repository.git"),
            Duration::from_secs(60),
        )
        .await
        .expect_err("refused");
        assert!(!err.to_string().contains("wr0ng"), "{err}");
    }

    /// The remote renames its default branch: the mirror's HEAD follows it, so a hub
    /// following HEAD reads the new branch (and does not stop once the old is gone);
    /// the locks a killed fetch left do not stop the next one.
    #[tokio::test]
    async fn the_mirror_follows_the_remotes_default_branch_when_it_is_renamed() {
        let git = |dir: &Path, args: &[&str]| {
            let output = std::process::Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(args)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_SYSTEM", "/dev/null")
                .output();
            match output {
                Ok(output) if output.status.success() => Some(()),
                _ => None,
            }
        };
        let work = tempfile::tempdir().expect("tempdir");
        let source = work.path().join("source");
        std::fs::create_dir_all(&source).expect("creates");
        let commit = |message: &str| {
            git(
                &source,
                &[
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@example.invalid",
                    "commit",
                    "-q",
                    "-m",
                    message,
                ],
            )
        };
        let made = git(&source, &["init", "-q", "-b", "master"]).and_then(|()| {
            std::fs::write(source.join("a.txt"), "a\n").ok()?;
            git(&source, &["add", "-A"])?;
            commit("one")
        });
        if made.is_none() {
            eprintln!("SKIPPED: the git command is not available");
            return;
        }
        let remote = work.path().join("remote.git");
        let status = std::process::Command::new("git")
            .args(["clone", "--bare", "-q"])
            .arg(&source)
            .arg(&remote)
            .status()
            .expect("git runs");
        assert!(status.success());
        let url = format!("file://{}", remote.display());
        let mirrored = work.path().join("state/repository.git");
        mirror(&url, &mirrored, Duration::from_secs(60))
            .await
            .expect("clones");
        let first = tip(&mirrored, None).expect("a tip");

        // The remote's default branch becomes `main`, one commit ahead; `master` goes.
        std::fs::write(source.join("b.txt"), "b\n").expect("writes");
        assert!(git(&source, &["add", "-A"]).is_some());
        assert!(commit("two").is_some());
        let source_text = source.display().to_string();
        assert!(git(&remote, &["fetch", "-q", &source_text, "master:main"]).is_some());
        assert!(git(&remote, &["symbolic-ref", "HEAD", "refs/heads/main"]).is_some());
        assert!(git(&remote, &["branch", "-q", "-D", "master"]).is_some());
        // A git killed in the middle of the last fetch left its locks behind.
        for lock in ["refs/heads/master.lock", "packed-refs.lock", "config.lock"] {
            std::fs::write(mirrored.join(lock), "").expect("plants a lock");
        }

        mirror(&url, &mirrored, Duration::from_secs(60))
            .await
            .expect("fetches");
        let second = tip(&mirrored, None).expect("HEAD still resolves");
        assert_ne!(second.commit, first.commit);
        assert!(second.label.contains("main"), "{second:?}");
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
