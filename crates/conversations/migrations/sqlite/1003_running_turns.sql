-- Expired leases are looked for among running turns only.
CREATE INDEX IF NOT EXISTS conversations_running_until ON conversations (running_until_ms) WHERE running_run IS NOT NULL;
