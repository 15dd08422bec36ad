//! `flotilla serve`, `flotilla publish` and `flotilla token`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::{EXIT_FINDINGS, EXIT_OK, PublishArgs, ServeArgs, TokenArgs, TokenCommand};
use flotilla_hub::clock::{Clock, SystemClock, rfc3339};
use flotilla_hub::source;
use flotilla_hub::store::Store;
use flotilla_hub::{Hub, HubConfig, SourceSpec, auth, publish};
use flotilla_render::{RenderOptions, render_with};

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub fn run_serve(args: &ServeArgs) -> anyhow::Result<u8> {
    super::init_logging(args.log_format);
    if !source::follow::is_remote(&args.repo) && !Path::new(&args.repo).exists() {
        bail!(
            "--repo {}: no such folder or Git repository (give a local path or a URL such as https://…/fleet.git)",
            args.repo
        );
    }
    if args.branch.is_some()
        && !source::follow::is_remote(&args.repo)
        && source::follow::kind_of(Path::new(&args.repo))? == source::follow::RepoKind::Folder
    {
        bail!(
            "--branch needs a Git repository, and {} is a plain folder (served as its files are on disk)",
            args.repo
        );
    }
    let webhook_secret = match &args.webhook_secret_file {
        Some(path) => {
            let text = std::fs::read(path)
                .with_context(|| format!("cannot read --webhook-secret-file {}", path.display()))?;
            let secret = text.trim_ascii().to_vec();
            if secret.is_empty() {
                bail!("--webhook-secret-file {} is empty", path.display());
            }
            Some(secret)
        }
        None => None,
    };
    let mut config = HubConfig::new(
        &args.state_dir,
        SourceSpec {
            repo: args.repo.clone(),
            branch: args.branch.clone(),
            path: args.path.clone(),
        },
    );
    config.poll_interval = args.poll_interval.into();
    config.offline_after = args.offline_after.into();
    config.max_wait = args.max_wait.into();
    config.history = args.history;
    config.webhook_secret = webhook_secret;
    config.limits = args.limits.limits();
    let listen = args.listen;
    let tls = args.tls_cert.clone().zip(args.tls_key.clone());
    if !listen.ip().is_loopback() && tls.is_none() {
        tracing::warn!(
            %listen,
            "listening beyond loopback without TLS: tokens travel in clear text; give --tls-cert and --tls-key"
        );
    }
    let state_dir = args.state_dir.clone();
    let runtime = runtime()?;
    let result = runtime.block_on(async move {
        let hub = Hub::start(config).await.with_context(|| {
            format!("cannot start the hub with state in {}", state_dir.display())
        })?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let std_listener = std::net::TcpListener::bind(listen)
            .with_context(|| format!("cannot listen on {listen}"))?;
        let address = std_listener.local_addr().unwrap_or(listen);
        tracing::info!(
            "flotilla hub serving on {scheme}://{address} (state in {})",
            state_dir.display()
        );
        tokio::spawn(first_run_hint(
            state_dir.clone(),
            format!("{scheme}://{address}"),
        ));
        match tls {
            Some((cert, key)) => {
                hub.serve_tls(std_listener, &cert, &key, shutdown_signal())
                    .await?
            }
            None => {
                std_listener.set_nonblocking(true)?;
                let listener = tokio::net::TcpListener::from_std(std_listener)?;
                hub.serve(listener, shutdown_signal()).await?
            }
        }
        tracing::info!("flotilla hub stopped");
        Ok(EXIT_OK)
    });
    // Dropping the runtime would wait for every blocking task; a snapshot still being
    // read is not worth holding the exit for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down: releasing held long-polls");
}

