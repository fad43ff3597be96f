//! Agents from configuration: `[agents.NAME]` becomes a ReAct agent with its model client, its
//! enabled tools out of the process's [`SharedParts`], and its graph over a checkpoint store.

use crate::AgentError;
use crate::academy::{BackendWriteTool, backend_general_query, tenant_schema_prompt};
use crate::chat_agent::{ChatAgent, GraphAgent};
use crate::conversation::DeclaredChannels;
use crate::course::guides::GuideStore;
use crate::course::test_gen::{Grounding, TestGenerator};
use crate::kit::{AgentDeps, AgentSpec, AgentState, PromptContext};
use crate::react;
use crate::sources::{Declaration, GraphSources, declaration};
use crate::versions::VersionBuilder;
use async_trait::async_trait;
use std::sync::Arc;
use toolgraph_config::{AgentGraph, AgentSettings, Config, DatabasePooling, StoreKind};
use toolgraph_conversations::backend::{BackendConversationStore, BackendOptions};
use toolgraph_graph::{Checkpointer, CompiledGraph, PgDatabase, PgPooling};
use toolgraph_llm::{ChatModel, OpenAiChatModel};
use toolgraph_rag::{KbStore, Retriever};
use toolgraph_tools::{ToolRegistry, builtin};

/// A ready-to-run agent.
pub struct Agent {
    /// Its name (`[agents.NAME]`, or the built-in `assistant`).
    pub name: String,
    /// Its settings.
    pub settings: AgentSettings,
    /// Its graph.
    pub graph: CompiledAgent,
    /// The channels its declaration keeps: those marked `writable` are what a state update
    /// from outside a run may write besides messages ([`chat_agent`]).
    pub channels: DeclaredChannels,
}

/// An assembled agent's compiled graph.
pub type CompiledAgent = CompiledGraph<AgentState, AgentDeps>;

/// `graph`, served: a state update from outside a run writes messages and the `writable` ones
/// of `channels`, the channels its declaration keeps
/// ([`declared_update`](crate::conversation::declared_update)).
pub fn chat_agent(graph: CompiledAgent, channels: &DeclaredChannels) -> GraphAgent<AgentState, AgentDeps> {
    let channels = channels.clone();
    GraphAgent::new(graph).with_state_updates(Arc::new(move |state, values| {
        crate::conversation::declared_update(state, values, &channels)
    }))
}

/// What every agent of a process shares: the tools (built once: a tool may hold a database
/// pool), the in-process model when one is loaded, and the tenant-schema prompt of agents that
/// query the backend.
pub struct SharedParts {
    /// Every tool the configuration enables; an agent gets its `tools` out of these.
    pub tools: ToolRegistry,
    /// The in-process chat model, used instead of an endpoint when set.
    pub local_model: Option<Arc<dyn ChatModel>>,
    /// See [`schema_prompt`]; joins the system prompt of agents that may call `general_query`.
    pub schema_prompt: Option<PromptContext>,
    /// Node kinds of the program's own, for declared graphs (none in `toolgraph` itself;
    /// a program that embeds it registers its own: docs/agents.md).
    pub kinds: crate::declared::NodeKinds,
    /// The store that keeps each person's memory, for agents with `[agents.NAME.memory]`
    /// (none in a command that opens no conversation store: their memory tools then refuse).
    pub memory_store: Option<Arc<dyn toolgraph_conversations::ConversationStore>>,
    /// The embedding model and fusion that search the memory store's items by meaning too
    /// (`server.item_search = "hybrid"`); none: by their words.
    pub item_index: Option<Retriever>,
}

/// The model of `settings`: `local` when given (the in-process model), else the configured
/// endpoint, or an error saying how to configure one.
///
/// # Errors
/// [`AgentError::NoModel`] without either; [`AgentError::Model`] when the client cannot be built.
pub fn model(
    cfg: &Config,
    settings: &AgentSettings,
    local: Option<&Arc<dyn ChatModel>>,
) -> Result<Arc<dyn ChatModel>, AgentError> {
    if let Some(m) = local {
        return Ok(Arc::clone(m));
    }
    let Some(mut client) = cfg.llm.openai_config() else { return Err(AgentError::NoModel) };
    if let Some(m) = &settings.model {
        client.model = m.clone();
    }
    Ok(Arc::new(OpenAiChatModel::new(client)?))
}

