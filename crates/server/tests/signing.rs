//! Signed requests cannot be moved (docs/service.md, "Signed requests"): a request the service
//! really signed — captured off the wire between the service and its backend — does not verify
//! as another call. Each case takes a genuine signature made by the backend client
//! ([`BackendConversationStore`]) and presents it elsewhere to a verifier that never saw it
//! (the original was intercepted, or went to another replica): as another callback path, and
//! as the body of another method on the service's own API.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use scripted_llm::ScriptedModelServer;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::conversation::project;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::react;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::backend::wire::path;
use toolgraph_conversations::backend::{BackendConversationStore, BackendOptions};
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, ProjectingCheckpointer};
use toolgraph_graph::MemoryCheckpointer;
use toolgraph_llm::{OpenAiChatModel, OpenAiConfig};
use toolgraph_server::auth::{Auth, HmacVerifier};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions, callback_router};

const SECRET: &[u8] = b"one-secret-both-ways-0123456789";

/// One request as it crossed the wire.
#[derive(Debug, Clone)]
struct Captured {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

/// A stand-in backend that records every request and answers each call's empty answer; the
/// backend client pointed at it, so what it records are genuine signed calls.
async fn capturing_backend() -> (BackendConversationStore, Arc<Mutex<Vec<Captured>>>) {
    let seen: Arc<Mutex<Vec<Captured>>> = Arc::default();
    let log = Arc::clone(&seen);
    let router = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let log = Arc::clone(&log);
        async move {
            let answer = match uri.path() {
                p if p == path::CONVERSATION_LIST => json!({"conversations": []}),
                p if p == path::HISTORY => json!({"messages": []}),
                _ => json!({}),
            };
            log.lock().unwrap().push(Captured { method, uri, headers, body });
            axum::Json(answer)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = BackendConversationStore::new(BackendOptions {
        base_url,
        secret: SECRET.to_vec(),
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    (client, seen)
}

/// Sends `method target` with `body` and the captured request's signature headers (every
/// `x-*` header it carried: the signature, its timestamp, nonce and tenant slug).
async fn resend(base: &str, method: Method, target: &str, from: &Captured, body: Vec<u8>) -> (u16, String) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{base}{target}"))
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in &from.headers {
        if name.as_str().starts_with("x-") {
            req = req.header(name.as_str(), value.as_bytes());
        }
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap_or_default())
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

/// The signed body of `conversations/list` (read a user's list) is not a `delete/user` call,
/// though the two bodies have the same fields: the signature covers the path.
#[tokio::test]
async fn a_signed_list_call_is_not_a_delete_user_call() {
    let (client, seen) = capturing_backend().await;
    client.list_conversations(7, 101, 20).await.unwrap();
    let list = seen.lock().unwrap()[0].clone();
    assert_eq!(list.uri.path(), path::CONVERSATION_LIST);

    let store = Arc::new(MemoryConversationStore::new());
    let conversation = store.create_conversation(7, 101, "lumie").await.unwrap();
    let backend = serve(callback_router(store.clone(), Arc::new(HmacVerifier::new(SECRET.to_vec())))).await;
    let (status, text) = resend(&backend, Method::POST, path::DELETE_USER, &list, list.body.to_vec()).await;
    assert_eq!(status, 401, "the list call's signature deleted a user: {text}");
    assert!(store.conversation(7, 101, conversation).await.unwrap().is_some(), "the user's conversation stays");
}

/// A service whose `hmac` secret is `SECRET`, holding one conversation of tenant 7.
async fn hmac_service() -> (String, Arc<dyn ConversationStore>, ScriptedModelServer) {
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    let llm = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let store: Arc<dyn ConversationStore> = Arc::new(MemoryConversationStore::new());
    let ckpt = Arc::new(ProjectingCheckpointer::forwarding(MemoryCheckpointer::new(), Arc::clone(&store), project));
    let spec = AgentSpec::new("lumie", "You are Lumie.", toolgraph_tools::ToolRegistry::new());
    let graph = react::build(spec, llm, ckpt.clone()).unwrap();
    let agents =
        BTreeMap::from([("lumie".to_string(), ServedAgent::new(GraphAgent::new(graph), AgentSettings::default()))]);
    let options = ServiceOptions { auth: Auth::Hmac(HmacVerifier::new(SECRET.to_vec())), ..ServiceOptions::default() };
    let app = AppState::new(ChatService::new(agents, "lumie".into(), Arc::clone(&store), ckpt, options));
    app.set_ready();
    store.create_conversation(7, 101, "lumie").await.unwrap();
    (serve(toolgraph_server::router(app)).await, store, model)
}

/// A signed GET's target (here the backend client's `history` call) sent as the body of
/// `DELETE /api/chatbot/tenants/7`: a bodiless request and a body are signed apart, and the
/// method and path are signed, so this deletes nothing, even where both directions share a
/// secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_get_target_is_not_the_body_of_a_delete() {
    let (client, seen) = capturing_backend().await;
    client.messages(1).await.unwrap();
    let get = seen.lock().unwrap()[0].clone();
    assert_eq!((get.method.clone(), get.uri.path()), (Method::GET, path::HISTORY));
    let target = get.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap();

    let (base, store, _model) = hmac_service().await;
    let (status, text) = resend(&base, Method::DELETE, "/api/chatbot/tenants/7", &get, target.into_bytes()).await;
    assert_eq!(status, 401, "a GET's signature deleted a tenant: {text}");
    assert_eq!(store.list_conversations(7, 101, 10).await.unwrap().len(), 1, "tenant 7 keeps its conversation");
}
