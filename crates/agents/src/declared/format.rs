//! The file format of a declared graph (docs/agents.md): what a `graph_file` holds, as serde
//! reads it. Whether it makes sense — names that exist, fields a kind uses, a way out of
//! every node — is [`check`](super::check)'s job.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub use crate::kit::Reducer;

/// A declared graph: its channels, its nodes and where a turn starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphFile {
    /// What the graph is for, shown by `agents check`.
    #[serde(default)]
    pub description: Option<String>,
    /// The node a turn starts at.
    pub start: String,
    /// The channels the graph keeps besides the conversation (`messages`) and the turn's
    /// context (`context`), which every graph has.
    #[serde(default)]
    pub channels: BTreeMap<String, ChannelDecl>,
    /// The nodes, by name.
    pub nodes: BTreeMap<String, NodeDecl>,
}

/// `[channels.NAME]`: a value the graph keeps across steps and turns.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelDecl {
    /// How a node's write combines with the value. Default: `replace`.
    #[serde(default)]
    pub reducer: Reducer,
    /// The value before anything is written. Default: none (templates read it as empty).
    #[serde(default)]
    pub default: Option<Value>,
    /// Whether a client may write it between turns (a state update, docs/langgraph.md "State
    /// updates"), by the same reducer. Default: no — a channel is the graph's own unless its
    /// declaration says a person may set it (a classifier's label or a safety verdict must
    /// stay what the graph wrote).
    #[serde(default)]
    pub writable: bool,
}

/// What a node does.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum NodeKind {
    /// A model call: a reply (streamed), tool calls, or a structured output into a channel.
    Model,
    /// Runs the tool calls of the last model message: reads at once, writes after approval.
    Tools,
    /// Calls one named tool itself, with templated arguments.
    Tool,
    /// Searches a knowledge base (a search tool) into a channel.
    Retrieve,
    /// Checks a text against the passages found — each sentence cited to the passage that
    /// holds it, what none holds dropped — and replies with what stands.
    Cite,
    /// A fixed, templated reply.
    Reply,
    /// Only routes.
    Route,
    /// Pauses to ask the person a question (or a small form); their answer goes into a channel.
    Ask,
    /// Hands the turn to another declared agent, whose nodes run as a sub-graph.
    Agent,
    /// A kind the program registered ([`NodeKinds`](super::NodeKinds)), by its name.
    Custom(String),
}

impl From<String> for NodeKind {
    fn from(name: String) -> Self {
        match name.as_str() {
            "model" => Self::Model,
            "tools" => Self::Tools,
            "tool" => Self::Tool,
            "retrieve" => Self::Retrieve,
            "cite" => Self::Cite,
            "reply" => Self::Reply,
            "route" => Self::Route,
            "ask" => Self::Ask,
            "agent" => Self::Agent,
            _ => Self::Custom(name),
        }
    }
}

impl NodeKind {
    /// The built-in kinds' names.
    pub const BUILT_IN: [&'static str; 9] =
        ["model", "tools", "tool", "retrieve", "cite", "reply", "route", "ask", "agent"];

    /// The kind's name in the file.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Model => "model",
            Self::Tools => "tools",
            Self::Tool => "tool",
            Self::Retrieve => "retrieve",
            Self::Cite => "cite",
            Self::Reply => "reply",
            Self::Route => "route",
            Self::Ask => "ask",
            Self::Agent => "agent",
            Self::Custom(name) => name,
        }
    }
}

