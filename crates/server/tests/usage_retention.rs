//! What turns cost and how long their data stays, end to end: the scripted model server over
//! HTTP reports its tokens, the service keeps them with each turn and answers 429 past a
//! tenant's budget; two replicas on one database (SQLite file or PostgreSQL schema) prune idle
//! conversations, with their checkpoints and run frames, one replica a pass, on a clock the
//! test moves.

mod common;
use common::{parse_sse, stream_text};

use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_agents::conversation::project;
use toolgraph_conversations::{
    ConversationStore, ConversationThread, PostgresConversationStore, ProjectingCheckpointer, SqliteConversationStore,
    now_ms,
};
use toolgraph_graph::{Checkpointer, PostgresCheckpointer, SqliteCheckpointer};
use toolgraph_server::{AppState, BudgetPeriod, ChatService, Retention, ServiceOptions, TokenBudget};
use toolgraph_testkit::PgSchema;

const DAY_MS: i64 = 86_400_000;

/// One replica's stores over the shared database.
struct Replica {
    ckpt: Arc<dyn Checkpointer>,
    store: Arc<dyn ConversationStore>,
}

/// The shared database: a SQLite file (each replica opens it itself) or a PostgreSQL schema.
enum Shared {
    Sqlite(tempfile::TempDir),
    Postgres(PgSchema),
}

impl Shared {
    /// `None` when PostgreSQL is absent locally (under `CI` that panics instead).
    async fn new(kind: &str) -> Option<Self> {
        Some(match kind {
            "sqlite" => Self::Sqlite(tempfile::tempdir().expect("tempdir")),
            _ => Self::Postgres(PgSchema::create().await?),
        })
    }

    async fn replica(&self) -> Replica {
        match self {
            Self::Sqlite(dir) => {
                let ckpt = SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.expect("open");
                let store: Arc<dyn ConversationStore> =
                    Arc::new(SqliteConversationStore::new(ckpt.database().clone()).await.expect("migrate"));
                Replica { ckpt: Arc::new(ProjectingCheckpointer::sqlite(ckpt, project)), store }
            }
            Self::Postgres(schema) => {
                let ckpt = PostgresCheckpointer::connect_with(schema.options()).await.expect("connect");
                let store: Arc<dyn ConversationStore> =
                    Arc::new(PostgresConversationStore::new(ckpt.pool().clone()).await.expect("migrate"));
                Replica { ckpt: Arc::new(ProjectingCheckpointer::postgres(ckpt, project)), store }
            }
        }
    }
}

/// The tutor served by `replica` with `options`, over the model at `model`; its address.
async fn serve(replica: &Replica, model: &str, options: ServiceOptions) -> (String, AppState) {
    let agents = common::tutor(model, &replica.ckpt);
    let app = AppState::new(ChatService::new(
        agents,
        "tutor".into(),
        Arc::clone(&replica.store),
        Arc::clone(&replica.ckpt),
        options,
    ));
    app.set_ready();
    (common::serve(app.clone()).await, app)
}

fn turn(tenant: i64, user: i64, conversation: Option<i64>, message: &str) -> Value {
    json!({"tenantSlug": "demo", "tenantId": tenant, "userId": user, "conversationId": conversation, "message": message})
}

/// A reply whose model reports `prompt` and `completion` tokens.
fn reply(text: &str, prompt: u32, completion: u32) -> Reply {
    Reply::Stream(vec![
        Step::Text(text.into()),
        Step::Finish("stop".into()),
        Step::Usage { prompt, completion },
        Step::Done,
    ])
}

/// Runs a turn; its conversation and run ids.
async fn run_turn(base: &str, body: &Value) -> (i64, String) {
    let events = parse_sse(&stream_text(base, "demo", body).await);
    let done = events.last().expect("frames");
    assert_eq!(done.event, "done", "{events:?}");
    let run = events[0].id.rsplit_once(':').expect("run:seq ids").0.to_owned();
    (done.data["conversationId"].as_i64().expect("conversation id"), run)
}

