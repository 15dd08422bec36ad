//! The hub's API as agents and operators meet it: tokens (401, 403, 404, revoked),
//! status reports and fleet states, compression, bundles by digest, JSON errors,
//! `flotilla publish`, and TLS.

use crate::support::hub as hub_common;

use std::io::Read as _;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use flotilla_core::bundle::verify_document;
use flotilla_hub::clock::ManualClock;
use hub_common::*;

fn flotilla(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_STATE_DIR")
        .output()
        .expect("flotilla runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn status_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response.bytes().await.expect("body");
    let value = if body.is_empty() {
        Value::Null
    } else {
        assert_eq!(
            content_type, "application/json",
            "every answer here is JSON"
        );
        serde_json::from_slice(&body).expect("JSON")
    };
    (status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_decide_who_reads_what() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let state_arg = state.path().display().to_string();
    // Tokens made with the real command line: the token is the last word on stdout.
    let (ok, stdout, _) = flotilla(&["token", "create", "red", "--state-dir", &state_arg]);
    assert!(ok);
    let red = stdout
        .split_whitespace()
        .last()
        .expect("a token")
        .to_string();
    assert!(red.starts_with("flt_"));
    let (ok, stdout, _) = flotilla(&["token", "create", "--admin", "--state-dir", &state_arg]);
    assert!(ok);
    let admin = stdout
        .split_whitespace()
        .last()
        .expect("a token")
        .to_string();
    let ghost = make_token(state.path(), Some("ghost")).await;
    // The secret is not stored anywhere in the state dir.
    let (_, listing, _) = flotilla(&["token", "list", "--state-dir", &state_arg]);
    assert!(listing.contains("cluster red") && listing.contains("admin"));
    assert!(!listing.contains(&red));
    let database = std::fs::read(state.path().join("flotilla.db")).expect("db");
    assert!(!String::from_utf8_lossy(&database).contains(&red));

    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let red_url = hub.url("/v1/clusters/red/bundle");
    let blue_url = hub.url("/v1/clusters/blue/bundle");

    let response = client.get(&red_url).send().await.expect("request");
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let (status, error) = status_of(response).await;
    assert_eq!(status, 401);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|m| m.contains("Bearer"))
    );
    for header in ["Bearer flt_not-a-token", "Basic cmVkOnJlZA==", "Bearer "] {
        let response = client
            .get(&red_url)
            .header("Authorization", header)
            .send()
            .await
            .expect("request");
        assert_eq!(status_of(response).await.0, 401, "{header}");
    }
    let (status, _, _) = get_bundle(&client, &red_url, &red, None).await;
    assert_eq!(status, 200);
    // Another cluster's bundle, its history and its status are all off limits.
    let (status, error) = status_of(
        client
            .get(&blue_url)
            .bearer_auth(&red)
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|m| m.contains("\"red\""))
    );
    let history = hub.url(&format!(
        "/v1/clusters/blue/bundles/sha256:{}",
        "0".repeat(64)
    ));
    let (status, _) = status_of(
        client
            .get(&history)
            .bearer_auth(&red)
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = status_of(
        client
            .post(hub.url("/v1/clusters/blue/status"))
            .bearer_auth(&red)
            .json(&json!({"applied": null}))
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 403);
    // A token for a cluster the fleet does not hold: 404, as for an admin asking.
    let (status, error) = status_of(
        client
            .get(hub.url("/v1/clusters/ghost/bundle"))
            .bearer_auth(&ghost)
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 404);
    assert!(error["error"].as_str().is_some_and(|m| m.contains("ghost")));
    let (status, _) = status_of(
        client
            .get(hub.url("/v1/clusters/ghost/bundle"))
            .bearer_auth(&admin)
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 404);
    // The admin token reads the fleet (and any bundle); a cluster token does not.
    let (status, _, _) = get_bundle(&client, &blue_url, &admin, None).await;
    assert_eq!(status, 200);
    let (status, _) = status_of(
        client
            .get(hub.url("/v1/fleet"))
            .bearer_auth(&red)
            .send()
            .await
            .expect("request"),
    )
    .await;
    assert_eq!(status, 403);

    // Revoking with the command line while the hub runs: 401 from then on.
    let id = revoke_red(&state_arg);
    assert!(listing.contains(&id));
    until_refused(&client, &red_url, &red).await;
    assert_eq!(
        metric(
            &client,
            &hub.base,
            "flotilla_bundle_responses_total{code=\"403\"}"
        )
        .await,
        2.0
    );
    hub.stop().await;
}

