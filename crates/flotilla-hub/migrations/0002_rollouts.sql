-- Rollouts: what HEAD renders per cluster (`rendered`) is kept apart from what each
-- cluster is served (`clusters`), and each rollout's waves, changing clusters and
-- decisions are recorded. Plain SQL, as in 0001: the same file runs on SQLite and
-- PostgreSQL (BIGINT times in milliseconds, TEXT, BOOLEAN; no engine-specific types
-- or functions; ids assigned by the hub).

-- What a cluster is served. `hold`: a cluster new to the hub whose wave is not
-- released yet; an agent that names the digest it runs (If-None-Match) keeps it, a
-- fresh agent gets `digest`. `serve_sequence` goes up by one whenever what is served
-- changes (digest or hold), rollbacks included.
ALTER TABLE clusters ADD COLUMN hold BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE clusters ADD COLUMN serve_sequence BIGINT NOT NULL DEFAULT 0;

-- What the last clean render gives each cluster, and where the plan puts it.
CREATE TABLE rendered (
    cluster TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    -- The revision that first rendered this digest for this cluster.
    revision TEXT NOT NULL,
    policy TEXT,
    wave TEXT,
    paused BOOLEAN NOT NULL
);

CREATE TABLE rollouts (
    id BIGINT PRIMARY KEY,
    policy TEXT NOT NULL,
    revision TEXT NOT NULL,
    -- The policy as the rollout runs by it (JSON), fixed when it starts.
    plan TEXT NOT NULL,
    forced BOOLEAN NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    started_at BIGINT NOT NULL,
    ended_at BIGINT,
    UNIQUE (policy, revision)
);

CREATE INDEX rollouts_active ON rollouts (ended_at);

CREATE TABLE rollout_waves (
    rollout_id BIGINT NOT NULL,
    ordinal INTEGER NOT NULL,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    released_at BIGINT,
    completed_at BIGINT,
    deadline BIGINT,
    PRIMARY KEY (rollout_id, ordinal)
);

CREATE TABLE rollout_clusters (
    rollout_id BIGINT NOT NULL,
    ordinal INTEGER NOT NULL,
    cluster TEXT NOT NULL,
    wave INTEGER NOT NULL,
    previous TEXT,
    previous_revision TEXT,
    target TEXT NOT NULL,
    target_revision TEXT NOT NULL,
    offline_at_release BOOLEAN NOT NULL,
    admitted_at BIGINT,
    fetched BOOLEAN NOT NULL,
    healthy_since BIGINT,
    baked_at BIGINT,
    failed BOOLEAN NOT NULL,
    rolled_back BOOLEAN NOT NULL,
    left_rollout BOOLEAN NOT NULL,
    PRIMARY KEY (rollout_id, ordinal)
);

CREATE INDEX rollout_clusters_previous ON rollout_clusters (previous);
CREATE INDEX rollout_clusters_target ON rollout_clusters (target);

CREATE TABLE rollout_events (
    rollout_id BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    happened_at BIGINT NOT NULL,
    message TEXT NOT NULL,
    by_token TEXT,
    PRIMARY KEY (rollout_id, seq)
);

-- When each cluster was last seen (a report or an authenticated poll), written in
-- batches: a poll itself touches no database.
CREATE TABLE cluster_seen (
    cluster TEXT PRIMARY KEY,
    seen_at BIGINT NOT NULL
);
