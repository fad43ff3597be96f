//! LangGraph's Agent Server API, the part served so far (docs/langgraph.md): its assistants
//! here — each configured agent is one, `assistant_id` and `graph_id` its name, that LangGraph's
//! SDKs search, count and read with its graph and schemas — its [`threads`] and the [`runs`] on
//! them (stateless runs too), and the asking person's [`store`] of items.
//!
//! Owns: the assistants' shapes as LangGraph's SDKs read them. The agents are the
//! [`ChatService`](crate::ChatService)'s.

pub(crate) mod runs;
pub(crate) mod store;
pub(crate) mod threads;

use crate::AppState;
use crate::error::ApiError;
pub(crate) use crate::error::echoed;
use crate::extract::json_body;
use crate::openapi::{Assistant, AssistantGraph, AssistantSchemas, LANGGRAPH, Refusals};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use toolgraph_graph::{EdgeKind, GraphShape};

/// When the assistants were made: the process's start (they are its configuration), in RFC 3339.
static STARTED: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn started() -> &'static str {
    STARTED.get_or_init(|| {
        let now = time::OffsetDateTime::now_utc();
        // Formatting a UTC time as RFC 3339 fails only for years outside 0..=9999.
        now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
    })
}

/// An agent as LangGraph's `Assistant`.
fn assistant(name: &str, version: Option<&str>) -> Value {
    json!({
        "assistant_id": name,
        "graph_id": name,
        "name": name,
        "description": null,
        "config": {},
        "context": {},
        "metadata": { "graph_version": version },
        "version": 1,
        "created_at": started(),
        "updated_at": started(),
    })
}

/// `POST /assistants/search` and `/assistants/count`: what they read.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(as = AssistantSearch)]
struct Search {
    #[serde(default)]
    #[schema(value_type = Object)]
    metadata: Map<String, Value>,
    #[serde(default)]
    graph_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default = "ten")]
    #[schema(minimum = 1, maximum = 1000)]
    limit: usize,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    sort_order: Option<String>,
}

fn ten() -> usize {
    10
}

/// The assistants `search` matches, by name (`sort_order = "desc"` reverses it).
fn matching(app: &AppState, search: &Search) -> Vec<Value> {
    let (agents, _) = app.chat().agents();
    let mut found: Vec<Value> = agents
        .iter()
        .filter(|(name, _)| search.graph_id.as_ref().is_none_or(|g| g == name))
        .filter(|(name, _)| search.name.as_ref().is_none_or(|n| name.to_lowercase().contains(&n.to_lowercase())))
        .map(|(name, revision)| assistant(name, revision.version.as_deref()))
        .filter(|a| search.metadata.iter().all(|(k, v)| a["metadata"].get(k) == Some(v)))
        .collect();
    if search.sort_order.as_deref() == Some("desc") {
        found.reverse();
    }
    found
}

fn read_search(body: &Bytes) -> Result<Search, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Search { limit: ten(), ..Search::default() });
    }
    let search: Search = json_body(body)?;
    if search.limit == 0 || search.limit > 1_000 {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "limit", "between 1 and 1000"));
    }
    Ok(search)
}

/// `POST /assistants/search`: a page of them, with `X-Pagination-Next` when there are more.
#[utoipa::path(post, path = "/assistants/search", tag = LANGGRAPH, request_body(content = Option<Search>, description = "Optional: an empty body lists them all."),
    responses((status = 200, description = "A page of them; `X-Pagination-Next` when there are more.", body = Vec<Assistant>), Refusals))]
pub(crate) async fn search(State(app): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let search = read_search(&body)?;
    let found = matching(&app, &search);
    let page: Vec<Value> = found.iter().skip(search.offset).take(search.limit).cloned().collect();
    let mut resp = axum::Json(page).into_response();
    let next = search.offset.saturating_add(search.limit);
    if next < found.len()
        && let Ok(v) = HeaderValue::from_str(&next.to_string())
    {
        resp.headers_mut().insert("x-pagination-next", v);
    }
    Ok(resp)
}

