//! The course tutor's retrieval contract: the `rag_search` tool and the body of `POST /search`.
//!
//! Both speak the tutor's field names — `asignatura` (the subject, injected into the tool from
//! the conversation's state, never chosen by the model) and `tipo_documento` (the kind of
//! document) — which here become metadata filters of a generic knowledge-base search; the
//! result keeps the normalized shape `{ok, query, total_results, results: [{content, metadata,
//! score}]}` (docs/retrieval.md), each result's metadata with the tutor's `source` and
//! `asignatura`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;
use toolgraph_rag::{Filter, KbStore, Retriever, SearchFailure, SearchMode, SearchQuery, search_json};
use toolgraph_tools::{Tool, ToolBuilder, ToolError};

/// The body of `POST /search`: the tutor's request, plus the knowledge base, generic filters
/// and the mode.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CourseSearch {
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

impl CourseSearch {
    /// The generic search this request asks for: the subject and document type as equality
    /// filters (blank ones ignored), then the generic filters.
    ///
    /// # Errors
    /// A generic filter that is not one of the accepted shapes, named.
    pub fn to_query(&self) -> Result<SearchQuery<'_>, String> {
        let mut query = self.without_filters();
        query.filters = self.filters()?;
        Ok(query)
    }

    /// The search without its filters.
    fn without_filters(&self) -> SearchQuery<'_> {
        SearchQuery {
            query: &self.query,
            filters: Vec::new(),
            top_k: self.top_k,
            kb: self.kb.as_deref(),
            mode: self.mode,
        }
    }

    /// The subject, the document type and the generic filters, in that order.
    fn filters(&self) -> Result<Vec<Filter>, String> {
        let mut filters = Vec::new();
        for (key, value) in [("asignatura", &self.asignatura), ("tipo_documento", &self.tipo_documento)] {
            if let Some(v) = value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
                filters.push(Filter::Eq { key: key.into(), value: Value::String(v.to_owned()) });
            }
        }
        for (k, v) in self.filters.iter().flatten() {
            filters.push(Filter::from_json(k, v)?);
        }
        Ok(filters)
    }

    /// Runs the search for `tenant` and renders the normalized shape.
    ///
    /// # Errors
    /// `(kind, message)`: a readable message for the `{ok:false, error}` shape.
    pub fn run(
        &self,
        store: &KbStore,
        retriever: &Retriever,
        tenant: &str,
        default_kb: &str,
    ) -> Result<Value, (SearchFailure, String)> {
        // The words and `top_k` are judged before the filters, so each request gets the
        // first thing wrong with it in one order.
        let mut query = self.without_filters();
        query.check()?;
        query.filters = self.filters().map_err(|e| (SearchFailure::Invalid, e))?;
        let mut found = search_json(store, retriever, tenant, default_kb, &query)?;
        self.tutor_metadata(&mut found);
        Ok(found)
    }

    /// Each result's metadata as the tutor reads it: `source` (the document's file name, unless
    /// the document says otherwise) and `asignatura` (the document's, else the subject searched,
    /// else null).
    fn tutor_metadata(&self, found: &mut Value) {
        let subject = self.asignatura.as_deref().map(str::trim).filter(|s| !s.is_empty());
        let Some(results) = found.get_mut("results").and_then(Value::as_array_mut) else { return };
        for meta in results.iter_mut().filter_map(|r| r.get_mut("metadata")).filter_map(Value::as_object_mut) {
            let doc_id = meta.get("doc_id").and_then(Value::as_str).unwrap_or_default();
            let file = doc_id.rsplit('/').next().unwrap_or(doc_id).to_owned();
            meta.entry("source").or_insert(Value::String(file));
            meta.entry("asignatura").or_insert(subject.map_or(Value::Null, |s| Value::String(s.to_owned())));
        }
    }
}

/// Arguments of the `rag_search` tool.
// The subject is injected from the conversation's state when the agent declares it; the
// model never sees it.
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

/// The `rag_search` read tool over knowledge base `kb` — or the agent's own (`kb` in the tool
/// context, [`AgentSpec::tool_context`](crate::kit::AgentSpec::tool_context)). The tenant is the
/// conversation's (`tenant` in the tool context, which the service sets), else `default_tenant`.
/// With `attachments`, the documents attached to the conversation (`tenantId` and
/// `conversationId` in the tool context) are searched too, and their passages come first.
pub fn rag_search_tool(
    store: Arc<KbStore>,
    retriever: Retriever,
    default_tenant: String,
    kb: String,
    attachments: Option<Arc<KbStore>>,
) -> Arc<dyn Tool> {
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
        let tenant = ctx.get_str("tenant").unwrap_or(&default_tenant).to_owned();
        let kb = ctx.get_str("kb").unwrap_or(&kb).to_owned();
        let attached = attachments
            .clone()
            .zip(ctx.get("tenantId").and_then(Value::as_i64).zip(ctx.get("conversationId").and_then(Value::as_i64)));
        async move {
            let request = CourseSearch {
                query: args.query,
                asignatura: args.asignatura,
                tipo_documento: args.tipo_documento,
                top_k: args.top_k,
                ..CourseSearch::default()
            };
            // Index reads touch the disk and the query is embedded on the CPU: off the async workers.
            let result = tokio::task::spawn_blocking(move || {
                let own = request.run(&store, &retriever, &tenant, &kb);
                match attached {
                    Some((attachments, (tenant_id, conversation))) => {
                        with_attached(own, &request, &attachments, &retriever, tenant_id, conversation)
                    }
                    None => own,
                }
            })
            .await
            .map_err(|e| ToolError::internal(format!("search task failed: {e}")))?;
            result.map(for_the_model).map_err(|(kind, message)| match kind {
                SearchFailure::Invalid => ToolError::invalid_arguments(message),
                SearchFailure::NotFound => ToolError::not_found(message),
                SearchFailure::Internal => ToolError::unavailable(message),
            })
        }
    })
    // The builder's only failure is a schema or name error, fixed at compile time here.
    .expect("rag_search's schema is valid")
}

