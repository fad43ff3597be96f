//! [`Frame`]: the typed frames of a chat run's SSE stream, each an event name and JSON data.
//! Owns the wire form of every frame (docs/service.md): the names, the camelCase fields, and
//! which frames end a stream; nothing else in the workspace spells them.

use crate::ids::{ConversationId, MessageId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One frame of a chat run's stream.
///
/// The academy contract's clients get only `token`, `tool_call` and `tool_result` (the
/// `toolEvents` extension), `pending`, `done` and `error`; a run asked for its nodes' events
/// (LangGraph's `debug`, `tasks`, `checkpoints` and `custom` stream modes) also holds
/// `node_started`, `node_finished` and `custom`; `state_update` is named for the streams to come
/// and is not emitted yet.
///
/// It serializes as its SSE data, the JSON the wire carries ([`Frame::data`]); the event name
/// is [`Frame::event`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum Frame {
    /// `token`: a piece of the reply, `{"content"}`.
    Token {
        /// The text.
        content: String,
    },
    /// `tool_call`: the model called a tool, `{"callId", "name", "arguments"}`.
    ToolCall {
        /// The call's id.
        call_id: String,
        /// The tool.
        name: String,
        /// Its arguments.
        arguments: Value,
    },
    /// `tool_result`: a call's outcome, `{"callId", "name", "ok", "outcome"}`.
    ToolResult {
        /// The call's id.
        call_id: String,
        /// The tool.
        name: String,
        /// Whether it succeeded.
        ok: bool,
        /// The outcome as the model sees it.
        outcome: Value,
    },
    /// `pending`: a write action waits for the user's decision.
    Pending(PendingAction),
    /// `done`: the turn ended, `{"conversationId", "messageId"}` (the reply's message, or the
    /// first pending action's).
    Done {
        /// The conversation.
        conversation_id: ConversationId,
        /// The message the turn ended on.
        message_id: MessageId,
    },
    /// `error`: the turn failed, `{"message"}`.
    Error {
        /// What went wrong, for the user.
        message: String,
    },
    /// `node_started`: a graph node began, `{"node", "step", "from"}`.
    NodeStarted {
        /// The node.
        node: String,
        /// Its step in the run, from 1.
        step: u32,
        /// The checkpoint it starts from (its number in the thread): the run's input, or the
        /// step before.
        from: u64,
    },
    /// `node_finished`: a graph node finished and its checkpoint was written,
    /// `{"node", "step", "checkpoint", "next"}`.
    NodeFinished {
        /// The node.
        node: String,
        /// Its step in the run, from 1.
        step: u32,
        /// The checkpoint it wrote (its number in the thread).
        checkpoint: u64,
        /// The node that runs next (`null`: the run ends, or pauses with nothing left).
        next: Option<String>,
    },
    /// `state_update`: a node wrote values of the run's state besides its messages — a
    /// declared graph's channels — `{"node", "checkpoint", "writes"}`: the checkpoint it wrote
    /// and each channel with the value it wrote there last (for the doors that stream each
    /// node's update; what a channel holds after it is the checkpoint's).
    StateUpdate {
        /// The node.
        node: String,
        /// The checkpoint it wrote (its number in the thread).
        checkpoint: u64,
        /// Channel → the value written.
        writes: Value,
    },
    /// `custom`: data a node streams of its own, `{"name", "data"}` (`name`: the node).
    Custom {
        /// What the node calls it.
        name: String,
        /// Its data.
        data: Value,
    },
}

/// A pending write action as the contract shows it, in a `pending` frame and in confirm
/// answers: `{"messageId", "toolName", "description", "arguments"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PendingAction {
    /// The message that holds it; a confirm names it.
    pub message_id: MessageId,
    /// The tool that would run.
    pub tool_name: String,
    /// What it would do, for the user.
    pub description: String,
    /// The arguments it would run with.
    pub arguments: Value,
}

/// Every event name a [`Frame`] has, in the order of its variants.
pub const EVENTS: [&str; 10] = [
    "token",
    "tool_call",
    "tool_result",
    "pending",
    "done",
    "error",
    "node_started",
    "node_finished",
    "state_update",
    "custom",
];

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The event name is none of [`EVENTS`].
    #[error("unknown event `{name}`")]
    UnknownEvent {
        /// The name read.
        name: String,
    },
    /// The data is not the JSON its event carries.
    #[error("the data of a `{event}` frame is not its JSON: {source}")]
    Data {
        /// The event.
        event: &'static str,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
}

