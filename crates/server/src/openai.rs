//! OpenAI's chat completions, a door to the same agents (docs/openai.md): `GET /v1/models`
//! lists the agents, `POST /v1/chat/completions` runs a turn of the agent its `model` names —
//! streamed as `chat.completion.chunk`s or answered whole — on the same conversations, runs,
//! checkpoints and approvals as the academy contract, and answers errors in OpenAI's shape.
//!
//! Owns: this door's request and response shapes, and who is asking as it says so (the
//! tenant's headers or its bound key, the user's header or `user`). Turns are the
//! [`ChatService`](crate::ChatService)'s.

use crate::AppState;
use crate::auth::{Caller, Principal};
use crate::error::ApiError;
use crate::extract::{asking, json_body};
use crate::openapi::{OPENAI, OpenAiRefusals};
use crate::runlog::RunLog;
use crate::service::NewTurn;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_protocol::{ConversationId, Frame, PendingAction};

/// `POST /v1/chat/completions`: what this door reads of OpenAI's request. Fields it does not
/// use (`temperature`, `max_tokens`, …) are accepted and ignored: the agent's settings decide
/// them.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"model": "assistant", "messages": [{"role": "user", "content": "What is 12 * 7?"}]}))]
struct CompletionRequest {
    /// The agent.
    model: String,
    /// The conversation as the client has it; the last message, the person's, is the turn.
    messages: Vec<InMessage>,
    #[serde(default)]
    stream: bool,
    /// The numeric user id, when no `X-User-Id` header gives it.
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    n: Option<u32>,
    /// Tools of the client's own, which an agent cannot call.
    #[serde(default)]
    tools: Option<Value>,
    /// Extension: the conversation to continue (a response's `conversation_id`).
    #[serde(default)]
    conversation_id: Option<ConversationId>,
    /// `include_usage`: a last chunk with the turn's tokens, as OpenAI sends it.
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = OpenAiMessage)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

/// An [`ApiError`] in OpenAI's error shape: `{error: {message, type, param, code}}`.
pub(crate) struct OpenAiError(ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let kind = match e.status.as_u16() {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            409 => "conflict_error",
            429 => "rate_limit_error",
            _ => "server_error",
        };
        let code =
            (e.status == StatusCode::NOT_FOUND && e.field.as_deref() == Some("model")).then_some("model_not_found");
        let mut error = json!({ "message": e.describe(), "type": kind, "param": e.field, "code": code });
        // A turn refused because actions wait for a decision says which (as `/stream` does).
        if let Some(pending) = &e.pending_actions {
            error["pending_actions"] = json!(pending);
        }
        let mut resp = (e.status, axum::Json(json!({ "error": error }))).into_response();
        if let Some(secs) = e.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
        }
        resp
    }
}

fn bad(field: &str, message: impl Into<String>) -> OpenAiError {
    OpenAiError(ApiError::field(StatusCode::BAD_REQUEST, field, message))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `GET /v1/models`: each agent as a model.
#[utoipa::path(get, path = "/v1/models", tag = OPENAI,
    responses((status = 200, description = "The agents, as models.", body = crate::openapi::ModelList), OpenAiRefusals))]
pub(crate) async fn models(State(app): State<AppState>) -> Response {
    let (agents, _) = app.chat().agents();
    let data: Vec<Value> = agents
        .iter()
        .map(|(name, _)| json!({ "id": name, "object": "model", "created": 0, "owned_by": "toolgraph" }))
        .collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = OPENAI, request_body = CompletionRequest,
    params(("X-Conversation-Id" = Option<i64>, Header, description = "The conversation to continue (or `conversation_id`).")),
    responses((status = 200, description = "The turn: one `chat.completion`, or with `stream` its `chat.completion.chunk` events ended by `[DONE]`.",
        content((crate::openapi::ChatCompletion = "application/json"), (crate::openapi::SseEvent = "text/event-stream"))), OpenAiRefusals))]
