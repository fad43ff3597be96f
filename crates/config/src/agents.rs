//! `[agents.NAME]`: the agents a process runs.

use crate::{Check, ConfigError};
use serde::{Deserialize, Serialize};

/// `[agents.NAME]`: a prebuilt ReAct agent (docs/configuration.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// System prompt. Default: a short generic assistant prompt.
    pub system_prompt: String,
    /// Model name, overriding `llm.model` for this agent.
    pub model: Option<String>,
    /// Names of the tools the agent may call. Default: every built-in tool.
    pub tools: Option<Vec<String>>,
    /// State keys a request may set in its `context` (for state-injected tool arguments).
    pub state_keys: Vec<String>,
    /// Approximate token budget of the history the model sees (0: no limit). Default: 6000.
    pub history_budget: usize,
    /// What becomes of the turns that no longer fit `history_budget`: `drop` (the model no
    /// longer sees them) or `summarise` (a model call summarises them, and the model reads the
    /// summary; docs/memory.md, "Context that fits"). Default: `drop`.
    pub older_turns: OlderTurns,
    /// Rounds of failing read tools per turn before giving up. Default: 3.
    pub max_tool_retries: u32,
    /// Most graph steps per run. Default: 10.
    pub recursion_limit: u32,
    /// The knowledge base this agent's `rag_search` (and `generate_test`'s grounding) reads.
    /// Default: `rag.default_kb`.
    pub kb: Option<String>,
    /// Sampling temperature. Default: the model server's.
    pub temperature: Option<f32>,
    /// Most tokens the model may generate per call (sent as `max_tokens`). Default: the model
    /// server's (512 for the in-process model).
    pub max_tokens: Option<u32>,
    /// When a turn's answer used search results (tool results with `metadata.citation`) but
    /// cites none of them, append their citations to it (`citation::sources_footer` of the
    /// retrieval crate), with `grounding = "tool"`. Default: true.
    pub cite_sources: bool,
    /// How the agent's answers stand on its documents (docs/retrieval.md, "Grounded answers"):
    /// `retrieve_first` (search before the model answers, cite each sentence, drop what no
    /// source holds, say so when the documents do not hold the answer), `tool` (the model calls
    /// `rag_search` when it decides to) or `off`. Default: `retrieve_first` for a `react` agent
    /// whose `tools` list `rag_search`, else `tool`.
    pub grounding: Option<Grounding>,
    /// A grounded answer to a question of its own is given only when the documents the search
    /// found (the first passage, or all of them) make the question at least this much more
    /// likely — the mean gain in log-probability per token of the question (nats) — than it is
    /// without them; below, the agent says the documents do not hold the answer, without asking
    /// the model. Judged only with a model that reports a prompt's probabilities (the in-process
    /// model); 0 turns it off (docs/retrieval.md, "Grounded answers"). Default: 0.25.
    pub min_question_gain: Option<f32>,
    /// The agent's graph: `react` (a model that picks tools, the default), `legal_pipeline`
    /// (retrieve the laws, answer from them, cite them: a fixed pipeline, docs/legal.md) or
    /// `crisis_companion` (a safety gate before every reply, docs/crisis.md).
    pub graph: AgentGraph,
    /// A graph declared in TOML (docs/agents.md), instead of a built-in `graph`: the file's path,
    /// relative to the configuration file's directory (to the working directory when the
    /// setting comes from no file).
    pub graph_file: Option<std::path::PathBuf>,
    /// `[agents.NAME.memory]`: what the agent remembers about the person it talks with, across
    /// conversations (docs/memory.md). Default: none (no memory tools, nothing recalled).
    pub memory: Option<MemorySettings>,
}

/// `[agents.NAME.memory]`: an agent's long-term memory of each person, kept in the person's
/// store of items (docs/memory.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySettings {
    /// Give the model the tools `remember`, `recall` and `forget`. Default: true.
    pub tools: bool,
    /// `remember` and `forget` ask the person's approval before they write, as write tools do.
    /// Default: false.
    pub approve_writes: bool,
    /// Before each model call, put this many of the person's latest remembered items in the
    /// prompt (0: none). Default: 5.
    pub recall: usize,
    /// Where in the person's store the agent's memories live. Agents given the same namespace
    /// share what they remember of a person. Default: the agent's own, `["memories", NAME]`.
    pub namespace: Option<Vec<String>>,
    /// Days a remembered item lives after it was last written or recalled (none: until
    /// forgotten). Default: none.
    pub ttl_days: Option<u32>,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self { tools: true, approve_writes: false, recall: 5, namespace: None, ttl_days: None }
    }
}

/// Largest [`AgentSettings::min_question_gain`]: a question made this much likelier per token
/// by a passage is one it spells out.
pub const MAX_QUESTION_GAIN: f32 = 10.0;

/// Most items [`MemorySettings::recall`] may put in a prompt.
pub const MAX_RECALL: usize = 20;

/// What becomes of the turns beyond an agent's history budget ([`AgentSettings::older_turns`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OlderTurns {
    /// The model no longer sees them.
    #[default]
    Drop,
    /// They are summarised, and the model reads the summary.
    Summarise,
}

/// How an agent's answers stand on its documents ([`AgentSettings::grounding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grounding {
    /// Search first, answer from the results, cite, drop the unsupported, or abstain.
    RetrieveFirst,
    /// The model searches when it decides to; `cite_sources` appends the sources it read.
    Tool,
    /// Neither.
    Off,
}

/// Which graph an agent runs ([`AgentSettings::graph`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentGraph {
    /// The ReAct agent: the model calls tools until it answers.
    #[default]
    React,
    /// `retrieve_laws` → `generate_answer` → `format_citation`, with no tool choice by the model.
    LegalPipeline,
    /// `crisis_gate` → (risk words) `crisis_screen` → (risk) `crisis_response` → `crisis_reply`, else the
    /// ordinary reply (`examples/agents/crisis.toml`).
    CrisisCompanion,
}

