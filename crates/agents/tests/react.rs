//! The prebuilt ReAct agent against the scripted model server over real HTTP.

use schemars::JsonSchema;
use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use toolgraph_agents::kit::{self, AgentSpec, AgentState, user_turn};
use toolgraph_agents::react::{self, REJECTED_OUTCOME};
use toolgraph_graph::*;
use toolgraph_llm::{Message, OpenAiChatModel, OpenAiConfig, RetryPolicy};
use toolgraph_tools::{ToolBuilder, ToolRegistry, builtin};

#[derive(Deserialize, JsonSchema)]
struct SmsArgs {
    /// Recipient.
    to: String,
    /// Text.
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct QueryArgs {
    /// A read-only SQL SELECT.
    sql: String,
}

#[derive(Deserialize, JsonSchema)]
struct GuiaArgs {
    /// Injected subject.
    asignatura: Option<String>,
    /// Section.
    key: Option<String>,
}

struct Counters {
    sms: AtomicUsize,
    announcements: AtomicUsize,
}

fn tools(counters: Arc<Counters>) -> ToolRegistry {
    let mut reg = builtin::registry(std::path::Path::new("/nonexistent")).unwrap();
    let c = counters.clone();
    reg.register(
        ToolBuilder::<SmsArgs>::new("send_sms", "Send an SMS")
            .write(|a| format!("Send an SMS to {}: \"{}\"", a.to, a.text))
            .handler(move |_ctx, a| {
                let c = c.clone();
                async move {
                    c.sms.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"ok": true, "sent_to": a.to}))
                }
            })
            .unwrap(),
    )
    .unwrap();
    let c = counters;
    reg.register(
        ToolBuilder::<SmsArgs>::new("create_announcement", "Publish an announcement")
            .write(|a| format!("Publish the announcement \"{}\"", a.text))
            .handler(move |_ctx, _a| {
                let c = c.clone();
                async move {
                    c.announcements.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"ok": true}))
                }
            })
            .unwrap(),
    )
    .unwrap();
    reg.register(
        ToolBuilder::<QueryArgs>::new("general_query", "Run a read-only SQL query")
            .handler(|_ctx, a| async move {
                if a.sql.to_lowercase().contains("students") {
                    Ok(json!({"rows": [[42]]}))
                } else {
                    Err(toolgraph_tools::ToolError::invalid_arguments(format!(
                        "relation in '{}' does not exist",
                        a.sql
                    )))
                }
            })
            .unwrap(),
    )
    .unwrap();
    reg.register(
        ToolBuilder::<GuiaArgs>::new("get_guia", "Teaching guide of the current subject")
            .inject("asignatura")
            .handler(|_ctx, a| async move { Ok(json!({"asignatura": a.asignatura, "key": a.key})) })
            .unwrap(),
    )
    .unwrap();
    reg.register(
        ToolBuilder::<QueryArgs>::new("fragile", "Panics")
            .handler(|_ctx, _a| async move {
                if true {
                    panic!("tool bug");
                }
                Ok(json!(null))
            })
            .unwrap(),
    )
    .unwrap();
    reg
}

struct Harness {
    server: ScriptedModelServer,
    graph: CompiledGraph<AgentState, kit::AgentDeps>,
    counters: Arc<Counters>,
}

async fn harness(script: Vec<Reply>) -> Harness {
    harness_with(script, Arc::new(MemoryCheckpointer::new())).await
}

async fn harness_with(script: Vec<Reply>, store: Arc<dyn Checkpointer>) -> Harness {
    harness_spec(script, store, |_| {}).await
}

async fn harness_spec(script: Vec<Reply>, store: Arc<dyn Checkpointer>, tweak: impl FnOnce(&mut AgentSpec)) -> Harness {
    let server = ScriptedModelServer::start(script).await.unwrap();
    let mut cfg = OpenAiConfig::new(server.base_url(), "scripted");
    cfg.retry =
        RetryPolicy { max_retries: 1, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(10) };
    let model = Arc::new(OpenAiChatModel::new(cfg).unwrap());
    let counters = Arc::new(Counters { sms: AtomicUsize::new(0), announcements: AtomicUsize::new(0) });
    let mut spec = AgentSpec::new("test", "You are Lumie's assistant.", tools(counters.clone()));
    spec.max_tool_retries = 2;
    tweak(&mut spec);
    let graph = react::build(spec, model, store).unwrap();
    Harness { server, graph, counters }
}

fn t(n: u32) -> ThreadId {
    ThreadId::new(7, n)
}

