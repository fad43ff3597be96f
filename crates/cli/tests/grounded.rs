//! Grounded answers over HTTP (docs/retrieval.md, "Grounded answers"): an agent with
//! `rag_search` searches before the model answers, its reply is cited sentence by sentence as it
//! streams, a sentence stating what no document holds never reaches the person, a reply that
//! stands on nothing becomes "cannot find it" in the person's language, and a greeting is not
//! searched — on the bundled course corpus, ingested for real, and the scripted model.

mod common;

use common::{event_data, free_port, serve_command, sse_events, wait_ready};
use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;

const CONFIG: &str = r#"
default_agent = "tutor"
[rag]
default_kb = "cursos"
[agents.tutor]
system_prompt = "Eres el tutor de la asignatura IV."
tools = ["rag_search", "calculator", "note_write"]
state_keys = ["asignatura"]
"#;

async fn post(base: &str, body: &Value) -> String {
    let response = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/stream"))
        .header("X-Tenant-Slug", "demo")
        .json(body)
        .timeout(Duration::from_secs(60))
        .send();
    response.await.unwrap().text().await.unwrap()
}

/// The `token` frames of a turn, joined, and the names of the tools it called.
fn said_and_called(body: &str) -> (String, Vec<String>) {
    let events = sse_events(body);
    let said = events
        .iter()
        .filter(|(e, _)| e == "token")
        .filter_map(|(_, d)| d["content"].as_str().map(str::to_owned))
        .collect();
    let called = events
        .iter()
        .filter(|(e, _)| e == "tool_call")
        .filter_map(|(_, d)| d["name"].as_str().map(str::to_owned))
        .collect();
    (said, called)
}

