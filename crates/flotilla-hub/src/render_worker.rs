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

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, Read, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use flotilla_core::bundle::{Bundle, Digest, Resource, ResourceKey};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::rollout::RolloutPlan;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::inputs::{ClusterInput, InputDigest, WorkloadInputs};
use flotilla_render::{
    ClusterProvenance, PatchMatches, Provenance, RenderOptions, RenderOutput, render_since_fetching,
};

/// The hidden subcommand of the `flotilla` binary that runs [`run_worker`].
pub const WORKER_COMMAND: &str = "render-worker";

/// The default cap on a render's memory: 4 GiB, four times what a render of 10,000
/// clusters whose every manifest is a per-cluster template needs.
pub const DEFAULT_RENDER_MEMORY: u64 = 4 * 1024 * 1024 * 1024;

/// How much of the child's standard error is kept for the report.
const STDERR_KEPT: u64 = 16 * 1024;

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
    Abandoned(Duration),
    /// The hub is shutting down; the render was told to stop (or killed).
    ShuttingDown,
    /// The render process went past its memory limit.
    OutOfMemory,
    /// The render process could not be started (the binary replaced or removed
    /// under a running hub, say).
    CannotStart(String),
    /// It panicked, crashed, was killed by someone else, or said something unreadable.
    Panicked(String),
}

/// Everything of the input but the files' contents.
#[derive(Serialize, Deserialize)]
struct InputHeader {
    limits: Limits,
    revision: String,
    problems: Vec<Diagnostic>,
    skipped: BTreeMap<String, String>,
}

/// A render's header. Memberships and labels are written as changes against the
/// render the reader has, when it has one (see [`Known::Render`]).
#[derive(Serialize, Deserialize)]
struct Header {
    revision: String,
    diagnostics: Vec<Diagnostic>,
    memberships: Changes<Vec<String>>,
    labels: Changes<BTreeMap<String, String>>,
    rollouts: RolloutPlan,
}

/// A map, whole or as changes against the one the reader has: the entries that
/// differ or are new, and the keys that are gone.
#[derive(Serialize, Deserialize)]
struct Changes<V> {
    /// Whether `changed` and `gone` are against the reader's render.
    against_known: bool,
    changed: BTreeMap<String, V>,
    gone: Vec<String>,
}

impl<V: Clone> Changes<V> {
    fn whole(map: &BTreeMap<String, V>) -> Changes<V> {
        Changes {
            against_known: false,
            changed: map.clone(),
            gone: Vec::new(),
        }
    }

    /// The entries of `now` whose cluster's own inputs (its file and its groups,
    /// which are all its memberships and labels come from) differ from `since`'s.
    fn by_inputs(since: &Provenance, now: &RenderOutput, map: &BTreeMap<String, V>) -> Changes<V> {
        let own = |p: &Provenance, name: &str| p.inputs.clusters.get(name).map(|i| i.own);
        Changes {
            against_known: true,
            changed: map
                .iter()
                .filter(|(name, _)| {
                    own(since, name).is_none() || own(since, name) != own(&now.provenance, name)
                })
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
            gone: since
                .inputs
                .clusters
                .keys()
                .filter(|name| !map.contains_key(*name))
                .cloned()
                .collect(),
        }
    }

    fn read(self, since: Option<&BTreeMap<String, V>>) -> io::Result<BTreeMap<String, V>> {
        if !self.against_known {
            return Ok(self.changed);
        }
        let mut map = since
            .ok_or_else(|| {
                invalid("the render answered with changes to a render the hub does not have")
            })?
            .clone();
        for key in &self.gone {
            map.remove(key);
        }
        map.extend(self.changed);
        Ok(map)
    }
}

/// A render process kept between commits (see the module's documentation): it is
/// started for the first render, renders each commit after, and keeps its last
/// render and parse of the cluster files between them. It is ended (and the next
/// render starts a new one) whenever a render does not end with an answer: past
/// its deadline, out of memory, crashed, unreadable, or the hub stopping; and it
/// ends with the session.
pub struct RenderSession {
    worker: RenderWorker,
    process: Option<Process>,
}

/// A running render process.
struct Process {
    child: tokio::process::Child,
    /// Its standard input and output, for blocking writes and reads on threads of
    /// their own; `None` only while a render uses them.
    stdin: Option<std::fs::File>,
    stdout: Option<std::fs::File>,
    /// The end of its standard error, read until it exits.
    errors: tokio::task::JoinHandle<String>,
    /// The hub's copy of the render the process keeps, when the hub keeps it too
    /// (see [`RenderSession::keeps`]).
    kept: Option<Arc<RenderOutput>>,
}

impl RenderSession {
    pub fn new(worker: RenderWorker) -> RenderSession {
        RenderSession {
            worker,
            process: None,
        }
    }

    /// The memory limit of the render process.
    pub fn memory_limit(&self) -> Option<u64> {
        self.worker.memory_limit
    }

    /// The hub keeps `output`, the render this session answered last, to render the
    /// next commit since: the render process keeps it too, so the next request need
    /// not send it.
    pub fn keeps(&mut self, output: &Arc<RenderOutput>) {
        if let Some(process) = &mut self.process {
            process.kept = Some(output.clone());
        }
    }

