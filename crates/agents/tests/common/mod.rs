//! What the agent tests share: a search that finds one passage whatever is asked.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolgraph_tools::{ToolBuilder, ToolRegistry};

#[derive(Deserialize, JsonSchema)]
struct SearchArgs {
    /// The query.
    #[allow(dead_code)] // the search finds the same passage whatever is asked
    query: String,
}

/// Registers a `rag_search` in `reg` that finds `content`, cited as `citation`, whatever is
/// asked: the normalized search shape (docs/retrieval.md).
pub fn register_search(reg: &mut ToolRegistry, content: &'static str, citation: &'static str) {
    reg.register(
        ToolBuilder::<SearchArgs>::new("rag_search", "Search the course's documents")
            .handler(move |_ctx, _a| async move {
                let passage = json!({"content": content, "metadata": {"citation": citation}});
                Ok(json!({"ok": true, "total_results": 1, "results": [passage]}))
            })
            .expect("a valid tool"),
    )
    .expect("one rag_search");
}
