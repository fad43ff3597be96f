//! `toolgraph bench retention`: the storage a month of traffic leaves on the embedded store,
//! with everything kept and with `[server.retention]` — idle conversations, usage rows, and the
//! checkpoints of finished threads beyond their last N (docs/benchmarks.md, "Retention").
//!
//! Each simulated day, `per_day` new conversations of `turns` turns each go through the chat
//! service on a SQLite file, as `serve` runs them (a tool call and a 40-token reply per turn,
//! the model reporting its tokens). Then the day ends: every time the store keeps moves back
//! a day — the clock moving on without waiting for it — and, with retention, a pass runs as
//! `toolgraph gc` runs it. Storage is read at the end of each day: rows, and the file's bytes.

use anyhow::Context;
use async_trait::async_trait;
use futures::StreamExt;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::conversation::project;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::react;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::{ConversationStore, ProjectingCheckpointer, SqliteConversationStore};
use toolgraph_graph::{SqliteCheckpointer, SqliteDatabase};
use toolgraph_llm::{ChatEvent, ChatModel, ChatRequest, ChatStream, FinishReason, LlmError, Message, ToolCall, Usage};
use toolgraph_protocol::{ConversationId, TenantId, UserId};
use toolgraph_server::auth::Caller;
use toolgraph_server::{ChatService, NewTurn, Retention, ServedAgent, ServiceOptions};
use toolgraph_tools::{ToolBuilder, ToolRegistry};

const DAY_MS: i64 = 86_400_000;
/// Conversations in flight at once.
const CONCURRENCY: usize = 16;

