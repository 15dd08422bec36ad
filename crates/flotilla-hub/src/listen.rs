//! Accepting connections, plain or TLS, within limits: a time to send a request's
//! headers, a time a connection may sit without a request in flight, and a cap on the
//! connections held at once, derived from the open-file limit.
//!
//! A held long-poll is a request in flight: no timeout here ends it, so `--max-wait`
//! alone bounds it. When the cap is reached, a connection still sending a request's
//! body (for longer than [`BODY_GRACE`]) is closed to make room, or else the one that
//! has been idle the longest (no request in flight, or still in its TLS handshake):
//! sockets that only hold a file descriptor, or trickle a body, never keep an agent
//! with a real request out. With `--client-ca`, every connection's certificate is
//! checked against the path it asks for (see [`crate::tls`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower::Service as _;

/// The limits on connections. [`ConnectionLimits::default`] gives the documented
/// defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client has to complete the TLS handshake and send a request's
    /// headers; an HTTP/1.1 connection waiting for its next request counts as reading
    /// headers.
    pub header_timeout: Duration,
    /// How long a connection may stay open without a request in flight.
    pub idle_timeout: Duration,
    /// The most connections held at once; `None` derives it from the open-file limit
    /// (see [`connection_cap`]).
    pub max_connections: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections: None,
        }
    }
}

/// The open-file limit before and after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    /// The hard limit (the most the soft limit can be raised to).
    pub hard: u64,
}

/// How many connections the kernel may hold ready for the hub to accept (capped by
/// `net.core.somaxconn`, 4,096 on Linux since 5.4). The usual 128 is too few when a
/// fleet's agents come back together, after a hub restart or a network outage: a
/// connection past the queue waits for its SYN to be sent again, 1 s, then 3 s, then
/// 7 s later.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `address` with a listen queue of [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as
/// the standard library does). Call it within a Tokio runtime; the listener it gives
/// is non-blocking.
pub fn bind(address: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)?.into_std()
}

/// Raises the soft open-file limit to the hard limit (each held connection is a file
/// descriptor, and the usual soft limit of 1,024 is far below a fleet's agents).
pub fn raise_open_file_limit() -> std::io::Result<OpenFiles> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if before < hard {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    Ok(OpenFiles { before, soft, hard })
}

/// The current soft open-file limit.
pub fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// The connection cap for a soft open-file limit: the limit less what the hub needs
/// besides connections (the database, objects being read and written, the fleet
/// repository, the watcher): a quarter of the limit, at most 1,024. A limit of 65,536
/// gives 64,512 connections; 1,024 gives 768.
pub fn connection_cap(open_files: u64) -> usize {
    let reserve = (open_files / 4).min(1024);
    usize::try_from(open_files.saturating_sub(reserve))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// How long a request's body may be on its way before its connection is among the
/// first closed at the cap: a real client's body arrives within moments of its headers.
pub const BODY_GRACE: Duration = Duration::from_secs(1);

/// One connection as the accept loop sees it.
struct Tracked {
    in_flight: AtomicUsize,
    /// Requests whose body is still being received (neither all read nor dropped).
    receiving: AtomicUsize,
    /// When the oldest body still being received began, in ms since `epoch`.
    body_since_ms: AtomicU64,
    /// Requests received so far: before the first, the header timeout applies.
    requests: AtomicU64,
    /// When the last request ended (or the connection opened), in ms since `epoch`.
    idle_since_ms: AtomicU64,
    evict: Notify,
}

struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Arc<Tracked>>>,
}

