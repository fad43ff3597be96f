-- Conversations, their messages and pending actions, beside the checkpoints.
-- Versions start at 1001 so they never collide with the checkpoint migrations.
CREATE TABLE IF NOT EXISTS conversations (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id        INTEGER NOT NULL,
    user_id          INTEGER NOT NULL,
    agent            TEXT    NOT NULL,
    running_run      TEXT,
    running_since_ms INTEGER,
    created_at_ms    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (tenant_id, user_id);

CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role            TEXT    NOT NULL,
    content         TEXT    NOT NULL,
    created_at_ms   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_conversation ON messages (conversation_id, id);

-- One row per write action awaiting (or having received) a decision; the message row it
-- hangs off is what the contract calls the pending action's messageId.
CREATE TABLE IF NOT EXISTS pending_actions (
    message_id      INTEGER PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    run_id          TEXT    NOT NULL,
    interrupt_id    TEXT    NOT NULL UNIQUE,
    tool_name       TEXT    NOT NULL,
    description     TEXT    NOT NULL,
    arguments       TEXT    NOT NULL,
    decision        INTEGER,
    response        TEXT
);
CREATE INDEX IF NOT EXISTS pending_by_run ON pending_actions (conversation_id, run_id);
