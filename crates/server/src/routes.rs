//! The routes and their handlers; thin: validate, call the store and the graph, answer.

use crate::error::ApiError;
use crate::extract::{check_tenant_header, json_body};
use crate::runlog::RunLog;
use crate::turn::{self, Turn};
use crate::wire::{ConfirmRequest, ConfirmResponse, MAX_MESSAGE_CHARS, PendingActionDto, StreamRequest};
use crate::{AppState, STALE_TURN};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use toolgraph_graph::react::user_turn;
use toolgraph_graph::{Decision, GraphError, InterruptId, ResumeResult, RunOptions, ThreadId};

/// The service's routes over `state`, `/health` and `/metrics` included.
pub fn router(state: AppState) -> Router {
    api_router(state.clone()).merge(ops_router(state))
}

/// The chat routes and `/ready`, without `/health` and `/metrics` (for serving those on a
/// separate address with [`ops_router`]).
pub fn api_router(state: AppState) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .route("/api/chatbot/stream", post(stream))
        .route("/api/chatbot/confirm", post(confirm))
        .route("/api/chatbot/runs/{run_id}/events", get(run_events))
        .route("/api/chatbot/conversations/{id}", delete(delete_conversation))
        .route("/api/chatbot/users/{user_id}", delete(delete_user))
        .route("/api/chatbot/tenants/{tenant_id}", delete(delete_tenant))
        .route("/search", post(search))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state)
}

/// Liveness and metrics: `/health` and `/metrics`.
pub fn ops_router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(|| async { axum::Json(json!({ "status": "ok" })) }))
        .route("/metrics", get(metrics))
        .with_state(state)
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
    app.0.metrics.requests.with_label_values(&[&route, resp.status().as_str()]).inc();
    resp
}

/// Largest request body accepted (a 4,000-character message is at most 16 KB).
const MAX_BODY: usize = 64 * 1024;

/// Authenticates `/api` routes; the body is read here (bounded) because HMAC signs it.
async fn authenticate(State(app): State<AppState>, req: Request, next: Next) -> Result<Response, ApiError> {
    if !req.uri().path().starts_with("/api/") && req.uri().path() != "/search" {
        return Ok(next.run(req).await);
    }
    let auth = &app.0.options.auth;
    let req =
        crate::auth::check_whole_request(req, MAX_BODY, |headers, target, body| auth.check(headers, target, body))
            .await?;
    Ok(next.run(req).await)
}

async fn ready(State(app): State<AppState>) -> Response {
    if app.is_ready() {
        axum::Json(json!({ "status": "ready" })).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "status": "not ready" }))).into_response()
    }
}

async fn metrics(State(app): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.0.metrics.render()).into_response()
}

