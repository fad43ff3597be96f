//! A person's store of long-term memory (docs/memory.md): JSON values under keys, in
//! namespaces (`["preferences"]`, `["memories", "travel"]`), each with an optional time to
//! live that reading refreshes — what LangGraph's store API serves and an agent's memory
//! reads. Every item is one person's (tenant and user), like a thread.
//!
//! The stores keep and fetch items; what a search finds — the filter, the keyword score, the
//! meaning (an item's vector, made by the configured embedding model when it is written, fused
//! with the keyword list as the knowledge bases' hybrid search fuses), the order — and the
//! namespaces a listing shows are decided here, once, so every store answers alike.

use crate::{ConversationStore, StoreError};
use serde::Serialize;
use serde_json::{Map, Value};
use std::time::Duration;
use toolgraph_rag::search::{Fusion, fuse};
use toolgraph_rag::{EmbedKind, Embedder, Retriever};

/// Most items one search reads, the most recently changed first; also the most one person
/// keeps (a write past it is refused), so a search reads all of them.
pub const ITEMS_READ: usize = 10_000;
/// Longest search query, in characters, and most words it may hold.
pub const MAX_QUERY_CHARS: usize = 1_000;
/// Most words of a query that count.
pub const MAX_QUERY_WORDS: usize = 32;
/// Most fields a filter compares.
pub const MAX_FILTER_FIELDS: usize = 16;
/// Deepest namespace.
pub const MAX_NAMESPACE_DEPTH: usize = 16;
/// Longest namespace label or key, in characters.
pub const MAX_LABEL_CHARS: usize = 256;
/// Largest value, encoded as JSON (a request body holds at most 64 KiB).
pub const MAX_VALUE_BYTES: usize = 32 * 1024;

/// Between a namespace's labels where a store keeps it as one string (no label holds it).
const SEPARATOR: char = '\u{1f}';
/// Longest text of an item that is embedded, in characters (models read about 512 tokens).
pub const MAX_EMBEDDED_CHARS: usize = 2_000;
/// Most items without a vector of the configured model that one search embeds (and keeps):
/// items written before search by meaning was turned on, or while the model failed, get
/// their vectors a few at a time, the most recently written first.
pub const BACKFILL_PER_SEARCH: usize = 32;

/// What an item's text means to one embedding model.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemVector {
    /// The model that made it (its id): a vector of another model is not compared.
    pub model: String,
    /// A unit vector (for several models side by side, each model's unit vector in turn).
    pub values: Vec<f32>,
}

impl ItemVector {
    /// As a store keeps it: little-endian f32s, as a knowledge base keeps its vectors.
    pub fn to_bytes(&self) -> Vec<u8> {
        toolgraph_rag::embed::encode_vector(&self.values)
    }

    /// From what a store kept (none when either half is missing or the bytes are no f32s).
    pub fn kept(model: Option<String>, bytes: Option<Vec<u8>>) -> Option<Self> {
        let (model, bytes) = (model?, bytes?);
        if bytes.is_empty() || bytes.len() % 4 != 0 {
            return None;
        }
        Some(Self { model, values: toolgraph_rag::embed::decode_vector(&bytes) })
    }
}

/// Which part of a value is embedded for search by meaning (LangGraph's `index` of a put).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum IndexFields {
    /// Its `text` field when that is a string, else every string and number it holds.
    #[default]
    Text,
    /// Nothing: the item is found by its words only.
    Off,
    /// These top-level fields' strings and numbers (`$`: the whole value), in order.
    Only(Vec<String>),
}

impl IndexFields {
    /// As a store keeps it: none for [`IndexFields::Text`], else a JSON list of the fields
    /// (empty for [`IndexFields::Off`]).
    pub fn to_kept(&self) -> Option<String> {
        match self {
            Self::Text => None,
            Self::Off => Some("[]".into()),
            Self::Only(names) => serde_json::to_string(names).ok(),
        }
    }

    /// From what a store kept (anything unreadable reads as [`IndexFields::Text`]).
    pub fn kept(kept: Option<String>) -> Self {
        match kept.and_then(|k| serde_json::from_str::<Vec<String>>(&k).ok()) {
            None => Self::Text,
            Some(names) if names.is_empty() => Self::Off,
            Some(names) => Self::Only(names),
        }
    }
}

/// The text of `value` that `fields` embeds, at most [`MAX_EMBEDDED_CHARS`]; none when it
/// holds no text.
pub fn embedded_text(value: &Map<String, Value>, fields: &IndexFields) -> Option<String> {
    fn collect(v: &Value, into: &mut Vec<String>) {
        match v {
            Value::String(s) => into.push(s.clone()),
            Value::Number(n) => into.push(n.to_string()),
            Value::Array(items) => items.iter().for_each(|i| collect(i, into)),
            Value::Object(m) => m.values().for_each(|i| collect(i, into)),
            Value::Bool(_) | Value::Null => {}
        }
    }
    let mut parts = Vec::new();
    match fields {
        IndexFields::Off => return None,
        IndexFields::Text => match value.get("text") {
            Some(Value::String(text)) => parts.push(text.clone()),
            _ => value.values().for_each(|v| collect(v, &mut parts)),
        },
        IndexFields::Only(names) => {
            for name in names {
                if name == "$" {
                    value.values().for_each(|v| collect(v, &mut parts));
                } else if let Some(v) = value.get(name) {
                    collect(v, &mut parts);
                }
            }
        }
    }
    let text: String = parts.join("\n").chars().take(MAX_EMBEDDED_CHARS).collect();
    (!text.trim().is_empty()).then_some(text)
}

