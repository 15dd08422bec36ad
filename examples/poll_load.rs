//! A long-poll load client for the hub: N simulated agents, each with its own cluster
//! token, each holding a long-poll (`?wait=`, `If-None-Match` with its digest) and
//! polling again as the real agent does (at once after a new bundle; after a 304,
//! when the wait is over). It counts polls, 304s, 200s and errors, and, when a render
//! was recorded during the run, how long after it each agent had its new digest.
//!
//! ```text
//! cargo run --example poll_load -- --hub http://127.0.0.1:8080 [--hub URL…] \
//!     --database postgres://…|sqlite:///…/flotilla.db --agents 10000 \
//!     [--duration 300s] [--wait 55s] [--ramp 20s] [--tokens FILE] [--every 10s] [--http2] \
//!     [--deltas]
//! ```
//!
//! - Loopback only: a hub or database on another address is refused.
//! - Bounded: at most 20,000 agents and 30 minutes; the client stops by itself.
//! - Tokens: one per cluster, made in the hub's database with the hub's own code
//!   (what `flotilla token create CLUSTER --database URL` does), for the first N
//!   clusters the database records; `--tokens FILE` keeps them (`cluster<TAB>secret`,
//!   mode 0600) and reuses them on the next run. The hubs pick new tokens up within a
//!   second.
//! - Agent `i` polls hub `i mod hubs`; agents start spread over `--ramp`.
//! - `--http2`: each agent speaks HTTP/2 on a connection of its own (prior knowledge,
//!   as `flotilla agent --http2` does on `http://`); without it, HTTP/1.1, each agent's
//!   held poll on a connection of its own all the same.
//! - `--deltas`: as the real agent does, each agent reports the digest it took as
//!   applied (so the hub makes the delta from it ahead of the next change) and then
//!   polls with `Available-Dictionary` naming it and `Accept-Encoding: gzip, dcz`; the
//!   summary counts the new bundles that came as deltas and the bytes of each kind.
//! - The agent's work on a bundle (verifying, applying) is left out: the body is read
//!   and dropped.
//! - The render's time is `clusters.updated_at` in the database (the recording hub's
//!   clock when it recorded the render, read after the run), so the latency is from
//!   the render being recorded to the agent having read the whole new bundle.
//!
//! It prints a progress line every `--every` and, at the end, one line
//! `summary: {json}`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;

use flotilla_hub::auth::new_token;
use flotilla_hub::store::{Database, Store};

const MAX_AGENTS: usize = 20_000;
const MAX_DURATION: Duration = Duration::from_secs(30 * 60);
const MAX_WAIT: Duration = Duration::from_secs(300);
/// How much longer than the wait a request may take (the agent's own grace).
const GRACE: Duration = Duration::from_secs(15);
/// After an error, the agent waits this long before asking again.
const RETRY: Duration = Duration::from_secs(1);
/// The answer the target asks for: every held poll has its new digest this soon.
const TARGET: Duration = Duration::from_secs(5);

struct Args {
    hubs: Vec<String>,
    database: Database,
    agents: usize,
    duration: Duration,
    wait: Duration,
    ramp: Duration,
    tokens: Option<PathBuf>,
    every: Duration,
    http2: bool,
    deltas: bool,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "poll_load: {problem}\nusage: poll_load --hub http://127.0.0.1:PORT [--hub …] --database URL --agents N \
         [--duration 300s] [--wait 55s] [--ramp 20s] [--tokens FILE] [--every 10s] [--http2] [--deltas]"
    );
    std::process::exit(2)
}