/// Whether an event of this name ends a run's stream (`done`, `error`): nothing follows it.
/// For stores that hold frames as (name, data); agrees with [`Frame::is_terminal`].
pub fn is_terminal_event(name: &str) -> bool {
    matches!(name, "done" | "error")
}

impl Frame {
    /// The SSE event name, one of [`EVENTS`].
    pub fn event(&self) -> &'static str {
        match self {
            Self::Token { .. } => "token",
            Self::ToolCall { .. } => "tool_call",
            Self::ToolResult { .. } => "tool_result",
            Self::Pending(_) => "pending",
            Self::Done { .. } => "done",
            Self::Error { .. } => "error",
            Self::NodeStarted { .. } => "node_started",
            Self::NodeFinished { .. } => "node_finished",
            Self::StateUpdate { .. } => "state_update",
            Self::Custom { .. } => "custom",
        }
    }

    /// The SSE data: the frame's JSON, as the wire has it.
    pub fn data(&self) -> String {
        // Every field is a string, a number, a bool or a `Value`: nothing JSON cannot hold.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether the frame ends the run's stream (`done`, `error`).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Done { .. } | Self::Error { .. })
    }

    /// The frame an SSE event carries.
    ///
    /// # Errors
    /// [`FrameError::UnknownEvent`] for a name none of [`EVENTS`] has (a client that meets a
    /// newer server's frame may skip it); [`FrameError::Data`] when `data` is not that event's
    /// JSON.
    pub fn parse(event: &str, data: &str) -> Result<Frame, FrameError> {
        let Some(event) = EVENTS.iter().copied().find(|e| *e == event) else {
            return Err(FrameError::UnknownEvent { name: event.to_owned() });
        };
        let bad = |source| FrameError::Data { event, source };
        // A run streams one `token` frame per token: read straight from its data.
        if event == "token" {
            let TokenData { content } = serde_json::from_str(data).map_err(bad)?;
            return Ok(Frame::Token { content });
        }
        // Read as the adjacently tagged text `{"event": …, "data": …}`, the tag first, so serde
        // reads the data straight into the variant (a run streams one frame per token: going
        // through a `Value` cost more than the rest of the frame). `event` is one of `EVENTS`,
        // which need no escaping; data that is not one JSON value leaves the text invalid.
        let tagged = format!(r#"{{"event":"{event}","data":{data}}}"#);
        let mut reader = serde_json::Deserializer::from_str(&tagged);
        let frame = Tagged::deserialize(&mut reader).map_err(bad)?;
        reader.end().map_err(bad)?;
        Ok(frame)
    }
}

/// A `token` frame's data, as [`Tagged`] reads it.
#[derive(Deserialize)]
struct TokenData {
    content: String,
}

/// How [`Frame::parse`] reads a frame: serde's adjacent tagging picks the variant by its event
/// name. The same variants and fields as [`Frame`] (the derive does not compile if a field
/// differs; the round-trip tests fail if a variant is missing).
#[derive(Deserialize)]
#[serde(remote = "Frame", tag = "event", content = "data", rename_all = "snake_case", rename_all_fields = "camelCase")]
enum Tagged {
    Token { content: String },
    ToolCall { call_id: String, name: String, arguments: Value },
    ToolResult { call_id: String, name: String, ok: bool, outcome: Value },
    Pending(PendingAction),
    Done { conversation_id: ConversationId, message_id: MessageId },
    Error { message: String },
    NodeStarted { node: String, step: u32, from: u64 },
    NodeFinished { node: String, step: u32, checkpoint: u64, next: Option<String> },
    StateUpdate { node: String, checkpoint: u64, writes: Value },
    Custom { name: String, data: Value },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// One frame of every kind.
    fn every_kind() -> Vec<Frame> {
        vec![
            Frame::Token { content: "Hola, ¿qué tal? 🎉".into() },
            Frame::ToolCall { call_id: "c1".into(), name: "calculator".into(), arguments: json!({"expr": "1+1"}) },
            Frame::ToolResult { call_id: "c1".into(), name: "calculator".into(), ok: true, outcome: json!(2) },
            Frame::Pending(PendingAction {
                message_id: MessageId(7),
                tool_name: "send_sms".into(),
                description: "Send \"hi\" to Ana".into(),
                arguments: json!({"to": "Ana", "text": "hi"}),
            }),
            Frame::Done { conversation_id: ConversationId(3), message_id: MessageId(9) },
            Frame::Error { message: "the model is unreachable".into() },
            Frame::NodeStarted { node: "agent".into(), step: 1, from: 4 },
            Frame::NodeFinished { node: "tools".into(), step: 2, checkpoint: 5, next: Some("agent".into()) },
            Frame::StateUpdate { node: "which_app".into(), checkpoint: 4, writes: json!({"app": "web"}) },
            Frame::Custom { name: "progress".into(), data: json!({"pct": 50}) },
        ]
    }

