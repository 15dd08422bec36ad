//! The hub's store: bundle content addressed by digest ([`objects`]: under
//! `--state-dir` by default, or with `--objects` in a folder several hubs share or an
//! S3 bucket), and everything else in a database through sqlx ([`Database`]). By
//! default that is the SQLite file [`DATABASE_FILE`] in the state dir; with
//! `serve --database postgres://…` it is a PostgreSQL server several hubs share (and
//! `sqlite:///…` names a SQLite file elsewhere). The tables hold what each cluster is
//! served and the revision that first produced it, the last N digests per cluster,
//! what the last clean render gives each cluster, rollouts ([`rollouts`]), agent
//! status, hashed tokens, web sessions ([`sessions`]), the hubs sharing the database
//! ([`hubs`]: heartbeats and the tips they see) and the rollout lease.
//!
//! Both engines take the same schema from the same migrations (the files in
//! `migrations/`, compiled in and applied at open) and run the same SQL, written
//! plainly: `$1` placeholders, `ON CONFLICT … DO UPDATE`, and no engine's own
//! functions but the clock's (chosen by [`Engine`]). A decision writes a
//! [`Commit`] in one transaction. The store knows nothing of HTTP, Git or rendering.

pub mod hubs;
pub mod objects;
pub mod rollouts;
pub mod secrets;
pub mod sessions;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AnyPool, ConnectOptions, Row};

use flotilla_core::access::Role;
use flotilla_core::bundle::Digest;
use flotilla_core::status::StatusReport;
pub use hubs::Sighting;
pub use objects::{Bucket, ObjectError, Objects, ObjectsUrl, S3Location};
pub use rollouts::{RolloutWrite, StoredRollout};
pub use sessions::StoredSession;

/// Why a token named by its id (or the start of it) cannot be acted on.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("no token with id {id:?}; `flotilla token list` shows the ids")]
    NoSuchId { id: String },
    #[error("{count} tokens have ids starting with {id:?}; give more of the id")]
    Ambiguous { id: String, count: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the state directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("the database {path} cannot be used: {source}")]
    Database { path: String, source: sqlx::Error },
    /// A SQLite file that is there but is not a flotilla store: it is left as it is.
    #[error("the database {path} {reason}; it was left as it is")]
    NotAStore { path: String, reason: String },
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("the database holds a malformed value in {table}.{column}: {message}")]
    Malformed {
        table: &'static str,
        column: &'static str,
        message: String,
    },
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(
        "this hub no longer holds the {lease} lease (epoch {epoch}): another hub took it over; nothing was written"
    )]
    Fenced { lease: String, epoch: i64 },
    #[error(
        "the rollouts were changed by someone else (an operator's action through the database, or another hub) \
         since they were read at version {expected}; nothing was written, they are read again and decided again"
    )]
    RolloutsMoved { expected: i64 },
    #[error(
        "another hub recorded {recorded} while this one rendered (it expected {expected}); nothing was written, the next look decides again"
    )]
    RevisionMoved { expected: String, recorded: String },
}

/// A lease as held by this hub: its name and the epoch every write checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub lease: String,
    pub holder: String,
    pub epoch: i64,
}

/// What a cluster is served, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCluster {
    pub name: String,
    pub digest: Digest,
    /// The revision of the commit that first produced this digest for this cluster.
    pub revision: String,
    /// A new cluster whose wave is not released: an agent naming the digest it runs
    /// keeps it (304); a fresh agent gets `digest`.
    pub hold: bool,
    /// The serve sequence of this change, signed with the served document.
    pub sequence: u64,
}

/// What the last clean render gives a cluster, and where the rollout plan puts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedCluster {
    pub cluster: String,
    pub digest: Digest,
    /// The revision that first rendered this digest for this cluster.
    pub revision: String,
    pub policy: Option<String>,
    pub wave: Option<String>,
    pub paused: bool,
}

/// A token as stored: only the SHA-256 of the token itself, never the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredToken {
    /// A short public name for the token, used to list and revoke it.
    pub id: String,
    /// Hex of SHA-256 of the token.
    pub hash: String,
    /// The cluster whose bundles it reads; `None` for a person's token.
    pub cluster: Option<String>,
    /// An admin token (the role admin; kept as its own column since the first store).
    pub admin: bool,
    /// A person's token's role; `None` for a cluster's token.
    pub role: Option<Role>,
    /// The tenant a person's token is limited to.
    pub tenant: Option<String>,
    pub created_at_ms: i64,
    pub revoked_at_ms: Option<i64>,
}

/// An agent's last report and when it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredStatus {
    pub cluster: String,
    pub report: StatusReport,
    pub received_at_ms: i64,
}

/// One change of what a cluster is served: the one way the `clusters` table changes
/// (each bumps the cluster's serve sequence).
pub use flotilla_core::rollout::render::ServedChange;

/// Everything one decision writes, in one transaction: a clean render's results,
/// changes of what clusters are served, rollouts started or moved on.
#[derive(Debug, Default)]
pub struct Commit {
    /// The revision of a clean render being recorded, if this commit records one.
    pub revision: Option<String>,
    /// New or changed rows of `rendered`.
    pub rendered: Vec<RenderedCluster>,
    /// Clusters no longer in the repository.
    pub removed: Vec<String>,
    pub served: Vec<ServedChange>,
    pub rollouts: Vec<RolloutWrite>,
    /// How many digests to keep per cluster.
    pub history: usize,
    pub now_ms: i64,
    /// Written only while this lease is held at this epoch (several hubs).
    pub fence: Option<Fence>,
    /// With `revision`: written only if the recorded revision is still this one
    /// (`Some(None)`: none recorded yet), so an older render never replaces a newer.
    pub expect_revision: Option<Option<String>>,
    /// Written only if the rollouts are still at this version (see
    /// [`Store::rollouts_version`]), which the commit moves on by one: a decision
    /// taken on rollouts someone else has written since (an operator's action through
    /// the database, another hub) is refused instead of overwriting them.
    pub rollouts_version: Option<i64>,
}

pub struct Store {
    root: PathBuf,
    pub objects: Objects,
    pool: AnyPool,
    /// The database as people are shown it (a PostgreSQL password left out).
    db_path: String,
    engine: Engine,
    /// SQLite: the connection that first checked the file, kept open until the pool
    /// is closed. Closing it while the process has no other connection yet made a
    /// command beside a running hub (`token create`) lose what it then committed.
    first: tokio::sync::Mutex<Option<sqlx::AnyConnection>>,
}

/// A transaction on either engine.
type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;

/// Which engine holds the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// An embedded SQLite file: one hub.
    Sqlite,
    /// A PostgreSQL server, which several hubs may share.
    Postgres,
}

/// Where the hub's tables live: `--database URL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// The SQLite file [`DATABASE_FILE`] in the state dir (the default).
    StateDir,
    /// A SQLite file elsewhere: `sqlite:///path/to/flotilla.db`.
    Sqlite(PathBuf),
    /// A PostgreSQL server: `postgres://user:password@host:port/database?sslmode=…`.
    Postgres(String),
}

impl FromStr for Database {
    type Err = String;

    fn from_str(url: &str) -> Result<Database, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Database::Postgres(url.to_string()));
        }
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(
                    "sqlite:// needs a file, as in sqlite:///var/lib/flotilla/flotilla.db".into(),
                );
            }
            return Ok(Database::Sqlite(PathBuf::from(path)));
        }
        Err(format!(
            "{url:?} is not a database URL flotilla knows: give postgres://user@host:port/database \
             or sqlite:///path/to/file.db (without --database the hub uses {DATABASE_FILE} in its state dir)"
        ))
    }
}

