//! Checkpoint storage for graph runs.
//!
//! Owns: saving and loading [`CheckpointRecord`]s keyed by [`ThreadId`] (`tenant:conversation`),
//! behind one trait with three backends: [`MemoryCheckpointer`], [`SqliteCheckpointer`] (the
//! embedded default: one file in the data directory) and [`PostgresCheckpointer`] (many
//! replicas share it). Does not own: deciding *when* to checkpoint (the runner does).
//!
//! A record holds what one step changed (its state updates), so storage grows linearly with
//! the steps of a thread. Appends are optimistic: a record must carry the sequence number
//! one past the thread's head, and the database's primary key rejects a second writer,
//! so concurrent runs can never interleave, even across replicas.

mod memory;
mod postgres;
mod runs;
mod sqlite;

pub use memory::MemoryCheckpointer;
pub use postgres::PostgresCheckpointer;
pub(crate) use runs::CANCELLED;
pub use runs::INTERRUPTED;
pub(crate) use runs::RunsFold;
pub use runs::{RecordedRun, RunEnd, recorded_runs};
pub use sqlite::{EncodedRecord, SqliteCheckpointer};

/// The checkpoint tables' migrations on SQLite.
pub(crate) const SQLITE_MIGRATIONS: crate::migrations::EmbeddedMigrations =
    crate::embedded_migrations!("migrations/sqlite", ["0001_checkpoints.sql", "0002_graph_definitions.sql"]);
/// The checkpoint tables' migrations on PostgreSQL.
pub(crate) const POSTGRES_MIGRATIONS: crate::migrations::EmbeddedMigrations =
    crate::embedded_migrations!("migrations/postgres", ["0001_checkpoints.sql", "0002_graph_definitions.sql"]);

use crate::interrupt::{Decision, InterruptId, PendingInterrupt};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Version of the serialized record format. Records of older versions keep loading after
/// an upgrade (a paused run survives it); records of newer versions are refused.
pub const FORMAT_VERSION: u32 = 1;

/// A conversation thread, namespaced: `tenant:conversation`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ThreadId(String);

impl ThreadId {
    /// `namespace:id`, e.g. `ThreadId::new("7", "10")` for tenant 7, conversation 10.
    pub fn new(namespace: impl std::fmt::Display, id: impl std::fmt::Display) -> Self {
        Self(format!("{namespace}:{id}"))
    }
    /// The full id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The part before the first `:` (the tenant).
    pub fn namespace(&self) -> &str {
        self.0.split_once(':').map_or(self.0.as_str(), |(ns, _)| ns)
    }
}

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a record marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A run's input (a new turn); also claims the thread for the run.
    Input,
    /// A node's update.
    Step,
    /// A node's update and the interrupts it paused for.
    Interrupt,
    /// Decisions on pending interrupts.
    Decision,
    /// The run stopped early (recursion limit, failure, cancellation).
    Stop,
}

impl RecordKind {
    /// The kind a row's `kind` column names.
    pub(crate) fn parse(kind: &str) -> Option<Self> {
        [Self::Input, Self::Step, Self::Interrupt, Self::Decision, Self::Stop].into_iter().find(|k| k.as_str() == kind)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Step => "step",
            Self::Interrupt => "interrupt",
            Self::Decision => "decision",
            Self::Stop => "stop",
        }
    }
}

/// One checkpoint: what one step of one run changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// Position in the thread, from 1, one past the record before it. A thread compacted by
    /// [`Checkpointer::compact_thread`] starts at a later one: its first record then holds
    /// the updates of those it replaced.
    pub seq: u64,
    /// Serialization format version ([`FORMAT_VERSION`] when written).
    #[serde(default = "format_v1")]
    pub format: u32,
    /// The run that wrote it.
    pub run_id: String,
    /// What it marks.
    pub kind: RecordKind,
    /// The node that produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The node to run next; `None` once the run finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// State updates as JSON text: serialized once when the step ends and stored verbatim,
    /// never re-encoded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub updates: Vec<Box<RawValue>>,
    /// Interrupts this step paused for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupts: Vec<PendingInterrupt>,
    /// Decisions recorded by this record.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decisions: BTreeMap<InterruptId, Decision>,
    /// Why the run stopped (for [`RecordKind::Stop`]); on a [`RecordKind::Decision`] record
    /// with no decisions, why the resume that took the pause over ended before its first step
    /// (`cancelled`; its process died and the thread's next owner closed it; the store refused
    /// its step), the pause (its decisions standing) waiting again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the caller said of the run ([`RunOptions::metadata`](crate::RunOptions::metadata)),
    /// on the record that started it, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Box<RawValue>>,
    /// The version of the graph that wrote it ([`StateGraph::set_version`](crate::StateGraph::set_version)),
    /// when the graph has one: a paused run is resumed by the version that paused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_version: Option<Arc<str>>,
    /// Wall-clock time of writing, in ms since the Unix epoch.
    pub created_at_ms: i64,
}