fn texts(events: &[RunEvent]) -> String {
    events
        .iter()
        .filter_map(|e| if let RunEvent::TextDelta { text } = e { Some(text.as_str()) } else { None })
        .collect()
}

#[tokio::test]
async fn read_tool_then_streamed_answer() {
    let h = harness(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::text("The answer is 42."),
    ])
    .await;
    let (events, out) =
        h.graph.start(&t(1), user_turn("What is 6*7?", None), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.last_reply(), Some("The answer is 42."));
    assert_eq!(texts(&events), "The answer is 42.");
    assert!(events.iter().any(|e| matches!(e, RunEvent::ToolResult { name, ok: true, outcome, .. } if name == "calculator" && outcome["result"] == 42.0)));
    let second = &h.server.requests()[1]["messages"];
    assert_eq!(second[0]["role"], "system");
    let tool_msg = second.as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_msg["tool_call_id"], "c1");
    assert!(tool_msg["content"].as_str().unwrap().contains("\"result\":42"));
    // Tools were offered with generated schemas.
    let requests = h.server.requests();
    let offered: Vec<&str> =
        requests[0]["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(offered.contains(&"send_sms") && offered.contains(&"calculator"));
    // Unset sampling settings are left to the model server.
    assert!(requests.iter().all(|r| r.get("max_tokens").is_none() && r.get("temperature").is_none()));
}

#[tokio::test]
async fn the_agents_temperature_and_token_limit_reach_every_model_call() {
    let script =
        vec![Reply::tool_calls(&[("c1", "calculator", json!({"expression": "1+1"}))]), Reply::text("It is 2.")];
    let h = harness_spec(script, Arc::new(MemoryCheckpointer::new()), |spec| {
        spec.temperature = Some(0.25);
        spec.max_tokens = Some(300);
    })
    .await;
    let (_, out) = h.graph.start(&t(1), user_turn("1+1?", None), RunOptions::default()).await.unwrap().collect().await;
    assert!(matches!(out, RunOutcome::Completed { .. }), "{out:?}");
    let requests = h.server.requests();
    assert_eq!(requests.len(), 2, "a tool round and the answer");
    for r in &requests {
        assert_eq!(r["max_tokens"], 300, "{r}");
        assert_eq!(r["temperature"], 0.25, "{r}");
    }
}

