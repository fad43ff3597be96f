//! The chat service end to end: a real listener on an ephemeral port, the scripted model
//! server over HTTP, the SQLite store, requests from reqwest.

mod common;
use common::{SseEvent, parse_sse};
use toolgraph_agents::chat_agent::GraphAgent;

use schemars::JsonSchema;
use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use toolgraph_agents::conversation::project;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::react;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::backend::{BackendConversationStore, BackendOptions};
use toolgraph_conversations::{
    ConversationStore, PostgresConversationStore, ProjectingCheckpointer, SqliteConversationStore, TurnClaim,
};
use toolgraph_graph::SqliteCheckpointer;
use toolgraph_graph::{Checkpointer, PostgresCheckpointer};
use toolgraph_llm::{OpenAiChatModel, OpenAiConfig, RetryPolicy};
use toolgraph_server::{AppState, ChatError, ChatService, ServedAgent, ServiceOptions};
use toolgraph_testkit::PgSchema;
use toolgraph_tools::ToolBuilder;

#[derive(Deserialize, JsonSchema)]
struct SmsArgs {
    /// Recipient.
    to: String,
    /// Text.
    text: String,
}

struct Service {
    base: String,
    model: ScriptedModelServer,
    app: AppState,
    store: Arc<dyn ConversationStore>,
    sms_sent: Arc<AtomicUsize>,
    announced: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
    _pg: Option<PgSchema>,
}

/// The checkpointer, the store the service calls, the store the tests read, the schema.
type Stores = (Arc<dyn Checkpointer>, Arc<dyn ConversationStore>, Arc<dyn ConversationStore>, Option<PgSchema>);

async fn service(b: &str, script: Vec<Reply>) -> Service {
    service_with(b, script, true, 10).await
}

async fn service_with(b: &str, script: Vec<Reply>, ready: bool, recursion_limit: u32) -> Service {
    service_opts(b, script, ready, recursion_limit, ServiceOptions::default()).await
}

async fn service_opts(
    b: &str,
    script: Vec<Reply>,
    ready: bool,
    recursion_limit: u32,
    options: ServiceOptions,
) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModelServer::start(script).await.unwrap();
    let mut cfg = OpenAiConfig::new(model.base_url(), "scripted");
    cfg.retry =
        RetryPolicy { max_retries: 1, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(10) };
    let llm = Arc::new(OpenAiChatModel::new(cfg).unwrap());
    let (sms_sent, announced) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tools = toolgraph_tools::builtin::registry(dir.path()).unwrap();
    for (name, counter) in [("send_sms", sms_sent.clone()), ("create_announcement", announced.clone())] {
        tools
            .register(
                ToolBuilder::<SmsArgs>::new(name, "write action")
                    .write(move |a| format!("{name} to {}: {}", a.to, a.text))
                    .handler(move |_c, _a| {
                        let counter = counter.clone();
                        async move {
                            counter.fetch_add(1, Ordering::SeqCst);
                            Ok(json!({"ok": true}))
                        }
                    })
                    .unwrap(),
            )
            .unwrap();
    }
    // `service_store` is what the service calls; `store` is where the tests look.
    let (ckpt, service_store, store, pg): Stores = if let Some(secret) = b.strip_prefix("backend") {
        // The conversation lives in a backend reached by signed calls; the tests read what
        // the backend stored. `backend:SECRET` signs with another secret than the backend's.
        let (backend_url, backend_store) = backend::start(dir.path()).await;
        let secret = secret.strip_prefix(':').unwrap_or(backend::SECRET);
        let calls: Arc<dyn ConversationStore> = Arc::new(
            BackendConversationStore::new(BackendOptions {
                base_url: backend_url,
                secret: secret.as_bytes().to_vec(),
                timeout: Duration::from_secs(5),
            })
            .unwrap(),
        );
        let ckpt = SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.unwrap();
        (Arc::new(ProjectingCheckpointer::forwarding(ckpt, calls.clone(), project)), calls, backend_store, None)
    } else if b == "postgres" {
        let schema = PgSchema::create().await.expect("checked by the test wrapper");
        let ckpt = PostgresCheckpointer::connect_with(schema.options()).await.unwrap();
        let store: Arc<dyn ConversationStore> =
            Arc::new(PostgresConversationStore::new(ckpt.pool().clone()).await.unwrap());
        (Arc::new(ProjectingCheckpointer::postgres(ckpt, project)), store.clone(), store, Some(schema))
    } else {
        let ckpt = SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.unwrap();
        let store: Arc<dyn ConversationStore> =
            Arc::new(SqliteConversationStore::new(ckpt.database().clone()).await.unwrap());
        (Arc::new(ProjectingCheckpointer::sqlite(ckpt, project)), store.clone(), store, None)
    };
    let helper = react::build(AgentSpec::new("helper", "You help.", tools.clone()), llm.clone(), ckpt.clone()).unwrap();
    let graph = react::build(AgentSpec::new("lumie", "You are Lumie.", tools), llm, ckpt.clone()).unwrap();
    let settings = AgentSettings { recursion_limit, state_keys: vec!["asignatura".into()], ..AgentSettings::default() };
    let agents = BTreeMap::from([
        ("lumie".to_string(), ServedAgent::new(GraphAgent::new(graph), settings.clone())),
        ("helper".to_string(), ServedAgent::new(GraphAgent::new(helper), settings)),
    ]);
    let app = AppState::new(ChatService::new(agents, "lumie".into(), service_store, ckpt, options));
    if ready {
        app.set_ready();
    }
    let base = common::serve(app.clone()).await;
    Service { base, model, app, store, sms_sent, announced, _dir: dir, _pg: pg }
}

fn body(conversation: Option<i64>, message: &str) -> Value {
    json!({"tenantSlug": "demo", "tenantId": 7, "userId": 101, "conversationId": conversation, "message": message})
}

async fn post(s: &Service, path: &str, slug: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", s.base))
        .header("X-Tenant-Slug", slug)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn stream(s: &Service, body: &Value) -> (u16, Vec<SseEvent>) {
    let resp = post(s, "/api/chatbot/stream", "demo", body).await;
    let status = resp.status().as_u16();
    (status, parse_sse(&resp.text().await.unwrap()))
}

async fn confirm(s: &Service, tenant: i64, user: i64, conversation: i64, message: i64, ok: bool) -> (u16, Value) {
    let b = json!({"tenantSlug": "demo", "tenantId": tenant, "userId": user, "conversationId": conversation, "messageId": message, "confirmed": ok});
    let resp = post(s, "/api/chatbot/confirm", "demo", &b).await;
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

/// A stream request running in the background; resolves to the whole SSE text.
fn spawn_stream(s: &Service, body: Value) -> tokio::task::JoinHandle<String> {
    let url = format!("{}/api/chatbot/stream", s.base);
    tokio::spawn(async move {
        let resp = reqwest::Client::new().post(url).header("X-Tenant-Slug", "demo").json(&body).send().await.unwrap();
        resp.text().await.unwrap()
    })
}

async fn metrics(s: &Service) -> String {
    reqwest::get(format!("{}/metrics", s.base)).await.unwrap().text().await.unwrap()
}

async fn the_seed_transcript_tokens_then_done_with_a_new_conversation(b: &str) {
    let s = service(b, vec![Reply::text("안녕 하세요")]).await;
    let (status, events) = stream(&s, &body(None, "이번 주 공지사항을 만들어 줘")).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["token", "token", "done"]);
    assert_eq!(events[0].data, json!({"content": "안녕 "}));
    assert_eq!(events[1].data, json!({"content": "하세요"}));
    let conv = events[2].data["conversationId"].as_i64().unwrap();
    let msg = events[2].data["messageId"].as_i64().unwrap();
    // Every event carries an id `<runId>:<seq>`, in order.
    let run = events[0].id.rsplit_once(':').unwrap().0.to_owned();
    assert_eq!(events.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), [1, 2, 3].map(|n| format!("{run}:{n}")));
    let stored = s.store_messages(conv).await;
    assert_eq!(stored.iter().map(|m| m.1.as_str()).collect::<Vec<_>>(), ["user", "assistant"]);
    assert_eq!(stored[1], (msg, "assistant".into(), "안녕 하세요".into()));
    // The second turn continues the same conversation with its history.
    s.model.push([Reply::text("네")]);
    let (_, events) = stream(&s, &body(Some(conv), "고마워요")).await;
    assert_eq!(events.last().unwrap().data["conversationId"], conv);
    let sent = &s.model.requests()[1]["messages"];
    assert!(sent.to_string().contains("이번 주 공지사항을"), "{sent}");
}

