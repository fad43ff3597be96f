//! The order desk of examples/embed, run as its own program on the scripted model: its node
//! kind finds the person's language and the prompt takes it; its tool looks the order up; the
//! chat service streams the reply over HTTP; a declaration that misuses the node kind is refused
//! at start with its file, line and field.

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn start(config: &Path, data: &Path, model: &ScriptedModelServer, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_embedded-agent"))
        .arg("--config")
        .arg(config)
        .args(["--port", &port.to_string(), "--data-dir"])
        .arg(data)
        .env("TOOLGRAPH_LLM_BASE_URL", model.base_url())
        .env("TOOLGRAPH_LLM_MODEL", "scripted")
        .env_remove("TOOLGRAPH_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

async fn turn(base: &str, conversation: &Value, message: &str) -> (String, Value) {
    let body =
        json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation, "message": message});
    let text = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", "demo")
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut said = String::new();
    let mut done = Value::Null;
    for block in text.split("\n\n") {
        let event = block.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default();
        let data: Value = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or(Value::Null);
        match event {
            "token" => said.push_str(data["content"].as_str().unwrap_or_default()),
            "done" => done = data,
            _ => {}
        }
    }
    (said, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_programs_own_node_kind_and_tool_run_in_the_served_graph() {
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("o1", "order_status", json!({"order": "a-1001"}))]),
        Reply::text("Tu pedido A-1001 salió el 27 de noviembre."),
        Reply::tool_calls(&[("o2", "order_status", json!({"order": "Z-9"}))]),
        Reply::text("I cannot find order Z-9."),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = toolgraph_testkit::process_port();
    let mut child = start(&example().join("toolgraph.toml"), dir.path(), &model, port);
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while reqwest::get(format!("{base}/ready")).await.map(|r| r.status() != 200).unwrap_or(true) {
        assert!(started.elapsed() < Duration::from_secs(20), "the program never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (first, done) = turn(&base, &Value::Null, "Hola, ¿dónde está mi pedido A-1001?").await;
    let (second, _) = turn(&base, &done["conversationId"], "And where is my order Z-9?").await;
    let requests = model.requests();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(first, "Tu pedido A-1001 salió el 27 de noviembre.");
    assert_eq!(second, "I cannot find order Z-9.");
    assert_eq!(requests.len(), 4, "{requests:#?}");
    let system = |i: usize| requests[i]["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    // The node kind wrote the language; the declared prompt read it.
    assert!(system(0).contains("whose code is es."), "{}", system(0));
    assert!(system(2).contains("whose code is en."), "{}", system(2));
    // The tool ran: its result (and its refusal of an unknown order) reached the model.
    let result = |i: usize| {
        let messages = requests[i]["messages"].as_array().unwrap();
        messages.last().unwrap()["content"].as_str().unwrap_or_default().to_owned()
    };
    let found: Value = serde_json::from_str(&result(1)).unwrap();
    assert_eq!(found, json!({"order": "A-1001", "status": "shipped", "shipped_on": "2026-11-27"}));
    assert!(result(3).contains("no order Z-9"), "{}", result(3));
}

/// Starts the program on the configuration in `dir`, which must refuse to start: what it said.
fn refused_start(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_embedded-agent"))
        .arg("--config")
        .arg(dir.join("toolgraph.toml"))
        .args(["--port", "0", "--data-dir"])
        .arg(dir)
        .env("TOOLGRAPH_LLM_BASE_URL", "http://127.0.0.1:9/v1")
        .env("TOOLGRAPH_LLM_MODEL", "m")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

#[test]
fn a_declaration_that_misuses_the_node_kind_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(example().join("toolgraph.toml"), dir.path().join("toolgraph.toml")).unwrap();
    let shop = std::fs::read_to_string(example().join("shop.toml")).unwrap();
    let broken = shop
        .replace(r#"languages = ["en", "es"]"#, r#"languages = ["en", "xx"]"#)
        .replace("kind = \"tools\"", "kind = \"tool_runner\"");
    std::fs::write(dir.path().join("shop.toml"), broken).unwrap();
    let stderr = refused_start(dir.path());
    let file = dir.path().join("shop.toml");
    let f = file.display();
    assert!(stderr.contains(&format!("{f}:13: nodes.language.with: `\"xx\"` is not a language it knows")), "{stderr}");
    assert!(stderr.contains(&format!("{f}:24: nodes.tools.kind: no node kind `tool_runner`")), "{stderr}");
    assert!(stderr.contains("detect_language"), "the program's kinds are named: {stderr}");

    // A node the kind cannot build (no channel to write) is refused when the graph is built,
    // naming the node and its kind.
    std::fs::write(dir.path().join("shop.toml"), shop.replace("channel = \"language\"\n", "")).unwrap();
    let stderr = refused_start(dir.path());
    assert!(
        stderr.contains("nodes.language (kind `detect_language`)") && stderr.contains("needs `channel`"),
        "{stderr}"
    );
}
