//! The hubs on one database: a heartbeat per hub (which also samples the database's
//! clock), and the force-pushed tip each one sees with how many of its polls in a row
//! saw it (see `crate::follow`, "force-push").

use sqlx::Row;

use super::{Store, StoreError};

/// One live hub's view of the followed branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub hub: String,
    /// The tip it sees that does not descend from the recorded commit; `None` when
    /// its tip does (or it has not polled yet).
    pub tip: Option<String>,
    /// How many of its polls in a row saw `tip`.
    pub polls: i64,
}

impl Store {
    /// Marks `hub` alive now and returns the database's clock (milliseconds since the
    /// Unix epoch) as it wrote it: one round trip for both.
    pub async fn heartbeat(&self, hub: &str) -> Result<i64, StoreError> {
        let now = self.now_sql();
        let sql = format!(
            "INSERT INTO hubs (name, heartbeat_at) VALUES ($1, {now})
             ON CONFLICT (name) DO UPDATE SET heartbeat_at = excluded.heartbeat_at
             RETURNING heartbeat_at"
        );
        let row = sqlx::query(&sql)
            .bind(hub)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.get("heartbeat_at"))
    }

    /// Forgets the hubs whose last heartbeat is older than `silent_for` milliseconds
    /// on the database's clock (a hub started under a new name each time, a pod,
    /// leaves a row behind at every restart); one that comes back is recorded again
    /// at its next heartbeat. Returns how many were forgotten.
    pub async fn forget_silent_hubs(&self, silent_for: i64) -> Result<u64, StoreError> {
        let now = self.now_sql();
        let sql = format!("DELETE FROM hubs WHERE heartbeat_at < {now} - $1");
        Ok(sqlx::query(&sql)
            .bind(silent_for)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?
            .rows_affected())
    }

    /// Records the force-pushed tip `hub` sees and for how many polls in a row
    /// (`None` and 0 when its tip descends from the recorded commit); a heartbeat too.
    pub async fn see_tip(
        &self,
        hub: &str,
        tip: Option<&str>,
        polls: i64,
    ) -> Result<(), StoreError> {
        let now = self.now_sql();
        let sql = format!(
            "INSERT INTO hubs (name, heartbeat_at, tip, tip_polls) VALUES ($1, {now}, $2, $3)
             ON CONFLICT (name) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,
                 tip = excluded.tip, tip_polls = excluded.tip_polls"
        );
        sqlx::query(&sql)
            .bind(hub)
            .bind(tip)
            .bind(polls)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(())
    }

    /// Every hub whose heartbeat is younger than `live_ms` on the database's clock,
    /// by name.
    pub async fn live_hubs(&self, live_ms: i64) -> Result<Vec<Sighting>, StoreError> {
        let now = self.now_sql();
        let sql = format!(
            "SELECT name, tip, tip_polls FROM hubs WHERE heartbeat_at > {now} - $1 ORDER BY name"
        );
        let rows = sqlx::query(&sql)
            .bind(live_ms)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(rows
            .iter()
            .map(|row| Sighting {
                hub: row.get("name"),
                tip: row.get("tip"),
                polls: row.get("tip_polls"),
            })
            .collect())
    }

    /// Forgets `hub` (it is stopping): it no longer counts among the live hubs.
    pub async fn leave(&self, hub: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM hubs WHERE name = $1")
            .bind(hub)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(())
    }
}
