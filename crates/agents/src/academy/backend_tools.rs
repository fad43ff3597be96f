//! The academy admin's delegated tools, run by the backend, which re-establishes the tenant's and
//! user's context and keeps its own validation and row-level security; the service never
//! opens a tenant data connection:
//! - `general_query` ([`backend_general_query`], `POST /internal/chatbot/query`), a read tool;
//! - the write tools (`create_announcement`, `send_sms`, … — [`BackendWriteTool`],
//!   `POST /internal/chatbot/tools/{toolName}`), declared in configuration with the JSON
//!   Schema of their arguments, run only after a person approved the call.
//!
//! The tenant, user and conversation come from the turn's state context (set by the service
//! from the authenticated request on every turn); they are not tool arguments, so the model
//! neither sees nor sets them.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_conversations::backend::wire::{Caller, RunQuery, RunTool, path};
use toolgraph_conversations::backend::{BackendConversationStore, CallFailure, error_reason};
use toolgraph_tools::{
    ArgumentSchema, SchemaError, Tool, ToolBuilder, ToolClass, ToolContext, ToolDisplay, ToolError, ToolSpec,
};

/// Arguments of the delegated `general_query`. Not the builtin tool's `QueryArgs`: that one
/// caps the SQL at 8,000 characters for the service's own database, while here the backend
/// owns the limits and the description speaks of the tenant's data.
#[derive(Debug, Deserialize, JsonSchema)]
struct QueryArgs {
    /// One read-only SQL SELECT statement over the tenant's data.
    sql: String,
}

/// Longest part of a backend error handed to the model.
const QUOTED_ERROR: usize = 500;

/// A delegated tool's own time limit: the backend call's plus 5 s, so the call's limit answers
/// first, with its cause, and this one is the backstop.
fn tool_limit(backend: &BackendConversationStore) -> Duration {
    backend.timeout() + Duration::from_secs(5)
}

/// Who the call is for: the turn's `tenant`, `tenantId`, `userId` and `conversationId`, which
/// the service sets on every turn. Missing ones are the service's fault, not the model's.
fn caller(ctx: &ToolContext) -> Result<Caller, ToolError> {
    let id = |key: &str| ctx.get(key).and_then(Value::as_i64);
    let (Some(slug), Some(tenant_id), Some(user_id)) = (ctx.get_str("tenant"), id("tenantId"), id("userId")) else {
        return Err(ToolError::internal("the turn carries no tenant and user to act for"));
    };
    Ok(Caller { tenant_slug: slug.to_owned(), tenant_id, user_id, conversation_id: id("conversationId") })
}

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
    .display_name("SQL query")
    .param_display("sql", "SQL")
    .timeout(tool_limit(&backend))
    .handler(move |ctx, a: QueryArgs| {
        let backend = backend.clone();
        async move {
            let body = RunQuery { caller: caller(&ctx)?, sql: a.sql };
            let answer = backend.post_for_tenant(path::QUERY, &body.caller.tenant_slug, &body).await;
            tool_result(answer, "the query")
        }
    })
}

/// A tool's result out of the backend's answer to it (`what` names the call in errors): a
/// 2xx JSON body as is; 400/422 a refusal the model may act on; 401/403 denied; anything
/// else, or no answer, unavailable.
fn tool_result(answer: Result<(reqwest::StatusCode, String), CallFailure>, what: &str) -> Result<Value, ToolError> {
    let (status, text) = answer.map_err(|f| {
        tracing::warn!(error = %f.message, "backend tool call failed");
        if f.timed_out {
            ToolError::timeout(format!("the backend did not answer {what} in time; try again later"))
        } else {
            ToolError::unavailable(format!("the backend could not be reached for {what}; try again later"))
        }
    })?;
    if status.is_success() {
        return serde_json::from_str::<Value>(&text)
            .map_err(|e| ToolError::unavailable(format!("the backend's answer to {what} is not JSON: {e}")));
    }
    let reason = error_reason(&text, QUOTED_ERROR);
    Err(match status.as_u16() {
        400 | 422 => ToolError::invalid_arguments(format!("the backend refused {what}: {reason}")),
        401 | 403 => ToolError::denied(format!("the backend denied {what}: {reason}")),
        // The backend's internals are logged, not handed to the model.
        _ => {
            tracing::warn!(%status, reason, "backend tool call failed");
            ToolError::unavailable(format!("the backend failed ({status}) on {what}; try again later"))
        }
    })
}

/// A write tool the backend runs (`POST /internal/chatbot/tools/{name}` with `{tenantId,
/// userId, conversationId, arguments}`), after approval like every write tool.
pub struct BackendWriteTool {
    spec: ToolSpec,
    schema: ArgumentSchema,
    backend: BackendConversationStore,
    /// The approval text's template (`toolgraph_tools::describe`).
    describe: Option<String>,
}

