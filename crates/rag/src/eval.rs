//! Evaluation on a BEIR-layout set: the metrics at document level, and query latency.

use crate::metrics::{mrr_at, ndcg_at, recall_at};
use crate::{Analyzer, BeirDataset, KeywordIndex, RagError};
use serde::Serialize;
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
    /// Documents indexed.
    pub documents: usize,
    /// Indexing time, ms.
    pub index_ms: f64,
}

/// BM25 over the dataset's corpus, evaluated on (at most `limit`) judged queries.
///
/// # Errors
/// When indexing or a search fails.
pub fn evaluate_bm25(ds: &BeirDataset, analyzer: Analyzer, limit: Option<usize>) -> Result<EvalReport, RagError> {
    let started = Instant::now();
    let index = KeywordIndex::build_in_ram(analyzer, &ds.corpus)?;
    let index_ms = started.elapsed().as_secs_f64() * 1e3;
    let queries: Vec<&(String, String)> = ds.queries.iter().take(limit.unwrap_or(usize::MAX)).collect();
    let (mut ndcg, mut r5, mut r10, mut r100, mut mrr) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut latencies = Vec::with_capacity(queries.len());
    for (id, text) in &queries {
        let t = Instant::now();
        let hits = index.search(text, 100)?;
        latencies.push(t.elapsed().as_secs_f64() * 1e3);
        let ranked: Vec<String> = hits.into_iter().map(|(d, _)| d).collect();
        let Some(rel) = ds.qrels.get(id) else { continue };
        ndcg += ndcg_at(&ranked, rel, 10);
        r5 += recall_at(&ranked, rel, 5);
        r10 += recall_at(&ranked, rel, 10);
        r100 += recall_at(&ranked, rel, 100);
        mrr += mrr_at(&ranked, rel, 10);
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
        mode: "bm25",
        documents: ds.corpus.len(),
        index_ms,
    })
}
