//! LangGraph's threads (docs/langgraph.md, "Threads"): a client's handle on a conversation,
//! made before its first run names the agent. Create, get, search, count, update, delete, and
//! the thread's state and history, the conversation's messages as LangChain's.
//!
//! Owns: the thread and thread-state shapes LangGraph's SDKs read. Who is asking is read as on
//! the other doors ([`asking`]); the conversations are the [`ChatService`]'s.

use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{Asking, asking, json_body};
use crate::openapi::{LANGGRAPH, Refusals, ThreadState};
use crate::service::ChatService;
use crate::wire::PendingActionDto;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgraph_conversations::Thread;
use toolgraph_protocol::ConversationId;

/// Longest thread id a client may choose.
const MAX_THREAD_ID: usize = 128;

/// Most bytes a thread's metadata may take, as JSON.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// Most messages one state update adds.
const MAX_UPDATE_MESSAGES: usize = 32;

/// Most states one history answers (each is folded from the thread's first checkpoint).
const MAX_HISTORY: usize = 100;

/// `metadata`, or 422 when it is larger than [`MAX_METADATA_BYTES`].
fn bounded(metadata: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let size = serde_json::to_vec(&metadata).map_or(usize::MAX, |v| v.len());
    if size > MAX_METADATA_BYTES {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "metadata",
            format!("{size} bytes of JSON; at most {MAX_METADATA_BYTES}"),
        ));
    }
    Ok(metadata)
}

/// `ms` since the epoch in RFC 3339, as LangGraph's timestamps are.
pub(super) fn rfc3339(ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    // Formatting a time as RFC 3339 fails only for years outside 0..=9999.
    at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Who asks on a thread or run route — read as on the other header doors ([`asking`]) — or 501
/// when the store keeps no threads.
pub(crate) struct Asker(pub Asking);

impl FromRequestParts<AppState> for Asker {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Self::Rejection> {
        if !app.chat().keeps_threads() {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "this server's conversation store keeps no threads: serve with server.store = \"sqlite\" or \"postgres\"",
            ));
        }
        let caller = parts
            .extensions
            .get::<Caller>()
            .ok_or_else(|| ApiError::internal("a thread route is served outside the authentication layer"))?;
        Ok(Self(asking(caller, &parts.headers, None)?))
    }
}

/// Thread `id` of the asker, or 404 naming it.
pub(super) async fn theirs(chat: &ChatService, who: &Asking, id: &str) -> Result<Thread, ApiError> {
    chat.thread(&who.principal, id).await.map_err(|e| match e {
        crate::error::ChatError::NotFound => {
            ApiError::field(StatusCode::NOT_FOUND, "thread_id", format!("no thread '{}' of yours", super::echoed(id)))
        }
        e => e.into(),
    })
}

/// What a thread's conversation is now: its last checkpoint's state, what it waits on.
pub(super) struct Now {
    /// The agent's state (`messages` as LangChain's, `context`, a declared graph's channels).
    pub values: Value,
    /// The node that runs next (empty when idle).
    pub next: Vec<String>,
    /// The undecided actions it paused for.
    pub awaiting: Vec<PendingActionDto>,
    /// The last checkpoint's number (0 before the first run).
    pub seq: u64,
    /// Whether a run holds it, on this replica or another.
    pub busy: bool,
}

impl Now {
    /// A thread before its first run.
    pub fn empty() -> Self {
        Self { values: json!({ "messages": [] }), next: Vec::new(), awaiting: Vec::new(), seq: 0, busy: false }
    }
}

/// `thread`'s conversation as it is now (empty before its first run).
pub(super) async fn now(chat: &ChatService, who: &Asking, thread: &Thread) -> Result<Now, ApiError> {
    let Some(conversation) = thread.conversation else {
        return Ok(Now::empty());
    };
    let conversation = ConversationId(conversation);
    let head = match chat.head_checkpoint(&who.principal, conversation).await {
        Ok(head) => head,
        // Deleted on the academy routes: the thread goes with it.
        Err(crate::error::ChatError::NotFound) => None,
        Err(e) => return Err(e.into()),
    };
    let here = chat.running_run(&who.principal, conversation).is_some();
    let Some(head) = head else {
        return Ok(Now { busy: here, ..Now::empty() });
    };
    // A run of another replica: its last checkpoint has a node still to run, and is no pause.
    // (A resume's decision record, every interrupt decided, is a run too: it runs the tools —
    // unless no run took them over, and the pause's actions wait again.)
    let awaiting = chat.awaiting(&who.principal, conversation).await?;
    let busy = here || (head.at.next.is_some() && !head.at.undecided() && awaiting.is_empty());
    let values = shown(&thread.id, head.at.state);
    Ok(Now { values, next: head.at.next.into_iter().collect(), awaiting, seq: head.at.seq, busy })
}

