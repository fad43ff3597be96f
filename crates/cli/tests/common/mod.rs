//! Helpers shared by the tests that run `toolgraph serve` as a process.
#![allow(dead_code)] // each test binary uses its own subset

use scripted_llm::ScriptedModelServer;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `toolgraph serve` on `port` over `data_dir`, talking to `model`, with no PostgreSQL and no
/// `PORT` from the environment.
pub fn serve_command(data_dir: &std::path::Path, model: &ScriptedModelServer, port: u16) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    cmd.args(["serve", "--port", &port.to_string(), "--data-dir"])
        .arg(data_dir)
        .current_dir(data_dir)
        .env("TOOLGRAPH_LLM_BASE_URL", model.base_url())
        .env("TOOLGRAPH_LLM_MODEL", "scripted")
        .env_remove("TOOLGRAPH_DATABASE_URL")
        .env_remove("TOOLGRAPH_ALLOCATOR")
        .env_remove("PORT")
        .stdout(Stdio::null());
    cmd
}

/// A loopback port nothing listens on right now, for a process the test starts
/// ([`toolgraph_testkit::process_port`]: not one `bind(0)` could hand to another listener).
pub fn free_port() -> u16 {
    toolgraph_testkit::process_port()
}

/// Sends `child` SIGTERM and waits for it to exit (at most `limit`): its status and what it
/// wrote on stderr (piped).
pub async fn terminate(child: &mut std::process::Child, limit: Duration) -> (std::process::ExitStatus, String) {
    // Read while it runs: a child blocked on a full pipe would never exit.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut err).unwrap();
        err
    });
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + limit;
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within {limit:?} of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    (exit, reader.join().unwrap())
}

/// Polls `/ready` until it answers 200 (at most 20 s).
pub async fn wait_ready(base: &str) {
    wait_ready_within(base, Duration::from_secs(20)).await;
}

/// Polls `/ready` until it answers 200 (at most `limit`).
pub async fn wait_ready_within(base: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        if let Ok(r) = reqwest::get(format!("{base}/ready")).await
            && r.status() == 200
        {
            return;
        }
        assert!(started.elapsed() < limit, "the service never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The whole SSE body of a turn for tenant `demo`, user 1, in `conversation` (a new one: `None`).
pub async fn turn(base: &str, conversation: Option<i64>, message: &str) -> String {
    let body = serde_json::json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation, "message": message});
    let response = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", "demo")
        .json(&body)
        .timeout(Duration::from_secs(60))
        .send();
    response.await.unwrap().text().await.unwrap()
}

/// The events of a whole SSE body, in order (read by `toolgraph_protocol::sse`), as
/// `(event, data)`: the data parsed as JSON (`null` when not JSON).
pub fn sse_events(body: &str) -> Vec<(String, serde_json::Value)> {
    toolgraph_protocol::sse::parse_body(body)
        .into_iter()
        .map(|f| (f.event, serde_json::from_str(&f.data).unwrap_or(serde_json::Value::Null)))
        .collect()
}

/// What a turn's body said: its `token` frames, joined.
pub fn said(body: &str) -> String {
    sse_events(body)
        .into_iter()
        .filter(|(e, _)| e == "token")
        .filter_map(|(_, d)| d["content"].as_str().map(str::to_owned))
        .collect()
}

/// The data of the first `event` of an SSE body.
///
/// # Panics
/// When there is none, showing the body.
pub fn event_data(body: &str, event: &str) -> serde_json::Value {
    sse_events(body)
        .into_iter()
        .find_map(|(name, data)| (name == event).then_some(data))
        .unwrap_or_else(|| panic!("no {event} event: {body}"))
}

