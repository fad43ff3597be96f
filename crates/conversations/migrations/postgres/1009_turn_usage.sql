-- Token usage kept with each turn (docs/service.md, "Tokens"): one row per turn and model.
-- No foreign key: deleting a conversation does not give its tokens back to the tenant's budget.
CREATE TABLE IF NOT EXISTS turn_usage (
    id                   BIGSERIAL PRIMARY KEY,
    tenant_id            BIGINT  NOT NULL,
    user_id              BIGINT  NOT NULL,
    conversation_id      BIGINT  NOT NULL,
    run_id               TEXT    NOT NULL,
    agent                TEXT    NOT NULL,
    model                TEXT    NOT NULL,
    prompt_tokens        BIGINT  NOT NULL,
    completion_tokens    BIGINT  NOT NULL,
    cached_prompt_tokens BIGINT  NOT NULL,
    calls                INTEGER NOT NULL,
    at_ms                BIGINT  NOT NULL
);
CREATE INDEX IF NOT EXISTS turn_usage_conversation ON turn_usage (conversation_id, id);
-- Covers a tenant's budget check: its period's tokens are read from the index alone.
CREATE INDEX IF NOT EXISTS turn_usage_tenant_at ON turn_usage (tenant_id, at_ms, prompt_tokens, completion_tokens);
