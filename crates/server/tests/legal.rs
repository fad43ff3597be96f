//! The legal Q&A agent through the HTTP service: the ALQAC laws (real data: 17 laws, 2,131
//! articles) in a knowledge base on disk, the scripted model as the answer writer, and the three
//! tools both as the fixed pipeline and as tools a ReAct agent calls.

mod common;

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::legal::{self, AnswerWriter, LawLibrary, answer::NO_ANSWER};
use toolgraph_agents::react;
use toolgraph_config::{AgentGraph, AgentSettings};
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, ProjectingCheckpointer};
use toolgraph_graph::MemoryCheckpointer;
use toolgraph_llm::{ChatModel, OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::{IngestOptions, KbStore, NoProgress, RecordMapping, ingest};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};
use toolgraph_tools::ToolRegistry;

const QUESTION: &str = "Cơ quan nào có trách nhiệm thống nhất quản lý nhà nước về điện ảnh?";
const GOLD: &str = "Luật Điện ảnh#45";
/// How many of the best-ranked articles an answer reads (`tools.legal.answer_articles`).
const ANSWER_ARTICLES: usize = 2;

/// The ALQAC laws ingested once for the whole test binary (keyword index, as the demo does).
fn laws() -> Option<Arc<KbStore>> {
    static KB: OnceLock<Option<(tempfile::TempDir, Arc<KbStore>)>> = OnceLock::new();
    KB.get_or_init(|| {
        let data = toolgraph_testkit::eval_data("alqac/raw_2023/law.json")?;
        let dir = tempfile::tempdir().unwrap();
        let kb = Arc::new(KbStore::new(dir.path().join("kb")));
        let mapping =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kb/alqac-mapping.toml"))
                .unwrap();
        let opts =
            IngestOptions { mapping: Some(RecordMapping::from_toml(&mapping).unwrap()), ..IngestOptions::default() };
        let report = ingest(&kb, "vn", "luat", &[data.join("alqac/raw_2023/law.json")], &opts, &NoProgress).unwrap();
        assert_eq!(report.indexed, 1, "{report:?}");
        Some((dir, kb))
    })
    .as_ref()
    .map(|(_, kb)| Arc::clone(kb))
}

struct Service {
    base: String,
    model: ScriptedModelServer,
    store: Arc<MemoryConversationStore>,
}

/// The legal agent on `graph` over the laws, with the three tools; `kb` overrides the library's.
async fn start(kb: Arc<KbStore>, graph: AgentGraph, agent_kb: Option<&str>, script: Vec<Reply>) -> Service {
    let model = ScriptedModelServer::start(script).await.unwrap();
    let llm: Arc<dyn ChatModel> =
        Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let library = LawLibrary {
        store: kb,
        retriever: Default::default(),
        kb: "luat".into(),
        default_tenant: "nobody".into(),
        url_template: Some("https://laws.example/search?law={law}&article={article}".into()),
        answer_articles: ANSWER_ARTICLES,
    };
    let mut tools = ToolRegistry::new();
    tools.register(legal::tools::retrieve_laws_tool(library.clone())).unwrap();
    let writer = AnswerWriter { model: Some(Arc::clone(&llm)) };
    tools.register(legal::tools::generate_answer_tool(writer, library.clone())).unwrap();
    tools.register(legal::tools::format_citation_tool(library)).unwrap();
    let store = Arc::new(MemoryConversationStore::new());
    let ckpt = Arc::new(ProjectingCheckpointer::forwarding(
        MemoryCheckpointer::new(),
        store.clone(),
        toolgraph_agents::conversation::project,
    ));
    let mut spec = AgentSpec::new("luat", "Bạn là trợ lý pháp lý.", tools);
    if let Some(kb) = agent_kb {
        spec.tool_context.insert("kb".into(), kb.into());
    }
    let graph_built = match graph {
        AgentGraph::LegalPipeline => legal::pipeline::build(spec, llm, ckpt.clone()).unwrap(),
        _ => react::build(spec, llm, ckpt.clone()).unwrap(),
    };
    let settings = AgentSettings { graph, ..AgentSettings::default() };
    let agents = BTreeMap::from([("luat".to_string(), ServedAgent::new(GraphAgent::new(graph_built), settings))]);
    let app = AppState::new(ChatService::new(agents, "luat".into(), store.clone(), ckpt, ServiceOptions::default()));
    app.set_ready();
    Service { base: common::serve(app).await, model, store }
}

