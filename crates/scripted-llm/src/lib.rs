//! A scripted OpenAI-compatible chat server for tests.
//!
//! Tests start it on an ephemeral loopback port and point a real client at
//! [`ScriptedModelServer::base_url`]; every model-facing test therefore goes through real HTTP
//! and real SSE framing. Each request to `/v1/chat/completions` takes the next [`Reply`] of
//! the script: a streamed sequence of [`Step`]s (text, tool-call fragments, pauses, raw or
//! malformed lines) or an HTTP error with an optional `Retry-After`. Non-streaming requests
//! get the same reply as one JSON body. Requests are recorded for assertions.
//!
//! `/v1/embeddings` answers deterministic bag-of-words vectors ([`EMBEDDING_DIM`] floats, words
//! hashed to dimensions, not normalised, rows returned in reverse order with their `index`), so
//! texts sharing words are close; an input containing `FAIL` gets a 500.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use scripted_llm::{Reply, ScriptedModelServer};
//! let server = ScriptedModelServer::start(vec![Reply::text("Hola, ¿qué tal?")]).await.unwrap();
//! assert!(server.base_url().starts_with("http://127.0.0.1:"));
//! # });
//! ```

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::JoinHandle;

/// One piece of a streamed reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A text delta.
    Text(String),
    /// The first fragment of tool call `index`: its id and name.
    ToolCallStart {
        /// Position of the call.
        index: usize,
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// A fragment of call `index`'s argument text.
    ToolArgs {
        /// Position of the call.
        index: usize,
        /// Argument text fragment.
        fragment: String,
    },
    /// The chunk carrying `finish_reason`.
    Finish(String),
    /// A usage chunk (`choices: []`).
    Usage {
        /// Prompt tokens.
        prompt: u32,
        /// Completion tokens.
        completion: u32,
    },
    /// Silence for this long before the next step (stalls and slow models).
    Pause(Duration),
    /// A `data:` line with exactly this payload (for malformed chunks).
    Raw(String),
    /// The `data: [DONE]` terminator.
    Done,
}

/// What the server answers to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// HTTP 200 with these steps as SSE (or as one JSON body when not streaming).
    Stream(Vec<Step>),
    /// An HTTP error.
    Status {
        /// Status code.
        status: u16,
        /// `Retry-After` header value.
        retry_after: Option<String>,
        /// Response body.
        body: String,
    },
}

impl Reply {
    /// A text reply streamed word by word, then `stop`, usage and `[DONE]`.
    pub fn text(text: &str) -> Self {
        let mut steps: Vec<Step> = split_words(text).into_iter().map(Step::Text).collect();
        steps.extend([Step::Finish("stop".into()), Step::Usage { prompt: 10, completion: 5 }, Step::Done]);
        Self::Stream(steps)
    }

    /// Tool calls `(id, name, arguments JSON)`, each call's arguments streamed in three
    /// fragments, then `tool_calls` and `[DONE]`.
    pub fn tool_calls(calls: &[(&str, &str, Value)]) -> Self {
        let mut steps = Vec::new();
        for (index, (id, name, args)) in calls.iter().enumerate() {
            steps.push(Step::ToolCallStart { index, id: (*id).to_owned(), name: (*name).to_owned() });
            for fragment in split_in(&args.to_string(), 3) {
                steps.push(Step::ToolArgs { index, fragment });
            }
        }
        steps.extend([Step::Finish("tool_calls".into()), Step::Done]);
        Self::Stream(steps)
    }

    /// An HTTP error without `Retry-After`.
    pub fn status(status: u16, body: &str) -> Self {
        Self::Status { status, retry_after: None, body: body.to_owned() }
    }

    /// HTTP 429 with `Retry-After`.
    pub fn rate_limited(retry_after: &str) -> Self {
        Self::Status {
            status: 429,
            retry_after: Some(retry_after.to_owned()),
            body: r#"{"error":{"message":"rate limited"}}"#.into(),
        }
    }
}

fn split_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        cur.push(c);
        if c == ' ' {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn split_in(s: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let size = chars.len().div_ceil(parts).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

#[derive(Default)]
struct Shared {
    script: VecDeque<Reply>,
    responder: Option<Responder>,
    requests: Vec<Value>,
    embedding_requests: Vec<Value>,
}

#[derive(Clone, Default)]
struct AppState(Arc<Mutex<Shared>>);

impl AppState {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A test that panicked while holding the lock already failed; keep serving.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Size of the `/v1/embeddings` vectors.
pub const EMBEDDING_DIM: usize = 64;

/// The vector `/v1/embeddings` returns for `text`: each lowercase word adds 1 to the dimension
/// its FNV-1a hash picks.
pub fn bag_of_words_vector(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; EMBEDDING_DIM];
    for word in text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in word.to_lowercase().bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        v[(h % EMBEDDING_DIM as u64) as usize] += 1.0;
    }
    v
}

async fn embeddings(State(state): State<AppState>, body: Bytes) -> Response {
    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "malformed JSON").into_response();
    };
    state.lock().embedding_requests.push(req.clone());
    let inputs: Vec<String> = match &req["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().map(|v| v.as_str().unwrap_or_default().to_owned()).collect(),
        _ => return (StatusCode::BAD_REQUEST, "input must be a string or an array of strings").into_response(),
    };
    if inputs.iter().any(|i| i.contains("FAIL")) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "scripted embedding failure").into_response();
    }
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .rev()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": bag_of_words_vector(t)}))
        .collect();
    axum::Json(json!({"object": "list", "model": req["model"], "data": data})).into_response()
}

