//! README.md's quick start, run as a newcomer would run it: the commands are taken
//! from the README itself, so this test fails when the README drifts from what the
//! binary does.
//!
//! The commands run in a fresh Git repository holding fleet-example (as a clone of
//! this one would), with `cargo run [-q] --` replaced by the binary this test was
//! built with. Commands that run until stopped (`serve`, `agent`) are started in the
//! background and waited for; `cargo test --locked` is not run here (this is it), but
//! it must be the command CI runs. The hub listens on a free port instead of 8080
//! (through `FLOTILLA_LISTEN`), and the commands' URLs are changed to match.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::process::{Background, free_port, http_status, wait_for};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The ```sh blocks of the README section whose heading is `heading`, as commands
/// (continuation lines joined, comment-only and blank lines dropped).
fn section_commands(readme: &str, heading: &str) -> Vec<String> {
    let mut in_section = false;
    let mut in_block = false;
    let mut commands = Vec::new();
    let mut pending = String::new();
    for line in readme.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            in_section = title.trim() == heading;
            continue;
        }
        if !in_section {
            continue;
        }
        if line.starts_with("```") {
            in_block = !in_block && line.trim() == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                commands.push(std::mem::take(&mut pending));
            }
        }
    }
    commands
}

/// What to do with one README command.
#[derive(Debug, PartialEq)]
enum Step {
    /// `cargo test …`: this very suite; only compared with CI's command.
    TheTests(String),
    /// A flotilla command that runs until stopped (`serve`, `agent`).
    Background(String),
    /// Anything else, run to completion by a shell.
    Foreground(String),
}

/// `cargo run [-q] [--release] -- ARGS` becomes `flotilla ARGS` (the binary on PATH).
fn step(command: &str) -> Step {
    if command.starts_with("cargo test") {
        return Step::TheTests(
            command
                .split(" #")
                .next()
                .unwrap_or(command)
                .trim()
                .to_string(),
        );
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    let rewritten = match words.iter().position(|w| *w == "--") {
        Some(dashes) if words.first() == Some(&"cargo") && words.get(1) == Some(&"run") => {
            let rest: Vec<&str> = words[dashes + 1..].to_vec();
            format!("flotilla {}", rest.join(" "))
        }
        _ => command.to_string(),
    };
    let subcommand = rewritten
        .strip_prefix("flotilla ")
        .and_then(|rest| rest.split_whitespace().next());
    match subcommand {
        Some("serve" | "agent") => Step::Background(rewritten),
        _ => Step::Foreground(rewritten),
    }
}

/// A Git repository holding fleet-example, as a fresh clone of this one would.
fn clone_like() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    make_clone_like(dir.path());
    dir
}

/// [`clone_like`] in a given (existing, empty) folder.
fn make_clone_like(dir: &Path) {
    let status = Command::new("cp")
        .arg("-r")
        .arg(Path::new(ROOT).join("fleet-example"))
        .arg(dir)
        .status()
        .expect("cp runs");
    assert!(status.success());
    for args in [
        &["init", "--quiet", "--initial-branch=main"][..],
        &["add", "--all"],
        &["commit", "--quiet", "-m", "fleet-example"],
    ] {
        let status = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "flotilla tests")
            .env("GIT_AUTHOR_EMAIL", "tests@flotilla.invalid")
            .env("GIT_COMMITTER_NAME", "flotilla tests")
            .env("GIT_COMMITTER_EMAIL", "tests@flotilla.invalid")
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    }
}

