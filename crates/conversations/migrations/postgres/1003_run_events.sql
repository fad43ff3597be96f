-- What each run streamed, shared by replicas: a client that reconnects with Last-Event-ID to
-- any replica reads the frames here (the replica that runs the turn appends them in batches and
-- NOTIFYs `toolgraph_run_events` with the run's id). Rows go once their run ended a while ago
-- (docs/service.md, "Replicas").
CREATE TABLE IF NOT EXISTS run_events (
    run_id        TEXT   NOT NULL,
    seq           BIGINT NOT NULL,
    tenant_id     BIGINT NOT NULL,
    user_id       BIGINT NOT NULL,
    event         TEXT   NOT NULL,
    data          TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
-- The sweep finds ended runs by their last frame, and frames past the hard age limit.
CREATE INDEX IF NOT EXISTS run_events_ended ON run_events (created_at_ms) WHERE event IN ('done', 'error');
CREATE INDEX IF NOT EXISTS run_events_created ON run_events (created_at_ms);
