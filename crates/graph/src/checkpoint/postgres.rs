//! [`PostgresCheckpointer`]: checkpoints in PostgreSQL, shared by many worker replicas.

use super::{
    CheckpointError, CheckpointRecord, Checkpointer, DerivedRows, RecordKind, ThreadId, decode, fold_point, folded,
    like_prefix,
};
use crate::pg::{PgDatabase, PgPooling};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Postgres, Row};
use std::str::FromStr;
use std::time::Duration;

const BACKEND: &str = "postgres";

fn backend_error(e: sqlx::Error) -> CheckpointError {
    CheckpointError::Backend { backend: BACKEND, message: e.to_string() }
}

/// Checkpoints in PostgreSQL; the primary key enforces one writer per step across replicas.
#[derive(Debug, Clone)]
pub struct PostgresCheckpointer {
    db: PgDatabase,
}

impl PostgresCheckpointer {
    /// The one row `sql` (its `$1` the thread) answers, if any.
    async fn thread_row(&self, sql: &'static str, thread: &ThreadId) -> Result<Option<PgRow>, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        let row = sqlx::query(sql)
            .bind(thread.as_str())
            .persistent(self.db.persistent())
            .fetch_optional(&mut *s)
            .await
            .map_err(backend_error)?;
        s.finish().await.map_err(backend_error)?;
        Ok(row)
    }

    /// Connects to `url` (`postgres://…`) and migrates.
    ///
    /// # Errors
    /// An invalid URL, an unreachable server (within 5 s), or a failed migration.
    pub async fn connect(url: &str) -> Result<Self, CheckpointError> {
        let options = PgConnectOptions::from_str(url).map_err(backend_error)?;
        Self::connect_with(options).await
    }

    /// Connects with explicit options (e.g. a `search_path` for a dedicated schema).
    ///
    /// # Errors
    /// See [`PostgresCheckpointer::connect`].
    pub async fn connect_with(options: PgConnectOptions) -> Result<Self, CheckpointError> {
        Self::connect_pooled(options, PgPooling::Session, None).await
    }

    /// Connects with `options` to a server reached as `pooling` says (behind a pooler in
    /// transaction mode: [`PgPooling::Transaction`]), migrating over `migrations` (a direct
    /// connection) when given.
    ///
    /// # Errors
    /// See [`PostgresCheckpointer::connect`].
    pub async fn connect_pooled(
        options: PgConnectOptions,
        pooling: PgPooling,
        migrations: Option<PgConnectOptions>,
    ) -> Result<Self, CheckpointError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(|e| CheckpointError::Backend { backend: BACKEND, message: format!("cannot connect: {e}") })?;
        Self::open(PgDatabase::new(pool, pooling, migrations)).await
    }

    /// Uses an existing pool of direct connections and migrates it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn from_pool(pool: PgPool) -> Result<Self, CheckpointError> {
        Self::open(PgDatabase::direct(pool)).await
    }

    /// Uses `db` and migrates it.
    ///
    /// # Errors
    /// When the migrations fail.
    pub async fn open(db: PgDatabase) -> Result<Self, CheckpointError> {
        let migration_failed = |e: &dyn std::fmt::Display| CheckpointError::Backend {
            backend: BACKEND,
            message: format!("migration failed: {e}"),
        };
        let mut migrator = super::POSTGRES_MIGRATIONS.migrator().await.map_err(|e| migration_failed(&e))?;
        // Other layers (the conversation store) keep their migrations in the same table.
        migrator.set_ignore_missing(true);
        db.migrate(&migrator).await.map_err(|e| migration_failed(&e))?;
        Ok(Self { db })
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        self.db.pool()
    }

    /// The pool and how it reaches the server.
    pub fn database(&self) -> &PgDatabase {
        &self.db
    }

    /// Appends through `executor`, so the write can join a caller's transaction; `persistent`
    /// as [`PgDatabase::persistent`] says.
    ///
    /// # Errors
    /// [`CheckpointError::Conflict`] when the head is not `record.seq - 1`.
    pub async fn append_with<'e, E: Executor<'e, Database = Postgres>>(
        executor: E,
        persistent: bool,
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
             SELECT $1, $2, $3, $4, $5, $6, $7::jsonb
             WHERE (SELECT COALESCE(MAX(seq), 0) FROM checkpoints WHERE thread_id = $1) = $2 - 1",
        )
        .bind(thread.as_str())
        .bind(record.seq as i64)
        .bind(record.format as i32)
        .bind(&record.run_id)
        .bind(record.kind.as_str())
        .bind(record.created_at_ms)
        .bind(body)
        .persistent(persistent)
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
        let mut s = self.db.session().await.map_err(backend_error)?;
        let rows = sqlx::query(
            "SELECT seq, format, body::text FROM checkpoints WHERE thread_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq",
        )
        .bind(thread.as_str())
        .bind(i64::try_from(from).unwrap_or(i64::MAX))
        .bind(i64::try_from(upto).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await
        .map_err(backend_error)?;
        s.finish().await.map_err(backend_error)?;
        rows.iter()
            .map(|r| decode(thread, r.get::<i64, _>(0) as u64, r.get::<i32, _>(1) as u32, r.get::<&str, _>(2)))
            .collect()
    }
}

