//! Dense and hybrid retrieval through persisted knowledge bases, with vectors from a real
//! OpenAI-compatible `/v1/embeddings` server over loopback (the scripted server's
//! bag-of-words vectors): vectors stored at ingest and never recomputed, filters applied
//! during the dense search (exact and HNSW), fusion ranks, a knowledge base refusing a model
//! it was not built with, and knowledge bases embedded with two models (a dense list each).
//! The tests of what a knowledge base keeps and finds run on both backends: the embedded index
//! and a real Qdrant server (`qdrant::…`).

use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use toolgraph_rag::embed::CombinedEmbedder;
use toolgraph_rag::{
    Analyzer, DenseOptions, EmbedError, EmbedKind, Embedder, EmbeddingSettings, Filter, IngestOptions, KbStore,
    NoProgress, OpenAiEmbedder, RagError, Retriever, SearchMode, SearchRequest, ingest, passage_text,
};
use toolgraph_rag::{SearchQuery, search_json};

#[macro_use]
mod common;

/// The scripted model server on its own runtime thread (these tests are synchronous, like
/// every caller of the blocking embedder).
struct Server {
    inner: scripted_llm::ScriptedModelServer,
    _rt: tokio::runtime::Runtime,
}

/// RRF fusion with the default k and weights.
fn rrf() -> toolgraph_rag::Fusion {
    toolgraph_rag::Fusion { method: toolgraph_rag::FusionMethod::Rrf, ..Default::default() }
}

fn server() -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let inner = rt.block_on(scripted_llm::ScriptedModelServer::start(Vec::new())).unwrap();
    Server { inner, _rt: rt }
}

fn settings(model: &str) -> EmbeddingSettings {
    EmbeddingSettings {
        model: model.into(),
        sha256: String::new(),
        dimension: scripted_llm::EMBEDDING_DIM,
        query_prefix: "query: ".into(),
        passage_prefix: "passage: ".into(),
        parts: Vec::new(),
    }
}

fn embedder(server: &Server, model: &str) -> Arc<dyn Embedder> {
    Arc::new(OpenAiEmbedder::new(&server.inner.base_url(), None, settings(model), Duration::from_secs(10)).unwrap())
}

fn write(dir: &Path, rel: &str, body: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
}

fn options(e: Option<Arc<dyn Embedder>>) -> IngestOptions {
    IngestOptions { embedder: e, ..IngestOptions::default() }
}

/// Twelve notes: four topics, each in the years 2022–2024 (`year` from front matter).
fn corpus(dir: &Path) {
    let topics = [
        ("docker", "Docker containers package applications with their dependencies into images"),
        ("exam", "The final exam takes place in January and covers every unit of the course"),
        ("ci", "Continuous integration runs the test suite on every push to the repository"),
        ("cloud", "Virtual machines in the cloud are provisioned with infrastructure as code"),
    ];
    for (name, text) in topics {
        for year in [2022, 2023, 2024] {
            write(
                dir,
                &format!("notes/{name}-{year}.md"),
                &format!("---\nyear: {year}\n---\n# {name} {year}\n\n{text}.\n"),
            );
        }
    }
}

/// Makes the store under test at a directory: embedded, or on a Qdrant server.
type StoreAt = dyn Fn(&Path) -> KbStore;

/// A scripted server, the notes corpus in a temporary folder, and an embedded store beside it.
fn setup() -> (Server, tempfile::TempDir, KbStore, [std::path::PathBuf; 1]) {
    setup_at(&|dir| KbStore::new(dir))
}

/// [`setup`] with the store `store_at` makes.
fn setup_at(store_at: &StoreAt) -> (Server, tempfile::TempDir, KbStore, [std::path::PathBuf; 1]) {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let store = store_at(&dir.path().join("kb"));
    let notes = [dir.path().join("notes")];
    (server(), dir, store, notes)
}

