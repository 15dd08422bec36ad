//! Seeing the fleet: `flotilla status` against the real hub, with clusters in every
//! state (the hub's clock moved by hand, so one cluster is offline for exactly six
//! minutes).

use std::process::Command;

use serde_json::Value;

use crate::rollout_e2e::{POLICY, Scene};
use crate::support::hub::{eventually, get_json, token_for};

/// The hub with a cluster in each state, and a rollout of v2 under way:
/// - `c1` (canary) took v2 and reports a crashing Deployment: failed;
/// - `s1`, `s2` run v1 and wait for the rest wave: waiting;
/// - `s3` went silent six minutes ago: offline;
/// - `s4` is `spec.paused`: paused;
/// - `lab` (no policy) was sent v2 but still runs v1: pending;
/// - `fresh` (new in v2, no policy) never reported: never-seen;
/// - `edge` (new in v2, no policy) took v2 and is healthy: in-sync, and drifted (its
///   Deployment was scaled by hand and its drift policy leaves it).
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
    // A Secret, whose values the web page must never show: not even in the record
    // `kubectl apply` keeps of it in an annotation.
    scene.fleet.repo.write(
        "workloads/app/manifests/secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: app\n  annotations:\n    \
         kubectl.kubernetes.io/last-applied-configuration: \
         '{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"stringData\":{\"password\":\"hunter2-secret\"}}'\n\
         stringData:\n  password: hunter2-secret\n",
    );
    // A new cluster's token, made as people make them beside the running hub.
    let hub = scene.hub.as_ref().expect("the hub runs");
    let edge = token_for(hub, &scene.database, &["edge"]).await;
    scene.tokens.insert("edge".into(), edge);
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    scene.advance(6, &["s3"]).await;
    scene.report("c1", false).await;
    scene.runs.insert("lab".into(), lab_v1);
    scene.report("lab", true).await;
    assert_eq!(scene.poll("edge").await, 200);
    let drift = serde_json::json!([
        {"group": "apps", "kind": "Deployment", "namespace": "app", "name": "app",
         "fields": ["spec.replicas"], "managers": ["kubectl-edit"], "action": "reported"}
    ]);
    assert_eq!(report_drift(&scene, "edge", drift).await, "in-sync");
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
        out.starts_with(&format!(
            "revision   {short_v2} (served)\ncommit     v2 (flotilla tests)\n"
        )),
        "the served commit's subject and author follow its id: {out}"
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
    assert_eq!(listed, ["c1", "s3", "lab", "fresh", "edge"], "{out}");
    // Drifted, and still in sync: listed for its drift, with what changed.
    assert!(out.contains("drifted    1 ("), "{out}");
    assert_eq!(
        row(&out, "edge"),
        [
            "edge",
            "in-sync",
            "yes",
            "-",
            "0s ago",
            "Deployment.apps app/app: spec.replicas by kubectl-edit (reported)"
        ]
    );
    assert_eq!(
        row(&out, "c1"),
        [
            "c1",
            "failed",
            "-",
            "canary",
            "0s ago",
            "Deployment.apps app/app: CrashLoopBackOff"
        ]
    );
    assert_eq!(
        row(&out, "s3")[..5],
        ["s3", "offline", "-", "rest", "6m ago"]
    );
    assert!(
        row(&out, "s3")[5].starts_with("silent for 6m, runs sha256:"),
        "{out}"
    );
    // Pending since the hub changed what it serves lab (v2), six minutes ago.
    assert_eq!(row(&out, "lab")[..2], ["lab", "pending"]);
    assert!(row(&out, "lab")[5].ends_with(", pending for 6m"), "{out}");
    assert_eq!(
        row(&out, "fresh"),
        [
            "fresh",
            "never-seen",
            "-",
            "-",
            "never",
            "no report yet: is its agent running?"
        ]
    );
    let state_column = header.find("STATE").expect("STATE");
    for cluster in ["c1", "s3", "lab", "fresh", "edge"] {
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
    assert_eq!(row(&out, "s1")[..4], ["s1", "waiting", "-", "rest"]);
    assert_eq!(row(&out, "s2")[..4], ["s2", "waiting", "-", "rest"]);
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
    assert_eq!(
        json["commit"],
        serde_json::json!({"revision": v2, "subject": "v2", "author": "flotilla tests",
                           "authorEmail": "tests@flotilla.invalid"})
    );
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
    assert_eq!(json["clusters"][2]["name"], "lab");
    assert_eq!(json["clusters"][2]["pendingForSeconds"], 360);
    assert_eq!(json["clusters"][0]["pendingForSeconds"], Value::Null);
    assert_eq!(json["clusters"][0]["groups"], serde_json::json!(["canary"]));

    let server = scene.hub.as_ref().expect("hub").base.clone();
    scene.stop().await;
    // The hub cannot be asked: exit 2, and why.
    let (code, _, err) = run_status(&server, &scene.state.path().join("admin-token"), &[]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach the hub"), "{err}");
}

/// A client that shows redirects instead of following them, and keeps no cookies.
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

struct Page {
    status: u16,
    location: Option<String>,
    cookie: Option<String>,
    body: String,
}

async fn send(request: reqwest::RequestBuilder) -> Page {
    let response = request.send().await.expect("request");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (location, cookie) = (header("location"), header("set-cookie"));
    Page {
        status: response.status().as_u16(),
        location,
        cookie,
        body: response.text().await.expect("body"),
    }
}

/// The value of `name="csrf"` in a page's forms.
fn csrf_of(body: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let at = body.find(marker).expect("a form token") + marker.len();
    body[at..at + 64].to_string()
}

/// Cluster names in the order the fleet page's table lists them.
fn listed(body: &str) -> Vec<String> {
    body.split("<tr><td class=\"name\"><a href=\"")
        .skip(1)
        .filter_map(|rest| rest.split_once("\">"))
        .map(|(_, rest)| rest.split("</a>").next().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_page_shows_the_fleet_only_after_login_and_refuses_cross_site_forms() {
    let (mut scene, v2) = every_state().await;
    let web = browser();
    let url = |path: &str| scene.url(path);
    let origin = scene.hub.as_ref().expect("hub").base.clone();
    let rollout_id = scene.rollout_of(&v2).await["id"].as_i64().expect("id");
    let c1_digest = scene.fleet().await["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|c| c["name"] == "c1")
        .map(|c| c["desired"].as_str().expect("digest").to_string())
        .expect("c1");

    // Without a session every page redirects to the login and shows nothing.
    for path in [
        "/ui/".to_string(),
        "/ui/?state=failed".to_string(),
        "/ui/clusters/c1".to_string(),
        "/ui/clusters/c1/bundle".to_string(),
        format!("/ui/rollouts/{rollout_id}"),
    ] {
        let page = send(web.get(url(&path))).await;
        assert_eq!(
            (page.status, page.location.as_deref()),
            (303, Some("/ui/login")),
            "{path}"
        );
        assert!(page.body.is_empty(), "{path} leaks: {}", page.body);
    }
    let json = send(web.get(url("/ui/fleet.json"))).await;
    assert_eq!(json.status, 401);
    assert!(!json.body.contains("counts"), "{}", json.body);
    let forged = send(
        web.post(url(&format!("/ui/rollouts/{rollout_id}/pause")))
            .header("origin", &origin)
            .form(&[("csrf", "0".repeat(64))]),
    )
    .await;
    assert_eq!(forged.status, 303, "no session: to the login");
    let login = send(web.get(url("/ui/login"))).await;
    assert_eq!(login.status, 200);
    assert!(login.body.contains("type=\"password\""), "{}", login.body);
    // Any person's token logs in, not only an admin's: the form says so.
    assert!(
        login
            .body
            .contains("<code>flotilla token create --role viewer</code>")
            && !login.body.contains("admin token"),
        "{}",
        login.body
    );
    assert!(!login.body.contains("c1") && !login.body.contains("sha256:"));

    // Wrong tokens, a cluster's token, and a login posted from another site fail.
    let wrong = send(
        web.post(url("/ui/login"))
            .header("origin", &origin)
            .form(&[("token", "flt_nope")]),
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("unknown or revoked") && wrong.cookie.is_none());
    let cluster_token = send(
        web.post(url("/ui/login"))
            .header("origin", &origin)
            .form(&[("token", scene.tokens["c1"].as_str())]),
    )
    .await;
    assert_eq!(cluster_token.status, 403);
    assert!(cluster_token.cookie.is_none());
    let cross = send(
        web.post(url("/ui/login"))
            .header("origin", "https://evil.example")
            .form(&[("token", scene.admin.as_str())]),
    )
    .await;
    assert_eq!(cross.status, 403);
    assert!(cross.cookie.is_none());

    // The admin token opens a session: an HttpOnly, SameSite=Strict cookie.
    let ok = send(
        web.post(url("/ui/login"))
            .header("origin", &origin)
            .form(&[("token", scene.admin.as_str())]),
    )
    .await;
    assert_eq!((ok.status, ok.location.as_deref()), (303, Some("/ui/")));
    let set_cookie = ok.cookie.expect("a session cookie");
    for part in ["HttpOnly", "SameSite=Strict", "Max-Age=", "Path=/ui"] {
        assert!(set_cookie.contains(part), "{set_cookie}");
    }
    assert!(!set_cookie.contains("Secure"), "plain HTTP: {set_cookie}");
    let cookie = set_cookie
        .split(';')
        .next()
        .expect("name=value")
        .to_string();
    let get = |path: String| web.get(url(&path)).header("cookie", &cookie);

    // The fleet page: counts, groups, the rollout with a bar per wave, the list by urgency.
    let fleet = send(get("/ui/".into())).await;
    assert_eq!(fleet.status, 200);
    for (state, n) in [
        ("failed", 1),
        ("offline", 1),
        ("pending", 1),
        ("never-seen", 1),
        ("paused", 1),
        ("waiting", 2),
        ("in-sync", 1),
    ] {
        assert!(
            fleet
                .body
                .contains(&format!("data-state=\"{state}\">{n}</span>")),
            "{state}: {n}\n{}",
            fleet.body
        );
    }
    assert!(fleet.body.contains("<h2 id=\"counts-h\">8 clusters</h2>"));
    assert!(fleet.body.contains(">canary</a>"), "a bar per group");
    assert!(fleet.body.contains(&format!(">Rollout {rollout_id}</a>")));
    assert_eq!(
        fleet.body.matches("<li class=\"wave\">").count(),
        2,
        "one bar per wave"
    );
    assert!(fleet.body.contains(&v2), "the served revision");
    assert_eq!(
        listed(&fleet.body),
        ["c1", "s3", "lab", "fresh", "s4", "s1", "s2", "edge"]
    );
    assert!(
        fleet
            .body
            .contains("Deployment.apps app&#x2f;app: CrashLoopBackOff")
    );
    assert!(fleet.body.contains("6m ago"), "s3 silent for six minutes");
    assert!(
        fleet.body.contains(", pending for 6m</td>"),
        "lab pending since v2 was served to it: {}",
        fleet.body
    );
    assert!(!fleet.body.contains("hunter2"));
    let failed = send(get("/ui/?state=failed".into())).await;
    assert_eq!(listed(&failed.body), ["c1"]);
    let named = send(get("/ui/?name=s&group=".into())).await;
    assert_eq!(listed(&named.body), ["s3", "fresh", "s4", "s1", "s2"]);
    let canary = send(get("/ui/?group=canary".into())).await;
    assert_eq!(listed(&canary.body), ["c1"]);
    let refresh: Value =
        serde_json::from_str(&send(get("/ui/fleet.json".into())).await.body).expect("json");
    assert_eq!(refresh["counts"]["failed"], 1);
    assert!(fleet.body.contains(&format!(
        "data-stamp=\"{}\"",
        refresh["stamp"].as_str().expect("stamp")
    )));

    // Autoescaped: what an agent reports is shown as text, never as markup.
    let lab_runs = scene.runs["lab"].clone();
    let response = scene
        .client
        .post(url("/v1/clusters/lab/status"))
        .bearer_auth(&scene.tokens["lab"])
        .json(
            &serde_json::json!({"applied": lab_runs, "attempted": lab_runs, "resources": [],
            "message": "<script>alert(1)</script>", "agentVersion": "test"}),
        )
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), 200);
    let lab = send(get("/ui/clusters/lab".into())).await;
    assert!(!lab.body.contains("<script>alert"), "{}", lab.body);
    assert!(
        lab.body
            .contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;")
    );

    // The cluster page: digests in full, the failed resources, the recent digests.
    let c1 = send(get("/ui/clusters/c1".into())).await;
    assert_eq!(c1.status, 200);
    assert!(
        c1.body
            .contains(&format!("<code class=\"digest\">{c1_digest}</code>")),
        "{}",
        c1.body
    );
    assert!(c1.body.contains("CrashLoopBackOff") && c1.body.contains("canary"));
    assert!(
        c1.body.contains(
            "<dt>Labels</dt><dd><code class=\"label\">kind=store</code> <code class=\"label\">tier=canary</code></dd>"
        ),
        "the cluster's labels: {}",
        c1.body
    );
    assert!(lab.body.contains("pending for 6m"), "{}", lab.body);
    assert!(c1.body.contains(&v2));
    assert!(
        c1.body
            .matches("<tr><td class=\"digest\"><code>sha256:")
            .count()
            >= 2,
        "recent digests"
    );
    let bundle = send(get("/ui/clusters/c1/bundle".into())).await;
    assert_eq!(bundle.status, 200);
    assert!(bundle.body.contains("(redacted)") && bundle.body.contains("&quot;password&quot;"));
    assert!(
        bundle
            .body
            .contains("last-applied-configuration&quot;: &quot;(redacted)&quot;"),
        "the annotation is named, its value hidden: {}",
        bundle.body
    );
    assert!(!bundle.body.contains("hunter2"), "{}", bundle.body);
    assert_eq!(send(get("/ui/clusters/nope".into())).await.status, 404);

    // The rollout page and its buttons: the canary failed, so the rollout halted and
    // offers resume and abort; the form token and the origin are checked.
    let rollout = send(get(format!("/ui/rollouts/{rollout_id}"))).await;
    assert_eq!(rollout.status, 200);
    assert!(rollout.body.contains("halted"), "{}", rollout.body);
    for button in ["action-resume", "action-abort"] {
        assert!(rollout.body.contains(button), "{button}: {}", rollout.body);
    }
    assert!(!rollout.body.contains("action-pause"));
    assert!(rollout.body.contains("canary") && rollout.body.contains("<ol class=\"events\">"));
    // The members' states are chips coloured as the fleet's states are.
    assert!(
        rollout
            .body
            .contains("<span class=\"chip m-failed\">failed</span>"),
        "{}",
        rollout.body
    );
    let csrf = csrf_of(&rollout.body);
    let post = |action: &str, csrf: &str, origin: Option<&str>| {
        let mut request = web
            .post(url(&format!("/ui/rollouts/{rollout_id}/{action}")))
            .header("cookie", &cookie)
            .form(&[("csrf", csrf)]);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        send(request)
    };
    let zeros = "0".repeat(64);
    assert_eq!(
        post("resume", &zeros, Some(&origin)).await.status,
        403,
        "a stale form token"
    );
    assert_eq!(
        post("resume", &csrf, Some("https://evil.example"))
            .await
            .status,
        403,
        "another site"
    );
    assert_eq!(post("resume", &csrf, None).await.status, 403, "no origin");
    assert_eq!(
        scene.rollout_of(&v2).await["state"],
        "halted",
        "nothing changed"
    );
    // The canary recovers; the operator resumes, then pauses.
    scene.report("c1", true).await;
    let resumed = post("resume", &csrf, Some(&origin)).await;
    let back = format!("/ui/rollouts/{rollout_id}");
    assert_eq!(
        (resumed.status, resumed.location.as_deref()),
        (303, Some(back.as_str()))
    );
    let progressing = send(get(back.clone())).await;
    assert!(
        progressing.body.contains("action-pause"),
        "{}",
        progressing.body
    );
    let paused = post("pause", &csrf, Some(&origin)).await;
    assert_eq!(paused.status, 303);
    let detail = scene.rollout_of(&v2).await;
    assert_eq!(detail["state"], "paused");
    let admin_id = flotilla_hub::auth::token_id(&scene.admin);
    let by_admin = detail["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["by"] == admin_id.as_str())
        .count();
    assert_eq!(
        by_admin, 2,
        "resume and pause, recorded with the token that logged in"
    );
    let after = send(get(back)).await;
    assert!(after.body.contains("action-resume") && !after.body.contains("action-pause"));

    // Logout ends the session: the old cookie opens nothing.
    let logout = send(
        web.post(url("/ui/logout"))
            .header("cookie", &cookie)
            .header("origin", &origin)
            .form(&[("csrf", csrf.as_str())]),
    )
    .await;
    assert_eq!(
        (logout.status, logout.location.as_deref()),
        (303, Some("/ui/login"))
    );
    assert!(logout.cookie.is_some_and(|c| c.contains("Max-Age=0")));
    let gone = send(get("/ui/".into())).await;
    assert_eq!(
        (gone.status, gone.location.as_deref()),
        (303, Some("/ui/login"))
    );
    scene.stop().await;
}

/// Stores in two waves, the canary without a bake: a healthy canary completes its
/// wave at once.
const NO_BAKE: &str = "apiVersion: flotilla.dev/v1alpha1
kind: RolloutPolicy
metadata:
  name: stores
spec:
  clusterSelector: {matchLabels: {kind: store}}
  waves:
    - {name: canary, groups: [canary]}
    - {name: rest}
";

/// The agent of `cluster` reports what it runs, healthy, with this drift; returns the
/// state the hub answers.
async fn report_drift(scene: &Scene, cluster: &str, drift: Value) -> String {
    let runs = scene.runs.get(cluster).cloned();
    let response = scene
        .client
        .post(scene.url(&format!("/v1/clusters/{cluster}/status")))
        .bearer_auth(&scene.tokens[cluster])
        .json(
            &serde_json::json!({"applied": runs, "attempted": runs, "resources": [],
            "message": "applied", "agentVersion": "test", "drift": drift,
            "features": ["drift"]}),
        )
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), 200, "{cluster} reports");
    let answer: Value = response.json().await.expect("json");
    answer["state"].as_str().expect("state").to_string()
}

fn cluster<'a>(fleet: &'a Value, name: &str) -> &'a Value {
    fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {fleet:#}"))
}

