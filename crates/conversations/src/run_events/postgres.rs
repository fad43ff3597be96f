//! [`PostgresRunEvents`]: run events in the `run_events` table, with `NOTIFY` on append and one
//! listening connection per replica.
//!
//! The listening connection is a direct one (`LISTEN` is a session's, which a pooler in
//! transaction mode does not keep): when it drops, the listener reconnects with backoff and,
//! once listening again, tells readers to resync, so what was appended meanwhile is read from
//! the table.

use super::{NOTICE_BUFFER, RunEventAppend, RunEventNotice, RunEventRecord, RunEventStore, RunScope};
use crate::{StoreError, now_ms};
use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};
use toolgraph_graph::PgDatabase;
use toolgraph_protocol::is_terminal_event;

/// Deletes the runs that ended before `$1`. Their end is spelled out, as in the partial index
/// `run_events_ended` (migration 1003) it uses: the events that end a stream, which
/// `toolgraph_protocol::is_terminal_event` names (a test checks the two agree).
const SWEEP_ENDED: &str = "DELETE FROM run_events WHERE run_id IN (
     SELECT run_id FROM run_events WHERE event IN ('done', 'error') AND created_at_ms < $1)";

/// The channel appends notify, with the run's id as payload. Channels are per database, not
/// per schema: run ids are UUIDs, so another schema's notices only cost a read that finds
/// nothing.
const CHANNEL: &str = "toolgraph_run_events";

/// Longest wait for the listening connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Run events in PostgreSQL. Cheap to clone; the listener stops with the last clone.
#[derive(Debug, Clone)]
pub struct PostgresRunEvents {
    db: PgDatabase,
    notices: broadcast::Sender<RunEventNotice>,
    _listener: Arc<DropGuard>,
}

impl PostgresRunEvents {
    /// The store over `db` (migrated with the conversation store's migrations, which create
    /// its table), listening for other replicas' appends on a direct connection made with
    /// `listen`.
    ///
    /// # Errors
    /// When the migrations fail, or the listening connection cannot be made within 10 s.
    pub async fn open(db: PgDatabase, listen: PgConnectOptions) -> Result<Self, StoreError> {
        let m = crate::postgres_migrator().await?;
        db.migrate(&m).await.map_err(|e| StoreError(format!("migration failed: {e}")))?;
        let first = tokio::time::timeout(CONNECT_TIMEOUT, listen_on(&listen))
            .await
            .map_err(|_| StoreError("cannot listen for run events: no connection within 10 s".into()))?
            .map_err(|e| StoreError(format!("cannot listen for run events: {e}")))?;
        let notices = broadcast::channel(NOTICE_BUFFER).0;
        let stop = CancellationToken::new();
        tokio::spawn(listen_loop(listen, first, notices.clone(), stop.clone()));
        Ok(Self { db, notices, _listener: Arc::new(stop.drop_guard()) })
    }
}

/// A new listening connection: a pool of its own (one connection), so nothing of a broken
/// one is reused.
async fn listen_on(options: &PgConnectOptions) -> Result<PgListener, sqlx::Error> {
    let pool =
        PgPoolOptions::new().max_connections(1).acquire_timeout(CONNECT_TIMEOUT).connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Forwards notifications to readers; on a dropped connection, reconnects (0.2 s, doubling to
/// 5 s) and tells readers to resync once it listens again.
async fn listen_loop(
    options: PgConnectOptions,
    first: PgListener,
    notices: broadcast::Sender<RunEventNotice>,
    stop: CancellationToken,
) {
    let mut listener = first;
    loop {
        let received = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.try_recv() => r,
        };
        match received {
            Ok(Some(n)) => {
                let _ = notices.send(RunEventNotice::Appended(n.payload().to_owned()));
                continue;
            }
            Ok(None) => tracing::warn!("the run-events listening connection dropped; reconnecting"),
            Err(e) => tracing::warn!(error = %e, "the run-events listening connection failed; reconnecting"),
        }
        drop(listener);
        let mut wait = Duration::from_millis(200);
        listener = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match tokio::time::timeout(CONNECT_TIMEOUT, listen_on(&options)).await {
                Ok(Ok(l)) => break l,
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot listen for run events yet"),
                Err(_) => tracing::warn!("cannot listen for run events yet: no connection within 10 s"),
            }
            wait = (wait * 2).min(Duration::from_secs(5));
        };
        tracing::info!("listening for run events again");
        let _ = notices.send(RunEventNotice::Resync);
    }
}

