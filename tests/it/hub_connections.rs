//! The hub's connections as a hostile network meets them: client certificates bound to
//! clusters (mTLS), a private CA for agents, idle sockets beyond the connection cap, a
//! client that never finishes its headers, held polls outliving every connection
//! timeout, one hub per state dir, and garbage collection of stored objects.

use crate::support::hub::*;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_agent::client::{FailureKind, Fetched, HubClient, Server, TlsOptions};
use flotilla_hub::{ConnectionLimits, Hub, HubError, RequestLimits, TlsFiles};
use flotilla_testkit::{TestCa, TestLeaf};

/// PEM files of one test's PKI, written into a temp dir.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            dir: tempfile::tempdir().expect("dir"),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write PEM");
        path
    }

    /// Writes a leaf as `<name>.crt` and `<name>.key`.
    fn leaf(&self, name: &str, leaf: &TestLeaf) -> (PathBuf, PathBuf) {
        (
            self.write(&format!("{name}.crt"), &leaf.cert_pem),
            self.write(&format!("{name}.key"), &leaf.key_pem),
        )
    }
}

/// A hub serving HTTPS on 127.0.0.1 with `files`, stopped when the returned sender is
/// dropped or sent to.
async fn serve_tls(
    hub: Hub,
    files: TlsFiles,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), HubError>>,
) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("https://{}", listener.local_addr().expect("address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        hub.serve_tls(listener, &files, async {
            let _ = stopped.await;
        })
        .await
    });
    (base, stop, task)
}

fn tls_client(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(ca).expect("ca")).expect("pem"),
        );
    if let Some((cert, key)) = identity {
        let mut pem = std::fs::read(cert).expect("cert");
        pem.extend(std::fs::read(key).expect("key"));
        builder = builder.identity(reqwest::Identity::from_pem(&pem).expect("identity"));
    }
    builder.build().expect("client")
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, String) {
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_bind_each_connection_to_its_cluster() {
    let pki = Pki::new();
    let site_ca = TestCa::new("site CA");
    let other_ca = TestCa::new("some other CA");
    let ca = pki.write("ca.pem", &site_ca.cert_pem());
    let (cert, key) = pki.leaf("hub", &site_ca.server(&["127.0.0.1"]));
    let red = pki.leaf("red", &site_ca.client("red"));
    let blue = pki.leaf("blue", &site_ca.client("blue"));
    let operator = pki.leaf("operator", &site_ca.client("ops.example"));
    let forged_red = pki.leaf("forged-red", &other_ca.client("red"));

    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red_token = make_token(state.path(), Some("red")).await;
    let blue_token = make_token(state.path(), Some("blue")).await;
    let admin_token = make_token(state.path(), None).await;
    let red_token_file = pki.write("red.token", &red_token);
    let hub = Hub::start(config(state.path(), &repo.path().display().to_string()))
        .await
        .expect("hub");
    let files = TlsFiles {
        cert,
        key,
        client_ca: Some(ca.clone()),
    };
    let (base, stop, task) = serve_tls(hub, files).await;
    let url = |path: &str| format!("{base}{path}");
    let red_bundle = url("/v1/clusters/red/bundle");
    let blue_bundle = url("/v1/clusters/blue/bundle");

    let as_red = tls_client(&ca, Some((&red.0, &red.1)));
    let body = eventually(
        "red's bundle with red's certificate",
        Duration::from_secs(10),
        || {
            let (client, url, token) = (&as_red, &red_bundle, &red_token);
            async move {
                let (status, _, body) = get_bundle(client, url, token, None).await;
                (status == 200).then_some(body)
            }
        },
    )
    .await;
    flotilla_core::bundle::verify_document(&body, Some("red")).expect("red's bundle");

    // Red's certificate reads nothing of blue's, whatever token comes with it.
    for token in [&blue_token, &admin_token] {
        let (status, body) = answer(as_red.get(&blue_bundle).bearer_auth(token)).await;
        assert_eq!(status, 403, "{body}");
        assert!(
            body.contains("not for cluster \\\"blue\\\""),
            "the refusal says why: {body}"
        );
    }
    let (status, _) = answer(
        as_red
            .post(url("/v1/clusters/blue/status"))
            .bearer_auth(&blue_token)
            .header("content-type", "application/json")
            .body("{}"),
    )
    .await;
    assert_eq!(status, 403);
    // The certificate narrows the token, never replaces it.
    let (status, _) = answer(as_red.get(&red_bundle)).await;
    assert_eq!(status, 401);
    let (status, _) = answer(as_red.get(&red_bundle).bearer_auth(&blue_token)).await;
    assert_eq!(status, 403);

    // Blue's own certificate reads blue's bundle.
    let as_blue = tls_client(&ca, Some((&blue.0, &blue.1)));
    let (status, _, _) = get_bundle(&as_blue, &blue_bundle, &blue_token, None).await;
    assert_eq!(status, 200);

    // The common name is not read: a certificate named red only there is not red's.
    let common_name_only = pki.leaf("cn-red", &site_ca.client_named("red", &[]));
    let as_cn_red = tls_client(&ca, Some((&common_name_only.0, &common_name_only.1)));
    let (status, _) = answer(as_cn_red.get(&red_bundle).bearer_auth(&red_token)).await;
    assert_eq!(status, 403);
    // One certificate may name several clusters.
    let both = pki.leaf("both", &site_ca.client_named("mirror", &["red", "blue"]));
    let as_both = tls_client(&ca, Some((&both.0, &both.1)));
    let (status, _, _) = get_bundle(&as_both, &blue_bundle, &blue_token, None).await;
    assert_eq!(status, 200);
    let (status, _, _) = get_bundle(&as_both, &red_bundle, &red_token, None).await;
    assert_eq!(status, 200);

    // An operator's certificate (any name) reaches the fleet with an admin token.
    let as_operator = tls_client(&ca, Some((&operator.0, &operator.1)));
    let (status, _) = answer(as_operator.get(url("/v1/fleet")).bearer_auth(&admin_token)).await;
    assert_eq!(status, 200);

    // Without a certificate: probes answer, everything else asks for one.
    let anonymous = tls_client(&ca, None);
    let (status, _) = answer(anonymous.get(url("/healthz"))).await;
    assert_eq!(status, 200);
    let (status, body) = answer(anonymous.get(&red_bundle).bearer_auth(&red_token)).await;
    assert_eq!(status, 401);
    assert!(body.contains("requires a client certificate"), "{body}");
    let (status, _) = answer(anonymous.get(url("/v1/fleet")).bearer_auth(&admin_token)).await;
    assert_eq!(status, 401);

    // A certificate named "red" from another CA ends the handshake.
    let forged = tls_client(&ca, Some((&forged_red.0, &forged_red.1)));
    let refused = forged.get(&red_bundle).bearer_auth(&red_token).send().await;
    assert!(
        refused.is_err(),
        "a certificate of an unknown CA was accepted: {refused:?}"
    );

    // The agent's client: the site CA through --ca-file and red's certificate.
    let server = Server::parse(&base).expect("url");
    let tls = TlsOptions {
        ca_file: Some(ca.clone()),
        client_cert: Some(red.clone()),
    };
    let mut agent =
        HubClient::with_tls(server.clone(), "red", Some(&red_token_file), &tls).expect("client");
    let fetched = agent
        .fetch_bundle(None, Duration::ZERO)
        .await
        .expect("fetched");
    assert!(matches!(fetched, Fetched::Bundle { .. }), "{fetched:?}");

    // Without --ca-file the hub's private CA is unknown: a clear error.
    let no_ca = TlsOptions {
        ca_file: None,
        client_cert: Some(red.clone()),
    };
    let mut agent =
        HubClient::with_tls(server.clone(), "red", Some(&red_token_file), &no_ca).expect("client");
    let err = agent
        .fetch_bundle(None, Duration::ZERO)
        .await
        .expect_err("unknown issuer");
    let message = err.to_string();
    assert!(
        message.contains("UnknownIssuer") && message.contains("--ca-file"),
        "{message}"
    );
    assert_eq!(err.kind(), FailureKind::Transient);

    // Without a client certificate: the hub asks for one.
    let no_cert = TlsOptions {
        ca_file: Some(ca.clone()),
        client_cert: None,
    };
    let mut agent = HubClient::with_tls(server.clone(), "red", Some(&red_token_file), &no_cert)
        .expect("client");
    let err = agent
        .fetch_bundle(None, Duration::ZERO)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("requires a client certificate"),
        "{err}"
    );

    // Blue's certificate in red's agent: refused, and the message says why.
    let wrong_cert = TlsOptions {
        ca_file: Some(ca.clone()),
        client_cert: Some(blue.clone()),
    };
    let mut agent =
        HubClient::with_tls(server, "red", Some(&red_token_file), &wrong_cert).expect("client");
    let err = agent
        .fetch_bundle(None, Duration::ZERO)
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("not for cluster"), "{err}");

    let _ = stop.send(());
    task.await.expect("task").expect("stops cleanly");
}

