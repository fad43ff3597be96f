//! The prebuilt ReAct agent: a model node and tool nodes, routed by tool class.
//!
//! ```text
//! START → agent ─(tool calls)→ tools ─→ agent … ─(no tool calls)→ END
//!                               │ write tools: pause for approval, resume at `approved`
//!                               │ read failures past `max_tool_retries`: `give_up` → END
//!           approved ─(any approved)→ execute → agent;  (all rejected) → cancellation text → END
//! ```
//! Read tools run at once and concurrently; write tools never run before a person approved
//! them, and a rejected one never runs at all. `approved` only records which calls were
//! approved, so a run that dies before that record leaves them confirmable; `execute` runs
//! them, so a run that dies there leaves each call's outcome unknown and it is never repeated
//! (docs/reliability.md). An unknown tool name becomes a tool message
//! saying so. Model errors end the run as a failure. The model sees a token-budgeted window
//! of the conversation; the checkpoints keep all of it.

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;
use toolgraph_graph::{
    Checkpointer, CompiledGraph, Decision, END, GraphBuildError, InterruptRequest, NodeError, NodeOutput, RunContext,
    RunEvent, START, State, StateGraph, StopCause,
};
use toolgraph_llm::{ChatEvent, ChatModel, ChatRequest, Message, ToolCall, ToolChoice, ToolDefinition};
use toolgraph_tools::{Tool, ToolCallRequest, ToolClass, ToolContext, ToolError, ToolOutcome, ToolRegistry};

/// The nodes of the agent's graph; their names are what [`RunEvent::NodeStarted`] and the
/// checkpoints carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReactNode {
    /// Calls the model (`agent`).
    Model,
    /// Runs read tools, pauses write tools for approval (`tools`).
    Tools,
    /// Records what a person approved (and answers what they rejected) once every decision
    /// is in (`approved`).
    Approved,
    /// Runs the approved write calls (`execute`).
    Execute,
    /// Ends a turn whose read tools kept failing (`give_up`).
    GiveUp,
}

impl ReactNode {
    /// The node's name in the graph.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Model => "agent",
            Self::Tools => "tools",
            Self::Approved => "approved",
            Self::Execute => "execute",
            Self::GiveUp => "give_up",
        }
    }

    /// The node named `name`, if it is one of the agent's.
    pub fn of(name: &str) -> Option<Self> {
        [Self::Model, Self::Tools, Self::Approved, Self::Execute, Self::GiveUp].into_iter().find(|n| n.name() == name)
    }
}

/// What a paused write call asks a person to decide: the payload of each interrupt the agent
/// raises, as checkpoints keep it (the field names are part of the stored format).
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
}

impl ApprovalRequest {
    /// The request of an interrupt payload; `None` for a payload the agent did not write.
    pub fn of(payload: &Value) -> Option<Self> {
        serde_json::from_value(payload.clone()).ok()
    }
}

/// The agent's state: the message log (append) and the values injected into tools
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
        if let Some(a) = u.approved {
            self.approved = a;
        }
    }
}

impl AgentState {
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
    /// Values every tool call of this agent sees in its context, over the turn's state: set by
    /// whoever runs the agent, never by the client — e.g. `kb`, the knowledge base its searches
    /// read. Default: none.
    pub tool_context: Map<String, Value>,
}

/// See [`AgentSpec::answer_footer`]: `(this turn's tool outputs, answer) → text to append`.
pub type AnswerFooter = Arc<dyn Fn(&[&str], &str) -> Option<String> + Send + Sync>;

/// See [`AgentSpec::prompt_context`]: `(the turn's state context) → text for the system prompt`.
pub type PromptContext =
    Arc<dyn Fn(&Map<String, Value>) -> futures::future::BoxFuture<'static, Option<Arc<str>>> + Send + Sync>;

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
            tool_context: Map::new(),
        }
    }
}

