//! The doors other clients use — OpenAI's chat completions (docs/openai.md) and AG-UI
//! (docs/ag-ui.md) — their routes and refusals without a socket (axum's `oneshot`). Each bad
//! request is refused, naming what is wrong, before any turn starts (the agent's model is an
//! address nothing answers: a turn that started would fail differently).

mod common;

use axum::body::Body;
use axum::http::Request;
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_conversations::MemoryConversationStore;
use toolgraph_graph::{Checkpointer, MemoryCheckpointer};
use toolgraph_server::auth::Auth;
use toolgraph_server::{AppState, ChatService, ServiceOptions};
use tower::ServiceExt;

fn app() -> axum::Router {
    router(true)
}

/// The service's routes, ready or still starting.
fn router(ready: bool) -> axum::Router {
    let ckpt: Arc<dyn Checkpointer> = Arc::new(MemoryCheckpointer::new());
    // An address nothing answers: a turn that started would fail differently.
    let agents = common::tutor("http://127.0.0.1:9/v1", &ckpt);
    let options = ServiceOptions { auth: Auth::None, ..ServiceOptions::default() };
    let store = Arc::new(MemoryConversationStore::new());
    let state = AppState::new(ChatService::new(agents, "tutor".into(), store, ckpt, options));
    if ready {
        state.set_ready();
    }
    toolgraph_server::router(state)
}

/// `POST path` on `router` with `headers` and `body`: the status and the JSON answer.
async fn send(router: axum::Router, path: &str, headers: &[(&str, &str)], body: String) -> (u16, Value) {
    let mut req = Request::post(path).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = router.oneshot(req.body(Body::from(body)).expect("a request")).await.expect("an answer");
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("a body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// `POST /v1/chat/completions` with `headers` and `body`.
async fn post(headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    send(app(), "/v1/chat/completions", headers, body.to_owned()).await
}

/// A refused request: what it is, its headers and body, and the status, `param` and words
/// of the error it must get.
type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, String, u16, &'a str, &'a str);

const WHO: [(&str, &str); 3] = [("x-tenant-slug", "demo"), ("x-tenant-id", "7"), ("x-user-id", "1")];

fn body(extra: Value) -> String {
    let mut b = json!({ "model": "tutor", "messages": [{ "role": "user", "content": "hola" }] });
    if let (Value::Object(b), Value::Object(extra)) = (&mut b, extra) {
        b.extend(extra);
    }
    b.to_string()
}

#[tokio::test]
async fn the_models_are_the_agents() {
    let resp = app().oneshot(Request::get("/v1/models").body(Body::empty()).expect("a request")).await;
    let resp = resp.expect("an answer");
    assert_eq!(resp.status(), 200);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("a body");
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"], json!([{ "id": "tutor", "object": "model", "created": 0, "owned_by": "toolgraph" }]));
}

#[tokio::test]
async fn each_bad_request_is_refused_in_openais_shape_naming_what_is_wrong() {
    let without = |name: &str| WHO.iter().copied().filter(|(k, _)| *k != name).collect::<Vec<_>>();
    let image =
        json!({ "messages": [{ "role": "user", "content": [{ "type": "image_url", "image_url": { "url": "x" } }] }] });
    let long = json!({ "messages": [{ "role": "user", "content": "a".repeat(40_000) }] });
    let cases: Vec<Case<'_>> = vec![
        (
            "no tenant",
            without("x-tenant-slug"),
            body(json!({})),
            400,
            "X-Tenant-Slug",
            "X-Tenant-Slug header is required",
        ),
        ("no tenant id", without("x-tenant-id"), body(json!({})), 400, "X-Tenant-Id", "numeric id"),
        (
            "a tenant id that is no number",
            vec![("x-tenant-slug", "demo"), ("x-tenant-id", "seven"), ("x-user-id", "1")],
            body(json!({})),
            400,
            "X-Tenant-Id",
            "not a number: seven",
        ),
        ("no user", without("x-user-id"), body(json!({})), 400, "user", "X-User-Id"),
        ("a user that is no number", without("x-user-id"), body(json!({ "user": "ana" })), 400, "user", "ana"),
        ("an unknown model", WHO.to_vec(), body(json!({ "model": "nope" })), 404, "model", "no agent named 'nope'"),
        ("two choices", WHO.to_vec(), body(json!({ "n": 2 })), 400, "n", "one choice"),
        (
            "the client's tools",
            WHO.to_vec(),
            body(json!({ "tools": [{ "type": "function", "function": { "name": "f" } }] })),
            400,
            "tools",
            "own tools",
        ),
        ("no messages", WHO.to_vec(), body(json!({ "messages": [] })), 400, "messages", "no messages"),
        (
            "the last message is the assistant's",
            WHO.to_vec(),
            body(json!({ "messages": [{ "role": "assistant", "content": "hola" }] })),
            400,
            "messages",
            "role `user`, not `assistant`",
        ),
        ("an image", WHO.to_vec(), body(image), 400, "messages", "not `image_url`"),
        ("a message too long", WHO.to_vec(), body(long), 422, "message", "1 to"),
        ("not JSON", WHO.to_vec(), "{\"model\": ".to_owned(), 400, "", "JSON"),
        ("no model", WHO.to_vec(), json!({ "messages": [] }).to_string(), 422, "", "model"),
        (
            "a conversation id that is no number",
            [WHO.to_vec(), vec![("x-conversation-id", "last")]].concat(),
            body(json!({})),
            400,
            "X-Conversation-Id",
            "not a number: last",
        ),
    ];
    for (what, headers, request, status, param, says) in cases {
        let (got, answer) = post(&headers, &request).await;
        assert_eq!(got, status, "{what}: {answer}");
        let error = &answer["error"];
        let kind = if status == 404 { "not_found_error" } else { "invalid_request_error" };
        assert_eq!(error["type"], kind, "{what}: {answer}");
        assert!(error["message"].as_str().is_some_and(|m| m.contains(says)), "{what}: {answer}");
        if !param.is_empty() {
            assert_eq!(error["param"], param, "{what}: {answer}");
        }
    }
    let (_, answer) = post(&WHO, &body(json!({ "model": "nope" }))).await;
    assert_eq!(answer["error"]["code"], "model_not_found");
    // A model name of any length is named by its start only, its control characters escaped.
    let long = format!("\u{1b}[2J{}", "m".repeat(5000));
    let (status, answer) = post(&WHO, &body(json!({ "model": long }))).await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 404, "{answer}");
    assert!(
        message.starts_with("no agent named '\\u{1b}[2Jmmm") && message.contains("… (5004 characters)'"),
        "{message}"
    );
    assert!(message.len() < 300, "{message}");
}