/// `own` (the agent's knowledge base's results) with the passages of the documents attached to
/// the conversation, searched with the same words but none of the subject's filters (an
/// attachment has no subject): the two lists alternate, the attachments' first — their scores
/// are not comparable — up to the request's `top_k`. A conversation without attachments, or a
/// failed search of them, leaves `own` as it was; a missing knowledge base of the agent's
/// leaves the attachments alone.
fn with_attached(
    own: Result<Value, (SearchFailure, String)>,
    request: &CourseSearch,
    attachments: &KbStore,
    retriever: &Retriever,
    tenant_id: i64,
    conversation: i64,
) -> Result<Value, (SearchFailure, String)> {
    if matches!(own, Err((SearchFailure::Invalid, _))) {
        return own;
    }
    let plain = CourseSearch { query: request.query.clone(), top_k: request.top_k, ..CourseSearch::default() };
    let (tenant, kb) = (toolgraph_rag::attached::tenant_of(tenant_id), toolgraph_rag::attached::kb_of(conversation));
    let theirs = plain.run(attachments, retriever, &tenant, &kb);
    // A conversation's documents are read now and then: their reader is not kept open.
    attachments.evict(&tenant, &kb);
    let theirs = match theirs {
        Ok(found) => found,
        Err((SearchFailure::NotFound, _)) => return own,
        Err((kind, message)) => {
            tracing::warn!(%message, "the conversation's attached documents cannot be searched");
            return own.map_err(|_| (kind, message));
        }
    };
    let mut own = match own {
        Ok(found) => found,
        Err((SearchFailure::NotFound, _)) => return Ok(theirs),
        Err(e) => return Err(e),
    };
    let list = |v: &Value| v.get("results").and_then(Value::as_array).cloned().unwrap_or_default();
    let (mut a, mut b) = (list(&theirs).into_iter(), list(&own).into_iter());
    let limit = request.top_k.unwrap_or(toolgraph_rag::DEFAULT_TOP_K);
    let mut merged = Vec::with_capacity(limit);
    while merged.len() < limit {
        let (x, y) = (a.next(), b.next());
        if x.is_none() && y.is_none() {
            break;
        }
        merged.extend(x);
        merged.extend(y);
    }
    merged.truncate(limit);
    own["total_results"] = Value::from(merged.len());
    own["results"] = Value::Array(merged);
    Ok(own)
}

/// A search's result as the `rag_search` tool returns it: the contract's `{content, metadata,
/// score}` per result, without the per-list `ranks` that `POST /search` adds (diagnostics for
/// the retrieval view, not evidence to answer from) and with the score to four decimals. The
/// model reads every character, and digits written in full cost prompt tokens a local model
/// has to read before it answers (docs/benchmarks.md, "What the answer reads").
fn for_the_model(mut found: Value) -> Value {
    let Some(results) = found.get_mut("results").and_then(Value::as_array_mut) else { return found };
    for result in results.iter_mut().filter_map(Value::as_object_mut) {
        result.remove("ranks");
        if let Some(score) = result.get("score").and_then(Value::as_f64) {
            result.insert("score".into(), Value::from((score * 1e4).round() / 1e4));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_tutors_fields_become_filters_and_blank_ones_are_ignored() {
        let request: CourseSearch = serde_json::from_value(json!({
            "query": "examen", "asignatura": " iv ", "tipo_documento": "", "filters": {"year": 2024}
        }))
        .unwrap();
        let query = request.to_query().unwrap();
        assert_eq!(query.query, "examen");
        assert_eq!(query.filters.len(), 2, "{:?}", query.filters);
        assert_eq!(query.filters[0], Filter::Eq { key: "asignatura".into(), value: json!("iv") });
        assert!(serde_json::from_value::<CourseSearch>(json!({"query": "x", "subject": "iv"})).is_err());
    }

    #[test]
    fn the_model_reads_each_result_without_ranks_and_with_a_short_score() {
        let found = json!({"ok": true, "query": "examen", "total_results": 2, "results": [
            {"content": "a", "metadata": {"citation": "Guía › Evaluación"}, "score": 1.541_818_857_193_193_2,
             "ranks": {"bm25": {"rank": 1, "score": 5.315_592_765_808_105_5}}},
            {"content": "b", "metadata": {}, "score": 0.25}
        ]});
        let read = for_the_model(found);
        assert_eq!(
            read,
            json!({"ok": true, "query": "examen", "total_results": 2, "results": [
                {"content": "a", "metadata": {"citation": "Guía › Evaluación"}, "score": 1.5418},
                {"content": "b", "metadata": {}, "score": 0.25}
            ]})
        );
        assert_eq!(
            read["results"][0].to_string(),
            r#"{"content":"a","metadata":{"citation":"Guía › Evaluación"},"score":1.5418}"#
        );
        // A failure's shape passes through untouched.
        let failed = json!({"ok": false, "error": "unknown knowledge base 'x'"});
        assert_eq!(for_the_model(failed.clone()), failed);
    }
}
