//! Seed 002's delegated read tool: `general_query` runs on the backend
//! (`POST /internal/chatbot/query`), which re-establishes the tenant's and user's context and
//! applies its own SQL validation and row-level security. The service never opens a tenant
//! data connection.
//!
//! The tenant, user and conversation come from the turn's state (set by the service from the
//! authenticated request, never by the model: they are injected arguments the model cannot
//! see or override).

use super::client::BackendConversationStore;
use super::wire::{RunQuery, path};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_tools::{SchemaError, Tool, ToolBuilder, ToolError};

/// Arguments of the delegated `general_query`.
#[derive(Debug, Deserialize, JsonSchema)]
struct QueryArgs {
    /// One read-only SQL SELECT statement over the tenant's data.
    sql: String,
    /// Injected: the tenant's slug.
    tenant: String,
    /// Injected: the tenant's id.
    #[serde(rename = "tenantId")]
    tenant_id: i64,
    /// Injected: the user's id.
    #[serde(rename = "userId")]
    user_id: i64,
    /// Injected: the conversation's id.
    #[serde(rename = "conversationId", default)]
    conversation_id: Option<i64>,
}

/// Longest part of a backend error handed to the model.
const QUOTED_ERROR: usize = 500;

/// The `general_query` read tool, run by the backend behind `backend`.
///
/// A 2xx answer is the tool's result as the backend sent it. A 400 or 422 is a query the
/// model may repair (its `error` is handed back, and the turn's SQL retry budget applies);
/// 401/403 is a refusal; anything else, or no answer, is the backend being unavailable.
///
/// # Errors
/// None in practice: the schema is fixed (the `Result` is the tool builder's).
pub fn backend_general_query(backend: BackendConversationStore) -> Result<Arc<dyn Tool>, SchemaError> {
    ToolBuilder::<QueryArgs>::new(
        "general_query",
        "Run one read-only SQL SELECT over the tenant's data and get the rows back as JSON.",
    )
    .inject("tenant")
    .inject("tenantId")
    .inject("userId")
    .inject("conversationId")
    .display_name("SQL query")
    .param_display("sql", "SQL")
    .timeout(Duration::from_secs(15))
    .handler(move |_ctx, a: QueryArgs| {
        let backend = backend.clone();
        async move {
            let body =
                RunQuery { tenant_id: a.tenant_id, user_id: a.user_id, conversation_id: a.conversation_id, sql: a.sql };
            let (status, text) =
                backend.post_for_tenant(path::QUERY, &a.tenant, &body).await.map_err(ToolError::unavailable)?;
            if status.is_success() {
                return serde_json::from_str::<Value>(&text).map_err(|e| {
                    ToolError::unavailable(format!("the backend's answer to the query is not JSON: {e}"))
                });
            }
            let reason = serde_json::from_str::<super::wire::ErrorBody>(&text)
                .map(|b| b.error)
                .unwrap_or_else(|_| text.chars().take(QUOTED_ERROR).collect());
            Err(match status.as_u16() {
                400 | 422 => ToolError::invalid_arguments(format!("the backend refused the query: {reason}")),
                401 | 403 => ToolError::denied(format!("the backend denied the query: {reason}")),
                _ => ToolError::unavailable(format!("the backend answered {status} to the query: {reason}")),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendOptions;
    use axum::http::StatusCode;
    use serde_json::json;
    use toolgraph_tools::{ToolContext, ToolErrorKind, ToolRegistry};

    /// A backend whose answer depends on the SQL: `forbidden`, `broken`, `garbage`, else rows.
    async fn backend() -> BackendConversationStore {
        let app = axum::Router::new().route(
            path::QUERY,
            axum::routing::post(|body: axum::Json<Value>| async move {
                let sql = body["sql"].as_str().unwrap_or_default().to_owned();
                match sql.as_str() {
                    "forbidden" => (StatusCode::FORBIDDEN, r#"{"error":"no access to salaries"}"#.to_owned()),
                    "broken" => (StatusCode::BAD_GATEWAY, "upstream down".to_owned()),
                    "garbage" => (StatusCode::OK, "<html>".to_owned()),
                    _ => (StatusCode::OK, json!({"rows": [[1]], "tenantId": body["tenantId"]}).to_string()),
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let options =
            BackendOptions { base_url, secret: b"0123456789abcdef".to_vec(), timeout: Duration::from_secs(5) };
        BackendConversationStore::new(options).unwrap()
    }

    #[tokio::test]
    async fn answers_map_to_results_and_error_kinds() {
        let mut reg = ToolRegistry::new();
        reg.register(backend_general_query(backend().await).unwrap()).unwrap();
        let ctx = ToolContext::default().set("tenant", json!("acme")).set("tenantId", json!(7)).set("userId", json!(3));
        let call = |sql: &'static str| {
            let (reg, ctx) = (&reg, &ctx);
            async move { reg.call(ctx, "general_query", &json!({"sql": sql, "tenantId": 99})).await }
        };
        let ok = call("select 1").await;
        assert_eq!(ok.to_json()["tenantId"], 7, "the injected tenant wins over the model's: {ok:?}");
        let kind = |o: toolgraph_tools::ToolOutcome| o.error().map(|e| (e.kind, e.message.clone()));
        let (k, msg) = kind(call("forbidden").await).unwrap();
        assert_eq!(k, ToolErrorKind::Denied);
        assert!(msg.contains("no access to salaries"), "{msg}");
        let (k, msg) = kind(call("broken").await).unwrap();
        assert_eq!(k, ToolErrorKind::Unavailable);
        assert!(msg.contains("502") && msg.contains("upstream down"), "{msg}");
        let (k, _) = kind(call("garbage").await).unwrap();
        assert_eq!(k, ToolErrorKind::Unavailable);
    }
}
