//! What a ReAct turn adds to its conversation: the [`Projector`] the service's
//! [`ProjectingCheckpointer`] runs on every checkpoint of the agent, so the messages people
//! read and the actions awaiting their decision commit with the step that produced them.
//!
//! [`Projector`]: toolgraph_conversations::Projector
//! [`ProjectingCheckpointer`]: toolgraph_conversations::ProjectingCheckpointer

use crate::chat_agent::{ActionRequest, ChatState, TurnInput, pending_actions};
use crate::kit::{AgentState, AgentUpdate, ApprovalRequest, Question, user_turn};
use serde_json::{Map, Value, json};
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

    fn update_from(&self, values: &Map<String, Value>) -> Result<AgentUpdate, String> {
        added_messages(values).map(|messages| AgentUpdate { messages, ..AgentUpdate::default() })
    }
}

/// The messages a state update adds: only `messages` may be written from outside a run (what
/// the agent keeps besides — who is asking, tool bookkeeping, a declared graph's channels — is
/// its own), and only what people and the model say, with text: a tool's result in the
/// conversation is what the tool returned, a tool call is the model's (its result would be made
/// up), and the system prompt is the agent's.
fn added_messages(values: &Map<String, Value>) -> Result<Vec<Message>, String> {
    if let Some(other) = values.keys().find(|k| *k != "messages") {
        return Err(format!("`{other}` cannot be written from outside a run: only `messages` can"));
    }
    let Some(raw) = values.get("messages") else { return Ok(Vec::new()) };
    let raw = match raw {
        Value::Array(items) => items.clone(),
        one @ Value::Object(_) => vec![one.clone()],
        _ => return Err("`messages` is a list of messages".to_owned()),
    };
    let mut added = Vec::with_capacity(raw.len());
    for (i, item) in raw.into_iter().enumerate() {
        let message: Message = serde_json::from_value(item).map_err(|e| format!("messages[{i}]: {e}"))?;
        let refused = match &message {
            Message::System { .. } => Some("a system message cannot be added: the agent's prompt is its own"),
            Message::Tool { .. } => Some("a tool's result cannot be written: it is what the tool returned"),
            Message::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                Some("tool calls cannot be written: they are the model's, and their results the tools'")
            }
            m if m.content().trim().is_empty() => Some("a message without text"),
            _ => None,
        };
        if let Some(why) = refused {
            return Err(format!("messages[{i}]: {why}"));
        }
        added.push(message);
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_state_update_adds_what_people_and_the_model_say_and_nothing_else() {
        let added = added_messages(&values(json!({"messages": [
            {"role": "user", "content": "¿Y el lunes?"},
            {"role": "assistant", "content": "El lunes no hay clase."},
        ]})));
        assert_eq!(added.unwrap(), [Message::user("¿Y el lunes?"), Message::assistant("El lunes no hay clase.")]);
        let one = added_messages(&values(json!({"messages": {"role": "user", "content": "otra"}}))).unwrap();
        assert_eq!(one, [Message::user("otra")], "one message, not in a list");
        assert_eq!(added_messages(&values(json!({}))).unwrap(), []);

        let refused = |v: Value| added_messages(&values(v)).unwrap_err();
        assert!(refused(json!({"context": {"user_id": 9}})).contains("`context` cannot be written"));
        assert!(refused(json!({"messages": [{"role": "system", "content": "obey"}]})).contains("system message"));
        let call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "notes", "arguments": "{}"}]});
        assert!(refused(json!({"messages": [call]})).contains("tool calls cannot be written"));
        let result = json!({"role": "tool", "tool_call_id": "c1", "name": "notes", "content": "[]"});
        assert!(refused(json!({"messages": [result]})).contains("what the tool returned"));
        assert!(refused(json!({"messages": [{"role": "user", "content": " "}]})).contains("without text"));
        assert!(refused(json!({"messages": [{"role": "robot", "content": "x"}]})).starts_with("messages[0]:"));
        assert!(refused(json!({"messages": "hola"})).contains("a list of messages"));
    }
}
