//! The fake API server as a process of its own, for measuring the `flotilla-agent`
//! binary's kube sink from outside (benches/agent-footprint.sh): serves HTTPS on
//! 127.0.0.1 with a certificate authority made at start, writes a kubeconfig for it
//! (a bearer token, the CA, the `flotilla-system` namespace) to DIR/kubeconfig, prints
//! `ready URL` and serves until it is killed.
//!
//! ```text
//! cargo run --release -p flotilla-kube-fake --example fake_api_server -- DIR
//! ```

use std::path::PathBuf;

use flotilla_kube_fake::FakeApiServer;
use flotilla_testkit::TestCa;

const TOKEN: &str = "fake-api-server-token";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fake_api_server DIR (the kubeconfig is written to DIR/kubeconfig)");
        std::process::exit(2);
    };
    let ca = TestCa::new("fake API server CA");
    let leaf = ca.server(&["127.0.0.1"]);
    let fake = FakeApiServer::new().with_token(TOKEN);
    let server = fake
        .serve_https(&leaf.cert_pem, &leaf.key_pem)
        .await
        .expect("serves HTTPS on 127.0.0.1");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).expect("writes the CA");
    std::fs::write(
        dir.join("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
             users:\n- name: agent\n  user:\n    token: {TOKEN}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: agent\n    namespace: flotilla-system\n",
            url = server.url,
            ca = ca_file.display()
        ),
    )
    .expect("writes the kubeconfig");
    println!("ready {}", server.url);
    std::future::pending::<()>().await;
}
