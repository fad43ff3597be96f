//! Interoperability: `toolgraph serve`'s LangGraph assistants (docs/langgraph.md) read by an
//! implementation nobody here wrote, LangGraph's Python SDK (PyPI `langgraph-sdk`, installed by
//! `scripts/interop-deps`), with a tenant-bound API key.

mod common;
use common::{client_json, serve_with_key};

use scripted_llm::ScriptedModelServer;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use toolgraph_testkit::interop::langgraph_python;

const KEY: &str = "sk-test-langgraph-door";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_finds_and_reads_the_agents_as_assistants() {
    let Some(python) = langgraph_python() else { return };
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    let (mut serve, base, _dir) = serve_with_key(&model, KEY, true, &[]).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/langgraph_client.py");
    let mut client = Command::new(python);
    client.arg(script).arg(&base).arg(KEY);
    let saw = client_json(client).await;
    let _ = serve.kill();
    let _ = serve.wait();

    // Every agent is an assistant, found, counted and paged as the SDK asks.
    assert_eq!(saw["search"], json!(["assistant", "helper"]));
    assert_eq!(saw["count"], 2);
    assert_eq!(saw["page"], json!({ "ids": ["assistant"], "next": "1" }));
    assert_eq!(saw["second_page"], json!(["helper"]));
    assert_eq!(saw["by_name"], json!(["helper"]), "a name filters by substring, any case");
    let got = &saw["get"];
    assert_eq!((got["assistant_id"].as_str(), got["graph_id"].as_str()), (Some("assistant"), Some("assistant")));
    assert!(got["created_at"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('T')), "{got}");
    assert!(got["metadata"]["graph_version"].is_string(), "the served declaration's version: {got}");
    assert_eq!(saw["first"], *got);

    // Its graph as LangGraph draws it: the ReAct agent's nodes between START and END.
    let graph = &saw["graph"];
    let nodes: Vec<&str> = graph["nodes"].as_array().unwrap().iter().filter_map(|n| n["id"].as_str()).collect();
    for node in ["__start__", "agent", "tools", "__end__"] {
        assert!(nodes.contains(&node), "{node}: {graph}");
    }
    let edges = graph["edges"].as_array().unwrap();
    assert!(edges.iter().any(|e| e["source"] == "__start__" && e["target"] == "agent"), "{graph}");
    assert!(edges.iter().any(|e| e["source"] == "agent" && e["conditional"] == true), "{graph}");
    assert_eq!(saw["schemas"]["graph_id"], "assistant");
    assert!(saw["schemas"]["input_schema"]["properties"]["messages"].is_object(), "{}", saw["schemas"]);

    let unknown = &saw["unknown"];
    assert_eq!(unknown["status"], 404, "{unknown}");
    assert!(unknown["body"].to_string().contains("no assistant 'nope'"), "{unknown}");
}
