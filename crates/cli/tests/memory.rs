//! An agent's long-term memory (docs/memory.md), served as a process on the scripted model:
//! a fact remembered in one conversation is in the prompt of another conversation of the same
//! person, never in another person's or another tenant's; `recall` finds it; the person sees and
//! deletes it through the store routes; with `approve_writes` nothing is remembered until the
//! person approves. And a long conversation whose older turns are summarised instead of dropped,
//! no tool call summarised apart from its result.

mod common;

use common::{event_data, free_port, said, serve_command, sse_events, wait_ready};
use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;

const CONFIG: &str = r#"
default_agent = "tutor"

[agents.tutor]
system_prompt = "You are a tutor."
tools = ["calculator"]

[agents.tutor.memory]
recall = 3

[agents.careful]
system_prompt = "You are a careful tutor."
tools = ["calculator"]
# A request may set these in its context: the service's identity still wins.
state_keys = ["userId", "tenantId"]

[agents.careful.memory]
approve_writes = true
namespace = ["memories", "careful"]
"#;

// Not the examples of the tool descriptions, which every request carries.
const FACT: &str = "Prefers answers in Catalan";

struct Person {
    slug: &'static str,
    tenant: i64,
    user: i64,
}

const ANA: Person = Person { slug: "demo", tenant: 1, user: 1 };
const BEN: Person = Person { slug: "demo", tenant: 1, user: 2 };
const ANA_ELSEWHERE: Person = Person { slug: "other", tenant: 2, user: 1 };

