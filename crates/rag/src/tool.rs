//! The `rag_search` tool (seed 000's contract) and the search call behind `POST /search`.
//!
//! Both answer the seed's normalized shape `{ok, query, total_results, results: [{content,
//! metadata, score}]}`; each result's metadata carries the chunk's citation label, so an
//! answer can cite it, and `ranks` says where the keyword and dense lists placed it.

use crate::RagError;
use crate::filter::Filter;
use crate::fusion::SearchMode;
use crate::kb::{Hit, KbStore, SearchRequest};
use crate::retriever::Retriever;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use toolgraph_tools::{Tool, ToolBuilder, ToolError};

/// Most results one search returns.
pub const MAX_TOP_K: usize = 50;

/// The search request of seed 000 (`POST /search`), plus the knowledge base and generic
/// filters.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// What to look for.
    pub query: String,
    /// Subject filter (metadata `asignatura`).
    #[serde(default)]
    pub asignatura: Option<String>,
    /// Document-type filter (metadata `tipo_documento`).
    #[serde(default)]
    pub tipo_documento: Option<String>,
    /// How many results (1–50, default 5).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Knowledge base (default: the configured one).
    #[serde(default)]
    pub kb: Option<String>,
    /// More metadata filters: `{"key": value | [values] | {"gte": n, "lt": m}}`.
    #[serde(default)]
    pub filters: Option<Map<String, Value>>,
    /// `bm25`, `dense` or `hybrid` (default: hybrid when the knowledge base has embeddings).
    #[serde(default)]
    pub mode: Option<SearchMode>,
}

/// A search failure the caller caused (400) or a missing knowledge base (404), as opposed to
/// an internal failure (500).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchFailure {
    /// Bad request.
    Invalid,
    /// Unknown knowledge base.
    NotFound,
    /// Another ingest holds the knowledge base or the index failed.
    Internal,
}

impl SearchParams {
    fn filters(&self) -> Result<Vec<Filter>, String> {
        let mut out = Vec::new();
        if let Some(a) = self.asignatura.as_deref().filter(|a| !a.trim().is_empty()) {
            out.push(Filter::Eq { key: "asignatura".into(), value: Value::String(a.trim().to_owned()) });
        }
        if let Some(t) = self.tipo_documento.as_deref().filter(|t| !t.trim().is_empty()) {
            out.push(Filter::Eq { key: "tipo_documento".into(), value: Value::String(t.trim().to_owned()) });
        }
        for (k, v) in self.filters.iter().flatten() {
            out.push(Filter::from_json(k, v)?);
        }
        Ok(out)
    }
}

/// Runs a search for `tenant` and renders the seed's success shape.
///
/// # Errors
/// `(kind, message)`: a readable message for the `{ok:false, error}` shape.
pub fn search_json(
    store: &KbStore,
    retriever: &Retriever,
    tenant: &str,
    default_kb: &str,
    params: &SearchParams,
) -> Result<Value, (SearchFailure, String)> {
    let query = params.query.trim();
    if query.is_empty() {
        return Err((SearchFailure::Invalid, "query must not be empty".into()));
    }
    if query.chars().count() > 4000 {
        return Err((SearchFailure::Invalid, "query is longer than 4000 characters".into()));
    }
    let top_k = params.top_k.unwrap_or(5);
    if !(1..=MAX_TOP_K).contains(&top_k) {
        return Err((SearchFailure::Invalid, format!("top_k must be between 1 and {MAX_TOP_K}")));
    }
    let filters = params.filters().map_err(|e| (SearchFailure::Invalid, e))?;
    let kb_name = params.kb.as_deref().unwrap_or(default_kb);
    let kb = store.open(tenant, kb_name).map_err(classify)?;
    let hits =
        retriever.search(&kb, &SearchRequest { query, filters: &filters, top_k }, params.mode).map_err(classify)?;
    Ok(results_json(query, &hits))
}

/// The seed's success shape: `{ok: true, query, total_results, results}`.
pub fn results_json(query: &str, hits: &[Hit]) -> Value {
    json!({
        "ok": true,
        "query": query,
        "total_results": hits.len(),
        "results": hits.iter().map(hit_json).collect::<Vec<_>>(),
    })
}

