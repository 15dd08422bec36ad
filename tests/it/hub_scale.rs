//! Many agents at once, and restarts: 1,000 long-polls are held and then released
//! (by a commit, and by shutdown), and a restarted hub serves the same bundles from
//! its store before it has rendered anything.

use crate::support::hub as hub_common;

use std::time::{Duration, Instant};

use futures::future::join_all;

use hub_common::*;

const AGENTS: usize = 1_000;

fn spawn_polls(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    etag: &str,
) -> Vec<tokio::task::JoinHandle<(u16, Option<String>)>> {
    (0..AGENTS)
        .map(|_| {
            let (client, url, token, etag) = (
                client.clone(),
                url.to_string(),
                token.to_string(),
                etag.to_string(),
            );
            tokio::spawn(async move {
                let (status, etag, _) =
                    get_bundle(&client, &format!("{url}?wait=60s"), &token, Some(&etag)).await;
                (status, etag)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_long_polls_are_held_then_released_by_a_commit_and_by_shutdown() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    // A thousand agents, all of one cluster.
    config.requests.max_polls_per_cluster = AGENTS;
    let mut hub = Running::start_ready(config).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(AGENTS)
        .build()
        .expect("client");
    let url = hub.url("/v1/clusters/red/bundle");
    let (_, etag, _) = get_bundle(&client, &url, &token, None).await;
    let etag = etag.expect("an ETag");

    // Released by a commit: every one answers 200 with the new ETag.
    let polls = spawn_polls(&client, &url, &token, &etag);
    until_polls_held(&client, &hub.base, AGENTS, Duration::from_secs(30)).await;
    let overlay = repo
        .read("overlays/demo/kuard-red.yaml")
        .replace("newTag: red", "newTag: scarlet");
    repo.write("overlays/demo/kuard-red.yaml", &overlay);
    let committed = Instant::now();
    repo.commit("scarlet");
    let answers = join_all(polls).await;
    let released = committed.elapsed();
    let new_etag = answers[0]
        .as_ref()
        .expect("task")
        .1
        .clone()
        .expect("an ETag");
    assert_ne!(new_etag, etag);
    for answer in &answers {
        let (status, etag) = answer.as_ref().expect("task");
        assert_eq!((*status, etag.as_deref()), (200, Some(new_etag.as_str())));
    }
    eprintln!("{AGENTS} long-polls answered {released:?} after the commit");
    assert_eq!(
        metric(&client, &hub.base, "flotilla_long_polls_held").await,
        0.0
    );

    // Released by shutdown: every one answers 304 at once, long before its wait ends.
    let polls = spawn_polls(&client, &url, &token, &new_etag);
    until_polls_held(&client, &hub.base, AGENTS, Duration::from_secs(30)).await;
    let stopping = Instant::now();
    hub.signal_stop();
    let answers = join_all(polls).await;
    for answer in &answers {
        let (status, _) = answer.as_ref().expect("task");
        assert_eq!(*status, 304);
    }
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "shutdown released the long-polls in {:?}",
        stopping.elapsed()
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_hub_serves_the_same_bundles_before_rendering() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let repo_path = repo.path().display().to_string();
    let hub = Running::start_ready(config(state.path(), &repo_path)).await;
    let client = client();
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    let names: Vec<String> = fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_string())
        .collect();
    assert_eq!(names.len(), 14);
    let mut before = Vec::new();
    for name in &names {
        let url = hub.url(&format!("/v1/clusters/{name}/bundle"));
        let (status, etag, body) = get_bundle(&client, &url, &admin, None).await;
        assert_eq!(status, 200);
        before.push((etag.expect("an ETag"), body));
    }
    hub.stop().await;

    // Without its repository the new hub cannot render at all: whatever it serves
    // comes from the store.
    let moved = tempfile::tempdir().expect("elsewhere");
    std::fs::rename(repo.path(), moved.path().join("repo")).expect("move the repository away");
    let hub = Running::start(config(state.path(), &repo_path)).await;
    let ready = client.get(hub.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200, "ready as soon as the store is loaded");
    for (name, (etag, body)) in names.iter().zip(&before) {
        let url = hub.url(&format!("/v1/clusters/{name}/bundle"));
        let (status, same_etag, same_body) = get_bundle(&client, &url, &admin, None).await;
        assert_eq!(status, 200, "{name}");
        assert_eq!(same_etag.as_ref(), Some(etag), "{name}: the same ETag");
        assert_eq!(&same_body, body, "{name}: the same bytes");
        let (status, _, _) = get_bundle(&client, &url, &admin, Some(etag)).await;
        assert_eq!(status, 304, "{name}: an agent's ETag still matches");
    }
    let fleet = eventually("the source error to show", Duration::from_secs(5), || {
        let (client, url, admin) = (&client, hub.url("/v1/fleet"), &admin);
        async move {
            let fleet = get_json(client, &url, admin).await;
            fleet["sourceError"].is_string().then_some(fleet)
        }
    })
    .await;
    assert_eq!(fleet["clusters"].as_array().map(Vec::len), Some(14));
    assert_eq!(metric(&client, &hub.base, "flotilla_source_up").await, 0.0);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_stored_bundle_is_never_served_and_is_written_again() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let repo_path = repo.path().display().to_string();
    let hub = Running::start_ready(config(state.path(), &repo_path)).await;
    let client = client();
    let url = hub.url("/v1/clusters/red/bundle");
    let (_, etag, body) = get_bundle(&client, &url, &token, None).await;
    let etag = etag.expect("an ETag");
    hub.stop().await;

    let hex = etag
        .trim_matches('"')
        .trim_start_matches("sha256:")
        .to_string();
    let object = state.path().join("objects/sha256").join(hex);
    std::fs::write(&object, b"[{\"kind\":\"tampered\"}]").expect("corrupt the object");

    let hub = Running::start(config(state.path(), &repo_path)).await;
    let url = hub.url("/v1/clusters/red/bundle");
    let repaired = eventually(
        "the object to be written again",
        Duration::from_secs(5),
        || {
            let (client, url, token, etag) = (&client, &url, &token, &etag);
            async move {
                let (status, same_etag, repaired) = get_bundle(client, url, token, None).await;
                assert_ne!(status / 100, 4, "unexpected {status}");
                // Never the tampered content: a 500 until the object is good again.
                (status == 200).then(|| {
                    assert_eq!(same_etag.as_deref(), Some(etag.as_str()));
                    repaired
                })
            }
        },
    )
    .await;
    assert_eq!(repaired, body);
    hub.stop().await;
}
