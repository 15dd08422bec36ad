//! Rollouts at 10,000 clusters, through the real hub (in-process, HTTP on loopback),
//! with the agents simulated in this process:
//!
//! 1. a wave release reaching its agents: every agent of the second wave holds a
//!    long-poll naming the digest it runs; the canaries bake; the clock moves past the
//!    bake; the time until the last held long-poll of the wave has its new bundle;
//! 2. decision after a report: the agents of the released wave post their status
//!    reports one at a time (each is decided on before the hub answers): the latency
//!    of those POSTs, whole path (HTTP, the store's write, the decision, its record).
//!
//! ```text
//! cargo run --release --example rollout_scale [-- --clusters 10000]
//! ```

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::future::join_all;
use serde_json::json;

use flotilla_hub::auth::new_token;
use flotilla_hub::clock::ManualClock;
use flotilla_hub::store::Store;
use flotilla_hub::{Hub, HubConfig, SourceSpec};

#[path = "support/repo.rs"]
mod repo;
use repo::{git, until_long_polls_held, write};

fn set_version(dir: &Path, version: &str) {
    write(
        dir,
        "workloads/app/workload.yaml",
        &format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: app\n  targets:\n    - clusterSelector: {{}}\n  vars:\n    version: {version}\n"
        ),
    );
}