#[test]
fn the_openai_client_keeps_order_normalises_prefixes_and_reports_failures() {
    let s = server();
    let e = embedder(&s, "bow");
    let v = e.embed(&["docker images", "final exam", "docker"], EmbedKind::Query).unwrap();
    assert_eq!(v.len(), 3);
    for x in &v {
        assert_eq!(x.len(), scripted_llm::EMBEDDING_DIM);
        assert!((x.iter().map(|a| a * a).sum::<f32>().sqrt() - 1.0).abs() < 1e-5);
    }
    // The server answers rows in reverse order: the client must sort them by index.
    let want = scripted_llm::bag_of_words_vector("query: docker");
    let norm = want.iter().map(|a| a * a).sum::<f32>().sqrt();
    assert!(v[2].iter().zip(&want).all(|(a, b)| (a - b / norm).abs() < 1e-6));
    let body = s.inner.embedding_requests().pop().unwrap();
    assert_eq!(body["input"][0], "query: docker images");
    assert_eq!(body["model"], "bow");

    let err = e.embed(&["this will FAIL"], EmbedKind::Passage).unwrap_err().to_string();
    assert!(err.contains("500"), "{err}");
    let mut wrong = settings("bow");
    wrong.dimension = 384;
    let wrong = OpenAiEmbedder::new(&s.inner.base_url(), None, wrong, Duration::from_secs(10)).unwrap();
    let err = wrong.embed(&["x"], EmbedKind::Query).unwrap_err().to_string();
    assert!(err.contains("64 dimensions") && err.contains("384"), "{err}");
    let down = OpenAiEmbedder::new("http://127.0.0.1:9/v1", None, settings("bow"), Duration::from_secs(2)).unwrap();
    assert!(matches!(down.embed(&["x"], EmbedKind::Query).map_err(RagError::from), Err(RagError::Embedding(_))));
}