fn names(fleet: &Value) -> Vec<&str> {
    fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_a_flag_beside_the_state_in_the_api_the_status_command_and_the_page() {
    let mut scene = Scene::at_v1(&["c1"], NO_BAKE).await;
    // s1 was scaled and its ConfigMap is fought over: drift left in place. s2 was
    // scaled too, and its agent put it back: nothing remains.
    let s1_drift = serde_json::json!([
        {"group": "apps", "kind": "Deployment", "namespace": "app", "name": "app",
         "fields": ["spec.replicas"], "managers": ["kubectl-edit"], "action": "reported"},
        {"kind": "ConfigMap", "namespace": "app", "name": "app",
         "fields": ["data.version"], "managers": ["helm", "<b>ops</b>"], "action": "fighting"},
        {"kind": "ConfigMap", "namespace": "app", "name": "extra", "deleted": true,
         "action": "reported"}
    ]);
    assert_eq!(report_drift(&scene, "s1", s1_drift).await, "in-sync");
    let s2_drift = serde_json::json!([
        {"group": "apps", "kind": "Deployment", "namespace": "app", "name": "app",
         "fields": ["spec.replicas"], "managers": ["kubectl-scale"], "action": "corrected"}
    ]);
    assert_eq!(report_drift(&scene, "s2", s2_drift).await, "in-sync");

    // GET /v1/fleet: drifted is a flag of its own; the states and counts stay.
    let fleet = scene.fleet().await;
    assert_eq!(fleet["drifted"], 1, "{fleet:#}");
    assert_eq!(
        fleet["counts"]["in-sync"], 6,
        "drift is not a state: {fleet:#}"
    );
    let s1 = cluster(&fleet, "s1");
    assert_eq!(
        (&s1["state"], &s1["drifted"]),
        (&"in-sync".into(), &true.into())
    );
    assert_eq!(
        s1["drift"][0],
        serde_json::json!({"resource": "Deployment.apps app/app", "group": "apps",
            "kind": "Deployment", "namespace": "app", "name": "app",
            "fields": ["spec.replicas"], "managers": ["kubectl-edit"], "deleted": false,
            "action": "reported"})
    );
    assert_eq!(
        s1["drift"][1]["managers"],
        serde_json::json!(["helm", "<b>ops</b>"])
    );
    assert_eq!(s1["drift"][1]["action"], "fighting");
    assert_eq!(
        (&s1["drift"][2]["deleted"], &s1["drift"][2]["fields"]),
        (&true.into(), &serde_json::json!([]))
    );
    // Corrected drift is shown, but the cluster is not drifted.
    let s2 = cluster(&fleet, "s2");
    assert_eq!(
        (&s2["state"], &s2["drifted"]),
        (&"in-sync".into(), &false.into())
    );
    assert_eq!(s2["drift"][0]["action"], "corrected");
    assert_eq!(
        s2["drift"][0]["managers"],
        serde_json::json!(["kubectl-scale"])
    );
    assert_eq!(cluster(&fleet, "s3")["drift"], serde_json::json!([]));
    assert_eq!(cluster(&fleet, "s3")["drifted"], false);

    // The filter narrows the list; the counts stay the fleet's.
    let only = get_json(
        &scene.client,
        &scene.url("/v1/fleet?drifted=true"),
        &scene.admin,
    )
    .await;
    assert_eq!(names(&only), ["s1"]);
    assert_eq!(
        (&only["drifted"], &only["counts"]["in-sync"]),
        (&1.into(), &6.into())
    );
    let others = get_json(
        &scene.client,
        &scene.url("/v1/fleet?drifted=false"),
        &scene.admin,
    )
    .await;
    assert_eq!(names(&others), ["c1", "lab", "s2", "s3", "s4"]);
    let bad = scene
        .client
        .get(scene.url("/v1/fleet?drifted=maybe"))
        .bearer_auth(&scene.admin)
        .send()
        .await
        .expect("request");
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.expect("body").contains("drifted=true"));

    // flotilla status: a DRIFTED column; drifted clusters are listed whatever their
    // state, with what drifted and who changed it.
    let token_file = scene.state.path().join("admin-token");
    std::fs::write(&token_file, &scene.admin).expect("token file");
    let server = scene.hub.as_ref().expect("hub").base.clone();
    let run = |args: &'static [&'static str]| {
        let (server, file) = (server.clone(), token_file.clone());
        tokio::task::spawn_blocking(move || run_status(&server, &file, args))
    };
    let (code, out, err) = run(&[]).await.expect("runs");
    assert_eq!(code, 0, "drift is not a failure\n{out}{err}");
    assert!(out.contains("clusters   6: 6 in-sync\n"), "{out}");
    assert!(out.contains("drifted    1 ("), "{out}");
    assert!(out.contains("CLUSTER  STATE    DRIFTED  WAVE"), "{out}");
    assert_eq!(
        row(&out, "s1"),
        [
            "s1",
            "in-sync",
            "yes",
            "rest",
            "0s ago",
            "Deployment.apps app/app: spec.replicas by kubectl-edit (reported); \
             ConfigMap app/app: data.version by helm, <b>ops</b> (fighting); \
             ConfigMap app/extra: deleted (reported)"
        ]
    );
    assert!(
        !out.lines().any(|l| l.starts_with("s2 ")),
        "s2's drift was put back: not listed\n{out}"
    );
    let (code, out, _) = run(&["--drifted"]).await.expect("runs");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clusters   1: 1 in-sync\n"), "{out}");
    let in_table: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("CLUSTER"))
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(in_table, ["s1"], "{out}");
    // One cluster's view: a line per drifted resource, corrected drift included.
    let (_, out, _) = run(&["--cluster", "s1"]).await.expect("runs");
    let drift_lines: Vec<Vec<&str>> = out
        .lines()
        .skip_while(|l| !l.starts_with("CLUSTER  DRIFTED RESOURCE"))
        .skip(1)
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(
        drift_lines,
        [
            vec![
                "s1",
                "Deployment.apps app/app",
                "reported",
                "spec.replicas",
                "kubectl-edit"
            ],
            vec![
                "s1",
                "ConfigMap app/app",
                "fighting",
                "data.version",
                "helm, <b>ops</b>"
            ],
            vec!["s1", "ConfigMap app/extra", "reported", "deleted", "-"],
        ],
        "{out}"
    );
    let (_, out, _) = run(&["--cluster", "s2"]).await.expect("runs");
    assert_eq!(row(&out, "s2")[..3], ["s2", "in-sync", "-"]);
    assert!(
        out.lines().any(|l| l.starts_with("s2 ")
            && l.contains("Deployment.apps app/app")
            && l.contains("corrected")
            && l.contains("kubectl-scale")),
        "{out}"
    );
    let (_, out, _) = run(&["-o", "json", "--drifted"]).await.expect("runs");
    let json: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(json["drifted"], 1);
    assert_eq!(names(&json), ["s1"]);
    assert_eq!(
        json["clusters"][0]["drift"][0]["fields"],
        serde_json::json!(["spec.replicas"])
    );

    // The web page: the drifted clusters with their resources, fields and managers.
    let web = browser();
    let login = send(
        web.post(scene.url("/ui/login"))
            .header("origin", &server)
            .form(&[("token", scene.admin.as_str())]),
    )
    .await;
    let cookie = login
        .cookie
        .expect("a session")
        .split(';')
        .next()
        .expect("name=value")
        .to_string();
    let get = |path: &str| web.get(scene.url(path)).header("cookie", &cookie);
    let page = send(get("/ui/")).await;
    assert_eq!(page.status, 200);
    assert!(
        page.body
            .contains("<span class=\"n\" id=\"drifted-count\">1</span> drifted"),
        "{}",
        page.body
    );
    let drift_rows: Vec<&str> = page
        .body
        .split("<tr class=\"drift\">")
        .skip(1)
        .map(|r| r.split("</tr>").next().unwrap_or_default())
        .collect();
    assert_eq!(
        drift_rows.len(),
        3,
        "a row per drift left on s1: {}",
        page.body
    );
    assert!(
        drift_rows[0].contains("clusters&#x2f;s1\">s1</a>")
            && drift_rows[0].contains("Deployment.apps app&#x2f;app")
            && drift_rows[0].contains("<code>spec.replicas</code>")
            && drift_rows[0].contains("kubectl-edit")
            && drift_rows[0].contains("reported"),
        "{}",
        drift_rows[0]
    );
    assert!(
        drift_rows[1].contains("helm, &lt;b&gt;ops&lt;&#x2f;b&gt;")
            && !page.body.contains("<b>ops"),
        "managers are escaped: {}",
        drift_rows[1]
    );
    assert!(drift_rows[2].contains("deleted"), "{}", drift_rows[2]);
    assert!(
        !page.body.contains("kubectl-scale"),
        "corrected drift is not listed as drift"
    );
    assert_eq!(listed(&page.body), ["c1", "lab", "s1", "s2", "s3", "s4"]);
    let drifted = send(get("/ui/?drifted=true")).await;
    assert_eq!(listed(&drifted.body), ["s1"]);
    assert!(
        drifted
            .body
            .contains("name=\"drifted\" value=\"true\" checked")
    );
    let refresh: Value =
        serde_json::from_str(&send(get("/ui/fleet.json")).await.body).expect("json");
    assert_eq!(refresh["drifted"], 1);
    // A cluster's page: its drift, and its state unchanged.
    let s1_page = send(get("/ui/clusters/s1")).await;
    assert!(
        s1_page.body.contains("<span class=\"chip s-in-sync\">in-sync</span> <span class=\"chip s-drifted\">drifted</span>"),
        "{}",
        s1_page.body
    );
    assert_eq!(s1_page.body.matches("<tr class=\"drift\">").count(), 3);
    assert!(
        s1_page.body.contains("<code>data.version</code>") && s1_page.body.contains("fighting")
    );
    let s2_page = send(get("/ui/clusters/s2")).await;
    assert!(
        s2_page.body.contains("was put back")
            && s2_page.body.contains("kubectl-scale")
            && s2_page.body.contains("corrected")
            && !s2_page.body.contains("s-drifted"),
        "{}",
        s2_page.body
    );

    // A drifted canary is healthy for its rollout: its wave completes at once.
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    assert_eq!(scene.poll("c1").await, 200);
    let c1_drift = serde_json::json!([
        {"group": "apps", "kind": "Deployment", "namespace": "app", "name": "app",
         "fields": ["spec.replicas"], "managers": ["hpa"], "action": "fighting"}
    ]);
    assert_eq!(report_drift(&scene, "c1", c1_drift).await, "in-sync");
    scene.wait_waves(&v2, &["complete", "released"]).await;
    let c1 = scene.fleet().await;
    assert_eq!(
        (&cluster(&c1, "c1")["state"], &cluster(&c1, "c1")["drifted"]),
        (&"in-sync".into(), &true.into())
    );
    scene.stop().await;
}

