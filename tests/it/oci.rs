//! OCI registries: `flotilla publish --oci` pushing to the real CNCF distribution
//! registry (Debian's `docker-registry`), and the real agent pulling from it
//! (`oci://`), over plain HTTP on loopback and over TLS with basic authentication.
//!
//! What the registry served is read from its access log (one line per request), and
//! the agent's wire bytes from a counting TCP proxy between it and the registry.

use crate::support::agent::RunningAgent;
use crate::support::hub::{self as hub_support, Repo, eventually};
use crate::support::process::{Background, free_port};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flotilla_agent::AgentConfig;
use flotilla_agent::client::Server;
use flotilla_agent::wait::Wait;
use flotilla_core::bundle::{Bundle, Digest, Resource, ResourceKey};
use flotilla_core::signing::{PublicKey, TrustedKeys};
use flotilla_oci::artifact::BundleManifest;
use flotilla_oci::{Artifact, Credentials, Registry, RegistryOptions, Repository};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";
const REPOSITORY: &str = "fleet/bundles";

/// A registry the test started: its folder, port and access log.
struct TestRegistry {
    process: Option<Background>,
    dir: tempfile::TempDir,
    port: u16,
}

struct RegistryTls {
    cert: PathBuf,
    key: PathBuf,
}

impl TestRegistry {
    /// Starts `docker-registry` on a free loopback port; `None` (a skip) when it is
    /// not installed.
    fn start(
        test: &str,
        tls: Option<&RegistryTls>,
        htpasswd: Option<&Path>,
    ) -> Option<TestRegistry> {
        let missing = (!Path::new(REGISTRY_BINARY).exists()).then(|| {
            format!("{REGISTRY_BINARY} is not installed (Debian's docker-registry package)")
        });
        if !flotilla_testkit::can_run(test, missing) {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: flotilla-test\n",
            dir.path().join("data").display()
        );
        if let Some(tls) = tls {
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                tls.cert.display(),
                tls.key.display()
            ));
        }
        if let Some(htpasswd) = htpasswd {
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: flotilla-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), config).expect("writes the config");
        let mut registry = TestRegistry {
            process: None,
            dir,
            port,
        };
        registry.run();
        Some(registry)
    }

    /// Starts (or starts again) the registry process and waits until it answers.
    fn run(&mut self) {
        let log = self.dir.path().join("registry.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("docker-registry starts");
        let mut process = Background { child, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("docker-registry ended with {status}:\n{}", process.log());
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not start:\n{}",
                process.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.process = Some(process);
    }

    fn stop(&mut self) {
        // Dropping the process kills it, by its own id.
        self.process = None;
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// How many requests of `method` on a path starting with `path` the access log holds.
    fn requests(&self, method: &str, path: &str) -> usize {
        let needle = format!("\"{method} /v2/{REPOSITORY}/{path}");
        self.log()
            .lines()
            .filter(|line| line.contains(&needle))
            .count()
    }

    /// How many of those the registry answered with `status` (the access log's
    /// `"METHOD path HTTP/1.1" status size` lines).
    fn answered(&self, method: &str, path: &str, status: u16) -> usize {
        let needle = format!("\"{method} /v2/{REPOSITORY}/{path}");
        self.log()
            .lines()
            .filter(|line| {
                line.split_once(&needle).is_some_and(|(_, rest)| {
                    rest.split_once("\" ")
                        .is_some_and(|(_, after)| after.starts_with(&format!("{status} ")))
                })
            })
            .count()
    }
}

/// A TCP proxy in front of the registry that counts the bytes each way.
struct CountingProxy {
    port: u16,
    to_registry: Arc<AtomicU64>,
    from_registry: Arc<AtomicU64>,
}

impl CountingProxy {
    async fn start(upstream: u16) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("address").port();
        let to_registry = Arc::new(AtomicU64::new(0));
        let from_registry = Arc::new(AtomicU64::new(0));
        let (up, down) = (to_registry.clone(), from_registry.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (up, down) = (up.clone(), down.clone());
                tokio::spawn(async move {
                    // A registry that is down: the client's connection is closed.
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, up),
                        pump(server_read, client_write, down)
                    );
                });
            }
        });
        CountingProxy {
            port,
            to_registry,
            from_registry,
        }
    }

    fn bytes(&self) -> (u64, u64) {
        (
            self.to_registry.load(Ordering::SeqCst),
            self.from_registry.load(Ordering::SeqCst),
        )
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counter: Arc<AtomicU64>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                counter.fetch_add(n as u64, Ordering::SeqCst);
                if to.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Runs the real `flotilla` to completion; its exit status and output.
fn flotilla(args: &[&str], env: &[(&str, &Path)]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    command
        .args(args)
        .env_remove("FLOTILLA_STATE_DIR")
        .env_remove("FLOTILLA_DECRYPTION_KEY")
        .env_remove("FLOTILLA_SIGNING_KEY")
        .env("NO_COLOR", "1")
        // No developer's own registry credentials.
        .env("DOCKER_CONFIG", "/nonexistent-flotilla-test");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("flotilla runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The agent, in process, applying to a folder.
/// What HEAD of `repo` renders for `cluster`.
fn rendered(repo: &Repo, cluster: &str) -> Bundle {
    let snapshot = flotilla_hub::source::from_folder(repo.path(), "").expect("reads the fleet");
    let output = flotilla_render::render(&snapshot);
    assert!(output.is_clean(), "the fleet renders");
    output.bundles.get(cluster).expect("the cluster").clone()
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

fn yaml_count(dir: &Path) -> usize {
    crate::support::agent::yaml_names(dir).len()
}

fn registry_client(repository: &str, options: RegistryOptions) -> Registry {
    Registry::new(
        Repository::parse(repository).expect("a repository"),
        reqwest::Client::new(),
        options,
    )
    .expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_oci_then_the_agent_pulls_verifies_applies_and_survives_the_registry() {
    let test = "publish_oci_then_the_agent_pulls_verifies_applies_and_survives_the_registry";
    let Some(mut registry) = TestRegistry::start(test, None, None) else {
        return;
    };
    let repo = Repo::new();
    let work = tempfile::tempdir().expect("tempdir");
    let key = work.path().join("signing.key");
    let (ok, out) = flotilla(
        &["key", "generate", "--out", key.to_str().expect("utf-8")],
        &[],
    );
    assert!(ok, "{out}");
    let reference = format!("{}/{REPOSITORY}", registry.address());
    let publish = |extra: &[&str]| {
        let mut args = vec![
            "publish",
            "--repo",
            repo.path().to_str().expect("utf-8"),
            "--oci",
            &reference,
            "--oci-plain-http",
            "--signing-key",
            key.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        flotilla(&args, &[])
    };
    let (ok, out) = publish(&[]);
    assert!(ok, "{out}");
    assert!(out.contains("14 written, 0 unchanged"), "{out}");
    let first = rendered(&repo, "blue");

    // The layer's OCI digest is the flotilla digest; the manifest names the cluster.
    let client = registry_client(
        &reference,
        RegistryOptions {
            plain_http: true,
            credentials: None,
        },
    );
    let (manifest_bytes, manifest_digest) = client
        .get_manifest("blue")
        .await
        .expect("reads")
        .expect("tagged");
    let manifest =
        BundleManifest::parse(&manifest_bytes, manifest_digest.as_str()).expect("a bundle");
    assert_eq!(manifest.layer, first.digest);
    assert_eq!(manifest.cluster, "blue");
    assert!(manifest.signature.is_some());

    // Published again, nothing changes: no tag moves, no blob is uploaded.
    let uploads = registry.requests("POST", "blobs/uploads");
    let (ok, out) = publish(&[]);
    assert!(ok, "{out}");
    assert!(
        out.contains("0 written, 14 unchanged, 0 blobs uploaded"),
        "{out}"
    );
    assert_eq!(registry.requests("POST", "blobs/uploads"), uploads);
    assert_eq!(
        client.head_manifest("blue").await.expect("reads"),
        Some(manifest_digest.clone())
    );

    // The agent, through a proxy that counts its bytes, and reporting to a hub.
    let proxy = CountingProxy::start(registry.port).await;
    let hub_state = tempfile::tempdir().expect("tempdir");
    // Tokens are made before the hub starts, which reads them then: nothing else in
    // this process opens the hub's database while it runs.
    let token = hub_support::make_token(hub_state.path(), Some("blue")).await;
    let admin = hub_support::make_token(hub_state.path(), None).await;
    let hub = hub_support::Running::start_ready(hub_support::config(
        hub_state.path(),
        repo.path().to_str().expect("utf-8"),
    ))
    .await;
    let token_file = work.path().join("token");
    std::fs::write(&token_file, &token).expect("writes the token");
    let public = PublicKey::parse(
        &std::fs::read_to_string(work.path().join("signing.key.pub")).expect("the public key"),
    )
    .expect("a public key");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let config = || {
        let server = Server::parse(&format!("oci://127.0.0.1:{}/{REPOSITORY}", proxy.port))
            .expect("an oci:// server");
        let mut config = AgentConfig::new(server, "blue", state.path().to_path_buf());
        config.wait = Wait::Fixed(Duration::from_millis(300));
        config.registry.plain_http = true;
        config.trusted = TrustedKeys::new(vec![public.clone()]);
        config.token_file = Some(token_file.clone());
        config.report_to = Some(url::Url::parse(&hub.base).expect("the hub's URL"));
        config
    };
    let mut agent = RunningAgent::start(config(), target.path());
    agent.applied(&first.digest).await;
    assert_eq!(yaml_count(target.path()), first.resources.len());
    // The hub heard of it through --report-to.
    let http = hub_support::client();
    eventually(
        "the hub to hear blue's report",
        Duration::from_secs(30),
        || async {
            let fleet = hub_support::get_json(&http, &hub.url("/v1/fleet"), &admin).await;
            fleet
                .to_string()
                .contains(&format!("\"applied\":\"{}\"", first.digest))
                .then_some(())
        },
    )
    .await;

    // Unchanged: each poll is one HEAD of the tag; no manifest or blob is fetched.
    let blob_gets = registry.requests("GET", "blobs/");
    let manifest_gets = registry.requests("GET", "manifests/");
    let heads = registry.requests("HEAD", "manifests/blue");
    let bytes_before = proxy.bytes();
    let polls = 5;
    eventually("five unchanged polls", Duration::from_secs(30), || async {
        (registry.requests("HEAD", "manifests/blue") >= heads + polls).then_some(())
    })
    .await;
    let bytes_after = proxy.bytes();
    let heads_seen = registry.requests("HEAD", "manifests/blue") - heads;
    assert_eq!(registry.requests("GET", "blobs/"), blob_gets);
    assert_eq!(registry.requests("GET", "manifests/"), manifest_gets);
    let per_poll = (bytes_after.0 - bytes_before.0 + bytes_after.1 - bytes_before.1) as f64
        / heads_seen as f64;
    eprintln!(
        "an unchanged poll of an oci:// server: {per_poll:.0} bytes of HTTP on the wire \
         ({} sent, {} received over {heads_seen} polls on one kept connection)",
        bytes_after.0 - bytes_before.0,
        bytes_after.1 - bytes_before.1
    );
    assert!(
        per_poll < 1024.0,
        "an unchanged poll costs {per_poll} bytes"
    );

    // Changed: the new bundle is fetched and applied.
    set_replicas(&repo, 5);
    repo.commit("five replicas");
    let second = rendered(&repo, "blue");
    assert_ne!(second.digest, first.digest);
    let (ok, out) = publish(&[]);
    assert!(ok, "{out}");
    agent.applied(&second.digest).await;

    // Tampered: a manifest whose revision was changed after signing, then a layer
    // that is not the canonical body of its digest. Both are refused; what runs stays.
    let (bytes, digest) = client
        .get_manifest("blue")
        .await
        .expect("reads")
        .expect("tagged");
    let good = BundleManifest::parse(&bytes, digest.as_str()).expect("a bundle");
    let layer = client
        .get_blob(&good.layer, 1 << 20)
        .await
        .expect("the layer");
    let forged = Artifact::bundle(
        "blue",
        "main@sha1:forged",
        layer.clone(),
        good.signature.as_ref(),
    );
    client.push("blue", &forged).await.expect("pushes");
    agent
        .until("the forged revision refused", |r| {
            r.applied.as_ref() == Some(&second.digest) && r.message.contains("refused")
        })
        .await;
    // The next publish signs the revision it renders, not the one pushed with the
    // genuine layer by whoever may push to the repository.
    let (ok, out) = publish(&[]);
    assert!(ok, "{out}");
    let (bytes, digest) = client
        .get_manifest("blue")
        .await
        .expect("reads")
        .expect("tagged");
    let republished = BundleManifest::parse(&bytes, digest.as_str()).expect("a bundle");
    assert_eq!(republished.layer, good.layer);
    assert_eq!(republished.revision, good.revision);
    let mut loose = serde_json::to_vec_pretty(
        &serde_json::from_slice::<serde_json::Value>(&layer).expect("JSON"),
    )
    .expect("JSON");
    loose.push(b'\n');
    let reformatted = Artifact::bundle("blue", &good.revision, loose, good.signature.as_ref());
    client.push("blue", &reformatted).await.expect("pushes");
    let refused = agent
        .until("the non-canonical layer refused", |r| {
            r.applied.as_ref() == Some(&second.digest)
                && r.attempted.as_ref() == Some(&reformatted.layers[0].digest)
        })
        .await;
    assert!(refused.message.contains("refused"), "{}", refused.message);
    assert_eq!(yaml_count(target.path()), second.resources.len());

    // The registry goes away: the agent keeps running what it has, and a new agent
    // on the same state boots from it without the registry.
    registry.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!agent.is_finished(), "the agent keeps running");
    agent.stop().await;
    std::fs::remove_dir_all(target.path()).expect("clears the target");
    let mut again = RunningAgent::start(config(), target.path());
    again.applied(&second.digest).await;
    assert_eq!(yaml_count(target.path()), second.resources.len());
    again.stop().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_oci_with_basic_authentication_over_tls() {
    let test = "publish_oci_with_basic_authentication_over_tls";
    let htpasswd_missing = flotilla_testkit::command_works("htpasswd", &["-nbB", "u", "p"]).err();
    if !flotilla_testkit::can_run(test, htpasswd_missing) {
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let ca = flotilla_testkit::TestCa::new("flotilla test registry CA");
    let leaf = ca.server(&["127.0.0.1", "localhost"]);
    let tls = RegistryTls {
        cert: work.path().join("registry.pem"),
        key: work.path().join("registry-key.pem"),
    };
    std::fs::write(&tls.cert, &leaf.cert_pem).expect("writes");
    std::fs::write(&tls.key, &leaf.key_pem).expect("writes");
    let ca_file = work.path().join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).expect("writes");
    let password = "correct-horse-battery";
    let htpasswd = work.path().join("htpasswd");
    let hashed = Command::new("htpasswd")
        .args(["-nbB", "robot", password])
        .output()
        .expect("htpasswd runs");
    assert!(hashed.status.success());
    std::fs::write(&htpasswd, &hashed.stdout).expect("writes");
    let Some(registry) = TestRegistry::start(test, Some(&tls), Some(&htpasswd)) else {
        return;
    };
    let repo = Repo::new();
    let reference = format!("{}/{REPOSITORY}", registry.address());
    let publish_with = |extra: &[&str], env: &[(&str, &Path)]| {
        let mut args = vec![
            "publish",
            "--repo",
            repo.path().to_str().expect("utf-8"),
            "--oci",
            &reference,
            "--ca-file",
            ca_file.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        flotilla(&args, env)
    };
    let publish = |env: &[(&str, &Path)]| publish_with(&[], env);

    // Without credentials the registry's 401 is explained.
    let (ok, out) = publish(&[]);
    assert!(!ok, "{out}");
    assert!(out.contains("401") && out.contains("docker login"), "{out}");

    // With the Docker configuration file's, it works, and the password is never shown.
    let docker = work.path().join("docker");
    std::fs::create_dir_all(&docker).expect("mkdir");
    let auth = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("robot:{password}"))
    };
    std::fs::write(
        docker.join("config.json"),
        json!({"auths": {registry.address(): {"auth": auth}}}).to_string(),
    )
    .expect("writes");
    let (ok, out) = publish(&[("DOCKER_CONFIG", &docker)]);
    assert!(ok, "{out}");
    assert!(out.contains("14 written"), "{out}");
    assert!(!out.contains(password) && !out.contains(&auth), "{out}");

    // With --oci-username and --oci-password-file instead (no Docker configuration
    // file): a wrong password is refused without being shown, the right one works.
    let empty_docker = work.path().join("no-docker");
    std::fs::create_dir_all(&empty_docker).expect("mkdir");
    let password_file = work.path().join("registry-password");
    let wrong = "wrong-horse-battery";
    std::fs::write(&password_file, format!("{wrong}\n")).expect("writes");
    let flags = [
        "--oci-username",
        "robot",
        "--oci-password-file",
        password_file.to_str().expect("utf-8"),
    ];
    let (ok, out) = publish_with(&flags, &[("DOCKER_CONFIG", &empty_docker)]);
    assert!(!ok, "{out}");
    assert!(out.contains("401"), "{out}");
    assert!(!out.contains(wrong), "{out}");
    std::fs::write(&password_file, format!("{password}\n")).expect("writes");
    let (ok, out) = publish_with(&flags, &[("DOCKER_CONFIG", &empty_docker)]);
    assert!(ok, "{out}");
    assert!(out.contains("0 written, 14 unchanged"), "{out}");
    assert!(!out.contains(password), "{out}");

    // The system's trust store, as SSL_CERT_FILE names it, is trusted without --ca-file.
    let mut args = vec![
        "publish",
        "--repo",
        repo.path().to_str().expect("utf-8"),
        "--oci",
        &reference,
    ];
    args.extend_from_slice(&flags);
    let (ok, out) = flotilla(&args, &[("DOCKER_CONFIG", &empty_docker)]);
    assert!(!ok, "an unknown CA is refused: {out}");
    assert!(
        out.contains("SSL_CERT_FILE"),
        "the refusal says how to trust it: {out}"
    );
    let (ok, out) = flotilla(
        &args,
        &[
            ("DOCKER_CONFIG", &empty_docker),
            ("SSL_CERT_FILE", &ca_file),
        ],
    );
    assert!(ok, "{out}");
    assert!(out.contains("0 written, 14 unchanged"), "{out}");

    // The agent, trusting the registry's CA with --ca-file, with the credentials,
    // through a proxy that counts its bytes (TLS records included).
    let bundle = rendered(&repo, "red");
    let state = tempfile::tempdir().expect("tempdir");
    let target = tempfile::tempdir().expect("tempdir");
    let proxy = CountingProxy::start(registry.port).await;
    let server = Server::parse(&format!("oci://127.0.0.1:{}/{REPOSITORY}", proxy.port))
        .expect("an oci:// server");
    let mut config = AgentConfig::new(server, "red", state.path().to_path_buf());
    config.wait = Wait::Fixed(Duration::from_millis(300));
    config.tls.ca_file = Some(ca_file.clone());
    config.registry.credentials = Some(Credentials {
        username: "robot".into(),
        password: password.into(),
    });
    let mut agent = RunningAgent::start(config, target.path());
    agent.applied(&bundle.digest).await;
    assert_eq!(yaml_count(target.path()), bundle.resources.len());

    // Unchanged: each poll is one HEAD, sent with the credentials the first challenge
    // asked for, so the registry refuses none of them; under 1 KB on the wire.
    let refused = registry.answered("HEAD", "manifests/red", 401);
    assert!(
        refused > 0,
        "the first requests met the challenge:\n{}",
        registry.log()
    );
    let gets = registry.requests("GET", "");
    // Bytes are read just after a poll is seen in the access log, at both ends, so the
    // window holds as many answers as requests whichever way that races the wire.
    let registry = &registry;
    let poll_seen = |after: usize| {
        eventually(
            "an unchanged poll",
            Duration::from_secs(30),
            move || async move {
                let heads = registry.requests("HEAD", "manifests/red");
                (heads > after).then_some(heads)
            },
        )
    };
    let heads = poll_seen(registry.requests("HEAD", "manifests/red")).await;
    let bytes_before = proxy.bytes();
    let polls = 5;
    let mut heads_now = heads;
    while heads_now < heads + polls {
        heads_now = poll_seen(heads_now).await;
    }
    let bytes_after = proxy.bytes();
    let heads_seen = heads_now - heads;
    assert_eq!(
        registry.answered("HEAD", "manifests/red", 401),
        refused,
        "an unchanged poll is not refused first:\n{}",
        registry.log()
    );
    assert_eq!(
        registry.requests("GET", ""),
        gets,
        "no manifest or blob fetched"
    );
    let per_poll = (bytes_after.0 - bytes_before.0 + bytes_after.1 - bytes_before.1) as f64
        / heads_seen as f64;
    let log = registry.log();
    let protocol = log
        .lines()
        .rev()
        .find_map(|line| line.split_once("/manifests/red HTTP/"))
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or("?");
    eprintln!(
        "an unchanged poll of an oci:// server with basic authentication over TLS: \
         {per_poll:.0} bytes on the wire, TLS records included ({} sent, {} received over \
         {heads_seen} polls on one kept HTTP/{protocol} connection)",
        bytes_after.0 - bytes_before.0,
        bytes_after.1 - bytes_before.1
    );
    assert!(
        per_poll < 1024.0,
        "an unchanged poll costs {per_poll} bytes"
    );
    agent.stop().await;
}

/// Publishes `clusters` clusters sharing `distinct` bundles to a fresh registry; the
/// time it took, with the registry for counting.
async fn publish_many(
    test: &str,
    clusters: usize,
    distinct: usize,
) -> Option<(TestRegistry, Duration)> {
    let registry = TestRegistry::start(test, None, None)?;
    let bundles: Vec<Bundle> = (0..distinct)
        .map(|flavour| {
            let value = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "flavour", "namespace": "default"},
                "data": {"flavour": flavour.to_string()},
            });
            let key = ResourceKey::of(&value).expect("a key");
            Bundle::new("shared", vec![Arc::new(Resource::new(key, &value))])
        })
        .collect();
    let output = flotilla_render::RenderOutput {
        revision: "main@sha1:0123456789abcdef0123456789abcdef01234567".into(),
        bundles: (0..clusters)
            .map(|i| {
                let name = format!("edge-{i:05}");
                let mut bundle = bundles[i % distinct].clone();
                bundle.cluster = name.clone();
                (name, bundle)
            })
            .collect::<BTreeMap<_, _>>(),
        ..flotilla_render::RenderOutput::default()
    };
    let client = registry_client(
        &format!("{}/{REPOSITORY}", registry.address()),
        RegistryOptions {
            plain_http: true,
            credentials: None,
        },
    );
    let site = flotilla_hub::publish::Site::Oci(client);
    let started = Instant::now();
    let published = flotilla_hub::publish::publish_to(&output, &site, Default::default())
        .await
        .expect("publishes");
    let took = started.elapsed();
    assert_eq!(published.written, clusters);
    // Each distinct layer once, and the empty config once.
    assert_eq!(published.uploaded_blobs, distinct + 1);
    assert_eq!(registry.requests("POST", "blobs/uploads"), distinct + 1);
    assert_eq!(registry.requests("PUT", "blobs/uploads"), distinct + 1);
    assert_eq!(registry.requests("PUT", "manifests/"), clusters);
    let requests = |registry: &TestRegistry| {
        registry
            .log()
            .lines()
            .filter(|line| line.contains(" HTTP/1.1\" "))
            .count()
    };
    let first_requests = requests(&registry);
    eprintln!(
        "publish --oci of {clusters} clusters sharing {distinct} bundles: {took:.2?}, \
         {} blobs uploaded, {clusters} manifests put, {first_requests} requests",
        distinct + 1,
    );
    // Again, unchanged: every tag read, nothing uploaded or put.
    let started = Instant::now();
    let again = flotilla_hub::publish::publish_to(&output, &site, Default::default())
        .await
        .expect("publishes");
    let took_again = started.elapsed();
    assert_eq!((again.written, again.unchanged), (0, clusters));
    assert_eq!(again.uploaded_blobs, 0);
    assert_eq!(registry.requests("PUT", "manifests/"), clusters);
    eprintln!(
        "the same again, unchanged: {took_again:.2?}, {} requests",
        requests(&registry) - first_requests
    );
    Some((registry, took))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_oci_of_a_thousand_clusters_uploads_each_distinct_bundle_once() {
    publish_many(
        "publish_oci_of_a_thousand_clusters_uploads_each_distinct_bundle_once",
        1_000,
        10,
    )
    .await;
}

/// The figure in BENCHMARKS.md ("OCI registries"): `cargo test --test it --
/// --ignored publish_oci_of_ten_thousand --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: 10,000 clusters, about a minute"]
async fn publish_oci_of_ten_thousand_clusters_sharing_ten_bundles() {
    publish_many(
        "publish_oci_of_ten_thousand_clusters_sharing_ten_bundles",
        10_000,
        10,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_oci_pushes_what_the_hub_serves_on_every_change() {
    let test = "serve_oci_pushes_what_the_hub_serves_on_every_change";
    let Some(registry) = TestRegistry::start(test, None, None) else {
        return;
    };
    let repo = Repo::new();
    let reference = format!("{}/{REPOSITORY}", registry.address());
    let options = || RegistryOptions {
        plain_http: true,
        credentials: None,
    };
    let state = tempfile::tempdir().expect("tempdir");
    let mut config = hub_support::config(state.path(), repo.path().to_str().expect("utf-8"));
    config.poll_interval = Duration::from_millis(200);
    config.signing_key = Some(Arc::new(flotilla_core::signing::SigningKey::from_seed(
        [7; 32],
    )));
    config.oci = Some(registry_client(&reference, options()));
    let token = hub_support::make_token(state.path(), Some("blue")).await;
    let hub = hub_support::Running::start_ready(config).await;
    let client = registry_client(&reference, options());
    let tagged = |digest: Digest| {
        let client = client.clone();
        async move {
            eventually(
                &format!("blue's tag to name {digest}"),
                Duration::from_secs(60),
                || async {
                    let (bytes, manifest_digest) = client.get_manifest("blue").await.ok()??;
                    let manifest = BundleManifest::parse(&bytes, manifest_digest.as_str()).ok()?;
                    (manifest.layer == digest).then_some(manifest)
                },
            )
            .await
        }
    };
    let first = tagged(rendered(&repo, "blue").digest).await;
    // The hub's own signature, as an agent polling the hub would get it.
    let (_, _, served) = hub_support::get_bundle(
        &hub_support::client(),
        &hub.url("/v1/clusters/blue/bundle"),
        &token,
        None,
    )
    .await;
    let served =
        flotilla_core::bundle::verify_document_parts(&served, Some("blue")).expect("verifies");
    assert_eq!(first.signature, served.signature);
    assert_eq!(first.revision, served.revision);

    set_replicas(&repo, 4);
    repo.commit("four replicas");
    let second = tagged(rendered(&repo, "blue").digest).await;
    let (old, new) = (
        first.signature.expect("signed").sequence,
        second.signature.expect("signed").sequence,
    );
    assert!(new > old, "the sequence went up: {old} then {new}");
    hub.stop().await;
}

/// Runs the real `flotilla` to completion; its exit code and output.
fn flotilla_code(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_STATE_DIR")
        .env_remove("FLOTILLA_DECRYPTION_KEY")
        .env_remove("FLOTILLA_SIGNING_KEY")
        .env("NO_COLOR", "1")
        .env("DOCKER_CONFIG", "/nonexistent-flotilla-test")
        .output()
        .expect("flotilla runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// A fleet for Flux: `plain` has no Secret; `keyed` has one and names its agent's
/// key; `bare` has one and no key.
fn flux_fleet(agent_key: &str) -> Repo {
    let repo = Repo::empty();
    let header = "apiVersion: flotilla.dev/v1alpha1\n";
    for (name, spec) in [
        ("plain", String::new()),
        ("keyed", format!("spec:\n  agentKey: {agent_key}\n")),
        ("bare", String::new()),
    ] {
        let secrets = if name == "plain" { "no" } else { "yes" };
        repo.write(
            &format!("clusters/{name}.yaml"),
            &format!(
                "{header}kind: Cluster\nmetadata:\n  name: {name}\n  labels:\n    secrets: \"{secrets}\"\n{spec}"
            ),
        );
    }
    repo.write(
        "workloads/shop/workload.yaml",
        &format!(
            "{header}kind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    );
    repo.write(
        "workloads/shop/manifests/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n  port: \"5432\"\n",
    );
    repo.write(
        "workloads/shop/manifests/web.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n        - name: web\n          image: nginx:1.27\n",
    );
    repo.write(
        "workloads/vault/workload.yaml",
        &format!(
            "{header}kind: Workload\nmetadata:\n  name: vault\nspec:\n  namespace: vault\n  targets:\n    - clusterSelector:\n        matchLabels:\n          secrets: \"yes\"\n"
        ),
    );
    repo.write(
        "workloads/vault/manifests/db.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n  password: aHVudGVyMg==\nstringData:\n  user: admin\n",
    );
    repo.commit("a fleet for Flux");
    repo
}

/// The summary line of the Flux artifacts in `out`.
fn flux_line(out: &str) -> &str {
    out.lines()
        .find(|line| line.starts_with("pushed the Flux artifacts"))
        .unwrap_or_default()
}

/// The layer's files, unpacked as source-controller unpacks it: (name, text).
fn unpack_layer(layer: &[u8]) -> Vec<(String, String)> {
    use std::io::Read as _;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    let mut files = Vec::new();
    for entry in archive.entries().expect("a tar stream") {
        let mut entry = entry.expect("an entry");
        assert_eq!(entry.header().entry_type(), tar::EntryType::Regular);
        let name = entry.path().expect("a path").to_string_lossy().into_owned();
        let mut text = String::new();
        entry.read_to_string(&mut text).expect("UTF-8");
        files.push((name, text));
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_oci_format_flux_pushes_each_clusters_flux_artifact_and_refuses_only_what_it_must()
{
    use age::secrecy::ExposeSecret as _;
    use flotilla_oci::artifact::{CLUSTER_ANNOTATION, ImageManifest};
    use flotilla_render::formats::flux;
    use flotilla_render::sops::{DecryptionKeys, SopsDocument};

    let test =
        "publish_oci_format_flux_pushes_each_clusters_flux_artifact_and_refuses_only_what_it_must";
    let Some(registry) = TestRegistry::start(test, None, None) else {
        return;
    };
    let agent = age::x25519::Identity::generate();
    let repo = flux_fleet(&agent.to_public().to_string());
    let commit = repo.git(&["rev-parse", "HEAD"]);
    let work = tempfile::tempdir().expect("tempdir");
    // The operator's decryption identity, from which the SOPS seed is derived.
    let hub_key = work.path().join("hub.agekey");
    let (ok, out) = flotilla(
        &[
            "key",
            "generate",
            "--age",
            "--out",
            hub_key.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert!(ok, "{out}");
    let reference = format!("{}/{REPOSITORY}", registry.address());
    let repo_path = repo.path().to_str().expect("utf-8").to_string();
    let publish = || {
        flotilla_code(&[
            "publish",
            "--repo",
            &repo_path,
            "--oci",
            &reference,
            "--oci-plain-http",
            "--format",
            "flux",
            "--flux-source",
            "https://git.example/fleet.git",
            "--decryption-key",
            hub_key.to_str().expect("utf-8"),
        ])
    };

    // bare (a Secret, no agentKey) has no Flux artifact and keyed (whose Secret only
    // the hub's seed could seal for its agent) no bundle: each is said, exit 1, and
    // everything else is pushed.
    let (code, out) = publish();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("cluster bare: the Secret") && out.contains("no spec.agentKey"),
        "{out}"
    );
    assert!(
        out.contains("cluster keyed: its bundle was not pushed"),
        "{out}"
    );
    assert!(out.contains("published 2 clusters"), "{out}");
    assert!(
        flux_line(&out).starts_with("pushed the Flux artifacts of 2 clusters")
            && flux_line(&out).contains("(2 written, 0 unchanged"),
        "{out}"
    );
    assert!(out.contains("1 cluster has no Flux artifact"), "{out}");

    let client = registry_client(
        &reference,
        RegistryOptions {
            plain_http: true,
            credentials: None,
        },
    );
    let tagged = |tag: &'static str| {
        let client = client.clone();
        async move { client.head_manifest(tag).await.expect("reads").is_some() }
    };
    assert!(tagged("plain").await && tagged("bare").await);
    assert!(
        !tagged("keyed").await,
        "keyed's bundle would carry plain Secrets"
    );
    assert!(tagged("plain-flux").await && tagged("keyed-flux").await);
    assert!(!tagged("bare-flux").await);

    let snapshot = flotilla_hub::source::from_folder(repo.path(), "").expect("reads the fleet");
    let output = flotilla_render::render(&snapshot);
    assert!(output.is_clean(), "the fleet renders");
    let agent_keys = DecryptionKeys::from_identity_file(agent.to_string().expose_secret())
        .expect("the agent's identity");
    let mut manifests = BTreeMap::new();
    for cluster in ["plain", "keyed"] {
        let tag = format!("{cluster}-flux");
        let (bytes, digest) = client
            .get_manifest(&tag)
            .await
            .expect("reads")
            .expect("tagged");
        let manifest = ImageManifest::parse(&bytes, digest.as_str()).expect("an image manifest");
        // What `flux push artifact` writes: no artifactType, Flux's config and layer.
        assert_eq!(manifest.media_type, flux::MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest.artifact_type, None);
        assert!(!String::from_utf8_lossy(&bytes).contains("artifactType"));
        assert_eq!(manifest.config.media_type, flux::CONFIG_MEDIA_TYPE);
        let config = Digest::parse(&manifest.config.digest).expect("sha256");
        assert_eq!(
            client.get_blob(&config, 1024).await.expect("the config"),
            flux::CONFIG
        );
        let [layer] = manifest.layers.as_slice() else {
            panic!("one layer: {manifest:?}");
        };
        assert_eq!(layer.media_type, flux::LAYER_MEDIA_TYPE);
        let annotation = |key: &str| manifest.annotations.get(key).cloned();
        assert_eq!(
            annotation(flux::REVISION_ANNOTATION),
            Some(format!("main@sha1:{commit}"))
        );
        assert_eq!(
            annotation(flux::SOURCE_ANNOTATION).as_deref(),
            Some("https://git.example/fleet.git")
        );
        assert_eq!(annotation(CLUSTER_ANNOTATION).as_deref(), Some(cluster));

        // The layer holds the bundle's resources, the Secret as SOPS for the agent.
        let layer_digest = Digest::parse(&layer.digest).expect("sha256");
        let bytes = client
            .get_blob(&layer_digest, 1 << 20)
            .await
            .expect("the layer");
        let files = unpack_layer(&bytes);
        let values: Vec<serde_json::Value> = files
            .iter()
            .map(
                |(name, text)| match SopsDocument::parse(text, false).expect("parses") {
                    Some(document) => {
                        assert!(
                            !text.contains("aHVudGVyMg=="),
                            "{name} holds the plain value"
                        );
                        serde_json::from_str(
                            &document.open(&agent_keys).expect("the agent opens it"),
                        )
                        .expect("JSON")
                    }
                    None => serde_saphyr::from_str(text).expect("YAML"),
                },
            )
            .collect();
        let bundle = output.bundles.get(cluster).expect("the cluster");
        let expected: Vec<serde_json::Value> = bundle.resources.iter().map(|r| r.value()).collect();
        assert_eq!(values, expected, "{cluster}");
        assert_eq!(
            files.iter().any(|(_, text)| text.contains("sops:")),
            cluster == "keyed"
        );
        manifests.insert(cluster, digest);
    }

    // Published again with nothing changed: no blob is uploaded, no tag moves, the
    // keyed cluster's Secret included (its SOPS seed derives from the hub's key).
    let uploads = registry.requests("POST", "blobs/uploads");
    let (code, out) = publish();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        flux_line(&out).contains("(0 written, 2 unchanged, 0 blobs uploaded)"),
        "{out}"
    );
    assert_eq!(registry.requests("POST", "blobs/uploads"), uploads);
    for (cluster, digest) in &manifests {
        assert_eq!(
            client
                .head_manifest(&format!("{cluster}-flux"))
                .await
                .expect("reads")
                .as_ref(),
            Some(digest)
        );
    }

    // A commit that changes only the Secret: plain's Flux tag stays where it was
    // (its revision is kept with its layer), keyed's moves to the new revision.
    repo.write(
        "workloads/vault/manifests/db.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ntype: Opaque\ndata:\n  password: c3dvcmRmaXNo\n",
    );
    let second = repo.commit("a new password");
    let (code, out) = publish();
    assert_eq!(code, Some(1), "{out}");
    assert!(flux_line(&out).contains("(1 written, 1 unchanged"), "{out}");
    assert_eq!(
        client
            .head_manifest("plain-flux")
            .await
            .expect("reads")
            .as_ref(),
        Some(&manifests["plain"])
    );
    let (bytes, digest) = client
        .get_manifest("keyed-flux")
        .await
        .expect("reads")
        .expect("tagged");
    assert_ne!(digest, manifests["keyed"]);
    let manifest = ImageManifest::parse(&bytes, digest.as_str()).expect("an image manifest");
    assert_eq!(
        manifest.annotations.get(flux::REVISION_ANNOTATION),
        Some(&format!("main@sha1:{second}"))
    );

    // What the hub serves has its Secrets sealed for flotilla's agent: refused.
    let (code, out) = flotilla_code(&[
        "publish",
        "--repo",
        &repo_path,
        "--oci",
        &reference,
        "--oci-plain-http",
        "--format",
        "flux",
        "--state-dir",
        work.path().to_str().expect("utf-8"),
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("--format flux cannot go with --state-dir"),
        "{out}"
    );

    // A source URL with credentials would be readable in every manifest: refused.
    let (code, out) = flotilla_code(&[
        "publish",
        "--repo",
        &repo_path,
        "--oci",
        &reference,
        "--oci-plain-http",
        "--format",
        "flux",
        "--flux-source",
        "https://robot:t0ken@git.example/fleet.git",
    ]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("--flux-source holds credentials") && !out.contains("t0ken"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_oci_format_flux_never_writes_over_another_clusters_bundle_tag() {
    let test = "publish_oci_format_flux_never_writes_over_another_clusters_bundle_tag";
    let Some(registry) = TestRegistry::start(test, None, None) else {
        return;
    };
    let repo = Repo::empty();
    let header = "apiVersion: flotilla.dev/v1alpha1\n";
    for name in ["edge", "edge-flux"] {
        repo.write(
            &format!("clusters/{name}.yaml"),
            &format!("{header}kind: Cluster\nmetadata:\n  name: {name}\n"),
        );
    }
    repo.write(
        "workloads/shop/workload.yaml",
        &format!(
            "{header}kind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    );
    repo.write(
        "workloads/shop/manifests/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n",
    );
    repo.commit("two clusters whose tags meet");
    let reference = format!("{}/{REPOSITORY}", registry.address());
    let (code, out) = flotilla_code(&[
        "publish",
        "--repo",
        repo.path().to_str().expect("utf-8"),
        "--oci",
        &reference,
        "--oci-plain-http",
        "--format",
        "flux",
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("cluster edge: its Flux artifact's tag edge-flux is the bundle tag of the cluster edge-flux"),
        "{out}"
    );
    assert!(
        flux_line(&out).starts_with("pushed the Flux artifacts of 1 clusters"),
        "{out}"
    );
    let client = registry_client(
        &reference,
        RegistryOptions {
            plain_http: true,
            credentials: None,
        },
    );
    // The tag edge-flux still holds the bundle of the cluster edge-flux.
    let (bytes, digest) = client
        .get_manifest("edge-flux")
        .await
        .expect("reads")
        .expect("tagged");
    let manifest = BundleManifest::parse(&bytes, digest.as_str()).expect("a bundle");
    assert_eq!(manifest.cluster, "edge-flux");
    assert!(
        client
            .head_manifest("edge-flux-flux")
            .await
            .expect("reads")
            .is_some()
    );
}

/// `publish --oci` to a registry that speaks plain HTTP, without `--oci-plain-http`:
/// the error names a cluster whose bundle could not be pushed and says what to give.
/// A loopback server answering in plain HTTP stands in for the registry (no registry
/// is needed: the TLS handshake fails on its first answer).
#[test]
fn publish_to_a_plain_http_registry_without_the_flag_says_what_to_give() {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { continue };
            let mut buffer = [0u8; 1024];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let fleet = concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example");
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["publish", "--worktree", "--repo", fleet, "--oci"])
        .arg(format!("127.0.0.1:{port}/fleet/bundles"))
        .output()
        .expect("flotilla runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("give --oci-plain-http"), "{stderr}");
    assert!(
        !stderr.contains("bundle of  to"),
        "a cluster is named: {stderr}"
    );
    // Deltas are files of a static mirror: asked for with --oci, refused.
    let output = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "publish",
            "--worktree",
            "--repo",
            fleet,
            "--deltas",
            "2",
            "--oci",
        ])
        .arg(format!("127.0.0.1:{port}/fleet/bundles"))
        .output()
        .expect("flotilla runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("'--deltas <N>' cannot be used with '--oci"),
        "{stderr}"
    );
}
