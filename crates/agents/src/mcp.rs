//! What toolgraph exports over MCP (`toolgraph mcp`, `/mcp` on `serve`): the read tools of the
//! configuration, the documents of a tenant's knowledge bases as resources, and each agent's
//! instructions as a prompt.

use std::sync::Arc;
use toolgraph_config::Config;
use toolgraph_plugins::mcp_server::{
    ExportedPrompt, McpExport, ResourceInfo, ResourceScope, ResourceSource, ResourceText,
};
use toolgraph_rag::KbStore;
use toolgraph_tools::ToolRegistry;

/// The scheme of the documents' URIs: `toolgraph://kb/<knowledge base>/<document id>`.
const PREFIX: &str = "toolgraph://kb/";

/// The documents of the knowledge bases, per tenant.
pub struct KbResources {
    store: Arc<KbStore>,
}

impl KbResources {
    /// The documents of the knowledge bases in `store`.
    pub fn new(store: Arc<KbStore>) -> Self {
        Self { store }
    }
}

#[async_trait::async_trait]
impl ResourceSource for KbResources {
    async fn list(&self, scope: &ResourceScope) -> Vec<ResourceInfo> {
        let (store, tenant) = (Arc::clone(&self.store), scope.tenant.clone());
        // Listing reads the knowledge bases from disk: off the async workers.
        tokio::task::spawn_blocking(move || documents(&store, &tenant)).await.unwrap_or_default()
    }

    /// The document as indexed: its passages in order, each under its citation (consecutive
    /// passages of a long section overlap by a few dozen words).
    async fn read(&self, scope: &ResourceScope, uri: &str) -> Option<ResourceText> {
        let (store, tenant, uri) = (Arc::clone(&self.store), scope.tenant.clone(), uri.to_owned());
        let text = tokio::task::spawn_blocking(move || document(&store, &tenant, &uri)).await.ok()??;
        Some(ResourceText { text, mime_type: "text/markdown".into() })
    }
}

fn documents(store: &KbStore, tenant: &str) -> Vec<ResourceInfo> {
    let mut out = Vec::new();
    for name in store.list(tenant).unwrap_or_default() {
        let Ok(kb) = store.open(tenant, &name) else { continue };
        for d in kb.documents().unwrap_or_default() {
            out.push(ResourceInfo {
                uri: format!("{PREFIX}{name}/{}", d.doc_id),
                name: if d.title.is_empty() { d.doc_id.clone() } else { d.title },
                description: Some(format!("{} passage(s) of knowledge base '{name}'", d.chunks)),
                mime_type: "text/markdown".into(),
            });
        }
    }
    out
}

fn document(store: &KbStore, tenant: &str, uri: &str) -> Option<String> {
    let (kb, doc_id) = uri.strip_prefix(PREFIX)?.split_once('/')?;
    let chunks = store.open(tenant, kb).ok()?.chunks_of(doc_id).ok()?;
    if chunks.is_empty() {
        return None;
    }
    Some(chunks.iter().map(|c| format!("## [{}]\n\n{}", c.citation, c.text)).collect::<Vec<_>>().join("\n\n"))
}

/// The MCP export of `cfg`: the read tools of `tools` and the write tools of `mcp.write_tools`
/// (behind the person's approval), the documents of the knowledge bases in `kb` — both for the
/// tenant a request over HTTP was authenticated for, else `rag.tenant` — and one prompt per
/// agent (its system prompt).
///
/// # Errors
/// A name in `mcp.write_tools` that is not a write tool.
pub fn export(cfg: &Config, tools: ToolRegistry, kb: Arc<KbStore>) -> Result<McpExport, String> {
    let prompts = cfg
        .effective_agents()
        .into_iter()
        .map(|(name, settings)| ExportedPrompt {
            description: format!("The instructions of toolgraph's agent '{name}'"),
            name,
            text: settings.system_prompt,
        })
        .collect();
    let export = McpExport::new(tools, Arc::new(KbResources::new(kb)), prompts, cfg.rag.tenant.clone())
        .with_write_tools(&cfg.mcp.write_tools)
        .map_err(|e| format!("mcp.write_tools: {e}"))?;
    match &cfg.mcp.approval_key {
        // Shared by replicas, so an approval asked for on one is taken by another.
        Some(key) => export.with_approval_key(key.expose().as_bytes()).map_err(|e| format!("mcp.approval_key: {e}")),
        None => Ok(export),
    }
}
