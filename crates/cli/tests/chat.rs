//! `toolgraph chat` as a real process against the scripted model server.

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::json;
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn chat(server: &ScriptedModelServer, data: &std::path::Path, extra: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .arg("chat")
        .args(extra)
        .arg("--data-dir")
        .arg(data)
        .current_dir(data)
        .env("TOOLGRAPH_LLM_BASE_URL", server.base_url())
        .env("TOOLGRAPH_LLM_MODEL", "scripted")
        .env_remove("TOOLGRAPH_DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("the binary finishes")
}

/// A model that asks to write a note about Docker, then confirms it, then recalls it.
async fn docker_note_server() -> ScriptedModelServer {
    ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Docker", "body": "Volumes persist data."}))]),
        Reply::text("Saved your note about Docker."),
        Reply::text("You saved a note titled Docker."),
    ])
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_asks_before_writing_and_continues_in_a_new_process() {
    let server = docker_note_server().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();

    let out = tokio::task::block_in_place(|| chat(&server, &data, &[], "Save a note about Docker volumes\ny\n"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Saved your note about Docker."), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("approval needed: Save the note \"Docker\""), "{stderr}");
    assert!(stderr.contains("← note_write ok"), "{stderr}");
    assert!(data.join("notes/default/local/docker.md").exists(), "the approved write ran");

    let out = tokio::task::block_in_place(|| chat(&server, &data, &["--continue"], "What did I save?\n"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("You saved a note titled Docker."), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("continuing: 4 earlier messages"), "{stderr}");
    // The model saw the first conversation: it was read back from SQLite by a new process.
    let third = &server.requests()[2]["messages"];
    let texts: Vec<String> = third.as_array().unwrap().iter().map(|m| m["content"].to_string()).collect();
    assert!(texts.iter().any(|t| t.contains("Save a note about Docker volumes")), "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_write_never_runs_and_gets_the_cancellation_text() {
    let server = ScriptedModelServer::start(vec![Reply::tool_calls(&[(
        "n1",
        "note_write",
        json!({"title": "Secret", "body": "do not save"}),
    )])])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::task::block_in_place(|| chat(&server, dir.path(), &[], "save it\nn\n"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Cancelled, nothing was changed"), "{stdout}");
    assert!(!dir.path().join("notes/default/local/secret.md").exists());
    assert_eq!(server.request_count(), 1, "no model call after the rejection");
}

/// A pause whose decision was recorded but never applied (the process died right after):
/// `chat --continue` applies it — the note is written once — before the next message, instead
/// of refusing every message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_pause_left_by_a_dead_process_is_applied_on_continue() {
    use toolgraph_graph::{CheckpointRecord, Checkpointer, RecordKind, SqliteCheckpointer, ThreadId};
    let server = docker_note_server().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    // The input ends at the approval question: the thread stays paused, undecided.
    let out = tokio::task::block_in_place(|| chat(&server, &data, &[], "Save a note about Docker volumes\n"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!data.join("notes/default/local/docker.md").exists());

    // The approval is recorded, as a process that died right after recording it leaves it.
    let last = std::fs::read_dir(data.join("chat")).unwrap().next().unwrap().unwrap().path();
    let thread = ThreadId::new("cli", std::fs::read_to_string(&last).unwrap().trim());
    let store = SqliteCheckpointer::open(&data.join("toolgraph.db")).await.unwrap();
    let records = store.load(&thread, None).await.unwrap();
    let pause = records.last().unwrap().clone();
    assert_eq!(pause.kind, RecordKind::Interrupt);
    let decision = CheckpointRecord {
        seq: pause.seq + 1,
        run_id: "decided-then-died".into(),
        kind: RecordKind::Decision,
        node: None,
        updates: Vec::new(),
        interrupts: Vec::new(),
        decisions: pause.interrupts.iter().map(|i| (i.id.clone(), toolgraph_graph::Decision::Approve)).collect(),
        reason: None,
        metadata: None,
        graph_version: None,
        ..pause
    };
    store.append(&thread, &decision).await.unwrap();
    store.database().close().await;

    let out = tokio::task::block_in_place(|| chat(&server, &data, &["--continue"], "What did I save?\n"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(data.join("notes/default/local/docker.md").exists(), "the recorded approval was applied: {stderr}");
    assert!(stdout.contains("Saved your note about Docker."), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("You saved a note titled Docker."), "the next message ran: {stdout}\n{stderr}");
    assert_eq!(server.request_count(), 3);
}

#[test]
fn chat_without_a_model_endpoint_says_how_to_configure_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["chat", "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .env_remove("TOOLGRAPH_LLM_BASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TOOLGRAPH_LLM_BASE_URL"), "{err}");
}

#[test]
fn graph_show_prints_the_agent_as_mermaid() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph")).args(["graph", "show"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("flowchart TD"), "{text}");
    assert!(text.contains("tools == \"approval\" ==> approved"), "{text}");
    // Another agent's graph, from the configuration.
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/legal/toolgraph.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .arg("--config")
        .arg(&example)
        .args(["graph", "show", "--agent", "luat"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("retrieve") && text.contains("cite") && !text.contains("give_up"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .arg("--config")
        .arg(&example)
        .args(["graph", "show", "--agent", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("luat_react"));
}