/// The agent's `state` as a thread's values: its messages as LangChain's, without the turn's
/// bookkeeping (failed tool rounds, approved calls not yet run).
pub(super) fn shown(thread: &str, mut state: Value) -> Value {
    if let Some(messages) = state.get("messages").and_then(Value::as_array) {
        state["messages"] = Value::Array(langchain_messages(thread, messages));
    }
    if let Some(fields) = state.as_object_mut() {
        fields.remove("tool_failures");
        fields.remove("approved");
        fields.remove("edited");
    }
    state
}

/// LangChain's human message, as its JSON has every field.
pub(super) fn human_message(content: &str, id: &str) -> Value {
    json!({ "type": "human", "content": content, "id": id, "name": null, "additional_kwargs": {}, "response_metadata": {} })
}

/// LangChain's AI message with its text and `calls` (LangChain's `{name, args, id}`); what the
/// model reported of itself (`response_metadata`, `usage_metadata`) is the service's, not the
/// thread's.
pub(super) fn ai_message(content: &str, id: &str, calls: Vec<Value>) -> Value {
    json!({ "type": "ai", "content": content, "id": id, "name": null, "tool_calls": calls, "invalid_tool_calls": [],
            "additional_kwargs": {}, "response_metadata": {}, "usage_metadata": null })
}

/// LangChain's tool message: the result of call `call_id` of tool `name`.
pub(super) fn tool_message(content: &str, id: &str, call_id: &Value, name: &Value, ok: bool) -> Value {
    json!({ "type": "tool", "content": content, "id": id, "tool_call_id": call_id, "name": name,
            "status": if ok { "success" } else { "error" }, "artifact": null, "additional_kwargs": {}, "response_metadata": {} })
}

/// The conversation's messages (as the agent's state holds them) as LangChain's: `human`,
/// `ai` with its `tool_calls`, `tool`; ids stable per position in the thread.
pub(super) fn langchain_messages(thread: &str, messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let id = format!("{thread}-{i}");
            let content = m["content"].as_str().unwrap_or_default();
            Some(match m["role"].as_str()? {
                "user" => human_message(content, &id),
                "assistant" => {
                    let calls: Vec<Value> = m["tool_calls"]
                        .as_array()
                        .map(|calls| calls.iter().map(tool_call).collect())
                        .unwrap_or_default();
                    ai_message(content, &id, calls)
                }
                "tool" => tool_message(content, &id, &m["tool_call_id"], &m["name"], true),
                // The system prompt is the agent's, not the conversation's.
                _ => return None,
            })
        })
        .collect()
}

/// A model's tool call (`{id, name, arguments}` as JSON text) as LangChain's `{name, args, id}`.
pub(super) fn tool_call(call: &Value) -> Value {
    let args = match &call["arguments"] {
        Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| json!({})),
        other => other.clone(),
    };
    json!({ "name": call["name"], "args": args, "id": call["id"], "type": "tool_call" })
}

/// An undecided action as LangGraph's interrupt: an approval in LangChain's human-in-the-loop
/// shape (`action_requests`, `review_configs`), a question as its text and form.
pub(super) fn interrupt(action: &PendingActionDto) -> Value {
    if action.tool_name == crate::agui::ASK {
        return json!({
            "id": format!("{}{}", crate::agui::QUESTION, action.message_id),
            "value": { "question": action.description, "form": action.arguments },
        });
    }
    json!({
        "id": format!("{}{}", crate::agui::APPROVAL, action.message_id),
        "value": {
            "action_requests": [{ "name": action.tool_name, "args": action.arguments, "description": action.description }],
            "review_configs": [{ "action_name": action.tool_name, "allowed_decisions": ["approve", "edit", "reject", "respond"] }],
        },
    })
}

