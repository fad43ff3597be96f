//! `toolgraph eval`: quality measurements anyone can rerun.

use anyhow::{Context, bail};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_config::Config;
use toolgraph_rag::{Analyzer, BeirDataset, ChunkingOptions, EmbeddingCache, EvalOptions, SearchMode, evaluate};

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Retrieval quality on a BEIR-layout folder (corpus.jsonl[.gz], queries.jsonl, qrels/test.tsv):
    /// nDCG@10, recall@5/10/100, MRR@10 and query latency.
    Retrieval {
        /// The data set folder, e.g. ../shared/data/scifact.
        #[arg(long, value_name = "DIR")]
        dataset: PathBuf,
        /// `bm25`, `dense` or `hybrid` (dense and hybrid embed with rag.embedding; the chunk
        /// vectors are cached, so only the first run per corpus and model embeds).
        #[arg(long, default_value = "bm25")]
        mode: SearchMode,
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
        /// Where chunk and query vectors are cached (default: ~/.cache/toolgraph/embeddings).
        #[arg(long, value_name = "DIR")]
        embedding_cache: Option<PathBuf>,
        /// Embed everything again, ignoring (and not writing) the cache.
        #[arg(long)]
        no_cache: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: EvalCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    let EvalCommand::Retrieval {
        dataset,
        mode,
        limit,
        language,
        max_words,
        overlap_words,
        embedding_cache,
        no_cache,
        json,
    } = cmd;
    if max_words == 0 || overlap_words >= max_words {
        bail!("--overlap-words must be smaller than --max-words, and --max-words at least 1");
    }
    let chunking = ChunkingOptions { max_words, overlap_words };
    let cfg = cfg.clone();
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
        let embedder = match mode {
            SearchMode::Bm25 => None,
            _ => Some(crate::retrieval::embedder(&cfg)?.with_context(|| {
                format!("mode {} needs an embedding model, but rag.embedding = \"none\"", mode.as_str())
            })?),
        };
        let cache =
            (!no_cache).then(|| EmbeddingCache::new(embedding_cache.unwrap_or_else(EmbeddingCache::default_dir)));
        let options = EvalOptions {
            analyzer,
            chunking,
            limit,
            mode,
            embedder: embedder.as_deref(),
            fusion: crate::retrieval::fusion(&cfg),
            cache,
        };
        let bar = if json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} embedding [{bar:30}] {pos}/{len} chunks · {per_sec} · eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar
        };
        let report = evaluate(&ds, &options, &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })?;
        bar.finish_and_clear();
        Ok((report, analyzer))
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
        if r.mode != "bm25" {
            println!(
                "embeddings: {} · {} texts embedded in {:.1} s",
                if r.embedding_cache_hit { "chunk vectors from the cache" } else { "chunk vectors computed" },
                r.embedded_texts,
                r.embed_ms / 1e3
            );
        }
        println!(
            "nDCG@10 {:.4} · recall@5 {:.4} · recall@10 {:.4} · recall@100 {:.4} · MRR@10 {:.4}",
            r.ndcg_at_10, r.recall_at_5, r.recall_at_10, r.recall_at_100, r.mrr_at_10
        );
        println!("query latency p50 {:.2} ms · p99 {:.2} ms", r.latency_p50_ms, r.latency_p99_ms);
    }
    Ok(ExitCode::SUCCESS)
}
