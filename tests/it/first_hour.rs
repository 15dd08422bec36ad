//! What a newcomer and a platform engineer meet in their first hour, run through the
//! real `flotilla` binary, each case with its exact output and exit code: which files
//! `validate` reads in a Git repository (and the warning when the disk says something
//! else), a wrong path, a repository owned by another user, `token create > FILE`,
//! a state dir that does not exist, the agent's own variables, `--sink kube` without
//! a kubeconfig, the hub's front door, errors that name the next step, `init`'s
//! branch and CI job, an agent taking a fixed token file, and shell completions
//! piped into `head`.
//!
//! Machine-specific text (temporary paths, commit ids, token ids) is written as
//! `$NAME` in the expected output; [`Case::check`] puts it back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::hub::{Repo, Running, client, config, fleet_example};
use crate::support::process::{
    Background, free_port, http_status, http_status_as, start_flotilla, wait_for,
};

/// One run of the binary: the exit code and both streams.
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Where and how the binary runs, and the `$NAME`s its output may contain.
struct Case {
    cwd: PathBuf,
    env: Vec<(String, String)>,
    names: Vec<(String, String)>,
}

impl Case {
    fn new(cwd: &Path) -> Case {
        Case {
            cwd: cwd.to_path_buf(),
            env: Vec::new(),
            names: Vec::new(),
        }
    }

    /// Output text `value` is shown as `$name` in expectations.
    fn name(mut self, name: &str, value: impl Into<String>) -> Case {
        self.names.push((name.to_string(), value.into()));
        // Longer values first, so a path is not half-replaced by its prefix.
        self.names.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        self
    }

    fn env(mut self, key: &str, value: impl Into<String>) -> Case {
        self.env.push((key.to_string(), value.into()));
        self
    }

