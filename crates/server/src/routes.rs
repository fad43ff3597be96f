//! The routes and their handlers, thin: parse and validate the request, call the
//! [`ChatService`](crate::ChatService) (or the search), and answer.

use crate::AppState;
use crate::auth::{Auth, Caller};
use crate::error::ApiError;
use crate::extract::{Authorized, PathIds, QueryAsker, QueryOf, check_tenant_header, json_body};
use crate::openapi::{CHAT, ErrorBody, MCP, OPS, Refusals, SEARCH, SearchRefusals};
use crate::runlog::RunLog;
use crate::service::{CheckpointView, Confirmed, NewTurn};
use crate::wire::{
    AgentEntry, AgentList, AnswerRequest, Checkpoint, CheckpointList, ConfirmRequest, ConversationList,
    ConversationUsage, Deleted, ForkRequest, ForkResponse, ForkedFrom, ListQuery, StreamRequest, TenantQuery,
    TenantUsage, UploadQuery,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;
use std::sync::Arc;
use toolgraph_protocol::{ConversationId, RunId, TenantId, UserId};
use utoipa_axum::{router::OpenApiRouter, routes};

/// The service's routes over `state`, `/health` and `/metrics` included.
pub fn router(state: AppState) -> Router {
    api_router(state.clone()).merge(ops_router(state))
}

/// The routes that start work: they answer 503 until start-up finished and while shutting down.
fn working_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(stream))
        .routes(routes!(upload))
        .routes(routes!(confirm))
        .routes(routes!(answer))
        .routes(routes!(search))
        .routes(routes!(mcp))
        .routes(routes!(crate::openai::completions))
        .routes(routes!(crate::agui::run))
        .routes(routes!(crate::langgraph::runs::stream))
        .routes(routes!(crate::langgraph::runs::wait))
        .routes(routes!(crate::langgraph::runs::create, crate::langgraph::runs::list))
        .routes(routes!(crate::langgraph::runs::stream_stateless))
        .routes(routes!(crate::langgraph::runs::wait_stateless))
        .routes(routes!(crate::langgraph::runs::create_stateless))
}

/// The routes that read, change or delete what is kept, and `/ready`.
fn keeping_routes() -> OpenApiRouter<AppState> {
    use crate::langgraph::{runs, store, threads};
    OpenApiRouter::new()
        .routes(routes!(ready))
        .routes(routes!(run_events))
        .routes(routes!(list_conversations))
        .routes(routes!(delete_conversation))
        .routes(routes!(checkpoints))
        .routes(routes!(conversation_usage))
        .routes(routes!(conversation_documents))
        .routes(routes!(tenant_usage))
        .routes(routes!(checkpoint))
        .routes(routes!(agents))
        .routes(routes!(agent_graph))
        .routes(routes!(fork))
        .routes(routes!(delete_user))
        .routes(routes!(delete_tenant))
        .routes(routes!(crate::openai::models))
        .routes(routes!(crate::langgraph::search))
        .routes(routes!(crate::langgraph::count))
        .routes(routes!(crate::langgraph::get))
        .routes(routes!(crate::langgraph::graph))
        .routes(routes!(crate::langgraph::schemas))
        .routes(routes!(store::get, store::put, store::delete))
        .routes(routes!(store::search))
        .routes(routes!(store::namespaces))
        .routes(routes!(threads::create))
        .routes(routes!(threads::search))
        .routes(routes!(threads::count))
        .routes(routes!(threads::get, threads::update, threads::delete))
        .routes(routes!(threads::get_state, threads::update_state))
        .routes(routes!(threads::copy))
        .routes(routes!(runs::get))
        .routes(routes!(runs::join))
        .routes(routes!(runs::cancel))
        .routes(routes!(runs::join_run))
        .routes(routes!(threads::history))
}

/// Liveness and metrics.
fn ops_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(health)).routes(routes!(metrics)).routes(routes!(metrics_slash))
}

/// The OpenAPI document of every route of [`router`] (docs/api.md): the routers are built from
/// the handlers' `#[utoipa::path]`s, so a route cannot be served undescribed, nor described at
/// a path it is not served on (`/health` and `/metrics` move to the operations address when
/// `server.ops_bind` sets one; the document keeps them).
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    let routes =
        working_routes().merge(keeping_routes()).merge(ops_routes()).routes(routes!(openapi_json)).into_openapi();
    crate::openapi::document(routes)
}

/// `GET /openapi.json`: the document of every route, written once.
#[utoipa::path(get, path = "/openapi.json", tag = OPS, security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of every route.", content_type = "application/json", body = Object),
        (status = 500, description = "The document could not be written.", body = ErrorBody)))]
async fn openapi_json() -> Response {
    static DOCUMENT: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    match DOCUMENT.get_or_init(|| openapi_document().to_json().map_err(|e| e.to_string())) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text.as_str()).into_response(),
        Err(e) => ApiError::internal(format!("the OpenAPI document cannot be written: {e}")).into_response(),
    }
}