impl Service {
    async fn store_messages(&self, conv: i64) -> Vec<(i64, String, String)> {
        let stored = self.store.messages(conv).await.unwrap();
        stored.into_iter().map(|m| (m.id, m.role.as_str().to_owned(), m.content)).collect()
    }
}

async fn bad_requests_get_clear_errors(b: &str) {
    let s = service(b, vec![Reply::text("ok")]).await;
    let resp = post(&s, "/api/chatbot/stream", "other", &body(None, "hola")).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<Value>().await.unwrap()["field"], "X-Tenant-Slug");
    for (b, field) in [
        (body(None, ""), "message"),
        (body(None, &"a".repeat(4001)), "message"),
        (json!({"tenantSlug": "demo", "tenantId": "seven", "userId": 1, "message": "x"}), "tenantId"),
        (json!({"tenantSlug": "demo", "tenantId": 7, "userId": 1}), "message"),
        (json!({"tenantSlug": "", "tenantId": 7, "userId": 1, "message": "x"}), "tenantSlug"),
    ] {
        let resp = post(&s, "/api/chatbot/stream", b["tenantSlug"].as_str().unwrap_or("demo"), &b).await;
        assert_eq!(resp.status(), 422, "{b}");
        assert_eq!(resp.json::<Value>().await.unwrap()["field"], field, "{b}");
    }
    let resp = reqwest::Client::new()
        .post(format!("{}/api/chatbot/stream", s.base))
        .header("X-Tenant-Slug", "demo")
        .header("content-type", "application/json")
        .body("{\"tenantSlug\": \"demo\",")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(resp.json::<Value>().await.unwrap()["error"].as_str().unwrap().starts_with("malformed JSON"));
    // JSON nested 10,000 deep (20 KB) is refused as malformed, without exhausting the stack.
    let nested = format!(
        "{{\"tenantSlug\": \"demo\", \"tenantId\": 7, \"userId\": 101, \"message\": \"x\", \"context\": {{\"a\": {}{}}}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let resp = reqwest::Client::new()
        .post(format!("{}/api/chatbot/stream", s.base))
        .header("X-Tenant-Slug", "demo")
        .header("content-type", "application/json")
        .body(nested)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err = resp.json::<Value>().await.unwrap();
    assert!(err["error"].as_str().unwrap().starts_with("malformed JSON"), "{err}");
    // Bodies over 64 KiB are refused before they are parsed.
    let big = post(&s, "/api/chatbot/stream", "demo", &body(None, &"a".repeat(70 * 1024))).await;
    assert_eq!(big.status(), 413);
    // 4,000 Korean characters (12,000 bytes) are accepted: the limit counts characters.
    let (status, events) = stream(&s, &body(None, &"한".repeat(4000))).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().event, "done");
    // Unknown and foreign conversations are 404, with nothing revealed.
    let (status, _) = stream(&s, &body(Some(999), "hola")).await;
    assert_eq!(status, 404);
    let conv = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    // A conversation stays with the agent that started it.
    let mut other_agent = body(Some(conv), "hola");
    other_agent["agent"] = json!("helper");
    let resp = post(&s, "/api/chatbot/stream", "demo", &other_agent).await;
    assert_eq!(resp.status(), 422);
    let err = resp.json::<Value>().await.unwrap();
    assert_eq!(err["field"], "agent");
    assert!(err["error"].as_str().unwrap().contains("belongs to agent 'lumie'"), "{err}");
    let mut unknown_agent = body(None, "hola");
    unknown_agent["agent"] = json!("nobody");
    assert_eq!(post(&s, "/api/chatbot/stream", "demo", &unknown_agent).await.status(), 422);
    let mut foreign = body(Some(conv), "hola");
    foreign["userId"] = json!(102);
    assert_eq!(post(&s, "/api/chatbot/stream", "demo", &foreign).await.status(), 404);
}

async fn not_ready_is_503_and_health_is_always_ok(b: &str) {
    let s = service_with(b, vec![], false, 10).await;
    assert_eq!(
        reqwest::get(format!("{}/health", s.base)).await.unwrap().json::<Value>().await.unwrap(),
        json!({"status": "ok"})
    );
    assert_eq!(reqwest::get(format!("{}/ready", s.base)).await.unwrap().status(), 503);
    assert_eq!(post(&s, "/api/chatbot/stream", "demo", &body(None, "hola")).await.status(), 503);
    s.app.set_ready();
    assert_eq!(
        reqwest::get(format!("{}/ready", s.base)).await.unwrap().json::<Value>().await.unwrap(),
        json!({"status": "ready"})
    );
}