    /// Renders `snapshot` (since `previous`, the hub's last clean render, if any) in
    /// the render process, started if none runs. Resolves when it has answered, or
    /// ends it when `deadline` passes or `stop` resolves first.
    pub async fn render(
        &mut self,
        snapshot: FleetSnapshot,
        previous: Option<Arc<RenderOutput>>,
        limits: &Limits,
        deadline: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) -> Rendered {
        let started = std::time::Instant::now();
        let revision = snapshot.revision.clone();
        if self.process.is_none() {
            match self.worker.start() {
                Ok(process) => self.process = Some(process),
                Err(rendered) => return rendered,
            }
        }
        let Some(process) = self.process.as_mut() else {
            return Rendered::Panicked("no render process".into());
        };
        // What the process keeps is the hub's previous render: it need not be sent.
        let since_kept = match (&previous, process.kept.take()) {
            (Some(previous), Some(kept)) => Arc::ptr_eq(previous, &kept),
            _ => false,
        };
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            self.process = None;
            return Rendered::Panicked("the render process lost its pipes".into());
        };
        // The snapshot is written and the answer read as they go, each on a thread of
        // its own (blocking on the pipe): a fleet is up to --max-fleet-bytes, and a
        // render of 10,000 per-cluster templates answers with hundreds of megabytes;
        // neither is ever held twice. Feeding and draining at once, neither side
        // waits on a full pipe.
        let limits = limits.clone();
        let kept = previous.clone();
        let (ask, asked) = std::sync::mpsc::channel();
        let feed = tokio::task::spawn_blocking(move || {
            let mut input = io::BufWriter::with_capacity(1 << 20, stdin);
            // A child that dies early closes its end; what it says then is the news.
            let fed = feed_input(
                &snapshot,
                previous.as_deref(),
                since_kept,
                &limits,
                &mut input,
                &asked,
            );
            fed.and_then(|()| input.into_inner().map_err(|e| e.into_error()))
        });
        let drain = tokio::task::spawn_blocking(move || {
            let mut output = io::BufReader::with_capacity(1 << 20, stdout);
            let answer = drain_output(&mut output, kept.as_deref(), &ask);
            // Nothing of this answer is left in the buffer: the reader ends with it.
            (answer, output.into_inner())
        });
        let timer = tokio::time::sleep(deadline);
        let (answer, stdout) = tokio::select! {
            drained = drain => match drained {
                Ok(drained) => drained,
                Err(err) => {
                    self.process = None;
                    return Rendered::Panicked(format!("cannot read the render: {err}"));
                }
            },
            _ = timer => {
                // Dropping the process kills it; the threads then meet closed pipes.
                self.process = None;
                return Rendered::Abandoned(started.elapsed());
            }
            _ = stop => {
                self.process = None;
                return Rendered::ShuttingDown;
            }
        };
        let stdin = match (answer.is_ok(), feed.await) {
            (true, Ok(Ok(stdin))) => Some(stdin),
            _ => None,
        };
        match (answer, stdin) {
            (Ok(output), Some(stdin)) => {
                if let Some(process) = self.process.as_mut() {
                    process.stdin = Some(stdin);
                    process.stdout = Some(stdout);
                }
                // The memory a render took stays mapped in the process (freed, not
                // returned): a process past half its limit could not be sure of
                // room for another render as large, and a new one is started then.
                let limit = self.worker.memory_limit;
                if let (Some(limit), Some(process)) = (limit, &self.process) {
                    let size = process.child.id().and_then(data_size);
                    if size.is_none_or(|d| d > limit / 2) {
                        tracing::info!(
                            data_mib = size.map(|d| d >> 20),
                            limit_mib = limit >> 20,
                            "the render process holds more than half of --render-memory after this render; the next commit is rendered in a new one"
                        );
                        self.process = None;
                    }
                }
                Rendered::Done(Box::new(output), started.elapsed())
            }
            (answer, _) => {
                let Some(process) = self.process.take() else {
                    return Rendered::Panicked("no render process".into());
                };
                process.failed(answer.err(), &revision).await
            }
        }
    }
}

impl RenderWorker {
    /// Starts a render process.
    fn start(&self) -> Result<Process, Rendered> {
        let mut command = tokio::process::Command::new(&self.program);
        command.arg(WORKER_COMMAND);
        if let Some(limit) = self.memory_limit {
            command.arg("--memory-limit").arg(limit.to_string());
        }
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|err| {
            Rendered::CannotStart(format!(
                "{} {WORKER_COMMAND}: {err}",
                self.program.display()
            ))
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(Rendered::Panicked("the render process has no pipes".into()));
        };
        let (stdin, stdout) = match (
            blocking(stdin.into_owned_fd()),
            blocking(stdout.into_owned_fd()),
        ) {
            (Ok(stdin), Ok(stdout)) => (stdin, stdout),
            (Err(err), _) | (_, Err(err)) => {
                return Err(Rendered::Panicked(format!(
                    "cannot talk to the render process: {err}"
                )));
            }
        };
        // Read as it comes (the process writes to it only when it fails), keeping the
        // last of it.
        let errors = tokio::spawn(async move {
            let mut stderr = stderr;
            let mut text: Vec<u8> = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                text.extend_from_slice(&chunk[..n]);
                let excess = text.len().saturating_sub(STDERR_KEPT as usize);
                text.drain(..excess);
            }
            String::from_utf8_lossy(&text).into_owned()
        });
        Ok(Process {
            child,
            stdin: Some(stdin),
            stdout: Some(stdout),
            errors,
            kept: None,
        })
    }
}

impl Process {
    /// Why a render ended without an answer (`read`, the error reading it, if any):
    /// how the process ended, and what it said.
    async fn failed(mut self, read: Option<io::Error>, revision: &str) -> Rendered {
        // An answer the hub could not read: the child then meets a closed pipe, and
        // what went wrong is the reading, not how the child ended.
        if let Some(err) = &read
            && err.kind() == io::ErrorKind::InvalidData
        {
            return Rendered::Panicked(format!("the render's answer is unreadable: {err}"));
        }
        let status = match tokio::time::timeout(EXIT_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(err)) => {
                return Rendered::Panicked(format!("cannot wait for the render: {err}"));
            }
            Err(_) => {
                let why = read.map(|e| e.to_string()).unwrap_or_default();
                return Rendered::Panicked(format!(
                    "the render process stopped answering ({why}) and was ended"
                ));
            }
        };
        let errors = self.errors.await.unwrap_or_default();
        if status.success() {
            return Rendered::Panicked(format!(
                "the render process ended without an answer ({status})"
            ));
        }
        // An allocation that failed aborts ("memory allocation of N bytes failed");
        // one reading the input fails as an error ("out of memory").
        if let Some(line) = errors
            .lines()
            .find(|l| l.contains("memory allocation of") || l.contains("out of memory"))
        {
            tracing::warn!(%revision, "the render process ran out of memory: {}", line.trim());
            return Rendered::OutOfMemory;
        }
        let last = errors.lines().rev().find(|l| !l.trim().is_empty());
        Rendered::Panicked(match last {
            Some(line) => format!("the render process ended with {status}: {}", line.trim()),
            None => format!("the render process ended with {status}"),
        })
    }
}

/// The size of a process's data segment (what `RLIMIT_DATA` limits), from
/// `/proc`; `None` if it cannot be read.
fn data_size(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    vm_data(&status)
}