/// The chat routes, `/ready` and `/openapi.json`, without `/health` and `/metrics` (for serving
/// those on a separate address with [`ops_router`]).
pub fn api_router(state: AppState) -> Router {
    let (working, _) = working_routes().split_for_parts();
    let (keeping, _) = keeping_routes().split_for_parts();
    let (document, _) = OpenApiRouter::new().routes(routes!(openapi_json)).split_for_parts();
    keeping
        .merge(working.route_layer(middleware::from_fn_with_state(state.clone(), require_ready)))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .merge(document)
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state)
}

/// Liveness and metrics: `/health` and `/metrics` (also `/metrics/`, the path a Prometheus
/// ServiceMonitor written for the academy-admin worker scrapes).
pub fn ops_router(state: AppState) -> Router {
    let (ops, _) = ops_routes().split_for_parts();
    ops.with_state(state)
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/health", tag = OPS, security(()),
    responses((status = 200, description = "The process answers.", body = crate::openapi::Status)))]
async fn health() -> axum::Json<serde_json::Value> {
    axum::Json(json!({ "status": "ok" }))
}

async fn count_requests(State(app): State<AppState>, req: Request, next: Next) -> Response {
    use tracing::Instrument;
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let span = tracing::info_span!(
        "http.request",
        http.request.method = %req.method(),
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    let resp = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", resp.status().as_u16());
    app.metrics().requests.with_label_values(&[&route, resp.status().as_str()]).inc();
    resp
}

/// The doors that read who is asking from headers: OpenAI's chat completions and AG-UI, whose
/// clients send the whole conversation with every message (so their bodies may be larger, as
/// LangGraph's runs may), and LangGraph's threads, stateless runs and store.
const HEADER_DOORS: [&str; 5] = ["/v1/", "/ag-ui/", "/threads", "/runs", "/store/"];

/// Authenticates `/api`, `/v1`, `/ag-ui`, `/assistants`, `/threads`, `/runs` and `/store` routes,
/// `/search` and `/mcp`; the
/// body is read here (bounded) because HMAC signs it. `/v1` refusals are in OpenAI's error shape.
async fn authenticate(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let door = HEADER_DOORS.iter().any(|p| path.starts_with(p));
    let api = path.starts_with("/api/") || path.starts_with("/assistants/");
    if !door && !api && path != "/search" && path != "/mcp" {
        return next.run(req).await;
    }
    let openai = path.starts_with("/v1/");
    let refused =
        |e: ApiError| if openai { crate::openai::OpenAiError::from(e).into_response() } else { e.into_response() };
    // The doors read the tenant and user ids from headers, which an HMAC signature does not
    // cover: under `hmac` only the academy contract's signed bodies name them.
    if door && matches!(app.chat().auth(), Auth::Hmac(_)) {
        return refused(ApiError::new(
            StatusCode::FORBIDDEN,
            "this door reads who is asking from headers the HMAC signature does not cover: use /api/chatbot/* with \
             server.auth = \"hmac\", or an API key",
        ));
    }
    // Runs may carry a whole conversation too; a thread's own routes take small bodies.
    let whole = door
        && !path.starts_with("/store/")
        && (!path.starts_with("/threads") || path.split('/').nth(3) == Some("runs"));
    let max = if whole {
        crate::extract::MAX_CONVERSATION_BODY
    } else if path == "/api/chatbot/uploads" {
        crate::service::MAX_UPLOAD_BYTES
    } else {
        crate::extract::MAX_BODY
    };
    match authenticated(app.chat().auth(), req, max).await {
        Ok(req) => next.run(req).await,
        Err(e) => refused(e),
    }
}

/// `req` authenticated by `auth`: its body read (at most `max` bytes) and its
/// [`Caller`](crate::auth::Caller) in its extensions for the extractors that authorize what
/// they parse ([`Authorized`]).
pub(crate) async fn authenticated(auth: &Auth, req: Request, max: usize) -> Result<Request, ApiError> {
    let method = req.method().clone();
    let (mut req, caller) = crate::auth::check_whole_request(req, max, async |headers, target, body| {
        auth.check(&method, headers, target, body).await
    })
    .await?;
    req.extensions_mut().insert(caller);
    Ok(req)
}

/// 503 before start-up finished and while shutting down; `/search` answers in its own
/// `{ok: false, error}` shape.
async fn require_ready(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if app.is_ready() {
        return next.run(req).await;
    }
    if req.uri().path() == "/search" {
        let body = json!({ "ok": false, "error": "the service is not ready" });
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    if req.uri().path().starts_with("/v1/") {
        return crate::openai::OpenAiError::from(ApiError::not_ready()).into_response();
    }
    ApiError::not_ready().into_response()
}

/// MCP over streamable HTTP, for the tenant of `X-Tenant-Slug` (authenticated by then when
/// auth is `api_key`; without the header, the export's default tenant) and the user of
/// `X-User-Id`: within its tenant, the user is the caller's word, as a chat request's `userId`
/// is; without it, tools that keep data per user (the notes) refuse. A request that names the
/// person as the store routes read them (`X-Tenant-Slug`, `X-Tenant-Id` or a bound key, a
/// numeric `X-User-Id`) also gets their items as resources; one naming a tenant its key does
/// not open is refused (403).
#[utoipa::path(post, path = "/mcp", tag = MCP,
    params(("X-User-Id" = Option<String>, Header, description = "The person whose notes and memory the tools and resources are.")),
    request_body(content = serde_json::Value, description = "A JSON-RPC message of MCP's streamable HTTP transport (stateless: no session, no GET stream)."),
    responses(
        (status = 200, description = "A JSON-RPC answer.", content(
            (serde_json::Value = "application/json"), (crate::openapi::SseEvent = "text/event-stream"))),
        (status = 202, description = "A notification, accepted."),
        (status = "4XX", description = "Refused: by the transport (in words: a client that does not accept JSON and SSE, a body that is not JSON-RPC) or by the service (not served: 404; another tenant's: 403).",
            content((String = "text/plain"), (ErrorBody = "application/json"))),
        (status = "5XX", description = "MCP failed.", content((String = "text/plain"), (ErrorBody = "application/json"))),
    ))]
