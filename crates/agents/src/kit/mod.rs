//! What every agent here is built from: the state a turn keeps ([`AgentState`]), how an agent is
//! set up and what its nodes run on ([`AgentSpec`], [`AgentDeps`]), and what nodes do with tools
//! and history — offer and run tools, record a call a node makes itself, make a stopped turn whole.
//!
//! The ReAct agent (`react`), declared graphs, the legal pipeline and the crisis companion are
//! graphs over these; the kit knows none of them. `state` owns the state and its updates, `spec`
//! the settings and dependencies, `tools` the tools in a turn, `steps` the model and tools steps
//! of a tool-calling agent, `grounded` what a reply checked against the search results adds, `summary` the summary of the
//! turns that fell out of the history window.

mod grounded;
mod spec;
mod state;
mod steps;
mod summary;
mod tools;

pub use grounded::grounded_prompt;
pub use grounded::{GROUNDING_INSTRUCTION, question_in_context};
pub(crate) use grounded::{
    checker, checker_over, grounded_history_window, judge_in_documents_language, report_json, without_earlier_searches,
    write_out_results,
};
pub use spec::{
    AgentDeps, AgentSpec, AnswerFooter, PromptContext, RecallContext, history_window, spoken_window, warm_up,
};
pub use state::{
    AgentState, AgentUpdate, ApprovalRequest, ChannelWrite, INTERRUPTED_CALL, INTERRUPTED_REPLY, Question, Reducer,
    user_turn,
};
pub(crate) use state::{pending_calls, recover};
pub use steps::{MAX_PARALLEL_TOOL_CALLS, REJECTED_OUTCOME, cancellation_text};
pub(crate) use steps::{
    StepRules, approved_node, call_report, execute_node, give_up_node, model_step, model_step_on, tools_step,
};
pub use summary::{SUMMARY_CHANNEL, Summary};
pub use tools::{callable_tools, step_due, tool_choice, tool_definitions};
pub(crate) use tools::{
    failed, recorded_call, returned_this_turn, run_tool, this_turn, tool_context, tool_message, turn_tool_outputs,
};