/// `thread` as LangGraph's `Thread`.
pub(super) fn shape(thread: &Thread, now: &Now) -> Value {
    let interrupts: Vec<Value> = now.awaiting.iter().map(interrupt).collect();
    // Keyed by the task that waits, as the state's `tasks` name it.
    let waiting = if interrupts.is_empty() { json!({}) } else { json!({ task_id(&thread.id, now.seq): interrupts }) };
    json!({
        "thread_id": thread.id,
        "created_at": rfc3339(thread.created_at_ms),
        "updated_at": rfc3339(thread.updated_at_ms),
        "state_updated_at": rfc3339(thread.updated_at_ms),
        "metadata": thread.metadata,
        "status": match (now.busy, interrupts.is_empty()) {
            (true, _) => "busy",
            (false, true) => "idle",
            (false, false) => "interrupted",
        },
        "values": now.values,
        "interrupts": waiting,
        // LangGraph's server answers this once the thread has run.
        "config": if thread.conversation.is_some() { json!({ "configurable": {} }) } else { json!({}) },
        "error": null,
    })
}

/// The id of the task that runs from checkpoint `seq` of `thread` (what a pause waits in, and
/// each task a run streams).
pub(super) fn task_id(thread: &str, seq: u64) -> String {
    format!("{thread}-{seq}")
}

/// `thread`'s state as LangGraph's `ThreadState`.
pub(super) fn state(thread: &Thread, now: &Now) -> Value {
    let interrupts: Vec<Value> = now.awaiting.iter().map(interrupt).collect();
    let tasks: Vec<Value> = now
        .next
        .iter()
        .map(|node| {
            json!({ "id": task_id(&thread.id, now.seq), "name": node, "path": ["__pregel_pull", node], "interrupts": interrupts,
                    "checkpoint": null, "state": null, "error": null, "result": null })
        })
        .collect();
    json!({
        "values": now.values,
        "next": now.next,
        "tasks": tasks,
        "interrupts": interrupts,
        "metadata": { "step": now.seq },
        "checkpoint": checkpoint_of(&thread.id, now.seq),
        "checkpoint_id": now.seq.to_string(),
        "parent_checkpoint": null,
        "parent_checkpoint_id": null,
        "created_at": rfc3339(thread.updated_at_ms),
    })
}

/// `POST /threads`: what it reads.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(as = ThreadCreate)]
#[schema(example = json!({"metadata": {"course": "iv"}}))]
struct Create {
    /// 1 to 128 bytes, without `/` or control characters (a new UUID when left out).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 128)]
    thread_id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::IfExists>)]
    if_exists: Option<String>,
}

/// `POST /threads`.
#[utoipa::path(post, path = "/threads", tag = LANGGRAPH, request_body(content = Option<Create>, description = "Optional."),
    responses((status = 200, description = "The thread.", body = crate::openapi::Thread), Refusals))]
pub(crate) async fn create(State(app): State<AppState>, Asker(who): Asker, body: Bytes) -> Result<Response, ApiError> {
    let req: Create = if body.iter().all(u8::is_ascii_whitespace) { Create::default() } else { json_body(&body)? };
    let id = match req.thread_id {
        Some(id) if id.is_empty() || id.len() > MAX_THREAD_ID || id.chars().any(|c| c.is_control() || c == '/') => {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "thread_id",
                format!("1 to {MAX_THREAD_ID} characters, no `/` or control characters"),
            ));
        }
        Some(id) => id,
        None => uuid::Uuid::new_v4().to_string(),
    };
    let Some(thread) =
        app.chat().create_thread(&who.principal, id.clone(), bounded(req.metadata.unwrap_or_default())?).await?
    else {
        let mine = app.chat().thread(&who.principal, &id).await.ok();
        return match (req.if_exists.as_deref(), mine) {
            (Some("do_nothing"), Some(existing)) => {
                let now = now(app.chat(), &who, &existing).await?;
                Ok(axum::Json(shape(&existing, &now)).into_response())
            }
            _ => Err(ApiError::field(StatusCode::CONFLICT, "thread_id", format!("thread '{id}' exists"))),
        };
    };
    Ok(axum::Json(shape(&thread, &Now::empty())).into_response())
}

/// A new thread of `who`'s, without metadata (a stateless run's).
///
/// # Errors
/// The store's.
pub(super) async fn made(chat: &ChatService, who: &Asking) -> Result<Thread, ApiError> {
    // A fresh UUID is never taken.
    chat.create_thread(&who.principal, uuid::Uuid::new_v4().to_string(), Map::new())
        .await?
        .ok_or_else(|| ApiError::internal("a new thread id was taken"))
}

/// `GET /threads/{thread_id}`.
#[utoipa::path(get, path = "/threads/{thread_id}", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")),
    responses((status = 200, description = "The thread.", body = crate::openapi::Thread), Refusals))]
pub(crate) async fn get(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let now = now(app.chat(), &who, &thread).await?;
    Ok(axum::Json(shape(&thread, &now)).into_response())
}

