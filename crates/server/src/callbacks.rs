//! [`callback_router`]: the receiving side of the backend's `/internal/chatbot/**` calls over
//! any conversation store, every call verified first. A backend written in Rust mounts it as
//! is; one written in another language reads it as the executable contract (the end-to-end
//! suite runs the whole service through it). Calls are signed v2 (method, path, query, tenant
//! slug, body digest, nonce; docs/service.md, "Signed requests").

use crate::auth::{check_whole_request, signature_refusal};
use crate::error::ApiError;
use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use toolgraph_conversations::backend::signing::{HmacVerifier, now_secs};
use toolgraph_conversations::backend::wire::{self, path};
use toolgraph_conversations::{ConversationStore, Role};

/// Largest call body accepted (tool messages carry search results).
const MAX_BODY: usize = 1024 * 1024;

#[derive(Clone)]
struct Backend {
    store: Arc<dyn ConversationStore>,
}

/// A call's answer; failures are `{"error": "..."}` as the service's own, a failing store 503.
type Answer<T> = Result<Json<T>, ApiError>;

/// The `/internal/chatbot/**` surface over `store`; every call must carry a valid, fresh,
/// unreplayed signature of `verifier`'s secret, else it is answered 401 and not executed.
pub fn callback_router(store: Arc<dyn ConversationStore>, verifier: Arc<HmacVerifier>) -> Router {
    let router = Router::new()
        .route(path::CONVERSATIONS, post(create_conversation))
        .route(path::CONVERSATION_LOOKUP, post(conversation))
        .route(path::CONVERSATION_LIST, post(list_conversations))
        .route(path::TURN_BEGIN, post(begin_turn))
        .route(path::TURN_RENEW, post(renew_turn))
        .route(path::TURN_END, post(end_turn))
        .route(path::TURN_RELEASE_OWNER, post(release_owner))
        .route(path::TURN_TAKE_OVER, post(take_over))
        .route(path::SAVE_MESSAGE, post(save_message))
        .route(path::PENDING_ACTION, post(save_pending))
        .route(path::PENDING_LOOKUP, post(pending))
        .route(path::PENDING_DECIDE, post(decide))
        .route(path::RUN_PENDING, post(run_pending))
        .route(path::RUN_RESPONSE, post(set_response))
        .route(path::HISTORY, get(history))
        .route(path::DELETE_CONVERSATION, post(delete_conversation))
        .route(path::DELETE_USER, post(delete_user))
        .route(path::DELETE_TENANT, post(delete_tenant))
        .with_state(Backend { store });
    require_signature(router, verifier)
}

/// `router` with every route behind the backend's signature check: a call without a valid,
/// fresh, unreplayed signature of `verifier`'s secret is answered 401 before its handler runs.
/// A backend puts its own calls (`query`, `tools/{toolName}`, `schema`) behind it; give them
/// the same verifier as [`callback_router`] so a nonce is accepted once across both.
pub fn require_signature<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    verifier: Arc<HmacVerifier>,
) -> Router<S> {
    router.route_layer(middleware::from_fn_with_state(verifier, verify))
}

/// Checks the signature over the whole request before any handler runs.
async fn verify(State(verifier): State<Arc<HmacVerifier>>, req: Request, next: Next) -> Result<Response, ApiError> {
    let method = req.method().clone();
    let (req, ()) = check_whole_request(req, MAX_BODY, async |headers, target, body| {
        verifier.verify_request(&method, headers, target, body, now_secs()).await.map_err(|e| signature_refusal(&e))
    })
    .await?;
    Ok(next.run(req).await)
}

async fn create_conversation(
    State(b): State<Backend>,
    Json(r): Json<wire::CreateConversation>,
) -> Answer<wire::Created> {
    Ok(Json(wire::Created { id: b.store.create_conversation(r.tenant_id, r.user_id, &r.agent).await? }))
}

async fn conversation(
    State(b): State<Backend>,
    Json(r): Json<wire::OwnedConversation>,
) -> Answer<wire::ConversationFound> {
    let conversation = b.store.conversation(r.tenant_id, r.user_id, r.conversation_id).await?;
    Ok(Json(wire::ConversationFound { conversation }))
}

async fn begin_turn(State(b): State<Backend>, Json(r): Json<wire::TurnLease>) -> Answer<wire::Claimed> {
    Ok(Json(wire::Claimed { claimed: b.store.begin_turn(r.conversation_id, &r.claim).await? }))
}

