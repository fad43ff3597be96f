//! Interoperability: `toolgraph serve`'s OpenAI chat completions (docs/openai.md) driven by an
//! implementation nobody here wrote, OpenAI's official Python SDK (PyPI `openai`, installed by
//! `scripts/interop-deps`), over HTTP with a tenant-bound API key, on the scripted model.

mod common;
use common::{client_json, serve_with_key};

use scripted_llm::{Reply, ScriptedModelServer};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use toolgraph_testkit::interop::openai_python;

const KEY: &str = "sk-test-openai-door";

fn messages(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap_or("").to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_sdk_talks_to_the_agents() {
    let Some(python) = openai_python() else { return };
    let model = ScriptedModelServer::start(vec![
        Reply::text("Hola, soy el asistente."),
        Reply::text("Seguimos en la misma conversación."),
        Reply::tool_calls(&[("n1", "note_write", json!({"title": "Docker", "body": "Volumes persist data."}))]),
        Reply::status(500, "the model server broke"),
        Reply::text("Son 42."),
        Reply::text("Son 48."),
    ])
    .await
    .unwrap();
    let (mut serve, base, _dir) = serve_with_key(&model, KEY, true, &[("TOOLGRAPH_LLM_MAX_RETRIES", "0")]).await;

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/openai_client.py");
    let mut client = Command::new(python);
    client.arg(script).arg(&base).arg(KEY);
    let saw = client_json(client).await;

    // Every agent is a model.
    assert_eq!(saw["models"], json!(["assistant", "helper"]));

    // A whole answer, in the SDK's types, with the conversation to continue.
    let whole = &saw["whole"];
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "assistant");
    assert_eq!(whole["role"], "assistant");
    assert_eq!(whole["content"], "Hola, soy el asistente.");
    assert_eq!(whole["finish"], "stop");
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"), "{whole}");
    let conversation = whole["extra"]["conversation_id"].as_i64().expect("a conversation id");
    assert!(whole["extra"]["message_id"].is_i64(), "{whole}");
    assert_eq!(whole["extra"]["pending_actions"], json!([]));
    // The turn's tokens as the model reported them (the scripted model: 10 prompt, 5 generated).
    assert_eq!(whole["usage"]["prompt_tokens"], 10, "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 5, "{whole}");
    assert_eq!(whole["usage"]["total_tokens"], 15, "{whole}");
    assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{whole}");
    let requests = model.requests();
    let first = messages(&requests[0]);
    assert_eq!(
        first[0],
        ("system".to_owned(), "You are the assistant.".to_owned()),
        "the agent's prompt, not the client's"
    );
    assert!(!first.iter().any(|(_, c)| c.contains("the agent's own prompt decides")), "{first:?}");
    assert_eq!(first.last().unwrap(), &("user".to_owned(), "hola".to_owned()));

    // Streamed, continuing that conversation: the model read the earlier turn.
    let stream = &saw["stream"];
    assert_eq!(stream["object"], "chat.completion.chunk");
    assert_eq!(stream["first_role"], "assistant");
    assert_eq!(stream["text"], "Seguimos en la misma conversación.");
    assert_eq!(stream["finish"].as_array().unwrap().last().unwrap(), "stop");
    assert_eq!(stream["last_extra"]["conversation_id"], conversation);
    // `stream_options.include_usage`: one last chunk, without choices, with the turn's tokens.
    assert_eq!(stream["usage_last"], true, "{stream}");
    assert_eq!(stream["usage"].as_array().map(Vec::len), Some(1), "{stream}");
    assert_eq!(stream["usage"][0]["total_tokens"], 15, "{stream}");
    let second = messages(&requests[1]);
    assert!(second.contains(&("assistant".to_owned(), "Hola, soy el asistente.".to_owned())), "{second:?}");
    assert_eq!(second.last().unwrap(), &("user".to_owned(), "¿y ahora?".to_owned()));

    // A write waits for the person's approval: said in the text and listed; approved through
    // the academy contract's confirm, it runs.
    let pending = &saw["pending"];
    let content = pending["content"].as_str().unwrap();
    assert!(content.contains("[Waiting for approval:"), "{pending}");
    let action = &pending["extra"]["pending_actions"][0];
    assert_eq!(action["toolName"], "note_write", "{pending}");
    let busy = &saw["busy"];
    assert_eq!((busy["status"].as_u64(), busy["class"].as_str()), (Some(409), Some("ConflictError")), "{busy}");
    assert_eq!(busy["body"]["pending_actions"][0]["messageId"], action["messageId"], "{busy}");
    model.push([Reply::text("Nota guardada.")]);
    let confirm = reqwest::Client::new()
        .post(format!("{base}/api/chatbot/confirm"))
        .bearer_auth(KEY)
        .header("X-Tenant-Slug", "demo")
        .json(&json!({
            "tenantSlug": "demo",
            "tenantId": 7,
            "userId": 1,
            "conversationId": pending["extra"]["conversation_id"],
            "messageId": action["messageId"],
            "confirmed": true,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(confirm.status(), 200);
    let confirmed: Value = confirm.json().await.unwrap();
    assert_eq!(confirmed["message"], "Nota guardada.", "{confirmed}");

    // A model that fails mid-turn: the SDK raises, as on OpenAI's own stream errors.
    assert_eq!(saw["stream_error"]["raised"], true, "{}", saw["stream_error"]);

    // Errors in OpenAI's shape, as the SDK's exception classes.
    let unknown = &saw["unknown_model"];
    assert_eq!((unknown["status"].as_u64(), unknown["class"].as_str()), (Some(404), Some("NotFoundError")));
    assert!(unknown["body"].to_string().contains("model_not_found"), "{unknown}");
    assert!(unknown["body"].to_string().contains("no agent named 'nope'"), "{unknown}");
    assert_eq!(saw["wrong_key"]["status"], 401, "{}", saw["wrong_key"]);
    assert_eq!(saw["wrong_key"]["class"], "AuthenticationError");
    let other = &saw["other_tenant"];
    assert_eq!((other["status"].as_u64(), other["class"].as_str()), (Some(403), Some("PermissionDeniedError")));
    assert!(other["body"].to_string().contains("opens tenant id 7 only"), "{other}");
    let no_user = &saw["no_user"];
    assert_eq!(no_user["status"], 400, "{no_user}");
    assert!(no_user["body"].to_string().contains("X-User-Id"), "{no_user}");
    assert_eq!(saw["assistant_last"]["status"], 400, "{}", saw["assistant_last"]);

    // Sent whole each time and without its id, a conversation is still one: the second
    // message continues the first's conversation, whose turn the model read.
    let stateless = &saw["stateless"];
    assert_eq!(stateless["again"], stateless["first"], "{stateless}");
    assert_eq!(stateless["reply"], "Son 48.");
    let requests = model.requests();
    let last = messages(&requests[requests.len() - 2]);
    assert!(last.contains(&("assistant".to_owned(), "Son 42.".to_owned())), "{last:?}");
    assert!(!last.iter().any(|(_, c)| c.contains("a client's own prompt")), "{last:?}");

    // Refused requests cost no model call: six turns and the approved note's reply.
    let _ = serve.kill();
    let _ = serve.wait();
    assert_eq!(model.request_count(), 7);
}
