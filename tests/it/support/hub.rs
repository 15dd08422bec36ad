//! Shared by the hub's integration tests: a real Git repository made in a temp dir
//! from `fleet-example/`, and the real hub started in-process on 127.0.0.1:0.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use flotilla_hub::auth::new_token;
use flotilla_hub::store::Store;
use flotilla_hub::{Hub, HubConfig, HubError, SourceSpec};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub fn fleet_example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fleet-example")
}

/// Copies the folder `from` into `to` (over what is there), but the entries of
/// `from` named in `skip`.
pub fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read fleet-example") {
        let entry = entry.expect("entry");
        if skip.iter().any(|s| entry.file_name() == *s) {
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target, &[]);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A Git repository holding a copy of fleet-example, with one commit on `main`.
pub struct Repo {
    pub dir: TempDir,
}

impl Repo {
    /// fleet-example without its rollout policy: the tests of following, serving and
    /// applying see every commit reach every cluster at once (the rollout tests bring
    /// their own fleet and policies).
    pub fn new() -> Repo {
        Repo::copy_of_example(&["rollouts"])
    }

    /// fleet-example as it is, rollout policy included.
    pub fn with_rollouts() -> Repo {
        Repo::copy_of_example(&[])
    }

    fn copy_of_example(skip: &[&str]) -> Repo {
        let dir = tempfile::tempdir().expect("temp dir");
        copy_tree(&fleet_example(), dir.path(), skip);
        let repo = Repo { dir };
        repo.git(&["init", "--quiet", "--initial-branch=main"]);
        repo.commit("fleet-example");
        repo
    }

