//! A knowledge base's index on a Qdrant server (docs/retrieval.md, "Knowledge bases on
//! Qdrant"): one collection per tenant and knowledge base, every replica searching the same.
//!
//! Each chunk is a point: a named dense vector per embedding model, one sparse vector for
//! keyword search (`keywords`: the title's terms on even indexes, the text's on odd ones, as
//! the embedded index has two keyword fields) made of the knowledge base's own analyzer's
//! terms — so Vietnamese, Spanish and Korean keep their tokenisation — with BM25's
//! term-frequency part as values and Qdrant's `idf` modifier supplying the other half (per
//! index, so per field), and the chunk itself as payload (metadata filters run on a
//! lower-cased copy, as the embedded index compares strings without case). The manifest
//! lives in the collection's metadata, so a replica that never ingested opens the knowledge
//! base from the collection alone.
//!
//! One batched query reads every list (the keyword list and each model's dense list, each
//! filtered inside Qdrant); a query term is sought in both fields at once, so a chunk's
//! keyword score is the two fields' sum, as in the embedded index, and the lists are fused
//! here with the same [`fuse_many`](crate::search::fuse_many) — so the fusion's weights and
//! depth apply and each hit keeps its place in every list, which
//! Qdrant's own fusion reports neither of.
//!
//! Talks REST through the blocking HTTP client rag already has (no second TLS stack).

use crate::RagError;
use crate::index::{Chunk, DocumentInfo, Filter, KbManifest};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::time::Duration;

/// BM25's term-frequency saturation (tantivy's values).
const K1: f32 = 1.2;
/// BM25's length normalisation.
const B: f32 = 0.75;
/// Points per upsert request.
const UPSERT_BATCH: usize = 256;
/// Points per scroll page.
const SCROLL_PAGE: usize = 1000;
/// The collection-metadata key toolgraph keeps its manifest and keyword statistics under.
const METADATA_KEY: &str = "toolgraph";

/// Where the Qdrant server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QdrantOptions {
    /// REST base URL, e.g. `http://qdrant:6333`.
    pub url: String,
    /// `api-key` header, when the server wants one.
    pub api_key: Option<String>,
    /// Time limit of each request.
    pub timeout: Duration,
    /// Prefix of collection names (`<prefix><tenant length>_<tenant>_<kb>`).
    pub prefix: String,
}

impl QdrantOptions {
    /// The server at `url`, with a 30 s time limit and the `tg_` prefix.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), api_key: None, timeout: Duration::from_secs(30), prefix: "tg_".into() }
    }

    /// The collection of a tenant's knowledge base. The tenant's length comes first: names
    /// may contain `_` (validate_name), and without it tenant `a` with knowledge base `b_c` and
    /// tenant `a_b` with `c` would share a collection.
    pub fn collection(&self, tenant: &str, kb: &str) -> String {
        format!("{}{}_{tenant}_{kb}", self.prefix, tenant.len())
    }
}

/// Keyword statistics of a collection: chunks and terms per field, for BM25's average
/// lengths.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct KeywordStats {
    chunks: u64,
    title_terms: u64,
    text_terms: u64,
}

impl KeywordStats {
    fn avg(&self, terms: u64) -> f32 {
        if self.chunks == 0 { 1.0 } else { (terms as f32 / self.chunks as f32).max(1.0) }
    }
}

/// A knowledge base's collection.
#[derive(Debug)]
pub(crate) struct QdrantIndex {
    http: reqwest::blocking::Client,
    options: QdrantOptions,
    collection: String,
    tenant: String,
    /// The dense vector name of each embedding model, in the manifest's order.
    vectors: Vec<String>,
    keywords: KeywordLayout,
    stats: std::sync::Mutex<KeywordStats>,
}

