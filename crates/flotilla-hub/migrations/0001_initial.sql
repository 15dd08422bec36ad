-- The hub's first schema. `IF NOT EXISTS` because stores made before migrations
-- existed already hold these tables; on them this migration only records itself.
-- Plain SQL (BIGINT, TEXT, BOOLEAN, no engine-specific functions) so the same
-- migrations can run on SQLite and PostgreSQL.

CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    revision TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS bundle_history (
    cluster TEXT NOT NULL,
    digest TEXT NOT NULL,
    revision TEXT NOT NULL,
    generation BIGINT NOT NULL,
    PRIMARY KEY (cluster, digest)
);

CREATE INDEX IF NOT EXISTS bundle_history_digest ON bundle_history (digest);

CREATE TABLE IF NOT EXISTS agent_status (
    cluster TEXT PRIMARY KEY,
    applied TEXT,
    attempted TEXT,
    resources TEXT NOT NULL,
    message TEXT NOT NULL,
    agent_version TEXT NOT NULL,
    received_at BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    cluster TEXT,
    admin BOOLEAN NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE TABLE IF NOT EXISTS hub_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
