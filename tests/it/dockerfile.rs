//! The Dockerfile, checked without a Docker engine: it is parsed, and what it names is
//! compared with the repository: the files it copies exist and are in the build
//! context, its two targets (`hub`, `agent`) run binaries the workspace builds, the
//! variables it sets are ones those binaries read, the hub listens on the port it
//! exposes and keeps its state in the volume. `docker_images_build` builds both
//! targets for real; it needs an engine (`docker info`), so it is ignored by default:
//! `cargo test --test it -- --ignored docker_images_build`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[derive(Debug, Clone)]
struct Instruction {
    line: usize,
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    name: String,
    base: String,
    instructions: Vec<Instruction>,
}

/// Instructions with their continuation lines joined; comments and blank lines dropped.
fn instructions(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (continued, body) = match trimmed.strip_suffix('\\') {
            Some(body) => (true, body.trim_end()),
            None => (false, trimmed),
        };
        let (line, mut joined) = pending.take().unwrap_or((index + 1, String::new()));
        if !joined.is_empty() {
            joined.push(' ');
        }
        joined.push_str(body);
        if continued {
            pending = Some((line, joined));
            continue;
        }
        let (keyword, args) = joined.split_once(' ').unwrap_or((joined.as_str(), ""));
        out.push(Instruction {
            line,
            keyword: keyword.to_uppercase(),
            args: args.trim().to_string(),
        });
    }
    assert!(
        pending.is_none(),
        "the Dockerfile ends inside a continued line"
    );
    out
}

/// The `ARG`s before the first `FROM`, and the stages.
fn parse(text: &str) -> (Vec<Instruction>, Vec<Stage>) {
    let mut global = Vec::new();
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions(text) {
        if instruction.keyword == "FROM" {
            let words: Vec<&str> = instruction.args.split_whitespace().collect();
            let (base, name) = match words.as_slice() {
                [base, as_, name] if as_.eq_ignore_ascii_case("as") => (*base, *name),
                other => panic!(
                    "Dockerfile:{}: every stage is named (FROM image AS name), found {other:?}",
                    instruction.line
                ),
            };
            stages.push(Stage {
                name: name.to_string(),
                base: base.to_string(),
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(instruction);
        } else {
            global.push(instruction);
        }
    }
    (global, stages)
}

fn dockerfile() -> (Vec<Instruction>, Vec<Stage>) {
    let text = std::fs::read_to_string(Path::new(ROOT).join("Dockerfile")).expect("Dockerfile");
    parse(&text)
}

fn stage<'a>(stages: &'a [Stage], name: &str) -> &'a Stage {
    stages
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("the Dockerfile has no stage (target) named {name:?}"))
}

fn all<'a>(stage: &'a Stage, keyword: &'a str) -> impl Iterator<Item = &'a Instruction> + 'a {
    stage
        .instructions
        .iter()
        .filter(move |i| i.keyword == keyword)
}

