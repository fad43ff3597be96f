//! The course tutor's retrieval contract (`POST /search`, `rag_search`) over a real knowledge
//! base on disk: its shape, its filters, and a clear failure for each bad request.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use toolgraph_agents::course::CourseSearch;
use toolgraph_rag::{IngestOptions, KbStore, NoProgress, Retriever, SearchFailure, ingest};

fn write(dir: &Path, rel: &str, body: &str) -> PathBuf {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

/// The search of a `POST /search` body.
fn search_json(
    store: &KbStore,
    retriever: &Retriever,
    tenant: &str,
    default_kb: &str,
    request: &CourseSearch,
) -> Result<Value, (SearchFailure, String)> {
    request.run(store, retriever, tenant, default_kb)
}

#[test]
fn search_contract_shapes_and_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(tmp.path(), "g/guia.md", "# Evaluación\nEl examen final es en enero.");
    let store = KbStore::new(tmp.path().join("kb"));
    let opts = IngestOptions {
        meta: serde_json::from_value(json!({"asignatura": "iv", "tipo_documento": "guia"})).unwrap(),
        ..IngestOptions::default()
    };
    ingest(&store, "ugr", "cursos", &[f], &opts, &NoProgress).unwrap();
    let params = |v: Value| -> CourseSearch { serde_json::from_value(v).unwrap() };
    let ok = search_json(
        &store,
        &Retriever::default(),
        "ugr",
        "cursos",
        &params(json!({"query": "examen final", "asignatura": "iv", "top_k": 3})),
    )
    .unwrap();
    assert_eq!(ok["ok"], true);
    assert_eq!(ok["query"], "examen final");
    assert_eq!(ok["total_results"], 1);
    let r = &ok["results"][0];
    assert!(r["content"].as_str().unwrap().contains("enero"));
    assert!(r["score"].as_f64().unwrap() > 0.0);
    assert_eq!(r["metadata"]["citation"], "Evaluación", "the first H1 titles the document");
    assert_eq!(r["metadata"]["tipo_documento"], "guia");
    // The tutor's own metadata: the document's file name and its subject.
    assert_eq!((&r["metadata"]["source"], &r["metadata"]["asignatura"]), (&json!("guia.md"), &json!("iv")));
    let none = search_json(
        &store,
        &Retriever::default(),
        "ugr",
        "cursos",
        &params(json!({"query": "examen", "asignatura": "dai"})),
    )
    .unwrap();
    assert_eq!(none["total_results"], 0);
    let cases = [
        (json!({"query": "  "}), SearchFailure::Invalid, "query must not be empty"),
        (json!({"query": "x", "top_k": 0}), SearchFailure::Invalid, "top_k"),
        (json!({"query": "x", "kb": "nope"}), SearchFailure::NotFound, "no knowledge base `nope`"),
        (json!({"query": "x", "kb": "../../etc"}), SearchFailure::Invalid, "knowledge base `../../etc`"),
        (json!({"query": "x", "filters": {"year": {"near": 3}}}), SearchFailure::Invalid, "unknown bound"),
        (json!({"query": "?!"}), SearchFailure::Invalid, "no searchable words"),
    ];
    for (body, kind, msg) in cases {
        let (k, m) = search_json(&store, &Retriever::default(), "ugr", "cursos", &params(body.clone())).unwrap_err();
        assert_eq!(k, kind, "{body}");
        assert!(m.contains(msg), "{body}: {m}");
    }
    assert_eq!(
        search_json(&store, &Retriever::default(), "other", "cursos", &params(json!({"query": "examen"})))
            .unwrap_err()
            .0,
        SearchFailure::NotFound
    );
}