#[async_trait]
impl Checkpointer for PostgresCheckpointer {
    async fn append(&self, thread: &ThreadId, record: &CheckpointRecord) -> Result<DerivedRows, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        Self::append_with(&mut *s, self.db.persistent(), thread, record).await?;
        s.finish().await.map_err(backend_error)?;
        Ok(DerivedRows::default())
    }

    async fn load(&self, thread: &ThreadId, upto: Option<u64>) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.range(thread, 1, upto.unwrap_or(u64::MAX)).await
    }

    async fn head(&self, thread: &ThreadId) -> Result<Option<(u64, String)>, CheckpointError> {
        let sql = "SELECT seq, run_id FROM checkpoints WHERE thread_id = $1 ORDER BY seq DESC LIMIT 1";
        let row = self.thread_row(sql, thread).await?;
        Ok(row.map(|r| (r.get::<i64, _>(0) as u64, r.get::<String, _>(1))))
    }

    async fn span(&self, thread: &ThreadId) -> Result<Option<(u64, u64, String)>, CheckpointError> {
        let sql = "SELECT (SELECT MIN(seq) FROM checkpoints WHERE thread_id = $1), seq, run_id FROM checkpoints
                   WHERE thread_id = $1 ORDER BY seq DESC LIMIT 1";
        let row = self.thread_row(sql, thread).await?;
        Ok(row.map(|r| (r.get::<i64, _>(0) as u64, r.get::<i64, _>(1) as u64, r.get::<String, _>(2))))
    }

    async fn load_from(&self, thread: &ThreadId, from: u64) -> Result<Vec<CheckpointRecord>, CheckpointError> {
        self.range(thread, from, u64::MAX).await
    }

    async fn compact_thread(&self, thread: &ThreadId, keep: u64) -> Result<u64, CheckpointError> {
        if keep == 0 {
            return Ok(0);
        }
        let mut tx = self.db.pool().begin().await.map_err(backend_error)?;
        // The thread's rows locked: a second compaction waits for this one (an append adds a
        // row and is not held up).
        let rows = sqlx::query("SELECT seq, kind FROM checkpoints WHERE thread_id = $1 ORDER BY seq FOR UPDATE")
            .bind(thread.as_str())
            .persistent(self.db.persistent())
            .fetch_all(&mut *tx)
            .await
            .map_err(backend_error)?;
        let mut kinds = Vec::with_capacity(rows.len());
        for r in &rows {
            let (seq, kind) = (r.get::<i64, _>(0) as u64, r.get::<&str, _>(1));
            let kind = RecordKind::parse(kind).ok_or_else(|| CheckpointError::Corrupt {
                thread: thread.to_string(),
                seq,
                reason: format!("unknown record kind `{kind}`"),
            })?;
            kinds.push((seq, kind));
        }
        let Some(first_kept) = fold_point(&kinds, keep) else {
            tx.rollback().await.map_err(backend_error)?;
            return Ok(0);
        };
        // Only the head's body is read to tell whether its run finished.
        let head = kinds.last().map_or(0, |(seq, _)| *seq);
        let finished: bool =
            sqlx::query_scalar("SELECT body->>'next' IS NULL FROM checkpoints WHERE thread_id = $1 AND seq = $2")
                .bind(thread.as_str())
                .bind(head as i64)
                .persistent(self.db.persistent())
                .fetch_one(&mut *tx)
                .await
                .map_err(backend_error)?;
        if !finished {
            tx.rollback().await.map_err(backend_error)?;
            return Ok(0);
        }
        let bodies = sqlx::query(
            "SELECT seq, format, body::text FROM checkpoints WHERE thread_id = $1 AND seq <= $2 ORDER BY seq",
        )
        .bind(thread.as_str())
        .bind(first_kept as i64)
        .persistent(self.db.persistent())
        .fetch_all(&mut *tx)
        .await
        .map_err(backend_error)?;
        let mut records = bodies
            .iter()
            .map(|r| decode(thread, r.get::<i64, _>(0) as u64, r.get::<i32, _>(1) as u32, r.get::<&str, _>(2)))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(kept) = records.pop() else {
            tx.rollback().await.map_err(backend_error)?;
            return Ok(0);
        };
        let deleted = records.len() as u64;
        let folded = folded(records, kept);
        let body = serde_json::to_string(&folded).map_err(|e| CheckpointError::Corrupt {
            thread: thread.to_string(),
            seq: first_kept,
            reason: e.to_string(),
        })?;
        sqlx::query("UPDATE checkpoints SET body = $3::jsonb, format = $4 WHERE thread_id = $1 AND seq = $2")
            .bind(thread.as_str())
            .bind(first_kept as i64)
            .bind(body)
            .bind(folded.format as i32)
            .persistent(self.db.persistent())
            .execute(&mut *tx)
            .await
            .map_err(backend_error)?;
        sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1 AND seq < $2")
            .bind(thread.as_str())
            .bind(first_kept as i64)
            .persistent(self.db.persistent())
            .execute(&mut *tx)
            .await
            .map_err(backend_error)?;
        tx.commit().await.map_err(backend_error)?;
        Ok(deleted)
    }

    async fn truncate_thread(&self, thread: &ThreadId, after: u64) -> Result<u64, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        let n = sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1 AND seq > $2")
            .bind(thread.as_str())
            .bind(i64::try_from(after).unwrap_or(i64::MAX))
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await
            .map_err(backend_error)?
            .rows_affected();
        s.finish().await.map_err(backend_error)?;
        Ok(n)
    }

    async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<u64, CheckpointError> {
        let mut tx = self.db.pool().begin().await.map_err(backend_error)?;
        let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM checkpoints WHERE thread_id = $1")
            .bind(to.as_str())
            .persistent(self.db.persistent())
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
             SELECT $1, seq, format, run_id, kind, created_at_ms, body FROM checkpoints WHERE thread_id = $2 AND seq <= $3",
        )
        .bind(to.as_str())
        .bind(from.as_str())
        .bind(at as i64)
        .persistent(self.db.persistent())
        .execute(&mut *tx)
        .await
        .map_err(backend_error)?
        .rows_affected();
        tx.commit().await.map_err(backend_error)?;
        Ok(n)
    }

    async fn delete_thread(&self, thread: &ThreadId) -> Result<u64, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        let n = sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1")
            .bind(thread.as_str())
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await
            .map_err(backend_error)?
            .rows_affected();
        s.finish().await.map_err(backend_error)?;
        Ok(n)
    }

    async fn delete_namespace(&self, namespace: &str) -> Result<u64, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        let n = sqlx::query("DELETE FROM checkpoints WHERE thread_id LIKE $1 ESCAPE '\\'")
            .bind(like_prefix(namespace))
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await
            .map_err(backend_error)?
            .rows_affected();
        s.finish().await.map_err(backend_error)?;
        Ok(n)
    }

    async fn stored_bytes(&self) -> Result<u64, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        let n: Option<i64> = sqlx::query_scalar("SELECT pg_total_relation_size('checkpoints')")
            .persistent(self.db.persistent())
            .fetch_one(&mut *s)
            .await
            .map_err(backend_error)?;
        s.finish().await.map_err(backend_error)?;
        Ok(n.unwrap_or(0) as u64)
    }

    async fn keep_definition(&self, version: &str, definition: &str) -> Result<(), CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        sqlx::query(
            "INSERT INTO graph_definitions (version, definition, created_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (version) DO NOTHING",
        )
        .bind(version)
        .bind(definition)
        .bind(super::now_ms())
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await
        .map_err(backend_error)?;
        s.finish().await.map_err(backend_error)?;
        Ok(())
    }

    async fn definition(&self, version: &str) -> Result<Option<String>, CheckpointError> {
        let mut s = self.db.session().await.map_err(backend_error)?;
        let found: Option<String> = sqlx::query_scalar("SELECT definition FROM graph_definitions WHERE version = $1")
            .bind(version)
            .persistent(self.db.persistent())
            .fetch_optional(&mut *s)
            .await
            .map_err(backend_error)?;
        s.finish().await.map_err(backend_error)?;
        Ok(found)
    }
}
