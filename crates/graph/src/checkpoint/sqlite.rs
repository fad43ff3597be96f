//! [`SqliteCheckpointer`]: the embedded default, one SQLite file in the data directory.

use super::{CheckpointError, CheckpointRecord, Checkpointer, ThreadId, decode, like_prefix};
use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Executor, Row, Sqlite};
use std::path::Path;
use std::time::Duration;

const BACKEND: &str = "sqlite";

pub(crate) fn backend_error(e: sqlx::Error) -> CheckpointError {
    CheckpointError::Backend { backend: BACKEND, message: e.to_string() }
}

/// Checkpoints in a SQLite database (WAL mode), schema created by migrations.
#[derive(Debug, Clone)]
pub struct SqliteCheckpointer {
    pool: SqlitePool,
}

impl SqliteCheckpointer {
    /// Opens (creating if needed) the database file at `path` and migrates it.
    ///
    /// # Errors
    /// When the file cannot be opened or migrated.
    pub async fn open(path: &Path) -> Result<Self, CheckpointError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(dir).await.map_err(|e| CheckpointError::Backend {
                backend: BACKEND,
                message: format!("cannot create {}: {e}", dir.display()),
            })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode NORMAL never corrupts; a power cut may lose the last commits only.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(|e| CheckpointError::Backend {
                backend: BACKEND,
                message: format!("cannot open {}: {e}", path.display()),
            })?;
        Self::from_pool(pool).await
    }

    /// Uses an existing pool (e.g. the one the conversation store shares) and migrates it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn from_pool(pool: SqlitePool) -> Result<Self, CheckpointError> {
        let mut migrator = sqlx::migrate!("./migrations/sqlite");
        // Other layers (the conversation store) keep their migrations in the same table.
        migrator.set_ignore_missing(true);
        migrator
            .run(&pool)
            .await
            .map_err(|e| CheckpointError::Backend { backend: BACKEND, message: format!("migration failed: {e}") })?;
        Ok(Self { pool })
    }

    /// The connection pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Appends through `executor`, so the write can join a caller's transaction
    /// (`&mut *tx`): the service commits a turn's messages and its checkpoint together.
    ///
    /// # Errors
    /// [`CheckpointError::Conflict`] when the head is not `record.seq - 1`.
    pub async fn append_with<'e, E: Executor<'e, Database = Sqlite>>(
        executor: E,
        thread: &ThreadId,
        record: &CheckpointRecord,
    ) -> Result<(), CheckpointError> {
        let body = serde_json::to_string(record).map_err(|e| CheckpointError::Corrupt {
            thread: thread.to_string(),
            seq: record.seq,
            reason: e.to_string(),
        })?;
        let conflict = || CheckpointError::Conflict { thread: thread.to_string(), seq: record.seq };
        let result = sqlx::query(
            "INSERT INTO checkpoints (thread_id, seq, format, run_id, kind, created_at_ms, body)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
             WHERE (SELECT COALESCE(MAX(seq), 0) FROM checkpoints WHERE thread_id = ?1) = ?2 - 1",
        )
        .bind(thread.as_str())
        .bind(record.seq as i64)
        .bind(record.format as i64)
        .bind(&record.run_id)
        .bind(record.kind.as_str())
        .bind(record.created_at_ms)
        .bind(body)
        .execute(executor)
        .await;
        match result {
            Ok(r) if r.rows_affected() == 1 => Ok(()),
            Ok(_) => Err(conflict()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(conflict()),
            Err(e) => Err(backend_error(e)),
        }
    }
    /// Records with `from <= seq <= upto`, ascending.
    async fn range(&self, thread: &ThreadId, from: u64, upto: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        let rows = sqlx::query(
            "SELECT seq, format, body FROM checkpoints WHERE thread_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq",
        )
        .bind(thread.as_str())
        .bind(i64::try_from(from).unwrap_or(i64::MAX))
        .bind(i64::try_from(upto).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(backend_error)?;
        rows.iter()
            .map(|r| decode(thread, r.get::<i64, _>(0) as u64, r.get::<i64, _>(1) as u32, r.get::<&str, _>(2)))
            .collect()
    }
}

#[async_trait]
impl Checkpointer for SqliteCheckpointer {
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<(), CheckpointError> {
        Self::append_with(&self.pool, thread, record).await
    }

    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.range(thread, 1, upto.unwrap_or(u64::MAX)).await
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        let row = sqlx::query("SELECT seq, run_id FROM checkpoints WHERE thread_id = ?1 ORDER BY seq DESC LIMIT 1")
            .bind(thread.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend_error)?;
        Ok(row.map(|r| (r.get::<i64, _>(0) as u64, r.get::<String, _>(1))))
    }

    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.range(thread, from, u64::MAX).await
    }

    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError> {
        let mut tx = self.pool.begin().await.map_err(backend_error)?;
        let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM checkpoints WHERE thread_id = ?1")
            .bind(to.as_str())
            .fetch_one(&mut *tx)
            .await
            .map_err(backend_error)?;
        if exists > 0 {
            // Roll back now: a dropped transaction is only rolled back when its connection is
            // next used, and until then it holds its locks.
            tx.rollback().await.map_err(backend_error)?;
            return Err(CheckpointError::ThreadExists(to.to_string()));
        }
        let n = sqlx::query(
            "INSERT INTO checkpoints (thread_id, seq, format, run_id, kind, created_at_ms, body)
             SELECT ?1, seq, format, run_id, kind, created_at_ms, body FROM checkpoints WHERE thread_id = ?2 AND seq <= ?3",
        )
        .bind(to.as_str())
        .bind(from.as_str())
        .bind(at as i64)
        .execute(&mut *tx)
        .await
        .map_err(backend_error)?
        .rows_affected();
        tx.commit().await.map_err(backend_error)?;
        Ok(n)
    }

    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError> {
        Ok(sqlx::query("DELETE FROM checkpoints WHERE thread_id = ?1")
            .bind(thread.as_str())
            .execute(&self.pool)
            .await
            .map_err(backend_error)?
            .rows_affected())
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError> {
        Ok(sqlx::query("DELETE FROM checkpoints WHERE thread_id LIKE ?1 ESCAPE '\\'")
            .bind(like_prefix(namespace))
            .execute(&self.pool)
            .await
            .map_err(backend_error)?
            .rows_affected())
    }

    async fn stored_bytes(&self) -> Result<u64, CheckpointError> {
        // Fold the write-ahead log into the main file so its size is the whole story.
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&self.pool).await.map_err(backend_error)?;
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(&self.pool).await.map_err(backend_error)?;
        let free: i64 =
            sqlx::query_scalar("PRAGMA freelist_count").fetch_one(&self.pool).await.map_err(backend_error)?;
        let size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(&self.pool).await.map_err(backend_error)?;
        Ok(((pages - free) * size) as u64)
    }
}
