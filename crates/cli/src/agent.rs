//! Assembles configured agents: model client, enabled tools, checkpoint store.

use anyhow::{Context, bail};
use std::sync::Arc;
use toolgraph_config::{AgentSettings, Config, StoreKind};
use toolgraph_graph::react::{self, AgentDeps, AgentSpec, AgentState, PromptContext};
use toolgraph_graph::{Checkpointer, CompiledGraph, PostgresCheckpointer, SqliteCheckpointer};
use toolgraph_llm::{ChatModel, OpenAiChatModel};
use toolgraph_rag::{KbStore, Retriever};
use toolgraph_server::backend::{
    BackendConversationStore, BackendOptions, BackendWriteTool, backend_general_query, tenant_schema_prompt,
};
use toolgraph_tools::{ToolRegistry, builtin};

/// A ready-to-run agent.
pub struct Agent {
    pub name: String,
    pub settings: AgentSettings,
    pub graph: CompiledGraph<AgentState, AgentDeps>,
}

/// The checkpoint store: PostgreSQL when `database_url` is set, else SQLite in the data dir.
pub async fn checkpointer(cfg: &Config) -> anyhow::Result<Arc<dyn Checkpointer>> {
    Ok(match &cfg.database_url {
        Some(url) => {
            Arc::new(PostgresCheckpointer::connect(url.expose()).await.context("cannot open the PostgreSQL store")?)
        }
        None => {
            let path = cfg.data_dir.join("toolgraph.db");
            Arc::new(SqliteCheckpointer::open(&path).await.with_context(|| format!("cannot open {}", path.display()))?)
        }
    })
}

/// The in-process chat model of `llm.local_model`, when no endpoint is configured. Loading
/// takes seconds, so it runs on a blocking thread; every agent of the process shares it.
pub async fn local_model(cfg: &Config) -> anyhow::Result<Option<Arc<dyn ChatModel>>> {
    if cfg.llm.base_url.is_some() {
        return Ok(None);
    }
    let Some(name) = cfg.llm.local_model.clone() else { return Ok(None) };
    load_local(name).await
}

#[cfg(feature = "local-models")]
async fn load_local(name: String) -> anyhow::Result<Option<Arc<dyn ChatModel>>> {
    use toolgraph_local_models::chat::{LocalChatModel, LocalChatOptions, named_model};
    let path = named_model(&name).unwrap_or_else(|| std::path::PathBuf::from(&name));
    let model = tokio::task::spawn_blocking(move || LocalChatModel::load(&path, LocalChatOptions::default()))
        .await
        .context("the model loading task failed")?
        .context("cannot load the local chat model (llm.local_model)")?;
    Ok(Some(Arc::new(model)))
}

#[cfg(not(feature = "local-models"))]
async fn load_local(_: String) -> anyhow::Result<Option<Arc<dyn ChatModel>>> {
    bail!("llm.local_model needs a build with the `local-models` feature")
}

/// The model of `settings`: `local` when given (the in-process model), else the configured
/// endpoint, or a message saying how to configure one.
pub fn model(
    cfg: &Config,
    settings: &AgentSettings,
    local: Option<&Arc<dyn ChatModel>>,
) -> anyhow::Result<Arc<dyn ChatModel>> {
    if let Some(m) = local {
        return Ok(Arc::clone(m));
    }
    let Some(mut client) = cfg.llm.openai_config() else {
        bail!(
            "no model endpoint is configured: set TOOLGRAPH_LLM_BASE_URL and TOOLGRAPH_LLM_MODEL to any \
             OpenAI-compatible server (e.g. http://127.0.0.1:11434/v1 for Ollama), or run a local model with \
             TOOLGRAPH_LLM_LOCAL_MODEL=0.5b (weights: scripts/fetch-models chat-0.5b), or [llm] in toolgraph.toml"
        );
    };
    if let Some(m) = &settings.model {
        client.model = m.clone();
    }
    Ok(Arc::new(OpenAiChatModel::new(client)?))
}