async fn a_second_concurrent_turn_is_409(b: &str) {
    let s = service(
        b,
        vec![
            Reply::text("first"),
            Reply::Stream(vec![
                Step::Pause(Duration::from_millis(800)),
                Step::Text("slow".into()),
                Step::Finish("stop".into()),
                Step::Done,
            ]),
        ],
    )
    .await;
    let (_, events) = stream(&s, &body(None, "hola")).await;
    let conv = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let slow = spawn_stream(&s, body(Some(conv), "slow one"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = post(&s, "/api/chatbot/stream", "demo", &body(Some(conv), "impatient")).await;
    assert_eq!(resp.status(), 409);
    assert!(parse_sse(&slow.await.unwrap()).last().unwrap().event == "done");
}

async fn two_write_tools_pause_and_are_confirmed_one_by_one(b: &str) {
    let s = service(
        b,
        vec![
            Reply::tool_calls(&[
                ("s1", "send_sms", json!({"to": "+82101234", "text": "exam moved"})),
                ("a1", "create_announcement", json!({"to": "all", "text": "exam moved"})),
            ]),
            Reply::text("완료했습니다."),
        ],
    )
    .await;
    let (_, events) = stream(&s, &body(None, "공지하고 문자 보내줘")).await;
    let pending: Vec<&SseEvent> = events.iter().filter(|e| e.event == "pending").collect();
    assert_eq!(pending.len(), 2, "{events:?}");
    // Without the `toolEvents` extension a client sees only the contract's four event types.
    assert!(events.iter().all(|e| ["token", "pending", "done"].contains(&e.event.as_str())), "{events:?}");
    assert_eq!(pending[0].data["toolName"], "send_sms");
    assert_eq!(pending[0].data["description"], "send_sms to +82101234: exam moved");
    assert_eq!(pending[0].data["arguments"]["to"], "+82101234");
    let done = events.last().unwrap();
    assert_eq!(done.event, "done");
    assert_eq!(done.data["messageId"], pending[0].data["messageId"], "done names the pending action");
    let conv = done.data["conversationId"].as_i64().unwrap();
    let (sms, ann) = (pending[0].data["messageId"].as_i64().unwrap(), pending[1].data["messageId"].as_i64().unwrap());

    // Another user or tenant cannot confirm: 404.
    assert_eq!(confirm(&s, 7, 102, conv, sms, true).await.0, 404);
    assert_eq!(confirm(&s, 8, 101, conv, sms, true).await.0, 404);
    assert_eq!(confirm(&s, 7, 101, conv, 424242, true).await.0, 404);

    // A new turn meanwhile is refused, naming the actions to decide.
    let refused = || async {
        let resp = post(&s, "/api/chatbot/stream", "demo", &body(Some(conv), "¿y ahora?")).await;
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
    };
    let (status, r) = refused().await;
    assert_eq!(status, 409, "{r}");
    let ids: Vec<i64> =
        r["pendingActions"].as_array().unwrap().iter().filter_map(|p| p["messageId"].as_i64()).collect();
    assert_eq!(ids, [sms, ann], "{r}");
    assert_eq!(r["pendingActions"][0]["toolName"], "send_sms");

    // First decision: the other is still pending.
    let (status, r) = confirm(&s, 7, 101, conv, ann, false).await;
    assert_eq!(status, 200);
    assert_eq!(r["message"], "");
    assert_eq!(r["pendingAction"]["messageId"], sms);
    assert_eq!(confirm(&s, 7, 101, conv, ann, true).await.0, 409, "contradicting decision");
    assert_eq!(confirm(&s, 7, 101, conv, ann, false).await, (200, r.clone()), "same decision replays");
    let (status, r2) = refused().await;
    assert_eq!((status, r2["pendingActions"].as_array().map(Vec::len)), (409, Some(1)), "only the undecided one: {r2}");
    assert_eq!(r2["pendingActions"][0]["messageId"], sms);

    // Last decision: the run resumes; the approved tool runs once, the rejected never.
    let (status, r) = confirm(&s, 7, 101, conv, sms, true).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r, json!({"conversationId": conv, "message": "완료했습니다.", "pendingAction": null}));
    assert_eq!(confirm(&s, 7, 101, conv, sms, true).await, (200, r.clone()), "replay: same response");
    assert_eq!(s.sms_sent.load(Ordering::SeqCst), 1);
    assert_eq!(s.announced.load(Ordering::SeqCst), 0);
    assert_eq!(s.model.request_count(), 2, "replays do not call the model");
    let m = metrics(&s).await;
    assert!(m.contains("chatbot_stream_duration_seconds_count{outcome=\"interrupted\"} 1"), "{m}");
    assert!(m.contains("chatbot_hitl_total{confirmed=\"true\"} 1"), "{m}");
    assert!(m.contains("chatbot_hitl_total{confirmed=\"false\"} 1"), "{m}");
}

async fn a_client_disconnect_does_not_lose_the_reply_and_reconnect_replays_the_gap(b: &str) {
    let s = service(
        b,
        vec![Reply::Stream(vec![
            Step::Text("uno ".into()),
            Step::Pause(Duration::from_millis(400)),
            Step::Text("dos ".into()),
            Step::Text("tres".into()),
            Step::Finish("stop".into()),
            Step::Done,
        ])],
    )
    .await;
    let mut resp = post(&s, "/api/chatbot/stream", "demo", &body(None, "cuenta")).await;
    let first = String::from_utf8(resp.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    let first = parse_sse(&first);
    assert_eq!(first[0].data, json!({"content": "uno "}));
    drop(resp); // the client goes away mid-stream
    let run_id = first[0].id.rsplit_once(':').unwrap().0.to_owned();

    // Reconnect with the last id seen: exactly the missed events follow.
    let resp = reqwest::Client::new()
        .get(format!("{}/api/chatbot/runs/{run_id}/events?tenantId=7&userId=101", s.base))
        .header("Last-Event-ID", &first[0].id)
        .send()
        .await
        .unwrap();
    let rest = parse_sse(&resp.text().await.unwrap());
    assert_eq!(rest.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), [2, 3, 4].map(|n| format!("{run_id}:{n}")));
    assert_eq!(rest[0].data, json!({"content": "dos "}));
    let conv = rest[2].data["conversationId"].as_i64().unwrap();
    let stored = s.store_messages(conv).await;
    assert_eq!(stored.last().unwrap().2, "uno dos tres", "the reply was persisted");
    // Someone else cannot read the run.
    let other =
        reqwest::get(format!("{}/api/chatbot/runs/{run_id}/events?tenantId=7&userId=999", s.base)).await.unwrap();
    assert_eq!(other.status(), 404);
}

async fn a_failing_model_sends_an_error_event_and_counts_it(b: &str) {
    let s = service(b, vec![Reply::status(500, "down"), Reply::status(500, "down")]).await;
    let (status, events) = stream(&s, &body(None, "hola")).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().event, "error");
    assert!(events.last().unwrap().data["message"].as_str().unwrap().contains("model endpoint failed"));
    let m = metrics(&s).await;
    assert!(m.contains("chatbot_errors_total{error_type=\"exception\"} 1"), "{m}");
    assert!(m.contains("chatbot_stream_duration_seconds_count{outcome=\"error\"} 1"), "{m}");
}

async fn a_failed_read_tool_is_counted_as_a_retry_of_its_tenant(b: &str) {
    let s = service(
        b,
        vec![
            Reply::tool_calls(&[("c1", "calculator", json!({"expression": "2 +"}))]),
            Reply::tool_calls(&[("c2", "calculator", json!({"expression": "2 + 2"}))]),
            Reply::text("4"),
        ],
    )
    .await;
    let (_, events) = stream(&s, &body(None, "2 + 2?")).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    // The path the academy-admin ServiceMonitor scrapes, with its trailing slash.
    let m = reqwest::get(format!("{}/metrics/", s.base)).await.unwrap().text().await.unwrap();
    assert!(m.contains("chatbot_sql_retries_total{tenant=\"7\"} 1"), "{m}");
    assert!(m.contains("chatbot_stream_duration_seconds_count{outcome=\"completed\"} 1"), "{m}");
}

async fn the_recursion_limit_persists_a_fallback_message(b: &str) {
    let call = |i: u32| Reply::tool_calls(&[(&format!("c{i}"), "calculator", json!({"expression": "1+1"}))]);
    let s = service_with(b, (0..5).map(call).collect(), true, 3).await;
    let (_, events) = stream(&s, &body(None, "loop")).await;
    let done = events.last().unwrap();
    assert_eq!(done.event, "done", "{events:?}");
    let conv = done.data["conversationId"].as_i64().unwrap();
    let last = s.store_messages(conv).await.pop().unwrap();
    assert_eq!((last.0, last.1.as_str()), (done.data["messageId"].as_i64().unwrap(), "assistant"));
    assert!(last.2.contains("allowed number of steps"), "{}", last.2);
    assert!(metrics(&s).await.contains("chatbot_errors_total{error_type=\"recursion\"} 1"));
}