/// The backend an `http` write plugin (`send_sms`) calls in the crash and replica tests: a
/// ledger of each call's `Idempotency-Key` (`conversationId:toolCallId`), what the world saw;
/// while `hold` is set it answers nothing (the process is killed while it waits).
#[derive(Clone, Default)]
pub struct SmsBackend {
    pub ledger: std::sync::Arc<std::sync::Mutex<toolgraph_testkit::invariants::WriteLedger>>,
    pub hold: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub arrived: std::sync::Arc<tokio::sync::Notify>,
}

/// Serves `backend` on a loopback port; its base URL.
pub async fn start_sms_backend(backend: SmsBackend) -> String {
    use std::sync::atomic::Ordering;
    let app = axum::Router::new().route(
        "/sms",
        axum::routing::post(
            |axum::extract::State(b): axum::extract::State<SmsBackend>, headers: axum::http::HeaderMap| async move {
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                let (conversation, call) = key.split_once(':').unwrap_or(("-1", ""));
                b.ledger.lock().unwrap().push((conversation.parse().unwrap_or(-1), call.to_owned()));
                b.arrived.notify_one();
                if b.hold.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                axum::Json(serde_json::json!({"sent": true}))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app.with_state(backend)).await });
    url
}

/// A data directory with the `send_sms` plugin pointing at `backend_url`, and its config.
pub fn sms_data_dir(backend_url: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugins/send_sms");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::write(
        plugin.join("plugin.toml"),
        format!(
            r#"name = "send_sms"
version = "1.0.0"
description = "Sends a text message."
kind = "http"
class = "write"
describe = "Send {{text}} to {{to}}"

[parameters.to]
type = "string"
description = "Recipient."
required = true

[parameters.text]
type = "string"
description = "Text."
required = true

[http]
url = "{backend_url}/sms"
headers = {{ "Idempotency-Key" = "{{ctx.conversationId}}:{{ctx.toolCallId}}" }}
"#
        ),
    )
    .unwrap();
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(&config, format!("[plugins]\ndirs = [{:?}]\n", dir.path().join("plugins").display().to_string()))
        .unwrap();
    (dir, config)
}

