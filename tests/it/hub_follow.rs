//! The hub follows a real Git repository (made in a temp dir from fleet-example):
//! new commits show up as new ETags, unchanged content keeps its ETag, broken commits
//! never reach agents, long-polls return when a commit lands, and a remote repository
//! is fetched when the webhook says so.

use crate::support::hub as hub_common;

use std::time::{Duration, Instant};

use flotilla_core::bundle::verify_document;
use hub_common::*;

const OVERLAY: &str = "overlays/sites/store-us-002-big-cache.yaml";

fn bump_store_us_002(repo: &Repo, size: &str) {
    let text = repo
        .read(OVERLAY)
        .replace("value: 200Gi", &format!("value: {size}"));
    repo.write(OVERLAY, &text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_shows_up_as_a_new_etag_within_a_second() {
    let repo = Repo::new();
    let first = repo.git(&["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().expect("state dir");
    let store_token = make_token(state.path(), Some("store-us-002")).await;
    let red_token = make_token(state.path(), Some("red")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let store_url = hub.url("/v1/clusters/store-us-002/bundle");
    let red_url = hub.url("/v1/clusters/red/bundle");

    let (status, old_etag, body) = get_bundle(&client, &store_url, &store_token, None).await;
    assert_eq!(status, 200);
    let old_etag = old_etag.expect("an ETag");
    let old = verify_document(&body, Some("store-us-002")).expect("a verified bundle");
    assert_eq!(old_etag, format!("\"{}\"", old.digest));
    let (_, red_etag, _) = get_bundle(&client, &red_url, &red_token, None).await;
    let red_etag = red_etag.expect("an ETag");
    // The same ETag again: 304 with no body.
    let (status, _, body) = get_bundle(&client, &store_url, &store_token, Some(&old_etag)).await;
    assert_eq!((status, body.len()), (304, 0));

    bump_store_us_002(&repo, "300Gi");
    let committed = Instant::now();
    let commit = repo.commit("store-us-002: a bigger cache");
    let (new_etag, body) = eventually(
        "the new commit to be served",
        Duration::from_secs(1),
        || {
            let (client, url, token, old) = (&client, &store_url, &store_token, &old_etag);
            async move {
                let (status, etag, body) = get_bundle(client, url, token, Some(old)).await;
                (status == 200).then(|| (etag.expect("an ETag"), body))
            }
        },
    )
    .await;
    let latency = committed.elapsed();
    assert_ne!(new_etag, old_etag);
    let new = verify_document(&body, Some("store-us-002")).expect("a verified bundle");
    assert_eq!(new_etag, format!("\"{}\"", new.digest));
    let text = String::from_utf8(body).expect("utf-8");
    assert!(text.contains("300Gi"), "the new bundle has the new size");
    assert!(text.contains(&format!("\"revision\":\"main@sha1:{commit}\"")));
    assert_ne!(commit, first);
    // The old ETag now gets the new bundle; the new one gets 304.
    let (status, _, _) = get_bundle(&client, &store_url, &store_token, Some(&old_etag)).await;
    assert_eq!(status, 200);
    let (status, _, _) = get_bundle(&client, &store_url, &store_token, Some(&new_etag)).await;
    assert_eq!(status, 304);
    // A cluster the commit does not touch keeps its ETag.
    let (status, _, _) = get_bundle(&client, &red_url, &red_token, Some(&red_etag)).await;
    assert_eq!(status, 304, "red did not change");
    eprintln!("commit to new ETag served: {latency:?}");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_changes_no_content_keeps_the_etag_and_the_bytes() {
    let repo = Repo::new();
    let first = repo.git(&["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("blue")).await;
    let admin = make_token(state.path(), None).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let url = hub.url("/v1/clusters/blue/bundle");
    let (_, etag, before) = get_bundle(&client, &url, &token, None).await;
    let etag = etag.expect("an ETag");

    repo.write("README.md", "Only the documentation changes.\n");
    let second = repo.commit("docs only");
    eventually(
        "the hub to look at the new commit",
        Duration::from_secs(1),
        || {
            let (client, url, admin, second) = (&client, hub.url("/v1/fleet"), &admin, &second);
            async move {
                let fleet = get_json(client, &url, admin).await;
                (fleet["revision"] == format!("main@sha1:{second}")).then_some(())
            }
        },
    )
    .await;
    let response = client
        .get(&url)
        .bearer_auth(&token)
        .header("If-None-Match", &etag)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 304);
    // The bundle still names the commit that first produced it, so the bytes behind
    // one ETag never change.
    assert_eq!(
        response.headers()["x-flotilla-revision"],
        format!("main@sha1:{first}").as_str()
    );
    let (status, same_etag, after) = get_bundle(&client, &url, &token, None).await;
    assert_eq!(status, 200);
    assert_eq!(same_etag.as_deref(), Some(etag.as_str()));
    assert_eq!(after, before);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_commit_keeps_every_last_good_bundle_and_shows_the_error() {
    let repo = Repo::new();
    let good = repo.git(&["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let gone = make_token(state.path(), Some("store-eu-003")).await;
    let store = make_token(state.path(), Some("store-us-002")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let fleet_url = hub.url("/v1/fleet");
    let before = get_json(&client, &fleet_url, &admin).await;
    let digests = |fleet: &serde_json::Value| -> Vec<(String, String)> {
        fleet["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_string(),
                    c["desired"].as_str().expect("digest").to_string(),
                )
            })
            .collect()
    };
    assert_eq!(digests(&before).len(), 14);

    // One commit that breaks red, changes store-us-002 (which still renders) and
    // removes store-eu-003: none of it may reach an agent.
    let red = repo
        .read("clusters/red.yaml")
        .replace("  labels:", "  lables:");
    repo.write("clusters/red.yaml", &red);
    bump_store_us_002(&repo, "400Gi");
    repo.remove("clusters/store-eu-003.yaml");
    let broken = repo.commit("a typo");
    let after = eventually(
        "the broken commit to be tried",
        Duration::from_secs(1),
        || {
            let (client, url, admin, broken) = (&client, &fleet_url, &admin, &broken);
            async move {
                let fleet = get_json(client, url, admin).await;
                (fleet["attemptedRevision"] == format!("main@sha1:{broken}")).then_some(fleet)
            }
        },
    )
    .await;
    assert_eq!(after["revision"], format!("main@sha1:{good}"));
    assert_eq!(
        digests(&after),
        digests(&before),
        "every cluster keeps its bundle"
    );
    let errors = after["renderErrors"].as_array().expect("errors");
    assert!(
        errors.iter().any(|e| e["file"] == "clusters/red.yaml"
            && e["line"].as_u64().is_some()
            && e["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("clusters/red.yaml:") && t.contains("lables"))),
        "the error names the file and line: {errors:#?}"
    );
    let gone_url = hub.url("/v1/clusters/store-eu-003/bundle");
    let (status, _, _) = get_bundle(&client, &gone_url, &gone, None).await;
    assert_eq!(
        status, 200,
        "a removed cluster is still served until a commit renders cleanly"
    );
    let old_store = before["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "store-us-002"))
        .and_then(|c| c["desired"].as_str())
        .map(|d| format!("\"{d}\""))
        .expect("store-us-002");
    let store_url = hub.url("/v1/clusters/store-us-002/bundle");
    let (status, _, _) = get_bundle(&client, &store_url, &store, Some(&old_store)).await;
    assert_eq!(status, 304, "no partial render is served");
    assert!(metric(&client, &hub.base, "flotilla_render_errors").await >= 1.0);
    let metrics = metrics_text(&client, &hub.base).await;
    assert!(metrics.contains("flotilla_render_error_info{file=\"clusters/red.yaml\""));
    assert!(metrics.contains("flotilla_renders_total{result=\"failed\"} 1"));
    // A hub alone on its database holds the rollout lease, and says so.
    assert!(
        metrics.contains("\nflotilla_rollout_lease_held 1\n"),
        "{metrics}"
    );

    // Fixing the typo renders cleanly: now store-eu-003 is gone and store-us-002 moves on.
    let red = repo
        .read("clusters/red.yaml")
        .replace("  lables:", "  labels:");
    repo.write("clusters/red.yaml", &red);
    let fixed = repo.commit("fix the typo");
    eventually(
        "the fixed commit to be served",
        Duration::from_secs(1),
        || {
            let (client, url, admin, fixed) = (&client, &fleet_url, &admin, &fixed);
            async move {
                let fleet = get_json(client, url, admin).await;
                (fleet["revision"] == format!("main@sha1:{fixed}")).then_some(())
            }
        },
    )
    .await;
    let fleet = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(fleet["renderErrors"].as_array().map(Vec::len), Some(0));
    assert_eq!(digests(&fleet).len(), 13);
    let response = client
        .get(&gone_url)
        .bearer_auth(&gone)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 404);
    let error: serde_json::Value = response.json().await.expect("a JSON error");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|m| m.contains("store-eu-003"))
    );
    let (status, _, body) = get_bundle(&client, &store_url, &store, Some(&old_store)).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("400Gi"));
    assert_eq!(
        metric(&client, &hub.base, "flotilla_render_errors").await,
        0.0
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_as_soon_as_a_commit_lands() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let (_, etag, _) = get_bundle(&client, &url, &token, None).await;
    let etag = etag.expect("an ETag");

    // Nothing changes: a short wait ends in 304 after the wait, not before.
    let started = Instant::now();
    let (status, _, _) =
        get_bundle(&client, &format!("{url}?wait=300ms"), &token, Some(&etag)).await;
    assert_eq!(status, 304);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let poll = tokio::spawn({
        let (client, url, token, etag) = (client.clone(), url.clone(), token.clone(), etag.clone());
        async move {
            let result = get_bundle(&client, &format!("{url}?wait=30s"), &token, Some(&etag)).await;
            (result, Instant::now())
        }
    });
    until_polls_held(&client, &hub.base, 1, Duration::from_secs(5)).await;
    let overlay = repo
        .read("overlays/demo/kuard-red.yaml")
        .replace("newTag: red", "newTag: crimson");
    repo.write("overlays/demo/kuard-red.yaml", &overlay);
    let committed = Instant::now();
    repo.commit("red turns crimson");
    let ((status, new_etag, _), answered) = poll.await.expect("long-poll task");
    assert_eq!(status, 200);
    assert_ne!(new_etag.as_deref(), Some(etag.as_str()));
    let latency = answered.duration_since(committed);
    assert!(
        latency < Duration::from_secs(1),
        "the long-poll answered {latency:?} after the commit"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_folder_is_served_and_read_again_when_a_file_changes() {
    let folder = tempfile::tempdir().expect("folder");
    let repo = Repo::new();
    // A copy without .git: served as the files are on disk.
    for file in ["charts", "clusters", "groups", "overlays", "workloads"] {
        let status = std::process::Command::new("cp")
            .args(["-r"])
            .arg(repo.path().join(file))
            .arg(folder.path())
            .status()
            .expect("cp");
        assert!(status.success());
    }
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("store-us-002")).await;
    let hub =
        Running::start_ready(config(state.path(), &folder.path().display().to_string())).await;
    let client = client();
    let url = hub.url("/v1/clusters/store-us-002/bundle");
    let (status, etag, _) = get_bundle(&client, &url, &token, None).await;
    assert_eq!(status, 200);
    let etag = etag.expect("an ETag");
    let path = folder.path().join(OVERLAY);
    let text = std::fs::read_to_string(&path)
        .expect("read")
        .replace("value: 200Gi", "value: 250Gi");
    std::fs::write(&path, text).expect("write");
    let body = eventually("the edit to be served", Duration::from_secs(1), || {
        let (client, url, token, etag) = (&client, &url, &token, &etag);
        async move {
            let (status, _, body) = get_bundle(client, url, token, Some(etag)).await;
            (status == 200).then_some(body)
        }
    })
    .await;
    assert!(String::from_utf8_lossy(&body).contains("250Gi"));
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_repository_is_fetched_when_a_correctly_signed_webhook_arrives() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("store-us-002")).await;
    let secret = b"a webhook secret".to_vec();
    let mut config = config(state.path(), &format!("file://{}", repo.path().display()));
    config.webhook_secret = Some(secret.clone());
    let hub = Running::start_ready(config).await;
    let client = client();
    let url = hub.url("/v1/clusters/store-us-002/bundle");
    let (status, etag, _) = get_bundle(&client, &url, &token, None).await;
    assert_eq!(status, 200, "the mirror was cloned and rendered");
    let etag = etag.expect("an ETag");
    assert!(state.path().join("repository.git").join("HEAD").is_file());

    bump_store_us_002(&repo, "500Gi");
    repo.commit("bigger");
    let hook = hub.url("/v1/hooks/git");
    let payload = br#"{"ref":"refs/heads/main","after":"ignored"}"#;
    for signature in [
        None,
        Some("sha256=00".to_string()),
        Some(sign(b"another secret", payload)),
    ] {
        let mut request = client.post(&hook).body(payload.to_vec());
        if let Some(signature) = &signature {
            request = request.header("X-Hub-Signature-256", signature);
        }
        let response = request.send().await.expect("hook");
        assert_eq!(response.status(), 401, "signature {signature:?}");
        let error: serde_json::Value = response.json().await.expect("a JSON error");
        assert!(
            error["error"]
                .as_str()
                .is_some_and(|m| m.contains("X-Hub-Signature-256"))
        );
    }
    // Rejected hooks fetched nothing (the timed poll is an hour away).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, _) = get_bundle(&client, &url, &token, Some(&etag)).await;
    assert_eq!(status, 304);
    assert_eq!(
        metric(
            &client,
            &hub.base,
            "flotilla_webhooks_total{result=\"rejected\"}"
        )
        .await,
        3.0
    );

    assert_eq!(post_webhook(&client, &hub, &secret).await, 202);
    let body = new_bundle(&client, &url, &token, &etag, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&body).contains("500Gi"));

    // The same signed body again and again (a trigger that always sends one, or a
    // captured delivery replayed): every commit is still found, the looks paced (at
    // most one every 5 s, those in between sharing the next).
    let resize = |from: &str, to: &str| {
        let text = repo.read(OVERLAY).replace(from, to);
        repo.write(OVERLAY, &text);
    };
    let mut etag = get_bundle(&client, &url, &token, None)
        .await
        .1
        .expect("an ETag");
    for (from, to) in [("500Gi", "600Gi"), ("600Gi", "700Gi")] {
        resize(&format!("value: {from}"), &format!("value: {to}"));
        repo.commit(to);
        for _ in 0..3 {
            let response = client
                .post(&hook)
                .header("X-Hub-Signature-256", sign(&secret, payload))
                .body(payload.to_vec())
                .send()
                .await
                .expect("hook");
            assert_eq!(response.status(), 202);
        }
        let body = new_bundle(&client, &url, &token, &etag, Duration::from_secs(15)).await;
        assert!(String::from_utf8_lossy(&body).contains(to));
        etag = get_bundle(&client, &url, &token, None)
            .await
            .1
            .expect("an ETag");
    }
    hub.stop().await;
}

/// A hub alone on its database (SQLite) takes a force-pushed branch at its first poll,
/// like any other commit: no hub can be behind it, so there is nothing to wait for
/// (several hubs wait for three polls in a row, see `hub_peers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_alone_takes_a_force_push_at_once() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("store-us-002")).await;
    let admin = make_token(state.path(), None).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let url = hub.url("/v1/clusters/store-us-002/bundle");
    let (status, etag, _) = get_bundle(&client, &url, &token, None).await;
    assert_eq!(status, 200);
    let etag = etag.expect("an ETag");

    let text = repo.read(OVERLAY).replace("value: 200Gi", "value: 700Gi");
    let rewritten = repo.force_push(OVERLAY, &text);
    let body = new_bundle(&client, &url, &token, &etag, Duration::from_secs(10)).await;
    let body = String::from_utf8(body).expect("utf-8");
    assert!(body.contains("700Gi"), "the force-pushed content");
    assert!(body.contains(&format!("\"revision\":\"main@sha1:{rewritten}\"")));
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    assert_eq!(fleet["revision"], format!("main@sha1:{rewritten}"));
    assert!(fleet.get("forcePush").is_none(), "{fleet}");
    hub.stop().await;
}

/// Each commit is rendered since the last clean render, in the render process as
/// `flotilla serve` renders, and what the hub records for every cluster is what a
/// full render of that commit gives: after a change to one cluster, one overlay, one
/// workload, one group, and the same change undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_commit_rendered_since_the_last_records_what_a_full_render_gives() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let blue_token = make_token(state.path(), Some("blue")).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.render_worker = Some(flotilla_hub::render_worker::RenderWorker {
        program: env!("CARGO_BIN_EXE_flotilla").into(),
        memory_limit: None,
    });
    let hub = Running::start_ready(config).await;
    let client = client();
    let fleet_url = hub.url("/v1/fleet");
    let blue_url = hub.url("/v1/clusters/blue/bundle");
    let edit = |path: &str, from: &str, to: &str| {
        let text = repo.read(path);
        assert!(text.contains(from), "{path} holds {from:?}");
        repo.write(path, &text.replacen(from, to, 1));
    };
    let edits: [(&str, &str, &str); 5] = [
        (
            "clusters/store-us-001.yaml",
            "siteId: US-S001",
            "siteId: US-S001-B",
        ),
        (OVERLAY, "value: 200Gi", "value: 250Gi"),
        (
            "workloads/kuard/manifests/deployment.yaml",
            "replicas: 1",
            "replicas: 2",
        ),
        ("groups/apac.yaml", "currency: SGD", "currency: AUD"),
        (
            "clusters/store-us-001.yaml",
            "siteId: US-S001-B",
            "siteId: US-S001",
        ),
    ];
    for (path, from, to) in edits {
        edit(path, from, to);
        let commit = repo.commit(&format!("change {path}"));
        let revision = format!("main@sha1:{commit}");
        let fleet = eventually("the commit to be recorded", Duration::from_secs(30), || {
            let (client, url, admin, revision) = (&client, &fleet_url, &admin, &revision);
            async move {
                let fleet = get_json(client, url, admin).await;
                (fleet["revision"] == revision.as_str()).then_some(fleet)
            }
        })
        .await;
        let snapshot = flotilla_hub::source::from_folder(repo.path(), "").expect("reads");
        let full = flotilla_render::render(&snapshot);
        assert!(full.is_clean(), "{:?}", full.diagnostics);
        let recorded: std::collections::BTreeMap<String, String> = fleet["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .map(|c| {
                let name = c["name"].as_str().expect("name").to_string();
                (name, c["latest"].as_str().expect("latest").to_string())
            })
            .collect();
        let rendered: std::collections::BTreeMap<String, String> = full
            .bundles
            .iter()
            .map(|(name, bundle)| (name.clone(), bundle.digest.to_string()))
            .collect();
        assert_eq!(recorded, rendered, "after changing {path}");
        // What is served is whole: its resources make its digest, the one rendered
        // (blue is in no rollout, so it is served what HEAD renders).
        let (status, _, body) = get_bundle(&client, &blue_url, &blue_token, None).await;
        assert_eq!(status, 200);
        let served = verify_document(&body, Some("blue")).expect("a verified bundle");
        assert_eq!(served.digest.to_string(), rendered["blue"]);
        assert_eq!(served.resources, full.bundles["blue"].resources);
    }
    hub.stop().await;
}

/// A chart that generates a password: the hub derives it from its store's secret
/// seed (not the public one `flotilla render` uses), the same after a restart; and
/// `publish` without the hub's store refuses to publish it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_generates_its_values_from_the_hubs_own_seed() {
    let repo = Repo::new();
    repo.write(
        "charts/secretive/Chart.yaml",
        "apiVersion: v2\nname: secretive\nversion: 0.1.0\n",
    );
    repo.write(
        "charts/secretive/templates/secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ .Release.Name }}\nstringData:\n  password: {{ randAlphaNum 24 | quote }}\n",
    );
    repo.write(
        "workloads/secretive/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: secretive\nspec:\n  namespace: kuard\n  targets:\n    - cluster: red\n  helm:\n    chart: ../../charts/secretive\n",
    );
    repo.commit("a chart that generates a password");
    let password = |body: &[u8]| {
        let document = verify_document(body, Some("red")).expect("a verified bundle");
        document
            .resources
            .iter()
            .map(|r| r.value())
            .find(|r| r["kind"] == "Secret" && r["metadata"]["name"] == "secretive")
            .and_then(|r| r["stringData"]["password"].as_str().map(str::to_string))
            .expect("the chart's Secret")
    };
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let client = client();
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let (status, _, body) =
        get_bundle(&client, &hub.url("/v1/clusters/red/bundle"), &token, None).await;
    assert_eq!(status, 200);
    let served = password(&body);
    assert_eq!(served.len(), 24);
    hub.stop().await;

    // The public seed makes another one.
    let snapshot = flotilla_hub::source::from_git(repo.path(), "HEAD", "").expect("snapshot");
    let public = flotilla_render::render(&snapshot);
    let public = public.bundles["red"]
        .resources
        .iter()
        .map(|r| r.value())
        .find(|r| r["kind"] == "Secret")
        .expect("a Secret");
    assert_ne!(
        public["stringData"]["password"].as_str(),
        Some(served.as_str())
    );

    // A restarted hub on the same store makes the same one.
    let admin = make_token(state.path(), None).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let (_, _, body) = get_bundle(&client, &hub.url("/v1/clusters/red/bundle"), &token, None).await;
    assert_eq!(password(&body), served);
    // The fleet summary and the web page name each Helm workload's chart.
    let fleet = eventually(
        "the fleet to name its charts",
        Duration::from_secs(10),
        || {
            let (client, url, admin) = (&client, hub.url("/v1/fleet"), &admin);
            async move {
                let fleet = get_json(client, &url, admin).await;
                (!fleet["charts"].is_null()).then_some(fleet)
            }
        },
    )
    .await;
    assert_eq!(
        fleet["charts"],
        serde_json::json!({
            "menu-board": "menu-board 0.3.1 (charts/menu-board)",
            "secretive": "secretive 0.1.0 (charts/secretive)"
        })
    );
    let web = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = web
        .post(hub.url("/ui/login"))
        .header("origin", hub.url("").trim_end_matches('/'))
        .form(&[("token", admin.as_str())])
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 303);
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = web
        .get(hub.url("/ui/"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("the fleet page");
    assert_eq!(page.status(), 200);
    let page = page.text().await.expect("the fleet page");
    assert!(
        page.contains(
            "<code>menu-board 0.3.1 (charts&#x2f;menu-board)</code> (workload menu-board)"
        ),
        "{page}"
    );
    let token_file = state.path().join("admin.token");
    std::fs::write(&token_file, &admin).expect("token file");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "status",
            "--server",
            hub.url("").trim_end_matches('/'),
            "--token-file",
        ])
        .arg(&token_file)
        .env("NO_COLOR", "1")
        .output()
        .expect("flotilla status runs");
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains("chart      menu-board 0.3.1 (charts/menu-board): workload menu-board\n"),
        "{table}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    hub.stop().await;

    // publish without the hub's store would serve a guessable password: refused.
    let out = tempfile::tempdir().expect("out");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--repo"])
        .arg(repo.path())
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("flotilla publish runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("public seed") && stderr.contains("--state-dir"),
        "{stderr}"
    );
    // With the hub's store it publishes what the hub serves.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--repo"])
        .arg(repo.path())
        .arg("--out")
        .arg(out.path())
        .arg("--state-dir")
        .arg(state.path())
        .output()
        .expect("flotilla publish runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let published = std::fs::read(out.path().join("v1/clusters/red/bundle")).expect("red's bundle");
    assert_eq!(password(&published), served);
}

/// Logs in to the web page with `token`; the session cookie (`name=value`).
async fn web_session(hub: &Running, token: &str) -> (reqwest::Client, String) {
    let web = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = web
        .post(hub.url("/ui/login"))
        .header("origin", &hub.base)
        .form(&[("token", token)])
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 303);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .split(';')
        .next()
        .expect("name=value")
        .to_string();
    (web, cookie)
}

async fn fleet_page(hub: &Running, web: &reqwest::Client, cookie: &str) -> String {
    web.get(hub.url("/ui/"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("body")
}

async fn readyz(client: &reqwest::Client, hub: &Running) -> (u16, serde_json::Value) {
    let response = client.get(hub.url("/readyz")).send().await.expect("readyz");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

/// `flotilla status` against the hub: its exit code and what it printed.
async fn run_status(hub: &Running, token_file: &std::path::Path, args: &[&str]) -> (i32, String) {
    let (base, token_file) = (hub.base.clone(), token_file.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["status", "--server", &base])
            .args(&args)
            .arg("--token-file")
            .arg(&token_file)
            .env_remove("FLOTILLA_SERVER")
            .env_remove("FLOTILLA_TOKEN_FILE")
            .output()
            .expect("flotilla runs");
        (
            output.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    })
    .await
    .expect("status")
}

/// A clean commit the hub cannot install keeps the last good bundles served and says
/// why (the path and the operating system's error) in `/v1/fleet`, the web page and
/// `flotilla status`, and that it fails in `/readyz` and `/metrics`; once the cause is
/// repaired, a later poll installs the commit and the error clears. The objects folder
/// is replaced by a file, which stops the write for root too (file modes do not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_hub_cannot_install_shows_why_until_it_installs() {
    let repo = Repo::new();
    let good = format!("main@sha1:{}", repo.git(&["rev-parse", "HEAD"]));
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let token_file = state.path().join("admin.token");
    std::fs::write(&token_file, &admin).expect("token file");
    let mut config = config(state.path(), &repo.path().display().to_string());
    // A failed install is tried again at every poll, as in production.
    config.poll_interval = Duration::from_millis(100);
    let hub = Running::start_ready(config).await;
    let client = client();
    let fleet_url = hub.url("/v1/fleet");
    let before = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(before["revision"], good);
    assert_eq!(before["installError"], serde_json::Value::Null);
    assert_eq!(readyz(&client, &hub).await.1["install"], "ok");

    let objects = state.path().join("objects/sha256");
    let away = state.path().join("objects/sha256.away");
    std::fs::rename(&objects, &away).expect("move the objects folder away");
    std::fs::write(&objects, b"not a folder").expect("a file where the folder was");
    bump_store_us_002(&repo, "300Gi");
    let commit = repo.commit("more cache for store-us-002");
    let new = format!("main@sha1:{commit}");
    let fleet = eventually("the install error to show", Duration::from_secs(10), || {
        let (client, url, admin, new) = (&client, &fleet_url, &admin, &new);
        async move {
            let fleet = get_json(client, url, admin).await;
            (fleet["installError"]["revision"] == new.as_str()).then_some(fleet)
        }
    })
    .await;
    assert_eq!(fleet["revision"], good, "the last good render stays served");
    assert_eq!(fleet["renderErrors"], serde_json::json!([]), "{fleet:#}");
    let message = fleet["installError"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("cannot write object ")
            && message.contains("/objects/sha256/")
            && message.contains("Not a directory (os error 20)"),
        "the cause names the path and the OS error: {message}"
    );
    let since = fleet["installError"]["since"].as_str().expect("since");
    assert!(since.ends_with('Z'), "{since}");
    let store_us_002 = |fleet: &serde_json::Value| {
        fleet["clusters"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "store-us-002"))
            .map(|c| c["desired"].clone())
            .expect("store-us-002")
    };
    assert_eq!(store_us_002(&fleet), store_us_002(&before));

    // Ready all the same (the last good bundles are served), saying the newest commit
    // is not installed, without the paths of the hub's host.
    let (status, ready) = readyz(&client, &hub).await;
    assert_eq!(
        (status, &ready["install"]),
        (200, &serde_json::json!("failing"))
    );
    assert!(!ready.to_string().contains("objects"), "{ready}");
    assert_eq!(metric(&client, &hub.base, "flotilla_install_up").await, 0.0);

    // Retried at every poll: still failing, since the first failure.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(again["installError"]["since"], since);

    let (code, table) = run_status(&hub, &token_file, &[]).await;
    assert_eq!(code, 0, "{table}");
    let line = table
        .lines()
        .find(|l| l.starts_with("install "))
        .unwrap_or_else(|| panic!("no install line in:\n{table}"));
    assert!(
        line.contains(&format!("main@{}", &commit[..10]))
            && line.contains("cannot be installed")
            && line.contains("Not a directory (os error 20)"),
        "{line}"
    );
    let (code, json) = run_status(&hub, &token_file, &["-o", "json"]).await;
    assert_eq!(code, 0, "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["installError"], fleet["installError"]);
    // Each cluster with every field `GET /v1/fleet` gives it (values such as
    // `silentForSeconds` move between the two reads; the fields do not).
    let fields = |cluster: &serde_json::Value| -> Vec<String> {
        let mut keys: Vec<String> = cluster
            .as_object()
            .expect("a cluster object")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    };
    let listed = json["clusters"].as_array().expect("clusters");
    assert_eq!(
        listed.len(),
        fleet["clusters"].as_array().expect("clusters").len()
    );
    for cluster in listed {
        let hub_entry = fleet["clusters"]
            .as_array()
            .and_then(|all| all.iter().find(|c| c["name"] == cluster["name"]))
            .expect("the same cluster in /v1/fleet");
        assert_eq!(fields(cluster), fields(hub_entry), "{}", cluster["name"]);
    }
    let (web, cookie) = web_session(&hub, &admin).await;
    let page = fleet_page(&hub, &web, &cookie).await;
    let banner = page
        .lines()
        .find(|l| l.contains("id=\"install-error\""))
        .unwrap_or_else(|| panic!("no install error on the page:\n{page}"));
    assert!(
        banner.contains(&new) && banner.contains("Not a directory (os error 20)"),
        "{banner}"
    );

    // Repaired: the next poll installs the commit, and the error clears everywhere.
    std::fs::remove_file(&objects).expect("remove the file");
    std::fs::rename(&away, &objects).expect("the objects folder back");
    let fleet = eventually(
        "the commit to be installed",
        Duration::from_secs(10),
        || {
            let (client, url, admin, new) = (&client, &fleet_url, &admin, &new);
            async move {
                let fleet = get_json(client, url, admin).await;
                (fleet["revision"] == new.as_str()).then_some(fleet)
            }
        },
    )
    .await;
    assert_eq!(fleet["installError"], serde_json::Value::Null);
    assert_ne!(store_us_002(&fleet), store_us_002(&before));
    assert_eq!(readyz(&client, &hub).await.1["install"], "ok");
    assert_eq!(metric(&client, &hub.base, "flotilla_install_up").await, 1.0);
    let (_, table) = run_status(&hub, &token_file, &[]).await;
    assert!(!table.contains("cannot be installed"), "{table}");
    let page = fleet_page(&hub, &web, &cookie).await;
    assert!(!page.contains("install-error"), "{page}");
    hub.stop().await;
}

/// Under `validation: strict` in flotilla.yaml a schema problem is a render error:
/// the hub keeps the last good bundles served and shows the problem; under the
/// default (`warn`) the same commit is served, with the problem as a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_problem_is_served_under_warn_and_refused_under_strict() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let token_file = state.path().join("admin.token");
    std::fs::write(&token_file, &admin).expect("token file");
    let red = make_token(state.path(), Some("red")).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let fleet_url = hub.url("/v1/fleet");
    let red_url = hub.url("/v1/clusters/red/bundle");
    let served = |revision: String| {
        let (client, url, admin) = (&client, &fleet_url, &admin);
        async move {
            let fleet = get_json(client, url, admin).await;
            (fleet["attemptedRevision"] == format!("main@sha1:{revision}")).then_some(fleet)
        }
    };
    const DEPLOYMENT: &str = "workloads/kuard/manifests/deployment.yaml";

    // The typo under the default: served, the bundle carries it.
    let text = repo
        .read(DEPLOYMENT)
        .replace("  replicas: 1\n", "  replica: 3\n");
    repo.write(DEPLOYMENT, &text);
    let warned = repo.commit("a typo, under validation: warn");
    let fleet = eventually("the typo to be tried", Duration::from_secs(1), || {
        served(warned.clone())
    })
    .await;
    assert_eq!(fleet["revision"], format!("main@sha1:{warned}"), "served");
    let (status, _, body) = get_bundle(&client, &red_url, &red, None).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("\"replica\":3"));
    // The warning is shown where the fleet is watched: /v1/fleet, the page,
    // `flotilla status` and the metrics.
    let warnings = &fleet["renderWarnings"];
    let text = warnings["shown"]
        .as_array()
        .and_then(|shown| {
            shown.iter().find(|w| {
                w["file"] == DEPLOYMENT
                    && w["severity"] == "warning"
                    && w["text"].as_str().is_some_and(|t| {
                        t.contains("spec.replica: unknown field (did you mean \"replicas\"?)")
                    })
            })
        })
        .and_then(|w| w["text"].as_str())
        .unwrap_or_else(|| panic!("the typo is a render warning: {warnings:#}"));
    let total = warnings["total"].as_u64().expect("total");
    assert_eq!(
        warnings["shown"].as_array().map(Vec::len),
        Some(total as usize)
    );
    let (web, cookie) = web_session(&hub, &admin).await;
    let page = fleet_page(&hub, &web, &cookie).await;
    assert!(
        page.contains("id=\"render-warnings\"")
            && page.contains(&format!("{total} render warning"))
            && page.contains("spec.replica: unknown field"),
        "{page}"
    );
    let (code, table) = run_status(&hub, &token_file, &[]).await;
    assert_eq!(code, 0, "{table}");
    assert!(
        table.contains(&format!("warnings   {total} in the last render")) && table.contains(text),
        "{table}"
    );
    let (_, json) = run_status(&hub, &token_file, &["-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["renderWarnings"], *warnings);
    assert_eq!(
        metric(&client, &hub.base, "flotilla_render_warnings").await,
        total as f64
    );

    // The same typo under strict: refused, the last good render stays served.
    repo.write(
        "flotilla.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n  validation: strict\n",
    );
    let refused = repo.commit("validation: strict");
    let fleet = eventually(
        "the strict commit to be tried",
        Duration::from_secs(1),
        || served(refused.clone()),
    )
    .await;
    assert_eq!(
        fleet["revision"],
        format!("main@sha1:{warned}"),
        "not served"
    );
    let errors = fleet["renderErrors"].as_array().expect("errors");
    assert!(
        errors.iter().any(|e| e["file"] == DEPLOYMENT
            && e["line"] == 1
            && e["text"].as_str().is_some_and(|t| t
                .contains("spec.replica: unknown field (did you mean \"replicas\"?)")
                && t.contains("cluster "))),
        "the error names the file, line, cluster and field: {errors:#?}"
    );
    assert!(
        fleet["renderWarnings"].is_null(),
        "an error is not also a warning: {fleet:#}"
    );
    // `flotilla status -o json` gives the errors as the hub does, every field.
    let (_, json) = run_status(&hub, &token_file, &["-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["renderErrors"], fleet["renderErrors"]);
    hub.stop().await;
}