/// Where the teaching guides are: PostgreSQL when `database_url` is set, else
/// `<data_dir>/guides.db`.
///
/// # Errors
/// When the database cannot be opened.
pub async fn guide_store(cfg: &Config) -> Result<GuideStore, AgentError> {
    Ok(match postgres_database(cfg, 4).await? {
        Some(db) => GuideStore::open_postgres_database(db).await?,
        None => GuideStore::open_sqlite(&cfg.data_dir.join("guides.db")).await?,
    })
}

/// The PostgreSQL database of `database_url`, reached as `database_pooling` says (migrations
/// over `database_migration_url` when set), with a pool of at most `max_connections`; `None`
/// without `database_url`.
///
/// # Errors
/// An invalid URL, or a server that cannot be reached within 5 s.
pub async fn postgres_database(cfg: &Config, max_connections: u32) -> Result<Option<PgDatabase>, AgentError> {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use std::str::FromStr;
    let Some(url) = &cfg.database_url else { return Ok(None) };
    let err = |e: sqlx::Error| AgentError::Database(format!("{}: {e}", url.redacted_url()));
    let options = PgConnectOptions::from_str(url.expose()).map_err(err)?;
    let migrations = match &cfg.database_migration_url {
        Some(m) => Some(
            PgConnectOptions::from_str(m.expose())
                .map_err(|e| AgentError::Database(format!("{} (database_migration_url): {e}", m.redacted_url())))?,
        ),
        None => None,
    };
    let pooling = match cfg.database_pooling {
        DatabasePooling::Session => PgPooling::Session,
        DatabasePooling::Transaction => PgPooling::Transaction,
    };
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect_with(options)
        .await
        .map_err(err)?;
    Ok(Some(PgDatabase::new(pool, pooling, migrations)))
}