impl AgentGraph {
    /// The name used in configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::React => "react",
            Self::LegalPipeline => "legal_pipeline",
            Self::CrisisCompanion => "crisis_companion",
        }
    }
}

/// The system prompt of agents that set none.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant. Use the tools when they help; \
say plainly when you do not know. Tools that change something ask the user for approval first.";

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            system_prompt: DEFAULT_SYSTEM_PROMPT.into(),
            model: None,
            tools: None,
            state_keys: Vec::new(),
            history_budget: 6000,
            older_turns: OlderTurns::Drop,
            max_tool_retries: 3,
            recursion_limit: 10,
            kb: None,
            temperature: None,
            max_tokens: None,
            cite_sources: true,
            grounding: None,
            min_question_gain: None,
            graph: AgentGraph::React,
            graph_file: None,
            memory: None,
        }
    }
}

impl AgentSettings {
    /// How the agent's answers stand on its documents: its `grounding`, or the default (see
    /// [`AgentSettings::grounding`]).
    pub fn effective_grounding(&self) -> Grounding {
        let searches = self.tools.as_ref().is_some_and(|t| t.iter().any(|n| n == "rag_search"));
        match self.grounding {
            Some(g) => g,
            None if searches && self.graph == AgentGraph::React && self.graph_file.is_none() => {
                Grounding::RetrieveFirst
            }
            None => Grounding::Tool,
        }
    }

    pub(crate) fn validate(&self, name: &str, check: &Check<'_>) -> Result<(), ConfigError> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(check.invalid(&format!("agents.{name}"), "agent names use letters, digits, '_' and '-'".into()));
        }
        if self.recursion_limit == 0 {
            return Err(check.invalid(&format!("agents.{name}.recursion_limit"), "must be greater than 0".into()));
        }
        if let Some(kb) = &self.kb {
            // The knowledge base's name becomes a directory: the rules of `toolgraph ingest --kb`.
            let ok = !kb.is_empty()
                && kb.len() <= 64
                && !kb.starts_with('.')
                && kb.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                return Err(check.invalid(
                    &format!("agents.{name}.kb"),
                    format!("`{kb}`: use 1-64 letters, digits, `_`, `-` or `.`, not starting with `.`"),
                ));
            }
        }
        if self.graph_file.is_some() && self.graph != AgentGraph::React {
            return Err(check.invalid(
                &format!("agents.{name}.graph_file"),
                format!(
                    "set `graph` (a built-in graph) or `graph_file` (a declared one), not both: graph = \"{}\"",
                    self.graph.as_str()
                ),
            ));
        }
        if let Some(gain) = self.min_question_gain
            && !(0.0..=MAX_QUESTION_GAIN).contains(&gain)
        {
            return Err(check.invalid(
                &format!("agents.{name}.min_question_gain"),
                format!("{gain}: a gain in nats per token from 0 (off) to {MAX_QUESTION_GAIN}"),
            ));
        }
        let declared = self.graph_file.is_some() || self.graph != AgentGraph::React;
        if self.grounding == Some(Grounding::RetrieveFirst) && declared {
            return Err(check.invalid(
                &format!("agents.{name}.grounding"),
                "`retrieve_first` is for the `react` graph; a declared graph searches with a `retrieve` node and \
                 checks its replies with `cite = true` on its `model` node (docs/agents.md)"
                    .into(),
            ));
        }
        if self.older_turns == OlderTurns::Summarise && self.graph != AgentGraph::React {
            return Err(check.invalid(
                &format!("agents.{name}.older_turns"),
                format!(
                    "the `{}` graph does not read the conversation's window: `summarise` is for the `react` graph \
                     or a declared one",
                    self.graph.as_str()
                ),
            ));
        }
        if self.older_turns == OlderTurns::Summarise && self.history_budget == 0 {
            return Err(check.invalid(
                &format!("agents.{name}.older_turns"),
                "`summarise` needs a `history_budget` (0 keeps every turn: nothing is ever summarised)".into(),
            ));
        }
        if let Some(memory) = &self.memory {
            let at = |key: &str| format!("agents.{name}.memory.{key}");
            if memory.recall > MAX_RECALL {
                return Err(check.invalid(&at("recall"), format!("at most {MAX_RECALL} items")));
            }
            let label_ok = |l: &String| {
                !l.is_empty() && l.len() <= 64 && l.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-'))
            };
            if let Some(namespace) = &memory.namespace
                && (namespace.is_empty() || namespace.len() > 4 || !namespace.iter().all(label_ok))
            {
                return Err(check.invalid(
                    &at("namespace"),
                    "1 to 4 labels of 1-64 letters, digits, `_` or `-`, such as [\"memories\"]".into(),
                ));
            }
            if self.graph != AgentGraph::React {
                return Err(check.invalid(
                    &format!("agents.{name}.memory"),
                    format!(
                        "the `{}` graph neither offers tools to its model nor reads what is recalled: memory is \
                         for the `react` graph or a declared one",
                        self.graph.as_str()
                    ),
                ));
            }
            if memory.ttl_days == Some(0) {
                return Err(check.invalid(&at("ttl_days"), "must be greater than 0 (leave it out: no expiry)".into()));
            }
            if !memory.tools && memory.recall == 0 {
                return Err(check.invalid(
                    &at("recall"),
                    "with `tools = false` and `recall = 0` the agent neither remembers nor recalls: remove the \
                     section instead"
                        .into(),
                ));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(check.invalid(&format!("agents.{name}.max_tokens"), "must be greater than 0".into()));
        }
        Ok(())
    }
}
