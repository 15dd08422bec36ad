//! `flotilla status` and `flotilla rollout` with `--database`: the fleet read and its
//! rollouts steered straight on a hub's database, next to the running hub. On the
//! hub's SQLite file always, and on PostgreSQL when `FLOTILLA_TEST_POSTGRES` names a
//! server (`.ci/postgres` starts one; skipped without it outside CI).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::rollout_e2e::{POLICY, Scene};
use crate::support::hub::*;
use flotilla_hub::store::Database;

/// Runs the command line with nothing in its environment pointing it at a hub or a
/// database; returns the exit code, stdout and stderr.
fn flotilla(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_SERVER")
        .env_remove("FLOTILLA_TOKEN_FILE")
        .env_remove("FLOTILLA_DATABASE")
        .env("USER", "ops")
        .output()
        .expect("flotilla runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// [`flotilla`], off the test's async runtime (the hub runs on it meanwhile).
async fn flotilla_beside(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        flotilla(&args)
    })
    .await
    .expect("flotilla runs")
}

/// The database as an operator names it with `--database`.
fn url_of(database: &Database, state: &Path) -> String {
    match database {
        Database::StateDir => format!("sqlite://{}", state.join("flotilla.db").display()),
        Database::Sqlite(path) => format!("sqlite://{}", path.display()),
        Database::Postgres(url) => url.clone(),
    }
}

