//! The `toolgraph` binary end to end: real process, real files.

mod common;

use serde_json::Value;
use std::process::{Command, Output, Stdio};

fn toolgraph(data_dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .current_dir(data_dir)
        .env_remove("TOOLGRAPH_LLM_API_KEY")
        .env_remove("TOOLGRAPH_LLM_BASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn tools_list_json_is_valid_and_has_every_schema() {
    let dir = tempfile::tempdir().unwrap();
    let out = toolgraph(dir.path(), &["tools", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let specs: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    let names: Vec<&str> = specs.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["calculator", "note_list", "note_write", "rag_search"]);
    for s in &specs {
        assert_eq!(s["parameters"]["type"], "object", "{s}");
        assert!(s["parameters"]["properties"].is_object(), "{s}");
        assert!(s["class"] == "read" || s["class"] == "write");
        assert!(s["displayName"].is_string());
    }
    let calc = &specs[0];
    assert_eq!(calc["displayParameters"]["expression"]["displayDescription"], "Expression");
    assert_eq!(calc["parameters"]["properties"]["decimals"]["maximum"], 15);
    assert_eq!(specs[2]["class"], "write");
}

#[test]
fn tools_list_reads_like_a_help_page() {
    let dir = tempfile::tempdir().unwrap();
    let out = toolgraph(dir.path(), &["tools", "list"]);
    let text = stdout(&out);
    assert!(text.contains("note_write  [write (asks for approval)]"), "{text}");
    assert!(text.contains("--expression (string, required)"), "{text}");
}

#[test]
fn tools_call_runs_a_read_tool_and_reports_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let out = toolgraph(dir.path(), &["tools", "call", "calculator", "--args", r#"{"expression": "(2+3)*8.4"}"#]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["result"], 42.0);

    let out = toolgraph(dir.path(), &["tools", "call", "calculator", "--args", r#"{"expression": 5}"#]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["kind"], "invalid_arguments");
    assert!(v["error"].as_str().unwrap().contains("/expression"), "{v}");

    let out = toolgraph(dir.path(), &["tools", "call", "nope"]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["kind"], "not_found");

    let out = toolgraph(dir.path(), &["tools", "call", "calculator", "--args", "{oops"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--args is not valid JSON"), "{}", stderr(&out));
}

#[test]
fn a_write_tool_needs_approval() {
    let dir = tempfile::tempdir().unwrap();
    let args = r#"{"title": "Plan de estudio", "body": "Repasar Docker y CI/CD."}"#;
    let out = toolgraph(dir.path(), &["tools", "call", "note_write", "--args", args]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("needs approval") && err.contains("Save the note \"Plan de estudio\""), "{err}");
    assert!(!dir.path().join("notes/default/local/plan-de-estudio.md").exists(), "nothing written without approval");

    let out = toolgraph(dir.path(), &["tools", "call", "note_write", "--args", args, "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved = std::fs::read_to_string(dir.path().join("notes/default/local/plan-de-estudio.md")).unwrap();
    assert!(saved.contains("Repasar Docker"));
}

#[test]
fn config_show_masks_secrets_and_reports_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("toolgraph.toml"), "[llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["config", "show"])
        .current_dir(dir.path())
        .env("TOOLGRAPH_LLM_API_KEY", "sk-very-secret")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("base_url = \"http://127.0.0.1:9/v1\""), "{text}");
    assert!(!text.contains("sk-very-secret") && text.contains("********"), "{text}");

    std::fs::write(dir.path().join("bad.toml"), "[llm]\ntimeout = 3\n").unwrap();
    let out = toolgraph(dir.path(), &["--config", "bad.toml", "config", "show"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("timeout") && err.contains("bad.toml"), "{err}");
}

#[test]
fn help_lists_the_commands() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph")).arg("--help").output().unwrap();
    let text = stdout(&out);
    assert!(text.contains("tool-using LLM chat agents"), "{text}");
    assert!(text.contains("tools") && text.contains("config"), "{text}");
    assert!(text.contains("ingest") && text.contains("search"), "{text}");
}

#[test]
fn ingest_then_search_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let docs = d.join("cursos/iv/guia");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("guia.md"), "# Guía IV\n## Evaluación\nEl examen final es en enero.\n").unwrap();
    std::fs::write(docs.join("roto.json"), "{ nope").unwrap();
    let src = d.join("cursos").display().to_string();
    let args = ["ingest", src.as_str(), "--kb", "iv", "--path-meta", "{asignatura}/{tipo_documento}/**", "--json"];
    let out = toolgraph(d, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!((report["indexed"].as_u64(), report["total_chunks"].as_u64()), (Some(1), Some(1)), "{report}");
    assert!(report["skipped"][0]["reason"].as_str().unwrap().contains("invalid JSON"), "{report}");
    let again: Value = serde_json::from_str(stdout(&toolgraph(d, &args)).trim()).unwrap();
    assert_eq!(again["unchanged"], 1, "{again}");

    let out = toolgraph(d, &["search", "examen final", "--kb", "iv", "--filter", "asignatura=iv", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["total_results"], 1, "{v}");
    assert_eq!(v["results"][0]["metadata"]["tipo_documento"], "guia");
    assert_eq!(v["results"][0]["metadata"]["citation"], "Guía IV › Evaluación");
    let text = stdout(&toolgraph(d, &["search", "examen", "--kb", "iv"]));
    assert!(text.contains("[Guía IV › Evaluación]"), "{text}");

    let bad = toolgraph(d, &["search", "examen", "--kb", "iv", "--filter", "year>=soon"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("not a number"), "{}", stderr(&bad));
    let missing = toolgraph(d, &["search", "examen", "--kb", "nope"]);
    assert!(stderr(&missing).contains("no knowledge base `nope`"), "{}", stderr(&missing));
}

/// The default embeds with the local e5 model (weights from `scripts/fetch-models embed`, which
/// the test script runs): hybrid search by default, every mode on request, keyword-only on
/// request, and a clear message when the weights are missing.
#[test]
fn ingest_embeds_by_default_and_search_fuses_both_lists() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let docs = d.join("cursos");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("examen.md"), "# Evaluación\nEl examen final de la asignatura es el 20 de enero.\n")
        .unwrap();
    std::fs::write(docs.join("docker.md"), "# Contenedores\nDocker empaqueta aplicaciones en imágenes.\n").unwrap();
    let src = docs.display().to_string();

    let no_weights = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["ingest", src.as_str(), "--kb", "x", "--data-dir"])
        .arg(d)
        .env("TOOLGRAPH_MODELS_DIR", d.join("no-models"))
        .output()
        .unwrap();
    assert!(!no_weights.status.success());
    let err = stderr(&no_weights);
    assert!(err.contains("scripts/fetch-models embed") && err.contains("rag.embedding"), "{err}");

    let out = toolgraph(d, &["ingest", src.as_str(), "--kb", "iv", "--json"]);
    if !out.status.success() && std::env::var_os("CI").is_none() && stderr(&out).contains("scripts/fetch-models") {
        eprintln!("SKIP: {}", stderr(&out));
        return;
    }
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["embedding_model"], "multilingual-e5-small-q4", "{report}");

    // Cross-lingual: an English question finds the Spanish exam note first, by both lists.
    let out = toolgraph(d, &["search", "when is the final exam examen", "--kb", "iv", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let first = &v["results"][0];
    assert!(first["content"].as_str().unwrap().contains("examen"), "{v}");
    assert!(first["ranks"]["bm25"]["rank"].is_u64() && first["ranks"]["dense"]["rank"].is_u64(), "{v}");
    let dense = toolgraph(d, &["search", "¿cuándo es la prueba?", "--kb", "iv", "--mode", "dense", "--json"]);
    let v: Value = serde_json::from_str(stdout(&dense).trim()).unwrap();
    assert!(v["results"][0]["content"].as_str().unwrap().contains("examen"), "{v}");
    assert!(v["results"][0]["ranks"].get("bm25").is_none(), "{v}");
    let bm25 = toolgraph(d, &["search", "docker", "--kb", "iv", "--mode", "bm25", "--json"]);
    let v: Value = serde_json::from_str(stdout(&bm25).trim()).unwrap();
    assert_eq!(v["total_results"], 1, "{v}");
    assert!(v["results"][0]["ranks"].get("dense").is_none(), "{v}");

    // Keyword only: no vectors, bm25 by default, dense refused with a reason.
    let out = toolgraph(d, &["ingest", src.as_str(), "--kb", "kw", "--keyword-only", "--json"]);
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(report["embedding_model"].is_null(), "{report}");
    let out = toolgraph(d, &["search", "docker", "--kb", "kw", "--mode", "dense"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("has no embeddings"), "{}", stderr(&out));
    // …and embedding into it later is refused rather than mixing.
    let out = toolgraph(d, &["ingest", src.as_str(), "--kb", "kw"]);
    assert!(stderr(&out).contains("built without embeddings"), "{}", stderr(&out));
}

#[test]
fn bench_graph_reports_every_figure_and_linear_storage() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["bench", "graph", "--json", "--turns", "30"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
    let keys = ["step_overhead_us", "sqlite_write_p50_us", "sqlite_write_p99_us", "bytes_100_turns", "bytes_200_turns"];
    let reads = ["state_cold_200_turns_us", "state_warm_200_turns_us", "history_10_200_turns_us"];
    for key in keys.into_iter().chain(reads) {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key} missing in {v}");
    }
    let ratio = v["bytes_200_turns"].as_f64().unwrap() / v["bytes_100_turns"].as_f64().unwrap();
    assert!(ratio < 2.4, "storage must grow linearly (≈2), got {ratio:.2}");
}

/// A short month: with everything kept, storage grows with every day's traffic; with
/// retention it stops at what the settings keep — the conversations of the last `idle_days`
/// days, the usage rows of the last `usage_days`, the last `keep_checkpoints` of each thread.
#[test]
fn bench_retention_keeps_storage_bounded_by_the_settings() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["bench", "retention", "--json", "--days", "6", "--per-day", "10", "--turns", "2"])
        .args(["--idle-days", "2", "--usage-days", "3", "--keep-checkpoints", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
    let day = |run: &str, d: usize, key: &str| v[run][d][key].as_i64().unwrap_or(-1);
    for d in 0..6 {
        let n = d as i64 + 1;
        assert_eq!(day("kept", d, "conversations"), 10 * n, "{v}");
        assert_eq!(day("kept", d, "usage_rows"), 20 * n, "{v}");
        // A day's conversations are a day old when the day's pass runs: after 2 days they go.
        assert_eq!(day("pruned", d, "conversations"), 10 * n.min(1), "{v}");
        assert_eq!(day("pruned", d, "usage_rows"), 20 * n.min(2), "{v}");
        // Every finished thread is folded to its last three checkpoints.
        assert_eq!(day("pruned", d, "checkpoints"), 3 * day("pruned", d, "conversations"), "{v}");
        assert!(day("kept", d, "checkpoints") > 3 * day("kept", d, "conversations"), "{v}");
    }
    assert!(day("pruned", 5, "bytes") < day("kept", 5, "bytes"), "{v}");
}

#[test]
fn the_shipped_example_configs_load() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // `config show --json` of a shipped file, with `env` set.
    let show = |file: &str, env: (&str, &str)| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
            .args(["--config"])
            .arg(root.join(file))
            .args(["config", "show", "--json"])
            .env(env.0, env.1)
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()
    };
    for file in ["examples/bench/toolgraph.toml", "examples/bench/toolgraph-sqlite.toml"] {
        let v = show(file, ("TOOLGRAPH_LLM_BASE_URL", "http://127.0.0.1:9/v1"));
        assert_eq!(v["agents"]["analytics"]["tools"], serde_json::json!(["general_query"]), "{file}");
    }
    // The academy admin: the backend's tools, each write tool declared.
    let v = show(
        "examples/lumie/toolgraph.toml",
        ("TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET", "a-secret-of-at-least-16-bytes"),
    );
    let tools = &v["agents"]["academy"]["tools"];
    for write in ["create_announcement", "send_sms", "send_telegram", "schedule_task"] {
        assert!(tools.as_array().unwrap().iter().any(|t| t == write), "{write} not enabled: {tools}");
        assert_eq!(v["server"]["backend_tools"][write]["parameters"]["type"], "object", "{write}");
    }
}

#[test]
fn eval_retrieval_prints_the_metrics_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("corpus.jsonl"),
        "{\"_id\":\"d1\",\"title\":\"Docker volumes\",\"text\":\"Volumes persist container data.\"}\n\
         {\"_id\":\"d2\",\"title\":\"Cats\",\"text\":\"Cats sleep most of the day.\"}\n",
    )
    .unwrap();
    std::fs::write(d.join("queries.jsonl"), "{\"_id\":\"q1\",\"text\":\"How do containers persist data?\"}\n").unwrap();
    std::fs::create_dir(d.join("qrels")).unwrap();
    std::fs::write(d.join("qrels/test.tsv"), "query-id\tcorpus-id\tscore\nq1\td1\t1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["eval", "retrieval", "--json", "--dataset"])
        .arg(d)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    for key in [
        "ndcg_at_10",
        "recall_at_5",
        "recall_at_10",
        "recall_at_100",
        "mrr_at_10",
        "latency_p50_ms",
        "latency_p99_ms",
        "queries",
        "mode",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    assert_eq!(v["ndcg_at_10"], 1.0, "the one relevant document ranks first");
    assert_eq!(v["mode"], "bm25");
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["eval", "retrieval", "--mode", "semantic", "--dataset"])
        .arg(d)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bm25, dense or hybrid"), "{}", stderr(&out));
    // Dense and hybrid need a model: with none configured the error says so.
    let out = Command::new(env!("CARGO_BIN_EXE_toolgraph"))
        .args(["eval", "retrieval", "--mode", "hybrid", "--dataset"])
        .arg(d)
        .env("TOOLGRAPH_RAG_EMBEDDING", "none")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("needs an embedding model"), "{}", stderr(&out));
}

/// `eval tools` against a scripted model over HTTP: a right call, a call with the wrong
/// arguments and a right "no tool" give 2 of 3, and the request offers the agent's tools.
/// `toolgraph eval tools --json` on `cases` against the scripted `server` (with `config`, if
/// given); its report.
async fn eval_tools_json(
    server: &scripted_llm::ScriptedModelServer,
    cases: &std::path::Path,
    data: &std::path::Path,
    config: Option<&std::path::Path>,
) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    cmd.args(["eval", "tools", "--json", "--cases"]).arg(cases).arg("--data-dir").arg(data);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.env("TOOLGRAPH_LLM_BASE_URL", server.base_url()).env("TOOLGRAPH_LLM_MODEL", "scripted");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

/// The names of the tools a model request offers, in its order.
fn offered_tools(request: &Value) -> Vec<String> {
    request["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect()
}

/// A scripted model that calls the calculator, then searches, then says hello.
async fn calculator_search_hello() -> scripted_llm::ScriptedModelServer {
    use scripted_llm::{Reply, ScriptedModelServer};
    ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "calculator", serde_json::json!({"expression": "1234 * 5678"}))]),
        Reply::tool_calls(&[("c2", "rag_search", serde_json::json!({"query": "docker"}))]),
        Reply::text("¡Hola!"),
    ])
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_tools_scores_tool_choice_and_arguments() {
    let server = calculator_search_hello().await;
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(
        &cases,
        "{\"lang\":\"en\",\"prompt\":\"1234*5678?\",\"tool\":\"calculator\",\"args\":{\"expression\":\"1234\"}}\n\
         {\"lang\":\"es\",\"prompt\":\"¿Cuándo es el examen?\",\"tool\":\"rag_search\",\"args\":{\"query\":\"examen\"}}\n\
         {\"lang\":\"es\",\"prompt\":\"¡Hola!\",\"tool\":null}\n",
    )
    .unwrap();
    let v = eval_tools_json(&server, &cases, dir.path(), None).await;
    assert_eq!(v["cases"], 3);
    assert!((v["accuracy"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9, "{v}");
    assert_eq!(v["tool_accuracy"], 1.0, "{v}");
    assert_eq!(v["results"][1]["right"], false);
    let offered = offered_tools(&server.requests()[0]);
    assert!(offered.contains(&"rag_search".to_owned()) && offered.contains(&"calculator".to_owned()), "{offered:?}");
}

/// `eval tools` with cases for two agents: each case runs with its agent's prompt and tools,
/// and the report scores each agent apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_tools_runs_each_case_with_its_agent_and_reports_per_agent() {
    let server = calculator_search_hello().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(
        &config,
        "default_agent = \"tutor\"\n[agents.calc]\nsystem_prompt = \"You compute.\"\ntools = [\"calculator\"]\n\
         [agents.tutor]\nsystem_prompt = \"You tutor.\"\ntools = [\"rag_search\"]\n",
    )
    .unwrap();
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(
        &cases,
        "{\"agent\":\"calc\",\"lang\":\"en\",\"prompt\":\"1234*5678?\",\"tool\":\"calculator\",\"args\":{\"expression\":\"1234\"}}\n\
         {\"lang\":\"es\",\"prompt\":\"¿Cuándo es el examen?\",\"tool\":\"rag_search\",\"args\":{\"query\":\"examen\"}}\n\
         {\"agent\":\"tutor\",\"lang\":\"es\",\"prompt\":\"¡Hola!\",\"tool\":null}\n",
    )
    .unwrap();
    let v = eval_tools_json(&server, &cases, dir.path(), Some(&config)).await;
    assert_eq!(v["agents"]["calc"], serde_json::json!({"cases": 1, "accuracy": 1.0, "tool_accuracy": 1.0}), "{v}");
    assert_eq!(v["agents"]["tutor"], serde_json::json!({"cases": 2, "accuracy": 0.5, "tool_accuracy": 1.0}), "{v}");
    assert_eq!(v["results"][1]["agent"], "tutor", "a case without an agent runs with the default one");
    let requests = server.requests();
    let offered = |i: usize| offered_tools(&requests[i]);
    assert_eq!((offered(0), offered(1)), (vec!["calculator".to_owned()], vec!["rag_search".to_owned()]));
    assert_eq!(requests[0]["messages"][0]["content"], "You compute.");
    assert_eq!(requests[1]["messages"][0]["content"], "You tutor.");
}

/// `eval tools` cases of a later turn (`history`) and of the step after a result (`after`):
/// the messages reach the model in order, and the tools offered are those the agent offers
/// there (`format_citation` only once `retrieve_laws` has returned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_tools_replays_earlier_turns_and_a_tools_result() {
    use scripted_llm::{Reply, ScriptedModelServer};
    use serde_json::json;
    let server = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "retrieve_laws", json!({"question": "điện ảnh"}))]),
        Reply::tool_calls(&[("c2", "format_citation", json!({"answer": "a", "chunks": []}))]),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgraph.toml");
    std::fs::write(
        &config,
        "default_agent = \"law\"\n[tools.legal]\nkb = \"luat\"\n[agents.law]\nsystem_prompt = \"You cite.\"\n\
         tools = [\"retrieve_laws\", \"format_citation\"]\n",
    )
    .unwrap();
    let history = json!([{"role": "user", "content": "Chào bạn!"}, {"role": "assistant", "content": "Chào!"}]);
    let after = json!([
        {"role": "assistant", "content": "", "tool_calls": [{"id": "r1", "name": "retrieve_laws", "arguments": "{}"}]},
        {"role": "tool", "tool_call_id": "r1", "name": "retrieve_laws", "content": "[]"}
    ]);
    let cases = dir.path().join("cases.jsonl");
    let lines = [
        json!({"lang": "vi", "history": history, "prompt": "Luật?", "tool": "retrieve_laws", "args": {"question": "điện"}}),
        json!({"lang": "vi", "prompt": "Luật?", "after": after, "tool": "format_citation"}),
    ];
    std::fs::write(&cases, lines.map(|l| l.to_string()).join("\n")).unwrap();
    let v = eval_tools_json(&server, &cases, dir.path(), Some(&config)).await;
    assert_eq!(v["accuracy"], 1.0, "{v}");
    let requests = server.requests();
    let roles = |i: usize| -> Vec<String> {
        requests[i]["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap().to_owned()).collect()
    };
    let offered = |i: usize| {
        let mut names = offered_tools(&requests[i]);
        names.sort();
        names
    };
    assert_eq!(roles(0), ["system", "user", "assistant", "user"]);
    assert_eq!(requests[0]["messages"][1]["content"], "Chào bạn!");
    assert_eq!(offered(0), ["retrieve_laws"], "nothing has returned in this turn yet");
    assert_eq!(roles(1), ["system", "user", "assistant", "tool"]);
    assert_eq!(offered(1), ["format_citation", "retrieve_laws"]);
}

