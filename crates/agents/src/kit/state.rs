//! The state every agent here keeps: the message log and the tools' context ([`AgentState`])
//! and its updates, a user's turn, what a paused write call asks a person
//! ([`ApprovalRequest`]), and how a turn whose run stopped mid-way is made whole ([`recover`]).

use super::tools::tool_message;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolgraph_graph::{State, StopCause};
use toolgraph_llm::{Message, ToolCall};
use toolgraph_tools::{ToolError, ToolOutcome};

/// What a paused write call asks a person to decide: the payload of each interrupt the ReAct
/// agent raises, as checkpoints keep it (the field names are part of the stored format).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The model's id of the call.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The arguments the model gave (without the state-injected ones).
    pub arguments: Value,
    /// The action as a person reads it (the tool's `describe`, over the arguments with the
    /// injected values).
    pub description: String,
    /// The JSON Schema of the arguments (the model's, without the injected ones): a person's
    /// edit is checked against it before it is recorded.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub parameters: Value,
}

impl ApprovalRequest {
    /// The request of an interrupt payload; `None` for a payload the agent did not write.
    pub fn of(payload: &Value) -> Option<Self> {
        // Read in place: a payload is not copied to be tried.
        Self::deserialize(payload).ok()
    }
}

/// What an `ask` node's pause asks a person: the payload of its interrupt, as checkpoints keep
/// it. Told apart from an [`ApprovalRequest`] by its fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The question, as the person reads it.
    pub question: String,
    /// A JSON Schema the answer must match (a small form); `None`: free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub form: Option<Value>,
}

impl Question {
    /// The question of an interrupt payload; `None` for another payload.
    pub fn of(payload: &Value) -> Option<Self> {
        // Read in place: a payload is not copied to be tried.
        Self::deserialize(payload).ok()
    }
}

/// An agent's state: the message log (append) and the values injected into tools
/// (replace), plus the read-failure count of the current turn (replace).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// Every message of the conversation, oldest first.
    pub messages: Vec<Message>,
    /// State values for injected tool arguments (e.g. `asignatura`).
    #[serde(default)]
    pub context: Map<String, Value>,
    /// Rounds of failing read tools in the current turn.
    #[serde(default)]
    pub tool_failures: u32,
    /// The write calls a person approved that `execute` has yet to run (call ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<String>,
    /// The arguments a person edited, by call id, that `execute` runs those calls with.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub edited: Map<String, Value>,
    /// The channels a declared graph adds (docs/agents.md), by name.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub channels: Map<String, Value>,
}

/// A partial update of [`AgentState`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentUpdate {
    /// Messages to append.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    /// New context, replacing the old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// Context values set over the (possibly replaced) context, keeping its other keys — e.g.
    /// who is asking, which a service re-asserts on every turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_set: Option<Map<String, Value>>,
    /// New failure count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_failures: Option<u32>,
    /// New approved calls, replacing the old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<Vec<String>>,
    /// New edited arguments, replacing the old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited: Option<Map<String, Value>>,
    /// Writes to a declared graph's channels, in order, each with its reducer (kept in the
    /// update, so a stored step replays the same whatever the declaration says later).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<ChannelWrite>,
}

/// How a write combines with a channel's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reducer {
    /// The new value replaces the old.
    #[default]
    Replace,
    /// The value is added to the channel's list (a list's items are each added; a channel
    /// that holds no list starts one).
    Append,
    /// An object's keys are set over the channel's object (another value replaces it).
    Merge,
}

/// One write to a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelWrite {
    /// The channel.
    pub channel: String,
    /// How the value combines with what the channel holds.
    pub reducer: Reducer,
    /// The value.
    pub value: Value,
}

