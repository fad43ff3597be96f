//! The bodies of the `/internal/chatbot/**` calls, shared by the calling and the receiving
//! side so the two cannot drift apart. Field names are the backend's (camel case); the
//! fields are documented where the call is ([`path`]).
#![allow(missing_docs)]

use crate::{Conversation, Decided, NewPending, PendingAction, ReleasedTurn, StoredMessage, TurnClaim};
use serde::{Deserialize, Serialize};

/// Every path of the surface, relative to the backend's base URL.
pub mod path {
    /// Create a conversation (named by the academy-admin contract).
    pub const CONVERSATIONS: &str = "/internal/chatbot/conversations";
    /// Look up a conversation of a tenant and user.
    pub const CONVERSATION_LOOKUP: &str = "/internal/chatbot/conversations/lookup";
    /// Claim a conversation for a run (a lease).
    pub const TURN_BEGIN: &str = "/internal/chatbot/turns/begin";
    /// Extend a run's lease.
    pub const TURN_RENEW: &str = "/internal/chatbot/turns/renew";
    /// Free every claim of a restarted service instance.
    pub const TURN_RELEASE_OWNER: &str = "/internal/chatbot/turns/release-owner";
    /// Take over conversations whose run's lease expired.
    pub const TURN_TAKE_OVER: &str = "/internal/chatbot/turns/take-over";
    /// Release a run's claim.
    pub const TURN_END: &str = "/internal/chatbot/turns/end";
    /// Persist a user, assistant or tool message (named by the contract).
    pub const SAVE_MESSAGE: &str = "/internal/chatbot/save-message";
    /// Persist an interrupt as a pending action (named by the contract).
    pub const PENDING_ACTION: &str = "/internal/chatbot/pending-action";
    /// Look up a pending action of a tenant, user and conversation.
    pub const PENDING_LOOKUP: &str = "/internal/chatbot/pending-action/lookup";
    /// Record a decision once.
    pub const PENDING_DECIDE: &str = "/internal/chatbot/pending-action/decide";
    /// Every pending action of a run.
    pub const RUN_PENDING: &str = "/internal/chatbot/runs/pending-actions";
    /// Store a run's final confirm response.
    pub const RUN_RESPONSE: &str = "/internal/chatbot/runs/response";
    /// A conversation's messages (named by the contract; `GET ?conversationId=N`).
    pub const HISTORY: &str = "/internal/chatbot/history";
    /// Delete a conversation.
    pub const DELETE_CONVERSATION: &str = "/internal/chatbot/delete/conversation";
    /// Delete a user's conversations.
    pub const DELETE_USER: &str = "/internal/chatbot/delete/user";
    /// A user's conversations, newest first.
    pub const CONVERSATION_LIST: &str = "/internal/chatbot/conversations/list";
    /// Delete a tenant's conversations.
    pub const DELETE_TENANT: &str = "/internal/chatbot/delete/tenant";
    /// Run the model's read-only SQL for a tenant and user (the `general_query` tool).
    pub const QUERY: &str = "/internal/chatbot/query";
    /// Run an approved write tool: `{TOOLS}/{toolName}` (named by the contract).
    pub const TOOLS: &str = "/internal/chatbot/tools";
    /// A tenant's schema description for the system prompt (named by the contract;
    /// `GET ?tenantId=N`).
    pub const SCHEMA: &str = "/internal/chatbot/schema";
}

/// `GET schema`: the tenant's schema, as text for the system prompt.
#[derive(Debug, Serialize, Deserialize)]
pub struct TenantSchema {
    pub schema: String,
}

/// Who a delegated tool call is for, from the turn (never from the model). `tenantSlug` is the
/// slug the request came with (also in `X-Tenant-Slug`, here under the signature), for a
/// backend to check against `tenantId`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Caller {
    pub tenant_slug: String,
    pub tenant_id: i64,
    pub user_id: i64,
    pub conversation_id: Option<i64>,
}

