-- The nonces of accepted signed requests, shared by replicas: a request is accepted once
-- (`INSERT … ON CONFLICT DO NOTHING` on the key), and its row kept until its timestamp leaves the
-- ±5 min window (`expires_at`, Unix seconds), after which the request is refused as stale
-- anyway; each replica deletes expired rows about once a minute (docs/service.md, "Signed
-- requests").
CREATE TABLE IF NOT EXISTS signature_nonces (
    nonce      TEXT   PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS signature_nonces_expiry ON signature_nonces (expires_at);