fn report(applied: Option<&str>, attempted: Option<&str>, failed: bool) -> Value {
    json!({
        "applied": applied,
        "attempted": attempted,
        "resources": [{
            "group": "apps", "kind": "Deployment", "namespace": "kuard", "name": "kuard",
            "state": if failed { "failed" } else { "ok" },
            "message": if failed { "ImagePullBackOff" } else { "" },
        }],
        "message": if failed { "1 of 4 resources failed" } else { "applied" },
        "agentVersion": "0.1.0-test",
    })
}

/// A report may come gzipped or zstd-compressed once the hub has said it takes them
/// (`Accept-Encoding` on its answer to a report, RFC 7694); a compressed body unpacks
/// to at most the limit of a plain one, and another coding is refused with the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_status_reports_are_taken_within_the_plain_limit() {
    use std::io::Write as _;
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let url = hub.url("/v1/clusters/red/status");
    let post = |coding: Option<&str>, body: Vec<u8>| {
        let mut request = client
            .post(&url)
            .bearer_auth(&red)
            .header("content-type", "application/json")
            .body(body);
        if let Some(coding) = coding {
            request = request.header("content-encoding", coding);
        }
        request.send()
    };
    let gzip = |bytes: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).expect("gzip");
        encoder.finish().expect("gzip")
    };
    let plain = serde_json::to_vec(&report(None, None, false)).expect("json");

    let answer = post(None, plain.clone()).await.expect("post");
    assert_eq!(answer.headers()["accept-encoding"], "gzip, zstd");
    assert_eq!(answer.status(), 200);
    for (coding, body) in [
        ("gzip", gzip(&plain)),
        ("zstd", zstd::encode_all(&plain[..], 3).expect("zstd")),
    ] {
        let (status, answer) = status_of(post(Some(coding), body).await.expect("post")).await;
        assert_eq!(
            (status, &answer["cluster"]),
            (200, &json!("red")),
            "{coding}: {answer}"
        );
    }
    // 2 MiB of JSON whitespace gzipped to about 2 KB: refused once past 1 MiB unpacked.
    let mut bomb = plain.clone();
    bomb.splice(1..1, std::iter::repeat_n(b' ', 2 << 20));
    let bomb = gzip(&bomb);
    assert!(bomb.len() < 10_000, "{} bytes", bomb.len());
    let (status, answer) = status_of(post(Some("gzip"), bomb).await.expect("post")).await;
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("unpacks to at most"))
    );
    let (status, answer) = status_of(post(Some("gzip"), plain.clone()).await.expect("post")).await;
    assert_eq!(status, 400, "{answer}");
    let refused = post(Some("br"), plain).await.expect("post");
    assert_eq!(refused.headers()["accept-encoding"], "gzip, zstd");
    let (status, answer) = status_of(refused).await;
    assert_eq!(status, 415, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("gzip, zstd"))
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_move_clusters_between_states() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let red = make_token(state.path(), Some("red")).await;
    let admin = make_token(state.path(), None).await;
    let clock = Arc::new(ManualClock::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    ));
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.clock = clock.clone();
    config.offline_after = Duration::from_secs(300);
    let hub = Running::start_ready(config).await;
    let client = client();
    let fleet_url = hub.url("/v1/fleet");
    let status_url = hub.url("/v1/clusters/red/status");
    let red_in = |fleet: &Value| -> Value {
        fleet["clusters"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "red"))
            .cloned()
            .expect("red in the fleet")
    };
    let fleet = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(red_in(&fleet)["state"], "never-seen");
    assert_eq!(fleet["counts"]["never-seen"], 14);
    let desired = red_in(&fleet)["desired"]
        .as_str()
        .expect("digest")
        .to_string();
    let other = format!("sha256:{}", "e".repeat(64));

    let post = |body: Value| {
        let (client, url, red) = (client.clone(), status_url.clone(), red.clone());
        async move {
            status_of(
                client
                    .post(url)
                    .bearer_auth(red)
                    .json(&body)
                    .send()
                    .await
                    .expect("post"),
            )
            .await
        }
    };
    // Still on an older bundle, nothing wrong: pending.
    let (status, answer) = post(report(Some(&other), Some(&other), false)).await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("pending")));
    // Tried the desired bundle and failed: failed.
    let (_, answer) = post(report(Some(&other), Some(&desired), true)).await;
    assert_eq!(answer["state"], "failed");
    let fleet = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(
        red_in(&fleet)["failedResources"][0],
        "Deployment.apps kuard/kuard: ImagePullBackOff"
    );
    // Applied it: in-sync.
    let (_, answer) = post(report(Some(&desired), Some(&desired), false)).await;
    assert_eq!(answer["state"], "in-sync");
    let fleet = get_json(&client, &fleet_url, &admin).await;
    let red_summary = red_in(&fleet);
    assert_eq!(red_summary["state"], "in-sync");
    assert_eq!(red_summary["applied"], desired.as_str());
    assert_eq!(red_summary["agentVersion"], "0.1.0-test");
    assert_eq!(red_summary["lastSeen"], "2027-01-15T08:00:00Z");
    assert_eq!(fleet["counts"]["in-sync"], 1);
    assert_eq!(fleet["counts"]["never-seen"], 13);
    assert_eq!(
        metric(&client, &hub.base, "flotilla_clusters{state=\"in-sync\"}").await,
        1.0
    );

    // Silent past the threshold: offline, and offline is not failed.
    clock.advance(Duration::from_secs(301));
    let fleet = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(red_in(&fleet)["state"], "offline");
    assert_eq!(
        (
            fleet["counts"]["offline"].as_u64(),
            fleet["counts"]["failed"].as_u64()
        ),
        (Some(1), Some(0))
    );

    // Bad reports are refused with a JSON message, and change nothing.
    for (body, expect) in [
        (b"{not json".to_vec(), 400),
        (br#"{"aplied": null}"#.to_vec(), 400),
        (br#"{"applied": "md5:0"}"#.to_vec(), 400),
        (vec![b' '; 2 * 1024 * 1024], 413),
    ] {
        let response = client
            .post(&status_url)
            .bearer_auth(&red)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("post");
        let (status, error) = status_of(response).await;
        assert_eq!(status, expect);
        assert!(error["error"].is_string());
    }
    // A valid report that does not say it is JSON: 415, with a JSON error.
    let valid = serde_json::to_vec(&report(Some(&desired), Some(&desired), false)).expect("json");
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut request = client
            .post(&status_url)
            .bearer_auth(&red)
            .body(valid.clone());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let (status, error) = status_of(request.send().await.expect("post")).await;
        assert_eq!(status, 415, "{content_type:?}");
        assert!(
            error["error"]
                .as_str()
                .is_some_and(|e| e.contains("application/json")),
            "{error}"
        );
    }
    let fleet = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(red_in(&fleet)["state"], "offline");
    hub.stop().await;

    // Reports survive a restart.
    let mut config = hub_common::config(state.path(), &repo.path().display().to_string());
    config.clock = clock.clone();
    let hub = Running::start_ready(config).await;
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    assert_eq!(red_in(&fleet)["applied"], desired.as_str());
    hub.stop().await;
}

