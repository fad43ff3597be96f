//! What the binary adds to agent assembly (the agents crate): opening the configured
//! checkpoint store, and loading the in-process chat model (the `local-models` feature).

use anyhow::Context;
use std::sync::Arc;
use toolgraph_config::Config;
use toolgraph_graph::{Checkpointer, PostgresCheckpointer, SqliteCheckpointer};
use toolgraph_llm::ChatModel;

/// The checkpoint store: PostgreSQL when `database_url` is set, else SQLite in the data dir.
/// The identity a program on this machine acts as (the terminal chat, `tools call`, `mcp` on
/// stdio): the configured tenant (`rag.tenant`) and the user `local`. Tools that keep data per
/// tenant and user, such as the notes, read it from the call context; the chat service sets
/// the request's own instead.
pub const LOCAL_USER: &str = "local";

/// [`LOCAL_USER`] and the configured tenant as call-context values (`tenant`, `userId`).
pub fn local_identity(cfg: &Config) -> serde_json::Map<String, serde_json::Value> {
    let mut ids = serde_json::Map::new();
    ids.insert("tenant".into(), cfg.rag.tenant.clone().into());
    ids.insert("userId".into(), LOCAL_USER.into());
    ids
}

pub async fn checkpointer(cfg: &Config) -> anyhow::Result<Arc<dyn Checkpointer>> {
    Ok(match postgres_checkpointer(cfg).await? {
        Some(checkpointer) => Arc::new(checkpointer),
        None => {
            let path = cfg.data_dir.join("toolgraph.db");
            Arc::new(SqliteCheckpointer::open(&path).await.with_context(|| format!("cannot open {}", path.display()))?)
        }
    })
}

/// The checkpoints in PostgreSQL when `database_url` is set (reached as
/// `database_pooling` says), migrated.
pub async fn postgres_checkpointer(cfg: &Config) -> anyhow::Result<Option<PostgresCheckpointer>> {
    let Some(db) = toolgraph_agents::assembly::postgres_database(cfg, 8).await? else { return Ok(None) };
    let url = cfg.database_url.as_ref().map(|u| u.redacted_url()).unwrap_or_default();
    let checkpointer =
        PostgresCheckpointer::open(db).await.with_context(|| format!("cannot open the PostgreSQL store at {url}"))?;
    Ok(Some(checkpointer))
}

/// The in-process chat model of `llm.local_model`, when no endpoint is configured. Loading
/// takes seconds, so it runs on a blocking thread; every agent of the process shares it.
pub async fn local_model(cfg: &Config) -> anyhow::Result<Option<Arc<dyn ChatModel>>> {
    if cfg.llm.base_url.is_some() {
        return Ok(None);
    }
    let Some(name) = cfg.llm.local_model.clone() else { return Ok(None) };
    load_local(name, cfg.llm.local_cache_slots, cfg.llm.local_draft_tokens).await
}

#[cfg(feature = "local-models")]
async fn load_local(
    name: String,
    cache_slots: usize,
    draft_tokens: usize,
) -> anyhow::Result<Option<Arc<dyn ChatModel>>> {
    use toolgraph_local_models::chat::draft::PromptLookup;
    use toolgraph_local_models::chat::{LocalChatModel, LocalChatOptions, named_model};
    let path = named_model(&name).unwrap_or_else(|| std::path::PathBuf::from(&name));
    // Prompt prefixes computed ahead are kept beside the weights, for the next start.
    let options = LocalChatOptions {
        prefix_dir: Some(toolgraph_local_models::models_dir().join("prefix-cache")),
        cache_slots,
        lookup: PromptLookup { max_tokens: draft_tokens, ..PromptLookup::default() },
        ..LocalChatOptions::default()
    };
    let model = tokio::task::spawn_blocking(move || LocalChatModel::load(&path, options))
        .await
        .context("the model loading task failed")?
        .context("cannot load the local chat model (llm.local_model)")?;
    Ok(Some(Arc::new(model)))
}

#[cfg(not(feature = "local-models"))]
async fn load_local(_: String, _: usize, _: usize) -> anyhow::Result<Option<Arc<dyn ChatModel>>> {
    anyhow::bail!("llm.local_model needs a build with the `local-models` feature")
}

/// The model tools write with (`generate_test`): `local` when the process has loaded one,
/// else the endpoint, else the in-process model loaded on the first call (a command that only
/// lists tools never pays for loading it); `None` when no model is configured.
pub fn tool_model(cfg: &Config, local: Option<&Arc<dyn ChatModel>>) -> Option<Arc<dyn ChatModel>> {
    if let Some(m) = local {
        return Some(Arc::clone(m));
    }
    if let Ok(m) = toolgraph_agents::assembly::model(cfg, &Default::default(), None) {
        return Some(m);
    }
    let name = cfg.llm.local_model.clone()?;
    Some(Arc::new(LocalOnFirstUse {
        name,
        cache_slots: cfg.llm.local_cache_slots,
        draft_tokens: cfg.llm.local_draft_tokens,
        model: tokio::sync::OnceCell::new(),
    }))
}

/// The in-process model, loaded when first asked.
struct LocalOnFirstUse {
    name: String,
    cache_slots: usize,
    draft_tokens: usize,
    model: tokio::sync::OnceCell<Arc<dyn ChatModel>>,
}

impl LocalOnFirstUse {
    async fn get(&self) -> Result<&Arc<dyn ChatModel>, toolgraph_llm::LlmError> {
        self.model
            .get_or_try_init(|| async {
                match load_local(self.name.clone(), self.cache_slots, self.draft_tokens).await {
                    Ok(Some(m)) => Ok(m),
                    Ok(None) => Err(toolgraph_llm::LlmError::Connect {
                        endpoint: "llm.local_model".into(),
                        reason: "no local model".into(),
                    }),
                    Err(e) => Err(toolgraph_llm::LlmError::Connect {
                        endpoint: "llm.local_model".into(),
                        reason: format!("{e:#}"),
                    }),
                }
            })
            .await
    }
}

#[async_trait::async_trait]
impl ChatModel for LocalOnFirstUse {
    async fn stream(
        &self,
        request: toolgraph_llm::ChatRequest,
    ) -> Result<toolgraph_llm::ChatStream, toolgraph_llm::LlmError> {
        self.get().await?.stream(request).await
    }

    async fn prepare(&self, request: toolgraph_llm::ChatRequest) -> Result<(), toolgraph_llm::LlmError> {
        self.get().await?.prepare(request).await
    }

    async fn tail_logprobs(
        &self,
        request: toolgraph_llm::ChatRequest,
        tail: &str,
    ) -> Result<Option<Vec<f32>>, toolgraph_llm::LlmError> {
        self.get().await?.tail_logprobs(request, tail).await
    }

    fn model_id(&self) -> &str {
        &self.name
    }
}

/// Every tool the configuration enables, over the configured knowledge bases and backend
/// (what a command that only lists, calls or evaluates tools needs); `local` is the process's
/// in-process model when it loaded one.
pub async fn all_tools(
    cfg: &Config,
    local: Option<&Arc<dyn ChatModel>>,
) -> anyhow::Result<toolgraph_tools::ToolRegistry> {
    let backend = toolgraph_agents::assembly::backend(cfg)?;
    let kb = crate::retrieval::kb_store(cfg);
    let retriever = crate::retrieval::retriever(cfg);
    let model = tool_model(cfg, local);
    // No conversations here, so no attachments.
    Ok(toolgraph_agents::assembly::all_tools(cfg, kb, retriever, backend.as_ref(), model, None).await?)
}
