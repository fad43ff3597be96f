//! [`KnowledgeBase`]: a tenant's named, persisted collection of chunks with BM25, dense and
//! hybrid search and metadata filters; [`KbStore`] finds them under the data directory.
//!
//! Layout: `<root>/<tenant>/<kb>/kb.json` (the [`KbManifest`]: analyzer, chunking, record
//! mapping, embedding settings) and `<root>/<tenant>/<kb>/index/` (tantivy). Tenants are
//! directories, so one tenant's search can never see another's chunks. Writes go through one
//! tantivy commit per ingest: a crash before it leaves the previous index as it was.

use crate::RagError;
use crate::analyzer::{Analyzer, terms};
use crate::chunk::{Chunk, ChunkingOptions};
use crate::dense::{DenseIndex, DenseOptions};
use crate::filter::Filter;
use crate::fusion::{Fusion, ListRank, fuse_many};
use crate::mapping::RecordMapping;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tantivy::collector::{DocSetCollector, TopDocs};
use tantivy::directory::MmapDirectory;
use tantivy::query::{BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::{
    BytesOptions, FAST, Field, IndexRecordOption, JsonObjectOptions, STORED, STRING, Schema, TextFieldIndexing,
    TextOptions, Value as _,
};
use tantivy::tokenizer::{LowerCaser, RawTokenizer, TextAnalyzer};
use tantivy::{DocAddress, Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term};

/// The manifest format this build writes and reads (2: chunks may carry embedding vectors).
pub const KB_FORMAT: u32 = 2;
const KEYWORD_TOKENIZER: &str = "tg_keyword";

/// Embedding settings a knowledge base was built with (filled by dense retrieval).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingSettings {
    /// Model id.
    pub model: String,
    /// sha256 of the weights.
    pub sha256: String,
    /// Vector dimension.
    pub dimension: usize,
    /// Prefix for queries (e5: `query: `).
    pub query_prefix: String,
    /// Prefix for passages (e5: `passage: `).
    pub passage_prefix: String,
    /// For several models side by side (a combined embedder), each model's settings in order:
    /// stored vectors hold their vectors one after the other, and search keeps one dense list
    /// per model. Empty for a single model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<EmbeddingSettings>,
}

impl EmbeddingSettings {
    /// The models whose vectors a stored vector holds, in order (the model itself when single).
    pub fn models(&self) -> &[EmbeddingSettings] {
        if self.parts.is_empty() { std::slice::from_ref(self) } else { &self.parts }
    }

    /// Why these settings cannot describe stored vectors (parts that do not add up, or are
    /// themselves combined), if they cannot.
    fn inconsistency(&self) -> Option<String> {
        let sum: usize = self.parts.iter().map(|p| p.dimension).sum();
        if !self.parts.is_empty() && sum != self.dimension {
            return Some(format!(
                "the embedding `{}` has {} dimensions but its models add up to {sum}",
                self.model, self.dimension
            ));
        }
        self.parts.iter().any(|p| !p.parts.is_empty()).then(|| format!("the embedding `{}` nests models", self.model))
    }
}

/// What a knowledge base records about itself (`kb.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbManifest {
    /// Manifest format version.
    pub format: u32,
    /// Owning tenant.
    pub tenant: String,
    /// Name.
    pub name: String,
    /// Keyword analyzer (fixed at creation: the index's terms depend on it).
    pub analyzer: Analyzer,
    /// Chunk sizes.
    pub chunking: ChunkingOptions,
    /// How JSON records map to documents, reused by later ingests.
    #[serde(default, skip_serializing_if = "RecordMapping::is_default")]
    pub mapping: RecordMapping,
    /// Dense embedding settings, once the knowledge base has vectors.
    #[serde(default)]
    pub embedding: Option<EmbeddingSettings>,
    /// Creation time, seconds since the Unix epoch.
    pub created_at: u64,
}

#[derive(Clone, Copy)]
struct Fields {
    chunk_id: Field,
    doc_id: Field,
    source: Field,
    source_hash: Field,
    title: Field,
    doc_title: Field,
    text: Field,
    headings: Field,
    citation: Field,
    part: Field,
    /// The metadata as given, for display.
    meta_json: Field,
    /// The metadata for filtering: numbers as f64, so one numeric type per path.
    meta: Field,
    /// The chunk's embedding, little-endian f32s (absent in keyword-only knowledge bases).
    vector: Field,
}