async fn renew_turn(State(b): State<Backend>, Json(r): Json<wire::TurnLease>) -> Answer<wire::Claimed> {
    Ok(Json(wire::Claimed { claimed: b.store.renew_turn(r.conversation_id, &r.claim).await? }))
}

async fn release_owner(State(b): State<Backend>, Json(r): Json<wire::ReleaseOwner>) -> Answer<wire::Released> {
    Ok(Json(wire::Released { released: b.store.release_owner(&r.owner).await? }))
}

async fn take_over(State(b): State<Backend>, Json(r): Json<wire::TakeOver>) -> Answer<wire::Released> {
    // A caller asks for a bounded batch; the bound is the receiver's too.
    Ok(Json(wire::Released { released: b.store.take_over_expired(&r.claim, r.limit.min(1000)).await? }))
}

async fn end_turn(State(b): State<Backend>, Json(r): Json<wire::RunRef>) -> Answer<wire::Empty> {
    b.store.end_turn(r.conversation_id, &r.run_id).await?;
    Ok(Json(wire::Empty {}))
}

async fn save_message(State(b): State<Backend>, Json(r): Json<wire::SaveMessage>) -> Answer<wire::Created> {
    // A pending message only comes with its action (`pending-action`).
    let Some(role) = Role::parse(&r.role).filter(|role| *role != Role::Pending) else {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "role", format!("unknown role '{}'", r.role)));
    };
    Ok(Json(wire::Created { id: b.store.add_message(r.conversation_id, role, &r.content).await? }))
}

async fn save_pending(State(b): State<Backend>, Json(r): Json<wire::SavePending>) -> Answer<wire::Created> {
    Ok(Json(wire::Created { id: b.store.add_pending(&r).await? }))
}

async fn pending(State(b): State<Backend>, Json(r): Json<wire::PendingLookup>) -> Answer<wire::PendingFound> {
    let pending_action = b.store.pending(&r).await?;
    Ok(Json(wire::PendingFound { pending_action }))
}

async fn decide(State(b): State<Backend>, Json(r): Json<wire::Decide>) -> Answer<wire::DecideAnswer> {
    Ok(Json(wire::DecideAnswer { outcome: b.store.decide(r.message_id, r.approve).await? }))
}

async fn run_pending(State(b): State<Backend>, Json(r): Json<wire::RunRef>) -> Answer<wire::RunPending> {
    Ok(Json(wire::RunPending { pending_actions: b.store.run_pending(r.conversation_id, &r.run_id).await? }))
}

async fn set_response(State(b): State<Backend>, Json(r): Json<wire::RunResponse>) -> Answer<wire::Empty> {
    b.store.set_response(r.conversation_id, &r.run_id, &r.response).await?;
    Ok(Json(wire::Empty {}))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HistoryQuery {
    conversation_id: i64,
}

async fn history(State(b): State<Backend>, Query(q): Query<HistoryQuery>) -> Answer<wire::History> {
    Ok(Json(wire::History { messages: b.store.messages(q.conversation_id).await? }))
}

async fn delete_conversation(
    State(b): State<Backend>,
    Json(r): Json<wire::OwnedConversation>,
) -> Answer<wire::Deleted> {
    let deleted = b.store.delete_conversation(r.tenant_id, r.user_id, r.conversation_id).await?;
    Ok(Json(wire::Deleted { deleted }))
}

async fn list_conversations(
    State(b): State<Backend>,
    Json(r): Json<wire::ListConversations>,
) -> Answer<wire::ConversationList> {
    let limit = r.limit.min(crate::wire::MAX_LISTED_CONVERSATIONS);
    Ok(Json(wire::ConversationList { conversations: b.store.list_conversations(r.tenant_id, r.user_id, limit).await? }))
}

async fn delete_user(State(b): State<Backend>, Json(r): Json<wire::UserRef>) -> Answer<wire::DeletedConversations> {
    Ok(Json(wire::DeletedConversations { conversation_ids: b.store.delete_user(r.tenant_id, r.user_id).await? }))
}

async fn delete_tenant(State(b): State<Backend>, Json(r): Json<wire::TenantRef>) -> Answer<wire::DeletedConversations> {
    Ok(Json(wire::DeletedConversations { conversation_ids: b.store.delete_tenant(r.tenant_id).await? }))
}
