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
    AnsweredNode, AskNode, CiteNode, GraphInfo, HandedBack, ModelNode, ReplyNode, RetrieveNode, RouteNode, ToolNode,
    ToolsNode, router,
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

/// [`ModelFor`], owned.
pub type ModelsFor = Box<dyn Fn(&str) -> Result<Arc<dyn ChatModel>, crate::AgentError>>;

/// An agent an `agent` node hands a turn to, ready to build into the graph that runs it: its
/// checked declaration, its settings and tools, its model and the models its nodes name.
pub struct Specialist {
    /// Its declaration.
    pub plan: Plan,
    /// Its prompt, tools and settings.
    pub spec: AgentSpec,
    /// Its model.
    pub model: Arc<dyn ChatModel>,
    /// The models its nodes name.
    pub model_for: ModelsFor,
}

/// The agent of a name an `agent` node gives (the configuration knows them: `assembly`).
pub type SpecialistFor<'a> = &'a dyn Fn(&str) -> Result<Specialist, crate::AgentError>;

/// The version of a graph whose own declaration's version is `own` and which runs, through
/// its `agent` nodes (in name order), agents whose versions are `handed`: `own` alone when it
/// hands nothing over, else a digest of all of them, so changing an agent it hands turns to
/// makes a new version of it too.
pub fn combined_version(own: &str, handed: &[String]) -> String {
    if handed.is_empty() { own.to_owned() } else { version_of(&format!("{own} {}", handed.join(" "))) }
}

/// Builds `plan` into a graph for the agent of `spec` on `model` (and `model_for` the models
/// its nodes name), over `checkpointer`. A plan with `agent` nodes needs [`build_with`].
///
/// # Errors
/// A model a node names that cannot be built, a tool subset the registry refuses, an `agent`
/// node, or a graph that does not compile.
pub fn build(
    plan: &Plan,
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    model_for: ModelFor<'_>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, crate::AgentError> {
    let none = |agent: &str| {
        Err(crate::AgentError::Tool {
            what: format!("{}: an `agent` node", plan.file),
            message: format!("no agents to hand a turn to here (`{agent}`): build it with the configuration's agents"),
        })
    };
    build_with(plan, spec, model, model_for, &none, checkpointer)
}

/// [`build`], with `specialists` the agents its `agent` nodes hand turns to.
///
/// # Errors
/// As [`build`]; also an agent `specialists` cannot give, and one that hands the turn back to
/// an agent already handing it on (a loop).
pub fn build_with(
    plan: &Plan,
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    model_for: ModelFor<'_>,
    specialists: SpecialistFor<'_>,
    checkpointer: Arc<dyn Checkpointer>,
) -> Result<CompiledGraph<AgentState, AgentDeps>, crate::AgentError> {
    let mut g = StateGraph::<AgentState, AgentDeps>::new();
    let mut chain = vec![spec.name.clone()];
    let top = Scope { prefix: String::new(), last_message: false, deps: None };
    let version = add_plan(&mut g, plan, &spec, &model, model_for, specialists, &top, &mut chain)?;
    g.add_edge(START, runtime_start(plan, &top));
    g.set_recovery(crate::kit::recover);
    g.set_version(version.as_str());
    Ok(g.compile(AgentDeps::new(spec, model), checkpointer)?)
}

/// Where a plan's graph sits in the graph that runs it.
struct Scope {
    /// See [`nodes::GraphInfo::prefix`].
    prefix: String,
    /// Its model nodes read only the person's last message (`input = "last_message"`).
    last_message: bool,
    /// The dependencies its nodes run with, when not the graph's own (another agent's).
    deps: Option<Arc<AgentDeps>>,
}

fn runtime_start(plan: &Plan, scope: &Scope) -> String {
    format!("{}{}", scope.prefix, plan.start)
}