/// `rag.embedding = "openai"`: ingest and hybrid search through an OpenAI-compatible
/// `/v1/embeddings` server over HTTP (the blocking client is built off the async runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_and_search_with_an_openai_compatible_embedding_server() {
    let server = scripted_llm::ScriptedModelServer::start(vec![]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("examen.md"), "# Evaluación\nEl examen final es el 20 de enero.\n").unwrap();
    std::fs::write(docs.join("docker.md"), "# Contenedores\nDocker empaqueta aplicaciones.\n").unwrap();
    let run = |args: Vec<String>| {
        let (base, d) = (server.base_url(), dir.path().to_owned());
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_toolgraph"))
                .args(&args)
                .arg("--data-dir")
                .arg(&d)
                .env("TOOLGRAPH_RAG_EMBEDDING", "openai")
                .env("TOOLGRAPH_RAG_EMBEDDING_BASE_URL", base)
                .env("TOOLGRAPH_RAG_EMBEDDING_MODEL", "bow")
                .env("TOOLGRAPH_RAG_EMBEDDING_DIMENSION", scripted_llm::EMBEDDING_DIM.to_string())
                .output()
                .unwrap()
        })
    };
    let src = docs.display().to_string();
    let out = run(vec!["ingest".into(), src, "--kb".into(), "k".into(), "--json".into()]).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["embedding_model"], "bow", "{report}");
    let args = ["search", "examen final enero", "--kb", "k", "--json"].map(String::from).to_vec();
    let out = run(args).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(v["results"][0]["content"].as_str().unwrap().contains("examen"), "{v}");
    assert!(v["results"][0]["ranks"]["dense"]["rank"].is_u64(), "{v}");
    let inputs: usize = server.embedding_requests().iter().map(|r| r["input"].as_array().unwrap().len()).sum();
    assert_eq!(inputs, 3, "two chunks at ingest, one query at search");
}

