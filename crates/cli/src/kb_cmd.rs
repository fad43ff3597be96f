//! `toolgraph ingest`, `toolgraph search` and `toolgraph kb list|delete`: knowledge bases from
//! the command line.

use crate::retrieval::{embedder, kb_store, retriever};
use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use toolgraph_config::Config;
use toolgraph_rag::{
    Analyzer, ChunkingOptions, Filter, IngestOptions, IngestProgress, PathPattern, RecordMapping, SearchMode,
    SearchRequest, ingest, search::results_json,
};

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Files or folders (md, txt, html, pdf, json, jsonl; folders are walked, hidden files skipped).
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Knowledge base to add to (created on first ingest).
    #[arg(long, value_name = "NAME")]
    kb: String,
    /// Tenant that owns the knowledge base. Default: `rag.tenant`.
    #[arg(long)]
    tenant: Option<String>,
    /// Metadata for every document, e.g. --meta asignatura=iv --meta tipo_documento=guia.
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    meta: Vec<String>,
    /// Metadata from folder names, e.g. --path-meta '{asignatura}/{tipo_documento}/**'.
    #[arg(long = "path-meta", value_name = "PATTERN")]
    path_meta: Vec<String>,
    /// Record mapping for JSON files (TOML; see examples/kb/alqac-mapping.toml). Stored with the
    /// knowledge base, so later ingests reuse it.
    #[arg(long, value_name = "FILE")]
    mapping: Option<PathBuf>,
    /// One mapping key, e.g. --map records=articles --map 'id={^id}#{id}' --map meta.law='{^id}'.
    #[arg(long = "map", value_name = "KEY=TEMPLATE")]
    map: Vec<String>,
    /// Analyzer of a new knowledge base: auto, en, es, vi or ko.
    #[arg(long, default_value = "auto")]
    language: String,
    /// Longest chunk of a new knowledge base, in words.
    #[arg(long, value_name = "N")]
    max_words: Option<usize>,
    /// Words consecutive sub-chunks share.
    #[arg(long, value_name = "N")]
    overlap_words: Option<usize>,
    /// Do not embed: a keyword-only knowledge base (or ingest into one). Default: embed with
    /// the configured model (rag.embedding).
    #[arg(long)]
    keyword_only: bool,
    /// Print the report as JSON (no progress bar).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// What to look for.
    query: String,
    /// Knowledge base. Default: `rag.default_kb`.
    #[arg(long, value_name = "NAME")]
    kb: Option<String>,
    /// Tenant. Default: `rag.tenant`.
    #[arg(long)]
    tenant: Option<String>,
    /// Metadata filter: k=v, k=a|b, k>=n, k<n, k=lo..hi (repeat: all must hold).
    #[arg(long = "filter", value_name = "FILTER")]
    filters: Vec<String>,
    /// Number of results.
    #[arg(long, default_value_t = 5)]
    top_k: usize,
    /// `bm25`, `dense` or `hybrid`. Default: hybrid for a knowledge base with embeddings.
    #[arg(long)]
    mode: Option<SearchMode>,
    /// Print `{ok, query, total_results, results}` as POST /search does.
    #[arg(long)]
    json: bool,
}

struct Bar(ProgressBar);