/// One item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryItem {
    /// Its namespace, outermost label first.
    pub namespace: Vec<String>,
    /// Its key within the namespace.
    pub key: String,
    /// What is kept: a JSON object.
    pub value: Map<String, Value>,
    /// When it was first written, ms since the epoch.
    pub created_at_ms: i64,
    /// When it was last written.
    pub updated_at_ms: i64,
    /// Its time to live, when it has one: it expires that long after it was last written or
    /// read with a refresh.
    pub ttl_ms: Option<i64>,
    /// When it expires (`None`: never).
    pub expires_at_ms: Option<i64>,
    /// What it means to the embedding model that made this, when it was embedded.
    #[serde(skip)]
    pub vector: Option<ItemVector>,
    /// Which part of it is embedded.
    #[serde(skip)]
    pub index: IndexFields,
}

impl MemoryItem {
    /// A new item written at `now_ms`.
    pub fn new(
        namespace: Vec<String>,
        key: String,
        value: Map<String, Value>,
        ttl_ms: Option<i64>,
        now_ms: i64,
    ) -> Self {
        Self {
            namespace,
            key,
            value,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            ttl_ms,
            expires_at_ms: ttl_ms.map(|t| now_ms.saturating_add(t)),
            vector: None,
            index: IndexFields::Text,
        }
    }
}

/// Why a namespace, key or value cannot be kept; the message says which and why.
pub fn check_item(namespace: &[String], key: &str, value: &Map<String, Value>) -> Result<(), String> {
    check_namespace(namespace, false)?;
    if namespace.is_empty() {
        return Err("namespace: an item's namespace has at least one label".into());
    }
    check_key(key)?;
    let size = serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
    if size > MAX_VALUE_BYTES {
        return Err(format!("value: {size} bytes encoded, over the {MAX_VALUE_BYTES} an item holds"));
    }
    if value.values().any(holds_nul) {
        // PostgreSQL's JSONB cannot hold it; refused on every store alike.
        return Err("value: a string holds the character U+0000".into());
    }
    Ok(())
}

/// Why `key` is not one (as a label: not empty, at most [`MAX_LABEL_CHARS`], no control
/// character; unlike a label it may hold `.`).
pub fn check_key(key: &str) -> Result<(), String> {
    check_label("key", key)
}

fn holds_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// Why `search` cannot be run: a query or filter past its limits, or an operator it does not know.
pub fn check_search(search: &ItemSearch) -> Result<(), String> {
    if let Some(q) = &search.query
        && q.chars().count() > MAX_QUERY_CHARS
    {
        return Err(format!("query: over {MAX_QUERY_CHARS} characters"));
    }
    if search.filter.len() > MAX_FILTER_FIELDS {
        return Err(format!("filter: {} fields, over the {MAX_FILTER_FIELDS} allowed", search.filter.len()));
    }
    for (field, condition) in &search.filter {
        for op in operators(condition).into_iter().flatten().map(|(op, _)| op) {
            if !matches!(op, "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte") {
                return Err(format!(
                    "filter: `{field}` uses {op}; the operators are $eq, $ne, $gt, $gte, $lt and $lte"
                ));
            }
        }
    }
    Ok(())
}

/// Why `namespace` is not one (labels non-empty, without `.`, at most [`MAX_LABEL_CHARS`]
/// each and [`MAX_NAMESPACE_DEPTH`] deep); `wildcards` admits `*` labels (a listing's prefix).
pub fn check_namespace(namespace: &[String], wildcards: bool) -> Result<(), String> {
    if namespace.len() > MAX_NAMESPACE_DEPTH {
        return Err(format!("namespace: {} labels, over the {MAX_NAMESPACE_DEPTH} allowed", namespace.len()));
    }
    for label in namespace {
        if wildcards && label == "*" {
            continue;
        }
        check_label("namespace", label)?;
        if label.contains('.') {
            return Err(format!("namespace: label '{label}' holds a '.', which separates labels"));
        }
    }
    Ok(())
}

fn check_label(what: &str, label: &str) -> Result<(), String> {
    if label.is_empty() {
        return Err(format!("{what}: an empty label"));
    }
    if label.chars().count() > MAX_LABEL_CHARS {
        return Err(format!("{what}: over {MAX_LABEL_CHARS} characters"));
    }
    if label.chars().any(char::is_control) {
        return Err(format!("{what}: '{}' holds a control character", label.escape_debug()));
    }
    Ok(())
}

/// A namespace as a store keeps it.
pub(crate) fn encode_namespace(namespace: &[String]) -> String {
    namespace.join(&SEPARATOR.to_string())
}

/// A namespace as a store kept it.
pub(crate) fn decode_namespace(kept: &str) -> Vec<String> {
    if kept.is_empty() { Vec::new() } else { kept.split(SEPARATOR).map(str::to_owned).collect() }
}

/// What a store compares to find the items under `prefix`: the namespace itself, and the
/// start of every namespace below it (empty prefix: every item).
pub(crate) fn prefix_match(prefix: &[String]) -> (String, String) {
    let exact = encode_namespace(prefix);
    let below = if prefix.is_empty() { String::new() } else { format!("{exact}{SEPARATOR}") };
    (exact, below)
}

