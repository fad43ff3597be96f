//! `toolgraph eval`: quality measurements anyone can rerun.

use anyhow::{Context, bail};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use toolgraph_config::Config;
use toolgraph_llm::{ChatModel, ChatRequest, ChatResponse, FinishReason, Message, ToolCall, ToolDefinition};
use toolgraph_rag::{Analyzer, BeirDataset, ChunkingOptions, EmbeddingCache, EvalOptions, SearchMode, evaluate};

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Retrieval quality on a BEIR-layout folder (corpus.jsonl[.gz], queries.jsonl, qrels/test.tsv):
    /// nDCG@10, recall@5/10/100, MRR@10 and query latency.
    Retrieval(RetrievalArgs),
    /// The legal Q&A agent's tools on the ALQAC questions: recall@k of the gold article, and
    /// with a model, citation correctness and true/false and multiple-choice accuracy.
    Legal(crate::eval_legal::LegalArgs),
    /// Whether an agent answers from its documents: the gold answer in the reply, cited, the
    /// gold passage retrieved, and "cannot find it" where the documents do not hold the answer
    /// — over XQuAD (`--dataset`) or a case file (`--cases`, e.g. examples/eval/course-answers.jsonl).
    Answers(crate::eval_answers::AnswersArgs),
    /// Whether an agent uses what it remembers about a person: facts kept in its memory, then a
    /// question they answer, in a fresh conversation (`--cases`, e.g.
    /// examples/eval/memory-cases.jsonl with examples/eval/memory.toml).
    Memory(crate::eval_memory::MemoryArgs),
    /// Tool-calling accuracy of the configured model: each case is a prompt with the tool it
    /// should call (or none) and substrings its arguments must contain (JSON lines:
    /// `{"lang", "prompt", "tool": name|null, "args": {key: substring}}`).
    Tools {
        /// The cases, e.g. examples/eval/tool-cases.jsonl.
        #[arg(long, value_name = "FILE")]
        cases: PathBuf,
        /// Agent whose system prompt and tools are used (default: the default agent).
        #[arg(long)]
        agent: Option<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// `toolgraph eval retrieval`.
#[derive(Debug, clap::Args)]
pub struct RetrievalArgs {
    /// The data set folder in the BEIR layout (corpus.jsonl, queries.jsonl, qrels/), e.g. scifact/.
    #[arg(long, value_name = "DIR")]
    pub dataset: PathBuf,
    /// `bm25`, `dense` or `hybrid` (dense and hybrid embed with rag.embedding, and for an
    /// English corpus also with rag.second_embedding when it is set; the chunk vectors are cached
    /// per model, so only the first run per corpus and model embeds).
    #[arg(long, default_value = "bm25")]
    pub mode: SearchMode,
    /// Evaluate only the first N judged queries.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Analyzer language: `auto` (guessed from the corpus), `en`, `es`, `vi` or `ko`.
    #[arg(long, default_value = "auto")]
    pub language: String,
    /// Longest chunk in words (longer documents are sub-chunked; hits aggregate to documents).
    #[arg(long, value_name = "N", default_value_t = ChunkingOptions::default().max_words)]
    pub max_words: usize,
    /// Words shared by consecutive sub-chunks.
    #[arg(long, value_name = "N", default_value_t = ChunkingOptions::default().overlap_words)]
    pub overlap_words: usize,
    /// Where chunk and query vectors are cached (default: ~/.cache/toolgraph/embeddings).
    #[arg(long, value_name = "DIR")]
    pub embedding_cache: Option<PathBuf>,
    /// Embed everything again, ignoring (and not writing) the cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Also write each query's ranked documents as a TREC run file (for trec_eval or ranx).
    #[arg(long, value_name = "FILE")]
    pub run_file: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, serde::Deserialize)]
struct ToolCase {
    /// The agent whose prompt and tools the case runs with; default: `--agent`, else the
    /// default agent.
    #[serde(default)]
    agent: Option<String>,
    lang: String,
    /// Earlier turns of the conversation, before `prompt` (`{"role": "user"|"assistant"|"tool",
    /// …}` messages): a case of a later turn.
    #[serde(default)]
    history: Vec<Message>,
    /// The user's message of the turn.
    prompt: String,
    /// This turn's messages after `prompt` (the model's call and the tool's result): a case of
    /// the step that follows a result.
    #[serde(default)]
    after: Vec<Message>,
    tool: Option<String>,
    #[serde(default)]
    args: serde_json::Map<String, serde_json::Value>,
}

/// An agent as `eval tools` runs its cases: its system prompt, its tools and their
/// definitions, its model.
struct EvalAgent {
    prompt: String,
    tools: toolgraph_tools::ToolRegistry,
    definitions: Vec<ToolDefinition>,
    model: Arc<dyn ChatModel>,
}

