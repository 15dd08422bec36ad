-- Several hubs on one database: each hub's heartbeat, and the tip of the followed
-- branch it sees when that tip does not descend from the recorded commit (a
-- force-push), with how many of its polls in a row saw that tip. A hub is live while
-- its heartbeat is younger than its lease's length; a force-pushed tip is recorded
-- once every live hub has seen it for three polls in a row. Times are the database's
-- clock, in milliseconds since the Unix epoch.
CREATE TABLE hubs (
    name TEXT PRIMARY KEY,
    heartbeat_at BIGINT NOT NULL,
    tip TEXT,
    tip_polls BIGINT NOT NULL DEFAULT 0
);