fn format_v1() -> u32 {
    1
}

/// Rows a store derived from a record and wrote in the same transaction, with the ids it gave
/// them: a projecting store keeps a read model beside the checkpoints (a service's conversation
/// messages and pending actions). The run hands them to its consumer in
/// [`RunEvent::NodeFinished`](crate::RunEvent::NodeFinished), so nobody reads them back. Plain
/// stores derive nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DerivedRows {
    /// The ids of the rows derived from the record's state updates, in the order written.
    pub updates: Vec<i64>,
    /// The row that stands for each interrupt of the record.
    pub interrupts: Vec<(InterruptId, i64)>,
}

impl DerivedRows {
    /// Whether the store derived nothing.
    pub fn is_empty(&self) -> bool {
        self.updates.is_empty() && self.interrupts.is_empty()
    }

    /// The row of interrupt `id`, if the store wrote one.
    pub fn interrupt(&self, id: &InterruptId) -> Option<i64> {
        self.interrupts.iter().find(|(i, _)| i == id).map(|(_, row)| *row)
    }
}

/// A checkpoint as history lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckpointMeta {
    /// Position in the thread.
    pub seq: u64,
    /// The run that wrote it.
    pub run_id: String,
    /// What it marks.
    pub kind: RecordKind,
    /// The node that produced it.
    pub node: Option<String>,
    /// The node that runs next.
    pub next: Option<String>,
    /// The version of the graph that wrote it, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub graph_version: Option<Arc<str>>,
    /// When it was written (ms since the Unix epoch).
    pub created_at_ms: i64,
}

impl From<&CheckpointRecord> for CheckpointMeta {
    fn from(r: &CheckpointRecord) -> Self {
        Self {
            seq: r.seq,
            run_id: r.run_id.clone(),
            kind: r.kind,
            node: r.node.clone(),
            next: r.next.clone(),
            graph_version: r.graph_version.clone(),
            created_at_ms: r.created_at_ms,
        }
    }
}

/// A checkpoint store failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Another writer appended first (the optimistic version check failed).
    #[error("thread '{thread}' moved on: checkpoint {seq} was written by another run")]
    Conflict {
        /// Thread.
        thread: String,
        /// The sequence number that was taken.
        seq: u64,
    },
    /// A fork's target thread already exists.
    #[error("thread '{0}' already exists")]
    ThreadExists(String),
    /// A record written by a newer toolgraph.
    #[error("checkpoint {seq} of thread '{thread}' has format {format}; this build reads up to {FORMAT_VERSION}")]
    UnsupportedFormat {
        /// Thread.
        thread: String,
        /// Record.
        seq: u64,
        /// Its format.
        format: u32,
    },
    /// A record that cannot be decoded.
    #[error("checkpoint {seq} of thread '{thread}' is corrupt: {reason}")]
    Corrupt {
        /// Thread.
        thread: String,
        /// Record.
        seq: u64,
        /// What is wrong.
        reason: String,
    },
    /// The database failed or is unreachable.
    #[error("{backend} checkpoint store: {message}")]
    Backend {
        /// `sqlite` or `postgres`.
        backend: &'static str,
        /// The database's message.
        message: String,
    },
}

