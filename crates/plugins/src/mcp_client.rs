//! `mcp` plugins: an MCP server's tools as toolgraph tools, through the official Rust SDK, on
//! stdio or over streamable HTTP.
//!
//! One long-lived session per server, shared by all its tools and every conversation (the
//! server keeps its state between calls) — or, when the manifest fills headers or environment
//! from the turn (`{ctx.userId}`), one per distinct set of those values, the least recently used
//! closed past `max_sessions`. A stdio server runs as a child in a process group of its own with
//! a cleared environment (the manifest's `env` and `environment` only), killed with its whole
//! group when its session goes and — on Linux — when toolgraph itself dies, so no server is left
//! behind. A call that finds its session gone opens it again (with back-off after a failed
//! start); while the server cannot be reached its tools answer `unavailable` and the run goes
//! on. Each call has the manifest's time limit (`timeout`). The tool list is read when a session
//! starts and again when the server says it changed; a tool that went away answers `not_found`.
//!
//! A server's own read-only hints are not trusted: a tool runs without a person's approval
//! only if the manifest lists it in `read_tools`.

use crate::manifest::{Manifest, ManifestError, McpSpec};
use crate::tool::Common;
use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, ContentBlock, Tool as McpTool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolgraph_tools::{
    ArgumentSchema, ParamDisplay, Tool, ToolClass, ToolContext, ToolDisplay, ToolError, ToolSet, ToolSpec,
};

/// The wait after a failed start before the next attempt, doubled with each failure in a row
/// up to [`MAX_RETRY_AFTER`].
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The longest wait between two attempts to reach a server.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The wait after `failures` failed starts in a row.
fn retry_after(failures: u32) -> Duration {
    RETRY_AFTER.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(MAX_RETRY_AFTER)
}

/// How long notifications of a changed tool list are gathered before the list is read again.
const DEBOUNCE: Duration = Duration::from_millis(250);

/// Hears the server's `tools/list_changed`: the list is read again a moment later (one read
/// for a burst of notifications) and the plugin's tools follow it.
struct Listener {
    server: std::sync::Weak<McpServer>,
    slot: std::sync::Weak<Slot>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let (Some(server), Some(slot)) = (self.server.upgrade(), self.slot.upgrade()) else { return };
        slot.stale.store(true, Ordering::SeqCst);
        if server.refreshing.swap(true, Ordering::SeqCst) {
            return;
        }
        let peer = context.peer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(DEBOUNCE).await;
            server.refreshing.store(false, Ordering::SeqCst);
            slot.stale.store(false, Ordering::SeqCst);
            match tokio::time::timeout(server.limit, peer.list_all_tools()).await {
                Ok(Ok(tools)) => server.learn(&slot, &tools),
                _ => slot.stale.store(true, Ordering::SeqCst),
            }
        });
    }
}

/// A live session: the SDK's client and, for a stdio server, its process group.
struct Session {
    client: RunningService<RoleClient, Listener>,
    _group: Option<crate::exec::ProcessGroup>,
}

/// How the server is reached.
enum Transport {
    /// A child process on stdio.
    Stdio { command: PathBuf, args: Vec<String>, dir: PathBuf, env: Vec<String>, environment: Vec<(String, String)> },
    /// An endpoint over streamable HTTP.
    Http { url: Arc<str>, headers: Vec<(String, String)>, client: reqwest013::Client },
}

impl Transport {
    /// The header or environment templates whose values tell sessions apart.
    fn templates(&self) -> &[(String, String)] {
        match self {
            Self::Stdio { environment, .. } => environment,
            Self::Http { headers, .. } => headers,
        }
    }
}

/// The values a session is opened with (headers or environment), filled for one turn.
type Credentials = Vec<(String, String)>;

/// One session and what is known about it.
#[derive(Default)]
struct Slot {
    session: tokio::sync::Mutex<Option<Session>>,
    /// When a start last failed, and how many failed in a row.
    failed: Mutex<Option<(Instant, u32)>>,
    /// The server's tool names as last listed in this session.
    offered: Mutex<BTreeSet<String>>,
    /// The server said its list changed, and it was not read since.
    stale: AtomicBool,
}

