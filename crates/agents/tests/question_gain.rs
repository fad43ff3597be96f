//! A grounded agent answers from its documents only when the first passage found makes the
//! person's question likely (docs/retrieval.md, "Grounded answers"): below the agent's
//! `min_question_gain`, the reply is the abstention and the model is not asked to answer; a
//! short follow-up is not judged alone, nor a turn that also called another tool. The replies come from the scripted model server over
//! real HTTP; the question's likelihood — which only an in-process model reports — is set by
//! the test (the real model's is tested in the local-models crate).

mod common;

use schemars::JsonSchema;
use scripted_llm::{Reply, ScriptedModelServer};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use toolgraph_agents::kit::{AgentDeps, AgentSpec, AgentState, user_turn};
use toolgraph_agents::react;
use toolgraph_graph::*;
use toolgraph_llm::{ChatModel, ChatRequest, ChatStream, LlmError, OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::search::grounding;
use toolgraph_tools::{ToolBuilder, ToolRegistry};

const GUIDE: &str = "Guía docente › Evaluación";

#[derive(Deserialize, JsonSchema)]
struct GuideArgs {
    /// The section.
    #[allow(dead_code)]
    key: String,
}

/// A search that finds the guide's evaluation passage, whatever is asked, and a lookup of the
/// guide's sections.
fn tools() -> ToolRegistry {
    let mut reg = ToolRegistry::new();
    reg.register(
        ToolBuilder::<GuideArgs>::new("get_guia", "A section of the course guide")
            .handler(|_ctx, _a| async move { Ok(json!({"convocatoria_ordinaria": "20 de enero"})) })
            .unwrap(),
    )
    .unwrap();
    common::register_search(&mut reg, "El examen final es el 20 de enero y vale el 40 % de la nota.", GUIDE);
    reg
}

/// The scripted server's replies, and a question's likelihood as the test sets it: each token
/// −4 without the documents, −4 + `gain` after them. The prompts it was asked to judge are kept.
struct Judged {
    replies: OpenAiChatModel,
    gain: Mutex<f32>,
    judged: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl ChatModel for Judged {
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        self.replies.stream(request).await
    }

    async fn tail_logprobs(&self, request: ChatRequest, tail: &str) -> Result<Option<Vec<f32>>, LlmError> {
        let last = request.messages.last().map(|m| m.content().to_owned()).unwrap_or_default();
        let after = last.starts_with("Documents:");
        let gain = *self.gain.lock().unwrap();
        self.judged.lock().unwrap().push(last);
        Ok(Some(vec![if after { -4.0 + gain } else { -4.0 }; tail.chars().count().min(8)]))
    }

    fn model_id(&self) -> &str {
        "judged"
    }
}

struct Harness {
    server: ScriptedModelServer,
    model: Arc<Judged>,
    graph: CompiledGraph<AgentState, AgentDeps>,
}

async fn harness(script: Vec<Reply>, gain: f32, min_gain: Option<f32>) -> Harness {
    let server = ScriptedModelServer::start(script).await.unwrap();
    let replies = OpenAiChatModel::new(OpenAiConfig::new(server.base_url(), "scripted")).unwrap();
    let model = Arc::new(Judged { replies, gain: Mutex::new(gain), judged: Mutex::default() });
    let mut spec = AgentSpec::new("tutor", "Eres el tutor de la asignatura.", tools());
    if let Some(min) = min_gain {
        spec.min_question_gain = min;
    }
    let graph = react::build_grounded(spec, model.clone(), Arc::new(MemoryCheckpointer::new())).unwrap();
    Harness { server, model, graph }
}

/// Asks `question` on thread `n`: the events, and the reply.
async fn ask(h: &Harness, n: u32, question: &str) -> (Vec<RunEvent>, String) {
    let turn = user_turn(question, None);
    let (events, out) = h.graph.start(&ThreadId::new(1, n), turn, RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    (events, state.last_reply().unwrap_or_default().to_owned())
}

/// The grounding report the answer streamed.
fn report(events: &[RunEvent]) -> Value {
    events
        .iter()
        .find_map(|e| match e {
            RunEvent::Custom { data, .. } if data.get("grounding").is_some() => Some(data["grounding"].clone()),
            _ => None,
        })
        .expect("the answer reports its check")
}

/// The first model call writes words (a model that would answer from memory): it is stopped,
/// and the turn searches.
fn from_memory() -> Reply {
    Reply::text("El examen es el 15 de octubre.")
}

#[tokio::test]
async fn a_question_the_first_passage_does_not_make_likely_is_not_answered_from_it() {
    let h = harness(vec![from_memory(), Reply::text("El examen final es el 20 de enero.")], 0.1, None).await;
    let (events, reply) = ask(&h, 1, "¿Qué día se publican las notas de la revisión?").await;
    assert_eq!(reply, grounding::abstention("es"));
    assert_eq!(h.server.requests().len(), 1, "the answer was not asked of the model");
    let report = report(&events);
    assert_eq!(report["abstained"], true, "{report}");
    let gain = report["question_gain"].as_f64().unwrap();
    assert!((gain - 0.1).abs() < 1e-4, "{report}");
    let judged = h.model.judged.lock().unwrap().clone();
    let after = format!(
        "Documents:\n[{GUIDE}] El examen final es el 20 de enero y vale el 40 % de la nota.\n\n\
         Question: ¿Qué día se publican las notas de la revisión?"
    );
    // Without the documents; after the first passage; after all of them (here the one found).
    assert_eq!(judged, ["Question: ¿Qué día se publican las notas de la revisión?".to_owned(), after.clone(), after]);
}

#[tokio::test]
async fn a_question_the_passage_makes_likely_is_answered_and_cited() {
    let h = harness(vec![from_memory(), Reply::text("El examen final es el 20 de enero.")], 2.5, None).await;
    let (events, reply) = ask(&h, 1, "¿Cuándo es el examen final?").await;
    assert!(reply.contains("20 de enero") && reply.contains(&format!("[{GUIDE}]")), "{reply}");
    assert_eq!(h.server.requests().len(), 2);
    let report = report(&events);
    assert_eq!(report["abstained"], false, "{report}");
    assert!((report["question_gain"].as_f64().unwrap() - 2.5).abs() < 1e-4, "{report}");
}

#[tokio::test]
async fn a_gain_of_zero_turns_the_judgement_off() {
    let h = harness(vec![from_memory(), Reply::text("El examen final es el 20 de enero.")], 0.1, Some(0.0)).await;
    let (events, reply) = ask(&h, 1, "¿Cuándo es el examen final?").await;
    assert!(reply.contains("20 de enero"), "{reply}");
    assert!(h.model.judged.lock().unwrap().is_empty(), "nothing judged");
    assert!(report(&events).get("question_gain").is_none());
}

#[tokio::test]
async fn a_short_follow_up_is_not_judged_alone() {
    let script = vec![
        from_memory(),
        Reply::text("El examen final es el 20 de enero."),
        from_memory(),
        Reply::text("Vale el 40 % de la nota."),
    ];
    let h = harness(script, 2.5, None).await;
    let (_, first) = ask(&h, 1, "¿Cuándo es el examen final?").await;
    assert!(first.contains("20 de enero"), "{first}");
    // "¿y cuánto vale?" alone is unlikely after any passage: its meaning is in the turn before.
    *h.model.gain.lock().unwrap() = -0.5;
    let (events, reply) = ask(&h, 1, "¿y cuánto vale?").await;
    assert!(reply.contains("40 %"), "{reply}");
    assert_eq!(h.model.judged.lock().unwrap().len(), 3, "only the first question was judged");
    assert!(report(&events).get("question_gain").is_none());
}

#[tokio::test]
async fn a_turn_that_also_called_another_tool_is_not_judged() {
    // The model looks the guide up, then asks for the same lookup again: the turn goes to the
    // search and the answer, which reads the lookup's result too — a reply about more than the
    // documents, so the question is not judged by them.
    let lookup = || Reply::tool_calls(&[("g1", "get_guia", json!({"key": "evaluacion"}))]);
    let h = harness(vec![lookup(), lookup(), Reply::text("El examen final es el 20 de enero.")], -1.0, None).await;
    let (events, reply) = ask(&h, 1, "¿Cuándo es el examen final?").await;
    assert!(reply.contains("20 de enero"), "{reply}");
    assert!(h.model.judged.lock().unwrap().is_empty(), "nothing judged");
    assert!(report(&events).get("question_gain").is_none());
    let answer = h.server.requests().last().unwrap()["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(answer.contains("Tool results:\n[get_guia]") && answer.contains("Documents:"), "{answer}");
}
