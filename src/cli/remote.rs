//! The small HTTP client of the operator commands that talk to a running hub
//! (`flotilla rollout`, and `flotilla status`): where the hub is and which token to
//! send (`--server`, `--token-file`, or `FLOTILLA_SERVER`, `FLOTILLA_TOKEN_FILE`), how
//! to trust it and prove who calls over TLS (`--ca-file`, `--client-cert`,
//! `--client-key`, the agent's own TLS code), JSON in and out, and the hub's own
//! error messages passed on.
//!
//! The agent has its own variables (`FLOTILLA_AGENT_*`), so an operator's shell never
//! points an agent elsewhere, nor the other way round.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use serde::de::DeserializeOwned;

use flotilla_agent::client::{Server, TlsOptions};

/// Where the hub is, and how to prove the right to ask it.
#[derive(Debug, Clone, Args)]
pub struct HubArgs {
    /// The hub's base URL (`https://hub.example.com:8443`).
    #[arg(long, env = "FLOTILLA_SERVER", value_name = "URL")]
    pub server: String,
    /// A file holding an admin token (from `flotilla token create --admin`).
    #[arg(long, env = "FLOTILLA_TOKEN_FILE", value_name = "FILE")]
    pub token_file: PathBuf,
    /// PEM CA certificates to trust for an HTTPS hub, besides the system's (a hub
    /// with a certificate from a private CA).
    #[arg(long, alias = "ca-cert", env = "FLOTILLA_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM) signed by the hub's `--client-ca`, for a hub that
    /// requires one; any certificate of that CA will do, with an admin token.
    #[arg(
        long,
        env = "FLOTILLA_CLIENT_CERT",
        value_name = "PEM",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(
        long,
        env = "FLOTILLA_CLIENT_KEY",
        value_name = "PEM",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
    /// How to print the answer.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// How operator commands print.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// For people.
    Table,
    /// The hub's JSON, as documented in docs/api.md.
    Json,
}

/// A client for one hub and one token. Blocking: each call runs on a small runtime of
/// its own, as the command line does one thing at a time.
pub struct HubClient {
    base: String,
    token: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl HubClient {
    pub fn new(args: &HubArgs) -> anyhow::Result<HubClient> {
        let base = args.server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server {base:?} must be an http:// or https:// URL");
        }
        let token = std::fs::read_to_string(&args.token_file)
            .with_context(|| format!("cannot read --token-file {}", args.token_file.display()))?
            .trim()
            .to_string();
        if token.is_empty() {
            bail!("--token-file {} is empty", args.token_file.display());
        }
        let tls = TlsOptions {
            ca_file: args.ca_file.clone(),
            client_cert: args.client_cert.clone().zip(args.client_key.clone()),
        };
        tls.check(&Server::parse(&base)?)?;
        let builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60));
        let http = tls
            .apply(builder)?
            .build()
            .context("cannot set up the HTTP client")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        Ok(HubClient {
            base,
            token,
            http,
            runtime,
        })
    }

    /// `GET path`, answered with JSON.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.call(reqwest::Method::GET, path)
    }

    /// `POST path` (no body), answered with JSON.
    pub fn post<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.call(reqwest::Method::POST, path)
    }

    fn call<T: DeserializeOwned>(&self, method: reqwest::Method, path: &str) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base);
        self.runtime.block_on(async {
            let response = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.token)
                .send()
                .await
                .with_context(|| format!("cannot reach the hub at {}", self.base))?;
            let status = response.status();
            let body = response
                .bytes()
                .await
                .with_context(|| format!("the hub's answer to {method} {path} broke off"))?;
            if !status.is_success() {
                let message = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v.get("error")?.as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
                bail!("the hub refused {method} {path} ({status}): {message}");
            }
            serde_json::from_slice(&body).with_context(|| {
                format!("the hub's answer to {method} {path} is not what this version of flotilla expects")
            })
        })
    }
}
