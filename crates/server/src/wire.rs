//! Wire types of the chat contract (docs/service.md): its bodies, queries and answers, the
//! only place the routes' camelCase names live (the `chat --url` client speaks through them
//! too). The ids in them are `toolgraph-protocol`'s types, the bare numbers on the wire. (The
//! identity a turn's tools read, `tenantId`/`userId`/`conversationId` in the agent's state, is
//! the service's to write.)

use crate::error::ChatError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolgraph_protocol::{ConversationId, MessageId, TenantId, UserId};

/// A request body that names who is asking: a tenant and a person of it
/// ([`crate::extract::Authorized`] admits them).
pub trait TenantScoped {
    /// The tenant and person the handler will act for.
    fn asker(&self) -> (TenantId, UserId);
}

/// `?tenantId=&userId=`: who asks on a route that names them in its query
/// ([`crate::extract::QueryAsker`] admits them).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct AskerQuery {
    #[param(example = 1)]
    pub tenant_id: TenantId,
    #[param(example = 1)]
    pub user_id: UserId,
}

/// `?tenantId=`: the tenant of `DELETE /api/chatbot/users/{id}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct TenantQuery {
    #[param(example = 1)]
    pub tenant_id: TenantId,
}

/// `?limit=` of `GET /api/chatbot/conversations`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    pub limit: Option<usize>,
}

/// `POST /api/chatbot/stream`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"tenantSlug": "default", "tenantId": 1, "userId": 1, "message": "What is 12 * 7?"}))]
pub struct StreamRequest {
    #[schema(min_length = 1)]
    pub tenant_slug: String,
    pub tenant_id: TenantId,
    pub user_id: UserId,
    #[serde(default)]
    pub conversation_id: Option<ConversationId>,
    /// The person's message: 1 to 4,000 characters.
    #[schema(min_length = 1, max_length = 4000)]
    pub message: String,
    /// Extension: the agent to talk to (`agentId` is accepted too, in the contract's style of
    /// names).
    #[serde(default, alias = "agentId", skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Extension: state values for injected tool arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub context: Option<Map<String, Value>>,
    /// Extension: also stream `tool_call` and `tool_result` events (off by default, so a
    /// client of the original contract sees exactly its four event types).
    #[serde(default)]
    pub tool_events: bool,
    /// Extension: the ids of the person's uploads (`POST /api/chatbot/uploads`) this turn
    /// attaches to the conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<String>,
}

/// `?tenantId=&userId=&name=` of `POST /api/chatbot/uploads`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// The document's file name; its extension says its type.
    pub name: String,
}

/// `POST /api/chatbot/confirm`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfirmRequest {
    #[schema(min_length = 1)]
    pub tenant_slug: String,
    pub tenant_id: TenantId,
    pub user_id: UserId,
    pub conversation_id: ConversationId,
    pub message_id: MessageId,
    pub confirmed: bool,
}

/// `POST /api/chatbot/answer`: the person's answer to a question an agent asked (a pending
/// action whose `toolName` is `@ask`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnswerRequest {
    #[schema(min_length = 1)]
    pub tenant_slug: String,
    pub tenant_id: TenantId,
    pub user_id: UserId,
    pub conversation_id: ConversationId,
    pub message_id: MessageId,
    /// Free text (a string), or a value matching the question's form.
    pub answer: Value,
}

/// `POST /api/chatbot/conversations/{id}/fork`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkRequest {
    #[schema(min_length = 1)]
    pub tenant_slug: String,
    pub tenant_id: TenantId,
    pub user_id: UserId,
    pub seq: u64,
}

impl TenantScoped for StreamRequest {
    fn asker(&self) -> (TenantId, UserId) {
        (self.tenant_id, self.user_id)
    }
}

impl TenantScoped for ConfirmRequest {
    fn asker(&self) -> (TenantId, UserId) {
        (self.tenant_id, self.user_id)
    }
}

impl TenantScoped for AnswerRequest {
    fn asker(&self) -> (TenantId, UserId) {
        (self.tenant_id, self.user_id)
    }
}

impl TenantScoped for ForkRequest {
    fn asker(&self) -> (TenantId, UserId) {
        (self.tenant_id, self.user_id)
    }
}

/// A pending write action as the contract shows it, in a `pending` frame and in confirm
/// answers (`From<&toolgraph_conversations::PendingAction>` makes one of a stored action).
pub use toolgraph_protocol::PendingAction as PendingActionDto;

