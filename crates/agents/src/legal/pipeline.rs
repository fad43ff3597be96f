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
//!
//! Its graph is a declaration ([`DECLARATION`], docs/agents.md) of `tool`, `route` and `reply`
//! nodes: what the pipeline does lives in its tools.

use crate::kit::{AgentDeps, AgentSpec, AgentState};
use std::sync::Arc;
use toolgraph_graph::{Checkpointer, CompiledGraph};
use toolgraph_llm::ChatModel;

/// The tools the pipeline calls; an agent on it must enable all three.
pub const TOOLS: [&str; 3] = ["retrieve_laws", "generate_answer", "format_citation"];

/// The pipeline's declaration (`examples/agents/legal.toml`): the graph [`build`] builds.
pub const DECLARATION: &str = include_str!("../../../../examples/agents/legal.toml");

/// Builds the pipeline over `model` (which `generate_answer` may share) and `checkpointer`,
/// from [`DECLARATION`].
///
/// # Errors
/// Only if the declaration were invalid (covered by tests) or the graph did not compile.
pub fn build(
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, crate::AgentError> {
    crate::declared::build(&plan()?, spec, model, &|_| Err(crate::AgentError::NoModel), checkpointer)
}

/// The checked [`DECLARATION`].
///
/// # Errors
/// Only if the declaration were invalid (covered by tests).
pub fn plan() -> Result<crate::declared::Plan, crate::AgentError> {
    let known = crate::declared::Known { tools: &TOOLS.map(str::to_owned), writes: &[], kinds: None, agents: &[] };
    crate::declared::check("examples/agents/legal.toml", DECLARATION, &known).map_err(crate::AgentError::Declared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_replies_as_the_pipeline_always_has() {
        // The fixed texts of the pipeline's replies, where its tools' contracts put them.
        assert!(DECLARATION.contains(&format!("text = \"{}\"", super::super::answer::NO_ANSWER)));
        assert!(DECLARATION.contains("text = \"Không tra cứu được văn bản luật lúc này: {{laws.error}}.\""));
    }
}
