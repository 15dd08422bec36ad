//! End to end: the real hub in process on 127.0.0.1:0, following a real Git
//! repository made in a temp dir, and the real agent (in process, or the binary) with
//! the `dir` sink, all in temp folders.

use crate::support::agent as agent_support;
use crate::support::hub as hub_common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flotilla_agent::backoff::BackoffPolicy;
use flotilla_agent::client::Server;
use flotilla_agent::sink::dir::{DirSink, file_name};
use flotilla_agent::wait::Wait;
use flotilla_agent::{Agent, AgentConfig, AgentError};
use flotilla_core::bundle::{Bundle, Digest, verify_document_parts};
use flotilla_core::signing::{BundleSignature, PublicKey, SigningKey, TrustedKeys};
use flotilla_core::status::StatusReport;
use flotilla_hub::{Hub, HubError};
use hub_common::{Repo, client, config, make_token};
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

const CLUSTER: &str = "blue";

/// What the repository at HEAD renders for the cluster, computed independently of the hub.
fn rendered(repo: &Repo) -> Bundle {
    let snapshot =
        flotilla_hub::source::from_folder(repo.path(), "").expect("reads the repository");
    let output = flotilla_render::render(&snapshot);
    assert!(output.is_clean(), "the test repository renders");
    output
        .bundles
        .get(CLUSTER)
        .expect("blue is in the fleet")
        .clone()
}

fn expected_files(bundle: &Bundle) -> BTreeSet<String> {
    bundle.resources.iter().map(|r| file_name(&r.key)).collect()
}

fn files(dir: &Path) -> BTreeSet<String> {
    agent_support::yaml_names(dir).into_iter().collect()
}

/// Sets the kuard Deployment's replicas, which changes blue's bundle.
fn set_replicas(repo: &Repo, replicas: u32) {
    let path = "workloads/kuard/manifests/deployment.yaml";
    let text = repo.read(path);
    let changed: Vec<String> = text
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("replicas:") {
                format!("  replicas: {replicas}")
            } else {
                line.to_string()
            }
        })
        .collect();
    repo.write(path, &(changed.join("\n") + "\n"));
}

/// The hub, on an address of our choosing so it can come back on the same one.
struct HubProcess {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), HubError>>>,
}

impl HubProcess {
    async fn start(state_dir: &Path, repo: &Repo, address: SocketAddr) -> HubProcess {
        HubProcess::start_with(
            config(state_dir, &repo.path().display().to_string()),
            address,
        )
        .await
    }

    async fn start_with(config: flotilla_hub::HubConfig, address: SocketAddr) -> HubProcess {
        let hub = Hub::start(config).await.expect("hub starts");
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("binds the hub's address");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(hub.serve(listener, async {
            let _ = stopped.await;
        }));
        let hub = HubProcess {
            address,
            stop: Some(stop),
            task: Some(task),
        };
        // Ready once its store is loaded or it has rendered the repository once
        // (before that it answers 503 with Retry-After: 5, which the agent honours).
        let client = client();
        for _ in 0..1000 {
            let ready = client.get(format!("{}/readyz", hub.base())).send().await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return hub;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the hub never became ready");
    }

    fn base(&self) -> String {
        format!("http://{}", self.address)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("hub task").expect("hub stops cleanly");
        }
    }
}

/// The hub's view of one cluster, from `GET /v1/fleet`.
async fn fleet_entry(hub: &HubProcess, admin: &str) -> Value {
    let fleet = hub_common::get_json(&client(), &format!("{}/v1/fleet", hub.base()), admin).await;
    fleet["clusters"]
        .as_array()
        .and_then(|clusters| clusters.iter().find(|c| c["name"] == CLUSTER).cloned())
        .expect("blue in the fleet summary")
}

