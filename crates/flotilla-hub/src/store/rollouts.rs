//! Rollouts in the store: one row per rollout (with the policy it runs by, as JSON),
//! its waves, its changing clusters and its events. Decisions write only what they
//! changed: the rollout's row, its waves (a handful), the members that changed and
//! the new events.

use std::collections::BTreeSet;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Store, StoreError, Tx, flag, parse_digest};
use flotilla_core::bundle::Digest;
use flotilla_core::rollout::render::Revisions;
use flotilla_core::rollout::{Event, Member, Policy, Rollout, RolloutState, Wave, WaveState};

/// A member with its position and the revisions its two digests came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    pub ordinal: usize,
    pub member: Member,
    pub previous_revision: Option<String>,
    pub target_revision: String,
}

/// What one decision writes about one rollout.
#[derive(Clone, Debug)]
pub struct RolloutWrite {
    pub id: i64,
    /// A new rollout: its row, waves and members are inserted.
    pub insert: bool,
    pub policy: String,
    pub revision: String,
    /// The policy as JSON (written when inserted).
    pub plan: String,
    pub forced: bool,
    pub state: RolloutState,
    pub reason: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub waves: Vec<Wave>,
    pub members: Vec<MemberRow>,
    pub events: Vec<Event>,
}

/// A rollout as read back, with the revisions of each member's digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRollout {
    pub id: i64,
    pub rollout: Rollout,
    /// Per member: (previous revision, target revision).
    pub revisions: Vec<Revisions>,
}

/// Writes what one decision changed about one rollout, and adds to `candidates` the
/// objects an ended rollout no longer keeps.
pub(super) async fn write(
    tx: &mut Tx<'_>,
    write: &RolloutWrite,
    candidates: &mut BTreeSet<String>,
) -> Result<(), sqlx::Error> {
    write_row(tx, write).await?;
    write_waves(tx, write.id, &write.waves).await?;
    for row in &write.members {
        write_member(tx, write.id, row).await?;
    }
    write_events(tx, write.id, &write.events).await?;
    if write.ended_at.is_some() {
        candidates.extend(digests_of(tx, write.id).await?);
    }
    Ok(())
}