/// `POST /threads/{thread_id}/copy`: a new thread of the asker's with the same metadata and a
/// copy of the conversation as it is now (its checkpoints and messages; the original is left as
/// it is). A thread paused for a decision is not copied (409): its pending actions are the
/// original's.
#[utoipa::path(post, path = "/threads/{thread_id}/copy", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")),
    responses((status = 200, description = "The copy.", body = crate::openapi::Thread), Refusals))]
pub(crate) async fn copy(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
) -> Result<Response, ApiError> {
    let original = theirs(app.chat(), &who, &id).await?;
    let mut thread = made(app.chat(), &who).await?;
    let copied = async {
        let conversation = match original.conversation {
            Some(c) => {
                let seq = now(app.chat(), &who, &original).await?.seq;
                if seq == 0 { None } else { Some(app.chat().fork(&who.principal, ConversationId(c), seq).await?) }
            }
            None => None,
        };
        app.chat().update_thread(&who.principal, &thread.id, Some(&original.metadata), conversation).await?;
        Ok::<_, ApiError>(())
    };
    if let Err(e) = copied.await {
        // Nothing half-made stays.
        let _ = app.chat().delete_thread(&who.principal, &thread.id).await;
        return Err(e);
    }
    thread = theirs(app.chat(), &who, &thread.id).await?;
    let now = now(app.chat(), &who, &thread).await?;
    Ok(axum::Json(shape(&thread, &now)).into_response())
}

/// `PATCH /threads/{thread_id}`: what it reads.
#[derive(Deserialize, utoipa::ToSchema)]
struct ThreadPatch {
    /// Merged into the thread's.
    #[serde(default)]
    #[schema(value_type = Object)]
    metadata: Map<String, Value>,
}

/// `PATCH /threads/{thread_id}`: its metadata merged with the body's.
#[utoipa::path(patch, path = "/threads/{thread_id}", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")), request_body = ThreadPatch,
    responses((status = 200, description = "The thread.", body = crate::openapi::Thread), Refusals))]
pub(crate) async fn update(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ThreadPatch = json_body(&body)?;
    let thread = theirs(app.chat(), &who, &id).await?;
    let mut metadata = thread.metadata.clone();
    metadata.extend(req.metadata);
    let metadata = bounded(metadata)?;
    app.chat().update_thread(&who.principal, &id, Some(&metadata), None).await?;
    let thread = theirs(app.chat(), &who, &id).await?;
    let now = now(app.chat(), &who, &thread).await?;
    Ok(axum::Json(shape(&thread, &now)).into_response())
}

/// `DELETE /threads/{thread_id}`: the thread, its conversation, checkpoints and runs.
#[utoipa::path(delete, path = "/threads/{thread_id}", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")),
    responses((status = 204, description = "Deleted, with its conversation, checkpoints and runs."), Refusals))]