async fn turn(s: &Service, message: &str) -> Vec<common::SseEvent> {
    let body = json!({"tenantSlug": "vn", "tenantId": 1, "userId": 2, "conversationId": null,
                      "message": message, "toolEvents": true});
    common::parse_sse(&common::stream_text(&s.base, "vn", &body).await)
}

fn tokens(events: &[common::SseEvent]) -> String {
    events.iter().filter(|e| e.event == "token").map(|e| e.data["content"].as_str().unwrap_or_default()).collect()
}

fn results(events: &[common::SseEvent], tool: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.event == "tool_result" && e.data["name"] == tool)
        .map(|e| e.data["outcome"].clone())
        .collect()
}

async fn last_stored(s: &Service, events: &[common::SseEvent]) -> String {
    let id = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    s.store.messages(id).await.unwrap().last().unwrap().content.clone()
}

#[tokio::test]
async fn the_pipeline_retrieves_answers_from_the_articles_and_cites_them() {
    let Some(kb) = laws() else { return };
    let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
    let s = start(kb, AgentGraph::LegalPipeline, None, vec![Reply::text(answer)]).await;
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let calls: Vec<&str> =
        events.iter().filter(|e| e.event == "tool_call").filter_map(|e| e.data["name"].as_str()).collect();
    assert_eq!(calls, ["retrieve_laws", "generate_answer", "format_citation"]);

    // retrieve_laws: the contract's chunk shape, distinct articles, the gold one among them.
    let chunks = results(&events, "retrieve_laws")[0].as_array().unwrap().clone();
    assert_eq!(chunks.len(), 5, "{chunks:?}");
    let gold = chunks.iter().position(|c| c["meta"]["doc_id"] == GOLD).expect("the gold article was retrieved");
    let meta = &chunks[gold]["meta"];
    assert_eq!(meta["article_number"], "45");
    assert_eq!(meta["url"], "https://laws.example/search?law=Lu%E1%BA%ADt+%C4%90i%E1%BB%87n+%E1%BA%A3nh&article=45");
    assert!(meta["section_title"].as_str().unwrap().contains("quản lý nhà nước"), "{meta}");
    let ids: std::collections::HashSet<&str> = chunks.iter().map(|c| c["meta"]["doc_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), chunks.len(), "an article came back twice");

    // generate_answer: the model read the articles, numbered and labelled, and the question.
    let requests = s.model.requests();
    assert_eq!(requests.len(), 1);
    let prompt = question_asked(&requests[0]);
    let label = format!("[{}] Điều 45, Luật Điện ảnh\n", gold + 1);
    assert!(prompt.contains(&label) && prompt.contains(QUESTION), "{prompt}");
    // Only the best-ranked articles: the rest of the five were retrieved, not read.
    let read = format!("[{ANSWER_ARTICLES}] ");
    let unread = format!("[{}] ", ANSWER_ARTICLES + 1);
    assert!(prompt.contains(&read) && !prompt.contains(&unread), "{prompt}");
    assert_eq!(results(&events, "generate_answer")[0], json!({"answer": answer}));

    // format_citation: the answer attributed to the article it came from; streamed and stored.
    let cited = format!("Theo [Điều 45, Luật Điện ảnh], {answer}");
    assert_eq!(results(&events, "format_citation")[0], json!({"cited_answer": cited}));
    assert_eq!(tokens(&events), cited);
    assert_eq!(last_stored(&s, &events).await, cited);
    // The tool's own model call is counted with the turn, as the model reported it.
    let id = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let used = s.store.conversation_usage(id).await.unwrap();
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!((used[0].model.as_str(), used[0].prompt, used[0].completion, used[0].calls), ("scripted", 10, 5, 1));
}

#[tokio::test]
async fn no_matching_article_answers_so_without_a_model_call() {
    let Some(kb) = laws() else { return };
    let s = start(kb, AgentGraph::LegalPipeline, None, vec![]).await;
    let events = turn(&s, "zzqx wvyk qqjj").await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    assert_eq!(results(&events, "retrieve_laws")[0], json!([]));
    assert_eq!(tokens(&events), NO_ANSWER);
    assert_eq!(s.model.request_count(), 0);
}

#[tokio::test]
async fn a_missing_knowledge_base_is_said_in_the_reply() {
    let Some(kb) = laws() else { return };
    let s = start(kb, AgentGraph::LegalPipeline, Some("khong-co"), vec![]).await;
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    assert_eq!(results(&events, "retrieve_laws")[0]["kind"], "not_found");
    let reply = tokens(&events);
    assert!(reply.starts_with("Không tra cứu được văn bản luật") && reply.contains("khong-co"), "{reply}");
    assert_eq!(last_stored(&s, &events).await, reply);
}

#[tokio::test]
async fn a_failing_model_ends_the_turn_with_an_error_event() {
    let Some(kb) = laws() else { return };
    let s =
        start(kb, AgentGraph::LegalPipeline, None, vec![Reply::status(400, r#"{"error":{"message":"bad"}}"#)]).await;
    let events = turn(&s, QUESTION).await;
    let last = events.last().unwrap();
    assert_eq!(last.event, "error", "{events:?}");
    assert!(tokens(&events).is_empty(), "no answer was streamed");
    // The conversation stays usable: the next turn answers.
    s.model.push([Reply::text("Chính phủ.")]);
    let again = turn(&s, QUESTION).await;
    assert_eq!(again.last().unwrap().event, "done", "{again:?}");
}

#[tokio::test]
async fn a_react_agent_calls_the_tools_and_their_results_reach_the_model() {
    let Some(kb) = laws() else { return };
    let script = vec![
        Reply::tool_calls(&[("r1", "retrieve_laws", json!({"question": QUESTION, "top_k": 50}))]),
        Reply::tool_calls(&[("r2", "retrieve_laws", json!({"question": QUESTION}))]),
        // Filled in below from the retrieved chunks.
    ];
    let s = start(kb, AgentGraph::React, None, script).await;
    s.model.set_responder(|request| {
        let last = request["messages"].as_array().unwrap().last().unwrap();
        let content: Value = serde_json::from_str(last["content"].as_str().unwrap_or_default()).unwrap_or_default();
        if let Value::Array(chunks) = content {
            let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
            Reply::tool_calls(&[("c1", "format_citation", json!({"answer": answer, "chunks": chunks}))])
        } else {
            Reply::text(content["cited_answer"].as_str().unwrap_or("no citation came back"))
        }
    });
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let retrieved = results(&events, "retrieve_laws");
    assert_eq!(retrieved[0]["kind"], "invalid_arguments", "top_k 50 is refused: {}", retrieved[0]);
    assert_eq!(retrieved[1].as_array().unwrap().len(), 5, "top_k defaults to 5");
    let requests = s.model.requests();
    let tool_msg = requests[2]["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(tool_msg.contains(GOLD), "the chunks reached the model: {tool_msg}");
    assert_eq!(tokens(&events), "Theo [Điều 45, Luật Điện ảnh], Chính phủ thống nhất quản lý nhà nước về điện ảnh.");
}

#[tokio::test]
async fn chunks_a_model_invents_or_alters_are_refused_or_read_from_the_knowledge_base() {
    let Some(kb) = laws() else { return };
    let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
    let invented = json!([{"text": "Bộ Công an quản lý điện ảnh.", "meta": {"doc_id": "Luật Bịa#1", "citation": "Điều 1, Luật Bịa"}}]);
    // The gold article's id, with words and a label the article does not have.
    let altered = json!([{"text": "Bộ Công an thống nhất quản lý nhà nước về điện ảnh.",
                          "meta": {"doc_id": GOLD, "citation": "Điều 99, Luật Bịa"}}]);
    let script = vec![
        Reply::tool_calls(&[("r1", "retrieve_laws", json!({"question": QUESTION}))]),
        Reply::tool_calls(&[("c1", "format_citation", json!({"answer": answer, "chunks": invented}))]),
        Reply::tool_calls(&[("g1", "generate_answer", json!({"question": QUESTION, "chunks": altered}))]),
        Reply::text(answer),
        // format_citation then runs by itself; a later turn passes it the altered chunks.
        Reply::tool_calls(&[("r2", "retrieve_laws", json!({"question": QUESTION}))]),
        Reply::tool_calls(&[("c2", "format_citation", json!({"answer": answer, "chunks": altered}))]),
    ];
    let s = start(kb, AgentGraph::React, None, script).await;
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let id = events.last().unwrap().data["conversationId"].clone();
    let body = json!({"tenantSlug": "vn", "tenantId": 1, "userId": 2, "conversationId": id, "message": QUESTION,
                      "toolEvents": true});
    let later = common::parse_sse(&common::stream_text(&s.base, "vn", &body).await);
    assert_eq!(later.last().unwrap().event, "done", "{later:?}");

    // An article the knowledge base lacks is refused, named, and never cited.
    let cited = results(&events, "format_citation");
    assert_eq!(cited[0]["kind"], "invalid_arguments", "{}", cited[0]);
    let message = cited[0].to_string();
    assert!(message.contains("Luật Bịa#1") && message.contains("retrieve_laws"), "{message}");

    // A real article's id with altered words: the answer writer reads the article's own words.
    let requests = s.model.requests();
    let prompt = question_asked(&requests[3]);
    assert!(prompt.contains("[1] Điều 45, Luật Điện ảnh"), "{prompt}");
    assert!(!prompt.contains("Bộ Công an") && !prompt.contains("Luật Bịa"), "{prompt}");

    // ... and the citation carries the article's own label.
    let expected = json!({"cited_answer": format!("Theo [Điều 45, Luật Điện ảnh], {answer}")});
    assert_eq!(cited[1], expected, "the step after generate_answer");
    assert_eq!(results(&later, "format_citation")[0], expected, "the altered chunks given to format_citation");
}

#[tokio::test]
async fn an_answer_is_cited_among_the_best_ranked_articles_only() {
    let Some(kb) = laws() else { return };
    let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
    let chunk = |doc_id: &str, text: &str| json!({"text": text, "meta": {"doc_id": doc_id}});
    let gold = chunk(GOLD, answer);
    let others = [chunk("Luật Du lịch#39", "Hợp đồng lữ hành"), chunk("Luật Điện ảnh#46", "Trách nhiệm quản lý")];
    let script = vec![
        Reply::tool_calls(&[("r1", "retrieve_laws", json!({"question": QUESTION}))]),
        Reply::tool_calls(&[
            // The article that holds the answer third, past the ones an answer reads ...
            ("c1", "format_citation", json!({"answer": answer, "chunks": [others[0], others[1], gold]})),
            // ... and first.
            ("c2", "format_citation", json!({"answer": answer, "chunks": [gold, others[0], others[1]]})),
        ]),
        Reply::text(answer),
    ];
    let s = start(kb, AgentGraph::React, None, script).await;
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    // The two calls run side by side: their results are told apart by call id.
    let result = |id: &str| {
        let found = events.iter().find(|e| e.event == "tool_result" && e.data["callId"] == id);
        found.map(|e| e.data["outcome"].clone()).unwrap_or_else(|| panic!("no result for {id}: {events:?}"))
    };
    let third = result("c1");
    let third = third["cited_answer"].as_str().expect("a cited answer");
    assert!(!third.contains("Điều 45"), "an article the answer did not read was cited: {third}");
    assert_eq!(result("c2"), json!({"cited_answer": format!("Theo [Điều 45, Luật Điện ảnh], {answer}")}));
}

#[tokio::test]
async fn the_tools_that_take_chunks_are_offered_once_retrieve_laws_has_returned() {
    let Some(kb) = laws() else { return };
    let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
    let chunks = json!([{"text": answer, "meta": {"doc_id": GOLD}}]);
    let script = vec![
        // A model that ignores what it was offered and cites before searching.
        Reply::tool_calls(&[("c1", "format_citation", json!({"answer": answer, "chunks": chunks}))]),
        Reply::tool_calls(&[("r1", "retrieve_laws", json!({"question": QUESTION}))]),
        Reply::tool_calls(&[("c2", "format_citation", json!({"answer": answer, "chunks": chunks}))]),
    ];
    let s = start(kb, AgentGraph::React, None, script).await;
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let offered = |i: usize| -> Vec<String> {
        s.model.requests()[i]["tools"]
            .as_array()
            .map(|t| t.iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    // Before the search only the search is offered; the early call is refused, not run.
    assert_eq!(offered(0), ["retrieve_laws"]);
    let cited = results(&events, "format_citation");
    assert_eq!(cited[0]["kind"], "invalid_arguments", "{}", cited[0]);
    assert!(cited[0]["error"].as_str().unwrap().contains("only after retrieve_laws"), "{}", cited[0]);
    assert_eq!(offered(1), ["retrieve_laws"], "a refused call makes nothing available");
    // Once it has returned, the tools that take its chunks are offered, and the call runs.
    let mut after = offered(2);
    after.sort();
    assert_eq!(after, ["format_citation", "generate_answer", "retrieve_laws"]);
    let cited_answer = format!("Theo [Điều 45, Luật Điện ảnh], {answer}");
    assert_eq!(cited[1], json!({"cited_answer": cited_answer}));
    // The cited answer is the reply, streamed and stored, with no model call after it.
    assert_eq!(s.model.request_count(), 3);
    assert_eq!(tokens(&events), cited_answer);
    assert_eq!(last_stored(&s, &events).await, cited_answer);
    // The next turn starts over: nothing but the search again.
    s.model.push([Reply::text("chào")]);
    let id = events.last().unwrap().data["conversationId"].clone();
    let body = json!({"tenantSlug": "vn", "tenantId": 1, "userId": 2, "conversationId": id, "message": "Cảm ơn!"});
    common::stream_text(&s.base, "vn", &body).await;
    assert_eq!(offered(3), ["retrieve_laws"]);
}

#[tokio::test]
async fn generate_answer_reads_the_articles_retrieve_laws_returned_when_the_model_leaves_them_out() {
    let Some(kb) = laws() else { return };
    let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
    let script = vec![
        Reply::tool_calls(&[("r1", "retrieve_laws", json!({"question": QUESTION}))]),
        // The question alone: the model is not shown `chunks` and does not copy the articles.
        Reply::tool_calls(&[("g1", "generate_answer", json!({"question": QUESTION}))]),
        Reply::text(answer),
    ];
    let s = start(kb, AgentGraph::React, None, script).await;
    let events = turn(&s, QUESTION).await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let requests = s.model.requests();
    // Once the articles are in, the model is told to call generate_answer.
    assert_eq!(requests[1]["tool_choice"], json!({"type": "function", "function": {"name": "generate_answer"}}));
    let generate = requests[1]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "generate_answer")
        .expect("generate_answer is offered once retrieve_laws has returned");
    assert!(generate["function"]["parameters"]["properties"].get("chunks").is_none(), "{generate}");
    // The answer writer read the articles the search found, the gold one among them.
    let prompt = question_asked(&requests[2]);
    assert!(prompt.contains("Điều 45, Luật Điện ảnh") && prompt.contains("Chính phủ thống nhất"), "{prompt}");
    assert_eq!(results(&events, "generate_answer")[0], json!({"answer": answer}));
    // Then the agent cites that answer itself, with no arguments and no model call: the model
    // was asked three times (search, answer call, the answer writer), and the cited answer is
    // the reply, streamed and stored.
    let calls: Vec<(&str, &Value)> = events
        .iter()
        .filter(|e| e.event == "tool_call")
        .map(|e| (e.data["name"].as_str().unwrap(), &e.data["arguments"]))
        .collect();
    assert_eq!(calls[2], ("format_citation", &json!({})), "{calls:?}");
    assert_eq!(s.model.request_count(), 3);
    let cited = format!("Theo [Điều 45, Luật Điện ảnh], {answer}");
    assert_eq!(results(&events, "format_citation")[0], json!({"cited_answer": cited}));
    assert_eq!(tokens(&events), cited);
    assert_eq!(last_stored(&s, &events).await, cited);
}

#[tokio::test]
async fn a_search_that_finds_nothing_leaves_the_reply_to_the_model() {
    let Some(kb) = laws() else { return };
    let script = vec![
        Reply::tool_calls(&[("r1", "retrieve_laws", json!({"question": "zzqx wvyk qqjj"}))]),
        Reply::text("Tôi không tìm thấy điều luật nào."),
    ];
    let s = start(kb, AgentGraph::React, None, script).await;
    let events = turn(&s, "zzqx wvyk qqjj").await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    assert_eq!(results(&events, "retrieve_laws")[0], json!([]));
    // No forced answer from no articles: the model is free to reply.
    assert!(
        s.model.requests()[1].get("tool_choice").is_none_or(|c| c["type"] != "function"),
        "{:?}",
        s.model.requests()[1]["tool_choice"]
    );
    assert_eq!(tokens(&events), "Tôi không tìm thấy điều luật nào.");
}

/// The last message of a request the answer writer sent: the question and its articles (the
/// worked examples come before it).
fn question_asked(request: &Value) -> &str {
    request["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str()).expect("a message")
}
