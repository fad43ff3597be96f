//! The crisis companion through the HTTP service: the gate, the node-invoked
//! `find_local_crisis_resources` with provider-native web search (a search provider over real
//! HTTP answering in OpenAI's Responses and Gemini's generateContent shapes), the offline
//! directory when search fails, and the reply.

mod common;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::crisis::{self, ResourceFinder};
use toolgraph_agents::kit::AgentSpec;
use toolgraph_config::{AgentGraph, AgentSettings, CrisisToolSettings, SearchProvider, Secret};
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, ProjectingCheckpointer};
use toolgraph_graph::MemoryCheckpointer;
use toolgraph_llm::{ChatModel, OpenAiChatModel, OpenAiConfig};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};
use toolgraph_tools::ToolRegistry;

/// How the search provider answers.
#[derive(Clone)]
enum Answer {
    Json(Value),
    Status(u16, Value),
    Slow(Duration),
}

/// One request a provider got: path, `Authorization`, `x-goog-api-key`, body.
type Seen = (String, Option<String>, Option<String>, Value);

/// A search provider: records each request and answers.
#[derive(Clone)]
struct Provider {
    answer: Answer,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn start_provider(answer: Answer) -> (String, Provider) {
    let p = Provider { answer, seen: Arc::default() };
    async fn handle(
        State(p): State<Provider>,
        uri: axum::http::Uri,
        headers: HeaderMap,
        body: axum::Json<Value>,
    ) -> (StatusCode, axum::Json<Value>) {
        let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
        p.seen.lock().unwrap().push((uri.path().to_owned(), header("authorization"), header("x-goog-api-key"), body.0));
        match p.answer.clone() {
            Answer::Json(v) => (StatusCode::OK, axum::Json(v)),
            Answer::Status(code, v) => (StatusCode::from_u16(code).unwrap(), axum::Json(v)),
            Answer::Slow(d) => {
                tokio::time::sleep(d).await;
                (StatusCode::OK, axum::Json(json!({})))
            }
        }
    }
    let app = axum::Router::new().fallback(axum::routing::post(handle)).with_state(p.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, p)
}

/// OpenAI's Responses API answer with web search: a `web_search_call`, then a message whose
/// text cites pages with `url_citation` annotations.
fn openai_answer(text: &str) -> Value {
    json!({
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4.1-mini",
        "output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed",
             "action": {"type": "search", "query": "crisis hotline Singapore"}},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": text,
                          "annotations": [{"type": "url_citation", "start_index": 0, "end_index": 10,
                                           "url": "https://www.sos.org.sg/", "title": "Samaritans of Singapore"}]}]}
        ]
    })
}

/// Gemini's generateContent answer with Google Search grounding.
fn gemini_answer(text: &str) -> Value {
    json!({
        "candidates": [{
            "content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP",
            "groundingMetadata": {
                "webSearchQueries": ["crisis helpline UK"],
                "searchEntryPoint": {"renderedContent": "<div></div>"},
                "groundingChunks": [{"web": {"uri": "https://vertexaisearch.cloud.google.com/grounding-api-redirect/abc", "title": "samaritans.org"}}],
                "groundingSupports": [{"segment": {"startIndex": 0, "endIndex": 20, "text": "Samaritans"}, "groundingChunkIndices": [0]}]
            }
        }],
        "modelVersion": "gemini-2.5-flash"
    })
}

struct Service {
    base: String,
    model: ScriptedModelServer,
    store: Arc<MemoryConversationStore>,
}