async fn post(base: &str, who: &Person, path: &str, body: &Value) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("X-Tenant-Slug", who.slug)
        .header("X-Tenant-Id", who.tenant.to_string())
        .header("X-User-Id", who.user.to_string())
        .json(body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn turn(base: &str, who: &Person, agent: &str, message: &str) -> String {
    turn_in(base, who, agent, &Value::Null, message).await
}

async fn turn_in(base: &str, who: &Person, agent: &str, conversation: &Value, message: &str) -> String {
    let body = json!({"tenantSlug": who.slug, "tenantId": who.tenant, "userId": who.user,
        "conversationId": conversation, "message": message, "agent": agent});
    post(base, who, "/api/chatbot/stream", &body).await.1
}

/// The system messages of a model request after its first (the system prompt).
fn later_system_messages(request: &Value) -> Vec<String> {
    let messages = request["messages"].as_array().unwrap();
    messages
        .iter()
        .skip(1)
        .filter(|m| m["role"] == "system")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The person's memories under `namespace`, as the store routes show them.
async fn memories(base: &str, who: &Person, namespace: &[&str]) -> Vec<Value> {
    let (status, body) = post(base, who, "/store/items/search", &json!({"namespace_prefix": namespace})).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["items"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_remembered_in_one_conversation_is_recalled_in_the_next_only_for_its_person() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("toolgraph.toml"), CONFIG).unwrap();
    let model = ScriptedModelServer::start(vec![
        // 1. Ana asks the tutor to remember; it does.
        Reply::tool_calls(&[("m1", "remember", json!({"text": FACT}))]),
        Reply::text("Lo recordaré."),
        // 2-4. A new conversation of Ana (two turns), then Ben's, then Ana's in another tenant.
        Reply::text("Cuatro."),
        Reply::text("Ocho."),
        Reply::text("Four."),
        Reply::text("Four."),
        // 5. Ana asks what it remembers: `recall`.
        Reply::tool_calls(&[("r1", "recall", json!({"query": "language"}))]),
        Reply::text("Que prefieres el catalán."),
        // 6. After Ana deleted it through the store routes.
        Reply::text("Four."),
        // 7. The careful tutor asks before it remembers.
        Reply::tool_calls(&[("m2", "remember", json!({"text": "Their daughter is in class 5A"}))]),
        Reply::text("Noted."),
        // 8. Ben, claiming Ana's ids in his context.
        Reply::text("Hello."),
    ])
    .await
    .unwrap();
    let (_served, base) = serve(dir.path(), &model).await;

    let first = turn(&base, &ANA, "tutor", "Please remember that I prefer answers in Catalan.").await;
    assert_eq!(said(&first), "Lo recordaré.", "{first}");
    let stored = memories(&base, &ANA, &["memories"]).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["value"]["text"], FACT);
    assert_eq!(stored[0]["value"]["agent"], "tutor");
    // The agent's own namespace in her store.
    assert_eq!(stored[0]["namespace"], json!(["memories", "tutor"]));

    let second = turn(&base, &ANA, "tutor", "What is 2 + 2?").await;
    let conversation = event_data(&second, "done")["conversationId"].clone();
    turn_in(&base, &ANA, "tutor", &conversation, "And 4 + 4?").await;
    turn(&base, &BEN, "tutor", "What is 2 + 2?").await;
    turn(&base, &ANA_ELSEWHERE, "tutor", "What is 2 + 2?").await;
    let requests = model.requests();
    assert_eq!(requests.len(), 6, "{requests:#?}");
    // Ana's next conversation: the fact, in a system message right after the system prompt —
    // the same on her next turn, so what the model computed of the conversation is reused.
    for (request, history) in
        [(&requests[2], vec!["What is 2 + 2?"]), (&requests[3], vec!["What is 2 + 2?", "Cuatro.", "And 4 + 4?"])]
    {
        let recalled = later_system_messages(request);
        assert_eq!(recalled.len(), 1, "{request:#}");
        assert!(recalled[0].contains(FACT), "{recalled:?}");
        let messages = request["messages"].as_array().unwrap();
        assert_eq!(messages[1]["role"], "system");
        let rest: Vec<&str> = messages[2..].iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(rest, history, "{request:#}");
    }
    assert_eq!(requests[2]["messages"][1], requests[3]["messages"][1]);
    // Not Ben's, not Ana's in another tenant; and neither sees it in their store.
    for (request, who) in [(&requests[4], &BEN), (&requests[5], &ANA_ELSEWHERE)] {
        assert!(later_system_messages(request).is_empty(), "{request:#}");
        assert!(!request.to_string().contains(FACT), "{request:#}");
        assert!(memories(&base, who, &["memories"]).await.is_empty());
    }

    // `recall` returns it to the model.
    let fifth = turn(&base, &ANA, "tutor", "What do you remember about me?").await;
    assert_eq!(said(&fifth), "Que prefieres el catalán.", "{fifth}");
    let after_recall = &model.requests()[7];
    let tool_message = after_recall["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool_message["content"].as_str().unwrap().contains(FACT), "{after_recall:#}");

    // Ana deletes it through the store routes: the next conversation recalls nothing.
    let key = stored[0]["key"].as_str().unwrap();
    let deleted = reqwest::Client::new()
        .delete(format!("{base}/store/items"))
        .header("X-Tenant-Slug", "demo")
        .header("X-Tenant-Id", "1")
        .header("X-User-Id", "1")
        .json(&json!({"namespace": ["memories", "tutor"], "key": key}))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.text().await.unwrap());
    turn(&base, &ANA, "tutor", "What is 2 + 2?").await;
    let sixth = &model.requests()[8];
    assert!(later_system_messages(sixth).is_empty(), "{sixth:#}");

    // The careful tutor's `remember` is a write: nothing is kept until Ana approves.
    let seventh = turn(&base, &ANA, "careful", "My daughter is in class 5A.").await;
    let pending = event_data(&seventh, "pending");
    assert!(pending.to_string().contains("Remember about you: \\\"Their daughter is in class 5A\\\""), "{pending:#}");
    assert!(memories(&base, &ANA, &["memories", "careful"]).await.is_empty());
    let conversation = event_data(&seventh, "done")["conversationId"].clone();
    let confirm = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
        "conversationId": conversation, "messageId": pending["messageId"], "confirmed": true});
    let (status, confirmed) = post(&base, &ANA, "/api/chatbot/confirm", &confirm).await;
    assert_eq!(status, 200, "{confirmed}");
    let kept = memories(&base, &ANA, &["memories", "careful"]).await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["value"]["text"], "Their daughter is in class 5A");
    assert!(memories(&base, &BEN, &["memories"]).await.is_empty());
    assert!(sse_events(&seventh).iter().any(|(e, _)| e == "done"));

    // A put's `index` of another shape is refused, naming it, and keeps nothing.
    for index in [json!("text"), json!(true), json!([1]), json!([""])] {
        let item = json!({"namespace": ["memories", "tutor"], "key": "odd", "value": {"text": "x"}, "index": index});
        let refused = reqwest::Client::new()
            .put(format!("{base}/store/items"))
            .header("X-Tenant-Slug", "demo")
            .header("X-Tenant-Id", "1")
            .header("X-User-Id", "1")
            .json(&item)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 422, "{index}");
        assert!(refused.text().await.unwrap().contains("index"), "{index}");
    }
    assert!(!memories(&base, &ANA, &["memories"]).await.iter().any(|i| i["key"] == "odd"));

    // Ben cannot reach Ana's memories by naming her in his request's context.
    let body = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 2, "conversationId": null,
        "message": "What do you know about me?", "agent": "careful", "context": {"userId": 1, "tenantId": 1}});
    let (status, bens) = post(&base, &BEN, "/api/chatbot/stream", &body).await;
    assert_eq!(status, 200, "{bens}");
    let requests = model.requests();
    let last = requests.last().unwrap();
    assert_eq!(last["messages"].as_array().unwrap().last().unwrap()["content"], "What do you know about me?");
    // (The tool descriptions every request carries hold "class 5A" as an example: the notes
    // would be a system message after the prompt.)
    assert!(later_system_messages(last).is_empty(), "{last:#}");
}

