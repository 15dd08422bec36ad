//! Seeing the fleet: `flotilla status` against the real hub, with clusters in every
//! state (the hub's clock moved by hand, so one cluster is offline for exactly six
//! minutes).

use std::process::Command;

use serde_json::Value;

use crate::rollout_e2e::{POLICY, Scene};
use crate::support::hub::make_token;

/// The hub with a cluster in each state, and a rollout of v2 under way:
/// - `c1` (canary) took v2 and reports a crashing Deployment: failed;
/// - `s1`, `s2` run v1 and wait for the rest wave: waiting;
/// - `s3` went silent six minutes ago: offline;
/// - `s4` is `spec.paused`: paused;
/// - `lab` (no policy) was sent v2 but still runs v1: pending;
/// - `fresh` (new in v2, no policy) never reported: never-seen;
/// - `edge` (new in v2, no policy) took v2 and is healthy: in-sync.
pub(crate) async fn every_state() -> (Scene, String) {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let lab_v1 = scene.runs["lab"].clone();
    scene.fleet.write_cluster("s4", true);
    for name in ["fresh", "edge"] {
        scene.fleet.repo.write(
            &format!("clusters/{name}.yaml"),
            &format!("apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  labels: {{kind: lab}}\n"),
        );
    }
    let edge = make_token(scene.state.path(), Some("edge")).await;
    scene.tokens.insert("edge".into(), edge);
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.advance(6, &["s3"]).await;
    scene.report("c1", false).await;
    scene.runs.insert("lab".into(), lab_v1);
    scene.report("lab", true).await;
    assert_eq!(scene.poll("edge").await, 200);
    scene.report("edge", true).await;
    (scene, v2)
}

fn run_status(server: &str, token_file: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("status")
        .args(args)
        .env("FLOTILLA_SERVER", server)
        .env("FLOTILLA_TOKEN_FILE", token_file)
        .env_remove("FLOTILLA_AGENT_SERVER")
        .output()
        .expect("flotilla runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The table's row for `cluster`, split on runs of two or more spaces.
fn row<'a>(out: &'a str, cluster: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(cluster))
        .unwrap_or_else(|| panic!("no row for {cluster} in:\n{out}"))
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_every_state_and_exits_1_when_a_cluster_failed() {
    let (mut scene, v2) = every_state().await;
    let run = |args: &'static [&'static str]| {
        let (server, file) = (
            scene.hub.as_ref().expect("hub").base.clone(),
            scene.state.path().join("admin-token"),
        );
        std::fs::write(&file, &scene.admin).expect("token file");
        tokio::task::spawn_blocking(move || run_status(&server, &file, args))
    };

    let (code, out, err) = run(&[]).await.expect("runs");
    assert_eq!(code, 1, "a failed cluster: exit 1\n{out}{err}");
    let short_v2 = format!("main@{}", &v2["main@sha1:".len()..][..10]);
    assert!(
        out.starts_with(&format!("revision   {short_v2} (served)\n")),
        "{out}"
    );
    assert!(
        out.contains(
            "clusters   8: 1 failed, 1 offline, 1 pending, 1 never-seen, 1 paused, 2 waiting, 1 in-sync\n"
        ),
        "{out}"
    );
    assert!(
        !out.contains('\x1b'),
        "no colour when not a terminal:\n{out}"
    );
    // The active rollout, with its waves' progress.
    let rollout = out
        .lines()
        .find(|l| l.contains("stores"))
        .unwrap_or_else(|| panic!("no rollout line:\n{out}"));
    assert!(
        rollout.contains(&short_v2) && rollout.contains("canary"),
        "{rollout}"
    );
    // The clusters needing attention, most urgent first, in aligned columns.
    let header = out
        .lines()
        .find(|l| l.starts_with("CLUSTER"))
        .expect("cluster table");
    let listed: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("CLUSTER"))
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(listed, ["c1", "s3", "lab", "fresh"], "{out}");
    assert_eq!(
        row(&out, "c1"),
        [
            "c1",
            "failed",
            "canary",
            "0s ago",
            "Deployment.apps app/app: CrashLoopBackOff"
        ]
    );
    assert_eq!(row(&out, "s3")[..4], ["s3", "offline", "rest", "6m ago"]);
    assert!(
        row(&out, "s3")[4].starts_with("silent for 6m, runs sha256:"),
        "{out}"
    );
    assert_eq!(row(&out, "lab")[..2], ["lab", "pending"]);
    assert_eq!(
        row(&out, "fresh"),
        [
            "fresh",
            "never-seen",
            "-",
            "never",
            "no report yet: is its agent running?"
        ]
    );
    let state_column = header.find("STATE").expect("STATE");
    for cluster in ["c1", "s3", "lab", "fresh"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{cluster} ")))
            .expect("row");
        assert!(
            line[state_column..].starts_with(row(&out, cluster)[1]),
            "columns aligned:\n{out}"
        );
    }

    // Filters list every matching cluster; the exit code follows the selection.
    let (code, out, _) = run(&["--state", "waiting"]).await.expect("runs");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clusters   2: 2 waiting\n"), "{out}");
    assert_eq!(row(&out, "s1")[..3], ["s1", "waiting", "rest"]);
    assert_eq!(row(&out, "s2")[..3], ["s2", "waiting", "rest"]);
    let (code, out, _) = run(&["--group", "canary"]).await.expect("runs");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("clusters   1: 1 failed\n"), "{out}");
    let (code, out, _) = run(&["--cluster", "s4"]).await.expect("runs");
    assert_eq!(code, 0, "{out}");
    assert_eq!(row(&out, "s4")[..2], ["s4", "paused"]);
    let (code, _, err) = run(&["--state", "broken"]).await.expect("runs");
    assert_eq!(code, 2);
    assert!(err.contains("the states are in-sync, pending"), "{err}");

    // JSON: the same, for scripts.
    let (code, out, err) = run(&["-o", "json"]).await.expect("runs");
    assert_eq!(code, 1, "{err}");
    let json: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(json["revision"], v2.as_str());
    assert_eq!(json["failed"], 1);
    assert_eq!(json["counts"]["waiting"], 2);
    assert_eq!(json["counts"]["offline"], 1);
    assert_eq!(json["rollouts"][0]["policy"], "stores");
    let names: Vec<&str> = json["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        ["c1", "s3", "lab", "fresh", "s4", "s1", "s2", "edge"]
    );
    assert_eq!(json["clusters"][1]["silentForSeconds"], 360);
    assert_eq!(json["clusters"][0]["groups"], serde_json::json!(["canary"]));

    let server = scene.hub.as_ref().expect("hub").base.clone();
    scene.stop().await;
    // The hub cannot be asked: exit 2, and why.
    let (code, _, err) = run_status(&server, &scene.state.path().join("admin-token"), &[]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach the hub"), "{err}");
}
