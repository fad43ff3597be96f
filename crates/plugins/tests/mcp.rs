//! Interoperability: toolgraph's MCP client (`kind = "mcp"` plugins) against an implementation
//! nobody here wrote, the official reference server `@modelcontextprotocol/server-everything`
//! (npm, installed by `scripts/interop-deps`), over stdio and streamable HTTP: list, call,
//! schema checks, a long-running call, a call past its time limit, sessions per user, the server
//! killed mid-session and started again, and no process left behind.

use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};
use toolgraph_tools::{ToolClass, ToolContext, ToolErrorKind, ToolRegistry};

use toolgraph_testkit::interop::{mcp_everything as everything, mcp_python};

/// Processes whose command line holds `marker`.
fn running(marker: &str) -> usize {
    let out = Command::new("pgrep").args(["-f", marker]).output().expect("pgrep runs");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

async fn call(reg: &ToolRegistry, name: &str, args: Value) -> Result<Value, (ToolErrorKind, String)> {
    call_as(reg, &ToolContext::default(), name, args).await
}

async fn call_as(
    reg: &ToolRegistry,
    ctx: &ToolContext,
    name: &str,
    args: Value,
) -> Result<Value, (ToolErrorKind, String)> {
    let outcome = reg.call(ctx, name, &args).await;
    match outcome.error() {
        Some(e) => Err((e.kind, e.message.clone())),
        None => Ok(outcome.to_json()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_over_stdio_through_one_long_lived_session() {
    let Some(server) = everything() else { return };
    // A marker on the server's command line finds its process (the server ignores it).
    let marker = format!("tg-mcp-test-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "name = \"everything\"\nversion = \"1.0.0\"\ndescription = \"The MCP reference server.\"\nkind = \"mcp\"\n\
         timeout_ms = 3000\nenv = [\"PATH\"]\n\n[mcp]\ncommand = \"node\"\nargs = [{:?}, \"stdio\", {marker:?}]\n\
         prefix = \"ev_\"\nread_tools = [\"echo\", \"get-sum\"]\n",
        server.display().to_string()
    );
    std::fs::create_dir_all(dir.path().join("everything")).unwrap();
    std::fs::write(dir.path().join("everything/plugin.toml"), manifest).unwrap();
    let loaded = toolgraph_plugins::load_all(&[dir.path().to_path_buf()], "en").await;
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let tools = &loaded.plugins[0].tools;
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    for expected in ["ev_echo", "ev_get-sum", "ev_get-env", "ev_trigger-long-running-operation"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let class = |name: &str| tools.iter().find(|t| t.spec().name == name).unwrap().spec().class;
    assert_eq!(class("ev_echo"), ToolClass::Read, "listed in read_tools");
    assert_eq!(class("ev_get-env"), ToolClass::Write, "not listed: it needs approval, whatever the server hints");
    let mut reg = ToolRegistry::new();
    for t in tools {
        reg.register(t.clone()).unwrap();
    }
    assert_eq!(running(&marker), 1, "one server, started once for every tool");
    let echoed = call(&reg, "ev_echo", json!({"message": "hola"})).await.unwrap();
    assert!(echoed.to_string().contains("hola"), "{echoed}");
    let sum = call(&reg, "ev_get-sum", json!({"a": 2, "b": 3})).await.unwrap();
    assert!(sum.to_string().contains('5'), "{sum}");
    // The server's own schema is checked before the call leaves toolgraph.
    let err = call(&reg, "ev_get-sum", json!({"a": "two", "b": 3})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::InvalidArguments, "{err:?}");
    // Past the plugin's time limit (3 s) a call is a timeout outcome.
    let started = Instant::now();
    let err = call(&reg, "ev_trigger-long-running-operation", json!({"duration": 30, "steps": 3})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::Timeout, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    assert_eq!(running(&marker), 1, "the same session served every call");

    // The server dies mid-session: the next calls find out and start it again.
    let killed = Command::new("pkill").args(["-KILL", "-f", &marker]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let again = loop {
        match call(&reg, "ev_echo", json!({"message": "de vuelta"})).await {
            Ok(v) => break v,
            Err((kind, message)) => {
                assert_eq!(kind, ToolErrorKind::Unavailable, "a dead server's tools are unavailable: {message}");
                assert!(Instant::now() < deadline, "the server was not started again: {message}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    assert!(again.to_string().contains("de vuelta"), "{again}");
    assert_eq!(running(&marker), 1, "exactly one server again");

    // Dropping the plugin's tools ends the session and the server's process group with it.
    drop(reg);
    drop(loaded);
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(&marker) > 0 {
        assert!(Instant::now() < deadline, "the server outlived its plugin");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reference server over streamable HTTP on `port`, its stdout (one line per session it
/// opens) in `log`; killed when dropped.
struct HttpServer(std::process::Child);

impl HttpServer {
    async fn start(script: &std::path::Path, port: u16, log: &std::path::Path) -> Self {
        let child = Command::new("node")
            .arg(script)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "the reference server did not listen");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self(child)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How many sessions the reference server opened, by its log.
fn sessions_opened(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("Session initialized with ID").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_over_streamable_http_with_a_session_per_user() {
    let Some(script) = everything() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let server = HttpServer::start(&script, port, &log).await;
    // Well past the 10 s others cut slow tools off at; the user's id tells sessions apart.
    let manifest = format!(
        "name = \"everything\"\nversion = \"1.0.0\"\ndescription = \"The MCP reference server.\"\nkind = \"mcp\"\n\
         timeout_ms = 20000\n\n[mcp]\nurl = \"http://127.0.0.1:{port}/mcp\"\nprefix = \"ev_\"\n\
         read_tools = [\"echo\", \"trigger-long-running-operation\"]\nmax_sessions = 2\n\
         [mcp.headers]\nX-Toolgraph-User = \"{{ctx.userId}}\"\n"
    );
    std::fs::create_dir_all(dir.path().join("everything")).unwrap();
    std::fs::write(dir.path().join("everything/plugin.toml"), manifest).unwrap();
    let loaded = toolgraph_plugins::load_all(&[dir.path().to_path_buf()], "en").await;
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let mut reg = ToolRegistry::new();
    for t in &loaded.plugins[0].tools {
        reg.register(t.clone()).unwrap();
    }
    assert!(reg.get("ev_get-sum").is_some(), "{reg:?}");
    assert_eq!(sessions_opened(&log), 1, "listing at load");

    let user = |id: i64| ToolContext::default().set("userId", json!(id));
    let echoed = call_as(&reg, &user(1), "ev_echo", json!({"message": "hola"})).await.unwrap();
    assert!(echoed.to_string().contains("hola"), "{echoed}");
    let sum = call_as(&reg, &user(1), "ev_get-sum", json!({"a": 2, "b": 3})).await.unwrap();
    assert!(sum.to_string().contains('5'), "{sum}");
    assert_eq!(sessions_opened(&log), 2, "user 1's session, kept for both calls");
    // A call that needs the user but has none is refused, not sent.
    let err = call(&reg, "ev_echo", json!({"message": "x"})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::Denied, "{err:?}");
    assert!(err.1.contains("userId"), "{err:?}");

    // Eleven seconds of work with progress along the way: it finishes.
    let started = Instant::now();
    let long = call_as(&reg, &user(2), "ev_trigger-long-running-operation", json!({"duration": 11, "steps": 2})).await;
    let long = long.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(11), "{:?}", started.elapsed());
    assert!(long.to_string().contains("completed"), "{long}");
    assert_eq!(sessions_opened(&log), 3, "user 2's own session");
    call_as(&reg, &user(2), "ev_echo", json!({"message": "otra vez"})).await.unwrap();
    assert_eq!(sessions_opened(&log), 3, "reused");
    // max_sessions = 2: a third user's session closes the least recently used one (user 1's).
    call_as(&reg, &user(3), "ev_echo", json!({"message": "tres"})).await.unwrap();
    call_as(&reg, &user(2), "ev_echo", json!({"message": "dos"})).await.unwrap();
    assert_eq!(sessions_opened(&log), 4, "user 2's session was kept");
    call_as(&reg, &user(1), "ev_echo", json!({"message": "uno"})).await.unwrap();
    assert_eq!(sessions_opened(&log), 5, "user 1's session was closed and opened again");

    // The server dies and comes back on the same address: calls fail as unavailable, then work.
    drop(server);
    let err = call_as(&reg, &user(1), "ev_echo", json!({"message": "x"})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::Unavailable, "{err:?}");
    let _server = HttpServer::start(&script, port, &log).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let again = loop {
        match call_as(&reg, &user(1), "ev_echo", json!({"message": "de vuelta"})).await {
            Ok(v) => break v,
            Err((kind, message)) => {
                assert_eq!(kind, ToolErrorKind::Unavailable, "{message}");
                assert!(Instant::now() < deadline, "no new session: {message}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    assert!(again.to_string().contains("de vuelta"), "{again}");
}

/// Polls `reg` until `name` is there (`present`) or gone; the registry generation it saw then.
async fn until_listed(reg: &ToolRegistry, name: &str, present: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while reg.get(name).is_some() != present {
        assert!(Instant::now() < deadline, "'{name}' never {}: {reg:?}", if present { "appeared" } else { "went" });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server on the official Python SDK whose tool list changes while it runs
/// (`tests/interop/changing_server.py`): toolgraph's tools follow `tools/list_changed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_follow_the_servers_list_changed() {
    let Some(python) = mcp_python() else { return };
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/changing_server.py");
    let dir = tempfile::tempdir().unwrap();
    let manifest = format!(
        "name = \"changing\"\nversion = \"1.0.0\"\ndescription = \"Tools that come and go.\"\nkind = \"mcp\"\n\
         timeout_ms = 10000\n[mcp]\ncommand = {:?}\nargs = [{:?}]\nprefix = \"ch_\"\n\
         read_tools = [\"ping\", \"triple\"]\n",
        python.display().to_string(),
        script.display().to_string()
    );
    std::fs::create_dir_all(dir.path().join("changing")).unwrap();
    std::fs::write(dir.path().join("changing/plugin.toml"), manifest).unwrap();
    let loaded = toolgraph_plugins::load_all(&[dir.path().to_path_buf()], "en").await;
    assert!(loaded.errors.is_empty(), "{:?}", loaded.errors);
    let mut all = ToolRegistry::new();
    loaded.plugins[0].register_into(&mut all).unwrap();
    // An agent enabling the plugin by its name gets its tools of the moment, later ones included.
    let reg = all.subset(["changing"]).unwrap();
    assert_eq!(reg.names(), ["ch_add_tool", "ch_ping", "ch_remove_tool"]);
    let before = reg.generation();

    let added = call(&reg, "ch_add_tool", json!({"name": "triple", "factor": 3})).await.unwrap();
    assert!(added.to_string().contains("added triple"), "{added}");
    until_listed(&reg, "ch_triple", true).await;
    assert_ne!(reg.generation(), before, "whoever caches the definitions sees the change");
    let triple = reg.get("ch_triple").unwrap();
    assert_eq!(triple.spec().class, ToolClass::Read, "listed in read_tools");
    assert_eq!(triple.spec().parameters["required"], json!(["x"]), "{:?}", triple.spec().parameters);
    let tripled = call(&reg, "ch_triple", json!({"x": 4})).await.unwrap();
    assert!(tripled.to_string().contains("12"), "{tripled}");
    // A tool the manifest does not list as read still needs approval.
    call(&reg, "ch_add_tool", json!({"name": "double", "factor": 2})).await.unwrap();
    until_listed(&reg, "ch_double", true).await;
    assert_eq!(reg.get("ch_double").unwrap().spec().class, ToolClass::Write);

    call(&reg, "ch_remove_tool", json!({"name": "triple"})).await.unwrap();
    until_listed(&reg, "ch_triple", false).await;
    // A call with the tool in hand from before the change (a model that saw it) is told it went.
    let err = triple.invoke(&ToolContext::default(), json!({"x": 1})).await.unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::NotFound, "{err:?}");
    let err = call(&reg, "ch_triple", json!({"x": 1})).await.unwrap_err();
    assert_eq!(err.0, ToolErrorKind::NotFound, "{err:?}");
}