/// The hub chooses each connection's protocol itself: on TLS what ALPN agreed, on a
/// plain connection HTTP/2 only when the client opens with its preface.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_speaks_the_http_its_client_chose() {
    let pki = Pki::new();
    let site_ca = TestCa::new("site CA");
    let ca = pki.write("ca.pem", &site_ca.cert_pem());
    let (cert, key) = pki.leaf("hub", &site_ca.server(&["127.0.0.1"]));
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let secure_state = tempfile::tempdir().expect("state dir");
    let plain = hub_with(ConnectionLimits::default(), state.path(), &repo).await;
    let hub = Hub::start(config(
        secure_state.path(),
        &repo.path().display().to_string(),
    ))
    .await
    .expect("hub");
    let files = TlsFiles {
        cert,
        key,
        client_ca: None,
    };
    let (secure, stop, task) = serve_tls(hub, files).await;

    let version = |client: reqwest::Client, url: String| async move {
        let response = client.get(url).send().await.expect("request");
        assert_eq!(response.status(), 200);
        response.version()
    };
    let healthz = |base: &str| format!("{base}/healthz");
    let tls = |http1_only: bool| {
        let builder = reqwest::Client::builder()
            .no_proxy()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&ca).expect("ca")).expect("pem"),
            );
        let builder = if http1_only {
            builder.http1_only()
        } else {
            builder
        };
        builder.build().expect("client")
    };
    assert_eq!(
        version(tls(false), healthz(&secure)).await,
        reqwest::Version::HTTP_2
    );
    assert_eq!(
        version(tls(true), healthz(&secure)).await,
        reqwest::Version::HTTP_11
    );
    let h2c = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    assert_eq!(
        version(h2c, healthz(&plain.base)).await,
        reqwest::Version::HTTP_2
    );
    assert_eq!(
        version(client(), healthz(&plain.base)).await,
        reqwest::Version::HTTP_11
    );
    let _ = stop.send(());
    task.await.expect("hub task").expect("hub stops");
    plain.stop().await;
}

