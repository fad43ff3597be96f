//! Running a compiled graph: start a turn, resume after decisions, read and fork history.
//!
//! A run is its own task: it loads nothing twice, applies each node's update to shared
//! state, checkpoints that update, and reports on a bounded event channel. The first record
//! of a run (its input, or the decisions that complete a pause) is written before the task
//! starts, so a second run on the same thread is refused by the store itself.

use crate::checkpoint::{
    CheckpointError, CheckpointMeta, CheckpointRecord, DerivedRows, RecordKind, RecordedRun, RunsFold, ThreadId, now_ms,
};
use crate::error::{GraphError, NodeError};
use crate::event::RunEvent;
use crate::graph::{CompiledGraph, StopCause};
use crate::heads::ThreadState;
use crate::interrupt::{Decision, InterruptId, PendingInterrupt};
use crate::node::{END, NodeOutput, RunContext, START};
use crate::state::State;
use futures::FutureExt;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::checkpoint::INTERRUPTED;

/// Per-run settings.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Most node executions in one run before it ends with
    /// [`RunOutcome::RecursionLimit`]. Default: 10 (the academy-admin contract's recursion limit, docs/service.md).
    pub recursion_limit: u32,
    /// Capacity of the event channel; a full channel makes the run wait. Default: 256.
    pub event_buffer: usize,
    /// Cancels the run between or during nodes.
    pub cancel: CancellationToken,
    /// A thread whose last record is older than this while a run was in flight is taken to
    /// belong to a crashed run and may be superseded. Default: 10 minutes.
    pub stale_after: Duration,
    /// The caller holds an exclusive claim on the thread (a lease in its own store, as the chat
    /// service holds one per conversation), so a run found mid-way is dead whatever its age: it
    /// is closed ([`CompiledGraph::close_interrupted`]) and this run goes ahead. Default: false.
    pub owns_thread: bool,
    /// The run's id, as its records carry it: the caller's own (unique: a UUID), so that what
    /// a run wrote can be found by the id the caller knows it by. Default: a new UUIDv7.
    pub run_id: Option<String>,
    /// What the caller says of the run (who started it, how), kept verbatim with the record
    /// that starts it, so whoever lists the thread's runs later ([`recorded_runs`](crate::recorded_runs))
    /// reads it on any replica. Default: none.
    pub metadata: Option<Box<RawValue>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            recursion_limit: 10,
            event_buffer: 256,
            cancel: CancellationToken::new(),
            stale_after: Duration::from_secs(600),
            owns_thread: false,
            run_id: None,
            metadata: None,
        }
    }
}

/// How a run ended.
#[derive(Debug)]
pub enum RunOutcome<S> {
    /// Reached END.
    Completed {
        /// Final state.
        state: Arc<S>,
    },
    /// Paused for decisions.
    Interrupted {
        /// State at the pause.
        state: Arc<S>,
        /// What must be decided.
        pending: Vec<PendingInterrupt>,
    },
    /// Ran `limit` nodes without finishing.
    RecursionLimit {
        /// State when stopped.
        state: Arc<S>,
        /// The limit.
        limit: u32,
    },
    /// Cancelled.
    Cancelled {
        /// State when stopped.
        state: Arc<S>,
    },
    /// A node or the store failed.
    Failed {
        /// State in the run's memory: it may hold a step whose checkpoint failed. The store's
        /// state (with the recovery's update, [`crate::StateGraph::set_recovery`]) is the truth.
        state: Arc<S>,
        /// The failure.
        error: GraphError,
    },
}

impl<S> RunOutcome<S> {
    fn shared_state(&self) -> Arc<S> {
        match self {
            Self::Completed { state }
            | Self::Interrupted { state, .. }
            | Self::RecursionLimit { state, .. }
            | Self::Cancelled { state }
            | Self::Failed { state, .. } => Arc::clone(state),
        }
    }

    /// The state the run ended with.
    pub fn state(&self) -> &S {
        match self {
            Self::Completed { state }
            | Self::Interrupted { state, .. }
            | Self::RecursionLimit { state, .. }
            | Self::Cancelled { state }
            | Self::Failed { state, .. } => state,
        }
    }
}

/// A running graph: its events and, at the end, its outcome.
pub struct RunHandle<S> {
    run_id: String,
    events: crate::event::EventReceiver,
    task: JoinHandle<RunOutcome<S>>,
}

impl<S: State> RunHandle<S> {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The next event; `None` once the run ended and every event was read.
    pub async fn next_event(&mut self) -> Option<RunEvent> {
        self.events.recv().await
    }

    /// Waits for the outcome, discarding unread events (the run no longer waits on them).
    pub async fn outcome(self) -> RunOutcome<S> {
        drop(self.events);
        join(self.task).await
    }

    /// Reads every event, then returns them with the outcome.
    pub async fn collect(mut self) -> (Vec<RunEvent>, RunOutcome<S>) {
        let mut events = Vec::new();
        while let Some(e) = self.events.recv().await {
            events.push(e);
        }
        (events, join(self.task).await)
    }
}

