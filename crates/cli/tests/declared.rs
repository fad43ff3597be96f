//! A graph declared in TOML only, served as a process: the help-desk example
//! (examples/helpdesk) over HTTP on the scripted model — a classifier's label routes the turn,
//! a real search over the ingested articles, a write tool behind approval — and
//! `toolgraph agents check` on it and on a broken copy.

mod common;

use common::{event_data, free_port, serve_command, sse_events, wait_ready};
use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `toolgraph --config examples/helpdesk/toolgraph.toml ARGS` from the repository's root.
fn toolgraph(data: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["--config", "examples/helpdesk/toolgraph.toml", "--data-dir"])
        .arg(data)
        .args(args)
        .current_dir(repo())
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .env_remove("TOOLGRAPH_LLM_BASE_URL")
        .output()
        .unwrap()
}

async fn post(base: &str, path: &str, body: &Value) -> String {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("X-Tenant-Slug", "demo")
        .json(body)
        .timeout(Duration::from_secs(60))
        .send();
    response.await.unwrap().text().await.unwrap()
}

/// What a turn's body said: its `token` frames, joined.
fn said(body: &str) -> String {
    sse_events(body)
        .into_iter()
        .filter(|(e, _)| e == "token")
        .filter_map(|(_, d)| d["content"].as_str().map(str::to_owned))
        .collect()
}

/// The system prompt and the names of the tools offered of a model request.
fn system_and_tools(request: &Value) -> (String, Vec<String>) {
    let system = request["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    let tools = request["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    (system, tools)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_declared_help_desk_routes_searches_and_asks_before_it_opens_a_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let ingest = toolgraph(
        dir.path(),
        &["ingest", "examples/helpdesk/docs", "--kb", "helpdesk", "--keyword-only", "--tenant", "demo"],
    );
    assert!(ingest.status.success(), "{}", String::from_utf8_lossy(&ingest.stderr));
    let answer =
        "A second charge is usually released within 5 working days [Billing and invoices › I was charged twice].";
    let model = ScriptedModelServer::start(vec![
        Reply::text("Billing."),
        Reply::text(answer),
        Reply::text("ticket"),
        Reply::tool_calls(&[(
            "t1",
            "open_ticket",
            json!({"summary": "Charged twice in November", "details": "both charges still there after a week"}),
        )]),
        Reply::text("Ticket T-0001 is open."),
        Reply::text("other"),
        Reply::text("You're welcome!"),
    ])
    .await
    .unwrap();
    let port = free_port();
    let tickets = dir.path().join("tickets.jsonl");
    let mut child = serve_command(dir.path(), &model, port)
        .args(["--config", "examples/helpdesk/toolgraph.toml"])
        .current_dir(repo())
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .env("HELPDESK_TICKETS", &tickets)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let say = |conversation: &Value, message: &str| json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation, "message": message});

    let question = "I was charged twice this month. What happens now?";
    let first = post(&base, "/api/chatbot/stream", &say(&Value::Null, question)).await;
    let conversation = event_data(&first, "done")["conversationId"].clone();
    let second =
        post(&base, "/api/chatbot/stream", &say(&conversation, "Still there after a week. Open a ticket.")).await;
    let pending = event_data(&second, "pending");
    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": pending["messageId"], "confirmed": true});
    let confirmed: Value = serde_json::from_str(&post(&base, "/api/chatbot/confirm", &confirm).await).unwrap();
    let third = post(&base, "/api/chatbot/stream", &say(&conversation, "thanks!")).await;
    let requests = model.requests();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(requests.len(), 7, "triage, agent; triage, ticket, ticket after approval; triage, chat: {requests:#?}");

    // 1. The classifier read only the latest message and offered no tools; `billing` routed the
    // turn to a real search over the ingested articles, with the person's words.
    let (triage, triage_tools) = system_and_tools(&requests[0]);
    assert!(
        triage.contains("You sort the messages") && triage.contains("billing, technical, ticket, other"),
        "{triage}"
    );
    assert!(triage_tools.is_empty());
    assert_eq!(requests[0]["messages"].as_array().unwrap().len(), 2, "system and the latest message only");
    // (The academy contract streams no tool frames: the search is read in what the answering
    // model was sent — the call and its result, recorded like a model's own.)
    let sent = requests[1]["messages"].as_array().unwrap();
    let call = &sent[2]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "rag_search", "{sent:#?}");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments["query"], question);
    assert_eq!(sent[3]["role"], "tool");
    assert!(sent[3]["content"].as_str().unwrap().contains("pending authorisation"), "the article was found: {sent:#?}");
    // The answering model saw its prompt with the label filled in, and only its own tool.
    let (agent, agent_tools) = system_and_tools(&requests[1]);
    assert!(agent.contains("This is a billing question."), "{agent}");
    assert_eq!(agent_tools, ["open_ticket"]);
    assert_eq!(said(&first), answer, "{first}");
    assert!(!first.contains("event: pending"), "{first}");

    // 2. `ticket` routed to the node that must call open_ticket (tool_choice required), saw the
    // conversation, and waited for the person; once approved it ran once and the node answered
    // freely.
    assert_eq!(requests[2]["messages"][1]["content"], "Still there after a week. Open a ticket.");
    let (ticket, ticket_tools) = system_and_tools(&requests[3]);
    assert!(ticket.contains("Open a support ticket"), "{ticket}");
    assert_eq!((ticket_tools, &requests[3]["tool_choice"]), (vec!["open_ticket".to_owned()], &json!("required")));
    assert!(requests[3]["messages"].to_string().contains(question), "the earlier turn is in its window");
    assert_ne!(requests[4]["tool_choice"], "required", "a result is in: it may answer");
    assert_eq!(
        (pending["toolName"].as_str(), pending["description"].as_str()),
        (Some("open_ticket"), Some("Open a ticket: Charged twice in November")),
        "{pending}"
    );
    assert_eq!(confirmed["message"], "Ticket T-0001 is open.", "{confirmed}");
    let opened = std::fs::read_to_string(&tickets).unwrap();
    assert_eq!(opened.lines().count(), 1, "{opened}");
    assert!(opened.contains("\"ticket\": \"T-0001\"") && opened.contains("Charged twice in November"), "{opened}");

    // 3. "thanks!" is `other`: a short reply, no search, no tools offered.
    assert_eq!(said(&third), "You're welcome!", "{third}");
    let (chat, chat_tools) = system_and_tools(&requests[6]);
    assert!(chat.contains("Reply briefly and kindly") && chat_tools.is_empty(), "{chat} {chat_tools:?}");
    let searches = requests[6]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["function"]["name"] == "rag_search")
        .count();
    assert_eq!(searches, 1, "only the first turn searched: {:#?}", requests[6]);
}