/// A search: the items under a namespace prefix whose values match a filter, ranked by a
/// keyword query when there is one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ItemSearch {
    /// Where: this namespace and every one below it.
    pub prefix: Vec<String>,
    /// Top-level fields of the value: equal to a value, or compared with `{"$eq"|"$ne"|"$gt"|
    /// "$gte"|"$lt"|"$lte": value}`.
    pub filter: Map<String, Value>,
    /// Words the value should hold: items holding none are left out; the more they hold, the
    /// higher they rank.
    pub query: Option<String>,
    /// At most this many.
    pub limit: usize,
    /// After skipping this many.
    pub offset: usize,
}

/// The items of `candidates` (unexpired, the most recently changed first) that `search` finds,
/// each with its score when the search has a query (the share of its words the value holds).
///
/// # Errors
/// What [`check_search`] refuses.
pub fn search_items(
    candidates: Vec<MemoryItem>,
    search: &ItemSearch,
) -> Result<Vec<(MemoryItem, Option<f64>)>, String> {
    check_search(search)?;
    let matching = filtered(candidates, search);
    let Some(words) = query_words(search) else {
        return Ok(matching.into_iter().skip(search.offset).take(search.limit).map(|i| (i, None)).collect());
    };
    let ranked = keyword_list(&matching, &words);
    let mut slots: Vec<Option<MemoryItem>> = matching.into_iter().map(Some).collect();
    Ok(ranked
        .into_iter()
        .skip(search.offset)
        .take(search.limit)
        .filter_map(|(at, score)| slots[at].take().map(|i| (i, Some(score))))
        .collect())
}

/// What [`search_by_meaning`] found, and the items it embedded on the way (with their new
/// vectors, for the store to keep).
#[derive(Debug, Default)]
pub struct MeaningSearch {
    /// The items found, best first, each with its fused score.
    pub found: Vec<(MemoryItem, Option<f64>)>,
    /// Items that had no vector of the model and now have one.
    pub embedded: Vec<MemoryItem>,
}

/// The items of `candidates` that `search` finds, ranked by its words and by meaning: the
/// keyword list (items holding the query's words, by the share they hold) and the dense list
/// (every item with a vector of `model`'s, by cosine to `question`, the query's vector) fused
/// by `fusion`. Up to [`BACKFILL_PER_SEARCH`] items without a vector of the model are embedded
/// first (a model that fails then leaves them to their words, and logs why). Blocking.
///
/// # Errors
/// What [`check_search`] refuses.
pub fn search_by_meaning(
    candidates: Vec<MemoryItem>,
    search: &ItemSearch,
    model: &dyn Embedder,
    question: &[f32],
    fusion: &Fusion,
) -> Result<MeaningSearch, String> {
    check_search(search)?;
    let mut matching = filtered(candidates, search);
    let id = model.settings().model.clone();
    let dimension = model.settings().dimension;
    let current = |i: &MemoryItem| i.vector.as_ref().is_some_and(|v| v.model == id && v.values.len() == dimension);
    // The most recently written first, as the store read them.
    let missing: Vec<(usize, String)> = matching
        .iter()
        .enumerate()
        .filter(|(_, i)| !current(i))
        .filter_map(|(at, i)| embedded_text(&i.value, &i.index).map(|t| (at, t)))
        .take(BACKFILL_PER_SEARCH)
        .collect();
    let mut embedded = Vec::new();
    if !missing.is_empty() {
        let texts: Vec<&str> = missing.iter().map(|(_, t)| t.as_str()).collect();
        match model.embed(&texts, EmbedKind::Passage) {
            Ok(vectors) => {
                for ((at, _), values) in missing.iter().zip(vectors) {
                    matching[*at].vector = Some(ItemVector { model: id.clone(), values });
                    embedded.push(matching[*at].clone());
                }
            }
            // The items stay findable by their words; the next search tries again.
            Err(e) => tracing::warn!(error = %e, "cannot embed memory items without vectors"),
        }
    }
    // Several models side by side: each holds a unit vector, so the dot product sums cosines.
    let models = model.settings().models().len().max(1) as f32;
    let mut dense: Vec<(usize, f32)> = matching
        .iter()
        .enumerate()
        .filter(|(_, i)| current(i))
        .filter_map(|(at, i)| {
            let v = i.vector.as_ref()?;
            (v.values.len() == question.len()).then(|| (at, toolgraph_rag::embed::dot(&v.values, question) / models))
        })
        .collect();
    dense.sort_by(|a, b| b.1.total_cmp(&a.1));
    let keywords: Vec<(usize, f32)> = query_words(search)
        .map(|w| keyword_list(&matching, &w).into_iter().map(|(at, share)| (at, share as f32)).collect())
        .unwrap_or_default();
    let fused = fuse(&keywords, &dense, fusion);
    let mut slots: Vec<Option<MemoryItem>> = matching.into_iter().map(Some).collect();
    let found = fused
        .into_iter()
        .skip(search.offset)
        .take(search.limit)
        .filter_map(|f| slots[f.key].take().map(|i| (i, Some(f64::from(f.score)))))
        .collect();
    Ok(MeaningSearch { found, embedded })
}

/// The candidates whose values match the search's filter, in their order.
fn filtered(candidates: Vec<MemoryItem>, search: &ItemSearch) -> Vec<MemoryItem> {
    candidates
        .into_iter()
        .filter(|item| search.filter.iter().all(|(field, condition)| holds(item.value.get(field), condition)))
        .collect()
}

/// The words of the search's query that count (none without a query or words).
fn query_words(search: &ItemSearch) -> Option<Vec<String>> {
    search
        .query
        .as_deref()
        .map(|q| words(q).into_iter().take(MAX_QUERY_WORDS).collect::<Vec<_>>())
        .filter(|w| !w.is_empty())
}

