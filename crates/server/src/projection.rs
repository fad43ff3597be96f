//! The conversation as a projection of the checkpoint log, written in the same transaction.
//!
//! [`ProjectingCheckpointer`] wraps the agents' checkpoint store: when a step's record is
//! appended, the messages that step produced (the user's message, the assistant's reply,
//! tool results) and the pending actions it paused for are inserted in the **same
//! transaction** as the record. A turn's messages and its checkpoint therefore commit
//! together or not at all, on every replica (SPEC §6).
//!
//! A store in another place (process memory, or the backend of seed 002) cannot share a
//! transaction with the checkpoints: there the projection is written to the store first and
//! the record after it, so a record never points past messages the store lacks.

use crate::store::{ConversationStore, sqlite_insert_message, sqlite_insert_pending};
use crate::store_pg::{pg_insert_message, pg_insert_pending};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_graph::react::AgentUpdate;
use toolgraph_graph::{
    CheckpointError, CheckpointMeta, CheckpointRecord, Checkpointer, EncodedRecord, PostgresCheckpointer,
    SqliteCheckpointer, ThreadId,
};
use toolgraph_llm::Message;

enum Backend {
    /// Checkpoints in one place, the conversation in a store elsewhere.
    Forwarding(Box<dyn Checkpointer>, Arc<dyn ConversationStore>),
    Sqlite(SqliteCheckpointer),
    Postgres(PostgresCheckpointer),
}

/// A checkpoint store that also writes the conversation projection atomically.
pub struct ProjectingCheckpointer {
    backend: Backend,
}

impl ProjectingCheckpointer {
    /// Over SQLite (the conversation tables live in the same database).
    pub fn sqlite(inner: SqliteCheckpointer) -> Self {
        Self { backend: Backend::Sqlite(inner) }
    }
    /// Over PostgreSQL (the conversation tables live in the same database).
    pub fn postgres(inner: PostgresCheckpointer) -> Self {
        Self { backend: Backend::Postgres(inner) }
    }
    /// Checkpoints in `inner`, the conversation in `store` (process memory, or the
    /// backend-callback store): the projection is written first, then the record.
    pub fn forwarding(inner: impl Checkpointer, store: Arc<dyn ConversationStore>) -> Self {
        Self { backend: Backend::Forwarding(Box::new(inner), store) }
    }

    fn inner(&self) -> &dyn Checkpointer {
        match &self.backend {
            Backend::Forwarding(c, _) => c.as_ref(),
            Backend::Sqlite(c) => c,
            Backend::Postgres(c) => c,
        }
    }
}

/// What one record adds to its conversation.
#[derive(Debug, Default, PartialEq)]
struct Projection {
    messages: Vec<(&'static str, String)>,
    pending: Vec<(String, String, String, Value)>,
}

/// The conversation id of a service thread (`tenant:conversation`).
fn conversation_of(thread: &ThreadId) -> Option<i64> {
    thread.as_str().split_once(':').and_then(|(_, c)| c.parse().ok())
}

fn project(record: &CheckpointRecord) -> Projection {
    let mut p = Projection::default();
    for raw in &record.updates {
        let Ok(update) = serde_json::from_str::<AgentUpdate>(raw.get()) else { continue };
        for m in update.messages {
            match m {
                Message::User { content } => p.messages.push(("user", content)),
                // An assistant turn that only calls tools is not a message people read.
                Message::Assistant { content, tool_calls } if tool_calls.is_empty() => {
                    p.messages.push(("assistant", content))
                }
                Message::Tool { tool_call_id, name, content } => {
                    let outcome = serde_json::from_str::<Value>(&content).unwrap_or(Value::String(content));
                    p.messages.push((
                        "tool",
                        json!({ "tool": name, "call_id": tool_call_id, "outcome": outcome }).to_string(),
                    ));
                }
                Message::Assistant { .. } | Message::System { .. } => {}
            }
        }
    }
    for i in &record.interrupts {
        let text = |k: &str| i.payload.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
        let args = i.payload.get("arguments").cloned().unwrap_or(Value::Null);
        p.pending.push((i.id.0.clone(), text("tool"), text("description"), args));
    }
    p
}

/// Commits when everything was written, else rolls back at once: a dropped transaction is
/// only rolled back when its connection is next used, and holds its locks until then.
async fn finish(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    written: Result<(), CheckpointError>,
) -> Result<(), CheckpointError> {
    match written {
        Ok(()) => tx.commit().await.map_err(pg_error),
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

fn pg_error(e: sqlx::Error) -> CheckpointError {
    CheckpointError::Backend { backend: "postgres", message: e.to_string() }
}

#[async_trait]
impl Checkpointer for ProjectingCheckpointer {
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<(), CheckpointError> {
        let projection = project(record);
        let Some(conv) = conversation_of(thread).filter(|_| projection != Projection::default()) else {
            return self.inner().append(thread, record).await;
        };
        match &self.backend {
            Backend::Sqlite(c) => {
                let record = EncodedRecord::new(thread, record)?;
                // Encoded here, like the record, so the shared database thread only inserts.
                let pending: Vec<_> = projection
                    .pending
                    .into_iter()
                    .map(|(id, tool, text, args)| (id, tool, text, args.to_string()))
                    .collect();
                let messages = projection.messages;
                // The whole step in one closure: one hand-off to the database thread.
                c.database()
                    .call(move |conn| {
                        // Dropped without commit on any error below: rolled back at once.
                        let tx = conn.transaction()?;
                        SqliteCheckpointer::append_in(&tx, &record)?;
                        for (role, content) in &messages {
                            sqlite_insert_message(&tx, conv, role, content)?;
                        }
                        for (id, tool, description, args) in &pending {
                            sqlite_insert_pending(&tx, conv, record.run_id(), id, tool, description, args)?;
                        }
                        Ok(tx.commit()?)
                    })
                    .await?
            }
            Backend::Postgres(c) => {
                let mut tx = c.pool().begin().await.map_err(pg_error)?;
                let written = async {
                    PostgresCheckpointer::append_with(&mut *tx, thread, record).await?;
                    for (role, content) in &projection.messages {
                        pg_insert_message(&mut tx, conv, role, content).await.map_err(pg_error)?;
                    }
                    for (id, tool, description, args) in &projection.pending {
                        pg_insert_pending(&mut tx, conv, &record.run_id, id, tool, description, args)
                            .await
                            .map_err(pg_error)?;
                    }
                    Ok::<_, CheckpointError>(())
                }
                .await;
                finish(tx, written).await
            }
            Backend::Forwarding(c, store) => {
                let err = |e: crate::store::StoreError| CheckpointError::Backend { backend: "store", message: e.0 };
                for (role, content) in &projection.messages {
                    store.add_message(conv, role, content).await.map_err(err)?;
                }
                for (id, tool, description, args) in &projection.pending {
                    store.add_pending(conv, &record.run_id, id, tool, description, args).await.map_err(err)?;
                }
                c.append(thread, record).await
            }
        }
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        self.inner().head(thread).await
    }

    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.inner().load(thread, upto).await
    }

    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.inner().load_from(thread, from).await
    }

    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        self.inner().list(thread).await
    }

    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError> {
        self.inner().fork(from, at, to).await
    }

    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError> {
        self.inner().delete_thread(thread).await
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError> {
        self.inner().delete_namespace(namespace).await
    }

    async fn stored_bytes(&self) -> Result<u64, CheckpointError> {
        self.inner().stored_bytes().await
    }
}
