-- Secrets the hub makes for itself and keeps with the rest of its state (so a backup of
-- the store backs them up, and every hub on one database shares them): the seed Helm
-- charts' generating functions (randAlphaNum, genCA, ...) derive their values from.
-- Made once, at the first start that needs it; never made anew over an existing one.
-- Values are hex. Plain SQL for SQLite and PostgreSQL alike.
CREATE TABLE hub_secrets (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
