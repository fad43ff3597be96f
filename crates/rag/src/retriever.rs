//! [`Retriever`]: a search with the mode chosen for the knowledge base, its query embedded by
//! the configured model when the mode needs it.
//!
//! The default mode is hybrid for a knowledge base that stores vectors and keyword-only for one
//! that does not. A knowledge base embedded with one model is never searched with another's
//! vectors: the retriever refuses with [`RagError::Mismatch`].

use crate::RagError;
use crate::embed::{EmbedKind, Embedder, ensure_same_model};
use crate::fusion::{Fusion, SearchMode};
use crate::kb::{Hit, KnowledgeBase, Ranking, SearchRequest};
use std::sync::Arc;

/// Searches knowledge bases in bm25, dense or hybrid mode.
#[derive(Debug, Clone, Default)]
pub struct Retriever {
    embedder: Option<Arc<dyn Embedder>>,
    fusion: Fusion,
}

impl Retriever {
    /// A retriever that embeds queries with `embedder` (none: keyword search only).
    pub fn new(embedder: Option<Arc<dyn Embedder>>, fusion: Fusion) -> Self {
        Self { embedder, fusion }
    }

    /// The embedding model, if one is configured.
    pub fn embedder(&self) -> Option<&Arc<dyn Embedder>> {
        self.embedder.as_ref()
    }

    /// The fusion parameters of hybrid searches.
    pub fn fusion(&self) -> Fusion {
        self.fusion
    }

    /// The mode a search of `kb` uses when none is asked for.
    pub fn default_mode(&self, kb: &KnowledgeBase) -> SearchMode {
        if kb.manifest().embedding.is_some() { SearchMode::Hybrid } else { SearchMode::Bm25 }
    }

    /// Searches `kb` (`mode: None` = [`Retriever::default_mode`]). Blocking: embeds the query.
    ///
    /// # Errors
    /// [`RagError::Mismatch`] when the mode needs vectors the knowledge base lacks or the
    /// configured model is not the one it was built with; [`RagError::Embedding`] when no model
    /// is configured or it fails; search errors.
    pub fn search(
        &self,
        kb: &KnowledgeBase,
        req: &SearchRequest<'_>,
        mode: Option<SearchMode>,
    ) -> Result<Vec<Hit>, RagError> {
        let mode = mode.unwrap_or_else(|| self.default_mode(kb));
        let vector = match mode {
            SearchMode::Bm25 => None,
            SearchMode::Dense | SearchMode::Hybrid => Some(self.query_vector(kb, req.query)?),
        };
        let ranking = match (mode, vector.as_deref()) {
            (SearchMode::Dense, Some(v)) => Ranking::Dense(v),
            (SearchMode::Hybrid, Some(v)) => Ranking::Hybrid(v, self.fusion),
            _ => Ranking::Bm25,
        };
        kb.search_ranked(req, ranking)
    }

    fn query_vector(&self, kb: &KnowledgeBase, query: &str) -> Result<Vec<f32>, RagError> {
        let manifest = kb.manifest();
        let Some(built) = &manifest.embedding else {
            return Err(RagError::Mismatch(format!(
                "knowledge base `{}` has no embeddings (it was ingested for keyword search only): use mode bm25, \
                 or re-ingest it with an embedding model",
                manifest.name
            )));
        };
        let Some(embedder) = &self.embedder else {
            return Err(RagError::Embedding(format!(
                "knowledge base `{}` was embedded with {} but no embedding model is configured (rag.embedding); \
                 use mode bm25 or configure the model",
                manifest.name, built.model
            )));
        };
        ensure_same_model(built, embedder.settings())?;
        if query.trim().is_empty() {
            return Err(RagError::EmptyQuery);
        }
        embedder
            .embed(&[query], EmbedKind::Query)?
            .pop()
            .ok_or_else(|| RagError::Embedding("the model returned no vector".into()))
    }
}
