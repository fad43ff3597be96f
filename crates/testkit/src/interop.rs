//! The implementations nobody here wrote that interoperability tests drive — the official MCP
//! SDKs and OpenAI's Python SDK, installed by `scripts/interop-deps` — found with the suite's rule for a missing part:
//! skip with a message locally, fail under `CI`.

use std::path::PathBuf;
use std::process::Command;

/// `$XDG_CACHE_HOME/toolgraph` (else `~/.cache/toolgraph`), where `scripts/interop-deps` installs.
fn cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"))
        .join("toolgraph")
}

/// `None` with a message, or a panic under `CI`.
fn missing<T>(why: &str) -> Option<T> {
    assert!(std::env::var_os("CI").is_none(), "{why}: required under CI");
    eprintln!("SKIPPED: {why}; set CI=true to make this a failure");
    None
}

/// The Python with the official MCP SDK (PyPI `mcp`): `TOOLGRAPH_MCP_PYTHON`, else the
/// virtualenv `scripts/interop-deps` makes.
///
/// # Panics
/// Under `CI` when it is missing.
pub fn mcp_python() -> Option<PathBuf> {
    python_with("mcp")
}

/// The Python with OpenAI's official SDK (PyPI `openai`), whose client drives `toolgraph
/// serve`'s chat completions: the same virtualenv as [`mcp_python`].
///
/// # Panics
/// Under `CI` when it is missing.
pub fn openai_python() -> Option<PathBuf> {
    python_with("openai")
}

/// schemathesis's command (PyPI `schemathesis`), which tests `toolgraph serve` against its own
/// OpenAPI document: in the virtualenv `scripts/interop-deps` makes for it alone (its
/// dependencies are not the SDKs').
///
/// # Panics
/// Under `CI` when it is missing.
pub fn schemathesis() -> Option<PathBuf> {
    venv_command("schemathesis-venv", "schemathesis", "--version")
}

/// `ag-ui-validate` (PyPI), AG-UI's conformance validator, which judges `toolgraph serve`'s
/// AG-UI streams: in a virtualenv `scripts/interop-deps` makes for it.
///
/// # Panics
/// Under `CI` when it is missing.
pub fn agui_validate() -> Option<PathBuf> {
    venv_command("agui-validate-venv", "ag-ui-validate", "--help")
}

/// Command `name` of the virtualenv `venv` that `scripts/interop-deps` makes, when it runs
/// (with `probe`).
fn venv_command(venv: &str, name: &str, probe: &str) -> Option<PathBuf> {
    let command = cache().join(venv).join("bin").join(name);
    if Command::new(&command).arg(probe).output().is_ok_and(|o| o.status.success()) {
        return Some(command);
    }
    missing(&format!("{} is missing (run scripts/interop-deps)", command.display()))
}

/// LangGraph's own server's command, `langgraph` (PyPI `langgraph-cli[inmem]`, whose `langgraph
/// dev` serves a graph in memory), which the shape comparison runs beside `toolgraph serve`: in
/// the virtualenv `scripts/interop-deps` makes for it (shared with `scripts/bench-agent-server`).
///
/// # Panics
/// Under `CI` when it is missing.
pub fn langgraph_dev() -> Option<PathBuf> {
    venv_command("langgraph-dev-venv", "langgraph", "--help")
}

/// The Python with LangGraph's SDK (PyPI `langgraph-sdk`): the same virtualenv as
/// [`mcp_python`].
///
/// # Panics
/// Under `CI` when it is missing.
pub fn langgraph_python() -> Option<PathBuf> {
    python_with("langgraph_sdk")
}

/// The interop virtualenv's Python (`TOOLGRAPH_MCP_PYTHON`, else the one `scripts/interop-deps`
/// makes), when it imports `package`.
fn python_with(package: &str) -> Option<PathBuf> {
    let python =
        std::env::var_os("TOOLGRAPH_MCP_PYTHON").map_or_else(|| cache().join("mcp-venv/bin/python"), PathBuf::from);
    let import = format!("import {package}");
    let works = Command::new(&python).args(["-c", &import]).output().is_ok_and(|o| o.status.success());
    if works {
        return Some(python);
    }
    missing(&format!("{} with the `{package}` package is missing (run scripts/interop-deps)", python.display()))
}

/// The ES module entry of AG-UI's official client (npm `@ag-ui/client`), run with `node`:
/// where `scripts/interop-deps` puts it.
///
/// # Panics
/// Under `CI` when it or `node` is missing.
pub fn agui_client() -> Option<PathBuf> {
    let entry = cache().join("npm/node_modules/@ag-ui/client/dist/index.mjs");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if node && entry.is_file() {
        return Some(entry);
    }
    missing(&format!("node or {} is missing (run scripts/interop-deps)", entry.display()))
}

/// The ES module entry of LangGraph's JS SDK (npm `@langchain/langgraph-sdk`), where
/// `scripts/interop-deps` puts it, when it and `node` are there.
///
/// # Panics
/// Under `CI` when it or `node` is missing.
pub fn langgraph_js() -> Option<PathBuf> {
    let entry = cache().join("npm/node_modules/@langchain/langgraph-sdk/dist/index.js");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if node && entry.is_file() {
        return Some(entry);
    }
    missing(&format!("node or {} is missing (run scripts/interop-deps)", entry.display()))
}

/// The entry point of the official reference server `@modelcontextprotocol/server-everything`
/// (npm), run with `node`: `TOOLGRAPH_MCP_EVERYTHING`, else where `scripts/interop-deps` puts it.
///
/// # Panics
/// Under `CI` when it or `node` is missing.
pub fn mcp_everything() -> Option<PathBuf> {
    let script = std::env::var_os("TOOLGRAPH_MCP_EVERYTHING").map_or_else(
        || cache().join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
        PathBuf::from,
    );
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if node && script.is_file() {
        return Some(script);
    }
    missing(&format!("node or {} is missing (run scripts/interop-deps)", script.display()))
}
