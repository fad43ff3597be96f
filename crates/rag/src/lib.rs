//! Retrieval for toolgraph agents, in four stages, each a folder:
//!
//! - [`ingest`](mod@ingest): files and folders in ([`ingest::formats`]: markdown, text, HTML,
//!   PDF, JSON records through a declarative [`RecordMapping`]), structure-aware
//!   [`ingest::chunk`]ing with citation labels, incremental re-ingest.
//! - [`index`]: persisted per-tenant [`KnowledgeBase`]s ([`KbStore`]): tantivy BM25 fields,
//!   stored vectors searched by a [`index::dense`] index (exact or HNSW), filterable metadata,
//!   and the [`KbManifest`] that fixes how each was built.
//! - [`search`]: BM25, dense or hybrid ranking with metadata [`Filter`]s applied inside every
//!   list, reciprocal-rank or distribution-based score [`search::fusion`], the [`Retriever`]
//!   that picks the mode and embeds the query, [`search::citation`] formatting and checking, and
//!   [`search_json`], a whole search answered in the normalized `{ok, query, total_results,
//!   results}` shape that `POST /search` and the `rag_search` tool return.
//! - [`eval`]: evaluation on BEIR-layout sets ([`evaluate`], [`eval::metrics`]).
//!
//! Beside them: [`embed`], the embedders rag owns ([`OpenAiEmbedder`] for any `/v1/embeddings`
//! server, [`embed::CombinedEmbedder`] for several models side by side) over the [`Embedder`]
//! contract of `toolgraph-embed` (the in-process models live in `toolgraph-local-models`).
//!
//! Does not own: the models themselves, tools built on search (the agents crate), the chat
//! service's routes, or agent assembly.
#![warn(missing_docs)]

pub mod attached;
pub mod embed;
pub mod eval;
pub mod index;
pub mod ingest;
pub mod search;

pub use embed::{EmbedError, EmbedKind, Embedder, EmbeddingSettings, OpenAiEmbedder, passage_text};
pub use eval::{BeirDataset, Document, EmbeddingCache, EvalOptions, EvalReport, evaluate, evaluate_bm25};
pub use index::{
    Analyzer, Chunk, ChunkingOptions, DenseOptions, DocumentInfo, Filter, KB_FORMAT, KbManifest, KbStore, KbWriter,
    KnowledgeBase, QdrantOptions, RecordMapping, validate_name,
};
pub use ingest::{
    IngestOptions, IngestProgress, IngestReport, NamedBytes, NoProgress, PathPattern, Section, SkippedFile,
    SourceDocument, check_named, ingest, ingest_bytes,
};
pub use search::{
    CitationReport, DEFAULT_TOP_K, Fusion, FusionMethod, Hit, ListRank, Ranking, Retriever, SearchFailure, SearchMode,
    SearchQuery, SearchRequest, check_citations, cite, fuse, fuse_many, search_json,
};
pub use toolgraph_embed::cache_root;

/// A retrieval failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RagError {
    /// A file is missing or unreadable.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A dataset line is not what the format says.
    #[error("{path} line {line}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No knowledge base of that name for the tenant.
    #[error("no knowledge base `{name}` for tenant `{tenant}`")]
    UnknownKb {
        /// Tenant.
        tenant: String,
        /// Knowledge-base name.
        name: String,
    },
    /// A tenant or knowledge-base name that cannot be used.
    #[error("{0}")]
    InvalidName(String),
    /// A `kb.json` that cannot be used.
    #[error("{path}: {reason}")]
    Manifest {
        /// The manifest file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A request that contradicts how the knowledge base was built.
    #[error("{0}")]
    Mismatch(String),
    /// Another ingest is writing this knowledge base.
    #[error("knowledge base `{0}` is being written by another ingest; try again when it finishes")]
    Busy(String),
    /// The query has no searchable word.
    #[error("the query has no searchable words")]
    EmptyQuery,
    /// The embedding model failed or is not available.
    #[error("embeddings: {0}")]
    Embedding(String),
    /// The Qdrant server failed, refused, or is unreachable.
    #[error("qdrant: {0}")]
    Qdrant(String),
    /// The index failed.
    #[error("keyword index: {0}")]
    Index(#[from] tantivy::TantivyError),
}

impl From<EmbedError> for RagError {
    fn from(e: EmbedError) -> Self {
        Self::Embedding(e.0)
    }
}
