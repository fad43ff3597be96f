//! The course tutor's `get_guia` and `generate_test` in chat turns through the HTTP service: a
//! real listener, the shipped teaching guides in a SQLite guide store, a knowledge base on disk,
//! the professors' preferences served over HTTP, and the scripted model (which also writes the
//! questions, as `generate_test`'s model).

mod common;

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use toolgraph_agents::chat_agent::GraphAgent;
use toolgraph_agents::course::guides::{Guide, GuideStore};
use toolgraph_agents::course::test_gen::{Grounding, TestGenerator};
use toolgraph_agents::kit::AgentSpec;
use toolgraph_agents::react;
use toolgraph_config::AgentSettings;
use toolgraph_conversations::{ConversationStore, MemoryConversationStore, ProjectingCheckpointer};
use toolgraph_graph::MemoryCheckpointer;
use toolgraph_llm::{ChatModel, OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::{IngestOptions, KbStore, NoProgress, ingest};
use toolgraph_server::{AppState, ChatService, ServedAgent, ServiceOptions};
use toolgraph_tools::ToolRegistry;

struct Service {
    base: String,
    model: ScriptedModelServer,
    store: Arc<MemoryConversationStore>,
    _dir: tempfile::TempDir,
}

/// The professors' preferences: 3 hard questions for `iv`, 404 for any other subject.
async fn preferences_backend() -> String {
    use axum::extract::Path as UrlPath;
    let app = axum::Router::new().route(
        "/users/subject/{subject}/preferences",
        axum::routing::get(|UrlPath(subject): UrlPath<String>| async move {
            if subject == "iv" {
                Ok(axum::Json(json!({"default_test_questions": 3, "default_test_difficulty": "hard"})))
            } else {
                Err(axum::http::StatusCode::NOT_FOUND)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// The tutor with `get_guia` and `generate_test` for tenant `ugr`; `backend` serves the
/// preferences (`None`: a backend that is down).
async fn start(script: Vec<Reply>, backend: Option<String>) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let guides = GuideStore::open_sqlite(&dir.path().join("guides.db")).await.unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/course/guides");
    for file in ["iv.json", "dai.json"] {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(shipped.join(file)).unwrap()).unwrap();
        guides.upsert("ugr", &Guide::from_json(doc).unwrap()).await.unwrap();
    }
    let kb = Arc::new(KbStore::new(dir.path().join("kb")));
    let notes = dir.path().join("volumenes.md");
    std::fs::write(&notes, "# Volúmenes\nUn volumen de Docker guarda los datos fuera del contenedor.\n").unwrap();
    let opts = IngestOptions {
        meta: serde_json::from_value(json!({"asignatura": "iv", "tipo_documento": "apuntes"})).unwrap(),
        ..IngestOptions::default()
    };
    ingest(&kb, "ugr", "cursos", &[notes], &opts, &NoProgress).unwrap();

    let model = ScriptedModelServer::start(script).await.unwrap();
    let llm: Arc<dyn ChatModel> =
        Arc::new(OpenAiChatModel::new(OpenAiConfig::new(model.base_url(), "scripted")).unwrap());
    let grounding = Grounding { store: kb, retriever: Default::default(), kb: "cursos".into() };
    let backend = backend.unwrap_or_else(|| "http://127.0.0.1:9".into());
    let generator = TestGenerator::new(Some(Arc::clone(&llm)), Some(backend), "nobody".into()).grounded_in(grounding);
    let mut tools = ToolRegistry::new();
    tools.register(toolgraph_agents::course::guia::get_guia_tool(Arc::new(guides), "nobody".into())).unwrap();
    tools.register(toolgraph_agents::course::test_gen::generate_test_tool(generator)).unwrap();
    let store = Arc::new(MemoryConversationStore::new());
    let ckpt = Arc::new(ProjectingCheckpointer::forwarding(
        MemoryCheckpointer::new(),
        store.clone(),
        toolgraph_agents::conversation::project,
    ));
    let graph = react::build(AgentSpec::new("tutor", "Eres el tutor.", tools), llm, ckpt.clone()).unwrap();
    let settings = AgentSettings { state_keys: vec!["asignatura".into()], ..AgentSettings::default() };
    let agents = BTreeMap::from([("tutor".to_string(), ServedAgent::new(GraphAgent::new(graph), settings))]);
    let app = AppState::new(ChatService::new(agents, "tutor".into(), store.clone(), ckpt, ServiceOptions::default()));
    app.set_ready();
    Service { base: common::serve(app).await, model, store, _dir: dir }
}

/// One turn for `subject`; the SSE events.
async fn turn(s: &Service, subject: &str, message: &str) -> Vec<common::SseEvent> {
    let body = json!({"tenantSlug": "ugr", "tenantId": 1, "userId": 2, "conversationId": null,
                      "message": message, "context": {"asignatura": subject}, "toolEvents": true});
    let text = common::stream_text(&s.base, "ugr", &body).await;
    let events = common::parse_sse(&text);
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"), "{text}");
    events
}

/// The outcomes of the turn's tool calls, in order.
fn outcomes(events: &[common::SseEvent]) -> Vec<Value> {
    events.iter().filter(|e| e.event == "tool_result").map(|e| e.data["outcome"].clone()).collect()
}

/// The tool message the model got in request `i`.
fn tool_message(s: &Service, i: usize) -> Value {
    let requests = s.model.requests();
    let msg = requests[i]["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap().clone();
    serde_json::from_str(msg["content"].as_str().unwrap()).unwrap_or(msg["content"].clone())
}

#[tokio::test]
async fn get_guia_answers_from_the_conversations_subject_in_the_tutors_shapes() {
    let script = vec![
        Reply::tool_calls(&[("g1", "get_guia", json!({"key": "sistema_de_evaluación.ordinaria.fecha_examen"}))]),
        Reply::text("El examen final es el 20 de enero."),
        Reply::tool_calls(&[("g2", "get_guia", json!({"asignatura": "dai"}))]),
        Reply::text("Es Infraestructura Virtual, de cuarto."),
        Reply::tool_calls(&[("g3", "get_guia", json!({"key": "competencias.nope"}))]),
        Reply::text("La guía no tiene esa sección."),
        Reply::tool_calls(&[("g4", "get_guia", json!({"key": "horario_de_cafetería"}))]),
        Reply::text("No puedo consultar eso."),
        Reply::tool_calls(&[("g5", "get_guia", json!({}))]),
        Reply::text("No tengo la guía de esa asignatura."),
    ];
    let s = start(script, None).await;
    let events = turn(&s, "iv", "¿Cuándo es el examen?").await;
    assert_eq!(outcomes(&events), [json!("20 de enero")]);
    assert_eq!(tool_message(&s, 1), json!("20 de enero"), "the section reached the model");
    let done = &events.last().unwrap().data;
    let stored = s.store.messages(done["conversationId"].as_i64().unwrap()).await.unwrap();
    assert_eq!(stored.last().unwrap().content, "El examen final es el 20 de enero.");

    // The model's own `asignatura` loses to the conversation's: the summary is IV's.
    let events = turn(&s, "iv", "¿De qué va la asignatura?").await;
    let summary = &outcomes(&events)[0];
    assert_eq!(summary["subject"], "iv");
    assert_eq!(summary["asignatura"], "Infraestructura Virtual");
    assert_eq!(summary["curso"], "4º");
    assert_eq!(summary["brief_description"][0], "Contenedores e imágenes con Docker");
    let keys: Vec<&String> = summary.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["asignatura", "brief_description", "curso", "grado", "subject", "url"]);

    let events = turn(&s, "iv", "¿Competencias?").await;
    assert_eq!(outcomes(&events), [json!("Key 'competencias.nope' not present")]);
    // A section that no guide has is refused with the sections named, for the model to repair.
    let events = turn(&s, "iv", "¿Horario de cafetería?").await;
    let refused = &outcomes(&events)[0];
    assert_eq!(
        (refused["ok"].as_bool(), refused["kind"].as_str()),
        (Some(false), Some("invalid_arguments")),
        "{refused}"
    );
    assert!(refused["error"].as_str().unwrap_or_default().contains("bibliografía_fundamental"), "{refused}");
    let events = turn(&s, "fisica", "¿Guía?").await;
    assert_eq!(outcomes(&events), [json!("No guia found for subject: fisica")]);
    // The model was told which sections exist, and never saw `asignatura`.
    let requests = s.model.requests();
    let tools = requests[0]["tools"].as_array().unwrap();
    let get_guia = &tools.iter().find(|t| t["function"]["name"] == "get_guia").unwrap()["function"]["parameters"];
    assert!(get_guia["properties"].get("asignatura").is_none(), "{get_guia}");
    assert!(get_guia["properties"]["key"]["description"].as_str().unwrap().contains("sistema_de_evaluación"));
}

/// The tool's model requests (the ones that ask for questions), in order.
fn question_requests(s: &Service) -> Vec<Value> {
    s.model.requests().into_iter().filter(|r| r["response_format"]["type"] == "json_schema").collect()
}

#[tokio::test]
async fn generate_test_uses_the_professors_preferences_and_returns_distinct_questions() {
    let first = json!({"questions": [
        {"question_text": "¿Qué es un volumen de Docker?", "difficulty": "hard"},
        {"question_text": "¿qué es un volumen de docker", "difficulty": "hard"},
        {"question_text": "¿Dónde guarda los datos un volumen?", "difficulty": "hard"}
    ]});
    let second = json!({"questions": [{"question_text": "¿Cómo se comparte un volumen entre contenedores?", "difficulty": "hard"}]});
    let script = vec![
        Reply::tool_calls(&[("t1", "generate_test", json!({"topic": "volúmenes de Docker"}))]),
        Reply::text(&first.to_string()),
        Reply::text(&second.to_string()),
        Reply::text("Aquí tienes tres preguntas."),
    ];
    let s = start(script, Some(preferences_backend().await)).await;
    let events = turn(&s, "iv", "Hazme un test sobre volúmenes").await;
    let questions = outcomes(&events)[0].clone();
    let texts: Vec<&str> =
        questions.as_array().unwrap().iter().map(|q| q["question"]["question_text"].as_str().unwrap()).collect();
    assert_eq!(
        texts,
        [
            "¿Qué es un volumen de Docker?",
            "¿Dónde guarda los datos un volumen?",
            "¿Cómo se comparte un volumen entre contenedores?"
        ],
        "the professor's 3, the repeat replaced"
    );
    assert!(
        questions
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["question"]["difficulty"] == "hard" && q["options"] == json!([]))
    );
    let asked = question_requests(&s);
    assert_eq!(asked.len(), 2, "one more round for the missing question");
    let first_ask = asked[0]["messages"][1]["content"].as_str().unwrap();
    assert!(first_ask.contains("exactly 3") && first_ask.contains("hard"), "{first_ask}");
    assert!(
        first_ask.contains("guarda los datos fuera del contenedor"),
        "grounded in the subject's notes: {first_ask}"
    );
    assert_eq!(asked[0]["response_format"]["json_schema"]["schema"]["properties"]["questions"]["minItems"], 3);
    let second_ask = asked[1]["messages"][1]["content"].as_str().unwrap();
    assert!(second_ask.contains("exactly 1") && second_ask.contains("Do not repeat"), "{second_ask}");
    assert_eq!(tool_message(&s, s.model.requests().len() - 1), questions, "the questions reached the model");
}

#[tokio::test]
async fn generate_test_falls_back_when_the_backend_is_down_and_the_model_talks_nonsense() {
    let script = vec![
        Reply::tool_calls(&[(
            "t1",
            "generate_test",
            json!({"topic": "Ansible", "context": "Ansible aplica playbooks."}),
        )]),
        Reply::text("Claro, aquí van unas preguntas interesantes."),
        Reply::text("{\"questions\": []}"),
        Reply::text("Vaya, solo tengo una pregunta."),
    ];
    let s = start(script, None).await;
    let events = turn(&s, "iv", "Un test de Ansible").await;
    assert_eq!(
        outcomes(&events),
        [
            json!([{"question": {"question_text": "¿Qué has aprendido sobre Ansible?", "difficulty": "medium"}, "options": []}])
        ]
    );
    let asked = question_requests(&s);
    let ask = asked[0]["messages"][1]["content"].as_str().unwrap();
    assert!(ask.contains("exactly 5") && ask.contains("medium"), "the backend is down: 5 and medium: {ask}");
    assert!(ask.contains("Ansible aplica playbooks."), "the given context, not a search: {ask}");
}
