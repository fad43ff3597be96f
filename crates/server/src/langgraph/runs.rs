//! LangGraph's runs on a thread (docs/langgraph.md, "Runs"): `POST /threads/{id}/runs/stream`
//! streams a turn in LangGraph's stream modes (`values`, `updates`, `messages-tuple`);
//! `/runs/wait` answers its final values. A write waiting for approval (or an `ask` node's
//! question) is the thread's `__interrupt__`, which a run with `command: {resume}` decides —
//! exactly once, through the same confirm and answer as the academy contract.
//!
//! Owns: reading a run's input and command, and writing its frames as LangGraph's events. The
//! turns are the [`ChatService`]'s.

use super::threads::{Asker, Now, ai_message, interrupt, now, task_id, theirs, tool_call, tool_message};
use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ChatError};
use crate::extract::{Asking, json_body};
use crate::openapi::{LANGGRAPH, Refusals, Run};
use crate::service::{Confirmed, NewTurn, Resuming, Resumption};
use crate::sse::SseEvent;
use crate::wire::PendingActionDto;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgraph_conversations::Thread;
use toolgraph_graph::{Decision, RecordedRun, RunEnd};
use toolgraph_protocol::{ConversationId, Frame, MessageId, RunId};

/// The stream modes served; others are refused by name.
pub(crate) const MODES: [&str; 7] = ["values", "updates", "messages-tuple", "custom", "debug", "tasks", "checkpoints"];

/// The modes a join streams when it names none.
const JOINED: [&str; 3] = ["values", "updates", "messages-tuple"];

/// What a run reads; the rest of LangGraph's run options (`config`, `context`, `metadata`,
/// `interrupt_before`, …) is accepted and not used.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({"assistant_id": "assistant", "input": {"messages": [{"type": "human", "content": "What is 12 * 7?"}]}, "stream_mode": ["values", "messages-tuple"]}))]
struct RunCreate {
    assistant_id: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    command: Option<Command>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::StreamModes>)]
    stream_mode: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::OnCompletion>)]
    on_completion: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::MultitaskStrategy>)]
    multitask_strategy: Option<String>,
    /// Run from this checkpoint of the thread: its last, or an earlier one (the thread forks
    /// there first, and goes on in the fork).
    #[serde(default)]
    checkpoint_id: Option<String>,
    /// The same, as LangGraph's `{checkpoint_id}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    checkpoint: Option<Value>,
    /// Whether the events of an agent a hand-off runs come in its namespace
    /// (`updates|billing:<task>`), as a sub-graph's do (docs/langgraph.md, "Sub-graphs").
    #[serde(default)]
    stream_subgraphs: bool,
    /// Where naming an earlier checkpoint moved the thread, to undo if the run is refused.
    #[serde(skip)]
    moved: Option<super::threads::Moved>,
}

/// What a run does when another run holds its thread's conversation (`multitask_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Multitask {
    /// Refused: 409 (the default, as on every door).
    Reject,
    /// The run in progress is cancelled (as `runs.cancel` does), then this one starts.
    Interrupt,
    /// This one starts once the run in progress has ended.
    Enqueue,
    /// The run in progress is cancelled and rolled back (what it wrote in the thread goes),
    /// then this one starts.
    Rollback,
}

/// Longest an `enqueue`d run waits for the run in progress to end before it is refused (409):
/// under the 300 s LangGraph's SDKs wait for an answer, so the client sees the refusal.
const ENQUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(240);

/// Longest `join` waits for a run's end before answering 504 (join again): under the SDKs'
/// 300 s, and bounded when the shared store cannot be read.
const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(240);

/// How long an `interrupt` looks for the run in progress here before taking it for another
/// replica's: a run holds its conversation a moment before its log exists.
const LOOK_FOR_RUN: std::time::Duration = std::time::Duration::from_secs(1);

impl Multitask {
    /// Its name in LangGraph's API.
    fn name(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::Interrupt => "interrupt",
            Self::Enqueue => "enqueue",
            Self::Rollback => "rollback",
        }
    }
}

impl RunCreate {
    /// The `multitask_strategy` asked for (`reject` when none).
    fn multitask(&self) -> Result<Multitask, ApiError> {
        match self.multitask_strategy.as_deref() {
            None | Some("reject") => Ok(Multitask::Reject),
            Some("interrupt") => Ok(Multitask::Interrupt),
            Some("enqueue") => Ok(Multitask::Enqueue),
            Some("rollback") => Ok(Multitask::Rollback),
            Some(other) => Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "multitask_strategy",
                format!("`{other}` is not a strategy: reject, interrupt, rollback or enqueue"),
            )),
        }
    }

    /// The stream modes asked for, and whether sub-graphs' events are namespaced.
    fn modes(&self) -> Result<Modes, ApiError> {
        Ok(Modes { subgraphs: self.stream_subgraphs, ..modes(self.stream_mode.as_ref())? })
    }

    /// How decisions this request carries resume `thread`'s run: streamed into its log (with
    /// node frames when its modes need them), its first checkpoint saying what [`start`]'s
    /// does of a turn.
    fn resumption(&self, thread: &Thread) -> Result<Resumption, ApiError> {
        let metadata = said(&self.assistant_id, self.multitask()?, &thread.id);
        Ok(Resumption::Streamed { node_events: self.modes()?.node_events(), metadata })
    }

    /// Sets what this request asked of the run it resumed on the run's log.
    fn mark_resumed(&self, log: &crate::runlog::RunLog) {
        if self.stream_subgraphs {
            log.set_subgraphs();
        }
        if let Ok(strategy) = self.multitask() {
            log.set_multitask(strategy.name());
        }
    }

    /// Whether a stateless run's thread goes when the run ends (`on_completion`, `delete` unless
    /// `keep`).
    fn ephemeral(&self) -> bool {
        self.on_completion.as_deref() != Some("keep")
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = RunCommand)]
struct Command {
    #[serde(default)]
    resume: Option<Value>,
}

/// The stream modes asked for (`values` when none).
#[derive(Debug, Clone, Copy)]
struct Modes {
    values: bool,
    updates: bool,
    messages: bool,
    custom: bool,
    debug: bool,
    tasks: bool,
    checkpoints: bool,
    /// Whether the events of a handed-over agent's nodes are namespaced (`stream_subgraphs`).
    subgraphs: bool,
}

impl Modes {
    /// Whether they are written from the run's nodes' events.
    fn of_nodes(self) -> bool {
        self.custom || self.debug || self.tasks || self.checkpoints
    }

    /// Whether the run logs its nodes' events: for the modes written from them, and for the
    /// namespace of each event (which node it came from).
    fn node_events(self) -> bool {
        self.of_nodes() || self.subgraphs
    }

    /// Whether checkpoints are written (`checkpoints`, or inside `debug`).
    fn checkpointed(self) -> bool {
        self.debug || self.checkpoints
    }
}

fn modes(asked: Option<&Value>) -> Result<Modes, ApiError> {
    let names: Vec<&str> = match asked {
        None | Some(Value::Null) => vec!["values"],
        Some(Value::String(m)) => vec![m.as_str()],
        Some(Value::Array(ms)) if ms.iter().all(Value::is_string) => ms.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "stream_mode", "a mode or a list of modes"));
        }
    };
    if let Some(other) = names.iter().find(|m| !MODES.contains(m)) {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "stream_mode",
            format!("`{other}` is not served: {}", MODES.join(", ")),
        ));
    }
    let has = |m: &str| names.contains(&m);
    Ok(Modes {
        values: has("values"),
        updates: has("updates"),
        messages: has("messages-tuple"),
        custom: has("custom"),
        debug: has("debug"),
        tasks: has("tasks"),
        checkpoints: has("checkpoints"),
        subgraphs: false,
    })
}

/// What one run does: a person's message, or decisions on what the thread waits for.
enum Asked {
    Message(String),
    Resume(Value),
}

fn asked(run: &RunCreate) -> Result<Asked, ApiError> {
    match (&run.input, run.command.as_ref().and_then(|c| c.resume.as_ref())) {
        (Some(input), None) if !input.is_null() => {
            let messages = input.get("messages").and_then(Value::as_array).ok_or_else(|| {
                ApiError::field(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "input.messages",
                    "a list of messages, the person's last",
                )
            })?;
            let last = messages.last().ok_or_else(|| {
                ApiError::field(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "input.messages",
                    "no messages: the last is the person's",
                )
            })?;
            let kind = last.get("type").or_else(|| last.get("role")).and_then(Value::as_str).unwrap_or("");
            if !matches!(kind, "human" | "user") {
                return Err(ApiError::field(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "input.messages",
                    format!("the last message is the person's: type `human`, not `{kind}`"),
                ));
            }
            Ok(Asked::Message(crate::openai::text_of(&last["content"])?))
        }
        (_, Some(resume)) => Ok(Asked::Resume(resume.clone())),
        _ => Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "input",
            "`input` with the person's message, or `command.resume` with the decisions",
        )),
    }
}

/// `POST /threads/{thread_id}/runs/stream`.
#[utoipa::path(post, path = "/threads/{thread_id}/runs/stream", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")), request_body = RunCreate,
    responses((status = 200, description = "The run's events in the modes asked for.", content_type = "text/event-stream", body = crate::openapi::SseEvent), Refusals))]
pub(crate) async fn stream(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (who, thread, run) = prepare(&app, who, Some(&id), &body).await?;
    streamed(app, who, thread, run, false).await
}

/// `POST /runs/stream`: a run on a thread of its own, deleted when the run ends unless it
/// paused (its `thread_id` is in the `metadata` event) or `on_completion` is `keep`.
#[utoipa::path(post, path = "/runs/stream", tag = LANGGRAPH, request_body = RunCreate,
    responses((status = 200, description = "The run's events, on a thread of its own.", content_type = "text/event-stream", body = crate::openapi::SseEvent), Refusals))]
pub(crate) async fn stream_stateless(
    State(app): State<AppState>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (who, thread, run) = prepare(&app, who, None, &body).await?;
    let ephemeral = run.ephemeral();
    streamed(app, who, thread, run, ephemeral).await
}

/// `POST /runs/wait`: as [`stream_stateless`], answering the final values.
#[utoipa::path(post, path = "/runs/wait", tag = LANGGRAPH, request_body = RunCreate,
    responses((status = 200, description = "The run's final values.", body = Object), Refusals))]
pub(crate) async fn wait_stateless(
    State(app): State<AppState>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (who, thread, run) = prepare(&app, who, None, &body).await?;
    let ephemeral = run.ephemeral();
    waited(app, who, thread, run, ephemeral).await
}

/// Deletes `thread` when it is `ephemeral` and `waits` for nothing.
async fn finished(chat: &crate::service::ChatService, who: &Asking, thread: &Thread, waits: bool, ephemeral: bool) {
    if ephemeral
        && !waits
        && let Err(e) = chat.delete_thread(&who.principal, &thread.id).await
    {
        tracing::warn!(thread = %thread.id, error = %e, "a stateless run's thread could not be deleted");
    }
}