#[test]
fn tls_flags_are_refused_where_they_cannot_apply() {
    let dir = tempfile::tempdir().expect("dir");
    let token = dir.path().join("token");
    std::fs::write(&token, "flt_abcdefghijklmnopqrstuvwxyz0123456789").expect("write");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate").expect("write");
    let with_ca = TlsOptions {
        ca_file: Some(ca.clone()),
        client_cert: None,
    };
    let plain = Server::parse("http://hub.example").expect("url");
    let err = HubClient::with_tls(plain, "red", Some(&token), &with_ca).expect_err("refused");
    assert!(
        err.to_string().contains("needs an https:// server"),
        "{err}"
    );
    let https = Server::parse("https://hub.example").expect("url");
    let err =
        HubClient::with_tls(https.clone(), "red", Some(&token), &with_ca).expect_err("refused");
    assert!(
        err.to_string().contains("--ca-file") && err.to_string().contains("no PEM"),
        "{err}"
    );
    let missing = TlsOptions {
        ca_file: None,
        client_cert: Some((dir.path().join("no.crt"), dir.path().join("no.key"))),
    };
    let err = HubClient::with_tls(https, "red", Some(&token), &missing).expect_err("refused");
    assert!(err.to_string().contains("--client-cert"), "{err}");
}

/// The agent binary trusts a CA given through SSL_CERT_FILE (the system's store), and
/// presents its client certificate, against a hub requiring them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binary_trusts_ssl_cert_file_and_presents_its_certificate() {
    let pki = Pki::new();
    let site_ca = TestCa::new("site CA");
    let ca = pki.write("ca.pem", &site_ca.cert_pem());
    let (cert, key) = pki.leaf("hub", &site_ca.server(&["127.0.0.1"]));
    let red = pki.leaf("red", &site_ca.client("red"));
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let token_file = pki.write("red.token", &token);
    let hub = Hub::start(config(state.path(), &repo.path().display().to_string()))
        .await
        .expect("hub");
    let files = TlsFiles {
        cert,
        key,
        client_ca: Some(ca.clone()),
    };
    let (base, stop, task) = serve_tls(hub, files).await;
    let agent_state = tempfile::tempdir().expect("agent state");
    let out = tempfile::tempdir().expect("out");
    let mut agent = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "agent",
            "--cluster",
            "red",
            "--wait",
            "5s",
            "--max-backoff",
            "1s",
        ])
        .args(["--server", &base])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--client-cert")
        .arg(&red.0)
        .arg("--client-key")
        .arg(&red.1)
        .arg("--state-dir")
        .arg(agent_state.path())
        .arg("--sink")
        .arg(format!("dir:{}", out.path().display()))
        .env("SSL_CERT_FILE", &ca)
        .env_remove("SSL_CERT_DIR")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the agent starts");
    let applied = eventually(
        "the agent to apply red's bundle",
        Duration::from_secs(60),
        || {
            let out = out.path().to_path_buf();
            async move {
                let files = std::fs::read_dir(&out).ok()?.count();
                (files > 0).then_some(files)
            }
        },
    )
    .await;
    assert!(applied > 0);
    agent.kill().expect("kill");
    let _ = agent.wait();
    let _ = stop.send(());
    task.await.expect("task").expect("stops cleanly");
}

/// Starts a plain-HTTP hub with these connection limits on `repo`.
async fn hub_with(limits: ConnectionLimits, state: &Path, repo: &Repo) -> Running {
    let mut config = config(state, &repo.path().display().to_string());
    config.connections = limits;
    config.max_wait = Duration::from_secs(3);
    Running::start_ready(config).await
}

