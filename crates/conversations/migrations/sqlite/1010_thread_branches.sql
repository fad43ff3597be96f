-- The conversations a LangGraph thread left when a run or a state update took it back to an
-- earlier checkpoint (docs/langgraph.md, "State updates"): the earlier branches, kept, and
-- deleted with the thread.
CREATE TABLE IF NOT EXISTS thread_branches (
    tenant_id       INTEGER NOT NULL,
    user_id         INTEGER NOT NULL,
    thread_id       TEXT    NOT NULL,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    PRIMARY KEY (tenant_id, user_id, thread_id, conversation_id),
    -- A thread that goes some other way (its conversation deleted) takes its rows with it: a
    -- new thread of the same id never inherits them.
    FOREIGN KEY (tenant_id, user_id, thread_id) REFERENCES threads (tenant_id, user_id, thread_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS thread_branches_conversation ON thread_branches (conversation_id);
