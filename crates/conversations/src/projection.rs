//! The conversation as a projection of the checkpoint log, written in the same transaction.
//!
//! [`ProjectingCheckpointer`] wraps the agents' checkpoint store: when a step's record is
//! appended, what the step adds to its conversation (the user's message, the assistant's
//! reply, tool results, the pending actions it paused for — the agent's [`Projector`] says)
//! is inserted in the **same transaction** as the record, so a turn's messages and its
//! checkpoint commit together or not at all, on every replica (docs/service.md). The ids the
//! rows got go back to the run as the record's [`DerivedRows`], so the service never reads
//! them back.
//!
//! A store in another place (process memory, or a backend) cannot share a transaction with the
//! checkpoints: there the projection is written to the store first and the record after it, so
//! a record never points past messages the store lacks.

use crate::postgres::{insert_message as pg_insert_message, insert_pending as pg_insert_pending};
use crate::sqlite::{insert_message, insert_pending};
use crate::{ConversationStore, ConversationThread, NewPending, Role, StoreError};
use async_trait::async_trait;
use std::sync::Arc;
use toolgraph_graph::{
    CheckpointError, CheckpointMeta, CheckpointRecord, Checkpointer, DerivedRows, EncodedRecord, InterruptId,
    PostgresCheckpointer, SqliteCheckpointer, ThreadId,
};

/// What one checkpoint record adds to its conversation.
#[derive(Debug, Default, PartialEq)]
pub struct Projection {
    /// Messages people read, in order.
    pub messages: Vec<(Role, String)>,
    /// Write actions the step paused for, one per interrupt of the record.
    pub pending: Vec<NewPending>,
}

impl Projection {
    /// Whether the record adds nothing.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.pending.is_empty()
    }
}

/// What a record of conversation `conversation` adds to it: supplied by the agent whose state
/// the records hold (the graph runtime and this crate do not know the state's shape).
pub type Projector = fn(conversation: i64, record: &CheckpointRecord) -> Projection;

enum Backend {
    /// Checkpoints in one place, the conversation in a store elsewhere.
    Forwarding(Box<dyn Checkpointer>, Arc<dyn ConversationStore>),
    Sqlite(SqliteCheckpointer),
    Postgres(PostgresCheckpointer),
}

/// A checkpoint store that also writes the conversation projection atomically.
///
/// The projector reads records of one state type: agents with different states share one
/// store through [`projecting`](Self::projecting), each graph compiled over its own view.
#[derive(Clone)]
pub struct ProjectingCheckpointer {
    backend: Arc<Backend>,
    projector: Projector,
}

impl ProjectingCheckpointer {
    /// Over SQLite (the conversation tables live in the same database).
    pub fn sqlite(inner: SqliteCheckpointer, projector: Projector) -> Self {
        Self { backend: Arc::new(Backend::Sqlite(inner)), projector }
    }
    /// Over PostgreSQL (the conversation tables live in the same database).
    pub fn postgres(inner: PostgresCheckpointer, projector: Projector) -> Self {
        Self { backend: Arc::new(Backend::Postgres(inner)), projector }
    }
    /// Checkpoints in `inner`, the conversation in `store` (process memory, or the
    /// backend-callback store): the projection is written first, then the record.
    pub fn forwarding(inner: impl Checkpointer, store: Arc<dyn ConversationStore>, projector: Projector) -> Self {
        Self { backend: Arc::new(Backend::Forwarding(Box::new(inner), store)), projector }
    }

    /// The same store (the same checkpoints, conversations and transactions), projecting the
    /// records written through it with `projector`: for an agent whose state is not the one
    /// the store was made for (docs/agents.md, "A graph of your own").
    #[must_use]
    pub fn projecting(&self, projector: Projector) -> Self {
        Self { backend: Arc::clone(&self.backend), projector }
    }

    fn inner(&self) -> &dyn Checkpointer {
        match &*self.backend {
            Backend::Forwarding(c, _) => c.as_ref(),
            Backend::Sqlite(c) => c,
            Backend::Postgres(c) => c,
        }
    }
}

/// The ids of what was written: the messages in order, each pending action's under its interrupt.
fn derived(messages: Vec<i64>, pending: &[NewPending], pending_ids: Vec<i64>) -> DerivedRows {
    DerivedRows {
        updates: messages,
        interrupts: pending.iter().zip(pending_ids).map(|(p, id)| (InterruptId(p.interrupt_id.clone()), id)).collect(),
    }
}

