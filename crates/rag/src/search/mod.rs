//! The search stage: [`SearchRequest`]s over a knowledge base ranked by BM25, by one model's
//! dense list or by the [`fusion`] of all lists, with metadata [`Filter`]s applied inside every
//! list's search (never to a truncated result); [`Retriever`] picks the mode and embeds the
//! query, [`citation`] turns hits into checked `[label]` markers, and [`grounding`] checks a
//! reply against what was retrieved; both attribute a sentence to its passage by
//! [`attribution`].

pub mod attribution;
pub mod citation;
pub mod fusion;
pub mod grounding;
mod paired_facts;
mod request;
mod retriever;

pub use citation::{CitationReport, check_citations, cite};
// Declared with the index it selects on (the Qdrant collection translates it too).
pub use crate::index::Filter;
pub use fusion::{Fusion, FusionMethod, ListRank, SearchMode, fuse, fuse_many};
pub use request::{
    DEFAULT_TOP_K, MAX_QUERY_CHARS, MAX_TOP_K, SearchFailure, SearchQuery, hit_json, results_json, search_json,
};
pub use retriever::Retriever;

use crate::RagError;
use crate::index::{Chunk, KnowledgeBase, terms};
use std::collections::HashMap;
use tantivy::collector::{DocSetCollector, TopDocs};
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::IndexRecordOption;
use tantivy::{DocAddress, Searcher, TantivyDocument, Term};

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

impl KnowledgeBase {
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
        if let Some(remote) = &self.remote {
            return self.remote_hits(remote, req, ranking, false).map_err(|e| self.gone(e));
        }
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
        if let Some(remote) = &self.remote {
            let hits = self.remote_hits(remote, req, ranking, true).map_err(|e| self.gone(e))?;
            return Ok(hits.into_iter().map(|h| (h.chunk.doc_id, h.score)).collect());
        }
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
        let embedding = self.check_query_vector(vector)?;
        let indexes = self.dense_indexes(searcher, embedding)?;
        let filter_rows = if filters.is_empty() {
            None
        } else {
            let query =
                BooleanQuery::new(filters.iter().map(|f| (Occur::Must, f.index_query(self.fields.meta))).collect());
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

    /// A Qdrant 404 (the collection was deleted meanwhile, by another process) as the unknown
    /// knowledge base it now is.
    fn gone(&self, e: RagError) -> RagError {
        match e {
            RagError::Qdrant(m) if m.starts_with("404") => {
                RagError::UnknownKb { tenant: self.manifest.tenant.clone(), name: self.manifest.name.clone() }
            }
            other => other,
        }
    }

    /// The knowledge base's embedding settings, when `vector` can search them.
    fn check_query_vector(&self, vector: &[f32]) -> Result<&toolgraph_embed::EmbeddingSettings, RagError> {
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
        Ok(embedding)
    }

    /// A search of a knowledge base on Qdrant: its lists read there, fused here as the
    /// embedded index fuses its own.
    fn remote_hits(
        &self,
        remote: &crate::index::qdrant::QdrantIndex,
        req: &SearchRequest<'_>,
        ranking: Ranking<'_>,
        ids_only: bool,
    ) -> Result<Vec<Hit>, RagError> {
        let top_k = req.top_k.max(1);
        let mut analyzer = self.analyzer.clone();
        let words = terms(&mut analyzer, req.query);
        let query = |terms, vector, depth, all_models| crate::index::qdrant::ListsQuery {
            terms,
            vector,
            filters: req.filters,
            depth,
            all_models,
            ids_only,
        };
        let as_hits = |list: Vec<(String, f32)>, chunks: &mut HashMap<String, Chunk>, bm25: bool| -> Vec<Hit> {
            list.into_iter()
                .take(top_k)
                .enumerate()
                .filter_map(|(i, (id, score))| {
                    let rank = Some(ListRank { rank: i + 1, score });
                    let (b, d) = if bm25 { (rank, None) } else { (None, rank) };
                    Some(Hit { chunk: chunks.remove(&id)?, score, bm25: b, dense: d, more_dense: Vec::new() })
                })
                .collect()
        };
        match ranking {
            Ranking::Bm25 => {
                if words.is_empty() {
                    return Err(RagError::EmptyQuery);
                }
                let crate::index::qdrant::Lists { keyword, mut chunks, .. } =
                    remote.lists(&query(Some(&words), None, top_k, false), &self.manifest)?;
                Ok(as_hits(keyword.unwrap_or_default(), &mut chunks, true))
            }
            Ranking::Dense(vector) => {
                self.check_query_vector(vector)?;
                let crate::index::qdrant::Lists { dense, mut chunks, .. } =
                    remote.lists(&query(None, Some(vector), top_k, false), &self.manifest)?;
                Ok(as_hits(dense.into_iter().next().unwrap_or_default(), &mut chunks, false))
            }
            Ranking::Hybrid(vector, fusion) => {
                self.check_query_vector(vector)?;
                let depth = fusion.depth.max(top_k);
                // A query of stopwords only still has a meaning: rank it by the dense lists alone.
                let keywords = (!words.is_empty()).then_some(words.as_slice());
                let crate::index::qdrant::Lists { keyword, dense, mut chunks } =
                    remote.lists(&query(keywords, Some(vector), depth, true), &self.manifest)?;
                // Fused on small integer keys: each point id's place in `ids`.
                let mut ids: Vec<String> = Vec::new();
                let mut index: HashMap<String, usize> = HashMap::new();
                let mut keyed = |list: Vec<(String, f32)>| -> Vec<(usize, f32)> {
                    list.into_iter()
                        .map(|(id, score)| {
                            let next = ids.len();
                            let k = *index.entry(id.clone()).or_insert_with(|| {
                                ids.push(id);
                                next
                            });
                            (k, score)
                        })
                        .collect()
                };
                let keyword = keyed(keyword.unwrap_or_default());
                let dense: Vec<Vec<(usize, f32)>> = dense.into_iter().map(&mut keyed).collect();
                let dense: Vec<&[(usize, f32)]> = dense.iter().map(Vec::as_slice).collect();
                Ok(fuse_many(&keyword, &dense, &fusion)
                    .into_iter()
                    .take(top_k)
                    .filter_map(|f| {
                        Some(Hit {
                            chunk: chunks.remove(ids.get(f.key)?)?,
                            score: f.score,
                            bm25: f.bm25,
                            dense: f.dense,
                            more_dense: f.more_dense,
                        })
                    })
                    .collect())
            }
        }
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
                must.push((Occur::Must, f.index_query(self.fields.meta)));
            }
            Box::new(BooleanQuery::new(must))
        })
    }
}
