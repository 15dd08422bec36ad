//! Bundle features: an agent names the features it understands, and the hub serves it
//! no bundle that needs another: an agent older than a fleet's use of `dependsOn` keeps
//! what it runs (a 304 naming it, after the wait it asked for) instead of being handed
//! a bundle it would refuse, and any client that is not an agent gets the bundle.

use crate::support::hub as hub_common;

use std::time::{Duration, Instant};

use flotilla_core::bundle::verify_document_parts;
use hub_common::*;

const RUNS: &str = "\"sha256:0000000000000000000000000000000000000000000000000000000000000000\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_lacks_a_feature_the_bundle_needs_keeps_what_it_runs() {
    let repo = Repo::new();
    repo.write(
        "workloads/base/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: base\nspec:\n  namespace: kuard\n  targets:\n    - group: kuard-demo\n",
    );
    repo.write(
        "workloads/base/manifests/base.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base\ndata:\n  ready: \"yes\"\n",
    );
    let kuard = repo.read("workloads/kuard/workload.yaml");
    repo.write(
        "workloads/kuard/workload.yaml",
        &format!("{kuard}  dependsOn: [base]\n"),
    );
    repo.commit("kuard after base");
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let admin = make_token(state.path(), None).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let url = hub.url("/v1/clusters/red/bundle");
    let client = client();
    let agent = |features: Option<&str>, runs: Option<&str>, url: &str| {
        let mut request = client
            .get(url)
            .bearer_auth(&token)
            .header("user-agent", "flotilla-agent/0.1.0");
        if let Some(features) = features {
            request = request.header("flotilla-features", features);
        }
        if let Some(runs) = runs {
            request = request.header("if-none-match", runs);
        }
        request.send()
    };

    // An agent that names every feature the bundle needs gets it, phases and all.
    let current = agent(Some("meta, phases, sealed, tenants"), Some(RUNS), &url)
        .await
        .expect("get");
    assert_eq!(current.status(), 200);
    let body = current.bytes().await.expect("body");
    let document = verify_document_parts(&body, Some("red")).expect("verifies");
    let meta = document.bundle.meta.expect("the bundle has meta");
    assert!(meta.phases[0].contains(&"base".to_string()), "{meta:?}");
    assert_eq!(meta.phases.last(), Some(&vec!["kuard".to_string()]));

    // An agent from before features, running something: it keeps it.
    let old = agent(None, Some(RUNS), &url).await.expect("get");
    assert_eq!(old.status(), 304);
    assert_eq!(old.headers()["etag"], RUNS);
    assert!(old.headers().get("x-flotilla-revision").is_none());

    // The same agent running nothing yet is told what to upgrade.
    let fresh = agent(None, None, &url).await.expect("get");
    assert_eq!(fresh.status(), 409);
    let message = fresh.text().await.expect("body");
    assert!(
        message.contains("needs bundle features this agent does not name (meta, phases, tenants)")
            && message.contains("upgrade flotilla-agent"),
        "{message}"
    );

    // An agent that lacks only `phases` and long-polls is answered after its wait,
    // not at once (else it would poll in a loop).
    let started = Instant::now();
    let waited = agent(
        Some("meta, sealed, tenants"),
        Some(RUNS),
        &format!("{url}?wait=1s"),
    )
    .await
    .expect("get");
    assert_eq!(waited.status(), 304);
    assert_eq!(waited.headers()["etag"], RUNS);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "answered after {:?}",
        started.elapsed()
    );

    // Any other client (curl, a mirror) gets the bundle as it is.
    let curl = client
        .get(&url)
        .bearer_auth(&token)
        .send()
        .await
        .expect("get");
    assert_eq!(curl.status(), 200);

    // The fleet says why the cluster keeps what it runs, in the API and `status`.
    let red = |fleet: serde_json::Value| {
        fleet["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .find(|c| c["name"] == "red")
            .cloned()
            .expect("red")
    };
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    assert_eq!(red(fleet)["needsNewerAgent"], serde_json::json!(["phases"]));
    let token_file = state.path().join("admin.token");
    std::fs::write(&token_file, &admin).expect("token file");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["status", "--cluster", "red", "--server", &hub.base])
        .arg("--token-file")
        .arg(&token_file)
        .env_remove("FLOTILLA_SERVER")
        .output()
        .expect("flotilla runs");
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(
        out.contains("needs a newer agent: red is served a bundle that needs phases"),
        "{out}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    // And the cluster's page.
    let web = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let login = web
        .post(hub.url("/ui/login"))
        .header("origin", &hub.base)
        .form(&[("token", admin.as_str())])
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
    let page = web
        .get(hub.url("/ui/clusters/red"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("body");
    assert!(
        page.contains("needs a newer agent</span> what it is served needs phases"),
        "{page}"
    );
    // Once its agent names every feature, it is no longer said.
    let upgraded = agent(
        Some("meta, phases, drift, sealed, tenants"),
        Some(RUNS),
        &url,
    )
    .await
    .expect("get");
    assert_eq!(upgraded.status(), 200);
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    assert_eq!(red(fleet)["needsNewerAgent"], serde_json::json!([]));
    hub.stop().await;
}
