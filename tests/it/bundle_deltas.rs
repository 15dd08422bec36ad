//! Delta bundles (RFC 9842 `dcz`): the hub's encoder and the agent's decoder agree
//! byte for byte, the real hub sends a changed bundle as a delta to the real agent,
//! and every doubt (an unknown base, a broken delta) ends in the full document.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_agent::AgentConfig;
use flotilla_agent::backoff::BackoffPolicy;
use flotilla_agent::client::Server;
use flotilla_agent::wait::Wait;
use flotilla_core::bundle::{Bundle, Digest, verify_document_parts};
use flotilla_core::dcz;
use flotilla_core::signing::{SigningKey, TrustedKeys};
use proptest::prelude::*;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::support::agent::{RunningAgent, bundle, config_map};
use crate::support::hub::{self as hub_support, Repo, Running, client, eventually, make_token};

/// Where the agent keeps its last-known-good document, in its state folder.
const STORED: &str = "bundle.json";
const REVISION: &str = "main@sha1:0123456789abcdef0123456789abcdef01234567";

/// Encodes `target`'s document against `base` as the hub does and rebuilds it as the
/// agent does; the rebuilt document must be the target's, byte for byte.
fn round_trip(base: &Bundle, target: &Bundle) {
    let dictionary = base.canonical_body();
    assert_eq!(Digest::of(&dictionary), base.digest);
    let document = target.document(REVISION);
    let delta = flotilla_hub::delta::encode(&dictionary, &document).expect("encodes");
    let rebuilt =
        flotilla_agent::delta::decode(&delta, Some(&base.digest), &dictionary).expect("decodes");
    assert!(rebuilt == document, "the rebuilt document differs");
    let verified = verify_document_parts(&rebuilt, Some("edge")).expect("verifies");
    assert_eq!(verified.bundle.digest, target.digest);
}

fn config_maps(entries: &BTreeMap<String, String>) -> Bundle {
    bundle(
        "edge",
        entries
            .iter()
            .map(|(name, value)| config_map(name, value))
            .collect(),
    )
}

/// A change to a bundle: one value changed, resources added, resources removed.
#[derive(Debug, Clone)]
enum Edit {
    Change(usize, String),
    Add(String, String),
    Remove(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), "[ -~]{0,40}").prop_map(|(i, v)| Edit::Change(i, v)),
        ("[a-z][a-z0-9-]{0,20}", "[ -~]{0,200}").prop_map(|(n, v)| Edit::Add(n, v)),
        any::<usize>().prop_map(Edit::Remove),
    ]
}

fn apply(entries: &mut BTreeMap<String, String>, edit: &Edit) {
    let names: Vec<String> = entries.keys().cloned().collect();
    match edit {
        Edit::Change(i, value) if !names.is_empty() => {
            entries.insert(names[i % names.len()].clone(), value.clone());
        }
        Edit::Add(name, value) => {
            entries.insert(name.clone(), value.clone());
        }
        Edit::Remove(i) if !names.is_empty() => {
            entries.remove(&names[i % names.len()]);
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn a_delta_rebuilds_the_target_document_byte_for_byte(
        entries in prop::collection::btree_map("[a-z][a-z0-9-]{0,20}", "[ -~]{0,300}", 0..40),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let base = config_maps(&entries);
        let mut changed = entries.clone();
        for edit in &edits {
            apply(&mut changed, edit);
        }
        round_trip(&base, &config_maps(&changed));
    }
}

/// `count` ConfigMaps of 10,000 characters of hexadecimal text each: 200 make about
/// 2 MB, what the benchmark measures too.
pub(crate) fn large(count: u64, changed: bool) -> Bundle {
    let values = (0..count)
        .map(|i| {
            let text: String = (0..1250u64)
                .map(|j| {
                    format!(
                        "{:08x}",
                        (i * 1250 + j).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32
                    )
                })
                .collect();
            let text = if changed && i == 100 {
                format!("changed-{}", &text[8..])
            } else {
                text
            };
            config_map(&format!("config-{i:03}"), &text)
        })
        .collect();
    bundle("edge", values)
}

#[test]
fn one_changed_field_in_a_large_bundle_is_a_small_delta() {
    let base = large(200, false);
    let target = large(200, true);
    round_trip(&base, &target);
    let document = target.document(REVISION);
    assert!(document.len() > 2_000_000, "{}", document.len());
    let delta = flotilla_hub::delta::encode(&base.canonical_body(), &document).expect("encodes");
    assert!(delta.len() < 2_500, "{} bytes", delta.len());
}

/// The 2 MB bundle above with 100 Deployments beside it, each running `image`.
fn with_deployments(image: &str) -> Bundle {
    let mut values: Vec<Value> = large(200, false)
        .resources
        .iter()
        .map(|r| r.value())
        .collect();
    for i in 0..100 {
        values.push(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("app-{i:03}"), "namespace": "shop"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": format!("app-{i:03}")}},
                "template": {"metadata": {"labels": {"app": format!("app-{i:03}")}},
                    "spec": {"containers": [{"name": "app", "image": image,
                        "ports": [{"containerPort": 8080}]}]}}}
        }));
    }
    bundle("edge", values)
}