impl ChannelWrite {
    /// The writes that put `value` into `channel` of `channels` by `reducer`: a channel that
    /// holds nothing yet starts from its `default`, so `append` and `merge` add to it.
    pub fn of(
        channels: &Map<String, Value>,
        channel: String,
        reducer: Reducer,
        default: Option<&Value>,
        value: Value,
    ) -> Vec<Self> {
        let mut out = Vec::with_capacity(2);
        if reducer != Reducer::Replace
            && !channels.contains_key(&channel)
            && let Some(default) = default
        {
            out.push(Self { channel: channel.clone(), reducer: Reducer::Replace, value: default.clone() });
        }
        out.push(Self { channel, reducer, value });
        out
    }
}

impl Reducer {
    /// Combines `value` into channel `name` of `channels`.
    pub fn apply(self, channels: &mut Map<String, Value>, name: String, value: Value) {
        use serde_json::map::Entry;
        let slot = match channels.entry(name) {
            Entry::Occupied(slot) => slot.into_mut(),
            Entry::Vacant(slot) => {
                slot.insert(match (self, value) {
                    (Self::Append, Value::Array(items)) => Value::Array(items),
                    (Self::Append, one) => Value::Array(vec![one]),
                    (_, value) => value,
                });
                return;
            }
        };
        match (self, slot, value) {
            (Self::Append, Value::Array(items), Value::Array(more)) => items.extend(more),
            (Self::Append, Value::Array(items), one) => items.push(one),
            (Self::Append, slot, Value::Array(items)) => *slot = Value::Array(items),
            (Self::Append, slot, one) => *slot = Value::Array(vec![one]),
            (Self::Merge, Value::Object(old), Value::Object(new)) => old.extend(new),
            (_, slot, value) => *slot = value,
        }
    }
}

impl State for AgentState {
    type Update = AgentUpdate;
    fn apply(&mut self, u: AgentUpdate) {
        self.messages.extend(u.messages);
        if let Some(c) = u.context {
            self.context = c;
        }
        if let Some(set) = u.context_set {
            self.context.extend(set);
        }
        if let Some(f) = u.tool_failures {
            self.tool_failures = f;
        }
        if let Some(e) = u.edited {
            self.edited = e;
        }
        if let Some(a) = u.approved {
            self.approved = a;
        }
        for w in u.channels {
            w.reducer.apply(&mut self.channels, w.channel, w.value);
        }
    }
}

impl AgentState {
    /// The person's last message, if there is one.
    pub fn last_user_message(&self) -> Option<&str> {
        self.messages.iter().rev().find(|m| matches!(m, Message::User { .. })).map(Message::content)
    }

    /// The person's latest `n` messages, oldest first.
    pub fn recent_user_messages(&self, n: usize) -> Vec<&str> {
        let mut recent: Vec<&str> = self
            .messages
            .iter()
            .rev()
            .filter(|m| matches!(m, Message::User { .. }))
            .take(n)
            .map(Message::content)
            .collect();
        recent.reverse();
        recent
    }

    /// The `error` of the latest tool message that reports one (docs/tools.md).
    pub fn last_tool_error(&self) -> Option<String> {
        self.messages.iter().rev().find_map(|m| match m {
            Message::Tool { content, .. } => serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned)),
            _ => None,
        })
    }

    /// The text of the last assistant message, if the conversation ends with one.
    pub fn last_reply(&self) -> Option<&str> {
        match self.messages.last() {
            Some(Message::Assistant { content, tool_calls }) if tool_calls.is_empty() => Some(content),
            _ => None,
        }
    }
}

/// The input of a user turn: the message, and context values when given (they replace the
/// previous ones); the failure count restarts.
pub fn user_turn(text: impl Into<String>, context: Option<Map<String, Value>>) -> AgentUpdate {
    AgentUpdate { messages: vec![Message::user(text)], context, tool_failures: Some(0), ..Default::default() }
}

/// The tool message of a call whose turn was cut short (the service stopped, or the run
/// failed) before its result was recorded.
pub const INTERRUPTED_CALL: &str =
    "The turn was interrupted before this call's result was recorded; it may not have been carried out.";

