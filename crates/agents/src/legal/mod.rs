//! The legal Q&A agent's tools and pipeline (docs/legal.md): `retrieve_laws` finds the articles
//! of law that bear on a question, `generate_answer` answers from them alone, and
//! `format_citation` attributes each sentence of an answer to the article that supports it, in
//! the form `Theo [Điều 5, Luật Giao thông 2008], …`. The three are tools a ReAct agent can call
//! and the nodes of a fixed pipeline ([`pipeline`]).
//!
//! The chunk shape is the contract of the tools: `{text, meta: {doc_id, section_title,
//! article_number, url}}`, plus `law` and `citation` (the label a citation shows), which the
//! contract lacks and a citation needs.

pub mod answer;
pub mod citation;
pub mod pipeline;
pub mod tools;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use toolgraph_rag::{KbStore, Retriever, SearchFailure, SearchQuery, search_json};
use toolgraph_tools::{ToolContext, ToolError};

pub use answer::AnswerWriter;
pub use citation::{cite, cited_labels};

/// Where a chunk of law comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChunkMeta {
    /// The article's id in the knowledge base (`<law>#<article number>` for the ALQAC laws).
    pub doc_id: String,
    /// The article's heading.
    #[serde(default)]
    pub section_title: String,
    /// The article's number.
    #[serde(default)]
    pub article_number: String,
    /// Where a reader finds the article (empty when the knowledge base has no address).
    #[serde(default)]
    pub url: String,
    /// The law the article belongs to.
    #[serde(default)]
    pub law: String,
    /// The label a citation shows (`Điều 5, Luật Giao thông 2008`).
    // The schema a model reads says it without a real-looking law, which a small model copies
    // into answers written from memory.
    #[schemars(description = "The label a citation shows: \"Điều <number>, <law>\".")]
    #[serde(default)]
    pub citation: String,
}

impl ChunkMeta {
    /// The citation label: the knowledge base's, else built from the article and the law,
    /// else the document id.
    pub fn label(&self) -> String {
        if !self.citation.trim().is_empty() {
            return self.citation.trim().to_owned();
        }
        match (self.article_number.trim(), self.law.trim()) {
            ("", "") => self.doc_id.clone(),
            (n, "") => format!("Điều {n}"),
            ("", law) => law.to_owned(),
            (n, law) => format!("Điều {n}, {law}"),
        }
    }
}

/// A passage of law.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Chunk {
    /// The article's text (or a part of a long article).
    pub text: String,
    /// Where it comes from.
    pub meta: ChunkMeta,
}

/// The laws `retrieve_laws` searches: a knowledge base, and how each article's `url` is made
/// when the knowledge base's metadata has none.
#[derive(Clone)]
pub struct LawLibrary {
    /// The knowledge bases.
    pub store: Arc<KbStore>,
    /// How to search them.
    pub retriever: Retriever,
    /// The knowledge base of laws (an agent's own `kb` wins).
    pub kb: String,
    /// The tenant when the turn names none.
    pub default_tenant: String,
    /// `{law}`, `{article}`, `{doc_id}` template of `url`; `None`: empty.
    pub url_template: Option<String>,
    /// How many of the chunks they are given, best-ranked first, an answer is written from and
    /// cited among ([`LawLibrary::read`]).
    pub answer_articles: usize,
}

/// Most articles one retrieval returns.
pub const MAX_TOP_K: usize = 20;

