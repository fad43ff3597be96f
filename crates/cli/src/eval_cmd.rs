//! `toolgraph eval`: quality measurements anyone can rerun.

use anyhow::{Context, bail};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_rag::{Analyzer, BeirDataset, evaluate_bm25};

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
        /// Analyzer language: `auto` (guessed from the corpus), `en`, `es` or `vi`.
        #[arg(long, default_value = "auto")]
        language: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: EvalCommand) -> anyhow::Result<ExitCode> {
    let EvalCommand::Retrieval { dataset, mode, limit, language, json } = cmd;
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
                .with_context(|| format!("unknown language '{language}' (use auto, en, es or vi)"))?
        };
        Ok((evaluate_bm25(&ds, analyzer, limit)?, analyzer))
    })
    .await??;
    let (r, analyzer) = report;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "mode {} · analyzer {analyzer:?} · {} documents indexed in {:.0} ms · {} queries",
            r.mode, r.documents, r.index_ms, r.queries
        );
        println!(
            "nDCG@10 {:.4} · recall@5 {:.4} · recall@10 {:.4} · recall@100 {:.4} · MRR@10 {:.4}",
            r.ndcg_at_10, r.recall_at_5, r.recall_at_10, r.recall_at_100, r.mrr_at_10
        );
        println!("query latency p50 {:.2} ms · p99 {:.2} ms", r.latency_p50_ms, r.latency_p99_ms);
    }
    Ok(ExitCode::SUCCESS)
}
