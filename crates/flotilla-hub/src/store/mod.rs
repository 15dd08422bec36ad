//! The hub's store, embedded under `--state-dir`: bundle content on disk, addressed
//! by digest ([`objects`]), and everything else in SQLite through sqlx: each
//! cluster's current digest and the revision that first produced it, the last N
//! digests per cluster, agent status and hashed tokens.
//!
//! The SQL is written plainly (`$1` placeholders, `ON CONFLICT … DO UPDATE`, no
//! SQLite-only functions) so the same statements can run on PostgreSQL once a fleet
//! outgrows one hub. The store knows nothing of HTTP, Git or rendering.

pub mod objects;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use flotilla_core::bundle::Digest;
use flotilla_core::status::StatusReport;
pub use objects::{ObjectError, Objects};

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

/// A cluster's current bundle as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCluster {
    pub name: String,
    pub digest: Digest,
    /// The revision of the commit that first produced this digest for this cluster.
    pub revision: String,
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

/// What one clean render changes.
#[derive(Debug, Default)]
pub struct RenderCommit {
    /// The commit the render came from.
    pub revision: String,
    /// Clusters whose digest changed (or that are new): (name, digest, revision that
    /// first produced that digest).
    pub changed: Vec<StoredCluster>,
    /// Clusters no longer in the repository.
    pub removed: Vec<String>,
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

/// The schema's migrations, in `migrations/`, applied in order at open (and
/// recorded in `_sqlx_migrations`).
static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

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
        let db_file = state_dir.join("flotilla.db");
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
        MIGRATIONS
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
        let rows = sqlx::query("SELECT name, digest, revision FROM clusters ORDER BY name")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        rows.iter()
            .map(|row| {
                Ok(StoredCluster {
                    name: row.get("name"),
                    digest: parse_digest("clusters", "digest", row.get("digest"))?,
                    revision: row.get("revision"),
                })
            })
            .collect()
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

    /// Records a clean render in one transaction: new current digests, history
    /// (trimmed to `history` entries per cluster), removed clusters. The objects must
    /// already be on disk. Returns the digests no cluster refers to any more, whose
    /// objects the caller may delete.
    pub async fn commit_render(&self, commit: &RenderCommit) -> Result<Vec<Digest>, StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        let generation: i64 = sqlx::query("SELECT value FROM hub_meta WHERE key = $1")
            .bind(META_GENERATION)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?
            .and_then(|row| row.get::<String, _>("value").parse().ok())
            .unwrap_or(0)
            + 1;
        let mut dropped: BTreeSet<String> = BTreeSet::new();
        for cluster in &commit.changed {
            sqlx::query(
                "INSERT INTO clusters (name, digest, revision, updated_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (name) DO UPDATE SET digest = excluded.digest,
                     revision = excluded.revision, updated_at = excluded.updated_at",
            )
            .bind(&cluster.name)
            .bind(cluster.digest.as_str())
            .bind(&cluster.revision)
            .bind(commit.now_ms)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            sqlx::query(
                "INSERT INTO bundle_history (cluster, digest, revision, generation) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (cluster, digest) DO UPDATE SET generation = excluded.generation",
            )
            .bind(&cluster.name)
            .bind(cluster.digest.as_str())
            .bind(&cluster.revision)
            .bind(generation)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            let old: Vec<String> = sqlx::query(
                "SELECT digest FROM bundle_history WHERE cluster = $1 ORDER BY generation DESC",
            )
            .bind(&cluster.name)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?
            .iter()
            .skip(commit.history.max(1))
            .map(|row| row.get("digest"))
            .collect();
            for digest in old {
                sqlx::query("DELETE FROM bundle_history WHERE cluster = $1 AND digest = $2")
                    .bind(&cluster.name)
                    .bind(&digest)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                dropped.insert(digest);
            }
        }
        for name in &commit.removed {
            let digests: Vec<String> =
                sqlx::query("SELECT digest FROM bundle_history WHERE cluster = $1")
                    .bind(name)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(err)?
                    .iter()
                    .map(|row| row.get("digest"))
                    .collect();
            dropped.extend(digests);
            for table in [
                "DELETE FROM bundle_history WHERE cluster = $1",
                "DELETE FROM clusters WHERE name = $1",
                "DELETE FROM agent_status WHERE cluster = $1",
            ] {
                sqlx::query(table)
                    .bind(name)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
        }
        let mut unreferenced = Vec::new();
        for digest in dropped {
            let used = sqlx::query("SELECT 1 FROM bundle_history WHERE digest = $1 LIMIT 1")
                .bind(&digest)
                .fetch_optional(&mut *tx)
                .await
                .map_err(err)?
                .is_some();
            if !used {
                unreferenced.push(parse_digest("bundle_history", "digest", digest)?);
            }
        }
        set_meta(&mut tx, META_GENERATION, &generation.to_string())
            .await
            .map_err(err)?;
        set_meta(&mut tx, META_REVISION, &commit.revision)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(unreferenced)
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
        }
    }

    #[tokio::test]
    async fn history_is_trimmed_and_unreferenced_digests_are_returned() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).await.expect("open");
        let commit = |changed: Vec<StoredCluster>, removed: Vec<String>| RenderCommit {
            revision: "r".into(),
            changed,
            removed,
            history: 2,
            now_ms: 1,
        };
        let none = store
            .commit_render(&commit(
                vec![changed("a", '1', "r1"), changed("b", '1', "r1")],
                vec![],
            ))
            .await
            .expect("commit");
        assert!(none.is_empty());
        store
            .commit_render(&commit(vec![changed("a", '2', "r2")], vec![]))
            .await
            .expect("commit");
        // a's third digest pushes '1' out of a's history, but b still uses it.
        let dropped = store
            .commit_render(&commit(vec![changed("a", '3', "r3")], vec![]))
            .await
            .expect("commit");
        assert!(dropped.is_empty());
        assert_eq!(
            store.history("a").await.expect("history"),
            vec![(digest('3'), "r3".into()), (digest('2'), "r2".into())]
        );
        let dropped = store
            .commit_render(&commit(vec![], vec!["b".into()]))
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
}
