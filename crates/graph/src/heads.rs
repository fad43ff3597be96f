//! Thread heads: [`ThreadState`], a thread's state folded from its checkpoint records, and
//! [`ThreadCache`], what a process keeps folded of recent threads — the heads of recent runs
//! and reads, and the folds of their recorded runs — so a new turn (or a reader) reads only
//! the records it has not seen. Bounded (the least recently put back is evicted first, in constant
//! time: a run takes its thread's head and puts it back after every step); every entry is
//! checked against the store before use, so other replicas' writes and deletions are never
//! missed.

use crate::checkpoint::{CheckpointError, CheckpointRecord, RecordKind, RunsFold, ThreadId, now_ms};
use crate::error::GraphError;
use crate::interrupt::{Decision, InterruptId, PendingInterrupt};
use crate::state::State;
use lru::LruCache;
use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A thread's state as rebuilt from its checkpoints.
#[derive(Debug, Clone)]
pub struct ThreadState<S> {
    /// The state (shared with the graph's head cache; cloning it is cheap).
    pub state: Arc<S>,
    /// Sequence number of the head record (0 for a new thread).
    pub version: u64,
    /// The node that runs next; `None` when idle.
    pub next: Option<String>,
    /// Interrupts of the current pause (decided or not).
    pub pending: Vec<PendingInterrupt>,
    /// Decisions recorded for them.
    pub decisions: BTreeMap<InterruptId, Decision>,
    /// When the head was written (ms since the Unix epoch).
    pub last_at_ms: i64,
    /// The run that wrote the head; with `version` it identifies the head exactly (run ids
    /// are unique), so a cached head can be checked against the store with one row.
    pub(crate) head_run: String,
    /// The run that paused for `pending` (empty when there is no pause): its id is on the
    /// pause's record-only decisions and on the mark of a resume cancelled before its first
    /// step, as the pending actions are found by it — not always the head's run, when a
    /// resume wrote its decisions and nothing after (it died, or its store refused its step).
    pub(crate) pause_run: String,
    /// Whether the head is the mark of a resume that ended before its first step (cancelled,
    /// dead and closed, or refused by the store): no run holds the pause, which the same
    /// decisions resume at once.
    pub(crate) pause_reopened: bool,
    /// Whether the head is a resume's decisions' record: one under an id of its own (neither
    /// the pausing run's, which record-only decisions are under, nor the record before's).
    pub(crate) resumed: bool,
}

impl<S: Default> ThreadState<S> {
    /// The head of a thread without checkpoints.
    pub(crate) fn empty() -> Self {
        Self {
            state: Arc::new(S::default()),
            version: 0,
            next: None,
            pending: Vec::new(),
            decisions: BTreeMap::new(),
            last_at_ms: 0,
            head_run: String::new(),
            pause_run: String::new(),
            pause_reopened: false,
            resumed: false,
        }
    }
}

impl<S: State> ThreadState<S> {
    /// Pending interrupts without a decision.
    pub fn undecided(&self) -> Vec<PendingInterrupt> {
        self.pending.iter().filter(|p| !self.decisions.contains_key(&p.id)).cloned().collect()
    }

    pub(crate) fn fold(thread: &ThreadId, records: Vec<CheckpointRecord>) -> Result<Self, GraphError> {
        let mut t = Self::empty();
        t.extend(thread, records)?;
        Ok(t)
    }

    pub(crate) fn extend(
        &mut self,
        thread: &ThreadId,
        records: impl IntoIterator<Item = CheckpointRecord>,
    ) -> Result<(), GraphError> {
        let t = self;
        for r in records {
            for u in r.updates {
                let update: S::Update = serde_json::from_str(u.get()).map_err(|e| CheckpointError::Corrupt {
                    thread: thread.to_string(),
                    seq: r.seq,
                    reason: format!("update does not fit the state type: {e}"),
                })?;
                Arc::make_mut(&mut t.state).apply(update);
            }
            t.pause_reopened = false;
            t.resumed = false;
            match r.kind {
                RecordKind::Input | RecordKind::Step | RecordKind::Stop => {
                    t.pending.clear();
                    t.decisions.clear();
                    t.pause_run.clear();
                }
                RecordKind::Interrupt => {
                    t.pending = r.interrupts;
                    t.decisions.clear();
                    t.pause_run.clone_from(&r.run_id);
                }
                RecordKind::Decision => {
                    t.decisions.extend(r.decisions);
                    t.pause_reopened = r.reason.is_some();
                    t.resumed = r.reason.is_none() && r.run_id != t.pause_run && r.run_id != t.head_run;
                }
            }
            t.next = r.next;
            t.version = r.seq;
            t.last_at_ms = r.created_at_ms;
            t.head_run = r.run_id;
        }
        Ok(())
    }

    pub(crate) fn is_fresh(&self, stale_after: Duration) -> bool {
        now_ms().saturating_sub(self.last_at_ms) < stale_after.as_millis() as i64
    }
}

