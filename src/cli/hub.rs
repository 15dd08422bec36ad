//! `flotilla serve`, `flotilla publish` and `flotilla token`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};

use super::{
    EXIT_FINDINGS, EXIT_OK, OciArgs, PublishArgs, PublishFormat, ServeArgs, StoreArgs, TokenArgs,
    TokenCommand,
};
use flotilla_core::access::Role;
use flotilla_hub::clock::{Clock, SystemClock, rfc3339};
use flotilla_hub::source;
use flotilla_hub::store::{Bucket, Database, ObjectsUrl, Store};
use flotilla_hub::{ConnectionLimits, Hub, HubConfig, SourceSpec, TlsFiles, auth, publish};
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
        let hint = match source::similar_folder(Path::new(&args.repo)) {
            Some(found) => format!("did you mean {}?", found.display()),
            None => "give a local path or a URL such as https://…/fleet.git".to_string(),
        };
        bail!(
            "--repo {}: no such folder or Git repository ({hint})",
            args.repo
        );
    }
    if !source::follow::is_remote(&args.repo) {
        let local = source::follow::local_source(Path::new(&args.repo), &args.path, args.worktree)?;
        if local.kind == source::follow::RepoKind::Folder && !args.worktree {
            if args.branch.is_some() {
                bail!(
                    "--branch needs a Git repository, and {} is in none (a plain folder is served as its files are on disk)",
                    args.repo
                );
            }
        } else if args.branch.is_none() {
            let location = source::Location {
                repo: PathBuf::from(&args.repo),
                rev: None,
                path: args.path.clone(),
                worktree: args.worktree,
            };
            let hint = format!(
                "to serve the files on disk: {}",
                super::source::command_line(
                    "serve",
                    &[],
                    Path::new(&args.repo),
                    &args.path,
                    "--worktree"
                )
            );
            super::source::warn_if_disk_differs(&location, &hint);
        }
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
            worktree: args.worktree,
        },
    );
    config.database = args.database.database();
    config.objects = args.s3_sse.apply(args.objects.clone())?.unwrap_or_default();
    config.poll_interval = args.poll_interval.into();
    config.offline_after = args.offline_after.into();
    config.max_wait = args.max_wait.into();
    if config.max_wait >= config.offline_after {
        tracing::warn!(
            max_wait = %args.max_wait,
            offline_after = %args.offline_after,
            "--max-wait is not shorter than --offline-after: a cluster whose poll is held that long counts as offline until it is answered"
        );
    }
    config.history = args.history;
    config.keep_rollouts = args.keep_rollouts.into();
    config.webhook_secret = webhook_secret;
    config.limits = args.limits.limits();
    config.keep_render = args.keep_render;
    if !args.render_in_process {
        config.render_worker = Some(flotilla_hub::render_worker::RenderWorker {
            program: std::env::current_exe()
                .context("cannot find the flotilla binary to render with")?,
            memory_limit: (args.limits.render_memory > 0).then_some(args.limits.render_memory),
        });
    }
    if args.header_timeout.as_secs() < 1 || args.idle_timeout.as_secs() < 1 {
        bail!("--header-timeout and --idle-timeout must be at least 1s");
    }
    if args.max_connections == Some(0) {
        bail!("--max-connections must be at least 1");
    }
    config.connections = ConnectionLimits {
        header_timeout: args.header_timeout.into(),
        idle_timeout: args.idle_timeout.into(),
        max_connections: args.max_connections,
    };
    if args.webhook_body_timeout.as_secs() < 1 {
        bail!("--webhook-body-timeout must be at least 1s");
    }
    if args.max_webhook_bodies == 0 || args.max_polls_per_cluster == 0 {
        bail!("--max-webhook-bodies and --max-polls-per-cluster must be at least 1");
    }
    config.requests = flotilla_hub::RequestLimits {
        webhook_body_timeout: args.webhook_body_timeout.into(),
        max_webhook_bodies: args.max_webhook_bodies,
        max_polls_per_cluster: args.max_polls_per_cluster,
    };
    match flotilla_hub::listen::raise_open_file_limit() {
        Ok(files) => tracing::info!(
            soft = files.soft,
            hard = files.hard,
            was = files.before,
            max_connections = args
                .max_connections
                .unwrap_or_else(|| flotilla_hub::listen::connection_cap(files.soft)),
            "open-file limit"
        ),
        Err(err) => tracing::warn!(
            soft = flotilla_hub::listen::open_file_limit(),
            "cannot raise the open-file limit: {err}"
        ),
    }
    config.decryption = args.decryption.hub()?;
    if !config.decryption.is_empty() {
        tracing::info!(
            recipients = config.decryption.recipients().join(","),
            "opening SOPS files with the given age identities"
        );
    }
    if let Some(path) = &args.signing_key {
        let key = super::key::read_signing_key(path)?;
        tracing::info!(key_id = key.key_id(), "signing every served bundle");
        config.signing_key = Some(Arc::new(key));
    }
    if let Some(reference) = &args.oci {
        let registry = oci_registry(reference, &args.oci_access)?;
        tracing::info!(registry = %registry.repository(), "pushing what is served to the registry on every change");
        config.oci = Some(registry);
    }
    let listen = args.listen;
    let tls = args
        .tls_cert
        .clone()
        .zip(args.tls_key.clone())
        .map(|(cert, key)| TlsFiles {
            cert,
            key,
            client_ca: args.client_ca.clone(),
        });
    if !listen.ip().is_loopback() && tls.is_none() {
        tracing::warn!(
            %listen,
            "listening beyond loopback without TLS: tokens travel in clear text; give --tls-cert and --tls-key"
        );
    }
    let state_dir = args.state_dir.clone();
    let database = config.database.clone();
    let shown_database = database.display(&state_dir);
    let shown_objects = config.objects.display(&state_dir);
    let runtime = runtime()?;
    let result = runtime.block_on(async move {
        let hub = Hub::start(config).await.with_context(|| {
            format!(
                "cannot start the hub with state in {}, database {shown_database} and objects in {shown_objects}",
                state_dir.display()
            )
        })?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let std_listener = flotilla_hub::listen::bind(listen)
            .with_context(|| format!("cannot listen on {listen}"))?;
        let address = std_listener.local_addr().unwrap_or(listen);
        tracing::info!(
            "flotilla hub serving on {scheme}://{address} (state in {}, database {shown_database}, objects in {shown_objects})",
            state_dir.display()
        );
        tokio::spawn(first_run_hint(
            state_dir.clone(),
            database,
            format!("{scheme}://{address}"),
        ));
        match tls {
            Some(files) => {
                hub.serve_tls(std_listener, &files, shutdown_signal())
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
async fn first_run_hint(state_dir: PathBuf, database: Database, base: String) {
    let Ok(store) = Store::open_with(&state_dir, &database).await else {
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
         flotilla token create {cluster} --state-dir {state} > {cluster}.token\n\n\
         then fetch that cluster's bundle (and again with its ETag, for a 304):\n\n    \
         curl -i -H \"Authorization: Bearer $(cat {cluster}.token)\" {base}/v1/clusters/{cluster}/bundle\n\n\
         and run an agent for it that writes into ./out:\n\n    \
         flotilla agent --server {base} --cluster {cluster} --token-file {cluster}.token --state-dir agent-state --sink dir:./out\n\n\
         (From a checkout, `cargo run -q --` stands for `flotilla`.) An admin token for {base}/v1/fleet: \
         flotilla token create --admin --state-dir {state}\n"
    );
}

pub fn run_publish(args: &PublishArgs) -> anyhow::Result<u8> {
    let signer = args
        .signing_key
        .as_deref()
        .map(super::key::read_signing_key)
        .transpose()?;
    // A registry reference or flag that cannot work is refused before the render.
    let registry = args
        .oci
        .as_deref()
        .map(|reference| oci_registry(reference, &args.oci_access))
        .transpose()?;
    let flux = args.format == PublishFormat::Flux;
    if flux && args.state_dir.is_some() {
        bail!(
            "--format flux cannot go with --state-dir: what the hub serves has its Secrets sealed for flotilla's agent, \
             which Flux cannot open; publish the Flux artifacts from HEAD, without --state-dir (with --decryption-key)"
        );
    }
    if args.flux_source.is_some() && !flux {
        bail!("--flux-source names the source of Flux artifacts: give it with --format flux");
    }
    // The source is written into every Flux manifest, which anyone who may pull reads.
    if let Some(source) = &args.flux_source
        && reqwest::Url::parse(source)
            .is_ok_and(|url| !url.username().is_empty() || url.password().is_some())
    {
        bail!(
            "--flux-source holds credentials (user:password@), which would be written into every Flux manifest; give the URL without them"
        );
    }
    let decryption = args.decryption.hub()?;
    let limits = args.limits.limits();
    let snapshot = super::source::read(&args.source, "publish", &limits)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Helm charts' generated values come from the hub's seed, kept in its store.
    let helm_seed = match &args.state_dir {
        Some(state_dir) => Some(runtime.block_on(async {
            let database = args.database.clone().unwrap_or(Database::StateDir);
            let store = Store::open_with(state_dir, &database).await?;
            let seed = store.helm_seed().await;
            store.close().await;
            anyhow::Ok(seed?)
        })?),
        None => None,
    };
    let capped = super::memory::cap(args.limits.render_memory)?;
    // Agents' sealing headers the hub kept (read only: the hub writes that file).
    if let Some(state_dir) = &args.state_dir
        && let Err(err) = flotilla_hub::render_worker::KeptHeaders::in_state_dir(state_dir).offer()
    {
        eprintln!("warning: {err}; the agents' headers are worked out again");
    }
    let output = render_with(
        &snapshot,
        &RenderOptions {
            limits,
            helm_seed,
            sops: flotilla_render::sops::SopsKeys::Open(decryption.clone()),
            ..RenderOptions::default()
        },
    );
    // What is written and pushed after the render is not capped.
    drop(capped);
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
    if output.generated_from_public_seed {
        eprintln!(
            "a Helm chart generated values (passwords, keys) from the public seed, which anyone can compute; \
             nothing was published: give the hub's --state-dir (or --database) so they come from its secret seed, \
             or set those values in the chart's values"
        );
        return Ok(EXIT_FINDINGS);
    }
    // With --format flux (never with --state-dir, so without the hub's seed), the
    // clusters whose bundle would carry plain Secrets to an agent that expects them
    // sealed get their Flux artifact only.
    let unsealed: std::collections::BTreeSet<String> = if flux {
        output
            .agent_keys
            .keys()
            .filter(|cluster| {
                output
                    .bundles
                    .get(*cluster)
                    .is_some_and(flotilla_render::formats::holds_plain_secrets)
            })
            .cloned()
            .collect()
    } else {
        Default::default()
    };
    if output.unsealed_for_agent_keys && !flux {
        eprintln!(
            "clusters name their agent's key (spec.agentKey), but their Secrets are sealed with the hub's secret seed, which only its store holds; \
             nothing was published: give the hub's --state-dir (or --database)"
        );
        return Ok(EXIT_FINDINGS);
    }
    let objects = args.s3_sse.apply(args.objects.clone())?;
    // --oci excludes --out and --objects.
    let site = if let Some(registry) = registry {
        publish::Site::Oci(registry)
    } else {
        match (&args.out, &objects) {
            (Some(out), _) => publish::Site::Dir(out.clone()),
            (None, Some(ObjectsUrl::Dir(path))) => publish::Site::Dir(path.clone()),
            (None, Some(ObjectsUrl::S3(location))) => runtime.block_on(async {
                let bucket = Bucket::from_env(location)?;
                bucket.probe().await?;
                anyhow::Ok(publish::Site::Bucket(bucket))
            })?,
            (None, Some(ObjectsUrl::StateDir) | None) => bail!("give --out DIR or --objects URL"),
        }
    };
    let writing = publish::Writing {
        signer: signer.as_ref(),
        deltas: args.deltas,
    };
    let published = match &args.state_dir {
        Some(state_dir) => {
            let hub_objects = args.hub_objects.clone().unwrap_or_default();
            let (served, revision, objects) = runtime.block_on(async {
                let database = args.database.clone().unwrap_or(Database::StateDir);
                let store = Store::open_with_objects(state_dir, &database, &hub_objects)
                    .await
                    .with_context(|| {
                        format!(
                            "cannot open the hub's store in {} (database {}, objects in {})",
                            state_dir.display(),
                            database.display(state_dir),
                            hub_objects.display(state_dir)
                        )
                    })?;
                let served = store.clusters().await;
                let revision = store.revision().await;
                let objects = store.objects.clone();
                store.close().await;
                anyhow::Ok((served?, revision?, objects))
            })?;
            if revision.as_deref() != Some(output.revision.as_str()) {
                eprintln!(
                    "note: the hub has recorded {} and HEAD is {}; publishing what the hub serves",
                    revision.as_deref().unwrap_or("nothing yet"),
                    output.revision
                );
            }
            runtime.block_on(publish::publish_served(
                &output, &served, &objects, &site, writing,
            ))?
        }
        None => {
            if !output.rollouts.policies.is_empty() {
                eprintln!(
                    "warning: publishing without --state-dir bypasses rollouts: every cluster gets HEAD's render at once; \
                     give the hub's --state-dir to publish what it serves each cluster"
                );
            }
            runtime.block_on(publish::publish_to_except(
                &output, &site, writing, &unsealed,
            ))?
        }
    };
    for warning in &published.warnings {
        eprintln!("warning: {warning}");
    }
    println!(
        "published {} clusters at {} into {} ({} written, {} unchanged{}{})",
        published.clusters,
        output.revision,
        site.display(),
        published.written,
        published.unchanged,
        if published.removed.is_empty() {
            String::new()
        } else {
            format!(", removed {}", published.removed.join(", "))
        },
        if matches!(site, publish::Site::Oci(_)) {
            format!(", {} blobs uploaded", published.uploaded_blobs)
        } else {
            String::new()
        }
    );
    let mut partial = false;
    for cluster in &unsealed {
        eprintln!(
            "cluster {cluster}: its bundle was not pushed: it names an agentKey and holds Secrets, which only the hub's seed can seal for its agent \
             (publish its bundle with --state-dir, without --format flux)"
        );
        partial = true;
    }
    if let (true, publish::Site::Oci(registry)) = (flux, &site) {
        partial |= push_flux_artifacts(&output, registry, &decryption, args, &runtime)?;
    }
    Ok(if partial { EXIT_FINDINGS } else { EXIT_OK })
}

/// `publish --oci … --format flux`: each cluster's Flux artifact; whether a cluster
/// was refused (each is printed).
fn push_flux_artifacts(
    output: &flotilla_render::RenderOutput,
    registry: &flotilla_oci::Registry,
    decryption: &flotilla_render::sops::DecryptionKeys,
    args: &PublishArgs,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<bool> {
    use flotilla_render::formats::flux;
    // The SOPS seed derives from the operator's decryption identity, so an unchanged
    // Secret keeps its document and its cluster's tag; without one, a fresh seed.
    let sops = match flux::sops_seed(decryption) {
        Some(seed) => flotilla_render::sops::SopsWriter::new(seed, flux::STABLE_TIME),
        None => {
            if output.bundles.iter().any(|(cluster, bundle)| {
                output.agent_keys.contains_key(cluster)
                    && flotilla_render::formats::holds_plain_secrets(bundle)
            }) {
                eprintln!(
                    "note: without --decryption-key the Secrets' SOPS documents are encrypted afresh, \
                     so the Flux artifacts of clusters with Secrets change on every publish"
                );
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            flotilla_render::sops::SopsWriter::new(rand::random(), now)
        }
    };
    let published = runtime.block_on(publish::publish_flux(
        output,
        registry,
        &sops,
        args.flux_source.as_deref(),
    ))?;
    for refusal in &published.refused {
        eprintln!("{refusal}");
    }
    println!(
        "pushed the Flux artifacts of {} clusters at {} into oci://{} as <cluster>{} ({} written, {} unchanged, {} blobs uploaded)",
        published.clusters,
        output.revision,
        registry.repository(),
        publish::FLUX_TAG_SUFFIX,
        published.written,
        published.unchanged,
        published.uploaded_blobs
    );
    if !published.refused.is_empty() {
        eprintln!(
            "{} {} no Flux artifact; the others were pushed",
            published.refused.len(),
            if published.refused.len() == 1 {
                "cluster has"
            } else {
                "clusters have"
            }
        );
    }
    Ok(!published.refused.is_empty())
}

/// The registry client of `publish --oci`: credentials from the flags or the Docker
/// configuration file, TLS with the system's store and --ca-file.
fn oci_registry(reference: &str, args: &OciArgs) -> anyhow::Result<flotilla_oci::Registry> {
    let repository = flotilla_oci::Repository::parse(reference)?;
    let credentials = match (&args.oci_username, &args.oci_password_file) {
        (Some(username), Some(file)) => {
            let password = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read --oci-password-file {}", file.display()))?;
            Some(flotilla_oci::Credentials {
                username: username.clone(),
                password: password.trim_end_matches(['\r', '\n']).to_string(),
            })
        }
        _ => match flotilla_oci::docker_config_path() {
            Some(path) => {
                flotilla_oci::Credentials::from_docker_config(&path, &repository.registry)?
            }
            None => None,
        },
    };
    let tls = flotilla_agent::client::TlsOptions {
        ca_file: args.ca_file.clone(),
        client_cert: None,
    };
    let http = tls
        .apply(
            reqwest::Client::builder()
                .user_agent(concat!("flotilla/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(std::time::Duration::from_secs(15)),
        )?
        .build()
        .context("cannot build the HTTP client")?;
    Ok(flotilla_oci::Registry::new(
        repository,
        http,
        flotilla_oci::RegistryOptions {
            plain_http: args.oci_plain_http,
            credentials,
        },
    )?)
}

pub fn run_token(args: &TokenArgs) -> anyhow::Result<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let store_args = match &args.command {
            TokenCommand::Create { store, .. }
            | TokenCommand::Revoke { store, .. }
            | TokenCommand::List { store } => store,
        };
        let store = open_token_store(store_args).await?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let result = token_command(&store, &args.command, clock.now_ms()).await;
        store.close().await;
        result
    })
}

/// Opens the hub's store for a `token` command, and says on stderr which one. A
/// state dir that does not exist is refused unless `--init` is given: a token made
/// in a new, empty store (a mistyped path, the wrong folder) is one the running hub
/// never accepts. An existing empty folder may be initialised.
async fn open_token_store(args: &StoreArgs) -> anyhow::Result<Store> {
    let dir = &args.state_dir;
    let database = args.database.database();
    if database != Database::StateDir {
        // The tokens are in that database, whatever the local state dir holds.
        let shown = database.display(dir);
        let store = Store::open_tables(&database)
            .await
            .with_context(|| format!("cannot open the database {shown}"))?;
        eprintln!("store: {shown}");
        return Ok(store);
    }
    let database = dir.join(flotilla_hub::store::DATABASE_FILE);
    let fresh = match std::fs::read_dir(dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            if !args.init {
                bail!(
                    "the state dir {} does not exist: give the --state-dir the hub uses \
                     (`flotilla serve` creates it at its first start), or add --init to create a new one",
                    dir.display()
                );
            }
            true
        }
        Err(err) => {
            return Err(err)
                .with_context(|| format!("cannot read the state dir {}", dir.display()));
        }
        Ok(mut entries) if !database.exists() => {
            if entries.next().is_some() {
                bail!(
                    "{} is not a flotilla state dir: it holds files but no {}; give the --state-dir the hub uses",
                    dir.display(),
                    flotilla_hub::store::DATABASE_FILE
                );
            }
            true
        }
        Ok(_) => false,
    };
    let store = Store::open(dir)
        .await
        .with_context(|| format!("cannot open the store in {}", dir.display()))?;
    let shown = database.canonicalize().unwrap_or(database);
    if fresh {
        eprintln!("initialised a new store: {}", shown.display());
    } else {
        eprintln!("store: {}", shown.display());
    }
    Ok(store)
}

/// Whether the bundle served to some cluster holds a workload of `tenant` (its
/// `meta.tenants` names it); `None` while the store serves no cluster. Each distinct
/// bundle is read once, and only its metadata parsed.
async fn tenant_served(store: &Store, tenant: &str) -> anyhow::Result<Option<bool>> {
    #[derive(serde::Deserialize)]
    struct MetaOnly {
        meta: flotilla_core::bundle::BundleMeta,
    }
    let clusters = store.clusters().await?;
    if clusters.is_empty() {
        return Ok(None);
    }
    let digests: std::collections::BTreeSet<_> = clusters.into_iter().map(|c| c.digest).collect();
    for digest in digests {
        // A bundle without metadata (`[…]`) or unreadable names no tenant.
        let Ok(body) = store.objects.read(&digest).await else {
            continue;
        };
        if body.first() == Some(&b'{')
            && let Ok(parsed) = serde_json::from_slice::<MetaOnly>(&body)
            && parsed.meta.tenants.contains_key(tenant)
        {
            return Ok(Some(true));
        }
    }
    Ok(Some(false))
}

async fn token_command(store: &Store, command: &TokenCommand, now_ms: i64) -> anyhow::Result<u8> {
    match command {
        TokenCommand::Create {
            cluster,
            role,
            tenant,
            admin,
            ..
        } => {
            let role = match (role, admin) {
                (Some(role), true) if *role != Role::Admin => {
                    bail!("--admin is --role admin; give one role, not --admin and --role {role}")
                }
                (_, true) => Some(Role::Admin),
                (role, false) => *role,
            };
            let token = match (cluster, role) {
                (Some(_), Some(_)) => bail!(
                    "a cluster's token is its agent's and has no role: give a cluster name, or --role for a person's token, not both"
                ),
                (None, None) => bail!(
                    "give the cluster the token is for, or --role viewer|operator|admin for a person's token"
                ),
                (Some(name), None) => {
                    check_cluster_name(name)?;
                    let known = store.clusters().await?;
                    if !known.is_empty() && !known.iter().any(|c| &c.name == name) {
                        eprintln!(
                            "warning: the hub serves no cluster named {name:?} yet; the token works once it does"
                        );
                    }
                    auth::new_token(Some(name), now_ms)
                }
                (None, Some(role)) => {
                    let token = auth::new_person_token(role, tenant.as_deref(), now_ms)?;
                    if let Some(tenant) = tenant
                        && tenant_served(store, tenant).await? == Some(false)
                    {
                        eprintln!(
                            "warning: no cluster's bundle holds a workload of tenant {tenant:?} yet (a `kind: Tenant` file tenants/{tenant}.yaml whose workloads target clusters); the token sees nothing until one does"
                        );
                    }
                    token
                }
            };
            store.insert_token(&token.stored).await?;
            let scope = scope_of(&token.stored);
            // Only the token goes to stdout, so `> FILE` and `$(…)` keep just the token.
            eprintln!(
                "created token {} {scope}; it is shown once, on stdout (only its hash is stored)",
                token.stored.id
            );
            println!("{}", token.secret);
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
                    "no tokens; make one with `flotilla token create CLUSTER --state-dir DIR > FILE`"
                );
            }
            for token in tokens {
                let scope = match (&token.cluster, token.role, &token.tenant) {
                    (Some(cluster), None, _) => format!("cluster {cluster}"),
                    (None, Some(role), None) => role.to_string(),
                    (None, Some(role), Some(tenant)) => format!("{role} of tenant {tenant}"),
                    _ => "nothing".to_string(),
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

/// What a token grants, in words: `for cluster edge-1`, `with the role viewer`,
/// `with the role operator of tenant shop`.
fn scope_of(token: &flotilla_hub::store::StoredToken) -> String {
    match (&token.cluster, token.role, &token.tenant) {
        (Some(cluster), None, _) => format!("for cluster {cluster}"),
        (None, Some(role), None) => format!("with the role {role}"),
        (None, Some(role), Some(tenant)) => format!("with the role {role} of tenant {tenant}"),
        _ => "granting nothing this version knows".to_string(),
    }
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
