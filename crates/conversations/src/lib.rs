//! Conversation storage: the conversations a chat service holds, their messages, and the write
//! actions awaiting a person's decision.
//!
//! Owns: the [`ConversationStore`] trait and its stores — [`MemoryConversationStore`] (tests and
//! benchmarks), [`SqliteConversationStore`] (the embedded default, in the checkpoints' file),
//! [`PostgresConversationStore`] (replicas share it) and [`backend::BackendConversationStore`]
//! (a backend that keeps the conversation itself, through HMAC-signed calls, whose scheme and
//! replay stores — in process, or PostgreSQL shared by replicas — are [`backend::signing`] and
//! [`backend::replay`]); the
//! [`ProjectingCheckpointer`], which writes what a graph step adds to its conversation in the
//! same transaction as the step's checkpoint; and [`ConversationThread`], the one place a
//! conversation's checkpoint thread id is written and read; and the [`RunEventStore`], where
//! replicas keep what their runs streamed so a client can resume on any of them.
//!
//! Does not own: what a step adds to a conversation (the agent's [`Projector`], in the agents
//! crate) or the HTTP routes (the server crate).
//!
//! Invariants live in the database so replicas can share it: conversation and message ids are
//! allocated by the database, one running turn per conversation is a conditional update, and
//! one decision per pending action is an update guarded by `decision IS NULL`.
//!
//! ```
//! use toolgraph_conversations::ConversationThread;
//! let thread = ConversationThread { tenant: 7, conversation: 10 }.thread_id();
//! assert_eq!(ConversationThread::of(&thread), Some(ConversationThread { tenant: 7, conversation: 10 }));
//! ```
#![warn(missing_docs)]

pub mod backend;
pub mod items;
mod memory;
mod postgres;
mod projection;
pub mod retention;
pub mod run_events;
mod sqlite;
pub mod usage;

pub use items::{ItemVector, MemoryItem};
pub use memory::MemoryConversationStore;
pub use postgres::PostgresConversationStore;
pub use projection::{ProjectingCheckpointer, Projection, Projector};
pub use retention::IdleRule;
pub use run_events::{
    MemoryRunEvents, PostgresRunEvents, RunEventAppend, RunEventNotice, RunEventRecord, RunEventStore, RunScope,
};
pub use sqlite::SqliteConversationStore;
pub use usage::TurnUsage;

/// The conversation tables' migrations on SQLite (beside the checkpoints' in one table).
const SQLITE_MIGRATIONS: toolgraph_graph::migrations::EmbeddedMigrations = toolgraph_graph::embedded_migrations!(
    "migrations/sqlite",
    [
        "1001_conversations.sql",
        "1002_turn_leases.sql",
        "1003_running_turns.sql",
        "1004_threads.sql",
        "1005_memory_items.sql",
        "1006_turn_usage.sql",
        "1007_retention.sql",
        "1008_uploads.sql",
        "1009_item_vectors.sql",
        "1010_thread_branches.sql"
    ]
);
/// The conversation tables' migrations on PostgreSQL: conversations, leases, run events,
/// replays and threads.
const POSTGRES_MIGRATIONS: toolgraph_graph::migrations::EmbeddedMigrations = toolgraph_graph::embedded_migrations!(
    "migrations/postgres",
    [
        "1001_conversations.sql",
        "1002_turn_leases.sql",
        "1003_run_events.sql",
        "1004_running_turns.sql",
        "1005_signature_nonces.sql",
        "1006_run_events_conversation.sql",
        "1007_threads.sql",
        "1008_memory_items.sql",
        "1009_turn_usage.sql",
        "1010_retention.sql",
        "1011_uploads.sql",
        "1012_item_vectors.sql",
        "1013_thread_branches.sql",
    ]
);

/// The PostgreSQL migrations, ready to run beside the checkpoints' (missing versions allowed).
async fn postgres_migrator() -> Result<sqlx::migrate::Migrator, StoreError> {
    let mut m = POSTGRES_MIGRATIONS.migrator().await.map_err(|e| StoreError(format!("migration failed: {e}")))?;
    // The checkpoint migrations share the migrations table.
    m.set_ignore_missing(true);
    Ok(m)
}

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgraph_graph::ThreadId;

