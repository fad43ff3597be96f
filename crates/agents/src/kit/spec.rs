//! How an agent is set up ([`AgentSpec`]) and what its nodes run on ([`AgentDeps`]: the model,
//! the settings, the tool definitions), and what a model call is sent: the token-budgeted
//! history window, and the prompt every first turn starts with, computed ahead ([`warm_up`]).

use super::tools::tool_definitions;
use serde_json::{Map, Value};
use std::sync::Arc;
use toolgraph_llm::{ChatModel, ChatRequest, Message, ToolDefinition};
use toolgraph_tools::ToolRegistry;

/// How an agent behaves.
#[derive(Clone)]
pub struct AgentSpec {
    /// Name, for logs.
    pub name: String,
    /// System prompt.
    pub system_prompt: String,
    /// The tools the agent may call.
    pub tools: ToolRegistry,
    /// Rounds of failing read tools allowed per turn before giving up (the academy admin's
    /// `SQL_MAX_RETRIES`). Default: 3.
    pub max_tool_retries: u32,
    /// Approximate token budget of the history sent to the model (0: no limit). Default: 6000.
    pub history_budget: usize,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Most tokens the model may generate per call (`max_tokens`); `None` leaves the model
    /// server's limit. A reply cut there is kept as it is.
    pub max_tokens: Option<u32>,
    /// Text appended to a final answer (streamed and stored with it), from this turn's tool
    /// outputs and the answer — e.g. the sources a search returned that the answer does not
    /// cite. Default: none.
    pub answer_footer: Option<AnswerFooter>,
    /// Text added to the system prompt for the turn's state context (its tenant, user …) —
    /// e.g. the academy admin's tenant schema description, fetched from the backend. Asked before every
    /// model call; `None` adds nothing. Default: none.
    pub prompt_context: Option<PromptContext>,
    /// What the agent remembers of the person (the turn's state context says who), put in a
    /// system message right after the system prompt — `crate::memory::Memory::recall_into_prompt`.
    /// Asked before every model call that reads the conversation, with the person's latest
    /// message; `None` adds nothing. Default: none.
    pub recall: Option<RecallContext>,
    /// Summarise the turns that fall out of the history window (`history_budget`) with a model
    /// call, and give the model the summary, instead of dropping them (docs/memory.md,
    /// "Context that fits"). Default: false.
    pub summarise_history: bool,
    /// Values every tool call of this agent sees in its context, over the turn's state: set by
    /// whoever runs the agent, never by the client — e.g. `kb`, the knowledge base its searches
    /// read. Default: none.
    pub tool_context: Map<String, Value>,
    /// A grounded answer to a question of its own is given only when the documents its search
    /// found (the first passage, or all of them) make the question at least this much more
    /// likely (mean nats per token) than it is without them; below, the reply is that the
    /// documents do not hold the answer.
    /// Judged only with a model that reports a prompt's probabilities (the in-process model);
    /// 0 turns it off (docs/retrieval.md, "Grounded answers"). Default:
    /// [`DEFAULT_MIN_QUESTION_GAIN`](super::grounded::DEFAULT_MIN_QUESTION_GAIN).
    pub min_question_gain: f32,
}

/// See [`AgentSpec::answer_footer`]: `(this turn's tool outputs, answer) → text to append`.
pub type AnswerFooter = Arc<dyn Fn(&[&str], &str) -> Option<String> + Send + Sync>;

/// See [`AgentSpec::prompt_context`]: `(the turn's state context) → text for the system prompt`.
pub type PromptContext =
    Arc<dyn Fn(&Map<String, Value>) -> futures::future::BoxFuture<'static, Option<Arc<str>>> + Send + Sync>;

/// See [`AgentSpec::recall`]: `(the turn's state context, the person's latest message) → the
/// notes for the prompt`.
pub type RecallContext = Arc<
    dyn Fn(&Map<String, Value>, Option<&str>) -> futures::future::BoxFuture<'static, Option<Arc<str>>> + Send + Sync,
>;

impl AgentSpec {
    /// An agent with defaults.
    pub fn new(name: impl Into<String>, system_prompt: impl Into<String>, tools: ToolRegistry) -> Self {
        Self {
            name: name.into(),
            system_prompt: system_prompt.into(),
            tools,
            max_tool_retries: 3,
            history_budget: 6000,
            temperature: None,
            max_tokens: None,
            answer_footer: None,
            prompt_context: None,
            recall: None,
            summarise_history: false,
            tool_context: Map::new(),
            min_question_gain: super::grounded::DEFAULT_MIN_QUESTION_GAIN,
        }
    }
}

