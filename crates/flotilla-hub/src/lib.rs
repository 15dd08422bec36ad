//! The hub: follows the fleet repository, renders every new commit off the request
//! path, keeps the results in the [`store`](crate::store), and serves one bundle per
//! cluster over HTTP (docs/api.md).
//!
//! - [`follow`]: the follower task (notify watcher, poll, remote mirror, webhook wake-up)
//!   that renders and installs clean renders;
//! - [`state`]: what is served, as one immutable snapshot swapped atomically;
//! - [`rollouts`]: rollouts, decided by the pure core and recorded in the store;
//! - [`api`]: the axum routes; [`auth`]: tokens; [`fleet`]: cluster states and the
//!   fleet summary; [`metrics`]: Prometheus text;
//! - [`ui`]: the web page at `/ui/` (login, fleet, clusters, rollouts);
//! - [`publish`]: the same bundles as static files.
//!
//! This is the only module that knows axum's server side.

pub mod api;
pub mod auth;
pub mod clock;
pub mod delta;
pub mod fleet;
pub mod follow;
pub mod listen;
pub mod lock;
pub mod metrics;
mod mirror;
pub mod peers;
pub mod publish;
pub mod render_worker;
pub mod scope;

pub mod recorder;
pub mod source;
pub mod store;
pub mod tls;
pub mod ui;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::store::{ObjectError, Store, StoreError};
pub use api::RequestLimits;
use auth::TokenTable;
use clock::{Clock, SystemClock};
pub use follow::SourceSpec;
pub use listen::ConnectionLimits;
use recorder::reload::Reload;
use recorder::{Settings, Shared};
pub use tls::TlsFiles;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Locked(#[from] lock::LockError),
    /// A task the hub waited for panicked or was cancelled.
    #[error("a background task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("the server stopped with an error: {0}")]
    Serve(std::io::Error),
    #[error("cannot use --client-ca {path}: {message}")]
    ClientCa { path: String, message: String },
    #[error("cannot load the TLS certificate {cert} and key {key}: {message}")]
    Tls {
        cert: String,
        key: String,
        message: String,
    },
}

impl HubError {
    /// Another writer (an operator's `--database` action, another hub) changed the
    /// rollouts since this hub read them: nothing was written, and the hub reads them
    /// again and decides again. Expected now and then; not a fault.
    pub fn is_concurrent_change(&self) -> bool {
        matches!(self, HubError::Store(StoreError::RolloutsMoved { .. }))
    }

    /// Another hub (or an operator's `--database` action) wrote first: the rollouts or
    /// the recorded commit moved, or the lease went to another hub. Nothing was
    /// written and the next look decides again: a race between writers, not a fault
    /// of the hub's disk or database.
    pub fn is_another_writer(&self) -> bool {
        matches!(
            self,
            HubError::Store(
                StoreError::RolloutsMoved { .. }
                    | StoreError::RevisionMoved { .. }
                    | StoreError::Fenced { .. }
            )
        )
    }
}