fn decode_gzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("gzip");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_are_compressed_cached_and_kept_by_digest() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let raw = reqwest::Client::builder()
        .no_proxy()
        .no_gzip()
        .no_zstd()
        .build()
        .expect("client");
    let url = hub.url("/v1/clusters/red/bundle");
    let plain = raw.get(&url).bearer_auth(&token).send().await.expect("get");
    assert_eq!(plain.headers()["cache-control"], "private, no-cache");
    assert_eq!(plain.headers()["content-type"], "application/json");
    assert!(plain.headers().get("content-encoding").is_none());
    let etag = plain.headers()["etag"].to_str().expect("etag").to_string();
    let revision = plain.headers()["x-flotilla-revision"]
        .to_str()
        .expect("revision")
        .to_string();
    let plain = plain.bytes().await.expect("body").to_vec();
    let first = verify_document(&plain, Some("red")).expect("verified");
    assert!(revision.starts_with("main@sha1:"));

    for (accept, expect) in [
        ("gzip", "gzip"),
        ("gzip, zstd", "zstd"),
        ("zstd;q=0, gzip", "gzip"),
    ] {
        let response = raw
            .get(&url)
            .bearer_auth(&token)
            .header("Accept-Encoding", accept)
            .send()
            .await
            .expect("get");
        assert_eq!(response.headers()["content-encoding"], expect);
        assert_eq!(response.headers()["etag"], etag.as_str());
        assert_eq!(response.headers()["vary"], "Accept-Encoding");
        let body = response.bytes().await.expect("body").to_vec();
        assert!(body.len() < plain.len());
        let decoded = match expect {
            "gzip" => decode_gzip(&body),
            _ => zstd::decode_all(body.as_slice()).expect("zstd"),
        };
        assert_eq!(decoded, plain);
    }

    // After a new commit the old bundle stays readable by digest, immutable.
    let overlay = repo
        .read("overlays/demo/kuard-red.yaml")
        .replace("newTag: red", "newTag: ruby");
    repo.write("overlays/demo/kuard-red.yaml", &overlay);
    repo.commit("ruby");
    eventually("the new commit", Duration::from_secs(1), || {
        let (raw, url, token, etag) = (&raw, &url, &token, &etag);
        async move {
            let (status, _, _) = get_bundle(raw, url, token, Some(etag)).await;
            (status == 200).then_some(())
        }
    })
    .await;
    let old_url = hub.url(&format!("/v1/clusters/red/bundles/{}", first.digest));
    let response = raw
        .get(&old_url)
        .bearer_auth(&token)
        .send()
        .await
        .expect("get");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["cache-control"],
        "private, max-age=31536000, immutable"
    );
    assert_eq!(response.headers()["x-flotilla-revision"], revision.as_str());
    assert_eq!(
        response.bytes().await.expect("body").to_vec(),
        plain,
        "same digest, same bytes"
    );
    let (status, _, _) = get_bundle(&raw, &old_url, &token, Some(&etag)).await;
    assert_eq!(status, 304);
    let (status, error) = status_of(
        raw.get(hub.url(&format!(
            "/v1/clusters/red/bundles/sha256:{}",
            "f".repeat(64)
        )))
        .bearer_auth(&token)
        .send()
        .await
        .expect("get"),
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|m| m.contains("last 10"))
    );
    let (status, _) = status_of(
        raw.get(hub.url("/v1/clusters/red/bundles/latest"))
            .bearer_auth(&token)
            .send()
            .await
            .expect("get"),
    )
    .await;
    assert_eq!(status, 400);

    // Unknown paths and methods answer in JSON too; health needs no token.
    let (status, error) =
        status_of(raw.get(hub.url("/v2/nothing")).send().await.expect("get")).await;
    assert_eq!(status, 404);
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|m| m.contains("/v2/nothing"))
    );
    let (status, _) = status_of(raw.delete(&url).send().await.expect("delete")).await;
    assert_eq!(status, 405);
    let (status, health) = status_of(raw.get(hub.url("/healthz")).send().await.expect("get")).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let (status, _) = status_of(
        raw.post(hub.url("/v1/hooks/git"))
            .body("{}")
            .send()
            .await
            .expect("post"),
    )
    .await;
    assert_eq!(status, 404, "the webhook is off without a secret");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_writes_the_served_documents_as_static_files() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let out = tempfile::tempdir().expect("out dir");
    let admin = make_token(state.path(), None).await;
    let repo_arg = repo.path().display().to_string();
    let out_arg = out.path().display().to_string();
    let (ok, stdout, stderr) = flotilla(&["publish", "--repo", &repo_arg, "--out", &out_arg]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("published 14 clusters"), "{stdout}");

    let hub = Running::start_ready(config(state.path(), &repo_arg)).await;
    let client = client();
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    for cluster in fleet["clusters"].as_array().expect("clusters") {
        let name = cluster["name"].as_str().expect("name");
        let digest = cluster["desired"].as_str().expect("digest");
        let (status, _, served) = get_bundle(
            &client,
            &hub.url(&format!("/v1/clusters/{name}/bundle")),
            &admin,
            None,
        )
        .await;
        assert_eq!(status, 200);
        let dir = out.path().join("v1/clusters").join(name);
        let published = std::fs::read(dir.join("bundle")).expect("published bundle");
        assert_eq!(
            published, served,
            "{name}: the same bytes as the hub serves"
        );
        let by_digest = std::fs::read(dir.join("bundles").join(digest)).expect("by digest");
        assert_eq!(by_digest, served);
        // What a file:// reader does: read and verify.
        let url = url::Url::from_file_path(dir.join("bundle")).expect("file URL");
        let bytes = std::fs::read(url.to_file_path().expect("path")).expect("read");
        assert_eq!(
            verify_document(&bytes, Some(name))
                .expect("verified")
                .digest
                .as_str(),
            digest
        );
    }
    hub.stop().await;

    // A cluster that leaves the fleet leaves the published tree too; others stay.
    repo.remove("clusters/store-eu-003.yaml");
    repo.commit("close store-eu-003");
    let (ok, stdout, stderr) = flotilla(&["publish", "--repo", &repo_arg, "--out", &out_arg]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("removed store-eu-003"), "{stdout}");
    assert!(!out.path().join("v1/clusters/store-eu-003").exists());
    assert!(out.path().join("v1/clusters/red/bundle").is_file());
    // A broken fleet publishes nothing and exits 1.
    let red = repo
        .read("clusters/red.yaml")
        .replace("kind: Cluster", "kind: Clustre");
    repo.write("clusters/red.yaml", &red);
    repo.commit("broken");
    let before = std::fs::read(out.path().join("v1/clusters/red/bundle")).expect("read");
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--repo", &repo_arg, "--out", &out_arg])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("clusters/red.yaml"));
    assert_eq!(
        std::fs::read(out.path().join("v1/clusters/red/bundle")).expect("read"),
        before
    );
}