fn address(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_beyond_the_cap_do_not_keep_a_request_out() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let limits = ConnectionLimits {
        max_connections: Some(8),
        ..ConnectionLimits::default()
    };
    let hub = hub_with(limits, state.path(), &repo).await;
    let address = address(&hub.base);
    // Five times the cap of sockets that never send a byte (with the default 30 s
    // header timeout, none of them would go away by itself before the request below).
    let idle: Vec<std::net::TcpStream> = (0..40)
        .map(|_| std::net::TcpStream::connect(&address).expect("connect"))
        .collect();
    let started = Instant::now();
    let response = client()
        .get(hub.url("/healthz"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("a real request is served beside idle sockets");
    assert_eq!(response.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    // The oldest idle socket was closed to make room.
    let mut first = idle.into_iter().next().expect("one");
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    assert_eq!(first.read(&mut byte).expect("closed, not timed out"), 0);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_dropped_and_held_polls_are_not() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let limits = ConnectionLimits {
        header_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        max_connections: None,
    };
    let hub = hub_with(limits, state.path(), &repo).await;

    let mut slow = std::net::TcpStream::connect(address(&hub.base)).expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: hub\r\n")
        .expect("half a request");
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = slow.read_to_end(&mut answer);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "dropped after {waited:?}"
    );
    assert!(
        !String::from_utf8_lossy(&answer).contains("200 OK"),
        "{answer:?}"
    );

    // A poll held for --max-wait (3 s) outlives the 1 s header and idle timeouts.
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let (status, etag, _) = get_bundle(&client, &url, &red, None).await;
    assert_eq!(status, 200);
    let etag = etag.expect("etag");
    let started = Instant::now();
    let (status, _, _) = get_bundle(&client, &format!("{url}?wait=3s"), &red, Some(&etag)).await;
    assert_eq!(status, 304);
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "the held poll ended after {:?}",
        started.elapsed()
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_with_a_request_in_flight_is_closed_when_the_hub_stops() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let hub = hub_with(ConnectionLimits::default(), state.path(), &repo).await;
    // A request whose body never comes: stopping the hub closes its connection (at
    // the latest when the shutdown's grace period of 10 s ends), even though the hub
    // runs inside this test's process, which goes on.
    let mut stuck = std::net::TcpStream::connect(address(&hub.base)).expect("connect");
    stuck
        .write_all(
            format!(
                "POST /v1/clusters/red/status HTTP/1.1\r\nHost: hub\r\n\
                 Authorization: Bearer {red}\r\nContent-Type: application/json\r\n\
                 Content-Length: 100\r\n\r\n{{\"a\""
            )
            .as_bytes(),
        )
        .expect("a request without its body");
    hub.stop().await;
    stuck
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut answer = Vec::new();
    let read = stuck.read_to_end(&mut answer);
    // Closed: an end of stream or a reset, not a read that times out.
    let closed = match &read {
        Ok(_) => true,
        Err(err) => !matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(
        closed,
        "the connection was left open after the hub stopped: {read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hub_per_state_dir_and_the_other_commands_still_work_beside_it() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let repo_arg = repo.path().display().to_string();
    let hub = Running::start_ready(config(state.path(), &repo_arg)).await;

    // A second hub in this process.
    let second = Hub::start(config(state.path(), &repo_arg)).await;
    let Err(err) = second else {
        panic!("a second hub started on the same state dir");
    };
    let message = err.to_string();
    assert!(
        message.contains("another hub is already serving")
            && message.contains(&format!("process {}", std::process::id())),
        "{message}"
    );

    // A second `flotilla serve` exits at once, naming the process in the way.
    let state_arg = state.path().display().to_string();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["serve", "--repo", &repo_arg, "--state-dir", &state_arg])
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(started.elapsed() < Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another hub is already serving")
            && stderr.contains(&std::process::id().to_string()),
        "{stderr}"
    );

    // `token` and `publish --state-dir` work beside the running hub.
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["token", "create", "red", "--state-dir", &state_arg])
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let out = tempfile::tempdir().expect("out");
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--repo", &repo_arg, "--state-dir", &state_arg])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The running hub takes the new token.
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    eventually("the new token to work", Duration::from_secs(10), || {
        let (client, url, token) = (&client, &url, &token);
        async move { (get_bundle(client, url, token, None).await.0 == 200).then_some(()) }
    })
    .await;

    // Once the first hub stops, the state dir is free again.
    hub.stop().await;
    let hub = Running::start_ready(config(state.path(), &repo_arg)).await;
    hub.stop().await;
}

/// Two hubs with state dirs of their own on one SQLite file (`--database`) would each
/// take every decision: the second is refused, naming the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hub_per_sqlite_database_given_outside_the_state_dir() {
    let repo = Repo::new();
    let repo_arg = repo.path().display().to_string();
    let shared = tempfile::tempdir().expect("database dir");
    let database_file = shared.path().join("fleet.db");
    let database: flotilla_hub::store::Database = format!("sqlite://{}", database_file.display())
        .parse()
        .expect("database url");
    let (first_state, second_state) = (
        tempfile::tempdir().expect("state dir"),
        tempfile::tempdir().expect("state dir"),
    );
    let with_database = |state: &Path| {
        let mut config = config(state, &repo_arg);
        config.database = database.clone();
        config
    };
    let hub = Running::start_ready(with_database(first_state.path())).await;
    let Err(err) = Hub::start(with_database(second_state.path())).await else {
        panic!("a second hub started on the same SQLite database");
    };
    let message = err.to_string();
    assert!(
        message.contains("another hub is already serving from the SQLite database")
            && message.contains(&database_file.display().to_string())
            && message.contains(&format!("process {}", std::process::id())),
        "{message}"
    );
    // The same file through a symlinked folder is the same database.
    let linked = tempfile::tempdir().expect("link dir");
    std::os::unix::fs::symlink(shared.path(), linked.path().join("via")).expect("symlink");
    let mut through_link = config(second_state.path(), &repo_arg);
    through_link.database = format!("sqlite://{}", linked.path().join("via/fleet.db").display())
        .parse()
        .expect("database url");
    let Err(err) = Hub::start(through_link).await else {
        panic!("a second hub started on the same SQLite database through a symlink");
    };
    assert!(
        err.to_string()
            .contains("another hub is already serving from the SQLite database"),
        "{err}"
    );
    // Once the first stops, the database is free again.
    hub.stop().await;
    let hub = Running::start_ready(with_database(second_state.path())).await;
    hub.stop().await;
}

fn objects_in(state: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state.join("objects/sha256"))
        .expect("objects")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_no_cluster_refers_to_are_collected_at_start_and_after_renders() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let repo_arg = repo.path().display().to_string();
    let red = make_token(state.path(), Some("red")).await;
    let mut hub_config = config(state.path(), &repo_arg);
    hub_config.history = 2;
    let hub = Running::start_ready(hub_config).await;
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let (_, first_etag, _) = get_bundle(&client, &url, &red, None).await;
    let first = first_etag.expect("etag").trim_matches('"').to_string();
    hub.stop().await;
    let served = objects_in(state.path());
    assert!(served.contains(&first.trim_start_matches("sha256:").to_string()));

    // What a crash between writing a render's objects and recording it leaves.
    let leftover = "0".repeat(64);
    std::fs::write(state.path().join("objects/sha256").join(&leftover), "[]").expect("write");
    let hub = Running::start_ready(config(state.path(), &repo_arg)).await;
    eventually(
        "the leftover to be collected",
        Duration::from_secs(10),
        || {
            let gone = !objects_in(state.path()).contains(&leftover);
            async move { gone.then_some(()) }
        },
    )
    .await;
    // Everything served stays.
    assert_eq!(objects_in(state.path()), served);

    // After a render: the new digest served, the old one kept in red's history, and a
    // leftover of a crash gone.
    std::fs::write(state.path().join("objects/sha256").join(&leftover), "[]").expect("write");
    let overlay = repo
        .read("overlays/demo/kuard-red.yaml")
        .replace("newTag: red", "newTag: crimson");
    repo.write("overlays/demo/kuard-red.yaml", &overlay);
    repo.commit("change red");
    let second = eventually("red's new bundle", Duration::from_secs(20), || {
        let (client, url, red, first) = (&client, hub.url("/v1/clusters/red/bundle"), &red, &first);
        async move {
            let (_, etag, _) = get_bundle(client, &url, red, None).await;
            let digest = etag?.trim_matches('"').to_string();
            (digest != *first).then_some(digest)
        }
    })
    .await;
    let objects = eventually(
        "the leftover to be collected",
        Duration::from_secs(10),
        || {
            let objects = objects_in(state.path());
            let gone = !objects.contains(&leftover);
            async move { gone.then_some(objects) }
        },
    )
    .await;
    for digest in [&first, &second] {
        assert!(
            objects.contains(&digest.trim_start_matches("sha256:").to_string()),
            "{digest} was collected although red has it in its history"
        );
    }
    let old = client
        .get(hub.url(&format!("/v1/clusters/red/bundles/{first}")))
        .bearer_auth(&red)
        .send()
        .await
        .expect("request");
    assert_eq!(old.status(), 200, "red's previous bundle is still served");
    hub.stop().await;
}

