//! The retrieval pieces the configuration names: the knowledge-base store, the embedding model
//! (`rag.embedding`: local e5, an OpenAI-compatible server, or none; `rag.second_embedding`: a
//! second model beside it for some languages) and the retriever that fuses keyword and dense
//! results.

#[cfg(feature = "local-models")]
use anyhow::Context;
#[cfg(not(feature = "local-models"))]
use anyhow::bail;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_config::{Config, EmbeddingProvider, KbBackend, SecondEmbedding};
use toolgraph_rag::embed::CombinedEmbedder;
use toolgraph_rag::{
    Analyzer, DenseOptions, Embedder, EmbeddingSettings, Fusion, KbStore, OpenAiEmbedder, QdrantOptions, Retriever,
};

/// The knowledge bases: under `<data_dir>/kb`, or on the Qdrant server with
/// `rag.backend = "qdrant"`.
pub fn kb_store(cfg: &Config) -> Arc<KbStore> {
    store_of(cfg, "kb", "")
}

/// The documents attached to conversations (docs/service.md, "Documents in the conversation"):
/// under `<data_dir>/attachments`, or on the Qdrant server in collections of their own
/// (`tg_att_…`), apart from the tenants' knowledge bases.
pub fn attachment_store(cfg: &Config) -> Arc<KbStore> {
    store_of(cfg, "attachments", "att_")
}

/// A store of knowledge bases under `<data_dir>/<dir>`, or on the Qdrant server in the
/// collections whose names go on with `collections` after the usual prefix.
fn store_of(cfg: &Config, dir: &str, collections: &str) -> Arc<KbStore> {
    let dense = DenseOptions { exact_below: cfg.rag.dense_exact_below, ..DenseOptions::default() };
    let store = KbStore::new(cfg.data_dir.join(dir)).with_dense_options(dense);
    Arc::new(match qdrant(cfg) {
        Some(mut q) => {
            q.prefix.push_str(collections);
            store.with_qdrant(q)
        }
        None => store,
    })
}

/// The Qdrant server knowledge bases live on, with `rag.backend = "qdrant"`.
pub fn qdrant(cfg: &Config) -> Option<QdrantOptions> {
    if cfg.rag.backend != KbBackend::Qdrant {
        return None;
    }
    // Config validation requires the URL with this backend.
    let mut options = QdrantOptions::new(cfg.qdrant_url.clone().unwrap_or_default());
    options.api_key = cfg.qdrant_api_key.as_ref().map(|k| k.expose().to_owned());
    Some(options)
}

/// The configured embedding model; `None` for `rag.embedding = "none"`. With
/// `rag.second_embedding`, both models side by side, meant for `second_embedding_languages`.
///
/// # Errors
/// When a model cannot be loaded (missing weights name `scripts/fetch-models`).
pub fn embedder(cfg: &Config) -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    let Some(first) = first_embedder(cfg)? else { return Ok(None) };
    let second = match cfg.rag.second_embedding {
        SecondEmbedding::None => return Ok(Some(first)),
        SecondEmbedding::Minilm => minilm()?,
    };
    // Config validation allows only known codes.
    let languages = cfg.rag.second_embedding_languages.iter().filter_map(|l| Analyzer::from_code(l)).collect();
    Ok(Some(Arc::new(CombinedEmbedder::new(vec![first, second], Some(languages))?)))
}

fn first_embedder(cfg: &Config) -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    match cfg.rag.embedding {
        EmbeddingProvider::None => Ok(None),
        EmbeddingProvider::Openai => {
            let r = &cfg.rag;
            // Config validation guarantees these for the openai provider.
            let settings = EmbeddingSettings {
                model: r.embedding_model.clone().unwrap_or_default(),
                sha256: String::new(),
                dimension: r.embedding_dimension.unwrap_or_default(),
                query_prefix: r.embedding_query_prefix.clone(),
                passage_prefix: r.embedding_passage_prefix.clone(),
                parts: Vec::new(),
            };
            let e = OpenAiEmbedder::new(
                r.embedding_base_url.as_deref().unwrap_or_default(),
                r.embedding_api_key.as_ref().map(|k| k.expose().to_owned()),
                settings,
                Duration::from_secs(60),
            )?;
            Ok(Some(Arc::new(e)))
        }
        EmbeddingProvider::Local => local(),
    }
}

#[cfg(feature = "local-models")]
fn local() -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    let e = toolgraph_local_models::E5Embedder::load_default().context("cannot load the local embedding model")?;
    Ok(Some(Arc::new(e)))
}

#[cfg(not(feature = "local-models"))]
fn local() -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    bail!(
        "this build has no local models (built without the `local-models` feature): set rag.embedding to \
         \"none\" or \"openai\", or rebuild with default features"
    )
}

#[cfg(feature = "local-models")]
fn minilm() -> anyhow::Result<Arc<dyn Embedder>> {
    let e = toolgraph_local_models::MiniLmEmbedder::load_default()
        .context("cannot load the second embedding model (rag.second_embedding)")?;
    Ok(Arc::new(e))
}

#[cfg(not(feature = "local-models"))]
fn minilm() -> anyhow::Result<Arc<dyn Embedder>> {
    bail!(
        "this build has no local models (built without the `local-models` feature): set rag.second_embedding \
         to \"none\", or rebuild with default features"
    )
}

/// The hybrid-search parameters of the configuration.
pub fn fusion(cfg: &Config) -> Fusion {
    Fusion {
        method: cfg.rag.fusion,
        k: cfg.rag.fusion_k,
        bm25_weight: cfg.rag.bm25_weight,
        dense_weight: cfg.rag.dense_weight,
        ..Fusion::default()
    }
}

/// A retriever with the configured model, created on the first search that needs it. That
/// search runs on a blocking thread, which both models need: the local one takes about a
/// second to load, and the OpenAI client is a blocking HTTP client that must not be built
/// inside the async runtime. Keyword-only work never loads a model or fails on missing
/// weights; a search that needs one gets the load error, which names `scripts/fetch-models`.
pub fn retriever(cfg: &Config) -> Retriever {
    if cfg.rag.embedding == EmbeddingProvider::None {
        return Retriever::new(None, fusion(cfg));
    }
    let owned = cfg.clone();
    Retriever::lazy(
        Arc::new(move || {
            let e = embedder(&owned).map_err(|e| toolgraph_rag::RagError::Embedding(format!("{e:#}")))?;
            e.ok_or_else(|| toolgraph_rag::RagError::Embedding("no embedding model is configured".into()))
        }),
        fusion(cfg),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_fusion_reaches_the_retriever() {
        let cfg = Config::from_toml_str("[rag]\nfusion = \"dbsf\"\nfusion_k = 20\nbm25_weight = 0.5\n").unwrap();
        let f = fusion(&cfg);
        assert_eq!(f.method, toolgraph_rag::FusionMethod::Dbsf);
        assert_eq!((f.k, f.bm25_weight, f.dense_weight), (20.0, 0.5, 1.0));
        assert_eq!(fusion(&Config::default()).method, toolgraph_rag::FusionMethod::Dbsf);
    }
}
