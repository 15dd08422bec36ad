//! Rendering in a process of its own, under a memory limit.
//!
//! Fuel bounds what one template does for one cluster (its instructions and the
//! data it builds, which minijinja charges by the byte) and the output cap what it
//! writes, but nothing bounds a whole commit's render: 200 templates of 4 MB each,
//! every one within its budgets, are 800 MB for one cluster, and a fault of the
//! template engine or of any other step could ask for more. A render inside the
//! hub's process would take the hub down with it.
//! `flotilla serve` therefore renders commits in a child process (the same binary,
//! `flotilla render-worker`) whose data segment is capped with `RLIMIT_DATA`
//! (`--render-memory`): a template past it ends only that process, and the hub
//! reports the commit as failed and keeps serving the last good bundles. The child
//! is killed when a render passes its deadline or does not end with an answer, and
//! when the hub stops, and it dies with the hub (`PR_SET_PDEATHSIG`); otherwise it
//! renders commit after commit ([`RenderSession`]), keeping its last render (its
//! bundles' digests and its provenance) and that render's parse of the cluster files
//! between them, so that neither is sent or parsed again. Its working set never
//! becomes the hub's.
//!
//! The protocol is private to one binary (parent and child are the same build): the
//! snapshot and the limits go in on standard input, with the render to render since
//! when there is one (the child then renders only what changed since): the one it
//! keeps, when the hub kept it too, or else the hub's last clean render as its
//! bundles' digests and its provenance only. The child first writes which clusters it
//! renders in part, and the hub answers with their previous bundles (the resources
//! the child merges with); then the output comes back on standard output as a JSON
//! header (revision, diagnostics, memberships, labels, rollout plan) followed by
//! every distinct resource once, each cluster's bundle as indexes into them (so
//! clusters that share resources still share them), and the render's provenance,
//! each distinct list in it once; a bundle, inputs or provenance the hub has already
//! is written as "the same", and memberships and labels only for the clusters whose
//! own inputs (their file and groups, all that those come from) changed.
//!
//! The supervisor ([`supervisor`]) starts, feeds and watches the child and tells
//! how a render ended; the child's loop ([`child`]) renders request after
//! request; the codec ([`codec`]) is how requests and renders cross the pipes.

use std::path::PathBuf;
use std::time::Duration;

use flotilla_render::RenderOutput;

mod child;
mod codec;
mod headers;
mod supervisor;
#[cfg(test)]
mod tests;

pub use child::run_worker;
pub use codec::{Known, decode_output, encode_output};
pub use headers::{KeptHeaders, SEALING_HEADERS_FILE};
pub use supervisor::RenderSession;

/// What starts a line of the render process's standard error that the hub logs as
/// a warning when it comes (the rest is kept to tell how a render failed).
const WARNING: &str = "warning: ";

/// The hidden subcommand of the `flotilla` binary that runs [`run_worker`].
pub const WORKER_COMMAND: &str = "render-worker";

/// The default cap on a render's memory: 4 GiB, four times what a render of 10,000
/// clusters whose every manifest is a per-cluster template needs.
pub const DEFAULT_RENDER_MEMORY: u64 = 4 * 1024 * 1024 * 1024;

/// Where and how renders run in a child process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderWorker {
    /// The `flotilla` binary to run as `PROGRAM render-worker`.
    pub program: PathBuf,
    /// The child's `RLIMIT_DATA`, in bytes; `None` for no limit.
    pub memory_limit: Option<u64>,
}

/// How a render ended, on the hub's own thread or in a child process.
#[derive(Debug)]
pub enum Rendered {
    /// The render, and how long it took.
    Done(Box<RenderOutput>, Duration),
    /// Not finished within its deadline and the grace after it; the time waited.
    Abandoned(Duration, Option<String>),
    /// The hub is shutting down; the render was told to stop (or killed).
    ShuttingDown,
    /// The render process went past its memory limit; what it was rendering then
    /// (`FILE for cluster NAME`), if it said.
    OutOfMemory(Option<String>),
    /// The render process could not be started (the binary replaced or removed
    /// under a running hub, say).
    CannotStart(String),
    /// It panicked, crashed, was killed by someone else, or said something unreadable.
    Panicked(String),
}
