//! `toolgraph bench`: benchmarks anyone can rerun (`docs/benchmarks.md` quotes them).
//!
//! `bench graph` measures the runtime itself with an in-process no-op model, so the figures
//! are toolgraph's own cost: per-step overhead with the in-memory store, checkpoint write
//! latency (SQLite, and PostgreSQL when a URL is given), and the bytes a conversation takes
//! after 100 and 200 turns.
//!
//! `bench embed` measures the in-process e5 embedder's throughput on real passages (a BEIR
//! corpus), in model tokens per second, with every core the machine has.

use anyhow::Context;
use async_trait::async_trait;
use clap::Subcommand;
use serde::Serialize;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolgraph_agents::kit::{AgentDeps, AgentSpec, AgentState, user_turn};
use toolgraph_agents::react;
use toolgraph_graph::{
    CheckpointRecord, Checkpointer, CompiledGraph, MemoryCheckpointer, PostgresCheckpointer, RecordKind, RunOptions,
    RunOutcome, SqliteCheckpointer, ThreadId,
};
use toolgraph_llm::{ChatEvent, ChatModel, ChatRequest, ChatStream, FinishReason, LlmError, Message, ToolCall};
use toolgraph_tools::{ToolBuilder, ToolRegistry};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Graph runtime: step overhead, checkpoint write latency, storage growth.
    Graph {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Also measure PostgreSQL checkpoint writes (a temporary schema is created and dropped).
        #[arg(long, value_name = "URL")]
        postgres: Option<String>,
        /// Turns for the step-overhead measurement.
        #[arg(long, default_value_t = 3000)]
        turns: u32,
    },
    /// Local GGUF chat model: load time, prompt (prefill) and generation tokens/s, prefix reuse.
    Chat {
        /// `0.5b` or `1.5b` (files from `scripts/fetch-models chat-0.5b|chat-1.5b`).
        #[arg(long, default_value = "0.5b")]
        model: String,
        /// Tokens to generate.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Held streams across replicas, one of them killed midway: how every turn ends, turn
    /// times and each replica's memory.
    Streams(crate::bench_streams::StreamsArgs),
    /// Storage after a month of simulated traffic, everything kept and with `server.retention`.
    Retention(crate::bench_retention::RetentionArgs),
    /// Embedding throughput of the local e5 model on a BEIR corpus's first N documents.
    Embed {
        /// A BEIR corpus (corpus.jsonl or .jsonl.gz), e.g. ../shared/data/scifact/corpus.jsonl.gz.
        #[arg(long, value_name = "FILE")]
        corpus: std::path::PathBuf,
        /// Documents to embed.
        #[arg(long, default_value_t = 512)]
        documents: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Serialize)]
struct EmbedBench {
    documents: usize,
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    documents_per_s: f64,
    threads: usize,
    load_s: f64,
}

#[derive(Debug, Serialize)]
struct ChatBench {
    model: String,
    /// The kernels the products ran on (`avx512-vnni`, `avx2`, `portable`) and on how many threads.
    kernels: String,
    threads: usize,
    load_s: f64,
    requantised_tensors: usize,
    prompt_tokens: usize,
    prompt_tokens_per_s: f64,
    cached_prefix_tokens: usize,
    second_prompt_computed: usize,
    second_prompt_ms: f64,
    generated_tokens: usize,
    generation_tokens_per_s: f64,
    weights_bytes: u64,
    /// Weights read per generated token (quantised matrices, norms, one embedding row).
    weight_bytes_per_token: usize,
    /// Memory read bandwidth of this machine, all cores (best of 3 passes over 1 GiB).
    memory_read_gb_per_s: f64,
    /// The generation speed if reading the weights were the only cost.
    bandwidth_bound_tokens_per_s: f64,
    /// Multiply-adds of a prompt token's matrix products.
    multiply_adds_per_token: usize,
    /// What the kernels' integer multiply instructions issue per second on every thread
    /// (none for the portable kernels).
    multiply_adds_per_s: Option<f64>,
    /// The prompt speed if those products were the only cost, at that rate.
    multiply_bound_tokens_per_s: Option<f64>,
    /// The prompt's token ids and the greedy reply's, so another engine can be run on exactly
    /// this prompt and its reply compared (`scripts/bench-llama-cpp`).
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    /// Milliseconds of one pass over the last generated token and a draft of `k` tokens after
    /// it (`[k, ms]`, the best of three): what checking a draft costs against one token.
    draft_pass_ms: Vec<(usize, f64)>,
    /// A reply that quotes a passage of its prompt, generated one token per pass and with
    /// prompt-lookup drafts (the same tokens, checked): tokens, tokens/s each way, passes and
    /// drafted tokens taken of those drafted.
    quoting: QuotingBench,
}

