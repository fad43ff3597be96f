//! The e5 embedder with the real weights: token ids against the package's own C tokenizer,
//! embeddings against the package's engine, cross-lingual ordering, and the missing-file error.
//!
//! The weights come from `scripts/fetch-models embed` (the test script runs it). Without them
//! these tests fail under `CI=true` and print why they skip otherwise.

mod common;

use serde::Deserialize;
use std::sync::OnceLock;
use toolgraph_embed::EmbedKind;
use toolgraph_local_models::e5::{E5_FILE, E5Embedder};
use toolgraph_local_models::models_dir;

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    lang: String,
    text: String,
    prefix: String,
    ids: Vec<u32>,
    pieces: Vec<String>,
    embedding: Option<Vec<f32>>,
    windows: Option<Vec<[usize; 2]>>,
}

fn reference() -> Reference {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/e5/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("testdata/e5/reference.json is committed"))
        .expect("reference parses")
}

/// The embedder, loaded once per test binary; `None` (with a message) only outside CI.
fn embedder() -> Option<&'static E5Embedder> {
    static CELL: OnceLock<Option<E5Embedder>> = OnceLock::new();
    CELL.get_or_init(|| common::weights_or_skip("the e5 weights", E5Embedder::load_default())).as_ref()
}

fn kind(prefix: &str) -> EmbedKind {
    if prefix.starts_with("query") { EmbedKind::Query } else { EmbedKind::Passage }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let d: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    d / (na * nb)
}

#[test]
fn token_ids_match_the_package_tokenizer_in_every_language_and_edge_case() {
    let Some(e5) = embedder() else { return };
    let reference = reference();
    let mut failures = Vec::new();
    for case in &reference.cases {
        let kind = kind(&case.prefix);
        let ids = e5.token_ids(&case.text, kind).unwrap();
        if ids != case.ids {
            failures.push(format!(
                "{} {:?} {:?}: got {} ids, want {} ({:?}…)",
                case.lang,
                case.prefix,
                case.text.chars().take(40).collect::<String>(),
                ids.len(),
                case.ids.len(),
                &case.pieces[..case.pieces.len().min(12)]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        reference.cases.len(),
        failures.join("\n")
    );
    assert!(reference.cases.iter().any(|c| c.lang == "ko") && reference.cases.iter().any(|c| c.lang == "vi"));
}

#[test]
fn embeddings_match_the_package_engine_including_a_two_window_text() {
    let Some(e5) = embedder() else { return };
    let reference = reference();
    let cases: Vec<&Case> = reference.cases.iter().filter(|c| c.embedding.is_some()).collect();
    assert!(cases.len() >= 5, "reference has embeddings for 4 languages and the long text");
    assert!(cases.iter().any(|c| c.windows.as_ref().is_some_and(|w| w.len() == 2)));
    for case in cases {
        let want = case.embedding.as_ref().unwrap();
        let got = e5.embed_texts(&[&case.text], kind(&case.prefix)).unwrap().remove(0);
        assert_eq!(got.len(), 384);
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit vector, got norm {norm}");
        let cos = cosine(&got, want);
        assert!(cos >= 0.999, "{} {:?}: cosine {cos} with the package's embedding", case.lang, case.text);
    }
}

#[test]
fn batching_does_not_change_vectors() {
    let Some(e5) = embedder() else { return };
    let texts = ["corto", "Un texto algo más largo sobre contenedores y máquinas virtuales en la nube.", "중간 길이"];
    let together = e5.embed_texts(&texts, EmbedKind::Passage).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let alone = e5.embed_texts(&[t], EmbedKind::Passage).unwrap().remove(0);
        assert!(cosine(&alone, &together[i]) > 0.9999, "padding changed text {i}");
    }
}

#[test]
fn same_meaning_across_languages_is_closer_than_different_meaning() {
    let Some(e5) = embedder() else { return };
    // Two meanings, each in en/es/ko/vi.
    let texts = [
        "The final exam of the course is on the 20th of January.",
        "El examen final de la asignatura es el 20 de enero.",
        "이 과목의 기말 시험은 1월 20일입니다.",
        "Kỳ thi cuối kỳ của môn học diễn ra vào ngày 20 tháng 1.",
        "Docker packages applications into lightweight containers.",
        "Docker empaqueta aplicaciones en contenedores ligeros.",
        "도커는 애플리케이션을 가벼운 컨테이너로 패키징합니다.",
        "Docker đóng gói ứng dụng vào các container nhẹ.",
    ];
    let v = e5.embed_texts(&texts, EmbedKind::Passage).unwrap();
    for i in 0..8 {
        let same_min = (0..8).filter(|&j| j != i && j / 4 == i / 4).map(|j| cosine(&v[i], &v[j])).fold(1.0, f32::min);
        let diff_max = (0..8).filter(|&j| j / 4 != i / 4).map(|j| cosine(&v[i], &v[j])).fold(-1.0, f32::max);
        assert!(same_min > diff_max, "text {i}: least similar paraphrase {same_min} vs closest other {diff_max}");
    }
    // A Spanish question finds the Korean and Vietnamese exam sentences before the Docker ones.
    let q = e5.embed_texts(&["¿Cuándo es el examen final?"], EmbedKind::Query).unwrap().remove(0);
    let mut ranked: Vec<usize> = (0..8).collect();
    ranked.sort_by(|&a, &b| cosine(&q, &v[b]).total_cmp(&cosine(&q, &v[a])));
    assert!(ranked[..4].iter().all(|&i| i < 4), "exam sentences first, got {ranked:?}");
}

#[test]
fn a_missing_weights_file_names_the_fetch_script() {
    let err = E5Embedder::load(&models_dir().join("no-such-dir").join(E5_FILE)).unwrap_err().to_string();
    assert!(err.contains("scripts/fetch-models embed") && err.contains("not found"), "{err}");
}
