//! Ingestion into persisted knowledge bases: every format, the ALQAC mapping, sub-chunks,
//! filters, tenant isolation, incremental re-ingest, malformed files, and crash safety. The
//! tests of what a knowledge base keeps and finds run on both backends: the embedded index and
//! a real Qdrant server (`qdrant::…`).

#[macro_use]
mod common;

use common::eval_data;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use toolgraph_rag::{
    Analyzer, Filter, IngestOptions, KbStore, NoProgress, PathPattern, RagError, RecordMapping, SearchRequest, ingest,
};

fn write(dir: &Path, rel: &str, body: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, body).unwrap();
    path
}

/// On Qdrant, an ingest that failed part-way (its points left incomplete) is done again by
/// the next one, which leaves one copy of each chunk; and records of the same id in two files
/// are two chunks, as in the embedded index.
#[test]
fn qdrant_redoes_an_ingest_that_failed_part_way_and_keeps_same_id_records_apart() {
    let Some(server) = common::QdrantServer::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    write(&dir, "a.md", "# Docker\nDocker usa imágenes.");
    write(&dir, "b.md", "# Vagrant\nVagrant usa cajas.");
    write(&dir, "r1.json", r#"[{"id": "1", "text": "Ansible configura servidores."}]"#);
    write(&dir, "r2.json", r#"[{"id": "1", "text": "Terraform describe infraestructura."}]"#);
    let store = KbStore::new(tmp.path().join("kb")).with_qdrant(server.options());
    let run = || ingest(&store, "t", "k", std::slice::from_ref(&dir), &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!(run().total_chunks, 4);
    assert_eq!(search(&store, "t", "k", "ansible", &[]).len(), 1);
    assert_eq!(search(&store, "t", "k", "terraform", &[]).len(), 1, "both records with id 1 are kept");
    // As an ingest that died before marking its points complete leaves them.
    let collection = server.options().collection("t", "k");
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/collections/{collection}/points/payload?wait=true", server.url))
        .json(
            &json!({"payload": {"complete": false}, "filter": {"must": [{"key": "tenant", "match": {"value": "t"}}]}}),
        )
        .send()
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().unwrap());
    let again = run();
    assert_eq!((again.indexed, again.unchanged, again.total_chunks), (4, 0, 4), "every source done again, once");
    let unchanged = run();
    assert_eq!((unchanged.indexed, unchanged.unchanged), (0, 4), "and then complete");
    assert_eq!(search(&store, "t", "k", "docker imágenes", &[]).len(), 1, "one copy of each chunk");
}

/// A collection made before keyword search moved to one sparse vector (two, `title` and
/// `text`) is still searched with both fields' scores summed and still re-ingested in its
/// own layout.
#[test]
fn qdrant_serves_and_updates_a_collection_with_a_sparse_vector_per_field() {
    let Some(server) = common::QdrantServer::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    write(&dir, "a.md", "# Docker\nDocker usa imágenes.");
    write(&dir, "b.md", "# Vagrant\nVagrant usa Docker, y Docker usa cajas.");
    // A store per process, as each would open the collection (a store keeps it open 10 s).
    let store = || KbStore::new(tmp.path().join("kb")).with_qdrant(server.options());
    let run = |store: &KbStore| {
        ingest(store, "t", "old", std::slice::from_ref(&dir), &IngestOptions::default(), &NoProgress).unwrap()
    };
    run(&store());
    // The same collection as an earlier toolgraph made it: its metadata, two sparse vectors.
    let http = reqwest::blocking::Client::new();
    let url = format!("{}/collections/{}", server.url, server.options().collection("t", "old"));
    let info: Value = http.get(&url).send().unwrap().json().unwrap();
    assert!(info["result"]["config"]["params"]["sparse_vectors"].get("keywords").is_some(), "{info}");
    let metadata = info["result"]["config"]["metadata"].clone();
    assert!(http.delete(&url).send().unwrap().status().is_success());
    let body = json!({
        "sparse_vectors": { "title": { "modifier": "idf" }, "text": { "modifier": "idf" } },
        "metadata": metadata,
    });
    let made = http.put(&url).json(&body).send().unwrap();
    assert!(made.status().is_success(), "{}", made.text().unwrap());
    let store = store();
    let report = run(&store);
    assert_eq!((report.indexed, report.total_chunks), (2, 2), "its points are written again");
    let info: Value = http.get(&url).send().unwrap().json().unwrap();
    let sparse = &info["result"]["config"]["params"]["sparse_vectors"];
    assert!(sparse.get("title").is_some() && sparse.get("keywords").is_none(), "layout kept: {sparse}");
    // "docker" is in a's title and text, only in b's text: a's two scores add up.
    let hits = search(&store, "t", "old", "docker", &[]);
    assert_eq!(hits.len(), 2);
    assert!(hits[0].chunk.title.contains("Docker") && hits[0].score > hits[1].score, "{hits:?}");
    assert_eq!(search(&store, "t", "old", "vagrant", &[]).len(), 1, "a title term");
    // A changed source replaces its points in the same layout.
    write(&dir, "b.md", "# Vagrant\nVagrant usa cajas.");
    assert_eq!(run(&store).indexed, 1);
    assert_eq!(search(&store, "t", "old", "docker", &[]).len(), 1);
}

/// Makes the store under test at a directory: embedded, or on a Qdrant server.
type StoreAt = dyn Fn(&Path) -> KbStore;

fn search(store: &KbStore, tenant: &str, kb: &str, q: &str, filters: &[Filter]) -> Vec<toolgraph_rag::Hit> {
    store.open(tenant, kb).unwrap().search(&SearchRequest { query: q, filters, top_k: 10 }).unwrap()
}

/// A two-page PDF with real text objects (Helvetica, WinAnsi), built with lopdf.
fn pdf(pages: &[&str]) -> Vec<u8> {
    use lopdf::content::{Content, Operation};
    use lopdf::{Document, Object, Stream, dictionary};
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {"Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica", "Encoding" => "WinAnsiEncoding"});
    let resources_id = doc.add_object(dictionary! {"Font" => dictionary! {"F1" => font_id}});
    let mut kids = Vec::new();
    for text in pages {
        let content = Content {
            operations: vec![
                Operation::new("BT", vec![]),
                Operation::new("Tf", vec!["F1".into(), 14.into()]),
                Operation::new("Td", vec![72.into(), 700.into()]),
                Operation::new("Tj", vec![Object::string_literal(*text)]),
                Operation::new("ET", vec![]),
            ],
        };
        let content_id = doc.add_object(Stream::new(dictionary! {}, content.encode().unwrap()));
        let page_id = doc.add_object(dictionary! {"Type" => "Page", "Parent" => pages_id, "Contents" => content_id});
        kids.push(page_id.into());
    }
    let count = kids.len() as i64;
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => kids, "Count" => count, "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = doc.add_object(dictionary! {"Type" => "Catalog", "Pages" => pages_id});
    doc.trailer.set("Root", catalog_id);
    let mut out = Vec::new();
    doc.save_to(&mut out).unwrap();
    out
}

fn every_format_ingests_and_a_malformed_file_is_skipped_with_its_reason(store_at: &StoreAt) {
    let tmp = tempfile::tempdir().unwrap();
    let docs = tmp.path().join("iv");
    write(
        &docs,
        "guia/guia.md",
        "---\ntitle: Guía docente de Infraestructura Virtual\nsemestre: 1\n---\n# Evaluación\n## Examen final\nEl examen final de la asignatura se celebra en enero y vale el 40% de la nota.\n",
    );
    write(&docs, "apuntes/tema1.txt", "Docker empaqueta aplicaciones en contenedores ligeros.\n");
    write(
        &docs,
        "apuntes/tema2.html",
        "<html><head><title>Tema 2</title></head><body><h1>Orquestación</h1><p>Kubernetes orquesta contenedores en un clúster.</p></body></html>",
    );
    write(
        &docs,
        "apuntes/slides.pdf",
        pdf(&["Virtual machines emulate whole computers", "Hypervisors schedule virtual CPUs"]),
    );
    write(
        &docs,
        "records/faq.json",
        r#"[{"id": "faq-1", "title": "Tutorías", "text": "Las tutorías son los martes.", "metadata": {"curso": 2025}}]"#,
    );
    write(
        &docs,
        "records/more.jsonl",
        "{\"_id\": \"m1\", \"text\": \"Vagrant crea máquinas virtuales reproducibles.\", \"year\": 2024}\n\n{\"_id\": \"m2\", \"text\": \"Ansible configura servidores.\", \"year\": 2020}\n",
    );
    write(&docs, "records/broken.json", "[{\"id\": \"x\", ");
    write(&docs, "apuntes/notes.docx", "PK binary");

    let store = store_at(&tmp.path().join("kb"));
    let options = IngestOptions {
        path_patterns: vec![PathPattern::parse("{tipo_documento}/**").unwrap()],
        meta: serde_json::from_value(json!({"asignatura": "iv"})).unwrap(),
        analyzer: Some(Analyzer::Spanish),
        ..IngestOptions::default()
    };
    let report = ingest(&store, "ugr", "iv", std::slice::from_ref(&docs), &options, &NoProgress).unwrap();
    assert_eq!(report.files, 8);
    assert_eq!(report.indexed, 6, "{report:#?}");
    assert_eq!(report.skipped.len(), 2);
    let reasons: Vec<&str> = report.skipped.iter().map(|s| s.reason.as_str()).collect();
    assert!(reasons.iter().any(|r| r.contains("invalid JSON")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("unsupported format `.docx`")), "{reasons:?}");
    assert_eq!(report.documents, 7, "md, txt, html, pdf, 1 json record, 2 jsonl records");

    let hit = &search(&store, "ugr", "iv", "¿Cuándo es el examen final?", &[])[0];
    assert_eq!(hit.chunk.doc_id, "iv/guia/guia.md");
    assert_eq!(hit.chunk.title, "Guía docente de Infraestructura Virtual");
    assert_eq!(hit.chunk.citation, "Guía docente de Infraestructura Virtual › Evaluación › Examen final");
    assert_eq!(hit.chunk.meta["semestre"], 1, "front matter");
    assert_eq!(hit.chunk.meta["tipo_documento"], "guia", "path pattern");
    assert_eq!(hit.chunk.meta["asignatura"], "iv", "flag");

    let html = &search(&store, "ugr", "iv", "orquesta Kubernetes", &[])[0];
    assert_eq!(
        (html.chunk.title.as_str(), html.chunk.headings.as_slice()),
        ("Tema 2", &["Orquestación".to_owned()][..])
    );

    let page2 = &search(&store, "ugr", "iv", "hypervisors schedule", &[])[0];
    assert_eq!(page2.chunk.doc_id, "iv/apuntes/slides.pdf");
    assert_eq!(page2.chunk.meta["page"], 2);
    assert_eq!(page2.chunk.citation, "slides.pdf, p. 2");

    let rec = &search(&store, "ugr", "iv", "tutorías martes", &[])[0];
    assert_eq!((rec.chunk.doc_id.as_str(), rec.chunk.meta["curso"].clone()), ("faq-1", json!(2025)));
    assert_eq!(search(&store, "ugr", "iv", "Vagrant", &[])[0].chunk.meta["year"], 2024);
}

fn filters_select_by_equality_any_of_and_range_inside_the_query(store_at: &StoreAt) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("c");
    for (i, (asig, tipo, year)) in
        [("iv", "guia", 2021), ("iv", "apuntes", 2023), ("dai", "guia", 2024), ("dai", "examen", 2025)]
            .iter()
            .enumerate()
    {
        write(
            &src,
            &format!("r{i}.json"),
            json!({"id": format!("d{i}"), "text": "contenedores docker y despliegue", "asignatura": asig, "tipo_documento": tipo, "year": year, "score": 0.5 + i as f64, "tags": if i == 0 { json!(["Docker", "ci"]) } else { json!(["vagrant"]) }}).to_string(),
        );
    }
    let store = store_at(&tmp.path().join("kb"));
    ingest(&store, "t", "k", &[src], &IngestOptions::default(), &NoProgress).unwrap();
    let ids = |filters: &[&str]| -> Vec<String> {
        let f: Vec<Filter> = filters.iter().map(|f| Filter::parse(f).unwrap()).collect();
        let mut ids: Vec<String> = search(&store, "t", "k", "docker", &f).into_iter().map(|h| h.chunk.doc_id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&[]), ["d0", "d1", "d2", "d3"]);
    assert_eq!(ids(&["asignatura=IV"]), ["d0", "d1"], "case-insensitive equality");
    assert_eq!(ids(&["asignatura=iv", "tipo_documento=guia"]), ["d0"]);
    assert_eq!(ids(&["tipo_documento=guia|examen"]), ["d0", "d2", "d3"]);
    assert_eq!(ids(&["year>=2023"]), ["d1", "d2", "d3"]);
    assert_eq!(ids(&["year>2023.5"]), ["d2", "d3"], "a float bound on integer metadata");
    assert_eq!(ids(&["year=2021..2024", "asignatura=dai"]), ["d2"]);
    assert_eq!(ids(&["year=2024"]), ["d2"], "a command-line number finds a JSON number");
    assert_eq!(ids(&["score<2"]), ["d0", "d1"], "float metadata");
    assert!(ids(&["nonexistent=1"]).is_empty());
    assert_eq!(ids(&["tags=ci|x"]), ["d0"], "an array matches when any element does");
    assert_eq!(ids(&["tags=docker"]), ["d0"]);
}