/// A tool set (an MCP server's) that changes between two model calls of one turn: the second
/// call offers the new member, and the model can call it.
#[tokio::test]
async fn a_tool_set_that_changes_is_offered_as_it_is_at_each_model_call() {
    let set = Arc::new(toolgraph_tools::ToolSet::new("remote", Vec::new()));
    let grow = Arc::clone(&set);
    let script = vec![
        Reply::tool_calls(&[("c1", "grow", json!({"sql": "x"}))]),
        Reply::tool_calls(&[("c2", "remote_echo", json!({"sql": "hola"}))]),
        Reply::text("Done."),
    ];
    let h = harness_spec(script, Arc::new(MemoryCheckpointer::new()), |spec| {
        let echo = ToolBuilder::<QueryArgs>::new("remote_echo", "Echo")
            .handler(|_ctx, a| async move { Ok(json!({"echo": a.sql})) })
            .unwrap();
        // A local tool that makes the set grow, as a server does after some call.
        let grow_tool = ToolBuilder::<QueryArgs>::new("grow", "Grow the remote tools")
            .handler(move |_ctx, _a| {
                let (set, echo) = (Arc::clone(&grow), Arc::clone(&echo));
                async move {
                    set.replace(vec![echo]);
                    Ok(json!({"ok": true}))
                }
            })
            .unwrap();
        let mut tools = ToolRegistry::new();
        tools.register(grow_tool).unwrap();
        tools.register_set(Arc::clone(&set)).unwrap();
        spec.tools = tools;
    })
    .await;
    let (events, out) =
        h.graph.start(&t(1), user_turn("go", None), RunOptions::default()).await.unwrap().collect().await;
    assert!(matches!(out, RunOutcome::Completed { .. }), "{out:?}");
    let offered = |i: usize| -> Vec<String> {
        h.server.requests()[i]["tools"]
            .as_array()
            .map(|a| a.iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    assert_eq!(offered(0), ["grow"]);
    assert_eq!(offered(1), ["grow", "remote_echo"]);
    assert!(events.iter().any(|e| matches!(e, RunEvent::ToolResult { name, ok: true, outcome, .. } if name == "remote_echo" && outcome["echo"] == "hola")));
}

#[tokio::test]
async fn two_write_tools_pause_then_one_approved_runs_once_and_the_rejected_never() {
    let store: Arc<dyn Checkpointer> =
        Arc::new(SqliteCheckpointer::open(&tempfile::tempdir().unwrap().keep().join("t.db")).await.unwrap());
    let h = harness_with(
        vec![
            Reply::tool_calls(&[
                ("s1", "send_sms", json!({"to": "+34600111222", "text": "Exam moved to Friday"})),
                ("a1", "create_announcement", json!({"to": "all", "text": "Exam moved"})),
            ]),
            Reply::text("Done: the SMS was sent; the announcement was not published."),
        ],
        store.clone(),
    )
    .await;
    let (events, out) = h
        .graph
        .start(&t(2), user_turn("Tell everyone the exam moved", None), RunOptions::default())
        .await
        .unwrap()
        .collect()
        .await;
    let RunOutcome::Interrupted { pending, .. } = out else { panic!("{out:?}") };
    assert_eq!(pending.len(), 2);
    assert!(events.iter().any(|e| matches!(e, RunEvent::Interrupted { pending } if pending.len() == 2)));
    let sms = pending.iter().find(|p| p.payload["tool"] == "send_sms").unwrap();
    assert_eq!(sms.payload["description"], "Send an SMS to +34600111222: \"Exam moved to Friday\"");
    let ann = pending.iter().find(|p| p.payload["tool"] == "create_announcement").unwrap();
    assert_eq!(h.counters.sms.load(Ordering::SeqCst), 0, "write tools never run before approval");

    // Decisions arrive one by one, as /confirm delivers them.
    let r = h
        .graph
        .resume(&t(2), BTreeMap::from([(ann.id.clone(), Decision::Reject)]), RunOptions::default())
        .await
        .unwrap();
    assert!(matches!(r, ResumeResult::Waiting { ref undecided } if undecided.len() == 1));
    let r = h
        .graph
        .resume(&t(2), BTreeMap::from([(sms.id.clone(), Decision::Approve)]), RunOptions::default())
        .await
        .unwrap();
    let ResumeResult::Started(run) = r else { panic!("should continue") };
    let RunOutcome::Completed { state } = run.outcome().await else { panic!("completed") };
    assert_eq!(state.last_reply(), Some("Done: the SMS was sent; the announcement was not published."));
    assert_eq!(h.counters.sms.load(Ordering::SeqCst), 1);
    assert_eq!(h.counters.announcements.load(Ordering::SeqCst), 0);
    let rejected = state
        .messages
        .iter()
        .find(|m| matches!(m, Message::Tool { tool_call_id, .. } if tool_call_id == "a1"))
        .unwrap();
    assert!(rejected.content().contains(REJECTED_OUTCOME));
    // Replaying the approval changes nothing.
    assert!(
        h.graph
            .resume(&t(2), BTreeMap::from([(sms.id.clone(), Decision::Approve)]), RunOptions::default())
            .await
            .is_err()
    );
    assert_eq!(h.counters.sms.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn all_rejected_ends_with_the_cancellation_text_and_no_model_call() {
    let h = harness(vec![Reply::tool_calls(&[("s1", "send_sms", json!({"to": "+1555", "text": "hi"}))])]).await;
    let out = h.graph.start(&t(3), user_turn("text Bob", None), RunOptions::default()).await.unwrap().outcome().await;
    let RunOutcome::Interrupted { pending, .. } = out else { panic!("{out:?}") };
    let r = h
        .graph
        .resume(&t(3), BTreeMap::from([(pending[0].id.clone(), Decision::Reject)]), RunOptions::default())
        .await
        .unwrap();
    let ResumeResult::Started(run) = r else { panic!() };
    let (events, out) = run.collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    let expected = react::cancellation_text(&["Send an SMS to +1555: \"hi\"".to_string()]);
    assert_eq!(state.last_reply(), Some(expected.as_str()));
    assert_eq!(texts(&events), expected);
    assert_eq!(h.server.request_count(), 1, "no model call after an all-rejected turn");
    assert_eq!(h.counters.sms.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn failing_read_tool_is_repaired_a_bounded_number_of_times_then_gives_up() {
    let bad = |id: &str| Reply::tool_calls(&[(id, "general_query", json!({"sql": "select * from nope"}))]);
    let h = harness(vec![bad("q1"), bad("q2"), bad("q3"), Reply::text("unreachable")]).await;
    let opts = RunOptions { recursion_limit: 20, ..RunOptions::default() };
    let (events, out) =
        h.graph.start(&t(4), user_turn("How many students?", None), opts).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    let reply = state.last_reply().unwrap();
    assert!(reply.contains("after 3 attempts") && reply.contains("does not exist"), "{reply}");
    assert_eq!(h.server.request_count(), 3, "max_tool_retries=2: the third failure gives up");
    assert_eq!(events.iter().filter(|e| matches!(e, RunEvent::ToolResult { ok: false, .. })).count(), 3);
}

#[tokio::test]
async fn a_repaired_query_succeeds() {
    let h = harness(vec![
        Reply::tool_calls(&[("q1", "general_query", json!({"sql": "select count(*) from studens"}))]),
        Reply::tool_calls(&[("q2", "general_query", json!({"sql": "select count(*) from students"}))]),
        Reply::text("42 students."),
    ])
    .await;
    let out = h
        .graph
        .start(&t(5), user_turn("How many students?", None), RunOptions::default())
        .await
        .unwrap()
        .outcome()
        .await;
    assert_eq!(out.state().last_reply(), Some("42 students."));
    // The model saw the error it had to repair.
    let msgs = h.server.requests()[1]["messages"].clone();
    let tool = msgs.as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool["content"].as_str().unwrap().contains("\"kind\":\"invalid_arguments\""));
}

#[tokio::test]
async fn unknown_tools_invalid_json_and_panics_become_tool_messages() {
    let h = harness(vec![
        Reply::tool_calls(&[("u1", "get_weather", json!({"city": "Granada"})), ("p1", "fragile", json!({"sql": "x"}))]),
        Reply::Stream(vec![
            scripted_llm::Step::ToolCallStart { index: 0, id: "j1".into(), name: "calculator".into() },
            scripted_llm::Step::ToolArgs { index: 0, fragment: "{\"expression\": ".into() },
            scripted_llm::Step::Finish("tool_calls".into()),
            scripted_llm::Step::Done,
        ]),
        Reply::text("Sorry, I could not do that."),
    ])
    .await;
    let out = h.graph.start(&t(6), user_turn("weather?", None), RunOptions::default()).await.unwrap().outcome().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    let tool_texts: Vec<String> =
        state.messages.iter().filter(|m| matches!(m, Message::Tool { .. })).map(|m| m.content().to_owned()).collect();
    assert!(tool_texts.iter().any(|t| t.contains("unknown tool 'get_weather'")), "{tool_texts:?}");
    assert!(tool_texts.iter().any(|t| t.contains("tool bug") && t.contains("internal")), "{tool_texts:?}");
    assert!(tool_texts.iter().any(|t| t.contains("not valid JSON")), "{tool_texts:?}");
    assert_eq!(state.last_reply(), Some("Sorry, I could not do that."));
}

#[tokio::test]
async fn injected_state_reaches_the_tool_but_not_the_model_schema() {
    let h = harness(vec![Reply::tool_calls(&[("g1", "get_guia", json!({"key": "competencias"}))]), Reply::text("ok")])
        .await;
    let ctx = serde_json::Map::from_iter([("asignatura".to_string(), json!("iv"))]);
    let (events, _) = h
        .graph
        .start(&t(7), user_turn("competencias?", Some(ctx)), RunOptions::default())
        .await
        .unwrap()
        .collect()
        .await;
    let result = events
        .iter()
        .find_map(|e| if let RunEvent::ToolResult { outcome, .. } = e { Some(outcome.clone()) } else { None });
    assert_eq!(result, Some(json!({"asignatura": "iv", "key": "competencias"})));
    let guia = h.server.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "get_guia")
        .cloned()
        .unwrap();
    assert!(guia["function"]["parameters"]["properties"].get("asignatura").is_none());
}

#[tokio::test]
async fn a_failing_model_ends_the_run_with_an_error_outcome() {
    let h = harness(vec![Reply::status(500, "boom"), Reply::status(503, "still boom")]).await;
    let (events, out) =
        h.graph.start(&t(8), user_turn("hi", None), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Failed { error, .. } = out else { panic!("{out:?}") };
    assert!(error.to_string().contains("HTTP 503"), "{error}");
    assert!(matches!(events.last(), Some(RunEvent::Error { message }) if message.contains("model endpoint")));
    // The thread is usable again.
    h.server.push([Reply::text("back")]);
    let out = h.graph.start(&t(8), user_turn("hi again", None), RunOptions::default()).await.unwrap().outcome().await;
    assert_eq!(out.state().last_reply(), Some("back"));
}

#[tokio::test]
async fn a_model_that_never_stops_calling_tools_hits_the_recursion_limit() {
    // Each call asks something new, so each runs.
    let call = |i: u32| Reply::tool_calls(&[(&format!("c{i}"), "calculator", json!({"expression": format!("1+{i}")}))]);
    let h = harness((0..10).map(call).collect()).await;
    let out = h.graph.start(&t(9), user_turn("loop", None), RunOptions::default()).await.unwrap().outcome().await;
    assert!(matches!(out, RunOutcome::RecursionLimit { limit: 10, .. }), "{out:?}");
}

#[tokio::test]
async fn a_model_that_asks_again_for_a_result_it_has_answers_from_it_without_tools() {
    // The second call is the first again, its arguments spaced otherwise; the third reply
    // answers the request that offered no tools.
    let spaced = Reply::Stream(vec![
        Step::ToolCallStart { index: 0, id: "c2".into(), name: "calculator".into() },
        Step::ToolArgs { index: 0, fragment: r#"{ "expression" :  "6*7" }"#.into() },
        Step::Finish("tool_calls".into()),
        Step::Done,
    ]);
    let h = harness(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        spaced,
        Reply::text("It is 42."),
    ])
    .await;
    let (events, out) =
        h.graph.start(&t(10), user_turn("What is 6*7?", None), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.last_reply(), Some("It is 42."));
    assert_eq!(texts(&events), "It is 42.");
    let ran = events.iter().filter(|e| matches!(e, RunEvent::ToolResult { .. })).count();
    assert_eq!(ran, 1, "the repeated call never ran: {events:?}");
    let requests = h.server.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests[1]["tools"].as_array().is_some_and(|t| !t.is_empty()), "the repeat was asked with tools");
    assert!(requests[2].get("tools").is_none_or(|t| t.as_array().is_some_and(Vec::is_empty)), "{}", requests[2]);
    // What the model read: the one result, and no trace of the call it repeated.
    let last = requests[2]["messages"].as_array().unwrap();
    assert_eq!(last.iter().filter(|m| m["role"] == "tool").count(), 1);
    assert!(
        state
            .messages
            .iter()
            .all(|m| !matches!(m, Message::Assistant { tool_calls, .. } if tool_calls.iter().any(|c| c.id == "c2")))
    );

    // A call with other arguments, or one whose first run failed, runs again.
    let h = harness(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::tool_calls(&[("c2", "calculator", json!({"expression": "6*8"}))]),
        Reply::text("42 and 48."),
    ])
    .await;
    let (events, _) =
        h.graph.start(&t(11), user_turn("6*7 and 6*8?", None), RunOptions::default()).await.unwrap().collect().await;
    assert_eq!(events.iter().filter(|e| matches!(e, RunEvent::ToolResult { .. })).count(), 2);
    let h = harness(vec![
        Reply::tool_calls(&[("c1", "general_query", json!({"sql": "SELECT 1 FROM teachers"}))]),
        Reply::tool_calls(&[("c2", "general_query", json!({"sql": "SELECT 1 FROM teachers"}))]),
        Reply::text("No."),
    ])
    .await;
    let (events, _) =
        h.graph.start(&t(12), user_turn("teachers?", None), RunOptions::default()).await.unwrap().collect().await;
    assert_eq!(events.iter().filter(|e| matches!(e, RunEvent::ToolResult { .. })).count(), 2, "{events:?}");

    // A read asked again after a write returned may read something new: it runs.
    let h = harness(vec![
        Reply::tool_calls(&[("q1", "general_query", json!({"sql": "SELECT count(*) FROM students"}))]),
        Reply::tool_calls(&[("w1", "send_sms", json!({"to": "+34600000000", "text": "hola"}))]),
        Reply::tool_calls(&[("q2", "general_query", json!({"sql": "SELECT count(*) FROM students"}))]),
        Reply::text("Sent; still 42 students."),
    ])
    .await;
    let run = h.graph.start(&t(13), user_turn("count, text, count", None), RunOptions::default()).await.unwrap();
    let RunOutcome::Interrupted { pending, .. } = run.outcome().await else { panic!("the write waits for approval") };
    let decisions = pending.iter().map(|p| (p.id.clone(), Decision::Approve)).collect();
    let ResumeResult::Started(run) = h.graph.resume(&t(13), decisions, RunOptions::default()).await.unwrap() else {
        panic!("the approval continues the run")
    };
    let (events, out) = run.collect().await;
    assert_eq!(out.state().last_reply(), Some("Sent; still 42 students."), "{out:?}");
    let reads = events.iter().filter(|e| matches!(e, RunEvent::ToolResult { name, .. } if name == "general_query"));
    assert_eq!(reads.count(), 1, "the second count ran after the write: {events:?}");

    // Asked again with no tools, a model that says nothing: the repeated call runs as asked.
    let h = harness(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "6*7"}))]),
        Reply::tool_calls(&[("c2", "calculator", json!({"expression": "6*7"}))]),
        Reply::text(""),
        Reply::text("42."),
    ])
    .await;
    let (events, out) =
        h.graph.start(&t(14), user_turn("6*7?", None), RunOptions::default()).await.unwrap().collect().await;
    assert_eq!(out.state().last_reply(), Some("42."), "{out:?}");
    assert_eq!(events.iter().filter(|e| matches!(e, RunEvent::ToolResult { .. })).count(), 2, "{events:?}");
}