    fn run(&self, args: &[&str]) -> Outcome {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        command
            .args(args)
            .current_dir(&self.cwd)
            .env_remove("FLOTILLA_STATE_DIR")
            .env_remove("FLOTILLA_LISTEN")
            .env("NO_COLOR", "1");
        for key in std::env::vars().map(|(k, _)| k) {
            if key.starts_with("FLOTILLA_AGENT_") || key.starts_with("KUBERNETES_") {
                command.env_remove(key);
            }
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let output = command.output().expect("flotilla runs");
        Outcome {
            code: output.status.code().unwrap_or(-1),
            stdout: self.generalise(&String::from_utf8_lossy(&output.stdout)),
            stderr: self.generalise(&String::from_utf8_lossy(&output.stderr)),
        }
    }

    fn generalise(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (name, value) in &self.names {
            text = text.replace(value.as_str(), &format!("${name}"));
        }
        text
    }

    /// Runs `args` and asserts the exact exit code, standard output and standard error.
    fn check(&self, args: &[&str], code: i32, stdout: &str, stderr: &str) -> Outcome {
        let outcome = self.run(args);
        let shown = format!(
            "flotilla {}\n--- exit {}\n--- stdout\n{}--- stderr\n{}",
            args.join(" "),
            outcome.code,
            outcome.stdout,
            outcome.stderr
        );
        pretty_assertions::assert_eq!(
            (
                outcome.code,
                outcome.stdout.as_str(),
                outcome.stderr.as_str()
            ),
            (code, stdout, stderr),
            "{shown}"
        );
        outcome
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "flotilla tests")
        .env("GIT_AUTHOR_EMAIL", "tests@flotilla.invalid")
        .env("GIT_COMMITTER_NAME", "flotilla tests")
        .env("GIT_COMMITTER_EMAIL", "tests@flotilla.invalid")
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A Git repository (one commit on `main`) whose `fleet/` is fleet-example, and
/// the commit id.
fn repository_with_fleet_in_a_folder() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_tree(&fleet_example(), &dir.path().join("fleet"));
    std::fs::write(dir.path().join("README.md"), "a platform repository\n").expect("write");
    git(dir.path(), &["init", "--quiet", "--initial-branch=main"]);
    git(dir.path(), &["add", "--all"]);
    git(dir.path(), &["commit", "--quiet", "-m", "fleet"]);
    let commit = git(dir.path(), &["rev-parse", "HEAD"]);
    (dir, commit)
}

fn canonical(path: &Path) -> String {
    path.canonicalize()
        .expect("canonical path")
        .display()
        .to_string()
}

#[test]
fn validate_reads_the_commit_and_says_when_the_disk_differs() {
    let (repo, commit) = repository_with_fleet_in_a_folder();
    let fleet = repo.path().join("fleet");
    let red = std::fs::read_to_string(fleet.join("clusters/red.yaml")).expect("read");
    std::fs::write(
        fleet.join("clusters/red.yaml"),
        red.replace("kind: Cluster", "kind: Clustre"),
    )
    .expect("edit");
    std::fs::write(
        fleet.join("clusters/green.yaml"),
        red.replace("name: red", "name: green"),
    )
    .expect("add");
    std::fs::remove_file(fleet.join("groups/eu.yaml")).expect("delete");
    // A file the render reads without its path being a fleet file's (a chart's),
    // and one it does not read by name (signed tenant rules, say): both count.
    let values = fleet.join("charts/menu-board/values.yaml");
    let text = std::fs::read_to_string(&values).expect("read");
    std::fs::write(&values, format!("{text}# reviewed\n")).expect("edit");
    // A hidden file the chart loader reads.
    std::fs::write(fleet.join("charts/menu-board/.helmignore"), "# none\n").expect("add");
    std::fs::create_dir_all(fleet.join("tenants")).expect("mkdir");
    std::fs::write(fleet.join("tenants/notes.txt"), "signed later\n").expect("add");
    // Outside the fleet root: not the fleet's business.
    std::fs::write(repo.path().join("README.md"), "edited\n").expect("edit");

    let case = Case::new(repo.path()).name("COMMIT", &commit);
    let valid = "valid: 14 clusters rendered (main@sha1:$COMMIT), 0 warnings\n  Helm chart menu-board 0.3.1 (charts/menu-board): workload menu-board\n";
    let warning = "warning: 6 fleet files changed on disk are not in HEAD, which is what was read:\n\
                   \tnew file:   charts/menu-board/.helmignore\n\
                   \tmodified:   charts/menu-board/values.yaml\n\
                   \tnew file:   clusters/green.yaml\n\
                   \tmodified:   clusters/red.yaml\n\
                   \tdeleted:    groups/eu.yaml\n\
                   \tnew file:   tenants/notes.txt\n";
    // `--repo fleet` and `--repo . --path fleet` read the same commit, and both say
    // what differs and how to read it.
    case.check(
        &["validate", "--repo", "fleet"],
        0,
        valid,
        &format!("{warning}to read the files on disk: flotilla validate --repo fleet --worktree\n"),
    );
    case.check(
        &["validate", "--repo", ".", "--path", "fleet"],
        0,
        valid,
        &format!("{warning}to read the files on disk: flotilla validate --path fleet --worktree\n"),
    );
    // The command it names finds the error on disk.
    case.check(
        &["validate", "--repo", "fleet", "--worktree"],
        1,
        "",
        "clusters/red.yaml:5: expected apiVersion \"flotilla.dev/v1alpha1\" and kind \"Cluster\", found \"flotilla.dev/v1alpha1\" and \"Clustre\"\n\
         overlays/regions/menu-board-german.yaml:8: unknown group \"eu\"\n\
         overlays/regions/mirror-eu.yaml:10: unknown group \"eu\"\n\
         3 errors, 0 warnings: the fleet is invalid\n",
    );
    // `diff` without HEAD named compares with HEAD, and says the same.
    case.check(
        &["diff", "HEAD", "--path", "fleet", "--format", "json"],
        0,
        &case
            .run(&["diff", "HEAD", "--path", "fleet", "--format", "json"])
            .stdout,
        &format!(
            "{warning}to compare HEAD with the files on disk: flotilla diff HEAD --path fleet --worktree\n"
        ),
    );
    // Once committed, nothing differs and nothing is said.
    git(repo.path(), &["add", "--all"]);
    git(repo.path(), &["commit", "--quiet", "-m", "edits"]);
    let outcome = case.run(&["validate", "--repo", "fleet"]);
    assert_eq!(
        (outcome.code, outcome.stderr.contains("changed on disk")),
        (1, false)
    );
}

#[test]
fn a_wrong_path_is_an_error_that_says_where_it_looked() {
    let (repo, commit) = repository_with_fleet_in_a_folder();
    let empty = tempfile::tempdir().expect("temp dir");
    let case = Case::new(repo.path())
        .name("COMMIT", &commit)
        .name("REPO", canonical(repo.path()))
        .name("EMPTY", canonical(empty.path()));
    let fleet_root =
        "a fleet root holds clusters/, groups/, workloads/ and overlays/; check --repo and --path";
    let empty_arg = empty.path().display().to_string();
    case.check(
        &["validate", "--repo", &empty_arg],
        2,
        "",
        &format!(
            "error: cannot read the fleet: no fleet in $EMPTY: there is no clusters/<name>.yaml there ({fleet_root})\n"
        ),
    );
    case.check(
        &["validate", "--path", "flet"],
        2,
        "",
        "error: cannot read the fleet: the fleet root \"flet\" does not exist at main@sha1:$COMMIT\n",
    );
    // At the repository's top there is no fleet: a CI job that forgot --path fails.
    std::fs::write(repo.path().join("README.md"), "second\n").expect("write");
    git(repo.path(), &["commit", "--quiet", "-am", "second"]);
    let second = git(repo.path(), &["rev-parse", "HEAD"]);
    let case = case.name("SECOND", &second);
    case.check(
        &["diff", "HEAD~1"],
        2,
        "",
        &format!(
            "error: cannot read HEAD (HEAD): no fleet in $REPO at main@sha1:$SECOND: there is no clusters/<name>.yaml there ({fleet_root}); did you mean --path fleet?\n"
        ),
    );
    // A fleet folder that is on disk but not committed.
    copy_tree(&fleet_example(), &repo.path().join("new-fleet"));
    case.check(
        &["validate", "--repo", "new-fleet"],
        2,
        "",
        "error: cannot read the fleet: the fleet root \"new-fleet\" does not exist at main@sha1:$SECOND; it is on disk but not in that commit: commit it, or add --worktree to read the files on disk\n",
    );
    // A diff whose BASE has no fleet yet (the change adds it) is not an error.
    let outcome = case.run(&["diff", "HEAD", "--path", "new-fleet", "--worktree"]);
    assert_eq!(outcome.code, 1, "{}", outcome.stderr);
    assert_eq!(
        outcome.stderr,
        "note: BASE (HEAD) has no fleet (the fleet root \"new-fleet\" does not exist at main@sha1:$SECOND); every cluster counts as added\n"
    );
}

/// A hub that is not there.
const NO_HUB: &str = "http://127.0.0.1:9";

/// An agent for the cluster `red` of the hub at `server`, with the token file
/// `red.token`, its state and output in the current folder.
fn red_agent(server: &str) -> [&str; 11] {
    [
        "agent",
        "--server",
        server,
        "--cluster",
        "red",
        "--token-file",
        "red.token",
        "--state-dir",
        "agent-state",
        "--sink",
        "dir:out",
    ]
}

/// A mistyped folder, a repository whose fleet is in a subfolder, and a token file
/// not made yet: each error names the command or option that fixes it.
#[test]
fn errors_name_the_next_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_tree(&fleet_example(), &dir.path().join("fleet-example"));
    std::fs::create_dir(dir.path().join("docs")).expect("mkdir");
    std::fs::write(dir.path().join("docs/README.md"), "docs\n").expect("write");
    git(dir.path(), &["init", "--quiet", "--initial-branch=main"]);
    git(dir.path(), &["add", "--all"]);
    git(dir.path(), &["commit", "--quiet", "-m", "fleet"]);
    let commit = git(dir.path(), &["rev-parse", "HEAD"]);
    let case = Case::new(dir.path())
        .name("COMMIT", &commit)
        .name("DIR", canonical(dir.path()));
    case.check(
        &["validate", "--repo", "fleet-exmaple"],
        2,
        "",
        "error: cannot read the fleet: fleet-exmaple: no such folder or Git repository (did you mean fleet-example?)\n",
    );
    case.check(
        &["serve", "--repo", "fleet-exmaple", "--state-dir", "state"],
        2,
        "",
        "error: --repo fleet-exmaple: no such folder or Git repository (did you mean fleet-example?)\n",
    );
    case.check(
        &["render", "--repo", "fleet-exmaple", "--worktree"],
        2,
        "",
        "error: cannot read the fleet: fleet-exmaple: no such folder (did you mean fleet-example?)\n",
    );
    let no_fleet = "there is no clusters/<name>.yaml there (a fleet root holds clusters/, groups/, \
                    workloads/ and overlays/; check --repo and --path); did you mean --path fleet-example?";
    // The repository's top, read from the commit and from the disk.
    case.check(
        &["validate", "--repo", "."],
        2,
        "",
        &format!(
            "error: cannot read the fleet: no fleet in $DIR at main@sha1:$COMMIT: {no_fleet}\n"
        ),
    );
    case.check(
        &["validate", "--worktree"],
        2,
        "",
        &format!("error: cannot read the fleet: no fleet in $DIR: {no_fleet}\n"),
    );
    // What the message says to do works.
    let outcome = case.run(&["validate", "--repo", ".", "--path", "fleet-example"]);
    assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    // A folder without a fleet below it gets no guess.
    case.check(
        &["validate", "--path", "docs"],
        2,
        "",
        "error: cannot read the fleet: no fleet in $DIR/docs at main@sha1:$COMMIT: there is no \
         clusters/<name>.yaml there (a fleet root holds clusters/, groups/, workloads/ and \
         overlays/; check --repo and --path)\n",
    );