async fn mcp(State(app): State<AppState>, mut req: Request) -> Response {
    let Some(endpoint) = app.0.mcp.get() else {
        return crate::mcp::McpUnavailable.into_response();
    };
    let tenant = req.headers().get("x-tenant-slug").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let _slot = match app.chat().admit_request(tenant.as_deref().unwrap_or("")) {
        Ok(slot) => slot,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // Under `hmac` the person's headers are not signed: memory is not read on their word.
    let person = if matches!(app.chat().auth(), Auth::Hmac(_)) { Ok(None) } else { mcp_person(&req) };
    match person {
        Ok(Some(who)) => {
            req.extensions_mut().insert(who);
        }
        Ok(None) => {}
        Err(e) => return e.into_response(),
    }
    let user = req.headers().get("x-user-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut resp = endpoint.handle(req, tenant, user).await;
    // The transport refuses some requests in words without saying so (406, 415): a client
    // reading the answer is told what it holds.
    if !resp.headers().contains_key(header::CONTENT_TYPE) && resp.status() != StatusCode::ACCEPTED {
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, axum::http::HeaderValue::from_static("text/plain; charset=utf-8"));
    }
    resp
}

/// The person an MCP request names, admitted as the store routes admit them; none when it
/// names no numeric person (the notes take any user; memory needs one).
///
/// # Errors
/// 403 for a tenant the caller's key does not open.
fn mcp_person(req: &Request) -> Result<Option<crate::auth::Principal>, ApiError> {
    let Some(caller) = req.extensions().get::<crate::auth::Caller>() else { return Ok(None) };
    if !req.headers().contains_key("x-user-id") {
        return Ok(None);
    }
    match crate::extract::asking(caller, req.headers(), None) {
        Ok(asking) => Ok(Some(asking.principal)),
        Err(e) if e.status == StatusCode::FORBIDDEN => Err(e),
        Err(_) => Ok(None),
    }
}

#[utoipa::path(get, path = "/ready", tag = OPS, security(()),
    responses(
        (status = 200, description = "Started and not shutting down.", body = crate::openapi::Status),
        (status = 503, description = "Starting or shutting down.", body = crate::openapi::Status),
    ))]
async fn ready(State(app): State<AppState>) -> Response {
    if app.is_ready() {
        axum::Json(json!({ "status": "ready" })).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "status": "not ready" }))).into_response()
    }
}

#[utoipa::path(get, path = "/metrics", tag = OPS, security(()),
    responses((status = 200, description = "Prometheus' text format.", content_type = "text/plain", body = String)))]
async fn metrics(State(app): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics().render()).into_response()
}

/// `/metrics/`: the path a ServiceMonitor written for the academy-admin worker scrapes.
#[utoipa::path(get, path = "/metrics/", tag = OPS, security(()),
    responses((status = 200, description = "Prometheus' text format.", content_type = "text/plain", body = String)))]
async fn metrics_slash(state: State<AppState>) -> Response {
    metrics(state).await
}

fn sse(run_id: RunId, log: Arc<RunLog>, after: u64) -> Response {
    sse_frames(run_id, log.frames_after(after))
}

/// An SSE response of a run's frames, each with its id `<runId>:<seq>`: the chat contract's
/// (a run another door started with its nodes' events — LangGraph's `debug` — keeps those for
/// that door: they are not the contract's, docs/service.md).
fn sse_frames(run_id: RunId, frames: impl futures::Stream<Item = crate::runlog::Frame> + Send + 'static) -> Response {
    let contract =
        |f: &crate::runlog::Frame| !matches!(&*f.event, "node_started" | "node_finished" | "custom" | "state_update");
    let events = frames
        .filter(move |f| futures::future::ready(contract(f)))
        .map(move |f| crate::sse::SseEvent::new(Some(&f.event), Some(&format!("{run_id}:{}", f.seq)), &f.data));
    crate::sse::response(events)
}