impl Registry {
    fn new() -> Registry {
        Registry {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            live: Mutex::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn add(self: &Arc<Self>) -> (Arc<Tracked>, Unregister) {
        let tracked = Arc::new(Tracked {
            in_flight: AtomicUsize::new(0),
            receiving: AtomicUsize::new(0),
            body_since_ms: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            evict: Notify::new(),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tracked.clone());
        (
            tracked,
            Unregister {
                registry: self.clone(),
                id,
            },
        )
    }

    /// Tells a connection to close: the one sending a request's body the longest, if
    /// that has taken more than [`BODY_GRACE`]; else the one idle (or sending a body)
    /// the longest. False when every connection has a request in flight whose body
    /// has been received.
    fn evict_one(&self) -> bool {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let grace = u64::try_from(BODY_GRACE.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        // Ties (connections accepted within the same millisecond) go to the one
        // accepted first, so a burst of idle sockets never evicts the newest
        // connection before its first request has been read.
        let oldest = live
            .iter()
            .filter_map(|(id, c)| {
                if c.receiving.load(Ordering::Relaxed) > 0 {
                    let since = c.body_since_ms.load(Ordering::Relaxed);
                    let slow = now.saturating_sub(since) >= grace;
                    Some(((!slow, since, *id), c))
                } else if c.in_flight.load(Ordering::Relaxed) == 0 {
                    Some(((true, c.idle_since_ms.load(Ordering::Relaxed), *id), c))
                } else {
                    None
                }
            })
            .min_by_key(|(key, _)| *key)
            .map(|(_, c)| c);
        match oldest {
            Some(connection) => {
                connection.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

struct Unregister {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.registry
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Marks a request in flight on its connection until dropped.
struct Busy {
    tracked: Arc<Tracked>,
    registry: Arc<Registry>,
}

impl Busy {
    fn new(tracked: &Arc<Tracked>, registry: &Arc<Registry>) -> Busy {
        tracked.in_flight.fetch_add(1, Ordering::Relaxed);
        tracked.requests.fetch_add(1, Ordering::Relaxed);
        Busy {
            tracked: tracked.clone(),
            registry: registry.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.tracked
            .idle_since_ms
            .store(self.registry.now_ms(), Ordering::Relaxed);
        self.tracked.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's body as the router reads it: the connection counts as receiving it
/// until it has all been read, or the handler dropped it unread.
struct Receiving {
    body: Incoming,
    guard: Option<ReceivingGuard>,
}

struct ReceivingGuard {
    tracked: Arc<Tracked>,
}

impl Receiving {
    fn new(body: Incoming, tracked: &Arc<Tracked>, registry: &Registry) -> Receiving {
        let guard = (!body.is_end_stream()).then(|| {
            if tracked.receiving.fetch_add(1, Ordering::Relaxed) == 0 {
                tracked
                    .body_since_ms
                    .store(registry.now_ms(), Ordering::Relaxed);
            }
            ReceivingGuard {
                tracked: tracked.clone(),
            }
        });
        Receiving { body, guard }
    }
}

impl Drop for ReceivingGuard {
    fn drop(&mut self) {
        self.tracked.receiving.fetch_sub(1, Ordering::Relaxed);
    }
}

impl hyper::body::Body for Receiving {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.body.is_end_stream() {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// How connections are secured.
pub(crate) enum Transport {
    Plain,
    Tls {
        acceptor: tokio_rustls::TlsAcceptor,
        /// Whether client certificates are required and bound to clusters.
        client_auth: bool,
    },
}

/// How long connections still open at shutdown are waited for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Accepts and serves connections on `listener` until `shutdown` completes, then
/// closes every connection once its request in flight is answered (waiting at most
/// [`SHUTDOWN_GRACE`]). `stopping` is set when `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    transport: Transport,
    router: axum::Router,
    limits: ConnectionLimits,
    stopping: watch::Sender<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cap_permits = cap_permits(&limits);
    let permits = Arc::new(Semaphore::new(cap_permits as usize));
    let registry = Arc::new(Registry::new());
    let transport = Arc::new(transport);
    let builders = Arc::new(Builders::new(&limits));
    let mut shutdown = std::pin::pin!(shutdown);
    // Every connection's task, so the ones still open when the grace period ends are
    // really closed (a hub run inside another program, such as a test, outlives it).
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let Some(permit) = next_permit(&permits, &registry, shutdown.as_mut()).await else {
            break;
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, or a connection reset before it was
                    // taken: wait a moment instead of spinning.
                    tracing::warn!("cannot accept a connection: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Answers are small and latency matters more than packet count.
        let _ = tcp.set_nodelay(true);
        let (tracked, unregister) = registry.add();
        let connection = Connection {
            tracked,
            registry: registry.clone(),
            builders: builders.clone(),
            router: router.clone(),
            limits,
            stopping: stopping.subscribe(),
        };
        let transport = transport.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let _unregister = unregister;
            connection.run(tcp, &transport, peer).await;
        });
    }
    stopping.send_replace(true);
    close_all(&permits, cap_permits, &registry, tasks).await;
    Ok(())
}

/// The most connections held at once, as semaphore permits (logged with the
/// timeouts when the hub starts accepting).
fn cap_permits(limits: &ConnectionLimits) -> u32 {
    let cap = limits
        .max_connections
        .unwrap_or_else(|| connection_cap(open_file_limit()));
    let cap_permits = u32::try_from(cap).unwrap_or(u32::MAX / 2).min(u32::MAX / 2);
    tracing::info!(
        max_connections = cap_permits,
        header_timeout = %humantime::format_duration(limits.header_timeout),
        idle_timeout = %humantime::format_duration(limits.idle_timeout),
        "accepting connections"
    );
    cap_permits
}

/// A permit for one more connection: at once below the cap; at the cap, once the
/// connection idle the longest has been closed to make room, or once one ends when
/// every connection is busy. `None` when `shutdown` completes first.
async fn next_permit(
    permits: &Arc<Semaphore>,
    registry: &Registry,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = permits.clone().try_acquire_owned() {
        return Some(permit);
    }
    registry.evict_one();
    tokio::select! {
        permit = permits.clone().acquire_owned() => permit.ok(),
        _ = shutdown => None,
    }
}

/// Waits for every connection to end, at most [`SHUTDOWN_GRACE`], then closes those
/// still open. Every connection holds a permit until it ends: all of them back means
/// all ended.
async fn close_all(
    permits: &Semaphore,
    cap_permits: u32,
    registry: &Registry,
    mut tasks: JoinSet<()>,
) {
    let all = tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(cap_permits)).await;
    if all.is_err() {
        let open = registry.live.lock().map(|l| l.len()).unwrap_or(0);
        tracing::warn!(
            connections = open,
            "connections still open after {}; closing them",
            humantime::format_duration(SHUTDOWN_GRACE)
        );
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// hyper's builders for the two protocols a connection may speak.
struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl Builders {
    /// HTTP/1.1 with the header timeout (which also bounds the wait for a kept-alive
    /// connection's next request), and HTTP/2.
    fn new(limits: &ConnectionLimits) -> Builders {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new());
        Builders { http1, http2 }
    }
}

/// Which HTTP a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// What a client speaking HTTP/2 over cleartext TCP sends first (RFC 9113, 3.4).
const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long to wait before looking again at a plain connection whose first bytes do
/// not yet tell its protocol (a client that sent part of the HTTP/2 preface), the
/// first time; the wait doubles each time, up to [`SNIFF_AGAIN_AT_MOST`], so a client
/// that stops there costs a few wake-ups until the header timeout, not one every
/// few milliseconds.
const SNIFF_AGAIN: Duration = Duration::from_millis(10);
const SNIFF_AGAIN_AT_MOST: Duration = Duration::from_secs(1);

/// The protocol that a plain connection's first bytes show, or `None` while they
/// are all a beginning of the HTTP/2 preface and shorter than it.
fn protocol_of(first: &[u8]) -> Option<Protocol> {
    if !HTTP2_PREFACE.starts_with(first) {
        Some(Protocol::Http1)
    } else if first.len() == HTTP2_PREFACE.len() {
        Some(Protocol::Http2)
    } else {
        None
    }
}

/// Tells a plain connection's protocol by peeking at its first bytes, leaving them in
/// the socket for hyper to read with the rest of the request. (A reader that took
/// them, as generic protocol detection does, hands hyper those few bytes on their
/// own; hyper then wants a whole 8 KiB free behind them and grows its read buffer to
/// 16 KiB, which a held long-poll keeps for minutes.) `None`: the client closed the
/// connection before sending anything.
async fn sniff(tcp: &TcpStream) -> std::io::Result<Option<Protocol>> {
    let mut first = [0_u8; HTTP2_PREFACE.len()];
    let mut pause = SNIFF_AGAIN;
    loop {
        let read = tcp.peek(&mut first).await?;
        if read == 0 {
            return Ok(None);
        }
        if let Some(protocol) = protocol_of(&first[..read]) {
            return Ok(Some(protocol));
        }
        // Peeking again at once would see the same bytes: give the rest time to come.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(SNIFF_AGAIN_AT_MOST);
    }
}

/// The protocol agreed in a TLS handshake: HTTP/2 only when ALPN chose it, as HTTP/2
/// over TLS requires (RFC 9113, 3.2).
fn negotiated(alpn: Option<&[u8]>) -> Protocol {
    match alpn {
        Some(b"h2") => Protocol::Http2,
        _ => Protocol::Http1,
    }
}

/// The address a request came from, in its extensions (the web page throttles failed
/// logins by it).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

struct Connection {
    tracked: Arc<Tracked>,
    registry: Arc<Registry>,
    builders: Arc<Builders>,
    router: axum::Router,
    limits: ConnectionLimits,
    stopping: watch::Receiver<bool>,
}

impl Connection {
    async fn run(mut self, tcp: TcpStream, transport: &Transport, peer: std::net::SocketAddr) {
        // Each protocol's future in an allocation of its own size: a task holding
        // the larger of them inline would make every connection pay for TLS state.
        match transport {
            Transport::Plain => Box::pin(self.plain(tcp, peer)).await,
            Transport::Tls {
                acceptor,
                client_auth,
            } => Box::pin(self.tls(tcp, acceptor, *client_auth, peer)).await,
        }
    }

    /// Runs `step` before the connection has sent its first request: within the
    /// header timeout, and given up if the connection is evicted or the hub stops.
    async fn before_request<T>(&mut self, step: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            done = tokio::time::timeout(self.limits.header_timeout, step) => done.ok(),
            _ = self.tracked.evict.notified() => None,
            _ = self.stopping.wait_for(|stop| *stop) => None,
        }
    }

    async fn plain(&mut self, tcp: TcpStream, peer: std::net::SocketAddr) {
        match self.before_request(sniff(&tcp)).await {
            Some(Ok(Some(protocol))) => self.http(tcp, protocol, None, peer).await,
            Some(Ok(None)) => {}
            Some(Err(err)) => tracing::debug!(%peer, "cannot read from the connection: {err}"),
            None => tracing::debug!(%peer, "no request began in time"),
        }
    }

    async fn tls(
        &mut self,
        tcp: TcpStream,
        acceptor: &tokio_rustls::TlsAcceptor,
        client_auth: bool,
        peer: std::net::SocketAddr,
    ) {
        let tls = match self.before_request(acceptor.accept(tcp)).await {
            Some(Ok(tls)) => tls,
            Some(Err(err)) => {
                tracing::debug!(%peer, "TLS handshake failed: {err}");
                return;
            }
            None => {
                tracing::debug!(%peer, "TLS handshake not completed in time");
                return;
            }
        };
        let session = tls.get_ref().1;
        let protocol = negotiated(session.alpn_protocol());
        let client = client_auth.then(|| {
            session
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| Arc::new(cert.clone().into_owned()))
        });
        self.http(tls, protocol, client, peer).await;
    }

    /// Serves HTTP on `io`. `client` is `Some` when client certificates are required:
    /// the peer's certificate, if it sent one.
    async fn http<I>(
        &mut self,
        io: I,
        protocol: Protocol,
        client: Option<Option<Arc<CertificateDer<'static>>>>,
        peer: std::net::SocketAddr,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = {
            let (tracked, registry, router) = (
                self.tracked.clone(),
                self.registry.clone(),
                self.router.clone(),
            );
            hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let busy = Busy::new(&tracked, &registry);
                let mut request = request.map(|body| Receiving::new(body, &tracked, &registry));
                request.extensions_mut().insert(Peer(peer));
                let mut router = router.clone();
                let refusal = client
                    .as_ref()
                    .and_then(|cert| crate::tls::refuse(request.uri().path(), cert.as_deref()));
                async move {
                    let response = match refusal {
                        Some(refusal) => refusal,
                        None => match router.call(request).await {
                            Ok(response) => response,
                            Err(never) => match never {},
                        },
                    };
                    drop(busy);
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let io = TokioIo::new(io);
        let builders = self.builders.clone();
        match protocol {
            Protocol::Http1 => {
                let connection = builders.http1.serve_connection(io, service);
                self.drive(Box::pin(connection), |c| c.graceful_shutdown())
                    .await;
            }
            Protocol::Http2 => {
                let connection = builders.http2.serve_connection(io, service);
                self.drive(Box::pin(connection), |c| c.graceful_shutdown())
                    .await;
            }
        }
    }

    /// Drives a connection to its end, shutting it down gracefully (its requests in
    /// flight answered first) when it is evicted, stays idle too long, or the hub stops;
    /// an evicted connection still receiving a body is closed at once.
    async fn drive<C>(&mut self, mut connection: Pin<Box<C>>, graceful_shutdown: fn(Pin<&mut C>))
    where
        C: Future<Output = Result<(), hyper::Error>>,
    {
        let mut closing = false;
        loop {
            let idle_until = idle_deadline(&self.tracked, &self.registry, &self.limits);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!("connection ended: {err}");
                    }
                    return;
                }
                _ = self.tracked.evict.notified(), if !closing => {
                    // Closed at once when nothing is in flight, or a request's body is
                    // still on its way (its answer would wait for the rest).
                    if self.tracked.in_flight.load(Ordering::Relaxed) == 0
                        || self.tracked.receiving.load(Ordering::Relaxed) > 0
                    {
                        return;
                    }
                    graceful_shutdown(connection.as_mut());
                    closing = true;
                }
                _ = self.stopping.wait_for(|stop| *stop), if !closing => {
                    graceful_shutdown(connection.as_mut());
                    closing = true;
                }
                _ = tokio::time::sleep_until(idle_until.into()), if !closing => {
                    if self.tracked.in_flight.load(Ordering::Relaxed) == 0
                        && idle_deadline(&self.tracked, &self.registry, &self.limits) <= Instant::now()
                    {
                        graceful_shutdown(connection.as_mut());
                        closing = true;
                    }
                }
            }
        }
    }
}

/// When a connection is closed if no request comes: the header timeout after it opened
/// while it has sent no request (whatever the protocol), the idle timeout after its
/// last request ended; while a request is in flight, an idle timeout from now, to look
/// again then.
fn idle_deadline(tracked: &Tracked, registry: &Registry, limits: &ConnectionLimits) -> Instant {
    let idle = limits.idle_timeout;
    if tracked.in_flight.load(Ordering::Relaxed) > 0 {
        return Instant::now() + idle;
    }
    let allowed = if tracked.requests.load(Ordering::Relaxed) == 0 {
        limits.header_timeout
    } else {
        idle
    };
    let since = tracked.idle_since_ms.load(Ordering::Relaxed);
    registry.epoch + Duration::from_millis(since) + allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_hub_and_reaches_ten_thousand_where_the_limit_allows() {
        assert_eq!(connection_cap(1_048_576), 1_047_552);
        assert_eq!(connection_cap(65_536), 64_512);
        assert_eq!(connection_cap(11_024), 10_000);
        assert_eq!(connection_cap(1_024), 768);
        assert_eq!(connection_cap(256), 192);
        assert_eq!(connection_cap(0), 1);
    }

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let limits = raise_open_file_limit().expect("raise");
        assert_eq!(limits.soft, limits.hard);
        assert!(limits.before <= limits.soft);
        assert_eq!(open_file_limit(), limits.soft);
    }

    /// Connections the hub has not accepted yet wait in the kernel's queue: far more
    /// than the standard library's 128 (up to what `net.core.somaxconn` allows)
    /// connect at once, none sent back to retry its SYN a second later.
    #[tokio::test]
    async fn far_more_connections_than_128_wait_to_be_accepted() {
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(LISTEN_BACKLOG);
        let queue = LISTEN_BACKLOG.min(somaxconn).min(600) as usize;
        let _ = raise_open_file_limit();
        let listener = bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        let address = listener.local_addr().expect("address");
        let connected = tokio::task::spawn_blocking(move || {
            (0..queue)
                .map(|_| std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)))
                .collect::<Result<Vec<_>, _>>()
                .map(|streams| streams.len())
        })
        .await
        .expect("task");
        assert_eq!(
            connected.expect("every connection waits in the queue"),
            queue
        );
        drop(listener);
    }

    #[test]
    fn the_first_bytes_tell_http2_from_http1() {
        let cases: &[(&[u8], Option<Protocol>)] = &[
            (
                b"GET /v1/clusters/red/bundle HTTP/1.1\r\n",
                Some(Protocol::Http1),
            ),
            (b"G", Some(Protocol::Http1)),
            (
                b"POST /v1/clusters/red/status HTTP/1.1\r\n",
                Some(Protocol::Http1),
            ),
            (b"PRI * HTTP/1.1\r\n\r\n", Some(Protocol::Http1)),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Some(Protocol::Http2)),
            // A beginning of the preface: not known yet.
            (b"P", None),
            (b"PRI * HTTP/2.0\r\n", None),
        ];
        for (first, protocol) in cases {
            assert_eq!(
                protocol_of(first),
                *protocol,
                "{}",
                String::from_utf8_lossy(first)
            );
        }
    }

    #[test]
    fn tls_speaks_http2_only_when_alpn_chose_it() {
        assert_eq!(negotiated(Some(b"h2")), Protocol::Http2);
        assert_eq!(negotiated(Some(b"http/1.1")), Protocol::Http1);
        assert_eq!(negotiated(None), Protocol::Http1);
    }

    /// A connected pair of sockets on loopback: (the server's end, the client's).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (server, client)
    }

    /// What the client sent, read from the server's end once the client closed it.
    async fn left_in(mut server: TcpStream) -> Vec<u8> {
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut bytes)
            .await
            .expect("read");
        bytes
    }

    #[tokio::test]
    async fn sniffing_leaves_the_first_bytes_for_hyper_to_read() {
        use tokio::io::AsyncWriteExt as _;

        let request = b"GET /healthz HTTP/1.1\r\nhost: hub\r\n\r\n";
        let (server, mut client) = pair().await;
        client.write_all(request).await.expect("send");
        assert_eq!(sniff(&server).await.expect("sniff"), Some(Protocol::Http1));
        drop(client);
        assert_eq!(left_in(server).await, request);

        // The preface in two parts, the second a moment later: sniffing waits for it.
        let (server, mut client) = pair().await;
        client.write_all(&HTTP2_PREFACE[..10]).await.expect("send");
        let rest = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            client.write_all(&HTTP2_PREFACE[10..]).await.expect("send");
            client
        });
        assert_eq!(sniff(&server).await.expect("sniff"), Some(Protocol::Http2));
        drop(rest.await.expect("writer"));
        assert_eq!(left_in(server).await, HTTP2_PREFACE);

        // A client that closes without a byte.
        let (server, client) = pair().await;
        drop(client);
        assert_eq!(sniff(&server).await.expect("sniff"), None);
    }
}