#[test]
fn the_history_window_keeps_whole_recent_turns() {
    let mut msgs = Vec::new();
    for i in 0..50 {
        msgs.push(Message::user(format!("question {i} {}", "x".repeat(200))));
        msgs.push(Message::assistant(format!("answer {i} {}", "y".repeat(200))));
    }
    let w = kit::history_window(&msgs, 1000);
    assert!(matches!(w[0], Message::User { .. }), "starts at a user turn");
    assert!(w.len() < msgs.len() && w.len() >= 2);
    assert!(w.last().unwrap().content().starts_with("answer 49"));
    let total: usize = w.iter().map(|m| m.content().len() / 4 + 4).sum();
    assert!(total <= 1000 + 60, "{total}");
    assert_eq!(kit::history_window(&msgs, 0).len(), 100, "0 means no limit");
    assert_eq!(kit::history_window(&msgs[..1], 1).len(), 1, "the latest user turn always fits");
}

#[test]
fn the_agent_graph_draws_as_mermaid() {
    let model = Arc::new(OpenAiChatModel::new(OpenAiConfig::new("http://127.0.0.1:9/v1", "m")).unwrap());
    let g =
        react::build(AgentSpec::new("a", "", ToolRegistry::new()), model, Arc::new(MemoryCheckpointer::new())).unwrap();
    let m = g.to_mermaid();
    assert!(m.starts_with("flowchart TD"));
    for edge in [
        "__start__ --> agent",
        "agent -.-> tools",
        "agent -.-> __end__",
        "tools == \"approval\" ==> approved",
        "give_up --> __end__",
    ] {
        assert!(m.contains(edge), "missing {edge}:\n{m}");
    }
    let _: Value = json!(m);
}

