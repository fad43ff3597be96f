//! Replay protection shared by replicas (docs/service.md, "Signed requests"): verifiers on
//! different connections to one PostgreSQL database, each with its own [`PostgresReplayStore`],
//! accept a signed request once between them — on another replica, after a restart, and when
//! they race — directly and through PgBouncer in transaction mode. Each test runs in a schema
//! of its own; without a server they are skipped (a failure under `CI`).

use std::str::FromStr;
use std::sync::Arc;
use toolgraph_conversations::backend::replay::{PostgresReplayStore, ReplayStore};
use toolgraph_conversations::backend::signing::{HmacVerifier, SignatureError, SignedRequest, now_secs, sign};
use toolgraph_graph::{PgDatabase, PgPooling, PostgresCheckpointer};
use toolgraph_testkit::PgSchema;
use toolgraph_testkit::pgbouncer::TransactionPooler;

const KEY: &[u8] = b"the-service-to-backend-secret";

/// A replica's verifier: its own pool to `db`'s database, its own store.
async fn replica(options: sqlx::postgres::PgConnectOptions) -> (HmacVerifier, PgDatabase) {
    let db = PostgresCheckpointer::connect_with(options).await.expect("connect").database().clone();
    let store = PostgresReplayStore::open(db.clone()).await.expect("migrate");
    (HmacVerifier::new(KEY.to_vec()).with_replay_store(Arc::new(store)), db)
}

/// The signed `delete/tenant` call everyone tries: its timestamp, nonce and signature.
fn delete_tenant(now: i64, nonce: &str) -> (SignedRequest<'static>, String) {
    let r = SignedRequest {
        method: "POST",
        target: "/internal/chatbot/delete/tenant",
        tenant_slug: Some("demo"),
        body: br#"{"tenantId":7}"#,
    };
    let signature = sign(KEY, &r, now, nonce);
    (r, signature)
}

async fn present(v: &HmacVerifier, nonce: &str, now: i64) -> Result<(), SignatureError> {
    let (r, signature) = delete_tenant(now, nonce);
    v.verify(&r, &now.to_string(), Some(nonce), &signature, now).await
}

#[tokio::test]
async fn a_request_accepted_by_one_replica_is_a_replay_to_another_and_after_a_restart() {
    let Some(schema) = PgSchema::create().await else { return };
    let (a, _) = replica(schema.options()).await;
    let (b, db) = replica(schema.options()).await;
    let now = now_secs();
    assert_eq!(present(&a, "replica-nonce-0001", now).await, Ok(()));
    assert_eq!(present(&b, "replica-nonce-0001", now).await, Err(SignatureError::Replayed), "another replica");
    assert_eq!(present(&a, "replica-nonce-0001", now).await, Err(SignatureError::Replayed), "the same one");
    drop(a);
    let (restarted, _) = replica(schema.options()).await;
    assert_eq!(present(&restarted, "replica-nonce-0001", now + 1).await, Err(SignatureError::Replayed), "restarted");
    assert_eq!(present(&b, "replica-nonce-0002", now).await, Ok(()), "a new nonce is new");

    // Racing replicas: one of them accepts.
    let replicas = Arc::new([b, restarted]);
    let mut tries = tokio::task::JoinSet::new();
    for i in 0..16 {
        let replicas = Arc::clone(&replicas);
        tries.spawn(async move { present(&replicas[i % 2], "racing-nonce-00001", now).await });
    }
    let results = tries.join_all().await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
    assert!(results.iter().all(|r| r.is_ok() || *r == Err(SignatureError::Replayed)), "{results:?}");

    // Expired nonces are deleted (a minute after expiry), live ones kept.
    let store = PostgresReplayStore::open(db.clone()).await.unwrap();
    assert_eq!(store.claim("v2:old-nonce-0000001", now - 400, now - 700).await, Ok(true));
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM signature_nonces").fetch_one(db.pool()).await.unwrap()
    };
    let before = count().await;
    assert_eq!(store.claim("v2:new-nonce-0000001", now + 300, now).await, Ok(true));
    assert_eq!(count().await, before, "the expired one went as the new one came");
    assert_eq!(present(&replicas[0], "replica-nonce-0001", now).await, Err(SignatureError::Replayed), "live kept");
}

#[tokio::test]
async fn replicas_share_nonces_through_a_transaction_pooler() {
    let Some(pooler) = TransactionPooler::start(1).await else { return };
    let options = |url: &str| sqlx::postgres::PgConnectOptions::from_str(url).expect("url");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let ckpt = PostgresCheckpointer::connect_pooled(
            options(&pooler.pooled_url()),
            PgPooling::Transaction,
            Some(options(&pooler.direct_url())),
        )
        .await
        .expect("connect through the pooler");
        let store = PostgresReplayStore::open(ckpt.database().clone()).await.expect("migrate");
        replicas.push(HmacVerifier::new(KEY.to_vec()).with_replay_store(Arc::new(store)));
    }
    let now = now_secs();
    // Through one server connection shared by both pools, named statements would collide.
    for i in 0..8 {
        let nonce = format!("pooled-nonce-{i:06}");
        assert_eq!(present(&replicas[i % 2], &nonce, now).await, Ok(()), "{nonce}");
        assert_eq!(present(&replicas[(i + 1) % 2], &nonce, now).await, Err(SignatureError::Replayed), "{nonce}");
    }
}
