//! Graphs declared in TOML (docs/agents.md): an agent's channels, nodes and routes in a file
//! its `[agents.NAME]` names with `graph_file`, checked when it loads and built into the same
//! graph runtime as every other agent.
//!
//! Owns: the file format ([`format`]), its checks and what passes them ([`check`]: a
//! [`Plan`]), templates over the state ([`template`]), and the node kinds at run time
//! (`nodes`). The state is the [kit](crate::kit)'s, whose `channels` hold what a declaration
//! adds, so the service, the projection of messages and the approvals work on a declared graph
//! as on the built-in ones.

pub mod check;
mod custom;
pub mod format;
mod nodes;
pub mod template;

pub use check::{DeclError, DeclErrors, Known, Plan, check, version_of};
pub use custom::{CustomKind, CustomNode, KindError, NodeKinds};

use crate::kit::{AgentDeps, AgentSpec, AgentState};
use nodes::{
    AnsweredNode, AskNode, GraphInfo, ModelNode, ReplyNode, RetrieveNode, RouteNode, ToolNode, ToolsNode, router,
    runtime_name,
};
use std::path::Path;
use std::sync::Arc;
use toolgraph_graph::{Checkpointer, CompiledGraph, START, StateGraph};
use toolgraph_llm::ChatModel;

/// Reads and checks the declaration at `path` against `known`.
///
/// # Errors
/// A file that cannot be read, or every problem [`check`] finds.
pub fn load(path: &Path, known: &Known<'_>) -> Result<Plan, DeclErrors> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        DeclErrors(vec![DeclError {
            file: file.clone(),
            line: 1,
            field: String::new(),
            message: format!("cannot read it: {e}"),
        }])
    })?;
    check(&file, &text, known)
}

/// The model a node names over the agent's (`model = "…"`).
pub type ModelFor<'a> = &'a dyn Fn(&str) -> Result<Arc<dyn ChatModel>, crate::AgentError>;

/// Builds `plan` into a graph for the agent of `spec` on `model` (and `model_for` the models
/// its nodes name), over `checkpointer`.
///
/// # Errors
/// A model a node names that cannot be built, a tool subset the registry refuses, or a graph
/// that does not compile.
pub fn build(
    plan: &Plan,
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    model_for: ModelFor<'_>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, crate::AgentError> {
    use check::Step;
    let info = Arc::new(GraphInfo { agent: spec.name.clone(), channels: plan.channels.clone() });
    let mut g = StateGraph::<AgentState, AgentDeps>::new();
    let mut max_failures = std::collections::BTreeMap::new();
    for node in &plan.nodes {
        let name = node.name.clone();
        match &node.step {
            Step::Model {
                prompt,
                tools,
                model: named,
                temperature,
                max_tokens,
                history,
                output,
                require_call,
                cite,
                reply_needs_tools,
            } => {
                let mut own = spec.clone();
                if let Some(tools) = tools {
                    own.tools = spec
                        .tools
                        .subset(tools)
                        .map_err(|source| crate::AgentError::UnknownTool { agent: spec.name.clone(), source })?;
                }
                own.temperature = temperature.or(spec.temperature);
                own.max_tokens = max_tokens.or(spec.max_tokens);
                let node_model = match named {
                    Some(m) => model_for(m)?,
                    None => Arc::clone(&model),
                };
                let output = match output {
                    Some(o) => {
                        // Compiled when the plan was checked.
                        let validator = jsonschema::validator_for(&o.schema).map_err(|e| crate::AgentError::Tool {
                            what: format!("{}: nodes.{name}.output.schema", plan.file),
                            message: e.to_string(),
                        })?;
                        Some((o.clone(), validator))
                    }
                    None => None,
                };
                g.add_node(
                    name.clone(),
                    ModelNode {
                        info: Arc::clone(&info),
                        prompt: prompt.clone(),
                        deps: AgentDeps::new(own, node_model),
                        history: *history,
                        output,
                        rules: crate::kit::StepRules {
                            require_call: *require_call,
                            grounded: *cite,
                            reply_needs_tools: *reply_needs_tools,
                        },
                    },
                );
            }
            Step::Tools { approved, max_failures: max, allowed, .. } => {
                g.add_node(name.clone(), ToolsNode { approved: approved.clone(), allowed: allowed.clone() });
                g.add_resume(name.clone(), approved.clone());
                max_failures.insert(name.clone(), max.unwrap_or(spec.max_tool_retries));
            }
            Step::Approved => {
                g.add_node(name.clone(), crate::kit::approved_node);
            }
            Step::Execute => {
                g.add_node(name.clone(), crate::kit::execute_node);
            }
            Step::GiveUp => {
                g.add_node(name.clone(), crate::kit::give_up_node);
            }
            Step::Tool { tool, arguments, never_fail, channel } => {
                g.add_node(
                    name.clone(),
                    ToolNode {
                        info: Arc::clone(&info),
                        tool: tool.clone(),
                        arguments: arguments.clone(),
                        never_fail: *never_fail,
                        channel: channel.clone(),
                    },
                );
            }
            Step::Retrieve { tool, query, top_k, channel, skip_small_talk } => {
                g.add_node(
                    name.clone(),
                    RetrieveNode {
                        info: Arc::clone(&info),
                        tool: tool.clone(),
                        query: query.clone(),
                        top_k: *top_k,
                        channel: channel.clone(),
                        skip_small_talk: *skip_small_talk,
                    },
                );
            }
            Step::Reply { text } => {
                g.add_node(name.clone(), ReplyNode { info: Arc::clone(&info), text: text.clone() });
            }
            Step::Route => {
                g.add_node(name.clone(), RouteNode);
            }
            Step::Ask { question, form, answered } => {
                g.add_node(
                    name.clone(),
                    AskNode {
                        info: Arc::clone(&info),
                        question: question.clone(),
                        form: form.clone(),
                        answered: answered.clone(),
                    },
                );
                g.add_resume(name.clone(), answered.clone());
            }
            Step::Custom { kind, with, channel } => {
                let decl = CustomNode {
                    name: name.clone(),
                    with: with.clone(),
                    channel: channel
                        .as_ref()
                        .map(|c| (c.clone(), plan.channels.get(c).map(|d| d.reducer).unwrap_or_default())),
                };
                let node = kind.kind.node(&decl).map_err(|message| crate::AgentError::Tool {
                    what: format!("{}: nodes.{name} (kind `{}`)", plan.file, kind.name),
                    message,
                })?;
                g.add_node(name.clone(), custom::Custom(node));
            }
            Step::Answered { channel } => {
                g.add_node(name.clone(), AnsweredNode { info: Arc::clone(&info), channel: channel.clone() });
            }
        }
    }
    g.add_edge(START, runtime_name(&plan.start));
    for node in &plan.nodes {
        let max = max_failures.get(&node.name).copied().unwrap_or(spec.max_tool_retries);
        match router(&info, &node.exit, max) {
            None => {
                if let check::Exit::Next(to) = &node.exit {
                    g.add_edge(node.name.clone(), runtime_name(to));
                }
            }
            Some(route) => {
                let targets: Vec<String> = node.exit.targets().into_iter().map(runtime_name).collect();
                g.add_conditional_edges(node.name.clone(), move |s: &AgentState| route(s), targets);
            }
        }
    }
    g.set_recovery(crate::kit::recover);
    g.set_version(plan.version.as_str());
    Ok(g.compile(AgentDeps::new(spec, model), checkpointer)?)
}
