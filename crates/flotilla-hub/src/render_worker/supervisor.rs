//! The hub's side of the render process: starting it, feeding it a request and
//! draining its answer under a deadline, and telling how a render ended (done,
//! abandoned, out of memory, crashed); a process that holds too much memory after
//! a render is replaced.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::RenderOutput;
use flotilla_render::sops::DecryptionKeys;

use super::codec::{
    Known, RenderSettings, Since, encode_input, encode_output, read_output, read_request,
};
use super::{RenderWorker, Rendered, WARNING, WORKER_COMMAND};

/// How much of the child's standard error is kept for the report.
const STDERR_KEPT: u64 = 16 * 1024;

/// A render process kept between commits (see the module's documentation): it is
/// started for the first render, renders each commit after, and keeps its last
/// render and parse of the cluster files between them. It is ended (and the next
/// render starts a new one) whenever a render does not end with an answer: past
/// its deadline, out of memory, crashed, unreadable, or the hub stopping; and it
/// ends with the session.
pub struct RenderSession {
    worker: RenderWorker,
    process: Option<Process>,
    /// The seed Helm charts' generating functions derive from (the store's).
    helm_seed: Option<[u8; 32]>,
    /// The identities SOPS files are opened with.
    decryption: Arc<DecryptionKeys>,
    /// The file of sealing headers render processes keep ([`super::KeptHeaders`]).
    sealing_headers: Option<PathBuf>,
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
    pub fn new(worker: RenderWorker, decryption: Arc<DecryptionKeys>) -> RenderSession {
        RenderSession {
            worker,
            process: None,
            helm_seed: None,
            decryption,
            sealing_headers: None,
        }
    }

    /// Render processes keep the sealing headers they work out in `path` and read
    /// them from there when they start.
    pub fn keep_sealing_headers(&mut self, path: PathBuf) {
        self.sealing_headers = Some(path);
    }