/// `VmData` of a `/proc/PID/status` text, in bytes.
fn vm_data(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmData:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// How long a render process that stopped answering is given to end on its own.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// A pipe end of the child as a file for blocking reads or writes (tokio opens it
/// non-blocking).
fn blocking(fd: io::Result<std::os::fd::OwnedFd>) -> io::Result<std::fs::File> {
    let fd = fd?;
    rustix::io::ioctl_fionbio(&fd, false)?;
    Ok(std::fs::File::from(fd))
}

/// The hub's side of the input: the snapshot, the previous render (digests and
/// provenance, no resources; or, when the process keeps it, only that), then, once
/// the child has said which clusters it renders in part (through `asked`), their
/// previous bundles.
fn feed_input(
    snapshot: &FleetSnapshot,
    previous: Option<&RenderOutput>,
    since_kept: bool,
    limits: &Limits,
    mut input: impl Write,
    asked: &std::sync::mpsc::Receiver<Vec<String>>,
) -> io::Result<()> {
    let since = match previous {
        Some(_) if since_kept => Since::Kept,
        Some(previous) => Since::Given(previous),
        None => Since::Nothing,
    };
    encode_input(snapshot, since, limits, &mut input)?;
    input.flush()?;
    // The child asks (with some names) only while it renders, and waits for the
    // answer; none asked, none is written.
    if let Some(previous) = previous
        && let Ok(names) = asked.recv()
        && !names.is_empty()
    {
        let answer = RenderOutput {
            bundles: names
                .iter()
                .filter_map(|name| Some((name.clone(), previous.bundles.get(name)?.clone())))
                .collect(),
            ..RenderOutput::default()
        };
        encode_output(&answer, Known::Nothing, &mut input)?;
        input.flush()?;
    }
    Ok(())
}

/// The hub's side of the output: which clusters the child asks the previous
/// bundles of (passed on through `ask`), then the render.
fn drain_output(
    mut output: impl Read,
    previous: Option<&RenderOutput>,
    ask: &std::sync::mpsc::Sender<Vec<String>>,
) -> io::Result<RenderOutput> {
    let mut names = Vec::new();
    for _ in 0..read_len(&mut output)? {
        names.push(read_text(&mut output)?);
    }
    let _ = ask.send(names);
    // Not past the answer: the process's next answer follows on the same pipe.
    read_output(output, previous.map_or(Known::Nothing, Known::Render))
}

/// The child's side: caps its own memory, then renders request after request until
/// its input ends: each is the snapshot and limits read from `input`, its render
/// written to `output`. Between requests it keeps its last render (digests and
/// provenance) and that render's parse of the cluster files, so the next commit can
/// be rendered since it without the hub sending it again, and unchanged cluster
/// files are not parsed again. Rendering runs out of memory by aborting the process,
/// which the parent recognises.
pub fn run_worker(
    memory_limit: Option<u64>,
    input: impl Read,
    output: impl Write,
) -> io::Result<()> {
    // Dies with the hub, whatever way the hub ends.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(io::Error::from)?;
    if let Some(limit) = memory_limit {
        rustix::process::setrlimit(
            rustix::process::Resource::Data,
            rustix::process::Rlimit {
                current: Some(limit),
                maximum: Some(limit),
            },
        )
        .map_err(io::Error::from)?;
    }
    let mut input = io::BufReader::new(input);
    let mut output = io::BufWriter::new(output);
    let mut kept: Option<RenderOutput> = None;
    // A request starts with its header; the end of the input, between requests,
    // ends the worker.
    while !input.fill_buf()?.is_empty() {
        let rendered = render_request(&mut input, &mut output, kept.take())?;
        kept = Some(kept_for_next(rendered));
    }
    Ok(())
}

/// Reads one request, renders it (since the render it names, and with the parse of
/// `kept`, the last render), and writes the answer; returns the render.
fn render_request(
    input: &mut impl BufRead,
    output: &mut impl Write,
    kept: Option<RenderOutput>,
) -> io::Result<RenderOutput> {
    let (limits, snapshot, since) = decode_input(&mut *input)?;
    let parsed = kept.as_ref().and_then(|k| k.parsed.clone());
    let previous =
        match since {
            Since::Nothing => None,
            Since::Given(mut previous) => {
                previous.parsed = parsed.clone();
                Some(previous)
            }
            Since::Kept => Some(kept.ok_or_else(|| {
                invalid("asked to render since a render this process does not keep")
            })?),
        };
    let options = RenderOptions {
        limits,
        ..RenderOptions::default()
    };
    // The clusters rendered in part, asked for once: their previous bundles are read
    // back from the hub. Asked or not, the request is written before the render.
    let mut asked: Option<Vec<String>> = None;
    let mut fetch = |names: &[String]| -> Option<Vec<Bundle>> {
        asked = Some(names.to_vec());
        write_request(output, names).ok()?;
        let answer = read_output(&mut *input, Known::Nothing).ok()?;
        names
            .iter()
            .map(|n| answer.bundles.get(n).cloned())
            .collect()
    };
    let rendered = match &previous {
        Some(previous) => render_since_fetching(previous, &snapshot, &options, &mut fetch),
        // Nothing to render since, but the last render's parse of the cluster files
        // can still be taken.
        None => {
            let parse_only = RenderOutput {
                parsed,
                ..RenderOutput::default()
            };
            render_since_fetching(&parse_only, &snapshot, &options, &mut fetch)
        }
    };
    drop(snapshot);
    if asked.is_none() {
        write_request(output, &[])?;
    }
    let known = previous.as_ref().map_or(Known::Nothing, Known::Render);
    encode_output(&rendered, known, output)?;
    output.flush()?;
    Ok(rendered)
}

/// What the worker keeps of a render for the next request: what a hub sends of a
/// render to render since it (its bundles' digests, its diagnostics and
/// provenance) and its parse of the cluster files.
fn kept_for_next(mut rendered: RenderOutput) -> RenderOutput {
    for bundle in rendered.bundles.values_mut() {
        bundle.resources = Vec::new();
    }
    RenderOutput {
        memberships: BTreeMap::new(),
        labels: BTreeMap::new(),
        rollouts: RolloutPlan::default(),
        ..rendered
    }
}

/// The names of the clusters whose previous bundles the child needs.
fn write_request(out: &mut impl Write, names: &[String]) -> io::Result<()> {
    put_len(out, names.len())?;
    for name in names {
        put_bytes(out, name.as_bytes())?;
    }
    out.flush()
}

fn put_len(out: &mut impl Write, len: usize) -> io::Result<()> {
    out.write_all(&(len as u64).to_le_bytes())
}

fn put_bytes(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    put_len(out, bytes.len())?;
    out.write_all(bytes)
}

/// The render a request is rendered since.
enum Since<P> {
    Nothing,
    /// This one, sent with the request (its digests and provenance).
    Given(P),
    /// The one the render process answered last and keeps.
    Kept,
}

/// Writes a snapshot and the limits to render it within: a JSON header, then each
/// distinct file content once (paths to the same content share it), then each path
/// with the index of its content; then which render to render since: none, one
/// given (as [`encode_output`] writes it, its bundles as digests only), or the one
/// the process keeps.
fn encode_input(
    snapshot: &FleetSnapshot,
    since: Since<&RenderOutput>,
    limits: &Limits,
    out: &mut impl Write,
) -> io::Result<()> {
    let header = InputHeader {
        limits: limits.clone(),
        revision: snapshot.revision.clone(),
        problems: snapshot.problems.clone(),
        skipped: snapshot.skipped.clone(),
    };
    put_bytes(out, &serde_json::to_vec(&header).map_err(io::Error::other)?)?;
    let (order, indexes) = by_address(snapshot.files.values().map(|text| Some(&**text)));
    put_len(out, order.len())?;
    for text in order {
        put_bytes(out, text.as_bytes())?;
    }
    put_len(out, snapshot.files.len())?;
    for (path, i) in snapshot.files.keys().zip(indexes.into_iter().flatten()) {
        put_bytes(out, path.as_bytes())?;
        put_len(out, i)?;
    }
    match since {
        Since::Nothing => put_len(out, 0),
        Since::Given(previous) => {
            put_len(out, 1)?;
            encode_output(previous, Known::Digests, out)
        }
        Since::Kept => put_len(out, 2),
    }
}

/// Reads what [`encode_input`] wrote, as it arrives (the files are not held twice),
/// and nothing after it.
fn decode_input(mut input: impl Read) -> io::Result<(Limits, FleetSnapshot, Since<RenderOutput>)> {
    let header: InputHeader = serde_json::from_slice(&read_bytes(&mut input)?).map_err(invalid)?;
    let count = read_len(&mut input)?;
    let mut texts: Vec<Arc<str>> = Vec::new();
    for _ in 0..count {
        texts.push(Arc::from(read_text(&mut input)?));
    }
    let count = read_len(&mut input)?;
    let mut files = BTreeMap::new();
    for _ in 0..count {
        let path = read_text(&mut input)?;
        let content = texts
            .get(read_len(&mut input)?)
            .ok_or_else(|| invalid("file index out of range"))?;
        files.insert(path, content.clone());
    }
    let since = match read_len(&mut input)? {
        0 => Since::Nothing,
        1 => Since::Given(read_output(&mut input, Known::Digests)?),
        2 => Since::Kept,
        _ => return Err(invalid("unknown render to render since")),
    };
    let snapshot = FleetSnapshot {
        files,
        revision: header.revision,
        problems: header.problems,
        skipped: header.skipped,
    };
    Ok((header.limits, snapshot, since))
}

/// Marks a bundle, or a cluster's inputs or provenance, that is the same as in the
/// render the reader already has.
const SAME: usize = usize::MAX;

/// What the reader of a render already knows of it.
#[derive(Clone, Copy)]
pub enum Known<'a> {
    /// Nothing: everything is written.
    Nothing,
    /// This render: what is the same in it is written as [`SAME`].
    Render(&'a RenderOutput),
    /// Nothing, but it needs the bundles' digests only: every bundle is written as
    /// [`SAME`] with its digest, and read as a bundle without resources; the
    /// memberships, labels and rollout plan are left out.
    Digests,
}

/// Writes a render: the header, every distinct resource once, then each bundle as
/// its cluster, digest and resource indexes, then its provenance (what an
/// incremental render from it compares). What the reader knows (see [`Known`]) is
/// written as [`SAME`] instead.
pub fn encode_output(
    rendered: &RenderOutput,
    known: Known<'_>,
    out: &mut impl Write,
) -> io::Result<()> {
    let since = match known {
        Known::Render(since) => Some(since),
        _ => None,
    };
    let unchanged = |bundle: &Bundle| match known {
        Known::Nothing => false,
        Known::Digests => true,
        Known::Render(since) => since
            .bundles
            .get(&bundle.cluster)
            .is_some_and(|b| b.digest == bundle.digest),
    };
    // A reader that needs the digests only (a render process rendering since this
    // render) needs none of the memberships, labels and rollout plan either. One
    // that has a render of the whole fleet gets the memberships and labels of the
    // clusters whose own inputs changed since.
    let (memberships, labels) = match known {
        Known::Digests => (
            Changes::whole(&BTreeMap::new()),
            Changes::whole(&BTreeMap::new()),
        ),
        Known::Render(since)
            if !since.provenance.inputs.is_empty() && !rendered.provenance.inputs.is_empty() =>
        {
            (
                Changes::by_inputs(&since.provenance, rendered, &rendered.memberships),
                Changes::by_inputs(&since.provenance, rendered, &rendered.labels),
            )
        }
        _ => (
            Changes::whole(&rendered.memberships),
            Changes::whole(&rendered.labels),
        ),
    };
    let header = Header {
        revision: rendered.revision.clone(),
        diagnostics: rendered.diagnostics.clone(),
        memberships,
        labels,
        rollouts: match known {
            Known::Digests => RolloutPlan::default(),
            _ => rendered.rollouts.clone(),
        },
    };
    put_bytes(out, &serde_json::to_vec(&header).map_err(io::Error::other)?)?;
    let mut index: HashMap<*const Resource, usize> = HashMap::new();
    let mut order: Vec<&Arc<Resource>> = Vec::new();
    for bundle in rendered.bundles.values().filter(|b| !unchanged(b)) {
        for resource in &bundle.resources {
            index.entry(Arc::as_ptr(resource)).or_insert_with(|| {
                order.push(resource);
                order.len() - 1
            });
        }
    }
    put_len(out, order.len())?;
    for resource in order {
        put_bytes(
            out,
            &serde_json::to_vec(&resource.key).map_err(io::Error::other)?,
        )?;
        put_bytes(out, &resource.canonical)?;
    }
    put_len(out, rendered.bundles.len())?;
    for bundle in rendered.bundles.values() {
        put_bytes(out, bundle.cluster.as_bytes())?;
        put_bytes(out, bundle.digest.as_str().as_bytes())?;
        if unchanged(bundle) {
            put_len(out, SAME)?;
            continue;
        }
        put_len(out, bundle.resources.len())?;
        for resource in &bundle.resources {
            put_len(out, index[&Arc::as_ptr(resource)])?;
        }
    }
    encode_provenance(&rendered.provenance, since.map(|s| &s.provenance), out)
}

fn put_digest(out: &mut impl Write, digest: &InputDigest) -> io::Result<()> {
    out.write_all(digest)
}

fn read_digest(input: &mut impl Read) -> io::Result<InputDigest> {
    let mut digest = [0u8; 32];
    input.read_exact(&mut digest)?;
    Ok(digest)
}

/// Each distinct list of workloads with their digests, once, then each cluster's
/// inputs (index of its list, own digest); each distinct list of the workloads of a
/// bundle's resources and of matched patches, once, then each cluster's provenance
/// (index of each list, custom scopes); either [`SAME`] where it equals `since`'s.
/// Clusters with the same workloads share their lists (most of a fleet's clusters
/// do), so the lists are written once, not once per cluster.
fn encode_provenance(
    provenance: &Provenance,
    since: Option<&Provenance>,
    out: &mut impl Write,
) -> io::Result<()> {
    // What is written, not "the same", per cluster.
    let inputs: Vec<(&String, Option<&ClusterInput>)> = provenance
        .inputs
        .clusters
        .iter()
        .map(|(name, input)| {
            let same = since.is_some_and(|s| s.inputs.clusters.get(name) == Some(input));
            (name, (!same).then_some(input))
        })
        .collect();
    let lists = put_lists(
        out,
        inputs.iter().map(|(_, i)| Some(&*i.as_ref()?.workloads)),
        |out, (workload, digest)| {
            put_bytes(out, workload.as_bytes())?;
            put_digest(out, digest)
        },
    )?;
    put_len(out, inputs.len())?;
    for ((name, input), list) in inputs.into_iter().zip(lists) {
        put_bytes(out, name.as_bytes())?;
        match input.zip(list) {
            Some((input, list)) => {
                put_len(out, list)?;
                put_digest(out, &input.own)?;
            }
            None => put_len(out, SAME)?,
        }
    }
    let clusters: Vec<(&String, Option<&ClusterProvenance>)> = provenance
        .clusters
        .iter()
        .map(|(name, found)| {
            let same = since.is_some_and(|s| s.clusters.get(name) == Some(found));
            (name, (!same).then_some(found))
        })
        .collect();
    let lists = put_lists(
        out,
        clusters
            .iter()
            .map(|(_, f)| Some(&*f.as_ref()?.resource_workloads)),
        |out, workload| out.write_all(&workload.to_le_bytes()),
    )?;
    let matches = put_lists(
        out,
        clusters
            .iter()
            .map(|(_, f)| Some(&*f.as_ref()?.patch_matches)),
        |out, (file, patch, workload)| {
            put_bytes(out, file.as_bytes())?;
            put_len(out, *patch as usize)?;
            put_len(out, *workload as usize)
        },
    )?;
    put_len(out, clusters.len())?;
    for (((name, found), list), matched) in clusters.into_iter().zip(lists).zip(matches) {
        put_bytes(out, name.as_bytes())?;
        match (found, list, matched) {
            (Some(found), Some(list), Some(matched)) => {
                put_len(out, list)?;
                put_len(out, matched)?;
                put_len(out, usize::from(found.custom_scopes))?;
            }
            _ => put_len(out, SAME)?,
        }
    }
    Ok(())
}

/// The distinct items, told apart by where they are in memory, in the order first
/// met, and the index of each item among them (`None` for no item). Things shared
/// by reference (a file's text at several paths, a list many clusters have) are so
/// found once; two equal ones held apart count twice, which costs bytes, not
/// correctness.
fn by_address<'a, T: ?Sized>(
    items: impl Iterator<Item = Option<&'a T>>,
) -> (Vec<&'a T>, Vec<Option<usize>>) {
    let mut index: HashMap<(*const u8, usize), usize> = HashMap::new();
    let mut order: Vec<&T> = Vec::new();
    let indexes = items
        .map(|item| {
            let item = item?;
            let at = (
                std::ptr::from_ref(item).cast::<u8>(),
                std::mem::size_of_val(item),
            );
            Some(*index.entry(at).or_insert_with(|| {
                order.push(item);
                order.len() - 1
            }))
        })
        .collect();
    (order, indexes)
}