/// Every tool the configuration enables: the built-ins, `rag_search` over `kb` through
/// `retriever`, the course tutor's `get_guia` and `generate_test` (written by `model`) with
/// `[tools.course]`, `general_query` over `tools.sql_database`, the plugins below
/// `plugins.dirs`, and the backend's tools when `backend` is given (the client of [`backend`],
/// shared with the store and the schema prompt). `rag_search` also reads the documents
/// attached to the conversation from `attachments` (the service's; none elsewhere).
///
/// # Errors
/// A database that cannot be opened, a backend tool whose schema is invalid, two tools with
/// one name.
pub async fn all_tools(
    cfg: &Config,
    kb: Arc<KbStore>,
    retriever: Retriever,
    backend: Option<&BackendConversationStore>,
    model: Option<Arc<dyn ChatModel>>,
    attachments: Option<Arc<KbStore>>,
) -> Result<ToolRegistry, AgentError> {
    let mut all = builtin::registry(&cfg.data_dir)?;
    let (tenant, default_kb) = (cfg.rag.tenant.clone(), cfg.rag.default_kb.clone());
    all.register(crate::course::rag_search_tool(
        Arc::clone(&kb),
        retriever.clone(),
        tenant.clone(),
        default_kb.clone(),
        attachments,
    ))?;
    if let Some(course) = &cfg.tools.course {
        all.register(crate::course::guia::get_guia_tool(Arc::new(guide_store(cfg).await?), tenant.clone()))?;
        let grounding = Grounding { store: Arc::clone(&kb), retriever: retriever.clone(), kb: default_kb };
        let generator =
            TestGenerator::new(model.clone(), course.backend_url.clone(), tenant.clone()).grounded_in(grounding);
        all.register(crate::course::test_gen::generate_test_tool(generator))?;
    }
    if let Some(legal) = &cfg.tools.legal {
        let library = crate::legal::LawLibrary {
            store: Arc::clone(&kb),
            retriever: retriever.clone(),
            kb: legal.kb.clone(),
            default_tenant: tenant.clone(),
            url_template: legal.url.clone(),
            answer_articles: legal.answer_articles,
        };
        all.register(crate::legal::tools::retrieve_laws_tool(library.clone()))?;
        let writer = crate::legal::AnswerWriter { model: model.clone() };
        all.register(crate::legal::tools::generate_answer_tool(writer, library.clone()))?;
        all.register(crate::legal::tools::format_citation_tool(library))?;
    }
    if let Some(crisis) = &cfg.tools.crisis {
        let finder = crate::crisis::ResourceFinder::from_settings(crisis, model.clone())
            .map_err(AgentError::tool("tools.crisis"))?;
        all.register(crate::crisis::find_local_crisis_resources_tool(Arc::new(finder)))?;
    }
    if let Some(db) = &cfg.tools.sql_database {
        all.register(crate::academy::sql::general_query(db).await?)?;
    }
    if !cfg.plugins.dirs.is_empty() {
        for plugin in toolgraph_plugins::load_all(&cfg.plugins.dirs, &cfg.plugins.locale).await.plugins {
            // A plugin never replaces a tool of toolgraph's own: it is refused, the others load.
            if let Err(e) = plugin.register_into(&mut all) {
                tracing::error!(plugin = %plugin.name, "plugin not loaded: {e}");
            }
        }
    }
    if let Some(backend) = backend {
        // The backend runs the model's SQL and the approved writes; the service opens no
        // tenant database.
        if cfg.tools.sql_database.is_none() {
            all.register(backend_general_query(backend.clone()).map_err(AgentError::tool("general_query"))?)?;
        }
        for (name, tool) in &cfg.server.backend_tools {
            let what = format!("server.backend_tools.{name}");
            let mut built = BackendWriteTool::new(backend.clone(), name, &tool.description, tool.parameters.clone())
                .map_err(AgentError::tool(&what))?;
            if let Some(template) = &tool.describe {
                built = built.with_describe(template).map_err(AgentError::tool(&what))?;
            }
            let tool = built;
            all.register(Arc::new(tool)).map_err(AgentError::tool(&what))?;
        }
    }
    Ok(all)
}

/// The client of the backend of `server.backend_*` when `server.store = "backend"`: one per
/// process (one connection pool), for the store, the tools and the schema prompt.
///
/// # Errors
/// When the HTTP client cannot be built.
pub fn backend(cfg: &Config) -> Result<Option<BackendConversationStore>, AgentError> {
    if cfg.server.store != StoreKind::Backend {
        return Ok(None);
    }
    // Both are required with the backend store (validated when the config loaded).
    let (Some(base_url), Some(secret)) = (cfg.server.backend_url.clone(), cfg.server.backend_hmac_secret.as_ref())
    else {
        return Err(AgentError::Backend("server.backend_url and server.backend_hmac_secret are required".into()));
    };
    let options = BackendOptions {
        base_url,
        secret: secret.expose().as_bytes().to_vec(),
        timeout: std::time::Duration::from_millis(cfg.server.backend_timeout_ms),
    };
    BackendConversationStore::new(options).map(Some).map_err(|e| AgentError::Backend(e.0))
}

/// The tenant's schema for the system prompt of agents that query the backend: set when the
/// backend runs `general_query` (`store = "backend"`, no `tools.sql_database`).
pub fn schema_prompt(cfg: &Config, backend: Option<&BackendConversationStore>) -> Option<PromptContext> {
    let backend = backend.filter(|_| cfg.tools.sql_database.is_none())?;
    Some(tenant_schema_prompt(backend.clone()))
}

/// An agent whose graph calls `needed` tools must have them: else an error naming what
/// provides them.
fn need_tools(agent: &str, tools: &ToolRegistry, needed: &[&str], provider: &str) -> Result<(), AgentError> {
    match needed.iter().find(|n| tools.get(n).is_none()) {
        None => Ok(()),
        Some(missing) => Err(AgentError::Tool {
            what: format!("agents.{agent}"),
            message: format!(
                "its graph calls `{missing}`: add {provider} to the configuration and the tool to its `tools`"
            ),
        }),
    }
}