    /// Renders with `seed` as the seed of Helm charts' generated values.
    pub fn set_helm_seed(&mut self, seed: [u8; 32]) {
        self.helm_seed = Some(seed);
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
            match self.worker.start(self.sealing_headers.as_deref()) {
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
        let request = Request {
            snapshot,
            previous,
            since_kept,
            settings: RenderSettings {
                limits: limits.clone(),
                helm_seed: self.helm_seed,
                decryption: self.decryption.clone(),
            },
        };
        let (feed, drain) = exchange(request, stdin, stdout);
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
                // Ended, the threads then meet closed pipes; what it said of a slow
                // template names what it was on.
                let on = match self.process.take() {
                    Some(process) => process.ended_saying().await,
                    None => None,
                };
                return Rendered::Abandoned(started.elapsed(), on);
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
                self.answered(stdin, stdout);
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

    /// After an answer: gives the process its pipes back for the next render, or
    /// ends it when it holds too much memory to be sure of room for another.
    fn answered(&mut self, stdin: std::fs::File, stdout: std::fs::File) {
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
    }
}

/// What one render sends the process.
struct Request {
    snapshot: FleetSnapshot,
    previous: Option<Arc<RenderOutput>>,
    since_kept: bool,
    settings: RenderSettings,
}

/// The feeding of `request` into the process's `stdin` and the draining of its
/// answer from `stdout`, each on a blocking thread; each gives its pipe back.
type Feed = tokio::task::JoinHandle<io::Result<std::fs::File>>;
type Drain = tokio::task::JoinHandle<(io::Result<RenderOutput>, std::fs::File)>;

/// Starts feeding `request` and draining the answer. The snapshot is written and
/// the answer read as they go, each on a thread of its own (blocking on the pipe):
/// a fleet is up to --max-fleet-bytes, and a render of 10,000 per-cluster
/// templates answers with hundreds of megabytes; neither is ever held twice.
/// Feeding and draining at once, neither side waits on a full pipe.
fn exchange(request: Request, stdin: std::fs::File, stdout: std::fs::File) -> (Feed, Drain) {
    let kept = request.previous.clone();
    let (ask, asked) = std::sync::mpsc::channel();
    let feed = tokio::task::spawn_blocking(move || {
        let mut input = io::BufWriter::with_capacity(1 << 20, stdin);
        // A child that dies early closes its end; what it says then is the news.
        let fed = feed_input(
            &request.snapshot,
            request.previous.as_deref(),
            request.since_kept,
            &request.settings,
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
    (feed, drain)
}

impl RenderWorker {
    /// Starts a render process.
    fn start(&self, sealing_headers: Option<&Path>) -> Result<Process, Rendered> {
        let mut command = tokio::process::Command::new(&self.program);
        command.arg(WORKER_COMMAND);
        if let Some(limit) = self.memory_limit {
            command.arg("--memory-limit").arg(limit.to_string());
        }
        if let Some(path) = sealing_headers {
            command.arg("--sealing-headers").arg(path);
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
        // Read as it comes (the process writes to it when it fails, when a render
        // starts and when a template runs long), keeping the last of it.
        let errors = tokio::spawn(async move {
            let mut stderr = stderr;
            let mut text: Vec<u8> = Vec::new();
            let mut chunk = [0u8; 4096];
            // The line being read, for the warnings the hub logs as they come.
            let mut line: Vec<u8> = Vec::new();
            while let Ok(n) = stderr.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                for &byte in &chunk[..n] {
                    if byte != b'\n' {
                        if line.len() < STDERR_KEPT as usize {
                            line.push(byte);
                        }
                        continue;
                    }
                    let said = String::from_utf8_lossy(&line);
                    if let Some(warning) = said.strip_prefix(WARNING) {
                        tracing::warn!("render process: {warning}");
                    }
                    line.clear();
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
    /// Ends the process and tells what it last said it was rendering for a long
    /// time (`FILE for cluster NAME`), if anything.
    async fn ended_saying(mut self) -> Option<String> {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await;
        let errors = tokio::time::timeout(EXIT_WAIT, self.errors)
            .await
            .ok()?
            .ok()?;
        flotilla_render::progress::last_slow_render(&errors).map(str::to_string)
    }

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
            return Rendered::OutOfMemory(
                flotilla_render::progress::last_slow_render(&errors).map(str::to_string),
            );
        }
        let last = errors
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !flotilla_render::progress::is_progress(l));
        Rendered::Panicked(match last {
            Some(line) => format!("the render process ended with {status}: {}", line.trim()),
            None => format!("the render process ended with {status}"),
        })
    }
}

/// The size of a process's data segment (what `RLIMIT_DATA` limits), from
/// `/proc`; `None` if it cannot be read.
pub(super) fn data_size(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    vm_data(&status)
}

/// `VmData` of a `/proc/PID/status` text, in bytes.
pub(super) fn vm_data(status: &str) -> Option<u64> {
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
pub(super) fn feed_input(
    snapshot: &FleetSnapshot,
    previous: Option<&RenderOutput>,
    since_kept: bool,
    settings: &RenderSettings,
    mut input: impl Write,
    asked: &std::sync::mpsc::Receiver<Vec<String>>,
) -> io::Result<()> {
    let since = match previous {
        Some(_) if since_kept => Since::Kept,
        Some(previous) => Since::Given(previous),
        None => Since::Nothing,
    };
    encode_input(snapshot, since, settings, &mut input)?;
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
pub(super) fn drain_output(
    mut output: impl Read,
    previous: Option<&RenderOutput>,
    ask: &std::sync::mpsc::Sender<Vec<String>>,
) -> io::Result<RenderOutput> {
    let names = read_request(&mut output)?;
    let _ = ask.send(names);
    // Not past the answer: the process's next answer follows on the same pipe.
    read_output(output, previous.map_or(Known::Nothing, Known::Render))
}
