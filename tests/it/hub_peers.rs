//! Several hubs on one PostgreSQL database (with their objects in their state dirs,
//! or in one S3 bucket): they serve the same digests, share tokens and reports, both
//! take every commit, one decides each rollout, and when the one deciding stops the
//! other takes over. Needs a PostgreSQL server (`FLOTILLA_TEST_POSTGRES`, started by
//! `.ci/postgres`) and, for the bucket, an S3-compatible one (`FLOTILLA_TEST_S3`,
//! `.ci/s3`): skipped without them outside CI, failed without them in CI.

use crate::support::hub as hub_common;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use flotilla_hub::auth::new_token;
use flotilla_hub::peers::PeerTiming;
use flotilla_hub::store::{Database, ObjectsUrl, S3Location, Store};
use flotilla_testkit::TestBucket;
use hub_common::*;

const WAIT: Duration = Duration::from_secs(20);

fn peer_config(
    state: &std::path::Path,
    repo: &Repo,
    database: &Database,
    bucket: Option<&TestBucket>,
) -> flotilla_hub::HubConfig {
    let mut config = config(state, &repo.path().display().to_string());
    config.database = database.clone();
    if let Some(bucket) = bucket {
        config.objects = ObjectsUrl::S3(S3Location {
            bucket: bucket.bucket.clone(),
            prefix: "fleet/objects".into(),
            settings: bucket.settings(),
        });
    }
    config.peers = PeerTiming {
        lease_ttl: Duration::from_millis(1500),
        sync_interval: Duration::from_millis(50),
    };
    config
}

async fn ready(client: &reqwest::Client, hub: &Running) -> Value {
    client
        .get(hub.url("/readyz"))
        .send()
        .await
        .expect("readyz")
        .json()
        .await
        .expect("json")
}

/// Waits until exactly one of the two hubs holds the rollout lease; which one.
async fn one_holds_the_lease(client: &reqwest::Client, a: &Running, b: &Running) -> [bool; 2] {
    eventually("one hub to hold the rollout lease", WAIT, || async {
        let held = [
            ready(client, a).await["rolloutLease"] == true,
            ready(client, b).await["rolloutLease"] == true,
        ];
        (held.iter().filter(|h| **h).count() == 1).then_some(held)
    })
    .await
}

/// A token made in the shared database (as `flotilla token create --database` does):
/// an operator's with no cluster, else that cluster's.
async fn token_in(store: &Store, cluster: Option<&str>) -> String {
    let token = new_token(cluster, 0);
    store.insert_token(&token.stored).await.expect("token");
    token.secret
}