pub(crate) async fn completions(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, OpenAiError> {
    let request: CompletionRequest = json_body(&body)?;
    let (who, mut turn) = turn_request(&app, &caller, &headers, &request)?;
    turn.validate().map_err(ApiError::from)?;
    // A client that sends the whole conversation and no id continues the conversation whose
    // person's messages those are.
    if turn.conversation.is_none() {
        let earlier = request.messages[..request.messages.len().saturating_sub(1)]
            .iter()
            .filter(|m| m.role == "user")
            .map(|m| &m.content);
        turn.conversation = recognised(&app, &who, &request.model, earlier).await?;
    }
    let (run_id, log) = app.chat().start_turn(&who, &turn).await.map_err(ApiError::from)?;
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let reply = Reply { id: format!("chatcmpl-{run_id}"), model: request.model, created: now(), include_usage };
    if request.stream {
        return Ok(reply.stream(log));
    }
    reply.whole(log).await
}

/// Who asks, and the turn this request asks for.
fn turn_request(
    app: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    request: &CompletionRequest,
) -> Result<(Principal, NewTurn), OpenAiError> {
    let (agents, _) = app.chat().agents();
    if !agents.iter().any(|(name, _)| *name == request.model) {
        let names: Vec<&str> = agents.iter().map(|(n, _)| n.as_str()).collect();
        return Err(OpenAiError(ApiError::field(
            StatusCode::NOT_FOUND,
            "model",
            format!(
                "no agent named '{}': the models are the agents ({})",
                crate::error::echoed(&request.model),
                names.join(", ")
            ),
        )));
    }
    if request.n.is_some_and(|n| n != 1) {
        return Err(bad("n", "one choice per request: an agent's turn has one reply"));
    }
    if request.tools.as_ref().is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(bad("tools", "an agent calls its own tools; a client's tools are not supported"));
    }
    let who = asking(caller, headers, request.user.as_deref())?;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let conversation = match (request.conversation_id, header("x-conversation-id")) {
        (Some(id), _) => Some(id),
        (None, Some(id)) => Some(
            id.parse::<ConversationId>()
                .map_err(|_| bad("X-Conversation-Id", format!("the X-Conversation-Id header is not a number: {id}")))?,
        ),
        (None, None) => None,
    };
    let Some(last) = request.messages.last() else {
        return Err(bad("messages", "no messages: the last one is the person's message"));
    };
    if last.role != "user" {
        return Err(bad(
            "messages",
            format!("the last message is the person's turn: role `user`, not `{}`", last.role),
        ));
    }
    let message = text_of(&last.content)?;
    let turn = NewTurn {
        tenant_slug: who.tenant_slug,
        conversation,
        message,
        agent: Some(request.model.clone()),
        context: None,
        tool_events: false,
        node_events: false,
        attachments: Vec::new(),
        run_metadata: None,
    };
    Ok((who.principal, turn))
}

/// The conversation of `who` with `agent` whose person's messages are `asked` (their
/// contents, in order; none when there are none, or one is not text).
pub(crate) async fn recognised<'a>(
    app: &AppState,
    who: &Principal,
    agent: &str,
    asked: impl Iterator<Item = &'a Value>,
) -> Result<Option<ConversationId>, ApiError> {
    let Some(asked) = asked.map(|c| text_of(c).ok()).collect::<Option<Vec<String>>>().filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    Ok(app.chat().conversation_asking(who, agent, &asked).await?)
}

/// A message's text: a string, or the text parts of a list of parts.
pub(crate) fn text_of(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    (kind, _) => {
                        return Err(ApiError::field(
                            StatusCode::BAD_REQUEST,
                            "messages",
                            format!("only text parts are read, not `{}`", kind.unwrap_or("a part without a type")),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "messages",
            "a message's content is text: a string or text parts",
        )),
    }
}

/// What every chunk and the whole answer of one turn carry.
struct Reply {
    id: String,
    model: String,
    created: u64,
    /// Whether a stream ends with a chunk of the turn's tokens.
    include_usage: bool,
}

/// OpenAI's `usage` of a turn: the tokens of every model call it made, summed, as the model
/// reported them (`null` when it reported none).
fn usage_of(log: &RunLog) -> Value {
    match log.usage() {
        None => Value::Null,
        Some(u) => json!({
            "prompt_tokens": u.prompt,
            "completion_tokens": u.completion,
            "total_tokens": u.prompt + u.completion,
            "prompt_tokens_details": { "cached_tokens": u.cached_prompt },
        }),
    }
}

/// How a turn ended, for the last chunk or the whole answer.
#[derive(Default)]
struct Ending {
    conversation_id: Option<ConversationId>,
    message_id: Option<toolgraph_protocol::MessageId>,
    pending: Vec<PendingAction>,
    error: Option<String>,
}

