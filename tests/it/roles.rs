//! Roles for people in the real hub: every endpoint of the API and every page and
//! button of the web page, asked with each kind of token — none, a cluster's, a
//! viewer's, an operator's, an admin's, and a viewer's and an operator's limited to a
//! tenant — made with the real `flotilla token create`.
//!
//! The first fleets have no tenant, so every cluster and rollout is another's (the
//! platform's) to the tenant's tokens: they must see none of it by any URL. The last
//! tests seed the hub's store, before it starts, with bundles that carry the tenant
//! `shop` in `meta.tenants` (as a fleet with `kind: Tenant` renders them) and check
//! what the tenant's tokens see and steer of them in the real hub.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::rollout_e2e::{Fleet, POLICY, START, Scene};
use crate::support::hub::{client, make_token, token_by_command};
use flotilla_core::bundle::{Bundle, BundleMeta, Resource, ResourceKey, TenantMark};
use flotilla_hub::auth::token_id;
use flotilla_hub::clock::ManualClock;
use flotilla_hub::store::{Commit, Database, ServedChange, Store};

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
    let mut args = vec!["--role", role];
    if let Some(tenant) = tenant {
        args.extend(["--tenant", tenant]);
    }
    token_by_command(state, &Database::StateDir, &args)
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

    // A person's token is refused a bundle with the reason, its role named as a
    // sentence names it.
    for (who, named) in [("viewer", "a viewer's"), ("operator", "an operator's")] {
        let (status, body) = send(
            &scene,
            &get("", "/v1/clusters/c1/bundle".into(), [0; 7]),
            Some(people.token(who)),
        )
        .await;
        assert_eq!(status, 403, "{who}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with(&format!("{named} token never reads bundles")),
            "{who}: {error}"
        );
    }

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

/// A cluster's bundle as HEAD renders it, with the tenant `shop`'s workload `web` (a
/// ConfigMap in namespace `shop`) added, and, if `platform_change`, the platform's
/// ConfigMap changed too: what the cluster ran before HEAD, had `shop` been there.
fn with_shop(head: &Bundle, platform_change: bool) -> Bundle {
    let meta = head.meta.as_deref().cloned().unwrap_or_default();
    assert_eq!(
        meta.workloads.len(),
        head.resources.len(),
        "HEAD's bundle names its resources' workloads"
    );
    let mut resources: Vec<(Value, String)> = head
        .resources
        .iter()
        .zip(&meta.workloads)
        .map(|(resource, workload)| {
            let mut value = resource.value();
            if platform_change && value["kind"] == "ConfigMap" {
                value["data"]["version"] = json!("v0");
            }
            (value, workload.clone())
        })
        .collect();
    resources.push((
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "web", "namespace": "shop"}, "data": {"shop": "open"}}),
        "web".to_string(),
    ));
    resources.sort_by_key(|(value, _)| ResourceKey::of(value).expect("an identity"));
    let mut phases = meta.phases.clone();
    if let Some(first) = phases.first_mut() {
        first.push("web".into());
    }
    let mut tenants = std::collections::BTreeMap::new();
    tenants.insert(
        "shop".to_string(),
        TenantMark {
            workloads: vec!["web".into()],
            namespaces: vec!["shop".into()],
            cluster_scoped: Vec::new(),
        },
    );
    let meta = BundleMeta {
        workloads: resources.iter().map(|(_, w)| w.clone()).collect(),
        phases,
        tenants,
        ..meta
    };
    let resources = resources
        .iter()
        .map(|(value, _)| {
            Arc::new(Resource::new(
                ResourceKey::of(value).expect("an identity"),
                value,
            ))
        })
        .collect();
    Bundle::from_sorted_with_meta(head.cluster.clone(), resources, Some(meta))
}

