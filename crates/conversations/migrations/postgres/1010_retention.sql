-- Retention (docs/service.md, "Retention"): a conversation's last turn, to find idle ones;
-- the periodic passes replicas take turns at; indexes for what retention deletes.
-- No backfill (a whole-table rewrite on a large database): a conversation without
-- `last_active_ms` is judged by its last message, then by when it was made.
ALTER TABLE conversations ADD COLUMN IF NOT EXISTS last_active_ms BIGINT;
CREATE INDEX IF NOT EXISTS conversations_last_active ON conversations (last_active_ms);
CREATE INDEX IF NOT EXISTS threads_conversation ON threads (conversation_id);
CREATE INDEX IF NOT EXISTS threads_unbound_changed ON threads (updated_at_ms) WHERE conversation_id IS NULL;
CREATE INDEX IF NOT EXISTS turn_usage_at ON turn_usage (at_ms);
-- One row per periodic task: who ran it last and when; a replica runs a pass only by moving
-- `ran_at_ms` forward past the task's period, so two never run the same pass.
CREATE TABLE IF NOT EXISTS maintenance_passes (
    task      TEXT    PRIMARY KEY,
    holder    TEXT    NOT NULL,
    ran_at_ms BIGINT  NOT NULL
);
