//! What a ReAct turn adds to its conversation: the [`Projector`] the service's
//! [`ProjectingCheckpointer`] runs on every checkpoint of the agent, so the messages people
//! read and the actions awaiting their decision commit with the step that produced them.
//!
//! [`Projector`]: toolgraph_conversations::Projector
//! [`ProjectingCheckpointer`]: toolgraph_conversations::ProjectingCheckpointer

use crate::chat_agent::{ActionRequest, ChatState, TurnInput, pending_actions};
use crate::kit::{AgentState, AgentUpdate, ApprovalRequest, Question, user_turn};
use serde_json::{Value, json};
use toolgraph_conversations::{Projection, Role};
use toolgraph_graph::CheckpointRecord;
use toolgraph_llm::Message;

/// The messages and pending actions one record of conversation `conversation` adds: the
/// user's message, the assistant's replies (not its tool-calling turns, which people do not
/// read), each tool's outcome, and one pending action per interrupt.
pub fn project(conversation: i64, record: &CheckpointRecord) -> Projection {
    let mut p = Projection::default();
    for raw in &record.updates {
        let Ok(update) = serde_json::from_str::<AgentUpdate>(raw.get()) else { continue };
        for m in update.messages {
            match m {
                Message::User { content } => p.messages.push((Role::User, content)),
                Message::Assistant { content, tool_calls } if tool_calls.is_empty() => {
                    p.messages.push((Role::Assistant, content))
                }
                Message::Tool { tool_call_id, name, content } => {
                    let outcome = serde_json::from_str::<Value>(&content).unwrap_or(Value::String(content));
                    let text = json!({ "tool": name, "call_id": tool_call_id, "outcome": outcome }).to_string();
                    p.messages.push((Role::Tool, text));
                }
                Message::Assistant { .. } | Message::System { .. } => {}
            }
        }
    }
    // Every interrupt of this agent carries an approval request or a question; a foreign one
    // is still recorded (blank), so it can be decided.
    p.pending = pending_actions(conversation, record, <AgentState as ChatState>::action_request);
    p
}

/// The ReAct state as the chat service serves it.
impl ChatState for AgentState {
    fn user_turn(input: TurnInput) -> AgentUpdate {
        let mut update = user_turn(input.message, input.context);
        update.context_set = Some(input.identity);
        update
    }

    fn reply(&self) -> Option<&str> {
        self.last_reply()
    }

    fn action_request(payload: &Value) -> ActionRequest {
        // Approvals first (most pauses are); a question's pending action names no tool: its
        // text is the question, its arguments the form (docs/agents.md, `ask`).
        if let Some(r) = ApprovalRequest::of(payload) {
            return ActionRequest { tool: r.tool, description: r.description, arguments: r.arguments };
        }
        match Question::of(payload) {
            Some(q) => ActionRequest {
                tool: crate::chat_agent::QUESTION.to_owned(),
                description: q.question,
                arguments: json!({ "form": q.form }),
            },
            None => ActionRequest::default(),
        }
    }

    fn project(conversation: i64, record: &CheckpointRecord) -> Projection {
        project(conversation, record)
    }
}
