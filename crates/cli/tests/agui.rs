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
use toolgraph_testkit::interop::agui_client;

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
    // The state the run left, before it finished: the client holds it as the agent's state.
    let at = |kind: &str| types.iter().position(|t| *t == kind);
    assert!(at("STATE_SNAPSHOT") < at("RUN_FINISHED") && at("STATE_SNAPSHOT") > at("TEXT_MESSAGE_END"), "{first}");
    assert!(first["state"].is_object(), "{first}");
    assert_eq!(first["finished"]["threadId"], "a-thread-of-the-client", "the client's thread id is kept");

    // A write waits: the run ends with an interrupt naming it.
    let pending = &saw["pending"];
    assert_eq!(pending["finished"]["outcome"], "interrupt", "{pending}");
    let interrupt = &pending["finished"]["interrupts"][0];
    assert_eq!(interrupt["reason"], "tool_approval", "{pending}");
    assert!(interrupt["message"].as_str().is_some_and(|m| !m.is_empty()), "{pending}");

    // Resumed with the approval: the note is written, and the reply closes the run.
    let resumed = &saw["resumed"];
    assert_eq!(resumed["finished"]["outcome"], "success", "{resumed}");
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