pub(crate) async fn delete(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
) -> Result<Response, ApiError> {
    theirs(app.chat(), &who, &id).await?;
    app.chat().delete_thread(&who.principal, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /threads/search` and `/threads/count`: what they read.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ThreadSearch)]
struct Search {
    #[serde(default)]
    #[schema(value_type = Object)]
    metadata: Map<String, Value>,
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::ThreadStatus>)]
    status: Option<String>,
    #[serde(default = "ten")]
    #[schema(minimum = 1, maximum = 1000)]
    limit: usize,
    #[serde(default)]
    offset: usize,
}

fn ten() -> usize {
    10
}

/// The asker's threads `search` matches, the latest changed first (of their newest
/// [`THREADS_READ`](toolgraph_conversations::THREADS_READ)).
async fn matching(app: &AppState, who: &Asking, body: &Bytes) -> Result<(Search, Vec<Thread>), ApiError> {
    let search: Search = if body.iter().all(u8::is_ascii_whitespace) { json_body(b"{}")? } else { json_body(body)? };
    if search.limit == 0 || search.limit > 1_000 {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "limit", "between 1 and 1000"));
    }
    if let Some(s) = &search.status
        && !["idle", "busy", "interrupted"].contains(&s.as_str())
    {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "status",
            format!("idle, busy or interrupted (`{s}` is not tracked)"),
        ));
    }
    let mut found = Vec::new();
    for thread in app.chat().threads(&who.principal).await? {
        if !search.metadata.iter().all(|(k, v)| thread.metadata.get(k) == Some(v)) {
            continue;
        }
        if let Some(wanted) = &search.status {
            // What runs on it and what it waits for tell; its state is read for the page only.
            let (busy, waits) = match thread.conversation.map(ConversationId) {
                Some(c) => {
                    let busy = app.chat().run_in_progress(&who.principal, c).await.unwrap_or(false);
                    let awaiting = app.chat().awaiting(&who.principal, c).await;
                    (busy, awaiting.map(|a| !a.is_empty()).unwrap_or(false))
                }
                None => (false, false),
            };
            // What waits for a person first: a decision record of a pause not yet all decided
            // has a node to run, as a resumed run's has.
            let status = match (busy, waits) {
                (_, true) => "interrupted",
                (true, false) => "busy",
                (false, false) => "idle",
            };
            if wanted != status {
                continue;
            }
        }
        found.push(thread);
    }
    Ok((search, found))
}

/// What `thread` is now, for a list: empty when it cannot be read (its agent was removed from
/// the configuration), so one thread does not fail the list.
async fn listed(app: &AppState, who: &Asking, thread: &Thread) -> Now {
    match now(app.chat(), who, thread).await {
        Ok(now) => now,
        Err(e) => {
            tracing::warn!(thread = %thread.id, error = %e.message, "a thread's state cannot be read; listed without it");
            Now::empty()
        }
    }
}

/// `POST /threads/search`.
#[utoipa::path(post, path = "/threads/search", tag = LANGGRAPH, request_body(content = Option<Search>, description = "Optional."),
    responses((status = 200, description = "The asker's threads, the latest changed first.", body = Vec<crate::openapi::Thread>), Refusals))]
pub(crate) async fn search(State(app): State<AppState>, Asker(who): Asker, body: Bytes) -> Result<Response, ApiError> {
    let (search, found) = matching(&app, &who, &body).await?;
    let mut page = Vec::new();
    for thread in found.iter().skip(search.offset).take(search.limit) {
        page.push(shape(thread, &listed(&app, &who, thread).await));
    }
    Ok(axum::Json(page).into_response())
}

/// `POST /threads/count`.
#[utoipa::path(post, path = "/threads/count", tag = LANGGRAPH, request_body(content = Option<Search>, description = "Optional."),
    responses((status = 200, description = "How many match.", content_type = "application/json", body = u64), Refusals))]
pub(crate) async fn count(State(app): State<AppState>, Asker(who): Asker, body: Bytes) -> Result<Response, ApiError> {
    let (_, found) = matching(&app, &who, &body).await?;
    Ok(axum::Json(found.len()).into_response())
}

/// `GET /threads/{thread_id}/state`.
#[utoipa::path(get, path = "/threads/{thread_id}/state", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")),
    responses((status = 200, description = "Its state now.", body = ThreadState), Refusals))]
pub(crate) async fn get_state(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
) -> Result<Response, ApiError> {
    let thread = theirs(app.chat(), &who, &id).await?;
    let now = now(app.chat(), &who, &thread).await?;
    let mut shown = state(&thread, &now);
    // The last checkpoint's metadata and parent, as the history shows them: read from the one
    // before it on, unless retention folded that one away (then the whole list says which).
    if let Some(conversation) = thread.conversation
        && now.seq > 0
    {
        let conversation = ConversationId(conversation);
        let from = now.seq.saturating_sub(1).max(1);
        let mut metas = app.chat().checkpoints_from(&who.principal, conversation, from).await?;
        if now.seq > 1 && metas.first().is_none_or(|m| m.seq != from) {
            metas = app.chat().checkpoints(&who.principal, conversation).await?;
        }
        if let Some(at) = metas.iter().position(|m| m.seq == now.seq) {
            shown["metadata"] = checkpoint_metadata(&metas[at]);
            shown["created_at"] = json!(rfc3339(metas[at].created_at_ms));
            if let Some(parent) = at.checked_sub(1).map(|p| metas[p].seq) {
                shown["parent_checkpoint"] = checkpoint_of(&thread.id, parent);
                shown["parent_checkpoint_id"] = json!(parent.to_string());
            }
        }
    }
    Ok(axum::Json(shown).into_response())
}

/// A checkpoint's metadata as LangGraph's: its step, the run that wrote it, the node (`source`)
/// and the version of the graph.
fn checkpoint_metadata(meta: &toolgraph_graph::CheckpointMeta) -> Value {
    json!({ "step": meta.seq, "run_id": meta.run_id, "source": meta.node, "graph_version": meta.graph_version })
}

/// Checkpoint `seq` of `thread` as LangGraph's `{thread_id, checkpoint_ns, checkpoint_id}`.
pub(super) fn checkpoint_of(thread: &str, seq: u64) -> Value {
    json!({ "thread_id": thread, "checkpoint_ns": "", "checkpoint_id": seq.to_string() })
}

/// `POST /threads/{thread_id}/state`: what it reads.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = ThreadStateUpdate)]
#[schema(example = json!({"values": {"messages": [{"type": "ai", "content": "The exam is on 20 January."}]}, "as_node": "agent"}))]
struct StateUpdate {
    /// The channels to write: `messages` (LangChain's, or `{role, content}`), appended, and
    /// `channels`, a declared graph's writable channels by name, each by its reducer.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    values: Option<Value>,
    /// The node the update is recorded as written by: one of the assistant's graph's.
    #[serde(default)]
    #[schema(min_length = 1)]
    as_node: Option<String>,
    /// The checkpoint to update from: the thread's last, or an earlier one (the thread forks
    /// there first).
    #[serde(default)]
    checkpoint_id: Option<String>,
    /// The same, as LangGraph's `{checkpoint_id}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    checkpoint: Option<Value>,
}

/// The checkpoint a request names by `checkpoint_id` or `checkpoint.checkpoint_id`, if any.
pub(super) fn named_checkpoint(id: Option<&str>, checkpoint: Option<&Value>) -> Result<Option<u64>, ApiError> {
    let nested = match checkpoint {
        None | Some(Value::Null) => None,
        Some(Value::Object(c)) => match c.get("checkpoint_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.as_str()),
            Some(_) => {
                return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "checkpoint.checkpoint_id", "a string"));
            }
        },
        Some(_) => {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "checkpoint",
                "an object with `checkpoint_id`",
            ));
        }
    };
    let (field, id) = match (id, nested) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "checkpoint_id",
                "names another checkpoint than `checkpoint`",
            ));
        }
        (Some(id), _) => ("checkpoint_id", id),
        (None, Some(id)) => ("checkpoint.checkpoint_id", id),
        (None, None) => return Ok(None),
    };
    id.parse::<u64>().map(Some).map_err(|_| {
        ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            field,
            "a checkpoint id of this thread (its number, as the history gives it)",
        )
    })
}