impl Database {
    /// The URL with any password left out, for messages and logs.
    pub fn display(&self, state_dir: &Path) -> String {
        match self {
            Database::StateDir => state_dir.join(DATABASE_FILE).display().to_string(),
            Database::Sqlite(path) => path.display().to_string(),
            Database::Postgres(url) => redact_password(url),
        }
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:…@host/db`.
fn redact_password(url: &str) -> String {
    let url = &redact_query_passwords(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info
                .split_once(':')
                .map_or(user_info, |(user, _)| user);
            let hidden = if user_info.contains(':') { ":…" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// `url` with the value of any `password` (or `…password`, as `sslpassword`) query
/// parameter hidden: PostgreSQL URLs may carry the password there too.
fn redact_query_passwords(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if key.to_ascii_lowercase().ends_with("password") => {
                format!("{key}=…")
            }
            _ => param.to_string(),
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

/// The schema's migrations, the files in `migrations/`, compiled in. They are
/// applied in order at open and recorded in `_sqlx_migrations` by sqlx's migrator,
/// exactly as `sqlx::migrate!` would; listing them here instead of using that macro
/// spares every build sqlx's macro crates and a second SQLite compiled for them.
/// A test checks that every file in `migrations/` is listed.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "initial",
        include_str!("../../migrations/0001_initial.sql"),
    ),
    (
        2,
        "rollouts",
        include_str!("../../migrations/0002_rollouts.sql"),
    ),
    (
        3,
        "sessions",
        include_str!("../../migrations/0003_sessions.sql"),
    ),
    (
        4,
        "signing",
        include_str!("../../migrations/0004_signing.sql"),
    ),
    // 0003 is taken by work on another branch (web sessions); numbers need not be
    // contiguous, only increasing.
    (5, "hubs", include_str!("../../migrations/0005_hubs.sql")),
    (
        6,
        "unreferenced objects",
        include_str!("../../migrations/0006_unreferenced_objects.sql"),
    ),
    (
        7,
        "hubs seen",
        include_str!("../../migrations/0007_hubs_seen.sql"),
    ),
    (
        8,
        "hub secrets",
        include_str!("../../migrations/0008_hub_secrets.sql"),
    ),
    (
        9,
        "agent drift features",
        include_str!("../../migrations/0009_agent_drift_features.sql"),
    ),
    (
        10,
        "token roles",
        include_str!("../../migrations/0010_token_roles.sql"),
    ),
];

/// [`MIGRATIONS`] (or the first of them, in tests of upgrades) as sqlx reads a
/// migrations folder.
#[derive(Debug)]
struct EmbeddedMigrations(&'static [(i64, &'static str, &'static str)]);

impl sqlx::migrate::MigrationSource<'static> for EmbeddedMigrations {
    fn resolve(
        self,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<Vec<sqlx::migrate::Migration>, sqlx::error::BoxDynError>,
                > + Send,
        >,
    > {
        Box::pin(async move {
            Ok(self
                .0
                .iter()
                .map(|(version, description, sql)| {
                    sqlx::migrate::Migration::new(
                        *version,
                        (*description).into(),
                        sqlx::migrate::MigrationType::Simple,
                        (*sql).into(),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// The database's file name inside the state dir.
pub const DATABASE_FILE: &str = "flotilla.db";

const META_REVISION: &str = "revision";
const META_GENERATION: &str = "generation";
const META_TOKENS: &str = "tokens_generation";
const META_CHANGES: &str = "changes";
/// Moves on with every write of rollouts (see [`Commit::rollouts_version`]).
const META_ROLLOUTS: &str = "rollouts_version";
/// Clusters per statement when last-seen times are written: 2 parameters each, within
/// SQLite's oldest limit of 999 parameters a statement.
const SEEN_ROWS_PER_STATEMENT: usize = 400;

impl Store {
    /// Opens the store under `state_dir` with its tables in the SQLite file there,
    /// creating both on first use.
    pub async fn open(state_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(state_dir, &Database::StateDir).await
    }

    /// Opens the store: objects under `state_dir`, tables in `database`; the schema's
    /// migrations are applied (the same files on either engine; on PostgreSQL sqlx
    /// takes an advisory lock, so hubs starting together migrate once). The folder,
    /// a SQLite database and the objects are readable by the hub's user only: they
    /// hold token hashes and bundles, which may hold Secrets.
    pub async fn open_with(state_dir: &Path, database: &Database) -> Result<Store, StoreError> {
        Store::open_with_objects(state_dir, database, &ObjectsUrl::StateDir).await
    }

    /// [`Store::open_with`], with the objects where `objects` says (the state dir, a
    /// shared folder or an S3 bucket, which is asked once here).
    pub async fn open_with_objects(
        state_dir: &Path,
        database: &Database,
        objects: &ObjectsUrl,
    ) -> Result<Store, StoreError> {
        flotilla_fs::create_dir(state_dir, flotilla_fs::Mode::Private).map_err(|source| {
            StoreError::CreateDir {
                path: state_dir.display().to_string(),
                source,
            }
        })?;
        let objects = Objects::open_url(state_dir, objects).await?;
        let (pool, engine, first) = connect(state_dir, database).await?;
        Ok(Store {
            root: state_dir.to_path_buf(),
            objects,
            pool,
            db_path: database.display(state_dir),
            engine,
            first: tokio::sync::Mutex::new(first),
        })
    }

    /// Opens only the tables of a database named by URL (not [`Database::StateDir`]),
    /// for commands that read or write tokens and served digests and no bundle: no
    /// state dir is created, and [`Store::objects`] points at none (reading one fails).
    pub async fn open_tables(database: &Database) -> Result<Store, StoreError> {
        let nowhere = Path::new("");
        let (pool, engine, first) = connect(nowhere, database).await?;
        Ok(Store {
            root: PathBuf::new(),
            objects: Objects::unopened(Path::new("/nonexistent/flotilla-objects")),
            pool,
            db_path: database.display(nowhere),
            engine,
            first: tokio::sync::Mutex::new(first),
        })
    }

    /// Which engine holds the tables: on PostgreSQL several hubs may share them.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Closes the database connections (waits for writes in flight).
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(first) = self.first.lock().await.take() {
            let _ = sqlx::Connection::close(first).await;
        }
    }

    fn db_error(&self, source: sqlx::Error) -> StoreError {
        StoreError::Database {
            path: self.db_path.clone(),
            source,
        }
    }

    /// Every cluster's current bundle.
    pub async fn clusters(&self) -> Result<Vec<StoredCluster>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, digest, revision, CAST(hold AS INTEGER) AS hold, serve_sequence FROM clusters ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok(StoredCluster {
                    name: row.get("name"),
                    digest: parse_digest("clusters", "digest", row.get("digest"))?,
                    revision: row.get("revision"),
                    hold: flag(row, "hold"),
                    sequence: sequence_of(row.get("serve_sequence"))?,
                })
            })
            .collect()
    }

    /// When what each cluster is served last changed (milliseconds on the hub's
    /// clock), from the `clusters` rows; a row without a time is left out.
    pub async fn served_since(&self) -> Result<HashMap<String, i64>, StoreError> {
        let rows = sqlx::query("SELECT name, updated_at FROM clusters WHERE updated_at > 0")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(rows
            .iter()
            .map(|row| (row.get("name"), row.get("updated_at")))
            .collect())
    }

    /// What the last clean render gives each cluster.
    pub async fn rendered(&self) -> Result<Vec<RenderedCluster>, StoreError> {
        let rows = sqlx::query(
            "SELECT cluster, digest, revision, policy, wave, CAST(paused AS INTEGER) AS paused FROM rendered ORDER BY cluster",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok(RenderedCluster {
                    cluster: row.get("cluster"),
                    digest: parse_digest("rendered", "digest", row.get("digest"))?,
                    revision: row.get("revision"),
                    policy: row.get("policy"),
                    wave: row.get("wave"),
                    paused: flag(row, "paused"),
                })
            })
            .collect()
    }

    /// A cluster's serve sequence, which goes up with every change of what it is served.
    pub async fn serve_sequence(&self, cluster: &str) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query("SELECT serve_sequence FROM clusters WHERE name = $1")
            .bind(cluster)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.map(|r| r.get("serve_sequence")))
    }

    /// When each cluster was last seen, as last written by [`Store::put_seen`].
    pub async fn seen(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT cluster, seen_at FROM cluster_seen")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(rows
            .iter()
            .map(|row| (row.get("cluster"), row.get("seen_at")))
            .collect())
    }

    /// Records when clusters were last seen (one batch, one transaction, one statement
    /// per [`SEEN_ROWS_PER_STATEMENT`] clusters; a cluster named twice keeps its latest
    /// time, and a time never goes back: a hub writing a time it read from another
    /// hub earlier does not undo a later one). A hub writes a row for every cluster that polled it since the last batch:
    /// thousands every 30 s in a large fleet, which as one statement each were nearly
    /// all an idle hub asked its database (BENCHMARKS.md, "Hubs on PostgreSQL and S3").
    pub async fn put_seen(&self, seen: &[(String, i64)]) -> Result<(), StoreError> {
        let mut latest: BTreeMap<&str, i64> = BTreeMap::new();
        for (cluster, at) in seen {
            let entry = latest.entry(cluster.as_str()).or_insert(*at);
            *entry = (*entry).max(*at);
        }
        let rows: Vec<(&str, i64)> = latest.into_iter().collect();
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        for chunk in rows.chunks(SEEN_ROWS_PER_STATEMENT) {
            let sql = format!(
                "INSERT INTO cluster_seen (cluster, seen_at) VALUES {}
                 ON CONFLICT (cluster) DO UPDATE SET seen_at = excluded.seen_at
                 WHERE excluded.seen_at > cluster_seen.seen_at",
                Placeholders::of(&tx).rows(chunk.len(), 2)
            );
            let mut query = sqlx::query(&sql);
            for (cluster, at) in chunk {
                query = query.bind(*cluster).bind(*at);
            }
            query.execute(&mut *tx).await.map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(())
    }

    /// The revision recorded with `digest` in the cluster's history, if it is there.
    pub async fn revision_in_history(
        &self,
        cluster: &str,
        digest: &Digest,
    ) -> Result<Option<String>, StoreError> {
        let row =
            sqlx::query("SELECT revision FROM bundle_history WHERE cluster = $1 AND digest = $2")
                .bind(cluster)
                .bind(digest.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.db_error(e))?;
        Ok(row.map(|r| r.get("revision")))
    }

    /// [`Store::revision_in_history`] of many clusters at once, a few hundred clusters
    /// to a statement: a commit that changes every cluster of a fleet of 10,000 asks
    /// twenty statements, not 10,000 (which held its long-polls for seconds). Only
    /// the pairs found are in the answer.
    pub async fn revisions_in_history(
        &self,
        wanted: &[(&str, &Digest)],
    ) -> Result<HashMap<(String, Digest), String>, StoreError> {
        let mut found = HashMap::new();
        if wanted.is_empty() {
            return Ok(found);
        }
        let asked: HashSet<(&str, &str)> = wanted
            .iter()
            .map(|(cluster, digest)| (*cluster, digest.as_str()))
            .collect();
        let mut names: Vec<&str> = wanted.iter().map(|(cluster, _)| *cluster).collect();
        names.sort_unstable();
        names.dedup();
        let mut connection = self.pool.acquire().await.map_err(|e| self.db_error(e))?;
        for chunk in names.chunks(ROWS_PER_STATEMENT) {
            let rows = select_in(
                &mut connection,
                "SELECT cluster, digest, revision FROM bundle_history WHERE cluster IN ({})",
                chunk,
            )
            .await
            .map_err(|e| self.db_error(e))?;
            for row in rows {
                let cluster: String = row.get("cluster");
                let digest: String = row.get("digest");
                if !asked.contains(&(cluster.as_str(), digest.as_str())) {
                    continue;
                }
                if let Ok(digest) = Digest::parse(&digest) {
                    found.insert((cluster, digest), row.get("revision"));
                }
            }
        }
        Ok(found)
    }

    /// A cluster's recent digests, newest first, with their revisions.
    pub async fn history(&self, cluster: &str) -> Result<Vec<(Digest, String)>, StoreError> {
        let rows = sqlx::query(
            "SELECT digest, revision FROM bundle_history WHERE cluster = $1 ORDER BY generation DESC",
        )
        .bind(cluster)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok((
                    parse_digest("bundle_history", "digest", row.get("digest"))?,
                    row.get("revision"),
                ))
            })
            .collect()
    }

    /// The revision of the last clean render.
    pub async fn revision(&self) -> Result<Option<String>, StoreError> {
        self.meta(META_REVISION).await
    }

    async fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM hub_meta WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.map(|r| r.get("value")))
    }

    /// Writes one decision in one transaction: a clean render's `rendered` rows and
    /// removed clusters, changes of what clusters are served (with their history,
    /// trimmed to `history` entries per cluster), rollouts. The objects must already be
    /// on disk. Returns the digests nothing refers to any more, whose objects the
    /// caller may delete.
    pub async fn commit(&self, commit: &Commit) -> Result<Vec<Digest>, StoreError> {
        self.commit_with_sequences(commit)
            .await
            .map(|(unreferenced, _)| unreferenced)
    }

    /// [`Store::commit`], also returning the serve sequence each served change got.
    pub async fn commit_with_sequences(
        &self,
        commit: &Commit,
    ) -> Result<(Vec<Digest>, HashMap<String, u64>), StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        self.take_write_lock(&mut tx).await?;
        self.check_fence(&mut tx, commit).await?;
        self.move_rollouts_version(&mut tx, commit).await?;
        self.check_revision(&mut tx, commit).await?;
        let mut candidates: BTreeSet<String> = BTreeSet::new();
        write_rendered(&mut tx, &commit.rendered, &mut candidates)
            .await
            .map_err(err)?;
        let sequences = self
            .write_served_changes(&mut tx, commit, &mut candidates)
            .await?;
        remove_clusters(&mut tx, &commit.removed, &mut candidates)
            .await
            .map_err(err)?;
        for write in &commit.rollouts {
            rollouts::write(&mut tx, write, &mut candidates)
                .await
                .map_err(err)?;
        }
        if let Some(revision) = &commit.revision {
            set_meta(&mut tx, META_REVISION, revision)
                .await
                .map_err(err)?;
        }
        bump_counter(&mut tx, META_CHANGES).await.map_err(err)?;
        let unreferenced = self.unreferenced(&mut tx, candidates).await?;
        tx.commit().await.map_err(err)?;
        Ok((unreferenced, sequences))
    }

    /// On SQLite, takes the database's write lock with a first statement that writes
    /// (nothing), so that the transaction waits for the lock (within the busy timeout)
    /// before it reads anything. One that read first and then wrote after another
    /// connection had written failed at once with `SQLITE_BUSY` (the busy timeout does
    /// not cover that upgrade): a render's commit failed beside an agent's status
    /// report. (`BEGIN IMMEDIATE` would do the same, but a request dropped while it
    /// waited for the lock left its connection holding it with no transaction to roll
    /// back.) PostgreSQL locks rows, not the database: nothing to do there.
    async fn take_write_lock(&self, tx: &mut Tx<'_>) -> Result<(), StoreError> {
        if self.engine == Engine::Sqlite {
            sqlx::query("UPDATE hub_meta SET value = value WHERE key = $1")
                .bind(META_ROLLOUTS)
                .execute(&mut **tx)
                .await
                .map_err(|e| self.db_error(e))?;
        }
        Ok(())
    }

    /// Refuses the commit unless this hub still holds the lease it was fenced by.
    async fn check_fence(&self, tx: &mut Tx<'_>, commit: &Commit) -> Result<(), StoreError> {
        let Some(fence) = &commit.fence else {
            return Ok(());
        };
        // Touching the lease's row holds it locked until this transaction ends, so
        // a hub taking the lease over waits for this write or fences it out.
        let held = sqlx::query(
            "UPDATE hub_leases SET epoch = epoch WHERE name = $1 AND holder = $2 AND epoch = $3",
        )
        .bind(&fence.lease)
        .bind(&fence.holder)
        .bind(fence.epoch)
        .execute(&mut **tx)
        .await
        .map_err(|e| self.db_error(e))?
        .rows_affected();
        if held != 1 {
            return Err(StoreError::Fenced {
                lease: fence.lease.clone(),
                epoch: fence.epoch,
            });
        }
        Ok(())
    }

    /// Moves the rollouts version on, refusing the commit if it was read at another.
    async fn move_rollouts_version(
        &self,
        tx: &mut Tx<'_>,
        commit: &Commit,
    ) -> Result<(), StoreError> {
        let err = |e| self.db_error(e);
        if let Some(expected) = commit.rollouts_version {
            // Compare and move on in one statement, which holds the row (PostgreSQL)
            // or the database (SQLite) until this transaction ends: of two writers
            // that read the same version, the second is refused.
            let moved = sqlx::query("UPDATE hub_meta SET value = $1 WHERE key = $2 AND value = $3")
                .bind((expected + 1).to_string())
                .bind(META_ROLLOUTS)
                .bind(expected.to_string())
                .execute(&mut **tx)
                .await
                .map_err(err)?
                .rows_affected();
            if moved != 1 {
                return Err(StoreError::RolloutsMoved { expected });
            }
        } else if !commit.rollouts.is_empty() {
            bump_counter(tx, META_ROLLOUTS).await.map_err(err)?;
        }
        Ok(())
    }

    /// Refuses the commit if the recorded revision is neither the expected one nor its own.
    async fn check_revision(&self, tx: &mut Tx<'_>, commit: &Commit) -> Result<(), StoreError> {
        let (Some(revision), Some(expected)) = (&commit.revision, &commit.expect_revision) else {
            return Ok(());
        };
        let recorded: Option<String> = sqlx::query("SELECT value FROM hub_meta WHERE key = $1")
            .bind(META_REVISION)
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| self.db_error(e))?
            .map(|row| row.get("value"));
        if recorded != *expected && recorded.as_ref() != Some(revision) {
            return Err(StoreError::RevisionMoved {
                expected: expected.clone().unwrap_or_else(|| "nothing".into()),
                recorded: recorded.unwrap_or_else(|| "nothing".into()),
            });
        }
        Ok(())
    }

    /// Writes the served changes under one new generation, returning each cluster's sequence.
    async fn write_served_changes(
        &self,
        tx: &mut Tx<'_>,
        commit: &Commit,
        candidates: &mut BTreeSet<String>,
    ) -> Result<HashMap<String, u64>, StoreError> {
        let err = |e| self.db_error(e);
        let mut sequences = HashMap::with_capacity(commit.served.len());
        if commit.served.is_empty() {
            return Ok(sequences);
        }
        let generation = next_generation(tx).await.map_err(err)?;
        for chunk in chunks_by_key(&commit.served, |change| &change.cluster) {
            let written = write_served(tx, chunk, generation, commit, candidates)
                .await
                .map_err(err)?;
            for (cluster, sequence) in written {
                sequences.insert(cluster, sequence_of(sequence)?);
            }
        }
        Ok(sequences)
    }

    /// The digests of `candidates` nothing refers to any more, parsed.
    async fn unreferenced(
        &self,
        tx: &mut Tx<'_>,
        candidates: BTreeSet<String>,
    ) -> Result<Vec<Digest>, StoreError> {
        let mut unreferenced = Vec::new();
        for digest in unreferenced_of(tx, candidates)
            .await
            .map_err(|e| self.db_error(e))?
        {
            unreferenced.push(parse_digest("bundle_history", "digest", digest)?);
        }
        Ok(unreferenced)
    }

    /// Every digest the store refers to: served, rendered, kept in a cluster's history
    /// or named by a rollout under way. An object outside this set is garbage.
    pub async fn referenced_digests(&self) -> Result<BTreeSet<Digest>, StoreError> {
        let rows = sqlx::query(
            "SELECT digest FROM bundle_history
             UNION SELECT digest FROM clusters
             UNION SELECT digest FROM rendered
             UNION SELECT c.previous FROM rollout_clusters c JOIN rollouts r ON r.id = c.rollout_id
                   WHERE r.ended_at IS NULL AND c.previous IS NOT NULL
             UNION SELECT c.target FROM rollout_clusters c JOIN rollouts r ON r.id = c.rollout_id
                   WHERE r.ended_at IS NULL AND c.target IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        rows.into_iter()
            .map(|row| parse_digest("bundle_history", "digest", row.get(0)))
            .collect()
    }

    /// Records that the objects `unreferenced` are referenced by nothing (each keeps the
    /// time it was first seen so; the time is the database's clock), forgets every other
    /// digest recorded before (referenced again, or gone), and returns those that have
    /// been unreferenced for at least `grace_ms`: the objects garbage collection may
    /// delete. Call [`Store::forget_unreferenced`] for those it deleted.
    pub async fn mark_unreferenced(
        &self,
        unreferenced: &BTreeSet<Digest>,
        grace_ms: i64,
    ) -> Result<Vec<Digest>, StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        let rows = sqlx::query("SELECT digest FROM unreferenced_objects")
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let marked: BTreeSet<String> = rows.iter().map(|row| row.get(0)).collect();
        for digest in marked.iter().filter(|d| {
            Digest::parse(d)
                .map(|d| !unreferenced.contains(&d))
                .unwrap_or(true)
        }) {
            sqlx::query("DELETE FROM unreferenced_objects WHERE digest = $1")
                .bind(digest)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        let now = self.now_sql();
        let insert = format!(
            "INSERT INTO unreferenced_objects (digest, since) VALUES ($1, {now})
             ON CONFLICT (digest) DO NOTHING"
        );
        for digest in unreferenced.iter().filter(|d| !marked.contains(d.as_str())) {
            sqlx::query(&insert)
                .bind(digest.as_str())
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        let due = format!(
            "SELECT digest FROM unreferenced_objects WHERE since <= {now} - $1 ORDER BY digest"
        );
        let rows = sqlx::query(&due)
            .bind(grace_ms)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        rows.into_iter()
            .map(|row| parse_digest("unreferenced_objects", "digest", row.get(0)))
            .collect()
    }

    /// Forgets digests whose objects garbage collection deleted.
    pub async fn forget_unreferenced(&self, digests: &[Digest]) -> Result<(), StoreError> {
        for digest in digests {
            sqlx::query("DELETE FROM unreferenced_objects WHERE digest = $1")
                .bind(digest.as_str())
                .execute(&self.pool)
                .await
                .map_err(|e| self.db_error(e))?;
        }
        Ok(())
    }

    /// Stores an agent's report, replacing the previous one.
    pub async fn put_status(&self, status: &StoredStatus) -> Result<(), StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        let resources =
            serde_json::to_string(&status.report.resources).map_err(|e| StoreError::Malformed {
                table: "agent_status",
                column: "resources",
                message: e.to_string(),
            })?;
        let drift =
            serde_json::to_string(&status.report.drift).map_err(|e| StoreError::Malformed {
                table: "agent_status",
                column: "drift",
                message: e.to_string(),
            })?;
        sqlx::query(
            "INSERT INTO agent_status (cluster, applied, attempted, resources, message, agent_version, received_at, drift, features)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (cluster) DO UPDATE SET applied = excluded.applied, attempted = excluded.attempted,
                 resources = excluded.resources, message = excluded.message,
                 agent_version = excluded.agent_version, received_at = excluded.received_at,
                 drift = excluded.drift, features = excluded.features",
        )
        .bind(&status.cluster)
        .bind(status.report.applied.as_ref().map(Digest::as_str))
        .bind(status.report.attempted.as_ref().map(Digest::as_str))
        .bind(resources)
        .bind(&status.report.message)
        .bind(&status.report.agent_version)
        .bind(status.received_at_ms)
        .bind(drift)
        .bind(status.report.features.join(","))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        bump_counter(&mut tx, META_CHANGES).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(())
    }

    /// A number that changes with every write of what hubs serve or show (renders,
    /// rollout decisions, status reports): other hubs on the same database poll this
    /// one row and read the rest only when it moved.
    pub async fn changes(&self) -> Result<i64, StoreError> {
        Ok(self
            .meta(META_CHANGES)
            .await?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// The version of the rollouts: it moves on with every write of rollouts. Read it
    /// before the rollouts, and give it to the [`Commit`] that writes them.
    pub async fn rollouts_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .meta(META_ROLLOUTS)
            .await?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// Takes or renews the lease `name` for `holder` for `ttl_ms` on the database's
    /// clock: granted when it is free, lapsed or already this holder's. Returns the
    /// epoch (up by one whenever the lease changes hands or is taken after lapsing),
    /// or `None` while another hub holds it.
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let now = self.now_sql();
        let sql = format!(
            "INSERT INTO hub_leases (name, holder, epoch, expires_at) VALUES ($1, $2, 1, {now} + $3)
             ON CONFLICT (name) DO UPDATE SET
                 epoch = CASE WHEN hub_leases.holder = excluded.holder AND hub_leases.expires_at > {now}
                              THEN hub_leases.epoch ELSE hub_leases.epoch + 1 END,
                 holder = excluded.holder,
                 expires_at = excluded.expires_at
             WHERE hub_leases.holder = excluded.holder OR hub_leases.expires_at <= {now}
             RETURNING epoch"
        );
        let row = sqlx::query(&sql)
            .bind(name)
            .bind(holder)
            .bind(ttl_ms)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.map(|r| r.get("epoch")))
    }

    /// Gives the lease up (a hub stopping), so another takes it at once.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE hub_leases SET expires_at = 0 WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(())
    }

    /// The database's clock, in milliseconds since the Unix epoch.
    pub async fn database_now_ms(&self) -> Result<i64, StoreError> {
        let sql = format!("SELECT {} AS now", self.now_sql());
        let row = sqlx::query(&sql)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.get("now"))
    }

    /// The SQL for "now in milliseconds" on this engine: the one place the two
    /// engines' SQL differs.
    fn now_sql(&self) -> &'static str {
        match self.engine {
            Engine::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS BIGINT)",
            Engine::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// Every agent's last report.
    /// [`Store::statuses`] by cluster.
    pub async fn statuses_by_cluster(
        &self,
    ) -> Result<std::collections::HashMap<String, StoredStatus>, StoreError> {
        Ok(self
            .statuses()
            .await?
            .into_iter()
            .map(|s| (s.cluster.clone(), s))
            .collect())
    }

    pub async fn statuses(&self) -> Result<Vec<StoredStatus>, StoreError> {
        let rows = sqlx::query(
            "SELECT cluster, applied, attempted, resources, message, agent_version, received_at, drift, features
             FROM agent_status ORDER BY cluster",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                let optional_digest = |column: &'static str| -> Result<Option<Digest>, StoreError> {
                    row.get::<Option<String>, _>(column)
                        .map(|text| parse_digest("agent_status", column, text))
                        .transpose()
                };
                let resources: String = row.get("resources");
                let drift: String = row.get("drift");
                let features: String = row.get("features");
                Ok(StoredStatus {
                    cluster: row.get("cluster"),
                    report: StatusReport {
                        applied: optional_digest("applied")?,
                        attempted: optional_digest("attempted")?,
                        resources: serde_json::from_str(&resources).map_err(|e| {
                            StoreError::Malformed {
                                table: "agent_status",
                                column: "resources",
                                message: e.to_string(),
                            }
                        })?,
                        message: row.get("message"),
                        agent_version: row.get("agent_version"),
                        drift: serde_json::from_str(&drift).map_err(|e| StoreError::Malformed {
                            table: "agent_status",
                            column: "drift",
                            message: e.to_string(),
                        })?,
                        features: flotilla_core::bundle::features::parse(&features)
                            .into_iter()
                            .map(str::to_string)
                            .collect(),
                    },
                    received_at_ms: row.get("received_at"),
                })
            })
            .collect()
    }

    /// Stores a new token (its hash only).
    pub async fn insert_token(&self, token: &StoredToken) -> Result<(), StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        sqlx::query(
            "INSERT INTO tokens (id, hash, cluster, admin, created_at, revoked_at, role, tenant) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&token.id)
        .bind(&token.hash)
        .bind(&token.cluster)
        .bind(token.admin)
        .bind(token.created_at_ms)
        .bind(token.revoked_at_ms)
        .bind(token.role.map(Role::as_str))
        .bind(&token.tenant)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        bump_tokens_generation(&mut tx).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(())
    }

    /// Revokes the token with this id (or id prefix, if it names exactly one token).
    /// Returns the revoked token.
    pub async fn revoke_token(&self, id: &str, now_ms: i64) -> Result<StoredToken, StoreError> {
        let tokens = self.tokens().await?;
        let matches: Vec<&StoredToken> = tokens
            .iter()
            .filter(|t| t.id == id || (id.len() >= 4 && t.id.starts_with(id)))
            .collect();
        let token = match matches.as_slice() {
            [one] => (*one).clone(),
            [] => {
                return Err(TokenError::NoSuchId { id: id.to_string() }.into());
            }
            _ => {
                return Err(TokenError::Ambiguous {
                    id: id.to_string(),
                    count: matches.len(),
                }
                .into());
            }
        };
        if token.revoked_at_ms.is_some() {
            return Ok(token);
        }
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2")
            .bind(now_ms)
            .bind(&token.id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        bump_tokens_generation(&mut tx).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(StoredToken {
            revoked_at_ms: Some(now_ms),
            ..token
        })
    }

    /// Every token, revoked ones included, oldest first.
    pub async fn tokens(&self) -> Result<Vec<StoredToken>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, hash, cluster, CAST(admin AS INTEGER) AS admin, created_at, revoked_at, role, tenant FROM tokens ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        Ok(rows
            .iter()
            .map(|row| StoredToken {
                id: row.get("id"),
                hash: row.get("hash"),
                cluster: row.get("cluster"),
                admin: flag(row, "admin"),
                // A role this hub does not know reads as none: such a token grants
                // nothing here.
                role: row
                    .get::<Option<String>, _>("role")
                    .and_then(|role| Role::parse(&role).ok()),
                tenant: row.get("tenant"),
                created_at_ms: row.get("created_at"),
                revoked_at_ms: row.get("revoked_at"),
            })
            .collect())
    }

    /// A number that changes whenever a token is created or revoked, so a running hub
    /// can notice changes made by `flotilla token` with one cheap query.
    pub async fn tokens_generation(&self) -> Result<i64, StoreError> {
        Ok(self
            .meta(META_TOKENS)
            .await?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }
}

/// Connects to the database and applies the migrations.
async fn connect(
    state_dir: &Path,
    database: &Database,
) -> Result<(AnyPool, Engine, Option<sqlx::AnyConnection>), StoreError> {
    let db_path = database.display(state_dir);
    let db_error = |source| StoreError::Database {
        path: db_path.clone(),
        source,
    };
    sqlx::any::install_default_drivers();
    let mut first = None;
    let (engine, options, max_connections) = match database {
        Database::StateDir | Database::Sqlite(_) => {
            let db_file = match database {
                Database::Sqlite(path) => path.clone(),
                _ => state_dir.join(DATABASE_FILE),
            };
            // SQLite creates its journal files with the database's permissions, so
            // a private database file keeps all of them private.
            let created =
                create_private_file(&db_file).map_err(|source| StoreError::CreateDir {
                    path: db_path.clone(),
                    source,
                })?;
            let not_a_store = |reason: String| StoreError::NotAStore {
                path: db_path.clone(),
                reason,
            };
            if !created {
                check_not_empty(&db_file).map_err(not_a_store)?;
            }
            let url = SqliteConnectOptions::new()
                .filename(&db_file)
                .create_if_missing(true)
                .to_url_lossy();
            let options = AnyConnectOptions::from_url(&url).map_err(db_error)?;
            first = Some(check_sqlite_tables(&options, created).await.map_err(
                |err| match err {
                    Ok(reason) => not_a_store(reason),
                    Err(source) if not_a_sqlite_database(&source, &db_file) => {
                        not_a_store(NOT_SQLITE.to_string())
                    }
                    Err(source) => db_error(source),
                },
            )?);
            (Engine::Sqlite, options, 4)
        }
        Database::Postgres(url) => (
            Engine::Postgres,
            AnyConnectOptions::from_str(url).map_err(db_error)?,
            8,
        ),
    };
    let pool = AnyPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(move |connection, _| {
            Box::pin(async move {
                if engine == Engine::Sqlite {
                    for pragma in SQLITE_PRAGMAS {
                        sqlx::Executor::execute(&mut *connection, pragma).await?;
                    }
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .map_err(db_error)?;
    // A store a newer flotilla has migrated further still opens: its migrations only
    // add (tables, columns with defaults), so this version reads and writes what it
    // knows. Without this, one hub upgraded first on a shared database would stop the
    // others (and older command lines, and a rollback) from starting.
    let mut migrator = sqlx::migrate::Migrator::new(EmbeddedMigrations(MIGRATIONS))
        .await
        .map_err(|source| db_error(source.into()))?;
    migrator.set_ignore_missing(true);
    migrator
        .run(&pool)
        .await
        .map_err(|source| db_error(source.into()))?;
    // The rollouts' version is compared in place (see `Commit::rollouts_version`), so
    // its row exists from the start.
    sqlx::query("INSERT INTO hub_meta (key, value) VALUES ($1, '0') ON CONFLICT (key) DO NOTHING")
        .bind(META_ROLLOUTS)
        .execute(&pool)
        .await
        .map_err(db_error)?;
    Ok((pool, engine, first))
}

/// Through sqlx's `Any` driver SQLite's settings are set on each connection: a
/// write-ahead log (readers never wait for the writer), every commit synced, and
/// writers wait for each other.
const SQLITE_PRAGMAS: [&str; 4] = [
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",
    "PRAGMA busy_timeout = 10000",
    "PRAGMA foreign_keys = ON",
];

/// An existing database file must not be empty: SQLite takes an empty file for a new
/// database, but a store that lost its contents (to a full disk or a failed copy)
/// would then silently start over without its tokens. Only the file's size is read:
/// this process may already hold SQLite connections to the file (the hub's first-run
/// hint opens the store a second time), and opening and closing any descriptor of it
/// outside SQLite would drop every POSIX lock the process holds on it. Another process
/// (`flotilla token create`) would then take itself for the last connection and
/// delete the write-ahead log under the running hub, which then never sees what that
/// process wrote and fails its own next writes.
fn check_not_empty(path: &Path) -> Result<(), String> {
    let metadata = std::fs::metadata(path).map_err(|err| format!("cannot be read: {err}"))?;
    if metadata.len() == 0 {
        return Err(format!(
            "is an empty file (0 bytes), not a flotilla store: a store that lost its contents (a full disk, a failed copy or restore)? \
             Restore it from a backup, or remove it to start a new store (every token and the rollouts' state are then made anew): rm {}",
            path.display()
        ));
    }
    Ok(())
}

/// Why a file SQLite will not read as a database is not taken for a store.
const NOT_SQLITE: &str = "is not a SQLite database (it does not start with SQLite's header), so not a flotilla store: give the hub a --state-dir of its own, or --database for its tables";

/// The 16 bytes every SQLite database file starts with.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Whether SQLite refused the file as no database at all (`SQLITE_NOTADB`) and it
/// does not start with SQLite's header (a damaged database keeps SQLite's own
/// reason). The header is read only here, after SQLite refused the file, so no
/// connection of this process to a good database can lose its locks to it.
fn not_a_sqlite_database(error: &sqlx::Error, path: &Path) -> bool {
    use std::io::Read as _;
    let notadb = matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("26"));
    if !notadb {
        return false;
    }
    let mut header = Vec::with_capacity(SQLITE_HEADER.len());
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(SQLITE_HEADER.len() as u64)
                .read_to_end(&mut header)
        })
        .is_ok_and(|_| header != SQLITE_HEADER)
}

/// Opens one connection to a SQLite database and reads its list of tables, so a
/// damaged file fails here at once with SQLite's own reason (a pool would retry it
/// until its timeout). `Ok(reason)` for a database that has tables, none of them
/// flotilla's, unless `created` (flotilla made the file just now). The connection is
/// given back open: see [`Store::first`](Store).
async fn check_sqlite_tables(
    options: &AnyConnectOptions,
    created: bool,
) -> Result<sqlx::AnyConnection, Result<String, sqlx::Error>> {
    use sqlx::Connection as _;
    let mut connection = sqlx::AnyConnection::connect_with(options)
        .await
        .map_err(Err)?;
    let tables: Result<Vec<String>, sqlx::Error> =
        sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut connection)
            .await
            .map(|rows| rows.iter().map(|row| row.get("name")).collect());
    let tables = match tables {
        Ok(tables) => tables,
        Err(err) => {
            let _ = connection.close().await;
            return Err(Err(err));
        }
    };
    let ours = ["_sqlx_migrations", "hub_meta"];
    if created || tables.is_empty() || tables.iter().any(|t| ours.contains(&t.as_str())) {
        // The settings each pooled connection makes, once here, where a failure
        // is told at once.
        let mut set = Ok(());
        for pragma in SQLITE_PRAGMAS {
            if let Err(err) = sqlx::Executor::execute(&mut connection, pragma).await {
                set = Err(err);
                break;
            }
        }
        return match set {
            Ok(()) => Ok(connection),
            Err(err) => {
                let _ = connection.close().await;
                Err(Err(err))
            }
        };
    }
    let _ = connection.close().await;
    let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
    Err(Ok(format!(
        "is a SQLite database, but not a flotilla store (its tables are {}{}, and none is flotilla's): give the hub a --state-dir of its own, or --database for its tables",
        shown.join(", "),
        if tables.len() > shown.len() {
            ", …"
        } else {
            ""
        }
    )))
}

/// The next generation of served changes: the counter moved on and read in one
/// statement, so two writers never share a number (read, then written, two
/// PostgreSQL transactions at once both took the same one).
async fn next_generation(tx: &mut Tx<'_>) -> Result<i64, sqlx::Error> {
    let value: String = sqlx::query(&format!("{BUMP_COUNTER} RETURNING value"))
        .bind(META_GENERATION)
        .fetch_one(&mut **tx)
        .await?
        .get("value");
    value
        .parse()
        .map_err(|err| sqlx::Error::Decode(format!("hub_meta {META_GENERATION}: {err}").into()))
}

/// A stored sequence as the unsigned number it is.
fn sequence_of(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Malformed {
        table: "serve_sequences",
        column: "sequence",
        message: format!("{value} is negative"),
    })
}

/// Rows written by one statement: at six columns, well under the bound-parameter
/// limits of SQLite (32,766) and PostgreSQL (65,535).
const ROWS_PER_STATEMENT: usize = 500;

/// The placeholders of a statement with many parameters, numbered in the order they
/// are bound: `$1, $2, …` on PostgreSQL, and on SQLite plain `?` (numbered left to
/// right). SQLite finds a numbered parameter's name by walking a list of all of them,
/// and sqlx asks for the name of each parameter it binds: a statement of 500 rows of
/// six columns took about 12 ms to bind with `$N`, so recording a render changing
/// 10,000 clusters spent most of its second there.
#[derive(Debug)]
struct Placeholders {
    numbered: bool,
    /// The number of the last placeholder given.
    given: usize,
}

impl Placeholders {
    /// Placeholders for one statement on `connection`, numbered from 1.
    fn of(connection: &sqlx::AnyConnection) -> Placeholders {
        Placeholders {
            numbered: connection.backend_name() != <sqlx::Sqlite as sqlx::Database>::NAME,
            given: 0,
        }
    }

    /// The next placeholder: `$3` or `?`.
    fn next(&mut self) -> std::borrow::Cow<'static, str> {
        self.given += 1;
        if self.numbered {
            format!("${}", self.given).into()
        } else {
            "?".into()
        }
    }

    /// `$1, $2, $3`: the next `count` placeholders.
    fn list(&mut self, count: usize) -> String {
        (0..count)
            .map(|_| self.next())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `($1, $2), ($3, $4)`: `rows` tuples of the next `columns` placeholders.
    fn rows(&mut self, rows: usize, columns: usize) -> String {
        (0..rows)
            .map(|_| format!("({})", self.list(columns)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `items` in runs of at most [`ROWS_PER_STATEMENT`], a new run starting where a key
/// comes again, so that no statement writes one row twice (PostgreSQL refuses an
/// upsert that does) and later writes of a key still follow earlier ones.
fn chunks_by_key<T>(items: &[T], key: impl Fn(&T) -> &str) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        if i - start == ROWS_PER_STATEMENT || !seen.insert(key(item)) {
            chunks.push(&items[start..i]);
            start = i;
            seen.clear();
            seen.insert(key(item));
        }
    }
    if start < items.len() {
        chunks.push(&items[start..]);
    }
    chunks
}

/// Runs `sql`, whose `{}` is replaced by one placeholder per value, with `values`.
async fn select_in(
    connection: &mut sqlx::AnyConnection,
    sql: &str,
    values: &[&str],
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let sql = sql.replace("{}", &Placeholders::of(connection).list(values.len()));
    let mut query = sqlx::query(&sql);
    for value in values {
        query = query.bind(*value);
    }
    query.fetch_all(connection).await
}

/// Writes a clean render's `rendered` rows, adding the digests they replace to `candidates`.
async fn write_rendered(
    tx: &mut Tx<'_>,
    rendered: &[RenderedCluster],
    candidates: &mut BTreeSet<String>,
) -> Result<(), sqlx::Error> {
    // Many rows to a statement: a commit that changes 10,000 clusters is a few
    // dozen statements, not tens of thousands (each a round trip to PostgreSQL).
    for chunk in chunks_by_key(rendered, |row| &row.cluster) {
        let names: Vec<&str> = chunk.iter().map(|row| row.cluster.as_str()).collect();
        let old = select_in(
            tx,
            "SELECT digest FROM rendered WHERE cluster IN ({})",
            &names,
        )
        .await?;
        candidates.extend(old.iter().map(|row| row.get::<String, _>("digest")));
        let sql = format!(
            "INSERT INTO rendered (cluster, digest, revision, policy, wave, paused)
             VALUES {}
             ON CONFLICT (cluster) DO UPDATE SET digest = excluded.digest,
                 revision = excluded.revision, policy = excluded.policy,
                 wave = excluded.wave, paused = excluded.paused",
            Placeholders::of(tx).rows(chunk.len(), 6)
        );
        let mut query = sqlx::query(&sql);
        for row in chunk {
            query = query
                .bind(&row.cluster)
                .bind(row.digest.as_str())
                .bind(&row.revision)
                .bind(&row.policy)
                .bind(&row.wave)
                .bind(row.paused);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Deletes removed clusters' rows, adding the digests they held to `candidates`.
async fn remove_clusters(
    tx: &mut Tx<'_>,
    removed: &[String],
    candidates: &mut BTreeSet<String>,
) -> Result<(), sqlx::Error> {
    for name in removed {
        for query in [
            "SELECT digest FROM bundle_history WHERE cluster = $1",
            "SELECT digest FROM rendered WHERE cluster = $1",
        ] {
            let digests: Vec<String> = sqlx::query(query)
                .bind(name)
                .fetch_all(&mut **tx)
                .await?
                .iter()
                .map(|row| row.get("digest"))
                .collect();
            candidates.extend(digests);
        }
        for table in [
            "DELETE FROM bundle_history WHERE cluster = $1",
            "DELETE FROM clusters WHERE name = $1",
            "DELETE FROM rendered WHERE cluster = $1",
            "DELETE FROM agent_status WHERE cluster = $1",
            "DELETE FROM cluster_seen WHERE cluster = $1",
        ] {
            sqlx::query(table).bind(name).execute(&mut **tx).await?;
        }
    }
    Ok(())
}

/// Records changes of what clusters are served (no cluster twice in `changes`): each
/// `clusters` row (its serve sequence moved up: the change's time in milliseconds, or
/// one more than before if that is higher, continuing the sequence of a cluster that
/// left and came back) and, for a digest really served, its history. Returns each
/// cluster's new sequence.
async fn write_served(
    tx: &mut Tx<'_>,
    changes: &[ServedChange],
    generation: i64,
    commit: &Commit,
    candidates: &mut BTreeSet<String>,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let names: Vec<&str> = changes.iter().map(|c| c.cluster.as_str()).collect();
    let old = select_in(tx, "SELECT digest FROM clusters WHERE name IN ({})", &names).await?;
    candidates.extend(old.iter().map(|row| row.get::<String, _>("digest")));
    let sequences = move_serve_sequences(tx, changes, commit.now_ms).await?;
    upsert_served_clusters(tx, changes, commit.now_ms, &sequences).await?;
    let written = changes
        .iter()
        .map(|c| Ok((c.cluster.clone(), served_sequence(&sequences, &c.cluster)?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;

    // History, for digests really served (not a hold).
    let kept: Vec<&ServedChange> = changes.iter().filter(|c| !c.hold).collect();
    if kept.is_empty() {
        return Ok(written);
    }
    insert_history(tx, &kept, generation).await?;
    let trimmed = history_beyond(tx, &kept, commit.history).await?;
    delete_history(tx, &trimmed).await?;
    candidates.extend(trimmed.into_iter().map(|(_, digest)| digest));
    Ok(written)
}

/// Moves each changed cluster's serve sequence up, returning the new ones by cluster.
async fn move_serve_sequences(
    tx: &mut Tx<'_>,
    changes: &[ServedChange],
    now_ms: i64,
) -> Result<HashMap<String, i64>, sqlx::Error> {
    // The sequence is the change's time in milliseconds, or one more than the last
    // one when that is higher: it goes up on every change, and a store that was lost
    // or restored from a backup still signs above what agents hold.
    let sql = format!(
        "INSERT INTO serve_sequences (cluster, sequence) VALUES {}
         ON CONFLICT (cluster) DO UPDATE SET sequence =
             CASE WHEN serve_sequences.sequence + 1 > excluded.sequence
                  THEN serve_sequences.sequence + 1
                  ELSE excluded.sequence END
         RETURNING cluster, sequence",
        Placeholders::of(tx).rows(changes.len(), 2)
    );
    let mut query = sqlx::query(&sql);
    for change in changes {
        query = query.bind(&change.cluster).bind(now_ms.max(1));
    }
    Ok(query
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|row| (row.get("cluster"), row.get("sequence")))
        .collect())
}

/// The new serve sequence of `cluster`, which [`move_serve_sequences`] returned.
fn served_sequence(sequences: &HashMap<String, i64>, cluster: &str) -> Result<i64, sqlx::Error> {
    sequences
        .get(cluster)
        .copied()
        .ok_or_else(|| sqlx::Error::RowNotFound)
}

/// Writes each changed cluster's `clusters` row with its new serve sequence.
async fn upsert_served_clusters(
    tx: &mut Tx<'_>,
    changes: &[ServedChange],
    now_ms: i64,
    sequences: &HashMap<String, i64>,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO clusters (name, digest, revision, updated_at, hold, serve_sequence)
         VALUES {}
         ON CONFLICT (name) DO UPDATE SET digest = excluded.digest,
             revision = excluded.revision, updated_at = excluded.updated_at,
             hold = excluded.hold, serve_sequence = excluded.serve_sequence",
        Placeholders::of(tx).rows(changes.len(), 6)
    );
    let mut query = sqlx::query(&sql);
    for change in changes {
        query = query
            .bind(&change.cluster)
            .bind(change.digest.as_str())
            .bind(&change.revision)
            .bind(now_ms)
            .bind(change.hold)
            .bind(served_sequence(sequences, &change.cluster)?);
    }
    query.execute(&mut **tx).await?;
    Ok(())
}

/// Adds the served digests to their clusters' history under `generation`.
async fn insert_history(
    tx: &mut Tx<'_>,
    kept: &[&ServedChange],
    generation: i64,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO bundle_history (cluster, digest, revision, generation) VALUES {}
         ON CONFLICT (cluster, digest) DO UPDATE SET generation = excluded.generation",
        Placeholders::of(tx).rows(kept.len(), 4)
    );
    let mut query = sqlx::query(&sql);
    for change in kept {
        query = query
            .bind(&change.cluster)
            .bind(change.digest.as_str())
            .bind(&change.revision)
            .bind(generation);
    }
    query.execute(&mut **tx).await?;
    Ok(())
}

/// The (cluster, digest) history entries past the newest `history` of each cluster.
async fn history_beyond(
    tx: &mut Tx<'_>,
    kept: &[&ServedChange],
    history: usize,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let names: Vec<&str> = kept.iter().map(|c| c.cluster.as_str()).collect();
    let rows = select_in(
        tx,
        "SELECT cluster, digest FROM bundle_history WHERE cluster IN ({})
         ORDER BY cluster, generation DESC",
        &names,
    )
    .await?;
    let mut trimmed: Vec<(String, String)> = Vec::new();
    let mut current: Option<String> = None;
    let mut kept_of_cluster = 0;
    for row in &rows {
        let cluster: String = row.get("cluster");
        if current.as_deref() != Some(cluster.as_str()) {
            current = Some(cluster.clone());
            kept_of_cluster = 0;
        }
        kept_of_cluster += 1;
        if kept_of_cluster > history.max(1) {
            trimmed.push((cluster, row.get("digest")));
        }
    }
    Ok(trimmed)
}

/// Deletes the given (cluster, digest) history entries, many to a statement.
async fn delete_history(tx: &mut Tx<'_>, trimmed: &[(String, String)]) -> Result<(), sqlx::Error> {
    for chunk in trimmed.chunks(ROWS_PER_STATEMENT) {
        let mut placeholders = Placeholders::of(tx);
        let condition: Vec<String> = (0..chunk.len())
            .map(|_| {
                let (cluster, digest) = (placeholders.next(), placeholders.next());
                format!("(cluster = {cluster} AND digest = {digest})")
            })
            .collect();
        let sql = format!(
            "DELETE FROM bundle_history WHERE {}",
            condition.join(" OR ")
        );
        let mut query = sqlx::query(&sql);
        for (cluster, digest) in chunk {
            query = query.bind(cluster).bind(digest);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// The digests of `candidates` nothing refers to any more: not in a cluster's
/// history, not what it is served, not what HEAD renders for it, not the previous or
/// new digest of a rollout that has not ended. In sorted order.
async fn unreferenced_of(
    tx: &mut Tx<'_>,
    candidates: BTreeSet<String>,
) -> Result<Vec<String>, sqlx::Error> {
    let mut left = candidates;
    for sql in [
        "SELECT DISTINCT digest FROM bundle_history WHERE digest IN ({})",
        "SELECT DISTINCT digest FROM clusters WHERE digest IN ({})",
        "SELECT DISTINCT digest FROM rendered WHERE digest IN ({})",
        "SELECT DISTINCT c.previous AS digest FROM rollout_clusters c
         JOIN rollouts r ON r.id = c.rollout_id
         WHERE r.ended_at IS NULL AND c.previous IN ({})",
        "SELECT DISTINCT c.target AS digest FROM rollout_clusters c
         JOIN rollouts r ON r.id = c.rollout_id
         WHERE r.ended_at IS NULL AND c.target IN ({})",
    ] {
        if left.is_empty() {
            break;
        }
        let asked: Vec<String> = left.iter().cloned().collect();
        for chunk in asked.chunks(ROWS_PER_STATEMENT) {
            let values: Vec<&str> = chunk.iter().map(String::as_str).collect();
            for row in select_in(tx, sql, &values).await? {
                left.remove(&row.get::<String, _>("digest"));
            }
        }
    }
    Ok(left.into_iter().collect())
}

async fn set_meta(tx: &mut Tx<'_>, key: &str, value: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO hub_meta (key, value) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(key)
    .bind(value)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn bump_tokens_generation(tx: &mut Tx<'_>) -> Result<(), sqlx::Error> {
    bump_counter(tx, META_TOKENS).await
}

/// The SQL that adds one to a counter in `hub_meta`, in one statement (row-locked
/// on PostgreSQL), so concurrent writers on several hubs never lose an increment.
const BUMP_COUNTER: &str = "INSERT INTO hub_meta (key, value) VALUES ($1, '1')
     ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(hub_meta.value AS BIGINT) + 1 AS TEXT)";

/// Adds one to a counter in `hub_meta` ([`BUMP_COUNTER`]).
async fn bump_counter(tx: &mut Tx<'_>, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query(BUMP_COUNTER)
        .bind(key)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A boolean column, selected as `CAST(column AS INTEGER) AS column`: sqlx's `Any`
/// driver reads no SQLite BOOLEAN column, and an integer reads the same on both
/// engines.
fn flag(row: &AnyRow, column: &str) -> bool {
    row.get::<i64, _>(column) != 0
}

fn parse_digest(
    table: &'static str,
    column: &'static str,
    text: String,
) -> Result<Digest, StoreError> {
    Digest::parse(&text).map_err(|e| StoreError::Malformed {
        table,
        column,
        message: e.to_string(),
    })
}

/// Creates `path` empty with mode 0600 unless it exists.
/// Creates `path` empty and private unless it exists; whether it was created.
fn create_private_file(path: &Path) -> std::io::Result<bool> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `migrations/<version>_<description>.sql` is compiled in, with its
    /// content (sqlx checks a recorded migration by the checksum of its SQL).
    #[test]
    fn every_migration_file_is_compiled_in() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<(i64, String, String)> = std::fs::read_dir(&folder)
            .expect("migrations/")
            .map(|entry| {
                let path = entry.expect("entry").path();
                let name = path
                    .file_stem()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned();
                let (version, description) = name.split_once('_').expect("VERSION_DESCRIPTION");
                let sql = std::fs::read_to_string(&path).expect("readable");
                (
                    version.parse().expect("a numeric version"),
                    description.replace('_', " "),
                    sql,
                )
            })
            .collect();
        files.sort();
        let compiled: Vec<(i64, String, String)> = MIGRATIONS
            .iter()
            .map(|(v, d, s)| (*v, d.to_string(), s.to_string()))
            .collect();
        assert_eq!(
            compiled, files,
            "list every file of migrations/ in MIGRATIONS"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_state_dir_database_and_objects_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("state");
        let store = Store::open(&root).await.expect("opens");
        let bytes = b"[]".as_slice();
        let d = Digest::of(bytes);
        store
            .objects
            .write_all(vec![(d.clone(), bytes.to_vec())])
            .await
            .expect("writes");
        store.close().await;
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("flotilla.db")), 0o600);
        assert_eq!(mode(&root.join("objects/sha256")), 0o700);
        assert_eq!(mode(&store.objects.path_of(&d).expect("on disk")), 0o600);
    }

    /// A store made before the schema moved into migrations holds the tables but no
    /// record of migrations: it opens, and keeps what it holds.
    #[tokio::test]
    async fn a_store_from_before_migrations_opens_and_keeps_its_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let options = SqliteConnectOptions::from_str("sqlite://")
                .expect("options")
                .filename(dir.path().join("flotilla.db"))
                .create_if_missing(true);
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .connect_with(options)
                .await
                .expect("connects");
            let schema = include_str!("../../migrations/0001_initial.sql");
            sqlx::raw_sql(schema).execute(&pool).await.expect("schema");
            sqlx::query(
                "INSERT INTO clusters (name, digest, revision, updated_at) VALUES ($1, $2, $3, 0)",
            )
            .bind("red")
            .bind(digest('a').as_str())
            .bind("main@sha1:1")
            .execute(&pool)
            .await
            .expect("insert");
            pool.close().await;
        }
        let store = Store::open(dir.path()).await.expect("opens");
        let clusters = store.clusters().await.expect("reads");
        assert_eq!(clusters, [changed("red", 'a', "main@sha1:1")]);
        store.close().await;
    }

    /// A cluster's last-seen time never goes back, whichever hub writes last.
    #[tokio::test]
    async fn a_last_seen_time_never_goes_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("opens");
        store
            .put_seen(&[("red".into(), 2_000)])
            .await
            .expect("writes");
        store
            .put_seen(&[("red".into(), 1_000), ("blue".into(), 1_000)])
            .await
            .expect("writes");
        let seen: BTreeMap<String, i64> = store.seen().await.expect("reads").into_iter().collect();
        assert_eq!(seen.get("red"), Some(&2_000));
        assert_eq!(seen.get("blue"), Some(&1_000));
        store.close().await;
    }

    /// A hub that lost the lease while it worked fences its write with epoch 0,
    /// which no lease has: the store refuses it (an unfenced write went through).
    #[tokio::test]
    async fn a_write_of_a_hub_that_lost_the_lease_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("opens");
        let epoch = store
            .acquire_lease("rollouts", "hub-a", 60_000)
            .await
            .expect("asks")
            .expect("granted");
        assert!(epoch >= 1);
        let fenced = |epoch| Commit {
            revision: Some("main@sha1:1".into()),
            history: 5,
            now_ms: 1,
            fence: Some(Fence {
                lease: "rollouts".into(),
                holder: "hub-a".into(),
                epoch,
            }),
            ..Commit::default()
        };
        assert!(matches!(
            store.commit(&fenced(0)).await,
            Err(StoreError::Fenced { epoch: 0, .. })
        ));
        store
            .commit(&fenced(epoch))
            .await
            .expect("the holder writes");
        // What a shared lease that was lost fences with.
        let lease = crate::recorder::lease::Lease::shared();
        assert_eq!(lease.fence().map(|f| f.epoch), Some(0));
        store.close().await;
    }

    #[test]
    fn database_passwords_are_hidden_wherever_the_url_holds_them() {
        assert_eq!(
            redact_password("postgres://flotilla:s3cret@db:5432/fleet"),
            "postgres://flotilla:…@db:5432/fleet"
        );
        assert_eq!(
            redact_password("postgres://db/fleet?user=flotilla&password=s3cret&sslmode=require"),
            "postgres://db/fleet?user=flotilla&password=…&sslmode=require"
        );
        assert_eq!(
            redact_password("postgres://u:p@db/fleet?sslpassword=k3y"),
            "postgres://u:…@db/fleet?sslpassword=…"
        );
        assert_eq!(
            redact_password("postgres://db/fleet"),
            "postgres://db/fleet"
        );
    }

    /// A store that a newer flotilla migrated further (a migration this version does
    /// not know is recorded) opens, and keeps what it holds.
    #[tokio::test]
    async fn a_store_migrated_by_a_newer_version_still_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).await.expect("opens");
        store
            .insert_token(&crate::store::StoredToken {
                id: "newer1".into(),
                hash: "0".repeat(64),
                cluster: Some("red".into()),
                admin: false,
                role: None,
                tenant: None,
                created_at_ms: 0,
                revoked_at_ms: None,
            })
            .await
            .expect("a token");
        store.close().await;
        {
            let options = SqliteConnectOptions::from_str("sqlite://")
                .expect("options")
                .filename(dir.path().join("flotilla.db"));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .connect_with(options)
                .await
                .expect("connects");
            sqlx::raw_sql(
                "CREATE TABLE later_feature (id INTEGER PRIMARY KEY); \
                 INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES (9999, 'a later feature', 1, x'00', 0);",
            )
            .execute(&pool)
            .await
            .expect("a later migration");
            pool.close().await;
        }
        let store = Store::open(dir.path())
            .await
            .expect("opens after a newer version");
        let tokens = store.tokens().await.expect("reads");
        assert!(tokens.iter().any(|t| t.id == "newer1"), "{tokens:?}");
        store.close().await;
    }

    /// A store written before people's tokens had roles, on either engine: its admin
    /// tokens become admins and its cluster tokens stay cluster tokens.
    async fn tokens_from_before_roles_keep_what_they_granted(dir: &Path, database: Database) {
        let url = match &database {
            Database::Postgres(url) => url.clone(),
            _ => format!("sqlite://{}?mode=rwc", dir.join("flotilla.db").display()),
        };
        {
            sqlx::any::install_default_drivers();
            let pool = AnyPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .expect("connects");
            let before_roles = MIGRATIONS
                .iter()
                .position(|(version, ..)| *version == 10)
                .expect("the roles' migration");
            sqlx::migrate::Migrator::new(EmbeddedMigrations(&MIGRATIONS[..before_roles]))
                .await
                .expect("migrator")
                .run(&pool)
                .await
                .expect("migrates");
            for (id, cluster, admin) in [("adm1", None, true), ("edge1", Some("red"), false)] {
                sqlx::query(
                    "INSERT INTO tokens (id, hash, cluster, admin, created_at) VALUES ($1, $2, $3, $4, 0)",
                )
                .bind(id)
                .bind(format!("hash-{id}"))
                .bind(cluster)
                .bind(admin)
                .execute(&pool)
                .await
                .expect("insert");
            }
            pool.close().await;
        }
        let store = Store::open_with(dir, &database).await.expect("opens");
        let tokens = store.tokens().await.expect("reads");
        let grants: Vec<_> = tokens
            .iter()
            .map(|t| (t.id.as_str(), t.cluster.as_deref(), t.admin, t.role))
            .collect();
        assert_eq!(
            grants,
            [
                ("adm1", None, true, Some(Role::Admin)),
                ("edge1", Some("red"), false, None)
            ]
        );
        store.close().await;
    }

    #[tokio::test]
    async fn sqlite_tokens_from_before_roles_keep_what_they_granted() {
        let dir = tempfile::tempdir().expect("tempdir");
        tokens_from_before_roles_keep_what_they_granted(dir.path(), Database::StateDir).await;
    }

    #[tokio::test]
    async fn postgres_tokens_from_before_roles_keep_what_they_granted() {
        let test = "store::postgres_tokens_from_before_roles_keep_what_they_granted";
        let Some(url) = flotilla_testkit::postgres_database(test).await else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        tokens_from_before_roles_keep_what_they_granted(dir.path(), Database::Postgres(url)).await;
    }

    fn digest(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    fn changed(name: &str, c: char, revision: &str) -> StoredCluster {
        StoredCluster {
            name: name.into(),
            digest: digest(c),
            revision: revision.into(),
            hold: false,
            sequence: 0,
        }
    }

    /// Runs a store test on SQLite and, in a second test, on a fresh PostgreSQL
    /// database (skipped with a reason when no server is given, failed in CI).
    macro_rules! on_both_engines {
        ($name:ident) => {
            mod $name {
                #[tokio::test]
                async fn sqlite() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let store = super::Store::open(dir.path()).await.expect("open");
                    super::$name(store).await;
                }

                #[tokio::test]
                async fn postgres() {
                    let test = concat!("store::", stringify!($name), "::postgres");
                    let Some(url) = flotilla_testkit::postgres_database(test).await else {
                        return;
                    };
                    let dir = tempfile::tempdir().expect("temp dir");
                    let database = super::Database::Postgres(url);
                    let store = super::Store::open_with(dir.path(), &database)
                        .await
                        .expect("open");
                    assert_eq!(store.engine(), super::Engine::Postgres);
                    super::$name(store).await;
                }
            }
        };
    }

    on_both_engines!(placeholders_are_numbered_on_postgres_only);
    /// SQLite binds plain `?` placeholders quickly and numbered ones slowly; PostgreSQL
    /// takes only numbered ones.
    async fn placeholders_are_numbered_on_postgres_only(store: Store) {
        let connection = store.pool.acquire().await.expect("connection");
        assert_eq!(
            Placeholders::of(&connection).numbered,
            store.engine() == Engine::Postgres
        );
    }

    on_both_engines!(last_seen_times_are_written_in_batches);
    /// More clusters than one statement takes, a cluster named twice, and a second batch
    /// that moves some times: every cluster reads back with its latest time.
    async fn last_seen_times_are_written_in_batches(store: Store) {
        let count = SEEN_ROWS_PER_STATEMENT * 2 + 7;
        let mut batch: Vec<(String, i64)> = (0..count)
            .map(|i| (format!("c{i:04}"), 1_000 + i as i64))
            .collect();
        batch.push(("c0003".into(), 5));
        batch.push(("c0005".into(), 9_999));
        store.put_seen(&batch).await.expect("first batch");
        let moved: Vec<(String, i64)> = (0..count)
            .step_by(100)
            .map(|i| (format!("c{i:04}"), 50_000 + i as i64))
            .collect();
        store.put_seen(&moved).await.expect("second batch");
        store.put_seen(&[]).await.expect("an empty batch");
        let mut seen = store.seen().await.expect("reads");
        seen.sort();
        let expected: Vec<(String, i64)> = (0..count)
            .map(|i| {
                let at = match i {
                    _ if i % 100 == 0 => 50_000 + i as i64,
                    5 => 9_999,
                    _ => 1_000 + i as i64,
                };
                (format!("c{i:04}"), at)
            })
            .collect();
        assert_eq!(seen, expected);
    }

    on_both_engines!(a_commit_of_more_clusters_than_one_statement_takes_reads_back_whole);
    /// A commit is written many rows to a statement: more clusters than one statement
    /// takes read back as if written one by one.
    async fn a_commit_of_more_clusters_than_one_statement_takes_reads_back_whole(store: Store) {
        let count = ROWS_PER_STATEMENT * 2 + 34;
        let name = |i: usize| format!("c{i:04}");
        let digest_of = |round: usize, i: usize| Digest::of(format!("{round}/{i}").as_bytes());
        let commit = |round: usize, now_ms: i64| {
            let served: Vec<ServedChange> = (0..count)
                .map(|i| ServedChange {
                    cluster: name(i),
                    digest: digest_of(round, i),
                    revision: format!("r{round}"),
                    hold: i % 10 == 3,
                })
                .collect();
            Commit {
                revision: Some(format!("r{round}")),
                rendered: (0..count)
                    .map(|i| RenderedCluster {
                        cluster: name(i),
                        digest: digest_of(round, i),
                        revision: format!("r{round}"),
                        policy: (i.is_multiple_of(2)).then(|| "edge".to_string()),
                        wave: None,
                        paused: i.is_multiple_of(5),
                    })
                    .collect(),
                served,
                history: 1,
                now_ms,
                ..Commit::default()
            }
        };
        let (none, first) = store
            .commit_with_sequences(&commit(1, 1_000))
            .await
            .expect("first commit");
        assert!(none.is_empty(), "{none:?}");
        assert_eq!(first.len(), count);
        assert_eq!(first[&name(0)], 1_000);
        assert_eq!(first[&name(count - 1)], 1_000);
        let (dropped, second) = store
            .commit_with_sequences(&commit(2, 1_000))
            .await
            .expect("second commit");
        // Every cluster moved on; its old digests (rendered, served, kept in a
        // history of one) are no longer referenced.
        let mut expected: Vec<Digest> = (0..count).map(|i| digest_of(1, i)).collect();
        expected.sort();
        assert_eq!(dropped, expected);
        assert_eq!(
            second[&name(0)],
            1_001,
            "one more than before: the clock stood still"
        );

        let clusters = store.clusters().await.expect("clusters");
        assert_eq!(clusters.len(), count);
        for cluster in &clusters {
            let i: usize = cluster.name[1..].parse().expect("number");
            assert_eq!(cluster.digest, digest_of(2, i), "{}", cluster.name);
            assert_eq!(cluster.hold, i % 10 == 3, "{}", cluster.name);
            assert_eq!(cluster.sequence, second[&cluster.name], "{}", cluster.name);
            let history = store.history(&cluster.name).await.expect("history");
            let expect_history = if i % 10 == 3 {
                vec![]
            } else {
                vec![(digest_of(2, i), "r2".to_string())]
            };
            assert_eq!(history, expect_history, "{}", cluster.name);
        }
        let rendered = store.rendered().await.expect("rendered");
        assert_eq!(rendered.len(), count);
        for row in rendered {
            let i: usize = row.cluster[1..].parse().expect("number");
            assert_eq!(row.digest, digest_of(2, i));
            assert_eq!(row.paused, i.is_multiple_of(5));
            assert_eq!(row.policy.is_some(), i.is_multiple_of(2));
        }
    }

    #[test]
    fn chunks_hold_no_key_twice_and_keep_the_order() {
        let keys: Vec<String> = (0..ROWS_PER_STATEMENT + 10)
            .map(|i| format!("k{i}"))
            .chain(["k3".to_string(), "x".to_string(), "x".to_string()])
            .collect();
        let chunks = chunks_by_key(&keys, |k| k.as_str());
        let sizes: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
        assert_eq!(sizes, [ROWS_PER_STATEMENT, 12, 1]);
        assert_eq!(chunks.concat(), keys, "every item, in order");
        assert!(chunks_by_key(&Vec::<String>::new(), |k| k.as_str()).is_empty());
        let placeholders = |numbered| Placeholders { numbered, given: 0 };
        assert_eq!(placeholders(true).rows(2, 3), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(placeholders(false).rows(2, 3), "(?, ?, ?), (?, ?, ?)");
        assert_eq!(placeholders(true).list(3), "$1, $2, $3");
        assert_eq!(placeholders(false).list(2), "?, ?");
        let mut numbered = placeholders(true);
        assert_eq!(
            (numbered.next(), numbered.list(2)),
            ("$1".into(), "$2, $3".into())
        );
    }

    on_both_engines!(history_is_trimmed_and_unreferenced_digests_are_returned);
    async fn history_is_trimmed_and_unreferenced_digests_are_returned(store: Store) {
        let commit = |changed: Vec<StoredCluster>, removed: Vec<String>| Commit {
            revision: Some("r".into()),
            served: changed
                .into_iter()
                .map(|c| ServedChange {
                    cluster: c.name,
                    digest: c.digest,
                    revision: c.revision,
                    hold: false,
                })
                .collect(),
            removed,
            history: 2,
            now_ms: 1,
            ..Commit::default()
        };
        let none = store
            .commit(&commit(
                vec![changed("a", '1', "r1"), changed("b", '1', "r1")],
                vec![],
            ))
            .await
            .expect("commit");
        assert!(none.is_empty());
        store
            .commit(&commit(vec![changed("a", '2', "r2")], vec![]))
            .await
            .expect("commit");
        // a's third digest pushes '1' out of a's history, but b still uses it.
        let dropped = store
            .commit(&commit(vec![changed("a", '3', "r3")], vec![]))
            .await
            .expect("commit");
        assert!(dropped.is_empty());
        assert_eq!(
            store.history("a").await.expect("history"),
            vec![(digest('3'), "r3".into()), (digest('2'), "r2".into())]
        );
        let dropped = store
            .commit(&commit(vec![], vec!["b".into()]))
            .await
            .expect("commit");
        assert_eq!(dropped, vec![digest('1')]);
        let names: Vec<String> = store
            .clusters()
            .await
            .expect("clusters")
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, vec!["a"]);
    }

    on_both_engines!(revisions_in_history_in_a_batch_are_those_asked_one_at_a_time);
    /// More clusters than a statement takes, each with two digests in its history:
    /// the batch answers exactly what asking one pair at a time answers (a digest
    /// not in the cluster's history, or another cluster's, is absent).
    async fn revisions_in_history_in_a_batch_are_those_asked_one_at_a_time(store: Store) {
        let count = ROWS_PER_STATEMENT + 3;
        let names: Vec<String> = (0..count).map(|i| format!("c{i:04}")).collect();
        for (c, revision) in [('1', "r1"), ('2', "r2")] {
            let served = names
                .iter()
                .enumerate()
                // Half the clusters take only the first digest.
                .filter(|(i, _)| c == '1' || i % 2 == 0)
                .map(|(_, name)| ServedChange {
                    cluster: name.clone(),
                    digest: digest(c),
                    revision: format!("{revision}-{name}"),
                    hold: false,
                })
                .collect();
            store
                .commit(&Commit {
                    revision: Some(revision.into()),
                    served,
                    history: 5,
                    now_ms: 1,
                    ..Commit::default()
                })
                .await
                .expect("commit");
        }
        let digests = [digest('1'), digest('2'), digest('3')];
        let mut asked: Vec<(&str, &Digest)> = Vec::new();
        for name in &names {
            for d in &digests {
                asked.push((name.as_str(), d));
            }
        }
        asked.push(("not-a-cluster", &digests[0]));
        let batch = store.revisions_in_history(&asked).await.expect("batch");
        let mut one_at_a_time = HashMap::new();
        for (cluster, d) in &asked {
            if let Some(revision) = store.revision_in_history(cluster, d).await.expect("one") {
                one_at_a_time.insert((cluster.to_string(), (*d).clone()), revision);
            }
        }
        assert_eq!(batch, one_at_a_time);
        assert_eq!(batch.len(), count + count.div_ceil(2));
        assert_eq!(
            batch
                .get(&("c0001".to_string(), digest('1')))
                .map(String::as_str),
            Some("r1-c0001")
        );
        assert!(
            store
                .revisions_in_history(&[])
                .await
                .expect("none")
                .is_empty()
        );
    }

    on_both_engines!(objects_are_due_for_collection_only_after_the_grace_period);
    async fn objects_are_due_for_collection_only_after_the_grace_period(store: Store) {
        const HOUR: i64 = 3_600_000;
        let set = |cs: &[char]| cs.iter().map(|c| digest(*c)).collect::<BTreeSet<Digest>>();
        // Seen unreferenced now: not due within the hour; due with no grace at all.
        assert!(
            store
                .mark_unreferenced(&set(&['1', '2']), HOUR)
                .await
                .expect("mark")
                .is_empty()
        );
        assert_eq!(
            store
                .mark_unreferenced(&set(&['1', '2']), 0)
                .await
                .expect("mark"),
            vec![digest('1'), digest('2')]
        );
        // Seen unreferenced an hour and a minute ago (moved back on the database's
        // clock), and '2' referenced again meanwhile: only '1' is due, and '2' starts
        // over when it is unreferenced again.
        sqlx::query("UPDATE unreferenced_objects SET since = since - $1")
            .bind(HOUR + 60_000)
            .execute(&store.pool)
            .await
            .expect("age");
        assert_eq!(
            store
                .mark_unreferenced(&set(&['1', '3']), HOUR)
                .await
                .expect("mark"),
            vec![digest('1')]
        );
        assert!(
            store
                .mark_unreferenced(&set(&['1', '2', '3']), HOUR)
                .await
                .expect("mark")
                == vec![digest('1')]
        );
        store
            .forget_unreferenced(&[digest('1')])
            .await
            .expect("forget");
        assert!(
            store
                .mark_unreferenced(&set(&['2', '3']), HOUR)
                .await
                .expect("mark")
                .is_empty()
        );
    }

    /// A rollout of one wave, `w`, released at 1, with one member, ended (complete) at
    /// `ended` or progressing.
    fn one_wave_rollout(
        id: i64,
        policy: &str,
        ended: Option<i64>,
        member: rollouts::MemberRow,
    ) -> RolloutWrite {
        use flotilla_core::rollout::{RolloutState, Wave, WaveState};
        RolloutWrite {
            id,
            insert: true,
            policy: policy.into(),
            revision: member.target_revision.clone(),
            plan: format!(
                r#"{{"name":"{policy}","file":"rollouts/{policy}.yaml","waves":[{{"name":"w","bake":"0s","maxFailed":0,"maxParallel":null}}],"offline":"skip","onFailure":"halt"}}"#
            ),
            forced: false,
            state: if ended.is_some() {
                RolloutState::Complete
            } else {
                RolloutState::Progressing
            },
            reason: None,
            started_at: 1,
            ended_at: ended,
            waves: vec![Wave {
                name: "w".into(),
                state: WaveState::Released,
                released_at: Some(1),
                completed_at: None,
                deadline: None,
            }],
            members: vec![member],
            events: vec![],
        }
    }

    on_both_engines!(ended_rollouts_are_forgotten_after_a_while_but_the_latest_of_each_policy);
    async fn ended_rollouts_are_forgotten_after_a_while_but_the_latest_of_each_policy(
        store: Store,
    ) {
        use flotilla_core::rollout::{Event, Member};
        let rollout = |id: i64, policy: &str, ended: Option<i64>| RolloutWrite {
            events: vec![Event {
                at: 1,
                message: "started".into(),
                by: None,
                role: None,
            }],
            ..one_wave_rollout(
                id,
                policy,
                ended,
                rollouts::MemberRow {
                    ordinal: 0,
                    member: Member::new("a".into(), 0, None, digest('1')),
                    previous_revision: None,
                    target_revision: format!("r{id}"),
                },
            )
        };
        let writes = vec![
            rollout(1, "stores", Some(1_000)),
            rollout(2, "stores", Some(2_000)),
            rollout(3, "lab", Some(1_000)),
            rollout(4, "stores", Some(9_000)),
            rollout(5, "stores", None),
            rollout(6, "kiosks", Some(1_000)),
            rollout(7, "kiosks", None),
        ];
        store
            .commit(&Commit {
                rollouts: writes,
                history: 1,
                now_ms: 1,
                ..Commit::default()
            })
            .await
            .expect("rollouts");
        // The recorded revision is r2 (a force-push went back to it, say).
        let mut tx = store.pool.begin().await.expect("tx");
        set_meta(&mut tx, META_REVISION, "r2")
            .await
            .expect("revision");
        tx.commit().await.expect("commit");
        assert_eq!(store.forget_rollouts(5_000).await.expect("forget"), 2);
        let mut kept = Vec::new();
        for id in 1..=7 {
            if store.rollout(id).await.expect("read").is_some() {
                kept.push(id);
            }
        }
        // 1 ended before the cut and a later rollout of its policy exists; 2 too,
        // but it is the recorded revision's; 3 is lab's latest; 4 ended after the
        // cut; 5 and 7 have not ended; 6 is older than kiosks' latest.
        assert_eq!(kept, vec![2, 3, 4, 5, 7]);
        for table in ["rollout_waves", "rollout_clusters", "rollout_events"] {
            let sql = format!("SELECT COUNT(*) AS n FROM {table} WHERE rollout_id IN (1, 6)");
            let left: i64 = sqlx::query(&sql)
                .fetch_one(&store.pool)
                .await
                .expect("count")
                .get("n");
            assert_eq!(left, 0, "{table}");
        }
        assert_eq!(store.rollout_events(4).await.expect("events").len(), 1);
        assert_eq!(store.forget_rollouts(5_000).await.expect("again"), 0);
        assert_eq!(store.next_rollout_id().await.expect("next id"), 8);
    }

    on_both_engines!(two_writers_at_once_never_share_a_generation);
    /// A commit of served changes beside a writer that holds the write lock: on
    /// PostgreSQL both took the same generation (read, then written); on SQLite the
    /// commit failed at once (its transaction read, then could not take the lock).
    async fn two_writers_at_once_never_share_a_generation(store: Store) {
        let store = std::sync::Arc::new(store);
        let mut first = store.pool.begin().await.expect("first");
        store.take_write_lock(&mut first).await.expect("lock");
        assert_eq!(next_generation(&mut first).await.expect("first"), 1);
        let second = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .commit(&Commit {
                        // A render's commit: it checks the recorded revision first.
                        revision: Some("r1".into()),
                        expect_revision: Some(None),
                        served: vec![ServedChange {
                            cluster: "a".into(),
                            digest: digest('1'),
                            revision: "r1".into(),
                            hold: false,
                        }],
                        history: 2,
                        now_ms: 1,
                        ..Commit::default()
                    })
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        first.commit().await.expect("first commit");
        second.await.expect("joined").expect("the second commit");
        let generation: i64 =
            sqlx::query("SELECT generation FROM bundle_history WHERE cluster = 'a'")
                .fetch_one(&store.pool)
                .await
                .expect("history")
                .get("generation");
        assert_eq!(generation, 2);
    }

    on_both_engines!(hubs_long_silent_are_forgotten);
    async fn hubs_long_silent_are_forgotten(store: Store) {
        store.heartbeat("hub-a").await.expect("heartbeat");
        store.heartbeat("hub-b").await.expect("heartbeat");
        sqlx::query("UPDATE hubs SET heartbeat_at = heartbeat_at - 700000000 WHERE name = 'hub-a'")
            .execute(&store.pool)
            .await
            .expect("age hub-a");
        let week = 7 * 24 * 3600 * 1000;
        assert_eq!(store.forget_silent_hubs(week).await.expect("forget"), 1);
        let names: Vec<String> = sqlx::query("SELECT name FROM hubs")
            .fetch_all(&store.pool)
            .await
            .expect("hubs")
            .iter()
            .map(|row| row.get("name"))
            .collect();
        assert_eq!(names, vec!["hub-b".to_string()]);
    }

    on_both_engines!(
        every_change_of_what_is_served_bumps_the_sequence_and_rollouts_keep_their_objects
    );
    async fn every_change_of_what_is_served_bumps_the_sequence_and_rollouts_keep_their_objects(
        store: Store,
    ) {
        use flotilla_core::rollout::{Member, RolloutState};
        let serve = |c: char, hold: bool| ServedChange {
            cluster: "a".into(),
            digest: digest(c),
            revision: format!("r{c}"),
            hold,
        };
        let commit = |served: Vec<ServedChange>, rollouts: Vec<RolloutWrite>| Commit {
            served,
            rollouts,
            history: 1,
            now_ms: 1,
            ..Commit::default()
        };
        store
            .commit(&commit(vec![serve('1', true)], vec![]))
            .await
            .expect("held");
        assert!(
            store.history("a").await.expect("history").is_empty(),
            "a held digest is not served history"
        );
        store
            .commit(&commit(vec![serve('1', false)], vec![]))
            .await
            .expect("released");
        store
            .commit(&commit(vec![serve('2', false)], vec![]))
            .await
            .expect("new");
        // A running rollout remembers '2' as the previous digest and '3' as the new one.
        let member =
            |previous: char| Member::new("a".into(), 0, Some(digest(previous)), digest('3'));
        let rollout = |ended: Option<i64>| RolloutWrite {
            insert: ended.is_none(),
            ..one_wave_rollout(
                1,
                "p",
                ended,
                rollouts::MemberRow {
                    ordinal: 0,
                    member: member('2'),
                    previous_revision: Some("r2".into()),
                    target_revision: "r3".into(),
                },
            )
        };
        store
            .commit(&commit(vec![], vec![rollout(None)]))
            .await
            .expect("rollout");
        // A decision taken on the rollouts as they were before someone else wrote them
        // (an operator through the database) is refused, and writes nothing; one taken
        // on what is there now is written and moves the version on.
        assert_eq!(store.rollouts_version().await.expect("version"), 1);
        let paused = |version: i64| Commit {
            rollouts_version: Some(version),
            ..commit(
                vec![],
                vec![RolloutWrite {
                    insert: false,
                    state: RolloutState::Paused,
                    ..rollout(None)
                }],
            )
        };
        assert!(matches!(
            store.commit(&paused(0)).await,
            Err(StoreError::RolloutsMoved { expected: 0 })
        ));
        let stored = store.rollout(1).await.expect("read").expect("there");
        assert_eq!(stored.rollout.state, RolloutState::Progressing);
        store.commit(&paused(1)).await.expect("paused");
        assert_eq!(store.rollouts_version().await.expect("version"), 2);
        let stored = store.rollout(1).await.expect("read").expect("there");
        assert_eq!(stored.rollout.state, RolloutState::Paused);
        // Rolled back to '1' (history keeps one digest): '2' is still the rollout's.
        let dropped = store
            .commit(&commit(vec![serve('1', false)], vec![]))
            .await
            .expect("back");
        assert!(dropped.is_empty(), "{dropped:?}");
        assert_eq!(store.serve_sequence("a").await.expect("sequence"), Some(4));
        let stored = store.rollout(1).await.expect("read").expect("there");
        assert_eq!(stored.rollout.members[0].previous, Some(digest('2')));
        assert_eq!(stored.revisions[0], (Some("r2".into()), "r3".into()));
        // Once the rollout ends, '2' and '3' are unreferenced.
        let dropped = store
            .commit(&commit(vec![], vec![rollout(Some(2))]))
            .await
            .expect("ended");
        assert_eq!(dropped, vec![digest('2'), digest('3')]);
        assert!(store.active_rollouts().await.expect("active").is_empty());
        // A cluster that leaves the fleet and comes back continues its sequence: its
        // agent refuses a lower one than it holds.
        store
            .commit(&Commit {
                removed: vec!["a".into()],
                ..commit(vec![], vec![])
            })
            .await
            .expect("removed");
        let (_, sequences) = store
            .commit_with_sequences(&commit(vec![serve('2', false)], vec![]))
            .await
            .expect("back");
        assert_eq!(sequences.get("a"), Some(&5));
        let clusters = store.clusters().await.expect("clusters");
        assert_eq!(clusters[0].sequence, 5);
        // The sequence is the change's time when that is higher (a store rebuilt or
        // restored later still signs above what agents hold), and one more than
        // before when the clock is behind it.
        let at = |now_ms: i64, to: char| Commit {
            now_ms,
            ..commit(vec![serve(to, false)], vec![])
        };
        let (_, sequences) = store
            .commit_with_sequences(&at(1_000_000, '1'))
            .await
            .expect("later");
        assert_eq!(sequences.get("a"), Some(&1_000_000));
        let (_, sequences) = store
            .commit_with_sequences(&at(10, '2'))
            .await
            .expect("behind");
        assert_eq!(sequences.get("a"), Some(&1_000_001));
        store.close().await;
    }

    on_both_engines!(tokens_statuses_and_held_clusters_read_back_as_written);
    async fn tokens_statuses_and_held_clusters_read_back_as_written(store: Store) {
        let admin = StoredToken {
            id: "adm1".into(),
            hash: "h1".into(),
            cluster: None,
            admin: true,
            role: Some(Role::Admin),
            tenant: None,
            created_at_ms: 1,
            revoked_at_ms: None,
        };
        let edge = StoredToken {
            id: "edge1".into(),
            hash: "h2".into(),
            cluster: Some("red".into()),
            admin: false,
            role: None,
            tenant: None,
            created_at_ms: 2,
            revoked_at_ms: None,
        };
        let viewer = StoredToken {
            id: "view1".into(),
            hash: "h3".into(),
            cluster: None,
            admin: false,
            role: Some(Role::Viewer),
            tenant: Some("shop".into()),
            created_at_ms: 2,
            revoked_at_ms: None,
        };
        let before = store.tokens_generation().await.expect("generation");
        store.insert_token(&admin).await.expect("admin");
        store.insert_token(&edge).await.expect("edge");
        store.insert_token(&viewer).await.expect("viewer");
        let revoked = store.revoke_token("edge1", 3).await.expect("revoke");
        assert_eq!(revoked.revoked_at_ms, Some(3));
        assert_eq!(
            store.tokens().await.expect("tokens"),
            vec![
                admin,
                StoredToken {
                    revoked_at_ms: Some(3),
                    ..edge
                },
                viewer,
            ]
        );
        assert_eq!(
            store.tokens_generation().await.expect("generation"),
            before + 4
        );

        let status = StoredStatus {
            cluster: "red".into(),
            report: StatusReport {
                applied: Some(digest('a')),
                attempted: Some(digest('b')),
                resources: vec![],
                message: "applying".into(),
                agent_version: "1".into(),
                drift: vec![flotilla_core::status::DriftedResource {
                    group: "apps".into(),
                    kind: "Deployment".into(),
                    namespace: "shop".into(),
                    name: "web".into(),
                    fields: vec!["spec.replicas".into()],
                    managers: vec!["kubectl-edit".into()],
                    deleted: false,
                    action: flotilla_core::status::DriftAction::Reported,
                }],
                features: vec!["meta".into(), "phases".into()],
            },
            received_at_ms: 5,
        };
        store.put_status(&status).await.expect("status");
        assert_eq!(store.statuses().await.expect("statuses"), vec![status]);

        store
            .commit(&Commit {
                served: vec![ServedChange {
                    cluster: "red".into(),
                    digest: digest('c'),
                    revision: "main@sha1:1".into(),
                    hold: true,
                }],
                rendered: vec![RenderedCluster {
                    cluster: "red".into(),
                    digest: digest('c'),
                    revision: "main@sha1:1".into(),
                    policy: Some("p".into()),
                    wave: Some("w".into()),
                    paused: true,
                }],
                revision: Some("main@sha1:1".into()),
                history: 2,
                now_ms: 6,
                ..Commit::default()
            })
            .await
            .expect("commit");
        let held = store.clusters().await.expect("clusters");
        assert!(held[0].hold);
        assert!(store.rendered().await.expect("rendered")[0].paused);
        assert_eq!(
            store.revision().await.expect("revision").as_deref(),
            Some("main@sha1:1")
        );
        store.close().await;
    }

    #[test]
    fn database_urls_are_read_and_passwords_never_shown() {
        let state = Path::new("/var/lib/flotilla");
        let check = |url: &str, shown: &str| {
            let database: Database = url.parse().expect(url);
            assert_eq!(database.display(state), shown, "{url}");
        };
        check(
            "postgres://hub:s3cret@db:5432/fleet",
            "postgres://hub:…@db:5432/fleet",
        );
        check(
            "postgresql://db/fleet?sslmode=require",
            "postgresql://db/fleet?sslmode=require",
        );
        check("sqlite:///srv/flotilla.db", "/srv/flotilla.db");
        assert_eq!(
            Database::StateDir.display(state),
            "/var/lib/flotilla/flotilla.db"
        );
        for bad in ["mysql://db/fleet", "sqlite://", "flotilla.db"] {
            assert!(bad.parse::<Database>().is_err(), "{bad}");
        }
    }

    on_both_engines!(hubs_are_live_while_their_heartbeat_is_young);
    async fn hubs_are_live_while_their_heartbeat_is_young(store: Store) {
        let before = store.database_now_ms().await.expect("now");
        let at = store.heartbeat("a").await.expect("heartbeat");
        assert!(at >= before, "{at} < {before}");
        store
            .see_tip("b", Some("main@sha1:1"), 2)
            .await
            .expect("see");
        let live = store.live_hubs(60_000).await.expect("live");
        assert_eq!(
            live,
            vec![
                Sighting {
                    hub: "a".into(),
                    tip: None,
                    polls: 0
                },
                Sighting {
                    hub: "b".into(),
                    tip: Some("main@sha1:1".into()),
                    polls: 2
                },
            ]
        );
        // A heartbeat keeps the tip; a tip seen again replaces it.
        store.heartbeat("b").await.expect("heartbeat");
        store
            .see_tip("a", Some("main@sha1:1"), 3)
            .await
            .expect("see");
        let live = store.live_hubs(60_000).await.expect("live");
        assert_eq!(live[1].tip.as_deref(), Some("main@sha1:1"));
        assert_eq!(live[0].polls, 3);
        // Aged out of the window, or gone.
        sqlx::query("UPDATE hubs SET heartbeat_at = heartbeat_at - 120000 WHERE name = 'a'")
            .execute(&store.pool)
            .await
            .expect("age");
        store.leave("b").await.expect("leave");
        assert!(store.live_hubs(60_000).await.expect("live").is_empty());
        store.close().await;
    }
}