/// Writes each distinct list of `lists` once (see [`by_address`]: its length, then
/// each item as `put` writes it) and returns, for each of `lists`, the index of its
/// list among them (`None` where there is no list).
fn put_lists<'a, T: 'a, W: Write>(
    out: &mut W,
    lists: impl Iterator<Item = Option<&'a [T]>>,
    mut put: impl FnMut(&mut W, &T) -> io::Result<()>,
) -> io::Result<Vec<Option<usize>>> {
    let (order, indexes) = by_address(lists);
    put_len(out, order.len())?;
    for list in order {
        put_len(out, list.len())?;
        for item in list {
            put(out, item)?;
        }
    }
    Ok(indexes)
}

/// Reads what [`put_lists`] wrote: each list, its items as `read` reads them.
fn read_lists<R: Read, T>(
    input: &mut R,
    mut read: impl FnMut(&mut R) -> io::Result<T>,
) -> io::Result<Vec<Arc<[T]>>> {
    let mut lists = Vec::new();
    for _ in 0..read_len(input)? {
        let mut list = Vec::new();
        for _ in 0..read_len(input)? {
            list.push(read(input)?);
        }
        lists.push(list.into());
    }
    Ok(lists)
}

fn decode_provenance(input: &mut impl Read, since: Option<&Provenance>) -> io::Result<Provenance> {
    let absent = |what: &str, cluster: &str| {
        invalid(format!(
            "the render answered \"the same {what}\" for cluster {cluster:?}, which the hub does not have"
        ))
    };
    let mut provenance = Provenance::default();
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut shared = |text: String| -> Arc<str> {
        names
            .entry(text)
            .or_insert_with_key(|t| Arc::from(t.as_str()))
            .clone()
    };
    // A list named by its index, for a cluster: an index past the lists is an
    // unreadable answer, named with the cluster it was for.
    fn nth<T: ?Sized>(
        lists: &[Arc<T>],
        at: usize,
        what: &str,
        cluster: &str,
    ) -> io::Result<Arc<T>> {
        lists.get(at).cloned().ok_or_else(|| {
            invalid(format!(
                "the {what} list of cluster {cluster:?} is number {at} of {}",
                lists.len()
            ))
        })
    }
    let lists: Vec<WorkloadInputs> = read_lists(input, |input| {
        Ok((shared(read_text(input)?), read_digest(input)?))
    })?;
    for _ in 0..read_len(input)? {
        let name = read_text(input)?;
        let list = read_len(input)?;
        if list == SAME {
            let same = since
                .and_then(|s| s.inputs.clusters.get(&name))
                .ok_or_else(|| absent("inputs", &name))?;
            provenance.inputs.clusters.insert(name, same.clone());
            continue;
        }
        let workloads = nth(&lists, list, "workload", &name)?;
        let own = read_digest(input)?;
        provenance
            .inputs
            .clusters
            .insert(name, ClusterInput { own, workloads });
    }
    let lists: Vec<Arc<[u32]>> = read_lists(input, |input| {
        let mut word = [0u8; 4];
        input.read_exact(&mut word)?;
        Ok(u32::from_le_bytes(word))
    })?;
    let matches: Vec<PatchMatches> = read_lists(input, |input| {
        let file = shared(read_text(input)?);
        let patch = u32::try_from(read_len(input)?).map_err(invalid)?;
        let workload = u32::try_from(read_len(input)?).map_err(invalid)?;
        Ok((file, patch, workload))
    })?;
    for _ in 0..read_len(input)? {
        let name = read_text(input)?;
        let list = read_len(input)?;
        if list == SAME {
            let same = since
                .and_then(|s| s.clusters.get(&name))
                .ok_or_else(|| absent("provenance", &name))?;
            provenance.clusters.insert(name, same.clone());
            continue;
        }
        let found = ClusterProvenance {
            resource_workloads: nth(&lists, list, "resource workload", &name)?,
            patch_matches: nth(&matches, read_len(input)?, "matched patch", &name)?,
            custom_scopes: read_len(input)? != 0,
        };
        provenance.clusters.insert(name, found);
    }
    Ok(provenance)
}

