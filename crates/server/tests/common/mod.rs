//! Helpers shared by the service's end-to-end tests.

use serde_json::Value;
use toolgraph_server::AppState;

/// Serves `app` on an ephemeral loopback port in the background; returns `http://127.0.0.1:PORT`.
pub async fn serve(app: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = toolgraph_server::router(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

/// Posts `body` to `{base}/api/chatbot/stream` for the tenant `slug`; the whole SSE body.
// Not every test binary that includes this module streams turns this way.
#[allow(dead_code)]
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
