//! Secrets never reach logs, errors, answers or printed configuration (docs/reliability.md):
//! `serve` runs at the most verbose log level into failures that involve the model's API key
//! and a PostgreSQL password, `config show` prints all three (with the backend's signing
//! secret), and every byte printed or answered is searched for them.

mod common;
use common::{free_port, serve_command, turn, wait_ready};

use scripted_llm::{Reply, ScriptedModelServer};
use std::process::{Command, Stdio};

const LLM_KEY: &str = "sk-live-LLMKEY-0f1e2d3c4b5a";
const DB_PASSWORD: &str = "pw-DBPASS-9a8b7c6d";
const HMAC_SECRET: &str = "hmac-SIGNING-SECRET-5e4d3c2b1a0f";

fn assert_clean(what: &str, text: &str) {
    for secret in [LLM_KEY, DB_PASSWORD, HMAC_SECRET] {
        assert!(!text.contains(secret), "{what} shows a secret ({secret}):\n{text}");
    }
}

/// The model refuses the key (401, its body echoing it as some servers do) and then fails
/// with a 500; the turns end in errors; the log at `trace` and the answers hold no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_failing_on_the_models_key_logs_and_answers_no_secret() {
    let echo = format!("{{\"error\": {{\"message\": \"Incorrect API key provided: {LLM_KEY}\"}}}}");
    let model = ScriptedModelServer::start(vec![
        Reply::status(401, &echo),
        Reply::status(500, &echo),
        Reply::status(500, &echo),
        Reply::status(500, &echo),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .env("TOOLGRAPH_LLM_API_KEY", LLM_KEY)
        .env("TOOLGRAPH_LOG", "trace")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let mut answers = String::new();
    for _ in 0..2 {
        answers.push_str(&turn(&base, None, "hola").await);
    }
    answers.push_str(&reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap());
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    child.wait().unwrap();
    assert!(answers.contains("event: error"), "the turns failed: {answers}");
    let requests = model.requests();
    assert!(!requests.is_empty(), "the model was called");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("run failed"), "the failure is logged: {log}");
    assert_clean("the service's log", &log);
    assert_clean("the service's answers", &answers);
}

/// A PostgreSQL URL with a password that cannot connect: `serve` fails with an error naming the
/// server, not the password; `config show` masks it and the backend secret.
#[test]
fn a_database_url_with_a_password_is_never_printed() {
    let model_url = "http://127.0.0.1:9/v1";
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://app:{DB_PASSWORD}@127.0.0.1:1/toolgraph");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["serve", "--port", &free_port().to_string(), "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .env("TOOLGRAPH_LLM_BASE_URL", model_url)
        .env("TOOLGRAPH_LLM_MODEL", "scripted")
        .env("TOOLGRAPH_DATABASE_URL", &url)
        .env("TOOLGRAPH_LOG", "trace")
        .env_remove("PORT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "no database, no service");
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("127.0.0.1:1") || printed.contains("database"), "the error says what failed: {printed}");
    assert_clean("serve's output", &printed);

    let show = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["config", "show"])
        .current_dir(dir.path())
        .env("TOOLGRAPH_DATABASE_URL", &url)
        .env("TOOLGRAPH_LLM_API_KEY", LLM_KEY)
        .env("TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET", HMAC_SECRET)
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&show.stdout), String::from_utf8_lossy(&show.stderr));
    assert!(show.status.success(), "{printed}");
    assert!(printed.contains("database_url"), "{printed}");
    assert_clean("config show", &printed);
}