/// The companion with the finder `settings` describe (the scripted model reads locations).
async fn start(settings: CrisisToolSettings, script: Vec<Reply>) -> Service {
    let model = ScriptedModelServer::start(script).await.unwrap();
    let llm: Arc<dyn ChatModel> =
        Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let finder = ResourceFinder::from_settings(&settings, Some(Arc::clone(&llm))).unwrap();
    let mut tools = ToolRegistry::new();
    tools.register(crisis::find_local_crisis_resources_tool(Arc::new(finder))).unwrap();
    let store = Arc::new(MemoryConversationStore::new());
    let ckpt = Arc::new(ProjectingCheckpointer::forwarding(
        MemoryCheckpointer::new(),
        store.clone(),
        toolgraph_agents::conversation::project,
    ));
    let spec = AgentSpec::new("companion", "You are a kind companion.", tools);
    let graph = crisis::graph::build(spec, llm, ckpt.clone()).unwrap();
    let settings = AgentSettings { graph: AgentGraph::CrisisCompanion, ..AgentSettings::default() };
    let agents = BTreeMap::from([("companion".to_string(), ServedAgent::new(GraphAgent::new(graph), settings))]);
    let app =
        AppState::new(ChatService::new(agents, "companion".into(), store.clone(), ckpt, ServiceOptions::default()));
    app.set_ready();
    Service { base: common::serve(app).await, model, store }
}

fn search(provider: SearchProvider, base: &str, timeout_ms: u64) -> CrisisToolSettings {
    CrisisToolSettings {
        search_provider: provider,
        search_base_url: Some(base.to_owned()),
        search_model: Some("search-model".into()),
        search_api_key: Some(Secret::new("sk-test-123456")),
        search_timeout_ms: timeout_ms,
        directory: None,
    }
}

async fn turn(s: &Service, message: &str) -> Vec<common::SseEvent> {
    let body = json!({"tenantSlug": "t", "tenantId": 1, "userId": 2, "conversationId": null,
                      "message": message, "toolEvents": true});
    let events = common::parse_sse(&common::stream_text(&s.base, "t", &body).await);
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"), "{events:?}");
    events
}

fn tokens(events: &[common::SseEvent]) -> String {
    events.iter().filter(|e| e.event == "token").map(|e| e.data["content"].as_str().unwrap_or_default()).collect()
}

/// The finder's result in a turn (it ran once), or `None` when it did not run.
fn found(events: &[common::SseEvent]) -> Option<Value> {
    let results: Vec<&common::SseEvent> = events.iter().filter(|e| e.event == "tool_result").collect();
    assert!(results.len() <= 1, "{results:?}");
    results.first().map(|e| e.data["outcome"].clone())
}

/// The system prompt of the model's request `i`.
fn system_prompt(s: &Service, i: usize) -> String {
    s.model.requests()[i]["messages"][0]["content"].as_str().unwrap_or_default().to_owned()
}

const AT_RISK: &str = "I'm in Singapore and I want to end my life.";

