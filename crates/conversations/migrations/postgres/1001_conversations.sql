-- Conversations, their messages and pending actions, beside the checkpoints.
-- Versions start at 1001 so they never collide with the checkpoint migrations.
CREATE TABLE IF NOT EXISTS conversations (
    id               BIGSERIAL PRIMARY KEY,
    tenant_id        BIGINT NOT NULL,
    user_id          BIGINT NOT NULL,
    agent            TEXT   NOT NULL,
    running_run      TEXT,
    running_since_ms BIGINT,
    created_at_ms    BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (tenant_id, user_id);

CREATE TABLE IF NOT EXISTS messages (
    id              BIGSERIAL PRIMARY KEY,
    conversation_id BIGINT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role            TEXT   NOT NULL,
    content         TEXT   NOT NULL,
    created_at_ms   BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_conversation ON messages (conversation_id, id);

CREATE TABLE IF NOT EXISTS pending_actions (
    message_id      BIGINT PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    conversation_id BIGINT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    run_id          TEXT   NOT NULL,
    interrupt_id    TEXT   NOT NULL UNIQUE,
    tool_name       TEXT   NOT NULL,
    description     TEXT   NOT NULL,
    arguments       JSONB  NOT NULL,
    decision        BOOLEAN,
    response        TEXT
);
CREATE INDEX IF NOT EXISTS pending_by_run ON pending_actions (conversation_id, run_id);
