//! toolgraph's MCP export ([`McpExport`]) over streamable HTTP on a loopback listener, the way
//! `/mcp` serves it (the HTTP layer sets the tenant it authenticated), driven with raw JSON-RPC:
//! the note book stays per tenant and per user, and an approval of a write
//! tool is a server-keyed, single-use token for exactly one call (docs/plugins.md).

use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use toolgraph_plugins::mcp_server::{McpExport, NoResources, TenantScope, UserScope};
use toolgraph_tools::{ToolContext, ToolRegistry};

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

/// Serves `export` on `/mcp` of a loopback listener; a request's `X-Tenant-Slug` becomes its
/// [`TenantScope`], as the service's HTTP layer does after authenticating it, and (standing in
/// for an authentication that establishes a user) `X-Test-User` its [`UserScope`]. Its base URL.
async fn serve(export: McpExport) -> String {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_allowed_hosts(["127.0.0.1".to_string()]);
    let service =
        StreamableHttpService::new(move || Ok(export.clone()), Arc::new(LocalSessionManager::default()), config);
    let app = axum::Router::new().route(
        "/mcp",
        axum::routing::any(move |mut req: axum::extract::Request| {
            let service = service.clone();
            async move {
                // (Read into owned values first: a borrow of the request, whose body is not
                // `Sync`, must not live across the await.)
                let (tenant, user) = (header(req.headers(), "x-tenant-slug"), header(req.headers(), "x-test-user"));
                if let Some(tenant) = tenant {
                    req.extensions_mut().insert(TenantScope(tenant));
                }
                if let Some(user) = user {
                    req.extensions_mut().insert(UserScope(user));
                }
                service.handle(req).await.map(axum::body::Body::new)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn header(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// One `tools/call` on protocol 2026-07-28 (no session: every request says who it is), with
/// `headers`; the JSON-RPC `result`.
async fn call(base: &str, headers: &[(&str, &str)], params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1.0.0"},
    });
    let mut req = reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}));
    if let Some(name) = params["name"].as_str() {
        req = req.header("Mcp-Name", name);
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success() && body.get("result").is_some(), "{status}: {body}");
    body["result"].clone()
}

/// The text of a tool result's first content block.
fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// A write tool `pay` that counts its runs.
struct Pay {
    spec: toolgraph_tools::ToolSpec,
    schema: toolgraph_tools::ArgumentSchema,
    runs: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl toolgraph_tools::Tool for Pay {
    fn spec(&self) -> &toolgraph_tools::ToolSpec {
        &self.spec
    }
    fn arguments(&self) -> &toolgraph_tools::ArgumentSchema {
        &self.schema
    }
    fn describe(&self, arguments: &Value) -> String {
        format!("Pay {}", arguments["amount"])
    }
    async fn invoke(&self, _ctx: &ToolContext, arguments: Value) -> Result<Value, toolgraph_tools::ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(json!({"paid": arguments["amount"]}))
    }
}

fn counter(runs: &Arc<AtomicUsize>) -> Arc<dyn toolgraph_tools::Tool> {
    let parameters = json!({
        "type": "object",
        "properties": {"amount": {"type": "integer"}},
        "required": ["amount"],
        "additionalProperties": false,
    });
    let spec = toolgraph_tools::ToolSpec {
        name: "pay".into(),
        description: "Pay an amount.".into(),
        class: toolgraph_tools::ToolClass::Write,
        parameters: parameters.clone(),
        injected: Vec::new(),
        offered_after: Vec::new(),
        required_after: Vec::new(),
        runs_after: Vec::new(),
        answer_field: None,
        cited_as: None,
        display: Default::default(),
    };
    let schema = toolgraph_tools::ArgumentSchema::from_value("pay", parameters, &[]).unwrap();
    Arc::new(Pay { spec, schema, runs: Arc::clone(runs) })
}

fn export_with(tools: ToolRegistry, write: &[&str]) -> McpExport {
    let names: Vec<String> = write.iter().map(|s| (*s).to_owned()).collect();
    McpExport::new(tools, Arc::new(NoResources), Vec::new(), "default".into()).with_write_tools(&names).unwrap()
}

const ACCEPT: &str = r#"{"action": "accept", "content": {"approve": true}}"#;

/// The approval the person gives, answering `asked` (an `input_required` result).
fn approve(call: &Value, asked: &Value) -> Value {
    let mut retry = call.clone();
    retry["requestState"] = asked["requestState"].clone();
    retry["inputResponses"] = json!({"approval": serde_json::from_str::<Value>(ACCEPT).unwrap()});
    retry
}

/// A chat turn of user 7 of tenant acme, as the service sets its context.
fn acme_user_7() -> ToolContext {
    ToolContext::default().set("tenant", json!("acme")).set("tenantId", json!(1)).set("userId", json!(7))
}

/// The built-in tools exported over MCP, after user 7 of tenant acme saved a note ("Plan", with
/// "42 million" in it) in a chat turn: the data directory and the export's base URL.
async fn acmes_note_over_mcp() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let tools = toolgraph_tools::builtin::registry(dir.path()).unwrap();
    let note = json!({"title": "Plan", "body": "The acquisition price is 42 million."});
    assert!(tools.call(&acme_user_7(), "note_write", &note).await.is_success());
    (dir, serve(export_with(tools, &["note_write"])).await)
}