/// Every built-in tool the configuration enables; `rag_search` reads `kb` through `retriever`.
/// Built once per process and shared by its agents (it may open a database pool).
/// `backend` is [`backend`]'s client, shared with the store and the schema prompt.
pub async fn all_tools(
    cfg: &Config,
    kb: Arc<KbStore>,
    retriever: Retriever,
    backend: Option<&BackendConversationStore>,
) -> anyhow::Result<ToolRegistry> {
    let mut all = builtin::registry(&cfg.data_dir)?;
    all.register(toolgraph_rag::tool::rag_search_tool(
        kb,
        retriever,
        cfg.rag.tenant.clone(),
        cfg.rag.default_kb.clone(),
    ))?;
    if let Some(db) = &cfg.tools.sql_database {
        all.register(builtin::general_query(db).await?)?;
    }
    if let Some(backend) = backend {
        // Seed 002: the backend runs the model's SQL and the approved writes; the service
        // opens no tenant database.
        if cfg.tools.sql_database.is_none() {
            all.register(backend_general_query(backend.clone())?)?;
        }
        for (name, tool) in &cfg.server.backend_tools {
            let tool = BackendWriteTool::new(backend.clone(), name, &tool.description, tool.parameters.clone())
                .with_context(|| format!("server.backend_tools.{name}"))?;
            all.register(Arc::new(tool)).with_context(|| format!("server.backend_tools.{name}"))?;
        }
    }
    Ok(all)
}

/// The client of the backend of `server.backend_*` when `server.store = "backend"`: one per
/// process (one connection pool), for the store, the tools and the schema prompt.
pub fn backend(cfg: &Config) -> anyhow::Result<Option<BackendConversationStore>> {
    if cfg.server.store != StoreKind::Backend {
        return Ok(None);
    }
    // Both are required with the backend store (validated when the config loaded).
    let base_url = cfg.server.backend_url.clone().context("server.backend_url is required")?;
    let secret = cfg.server.backend_hmac_secret.as_ref().context("server.backend_hmac_secret is required")?;
    let options = BackendOptions {
        base_url,
        secret: secret.expose().as_bytes().to_vec(),
        timeout: std::time::Duration::from_millis(cfg.server.backend_timeout_ms),
    };
    BackendConversationStore::new(options).map(Some).context("cannot build the backend client")
}

/// Seed 002's tenant schema for the system prompt of agents that query the backend: set when
/// the backend runs `general_query` (`store = "backend"`, no `tools.sql_database`).
pub fn schema_prompt(cfg: &Config, backend: Option<&BackendConversationStore>) -> Option<PromptContext> {
    let backend = backend.filter(|_| cfg.tools.sql_database.is_none())?;
    Some(tenant_schema_prompt(backend.clone()))
}

/// The agent's enabled tools out of `all`.
fn tools(all: &ToolRegistry, name: &str, settings: &AgentSettings) -> anyhow::Result<ToolRegistry> {
    match &settings.tools {
        None => Ok(all.clone()),
        Some(names) => all.subset(names).with_context(|| format!("agent '{name}' enables a tool that does not exist")),
    }
}

/// Builds agent `name` (or the default agent) over `store`, with its tools out of `all`;
/// `schema_prompt` (see [`schema_prompt`]) joins its system prompt if it may call
/// `general_query`.
pub fn build(
    cfg: &Config,
    name: Option<&str>,
    store: Arc<dyn Checkpointer>,
    all: &ToolRegistry,
    local: Option<&Arc<dyn ChatModel>>,
    schema_prompt: Option<&PromptContext>,
) -> anyhow::Result<Agent> {
    let name = name.map_or_else(|| cfg.default_agent_name(), str::to_owned);
    let agents = cfg.effective_agents();
    let Some(settings) = agents.get(&name).cloned() else {
        bail!("no agent named '{name}'; configured agents: {}", agents.keys().cloned().collect::<Vec<_>>().join(", "));
    };
    let mut spec = AgentSpec::new(&name, &settings.system_prompt, tools(all, &name, &settings)?);
    spec.history_budget = settings.history_budget;
    spec.max_tool_retries = settings.max_tool_retries;
    spec.temperature = settings.temperature;
    spec.max_tokens = settings.max_tokens;
    if spec.tools.get("general_query").is_some() {
        spec.prompt_context = schema_prompt.cloned();
    }
    if settings.cite_sources {
        spec.answer_footer = Some(Arc::new(toolgraph_rag::citation::sources_footer));
    }
    let graph = react::build(spec, model(cfg, &settings, local)?, store).context("cannot build the agent graph")?;
    Ok(Agent { name, settings, graph })
}
