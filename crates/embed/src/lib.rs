//! The embedding contract of toolgraph: what a model that turns text into vectors promises, and
//! how a knowledge base names the model it was built with.
//!
//! Owns: the [`Embedder`] trait and [`EmbedKind`], the model identity [`EmbeddingSettings`]
//! (several models side by side included), [`EmbedError`], the vector helpers [`normalise`],
//! [`dot`] and the stored form [`encode_vector`] / [`decode_vector`], and [`cache_root`], where toolgraph caches model weights and embeddings.
//!
//! Does not own: any model (the in-process ones live in `toolgraph-local-models`; the
//! OpenAI-compatible client and the combination of several models in `toolgraph-rag`), nor
//! knowledge bases, languages or search. It depends on no other toolgraph crate, so a model crate
//! implements the trait without compiling retrieval.
//!
//! # Example
//!
//! ```
//! use toolgraph_embed::{EmbedError, EmbedKind, Embedder, EmbeddingSettings, dot, normalise};
//!
//! /// A toy model: how many `a`s and `b`s a text has, as a unit vector.
//! #[derive(Debug)]
//! struct Letters(EmbeddingSettings);
//!
//! impl Embedder for Letters {
//!     fn settings(&self) -> &EmbeddingSettings {
//!         &self.0
//!     }
//!
//!     fn embed(&self, texts: &[&str], _kind: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
//!         let vector = |t: &str| {
//!             let mut v = vec![t.matches('a').count() as f32, t.matches('b').count() as f32];
//!             normalise(&mut v);
//!             v
//!         };
//!         Ok(texts.iter().map(|t| vector(t)).collect())
//!     }
//! }
//!
//! let model = Letters(EmbeddingSettings {
//!     model: "letters".into(),
//!     sha256: String::new(),
//!     dimension: 2,
//!     query_prefix: String::new(),
//!     passage_prefix: String::new(),
//!     parts: Vec::new(),
//! });
//! let v = model.embed(&["aa", "ab", "bb"], EmbedKind::Passage)?;
//! assert!((dot(&v[0], &v[0]) - 1.0).abs() < 1e-6, "unit vectors");
//! assert!(dot(&v[0], &v[1]) > dot(&v[0], &v[2]));
//! // A single model is meant for every language and holds only its own vectors.
//! assert!(model.covers("vi"));
//! assert_eq!(model.settings().models(), [model.settings().clone()]);
//! # Ok::<(), EmbedError>(())
//! ```
#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// An embedding failure: the model is not available or cannot embed the batch. The message says
/// which and why; `toolgraph-rag` reports it as `embeddings: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EmbedError(pub String);

/// Whether a text is a query or a passage (e5 and similar models embed them differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedKind {
    /// A search query.
    Query,
    /// A passage of the corpus.
    Passage,
}

/// Turns texts into unit vectors.
///
/// Embedding is CPU- or network-bound and blocking; async callers run it on a blocking thread.
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// The model's identity: a knowledge base built with one model refuses another.
    fn settings(&self) -> &EmbeddingSettings;

    /// One vector of [`EmbeddingSettings::dimension`] floats per text, in order: L2-normalised,
    /// or for a combined embedder each model's unit vector side by side.
    ///
    /// # Errors
    /// [`EmbedError`] when the model cannot embed the batch.
    fn embed(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError>;

    /// The models of a combined embedder, in order (empty for a single model).
    fn parts(&self) -> &[Arc<dyn Embedder>] {
        &[]
    }

    /// Whether this embedder is meant for text in `language`, an ISO 639-1 code such as `"en"`
    /// or `"vi"` (what `toolgraph_rag::Analyzer::code` returns for a knowledge base's language):
    /// a combined embedder whose extra models are English-only is not meant for Vietnamese.
    /// By default an embedder is meant for every language.
    fn covers(&self, language: &str) -> bool {
        let _ = language;
        true
    }
}

/// The embedding model a knowledge base was built with, as its manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingSettings {
    /// Model id.
    pub model: String,
    /// sha256 of the weights.
    pub sha256: String,
    /// Vector dimension.
    pub dimension: usize,
    /// Prefix for queries (e5: `query: `).
    pub query_prefix: String,
    /// Prefix for passages (e5: `passage: `).
    pub passage_prefix: String,
    /// For several models side by side (a combined embedder), each model's settings in order:
    /// stored vectors hold their vectors one after the other, and search keeps one dense list
    /// per model. Empty for a single model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<EmbeddingSettings>,
}

impl EmbeddingSettings {
    /// The models whose vectors a stored vector holds, in order (the model itself when single).
    pub fn models(&self) -> &[EmbeddingSettings] {
        if self.parts.is_empty() { std::slice::from_ref(self) } else { &self.parts }
    }

    /// Why these settings cannot describe stored vectors (parts that do not add up, or are
    /// themselves combined), if they cannot. A knowledge base checks it when it opens, so
    /// search can slice each model's part out of a stored vector without checking again.
    pub fn inconsistency(&self) -> Option<String> {
        let sum: usize = self.parts.iter().map(|p| p.dimension).sum();
        if !self.parts.is_empty() && sum != self.dimension {
            return Some(format!(
                "the embedding `{}` has {} dimensions but its models add up to {sum}",
                self.model, self.dimension
            ));
        }
        self.parts.iter().any(|p| !p.parts.is_empty()).then(|| format!("the embedding `{}` nests models", self.model))
    }
}

/// Divides by the L2 norm (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// A vector as stored (a knowledge base's index, a memory item): little-endian f32s.
pub fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The inverse of [`encode_vector`]; trailing bytes short of an f32 are ignored.
pub fn decode_vector(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Dot product (the cosine of two unit vectors).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators let the compiler vectorise without reassociating floats.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// toolgraph's cache directory: `${XDG_CACHE_HOME:-$HOME/.cache}/toolgraph` (models,
/// embeddings, build output).
pub fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("toolgraph")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(model: &str, dimension: usize, parts: Vec<EmbeddingSettings>) -> EmbeddingSettings {
        EmbeddingSettings {
            model: model.into(),
            sha256: format!("{model}-sha"),
            dimension,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            parts,
        }
    }

    #[test]
    fn dot_matches_the_naive_sum() {
        let a: Vec<f32> = (0..387).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..387).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
    }

    #[test]
    fn combined_settings_whose_parts_do_not_add_up_or_nest_are_inconsistent() {
        let e5 = settings("e5", 384, Vec::new());
        let minilm = settings("minilm", 384, Vec::new());
        assert_eq!(settings("both", 768, vec![e5.clone(), minilm.clone()]).inconsistency(), None);
        let err = settings("both", 700, vec![e5.clone(), minilm.clone()]).inconsistency().unwrap();
        assert!(err.contains("add up to 768"), "{err}");
        let nested = settings("nested", 1152, vec![e5.clone(), settings("both", 768, vec![e5, minilm])]);
        assert!(nested.inconsistency().unwrap().contains("nests models"));
    }
}