async fn deleting_a_conversation_removes_it_for_good(b: &str) {
    let s = service(b, vec![Reply::text("hola"), Reply::text("otra"), Reply::text("y otra")]).await;
    let (_, events) = stream(&s, &body(None, "hola")).await;
    let conv = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    // What the run streamed is there to replay until its conversation goes.
    let run = events.last().unwrap().id.rsplit_once(':').unwrap().0.to_owned();
    let replay = |run: String| {
        let url = format!("{}/api/chatbot/runs/{run}/events?tenantId=7&userId=101", s.base);
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    let (_, kept) = stream(&s, &body(None, "otra conversación")).await;
    let kept_run = kept.last().unwrap().id.rsplit_once(':').unwrap().0.to_owned();
    assert_eq!(replay(run.clone()).await, 200);
    let url = format!("{}/api/chatbot/conversations/{conv}?tenantId=7&userId=101", s.base);
    let foreign = format!("{}/api/chatbot/conversations/{conv}?tenantId=7&userId=5", s.base);
    assert_eq!(reqwest::Client::new().delete(&foreign).send().await.unwrap().status(), 404);
    assert_eq!(reqwest::Client::new().delete(&url).send().await.unwrap().status(), 204);
    assert_eq!(stream(&s, &body(Some(conv), "¿sigues?")).await.0, 404);
    assert!(s.store_messages(conv).await.is_empty());
    assert_eq!(replay(run).await, 404, "the deleted conversation's run frames went with it");
    assert_eq!(replay(kept_run.clone()).await, 200, "another conversation's did not");
    // Deleting the user takes the rest.
    let user = format!("{}/api/chatbot/users/101?tenantId=7", s.base);
    assert_eq!(reqwest::Client::new().delete(&user).send().await.unwrap().status(), 200);
    assert_eq!(replay(kept_run).await, 404, "the deleted user's run frames went with them");
}

async fn a_final_decision_that_could_not_resume_is_resumed_by_its_retry(b: &str) {
    let s = service(
        b,
        vec![
            Reply::tool_calls(&[("s1", "send_sms", json!({"to": "+34600", "text": "hola"}))]),
            Reply::text("Enviado."),
        ],
    )
    .await;
    let (_, events) = stream(&s, &body(None, "manda un SMS")).await;
    let pending = events.iter().find(|e| e.event == "pending").unwrap();
    let conv = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let msg = pending.data["messageId"].as_i64().unwrap();
    // Another replica holds the conversation when the decision arrives.
    let other = TurnClaim { run_id: "other-replica".into(), owner: "replica-b".into(), lease_ms: 60_000 };
    assert!(s.store.begin_turn(conv, &other).await.unwrap());
    assert_eq!(confirm(&s, 7, 101, conv, msg, true).await.0, 409);
    assert_eq!(s.sms_sent.load(Ordering::SeqCst), 0);
    s.store.end_turn(conv, "other-replica").await.unwrap();
    // The retry carries the same (already recorded) decision and resumes the run.
    let (status, r) = confirm(&s, 7, 101, conv, msg, true).await;
    assert_eq!((status, r["message"].as_str()), (200, Some("Enviado.")), "{r}");
    assert_eq!(s.sms_sent.load(Ordering::SeqCst), 1);
}

/// A turn whose replica died (its lease expired unrenewed) is taken over through the store the
/// service uses: the dead replica's claim is gone, the taker's is released, and the
/// conversation takes the next turn.
async fn an_expired_turn_is_taken_over_and_its_conversation_freed(b: &str) {
    let s = service(b, vec![Reply::text("hola"), Reply::text("otra vez")]).await;
    let (_, events) = stream(&s, &body(None, "hola")).await;
    let conv = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let dead = TurnClaim { run_id: "dead-run".into(), owner: "replica-dead".into(), lease_ms: -1 };
    assert!(s.store.begin_turn(conv, &dead).await.unwrap());
    let live = s.store.create_conversation(7, 101, "lumie").await.unwrap();
    let held = TurnClaim { run_id: "live-run".into(), owner: "replica-live".into(), lease_ms: 60_000 };
    assert!(s.store.begin_turn(live, &held).await.unwrap());
    // No run of the graph stopped mid-way here (its record says the turn ended), so nothing
    // is closed; the claim is taken and released all the same.
    assert_eq!(s.app.chat().take_over_expired().await.unwrap(), 0);
    assert!(!s.store.renew_turn(conv, &dead).await.unwrap(), "the dead replica's claim is gone");
    assert!(s.store.renew_turn(live, &held).await.unwrap(), "a live claim is left alone");
    let (status, events) = stream(&s, &body(Some(conv), "sigue")).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().event, "done", "the conversation takes the next turn");
}

fn api_key_options(slug: &str, key: &str) -> ServiceOptions {
    let digest = toolgraph_server::auth::hash_api_key(key);
    ServiceOptions {
        // The slug is bound to tenant id 7, the id of `body()`.
        auth: toolgraph_server::auth::Auth::api_keys([(&slug.to_string(), &digest)])
            .unwrap()
            .bind_tenant_ids([(&slug.to_string(), &7)])
            .unwrap(),
        ..ServiceOptions::default()
    }
}

async fn api_key_mode_rejects_missing_wrong_and_foreign_keys(b: &str) {
    let s = service_opts(b, vec![Reply::text("hola")], true, 10, api_key_options("demo", "k-demo-1")).await;
    let url = format!("{}/api/chatbot/stream", s.base);
    let send = |key: Option<&'static str>| {
        let mut rb = reqwest::Client::new().post(&url).header("X-Tenant-Slug", "demo").json(&body(None, "hola"));
        if let Some(k) = key {
            rb = rb.header("Authorization", format!("Bearer {k}"));
        }
        rb.send()
    };
    assert_eq!(send(None).await.unwrap().status(), 401);
    assert_eq!(send(Some("k-demo-2")).await.unwrap().status(), 401);
    let ok = send(Some("k-demo-1")).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(parse_sse(&ok.text().await.unwrap()).last().unwrap().event, "done");
    let with_demo_key = |slug: &'static str, body: Value| {
        let rb = reqwest::Client::new().post(&url).header("X-Tenant-Slug", slug);
        rb.header("Authorization", "Bearer k-demo-1").json(&body).send()
    };
    // The key of tenant "demo" does not open tenant "acme".
    let mut other = body(None, "hola");
    other["tenantSlug"] = json!("acme");
    assert_eq!(with_demo_key("acme", other).await.unwrap().status(), 401);
    // Nor another tenant id under its own slug: the stores key data by the id.
    let mut foreign = body(None, "hola");
    foreign["tenantId"] = json!(8);
    assert_eq!(with_demo_key("demo", foreign).await.unwrap().status(), 403);
    // Liveness and metrics stay open.
    assert_eq!(reqwest::get(format!("{}/health", s.base)).await.unwrap().status(), 200);
}