/// Agent `name` (or the default agent): its name, its settings and its tools out of `all`.
///
/// # Errors
/// An unknown agent, or a tool it names that `all` lacks.
pub fn agent_tools(
    cfg: &Config,
    name: Option<&str>,
    all: &ToolRegistry,
) -> Result<(String, AgentSettings, ToolRegistry), AgentError> {
    let name = name.map_or_else(|| cfg.default_agent_name(), str::to_owned);
    let agents = cfg.effective_agents();
    let Some(settings) = agents.get(&name).cloned() else {
        let known = agents.keys().cloned().collect::<Vec<_>>().join(", ");
        return Err(AgentError::UnknownAgent { name, known });
    };
    let tools = match &settings.tools {
        None => all.clone(),
        Some(names) => all.subset(names).map_err(|source| AgentError::UnknownTool { agent: name.clone(), source })?,
    };
    Ok((name, settings, tools))
}

/// Builds agent `name` (or the default agent) over `store`, its tools out of `shared`.
///
/// # Errors
/// An unknown agent or tool name, no model to run it on, a graph that does not compile.
pub fn build(
    cfg: &Config,
    name: Option<&str>,
    store: Arc<dyn Checkpointer>,
    shared: &SharedParts,
) -> Result<Agent, AgentError> {
    let name = name.map_or_else(|| cfg.default_agent_name(), str::to_owned);
    let sources = GraphSources::read(cfg, &name)?;
    build_from(cfg, &name, &sources, store, shared)
}

/// Builds agent `name` as [`build`] does, its graph out of `sources` (read earlier, or kept
/// for a version this process never loaded) instead of the files as they are now.
///
/// # Errors
/// As [`build`]'s, and an `agent` node naming an agent whose declaration `sources` lacks.
pub fn build_from(
    cfg: &Config,
    name: &str,
    sources: &GraphSources,
    store: Arc<dyn Checkpointer>,
    shared: &SharedParts,
) -> Result<Agent, AgentError> {
    let (name, settings, tools) = agent_tools(cfg, Some(name), &shared.tools)?;
    let spec = spec_of(&name, &settings, tools, shared)?;
    let model = model(cfg, &settings, shared.local_model.as_ref())?;
    let (graph, channels) = graph_of(cfg, &name, &settings, spec, model, shared, sources, store)?;
    Ok(Agent { name, settings, graph, channels })
}

/// The spec of agent `name`: its settings, with `tools` and, when it has a memory, the
/// memory's tools and recall.
///
/// # Errors
/// A memory tool whose name another of its tools has.
fn spec_of(
    name: &str,
    settings: &AgentSettings,
    mut tools: ToolRegistry,
    shared: &SharedParts,
) -> Result<AgentSpec, AgentError> {
    let mut recall = None;
    if let Some(memory) = &settings.memory {
        let memory = crate::memory::Memory::new(name, memory.clone(), shared.memory_store.clone())
            .indexed(shared.item_index.clone());
        for tool in memory.tools() {
            let tool_name = tool.spec().name.clone();
            tools.register(tool).map_err(|e| AgentError::Tool {
                what: format!("agents.{name}.memory"),
                message: format!("its `{tool_name}` tool: {e} (rename the other tool, or set memory.tools = false)"),
            })?;
        }
        recall = memory.recall_into_prompt();
    }
    let mut spec = AgentSpec::new(name, &settings.system_prompt, tools);
    spec.recall = recall;
    spec.history_budget = settings.history_budget;
    spec.summarise_history = settings.older_turns == toolgraph_config::OlderTurns::Summarise;
    spec.max_tool_retries = settings.max_tool_retries;
    spec.temperature = settings.temperature;
    spec.max_tokens = settings.max_tokens;
    if let Some(gain) = settings.min_question_gain {
        spec.min_question_gain = gain;
    }
    if let Some(kb) = &settings.kb {
        spec.tool_context.insert("kb".into(), kb.clone().into());
    }
    if spec.tools.get("general_query").is_some() {
        spec.prompt_context = shared.schema_prompt.clone();
    }
    if settings.cite_sources && settings.effective_grounding() == toolgraph_config::Grounding::Tool {
        spec.answer_footer = Some(Arc::new(toolgraph_rag::search::citation::sources_footer));
    }
    Ok(spec)
}

