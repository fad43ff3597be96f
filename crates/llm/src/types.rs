//! Provider-neutral conversation types; wire formats convert from and to these.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions for the model.
    System {
        /// The text.
        content: String,
    },
    /// What the person said.
    User {
        /// The text.
        content: String,
    },
    /// What the model said: text, tool calls, or both.
    Assistant {
        /// The text (may be empty when the model only called tools).
        #[serde(default)]
        content: String,
        /// Tool calls the model made.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The outcome of one tool call, fed back to the model.
    Tool {
        /// The id of the call this answers.
        tool_call_id: String,
        /// The tool's name.
        name: String,
        /// The outcome as text (JSON for structured outcomes).
        content: String,
    },
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::System { content: content.into() }
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::User { content: content.into() }
    }
    /// An assistant text message without tool calls.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant { content: content.into(), tool_calls: Vec::new() }
    }
    /// A tool result message.
    pub fn tool(tool_call_id: impl Into<String>, name: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool { tool_call_id: tool_call_id.into(), name: name.into(), content: content.into() }
    }
    /// The text of the message.
    pub fn content(&self) -> &str {
        match self {
            Self::System { content }
            | Self::User { content }
            | Self::Assistant { content, .. }
            | Self::Tool { content, .. } => content,
        }
    }
}

/// A complete tool call made by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call (generated when a provider sends none).
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The arguments exactly as the model wrote them (JSON text, possibly invalid).
    pub arguments: String,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments, as generated; the client normalises it per provider.
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool call.
    None,
    /// At least one tool call.
    Required,
    /// This tool.
    Tool(String),
    /// The model decides, among these of the offered tools only (or none). A local model
    /// keeps every offered tool in its prompt, so the prompt's computed prefix stays valid
    /// while the choice narrows, and is kept from calling the others; a server is sent only
    /// these (OpenAI-compatible servers do not all know OpenAI's `allowed_tools`).
    Allowed(Vec<String>),
}

impl ChatRequest {
    /// Whether the reply must be a tool call ([`ToolChoice::Required`] or [`ToolChoice::Tool`]).
    pub fn call_required(&self) -> bool {
        matches!(self.tool_choice, Some(ToolChoice::Required | ToolChoice::Tool(_)))
    }

    /// The tools the model may call: the offered ones, narrowed by [`ToolChoice::Allowed`] or
    /// [`ToolChoice::Tool`], none for [`ToolChoice::None`].
    pub fn callable_tools(&self) -> Vec<&ToolDefinition> {
        match &self.tool_choice {
            Some(ToolChoice::None) => Vec::new(),
            Some(ToolChoice::Allowed(names)) => self.tools.iter().filter(|t| names.contains(&t.name)).collect(),
            Some(ToolChoice::Tool(name)) => self.tools.iter().filter(|t| &t.name == name).collect(),
            _ => self.tools.iter().collect(),
        }
    }
}

/// Shape of the reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching a schema (structured output).
    JsonSchema {
        /// Name of the schema (`^[a-zA-Z0-9_-]{1,64}$`).
        name: String,
        /// The schema, as generated; normalised per provider.
        schema: Value,
        /// Ask the provider to enforce it exactly (OpenAI strict mode).
        strict: bool,
    },
}

/// One request to a chat model.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<ToolDefinition>,
    /// Tool choice; `None` leaves the provider default (auto when tools are given).
    pub tool_choice: Option<ToolChoice>,
    /// Reply shape; `None` is free text.
    pub response_format: Option<ResponseFormat>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Upper bound on generated tokens.
    pub max_tokens: Option<u32>,
    /// Stop sequences.
    pub stop: Vec<String>,
}

impl ChatRequest {
    /// A request with these messages and defaults elsewhere.
    pub fn new(messages: Vec<Message>) -> Self {
        Self { messages, ..Self::default() }
    }
    /// Offers tools.
    #[must_use]
    pub fn with_tools(mut self, tools: Vec<ToolDefinition>) -> Self {
        self.tools = tools;
        self
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// The token limit.
    Length,
    /// The model called tools.
    ToolCalls,
    /// The provider filtered the reply.
    ContentFilter,
    /// Anything else a provider reports.
    Other(String),
}

impl FinishReason {
    pub(crate) fn from_wire(s: &str) -> Self {
        match s {
            "stop" | "eos" | "end_turn" => Self::Stop,
            "length" | "max_tokens" => Self::Length,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Of the prompt tokens, those a cache of computed prompts already held (OpenAI's
    /// `prompt_tokens_details.cached_tokens`; 0 when not reported).
    #[serde(default)]
    pub cached_prompt_tokens: u32,
}

/// One event of a streamed reply, in order: deltas, then the assembled [`ChatEvent::ToolCall`]s,
/// then [`ChatEvent::Usage`] (when reported), then exactly one [`ChatEvent::Finished`].
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// A piece of reply text.
    TextDelta(String),
    /// A piece of a tool call as it streams (for live UIs).
    ToolCallDelta {
        /// Position of the call in this reply.
        index: usize,
        /// The call id, on the first delta of a call.
        id: Option<String>,
        /// The tool name, on the first delta of a call.
        name: Option<String>,
        /// A fragment of the argument text.
        arguments: String,
    },
    /// A complete tool call.
    ToolCall(ToolCall),
    /// Token usage.
    Usage(Usage),
    /// The reply ended.
    Finished(FinishReason),
}

/// A whole reply, collected.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The text.
    pub content: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Token usage, when the provider reported it.
    pub usage: Option<Usage>,
}
