//! A turn's messages commit with its checkpoint, or not at all, and the run learns their ids
//! from the write itself.

use toolgraph_agents::kit::AgentUpdate;
use toolgraph_conversations::{ConversationStore, ConversationThread, ProjectingCheckpointer, SqliteConversationStore};
use toolgraph_graph::{CheckpointError, CheckpointRecord, Checkpointer, RecordKind, SqliteCheckpointer};
use toolgraph_llm::Message;

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
        metadata: None,
        graph_version: None,
        created_at_ms: 1,
    }
}

#[tokio::test]
async fn messages_commit_with_their_checkpoint_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = SqliteCheckpointer::open(&dir.path().join("t.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let conv = store.create_conversation(7, 1, "lumie").await.unwrap();
    let projecting = ProjectingCheckpointer::sqlite(ckpt, toolgraph_agents::conversation::project);
    let thread = ConversationThread { tenant: 7, conversation: conv }.thread_id();

    let derived = projecting.append(&thread, &record(1, "hola")).await.unwrap();
    let stored = store.messages(conv).await.unwrap();
    assert_eq!(stored.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), ["hola"]);
    assert_eq!(derived.updates, [stored[0].id], "the write reports the id the message got");

    // A second writer at the same position loses: its checkpoint and its message both vanish.
    let err = projecting.append(&thread, &record(1, "duplicate")).await.unwrap_err();
    assert!(matches!(err, CheckpointError::Conflict { .. }), "{err}");
    assert_eq!(store.messages(conv).await.unwrap().len(), 1, "no message without its checkpoint");
    assert_eq!(projecting.load(&thread, None).await.unwrap().len(), 1);
}