/// The rollout's own row: inserted whole, or its state, reason and end updated.
async fn write_row(tx: &mut Tx<'_>, write: &RolloutWrite) -> Result<(), sqlx::Error> {
    if write.insert {
        sqlx::query(
            "INSERT INTO rollouts (id, policy, revision, plan, forced, state, reason, started_at, ended_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(write.id)
        .bind(&write.policy)
        .bind(&write.revision)
        .bind(&write.plan)
        .bind(write.forced)
        .bind(write.state.as_str())
        .bind(&write.reason)
        .bind(write.started_at)
        .bind(write.ended_at)
        .execute(&mut **tx)
        .await?;
    } else {
        sqlx::query("UPDATE rollouts SET state = $1, reason = $2, ended_at = $3 WHERE id = $4")
            .bind(write.state.as_str())
            .bind(&write.reason)
            .bind(write.ended_at)
            .bind(write.id)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Every wave of the rollout, inserted or brought up to date.
async fn write_waves(tx: &mut Tx<'_>, id: i64, waves: &[Wave]) -> Result<(), sqlx::Error> {
    for (ordinal, wave) in waves.iter().enumerate() {
        sqlx::query(
            "INSERT INTO rollout_waves (rollout_id, ordinal, name, state, released_at, completed_at, deadline)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (rollout_id, ordinal) DO UPDATE SET state = excluded.state,
                 released_at = excluded.released_at, completed_at = excluded.completed_at,
                 deadline = excluded.deadline",
        )
        .bind(id)
        .bind(ordinal as i64)
        .bind(&wave.name)
        .bind(wave.state.as_str())
        .bind(wave.released_at)
        .bind(wave.completed_at)
        .bind(wave.deadline)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// One member: inserted, or what a decision changes of it (never its digests).
async fn write_member(tx: &mut Tx<'_>, id: i64, row: &MemberRow) -> Result<(), sqlx::Error> {
    let m = &row.member;
    sqlx::query(
        "INSERT INTO rollout_clusters (rollout_id, ordinal, cluster, wave, previous, previous_revision,
             target, target_revision, offline_at_release, admitted_at, fetched, healthy_since,
             baked_at, failed, rolled_back, left_rollout)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT (rollout_id, ordinal) DO UPDATE SET
             offline_at_release = excluded.offline_at_release, admitted_at = excluded.admitted_at,
             fetched = excluded.fetched, healthy_since = excluded.healthy_since,
             baked_at = excluded.baked_at, failed = excluded.failed,
             rolled_back = excluded.rolled_back, left_rollout = excluded.left_rollout",
    )
    .bind(id)
    .bind(row.ordinal as i64)
    .bind(&m.cluster)
    .bind(m.wave as i64)
    .bind(m.previous.as_ref().map(Digest::as_str))
    .bind(&row.previous_revision)
    .bind(m.target.as_str())
    .bind(&row.target_revision)
    .bind(m.offline_at_release)
    .bind(m.admitted_at)
    .bind(m.fetched)
    .bind(m.healthy_since)
    .bind(m.baked_at)
    .bind(m.failed)
    .bind(m.rolled_back)
    .bind(m.left)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// New events, numbered after the rollout's last one.
async fn write_events(tx: &mut Tx<'_>, id: i64, events: &[Event]) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let next: i64 = sqlx::query(
        "SELECT COALESCE(MAX(seq), 0) AS last FROM rollout_events WHERE rollout_id = $1",
    )
    .bind(id)
    .fetch_one(&mut **tx)
    .await?
    .get("last");
    for (offset, event) in events.iter().enumerate() {
        sqlx::query(
            "INSERT INTO rollout_events (rollout_id, seq, happened_at, message, by_token, by_role)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(next + 1 + offset as i64)
        .bind(event.at)
        .bind(&event.message)
        .bind(&event.by)
        .bind(&event.role)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Every digest the rollout's members name (previous and target): an ended rollout
/// no longer keeps their objects.
async fn digests_of(tx: &mut Tx<'_>, id: i64) -> Result<Vec<String>, sqlx::Error> {
    let rows =
        sqlx::query("SELECT DISTINCT previous, target FROM rollout_clusters WHERE rollout_id = $1")
            .bind(id)
            .fetch_all(&mut **tx)
            .await?;
    let mut digests = Vec::with_capacity(rows.len() * 2);
    for row in rows {
        if let Some(previous) = row.get::<Option<String>, _>("previous") {
            digests.push(previous);
        }
        digests.push(row.get("target"));
    }
    Ok(digests)
}

fn malformed(column: &'static str, message: impl Into<String>) -> StoreError {
    StoreError::Malformed {
        table: "rollouts",
        column,
        message: message.into(),
    }
}

/// A member from its row of `rollout_clusters`.
fn member(m: &AnyRow) -> Result<Member, StoreError> {
    let previous = m
        .get::<Option<String>, _>("previous")
        .map(|d| parse_digest("rollout_clusters", "previous", d))
        .transpose()?;
    let wave: i64 = m.get("wave");
    Ok(Member {
        cluster: m.get("cluster"),
        wave: usize::try_from(wave).map_err(|e| malformed("wave", e.to_string()))?,
        previous,
        target: parse_digest("rollout_clusters", "target", m.get("target"))?,
        offline_at_release: flag(m, "offline_at_release"),
        admitted_at: m.get("admitted_at"),
        fetched: flag(m, "fetched"),
        healthy_since: m.get("healthy_since"),
        baked_at: m.get("baked_at"),
        failed: flag(m, "failed"),
        rolled_back: flag(m, "rolled_back"),
        left: flag(m, "left_rollout"),
    })
}

impl Store {
    /// The id for the next rollout.
    pub async fn next_rollout_id(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COALESCE(MAX(id), 0) + 1 AS next FROM rollouts")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(row.get("next"))
    }

    /// Forgets the rollouts that ended before `ended_before` (milliseconds since the
    /// Unix epoch, the hub's clock), with their waves, clusters and events, except
    /// the latest rollout of each policy and every rollout of the recorded revision,
    /// which stay whatever their age (a revision whose rollout is forgotten would
    /// start one again). A rollout that has not ended is never forgotten. Returns how
    /// many were.
    pub async fn forget_rollouts(&self, ended_before: i64) -> Result<u64, StoreError> {
        let err = |e| self.db_error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        // The ids are chosen once: on PostgreSQL each statement would see rollouts
        // committed since, and could leave rows of one behind.
        let ids: Vec<i64> = sqlx::query(
            "SELECT id FROM rollouts r WHERE r.ended_at IS NOT NULL AND r.ended_at < $1
             AND r.id < (SELECT MAX(l.id) FROM rollouts l WHERE l.policy = r.policy)
             AND r.revision <> COALESCE((SELECT value FROM hub_meta WHERE key = $2), '')",
        )
        .bind(ended_before)
        .bind(super::META_REVISION)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?
        .iter()
        .map(|row| row.get("id"))
        .collect();
        for chunk in ids.chunks(super::ROWS_PER_STATEMENT) {
            for (table, column) in [
                ("rollout_events", "rollout_id"),
                ("rollout_clusters", "rollout_id"),
                ("rollout_waves", "rollout_id"),
                ("rollouts", "id"),
            ] {
                let mut placeholders = super::Placeholders::of(&tx);
                let sql = format!(
                    "DELETE FROM {table} WHERE {column} IN ({})",
                    placeholders.list(chunk.len())
                );
                let mut query = sqlx::query(&sql);
                for id in chunk {
                    query = query.bind(*id);
                }
                query.execute(&mut *tx).await.map_err(err)?;
            }
        }
        tx.commit().await.map_err(err)?;
        Ok(ids.len() as u64)
    }

    /// The policies with a rollout for this revision (in any state).
    pub async fn rollout_policies_of(
        &self,
        revision: &str,
    ) -> Result<std::collections::BTreeSet<String>, StoreError> {
        let rows = sqlx::query("SELECT policy FROM rollouts WHERE revision = $1")
            .bind(revision)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        Ok(rows.iter().map(|row| row.get("policy")).collect())
    }

    /// Every rollout that has not ended.
    pub async fn active_rollouts(&self) -> Result<Vec<StoredRollout>, StoreError> {
        self.rollouts_where("WHERE ended_at IS NULL ORDER BY id", None)
            .await
    }

    /// The most recent ended rollouts, newest first.
    pub async fn recent_rollouts(&self, limit: i64) -> Result<Vec<StoredRollout>, StoreError> {
        self.rollouts_where(
            "WHERE ended_at IS NOT NULL ORDER BY id DESC LIMIT $1",
            Some(limit),
        )
        .await
    }

    pub async fn rollout(&self, id: i64) -> Result<Option<StoredRollout>, StoreError> {
        Ok(self
            .rollouts_where("WHERE id = $1", Some(id))
            .await?
            .into_iter()
            .next())
    }

    async fn rollouts_where(
        &self,
        clause: &str,
        parameter: Option<i64>,
    ) -> Result<Vec<StoredRollout>, StoreError> {
        let sql = format!(
            "SELECT id, policy, revision, plan, CAST(forced AS INTEGER) AS forced, state, reason, started_at, ended_at FROM rollouts {clause}"
        );
        let mut query = sqlx::query(&sql);
        if let Some(parameter) = parameter {
            query = query.bind(parameter);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(self.read_rollout(&row).await?);
        }
        Ok(out)
    }

    /// A rollout from its row, with its waves and members.
    async fn read_rollout(&self, row: &AnyRow) -> Result<StoredRollout, StoreError> {
        let id: i64 = row.get("id");
        let plan: String = row.get("plan");
        let policy: Policy =
            serde_json::from_str(&plan).map_err(|e| malformed("plan", e.to_string()))?;
        let state: String = row.get("state");
        let state = RolloutState::parse(&state)
            .ok_or_else(|| malformed("state", format!("unknown state {state:?}")))?;
        let waves = self.read_waves(id).await?;
        let (members, revisions) = self.read_members(id).await?;
        Ok(StoredRollout {
            id,
            rollout: Rollout {
                policy,
                revision: row.get("revision"),
                forced: flag(row, "forced"),
                state,
                reason: row.get("reason"),
                started_at: row.get("started_at"),
                ended_at: row.get("ended_at"),
                waves,
                members,
            },
            revisions,
        })
    }

    /// A rollout's waves, in order.
    async fn read_waves(&self, id: i64) -> Result<Vec<Wave>, StoreError> {
        sqlx::query(
            "SELECT name, state, released_at, completed_at, deadline FROM rollout_waves
             WHERE rollout_id = $1 ORDER BY ordinal",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?
        .iter()
        .map(|w| {
            let state: String = w.get("state");
            Ok(Wave {
                name: w.get("name"),
                state: WaveState::parse(&state)
                    .ok_or_else(|| malformed("wave state", format!("unknown state {state:?}")))?,
                released_at: w.get("released_at"),
                completed_at: w.get("completed_at"),
                deadline: w.get("deadline"),
            })
        })
        .collect()
    }

    /// A rollout's members, in order, and the revisions of each one's digests.
    async fn read_members(&self, id: i64) -> Result<(Vec<Member>, Vec<Revisions>), StoreError> {
        let rows = sqlx::query(
            "SELECT cluster, wave, previous, previous_revision, target, target_revision,
                 CAST(offline_at_release AS INTEGER) AS offline_at_release, admitted_at,
                 CAST(fetched AS INTEGER) AS fetched, healthy_since, baked_at,
                 CAST(failed AS INTEGER) AS failed, CAST(rolled_back AS INTEGER) AS rolled_back,
                 CAST(left_rollout AS INTEGER) AS left_rollout
             FROM rollout_clusters WHERE rollout_id = $1 ORDER BY ordinal",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        let mut members = Vec::with_capacity(rows.len());
        let mut revisions = Vec::with_capacity(rows.len());
        for m in rows {
            members.push(member(&m)?);
            revisions.push((m.get("previous_revision"), m.get("target_revision")));
        }
        Ok((members, revisions))
    }

    /// A rollout's events, oldest first.
    pub async fn rollout_events(&self, id: i64) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(
            "SELECT happened_at, message, by_token, by_role FROM rollout_events WHERE rollout_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        Ok(rows
            .iter()
            .map(|row| Event {
                at: row.get("happened_at"),
                message: row.get("message"),
                by: row.get("by_token"),
                role: row.get("by_role"),
            })
            .collect())
    }
}