    // A token file not made yet, for an agent and for an operator.
    case.check(
        &red_agent(NO_HUB),
        2,
        "",
        "error: the token file red.token does not exist: make one with `flotilla token create red > red.token` (where the hub keeps its --state-dir)\n",
    );
    case.check(
        &[
            "status",
            "--server",
            "http://127.0.0.1:9",
            "--token-file",
            "admin.token",
        ],
        2,
        "",
        "error: --token-file admin.token does not exist: make an admin token with `flotilla token create --admin > admin.token` (where the hub keeps its --state-dir)\n",
    );
}

/// `flotilla init` in a folder outside Git makes the repository itself, on the
/// branch its README and CI job name; in a repository on another branch (Git's
/// `master`), it names that branch. The CI job runs flotilla's container image,
/// cached, and builds nothing.
#[test]
fn init_names_the_repositorys_branch_and_writes_a_ci_job_that_builds_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Git's own default branch here is master, as on many machines.
    let gitconfig = dir.path().join("gitconfig");
    std::fs::write(&gitconfig, "[init]\n\tdefaultBranch = master\n").expect("write");
    let case = Case::new(dir.path())
        .env("GIT_CONFIG_GLOBAL", gitconfig.display().to_string())
        .env("GIT_CONFIG_NOSYSTEM", "1");
    let branch_of = |repo: &Path| git(repo, &["symbolic-ref", "--short", "HEAD"]);
    let read = |path: &Path| std::fs::read_to_string(path).expect("read");

    let outcome = case.run(&["init", "fleet"]);
    assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    assert!(
        outcome
            .stdout
            .contains("made fleet a Git repository on branch main\n"),
        "{}",
        outcome.stdout
    );
    let fleet = dir.path().join("fleet");
    assert_eq!(branch_of(&fleet), "main");
    assert!(read(&fleet.join("README.md")).contains("\nflotilla diff main "));
    let workflow = read(&fleet.join(".github/workflows/fleet.yml"));
    assert!(workflow.contains("\n    branches: [main]\n"), "{workflow}");
    // What the README says works once the fleet is committed.
    git(&fleet, &["add", "."]);
    git(&fleet, &["commit", "--quiet", "-m", "A new fleet"]);
    let diff = case.run(&["diff", "main", "--repo", "fleet"]);
    assert_eq!(diff.code, 0, "{}", diff.stderr);

    // A repository on master keeps its branch, and the files say master.
    let platform = dir.path().join("platform");
    std::fs::create_dir(&platform).expect("mkdir");
    git(&platform, &["init", "--quiet", "--initial-branch=master"]);
    let outcome = case.run(&["init", "platform/fleet"]);
    assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    assert!(!outcome.stdout.contains("made "), "{}", outcome.stdout);
    assert!(!platform.join("fleet/.git").exists());
    assert!(read(&platform.join("fleet/README.md")).contains("\nflotilla diff master "));
    let workflow = read(&platform.join("fleet/.github/workflows/fleet.yml"));
    assert!(
        workflow.contains("\n    branches: [master]\n"),
        "{workflow}"
    );
    assert!(workflow.contains("FLEET_PATH: \"fleet\""), "{workflow}");

    // The job pulls a released image of this version, cached, and runs no build.
    let job: serde_json::Value = serde_saphyr::from_str(&workflow).expect("YAML");
    assert_eq!(
        job["env"]["FLOTILLA_IMAGE"],
        format!(
            "ghcr.io/flotilla-dev/flotilla:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
    let steps = job["jobs"]["check"]["steps"].as_array().expect("steps");
    let uses: Vec<&str> = steps.iter().filter_map(|s| s["uses"].as_str()).collect();
    assert!(
        uses.iter().any(|u| u.starts_with("actions/cache@")),
        "{uses:?}"
    );
    for step in steps {
        let run = step["run"].as_str().unwrap_or("");
        assert!(!run.contains("cargo"), "a step builds flotilla: {run}");
    }
}

/// The real hub on `work/fleet` (state in `work/state`, log in `work/hub.log`) on a
/// free port, once it serves bundles: the port, and the hub to keep running.
fn serve_the_fleet(work: &Path) -> (u16, Vec<Background>) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut running = vec![start_flotilla(
        work,
        &[
            "serve",
            "--repo",
            "fleet",
            "--state-dir",
            "state",
            "--listen",
            &listen,
        ],
        "hub.log",
    )];
    wait_for("the hub to serve bundles", &mut running, || {
        http_status(port, "/readyz") == Some(200)
    });
    (port, running)
}

