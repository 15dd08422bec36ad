//! Which template each render thread is on, for a process that watches itself.
//!
//! A render that runs out of memory is ended by the kernel or aborts, and one that
//! never finishes is abandoned: neither can say, after the fact, which file did it.
//! A process that renders (the hub's render process, `validate`) may start a
//! [`watch`]: a thread that looks at every render thread's current template a few
//! times a second and tells, once per template render, of one that has run longer
//! than a threshold (its file and its cluster). The last such line then names the
//! file when the process dies. Without a watcher, marking a template costs one
//! atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use minijinja::Value;

/// How a line of [`watch`] starts (a parent reading the process's stderr looks for it).
pub const STILL_RENDERING: &str = "still rendering ";

/// The line a process that renders commit after commit writes as each starts, so that
/// [`last_slow_render`] looks at the current render's lines only.
pub const RENDER_STARTED: &str = "render started";

/// Whether a watcher runs: templates are marked only then.
static WATCHED: AtomicBool = AtomicBool::new(false);

/// What one render thread is on.
struct Current {
    file: String,
    /// The template's context, for the cluster's name (read only when told).
    context: Value,
    since: Instant,
    active: bool,
    told: bool,
}

type Slot = Arc<Mutex<Current>>;

/// Every render thread's slot, for the watcher.
fn slots() -> &'static Mutex<Vec<Weak<Mutex<Current>>>> {
    static SLOTS: OnceLock<Mutex<Vec<Weak<Mutex<Current>>>>> = OnceLock::new();
    SLOTS.get_or_init(Mutex::default)
}

/// A lock that a panic elsewhere does not poison for good: what is kept is only
/// ever a description.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

thread_local! {
    static SLOT: Slot = {
        let slot = Arc::new(Mutex::new(Current {
            file: String::new(),
            context: Value::UNDEFINED,
            since: Instant::now(),
            active: false,
            told: false,
        }));
        lock(slots()).push(Arc::downgrade(&slot));
        slot
    };
}

/// Marks this thread as rendering the template at `file` with `context` until the
/// returned guard is dropped.
pub(crate) fn rendering(file: &str, context: &Value) -> Rendering {
    if !WATCHED.load(Ordering::Relaxed) {
        return Rendering { marked: false };
    }
    SLOT.with(|slot| {
        let mut current = lock(slot);
        current.file.clear();
        current.file.push_str(file);
        current.context = context.clone();
        current.since = Instant::now();
        current.active = true;
        current.told = false;
    });
    Rendering { marked: true }
}

/// While it lives, this thread is marked as rendering a template.
pub(crate) struct Rendering {
    marked: bool,
}

impl Drop for Rendering {
    fn drop(&mut self) {
        if self.marked {
            SLOT.with(|slot| {
                let mut current = lock(slot);
                current.active = false;
                current.context = Value::UNDEFINED;
            });
        }
    }
}

/// Starts the watcher: every `every`, each template render that has run for `slow`
/// or longer is told to `tell`, once, as `still rendering FILE for cluster NAME
/// (N.N s)`.
/// A process has one watcher: a second call does nothing.
pub fn watch(every: Duration, slow: Duration, tell: impl Fn(&str) + Send + 'static) {
    if WATCHED.swap(true, Ordering::Relaxed) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("render-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                for line in slow_renders(slow) {
                    tell(&line);
                }
            }
        });
    if spawned.is_err() {
        // Without its thread nothing reads the marks: stop making them.
        WATCHED.store(false, Ordering::Relaxed);
    }
}

/// The template renders running for `slow` or longer not told yet, as lines (each
/// is then told).
fn slow_renders(slow: Duration) -> Vec<String> {
    let mut lines = Vec::new();
    for slot in live_slots() {
        let mut current = lock(&slot);
        let took = current.since.elapsed();
        if current.active && !current.told && took >= slow {
            current.told = true;
            lines.push(format!(
                "{STILL_RENDERING}{} ({:.1} s)",
                current.describe(),
                took.as_secs_f64()
            ));
        }
    }
    lines
}

/// The slots of the render threads that still run.
fn live_slots() -> Vec<Slot> {
    let mut slots = lock(slots());
    slots.retain(|slot| slot.strong_count() > 0);
    slots.iter().filter_map(Weak::upgrade).collect()
}

impl Current {
    /// `FILE for cluster NAME` (or `FILE` when the context names no cluster).
    fn describe(&self) -> String {
        let cluster = self
            .context
            .get_attr("cluster")
            .and_then(|cluster| cluster.get_attr("name"))
            .ok()
            .filter(|name| !name.is_undefined())
            .map(|name| format!(" for cluster {name}"))
            .unwrap_or_default();
        format!("{}{cluster}", self.file)
    }
}

/// Every template render running now, as `FILE for cluster NAME`, longest running
/// first (empty without a [`watch`], which is what has templates marked).
pub fn current_renders() -> Vec<String> {
    let mut running: Vec<(Instant, String)> = live_slots()
        .iter()
        .filter_map(|slot| {
            let current = lock(slot);
            current.active.then(|| (current.since, current.describe()))
        })
        .collect();
    running.sort();
    running.into_iter().map(|(_, what)| what).collect()
}

/// Whether `line` is one of this module's ([`RENDER_STARTED`], or a [`watch`] line)
/// rather than an error.
pub fn is_progress(line: &str) -> bool {
    let line = line.trim();
    line == RENDER_STARTED || line.starts_with(STILL_RENDERING)
}

/// What the last [`watch`] line in `text` since its last [`RENDER_STARTED`] line
/// says was being rendered (`FILE for cluster NAME`), if any.
pub fn last_slow_render(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .take_while(|line| line.trim() != RENDER_STARTED)
        .find_map(|line| {
            let rest = line.trim().strip_prefix(STILL_RENDERING)?;
            Some(rest.rsplit_once(" (").map_or(rest, |(what, _)| what))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_render_past_the_threshold_is_told_once_with_its_file_and_cluster() {
        WATCHED.store(true, Ordering::Relaxed);
        let context = crate::template::value_of(&serde_json::json!({"cluster": {"name": "red"}}));
        let guard = rendering("workloads/w/manifests/big.yaml.j2", &context);
        std::thread::sleep(Duration::from_millis(30));
        let lines: Vec<String> = slow_renders(Duration::from_millis(20))
            .into_iter()
            .filter(|l| l.contains("big.yaml.j2"))
            .collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0]
                .starts_with("still rendering workloads/w/manifests/big.yaml.j2 for cluster red ("),
            "{lines:?}"
        );
        assert!(
            current_renders()
                .contains(&"workloads/w/manifests/big.yaml.j2 for cluster red".to_string()),
            "{:?}",
            current_renders()
        );
        assert_eq!(
            last_slow_render(&format!("other\n{}\nmore", lines[0])),
            Some("workloads/w/manifests/big.yaml.j2 for cluster red")
        );
        // Told once; and once it is done, nothing more.
        assert!(
            !slow_renders(Duration::ZERO)
                .iter()
                .any(|l| l.contains("big.yaml.j2"))
        );
        drop(guard);
        let again = rendering("workloads/w/manifests/quick.yaml.j2", &context);
        drop(again);
        assert!(
            !slow_renders(Duration::ZERO)
                .iter()
                .any(|l| l.contains("quick.yaml.j2"))
        );
        assert_eq!(last_slow_render("nothing of the kind"), None);
        // A line of an earlier render is not this render's.
        assert_eq!(
            last_slow_render(&format!("{}\n{RENDER_STARTED}\n", lines[0])),
            None
        );
    }
}
