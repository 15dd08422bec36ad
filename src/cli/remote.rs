//! The small HTTP client of the operator commands that talk to a running hub
//! (`flotilla rollout`, and `flotilla status`): where the hub is and which token to
//! send (`--server`, `--token-file`, or `FLOTILLA_SERVER`, `FLOTILLA_TOKEN_FILE`), how
//! to trust it and prove who calls over TLS (`--ca-file`, `--client-cert`,
//! `--client-key`, the agent's own TLS code), JSON in and out, and the hub's own
//! error messages passed on.
//!
//! With `--database` instead, the same questions are answered and the same actions
//! taken straight on the hub's database ([`Fleet::Database`]), with the hub's own
//! code: for an operator on the database's host, or when every hub is down.
//!
//! The agent has its own variables (`FLOTILLA_AGENT_*`), so an operator's shell never
//! points an agent elsewhere, nor the other way round.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use flotilla_agent::client::{Server, TlsOptions};
use flotilla_core::api;
use flotilla_hub::recorder::rollouts::{Action, ActionRefused, in_store};
use flotilla_hub::store::{Database, Store};

/// Where the fleet is read and steered: a running hub (`--server`, with an admin
/// token), or the hub's database itself (`--database`).
#[derive(Debug, Clone, Args)]
pub struct HubArgs {
    /// The hub's base URL (`https://hub.example.com:8443`).
    #[arg(
        long,
        env = "FLOTILLA_SERVER",
        value_name = "URL",
        conflicts_with = "database"
    )]
    pub server: Option<String>,
    /// A file holding an admin token (from `flotilla token create --admin`).
    #[arg(long, env = "FLOTILLA_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Where the hub keeps tokens, status and rollouts: sqlite:///path/to/file.db (a
    /// hub's default is flotilla.db in its state dir) or
    /// postgres://user:password@host:port/database, a server several hubs share.
    /// Read and steer the fleet there instead of asking a hub (--server): on the
    /// database's host, or when every hub is down. Without --server (or
    /// FLOTILLA_SERVER), FLOTILLA_DATABASE is read too: a shell that exports it for
    /// the hub can still ask a hub with --server.
    #[arg(long, value_name = "URL", value_parser = parse_database)]
    pub database: Option<Database>,
    /// With --database: how long an agent may stay silent before its cluster counts
    /// as offline (the hubs' `serve --offline-after`).
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub offline_after: humantime::Duration,
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

