//! `cite` nodes (docs/agents.md, "cite"): a model node drafts an answer into a channel without
//! streaming it, and a `cite` node checks the draft against the passages a `retrieve` node
//! found — each sentence cited, what no passage holds dropped, nothing to stand on after a search
//! answered with "cannot find it" in the person's language — and replies with what stands;
//! against the scripted model server over real HTTP.

use schemars::JsonSchema;
use scripted_llm::{Reply, ScriptedModelServer};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_agents::declared::{self, Known};
use toolgraph_agents::kit::{AgentDeps, AgentSpec, AgentState, user_turn};
use toolgraph_graph::*;
use toolgraph_llm::{ChatModel, OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::search::grounding;
use toolgraph_tools::{ToolBuilder, ToolRegistry};

/// Retrieve, draft (not streamed), cite.
const GRAPH: &str = r#"
start = "search"

[channels]
passages = {}
draft = {}
report = {}

[nodes.search]
kind = "retrieve"
top_k = 3
channel = "passages"
skip_small_talk = true
next = "answer"

[nodes.answer]
kind = "model"
output = { channel = "draft" }
next = "cite"

[nodes.cite]
kind = "cite"
text = "{{draft}}"
passages = "passages"
channel = "report"
"#;

const GUIDE: &str = "Guía docente › Evaluación";

#[derive(Deserialize, JsonSchema)]
struct SearchArgs {
    /// The query.
    query: String,
    /// How many passages.
    #[allow(dead_code)]
    top_k: Option<u32>,
}

/// A search over one passage of the course guide: it finds it for questions on the exam, and
/// nothing for anything else.
fn tools() -> ToolRegistry {
    let mut reg = ToolRegistry::new();
    reg.register(
        ToolBuilder::<SearchArgs>::new("rag_search", "Search the course's documents")
            .handler(|_ctx, a| async move {
                let results = if a.query.to_lowercase().contains("examen") {
                    vec![json!({
                        "content": "El examen final es el 20 de enero y vale el 40 % de la nota.",
                        "metadata": {"citation": GUIDE},
                    })]
                } else {
                    Vec::new()
                };
                Ok(json!({"ok": true, "query": a.query, "total_results": results.len(), "results": results}))
            })
            .unwrap(),
    )
    .unwrap();
    reg
}

fn graph(server: &ScriptedModelServer) -> CompiledGraph<AgentState, AgentDeps> {
    let tools = tools();
    let names = tools.names();
    let plan =
        declared::check("tutor.toml", GRAPH, &Known { tools: &names, writes: &[], kinds: None, agents: &[] }).unwrap();
    let model: Arc<dyn ChatModel> =
        Arc::new(OpenAiChatModel::new(OpenAiConfig::new(server.base_url(), "scripted")).unwrap());
    let spec = AgentSpec::new("tutor", "Eres el tutor de la asignatura.", tools);
    declared::build(&plan, spec, model, &|_| unreachable!("no model named"), Arc::new(MemoryCheckpointer::new()))
        .unwrap()
}

/// The turn's streamed text, and the node each piece came in.
fn streamed(events: &[RunEvent]) -> Vec<(String, String)> {
    let mut node = String::new();
    let mut out = Vec::new();
    for e in events {
        match e {
            RunEvent::NodeStarted { node: n, .. } => node.clone_from(n),
            RunEvent::TextDelta { text } => out.push((node.clone(), text.clone())),
            _ => {}
        }
    }
    out
}

async fn ask(graph: &CompiledGraph<AgentState, AgentDeps>, n: u32, question: &str) -> (Vec<RunEvent>, Arc<AgentState>) {
    let turn = user_turn(question, None);
    let (events, out) = graph.start(&ThreadId::new(1, n), turn, RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    (events, state)
}

#[tokio::test]
async fn a_draft_is_checked_before_anyone_sees_it_and_the_reply_is_what_stands() {
    let server = ScriptedModelServer::start(vec![Reply::text(
        "El examen final es el 20 de enero. Vale el 40 % de la nota. La revisión es el 3 de febrero en el aula 2.",
    )])
    .await
    .unwrap();
    let graph = graph(&server);
    let (events, state) = ask(&graph, 1, "¿Cuándo es el examen final y cuánto vale?").await;

    let reply = state.last_reply().unwrap().to_owned();
    assert!(reply.contains("20 de enero") && reply.contains("40 %"), "{reply}");
    assert!(reply.contains(&format!("[{GUIDE}]")), "cited to the passage that holds it: {reply}");
    assert!(!reply.contains("3 de febrero"), "a date no passage holds is dropped: {reply}");
    // The draft was not streamed: the one piece the person saw is the checked reply.
    assert_eq!(streamed(&events), [("cite".to_owned(), reply.clone())]);
    assert!(state.channels["draft"].as_str().unwrap().contains("3 de febrero"), "the draft is kept as written");
    let report = &state.channels["report"];
    assert_eq!(report["abstained"], false);
    assert!(report["cited"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["dropped"].as_array().unwrap().len(), 1, "{report}");
    assert!(report["dropped"][0]["sentence"].as_str().unwrap().contains("3 de febrero"), "{report}");

    // The draft's model read the passage written out before the question, and had no tools.
    let request = &server.requests()[0];
    let question = request["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(question.starts_with(&format!("Documents:\n[{GUIDE}] El examen final")), "{question}");
    assert!(question.contains("Question: ¿Cuándo es el examen final"), "{question}");
    assert!(request.get("tools").is_none_or(Value::is_null), "a draft calls no tools: {request}");

    // A greeting in the same conversation searches nothing: the last turn's passages are not
    // this turn's, and nothing is cited to them.
    server.push([Reply::text("¡Hola de nuevo! El examen es el 20 de enero.")]);
    let (_, state) = ask(&graph, 1, "hola").await;
    assert!(state.channels["passages"].is_null(), "{:?}", state.channels["passages"]);
    let reply = state.last_reply().unwrap();
    assert!(reply.contains("20 de enero") && !reply.contains(&format!("[{GUIDE}]")), "{reply}");

    // A later question's draft reads the earlier turns without their search (their answers
    // stay), and this turn's passages written out.
    server.push([Reply::text("Vale el 40 % de la nota.")]);
    let (_, state) = ask(&graph, 1, "¿Cuánto vale el examen final en la nota de la asignatura?").await;
    assert!(state.last_reply().unwrap().contains("40 %"), "{:?}", state.last_reply());
    let request = &server.requests()[2];
    let messages = request["messages"].as_array().unwrap();
    assert!(
        messages.iter().all(|m| m["role"] != "tool" && m.get("tool_calls").is_none_or(Value::is_null)),
        "{request}"
    );
    assert!(
        messages.iter().any(|m| m["role"] == "assistant" && m["content"].as_str().is_some_and(|c| c.contains("[Guía"))),
        "{request}"
    );
    let asked = messages.last().unwrap()["content"].as_str().unwrap();
    assert!(asked.starts_with(&format!("Documents:\n[{GUIDE}]")), "{asked}");
}

#[tokio::test]
async fn a_draft_after_a_search_that_found_nothing_becomes_the_abstention_and_small_talk_stays() {
    let server = ScriptedModelServer::start(vec![
        Reply::text("El aparcamiento de la facultad cuesta 5 euros al día."),
        Reply::text("¡Hola! ¿En qué puedo ayudarte?"),
    ])
    .await
    .unwrap();
    let graph = graph(&server);
    let (events, state) = ask(&graph, 2, "¿Cuánto cuesta el aparcamiento de la facultad?").await;
    let reply = state.last_reply().unwrap();
    assert_eq!(reply, grounding::abstention("es"), "nothing found, nothing invented");
    assert_eq!(state.channels["report"]["abstained"], true);
    assert_eq!(streamed(&events), [("cite".to_owned(), reply.to_owned())]);

    // A greeting searches nothing; its reply is not held to passages.
    let (_, state) = ask(&graph, 3, "hola").await;
    assert_eq!(state.last_reply(), Some("¡Hola! ¿En qué puedo ayudarte?"));
    assert_eq!(state.channels["report"]["abstained"], false);
    assert_eq!(server.request_count(), 2);
}

#[test]
fn a_cite_node_is_checked_when_it_loads() {
    let tools = tools();
    let names = tools.names();
    let known = Known { tools: &names, writes: &[], kinds: None, agents: &[] };
    let errors = |text: &str| match declared::check("tutor.toml", text, &known) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
    };
    let no_text = GRAPH.replace("text = \"{{draft}}\"\n", "");
    assert!(
        errors(&no_text).iter().any(|e| e.contains("nodes.cite: a `cite` node needs `text`")),
        "{:?}",
        errors(&no_text)
    );
    let unknown = GRAPH.replace("passages = \"passages\"", "passages = \"found\"");
    assert!(
        errors(&unknown).iter().any(|e| e.contains("nodes.cite.passages: no channel `found`")),
        "{:?}",
        errors(&unknown)
    );
    let on_reply = GRAPH.replace("kind = \"cite\"", "kind = \"reply\"");
    assert!(
        errors(&on_reply).iter().any(|e| e.contains("a `reply` node does not use `passages`")),
        "{:?}",
        errors(&on_reply)
    );
    let draft_failure =
        GRAPH.replace("output = { channel = \"draft\" }", "output = { channel = \"draft\", on_failure = 3 }");
    assert!(
        errors(&draft_failure)
            .iter()
            .any(|e| e.contains("nodes.answer.output.on_failure: a draft (no schema) is text")),
        "{:?}",
        errors(&draft_failure)
    );
    assert!(errors(GRAPH).is_empty(), "{:?}", errors(GRAPH));
}
