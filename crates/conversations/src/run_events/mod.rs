//! Run events shared by replicas: the frames a run streamed (`token`, `pending`, `done`,
//! `error`, …), kept where every replica can read them, so a client that reconnects with
//! `Last-Event-ID` to any replica gets what it missed and then follows the run live.
//!
//! Owns: the [`RunEventStore`] trait, its PostgreSQL store ([`PostgresRunEvents`]: a table and
//! `LISTEN/NOTIFY`, the default for replicas because they already share PostgreSQL) and an
//! in-memory one ([`MemoryRunEvents`], for services sharing one process in tests).
//!
//! The table is the truth and notifications only wake readers: a reader that missed some
//! (its listening connection dropped) reads the table again when told to
//! ([`RunEventNotice::Resync`]), so a dropped connection loses no event.

mod memory;
mod postgres;

pub use memory::MemoryRunEvents;
pub use postgres::PostgresRunEvents;

use crate::StoreError;
use async_trait::async_trait;
use tokio::sync::broadcast;

/// One frame of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEventRecord {
    /// Its position in the run, from 1 (the SSE id is `<runId>:<seq>`); increasing, and
    /// contiguous except after a takeover (docs/service.md, "Replicas").
    pub seq: u64,
    /// The SSE event name ([`toolgraph_protocol::Frame::event`]).
    pub event: String,
    /// Its JSON data.
    pub data: String,
}

/// New frames of one run, appended by the replica that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEventAppend {
    /// The run.
    pub run_id: String,
    /// Its owner: tenant and user (only they may read it).
    pub owner: (i64, i64),
    /// The conversation it is a turn of (its frames go with it).
    pub conversation: i64,
    /// The frames, in order.
    pub frames: Vec<RunEventRecord>,
}

/// Whose runs' frames to delete with their data (docs/service.md: deleting a conversation, a
/// user or a tenant takes what their runs streamed with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunScope {
    /// The runs of one conversation of a tenant.
    Conversation {
        /// The tenant.
        tenant: i64,
        /// The conversation.
        conversation: i64,
    },
    /// The runs of one user of a tenant.
    User {
        /// The tenant.
        tenant: i64,
        /// The user.
        user: i64,
    },
    /// Every run of a tenant.
    Tenant(i64),
}

impl RunScope {
    /// Whether a run of `owner` (tenant, user) in `conversation` is in this scope.
    pub fn holds(&self, owner: (i64, i64), conversation: i64) -> bool {
        match *self {
            Self::Conversation { tenant, conversation: c } => owner.0 == tenant && conversation == c,
            Self::User { tenant, user } => owner == (tenant, user),
            Self::Tenant(tenant) => owner.0 == tenant,
        }
    }
}

/// What a store tells its readers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEventNotice {
    /// A run got new frames.
    Appended(String),
    /// Notices may have been missed (the listening connection dropped and is back): every
    /// reader reads its run again.
    Resync,
}

/// Where replicas keep their runs' frames.
#[async_trait]
pub trait RunEventStore: Send + Sync + 'static {
    /// Appends frames of several runs (a frame already stored is kept as it is, so a retried
    /// append is harmless) and tells every replica's readers which runs grew.
    async fn append(&self, batch: &[RunEventAppend]) -> Result<(), StoreError>;

    /// The frames of `run_id` after `after`, oldest first, at most `limit`; `None` when the
    /// store has no frame of that run for `owner` (unknown, another's, or swept).
    async fn read(
        &self,
        run_id: &str,
        owner: (i64, i64),
        after: u64,
        limit: usize,
    ) -> Result<Option<Vec<RunEventRecord>>, StoreError>;

    /// The conversation `owner`'s run `run_id` is a turn of; `None` when the store has no frame
    /// of that run for `owner`.
    async fn conversation_of(&self, run_id: &str, owner: (i64, i64)) -> Result<Option<i64>, StoreError>;

    /// The last frame's position of `run_id` and whether it ended the run; `None` for a run
    /// without frames.
    async fn last(&self, run_id: &str) -> Result<Option<(u64, bool)>, StoreError>;

    /// Deletes the frames of runs that ended before `ended_before_ms` and every frame older
    /// than `any_before_ms` (a run nobody ended); returns how many frames went.
    async fn sweep(&self, ended_before_ms: i64, any_before_ms: i64) -> Result<u64, StoreError>;

    /// Deletes the frames of every run in `scope` at once (their data was deleted); returns
    /// how many frames went.
    async fn delete_runs(&self, scope: RunScope) -> Result<u64, StoreError>;

    /// Notices of appended runs from every replica, this one's included.
    fn subscribe(&self) -> broadcast::Receiver<RunEventNotice>;
}