/// Waits until the hub behind `client` has rendered and answers `/readyz`.
async fn wait_ready(client: &reqwest::Client, base: &str) {
    let url = format!("{base}/readyz");
    eventually("the hub to be ready", Duration::from_secs(20), || {
        let (client, url) = (client, &url);
        async move {
            let response = client.get(url).send().await.ok()?;
            (response.status() == 200).then_some(())
        }
    })
    .await;
}

/// fleet-example served over HTTPS by a hub whose certificate a site CA signed (and
/// which, with `client_ca`, requires client certificates of that CA), with an admin
/// token, ready to answer.
struct TlsHub {
    pki: Pki,
    site_ca: TestCa,
    ca: PathBuf,
    base: String,
    admin: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), HubError>>,
    _repo: Repo,
    _state: tempfile::TempDir,
}

impl TlsHub {
    async fn start(client_ca: bool) -> TlsHub {
        let pki = Pki::new();
        let site_ca = TestCa::new("site CA");
        let ca = pki.write("ca.pem", &site_ca.cert_pem());
        let (cert, key) = pki.leaf("hub", &site_ca.server(&["127.0.0.1"]));
        let repo = Repo::new();
        let state = tempfile::tempdir().expect("state dir");
        let admin = make_token(state.path(), None).await;
        let hub = Hub::start(config(state.path(), &repo.path().display().to_string()))
            .await
            .expect("hub");
        let files = TlsFiles {
            cert,
            key,
            client_ca: client_ca.then(|| ca.clone()),
        };
        let (base, stop, task) = serve_tls(hub, files).await;
        wait_ready(&tls_client(&ca, None), &base).await;
        TlsHub {
            pki,
            site_ca,
            ca,
            base,
            admin,
            stop,
            task,
            _repo: repo,
            _state: state,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("task")
            .expect("TLS server stops cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_page_over_https_keeps_its_session_in_a_secure_cookie() {
    let hub = TlsHub::start(false).await;
    let (ca, base, admin) = (&hub.ca, &hub.base, &hub.admin);
    // Like a browser: trusts the site CA, shows redirects, speaks HTTP/2 when offered.
    let web = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(ca).expect("ca")).expect("pem"),
        )
        .build()
        .expect("client");

    let login = web
        .post(format!("{base}/ui/login"))
        .header("origin", base)
        .form(&[("token", admin.as_str())])
        .send()
        .await
        .expect("login");
    assert_eq!(
        login.version(),
        reqwest::Version::HTTP_2,
        "browsers speak HTTP/2 to an HTTPS hub: the origin check must work without a Host header"
    );
    assert_eq!(login.status(), 303, "{:?}", login.text().await);
    let set_cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie")
        .to_string();
    for part in [
        "Secure",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/ui",
        "Max-Age=",
    ] {
        assert!(set_cookie.contains(part), "{part}: {set_cookie}");
    }
    let cookie = set_cookie
        .split(';')
        .next()
        .expect("name=value")
        .to_string();

    // The session opens the pages over HTTPS; without it, the login.
    let with_session = |path: &str| {
        web.get(format!("{base}{path}"))
            .header("cookie", &cookie)
            .send()
    };
    let fleet = with_session("/ui/").await.expect("fleet page");
    assert_eq!(fleet.status(), 200);
    let body = fleet.text().await.expect("body");
    assert!(
        body.contains("<h1>Fleet</h1>") && body.contains(">red</a>"),
        "{body}"
    );
    let red = with_session("/ui/clusters/red")
        .await
        .expect("cluster page");
    assert_eq!(red.status(), 200);
    let anonymous = web.get(format!("{base}/ui/")).send().await.expect("page");
    assert_eq!(anonymous.status(), 303);

    // Logging out over HTTPS: the form token and the origin pass, the session ends.
    let csrf = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("form token")
        .to_string();
    let logout = web
        .post(format!("{base}/ui/logout"))
        .header("cookie", &cookie)
        .header("origin", base)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("logout");
    assert_eq!(logout.status(), 303);
    let cleared = logout
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("the cookie cleared")
        .to_string();
    assert!(
        cleared.contains("Max-Age=0") && cleared.contains("Secure"),
        "{cleared}"
    );
    let after = with_session("/ui/").await.expect("page");
    assert_eq!(after.status(), 303, "the old cookie opens nothing");
    hub.stop().await;
}

/// `flotilla status` with these arguments and environment; (exit code, stdout, stderr).
fn status(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("status")
        .args(args)
        .env_remove("FLOTILLA_SERVER")
        .env_remove("FLOTILLA_TOKEN_FILE")
        .env_remove("FLOTILLA_CA_FILE")
        .env_remove("FLOTILLA_CLIENT_CERT")
        .env_remove("FLOTILLA_CLIENT_KEY")
        .output()
        .expect("flotilla runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_present_a_client_certificate_to_a_hub_that_requires_one() {
    let hub = TlsHub::start(true).await;
    let (ca, base) = (hub.ca.clone(), hub.base.clone());
    let operator = hub.pki.leaf("operator", &hub.site_ca.client("ops.example"));
    let token_file = hub.pki.write("admin.token", &hub.admin);

    // `flotilla status` against `server`, with the site CA and the operator's
    // certificate or not.
    let args = |server: &str, trust: bool, present: bool| -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--server".into(),
            server.into(),
            "--token-file".into(),
            token_file.clone().into(),
        ];
        if trust {
            args.extend(["--ca-file".into(), ca.clone().into()]);
        }
        if present {
            args.extend([
                "--client-cert".into(),
                operator.0.clone().into(),
                "--client-key".into(),
                operator.1.clone().into(),
            ]);
        }
        args
    };
    let run = |args: Vec<std::ffi::OsString>| {
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
            status(&refs)
        })
    };

    // With an operator's certificate (any name the CA signed) and the admin token.
    let (code, out, err) = run(args(&base, true, true)).await.expect("runs");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("revision   main@"), "{out}");
    assert!(out.contains("clusters   "), "{out}");
    // The same through the environment.
    let output = tokio::task::spawn_blocking({
        let (base, token_file, ca, cert, key) = (
            base.clone(),
            token_file.clone(),
            ca.clone(),
            operator.0.clone(),
            operator.1.clone(),
        );
        move || {
            Command::new(env!("CARGO_BIN_EXE_flotilla"))
                .args(["status", "-o", "json"])
                .env("FLOTILLA_SERVER", base)
                .env("FLOTILLA_TOKEN_FILE", token_file)
                .env("FLOTILLA_CA_FILE", ca)
                .env("FLOTILLA_CLIENT_CERT", cert)
                .env("FLOTILLA_CLIENT_KEY", key)
                .output()
                .expect("runs")
        }
    })
    .await
    .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert!(json["clusters"].as_array().is_some_and(|c| !c.is_empty()));

    // Without a certificate the hub refuses, and says what to give.
    let (code, _, err) = run(args(&base, true, false)).await.expect("runs");
    assert_eq!(code, 2);
    assert!(err.contains("requires a client certificate"), "{err}");
    // Without the site CA the hub's certificate is not trusted.
    let (code, _, err) = run(args(&base, false, true)).await.expect("runs");
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach the hub"), "{err}");
    // A certificate for a plain-HTTP server is a mistake, said before anything is sent.
    let (code, _, err) = run(args("http://127.0.0.1:1", false, true))
        .await
        .expect("runs");
    assert_eq!(code, 2);
    assert!(
        err.contains("--client-cert needs an https:// server"),
        "{err}"
    );
    hub.stop().await;
}

