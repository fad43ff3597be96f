//! Runs shared by replicas (docs/service.md, "Replicas"): this replica's frames published to
//! the [`RunEventStore`], and other replicas' runs read back from it, so `Last-Event-ID` and
//! `GET /api/chatbot/runs/{runId}/events` work on any replica.
//!
//! Publishing never slows a run: frames go into the run's own log as before, and the relay
//! copies every marked log's new frames to the store in one batch per round (a few ms apart),
//! retrying a failed batch (the store keeps the first copy of a frame, so a retry is harmless).
//! A reader of another replica's run reads the store, then waits for a notice (or polls once a
//! second, should notices be lost) and reads again, until the run's `done` or `error`. Notices
//! reach only the readers of their run: one task takes every notice of the store and wakes
//! the run's watchers, so thousands of readers do not each look at every notice.

use crate::runlog::{Frame, RunLogs, Unpublished};
use futures::Stream;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolgraph_conversations::{RunEventAppend, RunEventNotice, RunEventRecord, RunEventStore};
use toolgraph_protocol::is_terminal_event;

/// How long the relay gathers frames before publishing a batch.
const GATHER: Duration = Duration::from_millis(5);
/// Most frames in one published batch (the rest go in the next).
const BATCH_FRAMES: usize = 4096;
/// Longest wait for one publication or read.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// A reader reads the store at least this often, even without notices.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// Frames read per query.
const READ_FRAMES: usize = 1024;
/// How long a run that is not in the store yet is waited for before it counts as unknown: a
/// client may come back to another replica within the few milliseconds between a frame
/// reaching it and the relay publishing that frame.
const NEW_RUN_GRACE: Duration = Duration::from_millis(1000);
/// How often the relay deletes old frames from the store.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Frames of a run that never ended are deleted this long after they were written.
pub const RETAIN_UNENDED: Duration = Duration::from_secs(3600);

/// The gap between the last stored frame of a run and the `error` frame that ends it after a
/// takeover: the dead replica may have sent frames it had not published yet, and a reader
/// resuming after one of those must still see the end. At least the frames a log keeps.
pub const TAKEOVER_SEQ_GAP: u64 = crate::runlog::FRAMES_KEPT as u64 + 1;

