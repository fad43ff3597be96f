//! `[rag]`: knowledge bases, embeddings and hybrid fusion.

use crate::{Check, ConfigError, FusionMethod, Secret, is_http_url};
use serde::{Deserialize, Serialize};

/// `[rag]`: knowledge bases, kept under `<data_dir>/kb/<tenant>/<name>/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RagSettings {
    /// The knowledge base searched when a request or tool names none. Default: `docs`.
    /// Env: `TOOLGRAPH_RAG_DEFAULT_KB`.
    pub default_kb: String,
    /// Where knowledge bases live: `embedded` (an index per knowledge base under the data
    /// directory) or `qdrant` (a collection per tenant and knowledge base on the Qdrant server
    /// of `qdrant_url`, which every replica shares). Default: `embedded`.
    /// Env: `TOOLGRAPH_RAG_BACKEND`.
    pub backend: KbBackend,
    /// The tenant the command line (`ingest`, `search`, `chat`) works for. The service always
    /// uses the request's tenant slug. Default: `default`. Env: `TOOLGRAPH_RAG_TENANT`.
    pub tenant: String,
    /// Where chunk and query embeddings come from: `local` (multilingual-e5-small in process,
    /// weights from `scripts/fetch-models embed`), `openai` (an OpenAI-compatible
    /// `/v1/embeddings` server: `embedding_base_url`, `embedding_model`, `embedding_dimension`)
    /// or `none` (keyword search only). A knowledge base keeps the model it was built with.
    /// Default: `local`. Env: `TOOLGRAPH_RAG_EMBEDDING`.
    pub embedding: EmbeddingProvider,
    /// `openai`: the server, e.g. `http://127.0.0.1:8080/v1`. Env: `TOOLGRAPH_RAG_EMBEDDING_BASE_URL`.
    pub embedding_base_url: Option<String>,
    /// `openai`: the model name. Env: `TOOLGRAPH_RAG_EMBEDDING_MODEL`.
    pub embedding_model: Option<String>,
    /// `openai`: the vector size the model returns. Env: `TOOLGRAPH_RAG_EMBEDDING_DIMENSION`.
    pub embedding_dimension: Option<usize>,
    /// `openai`: bearer token. Env: `TOOLGRAPH_RAG_EMBEDDING_API_KEY`.
    pub embedding_api_key: Option<Secret>,
    /// `openai`: prepended to queries / passages (e5-style models want `query: ` / `passage: `).
    pub embedding_query_prefix: String,
    /// See `embedding_query_prefix`.
    pub embedding_passage_prefix: String,
    /// A second model beside `embedding`: `minilm` (all-MiniLM-L6-v2 in process, English only,
    /// weights from `scripts/fetch-models minilm`) or `none`. A new knowledge base in one of
    /// `second_embedding_languages` stores both models' vectors and hybrid search fuses three
    /// lists (keyword, first model, second model); other knowledge bases get the first model
    /// alone, and an existing one keeps what it was built with. Default: `none`.
    /// Env: `TOOLGRAPH_RAG_SECOND_EMBEDDING`.
    pub second_embedding: SecondEmbedding,
    /// Knowledge-base languages (analyzer codes `en`, `es`, `vi`, `ko`) the second model is used
    /// for. Default: `["en"]`.
    pub second_embedding_languages: Vec<String>,
    /// Hybrid search: how the keyword and dense lists are combined: `rrf` (reciprocal-rank
    /// fusion: ranks, `fusion_k` and the weights) or `dbsf` (distribution-based score fusion:
    /// each list's scores mapped from mean ± 3σ onto [0, 1], weighted and summed). Default:
    /// `dbsf` (better on every evaluation set, docs/retrieval.md). Env: `TOOLGRAPH_RAG_FUSION`.
    pub fusion: FusionMethod,
    /// Hybrid search: the RRF rank constant. Default 60.
    pub fusion_k: f32,
    /// Hybrid search: weight of the keyword list. Default 1.
    pub bm25_weight: f32,
    /// Hybrid search: weight of the dense list. Default 1.
    pub dense_weight: f32,
    /// Knowledge bases with fewer vectors are searched exactly; larger ones through an HNSW
    /// graph. Default 20000.
    pub dense_exact_below: usize,
}

/// `rag.second_embedding`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecondEmbedding {
    /// One model only.
    #[default]
    None,
    /// all-MiniLM-L6-v2 in process (English).
    Minilm,
}

/// `rag.backend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KbBackend {
    /// tantivy and the dense index under the data directory.
    #[default]
    Embedded,
    /// A Qdrant server (`qdrant_url`).
    Qdrant,
}

/// `rag.embedding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingProvider {
    /// multilingual-e5-small in process.
    Local,
    /// An OpenAI-compatible `/v1/embeddings` server.
    Openai,
    /// No embeddings: keyword search only.
    None,
}

impl Default for RagSettings {
    fn default() -> Self {
        Self {
            default_kb: "docs".into(),
            backend: KbBackend::Embedded,
            tenant: "default".into(),
            embedding: EmbeddingProvider::Local,
            embedding_base_url: None,
            embedding_model: None,
            embedding_dimension: None,
            embedding_api_key: None,
            embedding_query_prefix: String::new(),
            embedding_passage_prefix: String::new(),
            second_embedding: SecondEmbedding::None,
            second_embedding_languages: vec!["en".into()],
            fusion: FusionMethod::Dbsf,
            fusion_k: 60.0,
            bm25_weight: 1.0,
            dense_weight: 1.0,
            dense_exact_below: 20_000,
        }
    }
}

impl RagSettings {
    pub(crate) fn validate(&self, check: &Check<'_>) -> Result<(), ConfigError> {
        if self.embedding == EmbeddingProvider::Openai {
            if !is_http_url(self.embedding_base_url.as_deref()) {
                return Err(check.invalid(
                    "rag.embedding_base_url",
                    "an http(s) URL of the /v1 API is required when rag.embedding = \"openai\"".into(),
                ));
            }
            if self.embedding_model.as_deref().is_none_or(|m| m.trim().is_empty()) {
                return Err(check.invalid("rag.embedding_model", "required when rag.embedding = \"openai\"".into()));
            }
            if self.embedding_dimension.is_none_or(|d| d == 0) {
                return Err(check.invalid(
                    "rag.embedding_dimension",
                    "the model's vector size is required when rag.embedding = \"openai\"".into(),
                ));
            }
        }
        if self.second_embedding != SecondEmbedding::None {
            if self.embedding == EmbeddingProvider::None {
                return Err(check.invalid(
                    "rag.second_embedding",
                    "a second model needs a first one: rag.embedding is \"none\"".into(),
                ));
            }
            if let Some(bad) =
                self.second_embedding_languages.iter().find(|l| !matches!(l.as_str(), "en" | "es" | "vi" | "ko"))
            {
                return Err(check.invalid(
                    "rag.second_embedding_languages",
                    format!("unknown language '{bad}' (use en, es, vi or ko)"),
                ));
            }
        }
        if !(self.fusion_k >= 0.0 && self.bm25_weight >= 0.0 && self.dense_weight >= 0.0) {
            return Err(check.invalid("rag.fusion_k", "fusion_k, bm25_weight and dense_weight must be ≥ 0".into()));
        }
        Ok(())
    }
}
