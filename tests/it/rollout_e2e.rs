//! Rollouts end to end: the real hub (in-process, port 0) following a real Git
//! repository, with simulated agents that poll their bundle (with `If-None-Match`)
//! and post status reports over HTTP, on a clock the test moves by hand.
//!
//! The fleet: canaries `c1` (and `c2` where a test needs two), stores `s1`..`s4`,
//! all labelled `kind: store` and governed by `rollouts/stores.yaml`, and `lab`,
//! which no policy governs. One workload whose ConfigMap carries `vars.version`:
//! each commit that changes the version changes every cluster's bundle.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::support::hub::*;
use flotilla_hub::clock::ManualClock;
use flotilla_hub::store::Database;

/// Wednesday 2025-01-15 00:00 UTC.
pub(crate) const START: u64 = 1_736_899_200;

pub(crate) const POLICY: &str = "apiVersion: flotilla.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: stores
spec:
  clusterSelector: {matchLabels: {kind: store}}
  waves:
    - {name: canary, groups: [canary], bake: 15m}
    - {name: rest}
";

/// The test's fleet in a Git repository.
pub(crate) struct Fleet {
    pub(crate) repo: Repo,
    canaries: Vec<&'static str>,
}

impl Fleet {
    pub(crate) fn new(canaries: &[&'static str], policy: &str) -> Fleet {
        let fleet = Fleet {
            repo: Repo::empty(),
            canaries: canaries.to_vec(),
        };
        for name in fleet.clusters() {
            fleet.write_cluster(name, false);
        }
        fleet.repo.write(
            "groups/canary.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Group\nmetadata:\n  name: canary\nspec:\n  selector: {matchLabels: {tier: canary}}\n",
        );
        fleet.repo.write(
            "workloads/app/manifests/config.yaml.j2",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  version: \"{{ vars.version }}\"\n  cluster: \"{{ cluster.name }}\"\n",
        );
        fleet.set_version("v1");
        fleet.repo.write("rollouts/stores.yaml", policy);
        fleet
    }

    pub(crate) fn clusters(&self) -> Vec<&'static str> {
        let mut names = self.canaries.clone();
        names.extend(["s1", "s2", "s3", "s4", "lab"]);
        names
    }

    pub(crate) fn write_cluster(&self, name: &str, paused: bool) {
        let labels = if name == "lab" {
            "{kind: lab}"
        } else if self.canaries.contains(&name) {
            "{kind: store, tier: canary}"
        } else {
            "{kind: store, tier: stable}"
        };
        self.repo.write(
            &format!("clusters/{name}.yaml"),
            &format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  paused: {paused}\n"
            ),
        );
    }

    pub(crate) fn set_version(&self, version: &str) {
        self.repo.write(
            "workloads/app/workload.yaml",
            &format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: app\n  targets:\n    - clusterSelector: {{}}\n  vars:\n    version: {version}\n"
            ),
        );
    }

    /// Commits a new version and returns the revision the hub will name.
    pub(crate) fn release(&self, version: &str, message: &str) -> String {
        self.set_version(version);
        format!("main@sha1:{}", self.repo.commit(message))
    }
}

/// The hub on the fleet, agents for its clusters and an admin token.
pub(crate) struct Scene {
    pub(crate) fleet: Fleet,
    pub(crate) state: tempfile::TempDir,
    pub(crate) hub: Option<Running>,
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) client: reqwest::Client,
    pub(crate) admin: String,
    pub(crate) tokens: BTreeMap<String, String>,
    /// What each simulated agent runs.
    pub(crate) runs: BTreeMap<String, String>,
    /// The hub's database (its state dir's SQLite file unless a test says otherwise).
    pub(crate) database: Database,
}

