//! `[mcp]`: toolgraph as an MCP server — on stdio (`toolgraph mcp`) and on `/mcp` of
//! `toolgraph serve` — and which of its write tools it exports.

use crate::server::AuthKind;
use crate::{Check, ConfigError, Secret};
use serde::{Deserialize, Serialize};

/// `[mcp]`: what MCP clients get from toolgraph.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpSettings {
    /// Serve MCP over streamable HTTP on `/mcp` of `toolgraph serve` (the request's
    /// `X-Tenant-Slug` tenant; the service's auth applies — `none` or `api_key`, not `hmac`).
    /// Default: false. Env: `TOOLGRAPH_MCP_HTTP`.
    pub http: bool,
    /// Write tools exported too: each call asks the person at the client for approval (MCP
    /// elicitation) and runs only if they approve; a client that cannot ask gets a refusal.
    /// Default: none (read tools only).
    pub write_tools: Vec<String>,
    /// The key that signs the approvals of exported write tools (at least 32 bytes). Replicas
    /// behind one load balancer need the same key, so a person's approval asked for on one is
    /// taken by another. Default: a random key per process. Env: `TOOLGRAPH_MCP_APPROVAL_KEY`.
    pub approval_key: Option<Secret>,
}

impl McpSettings {
    pub(crate) fn validate(&self, check: &Check<'_>, auth: AuthKind) -> Result<(), ConfigError> {
        if self.http && auth == AuthKind::Hmac {
            return Err(check.invalid(
                "mcp.http",
                "MCP clients cannot sign requests: use server.auth = \"api_key\" (or \"none\") to serve /mcp".into(),
            ));
        }
        if self.approval_key.as_ref().is_some_and(|k| k.expose().len() < 32) {
            return Err(check.invalid("mcp.approval_key", "an approval key has at least 32 bytes".into()));
        }
        Ok(())
    }
}
