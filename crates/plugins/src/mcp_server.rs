//! toolgraph as an MCP server ([`McpExport`]): an MCP client (an IDE, a desktop assistant,
//! another agent) lists and calls toolgraph's read tools, reads documents as resources, and
//! gets the agents' prompts, over any transport of the official Rust SDK (`toolgraph mcp`
//! serves it on stdio, `toolgraph serve` on `/mcp` over streamable HTTP, each request scoped
//! to the tenant the service authenticated: [`TenantScope`]).
//!
//! Read tools are exported; a write tool only when configured, and then each call asks the
//! person at the client for approval — an elicitation the client shows them (on protocol
//! `2026-07-28` and later an `input_required` result the client answers and calls again with; on
//! earlier versions a request to the client) — and runs only if they approve. A client that
//! cannot ask gets a refusal: inside toolgraph a write tool pauses for a person, and an MCP
//! client must not get around it. A tool's failure is a tool result with `isError` (the client's
//! model reads it and may repair its call), never a protocol error.
//!
//! The `input_required` round trip carries no session, so the question's `requestState` is what
//! ties the person's answer to the call: an approval token (`Approvals`), HMAC-signed with a key of this
//! server's, naming the tool, the digest of the exact arguments, the tenant and the user, with a
//! nonce and an expiry, and accepted once (docs/plugins.md).
//!
//! Tools act for the request's tenant ([`TenantScope`]) and, when the service vouches for one,
//! its user ([`UserScope`]); the per-user note book refuses a call without a user.

use hmac::{Hmac, Mac};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequest, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation,
    InputRequest, InputRequiredResult, ListPromptsResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    Prompt, PromptMessage, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, Role, ServerCapabilities, ServerConfig, Tool as McpTool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use toolgraph_tools::{ToolClass, ToolContext, ToolRegistry};

/// A document a client may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// Its URI (e.g. `toolgraph://kb/default/docs/guia.md`).
    pub uri: String,
    /// A short name.
    pub name: String,
    /// What it is.
    pub description: Option<String>,
    /// Its media type.
    pub mime_type: String,
}

/// What a resource read answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceText {
    /// The text.
    pub text: String,
    /// Its media type.
    pub mime_type: String,
}

/// Whom a resource request is for: its tenant ([`TenantScope`], else the export's), its user
/// ([`UserScope`]), and the extensions of the HTTP request it came in (none over stdio), where
/// the service that authenticated it may have left more (who the person is, in its terms).
#[derive(Debug, Clone, Default)]
pub struct ResourceScope {
    /// The tenant.
    pub tenant: String,
    /// The user, when the request names one.
    pub user: Option<String>,
    /// The HTTP request's extensions.
    pub request: Option<http::Extensions>,
}

/// Where exported documents come from (the knowledge bases, a person's memory): per request.
#[async_trait::async_trait]
pub trait ResourceSource: Send + Sync + 'static {
    /// Every document of `scope` a client may read.
    async fn list(&self, scope: &ResourceScope) -> Vec<ResourceInfo>;
    /// The document `uri` of `scope`; `None` when there is no such document (or it is not
    /// this source's).
    async fn read(&self, scope: &ResourceScope, uri: &str) -> Option<ResourceText>;
}

/// No documents.
pub struct NoResources;

#[async_trait::async_trait]
impl ResourceSource for NoResources {
    async fn list(&self, _scope: &ResourceScope) -> Vec<ResourceInfo> {
        Vec::new()
    }
    async fn read(&self, _scope: &ResourceScope, _uri: &str) -> Option<ResourceText> {
        None
    }
}

/// The tenant an MCP request over HTTP acts for, set by the service that authenticated it (an
/// extension of the HTTP request). Without it the export's default tenant applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantScope(pub String);

/// The user an MCP request over HTTP acts for, set by the service when its authentication
/// established one (an extension of the HTTP request, never a header the client chose). It is
/// the tools' `userId`, the same id a chat turn of that user has, so both reach one note book.
/// Without it a request over HTTP has no user, and tools that need one (the notes) refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserScope(pub String);

