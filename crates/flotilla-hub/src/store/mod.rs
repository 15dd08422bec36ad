//! The hub's store, embedded under `--state-dir`: bundle content on disk, addressed
//! by digest ([`objects`]), and everything else in SQLite through sqlx: what each
//! cluster is served and the revision that first produced it, the last N digests per
//! cluster, what the last clean render gives each cluster, rollouts ([`rollouts`]),
//! agent status and hashed tokens.
//!
//! The SQL is written plainly (`$1` placeholders, `ON CONFLICT … DO UPDATE`, no
//! SQLite-only functions) so the same statements can run on PostgreSQL once a fleet
//! outgrows one hub. The store knows nothing of HTTP, Git or rendering.

pub mod objects;
pub mod rollouts;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use flotilla_core::bundle::Digest;
use flotilla_core::status::StatusReport;
pub use objects::{ObjectError, Objects};
pub use rollouts::{RolloutWrite, StoredRollout};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the state directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("the database {path} cannot be used: {source}")]
    Database { path: String, source: sqlx::Error },
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error("the database holds a malformed value in {table}.{column}: {message}")]
    Malformed {
        table: &'static str,
        column: &'static str,
        message: String,
    },
    #[error("{0}")]
    Token(String),
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
    /// The cluster whose bundles it reads; `None` for an admin token.
    pub cluster: Option<String>,
    pub admin: bool,
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedChange {
    pub cluster: String,
    pub digest: Digest,
    pub revision: String,
    pub hold: bool,
}

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
}

pub struct Store {
    root: PathBuf,
    pub objects: Objects,
    pool: SqlitePool,
    db_path: String,
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
        4,
        "signing",
        include_str!("../../migrations/0004_signing.sql"),
    ),
];