    /// An empty repository: the test writes its files and commits them.
    pub fn empty() -> Repo {
        let repo = Repo {
            dir: tempfile::tempdir().expect("temp dir"),
        };
        repo.git(&["init", "--quiet", "--initial-branch=main"]);
        repo
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn git(&self, args: &[&str]) -> String {
        let output = Command::new("git")
            .args(args)
            .current_dir(self.path())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "flotilla tests")
            .env("GIT_AUTHOR_EMAIL", "tests@flotilla.invalid")
            .env("GIT_COMMITTER_NAME", "flotilla tests")
            .env("GIT_COMMITTER_EMAIL", "tests@flotilla.invalid")
            .output()
            .expect("git runs");
        assert!(
            output.status.success(),
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    pub fn write(&self, relative: &str, text: &str) {
        let path = self.path().join(relative);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    pub fn read(&self, relative: &str) -> String {
        std::fs::read_to_string(self.path().join(relative)).expect("read")
    }

    pub fn remove(&self, relative: &str) {
        std::fs::remove_file(self.path().join(relative)).expect("remove");
    }

    /// Moves the current branch to a new root commit (no history in common with the
    /// one before) whose tree is the current one with `relative` holding `text`, as a
    /// force-push does; returns the commit id.
    pub fn force_push(&self, relative: &str, text: &str) -> String {
        self.write(relative, text);
        self.git(&["add", "--all"]);
        let tree = self.git(&["write-tree"]);
        let commit = self.git(&["commit-tree", &tree, "-m", "history rewritten"]);
        // One change of the branch's ref: a follower never sees a state in between.
        self.git(&["update-ref", "HEAD", &commit]);
        commit
    }

    /// Commits everything and returns the commit id.
    pub fn commit(&self, message: &str) -> String {
        self.git(&["add", "--all"]);
        self.git(&["commit", "--quiet", "--allow-empty", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }
}

/// Test settings: no timed poll (only notify, the webhook and the start find
/// commits), tokens re-read quickly.
pub fn config(state_dir: &Path, repo: &str) -> HubConfig {
    let mut config = HubConfig::new(
        state_dir,
        SourceSpec {
            repo: repo.to_string(),
            branch: None,
            path: String::new(),
            worktree: false,
        },
    );
    config.poll_interval = Duration::from_secs(3600);
    config.token_refresh = Duration::from_millis(20);
    config
}

/// The hub, serving on a port of its own.
pub struct Running {
    pub base: String,
    pub state_dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), HubError>>>,
}

impl Running {
    pub async fn start(config: HubConfig) -> Running {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        let state_dir = config.state_dir.clone();
        let hub = Hub::start(config).await.expect("hub starts");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(hub.serve(listener, async {
            let _ = stopped.await;
        }));
        Running {
            base,
            state_dir,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts the hub and waits until it is ready (store loaded or first render done).
    pub async fn start_ready(config: HubConfig) -> Running {
        let running = Running::start(config).await;
        let client = client();
        eventually("the hub to be ready", Duration::from_secs(10), || async {
            let response = client
                .get(format!("{}/readyz", running.base))
                .send()
                .await
                .ok()?;
            (response.status() == 200).then_some(())
        })
        .await;
        running
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Asks the hub to shut down and waits until it has; by then its state dir's lock
    /// is free, so a hub can start on it again at once.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("hub task").expect("hub stops cleanly");
            flotilla_hub::lock::StateDirLock::acquire(&self.state_dir)
                .expect("a stopped hub leaves its state dir's lock free");
        }
    }

    /// Sends the shutdown signal without waiting.
    pub fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Makes a token the way `flotilla token create` does (stored hashed in the state dir)
/// and returns the secret.
pub async fn make_token(state_dir: &Path, cluster: Option<&str>) -> String {
    make_token_in(state_dir, &flotilla_hub::store::Database::StateDir, cluster).await
}

/// [`make_token`], with the hub's tables in `database`.
pub async fn make_token_in(
    state_dir: &Path,
    database: &flotilla_hub::store::Database,
    cluster: Option<&str>,
) -> String {
    // SQLite's locks belong to the process: opening and closing the hub's database
    // file here would drop the locks of a hub running in this process, and another
    // process could then delete the write-ahead log under it. A token for a running
    // hub is made with the command line (another process), as people make theirs.
    let sqlite = !matches!(database, flotilla_hub::store::Database::Postgres(_));
    assert!(
        !(sqlite && flotilla_hub::lock::is_held(state_dir).expect("reads the state dir's lock")),
        "make tokens before the hub starts (or with `flotilla token create`): a hub runs on {}",
        state_dir.display()
    );
    let store = Store::open_with(state_dir, database)
        .await
        .expect("open store");
    let token = new_token(cluster, 0);
    store
        .insert_token(&token.stored)
        .await
        .expect("insert token");
    store.close().await;
    token.secret
}

/// A token for a hub that runs: made as people make theirs, by `flotilla token create`
/// in another process (`args`: a cluster's name, or `--role ROLE [--tenant T]`), and
/// returned once the hub takes it (it looks for new tokens every quarter second).
pub async fn token_for(
    hub: &Running,
    database: &flotilla_hub::store::Database,
    args: &[&str],
) -> String {
    let token = token_by_command(&hub.state_dir, database, args);
    let fleet = hub.url("/v1/fleet");
    let http = client();
    eventually(
        "the hub to take the new token",
        Duration::from_secs(30),
        || async {
            let response = http.get(&fleet).bearer_auth(&token).send().await.ok()?;
            (response.status() != 401).then_some(())
        },
    )
    .await;
    token
}

/// A token made by `flotilla token create ARGS` on the hub's state dir and database.
pub fn token_by_command(
    state_dir: &Path,
    database: &flotilla_hub::store::Database,
    args: &[&str],
) -> String {
    use flotilla_hub::store::Database;
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(["token", "create"])
        .args(args)
        .arg("--state-dir")
        .arg(state_dir)
        .env_remove("FLOTILLA_STATE_DIR")
        .env_remove("FLOTILLA_DATABASE");
    match database {
        Database::StateDir => {}
        Database::Sqlite(path) => {
            command
                .arg("--database")
                .arg(format!("sqlite://{}", path.display()));
        }
        Database::Postgres(url) => {
            command.args(["--database", url]);
        }
    }
    let output = command.output().expect("flotilla runs");
    assert!(
        output.status.success(),
        "flotilla token create {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// Polls `check` until it gives a value, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// GET a bundle with a token and optional If-None-Match; returns (status, etag, body).
pub async fn get_bundle(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    if_none_match: Option<&str>,
) -> (u16, Option<String>, Vec<u8>) {
    let mut request = client.get(url).bearer_auth(token);
    if let Some(etag) = if_none_match {
        request = request.header("If-None-Match", etag);
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.bytes().await.expect("body").to_vec();
    (status, etag, body)
}

pub async fn get_json(client: &reqwest::Client, url: &str, token: &str) -> serde_json::Value {
    let response = client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "GET {url}");
    response.json().await.expect("json")
}

/// The hub's /metrics, as text.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// Reads one sample from /metrics, e.g. `flotilla_long_polls_held`.
pub async fn metric(client: &reqwest::Client, base: &str, sample: &str) -> f64 {
    let text = metrics_text(client, base).await;
    text.lines()
        .find_map(|line| {
            line.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no sample {sample} in /metrics:\n{text}"))
}

/// One object of a test bucket, read through the S3 API (signed, as a hub reads), or
/// `None` when there is none.
pub async fn bucket_object(bucket: &flotilla_testkit::TestBucket, key: &str) -> Option<Vec<u8>> {
    use object_store::ObjectStoreExt as _;
    let location = flotilla_hub::store::S3Location {
        bucket: bucket.bucket.clone(),
        prefix: String::new(),
        settings: bucket.settings(),
    };
    let client = flotilla_hub::store::Bucket::from_env(&location).expect("bucket");
    match client.store.get(&client.key(key)).await {
        Ok(got) => Some(got.bytes().await.expect("object bytes").to_vec()),
        Err(object_store::Error::NotFound { .. }) => None,
        Err(err) => panic!("cannot read {key} from the test bucket: {err}"),
    }
}

/// The `X-Hub-Signature-256` header of a webhook `body` signed with `secret`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("key");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Posts a push webhook signed with `secret` to `hub`; the response's status code.
pub async fn post_webhook(client: &reqwest::Client, hub: &Running, secret: &[u8]) -> u16 {
    let payload = br#"{"ref":"refs/heads/main"}"#;
    client
        .post(hub.url("/v1/hooks/git"))
        .header("X-Hub-Signature-256", sign(secret, payload))
        .body(payload.to_vec())
        .send()
        .await
        .expect("hook")
        .status()
        .as_u16()
}

/// Waits until a poll naming `etag` gets a new bundle; its body.
pub async fn new_bundle(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    etag: &str,
    timeout: Duration,
) -> Vec<u8> {
    eventually("a new bundle to be served", timeout, || async {
        let (status, _, body) = get_bundle(client, url, token, Some(etag)).await;
        (status == 200).then_some(body)
    })
    .await
}

/// Waits, within `timeout`, until the hub holds `count` long-polls (its /metrics say so).
pub async fn until_polls_held(
    client: &reqwest::Client,
    base: &str,
    count: usize,
    timeout: Duration,
) {
    eventually(
        &format!("{count} long-polls to be held"),
        timeout,
        || async move {
            (metric(client, base, "flotilla_long_polls_held").await == count as f64).then_some(())
        },
    )
    .await;
}
