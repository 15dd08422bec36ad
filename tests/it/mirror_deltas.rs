//! Deltas on a static mirror (`publish --deltas`): the real agent, in process, reads
//! a `flotilla publish` folder through `file://` and through a plain static HTTP
//! server (one that knows nothing of flotilla: files by path, 404 otherwise), takes a
//! change as a delta from the bundle it runs, polls the sha256 of the current
//! document while nothing changes, and takes the whole bundle again from a mirror
//! published without deltas.

use crate::support::agent as agent_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_support::*;
use flotilla_agent::AgentConfig;
use flotilla_agent::client::Server;
use flotilla_agent::wait::Wait;
use flotilla_core::bundle::{Bundle, Digest};
use flotilla_hub::publish::{Writing, publish};
use flotilla_render::RenderOutput;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

const CLUSTER: &str = "edge-1";

/// A static web server over a folder: `GET /path` is the file at `path`, anything
/// else 404; every request path is recorded, and each answer that carried a file.
/// With `etags`, as nginx does, each file has an ETag of its own (from its size and
/// content, never a flotilla digest), and a request whose `If-None-Match` names it is
/// answered 304 with no body.
struct StaticServer {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl StaticServer {
    async fn start(root: PathBuf) -> StaticServer {
        StaticServer::serving(root, false).await
    }

    async fn serving(root: PathBuf, etags: bool) -> StaticServer {
        StaticServer::answering(root, etags, false).await
    }

    /// A server that answers as a hub does: each bundle with its revision header and
    /// its digest as its ETag, and 304 to a request whose `If-None-Match` names it.
    async fn as_hub(root: PathBuf) -> StaticServer {
        StaticServer::answering(root, true, true).await
    }

