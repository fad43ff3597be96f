//! `toolgraph serve` as a real process: ready, a turn over HTTP, SIGTERM, clean exit.

mod common;
use common::{event_data, free_port, serve_command, sse_events, turn, wait_ready, wait_ready_within};

use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The secret the backend tests sign their callbacks with.
const BACKEND_SECRET: &str = "a-backend-secret-of-32-bytes-xyz";

/// Whether `headers` sign `method`, `target` and `body` with [`BACKEND_SECRET`] (once: replays
/// fail).
async fn backend_signed(
    verifier: &toolgraph_server::auth::HmacVerifier,
    method: axum::http::Method,
    headers: &axum::http::HeaderMap,
    target: &str,
    body: &[u8],
) -> bool {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    verifier.verify_request(&method, headers, target, body, now).await.is_ok()
}

/// Serves `backend` (the library's callback router plus a test's extra routes) on a loopback
/// port, and `toolgraph serve` on its store with `model`; returns the service and its base URL.
async fn serve_with_backend(
    backend: axum::Router,
    model: &ScriptedModelServer,
    dir: &std::path::Path,
    config: Option<&std::path::Path>,
) -> (std::process::Child, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, backend).await });
    let port = free_port();
    let mut cmd = serve_command(dir, model, port);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    let child = cmd
        .env("TOOLGRAPH_SERVER_STORE", "backend")
        .env("TOOLGRAPH_SERVER_BACKEND_URL", &backend_url)
        .env("TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET", BACKEND_SECRET)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    (child, base)
}

/// The whole SSE body of a first turn for tenant `demo`, user 1.
async fn new_turn(base: &str, message: &str) -> String {
    turn(base, None, message).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_a_turn_and_stops_cleanly_on_sigterm() {
    serve_round_trip(None).await;
}

/// Started with a low soft open-files limit (many systems start processes at 1,024), `serve`
/// raises it to the hard limit: it holds two sockets per open stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_raises_its_soft_open_files_limit_to_the_hard_one() {
    let limits = |pid: u32| -> (String, String) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = text.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields[3].to_owned(), fields[4].to_owned())
    };
    let (_, hard) = limits(std::process::id());
    // `serve` goes at most to 2^20 (an unlimited hard limit cannot be a descriptor count).
    let expected = hard.parse::<u64>().map_or(1 << 20, |h| h.min(1 << 20)).to_string();
    assert!(expected.parse::<u64>().unwrap() > 256, "this test lowers the soft limit to 256 first");
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_command(dir.path(), &model, port);
    let program = serve.get_program().to_owned();
    let args: Vec<_> = serve.get_args().map(|a| a.to_owned()).collect();
    // The same command line, started by a shell that lowered the soft limit first.
    let mut shell = Command::new("bash");
    shell.arg("-c").arg("ulimit -Sn 256 && exec \"$0\" \"$@\"").arg(program).args(args);
    for (k, v) in serve.get_envs() {
        match v {
            Some(v) => shell.env(k, v),
            None => shell.env_remove(k),
        };
    }
    let mut child = shell.current_dir(dir.path()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    let (soft, _) = limits(child.id());
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    child.wait().unwrap();
    assert_eq!(soft, expected, "the soft limit was raised from 256");
}

