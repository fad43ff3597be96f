//! `/mcp`: the service's MCP export ([`McpExport`]) over streamable HTTP, for MCP clients that
//! reach toolgraph over the network instead of starting it (docs/plugins.md).
//!
//! It is served stateless — every POST answered on its own, no session kept between requests —
//! so replicas behind a load balancer serve it alike and idle clients hold no memory here. The
//! service's authentication has run before a request gets here; this layer scopes the request
//! to the tenant it was authenticated for (`X-Tenant-Slug`) and hands it to the official SDK.
//!
//! Beside the knowledge bases' documents it exports the asking person's store of items — what
//! agents remember of them — as resources ([`MemoryResources`]), when the request names the
//! person as the store routes read them (docs/memory.md).

use crate::auth::Principal;
use crate::service::ChatService;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::sync::Arc;
use toolgraph_conversations::items::{ITEMS_READ, ItemSearch};
pub use toolgraph_plugins::mcp_server::{McpExport, TenantScope, UserScope};
use toolgraph_plugins::mcp_server::{ResourceInfo, ResourceScope, ResourceSource, ResourceText};
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

/// The scheme of a person's items' URIs: `toolgraph://memory/<label>/…/<key>`, each part
/// percent-encoded.
const MEMORY_PREFIX: &str = "toolgraph://memory/";

/// What a URI part keeps as it is: RFC 3986's unreserved characters.
const URI_PART: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Longest description of an item in a listing, in characters.
const DESCRIPTION_CHARS: usize = 200;

/// The asking person's items as MCP resources: listed (the most recently written first) and
/// read as LangGraph's store answers them, JSON. The person is the [`Principal`] the `/mcp`
/// route admitted from the request's headers; a request without one gets none.
pub struct MemoryResources {
    chat: ChatService,
}

impl MemoryResources {
    /// The items of the people of `chat`'s store.
    pub fn new(chat: ChatService) -> Self {
        Self { chat }
    }
}

fn person(scope: &ResourceScope) -> Option<&Principal> {
    scope.request.as_ref()?.get::<Principal>()
}

/// The URI of the item under `namespace`/`key`.
pub fn memory_uri(namespace: &[String], key: &str) -> String {
    let mut uri = String::from(MEMORY_PREFIX);
    for part in namespace.iter().map(String::as_str).chain(std::iter::once(key)) {
        uri.extend(utf8_percent_encode(part, URI_PART));
        uri.push('/');
    }
    uri.pop();
    uri
}

/// The namespace and key of a memory URI; none for another URI, or one that names no
/// namespace.
fn memory_place(uri: &str) -> Option<(Vec<String>, String)> {
    let parts = uri.strip_prefix(MEMORY_PREFIX)?.split('/');
    let mut labels: Vec<String> = parts
        .map(|p| percent_decode_str(p).decode_utf8().ok().map(std::borrow::Cow::into_owned))
        .collect::<Option<_>>()?;
    let key = labels.pop()?;
    (!labels.is_empty()).then_some((labels, key))
}

#[async_trait::async_trait]
impl ResourceSource for MemoryResources {
    async fn list(&self, scope: &ResourceScope) -> Vec<ResourceInfo> {
        let Some(who) = person(scope) else { return Vec::new() };
        // A listing reads; it does not renew what it lists.
        let every = ItemSearch { limit: ITEMS_READ, ..Default::default() };
        let found = match self.chat.search_items(who, &every, false).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list a person's items over MCP");
                return Vec::new();
            }
        };
        found
            .into_iter()
            .map(|(item, _)| {
                let text = match item.value.get("text").and_then(serde_json::Value::as_str) {
                    Some(text) => text.to_owned(),
                    None => serde_json::Value::Object(item.value.clone()).to_string(),
                };
                let mut preview: String = text.chars().take(DESCRIPTION_CHARS).collect();
                if text.chars().count() > DESCRIPTION_CHARS {
                    preview.push('…');
                }
                ResourceInfo {
                    uri: memory_uri(&item.namespace, &item.key),
                    name: item.key.clone(),
                    description: Some(format!("Kept in [{}]: {preview}", item.namespace.join(", "))),
                    mime_type: "application/json".into(),
                }
            })
            .collect()
    }

    async fn read(&self, scope: &ResourceScope, uri: &str) -> Option<ResourceText> {
        let who = person(scope)?;
        let (namespace, key) = memory_place(uri)?;
        // As LangGraph's store reads it by default: a read renews its time to live.
        let item = self.chat.item(who, &namespace, &key, true).await.ok()?;
        let text = serde_json::to_string_pretty(&crate::langgraph::store::shape(&item, None)).ok()?;
        Some(ResourceText { text, mime_type: "application/json".into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_uri_names_its_namespace_and_key_whatever_they_hold() {
        let namespace = vec!["memories".to_owned(), "tutor/es".to_owned(), "ñandú 5A".to_owned()];
        let uri = memory_uri(&namespace, "lang.pref?#x");
        assert_eq!(uri, "toolgraph://memory/memories/tutor%2Fes/%C3%B1and%C3%BA%205A/lang.pref%3F%23x");
        assert_eq!(memory_place(&uri), Some((namespace, "lang.pref?#x".to_owned())));
        assert_eq!(memory_place("toolgraph://memory/only-a-key"), None, "no namespace");
        assert_eq!(memory_place("toolgraph://kb/docs/guia.md"), None, "another source's");
        assert_eq!(memory_place("toolgraph://memory/a/%FF"), None, "not UTF-8");
    }
}
