//! Interoperability: toolgraph's MCP server driven by an implementation nobody here wrote, the
//! official Python SDK's client (PyPI `mcp`, installed by `scripts/interop-deps`), over stdio.

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

use toolgraph_testkit::interop::mcp_python;

fn toolgraph(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolgraph")).args(args).output().expect("the binary runs")
}

/// A configuration with the example plugins (and `extra`), and the example corpus ingested as
/// knowledge base `docs` of `tenant`: (temp dir, config path, data dir).
fn setup(extra: &str, tenant: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = dir.path().join("toolgraph.toml");
    let plugins = root.join("examples/plugins");
    std::fs::write(
        &config,
        format!("[rag]\nembedding = \"none\"\n[plugins]\ndirs = [{:?}]\n{extra}", plugins.display().to_string()),
    )
    .unwrap();
    let (config, data) = (config.to_str().unwrap().to_owned(), dir.path().join("data").to_str().unwrap().to_owned());
    let corpus = root.join("examples/corpus");
    let ingest = toolgraph(&[
        "--config",
        &config,
        "--data-dir",
        &data,
        "ingest",
        corpus.to_str().unwrap(),
        "--kb",
        "docs",
        "--tenant",
        tenant,
    ]);
    assert!(ingest.status.success(), "{}", String::from_utf8_lossy(&ingest.stderr));
    (dir, config, data)
}

/// Runs `tests/interop/<script>` with `args`; what it saw.
fn python_script(python: &std::path::Path, script: &str, args: &[&str]) -> Value {
    let client = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop").join(script);
    let out = Command::new(python).arg(&client).args(args).output().expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap()
}