/// The rollout fleet with its workload's drift policy `report` (so HEAD's bundles name
/// their workloads in `meta`), its store seeded before the hub first starts: every
/// cluster served what HEAD renders for it, but the canary `c1` and `s1` served a
/// bundle that also holds the tenant `shop`'s workload, and, if `mixed`, `s2` one
/// that also holds it and an older platform ConfigMap. The hub renders HEAD, whose
/// bundles hold no tenant: a rollout of those clusters starts; its canary has not been
/// heard from, so once the hub has settled it pauses before the second wave, and `s1`
/// and `s2` keep the bundles with `shop`. Returns the scene, the rollout's id and the clusters whose served
/// bundle holds `shop` once it has paused.
async fn shop_on_clusters(mixed: bool) -> (Scene, i64, Vec<String>) {
    let fleet = Fleet::new(&["c1"], POLICY);
    fleet.repo.write(
        "workloads/app/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: app\nspec:\n  namespace: app\n  drift: report\n  targets:\n    - clusterSelector: {}\n  vars:\n    version: v1\n",
    );
    let revision = format!("main@sha1:{}", fleet.repo.commit("v1"));
    let snapshot = flotilla_hub::source::from_folder(fleet.repo.path(), "").expect("snapshot");
    let head = flotilla_render::render(&snapshot);
    assert!(
        head.diagnostics
            .iter()
            .all(|d| d.severity != flotilla_core::diagnostic::Severity::Error),
        "{:?}",
        head.diagnostics
    );
    let seeded: Vec<Bundle> = head
        .bundles
        .values()
        .map(|bundle| match bundle.cluster.as_str() {
            "c1" | "s1" => with_shop(bundle, false),
            "s2" if mixed => with_shop(bundle, true),
            _ => bundle.clone(),
        })
        .collect();
    let with_shop_digests: Vec<String> = seeded
        .iter()
        .filter(|b| b.meta.as_ref().is_some_and(|m| !m.tenants.is_empty()))
        .map(|b| b.digest.to_string())
        .collect();
    let state = tempfile::tempdir().expect("state dir");
    let store = Store::open(state.path()).await.expect("store");
    store
        .objects
        .write_all(
            seeded
                .iter()
                .map(|b| (b.digest.clone(), b.canonical_body()))
                .collect(),
        )
        .await
        .expect("objects");
    store
        .commit(&Commit {
            served: seeded
                .iter()
                .map(|b| ServedChange {
                    cluster: b.cluster.clone(),
                    digest: b.digest.clone(),
                    revision: "main@sha1:0000000000000000000000000000000000000000".into(),
                    hold: false,
                })
                .collect(),
            history: 10,
            now_ms: (START * 1000) as i64,
            ..Commit::default()
        })
        .await
        .expect("served");
    store.close().await;
    let admin = make_token(state.path(), None).await;
    let s1 = make_token(state.path(), Some("s1")).await;
    // People's tokens, made with the real command line before the hub starts: the
    // hub then reads them at its start, and no other process writes its database
    // while it runs.
    let mut tokens: BTreeMap<String, String> = [("s1".to_string(), s1)].into();
    for (who, role, tenant) in [
        ("operator@shop", "operator", Some("shop")),
        ("viewer@shop", "viewer", Some("shop")),
        ("operator@bank", "operator", Some("bank")),
        ("operator", "operator", None),
    ] {
        tokens.insert(who.to_string(), person_token(state.path(), role, tenant));
    }
    let mut scene = Scene {
        fleet,
        state,
        hub: None,
        clock: Arc::new(ManualClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(START),
        )),
        client: client(),
        admin,
        tokens,
        runs: Default::default(),
        database: Database::StateDir,
    };
    scene.start().await;
    scene.wait_revision(&revision).await;
    // No cluster was ever heard from: the hub settles for the offline threshold before
    // it releases a wave, then finds the canary out of reach and pauses.
    scene.clock.advance(Duration::from_secs(6 * 60));
    scene.wait_rollout_state(&revision, "paused").await;
    let rollout = scene.rollout_of(&revision).await;
    let expected = if mixed {
        ["c1", "s1", "s2"].as_slice()
    } else {
        ["c1", "s1"].as_slice()
    };
    assert_eq!(names(&rollout["clusters"]), expected, "{rollout}");
    let holding: Vec<String> = scene
        .served()
        .await
        .into_iter()
        .filter(|(_, (served, _))| with_shop_digests.contains(served))
        .map(|(name, _)| name)
        .collect();
    assert!(
        holding.contains(&"s1".to_string()),
        "s1 keeps its bundle until its wave: {holding:?}"
    );
    (scene, rollout["id"].as_i64().expect("id"), holding)
}