/// Opens a connection to the hub and sends `head` (a request's line and headers, and
/// perhaps the first bytes of its body) without the rest of the body: a client that
/// trickles its body, or stops sending it.
async fn stalled(base: &str, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let mut stream = tokio::net::TcpStream::connect(address(base))
        .await
        .expect("connect");
    stream.write_all(head.as_bytes()).await.expect("send");
    stream
}

/// What the hub sent on `stream` until it closed it, or `None` if it was still open
/// after `within`.
async fn answer_and_close(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt as _;
    let mut answer = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut answer)).await {
        Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

/// A report's request line and headers, announcing a body of a megabyte, and its
/// first byte.
fn slow_report(cluster: &str, token: Option<&str>) -> String {
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /v1/clusters/{cluster}/status HTTP/1.1\r\nHost: hub\r\n{authorization}\
         Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{{"
    )
}

/// Issue 33, item 1: sockets announcing a large status report and sending it a byte
/// at a time held their connection slots until real agents were kept out. A report
/// without a valid token is now answered at once, before a byte of its body is read,
/// and its connection closed: three times the connection cap of them pass one after
/// the other, and an agent is served beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_report_without_a_valid_token_is_refused_before_its_body_is_read() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let blue = make_token(state.path(), Some("blue")).await;
    let admin = make_token(state.path(), None).await;
    let limits = ConnectionLimits {
        max_connections: Some(4),
        ..ConnectionLimits::default()
    };
    let hub = hub_with(limits, state.path(), &repo).await;
    let refusals = [
        (None, "401"),
        (Some("not-a-token"), "401"),
        (Some(blue.as_str()), "403"),
        (Some(admin.as_str()), "403"),
    ];
    let mut held = Vec::new();
    for (token, status) in refusals.iter().cycle().take(12) {
        let mut socket = stalled(&hub.base, &slow_report("red", *token)).await;
        let answer = answer_and_close(&mut socket, Duration::from_secs(2))
            .await
            .unwrap_or_else(|| {
                panic!("a report with token {token:?} was not refused and closed at once")
            });
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{token:?}: {answer}"
        );
        assert!(answer.contains("\"error\""), "{answer}");
        held.push(socket);
    }
    let started = Instant::now();
    let response = client()
        .get(hub.url("/v1/clusters/red/bundle"))
        .bearer_auth(&red)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .expect("an agent is served beside them");
    assert_eq!(response.status(), 200, "after {:?}", started.elapsed());
    hub.stop().await;
}