/// A dense vector's name for a model id (`intfloat/multilingual-e5-small` →
/// `intfloat_multilingual-e5-small`).
fn vector_name(model: &str) -> String {
    model.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// A term's index in one field's sparse vector: 32-bit FNV-1a of its text (stable across
/// processes and versions; a collision merges two terms, about one pair in a few million).
fn term_index(term: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in term.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A point id for a chunk: a UUID from the hash of its knowledge base, source and id (two
/// sources may hold records with the same id, which the embedded index keeps apart too).
fn point_id(collection: &str, source: &str, chunk_id: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("{collection}\u{0}{source}\u{0}{chunk_id}").as_bytes());
    let h = hex::encode(&d[..16]);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Term counts of `terms`, as sparse-vector indices.
fn counts(terms: &[String]) -> HashMap<u32, f32> {
    let mut out: HashMap<u32, f32> = HashMap::new();
    for t in terms {
        *out.entry(term_index(t)).or_default() += 1.0;
    }
    out
}

/// The keyword field a term was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// The document title and the chunk's headings.
    Title = 0,
    /// The chunk's text.
    Text = 1,
}

/// A term's index in [`KEYWORDS`]: the field in the lowest bit, so the two fields never share
/// an index and Qdrant's idf of each index is that field's (the hash keeps 31 of its bits).
fn field_index(term_index: u32, field: Field) -> u32 {
    (term_index << 1) | field as u32
}

/// A document field's BM25 term-frequency part of each term, times `k1 + 1` (tantivy's
/// weight; Qdrant multiplies by the idf), by [`term_index`].
fn doc_weights(terms: &[String], avgdl: f32) -> impl Iterator<Item = (u32, f32)> {
    let dl = terms.len() as f32;
    let norm = K1 * (1.0 - B + B * dl / avgdl);
    counts(terms).into_iter().map(move |(i, tf)| (i, tf * (K1 + 1.0) / (tf + norm)))
}

/// A sparse vector of `(index, value)` pairs (indexes distinct).
fn sparse(pairs: impl Iterator<Item = (u32, f32)>) -> Value {
    let (indices, values): (Vec<u32>, Vec<f32>) = pairs.unzip();
    json!({ "indices": indices, "values": values })
}

/// A document field's sparse vector of [`KeywordLayout::PerField`].
fn doc_sparse(terms: &[String], avgdl: f32) -> Value {
    sparse(doc_weights(terms, avgdl))
}

/// A chunk's [`KEYWORDS`] vector: both fields' weights, each at its field's indexes.
fn doc_keywords(title: &[String], avg_title: f32, text: &[String], avg_text: f32) -> Value {
    let title = doc_weights(title, avg_title).map(|(i, w)| (field_index(i, Field::Title), w));
    let text = doc_weights(text, avg_text).map(|(i, w)| (field_index(i, Field::Text), w));
    sparse(title.chain(text))
}

/// A query's sparse vector of [`KeywordLayout::PerField`]: each term once, valued by how
/// often the query says it.
fn query_sparse(terms: &[String]) -> Value {
    sparse(counts(terms).into_iter())
}

/// A query's [`KEYWORDS`] vector: each term once in each field, valued by how often the query
/// says it — the dot product is the title's BM25 score plus the text's.
fn query_keywords(terms: &[String]) -> Value {
    let counts = counts(terms);
    let title = counts.iter().map(|(&i, &c)| (field_index(i, Field::Title), c));
    let text = counts.iter().map(|(&i, &c)| (field_index(i, Field::Text), c));
    sparse(title.chain(text))
}

/// Strings lower-cased (nested objects and arrays too), for case-insensitive filters.
fn lower(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(s.to_lowercase()),
        Value::Array(a) => Value::Array(a.iter().map(lower).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), lower(v))).collect()),
        other => other.clone(),
    }
}

/// The conditions a value of a filter matches, on the lower-cased metadata: the string (as
/// the embedded index compares them), and the number or boolean it reads as.
fn value_conditions(key: &str, v: &Value) -> Vec<Value> {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let path = format!("meta_lc.{key}");
    let mut out = vec![json!({ "key": path, "match": { "value": text.to_lowercase() } })];
    if let Ok(n) = text.trim().parse::<f64>() {
        out.push(json!({ "key": path, "range": { "gte": n, "lte": n } }));
    }
    if let Ok(b) = text.trim().parse::<bool>() {
        out.push(json!({ "key": path, "match": { "value": b } }));
    }
    out
}

/// A Qdrant filter: the tenant, and every metadata filter.
fn qdrant_filter(tenant: &str, filters: &[Filter]) -> Value {
    let mut must = vec![json!({ "key": "tenant", "match": { "value": tenant } })];
    for f in filters {
        must.push(match f {
            Filter::Eq { key, value } => json!({ "should": value_conditions(key, value) }),
            Filter::AnyOf { key, values } => {
                json!({ "should": values.iter().flat_map(|v| value_conditions(key, v)).collect::<Vec<_>>() })
            }
            Filter::Range { key, lower, upper } => {
                let mut range = Map::new();
                if let Some((v, inclusive)) = lower {
                    range.insert(if *inclusive { "gte" } else { "gt" }.into(), json!(v));
                }
                if let Some((v, inclusive)) = upper {
                    range.insert(if *inclusive { "lte" } else { "lt" }.into(), json!(v));
                }
                json!({ "key": format!("meta_lc.{key}"), "range": range })
            }
        });
    }
    json!({ "must": must })
}

