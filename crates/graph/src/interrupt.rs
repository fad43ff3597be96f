//! Human-approval interrupts: what a paused run waits for, and the decisions that resume it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Identifies one pending interrupt. Unique across runs and threads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InterruptId(pub String);

impl InterruptId {
    pub(crate) fn fresh() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }
}

impl std::fmt::Display for InterruptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a node asks a person to decide: a typed payload (for the ReAct agent, the tool
/// call and its action text) under a caller-chosen key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InterruptRequest {
    /// A key the node recognises the decision by on resume (e.g. the tool call id).
    pub key: String,
    /// Anything the person needs to decide: shown by UIs, stored with the checkpoint.
    pub payload: Value,
}

/// An interrupt waiting for a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingInterrupt {
    /// Its unique id; resume is keyed by it.
    pub id: InterruptId,
    /// The node's key.
    pub key: String,
    /// The node's payload.
    pub payload: Value,
}

/// A person's decision on one interrupt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Go ahead.
    Approve,
    /// Do not.
    Reject,
    /// Their answer to what the node asked (a question, a small form): stored as
    /// `{"answer": value}`.
    Answer(Value),
    /// Go ahead with these arguments instead of the ones asked for (a person's edit, checked
    /// against the action's schema before it is recorded).
    Edit(Value),
    /// Do not, and say why: the node passes the message on (a tool call's result the model
    /// reads).
    RejectWith(String),
    /// Do not run it: the person's answer stands in for its result.
    Respond(String),
}
