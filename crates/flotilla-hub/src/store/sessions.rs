//! Web page sessions in the store: one row per login, found by the SHA-256 of the
//! session id the browser holds, so a copy of the database opens no session.

use sqlx::Row;

use super::{Store, StoreError};

/// A session as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSession {
    /// Hex SHA-256 of the session id.
    pub id_hash: String,
    /// The admin token that logged in.
    pub token_id: String,
    /// The session's form token.
    pub csrf: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
}

impl Store {
    /// Records a new session, and forgets every expired one.
    pub async fn insert_session(&self, session: &StoredSession) -> Result<(), StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        sqlx::query("DELETE FROM sessions WHERE expires_at <= $1")
            .bind(session.created_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(
            "INSERT INTO sessions (id_hash, token_id, csrf, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&session.id_hash)
        .bind(&session.token_id)
        .bind(&session.csrf)
        .bind(session.created_at_ms)
        .bind(session.expires_at_ms)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)
    }

    /// The session with this id hash, if it has not expired at `now_ms`.
    pub async fn session(
        &self,
        id_hash: &str,
        now_ms: i64,
    ) -> Result<Option<StoredSession>, StoreError> {
        let row = sqlx::query(
            "SELECT id_hash, token_id, csrf, created_at, expires_at FROM sessions WHERE id_hash = $1 AND expires_at > $2",
        )
        .bind(id_hash)
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        Ok(row.map(|row| StoredSession {
            id_hash: row.get("id_hash"),
            token_id: row.get("token_id"),
            csrf: row.get("csrf"),
            created_at_ms: row.get("created_at"),
            expires_at_ms: row.get("expires_at"),
        }))
    }

    /// Ends a session (logout).
    pub async fn delete_session(&self, id_hash: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(())
    }
}