/// `e` in `/search`'s own shape, `{ok: false, error}`, with its status and any `Retry-After`.
fn search_failure(e: ApiError) -> Response {
    let mut resp = (e.status, axum::Json(json!({ "ok": false, "error": e.describe() }))).into_response();
    if let Some(secs) = e.retry_after {
        resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    resp
}

/// `POST /search`, the course tutor's retrieval contract: `{query, asignatura?,
/// tipo_documento?, top_k?, kb?, filters?, mode?}` for the tenant of `X-Tenant-Slug`, answered
/// as `{ok, query, total_results, results}` or `{ok: false, error}`: 400 for a bad request, 404
/// for an unknown knowledge base, 500 when the index fails.
#[utoipa::path(post, path = "/search", tag = SEARCH,
    request_body(content = serde_json::Value, description = "`{query, asignatura?, tipo_documento?, top_k?, kb?, filters?, mode?}` (docs/retrieval.md)."),
    responses((status = 200, description = "The passages found.", body = crate::openapi::SearchAnswer), SearchRefusals))]
async fn search(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    use toolgraph_agents::course::CourseSearch;
    use toolgraph_rag::SearchFailure;
    let fail = |status: StatusCode, error: String| search_failure(ApiError::new(status, error));
    let Some(tenant) = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return fail(StatusCode::BAD_REQUEST, "the X-Tenant-Slug header is required".into());
    };
    let request: CourseSearch = match json_body(&body) {
        Ok(p) => p,
        Err(e) => return search_failure(e),
    };
    let Some(service) = app.0.search.get().cloned() else {
        return fail(StatusCode::NOT_FOUND, "search is not enabled on this service".into());
    };
    let _slot = match app.chat().admit_request(&tenant) {
        Ok(slot) => slot,
        Err(e) => return search_failure(e.into()),
    };
    let started = std::time::Instant::now();
    // Index reads touch the disk: off the async workers.
    let result = tokio::task::spawn_blocking(move || {
        request.run(&service.store, &service.retriever, &tenant, &service.default_kb)
    })
    .await;
    app.metrics().tool_latency.with_label_values(&["/search"]).observe(started.elapsed().as_secs_f64());
    match result {
        Ok(Ok(body)) => axum::Json(body).into_response(),
        Ok(Err((SearchFailure::Invalid, e))) => fail(StatusCode::BAD_REQUEST, e),
        Ok(Err((SearchFailure::NotFound, e))) => fail(StatusCode::NOT_FOUND, e),
        Ok(Err((_, e))) => {
            tracing::error!(error = %e, "search failed");
            fail(StatusCode::INTERNAL_SERVER_ERROR, "search failed".into())
        }
        Err(e) => {
            tracing::error!(error = %e, "search task failed");
            fail(StatusCode::INTERNAL_SERVER_ERROR, "search failed".into())
        }
    }
}

#[utoipa::path(post, path = "/api/chatbot/stream", tag = CHAT, request_body = StreamRequest,
    responses((status = 200, description = "The turn's events: `token`, `pending`, `done`, `error` (and more when asked; docs/service.md).",
        content_type = "text/event-stream", body = crate::openapi::SseEvent), Refusals))]
async fn stream(
    State(app): State<AppState>,
    headers: HeaderMap,
    Authorized(who, req): Authorized<StreamRequest>,
) -> Result<Response, ApiError> {
    req.validate()?;
    check_tenant_header(&headers, &req.tenant_slug)?;
    let (run_id, log) = app.chat().start_turn(&who, &turn_of(req)).await?;
    Ok(sse(run_id, log, 0))
}

/// The person's answer to a question an agent asked: the same response as a confirm.
#[utoipa::path(post, path = "/api/chatbot/answer", tag = CHAT, request_body = AnswerRequest,
    responses((status = 200, description = "The reply once the question is answered.", body = crate::wire::ConfirmResponse), Refusals))]
async fn answer(
    State(app): State<AppState>,
    headers: HeaderMap,
    Authorized(who, req): Authorized<AnswerRequest>,
) -> Result<Response, ApiError> {
    req.validate()?;
    check_tenant_header(&headers, &req.tenant_slug)?;
    Ok(match app.chat().answer(&who, req.conversation_id, req.message_id, &req.answer).await? {
        Confirmed::Saved(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Confirmed::Reply(reply) => axum::Json(reply).into_response(),
    })
}

#[utoipa::path(post, path = "/api/chatbot/confirm", tag = CHAT, request_body = ConfirmRequest,
    responses((status = 200, description = "The reply once the action is approved or rejected.", body = crate::wire::ConfirmResponse), Refusals))]