/// `POST /v1/chat/completions` of `body` on `router`, as the tenant's user.
async fn post_on(router: axum::Router, body: String) -> (u16, Value) {
    send(router, "/v1/chat/completions", &WHO, body).await
}

#[tokio::test]
async fn a_whole_conversation_fits_and_the_layers_refuse_in_openais_shape() {
    // 200 earlier turns of 1,000 characters: over the academy contract's 64 KB, within this
    // door's 4 MB — it reaches the handler (here: the model it names is unknown).
    let turn = |role: &str| json!({ "role": role, "content": "x".repeat(1_000) });
    let mut messages: Vec<Value> = (0..200).flat_map(|_| [turn("user"), turn("assistant")]).collect();
    messages.push(json!({ "role": "user", "content": "hola" }));
    let long = json!({ "model": "nope", "messages": messages }).to_string();
    assert!(long.len() > 64 * 1024);
    let (status, answer) = post_on(app(), long).await;
    assert_eq!((status, &answer["error"]["code"]), (404, &json!("model_not_found")), "{answer}");

    // Past 4 MB: refused before it is read, in OpenAI's shape.
    let huge = json!({ "model": "tutor", "messages": [{ "role": "user", "content": "x".repeat(5 << 20) }] });
    let (status, answer) = post_on(app(), huge.to_string()).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");

    // Before start-up finished: 503, in OpenAI's shape.
    let (status, answer) = post_on(router(false), body(json!({}))).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["type"], "server_error", "{answer}");
}

/// `POST /ag-ui/{agent}` with `headers` and `body`.
async fn ag_ui(agent: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    send(app(), &format!("/ag-ui/{agent}"), headers, body.to_string()).await
}

/// A refused AG-UI request: what it is, the agent, its headers and body, the status and the
/// field the error names.
type AgUiCase<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, Value, u16, &'a str);

#[tokio::test]
async fn ag_ui_refuses_a_bad_run_or_resume_before_anything_runs() {
    let run = |extra: Value| {
        let mut b =
            json!({ "threadId": "t", "runId": "r", "messages": [{ "id": "m", "role": "user", "content": "hola" }] });
        if let (Value::Object(b), Value::Object(extra)) = (&mut b, extra) {
            b.extend(extra);
        }
        b
    };
    let resume = |id: &str, status: &str, payload: Value| {
        run(json!({ "threadId": "12", "resume": [{ "interruptId": id, "status": status, "payload": payload }] }))
    };
    let no_user: Vec<(&str, &str)> = WHO.iter().copied().filter(|(k, _)| *k != "x-user-id").collect();
    let cases: Vec<AgUiCase<'_>> = vec![
        ("an unknown agent", "nope", WHO.to_vec(), run(json!({})), 404, "agent"),
        ("no user", "tutor", no_user, run(json!({})), 400, "user"),
        (
            "the last message is the assistant's",
            "tutor",
            WHO.to_vec(),
            run(json!({ "messages": [{ "id": "m", "role": "assistant", "content": "hola" }] })),
            400,
            "messages",
        ),
        ("no thread id", "tutor", WHO.to_vec(), json!({ "runId": "r", "messages": [] }), 422, "threadId"),
        (
            "an interrupt of another service",
            "tutor",
            WHO.to_vec(),
            resume("nope", "resolved", json!(true)),
            400,
            "resume.interruptId",
        ),
        (
            "a status of neither kind",
            "tutor",
            WHO.to_vec(),
            resume("approval-1", "maybe", json!(true)),
            400,
            "resume.status",
        ),
        (
            "an approval answered with something else",
            "tutor",
            WHO.to_vec(),
            resume("approval-1", "resolved", json!({ "x": 1 })),
            422,
            "resume.payload",
        ),
    ];
    for (what, agent, headers, body, status, field) in cases {
        let (got, answer) = ag_ui(agent, &headers, body).await;
        assert_eq!(got, status, "{what}: {answer}");
        assert_eq!(answer["field"], field, "{what}: {answer}");
    }
}
