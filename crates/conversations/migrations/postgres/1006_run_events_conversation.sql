-- A run's frames go with its conversation, user or tenant when those are deleted: each frame
-- records the conversation its run is a turn of (rows written before this have none, and go
-- with their user or tenant, or with the sweep).
ALTER TABLE run_events ADD COLUMN IF NOT EXISTS conversation_id BIGINT;
CREATE INDEX IF NOT EXISTS run_events_owner ON run_events (tenant_id, user_id, conversation_id);