/// [`MIGRATIONS`] as sqlx reads a migrations folder.
#[derive(Debug)]
struct EmbeddedMigrations;

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
        Box::pin(async {
            Ok(MIGRATIONS
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

impl Store {
    /// Opens the store under `state_dir`, creating it on first use. The folder, the
    /// database and the objects are readable by the hub's user only: they hold token
    /// hashes and bundles, which may hold Secrets.
    pub async fn open(state_dir: &Path) -> Result<Store, StoreError> {
        flotilla_fs::create_dir(state_dir, flotilla_fs::Mode::Private).map_err(|source| {
            StoreError::CreateDir {
                path: state_dir.display().to_string(),
                source,
            }
        })?;
        let objects = Objects::open(state_dir).map_err(|source| StoreError::CreateDir {
            path: state_dir.join("objects").display().to_string(),
            source,
        })?;
        let db_file = state_dir.join(DATABASE_FILE);
        let db_path = db_file.display().to_string();
        let db_error = |source| StoreError::Database {
            path: db_path.clone(),
            source,
        };
        // SQLite creates its journal files with the database's permissions, so a
        // private database file keeps all of them private.
        create_private_file(&db_file).map_err(|source| StoreError::CreateDir {
            path: db_path.clone(),
            source,
        })?;
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(db_error)?
            .filename(&db_file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(db_error)?;
        sqlx::migrate::Migrator::new(EmbeddedMigrations)
            .await
            .map_err(|source| db_error(source.into()))?
            .run(&pool)
            .await
            .map_err(|source| db_error(source.into()))?;
        Ok(Store {
            root: state_dir.to_path_buf(),
            objects,
            pool,
            db_path,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Closes the database connections (waits for writes in flight).
    pub async fn close(&self) {
        self.pool.close().await;
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
            "SELECT name, digest, revision, hold, serve_sequence FROM clusters ORDER BY name",
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
                    hold: row.get("hold"),
                    sequence: sequence_of(row.get("serve_sequence"))?,
                })
            })
            .collect()
    }

    /// What the last clean render gives each cluster.
    pub async fn rendered(&self) -> Result<Vec<RenderedCluster>, StoreError> {
        let rows = sqlx::query(
            "SELECT cluster, digest, revision, policy, wave, paused FROM rendered ORDER BY cluster",
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
                    paused: row.get("paused"),
                })
            })
            .collect()
    }

    /// A cluster's serve sequence: how many times what it is served has changed.
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

    /// Records when clusters were last seen (one batch, one transaction).
    pub async fn put_seen(&self, seen: &[(String, i64)]) -> Result<(), StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        for (cluster, at) in seen {
            sqlx::query(
                "INSERT INTO cluster_seen (cluster, seen_at) VALUES ($1, $2)
                 ON CONFLICT (cluster) DO UPDATE SET seen_at = excluded.seen_at",
            )
            .bind(cluster)
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
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
        let mut sequences = HashMap::with_capacity(commit.served.len());
        let mut tx = self.pool.begin().await.map_err(err)?;
        let mut candidates: BTreeSet<String> = BTreeSet::new();
        for row in &commit.rendered {
            if let Some(old) = sqlx::query("SELECT digest FROM rendered WHERE cluster = $1")
                .bind(&row.cluster)
                .fetch_optional(&mut *tx)
                .await
                .map_err(err)?
            {
                candidates.insert(old.get("digest"));
            }
            sqlx::query(
                "INSERT INTO rendered (cluster, digest, revision, policy, wave, paused)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (cluster) DO UPDATE SET digest = excluded.digest,
                     revision = excluded.revision, policy = excluded.policy,
                     wave = excluded.wave, paused = excluded.paused",
            )
            .bind(&row.cluster)
            .bind(row.digest.as_str())
            .bind(&row.revision)
            .bind(&row.policy)
            .bind(&row.wave)
            .bind(row.paused)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        if !commit.served.is_empty() {
            let generation = next_generation(&mut tx).await.map_err(err)?;
            for change in &commit.served {
                let sequence = write_served(&mut tx, change, generation, commit, &mut candidates)
                    .await
                    .map_err(err)?;
                sequences.insert(change.cluster.clone(), sequence_of(sequence)?);
            }
        }
        for name in &commit.removed {
            for query in [
                "SELECT digest FROM bundle_history WHERE cluster = $1",
                "SELECT digest FROM rendered WHERE cluster = $1",
            ] {
                let digests: Vec<String> = sqlx::query(query)
                    .bind(name)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(err)?
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
                sqlx::query(table)
                    .bind(name)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
        }
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
        let mut unreferenced = Vec::new();
        for digest in candidates {
            if !referenced(&mut tx, &digest).await.map_err(err)? {
                unreferenced.push(parse_digest("bundle_history", "digest", digest)?);
            }
        }
        tx.commit().await.map_err(err)?;
        Ok((unreferenced, sequences))
    }

    /// Stores an agent's report, replacing the previous one.
    pub async fn put_status(&self, status: &StoredStatus) -> Result<(), StoreError> {
        let resources =
            serde_json::to_string(&status.report.resources).map_err(|e| StoreError::Malformed {
                table: "agent_status",
                column: "resources",
                message: e.to_string(),
            })?;
        sqlx::query(
            "INSERT INTO agent_status (cluster, applied, attempted, resources, message, agent_version, received_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (cluster) DO UPDATE SET applied = excluded.applied, attempted = excluded.attempted,
                 resources = excluded.resources, message = excluded.message,
                 agent_version = excluded.agent_version, received_at = excluded.received_at",
        )
        .bind(&status.cluster)
        .bind(status.report.applied.as_ref().map(Digest::as_str))
        .bind(status.report.attempted.as_ref().map(Digest::as_str))
        .bind(resources)
        .bind(&status.report.message)
        .bind(&status.report.agent_version)
        .bind(status.received_at_ms)
        .execute(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        Ok(())
    }

    /// Every agent's last report.
    pub async fn statuses(&self) -> Result<Vec<StoredStatus>, StoreError> {
        let rows = sqlx::query(
            "SELECT cluster, applied, attempted, resources, message, agent_version, received_at
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
            "INSERT INTO tokens (id, hash, cluster, admin, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&token.id)
        .bind(&token.hash)
        .bind(&token.cluster)
        .bind(token.admin)
        .bind(token.created_at_ms)
        .bind(token.revoked_at_ms)
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
                return Err(StoreError::Token(format!(
                    "no token with id {id:?}; `flotilla token list` shows the ids"
                )));
            }
            _ => {
                return Err(StoreError::Token(format!(
                    "{} tokens have ids starting with {id:?}; give more of the id",
                    matches.len()
                )));
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
            "SELECT id, hash, cluster, admin, created_at, revoked_at FROM tokens ORDER BY created_at, id",
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
                admin: row.get("admin"),
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

async fn next_generation(tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>) -> Result<i64, sqlx::Error> {
    let generation: i64 = sqlx::query("SELECT value FROM hub_meta WHERE key = $1")
        .bind(META_GENERATION)
        .fetch_optional(&mut **tx)
        .await?
        .and_then(|row| row.get::<String, _>("value").parse().ok())
        .unwrap_or(0)
        + 1;
    set_meta(tx, META_GENERATION, &generation.to_string()).await?;
    Ok(generation)
}

/// A stored sequence as the unsigned number it is.
fn sequence_of(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Malformed {
        table: "serve_sequences",
        column: "sequence",
        message: format!("{value} is negative"),
    })
}

/// Records one change of what a cluster is served: the `clusters` row (its serve
/// sequence up by one, continuing the sequence of a cluster that left and came back)
/// and, for a digest really served, its history. Returns the new sequence.
async fn write_served(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    change: &ServedChange,
    generation: i64,
    commit: &Commit,
    candidates: &mut BTreeSet<String>,
) -> Result<i64, sqlx::Error> {
    if let Some(old) = sqlx::query("SELECT digest FROM clusters WHERE name = $1")
        .bind(&change.cluster)
        .fetch_optional(&mut **tx)
        .await?
    {
        candidates.insert(old.get("digest"));
    }
    let sequence: i64 = sqlx::query(
        "INSERT INTO serve_sequences (cluster, sequence) VALUES ($1, 1)
         ON CONFLICT (cluster) DO UPDATE SET sequence = serve_sequences.sequence + 1
         RETURNING sequence",
    )
    .bind(&change.cluster)
    .fetch_one(&mut **tx)
    .await?
    .get("sequence");
    sqlx::query(
        "INSERT INTO clusters (name, digest, revision, updated_at, hold, serve_sequence)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (name) DO UPDATE SET digest = excluded.digest,
             revision = excluded.revision, updated_at = excluded.updated_at,
             hold = excluded.hold, serve_sequence = excluded.serve_sequence",
    )
    .bind(&change.cluster)
    .bind(change.digest.as_str())
    .bind(&change.revision)
    .bind(commit.now_ms)
    .bind(change.hold)
    .bind(sequence)
    .execute(&mut **tx)
    .await?;
    if change.hold {
        return Ok(sequence);
    }
    sqlx::query(
        "INSERT INTO bundle_history (cluster, digest, revision, generation) VALUES ($1, $2, $3, $4)
         ON CONFLICT (cluster, digest) DO UPDATE SET generation = excluded.generation",
    )
    .bind(&change.cluster)
    .bind(change.digest.as_str())
    .bind(&change.revision)
    .bind(generation)
    .execute(&mut **tx)
    .await?;
    let old: Vec<String> = sqlx::query(
        "SELECT digest FROM bundle_history WHERE cluster = $1 ORDER BY generation DESC",
    )
    .bind(&change.cluster)
    .fetch_all(&mut **tx)
    .await?
    .iter()
    .skip(commit.history.max(1))
    .map(|row| row.get("digest"))
    .collect();
    for digest in old {
        sqlx::query("DELETE FROM bundle_history WHERE cluster = $1 AND digest = $2")
            .bind(&change.cluster)
            .bind(&digest)
            .execute(&mut **tx)
            .await?;
        candidates.insert(digest);
    }
    Ok(sequence)
}

/// Whether anything still refers to a digest: a cluster's history, what it is served,
/// what HEAD renders for it, or a rollout that has not ended (its previous and new
/// digests are kept until it ends).
async fn referenced(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    digest: &str,
) -> Result<bool, sqlx::Error> {
    for query in [
        "SELECT 1 FROM bundle_history WHERE digest = $1 LIMIT 1",
        "SELECT 1 FROM clusters WHERE digest = $1 LIMIT 1",
        "SELECT 1 FROM rendered WHERE digest = $1 LIMIT 1",
        "SELECT 1 FROM rollout_clusters c JOIN rollouts r ON r.id = c.rollout_id
         WHERE r.ended_at IS NULL AND (c.previous = $1 OR c.target = $1) LIMIT 1",
    ] {
        if sqlx::query(query)
            .bind(digest)
            .fetch_optional(&mut **tx)
            .await?
            .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

async fn set_meta(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    key: &str,
    value: &str,
) -> Result<(), sqlx::Error> {
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

async fn bump_tokens_generation(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
) -> Result<(), sqlx::Error> {
    let current: i64 = sqlx::query("SELECT value FROM hub_meta WHERE key = $1")
        .bind(META_TOKENS)
        .fetch_optional(&mut **tx)
        .await?
        .and_then(|row| row.get::<String, _>("value").parse().ok())
        .unwrap_or(0);
    set_meta(tx, META_TOKENS, &(current + 1).to_string()).await
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
fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
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
        store.objects.write_all(&[(&d, bytes)]).expect("writes");
        store.close().await;
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("flotilla.db")), 0o600);
        assert_eq!(mode(&root.join("objects/sha256")), 0o700);
        assert_eq!(mode(&store.objects.path_of(&d)), 0o600);
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
            let pool = SqlitePoolOptions::new()
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

    #[tokio::test]
    async fn history_is_trimmed_and_unreferenced_digests_are_returned() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).await.expect("open");
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

    #[tokio::test]
    async fn every_change_of_what_is_served_bumps_the_sequence_and_rollouts_keep_their_objects() {
        use flotilla_core::rollout::{Member, RolloutState, Wave, WaveState};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).await.expect("open");
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
        let rollout = |ended: Option<i64>| {
            RolloutWrite {
            id: 1,
            insert: ended.is_none(),
            policy: "p".into(),
            revision: "r3".into(),
            plan: r#"{"name":"p","file":"rollouts/p.yaml","waves":[{"name":"w","bake":"0s","maxFailed":0,"maxParallel":null}],"offline":"skip","onFailure":"halt"}"#.into(),
            forced: false,
            state: if ended.is_some() { RolloutState::Complete } else { RolloutState::Progressing },
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
            members: vec![rollouts::MemberRow {
                ordinal: 0,
                member: member('2'),
                previous_revision: Some("r2".into()),
                target_revision: "r3".into(),
            }],
            events: vec![],
        }
        };
        store
            .commit(&commit(vec![], vec![rollout(None)]))
            .await
            .expect("rollout");
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
        store.close().await;
    }
}
