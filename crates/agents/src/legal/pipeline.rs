//! The legal Q&A agent as a fixed pipeline: no tool choice by the model, the same three steps
//! every turn.
//!
//! ```text
//! START → retrieve ─(articles found)→ generate → cite → END
//!                  └(none, or the search failed: a reply saying so)→ END
//! ```
//! Each step calls its tool through the agent's tool registry (`retrieve_laws`,
//! `generate_answer`, `format_citation`), and records the call and its result in the
//! conversation like a model's tool call, so a client sees tool events and the checkpoints hold
//! what each step got and gave. The answer is streamed once it is cited, as one piece.

use super::{Chunk, answer::NO_ANSWER};
use crate::kit::{self, AgentDeps, AgentSpec, AgentState, AgentUpdate};
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_graph::{
    Checkpointer, CompiledGraph, END, GraphBuildError, NodeError, NodeOutput, RunContext, RunEvent, START, StateGraph,
};
use toolgraph_llm::{ChatModel, Message};
use toolgraph_tools::ToolOutcome;

/// The tools the pipeline calls; an agent on it must enable all three.
pub const TOOLS: [&str; 3] = ["retrieve_laws", "generate_answer", "format_citation"];

/// How many articles a turn retrieves.
const TOP_K: usize = 5;

/// The reply when the search itself failed (the error follows).
const SEARCH_FAILED: &str = "Không tra cứu được văn bản luật lúc này";

/// Builds the pipeline over `model` (which `generate_answer` may share) and `checkpointer`.
///
/// # Errors
/// Only if the fixed topology were invalid; covered by tests.
pub fn build(
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, GraphBuildError> {
    let mut g = StateGraph::<AgentState, AgentDeps>::new();
    g.add_node("retrieve", retrieve_node);
    g.add_node("generate", generate_node);
    g.add_node("cite", cite_node);
    g.add_edge(START, "retrieve");
    g.add_conditional_edges(
        "retrieve",
        |s: &AgentState| if s.last_reply().is_some() { END.into() } else { "generate".into() },
        ["generate", END],
    );
    g.add_edge("generate", "cite");
    g.add_edge("cite", END);
    g.set_recovery(kit::recover);
    g.compile(AgentDeps::new(spec, model), checkpointer)
}

/// The question of this turn: the last user message.
fn question(s: &AgentState) -> String {
    s.last_user_message().unwrap_or_default().to_owned()
}

/// The chunks the last `retrieve_laws` call of the conversation returned.
fn retrieved(s: &AgentState) -> Vec<Chunk> {
    s.messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::Tool { name, content, .. } if name == "retrieve_laws" => serde_json::from_str(content).ok(),
            _ => None,
        })
        .unwrap_or_default()
}

/// The `field` of the last result of `tool`.
fn last_result(s: &AgentState, tool: &str, field: &str) -> Option<String> {
    s.messages.iter().rev().find_map(|m| match m {
        Message::Tool { name, content, .. } if name == tool => {
            serde_json::from_str::<Value>(content).ok()?.get(field)?.as_str().map(str::to_owned)
        }
        _ => None,
    })
}

async fn reply(ctx: &RunContext<AgentDeps>, mut messages: Vec<Message>, text: String) -> NodeOutput<AgentState> {
    ctx.emit(RunEvent::TextDelta { text: text.clone() }).await;
    messages.push(Message::assistant(text));
    NodeOutput::Update(AgentUpdate { messages, ..Default::default() })
}

async fn retrieve_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let args = json!({ "question": question(&s), "top_k": TOP_K });
    let (outcome, messages) = kit::recorded_call(&s, &ctx, "retrieve_laws", args).await;
    match outcome {
        ToolOutcome::Success(Value::Array(found)) if !found.is_empty() => {
            Ok(NodeOutput::Update(AgentUpdate { messages, ..Default::default() }))
        }
        ToolOutcome::Success(_) => Ok(reply(&ctx, messages, NO_ANSWER.into()).await),
        ToolOutcome::Failure(e) => Ok(reply(&ctx, messages, format!("{SEARCH_FAILED}: {}.", e.message)).await),
    }
}

async fn generate_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let args = json!({ "question": question(&s), "chunks": retrieved(&s) });
    let (outcome, messages) = kit::recorded_call(&s, &ctx, "generate_answer", args).await;
    match outcome {
        ToolOutcome::Success(_) => Ok(NodeOutput::Update(AgentUpdate { messages, ..Default::default() })),
        // The model failing fails the turn, as in the ReAct agent: the client gets the error.
        ToolOutcome::Failure(e) => Err(NodeError::new("model", e.message)),
    }
}

async fn cite_node(s: Arc<AgentState>, ctx: RunContext<AgentDeps>) -> Result<NodeOutput<AgentState>, NodeError> {
    let answer = last_result(&s, "generate_answer", "answer")
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| NO_ANSWER.to_owned());
    let args = json!({ "answer": answer, "chunks": retrieved(&s) });
    let (outcome, messages) = kit::recorded_call(&s, &ctx, "format_citation", args).await;
    let text = match &outcome {
        ToolOutcome::Success(v) => v["cited_answer"].as_str().map_or_else(|| answer.clone(), str::to_owned),
        // An answer without citations is still the answer.
        ToolOutcome::Failure(e) => {
            tracing::warn!(error = %e, "format_citation failed; the answer goes out uncited");
            answer.clone()
        }
    };
    Ok(reply(&ctx, messages, text).await)
}