async fn confirm(
    State(app): State<AppState>,
    headers: HeaderMap,
    Authorized(who, req): Authorized<ConfirmRequest>,
) -> Result<Response, ApiError> {
    req.validate()?;
    check_tenant_header(&headers, &req.tenant_slug)?;
    Ok(match app.chat().confirm(&who, req.conversation_id, req.message_id, req.confirmed).await? {
        Confirmed::Saved(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Confirmed::Reply(reply) => axum::Json(reply).into_response(),
    })
}

#[utoipa::path(get, path = "/api/chatbot/runs/{run_id}/events", tag = CHAT,
    params(("run_id" = String, Path, description = "The run."), crate::wire::AskerQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "`<runId>:<seq>`: the events after it.")),
    responses((status = 200, description = "The run's events, from the start or after `Last-Event-ID`.", content_type = "text/event-stream", body = crate::openapi::SseEvent), Refusals))]
async fn run_events(
    State(app): State<AppState>,
    PathIds(run_id): PathIds<RunId>,
    QueryAsker(who): QueryAsker,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit_once(':'))
        .filter(|(run, _)| *run == run_id.as_str())
        .and_then(|(_, seq)| seq.parse::<u64>().ok())
        .unwrap_or(0);
    let (_, frames) = app
        .chat()
        .run_frames(&run_id, &who, after)
        .await
        .map_err(ApiError::run_events_unavailable)?
        .ok_or_else(ApiError::not_found)?;
    Ok(sse_frames(run_id, frames))
}

/// `GET /api/chatbot/conversations?tenantId=&userId=[&limit=]`: `{conversations: [{id, agent,
/// title}]}`, newest first (20 unless `limit`, at most 100).
#[utoipa::path(get, path = "/api/chatbot/conversations", tag = CHAT, params(crate::wire::AskerQuery, ListQuery),
    responses((status = 200, description = "Newest first.", body = ConversationList), Refusals))]
async fn list_conversations(
    State(app): State<AppState>,
    QueryAsker(who): QueryAsker,
    QueryOf(q): QueryOf<ListQuery>,
) -> Result<Response, ApiError> {
    let conversations = app.chat().list_conversations(&who, q.limit.unwrap_or(20)).await?;
    Ok(axum::Json(ConversationList { conversations }).into_response())
}

/// Forks a conversation at a checkpoint into a new one: 201 `{conversationId, forkedFrom}`.
#[utoipa::path(post, path = "/api/chatbot/conversations/{id}/fork", tag = CHAT, params(("id" = i64, Path, description = "The conversation.")), request_body = ForkRequest,
    responses((status = 201, description = "The new conversation.", body = ForkResponse), Refusals))]
async fn fork(
    State(app): State<AppState>,
    PathIds(id): PathIds<ConversationId>,
    headers: HeaderMap,
    Authorized(who, req): Authorized<ForkRequest>,
) -> Result<Response, ApiError> {
    check_tenant_header(&headers, &req.tenant_slug)?;
    let new_id = app.chat().fork(&who, id, req.seq).await?;
    let body = ForkResponse { conversation_id: new_id, forked_from: ForkedFrom { conversation_id: id, seq: req.seq } };
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// The agents served: `{defaultAgent, agents: [{name, version, refused?: {version, errors}}]}`
/// (`version` is the digest of the agent's declaration, `null` for a graph built in code; `refused` a newer
/// declaration that failed its checks while this version keeps serving).
#[utoipa::path(get, path = "/api/chatbot/agents", tag = CHAT,
    responses((status = 200, description = "The agents served.", body = AgentList), Refusals))]
async fn agents(State(app): State<AppState>) -> Response {
    let chat = app.chat();
    let (list, default) = chat.agents();
    let agents = list.into_iter().map(|(name, revision)| AgentEntry { name, revision }).collect();
    axum::Json(AgentList { default_agent: default.to_owned(), agents }).into_response()
}

/// The agent's graph as an SVG picture; 404 for an agent the service does not serve.
#[utoipa::path(get, path = "/api/chatbot/agents/{agent}/graph.svg", tag = CHAT, params(("agent" = String, Path, description = "The agent's name (`assistant` on a fresh install).", example = "assistant")),
    responses((status = 200, description = "Its graph as a picture.", content_type = "image/svg+xml", body = String), Refusals))]
async fn agent_graph(State(app): State<AppState>, Path(agent): Path<String>) -> Result<Response, ApiError> {
    let svg = app.chat().agent_graph_svg(&agent).ok_or_else(ApiError::not_found)?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], svg).into_response())
}

#[utoipa::path(delete, path = "/api/chatbot/conversations/{id}", tag = CHAT, params(("id" = i64, Path, description = "The conversation."), crate::wire::AskerQuery),
    responses((status = 204, description = "Deleted, with its messages, checkpoints and documents."), Refusals))]