/// A turn whose process died while a tool ran: the next turn, by the thread's owner, first
/// closes it — the unanswered call gets a result saying it was interrupted and the turn a
/// reply saying so — and the model then sees a whole history, never a call without a result.
#[tokio::test]
async fn a_turn_cut_while_a_tool_ran_is_closed_before_the_next_one() {
    let store: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    let hang = |spec: &mut AgentSpec| {
        // A tool that does not return stands in for the process dying while it runs.
        let tool = ToolBuilder::<QueryArgs>::new("slow_report", "Build a report")
            .timeout(Duration::from_secs(3600))
            .handler(|_ctx, _a| async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(json!(null))
            })
            .unwrap();
        spec.tools.register(tool).unwrap();
    };
    let dying =
        harness_spec(vec![Reply::tool_calls(&[("c1", "slow_report", json!({"sql": "all"}))])], store.clone(), hang)
            .await;
    let mut run =
        dying.graph.start(&t(30), user_turn("the report, please", None), RunOptions::default()).await.unwrap();
    while !matches!(run.next_event().await, Some(RunEvent::ToolCall { .. })) {}
    // A new process over the same store, holding the conversation's lease.
    let next = harness_spec(vec![Reply::text("Here it is.")], store, hang).await;
    let opts = RunOptions { owns_thread: true, ..RunOptions::default() };
    let (_, out) = next.graph.start(&t(30), user_turn("still there?", None), opts).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    let tail: Vec<(&str, &str)> = state.messages[1..]
        .iter()
        .map(|m| match m {
            Message::Tool { tool_call_id, .. } => ("tool", tool_call_id.as_str()),
            Message::Assistant { tool_calls, .. } if !tool_calls.is_empty() => ("assistant-calls", ""),
            Message::Assistant { content, .. } => ("assistant", content.as_str()),
            Message::User { content } => ("user", content.as_str()),
            Message::System { .. } => ("system", ""),
        })
        .collect();
    assert_eq!(
        tail,
        [
            ("assistant-calls", ""),
            ("tool", "c1"),
            ("assistant", kit::INTERRUPTED_REPLY),
            ("user", "still there?"),
            ("assistant", "Here it is.")
        ]
    );
    let Message::Tool { content, .. } = &state.messages[2] else { panic!("{:?}", state.messages[2]) };
    assert!(content.contains(kit::INTERRUPTED_CALL) && content.contains("unavailable"), "{content}");
    // The model's request holds the call's result: a history an OpenAI-style endpoint accepts.
    let sent = &next.server.requests()[0]["messages"];
    let answered = sent.as_array().unwrap().iter().any(|m| m["role"] == "tool" && m["tool_call_id"] == "c1");
    assert!(answered, "{sent}");
}

