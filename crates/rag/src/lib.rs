//! Retrieval for toolgraph agents: the `rag` layer of SPEC §2.
//!
//! Owns: reading documents ([`formats`]: markdown, text, HTML, PDF, JSON records through a
//! declarative [`RecordMapping`]), structure-aware [`chunk`]ing with citation labels,
//! persisted per-tenant [`KnowledgeBase`]s with BM25 search and metadata [`Filter`]s,
//! incremental [`ingest`]ion, [`citation`] formatting and checking, the `rag_search` tool
//! ([`tool`]), and evaluation on BEIR-layout sets ([`evaluate_bm25`], [`metrics`]).
//!
//! Dense retrieval: chunks carry vectors from an [`Embedder`] (the in-process e5 model lives in
//! `toolgraph-local-models`; [`OpenAiEmbedder`] calls any `/v1/embeddings` server), searched by
//! a [`dense`] index with filters applied during the search, and fused with BM25 by
//! reciprocal-rank or distribution-based score [`fusion`]; [`Retriever`] picks the mode and
//! embeds the query.
#![warn(missing_docs)]

mod analyzer;
mod beir;
pub mod chunk;
pub mod citation;
pub mod dense;
pub mod embed;
mod eval;
mod filter;
pub mod formats;
pub mod fusion;
pub mod ingest;
mod kb;
mod mapping;
pub mod metrics;
mod retriever;
mod source;
pub mod tool;

pub use analyzer::Analyzer;
pub use beir::{BeirDataset, Document};
pub use chunk::{Chunk, ChunkingOptions};
pub use citation::{CitationReport, check_citations, cite};
pub use dense::DenseOptions;
pub use embed::{EmbedKind, Embedder, OpenAiEmbedder, passage_text};
pub use eval::{EmbeddingCache, EvalOptions, EvalReport, cache_root, evaluate, evaluate_bm25};
pub use filter::Filter;
pub use fusion::{Fusion, FusionMethod, ListRank, SearchMode, fuse, fuse_many};
pub use ingest::{IngestOptions, IngestProgress, IngestReport, NoProgress, PathPattern, SkippedFile, ingest};
pub use kb::{
    EmbeddingSettings, Hit, KB_FORMAT, KbManifest, KbStore, KbWriter, KnowledgeBase, Ranking, SearchRequest,
    validate_name,
};
pub use mapping::RecordMapping;
pub use retriever::Retriever;
pub use source::{Section, SourceDocument};

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
    /// The index failed.
    #[error("keyword index: {0}")]
    Index(#[from] tantivy::TantivyError),
}