/// `[nodes.NAME]`: one node. Which fields a kind uses is in docs/agents.md; a field its kind
/// does not use is an error, not ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDecl {
    /// What the node does.
    pub kind: NodeKind,
    /// The node that runs next (or `END`). Default: `END`.
    #[serde(default)]
    pub next: Option<String>,
    /// Where to go next, decided on the state (instead of `next`).
    #[serde(default)]
    pub route: Option<RouteDecl>,
    /// `model`: the system prompt, a template (default: the agent's `system_prompt`).
    #[serde(default)]
    pub prompt: Option<String>,
    /// `model`: the tools it may call (default: the agent's tools; `[]`: none).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// `model`: the model name, over the agent's.
    #[serde(default)]
    pub model: Option<String>,
    /// `model`: sampling temperature, over the agent's.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// `model`: most tokens it may generate, over the agent's.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `model`: whether it must call a tool before it answers (default: `auto`).
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceDecl>,
    /// `model`: what the model reads of the conversation (default: `window`).
    #[serde(default)]
    pub history: Option<History>,
    /// `model`: write a structured answer into a channel instead of replying.
    #[serde(default)]
    pub output: Option<OutputDecl>,
    /// `model`: the one message it sends instead of the conversation, a template (a screen or
    /// classifier over text the graph composes, e.g. `{{recent_user_messages}}`).
    #[serde(default)]
    pub message: Option<String>,
    /// `model`: the reply, a template, when the model fails or says nothing — the turn does not
    /// fail (what a person must always get). Only on a node that calls no tools.
    #[serde(default)]
    pub fallback: Option<String>,
    /// `model`: text the reply must mention one of, and what is appended when it mentions none.
    /// Only on a node that calls no tools.
    #[serde(default)]
    pub must_mention: Option<MustMentionDecl>,
    /// `model`: check the reply against this turn's search results — each sentence cited to
    /// the passage that holds it, a sentence stating what no source holds dropped, and a reply
    /// that stands on nothing replaced by "cannot find it in the documents" in the person's
    /// language (docs/retrieval.md, "Grounded answers"). Default: false.
    #[serde(default)]
    pub cite: Option<bool>,
    /// `model`: a reply in words before any of its tools has returned in this turn is stopped
    /// at its first words and discarded (a greeting, thanks or farewell aside), and the route's
    /// `otherwise` runs instead — e.g. a search, so that answers come from the documents while
    /// requests the model meets with a tool call go on as calls. Default: false.
    #[serde(default)]
    pub reply_needs_tools: Option<bool>,
    /// `tools`: where to go once read tools failed more than `max_failures` times in the turn
    /// (default: `END` after a reply that says so).
    #[serde(default)]
    pub give_up: Option<String>,
    /// `tools`: rounds of failing read tools allowed per turn (default: the agent's
    /// `max_tool_retries`).
    #[serde(default)]
    pub max_failures: Option<u32>,
    /// `tool`: the tool it calls; `retrieve`: the search tool (default: `rag_search`).
    #[serde(default)]
    pub tool: Option<String>,
    /// `tool`: its arguments; string values are templates.
    #[serde(default)]
    pub arguments: Option<Map<String, Value>>,
    /// `tool`: a failure of the tool is written to the channel and the graph goes on, instead
    /// of failing the turn. Default: false.
    #[serde(default)]
    pub never_fail: Option<bool>,
    /// `tool`, `retrieve`: the channel its result is written to; `ask`: the channel the answer
    /// is written to; `agent`: the channel the other agent's reply is also written to; `cite`:
    /// the channel its report is written to (`{cited, backed, dropped, abstained}`).
    #[serde(default)]
    pub channel: Option<String>,
    /// `retrieve`: the search query, a template (default: `{{last_user_message}}`).
    #[serde(default)]
    pub query: Option<String>,
    /// `retrieve`: how many passages (default: 5).
    #[serde(default)]
    pub top_k: Option<u32>,
    /// `retrieve`: search nothing when the person's message is only a greeting, thanks or a
    /// farewell (and write null to a `replace` channel). Default: false.
    #[serde(default)]
    pub skip_small_talk: Option<bool>,
    /// `reply`: the text, a template; `cite`: the text it checks, a template (e.g. a `model`
    /// node's draft, `{{draft}}`).
    #[serde(default)]
    pub text: Option<String>,
    /// `cite`: the channel holding the passages to check against — a search result
    /// (`{results: [{content, metadata: {citation}}]}`, what a `retrieve` node writes) or a list
    /// of them. Default: the search results in the conversation, this turn's first.
    #[serde(default)]
    pub passages: Option<String>,
    /// `ask`: the question, a template.
    #[serde(default)]
    pub question: Option<String>,
    /// `ask`: a JSON Schema the answer must match (a small form); default: free text.
    #[serde(default)]
    pub form: Option<Value>,
    /// `agent`: the agent (`[agents.NAME]` of the configuration) the turn is handed to.
    #[serde(default)]
    pub agent: Option<String>,
    /// `agent`: what the other agent reads of the conversation (default: `conversation`).
    #[serde(default)]
    pub input: Option<Input>,
    /// A kind of the program's own: its settings, as the kind reads them.
    #[serde(default)]
    pub with: Option<Map<String, Value>>,
}

