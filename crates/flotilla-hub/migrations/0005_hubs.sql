-- Several hubs on one database. A lease names the one hub that takes rollout
-- decisions and records renders; `epoch` goes up whenever the lease changes hands
-- (or lapses and is taken again), and every write of the holder checks it, so a hub
-- that lost the lease without knowing it cannot write (fencing). Times are the
-- database's clock, in milliseconds since the Unix epoch.
CREATE TABLE hub_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