#[derive(Debug, Serialize)]
struct QuotingBench {
    tokens: usize,
    plain_tokens_per_s: f64,
    drafted_tokens_per_s: f64,
    passes: usize,
    drafted: usize,
    taken: usize,
}

/// A greedy reply: its tokens, the seconds it took, the passes over the weights, and the
/// drafted tokens computed and taken.
#[cfg(feature = "local-models")]
struct Generated {
    tokens: Vec<u32>,
    seconds: f64,
    passes: usize,
    drafted: usize,
    taken: usize,
}

/// A reply generated greedily after `prompt` (computed already: the first pass computes only
/// its last token, as each later pass computes the token before it), with `lookup`'s drafts.
#[cfg(feature = "local-models")]
fn generate_with_drafts(
    qwen: &mut toolgraph_local_models::chat::qwen2::Qwen2,
    prompt: &[u32],
    max: usize,
    stop: &[u32],
    lookup: toolgraph_local_models::chat::draft::PromptLookup,
) -> anyhow::Result<Generated> {
    use toolgraph_local_models::chat::draft::Lookahead;
    use toolgraph_local_models::chat::qwen2::argmax;
    let vocab = qwen.vocab();
    let mut ids = prompt.to_vec();
    let mut ahead = Lookahead::default();
    let (mut passes, mut drafted, mut taken) = (0, 0, 0);
    let t = Instant::now();
    while ids.len() - prompt.len() < max {
        let next = match ahead.row(&ids) {
            Some(row) => {
                taken += 1;
                argmax(row)
            }
            None => {
                let generated = ids.len() - prompt.len();
                let draft = if generated == 0 { Vec::new() } else { lookup.draft(&ids, max - generated - 1).to_vec() };
                let (rows, _) = qwen.draft_logits(&ids, &draft)?;
                passes += 1;
                drafted += draft.len();
                let next = argmax(&rows[..vocab]);
                ahead.set(ids.len(), &draft, rows, vocab);
                next
            }
        };
        if stop.contains(&next) {
            break;
        }
        ids.push(next);
    }
    Ok(Generated { tokens: ids[prompt.len()..].to_vec(), seconds: t.elapsed().as_secs_f64(), passes, drafted, taken })
}