fn parse_database(url: &str) -> Result<Database, String> {
    url.parse()
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
    pub fn new(args: &HubArgs, server: &str) -> anyhow::Result<HubClient> {
        let base = server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server {base:?} must be an http:// or https:// URL");
        }
        let Some(token_file) = &args.token_file else {
            bail!(
                "--server needs --token-file (or FLOTILLA_TOKEN_FILE): a file holding an admin token"
            );
        };
        let token = match std::fs::read_to_string(token_file) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
                "--token-file {path} does not exist: make an admin token with `flotilla token \
                 create --admin > {path}` (where the hub keeps its --state-dir)",
                path = token_file.display()
            ),
            read => {
                read.with_context(|| format!("cannot read --token-file {}", token_file.display()))?
            }
        }
        .trim()
        .to_string();
        if token.is_empty() {
            bail!("--token-file {} is empty", token_file.display());
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

/// Where an operator command reads the fleet and steers rollouts: a running hub, or
/// the hub's database. Both answer with the hub API's JSON.
pub enum Fleet {
    Hub(HubClient),
    Database(DatabaseClient),
}

impl Fleet {
    /// `--server` or `--database`: one of them, never both (clap refuses that).
    pub fn new(args: &HubArgs) -> anyhow::Result<Fleet> {
        let from_env = match (&args.server, &args.database) {
            (None, None) => match std::env::var("FLOTILLA_DATABASE") {
                Ok(url) if !url.is_empty() => Some(
                    parse_database(&url)
                        .map_err(|err| anyhow::anyhow!("FLOTILLA_DATABASE: {err}"))?,
                ),
                _ => None,
            },
            _ => None,
        };
        match (&args.server, args.database.as_ref().or(from_env.as_ref())) {
            (Some(server), None) => Ok(Fleet::Hub(HubClient::new(args, server)?)),
            (None, Some(database)) => Ok(Fleet::Database(DatabaseClient::open(
                database,
                args.offline_after.into(),
            )?)),
            (Some(_), Some(_)) => bail!(
                "give --server (ask a running hub) or --database (read the hub's database), not both"
            ),
            (None, None) => bail!(
                "give --server URL (a running hub, with --token-file) or --database URL (the hub's \
                 database: sqlite:///STATE_DIR/flotilla.db or postgres://…); FLOTILLA_SERVER and \
                 FLOTILLA_DATABASE work too"
            ),
        }
    }

    /// `GET /v1/fleet`.
    pub fn fleet(&self) -> anyhow::Result<Value> {
        match self {
            Fleet::Hub(client) => client.get(api::routes::FLEET),
            Fleet::Database(db) => db.run(|store, offline| async move {
                let summary =
                    flotilla_hub::recorder::view::fleet_summary_from_store(store, offline).await?;
                Ok(serde_json::to_value(summary)?)
            }),
        }
    }

    /// `GET /v1/rollouts`.
    pub fn rollouts(&self) -> anyhow::Result<Value> {
        match self {
            Fleet::Hub(client) => client.get(api::routes::ROLLOUTS),
            Fleet::Database(db) => db.run(|store, offline| async move {
                let rollouts = in_store::list(store, offline).await?;
                Ok(json!({ "rollouts": rollouts }))
            }),
        }
    }

    /// `GET /v1/rollouts/{id}`.
    pub fn rollout(&self, id: u64) -> anyhow::Result<Value> {
        match self {
            Fleet::Hub(client) => client.get(&api::rollout(id)),
            Fleet::Database(db) => db.run(|store, offline| async move {
                match in_store::detail(store, rollout_id(id)?, offline).await? {
                    Some(view) => Ok(serde_json::to_value(view)?),
                    None => bail!("no rollout with id {id} (`flotilla rollout list` lists them)"),
                }
            }),
        }
    }

    /// `POST /v1/rollouts/{id}/{action}`.
    pub fn act(&self, id: u64, action: &str) -> anyhow::Result<Value> {
        match self {
            Fleet::Hub(client) => client.post(&api::rollout_action(id, action)),
            Fleet::Database(db) => db.run(|store, offline| async move {
                let Some(action_kind) = Action::parse(action) else {
                    bail!("no action {action:?}; the actions are pause, resume, promote and abort");
                };
                match in_store::action(store, rollout_id(id)?, action_kind, &operator(), offline)
                    .await
                {
                    Ok(view) => Ok(serde_json::to_value(view)?),
                    Err(ActionRefused::NotFound(_)) => {
                        bail!("no rollout with id {id} (`flotilla rollout list` lists them)")
                    }
                    Err(ActionRefused::Conflict(err)) => {
                        bail!("cannot {action} rollout {id}: {err}")
                    }
                    Err(ActionRefused::Hub(err)) => Err(err.into()),
                }
            }),
        }
    }
}

fn rollout_id(id: u64) -> anyhow::Result<i64> {
    i64::try_from(id).map_err(|_| anyhow::anyhow!("{id} is not a rollout id"))
}

/// Who acted, as the rollout's events record it: there is no token on this path, so
/// the operator's login name on the machine that wrote into the database.
fn operator() -> String {
    let user = ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .or_else(login_of_this_process)
        .unwrap_or_else(|| "unknown".to_string());
    format!("database:{user}")
}

/// The login name of this process's user when no variable gives it (under systemd or
/// in a container, `USER` is often unset): from `/etc/passwd`, else `uid N`.
fn login_of_this_process() -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    Some(login_in_passwd(&passwd, uid).unwrap_or_else(|| format!("uid {uid}")))
}

/// The name of `uid` in the text of an `/etc/passwd` file.
fn login_in_passwd(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        (fields.next()?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

/// The hub's database, opened by an operator command.
pub struct DatabaseClient {
    store: Store,
    offline_after: Duration,
    runtime: tokio::runtime::Runtime,
}

impl DatabaseClient {
    fn open(database: &Database, offline_after: Duration) -> anyhow::Result<DatabaseClient> {
        let shown = database.display(std::path::Path::new(""));
        if let Database::Sqlite(path) = database
            && !path.is_file()
        {
            // Opening would make a new, empty database there.
            bail!(
                "no database at {shown}: give the hub's --database (by default the file \
                 flotilla.db in its state dir, as sqlite:///STATE_DIR/flotilla.db)"
            );
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let store = runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(10), Store::open_tables(database)).await
            })
            .map_err(|_| anyhow::anyhow!("the database {shown} did not answer within 10s"))??;
        // Where the view comes from: a hub's own answer is not asked for.
        eprintln!("database: {shown} (read directly, not through a hub)");
        Ok(DatabaseClient {
            store,
            offline_after,
            runtime,
        })
    }

    fn run<'a, F, Fut>(&'a self, f: F) -> anyhow::Result<Value>
    where
        F: FnOnce(&'a Store, Duration) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Value>>,
    {
        self.runtime.block_on(f(&self.store, self.offline_after))
    }
}

impl Drop for DatabaseClient {
    fn drop(&mut self) {
        self.runtime.block_on(self.store.close());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_name_is_found_by_uid_in_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n# a comment\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        assert_eq!(login_in_passwd(passwd, 0).as_deref(), Some("root"));
        assert_eq!(login_in_passwd(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(login_in_passwd(passwd, 7), None);
    }
}