/// A run on `thread` streamed as LangGraph's events; its thread deleted after when `ephemeral`.
async fn streamed(
    app: AppState,
    who: Asking,
    mut thread: Thread,
    mut run: RunCreate,
    ephemeral: bool,
) -> Result<Response, ApiError> {
    let modes = run.modes()?;
    // The state before the run, for its first values (read only when they are asked for).
    let before = if modes.values { Some(now(app.chat(), &who, &thread).await?.values) } else { None };
    match asked(&run)? {
        Asked::Resume(resume) => {
            let how = run.resumption(&thread)?;
            let confirmed = match resume_thread(&app, &who, &thread, &resume, how).await? {
                // The resumed run streams as a turn does, from the paused state on.
                Resuming::Started(resumed) => {
                    run.mark_resumed(&resumed.log);
                    let run_id = resumed.log.run_id().to_owned();
                    let writer = Writer::new(modes, run_id.clone(), &thread, before)
                        .starting_at(handing_starts(&app, &who, &thread, modes).await);
                    return Ok(stream_of(app, who, thread, writer, (run_id, resumed.log), ephemeral));
                }
                Resuming::Answered(confirmed) => confirmed,
            };
            // Decided already (the same decisions again): what the run they resumed answered.
            let reply = confirmed.into_reply()?;
            let after = now(app.chat(), &who, &thread).await?;
            let run_id = uuid::Uuid::new_v4().to_string();
            let mut events =
                vec![event("metadata", &json!({ "run_id": run_id, "thread_id": thread.id, "attempt": 1 }))];
            let ai = ai_message(&reply.message, &format!("run-{run_id}"), Vec::new());
            if modes.messages && !reply.message.is_empty() {
                events.push(event("messages", &json!([ai.clone(), { "langgraph_node": "agent", "run_id": run_id }])));
            }
            if modes.updates && !reply.message.is_empty() {
                events.push(event("updates", &json!({ "agent": { "messages": [ai] } })));
            }
            events.extend(ending(&modes, &after, &Ended { thread: &thread.id, checkpointed: false, sent: None }));
            Ok(crate::sse::response(futures::stream::iter(events.into_iter().map(|e| e.sent(None)))))
        }
        Asked::Message(message) => {
            // The values so far, after each step as LangGraph sends them: the person's message
            // first, then the model's calls and the tools' results as they come.
            let so_far = before.map(|mut values| {
                let n = values["messages"].as_array().map_or(0, Vec::len);
                let human = super::threads::human_message(&message, &format!("{}-{n}", thread.id));
                if let Some(messages) = values["messages"].as_array_mut() {
                    messages.push(human);
                }
                values
            });
            let started = begin(&app, &who, &mut thread, &mut run, message, ephemeral).await?;
            let writer = Writer::new(modes, started.0.clone(), &thread, so_far);
            Ok(stream_of(app, who, thread, writer, started, ephemeral))
        }
    }
}

/// The started run `run_id` on `thread` streamed from its log `log` as LangGraph's events by
/// `writer`: its metadata, the values it starts from (the writer's, when they are asked for),
/// then its frames.
fn stream_of(
    app: AppState,
    who: Asking,
    thread: Thread,
    writer: Writer,
    (run_id, log): (String, std::sync::Arc<crate::runlog::RunLog>),
    ephemeral: bool,
) -> Response {
    let mut first = vec![event("metadata", &json!({ "run_id": run_id, "thread_id": thread.id, "attempt": 1 }))];
    if let Some(values) = &writer.so_far {
        first.push(event("values", values));
    }
    let location = format!("/threads/{}/runs/{run_id}/stream", thread.id);
    let (thread_id, run) = (thread.id.clone(), run_id.clone());
    let frames = log.frames_after(0);
    let frames = events_of(frames, app.chat().clone(), who, thread, writer, ephemeral);
    let first = first.into_iter().map(|e| e.sent(None));
    let mut response = crate::sse::response(futures::stream::iter(first).chain(frames));
    // Where LangGraph's SDKs rejoin the run after a dropped connection (with the
    // `Last-Event-ID` each frame's events carry).
    if let Ok(location) = axum::http::HeaderValue::from_str(&location) {
        response.headers_mut().insert(axum::http::header::LOCATION, location);
    }
    created_at(&mut response, &thread_id, &run);
    response
}

/// A run's frames (from its log, here or another replica's) as LangGraph's events, each with
/// its frame's number as the event id; the run's last events need the state it left, and a
/// stateless (`ephemeral`) run's thread is deleted after.
fn events_of(
    frames: impl futures::Stream<Item = crate::runlog::Frame> + Send + 'static,
    chat: crate::service::ChatService,
    who: Asking,
    thread: Thread,
    writer: Writer,
    ephemeral: bool,
) -> impl futures::Stream<Item = SseEvent> + Send + 'static {
    // Shared by every frame's future: the run's end and its nodes' events read the store. The
    // frames are written one after another (each future ends before the next frame is read),
    // and no lock is held across a read.
    let run = std::sync::Arc::new((chat, who, thread));
    let writer = std::sync::Arc::new(std::sync::Mutex::new(writer));
    frames.flat_map(move |frame| {
        let run = std::sync::Arc::clone(&run);
        let writer = std::sync::Arc::clone(&writer);
        let id = frame.seq.to_string();
        futures::stream::once(async move {
            let (chat, who, thread) = &*run;
            let write = |f: &mut dyn FnMut(&mut Writer) -> Vec<Event>| match writer.lock() {
                Ok(mut w) => f(&mut w),
                // A panic while writing a frame ended this stream's writer: nothing more.
                Err(_) => Vec::new(),
            };
            let step = match Frame::parse(&frame.event, &frame.data) {
                Ok(frame) => match writer.lock() {
                    Ok(mut w) => w.frame(frame),
                    Err(_) => Step::Events(Vec::new()),
                },
                Err(_) => Step::Events(Vec::new()),
            };
            let events = match step {
                Step::Events(events) => events,
                Step::Started { node, step, from, known } => {
                    let at = if known { None } else { values_at(chat, who, thread, from).await };
                    write(&mut |w| w.started(&node, step, from, at.clone()))
                }
                Step::Finished { node, seq, next, known, handed_at } => {
                    let before = if known || seq == 0 { None } else { values_at(chat, who, thread, seq - 1).await };
                    let handed = match handed_at {
                        Some(from) => values_at(chat, who, thread, from).await,
                        None => None,
                    };
                    match values_at(chat, who, thread, seq).await {
                        Some(at) => write(&mut |w| {
                            w.handed_from(&node, handed.clone());
                            w.finished(&node, seq, next.clone(), before.clone(), at.clone())
                        }),
                        None => Vec::new(),
                    }
                }
                Step::Wrote(mut events, seq, ns) => {
                    let at = values_at(chat, who, thread, seq).await;
                    events.extend(write(&mut |w| w.values_after(at.clone(), &ns)));
                    events
                }
                // Only the values, an update's interrupts and a stateless thread's end need the
                // state the run left: a client of `messages-tuple` alone does not wait for it.
                Step::End(events, f)
                    if !f.modes.values && !f.modes.updates && !f.modes.checkpointed() && !ephemeral =>
                {
                    events
                }
                Step::End(mut events, f) => match now(chat, who, thread).await {
                    Ok(after) => {
                        finished(chat, who, thread, !after.awaiting.is_empty(), ephemeral).await;
                        let ended = Ended { thread: &thread.id, checkpointed: f.checkpointed, sent: f.sent.as_ref() };
                        events.extend(ending(&f.modes, &after, &ended));
                        events
                    }
                    Err(e) => {
                        events.push(event("error", &json!({ "error": "StateUnavailable", "message": e.message })));
                        events
                    }
                },
                Step::Failed(events) => {
                    finished(chat, who, thread, false, ephemeral).await;
                    events
                }
            };
            events.into_iter().map(|e| e.sent(Some(&id))).collect::<Vec<_>>()
        })
        .flat_map(futures::stream::iter)
    })
}

/// The values of `thread`'s checkpoint `seq` as LangGraph shows them, and whether it waits for
/// a decision; `None` (logged) when it cannot be read — the stream goes on without its node's
/// events.
async fn values_at(chat: &crate::service::ChatService, who: &Asking, thread: &Thread, seq: u64) -> Option<Checkpoint> {
    let conversation = ConversationId(thread.conversation?);
    match chat.checkpoint(&who.principal, conversation, seq).await {
        Ok(view) => {
            let waits = view.at.undecided();
            Some(Checkpoint { seq, values: super::threads::shown(&thread.id, view.at.state), waits })
        }
        Err(e) => {
            tracing::warn!(thread = %thread.id, seq, error = %e, "a streamed checkpoint could not be read");
            None
        }
    }
}

/// Each start of `thread`'s handing nodes (a node name that prefixes another's) in its
/// checkpoints — the checkpoint that had the node next —, oldest first, when sub-graphs are
/// namespaced: a resumed run or a join begins inside a handed-over agent whose handing node
/// began before its frames, and the namespace's task id is that node's (docs/langgraph.md,
/// "Sub-graphs"). Empty without namespaces, or when the history cannot be read (the
/// namespace then goes by the checkpoint before the agent's first node in the frames).
async fn handing_starts(app: &AppState, who: &Asking, thread: &Thread, modes: Modes) -> Vec<(String, u64)> {
    let Some(conversation) = thread.conversation.filter(|_| modes.subgraphs) else { return Vec::new() };
    match app.chat().checkpoints(&who.principal, ConversationId(conversation)).await {
        Ok(history) => {
            let started: Vec<(String, u64)> = history.into_iter().filter_map(|c| Some((c.next?, c.seq))).collect();
            // `billing/intent` makes `billing` a handing node.
            let handing: std::collections::HashSet<&str> =
                started.iter().flat_map(|(n, _)| n.match_indices('/').map(|(at, _)| &n[..at])).collect();
            started.iter().filter(|(n, _)| handing.contains(n.as_str())).cloned().collect()
        }
        Err(e) => {
            tracing::debug!(thread = %thread.id, error = %e, "no checkpoint history for sub-graph namespaces");
            Vec::new()
        }
    }
}

/// A checkpoint of the thread as a run's node events show it.
#[derive(Clone)]
struct Checkpoint {
    seq: u64,
    /// Its values, as LangGraph shows them.
    values: Value,
    /// Whether it is a pause that waits for a decision.
    waits: bool,
}

/// The run `run_id` of `who`'s `thread`: its frames after `after`, here or on another replica;
/// 404 when it is not a run of theirs on this thread.
async fn run_frames(
    app: &AppState,
    who: &Asking,
    thread: &Thread,
    run_id: &str,
    after: u64,
) -> Result<futures::stream::BoxStream<'static, crate::runlog::Frame>, ApiError> {
    let gone = || {
        ApiError::field(StatusCode::NOT_FOUND, "run_id", format!("no run '{}' on this thread", super::echoed(run_id)))
    };
    let found = app.chat().run_frames(&RunId::from(run_id), &who.principal, after).await;
    match found.map_err(ApiError::run_events_unavailable)?.ok_or_else(gone)? {
        // Here or on another replica, a run of another of their threads is not this one's.
        (conversation, _) if conversation.is_none() || thread.conversation != conversation.map(i64::from) => {
            Err(gone())
        }
        (_, frames) => Ok(frames),
    }
}

/// `GET /threads/{thread_id}/runs/{run_id}/stream`: a run's events again — from its first frame,
/// or after the one `Last-Event-ID` names — on any replica, in the modes `stream_mode` names
/// (repeated; `values`, `updates` and `messages-tuple` when none), sub-graphs namespaced when the
/// run was started so here (`stream_subgraphs`) or `stream_subgraphs=true` asks.
#[utoipa::path(get, path = "/threads/{thread_id}/runs/{run_id}/stream", tag = LANGGRAPH,
    params(("thread_id" = String, Path, description = "The thread."), ("run_id" = String, Path, description = "The run."), ("stream_mode" = Option<String>, Query, description = "A mode (repeat for more)."),
        ("stream_subgraphs" = Option<bool>, Query, description = "Namespace a handed-over agent's events (as the run asked, when it started on this replica)."),
        ("Last-Event-ID" = Option<String>, Header, description = "The last event read: the stream goes on after it.")),
    responses((status = 200, description = "The run's events.", content_type = "text/event-stream", body = crate::openapi::SseEvent), Refusals))]