fn loopback_host(host: Option<url::Host<&str>>) -> bool {
    match host {
        // A URL of another scheme than http(s) (postgres://) keeps its host as text.
        Some(url::Host::Domain(name)) => {
            name == "localhost"
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

fn parse_args() -> Args {
    let mut hubs = Vec::new();
    let (mut database, mut agents) = (None, None);
    let mut duration = Duration::from_secs(300);
    let mut wait = Duration::from_secs(55);
    let mut ramp = Duration::from_secs(20);
    let mut every = Duration::from_secs(10);
    let mut tokens = None;
    let mut http2 = false;
    let mut deltas = false;
    let mut it = std::env::args().skip(1);
    let time = |value: Option<String>, flag: &str| -> Duration {
        let value = value.unwrap_or_else(|| usage(&format!("{flag} needs a duration")));
        humantime::parse_duration(&value)
            .unwrap_or_else(|e| usage(&format!("{flag} {value:?}: {e}")))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--hub" => {
                let value = it.next().unwrap_or_else(|| usage("--hub needs a URL"));
                let url = url::Url::parse(&value)
                    .unwrap_or_else(|e| usage(&format!("--hub {value:?}: {e}")));
                if url.scheme() != "http" || !loopback_host(url.host()) {
                    usage(&format!(
                        "--hub {value:?}: only http:// on a loopback address (127.0.0.1, ::1, localhost)"
                    ));
                }
                hubs.push(value.trim_end_matches('/').to_string());
            }
            "--database" => {
                let value = it.next().unwrap_or_else(|| usage("--database needs a URL"));
                let parsed: Database = value
                    .parse()
                    .unwrap_or_else(|e| usage(&format!("--database: {e}")));
                if let Database::Postgres(url) = &parsed {
                    let host = url::Url::parse(url).ok();
                    if !host.as_ref().is_some_and(|u| loopback_host(u.host())) {
                        usage("--database: only a PostgreSQL server on a loopback address");
                    }
                }
                database = Some(parsed);
            }
            "--agents" => {
                let value = it.next().unwrap_or_default();
                let n: usize = value
                    .parse()
                    .unwrap_or_else(|_| usage("--agents needs a number"));
                if n == 0 || n > MAX_AGENTS {
                    usage(&format!("--agents: from 1 to {MAX_AGENTS}"));
                }
                agents = Some(n);
            }
            "--duration" => duration = time(it.next(), "--duration"),
            "--wait" => wait = time(it.next(), "--wait"),
            "--ramp" => ramp = time(it.next(), "--ramp"),
            "--every" => every = time(it.next(), "--every"),
            "--tokens" => tokens = Some(PathBuf::from(it.next().unwrap_or_default())),
            "--http2" => http2 = true,
            "--deltas" => deltas = true,
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    if hubs.is_empty() {
        usage("at least one --hub");
    }
    if duration.is_zero() || duration > MAX_DURATION {
        usage("--duration: more than 0 s and at most 30 minutes");
    }
    if wait.as_secs() == 0 || wait > MAX_WAIT {
        usage("--wait: from 1 s to 5 minutes");
    }
    if every.is_zero() {
        usage("--every must be more than 0 s");
    }
    Args {
        hubs,
        database: database.unwrap_or_else(|| usage("--database is needed (tokens)")),
        agents: agents.unwrap_or_else(|| usage("--agents is needed")),
        duration,
        wait,
        ramp: ramp.min(duration),
        tokens,
        every,
        http2,
        deltas,
    }
}

/// The HTTP client of one agent, or of all of them: with HTTP/1.1 a client opens a
/// connection for each request in flight, so one is shared; with HTTP/2 it would send
/// every agent's poll on one connection, so each agent has its own.
fn http_client(http2: bool) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        // No TCP keepalive (reqwest's default probes after 15 s idle, three times):
        // the polls this client sends after a commit go out together, so 10,000
        // connections' probes would all fall due in the same instant, overflow the
        // kernel's per-CPU queue of loopback packets (`net.core.netdev_max_backlog`,
        // 1,000) and be dropped, each time, until the connections are aborted as
        // dead ("Connection timed out"). Agents on machines of their own never probe
        // together; the real agent's keepalive is 300 s.
        .tcp_keepalive(None)
        // Plain HTTP on loopback: loading the system's root certificates (tens of
        // milliseconds) for each of 10,000 agents' clients would outlast the ramp.
        .tls_built_in_root_certs(false);
    if http2 {
        builder = builder.http2_prior_knowledge();
    }
    builder
        .build()
        .unwrap_or_else(|e| usage(&format!("cannot build the HTTP client: {e}")))
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Tokens for the first `agents` clusters the database records: read from `file` when
/// it holds them all, else made (and written to `file`).
async fn tokens(args: &Args) -> Vec<(String, String)> {
    let store = Store::open_tables(&args.database)
        .await
        .unwrap_or_else(|e| usage(&format!("cannot open the database: {e}")));
    let mut names: Vec<String> = store
        .clusters()
        .await
        .unwrap_or_else(|e| usage(&format!("cannot read the clusters: {e}")))
        .into_iter()
        .map(|c| c.name)
        .collect();
    names.sort();
    if names.len() < args.agents {
        usage(&format!(
            "the database records {} clusters, fewer than --agents {}",
            names.len(),
            args.agents
        ));
    }
    names.truncate(args.agents);
    if let Some(file) = &args.tokens
        && let Ok(text) = std::fs::read_to_string(file)
    {
        let known: HashMap<&str, &str> = text
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .collect();
        if names.iter().all(|n| known.contains_key(n.as_str())) {
            println!("tokens: {} read from {}", names.len(), file.display());
            store.close().await;
            return names
                .iter()
                .map(|n| (n.clone(), known[n.as_str()].to_string()))
                .collect();
        }
    }
    let started = Instant::now();
    let now = unix_ms();
    let made: Vec<Result<(String, String), String>> = futures::stream::iter(names)
        .map(|name| {
            let store = &store;
            async move {
                let token = new_token(Some(&name), now);
                store
                    .insert_token(&token.stored)
                    .await
                    .map(|()| (name, token.secret))
                    .map_err(|e| e.to_string())
            }
        })
        .buffered(8)
        .collect()
        .await;
    store.close().await;
    let made: Vec<(String, String)> = made
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| usage(&format!("cannot store a token: {e}")));
    println!(
        "tokens: {} made in the database in {:.1} s",
        made.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(file) = &args.tokens {
        let text: String = made.iter().map(|(n, s)| format!("{n}\t{s}\n")).collect();
        if let Err(e) =
            flotilla_fs::write_atomically(file, text.as_bytes(), flotilla_fs::Mode::Private)
        {
            eprintln!("cannot keep the tokens in {}: {e}", file.display());
        }
    }
    made
}

#[derive(Default)]
struct Counts {
    polls: AtomicU64,
    not_modified: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    /// Errors that were the request's own timeout (the wait and 15 s).
    timeouts: AtomicU64,
    in_flight: AtomicI64,
    /// Agents that have fetched a first bundle.
    started: AtomicUsize,
    /// New bundles (after the first) that came as a `dcz` delta, and in full.
    deltas: AtomicU64,
    full: AtomicU64,
    /// Bytes of their bodies, as they came over the wire.
    delta_bytes: AtomicU64,
    full_bytes: AtomicU64,
    /// Reports of the digest taken, and those the hub did not accept.
    reports: AtomicU64,
    report_errors: AtomicU64,
}

/// What one agent saw: its first digest, then each new digest and when it had it.
#[derive(Default, Clone)]
struct Seen {
    first: Option<String>,
    changes: Vec<(String, i64)>,
}

struct Agent {
    index: usize,
    url: String,
    /// With `--deltas`: where the agent reports the digest it took.
    status_url: Option<String>,
    token: String,
    wait: Duration,
    start_after: Duration,
}

async fn run_agent(
    agent: Agent,
    client: reqwest::Client,
    counts: Arc<Counts>,
    seen: Arc<Mutex<Vec<Seen>>>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::select! {
        _ = tokio::time::sleep(agent.start_after) => {}
        _ = stop.changed() => return,
    }
    let wait = format!("{}s", agent.wait.as_secs());
    let mut etag: Option<String> = None;
    loop {
        let started = Instant::now();
        let mut request = client
            .get(&agent.url)
            .query(&[("wait", wait.as_str())])
            .timeout(agent.wait + GRACE)
            .bearer_auth(&agent.token)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(etag) = &etag {
            request = request.header(reqwest::header::IF_NONE_MATCH, etag);
            let dictionary = agent.status_url.as_ref().and_then(|_| {
                let digest = flotilla_core::bundle::Digest::parse(etag.trim_matches('"')).ok()?;
                flotilla_core::dcz::available_dictionary(&digest)
            });
            if let Some(dictionary) = dictionary {
                request = request
                    .header(flotilla_core::dcz::AVAILABLE_DICTIONARY, dictionary)
                    .header(reqwest::header::ACCEPT_ENCODING, "gzip, dcz");
            }
        }
        counts.polls.fetch_add(1, Ordering::Relaxed);
        counts.in_flight.fetch_add(1, Ordering::Relaxed);
        let answer = async {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let tag = response
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let delta = response
                .headers()
                .get(reqwest::header::CONTENT_ENCODING)
                .is_some_and(|v| v.as_bytes() == flotilla_core::dcz::ENCODING.as_bytes());
            let body = response.bytes().await?;
            if status == 200 && etag.is_some() {
                let (count, bytes) = match delta {
                    true => (&counts.deltas, &counts.delta_bytes),
                    false => (&counts.full, &counts.full_bytes),
                };
                count.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
            }
            Ok::<_, reqwest::Error>((status, tag, unix_ms()))
        };
        let answer = tokio::select! {
            answer = answer => answer,
            _ = stop.changed() => return,
        };
        counts.in_flight.fetch_sub(1, Ordering::Relaxed);
        let delay = match answer {
            Ok((304, _, _)) => {
                counts.not_modified.fetch_add(1, Ordering::Relaxed);
                agent.wait.saturating_sub(started.elapsed())
            }
            Ok((200, Some(tag), at)) => {
                counts.ok.fetch_add(1, Ordering::Relaxed);
                let digest = tag.trim_matches('"').to_string();
                {
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    let mine = &mut seen[agent.index];
                    if mine.first.is_none() {
                        mine.first = Some(digest);
                        counts.started.fetch_add(1, Ordering::Relaxed);
                    } else {
                        mine.changes.push((digest, at));
                    }
                }
                if let Some(url) = &agent.status_url {
                    report(&client, url, &agent.token, &tag, &counts).await;
                }
                etag = Some(tag);
                Duration::ZERO
            }
            Ok((status, _, _)) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "agent {} at unix_ms {}: answered {status}",
                    agent.index,
                    unix_ms()
                );
                RETRY
            }
            Err(e) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
                if e.is_timeout() {
                    counts.timeouts.fetch_add(1, Ordering::Relaxed);
                }
                let mut cause = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(inner) = source {
                    cause = format!("{cause}: {inner}");
                    source = inner.source();
                }
                eprintln!(
                    "agent {} at unix_ms {} after {} ms: {cause}",
                    agent.index,
                    unix_ms(),
                    started.elapsed().as_millis()
                );
                RETRY
            }
        };
        if !delay.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Reports `etag`'s digest as applied, as the real agent does after an apply.
async fn report(client: &reqwest::Client, url: &str, token: &str, etag: &str, counts: &Counts) {
    let digest = etag.trim_matches('"');
    let body = json!({
        "applied": digest,
        "attempted": digest,
        "message": "poll_load",
        "agentVersion": "poll_load",
        "features": flotilla_agent::FEATURES,
    });
    counts.reports.fetch_add(1, Ordering::Relaxed);
    let sent = client
        .post(url)
        .bearer_auth(token)
        .json(&body)
        .timeout(GRACE)
        .send()
        .await;
    if !sent.is_ok_and(|answer| answer.status().is_success()) {
        counts.report_errors.fetch_add(1, Ordering::Relaxed);
    }
}

fn quantiles(mut ms: Vec<i64>) -> serde_json::Value {
    if ms.is_empty() {
        return json!(null);
    }
    ms.sort_unstable();
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    json!({"count": ms.len(), "min_ms": ms[0], "median_ms": at(0.5), "p99_ms": at(0.99), "max_ms": ms[ms.len() - 1]})
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let summary = run(parse_args()).await;
    println!("summary: {summary}");
}

/// Runs the agents for `args.duration` and sums up what they saw.
async fn run(args: Args) -> serde_json::Value {
    match flotilla_hub::listen::raise_open_file_limit() {
        Ok(files) => {
            println!(
                "open files: soft limit {} (hard {})",
                files.soft, files.hard
            );
            if files.soft < (args.agents as u64) + 256 {
                usage(&format!(
                    "the open-file limit ({}) is too low for {} agents",
                    files.soft, args.agents
                ));
            }
        }
        Err(e) => usage(&format!("cannot raise the open-file limit: {e}")),
    }
    let tokens = tokens(&args).await;
    let client = http_client(args.http2);

    // The hubs re-read tokens every second: wait until each takes the last one made.
    for hub in &args.hubs {
        let (name, token) = &tokens[tokens.len() - 1];
        let url = format!("{hub}/v1/clusters/{name}/bundle");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = client
                .get(&url)
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string());
            if status == Ok(200) {
                break;
            }
            if Instant::now() > deadline {
                usage(&format!(
                    "{hub} does not take the tokens after 60 s (last answer: {status:?})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let counts = Arc::new(Counts::default());
    let seen = Arc::new(Mutex::new(vec![Seen::default(); tokens.len()]));
    let (stop, stopped) = watch::channel(false);
    let run_started = Instant::now();
    let run_started_ms = unix_ms();
    let ramp_ms = args.ramp.as_millis() as u64;
    let agents = tokens.len();
    let tasks: Vec<_> = tokens
        .iter()
        .enumerate()
        .map(|(index, (name, token))| {
            let hub = &args.hubs[index % args.hubs.len()];
            let agent = Agent {
                index,
                url: format!("{hub}/v1/clusters/{name}/bundle"),
                status_url: args
                    .deltas
                    .then(|| format!("{hub}/v1/clusters/{name}/status")),
                token: token.clone(),
                wait: args.wait,
                start_after: Duration::from_millis(ramp_ms * index as u64 / agents as u64),
            };
            let client = if args.http2 {
                http_client(true)
            } else {
                client.clone()
            };
            tokio::spawn(run_agent(
                agent,
                client,
                counts.clone(),
                seen.clone(),
                stopped.clone(),
            ))
        })
        .collect();
    println!(
        "agents: {agents} on {} hub(s), wait {}s, starting over {} s, running {} s",
        args.hubs.len(),
        args.wait.as_secs(),
        args.ramp.as_secs(),
        args.duration.as_secs()
    );
    let mut all_started = false;
    while run_started.elapsed() < args.duration {
        let left = args.duration.saturating_sub(run_started.elapsed());
        tokio::time::sleep(args.every.min(left)).await;
        let started = counts.started.load(Ordering::Relaxed);
        println!(
            "t={:.0}s unix_ms={} agents_started={started} in_flight={} polls={} 304={} 200={} errors={}",
            run_started.elapsed().as_secs_f64(),
            unix_ms(),
            counts.in_flight.load(Ordering::Relaxed),
            counts.polls.load(Ordering::Relaxed),
            counts.not_modified.load(Ordering::Relaxed),
            counts.ok.load(Ordering::Relaxed),
            counts.errors.load(Ordering::Relaxed),
        );
        if !all_started && started == agents {
            all_started = true;
            println!("ready: every agent has its bundle and holds a long-poll");
        }
    }
    let _ = stop.send(true);
    for task in tasks {
        let _ = task.await;
    }

    // What the database records now, and since when, against what each agent had.
    let store = Store::open_tables(&args.database)
        .await
        .unwrap_or_else(|e| usage(&format!("cannot open the database: {e}")));
    let recorded: HashMap<String, String> = store
        .clusters()
        .await
        .unwrap_or_else(|e| usage(&format!("cannot read the clusters: {e}")))
        .into_iter()
        .map(|c| (c.name, c.digest.to_string()))
        .collect();
    let since = store
        .served_since()
        .await
        .unwrap_or_else(|e| usage(&format!("cannot read the clusters: {e}")));
    store.close().await;
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (mut latencies, mut per_hub) = (Vec::new(), vec![Vec::new(); args.hubs.len()]);
    let (mut changed, mut missed, mut late) = (0usize, Vec::new(), 0usize);
    for (index, ((name, _), mine)) in tokens.iter().zip(&seen).enumerate() {
        let (Some(digest), Some(&at)) = (recorded.get(name), since.get(name)) else {
            continue;
        };
        // Only a render recorded during the run, after this agent had its first bundle.
        if at < run_started_ms || mine.first.is_none() || mine.first.as_ref() == Some(digest) {
            continue;
        }
        changed += 1;
        match mine.changes.iter().find(|(d, _)| d == digest) {
            Some((_, received)) => {
                let ms = received - at;
                if ms > TARGET.as_millis() as i64 {
                    late += 1;
                }
                latencies.push(ms);
                per_hub[index % args.hubs.len()].push(ms);
            }
            None => missed.push(name.clone()),
        }
    }
    json!({
        "agents": agents,
        "hubs": args.hubs,
        "wait_s": args.wait.as_secs(),
        "duration_s": args.duration.as_secs(),
        "polls": counts.polls.load(Ordering::Relaxed),
        "not_modified": counts.not_modified.load(Ordering::Relaxed),
        "ok": counts.ok.load(Ordering::Relaxed),
        "errors": counts.errors.load(Ordering::Relaxed),
        "timeouts": counts.timeouts.load(Ordering::Relaxed),
        "new_bundles": {
            "as_deltas": counts.deltas.load(Ordering::Relaxed),
            "delta_bytes": counts.delta_bytes.load(Ordering::Relaxed),
            "in_full": counts.full.load(Ordering::Relaxed),
            "full_bytes": counts.full_bytes.load(Ordering::Relaxed),
            "reports": counts.reports.load(Ordering::Relaxed),
            "report_errors": counts.report_errors.load(Ordering::Relaxed),
        },
        "render": {
            "agents_whose_digest_changed": changed,
            "answered_with_new_digest": latencies.len(),
            "missed": missed.len(),
            "missed_first": missed.iter().take(5).collect::<Vec<_>>(),
            "later_than_5s": late,
            "latency": quantiles(latencies.clone()),
            // From the first agent to have its new digest (the render was recorded and
            // served by then): the spread of the answers, without the recording itself.
            "from_first_answer": quantiles({
                let first = latencies.iter().copied().min().unwrap_or(0);
                latencies.iter().map(|ms| ms - first).collect()
            }),
            "latency_by_hub": per_hub.into_iter().map(quantiles).collect::<Vec<_>>(),
        },
    })
}

#[cfg(test)]
#[path = "support/repo.rs"]
mod repo;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use flotilla_hub::{Hub, HubConfig, SourceSpec};

    use super::repo::{git, until_long_polls_held, write};

    fn set_version(dir: &Path, version: &str) {
        write(
            dir,
            "workloads/app/manifests/config.yaml",
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  version: \"{version}\"\n"
            ),
        );
    }

    /// Three agents on an in-process hub: each holds a long-poll, and a commit reaches
    /// every one of them with its new digest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_agents_have_the_new_digest_after_a_commit() {
        let repo = tempfile::tempdir().expect("repo");
        let dir = repo.path();
        for i in 0..3 {
            write(
                dir,
                &format!("clusters/c{i}.yaml"),
                &format!(
                    "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c{i}\n"
                ),
            );
        }
        write(
            dir,
            "workloads/app/workload.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: app\n  targets:\n    - clusterSelector: {}\n",
        );
        set_version(dir, "v1");
        git(dir, &["init", "--quiet", "--initial-branch=main"]);
        git(dir, &["add", "--all"]);
        git(dir, &["commit", "--quiet", "-m", "v1"]);

        let state = tempfile::tempdir().expect("state");
        let config = HubConfig::new(
            state.path(),
            SourceSpec {
                repo: dir.display().to_string(),
                branch: None,
                path: String::new(),
                worktree: false,
            },
        );
        let hub = Hub::start(config).await.expect("hub");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(hub.serve(listener, async {
            let _ = stopped.await;
        }));
        let store = Store::open(state.path()).await.expect("store");
        while store.clusters().await.expect("clusters").len() < 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        store.close().await;

        let load = tokio::spawn(run(Args {
            hubs: vec![base.clone()],
            database: Database::Sqlite(state.path().join("flotilla.db")),
            agents: 3,
            duration: Duration::from_secs(6),
            wait: Duration::from_secs(30),
            ramp: Duration::ZERO,
            tokens: None,
            every: Duration::from_secs(1),
            http2: false,
            deltas: true,
        }));
        // Once the three long-polls are held, a commit changes every cluster's bundle.
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        until_long_polls_held(&client, &base, 3).await;
        set_version(dir, "v2");
        git(dir, &["commit", "--quiet", "-am", "v2"]);
        let summary = load.await.expect("the load client");
        let _ = stop.send(());
        let _ = served.await;

        assert_eq!(summary["errors"], 0, "{summary}");
        // Three first fetches and three new digests; every other answer a 304 or none.
        assert_eq!(summary["ok"], 6, "{summary}");
        let render = &summary["render"];
        assert_eq!(render["agents_whose_digest_changed"], 3, "{summary}");
        assert_eq!(render["answered_with_new_digest"], 3, "{summary}");
        assert_eq!(render["missed"], 0, "{summary}");
        // Each agent reported what it took, and its new bundle came as a delta from it
        // (made ahead of the change).
        let new = &summary["new_bundles"];
        assert_eq!(new["report_errors"], 0, "{summary}");
        assert_eq!(new["as_deltas"], 3, "{summary}");
        assert_eq!(new["in_full"], 0, "{summary}");
        assert!(
            render["latency"]["max_ms"]
                .as_i64()
                .is_some_and(|ms| ms >= 0),
            "{summary}"
        );
    }
}
