//! [`BackendConversationStore`]: the conversation store as HMAC-signed calls to the backend
//! (scheme v2, [`super::signing`]: each call's method, path, query, tenant slug and body).

use super::signing::{SignedRequest, TENANT_HEADER, signature_headers};
use super::wire::{self, path};
use crate::{
    Conversation, ConversationStore, ConversationSummary, Decided, NewPending, PendingAction, PendingLookup,
    ReleasedTurn, Role, StoreError, StoredMessage, TurnClaim,
};
use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;

/// Where the backend is and how to reach it.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Base URL, e.g. `http://lumie-backend:8080` (the paths start with `/internal/chatbot`).
    pub base_url: String,
    /// The secret this service signs its calls to the backend with
    /// (`server.backend_hmac_secret`; the backend's requests to the service are checked with
    /// `server.hmac_secret`, a secret of their own).
    pub secret: Vec<u8>,
    /// Limit of one call, connection included.
    pub timeout: Duration,
}

/// Conversations, messages and pending actions kept by the backend.
///
/// Each call is one signed request with a timeout; writes are not retried (a retried write
/// could store a message twice), so a failing backend fails the operation with a
/// [`StoreError`] naming the call, as a failing database would. Clones share one connection
/// pool and cost a few reference counts (the tools clone it per call).
#[derive(Debug, Clone)]
pub struct BackendConversationStore {
    http: reqwest::Client,
    base: Arc<str>,
    secret: Arc<[u8]>,
    timeout: Duration,
}

/// Why a call to the backend got no answer.
#[derive(Debug)]
pub struct CallFailure {
    /// The call's time limit passed (as opposed to a refused or broken connection).
    pub timed_out: bool,
    /// The call and its cause chain, for logs and errors.
    pub message: String,
}

impl From<CallFailure> for StoreError {
    fn from(f: CallFailure) -> Self {
        StoreError(f.message)
    }
}

/// A body with a random nonce. The signature's own nonce (`X-Nonce`) is what makes each call
/// unique now; the body's stays for backends that read it.
#[derive(Serialize)]
struct Signed<'a, T> {
    nonce: String,
    #[serde(flatten)]
    body: &'a T,
}

/// Longest part of an error body quoted in a [`StoreError`].
const QUOTED_ERROR: usize = 200;