/// The items holding any of `words` (by their place in `items`), by the share they hold, best
/// first; equal shares keep the items' order (the most recently changed first).
fn keyword_list(items: &[MemoryItem], words: &[String]) -> Vec<(usize, f64)> {
    let mut held: Vec<(usize, f64)> = items
        .iter()
        .enumerate()
        .filter_map(|(at, item)| {
            let text = words_of_value(&item.value);
            let held = words.iter().filter(|w| text.contains(*w)).count();
            (held > 0).then(|| (at, held as f64 / words.len() as f64))
        })
        .collect();
    held.sort_by(|a, b| b.1.total_cmp(&a.1));
    held
}

/// The operators of a condition — an object with a `$` key is one operator per key, all of
/// which must hold (`{"$gte": 1, "$lte": 5}`) — or `None` for a value to equal.
fn operators(condition: &Value) -> Option<Vec<(&str, &Value)>> {
    let map = condition.as_object().filter(|m| m.keys().any(|k| k.starts_with('$')))?;
    Some(map.iter().map(|(k, v)| (k.as_str(), v)).collect())
}

fn holds(value: Option<&Value>, condition: &Value) -> bool {
    let Some(ops) = operators(condition) else { return value == Some(condition) };
    ops.into_iter().all(|(op, expected)| {
        let order = value.and_then(|v| compare(v, expected));
        match op {
            "$eq" => value == Some(expected),
            "$ne" => value != Some(expected),
            "$gt" => order == Some(std::cmp::Ordering::Greater),
            "$gte" => order.is_some_and(|o| o != std::cmp::Ordering::Less),
            "$lt" => order == Some(std::cmp::Ordering::Less),
            "$lte" => order.is_some_and(|o| o != std::cmp::Ordering::Greater),
            _ => false,
        }
    })
}

/// Numbers compare as numbers and strings as strings; anything else does not compare.
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// The lower-cased words of `text` (letters and digits of any script).
fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> =
        text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
    out.sort();
    out.dedup();
    out
}

/// The words of every string and number in `value`.
fn words_of_value(value: &Map<String, Value>) -> std::collections::HashSet<String> {
    fn collect(v: &Value, into: &mut Vec<String>) {
        match v {
            Value::String(s) => into.extend(words(s)),
            // As a query's words are read: "5.5" is the words 5 and 5.
            Value::Number(n) => into.extend(words(&n.to_string())),
            Value::Array(items) => items.iter().for_each(|i| collect(i, into)),
            Value::Object(m) => m.values().for_each(|i| collect(i, into)),
            Value::Bool(_) | Value::Null => {}
        }
    }
    let mut all = Vec::new();
    value.values().for_each(|v| collect(v, &mut all));
    all.into_iter().collect()
}

/// A listing of namespaces.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NamespaceListing {
    /// Namespaces starting with these labels (`*` matches any one).
    pub prefix: Vec<String>,
    /// … and ending with these.
    pub suffix: Vec<String>,
    /// Cut at this depth (the cut namespaces listed once).
    pub max_depth: Option<usize>,
    /// At most this many.
    pub limit: usize,
    /// After skipping this many.
    pub offset: usize,
}

