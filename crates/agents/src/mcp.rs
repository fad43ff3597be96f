//! What `toolgraph mcp` exports: the read tools of the configuration, the documents of the
//! knowledge bases of `rag.tenant` as resources, and each agent's instructions as a prompt.

use std::sync::Arc;
use toolgraph_config::Config;
use toolgraph_plugins::mcp_server::{ExportedPrompt, McpExport, ResourceInfo, ResourceSource};
use toolgraph_rag::KbStore;
use toolgraph_tools::{ToolContext, ToolRegistry};

/// The scheme of the documents' URIs: `toolgraph://kb/<knowledge base>/<document id>`.
const PREFIX: &str = "toolgraph://kb/";

/// The documents of one tenant's knowledge bases.
pub struct KbResources {
    store: Arc<KbStore>,
    tenant: String,
}

impl KbResources {
    /// The documents of `tenant`'s knowledge bases in `store`.
    pub fn new(store: Arc<KbStore>, tenant: String) -> Self {
        Self { store, tenant }
    }
}

impl ResourceSource for KbResources {
    fn list(&self) -> Vec<ResourceInfo> {
        let mut out = Vec::new();
        for name in self.store.list(&self.tenant).unwrap_or_default() {
            let Ok(kb) = self.store.open(&self.tenant, &name) else { continue };
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

    /// The document as indexed: its passages in order, each under its citation (consecutive
    /// passages of a long section overlap by a few dozen words).
    fn read(&self, uri: &str) -> Option<String> {
        let (kb, doc_id) = uri.strip_prefix(PREFIX)?.split_once('/')?;
        let chunks = self.store.open(&self.tenant, kb).ok()?.chunks_of(doc_id).ok()?;
        if chunks.is_empty() {
            return None;
        }
        Some(chunks.iter().map(|c| format!("## [{}]\n\n{}", c.citation, c.text)).collect::<Vec<_>>().join("\n\n"))
    }
}

/// The MCP export of `cfg`: the read tools of `tools` (searching `rag.tenant`), the documents of
/// that tenant's knowledge bases in `kb`, and one prompt per agent (its system prompt).
pub fn export(cfg: &Config, tools: ToolRegistry, kb: Arc<KbStore>) -> McpExport {
    let prompts = cfg
        .effective_agents()
        .into_iter()
        .map(|(name, settings)| ExportedPrompt {
            description: format!("The instructions of toolgraph's agent '{name}'"),
            name,
            text: settings.system_prompt,
        })
        .collect();
    let context = ToolContext::default().set("tenant", cfg.rag.tenant.clone().into());
    McpExport::new(tools, Arc::new(KbResources::new(kb, cfg.rag.tenant.clone())), prompts, context)
}
