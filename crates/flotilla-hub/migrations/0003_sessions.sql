-- Sessions of the web page (/ui/): made by logging in with an admin token. The
-- session id travels in a cookie and is stored here only as its SHA-256 (hex), as
-- tokens are. `csrf` is the session's form token (not a secret worth hashing: it is
-- useless without the cookie). Plain SQL, as in 0001 and 0002.
CREATE TABLE sessions (
    id_hash TEXT PRIMARY KEY,
    -- The id of the admin token that logged in (recorded with rollout actions).
    token_id TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE INDEX sessions_by_expiry ON sessions (expires_at);
