//! The ingest stage: files and folders into a knowledge base, incrementally. Files are found
//! (`walk`), read ([`formats`], JSON records through a [`RecordMapping`]), cut into chunks
//! ([`chunk`]), embedded, and written through one [`KbWriter`](crate::KbWriter).
//!
//! Each file is a *source* identified by its absolute path and a content hash (of its bytes,
//! the record mapping, the chunking and the metadata it would receive). An unchanged source
//! is skipped for free; a changed one has its chunks replaced. A file that cannot be parsed
//! is skipped with its reason and the rest goes on; everything lands in one commit, so a
//! crash part-way leaves the previous index as it was.

pub mod chunk;
pub mod formats;
mod mapping;
mod source;
mod walk;

pub use source::{Section, SourceDocument};

use crate::RagError;
use crate::embed::{EmbedKind, Embedder, EmbeddingSettings, embedder_for_kb, ensure_same_model, passage_text};
use crate::index::{Analyzer, Chunk, ChunkingOptions, KbManifest, KbStore, RecordMapping, validate_name};
use chunk::chunk_document;
use formats::{Format, parse};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Metadata taken from a path relative to the ingested folder: `{name}` captures one path
/// component, `*` skips one, `**` skips any number (`{asignatura}/{tipo_documento}/**`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    parts: Vec<String>,
}

impl PathPattern {
    /// Parses a pattern.
    ///
    /// # Errors
    /// An empty pattern or an empty `{}`.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let parts: Vec<String> = pattern.split('/').filter(|p| !p.is_empty()).map(str::to_owned).collect();
        if parts.is_empty() || parts.iter().any(|p| p == "{}") {
            return Err(format!("path pattern `{pattern}`: expected components like {{asignatura}}/*/**"));
        }
        Ok(Self { parts })
    }

    /// The captured metadata, if `rel` (a relative path, `/`-separated, file name last)
    /// matches.
    pub fn captures(&self, rel: &str) -> Option<Map<String, Value>> {
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        let mut out = Map::new();
        Self::match_from(&self.parts, &comps, &mut out).then_some(out)
    }

    fn match_from(parts: &[String], comps: &[&str], out: &mut Map<String, Value>) -> bool {
        match parts.split_first() {
            None => comps.is_empty(),
            Some((p, rest)) if p == "**" => (0..=comps.len()).any(|skip| {
                let mut trial = out.clone();
                let ok = Self::match_from(rest, &comps[skip..], &mut trial);
                if ok {
                    *out = trial;
                }
                ok
            }),
            Some((p, rest)) => {
                let Some((c, crest)) = comps.split_first() else { return false };
                if let Some(name) = p.strip_prefix('{').and_then(|n| n.strip_suffix('}')) {
                    // The file component captures its stem: `{tema}` on `docker.md` is "docker".
                    let value = if crest.is_empty() { c.rsplit_once('.').map_or(*c, |(stem, _)| stem) } else { c };
                    out.insert(name.to_owned(), Value::String(value.to_owned()));
                } else if p != "*" && p != c {
                    return false;
                }
                Self::match_from(rest, crest, out)
            }
        }
    }
}

/// What an ingest should do beyond reading the files.
#[derive(Debug, Clone, Default)]
pub struct IngestOptions {
    /// Metadata for every document (`--meta k=v`).
    pub meta: Map<String, Value>,
    /// Metadata from path components.
    pub path_patterns: Vec<PathPattern>,
    /// A record mapping for JSON files; `None` keeps the knowledge base's (default at first).
    pub mapping: Option<RecordMapping>,
    /// The analyzer for a new knowledge base; `None` detects it from the text.
    pub analyzer: Option<Analyzer>,
    /// Chunk sizes for a new knowledge base.
    pub chunking: Option<ChunkingOptions>,
    /// The embedding model: a new knowledge base records it and stores a vector per chunk; an
    /// existing one must have been built with the same model (or with none, if this is none). A
    /// combined embedder gives way to its first model where [`embedder_for_kb`] says so.
    pub embedder: Option<Arc<dyn Embedder>>,
}