/// Reads what [`encode_output`] wrote, as it arrives, and nothing after it;
/// `since` is the render it was written against.
pub fn decode_output(
    mut input: impl Read,
    since: Option<&RenderOutput>,
) -> io::Result<RenderOutput> {
    let known = since.map_or(Known::Nothing, Known::Render);
    let output = read_output(&mut input, known)?;
    if input.read(&mut [0u8])? != 0 {
        return Err(invalid("trailing bytes"));
    }
    Ok(output)
}

/// Reads what [`encode_output`] wrote for a reader that knows `known`.
fn read_output(mut input: impl Read, known: Known<'_>) -> io::Result<RenderOutput> {
    let since = match known {
        Known::Render(since) => Some(since),
        _ => None,
    };
    let header: Header = serde_json::from_slice(&read_bytes(&mut input)?).map_err(invalid)?;
    let count = read_len(&mut input)?;
    let mut resources = Vec::new();
    // Resources of many clusters have the same identity (every cluster's copy of a
    // per-cluster template's resource): one shared key each.
    let mut keys: HashMap<ResourceKey, Arc<ResourceKey>> = HashMap::new();
    for _ in 0..count {
        let key: ResourceKey = serde_json::from_slice(&read_bytes(&mut input)?).map_err(invalid)?;
        let key = keys
            .entry(key)
            .or_insert_with_key(|key| Arc::new(key.clone()))
            .clone();
        let canonical = read_bytes(&mut input)?.into_boxed_slice();
        resources.push(Arc::new(Resource { key, canonical }));
    }
    let count = read_len(&mut input)?;
    let mut bundles = BTreeMap::new();
    for _ in 0..count {
        let cluster = read_text(&mut input)?;
        let digest = Digest::try_from(read_text(&mut input)?).map_err(invalid)?;
        let n = read_len(&mut input)?;
        if n == SAME {
            let same = match known {
                // Known by digest only: a bundle without its resources.
                Known::Digests => Bundle {
                    cluster: cluster.clone(),
                    digest,
                    resources: Vec::new(),
                },
                _ => since
                    .and_then(|s| s.bundles.get(&cluster))
                    .filter(|b| b.digest == digest)
                    .ok_or_else(|| {
                        invalid(format!(
                            "the render answered \"the same bundle\" ({digest}) for cluster \
                             {cluster:?}, which the hub does not have"
                        ))
                    })?
                    .clone(),
            };
            bundles.insert(cluster, same);
            continue;
        }
        let mut list = Vec::new();
        for _ in 0..n {
            let resource = resources
                .get(read_len(&mut input)?)
                .ok_or_else(|| invalid("resource index out of range"))?;
            list.push(resource.clone());
        }
        bundles.insert(
            cluster.clone(),
            Bundle {
                cluster,
                digest,
                resources: list,
            },
        );
    }
    let provenance = decode_provenance(&mut input, since.map(|s| &s.provenance))?;
    Ok(RenderOutput {
        revision: header.revision,
        bundles,
        diagnostics: header.diagnostics,
        memberships: header.memberships.read(since.map(|s| &s.memberships))?,
        labels: header.labels.read(since.map(|s| &s.labels))?,
        rollouts: header.rollouts,
        provenance,
        parsed: None,
    })
}