/// Commits when everything was written, else rolls back at once: a dropped transaction is
/// only rolled back when its connection is next used, and holds its locks until then.
async fn finish<T>(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    written: Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    match written {
        Ok(value) => {
            tx.commit().await.map_err(pg_error)?;
            Ok(value)
        }
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
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<DerivedRows, CheckpointError> {
        let Some(conversation) = ConversationThread::of(thread) else {
            return self.inner().append(thread, record).await;
        };
        let projection = (self.projector)(conversation.conversation, record);
        if projection.is_empty() {
            return self.inner().append(thread, record).await;
        }
        let conv = conversation.conversation;
        match &*self.backend {
            Backend::Sqlite(c) => {
                let record = EncodedRecord::new(thread, record)?;
                // Encoded here, like the record, so the shared database thread only inserts.
                let arguments: Vec<String> = projection.pending.iter().map(|p| p.arguments.to_string()).collect();
                let Projection { messages, pending } = projection;
                // The whole step in one closure: one hand-off to the database thread.
                c.database()
                    .call(move |conn| {
                        // Dropped without commit on any error below: rolled back at once.
                        let tx = conn.transaction()?;
                        SqliteCheckpointer::append_in(&tx, &record)?;
                        let mut message_ids = Vec::with_capacity(messages.len());
                        for (role, content) in &messages {
                            message_ids.push(insert_message(&tx, conv, *role, content)?);
                        }
                        let mut pending_ids = Vec::with_capacity(pending.len());
                        for (p, args) in pending.iter().zip(&arguments) {
                            pending_ids.push(insert_pending(&tx, p, args)?);
                        }
                        tx.commit()?;
                        Ok(derived(message_ids, &pending, pending_ids))
                    })
                    .await?
            }
            Backend::Postgres(c) => {
                let mut tx = c.pool().begin().await.map_err(pg_error)?;
                let persistent = c.database().persistent();
                let written = async {
                    PostgresCheckpointer::append_with(&mut *tx, persistent, thread, record).await?;
                    let mut message_ids = Vec::with_capacity(projection.messages.len());
                    for (role, content) in &projection.messages {
                        let id =
                            pg_insert_message(&mut tx, persistent, conv, *role, content).await.map_err(pg_error)?;
                        message_ids.push(id);
                    }
                    let mut pending_ids = Vec::with_capacity(projection.pending.len());
                    for p in &projection.pending {
                        pending_ids.push(pg_insert_pending(&mut tx, persistent, p).await.map_err(pg_error)?);
                    }
                    Ok::<_, CheckpointError>(derived(message_ids, &projection.pending, pending_ids))
                }
                .await;
                finish(tx, written).await
            }
            Backend::Forwarding(c, store) => {
                let err = |e: StoreError| CheckpointError::Backend { backend: "store", message: e.0 };
                let mut message_ids = Vec::with_capacity(projection.messages.len());
                for (role, content) in &projection.messages {
                    message_ids.push(store.add_message(conv, *role, content).await.map_err(err)?);
                }
                let mut pending_ids = Vec::with_capacity(projection.pending.len());
                for p in &projection.pending {
                    pending_ids.push(store.add_pending(p).await.map_err(err)?);
                }
                c.append(thread, record).await?;
                Ok(derived(message_ids, &projection.pending, pending_ids))
            }
        }
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        self.inner().head(thread).await
    }

    async fn span(&self, thread: &ThreadId) -> Result<Option<(u64, u64, String)>, CheckpointError> {
        self.inner().span(thread).await
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

    async fn compact_thread(&self, thread: &ThreadId, keep: u64) -> Result<u64, CheckpointError> {
        self.inner().compact_thread(thread, keep).await
    }

    async fn truncate_thread(&self, thread: &ThreadId, after: u64) -> Result<u64, CheckpointError> {
        self.inner().truncate_thread(thread, after).await
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

    async fn keep_definition(&self, version: &str, definition: &str) -> Result<(), CheckpointError> {
        self.inner().keep_definition(version, definition).await
    }

    async fn definition(&self, version: &str) -> Result<Option<String>, CheckpointError> {
        self.inner().definition(version).await
    }
}