/// An agent refused for a wrong token takes the right one within seconds of its file
/// being fixed, without a restart: the real hub and agent, as the quick start runs
/// them.
#[test]
fn an_agent_takes_a_fixed_token_file_within_seconds() {
    let (repo, _) = repository_with_fleet_in_a_folder();
    let work = repo.path();
    let (port, mut running) = serve_the_fleet(work);
    let server = format!("http://127.0.0.1:{port}");
    let start = |args: &[&str], log: &str| start_flotilla(work, args, log);
    std::fs::write(work.join("red.token"), format!("flt_{}\n", "0".repeat(64))).expect("write");
    running.push(start(&red_agent(&server), "agent.log"));
    wait_for("the hub to refuse the token", &mut running, || {
        std::fs::read_to_string(work.join("agent.log"))
            .is_ok_and(|log| log.contains("the hub refused this agent's token"))
    });

    // The newcomer fixes the file.
    let token = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["token", "create", "red", "--state-dir", "state"])
        .current_dir(work)
        .output()
        .expect("token create runs");
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    std::fs::write(work.join("red.token.new"), &token.stdout).expect("write");
    std::fs::rename(work.join("red.token.new"), work.join("red.token")).expect("rename");
    let fixed = Instant::now();
    let out = work.join("out");
    wait_for("the agent to write red's bundle", &mut running, || {
        std::fs::read_dir(&out).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().contains("deployment"))
        })
    });
    let waited = fixed.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "the agent took {waited:?} to use the fixed token file:\n{}",
        running[1].log()
    );
}