/// `POST tools/{toolName}`: an approved write tool's arguments, for a tenant and user. The
/// answer is any JSON object, the tool's result. `callId` (the model's id of the call,
/// unique within the conversation and the same if a run resumes after a crash) lets the backend
/// run an action once per `(conversationId, callId)`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunTool {
    #[serde(flatten)]
    pub caller: Caller,
    pub call_id: Option<String>,
    pub arguments: serde_json::Value,
}

/// `POST query`: the model's SQL, run by the backend under the tenant's and user's rights.
/// The answer is any JSON object, handed to the model as the tool's result; a 4xx answer's
/// `error` is handed to the model as a query it may repair.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunQuery {
    #[serde(flatten)]
    pub caller: Caller,
    pub sql: String,
}

/// `POST conversations`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateConversation {
    pub tenant_id: i64,
    pub user_id: i64,
    pub agent: String,
}

/// An id the backend allocated.
#[derive(Debug, Serialize, Deserialize)]
pub struct Created {
    pub id: i64,
}

/// A tenant's and user's conversation (`conversations/lookup`, `delete/conversation`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedConversation {
    pub tenant_id: i64,
    pub user_id: i64,
    pub conversation_id: i64,
}

/// The answer of `conversations/lookup`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConversationFound {
    pub conversation: Option<Conversation>,
}

/// `turns/begin` and `turns/renew`: a run's claim (lease) on a conversation.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnLease {
    pub conversation_id: i64,
    #[serde(flatten)]
    pub claim: TurnClaim,
}

/// `turns/release-owner`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReleaseOwner {
    pub owner: String,
}

/// `turns/take-over`: at most `limit` expired claims, each taken for `claim`.
#[derive(Debug, Serialize, Deserialize)]
pub struct TakeOver {
    pub claim: TurnClaim,
    pub limit: usize,
}

/// The answer of `turns/release-owner` and `turns/take-over`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Released {
    pub released: Vec<ReleasedTurn>,
}

/// The answer of `turns/begin` and `turns/renew`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claimed {
    pub claimed: bool,
}

/// `turns/end`, `runs/pending-actions`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    pub conversation_id: i64,
    pub run_id: String,
}

/// `save-message`: a user, assistant or tool message (pending messages come with their
/// action, through `pending-action`). The role stays text here, so a receiver can name a bad
/// one in its own error shape.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SaveMessage {
    pub conversation_id: i64,
    /// `user`, `assistant` or `tool` ([`Role`](crate::Role)).
    pub role: String,
    pub content: String,
}

/// The answer of `history`.
#[derive(Debug, Serialize, Deserialize)]
pub struct History {
    pub messages: Vec<StoredMessage>,
}

/// `pending-action`: the action to persist, as the store takes it.
pub type SavePending = NewPending;

/// `pending-action/lookup`.
pub type PendingLookup = crate::PendingLookup;

/// The answer of `pending-action/lookup`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingFound {
    pub pending_action: Option<PendingAction>,
}

/// The answer of `runs/pending-actions`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunPending {
    pub pending_actions: Vec<PendingAction>,
}

/// `pending-action/decide`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decide {
    pub message_id: i64,
    pub approve: bool,
}

/// The answer of `pending-action/decide`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DecideAnswer {
    pub outcome: Decided,
}

/// `runs/response`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResponse {
    pub conversation_id: i64,
    pub run_id: String,
    pub response: String,
}

/// `conversations/list`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListConversations {
    pub tenant_id: i64,
    pub user_id: i64,
    pub limit: usize,
}

/// The answer of `conversations/list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ConversationList {
    pub conversations: Vec<crate::ConversationSummary>,
}

/// `delete/user`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserRef {
    pub tenant_id: i64,
    pub user_id: i64,
}

/// `delete/tenant`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantRef {
    pub tenant_id: i64,
}

/// The answer of `delete/conversation`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: bool,
}

/// The answer of `delete/user` and `delete/tenant`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletedConversations {
    pub conversation_ids: Vec<i64>,
}

/// The answer of calls that return nothing.
#[derive(Debug, Serialize, Deserialize, Default)]
pub struct Empty {}

/// The `{"error": "..."}` body of a failed call.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}
