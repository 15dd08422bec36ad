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
    server
        .write_kubeconfig(&dir, &ca.cert_pem(), TOKEN, "flotilla-system")
        .expect("writes the kubeconfig");
    println!("ready {}", server.url);
    std::future::pending::<()>().await;
}
