//! The agents toolgraph ships: the prebuilt ReAct agent and the example agents built on it,
//! and their assembly from configuration.
//!
//! Owns: what every agent here is built from ([`kit`]: the state, the settings, tools in a
//! turn, the model and tools steps); graphs declared in TOML ([`declared`]: the file format,
//! its load-time checks, the node kinds); the ReAct agent ([`react`]: a model node and tool
//! nodes, write tools paused for a person's approval, built from its declaration) and what its
//! turns add to a conversation ([`conversation`]); the one
//! interface the chat service runs every agent through ([`chat_agent`]), and an agent whose
//! definition changes while it serves ([`versions`]); agents from
//! `[agents.NAME]` ([`assembly`]); the example agents' own tools and contracts — the course
//! tutor's retrieval ([`course`]) and the academy admin's SQL, backend tools and schema prompt
//! ([`academy`]); and what `toolgraph mcp` exports ([`mcp`]).
//!
//! Does not own: the graph runtime (the graph crate, which knows no model or tool), the model
//! client, tools in general or retrieval (the llm, tools and rag crates, below this one), or
//! serving agents over HTTP (the server crate, above it).
//!
//! ```
//! use toolgraph_agents::react::ReactNode;
//! assert_eq!(ReactNode::of("agent"), Some(ReactNode::Model));
//! assert!(toolgraph_agents::assembly::mermaid(toolgraph_config::AgentGraph::React).contains("give_up"));
//! ```
#![warn(missing_docs)]

pub mod academy;
pub mod assembly;
pub mod chat_agent;
pub mod conversation;
pub mod course;
pub mod crisis;
pub mod declared;
pub mod kit;
pub mod legal;
pub mod mcp;
pub mod memory;
pub mod react;
pub mod sources;
pub mod versions;
mod words;

/// An agent that cannot be assembled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No agent of that name is configured.
    #[error("no agent named '{name}'; configured agents: {known}")]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The configured names, comma-separated.
        known: String,
    },
    /// An agent enables a tool that no part of the configuration provides.
    #[error("agent '{agent}' enables a tool that does not exist: {source}")]
    UnknownTool {
        /// The agent.
        agent: String,
        /// Which tool, and the ones there are.
        #[source]
        source: toolgraph_tools::RegistryError,
    },
    /// Neither a model endpoint nor an in-process model is configured.
    #[error(
        "no model endpoint is configured: set TOOLGRAPH_LLM_BASE_URL and TOOLGRAPH_LLM_MODEL to any \
         OpenAI-compatible server (e.g. http://127.0.0.1:11434/v1 for Ollama), or run a local model with \
         TOOLGRAPH_LLM_LOCAL_MODEL=0.5b (weights: scripts/fetch-models chat-0.5b), or [llm] in toolgraph.toml"
    )]
    NoModel,
    /// The model client cannot be built.
    #[error(transparent)]
    Model(#[from] toolgraph_llm::LlmError),
    /// Two tools share a name.
    #[error(transparent)]
    Registry(#[from] toolgraph_tools::RegistryError),
    /// A configured tool cannot be made (its schema or name is invalid).
    #[error("{what}: {message}")]
    Tool {
        /// The tool or the configuration key that declares it.
        what: String,
        /// Why.
        message: String,
    },
    /// The SQL database of `tools.sql_database` cannot be opened.
    #[error(transparent)]
    Sql(#[from] academy::sql::SqlError),
    /// The backend client cannot be built.
    #[error("cannot build the backend client: {0}")]
    Backend(String),
    /// The teaching guides cannot be opened.
    #[error("cannot open the teaching guides: {0}")]
    Guides(#[from] course::guides::GuideError),
    /// The agent's graph does not compile.
    #[error("cannot build the agent graph: {0}")]
    Graph(#[from] toolgraph_graph::GraphBuildError),
    /// A declared graph (`graph_file`) does not pass its checks.
    #[error("the agent's graph declaration is not valid:\n{0}")]
    Declared(#[from] declared::DeclErrors),
    /// The PostgreSQL database of `database_url` cannot be reached.
    #[error("cannot open the PostgreSQL database at {0}")]
    Database(String),
}

impl AgentError {
    /// A [`AgentError::Tool`] maker for `map_err`, naming `what`.
    pub(crate) fn tool<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> Self + '_ {
        move |e| Self::Tool { what: what.to_owned(), message: e.to_string() }
    }
}
