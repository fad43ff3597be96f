//! A search as services and tools ask for it, and its normalized answer: `{ok, query,
//! total_results, results: [{content, metadata, score}]}`, each result's metadata carrying the
//! chunk's citation label (so an answer can cite it) and `ranks` saying where the keyword and
//! dense lists placed it (docs/retrieval.md). The field names a particular client uses for its
//! filters, and what a failure means in HTTP, belong to that client (the agents and server
//! crates).

use crate::RagError;
use crate::index::KbStore;
use crate::search::{Filter, Hit, Retriever, SearchMode, SearchRequest};
use serde_json::{Map, Value, json};

/// Most results one search returns.
pub const MAX_TOP_K: usize = 50;

/// Longest query accepted, in characters.
pub const MAX_QUERY_CHARS: usize = 4000;

/// One search of a tenant's knowledge base.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchQuery<'a> {
    /// What to look for (trimmed before searching).
    pub query: &'a str,
    /// Metadata filters; all must hold.
    pub filters: Vec<Filter>,
    /// How many results (1 to [`MAX_TOP_K`]; default 5).
    pub top_k: Option<usize>,
    /// The knowledge base (default: the caller's default).
    pub kb: Option<&'a str>,
    /// `bm25`, `dense` or `hybrid` (default: hybrid when the knowledge base has embeddings).
    pub mode: Option<SearchMode>,
}

/// How many results a search returns when it does not say.
pub const DEFAULT_TOP_K: usize = 5;

/// Why a search returned nothing: the request was at fault, the knowledge base does not exist,
/// or the index failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchFailure {
    /// The request cannot be searched (no words, too long, `top_k` out of range, a bad filter
    /// or name, a mode the knowledge base cannot serve).
    Invalid,
    /// No knowledge base of that name for the tenant.
    NotFound,
    /// Another ingest holds the knowledge base, or the index or the embedder failed.
    Internal,
}

impl SearchQuery<'_> {
    /// The request's own checks: words to search, at most [`MAX_QUERY_CHARS`] characters, and
    /// `top_k` in range; returns the trimmed query and `top_k`.
    ///
    /// # Errors
    /// `(Invalid, message)`.
    pub fn check(&self) -> Result<(&str, usize), (SearchFailure, String)> {
        let query = self.query.trim();
        if query.is_empty() {
            return Err((SearchFailure::Invalid, "query must not be empty".into()));
        }
        if query.chars().count() > MAX_QUERY_CHARS {
            return Err((SearchFailure::Invalid, format!("query is longer than {MAX_QUERY_CHARS} characters")));
        }
        let top_k = self.top_k.unwrap_or(DEFAULT_TOP_K);
        if !(1..=MAX_TOP_K).contains(&top_k) {
            return Err((SearchFailure::Invalid, format!("top_k must be between 1 and {MAX_TOP_K}")));
        }
        Ok((query, top_k))
    }
}

/// Runs `request` on `tenant`'s knowledge bases (`default_kb` when it names none) and renders
/// the normalized shape.
///
/// # Errors
/// `(kind, message)`: a readable message for the `{ok: false, error}` shape.
pub fn search_json(
    store: &KbStore,
    retriever: &Retriever,
    tenant: &str,
    default_kb: &str,
    request: &SearchQuery<'_>,
) -> Result<Value, (SearchFailure, String)> {
    let (query, top_k) = request.check()?;
    let kb = store.open(tenant, request.kb.unwrap_or(default_kb)).map_err(classify)?;
    let hits = retriever
        .search(&kb, &SearchRequest { query, filters: &request.filters, top_k }, request.mode)
        .map_err(classify)?;
    Ok(results_json(query, &hits))
}

/// The success shape: `{ok: true, query, total_results, results}`.
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

/// One result in the normalized form; metadata gains `doc_id`, `chunk_id`, `title`,
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