/// A fleet-wide image bump: every one of 100 Deployments in a bundle of over 2 MB
/// moves to a new tag.
#[test]
fn an_image_bump_in_every_deployment_of_a_large_bundle_is_a_small_delta() {
    let base = with_deployments("registry.example/shop/app:1.4.2");
    let target = with_deployments("registry.example/shop/app:1.4.3");
    round_trip(&base, &target);
    let document = target.document(REVISION);
    assert!(document.len() > 2_000_000, "{}", document.len());
    let delta = flotilla_hub::delta::encode(&base.canonical_body(), &document).expect("encodes");
    println!(
        "an image bump in 100 Deployments of a {} byte bundle: a {} byte delta",
        document.len(),
        delta.len()
    );
    assert!(delta.len() < 5_000, "{} bytes", delta.len());
}

#[test]
fn a_ten_megabyte_bundle_with_resources_added_and_removed_round_trips() {
    let base = large(1000, false);
    let mut values: Vec<Value> = large(1000, true)
        .resources
        .iter()
        .map(|r| r.value())
        .collect();
    values.remove(500);
    values.push(config_map("zz-added", "a new one"));
    let target = bundle("edge", values);
    assert!(base.canonical_body().len() > 10_000_000);
    round_trip(&base, &target);
}

#[test]
fn a_delta_against_another_base_or_broken_is_refused() {
    let base = config_maps(&BTreeMap::from([("a".into(), "one".into())]));
    let target = config_maps(&BTreeMap::from([("a".into(), "two".into())]));
    let dictionary = base.canonical_body();
    let delta =
        flotilla_hub::delta::encode(&dictionary, &target.document(REVISION)).expect("encodes");
    let decode = |delta: &[u8], runs: &Digest, dictionary: &[u8]| {
        flotilla_agent::delta::decode(delta, Some(runs), dictionary)
    };
    assert!(matches!(
        decode(&delta, &target.digest, &dictionary),
        Err(flotilla_agent::delta::DeltaError::OtherBase { .. })
    ));
    assert!(matches!(
        decode(&delta, &base.digest, b"[]"),
        Err(flotilla_agent::delta::DeltaError::NoBase(_))
    ));
    let mut broken = delta.clone();
    let last = broken.len() - 1;
    broken[last] ^= 0xff;
    broken.truncate(broken.len() - 3);
    assert!(decode(&broken, &base.digest, &dictionary).is_err());
    assert!(decode(&delta[..20], &base.digest, &dictionary).is_err());
}

/// The cluster of the example repository these tests serve.
const CLUSTER: &str = "blue";

/// Sets the kuard Deployment's replicas, which changes blue's bundle.
fn set_replicas(repo: &Repo, replicas: u32) {
    let path = "workloads/kuard/manifests/deployment.yaml";
    let text = repo.read(path);
    let changed: Vec<String> = text
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("replicas:") {
                format!("  replicas: {replicas}")
            } else {
                line.to_string()
            }
        })
        .collect();
    repo.write(path, &(changed.join("\n") + "\n"));
}

