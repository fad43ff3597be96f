//! The `academy-backend` process over HTTP: signed calls only, each tenant's own data, SQL that
//! is not one read-only SELECT refused with a reason and no effect.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use toolgraph_server::auth::{SignedRequest, now_secs, sign_v1, signature_headers};

const SECRET: &str = "reference-backend-secret";

struct Backend {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Backend {
    fn start(dir: &std::path::Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// [`start`](Self::start) with `env` set too.
    fn start_with(dir: &std::path::Path, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_academy-backend"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .env("LUMIE_INTERNAL_HMAC_SECRET", SECRET)
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line}")).to_owned();
        Self { child, base, http: reqwest::Client::new() }
    }

    /// A signed POST as the service sends it, for tenant `slug` (v2: a new `X-Nonce` each
    /// time; the body's `nonce` is the service's too).
    async fn post(&self, path: &str, slug: &str, body: &Value) -> (u16, Value) {
        static NONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut body = body.clone();
        body["nonce"] = json!(NONCE.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let bytes = serde_json::to_vec(&body).unwrap();
        let mut request = self.http.post(format!("{}{path}", self.base)).header("x-tenant-slug", slug);
        let signed = SignedRequest { method: "POST", target: path, tenant_slug: Some(slug), body: &bytes };
        for (name, value) in signature_headers(SECRET.as_bytes(), &signed) {
            request = request.header(name, value);
        }
        let response = request.header("content-type", "application/json").body(bytes).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    async fn query(&self, slug: &str, tenant: i64, user: i64, sql: &str) -> (u16, Value) {
        let body = json!({"tenantSlug": slug, "tenantId": tenant, "userId": user, "conversationId": 1, "sql": sql});
        self.post("/internal/chatbot/query", slug, &body).await
    }
}

#[tokio::test]
async fn each_tenant_reads_only_its_own_academy_and_only_with_a_select() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start(dir.path());
    let count = "SELECT COUNT(*) AS n FROM students";
    let (status, demo) = backend.query("demo", 1, 1, count).await;
    assert_eq!((status, demo["rows"][0][0].as_i64()), (200, Some(12)), "{demo}");
    let (status, north) = backend.query("north", 2, 2, count).await;
    assert_eq!((status, north["rows"][0][0].as_i64()), (200, Some(4)), "{north}");

    // Who is asking must add up: the slug, the id and the user.
    assert_eq!(backend.query("north", 1, 1, count).await.0, 403, "tenant 1 is not 'north'");
    assert_eq!(backend.query("demo", 1, 2, count).await.0, 403, "user 2 is staff of north only");
    let mismatched = json!({"tenantSlug": "north", "tenantId": 1, "userId": 1, "conversationId": 1, "sql": count});
    assert_eq!(backend.post("/internal/chatbot/query", "demo", &mismatched).await.0, 403);

    for hostile in [
        "DELETE FROM students",
        "SELECT 1; DROP TABLE students",
        "ATTACH DATABASE 'tenant-2.db' AS other",
        "WITH x AS (SELECT 1) DELETE FROM payments",
    ] {
        let (status, body) = backend.query("demo", 1, 1, hostile).await;
        assert_eq!(status, 422, "{hostile}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}");
    }
    let (status, body) = backend.query("demo", 1, 1, "SELECT nope FROM students").await;
    assert_eq!(status, 422);
    assert!(body["error"].as_str().unwrap_or_default().contains("nope"), "the database's reason: {body}");
    let (_, after) =
        backend.query("demo", 1, 1, "SELECT (SELECT COUNT(*) FROM students) + (SELECT COUNT(*) FROM payments)").await;
    assert_eq!(after["rows"][0][0].as_i64(), Some(12 + 24), "nothing changed: {after}");
}

#[tokio::test]
async fn calls_without_a_valid_signature_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start(dir.path());
    let path = "/internal/chatbot/tools/create_announcement";
    let body = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": 1, "callId": "a1",
        "arguments": {"title": "Snow day", "content": "The academy is closed today."}});
    let unsigned = backend.http.post(format!("{}{path}", backend.base)).header("x-tenant-slug", "demo").json(&body);
    assert_eq!(unsigned.send().await.unwrap().status(), 401);

    // A signature is accepted once: the same headers again are a replay.
    let bytes = serde_json::to_vec(&body).unwrap();
    let signed = SignedRequest { method: "POST", target: path, tenant_slug: Some("demo"), body: &bytes };
    let headers = signature_headers(SECRET.as_bytes(), &signed);
    let send = || {
        let mut r = backend.http.post(format!("{}{path}", backend.base)).header("x-tenant-slug", "demo");
        for (name, value) in &headers {
            r = r.header(*name, value);
        }
        r.header("content-type", "application/json").body(bytes.clone()).send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(send().await.unwrap().status(), 401, "a replayed call");
    // Nor is a new signature of this call accepted for another tool: it covers the path.
    let other = "/internal/chatbot/tools/send_sms";
    let mut r = backend.http.post(format!("{}{other}", backend.base)).header("x-tenant-slug", "demo");
    for (name, value) in signature_headers(SECRET.as_bytes(), &signed) {
        r = r.header(name, value);
    }
    assert_eq!(r.header("content-type", "application/json").body(bytes.clone()).send().await.unwrap().status(), 401);

    let (_, rows) = backend.query("demo", 1, 1, "SELECT COUNT(*) FROM announcements WHERE title = 'Snow day'").await;
    assert_eq!(rows["rows"][0][0].as_i64(), Some(1), "the signed call ran once: {rows}");
    let (status, body) = backend.post("/internal/chatbot/tools/drop_tables", "demo", &body).await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test]
