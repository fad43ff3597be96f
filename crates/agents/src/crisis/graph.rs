//! The crisis companion's graph: not ReAct — the model never chooses a tool.
//!
//! ```text
//! START → crisis_gate ─(risk)→ crisis_response → agent → END
//!                     └(none)────────────────→ agent → END
//! ```
//! `crisis_gate` screens the user's recent messages ([`gate::screen`]) and keeps its verdict in
//! the conversation's state (`context.crisis_gate`); `crisis_response` calls
//! `find_local_crisis_resources` (recorded as a tool call); `agent` writes the reply, with the
//! resources in its instructions when the gate saw risk — and appended to it when the model
//! names none of them. A reply to a person at risk never fails: if the model does, the
//! resources go out in a fixed text instead.

use super::gate::{self, Risk, Verdict};
use super::{Found, TOOL_NAME};
use crate::kit::{self, AgentDeps, AgentSpec, AgentState, AgentUpdate};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use toolgraph_graph::{
    Checkpointer, CompiledGraph, END, GraphBuildError, NodeError, NodeOutput, RunContext, RunEvent, START, StateGraph,
};
use toolgraph_llm::{ChatEvent, ChatModel, ChatRequest, Message};

/// The state key of the gate's verdict.
pub const VERDICT_KEY: &str = "crisis_gate";

/// How many of the latest user messages the gate and the location extraction read.
const RECENT_USER_MESSAGES: usize = 4;

/// Builds the graph over `model` and `checkpointer`.
///
/// # Errors
/// Only if the fixed topology were invalid; covered by tests.
pub fn build(
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, GraphBuildError> {
    let mut g = StateGraph::<AgentState, AgentDeps>::new();
    g.add_node("crisis_gate", gate_node);
    g.add_node("crisis_response", response_node);
    g.add_node("agent", reply_node);
    g.add_edge(START, "crisis_gate");
    g.add_conditional_edges(
        "crisis_gate",
        |s: &AgentState| {
            if verdict(s).is_some_and(|v| v.risk != Risk::None) { "crisis_response".into() } else { "agent".into() }
        },
        ["crisis_response", "agent"],
    );
    g.add_edge("crisis_response", "agent");
    g.add_edge("agent", END);
    g.set_recovery(kit::recover);
    g.compile(AgentDeps::new(spec, model), checkpointer)
}

/// This turn's verdict.
fn verdict(s: &AgentState) -> Option<Verdict> {
    serde_json::from_value(s.context.get(VERDICT_KEY)?.clone()).ok()
}

/// The latest user messages, oldest first, one per line.
fn recent_user_text(s: &AgentState) -> String {
    let mut texts: Vec<&str> = s
        .messages
        .iter()
        .rev()
        .filter(|m| matches!(m, Message::User { .. }))
        .take(RECENT_USER_MESSAGES)
        .map(Message::content)
        .collect();
    texts.reverse();
    texts.join("\n")
}

async fn gate_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    // Only the latest message decides whether to ask the model; the model then reads the recent ones.
    let latest = s.last_user_message().unwrap_or("");
    let v = if gate::keyword_hit(latest) {
        let recent = recent_user_text(&s);
        let screened = gate::screen(ctx.deps().model(), &recent);
        ctx.model_call(screened, |v| v.screened_by == "model").await
    } else {
        Verdict { risk: Risk::None, reason: "no risk words".into(), screened_by: "keywords".into() }
    };
    let mut set = Map::new();
    set.insert(VERDICT_KEY.into(), serde_json::to_value(&v).unwrap_or(Value::Null));
    Ok(NodeOutput::Update(AgentUpdate { context_set: Some(set), ..Default::default() }))
}

async fn response_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let arguments = json!({ "conversation": recent_user_text(&s) });
    let (_, messages) = kit::recorded_call(&s, &ctx, TOOL_NAME, arguments).await;
    Ok(NodeOutput::Update(AgentUpdate { messages, ..Default::default() }))
}