#[test]
fn plugins_check_names_each_problem_and_list_shows_what_loads() {
    let dir = tempfile::tempdir().unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plugins");
    let examples = examples.to_str().unwrap();
    let out = toolgraph(dir.path(), &["plugins", "check", examples]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("2 plugin(s) load, 0 error(s)"), "{}", stdout(&out));
    let out = toolgraph(dir.path(), &["plugins", "list", examples]);
    let listed = stdout(&out);
    assert!(listed.contains("bad_calculator") && listed.contains("1.0.0") && listed.contains("exec"), "{listed}");
    // A broken plugin beside a good one: check fails naming file, line and field; the good
    // one still loads.
    let broken = dir.path().join("mine/broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(
        broken.join("plugin.toml"),
        "name = \"broken\"\nversion = \"1.0\"\ndescription = \"x\"\nkind = \"exec\"\n",
    )
    .unwrap();
    let out = toolgraph(dir.path(), &["plugins", "check", examples, dir.path().join("mine").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("broken/plugin.toml:2: field `version`: '1.0' is not a semver version"), "{err}");
    assert!(stdout(&out).contains("2 plugin(s) load, 1 error(s)"), "{}", stdout(&out));
    // With [plugins] dirs configured, the agent's tools include them.
    std::fs::write(dir.path().join("toolgraph.toml"), format!("[plugins]\ndirs = [{examples:?}]\n")).unwrap();
    let out = toolgraph(dir.path(), &["tools", "list", "--json"]);
    let specs: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("valid JSON");
    assert!(specs.iter().any(|s| s["name"] == "bad_calculator" && s["displayName"] == "Bad calculator"));
}

#[test]
fn guides_import_checks_every_file_first_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/course/guides");
    let (iv, dai) = (shipped.join("iv.json"), shipped.join("dai.json"));
    let (iv, dai) = (iv.to_str().unwrap(), dai.to_str().unwrap());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"subject": "fisica", "asignatura": "Física", "competencias": 3}"#).unwrap();
    // One bad file: nothing is stored, and the error names the file and the field.
    let out = toolgraph(dir.path(), &["guides", "import", iv, bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bad.json") && stderr(&out).contains("`competencias`"), "{}", stderr(&out));
    assert_eq!(stdout(&toolgraph(dir.path(), &["guides", "list"])), "");

    let out = toolgraph(dir.path(), &["guides", "import", iv, dai]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("added: iv") && stdout(&out).contains("added: dai"), "{}", stdout(&out));
    let again = toolgraph(dir.path(), &["guides", "import", iv, dai]);
    assert_eq!(stdout(&again).matches("unchanged:").count(), 2, "{}", stdout(&again));
    assert_eq!(stdout(&toolgraph(dir.path(), &["guides", "list"])), "dai\niv\n");

    let out = toolgraph(dir.path(), &["guides", "show", "iv"]);
    let summary: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((summary["subject"].as_str(), summary["curso"].as_str()), (Some("iv"), Some("4º")));
    let out = toolgraph(dir.path(), &["guides", "show", "iv", "--key", "sistema_de_evaluación.ordinaria.proyecto"]);
    assert_eq!(stdout(&out).trim(), "\"60 %\"");
    let out = toolgraph(dir.path(), &["guides", "show", "fisica"]);
    assert!(!out.status.success() && stderr(&out).contains("no guide for subject 'fisica'"), "{}", stderr(&out));
}

/// `eval legal` on a small ALQAC-shaped set (two laws, four articles, a true/false and a
/// multiple-choice question), its knowledge base ingested with the ALQAC mapping, the answers
/// written by a scripted model over HTTP: recall, citation correctness and verdicts are scored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_legal_scores_retrieval_citations_and_verdicts() {
    use scripted_llm::{Reply, ScriptedModelServer};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let laws = serde_json::json!([
        {"id": "Luật Du lịch", "articles": [
            {"id": "39", "text": "Hợp đồng lữ hành\nHợp đồng lữ hành phải được lập thành văn bản."},
            {"id": "40", "text": "Quyền của khách du lịch\nKhách du lịch được lựa chọn dịch vụ du lịch."}]},
        {"id": "Luật Điện ảnh", "articles": [
            {"id": "45", "text": "Trách nhiệm quản lý nhà nước về điện ảnh\nChính phủ thống nhất quản lý nhà nước về điện ảnh."},
            {"id": "46", "text": "Phổ biến phim\nPhim được phổ biến trên không gian mạng."}]}
    ]);
    std::fs::write(d.join("law.json"), laws.to_string()).unwrap();
    std::fs::write(
        d.join("queries.jsonl"),
        "{\"_id\":\"DS-1\",\"text\":\"Hợp đồng lữ hành không cần lập thành văn bản, đúng hay sai?\",\"question_type\":\"Đúng/Sai\",\"choices\":null,\"answer\":\"Sai\"}\n\
         {\"_id\":\"TN-1\",\"text\":\"Cơ quan nào thống nhất quản lý nhà nước về điện ảnh?\",\"question_type\":\"Trắc nghiệm\",\"choices\":{\"A\":\"Quốc hội\",\"B\":\"Chính phủ\"},\"answer\":\"B\"}\n",
    )
    .unwrap();
    std::fs::create_dir(d.join("qrels")).unwrap();
    std::fs::write(
        d.join("qrels/test.tsv"),
        "query-id\tcorpus-id\tscore\nDS-1\tLuật Du lịch#39\t1\nTN-1\tLuật Điện ảnh#45\t1\n",
    )
    .unwrap();
    let mapping = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kb/alqac-mapping.toml");
    let data = d.join("data");
    let tg = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
        c.arg("--data-dir").arg(&data).args(args).env_remove("TOOLGRAPH_DATABASE_URL");
        c
    };
    let out = tg(&["ingest", "--kb", "luat", "--keyword-only", "--mapping"])
        .arg(&mapping)
        .arg(d.join("law.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Retrieval only.
    let out = tg(&["eval", "legal", "--no-model", "--json", "--top-k", "1", "--dataset"]).arg(d).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!((v["questions"].as_u64(), v["recall_at_k"].as_f64()), (Some(2), Some(1.0)), "{v}");
    assert!(v.get("citation_correctness").is_none(), "no model, no citation figure: {v}");

    // With a model: the scripted answers restate each gold article; one verdict is right.
    let server = ScriptedModelServer::start(vec![
        Reply::text("Sai. Hợp đồng lữ hành phải được lập thành văn bản."),
        Reply::text("A. Chính phủ thống nhất quản lý nhà nước về điện ảnh."),
    ])
    .await
    .unwrap();
    let mut cmd = tg(&["eval", "legal", "--json", "--dataset"]);
    cmd.arg(d).env("TOOLGRAPH_LLM_BASE_URL", server.base_url()).env("TOOLGRAPH_LLM_MODEL", "scripted");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(v["cited_share"], 1.0, "{v}");
    assert_eq!(v["citation_correctness"], 1.0, "{v}");
    assert_eq!(v["verdict_accuracy"]["Đúng/Sai"], 1.0, "{v}");
    assert_eq!(v["verdict_accuracy"]["Trắc nghiệm"], 0.0, "the scripted A is wrong: {v}");
    assert_eq!(v["outcomes"][0]["cited"], serde_json::json!(["Điều 39, Luật Du lịch"]), "{v}");
    // The model read the choices of the multiple-choice question.
    let messages = server.requests()[1]["messages"].as_array().unwrap().clone();
    let asked = messages.last().and_then(|m| m["content"].as_str()).unwrap().to_owned();
    assert!(asked.contains("A. Quốc hội\nB. Chính phủ"), "{asked}");
    assert_eq!(v["outcomes"][0]["retrieved"][0], "Điều 39, Luật Du lịch", "{v}");
    assert_eq!(v["outcomes"][0]["model_answer"], "Sai. Hợp đồng lữ hành phải được lập thành văn bản.", "{v}");

    // The same answers re-scored from the report, no model asked; one changed to a bare verdict,
    // which cites nothing.
    let mut earlier = v.clone();
    earlier["outcomes"][0]["model_answer"] = "Sai.".into();
    std::fs::write(d.join("earlier.json"), earlier.to_string()).unwrap();
    let out = tg(&["eval", "legal", "--json", "--answers"])
        .arg(d.join("earlier.json"))
        .arg("--dataset")
        .arg(d)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let again: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(server.request_count(), 2, "no model call when re-scoring");
    assert_eq!(again["outcomes"][0]["cited"], serde_json::json!([]), "{again}");
    assert_eq!(again["outcomes"][1]["cited"], v["outcomes"][1]["cited"], "{again}");
    assert_eq!(
        (again["cited_share"].as_f64(), again["citation_correctness"].as_f64()),
        (Some(0.5), Some(1.0)),
        "{again}"
    );
    assert_eq!(again["answer_articles"], 2, "the configured default: {again}");
    std::fs::write(d.join("old.json"), r#"{"outcomes": [{"id": "DS-1"}]}"#).unwrap();
    let out = tg(&["eval", "legal", "--answers"]).arg(d.join("old.json")).arg("--dataset").arg(d).output().unwrap();
    assert!(!out.status.success() && stderr(&out).contains("no model_answer"), "{}", stderr(&out));

    // A knowledge base that does not exist is named, with the command that makes it.
    let out = tg(&["eval", "legal", "--no-model", "--kb", "nope", "--dataset"]).arg(d).output().unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("knowledge base 'nope' not found") && stderr(&out).contains("toolgraph ingest"),
        "{}",
        stderr(&out)
    );
}

/// `toolgraph gc` deletes what `server.retention` no longer keeps, once, at once: an idle
/// conversation (made idle by moving its last turn back three days in the file) with its
/// messages, not a recent one; a second run finds nothing; without retention it says so.
#[tokio::test]
async fn gc_deletes_idle_conversations_once_and_says_what_it_deleted() {
    use toolgraph_conversations::{ConversationStore, Role, SqliteConversationStore};
    let dir = tempfile::tempdir().unwrap();
    let ckpt = toolgraph_graph::SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    let idle = store.create_conversation(7, 1, "tutor").await.unwrap();
    let recent = store.create_conversation(7, 1, "tutor").await.unwrap();
    store.add_message(idle, Role::User, "hace tres días").await.unwrap();
    store.add_message(recent, Role::User, "hoy").await.unwrap();
    let three_days_ago = toolgraph_conversations::now_ms() - 3 * 86_400_000;
    let moved = ckpt
        .database()
        .call(move |c| c.execute("UPDATE conversations SET last_active_ms = ?1 WHERE id = ?2", (three_days_ago, idle)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved, 1);
    ckpt.database().clone().close().await;

    let keeps_all = toolgraph(dir.path(), &["gc"]);
    assert!(keeps_all.status.success(), "{}", stderr(&keeps_all));
    assert!(stdout(&keeps_all).contains("server.retention keeps everything"), "{}", stdout(&keeps_all));

    std::fs::write(dir.path().join("toolgraph.toml"), "[server.retention]\nconversation_idle_days = 2\n").unwrap();
    let first = toolgraph(dir.path(), &["gc", "--json"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let pruned: Value = serde_json::from_str(&stdout(&first)).expect("JSON");
    assert_eq!((&pruned["ran"], &pruned["conversations"]), (&Value::Bool(true), &Value::from(1)), "{pruned}");
    assert_eq!(pruned["checkpoints"], 0, "no thread keeps fewer than all: {pruned}");
    let again = toolgraph(dir.path(), &["gc"]);
    assert!(stdout(&again).contains("deleted 0 idle conversations"), "{}", stdout(&again));

    let ckpt = toolgraph_graph::SqliteCheckpointer::open(&dir.path().join("toolgraph.db")).await.unwrap();
    let store = SqliteConversationStore::new(ckpt.database().clone()).await.unwrap();
    assert!(store.conversation(7, 1, idle).await.unwrap().is_none());
    assert!(store.messages(idle).await.unwrap().is_empty(), "its messages went with it");
    assert_eq!(store.messages(recent).await.unwrap().len(), 1, "the recent one stays");
}

/// `eval memory` over the scripted model, which answers with the notes of its prompt: a fact
/// the case remembers is in the prompt and so in the reply (right); a buried one is not among
/// the latest notes, so the reply lacks it (a miss); the report counts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_memory_puts_each_persons_facts_in_memory_and_judges_the_reply() {
    let server = scripted_llm::ScriptedModelServer::start(vec![]).await.unwrap();
    server.set_responder(|request| {
        let notes: Vec<String> = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .skip(1)
            .filter(|m| m["role"] == "system")
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect();
        scripted_llm::Reply::text(&notes.join(" "))
    });
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(
        &cases,
        "{\"lang\":\"en\",\"remembered\":[\"Her son Tom is in class 3B.\"],\"question\":\"Which class?\",\"expect\":[[\"3B\"]]}\n\
         {\"lang\":\"en\",\"remembered\":[\"His locker number is 214.\"],\"question\":\"Locker?\",\"expect\":[[\"214\"]],\"buried\":true}\n",
    )
    .unwrap();
    let config = dir.path().join("memory.toml");
    std::fs::write(&config, "[agents.assistant]\nsystem_prompt = \"You help.\"\n").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    cmd.args(["eval", "memory", "--json", "--cases"]).arg(&cases).arg("--data-dir").arg(dir.path());
    cmd.arg("--config").arg(&config);
    cmd.env("TOOLGRAPH_LLM_BASE_URL", server.base_url()).env("TOOLGRAPH_LLM_MODEL", "scripted");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!((&v["cases"], &v["right"]), (&Value::from(2), &Value::from(1)), "{v}");
    assert_eq!(v["results"][0]["right"], true, "{v}");
    assert_eq!((&v["results"][1]["right"], &v["results"][1]["buried"]), (&Value::Bool(false), &Value::Bool(true)));
    assert_eq!(v["by"]["buried"]["cases"], 1, "{v}");
    assert_eq!(v["item_search"], "keyword", "{v}");

    // Searched by meaning (the local e5 model), the notes are the facts most related to the
    // question: the buried one is among them.
    if common::model_weights("e5-small-q4.bin", "embed").is_none() {
        return;
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    cmd.args(["eval", "memory", "--json", "--item-search", "hybrid", "--cases"]).arg(&cases);
    cmd.arg("--data-dir").arg(dir.path()).arg("--config").arg(&config);
    cmd.env("TOOLGRAPH_LLM_BASE_URL", server.base_url()).env("TOOLGRAPH_LLM_MODEL", "scripted");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!((&v["item_search"], &v["right"]), (&Value::from("hybrid"), &Value::from(2)), "{v}");
}