impl BackendConversationStore {
    /// A store calling the backend at `options.base_url`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built (no TLS roots).
    pub fn new(options: BackendOptions) -> Result<Self, StoreError> {
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError(format!("backend client: {e}")))?;
        Ok(Self {
            http,
            base: options.base_url.trim_end_matches('/').into(),
            secret: options.secret.into(),
            timeout: options.timeout,
        })
    }

    /// The limit of one call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn post<B: Serialize, R: DeserializeOwned>(&self, path: &str, body: &B) -> Result<R, StoreError> {
        let req = self.signed_post(path, None, body).map_err(StoreError)?;
        decode(path, self.exchange(path, req).await?)
    }

    async fn get<R: DeserializeOwned>(&self, target: &str) -> Result<R, StoreError> {
        let req = self.signed(reqwest::Method::GET, target, None, Vec::new()).map_err(StoreError)?;
        decode(target, self.exchange(target, req).await?)
    }

    /// POSTs `body` signed to `path` on behalf of tenant `slug` (`X-Tenant-Slug`, as the
    /// backend's data calls carry it) and returns the status and the body text, whatever the
    /// status.
    ///
    /// # Errors
    /// When the call gets no answer (refused, broken, or past its time limit).
    pub async fn post_for_tenant<B: Serialize>(
        &self,
        path: &str,
        slug: &str,
        body: &B,
    ) -> Result<(reqwest::StatusCode, String), CallFailure> {
        let req =
            self.signed_post(path, Some(slug), body).map_err(|message| CallFailure { timed_out: false, message })?;
        self.exchange(path, req).await
    }

    /// GETs `path?query` signed, on behalf of tenant `slug`, and decodes a 2xx answer; anything
    /// else is an error naming the call. A random `nonce` joins the query (the contract names
    /// it; the signature's `X-Nonce` is what a verifier accepts once).
    ///
    /// # Errors
    /// A failed call or an answer that is not a 2xx of the expected shape, naming the call.
    pub async fn get_for_tenant<R: DeserializeOwned>(
        &self,
        path: &str,
        query: &str,
        slug: &str,
    ) -> Result<R, StoreError> {
        let target = format!("{path}?{query}&nonce={}", uuid::Uuid::new_v4().simple());
        let req = self.signed(reqwest::Method::GET, &target, Some(slug), Vec::new()).map_err(StoreError)?;
        decode(&target, self.exchange(&target, req).await?)
    }

    /// A signed POST of `body` with its nonce (`X-Tenant-Slug` when `slug` is given).
    fn signed_post<B: Serialize>(
        &self,
        path: &str,
        slug: Option<&str>,
        body: &B,
    ) -> Result<reqwest::RequestBuilder, String> {
        let signed = Signed { nonce: uuid::Uuid::new_v4().simple().to_string(), body };
        let bytes = serde_json::to_vec(&signed).map_err(|e| format!("{path}: {e}"))?;
        Ok(self.signed(reqwest::Method::POST, path, slug, bytes)?.header("content-type", "application/json"))
    }

    /// A request of `method` to `target` (path and query) with `body`, signed v2 over all of
    /// them and `X-Tenant-Slug` when `slug` is given.
    fn signed(
        &self,
        method: reqwest::Method,
        target: &str,
        slug: Option<&str>,
        body: Vec<u8>,
    ) -> Result<reqwest::RequestBuilder, String> {
        let url = reqwest::Url::parse(&format!("{}{target}", self.base))
            .map_err(|e| format!("{}: not a URL: {e}", call_name(target)))?;
        // Signed as it goes on the wire: the URL's path (the base URL's own path included) and
        // query as the URL library encoded them, which is what the backend reads.
        let sent = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        let request = SignedRequest { method: method.as_str(), target: &sent, tenant_slug: slug, body: &body };
        let headers = signature_headers(&self.secret, &request);
        let mut req = self.http.request(method, url);
        if let Some(slug) = slug {
            req = req.header(TENANT_HEADER, slug);
        }
        for (name, value) in headers {
            req = req.header(name, value);
        }
        Ok(if body.is_empty() { req } else { req.body(body) })
    }

    /// Sends `req` and reads the whole answer; a failure names the call and its cause chain.
    async fn exchange(
        &self,
        what: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, String), CallFailure> {
        let call = call_name(what);
        let failed = |e: reqwest::Error| CallFailure {
            timed_out: e.is_timeout(),
            message: format!("backend call {call} failed: {}", toolgraph_llm::error_chain(&e)),
        };
        let resp = req.send().await.map_err(failed)?;
        let status = resp.status();
        let text = resp.text().await.map_err(failed)?;
        Ok((status, text))
    }
}

/// The path of a call, without its query (nonces and ids stay out of error messages).
fn call_name(target: &str) -> &str {
    target.split('?').next().unwrap_or(target)
}

/// The reason a failed call's answer gives: its `{"error": …}`, else its first `limit` characters.
pub fn error_reason(text: &str, limit: usize) -> String {
    serde_json::from_str::<wire::ErrorBody>(text)
        .map(|b| b.error)
        .unwrap_or_else(|_| text.chars().take(limit).collect())
}

/// A 2xx answer decoded; anything else an error naming the call.
fn decode<R: DeserializeOwned>(what: &str, (status, text): (reqwest::StatusCode, String)) -> Result<R, StoreError> {
    let call = call_name(what);
    if !status.is_success() {
        let reason = error_reason(&text, QUOTED_ERROR);
        return Err(StoreError(format!("backend answered {status} to {call}: {reason}")));
    }
    serde_json::from_str(&text).map_err(|e| StoreError(format!("backend call {call}: unexpected answer: {e}")))
}

#[async_trait]
impl ConversationStore for BackendConversationStore {
    async fn create_conversation(&self, tenant: i64, user: i64, agent: &str) -> Result<i64, StoreError> {
        let body = wire::CreateConversation { tenant_id: tenant, user_id: user, agent: agent.to_owned() };
        Ok(self.post::<_, wire::Created>(path::CONVERSATIONS, &body).await?.id)
    }

    async fn conversation(&self, tenant: i64, user: i64, id: i64) -> Result<Option<Conversation>, StoreError> {
        let body = wire::OwnedConversation { tenant_id: tenant, user_id: user, conversation_id: id };
        Ok(self.post::<_, wire::ConversationFound>(path::CONVERSATION_LOOKUP, &body).await?.conversation)
    }

