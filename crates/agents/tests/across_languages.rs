//! A grounded reply in another language than its documents (docs/retrieval.md, "Check every
//! sentence"): one that states no fact shares none of the passages' words, so it is put in
//! their language by the model and judged there — cited when the passages hold those words,
//! the abstention when they do not, when the model cannot translate it, and never asked of
//! a reply in the documents' own language. The replies come from the scripted model server over
//! real HTTP.

mod common;

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::Value;
use std::sync::Arc;
use toolgraph_agents::kit::{AgentSpec, user_turn};
use toolgraph_agents::react;
use toolgraph_graph::*;
use toolgraph_llm::{OpenAiChatModel, OpenAiConfig};
use toolgraph_rag::search::grounding;
use toolgraph_tools::ToolRegistry;

const GUIDE: &str = "Guía docente › Evaluación";

/// A search that finds the guide's evaluation passage, in Spanish, whatever is asked.
fn tools() -> ToolRegistry {
    let mut reg = ToolRegistry::new();
    common::register_search(
        &mut reg,
        "La evaluación es continua. El examen final se celebra el 20 de enero y vale el 40 % de la nota.",
        GUIDE,
    );
    reg
}

/// Asks `question` of a grounded tutor whose model answers with `script`: the reply, the
/// grounding report the answer streamed, and the bodies of the model's requests.
async fn ask(question: &str, script: Vec<Reply>) -> (String, Value, Vec<Value>) {
    let server = ScriptedModelServer::start(script).await.unwrap();
    let model = Arc::new(OpenAiChatModel::new(OpenAiConfig::new(server.base_url(), "scripted")).unwrap());
    let spec = AgentSpec::new("tutor", "Eres el tutor de la asignatura.", tools());
    let graph = react::build_grounded(spec, model, Arc::new(MemoryCheckpointer::new())).unwrap();
    let turn = user_turn(question, None);
    let (events, out) = graph.start(&ThreadId::new(1, 1), turn, RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    let report = events
        .iter()
        .find_map(|e| match e {
            RunEvent::Custom { data, .. } if data.get("grounding").is_some() => Some(data["grounding"].clone()),
            _ => None,
        })
        .expect("the answer reports its check");
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let reply = state.last_reply().unwrap_or_default().to_owned();
    assert_eq!(streamed.trim_end(), reply, "what streamed is the reply kept");
    (reply, report, server.requests())
}

/// The first model call writes words before any search: it is stopped, and the turn searches.
fn from_memory() -> Reply {
    Reply::text("Yes, it is.")
}

/// The user message of request `body`'s last message.
fn last_message(body: &Value) -> String {
    body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str()).unwrap_or("").to_owned()
}

#[tokio::test]
async fn a_reply_in_another_language_is_cited_when_its_words_in_theirs_are_the_passages() {
    let script = vec![
        from_memory(),
        Reply::text("Yes, the assessment is continuous."),
        Reply::text("Sí, la evaluación es continua."),
    ];
    let (reply, report, requests) = ask("Is the assessment continuous?", script).await;
    assert_eq!(reply, format!("Yes, the assessment is continuous [{GUIDE}]."));
    assert_eq!((report["cited"].as_u64(), report["abstained"].as_bool()), (Some(1), Some(false)), "{report}");
    assert_eq!(requests.len(), 3);
    let asked = last_message(&requests[2]);
    assert!(
        asked.starts_with("Translate into Spanish.") && asked.ends_with("Yes, the assessment is continuous."),
        "{asked}"
    );
    assert!(requests[2]["tools"].as_array().is_none_or(Vec::is_empty), "the translation offers no tools");
}

#[tokio::test]
async fn a_reply_whose_words_in_theirs_no_passage_holds_is_the_abstention() {
    for (answer, translated) in [
        // Words no passage holds: the model would say it anyway.
        ("Yes, there is parking on campus.", "Sí, hay aparcamiento en el campus."),
        // Words a passage holds, with a fact none holds (as a translation may add one).
        ("Yes, the final exam is in the autumn.", "Sí, el examen final se celebra el 15 de octubre."),
        // An answer the model cannot translate (nothing comes back).
        ("Yes, the assessment is continuous.", ""),
    ] {
        let script = vec![from_memory(), Reply::text(answer), Reply::text(translated)];
        let (reply, report, requests) = ask("Is there parking on campus?", script).await;
        assert_eq!(reply, grounding::abstention("en"), "{answer}");
        assert_eq!(report["abstained"], true, "{report}");
        assert_eq!(requests.len(), 3, "{answer}");
    }
    // A model server that fails the translation: the abstention too, not an error.
    let script = vec![from_memory(), Reply::text("Yes, the assessment is continuous."), Reply::status(500, "down")];
    let (reply, _, _) = ask("Is the assessment continuous?", script).await;
    assert_eq!(reply, grounding::abstention("en"));
}

#[tokio::test]
async fn a_reply_in_the_documents_language_is_never_translated() {
    // Spanish over Spanish passages, standing on nothing: the abstention, with no third call.
    let script = vec![Reply::text("Sí, claro."), Reply::text("Sí, hay aparcamiento en el campus.")];
    let (reply, report, requests) = ask("¿Hay aparcamiento en el campus?", script).await;
    assert_eq!(reply, grounding::abstention("es"));
    assert_eq!(report["abstained"], true, "{report}");
    assert_eq!(requests.len(), 2, "{requests:?}");
    // A reply across languages that its own facts cite is not translated either.
    let script = vec![from_memory(), Reply::text("The final exam is on 20 January.")];
    let (reply, _, requests) = ask("When is the final exam?", script).await;
    assert_eq!(reply, format!("The final exam is on 20 January [{GUIDE}]."));
    assert_eq!(requests.len(), 2);
}