/// The reply that closes a turn cut short by a stop of the service.
pub const INTERRUPTED_REPLY: &str = "This turn was stopped before it finished (the service stopped, or the \
run was cancelled), so it has no answer. Please ask again.";

/// The state of a turn whose run stopped mid-way, made whole: each call without a result gets
/// one saying so (its outcome is unknown, and it is never run again), so the model never sees
/// an unanswered call. A turn whose process died, or that was cancelled, also ends with
/// [`INTERRUPTED_REPLY`], so the history says what happened; a failed one's client was sent
/// the error instead.
pub(crate) fn recover(s: &AgentState, cause: StopCause) -> Option<AgentUpdate> {
    let interrupted = ToolOutcome::Failure(ToolError::unavailable(INTERRUPTED_CALL));
    let mut messages: Vec<Message> = pending_calls(s).iter().map(|c| tool_message(c, &interrupted)).collect();
    if cause == StopCause::Died {
        messages.push(Message::assistant(INTERRUPTED_REPLY));
    }
    if messages.is_empty() {
        return None;
    }
    Some(AgentUpdate { messages, tool_failures: Some(0), approved: Some(Vec::new()), ..Default::default() })
}

/// Tool calls of the last assistant message that have no tool message yet.
pub(crate) fn pending_calls(s: &AgentState) -> Vec<ToolCall> {
    let Some(pos) = s.messages.iter().rposition(|m| matches!(m, Message::Assistant { .. })) else {
        return Vec::new();
    };
    let Message::Assistant { tool_calls, .. } = &s.messages[pos] else {
        return Vec::new();
    };
    let answered: Vec<&str> = s.messages[pos + 1..]
        .iter()
        .filter_map(|m| if let Message::Tool { tool_call_id, .. } = m { Some(tool_call_id.as_str()) } else { None })
        .collect();
    tool_calls.iter().filter(|c| !answered.contains(&c.id.as_str())).cloned().collect()
}

#[cfg(test)]
mod context_tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn each_reducer_combines_a_write_its_own_way() {
        let mut state = AgentState::default();
        let write = |channel: &str, reducer, value| ChannelWrite { channel: channel.into(), reducer, value };
        state.apply(AgentUpdate {
            channels: vec![
                write("seen", Reducer::Append, json!("a")),
                write("seen", Reducer::Append, json!(["b", "c"])),
                write("facts", Reducer::Merge, json!({"room": "A1"})),
                write("facts", Reducer::Merge, json!({"day": "lunes", "room": "B2"})),
                write("topic", Reducer::Replace, json!("exam")),
                write("topic", Reducer::Replace, json!("grades")),
            ],
            ..Default::default()
        });
        assert_eq!(
            Value::Object(state.channels.clone()),
            json!({"seen": ["a", "b", "c"], "facts": {"room": "B2", "day": "lunes"}, "topic": "grades"})
        );
        // Merging a non-object replaces; appending to what is not a list starts a list.
        state.apply(AgentUpdate {
            channels: vec![write("facts", Reducer::Merge, json!(3)), write("topic", Reducer::Append, json!("x"))],
            ..Default::default()
        });
        assert_eq!((&state.channels["facts"], &state.channels["topic"]), (&json!(3), &json!(["x"])));
    }

    #[test]
    fn set_values_join_a_kept_or_replaced_context() {
        let mut state = AgentState { context: map(json!({"asignatura": "iv"})), ..Default::default() };
        // A continuing turn: the stored context stays, the service's values join it.
        state.apply(AgentUpdate { context_set: Some(map(json!({"tenantId": 1}))), ..Default::default() });
        assert_eq!(Value::Object(state.context.clone()), json!({"asignatura": "iv", "tenantId": 1}));
        // New context replaces the old first; the set values win over the client's.
        state.apply(AgentUpdate {
            context: Some(map(json!({"tema": 2, "tenantId": 99}))),
            context_set: Some(map(json!({"tenantId": 1}))),
            ..Default::default()
        });
        assert_eq!(Value::Object(state.context), json!({"tema": 2, "tenantId": 1}));
    }
}