/// A field of a process's `/proc/PID/status` in kB (`VmRSS:`, `VmHWM:`); 0 once it has exited.
pub fn rss_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The invariant checker over every conversation in `data_dir`'s SQLite store, all of tenant 1;
/// `errors_seen(user)` is how many turns of that user's conversation its client saw end in an
/// error (or not at all). The verdict, and how many conversations there were.
pub async fn check_invariants(
    data_dir: &std::path::Path,
    errors_seen: impl Fn(i64) -> usize,
) -> (toolgraph_testkit::invariants::Verdict, usize) {
    let db = data_dir.join("toolgraph.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await.unwrap();
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT id, user_id FROM conversations").fetch_all(&pool).await.unwrap();
    pool.close().await;
    let ckpt = toolgraph_graph::SqliteCheckpointer::open(&db).await.unwrap();
    let store = toolgraph_conversations::SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let observed: Vec<toolgraph_testkit::invariants::Observed> = rows
        .iter()
        .map(|&(conversation, user)| toolgraph_testkit::invariants::Observed {
            tenant: 1,
            user,
            conversation,
            errors_seen: errors_seen(user),
            pending_seen: Vec::new(),
        })
        .collect();
    let verdict = toolgraph_testkit::invariants::check(&store, &ckpt, &observed, None).await;
    ckpt.database().close().await;
    (verdict, rows.len())
}

/// A `toolgraph.toml` in `api_key` mode whose key `key` opens tenant `demo` (id 7) only, with
/// the agent `assistant` (calculator and notes) and, when `helper`, a second agent.
pub fn api_key_config(key: &str, helper: bool) -> String {
    let digest = toolgraph_server::auth::hash_api_key(key);
    let helper = if helper { "[agents.helper]\ntools = []\n" } else { "" };
    format!(
        "[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"{digest}\"\n[server.api_key_tenants]\ndemo = 7\n\
         [rag]\nembedding = \"none\"\n[agents.assistant]\nsystem_prompt = \"You are the assistant.\"\n\
         tools = [\"calculator\", \"note_write\"]\n{helper}"
    )
}

/// A `toolgraph serve` process, killed when dropped: a test that fails midway leaves no server
/// behind (holding its port and files).
pub struct ServeProcess(pub std::process::Child);

impl std::ops::Deref for ServeProcess {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ServeProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `toolgraph serve` on `model` with [`api_key_config`] (and `env`), ready: the process, its
/// base URL and its directory (the data directory; kept while the directory lives).
pub async fn serve_with_key(
    model: &ScriptedModelServer,
    key: &str,
    helper: bool,
    env: &[(&str, &str)],
) -> (ServeProcess, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    serve_in(dir, model, &api_key_config(key, helper), env).await
}

/// `toolgraph serve` on `model` in `dir` with `config` as its `toolgraph.toml` (and `env`),
/// ready: the process, its base URL and `dir` (files the config names can be written there first).
pub async fn serve_in(
    dir: tempfile::TempDir,
    model: &ScriptedModelServer,
    config: &str,
    env: &[(&str, &str)],
) -> (ServeProcess, String, tempfile::TempDir) {
    let config_file = dir.path().join("toolgraph.toml");
    std::fs::write(&config_file, config).unwrap();
    let port = free_port();
    let child = serve_command(dir.path(), model, port)
        .arg("--config")
        .arg(&config_file)
        .envs(env.iter().copied())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = ServeProcess(child);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    (child, base, dir)
}

/// Runs `cmd` (an interoperability client) off the async threads: what it printed on stdout,
/// as JSON, once it succeeded.
pub async fn client_json(mut cmd: Command) -> serde_json::Value {
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap()
}

/// The model weights `file` that `scripts/fetch-models NAME` puts under the models directory
/// (`$TOOLGRAPH_MODELS_DIR`, else `~/.cache/toolgraph/models`); `None`, saying why, when they
/// are missing and `CI` is unset — under `CI` the caller goes on, and fails without them.
pub fn model_weights(file: &str, name: &str) -> Option<std::path::PathBuf> {
    let weights = std::env::var_os("TOOLGRAPH_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/toolgraph/models")
        })
        .join(file);
    if !weights.exists() && std::env::var_os("CI").is_none() {
        eprintln!("SKIP: {} missing (scripts/fetch-models {name})", weights.display());
        return None;
    }
    Some(weights)
}

/// The bundled course corpus (`examples/corpus`) ingested into knowledge base `cursos` of
/// tenant `demo`, keyword index only, with `config` over data directory `dir`; panics, saying
/// why, when it fails.
pub fn ingest_course_corpus(config: &std::path::Path, dir: &std::path::Path) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ingest = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(dir)
        .args(["ingest", "examples/corpus", "--kb", "cursos", "--keyword-only", "--tenant", "demo"])
        .args(["--path-meta", "{asignatura}/{tipo_documento}/**"])
        .current_dir(repo)
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .output()
        .unwrap();
    assert!(ingest.status.success(), "{}", String::from_utf8_lossy(&ingest.stderr));
}

/// The scripted model's part in three questions a grounded tutor is asked about the course: the
/// final exam's date and weight (answered with a date the guide does not hold as well), the
/// resit as a follow-up, and the rector, whom the guide does not name. For each, the answer it
/// starts from memory (stopped at its first words), then its answer from what the search found.
pub fn course_question_replies() -> Vec<scripted_llm::Reply> {
    use scripted_llm::Reply;
    let memory = || Reply::text("El examen final es el 15 de octubre.");
    vec![
        memory(),
        Reply::text("El examen final es el 20 de enero y vale el 40 % de la nota. La revisión es el 15 de octubre."),
        memory(),
        Reply::text("La extraordinaria es en julio y vale el 100 % de la nota."),
        memory(),
        Reply::text("El rector es Pedro Mercado Pacheco, desde 2019."),
    ]
}
