//! The reference backend of the academy admin example (`examples/lumie`): what a school
//! platform puts in front of `toolgraph serve` with `store = "backend"`, runnable on one machine.
//!
//! It serves the signed `/internal/chatbot/**` calls of docs/service.md: the conversation
//! store ([`toolgraph_server::callback_router`] over a SQLite file), and its own data and
//! actions — `query` (the model's read-only SQL on the asking tenant's database), `schema` (the
//! description the system prompt carries) and `tools/{toolName}` (the approved write actions,
//! [`actions`]). Every call is verified before anything runs: a valid, fresh, unreplayed HMAC
//! signature (v2: method, path, query, tenant slug and body; docs/service.md, "Signed
//! requests"), then the tenant (`X-Tenant-Slug`, `tenantSlug` and `tenantId` must name the same
//! academy) and the user (staff of that academy).

pub mod academy;
pub mod actions;

use academy::{Academy, SCHEMA_DESCRIPTION, TenantData};
use actions::{ActionCall, ActionError};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use toolgraph_conversations::ConversationStore;
use toolgraph_server::auth::HmacVerifier;
use toolgraph_server::{callback_router, require_signature};
use toolgraph_tools::{ToolContext, ToolErrorKind, ToolOutcome};

/// A refused or failed call: its status and `{"error": …}`.
type Refusal = (StatusCode, Json<Value>);

fn refuse(status: StatusCode, message: impl Into<String>) -> Refusal {
    (status, Json(json!({ "error": message.into() })))
}

/// The whole backend: the conversation store's calls and the academy's own, all behind the
/// signature check of `verifier`.
pub fn router(academy: Arc<Academy>, conversations: Arc<dyn ConversationStore>, verifier: Arc<HmacVerifier>) -> Router {
    let own = Router::new()
        .route("/internal/chatbot/query", post(query))
        .route("/internal/chatbot/schema", get(schema))
        .route("/internal/chatbot/tools/{tool}", post(tool))
        .with_state(academy);
    require_signature(own, Arc::clone(&verifier)).merge(callback_router(conversations, verifier))
}

/// The academy a call is for, when the header, the slug and the id agree on one of ours and
/// the user is its staff.
fn caller<'a>(
    academy: &'a Academy,
    headers: &HeaderMap,
    slug: Option<&str>,
    tenant_id: i64,
    user_id: Option<i64>,
) -> Result<&'a TenantData, Refusal> {
    let header = headers.get("x-tenant-slug").and_then(|v| v.to_str().ok()).unwrap_or_default();
    if slug.is_some_and(|s| s != header) {
        return Err(refuse(StatusCode::FORBIDDEN, "X-Tenant-Slug does not match tenantSlug"));
    }
    let Some(tenant) = academy.tenant(tenant_id, header) else {
        return Err(refuse(StatusCode::FORBIDDEN, format!("tenant {tenant_id} is not '{header}'")));
    };
    if user_id.is_some_and(|u| !Academy::is_staff(tenant_id, u)) {
        return Err(refuse(StatusCode::FORBIDDEN, "the user is not staff of this academy"));
    }
    Ok(tenant)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueryCall {
    tenant_slug: String,
    tenant_id: i64,
    user_id: i64,
    sql: String,
}

/// `POST /internal/chatbot/query`: rows as `{columns, rows, rowCount, sql}`; SQL that is not
/// one read-only SELECT, or that the database refuses, is 422 with the reason (the model
/// repairs it).
async fn query(
    State(academy): State<Arc<Academy>>,
    headers: HeaderMap,
    Json(call): Json<QueryCall>,
) -> Result<Json<Value>, Refusal> {
    let tenant = caller(&academy, &headers, Some(&call.tenant_slug), call.tenant_id, Some(call.user_id))?;
    let outcome =
        tenant.general_query.call(&ToolContext::default(), "general_query", &json!({ "sql": call.sql })).await;
    match outcome {
        ToolOutcome::Success(rows) => Ok(Json(rows)),
        ToolOutcome::Failure(e) => match e.kind {
            ToolErrorKind::InvalidArguments => Err(refuse(StatusCode::UNPROCESSABLE_ENTITY, e.message)),
            ToolErrorKind::Timeout => Err(refuse(StatusCode::GATEWAY_TIMEOUT, e.message)),
            _ => {
                tracing::warn!(tenant = tenant.tenant.slug, error = %e.message, "a query failed");
                Err(refuse(StatusCode::SERVICE_UNAVAILABLE, e.message))
            }
        },
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchemaCall {
    tenant_id: i64,
}

/// `GET /internal/chatbot/schema?tenantId=N`: the tables, for the system prompt.
async fn schema(
    State(academy): State<Arc<Academy>>,
    headers: HeaderMap,
    Query(call): Query<SchemaCall>,
) -> Result<Json<Value>, Refusal> {
    let tenant = caller(&academy, &headers, None, call.tenant_id, None)?;
    // The model does not know the date; "this month" needs it.
    let today: String = sqlx::query_scalar("SELECT date('now')")
        .fetch_one(&tenant.pool)
        .await
        .map_err(|e| refuse(StatusCode::SERVICE_UNAVAILABLE, format!("the academy database is unavailable: {e}")))?;
    let t = &tenant.tenant;
    Ok(Json(json!({ "schema": format!("{} ({}). Today is {today}.\n{SCHEMA_DESCRIPTION}", t.name, t.slug) })))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolCall {
    tenant_slug: String,
    tenant_id: i64,
    user_id: i64,
    conversation_id: i64,
    call_id: String,
    arguments: Value,
}

/// `POST /internal/chatbot/tools/{toolName}`: runs an approved action once.
async fn tool(
    State(academy): State<Arc<Academy>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Json(call): Json<ToolCall>,
) -> Result<Json<Value>, Refusal> {
    let tenant = caller(&academy, &headers, Some(&call.tenant_slug), call.tenant_id, Some(call.user_id))?;
    let action = ActionCall {
        tool: &name,
        call_id: &call.call_id,
        conversation_id: call.conversation_id,
        user_id: call.user_id,
        arguments: &call.arguments,
    };
    match actions::run(tenant, &action).await {
        Ok(result) => {
            tracing::info!(tenant = tenant.tenant.slug, tool = %name, call = %call.call_id, "action ran");
            Ok(Json(result))
        }
        Err(e @ ActionError::UnknownTool(_)) => Err(refuse(StatusCode::NOT_FOUND, e.to_string())),
        Err(e @ ActionError::Invalid(_)) => Err(refuse(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())),
        Err(e @ ActionError::Database(_)) => {
            tracing::error!(tenant = tenant.tenant.slug, tool = %name, error = %e, "an action failed");
            Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "the academy database is unavailable; try again"))
        }
    }
}