/// The distinct namespaces among `namespaces` that `listing` shows, in order.
pub fn list_namespaces(namespaces: &[Vec<String>], listing: &NamespaceListing) -> Vec<Vec<String>> {
    let fits = |labels: &[String], pattern: &[String]| {
        labels.len() >= pattern.len() && labels.iter().zip(pattern).all(|(l, p)| p == "*" || l == p)
    };
    let mut out: Vec<Vec<String>> = namespaces
        .iter()
        .filter(|ns| fits(ns, &listing.prefix))
        .filter(|ns| {
            let tail: Vec<String> = ns.iter().rev().cloned().collect();
            let suffix: Vec<String> = listing.suffix.iter().rev().cloned().collect();
            fits(&tail, &suffix)
        })
        .map(|ns| match listing.max_depth {
            Some(d) => ns.iter().take(d).cloned().collect(),
            None => ns.clone(),
        })
        .collect();
    out.sort();
    out.dedup();
    out.into_iter().skip(listing.offset).take(listing.limit).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(ns: &[&str], key: &str, value: Value, updated: i64) -> MemoryItem {
        let mut i = MemoryItem::new(
            ns.iter().map(|s| s.to_string()).collect(),
            key.into(),
            value.as_object().cloned().unwrap_or_default(),
            None,
            updated,
        );
        i.updated_at_ms = updated;
        i
    }

    #[test]
    fn a_search_filters_then_ranks_by_the_words_held_then_by_recency() {
        let items = vec![
            item(&["m"], "c", json!({"text": "Prefers Spanish answers", "kind": "lang", "n": 3}), 3),
            item(&["m"], "b", json!({"text": "Child in class 5A", "kind": "family", "n": 2}), 2),
            item(&["m"], "a", json!({"text": "Spanish and maths tutor in 5A", "kind": "family", "n": 1}), 1),
        ];
        let search = |filter: Value, query: Option<&str>| {
            let s = ItemSearch {
                prefix: vec![],
                filter: filter.as_object().cloned().unwrap_or_default(),
                query: query.map(str::to_owned),
                limit: 10,
                offset: 0,
            };
            search_items(items.clone(), &s).unwrap().into_iter().map(|(i, score)| (i.key, score)).collect::<Vec<_>>()
        };
        assert_eq!(search(json!({}), None), [("c".into(), None), ("b".into(), None), ("a".into(), None)]);
        assert_eq!(search(json!({"kind": "family"}), None).len(), 2);
        assert_eq!(search(json!({"n": {"$gte": 2}}), None).len(), 2);
        assert_eq!(search(json!({"n": {"$lt": 2}}), None), [("a".into(), None)]);
        assert_eq!(search(json!({"kind": {"$ne": "family"}}), None), [("c".into(), None)]);
        assert_eq!(search(json!({"n": {"$gte": 2, "$lt": 3}}), None), [("b".into(), None)], "every operator holds");
        assert_eq!(search(json!({}), Some("3")), [("c".into(), Some(1.0))], "numbers are words too");
        // "spanish 5a": a holds both, c and b one each (c the more recent).
        let ranked = search(json!({}), Some("Spanish, 5A?"));
        assert_eq!(ranked, [("a".into(), Some(1.0)), ("c".into(), Some(0.5)), ("b".into(), Some(0.5))]);
        assert!(search(json!({}), Some("nothing here")).is_empty(), "no word held: not found");
        let err = search_items(
            items.clone(),
            &ItemSearch {
                filter: json!({"n": {"$gt": 0, "$in": [1]}}).as_object().cloned().unwrap(),
                limit: 1,
                ..Default::default()
            },
        );
        assert!(err.unwrap_err().contains("$in"), "an unknown operator beside a known one");
        let long = ItemSearch { query: Some("w ".repeat(MAX_QUERY_CHARS)), limit: 1, ..Default::default() };
        assert!(search_items(items, &long).unwrap_err().contains("query"));
    }

    /// A model of three meanings: pets, languages, anything else (each word adds to one).
    #[derive(Debug)]
    struct Meanings(toolgraph_rag::EmbeddingSettings, std::sync::atomic::AtomicUsize);

    impl Meanings {
        fn new(model: &str) -> Self {
            let settings = toolgraph_rag::EmbeddingSettings {
                model: model.into(),
                sha256: String::new(),
                dimension: 3,
                query_prefix: String::new(),
                passage_prefix: String::new(),
                parts: Vec::new(),
            };
            Self(settings, Default::default())
        }
    }

    impl Embedder for Meanings {
        fn settings(&self) -> &toolgraph_rag::EmbeddingSettings {
            &self.0
        }
        fn embed(&self, texts: &[&str], _kind: EmbedKind) -> Result<Vec<Vec<f32>>, toolgraph_rag::EmbedError> {
            self.1.fetch_add(texts.len(), std::sync::atomic::Ordering::Relaxed);
            Ok(texts
                .iter()
                .map(|t| {
                    let mut v = vec![0.0f32; 3];
                    for w in words(t) {
                        let at = match w.as_str() {
                            "cat" | "mascota" | "pet" | "miso" => 0,
                            "spanish" | "idioma" | "language" | "catalan" => 1,
                            _ => 2,
                        };
                        v[at] += 1.0;
                    }
                    toolgraph_rag::embed::normalise(&mut v);
                    v
                })
                .collect())
        }
    }

    #[test]
    fn a_search_by_meaning_finds_what_shares_no_word_and_embeds_the_items_it_lacks() {
        let model = Meanings::new("meanings");
        let embedded = |text: &str| {
            let values = model.embed(&[text], EmbedKind::Passage).unwrap().remove(0);
            Some(ItemVector { model: "meanings".into(), values })
        };
        let mut cat = item(&["m"], "cat", json!({"text": "Has a cat called Miso"}), 4);
        cat.vector = embedded("Has a cat called Miso");
        let mut bus = item(&["m"], "bus", json!({"text": "Takes the bus to school"}), 3);
        bus.vector = embedded("Takes the bus to school");
        // Written before search by meaning: embedded by the search, which hands it back.
        let lang = item(&["m"], "lang", json!({"text": "Prefers Spanish answers"}), 2);
        // Kept out of the index: found by its words only.
        let mut dog = item(&["m"], "dog", json!({"text": "Walks a dog, a pet, every day"}), 1);
        dog.index = IndexFields::Off;
        // Another model's vector is not compared, and is replaced.
        let mut old = item(&["m"], "old", json!({"text": "Their cat is old"}), 0);
        old.vector = Some(ItemVector { model: "another".into(), values: vec![1.0, 0.0, 0.0] });
        let candidates = vec![cat, bus, lang, dog, old];
        let search = |query: &str, limit: usize| ItemSearch { query: Some(query.into()), limit, ..Default::default() };
        let question = |q: &str| model.embed(&[q], EmbedKind::Query).unwrap().remove(0);
        let fusion = Fusion::default();

        let found = search_by_meaning(
            candidates.clone(),
            &search("¿Qué mascota?", 10),
            &model,
            &question("¿Qué mascota?"),
            &fusion,
        )
        .unwrap();
        let keys: Vec<&str> = found.found.iter().map(|(i, _)| i.key.as_str()).collect();
        // No word in common with any item: the pets first by meaning; the dog, unindexed, not at all.
        assert_eq!(&keys[..2], ["cat", "old"], "{keys:?}");
        assert!(!keys.contains(&"dog"), "{keys:?}");
        assert_eq!(keys.len(), 4, "{keys:?}");
        let backfilled: Vec<&str> = found.embedded.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(backfilled, ["lang", "old"], "the items without a vector of this model, and only them");
        assert!(found.embedded.iter().all(|i| i.vector.as_ref().is_some_and(|v| v.model == "meanings")));
        // By words alone the same query finds nothing.
        assert!(search_items(candidates.clone(), &search("¿Qué mascota?", 10)).unwrap().is_empty());

        // Words still count: "dog" is found by its word though it has no vector; "language"
        // finds the Spanish item by meaning first.
        let found =
            search_by_meaning(candidates.clone(), &search("dog", 10), &model, &question("dog"), &fusion).unwrap();
        assert!(found.found.iter().any(|(i, _)| i.key == "dog"));
        let found =
            search_by_meaning(candidates.clone(), &search("language", 1), &model, &question("language"), &fusion)
                .unwrap();
        assert_eq!(found.found[0].0.key, "lang");
        assert!(found.found[0].1.is_some(), "a fused score");

        // At most BACKFILL_PER_SEARCH items are embedded by one search.
        let many: Vec<MemoryItem> = (0..BACKFILL_PER_SEARCH + 5)
            .map(|n| item(&["m"], &format!("k{n}"), json!({"text": format!("fact {n}")}), n as i64))
            .collect();
        let found = search_by_meaning(many, &search("fact", 3), &model, &question("fact"), &fusion).unwrap();
        assert_eq!(found.embedded.len(), BACKFILL_PER_SEARCH);
        assert_eq!(found.found.len(), 3);
    }

    #[test]
    fn what_is_embedded_of_an_item_and_how_a_store_keeps_it() {
        let value = json!({"text": "Prefers Spanish", "n": 3, "tags": ["a", "b"]}).as_object().cloned().unwrap();
        assert_eq!(embedded_text(&value, &IndexFields::Text).as_deref(), Some("Prefers Spanish"));
        assert_eq!(embedded_text(&value, &IndexFields::Off), None);
        let only = IndexFields::Only(vec!["tags".into(), "n".into()]);
        assert_eq!(embedded_text(&value, &only).as_deref(), Some("a\nb\n3"));
        let untexted = json!({"note": "x", "flag": true}).as_object().cloned().unwrap();
        assert_eq!(embedded_text(&untexted, &IndexFields::Text).as_deref(), Some("x"));
        assert_eq!(embedded_text(&Map::new(), &IndexFields::Text), None);
        let long = json!({"text": "é".repeat(MAX_EMBEDDED_CHARS + 10)}).as_object().cloned().unwrap();
        assert_eq!(embedded_text(&long, &IndexFields::Text).unwrap().chars().count(), MAX_EMBEDDED_CHARS);
        for fields in [IndexFields::Text, IndexFields::Off, only] {
            assert_eq!(IndexFields::kept(fields.to_kept()), fields);
        }
        let v = ItemVector { model: "m".into(), values: vec![0.5, -1.25, 3.0] };
        assert_eq!(ItemVector::kept(Some("m".into()), Some(v.to_bytes())), Some(v));
        assert_eq!(ItemVector::kept(Some("m".into()), Some(vec![1, 2, 3])), None, "not f32s");
        assert_eq!(ItemVector::kept(None, Some(vec![0; 4])), None);
    }

    #[test]
    fn namespaces_are_listed_by_prefix_suffix_and_depth() {
        let items: Vec<Vec<String>> =
            [&["users", "1", "prefs"][..], &["users", "1", "notes"], &["users", "2", "prefs"], &["shared"]]
                .iter()
                .map(|ns| ns.iter().map(|s| s.to_string()).collect())
                .collect();
        let list = |prefix: &[&str], suffix: &[&str], depth: Option<usize>| {
            let l = NamespaceListing {
                prefix: prefix.iter().map(|s| s.to_string()).collect(),
                suffix: suffix.iter().map(|s| s.to_string()).collect(),
                max_depth: depth,
                limit: 100,
                offset: 0,
            };
            list_namespaces(&items, &l).into_iter().map(|n| n.join("/")).collect::<Vec<_>>()
        };
        assert_eq!(list(&[], &[], None), ["shared", "users/1/notes", "users/1/prefs", "users/2/prefs"]);
        assert_eq!(list(&["users", "*", "prefs"], &[], None), ["users/1/prefs", "users/2/prefs"]);
        assert_eq!(list(&[], &["prefs"], None), ["users/1/prefs", "users/2/prefs"]);
        assert_eq!(list(&["users"], &[], Some(2)), ["users/1", "users/2"]);
    }

    #[test]
    fn what_cannot_be_kept_is_named() {
        let ok = Map::new();
        assert!(check_item(&["a".into()], "k", &ok).is_ok());
        assert!(check_item(&[], "k", &ok).unwrap_err().contains("namespace"));
        assert!(check_item(&["a.b".into()], "k", &ok).unwrap_err().contains("'.'"));
        assert!(check_item(&["".into()], "k", &ok).unwrap_err().contains("empty"));
        assert!(check_item(&["a".into()], "", &ok).unwrap_err().contains("key"));
        assert!(check_item(&["a".into()], "a.b", &ok).is_ok(), "a key may hold a '.'");
        let nul = json!({"text": ["a\u{0}b"]}).as_object().cloned().unwrap();
        assert!(check_item(&["a".into()], "k", &nul).unwrap_err().contains("U+0000"));
        let big = json!({"text": "x".repeat(MAX_VALUE_BYTES)}).as_object().cloned().unwrap();
        assert!(check_item(&["a".into()], "k", &big).unwrap_err().contains("bytes"));
        assert!(check_namespace(&["a".into(), "*".into()], true).is_ok());
        assert!(check_namespace(&["*".into()], false).is_ok(), "a label may be a star when kept");
        let deep: Vec<String> = (0..=MAX_NAMESPACE_DEPTH).map(|i| i.to_string()).collect();
        assert!(check_namespace(&deep, false).is_err());
        assert_eq!(decode_namespace(&encode_namespace(&["a".into(), "b c".into()])), ["a", "b c"]);
        assert_eq!(decode_namespace(""), Vec::<String>::new());
    }
}