/// The tenant of a request: its [`TenantScope`] when it came over HTTP with one, else `default`.
fn tenant_of<'a>(context: &'a RequestContext<RoleServer>, default: &'a str) -> String {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<TenantScope>())
        .map_or_else(|| default.to_owned(), |t| t.0.clone())
}

/// The user of a request: over HTTP its [`UserScope`] or none; otherwise (stdio, whose client
/// is the person who started toolgraph) `local`.
fn user_of(context: &RequestContext<RoleServer>, local: Option<&str>) -> Option<String> {
    match context.extensions.get::<http::request::Parts>() {
        Some(parts) => parts.extensions.get::<UserScope>().map(|u| u.0.clone()),
        None => local.map(str::to_owned),
    }
}

impl McpExport {
    /// Whom a resource request is for.
    fn resource_scope(&self, context: &RequestContext<RoleServer>) -> ResourceScope {
        ResourceScope {
            tenant: tenant_of(context, &self.tenant),
            user: user_of(context, self.local_user.as_deref()),
            request: context.extensions.get::<http::request::Parts>().map(|parts| parts.extensions.clone()),
        }
    }
}

/// A prompt a client may get: an agent's instructions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedPrompt {
    /// Its name (the agent's).
    pub name: String,
    /// What it is for.
    pub description: String,
    /// The text.
    pub text: String,
}

/// What toolgraph exports over MCP.
#[derive(Clone)]
pub struct McpExport {
    tools: ToolRegistry,
    resources: Arc<Vec<Arc<dyn ResourceSource>>>,
    prompts: Arc<Vec<ExportedPrompt>>,
    tenant: String,
    /// The user of requests that did not come over HTTP (stdio).
    local_user: Option<String>,
    /// Write tools exported behind the person's approval.
    write_tools: Arc<BTreeSet<String>>,
    /// The approvals asked over `input_required`: their key and the ones used.
    approvals: Arc<Approvals>,
}

/// How long a person has to answer an approval asked over a live session.
const APPROVAL_WAIT: Duration = Duration::from_secs(600);

/// The key of the approval among an `input_required` result's requests.
const APPROVAL: &str = "approval";

/// The answer recorded when a person did not approve (as inside toolgraph).
const REJECTED: &str = "The user rejected this action; it was not executed.";

impl McpExport {
    /// Exports the read tools of `tools`, the documents of `resources`, and `prompts`; tools and
    /// documents act for the request's [`TenantScope`], else for `tenant` (the `tenant` value of
    /// the tools' context, which searches are scoped by).
    pub fn new(
        tools: ToolRegistry,
        resources: Arc<dyn ResourceSource>,
        prompts: Vec<ExportedPrompt>,
        tenant: String,
    ) -> Self {
        Self {
            tools,
            resources: Arc::new(vec![resources]),
            prompts: Arc::new(prompts),
            tenant,
            local_user: None,
            write_tools: Arc::default(),
            approvals: Arc::new(Approvals::random(APPROVAL_WAIT)),
        }
    }

    /// Exports the documents of `more` too, after the ones before (a read asks each source in
    /// turn).
    #[must_use]
    pub fn with_resources(mut self, more: Arc<dyn ResourceSource>) -> Self {
        let mut all: Vec<Arc<dyn ResourceSource>> = self.resources.iter().cloned().collect();
        all.push(more);
        self.resources = Arc::new(all);
        self
    }

    /// Requests that do not come over HTTP (stdio: the client is a program the person who started
    /// toolgraph runs) act for `user`, as the tools' `userId`. Requests over HTTP never do: their
    /// user is the [`UserScope`] the service set, or none.
    #[must_use]
    pub fn with_local_user(mut self, user: impl Into<String>) -> Self {
        self.local_user = Some(user.into());
        self
    }

    /// Signs approvals with `key` instead of a random key of this process, so that replicas
    /// behind one load balancer accept each other's questions (each still accepts an approval
    /// once; with a shared key, route a client's retries to one replica to make that once in
    /// all).
    ///
    /// # Errors
    /// A key shorter than 32 bytes.
    pub fn with_approval_key(mut self, key: &[u8]) -> Result<Self, String> {
        if key.len() < 32 {
            return Err(format!("an approval key has at least 32 bytes, not {}", key.len()));
        }
        self.approvals = Arc::new(Approvals::with_key(key, APPROVAL_WAIT));
        Ok(self)
    }