async fn delete_conversation(
    State(app): State<AppState>,
    PathIds(id): PathIds<ConversationId>,
    QueryAsker(who): QueryAsker,
) -> Result<StatusCode, ApiError> {
    app.chat().delete_conversation(&who, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/chatbot/conversations/{id}/checkpoints", tag = CHAT, params(("id" = i64, Path, description = "The conversation."), crate::wire::AskerQuery),
    responses((status = 200, description = "Its checkpoints, oldest first.", body = CheckpointList), Refusals))]
async fn checkpoints(
    State(app): State<AppState>,
    PathIds(id): PathIds<ConversationId>,
    QueryAsker(who): QueryAsker,
) -> Result<Response, ApiError> {
    let checkpoints = app.chat().checkpoints(&who, id).await?;
    Ok(axum::Json(CheckpointList { conversation_id: id, checkpoints }).into_response())
}

/// Keeps a document the asking person may attach to a turn: the body is the document, `name`
/// its file name. 201 with the upload's id.
#[utoipa::path(post, path = "/api/chatbot/uploads", tag = CHAT, params(crate::wire::AskerQuery, UploadQuery),
    request_body(content = Vec<u8>, description = "The document (PDF, Markdown, text, HTML).", content_type = "application/octet-stream"),
    responses((status = 201, description = "Kept: the id a turn attaches it by.", body = crate::service::UploadReceipt), Refusals))]
async fn upload(
    State(app): State<AppState>,
    QueryAsker(who): QueryAsker,
    QueryOf(q): QueryOf<UploadQuery>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    // The authentication layer already read it, at most this long.
    let bytes = axum::body::to_bytes(body, crate::service::MAX_UPLOAD_BYTES)
        .await
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "the document is too large"))?;
    let receipt = app.chat().upload(&who, &q.name, bytes.to_vec()).await?;
    Ok((StatusCode::CREATED, axum::Json(receipt)).into_response())
}

/// The documents attached to the conversation.
#[utoipa::path(get, path = "/api/chatbot/conversations/{id}/documents", tag = CHAT, params(("id" = i64, Path, description = "The conversation."), crate::wire::AskerQuery),
    responses((status = 200, description = "The documents attached to it.", body = crate::service::DocumentList), Refusals))]
async fn conversation_documents(
    State(app): State<AppState>,
    PathIds(id): PathIds<ConversationId>,
    QueryAsker(who): QueryAsker,
) -> Result<Response, ApiError> {
    let documents = app.chat().attached_documents(&who, id.0).await?;
    Ok(axum::Json(crate::service::DocumentList { conversation_id: id, documents }).into_response())
}

/// What the conversation's turns used, per turn and model, and in all.
#[utoipa::path(get, path = "/api/chatbot/conversations/{id}/usage", tag = CHAT, params(("id" = i64, Path, description = "The conversation."), crate::wire::AskerQuery),
    responses((status = 200, description = "Tokens per turn and model, and in all.", body = ConversationUsage), Refusals))]
async fn conversation_usage(
    State(app): State<AppState>,
    PathIds(id): PathIds<ConversationId>,
    QueryAsker(who): QueryAsker,
) -> Result<Response, ApiError> {
    let kept = app.chat().conversation_usage(&who, id).await?;
    Ok(axum::Json(ConversationUsage::new(id, kept)).into_response())
}

/// The tenant's tokens in the budget's current period, and its budget.
#[utoipa::path(get, path = "/api/chatbot/tenants/{tenant_id}/usage", tag = CHAT, params(("tenant_id" = i64, Path, description = "The tenant.")),
    responses((status = 200, description = "The tenant's tokens in the budget's period.", body = TenantUsage), Refusals))]
async fn tenant_usage(
    State(app): State<AppState>,
    caller: Caller,
    PathIds(tenant_id): PathIds<TenantId>,
) -> Result<Response, ApiError> {
    let tenant = caller.admit_tenant(tenant_id)?;
    let status = app.chat().tenant_usage(&tenant).await?;
    Ok(axum::Json(TenantUsage {
        tenant_id,
        period: status.period.name(),
        period_start_ms: status.bounds.0,
        period_end_ms: status.bounds.1,
        used_tokens: status.used,
        budget_tokens: status.budget,
    })
    .into_response())
}

#[utoipa::path(get, path = "/api/chatbot/conversations/{id}/checkpoints/{seq}", tag = CHAT,
    params(("id" = i64, Path, description = "The conversation."), ("seq" = u64, Path, description = "The checkpoint."), crate::wire::AskerQuery),
    responses((status = 200, description = "The state it left.", body = Checkpoint), Refusals))]
async fn checkpoint(
    State(app): State<AppState>,
    PathIds((id, seq)): PathIds<(ConversationId, u64)>,
    QueryAsker(who): QueryAsker,
) -> Result<Response, ApiError> {
    Ok(axum::Json(checkpoint_of(app.chat().checkpoint(&who, id, seq).await?)).into_response())
}

/// The turn a stream request asks for (who asks was admitted from its ids).
fn turn_of(r: StreamRequest) -> NewTurn {
    NewTurn {
        tenant_slug: r.tenant_slug,
        conversation: r.conversation_id,
        message: r.message,
        agent: r.agent,
        context: r.context,
        tool_events: r.tool_events,
        node_events: false,
        attachments: r.attachments,
        run_metadata: None,
    }
}