/// `flotilla publish` with the test bucket's endpoint and keys in the environment.
fn publish_to_bucket(bucket: &flotilla_testkit::TestBucket, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("publish")
        .args(args)
        .envs(bucket.env())
        .env_remove("FLOTILLA_STATE_DIR")
        .env_remove("FLOTILLA_OBJECTS")
        .output()
        .expect("flotilla runs");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_writes_the_static_layout_into_a_bucket() {
    let Some(bucket) =
        flotilla_testkit::s3_bucket("hub_api::publish_writes_the_static_layout_into_a_bucket")
    else {
        return;
    };
    let repo = Repo::new();
    let repo_arg = repo.path().display().to_string();
    let out = tempfile::tempdir().expect("out dir");
    let out_arg = out.path().display().to_string();
    let (ok, stdout, stderr) = flotilla(&["publish", "--repo", &repo_arg, "--out", &out_arg]);
    assert!(ok, "{stderr}");
    let site = format!("s3://{}/mirror", bucket.bucket);
    let (ok, said) = publish_to_bucket(&bucket, &["--repo", &repo_arg, "--objects", &site]);
    assert!(ok, "{said}");
    assert!(
        said.contains("published 14 clusters at") && said.contains(&site),
        "{said}"
    );
    assert!(said.contains("14 written"), "{said}\n{stdout}");

    // The same keys as the folder's files, with the same bytes, read back through
    // the S3 API.
    let keys = bucket.keys("mirror/");
    let mut files = Vec::new();
    for cluster in std::fs::read_dir(out.path().join("v1/clusters")).expect("clusters") {
        let cluster = cluster
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let dir = out.path().join("v1/clusters").join(&cluster);
        files.push(format!("mirror/v1/clusters/{cluster}/bundle"));
        files.push(format!("mirror/v1/clusters/{cluster}/served"));
        // The documents by digest, and the deltas to the current one.
        for folder in ["bundles", "deltas"] {
            for file in std::fs::read_dir(dir.join(folder)).expect(folder) {
                let name = file
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                let key = format!("mirror/v1/clusters/{cluster}/{folder}/{name}");
                if folder == "deltas" {
                    let remote = bucket_object(&bucket, &key).await.expect("in the bucket");
                    let local = std::fs::read(dir.join(folder).join(&name)).expect("a delta");
                    assert_eq!(local, remote, "{key}");
                }
                files.push(key);
            }
        }
        let local = std::fs::read(dir.join("bundle")).expect("bundle");
        let remote = bucket_object(&bucket, &format!("mirror/v1/clusters/{cluster}/bundle"))
            .await
            .expect("in the bucket");
        assert_eq!(local, remote, "{cluster}");
        verify_document(&remote, Some(&cluster)).expect("verifies");
    }
    files.sort();
    assert_eq!(keys, files);

    // Again: nothing changes. Then a cluster leaves the fleet and the bucket.
    let (ok, said) = publish_to_bucket(&bucket, &["--repo", &repo_arg, "--objects", &site]);
    assert!(ok && said.contains("0 written, 14 unchanged"), "{said}");
    repo.remove("clusters/store-eu-003.yaml");
    repo.commit("close store-eu-003");
    let (ok, said) = publish_to_bucket(&bucket, &["--repo", &repo_arg, "--objects", &site]);
    assert!(ok && said.contains("removed store-eu-003"), "{said}");
    assert!(bucket.keys("mirror/v1/clusters/store-eu-003/").is_empty());
    assert!(
        bucket_object(&bucket, "mirror/v1/clusters/red/bundle")
            .await
            .is_some()
    );

    // A bucket that does not exist is named, and no secret is shown.
    let (ok, said) = publish_to_bucket(
        &bucket,
        &["--repo", &repo_arg, "--objects", "s3://no-such-bucket/site"],
    );
    assert!(!ok);
    assert!(said.contains("s3://no-such-bucket/site"), "{said}");
    assert!(!said.contains("flotilla-test-secret"), "{said}");
    // A URL that is not one.
    let (ok, said) = publish_to_bucket(&bucket, &["--repo", &repo_arg, "--objects", "gs://x"]);
    assert!(!ok && said.contains("not known"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_https_when_given_a_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (ca, cert, key) = (path("ca.pem"), path("cert.pem"), path("key.pem"));
    let pki = flotilla_testkit::TestCa::new("flotilla test CA");
    let leaf = pki.server(&["127.0.0.1"]);
    std::fs::write(&ca, pki.cert_pem()).expect("write");
    std::fs::write(&cert, &leaf.cert_pem).expect("write");
    std::fs::write(&key, &leaf.key_pem).expect("write");
    let (cert, key) = (
        std::path::PathBuf::from(cert),
        std::path::PathBuf::from(key),
    );
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let hub = flotilla_hub::Hub::start(config(state.path(), &repo.path().display().to_string()))
        .await
        .expect("hub");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let (cert, key) = (cert.clone(), key.clone());
        async move {
            let files = flotilla_hub::TlsFiles {
                cert,
                key,
                client_ca: None,
            };
            hub.serve_tls(listener, &files, async {
                let _ = stopped.await;
            })
            .await
        }
    });
    let client = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca).expect("ca")).expect("pem"),
        )
        .build()
        .expect("client");
    let url = format!("https://{address}/v1/clusters/red/bundle");
    let body = eventually("the bundle over TLS", Duration::from_secs(10), || {
        let (client, url, token) = (&client, &url, &token);
        async move {
            let (status, _, body) = get_bundle(client, url, token, None).await;
            (status == 200).then_some(body)
        }
    })
    .await;
    verify_document(&body, Some("red")).expect("verified over TLS");
    let _ = stop.send(());
    task.await.expect("task").expect("TLS server stops cleanly");
}