/// A thread moved to a fork of its conversation ([`to_checkpoint`]): where it was, where it is.
#[derive(Debug)]
pub(super) struct Moved {
    from: ConversationId,
    to: ConversationId,
}

/// Moves `thread` to checkpoint `at` when that is not where it is: its conversation is forked
/// there and the thread goes on in the fork (the earlier branch stays a conversation of its
/// own, the thread's until the thread is deleted). Only a checkpoint where a turn ended can be
/// gone back to: one mid-run (a model's tool calls without their results) or a pause waiting
/// for decisions is refused, as is a thread a run holds. What a refused request did is undone
/// with [`undo`].
pub(super) async fn to_checkpoint(
    app: &AppState,
    who: &Asking,
    thread: &mut Thread,
    at: u64,
) -> Result<Option<Moved>, ApiError> {
    let missing = || {
        ApiError::field(
            StatusCode::NOT_FOUND,
            "checkpoint_id",
            format!("thread '{}' has no checkpoint {at}", thread.id),
        )
    };
    let Some(from) = thread.conversation.map(ConversationId) else { return Err(missing()) };
    let head = now(app.chat(), who, thread).await?;
    if head.seq == at {
        return Ok(None);
    }
    if head.busy {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "a run holds this thread: it cannot go back to an earlier checkpoint now",
        ));
    }
    let there = match app.chat().checkpoint(&who.principal, from, at).await {
        Ok(there) => there,
        Err(crate::error::ChatError::NotFound) => return Err(missing()),
        Err(e) => return Err(e.into()),
    };
    if let Some(next) = there.at.next {
        return Err(ApiError::field(
            StatusCode::CONFLICT,
            "checkpoint_id",
            format!(
                "checkpoint {at} is in the middle of a run (its next node is `{next}`): go back to one where a turn ended"
            ),
        ));
    }
    let to = app.chat().fork(&who.principal, from, at).await?;
    if let Err(e) = app.chat().rebind_thread(&who.principal, &thread.id, from, to).await {
        // Nothing half-made stays.
        let _ = app.chat().delete_conversation(&who.principal, to).await;
        return Err(e.into());
    }
    thread.conversation = Some(to.0);
    Ok(Some(Moved { from, to }))
}