fn vectors_are_stored_at_ingest_and_search_embeds_only_the_query(store_at: &StoreAt) {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let store = store_at(&dir.path().join("kb"));
    let report =
        ingest(&store, "t", "notes", &[dir.path().join("notes")], &options(Some(embedder(&s, "bow"))), &NoProgress)
            .unwrap();
    assert_eq!((report.chunks, report.embedding_model.as_deref()), (12, Some("bow")));
    let passages: usize = s.inner.embedding_requests().iter().map(|r| r["input"].as_array().unwrap().len()).sum();
    assert_eq!(passages, 12);

    // A fresh store (another process) searches from the stored vectors.
    let store = store_at(&dir.path().join("kb"));
    let kb = store.open("t", "notes").unwrap();
    assert_eq!(kb.manifest().embedding.as_ref().unwrap().model, "bow");
    let before = s.inner.embedding_requests().len();
    // RRF, whose fused score the test recomputes from the ranks (the default is DBSF).
    let retriever = Retriever::new(Some(embedder(&s, "bow")), rrf());
    let req = SearchRequest { query: "docker images dependencies", filters: &[], top_k: 3 };
    let hits = retriever.search(&kb, &req, Some(SearchMode::Dense)).unwrap();
    let requests = s.inner.embedding_requests();
    assert_eq!(requests.len(), before + 1, "one request for the query, none for the corpus");
    assert_eq!(requests.last().unwrap()["input"], json!(["query: docker images dependencies"]));
    assert_eq!(hits.len(), 3);
    assert!(
        hits.iter().all(|h| h.chunk.doc_id.contains("docker")),
        "{:?}",
        hits.iter().map(|h| &h.chunk.doc_id).collect::<Vec<_>>()
    );
    assert!(hits.iter().all(|h| h.dense.is_some() && h.bm25.is_none()));
    assert!(hits[0].score > 0.5 && hits.windows(2).all(|w| w[0].score >= w[1].score));

    // The default for a knowledge base with vectors is hybrid, with both lists' ranks.
    let hits = retriever.search(&kb, &req, None).unwrap();
    let top = &hits[0];
    let (b, d) = (top.bm25.unwrap(), top.dense.unwrap());
    let rrf = 1.0 / (60.0 + b.rank as f32) + 1.0 / (60.0 + d.rank as f32);
    assert!((top.score - rrf).abs() < 1e-6, "{} vs {rrf}", top.score);
    // The tool's JSON carries them too.
    let params = SearchQuery { query: "final exam january", filters: vec![], top_k: Some(2), kb: None, mode: None };
    let out = search_json(&store, &retriever, "t", "notes", &params).unwrap();
    let first = &out["results"][0];
    assert!(first["metadata"]["doc_id"].as_str().unwrap().contains("exam"), "{out}");
    for list in ["bm25", "dense"] {
        let rank = first["ranks"][list]["rank"].as_u64().unwrap();
        assert!((1..=3).contains(&rank), "{list} rank {rank}: {out}");
        assert!(first["ranks"][list]["score"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn filters_apply_during_the_dense_search_with_and_without_the_graph() {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    for exact_below in [usize::MAX, 1] {
        let store = KbStore::new(dir.path().join(format!("kb{exact_below}"))).with_dense_options(DenseOptions {
            exact_below,
            exact_filter_below: 0,
            ..DenseOptions::default()
        });
        ingest(&store, "t", "notes", &[dir.path().join("notes")], &options(Some(embedder(&s, "bow"))), &NoProgress)
            .unwrap();
        let kb = store.open("t", "notes").unwrap();
        let retriever = Retriever::new(Some(embedder(&s, "bow")), Default::default());
        // The query matches the docker notes best, but only 2024 is allowed: the four 2024
        // notes come back (a filter after a top-4 cut would have kept one).
        let filters = [Filter::parse("year=2024").unwrap()];
        let req = SearchRequest { query: "docker containers images", filters: &filters, top_k: 4 };
        let hits = retriever.search(&kb, &req, Some(SearchMode::Dense)).unwrap();
        let ids: Vec<&str> = hits.iter().map(|h| h.chunk.doc_id.as_str()).collect();
        assert_eq!(hits.len(), 4, "{ids:?}");
        assert!(ids.iter().all(|id| id.ends_with("-2024.md")), "{ids:?}");
        assert!(ids[0].contains("docker"), "{ids:?}");
        let range = [Filter::parse("year<2023").unwrap()];
        let req = SearchRequest { query: "exam", filters: &range, top_k: 10 };
        let hits = retriever.search(&kb, &req, Some(SearchMode::Hybrid)).unwrap();
        assert_eq!(hits.len(), 4);
        assert!(hits.iter().all(|h| h.chunk.doc_id.ends_with("-2022.md")));
    }
}

fn mismatch<T: std::fmt::Debug>(r: Result<T, RagError>) -> String {
    match r {
        Err(RagError::Mismatch(m)) => m,
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

fn a_knowledge_base_refuses_a_model_it_was_not_built_with(store_at: &StoreAt) {
    let (s, _dir, store, notes) = setup_at(store_at);
    ingest(&store, "t", "embedded", &notes, &options(Some(embedder(&s, "bow"))), &NoProgress).unwrap();
    ingest(&store, "t", "keywords", &notes, &options(None), &NoProgress).unwrap();

    let m = mismatch(ingest(&store, "t", "embedded", &notes, &options(Some(embedder(&s, "other"))), &NoProgress));
    assert!(m.contains("bow") && m.contains("other"), "{m}");
    let m = mismatch(ingest(&store, "t", "embedded", &notes, &options(None), &NoProgress));
    assert!(m.contains("stores embeddings of bow"), "{m}");
    let m = mismatch(ingest(&store, "t", "keywords", &notes, &options(Some(embedder(&s, "bow"))), &NoProgress));
    assert!(m.contains("without embeddings"), "{m}");

    let req = SearchRequest { query: "docker", filters: &[], top_k: 3 };
    let other = Retriever::new(Some(embedder(&s, "other")), Default::default());
    let m = mismatch(other.search(&store.open("t", "embedded").unwrap(), &req, None));
    assert!(m.contains("re-ingest"), "{m}");
    let bow = Retriever::new(Some(embedder(&s, "bow")), Default::default());
    let m = mismatch(bow.search(&store.open("t", "keywords").unwrap(), &req, Some(SearchMode::Dense)));
    assert!(m.contains("no embeddings"), "{m}");
    // Keyword search of the keyword-only base still works, and is its default.
    assert_eq!(bow.search(&store.open("t", "keywords").unwrap(), &req, None).unwrap()[0].bm25.unwrap().rank, 1);
    // No model configured: a clear error, not a silent keyword fallback.
    let none = Retriever::default();
    let err = none.search(&store.open("t", "embedded").unwrap(), &req, None).unwrap_err().to_string();
    assert!(err.contains("no embedding model is configured"), "{err}");
}

fn re_ingesting_a_changed_file_replaces_its_vectors(store_at: &StoreAt) {
    let (s, dir, store, notes) = setup_at(store_at);
    let e = embedder(&s, "bow");
    ingest(&store, "t", "notes", &notes, &options(Some(e.clone())), &NoProgress).unwrap();
    write(
        dir.path(),
        "notes/docker-2024.md",
        "---\nyear: 2024\n---\n# kubernetes\n\nPods schedule replicas across nodes.\n",
    );
    let report = ingest(&store, "t", "notes", &notes, &options(Some(e.clone())), &NoProgress).unwrap();
    assert_eq!((report.indexed, report.unchanged, report.chunks), (1, 11, 1));
    let retriever = Retriever::new(Some(e), Default::default());
    let kb = store.open("t", "notes").unwrap();
    let hits = retriever
        .search(&kb, &SearchRequest { query: "pods replicas nodes", filters: &[], top_k: 1 }, Some(SearchMode::Dense))
        .unwrap();
    assert!(hits[0].chunk.text.contains("Pods") && hits[0].chunk.doc_id.ends_with("docker-2024.md"));
    assert!(hits[0].dense.unwrap().score > 0.5);
    let docker = retriever
        .search(&kb, &SearchRequest { query: "docker images", filters: &[], top_k: 12 }, Some(SearchMode::Dense))
        .unwrap();
    assert_eq!(docker.len(), 12, "one vector per chunk, the replaced one included once");
    assert!(docker.iter().all(|h| !(h.chunk.doc_id.ends_with("docker-2024.md") && h.chunk.text.contains("Docker"))));
}

#[test]
fn a_lazy_model_loads_only_when_a_search_needs_it_and_retries_a_failed_load() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (s, _dir, store, notes) = setup();
    let s = Arc::new(s);
    ingest(&store, "t", "embedded", &notes, &options(Some(embedder(&s, "bow"))), &NoProgress).unwrap();
    ingest(&store, "t", "keywords", &notes, &options(None), &NoProgress).unwrap();

    let calls = Arc::new(AtomicUsize::new(0));
    let (c, srv) = (calls.clone(), s.clone());
    let retriever = Retriever::lazy(
        Arc::new(move || {
            // The first load fails (weights not fetched yet), later ones succeed.
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(RagError::Embedding("model file not found: run scripts/fetch-models embed".into()));
            }
            Ok(embedder(&srv, "bow"))
        }),
        Default::default(),
    );
    let req = SearchRequest { query: "docker images", filters: &[], top_k: 2 };
    retriever.search(&store.open("t", "keywords").unwrap(), &req, None).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0, "keyword search never loads the model");
    let err = retriever.search(&store.open("t", "embedded").unwrap(), &req, None).unwrap_err().to_string();
    assert!(err.contains("scripts/fetch-models"), "{err}");
    let hits = retriever.search(&store.open("t", "embedded").unwrap(), &req, None).unwrap();
    assert!(hits[0].dense.is_some());
    retriever.clone().search(&store.open("t", "embedded").unwrap(), &req, None).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "loaded once after the failure, shared by clones");
}

/// A second, different model for the two-model tests: hashed character trigrams, in process.
#[derive(Debug)]
struct Trigrams(EmbeddingSettings);

impl Trigrams {
    fn new() -> Self {
        let mut s = settings("trigrams");
        s.dimension = 32;
        s.sha256 = "trigram-weights".into();
        Self(s)
    }

    fn vector(text: &str) -> Vec<f32> {
        let chars: Vec<char> = text.to_lowercase().chars().collect();
        let mut v = [0f32; 32];
        for w in chars.windows(3) {
            let h = w.iter().fold(7u32, |h, c| h.wrapping_mul(31).wrapping_add(*c as u32));
            v[(h % 32) as usize] += 1.0;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-9);
        v.iter().map(|x| x / norm).collect()
    }
}

impl Embedder for Trigrams {
    fn settings(&self) -> &EmbeddingSettings {
        &self.0
    }
    fn embed(&self, texts: &[&str], _: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| Self::vector(t)).collect())
    }
}