async fn until_in_sync(hub: &HubProcess, admin: &str, digest: &Digest) {
    let mut last = Value::Null;
    for _ in 0..1000 {
        last = fleet_entry(hub, admin).await;
        if last["state"] == "in-sync"
            && last["applied"] == digest.as_str()
            && last["desired"] == digest.as_str()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the hub never showed {CLUSTER} in-sync at {digest}: {last}");
}

/// One site: the agent's state folder, its target folder and its token.
struct Site {
    dir: tempfile::TempDir,
    token_file: PathBuf,
}

impl Site {
    fn new(token: &str) -> Site {
        let dir = tempfile::tempdir().expect("tempdir");
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).expect("writes token");
        Site { dir, token_file }
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    fn target(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }
}

struct RunningAgent {
    reports: watch::Receiver<Option<StatusReport>>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), AgentError>>,
}

impl RunningAgent {
    fn start(site: &Site, base: &str) -> RunningAgent {
        RunningAgent::start_with(site, base, |_| {})
    }

    fn start_with(site: &Site, base: &str, adjust: impl FnOnce(&mut AgentConfig)) -> RunningAgent {
        let mut config =
            AgentConfig::new(Server::parse(base).expect("hub URL"), CLUSTER, site.state());
        config.token_file = Some(site.token_file.clone());
        // Short waits, so a test does not sit out a long back-off when the hub returns.
        config.backoff = BackoffPolicy {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(300),
            auth_retry: Duration::from_millis(300),
        };
        // A hub that shuts down answers its held long-polls with 304 at once, and an
        // agent asks again only after the rest of --wait: keep that short here.
        config.wait = Wait::Fixed(Duration::from_secs(1));
        adjust(&mut config);
        let agent = Agent::new(config, DirSink::new(&site.target(), &site.state(), false));
        let reports = agent.reports();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(async {
            let _ = stopped.await;
        }));
        RunningAgent {
            reports,
            stop,
            task,
        }
    }

    async fn applied(&mut self, digest: &Digest) -> StatusReport {
        let wait = self.reports.wait_for(|r| {
            r.as_ref().is_some_and(|r| {
                r.applied.as_ref() == Some(digest) && r.attempted.as_ref() == Some(digest)
            })
        });
        // Generous: on a loaded CI machine an agent may sit out a whole request timeout
        // (the wait plus 30 s) on a connection to a hub that was stopping.
        let found = match tokio::time::timeout(Duration::from_secs(60), wait).await {
            Ok(Ok(report)) => report.clone(),
            _ => None,
        };
        match found {
            Some(report) => report,
            None => panic!(
                "the agent never applied {digest}; last report: {:?}",
                self.reports.borrow()
            ),
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.expect("no panic").expect("the agent ran");
    }
}

struct Fixture {
    repo: Repo,
    hub_state: tempfile::TempDir,
    site: Site,
    admin: String,
}