/// A store failure (the database or the backend is down, or answered an error).
#[derive(Debug, thiserror::Error)]
#[error("conversation store: {0}")]
pub struct StoreError(pub String);

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self(e.to_string())
    }
}

impl From<toolgraph_graph::SqliteError> for StoreError {
    fn from(e: toolgraph_graph::SqliteError) -> Self {
        Self(e.to_string())
    }
}

/// A conversation's owner-visible facts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// Id.
    pub id: i64,
    /// The agent it talks to.
    pub agent: String,
}

/// One of a user's conversations, as a list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ConversationSummary {
    /// Id.
    pub id: i64,
    /// The agent it talks to.
    pub agent: String,
    /// Its first user message, cut at [`SUMMARY_TITLE_CHARS`] characters (empty before one).
    pub title: String,
}

/// How much of the first message a [`ConversationSummary`] keeps.
pub const SUMMARY_TITLE_CHARS: usize = 80;

/// `text` cut at [`SUMMARY_TITLE_CHARS`] characters.
pub(crate) fn summary_title(text: &str) -> String {
    text.chars().take(SUMMARY_TITLE_CHARS).collect()
}

/// Who a stored message is from, as it is stored (`user`, `assistant`, `tool`, `pending`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The person's message.
    User,
    /// The assistant's reply (not its tool-calling turns, which people do not read).
    Assistant,
    /// A tool's outcome.
    Tool,
    /// A write action awaiting a decision; its id is the pending action's message id.
    Pending,
}

impl Role {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
            Self::Pending => "pending",
        }
    }

    /// The role of a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "user" => Self::User,
            "assistant" => Self::Assistant,
            "tool" => Self::Tool,
            "pending" => Self::Pending,
            _ => return None,
        })
    }
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// Id, allocated by the store.
    pub id: i64,
    /// Who it is from.
    pub role: Role,
    /// Its text (a tool message: the outcome as JSON).
    pub content: String,
}

/// A write action to persist as awaiting a decision (its `pending` message is created with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewPending {
    /// Its conversation.
    pub conversation_id: i64,
    /// The run that paused for it (its group: decided together).
    pub run_id: String,
    /// The graph's interrupt id.
    pub interrupt_id: String,
    /// The tool.
    pub tool_name: String,
    /// Human-readable action text.
    pub description: String,
    /// The tool arguments.
    pub arguments: Value,
}

/// A write action awaiting (or having received) a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingAction {
    /// The message id the contract exposes.
    pub message_id: i64,
    /// What was persisted.
    #[serde(flatten)]
    pub action: NewPending,
    /// `Some(true)` approved, `Some(false)` rejected, `None` undecided.
    pub decision: Option<bool>,
    /// The final confirm response of its group, once the group was resumed.
    pub response: Option<String>,
}

impl From<&PendingAction> for toolgraph_protocol::PendingAction {
    /// The action as the contract shows it (a `pending` frame, a confirm answer).
    fn from(p: &PendingAction) -> Self {
        Self {
            message_id: toolgraph_protocol::MessageId(p.message_id),
            tool_name: p.action.tool_name.clone(),
            description: p.action.description.clone(),
            arguments: p.action.arguments.clone(),
        }
    }
}

/// A pending action as its owner names it: it is found only if it belongs to that
/// conversation, tenant and user (another's is not told apart from a missing one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingLookup {
    /// The tenant asking.
    pub tenant_id: i64,
    /// The user asking.
    pub user_id: i64,
    /// The conversation it must belong to.
    pub conversation_id: i64,
    /// Its message id.
    pub message_id: i64,
}

/// A run's claim on its conversation: one run at a time, held as a lease that its owner
/// renews while the run works. An expired lease (its holder died or hung) may be taken over by
/// anyone; a restarted owner frees what it held ([`ConversationStore::release_owner`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnClaim {
    /// The run.
    pub run_id: String,
    /// Who runs it: the service instance (`server.instance_id`).
    pub owner: String,
    /// How long the claim lasts from now without a renewal, in milliseconds.
    pub lease_ms: i64,
}