    async fn answering(root: PathBuf, etags: bool, hub: bool) -> StaticServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let sent = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let root = root.clone();
                let seen = seen.clone();
                let sent = sent.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match socket.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    // As static servers do, the query (`?wait=…`) is not part of the
                    // file's path.
                    let target = head.split(' ').nth(1).unwrap_or("/");
                    let path = target.split('?').next().unwrap_or("/").to_string();
                    seen.lock().expect("lock").push(path.clone());
                    let file = path
                        .trim_start_matches('/')
                        .split('/')
                        .filter(|s| !s.is_empty() && *s != "..")
                        .fold(root, |dir, segment| dir.join(segment));
                    let asked_for = head.lines().find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("if-none-match")
                            .then(|| value.trim().to_string())
                    });
                    // As Python's http.server does, a POST (the agent's status
                    // report) is answered 501 with an HTML page.
                    if head.starts_with("POST ") {
                        let page = "<!DOCTYPE HTML>\n<html>\n<head>\n<title>Error response</title>\n</head>\n<body>\n<h1>Error response</h1>\n<p>Error code: 501</p>\n</body>\n</html>\n";
                        let answer = format!(
                            "HTTP/1.1 501 Unsupported method ('POST')\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                            page.len()
                        );
                        let _ = socket.write_all(answer.as_bytes()).await;
                        let _ = socket.shutdown().await;
                        return;
                    }
                    let answer = match std::fs::read(&file) {
                        Ok(body) => {
                            let etag = match hub.then(|| claimed(&body)).flatten() {
                                Some(digest) => format!("\"{digest}\""),
                                None => format!(
                                    "\"{:x}-{}\"",
                                    body.len(),
                                    &Digest::of(&body).hex()[..16]
                                ),
                            };
                            if etags && asked_for.as_deref() == Some(etag.as_str()) {
                                format!(
                                    "HTTP/1.1 304 Not Modified\r\nETag: {etag}\r\nConnection: close\r\n\r\n"
                                )
                                .into_bytes()
                            } else {
                                sent.lock().expect("lock").push(path.clone());
                                let mut etag = if etags {
                                    format!("ETag: {etag}\r\n")
                                } else {
                                    String::new()
                                };
                                if hub {
                                    etag.push_str("x-flotilla-revision: main@test\r\n");
                                }
                                let mut answer = format!(
                                    "HTTP/1.1 200 OK\r\n{etag}Content-Length: {}\r\nConnection: close\r\n\r\n",
                                    body.len()
                                )
                                .into_bytes();
                                answer.extend_from_slice(&body);
                                answer
                            }
                        }
                        Err(_) => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_vec(),
                    };
                    let _ = socket.write_all(&answer).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        StaticServer {
            port,
            requests,
            bodies,
            task,
        }
    }

    /// How many answers to requests for `path` carried the file.
    fn sent(&self, path: &str) -> usize {
        self.bodies
            .lock()
            .expect("lock")
            .iter()
            .filter(|p| *p == path)
            .count()
    }

    /// How many requests were for `path` (`/v1/clusters/…`).
    fn asked(&self, path: &str) -> usize {
        self.requests
            .lock()
            .expect("lock")
            .iter()
            .filter(|p| *p == path)
            .count()
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An agent of [`CLUSTER`] reading `server`.
fn start_agent(server: Server, state: &Path, target: &Path) -> RunningAgent {
    let http = matches!(server, Server::Http(_));
    let mut config = AgentConfig::new(server, CLUSTER, state.to_path_buf());
    config.wait = Wait::Fixed(Duration::from_millis(100));
    if http {
        // The agent sends a token over HTTP; a static server takes no notice.
        let token = state.join("token");
        std::fs::write(&token, format!("flt_{}\n", "0".repeat(64))).expect("writes");
        config.token_file = Some(token);
    }
    RunningAgent::start(config, target)
}

fn release(value: &str) -> Bundle {
    bundle(
        CLUSTER,
        vec![config_map("settings", value), namespace("demo")],
    )
}

fn publish_into(out: &Path, bundle: &Bundle, deltas: usize) {
    let mut output = RenderOutput {
        revision: format!("main@sha1:{}", &bundle.digest.hex()[..12]),
        ..RenderOutput::default()
    };
    output.bundles.insert(CLUSTER.to_string(), bundle.clone());
    publish(
        &output,
        out,
        Writing {
            signer: None,
            deltas,
        },
    )
    .expect("publishes");
}

/// Through `server` (reading `out`): v1 whole, v2 as a delta, v3 whole again from a
/// mirror published without deltas. `asked` counts the requests for a path, when the
/// server can tell.
async fn a_mirror_change_arrives_as_a_delta(
    server: Server,
    out: &Path,
    asked: Option<&dyn Fn(&str) -> usize>,
) {
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let v1 = release("one");
    publish_into(out, &v1, 3);
    let mut agent = start_agent(server, state.path(), target.path());
    let report = agent.applied(&v1.digest).await;
    assert!(!report.message.contains("delta"), "{}", report.message);

    let v2 = release("two");
    publish_into(out, &v2, 3);
    let report = agent.applied(&v2.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert!(
        report.message.contains("received as a delta"),
        "{}",
        report.message
    );
    let files = yaml_files(target.path());
    assert!(
        files
            .get(&config_map_file("settings"))
            .is_some_and(|text| text.contains("two")),
        "{files:?}"
    );
    let delta_path = |base: &Digest| format!("/v1/clusters/{CLUSTER}/deltas/{base}");
    let bundle_path = format!("/v1/clusters/{CLUSTER}/bundle");
    let sha256_path = format!("/v1/clusters/{CLUSTER}/deltas/current.sha256");
    if let Some(asked) = asked {
        assert!(asked(&delta_path(&v1.digest)) >= 1);
        // While nothing changes, the agent polls the sha256 of the current document
        // (72 bytes), not the bundle, nor the delta from what it runs to itself.
        let bundles = asked(&bundle_path);
        let idle = asked(&sha256_path);
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(asked(&sha256_path) > idle, "the agent polls the sha256");
        assert_eq!(asked(&bundle_path), bundles, "no whole bundle while idle");
        assert_eq!(
            asked(&delta_path(&v2.digest)),
            0,
            "no delta from what it runs while idle"
        );
    }

    // Published without deltas: every delta goes (the folder keeps only the current
    // document's sha256), and the change is fetched whole.
    let v3 = release("three");
    publish_into(out, &v3, 0);
    let left: Vec<String> = std::fs::read_dir(out.join(format!("v1/clusters/{CLUSTER}/deltas")))
        .expect("reads")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["current.sha256"]);
    let report = agent.applied(&v3.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert!(!report.message.contains("delta"), "{}", report.message);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_a_folder_takes_a_change_as_a_delta_from_publish_output() {
    let out = tempfile::tempdir().expect("tempdir");
    a_mirror_change_arrives_as_a_delta(Server::File(out.path().to_path_buf()), out.path(), None)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_a_static_web_server_takes_a_change_as_a_delta_and_polls_a_sha256_while_idle() {
    let out = tempfile::tempdir().expect("tempdir");
    let static_server = StaticServer::start(out.path().to_path_buf()).await;
    let server =
        Server::parse(&format!("http://127.0.0.1:{}", static_server.port)).expect("a server");
    let asked = |path: &str| static_server.asked(path);
    a_mirror_change_arrives_as_a_delta(server, out.path(), Some(&asked)).await;
    // The server took no report (501): the agent asked once, not with every bundle.
    assert_eq!(
        static_server.asked(&format!("/v1/clusters/{CLUSTER}/status")),
        1
    );
}

/// A mirror written before `deltas/current.sha256` existed (here: the file removed
/// after each publish) is read as before: a change comes as a delta, and while nothing
/// changes the agent polls the delta from the current bundle to itself, asking for
/// the missing sha256 once per document it takes, not at every poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_on_a_mirror_without_the_sha256_polls_its_own_delta_as_before() {
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let static_server = StaticServer::start(out.path().to_path_buf()).await;
    let server =
        Server::parse(&format!("http://127.0.0.1:{}", static_server.port)).expect("a server");
    let sha256 = out
        .path()
        .join(format!("v1/clusters/{CLUSTER}/deltas/current.sha256"));
    let publish_as_before = |bundle: &Bundle| {
        publish_into(out.path(), bundle, 3);
        std::fs::remove_file(&sha256).expect("removes the sha256");
    };
    let v1 = release("one");
    publish_as_before(&v1);
    let mut agent = start_agent(server, state.path(), target.path());
    agent.applied(&v1.digest).await;
    let v2 = release("two");
    publish_as_before(&v2);
    let report = agent.applied(&v2.digest).await;
    assert!(
        report.message.contains("received as a delta"),
        "{}",
        report.message
    );
    let own_delta = format!("/v1/clusters/{CLUSTER}/deltas/{}", v2.digest);
    let sha256_path = format!("/v1/clusters/{CLUSTER}/deltas/current.sha256");
    // The first poll after the change asks for the sha256 (404), then its own delta.
    tokio::time::timeout(Duration::from_secs(30), async {
        while static_server.asked(&own_delta) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agent polls its own delta");
    let (own, asked_sha256) = (
        static_server.asked(&own_delta),
        static_server.asked(&sha256_path),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        static_server.asked(&own_delta) > own,
        "it polls its own delta"
    );
    assert_eq!(
        static_server.asked(&sha256_path),
        asked_sha256,
        "the missing sha256 is not asked for at every poll"
    );
    agent.stop().await;
}

/// An agent restarted on a static web server that has neither the sha256 nor deltas
/// (output of an older flotilla, or a bucket that hides them) learns the server's own
/// ETag again from its first poll, so the polls after it are answered 304 with no
/// body, as before the restart, instead of the whole document each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_on_a_static_server_with_etags_polls_with_its_etag_again() {
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let static_server = StaticServer::serving(out.path().to_path_buf(), true).await;
    let server =
        Server::parse(&format!("http://127.0.0.1:{}", static_server.port)).expect("a server");
    let v1 = release("one");
    publish_into(out.path(), &v1, 0);
    let sha256 = out
        .path()
        .join(format!("v1/clusters/{CLUSTER}/deltas/current.sha256"));
    let _ = std::fs::remove_file(&sha256);
    let bundle_path = format!("/v1/clusters/{CLUSTER}/bundle");
    // Polls (one each 100 ms) until the server has been asked for the bundle `more`
    // times more than `since`.
    let polls = |since: usize, more: usize| {
        let static_server = &static_server;
        let bundle_path = bundle_path.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                while static_server.asked(&bundle_path) < since + more {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("the agent polls the bundle");
        }
    };
    let mut agent = start_agent(server.clone(), state.path(), target.path());
    agent.applied(&v1.digest).await;
    polls(static_server.asked(&bundle_path), 5).await;
    assert_eq!(static_server.sent(&bundle_path), 1, "304s while it runs");
    agent.stop().await;

    let mut agent = start_agent(server, state.path(), target.path());
    polls(static_server.asked(&bundle_path), 6).await;
    assert_eq!(
        static_server.sent(&bundle_path),
        2,
        "after the restart, one answer with the document (which gives the ETag), then 304s"
    );
    // A change still comes.
    let v2 = release("two");
    publish_into(out.path(), &v2, 0);
    let _ = std::fs::remove_file(&sha256);
    let report = agent.applied(&v2.digest).await;
    assert!(report.is_success(), "{report:?}");
    agent.stop().await;
}

/// An agent restarted with `--trust-key` on a folder (without deltas) that still holds
/// the unsigned document it runs judges that document again, and reports that it
/// refuses it, rather than taking the folder's sha256 for "nothing changed"; nor
/// does it apply the stored bundle at boot under flags that refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_with_a_trusted_key_judges_the_folders_document_again() {
    use flotilla_core::signing::{SigningKey, TrustedKeys};
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let v1 = release("one");
    // Without deltas: a delta from the document to itself is not judged again.
    publish_into(out.path(), &v1, 0);
    let server = Server::File(out.path().to_path_buf());
    let mut agent = start_agent(server.clone(), state.path(), target.path());
    agent.applied(&v1.digest).await;
    agent.stop().await;
    // What the boot apply of the stored bundle would write again.
    for name in yaml_names(target.path()) {
        std::fs::remove_file(target.path().join(name)).expect("removes");
    }

    let mut config = AgentConfig::new(server, CLUSTER, state.path().to_path_buf());
    config.wait = Wait::Fixed(Duration::from_millis(100));
    config.trusted = TrustedKeys::new(vec![SigningKey::from_seed([7; 32]).public_key()]);
    let mut agent = RunningAgent::start(config, target.path());
    let report = agent
        .until("the refusal of the unsigned document", |r| {
            r.message.contains("refused the bundle")
        })
        .await;
    assert_eq!(report.attempted.as_ref(), Some(&v1.digest), "{report:?}");
    assert!(report.message.contains("signed"), "{}", report.message);
    // Nor was it applied again at boot, under flags that refuse it.
    assert!(
        yaml_names(target.path()).is_empty(),
        "{:?}",
        yaml_names(target.path())
    );
    // The same bundle, signed now with the trusted key: taken and applied, though
    // its digest is the one refused.
    let mut output = RenderOutput {
        revision: "main@sha1:signed".into(),
        ..RenderOutput::default()
    };
    output.bundles.insert(CLUSTER.to_string(), v1.clone());
    let key = SigningKey::from_seed([7; 32]);
    publish(
        &output,
        out.path(),
        Writing {
            signer: Some(&key),
            deltas: 0,
        },
    )
    .expect("publishes");
    let report = agent
        .until("the signed bundle applied", |r| {
            r.applied.as_ref() == Some(&v1.digest) && !r.message.contains("refused")
        })
        .await;
    assert!(report.is_success(), "{report:?}");
    assert!(!yaml_names(target.path()).is_empty());
    agent.stop().await;
}

/// An agent restarted with trust flags that refuse its stored bundle (its key was
/// dropped) still holds that bundle's sequence: a genuine document signed before it,
/// which whoever writes the mirror could replay, is refused, and one signed after it
/// is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_stored_bundle_is_refused_at_boot_still_refuses_older_sequences() {
    use flotilla_core::signing::SigningKey;
    let (old_key, new_key) = (
        SigningKey::from_seed([5; 32]),
        SigningKey::from_seed([7; 32]),
    );
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let plant = |bundle: &Bundle, key: &SigningKey, sequence: u64| {
        plant_signed(out.path(), bundle, key, sequence);
    };
    let config = |keys: Vec<_>| trusting(out.path(), state.path(), keys);
    let (v1, v2, v3) = (release("one"), release("two"), release("three"));
    plant(&v2, &old_key, 5_000);
    let mut agent = RunningAgent::start(config(vec![old_key.public_key()]), target.path());
    agent.applied(&v2.digest).await;
    agent.stop().await;

    // The old key dropped: the stored bundle is refused at boot; an older one, signed
    // with the key still trusted, is refused too.
    plant(&v1, &new_key, 2_000);
    let mut agent = RunningAgent::start(config(vec![new_key.public_key()]), target.path());
    refused_as_older(&mut agent, &v1, 5_000).await;
    // A newer one is taken.
    plant(&v3, &new_key, 6_000);
    let report = agent.applied(&v3.digest).await;
    assert!(report.is_success(), "{report:?}");
    agent.stop().await;
}

/// Waits for `agent` to refuse `older` as older than the sequence `held`.
async fn refused_as_older(agent: &mut RunningAgent, older: &Bundle, held: u64) {
    let report = agent
        .until("the refusal of the older document", |r| {
            r.attempted.as_ref() == Some(&older.digest) && r.message.contains("refused the bundle")
        })
        .await;
    assert!(
        report.message.contains(&held.to_string()),
        "{}",
        report.message
    );
    assert_ne!(report.applied.as_ref(), Some(&older.digest), "{report:?}");
}

/// Writes `bundle` signed by `key` with `sequence` as the mirror's current document.
fn plant_signed(
    out: &Path,
    bundle: &Bundle,
    key: &flotilla_core::signing::SigningKey,
    sequence: u64,
) {
    let folder = out.join(format!("v1/clusters/{CLUSTER}"));
    std::fs::create_dir_all(&folder).expect("creates");
    let revision = format!("main@sha1:{}", &bundle.digest.hex()[..12]);
    let signature = key.sign(CLUSTER, &bundle.digest, &revision, sequence);
    let document = flotilla_core::signing::signed_document_bytes(
        CLUSTER,
        &bundle.digest,
        &revision,
        &bundle.canonical_body(),
        Some(&signature),
    );
    std::fs::write(folder.join("bundle"), document).expect("writes");
}

/// An agent of the folder `out` trusting `keys`.
fn trusting(out: &Path, state: &Path, keys: Vec<flotilla_core::signing::PublicKey>) -> AgentConfig {
    let mut config = AgentConfig::new(
        Server::File(out.to_path_buf()),
        CLUSTER,
        state.to_path_buf(),
    );
    config.wait = Wait::Fixed(Duration::from_millis(100));
    config.trusted = flotilla_core::signing::TrustedKeys::new(keys);
    config
}

/// The sequence held is kept beside the bundle: an agent whose stored bundle was
/// damaged (and set aside at its start) still refuses an older signed document a
/// mirror replays, and takes a newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_stored_bundle_was_damaged_still_refuses_older_sequences() {
    let key = flotilla_core::signing::SigningKey::from_seed([5; 32]);
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let (v1, v2, v3) = (release("one"), release("two"), release("three"));
    plant_signed(out.path(), &v2, &key, 5_000);
    let config = || trusting(out.path(), state.path(), vec![key.public_key()]);
    let mut agent = RunningAgent::start(config(), target.path());
    agent.applied(&v2.digest).await;
    agent.stop().await;

    // The disk damages the stored bundle; the mirror now offers the older v1.
    let stored = state.path().join("bundle.json");
    let bytes = std::fs::read(&stored).expect("the stored bundle");
    std::fs::write(&stored, &bytes[..bytes.len() / 2]).expect("damages it");
    plant_signed(out.path(), &v1, &key, 2_000);
    let mut agent = RunningAgent::start(config(), target.path());
    refused_as_older(&mut agent, &v1, 5_000).await;
    plant_signed(out.path(), &v3, &key, 6_000);
    let report = agent.applied(&v3.digest).await;
    assert!(report.is_success(), "{report:?}");
    agent.stop().await;
    assert!(state.path().join("held.json").exists());

    // Without --trust-key no sequence is held: the kept one goes with the next bundle
    // taken, so it cannot come back at a later start with keys.
    let v4 = release("four");
    publish_into(out.path(), &v4, 0);
    let mut agent = RunningAgent::start(
        trusting(out.path(), state.path(), Vec::new()),
        target.path(),
    );
    agent.applied(&v4.digest).await;
    agent.stop().await;
    assert!(!state.path().join("held.json").exists());
}

/// An agent that holds the mirror's current document, from its first poll after
/// taking it and after a restart, reads the mirror's `deltas/current.sha256` and
/// nothing else: it never rebuilds the delta from that document to itself (which
/// would cost it a second copy of the document in memory). The planted delta here is not one; an
/// agent that read it would say, with the next bundle, that a delta had failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_holds_the_mirrors_document_reads_its_sha256_not_its_own_delta() {
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let v1 = release("one");
    publish_into(out.path(), &v1, 3);
    let own_delta = out
        .path()
        .join(format!("v1/clusters/{CLUSTER}/deltas/{}", v1.digest));
    assert!(own_delta.is_file(), "publish writes the delta to itself");
    std::fs::write(&own_delta, b"not a delta").expect("plants");
    let server = Server::File(out.path().to_path_buf());
    let mut agent = start_agent(server.clone(), state.path(), target.path());
    agent.applied(&v1.digest).await;
    // Several polls (one each 100 ms), then again after a restart.
    tokio::time::sleep(Duration::from_millis(600)).await;
    agent.stop().await;
    let mut agent = start_agent(server, state.path(), target.path());
    tokio::time::sleep(Duration::from_millis(600)).await;

    let v2 = release("two");
    publish_into(out.path(), &v2, 0);
    let report = agent.applied(&v2.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert!(!report.message.contains("delta"), "{}", report.message);
    agent.stop().await;
}

/// What an agent on a mirror downloads for one changed field of a 2 MB bundle, and
/// for a poll while nothing changes.
#[test]
fn a_mirror_delta_of_one_changed_field_in_two_megabytes_is_small() {
    let out = tempfile::tempdir().expect("tempdir");
    let base = crate::bundle_deltas::large(200, false);
    let target = crate::bundle_deltas::large(200, true);
    let publish_one = |bundle: &Bundle| {
        let mut output = RenderOutput {
            revision: "main@sha1:0123456789ab".into(),
            ..RenderOutput::default()
        };
        output
            .bundles
            .insert(bundle.cluster.clone(), bundle.clone());
        publish(
            &output,
            out.path(),
            Writing {
                signer: None,
                deltas: 3,
            },
        )
        .expect("publishes");
    };
    publish_one(&base);
    publish_one(&target);
    let folder = out.path().join("v1/clusters").join(&target.cluster);
    let size = |name: &str| std::fs::metadata(folder.join(name)).expect("written").len();
    let whole = size("bundle");
    let change = size(&format!("deltas/{}", base.digest));
    let idle = size(&format!("deltas/{}", target.digest));
    println!(
        "a 2 MB bundle on a mirror: {whole} bytes whole, {change} for one changed field, {idle} while unchanged"
    );
    assert!(whole > 2_000_000, "{whole}");
    assert!(change < 2_500, "{change} bytes for one changed field");
    assert!(idle < 1_000, "{idle} bytes while nothing changes");
}

/// A mirror put back to the very document it held before a change that came as a
/// delta (a backup restored, or the same unsigned output published again) is taken
/// again: the agent compares a whole document with the one it last took, rebuilt
/// from a delta, not with the one it last fetched whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_put_back_after_a_delta_is_taken_again() {
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let document = out.path().join(format!("v1/clusters/{CLUSTER}/bundle"));
    let v1 = release("one");
    publish_into(out.path(), &v1, 3);
    let v1_document = std::fs::read(&document).expect("published");
    let mut agent = start_agent(
        Server::File(out.path().to_path_buf()),
        state.path(),
        target.path(),
    );
    agent.applied(&v1.digest).await;

    let v2 = release("two");
    publish_into(out.path(), &v2, 3);
    let report = agent.applied(&v2.digest).await;
    assert!(
        report.message.contains("received as a delta"),
        "{}",
        report.message
    );

    publish_into(out.path(), &v1, 0);
    assert_eq!(
        std::fs::read(&document).expect("published"),
        v1_document,
        "the mirror holds the first document again, byte for byte"
    );
    let report = agent.applied(&v1.digest).await;
    assert!(report.is_success(), "{report:?}");
    let files = yaml_files(target.path());
    assert!(
        files
            .get(&config_map_file("settings"))
            .is_some_and(|text| text.contains("one")),
        "{files:?}"
    );
    agent.stop().await;
}

