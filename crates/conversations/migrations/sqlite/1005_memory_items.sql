-- A person's long-term memory (docs/memory.md): JSON values under keys in namespaces (labels
-- joined with U+001F), each with an optional time to live that reading refreshes.
CREATE TABLE IF NOT EXISTS memory_items (
    tenant_id     INTEGER NOT NULL,
    user_id       INTEGER NOT NULL,
    namespace     TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    value         TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    ttl_ms        INTEGER,
    expires_at_ms INTEGER,
    PRIMARY KEY (tenant_id, user_id, namespace, key)
);
CREATE INDEX IF NOT EXISTS memory_items_changed ON memory_items (tenant_id, user_id, updated_at_ms);
CREATE INDEX IF NOT EXISTS memory_items_expiry ON memory_items (expires_at_ms) WHERE expires_at_ms IS NOT NULL;
