//! Interoperability: `toolgraph serve`'s OpenAPI document (`/openapi.json`, docs/api.md) checked
//! against the running server by a tool nobody here wrote, schemathesis (PyPI, installed by
//! `scripts/interop-deps`): every operation of the document is called with requests generated
//! from it (and with a tenant-bound key, as a client would), and no answer may be a server error
//! or fall outside the document — its status, content type, headers and body.

mod common;
use common::serve_in;

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use toolgraph_testkit::interop::schemathesis;

const KEY: &str = "sk-test-openapi";

/// The checks run: every one that judges an answer against the document.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    let Some(schemathesis) = schemathesis() else { return };
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    model.set_responder(|_| Reply::text("It is 84."));
    // The tenant, person and agent the document's examples name (a fresh install's), behind a
    // key bound to that tenant; MCP served too, so every route of the document answers.
    let digest = toolgraph_server::auth::hash_api_key(KEY);
    let config = format!(
        "[server]\nauth = \"api_key\"\n[server.api_keys]\ndefault = \"{digest}\"\n[server.api_key_tenants]\ndefault = 1\n\
         [mcp]\nhttp = true\n[rag]\nembedding = \"none\"\n[agents.assistant]\nsystem_prompt = \"You are the assistant.\"\n\
         tools = [\"calculator\", \"note_write\"]\n"
    );
    let (_serve, base, dir) = serve_in(tempfile::tempdir().unwrap(), &model, &config, &[]).await;

    let document: Value = reqwest::get(format!("{base}/openapi.json")).await.unwrap().json().await.unwrap();
    let operations: BTreeSet<String> = document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| item.as_object().unwrap().keys().map(move |m| format!("{} {path}", m.to_uppercase())))
        .collect();
    assert!(operations.len() >= 50, "{operations:?}");
    // `toolgraph openapi` prints the same document without a server.
    let printed =
        Command::new(env!("CARGO_BIN_EXE_toolgraph")).arg("openapi").current_dir(dir.path()).output().unwrap();
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&printed.stdout).unwrap(), document);

    let report = dir.path().join("schemathesis.ndjson");
    let mut cmd = Command::new(schemathesis);
    cmd.args(["run", &format!("{base}/openapi.json"), "--checks", CHECKS])
        .args(["--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "12", "--seed", "7"])
        .args(["--workers", "1", "--request-timeout", "30", "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {KEY}"), "-H", "X-Tenant-Slug: default", "-H", "X-User-Id: 1"])
        .args(["--report", "ndjson", "--report-ndjson-path"])
        .arg(&report)
        .current_dir(dir.path());
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let printed = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "schemathesis found answers outside the document:\n{printed}");

    // It called every operation, and judged answers that were not refusals on the routes that
    // do the main work (a run that only met 4xx would check little of the document).
    let mut statuses: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for line in std::fs::read_to_string(&report).unwrap().lines().filter(|l| !l.trim().is_empty()) {
        collect(&serde_json::from_str(line).unwrap(), &mut statuses);
    }
    statuses.remove("Stateful tests");
    // Every operation but the document's own, which schemathesis reads rather than tests.
    let called: BTreeSet<String> = statuses.keys().cloned().collect();
    let expected: BTreeSet<String> = operations.into_iter().filter(|op| op != "GET /openapi.json").collect();
    assert_eq!(called, expected, "{printed}");
    let accepted: Vec<&String> =
        statuses.iter().filter(|(_, codes)| codes.iter().any(|c| (200..300).contains(c))).map(|(op, _)| op).collect();
    for op in [
        "POST /api/chatbot/stream",
        "POST /threads/{thread_id}/runs/stream",
        "POST /runs/wait",
        "POST /v1/chat/completions",
        "POST /ag-ui/{agent}",
        "PUT /store/items",
        "GET /threads/{thread_id}/state",
        "GET /api/chatbot/conversations",
    ] {
        assert!(accepted.iter().any(|a| *a == op), "{op} was never answered 2xx: {statuses:?}");
    }
}

/// The status codes each operation (`METHOD /path`) answered, from one event of schemathesis's
/// NDJSON report: a finished scenario's recorder holds its label and each case's interaction.
fn collect(event: &Value, statuses: &mut BTreeMap<String, BTreeSet<u16>>) {
    let Some(recorder) = event.get("ScenarioFinished").map(|s| &s["recorder"]) else { return };
    let Some(label) = recorder["label"].as_str() else { return };
    for interaction in recorder["interactions"].as_object().into_iter().flat_map(|m| m.values()) {
        if let Some(code) = interaction["response"]["status_code"].as_u64().and_then(|c| u16::try_from(c).ok()) {
            statuses.entry(label.to_owned()).or_default().insert(code);
        }
    }
}
