//! A graph declared in TOML only, served as a process: the help-desk example
//! (examples/helpdesk) over HTTP on the scripted model — a classifier's label routes the turn,
//! a real search over the ingested articles, a write tool behind approval — and
//! `toolgraph agents check` on it and on a broken copy.

mod common;

use common::{event_data, free_port, said, serve_command, sse_events, wait_ready};
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
    posted(base, path, body).await.text().await.unwrap()
}

/// The response to `POST path` with `body`, asked as tenant 1's user 1 (on every door).
async fn posted(base: &str, path: &str, body: &Value) -> reqwest::Response {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("X-Tenant-Slug", "demo")
        // Who asks, on the doors that read it from headers (LangGraph's); the academy
        // contract's routes read it from the body.
        .header("X-Tenant-Id", "1")
        .header("X-User-Id", "1")
        .json(body)
        .timeout(Duration::from_secs(60))
        .send();
    response.await.unwrap()
}

/// The help-center articles ingested as the desk's knowledge base into the data in `data`.
fn ingest_articles(data: &Path) {
    let ingest = toolgraph(
        data,
        &["ingest", "examples/helpdesk/docs", "--kb", "helpdesk", "--keyword-only", "--tenant", "demo"],
    );
    assert!(ingest.status.success(), "{}", String::from_utf8_lossy(&ingest.stderr));
}