#[tokio::test]
async fn notes_over_mcp_are_another_tenants_never_and_need_a_user() {
    let (dir, base) = acmes_note_over_mcp().await;

    let list = json!({"name": "note_list", "arguments": {"contains": "42 million"}});
    for tenant in [&[("X-Tenant-Slug", "rival")][..], &[("X-Tenant-Slug", "acme")][..], &[][..]] {
        // No user comes over MCP here: whoever the tenant, there are no notes to read.
        let listed = call(&base, tenant, list.clone()).await;
        assert!(!listed.to_string().contains("42 million"), "{tenant:?} read acme's note: {listed}");
        assert_eq!(listed["isError"], true, "{tenant:?}: {listed}");
        assert!(text(&listed).contains("user"), "{listed}");
    }
    // Nor can it write one, even approved.
    let write = json!({"name": "note_write", "arguments": {"title": "Plan", "body": "Sold.", "overwrite": true}});
    let asked = call(&base, &[("X-Tenant-Slug", "acme")], write.clone()).await;
    let done = call(&base, &[("X-Tenant-Slug", "acme")], approve(&write, &asked)).await;
    assert_eq!(done["isError"], true, "{done}");
    let mine = toolgraph_tools::builtin::registry(dir.path()).unwrap();
    let listed = mine.call(&acme_user_7(), "note_list", &json!({"contains": "42 million"})).await.to_json();
    assert_eq!(listed["notes"][0]["title"], "Plan", "acme's note was replaced: {listed}");
}

#[tokio::test]
async fn an_approval_state_a_client_can_compute_runs_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tools = ToolRegistry::new();
    tools.register(counter(&runs)).unwrap();
    let base = serve(export_with(tools, &["pay"])).await;
    let pay = json!({"name": "pay", "arguments": {"amount": 1000}});
    // The state as a client can compute it without the server: a digest of the tool and its
    // arguments, with no key.
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    digest.update(b"pay\0");
    digest.update(serde_json::to_vec(&pay["arguments"]).unwrap());
    let forged = json!({"requestState": format!("approve:{:x}", digest.finalize())});
    let result = call(&base, &[], approve(&pay, &forged)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a forged approval ran the tool: {result}");
    assert!(result.get("requestState").is_some(), "the person is asked instead: {result}");
}

