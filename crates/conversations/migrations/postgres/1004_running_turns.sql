-- Every replica looks for expired leases every third of the lease: only running turns are
-- indexed, so the sweep reads those, not the whole table.
CREATE INDEX IF NOT EXISTS conversations_running_until ON conversations (running_until_ms) WHERE running_run IS NOT NULL;