/// What a [`ThreadCache`] keeps of a thread: something folded from its records up to one.
pub(crate) trait Folded: Clone {
    /// The number and run id of the last record folded (`None`: none yet).
    fn last(&self) -> Option<(u64, &str)>;
}

impl<S: Clone> Folded for ThreadState<S> {
    fn last(&self) -> Option<(u64, &str)> {
        (self.version > 0).then_some((self.version, self.head_run.as_str()))
    }
}

impl Folded for RunsFold {
    fn last(&self) -> Option<(u64, &str)> {
        RunsFold::last(self)
    }
}

/// What a process keeps folded of recent threads — their heads, their recorded runs —
/// bounded, the least recent evicted first in constant time; every entry is checked against
/// the store before use.
pub(crate) struct ThreadCache<T> {
    inner: Mutex<LruCache<ThreadId, T>>,
}

/// The heads of recent threads: a run takes its thread's and puts it back.
pub(crate) type HeadCache<S> = ThreadCache<ThreadState<S>>;

/// The folds of recently read threads' recorded runs.
pub(crate) type RunsCache = ThreadCache<RunsFold>;

impl<T: Folded> ThreadCache<T> {
    /// A cache of at most `capacity` entries (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { inner: Mutex::new(LruCache::new(capacity)) }
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<ThreadId, T>> {
        // Nothing panics under this lock; recover rather than cascade if something did.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes and returns an entry: the run that takes a head owns it until it puts it back.
    pub(crate) fn take(&self, thread: &ThreadId) -> Option<T> {
        self.lock().pop(thread)
    }

    /// A copy of an entry, leaving its place in the eviction order as it is.
    pub(crate) fn peek(&self, thread: &ThreadId) -> Option<T> {
        self.lock().peek(thread).cloned()
    }

    /// A copy of an entry, now the most recently used.
    pub(crate) fn get(&self, thread: &ThreadId) -> Option<T> {
        self.lock().get(thread).cloned()
    }

    /// Keeps `value` as the most recent, evicting the least recent past the capacity.
    pub(crate) fn put(&self, thread: ThreadId, value: T) {
        self.lock().put(thread, value);
    }

    /// Keeps `value`, a reader's, just checked against the store, unless the cache holds one
    /// folded further (a run may have put its head back meanwhile, another reader kept more) —
    /// except the one the reader started from (`replaced`: its last record's number and run),
    /// which the store no longer had (a thread rolled back or recreated). An older entry is
    /// harmless — every use checks it against the store — but makes the next reader read more.
    pub(crate) fn offer(&self, thread: &ThreadId, value: T, replaced: Option<(u64, &str)>) {
        let mut kept = self.lock();
        let further = |k: &T| k.last().map(|(seq, _)| seq) > value.last().map(|(seq, _)| seq) && k.last() != replaced;
        if !kept.peek(thread).is_some_and(further) {
            kept.put(thread.clone(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_evicts_the_oldest() {
        let cache: HeadCache<u32> = HeadCache::new(2);
        let head = |v| {
            let mut h = ThreadState::<u32>::empty();
            h.version = v;
            h
        };
        for (i, t) in ["a", "b", "c"].iter().enumerate() {
            cache.put(ThreadId::new("t", t), head(i as u64));
        }
        assert!(cache.peek(&ThreadId::new("t", "a")).is_none(), "oldest evicted");
        assert_eq!(cache.take(&ThreadId::new("t", "c")).map(|h| h.version), Some(2));
        assert!(cache.take(&ThreadId::new("t", "c")).is_none(), "taken heads are gone");
        assert_eq!(cache.peek(&ThreadId::new("t", "b")).map(|h| h.version), Some(1));
    }

    #[test]
    fn heads_taken_and_put_back_stay_bounded_and_the_least_recent_goes() {
        let cache: HeadCache<u32> = HeadCache::new(3);
        let head = |v| {
            let mut h = ThreadState::<u32>::empty();
            h.version = v;
            h
        };
        let t = |n: u32| ThreadId::new("t", n);
        for n in 0..3 {
            cache.put(t(n), head(0));
        }
        // Runs on thread 0 take and put back its head many times: it stays, and is the most
        // recent, so a new thread evicts thread 1.
        for v in 1..10_000 {
            let h = cache.take(&t(0)).expect("kept");
            assert_eq!(h.version, v - 1);
            cache.put(t(0), head(v));
        }
        assert_eq!(cache.lock().len(), 3);
        cache.put(t(3), head(0));
        assert!(cache.peek(&t(1)).is_none(), "the least recently put back goes first");
        assert!(cache.peek(&t(0)).is_some() && cache.peek(&t(2)).is_some() && cache.peek(&t(3)).is_some());
        assert_eq!(cache.lock().len(), 3);
    }
}
