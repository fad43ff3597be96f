//! AG-UI, a door to the same agents for AG-UI clients (`@ag-ui/client`, CopilotKit;
//! docs/ag-ui.md): `POST /ag-ui/{agent}` takes a `RunAgentInput` and streams the run as AG-UI
//! events — run started and finished or failed, the reply as text messages, tool calls and
//! their results — with a write waiting for approval (or an `ask` node's question) as an
//! interrupt of the finished run, which a later run resumes.
//!
//! Owns: this door's input and events. Who is asking is read as on OpenAI's door
//! ([`asking`]); turns, approvals and answers are the [`ChatService`](crate::ChatService)'s.

use crate::AppState;
use crate::auth::{Caller, Principal};
use crate::error::ApiError;
use crate::extract::{Asking, asking, json_body};
use crate::openai::recognised;
use crate::openapi::{AGUI, Refusals};
use crate::runlog::RunLog;
use crate::service::{ChatService, NewTurn, Resuming, Resumption};
use crate::wire::ConfirmResponse;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_graph::Decision;
use toolgraph_protocol::{ConversationId, Frame, MessageId, PendingAction};

/// The tool name of an `ask` node's question among pending actions (docs/agents.md).
pub(crate) const ASK: &str = "@ask";

/// What this door reads of AG-UI's `RunAgentInput`; the rest (`tools`, `context`, `state`,
/// `forwardedProps`) is accepted and not used: an agent has its own tools and state.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"threadId": "thread-1", "runId": "run-1", "messages": [{"role": "user", "content": "What is 12 * 7?"}]}))]
struct RunAgentInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    messages: Vec<InMessage>,
    #[serde(default)]
    resume: Vec<ResumeEntry>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = AgUiMessage)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct ResumeEntry {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Value,
}

/// `POST /ag-ui/{agent}`.
#[utoipa::path(post, path = "/ag-ui/{agent}", tag = AGUI, params(("agent" = String, Path, description = "The agent's name (`assistant` on a fresh install).", example = "assistant")),
    request_body = RunAgentInput,
    responses((status = 200, description = "The run's AG-UI events.", content_type = "text/event-stream", body = crate::openapi::SseEvent), Refusals))]
pub(crate) async fn run(
    State(app): State<AppState>,
    Path(agent): Path<String>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let input: RunAgentInput = json_body(&body)?;
    let (agents, _) = app.chat().agents();
    if !agents.iter().any(|(name, _)| *name == agent) {
        return Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "agent",
            format!("no agent named '{}'", crate::error::echoed(&agent)),
        ));
    }
    let who = asking(&caller, &headers, None)?;
    let run = Run { thread_id: input.thread_id.clone(), run_id: input.run_id.clone() };
    // The thread is a conversation of theirs: by its id, or by the person's messages.
    let users: Vec<&Value> = input.messages.iter().filter(|m| m.role == "user").map(|m| &m.content).collect();
    let mut turn = NewTurn {
        tenant_slug: who.tenant_slug.clone(),
        conversation: input.thread_id.parse().ok(),
        agent: Some(agent.clone()),
        tool_events: true,
        attachments: Vec::new(),
        ..NewTurn::default()
    };
    if !input.resume.is_empty() {
        // A resumed run answers the pause the thread's last turn ended on.
        if turn.conversation.is_none() {
            turn.conversation = recognised(&app, &who.principal, &agent, users.iter().copied()).await?;
        }
        let conversation = turn.conversation.ok_or_else(|| {
            ApiError::field(StatusCode::NOT_FOUND, "threadId", "no conversation of this thread waits for an answer")
        })?;
        let before = snapshot(app.chat(), &who.principal, conversation).await.unwrap_or_else(|| json!({}));
        return match resume(&app, &who, conversation, &input.resume).await? {
            // The resumed run streams as a turn does: its reply token by token.
            Resuming::Started(resumed) => Ok(run.stream(resumed.log, app.chat().clone(), who.principal, before)),
            // No run started: a resume sent again after its run ended (the reply that run gave),
            // or one that leaves others of the pause undecided (the next one as the interrupt).
            Resuming::Answered(confirmed) => {
                let reply = confirmed.into_reply()?;
                let after = snapshot(app.chat(), &who.principal, conversation).await;
                Ok(run.resumed(reply, before, after))
            }
        };
    }
    let Some(last) = input.messages.last() else {
        return Err(ApiError::field(StatusCode::BAD_REQUEST, "messages", "no messages: the last is the person's"));
    };
    if last.role != "user" {
        return Err(ApiError::field(
            StatusCode::BAD_REQUEST,
            "messages",
            format!("the last message is the person's turn: role `user`, not `{}`", last.role),
        ));
    }
    turn.message = crate::openai::text_of(&last.content)?;
    if turn.conversation.is_none() {
        let earlier = users[..users.len() - 1].iter().copied();
        turn.conversation = recognised(&app, &who.principal, &agent, earlier).await?;
    }
    turn.validate()?;
    // The state the client starts from: the conversation's as its last turn left it.
    let before = match turn.conversation {
        Some(conversation) => snapshot(app.chat(), &who.principal, conversation).await,
        None => None,
    };
    let (_, log) = app.chat().start_turn(&who.principal, &turn).await?;
    Ok(run.stream(log, app.chat().clone(), who.principal, before.unwrap_or_else(|| json!({}))))
}