async fn join<S: State>(task: JoinHandle<RunOutcome<S>>) -> RunOutcome<S> {
    match task.await {
        Ok(o) => o,
        Err(e) => RunOutcome::Failed {
            state: Arc::new(S::default()),
            error: GraphError::Node { node: "runtime".into(), source: NodeError::new("panic", e.to_string()) },
        },
    }
}

/// What [`CompiledGraph::resume`] did.
pub enum ResumeResult<S> {
    /// Decisions recorded; these interrupts are still undecided.
    Waiting {
        /// Still pending.
        undecided: Vec<PendingInterrupt>,
    },
    /// Every interrupt is decided; the run continues.
    Started(RunHandle<S>),
}

impl<S: State, C: Send + Sync + 'static> CompiledGraph<S, C> {
    /// A blank record of this graph (its version stamped on it).
    fn record(&self, seq: u64, run_id: &str, kind: RecordKind) -> CheckpointRecord {
        CheckpointRecord {
            seq,
            format: crate::checkpoint::FORMAT_VERSION,
            run_id: run_id.to_owned(),
            kind,
            node: None,
            next: None,
            updates: Vec::new(),
            interrupts: Vec::new(),
            decisions: BTreeMap::new(),
            reason: None,
            metadata: None,
            graph_version: self.inner.version.clone(),
            created_at_ms: now_ms(),
        }
    }

    async fn write(&self, thread: &ThreadId, rec: &CheckpointRecord) -> Result<DerivedRows, GraphError> {
        match self.inner.checkpointer.append(thread, rec).await {
            Ok(derived) => Ok(derived),
            Err(CheckpointError::Conflict { .. }) => Err(GraphError::ConcurrentRun { thread: thread.to_string() }),
            Err(e) => Err(e.into()),
        }
    }

    /// The thread's current state, or `None` for a thread without checkpoints: the head this
    /// process knows, with the records written since (kept for the next reader).
    ///
    /// # Errors
    /// A store failure or an undecodable record.
    pub async fn thread_state(&self, thread: &ThreadId) -> Result<Option<ThreadState<S>>, GraphError> {
        let cached = self.inner.heads.peek(thread);
        let known = cached.as_ref().map(|h| (h.version, h.head_run.clone()));
        let head = self.catch_up(thread, cached).await?;
        if let Some(head) = &head
            && known.as_ref() != Some(&(head.version, head.head_run.clone()))
        {
            self.inner.heads.offer(thread, head.clone(), known.as_ref().map(|(seq, run)| (*seq, run.as_str())));
        }
        Ok(head)
    }

    /// The runs the thread's checkpoints record, oldest first ([`recorded_runs`](crate::recorded_runs)),
    /// folded from the records written since this process last read them (read whole again
    /// when the thread was compacted, rolled back or recreated since).
    ///
    /// # Errors
    /// A store failure.
    pub async fn recorded_runs(&self, thread: &ThreadId) -> Result<Vec<RecordedRun>, GraphError> {
        let store = &self.inner.checkpointer;
        // One small read says whether the kept fold is the store's thread still: the same
        // first record (not compacted since) and the same head.
        let Some((first, head, head_run)) = store.span(thread).await? else { return Ok(Vec::new()) };
        let kept = self.inner.runs.get(thread);
        let kept_last = kept.as_ref().and_then(|f| f.last()).map(|(seq, run)| (seq, run.to_owned()));
        let mut caught_up = None;
        if let (Some(mut fold), Some((seq, run))) = (kept, kept_last.clone())
            && fold.starts_at(first)
        {
            if seq == head && run == head_run {
                return Ok(fold.runs().to_vec());
            }
            if seq < head
                && let Some(tail) = self.records_after(thread, seq, &run).await?
            {
                fold.extend(&tail);
                caught_up = Some(fold);
            }
        }
        let fold = match caught_up {
            Some(fold) => fold,
            None => {
                let mut whole = RunsFold::default();
                whole.extend(&store.load(thread, None).await?);
                whole
            }
        };
        let runs = fold.runs().to_vec();
        self.inner.runs.offer(thread, fold, kept_last.as_ref().map(|(seq, run)| (*seq, run.as_str())));
        Ok(runs)
    }

    /// The state as the store has it, read whole (a failed run's memory may hold more).
    async fn stored_state(&self, thread: &ThreadId) -> Result<Option<Arc<S>>, GraphError> {
        Ok(self.load_whole(thread).await?.map(|head| head.state))
    }

    /// Brings a cached head up to date with the store, or loads it whole when there is no
    /// cached head or the store no longer has the record it ends at (deleted, recreated).
    async fn catch_up(
        &self,
        thread: &ThreadId,
        cached: Option<ThreadState<S>>,
    ) -> Result<Option<ThreadState<S>>, GraphError> {
        if let Some(mut head) = cached {
            // The common case, one small query: nobody wrote since this process did.
            match self.inner.checkpointer.head(thread).await? {
                Some((seq, run)) if seq == head.version && run == head.head_run => return Ok(Some(head)),
                Some((seq, _)) if seq > head.version => {}
                _ => return self.load_whole(thread).await,
            }
            if let Some(tail) = self.records_after(thread, head.version, &head.head_run).await? {
                head.extend(thread, tail)?;
                return Ok(Some(head));
            }
        }
        self.load_whole(thread).await
    }

    /// The records written after record `seq` of run `run`, or `None` when the store no longer
    /// holds that record (the thread was rolled back or compacted past it, or recreated): what
    /// a process that folded the thread up to it reads to catch up.
    async fn records_after(
        &self,
        thread: &ThreadId,
        seq: u64,
        run: &str,
    ) -> Result<Option<Vec<CheckpointRecord>>, GraphError> {
        let mut tail = self.inner.checkpointer.load_from(thread, seq).await?;
        if !tail.first().is_some_and(|r| r.seq == seq && r.run_id == run) {
            return Ok(None);
        }
        tail.remove(0);
        Ok(Some(tail))
    }

    async fn load_whole(&self, thread: &ThreadId) -> Result<Option<ThreadState<S>>, GraphError> {
        let records = self.inner.checkpointer.load(thread, None).await?;
        if records.is_empty() {
            return Ok(None);
        }
        ThreadState::fold(thread, records).map(Some)
    }

    /// The state as it was at checkpoint `seq`: from the head this process knows when that
    /// is at or before `seq` (only the records after it are read), else folded from the first.
    ///
    /// # Errors
    /// [`GraphError::NotFound`] for a checkpoint that does not exist.
    pub async fn state_at(&self, thread: &ThreadId, seq: u64) -> Result<ThreadState<S>, GraphError> {
        if let Some(mut head) = self.inner.heads.peek(thread).filter(|h| h.version > 0 && h.version <= seq)
            && let Some(mut tail) = self.records_after(thread, head.version, &head.head_run).await?
        {
            // The store's head is read too: kept when `seq` is it; past it, `seq` is not
            // written yet (records are numbered without gaps).
            let last = tail.last().map_or(head.version, |r| r.seq);
            if last < seq {
                return Err(GraphError::NotFound { thread: thread.to_string(), seq: Some(seq) });
            }
            tail.retain(|r| r.seq <= seq);
            head.extend(thread, tail)?;
            if last == seq {
                self.inner.heads.offer(thread, head.clone(), None);
            }
            return Ok(head);
        }
        let records = self.inner.checkpointer.load(thread, Some(seq)).await?;
        if records.last().map(|r| r.seq) != Some(seq) {
            return Err(GraphError::NotFound { thread: thread.to_string(), seq: Some(seq) });
        }
        ThreadState::fold(thread, records)
    }

    /// The states checkpoints `seqs` left (in any order; answered in the same), read and folded
    /// once: a history of many states costs one reading of the thread.
    ///
    /// # Errors
    /// [`GraphError::NotFound`] when one of them does not exist.
    pub async fn states_at(&self, thread: &ThreadId, seqs: &[u64]) -> Result<Vec<ThreadState<S>>, GraphError> {
        let Some(&last) = seqs.iter().max() else { return Ok(Vec::new()) };
        let records = self.inner.checkpointer.load(thread, Some(last)).await?;
        let wanted: std::collections::BTreeSet<u64> = seqs.iter().copied().collect();
        let mut found: BTreeMap<u64, ThreadState<S>> = BTreeMap::new();
        let mut state = ThreadState::empty();
        for record in records {
            let seq = record.seq;
            state.extend(thread, [record])?;
            if wanted.contains(&seq) {
                // Shares the state until the next update is applied (copied then).
                found.insert(seq, state.clone());
            }
        }
        seqs.iter()
            .map(|seq| {
                found
                    .get(seq)
                    .cloned()
                    .ok_or_else(|| GraphError::NotFound { thread: thread.to_string(), seq: Some(*seq) })
            })
            .collect()
    }

    /// The thread's checkpoints, oldest first.
    ///
    /// # Errors
    /// A store failure.
    pub async fn history(&self, thread: &ThreadId) -> Result<Vec<CheckpointMeta>, GraphError> {
        Ok(self.inner.checkpointer.list(thread).await?)
    }

    /// Starts a new thread `to` from `from` as it was at checkpoint `at`. A fork of a
    /// pause can be resumed with other decisions; any other fork is idle, ready for input.
    ///
    /// # Errors
    /// [`GraphError::NotFound`] for a missing checkpoint; a store failure; `to` existing.
    pub async fn fork(&self, from: &ThreadId, at: u64, to: &ThreadId) -> Result<(), GraphError> {
        let head = self.state_at(from, at).await?;
        self.inner.checkpointer.fork(from, at, to).await?;
        if head.next.is_some() && head.undecided().is_empty() {
            // An id of its own, as every run's: a record is known by its number and run id.
            let mut stop = self.record(at + 1, &format!("fork-{}", uuid::Uuid::now_v7()), RecordKind::Stop);
            stop.reason = Some(format!("forked from {from} at checkpoint {at}"));
            self.write(to, &stop).await?;
        }
        Ok(())
    }

    /// Writes an update to `thread` from outside any run, as node `as_node` had written it
    /// (LangGraph's `update_state`): one step record, its state the head's with the update
    /// applied by the channels' reducers. `update` makes the update from the state it will be
    /// applied to (so it can check it against the conversation so far). The thread stays
    /// idle: the next run starts a turn from the updated state. Returns the record's number.
    ///
    /// # Errors
    /// [`GraphError::UnknownNode`] for an `as_node` the graph lacks;
    /// [`GraphError::InvalidUpdate`] when `update` refuses; [`GraphError::AwaitingDecision`]
    /// while a pause waits; [`GraphError::ConcurrentRun`] while a run holds the thread (or
    /// another writer got there first); a store failure.
    pub async fn update_state(
        &self,
        thread: &ThreadId,
        as_node: Option<&str>,
        update: impl FnOnce(&S) -> Result<S::Update, String>,
    ) -> Result<u64, GraphError> {
        if let Some(node) = as_node
            && !self.inner.nodes.contains_key(node)
        {
            return Err(GraphError::UnknownNode(node.to_owned()));
        }
        let cached = self.inner.heads.take(thread);
        let mut head = self.catch_up(thread, cached).await?.unwrap_or_else(ThreadState::empty);
        if head.next.is_some() && head.pending.is_empty() {
            // A run holds the head (taken from the cache, as `start` leaves it): not put back.
            return Err(GraphError::ConcurrentRun { thread: thread.to_string() });
        }
        let made = if head.pending.is_empty() {
            update(&head.state).map_err(GraphError::InvalidUpdate)
        } else {
            Err(GraphError::AwaitingDecision { thread: thread.to_string(), pending: head.pending.len() })
        };
        let update = match made {
            Ok(update) => update,
            Err(e) => {
                self.inner.heads.put(thread.clone(), head);
                return Err(e);
            }
        };
        let run_id = uuid::Uuid::now_v7().to_string();
        let mut rec = self.record(head.version + 1, &run_id, RecordKind::Step);
        rec.node = as_node.map(str::to_owned);
        rec.updates.push(serde_json::value::to_raw_value(&update)?);
        // Written before the head changes: a refused write leaves the cached head as it was
        // (dropped here, read again next time).
        self.write(thread, &rec).await?;
        Arc::make_mut(&mut head.state).apply(update);
        head.version = rec.seq;
        head.last_at_ms = rec.created_at_ms;
        head.head_run = run_id;
        head.decisions.clear();
        self.inner.heads.put(thread.clone(), head);
        Ok(rec.seq)
    }

    /// Starts a turn on `thread` with `input` applied first.
    ///
    /// # Errors
    /// [`GraphError::AwaitingDecision`] while decisions are pending;
    /// [`GraphError::ConcurrentRun`] while another run is active on the thread; a store failure.
    pub async fn start(
        &self,
        thread: &ThreadId,
        input: S::Update,
        opts: RunOptions,
    ) -> Result<RunHandle<S>, GraphError> {
        // Taken, not copied: the run owns the head until it puts it back at its end.
        let cached = self.inner.heads.take(thread);
        let mut head = self.catch_up(thread, cached).await?.unwrap_or_else(ThreadState::empty);
        // A pause stays until its resume node checkpoints — also once every decision is in:
        // a run that died before that point did nothing yet, so its decisions are applied by
        // resuming again, never dropped by a new turn.
        if !head.pending.is_empty() {
            let pending = head.pending.len();
            self.inner.heads.put(thread.clone(), head);
            return Err(GraphError::AwaitingDecision { thread: thread.to_string(), pending });
        }
        if head.next.is_some() {
            if head.is_fresh(opts.stale_after) && !opts.owns_thread {
                return Err(GraphError::ConcurrentRun { thread: thread.to_string() });
            }
            // The run that left the thread mid-way is dead: close it before this one starts.
            head = self.close_dead_run(thread, head).await?;
        }
        let run_id = opts.run_id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let mut state = head.state;
        let value = serde_json::value::to_raw_value(&input)?;
        Arc::make_mut(&mut state).apply(input);
        let next = Self::route(&self.inner.entry, &state)
            .map_err(|m| GraphError::Node { node: START.into(), source: NodeError::new("routing", m) })?;
        let mut rec = self.record(head.version + 1, &run_id, RecordKind::Input);
        rec.metadata = opts.metadata.clone();
        rec.updates.push(value);
        rec.next = (next != END).then(|| next.clone());
        self.write(thread, &rec).await?;
        let start = RunStart { run_id, state, version: rec.seq, next, decisions: BTreeMap::new(), paused_by: None };
        Ok(self.spawn(thread, start, opts))
    }

    /// Records `decisions` (interrupt id → decision) for the thread's pause. Once every
    /// pending interrupt is decided, the run continues at the pausing node's resume point,
    /// which sees the decisions keyed by its own request keys. Repeating a recorded decision
    /// is a no-op.
    ///
    /// # Errors
    /// [`GraphError::UnknownInterrupt`], [`GraphError::ConflictingDecision`],
    /// [`GraphError::NothingToResume`], [`GraphError::ConcurrentRun`], a store failure.
    pub async fn resume(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
        opts: RunOptions,
    ) -> Result<ResumeResult<S>, GraphError> {
        self.decide(thread, decisions, opts, false).await
    }

    /// Records `decisions` for the thread's pause without continuing the run, even when they
    /// are the last ones: a caller that resumes later (with these, or with the plain yes or no
    /// they [cover](Decision::covers)) resumes with them. Returns what is still undecided. (The
    /// record is recent: a later resume by a caller that does not own the thread —
    /// [`RunOptions::owns_thread`] — is refused as concurrent within `stale_after` of it when it
    /// brings nothing new; the chat service owns its threads.)
    ///
    /// # Errors
    /// As [`CompiledGraph::resume`].
    pub async fn record_decisions(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
    ) -> Result<Vec<PendingInterrupt>, GraphError> {
        match self.decide(thread, decisions, RunOptions::default(), true).await? {
            ResumeResult::Waiting { undecided } => Ok(undecided),
            // A record-only decision never starts a run.
            ResumeResult::Started(_) => Ok(Vec::new()),
        }
    }

    /// [`CompiledGraph::resume`], or only its record (`record_only`).
    async fn decide(
        &self,
        thread: &ThreadId,
        decisions: BTreeMap<InterruptId, Decision>,
        opts: RunOptions,
        record_only: bool,
    ) -> Result<ResumeResult<S>, GraphError> {
        let cached = self.inner.heads.take(thread);
        let head =
            self.catch_up(thread, cached).await?.ok_or_else(|| GraphError::NothingToResume(thread.to_string()))?;
        let Some(resume_at) = head.next.clone().filter(|_| !head.pending.is_empty()) else {
            return Err(GraphError::NothingToResume(thread.to_string()));
        };
        let mut new = BTreeMap::new();
        for (id, d) in decisions {
            if !head.pending.iter().any(|p| p.id == id) {
                return Err(GraphError::UnknownInterrupt(id));
            }
            match head.decisions.get(&id) {
                Some(prev) if !prev.covers(&d) => return Err(GraphError::ConflictingDecision(id)),
                Some(_) => {}
                None => {
                    new.insert(id, d);
                }
            }
        }
        let mut merged = head.decisions.clone();
        merged.extend(new.clone());
        let undecided: Vec<PendingInterrupt> =
            head.pending.iter().filter(|p| !merged.contains_key(&p.id)).cloned().collect();
        if record_only {
            if !new.is_empty() {
                // Under the pausing run's id: the pause is still that run's (its pending actions
                // are found by it) until a resume continues it.
                let mut rec = self.record(head.version + 1, &head.pause_run, RecordKind::Decision);
                rec.decisions = new;
                rec.next = Some(resume_at);
                self.write(thread, &rec).await?;
            }
            return Ok(ResumeResult::Waiting { undecided });
        }
        if new.is_empty() {
            if !undecided.is_empty() {
                return Ok(ResumeResult::Waiting { undecided });
            }
            // Everything was decided before: a run already took over, unless it died (a caller
            // that owns the thread knows it did). Resuming again repeats what the dead run had
            // not checkpointed, with the same call ids, so an idempotent tool runs once. A resume
            // that ended before its first step marked that no run holds the pause.
            if head.is_fresh(opts.stale_after) && !opts.owns_thread && !head.pause_reopened {
                return Err(GraphError::ConcurrentRun { thread: thread.to_string() });
            }
        }
        let run_id = opts.run_id.clone().unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let mut rec = self.record(head.version + 1, &run_id, RecordKind::Decision);
        rec.decisions = new;
        rec.next = Some(resume_at.clone());
        rec.metadata = opts.metadata.clone();
        self.write(thread, &rec).await?;
        if !undecided.is_empty() {
            return Ok(ResumeResult::Waiting { undecided });
        }
        let decisions =
            head.pending.iter().filter_map(|p| merged.get(&p.id).map(|d| (p.key.clone(), d.clone()))).collect();
        let paused_by = Some(head.pause_run);
        let start = RunStart { run_id, state: head.state, version: rec.seq, next: resume_at, decisions, paused_by };
        Ok(ResumeResult::Started(self.spawn(thread, start, opts)))
    }

    /// Closes a run that stopped mid-way on `thread` (its process died): writes a stop record
    /// with what [`StateGraph::set_recovery`](crate::StateGraph::set_recovery) adds to the state,
    /// so the thread is idle and whole again and its history says what happened — or, for a
    /// resume that died before its first step (its decisions' record the head), a mark that
    /// the pause waits again, its decisions standing (the same decisions resume it). Returns
    /// whether there was such a run; a thread that is idle, or paused and not taken over by a
    /// run (awaiting decisions, or reopened), is left alone.
    ///
    /// Only a caller that knows the run is dead may call this (one holding the thread's lease,
    /// as the chat service does after a restart): a live run would find its thread moved on.
    ///
    /// # Errors
    /// A store failure; [`GraphError::ConcurrentRun`] if another writer got there first.
    pub async fn close_interrupted(&self, thread: &ThreadId) -> Result<bool, GraphError> {
        let cached = self.inner.heads.take(thread);
        let Some(mut head) = self.catch_up(thread, cached).await? else { return Ok(false) };
        // A resume wrote the decisions' record, and nothing after.
        let taken_over = head.resumed && head.undecided().is_empty();
        let resume_at = head.next.clone().filter(|_| head.pending.is_empty() || taken_over);
        let Some(resume_at) = resume_at else {
            self.inner.heads.put(thread.clone(), head);
            return Ok(false);
        };
        if head.pending.is_empty() {
            let head = self.close_dead_run(thread, head).await?;
            self.inner.heads.put(thread.clone(), head);
            return Ok(true);
        }
        let rec = self.pause_mark(head.version + 1, &head.pause_run, resume_at, INTERRUPTED);
        self.write(thread, &rec).await?;
        tracing::warn!(%thread, "reopened a pause whose resume stopped before its first step (its process died)");
        head.version = rec.seq;
        head.last_at_ms = rec.created_at_ms;
        head.head_run = rec.run_id;
        head.pause_reopened = true;
        head.resumed = false;
        self.inner.heads.put(thread.clone(), head);
        Ok(true)
    }

    /// The mark that a resume ended before its first step (`reason`: cancelled, or its process
    /// died) and the pause of run `pause_run` waits again at `resume_at`, its decisions
    /// standing: a decision record with none, under the pausing run (whose pending actions are
    /// found by it).
    fn pause_mark(&self, seq: u64, pause_run: &str, resume_at: String, reason: &str) -> CheckpointRecord {
        let mut rec = self.record(seq, pause_run, RecordKind::Decision);
        rec.next = Some(resume_at);
        rec.reason = Some(reason.to_owned());
        rec
    }

    /// Writes the stop record of a dead run (with the recovery update) and returns the head after it.
    async fn close_dead_run(&self, thread: &ThreadId, mut head: ThreadState<S>) -> Result<ThreadState<S>, GraphError> {
        let run_id = uuid::Uuid::now_v7().to_string();
        let mut rec = self.record(head.version + 1, &run_id, RecordKind::Stop);
        rec.reason = Some(INTERRUPTED.to_owned());
        let update = self.inner.recovery.and_then(|recover| recover(&head.state, StopCause::Died));
        if let Some(update) = update {
            rec.updates.push(serde_json::value::to_raw_value(&update)?);
            Arc::make_mut(&mut head.state).apply(update);
        }
        self.write(thread, &rec).await?;
        tracing::warn!(%thread, "closed a run that stopped mid-way (its process died)");
        head.version = rec.seq;
        head.next = None;
        head.pending.clear();
        head.decisions.clear();
        head.pause_run.clear();
        head.pause_reopened = false;
        head.resumed = false;
        head.last_at_ms = rec.created_at_ms;
        head.head_run = run_id;
        Ok(head)
    }

    /// Runs `start` on its own task; the head it ends with goes back into the head cache,
    /// unless the run failed (the store is then the truth, reloaded on next use).
    fn spawn(&self, thread: &ThreadId, start: RunStart<S>, opts: RunOptions) -> RunHandle<S> {
        let (tx, rx) = crate::event::event_channel(opts.event_buffer.max(1));
        let run_id = start.run_id.clone();
        let mut run = Run {
            graph: self.clone(),
            thread: thread.clone(),
            id: Arc::from(start.run_id.as_str()),
            thread_name: Arc::from(thread.as_str()),
            state: start.state,
            version: start.version,
            steps: 0,
            resumed_from: start.paused_by.map(|paused_by| ResumedPause {
                seq: start.version,
                paused_by,
                resume_at: start.next.clone(),
            }),
            opts,
            events: tx,
        };
        let task = tokio::spawn(async move {
            let started = RunEvent::RunStarted { run_id: start.run_id.clone(), thread: run.thread.to_string() };
            run.emit(started).await;
            let (outcome, next) = run.drive(start.next, start.decisions).await;
            // Only a run that ended as it meant to knows the head: one that failed, was
            // cancelled or hit the limit may differ from the store (a step that was not
            // written, the recovery's update, a stop record that failed), which is then
            // reloaded on next use.
            let pending = match &outcome {
                RunOutcome::Interrupted { pending, .. } => pending.clone(),
                RunOutcome::Completed { .. } => Vec::new(),
                _ => return outcome,
            };
            let pause_run = if pending.is_empty() { String::new() } else { start.run_id.clone() };
            let head = ThreadState {
                state: outcome.shared_state(),
                version: run.version,
                next,
                pending,
                decisions: BTreeMap::new(),
                last_at_ms: now_ms(),
                head_run: start.run_id,
                pause_run,
                pause_reopened: false,
                resumed: false,
            };
            run.graph.inner.heads.put(run.thread.clone(), head);
            outcome
        });
        RunHandle { run_id, events: rx, task }
    }
}