/// How the hub runs. [`HubConfig::new`] gives the documented defaults.
pub struct HubConfig {
    pub state_dir: PathBuf,
    /// Where the tables live: the SQLite file in the state dir by default, or a
    /// PostgreSQL server several hubs share.
    pub database: store::Database,
    /// Where the bundles' objects live: the state dir by default, a folder several
    /// hubs share, or an S3 bucket.
    pub objects: store::ObjectsUrl,
    pub source: SourceSpec,
    /// How often to look for a new commit when nothing says so sooner.
    pub poll_interval: Duration,
    /// How long an agent may stay silent before its cluster counts as offline.
    pub offline_after: Duration,
    /// The longest a `?wait=` long-poll is held.
    pub max_wait: Duration,
    /// How many digests to keep per cluster for `/bundles/{digest}`.
    pub history: usize,
    /// The webhook's HMAC secret; the webhook is off without one.
    pub webhook_secret: Option<Vec<u8>>,
    pub clock: Arc<dyn Clock>,
    /// How often to look for tokens created or revoked by `flotilla token`, and for
    /// rollouts steered by `flotilla rollout --database`.
    pub token_refresh: Duration,
    /// The budgets of reading and rendering each commit.
    pub limits: flotilla_core::limits::Limits,
    /// Timeouts and the cap on connections.
    pub connections: ConnectionLimits,
    /// The webhook's bodies and the long-polls held per cluster.
    pub requests: RequestLimits,
    /// Several hubs on one database: the lease's length and how often to look for
    /// changes other hubs made.
    pub peers: peers::PeerTiming,
    /// Signs every served document (docs/security.md, "Signed bundles").
    pub signing_key: Option<Arc<flotilla_core::signing::SigningKey>>,
    /// Several hubs: how long an object must have been unreferenced before garbage
    /// collection deletes it (an hour).
    pub gc_grace: Duration,
    /// How long an ended rollout is kept in the store (90 days); the latest rollout
    /// of each policy, and those of the recorded revision, are kept whatever their
    /// age.
    pub keep_rollouts: Duration,
    /// Render each commit in a child process under a memory limit (`flotilla serve`
    /// does); `None` renders on a thread of the hub's own.
    pub render_worker: Option<render_worker::RenderWorker>,
    /// The most memory the last clean render may weigh for the hub to keep it, so
    /// that the next commit renders only what it changes; a heavier render is not
    /// kept, and every commit is rendered in full.
    pub keep_render: u64,
    /// The age identities SOPS files are opened with (`serve --decryption-key`);
    /// empty: a SOPS file is a render error.
    pub decryption: Arc<flotilla_render::sops::DecryptionKeys>,
    /// Pushes what is served to this repository of an OCI registry on every change
    /// (`serve --oci`); `None`: no registry.
    pub oci: Option<flotilla_oci::Registry>,
}

impl HubConfig {
    pub fn new(state_dir: impl Into<PathBuf>, source: SourceSpec) -> HubConfig {
        HubConfig {
            state_dir: state_dir.into(),
            database: store::Database::StateDir,
            objects: store::ObjectsUrl::StateDir,
            source,
            poll_interval: Duration::from_secs(15),
            offline_after: Duration::from_secs(300),
            max_wait: Duration::from_secs(240),
            history: 10,
            webhook_secret: None,
            clock: Arc::new(SystemClock),
            token_refresh: Duration::from_secs(1),
            limits: flotilla_core::limits::Limits::default(),
            connections: ConnectionLimits::default(),
            requests: RequestLimits::default(),
            peers: peers::PeerTiming::default(),
            signing_key: None,
            gc_grace: Duration::from_secs(3600),
            keep_rollouts: Duration::from_secs(90 * 24 * 3600),
            render_worker: None,
            keep_render: follow::DEFAULT_KEEP_RENDER,
            decryption: Arc::default(),
            oci: None,
        }
    }
}

/// A started hub: store loaded, follower running. Serve it with [`Hub::serve`].
pub struct Hub {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    connections: ConnectionLimits,
    requests: RequestLimits,
    /// Released last, once the store is closed: the state dir's, and the one beside
    /// a SQLite database outside it.
    lock: (lock::StateDirLock, Option<lock::StateDirLock>),
}