/// A long-poll held when its token is revoked gets no bundle when the change comes
/// (the token was checked when the poll began, minutes before, maybe): 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_whose_token_is_revoked_meanwhile_gets_no_bundle() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let state_arg = state.path().display().to_string();
    let token = make_token(state.path(), Some("red")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let (_, etag, _) = get_bundle(&client, &url, &token, None).await;
    let etag = etag.expect("an ETag");
    let poll = tokio::spawn({
        let (client, url, token, etag) = (client.clone(), url.clone(), token.clone(), etag.clone());
        async move { get_bundle(&client, &format!("{url}?wait=30s"), &token, Some(&etag)).await }
    });
    until_polls_held(&client, &hub.base, 1, Duration::from_secs(5)).await;
    revoke_red(&state_arg);
    until_refused(&client, &url, &token).await;
    let overlay = repo
        .read("overlays/demo/kuard-red.yaml")
        .replace("newTag: red", "newTag: crimson");
    repo.write("overlays/demo/kuard-red.yaml", &overlay);
    repo.commit("red turns crimson");
    let (status, _, body) = poll.await.expect("the long-poll's task");
    assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
    hub.stop().await;
}

/// Until the hub refuses `token` for `url` (a revocation taken), within 5 s.
async fn until_refused(client: &reqwest::Client, url: &str, token: &str) {
    eventually(
        "the revoked token to be refused",
        Duration::from_secs(5),
        || async move {
            let (status, _, _) = get_bundle(client, url, token, None).await;
            (status == 401).then_some(())
        },
    )
    .await;
}

/// Revokes cluster red's token with the command line (`token list`, then `token
/// revoke` of its id); the id.
fn revoke_red(state_arg: &str) -> String {
    let (ok, listing, _) = flotilla(&["token", "list", "--state-dir", state_arg]);
    assert!(ok);
    let id = listing
        .lines()
        .find(|l| l.contains("cluster red"))
        .and_then(|l| l.split_whitespace().next())
        .expect("an id")
        .to_string();
    let (ok, stdout, stderr) = flotilla(&["token", "revoke", &id, "--state-dir", state_arg]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains(&id));
    id
}