/// An agent of [`CLUSTER`] polling `base` with `token`, its state and manifests in
/// `dir`, retrying fast.
fn start_agent(
    dir: &Path,
    base: &str,
    token: &str,
    wait: Duration,
    trusted: Option<TrustedKeys>,
) -> RunningAgent {
    let token_file = dir.join("token");
    std::fs::write(&token_file, token).expect("writes token");
    let state: PathBuf = dir.join("state");
    let mut config = AgentConfig::new(Server::parse(base).expect("URL"), CLUSTER, state);
    config.token_file = Some(token_file);
    config.backoff = BackoffPolicy {
        base: Duration::from_millis(50),
        cap: Duration::from_millis(300),
        auth_retry: Duration::from_millis(300),
    };
    config.wait = Wait::Fixed(wait);
    if let Some(trusted) = trusted {
        config.trusted = trusted;
    }
    RunningAgent::start(config, &dir.join("manifests"))
}

fn rendered(repo: &Repo) -> Bundle {
    let snapshot = flotilla_hub::source::from_folder(repo.path(), "").expect("reads");
    let output = flotilla_render::render(&snapshot);
    output.bundles.get(CLUSTER).expect("blue").clone()
}

/// A hub serving `repo` from a state dir of its own, with a token of [`CLUSTER`].
async fn hub_of(repo: &Repo) -> (Running, tempfile::TempDir, String) {
    let hub_state = tempfile::tempdir().expect("tempdir");
    let token = make_token(hub_state.path(), Some(CLUSTER)).await;
    let hub = Running::start_ready(hub_support::config(
        hub_state.path(),
        &repo.path().display().to_string(),
    ))
    .await;
    (hub, hub_state, token)
}

/// A request of [`CLUSTER`]'s agent (`token`) that takes `dcz` and names `base` as
/// the dictionary it holds.
fn asking_for_delta(
    request: reqwest::RequestBuilder,
    token: &str,
    base: &Digest,
) -> reqwest::RequestBuilder {
    request
        .bearer_auth(token)
        .header("accept-encoding", "dcz")
        .header(
            dcz::AVAILABLE_DICTIONARY,
            dcz::available_dictionary(base).expect("value"),
        )
}

/// Waits until the hub holds a long-poll.
async fn poll_held(hub: &Running) {
    eventually("a held poll", Duration::from_secs(10), || async {
        let held = hub_support::metric(&client(), &hub.base, "flotilla_long_polls_held").await;
        (held >= 1.0).then_some(())
    })
    .await;
}

/// The digest of the document a `dcz` body from `base` rebuilds into, verified as the
/// agent verifies a full document.
fn rebuilt_digest(body: &[u8], base: &Bundle) -> Digest {
    let rebuilt = flotilla_agent::delta::decode(body, Some(&base.digest), &base.canonical_body())
        .expect("rebuilds");
    verify_document_parts(&rebuilt, Some(CLUSTER))
        .expect("verifies")
        .bundle
        .digest
}

async fn deltas_sent(base: &str) -> (f64, f64, f64) {
    let client = client();
    (
        hub_support::metric(
            &client,
            base,
            "flotilla_bundle_deltas_total{result=\"hit\"}",
        )
        .await,
        hub_support::metric(
            &client,
            base,
            "flotilla_bundle_deltas_total{result=\"miss\"}",
        )
        .await,
        hub_support::metric(
            &client,
            base,
            "flotilla_bundle_bytes_sent_total{encoding=\"dcz\"}",
        )
        .await,
    )
}

#[tokio::test]
async fn a_commit_that_changes_one_field_reaches_the_agent_as_a_delta() {
    one_field_as_a_delta(false).await;
}

/// With `--trust-key`, the rebuilt document's signature (and sequence) is checked as
/// a full document's.
#[tokio::test]
async fn a_signed_delta_reaches_an_agent_that_trusts_the_key() {
    one_field_as_a_delta(true).await;
}