/// A conversation whose claim was freed (its owner restarted) or taken over (its lease
/// expired): the turn that held it was interrupted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleasedTurn {
    /// The tenant.
    pub tenant_id: i64,
    /// The conversation.
    pub conversation_id: i64,
    /// The agent it talks to.
    pub agent: String,
    /// The conversation's user (0 from a backend that does not say).
    #[serde(default)]
    pub user_id: i64,
    /// The interrupted run, whose stream is ended with an `error` event ("" from a backend
    /// that does not say).
    #[serde(default)]
    pub run_id: String,
}

/// A claim written by a build without leases counts as held for this long after it began.
pub(crate) const LEGACY_CLAIM_MS: i64 = 600_000;

/// What recording a decision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decided {
    /// Newly recorded.
    Recorded,
    /// The same decision was already recorded.
    Same,
    /// The opposite decision was already recorded.
    Conflict,
}

/// A conversation's checkpoint thread: the namespace is the tenant, so deleting a tenant's
/// checkpoints is deleting a namespace. The one place the thread id of a conversation is
/// written and read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConversationThread {
    /// The tenant id.
    pub tenant: i64,
    /// The conversation id.
    pub conversation: i64,
}

impl ConversationThread {
    /// The checkpoint thread of the conversation (`tenant:conversation`).
    pub fn thread_id(self) -> ThreadId {
        ThreadId::new(self.tenant, self.conversation)
    }

    /// The conversation of a thread written by [`thread_id`](Self::thread_id); `None` for a
    /// thread that is not a conversation's (a terminal chat's, a benchmark's).
    pub fn of(thread: &ThreadId) -> Option<Self> {
        let (tenant, conversation) = thread.as_str().split_once(':')?;
        Some(Self { tenant: tenant.parse().ok()?, conversation: conversation.parse().ok()? })
    }
}

/// A LangGraph thread (docs/langgraph.md): a client's handle on a conversation, made before the
/// conversation is — a conversation needs its agent, which the thread's first run names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thread {
    /// Its id: a UUID the server made, or the client's own.
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: i64,
    /// The user it belongs to.
    pub user: i64,
    /// The conversation its runs talk in, once the first has run.
    pub conversation: Option<i64>,
    /// The client's metadata.
    pub metadata: serde_json::Map<String, Value>,
    /// When it was made (ms since the epoch).
    pub created_at_ms: i64,
    /// When it, or its metadata, last changed.
    pub updated_at_ms: i64,
}

impl Thread {
    /// A new thread `id` of `tenant`/`user`, made now, with `metadata` and no conversation yet.
    pub fn new(id: String, tenant: i64, user: i64, metadata: serde_json::Map<String, Value>) -> Self {
        let at = now_ms();
        Self { id, tenant, user, conversation: None, metadata, created_at_ms: at, updated_at_ms: at }
    }
}

/// At most this many threads of one user are read for a search.
pub const THREADS_READ: usize = 10_000;

/// The refusal of a store that keeps no threads (a backend's).
fn no_threads() -> StoreError {
    StoreError("this store keeps no threads: use server.store = \"sqlite\" or \"postgres\"".into())
}

