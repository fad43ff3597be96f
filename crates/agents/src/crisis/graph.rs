//! The crisis companion's graph: not ReAct — the model never chooses a tool. It is a
//! declaration, [`DECLARATION`] (`examples/agents/crisis.toml`, docs/crisis.md):
//!
//! ```text
//! START → crisis_gate ─(risk words)→ crisis_screen ─(possible, imminent)→ crisis_response → crisis_reply → END
//!                     │                             └(none)→ agent → END
//!                     └(none)→ agent → END
//! ```
//! `crisis_gate` looks for risk words in the person's latest message (eight languages), so an
//! ordinary turn costs no model call; `crisis_screen` asks the model for a verdict over their
//! last four messages, written to the `crisis_verdict` channel (a failed call counts as risk);
//! `crisis_response` calls `find_local_crisis_resources` (recorded as a tool call);
//! `crisis_reply` writes the reply with the lines found in its instructions, appends them when
//! the model names none, and sends them in a fixed text when the model fails; `agent` is the
//! ordinary reply.

use super::TOOL_NAME;
use crate::kit::{AgentDeps, AgentSpec, AgentState};
use std::sync::Arc;
use toolgraph_graph::{Checkpointer, CompiledGraph};
use toolgraph_llm::ChatModel;

/// The crisis companion's declaration (`examples/agents/crisis.toml`): the graph [`build`]
/// builds.
pub const DECLARATION: &str = include_str!("../../../../examples/agents/crisis.toml");

/// Builds the graph over `model` and `checkpointer`, from [`DECLARATION`].
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
    let known = crate::declared::Known { tools: &[TOOL_NAME.to_owned()], writes: &[], kinds: None, agents: &[] };
    crate::declared::check("examples/agents/crisis.toml", DECLARATION, &known).map_err(crate::AgentError::Declared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declared::check::{Exit, Step};

    #[test]
    fn the_gate_looks_for_risk_words_in_every_language_and_lets_ordinary_text_through() {
        let plan = plan().unwrap();
        let gate = plan.nodes.iter().find(|n| n.name == "crisis_gate").unwrap();
        let Exit::Route(route) = &gate.exit else { panic!("{gate:?}") };
        let flagged = |text: &str| {
            let lower = text.to_lowercase();
            route.mentions.iter().any(|w| lower.contains(w.as_str()))
        };
        for text in ["I want to END MY LIFE", "ya no quiero vivir", "tôi muốn chết", "죽고 싶어요", "我不想活了"]
        {
            assert!(flagged(text), "{text}");
        }
        for text in ["How do I renew my passport?", "¿Qué tal el examen?", "Hôm nay trời đẹp"] {
            assert!(!flagged(text), "{text}");
        }
        // The reply to a person at risk cannot fail, and gives the lines.
        let reply = plan.nodes.iter().find(|n| n.name == "crisis_reply").unwrap();
        assert!(matches!(&reply.step, Step::Model { fallback: Some(_), must_mention: Some(_), .. }), "{reply:?}");
    }
}