async fn one_field_as_a_delta(signed: bool) {
    let repo = Repo::new();
    let hub_state = tempfile::tempdir().expect("tempdir");
    let token = make_token(hub_state.path(), Some(CLUSTER)).await;
    let mut hub_config = hub_support::config(hub_state.path(), &repo.path().display().to_string());
    let mut trusted = None;
    if signed {
        let key = SigningKey::from_seed([7; 32]);
        trusted = Some(TrustedKeys::new(vec![key.public_key()]));
        hub_config.signing_key = Some(Arc::new(key));
    }
    let hub = Running::start_ready(hub_config).await;
    let site = tempfile::tempdir().expect("tempdir");
    let mut agent = start_agent(
        site.path(),
        &hub.base,
        &token,
        Duration::from_secs(30),
        trusted,
    );
    let first = rendered(&repo);
    let report = agent.applied(&first.digest).await;
    assert!(!report.message.contains("delta"), "{}", report.message);
    assert_eq!(deltas_sent(&hub.base).await, (0.0, 0.0, 0.0));

    // The agent's next poll is held with what it runs as the dictionary.
    poll_held(&hub).await;
    set_replicas(&repo, 3);
    repo.commit("kuard: three replicas");
    let second = rendered(&repo);
    assert_ne!(second.digest, first.digest);
    let report = agent.applied(&second.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert!(
        report.message.contains("received as a delta"),
        "{}",
        report.message
    );
    let (hits, misses, bytes) = deltas_sent(&hub.base).await;
    assert_eq!((hits, misses), (1.0, 0.0));
    assert!(bytes > 0.0 && bytes < 1_000.0, "{bytes} bytes of delta");
    // The same bytes, counted for the cluster, beside its first bundle in full.
    let for_cluster = |kind: &'static str| {
        let base = hub.base.clone();
        async move {
            hub_support::metric(
                &client(),
                &base,
                &format!("flotilla_cluster_bundle_bytes_sent_total{{cluster=\"{CLUSTER}\",kind=\"{kind}\"}}"),
            )
            .await
        }
    };
    assert_eq!(for_cluster("delta").await, bytes);
    let full = for_cluster("full").await;
    assert!(full > bytes, "{full} bytes in full, {bytes} as a delta");
    let deployment = std::fs::read_dir(site.path().join("manifests"))
        .expect("manifests")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .find(|text| text.contains("kind: Deployment"))
        .expect("the Deployment's file");
    assert!(deployment.contains("replicas: 3"), "{deployment}");

    agent.stop().await;

    // A request of its own: a base the hub never served is answered in full; the
    // base the cluster ran gets the full document first (the delta is being made),
    // then the delta, which rebuilds into exactly the full document.
    let bundle_url = hub.url(&format!("/v1/clusters/{CLUSTER}/bundle"));
    let ask = |base: Digest| {
        let (client, url, token) = (client(), bundle_url.clone(), token.clone());
        async move {
            let response = asking_for_delta(client.get(url), &token, &base)
                .send()
                .await
                .expect("GET");
            assert_eq!(response.status(), 200);
            let headers: HeaderMap = response.headers().clone();
            (headers, response.bytes().await.expect("body").to_vec())
        }
    };
    let (full_headers, full) = ask(Digest::of(b"never served")).await;
    assert!(full_headers.get("content-encoding").is_none());
    assert_eq!(
        verify_document_parts(&full, Some(CLUSTER))
            .expect("verifies")
            .bundle
            .digest,
        second.digest
    );
    let delta = eventually(
        "a delta from the first digest",
        Duration::from_secs(10),
        || {
            let ask = ask(first.digest.clone());
            async move {
                let (headers, body) = ask.await;
                (headers.get("content-encoding").map(|v| v.as_bytes()) == Some(b"dcz"))
                    .then_some((headers, body))
            }
        },
    )
    .await;
    assert_eq!(
        delta.0.get("vary").and_then(|v| v.to_str().ok()),
        Some("Accept-Encoding, Available-Dictionary")
    );
    let rebuilt =
        flotilla_agent::delta::decode(&delta.1, Some(&first.digest), &first.canonical_body())
            .expect("rebuilds");
    assert!(rebuilt == full, "the delta rebuilds the full document");
    let signature = verify_document_parts(&rebuilt, Some(CLUSTER))
        .expect("verifies")
        .signature;
    assert_eq!(signature.is_some(), signed);
    hub.stop().await;
}

/// A bundle, and the delta to send instead to a request that offers a dictionary.
type Served = (Bundle, Vec<u8>);

/// A server that serves what `serving` holds: in full to a request without a
/// dictionary, and its (broken) delta to one with it. Plain HTTP/1.1, one request a
/// connection.
#[derive(Clone, Default)]
struct Tampering {
    serving: Arc<Mutex<Option<Served>>>,
    /// Per bundle request: whether it offered a dictionary.
    offered: Arc<Mutex<Vec<bool>>>,
}