impl Scene {
    /// Starts a hub on an empty store with the fleet at v1 committed with the
    /// immediate trailer, so every agent fetches v1 at once; every agent then fetches
    /// and reports, and the first rollout completes.
    pub(crate) async fn at_v1(canaries: &[&'static str], policy: &str) -> Scene {
        Scene::at_v1_on(canaries, policy, Database::StateDir).await
    }

    /// [`Scene::at_v1`], with the hub's tables in `database`.
    pub(crate) async fn at_v1_on(
        canaries: &[&'static str],
        policy: &str,
        database: Database,
    ) -> Scene {
        let fleet = Fleet::new(canaries, policy);
        let first = format!(
            "main@sha1:{}",
            fleet.repo.commit("v1\n\nFlotilla-Rollout: immediate")
        );
        let state = tempfile::tempdir().expect("state dir");
        let clock = Arc::new(ManualClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(START),
        ));
        let mut scene = Scene {
            admin: make_token_in(state.path(), &database, None).await,
            tokens: BTreeMap::new(),
            fleet,
            state,
            hub: None,
            clock,
            client: client(),
            runs: BTreeMap::new(),
            database,
        };
        for name in scene.fleet.clusters() {
            let token = make_token_in(scene.state.path(), &scene.database, Some(name)).await;
            scene.tokens.insert(name.to_string(), token);
        }
        scene.start().await;
        scene.wait_revision(&first).await;
        // On PostgreSQL the hub renders before it holds the rollout lease, and serves
        // once it has recorded that render.
        let expected = scene.fleet.clusters().len();
        eventually(
            "every cluster to be served",
            Duration::from_secs(20),
            || {
                let scene = &scene;
                async move {
                    let fleet = scene.fleet().await;
                    (fleet["clusters"].as_array()?.len() == expected).then_some(())
                }
            },
        )
        .await;
        scene.all_check_in(&[]).await;
        // The canaries bake (a forced rollout still bakes), then it is complete.
        scene.advance(15, &[]).await;
        scene.wait_rollout_state(&first, "complete").await;
        scene
    }

    pub(crate) async fn start(&mut self) {
        let mut config = config(
            self.state.path(),
            &self.fleet.repo.path().display().to_string(),
        );
        config.clock = self.clock.clone();
        config.database = self.database.clone();
        self.hub = Some(Running::start_ready(config).await);
    }

    /// The hub's state dir (its database) is lost: a new, empty one, with new tokens
    /// for the admin and every cluster. Call it while the hub is stopped.
    pub(crate) async fn lose_the_store(&mut self) {
        self.state = tempfile::tempdir().expect("new state dir");
        self.admin = make_token(self.state.path(), None).await;
        for name in self.fleet.clusters() {
            let token = make_token(self.state.path(), Some(name)).await;
            self.tokens.insert(name.to_string(), token);
        }
    }

    /// The hub stops and loses its database; meanwhile v2 is committed; a hub on the
    /// new, empty store starts and renders it. Returns v2's revision.
    pub(crate) async fn v2_on_a_lost_store(&mut self) -> String {
        self.stop().await;
        let v2 = self.fleet.release("v2", "v2");
        self.lose_the_store().await;
        self.start().await;
        self.wait_revision(&v2).await;
        v2
    }

    pub(crate) async fn stop(&mut self) {
        if let Some(hub) = self.hub.take() {
            hub.stop().await;
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        self.hub.as_ref().expect("the hub runs").url(path)
    }

    /// One poll of a cluster's bundle, naming the digest its agent runs; the agent
    /// takes what it is sent. Returns the status code.
    pub(crate) async fn poll(&mut self, cluster: &str) -> u16 {
        let url = self.url(&format!("/v1/clusters/{cluster}/bundle"));
        let runs = self.runs.get(cluster).map(|d| format!("\"{d}\""));
        let (status, etag, body) =
            get_bundle(&self.client, &url, &self.tokens[cluster], runs.as_deref()).await;
        if status == 200 {
            let document: Value = serde_json::from_slice(&body).expect("a bundle");
            let digest = document["digest"].as_str().expect("digest").to_string();
            assert_eq!(etag.as_deref(), Some(format!("\"{digest}\"").as_str()));
            self.runs.insert(cluster.to_string(), digest);
        }
        status
    }

    /// The agent reports what it runs: healthy, or with a failed Deployment.
    pub(crate) async fn report(&self, cluster: &str, healthy: bool) {
        let runs = self.runs.get(cluster).cloned();
        let resources = if healthy {
            json!([])
        } else {
            json!([{"group": "apps", "kind": "Deployment", "namespace": "app", "name": "app",
                    "state": "failed", "message": "CrashLoopBackOff"}])
        };
        let response = self
            .client
            .post(self.url(&format!("/v1/clusters/{cluster}/status")))
            .bearer_auth(&self.tokens[cluster])
            .json(
                &json!({"applied": runs, "attempted": runs, "resources": resources,
                          "message": "", "agentVersion": "test"}),
            )
            .send()
            .await
            .expect("report");
        assert_eq!(response.status(), 200, "{cluster} reports");
    }

    /// Every cluster not in `silent` polls (and takes what it is sent) and reports.
    pub(crate) async fn all_check_in(&mut self, silent: &[&str]) {
        for name in self.fleet.clusters() {
            if !silent.contains(&name) {
                self.poll(name).await;
                self.report(name, true).await;
            }
        }
    }

    /// Moves the hub's clock, a minute at a time, with every cluster not in `silent`
    /// checking in each minute (as their agents' long-polls and heartbeats would).
    pub(crate) async fn advance(&mut self, minutes: u64, silent: &[&str]) {
        for _ in 0..minutes {
            self.clock.advance(Duration::from_secs(60));
            self.all_check_in(silent).await;
        }
    }

    pub(crate) async fn fleet(&self) -> Value {
        get_json(&self.client, &self.url("/v1/fleet"), &self.admin).await
    }

    pub(crate) async fn wait_revision(&self, revision: &str) {
        let url = self.url("/v1/fleet");
        eventually(
            "the hub to serve the commit",
            Duration::from_secs(10),
            || {
                let (client, url, admin) = (&self.client, &url, &self.admin);
                async move {
                    let fleet = get_json(client, url, admin).await;
                    (fleet["revision"] == revision).then_some(())
                }
            },
        )
        .await;
    }

    pub(crate) async fn rollouts(&self) -> Vec<Value> {
        let list = get_json(&self.client, &self.url("/v1/rollouts"), &self.admin).await;
        list["rollouts"].as_array().expect("rollouts").clone()
    }

    pub(crate) async fn rollout_of(&self, revision: &str) -> Value {
        let url = self.url("/v1/rollouts");
        let id = eventually("the rollout to start", Duration::from_secs(10), || {
            let (client, url, admin) = (&self.client, &url, &self.admin);
            async move {
                let list = get_json(client, url, admin).await;
                list["rollouts"]
                    .as_array()?
                    .iter()
                    .find(|r| r["revision"] == revision)
                    .map(|r| r["id"].as_i64().expect("id"))
            }
        })
        .await;
        get_json(
            &self.client,
            &self.url(&format!("/v1/rollouts/{id}")),
            &self.admin,
        )
        .await
    }

    /// Waits (on the hub's timer, which runs on its own task) for a rollout state.
    pub(crate) async fn wait_rollout_state(&self, revision: &str, state: &str) -> Value {
        let url = self.url("/v1/rollouts");
        eventually(
            &format!("the rollout of {revision} to be {state}"),
            Duration::from_secs(10),
            || {
                let (client, url, admin) = (&self.client, &url, &self.admin);
                async move {
                    let list = get_json(client, url, admin).await;
                    list["rollouts"]
                        .as_array()?
                        .iter()
                        .find(|r| r["revision"] == revision && r["state"] == state)
                        .cloned()
                }
            },
        )
        .await
    }

    /// Waits for the wave states of the rollout of `revision`.
    pub(crate) async fn wait_waves(&self, revision: &str, expect: &[&str]) -> Value {
        let url = self.url("/v1/rollouts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let list = get_json(&self.client, &url, &self.admin).await;
            let rollout = list["rollouts"]
                .as_array()
                .and_then(|l| l.iter().find(|r| r["revision"] == revision))
                .cloned();
            if let Some(rollout) = &rollout {
                let states: Vec<&str> = rollout["waves"]
                    .as_array()
                    .map(|w| {
                        w.iter()
                            .map(|w| w["state"].as_str().unwrap_or(""))
                            .collect()
                    })
                    .unwrap_or_default();
                if states == expect {
                    return rollout.clone();
                }
            }
            if tokio::time::Instant::now() > deadline {
                let detail = match &rollout {
                    Some(r) => {
                        get_json(
                            &self.client,
                            &self.url(&format!("/v1/rollouts/{}", r["id"])),
                            &self.admin,
                        )
                        .await
                    }
                    None => list,
                };
                panic!("timed out waiting for waves {expect:?} of {revision}:\n{detail:#}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until wave `index` of the rollout of `revision` is in `state`.
    pub(crate) async fn wait_wave(&self, revision: &str, index: usize, state: &str) -> Value {
        let url = self.url("/v1/rollouts");
        eventually(
            &format!("wave {index} of {revision} to be {state}"),
            Duration::from_secs(10),
            || {
                let (client, url, admin) = (&self.client, &url, &self.admin);
                async move {
                    let list = get_json(client, url, admin).await;
                    let rollout = list["rollouts"]
                        .as_array()?
                        .iter()
                        .find(|r| r["revision"] == revision)?
                        .clone();
                    (rollout["waves"][index]["state"] == state).then_some(rollout)
                }
            },
        )
        .await
    }

    /// The digest the hub serves each cluster now and the one HEAD renders for it.
    pub(crate) async fn served(&self) -> BTreeMap<String, (String, String)> {
        self.fleet().await["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_string(),
                    (
                        c["desired"].as_str().expect("desired").to_string(),
                        c["latest"].as_str().unwrap_or_default().to_string(),
                    ),
                )
            })
            .collect()
    }

    /// The clusters served what HEAD renders, sorted.
    pub(crate) async fn on_latest(&self) -> Vec<String> {
        self.served()
            .await
            .into_iter()
            .filter(|(_, (desired, latest))| desired == latest)
            .map(|(name, _)| name)
            .collect()
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_first_and_alone_and_the_rest_only_after_the_bake() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene.runs["s1"].clone();
    let s2_v1 = scene.runs["s2"].clone();
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_revision(&v2).await;
    let rollout = scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(rollout["policy"], "stores");
    assert_eq!(rollout["waves"][0]["clusters"], 1);
    assert_eq!(rollout["waves"][1]["clusters"], 4);
    // The lab is ungoverned: it changes at once, beside the canary.
    assert_eq!(scene.on_latest().await, names(&["c1", "lab"]));
    assert_eq!(scene.poll("s1").await, 304, "a store keeps v1");
    assert_eq!(scene.runs["s1"], v1);
    // s1 waits in sync with v1: its fleet state says so.
    scene.report("s1", true).await;
    let fleet = scene.fleet().await;
    let s1 = fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|c| c["name"] == "s1")
        .expect("s1")
        .clone();
    assert_eq!(s1["state"], "waiting");
    assert_eq!(s1["wave"], "rest");
    assert_eq!(s1["policy"], "stores");
    assert_ne!(s1["latest"], s1["desired"]);

    assert_eq!(scene.poll("c1").await, 200, "the canary takes v2");
    scene.report("c1", true).await;
    // A store long-polls with the digest it runs while the canary bakes.
    let url = scene.url("/v1/clusters/s2/bundle?wait=30s");
    let (client, token, runs) = (
        scene.client.clone(),
        scene.tokens["s2"].clone(),
        format!("\"{}\"", scene.runs["s2"]),
    );
    let long_poll =
        tokio::spawn(async move { get_bundle(&client, &url, &token, Some(&runs)).await });
    scene.advance(14, &[]).await;
    assert_eq!(
        scene.on_latest().await,
        names(&["c1", "lab"]),
        "14 minutes is not 15"
    );
    assert!(!long_poll.is_finished());
    // The fifteenth minute: the canary has baked; the release wakes the store's
    // long-poll with its new digest.
    scene.clock.advance(Duration::from_secs(60));
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.wait_wave(&v2, 0, "complete").await;
    let (status, etag, _) = long_poll.await.expect("long-poll");
    assert_eq!(status, 200, "the release wakes the held long-poll");
    assert_ne!(etag.as_deref(), Some(format!("\"{s2_v1}\"").as_str()));
    scene.all_check_in(&[]).await;
    scene.wait_rollout_state(&v2, "complete").await;
    assert_eq!(scene.on_latest().await.len(), 6);
    let detail = scene.rollout_of(&v2).await;
    let events: Vec<&str> = detail["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["message"].as_str().expect("message"))
        .collect();
    assert!(events.iter().any(|e| e.starts_with("released wave canary")));
    assert!(
        events
            .iter()
            .any(|e| e.contains("released wave rest") && e.contains("wave canary baked"))
    );
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_failures_halt_and_rollback_serves_the_previous_digest() {
    let policy = format!("{POLICY}  onFailure: rollback\n");
    let mut scene = Scene::at_v1(&["c1"], &policy).await;
    let v1 = scene.runs["c1"].clone();
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(scene.poll("c1").await, 200);
    assert_ne!(scene.runs["c1"], v1);
    scene.report("c1", false).await;
    let halted = scene.wait_rollout_state(&v2, "halted").await;
    assert!(
        halted["reason"]
            .as_str()
            .is_some_and(|r| r.contains("wave canary: 1 failed cluster (c1)")),
        "{halted:#}"
    );
    assert_eq!(halted["waves"][0]["state"], "failed");
    // The canary is served v1 again, and nothing reaches the rest.
    assert_eq!(scene.poll("c1").await, 200);
    assert_eq!(scene.runs["c1"], v1);
    scene.advance(60, &[]).await;
    assert_eq!(scene.on_latest().await, names(&["lab"]));
    let metrics = metric(
        &scene.client,
        &scene.hub.as_ref().expect("hub").base,
        "flotilla_rollouts{policy=\"stores\",state=\"halted\"}",
    )
    .await;
    assert_eq!(metrics, 1.0);
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_skip_lets_the_wave_go_on_and_wait_blocks_it_until_the_deadline() {
    // skip: c2 is offline when the canary wave is released; c1 alone decides.
    let mut scene = Scene::at_v1(&["c1", "c2"], POLICY).await;
    scene.advance(6, &["c2"]).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(15, &["c2"]).await;
    scene.wait_wave(&v2, 0, "complete").await;
    let detail = scene.rollout_of(&v2).await;
    assert!(
        detail["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["message"]
                .as_str()
                .is_some_and(|m| m.contains("1 offline at release and skipped")))
    );
    // The skipped canary is served v2: it takes it when it comes back.
    assert_eq!(scene.poll("c2").await, 200);
    scene.stop().await;

    // wait: c2 blocks the wave until the deadline, which halts the rollout.
    let policy = format!("{POLICY}  offline: wait\n  progressDeadline: 30m\n");
    let mut scene = Scene::at_v1(&["c1", "c2"], &policy).await;
    scene.advance(6, &["c2"]).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(20, &["c2"]).await;
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.advance(10, &["c2"]).await;
    let halted = scene.wait_rollout_state(&v2, "halted").await;
    assert!(
        halted["reason"]
            .as_str()
            .is_some_and(|r| r.contains("progress deadline"))
    );
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_goes_silent_after_taking_the_change_halts_the_rollout() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(scene.poll("c1").await, 200, "the canary takes v2 ...");
    // ... and is never heard from again: the bundle cut it off.
    scene.advance(5, &["c1"]).await;
    assert_eq!(scene.rollout_of(&v2).await["state"], "progressing");
    scene.advance(1, &["c1"]).await;
    let halted = scene.wait_rollout_state(&v2, "halted").await;
    let detail = scene.rollout_of(&v2).await;
    assert!(
        detail["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["message"] == "c1 failed: it went silent after taking the new digest"),
        "{detail:#}"
    );
    assert_eq!(halted["waves"][1]["state"], "waiting");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_parallel_changes_a_few_clusters_at_a_time() {
    let policy = "apiVersion: flotilla.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: stores
spec:
  clusterSelector: {matchLabels: {kind: store}}
  waves:
    - {name: canary, groups: [canary]}
    - {name: rest, maxParallel: 2}
";
    let mut scene = Scene::at_v1(&["c1"], policy).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.wait_waves(&v2, &["complete", "released"]).await;
    let stores = |on: Vec<String>| on.into_iter().filter(|n| n.starts_with('s')).count();
    assert_eq!(stores(scene.on_latest().await), 2, "two stores at a time");
    // One of them becomes healthy: a third may change.
    let changing: Vec<String> = scene
        .on_latest()
        .await
        .into_iter()
        .filter(|n| n.starts_with('s'))
        .collect();
    scene.poll(&changing[0]).await;
    scene.report(&changing[0], true).await;
    assert_eq!(stores(scene.on_latest().await), 3);
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_are_released_only_inside_a_window() {
    // 03:00-04:00 in Berlin on weekdays; the hub's clock says 01:00 in Berlin.
    let policy = format!(
        "{POLICY}  windows:\n    - {{days: [mon, tue, wed, thu, fri], start: \"03:00\", end: \"04:00\", tz: Europe/Berlin}}\n"
    );
    let mut scene = Scene::at_v1(&["c1"], &policy).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_revision(&v2).await;
    let rollout = scene.wait_waves(&v2, &["waiting", "waiting"]).await;
    assert_eq!(rollout["state"], "progressing");
    scene.advance(59, &[]).await;
    assert_eq!(
        scene.on_latest().await,
        names(&["lab"]),
        "outside the window"
    );
    // 02:00 UTC is 03:00 in Berlin. The clock moves a minute at a time, so the wave
    // may be released at any minute from 02:00 on: stop at 02:04, well before its
    // 15-minute bake could end, whenever the hub's timer got to it.
    scene.advance(50, &[]).await;
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(scene.on_latest().await, names(&["c1", "lab"]));
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_keeps_what_it_runs_and_counts_in_no_wave() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene.runs["s1"].clone();
    scene.fleet.write_cluster("s1", true);
    let v2 = scene.fleet.release("v2", "v2, s1 paused");
    let rollout = scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(rollout["waves"][1]["clusters"], 3, "s1 counts in no wave");
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(15, &[]).await;
    scene.all_check_in(&[]).await;
    scene.wait_rollout_state(&v2, "complete").await;
    assert_eq!(scene.poll("s1").await, 304);
    assert_eq!(scene.runs["s1"], v1);
    let fleet = scene.fleet().await;
    let s1 = fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|c| c["name"] == "s1")
        .expect("s1")
        .clone();
    assert_eq!(s1["state"], "paused");
    assert_eq!(s1["desired"], v1.as_str());
    scene.stop().await;
}

/// A hub restarted before any cluster was heard from still cannot tell an offline
/// cluster from one not heard from yet: it settles as it did before, and does not
/// release the canary wave at once only to pause it with every canary "offline".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restarted_before_it_heard_from_any_cluster_still_settles() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene.v2_on_a_lost_store().await;
    let settling = scene.wait_waves(&v2, &["waiting", "waiting"]).await;
    assert!(settling["settlingUntil"].is_string(), "{settling:#}");
    // Restarted on the same store, which knows the rollout and no cluster's contact.
    scene.stop().await;
    scene.start().await;
    scene.wait_revision(&v2).await;
    // A restarted hub decides on its rollouts as it starts; give it the time to.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = scene.rollout_of(&v2).await;
    assert_eq!(again["state"], "progressing", "{again:#}");
    assert_eq!(again["waves"][0]["state"], "waiting", "{again:#}");
    assert!(again["settlingUntil"].is_string(), "{again:#}");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_on_an_empty_store_keeps_agents_on_what_they_run_until_their_wave() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene.runs.clone();
    let v2 = scene.v2_on_a_lost_store().await;
    // Stores poll with the digest they run: they keep it (304, with their own ETag).
    let url = scene.url("/v1/clusters/s1/bundle");
    let named = format!("\"{}\"", v1["s1"]);
    let (status, etag, _) =
        get_bundle(&scene.client, &url, &scene.tokens["s1"], Some(&named)).await;
    assert_eq!((status, etag.as_deref()), (304, Some(named.as_str())));
    // A fresh agent (nothing to name) gets v2: a new site has nothing to keep.
    let (status, _, _) = get_bundle(
        &scene.client,
        &scene.url("/v1/clusters/s3/bundle"),
        &scene.tokens["s3"],
        None,
    )
    .await;
    assert_eq!(status, 200);
    // The hub knows of no cluster yet: it gives them the offline threshold to be heard
    // from before it releases a wave (settling, said on the rollout with its end), and
    // the canary keeps v1 meanwhile too. One store not heard from keeps it settling.
    scene.all_check_in(&["s2"]).await;
    assert_eq!(scene.runs["c1"], v1["c1"]);
    let waiting = scene.wait_waves(&v2, &["waiting", "waiting"]).await;
    assert_eq!(waiting["state"], "progressing");
    assert!(
        waiting["settlingUntil"].is_string(),
        "the rollout says until when it settles: {waiting:#}"
    );
    // The last one is heard from, long before the threshold: settling ends at once.
    scene.report("s2", true).await;
    let released = scene.wait_wave(&v2, 0, "released").await;
    assert!(released["settlingUntil"].is_null(), "{released:#}");
    let fleet = scene.fleet().await;
    let s2 = fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|c| c["name"] == "s2")
        .expect("s2")
        .clone();
    assert_eq!(s2["state"], "waiting", "in sync with what it runs: {s2:#}");
    assert_eq!(s2["desired"], v1["s2"].as_str());
    // The canary, seen meanwhile, takes part in its wave and gets v2; the stores wait.
    assert_eq!(scene.poll("c1").await, 200);
    assert_ne!(scene.runs["c1"], v1["c1"]);
    assert_eq!(scene.poll("s2").await, 304);
    assert_eq!(scene.runs["s2"], v1["s2"]);
    scene.report("c1", true).await;
    scene.advance(15, &[]).await;
    scene.wait_wave(&v2, 0, "complete").await;
    assert_ne!(
        scene.runs["s2"], v1["s2"],
        "the rest took v2 after the canary baked"
    );
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_cluster_that_reported_is_not_moved_to_a_new_commit_before_its_wave() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    scene.v2_on_a_lost_store().await;
    // s2's agent reports what it runs: from now on the hub knows it.
    scene.report("s2", true).await;
    let url = scene.url("/v1/clusters/s2/bundle");
    let (_, held, _) = get_bundle(&scene.client, &url, &scene.tokens["s2"], None).await;
    // A new commit lands before any wave of s2 is released.
    let v3 = scene.fleet.release("v3", "v3");
    scene.wait_revision(&v3).await;
    // A poll without If-None-Match (an agent that lost its state dir, curl) still gets
    // what s2 was served before the commit, not the commit's render.
    let (status, etag, _) = get_bundle(&scene.client, &url, &scene.tokens["s2"], None).await;
    assert_eq!(status, 200);
    assert_eq!(etag, held, "s2 was moved to v3 before its wave");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_commit_supersedes_without_sending_any_cluster_back() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene.runs.clone();
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.poll("c1").await;
    let c1_v2 = scene.runs["c1"].clone();
    scene.report("c1", true).await;
    let v3 = scene.fleet.release("v3", "v3");
    scene.wait_waves(&v3, &["released", "waiting"]).await;
    scene.wait_rollout_state(&v2, "superseded").await;
    // The canary goes from v2 to v3; the stores stay on v1 (never v2, never back).
    assert_eq!(scene.poll("c1").await, 200);
    assert_ne!(scene.runs["c1"], c1_v2);
    assert_ne!(scene.runs["c1"], v1["c1"]);
    for store in ["s1", "s2", "s3", "s4"] {
        assert_eq!(scene.poll(store).await, 304);
        assert_eq!(scene.runs[store], v1[store]);
    }
    // A commit that changes no governed cluster does not supersede.
    scene.fleet.repo.write("README.md", "docs\n");
    let docs = format!("main@sha1:{}", scene.fleet.repo.commit("docs"));
    scene.wait_revision(&docs).await;
    assert_eq!(scene.rollout_of(&v3).await["state"], "progressing");
    let superseded = metric(
        &scene.client,
        &scene.hub.as_ref().expect("hub").base,
        "flotilla_rollouts_superseded_total",
    )
    .await;
    assert_eq!(superseded, 1.0);
    scene.stop().await;
}

/// Ended rollouts are kept for `--keep-rollouts` (90 days by default), then forgotten
/// at the next render, except the latest of each policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_rollouts_are_forgotten_after_the_keep_rollouts_period() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene
        .rollouts()
        .await
        .into_iter()
        .next()
        .expect("v1's rollout");
    assert_eq!(v1["state"], "complete", "{v1:#}");
    let v1_url = scene.url(&format!("/v1/rollouts/{}", v1["id"]));
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    // 89 days on, a commit: v1's rollout is kept.
    scene.clock.advance(Duration::from_secs(89 * 24 * 3600));
    scene.fleet.repo.write("README.md", "docs\n");
    let docs = format!("main@sha1:{}", scene.fleet.repo.commit("docs"));
    scene.wait_revision(&docs).await;
    let status = |url: String| {
        let (client, admin) = (scene.client.clone(), scene.admin.clone());
        async move {
            client
                .get(url)
                .bearer_auth(admin)
                .send()
                .await
                .expect("get")
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(v1_url.clone()).await, 200);
    // Two more days, another commit: it is forgotten; v2's stays, not ended.
    scene.clock.advance(Duration::from_secs(2 * 24 * 3600));
    scene.fleet.repo.write("README.md", "more docs\n");
    let more = format!("main@sha1:{}", scene.fleet.repo.commit("more docs"));
    scene.wait_revision(&more).await;
    // Forgotten right after the render is installed (and served).
    eventually(
        "v1's rollout to be forgotten",
        Duration::from_secs(10),
        || {
            let (status, url) = (&status, v1_url.clone());
            async move { (status(url).await == 404).then_some(()) }
        },
    )
    .await;
    let listed: Vec<Value> = scene.rollouts().await;
    assert!(
        listed.iter().all(|r| r["revision"] != v1["revision"]),
        "{listed:#?}"
    );
    assert!(
        listed.iter().any(|r| r["revision"] == v2.as_str()),
        "{listed:#?}"
    );
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_immediate_trailer_releases_every_wave_at_once() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene
        .fleet
        .release("v2", "hotfix\n\nFlotilla-Rollout: immediate");
    let rollout = scene.wait_waves(&v2, &["released", "released"]).await;
    assert_eq!(rollout["forced"], true);
    assert_eq!(scene.on_latest().await.len(), 6);
    scene.stop().await;
}

pub(crate) fn flotilla(
    args: &[&str],
    server: &str,
    token_file: &std::path::Path,
) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("FLOTILLA_SERVER", server)
        .env("FLOTILLA_TOKEN_FILE", token_file)
        .output()
        .expect("flotilla runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_pause_resume_promote_and_abort_through_the_command_line() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene.runs["s1"].clone();
    let token_file = scene.state.path().join("admin-token");
    std::fs::write(&token_file, format!("{}\n", scene.admin)).expect("token file");
    let admin_id = flotilla_hub::auth::token_id(&scene.admin);
    let server = scene.hub.as_ref().expect("hub").base.clone();
    let v2 = scene.fleet.release("v2", "v2");
    let rollout = scene.wait_waves(&v2, &["released", "waiting"]).await;
    let id = rollout["id"].as_i64().expect("id").to_string();
    let (cli, server, token_file) = (
        |args: Vec<String>, server: String, file: std::path::PathBuf| {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                flotilla(&args, &server, &file)
            })
        },
        server,
        token_file,
    );
    let run = |args: &[&str]| {
        cli(
            args.iter().map(|s| s.to_string()).collect(),
            server.clone(),
            token_file.clone(),
        )
    };

    let (ok, out, err) = run(&["rollout", "list"]).await.expect("runs");
    assert!(ok, "{err}");
    assert!(
        out.lines().next().is_some_and(|l| l.starts_with("ID")),
        "{out}"
    );
    assert!(
        out.contains("stores") && out.contains("progressing") && out.contains("canary ▶ 0/1"),
        "{out}"
    );

    let (ok, out, err) = run(&["rollout", "pause", &id]).await.expect("runs");
    assert!(ok, "{err}");
    assert!(out.contains("is paused"), "{out}");
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(16, &[]).await;
    assert_eq!(
        scene.rollout_of(&v2).await["waves"][1]["state"],
        "waiting",
        "paused"
    );

    let (ok, _, err) = run(&["rollout", "resume", &id]).await.expect("runs");
    assert!(ok, "{err}");
    scene.wait_waves(&v2, &["complete", "released"]).await;

    // A new rollout: promote releases the rest before the canary bakes; abort sends
    // every released cluster back.
    let v3 = scene.fleet.release("v3", "v3");
    let rollout = scene.wait_waves(&v3, &["released", "waiting"]).await;
    let id = rollout["id"].as_i64().expect("id").to_string();
    let (ok, out, err) = run(&["rollout", "promote", &id, "-o", "json"])
        .await
        .expect("runs");
    assert!(ok, "{err}");
    let promoted: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(promoted["waves"][1]["state"], "released");
    let (ok, _, err) = run(&["rollout", "abort", &id]).await.expect("runs");
    assert!(ok, "{err}");
    let (ok, out, _) = run(&["rollout", "show", &id, "-o", "json"])
        .await
        .expect("runs");
    assert!(ok);
    let shown: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(shown["state"], "aborted");
    let by: Vec<&str> = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["by"].as_str())
        .collect();
    assert_eq!(
        by,
        [admin_id.as_str(), admin_id.as_str()],
        "promote and abort, by the admin token"
    );
    // Every cluster the rollout changed is served what it was served before.
    let served = scene.served().await;
    assert_eq!(scene.poll("s1").await, 200);
    assert_ne!(scene.runs["s1"], v1, "s1 had v2 before v3");
    assert!(
        served
            .iter()
            .all(|(name, (desired, latest))| name == "lab" || desired != latest)
    );
    let (ok, out, err) = run(&["rollout", "show", &id]).await.expect("runs");
    assert!(ok, "{err}");
    assert!(
        out.contains("state: aborted") && out.contains(&format!("[token {admin_id}, admin]")),
        "{out}"
    );
    // Refused actions say why, and exit 2.
    let (ok, _, err) = run(&["rollout", "resume", &id]).await.expect("runs");
    assert!(!ok);
    assert!(err.contains("409") && err.contains("aborted"), "{err}");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_hub_goes_on_where_it_was() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene.fleet.release("v2", "v2");
    let before = scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(10, &[]).await;
    scene.stop().await;
    scene.start().await;
    // Same rollout, same waves; the canary's bake goes on from where it began.
    let after = scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(after["id"], before["id"]);
    assert_eq!(
        scene.rollouts().await.len(),
        2,
        "no second rollout for the same commit"
    );
    scene.advance(4, &[]).await;
    assert_eq!(scene.rollout_of(&v2).await["waves"][1]["state"], "waiting");
    scene.advance(1, &[]).await;
    scene.wait_wave(&v2, 0, "complete").await;
    assert_ne!(scene.rollout_of(&v2).await["waves"][1]["state"], "waiting");
    scene.stop().await;
}

/// A hub down for longer than the offline threshold (an upgrade, a reboot) heard
/// nothing meanwhile because nobody could reach it: it does not judge the canary
/// that was baking silent (which would fail it and halt the rollout), nor release a
/// wave on contacts from before it stopped. It settles for the threshold, or until
/// every cluster of the rollout is heard from again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_down_longer_than_the_offline_threshold_judges_nobody_on_old_contacts() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(5, &[]).await;
    scene.stop().await;
    // Eight minutes down: every contact the store holds is older than the threshold.
    scene.clock.advance(Duration::from_secs(8 * 60));
    scene.start().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = scene.rollout_of(&v2).await;
    assert_eq!(after["state"], "progressing", "{after:#}");
    assert_eq!(after["waves"][0]["failed"], 0, "{after:#}");
    assert!(after["settlingUntil"].is_string(), "{after:#}");
    // The agents come back, so the hub settles at once; the canary's bake (15
    // minutes from its healthy report, on the hub's clock: 16 have passed) has ended,
    // and the next wave is released.
    scene.advance(3, &[]).await;
    let settled = scene.wait_wave(&v2, 0, "complete").await;
    assert!(settled["settlingUntil"].is_null(), "{settled:#}");
    assert_eq!(settled["waves"][0]["failed"], 0, "{settled:#}");
    scene.advance(1, &[]).await;
    scene.wait_rollout_state(&v2, "complete").await;
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_writes_what_the_hub_serves_given_its_state_dir() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v1 = scene.runs.clone();
    // s9 is new with v2: the hub holds it (a fresh agent gets v2's bundle) until its
    // wave, also once v3 is the newest commit.
    scene.fleet.write_cluster("s9", false);
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    // s9's agent starts: it takes v2's bundle and runs it.
    let token = crate::support::hub::token_by_command(
        scene.state.path(),
        &flotilla_hub::store::Database::StateDir,
        &["s9"],
    );
    scene.tokens.insert("s9".to_string(), token);
    assert_eq!(scene.poll("s9").await, 200);
    scene.report("s9", true).await;
    let v3 = scene.fleet.release("v3", "v3");
    scene.wait_revision(&v3).await;
    let desired: BTreeMap<String, String> = scene
        .served()
        .await
        .into_iter()
        .map(|(cluster, (desired, _))| (cluster, desired))
        .collect();
    scene.stop().await;
    let publish = |extra: &[&str]| {
        let out = tempfile::tempdir().expect("out");
        let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["publish", "--repo"])
            .arg(scene.fleet.repo.path())
            .arg("--out")
            .arg(out.path())
            .args(extra)
            .output()
            .expect("flotilla publish runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let digest_of = |cluster: &str| -> String {
            let text =
                std::fs::read_to_string(out.path().join(format!("v1/clusters/{cluster}/bundle")))
                    .expect("published");
            let document: Value = serde_json::from_str(&text).expect("json");
            document["digest"].as_str().expect("digest").to_string()
        };
        let digests: BTreeMap<String, String> = ["c1", "s1", "s9", "lab"]
            .iter()
            .map(|c| (c.to_string(), digest_of(c)))
            .collect();
        (
            digests,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let state = scene.state.path().display().to_string();
    let (served, stderr) = publish(&["--state-dir", &state]);
    assert!(!stderr.contains("bypasses"), "{stderr}");
    assert_eq!(served["s1"], v1["s1"], "the store keeps v1 until its wave");
    assert_ne!(served["c1"], v1["c1"], "the canary is served v2");
    for (cluster, digest) in &served {
        assert_eq!(
            digest, &desired[cluster],
            "{cluster}: the mirror gets what the hub serves a fresh agent"
        );
    }
    let (head, stderr) = publish(&[]);
    assert!(stderr.contains("bypasses rollouts"), "{stderr}");
    assert_ne!(
        head["s1"], v1["s1"],
        "without the hub's state every cluster gets HEAD"
    );
    assert_eq!(head["c1"], served["c1"]);
}