/// `warm_up` asks the model for one token of a placeholder turn that starts as every first
/// turn of the agent does — its system prompt and its tools — and writes nothing to a thread.
#[tokio::test]
async fn warming_up_computes_the_agents_prompt_with_one_token() {
    let h = harness(vec![Reply::text("Hola.")]).await;
    kit::warm_up(h.graph.deps()).await.unwrap();
    let requests = h.server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r["max_tokens"], 1, "{r}");
    assert_eq!(r["messages"][0], json!({"role": "system", "content": "You are Lumie's assistant."}));
    assert_eq!(r["messages"].as_array().unwrap().len(), 2, "the system prompt and a placeholder: {r}");
    let tools: Vec<&str> =
        r["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(tools.contains(&"send_sms") && tools.contains(&"calculator"), "{tools:?}");
    assert!(h.graph.history(&t(1)).await.unwrap().is_empty(), "no thread was written");
}

#[derive(Deserialize, JsonSchema)]
struct SlowArgs {
    /// Which call.
    n: u32,
}

/// A model asking for many read calls at once gets them all answered, in order, but never more
/// than `MAX_PARALLEL_TOOL_CALLS` running together.
#[tokio::test]
async fn many_calls_of_one_step_run_a_few_at_a_time_in_order() {
    let calls: Vec<(String, Value)> = (0..24).map(|n| (format!("c{n}"), json!({"n": n}))).collect();
    let script: Vec<(&str, &str, Value)> = calls.iter().map(|(id, a)| (id.as_str(), "slow_read", a.clone())).collect();
    let server = ScriptedModelServer::start(vec![Reply::tool_calls(&script), Reply::text("done")]).await.unwrap();
    let model = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(server.base_url(), "scripted")).unwrap());
    let (running, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut reg = ToolRegistry::new();
    let (r, p) = (running.clone(), peak.clone());
    reg.register(
        ToolBuilder::<SlowArgs>::new("slow_read", "Reads slowly.")
            .handler(move |_ctx, a| {
                let (r, p) = (r.clone(), p.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok(json!({"n": a.n}))
                }
            })
            .unwrap(),
    )
    .unwrap();
    let graph = react::build(AgentSpec::new("test", "Test.", reg), model, Arc::new(MemoryCheckpointer::new())).unwrap();
    let (_, out) = graph.start(&t(1), user_turn("go", None), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.last_reply(), Some("done"));
    let peak = peak.load(Ordering::SeqCst);
    assert!((2..=react::MAX_PARALLEL_TOOL_CALLS).contains(&peak), "{peak} calls ran at once");
    let tool_messages: Vec<String> = server.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tool_messages, calls.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), "every call, in order");
}