async fn get_as(scene: &Scene, token: &str, path: &str) -> (u16, Value) {
    let call = Call {
        method: "GET",
        route: "",
        path: path.to_string(),
        body: None,
        expect: [0; 7],
    };
    send(scene, &call, Some(token)).await
}

async fn post_as(scene: &Scene, token: &str, path: &str) -> (u16, Value) {
    let call = Call {
        method: "POST",
        route: "",
        path: path.to_string(),
        body: None,
        expect: [0; 7],
    };
    send(scene, &call, Some(token)).await
}

/// `/v1/fleet` as `token` sees it, once the hub knows the token: it looks for new
/// tokens at most every quarter of a second, later on a loaded machine.
async fn known_to_the_hub(scene: &Scene, token: &str) -> Value {
    for _ in 0..100 {
        let (status, fleet) = get_as(scene, token, "/v1/fleet").await;
        if status != 401 {
            assert_eq!(status, 200, "{fleet}");
            return fleet;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the hub never took the token");
}

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    names.sort_unstable();
    names
}

/// A bundle the hub cannot read for a moment (an object store's hiccup) hides its
/// clusters from a tenant only for that moment: what could not be read is not
/// remembered as holding no tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_unreadable_for_a_moment_hides_nothing_from_a_tenant_afterwards() {
    let (mut scene, id, _) = shop_on_clusters(false).await;
    let shop = scene.tokens["operator@shop"].clone();
    let path = format!("/v1/rollouts/{id}");
    let objects = scene.state.path().join("objects").join("sha256");
    // The bundles the rollout's clusters ran before it, which carry the shop.
    let (_, detail) = get_as(&scene, &scene.admin, &path).await;
    let shop_digests: Vec<String> = detail["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|member| {
            let previous = member["previous"].as_str().expect("a previous bundle");
            previous.trim_start_matches("sha256:").to_string()
        })
        .collect();
    assert_eq!(shop_digests.len(), 2, "{detail}");
    let aside = scene.state.path().join("aside");
    std::fs::create_dir_all(&aside).expect("a folder aside");
    for hex in &shop_digests {
        std::fs::rename(objects.join(hex), aside.join(hex)).expect("move the object aside");
    }
    let (status, _) = get_as(&scene, &shop, &path).await;
    assert_eq!(status, 404, "no bundle of the tenant's can be read");
    for hex in &shop_digests {
        std::fs::rename(aside.join(hex), objects.join(hex)).expect("put the object back");
    }
    let (status, rollout) = get_as(&scene, &shop, &path).await;
    assert_eq!(status, 200, "{rollout}");
    assert_eq!(names(&rollout["clusters"]), ["c1", "s1"], "{rollout}");
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_its_clusters_and_steers_a_rollout_that_changes_only_its_workloads() {
    let (mut scene, id, holding) = shop_on_clusters(false).await;
    let shop = scene.tokens["operator@shop"].clone();
    let bank = scene.tokens["operator@bank"].clone();

    // s1's agent reports a failure of the platform's ConfigMap and of the shop's.
    let served = scene.served().await["s1"].0.clone();
    let failed = |namespace: &str, name: &str| {
        json!({"group": "", "kind": "ConfigMap", "namespace": namespace, "name": name,
               "state": "failed", "message": "refused"})
    };
    let response = scene
        .client
        .post(scene.url("/v1/clusters/s1/status"))
        .bearer_auth(&scene.tokens["s1"])
        .json(
            &json!({"applied": served, "attempted": served, "message": "",
                      "agentVersion": "test",
                      "resources": [failed("app", "app"), failed("shop", "web")]}),
        )
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), 200);

    // The shop sees the clusters its workload is on, and no other; on them, only its
    // own resources' failures.
    let fleet = known_to_the_hub(&scene, &shop).await;
    assert_eq!(names(&fleet["clusters"]), holding, "{fleet}");
    let failures = |fleet: &Value| {
        fleet["clusters"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "s1"))
            .map(|c| c["failedResources"].clone())
            .expect("s1")
    };
    assert_eq!(failures(&fleet), json!(["ConfigMap shop/web: refused"]));
    assert_eq!(
        failures(&scene.fleet().await),
        json!(["ConfigMap app/app: refused", "ConfigMap shop/web: refused"])
    );
    let fleet = known_to_the_hub(&scene, &bank).await;
    assert_eq!(names(&fleet["clusters"]), Vec::<String>::new(), "{fleet}");
    // The web page's list of what runs on s1: the shop's workload only, with its
    // state; the whole fleet's operator sees both workloads. Nobody here gets a link
    // into the bundle, and the shop gets no commit subject (it may speak of others).
    let web = web();
    let resources = |body: &str| -> Vec<String> {
        body.split("<table class=\"resources\">")
            .nth(1)
            .and_then(|t| t.split("</tbody>").next())
            .unwrap_or_default()
            .split("<tr>")
            .skip(2)
            .map(|row| {
                row.replace("<td class=\"nowrap\">", "")
                    .replace("<td class=\"name\">", "")
                    .replace("</td>", " ")
                    .replace("</tr>", "")
                    .trim()
                    .to_string()
            })
            .collect()
    };
    let cookie = log_in(&web, &scene, &shop).await.expect("a session");
    let (status, body) = page(&web, &scene, &cookie, "/ui/clusters/s1").await;
    assert_eq!(status, 200);
    assert_eq!(
        resources(&body),
        ["web ConfigMap shop web <span class=\"chip r-failed\" title=\"refused\">failed</span>"],
        "{body}"
    );
    assert!(
        body.contains(
            "<p id=\"runs-summary\">1 workload, 1 resource: <strong class=\"workload\">web</strong>"
        ),
        "{body}"
    );
    let (_, fleet_page) = page(&web, &scene, &cookie, "/ui/").await;
    assert!(!fleet_page.contains("id=\"commit\""), "{fleet_page}");
    let whole = log_in(&web, &scene, &scene.tokens["operator"])
        .await
        .expect("a session");
    let (_, body) = page(&web, &scene, &whole, "/ui/clusters/s1").await;
    assert_eq!(
        resources(&body),
        [
            "app ConfigMap app app <span class=\"chip r-failed\" title=\"refused\">failed</span>",
            "web ConfigMap shop web <span class=\"chip r-failed\" title=\"refused\">failed</span>",
        ],
        "{body}"
    );
    assert!(
        !body.contains("/bundle#"),
        "an operator reads no bundle: {body}"
    );
    let (_, fleet_page) = page(&web, &scene, &whole, "/ui/").await;
    assert!(
        fleet_page.contains("<q id=\"commit-subject\">v1</q>"),
        "{fleet_page}"
    );
    // Still no bundle, even of its own cluster.
    let (status, _) = get_as(&scene, &shop, "/v1/clusters/s1/bundle").await;
    assert_eq!(status, 403);

    // The rollout changes only the shop's workload on c1 and s1 (it leaves): the
    // shop's operator sees and steers it; another tenant does neither.
    let (_, rollouts) = get_as(&scene, &shop, "/v1/rollouts").await;
    assert!(
        rollouts["rollouts"]
            .as_array()
            .expect("rollouts")
            .iter()
            .any(|r| r["id"] == id),
        "{rollouts}"
    );
    let (status, detail) = get_as(&scene, &shop, &format!("/v1/rollouts/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(names(&detail["clusters"]), ["c1", "s1"]);
    let (status, _) = get_as(&scene, &bank, &format!("/v1/rollouts/{id}")).await;
    assert_eq!(status, 404);
    let (status, _) = post_as(&scene, &bank, &format!("/v1/rollouts/{id}/resume")).await;
    assert_eq!(status, 404);
    let (status, resumed) = post_as(&scene, &shop, &format!("/v1/rollouts/{id}/resume")).await;
    assert_eq!(status, 200, "{resumed}");
    // The action is recorded with the token's id and role (the hub's own decisions
    // that follow it have neither).
    let event = resumed["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| !e["by"].is_null()))
        .cloned()
        .expect("the operator's event");
    assert_eq!(
        (&event["message"], &event["by"], &event["role"]),
        (
            &json!("resumed"),
            &json!(token_id(&shop)),
            &json!("operator@shop")
        )
    );
    scene.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_but_cannot_steer_a_rollout_that_also_changes_the_platform() {
    let (mut scene, id, holding) = shop_on_clusters(true).await;
    let shop = scene.tokens["operator@shop"].clone();
    let viewer = scene.tokens["viewer@shop"].clone();
    let operator = scene.tokens["operator"].clone();

    let fleet = known_to_the_hub(&scene, &viewer).await;
    assert_eq!(names(&fleet["clusters"]), holding, "{fleet}");
    assert!(holding.contains(&"s2".to_string()), "{holding:?}");
    let (status, detail) = get_as(&scene, &shop, &format!("/v1/rollouts/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(names(&detail["clusters"]), ["c1", "s1", "s2"]);
    // s2's change is the platform's too: the shop may not steer the rollout.
    let (status, refused) = post_as(&scene, &shop, &format!("/v1/rollouts/{id}/resume")).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("changes more than tenant \"shop\"'s workloads")),
        "{refused}"
    );
    let (status, _) = post_as(&scene, &viewer, &format!("/v1/rollouts/{id}/resume")).await;
    assert_eq!(status, 403);
    // A whole-fleet operator may.
    let (status, resumed) = post_as(&scene, &operator, &format!("/v1/rollouts/{id}/resume")).await;
    assert_eq!(status, 200, "{resumed}");
    // The web page offers the shop's operator no button on it either.
    let web = web();
    let cookie = log_in(&web, &scene, &shop).await.expect("a session");
    let (status, body) = page(&web, &scene, &cookie, &format!("/ui/rollouts/{id}")).await;
    assert_eq!(status, 200);
    assert!(!body.contains("id=\"action-"), "{body}");
    assert!(
        body.contains(">s1</a>") && body.contains(">s2</a>"),
        "{body}"
    );
    scene.stop().await;
}

/// End to end, with nothing seeded: a fleet gains a `kind: Tenant` file and a
/// workload of the tenant's on one cluster; the real hub renders `meta.tenants` into
/// that cluster's bundle, and the tenant's token sees that cluster alone while
/// another tenant's sees none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_file_in_the_fleet_scopes_the_tenants_tokens_to_the_clusters_it_renders_onto() {
    let scene = Scene::at_v1(&["c1"], POLICY).await;
    let repo = &scene.fleet.repo;
    repo.write(
        "tenants/shop.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Tenant\nmetadata:\n  name: shop\nspec:\n  workloads: [till]\n  clusterSelector: {matchLabels: {kind: store}}\n  namespaces: [shop]\n",
    );
    repo.write(
        "workloads/till/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: till\nspec:\n  namespace: shop\n  targets:\n    - cluster: s1\n",
    );
    repo.write(
        "workloads/till/manifests/till.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: till\ndata:\n  lanes: \"4\"\n",
    );
    let revision = format!(
        "main@sha1:{}",
        repo.commit("the shop's till\n\nFlotilla-Rollout: immediate")
    );
    scene.wait_revision(&revision).await;
    let state = scene.state.path().to_path_buf();
    let shop = person_token(&state, "viewer", Some("shop"));
    let bank = person_token(&state, "viewer", Some("bank"));
    let mut seen = Vec::new();
    for _ in 0..100 {
        let fleet = known_to_the_hub(&scene, &shop).await;
        seen = names(&fleet["clusters"]);
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, ["s1"]);
    // `token create` warns of a tenant no served bundle holds, and only of it.
    let dir = state.display().to_string();
    for (tenant, warned) in [("shop", false), ("bank", true)] {
        let (code, stdout, stderr) = flotilla(&[
            "token",
            "create",
            "--state-dir",
            &dir,
            "--role",
            "viewer",
            "--tenant",
            tenant,
        ]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.starts_with("flt_"), "{stdout}");
        let warning = format!("no cluster's bundle holds a workload of tenant \"{tenant}\" yet");
        assert_eq!(stderr.contains(&warning), warned, "{tenant}: {stderr}");
    }
    let fleet = known_to_the_hub(&scene, &bank).await;
    assert!(names(&fleet["clusters"]).is_empty(), "{fleet}");
    // The platform's view is whole.
    let (status, fleet) = get_as(&scene, &scene.admin, "/v1/fleet").await;
    assert_eq!(status, 200);
    assert_eq!(
        names(&fleet["clusters"]).len(),
        scene.fleet.clusters().len()
    );
}