/// Storage for checkpoints.
///
/// Contract: [`Checkpointer::append`] succeeds only if `record.seq` is exactly one past the
/// thread's current head, atomically; a crash leaves either the old head or the new record.
#[async_trait]
pub trait Checkpointer: Send + Sync + 'static {
    /// Appends one record; returns what the store derived from it and wrote in the same
    /// transaction (nothing, for a plain store).
    ///
    /// # Errors
    /// [`CheckpointError::Conflict`] when the head is not `record.seq - 1`.
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<DerivedRows, CheckpointError>;

    /// Records with `seq <= upto` (all when `None`), ascending.
    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError>;

    /// The sequence number and run id of the thread's last record, if any: enough to tell
    /// whether a cached head is still current without reading a record.
    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        Ok(self.load(thread, None).await?.last().map(|r| (r.seq, r.run_id.clone())))
    }

    /// The number of the thread's first record, with [`Checkpointer::head`]'s: a reader that
    /// keeps something folded from the whole thread tells by it that the thread was compacted
    /// (its first records folded into a later one) — one small read.
    async fn span(&self, thread: &ThreadId) -> Result<Option<(u64, u64, String)>, CheckpointError> {
        let records = self.load(thread, None).await?;
        Ok(records.first().zip(records.last()).map(|(first, last)| (first.seq, last.seq, last.run_id.clone())))
    }

    /// Records with `seq >= from`, ascending: the tail a cached head needs to catch up.
    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        Ok(self.load(thread, None).await?.into_iter().filter(|r| r.seq >= from).collect())
    }

    /// History of a thread, oldest first.
    async fn list(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, CheckpointError> {
        Ok(self.load(thread, None).await?.iter().map(CheckpointMeta::from).collect())
    }

    /// Once `thread` holds more than twice `keep` records, folds those before its last `keep`
    /// into the first of those — its updates preceded by theirs, so every kept record reads
    /// the same state — and deletes them, when the thread's last run has finished (its head
    /// names no next node): a thread that runs or waits for a decision is left alone. The
    /// first kept record may be an earlier one, so that it is not a decision (whose pending
    /// interrupts the record before holds). Returns how many records were deleted
    /// (docs/service.md, "Retention"); `keep = 0` deletes none. By default a store compacts
    /// nothing.
    ///
    /// # Errors
    /// [`CheckpointError::UnsupportedFormat`] for a record of a newer build; the database's.
    async fn compact_thread(&self, thread: &ThreadId, keep: u64) -> Result<u64, CheckpointError> {
        let _ = (thread, keep);
        Ok(0)
    }

    /// Deletes the records of `thread` after `after` (every one with `after = 0`): what a run
    /// rolled back had written, the thread's tail. Returns how many went.
    async fn truncate_thread(&self, thread: &ThreadId, after: u64) -> Result<u64, CheckpointError>;

    /// Copies `from`'s records up to `at` into the new thread `to`; returns how many.
    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError>;

    /// Deletes a thread; returns the number of records removed.
    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError>;

    /// Deletes every thread of a namespace (a tenant); returns the number of records removed.
    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError>;

    /// Bytes used by stored records (the database file for SQLite); for benchmarks.
    async fn stored_bytes(&self) -> Result<u64, CheckpointError>;

    /// Keeps `definition` — what the graph of `version` (its [`CheckpointRecord::graph_version`])
    /// was built from, opaque here — so a thread paused on that version can be resumed on it by
    /// a process that never loaded it: after a restart, or on another replica. The first
    /// definition kept for a version stays (a version names its definition).
    async fn keep_definition(&self, version: &str, definition: &str) -> Result<(), CheckpointError>;

    /// The definition kept for `version`, if any.
    async fn definition(&self, version: &str) -> Result<Option<String>, CheckpointError>;
}

/// Where [`Checkpointer::compact_thread`] folds a thread of `records` (`(seq, kind)`,
/// ascending) to keep its last `keep`: the seq of the first kept record, once the thread has
/// more than twice `keep` (a fold rewrites the first kept record with everything before it:
/// not on every new turn). The first kept record is not a decision.
pub(crate) fn fold_point(records: &[(u64, RecordKind)], keep: u64) -> Option<u64> {
    let keep = usize::try_from(keep).ok().filter(|k| *k > 0)?;
    if records.len() <= keep.saturating_mul(2) {
        return None;
    }
    let mut at = records.len() - keep;
    while at > 0 && records[at].1 == RecordKind::Decision {
        at -= 1;
    }
    (at > 0).then(|| records[at].0)
}

/// `older` (ascending, all before `kept`) folded into `kept`: its updates preceded by theirs.
pub(crate) fn folded(older: Vec<CheckpointRecord>, mut kept: CheckpointRecord) -> CheckpointRecord {
    let mut updates: Vec<Box<RawValue>> = older.into_iter().flat_map(|r| r.updates).collect();
    updates.append(&mut kept.updates);
    kept.updates = updates;
    kept
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Decodes a stored body, checking its format.
pub(crate) fn decode(
    thread: &ThreadId,
    seq: u64,
    format: u32,
    body: &str,
) -> Result<CheckpointRecord, CheckpointError> {
    if format > FORMAT_VERSION {
        return Err(CheckpointError::UnsupportedFormat { thread: thread.to_string(), seq, format });
    }
    let mut r: CheckpointRecord = serde_json::from_str(body).map_err(|e| CheckpointError::Corrupt {
        thread: thread.to_string(),
        seq,
        reason: e.to_string(),
    })?;
    r.seq = seq;
    r.format = format;
    Ok(r)
}

/// Escapes `%`, `_` and `\` for a `LIKE 'prefix%'` pattern.
pub(crate) fn like_prefix(namespace: &str) -> String {
    let mut out = String::new();
    for c in namespace.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push_str(":%");
    out
}