/// Whether a `model` node must call a tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceDecl {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call one of its tools until one has returned in this turn; then it may
    /// answer (a node that must act, such as opening a ticket, on a model that would rather talk).
    Required,
}

/// What a `model` node sends of the conversation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum History {
    /// The latest turns that fit the agent's `history_budget`, tool calls with their results.
    #[default]
    Window,
    /// Only the person's last message.
    LastMessage,
    /// The conversation's words: the person's and the agent's messages that fit the agent's
    /// `history_budget`, without tool calls and their results.
    Spoken,
}

/// `must_mention = { any_of = "…", or_append = "…" }`: what a `model` node's reply must mention.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MustMentionDecl {
    /// A template of one placeholder whose value is a list of strings (or one string): the
    /// reply must contain one of them.
    pub any_of: String,
    /// A template appended to the reply (and streamed) when it contains none of them.
    pub or_append: String,
}

/// What an `agent` node's agent reads of the conversation: its model nodes see the whole
/// conversation (each within its `history`), or only the person's last message and what the
/// turn added since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// The conversation, as its own nodes would read it.
    #[default]
    Conversation,
    /// Only the person's last message (and the turn's steps since).
    LastMessage,
}

/// `output = { channel = "…", schema = {…} }`: a model node's structured answer; without a
/// schema, its reply as text (a draft a `cite` node checks before anyone sees it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputDecl {
    /// The channel the answer is written to.
    pub channel: String,
    /// A JSON Schema the answer must match. `{ enum = ["a", "b"] }` makes a classifier: the
    /// first label the model's answer names is written. None: the reply's text, written as it
    /// is and not streamed; the model reads the conversation as a reply would, this turn's
    /// search results written out before the question.
    #[serde(default)]
    pub schema: Option<Value>,
    /// Written instead when the model fails or its answer does not match the schema (default:
    /// the turn fails on a failed call, and a mismatch writes null). Must match the schema.
    #[serde(default)]
    pub on_failure: Option<Value>,
}

/// `route = { … }`: where a node's run goes next, decided on the state. The first rule that
/// holds decides: `replied`, then `tool_calls`, then `mentioned`, then `on` with `cases`, then
/// `otherwise`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteDecl {
    /// Where to go when the conversation ends with a reply (the turn's answer is written).
    #[serde(default)]
    pub replied: Option<String>,
    /// Where to go when the last model message asks for tools not yet run.
    #[serde(default)]
    pub tool_calls: Option<String>,
    /// Where to go when the person's last message says one of `mentions`.
    #[serde(default)]
    pub mentioned: Option<String>,
    /// Words and phrases looked for in the person's last message, in any case, anywhere (a
    /// keyword gate before a model call).
    #[serde(default)]
    pub mentions: Vec<String>,
    /// A channel whose value picks a case.
    #[serde(default)]
    pub on: Option<String>,
    /// The channel's value (a string as it is, anything else as JSON) → the node.
    #[serde(default)]
    pub cases: BTreeMap<String, String>,
    /// Where to go when no rule holds.
    pub otherwise: String,
}