fn schema(analyzer: Analyzer) -> (Schema, Fields) {
    let mut s = Schema::builder();
    let text_options = TextOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(analyzer.tokenizer_name())
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        )
        .set_stored();
    let meta_options = JsonObjectOptions::default()
        .set_indexing_options(
            TextFieldIndexing::default().set_tokenizer(KEYWORD_TOKENIZER).set_index_option(IndexRecordOption::Basic),
        )
        .set_fast(None);
    let fields = Fields {
        chunk_id: s.add_text_field("chunk_id", STRING | STORED),
        doc_id: s.add_text_field("doc_id", STRING | STORED | FAST),
        source: s.add_text_field("source", STRING | STORED),
        source_hash: s.add_text_field("source_hash", STORED),
        // Indexed: the document title plus the heading path; stored apart: the bare title.
        title: s.add_text_field("title", text_options.clone()),
        doc_title: s.add_text_field("doc_title", STORED),
        text: s.add_text_field("text", text_options),
        headings: s.add_text_field("headings", STORED),
        citation: s.add_text_field("citation", STORED),
        part: s.add_text_field("part", STORED),
        meta_json: s.add_text_field("meta_json", STORED),
        meta: s.add_json_field("meta", meta_options),
        vector: s.add_bytes_field("vector", BytesOptions::default().set_stored()),
    };
    (s.build(), fields)
}

/// One search result: a chunk, its score in the mode searched (BM25, cosine, or RRF), and
/// its place in each list that ranked it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The chunk.
    pub chunk: Chunk,
    /// The score the results are ordered by.
    pub score: f32,
    /// Rank and score in the keyword list.
    pub bm25: Option<ListRank>,
    /// Rank and score in the dense list (of the first model, when the knowledge base has several).
    pub dense: Option<ListRank>,
    /// Rank and score in each further model's dense list (hybrid search of a knowledge base
    /// embedded with several models; empty otherwise).
    pub more_dense: Vec<Option<ListRank>>,
}

/// What a search ranks by.
#[derive(Debug, Clone, Copy)]
pub enum Ranking<'a> {
    /// BM25 over the query's words.
    Bm25,
    /// Cosine similarity to this query vector (from the knowledge base's own model; with
    /// several models, the first model's list).
    Dense(&'a [f32]),
    /// The keyword list and every model's dense list, fused.
    Hybrid(&'a [f32], Fusion),
}

struct Ranked {
    addr: DocAddress,
    score: f32,
    bm25: Option<ListRank>,
    dense: Option<ListRank>,
    more_dense: Vec<Option<ListRank>>,
}

/// A keyword search.
#[derive(Debug, Clone)]
pub struct SearchRequest<'a> {
    /// The user's words (never parsed as query syntax).
    pub query: &'a str,
    /// All must hold.
    pub filters: &'a [Filter],
    /// How many chunks.
    pub top_k: usize,
}

/// A persisted (or in-memory) knowledge base.
pub struct KnowledgeBase {
    manifest: KbManifest,
    dir: Option<PathBuf>,
    index: Index,
    reader: IndexReader,
    fields: Fields,
    analyzer: TextAnalyzer,
    dense_options: DenseOptions,
    /// The dense indexes (one per embedding model) of the latest searcher generation they were
    /// built for.
    dense: Mutex<Option<(u64, Arc<Vec<DenseIndex>>)>>,
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

