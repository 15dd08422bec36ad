//! The memory cap of the commands that render in their own process (`render`,
//! `validate`, `diff`, `publish`): `--render-memory`, as `serve` caps its render
//! process.
//!
//! Template fuel bounds what a template does, but fuel raised past what memory holds
//! (`--template-fuel`), or a way around fuel not yet known, lets a render build more
//! than the machine has, and without a cap such a render takes the machine's memory:
//! on a CI runner, the runner. While the command renders, a thread looks at
//! its data segment every 50 ms: past the limit, it names the templates being
//! rendered and ends the command (exit 2). The data segment is also capped with
//! `RLIMIT_DATA` at three times the limit, which a render meets only by growing
//! faster than the look: a list that doubles from below the limit holds its old and
//! its new copy, less than three times the limit, while it grows, and the next look
//! sees it; a single larger allocation meets the cap and aborts the process, after
//! the lines that name any template that ran for seconds. What the command does after
//! its render (writing bundles, publishing) is not capped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use super::EXIT_ERROR;

/// How often the data segment is looked at.
const EVERY: Duration = Duration::from_millis(50);

/// The cap while it lives: dropped, the process's limit is what it was before and
/// the watch ends.
pub struct MemoryCap {
    /// The limit before the cap; `None` when there is no cap.
    before: Option<Rlimit>,
    stop: Arc<AtomicBool>,
    /// What is being rendered, when the command renders more than one thing (`diff`:
    /// HEAD, then BASE), for the error.
    what: Arc<Mutex<Option<String>>>,
}

impl MemoryCap {
    /// Names what is rendered from now on (`HEAD (main)`), for the error.
    pub fn rendering(&self, what: &str) {
        *self.what.lock().unwrap_or_else(|e| e.into_inner()) = Some(what.to_string());
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(before) = self.before.take() {
            // Raising the soft limit back to what it was is always allowed.
            let _ = setrlimit(Resource::Data, before);
        }
    }
}

/// Caps this process's memory at `limit` bytes (0: no cap) until the returned
/// [`MemoryCap`] is dropped, and names slow templates on stderr from now on.
pub fn cap(limit: u64) -> anyhow::Result<MemoryCap> {
    // A template that takes seconds for one cluster is named while it runs (an
    // endless one ends at its fuel; one that builds too much may exhaust memory).
    flotilla_render::progress::watch(Duration::from_millis(500), Duration::from_secs(2), |line| {
        eprintln!("{line}");
    });
    let stop = Arc::new(AtomicBool::new(false));
    let what = Arc::new(Mutex::new(None));
    if limit == 0 {
        return Ok(MemoryCap {
            before: None,
            stop,
            what,
        });
    }
    let before = getrlimit(Resource::Data);
    // The soft limit only (within the hard one), so that it can be raised again.
    let backstop = limit.saturating_mul(3);
    let current = before
        .maximum
        .map_or(backstop, |maximum| backstop.min(maximum));
    setrlimit(
        Resource::Data,
        Rlimit {
            current: Some(current),
            maximum: before.maximum,
        },
    )
    .map_err(std::io::Error::from)
    .context("cannot cap this process's memory (--render-memory)")?;
    let cap = MemoryCap {
        before: Some(before),
        stop: Arc::clone(&stop),
        what: Arc::clone(&what),
    };
    std::thread::Builder::new()
        .name("memory-watch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EVERY);
                if !stop.load(Ordering::Relaxed) && data_segment().is_some_and(|b| b > limit) {
                    let rendering = flotilla_render::progress::current_renders();
                    let of = what.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    eprintln!("{}", exhausted(limit, of.as_deref(), &rendering));
                    std::process::exit(i32::from(EXIT_ERROR));
                }
            }
        })
        .context("cannot start the thread that watches memory")?;
    Ok(cap)
}

/// The error of a render (of `of`, when named) stopped at its memory limit, naming
/// the templates it was rendering.
fn exhausted(limit: u64, of: Option<&str>, rendering: &[String]) -> String {
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
    let render = of.map_or_else(
        || "the render".to_string(),
        |of| format!("the render of {of}"),
    );
    format!(
        "error: {render} needed more than {} of memory (--render-memory) and was \
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
            exhausted(gib, None, &["w/grow.yaml.j2 for cluster red".into()]),
            "error: the render needed more than 4 GiB of memory (--render-memory) and was \
             stopped (it was rendering w/grow.yaml.j2 for cluster red)"
        );
        assert!(
            exhausted(gib, None, &["a".into(), "b".into(), "c".into()])
                .ends_with("(it was rendering a, and 2 other templates)")
        );
        assert!(exhausted(gib, None, &[]).contains("a fleet larger than the limit allows"));
        assert!(
            exhausted(gib, Some("BASE (main)"), &[])
                .starts_with("error: the render of BASE (main) needed more than 4 GiB")
        );
    }

    #[test]
    fn the_data_segment_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(data_segment().is_some_and(|bytes| bytes > 0));
        }
    }

    #[test]
    fn the_cap_holds_while_it_lives_and_is_lifted_after() {
        let before = getrlimit(Resource::Data);
        {
            let _cap = cap(1 << 40).expect("capped");
            let capped = getrlimit(Resource::Data);
            let expected = before.maximum.map_or(3 << 40, |m| m.min(3 << 40));
            assert_eq!(capped.current, Some(expected));
            assert_eq!(capped.maximum, before.maximum);
        }
        assert_eq!(getrlimit(Resource::Data), before);
        // No cap: nothing changes.
        drop(cap(0).expect("no cap"));
        assert_eq!(getrlimit(Resource::Data), before);
    }
}