/// A file that was not ingested, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedFile {
    /// The file.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// What an ingest did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IngestReport {
    /// Tenant.
    pub tenant: String,
    /// Knowledge base.
    pub kb: String,
    /// Analyzer code.
    pub analyzer: String,
    /// Files looked at.
    pub files: usize,
    /// Files (re)indexed.
    pub indexed: usize,
    /// Files unchanged since the last ingest (nothing done).
    pub unchanged: usize,
    /// Documents in the indexed files.
    pub documents: usize,
    /// Chunks written.
    pub chunks: usize,
    /// The embedding model of the knowledge base (none: keyword search only).
    pub embedding_model: Option<String>,
    /// Time spent embedding the written chunks, ms.
    pub embed_ms: f64,
    /// Files skipped, with reasons.
    pub skipped: Vec<SkippedFile>,
    /// Chunks in the knowledge base afterwards.
    pub total_chunks: u64,
    /// Wall time, ms.
    pub elapsed_ms: f64,
}

/// Progress callbacks (the CLI draws a bar; libraries and tests pass [`NoProgress`]).
pub trait IngestProgress {
    /// Work is about to start on `files` files.
    fn start(&self, files: usize);
    /// One file is done.
    fn advance(&self, path: &Path);
    /// `done` of `total` new chunks are embedded.
    fn embedded(&self, _done: usize, _total: usize) {}
    /// All done.
    fn finish(&self);
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl IngestProgress for NoProgress {
    fn start(&self, _files: usize) {}
    fn advance(&self, _path: &Path) {}
    fn finish(&self) {}
}

/// Ingests `paths` (files or folders) into `tenant`'s knowledge base `kb`, creating it if
/// needed.
///
/// # Errors
/// Invalid names, a knowledge base another ingest holds, index or I/O failures. Files that
/// cannot be read or parsed are not errors: they are reported in [`IngestReport::skipped`].
pub fn ingest(
    store: &KbStore,
    tenant: &str,
    kb: &str,
    paths: &[PathBuf],
    options: &IngestOptions,
    progress: &dyn IngestProgress,
) -> Result<IngestReport, RagError> {
    let started = Instant::now();
    let (mut report, existing, mapping, chunking) = prepare(store, tenant, kb, options)?;
    let mut files = Vec::new();
    walk::collect_files(paths, &mut files, &mut report.skipped);
    report.files = files.len() + report.skipped.len();

    // Parse everything first: a new knowledge base's analyzer is detected from the text.
    progress.start(files.len());
    let mut parsed = Vec::new();
    for item in &files {
        let result = read_and_parse(item, options, &mapping, chunking);
        progress.advance(&item.path);
        match result {
            Ok(p) => parsed.push(p),
            Err(reason) => report.skipped.push(SkippedFile { path: item.path.display().to_string(), reason }),
        }
    }
    write_parsed(store, existing, parsed, mapping, chunking, options, progress, report, started)
}

/// A document held in memory, to ingest as if it were a file of that name.
#[derive(Debug, Clone)]
pub struct NamedBytes {
    /// What a later ingest replaces it by (an upload's id; the name when `None`).
    pub source: Option<String>,
    /// Its name: the extension says its format, and it is the document's title.
    pub name: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// Ingests documents held in memory (an upload) into `tenant`'s knowledge base `kb`, creating
/// it if needed; a document of the same source replaces the one before. A JSON document that is
/// not records of the knowledge base's mapping is read as text.
///
/// # Errors
/// As [`ingest`]. Documents that cannot be parsed are reported in [`IngestReport::skipped`].
pub fn ingest_bytes(
    store: &KbStore,
    tenant: &str,
    kb: &str,
    documents: &[NamedBytes],
    options: &IngestOptions,
) -> Result<IngestReport, RagError> {
    let started = Instant::now();
    let (mut report, existing, mapping, chunking) = prepare(store, tenant, kb, options)?;
    report.files = documents.len();
    let mut parsed = Vec::new();
    for d in documents {
        match parse_named(d, options, &mapping, chunking) {
            Ok(p) => parsed.push(p),
            Err(reason) => report.skipped.push(SkippedFile { path: d.name.clone(), reason }),
        }
    }
    write_parsed(store, existing, parsed, mapping, chunking, options, &NoProgress, report, started)
}

/// An ingest's report, the knowledge base if it exists, its record mapping and chunk sizes.
type Prepared = (IngestReport, Option<Arc<crate::index::KnowledgeBase>>, RecordMapping, ChunkingOptions);

/// What an ingest into `tenant`'s `kb` starts from: its report, the knowledge base if it
/// exists, and the record mapping and chunk sizes it keeps (else the options').
fn prepare(store: &KbStore, tenant: &str, kb: &str, options: &IngestOptions) -> Result<Prepared, RagError> {
    validate_name("tenant", tenant)?;
    validate_name("knowledge base", kb)?;
    let report = IngestReport { tenant: tenant.to_owned(), kb: kb.to_owned(), ..IngestReport::default() };
    let existing = match store.open(tenant, kb) {
        Ok(kb) => Some(kb),
        Err(RagError::UnknownKb { .. }) => None,
        Err(e) => return Err(e),
    };
    let mapping =
        options.mapping.clone().or_else(|| existing.as_ref().map(|k| k.manifest().mapping.clone())).unwrap_or_default();
    let chunking = existing.as_ref().map(|k| k.manifest().chunking).or(options.chunking).unwrap_or_default();
    Ok((report, existing, mapping, chunking))
}

/// Parses one in-memory document as [`ingest_bytes`] does.
///
/// # Errors
/// A readable reason it cannot be used: its type, its size, or what its parser said.
pub fn check_named(document: &NamedBytes) -> Result<usize, String> {
    let mapping = RecordMapping::default();
    parse_named(document, &IngestOptions::default(), &mapping, ChunkingOptions::default()).map(|p| p.chunks.len())
}

fn parse_named(
    d: &NamedBytes,
    options: &IngestOptions,
    mapping: &RecordMapping,
    chunking: ChunkingOptions,
) -> Result<ParsedFile, String> {
    let format = Format::from_path(Path::new(&d.name)).ok_or_else(|| unsupported(Path::new(&d.name)))?;
    check_size(d.bytes.len() as u64)?;
    let source = d.source.as_deref().unwrap_or(&d.name);
    // Its name is what a reader calls it, whatever the source id.
    let mut meta = options.meta.clone();
    meta.insert("source".into(), Value::String(d.name.clone()));
    let parsed = parse_bytes(format, &d.bytes, source, source, &d.name, meta.clone(), mapping, chunking);
    match (parsed, format) {
        // Any JSON a person attaches is worth reading, records or not.
        (Err(_), Format::Json | Format::JsonLines) => {
            parse_bytes(Format::Text, &d.bytes, source, source, &d.name, meta, mapping, chunking)
        }
        (result, _) => result,
    }
    .and_then(|p| {
        if p.chunks.iter().all(|c| c.text.trim().is_empty()) {
            Err("it holds no text to search (a scanned document needs its text recognised first)".to_owned())
        } else {
            Ok(p)
        }
    })
}

/// Writes what was parsed into the knowledge base (`existing`, else a new one), embedding the
/// chunks of documents that changed.
#[allow(clippy::too_many_arguments)]
fn write_parsed(
    store: &KbStore,
    existing: Option<Arc<crate::index::KnowledgeBase>>,
    parsed: Vec<ParsedFile>,
    mapping: RecordMapping,
    chunking: ChunkingOptions,
    options: &IngestOptions,
    progress: &dyn IngestProgress,
    mut report: IngestReport,
    started: Instant,
) -> Result<IngestReport, RagError> {
    let (tenant, kb) = (report.tenant.clone(), report.kb.clone());
    let (tenant, kb) = (tenant.as_str(), kb.as_str());
    let embedder: Option<Arc<dyn Embedder>>;
    let kb_handle = match existing {
        Some(k) => {
            if let Some(a) = options.analyzer.filter(|a| *a != k.manifest().analyzer) {
                return Err(RagError::Mismatch(format!(
                    "knowledge base `{kb}` was built with the {} analyzer, not {}; ingest into a new knowledge base to change it",
                    k.manifest().analyzer.code(),
                    a.code()
                )));
            }
            embedder = options
                .embedder
                .as_ref()
                .map(|e| embedder_for_kb(e, k.manifest().analyzer, k.manifest().embedding.as_ref()));
            check_embedding_model(kb, k.manifest().embedding.as_ref(), embedder.as_deref())?;
            if options.mapping.as_ref().is_some_and(|m| *m != k.manifest().mapping) {
                let mut manifest = k.manifest().clone();
                manifest.mapping = mapping.clone();
                store.update_manifest(&manifest)?;
                store.open(tenant, kb)?
            } else {
                k
            }
        }
        None => {
            let analyzer = options.analyzer.unwrap_or_else(|| {
                let mut sample = String::new();
                for p in &parsed {
                    for c in &p.chunks {
                        if sample.len() > 50_000 {
                            break;
                        }
                        sample.push_str(&c.text);
                        sample.push('\n');
                    }
                }
                Analyzer::detect(&sample)
            });
            let mut manifest = KbManifest::new(tenant, kb, analyzer);
            manifest.chunking = chunking;
            manifest.mapping = mapping.clone();
            embedder = options.embedder.as_ref().map(|e| embedder_for_kb(e, analyzer, None));
            manifest.embedding = embedder.as_ref().map(|e| e.settings().clone());
            store.open_or_create(manifest, options.analyzer.is_some())?
        }
    };
    report.analyzer = kb_handle.manifest().analyzer.code().to_owned();

    report.embedding_model = kb_handle.manifest().embedding.as_ref().map(|e| e.model.clone());

    let mut changed = Vec::with_capacity(parsed.len());
    for p in &parsed {
        if kb_handle.source_hash(&p.source)?.as_deref() == Some(p.hash.as_str()) {
            report.unchanged += 1;
        } else {
            changed.push(p);
        }
    }
    // Embed before taking the writer: a model failure leaves the knowledge base untouched.
    let vectors = match &embedder {
        Some(e) => {
            let t = Instant::now();
            let texts: Vec<String> = changed.iter().flat_map(|p| p.chunks.iter().map(passage_text)).collect();
            let mut vectors = Vec::with_capacity(texts.len());
            // Batches big enough for the model to pack by length, small enough to show progress.
            for batch in texts.chunks(256) {
                let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                vectors.extend(e.embed(&refs, EmbedKind::Passage)?);
                progress.embedded(vectors.len(), texts.len());
            }
            report.embed_ms = t.elapsed().as_secs_f64() * 1e3;
            Some(vectors)
        }
        None => None,
    };
    let mut writer = kb_handle.writer()?;
    let mut offset = 0;
    for p in changed {
        let v = vectors.as_ref().map(|v| &v[offset..offset + p.chunks.len()]);
        offset += p.chunks.len();
        writer.replace_source_embedded(&p.source, &p.hash, &p.chunks, v)?;
        report.indexed += 1;
        report.documents += p.documents;
        report.chunks += p.chunks.len();
    }
    writer.commit()?;
    progress.finish();
    report.total_chunks = kb_handle.chunk_count();
    report.elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(report)
}

/// A knowledge base keeps one embedding model for life: mixing vectors of two models (or
/// chunks with and without vectors) would make dense search meaningless.
fn check_embedding_model(
    kb: &str,
    built: Option<&EmbeddingSettings>,
    with: Option<&dyn Embedder>,
) -> Result<(), RagError> {
    match (built, with) {
        (Some(b), Some(e)) => ensure_same_model(b, e.settings()),
        (None, None) => Ok(()),
        (Some(b), None) => Err(RagError::Mismatch(format!(
            "knowledge base `{kb}` stores embeddings of {}; configure that model (rag.embedding) to add documents to it",
            b.model
        ))),
        (None, Some(e)) => Err(RagError::Mismatch(format!(
            "knowledge base `{kb}` was built without embeddings (keyword search only); ingest into it with \
             rag.embedding = \"none\", or into a new knowledge base to embed with {}",
            e.settings().model
        ))),
    }
}

struct ParsedFile {
    source: String,
    hash: String,
    documents: usize,
    chunks: Vec<Chunk>,
}

/// Largest file ingested: a document is read whole and parsed in memory (a PDF's parser holds
/// several times its size), so an unbounded one could exhaust the process.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The refusal of a file whose extension names no format this crate reads.
fn unsupported(path: &Path) -> String {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    format!("unsupported format `.{ext}` (md, txt, html, pdf, json, jsonl)")
}

fn check_size(size: u64) -> Result<(), String> {
    if size > MAX_FILE_BYTES {
        return Err(format!(
            "the file is {} MiB, more than the {} MiB a document may have; split it",
            size >> 20,
            MAX_FILE_BYTES >> 20
        ));
    }
    Ok(())
}

fn read_and_parse(
    item: &walk::FileItem,
    options: &IngestOptions,
    mapping: &RecordMapping,
    chunking: ChunkingOptions,
) -> Result<ParsedFile, String> {
    let format = Format::from_path(&item.path).ok_or_else(|| unsupported(&item.path))?;
    check_size(std::fs::metadata(&item.path).map_err(|e| e.to_string())?.len())?;
    let bytes = std::fs::read(&item.path).map_err(|e| e.to_string())?;
    let source = std::fs::canonicalize(&item.path).unwrap_or_else(|_| item.path.clone()).display().to_string();
    let mut meta = Map::new();
    for pattern in &options.path_patterns {
        if let Some(captured) = pattern.captures(&item.rel) {
            meta.extend(captured);
        }
    }
    meta.extend(options.meta.clone());
    let title = item.path.file_name().and_then(|n| n.to_str()).unwrap_or(&item.id).to_owned();
    parse_bytes(format, &bytes, &source, &item.id, &title, meta, mapping, chunking)
}

/// Parses and chunks one document's bytes; `source` is what a later ingest replaces it by.
#[allow(clippy::too_many_arguments)]
fn parse_bytes(
    format: Format,
    bytes: &[u8],
    source: &str,
    id: &str,
    title: &str,
    meta: Map<String, Value>,
    mapping: &RecordMapping,
    chunking: ChunkingOptions,
) -> Result<ParsedFile, String> {
    let mut hasher = Sha256::new();
    hasher.update(bytes);
    hasher.update(serde_json::to_vec(mapping).unwrap_or_default());
    hasher.update(serde_json::to_vec(&chunking).unwrap_or_default());
    hasher.update(serde_json::to_vec(&meta).unwrap_or_default());
    let hash = hex::encode(hasher.finalize());

    let mut docs = parse(format, bytes, id, title, mapping)?;
    let records = matches!(format, Format::Json | Format::JsonLines);
    let mut chunks = Vec::new();
    for doc in &mut docs {
        // Flags and path metadata win over what a file says about itself: they are the
        // operator's decision for this ingest.
        for (k, v) in &meta {
            doc.meta.insert(k.clone(), v.clone());
        }
        chunks.extend(chunk_document(doc, chunking, !records));
    }
    Ok(ParsedFile { source: source.to_owned(), hash, documents: docs.len(), chunks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_patterns_capture_components() {
        let p = PathPattern::parse("{asignatura}/{tipo_documento}/**").unwrap();
        let m = p.captures("iv/guia/2025/guia.md").unwrap();
        assert_eq!((m["asignatura"].as_str(), m["tipo_documento"].as_str()), (Some("iv"), Some("guia")));
        assert!(p.captures("solo.md").is_none());
        let p = PathPattern::parse("*/{tema}").unwrap();
        assert_eq!(p.captures("apuntes/docker.md").unwrap()["tema"], "docker");
        assert!(PathPattern::parse("").is_err());
    }

    #[test]
    fn documents_in_memory_are_ingested_replaced_by_name_and_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = KbStore::new(dir.path().to_path_buf());
        let doc =
            |name: &str, text: &str| NamedBytes { source: None, name: name.into(), bytes: text.as_bytes().to_vec() };
        let first = [
            doc("plan.md", "# Plan\n\nThe launch review is on 3 March in room B12."),
            doc("data.json", r#"{"budget": 12500, "owner": "Marta"}"#),
            doc("virus.exe", "MZ"),
            doc("empty.txt", "   "),
        ];
        let report = ingest_bytes(&store, "t7", "c10", &first, &IngestOptions::default()).unwrap();
        assert_eq!((report.indexed, report.skipped.len()), (2, 2), "{report:?}");
        assert!(report.skipped[0].reason.contains("unsupported format `.exe`"), "{report:?}");
        assert!(report.skipped[1].reason.contains("no text"), "{report:?}");
        let kb = store.open("t7", "c10").unwrap();
        let chunks = kb.chunk_count();
        // The same name again replaces its chunks; the same bytes change nothing.
        let again = ingest_bytes(&store, "t7", "c10", &first[..1], &IngestOptions::default()).unwrap();
        assert_eq!(again.unchanged, 1);
        let changed = [doc("plan.md", "# Plan\n\nThe launch review moved to 5 March.")];
        ingest_bytes(&store, "t7", "c10", &changed, &IngestOptions::default()).unwrap();
        assert_eq!(store.open("t7", "c10").unwrap().chunk_count(), chunks);
        // Two documents of one name from two sources are both kept.
        let other = NamedBytes { source: Some("upload-2".into()), ..doc("plan.md", "Another plan entirely.") };
        ingest_bytes(&store, "t7", "c10", &[other], &IngestOptions::default()).unwrap();
        assert_eq!(store.open("t7", "c10").unwrap().chunk_count(), chunks + 1);
        assert_eq!(check_named(&doc("a.pdf", "not a pdf")).map_err(|e| e.is_empty()), Err(false));
        assert_eq!(check_named(&doc("notes.txt", "one two three")), Ok(1));
    }

    #[test]
    fn a_file_past_the_size_limit_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.txt");
        // Sparse: the size is there without the bytes on disk.
        std::fs::File::create(&path).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
        let item = walk::FileItem { path, id: "huge.txt".into(), rel: "huge.txt".into() };
        let options = IngestOptions::default();
        let Err(reason) = read_and_parse(&item, &options, &RecordMapping::default(), ChunkingOptions::default()) else {
            panic!("a file past the limit was read");
        };
        assert!(reason.contains("64 MiB"), "{reason}");
    }
}