/// Puts `thread` back where it was before `moved` (the request that moved it was refused
/// after), deleting the fork.
pub(super) async fn undo(app: &AppState, who: &Asking, thread: &mut Thread, moved: Option<Moved>) {
    let Some(Moved { from, to }) = moved else { return };
    // Another request may have started a run on the fork meanwhile: then the thread stays there.
    if app.chat().run_in_progress(&who.principal, to).await.unwrap_or(true) {
        tracing::warn!(thread = %thread.id, conversation = %to, "a refused request's fork is in use; the thread stays on it");
        return;
    }
    match app.chat().rebind_thread(&who.principal, &thread.id, to, from).await {
        Ok(()) => {
            thread.conversation = Some(from.0);
            if let Err(e) = app.chat().delete_conversation(&who.principal, to).await {
                tracing::warn!(thread = %thread.id, conversation = %to, error = %e, "a refused request's fork stays");
            }
        }
        Err(e) => tracing::warn!(thread = %thread.id, error = %e, "a refused request's move to a fork stays"),
    }
}

/// A client's messages (LangChain's `{type, content, tool_calls, tool_call_id}` or OpenAI's
/// `{role, …}`) as the agent's state holds them. A message whose `id` is one the thread already
/// has would replace it, which an update does not do (it appends): refused.
fn agent_messages(raw: &Value, existing: &[Value]) -> Result<Value, ApiError> {
    let refuse = |i: usize, why: String| {
        ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "values.messages", format!("messages[{i}]: {why}"))
    };
    let items = match raw {
        Value::Array(items) => items.as_slice(),
        Value::Object(_) => std::slice::from_ref(raw),
        _ => return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "values.messages", "a list of messages")),
    };
    if items.len() > MAX_UPDATE_MESSAGES {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "values.messages",
            format!("{} messages: an update adds at most {MAX_UPDATE_MESSAGES}", items.len()),
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let Some(m) = m.as_object() else { return Err(refuse(i, "a message is an object".into())) };
        if let Some(id) = m.get("id").and_then(Value::as_str)
            && existing.iter().any(|e| e["id"].as_str() == Some(id))
        {
            return Err(refuse(
                i,
                format!("the thread has message `{id}`: an update appends messages, it does not replace one"),
            ));
        }
        let kind = m.get("type").or_else(|| m.get("role")).and_then(Value::as_str).unwrap_or("");
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(c) => crate::openai::text_of(c).map_err(|e| refuse(i, e.message))?,
        };
        if content.chars().count() > crate::wire::MAX_MESSAGE_CHARS {
            return Err(refuse(
                i,
                format!("at most {} characters, as a turn's message", crate::wire::MAX_MESSAGE_CHARS),
            ));
        }
        let role = match kind {
            "human" | "user" => "user",
            "ai" | "assistant" => "assistant",
            "tool" => "tool",
            "system" => "system",
            other => return Err(refuse(i, format!("`{other}` is not a message type: human, ai"))),
        };
        // Carried as the agent's state reads messages: which kinds it takes from outside a run
        // (tool calls, a tool's result and a system message it does not) is its to say.
        let mut message = json!({ "role": role, "content": content });
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array).filter(|c| !c.is_empty()) {
            // LangChain's `{id, name, args}`, or OpenAI's `{id, function: {name, arguments}}`.
            let calls = calls.iter().map(|call| {
                let function = call.get("function").unwrap_or(call);
                let arguments = match function.get("args").or_else(|| function.get("arguments")) {
                    Some(Value::String(text)) => text.clone(),
                    Some(args) if !args.is_null() => args.to_string(),
                    _ => "{}".to_owned(),
                };
                json!({ "id": text(call.get("id")), "name": text(function.get("name")), "arguments": arguments })
            });
            message["tool_calls"] = calls.collect();
        }
        if role == "tool" {
            message["tool_call_id"] = text(m.get("tool_call_id")).into();
            message["name"] = text(m.get("name")).into();
        }
        out.push(message);
    }
    Ok(Value::Array(out))
}

/// `POST /threads/{thread_id}/state`: `values` written into the thread's state as node
/// `as_node` had written them — a new checkpoint, its messages in the conversation; the thread
/// stays idle, and its next run starts from the updated state (docs/langgraph.md, "Threads").
#[utoipa::path(post, path = "/threads/{thread_id}/state", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")), request_body = StateUpdate,
    responses((status = 200, description = "The checkpoint the update made.", body = crate::openapi::CheckpointRef), Refusals))]