/// A graph declared by `text` (read tool `general_query`, write tool `send_sms`) on a scripted
/// model that answers with `script`.
struct Declared {
    server: ScriptedModelServer,
    graph: CompiledGraph<AgentState, kit::AgentDeps>,
    counters: Arc<Counters>,
}

async fn declared(text: &str, script: Vec<Reply>) -> Declared {
    let names = ["general_query".to_owned(), "send_sms".to_owned()];
    let known = toolgraph_agents::declared::Known { tools: &names, writes: &names[1..], kinds: None, agents: &[] };
    let plan = toolgraph_agents::declared::check("agent.toml", text, &known).unwrap();
    let server = ScriptedModelServer::start(script).await.unwrap();
    let model = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(server.base_url(), "scripted")).unwrap());
    let counters = Arc::new(Counters { sms: AtomicUsize::new(0), announcements: AtomicUsize::new(0) });
    let spec = AgentSpec::new("academy", "You are Lumie's assistant.", tools(counters.clone()));
    let store = Arc::new(MemoryCheckpointer::new());
    let graph =
        toolgraph_agents::declared::build(&plan, spec, model, &|_| unreachable!("no node names a model"), store)
            .unwrap();
    Declared { server, graph, counters }
}

/// The academy admin's own declaration (`examples/lumie/admin.toml`): a failing query goes back
/// to the model to be repaired at most `max_failures` = 3 times (the seed's `SQL_MAX_RETRIES`),
/// then its `give_up` reply node answers with a fixed text filled from the state, no model call.
#[tokio::test]
async fn the_academy_declaration_repairs_a_query_three_times_then_gives_its_fixed_answer() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lumie/admin.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let bad = |id: &str| Reply::tool_calls(&[(id, "general_query", json!({"sql": "select * from nope"}))]);
    let Declared { server, graph, .. } =
        declared(&text, vec![bad("q1"), bad("q2"), bad("q3"), bad("q4"), Reply::text("unreachable")]).await;
    let opts = RunOptions { recursion_limit: 20, ..RunOptions::default() };
    let (events, out) = graph.start(&t(40), user_turn("How many students?", None), opts).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    let reply = state.last_reply().unwrap();
    assert!(
        reply.starts_with("I could not complete this request: the tools kept failing after 4 attempts (last error: ")
            && reply.contains("does not exist"),
        "{reply}"
    );
    assert_eq!(texts(&events), reply, "the fixed answer is streamed as it is stored");
    assert_eq!(server.request_count(), 4, "three repairs, then the give-up answer without the model");
    let nodes: Vec<&str> = events
        .iter()
        .filter_map(|e| if let RunEvent::NodeStarted { node, .. } = e { Some(node.as_str()) } else { None })
        .collect();
    assert_eq!(nodes.last(), Some(&"give_up"), "{nodes:?}");
}