fn invalid(message: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

fn read_len(input: &mut impl Read) -> io::Result<usize> {
    let mut word = [0u8; 8];
    input.read_exact(&mut word)?;
    usize::try_from(u64::from_le_bytes(word)).map_err(invalid)
}

fn read_bytes(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = read_len(input)?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len)?;
    input.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(bytes)
}

fn read_text(input: &mut impl Read) -> io::Result<String> {
    String::from_utf8(read_bytes(input)?).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn example() -> (FleetSnapshot, RenderOutput) {
        let root = flotilla_testkit::workspace_root().join("fleet-example");
        let snapshot = crate::source::from_folder(&root, "").expect("fleet-example reads");
        let rendered = flotilla_render::render(&snapshot);
        assert!(rendered.is_clean(), "{:?}", rendered.diagnostics);
        (snapshot, rendered)
    }

    fn distinct(output: &RenderOutput) -> usize {
        let pointers: HashSet<*const Resource> = output
            .bundles
            .values()
            .flat_map(|b| b.resources.iter().map(Arc::as_ptr))
            .collect();
        pointers.len()
    }

    #[test]
    fn a_render_comes_back_whole_with_its_resources_still_shared() {
        let (_, rendered) = example();
        let mut bytes = Vec::new();
        encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
        let back = decode_output(bytes.as_slice(), None).expect("decodes");
        assert_eq!(back.revision, rendered.revision);
        assert_eq!(back.diagnostics, rendered.diagnostics);
        assert_eq!(back.memberships, rendered.memberships);
        assert_eq!(back.labels, rendered.labels);
        assert_eq!(back.rollouts, rendered.rollouts);
        assert!(!rendered.provenance.inputs.is_empty());
        assert_eq!(back.provenance, rendered.provenance);
        assert_eq!(
            back.bundles.keys().collect::<Vec<_>>(),
            rendered.bundles.keys().collect::<Vec<_>>()
        );
        for (cluster, bundle) in &rendered.bundles {
            let other = &back.bundles[cluster];
            assert_eq!(other.cluster, bundle.cluster);
            assert_eq!(other.digest, bundle.digest);
            assert_eq!(other.resources, bundle.resources, "{cluster}");
            // The digest sent is the digest of the resources sent.
            let again = Bundle::from_sorted(cluster.clone(), other.resources.clone());
            assert_eq!(again.digest, bundle.digest, "{cluster}");
        }
        // Resources shared between clusters in the render are shared after it.
        assert!(distinct(&rendered) < rendered.bundles.values().map(|b| b.resources.len()).sum());
        assert_eq!(distinct(&back), distinct(&rendered));
    }

    #[test]
    fn a_snapshot_goes_over_whole_and_paths_to_one_content_share_it() {
        let (mut snapshot, _) = example();
        let shared: Arc<str> = Arc::from("# the same content at two paths\n");
        snapshot.files.insert("a/one.txt".into(), shared.clone());
        snapshot.files.insert("b/two.txt".into(), shared);
        snapshot
            .problems
            .push(Diagnostic::error("a problem").in_file("x.yaml"));
        snapshot.skipped.insert("bin.dat".into(), "binary".into());
        let limits = Limits {
            template_fuel: 7,
            ..Limits::default()
        };
        let mut bytes = Vec::new();
        encode_input(&snapshot, Since::Nothing, &limits, &mut bytes).expect("encodes");
        let (back_limits, back, previous) = decode_input(bytes.as_slice()).expect("decodes");
        assert!(matches!(previous, Since::Nothing));
        assert_eq!(back_limits, limits);
        assert_eq!(back.files, snapshot.files);
        assert_eq!(back.revision, snapshot.revision);
        assert_eq!(back.problems, snapshot.problems);
        assert_eq!(back.skipped, snapshot.skipped);
        assert!(Arc::ptr_eq(
            &back.files["a/one.txt"],
            &back.files["b/two.txt"]
        ));
        assert!(decode_input(&bytes[..bytes.len() - 1]).is_err());
        // What follows a request is the next one: a worker refuses what is not.
        bytes.push(0);
        let mut out = Vec::new();
        assert!(run_worker(None, bytes.as_slice(), &mut out).is_err());
    }

    #[test]
    fn a_damaged_answer_is_an_error_not_a_panic() {
        let (_, rendered) = example();
        let mut bytes = Vec::new();
        encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
        for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_output(&bytes[..cut], None).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let err = decode_output(longer.as_slice(), None).expect_err("trailing");
        assert_eq!(err.to_string(), "trailing bytes");
        let mut huge = bytes;
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_output(huge.as_slice(), None).is_err());
    }

    #[test]
    fn the_worker_renders_what_the_hub_would() {
        let (snapshot, rendered) = example();
        let mut input = Vec::new();
        encode_input(&snapshot, Since::Nothing, &Limits::default(), &mut input).expect("encodes");
        let mut out = Vec::new();
        // No memory limit here: this is the test process itself.
        run_worker(None, input.as_slice(), &mut out).expect("renders");
        // First the (empty) request for previous bundles, then the render.
        let (ask, asked) = std::sync::mpsc::channel();
        let back = drain_output(out.as_slice(), None, &ask).expect("decodes");
        assert_eq!(asked.recv().ok(), Some(Vec::new()));
        assert_eq!(digests(&back), digests(&rendered));
        assert_eq!(back.diagnostics, rendered.diagnostics);
        assert_eq!(back.provenance, rendered.provenance);
    }

    fn digests(output: &RenderOutput) -> Vec<(String, String)> {
        output
            .bundles
            .iter()
            .map(|(c, b)| (c.clone(), b.digest.to_string()))
            .collect()
    }

    /// An answer that says "the same" is read only against the render it was written
    /// for: without it, or against one that lacks the bundle, it is an error.
    #[test]
    fn the_same_is_read_only_against_what_the_hub_has() {
        let (_, rendered) = example();
        let mut bytes = Vec::new();
        encode_output(&rendered, Known::Render(&rendered), &mut bytes).expect("encodes");
        let back = decode_output(bytes.as_slice(), Some(&rendered)).expect("decodes");
        assert_eq!(digests(&back), digests(&rendered));
        assert!(decode_output(bytes.as_slice(), None).is_err());
        let mut lacking = RenderOutput {
            bundles: rendered.bundles.clone(),
            provenance: rendered.provenance.clone(),
            ..RenderOutput::default()
        };
        lacking.bundles.remove("blue");
        assert!(decode_output(bytes.as_slice(), Some(&lacking)).is_err());
        let mut other = RenderOutput {
            bundles: lacking.bundles.clone(),
            provenance: rendered.provenance.clone(),
            ..RenderOutput::default()
        };
        let mut blue = rendered.bundles["blue"].clone();
        blue.resources.pop();
        blue = Bundle::from_sorted("blue", blue.resources);
        other.bundles.insert("blue".into(), blue);
        assert!(decode_output(bytes.as_slice(), Some(&other)).is_err());
    }

    /// The worker and the hub's side of the protocol on two pipes, as `render` runs
    /// them: the render, and the clusters the worker asked the previous bundles of.
    fn render_through_pipes(
        snapshot: &FleetSnapshot,
        before: &RenderOutput,
    ) -> (RenderOutput, Vec<String>) {
        let (child_in, hub_out) = io::pipe().expect("pipe");
        let (hub_in, child_out) = io::pipe().expect("pipe");
        let (ask, forward) = std::sync::mpsc::channel::<Vec<String>>();
        let (pass, asked) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(move || run_worker(None, child_in, child_out).expect("renders"));
            let feed = scope.spawn(move || {
                let _ = feed_input(
                    snapshot,
                    Some(before),
                    false,
                    &Limits::default(),
                    hub_out,
                    &asked,
                );
            });
            let seen = scope.spawn(move || {
                let names = forward.recv().expect("a request");
                pass.send(names.clone()).expect("passed on");
                names
            });
            let back = drain_output(hub_in, Some(before), &ask).expect("decodes");
            feed.join().expect("fed");
            (back, seen.join().expect("seen"))
        })
    }

    /// Given the previous render, the worker renders what changed since and answers
    /// what a full render gives; it asks for the previous bundles only of the
    /// clusters it renders in part, and leaves out of its answer what the hub has.
    #[test]
    fn the_worker_renders_since_the_previous_render() {
        let (base, before) = example();
        let edits = [
            (
                "clusters/store-us-001.yaml",
                "siteId: ",
                "siteId: x",
                vec![],
            ),
            (
                "workloads/kuard/manifests/deployment.yaml",
                "replicas: 1",
                "replicas: 3",
                vec!["blue", "red"],
            ),
            // Its groups, labels and rollout wave change.
            (
                "clusters/store-us-001.yaml",
                "tier: canary",
                "tier: stable",
                vec![],
            ),
            // Removed (nothing to replace).
            ("clusters/store-eu-002.yaml", "", "", vec![]),
        ];
        for (path, from, to, expect_asked) in edits {
            let mut snapshot = base.clone();
            if from.is_empty() {
                snapshot.files.remove(path).expect("a file of the fleet");
            } else {
                let text = snapshot.files[path].replacen(from, to, 1);
                assert_ne!(&*snapshot.files[path], text.as_str());
                snapshot.files.insert(path.into(), Arc::from(text));
            }
            let full = flotilla_render::render(&snapshot);
            assert!(full.is_clean(), "{:?}", full.diagnostics);
            assert_ne!(digests(&full), digests(&before));

            // What goes in: the previous render's digests and provenance only.
            let mut input = Vec::new();
            encode_input(
                &snapshot,
                Since::Given(&before),
                &Limits::default(),
                &mut input,
            )
            .expect("encodes");
            let (_, _, previous) = decode_input(input.as_slice()).expect("decodes");
            let Since::Given(previous) = previous else {
                panic!("sent");
            };
            assert_eq!(previous.provenance, before.provenance);
            assert!(previous.bundles.values().all(|b| b.resources.is_empty()));
            assert!(previous.memberships.is_empty() && previous.labels.is_empty());

            let (back, asked) = render_through_pipes(&snapshot, &before);
            assert_eq!(asked, expect_asked, "{path}");
            assert_eq!(digests(&back), digests(&full), "{path}");
            assert_eq!(back.diagnostics, full.diagnostics);
            assert_eq!(back.provenance, full.provenance);
            // Written as changes against what the hub has, read back whole.
            assert_eq!(back.memberships, full.memberships, "{path}");
            assert_eq!(back.labels, full.labels, "{path}");
            assert_eq!(back.rollouts, full.rollouts, "{path}");
            for (cluster, bundle) in &back.bundles {
                assert_eq!(
                    bundle.resources, full.bundles[cluster].resources,
                    "{cluster}"
                );
            }
            // The bundles that did not change are the hub's own, not copies.
            assert!(Arc::ptr_eq(
                &back.bundles["plant-eu-01"].resources[0],
                &before.bundles["plant-eu-01"].resources[0]
            ));
        }
    }

    #[test]
    fn a_data_segment_is_read_from_proc() {
        let status = "Name:\tflotilla\nVmPeak:\t  900 kB\nVmData:\t  123456 kB\nVmStk:\t 132 kB\n";
        assert_eq!(vm_data(status), Some(123_456 * 1024));
        assert_eq!(vm_data("Name:\tx\n"), None);
        // This process's own, as the hub reads its render process's.
        assert!(data_size(std::process::id()).is_some_and(|size| size > 0));
    }

    /// One worker renders request after request on the same pipes: since nothing,
    /// since the render it keeps (not sent again), since one the hub sends; each
    /// answer what a full render gives.
    #[test]
    fn a_worker_renders_request_after_request_since_what_it_keeps() {
        let (base, _) = example();
        let edit = |path: &str, from: &str, to: &str| {
            let mut snapshot = base.clone();
            let text = snapshot.files[path].replacen(from, to, 1);
            assert_ne!(&*snapshot.files[path], text.as_str());
            snapshot.files.insert(path.into(), Arc::from(text));
            snapshot
        };
        let commits = [
            base.clone(),
            edit("clusters/store-us-001.yaml", "siteId: ", "siteId: x"),
            edit(
                "workloads/kuard/manifests/deployment.yaml",
                "replicas: 1",
                "replicas: 3",
            ),
            edit("clusters/store-us-001.yaml", "tier: canary", "tier: stable"),
        ];
        let (child_in, mut hub_out) = io::pipe().expect("pipe");
        let (hub_in, child_out) = io::pipe().expect("pipe");
        let worker = std::thread::spawn(move || run_worker(None, child_in, child_out));
        let mut hub_in = io::BufReader::new(hub_in);
        let mut previous: Option<RenderOutput> = None;
        // Nothing, then the kept render twice, then one sent (as after a render the
        // process answered but the hub did not keep).
        for (step, (snapshot, since_kept)) in
            commits.iter().zip([false, true, true, false]).enumerate()
        {
            let (ask, asked) = std::sync::mpsc::channel();
            let back = std::thread::scope(|scope| {
                let (hub_out, previous) = (&mut hub_out, &previous);
                let feed = scope.spawn(move || {
                    let previous = previous.as_ref();
                    feed_input(
                        snapshot,
                        previous,
                        since_kept,
                        &Limits::default(),
                        hub_out,
                        &asked,
                    )
                });
                let back = drain_output(&mut hub_in, previous.as_ref(), &ask).expect("decodes");
                drop(ask);
                feed.join().expect("fed").expect("written");
                back
            });
            let full = flotilla_render::render(snapshot);
            assert!(full.is_clean(), "{:?}", full.diagnostics);
            assert_eq!(digests(&back), digests(&full), "step {step}");
            assert_eq!(back.diagnostics, full.diagnostics);
            assert_eq!(back.provenance, full.provenance);
            assert_eq!(back.memberships, full.memberships);
            assert_eq!(back.labels, full.labels);
            for (cluster, bundle) in &back.bundles {
                assert_eq!(bundle.resources, full.bundles[cluster].resources);
            }
            previous = Some(back);
        }
        drop(hub_out);
        worker
            .join()
            .expect("the worker")
            .expect("ends at the end of its input");
    }

    /// The files of small fleets, each path with the texts it may have (`None`:
    /// absent): clusters and groups in two spellings (so duplicates happen),
    /// broken files, group selectors on either label, a workload on every cluster
    /// or on one group, an overlay by group or by cluster names.
    fn small_fleets() -> Vec<(String, Vec<Option<String>>)> {
        const HEAD: &str = "apiVersion: flotilla.dev/v1alpha1\n";
        let mut paths = Vec::new();
        for i in 0..4 {
            for ext in ["yaml", "yml"] {
                let mut texts = vec![None, Some("not: [valid\n".to_string())];
                for region in 0..3 {
                    for tier in ["canary", "stable"] {
                        texts.push(Some(format!(
                            "{HEAD}kind: Cluster\nmetadata:\n  name: c{i}\n  labels:\n    \
                             region: r{region}\n    tier: {tier}\nspec: {{}}\n"
                        )));
                    }
                }
                paths.push((format!("clusters/c{i}.{ext}"), texts));
            }
        }
        for name in ["ga", "gb", "gc"] {
            for ext in ["yaml", "yml"] {
                let mut texts = vec![None, Some("broken: [\n".to_string())];
                for (key, value) in [("region", "r0"), ("region", "r1"), ("tier", "canary")] {
                    texts.push(Some(format!(
                        "{HEAD}kind: Group\nmetadata:\n  name: {name}\nspec:\n  selector:\n    \
                         matchLabels:\n      {key}: {value}\n"
                    )));
                }
                paths.push((format!("groups/{name}.{ext}"), texts));
            }
        }
        let workload = |target: &str| {
            format!(
                "{HEAD}kind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: w\n  \
                 targets:\n    - {target}\n"
            )
        };
        paths.push((
            "workloads/w/workload.yaml".into(),
            vec![
                None,
                Some(workload("clusterSelector: {}")),
                Some(workload("group: ga")),
            ],
        ));
        paths.push((
            "workloads/w/manifests/cm.yaml".into(),
            vec![Some(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: b\n".into(),
            )],
        ));
        let overlay = |selects: &str| {
            format!(
                "{HEAD}kind: Overlay\nmetadata:\n  name: o\nspec:\n  {selects}\n  patches:\n    \
                 - target: {{kind: ConfigMap}}\n      merge: {{metadata: {{labels: {{x: y}}}}}}\n"
            )
        };
        paths.push((
            "overlays/o.yaml".into(),
            vec![
                None,
                Some(overlay("groups: [gb]")),
                Some(overlay("clusters: [c1, c2]")),
            ],
        ));
        paths
    }

    /// For random pairs of small fleets (one or two files changed from the first),
    /// the second's render written against the first and read back against it
    /// gives the second's memberships, labels, provenance and diagnostics; every
    /// tenth clean pair also goes through a worker on real pipes.
    #[test]
    fn memberships_and_labels_written_as_changes_read_back_whole() {
        let fleets = small_fleets();
        let snapshot =
            |choice: &[usize], revision: &str| {
                let mut snapshot =
                    FleetSnapshot::from_files(fleets.iter().zip(choice).filter_map(
                        |((path, texts), &i)| Some((path.as_str(), texts[i].as_deref()?)),
                    ));
                snapshot.revision = revision.to_string();
                snapshot
            };
        // A xorshift generator: the same pairs on every run.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut below = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let (mut through_groups, mut clean) = (0, 0);
        for round in 0..300 {
            let mut choice: Vec<usize> = fleets
                .iter()
                .map(|(path, texts)| {
                    let broken = path.starts_with("clusters/") || path.starts_with("groups/");
                    // The second spelling of a file is mostly absent, and a file
                    // mostly not broken (its second text).
                    match below(texts.len()) {
                        _ if path.ends_with(".yml") && below(4) != 0 => 0,
                        1 if broken && below(4) != 0 => 2 + below(texts.len() - 2),
                        i => i,
                    }
                })
                .collect();
            let first = snapshot(&choice, "first");
            for _ in 0..1 + below(2) {
                let at = below(fleets.len());
                choice[at] = below(fleets[at].1.len());
            }
            let second = snapshot(&choice, "second");
            let before = flotilla_render::render(&first);
            let after = flotilla_render::render(&second);
            through_groups += after
                .memberships
                .iter()
                .filter(|(name, groups)| {
                    before.memberships.get(*name).is_some_and(|g| g != *groups)
                        && first
                            .files
                            .iter()
                            .filter(|(p, _)| p.starts_with("clusters/"))
                            .eq(second
                                .files
                                .iter()
                                .filter(|(p, _)| p.starts_with("clusters/")))
                })
                .count();
            let mut bytes = Vec::new();
            encode_output(&after, Known::Render(&before), &mut bytes).expect("encodes");
            let back = decode_output(bytes.as_slice(), Some(&before)).expect("decodes");
            assert_eq!(back.memberships, after.memberships, "round {round}");
            assert_eq!(back.labels, after.labels, "round {round}");
            assert_eq!(back.provenance, after.provenance, "round {round}");
            assert_eq!(back.diagnostics, after.diagnostics, "round {round}");
            if before.is_clean() {
                clean += 1;
                if clean % 10 == 0 {
                    let (back, _) = render_through_pipes(&second, &before);
                    assert_eq!(back.memberships, after.memberships, "round {round}");
                    assert_eq!(back.labels, after.labels, "round {round}");
                    assert_eq!(back.provenance, after.provenance, "round {round}");
                    assert_eq!(digests(&back), digests(&after), "round {round}");
                }
            }
        }
        // The pairs reach what matters: memberships changed by groups alone (the
        // cluster files the same), and clean previous renders for the pipes.
        assert!(through_groups > 10, "{through_groups}");
        assert!(clean > 20, "{clean}");
    }
}