/// The header with which a hub names the revision of a bundle it sends (a static
/// mirror sends none, and its agents ask it for deltas by path).
const HUB: &str = "x-flotilla-revision: main@sha1:0000000000000000000000000000000000000000\r\n";

impl Tampering {
    /// The answer to one request, given its head.
    fn answer(&self, head: &str) -> Vec<u8> {
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let reply = |status: &str, extra: &str, body: &[u8]| {
            let mut out = format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(body);
            out
        };
        if request_line.starts_with("POST") {
            return reply("204 No Content", "", b"");
        }
        let Some((bundle, delta)) = self.serving.lock().expect("lock").clone() else {
            return reply("503 Service Unavailable", "", b"");
        };
        let offered = header(dcz::AVAILABLE_DICTIONARY).is_some();
        self.offered.lock().expect("lock").push(offered);
        let etag = format!("\"{}\"", bundle.digest);
        if header("if-none-match") == Some(etag.as_str()) {
            return reply("304 Not Modified", &format!("etag: {etag}\r\n"), b"");
        }
        if offered && !delta.is_empty() {
            return reply(
                "200 OK",
                &format!("etag: {etag}\r\n{HUB}content-encoding: dcz\r\n"),
                &delta,
            );
        }
        reply(
            "200 OK",
            &format!("etag: {etag}\r\n{HUB}content-type: application/json\r\n"),
            &bundle.document(REVISION),
        )
    }

    async fn serve(self, listener: tokio::net::TcpListener) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = listener.accept().await {
            let server = self.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                // The head, then as much body as it announces (a status report).
                let head_end = loop {
                    let Ok(n) = socket.read(&mut buffer).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..n]);
                    if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end;
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_string();
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                while request.len() < head_end + 4 + length {
                    match socket.read(&mut buffer).await {
                        Ok(n) if n > 0 => request.extend_from_slice(&buffer[..n]),
                        _ => return,
                    }
                }
                let _ = socket.write_all(&server.answer(&head)).await;
                let _ = socket.shutdown().await;
            });
        }
    }
}

