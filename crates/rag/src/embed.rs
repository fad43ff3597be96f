//! rag's embedders: an OpenAI-compatible `/v1/embeddings` client ([`OpenAiEmbedder`]) and
//! several models side by side ([`CombinedEmbedder`]: one dense list per model, fused with the
//! keyword list), plus the rules for which model a knowledge base is embedded and searched with.
//!
//! The [`Embedder`] contract itself lives in `toolgraph-embed` (re-exported here), so the
//! in-process models of `toolgraph-local-models` implement it without depending on retrieval.
//! Embedding is CPU- or network-bound and blocking; async callers run it on a blocking thread.

pub use toolgraph_embed::{
    EmbedError, EmbedKind, Embedder, EmbeddingSettings, decode_vector, dot, encode_vector, normalise,
};

use crate::RagError;
use crate::index::{Analyzer, Chunk};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

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

/// The embedder a knowledge base is embedded or searched with, given the configured one: a
/// combined embedder gives way to its first model for a knowledge base built with that model
/// alone, and for a new one in a language its extra models are not meant for. Anything else is
/// the configured embedder (and [`ensure_same_model`] then accepts or refuses it).
pub fn embedder_for_kb(
    configured: &Arc<dyn Embedder>,
    language: Analyzer,
    built: Option<&EmbeddingSettings>,
) -> Arc<dyn Embedder> {
    match configured.parts().first() {
        Some(first) if first_alone(configured.as_ref(), language, built) => first.clone(),
        _ => configured.clone(),
    }
}

/// [`embedder_for_kb`] for a new knowledge base, on a borrowed embedder (evaluations).
pub fn embedder_for_language(configured: &dyn Embedder, language: Analyzer) -> &dyn Embedder {
    match configured.parts().first() {
        Some(first) if first_alone(configured, language, None) => first.as_ref(),
        _ => configured,
    }
}

/// Whether a combined embedder's first model alone serves this knowledge base.
fn first_alone(configured: &dyn Embedder, language: Analyzer, built: Option<&EmbeddingSettings>) -> bool {
    let Some(first) = configured.parts().first() else { return false };
    let same = |a: &EmbeddingSettings, b: &EmbeddingSettings| a.model == b.model && a.sha256 == b.sha256;
    match built {
        Some(b) => !same(b, configured.settings()) && same(b, first.settings()),
        None => !configured.covers(language.code()),
    }
}

/// Several models side by side: each text's vector is every model's unit vector, concatenated.
/// A knowledge base built with it keeps one dense list per model and fuses them all with the
/// keyword list (named vectors, in Qdrant's terms). The extra models can be limited to some
/// languages (an English-only model beside a multilingual one).
#[derive(Debug)]
pub struct CombinedEmbedder {
    parts: Vec<Arc<dyn Embedder>>,
    languages: Option<Vec<Analyzer>>,
    settings: EmbeddingSettings,
}

impl CombinedEmbedder {
    /// Combines `parts` (at least two single models); `languages`, when given, are the
    /// knowledge-base languages the combination is meant for (others get the first model alone).
    ///
    /// # Errors
    /// [`RagError::Embedding`] for fewer than two parts or a part that is itself combined.
    pub fn new(parts: Vec<Arc<dyn Embedder>>, languages: Option<Vec<Analyzer>>) -> Result<Self, RagError> {
        if parts.len() < 2 || parts.iter().any(|p| !p.parts().is_empty()) {
            return Err(RagError::Embedding("a combined embedder needs two or more single models".into()));
        }
        let settings: Vec<EmbeddingSettings> = parts.iter().map(|p| p.settings().clone()).collect();
        let mut sha = Sha256::new();
        for p in &settings {
            sha.update(p.sha256.as_bytes());
            sha.update(b"\n");
        }
        let settings = EmbeddingSettings {
            model: settings.iter().map(|p| p.model.as_str()).collect::<Vec<_>>().join("+"),
            sha256: hex::encode(sha.finalize()),
            dimension: settings.iter().map(|p| p.dimension).sum(),
            query_prefix: String::new(),
            passage_prefix: String::new(),
            parts: settings,
        };
        Ok(Self { parts, languages, settings })
    }
}

impl Embedder for CombinedEmbedder {
    fn settings(&self) -> &EmbeddingSettings {
        &self.settings
    }

    fn embed(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out: Vec<Vec<f32>> = texts.iter().map(|_| Vec::with_capacity(self.settings.dimension)).collect();
        for part in &self.parts {
            let vectors = part.embed(texts, kind)?;
            if vectors.len() != texts.len() {
                return Err(EmbedError(format!(
                    "{} returned {} vectors for {} texts",
                    part.settings().model,
                    vectors.len(),
                    texts.len()
                )));
            }
            for (o, v) in out.iter_mut().zip(vectors) {
                o.extend(v);
            }
        }
        Ok(out)
    }

    fn parts(&self) -> &[Arc<dyn Embedder>] {
        &self.parts
    }