/// A bundle from a mirror that the agent could not store (its state folder would not
/// take the file) is taken once the folder takes it again, though the mirror still
/// holds the same bytes: a document the agent did not keep is not "not modified".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_bundle_the_agent_could_not_store_is_taken_once_it_can() {
    let out = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let v1 = release("one");
    publish_into(out.path(), &v1, 0);
    let mut agent = start_agent(
        Server::File(out.path().to_path_buf()),
        state.path(),
        target.path(),
    );
    agent.applied(&v1.digest).await;

    // A folder where the stored bundle goes: writing it fails, even as root.
    let stored = state.path().join("bundle.json");
    std::fs::remove_file(&stored).expect("the stored bundle");
    std::fs::create_dir(&stored).expect("a folder in its place");
    let v2 = release("two");
    publish_into(out.path(), &v2, 0);
    let report = agent
        .until("the bundle it cannot store", |r| {
            r.message.contains("cannot store it as last-known-good")
        })
        .await;
    assert_eq!(report.applied.as_ref(), Some(&v1.digest), "{report:?}");

    std::fs::remove_dir(&stored).expect("the folder goes");
    let report = agent.applied(&v2.digest).await;
    assert!(report.is_success(), "{report:?}");
    agent.stop().await;
}

/// A folder refreshed from a new publish without deleting the old one's files (`cp
/// -r`, `rsync` without `--delete`) keeps the delta from the bundle the agent runs to
/// itself; its `current.sha256` names the new document. The stale delta gives the
/// agent's bundle back unchanged: the agent takes the new document whole instead of
/// staying on what it runs for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_left_from_an_older_publish_does_not_hide_the_new_document() {
    let copy_over = |from: &Path, to: &Path| crate::support::hub::copy_tree(from, to, &[]);
    let (first, second, stick) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let v1 = release("one");
    publish_into(first.path(), &v1, 3);
    copy_over(first.path(), stick.path());
    let mut agent = start_agent(
        Server::File(stick.path().to_path_buf()),
        state.path(),
        target.path(),
    );
    agent.applied(&v1.digest).await;
    // A fresh publish elsewhere knows nothing of v1: its deltas are only its own.
    let v2 = release("two");
    publish_into(second.path(), &v2, 3);
    copy_over(second.path(), stick.path());
    assert!(
        stick
            .path()
            .join(format!("v1/clusters/{CLUSTER}/deltas/{}", v1.digest))
            .exists(),
        "the stale delta is on the stick"
    );
    let report = agent.applied(&v2.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert!(
        report
            .message
            .contains("a delta file left from an older publish"),
        "{}",
        report.message
    );
    agent.stop().await;
}

