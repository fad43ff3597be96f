//! `toolgraph serve` killed with SIGKILL at chosen points of a turn with a write action, and
//! started again on the same data (docs/reliability.md): after the write tool's side effect
//! but before its result was saved; between that checkpoint and the reply; while the action
//! waits for its decision. And a data directory that turned read-only. After each, the
//! invariant checker reads the stores and the backend's ledger of writes.
//!
//! The write tool is an `http` plugin calling a backend in this test, with the call's
//! `conversationId:toolCallId` as its `Idempotency-Key`: the ledger is what the world saw.

mod common;
use common::{SmsBackend, free_port, serve_command, sms_data_dir, start_sms_backend, wait_ready};

use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};
use toolgraph_agents::kit::{INTERRUPTED_CALL, INTERRUPTED_REPLY};
use toolgraph_testkit::invariants::{self, Observed, WriteLedger};

/// How the model answers a tool's result: at once, or a word and then a stall.
const REPLY_NOW: u8 = 0;
const REPLY_STALLS: u8 = 1;

/// "escribe …" → `send_sms` (a call id per user turn); a tool result → "Enviado." (or a stall,
/// per `mode`); anything else → "De nada.".
fn model_responder(mode: Arc<AtomicU8>) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    move |req: &Value| {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        let turns = messages.iter().filter(|m| m["role"] == "user").count();
        match last["role"].as_str() {
            Some("tool") if mode.load(Ordering::SeqCst) == REPLY_STALLS => {
                Reply::Stream(vec![Step::Text("Envi".into()), Step::Pause(Duration::from_secs(3600)), Step::Done])
            }
            Some("tool") => Reply::text("Enviado."),
            Some("user") if last["content"].as_str().is_some_and(|c| c.starts_with("escribe")) => {
                Reply::tool_calls(&[(&format!("sms-{turns}"), "send_sms", json!({"to": "ana", "text": "hola"}))])
            }
            _ => Reply::text("De nada."),
        }
    }
}

struct Serve {
    child: Child,
    base: String,
}

async fn start_serve(dir: &std::path::Path, config: &std::path::Path, model: &ScriptedModelServer, port: u16) -> Serve {
    let child = serve_command(dir, model, port).arg("--config").arg(config).stderr(Stdio::null()).spawn().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    Serve { child, base }
}

impl Serve {
    fn kill(mut self) {
        self.child.kill().unwrap(); // SIGKILL: no shutdown of any kind
        self.child.wait().unwrap();
    }

    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        self.child.wait().unwrap();
    }
}

async fn turn(base: &str, conversation: Option<i64>, message: &str) -> Vec<(String, Value)> {
    common::sse_events(&common::turn(base, conversation, message).await)
}

async fn confirm(base: &str, conversation: i64, message: i64) -> (u16, Value) {
    let b = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation, "messageId": message, "confirmed": true});
    let resp = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/confirm"))
        .header("X-Tenant-Slug", "demo")
        .json(&b)
        .timeout(Duration::from_secs(60))
        .send()
        .await;
    match resp {
        Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
        // The process was killed under the request.
        Err(_) => (0, Value::Null),
    }
}

/// A turn asking for the write action; returns the conversation and the pending action's id.
async fn ask_for_the_action(base: &str) -> (i64, i64) {
    let ev = turn(base, None, "escribe a ana").await;
    let pending = ev.iter().find(|(e, _)| e == "pending").unwrap_or_else(|| panic!("{ev:?}"));
    let done = ev.iter().find(|(e, _)| e == "done").unwrap_or_else(|| panic!("{ev:?}"));
    (done.1["conversationId"].as_i64().unwrap(), pending.1["messageId"].as_i64().unwrap())
}