/// The chunk a point's payload holds.
fn chunk_of(payload: &Value) -> Chunk {
    let s = |k: &str| payload.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let part = payload.get("part").and_then(Value::as_array);
    let n = |i: usize| part.and_then(|p| p.get(i)).and_then(Value::as_u64).unwrap_or(0) as u32;
    Chunk {
        id: s("chunk_id"),
        doc_id: s("doc_id"),
        title: s("title"),
        headings: payload
            .get("headings")
            .and_then(Value::as_array)
            .map(|h| h.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default(),
        text: s("text"),
        meta: payload.get("meta").and_then(Value::as_object).cloned().unwrap_or_default(),
        citation: s("citation"),
        part: (n(0), n(1).max(1)),
    }
}

/// One pending replacement of a source's chunks.
#[derive(Debug)]
pub(crate) struct SourceUpdate {
    pub source: String,
    pub hash: String,
    pub chunks: Vec<Chunk>,
    pub vectors: Option<Vec<Vec<f32>>>,
}

/// What [`QdrantIndex::lists`] reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListsQuery<'a> {
    /// The query's analysed terms, for the keyword list (none: no keyword list).
    pub terms: Option<&'a [String]>,
    /// The query vector, for the dense lists (none: no dense list).
    pub vector: Option<&'a [f32]>,
    /// Metadata filters, applied inside every list.
    pub filters: &'a [Filter],
    /// How deep each list is read.
    pub depth: usize,
    /// Every model's dense list, not only the first.
    pub all_models: bool,
    /// Only each chunk's `doc_id`.
    pub ids_only: bool,
}

/// One ranked list: point id and score, best first.
pub(crate) type List = Vec<(String, f32)>;

/// How a collection holds its keyword vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeywordLayout {
    /// One sparse vector, `keywords`, both fields in it ([`field_index`]): one search scores
    /// every chunk with both fields' sum.
    Combined,
    /// Two sparse vectors, `title` and `text` (collections made before `keywords`), searched
    /// apart and summed here: a chunk outside one field's top `depth` misses that field's
    /// score, and which of the chunks tied at that cut get it is Qdrant's choice — ranks can
    /// differ from one run to the next (titles such as "Điều 45, Luật …" tie by the hundred).
    /// Still read and written; ingesting into a new collection moves to [`Self::Combined`].
    PerField,
}

impl KeywordLayout {
    /// The layout of a collection, from its `GET /collections/{name}` answer.
    fn of(info: &Value) -> Self {
        let sparse = &info["result"]["config"]["params"]["sparse_vectors"];
        if sparse.get("title").is_some() && sparse.get(KEYWORDS).is_none() { Self::PerField } else { Self::Combined }
    }
}

/// The sparse vector of [`KeywordLayout::Combined`].
const KEYWORDS: &str = "keywords";

/// What [`QdrantIndex::lists`] read.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    /// The keyword list, when terms were given.
    pub keyword: Option<List>,
    /// Each model's dense list, when a vector was given.
    pub dense: Vec<List>,
    /// The chunks the lists name, by point id.
    pub chunks: HashMap<String, Chunk>,
}