/// A checkpoint's state as the contract shows it.
fn checkpoint_of(v: CheckpointView) -> Checkpoint {
    let at = v.at;
    Checkpoint {
        conversation_id: v.conversation,
        seq: at.seq,
        next: at.next,
        pending: at.pending,
        decisions: at.decisions,
        state: at.state,
    }
}

/// Deletes a person's data: the user of the path, of the query's tenant.
#[utoipa::path(delete, path = "/api/chatbot/users/{user_id}", tag = CHAT, params(("user_id" = i64, Path, description = "The person."), TenantQuery),
    responses((status = 200, description = "Their conversations, memory and documents are gone.", body = Deleted), Refusals))]
async fn delete_user(
    State(app): State<AppState>,
    caller: Caller,
    PathIds(user_id): PathIds<UserId>,
    QueryOf(q): QueryOf<TenantQuery>,
) -> Result<Response, ApiError> {
    let who = caller.admit(q.tenant_id, user_id)?;
    let deleted_conversations = app.chat().delete_user(&who).await?;
    Ok(axum::Json(Deleted { deleted_conversations }).into_response())
}

#[utoipa::path(delete, path = "/api/chatbot/tenants/{tenant_id}", tag = CHAT, params(("tenant_id" = i64, Path, description = "The tenant.")),
    responses((status = 200, description = "Everything of the tenant is gone.", body = Deleted), Refusals))]
async fn delete_tenant(
    State(app): State<AppState>,
    caller: Caller,
    PathIds(tenant_id): PathIds<TenantId>,
) -> Result<Response, ApiError> {
    let tenant = caller.admit_tenant(tenant_id)?;
    let deleted_conversations = app.chat().delete_tenant(&tenant).await?;
    Ok(axum::Json(Deleted { deleted_conversations }).into_response())
}

/// The auth + body path as one property: for any body, the tenant a handler acts on is the one
/// the caller's key was authorized for, or the request is refused. Driven through the real
/// authentication layer and extractor, without a socket.
#[cfg(test)]
mod authorization_props {
    use super::*;
    use crate::auth::hash_api_key;
    use axum::routing::post;
    use proptest::prelude::*;
    use serde_json::Value;
    use tower_service::Service;

    /// A router whose handlers answer the tenant id they would act on.
    fn router() -> Router {
        let auth = Arc::new(
            Auth::api_keys([(&"demo".to_string(), &hash_api_key("k-7"))])
                .and_then(|a| a.bind_tenant_ids([(&"demo".to_string(), &7)]))
                .unwrap(),
        );
        Router::new()
            .route(
                "/api/chatbot/stream",
                post(|Authorized(who, _): Authorized<StreamRequest>| async move { who.tenant().to_string() }),
            )
            .route(
                "/api/chatbot/confirm",
                post(|Authorized(who, _): Authorized<ConfirmRequest>| async move { who.tenant().to_string() }),
            )
            .route(
                "/api/chatbot/conversations/{id}/fork",
                post(|Authorized(who, _): Authorized<ForkRequest>| async move { who.tenant().to_string() }),
            )
            .layer(middleware::from_fn(move |req: Request, next: Next| {
                let auth = Arc::clone(&auth);
                async move {
                    match authenticated(&auth, req, crate::extract::MAX_BODY).await {
                        Ok(req) => next.run(req).await,
                        Err(e) => e.into_response(),
                    }
                }
            }))
    }

