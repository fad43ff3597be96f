//! A turn's messages commit with its checkpoint, or not at all.

use toolgraph_graph::react::AgentUpdate;
use toolgraph_graph::{CheckpointError, CheckpointRecord, Checkpointer, RecordKind, SqliteCheckpointer, ThreadId};
use toolgraph_llm::Message;
use toolgraph_server::ProjectingCheckpointer;
use toolgraph_server::store::{ConversationStore, SqliteConversationStore};

fn record(seq: u64, text: &str) -> CheckpointRecord {
    let update = AgentUpdate { messages: vec![Message::user(text)], ..AgentUpdate::default() };
    CheckpointRecord {
        seq,
        format: 1,
        run_id: "r1".into(),
        kind: RecordKind::Input,
        node: None,
        next: Some("agent".into()),
        updates: vec![serde_json::value::to_raw_value(&update).unwrap()],
        interrupts: Vec::new(),
        decisions: Default::default(),
        reason: None,
        created_at_ms: 1,
    }
}

#[tokio::test]
async fn messages_commit_with_their_checkpoint_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = SqliteCheckpointer::open(&dir.path().join("t.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let conv = store.create_conversation(7, 1, "lumie").await.unwrap();
    let projecting = ProjectingCheckpointer::sqlite(ckpt);
    let thread = ThreadId::new(7, conv);

    projecting.append(&thread, &record(1, "hola")).await.unwrap();
    assert_eq!(store.messages(conv).await.unwrap().iter().map(|m| m.2.as_str()).collect::<Vec<_>>(), ["hola"]);

    // A second writer at the same position loses: its checkpoint and its message both vanish.
    let err = projecting.append(&thread, &record(1, "duplicate")).await.unwrap_err();
    assert!(matches!(err, CheckpointError::Conflict { .. }), "{err}");
    assert_eq!(store.messages(conv).await.unwrap().len(), 1, "no message without its checkpoint");
    assert_eq!(projecting.load(&thread, None).await.unwrap().len(), 1);
}
