//! Documents in the conversation, end to end: a person uploads a document over HTTP, a turn
//! attaches it, the agent's `rag_search` (called by the scripted model over HTTP) finds it and
//! its citation, another conversation does not, and it goes with its conversation; what cannot
//! be attached is refused with a clear error and writes nothing — on SQLite and PostgreSQL.

mod common;
use common::{parse_sse, stream_text};

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::conversation::project;
use toolgraph_agents::kit::AgentSpec;
use toolgraph_conversations::{
    ConversationStore, PostgresConversationStore, ProjectingCheckpointer, SqliteConversationStore,
};
use toolgraph_graph::{Checkpointer, PostgresCheckpointer, SqliteCheckpointer};
use toolgraph_llm::{OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::{KbStore, RagError};
use toolgraph_server::{AppState, Attachments, ChatService, ServedAgent, ServiceOptions};
use toolgraph_testkit::PgSchema;
use toolgraph_tools::ToolRegistry;

struct Served {
    base: String,
    model: ScriptedModelServer,
    attachments: Arc<KbStore>,
    store: Arc<dyn ConversationStore>,
    _dir: tempfile::TempDir,
    _pg: Option<PgSchema>,
}

/// The tutor with `rag_search` (its own knowledge base and the conversation's attachments),
/// over the scripted model: a person's message gets a search for its words, a search's result
/// a reply.
async fn served(kind: &str) -> Option<Served> {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, store, pg): (Arc<dyn Checkpointer>, Arc<dyn ConversationStore>, _) = match kind {
        "sqlite" => {
            let ckpt = SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.unwrap();
            let store = Arc::new(SqliteConversationStore::new(ckpt.database().clone()).await.unwrap());
            (Arc::new(ProjectingCheckpointer::sqlite(ckpt, project)), store, None)
        }
        _ => {
            let schema = PgSchema::create().await?;
            let ckpt = PostgresCheckpointer::connect_with(schema.options()).await.unwrap();
            let store = Arc::new(PostgresConversationStore::new(ckpt.pool().clone()).await.unwrap());
            (Arc::new(ProjectingCheckpointer::postgres(ckpt, project)), store, Some(schema))
        }
    };
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    model.set_responder(|request| {
        let last = request["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
        if last["role"] == "user" {
            let words = last["content"].as_str().unwrap_or_default().to_owned();
            Reply::tool_calls(&[("s1", "rag_search", json!({"query": words}))])
        } else {
            Reply::text("Done.")
        }
    });
    let kb = Arc::new(KbStore::new(dir.path().join("kb")));
    // The agent's own documents, searched beside the conversation's.
    let guide = toolgraph_rag::NamedBytes {
        source: None,
        name: "guia.md".into(),
        bytes: b"# Course guide\n\nThe launch review of the course project is in week 10.".to_vec(),
    };
    toolgraph_rag::ingest_bytes(&kb, "demo", "cursos", &[guide], &Default::default()).unwrap();
    let attachments = Arc::new(KbStore::new(dir.path().join("attachments")));
    let mut tools = ToolRegistry::new();
    tools
        .register(toolgraph_agents::course::rag_search_tool(
            kb,
            Default::default(),
            "demo".into(),
            "cursos".into(),
            Some(Arc::clone(&attachments)),
        ))
        .unwrap();
    let llm = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let graph =
        toolgraph_agents::react::build(AgentSpec::new("tutor", "You are the tutor.", tools), llm, Arc::clone(&ckpt))
            .unwrap();
    let agents = BTreeMap::from([(
        "tutor".to_owned(),
        ServedAgent::new(GraphAgent::new(graph), toolgraph_config::AgentSettings::default()),
    )]);
    let options = ServiceOptions {
        attachments: Some(Attachments { store: Arc::clone(&attachments), retriever: Default::default() }),
        ..ServiceOptions::default()
    };
    let app = AppState::new(ChatService::new(agents, "tutor".into(), Arc::clone(&store), ckpt, options));
    app.set_ready();
    let base = common::serve(app).await;
    Some(Served { base, model, attachments, store, _dir: dir, _pg: pg })
}

async fn upload(s: &Served, user: i64, name: &str, bytes: Vec<u8>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/api/chatbot/uploads", s.base))
        .query(&[("tenantId", "7"), ("userId", &user.to_string()), ("name", name)])
        .body(bytes)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

fn turn(user: i64, conversation: Option<i64>, message: &str, attachments: &[&str]) -> Value {
    json!({"tenantSlug": "demo", "tenantId": 7, "userId": user, "conversationId": conversation,
           "message": message, "attachments": attachments})
}

/// What the last `rag_search` returned to the model.
fn last_search(model: &ScriptedModelServer) -> String {
    let requests = model.requests();
    let tool = requests
        .iter()
        .rev()
        .filter_map(|r| r["messages"].as_array()?.last().cloned())
        .find(|m| m["role"] == "tool")
        .expect("a search result reached the model");
    tool["content"].as_str().unwrap_or_default().to_owned()
}

async fn a_document_attached_to_a_turn_is_searched_cited_and_gone_with_its_conversation(kind: &str) {
    let Some(s) = served(kind).await else { return };
    let plan = "# Launch plan\n\nThe launch review is on 3 March in room B12, chaired by Marta.\n";
    let (status, receipt) = upload(&s, 101, "plan.md", plan.as_bytes().to_vec()).await;
    assert_eq!(status, 201, "{receipt}");
    assert!(receipt["chunks"].as_u64().unwrap() >= 1, "{receipt}");
    let id = receipt["uploadId"].as_str().unwrap().to_owned();

    // What cannot be attached is refused, clearly, at the upload.
    let (status, refused) = upload(&s, 101, "virus.exe", b"MZ".to_vec()).await;
    assert_eq!(status, 415, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("md, txt, html, pdf or json"), "{refused}");
    let (status, refused) = upload(&s, 101, "big.txt", vec![b'a'; toolgraph_server::MAX_UPLOAD_BYTES + 1]).await;
    assert_eq!(status, 413, "{refused}");
    let (status, refused) = upload(&s, 101, "broken.pdf", b"not a pdf at all".to_vec()).await;
    assert_eq!((status, &refused["field"]), (422, &json!("file")), "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("broken.pdf"), "{refused}");
    let (status, refused) = upload(&s, 101, "../../etc/passwd.md", b"x".to_vec()).await;
    assert_eq!((status, &refused["field"]), (422, &json!("name")), "{refused}");
    let (status, refused) = upload(&s, 101, "empty.txt", b"   ".to_vec()).await;
    assert_eq!(status, 422, "{refused}");

    // Another person cannot attach it, and their refused turn leaves nothing behind.
    let other = stream_text(&s.base, "demo", &turn(102, None, "¿cuándo es la revisión?", &[&id])).await;
    assert!(other.contains("\"field\":\"attachments\""), "{other}");
    let listed: Value = reqwest::get(format!("{}/api/chatbot/conversations?tenantId=7&userId=102", s.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["conversations"], json!([]), "{listed}");

    // Its owner's turn attaches it; the agent's search finds the fact with its citation.
    let events = parse_sse(&stream_text(&s.base, "demo", &turn(101, None, "launch review room", &[&id])).await);
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let conversation = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    let found: Value = serde_json::from_str(&last_search(&s.model)).unwrap();
    let sources: Vec<&str> =
        found["results"].as_array().unwrap().iter().filter_map(|r| r["metadata"]["source"].as_str()).collect();
    assert_eq!(sources, ["plan.md", "guia.md"], "the attachment first, then the agent's own: {found}");
    assert!(found["results"][0]["content"].as_str().unwrap().contains("room B12"), "{found}");
    assert!(found["results"][0]["metadata"]["citation"].as_str().unwrap().contains("Launch plan"), "{found}");
    // Its person sees it among the conversation's documents; another person does not.
    let listed: Value =
        reqwest::get(format!("{}/api/chatbot/conversations/{conversation}/documents?tenantId=7&userId=101", s.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(listed["documents"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!((&listed["documents"][0]["uploadId"], &listed["documents"][0]["passages"]), (&json!(id), &json!(1)));
    let theirs =
        reqwest::get(format!("{}/api/chatbot/conversations/{conversation}/documents?tenantId=7&userId=102", s.base))
            .await
            .unwrap();
    assert_eq!(theirs.status(), 404);
    // Later turns of the conversation still read it.
    let events = parse_sse(&stream_text(&s.base, "demo", &turn(101, Some(conversation), "Marta", &[])).await);
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    assert!(last_search(&s.model).contains("chaired by Marta"));
    // An upload is attached once.
    let again = stream_text(&s.base, "demo", &turn(101, Some(conversation), "again", &[&id])).await;
    assert!(again.contains("attached once"), "{again}");

    // Another conversation of the same person does not see it.
    let events = parse_sse(&stream_text(&s.base, "demo", &turn(101, None, "launch review room", &[])).await);
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let elsewhere = last_search(&s.model);
    assert!(!elsewhere.contains("B12") && elsewhere.contains("week 10"), "{elsewhere}");

    // Gone with its conversation.
    let (t, c) = (toolgraph_rag::attached::tenant_of(7), toolgraph_rag::attached::kb_of(conversation));
    assert!(s.attachments.open(&t, &c).is_ok());
    let deleted = reqwest::Client::new()
        .delete(format!("{}/api/chatbot/conversations/{conversation}?tenantId=7&userId=101", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(matches!(s.attachments.open(&t, &c), Err(RagError::UnknownKb { .. })));
    assert!(s.store.uploads(7, 101, &[id], 0).await.unwrap().is_empty(), "the upload went when it was attached");

    // A person's deletion takes their conversations' documents too.
    let (_, receipt) = upload(&s, 101, "notes.txt", b"The budget is 12,500 euros.".to_vec()).await;
    let id = receipt["uploadId"].as_str().unwrap().to_owned();
    let events = parse_sse(&stream_text(&s.base, "demo", &turn(101, None, "budget euros", &[&id])).await);
    let conversation = events.last().unwrap().data["conversationId"].as_i64().unwrap();
    assert!(last_search(&s.model).contains("12,500"));
    let kb = toolgraph_rag::attached::kb_of(conversation);
    assert!(s.attachments.open(&t, &kb).is_ok());
    let deleted =
        reqwest::Client::new().delete(format!("{}/api/chatbot/users/101?tenantId=7", s.base)).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    assert!(matches!(s.attachments.open(&t, &kb), Err(RagError::UnknownKb { .. })));
}

#[tokio::test]
async fn sqlite() {
    a_document_attached_to_a_turn_is_searched_cited_and_gone_with_its_conversation("sqlite").await;
}

#[tokio::test]
async fn postgres() {
    a_document_attached_to_a_turn_is_searched_cited_and_gone_with_its_conversation("postgres").await;
}