impl BackendWriteTool {
    /// Write tool `name` with the model-facing `description` and the JSON Schema of its
    /// `parameters` (an object schema), run by `backend`.
    ///
    /// # Errors
    /// An invalid name, or parameters that are not a compilable object schema.
    pub fn new(
        backend: BackendConversationStore,
        name: &str,
        description: &str,
        parameters: Value,
    ) -> Result<Self, SchemaError> {
        if !toolgraph_tools::valid_tool_name(name) {
            return Err(SchemaError::InvalidName { tool: name.to_owned() });
        }
        let schema = ArgumentSchema::from_value(name, parameters, &[])?;
        let spec = ToolSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            class: ToolClass::Write,
            parameters: schema.model_facing().clone(),
            injected: Vec::new(),
            offered_after: Vec::new(),
            required_after: Vec::new(),
            runs_after: Vec::new(),
            answer_field: None,
            cited_as: None,
            display: ToolDisplay::default(),
        };
        Ok(Self { spec, schema, backend, describe: None })
    }

    /// The action text a person approves, from `template` (`toolgraph_tools::describe`).
    ///
    /// # Errors
    /// A placeholder that names no parameter.
    pub fn with_describe(mut self, template: &str) -> Result<Self, SchemaError> {
        let properties = self.spec.parameters.get("properties").and_then(Value::as_object);
        if let Some(unknown) =
            toolgraph_tools::describe::placeholders(template).find(|p| !properties.is_some_and(|m| m.contains_key(*p)))
        {
            return Err(SchemaError::UnknownPlaceholder { tool: self.spec.name.clone(), argument: unknown.to_owned() });
        }
        self.describe = Some(template.to_owned());
        Ok(self)
    }
}

#[async_trait]
impl Tool for BackendWriteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn arguments(&self) -> &ArgumentSchema {
        &self.schema
    }

    fn timeout(&self) -> Duration {
        tool_limit(&self.backend)
    }

    fn describe(&self, arguments: &Value) -> String {
        match &self.describe {
            Some(template) => toolgraph_tools::describe::fill_describe(template, arguments),
            None => format!("Run {} with {}", self.spec.name, arguments),
        }
    }

    async fn invoke(&self, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        let call_id = ctx.get_str("toolCallId").map(str::to_owned);
        let body = RunTool { caller: caller(ctx)?, call_id, arguments };
        let target = format!("{}/{}", path::TOOLS, self.spec.name);
        let answer = self.backend.post_for_tenant(&target, &body.caller.tenant_slug, &body).await;
        tool_result(answer, &format!("'{}'", self.spec.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use serde_json::json;
    use toolgraph_conversations::backend::BackendOptions;
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
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        (StatusCode::OK, "{}".to_owned())
                    }
                    _ => (StatusCode::OK, json!({"rows": [[1]], "tenantId": body["tenantId"]}).to_string()),
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let options =
            BackendOptions { base_url, secret: b"0123456789abcdef".to_vec(), timeout: Duration::from_millis(500) };
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
        assert_eq!(ok.to_json()["tenantId"], 7, "the turn's tenant wins over the model's: {ok:?}");
        let kind = |o: toolgraph_tools::ToolOutcome| o.error().map(|e| (e.kind, e.message.clone()));
        let (k, msg) = kind(call("forbidden").await).unwrap();
        assert_eq!(k, ToolErrorKind::Denied);
        assert!(msg.contains("no access to salaries"), "{msg}");
        let (k, msg) = kind(call("broken").await).unwrap();
        assert_eq!(k, ToolErrorKind::Unavailable);
        assert!(msg.contains("502") && !msg.contains("upstream down"), "internals stay in the log: {msg}");
        let (k, _) = kind(call("garbage").await).unwrap();
        assert_eq!(k, ToolErrorKind::Unavailable);
        let (k, msg) = kind(call("slow").await).unwrap();
        assert_eq!(k, ToolErrorKind::Timeout, "the call's own limit (500 ms) answered: {msg}");
        // A turn without its ids is the service's fault, not a query the model could fix.
        let out = reg.call(&ToolContext::default(), "general_query", &json!({"sql": "select 1"})).await;
        assert_eq!(out.error().map(|e| e.kind), Some(ToolErrorKind::Internal), "{out:?}");
    }

    #[tokio::test]
    async fn write_tools_need_an_object_schema_a_valid_name_and_a_tenant() {
        let store = backend().await;
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
        let sms_schema = json!({"type": "object", "properties": {
            "recipients": {"type": "array", "items": {"type": "string"}}, "message": {"type": "string"}}});
        let sms = BackendWriteTool::new(store.clone(), "send_sms", "x", sms_schema).unwrap();
        let sms = sms.with_describe("Send an SMS to {#recipients} parents: {message}").unwrap();
        let args = json!({"recipients": ["Ana", "Luis", "Mai"], "message": "Mañana no hay clase"});
        assert_eq!(sms.describe(&args), "Send an SMS to 3 parents: Mañana no hay clase");
        let bad = BackendWriteTool::new(store.clone(), "send_sms", "x", schema.clone()).unwrap().with_describe("{to}");
        assert!(bad.err().is_some_and(|e| e.to_string().contains("{to}")), "a placeholder that is no parameter");
        assert!(BackendWriteTool::new(store.clone(), "send sms", "x", schema.clone()).is_err(), "a space in the name");
        assert!(BackendWriteTool::new(store.clone(), "send_sms", "x", json!({"type": "string"})).is_err());
        let tool = Arc::new(BackendWriteTool::new(store, "send_sms", "Send an SMS.", schema).unwrap());
        assert_eq!(tool.spec().class, ToolClass::Write);
        let mut reg = ToolRegistry::new();
        reg.register(tool).unwrap();
        let out = reg.call(&ToolContext::default(), "send_sms", &json!({"text": "hola"})).await;
        assert_eq!(out.error().map(|e| e.kind), Some(ToolErrorKind::Internal), "no tenant in the turn: {out:?}");
        let out = reg.call(&ToolContext::default(), "send_sms", &json!({})).await;
        assert_eq!(out.error().map(|e| e.kind), Some(ToolErrorKind::InvalidArguments), "{out:?}");
    }
}
