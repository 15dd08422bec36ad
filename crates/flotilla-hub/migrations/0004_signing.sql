-- Signed bundles: the per-cluster sequence signed with every served document. It goes
-- up by one with each change of what a cluster is served (as clusters.serve_sequence
-- does) and is kept apart from `clusters`, whose row goes when a cluster leaves the
-- fleet: a cluster that comes back continues its sequence, since its agent refuses a
-- sequence lower than the one it holds. Plain SQL for SQLite and PostgreSQL alike.
CREATE TABLE serve_sequences (
    cluster TEXT PRIMARY KEY,
    sequence BIGINT NOT NULL
);
INSERT INTO serve_sequences (cluster, sequence) SELECT name, serve_sequence FROM clusters;