/// What a run starts from: its id, the state after its first record, that record's sequence
/// number, the node to run first, and (when resuming) the decisions by request key.
struct RunStart<S> {
    run_id: String,
    state: Arc<S>,
    version: u64,
    next: String,
    decisions: BTreeMap<String, Decision>,
    /// When resuming: the run the pause is under (its last record's run id).
    paused_by: Option<String>,
}

/// What a run that resumes a pause knows of it.
struct ResumedPause {
    /// The sequence number of the decisions' record: while the run's `version` is still this,
    /// it has recorded nothing and the pause stands.
    seq: u64,
    /// The run the pause is under, which its pending actions are found by.
    paused_by: String,
    /// The node the pause resumes at.
    resume_at: String,
}

/// One run in flight, owned by its task: the graph it runs, the thread it writes, the state
/// and head it has reached, and where its events go.
struct Run<S: State, C> {
    graph: CompiledGraph<S, C>,
    thread: ThreadId,
    /// The run id, shared with every node's context.
    id: Arc<str>,
    /// The thread id as nodes see it.
    thread_name: Arc<str>,
    state: Arc<S>,
    /// Sequence number of the last record written.
    version: u64,
    /// Nodes executed so far (the recursion limit counts these).
    steps: u32,
    /// For a run that resumes a pause: the pause.
    resumed_from: Option<ResumedPause>,
    opts: RunOptions,
    events: crate::event::EventSender,
}