impl IngestProgress for Bar {
    fn start(&self, files: usize) {
        self.0.set_length(files as u64);
    }
    fn advance(&self, path: &Path) {
        self.0.set_message(path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_owned());
        self.0.inc(1);
    }
    fn embedded(&self, done: usize, total: usize) {
        self.0.set_message(format!("embedded {done}/{total} chunks"));
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}

fn key_values(pairs: &[String], what: &str) -> anyhow::Result<Map<String, Value>> {
    let mut out = Map::new();
    for p in pairs {
        let (k, v) = p.split_once('=').with_context(|| format!("{what} `{p}`: expected KEY=VALUE"))?;
        if k.trim().is_empty() {
            bail!("{what} `{p}`: the key is empty");
        }
        out.insert(k.trim().to_owned(), Value::String(v.to_owned()));
    }
    Ok(out)
}

pub async fn ingest_cmd(args: IngestArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    let tenant = args.tenant.clone().unwrap_or_else(|| cfg.rag.tenant.clone());
    let mut mapping = match &args.mapping {
        Some(path) => {
            let text =
                tokio::fs::read_to_string(path).await.with_context(|| format!("cannot read {}", path.display()))?;
            Some(
                RecordMapping::from_toml(&text)
                    .map_err(anyhow::Error::msg)
                    .with_context(|| path.display().to_string())?,
            )
        }
        None => None,
    };
    if !args.map.is_empty() {
        let m = mapping.get_or_insert_with(RecordMapping::default);
        for pair in &args.map {
            m.set(pair).map_err(anyhow::Error::msg)?;
        }
    }
    let analyzer = match args.language.as_str() {
        "auto" => None,
        code => Some(
            Analyzer::from_code(code).with_context(|| format!("unknown language `{code}` (auto, en, es, vi, ko)"))?,
        ),
    };
    let chunking = (args.max_words.is_some() || args.overlap_words.is_some()).then(|| {
        let d = ChunkingOptions::default();
        ChunkingOptions {
            max_words: args.max_words.unwrap_or(d.max_words),
            overlap_words: args.overlap_words.unwrap_or(d.overlap_words),
        }
    });
    if let Some(c) = chunking
        && (c.max_words == 0 || c.overlap_words >= c.max_words)
    {
        bail!("--overlap-words must be smaller than --max-words, and --max-words at least 1");
    }
    let mut options = IngestOptions {
        meta: key_values(&args.meta, "--meta")?,
        path_patterns: args
            .path_meta
            .iter()
            .map(|p| PathPattern::parse(p).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?,
        mapping,
        analyzer,
        chunking,
        embedder: None,
    };
    let store = kb_store(cfg);
    let bar = if args.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{spinner} ingesting [{bar:30}] {pos}/{len} files {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    };
    let kb = args.kb.clone();
    let paths = args.paths.clone();
    let (cfg, keyword_only) = (cfg.clone(), args.keyword_only);
    // Loading the model (about a second of CPU) and ingesting both block: one blocking task.
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        options.embedder = if keyword_only { None } else { embedder(&cfg)? };
        Ok(ingest(&store, &tenant, &kb, &paths, &options, &Bar(bar))?)
    })
    .await
    .context("the ingest task failed")??;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}/{} ({}, {}): {} files · {} indexed · {} unchanged · {} skipped · {} documents · {} chunks written · {} chunks in total · {:.1} s",
            report.tenant,
            report.kb,
            report.analyzer,
            report.embedding_model.as_deref().unwrap_or("keyword only"),
            report.files,
            report.indexed,
            report.unchanged,
            report.skipped.len(),
            report.documents,
            report.chunks,
            report.total_chunks,
            report.elapsed_ms / 1e3
        );
        for s in &report.skipped {
            println!("  skipped {}: {}", s.path, s.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn search_cmd(args: SearchArgs, cfg: &Config) -> anyhow::Result<ExitCode> {
    let tenant = args.tenant.clone().unwrap_or_else(|| cfg.rag.tenant.clone());
    let kb_name = args.kb.clone().unwrap_or_else(|| cfg.rag.default_kb.clone());
    let filters: Vec<Filter> =
        args.filters.iter().map(|f| Filter::parse(f).map_err(anyhow::Error::msg)).collect::<anyhow::Result<_>>()?;
    let store = kb_store(cfg);
    let query = args.query.clone();
    let top_k = args.top_k.clamp(1, toolgraph_rag::search::MAX_TOP_K);
    let mode = args.mode;
    let retriever = retriever(cfg);
    let hits = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let kb = store.open(&tenant, &kb_name)?;
        Ok(retriever.search(&kb, &SearchRequest { query: &query, filters: &filters, top_k }, mode)?)
    })
    .await
    .context("the search task failed")??;
    if args.json {
        println!("{}", results_json(&args.query, &hits));
        return Ok(ExitCode::SUCCESS);
    }
    if hits.is_empty() {
        println!("no results");
    }
    for (i, h) in hits.iter().enumerate() {
        let text: String = h.chunk.text.split_whitespace().collect::<Vec<_>>().join(" ");
        let snippet: String = text.chars().take(240).collect();
        let ellipsis = if text.chars().count() > 240 { "…" } else { "" };
        let mut ranks = Vec::new();
        if let Some(r) = h.bm25 {
            ranks.push(format!("bm25 #{} {:.2}", r.rank, r.score));
        }
        if let Some(r) = h.dense {
            ranks.push(format!("dense #{} {:.3}", r.rank, r.score));
        }
        for (i, r) in h.more_dense.iter().enumerate() {
            if let Some(r) = r {
                ranks.push(format!("dense {} #{} {:.3}", i + 2, r.rank, r.score));
            }
        }
        println!(
            "{}. [{}] score {:.4} ({})\n   {snippet}{ellipsis}",
            i + 1,
            h.chunk.citation,
            h.score,
            ranks.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolgraph kb`: the knowledge bases themselves.
#[derive(Debug, clap::Subcommand)]
pub enum KbCommand {
    /// The tenant's knowledge bases, with their documents and chunks.
    List {
        /// Tenant (default: rag.tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a knowledge base with everything in it (its directory, or its Qdrant collection).
    Delete {
        /// Its name.
        name: String,
        /// Tenant (default: rag.tenant).
        #[arg(long)]
        tenant: Option<String>,
    },
}

pub async fn kb_cmd(cmd: KbCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    let store = kb_store(cfg);
    match cmd {
        KbCommand::List { tenant, json } => {
            let tenant = tenant.unwrap_or_else(|| cfg.rag.tenant.clone());
            let listed = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Value>> {
                let mut out = Vec::new();
                for name in store.list(&tenant)? {
                    let kb = store.open(&tenant, &name)?;
                    let m = kb.manifest();
                    out.push(serde_json::json!({
                        "name": name,
                        "analyzer": m.analyzer.code(),
                        "embedding": m.embedding.as_ref().map(|e| e.model.clone()),
                        "documents": kb.documents()?.len(),
                        "chunks": kb.chunk_count(),
                        "backend": if kb.is_remote() { "qdrant" } else { "embedded" },
                    }));
                }
                Ok(out)
            })
            .await
            .context("the listing task failed")??;
            if json {
                println!("{}", Value::Array(listed));
            } else if listed.is_empty() {
                println!("no knowledge bases");
            } else {
                for kb in &listed {
                    println!(
                        "{}  ({}, {} documents, {} chunks, {}{})",
                        kb["name"].as_str().unwrap_or_default(),
                        kb["backend"].as_str().unwrap_or_default(),
                        kb["documents"],
                        kb["chunks"],
                        kb["analyzer"].as_str().unwrap_or_default(),
                        kb["embedding"].as_str().map(|e| format!(", {e}")).unwrap_or_default()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        KbCommand::Delete { name, tenant } => {
            let tenant = tenant.unwrap_or_else(|| cfg.rag.tenant.clone());
            let (t, n) = (tenant.clone(), name.clone());
            let existed =
                tokio::task::spawn_blocking(move || store.delete(&t, &n)).await.context("the delete task failed")??;
            if !existed {
                bail!("no knowledge base `{name}` for tenant `{tenant}`");
            }
            println!("deleted knowledge base `{name}` of tenant `{tenant}`");
            Ok(ExitCode::SUCCESS)
        }
    }
}
