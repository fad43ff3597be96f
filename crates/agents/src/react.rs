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
//! Its graph is a declaration ([`DECLARATION`], docs/agents.md); its steps, state, settings and
//! tool handling are the [kit](crate::kit) every agent here is built from.

use crate::kit::{AgentDeps, AgentSpec, AgentState};
use std::sync::Arc;
use toolgraph_graph::{Checkpointer, CompiledGraph};
use toolgraph_llm::ChatModel;

pub use crate::kit::{MAX_PARALLEL_TOOL_CALLS, REJECTED_OUTCOME, cancellation_text};

/// The nodes of the agent's graph; their names are what [`RunEvent::NodeStarted`](toolgraph_graph::RunEvent::NodeStarted) and the
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

/// The ReAct agent's declaration (`examples/agents/react.toml`): the graph [`build`] builds.
pub const DECLARATION: &str = include_str!("../../../examples/agents/react.toml");

/// The grounded ReAct agent's declaration (`examples/agents/grounded.toml`): a search before
/// the model answers, and a reply checked against it; [`build_grounded`] builds it.
pub const GROUNDED_DECLARATION: &str = include_str!("../../../examples/agents/grounded.toml");

/// Builds the grounded agent graph from [`GROUNDED_DECLARATION`]: as [`build`], with the search
/// first (the agent's `rag_search`) and its replies cited.
///
/// # Errors
/// The agent has no `rag_search` tool, or the graph did not compile.
pub fn build_grounded(
    mut spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, crate::AgentError> {
    let plan = grounded_plan(&mut spec, GROUNDED_DECLARATION)?;
    crate::declared::build(&plan, spec, model, &|_| Err(crate::AgentError::NoModel), checkpointer)
}

/// The checked grounded declaration `text` ([`GROUNDED_DECLARATION`], or the copy a paused
/// run's version kept) for the agent of `spec`, whose system prompt gains the
/// grounding instruction (its calls send this prompt: the service computes it ahead as it is).
///
/// # Errors
/// The agent has no `rag_search` tool.
pub fn grounded_plan(spec: &mut AgentSpec, text: &str) -> Result<crate::declared::Plan, crate::AgentError> {
    spec.system_prompt = crate::kit::grounded_prompt(&spec.system_prompt).into_owned();
    let tools = spec.tools.names();
    crate::declared::check(
        "examples/agents/grounded.toml",
        text,
        &crate::declared::Known { tools: &tools, writes: &[], kinds: None, agents: &[] },
    )
    .map_err(crate::AgentError::Declared)
}

/// Builds the agent graph over `model` and `checkpointer`, from [`DECLARATION`].
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
    crate::declared::check(
        "examples/agents/react.toml",
        DECLARATION,
        &crate::declared::Known { tools: &[], writes: &[], kinds: None, agents: &[] },
    )
    .map_err(crate::AgentError::Declared)
}
