//! What every agent here is built from: the state a turn keeps ([`AgentState`]), how an agent is
//! set up and what its nodes run on ([`AgentSpec`], [`AgentDeps`]), and what nodes do with tools
//! and history — offer and run tools, record a call a node makes itself, make a stopped turn whole.
//!
//! The ReAct agent (`react`), the legal pipeline and the crisis companion are graphs over these;
//! the kit knows none of them. `state` owns the state and its updates, `spec` the settings and
//! dependencies, `tools` the tools in a turn.

mod spec;
mod state;
mod tools;

pub use spec::{AgentDeps, AgentSpec, AnswerFooter, PromptContext, history_window, warm_up};
pub use state::{AgentState, AgentUpdate, ApprovalRequest, INTERRUPTED_CALL, INTERRUPTED_REPLY, user_turn};
pub(crate) use state::{pending_calls, recover};
pub use tools::{callable_tools, step_due, tool_choice, tool_definitions};
pub(crate) use tools::{recorded_call, run_tool, tool_context, tool_message, turn_tool_outputs};