/// Tokens made and revoked one after another with `flotilla token` beside a running
/// hub on its SQLite store (as the quick start says) are each taken within seconds.
/// The hub once opened its store a second time (for the first-run hint) and read the
/// file's header outside SQLite, which dropped the process's SQLite locks: the first
/// `token create` to close then deleted the write-ahead log under the hub, and the
/// hub never saw another token or revocation.
#[test]
fn tokens_made_and_revoked_beside_a_running_hub_are_each_taken_within_seconds() {
    let (repo, _) = repository_with_fleet_in_a_folder();
    let work = repo.path();
    let (port, mut running) = serve_the_fleet(work);
    let flotilla = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .args(["--state-dir", "state"])
            .current_dir(work)
            .env_remove("FLOTILLA_STATE_DIR")
            .env_remove("FLOTILLA_DATABASE")
            .output()
            .expect("flotilla token runs");
        assert!(
            output.status.success(),
            "flotilla {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8")
    };
    let fleet_status = |token: &str| http_status_as(port, "/v1/fleet", Some(token));
    let within_seconds = |what: &str, running: &mut [Background], done: &dyn Fn() -> bool| {
        let since = Instant::now();
        wait_for(what, running, done);
        let waited = since.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "{what} took {waited:?}:\n{}",
            running[0].log()
        );
    };
    let mut tokens = Vec::new();
    for n in 1..=4 {
        let token = flotilla(&["token", "create", "--role", "viewer"])
            .trim()
            .to_string();
        within_seconds(
            &format!("the hub to take viewer token {n}"),
            &mut running,
            &|| fleet_status(&token) == Some(200),
        );
        tokens.push(token);
    }
    let listed = flotilla(&["token", "list"]);
    let first_id = listed
        .lines()
        .find(|line| line.contains("viewer"))
        .and_then(|line| line.split_whitespace().next())
        .expect("a viewer token listed")
        .to_string();
    flotilla(&["token", "revoke", &first_id]);
    within_seconds("the hub to refuse the revoked token", &mut running, &|| {
        fleet_status(&tokens[0]) == Some(401)
    });
    for token in &tokens[1..] {
        assert_eq!(fleet_status(token), Some(200), "{}", running[0].log());
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn give_away(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).expect("chown");
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).expect("read dir") {
            give_away(&entry.expect("entry").path(), uid);
        }
    }
}