/// The top hit is a docker note, ranked by every list, its score their RRF.
fn assert_top_is_docker_fused_from_three_lists(top: &toolgraph_rag::Hit) {
    assert!(top.chunk.doc_id.contains("docker"), "{:?}", top.chunk.doc_id);
    let (b, d, t) = (top.bm25.unwrap(), top.dense.unwrap(), top.more_dense[0].unwrap());
    let rrf: f32 = [b.rank, d.rank, t.rank].iter().map(|&r| 1.0 / (60.0 + r as f32)).sum();
    assert!((top.score - rrf).abs() < 1e-6, "three lists fused: {} vs {rrf}", top.score);
}

fn two_models(s: &Server) -> Arc<dyn Embedder> {
    let parts: Vec<Arc<dyn Embedder>> = vec![embedder(s, "bow"), Arc::new(Trigrams::new())];
    Arc::new(CombinedEmbedder::new(parts, Some(vec![Analyzer::English])).unwrap())
}

#[test]
fn a_knowledge_base_with_two_models_keeps_a_dense_list_per_model() {
    let (s, dir, store, notes) = setup();
    let both = two_models(&s);
    ingest(&store, "t", "notes", &notes, &options(Some(both.clone())), &NoProgress).unwrap();
    let store = KbStore::new(dir.path().join("kb"));
    let kb = store.open("t", "notes").unwrap();
    let built = kb.manifest().embedding.clone().unwrap();
    assert_eq!((built.model.as_str(), built.dimension), ("bow+trigrams", scripted_llm::EMBEDDING_DIM + 32));
    assert_eq!(built.parts.iter().map(|p| p.model.as_str()).collect::<Vec<_>>(), ["bow", "trigrams"]);

    let retriever = Retriever::new(Some(both.clone()), rrf());
    let req = SearchRequest { query: "docker images dependencies", filters: &[], top_k: 5 };
    let hits = retriever.search(&kb, &req, None).unwrap();
    assert_top_is_docker_fused_from_three_lists(&hits[0]);
    // Each dense list scores with its own model's half of the stored vector.
    for h in &hits {
        let passage = passage_text(&h.chunk);
        if let Some(t) = h.more_dense[0] {
            let want: f32 =
                Trigrams::vector(&passage).iter().zip(Trigrams::vector(req.query)).map(|(a, b)| a * b).sum();
            assert!((t.score - want).abs() < 1e-5, "trigram cosine {} vs {want}", t.score);
        }
        if let Some(d) = h.dense {
            let q = embedder(&s, "bow").embed(&[req.query], EmbedKind::Query).unwrap().remove(0);
            let p = embedder(&s, "bow").embed(&[passage.as_str()], EmbedKind::Passage).unwrap().remove(0);
            let want: f32 = q.iter().zip(&p).map(|(a, b)| a * b).sum();
            assert!((d.score - want).abs() < 1e-5, "bow cosine {} vs {want}", d.score);
        }
    }
    // Filters hold in every list.
    let filters = [Filter::parse("year=2023").unwrap()];
    let filtered = SearchRequest { filters: &filters, ..req.clone() };
    let hits = retriever.search(&kb, &filtered, None).unwrap();
    assert!(!hits.is_empty() && hits.iter().all(|h| h.chunk.meta["year"] == 2023), "{hits:?}");
    assert!(hits.iter().any(|h| h.more_dense[0].is_some()));
    // Dense mode ranks by the first model alone.
    let dense = retriever.search(&kb, &req, Some(SearchMode::Dense)).unwrap();
    assert!(dense.iter().all(|h| h.more_dense.is_empty() && h.dense.is_some()));
    // The tool's JSON names the second list `dense_2`.
    let params = SearchQuery { query: "docker images", filters: vec![], top_k: Some(2), kb: None, mode: None };
    let out = search_json(&store, &retriever, "t", "notes", &params).unwrap();
    assert!(out["results"][0]["ranks"]["dense_2"]["rank"].as_u64().is_some(), "{out}");

    // Configured with the first model alone, the two-model knowledge base is refused by name.
    let one = Retriever::new(Some(embedder(&s, "bow")), Default::default());
    let err = mismatch(one.search(&kb, &req, None));
    assert!(err.contains("bow+trigrams"), "{err}");
    // A kb.json whose models do not add up to its dimension is refused at open, not sliced.
    let path = dir.path().join("kb/t/notes/kb.json");
    let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["embedding"]["parts"][1]["dimension"] = json!(40);
    std::fs::write(&path, manifest.to_string()).unwrap();
    let err = KbStore::new(dir.path().join("kb")).open("t", "notes").unwrap_err().to_string();
    assert!(err.contains("add up to 104") && err.contains("kb.json"), "{err}");
}

