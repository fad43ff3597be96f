//! [`SqliteCheckpointer`]: the embedded default, one SQLite file in the data directory.

use super::{
    CheckpointError, CheckpointRecord, Checkpointer, DerivedRows, RecordKind, ThreadId, decode, fold_point, folded,
    like_prefix,
};
use crate::sqlite::{SqliteDatabase, SqliteError};
use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use std::path::Path;

const BACKEND: &str = "sqlite";

fn backend_error(e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Backend { backend: BACKEND, message: e.to_string() }
}

impl From<SqliteError> for CheckpointError {
    fn from(e: SqliteError) -> Self {
        backend_error(e)
    }
}

impl From<rusqlite::Error> for CheckpointError {
    fn from(e: rusqlite::Error) -> Self {
        backend_error(e)
    }
}

/// A record serialized for its row. Encoding happens on the caller's task, so the database
/// thread, which every writer shares, only inserts.
#[derive(Debug)]
pub struct EncodedRecord {
    thread: ThreadId,
    seq: u64,
    format: u32,
    run_id: String,
    kind: &'static str,
    created_at_ms: i64,
    body: String,
}

impl EncodedRecord {
    /// Serializes `record` for `thread`.
    ///
    /// # Errors
    /// [`CheckpointError::Corrupt`] when the record cannot be serialized.
    pub fn new(thread: &ThreadId, record: &CheckpointRecord) -> Result<Self, CheckpointError> {
        let body = serde_json::to_string(record).map_err(|e| CheckpointError::Corrupt {
            thread: thread.to_string(),
            seq: record.seq,
            reason: e.to_string(),
        })?;
        Ok(Self {
            thread: thread.clone(),
            seq: record.seq,
            format: record.format,
            run_id: record.run_id.clone(),
            kind: record.kind.as_str(),
            created_at_ms: record.created_at_ms,
            body,
        })
    }

    /// The run that wrote it.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// Checkpoints in a SQLite database (WAL mode), schema created by migrations.
#[derive(Debug, Clone)]
pub struct SqliteCheckpointer {
    db: SqliteDatabase,
}

impl SqliteCheckpointer {
    /// Opens (creating if needed) the database file at `path` and migrates it.
    ///
    /// # Errors
    /// When the file cannot be opened or migrated.
    pub async fn open(path: &Path) -> Result<Self, CheckpointError> {
        Self::from_database(SqliteDatabase::open(path).await?).await
    }

    /// Uses an open database (e.g. the one the conversation store shares) and migrates it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn from_database(db: SqliteDatabase) -> Result<Self, CheckpointError> {
        let migrator = super::SQLITE_MIGRATIONS
            .migrator()
            .await
            .map_err(|e| SqliteError::Open(format!("migration failed: {e}")))?;
        db.migrate(migrator).await?;
        Ok(Self { db })
    }

    /// The database.
    pub fn database(&self) -> &SqliteDatabase {
        &self.db
    }

