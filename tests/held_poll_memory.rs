//! What a held long-poll costs the hub in memory, counted byte for byte.
//!
//! A hub holds one long-poll per agent, for minutes, so whatever a held poll keeps is
//! multiplied by the fleet: 10,000 agents at 32 KiB each is over 300 MiB. This test
//! holds polls on an in-process hub over plain HTTP/1.1, as agents send them, and
//! reads from the allocator's statistics (jemalloc, the hub's own allocator) what each
//! one added. It is a test binary of its own so that no other test allocates beside it.
//!
//! Most of what a held HTTP/1.1 poll keeps is hyper's read buffer and its header write
//! buffer, 8 KiB each. Two ways to keep 8 KiB more have been seen and are what this
//! test guards against: a read buffer grown to 16 KiB because the first bytes of the
//! connection reached hyper on their own (after protocol detection took them from the
//! socket), and a second read buffer kept alive by a held request whose header values
//! were slices of the first.

#![cfg(not(target_env = "msvc"))]

#[path = "it/support/mod.rs"]
#[allow(dead_code, unused_imports)]
mod support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use support::hub::{Repo, Running, client, config, eventually, get_bundle, make_token};

// The hub's own allocator, whose statistics count every byte handed out.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The bytes allocated and not yet freed, in the whole process.
fn live() -> usize {
    tikv_jemalloc_ctl::epoch::advance().expect("jemalloc statistics");
    tikv_jemalloc_ctl::stats::allocated::read().expect("jemalloc statistics")
}

/// A GET of `path` on its own connection, as plain as an agent's: the answer's text.
fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
}

fn held(address: &str) -> usize {
    get(address, "/metrics")
        .lines()
        .find_map(|line| line.strip_prefix("flotilla_long_polls_held "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as usize)
}

/// Opens `count` connections, each holding a poll for `cluster`'s bundle as an agent
/// sends it, and waits until the hub holds `total` polls.
async fn hold(
    address: &str,
    cluster: &str,
    token: &str,
    etag: &str,
    count: usize,
    total: usize,
) -> Vec<TcpStream> {
    let request = format!(
        "GET /v1/clusters/{cluster}/bundle?wait=5m HTTP/1.1\r\nhost: {address}\r\n\
         authorization: Bearer {token}\r\nif-none-match: {etag}\r\n\
         accept-encoding: zstd, gzip\r\nuser-agent: flotilla-agent\r\naccept: */*\r\n\r\n"
    );
    let polls = (0..count)
        .map(|_| {
            let mut stream = TcpStream::connect(address).expect("connect");
            stream.write_all(request.as_bytes()).expect("send");
            stream
        })
        .collect();
    let owned = address.to_string();
    eventually(
        "the hub to hold every poll",
        Duration::from_secs(30),
        || {
            let address = owned.clone();
            async move {
                let now = tokio::task::spawn_blocking(move || held(&address))
                    .await
                    .expect("metrics");
                (now >= total).then_some(())
            }
        },
    )
    .await;
    polls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_long_poll_keeps_one_read_buffer_and_one_write_buffer() {
    // Each poll is two sockets in this one process.
    flotilla_hub::listen::raise_open_file_limit().expect("open-file limit");
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let mut settings = config(state.path(), &repo.path().display().to_string());
    settings.max_wait = Duration::from_secs(300);
    // Every poll is of one cluster.
    settings.requests.max_polls_per_cluster = 1_000;
    let hub = Running::start_ready(settings).await;
    let address = hub.base.trim_start_matches("http://").to_string();
    let url = hub.url("/v1/clusters/red/bundle");
    let (status, etag, _) = get_bundle(&client(), &url, &token, None).await;
    assert_eq!(status, 200);
    let etag = etag.expect("an ETag");

    // A first batch, so what the hub allocates once (its first held poll's
    // bookkeeping, the runtime's first blocking threads) is not counted.
    const WARM: usize = 50;
    const MEASURED: usize = 400;
    let warm = hold(&address, "red", &token, &etag, WARM, WARM).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = live();
    let measured = hold(&address, "red", &token, &etag, MEASURED, WARM + MEASURED).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = live();

    let per_poll = after.saturating_sub(before) / MEASURED;
    eprintln!("each held poll keeps {per_poll} bytes");
    assert!(
        per_poll <= 26 * 1024,
        "each held poll keeps {per_poll} bytes"
    );
    drop((warm, measured));
    hub.stop().await;
}
