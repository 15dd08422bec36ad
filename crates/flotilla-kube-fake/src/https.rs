//! The fake over HTTPS, for the real kube client (built from a kubeconfig) and the
//! `flotilla-agent` binary.

use std::net::TcpListener;

use axum::Router;
use axum::extract::State;
use axum::response::Response;

use crate::{Answer, FakeApiServer};

/// A running HTTPS front of a [`FakeApiServer`]; stops when dropped.
pub struct HttpsServer {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    handle: axum_server::Handle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        self.task.abort();
    }
}

impl FakeApiServer {
    /// Serves this fake over HTTPS on 127.0.0.1 with the given certificate (PEM),
    /// which must name `127.0.0.1`.
    pub async fn serve_https(&self, cert_pem: &str, key_pem: &str) -> std::io::Result<HttpsServer> {
        let config = axum_server::tls_rustls::RustlsConfig::from_pem(
            cert_pem.as_bytes().to_vec(),
            key_pem.as_bytes().to_vec(),
        )
        .await?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("https://{}", listener.local_addr()?);
        let handle = axum_server::Handle::new();
        let router = Router::new().fallback(serve).with_state(self.clone());
        let server = axum_server::from_tcp_rustls(listener, config).handle(handle.clone());
        let task = tokio::spawn(async move {
            let _ = server.serve(router.into_make_service()).await;
        });
        Ok(HttpsServer { url, handle, task })
    }
}

impl HttpsServer {
    /// Writes a kubeconfig for this server to `dir/kubeconfig`, with the CA that signed
    /// its certificate (written beside it as `dir/ca.pem`), a bearer token, and the
    /// namespace of its one context; returns the kubeconfig's path.
    pub fn write_kubeconfig(
        &self,
        dir: &std::path::Path,
        ca_pem: &str,
        token: &str,
        namespace: &str,
    ) -> std::io::Result<std::path::PathBuf> {
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca_pem)?;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters:\n- name: fake\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
                 users:\n- name: agent\n  user:\n    token: {token}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: agent\n    namespace: {namespace}\n",
                url = self.url,
                ca = ca_file.display()
            ),
        )?;
        Ok(kubeconfig)
    }
}

async fn serve(State(fake): State<FakeApiServer>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    let answer = fake.answer(&parts.method, &parts.uri, &parts.headers, &bytes);
    let (code, body) = match answer {
        Answer::Reply(code, body) => (code, body),
        Answer::Hang => std::future::pending().await,
        // A connection cut cannot be staged through the server framework; a proxy in
        // front of the API server would answer 502.
        Answer::Disconnect => (
            502,
            crate::status::other(502, "BadGateway", "connection reset").body,
        ),
    };
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(
            serde_json::to_vec(&body).unwrap_or_default(),
        ))
        .unwrap_or_default()
}
