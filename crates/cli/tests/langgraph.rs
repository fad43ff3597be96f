//! Interoperability: `toolgraph serve`'s LangGraph assistants, threads and runs
//! (docs/langgraph.md) driven by an implementation nobody here wrote, LangGraph's Python SDK
//! (PyPI `langgraph-sdk`, installed by `scripts/interop-deps`), with a tenant-bound API key.

mod common;
use common::{client_json, serve_with_key};

use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use toolgraph_testkit::interop::{langgraph_js, langgraph_python};

const KEY: &str = "sk-test-langgraph-door";

/// LangGraph's Python SDK running `tests/interop/SCRIPT` against `base` with the test's key.
fn sdk_script(python: &std::path::Path, script: &str, base: &str) -> Command {
    let mut client = Command::new(python);
    client.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop").join(script)).arg(base).arg(KEY);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_finds_and_reads_the_agents_as_assistants() {
    let Some(python) = langgraph_python() else { return };
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    let (mut serve, base, _dir) = serve_with_key(&model, KEY, true, &[]).await;
    let client = sdk_script(&python, "langgraph_client.py", &base);
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

/// LangGraph's store through its Python SDK: each person's own items, found by namespace,
/// filter and words, listed by namespace, expiring unless read, deleted, and bad input refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_keeps_searches_and_expires_a_persons_store_items() {
    let Some(python) = langgraph_python() else { return };
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    let (mut serve, base, _dir) = serve_with_key(&model, KEY, true, &[]).await;
    let client = sdk_script(&python, "langgraph_store.py", &base);
    let saw = client_json(client).await;
    let _ = serve.kill();
    let _ = serve.wait();

    let got = &saw["got"];
    assert_eq!((&got["namespace"], &got["key"]), (&json!(["prefs"]), &json!("lang")), "{got}");
    assert_eq!(got["value"], json!({"text": "Prefers answers in Spanish", "kind": "lang", "n": 1}));
    assert!(got["created_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{got}");
    assert_eq!(saw["other_got"]["status"], 404, "another person of the tenant sees none of it");
    assert_eq!(saw["other_search"], json!([]));
    // A prefix holds its namespace and those below it, not one that only starts alike; the
    // most recently written first.
    assert_eq!(saw["under_prefs"], json!(["class", "lang"]));
    assert_eq!(saw["family"], json!(["other", "class"]));
    assert_eq!(saw["n_over_1"], json!(["other", "class"]));
    assert_eq!(saw["words"], json!([["lang", 1.0]]), "only the item holding the words");
    assert_eq!(saw["paged"], json!(["class"]));
    assert_eq!(saw["namespaces"], json!([["prefs"], ["prefs", "school"], ["prefsx"]]));
    assert_eq!(saw["namespaces_prefs"], json!([["prefs"]]));

    assert_eq!(saw["alive_at_2"], "brief");
    assert_eq!(saw["alive_at_4"], "brief", "the read at 2 s renewed its 3 s");
    assert_eq!(saw["gone_at_6"]["status"], 404, "unread since 4 s: expired");
    assert_eq!(saw["deleted"]["status"], 404);
    for (case, field) in [("bad_namespace", "namespace"), ("bad_ttl", "ttl"), ("bad_filter", "filter")] {
        let refused = &saw[case];
        assert_eq!(refused["status"], 422, "{case}: {refused}");
        assert!(refused["body"].to_string().contains(field), "{case}: {refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_runs_turns_on_threads_and_decides_their_interrupts() {
    let Some(python) = langgraph_python() else { return };
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::text("Son 42."),
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Examen", "body": "El viernes."}))]),
        Reply::text("Nota guardada."),
        Reply::tool_calls(&[("n2", "note_write", json!({"title": "Repaso", "body": "El jueves."}))]),
        Reply::text("¡Hola!"),
        Reply::text("¡Adiós!"),
        Reply::text("¡De nada!"),
        // A model that takes its time: the run is cancelled while it waits.
        Reply::Stream(vec![Step::Pause(Duration::from_secs(10)), Step::Text("Tarde.".into()), Step::Done]),
        Reply::text("Aquí estoy."),
        // Slow again: this run is cancelled with `rollback`.
        Reply::Stream(vec![Step::Pause(Duration::from_secs(10)), Step::Text("Tampoco.".into()), Step::Done]),
        Reply::status(400, "the model refuses"),
        Reply::status(400, "the model refuses again"),
    ])
    .await
    .unwrap();
    let (mut serve, base, dir) = serve_with_key(&model, KEY, true, &[]).await;
    let client = sdk_script(&python, "langgraph_threads.py", &base);
    let saw = client_json(client).await;
    let requests = model.requests();
    let _ = serve.kill();
    let _ = serve.wait();

    // A thread made with its metadata, idle and empty until its first run.
    let created = &saw["created"];
    let tid = created["thread_id"].as_str().unwrap().to_owned();
    assert_eq!(tid.len(), 36, "a UUID: {created}");
    assert_eq!((created["metadata"].clone(), created["status"].clone()), (json!({"course": "iv"}), json!("idle")));
    assert_eq!(created["values"]["messages"], json!([]));
    assert_eq!(saw["got"]["thread_id"], tid.as_str());
    assert_eq!(saw["again"]["status"], 409, "{}", saw["again"]);
    let again = &saw["again_do_nothing"];
    assert_eq!((again["thread_id"].as_str(), &again["metadata"]), (Some(tid.as_str()), &json!({"course": "iv"})));

    // The first run streamed in three modes: its id first, the person's message in the first
    // values, the calculator's call and result as updates and as messages, the reply as
    // message chunks, and the final values with the whole turn.
    let parts = saw["first_run"].as_array().unwrap();
    let events: Vec<&str> = parts.iter().map(|p| p["event"].as_str().unwrap()).collect();
    assert_eq!(events[0], "metadata", "{events:?}");
    assert!(parts[0]["data"]["run_id"].is_string());
    let first_values = parts.iter().find(|p| p["event"] == "values").unwrap();
    assert_eq!(first_values["data"]["messages"][0]["type"], "human");
    assert_eq!(first_values["data"]["messages"][0]["content"], "¿Cuánto es 6 por 7?");
    let updates: Vec<&Value> = parts.iter().filter(|p| p["event"] == "updates").map(|p| &p["data"]).collect();
    assert_eq!(updates[0]["agent"]["messages"][0]["tool_calls"][0]["name"], "calculator", "{updates:?}");
    assert_eq!(updates[0]["agent"]["messages"][0]["tool_calls"][0]["args"], json!({"expression": "6*7"}));
    assert_eq!(updates[1]["tools"]["messages"][0]["tool_call_id"], "c1");
    assert!(updates[1]["tools"]["messages"][0]["content"].as_str().unwrap().contains("42"), "{updates:?}");
    assert_eq!(chunks_said(parts), "Son 42.");
    let last = parts.last().unwrap();
    assert_eq!(last["event"], "values", "{events:?}");
    let kinds: Vec<&str> =
        last["data"]["messages"].as_array().unwrap().iter().map(|m| m["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["human", "ai", "tool", "ai"]);
    assert_eq!(last["data"]["messages"][3]["content"], "Son 42.");
    assert_eq!(saw["state"]["values"]["messages"], last["data"]["messages"], "the thread's state is the run's end");
    // The values after each step, as LangGraph sends them: the model's call, then the tool's
    // result — the same messages, with the same ids, as the run's end holds.
    let steps: Vec<&Value> = parts.iter().filter(|p| p["event"] == "values").map(|p| &p["data"]["messages"]).collect();
    let kinds_of =
        |m: &Value| m.as_array().unwrap().iter().map(|m| m["type"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(steps.iter().map(|m| kinds_of(m).len()).collect::<Vec<_>>(), [1, 2, 3, 4], "{steps:?}");
    for step in &steps[1..3] {
        for (i, m) in step.as_array().unwrap().iter().enumerate() {
            let end = &last["data"]["messages"][i];
            assert_eq!(
                (&m["id"], &m["type"], &m["tool_calls"]),
                (&end["id"], &end["type"], &end["tool_calls"]),
                "{step}"
            );
        }
    }
    assert_eq!(steps[2][2]["tool_call_id"], "c1");
    assert_eq!(saw["state"]["next"], json!([]));

    // The run read again (as the SDK rejoins it after a dropped connection): its status, its
    // events from the first — the same reply and end — and after the event `Last-Event-ID`
    // names, only what followed; an unknown run is a 404.
    assert_eq!(saw["run"]["status"], "success", "{}", saw["run"]);
    let chunks = |parts: &Value| chunks_said(parts.as_array().unwrap());
    assert_eq!(chunks(&saw["joined"]), "Son 42.");
    let joined = saw["joined"].as_array().unwrap();
    assert_eq!(joined.last().unwrap()["data"]["messages"], last["data"]["messages"], "the same end");
    assert!(joined.iter().all(|p| p["id"].is_string()), "every event names its frame: {joined:?}");
    let seq = |p: &Value| p["id"].as_str().and_then(|i| i.parse::<u64>().ok()).unwrap();
    let from: u64 = saw["first_chunk_id"].as_str().unwrap().parse().unwrap();
    let after = saw["joined_after"].as_array().unwrap();
    assert!(!after.is_empty() && after.iter().all(|p| seq(p) > from), "{after:?}");
    assert!(after.iter().all(|p| p["event"] == "messages"), "the mode asked for: {after:?}");
    assert_eq!(chunks(&saw["joined_after"]), "Son 42.", "the reply came after the call's chunk");
    assert_eq!(saw["join_unknown"]["status"], 404, "{}", saw["join_unknown"]);

    // A copy holds the same metadata and conversation under its own id; deleting it leaves the
    // original whole. A thread paused for a decision is not copied.
    let copied = &saw["copied"];
    assert_ne!(copied["thread_id"], tid.as_str());
    assert_eq!(copied["metadata"], json!({"course": "iv"}));
    let texts = |messages: &Value| -> Vec<Value> {
        messages.as_array().unwrap().iter().map(|m| json!([m["type"], m["content"]])).collect()
    };
    assert_eq!(texts(&copied["values"]["messages"]), texts(&last["data"]["messages"]), "{copied}");
    assert_eq!(saw["original_after_copy"]["values"]["messages"], last["data"]["messages"]);
    assert_eq!(saw["copy_paused"]["status"], 409, "{}", saw["copy_paused"]);

    // A write pauses the run: its values end on the interrupt, in LangChain's
    // human-in-the-loop shape, and the thread says it is interrupted.
    let paused = &saw["paused"];
    let interrupt = &paused["__interrupt__"][0];
    assert!(interrupt["id"].as_str().unwrap().starts_with("approval-"), "{paused}");
    let request = &interrupt["value"]["action_requests"][0];
    assert_eq!((request["name"].as_str(), request["args"]["title"].as_str()), (Some("note_write"), Some("Examen")));
    assert_eq!(
        interrupt["value"]["review_configs"][0]["allowed_decisions"],
        json!(["approve", "edit", "reject", "respond"])
    );
    assert_eq!(saw["interrupted"]["status"], "interrupted");
    // Keyed by the task that waits, as the state's tasks name it; not in the values.
    let waiting = saw["interrupted"]["interrupts"].as_object().unwrap();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let (task, interrupts) = waiting.iter().next().unwrap();
    assert_eq!(interrupts[0]["id"], interrupt["id"]);
    assert!(saw["interrupted"]["values"].get("__interrupt__").is_none(), "{}", saw["interrupted"]);
    assert!(task.starts_with(saw["interrupted"]["thread_id"].as_str().unwrap()), "{task}");

    // Approved: the resumed run streams as a turn does — its nodes (`tasks`), the write's result
    // as the tools node's update, the reply's tokens — and is a run of the thread; the note is
    // written and the reply ends the run; deciding again finds nothing to decide (409), nothing
    // runs twice.
    let resumed = saw["resumed"].as_array().unwrap();
    assert_eq!(resumed[0]["event"], "metadata");
    let resumed_run = resumed[0]["data"]["run_id"].as_str().unwrap();
    assert!(
        saw["runs_after_resume"].as_array().unwrap().iter().any(|r| r == resumed_run),
        "{}",
        saw["runs_after_resume"]
    );
    assert_eq!(chunks_said(resumed), "Nota guardada.", "{resumed:?}");
    let wrote = resumed.iter().find_map(|p| {
        let m = p["data"].as_object()?.values().find_map(|u| u["messages"].as_array()?.first().cloned())?;
        (p["event"] == "updates" && m["type"] == "tool").then_some(m)
    });
    assert_eq!(wrote.as_ref().map(|m| m["tool_call_id"].clone()), Some(json!("n1")), "{resumed:?}");
    let tasks: Vec<&str> = resumed
        .iter()
        .filter(|p| p["event"] == "tasks" && p["data"].get("result").is_some())
        .filter_map(|p| p["data"]["name"].as_str())
        .collect();
    assert!(tasks.contains(&"agent") && tasks.len() >= 2, "the resumed run's nodes: {tasks:?}");
    let end = &resumed.last().unwrap()["data"];
    assert!(end.get("__interrupt__").is_none(), "{end}");
    assert_eq!(end["messages"].as_array().unwrap().last().unwrap()["content"], "Nota guardada.");
    let notes = std::fs::read_dir(dir.path().join("notes")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(saw["resume_again"]["status"], 409, "{}", saw["resume_again"]);
    assert!(saw["resume_again"]["body"].to_string().contains("waits for no decision"));

    // Paused again, streamed in `tasks`: the node that paused ends with the interrupt the thread
    // waits on.
    let paused_tasks = saw["paused_tasks"].as_array().unwrap();
    let paused_in = paused_tasks
        .iter()
        .find(|p| p["event"] == "tasks" && !p["data"]["interrupts"].as_array().is_none_or(Vec::is_empty))
        .unwrap_or_else(|| panic!("a task result with its interrupts: {paused_tasks:?}"));
    let asked = &paused_in["data"]["interrupts"][0];
    assert_eq!(asked["value"]["action_requests"][0]["name"], "note_write", "{paused_in}");
    assert!(asked["id"].as_str().is_some_and(|id| id.starts_with("approval-")), "{paused_in}");
    // An `edit` whose arguments do not fit the tool's schema is refused, naming why, and decides
    // nothing; a rejection cancels the write, said as the agent says it on every door.
    assert_eq!(saw["edit"]["status"], 422, "{}", saw["edit"]);
    assert!(saw["edit"]["body"].to_string().contains("do not fit the tool"), "{}", saw["edit"]);
    assert_eq!(saw["edit_by_id"]["status"], 422, "an edit by interrupt id too: {}", saw["edit_by_id"]);
    assert_eq!(saw["other_assistant"]["status"], 422, "{}", saw["other_assistant"]);
    assert!(saw["other_assistant"]["body"].to_string().contains("talks to assistant 'assistant'"));
    // Rejected by a run started in the background: joined for the values it left.
    assert!(["running", "success"].contains(&saw["rejecting"]["status"].as_str().unwrap()), "{}", saw["rejecting"]);
    assert_eq!(saw["rejecting_got"]["status"], "success", "{}", saw["rejecting_got"]);
    let rejected = &saw["rejected"];
    assert!(rejected.get("__interrupt__").is_none(), "{rejected}");
    let said = rejected["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap();
    assert!(said.starts_with("Cancelled, nothing was changed") && said.contains("Repaso"), "{said}");
    assert_eq!(notes, 1, "only the approved note was written");

    // Stateless runs answer on a thread of their own, deleted when they end (the count below
    // holds only the two threads made); there is nothing for one to resume.
    let last_said = |values: &Value| values["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone());
    assert_eq!(last_said(&saw["stateless_wait"]), Some(json!("¡Hola!")), "{}", saw["stateless_wait"]);
    let streamed = saw["stateless_stream"].as_array().unwrap();
    assert!(streamed[0]["data"]["thread_id"].is_string(), "{streamed:?}");
    let said: String =
        streamed.iter().filter(|p| p["event"] == "messages").filter_map(|p| p["data"][0]["content"].as_str()).collect();
    assert_eq!(said, "¡Adiós!");
    let kept = saw["kept_state"]["values"]["messages"].as_array().unwrap();
    assert_eq!(kept.last().unwrap()["content"], "¡De nada!", "the kept thread holds its turn: {kept:?}");
    assert_eq!(saw["stateless_resume"]["status"], 422, "{}", saw["stateless_resume"]);
    assert_eq!(saw["stateless_bad_mode"]["status"], 422, "{}", saw["stateless_bad_mode"]);
    assert_eq!(saw["stateless_too_long"]["status"], 422, "{}", saw["stateless_too_long"]);

    // A run cancelled while its model was slow: at once, with an error event saying so; its
    // status is `interrupted`, as LangGraph's; the thread takes the next run. An unknown run is refused.
    assert!(saw["cancel_seconds"].as_f64().unwrap() < 5.0, "{}", saw["cancel_seconds"]);
    let events: Vec<&str> = saw["cancelled_events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(events.last(), Some(&"error"), "{events:?}");
    assert!(saw["cancelled_error"].to_string().contains("cancelled"), "{}", saw["cancelled_error"]);
    assert_eq!(saw["cancelled_status"], "interrupted", "ended (and said why) when `wait` answered");
    // The thread says the turn was stopped (no word of the model's late text), and is idle.
    let state = &saw["cancelled_state"];
    let messages = state["values"]["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"], toolgraph_agents::kit::INTERRUPTED_REPLY, "{state}");
    assert!(!state.to_string().contains("Tarde"), "{state}");
    assert_eq!(state["next"], json!([]), "{state}");
    assert_eq!(last_said(&saw["after_cancel"]), Some(json!("Aquí estoy.")), "{}", saw["after_cancel"]);
    assert_eq!(saw["cancel_unknown"]["status"], 404, "{}", saw["cancel_unknown"]);
    // Cancelled with `rollback`: the thread is as it was before the run, which is gone; an
    // earlier run cannot be rolled back.
    assert_eq!(saw["rolled_back_state"], saw["before_rollback"], "{}", saw["rolled_back_state"]);
    let asked_slowly = saw["rolled_back_state"].to_string().matches("cuéntame algo largo").count();
    assert_eq!(asked_slowly, 1, "the first cancelled run's question stays, the rolled-back one's went");
    assert_eq!(saw["rolled_back_get"]["status"], 404, "{}", saw["rolled_back_get"]);
    assert_eq!(saw["rollback_earlier"]["status"], 409, "{}", saw["rollback_earlier"]);

    // Search, count, update, history: the owner's threads.
    let other = saw["other_thread"].as_str().unwrap();
    assert_eq!(saw["search"], json!([tid]), "metadata filters");
    assert_eq!(saw["count"], 2);
    assert_eq!(saw["idle"], json!([other, tid]), "the latest changed first");
    assert_eq!(saw["updated"]["metadata"], json!({"course": "iv", "term": "2026"}), "metadata merges");
    assert_eq!(saw["untracked"]["status"], 422, "a status not tracked is named: {}", saw["untracked"]);
    assert_eq!(saw["too_much_metadata"]["status"], 422, "{}", saw["too_much_metadata"]);
    let history = saw["history"].as_array().unwrap();
    assert_eq!(history.len(), 3, "the limit holds");
    let step = |s: &Value| s["metadata"]["step"].as_u64().unwrap();
    assert!(step(&history[0]) > step(&history[1]) && step(&history[1]) > step(&history[2]), "newest first");
    for pair in history.windows(2) {
        assert_eq!(pair[0]["parent_checkpoint"], pair[1]["checkpoint"], "each one's parent is the one before");
    }

    // Another person, even with the tenant's key, finds nothing; a mode not served is named;
    // a deleted thread is gone.
    assert_eq!(saw["other_user"]["status"], 404, "{}", saw["other_user"]);
    assert_eq!(saw["other_user_run"]["status"], 404, "{}", saw["other_user_run"]);
    assert_eq!(saw["unknown_mode"]["status"], 422, "{}", saw["unknown_mode"]);
    assert!(saw["unknown_mode"]["body"].to_string().contains("`events` is not served"));
    assert_eq!(saw["deleted"]["status"], 404);

    // A failed run: its stream ends with an `error` event, its status is `error`, and a waiting
    // client gets a 502 naming the failure.
    let failed: Vec<&str> = saw["failed_events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(failed.last(), Some(&"error"), "{failed:?}");
    assert_eq!(saw["failed_status"], "error");
    assert_eq!(saw["failed_wait"]["status"], 502, "{}", saw["failed_wait"]);
    assert_eq!(requests.len(), 13, "every scripted reply was asked for once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_runs_in_the_background_and_says_what_a_second_run_does_while_one_is_busy() {
    let Some(python) = langgraph_python() else { return };
    let slow = |pause: u64, text: &str| {
        Reply::Stream(vec![
            Step::Pause(Duration::from_secs(pause)),
            Step::Text(text.into()),
            Step::Finish("stop".into()),
            Step::Done,
        ])
    };
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    // Each turn's reply by what the person said: runs that overlap may reach the model in
    // either order.
    model.set_responder(move |request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        // After a tool's result (or what stood in for it), the model says what it read.
        if let Some(last) = messages.last().filter(|m| m["role"] == "tool") {
            return Reply::text(&format!("Leído: {}", last["content"].as_str().unwrap_or("")));
        }
        let said =
            messages.iter().rev().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()).unwrap_or("");
        let write = |id: &str, title: &str, body: &str| {
            Reply::tool_calls(&[(id, "note_write", json!({ "title": title, "body": body }))])
        };
        match said {
            "apunta el examen" => write("w1", "Examen", "El viernes."),
            "apunta el repaso" => write("w2", "Repaso", "El jueves."),
            "apunta la tutoría" => write("w3", "Tutoria", "El lunes."),
            "apunta la cena" => write("w6", "Cena", "A las nueve."),
            "apunta el desayuno" => write("w7", "Desayuno", "A las siete."),
            "apunta dos" => Reply::tool_calls(&[
                ("w4", "note_write", json!({ "title": "Uno", "body": "1" })),
                ("w5", "note_write", json!({ "title": "Dos", "body": "2" })),
            ]),
            // Interrupted by the next run: its text never arrives.
            "cuéntame algo largo" => slow(8, "Tarde."),
            "¿sigues?" => Reply::text("Sigo aquí."),
            // Enqueued behind: the next run starts once this one has ended.
            "despacio" => slow(2, "Despacio."),
            "y después" => Reply::text("Después."),
            _ => Reply::text("¡Hola!"),
        }
    });
    let (mut serve, base, dir) = serve_with_key(&model, KEY, true, &[]).await;
    let client = sdk_script(&python, "langgraph_runs.py", &base);
    let saw = client_json(client).await;
    let _ = serve.kill();
    let _ = serve.wait();
    let said = |values: &Value| -> Vec<(String, String)> {
        values["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["type"].as_str().unwrap_or("").to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
            .collect()
    };
    let pair = |kind: &str, text: &str| (kind.to_owned(), text.to_owned());

    // In the background: the run answered at once as running (or already done), joined for the
    // thread's values, then read and listed with its assistant.
    let created = &saw["created"];
    let run_id = created["run_id"].as_str().unwrap();
    assert_eq!(created["assistant_id"], "assistant", "{created}");
    assert!(["running", "success"].contains(&created["status"].as_str().unwrap()), "{created}");
    assert_eq!(said(&saw["joined"]), [pair("human", "hola"), pair("ai", "¡Hola!")], "{}", saw["joined"]);
    assert_eq!(saw["got"]["status"], "success", "{}", saw["got"]);
    assert_eq!(saw["got"]["assistant_id"], "assistant");
    assert_eq!(saw["listed"].as_array().map(Vec::len), Some(1), "{}", saw["listed"]);
    assert_eq!(saw["listed"][0]["run_id"], run_id);
    assert_eq!(saw["listed_success"], json!([run_id]), "filtered by status");
    assert_eq!(saw["listed_error"], json!([]));
    assert_eq!(saw["listed_unknown"]["status"], 422, "{}", saw["listed_unknown"]);
    assert_eq!(saw["on_run_created"], json!([run_id]), "Content-Location names the run");
    // A resume in the background when nothing waits: refused as on every run route.
    assert_eq!(saw["resume_in_background"]["status"], 409, "{}", saw["resume_in_background"]);
    assert_eq!(saw["resume_in_background"]["body"]["field"], "command.resume");
    assert_eq!(saw["join_unknown"]["status"], 404, "{}", saw["join_unknown"]);
    // Stateless: a thread of its own, deleted once the run ended, or kept and joined.
    assert!(saw["stateless"]["thread_id"].as_str().is_some_and(|t| t.len() == 36), "{}", saw["stateless"]);
    assert_eq!(saw["stateless_gone"], true, "the run's thread went once the run ended");
    assert_eq!(said(&saw["kept_joined"]), [pair("human", "hola sin hilo"), pair("ai", "¡Hola!")]);

    // A slow run: the thread is busy; another run is refused unless it says what to do.
    assert_eq!(saw["busy_seen"], true, "the thread read busy while its run ran");
    assert_eq!(saw["busy_search"].as_array().map(Vec::len), Some(1), "{}", saw["busy_search"]);
    assert_eq!(saw["reject"]["status"], 409, "{}", saw["reject"]);
    assert!(saw["reject"]["body"]["error"].as_str().unwrap().contains("already running"), "{}", saw["reject"]);
    assert_eq!(saw["unknown_strategy"]["status"], 422, "{}", saw["unknown_strategy"]);
    // `interrupt`: the slow run stopped at once (its 8 s pause never ran out), this run answered.
    assert!(saw["interrupt_seconds"].as_f64().unwrap() < 6.0, "{}", saw["interrupt_seconds"]);
    let interrupting = said(&saw["interrupting"]);
    assert_eq!(interrupting.last(), Some(&pair("ai", "Sigo aquí.")), "{interrupting:?}");
    assert!(!saw["interrupting"].to_string().contains("Tarde"), "{}", saw["interrupting"]);
    assert_eq!(saw["interrupted_status"], "interrupted");
    let statuses: Vec<&str> =
        saw["after_interrupt"].as_array().unwrap().iter().map(|r| r[1].as_str().unwrap()).collect();
    assert_eq!(statuses, ["success", "interrupted"], "newest first: {}", saw["after_interrupt"]);
    assert_eq!(saw["strategies"], json!(["interrupt", "reject"]), "what each run was started with");
    assert_eq!(saw["idle_after"], "idle");

    // `rollback`: the slow run went with what it wrote; the thread holds this run's turn only.
    assert_eq!(
        said(&saw["rolled_back"]),
        [pair("human", "¿sigues?"), pair("ai", "Sigo aquí.")],
        "{}",
        saw["rolled_back"]
    );
    assert_eq!(saw["rolled_back_run"]["status"], 404, "{}", saw["rolled_back_run"]);
    assert_eq!(saw["rolled_back_runs"], json!(["rollback"]), "one run left, started with `rollback`");

    // `enqueue`: started once the run ahead ended; both turns are in the thread.
    assert!(saw["enqueue_seconds"].as_f64().unwrap() >= 1.0, "it waited: {}", saw["enqueue_seconds"]);
    assert_eq!(
        said(&saw["enqueued"]),
        [pair("human", "despacio"), pair("ai", "Despacio."), pair("human", "y después"), pair("ai", "Después.")],
        "{}",
        saw["enqueued"]
    );
    assert_eq!(saw["ahead_status"], "success");

    // Decisions in LangChain's human-in-the-loop format. An edit that does not fit the tool's
    // schema is refused before anything is recorded (the thread still waits); one that fits
    // runs with the person's arguments.
    let last_said =
        |values: &Value| values["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].to_string());
    let notes = dir.path().join("notes/demo/1");
    assert_eq!(saw["edit_invalid"]["status"], 422, "{}", saw["edit_invalid"]);
    assert_eq!(saw["edit_invalid"]["body"]["field"], "command.resume");
    assert!(saw["edit_invalid"]["body"]["error"].as_str().unwrap().contains("body"), "{}", saw["edit_invalid"]);
    assert_eq!(saw["still_waiting"], "interrupted");
    let examen = std::fs::read_to_string(notes.join("examen.md")).expect("the edited note was written");
    assert!(examen.contains("El sábado.") && !examen.contains("El viernes."), "{examen}");
    assert!(last_said(&saw["edited"]).unwrap().contains("examen.md"), "{}", saw["edited"]);
    // A rejection with a message: nothing is written, and the model reads the message (no
    // cancellation said for it).
    let rejected = last_said(&saw["rejected_with_message"]).unwrap();
    assert!(rejected.contains("No, mejor mañana.") && !rejected.contains("Cancelled"), "{rejected}");
    assert!(!notes.join("repaso.md").exists());
    // A response in the call's place: nothing is written, the model reads the person's answer.
    let responded = last_said(&saw["responded"]).unwrap();
    assert!(responded.contains("Ya la apunté yo.") && responded.contains("not executed"), "{responded}");
    assert!(!notes.join("tutoria.md").exists());
    // Two writes in one pause, decided in two requests: the first's edit is kept with the run's
    // checkpoints, and the run the second resumes runs the edited write.
    assert!(saw["partial_edit"].get("__interrupt__").is_some(), "the other still waits: {}", saw["partial_edit"]);
    assert_eq!(saw["after_partial"].as_array().map(Vec::len), Some(1), "{}", saw["after_partial"]);
    let uno = std::fs::read_to_string(notes.join("uno.md")).expect("the edited write ran");
    assert!(uno.contains("uno, editado"), "{uno}");
    assert!(!notes.join("dos.md").exists(), "the rejected one did not");
    assert!(last_said(&saw["both"]).unwrap().contains("arguments_edited_by_user"), "{}", saw["both"]);
    // agent-chat-ui's responses (agent-inbox's format, a list): accept, and an edit in `args`.
    let cena = std::fs::read_to_string(notes.join("cena.md")).expect("the accepted write ran");
    assert!(cena.contains("A las nueve."), "{cena}");
    let desayuno = std::fs::read_to_string(notes.join("desayuno.md")).expect("the edited write ran");
    assert!(desayuno.contains("A las ocho.") && !desayuno.contains("A las siete."), "{desayuno}");
    assert!(last_said(&saw["inbox_edited"]).unwrap().contains("arguments_edited_by_user"));
}

/// A thread's runs as its checkpoints record them: listed and read after the server restarted
/// (no replica keeps their logs then) with the status, assistant and `multitask_strategy` each
/// had — a pause `interrupted` until a resume, which lists as a run of its own (and, resumed by
/// `runs.wait`, is joined like any run), a run stopped by the recursion limit `error` before and
/// after — while a copy of the thread lists none of the original's runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_threads_runs_are_listed_from_its_checkpoints_after_a_restart() {
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    model.set_responder(|request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        // A model that never stops calling a tool: its run ends at the recursion limit.
        if messages.iter().any(|m| m["content"] == "calcula sin parar") {
            return Reply::tool_calls(&[(
                &format!("c{}", messages.len()),
                "calculator",
                json!({ "expression": "1+1" }),
            )]);
        }
        match messages.last() {
            Some(m) if m["role"] == "tool" => Reply::text("Apuntado."),
            Some(m) if m["content"] == "apunta el examen" => {
                Reply::tool_calls(&[("w1", "note_write", json!({ "title": "Examen", "body": "El viernes." }))])
            }
            _ => Reply::text("¡Hola!"),
        }
    });
    let (mut serve, base, dir) = serve_with_key(&model, KEY, false, &[]).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let asked = |method: reqwest::Method, url: String| request_as_demo(&http, method, url);
    let call = |method: reqwest::Method, url: String, body: Option<Value>| call_as_demo(&http, method, url, body);
    let (post, get) = (reqwest::Method::POST, reqwest::Method::GET);
    let (_, thread) = call(post.clone(), format!("{base}/threads"), Some(json!({}))).await;
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let say = |text: &str, strategy: &str| {
        json!({"assistant_id": "assistant", "multitask_strategy": strategy,
               "input": {"messages": [{"role": "user", "content": text}]}})
    };
    let wait = format!("{base}/threads/{thread}/runs/wait");
    let (status, _) = call(post.clone(), wait.clone(), Some(say("hola", "enqueue"))).await;
    assert_eq!(status, 200);
    // A copy holds the thread's checkpoints so far (a paused thread cannot be copied).
    let (status, copy) = call(post.clone(), format!("{base}/threads/{thread}/copy"), None).await;
    assert_eq!(status, 200, "{copy}");
    let copy = copy["thread_id"].as_str().unwrap().to_owned();
    let (_, paused) = call(post.clone(), wait.clone(), Some(say("apunta el examen", "reject"))).await;
    assert!(paused.get("__interrupt__").is_some(), "{paused}");
    let (_, before) = call(get.clone(), format!("{base}/threads/{thread}/runs"), None).await;
    let ids: Vec<String> =
        before.as_array().unwrap().iter().map(|r| r["run_id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids.len(), 2, "{before}");

    // A run stopped by the recursion limit: `error` here (its log ends on the fallback reply)
    // as on any replica that reads its records.
    let (_, looping) = call(post.clone(), format!("{base}/threads"), Some(json!({}))).await;
    let looping = looping["thread_id"].as_str().unwrap().to_owned();
    let (status, _) =
        call(post.clone(), format!("{base}/threads/{looping}/runs/wait"), Some(say("calcula sin parar", "reject")))
            .await;
    assert_eq!(status, 200);
    let (_, stopped) = call(get.clone(), format!("{base}/threads/{looping}/runs"), None).await;
    assert_eq!(stopped[0]["status"], "error", "{stopped}");

    let (mut serve2, base2, dir) = restarted(&mut serve, dir, &model).await;
    let runs_of =
        |base: &str, thread: &str, query: &str| call(get.clone(), format!("{base}/threads/{thread}/runs{query}"), None);
    let (status, after) = runs_of(&base2, &thread, "").await;
    assert_eq!(status, 200, "{after}");
    let seen = |runs: &Value| -> Vec<(String, String, String, String)> {
        runs.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                (field("run_id"), field("status"), field("assistant_id"), field("multitask_strategy"))
            })
            .collect()
    };
    let run = |id: &str, status: &str, strategy: &str| {
        (id.to_owned(), status.to_owned(), "assistant".to_owned(), strategy.to_owned())
    };
    assert_eq!(
        seen(&after),
        [run(&ids[0], "interrupted", "reject"), run(&ids[1], "success", "enqueue")],
        "newest first, as before the restart: {after} (before: {before})"
    );
    assert!(after[0]["created_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{after}");
    assert_eq!(after[0]["thread_id"], thread.as_str());
    let (status, one) = call(get.clone(), format!("{base2}/threads/{thread}/runs/{}", ids[1]), None).await;
    assert_eq!((status, seen(&json!([one.clone()]))), (200, vec![run(&ids[1], "success", "enqueue")]), "{one}");
    let (_, succeeded) = runs_of(&base2, &thread, "?status=success").await;
    assert_eq!(seen(&succeeded), [run(&ids[1], "success", "enqueue")]);
    let (_, limited) = runs_of(&base2, &thread, "?limit=1&offset=1").await;
    assert_eq!(seen(&limited), [run(&ids[1], "success", "enqueue")]);
    let (_, stopped_after) = runs_of(&base2, &looping, "").await;
    assert_eq!((&stopped_after[0]["run_id"], &stopped_after[0]["status"]), (&stopped[0]["run_id"], &json!("error")));
    // The copy holds the original's checkpoints, not its runs; another thread knows no run of this one's.
    let (status, copied) = runs_of(&base2, &copy, "").await;
    assert_eq!((status, copied.clone()), (200, json!([])), "{copied}");
    let (status, _) = call(get.clone(), format!("{base2}/threads/{copy}/runs/{}", ids[1]), None).await;
    assert_eq!(status, 404);

    // Resumed after the restart: the resume is a run of its own, and the pause is no longer waiting.
    let approve = json!({"assistant_id": "assistant", "multitask_strategy": "interrupt",
                         "command": {"resume": {"decisions": [{"type": "approve"}]}}});
    let (status, resumed) = call(post.clone(), format!("{base2}/threads/{thread}/runs/wait"), Some(approve)).await;
    assert_eq!(status, 200, "{resumed}");
    // The run `runs.wait` resumed streamed into its log as any run: joined, its tools' update is there.
    let (_, now_listed) = runs_of(&base2, &thread, "").await;
    let resumed_id = now_listed[0]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(now_listed[0]["multitask_strategy"], "interrupt", "as the resume asked: {now_listed}");
    let join = format!("{base2}/threads/{thread}/runs/{resumed_id}/stream?stream_mode=updates");
    let joined = asked(get.clone(), join).send().await.unwrap().text().await.unwrap();
    let tools_update = joined.split("\n\n").find(|e| e.contains("event: updates") && e.contains("\"tools\""));
    assert!(tools_update.is_some_and(|e| e.contains("examen.md")), "{joined}");
    let (mut serve3, base3, _dir) = restarted(&mut serve2, dir, &model).await;
    let (_, last) = runs_of(&base3, &thread, "").await;
    let last_seen = seen(&last);
    assert_eq!(last_seen.len(), 3, "{last}");
    assert_eq!(last_seen[0].0, resumed_id, "the resume's own run first: {last}");
    let resume = &last_seen[0];
    assert_eq!((&*resume.1, &*resume.2, &*resume.3), ("success", "assistant", "interrupt"), "{last}");
    assert_eq!(last_seen[1..], [run(&ids[0], "success", "reject"), run(&ids[1], "success", "enqueue")], "{last}");
    let _ = serve3.kill();
    let _ = serve3.wait();
}

/// A request to `url` with the test's key, as tenant `demo`'s person 1.
fn request_as_demo(http: &reqwest::Client, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
    http.request(method, url).bearer_auth(KEY).header("X-Tenant-Slug", "demo").header("X-User-Id", "1")
}

/// [`request_as_demo`] with `body` as JSON: the status and the JSON answer (null when none).
async fn call_as_demo(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = request_as_demo(http, method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json::<Value>().await.unwrap_or(Value::Null))
}

/// `serve` stopped and started again on its data in `dir`.
async fn restarted(
    serve: &mut common::ServeProcess,
    dir: tempfile::TempDir,
    model: &ScriptedModelServer,
) -> (common::ServeProcess, String, tempfile::TempDir) {
    let _ = serve.kill();
    let _ = serve.wait();
    common::serve_in(dir, model, &common::api_key_config(KEY, false), &[]).await
}

/// A resume cancelled while the tool it approved runs: the run is `interrupted` and stops the
/// tool (its process group goes: nothing sent); the thread is idle, the call answered "may not
/// have been carried out" (never left without a result), here and after a restart; the next
/// turn asks again and, approved, the tool's effect happens once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_cancelled_while_its_approved_tool_runs_stops_the_tool_and_leaves_the_thread_whole() {
    let model = ScriptedModelServer::start(Vec::new()).await.unwrap();
    model.set_responder(|request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        match messages.last() {
            Some(m) if m["role"] == "tool" => Reply::text("Enviado."),
            _ => Reply::tool_calls(&[(&format!("s{}", messages.len()), "slow_send", json!({ "text": "hola equipo" }))]),
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugins/slow_send");
    std::fs::create_dir_all(&plugin).unwrap();
    // Slow the first time (3 s before it sends), at once after.
    std::fs::write(
        plugin.join("plugin.toml"),
        r#"name = "slow_send"
version = "1.0.0"
description = "Sends a text to the team."
kind = "exec"
class = "write"
describe = "Send {text}"
env = ["PATH"]
timeout_ms = 60000
[parameters.text]
type = "string"
description = "The text."
required = true
[exec]
command = "/bin/sh"
args = ["-c", "if [ ! -e started ]; then touch started; sleep 3; fi; echo sent >> sent.log; echo '{\"sent\": true}'"]
"#,
    )
    .unwrap();
    let config = common::api_key_config(KEY, false)
        .replace("tools = [\"calculator\", \"note_write\"]", "tools = [\"slow_send\"]")
        + &format!("[plugins]\ndirs = [{:?}]\n", dir.path().join("plugins"));
    let (mut serve, base, dir) = common::serve_in(dir, &model, &config, &[]).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let call = |method: reqwest::Method, url: String, body: Option<Value>| call_as_demo(&http, method, url, body);
    let (post, get) = (reqwest::Method::POST, reqwest::Method::GET);
    let (_, thread) = call(post.clone(), format!("{base}/threads"), Some(json!({}))).await;
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let say =
        json!({"assistant_id": "assistant", "input": {"messages": [{"role": "user", "content": "avisa al equipo"}]}});
    let wait = format!("{base}/threads/{thread}/runs/wait");
    let (status, paused) = call(post.clone(), wait.clone(), Some(say.clone())).await;
    assert_eq!(status, 200, "{paused}");
    assert!(paused["__interrupt__"][0]["id"].is_string(), "{paused}");
    let approve = json!({"assistant_id": "assistant", "command": {"resume": {"decisions": [{"type": "approve"}]}}});
    let (status, resumed) = call(post.clone(), format!("{base}/threads/{thread}/runs"), Some(approve.clone())).await;
    assert_eq!(status, 200, "{resumed}");
    let run = resumed["run_id"].as_str().unwrap().to_owned();
    // The tool has started (its marker is there) and is still running.
    let (started, sent) = (plugin.join("started"), plugin.join("sent.log"));
    for _ in 0..200 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(started.exists(), "the approved tool never started");
    let cancelled_at = std::time::Instant::now();
    let (status, body) =
        call(post.clone(), format!("{base}/threads/{thread}/runs/{run}/cancel?wait=1&action=interrupt"), None).await;
    assert_eq!(status, 204, "{body}");

    let look = |base: String| {
        let (thread, run, call) = (thread.clone(), run.clone(), &call);
        async move {
            let (_, got) = call(reqwest::Method::GET, format!("{base}/threads/{thread}/runs/{run}"), None).await;
            let (_, shown) = call(reqwest::Method::GET, format!("{base}/threads/{thread}"), None).await;
            (got, shown)
        }
    };
    let expect = |(got, shown): (Value, Value)| {
        assert_eq!(got["status"], "interrupted", "{got}");
        assert_eq!((&shown["status"], &shown["interrupts"]), (&json!("idle"), &json!({})), "{shown}");
        let messages = shown["values"]["messages"].as_array().unwrap();
        let answered = &messages[messages.len() - 2];
        assert_eq!((&answered["type"], &answered["tool_call_id"]), (&json!("tool"), &json!("s2")), "{shown}");
        let said = answered["content"].as_str().unwrap_or_default();
        assert!(said.contains(toolgraph_agents::kit::INTERRUPTED_CALL), "{shown}");
    };
    expect(look(base.clone()).await);
    // Another replica (here: after a restart) reads the same from the thread's checkpoints.
    let _ = serve.kill();
    let _ = serve.wait();
    let (mut serve2, base2, _dir) = common::serve_in(dir, &model, &config, &[]).await;
    expect(look(base2.clone()).await);
    // Past the moment the cancelled call would have sent: its process group went with the run.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(cancelled_at.elapsed())).await;
    assert!(!sent.exists(), "the cancelled call sent nothing");

    // The pause is over: the same decision again is refused; the next turn asks again.
    let (status, refused) =
        call(post.clone(), format!("{base2}/threads/{thread}/runs/wait"), Some(approve.clone())).await;
    assert_eq!(status, 409, "{refused}");
    let (status, asked) = call(post.clone(), format!("{base2}/threads/{thread}/runs/wait"), Some(say)).await;
    assert!(status == 200 && asked["__interrupt__"][0]["id"].is_string(), "{asked}");
    let (status, done) = call(post.clone(), format!("{base2}/threads/{thread}/runs/wait"), Some(approve)).await;
    assert_eq!(status, 200, "{done}");
    let last = done["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone());
    assert_eq!(last, Some(json!("Enviado.")), "{done}");
    assert_eq!(std::fs::read_to_string(&sent).unwrap().lines().count(), 1);
    let (_, runs) = call(get.clone(), format!("{base2}/threads/{thread}/runs"), None).await;
    let statuses: Vec<&str> = runs.as_array().unwrap().iter().filter_map(|r| r["status"].as_str()).collect();
    assert_eq!(statuses, ["success", "success", "interrupted", "success"], "newest first: {runs}");
    let _ = serve2.kill();
    let _ = serve2.wait();
}

/// A thread's state updated through the Python SDK (`update_state`, as the `agent` node), read
/// by the next turn's model, and forked by a run and by an update from an earlier checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_updates_a_threads_state_and_forks_it_from_an_earlier_checkpoint() {
    let Some(python) = langgraph_python() else { return };
    let model =
        ScriptedModelServer::start(vec![Reply::text("Son 42."), Reply::text("Son 54."), Reply::text("Son 60.")])
            .await
            .unwrap();
    let (mut serve, base, _dir) = serve_with_key(&model, KEY, false, &[]).await;
    let client = sdk_script(&python, "langgraph_state.py", &base);
    let saw = client_json(client).await;
    let requests = model.requests();
    let _ = serve.kill();
    let _ = serve.wait();

    let texts = |values: &Value| -> Vec<String> {
        values["messages"].as_array().unwrap().iter().filter_map(|m| m["content"].as_str()).map(str::to_owned).collect()
    };
    assert_eq!(saw["before_any_run"]["status"], 409, "{}", saw["before_any_run"]);
    // The update: a checkpoint after the first turn's last, written as the `agent` node.
    let end_of_first: u64 = saw["end_of_first"].as_str().unwrap().parse().unwrap();
    let updated = &saw["updated"]["checkpoint"];
    assert_eq!(updated["checkpoint_id"].as_str().map(str::parse::<u64>), Some(Ok(end_of_first + 1)), "{updated}");
    let state = &saw["state"];
    assert_eq!(texts(&state["values"]), ["¿Cuánto es 6 por 7?", "Son 42.", "Y 6 por 8 son 48."], "{state}");
    assert_eq!(state["values"]["messages"][2]["type"], "ai");
    assert_eq!((&state["checkpoint"]["checkpoint_id"], &state["next"]), (&updated["checkpoint_id"], &json!([])));
    let history = &saw["history"];
    assert_eq!(history[0]["metadata"]["source"], "agent", "{history}");
    assert_eq!(history[0]["parent_checkpoint"]["checkpoint_id"], saw["end_of_first"], "{history}");
    // The checkpoint also as LangGraph's server sends it, and its messages' `name`.
    assert_eq!(
        (&saw["updated"]["configurable"], &saw["updated"]["checkpoint_id"]),
        (updated, &updated["checkpoint_id"])
    );
    assert_eq!(state["checkpoint_id"], updated["checkpoint_id"], "{state}");
    assert_eq!(history[0]["parent_checkpoint_id"], saw["end_of_first"], "{history}");
    assert_eq!((&history[0]["checkpoint_id"], &history[0]["interrupts"]), (&updated["checkpoint_id"], &json!([])));
    assert!(state["values"]["messages"][0].as_object().is_some_and(|m| m["name"].is_null() && m.contains_key("name")));
    assert!(saw["thread"]["state_updated_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{}", saw["thread"]);
    for (case, says) in [
        ("unknown_node", "no node `nope`"),
        // A node name of any length is named by its start only, its control characters escaped.
        ("unknown_long_node", "no node `\\\\u{1b}[2Jnnn"),
        ("context", "`context` cannot be written"),
        ("tool_call", "tool calls cannot be written"),
    ] {
        let refused = &saw[case];
        assert_eq!(refused["status"], 422, "{case}: {refused}");
        assert!(refused["body"].to_string().contains(says), "{case}: {refused}");
        assert!(refused["body"].to_string().len() < 600, "{case}: {refused}");
    }
    // The next turn's model read the update; the fork's did not, nor the turn after it.
    let sent = |i: usize| requests[i]["messages"].to_string();
    assert!(sent(1).contains("Y 6 por 8 son 48."), "{}", sent(1));
    assert!(!sent(2).contains("6 por 8") && !sent(2).contains("6 por 9") && sent(2).contains("Son 42."), "{}", sent(2));
    assert_eq!(texts(&saw["second"]).last().map(String::as_str), Some("Son 54."));
    assert_eq!(texts(&saw["forked"]), ["¿Cuánto es 6 por 7?", "Son 42.", "¿Y 6 por 10?", "Son 60."]);
    let forked_history = saw["forked_history"].to_string();
    assert!(
        !forked_history.contains("6 por 8") && !forked_history.contains("6 por 9"),
        "the fork's history: {forked_history}"
    );
    // An update from that checkpoint again: another fork, with the update on it.
    assert_eq!(
        texts(&saw["state_after_earlier"]["values"]),
        ["¿Cuánto es 6 por 7?", "Son 42.", "Otra pregunta.", "Otra respuesta."]
    );
    assert_eq!(saw["no_such_checkpoint"]["status"], 404, "{}", saw["no_such_checkpoint"]);
}

/// A grounded tutor's runs streamed through the Python SDK in the modes written from its
/// nodes: `debug` (each node's task and result, each checkpoint), `tasks`, `checkpoints` and
/// `custom` (the grounding check's report) — on the bundled course corpus, ingested for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_sdk_streams_a_grounded_run_in_the_modes_of_its_nodes() {
    let Some(python) = langgraph_python() else { return };
    let model = ScriptedModelServer::start(common::course_question_replies()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let digest = toolgraph_server::auth::hash_api_key(KEY);
    let config = format!(
        "[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"{digest}\"\n[server.api_key_tenants]\ndemo = 7\n\
         [rag]\nembedding = \"none\"\ndefault_kb = \"cursos\"\n\
         [agents.tutor]\nsystem_prompt = \"Eres el tutor de la asignatura IV.\"\ntools = [\"rag_search\", \"calculator\"]\n"
    );
    let config_file = dir.path().join("toolgraph.toml");
    std::fs::write(&config_file, &config).unwrap();
    common::ingest_course_corpus(&config_file, dir.path());
    let (mut serve, base, _dir) = common::serve_in(dir, &model, &config, &[]).await;
    let saw = client_json(sdk_script(&python, "langgraph_modes.py", &base)).await;
    let _ = serve.kill();
    let _ = serve.wait();

    let of = |parts: &Value, event: &str| -> Vec<Value> {
        parts.as_array().unwrap().iter().filter(|p| p["event"] == event).map(|p| p["data"].clone()).collect()
    };
    let every = &saw["every"];
    // Sub-graphs were asked for, and the tutor hands the turn to no other agent: every event is
    // the graph's own, in no namespace (a hand-off's are: tests/declared.rs).
    let names: Vec<&str> = every.as_array().unwrap().iter().filter_map(|p| p["event"].as_str()).collect();
    assert!(names.iter().all(|e| !e.contains('|')), "{names:?}");
    // The reply, cited: the guide's section before its full stop.
    let reply = "El examen final es el 20 de enero y vale el 40 % de la nota [Guía docente";
    // `custom`: the answer's check against the guide — the sentence it cites, and the one
    // stating a date no passage holds, dropped.
    let custom = of(every, "custom");
    assert_eq!(custom.len(), 1, "{custom:?}");
    let report = &custom[0]["grounding"];
    assert!(report["cited"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["abstained"], false);
    assert!(report["dropped"][0]["sentence"].as_str().unwrap().contains("15 de octubre"), "{report}");
    // `tasks`: each node's start and result, in the order they ran.
    let tasks = of(every, "tasks");
    let names: Vec<(&str, bool)> =
        tasks.iter().map(|t| (t["name"].as_str().unwrap(), t.get("result").is_some())).collect();
    assert_eq!(
        names,
        [("agent", false), ("agent", true), ("search", false), ("search", true), ("answer", false), ("answer", true)],
        "{tasks:?}"
    );
    for pair in tasks.chunks(2) {
        assert_eq!(pair[0]["id"], pair[1]["id"], "a task's result has its id");
    }
    // The search's result: its call and the passages; the answer's: the checked reply; each
    // task's input: the values as it started.
    assert_eq!(tasks[3]["result"]["messages"][0]["tool_calls"][0]["name"], "rag_search", "{}", tasks[3]);
    assert!(tasks[3]["result"]["messages"][1]["content"].as_str().unwrap().contains("20 de enero"));
    let answered = tasks[5]["result"]["messages"][0]["content"].as_str().unwrap();
    assert!(answered.starts_with(reply) && !answered.contains("15 de octubre"), "{answered}");
    assert_eq!(tasks[4]["input"]["messages"].as_array().unwrap().len(), 3, "{}", tasks[4]["input"]);
    // The model's task: stopped at its first words, it wrote nothing.
    assert_eq!(tasks[1]["result"], json!({}), "{}", tasks[1]);
    // `checkpoints`: the run's input, then one after each node, each the parent of the next,
    // the last the thread's state — with the values and what runs next.
    let checkpoints = of(every, "checkpoints");
    let id = |c: &Value| c["configurable"]["checkpoint_id"].as_str().map(str::to_owned);
    assert_eq!(checkpoints.len(), 4, "{checkpoints:?}");
    assert_eq!(
        (&checkpoints[0]["parent_config"], &checkpoints[0]["metadata"]["source"]),
        (&Value::Null, &json!("input"))
    );
    for pair in checkpoints.windows(2) {
        assert_eq!(id(&pair[1]["parent_config"]), id(&pair[0]["config"]));
    }
    let nexts: Vec<&Value> = checkpoints.iter().map(|c| &c["next"]).collect();
    assert_eq!(nexts, [&json!(["agent"]), &json!(["search"]), &json!(["answer"]), &json!([])]);
    // Each task runs from the checkpoint before it, and is named as that checkpoint names it.
    for (i, task) in tasks.iter().step_by(2).enumerate() {
        assert_eq!(task["id"], checkpoints[i]["tasks"][0]["id"], "{task}");
        assert_eq!(task["input"], checkpoints[i]["values"], "{task}");
    }
    let last = checkpoints.last().unwrap();
    let state = &saw["every_state"];
    assert_eq!(id(&last["config"]), state["checkpoint_id"].as_str().map(str::to_owned), "{last}");
    let contents = |values: &Value| -> Vec<Value> {
        values["messages"].as_array().unwrap().iter().map(|m| m["content"].clone()).collect()
    };
    assert_eq!(contents(&last["values"]), contents(&state["values"]), "{last}");
    // The state is the history's newest checkpoint: the same id, metadata, parent and time.
    let head = &saw["every_head"];
    for key in ["checkpoint", "metadata", "parent_checkpoint", "created_at"] {
        assert!(!state[key].is_null(), "{key}: {state}");
        assert_eq!(state[key], head[key], "{key}");
    }
    // `debug`: the same tasks and checkpoints, each with its step, time and type.
    let debug = of(every, "debug");
    let kinds: Vec<&str> = debug.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "checkpoint",
            "task",
            "task_result",
            "checkpoint",
            "task",
            "task_result",
            "checkpoint",
            "task",
            "task_result",
            "checkpoint"
        ]
    );
    assert!(debug.iter().all(|d| d["timestamp"].as_str().is_some_and(|t| t.ends_with('Z'))), "{debug:?}");
    // A debug checkpoint also names itself and its parent as `checkpoint`, `parent_checkpoint`.
    let mut in_debug = debug[0]["payload"].clone();
    assert_eq!(in_debug["checkpoint"], checkpoints[0]["config"]["configurable"]);
    assert_eq!(in_debug["parent_checkpoint"], checkpoints[0]["parent_config"]["configurable"]);
    let in_debug = in_debug.as_object_mut().unwrap();
    in_debug.remove("checkpoint");
    in_debug.remove("parent_checkpoint");
    assert_eq!(Value::Object(in_debug.clone()), checkpoints[0]);
    assert_eq!(debug[8]["payload"], tasks[5]);
    let steps: Vec<&Value> = debug.iter().map(|d| &d["step"]).collect();
    let numbers: Vec<Value> =
        checkpoints.iter().map(|c| json!(id(&c["config"]).unwrap().parse::<u64>().unwrap())).collect();
    assert_eq!(steps[0], &numbers[0], "a checkpoint's step is its number");
    assert_eq!(
        (steps[1], steps[2], steps[3]),
        (&numbers[1], &numbers[1], &numbers[1]),
        "a task's is the one it writes"
    );
    // The other modes are as before: the reply's chunks from the `answer` node, the values.
    let chunks = of(every, "messages");
    let streamed: String =
        chunks.iter().filter(|c| c[1]["langgraph_node"] == "answer").filter_map(|c| c[0]["content"].as_str()).collect();
    assert_eq!(streamed.trim_end(), answered, "{chunks:?}");
    assert_eq!(contents(&of(every, "values").last().unwrap().clone()), contents(&state["values"]));

    // On the academy contract's route the same run has the contract's frames only.
    let academy: Vec<&str> = saw["academy_events"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(academy.contains(&"token") && academy.last() == Some(&"done"), "{academy:?} {}", saw["academy_status"]);
    assert!(!academy.iter().any(|e| e.starts_with("node_") || *e == "custom"), "{academy:?}");

    // A run in `debug` alone: nothing but its metadata and debug events.
    let debug_only = saw["debug"].as_array().unwrap();
    assert!(debug_only.iter().skip(1).all(|p| p["event"] == "debug"), "{debug_only:?}");
    let results: Vec<&Value> = debug_only.iter().filter(|p| p["data"]["type"] == "task_result").collect();
    let said = results.last().unwrap()["data"]["payload"]["result"]["messages"][0]["content"].as_str().unwrap();
    assert!(said.starts_with("La extraordinaria es en julio"), "{said}");
    // The first checkpoint of a later run names the last of the run before as its parent.
    let first_checkpoint = debug_only.iter().find(|p| p["data"]["type"] == "checkpoint").unwrap();
    assert_eq!(id(&first_checkpoint["data"]["payload"]["parent_config"]), id(&last["config"]));
    // `custom` alone, on a question the guide does not hold: the report says the reply
    // became "cannot find it".
    let custom_only = saw["custom"].as_array().unwrap();
    let events: Vec<&str> = custom_only.iter().map(|p| p["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["metadata", "custom"], "{custom_only:?}");
    assert_eq!(custom_only[1]["data"]["grounding"]["abstained"], true, "{custom_only:?}");
    // Joined after it ended, in `checkpoints`: its checkpoints again, the last the history's.
    let joined = of(&saw["joined"], "checkpoints");
    let history = saw["history"].as_array().unwrap();
    assert_eq!(joined.last().and_then(|c| id(&c["config"])), history[0]["checkpoint_id"].as_str().map(str::to_owned));
    let kept: Vec<String> = history.iter().filter_map(|h| h["checkpoint_id"].as_str().map(str::to_owned)).collect();
    for c in checkpoints.iter().chain(&joined) {
        assert!(kept.contains(&id(&c["config"]).unwrap()), "{c} is not in the history {kept:?}");
    }
    // Each streamed checkpoint holds what the history holds under its id.
    for c in &checkpoints {
        let kept = history.iter().find(|h| h["checkpoint_id"].as_str() == id(&c["config"]).as_deref()).unwrap();
        assert_eq!(c["values"], kept["values"], "{c}");
    }
    // Joined after its end, from its start: the same checkpoints, each once.
    let joined_ids: Vec<Option<String>> = joined.iter().map(|c| id(&c["config"])).collect();
    let mut once = joined_ids.clone();
    once.dedup();
    assert_eq!((joined_ids.len(), once.len()), (4, 4), "{joined_ids:?}");
}

/// The reply's words in the `messages` events of a stream (`{event, data}` each, as the client
/// scripts print them): its `AIMessageChunk`s' contents, joined.
fn chunks_said(parts: &[Value]) -> String {
    parts
        .iter()
        .filter(|p| p["event"] == "messages" && p["data"][0]["type"] == "AIMessageChunk")
        .filter_map(|p| p["data"][0]["content"].as_str())
        .collect()
}

/// Whether `text` is what `pattern` says, where each `*` in it stands for any run of characters.
fn matches(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            text.starts_with(head)
                && (head.len()..=text.len()).any(|at| text.is_char_boundary(at) && matches(rest, &text[at..]))
        }
    }
}

#[test]
fn a_pattern_stands_for_runs_of_characters_where_it_has_stars() {
    assert!(matches("- .*metadata.langgraph_*", "- .state.metadata.langgraph_host"));
    assert!(matches("+ .thread*.error", "+ .thread_created.error"));
    assert!(!matches("+ .thread*.error", "+ .thread_created.interrupts"));
    assert!(!matches("- .run.kwargs", "- .runs[].kwargs"));
}

/// The differences docs/langgraph.md lists between toolgraph's answers and LangGraph's own
/// server's: the lines of its `shape-differences` block, as `langgraph_shapes.py` writes them
/// (a `*` stands for any run of characters).
fn documented_differences() -> Vec<String> {
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/langgraph.md")).unwrap();
    let block =
        doc.split("<!-- shape-differences -->").nth(1).expect("docs/langgraph.md has the shape-differences block");
    let block = block.split("```").nth(1).expect("a fenced block after the marker");
    block.lines().map(str::trim).filter(|l| l.starts_with(['+', '-', '~'])).map(str::to_owned).collect()
}

/// The same SDK calls against `toolgraph serve` and LangGraph's own server (`langgraph dev`,
/// PyPI `langgraph-cli[inmem]`, running `tests/interop/langgraph_dev/graph.py`: the same agent
/// over the same scripted model): the shapes of their answers differ exactly where
/// docs/langgraph.md says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_own_server_answers_the_same_calls_in_the_shapes_the_docs_say() {
    let Some(python) = langgraph_python() else { return };
    let Some(langgraph) = toolgraph_testkit::interop::langgraph_dev() else { return };
    let script = || {
        vec![
            Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
            Reply::text("Son 42."),
            Reply::tool_calls(&[("n1", "note_write", json!({"title": "Examen", "body": "El viernes."}))]),
            Reply::text("Nota guardada."),
            // Through `front`, which runs the agent as a sub-graph.
            Reply::tool_calls(&[("c2", "calculator", json!({"expression": "6*8"}))]),
            Reply::text("Son 48."),
        ]
    };
    let ours = ScriptedModelServer::start(script()).await.unwrap();
    let theirs = ScriptedModelServer::start(script()).await.unwrap();
    // `front`: a declared graph whose one node hands the turn to `assistant`, as LangGraph's
    // `front` runs it as a sub-graph node.
    let dir = tempfile::tempdir().unwrap();
    let front = dir.path().join("front.toml");
    std::fs::write(
        &front,
        "description = \"Hands every turn to the assistant.\"\nstart = \"assistant\"\n\n\
         [nodes.assistant]\nkind = \"agent\"\nagent = \"assistant\"\nnext = \"END\"\n",
    )
    .unwrap();
    let config = format!(
        "{}[agents.front]\ngraph_file = {:?}\ntools = []\n",
        common::api_key_config(KEY, false),
        front.display().to_string()
    );
    let (_serve, base, _dir) = common::serve_in(dir, &ours, &config, &[]).await;
    // LangGraph's server writes its state beside the graph: a copy of its folder.
    let work = tempfile::tempdir().unwrap();
    let graph = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/langgraph_dev");
    for file in ["graph.py", "langgraph.json"] {
        std::fs::copy(graph.join(file), work.path().join(file)).unwrap();
    }
    let port = common::free_port();
    let log = std::fs::File::create(work.path().join("server.log")).unwrap();
    let dev = Command::new(&langgraph)
        .args(["dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--config", "langgraph.json"])
        .current_dir(work.path())
        .env("SCRIPTED_MODEL_URL", theirs.base_url())
        .env("LANGGRAPH_CLI_NO_ANALYTICS", "1")
        // No tracing to LangSmith, whatever the environment says: no calls out, no fields of its own.
        .env_remove("LANGSMITH_TRACING")
        .env_remove("LANGCHAIN_TRACING_V2")
        .env_remove("LANGSMITH_API_KEY")
        .env_remove("LANGCHAIN_API_KEY")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let _dev = common::ServeProcess(dev);
    let dev_base = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let probe = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
    while !probe.get(format!("{dev_base}/ok")).send().await.is_ok_and(|r| r.status().is_success()) {
        let log = std::fs::read_to_string(work.path().join("server.log")).unwrap_or_default();
        assert!(started.elapsed() < Duration::from_secs(90), "langgraph dev never answered /ok:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut client = Command::new(&python);
    client.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/langgraph_shapes.py"));
    client.arg(&base).arg(&dev_base).arg(KEY);
    let saw = client_json(client).await;

    // Both ran the whole script: the same replies, the same pause, the same messages.
    assert_eq!(ours.requests().len(), 6, "toolgraph asked its model {} times", ours.requests().len());
    assert_eq!(theirs.requests().len(), 6, "LangGraph asked its model {} times", theirs.requests().len());
    // Both streamed the sub-graph's nodes in its namespace, and its answer.
    for who in ["toolgraph", "langgraph"] {
        let sub = saw[who]["subgraphs"].as_object().unwrap();
        let events: Vec<&String> = sub.keys().collect();
        assert!(sub.contains_key("updates|assistant:<task>"), "{who}: {events:?}");
        let tokens = sub.get("messages|assistant:<task>").and_then(Value::as_array).cloned().unwrap_or_default();
        let said: String = tokens.iter().filter_map(|t| t["message"]["content"].as_str()).collect();
        assert!(said.contains("Son 48."), "{who}: {said:?} in {events:?}");
    }
    let texts = |who: &str| -> Vec<Value> {
        saw[who]["resumed"]["messages"].as_array().unwrap().iter().map(|m| m["content"].clone()).collect()
    };
    assert_eq!(texts("toolgraph").len(), texts("langgraph").len(), "{}", saw["toolgraph"]["resumed"]);
    assert_eq!(texts("toolgraph").last(), texts("langgraph").last());
    for who in ["toolgraph", "langgraph"] {
        assert_eq!(
            saw[who]["thread_interrupted"]["status"], "interrupted",
            "{who}: {}",
            saw[who]["thread_interrupted"]
        );
    }
    let found: Vec<String> =
        saw["differences"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_owned()).collect();
    let documented = documented_differences();
    let undocumented: Vec<&String> = found.iter().filter(|d| !documented.iter().any(|p| matches(p, d))).collect();
    let stale: Vec<&String> = documented.iter().filter(|p| !found.iter().any(|d| matches(p, d))).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "differences docs/langgraph.md does not list: {undocumented:#?}\nlisted there, not found: {stale:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langgraphs_js_sdk_streams_a_run_and_resumes_its_interrupt() {
    let Some(entry) = langgraph_js() else { return };
    let model = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::text("Son 42."),
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Examen", "body": "El viernes."}))]),
        Reply::text("Nota guardada."),
        Reply::tool_calls(&[("n2", "note_write", json!({"title": "Repaso", "body": "El jueves."}))]),
        Reply::text("Repaso guardado."),
        Reply::tool_calls(&[("n3", "note_write", json!({"title": "Tutoria", "body": "El lunes."}))]),
        Reply::text("Entendido."),
        Reply::tool_calls(&[("n4", "note_write", json!({"title": "Final", "body": "En enero."}))]),
        Reply::text("Perfecto."),
        // Slow: rolled back by the next run.
        Reply::Stream(vec![Step::Pause(Duration::from_secs(10)), Step::Text("Tarde.".into()), Step::Done]),
        Reply::text("Sigo."),
        Reply::text("Ahora sí."),
    ])
    .await
    .unwrap();
    let (mut serve, base, dir) = serve_with_key(&model, KEY, false, &[]).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/langgraph_threads.mjs");
    let mut client = Command::new("node");
    client.arg(script).arg(&base).arg(KEY).arg(entry);
    let saw = client_json(client).await;
    let _ = serve.kill();
    let _ = serve.wait();

    assert_eq!(saw["created"]["metadata"], json!({"course": "iv"}));
    let parts = saw["first_run"].as_array().unwrap();
    assert_eq!(parts[0]["event"], "metadata", "{parts:?}");
    assert_eq!(chunks_said(parts), "Son 42.", "the JS client read the reply's chunks");
    assert!(parts.iter().any(|p| p["event"] == "updates" && p["data"]["tools"]["messages"][0]["tool_call_id"] == "c1"));
    let last = &parts.last().unwrap()["data"]["messages"];
    assert_eq!(last.as_array().map(Vec::len), Some(4), "{last}");

    let interrupt = &saw["paused"]["__interrupt__"][0];
    assert_eq!(interrupt["value"]["action_requests"][0]["name"], "note_write", "{}", saw["paused"]);
    assert_eq!(saw["state"]["interrupts"][0]["id"], interrupt["id"], "{}", saw["state"]);
    let resumed = chunks_said(saw["resumed"].as_array().unwrap());
    assert_eq!(resumed, "Nota guardada.", "the resumed run's reply, token by token");
    assert_eq!(saw["after"]["status"], "idle");
    let notes = std::fs::read_dir(dir.path().join("notes")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(notes, 1, "the approved note was written once");
    // The other decisions, from the JS client: the edited write ran with the person's body; the
    // rejected one and the one answered in its place did not run, and the model read what the
    // person said (in the requests it got).
    let mine = dir.path().join("notes/demo/1");
    let repaso = std::fs::read_to_string(mine.join("repaso.md")).expect("the edited write ran");
    assert!(repaso.contains("El miércoles.") && !repaso.contains("El jueves."), "{repaso}");
    assert!(!mine.join("tutoria.md").exists() && !mine.join("final.md").exists());
    let last = |values: &Value| values["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone());
    assert_eq!(last(&saw["edited"]), Some(json!("Repaso guardado.")), "{}", saw["edited"]);
    assert_eq!(
        last(&saw["rejected"]),
        Some(json!("Entendido.")),
        "the model answered the message: {}",
        saw["rejected"]
    );
    assert_eq!(last(&saw["responded"]), Some(json!("Perfecto.")), "{}", saw["responded"]);
    // Rolled back by the next run: the slow run's question is not in the thread, nor the run.
    assert_eq!(last(&saw["rolled_back"]), Some(json!("Sigo.")), "{}", saw["rolled_back"]);
    assert!(!saw["rolled_back"].to_string().contains("cuéntame algo largo"), "{}", saw["rolled_back"]);
    assert!(saw["rolled_back"].to_string().contains("Perfecto."), "the turns before stay: {}", saw["rolled_back"]);
    assert_eq!(saw["doomed_run"]["status"], 404, "{}", saw["doomed_run"]);
    let read = |text: &str| {
        model.requests().iter().any(|r| {
            r["messages"].as_array().is_some_and(|m| {
                m.iter().any(|m| m["role"] == "tool" && m["content"].as_str().is_some_and(|c| c.contains(text)))
            })
        })
    };
    assert!(read("No, el martes."), "the rejection's message reached the model");
    assert!(read("Ya lo tengo."), "the response reached the model");
    assert!(read("arguments_edited_by_user"), "the model read which arguments ran");
    // The state update, from the JS client: the last message, written as `agent`; the run from
    // the checkpoint before it goes on without it.
    let updated = &saw["updated_state"];
    assert_eq!(last(&updated["values"]), Some(json!("Nota al margen.")), "{updated}");
    assert_eq!(updated["checkpoint"]["checkpoint_id"], saw["updated"]["checkpoint"]["checkpoint_id"]);
    assert_eq!(last(&saw["forked"]), Some(json!("Ahora sí.")), "{}", saw["forked"]);
    assert!(!saw["forked"].to_string().contains("Nota al margen."), "{}", saw["forked"]);
    assert!(saw["forked"].to_string().contains("Sigo."), "the turns before the checkpoint stay: {}", saw["forked"]);
    assert_eq!(saw["deleted"]["status"], 404, "{}", saw["deleted"]);
}