/// The readers waiting for each run's next frames: a counter per run that the notice task
/// bumps, with how many readers watch it.
#[derive(Default)]
struct Watchers(Mutex<HashMap<String, (watch::Sender<u64>, usize)>>);

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (watch::Sender<u64>, usize)>> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn watch(self: &Arc<Self>, run: &str) -> Watch {
        let mut g = self.lock();
        let entry = g.entry(run.to_owned()).or_insert_with(|| (watch::channel(0).0, 0));
        entry.1 += 1;
        Watch { rx: entry.0.subscribe(), run: run.to_owned(), watchers: Arc::clone(self) }
    }

    fn poke(&self, run: &str) {
        if let Some((tx, _)) = self.lock().get(run) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn poke_all(&self) {
        for (tx, _) in self.lock().values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// One reader's interest in a run; gone with the reader.
struct Watch {
    rx: watch::Receiver<u64>,
    run: String,
    watchers: Arc<Watchers>,
}

impl Watch {
    /// Waits for the next notice of the run (or a resync) since the last one seen.
    async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The sender lives while this watch does; should it not, the poll still reads.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut g = self.watchers.lock();
        if let Some(entry) = g.get_mut(&self.run) {
            entry.1 -= 1;
            if entry.1 == 0 {
                g.remove(&self.run);
            }
        }
    }
}

/// Takes every notice of the store and wakes the watchers of its run (all of them on a
/// resync, or when notices were dropped for a slow task).
async fn dispatch(
    mut notices: tokio::sync::broadcast::Receiver<RunEventNotice>,
    watchers: Arc<Watchers>,
    stop: CancellationToken,
) {
    loop {
        let notice = tokio::select! {
            _ = stop.cancelled() => return,
            n = notices.recv() => n,
        };
        match notice {
            Ok(RunEventNotice::Appended(run)) => watchers.poke(&run),
            Ok(RunEventNotice::Resync) | Err(RecvError::Lagged(_)) => watchers.poke_all(),
            Err(RecvError::Closed) => return,
        }
    }
}

/// The shared store and what this replica has not published to it yet.
pub struct SharedRuns {
    store: Arc<dyn RunEventStore>,
    unpublished: Arc<Unpublished>,
    watchers: Arc<Watchers>,
    stop: CancellationToken,
}

impl SharedRuns {
    /// Runs shared through `store`. Called inside a Tokio runtime: starts the task that hands
    /// the store's notices to the readers of each run.
    pub fn new(store: Arc<dyn RunEventStore>) -> Self {
        let (watchers, stop) = (Arc::<Watchers>::default(), CancellationToken::new());
        tokio::spawn(dispatch(store.subscribe(), Arc::clone(&watchers), stop.clone()));
        Self { store, unpublished: Arc::default(), watchers, stop }
    }

    /// Where this replica's logs mark new frames.
    pub fn unpublished(&self) -> Arc<Unpublished> {
        Arc::clone(&self.unpublished)
    }

    /// Publishes the marked logs' frames until [`stop`](Self::stop), then once more; sweeps the
    /// store's old frames every minute.
    pub async fn relay(self: Arc<Self>, logs: Arc<RunLogs>) {
        let mut backoff = Duration::from_millis(100);
        let mut swept = tokio::time::Instant::now();
        loop {
            let stopping = tokio::select! {
                _ = self.unpublished.wait() => false,
                _ = self.stop.cancelled() => true,
                _ = tokio::time::sleep(SWEEP_EVERY) => false,
            };
            if !stopping {
                tokio::time::sleep(GATHER).await;
            }
            let published = if stopping { self.publish_all(&logs).await } else { self.publish(&logs).await };
            match published {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(e) if stopping => {
                    tracing::warn!(error = %e, "cannot publish the last run events before stopping");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot publish run events; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.cancelled() => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
            if stopping {
                return;
            }
            if swept.elapsed() >= SWEEP_EVERY {
                swept = tokio::time::Instant::now();
                self.sweep().await;
            }
        }
    }

    /// Publishes batch after batch until no log is marked (stopping: what every run streamed
    /// last, its `error` among it, must reach the other replicas).
    async fn publish_all(&self, logs: &RunLogs) -> Result<(), String> {
        while !self.unpublished.is_empty() {
            self.publish(logs).await?;
        }
        Ok(())
    }

    /// Publishes the marked logs' new frames in one batch of at most [`BATCH_FRAMES`] (a
    /// log's frames go whole). A log left over, or whose batch failed, is marked again.
    async fn publish(&self, logs: &RunLogs) -> Result<(), String> {
        let mut batch = Vec::new();
        let mut published = Vec::new();
        let mut frames_in_batch = 0;
        for run in self.unpublished.take() {
            let Some(log) = logs.any(&run) else { continue };
            if frames_in_batch >= BATCH_FRAMES {
                // Untaken, its log is still marked dirty: only the list needs it back.
                self.unpublished.mark(&run);
                continue;
            }
            let frames = log.take_unpublished();
            let Some(last) = frames.last().map(|f| f.seq) else { continue };
            frames_in_batch += frames.len();
            batch.push(RunEventAppend {
                run_id: run.to_string(),
                owner: log.owner,
                conversation: log.conversation.0,
                frames: frames
                    .into_iter()
                    .map(|f| RunEventRecord { seq: f.seq, event: f.event.into_owned(), data: f.data })
                    .collect(),
            });
            published.push((log, last));
        }
        if batch.is_empty() {
            return Ok(());
        }
        let result = match tokio::time::timeout(STORE_TIMEOUT, self.store.append(&batch)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the store took over 5 s".into()),
        };
        for (log, last) in published {
            match &result {
                Ok(()) => log.set_published(last),
                Err(_) => log.mark_unpublished(),
            }
        }
        result
    }

    async fn sweep(&self) {
        let now = now_ms();
        let ended_before = now - crate::runlog::RETAIN_FINISHED.as_millis() as i64;
        let any_before = now - RETAIN_UNENDED.as_millis() as i64;
        match tokio::time::timeout(STORE_TIMEOUT, self.store.sweep(ended_before, any_before)).await {
            Ok(Ok(n)) if n > 0 => tracing::debug!(frames = n, "swept old run events"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot sweep old run events"),
            Err(_) => tracing::warn!("sweeping old run events took over 5 s"),
        }
    }

    /// Stops the relay after one last publication, and the notices to readers.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Ends another replica's run in the store with `error` `message`, after any frame it may
    /// have streamed unpublished ([`TAKEOVER_SEQ_GAP`]); nothing for a run that already ended.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn end_run(
        &self,
        run_id: &str,
        owner: (i64, i64),
        conversation: i64,
        message: &str,
    ) -> Result<(), String> {
        let last = self.store.last(run_id).await.map_err(|e| e.to_string())?;
        if last.is_some_and(|(_, ended)| ended) {
            return Ok(());
        }
        let seq = last.map_or(0, |(seq, _)| seq) + TAKEOVER_SEQ_GAP;
        let error = toolgraph_protocol::Frame::Error { message: message.to_owned() };
        let frame = RunEventRecord { seq, event: error.event().into(), data: error.data() };
        let append = RunEventAppend { run_id: run_id.to_owned(), owner, conversation, frames: vec![frame] };
        self.store.append(&[append]).await.map_err(|e| e.to_string())
    }

    /// Deletes the frames of the runs in `scope` from the shared store.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn delete_runs(&self, scope: toolgraph_conversations::RunScope) -> Result<(), String> {
        self.store.delete_runs(scope).await.map(|_| ()).map_err(|e| e.to_string())
    }

    /// The conversation another replica's run `run_id` of `owner` is a turn of; `None` when
    /// the store has no such run of theirs.
    ///
    /// # Errors
    /// When the store cannot be read.
    pub async fn conversation_of(&self, run_id: &str, owner: (i64, i64)) -> Result<Option<i64>, String> {
        match tokio::time::timeout(STORE_TIMEOUT, self.store.conversation_of(run_id, owner)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("reading the run's conversation took over 5 s".to_owned()),
        }
    }

    /// The frames of another replica's run after `after`, then the ones that follow, until
    /// the run ends; `None` when the store has no such run of `owner` (after a short grace
    /// for a run whose first frames are on their way, [`NEW_RUN_GRACE`]).
    ///
    /// # Errors
    /// When the store cannot be read.
    pub async fn follow(
        &self,
        run_id: &str,
        owner: (i64, i64),
        after: u64,
    ) -> Result<Option<impl Stream<Item = Frame> + Send + 'static>, String> {
        // Watched before the first read, so nothing appended in between goes unnoticed.
        let mut watch = self.watchers.watch(run_id);
        let read = |after| {
            let (store, run_id) = (Arc::clone(&self.store), run_id.to_owned());
            async move {
                match tokio::time::timeout(STORE_TIMEOUT, store.read(&run_id, owner, after, READ_FRAMES)).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err("reading the run's events took over 5 s".to_owned()),
                }
            }
        };
        let deadline = tokio::time::Instant::now() + NEW_RUN_GRACE;
        let first = loop {
            if let Some(first) = read(after).await? {
                break first;
            }
            // Wait for this run's first notice (or a resync), within the grace.
            if tokio::time::timeout_at(deadline, watch.changed()).await.is_err() {
                return Ok(None);
            }
        };
        let (store, run_id) = (Arc::clone(&self.store), run_id.to_owned());
        Ok(Some(async_stream::stream! {
            let mut after = after;
            let mut frames = first;
            loop {
                let mut ended = false;
                let full = frames.len() >= READ_FRAMES;
                for f in frames.drain(..) {
                    after = f.seq;
                    ended |= is_terminal_event(&f.event);
                    yield Frame { seq: f.seq, event: Cow::Owned(f.event), data: f.data };
                }
                if ended {
                    break;
                }
                if !full {
                    // This run's notice, a resync, or the poll.
                    tokio::select! {
                        _ = watch.changed() => {}
                        _ = tokio::time::sleep(POLL_EVERY) => {}
                    }
                }
                match tokio::time::timeout(STORE_TIMEOUT, store.read(&run_id, owner, after, READ_FRAMES)).await {
                    Ok(Ok(Some(next))) => frames = next,
                    // Swept meanwhile: nothing more will come.
                    Ok(Ok(None)) => break,
                    Ok(Err(e)) => tracing::warn!(run = %run_id, error = %e, "cannot read the run's events; retrying"),
                    Err(_) => tracing::warn!(run = %run_id, "reading the run's events took over 5 s; retrying"),
                }
            }
        }))
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use toolgraph_conversations::MemoryRunEvents;

    impl SharedRuns {
        /// Runs some reader watches.
        fn watched(&self) -> usize {
            self.watchers.lock().len()
        }
    }

    /// Two replicas' views of one store: frames pushed into a log of "A" reach a reader of "B",
    /// in order and each once, live, and the reader ends with the run.
    #[tokio::test]
    async fn another_replica_follows_a_run_live_to_its_end() {
        let store: Arc<dyn RunEventStore> = Arc::new(MemoryRunEvents::default());
        let a = Arc::new(SharedRuns::new(Arc::clone(&store)));
        let b = SharedRuns::new(Arc::clone(&store));
        let logs = Arc::new(RunLogs::published(a.unpublished()));
        let relay = tokio::spawn(Arc::clone(&a).relay(Arc::clone(&logs)));
        let log = logs.create(
            "run-1",
            (7, 1),
            toolgraph_protocol::ConversationId(1),
            "tutor",
            tokio_util::sync::CancellationToken::new(),
        );
        assert!(b.follow("run-1", (7, 1), 0).await.unwrap().is_none(), "nothing published yet");
        let token = |t: &str| toolgraph_protocol::Frame::Token { content: t.into() };
        log.push(&token("a"));
        let follow = async {
            loop {
                if let Some(s) = b.follow("run-1", (7, 1), 0).await.unwrap() {
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let stream = tokio::time::timeout(Duration::from_secs(5), follow).await.expect("published");
        assert!(b.follow("run-1", (7, 2), 0).await.unwrap().is_none(), "another user's run is not found");
        let reader = tokio::spawn(stream.collect::<Vec<Frame>>());
        for word in ["b", "c"] {
            tokio::time::sleep(Duration::from_millis(20)).await;
            log.push(&token(word));
        }
        log.push(&toolgraph_protocol::Frame::Done {
            conversation_id: toolgraph_protocol::ConversationId(1),
            message_id: toolgraph_protocol::MessageId(2),
        });
        log.finish();
        let frames = tokio::time::timeout(Duration::from_secs(5), reader).await.expect("the reader ends").unwrap();
        assert_eq!(frames.iter().map(|f| f.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(frames.iter().map(|f| f.event.as_ref()).collect::<Vec<_>>(), ["token", "token", "token", "done"]);
        assert_eq!(frames[2].data, "{\"content\":\"c\"}");
        // A reader that resumes after frame 2 gets the rest only.
        let rest: Vec<Frame> = b.follow("run-1", (7, 1), 2).await.unwrap().unwrap().collect().await;
        assert_eq!(rest.iter().map(|f| f.seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(b.watched(), 0, "a reader that ended watches nothing");
        a.stop();
        relay.await.unwrap();
    }

    /// A run whose replica died is ended past anything it may have streamed unpublished, once.
    #[tokio::test]
    async fn a_dead_replicas_run_is_ended_once_past_its_unpublished_frames() {
        let store: Arc<dyn RunEventStore> = Arc::new(MemoryRunEvents::default());
        let shared = SharedRuns::new(Arc::clone(&store));
        let frame = |seq| RunEventRecord { seq, event: "token".into(), data: "{}".into() };
        store
            .append(&[RunEventAppend {
                run_id: "r".into(),
                owner: (1, 1),
                conversation: 1,
                frames: vec![frame(1), frame(2)],
            }])
            .await
            .unwrap();
        // A reader that saw frame 40 (streamed, never published) still gets the end.
        let reader = shared.follow("r", (1, 1), 40).await.unwrap().unwrap();
        shared.end_run("r", (1, 1), 1, "interrupted").await.unwrap();
        shared.end_run("r", (1, 1), 1, "again").await.unwrap();
        let frames: Vec<Frame> = reader.collect().await;
        assert_eq!(frames.len(), 1);
        assert_eq!((frames[0].seq, frames[0].event.as_ref()), (2 + TAKEOVER_SEQ_GAP, "error"));
        assert_eq!(frames[0].data, "{\"message\":\"interrupted\"}");
        assert_eq!(store.last("r").await.unwrap(), Some((2 + TAKEOVER_SEQ_GAP, true)), "ended once");
    }

    /// More frames than one batch holds: the logs left over go in the next rounds, and every
    /// run's frames arrive, its later frames too.
    #[tokio::test]
    async fn logs_past_a_full_batch_are_published_in_the_next_rounds() {
        let store = Arc::new(MemoryRunEvents::default());
        let shared = Arc::new(SharedRuns::new(store.clone()));
        let logs = Arc::new(RunLogs::published(shared.unpublished()));
        let relay = tokio::spawn(Arc::clone(&shared).relay(Arc::clone(&logs)));
        let runs = 3 * BATCH_FRAMES / 100;
        let all: Vec<_> = (0..runs)
            .map(|i| {
                logs.create(
                    &format!("r{i}"),
                    (1, 1),
                    toolgraph_protocol::ConversationId(1),
                    "tutor",
                    tokio_util::sync::CancellationToken::new(),
                )
            })
            .collect();
        for log in &all {
            for n in 0..100 {
                log.push(&toolgraph_protocol::Frame::Token { content: n.to_string() });
            }
        }
        for log in &all {
            log.push(&toolgraph_protocol::Frame::Done {
                conversation_id: toolgraph_protocol::ConversationId(1),
                message_id: toolgraph_protocol::MessageId(2),
            });
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        for i in 0..runs {
            while store.last(&format!("r{i}")).await.unwrap() != Some((101, true)) {
                assert!(tokio::time::Instant::now() < deadline, "run r{i} never fully published");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        shared.stop();
        relay.await.unwrap();
    }

    /// A failed publication is retried, and the frames arrive once.
    #[tokio::test]
    async fn a_failed_publication_is_retried() {
        struct Flaky(MemoryRunEvents, std::sync::atomic::AtomicU32);
        #[async_trait::async_trait]
        impl RunEventStore for Flaky {
            async fn append(&self, b: &[RunEventAppend]) -> Result<(), toolgraph_conversations::StoreError> {
                if self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                    return Err(toolgraph_conversations::StoreError("down".into()));
                }
                self.0.append(b).await
            }
            async fn read(
                &self,
                r: &str,
                o: (i64, i64),
                a: u64,
                l: usize,
            ) -> Result<Option<Vec<RunEventRecord>>, toolgraph_conversations::StoreError> {
                self.0.read(r, o, a, l).await
            }
            async fn conversation_of(
                &self,
                r: &str,
                o: (i64, i64),
            ) -> Result<Option<i64>, toolgraph_conversations::StoreError> {
                self.0.conversation_of(r, o).await
            }
            async fn last(&self, r: &str) -> Result<Option<(u64, bool)>, toolgraph_conversations::StoreError> {
                self.0.last(r).await
            }
            async fn sweep(&self, e: i64, a: i64) -> Result<u64, toolgraph_conversations::StoreError> {
                self.0.sweep(e, a).await
            }
            async fn delete_runs(
                &self,
                scope: toolgraph_conversations::RunScope,
            ) -> Result<u64, toolgraph_conversations::StoreError> {
                self.0.delete_runs(scope).await
            }
            fn subscribe(&self) -> tokio::sync::broadcast::Receiver<RunEventNotice> {
                self.0.subscribe()
            }
        }
        let flaky = Arc::new(Flaky(MemoryRunEvents::default(), Default::default()));
        let shared = Arc::new(SharedRuns::new(flaky.clone()));
        let logs = Arc::new(RunLogs::published(shared.unpublished()));
        let relay = tokio::spawn(Arc::clone(&shared).relay(Arc::clone(&logs)));
        let log = logs.create(
            "r",
            (1, 1),
            toolgraph_protocol::ConversationId(1),
            "tutor",
            tokio_util::sync::CancellationToken::new(),
        );
        log.push(&toolgraph_protocol::Frame::Token { content: "1".into() });
        log.push(&toolgraph_protocol::Frame::Done {
            conversation_id: toolgraph_protocol::ConversationId(1),
            message_id: toolgraph_protocol::MessageId(2),
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while flaky.0.last("r").await.unwrap().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "published after the store came back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stored = flaky.0.read("r", (1, 1), 0, 10).await.unwrap().unwrap();
        assert_eq!(stored.iter().map(|f| (f.seq, f.event.as_str())).collect::<Vec<_>>(), [(1, "token"), (2, "done")]);
        assert!(flaky.1.load(std::sync::atomic::Ordering::SeqCst) >= 3);
        shared.stop();
        relay.await.unwrap();
    }
}
