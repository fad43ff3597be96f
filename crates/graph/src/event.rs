//! [`RunEvent`]: the stream every consumer of a run (server, CLI, tests) reads.

use crate::interrupt::PendingInterrupt;
use serde::Serialize;
use serde_json::Value;

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
    },
    /// A node finished and its update was checkpointed.
    NodeFinished {
        /// Node name.
        node: String,
        /// Step number.
        step: u32,
        /// The checkpoint written.
        checkpoint: u64,
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
