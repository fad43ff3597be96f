-- A running turn's claim is a lease: who holds it (the service instance) and until when.
-- The holder renews it while the run works; an expired one may be taken over, and a
-- restarted instance frees what it held.
ALTER TABLE conversations ADD COLUMN IF NOT EXISTS running_owner TEXT;
ALTER TABLE conversations ADD COLUMN IF NOT EXISTS running_until_ms BIGINT;
CREATE INDEX IF NOT EXISTS conversations_running_owner ON conversations (running_owner);
