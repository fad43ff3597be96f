//! BM25 on the real evaluation sets (SPEC §6: `TOOLGRAPH_EVAL_DATA`, default `../shared/data`).
//! Thresholds sit just under the full run's figures (docs/retrieval.md), so a regression
//! in tokenisation, ranking or the metrics fails CI.

use std::path::PathBuf;
use toolgraph_rag::{Analyzer, BeirDataset, evaluate_bm25};

fn data_dir() -> Option<PathBuf> {
    let dir = std::env::var("TOOLGRAPH_EVAL_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"));
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false") {
        panic!("evaluation data not found at {} (set TOOLGRAPH_EVAL_DATA)", dir.display());
    }
    eprintln!("SKIPPED: evaluation data not found at {}; set TOOLGRAPH_EVAL_DATA", dir.display());
    None
}

#[test]
fn scifact_bm25_meets_its_threshold() {
    let Some(dir) = data_dir() else { return };
    let ds = BeirDataset::load(&dir.join("scifact")).unwrap();
    assert_eq!((ds.corpus.len(), ds.queries.len()), (5183, 300));
    let r = evaluate_bm25(&ds, Analyzer::English, None).unwrap();
    eprintln!("scifact: {}", serde_json::to_string(&r).unwrap());
    assert!(r.ndcg_at_10 >= SCIFACT_NDCG, "nDCG@10 {:.4} < {SCIFACT_NDCG}", r.ndcg_at_10);
}

#[test]
fn alqac_bm25_meets_its_threshold() {
    let Some(dir) = data_dir() else { return };
    let ds = BeirDataset::load(&dir.join("alqac/beir_format")).unwrap();
    assert_eq!((ds.corpus.len(), ds.queries.len()), (2131, 100));
    let r = evaluate_bm25(&ds, Analyzer::Vietnamese, None).unwrap();
    eprintln!("alqac: {}", serde_json::to_string(&r).unwrap());
    assert!(r.ndcg_at_10 >= ALQAC_NDCG, "nDCG@10 {:.4} < {ALQAC_NDCG}", r.ndcg_at_10);
    assert!(r.recall_at_10 >= ALQAC_RECALL10, "recall@10 {:.4} < {ALQAC_RECALL10}", r.recall_at_10);
}

// Full run 2026-11-22: SciFact nDCG@10 0.6691; ALQAC nDCG@10 0.8629, recall@10 0.97. The
// thresholds are the goals, which the deterministic BM25 run clears.
const SCIFACT_NDCG: f64 = 0.665;
const ALQAC_NDCG: f64 = 0.85;
const ALQAC_RECALL10: f64 = 0.97;