/// `server.ops_bind`: `/health` and `/metrics` on their own address, not on the main one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_can_live_on_a_separate_address() {
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (port, ops) = (free_port(), free_port());
    let mut child = serve_command(dir.path(), &model, port)
        .env("TOOLGRAPH_SERVER_OPS_BIND", format!("127.0.0.1:{ops}"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_ready(&format!("http://127.0.0.1:{port}")).await;
    let metrics = reqwest::get(format!("http://127.0.0.1:{ops}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("chatbot_errors_total"), "{metrics}");
    assert_eq!(reqwest::get(format!("http://127.0.0.1:{ops}/health")).await.unwrap().status(), 200);
    assert_eq!(
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().status(),
        404,
        "not on the main address"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The round trip against PostgreSQL (`TOOLGRAPH_DATABASE_URL`), in a schema of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_postgresql() {
    use sqlx::Connection;
    let Some(schema) = toolgraph_testkit::PgSchema::create().await else { return };
    let url = toolgraph_testkit::pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    serve_round_trip(Some(format!("{url}{sep}options=-c%20search_path%3D{}", schema.name))).await;
    let mut c = sqlx::PgConnection::connect_with(&schema.options()).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM messages").fetch_one(&mut c).await.unwrap();
    assert_eq!(n, 2, "the user and assistant messages are in PostgreSQL");
    let _ = c.close().await;
}

/// `serve` on PostgreSQL behind PgBouncer in transaction mode (`database_pooling =
/// "transaction"`, migrations over the direct URL), two server connections for every client
/// connection: concurrent turns, a write paused for approval and confirmed, everything
/// persisted — where the driver's named prepared statements would collide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_postgresql_behind_pgbouncer_in_transaction_mode() {
    use sqlx::Connection;
    let Some(pooler) = toolgraph_testkit::pgbouncer::TransactionPooler::start(2).await else { return };
    let mut replies: Vec<Reply> = (0..4).map(|i| Reply::text(&format!("Hola {i}."))).collect();
    replies.push(Reply::tool_calls(&[("n1", "note_write", json!({"title": "Repaso", "body": "Redes."}))]));
    replies.push(Reply::text("Nota guardada."));
    let model = ScriptedModelServer::start(replies).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .env("TOOLGRAPH_DATABASE_URL", pooler.pooled_url())
        .env("TOOLGRAPH_DATABASE_POOLING", "transaction")
        .env("TOOLGRAPH_DATABASE_MIGRATION_URL", pooler.direct_url())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let turns: Vec<String> = futures::future::join_all((0..4).map(|_| new_turn(&base, "hola"))).await;
    for text in &turns {
        assert!(text.contains("event: done"), "{text}");
    }
    let text = new_turn(&base, "Guarda una nota de repaso").await;
    let pending = event_data(&text, "pending");
    let done = event_data(&text, "done");
    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": done["conversationId"], "messageId": pending["messageId"], "confirmed": true});
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/confirm"))
        .header("X-Tenant-Slug", "demo")
        .json(&confirm)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answer["message"], "Nota guardada.", "{answer}");
    let mut c = sqlx::PgConnection::connect(&pooler.direct_url()).await.unwrap();
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM conversations), (SELECT COUNT(*) FROM messages WHERE role = 'assistant'),
                (SELECT COUNT(*) FROM pending_actions WHERE decision)",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    let _ = c.close().await;
    assert_eq!(counts, (5, 5, 1), "five conversations, five replies, one approved action");
    assert_eq!(std::fs::read_dir(dir.path().join("notes")).unwrap().count(), 1, "the approved write ran once");
}

/// `store = "backend"`: the binary keeps the conversation in a backend (here the
/// library's receiving side over a memory store) through signed calls, and `general_query`
/// runs on the backend (`POST /internal/chatbot/query`) for the asking tenant and user: a
/// refused query goes back to the model, which repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_the_conversation_in_the_backend_through_signed_calls() {
    use axum::http::{HeaderMap, StatusCode};
    use std::sync::{Arc, Mutex};
    use toolgraph_conversations::{ConversationStore, MemoryConversationStore};
    use toolgraph_server::auth::HmacVerifier;
    use toolgraph_server::callback_router;
    let store = Arc::new(MemoryConversationStore::new());
    let queries: Arc<Mutex<Vec<(String, serde_json::Value)>>> = Arc::default();
    let verifier = Arc::new(HmacVerifier::new(BACKEND_SECRET.as_bytes().to_vec()));
    let seen = Arc::clone(&queries);
    let query = axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
        let (seen, verifier) = (Arc::clone(&seen), Arc::clone(&verifier));
        async move {
            if !backend_signed(&verifier, axum::http::Method::POST, &headers, "/internal/chatbot/query", &body).await {
                return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "bad signature"})));
            }
            let slug = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            let call: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let refused = call["sql"].as_str().unwrap_or("").contains("nope");
            seen.lock().unwrap().push((slug, call));
            if refused {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    axum::Json(json!({"error": "column \"nope\" does not exist"})),
                );
            }
            (StatusCode::OK, axum::Json(json!({"columns": ["n"], "rows": [[42]], "rowCount": 1})))
        }
    });
    let schema_calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (counted, schema_verifier) =
        (Arc::clone(&schema_calls), Arc::new(HmacVerifier::new(BACKEND_SECRET.as_bytes())));
    let schema = axum::routing::get(move |headers: HeaderMap, uri: axum::http::Uri| {
        let (counted, verifier) = (Arc::clone(&counted), Arc::clone(&schema_verifier));
        async move {
            let target = uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
            let expected = target.starts_with("/internal/chatbot/schema?tenantId=1&nonce=");
            if !expected || !backend_signed(&verifier, axum::http::Method::GET, &headers, &target, b"").await {
                return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "bad call"})));
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (StatusCode::OK, axum::Json(json!({"schema": "orders(id bigint, created_at timestamptz)"})))
        }
    });
    let router = callback_router(store.clone(), Arc::new(HmacVerifier::new(BACKEND_SECRET.as_bytes().to_vec())))
        .route("/internal/chatbot/query", query)
        .route("/internal/chatbot/schema", schema);

    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "general_query", json!({"sql": "select nope from orders"}))]),
        Reply::tool_calls(&[("c2", "general_query", json!({"sql": "select count(*) as n from orders"}))]),
        Reply::text("Hay 42 pedidos."),
        Reply::tool_calls(&[("c3", "general_query", json!({"sql": "select count(*) as n from orders where id > 1"}))]),
        Reply::text("Hay 41."),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = serve_with_backend(router, &model, dir.path(), None).await;
    let text = new_turn(&base, "¿cuántos pedidos hay?").await;
    assert!(text.contains("event: done") && text.contains("\"conversationId\":1"), "{text}");
    // A continuing turn without context: the backend still learns who is asking.
    let next = turn(&base, Some(1), "¿y sin el primero?").await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(next.contains("event: done"), "{next}");
    let messages = store.messages(1).await.unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles.first(), Some(&"user"), "{messages:?}");
    assert_eq!(messages.last().map(|m| (m.role.as_str(), m.content.as_str())), Some(("assistant", "Hay 41.")));
    assert!(dir.path().join("toolgraph.db").exists(), "checkpoints stay with the service");

    // All three queries reached the backend, signed, for tenant demo / user 1 / conversation 1.
    let queries = queries.lock().unwrap().clone();
    assert_eq!(queries.len(), 3, "{queries:?}");
    for (slug, call) in &queries {
        assert_eq!((slug.as_str(), call["tenantSlug"].as_str()), ("demo", Some("demo")), "{call}");
        assert_eq!((call["tenantId"].as_i64(), call["userId"].as_i64()), (Some(1), Some(1)), "{call}");
        assert_eq!(call["conversationId"].as_i64(), Some(1), "{call}");
    }
    assert_eq!(queries[1].1["sql"], "select count(*) as n from orders");
    // The model saw the refusal, then the rows, and never the injected arguments.
    let requests = model.requests();
    let tool_texts: Vec<String> = requests
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect();
    assert!(tool_texts.iter().any(|t| t.contains("nope") && t.contains("does not exist")), "{tool_texts:?}");
    assert!(tool_texts.iter().any(|t| t.contains("42")), "{tool_texts:?}");
    let tools = requests[0]["tools"].to_string();
    assert!(tools.contains("general_query") && !tools.contains("tenantId"), "{tools}");
    // Every model call's system prompt carries the tenant's schema, asked once for both turns.
    assert_eq!(requests.len(), 5);
    for r in &requests {
        let system = r["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(system.contains("orders(id bigint, created_at timestamptz)"), "{system}");
    }
    assert_eq!(schema_calls.load(std::sync::atomic::Ordering::SeqCst), 1, "the schema is cached per tenant");
}

