//! The academy contract's routes without a socket (axum's `oneshot`): who is asking is read from
//! the query, the path or the body and admitted once against the caller's key
//! (docs/reliability.md), and every reading of the ids the handler acts on is the one admitted —
//! percent-encoded names, a path's id, the headers of the other doors. The service behind is
//! real (memory stores; the one turn started is answered by a scripted model over loopback).

mod common;

use axum::body::Body;
use axum::http::{Method, Request};
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, ProjectingCheckpointer};
use toolgraph_graph::{Checkpointer, MemoryCheckpointer};
use toolgraph_server::auth::{Auth, hash_api_key};
use toolgraph_server::{AppState, ChatService, ServiceOptions};
use tower::ServiceExt;

/// The key of tenant `demo`, bound to tenant id 7.
const KEY: &str = "k-demo";

/// The routes over a service whose key of `demo` opens tenant 7 only, and its store (holding
/// one conversation of tenant 7's user 1 and one of tenant 8's user 1).
async fn app() -> (axum::Router, Arc<MemoryConversationStore>, i64, i64) {
    // An address nothing answers: no test on this app starts a turn.
    app_on("http://127.0.0.1:9/v1").await
}

/// [`app`] with its agent's model at `model`.
async fn app_on(model: &str) -> (axum::Router, Arc<MemoryConversationStore>, i64, i64) {
    let store = Arc::new(MemoryConversationStore::new());
    // The run's records are projected into the store's messages, as `serve` does.
    let ckpt: Arc<dyn Checkpointer> = Arc::new(ProjectingCheckpointer::forwarding(
        MemoryCheckpointer::new(),
        store.clone(),
        toolgraph_agents::conversation::project,
    ));
    let agents = common::tutor(model, &ckpt);
    let auth = Auth::api_keys([(&"demo".to_owned(), &hash_api_key(KEY))])
        .and_then(|a| a.bind_tenant_ids([(&"demo".to_owned(), &7)]))
        .expect("a key bound to tenant 7");
    let options = ServiceOptions { auth, ..ServiceOptions::default() };
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
    // A name given twice, an id that is not a number, a missing one: 400 in the service's shape.
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
    let (status, body) = delete("/api/chatbot/tenants/x".into()).await;
    assert_eq!(status, 400, "a path id that is not a number: {body}");
    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "in the service's error shape: {body}");
    let (status, body) = delete("/api/chatbot/users/1?tenantId=x".into()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");
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
            "/api/chatbot/answer".to_owned(),
            json!({ "tenantSlug": "demo", "tenantId": 8, "userId": 1, "conversationId": other, "messageId": 1, "answer": "sí" }),
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

/// `POST path` with `headers` (and the key of `demo`) and `body`.
async fn post_with(router: &axum::Router, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut req = Request::post(path)
        .header("authorization", format!("Bearer {KEY}"))
        .header("x-tenant-slug", "demo")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp =
        router.clone().oneshot(req.body(Body::from(body.to_string())).expect("a request")).await.expect("an answer");
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("a body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_header_doors_admit_the_tenant_their_headers_name() {
    let (router, store, ..) = app().await;
    let other = [("x-tenant-id", "8"), ("x-user-id", "1")];
    let hola = json!({ "messages": [{ "role": "user", "content": "hola" }] });
    let (status, body) = post_with(&router, "/threads", &other, json!({})).await;
    assert_eq!(status, 403, "LangGraph's threads: {body}");
    let run = json!({ "assistant_id": "tutor", "input": hola });
    assert_eq!(post_with(&router, "/runs/wait", &other, run).await.0, 403, "LangGraph's stateless runs");
    let agui = json!({ "threadId": "t", "runId": "r", "messages": [{ "id": "m", "role": "user", "content": "hola" }] });
    assert_eq!(post_with(&router, "/ag-ui/tutor", &other, agui).await.0, 403, "AG-UI");
    let completion = json!({ "model": "tutor", "messages": [{ "role": "user", "content": "hola" }] });
    assert_eq!(post_with(&router, "/v1/chat/completions", &other, completion).await.0, 403, "OpenAI's");
    assert_eq!(store.list_conversations(8, 1, 10).await.expect("the store answers").len(), 1, "nothing was made");
    // Without `X-Tenant-Id`, the key's bound tenant is the one asking.
    let (status, body) = post_with(&router, "/threads", &[("x-user-id", "1")], json!({})).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_turns_checkpoints_and_its_fork_answer_in_the_contracts_shapes() {
    let model = scripted_llm::ScriptedModelServer::start(vec![scripted_llm::Reply::text("¡Hola!")])
        .await
        .expect("the scripted model starts");
    let (router, ..) = app_on(&model.base_url()).await;
    let turn = json!({ "tenantSlug": "demo", "tenantId": 7, "userId": 3, "message": "hola" });
    let req = Request::post("/api/chatbot/stream")
        .header("authorization", format!("Bearer {KEY}"))
        .header("x-tenant-slug", "demo")
        .header("content-type", "application/json")
        .body(Body::from(turn.to_string()))
        .expect("a request");
    let resp = router.clone().oneshot(req).await.expect("an answer");
    assert_eq!(resp.status().as_u16(), 200);
    // The stream ends with the run.
    let text = String::from_utf8(axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("a body").to_vec())
        .expect("UTF-8");
    assert!(text.contains("event: done"), "{text}");
    let (_, listed) = get(&router, "/api/chatbot/conversations?tenantId=7&userId=3").await;
    let id = listed["conversations"][0]["id"].as_i64().expect("the turn's conversation");
    let (status, list) =
        get(&router, &format!("/api/chatbot/conversations/{id}/checkpoints?tenantId=7&userId=3")).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["conversationId"], id);
    let last =
        list["checkpoints"].as_array().and_then(|c| c.last()).expect("checkpoints")["seq"].as_u64().expect("a seq");
    let (status, at) =
        get(&router, &format!("/api/chatbot/conversations/{id}/checkpoints/{last}?tenantId=7&userId=3")).await;
    assert_eq!(status, 200, "{at}");
    let mut keys: Vec<&str> = at.as_object().expect("an object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["conversationId", "decisions", "next", "pending", "seq", "state"], "{at}");
    assert_eq!((at["conversationId"].as_i64(), at["seq"].as_u64()), (Some(id), Some(last)));
    assert!(at["state"].to_string().contains("¡Hola!"), "{at}");
    let fork = json!({ "tenantSlug": "demo", "tenantId": 7, "userId": 3, "seq": last });
    let (status, forked) =
        send(&router, Method::POST, &format!("/api/chatbot/conversations/{id}/fork"), KEY, Some(fork)).await;
    assert_eq!(status, 201, "{forked}");
    let new_id = forked["conversationId"].as_i64().expect("the new conversation");
    assert_ne!(new_id, id);
    assert_eq!(forked, json!({ "conversationId": new_id, "forkedFrom": { "conversationId": id, "seq": last } }));
}
