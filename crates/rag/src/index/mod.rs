//! The index stage: a tenant's named, persisted [`KnowledgeBase`] of chunks (tantivy BM25
//! fields, stored vectors, filterable metadata and the [`Filter`]s that select on it) and the
//! [`KbStore`] that finds them under the data directory. Search over it lives in `search`,
//! filling it in `ingest`.
//!
//! With a Qdrant server configured ([`KbStore::with_qdrant`]) a knowledge base is a
//! collection there instead ([`qdrant`]), and every read and write goes to it.
//!
//! Layout: `<root>/<tenant>/<kb>/kb.json` (the [`KbManifest`]: analyzer, chunking, record
//! mapping, embedding settings) and `<root>/<tenant>/<kb>/index/` (tantivy). Every setting the
//! manifest records is declared in this stage, so nothing here depends on a later one.

mod analyzer;
mod chunk;
pub mod dense;
mod filter;
mod manifest;
pub(crate) mod mapping;
pub(crate) mod qdrant;
pub(crate) mod schema;
mod store;
mod writer;

pub use analyzer::Analyzer;
pub(crate) use analyzer::{VIETNAMESE_LETTERS, is_hangul, terms};
pub use chunk::{Chunk, ChunkingOptions};
pub use dense::DenseOptions;
pub use filter::Filter;
pub use manifest::{KB_FORMAT, KbManifest, validate_name};
pub use mapping::RecordMapping;
pub use qdrant::QdrantOptions;
pub use store::KbStore;
pub use writer::KbWriter;

use crate::RagError;
use dense::DenseIndex;
use schema::{Fields, register_tokenizers, schema};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::TermQuery;
use tantivy::schema::{Field, IndexRecordOption, Value as _};
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{Index, IndexReader, ReloadPolicy, TantivyDocument, Term};

/// A document as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentInfo {
    /// Its id (the source path, or the record id).
    pub doc_id: String,
    /// Its title.
    pub title: String,
    /// How many chunks it was cut into.
    pub chunks: usize,
}

/// A persisted (or in-memory) knowledge base.
pub struct KnowledgeBase {
    pub(crate) manifest: KbManifest,
    dir: Option<PathBuf>,
    index: Index,
    pub(crate) reader: IndexReader,
    pub(crate) fields: Fields,
    /// The knowledge base's analyzer, for the words of a query.
    pub(crate) analyzer: TextAnalyzer,
    dense_options: DenseOptions,
    /// The dense indexes (one per embedding model) of the latest searcher generation they were
    /// built for.
    dense: Mutex<Option<(u64, Arc<Vec<DenseIndex>>)>>,
    /// The Qdrant collection holding this knowledge base, when it lives there (the tantivy
    /// index then stays empty).
    pub(crate) remote: Option<qdrant::QdrantIndex>,
    /// When it was opened.
    pub(crate) opened: std::time::Instant,
}

impl std::fmt::Debug for KnowledgeBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnowledgeBase").field("manifest", &self.manifest).field("dir", &self.dir).finish()
    }
}

impl KnowledgeBase {
    /// An in-memory knowledge base (evaluations, tests).
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn in_memory(manifest: KbManifest) -> Result<Self, RagError> {
        let (schema, fields) = schema(manifest.analyzer);
        let index = Index::create_in_ram(schema);
        Self::finish_open(manifest, None, index, fields)
    }

    /// Opens (or creates) the tantivy index under `dir` for a manifest already read.
    fn open_in(manifest: KbManifest, dir: PathBuf) -> Result<Self, RagError> {
        let (schema, fields) = schema(manifest.analyzer);
        let index_dir = dir.join("index");
        std::fs::create_dir_all(&index_dir).map_err(|e| io_err(&index_dir, &e))?;
        let directory = MmapDirectory::open(&index_dir)
            .map_err(|e| RagError::Io { path: index_dir.display().to_string(), reason: e.to_string() })?;
        let index = Index::open_or_create(directory, schema)?;
        Self::finish_open(manifest, Some(dir), index, fields)
    }

    fn finish_open(manifest: KbManifest, dir: Option<PathBuf>, index: Index, fields: Fields) -> Result<Self, RagError> {
        let analyzer = register_tokenizers(&index, manifest.analyzer);
        let reader = index.reader_builder().reload_policy(ReloadPolicy::OnCommitWithDelay).try_into()?;
        Ok(Self {
            manifest,
            dir,
            index,
            reader,
            fields,
            analyzer,
            dense_options: DenseOptions::default(),
            dense: Mutex::new(None),
            remote: None,
            opened: std::time::Instant::now(),
        })
    }

    /// A knowledge base that lives in a new Qdrant collection made for `manifest` (evaluations;
    /// [`KbStore::with_qdrant`] for persisted ones). Drop the collection with
    /// [`KnowledgeBase::drop_remote`].
    ///
    /// # Errors
    /// [`RagError::Qdrant`] when the collection cannot be made.
    pub fn on_qdrant(manifest: KbManifest, options: &QdrantOptions) -> Result<Self, RagError> {
        let remote = qdrant::QdrantIndex::create(options, &manifest)?;
        Self::in_collection(manifest, remote)
    }