/// What the agent's nodes use: the model, the tools, the settings.
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
    fn definitions(&self) -> Vec<ToolDefinition> {
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

/// Most read-tool calls of one step that run at the same time; the rest wait their turn.
pub const MAX_PARALLEL_TOOL_CALLS: usize = 4;

/// The tool message of a rejected write action, and the reply that ends a turn whose
/// every action was rejected: fixed texts, no model call (docs/service.md).
pub const REJECTED_OUTCOME: &str = "The user rejected this action; it was not executed.";

/// The tool message of a call whose turn was cut short (the service stopped, or the run
/// failed) before its result was recorded.
pub const INTERRUPTED_CALL: &str =
    "The turn was interrupted before this call's result was recorded; it may not have been carried out.";

/// The reply that closes a turn cut short by a stop of the service.
pub const INTERRUPTED_REPLY: &str = "This turn was interrupted before it finished (the service stopped), so \
it has no answer. Please ask again.";

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

/// The reply of a turn in which every pending action was rejected.
pub fn cancellation_text(descriptions: &[String]) -> String {
    format!("Cancelled, nothing was changed: {}.", descriptions.join("; "))
}

/// What the model is told about `tools`: name, description and argument schema of each.
pub fn tool_definitions(tools: &ToolRegistry) -> Vec<ToolDefinition> {
    tools
        .specs()
        .into_iter()
        .map(|s| ToolDefinition { name: s.name, description: s.description, parameters: s.parameters })
        .collect()
}

/// The messages of the current turn: those after the user's last message.
fn this_turn(history: &[Message]) -> &[Message] {
    let turn_start = history.iter().rposition(|m| matches!(m, Message::User { .. })).map_or(0, |i| i + 1);
    &history[turn_start..]
}

/// The tools the model may call at this point of the turn, when that is not all of them: a
/// tool with [`offered_after`](toolgraph_tools::ToolSpec::offered_after) only once one of
/// those tools has returned since the user's last message. `None`: every tool.
pub fn callable_tools(tools: &ToolRegistry, history: &[Message]) -> Option<Vec<String>> {
    callable_among(&tools.tools(), this_turn(history))
}

/// [`callable_tools`] over the registry's tools, read in place (asked before every model call).
fn callable_among(tools: &[Arc<dyn Tool>], turn: &[Message]) -> Option<Vec<String>> {
    if tools.iter().all(|t| t.spec().offered_after.is_empty()) {
        return None;
    }
    let returned: Vec<&str> = turn
        .iter()
        .filter_map(|m| match m {
            Message::Tool { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let callable: Vec<String> = tools
        .iter()
        .map(|t| t.spec())
        .filter(|s| s.offered_after.is_empty() || s.offered_after.iter().any(|t| returned.contains(&t.as_str())))
        .map(|s| s.name.clone())
        .collect();
    (callable.len() < tools.len()).then_some(callable)
}

/// The tool choice for the model's next step: the tool that must come next
/// ([`required_after`](toolgraph_tools::ToolSpec::required_after): one it follows has returned
/// in this turn without failing, and it has not been called since), else the
/// [callable tools](callable_tools) when that is not all of them; `None`: the model decides
/// among all.
pub fn tool_choice(tools: &ToolRegistry, history: &[Message]) -> Option<ToolChoice> {
    let (registered, turn) = (tools.tools(), this_turn(history));
    match registered.iter().map(|t| t.spec()).find(|spec| due(&spec.name, &spec.required_after, turn)) {
        Some(spec) => Some(ToolChoice::Tool(spec.name.clone())),
        None => callable_among(&registered, turn).map(ToolChoice::Allowed),
    }
}

/// The tool the agent calls itself now, with no arguments and no model call
/// ([`runs_after`](toolgraph_tools::ToolSpec::runs_after): one it follows has returned in this
/// turn without failing, and it has not been called since).
pub fn step_due(tools: &ToolRegistry, history: &[Message]) -> Option<String> {
    let turn = this_turn(history);
    tools.tools().iter().map(|t| t.spec()).find(|spec| due(&spec.name, &spec.runs_after, turn)).map(|s| s.name.clone())
}

/// Whether `tool` is due: one of `after` has [found something](found) in `turn`, and `tool`
/// has not returned since.
fn due(tool: &str, after: &[String], turn: &[Message]) -> bool {
    if after.is_empty() {
        return false;
    }
    let followed = turn.iter().rposition(|m| match m {
        Message::Tool { name, content, .. } => after.contains(name) && found(content),
        _ => false,
    });
    followed.is_some_and(|at| !turn[at..].iter().any(|m| matches!(m, Message::Tool { name, .. } if name == tool)))
}

/// Whether a tool message carries a result to go on with: neither a failure nor an empty list
/// (a search that found nothing leaves the model to say so).
fn found(content: &str) -> bool {
    !failed(content) && content.trim() != "[]"
}

/// Whether a tool message reports a failure (`{"ok": false, …}`, docs/tools.md).
fn failed(content: &str) -> bool {
    content.contains("\"ok\":false")
        && serde_json::from_str::<Value>(content).is_ok_and(|v| v.get("ok") == Some(&Value::Bool(false)))
}

/// Builds the agent graph over `model` and `checkpointer`.
///
/// # Errors
/// Only if the fixed topology were invalid; covered by tests.
pub fn build(
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, GraphBuildError> {
    let max_retries = spec.max_tool_retries;
    let deps = AgentDeps::new(spec, model);
    let mut g = StateGraph::<AgentState, AgentDeps>::new();
    let [model, tools, approved, execute, give_up] =
        [ReactNode::Model, ReactNode::Tools, ReactNode::Approved, ReactNode::Execute, ReactNode::GiveUp]
            .map(ReactNode::name);
    g.add_node(model, agent_node);
    g.add_node(tools, tools_node);
    g.add_node(approved, approved_node);
    g.add_node(execute, execute_node);
    g.add_node(give_up, give_up_node);
    g.add_edge(START, model);
    g.add_conditional_edges(
        model,
        move |s: &AgentState| {
            if pending_calls(s).is_empty() { END.into() } else { tools.into() }
        },
        [tools, END],
    );
    g.add_conditional_edges(
        tools,
        move |s: &AgentState| {
            if s.last_reply().is_some() {
                END.into()
            } else if s.tool_failures > max_retries {
                give_up.into()
            } else {
                model.into()
            }
        },
        [model, give_up, END],
    );
    g.add_conditional_edges(
        approved,
        move |s: &AgentState| {
            if !s.approved.is_empty() {
                execute.into()
            } else if s.last_reply().is_some() {
                END.into()
            } else {
                model.into()
            }
        },
        [execute, model, END],
    );
    g.add_edge(execute, model);
    g.add_edge(give_up, END);
    g.add_resume(tools, approved);
    g.set_recovery(recover);
    g.compile(deps, checkpointer)
}

/// The agent's topology as a Mermaid flowchart (no model or store needed).
pub fn mermaid() -> String {
    crate::assembly::mermaid(toolgraph_config::AgentGraph::React)
}

/// Tool calls of the last assistant message that have no tool message yet.
fn pending_calls(s: &AgentState) -> Vec<ToolCall> {
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

/// The most recent messages that fit `budget` (≈ 4 characters a token), cut only where a
/// user turn begins so a tool call is never separated from its result. The latest user
/// turn is always included.
pub fn history_window(messages: &[Message], budget: usize) -> &[Message] {
    if budget == 0 {
        return messages;
    }
    let mut used = 0usize;
    let mut start = messages.len();
    let mut cut = None;
    for (i, m) in messages.iter().enumerate().rev() {
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

async fn agent_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let deps = ctx.deps();
    // A fixed step: the call is the agent's, the tools node runs it as any other.
    if let Some(tool) = step_due(&deps.spec.tools, &s.messages) {
        let call = ToolCall { id: format!("{tool}-{}", s.messages.len()), name: tool, arguments: "{}".into() };
        return Ok(NodeOutput::Update(AgentUpdate {
            messages: vec![Message::Assistant { content: String::new(), tool_calls: vec![call] }],
            ..Default::default()
        }));
    }
    let mut messages = Vec::with_capacity(s.messages.len() + 1);
    let added = match &deps.spec.prompt_context {
        Some(context) => context(&s.context).await,
        None => None,
    };
    match added {
        Some(added) if deps.spec.system_prompt.is_empty() => messages.push(Message::system(added.to_string())),
        Some(added) => messages.push(Message::system(format!("{}\n\n{added}", deps.spec.system_prompt))),
        None if !deps.spec.system_prompt.is_empty() => messages.push(Message::system(deps.spec.system_prompt.clone())),
        None => {}
    }
    messages.extend_from_slice(history_window(&s.messages, deps.spec.history_budget));
    let mut request = ChatRequest::new(messages).with_tools(deps.definitions());
    request.tool_choice = tool_choice(&deps.spec.tools, &s.messages);
    request.temperature = deps.spec.temperature;
    request.max_tokens = deps.spec.max_tokens;
    let model_error = |e: toolgraph_llm::LlmError| NodeError::new("model", e.to_string());
    let mut stream = deps.model.stream(request).await.map_err(model_error)?;
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    while let Some(event) = stream.next().await {
        match event.map_err(model_error)? {
            ChatEvent::TextDelta(t) => {
                ctx.emit(RunEvent::TextDelta { text: t.clone() }).await;
                content.push_str(&t);
            }
            ChatEvent::ToolCall(c) => tool_calls.push(c),
            ChatEvent::ToolCallDelta { .. } | ChatEvent::Usage(_) | ChatEvent::Finished(_) => {}
        }
    }
    if tool_calls.is_empty()
        && let Some(footer) = &deps.spec.answer_footer
        && let Some(text) = footer(&turn_tool_outputs(&s.messages), &content)
    {
        ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
        content.push_str(&text);
    }
    Ok(NodeOutput::Update(AgentUpdate {
        messages: vec![Message::Assistant { content, tool_calls }],
        ..Default::default()
    }))
}

/// The outputs of the tools called since the last user message.
fn turn_tool_outputs(history: &[Message]) -> Vec<&str> {
    this_turn(history)
        .iter()
        .filter_map(|m| match m {
            Message::Tool { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect()
}

pub(crate) fn tool_message(call: &ToolCall, outcome: &ToolOutcome) -> Message {
    Message::tool(call.id.clone(), call.name.clone(), outcome.to_model_text())
}

/// Runs `call`; its tool sees the turn's context plus `toolCallId`, the model's id of the call
/// (stable across a resumed run, so a tool with side effects can pass it on as an idempotency
/// key).
pub(crate) async fn run_tool(ctx: &RunContext<AgentDeps>, tools: &ToolContext, call: &ToolCall) -> ToolOutcome {
    let tools = tools.clone().set("toolCallId", Value::String(call.id.clone()));
    let outcome = match ToolCallRequest::parse_arguments(&call.arguments) {
        Ok(args) => ctx.deps().spec.tools.call(&tools, &call.name, &args).await,
        Err(e) => ToolOutcome::Failure(e),
    };
    ctx.emit(RunEvent::ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        outcome: outcome.to_json(),
        ok: outcome.is_success(),
    })
    .await;
    outcome
}

/// Calls `tool` with `arguments` on behalf of a node (not the model), recorded like a model's
/// call: the events of a tool call, and the update's messages — an assistant message with the
/// call and the tool message with its result — so clients, checkpoints and recovery see it as
/// any other call. Its id is unique within the conversation, and the same if the step runs again.
pub(crate) async fn recorded_call(
    s: &AgentState,
    ctx: &RunContext<AgentDeps>,
    tool: &str,
    arguments: Value,
) -> (ToolOutcome, Vec<Message>) {
    let call =
        ToolCall { id: format!("{tool}-{}", s.messages.len()), name: tool.into(), arguments: arguments.to_string() };
    ctx.emit(RunEvent::ToolCall { call_id: call.id.clone(), name: call.name.clone(), arguments }).await;
    let outcome = run_tool(ctx, &tool_context(s, ctx.deps().spec()), &call).await;
    let result = tool_message(&call, &outcome);
    (outcome, vec![Message::Assistant { content: String::new(), tool_calls: vec![call] }, result])
}

/// The context of this turn's tool calls: the state's, then the agent's own values over it,
/// and the results of the tools called so far in the turn.
pub(crate) fn tool_context(s: &AgentState, spec: &AgentSpec) -> ToolContext {
    let mut values = s.context.clone();
    values.extend(spec.tool_context.iter().map(|(k, v)| (k.clone(), v.clone())));
    let results = this_turn(&s.messages)
        .iter()
        .filter_map(|m| match m {
            Message::Tool { name, content, .. } => Some((name.clone(), content.clone())),
            _ => None,
        })
        .collect();
    ToolContext::with_state(values).with_turn_results(results)
}

async fn tools_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let registry = &ctx.deps().spec.tools;
    // A call to a tool not on offer yet (a model that ignored the narrowed choice) is answered
    // with why, and never run.
    let callable = callable_tools(registry, &s.messages);
    let on_offer =
        |c: &ToolCall| callable.as_ref().is_none_or(|names| names.contains(&c.name) || registry.get(&c.name).is_none());
    let (calls, early): (Vec<ToolCall>, Vec<ToolCall>) = pending_calls(&s).into_iter().partition(on_offer);
    let tool_ctx = tool_context(&s, &ctx.deps().spec);
    let (writes, reads): (Vec<ToolCall>, Vec<ToolCall>) =
        calls.into_iter().partition(|c| registry.get(&c.name).is_some_and(|t| t.spec().class == ToolClass::Write));
    for c in early.iter().chain(&reads).chain(&writes) {
        let arguments = serde_json::from_str(&c.arguments).unwrap_or(Value::String(c.arguments.clone()));
        ctx.emit(RunEvent::ToolCall { call_id: c.id.clone(), name: c.name.clone(), arguments }).await;
    }
    let mut messages = Vec::with_capacity(early.len() + reads.len());
    for c in &early {
        let after = registry.get(&c.name).map(|t| t.spec().offered_after.join(" or ")).unwrap_or_default();
        let why = format!("{} can be called only after {after} has returned in this turn: call {after} first", c.name);
        let outcome = ToolOutcome::Failure(ToolError::invalid_arguments(why));
        let (call_id, name, outcome_json) = (c.id.clone(), c.name.clone(), outcome.to_json());
        ctx.emit(RunEvent::ToolResult { call_id, name, outcome: outcome_json, ok: false }).await;
        messages.push(tool_message(c, &outcome));
    }
    // A model may ask for any number of calls at once: a few run at a time, in order, so one
    // step cannot start hundreds of searches or queries together.
    // (The calls are made into futures first: a closure inside the stream's type would ask the
    // node's future for a lifetime bound the compiler cannot prove Send for.)
    let calls: Vec<_> = reads.iter().map(|c| run_tool(&ctx, &tool_ctx, c)).collect();
    let outcomes: Vec<ToolOutcome> = futures::stream::iter(calls).buffered(MAX_PARALLEL_TOOL_CALLS).collect().await;
    let failed = !early.is_empty() || outcomes.iter().any(|o| !o.is_success());
    messages.extend(reads.iter().zip(&outcomes).map(|(c, o)| tool_message(c, o)));
    // A result that is the finished answer ends the turn with it (no write waiting).
    let direct = reads.iter().zip(&outcomes).rev().find_map(|(c, o)| {
        let field = registry.get(&c.name)?.spec().answer_field.clone()?;
        match o {
            ToolOutcome::Success(v) => v.get(&field)?.as_str().map(str::to_owned),
            ToolOutcome::Failure(_) => None,
        }
    });
    if let Some(answer) = direct.filter(|_| writes.is_empty() && !failed) {
        ctx.emit(RunEvent::TextDelta { text: answer.clone() }).await;
        messages.push(Message::assistant(answer));
    }
    let mut update =
        AgentUpdate { messages, tool_failures: Some(s.tool_failures + u32::from(failed)), ..Default::default() };
    if writes.is_empty() {
        return Ok(NodeOutput::Update(update));
    }
    let mut requests = Vec::with_capacity(writes.len());
    for c in &writes {
        match ToolCallRequest::parse_arguments(&c.arguments) {
            Ok(args) => {
                let mut shown = args.clone();
                if let (Some(tool), Value::Object(m)) = (registry.get(&c.name), &mut shown) {
                    for k in &tool.spec().injected {
                        if let Some(v) = s.context.get(k) {
                            m.insert(k.clone(), v.clone());
                        }
                    }
                }
                let description = registry.get(&c.name).map(|t| t.describe(&shown)).unwrap_or_default();
                let request =
                    ApprovalRequest { call_id: c.id.clone(), tool: c.name.clone(), arguments: args, description };
                requests.push(InterruptRequest {
                    key: c.id.clone(),
                    payload: serde_json::to_value(&request).unwrap_or(Value::Null),
                });
            }
            // Unparseable arguments never reach a person: the model gets them back to repair.
            Err(e) => update.messages.push(tool_message(c, &ToolOutcome::Failure(e))),
        }
    }
    if requests.is_empty() {
        return Ok(NodeOutput::Update(update));
    }
    Ok(NodeOutput::Interrupt { update, requests, resume_at: ReactNode::Approved.name().into() })
}

/// Answers the rejected calls and records the approved ones for `execute`; runs nothing, so
/// its checkpoint is the line between "decided" (a dead run leaves the actions confirmable)
/// and "running" (a dead run leaves their outcome unknown).
async fn approved_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let mut messages = Vec::new();
    let mut rejected = Vec::new();
    let mut approved = Vec::new();
    for call in pending_calls(&s) {
        if ctx.decisions().get(&call.id) == Some(&Decision::Approve) {
            approved.push(call.id);
            continue;
        }
        let outcome = ToolOutcome::Failure(ToolError::denied(REJECTED_OUTCOME));
        ctx.emit(RunEvent::ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            outcome: outcome.to_json(),
            ok: false,
        })
        .await;
        let args = ToolCallRequest::parse_arguments(&call.arguments).unwrap_or_default();
        let description =
            ctx.deps().spec.tools.get(&call.name).map_or_else(|| call.name.clone(), |t| t.describe(&args));
        rejected.push(description);
        messages.push(tool_message(&call, &outcome));
    }
    if approved.is_empty() && !rejected.is_empty() {
        let text = cancellation_text(&rejected);
        ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
        messages.push(Message::assistant(text));
    }
    Ok(NodeOutput::Update(AgentUpdate { messages, approved: Some(approved), ..Default::default() }))
}

/// Runs the calls `approved` recorded, one after another in the model's order.
async fn execute_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let tool_ctx = tool_context(&s, &ctx.deps().spec);
    let mut messages = Vec::new();
    for call in pending_calls(&s).iter().filter(|c| s.approved.contains(&c.id)) {
        let outcome = run_tool(&ctx, &tool_ctx, call).await;
        messages.push(tool_message(call, &outcome));
    }
    Ok(NodeOutput::Update(AgentUpdate { messages, approved: Some(Vec::new()), ..Default::default() }))
}

async fn give_up_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let last_error = s
        .messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::Tool { content, .. } => serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned)),
            _ => None,
        })
        .unwrap_or_else(|| "unknown error".into());
    let text = format!(
        "I could not complete this request: the tools kept failing after {} attempts (last error: {last_error}).",
        s.tool_failures
    );
    ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
    Ok(NodeOutput::Update(AgentUpdate { messages: vec![Message::assistant(text)], ..Default::default() }))
}