fn the_second_model_is_used_only_for_its_languages_and_never_forced_on_an_existing_base(store_at: &StoreAt) {
    let (s, dir, store, notes) = setup_at(store_at);
    let both = two_models(&s);
    // A Spanish knowledge base gets the first model alone (the second is meant for English).
    let spanish = IngestOptions { analyzer: Some(Analyzer::Spanish), ..options(Some(both.clone())) };
    ingest(&store, "t", "es", &notes, &spanish, &NoProgress).unwrap();
    assert_eq!(store.open("t", "es").unwrap().manifest().embedding.as_ref().unwrap().model, "bow");
    // An English one built earlier with the first model alone stays so when the second is added.
    ingest(&store, "t", "en", &notes, &options(Some(embedder(&s, "bow"))), &NoProgress).unwrap();
    write(dir.path(), "notes/extra.md", "# Extra\n\nKubernetes schedules docker containers.\n");
    let report = ingest(&store, "t", "en", &notes, &options(Some(both.clone())), &NoProgress).unwrap();
    assert_eq!((report.indexed, report.embedding_model.as_deref()), (1, Some("bow")));
    // Both are searched with the configured pair, each with the models it holds.
    let retriever = Retriever::new(Some(both), Default::default());
    for kb in ["es", "en"] {
        let kb = store.open("t", kb).unwrap();
        let req = SearchRequest { query: "docker containers", filters: &[], top_k: 3 };
        let hits = retriever.search(&kb, &req, None).unwrap();
        assert!(hits[0].chunk.doc_id.contains("docker") || hits[0].chunk.doc_id.contains("extra"));
        assert!(hits.iter().all(|h| h.more_dense.is_empty()));
    }
}