/// Adds `node` under `name`, run with the scope's dependencies when it has its own.
fn add<N: toolgraph_graph::Node<AgentState, AgentDeps>>(
    g: &mut StateGraph<AgentState, AgentDeps>,
    scope: &Scope,
    name: String,
    node: N,
) {
    match &scope.deps {
        Some(deps) => g.add_node(name, nodes::WithDeps { deps: Arc::clone(deps), node }),
        None => g.add_node(name, node),
    };
}

/// Adds the nodes and edges of `plan` (the agent of `spec`) to `g`, within `scope`; `chain`
/// is the agents handing turns on down to it. Returns the plan's version with those of the
/// agents it hands turns to ([`combined_version`]).
#[allow(clippy::too_many_arguments, clippy::too_many_lines)] // one arm per step kind
fn add_plan(
    g: &mut StateGraph<AgentState, AgentDeps>,
    plan: &Plan,
    spec: &AgentSpec,
    model: &Arc<dyn ChatModel>,
    model_for: ModelFor<'_>,
    specialists: SpecialistFor<'_>,
    scope: &Scope,
    chain: &mut Vec<String>,
) -> Result<String, crate::AgentError> {
    use check::Step;
    let info = Arc::new(GraphInfo {
        agent: spec.name.clone(),
        channels: plan.channels.clone(),
        prefix: scope.prefix.clone(),
        system_prompt: spec.system_prompt.clone(),
    });
    let mut max_failures = std::collections::BTreeMap::new();
    let mut handed = Vec::new();
    // The node whose exit each planned node's is: itself, except for an `agent` node, whose
    // exit leaves from where its agent's run ends.
    let mut exits_from = std::collections::BTreeMap::new();
    for node in &plan.nodes {
        let name = info.node(&node.name);
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
                message,
                fallback,
                must_mention,
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
                    None => Arc::clone(model),
                };
                let output = match output {
                    Some(o) => {
                        // Compiled when the plan was checked.
                        let validator = o.schema.as_ref().map(jsonschema::validator_for).transpose().map_err(|e| {
                            crate::AgentError::Tool {
                                what: format!("{}: nodes.{}.output.schema", plan.file, node.name),
                                message: e.to_string(),
                            }
                        })?;
                        Some((o.clone(), validator))
                    }
                    None => None,
                };
                let history = if scope.last_message { format::History::LastMessage } else { *history };
                let step = ModelNode {
                    info: Arc::clone(&info),
                    prompt: prompt.clone(),
                    deps: AgentDeps::new(own, node_model),
                    history,
                    output,
                    rules: crate::kit::StepRules {
                        require_call: *require_call,
                        grounded: *cite,
                        reply_needs_tools: *reply_needs_tools,
                    },
                    message: message.clone(),
                    fallback: fallback.clone(),
                    must_mention: must_mention.clone(),
                };
                add(g, scope, name.clone(), step);
            }
            Step::Tools { approved, max_failures: max, allowed, .. } => {
                let approved = info.node(approved);
                add(g, scope, name.clone(), ToolsNode { approved: approved.clone(), allowed: allowed.clone() });
                g.add_resume(name.clone(), approved);
                max_failures.insert(node.name.clone(), max.unwrap_or(spec.max_tool_retries));
            }
            Step::Approved => add(g, scope, name.clone(), crate::kit::approved_node),
            Step::Execute => add(g, scope, name.clone(), crate::kit::execute_node),
            Step::GiveUp => add(g, scope, name.clone(), crate::kit::give_up_node),
            Step::Tool { tool, arguments, never_fail, channel } => {
                let step = ToolNode {
                    info: Arc::clone(&info),
                    tool: tool.clone(),
                    arguments: arguments.clone(),
                    never_fail: *never_fail,
                    channel: channel.clone(),
                };
                add(g, scope, name.clone(), step);
            }
            Step::Retrieve { tool, query, top_k, channel, skip_small_talk } => {
                let step = RetrieveNode {
                    info: Arc::clone(&info),
                    tool: tool.clone(),
                    query: query.clone(),
                    top_k: *top_k,
                    channel: channel.clone(),
                    skip_small_talk: *skip_small_talk,
                };
                add(g, scope, name.clone(), step);
            }
            Step::Cite { text, passages, channel } => {
                let step = CiteNode {
                    info: Arc::clone(&info),
                    text: text.clone(),
                    passages: passages.clone(),
                    channel: channel.clone(),
                };
                add(g, scope, name.clone(), step);
            }
            Step::Reply { text } => {
                add(g, scope, name.clone(), ReplyNode { info: Arc::clone(&info), text: text.clone() });
            }
            Step::Route => add(g, scope, name.clone(), RouteNode),
            Step::Ask { question, form, answered } => {
                let answered = info.node(answered);
                let step = AskNode {
                    info: Arc::clone(&info),
                    question: question.clone(),
                    form: form.clone(),
                    answered: answered.clone(),
                };
                add(g, scope, name.clone(), step);
                g.add_resume(name.clone(), answered);
            }
            Step::Custom { kind, with, channel } => {
                let decl = CustomNode {
                    name: name.clone(),
                    with: with.clone(),
                    channel: channel.as_ref().map(|c| {
                        (format!("{}{c}", scope.prefix), plan.channels.get(c).map(|d| d.reducer).unwrap_or_default())
                    }),
                };
                let step = kind.kind.node(&decl).map_err(|message| crate::AgentError::Tool {
                    what: format!("{}: nodes.{} (kind `{}`)", plan.file, node.name, kind.name),
                    message,
                })?;
                add(g, scope, name.clone(), custom::Custom(step));
            }
            Step::Answered { channel } => {
                add(g, scope, name.clone(), AnsweredNode { info: Arc::clone(&info), channel: channel.clone() });
            }
            Step::Agent { agent, input, channel } => {
                if chain.iter().any(|a| a == agent) {
                    return Err(crate::AgentError::Tool {
                        what: format!("{}: nodes.{}.agent", plan.file, node.name),
                        message: format!(
                            "{} → {agent}: an agent may not hand a turn to itself or to one handing it on",
                            chain.join(" → ")
                        ),
                    });
                }
                let other = specialists(agent)?;
                let inner = Scope {
                    prefix: format!("{name}/"),
                    last_message: scope.last_message || *input == format::Input::LastMessage,
                    deps: Some(Arc::new(AgentDeps::new(other.spec.clone(), Arc::clone(&other.model)))),
                };
                // The handing node itself only leads into the other agent's graph, whose end
                // leads out by the handing node's exit.
                add(g, scope, name.clone(), RouteNode);
                g.add_edge(name.clone(), runtime_start(&other.plan, &inner));
                chain.push(agent.clone());
                let version =
                    add_plan(g, &other.plan, &other.spec, &other.model, &*other.model_for, specialists, &inner, chain)?;
                chain.pop();
                handed.push(version);
                let end = format!("{name}/{}", check::END_NAME);
                add(g, scope, end.clone(), HandedBack { info: Arc::clone(&info), channel: channel.clone() });
                exits_from.insert(node.name.clone(), end);
            }
        }
    }
    for node in &plan.nodes {
        let from = exits_from.get(&node.name).cloned().unwrap_or_else(|| info.node(&node.name));
        let max = max_failures.get(&node.name).copied().unwrap_or(spec.max_tool_retries);
        match router(&info, &node.exit, max) {
            None => {
                if let check::Exit::Next(to) = &node.exit {
                    g.add_edge(from, info.node(to));
                }
            }
            Some(route) => {
                let targets: Vec<String> = node.exit.targets().into_iter().map(|t| info.node(t)).collect();
                g.add_conditional_edges(from, move |s: &AgentState| route(s), targets);
            }
        }
    }
    Ok(combined_version(&plan.version, &handed))
}
