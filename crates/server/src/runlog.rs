//! Per-run frame logs: what a detached run emitted, for the live response and for clients
//! that reconnect with `Last-Event-ID`.
//!
//! A run never waits for a consumer: frames go into the run's bounded log and every reader
//! (the original response or a reconnect) follows it at its own pace. A reader that falls
//! more than [`FRAMES_KEPT`] frames behind loses the oldest ones; finished runs stay
//! replayable for [`RETAIN_FINISHED`].
//!
//! With replicas, every frame is also published to the shared run-event store (see
//! [`crate::shared_runs`]): a pushed frame marks its log [`Unpublished`], and the relay copies
//! what the log holds past its last published frame.
//!
//! A log is held for every open stream, so it is stored compactly: each frame's JSON is
//! encoded straight onto the end of one buffer, with a small index entry per frame. (A
//! `String` per frame cost ~8 KB per 40-token answer, most of it the spare capacity of each
//! frame's encoder buffer.)

use serde::Serialize;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Frames kept per run.
pub const FRAMES_KEPT: usize = 4096;
/// How long a finished run stays replayable.
pub const RETAIN_FINISHED: Duration = Duration::from_secs(300);

/// One SSE frame as a log keeps it: a [`toolgraph_protocol::Frame`] written out, with its
/// position.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Position in the run, from 1; the SSE id is `<runId>:<seq>`.
    pub seq: u64,
    /// Its event name ([`toolgraph_protocol::Frame::event`]).
    pub event: Cow<'static, str>,
    /// JSON data.
    pub data: String,
}

/// Where one kept frame's JSON ends in [`LogInner::data`], and its event name.
#[derive(Debug, Clone, Copy)]
struct FrameEntry {
    event: &'static str,
    end: usize,
}

#[derive(Debug, Default)]
struct LogInner {
    /// The kept frames' JSON (UTF-8), back to back; frame `i` of `frames` spans from the end
    /// of frame `i - 1` (or 0) to `frames[i].end`.
    data: Vec<u8>,
    /// Kept frames, oldest first; the last one's sequence number is `next_seq`.
    frames: VecDeque<FrameEntry>,
    next_seq: u64,
    finished: Option<Instant>,
    /// The last frame the relay published (replicas only).
    published: u64,
    /// Whether frames were pushed since the relay last took them.
    dirty: bool,
}

/// Frames dropped at once when the log is over [`FRAMES_KEPT`]: dropping moves the kept
/// data to the front of its string, so it is done in batches, not per frame.
const DROP_BATCH: usize = FRAMES_KEPT / 4;

impl LogInner {
    fn push(&mut self, event: &'static str, data: &impl Serialize) {
        self.next_seq += 1;
        let start = self.data.len();
        if serde_json::to_writer(&mut self.data, data).is_err() {
            // Only a value that JSON cannot hold fails; its frame goes out empty.
            self.data.truncate(start);
        }
        self.frames.push_back(FrameEntry { event, end: self.data.len() });
        if self.frames.len() > FRAMES_KEPT + DROP_BATCH {
            let cut = self.frames[DROP_BATCH - 1].end;
            self.frames.drain(..DROP_BATCH);
            self.data.drain(..cut);
            for f in &mut self.frames {
                f.end -= cut;
            }
        }
    }

    /// Frames after `after`, at most the newest [`FRAMES_KEPT`].
    fn since(&self, after: u64) -> Vec<Frame> {
        let first_kept = self.next_seq + 1 - self.frames.len() as u64;
        let first_readable = first_kept.max((self.next_seq + 1).saturating_sub(FRAMES_KEPT as u64));
        let from = after.saturating_add(1).max(first_readable);
        if from > self.next_seq {
            return Vec::new();
        }
        // `from` is in the kept range, so the index fits (at most FRAMES_KEPT + DROP_BATCH).
        let skip = (from - first_kept) as usize;
        let mut start = if skip == 0 { 0 } else { self.frames[skip - 1].end };
        let mut out = Vec::with_capacity(self.frames.len() - skip);
        for (i, f) in self.frames.iter().enumerate().skip(skip) {
            // serde_json writes UTF-8 and frames are cut only at their ends, so nothing is lost.
            let data = String::from_utf8_lossy(&self.data[start..f.end]).into_owned();
            out.push(Frame { seq: first_kept + i as u64, event: Cow::Borrowed(f.event), data });
            start = f.end;
        }
        out
    }
}

/// The runs whose logs have frames the relay has not published yet.
#[derive(Debug, Default)]
pub struct Unpublished {
    runs: Mutex<Vec<Arc<str>>>,
    wake: Notify,
}