/// Storage of conversations, messages and pending actions.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// Creates a conversation and returns its id.
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError>;
    /// The conversation if it exists and belongs to `tenant` and `user`.
    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError>;
    /// Claims the conversation for `claim`'s run; `false` while another run's lease is live.
    async fn begin_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError>;
    /// Extends `claim`'s lease by its `lease_ms` from now; `false` when the run no longer
    /// holds the conversation (its lease expired and another run took it).
    async fn renew_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError>;
    /// Releases the conversation if `run_id` holds it.
    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError>;
    /// Deletes the newest `n` messages of `conversation`, with the pending actions that hang
    /// off them: what a run rolled back had written. Returns how many messages went.
    async fn delete_last_messages(&self, _conversation: i64, _n: usize) -> Result<u64, StoreError> {
        Err(StoreError("this store keeps no messages of its own: a run cannot be rolled back".into()))
    }
    /// Frees every claim `owner` holds (a restarted instance: its runs died with it); returns
    /// the conversations freed, whose interrupted turns the caller closes.
    async fn release_owner(&self, owner: &str) -> Result<Vec<ReleasedTurn>, StoreError>;
    /// Takes over at most `limit` conversations whose run's lease expired (its holder died or
    /// hung): each is claimed for `claim` (one run id for the batch; the taker ends each claim
    /// once it closed that turn). Returns them with the expired runs, which the caller closes.
    /// Replicas that sweep at once never take the same conversation.
    async fn take_over_expired(&self, claim: &TurnClaim, limit: usize) -> Result<Vec<ReleasedTurn>, StoreError>;
    /// Appends a message; returns its id.
    async fn add_message(&self, conversation: i64, role: Role, content: &str) -> Result<i64, StoreError>;
    /// Persists a pending action and its message; returns the message id.
    async fn add_pending(&self, pending: &NewPending) -> Result<i64, StoreError>;
    /// The pending action `lookup` names, if it belongs to that conversation, tenant and user.
    async fn pending(&self, lookup: &PendingLookup) -> Result<Option<PendingAction>, StoreError>;
    /// Every pending action of one run, in message order.
    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError>;
    /// Records a decision once.
    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError>;
    /// Stores the final confirm response of a run's group, for idempotent replays.
    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError>;
    /// Messages of a conversation, oldest first.
    async fn messages(&self, conversation: i64) -> Result<Vec<StoredMessage>, StoreError>;
    /// `tenant`/`user`'s conversations, newest first, at most `limit`.
    async fn list_conversations(
        &self,
        tenant: i64,
        user: i64,
        limit: usize,
    ) -> Result<Vec<ConversationSummary>, StoreError>;
    /// Deletes a conversation of `tenant`/`user`; whether it existed.
    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError>;
    /// Deletes a user's conversations; their ids.
    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError>;
    /// Deletes a tenant's conversations; their ids.
    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError>;

    /// Whether it keeps LangGraph's threads (the others' methods refuse).
    fn keeps_threads(&self) -> bool {
        false
    }
    /// Keeps a new thread; `false` when its owner has a thread of that id (ids are each
    /// person's own).
    async fn create_thread(&self, _thread: &Thread) -> Result<bool, StoreError> {
        Err(no_threads())
    }
    /// Thread `id` of `tenant` and `user`.
    async fn thread(&self, _tenant: i64, _user: i64, _id: &str) -> Result<Option<Thread>, StoreError> {
        Err(no_threads())
    }
    /// `tenant`/`user`'s threads, the most recently changed first, at most [`THREADS_READ`].
    async fn threads(&self, _tenant: i64, _user: i64) -> Result<Vec<Thread>, StoreError> {
        Err(no_threads())
    }
    /// Replaces thread `id`'s metadata (when given) and sets its conversation (when given and it
    /// has none); marks it changed. Whether it is theirs.
    async fn update_thread(
        &self,
        _tenant: i64,
        _user: i64,
        _id: &str,
        _metadata: Option<&serde_json::Map<String, Value>>,
        _conversation: Option<i64>,
    ) -> Result<bool, StoreError> {
        Err(no_threads())
    }
    /// Moves thread `id` from conversation `from` to conversation `to` (a fork of it, theirs
    /// too), if it is still bound to `from`; marks it changed, and keeps `from` as one of its
    /// [`thread_branches`](Self::thread_branches) (`to` is no longer one). Whether it moved.
    async fn rebind_thread(
        &self,
        _tenant: i64,
        _user: i64,
        _id: &str,
        _from: i64,
        _to: i64,
    ) -> Result<bool, StoreError> {
        Err(no_threads())
    }
    /// The conversations thread `id` left for another ([`rebind_thread`](Self::rebind_thread))
    /// that still exist: deleted with the thread.
    async fn thread_branches(&self, _tenant: i64, _user: i64, _id: &str) -> Result<Vec<i64>, StoreError> {
        Err(no_threads())
    }
    /// Deletes thread `id` of `tenant`/`user` (not its conversation); what it was.
    async fn delete_thread(&self, _tenant: i64, _user: i64, _id: &str) -> Result<Option<Thread>, StoreError> {
        Err(no_threads())
    }

    /// Writes `item` for `tenant`/`user`: a new one, or in place of the one under its key
    /// (keeping when that was first written).
    async fn put_item(&self, _tenant: i64, _user: i64, _item: &MemoryItem) -> Result<(), StoreError> {
        Err(no_items())
    }
    /// The unexpired item under `namespace`/`key`.
    async fn item(
        &self,
        _tenant: i64,
        _user: i64,
        _namespace: &[String],
        _key: &str,
        _now_ms: i64,
    ) -> Result<Option<MemoryItem>, StoreError> {
        Err(no_items())
    }
    /// The unexpired items in `prefix` and below, the most recently written first, at most
    /// [`items::ITEMS_READ`].
    async fn items(
        &self,
        _tenant: i64,
        _user: i64,
        _prefix: &[String],
        _now_ms: i64,
    ) -> Result<Vec<MemoryItem>, StoreError> {
        Err(no_items())
    }
    /// How many unexpired items `tenant`/`user` keeps.
    async fn count_items(&self, _tenant: i64, _user: i64, _now_ms: i64) -> Result<u64, StoreError> {
        Err(no_items())
    }
    /// The distinct namespaces of the unexpired items in `prefix` and below, at most
    /// [`items::ITEMS_READ`].
    async fn item_namespaces(
        &self,
        _tenant: i64,
        _user: i64,
        _prefix: &[String],
        _now_ms: i64,
    ) -> Result<Vec<Vec<String>>, StoreError> {
        Err(no_items())
    }
    /// Moves the expiry of these items (those with a time to live) to `now_ms` plus it.
    async fn refresh_items(
        &self,
        _tenant: i64,
        _user: i64,
        _items: &[(Vec<String>, String)],
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        Err(no_items())
    }
    /// Sets the vectors of `items` (each as given in [`MemoryItem::vector`]) where the kept
    /// item is still the one that was embedded (written at the same `updated_at_ms`): a
    /// rewrite meanwhile keeps its own.
    async fn set_item_vectors(&self, _tenant: i64, _user: i64, _items: &[MemoryItem]) -> Result<(), StoreError> {
        Err(no_items())
    }
    /// Deletes the item under `namespace`/`key`; whether there was one.
    async fn delete_item(
        &self,
        _tenant: i64,
        _user: i64,
        _namespace: &[String],
        _key: &str,
    ) -> Result<bool, StoreError> {
        Err(no_items())
    }
    /// Deletes every item expired at `now_ms`; how many.
    async fn prune_items(&self, _now_ms: i64) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Whether it keeps token usage (the others' methods refuse, and recording does nothing).
    fn keeps_usage(&self) -> bool {
        false
    }
    /// Keeps what a turn of `conversation` (of `tenant`/`user`) used, one row per model.
    async fn record_usage(
        &self,
        _tenant: i64,
        _user: i64,
        _conversation: i64,
        _usage: &[TurnUsage],
    ) -> Result<(), StoreError> {
        Ok(())
    }
    /// What `conversation`'s turns used, oldest first (the caller checked it is the asker's).
    async fn conversation_usage(&self, _conversation: i64) -> Result<Vec<TurnUsage>, StoreError> {
        Err(usage::no_usage())
    }
    /// The tokens (prompt and completion) `tenant`'s turns used since `since_ms`, included.
    async fn tenant_tokens_since(&self, _tenant: i64, _since_ms: i64) -> Result<u64, StoreError> {
        Err(usage::no_usage())
    }
    /// Deletes at most `limit` of the usage rows kept before `before_ms`; how many.
    async fn prune_usage(&self, _before_ms: i64, _limit: usize) -> Result<u64, StoreError> {
        Err(usage::no_usage())
    }

    /// Claims periodic task `task`'s pass at `now_ms` for `holder`, unless a pass of it was
    /// claimed less than `every_ms` before; whether this one was. Replicas sharing the store
    /// never both claim one pass. A store no other process shares claims every call.
    async fn claim_pass(&self, _task: &str, _holder: &str, _now_ms: i64, _every_ms: i64) -> Result<bool, StoreError> {
        Ok(true)
    }
    /// Deletes at most `limit` conversations idle under `rule` (no turn since its time, and
    /// none running now, `now_ms`), with their messages, pending actions and thread; returns
    /// them as (tenant, conversation), for the caller to delete their checkpoints and frames.
    async fn delete_idle_conversations(
        &self,
        _rule: &IdleRule,
        _now_ms: i64,
        _limit: usize,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        Err(retention::no_retention())
    }
    /// Conversations with a turn since `since_ms` (one with no turn time kept, from before
    /// it was: made since then), of ids above `after`, ascending, at most `limit`: (tenant,
    /// conversation, agent) — those whose checkpoints retention compacts.
    async fn conversations_active_since(
        &self,
        _since_ms: i64,
        _after: i64,
        _limit: usize,
    ) -> Result<Vec<(i64, i64, String)>, StoreError> {
        Err(retention::no_retention())
    }
    /// Keeps a document `tenant`/`user` uploaded, under `id`, until a turn attaches it.
    async fn put_upload(
        &self,
        _tenant: i64,
        _user: i64,
        _id: &str,
        _name: &str,
        _bytes: &[u8],
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        Err(no_uploads())
    }
    /// The uploads among `ids` that are `tenant`/`user`'s, kept since `since_ms` or later.
    async fn uploads(
        &self,
        _tenant: i64,
        _user: i64,
        _ids: &[String],
        _since_ms: i64,
    ) -> Result<Vec<Upload>, StoreError> {
        Err(no_uploads())
    }
    /// Deletes `tenant`/`user`'s uploads among `ids` (attached, or withdrawn); how many.
    async fn delete_uploads(&self, _tenant: i64, _user: i64, _ids: &[String]) -> Result<u64, StoreError> {
        Err(no_uploads())
    }
    /// Deletes the uploads kept since before `before_ms` that no turn attached; how many.
    async fn prune_uploads(&self, _before_ms: i64) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// Deletes the LangGraph threads that never ran, unchanged since `rule`'s time, of the
    /// tenants `rule` covers (a rule of one agent covers none); how many.
    async fn delete_idle_threads(&self, _rule: &IdleRule) -> Result<u64, StoreError> {
        Err(retention::no_retention())
    }
}

