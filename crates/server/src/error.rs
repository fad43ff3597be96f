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
    /// The actions waiting for a decision, when that is why the request was refused.
    pub pending_actions: Option<Vec<toolgraph_protocol::PendingAction>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending_actions: Option<&'a [toolgraph_protocol::PendingAction]>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), field: None, retry_after: None, pending_actions: None }
    }
    pub fn field(status: StatusCode, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), field: Some(field.into()), retry_after: None, pending_actions: None }
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
    /// 503: a run's events cannot be read from the shared store right now (`_cause` is logged
    /// where it is found).
    pub fn run_events_unavailable(_cause: String) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "the run's events cannot be read right now; retry shortly")
    }
    /// An internal failure: logged with its cause, answered without it.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "request failed");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: &self.message,
            field: self.field.as_deref(),
            pending_actions: self.pending_actions.as_deref(),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Why the chat service refused or failed a request, in the contract's terms; the HTTP layer
/// maps each to its status ([`ApiError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// A request value the contract does not accept.
    #[error("{message}")]
    Invalid {
        /// The field, as the contract names it (`message`, `agent`, `context.KEY`).
        field: String,
        /// Why.
        message: String,
    },
    /// The conversation, pending action or run is not the caller's, or does not exist (the
    /// two are not told apart).
    #[error("not found")]
    NotFound,
    /// The request cannot be carried out now (a turn is running, the action was decided the
    /// other way).
    #[error("{0}")]
    Conflict(String),
    /// A new turn while another run holds the conversation (on this replica or another).
    #[error("a turn is already running on this conversation")]
    Busy,
    /// A new turn while the conversation's last run waits for decisions: these actions.
    #[error("this conversation has pending actions to confirm first")]
    AwaitingDecision(Vec<toolgraph_protocol::PendingAction>),
    /// The tenant has as many runs in flight as it may.
    #[error("this tenant already has {limit} runs in flight")]
    TooManyRuns {
        /// The per-tenant limit.
        limit: usize,
    },
    /// The tenant's turns used its token budget for the period.
    #[error(
        "this tenant's turns used its token budget for this {period} ({used} of {budget} tokens); it renews in {retry_after} s"
    )]
    OverBudget {
        /// Tokens used in the period.
        used: u64,
        /// The period's budget.
        budget: u64,
        /// The period's name (`hour`, `day`, `month`).
        period: &'static str,
        /// Seconds until the next period starts.
        retry_after: u64,
    },
    /// A request body larger than the route accepts.
    #[error("{0}")]
    TooLarge(String),
    /// A document of a type the service does not read.
    #[error("{0}")]
    UnsupportedType(String),
    /// What this service's configuration does not provide (its store keeps no such data).
    #[error("{0}")]
    Unsupported(String),
    /// The resumed run ended without an answer (the model failed, the service is stopping).
    #[error("{0}")]
    RunFailed(String),
    /// The conversation store is down or refused.
    #[error(transparent)]
    Store(#[from] toolgraph_conversations::StoreError),
    /// Something that should not fail did (logged, not shown).
    #[error("{0}")]
    Internal(String),
}

impl ChatError {
    /// A conflict with this message.
    pub fn conflict(message: &str) -> Self {
        Self::Conflict(message.to_owned())
    }
}

impl From<ChatError> for ApiError {
    fn from(e: ChatError) -> Self {
        match e {
            ChatError::Invalid { field, message } => Self::field(StatusCode::UNPROCESSABLE_ENTITY, field, message),
            ChatError::NotFound => Self::not_found(),
            ChatError::Conflict(message) => Self::new(StatusCode::CONFLICT, message),
            e @ ChatError::Busy => Self::new(StatusCode::CONFLICT, e.to_string()),
            ChatError::AwaitingDecision(pending) => Self {
                pending_actions: Some(pending),
                ..Self::new(StatusCode::CONFLICT, "this conversation has pending actions to confirm first")
            },
            e @ ChatError::TooManyRuns { .. } => {
                let mut answer = Self::new(StatusCode::TOO_MANY_REQUESTS, e.to_string());
                answer.retry_after = Some(1);
                answer
            }
            e @ ChatError::OverBudget { retry_after, .. } => {
                let mut answer = Self::new(StatusCode::TOO_MANY_REQUESTS, e.to_string());
                answer.retry_after = Some(retry_after);
                answer
            }
            ChatError::Unsupported(message) => Self::new(StatusCode::NOT_IMPLEMENTED, message),
            ChatError::TooLarge(message) => Self::new(StatusCode::PAYLOAD_TOO_LARGE, message),
            ChatError::UnsupportedType(message) => Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message),
            ChatError::RunFailed(message) => Self::new(StatusCode::BAD_GATEWAY, message),
            // The store is down or refused: the request may succeed later, so 503 + `Retry-After`.
            ChatError::Store(e) => {
                tracing::error!(error = %e, "the conversation store failed");
                Self {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    message: "the conversation store is unavailable; try again".into(),
                    field: None,
                    retry_after: Some(1),
                    pending_actions: None,
                }
            }
            ChatError::Internal(cause) => Self::internal(cause),
        }
    }
}

impl From<toolgraph_conversations::StoreError> for ApiError {
    fn from(e: toolgraph_conversations::StoreError) -> Self {
        ChatError::Store(e).into()
    }
}

/// Most characters of a client's id an error message repeats.
const ECHOED_CHARS: usize = 64;

/// An id a client sent, as an error message repeats it: control characters escaped, and one
/// longer than [`ECHOED_CHARS`] cut there, saying how long it was — a refusal names what was
/// asked for without sending back whatever a client put in a path.
pub(crate) fn echoed(id: &str) -> String {
    let mut shown = String::with_capacity(id.len().min(4 * ECHOED_CHARS));
    for c in id.chars().take(ECHOED_CHARS) {
        // Control characters, and the invisible ones that reorder or hide text (bidi
        // overrides, zero-width marks), shown as escapes.
        let invisible =
            matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
        if c.is_control() {
            shown.extend(c.escape_debug());
        } else if invisible {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    let n = id.chars().count();
    if n > ECHOED_CHARS {
        shown.push_str(&format!("… ({n} characters)"));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echoed_id_is_cut_and_its_control_characters_escaped() {
        assert_eq!(echoed("019a-run"), "019a-run");
        assert_eq!(echoed("a\u{0}b\nc\u{1b}[31m"), "a\\0b\\nc\\u{1b}[31m");
        assert_eq!(echoed("run\u{202E}gpj.exe\u{200B}"), "run\\u{202e}gpj.exe\\u{200b}", "bidi and zero-width");
        assert_eq!(echoed(&"x".repeat(5000)), format!("{}… (5000 characters)", "x".repeat(ECHOED_CHARS)));
        let accented = echoed(&"é".repeat(ECHOED_CHARS + 1));
        assert_eq!(accented, format!("{}… ({} characters)", "é".repeat(ECHOED_CHARS), ECHOED_CHARS + 1));
        assert_eq!(echoed(&"é".repeat(ECHOED_CHARS)), "é".repeat(ECHOED_CHARS), "exactly the limit: whole");
    }
}