#[test]
fn a_repository_owned_by_another_user_is_refused_with_what_to_do() {
    if !flotilla_testkit::can_run(
        "a_repository_owned_by_another_user_is_refused_with_what_to_do",
        (!is_root()).then(|| "only root can give a folder to another user".to_string()),
    ) {
        return;
    }
    let (repo, _) = repository_with_fleet_in_a_folder();
    give_away(repo.path(), 4242);
    let home = tempfile::tempdir().expect("home");
    let top = canonical(repo.path());
    let case = Case::new(repo.path())
        .name("REPO", &top)
        .env("HOME", home.path().display().to_string())
        .env("XDG_CONFIG_HOME", home.path().display().to_string());
    let refused = "Git refuses to read this repository: repository path '$REPO' is not owned by current user; if you trust it, allow it with `git config --global --add safe.directory $REPO`, or run flotilla as the user who owns it";
    case.check(
        &["validate", "--repo", "fleet"],
        2,
        "",
        &format!("error: cannot read the fleet: fleet: {refused}\n"),
    );
    // The hub does not serve the folder's files instead.
    case.check(
        &["serve", "--repo", "fleet", "--branch", "main"],
        2,
        "",
        &format!("error: fleet: {refused}\n"),
    );
    // What the message says to do works.
    std::fs::write(
        home.path().join(".gitconfig"),
        format!("[safe]\n\tdirectory = {top}\n"),
    )
    .expect("write .gitconfig");
    let outcome = case.run(&["validate", "--repo", "fleet"]);
    assert_eq!(outcome.code, 0, "{}", outcome.stderr);
}

