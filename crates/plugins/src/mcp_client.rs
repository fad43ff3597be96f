//! `mcp` plugins: an MCP server's tools as toolgraph tools, through the official Rust SDK.
//!
//! One long-lived session per server, shared by all its tools and every conversation (the
//! server keeps its state between calls). The server runs as a child on stdio, in a process
//! group of its own with a cleared environment (the manifest's `env` only), killed with its
//! whole group when the session goes and — on Linux — when toolgraph itself dies, so no server
//! is left behind. A call that finds the session gone starts it again (with back-off after a
//! failed start); while the server cannot be reached its tools answer `unavailable` and the
//! run goes on. Each call has the manifest's time limit (`timeout`). The tool list is read when
//! the session starts and again when the server says it changed; a tool that went away answers
//! `not_found`.
//!
//! A server's own read-only hints are not trusted: a tool runs without a person's approval
//! only if the manifest lists it in `read_tools`.

use crate::manifest::{Manifest, ManifestError, McpSpec};
use crate::tool::Common;
use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, ContentBlock, Tool as McpTool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolgraph_tools::{ArgumentSchema, ParamDisplay, Tool, ToolClass, ToolContext, ToolDisplay, ToolError, ToolSpec};

/// The least time between two attempts to start a server that failed to start.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Notes the server's `tools/list_changed`, so the next call reads the list again.
struct Listener {
    stale: Arc<std::sync::atomic::AtomicBool>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.stale.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A live session: the SDK's client and the server's process group.
struct Session {
    client: RunningService<RoleClient, Listener>,
    _group: crate::exec::ProcessGroup,
}

/// One MCP server, as its tools share it.
pub struct McpServer {
    name: String,
    command: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    env: Vec<String>,
    limit: Duration,
    session: tokio::sync::Mutex<Option<Session>>,
    /// When a start last failed.
    failed_at: Mutex<Option<Instant>>,
    /// The server's tool names as last listed.
    offered: Mutex<BTreeSet<String>>,
    stale: Arc<std::sync::atomic::AtomicBool>,
}

impl McpServer {
    fn new(m: &Manifest, spec: &McpSpec, dir: &Path) -> Result<Self, ManifestError> {
        let fail = |message: String| ManifestError {
            path: dir.join(crate::manifest::MANIFEST),
            line: None,
            field: Some("mcp.command".into()),
            message,
        };
        let Some(command) = &spec.command else { return Err(fail("a stdio server needs a command".into())) };
        let command = resolve_command(command, dir, &m.env).map_err(fail)?;
        Ok(Self {
            name: m.name.clone(),
            command,
            args: spec.args.clone(),
            dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned()),
            env: m.env.clone(),
            limit: Duration::from_millis(m.timeout_ms),
            session: tokio::sync::Mutex::new(None),
            failed_at: Mutex::new(None),
            offered: Mutex::new(BTreeSet::new()),
            stale: Arc::default(),
        })
    }

    /// Starts the server and initializes a session (within the time limit).
    async fn start(&self) -> Result<Session, String> {
        let mut cmd = crate::exec::plugin_command(&self.command, &self.args, &self.dir, &self.env);
        cmd.stderr(Stdio::null());
        crate::exec::isolate_for_life(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", self.command.display()))?;
        let group = crate::exec::ProcessGroup::of(&child);
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("the server's pipes are missing".into());
        };
        // The child is owned by the group guard from here on; tokio reaps it when it exits.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let listener = Listener { stale: Arc::clone(&self.stale) };
        let client = tokio::time::timeout(self.limit, listener.serve((stdout, stdin)))
            .await
            .map_err(|_| format!("the server did not initialize within {} ms", self.limit.as_millis()))?
            .map_err(|e| format!("the server did not initialize: {e}"))?;
        Ok(Session { client, _group: group })
    }

    /// The live session, started (again) if needed; its tools listed when new or stale.
    async fn session(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Session>>, ToolError> {
        let mut guard = self.session.lock().await;
        if guard.as_ref().is_some_and(|s| s.client.is_closed() || s.client.peer().is_transport_closed()) {
            tracing::warn!(server = %self.name, "the MCP server's session ended; starting it again");
            *guard = None;
        }
        if guard.is_none() {
            let recent =
                self.failed_at.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|t| t.elapsed() < RETRY_AFTER);
            if recent {
                return Err(ToolError::unavailable(format!(
                    "the MCP server '{}' cannot be reached; try again later",
                    self.name
                )));
            }
            match self.start().await {
                Ok(s) => {
                    *guard = Some(s);
                    self.stale.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                Err(e) => {
                    *self.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    tracing::warn!(server = %self.name, error = %e, "cannot start the MCP server");
                    return Err(ToolError::unavailable(format!(
                        "the MCP server '{}' cannot be reached: {e}",
                        self.name
                    )));
                }
            }
        }
        if self.stale.swap(false, std::sync::atomic::Ordering::SeqCst)
            && let Some(s) = guard.as_ref()
            && let Ok(Ok(tools)) = tokio::time::timeout(self.limit, s.client.list_all_tools()).await
        {
            *self.offered.lock().unwrap_or_else(|e| e.into_inner()) =
                tools.iter().map(|t| t.name.to_string()).collect();
        }
        Ok(guard)
    }

    /// The server's tools, listed at once (what the plugin offers is decided at load).
    async fn list(&self) -> Result<Vec<McpTool>, String> {
        let guard = self.session().await.map_err(|e| e.message)?;
        let Some(s) = guard.as_ref() else { return Err("no session".into()) };
        let tools = tokio::time::timeout(self.limit, s.client.list_all_tools())
            .await
            .map_err(|_| format!("the server did not list its tools within {} ms", self.limit.as_millis()))?
            .map_err(|e| format!("the server did not list its tools: {e}"))?;
        *self.offered.lock().unwrap_or_else(|e| e.into_inner()) = tools.iter().map(|t| t.name.to_string()).collect();
        Ok(tools)
    }

    /// Calls tool `name` of the server.
    async fn call(&self, name: &str, arguments: Value) -> Result<Value, ToolError> {
        let guard = self.session().await?;
        let Some(s) = guard.as_ref() else {
            return Err(ToolError::unavailable(format!("the MCP server '{}' cannot be reached", self.name)));
        };
        if !self.offered.lock().unwrap_or_else(|e| e.into_inner()).contains(name) {
            return Err(ToolError::not_found(format!("the MCP server '{}' no longer offers '{name}'", self.name)));
        }
        let mut params = CallToolRequestParams::new(name.to_owned());
        if let Value::Object(args) = arguments {
            params = params.with_arguments(args);
        }
        let peer = s.client.peer().clone();
        // The session lock is not held during the call: calls run concurrently.
        drop(guard);
        let result = tokio::time::timeout(self.limit, peer.call_tool(params)).await.map_err(|_| {
            ToolError::timeout(format!(
                "the MCP server '{}' did not answer within {} ms",
                self.name,
                self.limit.as_millis()
            ))
        })?;
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(server = %self.name, error = %e, "MCP call failed");
                if matches!(e, rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)) {
                    // The server is gone: the next call starts it again.
                    *self.session.lock().await = None;
                }
                return Err(ToolError::unavailable(format!("the MCP server '{}' failed: {e}", self.name)));
            }
        };
        let text = content_text(&result.content);
        if result.is_error == Some(true) {
            return Err(ToolError::internal(format!("{name}: {text}")));
        }
        Ok(match result.structured_content {
            Some(v) => v,
            None => serde_json::from_str::<Value>(&text).ok().filter(Value::is_object).unwrap_or(Value::String(text)),
        })
    }
}