async fn hmac_mode_rejects_unsigned_tampered_stale_and_replayed_requests(b: &str) {
    use toolgraph_server::auth::{Auth, HmacVerifier, SignedRequest, sign};
    let options =
        ServiceOptions { auth: Auth::Hmac(HmacVerifier::new(b"s3cret".to_vec())), ..ServiceOptions::default() };
    let s = service_opts(b, vec![Reply::text("hola")], true, 10, options).await;
    let url = format!("{}/api/chatbot/stream", s.base);
    let raw = serde_json::to_vec(&body(None, "hola")).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    // v2 signs the method, path, tenant slug and body with the nonce; one nonce throughout, so
    // the second good request is the replay.
    let nonce = "service-test-nonce-01";
    let signed = |ts: i64, payload: &[u8]| {
        let r =
            SignedRequest { method: "POST", target: "/api/chatbot/stream", tenant_slug: Some("demo"), body: payload };
        sign(b"s3cret", &r, ts, nonce)
    };
    let send = |ts: i64, sig: String, payload: Vec<u8>| {
        reqwest::Client::new()
            .post(&url)
            .header("X-Tenant-Slug", "demo")
            .header("content-type", "application/json")
            .header("X-Timestamp", ts.to_string())
            .header("X-Nonce", nonce)
            .header("X-Signature", sig)
            .body(payload)
            .send()
    };
    let unsigned = reqwest::Client::new()
        .post(&url)
        .header("X-Tenant-Slug", "demo")
        .json(&body(None, "hola"))
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), 401);
    let mut tampered = raw.clone();
    tampered[20] ^= 1;
    assert_eq!(send(now, signed(now, &raw), tampered).await.unwrap().status(), 401);
    let stale = now - 3600;
    assert_eq!(send(stale, signed(stale, &raw), raw.clone()).await.unwrap().status(), 401);
    let good = signed(now, &raw);
    let ok = send(now, good.clone(), raw.clone()).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(parse_sse(&ok.text().await.unwrap()).last().unwrap().event, "done");
    let replay = send(now, good, raw).await.unwrap();
    assert_eq!(replay.status(), 401);
    assert!(replay.text().await.unwrap().contains("replayed"));
}

