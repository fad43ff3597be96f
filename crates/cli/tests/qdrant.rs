//! Knowledge bases on a Qdrant server (`[rag] backend = "qdrant"`, docs/retrieval.md): ingested
//! once from the command line, searched by two `toolgraph serve` replicas that share nothing
//! but the Qdrant server (each its own data directory), re-ingested while they serve — every
//! replica sees the same chunks, citations and ranks. A real Qdrant server (the official
//! v1.18.3 source built) and the scripted server's embeddings over loopback.

mod common;
use common::{free_port, serve_command, wait_ready};

use scripted_llm::ScriptedModelServer;
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use toolgraph_testkit::qdrant::QdrantServer;

/// The environment of every process: Qdrant as the backend, embeddings from the scripted
/// server, the `demo` tenant on the command line.
fn env(cmd: &mut Command, qdrant: &QdrantServer, model: &ScriptedModelServer) {
    cmd.env("TOOLGRAPH_RAG_BACKEND", "qdrant")
        .env("TOOLGRAPH_QDRANT_URL", &qdrant.url)
        .env("TOOLGRAPH_RAG_EMBEDDING", "openai")
        .env("TOOLGRAPH_RAG_EMBEDDING_BASE_URL", model.base_url())
        .env("TOOLGRAPH_RAG_EMBEDDING_MODEL", "bow")
        .env("TOOLGRAPH_RAG_EMBEDDING_DIMENSION", scripted_llm::EMBEDDING_DIM.to_string())
        .env("TOOLGRAPH_RAG_TENANT", "demo");
}

/// `toolgraph ARGS --json` in `dir` against Qdrant: its standard output as JSON.
fn toolgraph(dir: &std::path::Path, args: &[&str], qdrant: &QdrantServer, model: &ScriptedModelServer) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    cmd.args(args).arg("--data-dir").arg(dir).stdin(Stdio::null());
    env(&mut cmd, qdrant, model);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn ingest(dir: &std::path::Path, src: &std::path::Path, qdrant: &QdrantServer, model: &ScriptedModelServer) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolgraph"));
    cmd.args(["ingest"]).arg(src).args(["--kb", "guias", "--json", "--data-dir"]).arg(dir).stdin(Stdio::null());
    env(&mut cmd, qdrant, model);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