fn sse(run_id: String, log: Arc<RunLog>, after: u64) -> Response {
    let frames = futures::stream::unfold((log, after), |(log, mut after)| async move {
        loop {
            let (frames, finished) = log.since(after);
            if let Some(last) = frames.last() {
                after = last.seq;
                return Some((frames, (log, after)));
            }
            if finished {
                return None;
            }
            log.changed(after).await;
        }
    });
    let events = frames.flat_map(futures::stream::iter).map(move |f| {
        Ok::<Event, Infallible>(Event::default().event(f.event).id(format!("{run_id}:{}", f.seq)).data(f.data))
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// The state context of a turn: the request's values plus `tenant` (the slug), which tools
/// such as `rag_search` scope their reads by. Set by the service, never taken from the client;
/// a continuing turn without new context keeps the stored one (it already has the tenant).
fn turn_context(req: &StreamRequest, is_new: bool) -> Option<serde_json::Map<String, serde_json::Value>> {
    if req.context.is_none() && !is_new {
        return None;
    }
    let mut ctx = req.context.clone().unwrap_or_default();
    ctx.insert("tenant".into(), req.tenant_slug.clone().into());
    Some(ctx)
}

/// Who is asking, set over the turn's context on every turn (continuing ones too, whatever
/// the stored context holds): `tenant` (the slug), `tenantId`, `userId` and `conversationId`,
/// which the backend's tools act for. They overwrite any context value of the same name.
fn turn_identity(req: &StreamRequest, conversation: i64) -> serde_json::Map<String, serde_json::Value> {
    let mut ids = serde_json::Map::new();
    ids.insert("tenant".into(), req.tenant_slug.clone().into());
    ids.insert("tenantId".into(), req.tenant_id.into());
    ids.insert("userId".into(), req.user_id.into());
    ids.insert("conversationId".into(), conversation.into());
    ids
}

/// `POST /search` (seed 000's RAG contract): `{query, asignatura?, tipo_documento?, top_k?,
/// kb?, filters?}` for the tenant of `X-Tenant-Slug`, answered as `{ok, query,
/// total_results, results}` or `{ok: false, error}` with 400/404/422/500/503.
async fn search(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    use toolgraph_rag::tool::{SearchFailure, SearchParams, search_json};
    let fail = |status: StatusCode, error: String| {
        (status, axum::Json(json!({ "ok": false, "error": error }))).into_response()
    };
    if !app.is_ready() {
        return fail(StatusCode::SERVICE_UNAVAILABLE, "the service is not ready".into());
    }
    let Some(tenant) = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return fail(StatusCode::BAD_REQUEST, "the X-Tenant-Slug header is required".into());
    };
    let params: SearchParams = match json_body(&body) {
        Ok(p) => p,
        Err(e) => return fail(e.status, e.describe()),
    };
    let Some(service) = app.0.search.get().cloned() else {
        return fail(StatusCode::NOT_FOUND, "search is not enabled on this service".into());
    };
    let started = std::time::Instant::now();
    // Index reads touch the disk: off the async workers.
    let result = tokio::task::spawn_blocking(move || {
        search_json(&service.store, &service.retriever, &tenant, &service.default_kb, &params)
    })
    .await;
    app.0.metrics.tool_latency.with_label_values(&["/search"]).observe(started.elapsed().as_secs_f64());
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

fn validate_message(message: &str) -> Result<(), ApiError> {
    let n = message.chars().count();
    if n == 0 || n > MAX_MESSAGE_CHARS {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "message",
            format!("message must be 1 to {MAX_MESSAGE_CHARS} characters, got {n}"),
        ));
    }
    Ok(())
}

fn validate_slug(slug: &str) -> Result<(), ApiError> {
    if slug.is_empty() {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "tenantSlug", "tenantSlug must not be empty"));
    }
    Ok(())
}

fn run_options(app: &AppState, agent: &crate::ServedAgent) -> RunOptions {
    RunOptions {
        recursion_limit: agent.settings.recursion_limit,
        cancel: app.0.shutdown.child_token(),
        ..RunOptions::default()
    }
}

async fn stream(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    if !app.is_ready() {
        return Err(ApiError::not_ready());
    }
    let req: StreamRequest = json_body(&body)?;
    validate_slug(&req.tenant_slug)?;
    validate_message(&req.message)?;
    check_tenant_header(&headers, &req.tenant_slug)?;
    let store = &app.0.store;
    let existing = match req.conversation_id {
        Some(id) => Some(store.conversation(req.tenant_id, req.user_id, id).await?.ok_or_else(ApiError::not_found)?),
        None => None,
    };
    if let (Some(asked), Some(conv)) = (&req.agent, &existing)
        && *asked != conv.agent
    {
        // Its checkpoints and pending actions belong to that agent's graph and tools.
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "agent",
            format!("conversation {} belongs to agent '{}'", conv.id, conv.agent),
        ));
    }
    let agent_name = req
        .agent
        .clone()
        .or_else(|| existing.as_ref().map(|c| c.agent.clone()))
        .unwrap_or_else(|| app.0.default_agent.clone());
    let agent = app.0.agents.get(&agent_name).ok_or_else(|| {
        ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "agent", format!("no agent named '{agent_name}'"))
    })?;
    if let Some(ctx) = &req.context
        && let Some(k) = ctx.keys().find(|k| !agent.settings.state_keys.contains(k))
    {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("context.{k}"),
            format!("agent '{agent_name}' does not accept context key '{k}'"),
        ));
    }
    let is_new = existing.is_none();
    let conversation = match existing {
        Some(c) => c.id,
        None => store.create_conversation(req.tenant_id, req.user_id, &agent_name).await?,
    };
    let permit = app.admit(req.tenant_id)?;
    let run_id = uuid::Uuid::now_v7().to_string();
    if !store.begin_turn(conversation, &run_id, STALE_TURN.as_millis() as i64).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, "a turn is already running on this conversation"));
    }
    let turn = Turn {
        tenant: req.tenant_id,
        conversation,
        run_id: run_id.clone(),
        agent: agent_name,
        tool_events: req.tool_events,
    };
    let started = async {
        // The user's message is committed with the run's first checkpoint (see `projection`).
        let thread = ThreadId::new(req.tenant_id, conversation);
        let mut input = user_turn(req.message.clone(), turn_context(&req, is_new));
        input.context_set = Some(turn_identity(&req, conversation));
        match agent.graph.start(&thread, input, run_options(&app, agent)).await {
            Ok(run) => Ok(run),
            Err(GraphError::AwaitingDecision { .. }) => {
                Err(ApiError::new(StatusCode::CONFLICT, "this conversation has pending actions to confirm first"))
            }
            Err(GraphError::ConcurrentRun { .. }) => {
                Err(ApiError::new(StatusCode::CONFLICT, "a turn is already running on this conversation"))
            }
            Err(e) => Err(ApiError::internal(e)),
        }
    }
    .await;
    let run = match started {
        Ok(r) => r,
        Err(e) => {
            let _ = store.end_turn(conversation, &run_id).await;
            return Err(e);
        }
    };
    let log = app.0.runs.create(&run_id, (req.tenant_id, req.user_id));
    let (task_app, task_log) = (app.clone(), Arc::clone(&log));
    app.0.tasks.spawn(async move {
        let _slot = permit;
        turn::drive(&task_app, &turn, run, &task_log).await;
    });
    Ok(sse(run_id, log, 0))
}