/// `search` over `candidates`: by meaning and words with `index` (falling back to words when
/// its model fails, which is logged), else by words. Blocking.
fn rank(candidates: Vec<MemoryItem>, search: &ItemSearch, index: Option<&Retriever>) -> Result<MeaningSearch, String> {
    let model = match index.map(Retriever::embedder) {
        Some(Ok(Some(model))) => Some(model),
        Some(Ok(None)) | None => None,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cannot load the embedding model: memory items are searched by their words");
            None
        }
    };
    let (Some(model), Some(index), Some(query)) = (model, index, search.query.as_deref()) else {
        return Ok(MeaningSearch { found: search_items(candidates, search)?, embedded: Vec::new() });
    };
    let question = match model.embed(&[query], EmbedKind::Query) {
        Ok(mut vectors) if vectors.len() == 1 => vectors.remove(0),
        Ok(_) => {
            tracing::warn!(
                "the embedding model gave no vector for the query: memory items are searched by their words"
            );
            return Ok(MeaningSearch { found: search_items(candidates, search)?, embedded: Vec::new() });
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot embed the query: memory items are searched by their words");
            return Ok(MeaningSearch { found: search_items(candidates, search)?, embedded: Vec::new() });
        }
    };
    search_by_meaning(candidates, search, model.as_ref(), &question, &index.fusion())
}