fn tenants_are_isolated(store_at: &StoreAt) {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a/secret.txt", "El presupuesto de la academia A es confidencial.");
    let store = store_at(&tmp.path().join("kb"));
    ingest(&store, "tenant-a", "docs", &[a], &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!(search(&store, "tenant-a", "docs", "presupuesto", &[]).len(), 1);
    assert!(matches!(store.open("tenant-b", "docs"), Err(RagError::UnknownKb { .. })));
    let b = write(tmp.path(), "b/other.txt", "Horario de la academia B.");
    ingest(&store, "tenant-b", "docs", &[b], &IngestOptions::default(), &NoProgress).unwrap();
    assert!(search(&store, "tenant-b", "docs", "presupuesto", &[]).is_empty(), "B never sees A's chunks");
    assert!(matches!(store.open("../tenant-a", "docs"), Err(RagError::InvalidName(_))));
    assert_eq!(store.list("tenant-a").unwrap(), ["docs"]);
    // Deleting one tenant's knowledge base leaves the other's, and a fresh store agrees.
    assert!(store.delete("tenant-a", "docs").unwrap());
    assert!(!store.delete("tenant-a", "docs").unwrap(), "already gone");
    let fresh = store_at(&tmp.path().join("kb"));
    assert!(matches!(fresh.open("tenant-a", "docs"), Err(RagError::UnknownKb { .. })));
    assert!(fresh.list("tenant-a").unwrap().is_empty());
    assert_eq!(search(&fresh, "tenant-b", "docs", "horario", &[]).len(), 1);
}

fn re_ingest_is_incremental_and_changed_files_replace_their_chunks(store_at: &StoreAt) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    write(&dir, "a.md", "# Docker\nDocker usa imágenes.");
    write(&dir, "b.md", "# Vagrant\nVagrant usa cajas.");
    let store = store_at(&tmp.path().join("kb"));
    let r1 = ingest(&store, "t", "k", std::slice::from_ref(&dir), &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!((r1.indexed, r1.unchanged, r1.total_chunks), (2, 0, 2));
    let r2 = ingest(&store, "t", "k", std::slice::from_ref(&dir), &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!((r2.indexed, r2.unchanged, r2.chunks, r2.total_chunks), (0, 2, 0, 2), "unchanged files are free");

    write(&dir, "a.md", "# Podman\nPodman ejecuta contenedores sin demonio.");
    let r3 = ingest(&store, "t", "k", std::slice::from_ref(&dir), &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!((r3.indexed, r3.unchanged, r3.total_chunks), (1, 1, 2));
    assert!(search(&store, "t", "k", "imágenes", &[]).is_empty(), "the old chunk is gone");
    assert_eq!(search(&store, "t", "k", "podman demonio", &[])[0].chunk.doc_id, "notes/a.md");

    // New metadata for the same bytes is a change too.
    let opts =
        IngestOptions { meta: serde_json::from_value(json!({"tema": "1"})).unwrap(), ..IngestOptions::default() };
    let r4 = ingest(&store, "t", "k", &[dir], &opts, &NoProgress).unwrap();
    assert_eq!((r4.indexed, r4.total_chunks), (2, 2));
    assert_eq!(search(&store, "t", "k", "vagrant", &[])[0].chunk.meta["tema"], "1");
}

/// A symbolic link back to a folder being walked would make the walk endless: it is reported
/// and skipped, and the rest, a linked folder of documents included, is ingested once.
#[cfg(unix)]
#[test]
fn a_symlink_loop_is_skipped_with_its_reason_and_the_ingest_finishes() {
    use std::os::unix::fs::symlink;
    use std::sync::mpsc;
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    write(&dir, "a.md", "# Docker\nDocker usa imágenes.");
    write(&tmp.path().join("shared"), "b.md", "# Vagrant\nVagrant usa cajas.");
    symlink(&dir, dir.join("again")).unwrap(); // notes/again → notes: a loop
    symlink(tmp.path().join("shared"), dir.join("shared")).unwrap(); // a linked folder, followed

    // On its own thread, so a walk that never ends fails this test instead of hanging it.
    let (tx, rx) = mpsc::channel();
    let (root, roots) = (tmp.path().join("kb"), vec![dir.clone()]);
    std::thread::spawn(move || {
        let _ = tx.send(ingest(&KbStore::new(root), "t", "k", &roots, &IngestOptions::default(), &NoProgress));
    });
    let report = rx.recv_timeout(Duration::from_secs(60)).expect("the ingest finishes despite the loop").unwrap();

    assert_eq!((report.files, report.indexed, report.total_chunks), (3, 2, 2), "{report:#?}");
    assert_eq!(report.skipped.len(), 1, "{report:#?}");
    let skipped = &report.skipped[0];
    assert_eq!(skipped.path, dir.join("again").display().to_string());
    assert!(
        skipped.reason.contains("symbolic link loop") && skipped.reason.contains(&dir.display().to_string()),
        "{}",
        skipped.reason
    );
    let store = KbStore::new(tmp.path().join("kb"));
    assert_eq!(search(&store, "t", "k", "docker", &[]).len(), 1);
    assert_eq!(search(&store, "t", "k", "vagrant", &[])[0].chunk.doc_id, "notes/shared/b.md");
}

#[test]
fn an_uncommitted_ingest_leaves_the_previous_index_usable_and_analyzers_are_fixed() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(tmp.path(), "x/a.txt", "Người nghiện ma túy bị áp dụng biện pháp xử lý hành chính.");
    let store = KbStore::new(tmp.path().join("kb"));
    let r = ingest(&store, "t", "luat", std::slice::from_ref(&f), &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!(r.analyzer, "vi", "detected from the text");
    {
        let kb = store.open("t", "luat").unwrap();
        let mut w = kb.writer().unwrap();
        assert!(matches!(kb.writer(), Err(RagError::Busy(_))), "one writer at a time");
        w.remove_source(&std::fs::canonicalize(&f).unwrap().display().to_string());
        // Dropped without commit: as if the process died mid-ingest.
    }
    // A fresh store (a new process) sees the last committed state.
    let fresh = KbStore::new(tmp.path().join("kb"));
    assert_eq!(search(&fresh, "t", "luat", "ma túy", &[]).len(), 1);
    let err = ingest(
        &fresh,
        "t",
        "luat",
        &[f],
        &IngestOptions { analyzer: Some(Analyzer::English), ..IngestOptions::default() },
        &NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("built with the vi analyzer"), "{err}");
}

fn korean_text_is_searchable_by_bigrams(store_at: &StoreAt) {
    let tmp = tempfile::tempdir().unwrap();
    let f =
        write(tmp.path(), "k/ko.txt", "도커는 컨테이너로 애플리케이션을 패키징합니다.\n\n기말 시험은 1월에 있습니다.");
    let store = store_at(&tmp.path().join("kb"));
    let r = ingest(&store, "t", "ko", &[f], &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!(r.analyzer, "ko");
    assert_eq!(search(&store, "t", "ko", "컨테이너 패키징", &[]).len(), 1);
    assert!(search(&store, "t", "ko", "기차", &[]).is_empty());
}

#[test]
fn alqac_law_json_ingests_through_its_mapping() {
    let Some(data) = eval_data() else { return };
    let mapping_text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/kb/alqac-mapping.toml")).unwrap();
    let mapping = RecordMapping::from_toml(&mapping_text).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = KbStore::new(tmp.path().join("kb"));
    let law = data.join("alqac/raw_2023/law.json");
    let opts = IngestOptions { mapping: Some(mapping), ..IngestOptions::default() };
    let report = ingest(&store, "demo", "luat", std::slice::from_ref(&law), &opts, &NoProgress).unwrap();
    assert_eq!(report.documents, 2131, "one document per article");
    assert_eq!(report.analyzer, "vi");
    assert!(report.chunks > 2131, "long articles are sub-chunked: {}", report.chunks);

    let kb = store.open("demo", "luat").unwrap();
    let hits = kb
        .search(&SearchRequest {
            query: "Cơ quan nào có trách nhiệm thống nhất quản lý nhà nước về điện ảnh?",
            filters: &[],
            top_k: 5,
        })
        .unwrap();
    let hit = hits.iter().find(|h| h.chunk.doc_id == "Luật Điện ảnh#45").expect("the gold article is in the top 5");
    assert_eq!(hit.chunk.doc_id, "Luật Điện ảnh#45");
    assert_eq!(hit.chunk.meta["law"], "Luật Điện ảnh");
    assert_eq!(hit.chunk.meta["article_number"], "45");
    assert_eq!(hit.chunk.citation, "Điều 45, Luật Điện ảnh");
    assert_eq!(hit.chunk.meta["article_title"], hit.chunk.title);

    // Every article is exactly one document, even the one whose body starts a line with "Điều N".
    let raw: Value = serde_json::from_str(&std::fs::read_to_string(&law).unwrap()).unwrap();
    let mut long_checked = false;
    for l in raw.as_array().unwrap() {
        for a in l["articles"].as_array().unwrap() {
            let text = a["text"].as_str().unwrap();
            let body_has_line_start_dieu = text.lines().skip(1).any(|line| line.trim_start().starts_with("Điều "));
            let words = text.split_whitespace().count();
            let first_long = words > 600 && !long_checked;
            if !body_has_line_start_dieu && !first_long {
                continue;
            }
            let id = format!("{}#{}", l["id"].as_str().unwrap(), a["id"].as_str().unwrap());
            let chunks = kb.chunks_of(&id).unwrap();
            assert!(!chunks.is_empty(), "{id}");
            assert!(chunks.iter().all(|c| c.citation == chunks[0].citation && c.meta == chunks[0].meta), "{id}");
            if words > 600 {
                long_checked = true;
                assert!(chunks.len() >= 3, "{id}: {words} words in {} chunks", chunks.len());
                assert_eq!(chunks[0].part.1 as usize, chunks.len());
            } else {
                assert_eq!(chunks.len(), 1, "{id} must not split at a line-start Điều");
            }
        }
    }
    assert!(long_checked);

    let again = ingest(&store, "demo", "luat", &[law], &IngestOptions::default(), &NoProgress).unwrap();
    assert_eq!((again.unchanged, again.indexed), (1, 0), "the stored mapping is reused and nothing changed");
}

/// Hostile files for every document parser (docs/reliability.md): any bytes, any text and
/// damaged PDFs give documents or a readable reason — never a panic, never an empty document.
mod parser_props {
    use proptest::prelude::*;
    use toolgraph_rag::RecordMapping;
    use toolgraph_rag::ingest::formats::{Format, parse};

    const FORMATS: [Format; 6] =
        [Format::Markdown, Format::Text, Format::Html, Format::Pdf, Format::Json, Format::JsonLines];

    fn judged(format: Format, bytes: &[u8]) {
        match parse(format, bytes, "doc", "Doc", &RecordMapping::default()) {
            Ok(docs) => assert!(
                docs.iter().any(|d| !d.title.trim().is_empty() || d.sections.iter().any(|s| !s.text.trim().is_empty())),
                "{format:?}: an empty document was accepted"
            ),
            Err(reason) => assert!(!reason.is_empty(), "{format:?}: an error without a reason"),
        }
    }

    /// Markdown-ish and HTML-ish text: headings, fences, front matter, tags, entities.
    fn structured_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("# ".to_owned()),
            Just("## ".to_owned()),
            Just("\n".to_owned()),
            Just("---\n".to_owned()),
            Just("+++\n".to_owned()),
            Just("```".to_owned()),
            Just("===\n".to_owned()),
            Just("<h1>".to_owned()),
            Just("</p>".to_owned()),
            Just("<script>".to_owned()),
            Just("&amp;&#x1F600;&bogus;".to_owned()),
            Just("title: x\n".to_owned()),
            ".{0,12}",
        ];
        prop::collection::vec(piece, 0..40).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_in_any_format(bytes in prop::collection::vec(any::<u8>(), 0..512), f in 0..FORMATS.len()) {
            judged(FORMATS[f], &bytes);
        }

        #[test]
        fn structured_text_as_markdown_html_and_text(text in structured_text()) {
            for format in [Format::Markdown, Format::Html, Format::Text, Format::Json, Format::JsonLines] {
                judged(format, text.as_bytes());
            }
        }
    }

    proptest! {
        // A PDF parse is slower: fewer cases.
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn damaged_pdfs(cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), truncate in any::<prop::sample::Index>()) {
            let mut bytes = super::pdf(&["Kubernetes orquesta contenedores."]);
            for (at, byte) in cuts {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            let keep = truncate.index(bytes.len()).max(bytes.len() / 2);
            bytes.truncate(keep);
            judged(Format::Pdf, &bytes);
        }
    }
}

on_both_backends!(
    every_format_ingests_and_a_malformed_file_is_skipped_with_its_reason,
    filters_select_by_equality_any_of_and_range_inside_the_query,
    tenants_are_isolated,
    re_ingest_is_incremental_and_changed_files_replace_their_chunks,
    korean_text_is_searchable_by_bigrams,
);
