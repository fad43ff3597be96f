//! A checkpoint write joins the caller's transaction: it commits or rolls back with it.

mod common;

use toolgraph_graph::{CheckpointRecord, Checkpointer, PostgresCheckpointer, RecordKind, SqliteCheckpointer, ThreadId};

fn record(seq: u64) -> CheckpointRecord {
    CheckpointRecord {
        seq,
        format: 1,
        run_id: "r".into(),
        kind: RecordKind::Input,
        node: None,
        next: None,
        updates: vec![serde_json::value::to_raw_value(&serde_json::json!({"log": ["hi"]})).unwrap()],
        interrupts: Vec::new(),
        decisions: Default::default(),
        reason: None,
        created_at_ms: 1,
    }
}

#[tokio::test]
async fn sqlite_checkpoint_commits_and_rolls_back_with_the_callers_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteCheckpointer::open(&dir.path().join("t.db")).await.unwrap();
    sqlx::query("CREATE TABLE messages (body TEXT)").execute(store.pool()).await.unwrap();
    let t = ThreadId::new("acme", 1);

    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO messages VALUES ('hi')").execute(&mut *tx).await.unwrap();
    SqliteCheckpointer::append_with(&mut *tx, &t, &record(1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store.load(&t, None).await.unwrap().is_empty(), "rolled back with the caller");

    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO messages VALUES ('hi')").execute(&mut *tx).await.unwrap();
    SqliteCheckpointer::append_with(&mut *tx, &t, &record(1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.load(&t, None).await.unwrap().len(), 1);
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(store.pool()).await.unwrap();
    assert_eq!(n, 1, "the message and the checkpoint committed together");
}

#[tokio::test]
async fn postgres_checkpoint_commits_and_rolls_back_with_the_callers_transaction() {
    let Some(schema) = common::PgSchema::create().await else { return };
    let store: PostgresCheckpointer = schema.checkpointer().await;
    sqlx::query("CREATE TABLE messages (body TEXT)").execute(store.pool()).await.unwrap();
    let t = ThreadId::new("acme", 1);

    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO messages VALUES ('hi')").execute(&mut *tx).await.unwrap();
    PostgresCheckpointer::append_with(&mut *tx, &t, &record(1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store.load(&t, None).await.unwrap().is_empty(), "rolled back with the caller");

    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO messages VALUES ('hi')").execute(&mut *tx).await.unwrap();
    PostgresCheckpointer::append_with(&mut *tx, &t, &record(1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.load(&t, None).await.unwrap().len(), 1);
    store.pool().close().await;
}