/// Where a run goes after a node's step was checkpointed.
enum Step {
    /// On to this node (or `END`).
    Continue(String),
    /// Paused for these decisions; resumes at `resume_at`.
    Paused { pending: Vec<PendingInterrupt>, resume_at: String },
}

/// Why a step ended the run instead.
enum Halt {
    Cancelled,
    Failed(GraphError),
}

impl<S: State, C: Send + Sync + 'static> Run<S, C> {
    /// Sends an event; a consumer that went away does not stop the run.
    async fn emit(&self, event: RunEvent) {
        let _ = self.events.send(event).await;
    }

    /// Runs nodes from `next` until the graph ends, pauses, stops or fails; returns the outcome
    /// and the node the thread resumes at (for a pause).
    async fn drive(
        &mut self,
        mut next: String,
        decisions: BTreeMap<String, Decision>,
    ) -> (RunOutcome<S>, Option<String>) {
        let mut decisions = Arc::new(decisions);
        loop {
            if next == END {
                self.emit(RunEvent::Completed).await;
                return (RunOutcome::Completed { state: Arc::clone(&self.state) }, None);
            }
            if self.opts.cancel.is_cancelled() {
                return (self.cancelled().await, None);
            }
            let limit = self.opts.recursion_limit;
            if self.steps >= limit {
                self.stop_whole("recursion limit", StopCause::Failed).await;
                self.emit(RunEvent::RecursionLimit { limit }).await;
                return (RunOutcome::RecursionLimit { state: Arc::clone(&self.state), limit }, None);
            }
            self.steps += 1;
            match self.step(&next, std::mem::take(&mut decisions)).await {
                Ok(Step::Continue(route)) => next = route,
                Ok(Step::Paused { pending, resume_at }) => {
                    let state = Arc::clone(&self.state);
                    return (RunOutcome::Interrupted { state, pending }, Some(resume_at));
                }
                Err(Halt::Cancelled) => return (self.cancelled().await, None),
                Err(Halt::Failed(error)) => return (self.fail(error).await, None),
            }
        }
    }

    /// Runs node `name` once, applies and checkpoints its update, and routes.
    async fn step(&mut self, name: &str, decisions: Arc<BTreeMap<String, Decision>>) -> Result<Step, Halt> {
        let failed = |kind: &'static str, message: String| {
            Halt::Failed(GraphError::Node { node: name.to_owned(), source: NodeError::new(kind, message) })
        };
        // Compile-time validation makes a missing node impossible unless a stored `next` names a
        // node that a newer graph no longer has.
        let Some((node_name, node)) = self.graph.inner.nodes.get(name).cloned() else {
            return Err(failed("routing", "no such node in this graph".into()));
        };
        self.emit(RunEvent::NodeStarted { node: name.to_owned(), step: self.steps, from: self.version }).await;
        let ctx = RunContext {
            deps: Arc::clone(&self.graph.inner.deps),
            events: self.events.clone(),
            decisions,
            run_id: Arc::clone(&self.id),
            thread: Arc::clone(&self.thread_name),
            node: node_name,
            step: self.steps,
        };
        let call = AssertUnwindSafe(node.run(Arc::clone(&self.state), ctx)).catch_unwind();
        let result = tokio::select! {
            biased;
            _ = self.opts.cancel.cancelled() => return Err(Halt::Cancelled),
            r = call => r,
        };
        let output = match result {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(Halt::Failed(GraphError::Node { node: name.to_owned(), source: e })),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-text panic".into());
                return Err(failed("panic", what));
            }
        };
        let mut rec = self.graph.record(self.version + 1, &self.id, RecordKind::Step);
        rec.node = Some(name.to_owned());
        let (update, pause) = match output {
            NodeOutput::Update(update) => (update, None),
            NodeOutput::Interrupt { update, requests, resume_at } => (update, Some((requests, resume_at))),
        };
        rec.updates.push(serde_json::value::to_raw_value(&update).map_err(|e| Halt::Failed(e.into()))?);
        Arc::make_mut(&mut self.state).apply(update);
        let step = match pause {
            None => {
                let route = match self.graph.inner.edges.get(name).map(|e| CompiledGraph::<S, C>::route(e, &self.state))
                {
                    Some(Ok(route)) => route,
                    Some(Err(m)) => return Err(failed("routing", m)),
                    None => END.to_owned(),
                };
                rec.next = (route != END).then(|| route.clone());
                Step::Continue(route)
            }
            Some((requests, resume_at)) => {
                if !self.graph.inner.nodes.contains_key(&resume_at) {
                    return Err(failed("routing", format!("resume node '{resume_at}' does not exist")));
                }
                let pending: Vec<PendingInterrupt> = requests
                    .into_iter()
                    .map(|r| PendingInterrupt { id: InterruptId::fresh(), key: r.key, payload: r.payload })
                    .collect();
                rec.kind = RecordKind::Interrupt;
                rec.interrupts = pending.clone();
                rec.next = Some(resume_at.clone());
                Step::Paused { pending, resume_at }
            }
        };
        let derived = self.graph.write(&self.thread, &rec).await.map_err(Halt::Failed)?;
        self.version = rec.seq;
        let finished = RunEvent::NodeFinished {
            node: name.to_owned(),
            step: self.steps,
            checkpoint: rec.seq,
            next: rec.next.clone(),
            derived,
            // The step's one update, written: handed over.
            update: rec.updates.pop().map(Into::into).unwrap_or_default(),
        };
        self.emit(finished).await;
        if let Step::Paused { pending, .. } = &step {
            self.emit(RunEvent::Interrupted { pending: pending.clone() }).await;
        }
        Ok(step)
    }

    async fn cancelled(&mut self) -> RunOutcome<S> {
        match self.resumed_from.take() {
            // A resumed run cancelled before its first checkpoint (its resume node — an
            // approved tool, say — did not finish) leaves the pause to be resumed with the same
            // decisions, which stand; a record under the pause's run says so, so the thread
            // reads as waiting on it again and the run as cancelled.
            Some(pause) if pause.seq == self.version => self.reopen_pause(pause, crate::checkpoint::CANCELLED).await,
            _ => self.stop_whole(crate::checkpoint::CANCELLED, StopCause::Died).await,
        }
        self.emit(RunEvent::Cancelled).await;
        RunOutcome::Cancelled { state: Arc::clone(&self.state) }
    }

    /// Marks that this resume ended before its first step (`reason`) and its pause waits again,
    /// its decisions standing; a failure to do so only logs (the pause reads as taken over
    /// until the thread's owner closes the run).
    async fn reopen_pause(&mut self, pause: ResumedPause, reason: &str) {
        let rec = self.graph.pause_mark(self.version + 1, &pause.paused_by, pause.resume_at, reason);
        match self.graph.write(&self.thread, &rec).await {
            Ok(_) => self.version = rec.seq,
            Err(e) => tracing::warn!(thread = %self.thread, error = %e, "could not mark the pause waiting again"),
        }
    }

    /// Marks the run stopped so the thread is idle again; a failure to do so only logs,
    /// because the stale-run rule frees the thread eventually.
    async fn write_stop(&mut self, reason: &str, update: Option<Box<serde_json::value::RawValue>>) {
        let mut rec = self.graph.record(self.version + 1, &self.id, RecordKind::Stop);
        rec.reason = Some(reason.to_owned());
        rec.updates.extend(update);
        match self.graph.write(&self.thread, &rec).await {
            Ok(_) => self.version = rec.seq,
            Err(e) => tracing::warn!(thread = %self.thread, error = %e, "could not mark the run stopped"),
        }
    }

    /// Stops a run that may have left its step half done, with the recovery's update over the
    /// *stored* state: a step whose checkpoint failed is in this run's memory but not in the
    /// store, so its effects (a tool that ran, say) get the recovery's answer there.
    ///
    /// When the stored state cannot be read (or the update cannot be encoded), nothing is
    /// written: a bare stop record would leave what the recovery mends (a call without a
    /// result) for good, while a thread left mid-run is closed with the recovery by its next
    /// owner ([`CompiledGraph::close_interrupted`], or the next start).
    async fn stop_whole(&mut self, reason: &str, cause: StopCause) {
        let Some(recover) = self.graph.inner.recovery else {
            return self.write_stop(reason, None).await;
        };
        let update = match self.graph.stored_state(&self.thread).await {
            Ok(Some(stored)) => {
                match recover(&stored, cause).map(|u| serde_json::value::to_raw_value(&u)).transpose() {
                    Ok(update) => update,
                    Err(e) => {
                        tracing::warn!(thread = %self.thread, error = %e, "cannot encode the recovery; the run stays open");
                        return;
                    }
                }
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(thread = %self.thread, error = %e, "cannot read the stored state; the run stays open");
                return;
            }
        };
        self.write_stop(reason, update).await;
    }

    async fn fail(&mut self, error: GraphError) -> RunOutcome<S> {
        let unrecorded = self.resumed_from.as_ref().is_some_and(|p| p.seq == self.version);
        match &error {
            // Another run owns the thread now: leave its records alone.
            GraphError::ConcurrentRun { .. } => {}
            // The store refused a resumed run's first checkpoint: nothing of the run is
            // recorded, so the pause and its decisions stand (marked so, if the store takes
            // it now) and resuming again applies them.
            GraphError::Checkpoint(_) if unrecorded => {
                if let Some(pause) = self.resumed_from.take() {
                    self.reopen_pause(pause, &error.to_string()).await;
                }
            }
            _ => self.stop_whole(&error.to_string(), StopCause::Failed).await,
        }
        tracing::warn!(thread = %self.thread, %error, "run failed");
        self.emit(RunEvent::Error { message: error.to_string() }).await;
        RunOutcome::Failed { state: Arc::clone(&self.state), error }
    }
}