/// Notices a store keeps for slow readers before they lag (a lagging reader resyncs).
pub(crate) const NOTICE_BUFFER: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract every store keeps, run against each of them.
    pub(crate) async fn store_contract(store: &dyn RunEventStore) {
        let mut notices = store.subscribe();
        let frame =
            |seq: u64, event: &str| RunEventRecord { seq, event: event.into(), data: format!("{{\"n\":{seq}}}") };
        let a = RunEventAppend {
            run_id: "run-a".into(),
            owner: (1, 10),
            conversation: 100,
            frames: vec![frame(1, "token"), frame(2, "token")],
        };
        let b = RunEventAppend {
            run_id: "run-b".into(),
            owner: (2, 20),
            conversation: 200,
            frames: vec![frame(1, "token")],
        };
        store.append(&[a.clone(), b]).await.unwrap();
        let mut told = Vec::new();
        while told.len() < 2 {
            let notice = tokio::time::timeout(std::time::Duration::from_secs(5), notices.recv()).await;
            match notice.expect("a notice per appended run").unwrap() {
                RunEventNotice::Appended(run) => told.push(run),
                RunEventNotice::Resync => {}
            }
        }
        told.sort();
        assert_eq!(told, ["run-a", "run-b"]);

        // A retried append (the same frames again, plus a new one) keeps the first copy.
        let mut retried = a.clone();
        retried.frames[1].data = "{\"changed\":true}".into();
        retried.frames.push(frame(3, "done"));
        store.append(&[retried]).await.unwrap();
        let all = store.read("run-a", (1, 10), 0, 100).await.unwrap().unwrap();
        assert_eq!(all.iter().map(|f| f.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(all[1].data, "{\"n\":2}");
        assert_eq!(store.read("run-a", (1, 10), 1, 1).await.unwrap().unwrap(), vec![frame(2, "token")]);
        assert_eq!(store.read("run-a", (1, 10), 3, 100).await.unwrap(), Some(Vec::new()), "known run, nothing new");
        assert_eq!(store.read("run-a", (1, 11), 0, 100).await.unwrap(), None, "another user's run is unknown");
        assert_eq!(store.read("run-a", (2, 10), 0, 100).await.unwrap(), None, "another tenant's run is unknown");
        assert_eq!(store.read("nope", (1, 10), 0, 100).await.unwrap(), None);
        assert_eq!(store.conversation_of("run-a", (1, 10)).await.unwrap(), Some(100));
        assert_eq!(store.conversation_of("run-a", (1, 11)).await.unwrap(), None, "another user's run is unknown");
        assert_eq!(store.conversation_of("nope", (1, 10)).await.unwrap(), None);
        assert_eq!(store.last("run-a").await.unwrap(), Some((3, true)));
        assert_eq!(store.last("run-b").await.unwrap(), Some((1, false)));
        assert_eq!(store.last("nope").await.unwrap(), None);

        // The sweep: an ended run goes once it ended long enough ago; a live one only at the
        // hard age limit.
        assert_eq!(store.sweep(0, 0).await.unwrap(), 0);
        let later = crate::now_ms() + 60_000;
        assert_eq!(store.sweep(later, 0).await.unwrap(), 3, "run-a ended: its three frames go");
        assert_eq!(store.read("run-a", (1, 10), 0, 100).await.unwrap(), None);
        assert_eq!(store.last("run-b").await.unwrap(), Some((1, false)), "run-b has not ended");
        assert_eq!(store.sweep(later, later).await.unwrap(), 1, "past the hard limit every frame goes");
        assert_eq!(store.last("run-b").await.unwrap(), None);

        // Deleting a conversation, a user or a tenant takes their runs' frames at once, and
        // no one else's.
        let run = |id: &str, owner, conversation| RunEventAppend {
            run_id: id.into(),
            owner,
            conversation,
            frames: vec![frame(1, "token"), frame(2, "done")],
        };
        let runs = [run("c1", (1, 10), 100), run("c2", (1, 10), 101), run("u2", (1, 11), 102), run("t2", (2, 10), 100)];
        store.append(&runs).await.unwrap();
        let alive = || async {
            let mut alive = Vec::new();
            for id in ["c1", "c2", "u2", "t2"] {
                if store.last(id).await.unwrap().is_some() {
                    alive.push(id);
                }
            }
            alive
        };
        let conversation = RunScope::Conversation { tenant: 1, conversation: 100 };
        assert_eq!(store.delete_runs(conversation).await.unwrap(), 2);
        assert_eq!(alive().await, ["c2", "u2", "t2"], "tenant 2's conversation 100 is another");
        assert_eq!(store.delete_runs(RunScope::User { tenant: 1, user: 10 }).await.unwrap(), 2);
        assert_eq!(alive().await, ["u2", "t2"]);
        assert_eq!(store.delete_runs(RunScope::Tenant(1)).await.unwrap(), 2);
        assert_eq!(alive().await, ["t2"]);
    }

    #[tokio::test]
    async fn the_memory_store_keeps_the_contract() {
        store_contract(&MemoryRunEvents::default()).await;
    }

    #[tokio::test]
    async fn the_postgres_store_keeps_the_contract() {
        let Some(schema) = toolgraph_testkit::PgSchema::create().await else { return };
        let pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(2).connect_with(schema.options()).await.unwrap();
        crate::PostgresConversationStore::new(pool.clone()).await.unwrap();
        let store = PostgresRunEvents::open(toolgraph_graph::PgDatabase::direct(pool), schema.options()).await.unwrap();
        store_contract(&store).await;
    }

    /// The listening connection dropped, refused for a while, then back: readers are told to
    /// resync once it listens again, and later appends are noticed again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_listening_connection_comes_back_and_says_so() {
        use toolgraph_testkit::fault_proxy::{Fault, FaultProxy};
        let Some(schema) = toolgraph_testkit::PgSchema::create().await else { return };
        let pool =
            sqlx::postgres::PgPoolOptions::new().max_connections(2).connect_with(schema.options()).await.unwrap();
        let server = schema.options();
        let proxy = FaultProxy::start(format!("{}:{}", "127.0.0.1", server.get_port()).parse().unwrap()).await.unwrap();
        let listen = server.clone().host("127.0.0.1").port(proxy.addr().port());
        let store = PostgresRunEvents::open(toolgraph_graph::PgDatabase::direct(pool), listen).await.unwrap();
        let mut notices = store.subscribe();
        proxy.set(Fault::Refuse);
        proxy.cut_all();
        tokio::time::sleep(std::time::Duration::from_millis(800)).await;
        proxy.set(Fault::None);
        let resync = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                if notices.recv().await.unwrap() == RunEventNotice::Resync {
                    return;
                }
            }
        });
        resync.await.expect("a resync once listening again");
        let frame = RunEventRecord { seq: 1, event: "token".into(), data: "{}".into() };
        store
            .append(&[RunEventAppend { run_id: "after".into(), owner: (1, 1), conversation: 1, frames: vec![frame] }])
            .await
            .unwrap();
        let notice = tokio::time::timeout(std::time::Duration::from_secs(5), notices.recv()).await.expect("noticed");
        assert_eq!(notice.unwrap(), RunEventNotice::Appended("after".into()));
    }
}