impl Unpublished {
    /// Marks `run` (again): its log has frames to publish.
    pub(crate) fn mark(&self, run: &Arc<str>) {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(run));
        // `notify_one` keeps a permit when nobody waits, so a mark is never missed.
        self.wake.notify_one();
    }

    /// Whether no run is marked.
    pub fn is_empty(&self) -> bool {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// The marked runs, each once; the marks are cleared.
    pub fn take(&self) -> Vec<Arc<str>> {
        std::mem::take(&mut *self.runs.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until a run is marked.
    pub async fn wait(&self) {
        self.wake.notified().await;
    }
}

/// The tokens a run's model calls used, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunUsage {
    /// Tokens of the prompts.
    pub prompt: u64,
    /// Tokens generated.
    pub completion: u64,
    /// Of the prompts' tokens, those a cache of computed prompts held.
    pub cached_prompt: u64,
}

/// The frames of one run, and who may read them.
#[derive(Debug)]
pub struct RunLog {
    /// Owner: tenant and user.
    pub owner: (i64, i64),
    /// The conversation the run is a turn of.
    pub conversation: toolgraph_protocol::ConversationId,
    /// The agent it runs.
    pub agent: Box<str>,
    /// When it started, in ms since the epoch.
    pub created_ms: i64,
    run_id: Arc<str>,
    /// Stops the run (a client's cancel; docs/langgraph.md).
    cancel: CancellationToken,
    /// Whether a client asked it to stop (the turn's error says so; a shutdown or a lost lease
    /// cancels the same token).
    cancelled: std::sync::atomic::AtomicBool,
    inner: Mutex<LogInner>,
    /// The tokens the run's model calls used so far, when the model reported them.
    usage: Mutex<Option<RunUsage>>,
    notify: Notify,
    /// Where a log with new frames is marked for the relay (replicas only).
    unpublished: Option<Arc<Unpublished>>,
    /// What the request that started it said to do with a run already in progress
    /// (LangGraph's `multitask_strategy`), when it said.
    multitask: std::sync::OnceLock<&'static str>,
    /// Whether the request that started it asked for sub-graphs' events namespaced (LangGraph's
    /// `stream_subgraphs`): a client joining it here gets them so too.
    subgraphs: std::sync::atomic::AtomicBool,
}

impl RunLog {
    /// Records the `multitask_strategy` the run was started with (the first one stays).
    pub fn set_multitask(&self, strategy: &'static str) {
        let _ = self.multitask.set(strategy);
    }

    /// The `multitask_strategy` the run was started with (`reject` when none was said).
    pub fn multitask(&self) -> &'static str {
        self.multitask.get().copied().unwrap_or("reject")
    }

    /// Records that the run's events are asked for with sub-graphs namespaced.
    pub fn set_subgraphs(&self) {
        self.subgraphs.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the run's events were asked for with sub-graphs namespaced.
    pub fn subgraphs(&self) -> bool {
        self.subgraphs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one model call's tokens to the run's.
    pub fn add_usage(&self, call: &toolgraph_graph::TokenUsage) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let total = usage.get_or_insert_with(RunUsage::default);
        total.prompt += call.prompt;
        total.completion += call.completion;
        total.cached_prompt += call.cached_prompt;
    }

    /// The tokens the run's model calls used, summed (`None` when no call reported them). A
    /// call counts once it ended, so read it after the run's last frame for the whole run.
    pub fn usage(&self) -> Option<RunUsage> {
        *self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `frame` and wakes readers.
    pub fn push(&self, frame: &toolgraph_protocol::Frame) {
        let mark = {
            let mut g = self.lock();
            // A `Frame` serializes as its data.
            g.push(frame.event(), frame);
            self.unpublished.is_some() && !std::mem::replace(&mut g.dirty, true)
        };
        if let Some(unpublished) = self.unpublished.as_ref().filter(|_| mark) {
            unpublished.mark(&self.run_id);
        }
        self.notify.notify_waiters();
    }

    /// The frames the relay has not published yet (clearing the mark: a frame pushed after
    /// this marks the log again).
    pub(crate) fn take_unpublished(&self) -> Vec<Frame> {
        let mut g = self.lock();
        g.dirty = false;
        g.since(g.published)
    }

    /// Records that the relay published the frames up to `seq`.
    pub(crate) fn set_published(&self, seq: u64) {
        let mut g = self.lock();
        g.published = g.published.max(seq);
    }

    /// Marks the log for the relay again (its last publication failed).
    pub(crate) fn mark_unpublished(&self) {
        let mark = !std::mem::replace(&mut self.lock().dirty, true);
        if let Some(unpublished) = self.unpublished.as_ref().filter(|_| mark) {
            unpublished.mark(&self.run_id);
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Marks the run finished: readers end after the last frame.
    pub fn finish(&self) {
        self.lock().finished = Some(Instant::now());
        self.notify.notify_waiters();
    }

    /// Frames after `after`, and whether the run has finished.
    pub fn since(&self, after: u64) -> (Vec<Frame>, bool) {
        let g = self.lock();
        (g.since(after), g.finished.is_some())
    }

    /// Whether the run has finished, and whether its last frame is an error.
    pub fn outcome(&self) -> (bool, bool) {
        let g = self.lock();
        (g.finished.is_some(), g.frames.back().is_some_and(|f| f.event == "error"))
    }

    /// Asks the run to stop: it ends at its next step (or model token) as cancelled.
    pub fn cancel(&self) {
        self.cancelled.store(true, std::sync::atomic::Ordering::Relaxed);
        self.cancel.cancel();
    }

    /// Whether a client asked the run to stop ([`RunLog::cancel`]).
    pub fn cancelled(&self) -> bool {
        self.cancelled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for the run's end, at most `limit`; whether it ended. (`changed` with no frame
    /// position to pass returns on a new frame or the end; the loop waits for the end.)
    pub async fn ended(&self, limit: Duration) -> bool {
        let wait = async {
            while !self.outcome().0 {
                self.changed(u64::MAX).await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    /// Waits for the next frame or the end, whichever comes first.
    pub async fn changed(&self, after: u64) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Register interest before checking, so a push between the check and the wait is seen.
        notified.as_mut().enable();
        {
            let g = self.lock();
            if g.next_seq > after || g.finished.is_some() {
                return;
            }
        }
        notified.await;
    }

    /// The frames after `after` as they come, until the run ends: what every reader of a run
    /// (the SSE routes, the OpenAI and AG-UI doors) streams.
    pub fn frames_after(self: Arc<Self>, after: u64) -> impl futures::Stream<Item = Frame> + Send + 'static {
        let batches = futures::stream::unfold((self, after), |(log, mut after)| async move {
            loop {
                let (frames, finished) = log.since(after);
                if let Some(last) = frames.last() {
                    after = last.seq;
                    return Some((frames, (log, after)));
                }
                if finished {
                    return None;
                }
                log.changed(after).await;
            }
        });
        futures::StreamExt::flat_map(batches, futures::stream::iter)
    }

    /// [`RunLog::frames_after`] from the first, as typed frames.
    pub fn typed_frames(self: Arc<Self>) -> impl futures::Stream<Item = toolgraph_protocol::Frame> + Send + 'static {
        futures::StreamExt::filter_map(self.frames_after(0), |f| {
            futures::future::ready(toolgraph_protocol::Frame::parse(&f.event, &f.data).ok())
        })
    }
}

/// Every live or recently finished run of this process.
#[derive(Debug, Default)]
pub struct RunLogs {
    runs: Mutex<Runs>,
    /// Set when runs are published for other replicas.
    unpublished: Option<Arc<Unpublished>>,
}

#[derive(Debug, Default)]
struct Runs {
    by_id: HashMap<String, Arc<RunLog>>,
    /// When expired logs were last dropped: the sweep visits every run, so it runs at most
    /// once per [`SWEEP_EVERY`], not on every new run.
    swept: Option<Instant>,
}

/// Least time between two sweeps of expired logs.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl RunLogs {
    /// Logs whose frames are also published: each log with new frames is marked in
    /// `unpublished`.
    pub fn published(unpublished: Arc<Unpublished>) -> Self {
        Self { runs: Mutex::default(), unpublished: Some(unpublished) }
    }

    /// A new log for `run_id` of `owner` in `conversation`; drops logs of runs finished longer
    /// ago than [`RETAIN_FINISHED`].
    pub fn create(
        &self,
        run_id: &str,
        owner: (i64, i64),
        conversation: toolgraph_protocol::ConversationId,
        agent: &str,
        cancel: CancellationToken,
    ) -> Arc<RunLog> {
        let created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let log = Arc::new(RunLog {
            owner,
            conversation,
            agent: agent.into(),
            created_ms,
            run_id: Arc::from(run_id),
            cancel,
            cancelled: std::sync::atomic::AtomicBool::new(false),
            inner: Mutex::new(LogInner::default()),
            usage: Mutex::new(None),
            notify: Notify::new(),
            unpublished: self.unpublished.clone(),
            multitask: std::sync::OnceLock::new(),
            subgraphs: std::sync::atomic::AtomicBool::new(false),
        });
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if runs.swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            runs.by_id.retain(|_, l| l.lock().finished.is_none_or(|t| t.elapsed() < RETAIN_FINISHED));
            runs.swept = Some(Instant::now());
        }
        runs.by_id.insert(run_id.to_owned(), Arc::clone(&log));
        log
    }

    /// The log of `run_id` if `owner` may read it.
    pub fn get(&self, run_id: &str, owner: (i64, i64)) -> Option<Arc<RunLog>> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.by_id.get(run_id).filter(|l| l.owner == owner).cloned()
    }

    /// The logs of `owner`'s runs on `conversation`, newest first.
    pub fn of_conversation(
        &self,
        owner: (i64, i64),
        conversation: toolgraph_protocol::ConversationId,
    ) -> Vec<Arc<RunLog>> {
        let mut logs: Vec<Arc<RunLog>> = {
            let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
            let kept = |l: &&Arc<RunLog>| l.lock().finished.is_none_or(|t| t.elapsed() < RETAIN_FINISHED);
            runs.by_id
                .values()
                .filter(|l| l.owner == owner && l.conversation == conversation)
                .filter(kept)
                .cloned()
                .collect()
        };
        // Run ids are UUIDv7: their order is their start's, within one millisecond too.
        logs.sort_by(|a, b| b.run_id.cmp(&a.run_id));
        logs
    }

    /// Drops the logs of the runs in `scope` (their conversation, user or tenant was deleted):
    /// nobody can read them again, though a stream already open keeps its own.
    pub fn forget(&self, scope: toolgraph_conversations::RunScope) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.by_id.retain(|_, l| !scope.holds(l.owner, l.conversation.0));
    }

    /// Drops the log of `run_id` (the run was rolled back): nobody can read it again, though a
    /// stream already open keeps its own.
    pub fn forget_run(&self, run_id: &str) {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).by_id.remove(run_id);
    }

    /// The log of `run_id`, whoever owns it (for the relay).
    pub(crate) fn any(&self, run_id: &str) -> Option<Arc<RunLog>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).by_id.get(run_id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgraph_protocol::Frame::{Custom, Done, Token};

    #[tokio::test]
    async fn readers_follow_and_replay() {
        let logs = RunLogs::default();
        let log = logs.create("r1", (7, 1), toolgraph_protocol::ConversationId(1), "tutor", CancellationToken::new());
        log.push(&Token { content: "a".into() });
        log.push(&Token { content: "b".into() });
        let (frames, done) = log.since(1);
        assert_eq!(frames, vec![Frame { seq: 2, event: "token".into(), data: "{\"content\":\"b\"}".into() }]);
        assert_eq!(
            log.since(0).0.iter().map(|f| f.data.as_str()).collect::<Vec<_>>(),
            ["{\"content\":\"a\"}", "{\"content\":\"b\"}"]
        );
        assert!(log.since(2).0.is_empty() && log.since(99).0.is_empty());
        assert!(!done);
        let waiter = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.changed(2).await })
        };
        log.push(&Done {
            conversation_id: toolgraph_protocol::ConversationId(1),
            message_id: toolgraph_protocol::MessageId(2),
        });
        log.finish();
        waiter.await.unwrap();
        assert_eq!(log.since(2).0[0].data, r#"{"conversationId":1,"messageId":2}"#);
        assert!(log.since(3).1);
        assert!(logs.get("r1", (7, 2)).is_none(), "another user cannot read it");
        assert!(logs.get("r1", (7, 1)).is_some());
    }

    #[test]
    fn the_log_is_bounded() {
        let logs = RunLogs::default();
        let log = logs.create("r", (1, 1), toolgraph_protocol::ConversationId(1), "tutor", CancellationToken::new());
        // Past several batch drops: readers always see exactly the newest FRAMES_KEPT frames,
        // each with its own data, and the kept data stays bounded.
        let total = 3 * FRAMES_KEPT + 10;
        for i in 1..=total {
            let frame =
                if i % 2 == 0 { Token { content: i.to_string() } } else { Custom { name: "n".into(), data: i.into() } };
            log.push(&frame);
            if i == FRAMES_KEPT + 10 || i == total {
                let (frames, _) = log.since(0);
                assert_eq!(frames.len(), FRAMES_KEPT);
                let first = (i - FRAMES_KEPT + 1) as u64;
                assert_eq!(frames[0].seq, first);
                for f in &frames {
                    let n = f.seq.to_string();
                    if f.seq % 2 == 0 {
                        assert_eq!((f.event.as_ref(), f.data.clone()), ("token", format!(r#"{{"content":"{n}"}}"#)));
                    } else {
                        assert_eq!(
                            (f.event.as_ref(), f.data.clone()),
                            ("custom", format!(r#"{{"name":"n","data":{n}}}"#))
                        );
                    }
                }
                let tail = log.since(i as u64 - 3).0;
                assert_eq!(tail.iter().map(|f| f.seq).collect::<Vec<_>>(), [i as u64 - 2, i as u64 - 1, i as u64]);
            }
        }
        let g = log.lock();
        assert!(g.frames.len() <= FRAMES_KEPT + DROP_BATCH);
        assert_eq!(g.frames.back().map(|f| f.end), Some(g.data.len()));
    }
}
