//! `toolgraph eval`: quality measurements anyone can rerun.

use anyhow::{Context, bail};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_rag::{Analyzer, BeirDataset, ChunkingOptions, evaluate_bm25};

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Retrieval quality on a BEIR-layout folder (corpus.jsonl[.gz], queries.jsonl, qrels/test.tsv):
    /// nDCG@10, recall@5/10/100, MRR@10 and query latency.
    Retrieval {
        /// The data set folder, e.g. ../shared/data/scifact.
        #[arg(long, value_name = "DIR")]
        dataset: PathBuf,
        /// Retrieval mode. Only `bm25` exists so far.
        #[arg(long, default_value = "bm25")]
        mode: String,
        /// Evaluate only the first N judged queries.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Analyzer language: `auto` (guessed from the corpus), `en`, `es`, `vi` or `ko`.
        #[arg(long, default_value = "auto")]
        language: String,
        /// Longest chunk in words (longer documents are sub-chunked; hits aggregate to documents).
        #[arg(long, value_name = "N", default_value_t = ChunkingOptions::default().max_words)]
        max_words: usize,
        /// Words shared by consecutive sub-chunks.
        #[arg(long, value_name = "N", default_value_t = ChunkingOptions::default().overlap_words)]
        overlap_words: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: EvalCommand) -> anyhow::Result<ExitCode> {
    let EvalCommand::Retrieval { dataset, mode, limit, language, max_words, overlap_words, json } = cmd;
    if max_words == 0 || overlap_words >= max_words {
        bail!("--overlap-words must be smaller than --max-words, and --max-words at least 1");
    }
    let chunking = ChunkingOptions { max_words, overlap_words };
    if mode != "bm25" {
        bail!("unknown mode '{mode}': only `bm25` is available so far");
    }
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let ds = BeirDataset::load(&dataset)
            .with_context(|| format!("cannot load the data set in {}", dataset.display()))?;
        let analyzer = if language == "auto" {
            let sample: String = ds.corpus.iter().take(50).map(|d| d.text.as_str()).collect::<Vec<_>>().join(" ");
            Analyzer::detect(&sample)
        } else {
            Analyzer::from_code(&language)
                .with_context(|| format!("unknown language '{language}' (use auto, en, es, vi or ko)"))?
        };
        Ok((evaluate_bm25(&ds, analyzer, chunking, limit)?, analyzer))
    })
    .await??;
    let (r, analyzer) = report;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "mode {} · analyzer {analyzer:?} · {} documents ({} chunks) indexed in {:.0} ms ({:.0} docs/s) · {} queries",
            r.mode, r.documents, r.chunks, r.index_ms, r.ingest_docs_per_s, r.queries
        );
        println!(
            "nDCG@10 {:.4} · recall@5 {:.4} · recall@10 {:.4} · recall@100 {:.4} · MRR@10 {:.4}",
            r.ndcg_at_10, r.recall_at_5, r.recall_at_10, r.recall_at_100, r.mrr_at_10
        );
        println!("query latency p50 {:.2} ms · p99 {:.2} ms", r.latency_p50_ms, r.latency_p99_ms);
    }
    Ok(ExitCode::SUCCESS)
}