    async fn begin_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let body = wire::TurnLease { conversation_id: conversation, claim: claim.clone() };
        Ok(self.post::<_, wire::Claimed>(path::TURN_BEGIN, &body).await?.claimed)
    }

    async fn renew_turn(&self, conversation: i64, claim: &TurnClaim) -> Result<bool, StoreError> {
        let body = wire::TurnLease { conversation_id: conversation, claim: claim.clone() };
        Ok(self.post::<_, wire::Claimed>(path::TURN_RENEW, &body).await?.claimed)
    }

    async fn end_turn(&self, conversation: i64, run_id: &str) -> Result<(), StoreError> {
        let body = wire::RunRef { conversation_id: conversation, run_id: run_id.to_owned() };
        self.post::<_, wire::Empty>(path::TURN_END, &body).await.map(|_| ())
    }

    async fn release_owner(&self, owner: &str) -> Result<Vec<ReleasedTurn>, StoreError> {
        let body = wire::ReleaseOwner { owner: owner.to_owned() };
        Ok(self.post::<_, wire::Released>(path::TURN_RELEASE_OWNER, &body).await?.released)
    }

    async fn take_over_expired(&self, claim: &TurnClaim, limit: usize) -> Result<Vec<ReleasedTurn>, StoreError> {
        let body = wire::TakeOver { claim: claim.clone(), limit };
        Ok(self.post::<_, wire::Released>(path::TURN_TAKE_OVER, &body).await?.released)
    }

    async fn add_message(&self, conversation: i64, role: Role, content: &str) -> Result<i64, StoreError> {
        let body = wire::SaveMessage {
            conversation_id: conversation,
            role: role.as_str().to_owned(),
            content: content.to_owned(),
        };
        Ok(self.post::<_, wire::Created>(path::SAVE_MESSAGE, &body).await?.id)
    }

    async fn add_pending(&self, pending: &NewPending) -> Result<i64, StoreError> {
        Ok(self.post::<_, wire::Created>(path::PENDING_ACTION, pending).await?.id)
    }

    async fn pending(&self, lookup: &PendingLookup) -> Result<Option<PendingAction>, StoreError> {
        Ok(self.post::<_, wire::PendingFound>(path::PENDING_LOOKUP, lookup).await?.pending_action)
    }

    async fn run_pending(&self, conversation: i64, run_id: &str) -> Result<Vec<PendingAction>, StoreError> {
        let body = wire::RunRef { conversation_id: conversation, run_id: run_id.to_owned() };
        Ok(self.post::<_, wire::RunPending>(path::RUN_PENDING, &body).await?.pending_actions)
    }

    async fn decide(&self, message_id: i64, approve: bool) -> Result<Decided, StoreError> {
        let body = wire::Decide { message_id, approve };
        Ok(self.post::<_, wire::DecideAnswer>(path::PENDING_DECIDE, &body).await?.outcome)
    }

    async fn set_response(&self, conversation: i64, run_id: &str, response: &str) -> Result<(), StoreError> {
        let body = wire::RunResponse {
            conversation_id: conversation,
            run_id: run_id.to_owned(),
            response: response.to_owned(),
        };
        self.post::<_, wire::Empty>(path::RUN_RESPONSE, &body).await.map(|_| ())
    }

    async fn messages(&self, conversation: i64) -> Result<Vec<StoredMessage>, StoreError> {
        let nonce = uuid::Uuid::new_v4().simple();
        let history: wire::History =
            self.get(&format!("{}?conversationId={conversation}&nonce={nonce}", path::HISTORY)).await?;
        Ok(history.messages)
    }

    async fn delete_conversation(&self, tenant: i64, user: i64, id: i64) -> Result<bool, StoreError> {
        let body = wire::OwnedConversation { tenant_id: tenant, user_id: user, conversation_id: id };
        Ok(self.post::<_, wire::Deleted>(path::DELETE_CONVERSATION, &body).await?.deleted)
    }

    async fn list_conversations(
        &self,
        tenant: i64,
        user: i64,
        limit: usize,
    ) -> Result<Vec<ConversationSummary>, StoreError> {
        let body = wire::ListConversations { tenant_id: tenant, user_id: user, limit };
        Ok(self.post::<_, wire::ConversationList>(path::CONVERSATION_LIST, &body).await?.conversations)
    }

    async fn delete_user(&self, tenant: i64, user: i64) -> Result<Vec<i64>, StoreError> {
        let body = wire::UserRef { tenant_id: tenant, user_id: user };
        Ok(self.post::<_, wire::DeletedConversations>(path::DELETE_USER, &body).await?.conversation_ids)
    }

    async fn delete_tenant(&self, tenant: i64) -> Result<Vec<i64>, StoreError> {
        let body = wire::TenantRef { tenant_id: tenant };
        Ok(self.post::<_, wire::DeletedConversations>(path::DELETE_TENANT, &body).await?.conversation_ids)
    }
}