    #[test]
    fn every_kind_reads_back_as_itself() {
        for frame in every_kind() {
            assert_eq!(Frame::parse(frame.event(), &frame.data()).unwrap(), frame, "{}", frame.event());
        }
    }

    #[test]
    fn every_event_name_is_one_kind() {
        let names: Vec<&str> = every_kind().iter().map(Frame::event).collect();
        assert_eq!(names, EVENTS);
    }

    #[test]
    fn the_contract_frames_keep_their_wire_form() {
        let wire = |f: Frame| (f.event(), f.data());
        assert_eq!(wire(Frame::Token { content: "é".into() }), ("token", r#"{"content":"é"}"#.into()));
        assert_eq!(
            wire(Frame::ToolCall { call_id: "c1".into(), name: "notes".into(), arguments: json!({"a": 1}) }),
            ("tool_call", r#"{"callId":"c1","name":"notes","arguments":{"a":1}}"#.into())
        );
        assert_eq!(
            wire(Frame::ToolResult { call_id: "c1".into(), name: "notes".into(), ok: false, outcome: json!("x") }),
            ("tool_result", r#"{"callId":"c1","name":"notes","ok":false,"outcome":"x"}"#.into())
        );
        let pending = PendingAction {
            message_id: MessageId(4),
            tool_name: "send_sms".into(),
            description: "Send it".into(),
            arguments: json!({"to": "Ana"}),
        };
        assert_eq!(
            wire(Frame::Pending(pending)),
            (
                "pending",
                r#"{"messageId":4,"toolName":"send_sms","description":"Send it","arguments":{"to":"Ana"}}"#.into()
            )
        );
        assert_eq!(
            wire(Frame::Done { conversation_id: ConversationId(1), message_id: MessageId(2) }),
            ("done", r#"{"conversationId":1,"messageId":2}"#.into())
        );
        assert_eq!(wire(Frame::Error { message: "boom".into() }), ("error", r#"{"message":"boom"}"#.into()));
        // A run's last node: nothing runs next, written as null (and read back as `None`).
        let last = Frame::NodeFinished { node: "agent".into(), step: 3, checkpoint: 6, next: None };
        assert_eq!(
            wire(last.clone()),
            ("node_finished", r#"{"node":"agent","step":3,"checkpoint":6,"next":null}"#.into())
        );
        assert_eq!(Frame::parse("node_finished", &last.data()).unwrap(), last);
    }

    #[test]
    fn done_and_error_end_a_stream() {
        for frame in every_kind() {
            assert_eq!(frame.is_terminal(), matches!(frame.event(), "done" | "error"), "{}", frame.event());
            assert_eq!(is_terminal_event(frame.event()), frame.is_terminal(), "{}", frame.event());
        }
        assert!(!is_terminal_event("message"));
    }

    #[test]
    fn an_unknown_event_is_named() {
        let err = Frame::parse("progress_bar", "{}").unwrap_err();
        assert!(matches!(&err, FrameError::UnknownEvent { name } if name == "progress_bar"));
        assert_eq!(err.to_string(), "unknown event `progress_bar`");
    }

    #[test]
    fn data_that_is_not_the_event_s_json_is_an_error() {
        // Also text that would close the frame early and add to it: no frame of two data.
        for (event, data) in [
            ("token", "not json"),
            ("token", ""),
            ("token", r#"{"content":"a"}}"#),
            ("token", r#"{"content":"a"},"data":{"content":"b"}"#),
            ("token", r#"{"content":"a"},"event":"error""#),
            ("done", r#"{"conversationId":1}"#),
            ("error", "[]"),
        ] {
            let err = Frame::parse(event, data).unwrap_err();
            assert!(matches!(err, FrameError::Data { event: e, .. } if e == event), "{event}: {err}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let frame = Frame::parse("token", r#"{"content":"a","extra":1}"#).unwrap();
        assert_eq!(frame, Frame::Token { content: "a".into() });
    }
}