#[test]
fn token_create_prints_only_the_token_into_the_store_the_hub_uses() {
    let dir = tempfile::tempdir().expect("temp dir");
    let case = Case::new(dir.path()).name("DIR", canonical(dir.path()));
    // A state dir that does not exist is a mistyped path, not a new store.
    case.check(
        &["token", "create", "red", "--state-dir", "state"],
        2,
        "",
        "error: the state dir state does not exist: give the --state-dir the hub uses (`flotilla serve` creates it at its first start), or add --init to create a new one\n",
    );
    assert!(!dir.path().join("state").exists());

    let outcome = case.run(&["token", "create", "red", "--state-dir", "state", "--init"]);
    let token = outcome.stdout.trim_end_matches('\n');
    assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    assert!(
        token.len() == 68 && token.starts_with("flt_") && outcome.stdout.ends_with('\n'),
        "stdout holds the token alone: {:?}",
        outcome.stdout
    );
    let id = flotilla_hub::auth::token_id(token);
    assert_eq!(
        outcome.stderr.replace(&id, "$ID"),
        "initialised a new store: $DIR/state/flotilla.db\n\
         created token $ID for cluster red; it is shown once, on stdout (only its hash is stored)\n"
    );
    let case = case.name("ID", &id);
    let admin = case.run(&["token", "create", "--admin", "--state-dir", "state"]);
    assert_eq!(admin.code, 0);
    assert!(
        admin
            .stderr
            .starts_with("store: $DIR/state/flotilla.db\ncreated token ")
    );

    // The variable an agent uses does not move the operator's commands.
    let listing = Case::new(dir.path())
        .name("DIR", canonical(dir.path()))
        .name("ID", &id)
        .env("FLOTILLA_AGENT_STATE_DIR", "state")
        .run(&["token", "list"]);
    assert_eq!(listing.code, 2);
    assert!(
        listing
            .stderr
            .starts_with("error: the state dir .flotilla-state does not exist")
    );
    let listing = case.run(&["token", "list", "--state-dir", "state"]);
    assert_eq!(listing.code, 0);
    assert!(
        listing.stdout.starts_with("$ID  cluster red "),
        "{}",
        listing.stdout
    );
    assert_eq!(listing.stdout.lines().count(), 2);

    // An existing empty folder may become a store; a folder of other files may not.
    std::fs::create_dir(dir.path().join("empty")).expect("mkdir");
    let outcome = case.run(&["token", "list", "--state-dir", "empty"]);
    assert_eq!(
        (outcome.code, outcome.stderr.as_str()),
        (0, "initialised a new store: $DIR/empty/flotilla.db\n")
    );
    std::fs::create_dir(dir.path().join("other")).expect("mkdir");
    std::fs::write(dir.path().join("other/notes.txt"), "mine\n").expect("write");
    case.check(
        &["token", "list", "--state-dir", "other", "--init"],
        2,
        "",
        "error: other is not a flotilla state dir: it holds files but no flotilla.db; give the --state-dir the hub uses\n",
    );
}

#[test]
fn the_agent_says_when_its_token_file_holds_more_than_a_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let case = Case::new(dir.path());
    // What `token create red > red.token` stored before it printed the token alone.
    std::fs::write(
        dir.path().join("red.token"),
        format!(
            "created token 0a1b2c3d4e5f for cluster red (shown once; only its hash is stored): flt_{}\n",
            "0".repeat(64)
        ),
    )
    .expect("write");
    let agent = red_agent(NO_HUB);
    case.check(
        &agent,
        2,
        "",
        "error: the token file red.token does not hold a flotilla token (flt_…): it holds 14 words, and the token is word 14 of them; write just the token into it: `flotilla token create CLUSTER > FILE`\n",
    );
    // The operator's FLOTILLA_STATE_DIR does not redirect an agent.
    let without_state_dir: Vec<&str> = agent[..7].iter().chain(&agent[9..]).copied().collect();
    Case::new(dir.path()).env("FLOTILLA_STATE_DIR", "hub-state").check(
        &without_state_dir,
        2,
        "",
        "error: the following required arguments were not provided:\n  \
         --state-dir <DIR>\n\n\
         Usage: flotilla agent --server <URL> --cluster <NAME> --state-dir <DIR> --sink <kube|dir:PATH> --token-file <FILE>\n\n\
         For more information, try '--help'.\n",
    );
}

#[test]
fn the_kube_sink_without_a_kubeconfig_says_each_cause_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("token"),
        format!("flt_{}\n", "0".repeat(64)),
    )
    .expect("write");
    let case = Case::new(dir.path())
        .name("DIR", dir.path().display().to_string())
        .env(
            "KUBECONFIG",
            dir.path().join("kubeconfig").display().to_string(),
        );
    case.check(
        &[
            "agent",
            "--server",
            "http://127.0.0.1:9",
            "--cluster",
            "red",
            "--token-file",
            "token",
            "--state-dir",
            "state",
            "--sink",
            "kube",
        ],
        2,
        "",
        "error: cannot find a Kubernetes API to apply to (in-cluster service account or kubeconfig): \
         failed to infer config: in-cluster: (failed to read an \
         incluster environment variable: environment variable not found), kubeconfig: (failed to \
         read kubeconfig from '\"$DIR/kubeconfig\"': No such file or directory (os error 2)); run \
         the agent in the cluster, or set KUBECONFIG\n",
    );
}