/// `toolgraph serve` over `dir`'s `toolgraph.toml`, on `model`: ready, and its base URL.
async fn serve(dir: &std::path::Path, model: &ScriptedModelServer) -> (Served, String) {
    serve_embedding(dir, model, "none").await
}

/// As [`serve`], with `rag.embedding = embedding`.
async fn serve_embedding(dir: &std::path::Path, model: &ScriptedModelServer, embedding: &str) -> (Served, String) {
    let port = free_port();
    let child = serve_command(dir, model, port)
        .args(["--config", "toolgraph.toml"])
        .env("TOOLGRAPH_RAG_EMBEDDING", embedding)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let served = Served(child);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    (served, base)
}

/// The service, stopped when the test ends, passed or not.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SUMMARISING: &str = r#"
default_agent = "chatty"

[agents.chatty]
system_prompt = "You are a tutor."
tools = ["calculator"]
history_budget = 40
older_turns = "summarise"
"#;

/// Whether `request` is a summary call (by its instruction).
fn summarises(request: &Value) -> bool {
    request["messages"][0]["content"]
        .as_str()
        .is_some_and(|c| c.starts_with("You keep the memory of a long conversation"))
}

/// Every tool message of `request` follows the call it answers.
fn calls_precede_results(request: &Value) -> bool {
    let messages = request["messages"].as_array().unwrap();
    messages.iter().enumerate().filter(|(_, m)| m["role"] == "tool").all(|(i, m)| {
        messages[..i].iter().any(|earlier| {
            earlier["tool_calls"].as_array().is_some_and(|calls| calls.iter().any(|c| c["id"] == m["tool_call_id"]))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_turns_are_summarised_with_calls_and_results_together_and_the_summary_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("toolgraph.toml"), SUMMARISING).unwrap();
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    model.set_responder(|request| {
        if summarises(request) {
            return Reply::text("Ana's exam is on 20 January.");
        }
        let messages = request["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        let asked = messages.iter().rev().find(|m| m["role"] == "user").unwrap()["content"].as_str().unwrap();
        match (last["role"].as_str(), asked) {
            (Some("user"), a) if a.starts_with("What is 12 * 7") => {
                Reply::tool_calls(&[("c1", "calculator", json!({"expression": "12 * 7"}))])
            }
            (Some("tool"), _) => Reply::text("It is 84."),
            (_, a) if a.starts_with("My name is Ana") => Reply::text("Noted, Ana."),
            _ => Reply::text("On 20 January."),
        }
    });
    let (_served, base) = serve(dir.path(), &model).await;

    let mut conversation = Value::Null;
    for message in [
        "My name is Ana and my final exam is on 20 January; please keep that in mind for later.",
        "What is 12 * 7?",
        "And when is my exam again?",
    ] {
        let body = json!({"tenantSlug": "demo", "tenantId": 1, "userId": 1,
            "conversationId": conversation, "message": message});
        let (status, reply) = post(&base, &ANA, "/api/chatbot/stream", &body).await;
        assert_eq!(status, 200, "{reply}");
        conversation = event_data(&reply, "done")["conversationId"].clone();
    }
    let requests = model.requests();
    let summaries: Vec<&Value> = requests.iter().filter(|r| summarises(r)).collect();
    // The first turn falls out during the second (after its tool result), the second during
    // the third.
    assert_eq!(summaries.len(), 2, "{requests:#?}");
    // The first summary reads the first turn, whole.
    let first = summaries[0]["messages"][1]["content"].as_str().unwrap();
    assert!(first.contains("Person: My name is Ana and my final exam is on 20 January"), "{first}");
    assert!(first.contains("Assistant: Noted, Ana."), "{first}");
    // The second reads the earlier summary and the second turn: the call with its result.
    let second = summaries[1]["messages"][1]["content"].as_str().unwrap();
    assert!(second.starts_with("The summary so far:\nAna's exam is on 20 January."), "{second}");
    assert!(
        second.contains(
            "Person: What is 12 * 7?\nAssistant called calculator: {\"expression\":\"12 * 7\"}\ncalculator returned: "
        ),
        "{second}"
    );
    assert!(second.contains("Assistant: It is 84."), "{second}");
    assert!(!second.contains("My name is Ana"), "{second}");
    // The last answer: the summary right after the system prompt, the first turn no longer in
    // the window; no call apart from its result in any request.
    let last = requests.iter().rev().find(|r| !summarises(r)).unwrap();
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages[1]["role"], "system", "{last:#}");
    assert!(messages[1]["content"].as_str().unwrap().ends_with(":\nAna's exam is on 20 January."), "{last:#}");
    assert!(!last.to_string().contains("My name is Ana"), "{last:#}");
    assert_eq!(messages.last().unwrap()["content"], "And when is my exam again?");
    for request in requests.iter().filter(|r| !summarises(r)) {
        assert!(calls_precede_results(request), "{request:#}");
    }

    // The summary is kept with the state: the last checkpoint shows it and what it covers.
    let checkpoints = format!("{base}/api/chatbot/conversations/{conversation}/checkpoints");
    let list = get(&format!("{checkpoints}?tenantId=1&userId=1")).await;
    let seq = list["checkpoints"].as_array().unwrap().last().unwrap()["seq"].clone();
    let state = get(&format!("{checkpoints}/{seq}?tenantId=1&userId=1")).await;
    let kept = &state["state"]["channels"]["history_summary"];
    assert_eq!(kept["text"], "Ana's exam is on 20 January.", "{state:#}");
    // Up to the third turn's message: the two turns before it.
    assert_eq!(kept["upto"], 6, "{kept}");
}

async fn get(url: &str) -> Value {
    let response = reqwest::Client::new().get(url).header("X-Tenant-Slug", "demo").send().await.unwrap();
    response.json().await.unwrap()
}

const BY_MEANING: &str = r#"
default_agent = "tutor"

[server]
item_search = "hybrid"

[agents.tutor]
system_prompt = "You are a tutor."
tools = ["calculator"]

[agents.tutor.memory]
recall = 2
"#;

/// What Ana told the tutor, oldest first: the pet is not among the latest two.
const ANAS_FACTS: [&str; 5] = [
    "Has a cat called Miso",
    "Prefers answers in Catalan",
    "Plays volleyball on Thursdays",
    "Takes the bus to the campus",
    "Uses Linux on a ThinkPad",
];

async fn put(base: &str, who: &Person, body: &Value) {
    let response = reqwest::Client::new()
        .put(format!("{base}/store/items"))
        .header("X-Tenant-Slug", who.slug)
        .header("X-Tenant-Id", who.tenant.to_string())
        .header("X-User-Id", who.user.to_string())
        .json(body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.text().await.unwrap());
}

/// `server.item_search = "hybrid"` with the local e5 model (weights from `scripts/fetch-models
/// embed`): a question that shares no word with what was remembered finds it — through the
/// store routes, in the notes of the prompt (the most related, not the latest), and through
/// `recall` — while an item kept out of the index is found by its words only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_items_are_found_by_meaning_with_the_local_model() {
    if common::model_weights("e5-small-q4.bin", "embed").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("toolgraph.toml"), BY_MEANING).unwrap();
    let model = ScriptedModelServer::start(vec![
        // 1. Ana asks about her pet: the notes are the two facts most related to it.
        Reply::text("Se llama Miso."),
        // 2. The tutor looks it up with `recall`, in other words again.
        Reply::tool_calls(&[("r1", "recall", json!({"query": "animal de compañía", "top_k": 1}))]),
        Reply::text("Miso."),
    ])
    .await
    .unwrap();
    let (_served, base) = serve_embedding(dir.path(), &model, "local").await;
    for (n, fact) in ANAS_FACTS.iter().enumerate() {
        put(&base, &ANA, &json!({"namespace": ["memories", "tutor"], "key": format!("f{n}"), "value": {"text": fact}}))
            .await;
    }
    // Kept out of the index: only its words find it.
    let dog = json!({"namespace": ["memories", "tutor"], "key": "dog", "value": {"text": "Walks the neighbour's dog Rex"},
        "index": false});
    put(&base, &ANA, &dog).await;
    put(
        &base,
        &BEN,
        &json!({"namespace": ["memories", "tutor"], "key": "f0", "value": {"text": "Has a cat called Tom"}}),
    )
    .await;

    // No word of the question is in any item.
    let question = "¿Cómo se llama mi mascota?";
    let search = |query: &str, limit: u32| json!({"namespace_prefix": ["memories"], "query": query, "limit": limit});
    let (status, body) = post(&base, &ANA, "/store/items/search", &search(question, 3)).await;
    assert_eq!(status, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    let texts: Vec<&str> =
        found["items"].as_array().unwrap().iter().map(|i| i["value"]["text"].as_str().unwrap()).collect();
    assert_eq!(texts.first(), Some(&"Has a cat called Miso"), "{found:#}");
    assert!(found["items"][0]["score"].as_f64().is_some(), "{found:#}");
    assert!(!body.contains("Tom") && !body.contains("Rex"), "not Ben's; not the unindexed dog: {found:#}");
    // The dog is found by its own word.
    let (_, by_word) = post(&base, &ANA, "/store/items/search", &search("Rex", 10)).await;
    assert!(by_word.contains("Walks the neighbour's dog Rex"), "{by_word}");

    // The notes of the prompt: the facts most related to her message, though the cat is the
    // oldest (the latest two would be Linux and the bus).
    let first = turn(&base, &ANA, "tutor", question).await;
    assert_eq!(said(&first), "Se llama Miso.", "{first}");
    let notes = later_system_messages(&model.requests()[0]);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("Has a cat called Miso"), "{notes:?}");
    assert_eq!(notes[0].lines().count(), 3, "the header and two notes: {notes:?}");

    // `recall`, asked in other words again.
    let second = turn(&base, &ANA, "tutor", "¿Y qué recuerdas de mi animal?").await;
    assert_eq!(said(&second), "Miso.", "{second}");
    let after = &model.requests()[2];
    let tool = after["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    let recalled = tool["content"].as_str().unwrap();
    assert!(recalled.contains("Has a cat called Miso"), "{recalled}");
    assert!(ANAS_FACTS[1..].iter().all(|f| !recalled.contains(f)), "top_k 1: {recalled}");
}