/// The messages a model request carried, as (role, content).
fn sent(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (m["role"].as_str().unwrap_or_default().to_owned(), m["content"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tutor_answers_from_its_documents_cites_them_and_says_so_when_they_do_not_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(&config, CONFIG).unwrap();
    common::ingest_course_corpus(&config, dir.path());
    let label = "Guía docente de Infraestructura Virtual › Evaluación › Convocatoria ordinaria";
    // A knowledge question gets two calls: the one the model starts answering from memory
    // (stopped at its first words), then the answer from what the search found. 1: the date
    // and weight the guide holds, and a revision date it does not; 2: a follow-up, answered from
    // the passage its search found; 3: a question the documents do not hold, answered from
    // "memory".
    let mut script = common::course_question_replies();
    script.extend([
        // 4: a greeting.
        Reply::text("¡Hola! ¿En qué puedo ayudarte con la asignatura?"),
        // 5: a calculation the model starts doing itself (words no document backs): stopped,
        // asked again to call a tool; the tools stay the model's, and its answer stands on the
        // result.
        Reply::text("Tu nota final es 0.6 por 8, que da 4.8, más 2.6: 7.4."),
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "0.6 * 8 + 0.4 * 6.5"}))]),
        Reply::text("Tu nota final sería 7.4."),
        // 6: a search the model asks for itself, and its answer, cited.
        Reply::tool_calls(&[("s1", "rag_search", json!({"query": "volumen contenedor"}))]),
        Reply::text("Un volumen guarda los datos del contenedor para que no se pierdan al borrarlo."),
        // 7: a model that asks again for a result it has (a small model can loop on one until
        // the step limit): the search, then the answer from the documents.
        Reply::tool_calls(&[("k1", "calculator", json!({"expression": "3+3"}))]),
        Reply::tool_calls(&[("k2", "calculator", json!({"expression": "3+3"}))]),
        Reply::text("La asignatura tiene 6 créditos ECTS."),
        // 8: a Korean question; after its own search the model answers in English (the
        // results' language is Spanish): stopped before it shows, answered again in Korean.
        Reply::tool_calls(&[("r1", "rag_search", json!({"query": "créditos ECTS asignatura"}))]),
        Reply::text("The course has 6 ECTS credits."),
        Reply::text("이 과목은 6 ECTS 학점입니다."),
        // 9: a computation the model, asked to call a tool, meets with a write action: not run,
        // the turn goes the search's way.
        Reply::text("2 + 2 son 4."),
        Reply::tool_calls(&[("w1", "note_write", json!({"title": "Suma", "body": "2 + 2 = 4"}))]),
        Reply::text("No lo sé."),
    ]);
    let model = ScriptedModelServer::start(script).await.unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .arg("--config")
        .arg(&config)
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let say = |conversation: &Value, message: &str| {
        json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1, "conversationId": conversation,
               "message": message, "context": {"asignatura": "iv"}, "toolEvents": true})
    };
    let first = post(&base, &say(&Value::Null, "¿Cuándo es el examen final y cuánto vale en la nota?")).await;
    let conversation = event_data(&first, "done")["conversationId"].clone();
    let second = post(&base, &say(&conversation, "¿y la extraordinaria?")).await;
    let third = post(&base, &say(&conversation, "¿Quién es el rector de la universidad?")).await;
    let fourth = post(&base, &say(&conversation, "hola")).await;
    let fifth = post(&base, &say(&conversation, "Calcula mi nota: 0.6 * 8 + 0.4 * 6.5")).await;
    let sixth = post(&base, &say(&conversation, "Busca en los apuntes para qué sirve un volumen")).await;
    let seventh = post(&base, &say(&conversation, "¿Cuántos créditos tiene la asignatura?")).await;
    let eighth = post(&base, &say(&conversation, "이 과목은 몇 학점인가요?")).await;
    let ninth = post(&base, &say(&conversation, "¿Cuánto es 2 + 2?")).await;
    let requests = model.requests();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(requests.len(), 21, "every scripted reply was asked for: {requests:#?}");

    // 1: the answer from memory never showed; the search came before the answer, the supported
    // sentence is cited, the invented one gone.
    let (said, called) = said_and_called(&first);
    assert_eq!(called, ["rag_search"], "{first}");
    assert!(!sent(&requests[0]).iter().any(|(role, _)| role == "tool"), "the model was asked first, unsearched");
    // The answer read the passages written out before the question, with no tools to call.
    let history = sent(&requests[1]);
    let (role, asked) = history.last().unwrap();
    assert_eq!(role, "user");
    assert!(asked.starts_with(&format!("Documents:\n[{label}] La evaluación es continua.")), "{asked}");
    assert!(asked.contains("20 de enero") && asked.ends_with("Question: ¿Cuándo es el examen final y cuánto vale en la nota?\n(Answer in Spanish, from the documents.)"), "{asked}");
    assert!(requests[1]["tools"].as_array().is_none_or(Vec::is_empty), "{:?}", requests[1]["tools"]);
    assert!(history[0].1.contains("say you cannot find it in the documents"), "{:?}", history[0]);
    assert_eq!(said, format!("El examen final es el 20 de enero y vale el 40 % de la nota [{label}]. "));
    assert!(!first.contains("octubre"), "a date no document holds is never shown: {first}");
    // What was streamed is what was kept: the next turn's request carries it as the reply.
    let kept = sent(&requests[2]);
    assert!(kept.iter().any(|(role, c)| role == "assistant" && c == said.trim_end()), "{kept:?}");
    // The earlier turn's search is not read again, by the next turn's model step nor by its
    // answer: its question and cited answer are the history.
    for request in &requests[2..4] {
        let calls = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m.get("tool_calls").is_some_and(|c| !c.is_null()));
        assert_eq!(calls.count(), 0, "{request}");
        assert!(!sent(request).iter().any(|(role, _)| role == "tool"), "{request}");
        assert!(
            sent(request).iter().any(|(role, c)| role == "user" && c.starts_with("¿Cuándo es el examen final")),
            "{request}"
        );
    }

    // 2: the follow-up was searched with the question before it.
    let (said, called) = said_and_called(&second);
    assert_eq!(called, ["rag_search"]);
    let query = sse_events(&second)
        .into_iter()
        .find_map(|(e, d)| (e == "tool_call").then(|| d["arguments"]["query"].as_str().unwrap_or_default().to_owned()))
        .unwrap();
    assert!(query.contains("examen final") && query.contains("extraordinaria"), "{query}");
    // Searched with the question before it, the passage that answered that one ranks first
    // again: the passage the follow-up's own word names is read first.
    let (_, asked) = sent(&requests[3]).pop().unwrap();
    let extraordinaria = "[Guía docente de Infraestructura Virtual › Evaluación › Convocatoria extraordinaria]";
    assert!(asked.starts_with(&format!("Documents:\n{extraordinaria}")) && asked.contains(label), "{asked}");
    assert!(
        said.contains("julio")
            && said.contains("[Guía docente de Infraestructura Virtual › Evaluación › Convocatoria extraordinaria]"),
        "{said}"
    );

    // 3: nothing in the reply stands on the documents: the abstention, in Spanish.
    let (said, _) = said_and_called(&third);
    assert_eq!(said, "No encuentro esa información en los documentos que tengo.");
    assert!(!third.contains("Pedro"), "the invented name never streamed: {third}");

    // 4: a greeting searches nothing and keeps its reply.
    let (said, called) = said_and_called(&fourth);
    assert!(called.is_empty(), "{fourth}");
    assert_eq!(said, "¡Hola! ¿En qué puedo ayudarte con la asignatura?");

    // 5: a request the model meets with a tool goes on as the call; the result backs the answer.
    let (said, called) = said_and_called(&fifth);
    assert_eq!(called, ["calculator"], "{fifth}");
    assert_eq!(said, "Tu nota final sería 7.4.");
    assert!(!said.contains("4.8") && !said.contains("por 8"), "the model's own arithmetic never streamed: {fifth}");
    assert!(requests[7].get("tool_choice").is_none_or(|c| c != "required"), "{:?}", requests[7]["tool_choice"]);
    assert_eq!(requests[8]["tool_choice"], "required", "asked again to call a tool");
    let asked = sent(&requests[8]);
    assert_eq!(asked.last().map(|(role, _)| role.as_str()), Some("user"), "not searched first: {asked:?}");

    // 6: the model's own search: its answer is cited like the others.
    let (said, called) = said_and_called(&sixth);
    assert_eq!(called, ["rag_search"], "{sixth}");
    assert!(said.starts_with("Un volumen guarda los datos del contenedor") && said.contains("[Tema 1"), "{said}");

    // 7: the repeated call never ran again; the turn searched and answered from what it found.
    let (said, called) = said_and_called(&seventh);
    assert_eq!(called, ["calculator", "rag_search"], "{seventh}");
    assert!(said.starts_with("La asignatura tiene 6 créditos ECTS [Guía docente"), "{said}");
    assert!(requests[14]["tools"].as_array().is_none_or(Vec::is_empty), "{:?}", requests[14]["tools"]);

    // 8: the English reply never showed; the answer from the written-out passages is Korean.
    let (said, called) = said_and_called(&eighth);
    assert_eq!(called, ["rag_search", "rag_search"], "{eighth}");
    assert!(!eighth.contains("credits"), "{eighth}");
    assert!(said.starts_with("이 과목은 6 ECTS 학점입니다 [Guía docente"), "{said}");
    let (_, asked) = sent(&requests[17]).pop().unwrap();
    assert!(asked.ends_with("(Answer in Korean, from the documents.)"), "{asked}");

    // 9: the write action chosen for arithmetic never ran nor waited for approval.
    let (said, called) = said_and_called(&ninth);
    assert_eq!(requests[19]["tool_choice"], "required");
    assert_eq!(called, ["rag_search"], "{ninth}");
    assert!(sse_events(&ninth).iter().all(|(e, _)| e != "pending") && !ninth.contains("note_write"), "{ninth}");
    assert_eq!(said, "No encuentro esa información en los documentos que tengo.");
}