#[derive(Debug, clap::Args)]
pub struct RetentionArgs {
    /// Days of traffic.
    #[arg(long, default_value_t = 30)]
    days: u32,
    /// New conversations a day.
    #[arg(long, default_value_t = 200)]
    per_day: u32,
    /// Turns of each conversation.
    #[arg(long, default_value_t = 4)]
    turns: u32,
    /// `server.retention.conversation_idle_days` of the second run.
    #[arg(long, default_value_t = 7)]
    idle_days: u32,
    /// `server.retention.usage_days` of the second run.
    #[arg(long, default_value_t = 14)]
    usage_days: u32,
    /// `server.retention.keep_checkpoints` of the second run (0: all kept).
    #[arg(long, default_value_t = 3)]
    keep_checkpoints: u32,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// What the store held at the end of one day.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DayStorage {
    pub day: u32,
    pub conversations: i64,
    pub messages: i64,
    pub checkpoints: i64,
    pub usage_rows: i64,
    /// The database file and its write-ahead log, after a checkpoint of the log.
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct RetentionReport {
    pub days: u32,
    pub per_day: u32,
    pub turns: u32,
    pub idle_days: u32,
    pub usage_days: u32,
    pub keep_checkpoints: u32,
    /// Everything kept.
    pub kept: Vec<DayStorage>,
    /// With retention.
    pub pruned: Vec<DayStorage>,
}

/// A model that answers at once and reports its tokens: a tool call to a person's message, a
/// 40-token reply to the tool's result.
struct CountedModel;

#[async_trait]
impl ChatModel for CountedModel {
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        let usage = |completion| {
            ChatEvent::Usage(Usage { prompt_tokens: 200, completion_tokens: completion, cached_prompt_tokens: 0 })
        };
        let events = match request.messages.last() {
            Some(Message::User { .. }) => vec![
                ChatEvent::ToolCall(ToolCall { id: "c".into(), name: "noop".into(), arguments: "{}".into() }),
                usage(10),
                ChatEvent::Finished(FinishReason::ToolCalls),
            ],
            _ => vec![
                ChatEvent::TextDelta((0..40).map(|i| format!("tok{i} ")).collect()),
                usage(40),
                ChatEvent::Finished(FinishReason::Stop),
            ],
        };
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
    fn model_id(&self) -> &str {
        "counted"
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoArgs {}

pub async fn run(args: &RetentionArgs) -> anyhow::Result<RetentionReport> {
    let kept = month(args, None).await?;
    let retention = Retention {
        conversation_idle: Some(Duration::from_millis(DAY_MS as u64) * args.idle_days),
        tenants: HashMap::new(),
        agents: HashMap::new(),
        keep_checkpoints: (args.keep_checkpoints > 0).then_some(u64::from(args.keep_checkpoints)),
        tenants_keep: HashMap::new(),
        agents_keep: HashMap::new(),
        usage: Some(Duration::from_millis(DAY_MS as u64) * args.usage_days),
        every: Duration::from_secs(86_400),
        background: false,
    };
    let pruned = month(args, Some(retention)).await?;
    Ok(RetentionReport {
        days: args.days,
        per_day: args.per_day,
        turns: args.turns,
        idle_days: args.idle_days,
        usage_days: args.usage_days,
        keep_checkpoints: args.keep_checkpoints,
        kept,
        pruned,
    })
}

/// One month of traffic on a new SQLite file; the storage at the end of each day.
async fn month(args: &RetentionArgs, retention: Option<Retention>) -> anyhow::Result<Vec<DayStorage>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("toolgraph.db");
    let ckpt = SqliteCheckpointer::open(&file).await?;
    let db = ckpt.database().clone();
    let store: Arc<dyn ConversationStore> = Arc::new(SqliteConversationStore::new(db.clone()).await?);
    let checkpointer = Arc::new(ProjectingCheckpointer::sqlite(ckpt, project));
    let mut tools = ToolRegistry::new();
    tools.register(
        ToolBuilder::<NoArgs>::new("noop", "does nothing")
            .handler(|_c, _a| async { Ok(serde_json::json!({"ok": true})) })?,
    )?;
    let graph = react::build(
        AgentSpec::new("bench", "You are a benchmark.", tools),
        Arc::new(CountedModel),
        checkpointer.clone(),
    )?;
    let agents =
        BTreeMap::from([("bench".to_owned(), ServedAgent::new(GraphAgent::new(graph), AgentSettings::default()))]);
    let forced = retention.is_some();
    let options = ServiceOptions { retention, ..ServiceOptions::default() };
    let service = ChatService::new(agents, "bench".into(), store, checkpointer, options);
    let mut days = Vec::new();
    for day in 1..=args.days {
        let people = (0..args.per_day).map(|n| i64::from(day) * 100_000 + i64::from(n));
        let conversations = futures::stream::iter(people.map(|user| conversation(&service, user, args.turns)))
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        conversations.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        age_one_day(&db).await?;
        if forced {
            service.prune(toolgraph_conversations::now_ms(), true).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        days.push(storage(&db, &file, day).await?);
    }
    service.shutdown().await;
    db.close().await;
    Ok(days)
}

/// One person's conversation of `turns` turns, each waited for.
async fn conversation(service: &ChatService, user: i64, turns: u32) -> anyhow::Result<()> {
    let who = Caller::default().admit(TenantId(1), UserId(user)).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let mut id: Option<ConversationId> = None;
    for n in 0..turns {
        let turn = NewTurn {
            tenant_slug: "bench".into(),
            conversation: id,
            message: format!("question {n}"),
            agent: None,
            context: None,
            tool_events: false,
            node_events: false,
            attachments: Vec::new(),
            run_metadata: None,
        };
        let (_, log) = service.start_turn(&who, &turn).await.map_err(|e| anyhow::anyhow!("turn {n}: {e}"))?;
        anyhow::ensure!(log.ended(Duration::from_secs(30)).await, "turn {n} did not end in 30 s");
        anyhow::ensure!(!log.outcome().1, "turn {n} ended with an error");
        id = Some(log.conversation);
    }
    Ok(())
}

/// Moves every time the store keeps a day back: the day is over.
async fn age_one_day(db: &SqliteDatabase) -> anyhow::Result<()> {
    db.call(|c| {
        c.execute_batch(&format!(
            "BEGIN;
             UPDATE conversations SET created_at_ms = created_at_ms - {DAY_MS}, last_active_ms = last_active_ms - {DAY_MS};
             UPDATE messages SET created_at_ms = created_at_ms - {DAY_MS};
             UPDATE turn_usage SET at_ms = at_ms - {DAY_MS};
             UPDATE checkpoints SET created_at_ms = created_at_ms - {DAY_MS};
             COMMIT;"
        ))
    })
    .await?
    .context("cannot move the stored times back a day")
}

async fn storage(db: &SqliteDatabase, file: &std::path::Path, day: u32) -> anyhow::Result<DayStorage> {
    let counts = db
        .call(|c| -> Result<[i64; 4], String> {
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).map_err(|e| e.to_string())?;
            let count = |table: &str| {
                c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get::<_, i64>(0))
                    .map_err(|e| e.to_string())
            };
            Ok([count("conversations")?, count("messages")?, count("checkpoints")?, count("turn_usage")?])
        })
        .await?
        .map_err(|e| anyhow::anyhow!("cannot count the stored rows: {e}"))?;
    let size = |p: std::path::PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
    let wal = file.with_extension("db-wal");
    Ok(DayStorage {
        day,
        conversations: counts[0],
        messages: counts[1],
        checkpoints: counts[2],
        usage_rows: counts[3],
        bytes: size(file.to_path_buf()) + size(wal),
    })
}

pub fn print(r: &RetentionReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    println!(
        "{} days, {} new conversations a day of {} turns each; retention: idle {} days, usage {} days, {} \
         checkpoints kept",
        r.days, r.per_day, r.turns, r.idle_days, r.usage_days, r.keep_checkpoints
    );
    println!(
        "day | kept: conversations, checkpoints, usage rows, MB | retention: conversations, checkpoints, usage rows, MB"
    );
    for (k, p) in r.kept.iter().zip(&r.pruned) {
        println!(
            "{:>3} | {:>6} {:>8} {:>7} {:>7.1} | {:>6} {:>8} {:>7} {:>7.1}",
            k.day,
            k.conversations,
            k.checkpoints,
            k.usage_rows,
            k.bytes as f64 / 1e6,
            p.conversations,
            p.checkpoints,
            p.usage_rows,
            p.bytes as f64 / 1e6
        );
    }
    Ok(())
}