/// Answers a request once the script is used up, from the request's body: for tests whose
/// number of model calls varies (faults, load), where a fixed order cannot line up.
pub type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// A running scripted server; it stops when dropped.
pub struct ScriptedModelServer {
    addr: SocketAddr,
    state: AppState,
    task: JoinHandle<()>,
}

impl ScriptedModelServer {
    /// Binds `127.0.0.1:0` and serves `script` in order.
    ///
    /// # Errors
    /// When the loopback port cannot be bound.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<Self> {
        let state = AppState::default();
        state.lock().script.extend(script);
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/chat/completions", post(chat))
            .route("/v1/embeddings", post(embeddings))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, state, task })
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.lock().script.extend(replies);
    }

    /// Answers with `responder` whenever the script is empty.
    pub fn set_responder(&self, responder: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        self.state.lock().responder = Some(Arc::new(responder));
    }

    /// Bodies of every request received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.state.lock().requests.clone()
    }

    /// Bodies of every `/v1/embeddings` request received so far.
    pub fn embedding_requests(&self) -> Vec<Value> {
        self.state.lock().embedding_requests.clone()
    }

    /// How many requests arrived.
    pub fn request_count(&self) -> usize {
        self.state.lock().requests.len()
    }

    /// Replies not yet served.
    pub fn remaining(&self) -> usize {
        self.state.lock().script.len()
    }
}

impl Drop for ScriptedModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn chat(State(state): State<AppState>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return (StatusCode::BAD_REQUEST, format!("request body is not JSON: {e}")).into_response();
        }
    };
    if let Err(message) = check_history(&request) {
        // As OpenAI answers such a history; the request is still recorded.
        state.lock().requests.push(request);
        let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    let streaming = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let reply = {
        let mut s = state.lock();
        let reply = s.script.pop_front().or_else(|| s.responder.as_ref().map(|r| r(&request)));
        s.requests.push(request);
        reply
    };
    let Some(reply) = reply else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "scripted model server: no reply left in the script")
            .into_response();
    };
    match reply {
        Reply::Status { status, retry_after, body } => {
            let mut resp =
                (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response();
            if let Some(ra) = retry_after.and_then(|v| HeaderValue::from_str(&v).ok()) {
                resp.headers_mut().insert(header::RETRY_AFTER, ra);
            }
            resp
        }
        Reply::Stream(steps) if streaming => sse(steps),
        Reply::Stream(steps) => whole(steps).await,
    }
}

/// Refuses what real servers refuse: an assistant message with `tool_calls` not followed by a
/// `tool` message for each of its ids, or a `tool` message answering no call of the assistant
/// message before it.
fn check_history(request: &Value) -> Result<(), String> {
    let mut outstanding: Vec<&str> = Vec::new();
    for m in request["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let Some(at) = outstanding.iter().position(|c| *c == id) else {
                return Err(format!("a 'tool' message answers '{id}', which the preceding message did not call"));
            };
            outstanding.remove(at);
            continue;
        }
        if !outstanding.is_empty() {
            return Err(format!(
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each \
                 'tool_call_id'; missing: {outstanding:?}"
            ));
        }
        if role == "assistant" {
            outstanding = m["tool_calls"].as_array().into_iter().flatten().filter_map(|c| c["id"].as_str()).collect();
        }
    }
    Ok(())
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    json!({
        "id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    })
    .to_string()
}

fn sse(steps: Vec<Step>) -> Response {
    let stream = async_stream_lite(steps);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn frame(step: &Step) -> Option<String> {
    let data = match step {
        Step::Text(t) => chunk(json!({"role": "assistant", "content": t}), None),
        Step::ToolCallStart { index, id, name } => chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
            None,
        ),
        Step::ToolArgs { index, fragment } => {
            chunk(json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}), None)
        }
        Step::Finish(reason) => chunk(json!({}), Some(reason)),
        Step::Usage { prompt, completion } => json!({
            "id": "chatcmpl-scripted", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        })
        .to_string(),
        Step::Raw(raw) => raw.clone(),
        Step::Done => "[DONE]".into(),
        Step::Pause(_) => return None,
    };
    Some(format!("data: {data}\n\n"))
}

fn async_stream_lite(steps: Vec<Step>) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::unfold(steps.into_iter(), |mut it| async move {
        loop {
            let step = it.next()?;
            if let Step::Pause(d) = step {
                tokio::time::sleep(d).await;
                continue;
            }
            if let Some(f) = frame(&step) {
                return Some((Ok(Bytes::from(f)), it));
            }
        }
    })
}

async fn whole(steps: Vec<Step>) -> Response {
    let mut content = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = "stop".to_owned();
    let mut usage = json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0});
    for step in steps {
        match step {
            Step::Text(t) => content.push_str(&t),
            Step::ToolCallStart { index, id, name } => {
                if calls.len() <= index {
                    calls.resize(index + 1, Default::default());
                }
                calls[index].0 = id;
                calls[index].1 = name;
            }
            Step::ToolArgs { index, fragment } => {
                if calls.len() <= index {
                    calls.resize(index + 1, Default::default());
                }
                calls[index].2.push_str(&fragment);
            }
            Step::Finish(r) => finish = r,
            Step::Usage { prompt, completion } => {
                usage = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
            }
            Step::Pause(d) => tokio::time::sleep(d).await,
            Step::Raw(raw) => return (StatusCode::OK, raw).into_response(),
            Step::Done => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .into_iter()
            .map(
                |(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}),
            )
            .collect();
    }
    axum::Json(json!({
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }))
    .into_response()
}