/// What an agent's nodes use: the model, the tools, the settings.
pub struct AgentDeps {
    model: Arc<dyn ChatModel>,
    spec: AgentSpec,
    /// What the model is told about the tools, and the registry generation it was read at
    /// (tool sets, such as an MCP server's, change while the agent runs).
    definitions: std::sync::RwLock<(u64, Vec<ToolDefinition>)>,
}

impl AgentDeps {
    /// The dependencies of an agent of `spec` on `model`.
    pub(crate) fn new(spec: AgentSpec, model: Arc<dyn ChatModel>) -> Self {
        let definitions = std::sync::RwLock::new((spec.tools.generation(), tool_definitions(&spec.tools)));
        Self { model, spec, definitions }
    }

    /// The agent's model.
    pub(crate) fn model(&self) -> &Arc<dyn ChatModel> {
        &self.model
    }

    /// The agent's settings.
    pub fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    /// The tool definitions for the next model call, read again when the tools changed.
    pub(crate) fn definitions(&self) -> Vec<ToolDefinition> {
        let generation = self.spec.tools.generation();
        {
            let cached = self.definitions.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if cached.0 == generation {
                return cached.1.clone();
            }
        }
        let fresh = tool_definitions(&self.spec.tools);
        *self.definitions.write().unwrap_or_else(std::sync::PoisonError::into_inner) = (generation, fresh.clone());
        fresh
    }
}

/// The most recent messages that fit `budget` (≈ 4 characters a token), cut only where a
/// user turn begins so a tool call is never separated from its result. The latest user
/// turn is always included.
pub fn history_window(messages: &[Message], budget: usize) -> &[Message] {
    history_window_costing(messages, budget, |_, _| false)
}

/// [`history_window`], where the messages `free` names (by position) cost nothing: the request
/// leaves them out.
pub(crate) fn history_window_costing(
    messages: &[Message],
    budget: usize,
    free: impl Fn(usize, &Message) -> bool,
) -> &[Message] {
    if budget == 0 {
        return messages;
    }
    let mut used = 0usize;
    let mut start = messages.len();
    let mut cut = None;
    for (i, m) in messages.iter().enumerate().rev() {
        if free(i, m) {
            continue;
        }
        used += m.content().len() / 4 + 4;
        if let Message::Assistant { tool_calls, .. } = m {
            used += tool_calls.iter().map(|c| c.arguments.len() / 4 + 8).sum::<usize>();
        }
        if matches!(m, Message::User { .. }) {
            if used > budget && cut.is_some() {
                break;
            }
            cut = Some(i);
            start = i;
        }
        if used > budget && cut.is_some() {
            break;
        }
    }
    &messages[start.min(messages.len())..]
}

/// The words of the conversation within `budget` ([`history_window`]): the person's messages
/// and the assistant's replies, without tool calls and their results — for a model call that
/// calls no tools (a classifier, a reply written from given facts).
pub fn spoken_window(messages: &[Message], budget: usize) -> Vec<Message> {
    history_window(messages, budget)
        .iter()
        .filter(|m| match m {
            Message::User { .. } => true,
            Message::Assistant { content, tool_calls } => tool_calls.is_empty() && !content.is_empty(),
            _ => false,
        })
        .cloned()
        .collect()
}

/// Computes ahead what every first turn of this agent starts with — its system prompt and
/// tool definitions, before a placeholder message — through [`ChatModel::prepare`], so a model
/// that keeps computed prompt state has it ready: a fresh service's first answer does not pay
/// for it.
///
/// # Errors
/// When the model fails.
pub async fn warm_up(deps: &AgentDeps) -> Result<(), toolgraph_llm::LlmError> {
    let mut messages = Vec::with_capacity(2);
    if !deps.spec.system_prompt.is_empty() {
        messages.push(Message::system(deps.spec.system_prompt.clone()));
    }
    messages.push(Message::user("."));
    let mut request = ChatRequest::new(messages).with_tools(deps.definitions());
    request.temperature = deps.spec.temperature;
    deps.model.prepare(request).await
}