    /// The knowledge base `manifest` describes, living in the collection `remote`.
    pub(crate) fn in_collection(manifest: KbManifest, remote: qdrant::QdrantIndex) -> Result<Self, RagError> {
        let mut kb = Self::in_memory(manifest)?;
        kb.remote = Some(remote);
        Ok(kb)
    }

    /// Deletes the Qdrant collection of a knowledge base that lives there (nothing otherwise).
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub fn drop_remote(&self) -> Result<(), RagError> {
        self.remote.as_ref().map_or(Ok(()), qdrant::QdrantIndex::drop_collection)
    }

    /// Whether the knowledge base lives on a Qdrant server.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The manifest.
    pub fn manifest(&self) -> &KbManifest {
        &self.manifest
    }

    /// Number of chunks (0, with a warning, when Qdrant cannot be asked).
    pub fn chunk_count(&self) -> u64 {
        match &self.remote {
            Some(remote) => remote.count().unwrap_or_else(|e| {
                tracing::warn!(kb = %self.manifest.name, error = %e, "cannot count the chunks");
                0
            }),
            None => self.reader.searcher().num_docs(),
        }
    }

    /// The content hash recorded for a source, if it is indexed.
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn source_hash(&self, source: &str) -> Result<Option<String>, RagError> {
        if let Some(remote) = &self.remote {
            return remote.source_hash(source);
        }
        let searcher = self.reader.searcher();
        let q = TermQuery::new(Term::from_field_text(self.fields.source, source), IndexRecordOption::Basic);
        let top = searcher.search(&q, &TopDocs::with_limit(1))?;
        let Some((_, addr)) = top.first() else { return Ok(None) };
        let doc: TantivyDocument = searcher.doc(*addr)?;
        Ok(doc.get_first(self.fields.source_hash).and_then(|v| v.as_str()).map(str::to_owned))
    }

    /// Every document of the knowledge base: its id, its title and how many chunks it has, in id
    /// order. Reads every stored chunk: for listings, not for search.
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn documents(&self) -> Result<Vec<DocumentInfo>, RagError> {
        if let Some(remote) = &self.remote {
            return remote.documents();
        }
        let searcher = self.reader.searcher();
        let mut docs: std::collections::BTreeMap<String, DocumentInfo> = std::collections::BTreeMap::new();
        for (ord, segment) in searcher.segment_readers().iter().enumerate() {
            for doc_id in segment.doc_ids_alive() {
                let doc: TantivyDocument = searcher.doc(tantivy::DocAddress::new(ord as u32, doc_id))?;
                let s = |field: Field| doc.get_first(field).and_then(|v| v.as_str()).unwrap_or("").to_owned();
                let id = s(self.fields.doc_id);
                docs.entry(id.clone())
                    .or_insert_with(|| DocumentInfo { doc_id: id, title: s(self.fields.doc_title), chunks: 0 })
                    .chunks += 1;
            }
        }
        Ok(docs.into_values().collect())
    }

    /// The chunks of a document, in order (for tests and tools).
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn chunks_of(&self, doc_id: &str) -> Result<Vec<Chunk>, RagError> {
        if let Some(remote) = &self.remote {
            let mut out = remote.chunks_of(doc_id)?;
            out.sort_by_key(|c| natural_chunk_order(&c.id));
            return Ok(out);
        }
        let searcher = self.reader.searcher();
        let q = TermQuery::new(Term::from_field_text(self.fields.doc_id, doc_id), IndexRecordOption::Basic);
        let top = searcher.search(&q, &TopDocs::with_limit(10_000))?;
        let mut out = Vec::with_capacity(top.len());
        for (_, addr) in top {
            let doc: TantivyDocument = searcher.doc(addr)?;
            out.push(self.chunk_from(&doc));
        }
        out.sort_by_key(|c| natural_chunk_order(&c.id));
        Ok(out)
    }

    /// The chunk a stored document holds (the inverse of [`KbWriter::replace_source`]).
    pub(crate) fn chunk_from(&self, doc: &TantivyDocument) -> Chunk {
        let f = &self.fields;
        let s = |field: Field| doc.get_first(field).and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let meta: Map<String, Value> = serde_json::from_str(&s(f.meta_json)).unwrap_or_default();
        let headings: Vec<String> = serde_json::from_str(&s(f.headings)).unwrap_or_default();
        let part = s(f.part);
        let part = part.split_once('/').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?))).unwrap_or((0, 1));
        Chunk {
            id: s(f.chunk_id),
            doc_id: s(f.doc_id),
            title: s(f.doc_title),
            headings,
            text: s(f.text),
            meta,
            citation: s(f.citation),
            part,
        }
    }
}

fn natural_chunk_order(id: &str) -> (u64, u64) {
    let tail = id.rsplit("::").next().unwrap_or("");
    let (u, p) = tail.split_once('.').unwrap_or((tail, "0"));
    (u.parse().unwrap_or(0), p.parse().unwrap_or(0))
}

pub(crate) fn io_err(path: &Path, e: &std::io::Error) -> RagError {
    RagError::Io { path: path.display().to_string(), reason: e.to_string() }
}