async fn fixture() -> Fixture {
    let repo = Repo::new();
    let hub_state = tempfile::tempdir().expect("tempdir");
    let token = make_token(hub_state.path(), Some(CLUSTER)).await;
    let admin = make_token(hub_state.path(), None).await;
    Fixture {
        repo,
        hub_state,
        site: Site::new(&token),
        admin,
    }
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

#[tokio::test]
async fn a_commit_reaches_the_cluster_as_files_and_the_hub_shows_it_in_sync() {
    let f = fixture().await;
    let hub = HubProcess::start(f.hub_state.path(), &f.repo, any_port()).await;
    let mut agent = RunningAgent::start(&f.site, &hub.base());

    let first = rendered(&f.repo);
    let report = agent.applied(&first.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert_eq!(files(&f.site.target()), expected_files(&first));
    until_in_sync(&hub, &f.admin, &first.digest).await;

    set_replicas(&f.repo, 3);
    f.repo.commit("kuard: three replicas");
    let second = rendered(&f.repo);
    assert_ne!(second.digest, first.digest);
    agent.applied(&second.digest).await;
    let deployment = std::fs::read_to_string(f.site.target().join(file_name(
        &flotilla_core::bundle::ResourceKey::new("apps", "Deployment", "kuard", "kuard"),
    )))
    .expect("the Deployment's file");
    assert!(deployment.contains("replicas: 3"), "{deployment}");
    until_in_sync(&hub, &f.admin, &second.digest).await;
    let entry = fleet_entry(&hub, &f.admin).await;
    assert_eq!(entry["agentVersion"], env!("CARGO_PKG_VERSION"));

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn an_idle_agent_stays_in_sync_on_the_hub_through_its_polls() {
    let f = fixture().await;
    let mut hub_config = config(f.hub_state.path(), &f.repo.path().display().to_string());
    hub_config.offline_after = Duration::from_millis(2500);
    let hub = HubProcess::start_with(hub_config, any_port()).await;
    // No heartbeat (the default): the hub hears from the agent only through its
    // long-polls, held for a second each here.
    let mut agent = RunningAgent::start_with(&f.site, &hub.base(), |config| {
        assert!(config.heartbeat.is_zero(), "no heartbeat by default");
        config.wait = Wait::Fixed(Duration::from_secs(1));
    });
    let first = rendered(&f.repo);
    agent.applied(&first.digest).await;
    until_in_sync(&hub, &f.admin, &first.digest).await;
    // Idle for longer than the hub's offline threshold: still in sync.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let entry = fleet_entry(&hub, &f.admin).await;
        assert_eq!(entry["state"], "in-sync", "{entry}");
    }
    // Without the agent, the same hub soon counts the cluster offline.
    agent.stop().await;
    let mut state = Value::Null;
    for _ in 0..600 {
        state = fleet_entry(&hub, &f.admin).await["state"].clone();
        if state == "offline" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, "offline");
    hub.stop().await;
}

#[tokio::test]
async fn a_resource_removed_from_the_repository_loses_its_file() {
    let f = fixture().await;
    let hub = HubProcess::start(f.hub_state.path(), &f.repo, any_port()).await;
    let mut agent = RunningAgent::start(&f.site, &hub.base());
    let first = rendered(&f.repo);
    agent.applied(&first.digest).await;
    std::fs::write(f.site.target().join("someone-elses.yaml"), "kind: Mine\n").expect("writes");

    f.repo.remove("workloads/kuard/manifests/service.yaml");
    f.repo.commit("kuard: no Service");
    let second = rendered(&f.repo);
    assert_eq!(second.resources.len() + 1, first.resources.len());
    let report = agent.applied(&second.digest).await;

    let service = file_name(&flotilla_core::bundle::ResourceKey::new(
        "", "Service", "kuard", "kuard",
    ));
    let mut expected = expected_files(&second);
    expected.insert("someone-elses.yaml".into());
    assert_eq!(files(&f.site.target()), expected);
    assert!(!files(&f.site.target()).contains(&service));
    assert!(
        report.resources.iter().any(|r| r.key.kind() == "Service"
            && r.state == flotilla_core::status::ResourceState::Pruned)
    );
    until_in_sync(&hub, &f.admin, &second.digest).await;
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn without_the_hub_the_agent_keeps_its_files_and_a_restarted_agent_reapplies_from_its_cache()
{
    let f = fixture().await;
    let hub = HubProcess::start(f.hub_state.path(), &f.repo, any_port()).await;
    let mut agent = RunningAgent::start(&f.site, &hub.base());
    let first = rendered(&f.repo);
    agent.applied(&first.digest).await;
    let before = agent_support::yaml_files(&f.site.target());
    let base = hub.base();
    hub.stop().await;

    // The agent keeps failing to reach the hub for a while, and keeps its files.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(agent_support::yaml_files(&f.site.target()), before);
    agent.stop().await;

    // The site reboots with the hub still away and its manifests folder wiped.
    std::fs::remove_dir_all(f.site.target()).expect("wipes");
    let mut agent = RunningAgent::start(&f.site, &base);
    let report = agent.applied(&first.digest).await;
    assert!(report.is_success(), "{report:?}");
    assert_eq!(agent_support::yaml_files(&f.site.target()), before);
    agent.stop().await;
}

#[tokio::test]
async fn after_a_hub_restart_with_two_commits_meanwhile_the_agent_catches_up_with_one_200() {
    let f = fixture().await;
    let hub = HubProcess::start(f.hub_state.path(), &f.repo, any_port()).await;
    let address = hub.address;
    let mut agent = RunningAgent::start(&f.site, &hub.base());
    let first = rendered(&f.repo);
    agent.applied(&first.digest).await;
    hub.stop().await;

    set_replicas(&f.repo, 2);
    f.repo.commit("kuard: two replicas");
    let skipped = rendered(&f.repo);
    set_replicas(&f.repo, 4);
    f.repo.commit("kuard: four replicas");
    let last = rendered(&f.repo);

    let hub = HubProcess::start(f.hub_state.path(), &f.repo, address).await;
    let report = agent.applied(&last.digest).await;
    assert!(report.is_success());
    until_in_sync(&hub, &f.admin, &last.digest).await;
    let two_hundreds = hub_common::metric(
        &client(),
        &hub.base(),
        "flotilla_bundle_responses_total{code=\"200\"}",
    )
    .await;
    assert_eq!(two_hundreds, 1.0, "the agent caught up with a single 200");
    // The bundle in between was never applied.
    let stored = agent_support::stored_status(&f.site.state()).expect("status kept");
    assert_ne!(stored["report"]["applied"], skipped.digest.as_str());
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_tampered_bundle_in_a_published_folder_is_refused() {
    let f = fixture().await;
    let published = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--repo"])
        .arg(f.repo.path())
        .arg("--out")
        .arg(published.path())
        .output()
        .expect("flotilla publish runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bundle_path = published
        .path()
        .join("v1/clusters")
        .join(CLUSTER)
        .join("bundle");
    let genuine = std::fs::read_to_string(&bundle_path).expect("published");
    let tampered = genuine.replace("kuard-amd64:blue", "kuard-amd64:evil");
    assert_ne!(tampered, genuine);
    agent_support::publish_document(published.path(), CLUSTER, tampered.as_bytes());

    let mut config = AgentConfig::new(
        Server::File(published.path().to_path_buf()),
        CLUSTER,
        f.site.state(),
    );
    config.wait = Wait::Fixed(Duration::from_millis(100));
    let agent = Agent::new(
        config,
        DirSink::new(&f.site.target(), &f.site.state(), false),
    );
    let mut reports = agent.reports();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    let refused = tokio::time::timeout(
        Duration::from_secs(20),
        reports.wait_for(|r| {
            r.as_ref()
                .is_some_and(|r| r.message.contains("digest mismatch"))
        }),
    )
    .await
    .expect("refused in time")
    .expect("a report")
    .clone()
    .expect("present");
    assert_eq!(refused.applied, None);
    assert!(
        files(&f.site.target()).is_empty(),
        "nothing of the tampered bundle was written"
    );
    assert!(!f.site.state().join("bundle.json").exists());

    // The genuine document is accepted.
    agent_support::publish_document(published.path(), CLUSTER, genuine.as_bytes());
    let genuine_digest = rendered(&f.repo).digest;
    tokio::time::timeout(
        Duration::from_secs(20),
        reports.wait_for(|r| {
            r.as_ref()
                .is_some_and(|r| r.applied.as_ref() == Some(&genuine_digest))
        }),
    )
    .await
    .expect("applied in time")
    .expect("a report");
    let _ = stop.send(());
    task.await.expect("no panic").expect("ran");
}

/// `flotilla key generate --out DIR/hub.key`: the signing key, and the trust of an
/// agent that is given its KEY.pub.
fn generate_key(dir: &Path) -> (PathBuf, SigningKey, TrustedKeys) {
    let key_path = dir.join("hub.key");
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["key", "generate", "--out"])
        .arg(&key_path)
        .output()
        .expect("flotilla key generate runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let key = SigningKey::parse(&std::fs::read_to_string(&key_path).expect("KEY")).expect("a key");
    let printed = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert_eq!(printed, key.key_id(), "the key id is printed");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_path)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let public = std::fs::read_to_string(dir.join("hub.key.pub")).expect("KEY.pub");
    assert_eq!(public.lines().count(), 1);
    let trusted = TrustedKeys::new(vec![PublicKey::parse(&public).expect("a public key")]);
    (key_path, key, trusted)
}

/// The signature of the bundle the hub serves the cluster now.
async fn served_signature(hub: &HubProcess, token: &str) -> BundleSignature {
    let document = client()
        .get(format!("{}/v1/clusters/{CLUSTER}/bundle", hub.base()))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET bundle")
        .bytes()
        .await
        .expect("body");
    verify_document_parts(&document, Some(CLUSTER))
        .expect("verifies")
        .signature
        .expect("the hub signs")
}

#[tokio::test]
async fn a_signing_hub_and_a_trusting_agent_take_every_change_and_a_rollback_with_a_higher_sequence()
 {
    let f = fixture().await;
    let (_, key, trusted) = generate_key(f.site.dir.path());
    let mut hub_config = config(f.hub_state.path(), &f.repo.path().display().to_string());
    hub_config.signing_key = Some(std::sync::Arc::new(key));
    let hub = HubProcess::start_with(hub_config, any_port()).await;
    let token = std::fs::read_to_string(&f.site.token_file).expect("token");
    let mut agent = RunningAgent::start_with(&f.site, &hub.base(), |config| {
        config.trusted = trusted.clone();
    });
    let first = rendered(&f.repo);
    agent.applied(&first.digest).await;
    let first_sequence = served_signature(&hub, &token).await.sequence;

    set_replicas(&f.repo, 3);
    f.repo.commit("kuard: three replicas");
    let second = rendered(&f.repo);
    agent.applied(&second.digest).await;
    let second_sequence = served_signature(&hub, &token).await.sequence;
    assert!(
        second_sequence > first_sequence,
        "{second_sequence} after {first_sequence}"
    );

    // Back to the first content: an older digest, re-served and signed anew with a
    // higher sequence, which the agent takes.
    set_replicas(&f.repo, 1);
    f.repo.commit("kuard: back to one replica");
    assert_eq!(rendered(&f.repo).digest, first.digest);
    let report = agent.applied(&first.digest).await;
    assert!(report.is_success(), "{report:?}");
    let third_sequence = served_signature(&hub, &token).await.sequence;
    assert!(
        third_sequence > second_sequence,
        "{third_sequence} after {second_sequence}"
    );
    until_in_sync(&hub, &f.admin, &first.digest).await;
    agent.stop().await;

    // The sequence is stored with what is served: a restarted hub signs the same one.
    hub.stop().await;
    let mut hub_config = config(f.hub_state.path(), &f.repo.path().display().to_string());
    hub_config.signing_key = Some(std::sync::Arc::new(
        SigningKey::parse(
            &std::fs::read_to_string(f.site.dir.path().join("hub.key")).expect("KEY"),
        )
        .expect("a key"),
    ));
    let hub = HubProcess::start_with(hub_config, any_port()).await;
    assert_eq!(
        served_signature(&hub, &token).await.sequence,
        third_sequence
    );
    hub.stop().await;
}

#[tokio::test]
async fn a_signing_hub_that_lost_its_store_signs_above_what_agents_hold() {
    let f = fixture().await;
    let (key_path, _, trusted) = generate_key(f.site.dir.path());
    let signing = |state: &Path| {
        let mut hub_config = config(state, &f.repo.path().display().to_string());
        hub_config.signing_key = Some(std::sync::Arc::new(
            SigningKey::parse(&std::fs::read_to_string(&key_path).expect("KEY")).expect("a key"),
        ));
        hub_config
    };
    let hub = HubProcess::start_with(signing(f.hub_state.path()), any_port()).await;
    let address = hub.address;
    let mut agent = RunningAgent::start_with(&f.site, &hub.base(), |config| {
        config.trusted = trusted.clone();
    });
    let first = rendered(&f.repo);
    agent.applied(&first.digest).await;
    let token = std::fs::read_to_string(&f.site.token_file).expect("token");
    let held = served_signature(&hub, &token).await.sequence;
    hub.stop().await;

    // The store is lost: a new state dir, with a new token for the agent, on the same
    // address. Its sequences start from the time, above the one the agent holds, so
    // the agent takes its bundles (the same digest, signed anew, then a change).
    let lost = tempfile::tempdir().expect("state");
    let token = make_token(lost.path(), Some(CLUSTER)).await;
    std::fs::write(&f.site.token_file, &token).expect("new token");
    let hub = HubProcess::start_with(signing(lost.path()), address).await;
    let restarted = served_signature(&hub, &token).await.sequence;
    assert!(restarted > held, "{restarted} after {held}");
    set_replicas(&f.repo, 3);
    f.repo.commit("kuard: three replicas");
    let report = agent.applied(&rendered(&f.repo).digest).await;
    assert!(report.is_success(), "{report:?}");
    assert!(served_signature(&hub, &token).await.sequence > restarted);
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_signed_publish_mirror_that_is_tampered_with_or_replayed_is_refused() {
    let f = fixture().await;
    let (key_path, _, trusted) = generate_key(f.site.dir.path());
    let mirror = tempfile::tempdir().expect("tempdir");
    let publish = || {
        let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["publish", "--repo"])
            .arg(f.repo.path())
            .arg("--out")
            .arg(mirror.path())
            .arg("--signing-key")
            .arg(&key_path)
            .output()
            .expect("flotilla publish runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let bundle_path = mirror
        .path()
        .join("v1/clusters")
        .join(CLUSTER)
        .join("bundle");
    publish();
    let first = std::fs::read(&bundle_path).expect("published");
    set_replicas(&f.repo, 3);
    f.repo.commit("kuard: three replicas");
    publish();
    let second = std::fs::read(&bundle_path).expect("published");
    let second_digest = rendered(&f.repo).digest;

    // Someone with write access to the mirror changes an image and recomputes the
    // digest, so the document matches its digest but not its signature.
    let mut forged: Value = serde_json::from_slice(&second).expect("JSON");
    let resources: Vec<std::sync::Arc<flotilla_core::bundle::Resource>> = forged["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|value| {
            let value: Value = serde_json::from_str(
                &value
                    .to_string()
                    .replace("kuard-amd64:blue", "kuard-amd64:evil"),
            )
            .expect("JSON");
            let key = flotilla_core::bundle::ResourceKey::of(&value).expect("identity");
            std::sync::Arc::new(flotilla_core::bundle::Resource::new(key, &value))
        })
        .collect();
    // The forger keeps the document's metadata (its tenants, say) and recomputes
    // the digest over it, as a careful forger would.
    let meta: Option<flotilla_core::bundle::BundleMeta> = forged
        .get("meta")
        .map(|m| serde_json::from_value(m.clone()).expect("meta"));
    let mut resources: Vec<_> = resources;
    resources.sort_by(|a, b| a.key.cmp(&b.key));
    let forged_bundle = Bundle::from_sorted_with_meta(CLUSTER, resources, meta);
    assert_ne!(forged_bundle.digest, second_digest);
    forged["digest"] = Value::String(forged_bundle.digest.to_string());
    forged["resources"] = serde_json::to_value(
        forged_bundle
            .resources
            .iter()
            .map(|r| r.value())
            .collect::<Vec<_>>(),
    )
    .expect("resources");
    agent_support::publish_document(
        mirror.path(),
        CLUSTER,
        &serde_json::to_vec(&forged).expect("JSON"),
    );

    let mut config = AgentConfig::new(
        Server::File(mirror.path().to_path_buf()),
        CLUSTER,
        f.site.state(),
    );
    config.wait = Wait::Fixed(Duration::from_millis(100));
    config.trusted = trusted;
    let agent = Agent::new(
        config,
        DirSink::new(&f.site.target(), &f.site.state(), false),
    );
    let mut reports = agent.reports();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(async {
        let _ = stopped.await;
    }));
    let mut until = async |what: &str, test: &dyn Fn(&StatusReport) -> bool| -> StatusReport {
        tokio::time::timeout(
            Duration::from_secs(20),
            reports.wait_for(|r| r.as_ref().is_some_and(test)),
        )
        .await
        .unwrap_or_else(|_| panic!("the agent never reported {what}"))
        .expect("a report")
        .clone()
        .expect("present")
    };
    let refused = until("the forgery refused", &|r| {
        r.message.contains("does not verify")
    })
    .await;
    assert_eq!(refused.applied, None);
    assert_eq!(refused.attempted, Some(forged_bundle.digest.clone()));
    assert!(
        files(&f.site.target()).is_empty(),
        "nothing of the forgery was written"
    );

    // The genuine document is taken; the first one put back (a replay) is refused.
    agent_support::publish_document(mirror.path(), CLUSTER, &second);
    until("the genuine bundle applied", &|r| {
        r.applied.as_ref() == Some(&second_digest)
    })
    .await;
    // The replayer also removes the deltas (the one from what the agent runs leads to
    // the genuine document), so that the agent fetches the bundle.
    std::fs::remove_dir_all(
        mirror
            .path()
            .join("v1/clusters")
            .join(CLUSTER)
            .join("deltas"),
    )
    .expect("removes the deltas");
    agent_support::publish_document(mirror.path(), CLUSTER, &first);
    let refused = until("the replay refused", &|r| {
        r.message.contains("is older than")
    })
    .await;
    assert_eq!(refused.applied, Some(second_digest.clone()));
    assert_eq!(files(&f.site.target()), expected_files(&rendered(&f.repo)));
    let _ = stop.send(());
    task.await.expect("no panic").expect("ran");
}

/// `flotilla publish --repo REPO --out MIRROR --signing-key KEY`: its standard error.
fn publish_signed(repo: &Repo, mirror: &Path, key: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--repo"])
        .arg(repo.path())
        .arg("--out")
        .arg(mirror)
        .arg("--signing-key")
        .arg(key)
        .output()
        .expect("flotilla publish runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

/// The signature of a cluster's current document in a publish folder.
fn published_signature(mirror: &Path) -> BundleSignature {
    let bytes =
        std::fs::read(mirror.join("v1/clusters").join(CLUSTER).join("bundle")).expect("published");
    verify_document_parts(&bytes, Some(CLUSTER))
        .expect("verifies")
        .signature
        .expect("signed")
}

#[tokio::test]
async fn a_sequence_planted_in_a_publish_mirror_is_ignored_and_agents_take_the_next_publishes() {
    let repo = Repo::new();
    let site = Site::new("");
    let (key_path, key, trusted) = generate_key(site.dir.path());
    let mirror = tempfile::tempdir().expect("tempdir");
    publish_signed(&repo, mirror.path(), &key_path);
    let first_sequence = published_signature(mirror.path()).sequence;
    let mut agent = RunningAgent::start_with(
        &site,
        &format!("file://{}", mirror.path().display()),
        |config| {
            config.token_file = None;
            config.trusted = trusted.clone();
        },
    );
    agent.applied(&rendered(&repo).digest).await;

    // Someone who can write the mirror, without the key, plants the highest sequence
    // there is with a signature of zeros. Continuing from it would sign u64::MAX
    // genuinely, and nothing could ever be signed above it.
    let path = mirror
        .path()
        .join("v1/clusters")
        .join(CLUSTER)
        .join("bundle");
    let mut planted: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
    planted["signature"]["sequence"] = Value::from(u64::MAX);
    // 64 zero bytes in base64.
    planted["signature"]["sig"] = Value::String(format!("{}==", "A".repeat(86)));
    agent_support::publish_document(
        mirror.path(),
        CLUSTER,
        &serde_json::to_vec(&planted).expect("JSON"),
    );

    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let mut previous = first_sequence;
    for replicas in [3, 4] {
        set_replicas(&repo, replicas);
        repo.commit(&format!("kuard: {replicas} replicas"));
        let stderr = publish_signed(&repo, mirror.path(), &key_path);
        let signature = published_signature(mirror.path());
        // A sane sequence: above the last genuine one, and the time (give or take a
        // minute for a slow machine), not the planted one.
        assert!(
            signature.sequence > previous && signature.sequence < started + 60_000,
            "sequence {} after {previous} (started at {started})",
            signature.sequence
        );
        assert_eq!(signature.key_id, key.key_id());
        if replicas == 3 {
            assert!(
                stderr.contains("warning:")
                    && stderr.contains(&format!("sequence {}", u64::MAX))
                    && stderr.contains("does not verify with the signing key"),
                "the planted document is named: {stderr}"
            );
        }
        previous = signature.sequence;
        let report = agent.applied(&rendered(&repo).digest).await;
        assert!(report.is_success(), "{report:?}");
    }
    agent.stop().await;
}

/// Every folder and file under `root`, with its permission bits.
fn modes_under(root: &Path) -> Vec<(PathBuf, bool, u32)> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read_dir") {
            let path = entry.expect("entry").path();
            let metadata = std::fs::symlink_metadata(&path).expect("stat");
            if metadata.is_dir() {
                folders.push(path.clone());
            }
            found.push((
                path,
                metadata.is_dir(),
                metadata.permissions().mode() & 0o777,
            ));
        }
    }
    found
}

#[test]
fn publish_output_is_private_to_its_user_even_over_an_earlier_public_one() {
    use std::os::unix::fs::PermissionsExt as _;
    let repo = Repo::new();
    let site = Site::new("");
    let (key_path, _, _) = generate_key(site.dir.path());
    let parent = tempfile::tempdir().expect("tempdir");

    // A folder publish makes, and one holding what an earlier flotilla published
    // for everyone to read (folders 0755, files 0644).
    let fresh = parent.path().join("fresh");
    let earlier = parent.path().join("earlier");
    let old = earlier.join("v1/clusters").join(CLUSTER);
    std::fs::create_dir_all(&old).expect("mkdir");
    std::fs::write(old.join("bundle"), b"{}").expect("write");
    for (path, mode) in [
        (earlier.as_path(), 0o755),
        (&earlier.join("v1"), 0o755),
        (&earlier.join("v1/clusters"), 0o755),
        (&old, 0o755),
        (&old.join("bundle"), 0o644),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    for out in [&fresh, &earlier] {
        publish_signed(&repo, out, &key_path);
        let written = modes_under(out);
        assert!(written.len() > 20, "{written:?}");
        for (path, is_dir, mode) in written {
            let expected = if is_dir { 0o700 } else { 0o600 };
            assert_eq!(mode, expected, "{} is {mode:o}", path.display());
        }
    }
    let mode = |path: &Path| std::fs::metadata(path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&fresh), 0o700, "a folder publish makes is private");
    assert_eq!(
        mode(&earlier),
        0o755,
        "the operator's own folder is left as it was"
    );
}

fn spawn_agent(site: &Site, base: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "agent",
            "--cluster",
            CLUSTER,
            "--wait",
            "5s",
            "--max-backoff",
            "1s",
        ])
        .args(["--server", base])
        .arg("--token-file")
        .arg(&site.token_file)
        .arg("--state-dir")
        .arg(site.state())
        .arg("--sink")
        .arg(format!("dir:{}", site.target().display()))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the agent binary starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_binary_killed_during_writes_against_the_hub_always_starts_cleanly() {
    use rand::Rng;
    let mut rng = flotilla_testkit::seeded_rng("agent binary killed against the hub");
    let f = fixture().await;
    let hub = HubProcess::start(f.hub_state.path(), &f.repo, any_port()).await;
    let base = hub.base();
    let mut replicas = 1;
    for iteration in 0..20 {
        let mut agent = spawn_agent(&f.site, &base);
        let delay = rng.random_range(5..120);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        if iteration % 2 == 0 {
            replicas += 1;
            set_replicas(&f.repo, replicas);
            f.repo.commit(&format!("kuard: {replicas} replicas"));
            let delay = rng.random_range(0..60);
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("iteration {iteration}: the agent exited by itself with {status}");
        }
        agent.kill().expect("SIGKILL");
        agent.wait().expect("reaped");
        if let Ok(bytes) = std::fs::read(f.site.state().join("bundle.json")) {
            flotilla_core::bundle::verify_document(&bytes, Some(CLUSTER))
                .unwrap_or_else(|err| panic!("iteration {iteration}: kept bundle damaged: {err}"));
        }
    }
    let last = rendered(&f.repo);
    let mut agent = spawn_agent(&f.site, &base);
    until_in_sync(&hub, &f.admin, &last.digest).await;
    let expected = expected_files(&last);
    for _ in 0..500 {
        if files(&f.site.target()) == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(agent.try_wait().expect("polls").is_none(), "still running");
    agent.kill().expect("SIGKILL");
    agent.wait().expect("reaped");
    assert_eq!(files(&f.site.target()), expected);
    hub.stop().await;
}