fn median(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.9), at(0.99))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let clusters: usize = std::env::args()
        .skip_while(|a| a != "--clusters")
        .nth(1)
        .map(|n| n.parse().expect("--clusters N"))
        .unwrap_or(10_000);
    let repo = tempfile::tempdir().expect("temp dir");
    let dir = repo.path();
    for i in 0..clusters {
        write(
            dir,
            &format!("clusters/store-{i:05}.yaml"),
            &format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: store-{i:05}\n  labels: {{kind: store}}\n"
            ),
        );
    }
    write(
        dir,
        "workloads/app/manifests/config.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  version: \"{{ vars.version }}\"\n  site: \"{{ cluster.name }}\"\n",
    );
    write(
        dir,
        "rollouts/stores.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: RolloutPolicy\nmetadata:\n  name: stores\nspec:\n  clusterSelector: {matchLabels: {kind: store}}\n  waves:\n    - {name: canary, percent: 1, bake: 15m}\n    - {name: tenth, percent: 10, bake: 30m}\n    - {name: half, percent: 50, bake: 30m, maxParallel: \"10%\"}\n    - {name: rest, maxParallel: \"10%\"}\n",
    );
    set_version(dir, "v1");
    git(dir, &["init", "--quiet", "--initial-branch=main"]);
    git(dir, &["add", "--all"]);
    git(
        dir,
        &[
            "commit",
            "--quiet",
            "-m",
            "v1\n\nFlotilla-Rollout: immediate",
        ],
    );

    let state = tempfile::tempdir().expect("state dir");
    let mut tokens = Vec::with_capacity(clusters);
    {
        let store = Store::open(state.path()).await.expect("store");
        for i in 0..clusters {
            let token = new_token(Some(&format!("store-{i:05}")), 0);
            store.insert_token(&token.stored).await.expect("token");
            tokens.push(token.secret);
        }
        let admin = new_token(None, 0);
        store.insert_token(&admin.stored).await.expect("token");
        tokens.push(admin.secret);
        store.close().await;
    }
    let admin = tokens.pop().expect("admin");
    let clock = Arc::new(ManualClock::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_736_899_200),
    ));
    let mut config = HubConfig::new(
        state.path(),
        SourceSpec {
            repo: dir.display().to_string(),
            branch: None,
            path: String::new(),
            worktree: false,
        },
    );
    config.clock = clock.clone();
    config.poll_interval = Duration::from_secs(3600);
    // The bench moves the clock by whole bakes: agents count as seen for two hours.
    config.offline_after = Duration::from_secs(7200);
    let hub = Hub::start(config).await.expect("hub");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(hub.serve(listener, async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(2_000)
        .build()
        .expect("client");
    let name = |i: usize| format!("store-{i:05}");
    // Wait for the first render.
    loop {
        let fleet = client
            .get(format!("{base}/v1/fleet"))
            .bearer_auth(&admin)
            .send()
            .await;
        if let Ok(r) = fleet
            && r.status() == 200
            && r.json::<serde_json::Value>()
                .await
                .is_ok_and(|f| f["revision"].is_string())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{clusters} clusters rendered and served");

    // Every agent fetches v1.
    let mut runs = vec![String::new(); clusters];
    for chunk in (0..clusters).collect::<Vec<_>>().chunks(500) {
        let fetched = join_all(chunk.iter().map(|&i| {
            let (client, url, token) = (
                client.clone(),
                format!("{base}/v1/clusters/{}/bundle", name(i)),
                tokens[i].clone(),
            );
            async move {
                let response = client
                    .get(url)
                    .bearer_auth(token)
                    .send()
                    .await
                    .expect("get");
                let etag = response.headers()["etag"]
                    .to_str()
                    .expect("etag")
                    .to_string();
                (i, etag.trim_matches('"').to_string())
            }
        }))
        .await;
        for (i, digest) in fetched {
            runs[i] = digest;
        }
    }
    let report = |i: usize, digest: &str| {
        client
            .post(format!("{base}/v1/clusters/{}/status", name(i)))
            .bearer_auth(&tokens[i])
            .json(
                &json!({"applied": digest, "attempted": digest, "resources": [],
                          "message": "", "agentVersion": "bench"}),
            )
            .send()
    };
    // A hub on an empty store waits the offline threshold before it releases a wave;
    // then every agent polls (an unchanged poll counts as seen), so that none is
    // offline when v2's first wave is released.
    clock.advance(Duration::from_secs(7201));
    for chunk in (0..clusters).collect::<Vec<_>>().chunks(500) {
        join_all(chunk.iter().map(|&i| {
            let (client, url, token, runs) = (
                client.clone(),
                format!("{base}/v1/clusters/{}/bundle", name(i)),
                tokens[i].clone(),
                format!("\"{}\"", runs[i]),
            );
            async move {
                let response = client
                    .get(url)
                    .bearer_auth(token)
                    .header("If-None-Match", runs)
                    .send()
                    .await
                    .expect("poll");
                assert_eq!(response.status(), 304, "an unchanged poll");
            }
        }))
        .await;
    }

    // v2: the canaries (1%) are released at once; the tenth wave long-polls.
    set_version(dir, "v2");
    git(dir, &["commit", "--quiet", "-am", "v2"]);
    let v2 = String::from_utf8(
        Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(dir)
            .output()
            .expect("git rev-parse")
            .stdout,
    )
    .expect("a commit id")
    .trim()
    .to_string();
    let rollout = loop {
        let list: serde_json::Value = client
            .get(format!("{base}/v1/rollouts"))
            .bearer_auth(&admin)
            .send()
            .await
            .expect("rollouts")
            .json()
            .await
            .expect("json");
        if let Some(r) = list["rollouts"].as_array().and_then(|l| {
            l.iter().find(|r| {
                r["waves"][0]["state"] == "released"
                    && r["forced"] == false
                    && r["revision"].as_str().is_some_and(|rev| rev.ends_with(&v2))
            })
        }) {
            break r["id"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let detail: serde_json::Value = client
        .get(format!("{base}/v1/rollouts/{rollout}"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("detail")
        .json()
        .await
        .expect("json");
    let index_of = |cluster: &str| -> usize { cluster["store-".len()..].parse().expect("index") };
    let in_wave = |wave: &str| -> Vec<usize> {
        detail["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .filter(|c| c["wave"] == wave)
            .map(|c| index_of(c["name"].as_str().expect("name")))
            .collect()
    };
    let (canaries, tenth) = (in_wave("canary"), in_wave("tenth"));
    println!(
        "canary wave: {} clusters, tenth wave: {} clusters",
        canaries.len(),
        tenth.len()
    );
    let held: Vec<_> = tenth
        .iter()
        .map(|&i| {
            let (client, url, token, runs) = (
                client.clone(),
                format!("{base}/v1/clusters/{}/bundle?wait=60s", name(i)),
                tokens[i].clone(),
                format!("\"{}\"", runs[i]),
            );
            tokio::spawn(async move {
                let response = client
                    .get(url)
                    .bearer_auth(token)
                    .header("If-None-Match", runs)
                    .send()
                    .await
                    .expect("long-poll");
                let status = response.status().as_u16();
                let _ = response.bytes().await;
                (status, Instant::now())
            })
        })
        .collect();
    for &i in &canaries {
        let response = client
            .get(format!("{base}/v1/clusters/{}/bundle", name(i)))
            .bearer_auth(&tokens[i])
            .send()
            .await
            .expect("get");
        let digest = response.headers()["etag"]
            .to_str()
            .expect("etag")
            .trim_matches('"')
            .to_string();
        report(i, &digest).await.expect("report");
    }
    // Once every long-poll is held, the clock moves past the canaries' bake.
    until_long_polls_held(&client, &base, tenth.len()).await;
    let trigger = Instant::now();
    clock.advance(Duration::from_secs(15 * 60 + 1));
    let answers = join_all(held).await;
    let last = answers
        .iter()
        .filter_map(|a| a.as_ref().ok())
        .filter(|(status, _)| *status == 200)
        .map(|(_, at)| at.duration_since(trigger))
        .max()
        .unwrap_or_default();
    let released = answers
        .iter()
        .filter(|a| a.as_ref().is_ok_and(|(s, _)| *s == 200))
        .count();
    println!(
        "wave release: {released} of {} held long-polls answered with the new bundle; the last {:.0} ms after the bake ended",
        tenth.len(),
        last.as_secs_f64() * 1e3
    );
    // Reports from the released wave, one at a time: each is stored, decided on and
    // recorded before the hub answers.
    let mut latencies = Vec::with_capacity(tenth.len());
    for &i in &tenth {
        let started = Instant::now();
        let response = report(i, &runs[i]).await.expect("report");
        assert_eq!(response.status(), 200);
        latencies.push(started.elapsed());
    }
    let (p50, p90, p99) = median(latencies);
    println!(
        "status report answered (stored, decided, recorded), {clusters} clusters, {} reports: median {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        tenth.len(),
        p50.as_secs_f64() * 1e3,
        p90.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    let _ = stop.send(());
    let _ = served.await;
}
