-- One row per checkpoint: what one step changed, never the whole state.
CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id     TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    format        INTEGER NOT NULL,
    run_id        TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    body          TEXT    NOT NULL,
    PRIMARY KEY (thread_id, seq)
) WITHOUT ROWID;
