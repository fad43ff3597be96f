-- LangGraph's threads (docs/langgraph.md): a client's handle on a conversation, made before
-- the conversation is (a conversation needs its agent, which the thread's first run names).
CREATE TABLE IF NOT EXISTS threads (
    thread_id       TEXT    NOT NULL,
    tenant_id       INTEGER NOT NULL,
    user_id         INTEGER NOT NULL,
    conversation_id INTEGER REFERENCES conversations (id) ON DELETE CASCADE,
    metadata        TEXT    NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    updated_at_ms   INTEGER NOT NULL,
    -- Ids are each person's own: a client-chosen id never tells another's thread exists.
    PRIMARY KEY (tenant_id, user_id, thread_id)
);
CREATE INDEX IF NOT EXISTS threads_owner_changed ON threads (tenant_id, user_id, updated_at_ms);