/// Each resume entry as the decision or answer it is, recorded in order through the same
/// decisions as every door's (exactly once); the run they resume, started, or the last one's
/// response. Every entry is read before the first is recorded: a resume is refused whole or
/// taken whole.
async fn resume(
    app: &AppState,
    who: &Asking,
    conversation: ConversationId,
    entries: &[ResumeEntry],
) -> Result<Resuming, ApiError> {
    let mut decided = Vec::with_capacity(entries.len());
    for entry in entries {
        let not_ours =
            || ApiError::field(StatusCode::BAD_REQUEST, "resume.interruptId", "not an interrupt of this service");
        let (question, id) =
            match (entry.interrupt_id.strip_prefix(APPROVAL), entry.interrupt_id.strip_prefix(QUESTION)) {
                (Some(id), _) => (false, id),
                (_, Some(id)) => (true, id),
                _ => return Err(not_ours()),
            };
        let message_id: MessageId = id.parse().map_err(|_| not_ours())?;
        // An approval: yes or no. A question: the answer, or declined when cancelled.
        let approval = match (question, &entry.payload, entry.status.as_str()) {
            (_, _, "cancelled") => Some(false),
            (false, Value::Bool(b), "resolved") => Some(*b),
            (false, Value::Object(o), "resolved") if o.get("approved").is_some_and(Value::is_boolean) => {
                o.get("approved").and_then(Value::as_bool)
            }
            (false, _, "resolved") => {
                return Err(ApiError::field(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "resume.payload",
                    "an approval's payload is {\"approved\": true|false}",
                ));
            }
            (true, _, "resolved") => None,
            (_, _, other) => {
                return Err(ApiError::field(
                    StatusCode::BAD_REQUEST,
                    "resume.status",
                    format!("`resolved` or `cancelled`, not `{other}`"),
                ));
            }
        };
        let decision = match approval {
            Some(true) => Decision::Approve,
            Some(false) => Decision::Reject,
            None => Decision::Answer(entry.payload.clone()),
        };
        decided.push((message_id, decision));
    }
    if decided.is_empty() {
        return Err(ApiError::field(StatusCode::BAD_REQUEST, "resume", "no entries"));
    }
    let how = Resumption::Streamed { node_events: false, metadata: None };
    Ok(app.chat().decide_all(&who.principal, conversation, decided, how).await?)
}

/// The ids every event of one run carries.
struct Run {
    thread_id: String,
    run_id: String,
}

/// Builds the events of one run in order: text messages opened and closed around tool calls.
struct Events {
    run: Run,
    /// The open text message, and how many there were.
    open: Option<String>,
    count: usize,
    pending: Vec<PendingAction>,
    /// The tool calls this run started: a result is shown only for one of them (a resumed run
    /// runs the calls an earlier run started, whose results that client never asked for).
    calls: std::collections::HashSet<String>,
}

impl Events {
    fn started(&self) -> Value {
        json!({ "type": "RUN_STARTED", "threadId": self.run.thread_id, "runId": self.run.run_id })
    }