impl Hub {
    /// Opens the store, loads what it holds (so bundles are served at once, with the
    /// ETags they had before a restart) and starts following the repository.
    pub async fn start(config: HubConfig) -> Result<Hub, HubError> {
        let (lock, store, lease) = open_state(&config).await?;
        // Several hubs decide on the database's clock (a clock moved by hand, in tests,
        // is taken as it is).
        let database_clock = (lease.is_shared() && config.clock.advanced().is_none())
            .then(|| Arc::new(clock::DatabaseClock::new(config.clock.clone())));
        if lease.is_shared() {
            recorder::lease::heartbeat(&store, lease.holder(), database_clock.as_deref()).await?;
        }
        let clock: Arc<dyn Clock> = match &database_clock {
            Some(database_clock) => database_clock.clone(),
            None => config.clock,
        };
        let tokens = TokenTable::from_stored(&store.tokens().await?);
        let tokens_generation = store.tokens_generation().await?;
        let mut metrics = metrics::Metrics::default();
        metrics.count_object_store_requests(store.objects.requests());
        let settings = Settings {
            offline_after: config.offline_after,
            max_wait: config.max_wait,
            history: config.history.max(1),
            webhook_secret: config.webhook_secret,
            clock,
            signing_key: config.signing_key,
            gc_grace: config.gc_grace,
            keep_rollouts: config.keep_rollouts,
            peers: config.peers,
            database_clock,
        };
        let shared = Arc::new(Shared::new(store, settings, lease, metrics));
        shared.recorder.set_tokens(tokens);
        shared.recorder.settle_from_now();
        let loaded = shared.recorder.reload(Reload::Start).await?;
        if loaded > 0 {
            tracing::info!(clusters = loaded, "serving the bundles held in the store");
            shared.recorder.set_ready();
        }
        let follower = follow::Follower::new(
            shared.clone(),
            config.source,
            &config.state_dir,
            config.poll_interval,
            follow::RenderSetup {
                limits: config.limits,
                worker: config.render_worker,
                keep_render: config.keep_render,
                decryption: config.decryption,
            },
        );
        let mut tasks = spawn_tasks(&shared, follower, tokens_generation, config.token_refresh);
        if let Some(registry) = config.oci {
            tasks.push(tokio::spawn(mirror::run(shared.clone(), registry)));
        }
        Ok(Hub {
            shared,
            tasks,
            connections: config.connections,
            requests: config.requests,
            lock,
        })
    }

    /// The API and the web page as an axum router, for serving it another way
    /// (over plain HTTP: the page's cookie is not marked Secure).
    pub fn router(&self) -> axum::Router {
        self.app(false)
    }

    /// The API and the web page; `secure` when served over TLS.
    fn app(&self, secure: bool) -> axum::Router {
        api::router(self.shared.clone(), self.requests)
            .merge(ui::router(self.shared.clone(), secure))
    }

    /// Long-polls being held right now.
    pub fn long_polls_held(&self) -> i64 {
        self.shared.metrics.long_polls_held()
    }

    /// Whether the hub has something to serve (or has tried to render once).
    pub fn is_ready(&self) -> bool {
        self.shared.view.is_ready()
    }

    /// Whether this hub holds the lease to record renders and decide rollouts (always,
    /// alone on its database).
    pub fn holds_rollout_lease(&self) -> bool {
        self.shared.recorder.lease().holds()
    }

    /// Reloads tokens from the store now instead of on the next refresh.
    pub async fn reload_tokens(&self) -> Result<(), HubError> {
        self.shared.recorder.reload_tokens().await
    }