#[cfg(test)]
mod context_tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
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

#[cfg(test)]
mod footer_tests {
    use super::*;

    #[test]
    fn only_this_turns_tool_outputs_count() {
        let history = vec![
            Message::user("first"),
            Message::tool("c0", "rag_search", "old"),
            Message::assistant("answered"),
            Message::user("second"),
            Message::tool("c1", "rag_search", "a"),
            Message::tool("c2", "calculator", "b"),
        ];
        assert_eq!(turn_tool_outputs(&history), ["a", "b"]);
        assert!(turn_tool_outputs(&history[..4]).is_empty());
    }
}

#[cfg(test)]
mod offer_tests {
    use super::*;
    use toolgraph_tools::ToolBuilder;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct NoArgs {}

    fn registry() -> ToolRegistry {
        let tool = |name: &str, after: &[&str]| {
            ToolBuilder::<NoArgs>::new(name, name)
                .offered_after(after.iter().copied())
                .handler(|_, _: NoArgs| async { Ok(Value::Null) })
                .expect("valid tool")
        };
        let mut r = ToolRegistry::new();
        for t in [tool("search", &[]), tool("cite", &["search"]), tool("answer", &["search", "lookup"])] {
            r.register(t).expect("distinct names");
        }
        r
    }

    fn sorted(v: Option<Vec<String>>) -> Option<Vec<String>> {
        v.map(|mut v| {
            v.sort();
            v
        })
    }

