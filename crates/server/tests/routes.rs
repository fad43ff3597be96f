//! The academy contract's routes without a socket (axum's `oneshot`): who is asking is read from
//! the query, the path or the body and admitted once against the caller's key
//! (docs/reliability.md), and every reading of the ids the handler acts on is the one admitted —
//! percent-encoded names, a name given twice, a path's id. The service behind is real (memory
//! stores, an agent whose model nothing answers: no test here starts a turn).

use axum::body::Body;
use axum::http::{Method, Request};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::{ConversationStore, MemoryConversationStore};
use toolgraph_graph::{Checkpointer, MemoryCheckpointer};
use toolgraph_server::auth::{Auth, hash_api_key};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};
use tower::ServiceExt;

/// The key of tenant `demo`, bound to tenant id 7.
const KEY: &str = "k-demo";

/// The routes over a service whose key of `demo` opens tenant 7 only, and its store (holding
/// one conversation of tenant 7's user 1 and one of tenant 8's user 1).
async fn app() -> (axum::Router, Arc<MemoryConversationStore>, i64, i64) {
    let config = toolgraph_llm::OpenAiConfig::new("http://127.0.0.1:9/v1", "nobody");
    // A well-formed address: `OpenAiChatModel::new` only fails on a malformed one.
    let llm = Arc::new(toolgraph_llm::OpenAiChatModel::new(config).expect("a well-formed address"));
    let ckpt: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let spec = AgentSpec::new("tutor", "You are the tutor.", toolgraph_tools::ToolRegistry::new());
    let graph = toolgraph_agents::react::build(spec, llm, Arc::clone(&ckpt)).expect("the ReAct graph builds");
    let agents =
        BTreeMap::from([("tutor".to_owned(), ServedAgent::new(GraphAgent::new(graph), AgentSettings::default()))]);
    let auth = Auth::api_keys([(&"demo".to_owned(), &hash_api_key(KEY))])
        .and_then(|a| a.bind_tenant_ids([(&"demo".to_owned(), &7)]))
        .expect("a key bound to tenant 7");
    let options = ServiceOptions { auth, ..ServiceOptions::default() };
    let store = Arc::new(MemoryConversationStore::new());
    let own = store.create_conversation(7, 1, "tutor").await.expect("a conversation");
    let other = store.create_conversation(8, 1, "tutor").await.expect("a conversation");
    let shared: Arc<dyn ConversationStore> = store.clone();
    let state = AppState::new(ChatService::new(agents, "tutor".into(), shared, ckpt, options));
    state.set_ready();
    (toolgraph_server::router(state), store, own, other)
}