impl QdrantIndex {
    fn client(options: &QdrantOptions) -> Result<reqwest::blocking::Client, RagError> {
        reqwest::blocking::Client::builder()
            .timeout(options.timeout)
            .build()
            .map_err(|e| RagError::Qdrant(format!("cannot build the HTTP client: {e}")))
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value, RagError> {
        call(&self.http, &self.options, method, path, body)
    }

    /// The collection of `tenant`'s knowledge base `name` and the manifest it records, if it
    /// exists.
    ///
    /// # Errors
    /// [`RagError::Qdrant`] when the server fails or is unreachable, or the collection is not
    /// one toolgraph made.
    pub(crate) fn open(
        options: &QdrantOptions,
        tenant: &str,
        name: &str,
    ) -> Result<Option<(Self, KbManifest)>, RagError> {
        let http = Self::client(options)?;
        let collection = options.collection(tenant, name);
        let info = match call(&http, options, reqwest::Method::GET, &format!("/collections/{collection}"), None) {
            Ok(info) => info,
            Err(RagError::Qdrant(e)) if e.starts_with("404") => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = &info["result"]["config"]["metadata"][METADATA_KEY];
        let manifest: KbManifest = serde_json::from_value(meta["manifest"].clone()).map_err(|e| {
            RagError::Qdrant(format!("collection `{collection}` has no toolgraph manifest in its metadata: {e}"))
        })?;
        if manifest.tenant != tenant || manifest.name != name {
            return Err(RagError::Qdrant(format!(
                "collection `{collection}` holds knowledge base `{}` of tenant `{}`, not `{name}` of `{tenant}`",
                manifest.name, manifest.tenant
            )));
        }
        let stats = serde_json::from_value(meta["stats"].clone()).unwrap_or_default();
        let index = Self::with(http, options, collection, tenant, &manifest, stats, KeywordLayout::of(&info));
        Ok(Some((index, manifest)))
    }

    fn with(
        http: reqwest::blocking::Client,
        options: &QdrantOptions,
        collection: String,
        tenant: &str,
        manifest: &KbManifest,
        stats: KeywordStats,
        keywords: KeywordLayout,
    ) -> Self {
        let vectors = manifest.embedding.as_ref().map(|e| e.models().iter().map(|m| vector_name(&m.model)).collect());
        Self {
            http,
            options: options.clone(),
            collection,
            tenant: tenant.to_owned(),
            vectors: vectors.unwrap_or_default(),
            keywords,
            stats: std::sync::Mutex::new(stats),
        }
    }

    /// Creates the collection for `manifest` (a dense vector per model, the keyword sparse
    /// vector, payload indexes for the tenant, the source and the document).
    ///
    /// # Errors
    /// [`RagError::Qdrant`] when the server refuses or fails.
    pub(crate) fn create(options: &QdrantOptions, manifest: &KbManifest) -> Result<Self, RagError> {
        let http = Self::client(options)?;
        let collection = options.collection(&manifest.tenant, &manifest.name);
        let dense: Map<String, Value> = manifest
            .embedding
            .iter()
            .flat_map(|e| e.models())
            .map(|m| (vector_name(&m.model), json!({ "size": m.dimension, "distance": "Cosine" })))
            .collect();
        let body = json!({
            "vectors": dense,
            "sparse_vectors": { KEYWORDS: { "modifier": "idf" } },
            "metadata": { METADATA_KEY: { "manifest": manifest, "stats": KeywordStats::default() } },
        });
        call(&http, options, reqwest::Method::PUT, &format!("/collections/{collection}"), Some(&body))?;
        for (field, schema) in [
            ("tenant", json!({ "type": "keyword", "is_tenant": true })),
            ("source", json!("keyword")),
            ("doc_id", json!("keyword")),
            ("ingest", json!("keyword")),
            ("complete", json!("bool")),
        ] {
            let body = json!({ "field_name": field, "field_schema": schema });
            let path = format!("/collections/{collection}/index?wait=true");
            call(&http, options, reqwest::Method::PUT, &path, Some(&body))?;
        }
        Ok(Self::with(
            http,
            options,
            collection,
            &manifest.tenant,
            manifest,
            KeywordStats::default(),
            KeywordLayout::Combined,
        ))
    }

    /// Records `manifest` in the collection's metadata (a changed record mapping, say).
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn update_manifest(&self, manifest: &KbManifest) -> Result<(), RagError> {
        let stats = *self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.write_metadata(manifest, stats)
    }

    fn write_metadata(&self, manifest: &KbManifest, stats: KeywordStats) -> Result<(), RagError> {
        let body = json!({ "metadata": { METADATA_KEY: { "manifest": manifest, "stats": stats } } });
        self.call(reqwest::Method::PATCH, &format!("/collections/{}", self.collection), Some(&body)).map(|_| ())
    }

    /// Deletes the collection.
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn drop_collection(&self) -> Result<(), RagError> {
        self.call(reqwest::Method::DELETE, &format!("/collections/{}", self.collection), None).map(|_| ())
    }

    /// Knowledge-base names of `tenant` on the server.
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn list(options: &QdrantOptions, tenant: &str) -> Result<Vec<String>, RagError> {
        let http = Self::client(options)?;
        let all = call(&http, options, reqwest::Method::GET, "/collections", None)?;
        let prefix = options.collection(tenant, "");
        Ok(all["result"]["collections"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|c| c["name"].as_str()?.strip_prefix(&prefix).map(str::to_owned))
                    .filter(|n| !n.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Applies one ingest's replacements: each source's old points deleted, its chunks
    /// upserted with their vectors and keyword vectors (BM25 lengths averaged over what the
    /// collection held plus this ingest), and the statistics and `manifest` recorded.
    ///
    /// # Errors
    /// [`RagError::Qdrant`]; [`RagError::Mismatch`] for vectors that do not fit.
    pub(crate) fn apply(
        &self,
        updates: &[SourceUpdate],
        removed: &[String],
        analyzer: &mut tantivy::tokenizer::TextAnalyzer,
        manifest: &KbManifest,
    ) -> Result<(), RagError> {
        // This ingest's points carry its id and `complete: false` until every one is written;
        // then the sources' other points (their previous versions, or an earlier ingest's that
        // failed part-way) go, and the new ones are marked complete. A source whose hash is read
        // only from complete points is ingested again after any failure on the way.
        let ingest_id = {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            format!("{}-{nanos}", std::process::id())
        };
        if !removed.is_empty() {
            let filter = json!({ "must": [
                { "key": "tenant", "match": { "value": self.tenant } },
                { "key": "source", "match": { "any": removed } },
            ]});
            self.delete_points(&filter)?;
        }
        // Terms of every chunk's two keyword fields, as the embedded index analyses them.
        let mut analysed = Vec::new();
        let mut stats = *self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for u in updates {
            for c in &u.chunks {
                let title = if c.headings.is_empty() {
                    c.title.clone()
                } else {
                    format!("{} {}", c.title, c.headings.join(" "))
                };
                let (title, text) = (crate::index::terms(analyzer, &title), crate::index::terms(analyzer, &c.text));
                stats.chunks += 1;
                stats.title_terms += title.len() as u64;
                stats.text_terms += text.len() as u64;
                analysed.push((title, text));
            }
        }
        let (avg_title, avg_text) = (stats.avg(stats.title_terms), stats.avg(stats.text_terms));
        let mut points = Vec::with_capacity(UPSERT_BATCH);
        let mut terms = analysed.into_iter();
        for u in updates {
            for (i, c) in u.chunks.iter().enumerate() {
                let (title, text) = terms.next().unwrap_or_default();
                let mut vector = Map::new();
                match self.keywords {
                    KeywordLayout::Combined => {
                        vector.insert(KEYWORDS.into(), doc_keywords(&title, avg_title, &text, avg_text));
                    }
                    KeywordLayout::PerField => {
                        vector.insert("title".into(), doc_sparse(&title, avg_title));
                        vector.insert("text".into(), doc_sparse(&text, avg_text));
                    }
                }
                if let Some(v) = u.vectors.as_ref().and_then(|v| v.get(i)) {
                    let mut offset = 0;
                    let models = manifest.embedding.as_ref().map(|e| e.models().to_vec()).unwrap_or_default();
                    for (name, model) in self.vectors.iter().zip(&models) {
                        let part = v.get(offset..offset + model.dimension).ok_or_else(|| {
                            RagError::Mismatch(format!("{}: a vector is shorter than the models' dimensions", u.source))
                        })?;
                        offset += model.dimension;
                        vector.insert(name.clone(), json!(part));
                    }
                }
                points.push(json!({
                    "id": point_id(&self.collection, &u.source, &c.id),
                    "vector": vector,
                    "payload": {
                        "tenant": self.tenant,
                        "chunk_id": c.id,
                        "doc_id": c.doc_id,
                        "source": u.source,
                        "source_hash": u.hash,
                        "ingest": ingest_id,
                        "complete": false,
                        "title": c.title,
                        "headings": c.headings,
                        "text": c.text,
                        "citation": c.citation,
                        "part": [c.part.0, c.part.1],
                        "meta": c.meta,
                        "meta_lc": lower(&Value::Object(c.meta.clone())),
                    },
                }));
                if points.len() >= UPSERT_BATCH {
                    self.upsert(std::mem::take(&mut points))?;
                }
            }
        }
        if !points.is_empty() {
            self.upsert(points)?;
        }
        let sources: Vec<&str> = updates.iter().map(|u| u.source.as_str()).collect();
        if !sources.is_empty() {
            let tenant = json!({ "key": "tenant", "match": { "value": self.tenant } });
            let of_sources = json!({ "key": "source", "match": { "any": sources } });
            let this_ingest = json!({ "key": "ingest", "match": { "value": ingest_id } });
            self.delete_points(
                &json!({ "must": [tenant.clone(), of_sources.clone()], "must_not": [this_ingest.clone()] }),
            )?;
            let body =
                json!({ "payload": { "complete": true }, "filter": { "must": [tenant, of_sources, this_ingest] } });
            let path = format!("/collections/{}/points/payload?wait=true", self.collection);
            self.call(reqwest::Method::POST, &path, Some(&body))?;
        }
        *self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = stats;
        self.write_metadata(manifest, stats)
    }

    fn delete_points(&self, filter: &Value) -> Result<(), RagError> {
        let path = format!("/collections/{}/points/delete?wait=true", self.collection);
        self.call(reqwest::Method::POST, &path, Some(&json!({ "filter": filter }))).map(|_| ())
    }

    fn upsert(&self, points: Vec<Value>) -> Result<(), RagError> {
        let path = format!("/collections/{}/points?wait=true", self.collection);
        self.call(reqwest::Method::PUT, &path, Some(&json!({ "points": points }))).map(|_| ())
    }

    /// The keyword list (both fields' scores summed) and each model's dense list (only the
    /// first unless `all`), each `depth` deep and filtered, read in one batched query; and
    /// the chunks they name, by point id (only their `doc_id` when `ids_only`: evaluations
    /// rank hundreds of hits per query).
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn lists(&self, q: &ListsQuery<'_>, manifest: &KbManifest) -> Result<Lists, RagError> {
        let ListsQuery { terms: query_terms, vector, filters, depth, all_models: all, ids_only } = *q;
        let filter = qdrant_filter(&self.tenant, filters);
        let payload = if ids_only { json!(["doc_id"]) } else { json!(true) };
        let mut searches = Vec::new();
        if let Some(terms) = query_terms {
            let (query, using): (Value, &[&str]) = match self.keywords {
                KeywordLayout::Combined => (query_keywords(terms), &[KEYWORDS]),
                KeywordLayout::PerField => (query_sparse(terms), &["title", "text"]),
            };
            for field in using {
                searches.push(json!({
                    "query": query, "using": field, "filter": filter, "limit": depth, "with_payload": payload,
                }));
            }
        }
        let mut dense_count = 0;
        if let Some(vector) = vector {
            let models = manifest.embedding.as_ref().map(|e| e.models().to_vec()).unwrap_or_default();
            let mut offset = 0;
            for (name, model) in self.vectors.iter().zip(&models).take(if all { usize::MAX } else { 1 }) {
                let part = vector.get(offset..offset + model.dimension).unwrap_or_default();
                offset += model.dimension;
                searches.push(json!({
                    "query": part, "using": name, "filter": filter, "limit": depth, "with_payload": payload,
                    "params": { "hnsw_ef": depth.max(128) },
                }));
                dense_count += 1;
            }
        }
        let path = format!("/collections/{}/points/query/batch", self.collection);
        let answer = self.call(reqwest::Method::POST, &path, Some(&json!({ "searches": searches })))?;
        let results = answer["result"].as_array().cloned().unwrap_or_default();
        let mut chunks = HashMap::new();
        let mut lists: Vec<List> = results
            .iter()
            .map(|r| {
                r["points"]
                    .as_array()
                    .map(|points| {
                        points
                            .iter()
                            .filter_map(|p| {
                                let id = p["id"].as_str()?.to_owned();
                                let score = p["score"].as_f64()? as f32;
                                chunks.entry(id.clone()).or_insert_with(|| chunk_of(&p["payload"]));
                                Some((id, score))
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let dense = lists.split_off(lists.len().saturating_sub(dense_count));
        let keyword = query_terms.map(|_| {
            // A chunk's keyword score is the sum of its fields' scores, as a should-query over
            // both fields of the embedded index scores it (one list holds both already, except
            // in a `PerField` collection).
            let mut sum: HashMap<String, f32> = HashMap::new();
            for list in &lists {
                for (id, score) in list {
                    *sum.entry(id.clone()).or_default() += score;
                }
            }
            let mut list: List = sum.into_iter().collect();
            list.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            list.truncate(depth);
            list
        });
        Ok(Lists { keyword, dense, chunks })
    }

    /// Every point of the knowledge base (or of one `source`), payload only, in pages.
    fn scroll(&self, extra: Option<Value>) -> Result<Vec<Value>, RagError> {
        let mut must = vec![json!({ "key": "tenant", "match": { "value": self.tenant } })];
        must.extend(extra);
        let mut out = Vec::new();
        let mut offset = Value::Null;
        loop {
            let body = json!({ "filter": { "must": must }, "limit": SCROLL_PAGE, "with_payload": true,
                               "with_vector": false, "offset": offset });
            let page = self.call(
                reqwest::Method::POST,
                &format!("/collections/{}/points/scroll", self.collection),
                Some(&body),
            )?;
            if let Some(points) = page["result"]["points"].as_array() {
                out.extend(points.iter().map(|p| p["payload"].clone()));
            }
            offset = page["result"]["next_page_offset"].clone();
            if offset.is_null() {
                return Ok(out);
            }
        }
    }

    /// How many chunks.
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn count(&self) -> Result<u64, RagError> {
        let body =
            json!({ "filter": { "must": [{ "key": "tenant", "match": { "value": self.tenant } }] }, "exact": true });
        let r =
            self.call(reqwest::Method::POST, &format!("/collections/{}/points/count", self.collection), Some(&body))?;
        Ok(r["result"]["count"].as_u64().unwrap_or(0))
    }

    /// The content hash recorded for `source`, if it is indexed.
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn source_hash(&self, source: &str) -> Result<Option<String>, RagError> {
        // Only a complete point's: an ingest that failed part-way left its points incomplete.
        let body = json!({ "filter": { "must": [
            { "key": "tenant", "match": { "value": self.tenant } },
            { "key": "source", "match": { "value": source } },
            { "key": "complete", "match": { "value": true } },
        ] }, "limit": 1, "with_payload": ["source_hash"] });
        let r =
            self.call(reqwest::Method::POST, &format!("/collections/{}/points/scroll", self.collection), Some(&body))?;
        Ok(r["result"]["points"][0]["payload"]["source_hash"].as_str().map(str::to_owned))
    }

    /// Every document: id, title, chunks, in id order.
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn documents(&self) -> Result<Vec<DocumentInfo>, RagError> {
        let mut docs: std::collections::BTreeMap<String, DocumentInfo> = std::collections::BTreeMap::new();
        for p in self.scroll(None)? {
            let c = chunk_of(&p);
            docs.entry(c.doc_id.clone())
                .or_insert_with(|| DocumentInfo { doc_id: c.doc_id, title: c.title, chunks: 0 })
                .chunks += 1;
        }
        Ok(docs.into_values().collect())
    }

    /// The chunks of a document, unordered.
    ///
    /// # Errors
    /// [`RagError::Qdrant`].
    pub(crate) fn chunks_of(&self, doc_id: &str) -> Result<Vec<Chunk>, RagError> {
        let extra = json!({ "key": "doc_id", "match": { "value": doc_id } });
        Ok(self.scroll(Some(extra))?.iter().map(chunk_of).collect())
    }
}

/// One REST call; a non-2xx answer becomes [`RagError::Qdrant`] starting with its status.
fn call(
    http: &reqwest::blocking::Client,
    options: &QdrantOptions,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, RagError> {
    let url = format!("{}{path}", options.url.trim_end_matches('/'));
    let mut request = http.request(method, &url);
    if let Some(key) = &options.api_key {
        request = request.header("api-key", key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response =
        request.send().map_err(|e| RagError::Qdrant(format!("cannot reach Qdrant at {}: {e}", options.url)))?;
    let status = response.status();
    let text = response.text().map_err(|e| RagError::Qdrant(format!("Qdrant's answer was cut: {e}")))?;
    if !status.is_success() {
        let reason = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["status"]["error"].as_str().map(str::to_owned))
            .unwrap_or(text);
        return Err(RagError::Qdrant(format!("{} {path}: {reason}", status.as_u16())));
    }
    serde_json::from_str(&text).map_err(|e| RagError::Qdrant(format!("{path}: an answer that is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyword_vectors_weigh_terms_as_bm25_does() {
        let terms: Vec<String> = ["ley", "ley", "tráfico"].iter().map(|s| (*s).to_owned()).collect();
        let v = doc_sparse(&terms, 3.0);
        let values: HashMap<u64, f64> = v["indices"]
            .as_array()
            .unwrap()
            .iter()
            .zip(v["values"].as_array().unwrap())
            .map(|(i, x)| (i.as_u64().unwrap(), x.as_f64().unwrap()))
            .collect();
        // dl = avgdl: norm = k1; tf 2 → 2·2.2/(2+1.2), tf 1 → 2.2/2.2.
        let ley = values[&u64::from(term_index("ley"))];
        assert!((ley - 2.0 * 2.2 / 3.2).abs() < 1e-6, "{ley}");
        assert!((values[&u64::from(term_index("tráfico"))] - 1.0).abs() < 1e-6);
        let q = query_sparse(&terms);
        assert_eq!(q["indices"].as_array().unwrap().len(), 2, "each term once");
    }

    /// `(index, value)` pairs of a sparse vector.
    fn pairs(v: &Value) -> HashMap<u64, f64> {
        let indices = v["indices"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap());
        let values = v["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap());
        let out: HashMap<u64, f64> = indices.zip(values).collect();
        assert_eq!(out.len(), v["indices"].as_array().unwrap().len(), "indexes repeat: {v}");
        out
    }

    fn dot(a: &Value, b: &Value) -> f64 {
        let b = pairs(b);
        pairs(a).iter().map(|(i, x)| x * b.get(i).copied().unwrap_or(0.0)).sum()
    }

    #[test]
    fn one_keyword_vector_scores_a_chunk_with_both_fields_sum() {
        let words = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<String>>();
        // "ley" in both fields: its title and text weights must add up, not collide.
        let (title, text) = (words("ley tráfico"), words("la ley de tráfico vial ley"));
        let query = words("ley ley vial");
        let combined = dot(&query_keywords(&query), &doc_keywords(&title, 2.5, &text, 7.0));
        let per_field =
            dot(&query_sparse(&query), &doc_sparse(&title, 2.5)) + dot(&query_sparse(&query), &doc_sparse(&text, 7.0));
        assert!(per_field > 0.0 && (combined - per_field).abs() < 1e-6, "{combined} vs {per_field}");
        // A term only in the title scores nothing through the text's indexes.
        let title_only = dot(&query_keywords(&words("tráfico")), &doc_keywords(&title, 2.5, &[], 7.0));
        assert!((title_only - dot(&query_sparse(&words("tráfico")), &doc_sparse(&title, 2.5))).abs() < 1e-6);
        assert_ne!(field_index(7, Field::Title), field_index(7, Field::Text));
    }

    #[test]
    fn collections_keep_the_keyword_layout_they_were_made_with() {
        let info = |sparse: Value| json!({ "result": { "config": { "params": { "sparse_vectors": sparse } } } });
        let old = info(json!({ "title": { "modifier": "idf" }, "text": { "modifier": "idf" } }));
        assert_eq!(KeywordLayout::of(&old), KeywordLayout::PerField);
        assert_eq!(KeywordLayout::of(&info(json!({ KEYWORDS: { "modifier": "idf" } }))), KeywordLayout::Combined);
    }

    #[test]
    fn filters_match_case_insensitively_and_always_scope_the_tenant() {
        let f = qdrant_filter("t1", &[Filter::parse("asignatura=IV").unwrap(), Filter::parse("year>=2008").unwrap()]);
        assert_eq!(f["must"][0], json!({ "key": "tenant", "match": { "value": "t1" } }));
        assert_eq!(f["must"][1]["should"][0], json!({ "key": "meta_lc.asignatura", "match": { "value": "iv" } }));
        assert_eq!(f["must"][2], json!({ "key": "meta_lc.year", "range": { "gte": 2008.0 } }));
        assert_eq!(lower(&json!({ "a": ["X", 1], "b": { "c": "Y" } })), json!({ "a": ["x", 1], "b": { "c": "y" } }));
    }

    #[test]
    fn point_ids_are_stable_uuids_per_knowledge_base() {
        let a = point_id("tg_t__kb", "a.json", "doc::1.0");
        assert_eq!(a, point_id("tg_t__kb", "a.json", "doc::1.0"));
        assert_ne!(a, point_id("tg_t__kb2", "a.json", "doc::1.0"));
        assert_ne!(a, point_id("tg_t__kb", "b.json", "doc::1.0"), "records of the same id in two files");
        assert_eq!(a.len(), 36);
        assert_eq!(vector_name("intfloat/multilingual-e5-small"), "intfloat_multilingual-e5-small");
        // Names with `_` never share a collection.
        let o = QdrantOptions::new("http://q");
        assert_ne!(o.collection("a", "b_c"), o.collection("a_b", "c"));
        assert_eq!(o.collection("demo", "guias"), "tg_4_demo_guias");
    }
}