impl LawLibrary {
    /// The `top_k` distinct articles that best match `question` in `tenant`'s knowledge base
    /// `kb` (else the library's), best first: a long article split into several chunks counts
    /// once, with its best chunk.
    ///
    /// # Errors
    /// A blank question or `top_k` out of 1–20 (invalid arguments), a knowledge base that does
    /// not exist (not found), an index that fails (unavailable).
    pub async fn retrieve(
        &self,
        tenant: &str,
        kb: Option<&str>,
        question: &str,
        top_k: usize,
    ) -> Result<Vec<Chunk>, ToolError> {
        if !(1..=MAX_TOP_K).contains(&top_k) {
            return Err(ToolError::invalid_arguments(format!("top_k must be 1-{MAX_TOP_K}, got {top_k}")));
        }
        if question.trim().is_empty() {
            return Err(ToolError::invalid_arguments("the question is empty"));
        }
        let (store, retriever) = (Arc::clone(&self.store), self.retriever.clone());
        let (tenant, kb) = (tenant.to_owned(), kb.unwrap_or(&self.kb).to_owned());
        let question = question.to_owned();
        // Three chunks per article asked for leave enough distinct articles after merging.
        let wanted = (top_k * 3).min(toolgraph_rag::search::MAX_TOP_K);
        // Index reads touch the disk and the query is embedded on the CPU: off the async workers.
        let found = tokio::task::spawn_blocking(move || {
            let query =
                SearchQuery { query: &question, filters: Vec::new(), top_k: Some(wanted), kb: None, mode: None };
            search_json(&store, &retriever, &tenant, &kb, &query)
        })
        .await
        .map_err(|e| ToolError::internal(format!("search task failed: {e}")))?
        .map_err(|(kind, message)| match kind {
            SearchFailure::Invalid => ToolError::invalid_arguments(message),
            SearchFailure::NotFound => ToolError::not_found(message),
            SearchFailure::Internal => ToolError::unavailable(message),
        })?;
        let mut chunks: Vec<Chunk> = Vec::with_capacity(top_k);
        for result in found["results"].as_array().into_iter().flatten() {
            let empty = serde_json::Map::new();
            let meta = result["metadata"].as_object().unwrap_or(&empty);
            let chunk = self.chunk_of(result["content"].as_str().unwrap_or_default(), meta);
            if chunks.iter().any(|c| c.meta.doc_id == chunk.meta.doc_id) {
                continue;
            }
            chunks.push(chunk);
            if chunks.len() == top_k {
                break;
            }
        }
        Ok(chunks)
    }

    /// The tenant and knowledge base a tool call reads: the conversation's tenant (`tenant`
    /// in the tool context, else the library's) and the agent's knowledge base (`kb`), if set.
    pub fn scope(&self, ctx: &ToolContext) -> (String, Option<String>) {
        let tenant = ctx.get_str("tenant").unwrap_or(&self.default_tenant).to_owned();
        (tenant, ctx.get_str("kb").map(str::to_owned))
    }

    /// The chunks an answer reads of `chunks` (best first): the first `answer_articles`. A small
    /// model quotes a weakly ranked article as readily as the best one, and the third is seldom
    /// the one a question is about.
    pub fn read(&self, mut chunks: Vec<Chunk>) -> Vec<Chunk> {
        chunks.truncate(self.answer_articles.max(1));
        chunks
    }

    /// `chunks` as the knowledge base holds them, so that a model which copies chunks into
    /// `generate_answer` or `format_citation` can neither cite an article the knowledge base
    /// lacks nor change what an article says: each chunk's `doc_id` must name an article of
    /// `tenant`'s knowledge base `kb` (else the library's), and the chunk becomes the stored
    /// passage of that article that shares the most words with the text sent (a model that
    /// shortens or retypes a passage still gets the article's own words and label).
    ///
    /// # Errors
    /// A `doc_id` the knowledge base does not hold (invalid arguments, naming it and saying
    /// where chunks come from), a knowledge base that does not exist (not found), an index that
    /// fails (unavailable).
    pub async fn verified(&self, tenant: &str, kb: Option<&str>, chunks: Vec<Chunk>) -> Result<Vec<Chunk>, ToolError> {
        if chunks.is_empty() {
            return Ok(chunks);
        }
        let library = self.clone();
        let (tenant, kb) = (tenant.to_owned(), kb.unwrap_or(&self.kb).to_owned());
        // Index reads touch the disk: off the async workers.
        tokio::task::spawn_blocking(move || {
            let base = library.store.open(&tenant, &kb).map_err(|e| match e {
                toolgraph_rag::RagError::UnknownKb { .. } => ToolError::not_found(e.to_string()),
                e => ToolError::unavailable(e.to_string()),
            })?;
            let mut out = Vec::with_capacity(chunks.len());
            for (i, sent) in chunks.into_iter().enumerate() {
                let stored = base.chunks_of(&sent.meta.doc_id).map_err(|e| ToolError::unavailable(e.to_string()))?;
                let Some(best) = closest(&sent.text, &stored) else {
                    return Err(ToolError::invalid_arguments(format!(
                        "chunks[{i}]: '{}' is not an article of the knowledge base '{kb}'; pass the chunks \
                         retrieve_laws returned, unchanged",
                        sent.meta.doc_id
                    )));
                };
                let mut meta = best.meta.clone();
                meta.insert("doc_id".into(), best.doc_id.clone().into());
                meta.insert("citation".into(), best.citation.clone().into());
                out.push(library.chunk_of(&best.text, &meta));
            }
            Ok(out)
        })
        .await
        .map_err(|e| ToolError::internal(format!("lookup task failed: {e}")))?
    }