    fn covers(&self, language: &str) -> bool {
        self.languages.as_ref().is_none_or(|l| l.iter().any(|a| a.code() == language))
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// The text a chunk is embedded from: its document title and heading path give the passage
/// its context (an article's number and law name, a section's title).
pub fn passage_text(chunk: &Chunk) -> String {
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

    fn embed(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
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
            let resp = req.send().map_err(|e| EmbedError(format!("{}: {e}", self.url)))?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.text().unwrap_or_default();
                return Err(EmbedError(format!(
                    "{} answered {status}: {}",
                    self.url,
                    body.chars().take(300).collect::<String>()
                )));
            }
            let mut parsed: EmbeddingsResponse =
                resp.json().map_err(|e| EmbedError(format!("{}: unexpected response: {e}", self.url)))?;
            if parsed.data.len() != batch.len() {
                return Err(EmbedError(format!(
                    "{} returned {} vectors for {} inputs",
                    self.url,
                    parsed.data.len(),
                    batch.len()
                )));
            }
            parsed.data.sort_by_key(|r| r.index);
            for mut row in parsed.data {
                if row.embedding.len() != self.settings.dimension {
                    return Err(EmbedError(format!(
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
            parts: Vec::new(),
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

    /// A model that maps every text to one fixed unit vector.
    #[derive(Debug)]
    struct Fixed(EmbeddingSettings, Vec<f32>);

    impl Embedder for Fixed {
        fn settings(&self) -> &EmbeddingSettings {
            &self.0
        }
        fn embed(&self, texts: &[&str], _: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
            Ok(texts.iter().map(|_| self.1.clone()).collect())
        }
    }

    fn fixed(model: &str, v: Vec<f32>) -> Arc<dyn Embedder> {
        Arc::new(Fixed(settings(model, &format!("{model}-sha"), v.len()), v))
    }

    #[test]
    fn a_combined_embedder_puts_each_models_vector_side_by_side() {
        let e5 = fixed("e5", vec![1.0, 0.0, 0.0]);
        let minilm = fixed("minilm", vec![0.0, 1.0]);
        let both = CombinedEmbedder::new(vec![e5.clone(), minilm.clone()], Some(vec![Analyzer::English])).unwrap();
        let s = both.settings();
        assert_eq!((s.model.as_str(), s.dimension), ("e5+minilm", 5));
        assert_eq!(s.parts.iter().map(|p| p.model.as_str()).collect::<Vec<_>>(), ["e5", "minilm"]);
        assert_eq!(both.embed(&["x", "y"], EmbedKind::Query).unwrap(), vec![vec![1.0, 0.0, 0.0, 0.0, 1.0]; 2]);
        // Its identity depends on every part's weights.
        let other = CombinedEmbedder::new(vec![e5.clone(), fixed("minilm", vec![0.0, 1.0])], None).unwrap();
        assert_eq!(other.settings().sha256, both.settings().sha256);
        let changed = Arc::new(Fixed(settings("minilm", "other-sha", 2), vec![0.0, 1.0]));
        let changed = CombinedEmbedder::new(vec![e5.clone(), changed], None).unwrap();
        assert_ne!(changed.settings().sha256, both.settings().sha256);
        // One part, or a combined part, is refused.
        assert!(CombinedEmbedder::new(vec![e5.clone()], None).is_err());
        let nested: Arc<dyn Embedder> = Arc::new(both);
        assert!(CombinedEmbedder::new(vec![e5, nested], None).is_err());
    }

    #[test]
    fn a_knowledge_base_gets_the_models_it_was_built_with_or_its_language_allows() {
        let e5 = fixed("e5", vec![1.0]);
        let both: Arc<dyn Embedder> = Arc::new(
            CombinedEmbedder::new(vec![e5.clone(), fixed("minilm", vec![1.0])], Some(vec![Analyzer::English])).unwrap(),
        );
        let model = |e: Arc<dyn Embedder>| e.settings().model.clone();
        // New knowledge bases: English gets both models, Vietnamese the multilingual one.
        assert_eq!(model(embedder_for_kb(&both, Analyzer::English, None)), "e5+minilm");
        assert_eq!(model(embedder_for_kb(&both, Analyzer::Vietnamese, None)), "e5");
        assert_eq!(embedder_for_language(both.as_ref(), Analyzer::Vietnamese).settings().model, "e5");
        assert_eq!(embedder_for_language(both.as_ref(), Analyzer::English).settings().model, "e5+minilm");
        // Existing ones keep what they were built with, whatever their language.
        assert_eq!(model(embedder_for_kb(&both, Analyzer::English, Some(e5.settings()))), "e5");
        assert_eq!(model(embedder_for_kb(&both, Analyzer::Vietnamese, Some(both.settings()))), "e5+minilm");
        // Another model: the configured one, which the model check then refuses.
        let bge = settings("bge", "bge-sha", 1);
        let chosen = embedder_for_kb(&both, Analyzer::English, Some(&bge));
        assert!(ensure_same_model(&bge, chosen.settings()).is_err());
        // A single model is always itself.
        assert_eq!(model(embedder_for_kb(&e5, Analyzer::Vietnamese, Some(&bge))), "e5");
    }
}
