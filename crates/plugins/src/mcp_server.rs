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
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
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

/// Where the exported documents come from (the knowledge bases): per tenant.
pub trait ResourceSource: Send + Sync + 'static {
    /// Every document of `tenant` a client may read.
    fn list(&self, tenant: &str) -> Vec<ResourceInfo>;
    /// The text of `tenant`'s document `uri`; `None` when there is no such document.
    fn read(&self, tenant: &str, uri: &str) -> Option<String>;
}

/// No documents.
pub struct NoResources;

impl ResourceSource for NoResources {
    fn list(&self, _tenant: &str) -> Vec<ResourceInfo> {
        Vec::new()
    }
    fn read(&self, _tenant: &str, _uri: &str) -> Option<String> {
        None
    }
}

/// The tenant an MCP request over HTTP acts for, set by the service that authenticated it (an
/// extension of the HTTP request). Without it the export's default tenant applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantScope(pub String);

/// The tenant of a request: its [`TenantScope`] when it came over HTTP with one, else `default`.
fn tenant_of<'a>(context: &'a RequestContext<RoleServer>, default: &'a str) -> String {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<TenantScope>())
        .map_or_else(|| default.to_owned(), |t| t.0.clone())
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
    resources: Arc<dyn ResourceSource>,
    prompts: Arc<Vec<ExportedPrompt>>,
    tenant: String,
    /// Write tools exported behind the person's approval.
    write_tools: Arc<BTreeSet<String>>,
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
        Self { tools, resources, prompts: Arc::new(prompts), tenant, write_tools: Arc::default() }
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
    ) -> Result<bool, CallToolResponse> {
        let schema = ElicitationSchema::builder()
            .required_bool_with("approve", |b| b.title("Approve").description("Run this action"))
            .build()
            .map_err(|e| CallToolResult::error(vec![ContentBlock::text(e.to_string())]))?;
        let message = format!("toolgraph wants to: {description}. Approve?");
        let question = ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema };
        let modern = context.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let answer = if modern {
            // The approval must be of these arguments: the state names them, and a retry with
            // other arguments is asked again.
            let state = approval_state(&request.name, arguments);
            let answered = request.request_state.as_deref() == Some(state.as_str());
            match request.input_responses.as_ref().and_then(|r| r.get(APPROVAL)).filter(|_| answered) {
                Some(answer) => answer.clone(),
                None => {
                    let asks = [(APPROVAL.to_owned(), InputRequest::Elicitation(ElicitRequest::new(question)))];
                    return Err(InputRequiredResult::new(Some(asks.into_iter().collect()), Some(state)).into());
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
        if self.write_tools.contains(&name)
            && let Some(tool) = self.tools.get(&name)
        {
            // Arguments that would fail anyway are not put to the person.
            if let Err(why) = tool.arguments().check(&arguments) {
                let text = format!("invalid arguments for '{name}': {why}");
                return Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into());
            }
            match self.approved(&request, &arguments, &tool.describe(&arguments), &context).await {
                Ok(true) => {}
                Ok(false) => return Ok(CallToolResult::error(vec![ContentBlock::text(REJECTED)]).into()),
                Err(answer) => return Ok(answer),
            }
        }
        let scope = ToolContext::default().set("tenant", tenant_of(&context, &self.tenant).into());
        let outcome = self.tools.call(&scope, &name, &arguments).await;
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
        let (source, tenant) = (Arc::clone(&self.resources), tenant_of(&context, &self.tenant));
        // Listing reads the knowledge bases from disk: off the async workers.
        let list = tokio::task::spawn_blocking(move || source.list(&tenant))
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let resources = list
            .into_iter()
            .map(|r| {
                let resource = Resource::new(r.uri, r.name).with_mime_type(r.mime_type);
                match r.description {
                    Some(d) => resource.with_description(d),
                    None => resource,
                }
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let (source, uri, tenant) =
            (Arc::clone(&self.resources), request.uri.clone(), tenant_of(&context, &self.tenant));
        let text = tokio::task::spawn_blocking(move || source.read(&tenant, &uri))
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        match text {
            Some(text) => Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri)]).into()),
            None => Err(McpError::resource_not_found(format!("no resource {}", request.uri), None)),
        }
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

/// The state an approval question carries: the digest of the tool and its arguments, so the
/// answer counts for exactly the call it was asked about.
fn approval_state(tool: &str, arguments: &Value) -> String {
    let mut digest = Sha256::new();
    digest.update(tool.as_bytes());
    digest.update([0]);
    digest.update(serde_json::to_vec(arguments).unwrap_or_default());
    format!("approve:{:x}", digest.finalize())
}