async fn etag(client: &reqwest::Client, hub: &Running, cluster: &str, token: &str) -> String {
    let (status, etag, _) = get_bundle(
        client,
        &hub.url(&format!("/v1/clusters/{cluster}/bundle")),
        token,
        None,
    )
    .await;
    assert_eq!(status, 200, "{cluster} on {}", hub.base);
    etag.expect("an ETag")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hubs_on_one_database_serve_one_fleet() {
    let test = "hub_peers::two_hubs_on_one_database_serve_one_fleet";
    let Some(url) = flotilla_testkit::postgres_database(test).await else {
        return;
    };
    serve_one_fleet(Database::Postgres(url), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hubs_on_one_database_and_one_bucket_serve_one_fleet() {
    let test = "hub_peers::two_hubs_on_one_database_and_one_bucket_serve_one_fleet";
    let Some(bucket) = flotilla_testkit::s3_bucket(test) else {
        return;
    };
    let Some(url) = flotilla_testkit::postgres_database(test).await else {
        return;
    };
    serve_one_fleet(Database::Postgres(url), Some(bucket)).await;
}

/// The object of `etag`'s digest is in the bucket (when there is one), under
/// `fleet/objects/sha256/<hex>`.
async fn in_bucket(bucket: Option<&TestBucket>, etag: &str) {
    if let Some(bucket) = bucket {
        let hex = etag.trim_matches('"').trim_start_matches("sha256:");
        let key = format!("fleet/objects/sha256/{hex}");
        let object = bucket_object(bucket, &key).await;
        let object = object.unwrap_or_else(|| panic!("{key} is not in the bucket"));
        assert_eq!(flotilla_core::bundle::Digest::of(&object).hex(), hex);
    }
}

async fn serve_one_fleet(database: Database, bucket: Option<TestBucket>) {
    let bucket = bucket.as_ref();
    let repo = Repo::with_rollouts();
    let (state_a, state_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let a = Running::start_ready(peer_config(state_a.path(), &repo, &database, bucket)).await;
    let b = Running::start_ready(peer_config(state_b.path(), &repo, &database, bucket)).await;
    let client = client();

    // A token made in the shared database (as `flotilla token create --database`
    // does) works on both hubs.
    let store = Store::open_tables(&database).await.expect("database");
    let admin = token_in(&store, None).await;
    let red = token_in(&store, Some("red")).await;

    // Exactly one hub holds the lease.
    let leases = one_holds_the_lease(&client, &a, &b).await;

    // The same digests on both, once both serve every cluster.
    let fleet = get_json(&client, &a.url("/v1/fleet"), &admin).await;
    let clusters: Vec<String> = fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_string())
        .collect();
    assert!(clusters.len() > 10, "{fleet}");
    for cluster in &clusters {
        let token = if cluster == "red" { &red } else { &admin };
        let on_a = etag(&client, &a, cluster, token).await;
        let on_b = eventually("b to serve what a serves", WAIT, || async {
            let (status, etag, _) = get_bundle(
                &client,
                &b.url(&format!("/v1/clusters/{cluster}/bundle")),
                token,
                None,
            )
            .await;
            (status == 200).then_some(etag).flatten()
        })
        .await;
        assert_eq!(on_a, on_b, "{cluster}");
        in_bucket(bucket, &on_a).await;
    }
    if bucket.is_some() {
        // Neither hub kept objects of its own.
        for state in [&state_a, &state_b] {
            let own = std::fs::read_dir(state.path().join("objects/sha256"))
                .map(|entries| entries.count())
                .unwrap_or(0);
            assert_eq!(own, 0, "objects in {}", state.path().display());
        }
    }

    // A report posted to one hub shows in the other's /v1/fleet.
    let red_digest = etag(&client, &a, "red", &red)
        .await
        .trim_matches('"')
        .to_string();
    let response = client
        .post(a.url("/v1/clusters/red/status"))
        .bearer_auth(&red)
        .json(
            &json!({"applied": red_digest, "attempted": red_digest, "resources": [],
                      "message": "applied on a", "agentVersion": "test"}),
        )
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), 200);
    eventually("b to show red's report", WAIT, || async {
        let fleet = get_json(&client, &b.url("/v1/fleet"), &admin).await;
        let red = fleet["clusters"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "red")?
            .clone();
        (red["applied"] == red_digest.as_str()).then_some(())
    })
    .await;

    // A commit reaches both: red and blue (no policy governs them) change at once,
    // the edge sites through one rollout, decided by the lease holder alone.
    repo.write(
        "workloads/kuard/manifests/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  colour: green\n",
    );
    repo.write(
        "workloads/telemetry-agent/manifests/peers.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: peers\ndata:\n  hubs: \"2\"\n",
    );
    let commit = repo.commit("a change for both hubs");
    let new_red = eventually("both hubs to serve red's new bundle", WAIT, || async {
        let on_a = etag(&client, &a, "red", &red).await;
        let on_b = etag(&client, &b, "red", &red).await;
        (on_a == on_b && on_a.trim_matches('"') != red_digest).then_some(on_a)
    })
    .await;
    assert!(new_red.starts_with("\"sha256:"));
    in_bucket(bucket, &new_red).await;
    let rollout_ids = |hub: &Running| {
        let client = client.clone();
        let admin = admin.clone();
        let url = hub.url("/v1/rollouts");
        let commit = commit.clone();
        async move {
            let list = get_json(&client, &url, &admin).await;
            list["rollouts"]
                .as_array()
                .expect("rollouts")
                .iter()
                .filter(|r| {
                    r["revision"]
                        .as_str()
                        .is_some_and(|rev| rev.ends_with(&commit))
                })
                .map(|r| r["id"].as_i64().expect("id"))
                .collect::<Vec<i64>>()
        }
    };
    let id = eventually(
        "both hubs to show the commit's one rollout",
        WAIT,
        || async {
            let (on_a, on_b) = (rollout_ids(&a).await, rollout_ids(&b).await);
            (on_a.len() == 1 && on_a == on_b).then(|| on_a[0])
        },
    )
    .await;
    // Every decision of that rollout was taken once: its events, as both hubs show
    // them, hold no message twice.
    let events = |hub: &Running| {
        let client = client.clone();
        let admin = admin.clone();
        let url = hub.url(&format!("/v1/rollouts/{id}"));
        async move {
            let detail = get_json(&client, &url, &admin).await;
            detail["events"]
                .as_array()
                .expect("events")
                .iter()
                .map(|e| e["message"].as_str().unwrap_or_default().to_string())
                .collect::<Vec<String>>()
        }
    };
    let shown = eventually("both hubs to show the same events", WAIT, || async {
        let (on_a, on_b) = (events(&a).await, events(&b).await);
        (!on_a.is_empty() && on_a == on_b).then_some(on_a)
    })
    .await;
    let distinct: BTreeSet<&String> = shown.iter().collect();
    assert_eq!(
        distinct.len(),
        shown.len(),
        "a decision taken twice: {shown:?}"
    );

    // The lease holder stops; the other takes the lease over once it lapses, and
    // takes the next commit alone.
    let (holder, other) = if leases[0] { (a, b) } else { (b, a) };
    holder.stop().await;
    eventually("the other hub to take the lease", WAIT, || async {
        (ready(&client, &other).await["rolloutLease"] == true).then_some(())
    })
    .await;
    repo.write(
        "workloads/kuard/manifests/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  colour: blue\n",
    );
    repo.commit("a change after one hub stopped");
    eventually(
        "the remaining hub to serve the next commit",
        WAIT,
        || async {
            let now = etag(&client, &other, "red", &red).await;
            (now != new_red).then_some(())
        },
    )
    .await;
    let recorded = store.revision().await.expect("revision").expect("recorded");
    assert!(
        recorded.ends_with(&repo.git(&["rev-parse", "HEAD"])),
        "{recorded}"
    );
    store.close().await;
    other.stop().await;
}

/// Garbage collection with several hubs sharing a folder of objects: an object
/// nothing refers to stays while it has been unreferenced for less than an hour (on
/// the database's clock), and the lease holder deletes it after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_unreferenced_for_an_hour_are_collected_once() {
    let test = "hub_peers::objects_unreferenced_for_an_hour_are_collected_once";
    let Some(url) = flotilla_testkit::postgres_database(test).await else {
        return;
    };
    let database = Database::Postgres(url.clone());
    let repo = Repo::with_rollouts();
    let (state_a, state_b, shared) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
        tempfile::tempdir().expect("shared objects"),
    );
    let objects: ObjectsUrl = format!("file://{}", shared.path().display())
        .parse()
        .expect("objects URL");
    let start = |state: &std::path::Path| {
        let mut config = peer_config(state, &repo, &database, None);
        config.objects = objects.clone();
        Running::start_ready(config)
    };
    let a = start(state_a.path()).await;
    let b = start(state_b.path()).await;
    let client = client();
    one_holds_the_lease(&client, &a, &b).await;
    let store = Store::open_tables(&database).await.expect("database");
    let red = new_token(Some("red"), 0);
    store.insert_token(&red.stored).await.expect("red token");
    let red = red.secret;
    // The hub that does not hold the lease serves what the holder records, once its
    // sync has read it: wait for both before the commits below.
    eventually("both hubs to serve red", WAIT, || async {
        let mut served = 0;
        for hub in [&a, &b] {
            let url = hub.url("/v1/clusters/red/bundle");
            let (status, _, _) = get_bundle(&client, &url, &red, None).await;
            served += usize::from(status == 200);
        }
        (served == 2).then_some(())
    })
    .await;

    // An object nothing refers to (a render another hub wrote and nobody recorded).
    let orphan = flotilla_core::bundle::Digest::of(b"[\"orphan\"]");
    let orphan_file = shared.path().join("sha256").join(orphan.hex());
    std::fs::write(&orphan_file, b"[\"orphan\"]").expect("plant");
    let commit_and_wait = |colour: &'static str| {
        let (client, a, b, red, repo) = (&client, &a, &b, &red, &repo);
        async move {
            let before = etag(client, a, "red", red).await;
            repo.write(
                "workloads/kuard/manifests/settings.yaml",
                &format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  colour: {colour}\n"
                ),
            );
            repo.commit(colour);
            eventually("both hubs to serve red's new bundle", WAIT, || async {
                let (on_a, on_b) = (
                    etag(client, a, "red", red).await,
                    etag(client, b, "red", red).await,
                );
                (on_a == on_b && on_a != before).then_some(on_a)
            })
            .await
        }
    };
    let pool = sqlx::PgPool::connect(&url).await.expect("database");
    let marked = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM unreferenced_objects WHERE digest = $1")
            .bind(orphan.as_str())
            .fetch_one(&pool)
            .await
            .expect("query")
    };
    let first = commit_and_wait("green").await;
    eventually(
        "the holder to see the orphan unreferenced",
        WAIT,
        || async { (marked().await == 1).then_some(()) },
    )
    .await;
    assert!(orphan_file.is_file(), "deleted before the grace period");

    // An hour and a minute later (the records moved back), the next render's sweep
    // takes it; what clusters are served stays.
    sqlx::query("UPDATE unreferenced_objects SET since = since - 3660000")
        .execute(&pool)
        .await
        .expect("age");
    let second = commit_and_wait("blue").await;
    eventually("the orphan to be collected", WAIT, || async {
        (!orphan_file.exists() && marked().await == 0).then_some(())
    })
    .await;
    for digest in [&first, &second] {
        let hex = digest.trim_matches('"').trim_start_matches("sha256:");
        assert!(
            shared.path().join("sha256").join(hex).is_file(),
            "{digest} kept"
        );
    }
    pool.close().await;
    store.close().await;
    a.stop().await;
    b.stop().await;
}