/// `POST /assistants/count`.
#[utoipa::path(post, path = "/assistants/count", tag = LANGGRAPH, request_body(content = Option<Search>, description = "Optional."),
    responses((status = 200, description = "How many match.", content_type = "application/json", body = u64), Refusals))]
pub(crate) async fn count(State(app): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let search = read_search(&body)?;
    Ok(axum::Json(matching(&app, &search).len()).into_response())
}

fn not_found(id: &str) -> ApiError {
    ApiError::field(
        StatusCode::NOT_FOUND,
        "assistant_id",
        format!("no assistant '{}': the assistants are the agents", echoed(id)),
    )
}

/// `GET /assistants/{assistant_id}`.
#[utoipa::path(get, path = "/assistants/{assistant_id}", tag = LANGGRAPH, params(("assistant_id" = String, Path, description = "The assistant: an agent's name (`assistant` on a fresh install).", example = "assistant")),
    responses((status = 200, description = "The assistant.", body = Assistant), Refusals))]
pub(crate) async fn get(State(app): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let (agents, _) = app.chat().agents();
    let (name, revision) = agents.iter().find(|(name, _)| *name == id).ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(assistant(name, revision.version.as_deref())).into_response())
}

/// `GET /assistants/{assistant_id}/graph`: its nodes and edges as LangGraph draws them.
#[utoipa::path(get, path = "/assistants/{assistant_id}/graph", tag = LANGGRAPH, params(("assistant_id" = String, Path, description = "The assistant: an agent's name (`assistant` on a fresh install).", example = "assistant")),
    responses((status = 200, description = "Its nodes and edges.", body = AssistantGraph), Refusals))]
pub(crate) async fn graph(State(app): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let shape = app.chat().agent_shape(&id).ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(drawable(&shape)).into_response())
}

/// `shape` in LangGraph's drawable form: `START` and `END` as `schema` nodes, the rest as
/// `runnable`s; an edge a router chooses (or a person's decision resumes) is `conditional`.
fn drawable(shape: &GraphShape) -> Value {
    let nodes: Vec<Value> = shape
        .nodes
        .iter()
        .map(|n| {
            if n == toolgraph_graph::START || n == toolgraph_graph::END {
                json!({ "id": n, "type": "schema", "data": n })
            } else {
                json!({ "id": n, "type": "runnable", "data": { "id": ["toolgraph", "node", n], "name": n } })
            }
        })
        .collect();
    let edges: Vec<Value> = shape
        .edges
        .iter()
        .map(|e| {
            let mut edge = json!({ "source": e.from, "target": e.to });
            if e.kind != EdgeKind::Direct {
                edge["conditional"] = json!(true);
            }
            edge
        })
        .collect();
    json!({ "nodes": nodes, "edges": edges })
}

/// `GET /assistants/{assistant_id}/schemas`: what a turn takes and what the state holds.
#[utoipa::path(get, path = "/assistants/{assistant_id}/schemas", tag = LANGGRAPH, params(("assistant_id" = String, Path, description = "The assistant: an agent's name (`assistant` on a fresh install).", example = "assistant")),
    responses((status = 200, description = "What a turn takes and what its state holds.", body = AssistantSchemas), Refusals))]
pub(crate) async fn schemas(State(app): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if app.chat().agent_shape(&id).is_none() {
        return Err(not_found(&id));
    }
    let message = json!({
        "type": "object",
        "properties": { "type": { "type": "string" }, "content": { "type": "string" } },
        "required": ["content"],
    });
    let messages = json!({ "type": "array", "items": message });
    Ok(axum::Json(json!({
        "graph_id": id,
        "input_schema": { "type": "object", "properties": { "messages": messages }, "required": ["messages"] },
        "output_schema": { "type": "object", "properties": { "messages": messages } },
        "state_schema": {
            "type": "object",
            "properties": {
                "messages": messages,
                "context": { "type": "object" },
                "channels": { "type": "object", "description": "a declared graph's channels" },
            },
        },
        "config_schema": null,
        "context_schema": { "type": "object", "description": "values for the agent's state_keys" },
    }))
    .into_response())
}
