//! The memory cap of the commands that render in their own process (`render`,
//! `validate`, `diff`, `publish`): `--render-memory`, as `serve` caps its render
//! process.
//!
//! Template fuel bounds what a template does, but a template engine can still be
//! made to build more than fuel pays for (a list added to itself again and again is
//! copied whole once it is deep), and without a cap such a render takes the machine's
//! memory: on a CI runner, the runner. The command's data segment is capped with
//! `RLIMIT_DATA` at the limit, and a thread looks at the process's data segment every
//! 50 ms: past nine tenths of the limit it names the templates being rendered and
//! ends the command (exit 2). An allocation faster than that meets the cap itself and
//! aborts the process, after the lines that name any template that ran for seconds.

use std::time::Duration;

use anyhow::Context as _;

use super::EXIT_ERROR;

/// How often the data segment is looked at.
const EVERY: Duration = Duration::from_millis(50);

/// Caps this process's memory at `limit` bytes (0: no cap) and starts the watch.
pub fn cap(limit: u64) -> anyhow::Result<()> {
    // A template that takes seconds for one cluster is named while it runs (an
    // endless one ends at its fuel; one that builds too much may exhaust memory).
    flotilla_render::progress::watch(Duration::from_millis(500), Duration::from_secs(2), |line| {
        eprintln!("{line}");
    });
    if limit == 0 {
        return Ok(());
    }
    rustix::process::setrlimit(
        rustix::process::Resource::Data,
        rustix::process::Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .map_err(std::io::Error::from)
    .context("cannot cap this process's memory (--render-memory)")?;
    let soft = limit / 10 * 9;
    std::thread::Builder::new()
        .name("memory-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EVERY);
                if data_segment().is_some_and(|bytes| bytes >= soft) {
                    eprintln!(
                        "{}",
                        exhausted(limit, &flotilla_render::progress::current_renders())
                    );
                    std::process::exit(i32::from(EXIT_ERROR));
                }
            }
        })
        .context("cannot start the thread that watches memory")?;
    Ok(())
}

/// The error of a render stopped at its memory limit, naming what it was rendering.
fn exhausted(limit: u64, rendering: &[String]) -> String {
    let on = match rendering {
        [] => "templates that write large outputs for many clusters, or a fleet larger \
               than the limit allows"
            .to_string(),
        [one] => format!("it was rendering {one}"),
        [first, rest @ ..] => format!(
            "it was rendering {first}, and {} other template{}",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" }
        ),
    };
    format!(
        "error: the render needed more than {} of memory (--render-memory) and was \
         stopped ({on})",
        flotilla_hub::follow::human_bytes(limit)
    )
}

/// The size of this process's data segment (what `RLIMIT_DATA` counts), from Linux's
/// `/proc/self/status`; `None` elsewhere.
fn data_segment() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmData:"))?;
    let kib: u64 = line
        .trim_start_matches("VmData:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_what_was_rendering() {
        let gib = 4 << 30;
        assert_eq!(
            exhausted(gib, &["w/grow.yaml.j2 for cluster red".into()]),
            "error: the render needed more than 4 GiB of memory (--render-memory) and was \
             stopped (it was rendering w/grow.yaml.j2 for cluster red)"
        );
        assert!(
            exhausted(gib, &["a".into(), "b".into(), "c".into()])
                .ends_with("(it was rendering a, and 2 other templates)")
        );
        assert!(exhausted(gib, &[]).contains("a fleet larger than the limit allows"));
    }

    #[test]
    fn the_data_segment_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(data_segment().is_some_and(|bytes| bytes > 0));
        }
    }
}