/// A force-push with two hubs: the followed branch is moved to a commit that does not
/// descend from the recorded one. Each hub counts its polls that see that tip (here
/// each poll is one webhook, the timed poll being an hour away); the tip is not taken
/// after one or two, a tip that changes again starts the count over, and once both
/// hubs have seen the same tip three polls in a row the lease holder records it and
/// both serve the same digests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_push_is_taken_once_every_hub_has_seen_it_three_polls_in_a_row() {
    let test = "hub_peers::a_force_push_is_taken_once_every_hub_has_seen_it_three_polls_in_a_row";
    let Some(url) = flotilla_testkit::postgres_database(test).await else {
        return;
    };
    let database = Database::Postgres(url.clone());
    let repo = Repo::new();
    let secret = b"a webhook secret".to_vec();
    let (state_a, state_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let start = |state: &std::path::Path| {
        let mut config = peer_config(state, &repo, &database, None);
        // A mirror fetched at each poll: no file-system events, only the webhook.
        config.source.repo = format!("file://{}", repo.path().display());
        config.webhook_secret = Some(secret.clone());
        Running::start_ready(config)
    };
    let a = start(state_a.path()).await;
    let b = start(state_b.path()).await;
    let client = client();
    one_holds_the_lease(&client, &a, &b).await;
    let store = Store::open_tables(&database).await.expect("database");
    let admin = token_in(&store, None).await;
    let served = |hub: &Running| {
        let (client, admin, url) = (client.clone(), admin.clone(), hub.url("/v1/fleet"));
        async move {
            let fleet = get_json(&client, &url, &admin).await;
            let digests: Vec<(String, String)> = fleet["clusters"]
                .as_array()
                .expect("clusters")
                .iter()
                .map(|c| {
                    let field = |name: &str| c[name].as_str().expect(name).to_string();
                    (field("name"), field("desired"))
                })
                .collect();
            (digests, fleet)
        }
    };
    let first = eventually("both hubs to serve the same digests", WAIT, || async {
        let ((on_a, _), (on_b, _)) = (served(&a).await, served(&b).await);
        (!on_a.is_empty() && on_a == on_b).then_some(on_a)
    })
    .await;
    let recorded = store.revision().await.expect("revision").expect("recorded");
    let pool = sqlx::PgPool::connect(&url).await.expect("database");
    let counts = || async {
        sqlx::query_as::<_, (Option<String>, i64)>("SELECT tip, tip_polls FROM hubs ORDER BY name")
            .fetch_all(&pool)
            .await
            .expect("hubs")
    };
    let poll_both = || async {
        for hub in [&a, &b] {
            assert_eq!(post_webhook(&client, hub, &secret).await, 202);
        }
    };
    let force_push = |colour: &str| {
        repo.force_push(
            "workloads/kuard/manifests/settings.yaml",
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  colour: {colour}\n"
            ),
        )
    };
    // Polls once more on both hubs and waits until both have counted it; the tip is
    // not taken yet, and each hub's /v1/fleet says so.
    let not_taken_after = |commit: String, polls: i64| {
        let (a, b, served, counts, poll_both) = (&a, &b, &served, &counts, &poll_both);
        let (first, recorded, store) = (&first, &recorded, &store);
        async move {
            poll_both().await;
            eventually(
                &format!("both hubs to count {polls} poll(s) of {commit}"),
                WAIT,
                || async {
                    let counts = counts().await;
                    (counts.len() == 2
                        && counts.iter().all(|(tip, n)| {
                            tip.as_deref().is_some_and(|t| t.ends_with(&commit)) && *n == polls
                        }))
                    .then_some(())
                },
            )
            .await;
            assert_eq!(
                store.revision().await.expect("revision").as_ref(),
                Some(recorded),
                "taken after {polls} poll(s)"
            );
            for hub in [a, b] {
                // The hub shows its own count once it has written it and weighed it:
                // a moment after the database holds it.
                let (digests, fleet) = eventually(
                    &format!("{} to show {polls} poll(s) of {commit}", hub.base),
                    WAIT,
                    || async {
                        let (digests, fleet) = served(hub).await;
                        let shown = fleet["forcePush"]["hubs"].as_array().is_some_and(|hubs| {
                            hubs.iter()
                                .any(|h| h["thisHub"] == true && h["polls"] == polls)
                        });
                        shown.then_some((digests, fleet))
                    },
                )
                .await;
                assert_eq!(&digests, first, "{} serves the force-push early", hub.base);
                let pending = &fleet["forcePush"];
                assert!(
                    pending["revision"]
                        .as_str()
                        .is_some_and(|r| r.ends_with(&commit)),
                    "{fleet}"
                );
                assert_eq!(pending["recorded"], recorded.as_str(), "{pending}");
                assert_eq!(pending["pollsNeeded"], 3, "{pending}");
                let hubs = pending["hubs"].as_array().expect("hubs");
                assert_eq!(hubs.len(), 2, "{pending}");
                let this = hubs
                    .iter()
                    .find(|h| h["thisHub"] == true)
                    .expect("this hub");
                assert_eq!(this["polls"], polls, "{pending}");
            }
        }
    };

    // The first force-push: seen by both hubs, once and twice, not taken.
    let rewritten = force_push("forced");
    not_taken_after(rewritten.clone(), 1).await;
    not_taken_after(rewritten, 2).await;

    // The branch moves again before the third poll: the count starts over.
    let again = force_push("forced-again");
    not_taken_after(again.clone(), 1).await;
    not_taken_after(again.clone(), 2).await;

    // The third poll in a row of the same tip on both: taken, by every hub.
    poll_both().await;
    let taken = eventually("both hubs to serve the force-push", WAIT, || async {
        let ((on_a, fleet_a), (on_b, fleet_b)) = (served(&a).await, served(&b).await);
        (on_a != first
            && on_a == on_b
            && fleet_a.get("forcePush").is_none()
            && fleet_b.get("forcePush").is_none())
        .then_some(on_a)
    })
    .await;
    let now = store.revision().await.expect("revision").expect("recorded");
    assert!(now.ends_with(&again), "{now}");
    let red = |digests: &[(String, String)]| {
        digests
            .iter()
            .find(|(name, _)| name == "red")
            .map(|(_, digest)| digest.clone())
    };
    assert_ne!(red(&taken), red(&first), "red's bundle changed");
    eventually("both hubs to clear their counts", WAIT, || async {
        counts()
            .await
            .iter()
            .all(|(tip, n)| tip.is_none() && *n == 0)
            .then_some(())
    })
    .await;
    pool.close().await;
    store.close().await;
    a.stop().await;
    b.stop().await;
}

