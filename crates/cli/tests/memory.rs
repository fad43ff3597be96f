//! An agent's long-term memory (docs/memory.md), served as a process on the scripted model:
//! a fact remembered in one conversation is in the prompt of another conversation of the same
//! person, never in another person's or another tenant's; `recall` finds it; the person sees and
//! deletes it through the store routes; with `approve_writes` nothing is remembered until the
//! person approves.

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
    let body = json!({"tenantSlug": who.slug, "tenantId": who.tenant, "userId": who.user,
        "conversationId": null, "message": message, "agent": agent});
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
        // 2-4. A new conversation of Ana, then Ben's, then Ana's in another tenant.
        Reply::text("Cuatro."),
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
    ])
    .await
    .unwrap();
    let port = free_port();
    let mut child = serve_command(dir.path(), &model, port)
        .args(["--config", "toolgraph.toml"])
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _stop = Stop(&mut child);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;

    let first = turn(&base, &ANA, "tutor", "Please remember that I prefer answers in Catalan.").await;
    assert_eq!(said(&first), "Lo recordaré.", "{first}");
    let stored = memories(&base, &ANA, &["memories"]).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["value"]["text"], FACT);
    assert_eq!(stored[0]["value"]["agent"], "tutor");

    turn(&base, &ANA, "tutor", "What is 2 + 2?").await;
    turn(&base, &BEN, "tutor", "What is 2 + 2?").await;
    turn(&base, &ANA_ELSEWHERE, "tutor", "What is 2 + 2?").await;
    let requests = model.requests();
    assert_eq!(requests.len(), 5, "{requests:#?}");
    // Ana's next conversation: the fact, as a system message right before her question.
    let anas = &requests[2];
    let recalled = later_system_messages(anas);
    assert_eq!(recalled.len(), 1, "{anas:#}");
    assert!(recalled[0].contains(FACT), "{recalled:?}");
    let messages = anas["messages"].as_array().unwrap();
    assert_eq!(messages[messages.len() - 2]["role"], "system");
    assert_eq!(messages[messages.len() - 1]["content"], "What is 2 + 2?");
    // Not Ben's, not Ana's in another tenant; and neither sees it in their store.
    for (request, who) in [(&requests[3], &BEN), (&requests[4], &ANA_ELSEWHERE)] {
        assert!(later_system_messages(request).is_empty(), "{request:#}");
        assert!(!request.to_string().contains(FACT), "{request:#}");
        assert!(memories(&base, who, &["memories"]).await.is_empty());
    }

    // `recall` returns it to the model.
    let fifth = turn(&base, &ANA, "tutor", "What do you remember about me?").await;
    assert_eq!(said(&fifth), "Que prefieres el catalán.", "{fifth}");
    let after_recall = &model.requests()[6];
    let tool_message = after_recall["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool_message["content"].as_str().unwrap().contains(FACT), "{after_recall:#}");

    // Ana deletes it through the store routes: the next conversation recalls nothing.
    let key = stored[0]["key"].as_str().unwrap();
    let deleted = reqwest::Client::new()
        .delete(format!("{base}/store/items"))
        .header("X-Tenant-Slug", "demo")
        .header("X-Tenant-Id", "1")
        .header("X-User-Id", "1")
        .json(&json!({"namespace": ["memories"], "key": key}))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.text().await.unwrap());
    turn(&base, &ANA, "tutor", "What is 2 + 2?").await;
    let sixth = &model.requests()[7];
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
}

/// Stops the service when the test ends, passed or not.
struct Stop<'a>(&'a mut std::process::Child);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