    #[test]
    fn a_tool_is_offered_once_one_it_follows_has_returned_in_the_turn() {
        let r = registry();
        let mut history = vec![Message::user("q")];
        assert_eq!(callable_tools(&r, &history), Some(vec!["search".to_owned()]));
        history.push(Message::tool("c1", "search", "[]"));
        assert_eq!(callable_tools(&r, &history), None, "everything once search returned");
        // A new turn starts over, whatever the last one returned.
        history.push(Message::assistant("a"));
        history.push(Message::user("again"));
        assert_eq!(callable_tools(&r, &history), Some(vec!["search".to_owned()]));
        // Any one of the listed tools suffices.
        history.push(Message::tool("c2", "lookup", "{}"));
        assert_eq!(sorted(callable_tools(&r, &history)), Some(vec!["answer".to_owned(), "search".to_owned()]));
        // Tools without prerequisites: no narrowing at all.
        assert_eq!(callable_tools(&r.subset(["search"]).unwrap(), &[Message::user("q")]), None);
    }
    #[test]
    fn a_required_tool_is_the_next_call_after_the_one_it_follows_until_it_is_called() {
        let mut r = registry();
        let cite = ToolBuilder::<NoArgs>::new("must_cite", "cite")
            .required_after(["search"])
            .handler(|_, _: NoArgs| async { Ok(Value::Null) })
            .expect("valid tool");
        r.register(cite).expect("distinct names");
        let mut history = vec![Message::user("q")];
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Allowed(vec!["search".to_owned()])));
        history.push(Message::tool("s1", "search", "[]"));
        assert_eq!(tool_choice(&r, &history), None, "an empty result asks for nothing");
        history.push(Message::tool("s1b", "search", r#"[{"text": "found"}]"#));
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Tool("must_cite".into())));
        // Another tool's result in between does not lift it.
        history.push(Message::tool("c1", "cite", "{}"));
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Tool("must_cite".into())));
        // Once called (even if it failed), the model decides again: no loop on a failing call.
        history.push(Message::tool("m1", "must_cite", r#"{"ok":false}"#));
        assert_eq!(tool_choice(&r, &history), None, "everything is callable now");
        // A search that fails asks for nothing; a second one that returns makes it due again.
        history.push(Message::tool("s2", "search", r#"{"error":"down","kind":"unavailable","ok":false}"#));
        assert_eq!(tool_choice(&r, &history), None);
        history.push(Message::tool("s3", "search", r#"[{"text": "found"}]"#));
        assert_eq!(tool_choice(&r, &history), Some(ToolChoice::Tool("must_cite".into())));
        // A new turn starts over.
        history.push(Message::user("again"));
        assert!(matches!(tool_choice(&r, &history), Some(ToolChoice::Allowed(_))));
    }

    #[test]
    fn a_step_the_agent_runs_is_due_after_the_one_it_follows_until_it_has_run() {
        let mut r = registry();
        let cite = ToolBuilder::<NoArgs>::new("cite_it", "cite")
            .runs_after(["search"])
            .handler(|_, _: NoArgs| async { Ok(Value::Null) })
            .expect("valid tool");
        r.register(cite).expect("distinct names");
        let mut history = vec![Message::user("q")];
        assert_eq!(step_due(&r, &history), None);
        history.push(Message::tool("s1", "search", r#"{"ok":false,"kind":"unavailable","error":"down"}"#));
        assert_eq!(step_due(&r, &history), None, "not after a failure");
        history.push(Message::tool("s2", "search", "[]"));
        assert_eq!(step_due(&r, &history), None, "not after an empty result");
        history.push(Message::tool("s3", "search", r#"[{"text": "found"}]"#));
        assert_eq!(step_due(&r, &history).as_deref(), Some("cite_it"));
        assert_eq!(tool_choice(&r, &history), None, "the model is not asked for it");
        history.push(Message::tool("c1", "cite_it", r#"{"ok":false}"#));
        assert_eq!(step_due(&r, &history), None, "once run, even if it failed: no loop");
        history.push(Message::user("again"));
        assert_eq!(step_due(&r, &history), None, "a new turn starts over");
    }
}
