//! A checkpoint write joins the caller's transaction: it commits or rolls back with it.

use toolgraph_graph::{
    CheckpointRecord, Checkpointer, EncodedRecord, PostgresCheckpointer, RecordKind, SqliteCheckpointer, ThreadId,
};

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
        metadata: None,
        graph_version: None,
        created_at_ms: 1,
    }
}

#[tokio::test]
async fn sqlite_checkpoint_commits_and_rolls_back_with_the_callers_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteCheckpointer::open(&dir.path().join("t.db")).await.unwrap();
    let db = store.database().clone();
    db.call(|c| c.execute_batch("CREATE TABLE messages (body TEXT)")).await.unwrap().unwrap();
    let t = ThreadId::new("acme", 1);

    let (t1, t2) = (t.clone(), t.clone());
    db.call(move |c| {
        let tx = c.transaction().unwrap();
        tx.execute("INSERT INTO messages VALUES ('hi')", []).unwrap();
        SqliteCheckpointer::append_in(&tx, &EncodedRecord::new(&t1, &record(1)).unwrap()).unwrap();
        // Dropped without commit: rolled back.
    })
    .await
    .unwrap();
    assert!(store.load(&t, None).await.unwrap().is_empty(), "rolled back with the caller");

    db.call(move |c| {
        let tx = c.transaction().unwrap();
        tx.execute("INSERT INTO messages VALUES ('hi')", []).unwrap();
        SqliteCheckpointer::append_in(&tx, &EncodedRecord::new(&t2, &record(1)).unwrap()).unwrap();
        tx.commit().unwrap();
    })
    .await
    .unwrap();
    assert_eq!(store.load(&t, None).await.unwrap().len(), 1);
    let n: i64 = db.call(|c| c.query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))).await.unwrap().unwrap();
    assert_eq!(n, 1, "the message and the checkpoint committed together");
}

#[tokio::test]
async fn postgres_checkpoint_commits_and_rolls_back_with_the_callers_transaction() {
    let Some(schema) = toolgraph_testkit::PgSchema::create().await else { return };
    let store: PostgresCheckpointer = schema.checkpointer().await;
    sqlx::query("CREATE TABLE messages (body TEXT)").execute(store.pool()).await.unwrap();
    let t = ThreadId::new("acme", 1);

    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO messages VALUES ('hi')").execute(&mut *tx).await.unwrap();
    PostgresCheckpointer::append_with(&mut *tx, true, &t, &record(1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store.load(&t, None).await.unwrap().is_empty(), "rolled back with the caller");

    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO messages VALUES ('hi')").execute(&mut *tx).await.unwrap();
    PostgresCheckpointer::append_with(&mut *tx, true, &t, &record(1)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.load(&t, None).await.unwrap().len(), 1);
    store.pool().close().await;
}