    fn text(&mut self, delta: &str, out: &mut Vec<Value>) {
        if delta.is_empty() {
            return;
        }
        let id = match &self.open {
            Some(id) => id.clone(),
            None => {
                self.count += 1;
                let id = format!("{}-message-{}", self.run.run_id, self.count);
                out.push(json!({ "type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant" }));
                self.open = Some(id.clone());
                id
            }
        };
        out.push(json!({ "type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta }));
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.open.take() {
            out.push(json!({ "type": "TEXT_MESSAGE_END", "messageId": id }));
        }
    }

    /// The run's end: an interrupt for each action waiting, else success.
    fn finished(&mut self, result: Value, out: &mut Vec<Value>) {
        self.close(out);
        let outcome = if self.pending.is_empty() {
            json!({ "type": "success" })
        } else {
            let interrupts: Vec<Value> = self.pending.iter().map(interrupt).collect();
            json!({ "type": "interrupt", "interrupts": interrupts })
        };
        out.push(json!({
            "type": "RUN_FINISHED",
            "threadId": self.run.thread_id,
            "runId": self.run.run_id,
            "result": result,
            "outcome": outcome,
        }));
    }

    /// The events of one frame of the run.
    fn frame(&mut self, frame: Frame, out: &mut Vec<Value>) -> bool {
        match frame {
            Frame::Token { content } => self.text(&content, out),
            Frame::ToolCall { call_id, name, arguments } => {
                let parent = self.open.clone();
                self.close(out);
                self.calls.insert(call_id.clone());
                let mut start = json!({ "type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name });
                if let Some(parent) = parent {
                    start["parentMessageId"] = json!(parent);
                }
                out.push(start);
                out.push(json!({ "type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments.to_string() }));
                out.push(json!({ "type": "TOOL_CALL_END", "toolCallId": call_id }));
            }
            Frame::ToolResult { call_id, outcome, .. } if self.calls.contains(&call_id) => {
                out.push(json!({
                    "type": "TOOL_CALL_RESULT",
                    "messageId": format!("{call_id}-result"),
                    "toolCallId": call_id,
                    "content": outcome.to_string(),
                    "role": "tool",
                }));
            }
            Frame::Pending(p) => self.pending.push(p),
            Frame::Done { conversation_id, message_id } => {
                let result = json!({ "conversationId": conversation_id, "messageId": message_id });
                self.finished(result, out);
                return true;
            }
            Frame::Error { message } => {
                self.close(out);
                out.push(json!({ "type": "RUN_ERROR", "message": message }));
                return true;
            }
            _ => {}
        }
        false
    }
}

/// An approval's interrupt id: `approval-<the action's message id>`; a question's: `question-…`.
pub(crate) const APPROVAL: &str = "approval-";
pub(crate) const QUESTION: &str = "question-";

/// A waiting action as an AG-UI interrupt, its kind in its id; a question (`@ask`) carries its
/// form, an approval a yes/no.
fn interrupt(p: &PendingAction) -> Value {
    if p.tool_name == ASK {
        let schema = p.arguments.get("form").filter(|f| f.is_object()).cloned().unwrap_or(json!({ "type": "string" }));
        return json!({
            "id": format!("{QUESTION}{}", p.message_id),
            "reason": "question",
            "message": p.description,
            "responseSchema": schema,
        });
    }
    json!({
        "id": format!("{APPROVAL}{}", p.message_id),
        "reason": "tool_approval",
        "message": p.description,
        "responseSchema": {
            "type": "object",
            "properties": { "approved": { "type": "boolean" } },
            "required": ["approved"],
        },
        "metadata": { "tool": p.tool_name, "arguments": p.arguments },
    })
}

/// The channels of `conversation`'s last checkpoint: the state an AG-UI client shows. None when
/// it cannot be read (the run's events go on without it).
async fn snapshot(chat: &ChatService, who: &Principal, conversation: ConversationId) -> Option<Value> {
    let view = chat.head_checkpoint(who, conversation).await.ok()??;
    Some(channels(&view.at.state))
}

/// The channels run `run` left in `conversation`: its own last checkpoint's, not the head's —
/// the conversation is free for the next turn before this run's last event is read, and that
/// turn may have moved the head. None when it cannot be read.
async fn left_by(chat: &ChatService, who: &Principal, conversation: ConversationId, run: &str) -> Option<Value> {
    let history = chat.checkpoints(who, conversation).await.ok()?;
    let last = history.iter().rev().find(|c| c.run_id == run)?;
    let view = chat.checkpoint(who, conversation, last.seq).await.ok()?;
    Some(channels(&view.at.state))
}

/// A state's channels (a declared graph's), `{}` for an agent without.
fn channels(state: &Value) -> Value {
    state.get("channels").filter(|c| c.is_object()).cloned().unwrap_or_else(|| json!({}))
}

/// The channels `who`'s conversation holds at checkpoint `seq`; `None` (logged) when it cannot
/// be read — the stream goes on, and the end's delta says what changed.
async fn channels_at(chat: &ChatService, who: &Principal, conversation: ConversationId, seq: u64) -> Option<Value> {
    match chat.checkpoint(who, conversation, seq).await {
        Ok(view) => Some(channels(&view.at.state)),
        Err(e) => {
            tracing::warn!(conversation = conversation.0, seq, error = %e, "a node's channels could not be read");
            None
        }
    }
}

/// `before` changed into `after` as AG-UI's `STATE_DELTA` (a JSON Patch); none when nothing changed.
fn delta(before: &Value, after: &Value) -> Option<Value> {
    let patch = json_patch::diff(before, after);
    (!patch.0.is_empty()).then(|| json!({ "type": "STATE_DELTA", "delta": patch }))
}

fn sse(events: impl futures::Stream<Item = Value> + Send + 'static) -> Response {
    let events = events.map(|mut e| {
        // When each event was made, as AG-UI's optional `timestamp` (ms since the Unix epoch).
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        if let Some(fields) = e.as_object_mut() {
            fields.insert("timestamp".into(), json!(u64::try_from(now).unwrap_or(u64::MAX)));
        }
        crate::sse::SseEvent::data(&e.to_string())
    });
    crate::sse::response(events)
}

impl Run {
    /// A run of a turn of `who`: its frames as AG-UI events, the state shared as the client
    /// starts from it (`before`, a `STATE_SNAPSHOT` after `RUN_STARTED`) and what the run changed
    /// in it (a `STATE_DELTA` before `RUN_FINISHED`).
    fn stream(self, log: Arc<RunLog>, chat: ChatService, who: Principal, before: Value) -> Response {
        let events = Events { run: self, open: None, count: 0, pending: Vec::new(), calls: Default::default() };
        let first = [events.started(), json!({ "type": "STATE_SNAPSHOT", "snapshot": before })];
        let run_id: Arc<str> = log.run_id().into();
        let conversation = log.conversation;
        let frames = log.typed_frames();
        let body = futures::stream::unfold(
            (Box::pin(frames), events, chat, before, false),
            move |(mut frames, mut events, chat, mut before, ended)| {
                let run_id = Arc::clone(&run_id);
                async move {
                    if ended {
                        return None;
                    }
                    let frame = frames.next().await?;
                    let mut out = Vec::new();
                    // A node's channel writes, as they happen (the channels its checkpoint holds);
                    // the end's delta is from there.
                    if let Frame::StateUpdate { checkpoint, .. } = &frame
                        && let Some(now) = channels_at(&chat, &who, conversation, *checkpoint).await
                    {
                        // Between messages, never inside one (a node after the words may
                        // write them into a channel).
                        events.close(&mut out);
                        out.extend(delta(&before, &now));
                        before = now;
                    }
                    if let Frame::Done { conversation_id, .. } = &frame {
                        events.close(&mut out);
                        let after = left_by(&chat, &who, *conversation_id, &run_id).await;
                        out.extend(after.and_then(|after| delta(&before, &after)));
                    }
                    let ended = events.frame(frame, &mut out);
                    Some((out, (frames, events, chat, before, ended)))
                }
            },
        )
        .flat_map(futures::stream::iter);
        sse(futures::stream::iter(first).chain(body))
    }

    /// A resumed run: the reply the decisions led to, and a new interrupt if it paused again;
    /// the state shared as it was before the decisions (`before`) and what they changed.
    fn resumed(self, reply: ConfirmResponse, before: Value, after: Option<Value>) -> Response {
        let mut events = Events { run: self, open: None, count: 0, pending: Vec::new(), calls: Default::default() };
        let mut out = vec![events.started()];
        out.push(json!({ "type": "STATE_SNAPSHOT", "snapshot": before }));
        events.text(&reply.message, &mut out);
        events.close(&mut out);
        out.extend(after.and_then(|after| delta(&before, &after)));
        events.pending.extend(reply.pending_action);
        events.finished(json!({ "conversationId": reply.conversation_id }), &mut out);
        sse(futures::stream::iter(out))
    }
}
