//! Wire types of the chat contract (docs/service.md); the only place its camelCase names live
//! (the `chat --url` client speaks through them too).

use crate::error::ChatError;
use crate::extract::TenantScoped;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /api/chatbot/stream`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamRequest {
    pub tenant_slug: String,
    pub tenant_id: i64,
    pub user_id: i64,
    #[serde(default)]
    pub conversation_id: Option<i64>,
    pub message: String,
    /// Extension: the agent to talk to (`agentId` is accepted too, in the contract's style of
    /// names).
    #[serde(default, alias = "agentId", skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Extension: state values for injected tool arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// Extension: also stream `tool_call` and `tool_result` events (off by default, so a
    /// client of the original contract sees exactly its four event types).
    #[serde(default)]
    pub tool_events: bool,
}

/// `POST /api/chatbot/confirm`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfirmRequest {
    pub tenant_slug: String,
    pub tenant_id: i64,
    pub user_id: i64,
    pub conversation_id: i64,
    pub message_id: i64,
    pub confirmed: bool,
}

/// `POST /api/chatbot/answer`: the person's answer to a question an agent asked (a pending
/// action whose `toolName` is `@ask`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnswerRequest {
    pub tenant_slug: String,
    pub tenant_id: i64,
    pub user_id: i64,
    pub conversation_id: i64,
    pub message_id: i64,
    /// Free text (a string), or a value matching the question's form.
    pub answer: Value,
}

/// `POST /api/chatbot/conversations/{id}/fork`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkRequest {
    pub tenant_slug: String,
    pub tenant_id: i64,
    pub user_id: i64,
    pub seq: u64,
}

impl TenantScoped for StreamRequest {
    fn tenant_id(&self) -> i64 {
        self.tenant_id
    }
}

impl TenantScoped for ConfirmRequest {
    fn tenant_id(&self) -> i64 {
        self.tenant_id
    }
}

impl TenantScoped for AnswerRequest {
    fn tenant_id(&self) -> i64 {
        self.tenant_id
    }
}

impl TenantScoped for ForkRequest {
    fn tenant_id(&self) -> i64 {
        self.tenant_id
    }
}

/// A pending write action as the contract shows it, in a `pending` frame and in confirm
/// answers (`From<&toolgraph_conversations::PendingAction>` makes one of a stored action).
pub use toolgraph_protocol::PendingAction as PendingActionDto;

/// `tenantSlug` must not be empty.
fn check_slug(slug: &str) -> Result<(), ChatError> {
    if slug.is_empty() {
        return Err(ChatError::Invalid { field: "tenantSlug".into(), message: "tenantSlug must not be empty".into() });
    }
    Ok(())
}

impl StreamRequest {
    /// The checks the body's types cannot make: a tenant slug, a message of 1 to
    /// [`MAX_MESSAGE_CHARS`] characters (Unicode scalar values, not bytes).
    ///
    /// # Errors
    /// [`ChatError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ChatError> {
        check_slug(&self.tenant_slug)?;
        let n = self.message.chars().count();
        if n == 0 || n > MAX_MESSAGE_CHARS {
            return Err(ChatError::Invalid {
                field: "message".into(),
                message: format!("message must be 1 to {MAX_MESSAGE_CHARS} characters, got {n}"),
            });
        }
        Ok(())
    }
}

impl ConfirmRequest {
    /// The checks the body's types cannot make: a tenant slug.
    ///
    /// # Errors
    /// [`ChatError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ChatError> {
        check_slug(&self.tenant_slug)
    }
}

impl AnswerRequest {
    /// The checks the body's types cannot make: a tenant slug.
    ///
    /// # Errors
    /// [`ChatError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ChatError> {
        check_slug(&self.tenant_slug)
    }
}

/// The confirm response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfirmResponse {
    pub conversation_id: i64,
    pub message: String,
    pub pending_action: Option<PendingActionDto>,
}

/// Most conversations one listing answers.
pub const MAX_LISTED_CONVERSATIONS: usize = 100;

/// Longest message accepted, in Unicode scalar values.
pub const MAX_MESSAGE_CHARS: usize = 4000;
