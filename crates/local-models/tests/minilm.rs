//! The all-MiniLM-L6-v2 embedder with the real weights: token ids against the Hugging Face
//! tokenizers library, embeddings against an independent numpy implementation
//! (`testdata/minilm/make_reference.py`), the 256-token cut, ordering, and the missing-file
//! error.
//!
//! The weights come from `scripts/fetch-models minilm` (the test script runs it). Without them
//! these tests fail under `CI=true` and print why they skip otherwise.

mod common;

use serde::Deserialize;
use std::sync::OnceLock;
use toolgraph_embed::{EmbedKind, Embedder};
use toolgraph_local_models::minilm::{MINILM_FILE, MINILM_MODEL_ID, MINILM_SHA256, MiniLmEmbedder};
use toolgraph_local_models::{LocalModelError, models_dir};

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn reference() -> Reference {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/minilm/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("testdata/minilm/reference.json is committed"))
        .expect("reference parses")
}

/// The embedder, loaded once per test binary; `None` (with a message) only outside CI.
fn embedder() -> Option<&'static MiniLmEmbedder> {
    static CELL: OnceLock<Option<MiniLmEmbedder>> = OnceLock::new();
    CELL.get_or_init(|| common::weights_or_skip("the MiniLM weights", MiniLmEmbedder::load_default())).as_ref()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn token_ids_match_the_reference_tokenizer_and_stop_at_256() {
    let Some(e) = embedder() else { return };
    let reference = reference();
    for case in &reference.cases {
        assert_eq!(e.token_ids(&case.text).unwrap(), case.ids, "{}: {:?}", case.name, case.text);
    }
    let long = reference.cases.iter().find(|c| c.name == "long").unwrap();
    assert_eq!(long.ids.len(), 256, "the reference's long text is cut");
    assert_eq!(long.ids.last(), Some(&102), "a cut text still ends with [SEP]");
}

#[test]
fn embeddings_match_the_reference_implementation() {
    let Some(e) = embedder() else { return };
    let reference = reference();
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    // One batch of mixed lengths (padding and masks), queries and passages alike.
    let got = e.embed(&texts, EmbedKind::Passage).unwrap();
    for (case, v) in reference.cases.iter().zip(&got) {
        assert_eq!(v.len(), 384);
        assert!((dot(v, v) - 1.0).abs() < 1e-4, "{}: not unit length", case.name);
        let cos = dot(v, &case.embedding);
        assert!(cos > 0.9999, "{}: cosine {cos} to the reference", case.name);
    }
    // One at a time gives the same vectors as the batch.
    let alone = e.embed(&[texts[0]], EmbedKind::Query).unwrap();
    assert!(dot(&alone[0], &got[0]) > 0.99999);
    assert_eq!(e.settings().model, MINILM_MODEL_ID);
    assert_eq!(e.settings().sha256, MINILM_SHA256);
}

#[test]
fn a_paraphrase_ranks_above_a_related_passage_above_an_unrelated_text() {
    let Some(e) = embedder() else { return };
    let v = e
        .embed(
            &[
                "What is the capital of France?",
                "Which city is France's capital?",
                "Paris is the capital and most populous city of France, on the Seine.",
                "Mitochondria produce most of the cell's chemical energy.",
            ],
            EmbedKind::Query,
        )
        .unwrap();
    let (para, passage, unrelated) = (dot(&v[0], &v[1]), dot(&v[0], &v[2]), dot(&v[0], &v[3]));
    assert!(para > passage && passage > unrelated + 0.3, "{para} {passage} {unrelated}");
}

#[test]
fn a_missing_file_names_the_fetch_command() {
    let err = MiniLmEmbedder::load(&models_dir().join("no-such-dir").join(MINILM_FILE)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LocalModelError::Missing { .. }), "{msg}");
    assert!(msg.contains("scripts/fetch-models minilm") && msg.contains("rag.second_embedding"), "{msg}");
}

#[test]
fn a_file_that_is_not_the_archive_is_a_format_error() {
    let dir = std::env::temp_dir().join(format!("tg-minilm-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(MINILM_FILE);
    std::fs::write(&path, b"PK\x03\x04 not really a zip").unwrap();
    let err = MiniLmEmbedder::load(&path).unwrap_err();
    assert!(matches!(err, LocalModelError::Format(_)), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