#[cfg(feature = "local-models")]
fn chat_bench(model: &str, tokens: usize) -> anyhow::Result<ChatBench> {
    use toolgraph_llm::{Message, ToolDefinition};
    use toolgraph_local_models::chat::draft::PromptLookup;
    use toolgraph_local_models::chat::qwen2::Qwen2;
    use toolgraph_local_models::chat::{GgufChatAssets, named_model};
    let Some(path) = named_model(model) else { anyhow::bail!("unknown model `{model}` (0.5b or 1.5b)") };
    let file = path.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let t = Instant::now();
    let (assets, content) = GgufChatAssets::from_file(&path)?;
    let mut reader = std::fs::File::open(&path)?;
    let mut qwen = Qwen2::load(&content, &mut reader, 4096)?;
    let load_s = t.elapsed().as_secs_f64();
    let tools: Vec<ToolDefinition> = ["rag_search", "note_write", "calculator"]
        .iter()
        .map(|n| ToolDefinition {
            name: (*n).into(),
            description: format!("The {n} tool of the demo agent, with a description of realistic length."),
            parameters: serde_json::json!({"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}}, "required": ["query"]}),
        })
        .collect();
    let system = Message::system(
        "Eres el tutor de la asignatura Infraestructura Virtual. Responde en el idioma del estudiante y cita las fuentes.",
    );
    let encode = |q: &str| -> anyhow::Result<Vec<u32>> {
        let text = assets.template.render(&[system.clone(), Message::user(q)], &tools)?;
        Ok(assets.tokenizer.encode(text.as_str(), false).map_err(anyhow::Error::msg)?.get_ids().to_vec())
    };
    let first = encode("Explain in detail what a container image is, step by step.")?;
    let t = Instant::now();
    qwen.next_logits(&first)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let plain = generate_with_drafts(&mut qwen, &first, tokens, &assets.stop_tokens, PromptLookup::OFF)?;
    let (generated, gen_s) = (plain.tokens.len(), plain.seconds);
    let ids: Vec<u32> = first.iter().chain(&plain.tokens).copied().collect();
    let second = encode("¿Cuándo es el examen final?")?;
    let shared = first.iter().zip(&second).take_while(|(a, b)| a == b).count();
    let t = Instant::now();
    let (_, computed) = qwen.next_logits(&second)?;
    let second_ms = t.elapsed().as_secs_f64() * 1e3;
    // A pass over the last generated token and k drafted ones (any tokens: the cost is the
    // same whichever they are), each from the same cached prompt.
    let mut draft_pass_ms = Vec::new();
    for k in [0usize, 1, 2, 3, 4, 6, 8, 12, 16] {
        let draft: Vec<u32> = ids.iter().rev().take(k).copied().collect();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            qwen.draft_logits(&ids, &draft)?;
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
        draft_pass_ms.push((k, best));
    }
    let quoting = {
        let prompt = encode(QUOTING_QUESTION)?;
        qwen.next_logits(&prompt)?;
        let stop = &assets.stop_tokens;
        let plain = generate_with_drafts(&mut qwen, &prompt, tokens, stop, PromptLookup::OFF)?;
        let drafts = generate_with_drafts(&mut qwen, &prompt, tokens, stop, PromptLookup::default())?;
        anyhow::ensure!(plain.tokens == drafts.tokens, "the reply with drafts differs from the reply without");
        QuotingBench {
            tokens: drafts.tokens.len(),
            plain_tokens_per_s: plain.tokens.len() as f64 / plain.seconds.max(1e-9),
            drafted_tokens_per_s: drafts.tokens.len() as f64 / drafts.seconds.max(1e-9),
            passes: drafts.passes,
            drafted: drafts.drafted,
            taken: drafts.taken,
        }
    };
    let per_token = qwen.weight_bytes_per_token();
    let bandwidth = toolgraph_local_models::chat::memory_read_gb_per_s();
    let threads = toolgraph_local_models::chat::kernels::WorkerPool::global().threads();
    let macs = qwen.multiply_adds_per_token();
    let macs_per_s = qwen.multiply_adds_per_s(threads);
    Ok(ChatBench {
        model: file,
        kernels: qwen.kernels().to_owned(),
        threads,
        load_s,
        requantised_tensors: qwen.requantised,
        prompt_tokens: first.len(),
        prompt_tokens_per_s: first.len() as f64 / prefill_s,
        cached_prefix_tokens: shared,
        second_prompt_computed: computed,
        second_prompt_ms: second_ms,
        generated_tokens: generated,
        generation_tokens_per_s: generated as f64 / gen_s.max(1e-9),
        weights_bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
        weight_bytes_per_token: per_token,
        memory_read_gb_per_s: bandwidth,
        bandwidth_bound_tokens_per_s: bandwidth * 1e9 / per_token as f64,
        multiply_adds_per_token: macs,
        multiply_adds_per_s: macs_per_s,
        multiply_bound_tokens_per_s: macs_per_s.map(|r| r / macs.max(1) as f64),
        generated_ids: ids[first.len()..].to_vec(),
        prompt_ids: first,
        draft_pass_ms,
        quoting,
    })
}

/// A question whose answer quotes the passage it gives, as a reply after a search does.
#[cfg(feature = "local-models")]
const QUOTING_QUESTION: &str = "Según la guía docente: «La evaluación continua supone el 40 % de la nota final y \
    consiste en cuatro prácticas entregadas en el repositorio de la asignatura antes de las fechas publicadas en \
    el calendario. El examen final, que supone el 60 % restante, se celebra en la convocatoria ordinaria de enero \
    y es necesario obtener al menos un 4 sobre 10 en él para aprobar la asignatura.» ¿Cómo se evalúa la \
    asignatura? Responde citando la guía.";

#[cfg(not(feature = "local-models"))]
fn chat_bench(_: &str, _: usize) -> anyhow::Result<ChatBench> {
    anyhow::bail!("this build has no local models (built without the `local-models` feature)")
}

#[cfg(feature = "local-models")]
fn embed_bench(corpus: &std::path::Path, documents: usize) -> anyhow::Result<EmbedBench> {
    use toolgraph_rag::EmbedKind;
    let dir = corpus.parent().context("the corpus path has no folder")?;
    let ds = toolgraph_rag::BeirDataset::load(dir).with_context(|| format!("cannot load {}", dir.display()))?;
    let texts: Vec<String> = ds.corpus.iter().take(documents).map(|d| format!("{}\n{}", d.title, d.text)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let t = Instant::now();
    let e5 = toolgraph_local_models::E5Embedder::load_default()?;
    let load_s = t.elapsed().as_secs_f64();
    let tokens = e5.count_tokens(&refs, EmbedKind::Passage)?;
    e5.embed_texts(&refs[..refs.len().min(8)], EmbedKind::Passage)?; // warm-up
    let t = Instant::now();
    e5.embed_texts(&refs, EmbedKind::Passage)?;
    let seconds = t.elapsed().as_secs_f64();
    Ok(EmbedBench {
        documents: refs.len(),
        tokens,
        seconds,
        tokens_per_s: tokens as f64 / seconds,
        documents_per_s: refs.len() as f64 / seconds,
        threads: std::thread::available_parallelism().map_or(1, usize::from),
        load_s,
    })
}

#[cfg(not(feature = "local-models"))]
fn embed_bench(_: &std::path::Path, _: usize) -> anyhow::Result<EmbedBench> {
    anyhow::bail!("this build has no local models (built without the `local-models` feature)")
}

/// A model that answers instantly: a tool call to a user message, then a prebuilt reply of
/// `reply_tokens` tokens in one delta. It costs one string copy, so the timings are the
/// runtime's own (per-token streaming is measured by the service benchmark).
struct NoopModel {
    reply: String,
}

impl NoopModel {
    fn new(reply_tokens: usize) -> Self {
        Self { reply: (0..reply_tokens).map(|i| format!("tok{i} ")).collect() }
    }
}

#[async_trait]
impl ChatModel for NoopModel {
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        let events: Vec<ChatEvent> = match request.messages.last() {
            Some(Message::User { .. }) => vec![
                ChatEvent::ToolCall(ToolCall { id: "c".into(), name: "noop".into(), arguments: "{}".into() }),
                ChatEvent::Finished(FinishReason::ToolCalls),
            ],
            _ => vec![ChatEvent::TextDelta(self.reply.clone()), ChatEvent::Finished(FinishReason::Stop)],
        };
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
    fn model_id(&self) -> &str {
        "noop"
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoArgs {}

fn agent(store: Arc<dyn Checkpointer>, reply_tokens: usize) -> anyhow::Result<CompiledGraph<AgentState, AgentDeps>> {
    let mut tools = ToolRegistry::new();
    tools.register(
        ToolBuilder::<NoArgs>::new("noop", "does nothing")
            .handler(|_c, _a| async { Ok(serde_json::json!({"ok": true})) })?,
    )?;
    let mut spec = AgentSpec::new("bench", "You are a benchmark.", tools);
    spec.history_budget = 2000;
    Ok(react::build(spec, Arc::new(NoopModel::new(reply_tokens)), store)?)
}

/// One turn = input + agent (tool call) + tools + agent (reply): 3 node steps.
const STEPS_PER_TURN: u32 = 3;

async fn turn(g: &CompiledGraph<AgentState, AgentDeps>, thread: &ThreadId, text: &str) -> anyhow::Result<()> {
    match g.start(thread, user_turn(text, None), RunOptions::default()).await?.outcome().await {
        RunOutcome::Completed { .. } => Ok(()),
        other => anyhow::bail!("benchmark turn did not complete: {other:?}"),
    }
}

#[derive(Debug, Serialize)]
struct GraphReport {
    step_overhead_us: f64,
    /// The same turns on a multi-threaded runtime: includes waking the run's worker thread
    /// and the waiting caller, which a loaded server amortises across runs.
    step_wall_multi_thread_us: f64,
    sqlite_write_p50_us: f64,
    sqlite_write_p99_us: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    postgres_write_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    postgres_write_p99_us: Option<f64>,
    bytes_100_turns: u64,
    bytes_200_turns: u64,
    /// The state of that 200-turn SQLite conversation, read by a process that has not seen
    /// it (every record folded).
    state_cold_200_turns_us: f64,
    /// The same, read again by the process (its head checked against the store).
    state_warm_200_turns_us: f64,
    /// Its last 10 checkpoints' states (a history page), the thread read once.
    history_10_200_turns_us: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Latency of appending step records of a realistic size (a 40-token reply) to `store`.
async fn write_latency(store: &dyn Checkpointer, writes: u64) -> anyhow::Result<(f64, f64)> {
    let thread = ThreadId::new("bench", uuid::Uuid::new_v4().simple());
    let reply = Message::assistant((0..40).map(|i| format!("tok{i} ")).collect::<String>());
    let update = serde_json::value::to_raw_value(&serde_json::json!({ "messages": [reply] }))?;
    let mut times = Vec::with_capacity(writes as usize);
    for seq in 1..=writes {
        let rec = CheckpointRecord {
            seq,
            format: 1,
            run_id: "bench".into(),
            kind: RecordKind::Step,
            node: Some("agent".into()),
            next: Some("agent".into()),
            updates: vec![update.clone()],
            interrupts: Vec::new(),
            decisions: Default::default(),
            reason: None,
            metadata: None,
            graph_version: None,
            created_at_ms: 0,
        };
        let t = Instant::now();
        store.append(&thread, &rec).await?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok((percentile(&times, 0.5), percentile(&times, 0.99)))
}

/// Per-step cost of the runtime: turns of the no-op agent on a single-threaded runtime, so
/// the figure is the runtime's own work and not the latency of waking another thread.
fn step_overhead(turns: u32, multi_thread: bool) -> anyhow::Result<f64> {
    let rt = if multi_thread {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    };
    rt.block_on(async {
        let g = agent(Arc::new(MemoryCheckpointer::new()), 40)?;
        for i in 0..50 {
            turn(&g, &ThreadId::new("warm", i), "hi").await?;
        }
        let started = Instant::now();
        for i in 0..turns {
            turn(&g, &ThreadId::new("bench", i % 100), "hi").await?;
        }
        Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(turns * STEPS_PER_TURN))
    })
}

async fn graph(json: bool, postgres: Option<String>, turns: u32) -> anyhow::Result<GraphReport> {
    let step_overhead_us = tokio::task::spawn_blocking(move || step_overhead(turns, false)).await??;
    let step_wall_multi_thread_us = tokio::task::spawn_blocking(move || step_overhead(turns, true)).await??;

    let dir = tempfile_dir().await?;
    let sqlite = SqliteCheckpointer::open(&dir.join("latency.db")).await?;
    let (sqlite_write_p50_us, sqlite_write_p99_us) = write_latency(&sqlite, 2000).await?;

    let (mut postgres_write_p50_us, mut postgres_write_p99_us) = (None, None);
    if let Some(url) = postgres {
        let schema = format!("tg_bench_{}", uuid::Uuid::new_v4().simple());
        let admin = sqlx::PgPool::connect(&url).await.context("cannot connect to --postgres")?;
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await?;
        let options = url.parse::<sqlx::postgres::PgConnectOptions>()?.options([("search_path", schema.as_str())]);
        let result = async {
            let pg = PostgresCheckpointer::connect_with(options).await?;
            let r = write_latency(&pg, 2000).await;
            pg.pool().close().await;
            r
        }
        .await;
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin).await?;
        let (p50, p99) = result?;
        (postgres_write_p50_us, postgres_write_p99_us) = (Some(p50), Some(p99));
    }

    // Storage growth: one SQLite conversation of 40-token replies.
    let store = Arc::new(SqliteCheckpointer::open(&dir.join("growth.db")).await?);
    let g = agent(store.clone(), 40)?;
    let thread = ThreadId::new("bench", "growth");
    let mut sizes = [0u64; 2];
    for (slot, target) in [(0usize, 100u32), (1, 200)] {
        let done = if slot == 0 { 0 } else { 100 };
        for i in done..target {
            turn(&g, &thread, &format!("question number {i}: how does this work?")).await?;
        }
        sizes[slot] = store.stored_bytes().await?;
    }
    let (state_cold_200_turns_us, state_warm_200_turns_us, history_10_200_turns_us) =
        long_thread_reads(store.clone(), &thread).await?;
    let _ = tokio::fs::remove_dir_all(&dir).await;
    let report = GraphReport {
        step_overhead_us,
        step_wall_multi_thread_us,
        sqlite_write_p50_us,
        sqlite_write_p99_us,
        postgres_write_p50_us,
        postgres_write_p99_us,
        bytes_100_turns: sizes[0],
        bytes_200_turns: sizes[1],
        state_cold_200_turns_us,
        state_warm_200_turns_us,
        history_10_200_turns_us,
    };
    if !json {
        eprintln!("measured {turns} turns × {STEPS_PER_TURN} steps for the overhead");
    }
    Ok(report)
}

/// Reads of a long conversation's state, in µs: by a process that has not seen it (mean of
/// 20, each a new graph over the same store), by one that has (mean of 200), and its last 10
/// checkpoints' states (mean of 20).
async fn long_thread_reads(store: Arc<SqliteCheckpointer>, thread: &ThreadId) -> anyhow::Result<(f64, f64, f64)> {
    let mean_us = |started: Instant, n: u32| started.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    let started = Instant::now();
    for _ in 0..20 {
        let fresh = agent(store.clone(), 40)?;
        fresh.thread_state(thread).await?.context("the conversation has a state")?;
    }
    let cold = mean_us(started, 20);
    let warm_graph = agent(store.clone(), 40)?;
    let head = warm_graph.thread_state(thread).await?.context("the conversation has a state")?.version;
    let started = Instant::now();
    for _ in 0..200 {
        warm_graph.thread_state(thread).await?;
    }
    let warm = mean_us(started, 200);
    let last_ten: Vec<u64> = (head.saturating_sub(9)..=head).collect();
    let started = Instant::now();
    for _ in 0..20 {
        warm_graph.states_at(thread, &last_ten).await?;
    }
    Ok((cold, warm, mean_us(started, 20)))
}

async fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("toolgraph-bench-{}", uuid::Uuid::new_v4().simple()));
    tokio::fs::create_dir_all(&dir).await?;
    Ok(dir)
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Retention(args) => {
            let report = crate::bench_retention::run(&args).await?;
            crate::bench_retention::print(&report, args.json)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Streams(args) => {
            let json = args.json;
            let report = crate::bench_streams::run(args).await?;
            crate::bench_streams::print(&report, json)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Chat { model, tokens, json } => {
            let r = tokio::task::spawn_blocking(move || chat_bench(&model, tokens.max(1))).await??;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{} ({} kernels, {} threads): load {:.1} s ({} tensors re-quantised to Q8_0); prompt {} tokens at {:.1} tokens/s; \
                     generation {} tokens at {:.2} tokens/s; a second prompt sharing {} prefix tokens computed {} in {:.0} ms; \
                     {:.0} MB of weights read per token at {:.1} GB/s: at most {:.1} tokens/s; \
                     {:.2} G multiply-adds per prompt token{}; \
                     a quoting reply of {} tokens at {:.2} tokens/s, {:.2} with prompt-lookup drafts ({} passes, {} of {} drafted tokens taken); \
                     a pass over one token and k drafted (k: ms): {}",
                    r.model,
                    r.kernels,
                    r.threads,
                    r.load_s,
                    r.requantised_tensors,
                    r.prompt_tokens,
                    r.prompt_tokens_per_s,
                    r.generated_tokens,
                    r.generation_tokens_per_s,
                    r.cached_prefix_tokens,
                    r.second_prompt_computed,
                    r.second_prompt_ms,
                    r.weight_bytes_per_token as f64 / 1e6,
                    r.memory_read_gb_per_s,
                    r.bandwidth_bound_tokens_per_s,
                    r.multiply_adds_per_token as f64 / 1e9,
                    match (r.multiply_adds_per_s, r.multiply_bound_tokens_per_s) {
                        (Some(rate), Some(bound)) => format!(
                            ", the kernels' multiply instructions issue {:.0} G a second: a prompt at most {bound:.1} tokens/s ({:.0} % of it reached)",
                            rate / 1e9,
                            100.0 * r.prompt_tokens_per_s / bound.max(1e-9)
                        ),
                        _ => String::new(),
                    },
                    r.quoting.tokens,
                    r.quoting.plain_tokens_per_s,
                    r.quoting.drafted_tokens_per_s,
                    r.quoting.passes,
                    r.quoting.taken,
                    r.quoting.drafted,
                    r.draft_pass_ms.iter().map(|(k, ms)| format!("{k}: {ms:.1}")).collect::<Vec<_>>().join(", "),
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Embed { corpus, documents, json } => {
            let r = tokio::task::spawn_blocking(move || embed_bench(&corpus, documents.max(1))).await??;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "e5-small: {} documents, {} tokens in {:.1} s: {:.0} tokens/s, {:.1} documents/s ({} threads; load {:.1} s)",
                    r.documents, r.tokens, r.seconds, r.tokens_per_s, r.documents_per_s, r.threads, r.load_s
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Graph { json, postgres, turns } => {
            let r = graph(json, postgres, turns.max(1)).await?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("step overhead (no-op model, memory store): {:.2} µs/step", r.step_overhead_us);
                println!(
                    "  same on a multi-threaded runtime, one turn at a time (thread hand-offs included): {:.2} µs/step",
                    r.step_wall_multi_thread_us
                );
                println!(
                    "SQLite checkpoint write: p50 {:.1} µs, p99 {:.1} µs",
                    r.sqlite_write_p50_us, r.sqlite_write_p99_us
                );
                if let (Some(p50), Some(p99)) = (r.postgres_write_p50_us, r.postgres_write_p99_us) {
                    println!("PostgreSQL checkpoint write: p50 {p50:.1} µs, p99 {p99:.1} µs");
                }
                println!(
                    "storage: {} bytes after 100 turns, {} after 200 (ratio {:.2}; linear ≈ 2)",
                    r.bytes_100_turns,
                    r.bytes_200_turns,
                    r.bytes_200_turns as f64 / r.bytes_100_turns.max(1) as f64
                );
                println!(
                    "reading that 200-turn conversation: its state {:.0} µs first, {:.0} µs after; its last 10 states {:.0} µs",
                    r.state_cold_200_turns_us, r.state_warm_200_turns_us, r.history_10_200_turns_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
