//! Secrets the hub makes for itself and keeps in its store: the Helm seed, from which
//! charts' generating functions (`randAlphaNum`, `genCA`, ...) derive their values, so
//! every render on every hub sharing the store makes the same ones, and nobody
//! without the store can compute them.

use sqlx::Row;

use super::{Store, StoreError};

const HELM_SEED: &str = "helm-seed";

impl Store {
    /// The store's Helm seed, made (32 random bytes) the first time it is asked for.
    /// Two hubs asking at once on one database agree: the first insert wins and both
    /// read it back.
    pub async fn helm_seed(&self) -> Result<[u8; 32], StoreError> {
        let fresh: [u8; 32] = rand::random();
        sqlx::query(
            "INSERT INTO hub_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(HELM_SEED)
        .bind(hex::encode(fresh))
        .execute(&self.pool)
        .await
        .map_err(|e| self.db_error(e))?;
        let row = sqlx::query("SELECT value FROM hub_secrets WHERE name = $1")
            .bind(HELM_SEED)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db_error(e))?;
        let text: String = row.get("value");
        let bytes = hex::decode(text.trim()).ok();
        bytes
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| StoreError::Malformed {
                table: "hub_secrets",
                column: "value",
                message: format!(
                    "{HELM_SEED} is not 32 bytes in hex; restore the store from a backup"
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_helm_seed_is_made_once_and_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).await.expect("store");
        let seed = store.helm_seed().await.expect("seed");
        assert_ne!(seed, [0; 32]);
        assert_eq!(store.helm_seed().await.expect("seed"), seed);
        store.close().await;
        let again = Store::open(dir.path()).await.expect("store");
        assert_eq!(
            again.helm_seed().await.expect("seed"),
            seed,
            "kept across restarts"
        );
        let other = tempfile::tempdir().expect("temp dir");
        let another = Store::open(other.path()).await.expect("store");
        assert_ne!(
            another.helm_seed().await.expect("seed"),
            seed,
            "each store its own"
        );
    }
}