/// `METHOD PATH` of each row of the endpoint table at the top of docs/api.md.
fn documented_endpoints() -> Vec<String> {
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/api.md"))
        .expect("docs/api.md");
    let table = docs
        .lines()
        .skip_while(|line| !line.starts_with("| method and path"))
        .skip(2)
        .take_while(|line| line.starts_with('|'));
    table
        .map(|row| {
            row.split('`')
                .nth(1)
                .unwrap_or_else(|| panic!("a row without `METHOD PATH`: {row}"))
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_front_door_lists_its_endpoints() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let response = client.get(hub.url("/")).send().await.expect("GET /");
    assert_eq!(response.status(), 200);
    let index: serde_json::Value = response.json().await.expect("JSON");
    let endpoints = index["endpoints"].as_array().expect("endpoints");
    let listed: Vec<String> = endpoints
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["method"].as_str().expect("method"),
                e["path"].as_str().expect("path")
            )
        })
        .collect();
    // The index is the table at the top of docs/api.md, in its order.
    assert_eq!(listed, documented_endpoints());
    // Every path listed is one the hub routes (a path it does not know is 404).
    for endpoint in endpoints {
        let path = endpoint["path"]
            .as_str()
            .expect("path")
            .replace("{cluster}", "red")
            .replace("{digest}", "sha256:00")
            .replace("{id}", "1")
            .replace("{action}", "pause");
        let request = match endpoint["method"].as_str() {
            Some("GET") => client.get(hub.url(&path)),
            _ => client.post(hub.url(&path)),
        };
        let response = request.send().await.expect("request");
        let status = response.status();
        let body = response.text().await.expect("body");
        assert!(
            !body.contains("no such endpoint"),
            "{path} is listed but not routed: {body}"
        );
        assert_ne!(status, 405, "{path} is listed with the wrong method");
    }
    let response = client.get(hub.url("/nowhere")).send().await.expect("GET");
    assert_eq!(response.status(), 404);
    let body: serde_json::Value = response.json().await.expect("JSON");
    assert_eq!(
        body["error"],
        "no such endpoint: /nowhere (GET / lists them; see docs/api.md)"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_works_on_the_very_next_request() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let mut settings = config(state.path(), &repo.path().display().to_string());
    // No periodic refresh to lean on: only the look an unknown token triggers.
    settings.token_refresh = std::time::Duration::from_secs(3600);
    let hub = Running::start_ready(settings).await;
    let state_arg = state.path().display().to_string();
    let outcome =
        Case::new(state.path()).run(&["token", "create", "red", "--state-dir", &state_arg]);
    assert_eq!(outcome.code, 0, "{}", outcome.stderr);
    let token = outcome.stdout.trim().to_string();
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let status = |token: String| {
        let request = client.get(&url).bearer_auth(token);
        async move { request.send().await.expect("GET").status().as_u16() }
    };
    assert_eq!(status(token.clone()).await, 200);
    assert_eq!(status(format!("flt_{}", "0".repeat(64))).await, 401);
    hub.stop().await;
}

/// `flotilla completions bash | head -2`: a reader that closes the pipe early ends
/// the command quietly (exit 0), as for every other command, not with a panic.
#[test]
fn completions_into_a_closed_pipe_end_quietly() {
    let output = into_a_closed_pipe(&["completions", "bash"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "nothing on stderr: {stderr}");
}

/// `flotilla render -o json | head`: a reader that closes the pipe early ends the
/// command quietly (exit 0) in JSON as in YAML; JSON's writer wraps the broken pipe
/// in an error of its own, which was reported as a failure (exit 2).
#[test]
fn render_into_a_closed_pipe_ends_quietly_in_every_format() {
    let fleet = concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example");
    for format in ["json", "yaml"] {
        let output = into_a_closed_pipe(&["render", "--worktree", "--repo", fleet, "-o", format]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{format}: {stderr}");
        assert!(!stderr.contains("error"), "{format}: {stderr}");
    }
}

/// Runs `flotilla ARGS` with its standard output closed before anything is written:
/// the first write meets a broken pipe.
fn into_a_closed_pipe(args: &[&str]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("flotilla runs");
    drop(child.stdout.take());
    child.wait_with_output().expect("it ends")
}