/// The models a declared graph's nodes name (`model = "…"`) for the agent of `settings`.
fn models_for(
    cfg: &Config,
    settings: &AgentSettings,
    shared: &SharedParts,
) -> impl Fn(&str) -> Result<Arc<dyn ChatModel>, AgentError> + 'static {
    let (cfg, settings, local) = (cfg.clone(), settings.clone(), shared.local_model.clone());
    move |m: &str| {
        let mut named = settings.clone();
        named.model = Some(m.to_owned());
        self::model(&cfg, &named, local.as_ref())
    }
}

/// Agent `name` ready to build: its checked declaration (`text`: its `graph_file`'s, or its
/// built-in graph's), its spec and model — as [`build`] builds it on its own, and as an `agent` node of
/// another agent's graph runs it.
///
/// # Errors
/// An unknown agent or tool, a tool its graph calls that it lacks, no model, or a declaration
/// that fails its checks.
pub fn specialist(
    cfg: &Config,
    name: &str,
    shared: &SharedParts,
    text: &str,
) -> Result<crate::declared::Specialist, AgentError> {
    let (name, settings, tools) = agent_tools(cfg, Some(name), &shared.tools)?;
    let spec = spec_of(&name, &settings, tools, shared)?;
    let model = model(cfg, &settings, shared.local_model.as_ref())?;
    let model_for = Box::new(models_for(cfg, &settings, shared));
    let (plan, spec) = plan_of(cfg, &name, &settings, spec, shared, text)?;
    Ok(crate::declared::Specialist { plan, spec, model, model_for })
}

/// The checked declaration of agent `name` (`settings`, `spec`; `text`, its declaration's), and
/// its spec as the graph runs it.
fn plan_of(
    cfg: &Config,
    name: &str,
    settings: &AgentSettings,
    mut spec: AgentSpec,
    shared: &SharedParts,
    text: &str,
) -> Result<(crate::declared::Plan, AgentSpec), AgentError> {
    let plan = match declaration(settings) {
        Declaration::File(file) => {
            declared_plan_of(cfg, &file.display().to_string(), text, &spec.tools, &shared.kinds)?
        }
        Declaration::BuiltIn { file, needs, provider, grounded, .. } => {
            need_tools(name, &spec.tools, needs, provider)?;
            if grounded {
                react::grounded_plan(&mut spec, text)?
            } else {
                let tools = spec.tools.names();
                let known = crate::declared::Known { tools: &tools, writes: &[], kinds: None, agents: &[] };
                crate::declared::check(file, text, &known).map_err(AgentError::Declared)?
            }
        }
    };
    Ok((plan, spec))
}

/// The graph of agent `name` (its settings, its `spec`, its `model`): the declaration its
/// `graph_file` names or its built-in graph's, checked against its tools, with the agents its
/// `agent` nodes hand turns to.
#[allow(clippy::too_many_arguments)] // the parts of one build, each used once
fn graph_of(
    cfg: &Config,
    name: &str,
    settings: &AgentSettings,
    spec: AgentSpec,
    model: Arc<dyn ChatModel>,
    shared: &SharedParts,
    sources: &GraphSources,
    store: Arc<dyn Checkpointer>,
) -> Result<(CompiledAgent, DeclaredChannels), AgentError> {
    let (plan, spec) = plan_of(cfg, name, settings, spec, shared, &sources.own)?;
    let channels = DeclaredChannels::of(&plan);
    let model_for = models_for(cfg, settings, shared);
    let specialists = |other: &str| match sources.text_of(name, other) {
        Some(text) => specialist(cfg, other, shared, text),
        // The configuration names the agent, but these sources were kept before it did.
        None if cfg.effective_agents().contains_key(other) => {
            Err(AgentError::Declared(crate::declared::DeclErrors(vec![crate::declared::DeclError {
                file: format!("agents.{name}"),
                line: 1,
                field: String::new(),
                message: format!("no declaration of agent `{other}` was kept with this version"),
            }])))
        }
        // Not an agent of the configuration: refused by name before any text is read.
        None => specialist(cfg, other, shared, ""),
    };
    Ok((crate::declared::build_with(&plan, spec, model, &model_for, &specialists, store)?, channels))
}

