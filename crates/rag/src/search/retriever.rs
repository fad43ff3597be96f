//! [`Retriever`]: a search with the mode chosen for the knowledge base, its query embedded by
//! the configured model when the mode needs it.
//!
//! The default mode is hybrid for a knowledge base that stores vectors and keyword-only for one
//! that does not. A configured combined embedder (e5 beside an English model) searches a
//! knowledge base built with its first model alone with that model. A knowledge base embedded with one model is never searched with another's
//! vectors: the retriever refuses with [`RagError::Mismatch`].

use crate::RagError;
use crate::embed::{EmbedKind, Embedder, embedder_for_kb, ensure_same_model};
use crate::index::KnowledgeBase;
use crate::search::{Fusion, Hit, Ranking, SearchMode, SearchRequest};
use std::sync::{Arc, Mutex};

/// Loads the embedding model on first use.
pub type EmbedderLoader = Arc<dyn Fn() -> Result<Arc<dyn Embedder>, RagError> + Send + Sync>;

/// Searches knowledge bases in bm25, dense or hybrid mode.
#[derive(Clone, Default)]
pub struct Retriever {
    embedder: Arc<Mutex<Option<Arc<dyn Embedder>>>>,
    loader: Option<EmbedderLoader>,
    fusion: Fusion,
}

impl std::fmt::Debug for Retriever {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retriever").field("lazy", &self.loader.is_some()).field("fusion", &self.fusion).finish()
    }
}

impl Retriever {
    /// A retriever that embeds queries with `embedder` (none: keyword search only).
    pub fn new(embedder: Option<Arc<dyn Embedder>>, fusion: Fusion) -> Self {
        Self { embedder: Arc::new(Mutex::new(embedder)), loader: None, fusion }
    }

    /// A retriever whose model is loaded by `loader` when a search first needs it, so
    /// keyword-only work never pays for (or fails on) the model. A failed load is retried by
    /// the next search that needs it (the weights may have been fetched meanwhile).
    pub fn lazy(loader: EmbedderLoader, fusion: Fusion) -> Self {
        Self { embedder: Arc::new(Mutex::new(None)), loader: Some(loader), fusion }
    }

    /// The embedding model, loading it if this retriever is lazy; `None` when none is
    /// configured.
    ///
    /// # Errors
    /// When the lazy load fails. Blocking.
    pub fn embedder(&self) -> Result<Option<Arc<dyn Embedder>>, RagError> {
        let mut slot = self.embedder.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none()
            && let Some(load) = &self.loader
        {
            *slot = Some(load()?);
        }
        Ok(slot.clone())
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
        let Some(embedder) = self.embedder()? else {
            return Err(RagError::Embedding(format!(
                "knowledge base `{}` was embedded with {} but no embedding model is configured (rag.embedding); \
                 use mode bm25 or configure the model",
                manifest.name, built.model
            )));
        };
        let embedder = embedder_for_kb(&embedder, manifest.analyzer, Some(built));
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