/// What the last resource search of this turn found.
fn found(s: &AgentState) -> Option<Found> {
    let turn = s.messages.iter().rposition(|m| matches!(m, Message::User { .. }))?;
    s.messages[turn..].iter().rev().find_map(|m| match m {
        Message::Tool { name, content, .. } if name == TOOL_NAME => serde_json::from_str(content).ok(),
        _ => None,
    })
}

/// The resources as lines of text.
fn resource_lines(found: &Found) -> String {
    found
        .found_resources
        .iter()
        .map(|r| {
            let mut line = format!("- {}", r.name);
            for part in [&r.phone, &r.url] {
                if !part.is_empty() {
                    line.push_str(&format!(" — {part}"));
                }
            }
            if !r.region.is_empty() {
                line.push_str(&format!(" ({})", r.region));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The reply when the model fails a person at risk: the resources, in a fixed text.
pub fn fallback_reply(found: Option<&Found>) -> String {
    let lines = found.map(resource_lines).filter(|l| !l.is_empty());
    format!(
        "I'm really sorry you're going through this, and I'm glad you told me. You don't have to face it alone. \
         Please reach out to someone who can help right now:\n{}\nIf you are in immediate danger, call your local \
         emergency number.",
        lines.unwrap_or_else(|| "- your local emergency number".into())
    )
}

async fn reply_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let deps = ctx.deps();
    let at_risk = verdict(&s).is_some_and(|v| v.risk != Risk::None);
    let found = found(&s);
    let mut system = deps.spec().system_prompt.clone();
    if at_risk {
        let lines = found.as_ref().map(resource_lines).unwrap_or_default();
        system.push_str(&format!(
            "\n\nThe person may be at risk of harming themselves. Reply with warmth and without judgement, in \
             their language; say you are glad they reached out, and encourage them to contact one of these lines \
             now, listing each with its number and address exactly as given:\n{lines}\nDo not list other numbers."
        ));
    }
    // The reply reads the conversation's words, not the tool records of earlier turns.
    let history = kit::spoken_window(&s.messages, deps.spec().history_budget);
    let mut messages = vec![Message::system(system)];
    messages.extend(history);
    let mut request = ChatRequest::new(messages);
    request.temperature = deps.spec().temperature;
    request.max_tokens = deps.spec().max_tokens;
    let mut content = String::new();
    let streamed = async {
        let mut stream = deps.model().stream(request).await?;
        while let Some(event) = stream.next().await {
            if let ChatEvent::TextDelta(t) = event? {
                ctx.emit(RunEvent::TextDelta { text: t.clone() }).await;
                content.push_str(&t);
            }
        }
        Ok::<(), toolgraph_llm::LlmError>(())
    };
    let streamed = ctx.model_call(streamed, Result::is_ok).await;
    let failed = streamed.is_err() || content.trim().is_empty();
    if failed && at_risk {
        if let Err(e) = &streamed {
            tracing::warn!(error = %e, "the model failed a reply to a person at risk; sending the resources");
        }
        let text = fallback_reply(found.as_ref());
        let text = if content.is_empty() { text } else { format!("\n\n{text}") };
        ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
        content.push_str(&text);
    } else if let Err(e) = streamed {
        return Err(NodeError::new("model", e.to_string()));
    } else if at_risk && let Some(found) = &found {
        // The lines must reach the person even when the model only alludes to them.
        let given = found.found_resources.iter().any(|r| {
            let number = if r.phone.is_empty() { &r.url } else { &r.phone };
            !number.is_empty() && content.contains(number.as_str())
        });
        let lines = resource_lines(found);
        if !given && !lines.is_empty() {
            let text = format!("\n\n{lines}");
            ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
            content.push_str(&text);
        }
    }
    Ok(NodeOutput::Update(AgentUpdate { messages: vec![Message::assistant(content)], ..Default::default() }))
}