fn classify(e: RagError) -> (SearchFailure, String) {
    let kind = match &e {
        RagError::UnknownKb { .. } => SearchFailure::NotFound,
        RagError::InvalidName(_) | RagError::EmptyQuery | RagError::Mismatch(_) => SearchFailure::Invalid,
        _ => SearchFailure::Internal,
    };
    (kind, e.to_string())
}

/// One result in the seed's normalized form; metadata gains `doc_id`, `chunk_id`, `title`,
/// `citation` (and `headings` when the chunk has any); `ranks` holds each list's 1-based rank
/// and own score (`bm25`, `dense`, and `dense_2`, … for a knowledge base embedded with several
/// models, in the order of its models) for the lists that found it.
pub fn hit_json(hit: &Hit) -> Value {
    let c = &hit.chunk;
    let mut meta = c.meta.clone();
    meta.insert("doc_id".into(), c.doc_id.clone().into());
    meta.insert("chunk_id".into(), c.id.clone().into());
    meta.insert("title".into(), c.title.clone().into());
    meta.insert("citation".into(), c.citation.clone().into());
    if !c.headings.is_empty() {
        meta.insert("headings".into(), c.headings.clone().into());
    }
    let mut ranks = Map::new();
    let more = hit.more_dense.iter().enumerate().map(|(i, r)| (format!("dense_{}", i + 2), *r));
    for (name, rank) in [("bm25".to_owned(), hit.bm25), ("dense".to_owned(), hit.dense)].into_iter().chain(more) {
        if let Some(r) = rank {
            ranks.insert(name, json!({ "rank": r.rank, "score": r.score }));
        }
    }
    json!({ "content": c.text, "metadata": meta, "score": hit.score, "ranks": ranks })
}

/// Arguments of the `rag_search` tool.
// The subject field is injected from the conversation's state when the agent declares it
// (seed 000); the model never sees it.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RagSearchArgs {
    /// The key words of the user's question, in the user's own language.
    #[schemars(length(min = 1, max = 500))]
    pub query: String,
    /// Subject identifier.
    #[serde(default)]
    pub asignatura: Option<String>,
    /// Only this kind of document (e.g. guia, apuntes, normativa).
    #[serde(default)]
    pub tipo_documento: Option<String>,
    /// How many passages to return.
    #[serde(default)]
    #[schemars(range(min = 1, max = 20))]
    pub top_k: Option<usize>,
}

/// The `rag_search` read tool over `kb`. The tenant is the conversation's (`tenant` in the
/// tool context, which the service sets), else `default_tenant`.
pub fn rag_search_tool(store: Arc<KbStore>, retriever: Retriever, default_tenant: String, kb: String) -> Arc<dyn Tool> {
    ToolBuilder::<RagSearchArgs>::new(
        "rag_search",
        "Search the documents (course guides, lecture notes, laws and regulations) for passages that answer a \
         question. Returns passages with their source (metadata.citation); cite sources as [citation] in the answer.",
    )
    .inject("asignatura")
    .display_name("Document search")
    .handler(move |ctx, args: RagSearchArgs| {
        let store = store.clone();
        let retriever = retriever.clone();
        let tenant = ctx.get("tenant").and_then(Value::as_str).map_or_else(|| default_tenant.clone(), str::to_owned);
        let kb = kb.clone();
        async move {
            let params = SearchParams {
                query: args.query,
                asignatura: args.asignatura,
                tipo_documento: args.tipo_documento,
                top_k: args.top_k,
                kb: None,
                filters: None,
                mode: None,
            };
            // Index reads touch the disk and the query is embedded on the CPU: off the async workers.
            let result = tokio::task::spawn_blocking(move || search_json(&store, &retriever, &tenant, &kb, &params))
                .await
                .map_err(|e| ToolError::internal(format!("search task failed: {e}")))?;
            result.map_err(|(kind, message)| match kind {
                SearchFailure::Invalid => ToolError::invalid_arguments(message),
                SearchFailure::NotFound => ToolError::not_found(message),
                SearchFailure::Internal => ToolError::unavailable(message),
            })
        }
    })
    // The builder's only failure is a schema or name error, fixed at compile time here.
    .expect("rag_search's schema is valid")
}
