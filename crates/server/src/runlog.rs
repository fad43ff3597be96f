//! Per-run frame logs: what a detached run emitted, for the live response and for clients
//! that reconnect with `Last-Event-ID`.
//!
//! A run never waits for a consumer: frames go into the run's bounded log and every reader
//! (the original response or a reconnect) follows it at its own pace. A reader that falls
//! more than [`FRAMES_KEPT`] frames behind loses the oldest ones; finished runs stay
//! replayable for [`RETAIN_FINISHED`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Frames kept per run.
pub const FRAMES_KEPT: usize = 4096;
/// How long a finished run stays replayable.
pub const RETAIN_FINISHED: Duration = Duration::from_secs(300);

/// One SSE frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Position in the run, from 1; the SSE id is `<runId>:<seq>`.
    pub seq: u64,
    /// `token`, `pending`, `done` or `error`.
    pub event: &'static str,
    /// JSON data.
    pub data: String,
}

#[derive(Debug, Default)]
struct LogInner {
    frames: VecDeque<Frame>,
    next_seq: u64,
    finished: Option<Instant>,
}

/// The frames of one run, and who may read them.
#[derive(Debug)]
pub struct RunLog {
    /// Owner: tenant and user.
    pub owner: (i64, i64),
    inner: Mutex<LogInner>,
    notify: Notify,
}

impl RunLog {
    fn lock(&self) -> MutexGuard<'_, LogInner> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a frame and wakes readers.
    pub fn push(&self, event: &'static str, data: String) {
        {
            let mut g = self.lock();
            g.next_seq += 1;
            let seq = g.next_seq;
            g.frames.push_back(Frame { seq, event, data });
            while g.frames.len() > FRAMES_KEPT {
                g.frames.pop_front();
            }
        }
        self.notify.notify_waiters();
    }

    /// Marks the run finished: readers end after the last frame.
    pub fn finish(&self) {
        self.lock().finished = Some(Instant::now());
        self.notify.notify_waiters();
    }

    /// Frames after `after`, and whether the run has finished.
    pub fn since(&self, after: u64) -> (Vec<Frame>, bool) {
        let g = self.lock();
        (g.frames.iter().filter(|f| f.seq > after).cloned().collect(), g.finished.is_some())
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
}

/// Every live or recently finished run of this process.
#[derive(Debug, Default)]
pub struct RunLogs {
    runs: Mutex<Runs>,
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
    /// A new log for `run_id`; drops logs of runs finished longer ago than [`RETAIN_FINISHED`].
    pub fn create(&self, run_id: &str, owner: (i64, i64)) -> Arc<RunLog> {
        let log = Arc::new(RunLog { owner, inner: Mutex::new(LogInner::default()), notify: Notify::new() });
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_follow_and_replay() {
        let logs = RunLogs::default();
        let log = logs.create("r1", (7, 1));
        log.push("token", "{\"content\":\"a\"}".into());
        log.push("token", "{\"content\":\"b\"}".into());
        let (frames, done) = log.since(1);
        assert_eq!(frames.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![2]);
        assert!(!done);
        let waiter = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.changed(2).await })
        };
        log.push("done", "{}".into());
        log.finish();
        waiter.await.unwrap();
        assert!(log.since(3).1);
        assert!(logs.get("r1", (7, 2)).is_none(), "another user cannot read it");
        assert!(logs.get("r1", (7, 1)).is_some());
    }

    #[test]
    fn the_log_is_bounded() {
        let logs = RunLogs::default();
        let log = logs.create("r", (1, 1));
        for _ in 0..FRAMES_KEPT + 10 {
            log.push("token", "{}".into());
        }
        let (frames, _) = log.since(0);
        assert_eq!(frames.len(), FRAMES_KEPT);
        assert_eq!(frames[0].seq, 11);
    }
}
