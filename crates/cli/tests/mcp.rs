//! Interoperability: toolgraph's MCP server driven by an implementation nobody here wrote, the
//! official Python SDK's client (PyPI `mcp`, installed by `scripts/interop-deps`), over stdio.

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

/// The Python with the MCP SDK: `TOOLGRAPH_MCP_PYTHON`, else the virtualenv `scripts/interop-deps`
/// makes. `None` (with a message) only when it is missing and `CI` is unset.
fn mcp_python() -> Option<PathBuf> {
    let python = std::env::var_os("TOOLGRAPH_MCP_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
        cache.join("toolgraph/mcp-venv/bin/python")
    });
    let works = Command::new(&python).args(["-c", "import mcp"]).output().is_ok_and(|o| o.status.success());
    if works {
        return Some(python);
    }
    let why = format!("{} with the `mcp` package is missing (run scripts/interop-deps)", python.display());
    assert!(std::env::var_os("CI").is_none(), "{why}: required under CI");
    eprintln!("SKIPPED: {why}; set CI=true to make this a failure");
    None
}

fn toolgraph(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolgraph")).args(args).output().expect("the binary runs")
}

#[test]
fn the_official_python_client_lists_calls_reads_and_gets_prompts_over_stdio() {
    let Some(python) = mcp_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = dir.path().join("toolgraph.toml");
    let plugins = root.join("examples/plugins");
    std::fs::write(
        &config,
        format!("[rag]\nembedding = \"none\"\n[plugins]\ndirs = [{:?}]\n", plugins.display().to_string()),
    )
    .unwrap();
    let (config, data) = (config.to_str().unwrap(), dir.path().join("data"));
    let data = data.to_str().unwrap();
    let corpus = root.join("examples/corpus");
    let ingest =
        toolgraph(&["--config", config, "--data-dir", data, "ingest", corpus.to_str().unwrap(), "--kb", "docs"]);
    assert!(ingest.status.success(), "{}", String::from_utf8_lossy(&ingest.stderr));
    let client = root.join("crates/cli/tests/interop/mcp_client.py");
    let out = Command::new(&python)
        .arg(&client)
        .args([env!("CARGO_BIN_EXE_toolgraph"), config, data])
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(seen["server"], "toolgraph");
    // Read tools only (note_write needs a person's approval inside toolgraph); plugins included.
    assert_eq!(seen["tools"], json!(["bad_calculator", "calculator", "datetime_now", "note_list", "rag_search"]));
    assert_eq!(seen["read_only_hints"], json!([true]));
    assert_eq!(seen["calculator_schema"]["type"], "object");
    assert_eq!(
        seen["calc"],
        json!({"is_error": false, "text": "{\"expression\":\"6*7\",\"result\":42.0}", "structured": {"expression": "6*7", "result": 42.0}})
    );
    assert_eq!(seen["plugin"], json!({"is_error": false, "structured": {"result": 103}}));
    assert_eq!(seen["calc_error"]["is_error"], true);
    assert!(seen["calc_error"]["text"].as_str().unwrap().contains("invalid_arguments"), "{seen}");
    assert_eq!(seen["write"]["is_error"], true);
    assert!(seen["write"]["text"].as_str().unwrap().contains("needs a person's approval"), "{seen}");
    let search = &seen["search"]["structured"];
    assert_eq!((search["ok"].as_bool(), search["total_results"].as_u64()), (Some(true), Some(1)), "{seen}");
    assert!(search["results"][0]["content"].as_str().unwrap().contains("examen"), "{seen}");
    let resources: Vec<&str> = seen["resources"].as_array().unwrap().iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(resources.len(), 3, "{resources:?}");
    assert!(resources.iter().all(|u| u.starts_with("toolgraph://kb/docs/")), "{resources:?}");
    let read = seen["read"].as_str().unwrap();
    assert!(read.starts_with("## [") && read.contains("examen final"), "{read}");
    assert!(seen["missing"].as_str().unwrap().contains("no resource"), "{seen}");
    assert_eq!(seen["prompts"], json!(["assistant"]));
    assert!(seen["prompt"].as_str().unwrap().starts_with("You are a helpful assistant"), "{seen}");
}