/// `method path` with the key of `demo` (or `key`), and `body`: the status and the JSON answer.
async fn send(router: &axum::Router, method: Method, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("x-tenant-slug", "demo")
        .header("authorization", format!("Bearer {key}"));
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let resp = router.clone().oneshot(req.body(body).expect("a request")).await.expect("an answer");
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("a body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn get(router: &axum::Router, path: &str) -> (u16, Value) {
    send(router, Method::GET, path, KEY, None).await
}

#[tokio::test]
async fn a_query_names_who_asks_and_only_the_keys_tenant_is_admitted() {
    let (router, _, own, other) = app().await;
    let (status, body) = get(&router, "/api/chatbot/conversations?tenantId=7&userId=1").await;
    assert_eq!(status, 200, "{body}");
    let listed: Vec<i64> =
        body["conversations"].as_array().expect("a list").iter().filter_map(|c| c["id"].as_i64()).collect();
    assert_eq!(listed, [own], "the key's tenant's conversations only");
    // Another tenant, however the name or the number is written.
    for path in [
        "/api/chatbot/conversations?tenantId=8&userId=1",
        "/api/chatbot/conversations?tenant%49d=8&userId=1",
        "/api/chatbot/conversations?tenantId=%38&userId=1",
        "/api/chatbot/conversations?userId=1&tenantId=8",
        &format!("/api/chatbot/conversations/{other}/checkpoints?tenantId=8&userId=1"),
        &format!("/api/chatbot/conversations/{other}/checkpoints/1?tenantId=8&userId=1"),
        "/api/chatbot/runs/some-run/events?tenantId=8&userId=1",
    ] {
        let (status, body) = get(&router, path).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| e.contains("opens tenant id 7 only")), "{path}: {body}");
    }
    // A name given twice is refused, not read one way by the check and another by the handler.
    for path in [
        "/api/chatbot/conversations?tenantId=7&tenantId=8&userId=1",
        "/api/chatbot/conversations?tenantId=seven&userId=1",
        "/api/chatbot/conversations?tenantId=7",
    ] {
        let (status, body) = get(&router, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    // The key's own tenant: another person's conversation is not found, whoever's it is.
    let (status, _) = get(&router, &format!("/api/chatbot/conversations/{own}/checkpoints?tenantId=7&userId=2")).await;
    assert_eq!(status, 404);
    let (status, body) =
        get(&router, &format!("/api/chatbot/conversations/{own}/checkpoints?tenantId=7&userId=1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "conversationId": own, "checkpoints": [] }));
    let (status, _) = get(&router, "/api/chatbot/runs/some-run/events?tenantId=7&userId=1").await;
    assert_eq!(status, 404, "no run of theirs has that id");
}

#[tokio::test]
async fn deletions_name_their_tenant_in_the_path_or_query_and_are_admitted_on_it() {
    let (router, store, own, other) = app().await;
    let delete = |path: String| {
        let router = router.clone();
        async move { send(&router, Method::DELETE, &path, KEY, None).await }
    };
    assert_eq!(delete("/api/chatbot/tenants/8".into()).await.0, 403);
    assert_eq!(delete("/api/chatbot/users/1?tenantId=8".into()).await.0, 403);
    assert_eq!(delete(format!("/api/chatbot/conversations/{other}?tenantId=8&userId=1")).await.0, 403);
    assert_eq!(delete("/api/chatbot/tenants/x".into()).await.0, 400, "a path id that is not a number");
    assert!(store.conversation(8, 1, other).await.expect("the store answers").is_some(), "tenant 8's is untouched");
    // The wrong key is refused before anything is read.
    assert_eq!(send(&router, Method::DELETE, "/api/chatbot/tenants/7", "k-wrong", None).await.0, 401);
    assert!(store.conversation(7, 1, own).await.expect("the store answers").is_some());
    let (status, body) = delete("/api/chatbot/users/1?tenantId=7".into()).await;
    assert_eq!((status, body), (200, json!({ "deletedConversations": 1 })));
    assert!(store.conversation(7, 1, own).await.expect("the store answers").is_none());
    let (status, body) = delete("/api/chatbot/tenants/7".into()).await;
    assert_eq!((status, body), (200, json!({ "deletedConversations": 0 })));
}

#[tokio::test]
async fn a_body_names_who_asks_and_is_admitted_before_anything_runs() {
    let (router, store, own, other) = app().await;
    // Another tenant in the body of each body-scoped route: 403, and nothing changes.
    let bodies = [
        (
            "/api/chatbot/stream".to_owned(),
            json!({ "tenantSlug": "demo", "tenantId": 8, "userId": 1, "message": "hola" }),
        ),
        (
            "/api/chatbot/confirm".to_owned(),
            json!({ "tenantSlug": "demo", "tenantId": 8, "userId": 1, "conversationId": other, "messageId": 1, "confirmed": true }),
        ),
        (
            format!("/api/chatbot/conversations/{other}/fork"),
            json!({ "tenantSlug": "demo", "tenantId": 8, "userId": 1, "seq": 1 }),
        ),
    ];
    for (path, body) in bodies {
        let (status, answer) = send(&router, Method::POST, &path, KEY, Some(body)).await;
        assert_eq!(status, 403, "{path}: {answer}");
    }
    assert_eq!(store.list_conversations(8, 1, 10).await.expect("the store answers").len(), 1, "no fork was made");
    // The key's tenant, a conversation that is not the person's: not found.
    let fork = json!({ "tenantSlug": "demo", "tenantId": 7, "userId": 2, "seq": 1 });
    let (status, _) =
        send(&router, Method::POST, &format!("/api/chatbot/conversations/{own}/fork"), KEY, Some(fork)).await;
    assert_eq!(status, 404);
    // An id of the wrong type is named.
    let bad = json!({ "tenantSlug": "demo", "tenantId": "7", "userId": 1, "message": "hola" });
    let (status, answer) = send(&router, Method::POST, "/api/chatbot/stream", KEY, Some(bad)).await;
    assert_eq!((status, answer["field"].as_str()), (422, Some("tenantId")), "{answer}");
}

#[tokio::test]
async fn the_agents_route_lists_each_agent_with_its_version() {
    let (router, ..) = app().await;
    let (status, body) = get(&router, "/api/chatbot/agents").await;
    assert_eq!(status, 200);
    assert_eq!(body["defaultAgent"], "tutor");
    let agents = body["agents"].as_array().expect("a list");
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0]["name"], "tutor");
    assert!(agents[0]["version"].is_string(), "the built-in ReAct graph is a declaration with a digest: {body}");
    assert!(agents[0].get("refused").is_none(), "{body}");
}