#[test]
fn the_readme_quick_start_works_as_written() {
    if !flotilla_testkit::can_run(
        "the_readme_quick_start_works_as_written",
        flotilla_testkit::command_works("curl", &["--version"])
            .err()
            .map(|e| format!("the README's commands use curl: {e}")),
    ) {
        return;
    }
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let steps: Vec<Step> = section_commands(&readme, "Quick start")
        .iter()
        .map(|c| step(c))
        .collect();

    // The tests the README names are the ones CI runs.
    let ci = std::fs::read_to_string(Path::new(ROOT).join(".ci/run")).expect(".ci/run");
    let the_tests: Vec<&String> = steps
        .iter()
        .filter_map(|s| match s {
            Step::TheTests(command) => Some(command),
            _ => None,
        })
        .collect();
    assert_eq!(
        the_tests.len(),
        1,
        "the quick start runs the tests once: {steps:?}"
    );
    assert!(
        ci.lines().any(|line| line.trim() == the_tests[0].as_str()),
        "README.md runs `{}`, which .ci/run does not",
        the_tests[0]
    );

    let work = clone_like();
    let bin = tempfile::tempdir().expect("bin dir");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_flotilla"), bin.path().join("flotilla"))
        .expect("symlink");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let port = free_port();
    let local = |command: &str| command.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));

    let mut background: Vec<Background> = Vec::new();
    let mut outputs: Vec<(String, String)> = Vec::new();
    for step in &steps {
        match step {
            Step::TheTests(_) => {}
            Step::Background(command) => {
                let log = work
                    .path()
                    .join(format!("background-{}.log", background.len()));
                let file = std::fs::File::create(&log).expect("log file");
                let child = Command::new("bash")
                    .args(["-c", &format!("exec {}", local(command))])
                    .current_dir(work.path())
                    .env("PATH", &path)
                    .env("FLOTILLA_LISTEN", format!("127.0.0.1:{port}"))
                    .env_remove("FLOTILLA_STATE_DIR")
                    .stdin(Stdio::null())
                    .stdout(file.try_clone().expect("log file"))
                    .stderr(file)
                    .spawn()
                    .expect("bash runs");
                background.push(Background { child, log });
                if command.starts_with("flotilla serve") {
                    wait_for("the hub to serve bundles", &mut background, || {
                        http_status(port, "/readyz") == Some(200)
                    });
                } else if command.starts_with("flotilla agent") {
                    let out = work.path().join("out");
                    wait_for(
                        "the agent to write the bundle into ./out",
                        &mut background,
                        || {
                            std::fs::read_dir(&out).is_ok_and(|entries| {
                                entries
                                    .filter_map(Result::ok)
                                    .any(|e| e.file_name().to_string_lossy().contains("deployment"))
                            })
                        },
                    );
                }
            }
            Step::Foreground(command) => {
                let output = Command::new("bash")
                    .args(["-euo", "pipefail", "-c", &local(command)])
                    .current_dir(work.path())
                    .env("PATH", &path)
                    .env_remove("FLOTILLA_STATE_DIR")
                    .stdin(Stdio::null())
                    .output()
                    .expect("bash runs");
                let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
                assert!(
                    output.status.success(),
                    "README command failed: {command}\n{stdout}{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                outputs.push((command.clone(), stdout));
            }
        }
    }

    // What the quick start promises: a server, a token alone in its file, a 200 and
    // then a 304, and an agent that wrote the cluster's resources.
    let kinds: Vec<&str> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Background(c) | Step::Foreground(c) => c.split_whitespace().nth(1),
            Step::TheTests(_) => None,
        })
        .collect();
    assert!(
        ["serve", "token", "agent"]
            .iter()
            .all(|k| kinds.contains(k)),
        "the quick start starts a hub, makes a token and runs an agent: {kinds:?}"
    );
    let token = std::fs::read_to_string(work.path().join("red.token")).expect("red.token");
    assert!(
        flotilla_core::api::is_token(token.trim()),
        "red.token holds the token alone: {token:?}"
    );
    let curls: Vec<&String> = outputs
        .iter()
        .filter(|(c, _)| c.starts_with("curl"))
        .map(|(_, out)| out)
        .collect();
    assert_eq!(curls.len(), 2, "two requests for the bundle");
    let document: serde_json::Value =
        serde_json::from_str(curls[0]).expect("the first answer is the bundle document");
    assert_eq!(document["cluster"], "red");
    assert!(
        curls[1].starts_with("HTTP/1.1 304"),
        "the second answer is 304 Not Modified:\n{}",
        curls[1]
    );
    drop(background);
}

#[test]
fn the_readme_install_and_docker_commands_name_what_exists() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let install = section_commands(&readme, "Install");
    assert!(
        install
            .iter()
            .any(|c| c.starts_with("cargo install --locked --path . ")),
        "README's Install section installs the CLI from the checkout: {install:?}"
    );
    let docker = section_commands(&readme, "Docker");
    let dockerfile =
        std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("Dockerfile");
    let mut built = Vec::new();
    for command in docker.iter().filter(|c| c.starts_with("docker build")) {
        let words: Vec<&str> = command.split_whitespace().collect();
        let target = words
            .windows(2)
            .find(|w| w[0] == "--target")
            .map(|w| w[1])
            .expect("a --target");
        let tag = words
            .windows(2)
            .find(|w| w[0] == "-t")
            .map(|w| w[1])
            .expect("a -t tag");
        assert!(
            dockerfile
                .lines()
                .any(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {target}"))),
            "README builds --target {target}, which the Dockerfile does not have"
        );
        built.push(tag.to_string());
    }
    assert_eq!(built, ["flotilla", "flotilla-agent"]);
    for command in docker.iter().filter(|c| c.starts_with("docker run")) {
        assert!(
            built
                .iter()
                .any(|tag| command.contains(&format!(" {tag} "))),
            "README runs an image it does not build: {command}"
        );
    }
}