pub(crate) async fn update_state(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: StateUpdate = json_body(&body)?;
    let mut values = match req.values {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(values)) => values,
        Some(Value::Array(_)) => {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "values",
                "one update, as an object of channels: a list of updates is not taken",
            ));
        }
        Some(_) => return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "values", "an object of channels")),
    };
    let at = named_checkpoint(req.checkpoint_id.as_deref(), req.checkpoint.as_ref())?;
    let mut thread = theirs(app.chat(), &who, &id).await?;
    if thread.conversation.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("thread '{id}' has no run yet: its first run names the assistant whose state an update writes"),
        ));
    }
    let moved = match at {
        Some(at) => to_checkpoint(&app, &who, &mut thread, at).await?,
        None => None,
    };
    let written = async {
        let conversation =
            ConversationId(thread.conversation.ok_or_else(|| ApiError::internal("a thread lost its conversation"))?);
        if let Some(raw) = values.get("messages") {
            let head = now(app.chat(), &who, &thread).await?;
            let existing = head.values["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
            let messages = agent_messages(raw, existing)?;
            values.insert("messages".into(), messages);
        }
        Ok::<_, ApiError>(app.chat().update_state(&who.principal, conversation, &values, req.as_node.as_deref()).await?)
    }
    .await;
    let seq = match written {
        Ok(seq) => seq,
        Err(e) => {
            // A refused update leaves the thread where it was.
            undo(&app, &who, &mut thread, moved).await;
            return Err(e);
        }
    };
    // LangGraph's server answers the checkpoint three ways; its SDKs read any of them.
    let checkpoint = json!({ "thread_id": thread.id, "checkpoint_ns": "", "checkpoint_id": seq.to_string() });
    Ok(axum::Json(json!({ "checkpoint": checkpoint, "configurable": checkpoint, "checkpoint_id": seq.to_string() }))
        .into_response())
}

/// `POST /threads/{thread_id}/history`: what it reads.
#[derive(Deserialize, utoipa::ToSchema)]
struct HistoryRequest {
    /// At most this many checkpoints (10).
    #[serde(default = "ten")]
    #[schema(minimum = 1, maximum = 100)]
    limit: usize,
}

/// `POST /threads/{thread_id}/history` (and `GET`): the thread's checkpoints, newest first, as
/// LangGraph's `ThreadState`s — the state each left, at most `limit` (default 10).
#[utoipa::path(method(get, post), path = "/threads/{thread_id}/history", tag = LANGGRAPH, params(("thread_id" = String, Path, description = "The thread.")),
    request_body(content = Option<HistoryRequest>, description = "Optional, and read on POST only."),
    responses((status = 200, description = "Its checkpoints, newest first.", body = Vec<ThreadState>), Refusals))]
pub(crate) async fn history(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: HistoryRequest =
        if body.iter().all(u8::is_ascii_whitespace) { HistoryRequest { limit: ten() } } else { json_body(&body)? };
    if req.limit == 0 || req.limit > MAX_HISTORY {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "limit", format!("between 1 and {MAX_HISTORY}")));
    }
    let thread = theirs(app.chat(), &who, &id).await?;
    let Some(conversation) = thread.conversation else { return Ok(axum::Json(Vec::<Value>::new()).into_response()) };
    let conversation = ConversationId(conversation);
    let checkpoints = app.chat().checkpoints(&who.principal, conversation).await?;
    let mut states = Vec::new();
    // The parent is the checkpoint before, not `seq - 1`: a compacted thread starts later
    // (docs/service.md, "Retention").
    let parents = std::iter::once(None).chain(checkpoints.iter().map(|m| Some(m.seq)));
    let mut with_parents: Vec<_> = checkpoints.iter().zip(parents).collect();
    with_parents.reverse();
    with_parents.truncate(req.limit);
    let seqs: Vec<u64> = with_parents.iter().map(|(meta, _)| meta.seq).collect();
    let views = app.chat().checkpoints_at(&who.principal, conversation, &seqs).await?;
    for ((meta, parent), view) in with_parents.into_iter().zip(views) {
        let at = view.at;
        let values = shown(&thread.id, at.state);
        let next: Vec<String> = at.next.into_iter().collect();
        states.push(json!({
            "values": values,
            "next": next,
            "tasks": [],
            "metadata": checkpoint_metadata(meta),
            "checkpoint": checkpoint_of(&thread.id, meta.seq),
            "checkpoint_id": meta.seq.to_string(),
            "parent_checkpoint": parent.map(|p| checkpoint_of(&thread.id, p)),
            "parent_checkpoint_id": parent.map(|p| p.to_string()),
            "interrupts": [],
            "created_at": rfc3339(meta.created_at_ms),
        }));
    }
    Ok(axum::Json(states).into_response())
}