/// A document uploaded to attach to a turn, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// Its id, which a turn names to attach it.
    pub id: String,
    /// Its file name (the extension says its format).
    pub name: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

fn no_uploads() -> StoreError {
    StoreError("this store keeps no uploads: use server.store = \"sqlite\" or \"postgres\"".into())
}

fn no_items() -> StoreError {
    StoreError("this store keeps no memory items: use server.store = \"sqlite\" or \"postgres\"".into())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_embedded_migrations_hold_every_file_of_their_directories() {
        let dir = |d: &str| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(d);
        toolgraph_graph::migrations::assert_same_as_directory(SQLITE_MIGRATIONS, &dir("migrations/sqlite")).await;
        toolgraph_graph::migrations::assert_same_as_directory(POSTGRES_MIGRATIONS, &dir("migrations/postgres")).await;
    }

    #[test]
    fn a_conversation_thread_reads_back_and_other_threads_are_not_conversations() {
        let c = ConversationThread { tenant: 3, conversation: 42 };
        assert_eq!(c.thread_id().as_str(), "3:42");
        assert_eq!(ConversationThread::of(&c.thread_id()), Some(c));
        assert_eq!(ConversationThread::of(&ThreadId::new("cli", "tutor")), None);
        assert_eq!(ConversationThread::of(&ThreadId::new(3, "x")), None);
    }

    #[test]
    fn roles_keep_their_stored_names() {
        for role in [Role::User, Role::Assistant, Role::Tool, Role::Pending] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
            assert_eq!(serde_json::to_value(role).unwrap(), role.as_str());
        }
        assert_eq!(Role::parse("system"), None);
    }

    #[test]
    fn a_pending_action_is_its_request_plus_the_decision_on_the_wire() {
        let p = PendingAction {
            message_id: 5,
            action: NewPending {
                conversation_id: 1,
                run_id: "r".into(),
                interrupt_id: "i".into(),
                tool_name: "send_sms".into(),
                description: "Send".into(),
                arguments: serde_json::json!({"to": "+1"}),
            },
            decision: None,
            response: None,
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"messageId": 5, "conversationId": 1, "runId": "r", "interruptId": "i",
                "toolName": "send_sms", "description": "Send", "arguments": {"to": "+1"},
                "decision": null, "response": null})
        );
        assert_eq!(serde_json::from_value::<PendingAction>(v).unwrap(), p);
    }
}