/// Logs in to the web page with `token`; the session's cookie. A token made beside
/// the running hub is taken once the hub looks for new tokens again (it does so at
/// most every 250 ms), so a refused login is tried again a few times.
async fn web_session(scene: &Scene, web: &reqwest::Client, token: &str) -> String {
    let origin = scene.hub.as_ref().expect("hub").base.clone();
    let mut tries = 0;
    let ok = loop {
        let answer = send(
            web.post(scene.url("/ui/login"))
                .header("origin", &origin)
                .form(&[("token", token)]),
        )
        .await;
        tries += 1;
        if answer.status != 401 || tries == 5 {
            break answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert_eq!(ok.status, 303, "{}", ok.body);
    ok.cookie
        .expect("a session cookie")
        .split(';')
        .next()
        .expect("name=value")
        .to_string()
}

/// The workload column of a cluster page's resources, in order.
fn workload_column(body: &str) -> Vec<String> {
    body.split("<table class=\"resources\">")
        .nth(1)
        .and_then(|t| t.split("</tbody>").next())
        .expect("the resources' table")
        .split("<tr><td class=\"nowrap\">")
        .skip(1)
        .filter_map(|row| row.split("</td>").next())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_page_names_the_workloads_of_the_digest_it_is_served_even_without_metadata() {
    // v2 adds workload `web` to the stores; its rollout holds s1 on v1's digest while
    // the canary c1 runs v2. No bundle needs metadata, so none names its workloads.
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    scene.fleet.repo.write(
        "workloads/web/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: web\nspec:\n  namespace: web\n  targets:\n    - clusterSelector: {matchLabels: {kind: store}}\n",
    );
    scene.fleet.repo.write(
        "workloads/web/manifests/service.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports: [{port: 80}]\n",
    );
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_waves(&v2, &["released", "waiting"]).await;
    let served = scene.served().await;
    assert_ne!(served["s1"].0, served["c1"].0);
    let web = browser();
    let admin = web_session(&scene, &web, &scene.admin).await;
    let page = |cluster: &'static str| {
        let request = web
            .get(scene.url(&format!("/ui/clusters/{cluster}")))
            .header("cookie", admin.clone());
        async move {
            let page = send(request).await;
            assert_eq!(page.status, 200, "{}", page.body);
            page.body
        }
    };
    let c1 = page("c1").await;
    assert_eq!(workload_column(&c1), ["app", "web"], "{c1}");
    assert!(c1.contains("<p id=\"runs-summary\">2 workloads, 2 resources: <strong class=\"workload\">app</strong> <span class=\"muted\">(1)</span>, <strong class=\"workload\">web</strong> <span class=\"muted\">(1)</span>."), "{c1}");
    // s1 is served v1's digest: v1's workloads, not HEAD's.
    let s1 = page("s1").await;
    assert_eq!(workload_column(&s1), ["app"], "{s1}");
    assert!(!s1.contains("neither its bundle nor the hub"), "{s1}");

    // A hub started since v1 was rendered has not rendered s1's digest: it says so.
    scene.stop().await;
    scene.start().await;
    let admin = web_session(&scene, &web, &scene.admin).await;
    let page = |cluster: &'static str| {
        let request = web
            .get(scene.url(&format!("/ui/clusters/{cluster}")))
            .header("cookie", admin.clone());
        async move { send(request).await.body }
    };
    eventually(
        "the restarted hub to render v2",
        std::time::Duration::from_secs(20),
        || {
            let c1 = page("c1");
            async move { (workload_column(&c1.await) == ["app", "web"]).then_some(()) }
        },
    )
    .await;
    let s1 = page("s1").await;
    assert_eq!(workload_column(&s1), ["–"], "{s1}");
    assert!(s1.contains("1 resource <span class=\"muted\">(neither its bundle nor the hub names their workloads: a bundle names them only when it needs to, for dependencies, drift policies, Helm hooks or tenants, and the hub knows them only for bundles it rendered since it started)</span>."), "{s1}");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_page_tells_its_colours_numbers_commit_and_what_each_cluster_runs() {
    let (mut scene, v2) = every_state().await;
    let web = browser();
    let admin = web_session(&scene, &web, &scene.admin).await;
    let get = |cookie: &str, path: &str| {
        send(
            web.get(scene.url(path))
                .header("cookie", cookie.to_string()),
        )
    };

    // The fleet page: the served commit's subject and author beside its id, and in
    // `GET /v1/fleet`.
    let fleet = get(&admin, "/ui/").await;
    assert_eq!(fleet.status, 200);
    assert!(
        fleet.body.contains(&format!(
            "<code class=\"revision\">{v2}</code> <span id=\"commit\"><q id=\"commit-subject\">v2</q> <span class=\"muted\">by <span id=\"commit-author\" title=\"tests@flotilla.invalid\">flotilla tests</span></span></span>"
        )),
        "{}",
        fleet.body
    );
    assert_eq!(scene.fleet().await["commit"]["subject"], "v2");

    // A legend says what each colour of the bars is, and each group's bar has its
    // numbers beside it as text (the group canary holds c1, failed).
    let legend = fleet
        .body
        .split("<ul class=\"legend\"")
        .nth(1)
        .and_then(|rest| rest.split("</ul>").next())
        .expect("a legend");
    for state in [
        "failed",
        "offline",
        "pending",
        "never-seen",
        "paused",
        "waiting",
        "in-sync",
    ] {
        assert!(
            legend.contains(&format!(
                "<span class=\"swatch s-{state}\"></span>{state}</li>"
            )),
            "{state}: {legend}"
        );
    }
    let group_row = |name: &str| {
        fleet
            .body
            .split(&format!("<a href=\"/ui/?group={name}\">"))
            .nth(1)
            .and_then(|rest| rest.split("</tr>").next())
            .unwrap_or_else(|| panic!("no group {name}"))
            .to_string()
    };
    let numbers = |row: &str| -> Vec<String> {
        row.split("<span class=\"num\" data-state=\"")
            .skip(1)
            .filter_map(|n| n.split_once("</span>").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split("</span>").next())
            .map(str::to_string)
            .collect()
    };
    let canary = group_row("canary");
    assert_eq!(numbers(&canary), ["1 failed"], "{canary}");
    assert!(
        canary.contains("aria-label=\"Group canary: 1 failed\""),
        "{canary}"
    );
    // Each wave's bar: its parts with a legend, and its numbers as text. The canary
    // wave changes c1, which failed; the rest wave waits with its three clusters.
    for part in [
        "<span class=\"swatch s-in-sync\"></span>in sync (healthy on the new digest)",
        "<span class=\"swatch s-failed\"></span>failed",
        "<span class=\"swatch s-to-go\"></span>not there yet",
    ] {
        assert!(fleet.body.contains(part), "{part}");
    }
    assert!(
        fleet
            .body
            .contains("aria-label=\"Wave canary: 0 of 1 in sync, 1 failed\""),
        "{}",
        fleet.body
    );
    assert!(
        fleet.body.contains(
            "<span class=\"seg s-failed\" style=\"width:100.0%\" title=\"1 failed\"></span>"
        ),
        "{}",
        fleet.body
    );
    assert!(
        fleet.body.contains("<strong class=\"in-sync-of\">0/1</strong> in sync · <span class=\"s-failed\">1 failed</span>"),
        "{}",
        fleet.body
    );
    assert!(
        fleet
            .body
            .contains("aria-label=\"Wave rest: 0 of 3 in sync, 3 not there yet\""),
        "{}",
        fleet.body
    );
    // Digests in the cluster list are shortened, the full digest in their title.
    let edge_runs = scene.runs["edge"].clone();
    assert!(
        fleet.body.contains(&format!(
            "<td class=\"digest\"><code title=\"{edge_runs}\">{}</code></td>",
            &edge_runs[..19]
        )),
        "{}",
        fleet.body
    );

    // What edge runs: its workload and each resource with its state in the agent's
    // last report, linking to that resource in the bundle view; the Secret by name.
    // Its bundle names no workloads (it needs no metadata): the hub's render does.
    let response = scene
        .client
        .post(scene.url("/v1/clusters/edge/status"))
        .bearer_auth(&scene.tokens["edge"])
        .json(
            &serde_json::json!({"applied": edge_runs, "attempted": edge_runs,
            "message": "applied", "agentVersion": "test",
            "resources": [
                {"kind": "ConfigMap", "namespace": "app", "name": "app", "state": "healthy"},
                {"kind": "Secret", "namespace": "app", "name": "app", "state": "applied"}]}),
        )
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), 200);
    let edge = get(&admin, "/ui/clusters/edge").await;
    assert_eq!(edge.status, 200);
    assert!(
        edge.body
            .contains("<p id=\"runs-summary\">1 workload, 2 resources: <strong class=\"workload\">app</strong> <span class=\"muted\">(2)</span>."),
        "{}",
        edge.body
    );
    let rows: Vec<&str> = edge
        .body
        .split("<table class=\"resources\">")
        .nth(1)
        .and_then(|t| t.split("</tbody>").next())
        .expect("the resources' table")
        .split("<tr>")
        .skip(2)
        .collect();
    assert_eq!(
        rows,
        [
            "<td class=\"nowrap\">app</td><td class=\"nowrap\">ConfigMap</td><td class=\"nowrap\">app</td><td class=\"name\"><a href=\"&#x2f;ui&#x2f;clusters&#x2f;edge&#x2f;bundle#r-ConfigMap%20app%2Fapp\">app</a></td><td class=\"nowrap\"><span class=\"chip r-healthy\">healthy</span></td></tr>",
            "<td class=\"nowrap\">app</td><td class=\"nowrap\">Secret</td><td class=\"nowrap\">app</td><td class=\"name\"><a href=\"&#x2f;ui&#x2f;clusters&#x2f;edge&#x2f;bundle#r-Secret%20app%2Fapp\">app</a></td><td class=\"nowrap\"><span class=\"chip r-applied\">applied</span></td></tr>",
        ],
        "{}",
        edge.body
    );
    assert!(!edge.body.contains("hunter2"));
    // The links land on their resource in the bundle view, the Secret's values hidden.
    let bundle = get(&admin, "/ui/clusters/edge/bundle").await;
    assert_eq!(bundle.status, 200);
    for anchor in ["r-ConfigMap%20app%2Fapp", "r-Secret%20app%2Fapp"] {
        assert!(
            bundle
                .body
                .contains(&format!("<section class=\"resource\" id=\"{anchor}\"")),
            "{anchor}: {}",
            bundle.body
        );
    }
    assert!(!bundle.body.contains("hunter2"), "{}", bundle.body);
    // lab's agent last reported on what it ran before v2: the page says so, and a
    // resource it did not report is marked as such.
    let lab = get(&admin, "/ui/clusters/lab").await;
    assert!(
        lab.body.contains(", which is about <code class=\"digest\""),
        "{}",
        lab.body
    );
    assert!(
        lab.body
            .contains("<span class=\"muted\">not reported</span>")
    );

    // A viewer sees the names, with no link into a bundle.
    let viewer_token = crate::support::hub::token_by_command(
        scene.state.path(),
        &flotilla_hub::store::Database::StateDir,
        &["--role", "viewer"],
    );
    let viewer = web_session(&scene, &web, &viewer_token).await;
    let seen = get(&viewer, "/ui/clusters/edge").await;
    assert!(
        seen.body.contains("<td class=\"name\">app</td>"),
        "{}",
        seen.body
    );
    assert!(!seen.body.contains("/bundle#"), "{}", seen.body);
    scene.stop().await;
}
