-- What an agent's report says beside its resources: the resources changed on the
-- cluster since flotilla applied them (JSON, as the report carries them), and the
-- bundle features the agent understands (comma-separated). Reports stored before
-- this read as no drift and no features. Plain SQL for SQLite and PostgreSQL alike.
ALTER TABLE agent_status ADD COLUMN drift TEXT NOT NULL DEFAULT '[]';
ALTER TABLE agent_status ADD COLUMN features TEXT NOT NULL DEFAULT '';
