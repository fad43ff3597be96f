//! The evaluation stage, on a BEIR-layout set ([`BeirDataset`]): the corpus goes through the
//! same chunking and index as an ingest; [`metrics`] are at document level (sub-chunk hits
//! aggregate to their document, at the rank of its best chunk), with query latency and ingest
//! throughput.
//!
//! Dense and hybrid runs embed the chunks once per (corpus content, model) pair: the vectors
//! are cached on disk ([`EmbeddingCache`]) so a second run embeds nothing.

mod beir;
mod cache;
pub mod metrics;

pub use beir::{BeirDataset, Document};
pub use cache::EmbeddingCache;

use crate::RagError;
use crate::embed::{EmbedKind, Embedder, embedder_for_language, passage_text};
use crate::index::{Analyzer, Chunk, ChunkingOptions, KbManifest, KnowledgeBase};
use crate::ingest::SourceDocument;
use crate::ingest::chunk::chunk_document;
use crate::search::{Fusion, FusionMethod, Ranking, SearchMode, SearchRequest};
use cache::embed_cached;
use metrics::{mrr_at, ndcg_at, recall_at};
use serde::Serialize;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

/// What `toolgraph eval retrieval --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    /// nDCG@10.
    pub ndcg_at_10: f64,
    /// Recall@5.
    pub recall_at_5: f64,
    /// Recall@10.
    pub recall_at_10: f64,
    /// Recall@100.
    pub recall_at_100: f64,
    /// MRR@10.
    pub mrr_at_10: f64,
    /// Median query latency, ms.
    pub latency_p50_ms: f64,
    /// 99th percentile query latency, ms.
    pub latency_p99_ms: f64,
    /// Queries evaluated.
    pub queries: usize,
    /// Retrieval mode.
    pub mode: &'static str,
    /// Where the corpus was indexed: `embedded` or `qdrant`.
    pub index: &'static str,
    /// How the lists were fused (hybrid mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fusion: Option<FusionMethod>,
    /// The embedding model (dense and hybrid; `a+b` for two models side by side).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<String>,
    /// Texts (chunks and queries) embedded in this run (0 when every vector came from the cache).
    pub embedded_texts: usize,
    /// Time spent embedding chunks and queries in this run, ms.
    pub embed_ms: f64,
    /// Whether the chunk vectors came from the cache.
    pub embedding_cache_hit: bool,
    /// Documents indexed.
    pub documents: usize,
    /// Chunks indexed.
    pub chunks: usize,
    /// Chunking and indexing time, ms.
    pub index_ms: f64,
    /// Documents chunked and indexed per second.
    pub ingest_docs_per_s: f64,
}

/// What to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions<'a> {
    /// Keyword analyzer.
    pub analyzer: Analyzer,
    /// Chunking, as an ingest would use.
    pub chunking: ChunkingOptions,
    /// Evaluate only the first N judged queries.
    pub limit: Option<usize>,
    /// Ranking mode.
    pub mode: SearchMode,
    /// The embedding model (dense and hybrid).
    pub embedder: Option<&'a dyn Embedder>,
    /// Fusion method and parameters (hybrid).
    pub fusion: Fusion,
    /// Where chunk vectors are cached; `None` embeds every run.
    pub cache: Option<EmbeddingCache>,
    /// Where to write the ranked documents of every query as a TREC run file
    /// (`qid Q0 doc rank score tag`, the format `trec_eval`, pytrec_eval and ranx read).
    pub run_file: Option<PathBuf>,
    /// Index the corpus on this Qdrant server (in a collection made for the run and dropped
    /// after it) instead of in memory.
    pub qdrant: Option<crate::index::QdrantOptions>,
}

impl EvalOptions<'_> {
    /// BM25 with default chunking.
    pub fn bm25(analyzer: Analyzer) -> Self {
        Self {
            analyzer,
            chunking: ChunkingOptions::default(),
            limit: None,
            mode: SearchMode::Bm25,
            embedder: None,
            fusion: Fusion::default(),
            cache: None,
            run_file: None,
            qdrant: None,
        }
    }
}