/// `examples/lumie` against its reference backend (`examples/lumie/backend`): the model's
/// SQL runs on the asking tenant's academy and its rows reach the model; its `send_sms` pauses
/// for approval with the example's description, nothing is sent until it is approved, then
/// the backend queues one SMS per parent of the class, once, however often the confirm is
/// repeated; the conversation is kept in the backend's store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_academy_admin_example_runs_against_its_reference_backend() {
    use academy_backend::academy::Academy;
    use std::sync::Arc;
    use toolgraph_conversations::{ConversationStore, MemoryConversationStore};
    use toolgraph_server::auth::HmacVerifier;
    let backend_dir = tempfile::tempdir().unwrap();
    let academy = Arc::new(Academy::open(backend_dir.path()).await.unwrap());
    let store = Arc::new(MemoryConversationStore::new());
    let verifier = Arc::new(HmacVerifier::new(BACKEND_SECRET.as_bytes().to_vec()));
    let router = academy_backend::router(Arc::clone(&academy), store.clone(), verifier);
    let outbox = {
        let academy = Arc::clone(&academy);
        move || {
            let pool = academy.tenant(1, "demo").unwrap().pool.clone();
            async move {
                sqlx::query_as::<_, (String, String)>("SELECT address, body FROM messages_sent ORDER BY id")
                    .fetch_all(&pool)
                    .await
                    .unwrap()
            }
        }
    };

    let sql = "SELECT s.parent_name FROM students s JOIN classes c ON c.id = s.class_id WHERE c.name = '5A'";
    let sms = json!({"to": "5A", "audience": "parents", "message": "Mañana no hay clase"});
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("q1", "general_query", json!({ "sql": sql }))]),
        Reply::tool_calls(&[("s1", "send_sms", sms.clone())]),
        Reply::text("SMS enviado a 4 familias."),
    ])
    .await
    .unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lumie/toolgraph.toml");
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = serve_with_backend(router, &model, dir.path(), Some(&example)).await;
    let text = new_turn(&base, "Avisa por SMS a los padres de 5A que mañana no hay clase").await;
    let pending = event_data(&text, "pending");
    assert_eq!(pending["toolName"], "send_sms");
    assert_eq!(pending["arguments"], sms);
    assert_eq!(
        pending["description"], "Send an SMS to the parents of 5A: Mañana no hay clase",
        "the example's describe"
    );
    assert!(outbox().await.is_empty(), "the write ran before approval");

    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": 1,
        "messageId": pending["messageId"], "confirmed": true});
    let http = reqwest::Client::new();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let resp = http
            .post(format!("{base}/api/chatbot/confirm"))
            .header("X-Tenant-Slug", "demo")
            .json(&confirm)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        answers.push(resp.json::<serde_json::Value>().await.unwrap());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answers[0]["message"], "SMS enviado a 4 familias.", "{answers:?}");
    assert_eq!(answers[0], answers[1], "a repeated confirm replays the answer");
    let sent = outbox().await;
    assert_eq!(sent.len(), 4, "one SMS per parent of 5A, once: {sent:?}");
    assert!(sent.iter().all(|(_, body)| body == "Mañana no hay clase"), "{sent:?}");
    assert_eq!(sent[0].0, "+821030000001");

    // The academy's rows and the backend's answer reached the model, with the tenant's schema.
    let requests = model.requests();
    let tool_texts: Vec<String> = requests
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect();
    assert!(tool_texts.iter().any(|t| t.contains("Kim Soyeon") && t.contains("Choi Dongwook")), "{tool_texts:?}");
    assert!(tool_texts.iter().any(|t| t.contains("\\\"queued\\\":4")), "{tool_texts:?}");
    let system = requests[0]["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(system.contains("Hanbit Academy") && system.contains("parent_phone"), "{system}");
    // The conversation lives in the backend's store: the request, the pause, the reply.
    let messages = store.messages(1).await.unwrap();
    assert_eq!(messages.first().map(|m| m.role.as_str()), Some("user"), "{messages:?}");
    assert_eq!(messages.last().map(|m| m.content.as_str()), Some("SMS enviado a 4 familias."));
    academy.close().await;
}