    /// Exports the write tools `names` too, each call behind the person's approval.
    ///
    /// # Errors
    /// A name that is not a write tool of the export's tools.
    pub fn with_write_tools(mut self, names: &[String]) -> Result<Self, String> {
        for name in names {
            match self.tools.get(name) {
                Some(t) if t.spec().class == ToolClass::Write => {}
                Some(_) => return Err(format!("'{name}' is a read tool: it is exported anyway")),
                None => return Err(format!("no tool named '{name}'")),
            }
        }
        self.write_tools = Arc::new(names.iter().cloned().collect());
        Ok(self)
    }

    /// The names of the exported tools.
    pub fn tool_names(&self) -> Vec<String> {
        self.exported().into_iter().map(|s| s.name).collect()
    }

    /// The specs of the exported tools now.
    fn exported(&self) -> Vec<toolgraph_tools::ToolSpec> {
        let exported = |s: &toolgraph_tools::ToolSpec| s.class == ToolClass::Read || self.write_tools.contains(&s.name);
        self.tools.specs().into_iter().filter(exported).collect()
    }

    /// Whether the person at the client approves `description`: `Ok(true)` or `Ok(false)`, or the
    /// result to answer instead (the question, on protocol `2026-07-28` and later; a refusal when
    /// the client cannot ask).
    async fn approved(
        &self,
        request: &CallToolRequestParams,
        arguments: &Value,
        description: &str,
        context: &RequestContext<RoleServer>,
        scope: &Scope,
    ) -> Result<bool, CallToolResponse> {
        let schema = ElicitationSchema::builder()
            .required_bool_with("approve", |b| b.title("Approve").description("Run this action"))
            .build()
            .map_err(|e| CallToolResult::error(vec![ContentBlock::text(e.to_string())]))?;
        let message = format!("toolgraph wants to: {description}. Approve?");
        let question = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema };
        let modern = context.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let answer = if modern {
            // The answer counts only with a token this server issued for exactly this call — the
            // tool, these arguments, this tenant and user — not expired and not used before;
            // otherwise (a retry with other arguments, a replay, a state the client made up) the
            // person is asked again.
            let call = ApprovedCall { tool: &request.name, arguments, scope };
            let answer = request.input_responses.as_ref().and_then(|r| r.get(APPROVAL));
            let redeemed = match (request.request_state.as_deref(), answer) {
                (Some(token), Some(answer)) => match self.approvals.redeem(token, &call, now_secs()) {
                    Ok(()) => Some(answer.clone()),
                    Err(why) => {
                        tracing::info!(tool = %request.name, %why, "an approval was not accepted; asking again");
                        None
                    }
                },
                _ => None,
            };
            match redeemed {
                Some(answer) => answer,
                None => {
                    let token = self.approvals.issue(&call, now_secs()).map_err(|why| {
                        CallToolResult::error(vec![ContentBlock::text(format!(
                            "'{}' needs a person's approval, and it cannot be asked now: {why}",
                            request.name
                        ))])
                    })?;
                    let asks = [(APPROVAL.to_owned(), InputRequest::Elicitation(ElicitRequest::new(question)))];
                    return Err(InputRequiredResult::new(Some(asks.into_iter().collect()), Some(token)).into());
                }
            }
        } else {
            let can_ask = context.peer.peer_info().is_some_and(|i| i.capabilities.elicitation.is_some());
            if !can_ask {
                let why = format!(
                    "'{}' changes things and runs only when a person approves, and this connection cannot ask \
                     one: the client has no elicitation, or speaks a protocol before 2026-07-28 over HTTP",
                    request.name
                );
                return Err(CallToolResult::error(vec![ContentBlock::text(why)]).into());
            }
            match context.peer.create_elicitation_with_timeout(question, Some(APPROVAL_WAIT)).await {
                Ok(result) => serde_json::to_value(result).unwrap_or_default(),
                Err(e) => {
                    let why = format!("the approval of '{}' was not answered: {e}", request.name);
                    return Err(CallToolResult::error(vec![ContentBlock::text(why)]).into());
                }
            }
        };
        let accepted = answer.get("action").and_then(|a| serde_json::from_value(a.clone()).ok())
            == Some(ElicitationAction::Accept);
        Ok(accepted && answer.pointer("/content/approve") == Some(&Value::Bool(true)))
    }
}

