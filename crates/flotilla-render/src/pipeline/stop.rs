//! Stopping a render: its deadline (`--render-timeout`) and its cancel flag, asked
//! between units of work, and the output of a render that stopped, naming the files
//! that were being rendered when the deadline passed.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;

use crate::{RenderOptions, RenderOutput};

/// Whether a render should stop: it was cancelled, or its deadline passed. Workers
/// ask between units of work (a template render, a unit, a cluster's assembly);
/// template fuel bounds the work inside one unit. The files being rendered when the
/// deadline passed are named in the error.
pub(super) struct Stop<'a> {
    cancel: Option<&'a AtomicBool>,
    deadline: Instant,
    timeout: Duration,
    stopped: AtomicBool,
    /// What each worker thread of the pool is on (and, last, any other thread):
    /// each locks only its own, so a million template renders do not contend.
    slots: Box<[Mutex<Slot>]>,
    /// The files in flight when the deadline passed.
    culprits: Mutex<Vec<String>>,
}

/// The file a worker is on or was on last, and since when.
#[derive(Default)]
struct Slot {
    file: String,
    busy: bool,
    started: Option<Instant>,
}

impl<'a> Stop<'a> {
    pub(super) fn new(options: &RenderOptions<'a>) -> Stop<'a> {
        Stop {
            cancel: options.cancel,
            deadline: Instant::now() + options.limits.render_timeout,
            timeout: options.limits.render_timeout,
            stopped: AtomicBool::new(false),
            slots: (0..=rayon::current_num_threads())
                .map(|_| Mutex::default())
                .collect(),
            culprits: Mutex::default(),
        }
    }

    /// Asks whether to stop; the first worker to find the deadline passed notes
    /// which files were in flight (or, with none, the one started last).
    pub(super) fn now(&self) -> bool {
        self.at(Instant::now())
    }

    /// [`Stop::now`] at the time `now`.
    fn at(&self, now: Instant) -> bool {
        if self.stopped.load(Ordering::Relaxed) {
            return true;
        }
        let cancelled = self.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        if !cancelled && now < self.deadline {
            return false;
        }
        if !self.stopped.swap(true, Ordering::Relaxed) && !cancelled {
            let slots: Vec<_> = self.slots.iter().map(lock).collect();
            let mut culprits: BTreeSet<String> = slots
                .iter()
                .filter(|slot| slot.busy)
                .map(|slot| slot.file.clone())
                .collect();
            if culprits.is_empty()
                && let Some(last) = slots
                    .iter()
                    .filter(|slot| slot.started.is_some())
                    .max_by_key(|slot| slot.started)
            {
                culprits.insert(last.file.clone());
            }
            *lock(&self.culprits) = culprits.into_iter().collect();
        }
        true
    }

    /// Runs `work` on `file` unless the render should stop, noting the file as in
    /// flight meanwhile.
    pub(super) fn run<T>(&self, file: &str, work: impl FnOnce() -> T) -> Option<T> {
        let now = Instant::now();
        if self.at(now) {
            return None;
        }
        let index = rayon::current_thread_index().unwrap_or(usize::MAX);
        let slot = &self.slots[index.min(self.slots.len() - 1)];
        // A worker waiting inside `work` may take up other work on this thread:
        // what it was on comes back after.
        let outer = {
            let mut slot = lock(slot);
            let outer = slot.busy.then(|| std::mem::take(&mut slot.file));
            slot.file.clear();
            slot.file.push_str(file);
            slot.busy = true;
            slot.started = Some(now);
            outer
        };
        let result = work();
        let mut slot = lock(slot);
        match outer {
            Some(outer) => slot.file = outer,
            None => slot.busy = false,
        }
        Some(result)
    }

    /// The output of a render that stopped: what was found before, and why it stopped.
    pub(super) fn abandoned(
        &self,
        snapshot: &FleetSnapshot,
        mut diagnostics: Vec<Diagnostic>,
    ) -> RenderOutput {
        let cancelled = self.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        let culprits = lock(&self.culprits).clone();
        if cancelled {
            diagnostics.push(Diagnostic::error("the render was cancelled"));
        } else if culprits.is_empty() {
            diagnostics.push(Diagnostic::error(format!(
                "the render took longer than {} (--render-timeout) and was abandoned",
                humanize(self.timeout)
            )));
        }
        for file in culprits {
            diagnostics.push(
                Diagnostic::error(format!(
                    "the render took longer than {} (--render-timeout) and was abandoned while \
                     this file was being rendered",
                    humanize(self.timeout)
                ))
                .in_file(file.as_str()),
            );
        }
        diagnostics.sort();
        diagnostics.dedup();
        RenderOutput {
            revision: snapshot.revision.clone(),
            diagnostics,
            ..RenderOutput::default()
        }
    }
}

/// A lock, whatever a panicking holder left behind.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A duration as a person writes it: `30s`, `1500ms`.
fn humanize(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}