    /// Serves plain HTTP on `listener` until `shutdown` completes; then releases held
    /// long-polls, finishes requests in flight, stops following and closes the store.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HubError> {
        self.serve_with(listener, listen::Transport::Plain, false, shutdown)
            .await
    }

    /// Serves HTTPS (rustls) on `listener` until `shutdown` completes; with
    /// [`TlsFiles::client_ca`], client certificates are required and bound to clusters
    /// (see [`tls`]).
    pub async fn serve_tls(
        self,
        listener: std::net::TcpListener,
        files: &TlsFiles,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HubError> {
        let config = tls::server_config(files)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
            .map_err(HubError::Serve)?;
        let transport = listen::Transport::Tls {
            acceptor,
            client_auth: files.client_ca.is_some(),
        };
        self.serve_with(listener, transport, true, shutdown).await
    }

    async fn serve_with(
        self,
        listener: tokio::net::TcpListener,
        transport: listen::Transport,
        secure: bool,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HubError> {
        let result = listen::serve(
            listener,
            transport,
            self.app(secure),
            self.connections,
            self.shared.shutdown.clone(),
            shutdown,
        )
        .await
        .map_err(HubError::Serve);
        self.stop().await;
        result
    }

    async fn stop(self) {
        self.shared.shutdown.send_replace(true);
        for task in self.tasks {
            // The follower returns at once (a render in progress is told to stop and
            // left behind); any task still busy after a while is abandoned.
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        self.shared.recorder.close().await;
        drop(self.lock);
    }
}

/// Locks the state dir (a second hub on it stops here, before it reads or writes
/// anything), opens the store and tells whether other hubs may share its database.
async fn open_state(
    config: &HubConfig,
) -> Result<
    (
        (lock::StateDirLock, Option<lock::StateDirLock>),
        Store,
        recorder::Lease,
    ),
    HubError,
> {
    flotilla_fs::create_dir(&config.state_dir, flotilla_fs::Mode::Private).map_err(|source| {
        StoreError::CreateDir {
            path: config.state_dir.display().to_string(),
            source,
        }
    })?;
    let lock = lock::StateDirLock::acquire(&config.state_dir)?;
    let database_lock = match &config.database {
        store::Database::Sqlite(file) => Some(lock::StateDirLock::acquire_database(file)?),
        _ => None,
    };
    // What a writer killed mid-write left in the state dir itself (a render process
    // killed while it kept the sealing headers, say): with the lock held, none runs.
    if let Err(err) =
        flotilla_fs::remove_temporary_files(&config.state_dir, flotilla_fs::is_temporary)
    {
        tracing::warn!(state_dir = %config.state_dir.display(), "cannot remove temporary files: {err}");
    }
    let store =
        Store::open_with_objects(&config.state_dir, &config.database, &config.objects).await?;
    let lease = match store.engine() {
        store::Engine::Sqlite => recorder::Lease::alone(),
        store::Engine::Postgres => recorder::Lease::shared(),
    };
    if lease.is_shared() && !config.objects.is_shared() {
        tracing::warn!(
            "several hubs may share this database, but this hub keeps its objects in its own state dir: \
             each hub writes every object itself and only the lease holder's are collected; \
             give every hub the same --objects (file:///shared/folder or s3://bucket/prefix)"
        );
    }
    Ok(((lock, database_lock), store, lease))
}

/// The hub's background tasks: the follower (after checking the objects and
/// collecting unused ones), the token refresh, the rollouts' timer and watch, and with
/// several hubs the lease and the database's changes.
fn spawn_tasks(
    shared: &Arc<Shared>,
    follower: follow::Follower,
    tokens_generation: i64,
    token_refresh: Duration,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn({
            let shared = shared.clone();
            async move {
                shared.recorder.verify_objects().await;
                shared.recorder.forget_history().await;
                shared.recorder.collect_garbage().await;
                follower.run(shared.shutdown.subscribe()).await
            }
        }),
        tokio::spawn(refresh_tokens(
            shared.clone(),
            tokens_generation,
            token_refresh,
        )),
        tokio::spawn(recorder::rollouts::run_timer(shared.clone())),
        tokio::spawn(recorder::rollouts::run_watch(shared.clone(), token_refresh)),
    ];
    if shared.recorder.lease().is_shared() {
        let peers = shared.settings.peers;
        tasks.push(tokio::spawn(peers::run_lease(shared.clone(), peers)));
        tasks.push(tokio::spawn(peers::run_sync(shared.clone(), peers)));
    }
    tasks
}

async fn refresh_tokens(shared: Arc<Shared>, mut seen: i64, every: Duration) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        match shared.view.reads().tokens_generation().await {
            Ok(current) if current != seen => match shared.view.reads().tokens().await {
                Ok(tokens) => {
                    let table = TokenTable::from_stored(&tokens);
                    tracing::info!(tokens = table.len(), "tokens changed; reloaded");
                    shared.recorder.set_tokens(table);
                    seen = current;
                }
                Err(err) => tracing::warn!("cannot reload tokens: {err}"),
            },
            Ok(_) => {}
            Err(err) => tracing::warn!("cannot check for new tokens: {err}"),
        }
    }
}