/// What the client saw is the whole export of [`setup`]'s configuration, working.
fn assert_full_export(seen: &Value) {
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

#[test]
fn the_official_python_client_lists_calls_reads_and_gets_prompts_over_stdio() {
    let Some(python) = mcp_python() else { return };
    // `toolgraph mcp` acts for `rag.tenant`, by default `default`.
    let (_dir, config, data) = setup("", "default");
    let seen = python_script(&python, "mcp_client.py", &["stdio", env!("CARGO_BIN_EXE_toolgraph"), &config, &data]);
    assert_full_export(&seen);
}

/// What an approval run of `mcp_approval.py` saw is right: the person was asked about the
/// approved, unticked and declined calls (not the invalid one), and only the approved note exists.
fn assert_approvals(seen: &Value) {
    assert_eq!(seen["write_read_only_hint"], false, "{seen}");
    assert_eq!(seen["approved"]["is_error"], false, "{seen}");
    for refused in ["unticked", "declined"] {
        assert_eq!(seen[refused]["is_error"], true, "{seen}");
        assert!(seen[refused]["text"].as_str().unwrap().contains("rejected"), "{seen}");
    }
    assert!(seen["invalid"]["text"].as_str().unwrap().contains("invalid arguments"), "{seen}");
    let asked = seen["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 3, "{seen}");
    assert!(asked[0].as_str().unwrap().contains("Save the note \"approved\""), "{seen}");
    let notes: Vec<&str> =
        seen["notes"]["notes"].as_array().unwrap().iter().map(|n| n["title"].as_str().unwrap()).collect();
    assert_eq!(notes, ["approved"], "{seen}");
}

/// `mcp.write_tools`: the official Python client calls the exported `note_write`, and the person
/// it asks decides — by a request to the client on the initialize handshake's protocol, by an
/// `input_required` answer on 2026-07-28.
#[test]
fn an_exported_write_tool_runs_only_when_the_person_at_the_client_approves() {
    let Some(python) = mcp_python() else { return };
    for mode in ["legacy", "auto"] {
        let (_dir, config, data) = setup("[mcp]\nwrite_tools = [\"note_write\"]\n", "default");
        let args = [mode, "stdio", env!("CARGO_BIN_EXE_toolgraph"), &config, &data];
        let seen = python_script(&python, "mcp_approval.py", &args);
        let expected = if mode == "legacy" { "2025-11-25" } else { "2026-07-28" };
        assert_eq!(seen["protocol"], expected, "{seen}");
        assert_approvals(&seen);
    }
}

/// `toolgraph serve` with `config` on a free port, ready; killed when the test ends, passing or not.
struct Service(std::process::Child, String);

impl Service {
    async fn start(config: &str, data: &str, dir: &std::path::Path) -> Self {
        let port = toolgraph_testkit::process_port();
        let child = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
            .args(["--config", config, "--data-dir", data, "serve", "--port", &port.to_string()])
            .current_dir(dir)
            // No model is asked over MCP; the service still wants one configured.
            .env("TOOLGRAPH_LLM_BASE_URL", "http://127.0.0.1:9/v1")
            .env("TOOLGRAPH_LLM_MODEL", "none")
            .env("TOOLGRAPH_RAG_TENANT", "nobody")
            .env_remove("TOOLGRAPH_DATABASE_URL")
            .env_remove("PORT")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let service = Self(child, format!("http://127.0.0.1:{port}"));
        let started = std::time::Instant::now();
        while !reqwest::get(format!("{}/ready", service.1)).await.is_ok_and(|r| r.status() == 200) {
            assert!(started.elapsed().as_secs() < 20, "the service never became ready");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        service
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_official_python_client_works_over_http_on_serve_with_an_api_key() {
    let Some(python) = mcp_python() else { return };
    let hash = toolgraph_server::auth::hash_api_key;
    let server = format!(
        "[mcp]\nhttp = true\n[server]\nauth = \"api_key\"\n[server.api_keys]\nacme = \"{}\"\nother = \"{}\"\n\
         [server.api_key_tenants]\nacme = 1\nother = 2\n",
        hash("k-acme"),
        hash("k-other")
    );
    // The default tenant (`rag.tenant`) has no knowledge base: what the client sees is acme's.
    let (dir, config, data) = setup(&server, "acme");
    let service = Service::start(&config, &data, dir.path()).await;
    let base = service.1.clone();
    let url = format!("{base}/mcp");
    let seen =
        python_script(&python, "mcp_client.py", &["http", &url, "X-Tenant-Slug=acme", "Authorization=Bearer k-acme"]);
    assert_full_export(&seen);

    // Another tenant's key opens nothing of acme's; no key opens nothing at all.
    let list = |slug: &'static str, key: Option<&'static str>| {
        let mut req = reqwest::Client::new()
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("X-Tenant-Slug", slug)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, other) = list("other", Some("k-other")).await;
    assert_eq!((status, &other["result"]["resources"]), (200, &json!([])), "{other}");
    assert_eq!(list("acme", Some("k-other")).await.0, 401);
    assert_eq!(list("acme", None).await.0, 401);
}

/// A person's memory over `/mcp`, read by the official Python client with a tenant's key: the
/// items the store routes kept for them, listed and read as JSON — a namespace label with a
/// `/` and a key with spaces and accents included — and another person's none.
#[tokio::test]
async fn the_official_python_client_reads_a_persons_memory_as_resources() {
    let Some(python) = mcp_python() else { return };
    let server = format!(
        "[mcp]\nhttp = true\n[server]\nauth = \"api_key\"\n[server.api_keys]\nacme = \"{}\"\n\
         [server.api_key_tenants]\nacme = 1\n",
        toolgraph_server::auth::hash_api_key("k-acme")
    );
    let (dir, config, data) = setup(&server, "acme");
    let service = Service::start(&config, &data, dir.path()).await;
    let base = service.1.clone();
    let item = json!({"namespace": ["memories", "tutor/es"], "key": "idioma preferido ñ", "value": {"text": "Prefiere respuestas en catalán"}});
    let put = reqwest::Client::new()
        .put(format!("{base}/store/items"))
        .bearer_auth("k-acme")
        .header("X-Tenant-Slug", "acme")
        .header("X-User-Id", "7")
        .json(&item)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    let url = format!("{base}/mcp");
    let as_user = |user: &str| {
        let args = [
            url.clone(),
            "X-Tenant-Slug=acme".into(),
            "Authorization=Bearer k-acme".into(),
            format!("X-User-Id={user}"),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        python_script(&python, "mcp_memory.py", &args)
    };
    let seen = as_user("7");
    let memories = seen["memories"].as_array().unwrap();
    assert_eq!(memories.len(), 1, "{seen}");
    assert_eq!(
        memories[0]["uri"],
        toolgraph_server::memory_uri(&["memories".into(), "tutor/es".into()], "idioma preferido ñ"),
        "{seen}"
    );
    assert_eq!(
        (&memories[0]["name"], &memories[0]["mime"]),
        (&json!("idioma preferido ñ"), &json!("application/json"))
    );
    let read: Value = serde_json::from_str(seen["read"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(read["value"]["text"], "Prefiere respuestas en catalán", "{seen}");
    assert_eq!(read["namespace"], json!(["memories", "tutor/es"]), "{seen}");
    assert_eq!(as_user("8")["memories"], json!([]), "another person's none");
}

/// The same over `/mcp` of `toolgraph serve`: on 2026-07-28 the approval round-trips through
/// `input_required` with no session; on the handshake's protocol the stateless endpoint cannot
/// ask, so the write tool is refused and nothing is written.
#[tokio::test]
async fn an_exported_write_tool_over_http_is_asked_about_or_refused() {
    let Some(python) = mcp_python() else { return };
    let (dir, config, data) = setup("[mcp]\nhttp = true\nwrite_tools = [\"note_write\"]\n", "default");
    let service = Service::start(&config, &data, dir.path()).await;
    let url = format!("{}/mcp", service.1);
    // Notes are a user's: the request names one within its tenant.
    let seen = python_script(&python, "mcp_approval.py", &["auto", "http", &url, "X-User-Id=7"]);
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_approvals(&seen);
    let seen = python_script(&python, "mcp_approval.py", &["legacy", "http", &url, "X-User-Id=7"]);
    assert_eq!(seen["asked"], json!([]), "{seen}");
    for call in ["approved", "unticked", "declined"] {
        assert!(seen[call]["text"].as_str().unwrap().contains("cannot ask"), "{seen}");
    }
    let notes: Vec<&str> =
        seen["notes"]["notes"].as_array().unwrap().iter().map(|n| n["title"].as_str().unwrap()).collect();
    assert_eq!(notes, ["approved"], "only the approval over 2026-07-28 wrote: {seen}");
}

#[test]
fn write_tools_that_are_not_write_tools_are_refused_at_start() {
    for (listed, why) in
        [("calculator", "'calculator' is a read tool"), ("launch_rocket", "no tool named 'launch_rocket'")]
    {
        let (_dir, config, data) = setup(&format!("[mcp]\nwrite_tools = [\"{listed}\"]\n"), "default");
        let out = toolgraph(&["--config", &config, "--data-dir", &data, "mcp"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("mcp.write_tools") && stderr.contains(why), "{stderr}");
    }
}