/// On a first run (no tokens yet), says how to make one and fetch a bundle.
async fn first_run_hint(state_dir: PathBuf, base: String) {
    let Ok(store) = Store::open(&state_dir).await else {
        return;
    };
    if !store.tokens().await.map(|t| t.is_empty()).unwrap_or(false) {
        store.close().await;
        return;
    }
    // Wait for the first render so the hint can name a real cluster.
    let mut cluster = None;
    for _ in 0..100 {
        if let Ok(clusters) = store.clusters().await
            && let Some(first) = clusters.into_iter().next()
        {
            cluster = Some(first.name);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    store.close().await;
    let cluster = cluster.unwrap_or_else(|| "<cluster>".to_string());
    let state = state_dir.display();
    eprintln!(
        "\nNo tokens yet. In another terminal, make one for a cluster (the hub picks it up within a second):\n\n    \
         TOKEN=$(flotilla token create {cluster} --state-dir {state} | awk '{{print $NF}}')\n\n\
         then fetch that cluster's bundle (and again with its ETag, for a 304):\n\n    \
         curl -i -H \"Authorization: Bearer $TOKEN\" {base}/v1/clusters/{cluster}/bundle\n\n\
         (`cargo run --release -- token create …` from a checkout.) An admin token for {base}/v1/fleet: \
         flotilla token create --admin --state-dir {state}\n"
    );
}

pub fn run_publish(args: &PublishArgs) -> anyhow::Result<u8> {
    let limits = args.limits.limits();
    let snapshot =
        source::read_within(&args.source.location(), &limits).context("cannot read the fleet")?;
    let output = render_with(
        &snapshot,
        &RenderOptions {
            limits,
            ..RenderOptions::default()
        },
    );
    for diagnostic in output.warnings().chain(output.errors()) {
        eprintln!("{diagnostic}");
    }
    if !output.is_clean() {
        eprintln!(
            "the fleet does not render ({} errors); nothing was published",
            output.errors().count()
        );
        return Ok(EXIT_FINDINGS);
    }
    let published = publish::publish(&output, &args.out)?;
    println!(
        "published {} clusters at {} into {} ({} written, {} unchanged{})",
        published.clusters,
        output.revision,
        args.out.display(),
        published.written,
        published.unchanged,
        if published.removed.is_empty() {
            String::new()
        } else {
            format!(", removed {}", published.removed.join(", "))
        }
    );
    Ok(EXIT_OK)
}

pub fn run_token(args: &TokenArgs) -> anyhow::Result<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let state_dir = match &args.command {
            TokenCommand::Create { state_dir, .. }
            | TokenCommand::Revoke { state_dir, .. }
            | TokenCommand::List { state_dir } => state_dir,
        };
        let store = Store::open(state_dir)
            .await
            .with_context(|| format!("cannot open the store in {}", state_dir.display()))?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let result = token_command(&store, &args.command, clock.now_ms()).await;
        store.close().await;
        result
    })
}

async fn token_command(store: &Store, command: &TokenCommand, now_ms: i64) -> anyhow::Result<u8> {
    match command {
        TokenCommand::Create { cluster, admin, .. } => {
            let cluster = match (cluster, admin) {
                (Some(_), true) => bail!("give a cluster name or --admin, not both"),
                (None, false) => bail!("give the cluster the token is for, or --admin"),
                (Some(name), false) => {
                    check_cluster_name(name)?;
                    let known = store.clusters().await?;
                    if !known.is_empty() && !known.iter().any(|c| &c.name == name) {
                        eprintln!(
                            "warning: the hub serves no cluster named {name:?} yet; the token works once it does"
                        );
                    }
                    Some(name.as_str())
                }
                (None, true) => None,
            };
            let token = auth::new_token(cluster, now_ms);
            store.insert_token(&token.stored).await?;
            let scope = match cluster {
                Some(name) => format!("for cluster {name}"),
                None => "with admin rights".to_string(),
            };
            println!(
                "created token {} {scope} (shown once; only its hash is stored): {}",
                token.stored.id, token.secret
            );
        }
        TokenCommand::Revoke { id, .. } => {
            let id = if id.starts_with(auth::TOKEN_PREFIX) {
                auth::token_id(id)
            } else {
                id.clone()
            };
            let token = store.revoke_token(&id, now_ms).await?;
            println!(
                "revoked token {} (a running hub stops accepting it within a second)",
                token.id
            );
        }
        TokenCommand::List { .. } => {
            let tokens = store.tokens().await?;
            if tokens.is_empty() {
                println!(
                    "no tokens; make one with `flotilla token create CLUSTER --state-dir DIR`"
                );
            }
            for token in tokens {
                let scope = match (&token.cluster, token.admin) {
                    (_, true) => "admin".to_string(),
                    (Some(cluster), false) => format!("cluster {cluster}"),
                    (None, false) => "nothing".to_string(),
                };
                let state = match token.revoked_at_ms {
                    Some(at) => format!("revoked {}", rfc3339(at)),
                    None => "active".to_string(),
                };
                println!(
                    "{}  {scope:<30}  created {}  {state}",
                    token.id,
                    rfc3339(token.created_at_ms)
                );
            }
        }
    }
    Ok(EXIT_OK)
}

fn check_cluster_name(name: &str) -> anyhow::Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !valid {
        bail!("{name:?} is not a cluster name (lowercase letters, digits, '-' and '.')");
    }
    Ok(())
}

/// Parses `--listen`.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not an address:port such as 127.0.0.1:8080"))
}
