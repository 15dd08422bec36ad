//! Roles for people in the real hub: every endpoint of the API and every page and
//! button of the web page, asked with each kind of token — none, a cluster's, a
//! viewer's, an operator's, an admin's, and a viewer's and an operator's limited to a
//! tenant — made with the real `flotilla token create`.
//!
//! This fleet has no `kind: Tenant`, so every cluster and rollout is another's (the
//! platform's) to the tenant's tokens: they must see none of it by any URL. What a
//! tenant sees of its own clusters is decided by `flotilla_core::access`, tested there
//! on bundles that carry `meta.tenants`.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::rollout_e2e::{POLICY, Scene};
use flotilla_hub::auth::token_id;

/// Runs `flotilla`; returns (exit code, stdout, stderr).
fn flotilla(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_STATE_DIR")
        .output()
        .expect("flotilla runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A person's token made with the real command line, beside the running hub.
fn person_token(state: &Path, role: &str, tenant: Option<&str>) -> String {
    let state = state.display().to_string();
    let mut args = vec!["token", "create", "--role", role, "--state-dir", &state];
    if let Some(tenant) = tenant {
        args.extend(["--tenant", tenant]);
    }
    let (code, stdout, stderr) = flotilla(&args);
    assert_eq!(code, 0, "{stderr}");
    stdout.trim().to_string()
}

/// The kinds of token, in the order of the expectations below.
const WHO: [&str; 7] = [
    "no token",
    "cluster c1",
    "viewer",
    "operator",
    "admin",
    "viewer@shop",
    "operator@shop",
];

struct People {
    tokens: [Option<String>; 7],
}

impl People {
    async fn of(scene: &Scene) -> People {
        let state = scene.state.path();
        People {
            tokens: [
                None,
                Some(scene.tokens["c1"].clone()),
                Some(person_token(state, "viewer", None)),
                Some(person_token(state, "operator", None)),
                Some(scene.admin.clone()),
                Some(person_token(state, "viewer", Some("shop"))),
                Some(person_token(state, "operator", Some("shop"))),
            ],
        }
    }

    fn token(&self, who: &str) -> &str {
        let index = WHO.iter().position(|w| *w == who).expect("a kind of token");
        self.tokens[index].as_deref().expect("a token")
    }
}

/// One request of the API.
struct Call {
    method: &'static str,
    /// The route as `GET /` lists it, to check that every route is covered.
    route: &'static str,
    path: String,
    body: Option<Value>,
    /// The status each kind of token gets, in the order of [`WHO`].
    expect: [u16; 7],
}

async fn send(scene: &Scene, call: &Call, token: Option<&str>) -> (u16, Value) {
    let url = scene.url(&call.path);
    let mut request = match call.method {
        "GET" => scene.client.get(&url),
        _ => scene.client.post(&url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = &call.body {
        request = request.json(body);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_each_role_and_a_tenant_sees_nothing_of_the_platform() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_revision(&v2).await;
    let rollout = scene.rollout_of(&v2).await;
    let id = rollout["id"].as_i64().expect("id");
    scene.poll("c1").await;
    let digest = scene.runs["c1"].clone();
    let people = People::of(&scene).await;
    let report = json!({"applied": digest, "attempted": digest, "resources": [],
                        "message": "", "agentVersion": "test"});

    let get = |route: &'static str, path: String, expect: [u16; 7]| Call {
        method: "GET",
        route,
        path,
        body: None,
        expect,
    };
    // Reading: a viewer, an operator and an admin read the fleet and the rollouts; only
    // an admin of the whole fleet reads bundles; a tenant's token reads the fleet and
    // the rollouts, cut down to its tenant (here: nothing), and no bundle.
    //                       none  c1   viewer oper admin v@shop o@shop
    let reads = [200, 403, 200, 200, 200, 200, 200];
    let bundles = [401, 200, 403, 403, 200, 403, 403];
    let calls = vec![
        get(
            "/v1/clusters/{cluster}/bundle",
            "/v1/clusters/c1/bundle".into(),
            bundles,
        ),
        get(
            "/v1/clusters/{cluster}/bundle",
            "/v1/clusters/c1/bundle?wait=1s".into(),
            bundles,
        ),
        get(
            "/v1/clusters/{cluster}/bundles/{digest}",
            format!("/v1/clusters/c1/bundles/{digest}"),
            bundles,
        ),
        get(
            "/v1/fleet",
            "/v1/fleet".into(),
            [401, 403, 200, 200, 200, 200, 200],
        ),
        get("/v1/fleet", "/v1/fleet?drifted=false".into(), {
            let mut r = reads;
            r[0] = 401;
            r
        }),
        get(
            "/v1/rollouts",
            "/v1/rollouts".into(),
            [401, 403, 200, 200, 200, 200, 200],
        ),
        // A rollout a tenant does not see is answered as one that does not exist.
        get(
            "/v1/rollouts/{id}",
            format!("/v1/rollouts/{id}"),
            [401, 403, 200, 200, 200, 404, 404],
        ),
        get("/healthz", "/healthz".into(), [200; 7]),
        get("/readyz", "/readyz".into(), [200; 7]),
        get("/metrics", "/metrics".into(), [200; 7]),
        Call {
            method: "POST",
            route: "/v1/clusters/{cluster}/status",
            path: "/v1/clusters/c1/status".into(),
            body: Some(report),
            expect: [401, 200, 403, 403, 403, 403, 403],
        },
        // The webhook takes no token: it is off on this hub.
        Call {
            method: "POST",
            route: "/v1/hooks/git",
            path: "/v1/hooks/git".into(),
            body: Some(json!({})),
            expect: [404; 7],
        },
        // Steering, refused to all but operators and admins; the operator pauses and
        // the admin resumes below.
        Call {
            method: "POST",
            route: "/v1/rollouts/{id}/{action}",
            path: format!("/v1/rollouts/{id}/pause"),
            body: None,
            expect: [401, 403, 403, 0, 0, 403, 404],
        },
    ];
    // Every route of the API is asked.
    let index: Value = scene
        .client
        .get(scene.url("/"))
        .send()
        .await
        .expect("GET /")
        .json()
        .await
        .expect("JSON");
    for endpoint in index["endpoints"].as_array().expect("endpoints") {
        let route = endpoint["path"].as_str().expect("path");
        if route.starts_with("/ui/") {
            continue;
        }
        assert!(
            calls.iter().any(|c| c.route == route),
            "no case asks {route}"
        );
    }
    for call in &calls {
        for (index, who) in WHO.iter().enumerate() {
            if call.expect[index] == 0 {
                continue;
            }
            let (status, body) = send(&scene, call, people.tokens[index].as_deref()).await;
            assert_eq!(
                status, call.expect[index],
                "{} {} with {who}: {body}",
                call.method, call.path
            );
        }
    }

    // What a tenant's token reads: an empty fleet and no rollout, not an error; and a
    // hidden rollout's 404 reads as a missing one's.
    for who in ["viewer@shop", "operator@shop"] {
        let token = people.token(who);
        let (_, fleet) = send(&scene, &calls[3], Some(token)).await;
        assert_eq!(fleet["clusters"], json!([]), "{who}: {fleet}");
        assert!(
            fleet["counts"]
                .as_object()
                .expect("counts")
                .values()
                .all(|n| n == 0),
            "{who}: {fleet}"
        );
        let (_, rollouts) = send(&scene, &calls[5], Some(token)).await;
        assert_eq!(rollouts["rollouts"], json!([]), "{who}");
        let (_, hidden) = send(&scene, &calls[6], Some(token)).await;
        let missing = get("/v1/rollouts/{id}", "/v1/rollouts/987654".into(), [0; 7]);
        let (status, missing) = send(&scene, &missing, Some(token)).await;
        assert_eq!(status, 404);
        assert_eq!(
            hidden["error"]
                .as_str()
                .map(|e| e.replace(&id.to_string(), "ID")),
            missing["error"].as_str().map(|e| e.replace("987654", "ID")),
        );
    }
    // Whole-fleet readers see the cluster and the rollout.
    for who in ["viewer", "operator", "admin"] {
        let (_, fleet) = send(&scene, &calls[3], Some(people.token(who))).await;
        assert_eq!(fleet["clusters"].as_array().map(Vec::len), Some(6), "{who}");
        let (_, rollouts) = send(&scene, &calls[5], Some(people.token(who))).await;
        assert!(
            rollouts["rollouts"]
                .as_array()
                .expect("rollouts")
                .iter()
                .any(|r| r["id"] == id),
            "{who}"
        );
    }

    // The operator pauses, the admin resumes; each decision records the token's id
    // and role.
    let action = |name: &str| Call {
        method: "POST",
        route: "/v1/rollouts/{id}/{action}",
        path: format!("/v1/rollouts/{id}/{name}"),
        body: None,
        expect: [0; 7],
    };
    let (status, paused) = send(&scene, &action("pause"), Some(people.token("operator"))).await;
    assert_eq!(
        (status, &paused["state"]),
        (200, &json!("paused")),
        "{paused}"
    );
    let (status, resumed) = send(&scene, &action("resume"), Some(people.token("admin"))).await;
    assert_eq!(status, 200, "{resumed}");
    let detail = send(
        &scene,
        &get("", format!("/v1/rollouts/{id}"), [0; 7]),
        Some(people.token("viewer")),
    )
    .await
    .1;
    let acted: Vec<(String, String, String)> = detail["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| !e["by"].is_null())
        .map(|e| {
            (
                e["message"].as_str().unwrap_or_default().to_string(),
                e["by"].as_str().unwrap_or_default().to_string(),
                e["role"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        acted,
        [
            (
                "paused".to_string(),
                token_id(people.token("operator")),
                "operator".to_string()
            ),
            (
                "resumed".to_string(),
                token_id(people.token("admin")),
                "admin".to_string()
            ),
        ]
    );

    // The command line lists each token with what it grants.
    let state = scene.state.path().display().to_string();
    let (code, listing, _) = flotilla(&["token", "list", "--state-dir", &state]);
    assert_eq!(code, 0);
    for (who, shown) in [
        ("viewer", "viewer"),
        ("operator", "operator"),
        ("viewer@shop", "viewer of tenant shop"),
        ("operator@shop", "operator of tenant shop"),
    ] {
        let line = listing
            .lines()
            .find(|l| l.starts_with(&token_id(people.token(who))))
            .unwrap_or_else(|| panic!("{who} is listed: {listing}"));
        assert!(line.contains(&format!("  {shown} ")), "{line}");
    }
    scene.stop().await;
}

/// A client that shows redirects instead of following them, and keeps no cookies.
fn web() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// Logs in to the web page; returns the session cookie, or the login's status.
async fn log_in(web: &reqwest::Client, scene: &Scene, token: &str) -> Result<String, u16> {
    let origin = scene.hub.as_ref().expect("hub").base.clone();
    let response = web
        .post(scene.url("/ui/login"))
        .header("origin", &origin)
        .form(&[("token", token)])
        .send()
        .await
        .expect("login");
    let status = response.status().as_u16();
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|c| c.split(';').next())
        .map(str::to_string);
    match (status, cookie) {
        (303, Some(cookie)) => Ok(cookie),
        _ => Err(status),
    }
}

async fn page(web: &reqwest::Client, scene: &Scene, cookie: &str, path: &str) -> (u16, String) {
    let response = web
        .get(scene.url(path))
        .header("cookie", cookie)
        .send()
        .await
        .expect("page");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The value of `name="csrf"` in a page's forms.
fn csrf_of(body: &str) -> String {
    let marker = "name=\"csrf\" value=\"";
    let at = body.find(marker).expect("a form token") + marker.len();
    body[at..at + 64].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_and_button_answers_each_role() {
    let mut scene = Scene::at_v1(&["c1"], POLICY).await;
    let v2 = scene.fleet.release("v2", "v2");
    scene.wait_revision(&v2).await;
    let id = scene.rollout_of(&v2).await["id"].as_i64().expect("id");
    let people = People::of(&scene).await;
    let web = web();
    let origin = scene.hub.as_ref().expect("hub").base.clone();

    // A cluster's token opens no session.
    assert_eq!(
        log_in(&web, &scene, people.token("cluster c1")).await,
        Err(403)
    );
    // Per person: (fleet, cluster page, its bundle, rollout page, steering buttons,
    // a steering form's answer).
    //             who            cluster bundle rollout buttons post
    let expect = [
        ("viewer", 200, 403, 200, false, 403),
        ("operator", 200, 403, 200, true, 303),
        ("admin", 200, 200, 200, true, 303),
        ("viewer@shop", 404, 403, 404, false, 403),
        ("operator@shop", 404, 403, 404, false, 404),
    ];
    for (who, cluster, bundle, rollout, buttons, post) in expect {
        let cookie = log_in(&web, &scene, people.token(who))
            .await
            .unwrap_or_else(|status| panic!("{who} logs in: {status}"));
        let (status, fleet) = page(&web, &scene, &cookie, "/ui/").await;
        assert_eq!(status, 200, "{who}");
        // Who is logged in, and with which role.
        assert!(
            fleet.contains(&format!("<code>{}</code>", token_id(people.token(who))))
                && fleet.contains(&format!("<strong id=\"role\">{who}</strong>")),
            "{who}: {fleet}"
        );
        let tenant = who.contains('@');
        assert_eq!(
            fleet.contains(">c1</a>"),
            !tenant,
            "{who} sees c1 listed: {fleet}"
        );
        assert_eq!(
            fleet.contains(&format!(">Rollout {id}</a>")),
            !tenant,
            "{who} sees the rollout: {fleet}"
        );
        // The list filtered by name, group or state shows a tenant nothing either.
        for filtered in [
            "/ui/?name=c1",
            "/ui/?group=canary",
            "/ui/?state=pending&page=1",
        ] {
            let (status, body) = page(&web, &scene, &cookie, filtered).await;
            assert_eq!(status, 200, "{who} {filtered}");
            if tenant {
                assert!(!body.contains(">c1</a>"), "{who} {filtered}: {body}");
            } else if filtered == "/ui/?name=c1" {
                assert!(body.contains(">c1</a>"), "{who} {filtered}: {body}");
            }
        }
        let (status, counts) = page(&web, &scene, &cookie, "/ui/fleet.json").await;
        assert_eq!(status, 200);
        let counts: Value = serde_json::from_str(&counts).expect("JSON");
        let total: u64 = counts["counts"]
            .as_object()
            .expect("counts")
            .values()
            .filter_map(Value::as_u64)
            .sum();
        assert_eq!(total, if tenant { 0 } else { 6 }, "{who}: {counts}");
        for (path, expected) in [
            ("/ui/clusters/c1".to_string(), cluster),
            ("/ui/clusters/c1/bundle".to_string(), bundle),
            (format!("/ui/rollouts/{id}"), rollout),
        ] {
            let (status, body) = page(&web, &scene, &cookie, &path).await;
            assert_eq!(status, expected, "{who} {path}: {body}");
            if path == "/ui/clusters/c1" && status == 200 {
                assert_eq!(
                    body.contains("id=\"bundle-link\""),
                    bundle == 200,
                    "{who}: the bundle's link"
                );
            }
            if path.starts_with("/ui/rollouts/") && status == 200 {
                assert_eq!(body.contains("id=\"action-"), buttons, "{who}: {body}");
            }
        }
        // The server refuses what the page does not offer: a steering form posted
        // with the session's own form token.
        let csrf = csrf_of(&fleet);
        let (action, undo) = ("pause", "resume");
        let response = web
            .post(scene.url(&format!("/ui/rollouts/{id}/{action}")))
            .header("cookie", &cookie)
            .header("origin", &origin)
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .expect("post");
        assert_eq!(response.status().as_u16(), post, "{who} posts {action}");
        if post == 303 {
            let (_, body) = page(&web, &scene, &cookie, &format!("/ui/rollouts/{id}")).await;
            assert!(
                body.contains(&format!("[token {}, {who}]", token_id(people.token(who)))),
                "{body}"
            );
            let response = web
                .post(scene.url(&format!("/ui/rollouts/{id}/{undo}")))
                .header("cookie", &cookie)
                .header("origin", &origin)
                .form(&[("csrf", csrf.as_str())])
                .send()
                .await
                .expect("post");
            assert_eq!(response.status().as_u16(), 303, "{who} posts {undo}");
        }
        // Logging out ends the session, whatever the role.
        let response = web
            .post(scene.url("/ui/logout"))
            .header("cookie", &cookie)
            .header("origin", &origin)
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .expect("logout");
        assert_eq!(response.status().as_u16(), 303, "{who} logs out");
        let (status, _) = page(&web, &scene, &cookie, "/ui/").await;
        assert_eq!(status, 303, "{who}'s session ended");
    }
    scene.stop().await;
}

#[test]
fn token_create_refuses_unknown_roles_and_mixed_kinds() {
    let state = tempfile::tempdir().expect("state dir");
    let dir = state.path().display().to_string();
    for (args, message) in [
        (
            vec!["--role", "owner"],
            "invalid value 'owner' for '--role <ROLE>': \"owner\" is not a role; the roles are viewer, operator and admin",
        ),
        (
            vec!["--role", "admin", "--tenant", "shop"],
            "an admin token sees the whole fleet and reads every bundle, so it has no tenant",
        ),
        (
            vec!["red", "--role", "viewer"],
            "a cluster's token is its agent's and has no role",
        ),
        (
            vec!["--admin", "--role", "viewer"],
            "--admin is --role admin",
        ),
        (vec!["--tenant", "shop"], "--role <ROLE>"),
    ] {
        let mut full = vec!["token", "create", "--state-dir", &dir, "--init"];
        full.extend(args.iter().copied());
        let (code, stdout, stderr) = flotilla(&full);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}