impl Ending {
    /// The text a client that reads only `content` is shown for the actions waiting.
    fn notice(&self) -> String {
        self.pending
            .iter()
            .map(|p| format!("\n\n[Waiting for approval: {}]", p.description))
            .collect::<Vec<_>>()
            .join("")
    }

    /// The extension fields: the conversation to continue, the reply's message, what waits.
    fn extensions(&self, into: &mut serde_json::Map<String, Value>) {
        into.insert("conversation_id".into(), json!(self.conversation_id));
        into.insert("message_id".into(), json!(self.message_id));
        into.insert("pending_actions".into(), json!(self.pending));
    }
}

impl Reply {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> serde_json::Map<String, Value> {
        let v = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        });
        match v {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        }
    }

    /// The turn as `chat.completion.chunk` events, ended by `[DONE]` (or an error object).
    fn stream(self, log: Arc<RunLog>) -> Response {
        let first = Value::Object(self.chunk(json!({ "role": "assistant", "content": "" }), None)).to_string();
        let chunks = Arc::clone(&log)
            .typed_frames()
            .scan((Ending::default(), self, log), |(ending, reply, log), frame| {
                futures::future::ready(Some(reply.frame(ending, frame, log)))
            })
            .flat_map(futures::stream::iter);
        let events = futures::stream::iter([first]).chain(chunks).map(|d| crate::sse::SseEvent::data(&d));
        crate::sse::response(events)
    }

    /// The data of the events one frame of the run becomes (none for most).
    fn frame(&self, ending: &mut Ending, frame: Frame, log: &RunLog) -> Vec<String> {
        let chunk = |delta: Value, finish| Value::Object(self.chunk(delta, finish)).to_string();
        match frame {
            Frame::Token { content } => vec![chunk(json!({ "content": content }), None)],
            Frame::Pending(p) => {
                ending.pending.push(p);
                Vec::new()
            }
            Frame::Done { conversation_id, message_id } => {
                ending.conversation_id = Some(conversation_id);
                ending.message_id = Some(message_id);
                let mut out = Vec::new();
                let notice = ending.notice();
                if !notice.is_empty() {
                    out.push(chunk(json!({ "content": notice }), None));
                }
                let mut last = self.chunk(json!({}), Some("stop"));
                ending.extensions(&mut last);
                out.push(Value::Object(last).to_string());
                if self.include_usage {
                    // As OpenAI: no choices, the usage; it is the last chunk now, so it carries
                    // the extensions too.
                    let mut usage = self.chunk(json!({}), None);
                    usage.insert("choices".into(), json!([]));
                    usage.insert("usage".into(), usage_of(log));
                    ending.extensions(&mut usage);
                    out.push(Value::Object(usage).to_string());
                }
                out.push("[DONE]".to_owned());
                out
            }
            Frame::Error { message } => {
                vec![
                    json!({ "error": { "message": message, "type": "server_error", "param": null, "code": null } })
                        .to_string(),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// The turn as one `chat.completion`, once it ended.
    async fn whole(self, log: Arc<RunLog>) -> Result<Response, OpenAiError> {
        let mut content = String::new();
        let mut ending = Ending::default();
        let mut frames = Box::pin(Arc::clone(&log).typed_frames());
        while let Some(frame) = frames.next().await {
            match frame {
                Frame::Token { content: piece } => content.push_str(&piece),
                Frame::Pending(p) => ending.pending.push(p),
                Frame::Done { conversation_id, message_id } => {
                    ending.conversation_id = Some(conversation_id);
                    ending.message_id = Some(message_id);
                }
                Frame::Error { message } => ending.error = Some(message),
                _ => {}
            }
        }
        if let Some(message) = ending.error {
            // The turn ran (its message is in the conversation): a client that retried it
            // would send the message twice. OpenAI's SDKs honour this header.
            let mut resp = OpenAiError(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)).into_response();
            resp.headers_mut().insert("x-should-retry", HeaderValue::from_static("false"));
            return Ok(resp);
        }
        content.push_str(&ending.notice());
        let mut body = match json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": content },
                "finish_reason": "stop",
            }],
            "usage": usage_of(&log),
        }) {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        ending.extensions(&mut body);
        let mut resp = axum::Json(Value::Object(body)).into_response();
        if let Some(id) = ending.conversation_id {
            resp.headers_mut().insert("x-conversation-id", HeaderValue::from(id.0));
        }
        Ok(resp)
    }
}