impl ServerHandler for McpExport {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder().enable_tools().enable_resources().enable_prompts().build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("toolgraph", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "toolgraph's read tools (searches, lookups, computations), its documents as resources, \
                 and its agents' instructions as prompts.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = self
            .exported()
            .into_iter()
            .map(|s| {
                let schema = match &s.parameters {
                    Value::Object(m) => m.clone(),
                    _ => serde_json::Map::new(),
                };
                let mut annotations = ToolAnnotations::default();
                annotations.read_only_hint = Some(s.class == ToolClass::Read);
                annotations.title = s.display.name.clone();
                let mut tool = McpTool::new(s.name, s.description, Arc::new(schema));
                tool.annotations = Some(annotations);
                tool
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        if !self.exported().iter().any(|s| s.name == name) {
            let why = if self.tools.get(&name).is_some() {
                format!("'{name}' changes things and needs a person's approval in toolgraph; it is not exported")
            } else {
                format!("no tool named '{name}'")
            };
            return Ok(CallToolResult::error(vec![ContentBlock::text(why)]).into());
        }
        let arguments = request.arguments.clone().map(Value::Object).unwrap_or(Value::Object(Default::default()));
        let scope =
            Scope { tenant: tenant_of(&context, &self.tenant), user: user_of(&context, self.local_user.as_deref()) };
        if self.write_tools.contains(&name)
            && let Some(tool) = self.tools.get(&name)
        {
            // Arguments that would fail anyway are not put to the person.
            if let Err(why) = tool.arguments().check(&arguments) {
                let text = format!("invalid arguments for '{name}': {why}");
                return Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into());
            }
            match self.approved(&request, &arguments, &tool.describe(&arguments), &context, &scope).await {
                Ok(true) => {}
                Ok(false) => return Ok(CallToolResult::error(vec![ContentBlock::text(REJECTED)]).into()),
                Err(answer) => return Ok(answer),
            }
        }
        // The identity comes from the transport and the service, never from the arguments.
        let mut tool_context = ToolContext::default().set("tenant", scope.tenant.clone().into());
        if let Some(user) = &scope.user {
            tool_context = tool_context.set("userId", user.clone().into());
        }
        let outcome = self.tools.call(&tool_context, &name, &arguments).await;
        let value = outcome.to_json();
        let text = serde_json::to_string(&value).unwrap_or_default();
        Ok(if outcome.is_success() {
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = Some(value).filter(Value::is_object);
            result
        } else {
            CallToolResult::error(vec![ContentBlock::text(text)])
        }
        .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let scope = self.resource_scope(&context);
        let mut resources = Vec::new();
        for source in self.resources.iter() {
            for r in source.list(&scope).await {
                let resource = Resource::new(r.uri, r.name).with_mime_type(r.mime_type);
                resources.push(match r.description {
                    Some(d) => resource.with_description(d),
                    None => resource,
                });
            }
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let scope = self.resource_scope(&context);
        for source in self.resources.iter() {
            if let Some(found) = source.read(&scope, &request.uri).await {
                let contents = ResourceContents::text(found.text, request.uri).with_mime_type(found.mime_type);
                return Ok(ReadResourceResult::new(vec![contents]).into());
            }
        }
        Err(McpError::resource_not_found(format!("no resource {}", request.uri), None))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let prompts =
            self.prompts.iter().map(|p| Prompt::new(p.name.clone(), Some(p.description.clone()), None)).collect();
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let Some(p) = self.prompts.iter().find(|p| p.name == request.name) else {
            return Err(McpError::invalid_params(format!("no prompt named '{}'", request.name), None));
        };
        let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, p.text.clone())]);
        result.description = Some(p.description.clone());
        Ok(result.into())
    }
}

/// Whom a request acts for.
struct Scope {
    tenant: String,
    user: Option<String>,
}

