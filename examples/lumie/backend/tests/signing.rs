//! The reference backend does not run an action under another action's signature: the
//! service's genuine signed call to `tools/send_sms` (captured on the way), presented to a
//! backend that never saw it as a call to `tools/send_telegram`, is refused and sends nothing.

use academy_backend::academy::Academy;
use axum::body::Bytes;
use axum::http::{HeaderMap, Uri};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolgraph_conversations::MemoryConversationStore;
use toolgraph_conversations::backend::{BackendConversationStore, BackendOptions};
use toolgraph_server::auth::HmacVerifier;

const SECRET: &str = "reference-backend-secret";

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

#[tokio::test]
async fn an_approved_sms_call_is_not_a_telegram_call() {
    // The service's call, as it left the service.
    let seen: Arc<Mutex<Vec<(Uri, HeaderMap, Bytes)>>> = Arc::default();
    let log = Arc::clone(&seen);
    let capture = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let log = Arc::clone(&log);
        async move {
            log.lock().unwrap().push((uri, headers, body));
            axum::Json(json!({}))
        }
    });
    let client = BackendConversationStore::new(BackendOptions {
        base_url: serve(capture).await,
        secret: SECRET.as_bytes().to_vec(),
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    let call = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": 1, "callId": "c1",
        "arguments": {"to": "5A", "audience": "parents", "message": "No class tomorrow."}});
    client.post_for_tenant("/internal/chatbot/tools/send_sms", "demo", &call).await.unwrap();
    let (uri, headers, body) = seen.lock().unwrap()[0].clone();
    assert_eq!(uri.path(), "/internal/chatbot/tools/send_sms");

    let dir = tempfile::tempdir().unwrap();
    let academy = Arc::new(Academy::open(dir.path()).await.unwrap());
    let verifier = Arc::new(HmacVerifier::new(SECRET.as_bytes().to_vec()));
    let backend =
        serve(academy_backend::router(Arc::clone(&academy), Arc::new(MemoryConversationStore::new()), verifier)).await;
    let mut telegram =
        reqwest::Client::new().post(format!("{backend}/internal/chatbot/tools/send_telegram")).body(body.to_vec());
    for (name, value) in &headers {
        if name.as_str().starts_with("x-") || name == "content-type" {
            telegram = telegram.header(name.as_str(), value.as_bytes());
        }
    }
    let resp = telegram.send().await.unwrap();
    let status = resp.status().as_u16();
    let text: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 401, "the SMS call's signature sent Telegram messages: {text}");
    let pool = academy.tenant(1, "demo").unwrap().pool.clone();
    let sent: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages_sent").fetch_one(&pool).await.unwrap();
    assert_eq!(sent, 0, "nothing was sent");
    academy.close().await;
}
