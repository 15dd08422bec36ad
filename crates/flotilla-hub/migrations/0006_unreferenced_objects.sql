-- Garbage collection of objects with several hubs: since when (the database's clock,
-- milliseconds since the Unix epoch) the hub holding the rollout lease has seen each
-- stored object that nothing in the database refers to. An object is deleted only
-- once it has been unreferenced for the grace period (an hour), so an object another
-- hub wrote for a render not recorded yet, or that a rollback is about to use again,
-- stays.
CREATE TABLE unreferenced_objects (
    digest TEXT PRIMARY KEY,
    since BIGINT NOT NULL
);
