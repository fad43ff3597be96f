//! toolgraph as an MCP server ([`McpExport`]): an MCP client (an IDE, a desktop assistant,
//! another agent) lists and calls toolgraph's read tools, reads documents as resources, and
//! gets the agents' prompts, over any transport of the official Rust SDK (`toolgraph mcp`
//! serves it on stdio, `toolgraph serve` on `/mcp` over streamable HTTP, each request scoped
//! to the tenant the service authenticated: [`TenantScope`]).
//!
//! Only read tools are exported: a write tool pauses for a person's approval inside toolgraph,
//! and a client that cannot show that approval must not get around it. A tool's failure is a
//! tool result with `isError` (the client's model reads it and may repair its call), never a
//! protocol error.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, ListPromptsResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    Prompt, PromptMessage, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, Role, ServerCapabilities, ServerConfig, Tool as McpTool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use std::sync::Arc;
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
}

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
        Self { tools, resources, prompts: Arc::new(prompts), tenant }
    }

    /// The names of the exported tools.
    pub fn tool_names(&self) -> Vec<String> {
        self.exported().into_iter().map(|s| s.name).collect()
    }

    /// The specs of the exported tools now.
    fn exported(&self) -> Vec<toolgraph_tools::ToolSpec> {
        self.tools.specs().into_iter().filter(|s| s.class == ToolClass::Read).collect()
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
                annotations.read_only_hint = Some(true);
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
        let arguments = request.arguments.map(Value::Object).unwrap_or(Value::Object(Default::default()));
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
