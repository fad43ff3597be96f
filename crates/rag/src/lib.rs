//! Retrieval for toolgraph agents.
//!
//! Owns (so far): a keyword index with BM25 ranking and per-language analyzers
//! ([`KeywordIndex`]), loading evaluation sets in the BEIR layout ([`BeirDataset`]), and the
//! standard ranking metrics ([`metrics`]) with an evaluation driver ([`evaluate_bm25`]).
//!
//! Not yet: ingestion of documents (markdown, HTML, PDF), chunking, filters, tenancy, dense
//! embeddings, hybrid fusion and citations — the retrieval issues add them on this base.
#![warn(missing_docs)]

mod beir;
mod eval;
mod index;
pub mod metrics;

pub use beir::{BeirDataset, Document};
pub use eval::{EvalReport, evaluate_bm25};
pub use index::{Analyzer, KeywordIndex};

/// A retrieval failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RagError {
    /// A dataset file is missing or unreadable.
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
    /// The index failed.
    #[error("keyword index: {0}")]
    Index(#[from] tantivy::TantivyError),
}