/// The text of a result's content blocks, one per line (other kinds named, not inlined).
fn content_text(blocks: &[ContentBlock]) -> String {
    let value = serde_json::to_value(blocks).unwrap_or(Value::Null);
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|b| match b.get("text").and_then(Value::as_str) {
                    Some(t) => t.to_owned(),
                    None => format!("[{} content]", b.get("type").and_then(Value::as_str).unwrap_or("other")),
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// A program named with a path is resolved against the plugin's directory; a bare name is
/// looked up in the `PATH` the manifest passes on (or this process's, when it passes none).
fn resolve_command(command: &Path, dir: &Path, env: &[String]) -> Result<PathBuf, String> {
    if command.components().count() > 1 || command.is_absolute() {
        let path = if command.is_absolute() { command.to_owned() } else { dir.join(command) };
        return std::fs::canonicalize(&path).map_err(|e| format!("{}: {e}", path.display()));
    }
    let path = if env.iter().any(|e| e == "PATH") { std::env::var_os("PATH") } else { None }
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(command))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("'{}' is not on the PATH", command.display()))
}

/// One tool of an MCP server.
pub struct McpToolProxy {
    common: Common,
    remote: String,
    server: Arc<McpServer>,
}

#[async_trait]
impl Tool for McpToolProxy {
    fn spec(&self) -> &ToolSpec {
        &self.common.spec
    }

    fn arguments(&self) -> &ArgumentSchema {
        &self.common.schema
    }

    fn timeout(&self) -> Duration {
        // Starting the server again may come first: two limits, and a second to answer.
        self.common.limit() * 2 + Duration::from_secs(1)
    }

    async fn invoke(&self, _ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        self.server.call(&self.remote, arguments).await
    }
}

/// Connects to the server of an `mcp` manifest and returns its tools, named `prefix + tool`.
///
/// # Errors
/// The server cannot be started or listed, or a tool's schema is not usable.
pub async fn connect(m: &Manifest, spec: &McpSpec, dir: &Path) -> Result<Vec<Arc<dyn Tool>>, ManifestError> {
    let fail = |field: &str, message: String| ManifestError {
        path: dir.join(crate::manifest::MANIFEST),
        line: None,
        field: Some(field.to_owned()),
        message,
    };
    let server = Arc::new(McpServer::new(m, spec, dir)?);
    let tools = server.list().await.map_err(|e| fail("mcp", e))?;
    let prefix = spec.prefix.clone().unwrap_or_else(|| format!("{}_", m.name));
    let mut out: Vec<Arc<dyn Tool>> = Vec::new();
    for t in tools {
        let name = format!("{prefix}{}", t.name);
        if !toolgraph_tools::valid_tool_name(&name) {
            tracing::warn!(server = %m.name, tool = %t.name, "an MCP tool whose name cannot be offered to models was skipped");
            continue;
        }
        let schema = Value::Object((*t.input_schema).clone());
        let arguments = ArgumentSchema::from_value(&name, schema, &[]).map_err(|e| fail("mcp", e.to_string()))?;
        let read = spec.read_tools.iter().any(|r| *r == t.name);
        let spec = ToolSpec {
            name: name.clone(),
            description: t.description.as_deref().unwrap_or(&t.name).to_owned(),
            class: if read { ToolClass::Read } else { ToolClass::Write },
            parameters: arguments.model_facing().clone(),
            injected: Vec::new(),
            display: ToolDisplay {
                name: t.title.clone().or_else(|| t.annotations.as_ref().and_then(|a| a.title.clone())),
                description: None,
                parameters: std::collections::BTreeMap::<String, ParamDisplay>::new(),
            },
        };
        let common = Common { spec, schema: arguments, describe: None, timeout_ms: m.timeout_ms };
        out.push(Arc::new(McpToolProxy { common, remote: t.name.to_string(), server: Arc::clone(&server) }));
    }
    Ok(out)
}