async fn the_schema_and_the_conversation_store_answer_signed_calls() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start(dir.path());
    let target = "/internal/chatbot/schema?tenantId=2&nonce=n1";
    let mut r = backend.http.get(format!("{}{target}", backend.base)).header("x-tenant-slug", "north");
    let signed = SignedRequest { method: "GET", target, tenant_slug: Some("north"), body: b"" };
    for (name, value) in signature_headers(SECRET.as_bytes(), &signed) {
        r = r.header(name, value);
    }
    let schema: Value = r.send().await.unwrap().json().await.unwrap();
    let text = schema["schema"].as_str().unwrap_or_default();
    assert!(text.starts_with("North Star Academy") && text.contains("parent_telegram"), "{text}");

    let (status, created) = backend
        .post("/internal/chatbot/conversations", "demo", &json!({"tenantId": 1, "userId": 1, "agent": "academy"}))
        .await;
    assert_eq!(status, 200, "{created}");
    let id = created["id"].as_i64().unwrap();
    let message = json!({"conversationId": id, "role": "user", "content": "How many students are in 5A?"});
    assert_eq!(backend.post("/internal/chatbot/save-message", "demo", &message).await.0, 200);
    assert!(dir.path().join("conversations.db").exists());
}

/// v1 signatures (the timestamp and body only) are refused unless the backend is started with
/// `LUMIE_ACCEPT_V1_SIGNATURES=true`, for the window in which a not yet upgraded service still
/// sends them (docs/service.md, "Switching to v2").
#[tokio::test]
async fn v1_signatures_are_refused_unless_the_migration_window_is_open() {
    let path = "/internal/chatbot/conversations";
    let body = br#"{"nonce":"n1","tenantId":1,"userId":1,"agent":"academy"}"#;
    let send = |backend: &Backend| {
        let now = now_secs();
        backend
            .http
            .post(format!("{}{path}", backend.base))
            .header("x-tenant-slug", "demo")
            .header("content-type", "application/json")
            .header("x-timestamp", now.to_string())
            .header("x-signature", sign_v1(SECRET.as_bytes(), now, body))
            .body(body.to_vec())
            .send()
    };
    let dir = tempfile::tempdir().unwrap();
    let strict = Backend::start(dir.path());
    let refused = send(&strict).await.unwrap();
    assert_eq!(refused.status(), 401);
    assert!(refused.text().await.unwrap().contains("v1"));
    drop(strict);
    let open = Backend::start_with(dir.path(), &[("LUMIE_ACCEPT_V1_SIGNATURES", "true")]);
    assert_eq!(send(&open).await.unwrap().status(), 200);
}

#[test]
fn a_short_secret_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_academy-backend"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("LUMIE_INTERNAL_HMAC_SECRET", "short")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16 bytes"), "{out:?}");
}