/// Two models and dense filters on Qdrant: a dense list per model (each its own named
/// vector), filters inside every list, hybrid ranks fused as the embedded index fuses them.
fn two_models_and_filters(store_at: &StoreAt) {
    let (s, _dir, store, notes) = setup_at(store_at);
    let both = two_models(&s);
    ingest(&store, "t", "notes", &notes, &options(Some(both.clone())), &NoProgress).unwrap();
    let kb = store.open("t", "notes").unwrap();
    let retriever = Retriever::new(Some(both), rrf());
    let req = SearchRequest { query: "docker images dependencies", filters: &[], top_k: 5 };
    let hits = retriever.search(&kb, &req, None).unwrap();
    assert_top_is_docker_fused_from_three_lists(&hits[0]);
    for h in &hits {
        if let Some(t) = h.more_dense[0] {
            let passage = passage_text(&h.chunk);
            let want: f32 =
                Trigrams::vector(&passage).iter().zip(Trigrams::vector(req.query)).map(|(a, b)| a * b).sum();
            assert!((t.score - want).abs() < 1e-4, "trigram cosine {} vs {want}", t.score);
        }
    }
    let filters = [Filter::parse("year=2024").unwrap()];
    let dense = SearchRequest { query: "docker containers images", filters: &filters, top_k: 4 };
    let hits = retriever.search(&kb, &dense, Some(SearchMode::Dense)).unwrap();
    let ids: Vec<&str> = hits.iter().map(|h| h.chunk.doc_id.as_str()).collect();
    assert_eq!(hits.len(), 4, "{ids:?}");
    assert!(ids.iter().all(|id| id.ends_with("-2024.md")) && ids[0].contains("docker"), "{ids:?}");
    let range = [Filter::parse("year<2023").unwrap()];
    let hybrid = retriever.search(&kb, &SearchRequest { query: "exam", filters: &range, top_k: 10 }, None).unwrap();
    assert_eq!(hybrid.len(), 4);
    assert!(hybrid.iter().all(|h| h.chunk.doc_id.ends_with("-2022.md")));
}

on_both_backends!(
    vectors_are_stored_at_ingest_and_search_embeds_only_the_query,
    a_knowledge_base_refuses_a_model_it_was_not_built_with,
    re_ingesting_a_changed_file_replaces_its_vectors,
    the_second_model_is_used_only_for_its_languages_and_never_forced_on_an_existing_base,
    two_models_and_filters,
);
