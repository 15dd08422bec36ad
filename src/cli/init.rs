//! `flotilla init [DIR]`: a new fleet repository that validates as it is, whose
//! files' schema modelines resolve inside it, with a CI job for `validate` and `diff`
//! that runs flotilla's container image. A folder in no Git repository is made one, on
//! `main`; in an existing repository the README and the CI job name the branch its
//! HEAD is on.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Args;

use super::EXIT_OK;

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The folder to write the new fleet into (created if needed; files already there
    /// are never overwritten).
    #[arg(value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
}

/// The files of a new fleet, by path inside it. The fleet's own files live in
/// `src/cli/init/fleet/`, where they are ordinary files a test reads too.
const FILES: &[(&str, &str)] = &[
    (
        "clusters/edge-1.yaml",
        include_str!("init/fleet/clusters/edge-1.yaml"),
    ),
    (
        "groups/stores.yaml",
        include_str!("init/fleet/groups/stores.yaml"),
    ),
    (
        "workloads/hello/workload.yaml",
        include_str!("init/fleet/workloads/hello/workload.yaml"),
    ),
    (
        "workloads/hello/manifests/namespace.yaml",
        include_str!("init/fleet/workloads/hello/manifests/namespace.yaml"),
    ),
    (
        "workloads/hello/manifests/deployment.yaml.j2",
        include_str!("init/fleet/workloads/hello/manifests/deployment.yaml.j2"),
    ),
    (
        "overlays/stores.yaml",
        include_str!("init/fleet/overlays/stores.yaml"),
    ),
];

/// Written only where the folder has none yet (an existing repository keeps its own).
const OPTIONAL: &[(&str, &str)] = &[
    ("README.md", include_str!("init/README.md")),
    (
        ".gitignore",
        "# The hub's state when `flotilla serve` runs here.\n/.flotilla-state/\n",
    ),
];

const WORKFLOW: &str = ".github/workflows/fleet.yml";

/// The branch of a repository `init` makes itself (the branch of an existing one is
/// whatever its HEAD is on).
const NEW_BRANCH: &str = "main";

pub fn run_init(args: &InitArgs) -> anyhow::Result<u8> {
    let dir = &args.dir;
    let fleet_path = path_in_repository(dir);
    let existing_branch = dir
        .ancestors()
        .find(|a| a.exists())
        .and_then(|existing| flotilla_hub::source::discover(existing).ok()?)
        .map(|repository| flotilla_hub::source::head_branch(&repository));
    let branch = existing_branch
        .clone()
        .flatten()
        .unwrap_or_else(|| NEW_BRANCH.to_string());
    let fill = |text: &str| {
        text.replace("@FLEET_PATH@", fleet_path.as_deref().unwrap_or("."))
            .replace("@BRANCH@", &branch)
            .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
    };
    let mut files: Vec<(String, String)> = FILES
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect();
    files.push((WORKFLOW.to_string(), fill(include_str!("init/fleet.yml"))));
    for (name, schema) in flotilla_core::model::schemas() {
        let mut text = serde_json::to_string_pretty(&schema)?;
        text.push('\n');
        files.push((format!("schemas/{name}"), text));
    }

    let taken: Vec<&str> = files
        .iter()
        .map(|(path, _)| path.as_str())
        .filter(|path| dir.join(path).exists())
        .collect();
    if !taken.is_empty() {
        bail!(
            "{} already holds {}; nothing was written (flotilla init never overwrites a file)",
            dir.display(),
            taken.join(", ")
        );
    }
    for (path, text) in OPTIONAL {
        if dir.join(path).exists() {
            eprintln!("kept the {path} already in {}", dir.display());
        } else {
            files.push((path.to_string(), fill(text)));
        }
    }
    for (path, text) in &files {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&target, text)
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    println!(
        "wrote a new fleet in {}: 1 cluster, 1 group, 1 workload, 1 overlay, schemas/ and {WORKFLOW}",
        dir.display()
    );
    if existing_branch.is_none() {
        // flotilla reads the fleet from commits; a repository made here is on the
        // branch the README and the CI job name, whatever Git's default would be.
        flotilla_hub::source::init_repository(dir, &branch)?;
        println!("made {} a Git repository on branch {branch}", dir.display());
    }
    print_next_steps(dir, fleet_path.as_deref());
    Ok(EXIT_OK)
}

/// The fleet's path inside the Git work tree `dir` is in, `None` when `dir` is in
/// none or is its top.
fn path_in_repository(dir: &Path) -> Option<String> {
    let existing = dir.ancestors().find(|a| a.exists())?;
    let top = git_top(existing)?;
    let full = std::path::absolute(dir).ok()?;
    let relative = full.strip_prefix(&top).ok()?;
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    (!parts.is_empty()).then(|| parts.join("/"))
}

fn git_top(path: &Path) -> Option<PathBuf> {
    let repository = flotilla_hub::source::discover(path).ok()??;
    repository.workdir()?.canonicalize().ok()
}

fn print_next_steps(dir: &Path, fleet_path: Option<&str>) {
    let shown = super::source::shell_word(&dir.display().to_string());
    match fleet_path {
        None => println!(
            "\nnext: commit it, then check it:\n\n    \
             git -C {shown} add . && git -C {shown} commit -m 'A new fleet'\n    \
             flotilla validate --repo {shown}\n\n\
             Flotilla reads the fleet from a commit (add --worktree to read the files on\n\
             disk instead)."
        ),
        Some(path) => println!(
            "\nnext: commit it, then check it:\n\n    \
             git -C {shown} add . && git -C {shown} commit -m 'A new fleet'\n    \
             flotilla validate --repo {shown}\n\n\
             The fleet is {path}/ inside a larger repository: move {WORKFLOW} to that\n\
             repository's top, where CI looks for it (it already says --path {path})."
        ),
    }
}