pub(crate) async fn join(
    State(app): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    Asker(who): Asker,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let query: Vec<(&str, &str)> = uri.query().unwrap_or("").split('&').filter_map(|p| p.split_once('=')).collect();
    let asked: Vec<Value> = query
        .iter()
        .filter(|(k, v)| *k == "stream_mode" && !v.is_empty())
        .map(|(_, v)| Value::String((*v).to_owned()))
        .collect();
    let asked = if asked.is_empty() { json!(JOINED) } else { Value::Array(asked) };
    // Namespaced as the run was asked for, when its log is here; else as the join asks.
    let subgraphs = query.iter().any(|(k, v)| *k == "stream_subgraphs" && *v == "true")
        || app.chat().run_log(&RunId::from(run_id.as_str()), &who.principal).is_some_and(|log| log.subgraphs());
    let modes = Modes { subgraphs, ..modes(Some(&asked))? };
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let frames = run_frames(&app, &who, &thread, &run_id, after).await?;
    // A client that joins again gets the values at the run's end (what it missed is not kept).
    let writer =
        Writer::new(modes, run_id, &thread, None).starting_at(handing_starts(&app, &who, &thread, modes).await);
    let events = events_of(frames, app.chat().clone(), who, thread, writer, false);
    Ok(crate::sse::response(events))
}

/// Longest a cancel with `wait=1` waits for the run to end.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `POST /threads/{thread_id}/runs/{run_id}/cancel?wait=0|1&action=interrupt|rollback`: stops a
/// run this replica is running — it ends within its step or model call, as cancelled (an
/// `error` event "the run was cancelled"; the thread is idle again, what its finished steps
/// wrote stays). 204 (`wait=1`: once it has ended; 202 when it has not within 30 s); a run that
/// has ended already is left as it is (204); 404 for no such run of theirs on this thread here.
/// `action=rollback` also takes back what the run wrote in the thread once it has ended (it
/// waits for that, within 30 s: else 409), and the run is gone (404 after): the thread's last
/// run only (409 for an earlier one), here or on another replica once ended.
#[utoipa::path(post, path = "/threads/{thread_id}/runs/{run_id}/cancel", tag = LANGGRAPH,
    params(("thread_id" = String, Path, description = "The thread."), ("run_id" = String, Path, description = "The run."), ("wait" = Option<bool>, Query, description = "Answer once it has ended."),
        ("action" = Option<String>, Query, description = "`interrupt` (the default) or `rollback`.")),
    responses((status = 204, description = "Cancelled (rolled back), or ended already."),
        (status = 202, description = "`wait`: it has not ended within 30 s."), Refusals))]