#[tokio::test]
async fn a_broken_delta_is_dropped_and_the_agent_takes_the_full_document() {
    let server = Tampering::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    tokio::spawn(server.clone().serve(listener));

    let entries = |value: &str| {
        bundle(
            CLUSTER,
            vec![config_map("a", value), config_map("b", "unchanged")],
        )
    };
    let first = entries("one");
    *server.serving.lock().expect("lock") = Some((first.clone(), Vec::new()));
    let site = tempfile::tempdir().expect("tempdir");
    let mut agent = start_agent(
        site.path(),
        &format!("http://{address}/"),
        "flt_test",
        Duration::from_millis(100),
        None,
    );
    agent.applied(&first.digest).await;

    // Each broken delta names what the agent runs as its base: one is not zstd at
    // all, the other decompresses into a document whose resources were changed after
    // their digest was taken (it fails the digest check).
    let mut runs = first;
    let cases = [
        ("garbage", "two", "the delta does not decompress"),
        ("forged", "three", "refused the bundle"),
    ];
    for (what, value, why) in cases {
        let target = entries(value);
        let delta = if what == "garbage" {
            let mut garbage = dcz::header(&runs.digest).expect("header").to_vec();
            garbage.extend_from_slice(b"this is not a zstd frame");
            garbage
        } else {
            let forged = String::from_utf8(target.document(REVISION))
                .expect("utf-8")
                .replace("unchanged", "tampered!");
            flotilla_hub::delta::encode(&runs.canonical_body(), forged.as_bytes()).expect("encodes")
        };
        server.offered.lock().expect("lock").clear();
        *server.serving.lock().expect("lock") = Some((target.clone(), delta));
        let report = agent.applied(&target.digest).await;
        assert!(
            report
                .message
                .contains(&format!("fetched in full after a delta that failed: {why}")),
            "{what}: {}",
            report.message
        );
        let offered = server.offered.lock().expect("lock").clone();
        let broken = offered
            .iter()
            .position(|o| *o)
            .unwrap_or_else(|| panic!("{what}: no request offered a dictionary: {offered:?}"));
        assert_eq!(
            offered.get(broken + 1),
            Some(&false),
            "{what}: the request after the broken delta asks for the full document"
        );
        let stored = std::fs::read(site.path().join("state").join(STORED)).expect("stored");
        let stored: Value = serde_json::from_slice(&stored).expect("json");
        assert_eq!(stored["digest"], target.digest.as_str(), "{what}");
        runs = target;
    }

    // The stored copy of the base damaged while the agent runs: the delta is rebuilt
    // from the document it holds (the one the bundle it runs is made of), and the new
    // bundle replaces the damaged copy.
    let stored = site.path().join("state").join(STORED);
    std::fs::write(&stored, b"{\"damaged\"").expect("damages the stored bundle");
    let target = entries("four");
    let delta = flotilla_hub::delta::encode(&runs.canonical_body(), &target.document(REVISION))
        .expect("encodes");
    *server.serving.lock().expect("lock") = Some((target.clone(), delta));
    let report = agent.applied(&target.digest).await;
    assert!(
        report.message.contains("received as a delta"),
        "{}",
        report.message
    );
    let document = std::fs::read(&stored).expect("stored");
    assert_eq!(
        verify_document_parts(&document, Some(CLUSTER))
            .expect("the stored bundle verifies again")
            .bundle
            .digest,
        target.digest
    );
    agent.stop().await;

    // Damaged while the agent is stopped: it starts without a base, offers none, and
    // takes the full document.
    std::fs::write(&stored, b"{\"damaged\"").expect("damages the stored bundle");
    let runs = target;
    let target = entries("five");
    let delta = flotilla_hub::delta::encode(&runs.canonical_body(), &target.document(REVISION))
        .expect("encodes");
    server.offered.lock().expect("lock").clear();
    *server.serving.lock().expect("lock") = Some((target.clone(), delta));
    let mut agent = start_agent(
        site.path(),
        &format!("http://{address}/"),
        "flt_test",
        Duration::from_millis(100),
        None,
    );
    let report = agent.applied(&target.digest).await;
    assert!(
        !report.message.contains("received as a delta"),
        "{}",
        report.message
    );
    let offered = server.offered.lock().expect("lock").clone();
    assert!(
        !offered.is_empty() && !offered[0],
        "the first request offers no dictionary: {offered:?}"
    );
    agent.stop().await;
}

/// The agent rebuilds a delta against the body of the document it holds where it lies
/// when the document is laid out as served; a stored document laid out otherwise
/// (spaced out, still the same bundle), which an agent restarted holds, is read and
/// verified in full, and serves as the base all the same: the change still arrives as
/// a delta.
#[tokio::test]
async fn a_stored_base_laid_out_otherwise_still_serves_a_delta() {
    let server = Tampering::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let address = listener.local_addr().expect("address");
    tokio::spawn(server.clone().serve(listener));
    let entries = |value: &str| {
        bundle(
            CLUSTER,
            vec![config_map("a", value), config_map("b", "unchanged")],
        )
    };
    let first = entries("one");
    *server.serving.lock().expect("lock") = Some((first.clone(), Vec::new()));
    let site = tempfile::tempdir().expect("tempdir");
    let mut agent = start_agent(
        site.path(),
        &format!("http://{address}/"),
        "flt_test",
        Duration::from_millis(100),
        None,
    );
    agent.applied(&first.digest).await;
    agent.stop().await;

    let stored = site.path().join("state").join(STORED);
    let document: Value =
        serde_json::from_slice(&std::fs::read(&stored).expect("stored")).expect("json");
    std::fs::write(
        &stored,
        serde_json::to_vec_pretty(&document).expect("serialises"),
    )
    .expect("rewrites the stored document");
    let target = entries("two");
    let delta = flotilla_hub::delta::encode(&first.canonical_body(), &target.document(REVISION))
        .expect("encodes");
    *server.serving.lock().expect("lock") = Some((target.clone(), delta));
    let mut agent = start_agent(
        site.path(),
        &format!("http://{address}/"),
        "flt_test",
        Duration::from_millis(100),
        None,
    );
    let report = agent.applied(&target.digest).await;
    assert!(
        report.message.contains("received as a delta"),
        "{}",
        report.message
    );
    agent.stop().await;
}