/// What the refusal tests start from: a key, the mirror's folder (holding `v2`
/// signed with sequence 5,000), the agent's state and target folders, and the two
/// bundles `v1` and `v2`.
fn refusal() -> (
    flotilla_core::signing::SigningKey,
    tempfile::TempDir,
    tempfile::TempDir,
    tempfile::TempDir,
    Bundle,
    Bundle,
) {
    let key = flotilla_core::signing::SigningKey::from_seed([5; 32]);
    let out = tempfile::tempdir().expect("tempdir");
    let (v1, v2) = (release("one"), release("two"));
    plant_signed(out.path(), &v2, &key, 5_000);
    let state = tempfile::tempdir().expect("tempdir");
    (
        key,
        out,
        state,
        tempfile::tempdir().expect("tempdir"),
        v1,
        v2,
    )
}

/// After a refused replay, the mirror offers the bundle the agent runs again, signed
/// anew with a higher sequence: the report stops naming the refused bundle (it did
/// until the next change of digest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bundle_held_offered_again_clears_an_earlier_refusal() {
    let (key, out, state, target, v1, v2) = refusal();
    let config = trusting(out.path(), state.path(), vec![key.public_key()]);
    let mut agent = RunningAgent::start(config, target.path());
    agent.applied(&v2.digest).await;
    plant_signed(out.path(), &v1, &key, 2_000);
    refused_as_older(&mut agent, &v1, 5_000).await;
    plant_signed(out.path(), &v2, &key, 7_000);
    refusal_cleared(&mut agent, &v2).await;
    agent.stop().await;
}