async fn get(url: String) -> (u16, Value) {
    let resp = reqwest::get(url).await.expect("request");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn tokens_are_kept_per_turn_and_a_spent_budget_answers_429_until_the_next_period(kind: &str) {
    let Some(shared) = Shared::new(kind).await else { return };
    let model = ScriptedModelServer::start(vec![]).await.expect("model");
    // Order-independent: each message gets the reply that names its tokens.
    model.set_responder(|request| {
        let asked = request["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].to_string());
        match asked.as_deref() {
            Some(s) if s.contains("big") => reply("big answer", 1_200, 300),
            _ => reply("small answer", 100, 20),
        }
    });
    let budget = TokenBudget { tokens: 1_500, period: BudgetPeriod::Day, tenants: HashMap::from([(8, 0)]) };
    let options = ServiceOptions { token_budget: Some(budget), ..ServiceOptions::default() };
    let (base, _app) = serve(&shared.replica().await, &model.base_url(), options).await;

    let (conversation, first_run) = run_turn(&base, &turn(7, 101, None, "small question")).await;
    let (_, second_run) = run_turn(&base, &turn(7, 101, Some(conversation), "big question")).await;
    // What the model reported, turn by turn, and in all.
    let (status, usage) =
        get(format!("{base}/api/chatbot/conversations/{conversation}/usage?tenantId=7&userId=101")).await;
    assert_eq!(status, 200, "{usage}");
    let turns = usage["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 2, "{usage}");
    assert_eq!(
        (&turns[0]["runId"], &turns[0]["promptTokens"], &turns[0]["completionTokens"], &turns[0]["calls"]),
        (&json!(first_run), &json!(100), &json!(20), &json!(1))
    );
    assert_eq!((&turns[1]["runId"], &turns[1]["promptTokens"]), (&json!(second_run), &json!(1_200)));
    assert_eq!((&turns[1]["model"], &turns[1]["agent"]), (&json!("scripted"), &json!("tutor")));
    assert_eq!(usage["total"], json!({"promptTokens": 1_300, "completionTokens": 320, "cachedPromptTokens": 0}));
    // Only its owner reads it.
    let (status, _) = get(format!("{base}/api/chatbot/conversations/{conversation}/usage?tenantId=7&userId=102")).await;
    assert_eq!(status, 404);

    // 1,620 of 1,500 tokens: the next turn of tenant 7 is refused until tomorrow (UTC), and
    // leaves no conversation behind.
    let resp = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", "demo")
        .json(&turn(7, 101, None, "small again"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 429);
    let retry: i64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    let (_, tomorrow) = BudgetPeriod::Day.bounds(now_ms());
    assert!((1..=86_400).contains(&retry) && (retry * 1_000 - (tomorrow - now_ms())).abs() < 5_000, "{retry}");
    let refusal: Value = resp.json().await.unwrap();
    assert!(refusal["error"].as_str().unwrap().contains("1620 of 1500 tokens"), "{refusal}");
    let (_, listed) = get(format!("{base}/api/chatbot/conversations?tenantId=7&userId=101")).await;
    assert_eq!(listed["conversations"].as_array().map(Vec::len), Some(1), "{listed}");
    // Every door to a turn is refused alike: OpenAI's chat completions too.
    let openai = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .header("X-Tenant-Slug", "demo")
        .header("X-Tenant-Id", "7")
        .header("X-User-Id", "101")
        .json(&json!({"model": "tutor", "messages": [{"role": "user", "content": "small"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(openai.status(), 429);
    assert!(openai.headers().contains_key("retry-after"));
    // The tenant's figures; another tenant's turns go on, and tenant 8 has no budget.
    let (status, spent) = get(format!("{base}/api/chatbot/tenants/7/usage")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&spent["usedTokens"], &spent["budgetTokens"], &spent["period"]),
        (&json!(1_620), &json!(1_500), &json!("day"))
    );
    assert_eq!(spent["periodEndMs"].as_i64().unwrap() - spent["periodStartMs"].as_i64().unwrap(), DAY_MS);
    for _ in 0..2 {
        run_turn(&base, &turn(8, 5, None, "big question")).await;
    }
    let (_, spent) = get(format!("{base}/api/chatbot/tenants/8/usage")).await;
    assert_eq!((&spent["usedTokens"], spent.get("budgetTokens")), (&json!(3_000), None));
    run_turn(&base, &turn(9, 5, None, "small question")).await;

    // Deleting the conversation gives no tokens back.
    let deleted = reqwest::Client::new()
        .delete(format!("{base}/api/chatbot/conversations/{conversation}?tenantId=7&userId=101"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let (_, spent) = get(format!("{base}/api/chatbot/tenants/7/usage")).await;
    assert_eq!(spent["usedTokens"], json!(1_620));
}

async fn two_replicas_prune_idle_conversations_once_per_pass_on_a_moved_clock(kind: &str) {
    let Some(shared) = Shared::new(kind).await else { return };
    let model = ScriptedModelServer::start(vec![]).await.expect("model");
    model.set_responder(|_| reply("ok", 10, 2));
    let retention = Retention {
        conversation_idle: Some(Duration::from_secs(30 * 86_400)),
        tenants: HashMap::from([(9, Some(Duration::from_secs(86_400))), (10, None)]),
        agents: HashMap::new(),
        keep_checkpoints: None,
        tenants_keep: HashMap::new(),
        agents_keep: HashMap::new(),
        usage: Some(Duration::from_secs(60 * 86_400)),
        every: Duration::from_secs(3_600),
        // The test moves the clock and calls each pass itself.
        background: false,
    };
    let options = |id: &str| ServiceOptions {
        instance_id: id.into(),
        retention: Some(retention.clone()),
        ..ServiceOptions::default()
    };
    let (a, b) = (shared.replica().await, shared.replica().await);
    let (base_a, app_a) = serve(&a, &model.base_url(), options("a")).await;
    let (base_b, app_b) = serve(&b, &model.base_url(), options("b")).await;

    let (seven, seven_run) = run_turn(&base_a, &turn(7, 1, None, "hola")).await;
    let (nine, nine_run) = run_turn(&base_b, &turn(9, 1, None, "hola")).await;
    let (ten, _) = run_turn(&base_a, &turn(10, 1, None, "hola")).await;
    let history = |replica: &Replica, tenant: i64, conversation: i64| {
        let ckpt = Arc::clone(&replica.ckpt);
        async move { ckpt.list(&ConversationThread { tenant, conversation }.thread_id()).await.unwrap().len() }
    };
    assert!(history(&a, 9, nine).await > 0, "checkpoints were written");
    let now = now_ms();

    // Two days on, both replicas look at once: one runs the pass, and only tenant 9's
    // conversation (a day's retention) goes.
    let (pa, pb) =
        tokio::join!(app_a.chat().prune(now + 2 * DAY_MS, false), app_b.chat().prune(now + 2 * DAY_MS, false));
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    assert!(pa.ran ^ pb.ran, "exactly one replica ran the pass: {pa:?} {pb:?}");
    assert_eq!(pa.conversations + pb.conversations, 1);
    assert!(b.store.conversation(9, 1, nine).await.unwrap().is_none());
    assert_eq!(history(&b, 9, nine).await, 0, "its checkpoints went with it");
    let (status, _) = get(format!("{base_b}/api/chatbot/runs/{nine_run}/events?tenantId=9&userId=1")).await;
    assert_eq!(status, 404, "and its run's frames, on the replica that ran it");
    assert!(a.store.conversation(7, 1, seven).await.unwrap().is_some());
    // Within the hour, no replica runs another pass.
    for app in [&app_a, &app_b] {
        assert!(!app.chat().prune(now + 2 * DAY_MS + 600_000, false).await.unwrap().ran);
    }

    // A month on: tenant 7's conversation goes too (the default 30 days); tenant 10 keeps its.
    let p = app_b.chat().prune(now + 31 * DAY_MS, false).await.unwrap();
    assert_eq!((p.ran, p.conversations, p.usage_rows), (true, 1, 0));
    assert!(a.store.conversation(7, 1, seven).await.unwrap().is_none());
    assert_eq!(history(&a, 7, seven).await, 0);
    let (status, _) = get(format!("{base_a}/api/chatbot/runs/{seven_run}/events?tenantId=7&userId=1")).await;
    assert_eq!(status, 404);
    assert!(a.store.conversation(10, 1, ten).await.unwrap().is_some(), "tenant 10 keeps everything");
    assert!(history(&a, 10, ten).await > 0);
    // Its usage still counts for tenant 7's budget until the usage's own 60 days are up.
    assert_eq!(a.store.tenant_tokens_since(7, 0).await.unwrap(), 12);
    let p = app_a.chat().prune(now + 61 * DAY_MS, false).await.unwrap();
    assert_eq!((p.ran, p.usage_rows), (true, 3), "tenants 7, 9 and 10's usage rows");
    assert_eq!(a.store.tenant_tokens_since(7, 0).await.unwrap(), 0);

    app_a.chat().shutdown().await;
    app_b.chat().shutdown().await;
}

/// On the real clock: a replica's own timer runs the passes — an idle conversation goes
/// within a period or two of being idle, with nobody calling `prune`.
async fn a_replica_prunes_on_its_own_timer(kind: &str) {
    let Some(shared) = Shared::new(kind).await else { return };
    let model = ScriptedModelServer::start(vec![]).await.expect("model");
    model.set_responder(|_| reply("ok", 10, 2));
    let retention = Retention {
        conversation_idle: Some(Duration::from_millis(300)),
        tenants: HashMap::new(),
        agents: HashMap::new(),
        keep_checkpoints: None,
        tenants_keep: HashMap::new(),
        agents_keep: HashMap::new(),
        usage: None,
        every: Duration::from_secs(1),
        background: true,
    };
    let options = ServiceOptions { retention: Some(retention), ..ServiceOptions::default() };
    let replica = shared.replica().await;
    let (base, app) = serve(&replica, &model.base_url(), options).await;
    let (conversation, _) = run_turn(&base, &turn(7, 1, None, "hola")).await;
    assert!(replica.store.conversation(7, 1, conversation).await.unwrap().is_some());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while replica.store.conversation(7, 1, conversation).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the timer's passes did not prune the idle conversation");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.chat().shutdown().await;
}

/// Every update of `thread`'s checkpoints, in order: what its state is folded from.
async fn updates(replica: &Replica, tenant: i64, conversation: i64) -> Vec<String> {
    let thread = ConversationThread { tenant, conversation }.thread_id();
    let records = replica.ckpt.load(&thread, None).await.unwrap();
    records.iter().flat_map(|r| r.updates.iter().map(|u| u.get().to_owned())).collect()
}

/// `keep_checkpoints`: a pass of one of two replicas folds the finished threads active since
/// the pass before, once they hold more than twice what is kept, to their last checkpoints —
/// the same updates, in the same order, in fewer records — except where a tenant keeps all;
/// `toolgraph gc`'s forced pass reaches every conversation; and the conversation goes on.
async fn two_replicas_compact_finished_threads_to_their_last_checkpoints(kind: &str) {
    let Some(shared) = Shared::new(kind).await else { return };
    let model = ScriptedModelServer::start(vec![]).await.expect("model");
    model.set_responder(|_| reply("ok", 10, 2));
    let retention = Retention {
        keep_checkpoints: Some(2),
        tenants_keep: HashMap::from([(8, None)]),
        every: Duration::from_secs(3_600),
        background: false,
        ..Retention::default()
    };
    let options = |id: &str| ServiceOptions {
        instance_id: id.into(),
        retention: Some(retention.clone()),
        ..ServiceOptions::default()
    };
    let (a, b) = (shared.replica().await, shared.replica().await);
    let (base_a, app_a) = serve(&a, &model.base_url(), options("a")).await;
    let (base_b, app_b) = serve(&b, &model.base_url(), options("b")).await;
    let (seven, _) = run_turn(&base_a, &turn(7, 1, None, "uno")).await;
    run_turn(&base_b, &turn(7, 1, Some(seven), "dos")).await;
    run_turn(&base_a, &turn(7, 1, Some(seven), "tres")).await;
    let (eight, _) = run_turn(&base_b, &turn(8, 1, None, "uno")).await;
    run_turn(&base_a, &turn(8, 1, Some(eight), "dos")).await;
    let thread = |tenant, conversation| ConversationThread { tenant, conversation }.thread_id();
    let (seven_before, eight_before) = (a.ckpt.list(&thread(7, seven)).await.unwrap(), updates(&a, 8, eight).await);
    assert!(seven_before.len() > 3, "{seven_before:?}");
    let seven_updates = updates(&a, 7, seven).await;

    let now = now_ms();
    let (pa, pb) = tokio::join!(app_a.chat().prune(now + 3_600_000, false), app_b.chat().prune(now + 3_600_000, false));
    let (pa, pb) = (pa.unwrap(), pb.unwrap());
    assert!(pa.ran ^ pb.ran, "exactly one replica ran the pass: {pa:?} {pb:?}");
    assert_eq!(pa.checkpoints + pb.checkpoints, seven_before.len() as u64 - 2);
    let seven_after = b.ckpt.list(&thread(7, seven)).await.unwrap();
    let seqs = |l: &[toolgraph_graph::CheckpointMeta]| l.iter().map(|m| m.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&seven_after), seqs(&seven_before[seven_before.len() - 2..]), "the last two");
    assert_eq!(updates(&b, 7, seven).await, seven_updates, "the same updates, folded into fewer records");
    assert_eq!(updates(&b, 8, eight).await, eight_before, "tenant 8 keeps all");
    assert_eq!(b.ckpt.list(&thread(8, eight)).await.unwrap().len(), 4);
    // The first kept checkpoint shows the whole conversation up to it; an older one is gone.
    let at =
        |seq: u64| get(format!("{base_b}/api/chatbot/conversations/{seven}/checkpoints/{seq}?tenantId=7&userId=1"));
    let (status, first_kept) = at(seven_after[0].seq).await;
    assert_eq!(status, 200, "{first_kept}");
    assert!(["uno", "dos", "tres"].iter().all(|m| first_kept.to_string().contains(m)), "{first_kept}");
    assert_eq!(at(seven_before[0].seq).await.0, 404);

    // The conversation goes on where it was, on either replica, and shows every message.
    let (again, _) = run_turn(&base_b, &turn(7, 1, Some(seven), "cuatro")).await;
    assert_eq!(again, seven);
    run_turn(&base_a, &turn(7, 1, Some(seven), "cinco")).await;
    let shown = a.store.messages(seven).await.unwrap();
    let said: Vec<&str> = shown.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(said, ["uno", "ok", "dos", "ok", "tres", "ok", "cuatro", "ok", "cinco", "ok"]);

    // A pass a day later looks only at what was active since the pass before; a forced one
    // (`toolgraph gc`) at every conversation.
    let later = now + 2 * DAY_MS;
    let p = app_a.chat().prune(later + 5 * 3_600_000, false).await.unwrap();
    assert_eq!((p.ran, p.checkpoints), (true, 0), "nothing active in the last two hours: {p:?}");
    let grown = a.ckpt.list(&thread(7, seven)).await.unwrap().len() as u64;
    assert!(grown > 4, "two turns more: more than twice what is kept");
    let p = app_a.chat().prune(later + 5 * 3_600_000, true).await.unwrap();
    assert_eq!(p.checkpoints, grown - 2, "the turns after the pass are folded now: {p:?}");
    assert_eq!(a.ckpt.list(&thread(7, seven)).await.unwrap().len(), 2);

    app_a.chat().shutdown().await;
    app_b.chat().shutdown().await;
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $name() { super::$name("sqlite").await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() { super::$name("postgres").await })*
        }
    };
}

on_both_stores!(
    tokens_are_kept_per_turn_and_a_spent_budget_answers_429_until_the_next_period,
    two_replicas_prune_idle_conversations_once_per_pass_on_a_moved_clock,
    a_replica_prunes_on_its_own_timer,
    two_replicas_compact_finished_threads_to_their_last_checkpoints,
);
