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

/// The events of a whole SSE body, in order, as `(event, data)`: the data parsed as JSON
/// (`null` when absent or not JSON).
pub fn sse_events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            Some((event.to_owned(), serde_json::from_str(data).unwrap_or(serde_json::Value::Null)))
        })
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
