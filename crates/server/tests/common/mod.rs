//! Helpers shared by the service's end-to-end tests.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_server::{AppState, ServedAgent};

/// Serves `app` on an ephemeral loopback port in the background; returns `http://127.0.0.1:PORT`.
pub async fn serve(app: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = toolgraph_server::router(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

/// Posts `body` to `{base}/api/chatbot/stream` for the tenant `slug`; the whole SSE body.
pub async fn stream_text(base: &str, slug: &str, body: &Value) -> String {
    reqwest::Client::new()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", slug)
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// One server-sent event of a response body.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub id: String,
    pub event: String,
    pub data: Value,
}

/// The events of a whole SSE body, in order (read by `toolgraph_protocol::sse`); `data` parsed
/// as JSON when it is JSON.
pub fn parse_sse(text: &str) -> Vec<SseEvent> {
    toolgraph_protocol::sse::parse_body(text)
        .into_iter()
        .map(|f| SseEvent {
            id: f.id.unwrap_or_default(),
            event: f.event,
            data: serde_json::from_str(&f.data).unwrap_or(Value::String(f.data)),
        })
        .collect()
}

/// One agent, `tutor`: the ReAct graph without tools over the model at `model` (an
/// OpenAI-compatible address), its checkpoints in `checkpointer`.
pub fn tutor(model: &str, checkpointer: &Arc<dyn toolgraph_graph::Checkpointer>) -> BTreeMap<String, ServedAgent> {
    let config = toolgraph_llm::OpenAiConfig::new(model, "scripted");
    // `OpenAiChatModel::new` fails only on a malformed address.
    let llm = Arc::new(toolgraph_llm::OpenAiChatModel::new(config).expect("a well-formed address"));
    let spec =
        toolgraph_agents::kit::AgentSpec::new("tutor", "You are the tutor.", toolgraph_tools::ToolRegistry::new());
    let graph = toolgraph_agents::react::build(spec, llm, Arc::clone(checkpointer)).expect("the ReAct graph builds");
    let agent = toolgraph_agents::chat_agent::GraphAgent::new(graph);
    BTreeMap::from([("tutor".to_owned(), ServedAgent::new(agent, toolgraph_config::AgentSettings::default()))])
}