/// The billing desk's answer to a question on a charge made twice, cited to the article.
const DOUBLE_CHARGE_ANSWER: &str =
    "A second charge is usually released within 5 working days [Billing and invoices › I was charged twice].";

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
    ingest_articles(dir.path());
    let answer = DOUBLE_CHARGE_ANSWER;
    let refund = "Refund R-0001 is requested; the billing team confirms it by email.";
    let model = ScriptedModelServer::start(vec![
        Reply::text("Billing."),
        Reply::text("question"),
        Reply::text(answer),
        Reply::text("ticket"),
        Reply::text("Unknown."),
        Reply::tool_calls(&[(
            "t1",
            "open_ticket",
            json!({"summary": "Charged twice in November", "details": "both charges still there after a week"}),
        )]),
        Reply::text("Ticket T-0001 is open."),
        Reply::text("other"),
        Reply::text("You're welcome!"),
        Reply::text("billing"),
        Reply::text("refund"),
        Reply::tool_calls(&[(
            "r1",
            "request_refund",
            json!({"charge": "8 euros on 3 November", "reason": "duplicate charge"}),
        )]),
        Reply::text(refund),
    ])
    .await
    .unwrap();
    let (mut child, base) = serve_desk(dir.path(), &repo().join("examples/helpdesk/toolgraph.toml"), &model).await;
    let (tickets, refunds) = (dir.path().join("tickets.jsonl"), dir.path().join("refunds.jsonl"));

    let question = "I was charged twice this month. What happens now?";
    let first = post(&base, "/api/chatbot/stream", &say(&Value::Null, question)).await;
    let conversation = event_data(&first, "done")["conversationId"].clone();
    let second =
        post(&base, "/api/chatbot/stream", &say(&conversation, "Still there after a week. Open a ticket.")).await;
    let ask = event_data(&second, "pending");
    let answer_with = |value: Value| {
        json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": ask["messageId"], "answer": value})
    };
    // An answer the form does not take, and approving a question, are refused; nothing runs.
    let wrong: Value =
        serde_json::from_str(&post(&base, "/api/chatbot/answer", &answer_with(json!("the web one"))).await).unwrap();
    let approve_question = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": ask["messageId"], "confirmed": true});
    let approved_question: Value =
        serde_json::from_str(&post(&base, "/api/chatbot/confirm", &approve_question).await).unwrap();
    let answered: Value =
        serde_json::from_str(&post(&base, "/api/chatbot/answer", &answer_with(json!("web"))).await).unwrap();
    // The same answer again gets the same response; another one, once an answer is recorded, is
    // refused; another user cannot answer it.
    let again: Value =
        serde_json::from_str(&post(&base, "/api/chatbot/answer", &answer_with(json!("web"))).await).unwrap();
    let other: Value =
        serde_json::from_str(&post(&base, "/api/chatbot/answer", &answer_with(json!("mobile"))).await).unwrap();
    let mut stranger = answer_with(json!("web"));
    stranger["userId"] = json!(2);
    let strangers: Value = serde_json::from_str(&post(&base, "/api/chatbot/answer", &stranger).await).unwrap();
    let pending = answered["pendingAction"].clone();
    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": pending["messageId"], "confirmed": true});
    let confirmed: Value = serde_json::from_str(&post(&base, "/api/chatbot/confirm", &confirm).await).unwrap();
    // An approval is not answered.
    let answer_approval = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": pending["messageId"], "answer": "yes"});
    let answered_approval: Value =
        serde_json::from_str(&post(&base, "/api/chatbot/answer", &answer_approval).await).unwrap();
    let third = post(&base, "/api/chatbot/stream", &say(&conversation, "thanks!")).await;
    let fourth = post(
        &base,
        "/api/chatbot/stream",
        &say(&conversation, "Please refund the duplicate charge of 8 euros on 3 November."),
    )
    .await;
    let refund_pending = event_data(&fourth, "pending");
    let confirm_refund = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": refund_pending["messageId"], "confirmed": true});
    let refunded: Value = serde_json::from_str(&post(&base, "/api/chatbot/confirm", &confirm_refund).await).unwrap();
    let requests = model.requests();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        requests.len(),
        13,
        "triage, billing/intent, billing/answer; triage, which_app, ticket, ticket after approval; triage, \
         chat; triage, billing/intent, billing/refund, billing/refund after approval: {requests:#?}"
    );

    // 1. The classifier read only the latest message and offered no tools; `billing` handed the
    // turn to the billing desk, another agent, whose graph ran a real search over the ingested
    // articles with the person's words.
    let (triage, triage_tools) = system_and_tools(&requests[0]);
    assert!(
        triage.contains("You sort the messages") && triage.contains("billing, technical, ticket, other"),
        "{triage}"
    );
    assert!(triage_tools.is_empty());
    assert_eq!(requests[0]["messages"].as_array().unwrap().len(), 2, "system and the latest message only");
    // The billing desk's own classifier read the message, and its search ran over the ingested
    // articles with the person's words. (The academy contract streams no tool frames: the search
    // is read in what the answering model was sent — the passages written out before the
    // question, as a node with no tools and `cite` reads them.)
    let (intent, intent_tools) = system_and_tools(&requests[1]);
    assert!(intent.contains("Sort the person's message to the billing desk") && intent_tools.is_empty(), "{intent}");
    let (agent, agent_tools) = system_and_tools(&requests[2]);
    assert!(agent.starts_with("You are the billing desk of Acme Notes."), "the billing desk's own prompt: {agent}");
    assert!(agent_tools.is_empty(), "{agent_tools:?}");
    let sent = requests[2]["messages"].as_array().unwrap();
    let read = sent.last().unwrap()["content"].as_str().unwrap();
    assert!(
        read.contains("[Billing and invoices › I was charged twice]")
            && read.contains("pending authorisation")
            && read.contains(question),
        "the article was found and written out before the question: {read}"
    );
    assert_eq!(said(&first), answer, "{first}");
    assert!(!first.contains("event: pending"), "{first}");

    // 2. `ticket` went to the classifier of the app, which read the conversation and found none
    // named; so the person was asked, with the form's choices, and their answer joined the
    // conversation and the ticket's prompt. An answer off the form, and approving a question,
    // were refused with why.
    assert_eq!(requests[3]["messages"][1]["content"], "Still there after a week. Open a ticket.");
    let (which_app, which_tools) = system_and_tools(&requests[4]);
    assert!(which_app.contains("Which Acme Notes app") && which_tools.is_empty(), "{which_app}");
    assert_eq!(
        (ask["toolName"].as_str(), ask["description"].as_str()),
        (Some("@ask"), Some("Which app is it in: desktop, mobile or web?")),
        "{ask}"
    );
    assert_eq!(ask["arguments"]["form"], json!({"enum": ["desktop", "mobile", "web"]}));
    assert_eq!(said(&second), "Which app is it in: desktop, mobile or web?", "the question is said: {second}");
    assert_eq!(wrong["field"], "answer", "{wrong}");
    assert!(wrong["error"].as_str().unwrap().contains("does not fit the form"), "{wrong}");
    assert!(approved_question["error"].as_str().unwrap().contains("/api/chatbot/answer"), "{approved_question}");
    assert!(answered_approval["error"].as_str().unwrap().contains("/api/chatbot/confirm"), "{answered_approval}");
    assert_eq!(again, answered, "a repeated answer is answered as the first was");
    assert!(other["error"].as_str().unwrap().contains("already answered with another answer"), "{other}");
    assert_eq!(strangers["error"], "not found", "{strangers}");
    // `ticket` is the node that must call open_ticket (tool_choice required); it saw the
    // conversation and the answer, and waited for the person; once approved it ran once and
    // the node answered freely.
    let (ticket, ticket_tools) = system_and_tools(&requests[5]);
    assert!(ticket.contains("Open a support ticket") && ticket.contains("(in the web app)"), "{ticket}");
    assert_eq!((ticket_tools, &requests[5]["tool_choice"]), (vec!["open_ticket".to_owned()], &json!("required")));
    let window = requests[5]["messages"].as_array().unwrap();
    let last_two: Vec<(&str, &str)> = window[window.len() - 2..]
        .iter()
        .map(|m| (m["role"].as_str().unwrap_or(""), m["content"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(last_two, [("assistant", "Which app is it in: desktop, mobile or web?"), ("user", "web")]);
    assert!(requests[5]["messages"].to_string().contains(question), "the earlier turn is in its window");
    assert_ne!(requests[6]["tool_choice"], "required", "a result is in: it may answer");
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
    let (chat, chat_tools) = system_and_tools(&requests[8]);
    assert!(chat.contains("Reply briefly and kindly") && chat_tools.is_empty(), "{chat} {chat_tools:?}");
    let searches = requests[8]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["function"]["name"] == "rag_search")
        .count();
    assert_eq!(searches, 1, "only the first turn searched: {:#?}", requests[8]);

    // 4. A refund is the billing desk's write: it waited for the person inside the handed-over
    // graph, as the desk's own ticket did, and ran once when approved.
    assert_eq!(
        (refund_pending["toolName"].as_str(), refund_pending["description"].as_str()),
        (Some("request_refund"), Some("Request a refund of 8 euros on 3 November")),
        "{refund_pending}"
    );
    let (refund_prompt, refund_tools) = system_and_tools(&requests[11]);
    assert!(refund_prompt.contains("Ask the billing team to refund"), "{refund_prompt}");
    assert_eq!((refund_tools, &requests[11]["tool_choice"]), (vec!["request_refund".to_owned()], &json!("required")));
    assert_eq!(refunded["message"], refund, "{refunded}");
    let requested = std::fs::read_to_string(&refunds).unwrap();
    assert_eq!(requested.lines().count(), 1, "{requested}");
    assert!(requested.contains("\"refund\": \"R-0001\"") && requested.contains("duplicate charge"), "{requested}");
}

/// The `(name, id)` of each `tasks` event of `events` in namespace `ns` (`""`: the top): a task
/// and its result each, in order.
fn tasks_in(events: &[(String, Value)], ns: &str) -> Vec<(String, String)> {
    let name = if ns.is_empty() { "tasks".to_owned() } else { format!("tasks|{ns}") };
    events
        .iter()
        .filter(|(e, _)| *e == name)
        .map(|(_, d)| (d["name"].as_str().unwrap_or("").to_owned(), d["id"].as_str().unwrap_or("").to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_agent_streams_in_its_own_namespace_when_sub_graphs_are_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    ingest_articles(dir.path());
    let answer = DOUBLE_CHARGE_ANSWER;
    let refund_call = Reply::tool_calls(&[(
        "r1",
        "request_refund",
        json!({"charge": "8 euros on 3 November", "reason": "duplicate"}),
    )]);
    let model = ScriptedModelServer::start(vec![
        // Sub-graphs asked for; the same question without; a refund with, which waits for approval.
        Reply::text("billing"),
        Reply::text("question"),
        Reply::text(answer),
        Reply::text("billing"),
        Reply::text("question"),
        Reply::text(answer),
        Reply::text("billing"),
        Reply::text("refund"),
        refund_call,
        // The refund approved, resumed with sub-graphs: its answer.
        Reply::text("Your refund of 8 euros has been requested."),
        // The same thread handed over again: its question.
        Reply::text("billing"),
        Reply::text("question"),
        Reply::text(answer),
        // Sub-graphs asked for with `messages-tuple` alone.
        Reply::text("billing"),
        Reply::text("question"),
        Reply::text(answer),
        // And with `updates` alone.
        Reply::text("billing"),
        Reply::text("question"),
        Reply::text(answer),
    ])
    .await
    .unwrap();
    let (mut child, base) = serve_desk(dir.path(), &repo().join("examples/helpdesk/toolgraph.toml"), &model).await;
    let run = |message: &str, subgraphs: bool| {
        json!({"assistant_id": "desk", "input": {"messages": [{"type": "human", "content": message}]},
            "stream_mode": ["updates", "messages-tuple", "tasks"], "stream_subgraphs": subgraphs})
    };
    let thread = |body: String| serde_json::from_str::<Value>(&body).unwrap()["thread_id"].as_str().unwrap().to_owned();
    let question = "I was charged twice this month. What happens now?";

    let first = thread(post(&base, "/threads", &json!({})).await);
    let body = post(&base, &format!("/threads/{first}/runs/stream"), &run(question, true)).await;
    let events = sse_events(&body);
    let plain = thread(post(&base, "/threads", &json!({})).await);
    let flat = sse_events(&post(&base, &format!("/threads/{plain}/runs/stream"), &run(question, false)).await);
    let third = thread(post(&base, "/threads", &json!({})).await);
    let refund = "Please refund the duplicate charge of 8 euros on 3 November.";
    let paused = sse_events(&post(&base, &format!("/threads/{third}/runs/stream"), &run(refund, true)).await);
    let approve = json!({"assistant_id": "desk", "command": {"resume": {"decisions": [{"type": "approve"}]}},
        "stream_mode": ["updates", "tasks"], "stream_subgraphs": true});
    let resumed = post(&base, &format!("/threads/{third}/runs/stream"), &approve).await;
    let again = sse_events(&post(&base, &format!("/threads/{third}/runs/stream"), &run(question, true)).await);
    let resumed_id = event_data(&resumed, "metadata")["run_id"].as_str().unwrap().to_owned();
    let rejoined_resume =
        get_text(&base, &format!("/threads/{third}/runs/{resumed_id}/stream?stream_mode=tasks&stream_subgraphs=true"))
            .await;
    let fourth = thread(post(&base, "/threads", &json!({})).await);
    let mut tokens_only = run(question, true);
    tokens_only["stream_mode"] = json!(["messages-tuple"]);
    let tuples = sse_events(&post(&base, &format!("/threads/{fourth}/runs/stream"), &tokens_only).await);
    let fifth = thread(post(&base, "/threads", &json!({})).await);
    let mut updates_only = run(question, true);
    updates_only["stream_mode"] = json!(["updates"]);
    let updated = sse_events(&post(&base, &format!("/threads/{fifth}/runs/stream"), &updates_only).await);
    let run_id = event_data(&body, "metadata")["run_id"].as_str().unwrap().to_owned();
    let joined = get_text(&base, &format!("/threads/{first}/runs/{run_id}/stream?stream_mode=tasks")).await;
    let _ = child.kill();
    let _ = child.wait();

    // 1. The desk's own nodes are at the top; the handing node's task names the namespace its
    // agent's nodes stream in, and lasts until the agent hands the turn back (one task, as a
    // LangGraph sub-graph node's), its result and its update the messages the agent added.
    let top = tasks_in(&events, "");
    let names: Vec<&str> = top.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["triage", "triage", "billing", "billing"], "{body}");
    assert_eq!(top[2].1, top[3].1, "the hand-off's start and its end are one task: {body}");
    let ns = format!("billing:{}", top[2].1);
    let handed = events.iter().filter(|(e, d)| e == "updates" && d["billing"].is_object()).collect::<Vec<_>>();
    assert_eq!(handed.len(), 1, "{body}");
    let added = handed[0].1["billing"]["messages"].as_array().unwrap();
    assert_eq!(added.first().map(|m| &m["tool_calls"][0]["name"]), Some(&json!("rag_search")), "{body}");
    assert!(
        added.last().is_some_and(
            |m| m["type"] == "ai" && m["content"].as_str().is_some_and(|c| c.contains("within 5 working days"))
        ),
        "{body}"
    );
    let result = events.iter().find(|(e, d)| e == "tasks" && d["name"] == "billing" && d.get("result").is_some());
    assert_eq!(result.map(|(_, d)| &d["result"]["messages"]), Some(&json!(added)), "{body}");
    // The classifiers' channel writes are their nodes' updates — the desk's at the top, the
    // handed-over agent's in its namespace (its node's whole name without) — and their tasks' results.
    let wrote =
        |events: &[(String, Value)], name: &str, update: Value| events.iter().any(|(e, d)| e == name && *d == update);
    assert!(wrote(&events, "updates", json!({"triage": {"channels": {"category": "billing"}}})), "{body}");
    let intent = json!({"channels": {"billing/intent": "question"}});
    assert!(wrote(&events, &format!("updates|{ns}"), json!({ "intent": intent })), "{body}");
    let flat_body = format!("{flat:?}");
    assert!(wrote(&flat, "updates", json!({ "billing/intent": intent })), "{flat_body}");
    let triage = events.iter().find(|(e, d)| e == "tasks" && d["name"] == "triage" && d.get("result").is_some());
    assert_eq!(triage.map(|(_, d)| &d["result"]), Some(&json!({"channels": {"category": "billing"}})), "{body}");
    // The agent's last update (its reply, as the state holds it) comes before its handing node's.
    let at = |events: &[(String, Value)], found: &dyn Fn(&(String, Value)) -> bool| events.iter().position(found);
    let inner_reply =
        |ns: String| move |(e, d): &(String, Value)| *e == format!("updates|{ns}") && d["answer"].is_object();
    let top_update = |(e, d): &(String, Value)| e == "updates" && d["billing"].is_object();
    let (reply_at, handed_at) = (at(&events, &inner_reply(ns.clone())), at(&events, &top_update));
    assert!(reply_at.is_some() && reply_at < handed_at, "{body}");
    assert_eq!(events[reply_at.unwrap()].1["answer"]["messages"][0], *added.last().unwrap(), "{body}");
    // With `updates` alone, the same: the handing node's update after its agent's.
    let only_ns = updated.iter().find_map(|(e, _)| e.strip_prefix("updates|").map(str::to_owned));
    let only_ns = only_ns.unwrap_or_else(|| panic!("{updated:?}"));
    let (reply_at, handed_at) = (at(&updated, &inner_reply(only_ns)), at(&updated, &top_update));
    assert!(reply_at.is_some() && reply_at < handed_at, "{updated:?}");
    assert_eq!(updated.iter().filter(|(_, d)| d["answer"].is_object()).count(), 1, "the reply told once: {updated:?}");
    let inner = tasks_in(&events, &ns);
    let inner_names: Vec<&str> = inner.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(inner_names, ["intent", "intent", "search", "search", "answer", "answer"], "{body}");
    assert!(
        events.iter().all(|(e, _)| !e.contains('|') || e.ends_with(&format!("|{ns}"))),
        "every namespaced event is in the one hand-off's: {body}"
    );
    // 2. The search's call and result and the answer's chunks come in the namespace, each named
    // by its node there, with its whole path.
    let in_ns: Vec<&Value> = events.iter().filter(|(e, _)| *e == format!("messages|{ns}")).map(|(_, d)| d).collect();
    let task_of = |node: &str| inner.iter().find(|(n, _)| n == node).map(|(_, id)| id.clone()).unwrap();
    for d in &in_ns {
        let node = d[1]["langgraph_node"].as_str().unwrap_or_default();
        assert!(["search", "answer"].contains(&node), "{d}");
        assert_eq!(d[1]["langgraph_checkpoint_ns"], format!("{ns}|{node}:{}", task_of(node)), "{d}");
    }
    let search = in_ns.iter().find(|d| d[0]["tool_calls"][0]["name"] == "rag_search");
    assert!(search.is_some_and(|d| d[1]["langgraph_node"] == "search"), "{body}");
    let text: String =
        in_ns.iter().filter(|d| d[1]["langgraph_node"] == "answer").filter_map(|d| d[0]["content"].as_str()).collect();
    assert!(text.contains("within 5 working days"), "{text}");
    assert!(!events.iter().any(|(e, _)| e == "messages"), "no chunk of the answer left at the top: {body}");
    // The reply's update is its node's, in the namespace.
    let reply = events
        .iter()
        .find(|(e, d)| *e == format!("updates|{ns}") && d["answer"].is_object())
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(reply.1["answer"]["messages"][0]["content"].as_str(), Some(text.trim_end()));

    // 3. Without `stream_subgraphs`, the same run streams flat, its agent's nodes by their whole names.
    assert!(flat.iter().all(|(e, _)| !e.contains('|')), "{flat:?}");
    let flat_names: Vec<String> = tasks_in(&flat, "").into_iter().map(|(n, _)| n).collect();
    assert!(
        flat_names.iter().any(|n| n == "billing/intent") && flat_names.iter().any(|n| n == "billing/END"),
        "{flat_names:?}"
    );

    // 4. The refund's call is the model's step in the namespace (`agent`, as a flat run names it),
    // and the pause's task result there names the interrupt the run's end reports at the top.
    let refund_ns = format!("billing:{}", tasks_in(&paused, "")[2].1);
    let call = paused
        .iter()
        .find(|(e, d)| *e == format!("updates|{refund_ns}") && d["agent"].is_object())
        .unwrap_or_else(|| panic!("{paused:?}"));
    assert_eq!(call.1["agent"]["messages"][0]["tool_calls"][0]["name"], "request_refund");
    let results: Vec<&Value> = paused
        .iter()
        .filter(|(e, d)| {
            *e == format!("tasks|{refund_ns}") && d["interrupts"].as_array().is_some_and(|i| !i.is_empty())
        })
        .map(|(_, d)| d)
        .collect();
    assert_eq!(results.len(), 1, "{paused:?}");
    let interrupt = paused.iter().find(|(e, d)| e == "updates" && d["__interrupt__"].is_array()).unwrap();
    assert_eq!(results[0]["interrupts"][0]["id"], interrupt.1["__interrupt__"][0]["id"]);
    // The handing node's task ends with the pause too, with its interrupts (as a sub-graph node's).
    let top_result = paused.iter().find(|(e, d)| e == "tasks" && d["name"] == "billing" && d.get("result").is_some());
    let top_result = top_result.unwrap_or_else(|| panic!("{paused:?}"));
    assert_eq!(top_result.1["id"].as_str(), Some(&refund_ns["billing:".len()..]), "{paused:?}");
    assert_eq!(top_result.1["interrupts"][0]["id"], interrupt.1["__interrupt__"][0]["id"]);

    // 4b. Resumed, the refund's agent goes on in the namespace it paused in: its handing node
    // began in the run before, and the task id is still that node's.
    let after_pause = sse_events(&resumed);
    let went_on = tasks_in(&after_pause, &refund_ns);
    assert!(!went_on.is_empty(), "{resumed}");
    assert!(after_pause.iter().all(|(e, _)| !e.contains('|') || e.ends_with(&format!("|{refund_ns}"))), "{resumed}");
    assert!(resumed.contains("has been requested"), "{resumed}");
    // Its hand-off began in the run before: the handing node's task ends here all the same, with
    // what the agent added since it was handed the turn (the refund's call, its result, the reply).
    let ended = tasks_in(&after_pause, "");
    assert_eq!(ended, [("billing".to_owned(), refund_ns["billing:".len()..].to_owned())], "{resumed}");
    let handed_back = after_pause.iter().find(|(e, d)| e == "updates" && d["billing"].is_object());
    let added = handed_back.map(|(_, d)| d["billing"]["messages"].clone()).unwrap_or_default();
    let kinds: Vec<&str> = added.as_array().into_iter().flatten().filter_map(|m| m["type"].as_str()).collect();
    assert_eq!(kinds, ["ai", "tool", "ai"], "{resumed}");
    assert_eq!(added[0]["tool_calls"][0]["name"], "request_refund", "{resumed}");
    // Joined after the thread handed over again, the resumed run keeps its own namespace.
    let later_ns = format!("billing:{}", tasks_in(&again, "")[2].1);
    assert_ne!(later_ns, refund_ns, "{again:?}");
    assert_eq!(tasks_in(&sse_events(&rejoined_resume), &refund_ns), went_on, "{rejoined_resume}");

    // 5. With no mode of the nodes' own, the chunks are namespaced all the same, by the nodes the
    // run's log names.
    let answered: Vec<(&String, &Value)> =
        tuples.iter().filter(|(_, d)| d[1]["langgraph_node"] == "answer").map(|(e, d)| (e, d)).collect();
    assert!(!answered.is_empty(), "{tuples:?}");
    for (name, d) in &answered {
        let ns = name.strip_prefix("messages|").unwrap_or_else(|| panic!("{name}"));
        assert!(ns.starts_with(&format!("billing:{fourth}-")), "{name}");
        let path = d[1]["langgraph_checkpoint_ns"].as_str().unwrap();
        assert!(path.starts_with(&format!("{ns}|answer:{fourth}-")), "{path}");
    }

    // 6. A client joining the first run here gets it namespaced as it was asked for.
    let rejoined = sse_events(&joined);
    assert_eq!(tasks_in(&rejoined, &ns), inner, "{joined}");
    assert_eq!(tasks_in(&rejoined, ""), top, "{joined}");
}

#[test]
fn agents_check_passes_the_example_and_names_each_problem_of_a_broken_copy() {
    let dir = tempfile::tempdir().unwrap();
    let ok = toolgraph(dir.path(), &["agents", "check"]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success() && stdout.contains("ok   examples/helpdesk/desk.toml (desk): 14 nodes"), "{stdout}");
    assert!(stdout.contains("ok   examples/helpdesk/billing.toml (billing): 8 nodes"), "{stdout}");
    let text = std::fs::read_to_string(repo().join("examples/helpdesk/desk.toml")).unwrap();
    let broken = text.replacen(r#"next = "agent""#, r#"next = "answer""#, 1).replace("{{category}}", "{{label}}");
    let file = dir.path().join("desk.toml");
    std::fs::write(&file, broken).unwrap();
    let out = toolgraph(dir.path(), &["agents", "check", file.to_str().unwrap(), "--agent", "desk"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let f = file.display();
    assert!(stderr.contains(&format!("{f}:46: nodes.search.next: no node named `answer`")), "{stderr}");
    assert!(stderr.contains(&format!("{f}:52: nodes.agent.prompt: the template reads `label`")), "{stderr}");
    // `serve` refuses the broken graph with the same errors before it listens.
    let config = dir.path().join("toolgraph.toml");
    let cfg = std::fs::read_to_string(repo().join("examples/helpdesk/toolgraph.toml")).unwrap();
    // `graph_file = "desk.toml"` is read beside the configuration: the broken copy.
    std::fs::write(&config, cfg).unwrap();
    std::fs::copy(repo().join("examples/helpdesk/billing.toml"), dir.path().join("billing.toml")).unwrap();
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
    assert!(stderr.contains(&format!("{f}:46: nodes.search.next: no node named `answer`")), "{stderr}");
}

/// The help desk in `dir`: its declaration copied there (so the test can change it), its
/// configuration beside it reloading every `poll_ms` (0: on SIGHUP only).
fn desk_in(dir: &Path, poll_ms: u64) -> (PathBuf, PathBuf) {
    let desk = dir.join("desk.toml");
    std::fs::copy(repo().join("examples/helpdesk/desk.toml"), &desk).unwrap();
    std::fs::copy(repo().join("examples/helpdesk/billing.toml"), dir.join("billing.toml")).unwrap();
    let plugins = repo().join("examples/helpdesk/plugins");
    let config = dir.join("toolgraph.toml");
    let text = std::fs::read_to_string(repo().join("examples/helpdesk/toolgraph.toml"))
        .unwrap()
        .replace(r#"dirs = ["examples/helpdesk/plugins"]"#, &format!("dirs = [{:?}]", plugins.display().to_string()))
        + &format!("\n[server]\nreload_poll_ms = {poll_ms}\n");
    assert!(text.contains(&plugins.display().to_string()), "{text}");
    std::fs::write(&config, text).unwrap();
    (config, desk)
}

/// `serve` of the help desk with its `config` (the example's, or a copy), its data in `dir`
/// (tickets and refunds in `tickets.jsonl` and `refunds.jsonl` there), on `model`, from the
/// repository (the example names its plugins from there), once ready: the process and its base
/// URL.
async fn serve_desk(dir: &Path, config: &Path, model: &ScriptedModelServer) -> (std::process::Child, String) {
    let port = free_port();
    let child = serve_command(dir, model, port)
        .arg("--config")
        .arg(config)
        .current_dir(repo())
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .env("HELPDESK_TICKETS", dir.join("tickets.jsonl"))
        .env("HELPDESK_REFUNDS", dir.join("refunds.jsonl"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    (child, base)
}

/// The body of `GET path`, asked as tenant 1's user 1 (on every door).
async fn get_text(base: &str, path: &str) -> String {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .header("X-Tenant-Slug", "demo")
        .header("X-Tenant-Id", "1")
        .header("X-User-Id", "1")
        .timeout(Duration::from_secs(30))
        .send();
    response.await.unwrap().text().await.unwrap()
}

async fn get(base: &str, path: &str) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .header("X-Tenant-Slug", "demo")
        .timeout(Duration::from_secs(10))
        .send();
    response.await.unwrap().json().await.unwrap()
}

/// The desk agent's entry of `/api/chatbot/agents`.
async fn desk_revision(base: &str) -> Value {
    let agents = get(base, "/api/chatbot/agents").await;
    assert_eq!(agents["defaultAgent"], "desk", "{agents}");
    agents["agents"].as_array().unwrap().iter().find(|a| a["name"] == "desk").cloned().unwrap()
}

/// Polls the desk agent's entry until `done` holds of it (at most 10 s).
async fn desk_revision_until(base: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = std::time::Instant::now();
    loop {
        let revision = desk_revision(base).await;
        if done(&revision) {
            return revision;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never reloaded: {revision}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The graph versions conversation `id`'s checkpoints record, deduplicated in order.
async fn versions_of(base: &str, id: &Value) -> Vec<String> {
    let list = get(base, &format!("/api/chatbot/conversations/{id}/checkpoints?tenantId=1&userId=1")).await;
    let mut versions: Vec<String> = list["checkpoints"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|c| c["graph_version"].as_str().unwrap_or("none").to_owned())
        .collect();
    versions.dedup();
    versions
}

fn hang_up(child: &std::process::Child) {
    let sent = Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
}

/// The desk's scripted replies for a ticket (the app named) paused for approval, the reply
/// once it is approved, then `then`.
fn a_ticket_then(then: Vec<Reply>) -> Vec<Reply> {
    let mut replies = vec![
        Reply::text("ticket"),
        Reply::text("desktop"),
        Reply::tool_calls(&[("t1", "open_ticket", json!({"summary": "Sync broken", "details": "since Monday"}))]),
        Reply::text("Ticket T-0001 is open."),
    ];
    replies.extend(then);
    replies
}

/// The stream body of `message` in `conversation` (null: a new one) of tenant 1's user 1.
fn say(conversation: &Value, message: &str) -> Value {
    json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation, "message": message})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_declaration_serves_new_turns_while_a_paused_run_finishes_on_its_own_version() {
    let dir = tempfile::tempdir().unwrap();
    let (config, desk) = desk_in(dir.path(), 0);
    // A, paused on the first version and approved after the reload (its own version's nodes
    // finish it); B and C, new turns on the second version.
    let then = vec![Reply::text("other"), Reply::text("Hi!"), Reply::text("other"), Reply::text("Bye!")];
    let model = ScriptedModelServer::start(a_ticket_then(then)).await.unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let first = desk_revision(&base).await;
    let v1 = first["version"].as_str().unwrap().to_owned();
    assert!(v1.len() == 12 && v1.chars().all(|c| c.is_ascii_hexdigit()) && first.get("refused").is_none(), "{first}");

    let paused =
        post(&base, "/api/chatbot/stream", &say(&Value::Null, "Please open a ticket: sync is broken on my Mac.")).await;
    let a = event_data(&paused, "done")["conversationId"].clone();
    let pending = event_data(&paused, "pending");

    // The second version: the ticket's tools node renamed (the paused run's next node is gone
    // from it) and another prompt for small talk. Written in place, it waits for SIGHUP.
    let original = std::fs::read_to_string(&desk).unwrap();
    let second = original
        .replace("ticket_tools", "desk_tools")
        .replace("Reply briefly and kindly", "Reply in one short sentence");
    assert!(second.contains("[nodes.desk_tools]") && second.contains("Reply in one short sentence"));
    std::fs::write(&desk, &second).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(desk_revision(&base).await["version"], v1.as_str(), "reload_poll_ms = 0: only SIGHUP reloads");
    hang_up(&child);
    let reloaded = desk_revision_until(&base, |r| r["version"] != v1.as_str()).await;
    let v2 = reloaded["version"].as_str().unwrap().to_owned();

    // The paused run resumes on the version it paused on.
    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": a, "messageId": pending["messageId"], "confirmed": true});
    let confirmed: Value = serde_json::from_str(&post(&base, "/api/chatbot/confirm", &confirm).await).unwrap();
    assert_eq!(confirmed["message"], "Ticket T-0001 is open.", "{confirmed}");
    // A new turn runs on the new one.
    let hello = post(&base, "/api/chatbot/stream", &say(&Value::Null, "hello")).await;
    assert_eq!(said(&hello), "Hi!", "{hello}");
    let b = event_data(&hello, "done")["conversationId"].clone();

    // A definition that fails its checks is refused with its errors; the second keeps serving.
    let broken = second.replacen(r#"next = "agent""#, r#"next = "answer""#, 1);
    std::fs::write(&desk, &broken).unwrap();
    hang_up(&child);
    let refused = desk_revision_until(&base, |r| r.get("refused").is_some()).await;
    assert_eq!(refused["version"], v2.as_str(), "{refused}");
    let errors = refused["refused"]["errors"].as_array().unwrap();
    let expected = "desk.toml:46: nodes.search.next: no node named `answer`";
    assert!(errors.iter().any(|e| e.as_str().is_some_and(|e| e.starts_with(expected))), "{expected} in {errors:?}");
    let bye = post(&base, "/api/chatbot/stream", &say(&b, "bye")).await;
    assert_eq!(said(&bye), "Bye!", "{bye}");
    // Putting the second version back clears the refusal.
    std::fs::write(&desk, &second).unwrap();
    hang_up(&child);
    let fixed = desk_revision_until(&base, |r| r.get("refused").is_none()).await;
    assert_eq!(fixed["version"], v2.as_str(), "{fixed}");

    let (versions_a, versions_b) = (versions_of(&base, &a).await, versions_of(&base, &b).await);
    let requests = model.requests();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(versions_a, [v1], "every checkpoint of the paused run is the first version's");
    assert_eq!(versions_b, [v2], "every checkpoint of the new turns is the second version's");
    let (chat, _) = system_and_tools(&requests[5]);
    assert!(chat.contains("Reply in one short sentence"), "{chat}");
    assert_eq!(requests.len(), 8, "{requests:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_paused_before_a_restart_resumes_on_its_own_version_after_the_file_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (config, desk) = desk_in(dir.path(), 0);
    // A ticket paused on the first version, approved after the restart (the first version's
    // nodes finish it); a new turn on the second version.
    let model =
        ScriptedModelServer::start(a_ticket_then(vec![Reply::text("other"), Reply::text("Hi!")])).await.unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let v1 = desk_revision(&base).await["version"].as_str().unwrap().to_owned();
    let paused =
        post(&base, "/api/chatbot/stream", &say(&Value::Null, "Please open a ticket: sync is broken on my Mac.")).await;
    let a = event_data(&paused, "done")["conversationId"].clone();
    let pending = event_data(&paused, "pending");
    assert_eq!(pending["toolName"], "open_ticket", "{paused}");
    let _ = child.kill();
    let _ = child.wait();

    // While it is down, the file changes: the paused run's next node (`ticket_tools`) is gone
    // from the version the restarted process loads.
    let original = std::fs::read_to_string(&desk).unwrap();
    let second = original.replace("ticket_tools", "desk_tools");
    assert!(second.contains("[nodes.desk_tools]") && !second.contains("ticket_tools"));
    std::fs::write(&desk, &second).unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let v2 = desk_revision(&base).await["version"].as_str().unwrap().to_owned();
    assert_ne!(v1, v2, "the restarted process serves the changed file");

    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": a, "messageId": pending["messageId"], "confirmed": true});
    let confirmed: Value = serde_json::from_str(&post(&base, "/api/chatbot/confirm", &confirm).await).unwrap();
    assert_eq!(confirmed["message"], "Ticket T-0001 is open.", "{confirmed}");
    let hello = post(&base, "/api/chatbot/stream", &say(&Value::Null, "hello")).await;
    assert_eq!(said(&hello), "Hi!", "{hello}");
    let b = event_data(&hello, "done")["conversationId"].clone();

    let (versions_a, versions_b) = (versions_of(&base, &a).await, versions_of(&base, &b).await);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(versions_a, [v1], "the paused run finished on the version it paused on");
    assert_eq!(versions_b, [v2], "new turns run on the file as it is now");
    let tickets = std::fs::read_to_string(dir.path().join("tickets.jsonl")).unwrap();
    assert_eq!(tickets.lines().count(), 1, "the approved ticket was opened once: {tickets}");
    assert!(tickets.contains("Sync broken"), "{tickets}");
    assert_eq!(model.requests().len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_file_that_changes_is_reloaded_without_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let (config, desk) = desk_in(dir.path(), 100);
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let v1 = desk_revision(&base).await["version"].clone();
    let text = std::fs::read_to_string(&desk).unwrap().replace("top_k = 3", "top_k = 5");
    // In place, not renamed over: a file caught half-written is waited out, not refused.
    std::fs::write(&desk, &text).unwrap();
    let reloaded = desk_revision_until(&base, |r| r["version"] != v1).await;
    // A broken change is refused without a signal too, and only once looked at.
    let broken = text.replace(r#"start = "triage""#, r#"start = "nowhere""#);
    std::fs::write(&desk, broken).unwrap();
    let refused = desk_revision_until(&base, |r| r.get("refused").is_some()).await;
    // The file put back as it serves: the refusal no longer stands.
    std::fs::write(&desk, &text).unwrap();
    let restored = desk_revision_until(&base, |r| r.get("refused").is_none()).await;
    // The agent the desk hands billing to is part of the desk: changing its file makes a new
    // version of the desk too.
    let billing = dir.path().join("billing.toml");
    let billing_text = std::fs::read_to_string(&billing).unwrap().replace("top_k = 3", "top_k = 4");
    std::fs::write(&billing, &billing_text).unwrap();
    let handed = desk_revision_until(&base, |r| r["version"] != reloaded["version"]).await;
    // And a broken change to it refuses the desk's new version, naming that file.
    assert!(billing_text.contains(r#"start = "intent""#) && billing_text.contains("top_k = 4"));
    std::fs::write(&billing, billing_text.replace(r#"start = "intent""#, r#"start = "nowhere""#)).unwrap();
    let handed_refused = desk_revision_until(&base, |r| r.get("refused").is_some()).await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(refused["version"], reloaded["version"], "{refused}");
    assert_eq!(restored["version"], reloaded["version"], "{restored}");
    assert!(handed.get("refused").is_none(), "{handed}");
    assert_eq!(handed_refused["version"], handed["version"], "the version before it keeps serving");
    let errors = handed_refused["refused"]["errors"].to_string();
    assert!(errors.contains("\"billing.toml:10: start: no node named `nowhere`"), "{errors}");
    assert!(!errors.contains(&dir.path().display().to_string()), "{errors}");
    let errors = refused["refused"]["errors"].to_string();
    // Named by the file's name only: callers of the API do not see where it lives.
    assert!(errors.contains("\"desk.toml:14: start: no node named `nowhere`"), "{errors}");
    assert!(!errors.contains(&dir.path().display().to_string()), "{errors}");
}

/// `chat --url` puts an agent's question to the person: an answer off the form is refused by
/// the service and asked again, the next one goes through `/answer`, and the approval after it
/// through `/confirm`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_url_answers_a_question_then_approves_the_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = desk_in(dir.path(), 0);
    let model = ScriptedModelServer::start(vec![
        Reply::text("ticket"),
        Reply::text("unknown"),
        Reply::tool_calls(&[("t1", "open_ticket", json!({"summary": "Sync fails on my phone"}))]),
        Reply::text("Ticket T-0001 is open."),
    ])
    .await
    .unwrap();
    let (mut server, base) = serve_desk(dir.path(), &config, &model).await;
    let tickets = dir.path().join("tickets.jsonl");
    let transcript = dir.path().join("transcript.jsonl");
    let mut client = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["chat", "--url", &base, "--tenant-slug", "demo", "--transcript"])
        .arg(&transcript)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut client.stdin.take().unwrap(), b"Open a ticket: sync fails.\nphone\nmobile\ny\n")
        .unwrap();
    let out = tokio::task::block_in_place(|| client.wait_with_output()).unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the agent asks: Which app is it in: desktop, mobile or web?\n[desktop / mobile / web]"),
        "{stderr}"
    );
    assert!(stderr.contains("does not fit the form"), "`phone` was refused: {stderr}");
    assert!(stderr.contains("approval needed: Open a ticket: Sync fails on my phone"), "{stderr}");
    assert!(stdout.contains("Ticket T-0001 is open."), "{stdout}");
    assert_eq!(std::fs::read_to_string(&tickets).unwrap().lines().count(), 1, "opened once");
    let lines: Vec<Value> =
        std::fs::read_to_string(&transcript).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let answers: Vec<&Value> = lines.iter().filter(|l| l["event"] == "answer").collect();
    assert_eq!(answers.len(), 2, "{lines:#?}");
    assert_eq!((answers[0]["data"]["status"].as_u64(), answers[1]["data"]["status"].as_u64()), (Some(422), Some(200)));
    assert_eq!(answers[1]["data"]["request"]["answer"], "mobile");
    let requests = model.requests();
    let ticket = requests[2]["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(ticket.contains("(in the mobile app)"), "{ticket}");
}

/// A question the person declines (`/confirm` with `confirmed = false`) writes nothing into
/// its channel, and the graph's route goes on from there: no ticket, a reply that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_question_leaves_its_channel_empty_and_the_route_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = desk_in(dir.path(), 0);
    let model = ScriptedModelServer::start(vec![Reply::text("ticket"), Reply::text("unknown")]).await.unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let asked = post(
        &base,
        "/api/chatbot/stream",
        &json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "message": "Open a ticket, please."}),
    )
    .await;
    let conversation = event_data(&asked, "done")["conversationId"].clone();
    let question = event_data(&asked, "pending");
    let decline = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": question["messageId"], "confirmed": false});
    let declined: Value = serde_json::from_str(&post(&base, "/api/chatbot/confirm", &decline).await).unwrap();
    let checkpoints =
        get(&base, &format!("/api/chatbot/conversations/{conversation}/checkpoints?tenantId=1&userId=1")).await;
    let requests = model.requests();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(question["toolName"], "@ask", "{question}");
    assert_eq!(
        declined["message"],
        "Without knowing the app I cannot open the ticket yet; tell me which one whenever you are ready.",
        "{declined}"
    );
    assert!(declined["pendingAction"].is_null(), "{declined}");
    assert_eq!(requests.len(), 2, "the ticket node never ran: {requests:#?}");
    let nodes: Vec<&str> =
        checkpoints["checkpoints"].as_array().unwrap().iter().filter_map(|c| c["node"].as_str()).collect();
    assert!(nodes.ends_with(&["ask_app_answered", "no_app"]), "{nodes:?}");
    assert!(!dir.path().join("tickets.jsonl").exists(), "no ticket was opened");
}

/// `POST path` with `body` as tenant 1's user 1: the status and the JSON answered.
async fn post_json(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = posted(base, path, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A state update on the LangGraph door writes the channels a declared graph lets a client
/// write (the way the state shows them, as the node named wrote them), and refuses the graph's
/// own and the ones it does not declare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_update_writes_the_declared_channels_and_only_those() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = desk_in(dir.path(), 0);
    let model = ScriptedModelServer::start(vec![Reply::text("other"), Reply::text("Hi! What can I do for you?")])
        .await
        .unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let (_, thread) = post_json(&base, "/threads", &json!({})).await;
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let hello = json!({"assistant_id": "desk", "input": {"messages": [{"type": "human", "content": "Hello!"}]},
        "stream_mode": ["values", "updates"]});
    let streamed = post(&base, &format!("/threads/{thread}/runs/stream"), &hello).await;
    let events = sse_events(&streamed);
    // The classifier's channel write is its node's update, before the reply's; the run ends on
    // values that hold it.
    let at = |update: Value| events.iter().position(|(e, d)| e == "updates" && *d == update);
    let triaged = at(json!({"triage": {"channels": {"category": "other"}}}));
    let replied = events.iter().position(|(e, d)| e == "updates" && d.get("triage").is_none());
    assert!(triaged.is_some() && triaged < replied, "{streamed}");
    let (last, ran) = events.last().unwrap();
    assert_eq!((last.as_str(), &ran["channels"]["category"]), ("values", &json!("other")), "{streamed}");

    let state_path = format!("/threads/{thread}/state");
    let update = json!({"values": {"channels": {"app": "web"}}, "as_node": "which_app"});
    let (status, written) = post_json(&base, &state_path, &update).await;
    assert_eq!(status, 200, "{written}");
    let read = || async { serde_json::from_str::<Value>(&get_text(&base, &state_path).await).unwrap() };
    let state = read().await;
    assert_eq!(state["checkpoint"]["checkpoint_id"], written["checkpoint"]["checkpoint_id"], "{state}");
    assert_eq!(state["values"]["channels"]["app"], "web", "{state}");
    assert_eq!(state["values"]["channels"]["category"], "other", "the others as they were: {state}");
    assert_eq!(state["values"]["messages"].as_array().map(Vec::len), Some(2), "{state}");
    let (_, history) = post_json(&base, &format!("/threads/{thread}/history"), &json!({"limit": 1})).await;
    assert_eq!(history[0]["metadata"]["source"], "which_app", "{history}");

    // Refused, naming what is wrong, and nothing written.
    let refusals = [
        (json!({"channels": {"category": "billing"}}), "`channels.category` is the graph's own"),
        (json!({"channels": {"app": "tablet"}}), "`channels.app` does not fit what the graph writes there"),
        (json!({"channels": {"history_summary": "made up"}}), "`channels.history_summary` is not a channel"),
        (json!({"app": "mobile"}), "write it as `channels.app`"),
        (json!({"channels": "app=mobile"}), "`channels` is an object"),
        (json!({"context": {"user_id": 2}}), "only `messages` and `channels` can"),
    ];
    for (values, why) in refusals {
        let (status, refused) = post_json(&base, &state_path, &json!({"values": values})).await;
        assert_eq!(status, 422, "{values}: {refused}");
        assert!(refused.to_string().contains(why), "{values}: {refused}");
    }
    let after = read().await;
    assert_eq!(
        (&after["checkpoint"]["checkpoint_id"], &after["values"]["channels"]["app"]),
        (&state["checkpoint"]["checkpoint_id"], &json!("web")),
        "{after}"
    );
    // Any label a node of the graph writes there: the classifier's `unknown` too.
    let (status, unknown) = post_json(&base, &state_path, &json!({"values": {"channels": {"app": "unknown"}}})).await;
    assert_eq!(status, 200, "{unknown}");
    let _ = child.kill();
    let _ = child.wait();
}

/// A client of `values` on the LangGraph door sees each node's channel writes as LangGraph
/// sends a step's values: the classifiers' labels as soon as they are written, and still there
/// in the values streamed with the search's call and result after them; the last values are
/// the thread's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_streamed_after_a_channel_write_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    ingest_articles(dir.path());
    let model = ScriptedModelServer::start(vec![
        Reply::text("billing"),
        Reply::text("question"),
        Reply::text(DOUBLE_CHARGE_ANSWER),
    ])
    .await
    .unwrap();
    let (mut child, base) = serve_desk(dir.path(), &repo().join("examples/helpdesk/toolgraph.toml"), &model).await;
    let (_, thread) = post_json(&base, "/threads", &json!({})).await;
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let question = json!({"assistant_id": "desk",
        "input": {"messages": [{"type": "human", "content": "I was charged twice this month. What happens now?"}]},
        "stream_mode": ["values"]});
    let body = post(&base, &format!("/threads/{thread}/runs/stream"), &question).await;
    let state: Value = serde_json::from_str(&get_text(&base, &format!("/threads/{thread}/state")).await).unwrap();
    let _ = child.kill();
    let _ = child.wait();

    let values: Vec<Value> = sse_events(&body).into_iter().filter(|(e, _)| e == "values").map(|(_, d)| d).collect();
    let channel = |v: &Value, name: &str| v["channels"].get(name).cloned().unwrap_or(Value::Null);
    let searched = |v: &Value| {
        v["messages"].as_array().is_some_and(|ms| ms.iter().any(|m| m["type"] == "tool" && m["name"] == "rag_search"))
    };
    // The run's input first: the question, no label yet.
    assert_eq!(values[0]["messages"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(channel(&values[0], "category"), Value::Null, "{body}");
    // The triage's label, in values of their own before the search ran.
    let labelled = values.iter().position(|v| channel(v, "category") == "billing");
    let first_search = values.iter().position(searched);
    assert!(labelled.is_some() && labelled < first_search, "{body}");
    assert!(!searched(&values[labelled.unwrap()]), "{body}");
    // Every values event from the label on holds it, and those with the search's result hold
    // the billing desk's own label too.
    for v in &values[labelled.unwrap()..] {
        assert_eq!(channel(v, "category"), "billing", "{v}");
    }
    for v in values.iter().filter(|v| searched(v)) {
        assert_eq!(channel(v, "billing/intent"), "question", "{v}");
    }
    // No values sent twice in a row; the last are the state's.
    assert!(values.windows(2).all(|w| w[0] != w[1]), "{body}");
    let last = values.last().unwrap();
    assert_eq!(last["channels"], state["values"]["channels"], "{body}");
    assert_eq!(last["messages"], state["values"]["messages"], "{body}");
}

/// A run whose last node writes a channel sends the values its checkpoint holds once: the
/// run's end does not send the same values again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ending_on_a_channel_write_sends_its_last_values_once() {
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("moody.toml");
    std::fs::write(
        &graph,
        "description = \"Says hello, then notes the mood.\"\nstart = \"greet\"\n\n[channels]\nmood = {}\n\n\
         [nodes.greet]\nkind = \"reply\"\ntext = \"Hello!\"\nnext = \"mood\"\n\n\
         [nodes.mood]\nkind = \"model\"\nhistory = \"last_message\"\nprompt = \"Is the message happy or sad?\"\n\
         output = { channel = \"mood\", schema = { enum = [\"happy\", \"sad\"] } }\nnext = \"END\"\n",
    )
    .unwrap();
    // `front` hands every turn to `moody`: its values stream in the sub-graph's namespace.
    let front = dir.path().join("front.toml");
    std::fs::write(
        &front,
        "description = \"Hands every turn over.\"\nstart = \"moody\"\n\n\
         [nodes.moody]\nkind = \"agent\"\nagent = \"moody\"\nnext = \"END\"\n",
    )
    .unwrap();
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(
        &config,
        format!(
            "[agents.moody]\ngraph_file = {:?}\ntools = []\n[agents.front]\ngraph_file = {:?}\ntools = []\n",
            graph.display().to_string(),
            front.display().to_string()
        ),
    )
    .unwrap();
    let model = ScriptedModelServer::start(vec![Reply::text("happy"), Reply::text("happy")]).await.unwrap();
    let (mut child, base) = serve_desk(dir.path(), &config, &model).await;
    let (_, thread) = post_json(&base, "/threads", &json!({})).await;
    let thread = thread["thread_id"].as_str().unwrap().to_owned();
    let run = json!({"assistant_id": "moody", "input": {"messages": [{"type": "human", "content": "What a day!"}]},
        "stream_mode": ["values"]});
    let body = post(&base, &format!("/threads/{thread}/runs/stream"), &run).await;
    // Handed over, with sub-graphs asked for: the channel write's values are the sub-graph's;
    // the run still ends on the graph's own.
    let (_, other) = post_json(&base, "/threads", &json!({})).await;
    let other = other["thread_id"].as_str().unwrap().to_owned();
    let handed = json!({"assistant_id": "front", "input": {"messages": [{"type": "human", "content": "What a day!"}]},
        "stream_mode": ["values"], "stream_subgraphs": true});
    let nested = sse_events(&post(&base, &format!("/threads/{other}/runs/stream"), &handed).await);
    let _ = child.kill();
    let _ = child.wait();
    assert!(nested.iter().any(|(e, _)| e.starts_with("values|")), "{nested:?}");
    let (event, top) = nested.last().unwrap();
    assert_eq!(event, "values", "{nested:?}");
    assert!(top["channels"].as_object().unwrap().values().any(|v| v == "happy"), "{top}");

    let values: Vec<Value> = sse_events(&body).into_iter().filter(|(e, _)| e == "values").map(|(_, d)| d).collect();
    let last = values.last().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(last["channels"]["mood"], "happy", "{body}");
    let said: Vec<&Value> = last["messages"].as_array().unwrap().iter().map(|m| &m["content"]).collect();
    assert_eq!(said, [&json!("What a day!"), &json!("Hello!")], "{body}");
    assert!(values.windows(2).all(|w| w[0] != w[1]), "the same values twice: {body}");
}