#[test]
fn agents_check_passes_the_example_and_names_each_problem_of_a_broken_copy() {
    let dir = tempfile::tempdir().unwrap();
    let ok = toolgraph(dir.path(), &["agents", "check"]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success() && stdout.contains("ok   examples/helpdesk/desk.toml (desk): 13 nodes"), "{stdout}");
    let text = std::fs::read_to_string(repo().join("examples/helpdesk/desk.toml")).unwrap();
    let broken = text.replacen(r#"next = "agent""#, r#"next = "answer""#, 1).replace("{{category}}", "{{label}}");
    let file = dir.path().join("desk.toml");
    std::fs::write(&file, broken).unwrap();
    let out = toolgraph(dir.path(), &["agents", "check", file.to_str().unwrap(), "--agent", "desk"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let f = file.display();
    assert!(stderr.contains(&format!("{f}:34: nodes.search.next: no node named `answer`")), "{stderr}");
    assert!(stderr.contains(&format!("{f}:38: nodes.agent.prompt: the template reads `label`")), "{stderr}");
    // `serve` refuses the broken graph with the same errors before it listens.
    let config = dir.path().join("toolgraph.toml");
    let cfg = std::fs::read_to_string(repo().join("examples/helpdesk/toolgraph.toml")).unwrap();
    // `graph_file = "desk.toml"` is read beside the configuration: the broken copy.
    std::fs::write(&config, cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["--config", config.to_str().unwrap(), "--data-dir"])
        .arg(dir.path())
        .args(["serve", "--port", "0"])
        .current_dir(repo())
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .env("TOOLGRAPH_LLM_BASE_URL", "http://127.0.0.1:9/v1")
        .env("TOOLGRAPH_LLM_MODEL", "m")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("{f}:34: nodes.search.next: no node named `answer`")), "{stderr}");
}