    fn tenant_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!(7)),
            Just(json!(8)),
            Just(json!("8")),
            Just(json!(8.0)),
            Just(json!(7.0)),
            Just(json!(-7)),
            Just(json!(i64::MAX)),
            Just(json!(u64::MAX)),
            Just(json!(null)),
            Just(json!([8])),
            Just(json!({"tenantId": 8})),
        ]
    }

    /// Bodies near the contract's: objects and arrays of its fields with any tenant, keys
    /// repeated, cased differently or escaped, and bytes added before or after.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let field = prop_oneof![
            tenant_value().prop_map(|v| format!("\"tenantId\":{v}")),
            tenant_value().prop_map(|v| format!("\"tenant\\u0049d\":{v}")),
            tenant_value().prop_map(|v| format!("\"TenantId\":{v}")),
            Just("\"tenantSlug\":\"demo\"".to_owned()),
            Just("\"userId\":1".to_owned()),
            Just("\"conversationId\":3".to_owned()),
            Just("\"messageId\":4".to_owned()),
            Just("\"confirmed\":true".to_owned()),
            Just("\"message\":\"hola\"".to_owned()),
            Just("\"seq\":1".to_owned()),
        ];
        let object = prop::collection::vec(field, 0..10).prop_map(|f| format!("{{{}}}", f.join(",")));
        let array = prop::collection::vec(tenant_value(), 0..7)
            .prop_map(|v| format!("[\"demo\",{}]", v.iter().map(Value::to_string).collect::<Vec<_>>().join(",")));
        let affix = prop_oneof![
            Just(String::new()),
            Just(" ".to_owned()),
            Just("x".to_owned()),
            Just("{\"tenantId\":8}".to_owned()),
            Just("{\"tenantId\":7}".to_owned()),
            Just("\u{feff}".to_owned()),
            Just("]".to_owned()),
        ];
        prop_oneof![
            (affix.clone(), prop_oneof![object, array], affix).prop_map(|(a, b, c)| format!("{a}{b}{c}").into_bytes()),
            prop::collection::vec(proptest::arbitrary::any::<u8>(), 0..128),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 768, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_tenant_acted_on_is_the_tenant_authorized(
            body in body(),
            route in prop::sample::select(&["/api/chatbot/stream", "/api/chatbot/confirm", "/api/chatbot/conversations/3/fork"][..]),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let (status, text) = runtime.block_on(async {
                let req = axum::http::Request::post(route)
                    .header("x-tenant-slug", "demo")
                    .header("authorization", "Bearer k-7")
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body.clone()))
                    .unwrap();
                let resp = router().call(req).await.unwrap();
                let status = resp.status();
                let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
                (status, String::from_utf8_lossy(&bytes).into_owned())
            });
            if status.is_success() {
                prop_assert_eq!(&text, "7", "acted on another tenant for {:?}", String::from_utf8_lossy(&body));
            } else {
                prop_assert!(status.is_client_error(), "{} {} for {:?}", status, text, String::from_utf8_lossy(&body));
            }
        }
    }
}

#[cfg(test)]
mod openapi_tests {
    use super::*;

    /// Every path the routers serve is described, each operation with its answers; a route
    /// built without its annotation would be missing here.
    #[test]
    fn the_document_describes_the_routes_served() {
        let doc = openapi_document();
        let json: serde_json::Value = serde_json::from_str(&doc.to_json().unwrap()).unwrap();
        assert_eq!(json["openapi"], "3.1.0");
        let paths = json["paths"].as_object().unwrap();
        for (path, method) in [
            ("/api/chatbot/stream", "post"),
            ("/api/chatbot/conversations/{id}/checkpoints/{seq}", "get"),
            ("/threads/{thread_id}", "patch"),
            ("/threads/{thread_id}/history", "post"),
            ("/threads/{thread_id}/history", "get"),
            ("/threads/{thread_id}/state", "get"),
            ("/threads/{thread_id}/state", "post"),
            ("/store/items", "put"),
            ("/v1/chat/completions", "post"),
            ("/ag-ui/{agent}", "post"),
            ("/mcp", "post"),
            ("/health", "get"),
            ("/metrics/", "get"),
            ("/openapi.json", "get"),
        ] {
            let op = &paths[path][method];
            assert!(op.is_object(), "{method} {path} is not described");
            assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}: {op}");
        }
        // Every operation names its group, and every schema referenced is in the components.
        let text = json.to_string();
        let schemas = json["components"]["schemas"].as_object().unwrap();
        for name in text.split("#/components/schemas/").skip(1).map(|s| s.split('"').next().unwrap()) {
            assert!(schemas.contains_key(name), "{name} is referenced and not described");
        }
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in paths {
            for (method, op) in item.as_object().unwrap() {
                assert!(op["tags"].as_array().is_some_and(|t| t.len() == 1), "{method} {path} has no group");
                let id = op["operationId"].as_str().unwrap();
                assert!(ids.insert(id.to_owned()), "{method} {path}: operation id {id} is taken");
            }
        }
        // Each request type keeps its own name: three `Search`es of three modules are three schemas.
        let properties =
            |name: &str| schemas[name]["properties"].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert!(properties("ItemSearch").contains(&"namespace_prefix".to_owned()));
        assert!(properties("AssistantSearch").contains(&"graph_id".to_owned()));
        assert!(properties("ThreadSearch").contains(&"status".to_owned()));
        // What a run's options may be, as the handlers read them.
        assert_eq!(
            schemas["MultitaskStrategy"]["enum"],
            serde_json::json!(["reject", "interrupt", "enqueue", "rollback"])
        );
        assert_eq!(schemas["StreamMode"]["enum"], serde_json::json!(crate::langgraph::runs::MODES));
        let body = |path: &str| &paths[path]["post"]["requestBody"];
        assert_eq!(body("/threads/search")["required"], false, "an empty body lists them all");
        assert_eq!(body("/threads/{thread_id}/runs/stream")["required"], true);
        // The doors that read the person from headers say so; the chat contract's do not.
        let security = |path: &str, method: &str| paths[path][method]["security"].to_string();
        assert!(security("/threads/{thread_id}/runs/stream", "post").contains("userId"));
        assert!(security("/v1/chat/completions", "post").contains("userId"));
        assert!(!security("/api/chatbot/stream", "post").contains("userId"));
    }
}