/// `text`'s vector as a passage of `index`'s model, on a blocking thread; none (logged)
/// when the model is not configured or fails.
async fn embed_passage(index: Retriever, text: String) -> Option<ItemVector> {
    let made = tokio::task::spawn_blocking(move || -> Result<Option<ItemVector>, String> {
        let Some(model) = index.embedder().map_err(|e| e.to_string())? else { return Ok(None) };
        let values = model.embed(&[text.as_str()], EmbedKind::Passage).map_err(|e| e.to_string())?;
        Ok(values.into_iter().next().map(|values| ItemVector { model: model.settings().model.clone(), values }))
    })
    .await;
    match made {
        Ok(Ok(vector)) => vector,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot embed a memory item: it is kept, and found by its words until a search embeds it");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "the embedding of a memory item stopped");
            None
        }
    }
}

/// Why an operation on a person's items was refused.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    /// A namespace, key, value, search or listing that cannot be kept or run; `field` is the
    /// part at fault (`namespace`, `key`, `value`, `query`, `filter`).
    #[error("{message}")]
    Invalid {
        /// The part at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The store failed, or keeps no items.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The search stopped before it ended (its task panicked or was cancelled).
    #[error("the item search stopped: {0}")]
    Stopped(String),
}

impl ItemError {
    /// From a check's message, which names its field first (`"namespace: …"`).
    fn invalid(message: String) -> Self {
        let field = message.split(':').next().unwrap_or("item").to_owned();
        Self::Invalid { field, message }
    }
}

/// One person's items in a store, under the rules every door keeps alike (LangGraph's store
/// routes, an agent's memory tools): what is written is checked first, a person keeps at
/// most [`ITEMS_READ`], and a read that refreshes renews the time to live of what it returns.
/// Times are passed in (ms since the epoch), so a test can move the clock.
pub struct PersonItems<'a> {
    store: &'a dyn ConversationStore,
    tenant: i64,
    user: i64,
    index: Option<&'a Retriever>,
}

impl<'a> PersonItems<'a> {
    /// The items of `user` of `tenant` in `store`, searched by their words.
    pub fn new(store: &'a dyn ConversationStore, tenant: i64, user: i64) -> Self {
        Self { store, tenant, user, index: None }
    }

    /// Searched by meaning too, with `index`'s embedding model and hybrid fusion (none: by
    /// words only): items are embedded when written, and a search with a query fuses the
    /// keyword list with the dense one (docs/memory.md, "Search by meaning").
    #[must_use]
    pub fn indexed(mut self, index: Option<&'a Retriever>) -> Self {
        self.index = index;
        self
    }