/// The call an approval is for.
#[derive(Clone, Copy)]
struct ApprovedCall<'a> {
    tool: &'a str,
    arguments: &'a Value,
    scope: &'a Scope,
}

impl ApprovedCall<'_> {
    /// The bytes a token's MAC covers, each field length-prefixed so that no two calls share
    /// them: the tool, the SHA-256 of the arguments' canonical JSON, the tenant, the user (a
    /// flag, then the id), the nonce and the expiry.
    fn signed(&self, nonce: &[u8; NONCE_BYTES], expires: u64) -> Vec<u8> {
        let mut canonical = Vec::new();
        canonical_json(self.arguments, &mut canonical);
        let digest = Sha256::digest(&canonical);
        let mut out = b"toolgraph mcp approval v1".to_vec();
        let user = self.scope.user.as_deref();
        for field in [
            self.tool.as_bytes(),
            digest.as_slice(),
            self.scope.tenant.as_bytes(),
            if user.is_some() { b"1" } else { b"0" },
            user.unwrap_or_default().as_bytes(),
            nonce,
            &expires.to_be_bytes(),
        ] {
            out.extend_from_slice(&(field.len() as u64).to_be_bytes());
            out.extend_from_slice(field);
        }
        out
    }
}

/// Random bytes of a token's nonce.
const NONCE_BYTES: usize = 16;

/// Why a token was not accepted (logged; the person is asked again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum TokenError {
    #[error("not a token of this server's form")]
    Malformed,
    #[error("the signature is not this server's for this call")]
    Forged,
    #[error("expired")]
    Expired,
    #[error("already used")]
    Used,
    #[error("no random numbers to sign with")]
    NoRandom,
}

/// Approval tokens: `v1.<nonce>.<expiry>.<mac>` (hex nonce, Unix seconds, hex HMAC-SHA256 over
/// [`ApprovedCall::signed`]). The key is random per process unless configured, so a state a
/// client computes itself, or one another server issued, is not accepted; the nonces used are
/// kept until their tokens expire, so each token is accepted once.
pub(crate) struct Approvals {
    /// The key; `None` when the system had no random numbers, and then nothing can be
    /// approved over `input_required`.
    key: Option<Vec<u8>>,
    ttl: Duration,
    /// Nonce → expiry of the tokens already accepted.
    used: Mutex<HashMap<[u8; NONCE_BYTES], u64>>,
}

impl Approvals {
    /// With a random key of this process.
    fn random(ttl: Duration) -> Self {
        let mut key = vec![0u8; 32];
        let key = random_fill(&mut key).ok().map(|()| key);
        if key.is_none() {
            tracing::error!("no random numbers for the MCP approval key: write tools cannot be approved");
        }
        Self { key, ttl, used: Mutex::default() }
    }

    /// With a configured key.
    fn with_key(key: &[u8], ttl: Duration) -> Self {
        Self { key: Some(key.to_vec()), ttl, used: Mutex::default() }
    }