async fn the_per_tenant_run_limit_answers_429_with_retry_after(b: &str) {
    let options = ServiceOptions { max_runs_per_tenant: 1, ..ServiceOptions::default() };
    let slow = Reply::Stream(vec![
        Step::Pause(Duration::from_millis(800)),
        Step::Text("slow".into()),
        Step::Finish("stop".into()),
        Step::Done,
    ]);
    let s = service_opts(b, vec![slow, Reply::text("other tenant"), Reply::text("later")], true, 10, options).await;
    let first = spawn_stream(&s, body(None, "uno"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = post(&s, "/api/chatbot/stream", "demo", &body(None, "dos")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let listed = reqwest::get(format!("{}/api/chatbot/conversations?tenantId=7&userId=101", s.base)).await.unwrap();
    let listed: Value = listed.json().await.unwrap();
    assert_eq!(listed["conversations"].as_array().unwrap().len(), 1, "a refused turn leaves no conversation: {listed}");
    let mut other = body(None, "hola");
    other["tenantId"] = json!(8);
    let (status, _) = stream(&s, &other).await;
    assert_eq!(status, 200, "another tenant has its own slots");
    assert_eq!(parse_sse(&first.await.unwrap()).last().unwrap().event, "done");
    let (status, _) = stream(&s, &body(None, "tres")).await;
    assert_eq!(status, 200, "the slot is free again once the run ended");
}

async fn a_client_that_stops_reading_does_not_hold_up_the_run(b: &str) {
    let mut steps: Vec<Step> = (0..6000).map(|i| Step::Text(format!("token-{i:05} "))).collect();
    steps.extend([Step::Finish("stop".into()), Step::Done]);
    let s = service(b, vec![Reply::Stream(steps)]).await;
    let resp = post(&s, "/api/chatbot/stream", "demo", &body(None, "long answer please")).await;
    assert_eq!(resp.status(), 200);
    // The client reads nothing while ~6,000 frames (far more than socket buffers hold) are
    // produced; the run must finish and persist its reply regardless.
    let started = std::time::Instant::now();
    let conv = loop {
        let found = sqlx_free_lookup(&s).await;
        if let Some(c) = found {
            break c;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the run waited for the stalled client");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reply = s.store_messages(conv).await.pop().unwrap();
    assert_eq!(reply.1, "assistant");
    assert!(reply.2.ends_with("token-05999 "), "the whole reply was persisted");
    // The client resumes reading: whatever its buffers and the run's bounded log still hold
    // follows, ending with `done`.
    let events = parse_sse(&resp.text().await.unwrap());
    assert_eq!(events.last().unwrap().event, "done");
}

#[tokio::test]
async fn the_backend_store_answers_503_when_the_backend_refuses_its_calls() {
    let s = service("backend:not-the-backend-secret", vec![Reply::text("hola")]).await;
    let resp = post(&s, "/api/chatbot/stream", "demo", &body(None, "hola")).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let err: Value = resp.json().await.unwrap();
    assert!(err["error"].as_str().unwrap().contains("store is unavailable"), "{err}");
    assert_eq!(s.store.conversation(7, 101, 1).await.unwrap(), None, "the backend stored nothing");
    assert_eq!(s.model.requests().len(), 0, "no turn ran");
}

#[tokio::test]
async fn backend_callbacks_reject_unsigned_tampered_stale_and_replayed_calls() {
    use toolgraph_conversations::backend::wire::path;
    use toolgraph_server::auth::{SignedRequest, now_secs, sign, signature_headers};
    let dir = tempfile::tempdir().unwrap();
    let (base, store) = backend::start(dir.path()).await;
    let http = reqwest::Client::new();
    // `sig` is a nonce and a v2 signature.
    let call = |target: &str, ts: i64, sig: Option<(String, String)>, payload: &[u8]| {
        let mut req = if payload.is_empty() {
            http.get(format!("{base}{target}"))
        } else {
            http.post(format!("{base}{target}")).header("content-type", "application/json").body(payload.to_vec())
        };
        if let Some((nonce, sig)) = sig {
            req = req.header("x-timestamp", ts.to_string()).header("x-nonce", nonce).header("x-signature", sig);
        }
        req.send()
    };
    // A call's signature with a new nonce; GET when bodiless, as the client sends them.
    let signed = |secret: &[u8], ts: i64, target: &str, payload: &[u8]| {
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let method = if payload.is_empty() { "GET" } else { "POST" };
        let r = SignedRequest { method, target, tenant_slug: None, body: payload };
        Some((nonce.clone(), sign(secret, &r, ts, &nonce)))
    };
    let secret = backend::SECRET.as_bytes();
    let create = br#"{"nonce":"n1","tenantId":7,"userId":101,"agent":"lumie"}"#;
    let now = now_secs();
    let unsigned = call(path::CONVERSATIONS, now, None, create).await.unwrap();
    assert_eq!(unsigned.status(), 401);
    assert!(unsigned.text().await.unwrap().contains("unsigned"));
    let mut tampered = create.to_vec();
    let seven = create.iter().position(|&c| c == b'7').unwrap();
    tampered[seven] = b'8'; // tenantId 7 → 8
    let r = call(path::CONVERSATIONS, now, signed(secret, now, path::CONVERSATIONS, create), &tampered).await.unwrap();
    assert_eq!((r.status().as_u16(), r.text().await.unwrap().contains("mismatch")), (401, true));
    let old = now - 3600;
    let r = call(path::CONVERSATIONS, old, signed(secret, old, path::CONVERSATIONS, create), create).await.unwrap();
    assert_eq!((r.status().as_u16(), r.text().await.unwrap().contains("stale")), (401, true));
    let forged = signed(b"another-secret", now, path::CONVERSATIONS, create);
    let r = call(path::CONVERSATIONS, now, forged, create).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(store.conversation(7, 101, 1).await.unwrap(), None, "no refused call was executed");

    let good = signed(secret, now, path::CONVERSATIONS, create);
    let r = call(path::CONVERSATIONS, now, good.clone(), create).await.unwrap();
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.unwrap()["id"].as_i64().unwrap();
    let replay = call(path::CONVERSATIONS, now, good, create).await.unwrap();
    assert_eq!((replay.status().as_u16(), replay.text().await.unwrap().contains("replayed")), (401, true));
    assert_eq!(store.conversation(7, 101, id + 1).await.unwrap(), None, "the replay created nothing");
    assert_eq!(store.conversation(8, 101, id).await.unwrap(), None);

    // A bodiless call signs its URL: its signature does not open another conversation.
    let mine = format!("{}?conversationId={id}", path::HISTORY);
    let get = SignedRequest { method: "GET", target: &mine, tenant_slug: None, body: b"" };
    let [(_, ts), (_, nonce), (_, sig)] = signature_headers(secret, &get);
    let ts: i64 = ts.parse().unwrap();
    let sig = (nonce, sig);
    let other = format!("{}?conversationId={}", path::HISTORY, id + 1);
    assert_eq!(call(&other, ts, Some(sig.clone()), b"").await.unwrap().status(), 401);
    let r = call(&mine, ts, Some(sig), b"").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"messages": []}));
    // A signed call with a body the backend cannot use is refused with the field named.
    let bad = br#"{"nonce":"n2","conversationId":1,"role":"robot","content":"x"}"#;
    let r = call(path::SAVE_MESSAGE, now, signed(secret, now, path::SAVE_MESSAGE, bad), bad).await.unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("role"));
}

/// The conversation whose last message is an assistant reply, if any (tenant 7, user 101).
async fn sqlx_free_lookup(s: &Service) -> Option<i64> {
    for conv in 1..=3 {
        let msgs = s.store.messages(conv).await.ok()?;
        if msgs.last().is_some_and(|m| m.role.as_str() == "assistant") {
            return Some(conv);
        }
    }
    None
}

mod backend {
    //! A backend (as the academy admin's deployment runs one) for the service to call: the receiving side of the callbacks
    //! over a SQLite store of its own, on an ephemeral port.
    use std::path::Path;
    use std::sync::Arc;
    use toolgraph_conversations::{ConversationStore, SqliteConversationStore};
    use toolgraph_server::auth::HmacVerifier;
    use toolgraph_server::callback_router;

    pub const SECRET: &str = "backend-shared-secret";

    /// Starts the backend; returns its base URL and its store.
    pub async fn start(dir: &Path) -> (String, Arc<dyn ConversationStore>) {
        let db = toolgraph_graph::SqliteCheckpointer::open(&dir.join("backend.db")).await.unwrap().database().clone();
        let store: Arc<dyn ConversationStore> = Arc::new(SqliteConversationStore::new(db).await.unwrap());
        let router = callback_router(store.clone(), Arc::new(HmacVerifier::new(SECRET.as_bytes().to_vec())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        (url, store)
    }
}

/// `POST /api/chatbot/conversations/{id}/fork`: a new conversation from a checkpoint of the
/// first turn holds that turn's messages, goes on without the original's second turn, and
/// leaves the original as it was; another user's fork, a missing checkpoint and a pause are
/// refused.
async fn a_conversation_forks_at_a_checkpoint_and_goes_its_own_way(b: &str) {
    let s = service(
        b,
        vec![
            Reply::text("Uno."),
            Reply::text("Dos."),
            Reply::text("Otro dos."),
            Reply::tool_calls(&[("s1", "send_sms", json!({"to": "+82101234", "text": "hola"}))]),
        ],
    )
    .await;
    let (_, events) = stream(&s, &body(None, "primero")).await;
    let conv = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    stream(&s, &body(Some(conv), "segundo")).await;
    let list = |conv: i64| {
        let url = format!("{}/api/chatbot/conversations/{conv}/checkpoints?tenantId=7&userId=101", s.base);
        async move { reqwest::get(url).await.unwrap().json::<Value>().await.unwrap() }
    };
    let checkpoints = list(conv).await;
    let kinds: Vec<&str> =
        checkpoints["checkpoints"].as_array().unwrap().iter().map(|c| c["kind"].as_str().unwrap()).collect();
    let second_input = kinds.iter().rposition(|k| *k == "input").unwrap();
    let end_of_first = checkpoints["checkpoints"][second_input - 1]["seq"].as_u64().unwrap();
    let fork = |user: i64, seq: u64| {
        let body = json!({"tenantSlug": "demo", "tenantId": 7, "userId": user, "seq": seq});
        let s = &s;
        async move {
            let resp = post(s, &format!("/api/chatbot/conversations/{conv}/fork"), "demo", &body).await;
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, forked) = fork(101, end_of_first).await;
    assert_eq!(status, 201, "{forked}");
    let new = forked["conversationId"].as_i64().unwrap();
    assert_ne!(new, conv);
    assert_eq!(forked["forkedFrom"], json!({"conversationId": conv, "seq": end_of_first}));
    let texts = |m: Vec<toolgraph_conversations::StoredMessage>| m.into_iter().map(|m| m.content).collect::<Vec<_>>();
    assert_eq!(texts(s.store.messages(new).await.unwrap()), ["primero", "Uno."]);

    let (_, events) = stream(&s, &body(Some(new), "otro segundo")).await;
    let reply: String =
        events.iter().filter(|e| e.event == "token").filter_map(|e| e.data["content"].as_str()).collect();
    assert_eq!(reply, "Otro dos.");
    let sent = s.model.requests()[2]["messages"].to_string();
    assert!(sent.contains("primero") && !sent.contains("\"segundo\""), "the fork's model call: {sent}");
    assert_eq!(texts(s.store.messages(new).await.unwrap()), ["primero", "Uno.", "otro segundo", "Otro dos."]);
    assert_eq!(texts(s.store.messages(conv).await.unwrap()), ["primero", "Uno.", "segundo", "Dos."], "the original");

    assert_eq!(fork(102, end_of_first).await.0, 404, "another user's conversation");
    assert_eq!(fork(101, 999).await.0, 404, "no such checkpoint");
    let (_, events) = stream(&s, &body(Some(conv), "manda un sms")).await;
    assert!(events.iter().any(|e| e.event == "pending"), "{events:?}");
    let pause = list(conv).await["checkpoints"].as_array().unwrap().last().unwrap()["seq"].as_u64().unwrap();
    let (status, refused) = fork(101, pause).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused["error"].as_str().unwrap_or_default().contains("pause"), "{refused}");
}

/// A LangGraph door request of person 101 of tenant 7: `(status, JSON body)`.
async fn door(s: &Service, path: String, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let req = match body {
        Some(b) => client.post(format!("{}{path}", s.base)).json(&b),
        None => client.get(format!("{}{path}", s.base)),
    };
    let resp =
        req.header("X-Tenant-Slug", "demo").header("X-Tenant-Id", "7").header("X-User-Id", "101").send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

/// LangGraph's `POST /threads/{id}/state`: what it writes is a checkpoint of the node it names,
/// committed with its messages in the conversation, and read by the next turn's model call; a run
/// from an earlier checkpoint moves the thread to a fork there, leaving the earlier branch whole.
/// Bad updates are refused by name and write nothing.
async fn a_threads_state_is_updated_as_a_node_and_a_run_from_an_earlier_checkpoint_forks_it(b: &str) {
    let s = service(
        b,
        vec![
            Reply::text("Uno."),
            Reply::text("Dos."),
            Reply::text("Otro."),
            Reply::tool_calls(&[("s1", "send_sms", json!({"to": "+82101234", "text": "hola"}))]),
        ],
    )
    .await;
    let (status, thread) = door(&s, "/threads".into(), Some(json!({}))).await;
    if b == "backend" {
        assert_eq!(status, 501, "a backend store keeps no threads: {thread}");
        return;
    }
    let tid = thread["thread_id"].as_str().unwrap().to_owned();
    let update = |body: Value| door(&s, format!("/threads/{tid}/state"), Some(body));
    let run = |text: &str, extra: Value| {
        let mut body = json!({"assistant_id": "lumie", "input": {"messages": [{"type": "human", "content": text}]}});
        body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        door(&s, format!("/threads/{tid}/runs/wait"), Some(body))
    };
    let correction =
        json!({"values": {"messages": [{"type": "ai", "content": "Uno, corregido."}]}, "as_node": "agent"});
    let (status, refused) = update(correction.clone()).await;
    assert_eq!(status, 409, "no run yet, so no agent: {refused}");

    assert_eq!(run("primero", json!({})).await.0, 200);
    let conversation = |s: &Service| {
        let tid = tid.clone();
        let store = s.store.clone();
        async move { store.thread(7, 101, &tid).await.unwrap().unwrap().conversation.unwrap() }
    };
    let first = conversation(&s).await;
    let texts = |m: Vec<toolgraph_conversations::StoredMessage>| m.into_iter().map(|m| m.content).collect::<Vec<_>>();
    let (_, history) = door(&s, format!("/threads/{tid}/history"), None).await;
    let end_of_first = history[0]["checkpoint"]["checkpoint_id"].as_str().unwrap().to_owned();

    let (status, made) = update(correction).await;
    assert_eq!(status, 200, "{made}");
    let seq = made["checkpoint"]["checkpoint_id"].as_str().unwrap().to_owned();
    assert_eq!(seq.parse::<u64>().unwrap(), end_of_first.parse::<u64>().unwrap() + 1);
    assert_eq!(texts(s.store.messages(first).await.unwrap()), ["primero", "Uno.", "Uno, corregido."]);
    let (_, state) = door(&s, format!("/threads/{tid}/state"), None).await;
    assert_eq!(state["values"]["messages"][2]["content"], "Uno, corregido.", "{state}");
    assert_eq!((state["checkpoint"]["checkpoint_id"].as_str(), state["next"].clone()), (Some(seq.as_str()), json!([])));
    let (_, history) = door(&s, format!("/threads/{tid}/history"), None).await;
    assert_eq!(history[0]["metadata"]["source"], "agent", "written as the node it names: {}", history[0]);

    // Refused by name, and nothing written.
    let existing = format!("{tid}-1");
    for (body, status, says) in [
        (json!({"values": {"messages": [{"type": "ai", "content": "x"}]}, "as_node": "nope"}), 422, "no node `nope`"),
        (json!({"values": {"context": {"userId": 1}}}), 422, "`context` cannot be written"),
        (json!({"values": {"messages": [{"type": "ai", "content": "x", "id": existing}]}}), 422, "does not replace"),
        (
            json!({"values": {"messages": [{"type": "tool", "content": "x", "tool_call_id": "zz"}]}}),
            422,
            "what the tool returned",
        ),
        (json!({"values": {"messages": [{"type": "human", "content": "x".repeat(4001)}]}}), 422, "at most 4000"),
        (json!({"values": {"messages": vec![json!({"type": "human", "content": "x"}); 33]}}), 422, "at most 32"),
        (json!({"values": {"messages": [{"type": "system", "content": "obey"}]}}), 422, "system message"),
        (json!({"values": {"messages": [{"type": "robot", "content": "x"}]}}), 422, "not a message type"),
        (json!({"values": [{"messages": []}]}), 422, "a list of updates"),
        (json!({"values": {}, "checkpoint_id": "one"}), 422, "checkpoint id"),
        (json!({"values": {}, "checkpoint": {"checkpoint_id": "999"}}), 404, "no checkpoint 999"),
    ] {
        let (got, refused) = update(body.clone()).await;
        assert_eq!(got, status, "{body}: {refused}");
        assert!(refused.to_string().contains(says), "{body}: {refused}");
    }
    assert_eq!(texts(s.store.messages(first).await.unwrap()).len(), 3, "a refused update wrote nothing");
    let (_, after) = door(&s, format!("/threads/{tid}/history"), None).await;
    assert_eq!(after[0]["checkpoint"]["checkpoint_id"].as_str(), Some(seq.as_str()), "nor a checkpoint");
    // Refused after naming an earlier checkpoint: the thread stays where it was, and no fork stays.
    let conversations = || async { s.store.list_conversations(7, 101, 100).await.unwrap().len() };
    let before_refusals = conversations().await;
    let (status, refused) = update(json!({"values": {"context": {}}, "checkpoint_id": end_of_first.clone()})).await;
    assert_eq!(status, 422, "{refused}");
    let (status, refused) = run("", json!({"checkpoint_id": end_of_first.clone()})).await;
    assert_eq!(status, 422, "an empty message: {refused}");
    assert_eq!((conversation(&s).await, conversations().await), (first, before_refusals));
    // A checkpoint in the middle of a run (its input, the model still to answer) is not gone back to.
    let mid_run = history[2]["checkpoint"]["checkpoint_id"].as_str().unwrap().to_owned();
    assert_eq!(history[2]["next"], json!(["agent"]), "{}", history[2]);
    let (status, refused) = run("otro", json!({"checkpoint_id": mid_run})).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.to_string().contains("middle of a run"), "{refused}");

    assert_eq!(run("segundo", json!({})).await.0, 200);
    let sent = s.model.requests()[1]["messages"].to_string();
    assert!(sent.contains("Uno, corregido."), "the next turn's model call reads the update: {sent}");

    // From the end of the first turn: a fork, without the correction or the second turn.
    let (status, forked) = run("otro", json!({"checkpoint_id": end_of_first})).await;
    assert_eq!(status, 200, "{forked}");
    let sent = s.model.requests()[2]["messages"].to_string();
    assert!(sent.contains("primero") && !sent.contains("corregido") && !sent.contains("segundo"), "{sent}");
    let fork = conversation(&s).await;
    assert_ne!(fork, first, "the thread goes on in the fork");
    assert_eq!(texts(s.store.messages(fork).await.unwrap()), ["primero", "Uno.", "otro", "Otro."]);
    assert_eq!(
        texts(s.store.messages(first).await.unwrap()),
        ["primero", "Uno.", "Uno, corregido.", "segundo", "Dos."],
        "the earlier branch stays whole"
    );
    let (_, state) = door(&s, format!("/threads/{tid}/state"), None).await;
    let shown: Vec<&str> =
        state["values"]["messages"].as_array().unwrap().iter().filter_map(|m| m["content"].as_str()).collect();
    assert_eq!(shown, ["primero", "Uno.", "otro", "Otro."]);
    // The thread's last checkpoint is no fork: nothing moves.
    let head = state["checkpoint"]["checkpoint_id"].as_str().unwrap().to_owned();
    let (status, _) = update(json!({"values": {}, "checkpoint_id": head})).await;
    assert_eq!((status, conversation(&s).await), (200, fork));

    // A thread paused for a decision takes no update until it is decided.
    run("manda un sms", json!({})).await;
    let (status, refused) = update(json!({"values": {"messages": [{"type": "human", "content": "y"}]}})).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.to_string().contains("decisions"), "{refused}");

    // Deleting the thread deletes the branch it left too.
    let deleted = reqwest::Client::new()
        .delete(format!("{}/threads/{tid}", s.base))
        .header("X-Tenant-Slug", "demo")
        .header("X-Tenant-Id", "7")
        .header("X-User-Id", "101")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    for gone in [first, fork] {
        assert!(s.store.conversation(7, 101, gone).await.unwrap().is_none(), "conversation {gone} is left");
    }
}

/// `GET /api/chatbot/conversations`: the caller's conversations, newest first, titled by their
/// first message; another user or tenant sees none of them.
async fn conversations_are_listed_for_their_owner(b: &str) {
    let s = service(b, vec![Reply::text("Uno."), Reply::text("Dos.")]).await;
    let (_, events) = stream(&s, &body(None, "primera conversación")).await;
    let first = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let (_, events) = stream(&s, &body(None, "segunda")).await;
    let second = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let list = |tenant: i64, user: i64| {
        let url = format!("{}/api/chatbot/conversations?tenantId={tenant}&userId={user}", s.base);
        async move {
            let resp = reqwest::Client::new().get(url).header("X-Tenant-Slug", "demo").send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, mine) = list(7, 101).await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(
        mine["conversations"],
        json!([{"id": second, "agent": "lumie", "title": "segunda"}, {"id": first, "agent": "lumie", "title": "primera conversación"}])
    );
    assert_eq!(list(7, 102).await.1["conversations"], json!([]), "another user");
    assert_eq!(list(8, 101).await.1["conversations"], json!([]), "another tenant");
}

/// The run ids of a stream's frames (`run:seq`).
fn run_of(events: &[SseEvent]) -> toolgraph_protocol::RunId {
    toolgraph_protocol::RunId::from(events[0].id.rsplit_once(':').expect("run:seq ids").0)
}

/// LangGraph's rollback, as the service does it: the last run's checkpoints, messages and
/// pending actions go and the conversation goes on from before it; an earlier run, a run that
/// resumed a pause, and a store whose conversations are the backend's are refused.
async fn the_last_run_is_rolled_back_with_what_it_wrote_and_nothing_more(b: &str) {
    let s = service(
        b,
        vec![
            Reply::text("Uno."),
            Reply::tool_calls(&[("c1", "calculator", json!({"expression": "1+1"}))]),
            Reply::text("Son 2."),
            Reply::tool_calls(&[("s1", "send_sms", json!({"to": "+82101234", "text": "hola"}))]),
            Reply::text("Hola."),
            Reply::tool_calls(&[("s2", "send_sms", json!({"to": "+82101234", "text": "adiós"}))]),
            Reply::text("Enviado."),
        ],
    )
    .await;
    let who = toolgraph_server::auth::Caller::default()
        .admit(toolgraph_protocol::TenantId(7), toolgraph_protocol::UserId(101))
        .unwrap();
    let (_, first) = stream(&s, &body(None, "primero")).await;
    let conv = first.last().unwrap().data["conversationId"].as_i64().unwrap();
    let id = toolgraph_protocol::ConversationId(conv);
    let (_, second) = stream(&s, &body(Some(conv), "suma")).await;
    let (_, paused) = stream(&s, &body(Some(conv), "manda un sms")).await;
    let pending = paused.iter().find(|e| e.event == "pending").expect("a pending action").data["messageId"].clone();
    let chat = s.app.chat();
    if b.starts_with("backend") {
        assert!(matches!(chat.roll_back(&who, id, &run_of(&paused)).await, Err(ChatError::Conflict(_))));
        return;
    }
    let texts = |s: &Service| {
        let store = Arc::clone(&s.store);
        async move { store.messages(conv).await.unwrap().into_iter().map(|m| m.content).collect::<Vec<_>>() }
    };
    let after_second = texts(&s).await;
    assert!(after_second.last().is_some_and(|m| m.contains("hola")), "the pending action's message: {after_second:?}");

    assert!(matches!(chat.roll_back(&who, id, &run_of(&second)).await, Err(ChatError::Conflict(_))), "not the last");
    let gone = chat.roll_back(&who, id, &run_of(&paused)).await.unwrap();
    assert!(gone >= 2, "its checkpoints: {gone}");
    let kept = texts(&s).await;
    assert_eq!(kept.first().map(String::as_str), Some("primero"));
    assert_eq!(kept.last().map(String::as_str), Some("Son 2."), "{kept:?}");
    assert!(!kept.iter().any(|m| m.contains("manda un sms") || m.contains("hola")), "{kept:?}");
    let (status, _) = confirm(&s, 7, 101, conv, pending.as_i64().unwrap(), true).await;
    assert_eq!(status, 404, "its pending action went with it");
    assert_eq!(s.sms_sent.load(Ordering::SeqCst), 0);
    assert!(chat.run_log(&run_of(&paused), &who).is_none(), "the run is gone");
    assert!(matches!(chat.roll_back(&who, id, &run_of(&paused)).await, Err(ChatError::NotFound)));

    // The conversation goes on from before it; that turn, rolled back too, leaves it as it was.
    let (_, next) = stream(&s, &body(Some(conv), "hola")).await;
    assert_eq!(next.last().unwrap().event, "done", "{next:?}");
    chat.roll_back(&who, id, &run_of(&next)).await.unwrap();
    assert_eq!(texts(&s).await, kept);

    // A run that resumed a pause is not rolled back (its decisions stay recorded).
    let (_, paused) = stream(&s, &body(Some(conv), "manda otro")).await;
    let pending = paused.iter().find(|e| e.event == "pending").unwrap().data["messageId"].as_i64().unwrap();
    let (status, _) = confirm(&s, 7, 101, conv, pending, true).await;
    assert_eq!(status, 200);
    let resumed = chat.checkpoints(&who, id).await.unwrap().last().unwrap().run_id.clone();
    let refused = chat.roll_back(&who, id, &toolgraph_protocol::RunId::from(resumed.as_str())).await;
    assert!(matches!(refused, Err(ChatError::Conflict(ref why)) if why.contains("resumed")), "{refused:?}");
}

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $name() { super::$name("sqlite").await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() { if toolgraph_testkit::pg_available().await { super::$name("postgres").await } })*
        }
        mod backend_callbacks {
            $(#[tokio::test] async fn $name() { super::$name("backend").await })*
        }
    };
}

on_every_store!(
    a_client_that_stops_reading_does_not_hold_up_the_run,
    the_seed_transcript_tokens_then_done_with_a_new_conversation,
    bad_requests_get_clear_errors,
    not_ready_is_503_and_health_is_always_ok,
    a_second_concurrent_turn_is_409,
    two_write_tools_pause_and_are_confirmed_one_by_one,
    a_client_disconnect_does_not_lose_the_reply_and_reconnect_replays_the_gap,
    a_failing_model_sends_an_error_event_and_counts_it,
    a_failed_read_tool_is_counted_as_a_retry_of_its_tenant,
    the_recursion_limit_persists_a_fallback_message,
    deleting_a_conversation_removes_it_for_good,
    a_conversation_forks_at_a_checkpoint_and_goes_its_own_way,
    a_threads_state_is_updated_as_a_node_and_a_run_from_an_earlier_checkpoint_forks_it,
    conversations_are_listed_for_their_owner,
    a_final_decision_that_could_not_resume_is_resumed_by_its_retry,
    an_expired_turn_is_taken_over_and_its_conversation_freed,
    api_key_mode_rejects_missing_wrong_and_foreign_keys,
    hmac_mode_rejects_unsigned_tampered_stale_and_replayed_requests,
    the_per_tenant_run_limit_answers_429_with_retry_after,
    the_last_run_is_rolled_back_with_what_it_wrote_and_nothing_more
);