/// The declaration at `file`, checked against `tools` (the agent's), `kinds` (the program's
/// own node kinds) and the agents of `cfg` (which its `agent` nodes may hand turns to).
///
/// # Errors
/// [`AgentError::Declared`] with every problem found.
pub fn declared_plan(
    cfg: &Config,
    file: &std::path::Path,
    tools: &ToolRegistry,
    kinds: &crate::declared::NodeKinds,
) -> Result<crate::declared::Plan, AgentError> {
    let text = std::fs::read_to_string(file).map_err(|e| crate::sources::unreadable(file, &e))?;
    declared_plan_of(cfg, &file.display().to_string(), &text, tools, kinds)
}

/// [`declared_plan`] of `text`, read from `file`.
fn declared_plan_of(
    cfg: &Config,
    file: &str,
    text: &str,
    tools: &ToolRegistry,
    kinds: &crate::declared::NodeKinds,
) -> Result<crate::declared::Plan, AgentError> {
    let specs = tools.specs();
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let writes: Vec<String> =
        specs.iter().filter(|s| s.class == toolgraph_tools::ToolClass::Write).map(|s| s.name.clone()).collect();
    let agents: Vec<String> = cfg.effective_agents().into_keys().collect();
    let known = crate::declared::Known { tools: &names, writes: &writes, kinds: Some(kinds), agents: &agents };
    Ok(crate::declared::check(file, text, &known)?)
}

/// The Mermaid flowchart of agent `name` (or the default agent) with its tools out of
/// `shared`; no model is called or needed.
///
/// # Errors
/// An unknown agent or tool, or a declaration that fails its checks.
pub fn mermaid_of(cfg: &Config, name: Option<&str>, shared: &SharedParts) -> Result<String, AgentError> {
    let (name, settings, tools) = agent_tools(cfg, name, &shared.tools)?;
    let spec = AgentSpec::new(&name, &settings.system_prompt, tools);
    let sources = GraphSources::read(cfg, &name)?;
    let store = Arc::new(toolgraph_graph::MemoryCheckpointer::new());
    let never: Arc<dyn ChatModel> = Arc::new(NeverCalled);
    let drawing = SharedParts {
        tools: shared.tools.clone(),
        local_model: Some(Arc::clone(&never)),
        schema_prompt: None,
        kinds: shared.kinds.clone(),
        memory_store: None,
        item_index: None,
    };
    Ok(graph_of(cfg, &name, &settings, spec, never, &drawing, &sources, store)?.0.to_mermaid())
}

/// The model of a graph that is only drawn or checked.
struct NeverCalled;

#[async_trait::async_trait]
impl ChatModel for NeverCalled {
    async fn stream(
        &self,
        _r: toolgraph_llm::ChatRequest,
    ) -> Result<toolgraph_llm::ChatStream, toolgraph_llm::LlmError> {
        Err(toolgraph_llm::LlmError::InvalidRequest("this graph is only drawn, never run".into()))
    }
    fn model_id(&self) -> &str {
        "none"
    }
}

