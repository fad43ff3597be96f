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
//!
//! Its state, settings and tool handling are the [kit](crate::kit) every agent here is built from.

use crate::kit::{
    AgentDeps, AgentSpec, AgentState, AgentUpdate, ApprovalRequest, callable_tools, history_window, pending_calls,
    recover, run_tool, step_due, tool_choice, tool_context, tool_message, turn_tool_outputs,
};
use futures::StreamExt;
use serde_json::Value;
use std::sync::Arc;
use toolgraph_graph::{
    Checkpointer, CompiledGraph, Decision, END, GraphBuildError, InterruptRequest, NodeError, NodeOutput, RunContext,
    RunEvent, START, StateGraph,
};
use toolgraph_llm::{ChatEvent, ChatModel, ChatRequest, Message, ToolCall};
use toolgraph_tools::{ToolCallRequest, ToolClass, ToolError, ToolOutcome};

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

/// Most read-tool calls of one step that run at the same time; the rest wait their turn.
pub const MAX_PARALLEL_TOOL_CALLS: usize = 4;

/// The tool message of a rejected write action, and the reply that ends a turn whose
/// every action was rejected: fixed texts, no model call (docs/service.md).
pub const REJECTED_OUTCOME: &str = "The user rejected this action; it was not executed.";

/// The reply of a turn in which every pending action was rejected.
pub fn cancellation_text(descriptions: &[String]) -> String {
    format!("Cancelled, nothing was changed: {}.", descriptions.join("; "))
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

async fn agent_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let deps = ctx.deps();
    let spec = deps.spec();
    // A fixed step: the call is the agent's, the tools node runs it as any other.
    if let Some(tool) = step_due(&spec.tools, &s.messages) {
        let call = ToolCall { id: format!("{tool}-{}", s.messages.len()), name: tool, arguments: "{}".into() };
        return Ok(NodeOutput::Update(AgentUpdate {
            messages: vec![Message::Assistant { content: String::new(), tool_calls: vec![call] }],
            ..Default::default()
        }));
    }
    let mut messages = Vec::with_capacity(s.messages.len() + 1);
    let added = match &spec.prompt_context {
        Some(context) => context(&s.context).await,
        None => None,
    };
    match added {
        Some(added) if spec.system_prompt.is_empty() => messages.push(Message::system(added.to_string())),
        Some(added) => messages.push(Message::system(format!("{}\n\n{added}", spec.system_prompt))),
        None if !spec.system_prompt.is_empty() => messages.push(Message::system(spec.system_prompt.clone())),
        None => {}
    }
    messages.extend_from_slice(history_window(&s.messages, spec.history_budget));
    let mut request = ChatRequest::new(messages).with_tools(deps.definitions());
    request.tool_choice = tool_choice(&spec.tools, &s.messages);
    request.temperature = spec.temperature;
    request.max_tokens = spec.max_tokens;
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let streamed = async {
        let mut stream = deps.model().stream(request).await?;
        while let Some(event) = stream.next().await {
            match event? {
                ChatEvent::TextDelta(t) => {
                    ctx.emit(RunEvent::TextDelta { text: t.clone() }).await;
                    content.push_str(&t);
                }
                ChatEvent::ToolCall(c) => tool_calls.push(c),
                ChatEvent::ToolCallDelta { .. } | ChatEvent::Usage(_) | ChatEvent::Finished(_) => {}
            }
        }
        Ok::<(), toolgraph_llm::LlmError>(())
    };
    ctx.model_call(streamed, Result::is_ok).await.map_err(|e| NodeError::new("model", e.to_string()))?;
    if tool_calls.is_empty()
        && let Some(footer) = &spec.answer_footer
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

async fn tools_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let registry = &ctx.deps().spec().tools;
    // A call to a tool not on offer yet (a model that ignored the narrowed choice) is answered
    // with why, and never run.
    let callable = callable_tools(registry, &s.messages);
    let on_offer =
        |c: &ToolCall| callable.as_ref().is_none_or(|names| names.contains(&c.name) || registry.get(&c.name).is_none());
    let (calls, early): (Vec<ToolCall>, Vec<ToolCall>) = pending_calls(&s).into_iter().partition(on_offer);
    let tool_ctx = tool_context(&s, ctx.deps().spec());
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
            ctx.deps().spec().tools.get(&call.name).map_or_else(|| call.name.clone(), |t| t.describe(&args));
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
    let tool_ctx = tool_context(&s, ctx.deps().spec());
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
