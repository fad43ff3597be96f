//! [`RunEvent`]: the stream every consumer of a run (server, CLI, tests) reads.

use crate::checkpoint::DerivedRows;
use crate::interrupt::PendingInterrupt;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

/// The tokens one model call used, as the model reported them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenUsage {
    /// The model's identifier.
    pub model: String,
    /// Tokens of the prompt.
    pub prompt: u64,
    /// Tokens generated.
    pub completion: u64,
    /// Of the prompt's tokens, those a cache of computed prompts already held.
    pub cached_prompt: u64,
}

/// Something that happened in a run, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// The run began (or resumed) on a thread.
    RunStarted {
        /// The run.
        run_id: String,
        /// The thread.
        thread: String,
    },
    /// A node began.
    NodeStarted {
        /// Node name.
        node: String,
        /// 1-based step number within this run.
        step: u32,
        /// The checkpoint it starts from: the run's input, or the step before.
        from: u64,
    },
    /// A node finished and its update was checkpointed.
    NodeFinished {
        /// Node name.
        node: String,
        /// Step number.
        step: u32,
        /// The checkpoint written.
        checkpoint: u64,
        /// The node that runs next (`None`: the run ends, or pauses with nothing left).
        next: Option<String>,
        /// What the store derived from that checkpoint and wrote with it (the ids of a
        /// projecting store's rows; empty for a plain store).
        derived: DerivedRows,
        /// The state update the node made, as JSON, as the checkpoint stores it (handed over,
        /// not copied): what a consumer that streams each node's update tells.
        #[serde(skip)]
        update: Box<str>,
    },
    /// A node began a model call.
    ModelCallStarted {
        /// The node making it.
        node: String,
    },
    /// That model call ended. A tool's own model call is reported by this alone (its time is
    /// the tool's), for its tokens.
    ModelCallFinished {
        /// The node that made it.
        node: String,
        /// Whether it answered.
        ok: bool,
        /// The tokens it used, when the model reported them.
        usage: Option<TokenUsage>,
    },
    /// Data a node streams of its own while it runs ([`RunContext::write_custom`]
    /// (crate::RunContext::write_custom)): progress, what it found, a check's report — for the
    /// run's consumer, not part of the state.
    Custom {
        /// The node that wrote it.
        node: String,
        /// What it wrote.
        data: Value,
    },
    /// A piece of model text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A tool call the model made is about to run (read) or wait (write).
    ToolCall {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments.
        arguments: Value,
    },
    /// A tool call's outcome.
    ToolResult {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// The outcome as the model sees it.
        outcome: Value,
        /// Whether it succeeded.
        ok: bool,
    },
    /// The run paused for these decisions.
    Interrupted {
        /// What is pending.
        pending: Vec<PendingInterrupt>,
    },
    /// The run ended normally.
    Completed,
    /// The run hit its recursion limit.
    RecursionLimit {
        /// The limit.
        limit: u32,
    },
    /// The run was cancelled.
    Cancelled,
    /// The run failed.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// The sending side of a run's event channel.
///
/// The channel carries boxed events: tokio allocates a channel's buffer in blocks of 32
/// slots of the item's size, and an event is ~90 bytes, so a run held a block of unboxed
/// slots for its whole life (one of the larger per-stream costs heaptrack showed on held chat
/// streams). Boxed, a block is 256 bytes and an event lives in the heap only until it is read.
#[derive(Debug, Clone)]
pub(crate) struct EventSender(mpsc::Sender<Box<RunEvent>>);

/// The receiving side (see [`EventSender`]).
#[derive(Debug)]
pub(crate) struct EventReceiver(mpsc::Receiver<Box<RunEvent>>);

/// A run's event channel holding up to `capacity` unread events.
pub(crate) fn event_channel(capacity: usize) -> (EventSender, EventReceiver) {
    let (tx, rx) = mpsc::channel(capacity);
    (EventSender(tx), EventReceiver(rx))
}

impl EventSender {
    /// Sends an event, waiting while the channel is full; fails once the receiver is gone.
    pub(crate) async fn send(&self, event: RunEvent) -> Result<(), RunEvent> {
        self.0.send(Box::new(event)).await.map_err(|e| *e.0)
    }
}

impl EventReceiver {
    /// The next event; `None` once every sender is gone and every event was read.
    pub(crate) async fn recv(&mut self) -> Option<RunEvent> {
        self.0.recv().await.map(|e| *e)
    }
}