    fn finish_open(manifest: KbManifest, dir: Option<PathBuf>, index: Index, fields: Fields) -> Result<Self, RagError> {
        let analyzer = manifest.analyzer.build();
        index.tokenizers().register(manifest.analyzer.tokenizer_name(), analyzer.clone());
        index
            .tokenizers()
            .register(KEYWORD_TOKENIZER, TextAnalyzer::builder(RawTokenizer::default()).filter(LowerCaser).build());
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
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &KbManifest {
        &self.manifest
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// A writer for one ingest. Only one may exist per knowledge base across processes.
    ///
    /// # Errors
    /// [`RagError::Busy`] when another ingest holds the knowledge base.
    pub fn writer(&self) -> Result<KbWriter<'_>, RagError> {
        let writer = self.index.writer_with_num_threads(2, 96_000_000).map_err(|e| match e {
            tantivy::TantivyError::LockFailure(..) => RagError::Busy(self.manifest.name.clone()),
            other => RagError::Index(other),
        })?;
        Ok(KbWriter { kb: self, writer })
    }

    /// The content hash recorded for a source, if it is indexed.
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn source_hash(&self, source: &str) -> Result<Option<String>, RagError> {
        let searcher = self.reader.searcher();
        let q = TermQuery::new(Term::from_field_text(self.fields.source, source), IndexRecordOption::Basic);
        let top = searcher.search(&q, &TopDocs::with_limit(1))?;
        let Some((_, addr)) = top.first() else { return Ok(None) };
        let doc: TantivyDocument = searcher.doc(*addr)?;
        Ok(doc.get_first(self.fields.source_hash).and_then(|v| v.as_str()).map(str::to_owned))
    }

    /// BM25 search with filters applied inside the index query.
    ///
    /// # Errors
    /// [`RagError::EmptyQuery`] when the query has no searchable word; tantivy failures.
    pub fn search(&self, req: &SearchRequest<'_>) -> Result<Vec<Hit>, RagError> {
        self.search_ranked(req, Ranking::Bm25)
    }

    /// Search by `ranking`, filters applied inside each list's search.
    ///
    /// # Errors
    /// [`RagError::EmptyQuery`] for a keyword-only search without searchable words;
    /// [`RagError::Mismatch`] for a dense search of a knowledge base without vectors or with a
    /// query vector of another dimension; tantivy failures.
    pub fn search_ranked(&self, req: &SearchRequest<'_>, ranking: Ranking<'_>) -> Result<Vec<Hit>, RagError> {
        let searcher = self.reader.searcher();
        let ranked = self.rank(&searcher, req, ranking)?;
        let mut hits = Vec::with_capacity(ranked.len());
        for r in ranked {
            let doc: TantivyDocument = searcher.doc(r.addr)?;
            hits.push(Hit {
                chunk: self.chunk_from(&doc),
                score: r.score,
                bm25: r.bm25,
                dense: r.dense,
                more_dense: r.more_dense,
            });
        }
        Ok(hits)
    }

    /// Like [`KnowledgeBase::search_ranked`] but only each hit's parent document id, read from a
    /// fast column instead of the stored chunk (evaluations rank hundreds of hits per query).
    ///
    /// # Errors
    /// As [`KnowledgeBase::search_ranked`].
    pub fn search_doc_ids(
        &self,
        req: &SearchRequest<'_>,
        ranking: Ranking<'_>,
    ) -> Result<Vec<(String, f32)>, RagError> {
        let searcher = self.reader.searcher();
        let ranked = self.rank(&searcher, req, ranking)?;
        let mut columns: HashMap<u32, tantivy::columnar::StrColumn> = HashMap::new();
        let mut out = Vec::with_capacity(ranked.len());
        let mut buf = String::new();
        for r in ranked {
            let addr = r.addr;
            let column = match columns.entry(addr.segment_ord) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let reader = searcher.segment_reader(addr.segment_ord);
                    let Some(col) = reader.fast_fields().str("doc_id")? else { continue };
                    v.insert(col)
                }
            };
            if let Some(ord) = column.term_ords(addr.doc_id).next() {
                buf.clear();
                column.ord_to_str(ord, &mut buf).map_err(|e| RagError::Index(e.into()))?;
                out.push((buf.clone(), r.score));
            }
        }
        Ok(out)
    }

    fn rank(
        &self,
        searcher: &Searcher,
        req: &SearchRequest<'_>,
        ranking: Ranking<'_>,
    ) -> Result<Vec<Ranked>, RagError> {
        let top_k = req.top_k.max(1);
        let as_list = |list: Vec<(DocAddress, f32)>, bm25: bool| -> Vec<Ranked> {
            list.into_iter()
                .enumerate()
                .map(|(i, (addr, score))| {
                    let rank = Some(ListRank { rank: i + 1, score });
                    let (b, d) = if bm25 { (rank, None) } else { (None, rank) };
                    Ranked { addr, score, bm25: b, dense: d, more_dense: Vec::new() }
                })
                .collect()
        };
        match ranking {
            Ranking::Bm25 => Ok(as_list(self.bm25_list(searcher, req, top_k)?, true)),
            Ranking::Dense(vector) => {
                let lists = self.dense_lists(searcher, req.filters, vector, top_k, false)?;
                Ok(as_list(lists.into_iter().next().unwrap_or_default(), false))
            }
            Ranking::Hybrid(vector, fusion) => {
                let depth = fusion.depth.max(top_k);
                let dense = self.dense_lists(searcher, req.filters, vector, depth, true)?;
                let dense: Vec<&[(DocAddress, f32)]> = dense.iter().map(Vec::as_slice).collect();
                // A query of stopwords only still has a meaning: rank it by the dense list alone.
                let bm25 = match self.bm25_list(searcher, req, depth) {
                    Err(RagError::EmptyQuery) => Vec::new(),
                    other => other?,
                };
                Ok(fuse_many(&bm25, &dense, &fusion)
                    .into_iter()
                    .take(top_k)
                    .map(|f| Ranked {
                        addr: f.key,
                        score: f.score,
                        bm25: f.bm25,
                        dense: f.dense,
                        more_dense: f.more_dense,
                    })
                    .collect())
            }
        }
    }

    fn bm25_list(
        &self,
        searcher: &Searcher,
        req: &SearchRequest<'_>,
        k: usize,
    ) -> Result<Vec<(DocAddress, f32)>, RagError> {
        let query = self.build_query(req)?;
        Ok(searcher.search(&query, &TopDocs::with_limit(k))?.into_iter().map(|(s, a)| (a, s)).collect())
    }

    /// One list per embedding model (only the first unless `all`), each the `k` chunks closest
    /// to that model's part of `vector`, filters applied during the search.
    fn dense_lists(
        &self,
        searcher: &Searcher,
        filters: &[Filter],
        vector: &[f32],
        k: usize,
        all: bool,
    ) -> Result<Vec<Vec<(DocAddress, f32)>>, RagError> {
        let Some(embedding) = &self.manifest.embedding else {
            return Err(RagError::Mismatch(format!(
                "knowledge base `{}` has no embeddings (it was ingested for keyword search only): search it with \
                 mode bm25, or re-ingest it with an embedding model",
                self.manifest.name
            )));
        };
        if vector.len() != embedding.dimension {
            return Err(RagError::Mismatch(format!(
                "query vector has {} dimensions; knowledge base `{}` holds {}-dimension vectors of {}",
                vector.len(),
                self.manifest.name,
                embedding.dimension,
                embedding.model
            )));
        }
        let indexes = self.dense_indexes(searcher, embedding)?;
        let filter_rows = if filters.is_empty() {
            None
        } else {
            let query = BooleanQuery::new(filters.iter().map(|f| (Occur::Must, self.filter_query(f))).collect());
            Some(searcher.search(&query, &DocSetCollector)?)
        };
        let wanted = if all { indexes.len() } else { 1 };
        let mut lists = Vec::with_capacity(wanted);
        let mut offset = 0;
        for (index, model) in indexes.iter().zip(embedding.models()).take(wanted) {
            // The manifest's parts add up to its dimension (checked when it is opened).
            let part = vector.get(offset..offset + model.dimension).unwrap_or_default();
            offset += model.dimension;
            let allowed = filter_rows.as_ref().map(|rows| index.allowed_rows(rows.iter().copied()));
            lists.push(index.search(part, k, allowed.as_ref()));
        }
        Ok(lists)
    }

    /// The dense indexes (one per model) for this searcher's generation, built on first use
    /// after a commit.
    fn dense_indexes(
        &self,
        searcher: &Searcher,
        embedding: &EmbeddingSettings,
    ) -> Result<Arc<Vec<DenseIndex>>, RagError> {
        let generation = searcher.generation().generation_id();
        let mut cached = self.dense.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((g, indexes)) = cached.as_ref()
            && *g == generation
        {
            return Ok(indexes.clone());
        }
        let models = embedding.models();
        let mut entries: Vec<Vec<(DocAddress, Vec<f32>)>> =
            models.iter().map(|_| Vec::with_capacity(searcher.num_docs() as usize)).collect();
        let mut max_docs = Vec::with_capacity(searcher.segment_readers().len());
        for (ord, segment) in searcher.segment_readers().iter().enumerate() {
            max_docs.push(segment.max_doc());
            for doc_id in segment.doc_ids_alive() {
                let addr = DocAddress::new(ord as u32, doc_id);
                let doc: TantivyDocument = searcher.doc(addr)?;
                let Some(bytes) = doc.get_first(self.fields.vector).and_then(|v| v.as_bytes()) else { continue };
                if bytes.len() != embedding.dimension * 4 {
                    continue;
                }
                // Each model's part decoded straight from the stored bytes (4 per float).
                let mut offset = 0;
                for (list, model) in entries.iter_mut().zip(models) {
                    if let Some(part) = bytes.get(offset..offset + model.dimension * 4) {
                        list.push((addr, decode_vector(part)));
                    }
                    offset += model.dimension * 4;
                }
            }
        }
        let indexes: Vec<DenseIndex> = entries
            .into_iter()
            .zip(models)
            .map(|(list, model)| DenseIndex::build(model.dimension, list, &max_docs, self.dense_options))
            .collect();
        for (index, model) in indexes.iter().zip(models) {
            tracing::debug!(kb = %self.manifest.name, model = %model.model, vectors = index.len(), hnsw = index.uses_graph(), "built dense index");
        }
        let indexes = Arc::new(indexes);
        *cached = Some((generation, indexes.clone()));
        Ok(indexes)
    }

    /// Sets how the dense index is built (takes effect at the next rebuild).
    pub fn set_dense_options(&mut self, options: DenseOptions) {
        self.dense_options = options;
        *self.dense.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    fn build_query(&self, req: &SearchRequest<'_>) -> Result<Box<dyn Query>, RagError> {
        let mut analyzer = self.analyzer.clone();
        let words = terms(&mut analyzer, req.query);
        if words.is_empty() {
            return Err(RagError::EmptyQuery);
        }
        let mut should: Vec<(Occur, Box<dyn Query>)> = Vec::with_capacity(words.len() * 2);
        for w in &words {
            for field in [self.fields.title, self.fields.text] {
                should.push((
                    Occur::Should,
                    Box::new(TermQuery::new(Term::from_field_text(field, w), IndexRecordOption::WithFreqs)),
                ));
            }
        }
        let text_query: Box<dyn Query> = Box::new(BooleanQuery::new(should));
        Ok(if req.filters.is_empty() {
            text_query
        } else {
            let mut must = vec![(Occur::Must, text_query)];
            for f in req.filters {
                must.push((Occur::Must, self.filter_query(f)));
            }
            Box::new(BooleanQuery::new(must))
        })
    }

    /// The chunk ids of a document, in order (for tests and tools).
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn chunks_of(&self, doc_id: &str) -> Result<Vec<Chunk>, RagError> {
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

    fn filter_query(&self, filter: &Filter) -> Box<dyn Query> {
        let field = self.fields.meta;
        let path_term = |key: &str| Term::from_field_json_path(field, key, false);
        let value_terms = |key: &str, v: &Value| -> Vec<Term> {
            let mut out = Vec::new();
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let mut t = path_term(key);
            t.append_type_and_str(&text.to_lowercase());
            out.push(t);
            // Numbers are indexed as f64; a command-line "3" must still find a JSON 3.
            if let Ok(f) = text.trim().parse::<f64>() {
                let mut t = path_term(key);
                t.append_type_and_fast_value(f);
                out.push(t);
            }
            if let Ok(b) = text.trim().parse::<bool>() {
                let mut t = path_term(key);
                t.append_type_and_fast_value(b);
                out.push(t);
            }
            out
        };
        let any = |terms: Vec<Term>| -> Box<dyn Query> {
            Box::new(BooleanQuery::new(
                terms
                    .into_iter()
                    .map(|t| (Occur::Should, Box::new(TermQuery::new(t, IndexRecordOption::Basic)) as Box<dyn Query>))
                    .collect(),
            ))
        };
        match filter {
            Filter::Eq { key, value } => any(value_terms(key, value)),
            Filter::AnyOf { key, values } => any(values.iter().flat_map(|v| value_terms(key, v)).collect()),
            Filter::Range { key, lower, upper } => {
                let bound = |b: Option<(f64, bool)>| match b {
                    None => Bound::Unbounded,
                    Some((v, inc)) => {
                        let mut t = path_term(key);
                        t.append_type_and_fast_value(v);
                        if inc { Bound::Included(t) } else { Bound::Excluded(t) }
                    }
                };
                Box::new(RangeQuery::new(bound(*lower), bound(*upper)))
            }
        }
    }

    fn chunk_from(&self, doc: &TantivyDocument) -> Chunk {
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

/// One ingest's changes; nothing is visible until [`KbWriter::commit`].
pub struct KbWriter<'a> {
    kb: &'a KnowledgeBase,
    writer: IndexWriter,
}

impl KbWriter<'_> {
    /// Replaces every chunk of `source` with `chunks`, recording `hash`.
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn replace_source(&mut self, source: &str, hash: &str, chunks: &[Chunk]) -> Result<(), RagError> {
        self.replace_source_embedded(source, hash, chunks, None)
    }

    /// Like [`KbWriter::replace_source`], storing each chunk's vector with it.
    ///
    /// # Errors
    /// [`RagError::Mismatch`] when the vectors do not match the chunks or the knowledge base's
    /// embedding settings; tantivy failures.
    pub fn replace_source_embedded(
        &mut self,
        source: &str,
        hash: &str,
        chunks: &[Chunk],
        vectors: Option<&[Vec<f32>]>,
    ) -> Result<(), RagError> {
        let f = self.kb.fields;
        let dim = self.kb.manifest.embedding.as_ref().map(|e| e.dimension);
        match (vectors, dim) {
            (Some(v), Some(d)) if v.len() == chunks.len() && v.iter().all(|x| x.len() == d) => {}
            (None, None) => {}
            (None, Some(_)) if chunks.is_empty() => {}
            _ => {
                return Err(RagError::Mismatch(format!(
                    "{source}: knowledge base `{}` {} but the chunks come {}",
                    self.kb.manifest.name,
                    dim.map_or("stores no vectors".to_owned(), |d| format!("stores {d}-dimension vectors")),
                    vectors.map_or("without vectors".to_owned(), |v| format!(
                        "with {} vectors of {} dimensions",
                        v.len(),
                        v.first().map_or(0, Vec::len)
                    ))
                )));
            }
        }
        self.writer.delete_term(Term::from_field_text(f.source, source));
        for (i, c) in chunks.iter().enumerate() {
            let mut doc = TantivyDocument::default();
            doc.add_text(f.chunk_id, &c.id);
            doc.add_text(f.doc_id, &c.doc_id);
            doc.add_text(f.source, source);
            doc.add_text(f.source_hash, hash);
            let title =
                if c.headings.is_empty() { c.title.clone() } else { format!("{} {}", c.title, c.headings.join(" ")) };
            doc.add_text(f.title, &title);
            doc.add_text(f.doc_title, &c.title);
            doc.add_text(f.text, &c.text);
            doc.add_text(f.headings, serde_json::to_string(&c.headings).unwrap_or_else(|_| "[]".into()));
            doc.add_text(f.citation, &c.citation);
            doc.add_text(f.part, format!("{}/{}", c.part.0, c.part.1));
            doc.add_text(f.meta_json, serde_json::to_string(&c.meta).unwrap_or_else(|_| "{}".into()));
            doc.add_object(f.meta, filterable(&c.meta));
            if let Some(v) = vectors.and_then(|v| v.get(i)) {
                doc.add_bytes(f.vector, &encode_vector(v));
            }
            self.writer.add_document(doc)?;
        }
        Ok(())
    }

    /// Removes every chunk of `source`.
    pub fn remove_source(&mut self, source: &str) {
        self.writer.delete_term(Term::from_field_text(self.kb.fields.source, source));
    }

    /// Makes the ingest durable and visible, atomically.
    ///
    /// # Errors
    /// When tantivy fails (the previous index stays as it was).
    pub fn commit(mut self) -> Result<(), RagError> {
        self.writer.commit()?;
        // One segment searches fastest; knowledge bases are small enough to merge whole.
        let segments = self.kb.index.searchable_segment_ids()?;
        if segments.len() > 1 {
            self.writer.merge(&segments).wait()?;
        }
        self.writer.wait_merging_threads()?;
        self.kb.reader.reload()?;
        Ok(())
    }
}

/// A vector as stored: little-endian f32s.
pub(crate) fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The inverse of [`encode_vector`].
pub(crate) fn decode_vector(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Metadata as the filter index sees it: every number an f64 (tantivy keeps one numeric
/// column type per path; mixing `3` and `2.5` would split it), strings as they are.
fn filterable(meta: &Map<String, Value>) -> std::collections::BTreeMap<String, tantivy::schema::OwnedValue> {
    use tantivy::schema::OwnedValue;
    fn convert(v: &Value) -> OwnedValue {
        match v {
            Value::Number(n) => n.as_f64().map_or(OwnedValue::Null, OwnedValue::F64),
            Value::Array(items) => OwnedValue::Array(items.iter().map(convert).collect()),
            Value::Object(m) => OwnedValue::Object(m.iter().map(|(k, v)| (k.clone(), convert(v))).collect()),
            other => OwnedValue::from(other.clone()),
        }
    }
    meta.iter().map(|(k, v)| (k.clone(), convert(v))).collect()
}

/// Finds and opens knowledge bases under a root directory (`<data_dir>/kb`).
#[derive(Debug)]
pub struct KbStore {
    root: PathBuf,
    open: Mutex<HashMap<(String, String), Arc<KnowledgeBase>>>,
    dense_options: DenseOptions,
}

/// Checks a tenant or knowledge-base name: 1–64 of `A-Za-z0-9_.-`, not starting with a dot
/// (names become directories).
///
/// # Errors
/// [`RagError::InvalidName`].
pub fn validate_name(what: &str, name: &str) -> Result<(), RagError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(RagError::InvalidName(format!(
            "{what} `{name}`: use 1-64 letters, digits, `_`, `-` or `.`, not starting with `.`"
        )))
    }
}

impl KbStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), open: Mutex::new(HashMap::new()), dense_options: DenseOptions::default() }
    }

    /// Sets how knowledge bases opened from now on build their dense index.
    #[must_use]
    pub fn with_dense_options(mut self, options: DenseOptions) -> Self {
        self.dense_options = options;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, tenant: &str, name: &str) -> PathBuf {
        self.root.join(tenant).join(name)
    }

    /// Opens an existing knowledge base (cached: later calls share one reader).
    ///
    /// # Errors
    /// [`RagError::UnknownKb`], [`RagError::InvalidName`], or a manifest the build cannot read.
    pub fn open(&self, tenant: &str, name: &str) -> Result<Arc<KnowledgeBase>, RagError> {
        validate_name("tenant", tenant)?;
        validate_name("knowledge base", name)?;
        let key = (tenant.to_owned(), name.to_owned());
        if let Some(kb) = self.lock().get(&key) {
            return Ok(kb.clone());
        }
        let dir = self.dir(tenant, name);
        let manifest_path = dir.join("kb.json");
        let raw = match std::fs::read_to_string(&manifest_path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RagError::UnknownKb { tenant: tenant.to_owned(), name: name.to_owned() });
            }
            Err(e) => return Err(io_err(&manifest_path, &e)),
        };
        let manifest: KbManifest = serde_json::from_str(&raw)
            .map_err(|e| RagError::Manifest { path: manifest_path.display().to_string(), reason: e.to_string() })?;
        if let Some(reason) = manifest.embedding.as_ref().and_then(EmbeddingSettings::inconsistency) {
            return Err(RagError::Manifest { path: manifest_path.display().to_string(), reason });
        }
        if manifest.format != KB_FORMAT {
            let reason = if manifest.format > KB_FORMAT {
                format!("format {} is newer than this build reads ({KB_FORMAT}); upgrade toolgraph", manifest.format)
            } else {
                format!(
                    "format {} predates this build's format {KB_FORMAT} (chunks with embeddings); delete {} and ingest \
                     the documents again",
                    manifest.format,
                    dir.display()
                )
            };
            return Err(RagError::Manifest { path: manifest_path.display().to_string(), reason });
        }
        let (schema, fields) = schema(manifest.analyzer);
        let index_dir = dir.join("index");
        std::fs::create_dir_all(&index_dir).map_err(|e| io_err(&index_dir, &e))?;
        let directory = MmapDirectory::open(&index_dir)
            .map_err(|e| RagError::Io { path: index_dir.display().to_string(), reason: e.to_string() })?;
        let index = Index::open_or_create(directory, schema)?;
        let mut kb = KnowledgeBase::finish_open(manifest, Some(dir), index, fields)?;
        kb.set_dense_options(self.dense_options);
        let kb = Arc::new(kb);
        self.lock().insert(key, kb.clone());
        Ok(kb)
    }

    /// Opens a knowledge base, creating it with `manifest` when it does not exist. An existing
    /// one keeps its analyzer; asking for a different one is refused.
    ///
    /// # Errors
    /// [`RagError::Mismatch`] when an explicit analyzer differs; I/O and index failures.
    pub fn open_or_create(
        &self,
        manifest: KbManifest,
        explicit_analyzer: bool,
    ) -> Result<Arc<KnowledgeBase>, RagError> {
        match self.open(&manifest.tenant, &manifest.name) {
            Ok(kb) => {
                if explicit_analyzer && kb.manifest.analyzer != manifest.analyzer {
                    return Err(RagError::Mismatch(format!(
                        "knowledge base `{}` was built with the {} analyzer, not {}; ingest into a new knowledge base to change it",
                        manifest.name,
                        kb.manifest.analyzer.code(),
                        manifest.analyzer.code()
                    )));
                }
                Ok(kb)
            }
            Err(RagError::UnknownKb { .. }) => {
                let dir = self.dir(&manifest.tenant, &manifest.name);
                std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, &e))?;
                write_manifest(&dir, &manifest)?;
                self.open(&manifest.tenant, &manifest.name)
            }
            Err(e) => Err(e),
        }
    }

    /// Records a new manifest (e.g. a changed record mapping) for an open knowledge base.
    ///
    /// # Errors
    /// I/O failures.
    pub fn update_manifest(&self, manifest: &KbManifest) -> Result<(), RagError> {
        let dir = self.dir(&manifest.tenant, &manifest.name);
        write_manifest(&dir, manifest)?;
        self.lock().remove(&(manifest.tenant.clone(), manifest.name.clone()));
        Ok(())
    }

    /// The knowledge bases of a tenant, by name.
    ///
    /// # Errors
    /// I/O failures other than a missing directory.
    pub fn list(&self, tenant: &str) -> Result<Vec<String>, RagError> {
        validate_name("tenant", tenant)?;
        let dir = self.root.join(tenant);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&dir, &e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join("kb.json").is_file())
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<KnowledgeBase>>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts).
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn write_manifest(dir: &Path, manifest: &KbManifest) -> Result<(), RagError> {
    let path = dir.join("kb.json");
    let tmp = dir.join("kb.json.tmp");
    let body = serde_json::to_vec_pretty(manifest)
        .map_err(|e| RagError::Manifest { path: path.display().to_string(), reason: e.to_string() })?;
    std::fs::write(&tmp, body).map_err(|e| io_err(&tmp, &e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, &e))
}

fn io_err(path: &Path, e: &std::io::Error) -> RagError {
    RagError::Io { path: path.display().to_string(), reason: e.to_string() }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl KbManifest {
    /// A new manifest with default chunking and mapping.
    pub fn new(tenant: &str, name: &str, analyzer: Analyzer) -> Self {
        Self {
            format: KB_FORMAT,
            tenant: tenant.to_owned(),
            name: name.to_owned(),
            analyzer,
            chunking: ChunkingOptions::default(),
            mapping: RecordMapping::default(),
            embedding: None,
            created_at: now_secs(),
        }
    }
}