#[test]
fn readme_commands_are_read_as_a_user_would_paste_them() {
    let readme = "## Quick start\n\n```sh\ncargo run -- serve --repo x   # note\n```\n\
                  text\n```sh\n# a comment\ncargo run -q -- token create red \\\n  > red.token\n\
                  cargo test --locked   # the tests\n```\n## Other\n```sh\nrm -rf /\n```\n";
    let steps: Vec<Step> = section_commands(readme, "Quick start")
        .iter()
        .map(|c| step(c))
        .collect();
    assert_eq!(
        steps,
        [
            Step::Background("flotilla serve --repo x # note".into()),
            Step::Foreground("flotilla token create red > red.token".into()),
            Step::TheTests("cargo test --locked".into()),
        ]
    );
}

/// README.md's "Try a change", run as written after the quick start's token: the hub
/// follows a copy of the example beside the checkout, a commit there reaches `red`,
/// and the checkout (whose tests check the example as committed) is left as it was.
#[test]
fn the_readme_change_walkthrough_leaves_the_checkout_as_it_was() {
    if !flotilla_testkit::can_run(
        "the_readme_change_walkthrough_leaves_the_checkout_as_it_was",
        flotilla_testkit::command_works("curl", &["--version"])
            .err()
            .map(|e| format!("the test reads the hub's answers with curl: {e}")),
    ) {
        return;
    }
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README");
    let steps: Vec<Step> = section_commands(&readme, "Try a change")
        .iter()
        .map(|c| step(c))
        .collect();
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, Step::Background(c) if c.starts_with("flotilla serve"))),
        "the walkthrough serves the copy: {steps:?}"
    );
    // The checkout, with a folder beside it for the copy.
    let parent = tempfile::tempdir().expect("temp dir");
    let work = parent.path().join("flotilla");
    std::fs::create_dir(&work).expect("checkout folder");
    make_clone_like(&work);
    let bin = tempfile::tempdir().expect("bin dir");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_flotilla"), bin.path().join("flotilla"))
        .expect("symlink");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let port = free_port();
    let run = |command: &str| {
        let output = Command::new("bash")
            .args(["-euo", "pipefail", "-c", command])
            .current_dir(&work)
            .env("PATH", &path)
            .env_remove("FLOTILLA_STATE_DIR")
            // A newcomer's Git has an identity; a fresh machine's may not.
            .env("GIT_AUTHOR_NAME", "flotilla tests")
            .env("GIT_AUTHOR_EMAIL", "tests@flotilla.invalid")
            .env("GIT_COMMITTER_NAME", "flotilla tests")
            .env("GIT_COMMITTER_EMAIL", "tests@flotilla.invalid")
            .stdin(Stdio::null())
            .output()
            .expect("bash runs");
        assert!(
            output.status.success(),
            "command failed: {command}\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    // The quick start's token, made in the checkout's state folder (there, its hub
    // made the folder).
    let token = run("flotilla token create red --init");
    let digest = |port: u16| -> Option<String> {
        let output = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-D", "-", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("http://127.0.0.1:{port}/v1/clusters/red/bundle"))
            .output()
            .ok()?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|l| {
                l.strip_prefix("etag: ")
                    .or_else(|| l.strip_prefix("ETag: "))
            })
            .map(|etag| etag.trim().to_string())
    };
    let mut background: Vec<Background> = Vec::new();
    let mut before = None;
    for step in &steps {
        match step {
            Step::TheTests(_) => panic!("the walkthrough runs no tests"),
            Step::Background(command) => {
                let log = work.join(format!("background-{}.log", background.len()));
                let file = std::fs::File::create(&log).expect("log file");
                let child = Command::new("bash")
                    .args(["-c", &format!("exec {command}")])
                    .current_dir(&work)
                    .env("PATH", &path)
                    .env("FLOTILLA_LISTEN", format!("127.0.0.1:{port}"))
                    .env_remove("FLOTILLA_STATE_DIR")
                    .stdin(Stdio::null())
                    .stdout(file.try_clone().expect("log file"))
                    .stderr(file)
                    .spawn()
                    .expect("bash runs");
                background.push(Background { child, log });
                wait_for("the hub to serve red's bundle", &mut background, || {
                    before = digest(port);
                    before.is_some()
                });
            }
            Step::Foreground(command) => {
                run(command);
            }
        }
    }
    let before = before.expect("a digest before the change");
    wait_for("red's new bundle", &mut background, || {
        digest(port).is_some_and(|now| now != before)
    });
    drop(background);
    let changed = run("git status --porcelain -- fleet-example");
    assert_eq!(changed, "", "the checkout's example is as it was committed");
    assert!(
        parent.path().join("my-fleet/.git").exists(),
        "the copy is a repository of its own"
    );
}