    /// Writes `value` under `namespace`/`key`, to expire `ttl` after its last write or
    /// refreshing read (none: never); with an index, `fields` of it are embedded first (a
    /// model that fails leaves the item to be embedded by a later search, and logs why).
    ///
    /// # Errors
    /// `Invalid` for a namespace, key or value that cannot be kept, or a new key past the
    /// person's [`ITEMS_READ`] (a rewrite is not refused); `Store`.
    pub async fn put(
        &self,
        namespace: Vec<String>,
        key: String,
        value: Map<String, Value>,
        ttl: Option<Duration>,
        fields: &IndexFields,
        now_ms: i64,
    ) -> Result<MemoryItem, ItemError> {
        check_item(&namespace, &key, &value).map_err(ItemError::invalid)?;
        if let IndexFields::Only(names) = fields
            && names.len() > MAX_FILTER_FIELDS
        {
            return Err(ItemError::invalid(format!(
                "index: {} fields, over the {MAX_FILTER_FIELDS} allowed",
                names.len()
            )));
        }
        let ttl_ms = ttl.map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX));
        let mut item = MemoryItem::new(namespace, key, value, ttl_ms, now_ms);
        item.index = fields.clone();
        // A search reads them all: a new key past the bound is refused.
        let kept = self.store.count_items(self.tenant, self.user, now_ms).await?;
        if kept >= ITEMS_READ as u64
            && self.store.item(self.tenant, self.user, &item.namespace, &item.key, now_ms).await?.is_none()
        {
            return Err(ItemError::Invalid {
                field: "key".into(),
                message: format!("you keep {kept} items, the most a person's store holds: delete some first"),
            });
        }
        // Embedded once the write is known to be kept.
        if let (Some(index), Some(text)) = (self.index, embedded_text(&item.value, fields)) {
            item.vector = embed_passage(index.clone(), text).await;
        }
        self.store.put_item(self.tenant, self.user, &item).await?;
        Ok(item)
    }

    /// The unexpired item under `namespace`/`key`; `refresh` renews its time to live.
    ///
    /// # Errors
    /// `Invalid` for a namespace or key that is none, `Store`.
    pub async fn get(
        &self,
        namespace: &[String],
        key: &str,
        refresh: bool,
        now_ms: i64,
    ) -> Result<Option<MemoryItem>, ItemError> {
        check_namespace(namespace, false).map_err(ItemError::invalid)?;
        check_key(key).map_err(ItemError::invalid)?;
        let item = self.store.item(self.tenant, self.user, namespace, key, now_ms).await?;
        if let Some(item) = &item
            && refresh
            && item.ttl_ms.is_some()
        {
            let kept = [(item.namespace.clone(), item.key.clone())];
            self.store.refresh_items(self.tenant, self.user, &kept, now_ms).await?;
        }
        Ok(item)
    }

    /// What `search` finds, each with its score when it has a query; `refresh` renews the
    /// time to live of what it returns. The matching runs on a blocking thread (it reads
    /// every value under the prefix).
    ///
    /// # Errors
    /// `Invalid` for a prefix or filter that is none, `Store`.
    pub async fn search(
        &self,
        search: &ItemSearch,
        refresh: bool,
        now_ms: i64,
    ) -> Result<Vec<(MemoryItem, Option<f64>)>, ItemError> {
        check_namespace(&search.prefix, false).map_err(ItemError::invalid)?;
        check_search(search).map_err(ItemError::invalid)?;
        let candidates = self.store.items(self.tenant, self.user, &search.prefix, now_ms).await?;
        let asked = search.clone();
        let index = self.index.filter(|_| asked.query.as_deref().is_some_and(|q| !q.trim().is_empty())).cloned();
        let ranked = tokio::task::spawn_blocking(move || rank(candidates, &asked, index.as_ref()))
            .await
            .map_err(|e| ItemError::Stopped(e.to_string()))?
            .map_err(ItemError::invalid)?;
        if !ranked.embedded.is_empty() {
            // Kept for the next search; one that cannot be kept is embedded again then.
            if let Err(e) = self.store.set_item_vectors(self.tenant, self.user, &ranked.embedded).await {
                tracing::warn!(error = %e, "cannot keep the memory items' new vectors");
            }
        }
        let found = ranked.found;
        let living: Vec<(Vec<String>, String)> = found
            .iter()
            .filter(|(i, _)| i.ttl_ms.is_some())
            .map(|(i, _)| (i.namespace.clone(), i.key.clone()))
            .collect();
        if refresh && !living.is_empty() {
            self.store.refresh_items(self.tenant, self.user, &living, now_ms).await?;
        }
        Ok(found)
    }

    /// The unexpired items in `namespace` exactly (not those below it), the most recently
    /// written first, as the store keeps them: no search to run.
    ///
    /// # Errors
    /// `Invalid` for a namespace that is none, `Store`.
    pub async fn in_namespace(&self, namespace: &[String], now_ms: i64) -> Result<Vec<MemoryItem>, ItemError> {
        check_namespace(namespace, false).map_err(ItemError::invalid)?;
        let mut kept = self.store.items(self.tenant, self.user, namespace, now_ms).await?;
        kept.retain(|i| i.namespace == namespace);
        Ok(kept)
    }

    /// Renews the time to live of `items` (those that have one) from `now_ms`.
    ///
    /// # Errors
    /// `Store`.
    pub async fn refresh(&self, items: &[MemoryItem], now_ms: i64) -> Result<(), ItemError> {
        let living: Vec<(Vec<String>, String)> =
            items.iter().filter(|i| i.ttl_ms.is_some()).map(|i| (i.namespace.clone(), i.key.clone())).collect();
        if !living.is_empty() {
            self.store.refresh_items(self.tenant, self.user, &living, now_ms).await?;
        }
        Ok(())
    }

    /// The namespaces `listing` shows.
    ///
    /// # Errors
    /// `Invalid` for a prefix or suffix that is none, `Store`.
    pub async fn namespaces(&self, listing: &NamespaceListing, now_ms: i64) -> Result<Vec<Vec<String>>, ItemError> {
        check_namespace(&listing.prefix, true).map_err(ItemError::invalid)?;
        check_namespace(&listing.suffix, true).map_err(ItemError::invalid)?;
        // The literal labels before the first wildcard narrow what is read.
        let fixed: Vec<String> = listing.prefix.iter().take_while(|l| *l != "*").cloned().collect();
        let namespaces = self.store.item_namespaces(self.tenant, self.user, &fixed, now_ms).await?;
        Ok(list_namespaces(&namespaces, listing))
    }

    /// Deletes the item under `namespace`/`key`; whether there was one.
    ///
    /// # Errors
    /// `Invalid` for a namespace or key that is none, `Store`.
    pub async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, ItemError> {
        check_namespace(namespace, false).map_err(ItemError::invalid)?;
        check_key(key).map_err(ItemError::invalid)?;
        Ok(self.store.delete_item(self.tenant, self.user, namespace, key).await?)
    }
}
