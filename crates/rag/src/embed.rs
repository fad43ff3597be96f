//! Text embeddings behind one trait: what dense search and hybrid fusion call, whether the
//! vectors come from the in-process e5 model (`toolgraph-local-models`) or an
//! OpenAI-compatible `/v1/embeddings` server ([`OpenAiEmbedder`]).
//!
//! Embedding is CPU- or network-bound and blocking; async callers run it on a blocking thread.

use crate::RagError;
use crate::kb::EmbeddingSettings;
use serde::Deserialize;
use std::time::Duration;

/// Whether a text is a query or a passage (e5 and similar models embed them differently).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbedKind {
    /// A search query.
    Query,
    /// A passage of the corpus.
    Passage,
}

/// Turns texts into unit vectors.
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// The model's identity: a knowledge base built with one model refuses another.
    fn settings(&self) -> &EmbeddingSettings;

    /// One L2-normalised vector of [`EmbeddingSettings::dimension`] floats per text, in order.
    ///
    /// # Errors
    /// [`RagError::Embedding`] when the model cannot embed the batch.
    fn embed(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, RagError>;
}

/// Checks that a knowledge base built with `built` can be searched or extended with `with`.
///
/// # Errors
/// [`RagError::Mismatch`] naming both models.
pub fn ensure_same_model(built: &EmbeddingSettings, with: &EmbeddingSettings) -> Result<(), RagError> {
    if built.model != with.model || built.sha256 != with.sha256 || built.dimension != with.dimension {
        return Err(RagError::Mismatch(format!(
            "this knowledge base was embedded with {} ({} dimensions, sha256 {}); the configured embedder is {} \
             ({} dimensions, sha256 {}): re-ingest into a new knowledge base or configure the original model",
            built.model,
            built.dimension,
            short(&built.sha256),
            with.model,
            with.dimension,
            short(&with.sha256)
        )));
    }
    Ok(())
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// The text a chunk is embedded from: its document title and heading path give the passage
/// its context (an article's number and law name, a section's title).
pub fn passage_text(chunk: &crate::Chunk) -> String {
    let mut out = String::with_capacity(chunk.title.len() + chunk.text.len() + 16);
    if !chunk.title.is_empty() {
        out.push_str(&chunk.title);
        out.push('\n');
    }
    if !chunk.headings.is_empty() {
        out.push_str(&chunk.headings.join(" > "));
        out.push('\n');
    }
    out.push_str(&chunk.text);
    out
}

/// Divides by the L2 norm (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
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

/// An OpenAI-compatible `/v1/embeddings` client (vLLM, llama.cpp server, Ollama, OpenAI).
#[derive(Debug)]
pub struct OpenAiEmbedder {
    client: reqwest::blocking::Client,
    url: String,
    api_key: Option<String>,
    settings: EmbeddingSettings,
    batch: usize,
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingRow>,
}

#[derive(Deserialize)]
struct EmbeddingRow {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    /// A client for `base_url` (e.g. `http://127.0.0.1:8000/v1`) and `model`, whose vectors have
    /// `dimension` floats. Texts get `settings.query_prefix` / `passage_prefix` prepended.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        settings: EmbeddingSettings,
        timeout: Duration,
    ) -> Result<Self, RagError> {
        let client = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| RagError::Embedding(format!("HTTP client: {e}")))?;
        Ok(Self { client, url: format!("{}/embeddings", base_url.trim_end_matches('/')), api_key, settings, batch: 64 })
    }
}

impl Embedder for OpenAiEmbedder {
    fn settings(&self) -> &EmbeddingSettings {
        &self.settings
    }

    fn embed(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, RagError> {
        let prefix = match kind {
            EmbedKind::Query => &self.settings.query_prefix,
            EmbedKind::Passage => &self.settings.passage_prefix,
        };
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(self.batch) {
            let input: Vec<String> = batch.iter().map(|t| format!("{prefix}{t}")).collect();
            let mut req = self
                .client
                .post(&self.url)
                .json(&serde_json::json!({"model": self.settings.model, "input": input, "encoding_format": "float"}));
            if let Some(key) = &self.api_key {
                req = req.bearer_auth(key);
            }
            let resp = req.send().map_err(|e| RagError::Embedding(format!("{}: {e}", self.url)))?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.text().unwrap_or_default();
                return Err(RagError::Embedding(format!(
                    "{} answered {status}: {}",
                    self.url,
                    body.chars().take(300).collect::<String>()
                )));
            }
            let mut parsed: EmbeddingsResponse =
                resp.json().map_err(|e| RagError::Embedding(format!("{}: unexpected response: {e}", self.url)))?;
            if parsed.data.len() != batch.len() {
                return Err(RagError::Embedding(format!(
                    "{} returned {} vectors for {} inputs",
                    self.url,
                    parsed.data.len(),
                    batch.len()
                )));
            }
            parsed.data.sort_by_key(|r| r.index);
            for mut row in parsed.data {
                if row.embedding.len() != self.settings.dimension {
                    return Err(RagError::Embedding(format!(
                        "{} returned {} dimensions; the knowledge base expects {}",
                        self.url,
                        row.embedding.len(),
                        self.settings.dimension
                    )));
                }
                normalise(&mut row.embedding);
                out.push(row.embedding);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(model: &str, sha: &str, dim: usize) -> EmbeddingSettings {
        EmbeddingSettings {
            model: model.into(),
            sha256: sha.into(),
            dimension: dim,
            query_prefix: String::new(),
            passage_prefix: String::new(),
        }
    }

    #[test]
    fn a_different_model_is_refused_by_name_weights_or_dimension() {
        let built = settings("e5-small", "aaaa", 384);
        assert!(ensure_same_model(&built, &built.clone()).is_ok());
        for other in
            [settings("bge-small", "aaaa", 384), settings("e5-small", "bbbb", 384), settings("e5-small", "aaaa", 768)]
        {
            let err = ensure_same_model(&built, &other).unwrap_err().to_string();
            assert!(err.contains("e5-small") && err.contains("re-ingest"), "{err}");
        }
    }

    #[test]
    fn dot_matches_the_naive_sum() {
        let a: Vec<f32> = (0..387).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..387).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-4);
    }
}