/// Without its URL and secret the backend store is refused at start, naming the setting.
#[test]
fn serve_refuses_the_backend_store_without_its_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .env("TOOLGRAPH_SERVER_STORE", "backend")
        .env("TOOLGRAPH_SERVER_BACKEND_URL", "http://127.0.0.1:9")
        .env_remove("TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.backend_hmac_secret"), "{err}");
}

/// An allocator that does not exist is refused before anything runs, naming the variable.
#[test]
fn an_unknown_allocator_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["config", "show"])
        .env("TOOLGRAPH_ALLOCATOR", "tcmalloc")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TOOLGRAPH_ALLOCATOR must be 'mimalloc', 'jemalloc' or 'system' (unset: jemalloc for serve"),
        "{err}"
    );
}

async fn serve_round_trip(database_url: Option<String>) {
    let model = ScriptedModelServer::start(vec![Reply::text("Hola desde toolgraph.")]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .envs(database_url.iter().map(|u| ("TOOLGRAPH_DATABASE_URL", u.as_str())))
        // The PostgreSQL run also exercises the system allocator end to end; the SQLite run
        // serve's default (jemalloc).
        .envs(database_url.iter().map(|_| ("TOOLGRAPH_ALLOCATOR", "system")))
        // ... and a raised request-head limit (default 8 KB).
        .envs(database_url.iter().map(|_| ("TOOLGRAPH_SERVER_MAX_REQUEST_HEAD_BYTES", "16384")))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let text = new_turn(&base, "hola").await;
    assert!(text.contains("event: done"), "{text}");
    let big_header = "x".repeat(12 * 1024);
    let health = reqwest::Client::new().get(format!("{base}/health")).header("x-big", big_header).send();
    let expected = if database_url.is_some() { 200 } else { 431 };
    assert_eq!(health.await.unwrap().status(), expected, "server.max_request_head_bytes reaches the listener");
    if database_url.is_none() {
        assert!(dir.path().join("toolgraph.db").exists(), "the SQLite store is the default");
    }
    let (exit, err) = common::terminate(&mut child, Duration::from_secs(10)).await;
    assert!(exit.success(), "{err}");
    assert!(err.contains("shutting down"), "{err}");
    // The allocator chosen before `main` (see `allocator.rs`).
    let allocator = if database_url.is_some() { "allocator: system" } else { "allocator: jemalloc" };
    assert!(err.contains(allocator), "{err}");
}

/// `TOOLGRAPH_LLM_LOCAL_MODEL=0.5b` and no endpoint: the service answers a turn with the
/// in-process model (weights from `scripts/fetch-models chat-0.5b`), streamed as tokens, and
/// computed the prompt of each of its two agents before it said it was ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_with_the_local_model_when_no_endpoint_is_configured() {
    if common::model_weights("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "chat-0.5b").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("toolgraph.toml"),
        "default_agent = \"assistant\"\n[agents.assistant]\n[agents.tutor]\nsystem_prompt = \"Eres un tutor de redes.\"\n",
    )
    .unwrap();
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["serve", "--port", &port.to_string(), "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .env_remove("TOOLGRAPH_LLM_BASE_URL")
        .env("TOOLGRAPH_LLM_LOCAL_MODEL", "0.5b")
        .env_remove("TOOLGRAPH_DATABASE_URL")
        .env_remove("PORT")
        .env_remove("TOOLGRAPH_ALLOCATOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    // The model loads (seconds) before the port opens; other tests load theirs meanwhile.
    wait_ready_within(&base, Duration::from_secs(120)).await;
    let text = new_turn(&base, "Say hello in Spanish in one short sentence, without using any tool.").await;
    let _ = child.kill();
    let _ = child.wait();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    // serve's default allocator suits many streams; the log says how to favour the model.
    assert!(err.contains("allocator: jemalloc") && err.contains("TOOLGRAPH_ALLOCATOR=mimalloc"), "{err}");
    // Each agent's prompt was computed before the service said it was ready, the default
    // agent's last (it stays cached longest).
    let ready = err.find("listening on").expect("serve said it was ready");
    let tutor = err.find("the tutor agent's prompt computed ahead in").expect("the tutor's prompt");
    let assistant = err.find("the assistant agent's prompt computed ahead in").expect("the default agent's");
    assert!(tutor < assistant && assistant < ready, "{err}");
    assert!(text.matches("event: token").count() > 1, "{text}");
    assert!(text.contains("event: done"), "{text}");
    assert!(text.to_lowercase().contains("hola"), "{text}");
}

/// `toolgraph chat --url` drives a running `toolgraph serve` over HTTP: a read tool's call and
/// outcome are shown, a write waits for the typed approval and runs once through `/confirm`,
/// the second turn continues the same conversation, and the transcript records it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_url_talks_to_a_running_service_and_confirms_writes() {
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "0.4*8 + 0.6*6.5"}))]),
        Reply::text("Tu nota final es 7.1."),
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Repaso", "body": "Volúmenes y redes."}))]),
        Reply::text("Nota guardada."),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = serve_command(dir.path(), &model, port).stderr(Stdio::null()).spawn().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let transcript = dir.path().join("transcript.jsonl");
    let mut client = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["chat", "--url", &base, "--tenant-slug", "demo", "--transcript"])
        .arg(&transcript)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut client.stdin.take().unwrap(),
        "¿Cuál es mi nota final con un 8 y un 6,5?\nGuarda una nota de repaso\nsí\n".as_bytes(),
    )
    .unwrap();
    let out = tokio::task::block_in_place(|| client.wait_with_output()).unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Tu nota final es 7.1."), "{stdout}");
    assert!(stdout.contains("Nota guardada."), "the confirm's reply is printed: {stdout}");
    assert!(stderr.contains("→ calculator {\"expression\":\"0.4*8 + 0.6*6.5\"}"), "{stderr}");
    assert!(stderr.contains("← calculator ok:"), "{stderr}");
    assert!(stderr.contains("approval needed: Save the note \"Repaso\""), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path().join("notes")).unwrap().count(), 1, "the approved write ran once");

    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&transcript).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<String> = lines.iter().map(|l| format!("{}:{}", l["turn"], l["event"].as_str().unwrap())).collect();
    assert_eq!(names.first().map(String::as_str), Some("1:tool_call"), "{names:?}");
    assert!(names.contains(&"1:tool_result".to_owned()) && names.contains(&"1:done".to_owned()), "{names:?}");
    let result = lines.iter().find(|l| l["event"] == "tool_result").unwrap();
    assert!((result["data"]["outcome"]["result"].as_f64().unwrap() - 7.1).abs() < 1e-9, "{result}");
    let done: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "done").collect();
    assert_eq!(done.len(), 2);
    assert_eq!(done[0]["data"]["conversationId"], done[1]["data"]["conversationId"], "one conversation");
    let pending = lines.iter().find(|l| l["event"] == "pending").unwrap();
    assert_eq!(pending["data"]["toolName"], "note_write");
    let confirm = lines.iter().find(|l| l["event"] == "confirm").unwrap();
    assert_eq!(confirm["data"]["status"], 200);
    assert_eq!(confirm["data"]["request"]["messageId"], pending["data"]["messageId"]);
    assert_eq!(confirm["data"]["response"]["message"], "Nota guardada.");
}

