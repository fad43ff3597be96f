//! [`GraphSources`]: the declaration texts an agent's graph is built from — its `graph_file`'s,
//! or its built-in graph's ([`declaration`]) — read once, so its version, its build and the copy
//! kept for runs paused on it agree (docs/agents.md, "Changing a graph while serving"). What
//! builds a kept copy again is `assembly::KeptVersions`.

use crate::AgentError;
use crate::declared::format::{GraphFile, NodeKind};
use crate::declared::{DeclError, DeclErrors, combined_version, version_of};
use crate::react;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toolgraph_config::{AgentGraph, AgentSettings, Config};

/// What one version of an agent's graph is built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphSources {
    /// The agent's own declaration: its `graph_file`'s text, or its built-in graph's.
    pub own: String,
    /// The declarations of the agents its `agent` nodes hand turns to, directly or through
    /// another, by agent name.
    pub handed: BTreeMap<String, String>,
}

impl GraphSources {
    /// Reads agent `name`'s declaration and those of the agents it hands turns to, as the
    /// files are now. Agents the configuration lacks are left out (the build names them).
    ///
    /// # Errors
    /// A graph file that cannot be read, named as the build names it.
    pub fn read(cfg: &Config, name: &str) -> Result<Self, AgentError> {
        let agents = cfg.effective_agents();
        let Some(settings) = agents.get(name) else {
            let known = agents.keys().cloned().collect::<Vec<_>>().join(", ");
            return Err(AgentError::UnknownAgent { name: name.to_owned(), known });
        };
        let mut sources = Self { own: declaration_text(settings)?, handed: BTreeMap::new() };
        let mut pending = handed_names(&sources.own);
        while let Some(other) = pending.pop() {
            if other == name || sources.handed.contains_key(&other) {
                continue;
            }
            let Some(settings) = agents.get(&other) else { continue };
            let text = declaration_text(settings)?;
            pending.extend(handed_names(&text));
            sources.handed.insert(other, text);
        }
        Ok(sources)
    }

    /// The declaration of `agent` in these sources, those of agent `own_name`.
    pub fn text_of(&self, own_name: &str, agent: &str) -> Option<&str> {
        if agent == own_name { Some(&self.own) } else { self.handed.get(agent).map(String::as_str) }
    }

    /// The version a graph built from these sources has, for agent `name`: its declaration's
    /// digest, combined with those of the agents it hands turns to in name order (as the build
    /// computes it: [`combined_version`]).
    pub fn version(&self, name: &str) -> String {
        self.version_in(name, name, &mut Vec::new())
    }

    fn version_in(&self, own_name: &str, agent: &str, chain: &mut Vec<String>) -> String {
        let Some(text) = self.text_of(own_name, agent) else { return String::new() };
        let own = version_of(text);
        // A loop, or a file that does not parse, is refused by the build; its own text decides.
        let Ok(file) = toml::from_str::<GraphFile>(text) else { return own };
        if chain.iter().any(|a| a == agent) {
            return own;
        }
        chain.push(agent.to_owned());
        let handed: Vec<String> = file
            .nodes
            .values()
            .filter(|n| n.kind == NodeKind::Agent)
            .filter_map(|n| n.agent.as_deref())
            .map(|other| self.version_in(own_name, other, chain))
            .collect();
        chain.pop();
        combined_version(&own, &handed)
    }

    /// The sources as kept in the checkpoint store.
    pub fn to_json(&self) -> String {
        // A struct of strings always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Sources kept as [`GraphSources::to_json`] wrote them.
    ///
    /// # Errors
    /// Text that is not such a document.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// The agents `text`'s `agent` nodes name; none when it does not parse (the build says why).
fn handed_names(text: &str) -> Vec<String> {
    let Ok(file) = toml::from_str::<GraphFile>(text) else { return Vec::new() };
    file.nodes.values().filter(|n| n.kind == NodeKind::Agent).filter_map(|n| n.agent.clone()).collect()
}

/// Where an agent's graph is declared: the file its `graph_file` names, or the declaration of
/// the built-in graph it runs (every built-in graph is one).
pub(crate) enum Declaration<'a> {
    File(&'a std::path::Path),
    BuiltIn {
        /// Its path in the repository, for errors.
        file: &'static str,
        text: &'static str,
        /// The tools its nodes call, and what provides them.
        needs: &'static [&'static str],
        provider: &'static str,
        /// The grounded ReAct agent: its prompt gains the grounding instruction.
        grounded: bool,
    },
}

/// The text of the declaration of the agent of `settings`, as it is now.
///
/// # Errors
/// A graph file that cannot be read.
pub(crate) fn declaration_text(settings: &AgentSettings) -> Result<String, AgentError> {
    match declaration(settings) {
        Declaration::File(file) => std::fs::read_to_string(file).map_err(|e| unreadable(file, &e)),
        Declaration::BuiltIn { text, .. } => Ok(text.to_owned()),
    }
}

/// The declaration of the agent of `settings`.
pub(crate) fn declaration(settings: &AgentSettings) -> Declaration<'_> {
    let built_in =
        |file, text, needs, provider, grounded| Declaration::BuiltIn { file, text, needs, provider, grounded };
    match (&settings.graph_file, settings.graph) {
        (Some(file), _) => Declaration::File(file),
        (None, AgentGraph::React) if settings.effective_grounding() == toolgraph_config::Grounding::RetrieveFirst => {
            built_in(
                "examples/agents/grounded.toml",
                react::GROUNDED_DECLARATION,
                &["rag_search"],
                "[rag] (grounding = \"retrieve_first\" searches first)",
                true,
            )
        }
        (None, AgentGraph::React) => built_in("examples/agents/react.toml", react::DECLARATION, &[], "", false),
        (None, AgentGraph::LegalPipeline) => built_in(
            "examples/agents/legal.toml",
            crate::legal::pipeline::DECLARATION,
            &crate::legal::pipeline::TOOLS,
            "[tools.legal]",
            false,
        ),
        (None, AgentGraph::CrisisCompanion) => built_in(
            "examples/agents/crisis.toml",
            crate::crisis::graph::DECLARATION,
            &[crate::crisis::TOOL_NAME],
            "[tools.crisis]",
            false,
        ),
    }
}

/// The error a graph file that cannot be read gets: the file, and why.
pub(crate) fn unreadable(file: &std::path::Path, e: &std::io::Error) -> AgentError {
    AgentError::Declared(DeclErrors(vec![DeclError {
        file: file.display().to_string(),
        line: 1,
        field: String::new(),
        message: format!("cannot read it: {e}"),
    }]))
}
