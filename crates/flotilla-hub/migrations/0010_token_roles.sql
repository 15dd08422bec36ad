-- People's tokens have a role (viewer, operator, admin) and optionally a tenant that
-- limits what they see and steer. Every admin token made before has the role admin;
-- cluster tokens have no role. Rollout events record the role of the token that
-- acted beside its id. Plain SQL for SQLite and PostgreSQL alike.
ALTER TABLE tokens ADD COLUMN role TEXT;
ALTER TABLE tokens ADD COLUMN tenant TEXT;
UPDATE tokens SET role = 'admin' WHERE admin;
ALTER TABLE rollout_events ADD COLUMN by_role TEXT;