#[async_trait]
impl RunEventStore for PostgresRunEvents {
    async fn append(&self, batch: &[RunEventAppend]) -> Result<(), StoreError> {
        let n: usize = batch.iter().map(|r| r.frames.len()).sum();
        let (mut runs, mut seqs, mut tenants, mut users, mut events, mut data) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut conversations = Vec::with_capacity(n);
        for r in batch {
            for f in &r.frames {
                runs.push(r.run_id.as_str());
                seqs.push(i64::try_from(f.seq).unwrap_or(i64::MAX));
                tenants.push(r.owner.0);
                users.push(r.owner.1);
                conversations.push(r.conversation);
                events.push(f.event.as_str());
                data.push(f.data.as_str());
            }
        }
        let grown: Vec<&str> = batch.iter().filter(|r| !r.frames.is_empty()).map(|r| r.run_id.as_str()).collect();
        let mut s = self.db.session().await?;
        // One statement: the rows, then a notice per run (delivered when it commits).
        sqlx::query(
            "WITH ins AS (
                 INSERT INTO run_events (run_id, seq, tenant_id, user_id, event, data, created_at_ms, conversation_id)
                 SELECT r, s, t, u, e, d, $7, c
                 FROM UNNEST($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $10::bigint[])
                     AS x(r, s, t, u, e, d, c)
                 ON CONFLICT (run_id, seq) DO NOTHING
             )
             SELECT pg_notify($8, g) FROM UNNEST($9::text[]) AS g",
        )
        .bind(&runs)
        .bind(&seqs)
        .bind(&tenants)
        .bind(&users)
        .bind(&events)
        .bind(&data)
        .bind(now_ms())
        .bind(CHANNEL)
        .bind(&grown)
        .bind(&conversations)
        .persistent(self.db.persistent())
        .execute(&mut *s)
        .await?;
        s.finish().await?;
        Ok(())
    }

    async fn read(
        &self,
        run_id: &str,
        owner: (i64, i64),
        after: u64,
        limit: usize,
    ) -> Result<Option<Vec<RunEventRecord>>, StoreError> {
        let mut s = self.db.session().await?;
        let rows = sqlx::query(
            "SELECT seq, event, data FROM run_events
             WHERE run_id = $1 AND tenant_id = $2 AND user_id = $3 AND seq > $4 ORDER BY seq LIMIT $5",
        )
        .bind(run_id)
        .bind(owner.0)
        .bind(owner.1)
        .bind(i64::try_from(after).unwrap_or(i64::MAX))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .persistent(self.db.persistent())
        .fetch_all(&mut *s)
        .await?;
        let known = !rows.is_empty()
            || sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM run_events WHERE run_id = $1 AND tenant_id = $2 AND user_id = $3)",
            )
            .bind(run_id)
            .bind(owner.0)
            .bind(owner.1)
            .persistent(self.db.persistent())
            .fetch_one(&mut *s)
            .await?;
        s.finish().await?;
        if !known {
            return Ok(None);
        }
        Ok(Some(
            rows.iter()
                .map(|r| RunEventRecord {
                    seq: u64::try_from(r.get::<i64, _>(0)).unwrap_or(0),
                    event: r.get(1),
                    data: r.get(2),
                })
                .collect(),
        ))
    }

    async fn conversation_of(&self, run_id: &str, owner: (i64, i64)) -> Result<Option<i64>, StoreError> {
        let mut s = self.db.session().await?;
        let conversation = sqlx::query_scalar::<_, i64>(
            "SELECT conversation_id FROM run_events WHERE run_id = $1 AND tenant_id = $2 AND user_id = $3 LIMIT 1",
        )
        .bind(run_id)
        .bind(owner.0)
        .bind(owner.1)
        .persistent(self.db.persistent())
        .fetch_optional(&mut *s)
        .await?;
        s.finish().await?;
        Ok(conversation)
    }

    async fn last(&self, run_id: &str) -> Result<Option<(u64, bool)>, StoreError> {
        let mut s = self.db.session().await?;
        let row = sqlx::query("SELECT seq, event FROM run_events WHERE run_id = $1 ORDER BY seq DESC LIMIT 1")
            .bind(run_id)
            .persistent(self.db.persistent())
            .fetch_optional(&mut *s)
            .await?;
        s.finish().await?;
        Ok(row.map(|r| (u64::try_from(r.get::<i64, _>(0)).unwrap_or(0), is_terminal_event(r.get::<&str, _>(1)))))
    }

    async fn sweep(&self, ended_before_ms: i64, any_before_ms: i64) -> Result<u64, StoreError> {
        // Two statements, each on its own index (an OR of the two would read the whole table).
        let mut s = self.db.session().await?;
        let ended = sqlx::query(SWEEP_ENDED)
            .bind(ended_before_ms)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?
            .rows_affected();
        let old = sqlx::query("DELETE FROM run_events WHERE created_at_ms < $1")
            .bind(any_before_ms)
            .persistent(self.db.persistent())
            .execute(&mut *s)
            .await?
            .rows_affected();
        s.finish().await?;
        Ok(ended + old)
    }

    async fn delete_runs(&self, scope: RunScope) -> Result<u64, StoreError> {
        let mut s = self.db.session().await?;
        let query = match scope {
            RunScope::Conversation { tenant, conversation } => {
                sqlx::query("DELETE FROM run_events WHERE tenant_id = $1 AND conversation_id = $2")
                    .bind(tenant)
                    .bind(conversation)
            }
            RunScope::User { tenant, user } => {
                sqlx::query("DELETE FROM run_events WHERE tenant_id = $1 AND user_id = $2").bind(tenant).bind(user)
            }
            RunScope::Tenant(tenant) => sqlx::query("DELETE FROM run_events WHERE tenant_id = $1").bind(tenant),
        };
        let gone = query.persistent(self.db.persistent()).execute(&mut *s).await?.rows_affected();
        s.finish().await?;
        Ok(gone)
    }

    fn subscribe(&self) -> broadcast::Receiver<RunEventNotice> {
        self.notices.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_and_its_index_name_every_event_that_ends_a_stream() {
        let ending: Vec<String> =
            toolgraph_protocol::EVENTS.into_iter().filter(|e| is_terminal_event(e)).map(|e| format!("'{e}'")).collect();
        let condition = format!("event IN ({})", ending.join(", "));
        let index = include_str!("../../migrations/postgres/1003_run_events.sql");
        assert!(SWEEP_ENDED.contains(&condition), "{SWEEP_ENDED}");
        assert!(
            index.contains(&format!("run_events_ended ON run_events (created_at_ms) WHERE {condition}")),
            "{index}"
        );
    }
}