async fn postgres(test: &str) -> Option<Database> {
    flotilla_testkit::postgres_database(test)
        .await
        .map(Database::Postgres)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_from_the_database_is_status_from_the_hub_on_sqlite() {
    status_from_both(Database::StateDir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_from_the_database_is_status_from_the_hub_on_postgres() {
    let test = "cli_database::status_from_the_database_is_status_from_the_hub_on_postgres";
    if let Some(database) = postgres(test).await {
        status_from_both(database).await;
    }
}

/// `status -o json` as the comparison sees it: without what only a hub knows (the
/// fleet's groups and the last attempted render, which it keeps in memory) and
/// without what moves while the two commands run (how long ago, to the second; the
/// hub also counts polls as seen, which reach the database every 30 s).
fn comparable(mut report: Value) -> Value {
    let object = report.as_object_mut().expect("an object");
    object.remove("attemptedRevision");
    // The Helm charts of the served render are what the hub rendered; the database
    // does not keep them.
    object.remove("charts");
    // So is the served commit's subject and author, which the hub reads from Git.
    object.remove("commit");
    // A hub's settling after it started on a new store is its own: the database does
    // not record when a hub started.
    if let Some(rollouts) = object.get_mut("rollouts").and_then(Value::as_array_mut) {
        for rollout in rollouts {
            if let Some(rollout) = rollout.as_object_mut() {
                rollout.remove("settlingUntil");
            }
        }
    }
    for cluster in object["clusters"].as_array_mut().expect("clusters") {
        let cluster = cluster.as_object_mut().expect("a cluster");
        // Groups and labels are the hub's, read from the repository (the database
        // records neither).
        for moving in [
            "groups",
            "labels",
            "lastSeen",
            "silentForSeconds",
            "pendingForSeconds",
        ] {
            cluster.remove(moving);
        }
    }
    report
}

async fn status_from_both(database: Database) {
    let repo = Repo::with_rollouts();
    let state = tempfile::tempdir().expect("state dir");
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.database = database.clone();
    let admin = make_token_in(state.path(), &database, None).await;
    let hub = Running::start_ready(config).await;
    let client = client();
    let fleet = eventually(
        "the hub to serve the fleet",
        Duration::from_secs(20),
        || async {
            let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
            (fleet["revision"].is_string() && fleet["clusters"].as_array()?.len() > 10)
                .then_some(fleet)
        },
    )
    .await;

    // Three agents report: one in sync, one failed, and one no policy governs still
    // on another digest.
    let clusters = fleet["clusters"].as_array().expect("clusters");
    let named = |name: &str| {
        clusters
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {fleet}"))
    };
    let (in_sync, failed, pending) = (named("blue"), named("plant-apac-01"), named("red"));
    let other = failed["desired"].as_str().expect("digest");
    for (cluster, applied, resources) in [
        (
            in_sync,
            in_sync["desired"].as_str().expect("digest"),
            json!([]),
        ),
        (
            failed,
            failed["desired"].as_str().expect("digest"),
            json!([{"group": "apps", "kind": "Deployment", "namespace": "pos", "name": "api",
                    "state": "failed", "message": "CrashLoopBackOff"}]),
        ),
        (pending, other, json!([])),
    ] {
        let name = cluster["name"].as_str().expect("name");
        // Made as people make them, in another process beside the running hub.
        let token = token_by_command(state.path(), &database, &[name]);
        let report = json!({"applied": applied, "attempted": applied, "resources": resources,
                            "message": format!("{name} reports"), "agentVersion": "test"});
        // The hub takes a new token up within its refresh.
        eventually(
            &format!("{name} to report"),
            Duration::from_secs(10),
            || async {
                let response = client
                    .post(hub.url(&format!("/v1/clusters/{name}/status")))
                    .bearer_auth(&token)
                    .json(&report)
                    .send()
                    .await
                    .expect("report");
                (response.status() == 200).then_some(())
            },
        )
        .await;
    }

    let url = url_of(&database, state.path());
    let token_file = state.path().join("admin.token");
    std::fs::write(&token_file, &admin).expect("token file");
    let token_file = token_file.display().to_string();
    let (hub_code, from_hub, err) = flotilla_beside(&[
        "status",
        "-o",
        "json",
        "--server",
        &hub.base,
        "--token-file",
        &token_file,
    ])
    .await;
    assert!(hub_code == 1, "a failed cluster: exit 1\n{err}");
    let (db_code, from_db, err) =
        flotilla_beside(&["status", "-o", "json", "--database", &url]).await;
    assert_eq!(db_code, hub_code, "{err}");
    // Where the view came from, without a password.
    assert!(
        err.contains("database: ") && err.contains("not through a hub"),
        "{err}"
    );
    let from_hub: Value = serde_json::from_str(&from_hub).expect("json");
    let from_db: Value = serde_json::from_str(&from_db).expect("json");
    assert_eq!(from_hub["counts"]["failed"], 1, "{from_hub}");
    assert_eq!(from_hub["counts"]["pending"], 1, "{from_hub}");
    assert_eq!(comparable(from_db), comparable(from_hub));

    // The table too, and a --group filter is refused: the database has no groups.
    let (code, table, err) = flotilla_beside(&["status", "--database", &url]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        table.starts_with("revision ") && table.contains("CrashLoopBackOff"),
        "{table}"
    );
    let (code, _, err) = flotilla_beside(&["status", "--database", &url, "--group", "edge"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("--group needs a hub"), "{err}");
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_through_the_database_holds_a_running_hub_on_sqlite() {
    pause_through_the_database(Database::StateDir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_through_the_database_holds_a_running_hub_on_postgres() {
    let test = "cli_database::a_pause_through_the_database_holds_a_running_hub_on_postgres";
    if let Some(database) = postgres(test).await {
        pause_through_the_database(database).await;
    }
}

/// The hub released the canary wave of v2; an operator pauses the rollout in the
/// database. The canary then bakes healthy on the hub's clock, and the agents' reports
/// make the hub decide again, on what it held before the pause: that decision is
/// refused and read again, so no wave is released. The hub shows the pause, and a
/// resume through the database lets it release the rest.
async fn pause_through_the_database(database: Database) {
    let mut scene = Scene::at_v1_on(&["c1"], POLICY, database.clone()).await;
    let url = url_of(&database, scene.state.path());
    let v2 = scene.fleet.release("v2", "v2");
    let rollout = scene.wait_waves(&v2, &["released", "waiting"]).await;
    let id = rollout["id"].as_i64().expect("id").to_string();

    let (code, out, err) = flotilla_beside(&["rollout", "pause", &id, "--database", &url]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("is paused"), "{out}");
    scene.poll("c1").await;
    scene.report("c1", true).await;
    scene.advance(16, &[]).await;
    let shown = scene.rollout_of(&v2).await;
    assert_eq!(shown["state"], "paused", "{shown}");
    assert_eq!(shown["waves"][1]["state"], "waiting", "{shown}");
    let by: Vec<&str> = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["by"].as_str())
        .collect();
    assert_eq!(by, ["database:ops"], "{shown}");
    // The hub's own status shows the rollout paused.
    let token_file = scene.state.path().join("admin.token");
    std::fs::write(&token_file, &scene.admin).expect("token file");
    let server = scene.hub.as_ref().expect("the hub runs").base.clone();
    let (_, table, err) = flotilla_beside(&[
        "status",
        "--server",
        &server,
        "--token-file",
        &token_file.display().to_string(),
    ])
    .await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&format!("{id} ")) && l.contains("paused")),
        "{table}\n{err}"
    );
    // So does the database's.
    let (code, out, err) =
        flotilla_beside(&["rollout", "show", &id, "-o", "json", "--database", &url]).await;
    assert_eq!(code, 0, "{err}");
    let from_db: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(from_db["state"], "paused");

    // A resume through the database: the hub takes it up (within its refresh) and,
    // the canary baked, releases the rest.
    let (code, _, err) = flotilla_beside(&["rollout", "resume", &id, "--database", &url]).await;
    assert_eq!(code, 0, "{err}");
    scene.wait_waves(&v2, &["complete", "released"]).await;
    // An action the rollout's state does not allow is refused with the reason.
    let (code, _, err) = flotilla_beside(&["rollout", "resume", &id, "--database", &url]).await;
    assert_eq!(code, 2);
    assert!(err.contains("cannot resume rollout"), "{err}");
    scene.stop().await;
}

#[test]
fn a_bad_database_or_both_places_are_refused_clearly() {
    // A PostgreSQL server that is not there: named, without its password.
    let (code, _, err) = flotilla(&[
        "status",
        "--database",
        "postgres://fleet:hunter2@127.0.0.1:1/fleet",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("postgres://fleet:…@127.0.0.1:1/fleet"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    // A SQLite file that is not there is named, and not made.
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("flotilla.db");
    let (code, _, err) = flotilla(&[
        "rollout",
        "pause",
        "1",
        "--database",
        &format!("sqlite://{}", missing.display()),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no database at") && err.contains(&missing.display().to_string()),
        "{err}"
    );
    assert!(!missing.exists());
    // Not a database URL.
    let (code, _, err) = flotilla(&["rollout", "list", "--database", "mysql://db/fleet"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("mysql://db/fleet") && err.contains("postgres://"),
        "{err}"
    );
    // Both places, or neither.
    let (code, _, err) = flotilla(&[
        "status",
        "--server",
        "http://127.0.0.1:1",
        "--database",
        "sqlite:///var/lib/flotilla/flotilla.db",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--server")
            && err.contains("--database")
            && err.contains("cannot be used with"),
        "{err}"
    );
    // FLOTILLA_DATABASE exported for the hub does not stand in the way of --server,
    // and is read when --server is not given.
    let with_env = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .env_remove("FLOTILLA_SERVER")
            .env_remove("FLOTILLA_TOKEN_FILE")
            .env("FLOTILLA_DATABASE", "mysql://db/fleet")
            .output()
            .expect("flotilla runs");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, err) = with_env(&["status", "--server", "http://127.0.0.1:1"]);
    assert!(
        !err.contains("cannot be used with") && !err.contains("mysql"),
        "{code}: {err}"
    );
    let (code, err) = with_env(&["rollout", "list"]);
    assert!(
        code != 0 && err.contains("FLOTILLA_DATABASE") && err.contains("mysql://db/fleet"),
        "{code}: {err}"
    );
    let (code, _, err) = flotilla(&["rollout", "list"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("give --server URL") && err.contains("--database URL"),
        "{err}"
    );
}