/// The topology of a built-in graph `kind` as a Mermaid flowchart (no model, tools or store
/// needed).
pub fn mermaid(kind: AgentGraph) -> String {
    let store = Arc::new(toolgraph_graph::MemoryCheckpointer::new());
    let spec = AgentSpec::new("draw", "", ToolRegistry::new());
    let model: Arc<dyn ChatModel> = Arc::new(NeverCalled);
    let graph = match kind {
        AgentGraph::React => react::build(spec, model, store),
        AgentGraph::LegalPipeline => crate::legal::pipeline::build(spec, model, store),
        AgentGraph::CrisisCompanion => crate::crisis::graph::build(spec, model, store),
    };
    match graph {
        Ok(g) => g.to_mermaid(),
        Err(e) => format!("%% the {} graph does not compile: {e}", kind.as_str()),
    }
}

/// Builds agent `name` again at a version this process never loaded — it paused before a
/// restart, or on another replica — from the [`GraphSources`] its checkpoint store kept, with
/// the configuration and tools the process runs with now.
pub struct KeptVersions {
    /// The configuration the process serves.
    pub cfg: Arc<Config>,
    /// What its agents share.
    pub shared: Arc<SharedParts>,
    /// Where checkpoints, and the versions' sources, are kept.
    pub checkpointer: Arc<dyn Checkpointer>,
    /// The agent.
    pub name: String,
}

impl KeptVersions {
    /// Keeps `sources`, the sources of `version`, so runs paused on it can be resumed on it by
    /// any process on this store.
    ///
    /// # Errors
    /// The store's.
    pub async fn keep(&self, version: &str, sources: &GraphSources) -> Result<(), toolgraph_graph::CheckpointError> {
        self.checkpointer.keep_definition(version, &sources.to_json()).await
    }
}

#[async_trait]
impl VersionBuilder for KeptVersions {
    async fn build(&self, version: &str) -> Result<Option<Arc<dyn ChatAgent>>, String> {
        let Some(kept) = self.checkpointer.definition(version).await.map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let sources = GraphSources::from_json(&kept).map_err(|e| format!("the kept sources do not read: {e}"))?;
        let (cfg, shared, store, name) =
            (Arc::clone(&self.cfg), Arc::clone(&self.shared), Arc::clone(&self.checkpointer), self.name.clone());
        // Checking the declarations and building the graph are synchronous.
        let built = tokio::task::spawn_blocking(move || build_from(&cfg, &name, &sources, store, &shared))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(Some(Arc::new(chat_agent(built.graph, &built.channels))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_graph_compiles_and_draws_its_nodes() {
        assert!(mermaid(AgentGraph::React).contains("give_up"));
        let legal = mermaid(AgentGraph::LegalPipeline);
        for node in ["retrieve", "generate", "cite"] {
            assert!(legal.contains(node), "{legal}");
        }
        let crisis = mermaid(AgentGraph::CrisisCompanion);
        for node in ["crisis_gate", "crisis_screen", "crisis_response", "crisis_reply", "agent"] {
            assert!(crisis.contains(node), "{crisis}");
        }
        assert!(!crisis.contains("does not compile") && !legal.contains("does not compile"));
    }

    #[test]
    fn a_graph_whose_tools_are_not_enabled_is_refused_by_name() {
        let text = "[llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n\
                    [agents.luat]\ngraph = \"legal_pipeline\"\ntools = []\n\
                    [agents.care]\ngraph = \"crisis_companion\"\ntools = []\n";
        let cfg = Config::from_toml_str(text).unwrap();
        let shared = SharedParts {
            tools: ToolRegistry::new(),
            local_model: None,
            schema_prompt: None,
            kinds: Default::default(),
            memory_store: None,
            item_index: None,
        };
        let store = || Arc::new(toolgraph_graph::MemoryCheckpointer::new());
        let err = build(&cfg, Some("luat"), store(), &shared).err().unwrap().to_string();
        assert!(err.contains("agents.luat") && err.contains("retrieve_laws") && err.contains("[tools.legal]"), "{err}");
        let err = build(&cfg, Some("care"), store(), &shared).err().unwrap().to_string();
        assert!(err.contains("find_local_crisis_resources") && err.contains("[tools.crisis]"), "{err}");
    }
}