    /// Appends through `conn`, so the write can join a caller's transaction (a
    /// [`rusqlite::Transaction`] derefs to the connection): the service commits a turn's
    /// messages and its checkpoint together.
    ///
    /// # Errors
    /// [`CheckpointError::Conflict`] when the head is not `record.seq - 1`.
    pub fn append_in(conn: &rusqlite::Connection, record: &EncodedRecord) -> Result<(), CheckpointError> {
        let conflict = || CheckpointError::Conflict { thread: record.thread.to_string(), seq: record.seq };
        let result = conn
            .prepare_cached(
                "INSERT INTO checkpoints (thread_id, seq, format, run_id, kind, created_at_ms, body)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
                 WHERE (SELECT COALESCE(MAX(seq), 0) FROM checkpoints WHERE thread_id = ?1) = ?2 - 1",
            )
            .and_then(|mut s| {
                s.execute(params![
                    record.thread.as_str(),
                    record.seq as i64,
                    record.format as i64,
                    record.run_id,
                    record.kind,
                    record.created_at_ms,
                    record.body,
                ])
            });
        match result {
            Ok(1) => Ok(()),
            Ok(_) => Err(conflict()),
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) => Err(conflict()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records with `from <= seq <= upto`, ascending.
    async fn range(&self, thread: &ThreadId, from: u64, upto: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        let t = thread.clone();
        let rows = self
            .db
            .call(move |c| {
                let mut s = c.prepare_cached(
                    "SELECT seq, format, body FROM checkpoints
                     WHERE thread_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq",
                )?;
                let from = i64::try_from(from).unwrap_or(i64::MAX);
                let upto = i64::try_from(upto).unwrap_or(i64::MAX);
                s.query_map(params![t.as_str(), from, upto], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .await??;
        rows.iter().map(|(seq, format, body)| decode(thread, *seq as u64, *format as u32, body)).collect()
    }
}

#[async_trait]
impl Checkpointer for SqliteCheckpointer {
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<DerivedRows, CheckpointError> {
        let record = EncodedRecord::new(thread, record)?;
        self.db.call(move |c| Self::append_in(c, &record)).await??;
        Ok(DerivedRows::default())
    }

    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.range(thread, 1, upto.unwrap_or(u64::MAX)).await
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        let t = thread.clone();
        let head = self
            .db
            .call(move |c| {
                c.prepare_cached("SELECT seq, run_id FROM checkpoints WHERE thread_id = ?1 ORDER BY seq DESC LIMIT 1")?
                    .query_row([t.as_str()], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?)))
                    .optional()
            })
            .await??;
        Ok(head)
    }

    async fn span(&self, thread: &ThreadId) -> Result<Option<(u64, u64, String)>, CheckpointError> {
        let t = thread.clone();
        let span = self
            .db
            .call(move |c| {
                c.prepare_cached(
                    "SELECT (SELECT MIN(seq) FROM checkpoints WHERE thread_id = ?1), seq, run_id FROM checkpoints
                     WHERE thread_id = ?1 ORDER BY seq DESC LIMIT 1",
                )?
                .query_row([t.as_str()], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64, r.get::<_, String>(2)?))
                })
                .optional()
            })
            .await??;
        Ok(span)
    }

    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.range(thread, from, u64::MAX).await
    }

    async fn compact_thread(&self, thread: &ThreadId, keep: u64) -> Result<u64, CheckpointError> {
        if keep == 0 {
            return Ok(0);
        }
        let t = thread.clone();
        self.db
            .call(move |c| {
                // Immediate: the write lock first, so no other process writes between what
                // this reads and what it writes.
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let kinds: Vec<(u64, RecordKind)> = {
                    let mut q =
                        tx.prepare_cached("SELECT seq, kind FROM checkpoints WHERE thread_id = ?1 ORDER BY seq")?;
                    let rows =
                        q.query_map([t.as_str()], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?)))?;
                    let mut kinds = Vec::new();
                    for row in rows {
                        let (seq, kind) = row?;
                        let kind = RecordKind::parse(&kind).ok_or_else(|| CheckpointError::Corrupt {
                            thread: t.to_string(),
                            seq,
                            reason: format!("unknown record kind `{kind}`"),
                        })?;
                        kinds.push((seq, kind));
                    }
                    kinds
                };
                let (Some(first_kept), Some(&(head, _))) = (fold_point(&kinds, keep), kinds.last()) else {
                    return Ok(0);
                };
                let finished: bool = tx.query_row(
                    "SELECT json_extract(body, '$.next') IS NULL FROM checkpoints WHERE thread_id = ?1 AND seq = ?2",
                    params![t.as_str(), head as i64],
                    |r| r.get(0),
                )?;
                if !finished {
                    return Ok(0);
                }
                let mut records = {
                    let mut q = tx.prepare_cached(
                        "SELECT seq, format, body FROM checkpoints WHERE thread_id = ?1 AND seq <= ?2 ORDER BY seq",
                    )?;
                    let rows = q.query_map(params![t.as_str(), first_kept as i64], |r| {
                        Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u32, r.get::<_, String>(2)?))
                    })?;
                    let mut records = Vec::new();
                    for row in rows {
                        let (seq, format, body) = row?;
                        records.push(decode(&t, seq, format, &body)?);
                    }
                    records
                };
                let Some(kept) = records.pop() else { return Ok(0) };
                let deleted = records.len() as u64;
                let folded = EncodedRecord::new(&t, &folded(records, kept))?;
                tx.execute(
                    "UPDATE checkpoints SET body = ?3, format = ?4 WHERE thread_id = ?1 AND seq = ?2",
                    params![t.as_str(), first_kept as i64, folded.body, folded.format],
                )?;
                tx.execute(
                    "DELETE FROM checkpoints WHERE thread_id = ?1 AND seq < ?2",
                    params![t.as_str(), first_kept as i64],
                )?;
                tx.commit()?;
                Ok(deleted)
            })
            .await?
    }

    async fn truncate_thread(&self, thread: &ThreadId, after: u64) -> Result<u64, CheckpointError> {
        let (t, after) = (thread.clone(), i64::try_from(after).unwrap_or(i64::MAX));
        let n = self
            .db
            .call(move |c| {
                c.execute("DELETE FROM checkpoints WHERE thread_id = ?1 AND seq > ?2", params![t.as_str(), after])
            })
            .await??;
        Ok(n as u64)
    }

    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError> {
        let (from, to) = (from.clone(), to.clone());
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let exists: i64 =
                    tx.query_row("SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?1", [to.as_str()], |r| r.get(0))?;
                if exists > 0 {
                    return Err(CheckpointError::ThreadExists(to.to_string()));
                }
                let n = tx.execute(
                    "INSERT INTO checkpoints (thread_id, seq, format, run_id, kind, created_at_ms, body)
                         SELECT ?1, seq, format, run_id, kind, created_at_ms, body FROM checkpoints
                         WHERE thread_id = ?2 AND seq <= ?3",
                    params![to.as_str(), from.as_str(), i64::try_from(at).unwrap_or(i64::MAX)],
                )?;
                tx.commit()?;
                Ok(n as u64)
            })
            .await?
    }

    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError> {
        let t = thread.clone();
        let n =
            self.db.call(move |c| c.execute("DELETE FROM checkpoints WHERE thread_id = ?1", [t.as_str()])).await??;
        Ok(n as u64)
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError> {
        let pattern = like_prefix(namespace);
        let n = self
            .db
            .call(move |c| c.execute("DELETE FROM checkpoints WHERE thread_id LIKE ?1 ESCAPE '\\'", [pattern]))
            .await??;
        Ok(n as u64)
    }

    async fn stored_bytes(&self) -> Result<u64, CheckpointError> {
        let bytes = self
            .db
            .call(|c| {
                // Fold the write-ahead log into the main file so its size is the whole story.
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                let pragma = |name: &str| c.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0));
                Ok::<_, rusqlite::Error>(
                    ((pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?) as u64,
                )
            })
            .await??;
        Ok(bytes)
    }

    async fn keep_definition(&self, version: &str, definition: &str) -> Result<(), CheckpointError> {
        let (version, definition) = (version.to_owned(), definition.to_owned());
        self.db
            .call(move |c| {
                c.prepare_cached(
                    "INSERT INTO graph_definitions (version, definition, created_at_ms) VALUES (?1, ?2, ?3)
                     ON CONFLICT (version) DO NOTHING",
                )?
                .execute(params![version, definition, super::now_ms()])
            })
            .await??;
        Ok(())
    }

    async fn definition(&self, version: &str) -> Result<Option<String>, CheckpointError> {
        let version = version.to_owned();
        let found = self
            .db
            .call(move |c| {
                c.prepare_cached("SELECT definition FROM graph_definitions WHERE version = ?1")?
                    .query_row([version], |r| r.get::<_, String>(0))
                    .optional()
            })
            .await??;
        Ok(found)
    }
}
