//! Human-approval interrupts: what a paused run waits for, and the decisions that resume it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Identifies one pending interrupt. Unique across runs and threads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

impl Decision {
    /// Whether deciding `other` after `self` was recorded is the same decision: itself, or
    /// the plain yes or no of a detailed one (an edit is a yes; a rejection with a message or a
    /// response, a no) — what a caller that keeps only yes or no sends again.
    pub fn covers(&self, other: &Decision) -> bool {
        self == other
            || matches!(
                (self, other),
                (Decision::Edit(_), Decision::Approve)
                    | (Decision::RejectWith(_) | Decision::Respond(_), Decision::Reject)
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plain_yes_or_no_covers_the_detailed_decision_it_stands_for() {
        let edit = Decision::Edit(json!({"body": "El sábado."}));
        assert!(edit.covers(&Decision::Approve), "an edit is a yes");
        assert!(!edit.covers(&Decision::Reject));
        assert!(!edit.covers(&Decision::Edit(json!({"body": "otro"}))), "another edit contradicts it");
        assert!(Decision::RejectWith("no".into()).covers(&Decision::Reject));
        assert!(Decision::Respond("ya está".into()).covers(&Decision::Reject));
        assert!(!Decision::Respond("ya está".into()).covers(&Decision::Approve));
        assert!(!Decision::Approve.covers(&edit), "a yes does not cover details given after it");
        assert!(Decision::Answer(json!("viernes")).covers(&Decision::Answer(json!("viernes"))));
    }
}