struct Replica {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn replica(qdrant: &QdrantServer, model: &ScriptedModelServer) -> Replica {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = serve_command(dir.path(), model, port);
    env(&mut cmd, qdrant, model);
    let child = cmd.stderr(Stdio::null()).spawn().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    Replica { child, base, _dir: dir }
}

async fn search(base: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/search"))
        .header("X-Tenant-Slug", "demo")
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// What a result shows, without its scores (the same on every replica).
fn shown(v: &Value) -> Vec<(String, String, String)> {
    v["results"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|r| {
                    let m = &r["metadata"];
                    let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
                    (s("doc_id"), s("citation"), r["content"].as_str().unwrap_or_default().to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_searches_the_one_knowledge_base_on_qdrant() {
    let Some(qdrant) = QdrantServer::start() else { return };
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let src = tempfile::tempdir().unwrap();
    let guides = src.path().join("iv");
    std::fs::create_dir_all(&guides).unwrap();
    std::fs::write(
        guides.join("guia.md"),
        "# Infraestructura Virtual\n## Evaluación\nEl examen final es en enero y vale el 40% de la nota.\n\
         ## Prácticas\nLas prácticas usan Docker y Vagrant.\n",
    )
    .unwrap();
    std::fs::write(
        guides.join("tema1.md"),
        "---\ntema: 1\n---\n# Tema 1\nKubernetes orquesta contenedores en un clúster.\n",
    )
    .unwrap();
    let ingest_dir = tempfile::tempdir().unwrap();
    let report = ingest(ingest_dir.path(), &guides, &qdrant, &model);
    assert_eq!((report["indexed"].as_u64(), report["total_chunks"].as_u64()), (Some(2), Some(3)), "{report}");
    assert!(!ingest_dir.path().join("kb/demo/guias").exists(), "nothing is kept under the data directory");

    let (a, b) = (replica(&qdrant, &model).await, replica(&qdrant, &model).await);
    let ask = json!({"query": "¿cuándo es el examen final?", "kb": "guias", "top_k": 3});
    let (status, on_a) = search(&a.base, ask.clone()).await;
    assert_eq!(status, 200, "{on_a}");
    let (_, on_b) = search(&b.base, ask.clone()).await;
    assert_eq!(shown(&on_a), shown(&on_b), "both replicas find the same chunks");
    let top = &on_a["results"][0];
    assert_eq!(top["metadata"]["citation"], "Infraestructura Virtual › Evaluación", "{on_a}");
    assert!(
        top["ranks"]["bm25"]["rank"].as_u64().is_some() && top["ranks"]["dense"]["rank"].as_u64().is_some(),
        "{top}"
    );
    // A filter is applied inside Qdrant; another tenant finds no knowledge base.
    let (_, filtered) = search(&b.base, json!({"query": "contenedores", "kb": "guias", "filters": {"tema": 1}})).await;
    assert!(
        shown(&filtered).iter().all(|(doc, _, _)| doc == "iv/tema1.md") && !shown(&filtered).is_empty(),
        "{filtered}"
    );
    let other = reqwest::Client::new()
        .post(format!("{}/search", a.base))
        .header("X-Tenant-Slug", "north")
        .json(&ask)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404, "another tenant's knowledge base is not found");

    // Re-ingested from anywhere while they serve: both see the change at once.
    std::fs::write(guides.join("tema1.md"), "# Tema 1\nPodman ejecuta contenedores sin demonio.\n").unwrap();
    let report = ingest(tempfile::tempdir().unwrap().path(), &guides, &qdrant, &model);
    assert_eq!((report["indexed"].as_u64(), report["unchanged"].as_u64()), (Some(1), Some(1)), "{report}");
    for r in [&a, &b] {
        let (_, v) = search(&r.base, json!({"query": "podman demonio", "kb": "guias", "mode": "bm25"})).await;
        assert_eq!(v["results"][0]["metadata"]["doc_id"], "iv/tema1.md", "{v}");
        let (_, old) = search(&r.base, json!({"query": "kubernetes", "kb": "guias", "mode": "bm25"})).await;
        assert_eq!(old["total_results"], 0, "the replaced chunk is gone: {old}");
    }

    // Listed and deleted from any machine.
    let elsewhere = tempfile::tempdir().unwrap();
    let listed = toolgraph(elsewhere.path(), &["kb", "list", "--json"], &qdrant, &model);
    assert_eq!(listed[0]["name"], "guias", "{listed}");
    assert_eq!((listed[0]["documents"].as_u64(), listed[0]["chunks"].as_u64()), (Some(2), Some(3)), "{listed}");
    assert_eq!((listed[0]["backend"].as_str(), listed[0]["embedding"].as_str()), (Some("qdrant"), Some("bow")));
    toolgraph(elsewhere.path(), &["kb", "delete", "guias"], &qdrant, &model);
    assert_eq!(toolgraph(elsewhere.path(), &["kb", "list", "--json"], &qdrant, &model), json!([]));
    let (status, _) = search(&a.base, ask.clone()).await;
    assert_eq!(status, 404, "a deleted knowledge base is gone for every replica");

    // Qdrant down: an error answer (the cause stays in the service's log), not a hang or an
    // empty result list.
    drop(qdrant);
    let (status, down) = search(&b.base, ask).await;
    assert_eq!((status, down["ok"].as_bool()), (500, Some(false)), "{down}");
    assert!(down["error"].as_str().is_some_and(|e| !e.is_empty()), "{down}");
}