/// Waits for the report that the agent runs `held` again and names no refusal.
async fn refusal_cleared(agent: &mut RunningAgent, held: &Bundle) {
    let report = agent
        .until("the refusal cleared", |r| {
            r.attempted.as_ref() == Some(&held.digest) && r.applied.as_ref() == Some(&held.digest)
        })
        .await;
    assert!(!report.message.contains("refused"), "{}", report.message);
}

/// The digest a bundle document names (its `digest` field).
fn claimed(document: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(document).ok()?;
    value.get("digest")?.as_str().map(str::to_string)
}

/// A hub that keeps offering a bundle the agent refused (answered 200 with it, the
/// agent asking with its own bundle's ETag) leaves the refusal standing; once the hub
/// serves the bundle the agent holds again, its 304 clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hubs_304_for_the_bundle_held_clears_an_earlier_refusal_and_nothing_else_does() {
    let (key, out, state, target, v1, v2) = refusal();
    let server = StaticServer::as_hub(out.path().to_path_buf()).await;
    let mut config = trusting(out.path(), state.path(), vec![key.public_key()]);
    config.server = Server::Http(
        format!("http://127.0.0.1:{}", server.port)
            .parse()
            .expect("a URL"),
    );
    let token = state.path().join("token");
    std::fs::write(&token, format!("flt_{}\n", "0".repeat(64))).expect("writes");
    config.token_file = Some(token);
    let mut agent = RunningAgent::start(config, target.path());
    agent.applied(&v2.digest).await;
    plant_signed(out.path(), &v1, &key, 2_000);
    refused_as_older(&mut agent, &v1, 5_000).await;
    // Polls go on (every 100 ms) and the hub answers each with the refused bundle.
    let bundle = format!("/v1/clusters/{CLUSTER}/bundle");
    let sent = server.sent(&bundle);
    tokio::time::timeout(Duration::from_secs(30), async {
        while server.sent(&bundle) < sent + 5 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the agent polls on");
    let report = agent.reports.borrow().clone().expect("a report");
    assert!(
        report.attempted.as_ref() == Some(&v1.digest) && report.message.contains("refused"),
        "the refusal stands while the hub offers the refused bundle: {report:?}"
    );
    plant_signed(out.path(), &v2, &key, 5_000);
    refusal_cleared(&mut agent, &v2).await;
    agent.stop().await;
    server.task.abort();
}
