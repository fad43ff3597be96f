//! Interoperability: `toolgraph serve`'s AG-UI door (docs/ag-ui.md) driven by an
//! implementation nobody here wrote, AG-UI's official client (npm `@ag-ui/client`, installed
//! by `scripts/interop-deps`), with a tenant-bound API key, on the scripted model: its event
//! checks pass on a run with a tool call, a write waiting for approval ends a run with an
//! interrupt, and the run that resumes it approves the write, which runs once.

mod common;
use common::{client_json, serve_with_key};

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use toolgraph_testkit::interop::{agui_client, agui_validate};

const KEY: &str = "sk-test-ag-ui-door";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_uis_official_client_runs_an_agent_and_resumes_its_interrupt() {
    let Some(entry) = agui_client() else { return };
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::text("Son 42."),
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Docker", "body": "Volumes persist data."}))]),
        Reply::text("Nota guardada."),
    ])
    .await
    .unwrap();
    let (mut serve, base, dir) = serve_with_key(&model, KEY, false, &[]).await;

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/agui_client.mjs");
    let mut client = Command::new("node");
    client.arg(script).arg(&base).arg(KEY).arg(entry);
    let saw = client_json(client).await;
    let _ = serve.kill();
    let _ = serve.wait();

    // A run with a tool call: the client's own event checks passed on every event.
    let first = &saw["first"];
    let types: Vec<&str> = first["types"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(types.first(), Some(&"RUN_STARTED"), "{first}");
    assert_eq!(types.last(), Some(&"RUN_FINISHED"), "{first}");
    for kind in ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT", "TEXT_MESSAGE_CONTENT"] {
        assert!(types.contains(&kind), "{kind}: {first}");
    }
    assert_eq!(first["finished"]["outcome"], "success", "{first}");
    // The state shared, as the run starts: the client holds it as the agent's state.
    let at = |kind: &str| types.iter().position(|t| *t == kind);
    assert_eq!(at("STATE_SNAPSHOT"), Some(1), "{first}");
    assert!(first["state"].is_object(), "{first}");
    assert_eq!(first["finished"]["threadId"], "a-thread-of-the-client", "the client's thread id is kept");

    // A write waits: the run ends with an interrupt naming it.
    let pending = &saw["pending"];
    assert_eq!(pending["finished"]["outcome"], "interrupt", "{pending}");
    let interrupt = &pending["finished"]["interrupts"][0];
    assert_eq!(interrupt["reason"], "tool_approval", "{pending}");
    assert!(interrupt["message"].as_str().is_some_and(|m| !m.is_empty()), "{pending}");

    // Resumed with the approval: the note is written, and the reply closes the run, streamed
    // token by token as a turn's (the scripted reply is two words); the write's result is not
    // shown, its call being the earlier run's.
    let resumed = &saw["resumed"];
    assert_eq!(resumed["finished"]["outcome"], "success", "{resumed}");
    let resumed_types: Vec<&str> = resumed["types"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(resumed_types.iter().filter(|t| **t == "TEXT_MESSAGE_CONTENT").count(), 2, "{resumed}");
    assert!(!resumed_types.contains(&"TOOL_CALL_RESULT"), "{resumed}");
    // Sent again: the reply that run gave, in one piece; nothing runs twice (the model's
    // request count below).
    let again = &saw["resumed_again"];
    assert_eq!(again["finished"]["outcome"], "success", "{again}");
    let again_types: Vec<&str> = again["types"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(again_types.iter().filter(|t| **t == "TEXT_MESSAGE_CONTENT").count(), 1, "{again}");
    let messages = saw["messages"].as_array().unwrap();
    let texts: Vec<&str> = messages.iter().filter_map(|m| m["content"].as_str()).collect();
    assert!(texts.contains(&"Son 42."), "{messages:?}");
    assert!(texts.contains(&"Nota guardada."), "{messages:?}");
    assert!(messages.iter().any(|m| m["toolCalls"] == json!(["calculator"])), "{messages:?}");
    let notes = std::fs::read_dir(dir.path().join("notes")).map(|d| d.count()).unwrap_or(0);
    assert!(notes > 0, "the approved note was written under the data directory");
    assert!(saw["unknown_agent"].as_str().is_some_and(|e| e.contains("404")), "{}", saw["unknown_agent"]);
    // The second turn continued the first's conversation (recognised by its messages): the
    // model read the first reply.
    let requests = model.requests();
    let third = requests[2]["messages"].to_string();
    assert!(third.contains("Son 42."), "{third}");
    assert_eq!(model.request_count(), 4);
}

/// AG-UI's conformance validator (PyPI `ag-ui-validate`, installed by `scripts/interop-deps`)
/// judges the door's streams: a run it starts itself on the live endpoint, and the recorded
/// streams of a run with a tool call, a run that ends on an approval's interrupt, the run that
/// resumes it, and runs of a declared graph whose channels change — no finding at error or
/// warning level in any, the state shared (a snapshot, then a delta) judged too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ag_uis_conformance_validator_finds_nothing_wrong_in_the_doors_streams() {
    let Some(validator) = agui_validate() else { return };
    let model = ScriptedModelServer::start(vec![
        Reply::text("Hello."),
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::text("Son 42."),
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Docker", "body": "Volumes persist data."}))]),
        Reply::text("Nota guardada."),
        Reply::text("maths"),
        Reply::text("Son 42."),
        Reply::text("other"),
        Reply::text("Hola."),
    ])
    .await
    .unwrap();
    // The ReAct assistant, and a declared graph that writes a channel: the state a client shares.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("sorter.toml"),
        "start = \"sort\"\n[channels]\ntopic = {}\n[nodes.sort]\nkind = \"model\"\nhistory = \"last_message\"\n\
         prompt = \"Sort the message: maths or other.\"\noutput = { channel = \"topic\", schema = { enum = [\"maths\", \"other\"] } }\n\
         next = \"answer\"\n[nodes.answer]\nkind = \"model\"\ntools = []\n",
    )
    .unwrap();
    let sorter = format!("[agents.sorter]\ngraph_file = \"{}\"\n", dir.path().join("sorter.toml").display());
    let config = common::api_key_config(KEY, false) + &sorter;
    let (_serve, base, _dir) = common::serve_in(dir, &model, &config, &[]).await;
    let url = format!("{base}/ag-ui/assistant");
    let headers = [format!("Authorization: Bearer {KEY}"), "X-Tenant-Slug: demo".to_owned(), "X-User-Id: 1".to_owned()];

    // Live: the validator posts its own input and judges the stream as it arrives (content
    // type, keep-alives, chunking, disconnects too).
    let mut live = Command::new(&validator);
    live.arg(&url).args(["--json", "--fail-on", "warning", "--features", "shared-state"]);
    for h in &headers {
        live.arg("--header").arg(h);
    }
    let report = judged(live, None).await;
    assert_eq!(report["features"]["agentic-chat"], "exercised", "{report}");

    // Recorded: the streams of a client's conversation, judged one by one.
    let client = reqwest::Client::new();
    let post_to = |url: String, body: Value| {
        let mut req = client.post(url).json(&body);
        for h in &headers {
            let (k, v) = h.split_once(": ").unwrap();
            req = req.header(k, v);
        }
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.text().await.unwrap()
        }
    };
    let post = |body: Value| post_to(url.clone(), body);
    let first_user = json!({ "id": "u1", "role": "user", "content": "¿Cuánto es 6 por 7?" });
    let tool_run = post(json!({ "threadId": "t-validated", "runId": "r1", "messages": [first_user] })).await;
    let report = judged(Command::new(&validator), Some(tool_run)).await;
    assert_eq!(report["features"]["backend-tool-rendering"], "exercised", "{report}");

    let messages = json!([first_user, { "id": "a1", "role": "assistant", "content": "Son 42." },
                          { "id": "u2", "role": "user", "content": "Guarda una nota sobre Docker" }]);
    let paused = post(json!({ "threadId": "t-validated", "runId": "r2", "messages": messages })).await;
    let interrupt = sse_data(&paused)
        .into_iter()
        .find(|e| e["type"] == "RUN_FINISHED")
        .and_then(|e| e["outcome"]["interrupts"][0]["id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no interrupt: {paused}"));
    let report = judged(Command::new(&validator), Some(paused)).await;
    assert_eq!(report["features"]["human-in-the-loop"], "exercised", "{report}");

    let resume = json!([{ "interruptId": interrupt, "status": "resolved", "payload": { "approved": true } }]);
    let resumed =
        post(json!({ "threadId": "t-validated", "runId": "r3", "messages": messages, "resume": resume })).await;
    let said: String = sse_data(&resumed)
        .iter()
        .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
        .filter_map(|e| e["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(said, "Nota guardada.", "{resumed}");
    judged(Command::new(&validator), Some(resumed)).await;

    // A declared graph's channels: the first run starts from nothing and adds its label; the
    // next starts from it and replaces it. The delta applied to the snapshot is the state after.
    let sorter = format!("{base}/ag-ui/sorter");
    let asked = json!({ "id": "s1", "role": "user", "content": "¿Cuánto es 6 por 7?" });
    let first = post_to(sorter.clone(), json!({ "threadId": "t-sorted", "runId": "s1", "messages": [asked] })).await;
    let report = judged(Command::new(&validator), Some(first.clone())).await;
    assert_eq!(report["features"]["shared-state"], "exercised", "{report}");
    assert_eq!(shared_state(&first), (json!({}), json!({ "topic": "maths" })), "{first}");
    // Shared as the classifier writes it, before the answer begins; the end has nothing to add.
    let kinds: Vec<String> = sse_data(&first).iter().filter_map(|e| e["type"].as_str().map(str::to_owned)).collect();
    let delta_at = kinds.iter().position(|k| k == "STATE_DELTA");
    let answer_at = kinds.iter().position(|k| k == "TEXT_MESSAGE_START" || k == "TOOL_CALL_START");
    assert!(delta_at.is_some() && delta_at < answer_at, "{first}");
    assert_eq!(kinds.iter().filter(|k| *k == "STATE_DELTA").count(), 1, "{first}");
    let messages = json!([asked, { "id": "a1", "role": "assistant", "content": "Son 42." },
                          { "id": "s2", "role": "user", "content": "Hola" }]);
    let second = post_to(sorter, json!({ "threadId": "t-sorted", "runId": "s2", "messages": messages })).await;
    judged(Command::new(&validator), Some(second.clone())).await;
    assert_eq!(shared_state(&second), (json!({ "topic": "maths" }), json!({ "topic": "other" })), "{second}");
    assert_eq!(model.request_count(), 9, "each run asked the model as scripted");
}

/// The state a stream shares: its `STATE_SNAPSHOT`, and that snapshot with each `STATE_DELTA`
/// (a JSON Patch) applied, as a client holds it.
fn shared_state(body: &str) -> (Value, Value) {
    let events = sse_data(body);
    let snapshot = events.iter().find(|e| e["type"] == "STATE_SNAPSHOT").map(|e| e["snapshot"].clone()).unwrap();
    let mut state = snapshot.clone();
    for delta in events.iter().filter(|e| e["type"] == "STATE_DELTA") {
        for op in delta["delta"].as_array().unwrap() {
            let pointer = op["path"].as_str().unwrap();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let target = state.pointer_mut(parent).unwrap().as_object_mut().unwrap();
            match op["op"].as_str().unwrap() {
                "add" | "replace" => target.insert(key.to_owned(), op["value"].clone()),
                "remove" => target.remove(key),
                other => panic!("an operation this test does not apply: {other}"),
            };
        }
    }
    (snapshot, state)
}

/// `validator`'s JSON report on the stream it reads (`stream`, or its own live run): no
/// finding at error or warning level, and some events judged.
async fn judged(mut validator: Command, stream: Option<String>) -> Value {
    use std::io::Write;
    if stream.is_some() {
        validator.args(["-", "--json", "--fail-on", "warning", "--features", "shared-state"]);
    }
    validator
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = validator.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(stream) = stream {
            stdin.write_all(stream.as_bytes()).unwrap();
        }
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    let report: Value = serde_json::from_str(&printed)
        .unwrap_or_else(|_| panic!("{printed}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{report:#}");
    assert_eq!(
        (report["summary"]["errors"].as_u64(), report["summary"]["warnings"].as_u64()),
        (Some(0), Some(0)),
        "{report:#}"
    );
    assert!(report["eventCount"].as_u64().is_some_and(|n| n >= 3), "{report:#}");
    // Every event says when it was made (else an AGUI902 note).
    let rules: Vec<&str> =
        report["diagnostics"].as_array().unwrap().iter().filter_map(|d| d["rule"].as_str()).collect();
    assert!(!rules.contains(&"AGUI902"), "{report:#}");
    report
}

/// The JSON of each `data:` line of an SSE body.
fn sse_data(body: &str) -> Vec<Value> {
    body.lines().filter_map(|l| l.strip_prefix("data:")).filter_map(|d| serde_json::from_str(d.trim()).ok()).collect()
}
