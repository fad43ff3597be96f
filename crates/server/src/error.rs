//! [`ApiError`]: every error answer of the service, as `{"error": "...", "field": "..."}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub field: Option<String>,
    pub retry_after: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), field: None, retry_after: None }
    }
    pub fn field(status: StatusCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), field: Some(field.into()), retry_after: None }
    }
    pub fn not_found() -> Self {
        // Existence of other tenants' objects is never revealed: one message for all.
        Self::new(StatusCode::NOT_FOUND, "not found")
    }
    pub fn not_ready() -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "the service is not ready")
    }
    /// The message, prefixed by the field it is about.
    pub fn describe(&self) -> String {
        match &self.field {
            Some(f) if !self.message.contains(f.as_str()) => format!("{f}: {}", self.message),
            _ => self.message.clone(),
        }
    }
    /// An internal failure: logged with its cause, answered without it.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "request failed");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body { error: &self.message, field: self.field.as_deref() };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<crate::store::StoreError> for ApiError {
    /// The store is down or refused: the request may succeed later, so 503 + `Retry-After`.
    fn from(e: crate::store::StoreError) -> Self {
        tracing::error!(error = %e, "the conversation store failed");
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the conversation store is unavailable; try again".into(),
            field: None,
            retry_after: Some(1),
        }
    }
}