/// Every time that decides is the database's clock: the hub deciding rollouts has a
/// clock two hours ahead, the canaries report to the other hub, and the canary wave
/// is released at the database's time and still bakes (15 minutes) once they are all
/// in sync. Deciding on its own clock, the holder would see the reports two hours old
/// and the bake long over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_with_a_skewed_clock_decides_bake_on_the_databases_clock() {
    let test = "hub_peers::a_hub_with_a_skewed_clock_decides_bake_on_the_databases_clock";
    let Some(url) = flotilla_testkit::postgres_database(test).await else {
        return;
    };
    let database = Database::Postgres(url);
    let repo = Repo::with_rollouts();
    let canaries = ["store-apac-001", "store-eu-001", "store-us-001"];
    let store = Store::open_tables(&database).await.expect("database");
    // Every cluster was seen a moment ago, so the first wave is not held back waiting
    // for agents to be heard from.
    let now = store.database_now_ms().await.expect("now");
    let seen: Vec<(String, i64)> = std::fs::read_dir(repo.path().join("clusters"))
        .expect("clusters")
        .map(|entry| {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            (name.trim_end_matches(".yaml").to_string(), now)
        })
        .collect();
    store.put_seen(&seen).await.expect("seen");
    let admin = token_in(&store, None).await;
    let mut tokens = std::collections::BTreeMap::new();
    for canary in canaries {
        tokens.insert(canary, token_in(&store, Some(canary)).await);
    }

    let (state_a, state_b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let mut skewed = peer_config(state_a.path(), &repo, &database, None);
    skewed.clock = std::sync::Arc::new(flotilla_hub::clock::SkewedClock {
        skew_ms: 2 * 3_600_000,
    });
    let a = Running::start_ready(skewed).await;
    let client = client();
    eventually("the skewed hub to hold the rollout lease", WAIT, || async {
        (ready(&client, &a).await["rolloutLease"] == true).then_some(())
    })
    .await;
    let b = Running::start_ready(peer_config(state_b.path(), &repo, &database, None)).await;
    // b serves what a records once its sync has read it.
    let mut before = Vec::new();
    for canary in canaries {
        let token = &tokens[canary];
        let url = b.url(&format!("/v1/clusters/{canary}/bundle"));
        before.push(
            eventually(&format!("b to serve {canary}"), WAIT, || async {
                let (status, etag, _) = get_bundle(&client, &url, token, None).await;
                (status == 200).then_some(etag).flatten()
            })
            .await,
        );
    }

    // A change for the edge sites: one rollout, its canary wave released at once.
    repo.write(
        "workloads/telemetry-agent/manifests/peers.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: peers\ndata:\n  hubs: \"2\"\n",
    );
    let commit = repo.commit("a change for the edge sites");
    let rollout = |hub: &Running| {
        let (client, admin, commit) = (client.clone(), admin.clone(), commit.clone());
        let url = hub.url("/v1/rollouts");
        let base = hub.url("");
        async move {
            let list = get_json(&client, &url, &admin).await;
            let id = list["rollouts"].as_array()?.iter().find(|r| {
                r["revision"]
                    .as_str()
                    .is_some_and(|rev| rev.ends_with(&commit))
            })?["id"]
                .as_i64()?;
            Some(get_json(&client, &format!("{base}/v1/rollouts/{id}"), &admin).await)
        }
    };
    // The canaries' agents poll the other hub, take the new bundle and report it.
    for (canary, before) in canaries.iter().zip(&before) {
        let token = &tokens[canary];
        let new = eventually(
            &format!("{canary} to be served the new bundle on b"),
            WAIT,
            || async {
                let now = etag(&client, &b, canary, token).await;
                (now != *before).then_some(now)
            },
        )
        .await;
        let digest = new.trim_matches('"');
        let response = client
            .post(b.url(&format!("/v1/clusters/{canary}/status")))
            .bearer_auth(token)
            .json(
                &json!({"applied": digest, "attempted": digest, "resources": [],
                          "message": "applied", "agentVersion": "test"}),
            )
            .send()
            .await
            .expect("report");
        assert_eq!(response.status(), 200, "{canary} reports");
    }
    // The holder has taken every report in: the canaries are in sync, and bake.
    let detail = eventually("the holder to see the canaries in sync", WAIT, || async {
        let detail = rollout(&a).await?;
        (detail["waves"][0]["inSync"] == canaries.len()).then_some(detail)
    })
    .await;
    let waves = &detail["waves"];
    assert_eq!(waves[0]["name"], "canary", "{detail}");
    assert!(
        waves[0]["completedAt"].is_null(),
        "the bake ended early: {detail}"
    );
    assert!(
        waves[1]["releasedAt"].is_null(),
        "the rest released early: {detail}"
    );
    // Released at the database's time, not two hours ahead.
    let released = waves[0]["releasedAt"].as_str().expect("released");
    let released = humantime::parse_rfc3339_weak(released).expect("RFC 3339");
    let released_ms = flotilla_hub::clock::to_ms(released);
    let database_now = store.database_now_ms().await.expect("now");
    assert!(
        (database_now - 120_000..=database_now).contains(&released_ms),
        "released at {released_ms}, the database's clock says {database_now}: {detail}"
    );
    store.close().await;
    b.stop().await;
    a.stop().await;
}
