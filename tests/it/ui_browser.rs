//! The web page in a real browser: headless Chromium driven through chromedriver
//! (the W3C WebDriver protocol, spoken here over plain HTTP with the tests' own
//! client). Logs in, reads the counts, filters to the failed clusters, opens one,
//! resumes and pauses a rollout, and saves screenshots for docs/ui.md (into
//! docs/images/ with FLOTILLA_UPDATE_SCREENSHOTS=1); logs in with a viewer's token
//! and finds no steering button. Skips with a printed reason
//! when Chromium or chromedriver is missing, except in CI.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::fleet_view::every_state;
use crate::support::hub::{eventually, token_by_command};
use flotilla_hub::store::Database;

/// chromedriver on a port of its own, stopped when dropped.
struct Driver {
    child: Child,
    base: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| flotilla_testkit::command_works(name, &["--version"]).is_ok())
}

/// One browser session.
struct Browser {
    http: reqwest::Client,
    session: String,
}

impl Browser {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        match self.try_call(method.clone(), path, body).await {
            Ok(value) => value,
            Err((status, value)) => panic!("{method} {path}: {status} {value}"),
        }
    }

    /// A WebDriver command; the status and the whole answer when it fails.
    async fn try_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (reqwest::StatusCode, Value)> {
        let url = format!("{}{path}", self.session);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("chromedriver answers");
        let status = response.status();
        let value: Value = response.json().await.expect("JSON from chromedriver");
        if status.is_success() {
            Ok(value["value"].clone())
        } else {
            Err((status, value))
        }
    }

    async fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The element `css` finds, waited for (up to 20 s) while the next page loads.
    async fn find(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let found = self
                .try_call(
                    reqwest::Method::POST,
                    "/element",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            match found {
                Ok(found) => {
                    return found
                        .as_object()
                        .and_then(|o| o.values().next())
                        .and_then(Value::as_str)
                        .unwrap_or_else(|| panic!("no element {css}: {found}"))
                        .to_string();
                }
                Err((_, value))
                    if value["value"]["error"] == "no such element"
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err((status, value)) => panic!("no element {css}: {status} {value}"),
            }
        }
    }

    /// Clicks the element `css` finds (found again if the page replaced it first).
    async fn click(&self, css: &str) {
        for _ in 0..50 {
            let element = self.find(css).await;
            match self
                .try_call(
                    reqwest::Method::POST,
                    &format!("/element/{element}/click"),
                    Some(json!({})),
                )
                .await
            {
                Ok(_) => return,
                Err((_, value)) if value["value"]["error"] == "stale element reference" => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err((status, value)) => panic!("click {css}: {status} {value}"),
            }
        }
        panic!("the element {css} went stale 50 times in a row");
    }

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// The text of the element `css` finds. The page replaces its content when it
    /// refreshes itself or after a form, so an element found a moment ago may be gone
    /// ("stale"): it is found again.
    async fn text(&self, css: &str) -> String {
        for _ in 0..50 {
            let element = self.find(css).await;
            match self
                .try_call(
                    reqwest::Method::GET,
                    &format!("/element/{element}/text"),
                    None,
                )
                .await
            {
                Ok(text) => return text.as_str().unwrap_or_default().to_string(),
                Err((_, value)) if value["value"]["error"] == "stale element reference" => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err((status, value)) => panic!("the text of {css}: {status} {value}"),
            }
        }
        panic!("the element {css} went stale 50 times in a row");
    }

    /// The texts of every element `css` finds, found again when the page replaced
    /// them while they were read.
    async fn all_texts(&self, css: &str) -> Vec<String> {
        'again: for _ in 0..50 {
            let found = self
                .call(
                    reqwest::Method::POST,
                    "/elements",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            let mut texts = Vec::new();
            for element in found.as_array().cloned().unwrap_or_default() {
                let id = element
                    .as_object()
                    .and_then(|o| o.values().next())
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                match self
                    .try_call(reqwest::Method::GET, &format!("/element/{id}/text"), None)
                    .await
                {
                    Ok(text) => texts.push(text.as_str().unwrap_or_default().to_string()),
                    Err((_, value)) if value["value"]["error"] == "stale element reference" => {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue 'again;
                    }
                    Err((status, value)) => panic!("the text of {css}: {status} {value}"),
                }
            }
            return texts;
        }
        panic!("the elements {css} went stale 50 times in a row");
    }

    /// Waits (up to 20 s) until `read` gives `expected`, and returns what it gave last:
    /// a click on a link or a form's button returns before the browser has loaded the
    /// next page, so what is read right after it may still be the page before.
    async fn settles<T, F, Fut>(&self, expected: T, read: F) -> T
    where
        T: PartialEq,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let now = read().await;
            if now == expected || std::time::Instant::now() > deadline {
                return now;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// The page's title once it is `expected` (or after 20 s, whatever it is then).
    async fn title_once(&self, expected: &str) -> String {
        self.settles(expected.to_string(), || self.title()).await
    }

    /// The text of `css` once it is `expected` (or after 20 s, whatever it is then).
    async fn text_once(&self, css: &str, expected: &str) -> String {
        self.settles(expected.to_string(), || self.text(css)).await
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    async fn run(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    async fn title(&self) -> String {
        self.call(reqwest::Method::GET, "/title", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    async fn screenshot(&self, name: &str) {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64_decode(png.as_str().expect("base64 PNG"));
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
        // docs/images/ is rewritten only when asked (FLOTILLA_UPDATE_SCREENSHOTS=1), so
        // a test run never changes files of the repository.
        let dir = if std::env::var_os("FLOTILLA_UPDATE_SCREENSHOTS").is_some() {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/images")
        } else {
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots")
        };
        std::fs::create_dir_all(&dir).expect("the screenshots' folder");
        std::fs::write(dir.join(name), bytes).expect("write the screenshot");
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0);
    for c in text.bytes().filter_map(value) {
        buffer = (buffer << 6) | c;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    out
}

/// Chromium driven by chromedriver, for the test named `test`; `None` when it skips
/// (Chromium or chromedriver missing, outside CI).
async fn start_browser(test: &str) -> Option<(Driver, Browser)> {
    start_browser_sized(test, (1280, 900)).await
}

/// [`start_browser`] with a window of `(width, height)` pixels.
async fn start_browser_sized(test: &str, (width, height): (u32, u32)) -> Option<(Driver, Browser)> {
    let browser_binary = chromium();
    let missing = match (
        browser_binary,
        flotilla_testkit::command_works("chromedriver", &["--version"]),
    ) {
        (None, _) => {
            Some("Chromium is not installed (apt-get install chromium chromium-driver)".to_string())
        }
        (_, Err(reason)) => Some(format!("{reason} (apt-get install chromium-driver)")),
        (Some(_), Ok(())) => None,
    };
    if !flotilla_testkit::can_run(test, missing) {
        return None;
    }
    let port = free_port();
    let driver = Driver {
        child: Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
        base: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    eventually("chromedriver to listen", Duration::from_secs(20), || {
        let (http, base) = (&http, &driver.base);
        async move {
            let response = http.get(format!("{base}/status")).send().await.ok()?;
            let status: Value = response.json().await.ok()?;
            (status["value"]["ready"] == true).then_some(())
        }
    })
    .await;

    let which = browser_binary.unwrap_or("chromium");
    let binary = String::from_utf8(
        Command::new("sh")
            .args(["-c", &format!("command -v {which}")])
            .output()
            .expect("sh")
            .stdout,
    )
    .expect("path")
    .trim()
    .to_string();
    let created: Value = http
        .post(format!("{}/session", driver.base))
        .json(&json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", format!("--window-size={width},{height}")]
            }
        }}}))
        .send()
        .await
        .expect("new session")
        .json()
        .await
        .expect("JSON");
    let session = created["value"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {created}"))
        .to_string();
    let browser = Browser {
        http: http.clone(),
        session: format!("{}/session/{session}", driver.base),
    };
    Some((driver, browser))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_logs_in_filters_opens_a_cluster_and_pauses_a_rollout_in_chromium() {
    let Some((driver, browser)) = start_browser(
        "an_operator_logs_in_filters_opens_a_cluster_and_pauses_a_rollout_in_chromium",
    )
    .await
    else {
        return;
    };
    let http = browser.http.clone();
    let (mut scene, v2) = every_state().await;
    let rollout_id = scene.rollout_of(&v2).await["id"].as_i64().expect("id");
    let hub = scene.hub.as_ref().expect("hub").base.clone();

    // The page sends a visitor without a session to the login.
    browser.go(&format!("{hub}/ui/")).await;
    assert_eq!(browser.title().await, "Log in · flotilla");
    browser.screenshot("ui-login.png").await;
    browser.type_into("#token", &scene.admin).await;
    browser.click("form.login button[type=submit]").await;
    assert_eq!(
        browser.title_once("Fleet · flotilla").await,
        "Fleet · flotilla"
    );
    assert_eq!(browser.text("#counts-h").await, "8 clusters");
    assert_eq!(browser.text(".n[data-state=failed]").await, "1");
    assert_eq!(browser.text(".n[data-state=waiting]").await, "2");
    // edge is drifted: counted beside the states, and listed with what changed.
    assert_eq!(browser.text("#drifted-count").await, "1");
    let drift = browser.text("table.drift tbody tr").await;
    assert!(
        drift.contains("edge") && drift.contains("spec.replicas") && drift.contains("kubectl-edit"),
        "{drift}"
    );
    browser.screenshot("ui-fleet.png").await;

    // Filter to the failed clusters, then open the one there is.
    browser.click("a.chip.s-failed").await;
    let names = browser
        .settles(vec!["c1".to_string()], || {
            browser.all_texts("table.clusters tbody tr td:first-child a")
        })
        .await;
    assert_eq!(names, ["c1"]);
    browser
        .click("table.clusters tbody tr td:first-child a")
        .await;
    assert_eq!(browser.title_once("c1 · flotilla").await, "c1 · flotilla");
    let failed = browser.text("ul.failed").await;
    assert!(failed.contains("CrashLoopBackOff"), "{failed}");
    browser.screenshot("ui-cluster.png").await;

    // The canary recovers; the operator resumes the halted rollout, then pauses it.
    scene.report("c1", true).await;
    browser.go(&format!("{hub}/ui/rollouts/{rollout_id}")).await;
    browser.click("#action-resume").await;
    browser.click("#action-pause").await;
    assert_eq!(browser.text_once("h1 .chip", "paused").await, "paused");
    assert_eq!(scene.rollout_of(&v2).await["state"], "paused");
    browser.screenshot("ui-rollout.png").await;

    // Logging out ends the session.
    browser.click("nav button.link").await;
    assert_eq!(
        browser.title_once("Log in · flotilla").await,
        "Log in · flotilla"
    );
    browser.go(&format!("{hub}/ui/")).await;
    assert_eq!(browser.title().await, "Log in · flotilla");

    let _ = http.delete(&browser.session).send().await;
    drop(driver);
    scene.stop().await;
}

/// A viewer's token made with the real command line, beside the running hub.
fn viewer_token(state: &Path) -> String {
    token_by_command(state, &Database::StateDir, &["--role", "viewer"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_logs_in_and_finds_no_steering_buttons_in_chromium() {
    let Some((driver, browser)) =
        start_browser("a_viewer_logs_in_and_finds_no_steering_buttons_in_chromium").await
    else {
        return;
    };
    let (mut scene, v2) = every_state().await;
    let rollout_id = scene.rollout_of(&v2).await["id"].as_i64().expect("id");
    let hub = scene.hub.as_ref().expect("hub").base.clone();
    let viewer = viewer_token(scene.state.path());

    browser.go(&format!("{hub}/ui/")).await;
    browser.type_into("#token", &viewer).await;
    browser.click("form.login button[type=submit]").await;
    assert_eq!(
        browser.title_once("Fleet · flotilla").await,
        "Fleet · flotilla"
    );
    // Who is logged in, with which role.
    assert_eq!(browser.text("#role").await, "viewer");
    assert!(
        browser
            .text("#who")
            .await
            .contains(&flotilla_hub::auth::token_id(&viewer))
    );
    assert_eq!(browser.text("#counts-h").await, "8 clusters");

    // The halted rollout offers an admin resume and abort; the viewer gets no button.
    browser.go(&format!("{hub}/ui/rollouts/{rollout_id}")).await;
    assert_eq!(
        browser
            .title_once(&format!("Rollout {rollout_id} · flotilla"))
            .await,
        format!("Rollout {rollout_id} · flotilla")
    );
    assert_eq!(browser.text("h1 .chip").await, "halted");
    assert_eq!(
        browser.all_texts(".actions button").await,
        Vec::<String>::new()
    );
    assert_eq!(
        browser.all_texts("button[id^=action-]").await,
        Vec::<String>::new()
    );
    // Nor a link to a cluster's bundle.
    browser.go(&format!("{hub}/ui/clusters/c1")).await;
    assert_eq!(browser.title_once("c1 · flotilla").await, "c1 · flotilla");
    assert_eq!(
        browser.all_texts("#bundle-link").await,
        Vec::<String>::new()
    );
    browser.screenshot("ui-viewer-rollout.png").await;

    let _ = browser.http.delete(&browser.session).send().await;
    drop(driver);
    scene.stop().await;
}

/// What would wrap on the page shown: each name, digest and revision that takes more
/// than one line, and each table too wide for its box, as `selector: text`.
const WRAPPED: &str = r#"
const found = [];
for (const e of document.querySelectorAll('td.name a, td.name, td.digest code, code.revision, code.digest, .numbers, .legend li')) {
  const lines = new Set(Array.from(e.getClientRects()).map(r => Math.round(r.top)));
  if (lines.size > 1) { found.push(e.tagName + '.' + e.className + ': ' + e.textContent); }
}
for (const e of document.querySelectorAll('.scroll')) {
  if (e.scrollWidth > e.clientWidth + 1) { found.push('a table wider than its box: ' + e.textContent.slice(0, 80)); }
}
if (document.documentElement.scrollWidth > window.innerWidth) { found.push('the page scrolls sideways'); }
return found;
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_digests_bars_and_what_runs_read_well_at_1280_px_in_chromium() {
    let Some((driver, browser)) = start_browser_sized(
        "names_digests_bars_and_what_runs_read_well_at_1280_px_in_chromium",
        (1280, 900),
    )
    .await
    else {
        return;
    };
    let (mut scene, v2) = every_state().await;
    let rollout_id = scene.rollout_of(&v2).await["id"].as_i64().expect("id");
    let hub = scene.hub.as_ref().expect("hub").base.clone();
    // An agent with a lot to say: its message fills the list's last column, which
    // squeezes the others.
    let s1_runs = scene.runs["s1"].clone();
    let response = scene
        .client
        .post(scene.url("/v1/clusters/s1/status"))
        .bearer_auth(&scene.tokens["s1"])
        .json(&json!({"applied": s1_runs, "attempted": s1_runs, "resources": [],
            "agentVersion": "test",
            "message": "applied 2 resources; waiting for the Deployment app/app in namespace app to roll out its new ReplicaSet (2 of 3 replicas updated, 1 unavailable) before the next phase of the bundle is applied"}))
        .send()
        .await
        .expect("report");
    assert_eq!(response.status(), 200);
    browser.go(&format!("{hub}/ui/")).await;
    browser.type_into("#token", &scene.admin).await;
    browser.click("form.login button[type=submit]").await;
    assert_eq!(
        browser.title_once("Fleet · flotilla").await,
        "Fleet · flotilla"
    );
    let width = browser.run("return window.innerWidth;").await;
    assert_eq!(width, 1280, "the window's width");

    // The served commit's subject and author, beside its id.
    assert_eq!(browser.text("#commit-subject").await, "v2");
    assert_eq!(browser.text("#commit-author").await, "flotilla tests");
    // The legend of the bars, and the numbers beside each bar, as text one can read.
    assert_eq!(
        browser.all_texts("#groups-h + .legend li").await,
        [
            "failed",
            "offline",
            "pending",
            "never-seen",
            "paused",
            "waiting",
            "in-sync"
        ]
    );
    assert_eq!(browser.text(".groups .numbers").await, "1 failed");
    assert_eq!(
        browser.all_texts(".rollout .waves .numbers").await,
        ["0/1 in sync · 1 failed", "0/3 in sync · 1 offline"]
    );
    // Each swatch of the legend has the colour of its state's part of a bar.
    let colours = browser
        .run(
            "const bg = s => getComputedStyle(document.querySelector(s)).backgroundColor;\n\
             return [bg('#groups-h + .legend .swatch.s-failed'), bg('.groups .seg.s-failed')];",
        )
        .await;
    assert_eq!(colours[0], colours[1], "{colours}");
    assert_ne!(colours[0], "rgba(0, 0, 0, 0)", "{colours}");
    let wrapped = browser.run(WRAPPED).await;
    assert_eq!(wrapped, json!([]), "on the fleet page");

    // A cluster's page: its digests in full on one line each, and what runs there,
    // each resource linking to its part of the bundle view.
    browser.go(&format!("{hub}/ui/clusters/c1")).await;
    assert_eq!(browser.title_once("c1 · flotilla").await, "c1 · flotilla");
    let wrapped = browser.run(WRAPPED).await;
    assert_eq!(wrapped, json!([]), "on the cluster page");
    assert_eq!(
        browser.all_texts("table.resources td.name").await,
        ["app", "app"]
    );
    browser
        .click("table.resources tbody tr:nth-child(2) td.name a")
        .await;
    assert_eq!(
        browser.title_once("c1: bundle · flotilla").await,
        "c1: bundle · flotilla"
    );
    let target = browser
        .settles(json!("Secret app/app"), || async {
            browser
                .run("const t = document.querySelector(':target h2'); return t ? t.textContent : null;")
                .await
        })
        .await;
    assert_eq!(target, "Secret app/app", "the link lands on the Secret");
    let secret = browser.text(":target pre").await;
    assert!(
        secret.contains("(redacted)") && !secret.contains("hunter2"),
        "{secret}"
    );

    // A rollout's page.
    browser.go(&format!("{hub}/ui/rollouts/{rollout_id}")).await;
    assert_eq!(
        browser
            .title_once(&format!("Rollout {rollout_id} · flotilla"))
            .await,
        format!("Rollout {rollout_id} · flotilla")
    );
    let wrapped = browser.run(WRAPPED).await;
    assert_eq!(wrapped, json!([]), "on the rollout page");
    assert_eq!(
        browser.all_texts(".waves .numbers").await,
        [
            "0/1 in sync · 1 failed · bake 15m",
            "0/3 in sync · 1 offline · bake 0s"
        ]
    );

    let _ = browser.http.delete(&browser.session).send().await;
    drop(driver);
    scene.stop().await;
}