/// One MCP server, as its tools share it.
pub struct McpServer {
    name: String,
    transport: Transport,
    limit: Duration,
    timeout_ms: u64,
    max_sessions: usize,
    /// Put before each of the server's tool names.
    prefix: String,
    /// The server's tools that run without approval.
    read_tools: Vec<String>,
    /// This server, for the tools it makes.
    me: std::sync::Weak<McpServer>,
    /// The plugin's tools, following the server's list (set once connected).
    set: std::sync::OnceLock<std::sync::Weak<ToolSet>>,
    /// A re-read of the list is scheduled.
    refreshing: AtomicBool,
    /// Sessions by the values they were opened with, and when each was last used.
    slots: Mutex<HashMap<Credentials, (Arc<Slot>, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl McpServer {
    fn new(m: &Manifest, spec: &McpSpec, dir: &Path) -> Result<Arc<Self>, ManifestError> {
        let fail = |field: &str, message: String| ManifestError {
            path: dir.join(crate::manifest::MANIFEST),
            line: None,
            field: Some(field.to_owned()),
            message,
        };
        let limit = Duration::from_millis(m.timeout_ms);
        let transport = match (&spec.command, &spec.url) {
            (Some(command), _) => Transport::Stdio {
                command: resolve_command(command, dir, &m.env).map_err(|e| fail("mcp.command", e))?,
                args: spec.args.clone(),
                dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned()),
                env: m.env.clone(),
                environment: spec.environment.clone().into_iter().collect(),
            },
            (None, Some(url)) => Transport::Http {
                url: url.as_str().into(),
                headers: spec.headers.clone().into_iter().collect(),
                client: http_client(limit).map_err(|e| fail("mcp.url", e))?,
            },
            (None, None) => return Err(fail("mcp", "a server has either a command (stdio) or a url".into())),
        };
        Ok(Arc::new_cyclic(|me| Self {
            name: m.name.clone(),
            transport,
            limit,
            timeout_ms: m.timeout_ms,
            max_sessions: spec.max_sessions.max(1),
            prefix: spec.prefix.clone().unwrap_or_else(|| format!("{}_", m.name)),
            read_tools: spec.read_tools.clone(),
            me: me.clone(),
            set: std::sync::OnceLock::new(),
            refreshing: AtomicBool::new(false),
            slots: Mutex::new(HashMap::new()),
        }))
    }

    /// The values to open a session for `ctx` with; without a turn (`None`: listing the tools
    /// at load), the values that need one are left out.
    fn credentials(&self, ctx: Option<&ToolContext>) -> Result<Credentials, ToolError> {
        let empty = ToolContext::default();
        let mut out = Vec::new();
        for (name, template) in self.transport.templates() {
            match crate::template::fill(template, ctx.unwrap_or(&empty)) {
                Ok(value) => out.push((name.clone(), value)),
                Err(_) if ctx.is_none() => {}
                Err(key) => {
                    return Err(ToolError::denied(format!(
                        "the MCP server '{}' needs the turn's {key}, and this turn has none",
                        self.name
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The slot of `credentials`, made if new; past `max_sessions`, the least recently used
    /// other slot is dropped (its session closes once no call holds it).
    fn slot(&self, credentials: Credentials) -> Arc<Slot> {
        let mut slots = lock(&self.slots);
        let now = Instant::now();
        if let Some((slot, used)) = slots.get_mut(&credentials) {
            *used = now;
            return Arc::clone(slot);
        }
        while slots.len() >= self.max_sessions {
            let Some(oldest) = slots.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone()) else { break };
            slots.remove(&oldest);
            tracing::info!(server = %self.name, "closed the least recently used MCP session");
        }
        let slot = Arc::new(Slot::default());
        slots.insert(credentials, (Arc::clone(&slot), now));
        slot
    }

    /// The toolgraph tools of the server's `listed` tools, named `prefix + tool`; the ones that
    /// cannot be offered, each with why.
    fn proxies(&self, listed: &[McpTool]) -> (Vec<Arc<dyn Tool>>, Vec<String>) {
        let (mut tools, mut skipped) = (Vec::new(), Vec::new());
        let Some(server) = self.me.upgrade() else { return (tools, skipped) };
        for t in listed {
            let name = format!("{}{}", self.prefix, t.name);
            if !toolgraph_tools::valid_tool_name(&name) {
                skipped.push(format!("'{}': its name cannot be offered to models", t.name));
                continue;
            }
            let schema = Value::Object((*t.input_schema).clone());
            let arguments = match ArgumentSchema::from_value(&name, schema, &[]) {
                Ok(a) => a,
                Err(e) => {
                    skipped.push(format!("'{}': {e}", t.name));
                    continue;
                }
            };
            let read = self.read_tools.iter().any(|r| *r == t.name);
            let spec = ToolSpec {
                name: name.clone(),
                description: t.description.as_deref().unwrap_or(&t.name).to_owned(),
                class: if read { ToolClass::Read } else { ToolClass::Write },
                parameters: arguments.model_facing().clone(),
                injected: Vec::new(),
                offered_after: Vec::new(),
                required_after: Vec::new(),
                runs_after: Vec::new(),
                answer_field: None,
                cited_as: None,
                display: ToolDisplay {
                    name: t.title.clone().or_else(|| t.annotations.as_ref().and_then(|a| a.title.clone())),
                    description: None,
                    parameters: std::collections::BTreeMap::<String, ParamDisplay>::new(),
                },
            };
            let common = Common { spec, schema: arguments, describe: None, timeout_ms: self.timeout_ms };
            tools.push(Arc::new(McpToolProxy { common, remote: t.name.to_string(), server: Arc::clone(&server) })
                as Arc<dyn Tool>);
        }
        (tools, skipped)
    }

    /// Takes in the server's tool list as `slot`'s session read it: what that session may call,
    /// and the plugin's tools when they changed.
    fn learn(&self, slot: &Slot, listed: &[McpTool]) {
        *lock(&slot.offered) = listed.iter().map(|t| t.name.to_string()).collect();
        let Some(set) = self.set.get().and_then(std::sync::Weak::upgrade) else { return };
        let (tools, skipped) = self.proxies(listed);
        for why in &skipped {
            tracing::warn!(server = %self.name, "an MCP tool was skipped: {why}");
        }
        let specs = |tools: &[Arc<dyn Tool>]| tools.iter().map(|t| t.spec().clone()).collect::<Vec<_>>();
        if specs(&set.members()) != specs(&tools) {
            tracing::info!(server = %self.name, tools = tools.len(), "the MCP server's tools changed");
            set.replace(tools);
        }
    }

    /// Opens a session with `credentials` for `slot` (within the time limit).
    async fn start(&self, credentials: &Credentials, slot: &Arc<Slot>) -> Result<Session, String> {
        let listener = Listener { server: self.me.clone(), slot: Arc::downgrade(slot) };
        let initialized = |r: Result<Result<_, _>, _>| {
            r.map_err(|_| format!("the server did not initialize within {} ms", self.limit.as_millis()))?
                .map_err(|e| format!("the server did not initialize: {e}"))
        };
        match &self.transport {
            Transport::Stdio { command, args, dir, env, .. } => {
                let mut cmd = crate::exec::plugin_command(command, args, dir, env);
                cmd.envs(credentials.iter().map(|(k, v)| (k, v))).stderr(Stdio::null());
                crate::exec::isolate_for_life(&mut cmd);
                let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", command.display()))?;
                let group = crate::exec::ProcessGroup::of(&child);
                let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                    return Err("the server's pipes are missing".into());
                };
                // The child is owned by the group guard from here on; tokio reaps it when it exits.
                tokio::spawn(async move {
                    let _ = child.wait().await;
                });
                let client = initialized(tokio::time::timeout(self.limit, listener.serve((stdout, stdin))).await)?;
                Ok(Session { client, _group: Some(group) })
            }
            Transport::Http { url, client, .. } => {
                let mut headers = HashMap::new();
                for (name, value) in credentials {
                    let name =
                        http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("header {name}: {e}"))?;
                    let value = http::HeaderValue::from_str(value).map_err(|e| format!("header {name}: {e}"))?;
                    headers.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(Arc::clone(url)).custom_headers(headers);
                let transport = StreamableHttpClientTransport::with_client(client.clone(), config);
                let client = initialized(tokio::time::timeout(self.limit, listener.serve(transport)).await)?;
                Ok(Session { client, _group: None })
            }
        }
    }

    /// The live session of `slot`, opened (again) if needed; its tools listed when new or stale.
    async fn session<'a>(
        &self,
        slot: &'a Arc<Slot>,
        credentials: &Credentials,
    ) -> Result<tokio::sync::MutexGuard<'a, Option<Session>>, ToolError> {
        let mut guard = slot.session.lock().await;
        if guard.as_ref().is_some_and(|s| s.client.is_closed() || s.client.peer().is_transport_closed()) {
            tracing::warn!(server = %self.name, "the MCP server's session ended; opening it again");
            *guard = None;
        }
        if guard.is_none() {
            let failed = *lock(&slot.failed);
            if let Some((at, failures)) = failed
                && at.elapsed() < retry_after(failures)
            {
                let wait = retry_after(failures).saturating_sub(at.elapsed()).as_secs() + 1;
                return Err(ToolError::unavailable(format!(
                    "the MCP server '{}' cannot be reached; the next attempt is in {wait} s",
                    self.name
                )));
            }
            match self.start(credentials, slot).await {
                Ok(s) => {
                    *guard = Some(s);
                    *lock(&slot.failed) = None;
                    slot.stale.store(true, Ordering::SeqCst);
                }
                Err(e) => {
                    let failures = failed.map_or(1, |(_, n)| n.saturating_add(1));
                    *lock(&slot.failed) = Some((Instant::now(), failures));
                    tracing::warn!(server = %self.name, error = %e, "cannot reach the MCP server");
                    return Err(ToolError::unavailable(format!(
                        "the MCP server '{}' cannot be reached: {e}",
                        self.name
                    )));
                }
            }
        }
        if slot.stale.swap(false, Ordering::SeqCst)
            && let Some(s) = guard.as_ref()
            && let Ok(Ok(tools)) = tokio::time::timeout(self.limit, s.client.list_all_tools()).await
        {
            self.learn(slot, &tools);
        }
        Ok(guard)
    }

    /// The server's tools, listed at once without a turn (what the plugin offers is decided at
    /// load).
    async fn list(&self) -> Result<Vec<McpTool>, String> {
        let credentials = self.credentials(None).map_err(|e| e.message)?;
        let slot = self.slot(credentials.clone());
        let guard = self.session(&slot, &credentials).await.map_err(|e| e.message)?;
        let Some(s) = guard.as_ref() else { return Err("no session".into()) };
        let tools = tokio::time::timeout(self.limit, s.client.list_all_tools())
            .await
            .map_err(|_| format!("the server did not list its tools within {} ms", self.limit.as_millis()))?
            .map_err(|e| format!("the server did not list its tools: {e}"))?;
        self.learn(&slot, &tools);
        Ok(tools)
    }

    /// Calls tool `name` of the server for the turn of `ctx`.
    async fn call(&self, ctx: &ToolContext, name: &str, arguments: Value) -> Result<Value, ToolError> {
        let credentials = self.credentials(Some(ctx))?;
        let slot = self.slot(credentials.clone());
        let guard = self.session(&slot, &credentials).await?;
        let Some(s) = guard.as_ref() else {
            return Err(ToolError::unavailable(format!("the MCP server '{}' cannot be reached", self.name)));
        };
        if !lock(&slot.offered).contains(name) {
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
                    // The server is gone: the next call opens the session again.
                    *slot.session.lock().await = None;
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

/// The HTTP client of MCP servers over streamable HTTP: the SDK's (reqwest 0.13) on the same
/// rustls and ring as the rest of toolgraph, with the webpki roots. Like `http` plugins
/// ([`crate::http`]) it follows redirects within the server's own origin only: the manifest's
/// `[mcp.headers]` (keys, the turn's tenant) must not go to whatever host a redirect names.
fn http_client(limit: Duration) -> Result<reqwest013::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest013::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest013::redirect::Policy::custom(|attempt| {
            let same = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
            if same && attempt.previous().len() <= 5 { attempt.follow() } else { attempt.stop() }
        }))
        .connect_timeout(limit.min(Duration::from_secs(5)))
        .build()
        .map_err(|e| e.to_string())
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
        // Not canonicalized: a launcher that is a symlink (a virtualenv's `python`) finds its
        // environment by the path it was started as.
        return match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(path),
            Ok(_) => Err(format!("{} is not a file", path.display())),
            Err(e) => Err(format!("{}: {e}", path.display())),
        };
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

    async fn invoke(&self, ctx: &ToolContext, arguments: Value) -> Result<Value, ToolError> {
        self.server.call(ctx, &self.remote, arguments).await
    }
}

/// Connects to the server of an `mcp` manifest: its tools, named `prefix + tool`, as a set that
/// follows the server's list while it runs.
///
/// # Errors
/// The server cannot be started or listed.
pub async fn connect(m: &Manifest, spec: &McpSpec, dir: &Path) -> Result<Arc<ToolSet>, ManifestError> {
    let server = McpServer::new(m, spec, dir)?;
    let listed = server.list().await.map_err(|message| ManifestError {
        path: dir.join(crate::manifest::MANIFEST),
        line: None,
        field: Some("mcp".into()),
        message,
    })?;
    let (tools, skipped) = server.proxies(&listed);
    for why in &skipped {
        tracing::warn!(server = %m.name, "an MCP tool was skipped: {why}");
    }
    let set = Arc::new(ToolSet::new(&m.name, tools));
    let _ = server.set.set(Arc::downgrade(&set));
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_between_attempts_doubles_up_to_a_minute() {
        let waits: Vec<u64> = (1..=7).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(retry_after(u32::MAX), MAX_RETRY_AFTER);
    }
}