#[derive(Debug, serde::Serialize)]
struct ToolCaseResult {
    agent: String,
    lang: String,
    prompt: String,
    expected: Option<String>,
    called: Option<String>,
    arguments: Option<String>,
    right_tool: bool,
    right: bool,
    seconds: f64,
}

async fn eval_tools(cases: PathBuf, agent_name: Option<String>, json: bool, cfg: &Config) -> anyhow::Result<ExitCode> {
    let text = tokio::fs::read_to_string(&cases).await.with_context(|| format!("cannot read {}", cases.display()))?;
    let cases: Vec<ToolCase> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{} line {}", cases.display(), i + 1)))
        .collect::<anyhow::Result<_>>()?;
    let all = crate::agent::all_tools(cfg, None).await?;
    let default_name = agent_name.unwrap_or_else(|| cfg.default_agent_name());
    let agents = cfg.effective_agents();
    let local = crate::agent::local_model(cfg).await?;
    // Each agent the cases name, built once.
    let mut built: BTreeMap<String, EvalAgent> = BTreeMap::new();
    for name in cases.iter().map(|c| c.agent.clone().unwrap_or_else(|| default_name.clone())) {
        if built.contains_key(&name) {
            continue;
        }
        let settings = agents.get(&name).cloned().with_context(|| format!("no agent named '{name}'"))?;
        let tools = match &settings.tools {
            None => all.clone(),
            Some(names) => {
                all.subset(names).with_context(|| format!("agent '{name}' enables a tool that does not exist"))?
            }
        };
        let definitions = toolgraph_agents::kit::tool_definitions(&tools);
        let model = toolgraph_agents::assembly::model(cfg, &settings, local.as_ref())?;
        built.insert(name, EvalAgent { prompt: settings.system_prompt.clone(), tools, definitions, model });
    }
    let mut results = Vec::with_capacity(cases.len());
    for case in cases {
        let agent = case.agent.clone().unwrap_or_else(|| default_name.clone());
        let Some(EvalAgent { prompt, tools, definitions, model }) = built.get(&agent) else { continue };
        let mut messages = vec![Message::system(prompt.clone())];
        messages.extend(case.history.iter().cloned());
        messages.push(Message::user(case.prompt.clone()));
        messages.extend(case.after.iter().cloned());
        let started = std::time::Instant::now();
        // A step the agent takes itself (no model call) is what it does at this point.
        let reply = if let Some(tool) = toolgraph_agents::kit::step_due(tools, &messages) {
            let call = ToolCall { id: "step".into(), name: tool, arguments: "{}".into() };
            ChatResponse {
                content: String::new(),
                tool_calls: vec![call],
                finish_reason: FinishReason::ToolCalls,
                usage: None,
            }
        } else {
            // What the agent offers at this point of the turn.
            let tool_choice = toolgraph_agents::kit::tool_choice(tools, &messages);
            let request = ChatRequest {
                messages,
                tools: definitions.clone(),
                tool_choice,
                response_format: None,
                temperature: Some(0.0),
                max_tokens: Some(256),
                stop: Vec::new(),
            };
            model.complete(request).await?
        };
        let call = reply.tool_calls.first();
        let called = call.map(|c| c.name.clone());
        let right_tool = called == case.tool;
        let args: serde_json::Value =
            call.and_then(|c| serde_json::from_str(&c.arguments).ok()).unwrap_or(serde_json::Value::Null);
        let right_args = case.args.iter().all(|(k, want)| {
            let got = match &args[k] {
                serde_json::Value::String(s) => s.to_lowercase(),
                serde_json::Value::Null => return false,
                other => other.to_string().to_lowercase(),
            };
            got.contains(&want.as_str().map_or_else(|| want.to_string(), str::to_owned).to_lowercase())
        });
        results.push(ToolCaseResult {
            agent,
            lang: case.lang,
            prompt: case.prompt,
            expected: case.tool,
            called,
            arguments: call.map(|c| c.arguments.clone()),
            right_tool,
            right: right_tool && right_args,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let score = |of: &[&ToolCaseResult]| {
        let n = of.len().max(1) as f64;
        let right = of.iter().filter(|r| r.right).count() as f64 / n;
        (right, of.iter().filter(|r| r.right_tool).count() as f64 / n)
    };
    let everything: Vec<&ToolCaseResult> = results.iter().collect();
    let (accuracy, tool_accuracy) = score(&everything);
    let per_agent: BTreeMap<&str, Vec<&ToolCaseResult>> = results.iter().fold(BTreeMap::new(), |mut m, r| {
        m.entry(r.agent.as_str()).or_insert_with(Vec::new).push(r);
        m
    });
    let model_ids: Vec<&str> = built.values().map(|a| a.model.model_id()).collect();
    let model_id = model_ids.first().copied().unwrap_or("none");
    if json {
        let agents: serde_json::Map<String, serde_json::Value> = per_agent
            .iter()
            .map(|(name, of)| {
                let (a, t) = score(of);
                ((*name).to_owned(), serde_json::json!({"cases": of.len(), "accuracy": a, "tool_accuracy": t}))
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"model": model_id, "cases": results.len(), "accuracy": accuracy,
                               "tool_accuracy": tool_accuracy, "agents": agents, "results": results})
        );
    } else {
        for r in &results {
            println!(
                "{} [{}] {:?} → {} {} ({:.1} s)",
                if r.right { "ok  " } else { "MISS" },
                r.lang,
                r.prompt,
                r.called.as_deref().unwrap_or("(no tool)"),
                r.arguments.as_deref().unwrap_or(""),
                r.seconds
            );
        }
        let mut langs: Vec<&str> = results.iter().map(|r| r.lang.as_str()).collect();
        langs.sort_unstable();
        langs.dedup();
        for lang in langs {
            let of: Vec<&ToolCaseResult> = results.iter().filter(|r| r.lang == lang).collect();
            println!("{lang}: {}/{} right", of.iter().filter(|r| r.right).count(), of.len());
        }
        if per_agent.len() > 1 {
            for (name, of) in &per_agent {
                let (a, t) = score(of);
                println!("agent {name}: {:.0}% right, {:.0}% right tool ({} cases)", a * 100.0, t * 100.0, of.len());
            }
        }
        println!(
            "{}: {:.0}% right tool and arguments, {:.0}% right tool ({} cases)",
            model_id,
            accuracy * 100.0,
            tool_accuracy * 100.0,
            results.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run(cmd: EvalCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    let RetrievalArgs {
        dataset,
        mode,
        limit,
        language,
        max_words,
        overlap_words,
        embedding_cache,
        no_cache,
        run_file,
        json,
    } = match cmd {
        EvalCommand::Tools { cases, agent, json } => return eval_tools(cases, agent, json, cfg).await,
        EvalCommand::Legal(args) => return crate::eval_legal::run(args, cfg).await,
        EvalCommand::Answers(args) => return crate::eval_answers::run(args, cfg).await,
        EvalCommand::Memory(args) => return crate::eval_memory::run(args, cfg).await,
        EvalCommand::Retrieval(args) => args,
    };
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
            run_file,
            qdrant: crate::retrieval::qdrant(&cfg),
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
            "mode {}{} · analyzer {analyzer:?} · {} documents ({} chunks) indexed in {:.0} ms ({:.0} docs/s) · {} queries",
            r.mode,
            r.fusion.map_or(String::new(), |f| format!(" ({})", f.as_str())),
            r.documents,
            r.chunks,
            r.index_ms,
            r.ingest_docs_per_s,
            r.queries
        );
        if r.mode != "bm25" {
            println!(
                "embeddings: {} · {} · {} texts embedded in {:.1} s",
                r.embedding_model.as_deref().unwrap_or("?"),
                if r.embedding_cache_hit { "chunk vectors from the cache" } else { "chunk vectors computed" },
                r.embedded_texts,
                r.embed_ms / 1e3
            );
        }
        println!(
            "nDCG@10 {:.4} · recall@5 {:.4} · recall@10 {:.4} · recall@100 {:.4} · MRR@10 {:.4}",
            r.ndcg_at_10, r.recall_at_5, r.recall_at_10, r.recall_at_100, r.mrr_at_10
        );
        println!("query latency ({} index) p50 {:.2} ms · p99 {:.2} ms", r.index, r.latency_p50_ms, r.latency_p99_ms);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped case file reads as cases: a malformed line would stop `eval tools` at once.
    #[test]
    fn the_shipped_cases_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/eval");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            // `*-answers.jsonl` are `eval answers` cases (eval_answers.rs reads them), and
            // `memory-cases.jsonl` `eval memory`'s (eval_memory.rs).
            let name = path.to_string_lossy();
            if path.extension().is_none_or(|e| e != "jsonl")
                || name.ends_with("-answers.jsonl")
                || name.ends_with("memory-cases.jsonl")
            {
                continue;
            }
            files += 1;
            for (i, line) in std::fs::read_to_string(&path).unwrap().lines().enumerate() {
                let case: ToolCase =
                    serde_json::from_str(line).unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), i + 1));
                assert!(!case.prompt.trim().is_empty() && !case.lang.is_empty(), "{} line {}", path.display(), i + 1);
                // A step after a result ends on the result.
                if let Some(last) = case.after.last() {
                    assert!(matches!(last, Message::Tool { .. }), "{} line {}", path.display(), i + 1);
                }
            }
        }
        assert_eq!(files, 4, "the case files of examples/eval");
    }
}