/// `eval answers` with a case that has earlier messages: they are asked first, in the same
/// conversation (the judged question's request carries them and their replies), their replies
/// are reported, and what their turns retrieved counts as the conversation's sources — a reply
/// repeating the earlier answer's date, from a turn whose own search found nothing on it, states
/// nothing unsupported. On the bundled course corpus, ingested for real, and the scripted model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_answers_asks_a_cases_earlier_messages_first_in_the_same_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ingest = std::process::Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["ingest", "examples/corpus", "--kb", "cursos", "--keyword-only"])
        .args(["--path-meta", "{asignatura}/{tipo_documento}/**"])
        .current_dir(&repo)
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .output()
        .unwrap();
    assert!(ingest.status.success(), "{}", String::from_utf8_lossy(&ingest.stderr));
    let cases = dir.path().join("cases-answers.jsonl");
    std::fs::write(
        &cases,
        concat!(
            r#"{"lang": "es", "before": ["¿Cuándo es el examen final?"], "question": "¿Me puedes repetir la fecha, por favor?", "expect": [["20"]]}"#,
            "\n",
            r#"{"lang": "es", "before": ["¿Cuántos créditos tiene la asignatura?"], "question": "¿Y en qué semestre?", "expect": [["primer"]]}"#,
        ),
    )
    .unwrap();
    // Each turn: the answer the model starts from memory (stopped), then its answer from the
    // documents; the first with a date the guide does not hold as well.
    let memory = || Reply::text("El examen final es el 15 de octubre.");
    let model = ScriptedModelServer::start(vec![
        memory(),
        Reply::text("El examen final se celebra el 20 de enero. La revisión es el 15 de octubre."),
        memory(),
        Reply::text("Claro: el examen final es el 20 de enero."),
        // The second case's earlier turn fails: its question is not asked.
        Reply::status(400, r#"{"error": {"message": "the scripted model refuses"}}"#),
    ])
    .await
    .unwrap();
    let mut eval = std::process::Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    eval.arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["eval", "answers", "--json", "--context", "asignatura=iv", "--cases"])
        .arg(&cases)
        .env("TOOLGRAPH_LLM_BASE_URL", model.base_url())
        .env("TOOLGRAPH_LLM_MODEL", "scripted")
        .env("TOOLGRAPH_RAG_EMBEDDING", "none");
    let out = tokio::task::spawn_blocking(move || eval.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let requests = model.requests();
    assert_eq!(
        requests.len(),
        5,
        "the first case's turns asked the model twice each, the second's once: {requests:#?}"
    );

    let result = &report["results"][0];
    let label = "Guía docente de Infraestructura Virtual › Evaluación › Convocatoria ordinaria";
    assert_eq!(
        result["before"],
        json!([["¿Cuándo es el examen final?", format!("El examen final se celebra el 20 de enero [{label}].")]]),
        "the earlier turn ran, checked as any turn (its invented date dropped): {result}"
    );
    // The judged question went in the same conversation: after the earlier question and its
    // kept answer.
    let history = sent(&requests[3]);
    assert!(history.iter().any(|(role, c)| role == "user" && c == "¿Cuándo es el examen final?"), "{history:?}");
    assert!(history.iter().any(|(role, c)| role == "assistant" && c.contains("20 de enero")), "{history:?}");
    let (_, asked) = history.last().unwrap();
    assert!(!asked.contains("20 de enero"), "this turn's own search found nothing on the date: {asked}");
    // Its reply draws on what the earlier turn retrieved: cited, right, nothing unsupported.
    assert_eq!(result["reply"], format!("Claro: el examen final es el 20 de enero [{label}]."), "{result}");
    assert_eq!((&result["right_fact"], &result["cited"]), (&json!(true), &json!(true)), "{result}");
    assert_eq!(result["unsupported"], json!([]), "{result}");
    // A conversation that failed before its question is reported so, and is not right.
    let failed = &report["results"][1];
    assert!(failed["error"].as_str().is_some_and(|e| e.starts_with("before the question")), "{failed}");
    assert_eq!((&failed["reply"], &failed["right_fact"]), (&json!(""), &json!(false)), "{failed}");
    assert_eq!(report["all"]["right"], 0.5, "{report}");
}