pub(crate) async fn cancel(
    State(app): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    Asker(who): Asker,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let (mut wait, mut action) = (false, "interrupt".to_owned());
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*key {
            "wait" => wait = ["1", "true", "yes"].iter().any(|w| value.eq_ignore_ascii_case(w)),
            "action" => action = value.into_owned(),
            _ => {}
        }
    }
    let rollback = match action.as_str() {
        "interrupt" => false,
        "rollback" => true,
        other => {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "action",
                format!("`{other}` is not a cancel action (interrupt or rollback)"),
            ));
        }
    };
    let gone = || {
        let why = format!("no run '{}' of this thread is running on this server", super::echoed(&run_id));
        ApiError::field(StatusCode::NOT_FOUND, "run_id", why)
    };
    let run = RunId::from(run_id.as_str());
    let log = app.chat().run_log(&run, &who.principal);
    if rollback {
        let conversation = thread.conversation.map(ConversationId).ok_or_else(gone)?;
        if let Some(log) = log.filter(|l| l.conversation == conversation) {
            log.cancel();
            if !log.ended(CANCEL_WAIT).await {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "the run did not end within 30 s of its cancel; roll it back once it has",
                ));
            }
        }
        return match app.chat().roll_back(&who.principal, conversation, &run).await {
            Ok(_) => Ok(StatusCode::NO_CONTENT.into_response()),
            Err(ChatError::NotFound) => Err(ApiError::field(
                StatusCode::NOT_FOUND,
                "run_id",
                format!("run '{}' wrote nothing in this thread", super::echoed(&run_id)),
            )),
            Err(e) => Err(e.into()),
        };
    }
    let log = log.ok_or_else(gone)?;
    if thread.conversation != Some(log.conversation.0) {
        return Err(gone());
    }
    log.cancel();
    if wait && !log.ended(CANCEL_WAIT).await {
        tracing::warn!(run = %run_id, "a cancelled run had not ended after 30 s");
        return Ok(StatusCode::ACCEPTED.into_response());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /threads/{thread_id}/runs/{run_id}`: the run as LangGraph's `Run` (`status`: running,
/// then success, interrupted — paused for a decision, or cancelled — or error), on any replica
/// and however long ago it ran: this replica's log of it while it keeps one, else what the
/// thread's checkpoints record of it.
#[utoipa::path(get, path = "/threads/{thread_id}/runs/{run_id}", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread."), ("run_id" = String, Path, description = "The run.")),
    responses((status = 200, description = "The run.", body = Run), Refusals))]
pub(crate) async fn get(
    State(app): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    Asker(who): Asker,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let gone = || {
        ApiError::field(StatusCode::NOT_FOUND, "run_id", format!("no run '{}' on this thread", super::echoed(&run_id)))
    };
    // A log of another conversation's run: another thread's, or one this thread moved away
    // from (a fork from an earlier checkpoint), which its checkpoints still hold.
    let log = app
        .chat()
        .run_log(&RunId::from(run_id.as_str()), &who.principal)
        .filter(|log| thread.conversation == Some(log.conversation.0));
    // A running log says all there is; an ended one, with the records of how the run ended.
    if let Some(log) = log.as_ref().filter(|log| !log.outcome().0) {
        return Ok(axum::Json(run_shape(&thread, log, None)).into_response());
    }
    let recorded = recorded(&app, &who, &thread, log.is_some()).await?;
    let found = recorded.find(&run_id);
    match (log, found) {
        (Some(log), found) => Ok(axum::Json(run_shape(&thread, &log, found.map(|(run, _)| run))).into_response()),
        (None, Some(run)) => Ok(axum::Json(recorded.shape(&thread, run)).into_response()),
        (None, None) => Err(gone()),
    }
}

/// A run as LangGraph's `Run`, from this replica's log of it; `recorded`: what the thread's
/// checkpoints say of it, which tells whether the thread's pause is still this run's.
fn run_shape(thread: &Thread, log: &crate::runlog::RunLog, recorded: Option<&RecordedRun>) -> Value {
    let ended = recorded.map(|r| &r.end);
    let status = match log.outcome() {
        (false, _) => "running",
        // As the records say it on every other replica (and here once the log is gone): a
        // cancelled run — by a client, or by a shutdown — and one stopped early (the
        // recursion limit: its log ends on the fallback reply).
        (true, _) if ended == Some(&RunEnd::Cancelled) => "interrupted",
        (true, _) if matches!(ended, Some(RunEnd::Failed(_))) => "error",
        // Stopped by a client's cancel (`action=interrupt`), as LangGraph names it.
        (true, true) if log.cancelled() => "interrupted",
        (true, true) => "error",
        (true, _) if ended == Some(&RunEnd::Paused { waiting: true }) => "interrupted",
        (true, _) => "success",
    };
    shape_of(thread, log.run_id(), &log.agent, status, log.multitask(), log.created_ms, log.created_ms)
}

/// LangGraph's `Run` of these fields.
fn shape_of(
    thread: &Thread,
    run_id: &str,
    assistant: &str,
    status: &str,
    multitask: &str,
    created_ms: i64,
    updated_ms: i64,
) -> Value {
    json!({
        "run_id": run_id,
        "thread_id": thread.id,
        "assistant_id": assistant,
        "status": status,
        "metadata": {},
        "multitask_strategy": multitask,
        "created_at": super::threads::rfc3339(created_ms),
        "updated_at": super::threads::rfc3339(updated_ms),
    })
}

/// What a run started on this door writes of itself in its first checkpoint (see [`start`]),
/// read back on any replica.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RunMetadata {
    assistant_id: Option<String>,
    multitask_strategy: Option<String>,
    thread_id: Option<String>,
}

impl RunMetadata {
    fn of(run: &RecordedRun) -> Self {
        run.metadata.as_ref().and_then(|m| serde_json::from_str(m.get()).ok()).unwrap_or_default()
    }
}

/// The runs a thread's checkpoints record (those of its conversation's that are the thread's
/// own), each with what it said of itself, and the conversation's agent.
struct RecordedRuns {
    agent: String,
    runs: Vec<(RecordedRun, RunMetadata)>,
}

impl RecordedRuns {
    /// The run `run_id`, if the records hold it.
    fn find(&self, run_id: &str) -> Option<&(RecordedRun, RunMetadata)> {
        self.runs.iter().find(|(run, _)| run.run_id == run_id)
    }

    /// `run` as LangGraph's `Run`.
    fn shape(&self, thread: &Thread, (run, said): &(RecordedRun, RunMetadata)) -> Value {
        let status = match &run.end {
            RunEnd::Running => "running",
            RunEnd::Finished | RunEnd::Paused { waiting: false } => "success",
            RunEnd::Paused { waiting: true } | RunEnd::Cancelled => "interrupted",
            RunEnd::Failed(_) => "error",
        };
        let assistant = said.assistant_id.as_deref().unwrap_or(&self.agent);
        let multitask = said.multitask_strategy.as_deref().unwrap_or(Multitask::Reject.name());
        shape_of(thread, &run.run_id, assistant, status, multitask, run.started_at_ms, run.updated_at_ms)
    }
}

/// What `thread`'s checkpoints record of its runs, oldest first. A copy of another thread holds
/// that thread's checkpoints: the runs that name another thread, or that name none (a resume)
/// and began before this thread was made, are not this thread's. When the records cannot be
/// read, `logs_say_enough` (this replica's logs answer) makes that no error: none are read.
async fn recorded(
    app: &AppState,
    who: &Asking,
    thread: &Thread,
    logs_say_enough: bool,
) -> Result<RecordedRuns, ApiError> {
    let none = || RecordedRuns { agent: String::new(), runs: Vec::new() };
    let Some(conversation) = thread.conversation else { return Ok(none()) };
    let (agent, runs) = match app.chat().recorded_runs(&who.principal, ConversationId(conversation)).await {
        Ok(found) => found,
        // Deleted on the academy routes: the thread's runs went with it.
        Err(ChatError::NotFound) => return Ok(none()),
        Err(e) if logs_say_enough => {
            tracing::warn!(thread = %thread.id, error = %e, "the thread's recorded runs cannot be read; answering from this replica's logs");
            return Ok(none());
        }
        Err(e) => return Err(e.into()),
    };
    let runs = runs
        .into_iter()
        .map(|run| {
            let said = RunMetadata::of(&run);
            (run, said)
        })
        .filter(|(run, said)| match &said.thread_id {
            Some(named) => *named == thread.id,
            None => run.started_at_ms >= thread.created_at_ms,
        })
        .collect();
    Ok(RecordedRuns { agent, runs })
}

/// `POST /threads/{thread_id}/runs`: a run started in the background — answered at once with
/// the run (`status: running`), which goes on whether or not anyone reads it; `runs.join`
/// waits for its end, `runs.join_stream` reads its events. A `command.resume` starts the resumed
/// run here the same way (409 for decisions applied already).
#[utoipa::path(post, path = "/threads/{thread_id}/runs", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")), request_body = RunCreate,
    responses((status = 200, description = "The run, started in the background.", body = Run), Refusals))]
pub(crate) async fn create(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    background(app, who, Some(&id), &body).await
}

/// A run in the background on thread `id` (or, without one, a thread of its own deleted once
/// the run ends, unless it paused or `on_completion` is `keep`), answered at once.
async fn background(app: AppState, who: Asking, id: Option<&str>, body: &Bytes) -> Result<Response, ApiError> {
    let (who, mut thread, mut run) = prepare(&app, who, id, body).await?;
    let message = match asked(&run)? {
        Asked::Message(message) => message,
        // The resumed run goes on in the background as any other: joined, waited for, listed.
        Asked::Resume(resume) => {
            return match resume_thread(&app, &who, &thread, &resume, run.resumption(&thread)?).await? {
                Resuming::Started(resumed) => {
                    run.mark_resumed(&resumed.log);
                    let mut response = axum::Json(run_shape(&thread, &resumed.log, None)).into_response();
                    created_at(&mut response, &thread.id, resumed.log.run_id());
                    Ok(response)
                }
                // The same decisions again: the run they resumed is the one to read.
                Resuming::Answered(Confirmed::Saved(_)) => Err(ApiError::field(
                    StatusCode::CONFLICT,
                    "command.resume",
                    "these decisions were applied already: the run they resumed has its outcome",
                )),
                // Some of the actions waiting, by interrupt id: kept, and no run yet.
                Resuming::Answered(Confirmed::Reply(_)) => Err(ApiError::field(
                    StatusCode::CONFLICT,
                    "command.resume",
                    "recorded; the thread still waits for its other decisions and resumes once they are in",
                )),
            };
        }
    };
    // Only a stateless run's own thread goes when it ends.
    let ephemeral = id.is_none() && run.ephemeral();
    let (run_id, log) = begin(&app, &who, &mut thread, &mut run, message, ephemeral).await?;
    let mut response = axum::Json(run_shape(&thread, &log, None)).into_response();
    created_at(&mut response, &thread.id, &run_id);
    if ephemeral {
        let chat = app.chat().clone();
        tokio::spawn(async move {
            // A run ends: its model calls and steps are bounded, and shutdown cancels it.
            log.ended(STATELESS_WATCH).await;
            let waits = now(&chat, &who, &thread).await.map_or(true, |after| !after.awaiting.is_empty());
            finished(&chat, &who, &thread, waits, true).await;
        });
    }
    Ok(response)
}

/// Names the run in `Content-Location`, where LangGraph's SDKs read which run a request
/// created (`on_run_created`).
fn created_at(response: &mut Response, thread: &str, run_id: &str) {
    if let Ok(at) = axum::http::HeaderValue::from_str(&format!("/threads/{thread}/runs/{run_id}")) {
        response.headers_mut().insert(axum::http::header::CONTENT_LOCATION, at);
    }
}

/// `POST /runs`: a run in the background on a thread of its own (its `thread_id` is in the
/// answer), deleted once the run ends — unless it paused, or `on_completion` is `keep`.
#[utoipa::path(post, path = "/runs", tag = LANGGRAPH, request_body = RunCreate,
    responses((status = 200, description = "The run, on a thread of its own.", body = Run), Refusals))]
pub(crate) async fn create_stateless(
    State(app): State<AppState>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    background(app, who, None, &body).await
}

/// Longest a stateless background run's thread is kept for its run to end before it is left
/// (deleted with its conversation by nobody: a run that long is stuck).
const STATELESS_WATCH: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// `GET /threads/{thread_id}/runs?limit=&offset=&status=`: the thread's runs, newest first, on
/// any replica: as [`get`] shows each.
#[utoipa::path(get, path = "/threads/{thread_id}/runs", tag = LANGGRAPH,
    params(("thread_id" = String, Path, description = "The thread."), ("limit" = Option<u32>, Query, description = "1 to 1000 (10)."), ("offset" = Option<u32>, Query),
        ("status" = Option<String>, Query, description = "pending, running, error, success, timeout or interrupted.")),
    responses((status = 200, description = "The thread's runs, newest first.", body = Vec<Run>), Refusals))]
pub(crate) async fn list(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    uri: axum::http::Uri,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let (mut limit, mut offset, mut status) = (10_usize, 0_usize, None);
    let bad = |field: &str, message: &str| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, field, message);
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*key {
            "limit" => {
                limit =
                    value.parse().ok().filter(|n| (1..=1000).contains(n)).ok_or_else(|| bad("limit", "1 to 1000"))?
            }
            "offset" => offset = value.parse().map_err(|_| bad("offset", "a number"))?,
            "status" if ["pending", "running", "error", "success", "timeout", "interrupted"].contains(&&*value) => {
                status = Some(value.into_owned());
            }
            "status" => {
                return Err(bad("status", "pending, running, error, success, timeout or interrupted"));
            }
            _ => {}
        }
    }
    let Some(conversation) = thread.conversation else { return Ok(axum::Json(Vec::<Value>::new()).into_response()) };
    // This replica's logs say most of the runs it ran lately; the checkpoints say the rest.
    let logs = app.chat().runs_of(&who.principal, ConversationId(conversation));
    let recorded = recorded(&app, &who, &thread, !logs.is_empty()).await?;
    let mut found: Vec<(i64, Value)> = logs
        .iter()
        .map(|log| (log.created_ms, run_shape(&thread, log, recorded.find(log.run_id()).map(|(run, _)| run))))
        .collect();
    found.extend(
        recorded
            .runs
            .iter()
            .filter(|(run, _)| !logs.iter().any(|log| log.run_id() == run.run_id))
            .map(|recorded_run| (recorded_run.0.started_at_ms, recorded.shape(&thread, recorded_run))),
    );
    // Newest first; runs of one thread go one at a time, so their starts order them.
    found.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    let runs: Vec<Value> = found
        .into_iter()
        .map(|(_, run)| run)
        .filter(|r| status.as_deref().is_none_or(|s| r["status"] == s))
        .skip(offset)
        .take(limit)
        .collect();
    Ok(axum::Json(runs).into_response())
}

/// `GET /threads/{thread_id}/runs/{run_id}/join`: waits for the run's end — here or on another
/// replica — and answers the thread's values then (with `__interrupt__` when it paused),
/// whatever the run's outcome (`runs.get` tells it).
#[utoipa::path(get, path = "/threads/{thread_id}/runs/{run_id}/join", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread."), ("run_id" = String, Path, description = "The run.")),
    responses((status = 200, description = "The thread's values once the run ended.", body = Object), Refusals))]
pub(crate) async fn join_run(
    State(app): State<AppState>,
    Path((id, run_id)): Path<(String, String)>,
    Asker(who): Asker,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let mut frames = run_frames(&app, &who, &thread, &run_id, 0).await?;
    if tokio::time::timeout(JOIN_WAIT, async { while frames.next().await.is_some() {} }).await.is_err() {
        return Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!("the run has not ended within {} s; join it again", JOIN_WAIT.as_secs()),
        ));
    }
    let after = now(app.chat(), &who, &thread).await?;
    Ok(axum::Json(final_values(&after)).into_response())
}

/// `POST /threads/{thread_id}/runs/wait`: the run's final values (with `__interrupt__` when it
/// paused).
#[utoipa::path(post, path = "/threads/{thread_id}/runs/wait", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")), request_body = RunCreate,
    responses((status = 200, description = "The run's final values (`__interrupt__` when it paused).", body = Object), Refusals))]
pub(crate) async fn wait(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (who, thread, run) = prepare(&app, who, Some(&id), &body).await?;
    waited(app, who, thread, run, false).await
}

/// Waits for the end of `log`'s run: 502 with what went wrong when it failed (a stateless
/// run's thread, `ephemeral`, is deleted first).
async fn ended_well(
    app: &AppState,
    who: &Asking,
    thread: &Thread,
    log: &std::sync::Arc<crate::runlog::RunLog>,
    ephemeral: bool,
) -> Result<(), ApiError> {
    let mut frames = std::pin::pin!(std::sync::Arc::clone(log).frames_after(0));
    // Only the frame that ends the run is read: its tokens go by unparsed.
    while let Some(frame) = frames.next().await {
        if toolgraph_protocol::is_terminal_event(&frame.event)
            && let Ok(Frame::Error { message }) = Frame::parse(&frame.event, &frame.data)
        {
            finished(app.chat(), who, thread, false, ephemeral).await;
            return Err(ApiError::new(StatusCode::BAD_GATEWAY, message));
        }
    }
    Ok(())
}

/// A run on `thread`, answered with its final values; its thread deleted after when `ephemeral`.
async fn waited(
    app: AppState,
    who: Asking,
    mut thread: Thread,
    mut run: RunCreate,
    ephemeral: bool,
) -> Result<Response, ApiError> {
    match asked(&run)? {
        Asked::Resume(resume) => {
            // Streamed into its log as any run is (node frames too when its modes need them),
            // so the resumed run can be joined and listed like the others; this request waits.
            let how = run.resumption(&thread)?;
            if let Resuming::Started(resumed) = resume_thread(&app, &who, &thread, &resume, how).await? {
                run.mark_resumed(&resumed.log);
                ended_well(&app, &who, &thread, &resumed.log, ephemeral).await?;
                // Its reply saved, as a confirm's: the same decisions again answer with it.
                let _ = resumed.outcome.await;
            }
            // Otherwise the decisions were recorded, or applied already: the values say where
            // the thread stands.
        }
        Asked::Message(message) => {
            let (_, log) = begin(&app, &who, &mut thread, &mut run, message, ephemeral).await?;
            ended_well(&app, &who, &thread, &log, ephemeral).await?;
        }
    }
    let after = now(app.chat(), &who, &thread).await?;
    finished(app.chat(), &who, &thread, !after.awaiting.is_empty(), ephemeral).await;
    Ok(axum::Json(final_values(&after)).into_response())
}

/// Who asks, their thread `id` (bound to its conversation after a first run; without an id, a
/// new thread of theirs for a stateless run) and the run read.
async fn prepare(
    app: &AppState,
    who: Asking,
    id: Option<&str>,
    body: &Bytes,
) -> Result<(Asking, Thread, RunCreate), ApiError> {
    let run: RunCreate = json_body(body)?;
    run.multitask()?;
    if let Some(c) = run.on_completion.as_deref()
        && !["delete", "keep"].contains(&c)
    {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "on_completion", "delete or keep"));
    }
    let (agents, _) = app.chat().agents();
    if !agents.iter().any(|(name, _)| *name == run.assistant_id) {
        return Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "assistant_id",
            format!("no assistant '{}': the assistants are the agents", super::echoed(&run.assistant_id)),
        ));
    }
    let Some(id) = id else {
        // Refused before its thread is made: a refused stateless run leaves nothing behind.
        modes(run.stream_mode.as_ref())?;
        asked(&run)?;
        if run.command.is_some() {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "command",
                "a stateless run has nothing to resume: resume on the paused run's thread",
            ));
        }
        if super::threads::named_checkpoint(run.checkpoint_id.as_deref(), run.checkpoint.as_ref())?.is_some() {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "checkpoint_id",
                "a stateless run's thread is new: it has no checkpoints to start from",
            ));
        }
        return Ok((who.clone(), super::threads::made(app.chat(), &who).await?, run));
    };
    let at = super::threads::named_checkpoint(run.checkpoint_id.as_deref(), run.checkpoint.as_ref())?;
    let mut thread = theirs(app.chat(), &who, id).await?;
    if let Some(conversation) = thread.conversation {
        let agent = app.chat().conversation_agent(&who.principal, ConversationId(conversation)).await?;
        if agent != run.assistant_id {
            // Its checkpoints and pending actions belong to that agent's graph and tools.
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "assistant_id",
                format!("thread '{id}' talks to assistant '{agent}'"),
            ));
        }
    }
    let mut run = run;
    if let Some(at) = at {
        // Checked before the thread moves; a run refused after it (by admission, a budget) puts
        // it back ([`begin`]).
        modes(run.stream_mode.as_ref())?;
        match asked(&run)? {
            Asked::Message(message) => crate::wire::check_message(&message)?,
            Asked::Resume(_) if super::threads::now(app.chat(), &who, &thread).await?.seq != at => {
                return Err(ApiError::field(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "checkpoint_id",
                    "a resume continues the pause the thread is in: name its last checkpoint, or none",
                ));
            }
            Asked::Resume(_) => {}
        }
        run.moved = super::threads::to_checkpoint(app, &who, &mut thread, at).await?;
    }
    Ok((who, thread, run))
}

/// [`start`], deleting an `ephemeral` thread when the turn is refused, and putting back a
/// thread the run `moved` to an earlier checkpoint.
async fn begin(
    app: &AppState,
    who: &Asking,
    thread: &mut Thread,
    run: &mut RunCreate,
    message: String,
    ephemeral: bool,
) -> Result<(String, std::sync::Arc<crate::runlog::RunLog>), ApiError> {
    // Both were checked by `prepare`.
    let node_events = run.modes().is_ok_and(Modes::node_events);
    let started = match run.multitask() {
        Ok(strategy) => start(app, who, thread, &run.assistant_id, message, strategy, node_events).await,
        Err(e) => Err(e),
    };
    match &started {
        Ok((_, log)) if run.stream_subgraphs => log.set_subgraphs(),
        Ok(_) => {}
        Err(_) => {
            super::threads::undo(app, who, thread, run.moved.take()).await;
            finished(app.chat(), who, thread, false, ephemeral).await;
        }
    }
    started
}

/// What a run of this door writes of itself on its first checkpoint: what `runs.get` and
/// `runs.list` answer for it on a replica that does not keep its log (another one's, or one
/// from before a restart), read back as [`RunMetadata`].
fn said(assistant: &str, strategy: Multitask, thread: &str) -> Option<Box<serde_json::value::RawValue>> {
    serde_json::value::to_raw_value(&json!({
        "assistant_id": assistant,
        "multitask_strategy": strategy.name(),
        "thread_id": thread,
    }))
    .ok()
}

/// Starts the turn of `message` on `thread`'s conversation (made by this first run, and bound
/// to the thread: `thread` says which); while another run holds it, as `strategy` says.
async fn start(
    app: &AppState,
    who: &Asking,
    thread: &mut Thread,
    assistant: &str,
    message: String,
    strategy: Multitask,
    node_events: bool,
) -> Result<(String, std::sync::Arc<crate::runlog::RunLog>), ApiError> {
    let turn = NewTurn {
        tenant_slug: who.tenant_slug.clone(),
        conversation: thread.conversation.map(ConversationId),
        message,
        agent: Some(assistant.to_owned()),
        context: None,
        tool_events: true,
        node_events,
        attachments: Vec::new(),
        run_metadata: said(assistant, strategy, &thread.id),
    };
    turn.validate()?;
    let (run_id, log) = start_when_free(app, &who.principal, &turn, strategy).await?;
    log.set_multitask(strategy.name());
    if thread.conversation.is_none() {
        app.chat().update_thread(&who.principal, &thread.id, None, Some(log.conversation)).await?;
        let bound = theirs(app.chat(), who, &thread.id).await?.conversation;
        if bound != Some(log.conversation.0) {
            // Two first runs at once each made a conversation: the thread keeps the first bound;
            // this run ends on its own.
            tracing::warn!(thread = %thread.id, conversation = %log.conversation, ?bound, "a thread's first runs raced; this run's conversation is not the thread's");
        }
        thread.conversation = Some(log.conversation.0);
    }
    Ok((run_id.0, log))
}

/// Starts `turn` for `who`; while another run holds its conversation, refuses (`reject`),
/// cancels that run and starts once it has ended (`interrupt`, within [`CANCEL_WAIT`]), the
/// same having rolled it back (`rollback`), or starts once it has ended (`enqueue`, within
/// [`ENQUEUE_WAIT`]). A run in progress on another replica cannot be interrupted from here
/// (409); one is waited for by retrying.
async fn start_when_free(
    app: &AppState,
    who: &Principal,
    turn: &NewTurn,
    strategy: Multitask,
) -> Result<(RunId, std::sync::Arc<crate::runlog::RunLog>), ApiError> {
    let cancels = matches!(strategy, Multitask::Interrupt | Multitask::Rollback);
    let limit = if cancels { CANCEL_WAIT } else { ENQUEUE_WAIT };
    let began = tokio::time::Instant::now();
    let deadline = began + limit;
    let mut interrupted = false;
    // The run this request cancelled, to roll back once it has ended (and only it).
    let mut doomed: Option<(ConversationId, RunId)> = None;
    loop {
        // Once it has ended, rolled back before this run can take the conversation.
        if let Some((conversation, run)) = &doomed
            && app.chat().run_log(run, who).is_none_or(|l| l.outcome().0)
        {
            match app.chat().roll_back(who, *conversation, run).await {
                // A run cancelled before its first checkpoint wrote nothing.
                Ok(_) | Err(ChatError::NotFound) => doomed = None,
                // Still held (by the run's last moments, or another request): again shortly.
                Err(ChatError::Busy) => {}
                Err(e) => return Err(e.into()),
            }
        }
        match app.chat().start_turn(who, turn).await {
            Err(ChatError::Busy) if strategy != Multitask::Reject => {}
            started => return Ok(started?),
        }
        // Busy: the conversation exists (a new one is never busy).
        let running = turn.conversation.and_then(|c| app.chat().running_run(who, c));
        if cancels && !interrupted {
            match &running {
                Some(log) => {
                    log.cancel();
                    interrupted = true;
                    if strategy == Multitask::Rollback {
                        doomed = Some((log.conversation, RunId::from(log.run_id())));
                    }
                }
                None if began.elapsed() < LOOK_FOR_RUN => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
                None => {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "the run in progress is on another replica and cannot be interrupted from this one; retry, \
                         or enqueue",
                    ));
                }
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("the run in progress did not end within {} s", limit.as_secs()),
            ));
        }
        match running {
            // Its conversation is released before its log ends.
            Some(log) => {
                log.ended(left).await;
            }
            None => tokio::time::sleep(left.min(std::time::Duration::from_millis(250))).await,
        }
    }
}

/// `value` as the decision on `action`. For an approval: `true`/`false`, `{"approved": bool}`,
/// or a LangChain decision — `{"type": "approve"}`, `{"type": "edit", "edited_action": {"name",
/// "args"}}`, `{"type": "reject", "message"?}`, `{"type": "respond", "message"}` (the person's
/// answer in the call's place). For a question: its answer, or `{"type": "respond", "message":
/// answer}` in LangChain's format (`as_decision`).
fn decision(action: &PendingActionDto, value: &Value, as_decision: bool) -> Result<Decision, String> {
    let kind = value.get("type").and_then(Value::as_str);
    if action.tool_name == crate::agui::ASK {
        return match (as_decision, kind) {
            (true, Some("respond")) => Ok(Decision::Answer(value.get("message").cloned().unwrap_or(Value::Null))),
            // agent-inbox's response: the answer in `args`.
            (true, Some("response")) => Ok(Decision::Answer(value.get("args").cloned().unwrap_or(Value::Null))),
            (true, _) => Err("a question takes a `respond` decision with the answer as its `message`".into()),
            (false, _) => Ok(Decision::Answer(value.clone())),
        };
    }
    // agent-inbox's responses carry their text or edit in `args`.
    let message = || {
        value
            .get("message")
            .or_else(|| value.get("args"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty())
    };
    match (value, kind) {
        (Value::Bool(true), _) | (_, Some("approve" | "accept")) => Ok(Decision::Approve),
        (Value::Bool(false), _) | (_, Some("ignore")) => Ok(Decision::Reject),
        (_, Some("response")) => message()
            .map(|m| Decision::Respond(m.to_owned()))
            .ok_or_else(|| "a `response` carries the person's answer as its `args`".to_owned()),
        (_, Some("reject")) => Ok(message().map_or(Decision::Reject, |m| Decision::RejectWith(m.to_owned()))),
        (_, Some("respond")) => message()
            .map(|m| Decision::Respond(m.to_owned()))
            .ok_or_else(|| "a `respond` decision carries the person's answer as its `message`".to_owned()),
        (_, Some("edit")) => {
            // LangChain's `edited_action: {name, args}`, or agent-inbox's `args: {action, args}`.
            let edited = value.get("edited_action").unwrap_or(&value["args"]);
            let name = edited.get("name").or_else(|| edited.get("action")).and_then(Value::as_str);
            if name.is_some_and(|n| n != action.tool_name) {
                return Err(format!("an edit keeps the action's tool, `{}`", action.tool_name));
            }
            match &edited["args"] {
                args @ Value::Object(_) => Ok(Decision::Edit(args.clone())),
                _ => Err("an `edit` decision carries `edited_action.args`, an object".into()),
            }
        }
        (_, Some(other)) => Err(format!(
            "a decision's type is approve, edit, reject or respond (or agent-inbox's accept, edit, response, ignore), \
             not `{other}`"
        )),
        (Value::Object(o), None) if o.get("approved").is_some_and(Value::is_boolean) => {
            Ok(if o.get("approved").and_then(Value::as_bool).unwrap_or(false) {
                Decision::Approve
            } else {
                Decision::Reject
            })
        }
        _ => Err(
            "an approval's decision is true, false, or {\"type\": \"approve\" | \"edit\" | \"reject\" | \"respond\"}"
                .into(),
        ),
    }
}

/// Decides what `thread` waits for with `resume`, in LangChain's human-in-the-loop format
/// (`{"decisions": [{"type": "approve"}, {"type": "reject"}]}`, one per action in order), by
/// interrupt id (`{"approval-12": true, "question-13": "Friday"}`), or as one value for the
/// single action waiting; the last decision's outcome, or the run they resumed as `how` says.
/// Every decision is checked (a question's answer against its form, an edit against the tool's
/// schema) before the first is recorded.
async fn resume_thread(
    app: &AppState,
    who: &Asking,
    thread: &Thread,
    resume: &Value,
    how: Resumption,
) -> Result<Resuming, ApiError> {
    let nothing = || ApiError::field(StatusCode::CONFLICT, "command.resume", "the thread waits for no decision");
    let conversation = ConversationId(thread.conversation.ok_or_else(nothing)?);
    let awaiting = app.chat().awaiting(&who.principal, conversation).await?;
    if awaiting.is_empty() {
        return Err(nothing());
    }
    let bad = |message: String| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "command.resume", message);
    let mut decided: Vec<(MessageId, Decision)> = Vec::new();
    // LangChain's `{"decisions": [...]}`, or the list of responses agent-inbox and
    // agent-chat-ui send.
    if let Some(decisions) = resume.get("decisions").and_then(Value::as_array).or_else(|| resume.as_array()) {
        if decisions.len() != awaiting.len() {
            return Err(bad(format!("{} decisions for {} actions waiting", decisions.len(), awaiting.len())));
        }
        for (action, value) in awaiting.iter().zip(decisions) {
            decided.push((action.message_id, decision(action, value, true).map_err(bad)?));
        }
    } else if let Some(by_id) = resume.as_object().filter(|o| {
        !o.is_empty() && o.keys().all(|k| k.starts_with(crate::agui::APPROVAL) || k.starts_with(crate::agui::QUESTION))
    }) {
        for (id, value) in by_id {
            let action = awaiting
                .iter()
                .find(|a| interrupt(a)["id"] == id.as_str())
                .ok_or_else(|| bad(format!("`{id}` is not an interrupt the thread waits on")))?;
            decided.push((action.message_id, decision(action, value, false).map_err(bad)?));
        }
    } else {
        let [action] = awaiting.as_slice() else {
            return Err(bad(format!("{} actions wait: resume with `decisions` or by interrupt id", awaiting.len())));
        };
        decided.push((action.message_id, decision(action, resume, false).map_err(bad)?));
    }
    let args = |e: ApiError| match e.field.as_deref() {
        // An edit's arguments, named as the resume carries them.
        Some("args") => ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "command.resume", e.message),
        _ => e,
    };
    app.chat().decide_all(&who.principal, conversation, decided, how).await.map_err(|e| args(e.into()))
}

/// The values a run ends on: the state, with `__interrupt__` when it waits.
fn final_values(after: &Now) -> Value {
    let mut values = after.values.clone();
    if !after.awaiting.is_empty() {
        values["__interrupt__"] = Value::Array(after.awaiting.iter().map(run_interrupt).collect());
    }
    values
}

/// An interrupt as a run's output has it: with the `response_schema` LangGraph's server adds
/// there (none: a decision's shape is LangChain's, docs/langgraph.md "Interrupts").
fn run_interrupt(action: &PendingActionDto) -> Value {
    let mut shown = interrupt(action);
    shown["response_schema"] = Value::Null;
    shown
}

/// How a run ended, for its last events.
struct Ended<'a> {
    thread: &'a str,
    /// Whether its checkpoints were streamed as its nodes finished (only a pause's is left).
    checkpointed: bool,
    /// The values its last `values` event sent, when it streamed them (the final values are
    /// not sent again when they are the same: the last node wrote its channels and nothing since).
    sent: Option<&'a Value>,
}

/// The last events of a run: its interrupts as an update, the checkpoint it ended on (unless
/// streamed already; at a pause, with what it waits for), and its final values.
fn ending(modes: &Modes, after: &Now, ended: &Ended<'_>) -> Vec<Event> {
    let mut events = Vec::new();
    let interrupts: Vec<Value> = after.awaiting.iter().map(interrupt).collect();
    if modes.updates && !interrupts.is_empty() {
        let shown: Vec<Value> = after.awaiting.iter().map(run_interrupt).collect();
        events.push(event("updates", &json!({ "__interrupt__": shown })));
    }
    if modes.checkpointed() && (!ended.checkpointed || !interrupts.is_empty()) {
        let tasks: Vec<Value> = after
            .next
            .iter()
            .map(|node| json!({ "id": task_id(ended.thread, after.seq), "name": node, "interrupts": interrupts, "state": null }))
            .collect();
        let payload = json!({
            "config": checkpoint_config(ended.thread, Some(after.seq)),
            "parent_config": checkpoint_config(ended.thread, after.seq.checked_sub(1).filter(|p| *p > 0)),
            "values": after.values,
            "metadata": { "source": "loop", "step": after.seq, "parents": {} },
            "next": after.next,
            "tasks": tasks,
        });
        events.extend(node_event(modes, "checkpoints", "checkpoint", after.seq, payload, ""));
    }
    if modes.values {
        let values = final_values(after);
        if ended.sent != Some(&values) {
            events.push(event("values", &values));
        }
    }
    events
}

/// A checkpoint's `config` in LangGraph's events (`null` for none).
fn checkpoint_config(thread: &str, seq: Option<u64>) -> Value {
    seq.map_or(Value::Null, |seq| json!({ "configurable": super::threads::checkpoint_of(thread, seq) }))
}

/// The checkpoints a checkpoint of sub-graph namespace `ns` (`|billing:THREAD-4`, a part per
/// level) is under, as LangGraph's `metadata.parents` names them: each enclosing namespace (`""`
/// at the top) → the checkpoint its handing node began from (the task's id ends with it).
fn parents(ns: &str) -> Value {
    let mut parents = Map::new();
    let mut enclosing = String::new();
    for part in ns.split('|').skip(1) {
        if let Some((_, from)) = part.rsplit_once('-') {
            parents.insert(enclosing.clone(), Value::String(from.to_owned()));
        }
        if !enclosing.is_empty() {
            enclosing.push('|');
        }
        enclosing.push_str(part);
    }
    Value::Object(parents)
}

/// The handing node `node` hands a turn back to, when `node` is a handed-over agent's way back
/// (`billing/END` → `billing`).
fn handed_back(node: &str) -> Option<&str> {
    node.strip_suffix(toolgraph_agents::declared::check::END_NAME)?.strip_suffix('/')
}

/// Whether `node`, going on to `next`, hands the turn to another agent (`billing` →
/// `billing/intent`).
fn hands_off(node: &str, next: Option<&str>) -> bool {
    next.is_some_and(|next| within(next, node))
}

/// Whether `node` is a node of the agent handing node `handing` hands turns to
/// (`billing/intent` of `billing`).
fn within(node: &str, handing: &str) -> bool {
    node.strip_prefix(handing).is_some_and(|rest| rest.starts_with('/'))
}

/// The messages of checkpoint `at` after the first `before` (unknown: none), and the task
/// result they make (`{}` when none).
fn added_since(at: &Checkpoint, before: Option<usize>) -> (Vec<Value>, Value) {
    let added: Vec<Value> = match (before, at.values["messages"].as_array()) {
        (Some(before), Some(messages)) => messages.get(before..).map(<[Value]>::to_vec).unwrap_or_default(),
        _ => Vec::new(),
    };
    let result = if added.is_empty() { json!({}) } else { json!({ "messages": added }) };
    (added, result)
}

/// A task's or checkpoint's `payload` as the modes asked for it: an event of its own mode
/// (`tasks`, `checkpoints`), and inside `debug` with its step, time and `kind`; in the
/// sub-graph namespace `ns` (`|billing:<task>`, or empty).
fn node_event(modes: &Modes, mode: &str, kind: &str, step: u64, payload: Value, ns: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let own = if mode == "tasks" { modes.tasks } else { modes.checkpoints };
    if modes.debug {
        let at = super::threads::rfc3339(toolgraph_conversations::now_ms());
        let mut payload = payload.clone();
        if kind == "checkpoint" {
            // The checkpoints again as `{thread_id, checkpoint_ns, checkpoint_id}`, as LangGraph's
            // server adds them to a debug event.
            payload["checkpoint"] = payload["config"]["configurable"].clone();
            payload["parent_checkpoint"] = payload["parent_config"]["configurable"].clone();
        }
        let debug = json!({ "step": step, "timestamp": at, "type": kind, "payload": payload });
        events.push(event(&format!("debug{ns}"), &debug));
    }
    if own {
        events.push(event(&format!("{mode}{ns}"), &payload));
    }
    events
}

/// One of LangGraph's events of a run, before it is sent: its name (the stream mode, with the
/// namespace of the sub-graph it comes from) and its data; a run's events carry their frame's
/// number as their id (`Last-Event-ID`).
struct Event {
    name: String,
    data: String,
}

impl Event {
    /// The event as it is sent, with `id` when it has one.
    fn sent(self, id: Option<&str>) -> SseEvent {
        SseEvent::new(Some(&self.name), id, &self.data)
    }
}

/// Event `name` with `data`.
fn event(name: &str, data: &Value) -> Event {
    Event { name: name.to_owned(), data: data.to_string() }
}

/// A piece of the model's message as LangChain's `AIMessageChunk`: text, or its `calls`
/// (whole, as `tool_calls`, and as the `tool_call_chunks` a client joins).
fn ai_chunk(content: &str, id: &str, calls: Vec<Value>, pieces: Vec<Value>) -> Value {
    json!({ "type": "AIMessageChunk", "content": content, "id": id, "name": null, "tool_calls": calls,
            "tool_call_chunks": pieces, "invalid_tool_calls": [], "additional_kwargs": {}, "response_metadata": {},
            "usage_metadata": null, "chunk_position": null })
}

/// A text chunk of the model's reply as [`ai_chunk`] writes it — the same fields, in the same
/// (sorted) order — written straight as JSON: a streamed reply has one per token, and building
/// each as a `Value` first cost more than the rest of its event.
fn text_chunk(content: &str, id: &str) -> String {
    let mut out = Vec::with_capacity(content.len() + id.len() + 240);
    out.extend_from_slice(br#"{"additional_kwargs":{},"chunk_position":null,"content":"#);
    json_string(&mut out, content);
    out.extend_from_slice(br#","id":"#);
    json_string(&mut out, id);
    out.extend_from_slice(
        br#","invalid_tool_calls":[],"name":null,"response_metadata":{},"tool_call_chunks":[],"tool_calls":[],"type":"AIMessageChunk","usage_metadata":null}"#,
    );
    // JSON text written from `&str`s is UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends `text` as a JSON string.
fn json_string(out: &mut Vec<u8>, text: &str) {
    // Writing a string into a `Vec` cannot fail.
    let _ = serde_json::to_writer(out, text);
}

/// What one frame becomes.
enum Step {
    Events(Vec<Event>),
    /// A node began from checkpoint `from`: its events need that checkpoint's values, unless
    /// the writer has them (`known`).
    Started {
        node: String,
        step: u32,
        from: u64,
        known: bool,
    },
    /// A node finished and wrote checkpoint `seq`: its events need it, and the one before it
    /// unless the writer has that (`known`).
    Finished {
        node: String,
        seq: u64,
        next: Option<String>,
        known: bool,
        /// For an agent's way back whose hand-off is not in the frames (a resumed run, a
        /// join): the checkpoint its handing node began from, whose messages its result is
        /// counted from.
        handed_at: Option<u64>,
    },
    /// A node wrote channels, and checkpoint `seq` holds them: these events, then the values
    /// there, in the node's namespace (the writer's values so far stand until then).
    Wrote(Vec<Event>, u64, String),
    /// The run ended well: these events, then the last ones, which need the state it left.
    End(Vec<Event>, Finish),
    /// The run failed: these events say so.
    Failed(Vec<Event>),
}

/// What a run's last events need besides the state it left.
struct Finish {
    modes: Modes,
    /// Whether its checkpoints were streamed as its nodes finished.
    checkpointed: bool,
    /// The values the last `values` event sent, when the run streamed them from its start.
    sent: Option<Value>,
}

/// The `messages` events' name and metadata of one node's task and model message.
struct MessageMeta {
    node: String,
    /// The checkpoint the node started from, when the log names it.
    from: Option<u64>,
    /// The model message (a new one after each tool call).
    message: usize,
    /// `messages`, in the node's sub-graph namespace when asked for.
    event: String,
    /// The metadata, as JSON.
    text: String,
}

/// Writes one run's frames as LangGraph's events.
struct Writer {
    modes: Modes,
    run_id: String,
    /// The model message being streamed (a new one after each tool call).
    message: usize,
    ended: bool,
    /// The thread's values so far, when the client asked for `values` from the run's start.
    so_far: Option<Value>,
    /// Whether the last message of `so_far` is the model's step of calls still coming.
    calling: bool,
    /// Whether `so_far` is what the last `values` event sent, as the graph's own (not a
    /// sub-graph's, `values|…`).
    sent: bool,
    /// The thread (its messages' ids are its own, by position).
    thread: String,
    /// The node running (from the log's `node_started`, to its `node_finished`) and the
    /// checkpoint it started from.
    task: Option<(String, u64)>,
    /// The last checkpoint read for the node events: a node's input, what it wrote after.
    last: Option<Checkpoint>,
    /// Whether a checkpoint was streamed from the log.
    checkpointed: bool,
    /// The result of the node that paused, its step and its namespace, written at the run's end
    /// with the interrupts the pause's `pending` frames name.
    paused_task: Option<(Value, u64, String)>,
    /// The interrupts of the pause, as its `pending` frames came: the run paused when any came.
    interrupts: Vec<Value>,
    /// The words of the last node that spoke, since its last tool call: the reply, once the run
    /// ends.
    reply: String,
    /// The node they are of (from the log's node events).
    reply_node: Option<String>,
    /// Whether a node began since the last words: the next words are another reply.
    new_node: bool,
    /// The last node that began (from the log's node events).
    last_node: Option<String>,
    /// The metadata of the last `messages` event, written out once per task and model message
    /// rather than for each token.
    meta: Option<MessageMeta>,
    /// The checkpoint each node that began started from: a sub-graph's task id is its handing
    /// node's.
    starts: std::collections::HashMap<String, u64>,
    /// Where the thread's handing nodes started, oldest first, from its checkpoints: the start
    /// of a handing node whose own start is not in the frames ([`handing_starts`]).
    history: Vec<(String, u64)>,
    /// With sub-graphs namespaced, each handing node whose agent runs now: the checkpoint it
    /// started from and how many messages the state held then. Its task ends when the agent
    /// hands the turn back, as a sub-graph node's does.
    handing: std::collections::HashMap<String, (u64, Option<usize>)>,
    /// The channels the running node wrote (from the log's `state_update`), as its task's
    /// result shows them: the node and each channel's value written.
    wrote: Option<(String, Map<String, Value>)>,
    /// The id of model message `message`, once made (every token of it carries it).
    message_id: Option<(usize, String)>,
}

impl Writer {
    /// The writer of run `run_id` of `thread` in `modes`, with the thread's values so far when
    /// the client asked for `values` from the run's start.
    fn new(modes: Modes, run_id: String, thread: &Thread, so_far: Option<Value>) -> Self {
        Self {
            modes,
            run_id,
            message: 0,
            ended: false,
            so_far,
            calling: false,
            sent: true,
            thread: thread.id.clone(),
            task: None,
            last: None,
            checkpointed: false,
            paused_task: None,
            interrupts: Vec::new(),
            reply: String::new(),
            reply_node: None,
            new_node: false,
            last_node: None,
            meta: None,
            starts: std::collections::HashMap::new(),
            history: Vec::new(),
            handing: std::collections::HashMap::new(),
            wrote: None,
            message_id: None,
        }
    }

    /// The id of the model message being streamed, `run-<run id>-<n>`.
    fn message_id(&mut self) -> String {
        match &self.message_id {
            Some((message, id)) if *message == self.message => id.clone(),
            _ => {
                let id = format!("run-{}-{}", self.run_id, self.message);
                self.message_id = Some((self.message, id.clone()));
                id
            }
        }
    }

    /// The writer, with where the thread's nodes last started before the run's frames
    /// ([`handing_starts`]): a node the frames start again is placed by its new start.
    fn starting_at(mut self, history: Vec<(String, u64)>) -> Self {
        self.history = history;
        self
    }

    /// Where `node` runs, when sub-graphs are namespaced: the namespace of the handed-over agent
    /// it is a node of (`|billing:<task>`, a level for each hand-off; empty at the top) and its
    /// name there (`billing/intent` is `intent` in `|billing:…`). A hand-off's way back
    /// (`billing/END`) is the handing node's end, at the handing node's level. Without
    /// namespaces, every node is at the top under its whole name (docs/langgraph.md, "Sub-graphs").
    fn place<'a>(&self, node: &'a str) -> (String, &'a str) {
        if !self.modes.subgraphs {
            return (String::new(), node);
        }
        let parts: Vec<&str> = node.split('/').collect();
        let end = toolgraph_agents::declared::check::END_NAME;
        // `split` yields one part at least.
        let depth = match parts.as_slice() {
            [.., _, last] if *last == end => parts.len() - 2,
            _ => parts.len() - 1,
        };
        let mut ns = String::new();
        for level in 0..depth {
            let from = self.starts.get(&parts[..=level].join("/")).copied().unwrap_or(0);
            ns.push_str(&format!("|{}:{}", parts[level], task_id(&self.thread, from)));
        }
        (ns, parts[depth])
    }

    /// The node the run's frames come from now (the last that began), if the log names it and
    /// namespaces are asked for and it runs in a handed-over agent; else `top`, the name the
    /// events of a run with no node events give it.
    fn current<'a>(&'a self, top: &'a str) -> &'a str {
        match self.last_node.as_deref() {
            Some(node) if self.modes.subgraphs && !self.place(node).0.is_empty() => node,
            _ => top,
        }
    }

    /// A `messages` event: `message` (its JSON) from `node`, with its metadata — the same for
    /// every event of one task, so written out once per task rather than for each token.
    fn message_event(&mut self, message: &str, node: &str) -> Event {
        let from = match &self.task {
            Some((_, from)) => Some(*from),
            None if self.modes.subgraphs => self.starts.get(node).copied(),
            None => None,
        };
        let fresh = |m: &MessageMeta| m.node == node && m.from == from && m.message == self.message;
        if !self.meta.as_ref().is_some_and(fresh) {
            let (ns, leaf) = self.place(node);
            // The node's task, when the log holds its events (its step is known then only).
            let task = match from {
                Some(from) => task_id(&self.thread, from),
                None => format!("{}-{}", self.run_id, self.message),
            };
            // The task's whole path: the sub-graphs it runs in, then its own.
            let namespace = match ns.strip_prefix('|') {
                Some(outer) => format!("{outer}|{leaf}:{task}"),
                None => format!("{leaf}:{task}"),
            };
            let mut meta = json!({ "langgraph_node": leaf, "run_id": self.run_id, "thread_id": self.thread,
                "run_attempt": 1, "langgraph_path": ["__pregel_pull", leaf], "langgraph_triggers": [format!("branch:to:{leaf}")],
                "langgraph_checkpoint_ns": namespace, "checkpoint_ns": namespace });
            if let Some(from) = from {
                meta["langgraph_step"] = json!(from + 1);
            }
            self.meta = Some(MessageMeta {
                node: node.to_owned(),
                from,
                message: self.message,
                event: format!("messages{ns}"),
                text: meta.to_string(),
            });
        }
        let (event, meta) = match &self.meta {
            Some(m) => (m.event.as_str(), m.text.as_str()),
            // Set just above.
            None => ("messages", "{}"),
        };
        let mut data = String::with_capacity(message.len() + meta.len() + 3);
        data.push('[');
        data.push_str(message);
        data.push(',');
        data.push_str(meta);
        data.push(']');
        Event { name: event.to_owned(), data }
    }

    /// The values after a node's channel writes, read from its checkpoint (`at`; `None` when
    /// it could not be read: the values so far stand): the values so far from now on, sent in
    /// the node's namespace `ns` unless they are what the last `values` event sent.
    fn values_after(&mut self, at: Option<Checkpoint>, ns: &str) -> Vec<Event> {
        let (Some(at), Some(so_far)) = (at, self.so_far.as_mut()) else { return Vec::new() };
        if self.sent && *so_far == at.values {
            return Vec::new();
        }
        *so_far = at.values;
        self.calling = false;
        // Sent as the graph's own values only at the top: a sub-graph's leave the run's end to
        // send the top's.
        self.sent = ns.is_empty();
        vec![event(&format!("values{ns}"), so_far)]
    }

    /// Whether checkpoint `seq` is the last one read.
    fn knows(&self, seq: u64) -> bool {
        self.last.as_ref().is_some_and(|c| c.seq == seq)
    }

    /// Checkpoint `at` as LangGraph's checkpoint event, `next` running after it; the run's input
    /// (`input`), or a node's step.
    fn checkpoint(&self, at: &Checkpoint, next: Vec<String>, input: bool, ns: &str) -> Vec<Event> {
        let tasks: Vec<Value> = next
            .iter()
            .map(|n| json!({ "id": task_id(&self.thread, at.seq), "name": n, "interrupts": [], "state": null }))
            .collect();
        let payload = json!({
            "config": checkpoint_config(&self.thread, Some(at.seq)),
            "parent_config": checkpoint_config(&self.thread, at.seq.checked_sub(1).filter(|p| *p > 0)),
            "values": at.values,
            "metadata": { "source": if input { "input" } else { "loop" }, "step": at.seq, "parents": parents(ns) },
            "next": next,
            "tasks": tasks,
        });
        node_event(&self.modes, "checkpoints", "checkpoint", at.seq, payload, ns)
    }

    /// Node `node` began from checkpoint `from` (read as `read` when the writer did not have
    /// it): the run's input checkpoint before its first node, then the node's task.
    fn started(&mut self, node: &str, step: u32, from: u64, read: Option<Checkpoint>) -> Vec<Event> {
        let mut out = Vec::new();
        if let Some(read) = read {
            self.last = Some(read);
        }
        let input = self.last.as_ref().filter(|c| c.seq == from);
        if step == 1
            && let Some(at) = input
        {
            out.extend(self.checkpoint(at, vec![node.to_owned()], true, ""));
            self.checkpointed = true;
        }
        self.task = Some((node.to_owned(), from));
        if self.modes.subgraphs && handed_back(node).is_some() {
            // The way back from a handed-over agent is the end of its handing node's task,
            // which began when the hand-off did: no task of its own.
            return out;
        }
        let values = input.map_or(Value::Null, |c| c.values.clone());
        let (ns, leaf) = self.place(node);
        let payload = json!({ "id": task_id(&self.thread, from), "name": leaf, "input": values,
            "triggers": [format!("branch:to:{leaf}")] });
        out.extend(node_event(&self.modes, "tasks", "task", from + 1, payload, &ns));
        out
    }

    /// Node `node` finished and wrote checkpoint `at` (`before`, the one before it, read when
    /// the writer did not have it): its result — the messages it added — and the checkpoint,
    /// unless it is a pause (the run's end streams that one, with what it waits for).
    fn finished(
        &mut self,
        node: &str,
        seq: u64,
        next: Option<String>,
        before: Option<Checkpoint>,
        at: Checkpoint,
    ) -> Vec<Event> {
        let mut out = Vec::new();
        if let Some(before) = before {
            self.last = Some(before);
        }
        // Its channel writes, if the frame before told them: this node's alone, and once.
        let wrote = self.wrote.take().filter(|(by, _)| by == node).map(|(_, wrote)| wrote);
        let count = |c: &Checkpoint| c.values["messages"].as_array().map_or(0, Vec::len);
        let had = self.last.as_ref().filter(|c| c.seq + 1 == seq).map(count);
        let (ns, leaf) = self.place(node);
        if self.modes.subgraphs && !at.waits {
            if hands_off(node, next.as_deref()) {
                // A hand-off: the node's task goes on while its agent runs (LangGraph's
                // sub-graph node), and ends with what the agent wrote when it hands back.
                self.handing.insert(node.to_owned(), (seq.saturating_sub(1), had));
                self.task = None;
                self.last = Some(at);
                return out;
            }
            if let Some(handing) = handed_back(node) {
                // Known when the hand-off was seen, here or in the checkpoints before the run;
                // else (its history unreadable) the handing node's end is not told.
                if let Some((from, before)) = self.handing.remove(handing) {
                    out.extend(self.hand_back(handing, from, before, &at, &ns, leaf));
                    out.extend(self.checkpoint(&at, next.into_iter().collect(), false, &ns));
                    self.checkpointed = true;
                }
                self.task = None;
                self.last = Some(at);
                return out;
            }
        }
        let (_, mut result) = added_since(&at, had);
        if let Some(wrote) = wrote {
            result["channels"] = Value::Object(wrote);
        }
        let payload = json!({ "id": task_id(&self.thread, seq.saturating_sub(1)), "name": leaf, "error": null, "result": result, "interrupts": [] });
        if at.waits {
            // Its interrupts are the pause's actions, whose ids the `pending` frames after
            // it name: written with them at the run's end.
            self.paused_task = Some((payload, seq, ns));
        } else {
            out.extend(node_event(&self.modes, "tasks", "task_result", seq, payload, &ns));
            out.extend(self.checkpoint(&at, next.into_iter().collect(), false, &ns));
            self.checkpointed = true;
        }
        self.task = None;
        self.last = Some(at);
        out
    }

    /// The end of handing node `handing`'s task, which began from checkpoint `from` with
    /// `before` messages, when its agent hands the turn back at checkpoint `at` (the node `leaf`
    /// in namespace `ns`): the agent's reply as its node's update first (as a sub-graph's last
    /// update comes before its node's), then the handing node's update and task result — the
    /// messages the agent added, as the state holds them.
    fn hand_back(
        &mut self,
        handing: &str,
        from: u64,
        before: Option<usize>,
        at: &Checkpoint,
        ns: &str,
        leaf: &str,
    ) -> Vec<Event> {
        let mut out = Vec::new();
        let (written, result) = added_since(at, before);
        let replied = self.reply_node.as_deref().is_some_and(|n| within(n, handing));
        if replied && !self.reply.trim_end().is_empty() {
            let reply = written
                .iter()
                .rev()
                .find(|m| m["type"] == "ai" && m["content"].as_str().is_some_and(|c| !c.is_empty()));
            if let (true, Some(reply), Some(node)) = (self.modes.updates, reply, self.reply_node.clone()) {
                let (inner, replier) = self.place(&node);
                out.push(event(&format!("updates{inner}"), &json!({ replier: { "messages": [reply] } })));
            }
            // Told: the run's end does not tell it again.
            self.reply.clear();
        }
        if self.modes.updates {
            out.push(event(&format!("updates{ns}"), &json!({ leaf: result })));
        }
        let payload = json!({ "id": task_id(&self.thread, from), "name": leaf, "error": null, "result": result, "interrupts": [] });
        out.extend(node_event(&self.modes, "tasks", "task_result", at.seq, payload, ns));
        out
    }

    /// Where the agent that hands back through `node` (`billing/END`) was handed the turn, read
    /// from the store (`at`, the checkpoint its handing node began from) when this writer did
    /// not see the hand-off.
    fn handed_from(&mut self, node: &str, at: Option<Checkpoint>) {
        if let (Some(handing), Some(at)) = (handed_back(node), at) {
            let had = at.values["messages"].as_array().map(Vec::len);
            self.handing.entry(handing.to_owned()).or_insert((at.seq, had));
        }
    }

    /// The result of the node that paused, with the pause's interrupts, once the run ends.
    /// The handing nodes whose agents it paused in end their tasks with the same interrupts,
    /// innermost first, as LangGraph's sub-graph nodes do.
    fn paused_task_result(&mut self) -> Vec<Event> {
        let Some((mut payload, seq, ns)) = self.paused_task.take() else { return Vec::new() };
        let interrupts = Value::Array(std::mem::take(&mut self.interrupts));
        payload["interrupts"] = interrupts.clone();
        let mut out = node_event(&self.modes, "tasks", "task_result", seq, payload, &ns);
        let mut open: Vec<(String, u64)> = self.handing.drain().map(|(node, (from, _))| (node, from)).collect();
        // `billing/refund` is inside `billing`: the longer name first.
        open.sort_by_key(|(node, _)| std::cmp::Reverse(node.len()));
        for (handing, from) in open {
            let (outer, leaf) = self.place(&handing);
            let payload = json!({ "id": task_id(&self.thread, from), "name": leaf, "error": null, "result": {},
                "interrupts": interrupts.clone() });
            out.extend(node_event(&self.modes, "tasks", "task_result", seq, payload, &outer));
        }
        out
    }

    fn frame(&mut self, frame: Frame) -> Step {
        if self.ended {
            return Step::Events(Vec::new());
        }
        let id = self.message_id();
        let mut out = Vec::new();
        match frame {
            Frame::Token { content } => {
                // The reply is the words of the last node that spoke (a node after it may say
                // nothing: a hand-off's way back, a check).
                if std::mem::take(&mut self.new_node) {
                    self.reply.clear();
                    self.reply_node.clone_from(&self.last_node);
                }
                self.reply.push_str(&content);
                if self.modes.messages {
                    let node = match &self.task {
                        Some((name, _)) => name.clone(),
                        None => self.current("agent").to_owned(),
                    };
                    out.push(self.message_event(&text_chunk(&content, &id), &node));
                }
            }
            Frame::ToolCall { call_id, name, arguments } => {
                let call = tool_call(&json!({ "id": call_id, "name": name, "arguments": arguments }));
                let ai = ai_message("", &id, vec![call.clone()]);
                // Words before a call are not the reply.
                self.reply.clear();
                if let Some(values) = self.so_far.as_mut() {
                    // One model step's calls are one message, as the state holds them.
                    match values["messages"].as_array_mut() {
                        Some(messages) if self.calling => {
                            if let Some(calls) = messages.last_mut().and_then(|m| m["tool_calls"].as_array_mut()) {
                                calls.push(call.clone());
                            }
                        }
                        Some(messages) => {
                            let at = format!("{}-{}", self.thread, messages.len());
                            messages.push(ai_message("", &at, vec![call.clone()]));
                        }
                        None => {}
                    }
                    self.calling = true;
                    self.sent = false;
                }
                // The call is the model's step (`agent`, as a ReAct agent's), in the namespace of
                // the node that runs it.
                let node = self.current("agent").to_owned();
                let (ns, _) = self.place(&node);
                if self.modes.updates {
                    out.push(event(&format!("updates{ns}"), &json!({ "agent": { "messages": [ai] } })));
                }
                if self.modes.messages {
                    let pieces = vec![
                        json!({ "name": name, "args": arguments.to_string(), "id": call_id, "index": 0, "type": "tool_call_chunk" }),
                    ];
                    let chunk = ai_chunk("", &id, vec![call], pieces);
                    out.push(self.message_event(&chunk.to_string(), &node));
                }
                self.message += 1;
            }
            Frame::ToolResult { call_id, name, ok, outcome } => {
                let content = match outcome {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                let tool = tool_message(&content, &format!("{id}-{call_id}"), &json!(call_id), &json!(name), ok);
                let node = self.current("tools").to_owned();
                let (ns, _) = self.place(&node);
                let values_event = format!("values{ns}");
                if let Some(values) = self.so_far.as_mut() {
                    // The model's step of calls is whole once its first result comes: its values
                    // first, as LangGraph sends them after the step.
                    if std::mem::take(&mut self.calling) && self.modes.values {
                        out.push(event(&values_event, values));
                    }
                }
                if self.modes.updates {
                    out.push(event(&format!("updates{ns}"), &json!({ "tools": { "messages": [tool] } })));
                }
                if let Some(values) = self.so_far.as_mut()
                    && let Some(messages) = values["messages"].as_array_mut()
                {
                    let mut kept = tool.clone();
                    kept["id"] = Value::String(format!("{}-{}", self.thread, messages.len()));
                    messages.push(kept);
                    if self.modes.values {
                        out.push(event(&values_event, values));
                        self.sent = values_event == "values";
                    }
                }
                if self.modes.messages {
                    out.push(self.message_event(&tool.to_string(), &node));
                }
            }
            Frame::NodeStarted { node, step, from } => {
                self.new_node = true;
                self.last_node = Some(node.clone());
                // A handing node whose start is not in the frames (a resumed run, a join) began
                // at its last start in the thread's checkpoints before this node's, else just
                // before its agent's first node.
                let mut at = 0;
                while let Some(slash) = node[at..].find('/') {
                    at += slash;
                    let handing = &node[..at];
                    if !self.starts.contains_key(handing) {
                        let before = self.history.iter().rev().find(|(n, seq)| n == handing && *seq < from);
                        self.starts.insert(handing.to_owned(), before.map_or(from.saturating_sub(1), |(_, seq)| *seq));
                    }
                    at += 1;
                }
                self.starts.insert(node.clone(), from);
                if self.modes.of_nodes() {
                    return Step::Started { node, step, from, known: self.knows(from) };
                }
            }
            // With sub-graphs namespaced, a hand-off and its way back make the handing node's
            // update, as a sub-graph node's.
            Frame::NodeFinished { node, checkpoint, next, .. }
                if self.modes.of_nodes()
                    || (self.modes.subgraphs
                        && self.modes.updates
                        && (handed_back(&node).is_some() || hands_off(&node, next.as_deref()))) =>
            {
                let back = handed_back(&node).filter(|_| self.modes.subgraphs);
                // A hand-back is told from where its hand-off began, not from the checkpoint
                // before it: read from the store when this writer did not see the hand-off.
                let known = back.is_some() || self.knows(checkpoint.saturating_sub(1));
                let handed_at =
                    back.filter(|h| !self.handing.contains_key(*h)).and_then(|h| self.starts.get(h).copied());
                return Step::Finished { node, seq: checkpoint, next, known, handed_at };
            }
            // A declared graph's channel writes: the node's update, as LangGraph streams every
            // node's; then, for a client of `values` from the run's start, the values the
            // node's checkpoint holds (its channels, and messages a node adds without frames)
            // — the values so far from there on, as LangGraph sends them after each step.
            Frame::StateUpdate { node, checkpoint, writes } => {
                let (ns, leaf) = self.place(&node);
                let wrote = match writes {
                    Value::Object(wrote) => wrote,
                    _ => Map::new(),
                };
                if self.modes.updates {
                    out.push(event(&format!("updates{ns}"), &json!({ leaf: { "channels": wrote } })));
                }
                self.wrote = Some((node, wrote));
                if self.modes.values && self.so_far.is_some() {
                    return Step::Wrote(out, checkpoint, ns);
                }
            }
            Frame::Custom { data, .. } if self.modes.custom => {
                let (ns, _) = self.place(self.current(""));
                out.push(event(&format!("custom{ns}"), &data));
            }
            Frame::Pending(action) => self.interrupts.push(interrupt(&action)),
            Frame::Done { .. } => {
                self.ended = true;
                let paused = !self.interrupts.is_empty();
                out.extend(self.paused_task_result());
                if !paused {
                    // The reply as its node's update, as LangGraph sends the model's last step.
                    let reply = self.reply.trim_end();
                    if self.modes.updates && !reply.is_empty() {
                        let (ns, node) = self.place(self.reply_node.as_deref().unwrap_or("agent"));
                        let ai = ai_message(reply, &format!("run-{}-{}", self.run_id, self.message), Vec::new());
                        out.push(event(&format!("updates{ns}"), &json!({ node: { "messages": [ai] } })));
                    }
                }
                // The writer ends here: its values so far are what the run's end compares.
                let sent = if self.sent { self.so_far.take() } else { None };
                let finish = Finish { modes: self.modes, checkpointed: self.checkpointed, sent };
                return Step::End(out, finish);
            }
            Frame::Error { message } => {
                self.ended = true;
                // A node that paused before the run failed still ended, with what it asked.
                out.extend(self.paused_task_result());
                out.push(event("error", &json!({ "error": "RunError", "message": message })));
                return Step::Failed(out);
            }
            _ => {}
        }
        Step::Events(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal's field and text, as the client reads them.
    fn refused(asked: Value) -> String {
        let Err(e) = modes(Some(&asked)) else { panic!("{asked} was taken") };
        e.message
    }

    #[test]
    fn a_text_chunk_is_written_as_ai_chunk_writes_it() {
        for content in ["Hola", "", "dice \"sí\"\n\ty \\ más", "😀 ünïcode \u{1}", "</script>"] {
            let id = "run-7c0e-1";
            assert_eq!(
                text_chunk(content, id),
                ai_chunk(content, id, Vec::new(), Vec::new()).to_string(),
                "{content:?}"
            );
        }
    }

    #[test]
    fn a_sub_graphs_checkpoint_names_the_checkpoints_of_the_graphs_around_it() {
        let thread = "6f1c0e6a-52d4-4c3e-9a7e-0b3a1d2c4e5f";
        assert_eq!(parents(""), json!({}), "a checkpoint at the top is under none");
        let one = format!("|billing:{}", task_id(thread, 4));
        assert_eq!(parents(&one), json!({"": "4"}));
        let two = format!("{one}|refund:{}", task_id(thread, 7));
        assert_eq!(parents(&two), json!({"": "4", format!("billing:{thread}-4"): "7"}));
    }

    #[test]
    fn modes_are_names_of_served_modes() {
        let every = modes(Some(&json!(MODES))).unwrap();
        assert!(every.values && every.updates && every.messages && every.of_nodes() && every.checkpointed());
        let one = modes(Some(&json!("custom"))).unwrap();
        assert!(one.of_nodes() && !one.checkpointed() && !one.values);
        assert!(refused(json!(["values", "events"])).contains("`events` is not served"));
        // A list holding something else than names is refused as such, not as a mode named "".
        assert!(refused(json!(["debug", 5])).contains("a mode or a list of modes"));
        assert!(refused(json!({"mode": "debug"})).contains("a mode or a list of modes"));
    }
}