/// When what the hub serves a cluster changes, the delta from the digest its agent
/// reported applying is made at once, before any poll asks for it: the agent's first
/// request after the change gets it.
#[tokio::test]
async fn the_delta_from_what_the_agent_runs_is_made_before_it_asks() {
    let repo = Repo::new();
    let (hub, _hub_state, token) = hub_of(&repo).await;
    let http = client();
    let bundle_url = hub.url(&format!("/v1/clusters/{CLUSTER}/bundle"));
    let first = rendered(&repo);
    // The cluster's agent reports running the first bundle (no poll of its own).
    let report = serde_json::json!({"applied": first.digest, "attempted": first.digest,
        "resources": [], "message": "applied", "agentVersion": "test"});
    let response = http
        .post(hub.url(&format!("/v1/clusters/{CLUSTER}/status")))
        .bearer_auth(&token)
        .json(&report)
        .send()
        .await
        .expect("reports");
    assert_eq!(response.status(), 200);
    let made = || async {
        hub_support::metric(&client(), &hub.base, "flotilla_bundle_deltas_made_total").await
    };
    assert_eq!(made().await, 0.0);

    set_replicas(&repo, 3);
    repo.commit("kuard: three replicas");
    let second = rendered(&repo);
    // Made with no request asking for it.
    eventually("the delta made ahead", Duration::from_secs(20), || async {
        (made().await >= 1.0).then_some(())
    })
    .await;
    let response = asking_for_delta(http.get(&bundle_url), &token, &first.digest)
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("dcz")
    );
    let body = response.bytes().await.expect("body");
    assert_eq!(rebuilt_digest(&body, &first), second.digest);
    let (hits, misses, _) = deltas_sent(&hub.base).await;
    assert_eq!(
        (hits, misses),
        (1.0, 0.0),
        "the first request found it made"
    );
    assert_eq!(made().await, 1.0);
    hub.stop().await;
}

/// A long-poll woken by a change, naming the digest that change replaced, gets its
/// delta without the hub looking the base up in the store's history: the hub knows
/// in memory what it served the cluster before. (The agents of a fleet-wide change
/// all ask at once, while their reports are being written; a look-up for each kept
/// most of their deltas from being made in time.) The cluster's history is moved to
/// another name behind the hub's back (so its objects stay referenced and are not
/// deleted), and a look-up would find nothing and the answer would be in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_poll_gets_the_delta_from_the_digest_its_change_replaced() {
    use sqlx::Connection as _;
    let repo = Repo::new();
    let (hub, hub_state, token) = hub_of(&repo).await;
    let first = rendered(&repo);
    let mut database = sqlx::SqliteConnection::connect_with(
        &sqlx::sqlite::SqliteConnectOptions::new()
            .filename(hub_state.path().join("flotilla.db"))
            .busy_timeout(Duration::from_secs(10)),
    )
    .await
    .expect("the hub's store");
    let moved = sqlx::query("UPDATE bundle_history SET cluster = 'elsewhere' WHERE cluster = $1")
        .bind(CLUSTER)
        .execute(&mut database)
        .await
        .expect("moves the cluster's history");
    assert!(moved.rows_affected() >= 1, "the first digest was in it");
    database.close().await.expect("closes");

    let held = {
        let url = hub.url(&format!("/v1/clusters/{CLUSTER}/bundle?wait=30s"));
        let (token, first) = (token.clone(), first.digest.clone());
        tokio::spawn(async move {
            let response = asking_for_delta(client().get(url), &token, &first)
                .header("if-none-match", format!("\"{first}\""))
                .send()
                .await
                .expect("GET");
            let encoding = response
                .headers()
                .get("content-encoding")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (
                response.status(),
                encoding,
                response.bytes().await.expect("body"),
            )
        })
    };
    poll_held(&hub).await;
    set_replicas(&repo, 3);
    repo.commit("kuard: three replicas");
    let second = rendered(&repo);
    let (status, encoding, body) = held.await.expect("the poll ends");
    assert_eq!(status, 200);
    assert_eq!(
        encoding.as_deref(),
        Some("dcz"),
        "a delta, not the full document"
    );
    assert_eq!(rebuilt_digest(&body, &first), second.digest);
    hub.stop().await;
}