/// A declared model node that reads only the person's last message still sees this turn's tool
/// results: it answers after its call instead of calling again until the recursion limit.
#[tokio::test]
async fn a_last_message_node_sees_its_own_results_and_answers() {
    let text = r#"start = "agent"
[nodes.agent]
kind = "model"
history = "last_message"
route = { tool_calls = "tools", otherwise = "END" }
[nodes.tools]
kind = "tools"
next = "agent"
"#;
    let Declared { server, graph, .. } = declared(
        text,
        vec![
            Reply::text("Hi!"),
            Reply::tool_calls(&[("q1", "general_query", json!({"sql": "select count(*) from students"}))]),
            Reply::text("There are 3 students."),
        ],
    )
    .await;
    graph.start(&t(41), user_turn("Hello", None), RunOptions::default()).await.unwrap().collect().await;
    let (_, out) = graph
        .start(&t(41), user_turn("How many students?", None), RunOptions::default())
        .await
        .unwrap()
        .collect()
        .await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.last_reply(), Some("There are 3 students."));
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let roles: Vec<&str> =
        requests[2]["messages"].as_array().unwrap().iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"], "the last message and this turn's call and result only");
}

/// A `tools` node runs only what the model nodes that route to it were offered: a call of
/// another of the agent's tools (a write, here) is answered with why, never run and never put
/// to a person.
#[tokio::test]
async fn a_tools_node_refuses_a_tool_its_model_node_was_not_offered() {
    let text = r#"start = "agent"
[nodes.agent]
kind = "model"
tools = ["general_query"]
route = { tool_calls = "tools", otherwise = "END" }
[nodes.tools]
kind = "tools"
next = "agent"
"#;
    let Declared { server: _server, graph, counters } = declared(
        text,
        vec![
            Reply::tool_calls(&[("s1", "send_sms", json!({"to": "+1555", "text": "hi"}))]),
            Reply::text("I cannot send messages here."),
        ],
    )
    .await;
    let (_, out) =
        graph.start(&t(42), user_turn("Text Bob", None), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("no pause for a tool not on offer: {out:?}") };
    assert_eq!(state.last_reply(), Some("I cannot send messages here."));
    let refusal = state.messages.iter().find_map(|m| match m {
        Message::Tool { content, .. } => Some(content.clone()),
        _ => None,
    });
    assert!(
        refusal.as_deref().is_some_and(|r| r.contains("send_sms is not one of the tools of this step (general_query)")),
        "{refusal:?}"
    );
    assert_eq!(counters.sms.load(Ordering::SeqCst), 0);
}