/// BM25 over the dataset's corpus, evaluated on (at most `limit`) judged queries.
///
/// # Errors
/// When indexing or a search fails.
pub fn evaluate_bm25(
    ds: &BeirDataset,
    analyzer: Analyzer,
    chunking: ChunkingOptions,
    limit: Option<usize>,
) -> Result<EvalReport, RagError> {
    evaluate(ds, &EvalOptions { chunking, limit, ..EvalOptions::bm25(analyzer) }, &mut |_, _| {})
}

/// Evaluates `options.mode` over the dataset; `progress(done, total)` reports embedding.
///
/// # Errors
/// When indexing, embedding or a search fails, or a dense mode has no embedder.
pub fn evaluate(
    ds: &BeirDataset,
    options: &EvalOptions<'_>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalReport, RagError> {
    let started = Instant::now();
    let embedder = match (options.mode, options.embedder) {
        (SearchMode::Bm25, _) => None,
        // As an ingest into a new knowledge base of this language would embed.
        (_, Some(e)) => Some(embedder_for_language(e, options.analyzer)),
        (mode, None) => {
            return Err(RagError::Embedding(format!("mode {} needs an embedding model", mode.as_str())));
        }
    };
    let mut manifest = KbManifest::new("eval", "eval", options.analyzer);
    manifest.chunking = options.chunking;
    manifest.embedding = embedder.map(|e| e.settings().clone());
    let kb = match &options.qdrant {
        None => KnowledgeBase::in_memory(manifest)?,
        Some(q) => {
            // A collection of this run's own (the process and the time name it).
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            manifest.name = format!("eval-{}-{nanos}", std::process::id());
            KnowledgeBase::on_qdrant(manifest, q)?
        }
    };
    // The run's collection goes with the run, whatever the outcome.
    struct DropRemote<'a>(&'a KnowledgeBase);
    impl Drop for DropRemote<'_> {
        fn drop(&mut self) {
            if let Err(e) = self.0.drop_remote() {
                tracing::warn!(error = %e, "cannot delete the evaluation's Qdrant collection");
            }
        }
    }
    let _drop_remote = DropRemote(&kb);
    let per_doc: Vec<Vec<Chunk>> = ds
        .corpus
        .iter()
        .map(|d| {
            chunk_document(
                &SourceDocument::plain(d.id.clone(), d.title.clone(), d.text.clone()),
                options.chunking,
                false,
            )
        })
        .collect();
    let chunks: usize = per_doc.iter().map(Vec::len).sum();
    let chunking_ms = started.elapsed().as_secs_f64() * 1e3;

    let mut embed_ms = 0.0;
    let mut embedded_texts = 0;
    let mut cache_hit = false;
    let vectors = match embedder {
        None => None,
        Some(e) => {
            let t = Instant::now();
            let texts: Vec<String> = per_doc.iter().flatten().map(passage_text).collect();
            let (vectors, embedded, hit) =
                embed_cached(e, EmbedKind::Passage, &texts, options.cache.as_ref(), progress)?;
            embedded_texts += embedded;
            cache_hit = hit;
            embed_ms += t.elapsed().as_secs_f64() * 1e3;
            Some(vectors)
        }
    };

    let t = Instant::now();
    let mut writer = kb.writer()?;
    let mut offset = 0;
    for (d, doc_chunks) in ds.corpus.iter().zip(&per_doc) {
        let v = vectors.as_ref().map(|v| &v[offset..offset + doc_chunks.len()]);
        writer.replace_source_embedded(&d.id, "", doc_chunks, v)?;
        offset += doc_chunks.len();
    }
    writer.commit()?;
    let index_ms = chunking_ms + t.elapsed().as_secs_f64() * 1e3;

    let queries: Vec<&(String, String)> = ds.queries.iter().take(options.limit.unwrap_or(usize::MAX)).collect();
    let query_vectors = match embedder {
        None => None,
        Some(e) => {
            let t = Instant::now();
            let texts: Vec<String> = queries.iter().map(|(_, q)| q.clone()).collect();
            let (v, embedded, _) = embed_cached(e, EmbedKind::Query, &texts, options.cache.as_ref(), &mut |_, _| {})?;
            embedded_texts += embedded;
            embed_ms += t.elapsed().as_secs_f64() * 1e3;
            Some(v)
        }
    };
    // Build the dense index before timing queries (a server builds it once per commit).
    if let Some(v) = query_vectors.as_ref().and_then(|v| v.first()) {
        kb.search_doc_ids(&SearchRequest { query: "", filters: &[], top_k: 1 }, Ranking::Dense(v))?;
    }

    let (mut ndcg, mut r5, mut r10, mut r100, mut mrr) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut latencies = Vec::with_capacity(queries.len());
    let mut run = String::new();
    for (i, (id, text)) in queries.iter().enumerate() {
        let vector = query_vectors.as_ref().map(|v| v[i].as_slice());
        let ranking = match (options.mode, vector) {
            (SearchMode::Dense, Some(v)) => Ranking::Dense(v),
            (SearchMode::Hybrid, Some(v)) => Ranking::Hybrid(v, Fusion { depth: 150, ..options.fusion }),
            _ => Ranking::Bm25,
        };
        let t = Instant::now();
        // 150 chunks leave 100 distinct documents after aggregation on both sets (recall@100
        // equals a 300-chunk run's) at half its latency.
        let hits = match kb.search_doc_ids(&SearchRequest { query: text, filters: &[], top_k: 150 }, ranking) {
            Ok(h) => h,
            Err(RagError::EmptyQuery) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut seen = HashSet::new();
        let ranked: Vec<(String, f32)> =
            hits.into_iter().filter(|(doc, _)| seen.insert(doc.clone())).take(100).collect();
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
        if options.run_file.is_some() {
            for (rank, (doc, score)) in ranked.iter().enumerate() {
                let (id, doc) = (run_file_id(id), run_file_id(doc));
                let _ = writeln!(run, "{id} Q0 {doc} {} {score} toolgraph-{}", rank + 1, options.mode.as_str());
            }
        }
        let ranked: Vec<String> = ranked.into_iter().map(|(doc, _)| doc).collect();
        let Some(rel) = ds.qrels.get(id) else { continue };
        ndcg += ndcg_at(&ranked, rel, 10);
        r5 += recall_at(&ranked, rel, 5);
        r10 += recall_at(&ranked, rel, 10);
        r100 += recall_at(&ranked, rel, 100);
        mrr += mrr_at(&ranked, rel, 10);
    }
    if let Some(path) = &options.run_file {
        std::fs::write(path, run).map_err(|e| RagError::Io {
            path: path.display().to_string(),
            reason: format!("cannot write the run file: {e}"),
        })?;
    }
    let n = queries.len().max(1) as f64;
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies.get(((latencies.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
    Ok(EvalReport {
        ndcg_at_10: ndcg / n,
        recall_at_5: r5 / n,
        recall_at_10: r10 / n,
        recall_at_100: r100 / n,
        mrr_at_10: mrr / n,
        latency_p50_ms: pct(0.5),
        latency_p99_ms: pct(0.99),
        queries: queries.len(),
        mode: options.mode.as_str(),
        index: if options.qdrant.is_some() { "qdrant" } else { "embedded" },
        fusion: (options.mode == SearchMode::Hybrid).then_some(options.fusion.method),
        embedding_model: embedder.map(|e| e.settings().model.clone()),
        embedded_texts,
        embed_ms,
        embedding_cache_hit: cache_hit,
        documents: ds.corpus.len(),
        chunks,
        index_ms,
        ingest_docs_per_s: ds.corpus.len() as f64 / (index_ms / 1e3).max(1e-9),
    })
}

/// An id as a run file's whitespace-separated columns can hold: `%`, space, tab and line breaks
/// percent-encoded (ALQAC's document ids contain spaces; `urllib.parse.unquote` decodes them).
fn run_file_id(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(|c: char| c == '%' || c.is_whitespace()) {
        return id.into();
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        if c == '%' || c.is_whitespace() {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out.into()
}