/// A message of 1 to [`MAX_MESSAGE_CHARS`] characters (Unicode scalar values, not bytes), on
/// every door.
pub(crate) fn check_message(message: &str) -> Result<(), ChatError> {
    let n = message.chars().count();
    if n == 0 || n > MAX_MESSAGE_CHARS {
        return Err(ChatError::Invalid {
            field: "message".into(),
            message: format!("message must be 1 to {MAX_MESSAGE_CHARS} characters, got {n}"),
        });
    }
    Ok(())
}

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
        check_message(&self.message)
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfirmResponse {
    pub conversation_id: ConversationId,
    pub message: String,
    pub pending_action: Option<PendingActionDto>,
}

/// Most conversations one listing answers.
pub const MAX_LISTED_CONVERSATIONS: usize = 100;

/// Longest message accepted, in Unicode scalar values.
pub const MAX_MESSAGE_CHARS: usize = 4000;

/// `GET /api/chatbot/conversations`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConversationList {
    pub conversations: Vec<toolgraph_conversations::ConversationSummary>,
}

/// `POST /api/chatbot/conversations/{id}/fork`: 201 with the new conversation and where it
/// was forked from.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkResponse {
    pub conversation_id: ConversationId,
    pub forked_from: ForkedFrom,
}

/// The conversation and checkpoint a fork copied.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    pub conversation_id: ConversationId,
    pub seq: u64,
}

/// `GET /api/chatbot/agents`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentList {
    pub default_agent: String,
    pub agents: Vec<AgentEntry>,
}

/// One agent served: its name, the digest of the declaration it runs (`null` for a graph built
/// in code), and a newer declaration that failed its checks while this version keeps serving.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AgentEntry {
    pub name: String,
    #[serde(flatten)]
    pub revision: toolgraph_agents::chat_agent::Revision,
}

/// `GET /api/chatbot/conversations/{id}/checkpoints`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointList {
    pub conversation_id: ConversationId,
    pub checkpoints: Vec<toolgraph_graph::CheckpointMeta>,
}

/// `GET /api/chatbot/conversations/{id}/checkpoints/{seq}`: the state a checkpoint left.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub conversation_id: ConversationId,
    pub seq: u64,
    pub next: Option<String>,
    pub pending: Vec<toolgraph_graph::PendingInterrupt>,
    /// Each decided interrupt's decision, by interrupt id.
    #[schema(value_type = Object)]
    pub decisions: std::collections::BTreeMap<toolgraph_graph::InterruptId, toolgraph_graph::Decision>,
    pub state: Value,
}

/// Tokens as the usage routes show them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_prompt_tokens: u64,
}

/// One turn's use of one model.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnUsageDto {
    pub run_id: String,
    pub agent: String,
    pub model: String,
    #[serde(flatten)]
    pub tokens: Tokens,
    pub calls: u32,
    /// When the turn ended, ms since the Unix epoch.
    pub at_ms: i64,
}

/// `GET /api/chatbot/conversations/{id}/usage`: what the conversation's turns used.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationUsage {
    pub conversation_id: ConversationId,
    pub turns: Vec<TurnUsageDto>,
    pub total: Tokens,
}

impl ConversationUsage {
    pub fn new(conversation_id: ConversationId, kept: Vec<toolgraph_conversations::TurnUsage>) -> Self {
        let mut total = Tokens::default();
        let turns = kept
            .into_iter()
            .map(|u| {
                let tokens = Tokens {
                    prompt_tokens: u.prompt,
                    completion_tokens: u.completion,
                    cached_prompt_tokens: u.cached_prompt,
                };
                total.prompt_tokens = total.prompt_tokens.saturating_add(u.prompt);
                total.completion_tokens = total.completion_tokens.saturating_add(u.completion);
                total.cached_prompt_tokens = total.cached_prompt_tokens.saturating_add(u.cached_prompt);
                TurnUsageDto {
                    run_id: u.run_id,
                    agent: u.agent,
                    model: u.model,
                    tokens,
                    calls: u.calls,
                    at_ms: u.at_ms,
                }
            })
            .collect();
        Self { conversation_id, turns, total }
    }
}

/// `GET /api/chatbot/tenants/{id}/usage`: the tenant's tokens in the budget's current period.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantUsage {
    pub tenant_id: TenantId,
    /// `hour`, `day` or `month` (UTC).
    pub period: &'static str,
    pub period_start_ms: i64,
    pub period_end_ms: i64,
    /// Prompt and completion tokens of the tenant's turns in the period.
    pub used_tokens: u64,
    /// The period's budget; absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u64>,
}

/// `DELETE /api/chatbot/users/{id}` and `/tenants/{id}`: how many conversations went.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    pub deleted_conversations: usize,
}