#[tokio::test]
async fn an_approval_runs_its_call_once_on_the_server_that_asked() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tools = ToolRegistry::new();
    tools.register(counter(&runs)).unwrap();
    let base = serve(export_with(tools.clone(), &["pay"])).await;
    let pay = json!({"name": "pay", "arguments": {"amount": 1000}});
    let asked = call(&base, &[], pay.clone()).await;
    assert!(asked["requestState"].is_string(), "{asked}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "asked, not run");

    // Approved for 1000, retried for 5000: asked again, not run.
    let mut other = approve(&pay, &asked);
    other["arguments"]["amount"] = json!(5000);
    let again = call(&base, &[], other).await;
    assert!(again.get("requestState").is_some(), "{again}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Another server (another process: another key) does not take this server's approval.
    let elsewhere = serve(export_with(tools, &["pay"])).await;
    let result = call(&elsewhere, &[], approve(&pay, &asked)).await;
    assert!(result.get("requestState").is_some(), "another server took the approval: {result}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let done = call(&base, &[], approve(&pay, &asked)).await;
    assert_eq!(done["structuredContent"], json!({"paid": 1000}), "{done}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The same approval again (a replay, a client's retry): not run a second time.
    let replay = call(&base, &[], approve(&pay, &asked)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the approval ran twice: {replay}");
    assert!(replay.get("requestState").is_some(), "the person is asked again: {replay}");
}

/// Replicas configured with one key (`mcp.approval_key`) take each other's approvals: asked on
/// one, approved on another, run there once; a key under 32 bytes is refused.
#[tokio::test]
async fn replicas_sharing_a_key_take_each_others_approvals_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tools = ToolRegistry::new();
    tools.register(counter(&runs)).unwrap();
    let key = [7u8; 32];
    let replica = || export_with(tools.clone(), &["pay"]).with_approval_key(&key).unwrap();
    let (a, b) = (serve(replica()).await, serve(replica()).await);
    let pay = json!({"name": "pay", "arguments": {"amount": 30}});
    let asked = call(&a, &[], pay.clone()).await;
    assert!(asked["requestState"].is_string(), "{asked}");
    let done = call(&b, &[], approve(&pay, &asked)).await;
    assert_eq!(done["structuredContent"], json!({"paid": 30}), "{done}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let replay = call(&b, &[], approve(&pay, &asked)).await;
    assert!(replay.get("requestState").is_some(), "the person is asked again: {replay}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run once on the replica that took it");
    assert!(export_with(tools, &["pay"]).with_approval_key(&[7u8; 31]).is_err());
}

#[tokio::test]
async fn a_user_the_service_vouches_for_has_their_own_notes_over_mcp() {
    let (_dir, base) = acmes_note_over_mcp().await;

    // The chat's user 7 of acme, over MCP: the same note book.
    let list = json!({"name": "note_list", "arguments": {"contains": "42 million"}});
    let mine = call(&base, &[("X-Tenant-Slug", "acme"), ("X-Test-User", "7")], list.clone()).await;
    assert_eq!(mine["structuredContent"]["notes"][0]["title"], "Plan", "{mine}");
    // Another user of acme, and user 7 of another tenant: nothing.
    for who in [[("X-Tenant-Slug", "acme"), ("X-Test-User", "8")], [("X-Tenant-Slug", "rival"), ("X-Test-User", "7")]] {
        let theirs = call(&base, &who, list.clone()).await;
        assert_eq!(theirs["structuredContent"]["notes"], json!([]), "{who:?}: {theirs}");
    }
    // User 8 writes (approved) a note of the same title: user 7's stays.
    let who = [("X-Tenant-Slug", "acme"), ("X-Test-User", "8")];
    let write = json!({"name": "note_write", "arguments": {"title": "Plan", "body": "Sold.", "overwrite": true}});
    let asked = call(&base, &who, write.clone()).await;
    // An approval asked for user 8 does not pass for user 7.
    let as_seven = call(&base, &[("X-Tenant-Slug", "acme"), ("X-Test-User", "7")], approve(&write, &asked)).await;
    assert!(as_seven.get("requestState").is_some(), "{as_seven}");
    let done = call(&base, &who, approve(&write, &asked)).await;
    assert_eq!(done["isError"], false, "{done}");
    let mine = call(&base, &[("X-Tenant-Slug", "acme"), ("X-Test-User", "7")], list).await;
    assert_eq!(mine["structuredContent"]["notes"][0]["title"], "Plan", "{mine}");
}

/// Over stdio the client is a program of the person who started toolgraph: their notes are the
/// export's local user's, and without one there are none.
#[tokio::test]
async fn over_stdio_notes_are_the_local_users_or_refused() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    let dir = tempfile::tempdir().unwrap();
    let tools = toolgraph_tools::builtin::registry(dir.path()).unwrap();
    let me = ToolContext::default().set("tenant", json!("default")).set("userId", json!("local"));
    assert!(tools.call(&me, "note_write", &json!({"title": "Mine", "body": "Local note."})).await.is_success());
    let others = ToolContext::default().set("tenant", json!("default")).set("userId", json!(3));
    assert!(tools.call(&others, "note_write", &json!({"title": "Theirs", "body": "Not mine."})).await.is_success());

    for (export, expected) in [
        (export_with(tools.clone(), &[]).with_local_user("local"), Some("Mine")),
        (export_with(tools.clone(), &[]), None),
    ] {
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            if let Ok(running) = export.serve(server_io).await {
                let _ = running.waiting().await;
            }
        });
        let client = ().serve(client_io).await.unwrap();
        let result = client.call_tool(CallToolRequestParams::new("note_list")).await.unwrap();
        let value = serde_json::to_value(&result).unwrap();
        match expected {
            Some(title) => {
                let notes = &value["structuredContent"]["notes"];
                assert_eq!(notes.as_array().map(Vec::len), Some(1), "{value}");
                assert_eq!(notes[0]["title"], title, "{value}");
            }
            None => {
                assert_eq!(value["isError"], true, "{value}");
                assert!(text(&value).contains("user"), "{value}");
            }
        }
        client.cancel().await.unwrap();
    }
}