fn pending_dto(p: &crate::store::PendingAction) -> PendingActionDto {
    PendingActionDto {
        message_id: p.message_id,
        tool_name: p.tool_name.clone(),
        description: p.description.clone(),
        arguments: p.arguments.clone(),
    }
}

async fn confirm(State(app): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    if !app.is_ready() {
        return Err(ApiError::not_ready());
    }
    let req: ConfirmRequest = json_body(&body)?;
    validate_slug(&req.tenant_slug)?;
    check_tenant_header(&headers, &req.tenant_slug)?;
    let store = &app.0.store;
    let conv = req.conversation_id;
    let row = store.pending(req.tenant_id, req.user_id, conv, req.message_id).await?.ok_or_else(ApiError::not_found)?;
    let decided = store.decide(req.message_id, req.confirmed).await?;
    match decided {
        crate::store::Decided::Conflict => {
            return Err(ApiError::new(StatusCode::CONFLICT, "this action was already decided the other way"));
        }
        crate::store::Decided::Same => {
            if let Some(saved) = &row.response {
                return Ok(([(header::CONTENT_TYPE, "application/json")], saved.clone()).into_response());
            }
        }
        crate::store::Decided::Recorded => {
            app.0.metrics.hitl.with_label_values(&[if req.confirmed { "true" } else { "false" }]).inc();
        }
    }
    let group = store.run_pending(conv, &row.run_id).await?;
    if let Some(next) = group.iter().find(|p| p.decision.is_none()) {
        let body =
            ConfirmResponse { conversation_id: conv, message: String::new(), pending_action: Some(pending_dto(next)) };
        return Ok(axum::Json(body).into_response());
    }
    let conversation = store.conversation(req.tenant_id, req.user_id, conv).await?.ok_or_else(ApiError::not_found)?;
    let agent = app
        .0
        .agents
        .get(&conversation.agent)
        .ok_or_else(|| ApiError::internal(format!("agent '{}' is gone", conversation.agent)))?;
    let permit = app.admit(req.tenant_id)?;
    let run_id = uuid::Uuid::now_v7().to_string();
    // Every action is decided and no answer is stored yet: resume, unless another request
    // (or the turn that paused) holds the conversation right now. A retry after that turn
    // ends resumes, so a decision recorded by a request that then failed is never stranded.
    if !store.begin_turn(conv, &run_id, STALE_TURN.as_millis() as i64).await? {
        return Err(ApiError::new(StatusCode::CONFLICT, "these decisions are being applied; retry shortly"));
    }
    let decisions: BTreeMap<InterruptId, Decision> = group
        .iter()
        .map(|p| {
            (
                InterruptId(p.interrupt_id.clone()),
                if p.decision == Some(true) { Decision::Approve } else { Decision::Reject },
            )
        })
        .collect();
    let thread = ThreadId::new(req.tenant_id, conv);
    let run = match agent.graph.resume(&thread, decisions, run_options(&app, agent)).await {
        Ok(ResumeResult::Started(run)) => run,
        Ok(ResumeResult::Waiting { .. }) | Err(_) => {
            let _ = store.end_turn(conv, &run_id).await;
            return Err(ApiError::new(StatusCode::CONFLICT, "these actions cannot be resumed now"));
        }
    };
    let log = app.0.runs.create(&run_id, (req.tenant_id, req.user_id));
    // Nobody streams a confirm's run: its outcome is the response.
    let turn = Turn {
        tenant: req.tenant_id,
        conversation: conv,
        run_id,
        agent: conversation.agent.clone(),
        tool_events: false,
    };
    // Detached: the run finishes and persists even if this request goes away.
    let (task_app, group_run) = (app.clone(), row.run_id.clone());
    let task = app.0.tasks.spawn(async move {
        let _slot = permit;
        let result = turn::drive(&task_app, &turn, run, &log).await;
        let response = match (&result.error, result.reply, result.pending.first()) {
            (Some(e), _, _) => Err(e.clone()),
            (None, _, Some(p)) => {
                Ok(ConfirmResponse { conversation_id: conv, message: String::new(), pending_action: Some(p.clone()) })
            }
            (None, Some((_, text)), None) => {
                Ok(ConfirmResponse { conversation_id: conv, message: text, pending_action: None })
            }
            (None, None, None) => Err("the run ended without a reply".to_owned()),
        };
        if let Ok(r) = &response {
            let text = serde_json::to_string(r).unwrap_or_default();
            if let Err(e) = task_app.0.store.set_response(conv, &group_run, &text).await {
                tracing::error!(error = %e, "cannot save the confirm response");
            }
        }
        response
    });
    match task.await {
        Ok(Ok(r)) => Ok(axum::Json(r).into_response()),
        Ok(Err(message)) => Err(ApiError::new(StatusCode::BAD_GATEWAY, message)),
        Err(e) => Err(ApiError::internal(e)),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Owner {
    tenant_id: i64,
    user_id: i64,
}

async fn run_events(
    State(app): State<AppState>,
    Path(run_id): Path<String>,
    Query(owner): Query<Owner>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let log = app.0.runs.get(&run_id, (owner.tenant_id, owner.user_id)).ok_or_else(ApiError::not_found)?;
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit_once(':'))
        .filter(|(run, _)| *run == run_id)
        .and_then(|(_, seq)| seq.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(sse(run_id, log, after))
}

async fn delete_conversation(
    State(app): State<AppState>,
    Path(id): Path<i64>,
    Query(owner): Query<Owner>,
) -> Result<StatusCode, ApiError> {
    if !app.0.store.delete_conversation(owner.tenant_id, owner.user_id, id).await? {
        return Err(ApiError::not_found());
    }
    app.0.checkpointer.delete_thread(&ThreadId::new(owner.tenant_id, id)).await.map_err(ApiError::internal)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TenantQuery {
    tenant_id: i64,
}

async fn delete_user(
    State(app): State<AppState>,
    Path(user_id): Path<i64>,
    Query(q): Query<TenantQuery>,
) -> Result<Response, ApiError> {
    let ids = app.0.store.delete_user(q.tenant_id, user_id).await?;
    for id in &ids {
        app.0.checkpointer.delete_thread(&ThreadId::new(q.tenant_id, id)).await.map_err(ApiError::internal)?;
    }
    Ok(axum::Json(json!({ "deletedConversations": ids.len() })).into_response())
}

async fn delete_tenant(State(app): State<AppState>, Path(tenant_id): Path<i64>) -> Result<Response, ApiError> {
    let ids = app.0.store.delete_tenant(tenant_id).await?;
    app.0.checkpointer.delete_namespace(&tenant_id.to_string()).await.map_err(ApiError::internal)?;
    Ok(axum::Json(json!({ "deletedConversations": ids.len() })).into_response())
}
