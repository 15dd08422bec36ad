//! The real kube client, built from a kubeconfig, over HTTPS to the fake API server
//! with a certificate authority made for the test: in process, and as the
//! `flotilla-agent` binary (which once panicked at start on every cluster, because
//! two rustls crypto providers were compiled in and none was chosen).

use crate::support as agent_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_support::kube::{AGENT_NAMESPACE, kube_config_map, kube_namespace};
use agent_support::{bundle, publish, stored_status};
use flotilla_agent::sink::Sink;
use flotilla_agent::sink::kube::{KubeOptions, KubeSink};
use flotilla_kube_fake::{FakeApiServer, HttpsServer};
use flotilla_testkit::TestCa;

const TOKEN: &str = "agent-token-for-the-test";

/// A fake API server behind HTTPS that wants a bearer token, and a kubeconfig for it.
async fn serve(dir: &Path) -> (FakeApiServer, HttpsServer, PathBuf) {
    let ca = TestCa::new("fake API server CA");
    let leaf = ca.server(&["127.0.0.1"]);
    let fake = FakeApiServer::new().with_token(TOKEN);
    let server = fake
        .serve_https(&leaf.cert_pem, &leaf.key_pem)
        .await
        .expect("serves HTTPS");
    let kubeconfig = server
        .write_kubeconfig(dir, &ca.cert_pem(), TOKEN, AGENT_NAMESPACE)
        .expect("writes the kubeconfig");
    (fake, server, kubeconfig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_kube_client_applies_over_https_with_a_kubeconfig() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (fake, _server, kubeconfig) = serve(dir.path()).await;
    let kubeconfig =
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("reads the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("a config");
    let client = kube::Client::try_from(config).expect("a client");
    let mut sink = KubeSink::with_client(client, KubeOptions::default());
    let bundle = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            kube_config_map("demo", "settings", "1"),
        ],
    );
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    let applied = fake
        .get("v1", "ConfigMap", "demo", "settings")
        .expect("applied over HTTPS");
    assert_eq!(
        applied["metadata"]["labels"]["flotilla.dev/cluster"],
        "edge-1"
    );
    // The ledger went to the kubeconfig context's namespace.
    assert!(
        fake.get(
            "v1",
            "ConfigMap",
            AGENT_NAMESPACE,
            "flotilla-inventory-edge-1"
        )
        .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flotilla_agent_binary_applies_through_a_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (fake, _server, kubeconfig) = serve(dir.path()).await;
    let publish_dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("tempdir");
    let bundle = bundle(
        "edge-1",
        vec![
            kube_namespace("demo"),
            kube_config_map("demo", "settings", "1"),
        ],
    );
    publish(publish_dir.path(), &bundle);
    let log = dir.path().join("agent.log");
    // FLOTILLA_AGENT_BINARY runs another build of the same binary, the release one say:
    // FLOTILLA_AGENT_BINARY=$PWD/target/release/flotilla-agent cargo test -p flotilla-agent --test it kube_https
    let binary = std::env::var_os("FLOTILLA_AGENT_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_flotilla-agent")));
    eprintln!("running {}", binary.display());
    let mut agent = Command::new(&binary)
        .args([
            "--cluster",
            "edge-1",
            "--sink",
            "kube",
            "--wait",
            "200ms",
            "--resync",
            "0",
        ])
        .arg("--server")
        .arg(format!("file://{}", publish_dir.path().display()))
        .arg("--state-dir")
        .arg(state.path())
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log file"))
        .spawn()
        .expect("the agent binary starts");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    let started = Instant::now();
    let applied = loop {
        let status = stored_status(state.path());
        let applied = status
            .as_ref()
            .and_then(|s| s["report"]["applied"].as_str().map(str::to_string));
        if applied.as_deref() == Some(bundle.digest.as_str()) {
            break true;
        }
        if let Ok(Some(status)) = agent.try_wait() {
            panic!("the agent exited with {status}:\n{}", log_text());
        }
        if started.elapsed() > Duration::from_secs(60) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        applied,
        "the bundle was not applied in time:\n{}",
        log_text()
    );
    assert!(fake.get("v1", "ConfigMap", "demo", "settings").is_some());

    let terminated = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(terminated.success());
    let stopped_at = Instant::now();
    let exit = loop {
        if let Some(status) = agent.try_wait().expect("polls") {
            break status;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(20),
            "the agent did not stop on SIGTERM:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "{exit}:\n{}", log_text());
    assert!(!log_text().contains("panicked"), "{}", log_text());
}
