//! In-process models for toolgraph, on candle: the multilingual-e5-small embedder ([`E5Embedder`])
//! for dense retrieval, the English all-MiniLM-L6-v2 embedder ([`MiniLmEmbedder`]) for a second
//! dense list, and the prompt side of local GGUF chat models ([`chat`]).
//!
//! Weights are never bundled: `scripts/fetch-models` puts them in [`models_dir`], verified by
//! sha256. This crate is separate (and optional in the binary) because candle takes minutes to
//! compile; everything else builds without it.
#![warn(missing_docs)]

pub mod chat;
pub mod e5;
pub mod encoder;
pub mod minilm;

pub use e5::E5Embedder;
pub use minilm::MiniLmEmbedder;

use std::path::{Path, PathBuf};

/// A local-model failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalModelError {
    /// The weights file is not in the cache.
    #[error("model file {path} not found: run `scripts/fetch-models {fetch}` to download and verify it{alternative}")]
    Missing {
        /// Where it was looked for.
        path: String,
        /// The `scripts/fetch-models` argument that fetches it.
        fetch: &'static str,
        /// What else can be configured instead.
        alternative: &'static str,
    },
    /// The file cannot be read.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not the format expected.
    #[error("model file: {0}")]
    Format(String),
    /// An input the model cannot take.
    #[error("{0}")]
    Input(String),
    /// The tensor library failed.
    #[error("model computation: {0}")]
    Compute(#[from] candle_core::Error),
}

impl From<LocalModelError> for toolgraph_embed::EmbedError {
    fn from(e: LocalModelError) -> Self {
        toolgraph_embed::EmbedError(e.to_string())
    }
}

/// Reads a weights file with its sha256: a missing file is [`LocalModelError::Missing`], naming
/// the `scripts/fetch-models` argument that fetches it and what else can be configured.
///
/// # Errors
/// [`LocalModelError::Missing`] or [`LocalModelError::Io`].
pub(crate) fn read_weights(
    path: &Path,
    fetch: &'static str,
    alternative: &'static str,
) -> Result<(Vec<u8>, String), LocalModelError> {
    let bytes = std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            LocalModelError::Missing { path: path.display().to_string(), fetch, alternative }
        } else {
            LocalModelError::Io { path: path.display().to_string(), reason: e.to_string() }
        }
    })?;
    let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    Ok((bytes, sha256))
}

/// Where `scripts/fetch-models` keeps weights: `$TOOLGRAPH_MODELS_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/toolgraph/models`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("TOOLGRAPH_MODELS_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => toolgraph_embed::cache_root().join("models"),
    }
}