    /// A stored passage as a chunk of law: the metadata an ingest with the ALQAC mapping
    /// (`law`, `article_number`, `article_title`) or the BEIR corpus (`law_id`,
    /// `section_title`) wrote.
    fn chunk_of(&self, text: &str, meta: &serde_json::Map<String, Value>) -> Chunk {
        let text_of = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| match meta.get(*k) {
                    Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
                    Some(Value::Number(n)) => Some(n.to_string()),
                    _ => None,
                })
                .unwrap_or_default()
        };
        let doc_id = text_of(&["doc_id"]);
        let (law_of_id, number_of_id) = doc_id.rsplit_once('#').unwrap_or(("", ""));
        let law = Some(text_of(&["law", "law_id"])).filter(|s| !s.is_empty()).unwrap_or_else(|| law_of_id.to_owned());
        let article_number = Some(text_of(&["article_number", "article"]))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| number_of_id.to_owned());
        let mut url = text_of(&["url"]);
        if url.is_empty()
            && let Some(template) = &self.url_template
        {
            url = fill_url(template, &law, &article_number, &doc_id);
        }
        let meta = ChunkMeta {
            section_title: text_of(&["section_title", "article_title", "title"]),
            citation: text_of(&["citation"]),
            doc_id,
            article_number,
            url,
            law,
        };
        Chunk { text: text.to_owned(), meta }
    }
}

/// The passage of `stored` (one article's) that shares the most distinct words with `sent`;
/// the first on a tie or when `sent` is empty; `None` when there is none.
fn closest<'a>(sent: &str, stored: &'a [toolgraph_rag::Chunk]) -> Option<&'a toolgraph_rag::Chunk> {
    let words = |t: &str| -> std::collections::HashSet<String> {
        t.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
    };
    let mine = words(sent);
    let mut best: Option<(&toolgraph_rag::Chunk, usize)> = None;
    for c in stored {
        let shared = words(&c.text).intersection(&mine).count();
        if best.is_none_or(|(_, s)| shared > s) {
            best = Some((c, shared));
        }
    }
    best.map(|(c, _)| c)
}

/// `template` with `{law}`, `{article}` and `{doc_id}` replaced by the percent-encoded values.
pub fn fill_url(template: &str, law: &str, article: &str, doc_id: &str) -> String {
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    template.replace("{law}", &enc(law)).replace("{article}", &enc(article)).replace("{doc_id}", &enc(doc_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_label_is_the_citation_else_the_article_and_the_law() {
        let mut meta = ChunkMeta { doc_id: "Luật X#5".into(), ..Default::default() };
        assert_eq!(meta.label(), "Luật X#5");
        meta.article_number = "5".into();
        meta.law = "Luật Giao thông 2008".into();
        assert_eq!(meta.label(), "Điều 5, Luật Giao thông 2008");
        meta.citation = "Điều 5, Luật GT".into();
        assert_eq!(meta.label(), "Điều 5, Luật GT");
    }

    #[test]
    fn url_values_are_percent_encoded() {
        let url = fill_url("https://laws.example/s?q={law}&a={article}", "Luật Điện ảnh", "45", "x");
        assert_eq!(url, "https://laws.example/s?q=Lu%E1%BA%ADt+%C4%90i%E1%BB%87n+%E1%BA%A3nh&a=45");
    }

    #[test]
    fn the_chunk_shape_is_the_contracts() {
        let chunk = Chunk {
            text: "t".into(),
            meta: ChunkMeta { doc_id: "d".into(), article_number: "1".into(), ..Default::default() },
        };
        let v = serde_json::to_value(&chunk).unwrap();
        for key in ["doc_id", "section_title", "article_number", "url"] {
            assert!(v["meta"].get(key).is_some(), "{key} missing: {v}");
        }
        // A chunk a model sends back with only the contract's fields is accepted.
        let back: Chunk = serde_json::from_value(json!({"text": "t", "meta": {"doc_id": "d"}})).unwrap();
        assert_eq!(back.meta.doc_id, "d");
    }
}