/// `chat --url` with nothing listening says so and fails.
#[test]
fn chat_url_without_a_service_says_so() {
    let port = free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["chat", "--url", &format!("http://127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no toolgraph service answers at"), "{stderr}");
}

/// The first turn of `serve_crash_mid_turn`: a word, then the model stalls (the process is
/// killed while it waits).
fn stalled_reply() -> Reply {
    Reply::Stream(vec![
        Step::Text("Estoy ".into()),
        Step::Pause(Duration::from_secs(120)),
        Step::Text("pensando.".into()),
        Step::Finish("stop".into()),
        Step::Done,
    ])
}

/// Starts a turn on a new conversation and returns once its first token arrived (the turn is
/// running), with the response still open.
async fn turn_in_flight(base: &str, message: &str) -> impl futures::Stream {
    use futures::StreamExt;
    let body = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": null, "message": message});
    let response = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", "demo")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut seen = String::new();
    let mut chunks = response.bytes_stream();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains("event: token") {
        assert!(Instant::now() < deadline, "no token within 20 s: {seen}");
        let chunk = tokio::time::timeout(Duration::from_secs(20), chunks.next()).await.unwrap().unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    chunks
}

/// The text of an SSE body's `token` events, in order.
fn streamed_text(body: &str) -> String {
    sse_events(body)
        .into_iter()
        .filter(|(event, _)| event == "token")
        .filter_map(|(_, data)| data["content"].as_str().map(str::to_owned))
        .collect()
}

/// The messages of conversation 1 in the data directory's SQLite store, as `(role, content)`.
async fn stored_messages(dir: &std::path::Path) -> Vec<(String, String)> {
    use toolgraph_conversations::{ConversationStore, SqliteConversationStore};
    let ckpt = toolgraph_graph::SqliteCheckpointer::open(&dir.join("toolgraph.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let messages = store.messages(1).await.unwrap();
    ckpt.database().close().await;
    messages.into_iter().map(|m| (m.role.as_str().to_owned(), m.content)).collect()
}

/// `toolgraph serve` killed with SIGKILL in the middle of a turn, then started again on the same
/// data: the conversation is not wedged (no 409), the interrupted turn is closed with a reply
/// saying so (persisted, and seen by the model), and the next turn runs. `same_instance`: the
/// restarted process is the same instance (same port), which frees its earlier lease at start;
/// otherwise another instance takes the lease over once it expires.
async fn serve_crash_mid_turn(same_instance: bool) {
    use toolgraph_agents::kit::INTERRUPTED_REPLY;
    let model = ScriptedModelServer::start(vec![stalled_reply(), Reply::text("Aquí estoy de nuevo.")]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (port, lease) = (free_port(), "1000");
    let spawn = |port: u16| {
        serve_command(dir.path(), &model, port)
            .env("TOOLGRAPH_SERVER_TURN_LEASE_MS", lease)
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = spawn(port);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    // The client keeps the stream open: the turn is cut by the kill, not by a disconnect.
    let _open = turn_in_flight(&base, "hola").await;
    first.kill().unwrap(); // SIGKILL: no shutdown, no stop record, the lease still held
    first.wait().unwrap();

    let port = if same_instance { port } else { free_port() };
    let mut second = spawn(port);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let started = Instant::now();
    let text = loop {
        let text = turn(&base, Some(1), "¿sigues ahí?").await;
        // Another instance waits out the dead one's lease (1 s here); the same one never waits.
        if same_instance || !text.contains("already running") || started.elapsed() > Duration::from_secs(10) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(text.contains("event: done"), "{text}");
    assert_eq!(streamed_text(&text), "Aquí estoy de nuevo.");
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "the interrupted turn's model call is not repeated");
    let seen = requests[1]["messages"].to_string();
    assert!(seen.contains(INTERRUPTED_REPLY), "the model sees the turn closed: {seen}");
    let _ = Command::new("kill").args(["-TERM", &second.id().to_string()]).status();
    second.wait().unwrap();
    let messages = stored_messages(dir.path()).await;
    let expected = [
        ("user", "hola"),
        ("assistant", INTERRUPTED_REPLY),
        ("user", "¿sigues ahí?"),
        ("assistant", "Aquí estoy de nuevo."),
    ];
    let messages: Vec<(&str, &str)> = messages.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
    assert_eq!(messages, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_frees_the_turn_it_was_running() {
    serve_crash_mid_turn(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_takes_over_a_dead_instances_expired_lease() {
    serve_crash_mid_turn(false).await;
}

/// A plugin end to end: `serve` loads the shipped plugins from `[plugins] dirs` (a log line
/// each), the model calls `bad_calculator` through the chat service, and its result
/// (a + b + 100) reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_calls_a_plugin_through_the_chat_service() {
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "bad_calculator", json!({"a": 2, "b": 3}))]),
        Reply::text("Son 105."),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plugins");
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(&config, format!("[plugins]\ndirs = [{:?}]\n", plugins.display().to_string())).unwrap();
    let log = dir.path().join("serve.log");
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .arg("--config")
        .arg(&config)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let text = new_turn(&base, "¿cuánto es 2 + 3?").await;
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    child.wait().unwrap();
    assert!(text.contains("event: done"), "{text}");
    assert_eq!(streamed_text(&text), "Son 105.");
    let requests = model.requests();
    let offered = requests[0]["tools"].to_string();
    assert!(offered.contains("bad_calculator") && offered.contains("datetime_now"), "{offered}");
    let tool = requests[1]["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").cloned().unwrap();
    assert_eq!(tool["tool_call_id"], "c1");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(tool["content"].as_str().unwrap()).unwrap(),
        json!({"result": 105})
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("loaded plugin bad_calculator 1.0.0 from"), "{log}");
    assert!(log.contains("loaded plugin datetime_now 1.0.0 from"), "{log}");
}