fn risk_script(reply: Reply) -> Vec<Reply> {
    vec![
        Reply::text(r#"{"risk": "imminent", "reason": "wants to end their life"}"#),
        Reply::text(r#"{"location": "Singapore"}"#),
        reply,
    ]
}

#[tokio::test]
async fn an_ordinary_turn_costs_one_model_call_and_no_tool() {
    let s = start(CrisisToolSettings::default(), vec![Reply::text("Water it once a week.")]).await;
    let events = turn(&s, "How do I keep a basil plant alive?").await;
    assert_eq!(tokens(&events), "Water it once a week.");
    assert_eq!(s.model.request_count(), 1, "the keyword filter let it through without a verdict call");
    assert!(found(&events).is_none());
    assert!(!system_prompt(&s, 0).contains("at risk"));
    let id = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    assert_eq!(s.store.messages(id).await.unwrap().last().unwrap().content, "Water it once a week.");
}

#[tokio::test]
async fn risk_found_through_openai_web_search_reaches_the_reply() {
    let text = "Samaritans of Singapore | 1767 | https://www.sos.org.sg | Singapore\n\
                Institute of Mental Health | 6389 2222 | https://www.imh.com.sg | Singapore";
    let (base, provider) = start_provider(Answer::Json(openai_answer(text))).await;
    let s =
        start(search(SearchProvider::Openai, &base, 5_000), risk_script(Reply::text("I'm so glad you told me."))).await;
    let events = turn(&s, AT_RISK).await;

    // The gate asked for a JSON-Schema verdict, deterministically.
    let verdict_request = &s.model.requests()[0];
    assert_eq!(verdict_request["response_format"]["json_schema"]["name"], "crisis_verdict");
    assert_eq!(verdict_request["temperature"], 0.0);

    // The provider got a Responses API request with its web_search tool, and the location.
    let seen = provider.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (path, auth, _, body) = &seen[0];
    assert_eq!(path, "/responses");
    assert_eq!(auth.as_deref(), Some("Bearer sk-test-123456"));
    assert_eq!(body["tools"], json!([{"type": "web_search"}]));
    assert_eq!(body["model"], "search-model");
    assert!(body["input"].as_str().unwrap().contains("in Singapore"), "{body}");

    let found = found(&events).expect("the finder ran");
    assert_eq!(found["inferred_location"], "Singapore");
    assert_eq!(found["source"], "web_search");
    assert_eq!(
        found["found_resources"][0],
        json!({"name": "Samaritans of Singapore", "phone": "1767", "url": "https://www.sos.org.sg", "region": "Singapore"})
    );
    assert_eq!(found["found_resources"].as_array().unwrap().len(), 2);

    // The reply's instructions carry the resources; the reply is streamed and stored.
    let prompt = system_prompt(&s, 2);
    assert!(prompt.contains("Samaritans of Singapore — 1767 — https://www.sos.org.sg"), "{prompt}");
    // The model named no line, so they follow its words.
    let reply = tokens(&events);
    assert!(reply.starts_with("I'm so glad you told me.\n\n- Samaritans of Singapore — 1767"), "{reply}");
    let id = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    assert_eq!(s.store.messages(id).await.unwrap().last().unwrap().content, reply);
}

/// The `toolgraph_llm_call_seconds` count of agent `companion`.
async fn model_calls_timed(s: &Service) -> u64 {
    let text = reqwest::get(format!("{}/metrics", s.base)).await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.starts_with("toolgraph_llm_call_seconds_count{agent=\"companion\"}"));
    line.and_then(|l| l.rsplit(' ').next()).map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn every_model_call_is_timed_whichever_node_makes_it() {
    let mut script = risk_script(Reply::text("Please call SOS at 1767 now."));
    script.push(Reply::text("Water it once a week."));
    let s = start(CrisisToolSettings::default(), script).await;
    let events = turn(&s, AT_RISK).await;
    // The gate's verdict and the reply are the graph's model calls (the location is read inside
    // the finder tool, timed as that tool).
    assert_eq!(s.model.request_count(), 3);
    assert_eq!(model_calls_timed(&s).await, 2);
    // All three count in the turn's tokens, the finder's too.
    let id = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let used = s.store.conversation_usage(id).await.unwrap();
    assert_eq!(used.iter().map(|u| u.calls).sum::<u32>(), 3, "{used:?}");
    turn(&s, "How do I keep a basil plant alive?").await;
    assert_eq!(model_calls_timed(&s).await, 3, "an ordinary turn: the reply only");
}

#[tokio::test]
async fn a_reply_that_gives_the_lines_itself_is_left_as_it_is() {
    let s = start(CrisisToolSettings::default(), risk_script(Reply::text("Please call SOS at 1767 now."))).await;
    let events = turn(&s, AT_RISK).await;
    assert_eq!(tokens(&events), "Please call SOS at 1767 now.");
}

#[tokio::test]
async fn gemini_google_search_grounding_is_used_the_same_way() {
    let text = "- **Samaritans**: 116 123 (https://www.samaritans.org)\n- **Shout**: text 85258";
    let (base, provider) = start_provider(Answer::Json(gemini_answer(text))).await;
    let script = vec![
        Reply::text(r#"{"risk": "possible", "reason": "talks of wanting to die"}"#),
        Reply::text(r#"{"location": "UK"}"#),
        Reply::text("You matter."),
    ];
    let s = start(search(SearchProvider::Gemini, &base, 5_000), script).await;
    let events = turn(&s, "I live in London and lately I want to die").await;
    let seen = provider.seen.lock().unwrap().clone();
    let (path, _, key, body) = &seen[0];
    assert_eq!(path, "/models/search-model:generateContent");
    assert_eq!(key.as_deref(), Some("sk-test-123456"));
    assert_eq!(body["tools"], json!([{"google_search": {}}]));
    assert!(body["contents"][0]["parts"][0]["text"].as_str().unwrap().contains("in UK"), "{body}");
    let found = found(&events).unwrap();
    assert_eq!(found["source"], "web_search");
    let names: Vec<&str> =
        found["found_resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["Samaritans", "Shout"]);
    assert_eq!(found["found_resources"][1]["phone"], "85258");
}

/// Each way the web search can fail gives the offline directory's lines, and a warning.
#[tokio::test]
async fn without_grounding_the_offline_directory_answers() {
    let unsupported = json!({"error": {"message": "Tool 'web_search' is not supported with this model.", "type": "invalid_request_error"}});
    let cases = [
        ("no grounding support", Answer::Status(400, unsupported), "400"),
        ("a timeout", Answer::Slow(Duration::from_secs(5)), "search request failed"),
        ("an answer with no resource", Answer::Json(openai_answer("I could not find anything.")), "listed no resource"),
    ];
    for (what, answer, warning) in cases {
        let (base, _provider) = start_provider(answer).await;
        let s = start(search(SearchProvider::Openai, &base, 400), risk_script(Reply::text("Please call."))).await;
        let events = turn(&s, AT_RISK).await;
        let found = found(&events).unwrap();
        assert_eq!(found["source"], "directory", "{what}: {found}");
        assert!(found["warning"].as_str().unwrap().contains(warning), "{what}: {found}");
        assert!(!found["warning"].as_str().unwrap().contains("sk-test-123456"), "{what}: the key leaked");
        assert_eq!(found["found_resources"][0]["phone"], "1767", "{what}: {found}");
        assert!(system_prompt(&s, 2).contains("1767"), "{what}");
        assert!(tokens(&events).contains("1767"), "{what}");
    }
    // No provider configured at all: the directory, without a warning.
    let s = start(CrisisToolSettings::default(), risk_script(Reply::text("Please call."))).await;
    let found = found(&turn(&s, AT_RISK).await).unwrap();
    assert_eq!(found["source"], "directory");
    assert!(found.get("warning").is_none(), "{found}");
}

#[tokio::test]
async fn a_person_at_risk_gets_the_resources_even_when_the_model_fails() {
    // The verdict call fails too: the gate errs on the side of the person.
    let script = vec![
        Reply::status(400, r#"{"error":{"message":"bad request"}}"#),
        Reply::text(r#"{"location": "Singapore"}"#),
        Reply::status(400, r#"{"error":{"message":"bad request"}}"#),
    ];
    let s = start(CrisisToolSettings::default(), script).await;
    let events = turn(&s, AT_RISK).await;
    let reply = tokens(&events);
    assert!(reply.contains("1767") && reply.contains("Samaritans of Singapore"), "{reply}");
    let id = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    assert_eq!(s.store.messages(id).await.unwrap().last().unwrap().content, reply);
}

#[tokio::test]
async fn a_false_alarm_from_the_keywords_is_cleared_by_the_verdict() {
    let script = vec![
        Reply::text(r#"{"risk": "none", "reason": "asks about a novel"}"#),
        Reply::text("The novel deals with grief."),
    ];
    let s = start(CrisisToolSettings::default(), script).await;
    let events = turn(&s, "Why does the character in the novel talk about suicide?").await;
    assert!(found(&events).is_none(), "no resources for a question about a book");
    assert_eq!(s.model.request_count(), 2);
    assert_eq!(tokens(&events), "The novel deals with grief.");
}