/// Reads the stores of `dir` (the service stopped) and checks every invariant.
async fn check(dir: &std::path::Path, conversation: i64, pending: i64, errors_seen: usize, ledger: &WriteLedger) {
    use toolgraph_conversations::SqliteConversationStore;
    let ckpt = toolgraph_graph::SqliteCheckpointer::open(&dir.join("toolgraph.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let observed = [Observed { tenant: 1, user: 1, conversation, errors_seen, pending_seen: vec![pending] }];
    let verdict = invariants::check(&store, &ckpt, &observed, Some(ledger)).await;
    ckpt.database().close().await;
    assert!(verdict.holds(), "{verdict}");
}

/// The stored messages of `conversation`, as `(role, content)`.
async fn messages(dir: &std::path::Path, conversation: i64) -> Vec<(String, String)> {
    use toolgraph_conversations::{ConversationStore, SqliteConversationStore};
    let ckpt = toolgraph_graph::SqliteCheckpointer::open(&dir.join("toolgraph.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let m = store.messages(conversation).await.unwrap();
    ckpt.database().close().await;
    m.into_iter().map(|m| (m.role.as_str().to_owned(), m.content)).collect()
}

/// A running `serve` with the `send_sms` plugin, its backend and model, and a conversation
/// whose write action awaits its decision.
struct Scene {
    backend: SmsBackend,
    model: ScriptedModelServer,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    port: u16,
    serve: Serve,
    conversation: i64,
    pending: i64,
}

async fn scene(mode: Arc<AtomicU8>) -> Scene {
    let backend = SmsBackend::default();
    let url = start_sms_backend(backend.clone()).await;
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    model.set_responder(model_responder(mode));
    let (dir, config) = sms_data_dir(&url);
    let port = free_port();
    let serve = start_serve(dir.path(), &config, &model, port).await;
    let (conversation, pending) = ask_for_the_action(&serve.base).await;
    Scene { backend, model, dir, config, port, serve, conversation, pending }
}

/// Killed after the backend received the write, before its result was saved: after the
/// restart the write is never sent again (the approval answers 409), its tool message says
/// the outcome is unknown, the turn is closed, and the conversation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_write_was_sent_before_its_result_was_saved() {
    let Scene { backend, model, dir, config, port, serve, conversation, pending } = scene(Arc::default()).await;

    backend.hold.store(true, Ordering::SeqCst);
    let arrived = backend.arrived.notified();
    let approving = tokio::spawn({
        let base = serve.base.clone();
        async move { confirm(&base, conversation, pending).await }
    });
    tokio::time::timeout(Duration::from_secs(20), arrived).await.expect("the write reached the backend");
    serve.kill();
    assert_eq!(approving.await.unwrap().0, 0, "the approval was cut by the kill");
    backend.hold.store(false, Ordering::SeqCst);

    let serve = start_serve(dir.path(), &config, &model, port).await;
    let (status, body) = confirm(&serve.base, conversation, pending).await;
    assert_eq!(status, 409, "an action whose outcome is unknown is never run again: {body}");
    let next = turn(&serve.base, Some(conversation), "gracias").await;
    assert_eq!(next.last().map(|(e, _)| e.as_str()), Some("done"), "{next:?}");
    let seen = model.requests().last().unwrap()["messages"].to_string();
    assert!(seen.contains(INTERRUPTED_CALL), "the model learns the outcome is unknown: {seen}");
    serve.stop();

    let ledger = backend.ledger.lock().unwrap().clone();
    assert_eq!(ledger, [(conversation, "sms-1".to_owned())], "sent once");
    check(dir.path(), conversation, pending, 1, &ledger).await;
    let stored = messages(dir.path(), conversation).await;
    assert!(stored.iter().any(|(r, c)| r == "assistant" && c == INTERRUPTED_REPLY), "{stored:?}");
}

/// Killed after the write's result was saved, while the model wrote the reply: the write is
/// not repeated, its result stays in the history, and the turn is closed as interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_the_results_checkpoint_and_the_reply() {
    let mode = Arc::new(AtomicU8::new(REPLY_STALLS));
    let Scene { backend, model, dir, config, port, serve, conversation, pending } = scene(mode.clone()).await;

    let calls = model.request_count();
    let approving = tokio::spawn({
        let base = serve.base.clone();
        async move { confirm(&base, conversation, pending).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while model.request_count() == calls {
        assert!(Instant::now() < deadline, "the model was never asked for the reply");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serve.kill();
    assert_eq!(approving.await.unwrap().0, 0);
    mode.store(REPLY_NOW, Ordering::SeqCst);

    let serve = start_serve(dir.path(), &config, &model, port).await;
    let (status, _) = confirm(&serve.base, conversation, pending).await;
    assert_eq!(status, 409, "the action ran; it is not run again");
    let next = turn(&serve.base, Some(conversation), "gracias").await;
    assert_eq!(next.last().map(|(e, _)| e.as_str()), Some("done"), "{next:?}");
    serve.stop();

    let ledger = backend.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), 1, "sent once: {ledger:?}");
    check(dir.path(), conversation, pending, 1, &ledger).await;
    let stored = messages(dir.path(), conversation).await;
    let roles: Vec<&str> = stored.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["user", "pending", "tool", "assistant", "user", "assistant"], "{stored:?}");
    assert!(stored[2].1.contains("sent"), "the saved result stays: {stored:?}");
    assert_eq!(stored[3].1, INTERRUPTED_REPLY);
}

/// Killed while the action waited for its decision: after the restart it is still there and
/// its approval runs it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_action_survives_a_kill_and_runs_once_when_approved() {
    let Scene { backend, model, dir, config, port, serve, conversation, pending } = scene(Arc::default()).await;
    serve.kill();

    let serve = start_serve(dir.path(), &config, &model, port).await;
    let (status, body) = confirm(&serve.base, conversation, pending).await;
    assert_eq!((status, body["message"].as_str()), (200, Some("Enviado.")), "{body}");
    let (status, again) = confirm(&serve.base, conversation, pending).await;
    assert_eq!((status, again), (200, body), "the same decision again answers the same, running nothing");
    serve.stop();
    let ledger = backend.ledger.lock().unwrap().clone();
    assert_eq!(ledger, [(conversation, "sms-1".to_owned())]);
    check(dir.path(), conversation, pending, 0, &ledger).await;
}

/// The data directory's file system turned read-only (as the kernel does after disk errors):
/// `serve` refuses to start with an error naming the store, and once it is writable again it
/// starts with the conversation intact. Needs CAP_SYS_ADMIN for a tmpfs of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_is_refused_at_start_and_nothing_is_lost() {
    let mount = tempfile::tempdir().unwrap();
    let dir = mount.path().to_owned();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&dir)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs CAP_SYS_ADMIN)");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(dir.clone());
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    model.set_responder(model_responder(Arc::default()));
    let config = dir.join("toolgraph.toml");
    std::fs::write(&config, "").unwrap();
    let port = free_port();
    let serve = start_serve(&dir, &config, &model, port).await;
    let first = turn(&serve.base, None, "hola").await;
    assert_eq!(first.last().map(|(e, _)| e.as_str()), Some("done"), "{first:?}");
    serve.stop();

    assert!(Command::new("mount").args(["-o", "remount,ro"]).arg(&dir).status().unwrap().success());
    let out = serve_command(&dir, &model, free_port()).arg("--config").arg(&config).output().unwrap();
    assert!(!out.status.success(), "serve must not run on a store it cannot write");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("toolgraph.db") && stderr.to_lowercase().contains("read-only"), "{stderr}");

    assert!(Command::new("mount").args(["-o", "remount,rw"]).arg(&dir).status().unwrap().success());
    let serve = start_serve(&dir, &config, &model, port).await;
    let next = turn(&serve.base, Some(1), "¿sigues?").await;
    assert_eq!(next.last().map(|(e, _)| e.as_str()), Some("done"), "{next:?}");
    serve.stop();
    let stored = messages(&dir, 1).await;
    assert_eq!(stored.len(), 4, "{stored:?}");
}