    /// The nonces used. A poisoned lock only means a call panicked while holding it; the map
    /// is whole (each change is one insert or one retain).
    fn used(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; NONCE_BYTES], u64>> {
        self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A fresh token for `call`, valid from `now` (Unix seconds) for the time limit.
    fn issue(&self, call: &ApprovedCall<'_>, now: u64) -> Result<String, TokenError> {
        let key = self.key.as_ref().ok_or(TokenError::NoRandom)?;
        let mut nonce = [0u8; NONCE_BYTES];
        random_fill(&mut nonce).map_err(|()| TokenError::NoRandom)?;
        let expires = now + self.ttl.as_secs();
        let mac = token_mac(key, &call.signed(&nonce, expires)).finalize().into_bytes();
        Ok(format!("v1.{}.{expires}.{}", hex::encode(nonce), hex::encode(mac)))
    }

    /// Accepts `token` for `call` at `now`, once: it must be this server's, for this very call,
    /// and not expired; accepting it uses it up.
    fn redeem(&self, token: &str, call: &ApprovedCall<'_>, now: u64) -> Result<(), TokenError> {
        let key = self.key.as_ref().ok_or(TokenError::NoRandom)?;
        let mut parts = token.split('.');
        let (Some("v1"), Some(nonce), Some(expires), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let nonce: [u8; NONCE_BYTES] =
            hex::decode(nonce).ok().and_then(|n| n.try_into().ok()).ok_or(TokenError::Malformed)?;
        let mac = hex::decode(mac).map_err(|_| TokenError::Malformed)?;
        let expires: u64 = expires.parse().map_err(|_| TokenError::Malformed)?;
        // `verify_slice` compares in constant time.
        token_mac(key, &call.signed(&nonce, expires)).verify_slice(&mac).map_err(|_| TokenError::Forged)?;
        let mut used = self.used();
        used.retain(|_, until| *until >= now);
        if now > expires {
            return Err(TokenError::Expired);
        }
        if used.insert(nonce, expires).is_some() {
            return Err(TokenError::Used);
        }
        Ok(())
    }
}

/// Now, in Unix seconds.
fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Fills `buf` from the system's secure random numbers (ring's, through rustls, which this
/// crate has already).
fn random_fill(buf: &mut [u8]) -> Result<(), ()> {
    rustls::crypto::ring::default_provider().secure_random.fill(buf).map_err(|_| ())
}

/// HMAC-SHA256 under `key` over a token's signed bytes.
fn token_mac(key: &[u8], signed: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length"); // invariant
    mac.update(signed);
    mac
}

/// `value` as JSON with every object's keys sorted, so that the same arguments have one digest
/// however a client ordered them.
fn canonical_json(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                canonical_json(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(v, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope(tenant: &str, user: Option<&str>) -> Scope {
        Scope { tenant: tenant.into(), user: user.map(str::to_owned) }
    }

    #[test]
    fn a_token_is_for_one_call_once_before_it_expires() {
        let approvals = Approvals::with_key(&[7; 32], Duration::from_secs(600));
        let (acme, args) = (scope("acme", Some("7")), json!({"amount": 10, "to": "ana"}));
        let call = ApprovedCall { tool: "pay", arguments: &args, scope: &acme };
        let now = 1_000_000;
        let token = approvals.issue(&call, now).unwrap();

        // The same arguments in another order are the same call.
        let reordered = json!({"to": "ana", "amount": 10});
        let same = ApprovedCall { arguments: &reordered, ..call };
        let more = json!({"amount": 11, "to": "ana"});
        let rival = scope("rival", Some("7"));
        let nobody = scope("acme", None);
        for (other, why) in [
            (ApprovedCall { tool: "refund", ..call }, "another tool"),
            (ApprovedCall { arguments: &more, ..call }, "other arguments"),
            (ApprovedCall { scope: &rival, ..call }, "another tenant"),
            (ApprovedCall { scope: &nobody, ..call }, "no user"),
        ] {
            assert_eq!(approvals.redeem(&token, &other, now), Err(TokenError::Forged), "{why}");
        }
        let elsewhere = Approvals::with_key(&[8; 32], Duration::from_secs(600));
        assert_eq!(elsewhere.redeem(&token, &call, now), Err(TokenError::Forged), "another server's key");
        let tampered = token.replacen(".1000600.", ".9000600.", 1);
        assert_eq!(approvals.redeem(&tampered, &call, now), Err(TokenError::Forged), "a later expiry");
        assert_eq!(approvals.redeem("approve:abc", &call, now), Err(TokenError::Malformed));
        assert_eq!(approvals.redeem(&token, &call, now + 601), Err(TokenError::Expired));

        assert_eq!(approvals.redeem(&token, &same, now + 600), Ok(()));
        assert_eq!(approvals.redeem(&token, &call, now + 1), Err(TokenError::Used), "once only");
        // Used nonces are forgotten once their tokens expire, which no longer pass anyway.
        assert_eq!(approvals.redeem(&token, &call, now + 601), Err(TokenError::Expired));
        assert!(approvals.used().is_empty());
        let fresh = approvals.issue(&call, now).unwrap();
        assert_ne!(fresh, token, "each question has its own nonce");
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let mut out = Vec::new();
        canonical_json(&json!({"b": [{"z": 1, "a": "x\"y"}], "a": null}), &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a":null,"b":[{"a":"x\"y","z":1}]}"#);
    }
}