/// Issue 33, item 1: at the connection cap, connections still sending their body are
/// closed to make room, as idle ones are: a cluster's token sending reports a byte at
/// a time on every connection the hub holds does not keep another agent out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_still_sending_their_body_are_closed_at_the_cap() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let blue = make_token(state.path(), Some("blue")).await;
    let limits = ConnectionLimits {
        max_connections: Some(4),
        ..ConnectionLimits::default()
    };
    let hub = hub_with(limits, state.path(), &repo).await;
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(stalled(&hub.base, &slow_report("red", Some(&red))).await);
    }
    // Every slot holds a report being received.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let response = client()
        .get(hub.url("/v1/clusters/blue/bundle"))
        .bearer_auth(&blue)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .expect("an agent is served beside the slow reports");
    assert_eq!(response.status(), 200, "after {:?}", started.elapsed());
    // The one sending its body the longest made room.
    let answer = answer_and_close(&mut slow[0], Duration::from_secs(2)).await;
    assert!(answer.is_some(), "the oldest slow report is still open");
    hub.stop().await;
}

/// Issue 33, item 1: the webhook's HMAC covers its body, so the hub reads the body of
/// anyone who sends one. What its headers tell is refused at once, the body unread (no
/// signature, a body over the limit); at most `max_webhook_bodies` are read at once
/// (one more is turned away at once), each within `webhook_body_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_bodies_are_bounded_in_size_time_and_number() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let secret = b"a webhook secret".to_vec();
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.webhook_secret = Some(secret.clone());
    config.connections = ConnectionLimits {
        max_connections: Some(8),
        ..ConnectionLimits::default()
    };
    config.requests = RequestLimits {
        webhook_body_timeout: Duration::from_secs(1),
        max_webhook_bodies: 2,
        ..RequestLimits::default()
    };
    let hub = Running::start_ready(config).await;
    let hook = |signature: &str, length: usize| {
        format!(
            "POST /v1/hooks/git HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n\
             {signature}Content-Length: {length}\r\n\r\n{{"
        )
    };
    let signed = "X-Hub-Signature-256: sha256=00\r\n";
    for (head, status) in [
        (hook("", 1_000_000), "401"),
        (hook(signed, 5 * 1024 * 1024), "413"),
    ] {
        let mut socket = stalled(&hub.base, &head).await;
        let answer = answer_and_close(&mut socket, Duration::from_millis(1500))
            .await
            .unwrap_or_else(|| panic!("not refused at once: {head}"));
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer}"
        );
    }

    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..2 {
        slow.push(stalled(&hub.base, &hook(signed, 1_000_000)).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = stalled(&hub.base, &hook(signed, 1_000_000)).await;
    let answer = answer_and_close(&mut third, Duration::from_millis(1500))
        .await
        .expect("a third body is turned away at once");
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    for socket in &mut slow {
        let answer = answer_and_close(socket, Duration::from_secs(3))
            .await
            .expect("a body that does not come in time is cut off");
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(post_webhook(&client(), &hub, &secret).await, 202);
    hub.stop().await;
}

/// Issue 33, item 5: one cluster's token held every connection with `?wait=` polls.
/// At most `max_polls_per_cluster` polls of a cluster are held: a new one ends the
/// oldest, answered 304 as a poll whose wait ended, and another agent gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_poll_of_a_cluster_beyond_its_cap_ends_the_oldest() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let blue = make_token(state.path(), Some("blue")).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.max_wait = Duration::from_secs(30);
    config.connections = ConnectionLimits {
        max_connections: Some(6),
        ..ConnectionLimits::default()
    };
    config.requests = RequestLimits {
        max_polls_per_cluster: 2,
        ..RequestLimits::default()
    };
    let hub = Running::start_ready(config).await;
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let (status, etag, _) = get_bundle(&client, &url, &red, None).await;
    assert_eq!(status, 200);
    let etag = etag.expect("an ETag");

    let mut polls = Vec::new();
    for _ in 0..6 {
        let (client, url, red, etag) = (client.clone(), url.clone(), red.clone(), etag.clone());
        polls.push(tokio::spawn(async move {
            let (status, answered, _) =
                get_bundle(&client, &format!("{url}?wait=30s"), &red, Some(&etag)).await;
            (status, answered)
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (i, poll) in polls.iter_mut().take(4).enumerate() {
        let answer = tokio::time::timeout(Duration::from_secs(2), poll)
            .await
            .unwrap_or_else(|_| panic!("poll {i} is still held beside newer ones"))
            .expect("task");
        assert_eq!(answer, (304, Some(etag.clone())), "poll {i}");
    }
    assert!(!polls[4].is_finished() && !polls[5].is_finished());
    let response = client
        .get(hub.url("/v1/clusters/blue/bundle"))
        .bearer_auth(&blue)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .expect("another cluster's agent gets in");
    assert_eq!(response.status(), 200);
    hub.stop().await;
    for poll in polls.drain(4..) {
        assert_eq!(poll.await.expect("task").0, 304);
    }
}

/// Posts the web page's login form with `token` from `client`; the status and the
/// `Retry-After` header.
async fn log_in(client: &reqwest::Client, base: &str, token: &str) -> (u16, Option<u64>) {
    let response = client
        .post(format!("{base}/ui/login"))
        .header("Origin", base)
        .form(&[("token", token)])
        .send()
        .await
        .expect("login answered");
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (response.status().as_u16(), retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_to_the_web_page_are_throttled_per_client_and_logged_without_the_token() {
    use crate::support::process::{Background, free_port, http_status, wait_for};
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state");
    let admin = make_token(state.path(), None).await;
    let red = make_token(state.path(), Some("red")).await;
    let port = free_port();
    let log = state.path().join("hub.log");
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["serve", "--repo"])
        .arg(repo.path())
        .arg("--state-dir")
        .arg(state.path())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("the hub starts");
    let mut hub = [Background { child, log }];
    wait_for("the hub to be ready", &mut hub, || {
        http_status(port, "/readyz") == Some(200)
    });
    let base = format!("http://127.0.0.1:{port}");
    let client = |address: [u8; 4]| {
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .local_address(std::net::IpAddr::from(address))
            .build()
            .expect("client")
    };
    let (attacker, operator) = (client([127, 0, 0, 1]), client([127, 0, 0, 2]));

    // A thousand guesses as fast as one client can send them: the first ten are
    // checked and refused, the rest answered 429 with Retry-After before any token is
    // looked at (the admin token among them, too).
    let guesses: Vec<String> = (0..1000)
        .map(|n| format!("flotilla-guess-{n:04}"))
        .collect();
    let started = Instant::now();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut retry_after = None;
    for guess in &guesses {
        let (status, retry) = log_in(&attacker, &base, guess).await;
        *statuses.entry(status).or_default() += 1;
        if status == 429 {
            retry_after = retry_after.or(retry);
        }
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(
        statuses,
        [(401, 10), (429, 990)].into_iter().collect(),
        "ten refused, the rest throttled"
    );
    assert!(matches!(retry_after, Some(1..=6)), "{retry_after:?}");
    assert_eq!(log_in(&attacker, &base, &admin).await.0, 429);
    assert_eq!(log_in(&attacker, &base, &red).await.0, 429);

    // Another client is not held back: its wrong token is refused, its admin token
    // opens a session (a redirect to the page).
    assert_eq!(log_in(&operator, &base, &red).await.0, 403);
    assert_eq!(log_in(&operator, &base, &admin).await.0, 303);

    // Every failure is in the log with the client's address; no token is.
    let text = hub[0].log();
    assert_eq!(
        text.matches("failed login to the web page").count(),
        11,
        "{text}"
    );
    assert!(
        text.contains("127.0.0.1") && text.contains("127.0.0.2"),
        "{text}"
    );
    assert!(text.contains("too many failed logins"), "{text}");
    for token in [guesses[0].as_str(), guesses[999].as_str(), &admin, &red] {
        assert!(!text.contains(token), "a token in the log:\n{text}");
    }

    // Fifty guesses sent at once by a third client: each is counted as it comes,
    // before any is looked up, so no more than the ten of its bucket are looked at.
    let third = client([127, 0, 0, 3]);
    let answers = futures::future::join_all(
        guesses[..50]
            .iter()
            .map(|guess| log_in(&third, &base, guess)),
    )
    .await;
    let looked_at = answers.iter().filter(|(status, _)| *status == 401).count();
    assert_eq!(looked_at, 10, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|(status, _)| matches!(status, 401 | 429))
    );
}

/// Runs `flotilla serve` on `state` and waits up to 20 s for it to exit (it is killed
/// and the test failed if it does not): its exit code, and what it printed.
fn serve_until_it_exits(repo: &Repo, state: &Path) -> (Option<i32>, Duration, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["serve", "--listen", "127.0.0.1:0", "--repo"])
        .arg(repo.path())
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the hub starts");
    let started = Instant::now();
    while child.try_wait().expect("polls").is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().expect("SIGKILL");
            let output = child.wait_with_output().expect("reaped");
            panic!(
                "the hub was still running after 20 s: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    let output = child.wait_with_output().expect("reaped");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.code(), elapsed, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_empty_or_foreign_database_stops_the_hub_at_once_and_is_left_as_it_is() {
    use sqlx::Connection as _;
    let repo = Repo::new();
    // A real store, whose first page is then damaged past SQLite's 100-byte header.
    let genuine = tempfile::tempdir().expect("state");
    make_token(genuine.path(), None).await;
    let mut damaged = std::fs::read(genuine.path().join("flotilla.db")).expect("the store");
    assert!(damaged.len() >= 4096, "{} bytes", damaged.len());
    for byte in &mut damaged[100..4096] {
        *byte = 0xA5;
    }
    // A SQLite database of something else.
    let foreign_dir = tempfile::tempdir().expect("dir");
    let foreign_path = foreign_dir.path().join("notes.db");
    let mut connection = sqlx::SqliteConnection::connect_with(
        &sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&foreign_path)
            .create_if_missing(true),
    )
    .await
    .expect("a SQLite database");
    sqlx::query("CREATE TABLE notes (text TEXT)")
        .execute(&mut connection)
        .await
        .expect("a table");
    connection.close().await.expect("closed");
    let foreign = std::fs::read(&foreign_path).expect("the database");

    let cases: [(&str, Vec<u8>, &[&str]); 4] = [
        ("damaged", damaged, &["malformed", "not a database"]),
        ("empty", Vec::new(), &["is an empty file (0 bytes)"]),
        (
            "text",
            b"my notes\n".to_vec(),
            &["is not a SQLite database"],
        ),
        (
            "foreign",
            foreign,
            &["not a flotilla store (its tables are notes"],
        ),
    ];
    for (case, bytes, reasons) in cases {
        let state = tempfile::tempdir().expect("state");
        let db = state.path().join("flotilla.db");
        std::fs::write(&db, &bytes).expect("write");
        let (code, elapsed, output) = serve_until_it_exits(&repo, state.path());
        assert_ne!(code, Some(0), "{case}: {output}");
        assert!(
            elapsed < Duration::from_secs(10),
            "{case}: the hub took {elapsed:?} to give up: {output}"
        );
        assert!(
            reasons.iter().any(|reason| output.contains(reason)),
            "{case}: the reason is told: {output}"
        );
        assert!(!output.contains("pool timed out"), "{case}: {output}");
        if case != "damaged" {
            assert!(
                std::fs::read(&db).expect("still there") == bytes,
                "{case}: the file is left as it was"
            );
        }
    }
}
