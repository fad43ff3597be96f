-- Documents a person uploaded to attach to a turn (docs/service.md, "Documents in the
-- conversation"): kept here until a turn attaches them (any replica may run it), or a day.
CREATE TABLE IF NOT EXISTS uploads (
    upload_id     TEXT    PRIMARY KEY,
    tenant_id     BIGINT  NOT NULL,
    user_id       BIGINT  NOT NULL,
    name          TEXT    NOT NULL,
    bytes         BYTEA   NOT NULL,
    created_at_ms BIGINT  NOT NULL
);
CREATE INDEX IF NOT EXISTS uploads_created ON uploads (created_at_ms);
