//! Reading the fleet for `render`, `validate`, `publish`, `diff` and `serve`, by one
//! rule: inside a Git repository, a commit (`HEAD` unless told otherwise); outside
//! one, or with `--worktree`, the files on disk. When a commit is read and the files
//! on disk say something else, the user hears of it on standard error, with the
//! command that reads them.

use std::path::Path;

use anyhow::Context as _;

use super::SourceArgs;
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_hub::source::{self, DiskChange, Location, SourceError};

/// The most changed files listed by name; the rest are counted.
const LISTED: usize = 10;

/// Reads the fleet `args` names for `command` (the subcommand's name, for the hint),
/// within `limits`.
pub fn read(args: &SourceArgs, command: &str, limits: &Limits) -> anyhow::Result<FleetSnapshot> {
    let location = args.location();
    let snapshot = source::read_within(&location, limits).context("cannot read the fleet")?;
    let hint = format!(
        "to read the files on disk: {}",
        command_line(command, &[], &args.repo, &args.path, "--worktree")
    );
    warn_if_disk_differs(&location, &hint);
    Ok(snapshot)
}

/// Prints a `git status`-style warning when the fleet files on disk differ from the
/// commit `location` reads. A failure to find out is not worth stopping for.
pub fn warn_if_disk_differs(location: &Location, hint: &str) {
    let Ok(Some(changes)) = source::disk_changes(location) else {
        return;
    };
    if let Some(warning) = disk_warning(&changes, hint) {
        eprint!("{warning}");
    }
}

/// The warning's text, `None` when nothing differs.
pub fn disk_warning(changes: &[(DiskChange, String)], hint: &str) -> Option<String> {
    if changes.is_empty() {
        return None;
    }
    let count = changes.len();
    let mut text = if count == 1 {
        "warning: 1 fleet file changed on disk is not in HEAD, which is what was read:\n"
            .to_string()
    } else {
        format!(
            "warning: {count} fleet files changed on disk are not in HEAD, which is what was read:\n"
        )
    };
    for (change, path) in changes.iter().take(LISTED) {
        text.push_str(&format!("\t{:<12}{path}\n", change.label()));
    }
    if count > LISTED {
        text.push_str(&format!("\t… and {} more\n", count - LISTED));
    }
    text.push_str(hint);
    text.push('\n');
    Some(text)
}

/// Reads the BASE of a diff. A BASE with no fleet yet (the change adds it, or adds
/// the folder it lives in) is an empty fleet, with a note; a wrong `--path` still
/// fails on the HEAD side.
/// Returns the note to print once HEAD has been read too.
pub fn read_base(
    location: &Location,
    name: &str,
    limits: &Limits,
) -> anyhow::Result<(FleetSnapshot, Option<String>)> {
    match source::read_within(location, limits) {
        Ok(snapshot) => Ok((snapshot, None)),
        Err(err @ (SourceError::NoClusters { .. } | SourceError::NoSuchPath { .. })) => {
            // What to do about a missing fleet root concerns HEAD, not BASE.
            let err = match err {
                SourceError::NoSuchPath { path, revision, .. } => SourceError::NoSuchPath {
                    path,
                    revision,
                    hint: String::new(),
                },
                SourceError::NoClusters { looked, .. } => SourceError::NoClusters {
                    looked,
                    hint: String::new(),
                },
                other => other,
            };
            let note = format!("note: {name} has no fleet ({err}); every cluster counts as added");
            let empty = FleetSnapshot {
                revision: location.rev.clone().unwrap_or_else(|| "HEAD".to_string()),
                ..FleetSnapshot::default()
            };
            Ok((empty, Some(note)))
        }
        Err(err) => Err(err).with_context(|| format!("cannot read {name}")),
    }
}

/// For `flotilla diff BASE` (HEAD side not named, or named `HEAD`): the warning when
/// the files on disk differ from HEAD, with the command that compares BASE with them.
pub fn warn_for_diff(head: &Location, base: &str, head_arg: Option<&str>) {
    if head.worktree || head_arg.is_some_and(|rev| rev != "HEAD") {
        return;
    }
    let hint = format!(
        "to compare {base} with the files on disk: {}",
        command_line("diff", &[base], &head.repo, &head.path, "--worktree")
    );
    warn_if_disk_differs(head, &hint);
}

/// `flotilla COMMAND [ARGS] [--repo R] [--path P] EXTRA`, quoted for a POSIX shell,
/// naming only what differs from the defaults.
pub fn command_line(command: &str, args: &[&str], repo: &Path, path: &str, extra: &str) -> String {
    let mut words = vec!["flotilla".to_string(), command.to_string()];
    words.extend(args.iter().map(|a| shell_word(a)));
    if repo != Path::new(".") {
        words.push("--repo".into());
        words.push(shell_word(&repo.display().to_string()));
    }
    if !path.is_empty() {
        words.push("--path".into());
        words.push(shell_word(path));
    }
    if !extra.is_empty() {
        words.push(extra.to_string());
    }
    words.join(" ")
}

/// A word as a POSIX shell reads it back: as it is when it is plain, else in single
/// quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,~^".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_changes_like_git_status_and_counts_the_rest() {
        let changes: Vec<(DiskChange, String)> = (0..12)
            .map(|i| (DiskChange::Modified, format!("clusters/c{i:02}.yaml")))
            .collect();
        let text = disk_warning(&changes, "hint").expect("a warning");
        assert!(text.starts_with("warning: 12 fleet files changed on disk are not in HEAD"));
        assert!(text.contains("\tmodified:   clusters/c09.yaml\n"));
        assert!(!text.contains("c10.yaml"));
        assert!(text.ends_with("\t… and 2 more\nhint\n"), "{text}");
        assert_eq!(disk_warning(&[], "hint"), None);
    }

    #[test]
    fn quotes_only_what_a_shell_would_split() {
        assert_eq!(shell_word("fleet-example"), "fleet-example");
        assert_eq!(shell_word("HEAD~5"), "HEAD~5");
        assert_eq!(shell_word("my fleet"), "'my fleet'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(
            command_line("diff", &["main"], Path::new("."), "fleet", "--worktree"),
            "flotilla diff main --path fleet --worktree"
        );
    }
}
