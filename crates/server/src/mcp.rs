//! `/mcp`: the service's MCP export ([`McpExport`]) over streamable HTTP, for MCP clients that
//! reach toolgraph over the network instead of starting it (docs/plugins.md).
//!
//! It is served stateless — every POST answered on its own, no session kept between requests —
//! so replicas behind a load balancer serve it alike and idle clients hold no memory here. The
//! service's authentication has run before a request gets here; this layer scopes the request
//! to the tenant it was authenticated for (`X-Tenant-Slug`) and hands it to the official SDK.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::sync::Arc;
pub use toolgraph_plugins::mcp_server::{McpExport, TenantScope, UserScope};
use tower_service::Service;

/// The MCP endpoint: an [`McpExport`] behind the SDK's streamable HTTP transport.
#[derive(Clone)]
pub struct McpEndpoint {
    service: StreamableHttpService<McpExport, LocalSessionManager>,
}

impl McpEndpoint {
    /// Serves `export`, answering requests whose `Host` is one of `allowed_hosts` (others get 403:
    /// a web page the user visits must not reach a local server by DNS rebinding).
    /// The service checks the same list on every route first ([`crate::guard_hosts`]); `"*"`
    /// accepts any host here too.
    pub fn new(export: McpExport, allowed_hosts: &[String]) -> Self {
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_max_request_body_bytes(crate::extract::MAX_BODY);
        let config = if allowed_hosts.iter().any(|h| h.trim() == "*") {
            config.disable_allowed_hosts()
        } else {
            config.with_allowed_hosts(allowed_hosts.iter().cloned())
        };
        let service =
            StreamableHttpService::new(move || Ok(export.clone()), Arc::new(LocalSessionManager::default()), config);
        Self { service }
    }

    /// Answers one HTTP request, scoped to `tenant` and `user` when the caller named them.
    pub async fn handle(&self, mut req: Request, tenant: Option<String>, user: Option<String>) -> Response {
        if let Some(tenant) = tenant {
            req.extensions_mut().insert(TenantScope(tenant));
        }
        if let Some(user) = user {
            req.extensions_mut().insert(UserScope(user));
        }
        let mut service = self.service.clone();
        match service.call(req).await {
            Ok(resp) => resp.map(Body::new),
            Err(never) => match never {},
        }
    }
}

impl IntoResponse for McpUnavailable {
    fn into_response(self) -> Response {
        (axum::http::StatusCode::NOT_FOUND, "MCP is not enabled on this service (mcp.http)").into_response()
    }
}

/// `/mcp` on a service without [`McpEndpoint`].
pub(crate) struct McpUnavailable;
