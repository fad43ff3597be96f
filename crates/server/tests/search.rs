//! `POST /search` (the course tutor's retrieval contract) and the `rag_search` tool inside a chat turn: a
//! real listener, real knowledge bases on disk, the scripted model over HTTP.

mod common;

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::react;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::{MemoryConversationStore, ProjectingCheckpointer};
use toolgraph_graph::MemoryCheckpointer;
use toolgraph_llm::{OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::{IngestOptions, KbStore, NoProgress, ingest};
use toolgraph_server::{AppState, ChatService, SearchService, ServedAgent, ServiceOptions};
use toolgraph_tools::ToolRegistry;

struct Service {
    base: String,
    app: AppState,
    model: ScriptedModelServer,
    store: Arc<MemoryConversationStore>,
    _dir: tempfile::TempDir,
}

fn write(dir: &Path, rel: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

async fn start(options: ServiceOptions, ready: bool, script: Vec<Reply>) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let kb = Arc::new(KbStore::new(dir.path().join("kb")));
    let iv = write(
        dir.path(),
        "src/iv/guia.md",
        "---\nasignatura: iv\ntipo_documento: guia\n---\n# Guía IV\n## Evaluación\nEl examen final de IV es en enero y vale el 40%.\n",
    );
    let dai = write(
        dir.path(),
        "src/dai/guia.md",
        "---\nasignatura: dai\ntipo_documento: guia\n---\n# Guía DAI\n## Evaluación\nEl examen final de DAI es en junio.\n",
    );
    ingest(&kb, "ugr", "cursos", &[iv, dai], &IngestOptions::default(), &NoProgress).unwrap();
    let other = write(dir.path(), "src/other/secret.md", "# Secreto\nEl examen final secreto de otra academia.\n");
    ingest(&kb, "academia", "cursos", &[other], &IngestOptions::default(), &NoProgress).unwrap();
    let law = write(
        dir.path(),
        "src/leyes/trafico.md",
        "# Ley de Tráfico\n## Artículo 5\nEl examen final de conducir es práctico.\n",
    );
    ingest(&kb, "ugr", "leyes", &[law], &IngestOptions::default(), &NoProgress).unwrap();

    let model = ScriptedModelServer::start(script).await.unwrap();
    let llm = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let mut tools = ToolRegistry::new();
    tools
        .register(toolgraph_agents::course::rag_search_tool(
            kb.clone(),
            Default::default(),
            "nobody".into(),
            "cursos".into(),
            None,
        ))
        .unwrap();
    let store = Arc::new(MemoryConversationStore::new());
    let ckpt = Arc::new(ProjectingCheckpointer::forwarding(
        MemoryCheckpointer::new(),
        store.clone(),
        toolgraph_agents::conversation::project,
    ));
    let mut spec = AgentSpec::new("tutor", "Cite sources.", tools);
    // As `toolgraph serve` builds agents with `cite_sources` (the default).
    spec.answer_footer = Some(Arc::new(toolgraph_rag::search::citation::sources_footer));
    // A second agent on the same tools that searches its own knowledge base (`[agents.NAME] kb`).
    let mut jurist = spec.clone();
    jurist.name = "jurista".into();
    jurist.tool_context.insert("kb".into(), json!("leyes"));
    let jurist = react::build(jurist, llm.clone(), ckpt.clone()).unwrap();
    let graph = react::build(spec, llm, ckpt.clone()).unwrap();
    let settings = AgentSettings { state_keys: vec!["asignatura".into()], ..AgentSettings::default() };
    let agents = BTreeMap::from([
        ("tutor".to_string(), ServedAgent::new(GraphAgent::new(graph), settings.clone())),
        ("jurista".to_string(), ServedAgent::new(GraphAgent::new(jurist), settings)),
    ]);
    let app = AppState::new(ChatService::new(agents, "tutor".into(), store.clone(), ckpt, options));
    app.enable_search(SearchService { store: kb, default_kb: "cursos".into(), retriever: Default::default() });
    if ready {
        app.set_ready();
    }
    let base = common::serve(app.clone()).await;
    Service { base, app, model, store, _dir: dir }
}

async fn search(s: &Service, slug: Option<&str>, body: &str) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/search", s.base))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(slug) = slug {
        req = req.header("X-Tenant-Slug", slug);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn search_answers_the_seed_shape_scoped_to_the_tenant() {
    let s = start(ServiceOptions::default(), true, vec![]).await;
    let (status, body) =
        search(&s, Some("ugr"), r#"{"query": "¿Cuándo es el examen final?", "asignatura": "iv", "top_k": 3}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["query"], "¿Cuándo es el examen final?");
    assert_eq!(body["total_results"], 1, "the asignatura filter keeps DAI out: {body}");
    let r = &body["results"][0];
    assert!(r["content"].as_str().unwrap().contains("enero"));
    assert_eq!(r["metadata"]["asignatura"], "iv");
    assert_eq!(r["metadata"]["citation"], "Guía IV › Evaluación");
    assert!(r["score"].as_f64().unwrap() > 0.0);
    assert!(r["ranks"]["bm25"]["rank"].is_u64(), "POST /search shows each list's rank: {r}");

    let (_, both) = search(&s, Some("ugr"), r#"{"query": "examen final", "tipo_documento": "guia"}"#).await;
    assert_eq!(both["total_results"], 2);
    assert!(!both.to_string().contains("secreto"), "another tenant's chunks never appear");

    // The other tenant sees only its own knowledge base under the same name.
    let (_, other) = search(&s, Some("academia"), r#"{"query": "examen final"}"#).await;
    assert_eq!(other["total_results"], 1);
    assert!(other["results"][0]["content"].as_str().unwrap().contains("secreto"));
}

#[tokio::test]
async fn search_errors_have_the_seed_error_shape() {
    let s = start(ServiceOptions::default(), true, vec![]).await;
    let cases: [(Option<&str>, &str, u16, &str); 7] = [
        (None, r#"{"query": "x"}"#, 400, "X-Tenant-Slug"),
        (Some("ugr"), r#"{"query": "#, 400, "malformed JSON"),
        (Some("ugr"), r#"{"query": "x", "top_k": "five"}"#, 422, "top_k"),
        (Some("ugr"), r#"{"query": "", "top_k": 3}"#, 400, "query must not be empty"),
        (Some("ugr"), r#"{"query": "x", "top_k": 500}"#, 400, "top_k must be between 1 and 50"),
        (Some("ugr"), r#"{"query": "x", "kb": "missing"}"#, 404, "no knowledge base `missing`"),
        (Some("nobody"), r#"{"query": "examen"}"#, 404, "for tenant `nobody`"),
    ];
    for (slug, body, status, text) in cases {
        let (got, resp) = search(&s, slug, body).await;
        assert_eq!(got, status, "{body}: {resp}");
        assert_eq!(resp["ok"], false, "{body}: {resp}");
        assert!(resp["error"].as_str().unwrap().contains(text), "{body}: {resp}");
    }
    let not_ready = start(ServiceOptions::default(), false, vec![]).await;
    let (status, resp) = search(&not_ready, Some("ugr"), r#"{"query": "examen"}"#).await;
    assert_eq!((status, resp["ok"].clone()), (503, json!(false)));
    drop(s.app);
}

#[tokio::test]
async fn api_key_mode_guards_search_too() {
    let options = ServiceOptions {
        auth: toolgraph_server::auth::Auth::api_keys(&BTreeMap::from([(
            "ugr".to_string(),
            toolgraph_server::auth::hash_api_key("k-ugr"),
        )]))
        .unwrap(),
        ..ServiceOptions::default()
    };
    let s = start(options, true, vec![]).await;
    let (status, _) = search(&s, Some("ugr"), r#"{"query": "examen"}"#).await;
    assert_eq!(status, 401);
    let resp = reqwest::Client::new()
        .post(format!("{}/search", s.base))
        .header("X-Tenant-Slug", "ugr")
        .header("Authorization", "Bearer k-ugr")
        .json(&json!({"query": "examen"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test]
async fn rag_search_in_a_turn_reads_the_callers_tenant_and_injected_subject() {
    let script = vec![
        Reply::tool_calls(&[("c1", "rag_search", json!({"query": "examen final"}))]),
        Reply::text("El examen final es en enero [Guía IV › Evaluación]."),
    ];
    let s = start(ServiceOptions::default(), true, script).await;
    let body = json!({"tenantSlug": "ugr", "tenantId": 1, "userId": 2, "conversationId": null,
                      "message": "¿Cuándo es el examen?", "context": {"asignatura": "iv"}, "toolEvents": true});
    let resp = reqwest::Client::new()
        .post(format!("{}/api/chatbot/stream", s.base))
        .header("X-Tenant-Slug", "ugr")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: done"), "{text}");
    // `toolEvents: true`: the call and its outcome stream before the answer's tokens.
    let events = common::parse_sse(&text);
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(&names[..2], ["tool_call", "tool_result"], "{names:?}");
    assert_eq!(names.last(), Some(&"done"));
    assert!(names[2..names.len() - 1].iter().all(|n| *n == "token"), "{names:?}");
    assert_eq!(events[0].data["name"], "rag_search");
    assert_eq!(events[0].data["arguments"]["query"], "examen final");
    assert_eq!(events[1].data["callId"], events[0].data["callId"]);
    assert_eq!(events[1].data["ok"], true);
    assert_eq!(events[1].data["outcome"]["results"][0]["metadata"]["citation"], "Guía IV › Evaluación");
    // The model's second request carries the tool result: the tenant's IV guide only.
    let requests = s.model.requests();
    let tool_msg = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("a tool message")
        .clone();
    let result: Value = serde_json::from_str(tool_msg["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["total_results"], 1, "asignatura=iv was injected from the context: {result}");
    assert_eq!(result["results"][0]["metadata"]["citation"], "Guía IV › Evaluación");
    // It reads the contract's fields, not the retrieval view's ranks, and a short score.
    let read = &result["results"][0];
    assert!(read.get("ranks").is_none(), "{read}");
    let score = read["score"].as_f64().unwrap();
    assert!(score > 0.0 && (score * 1e4 - (score * 1e4).round()).abs() < 1e-6, "{read}");
    assert_eq!(events[1].data["outcome"]["results"][0]["score"], read["score"], "the client sees what the model read");
    // The model never saw `asignatura` as a parameter it could set.
    let function = &requests[0]["tools"][0]["function"];
    assert_eq!(function["name"], "rag_search");
    assert!(function["parameters"]["properties"].get("asignatura").is_none(), "{function}");
    assert!(!function.to_string().contains("asignatura"), "{function}");
}

/// An answer that uses the search results without naming them gets their citations appended,
/// streamed as a last `token` and kept in the stored assistant message.
#[tokio::test]
async fn an_answer_that_cites_nothing_gets_its_sources_appended() {
    let script = vec![
        Reply::tool_calls(&[("c1", "rag_search", json!({"query": "examen final"}))]),
        Reply::text("El examen final es en enero."),
    ];
    let s = start(ServiceOptions::default(), true, script).await;
    let body = json!({"tenantSlug": "ugr", "tenantId": 1, "userId": 2, "conversationId": null,
                      "message": "¿Cuándo es el examen?", "context": {"asignatura": "iv"}});
    let text = common::stream_text(&s.base, "ugr", &body).await;
    let events = common::parse_sse(&text);
    let tokens: String =
        events.iter().filter(|e| e.event == "token").map(|e| e.data["content"].as_str().unwrap()).collect();
    assert_eq!(tokens, "El examen final es en enero.\n\n[Guía IV › Evaluación]", "{text}");
    let done = &events.iter().find(|e| e.event == "done").unwrap().data;
    use toolgraph_conversations::ConversationStore;
    let stored = s.store.messages(done["conversationId"].as_i64().unwrap()).await.unwrap();
    assert_eq!(stored.last().unwrap().content, "El examen final es en enero.\n\n[Guía IV › Evaluación]");
}

/// Two agents of one service, each searching its own knowledge base with the same tool.
#[tokio::test]
async fn each_agent_searches_its_own_knowledge_base() {
    let search = || Reply::tool_calls(&[("c1", "rag_search", json!({"query": "examen final"}))]);
    let script = vec![search(), Reply::text("Es práctico."), search(), Reply::text("En enero.")];
    let s = start(ServiceOptions::default(), true, script).await;
    let mut citations = Vec::new();
    // `agentId` is the alias of `agent`.
    for (field, agent) in [("agent", "jurista"), ("agentId", "tutor")] {
        let mut body = json!({"tenantSlug": "ugr", "tenantId": 1, "userId": 2, "conversationId": null,
                          "message": "¿Cómo es el examen final?", "toolEvents": true});
        body[field] = json!(agent);
        let events = common::parse_sse(&common::stream_text(&s.base, "ugr", &body).await);
        let result = events.iter().find(|e| e.event == "tool_result").expect("a tool result");
        assert_eq!(result.data["ok"], true, "{agent}: {:?}", result.data);
        let found: Vec<String> = result.data["outcome"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["metadata"]["citation"].as_str().unwrap_or_default().to_owned())
            .collect();
        citations.push(found);
    }
    assert_eq!(citations[0], ["Artículo 5, Ley de Tráfico"], "the jurist reads `leyes` only");
    assert!(!citations[1].is_empty(), "the tutor reads `cursos`");
    assert!(citations[1].iter().all(|c| c.starts_with("Guía")), "{:?}", citations[1]);
}