/// `KEY=VALUE` pairs of a stage's `ENV` instructions.
fn env(stage: &Stage) -> Vec<(String, String)> {
    all(stage, "ENV")
        .flat_map(|i| {
            i.args
                .split_whitespace()
                .map(|pair| {
                    let (key, value) = pair.split_once('=').expect("ENV KEY=VALUE");
                    (key.to_string(), value.to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The words of an exec-form instruction (`["a", "b"]`).
fn exec_form(instruction: &Instruction) -> Vec<String> {
    serde_json::from_str(&instruction.args).unwrap_or_else(|err| {
        panic!(
            "Dockerfile:{}: {} must be in exec form, a JSON array: {err}",
            instruction.line, instruction.keyword
        )
    })
}

/// The `[[bin]]` names of the workspace's packages, and the packages' names.
fn workspace_binaries() -> (BTreeSet<String>, BTreeSet<String>) {
    let mut manifests = vec![Path::new(ROOT).join("Cargo.toml")];
    for entry in std::fs::read_dir(Path::new(ROOT).join("crates")).expect("crates/") {
        let path = entry.expect("entry").path().join("Cargo.toml");
        if path.is_file() {
            manifests.push(path);
        }
    }
    let (mut binaries, mut packages) = (BTreeSet::new(), BTreeSet::new());
    for manifest in manifests {
        let text = std::fs::read_to_string(&manifest).expect("Cargo.toml");
        let mut section = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line.to_string();
            } else if let Some(value) = line.strip_prefix("name = ") {
                let value = value.trim_matches('"').to_string();
                match section.as_str() {
                    "[[bin]]" => {
                        binaries.insert(value);
                    }
                    "[package]" => {
                        packages.insert(value);
                    }
                    _ => {}
                }
            }
        }
    }
    (binaries, packages)
}

fn help_of(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .arg("--help")
        .output()
        .expect("flotilla runs");
    assert!(
        output.status.success(),
        "`flotilla {} --help` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    // One line: clap wraps help at the terminal's width, wherever that falls.
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn the_dockerfile_builds_from_what_the_repository_holds() {
    let (global, stages) = dockerfile();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names.last(),
        Some(&"hub"),
        "a plain `docker build .` gives the hub: it is the last stage"
    );

    // The Rust image is the version the workspace declares it needs.
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("toml");
    let rust_version = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = "))
        .expect("the workspace declares rust-version")
        .trim_matches('"');
    let arg = global
        .iter()
        .find(|i| i.keyword == "ARG" && i.args.starts_with("RUST_VERSION="))
        .expect("ARG RUST_VERSION before the first FROM");
    assert_eq!(arg.args, format!("RUST_VERSION={rust_version}"));
    let build = stage(&stages, "build");
    assert_eq!(build.base, "rust:${RUST_VERSION}-bookworm");

    // What the context copies exists and is not left out by .dockerignore.
    let ignore =
        std::fs::read_to_string(Path::new(ROOT).join(".dockerignore")).expect(".dockerignore");
    let ignored: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in ["target/", ".git/", "**/.flotilla-state/"] {
        assert!(
            ignored.contains(&needed),
            ".dockerignore must leave {needed} out of the build context"
        );
    }
    for stage in &stages {
        for copy in all(stage, "COPY").filter(|c| !c.args.starts_with("--from")) {
            let words: Vec<&str> = copy.args.split_whitespace().collect();
            for source in &words[..words.len() - 1] {
                assert!(
                    Path::new(ROOT).join(source).exists(),
                    "Dockerfile:{}: COPY {source}: no such path in the repository",
                    copy.line
                );
                assert!(
                    !ignored.iter().any(|i| i.trim_end_matches('/') == *source),
                    "Dockerfile:{}: COPY {source}, which .dockerignore leaves out",
                    copy.line
                );
            }
        }
    }

    // The build compiles real packages and copies out real binaries.
    let (binaries, packages) = workspace_binaries();
    let run = all(build, "RUN")
        .find(|r| r.args.contains("cargo build"))
        .expect("the build stage runs cargo build");
    let cargo_build = run
        .args
        .split("&&")
        .find(|part| part.contains("cargo build"))
        .expect("cargo build");
    let words: Vec<&str> = cargo_build.split_whitespace().collect();
    for pair in words.windows(2).filter(|w| w[0] == "-p") {
        assert!(
            packages.contains(pair[1]),
            "Dockerfile:{}: -p {}: no such package (packages: {packages:?})",
            run.line,
            pair[1]
        );
    }
    assert!(
        words.contains(&"--locked"),
        "the image builds what Cargo.lock pins"
    );

    // The hub in the release profile, the edge agent in the smaller `edge` one.
    for (target, binary, profile) in [
        ("hub", "flotilla", "release"),
        ("agent", "flotilla-agent", "edge"),
    ] {
        assert!(
            binaries.contains(binary),
            "{binary} is a [[bin]] of the workspace"
        );
        let stage = stage(&stages, target);
        assert!(
            run.args.contains(&format!("target/{profile}/{binary} ")),
            "Dockerfile:{}: the build copies out {binary}",
            run.line
        );
        let copied: Vec<String> = all(stage, "COPY")
            .filter(|c| c.args.starts_with("--from=build"))
            .filter_map(|c| {
                let words: Vec<&str> = c.args.split_whitespace().collect();
                let (source, dest) = (words[words.len() - 2], words[words.len() - 1]);
                (source == format!("/out/{binary}")).then(|| dest.to_string())
            })
            .collect();
        let entrypoint = all(stage, "ENTRYPOINT").last().expect("an ENTRYPOINT");
        let entrypoint = exec_form(entrypoint);
        assert_eq!(
            copied,
            [entrypoint[0].clone()],
            "the {target} image runs the {binary} it copies"
        );
        assert!(
            all(stage, "USER").any(|u| !u.args.starts_with("0") && u.args != "root"),
            "the {target} image runs as an unprivileged user"
        );
    }

    // The hub: every interface inside the container, the port it exposes, its state
    // in the volume, a command line `flotilla` accepts, the fleet it reads trusted.
    let hub = stage(&stages, "hub");
    let hub_env = env(hub);
    let value = |key: &str| {
        hub_env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the hub image sets {key}"))
    };
    let listen = value("FLOTILLA_LISTEN");
    let (host, port) = listen.rsplit_once(':').expect("address:port");
    assert_eq!(
        host, "0.0.0.0",
        "inside a container the hub listens on every interface"
    );
    let exposed: Vec<&str> = all(hub, "EXPOSE").map(|e| e.args.as_str()).collect();
    assert_eq!(exposed, [port]);
    let volumes: Vec<String> = all(hub, "VOLUME").flat_map(exec_form).collect();
    assert_eq!(volumes, [value("FLOTILLA_STATE_DIR")]);
    let serve_help = help_of(&["serve"]);
    for (key, _) in &hub_env {
        assert!(
            serve_help.contains(&format!("[env: {key}=")),
            "the hub image sets {key}, which `flotilla serve` does not read"
        );
    }
    let command = exec_form(all(hub, "CMD").last().expect("a CMD"));
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    help_of(&words);
    let repo = words
        .windows(2)
        .find(|w| w[0] == "--repo")
        .map(|w| w[1])
        .expect("the CMD names --repo");
    assert!(
        all(hub, "RUN").any(|r| r.args.contains(&format!("safe.directory {repo}"))),
        "the fleet mounted at {repo} belongs to the host's user: Git must trust it"
    );

    // The agent: variables `flotilla-agent` reads, its state in the volume.
    let agent = stage(&stages, "agent");
    let agent_env = env(agent);
    let agent_help = help_of(&["agent"]);
    for (key, _) in &agent_env {
        // Read by the C library the agent runs on, not by the agent.
        if key == "GLIBC_TUNABLES" {
            continue;
        }
        assert!(
            key.starts_with("FLOTILLA_AGENT_") && agent_help.contains(&format!("[env: {key}=")),
            "the agent image sets {key}, which the agent does not read"
        );
    }
    // The image and the systemd unit tune glibc's allocator alike.
    let tunables = agent_env
        .iter()
        .find(|(k, _)| k == "GLIBC_TUNABLES")
        .map(|(_, v)| v.clone())
        .expect("the agent image sets GLIBC_TUNABLES");
    assert_eq!(tunables, "glibc.malloc.mmap_threshold=1048576");
    let unit = std::fs::read_to_string(Path::new(ROOT).join("deploy/flotilla-agent.service"))
        .expect("the systemd unit");
    assert!(
        unit.lines()
            .any(|line| line == format!("Environment=GLIBC_TUNABLES={tunables}")),
        "the systemd unit sets GLIBC_TUNABLES={tunables} as the image does"
    );
    let state = agent_env
        .iter()
        .find(|(k, _)| k == "FLOTILLA_AGENT_STATE_DIR")
        .map(|(_, v)| v.clone())
        .expect("the agent image sets its state dir");
    let volumes: Vec<String> = all(agent, "VOLUME").flat_map(exec_form).collect();
    assert_eq!(volumes, [state]);
}

#[test]
fn the_parser_sees_what_docker_sees() {
    let (global, stages) = parse(
        "# comment\nARG V=1\nFROM a:${V} AS one\nRUN x \\\n    # inside\n    && y\nCOPY . .\nFROM one AS two\nENTRYPOINT [\"/bin/z\"]\n",
    );
    assert_eq!(global.len(), 1);
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0].instructions[0].args, "x && y");
    assert_eq!(stages[0].instructions[0].line, 4);
    assert_eq!(exec_form(&stages[1].instructions[0]), ["/bin/z"]);
}

/// Builds both images. Needs a running Docker engine that can pull base images.
#[test]
#[ignore = "needs a Docker engine: cargo test --test it -- --ignored docker_images_build"]
fn docker_images_build() {
    if let Err(reason) = flotilla_testkit::command_works("docker", &["info"]) {
        panic!("no Docker engine: {reason}");
    }
    for (target, tag) in [("agent", "flotilla-agent:test"), ("hub", "flotilla:test")] {
        let status = Command::new("docker")
            .args(["build", "--target", target, "-t", tag, "."])
            .current_dir(ROOT)
            .status()
            .expect("docker runs");
        assert!(status.success(), "docker build --target {target} failed");
    }
    let output = Command::new("docker")
        .args(["run", "--rm", "flotilla-agent:test", "--version"])
        .output()
        .expect("docker runs");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("flotilla-agent "));
    let output = Command::new("docker")
        .args(["run", "--rm", "flotilla:test", "--version"])
        .output()
        .expect("docker runs");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("flotilla "));
}
