//! The tantivy side of a knowledge base: one document per chunk, its [`Fields`], the tokenizers
//! they are indexed with, and how metadata and vectors are stored. Kept apart from the
//! knowledge-base logic so the on-disk layout is read in one place: changing it means a new
//! [`super::KB_FORMAT`].

use crate::index::Analyzer;
use serde_json::{Map, Value};
use tantivy::Index;
use tantivy::schema::{
    BytesOptions, FAST, Field, IndexRecordOption, JsonObjectOptions, STORED, STRING, Schema, TextFieldIndexing,
    TextOptions,
};
use tantivy::tokenizer::{LowerCaser, RawTokenizer, TextAnalyzer};

/// Metadata values are matched whole and without case: `asignatura=IV` finds `iv`.
const KEYWORD_TOKENIZER: &str = "tg_keyword";

/// The fields of a chunk document.
#[derive(Clone, Copy)]
pub(crate) struct Fields {
    pub(crate) chunk_id: Field,
    pub(crate) doc_id: Field,
    pub(crate) source: Field,
    pub(crate) source_hash: Field,
    pub(crate) title: Field,
    pub(crate) doc_title: Field,
    pub(crate) text: Field,
    pub(crate) headings: Field,
    pub(crate) citation: Field,
    pub(crate) part: Field,
    /// The metadata as given, for display.
    pub(crate) meta_json: Field,
    /// The metadata for filtering: numbers as f64, so one numeric type per path.
    pub(crate) meta: Field,
    /// The chunk's embedding, little-endian f32s (absent in keyword-only knowledge bases).
    pub(crate) vector: Field,
}

/// The schema of a knowledge base whose text is indexed with `analyzer`.
pub(crate) fn schema(analyzer: Analyzer) -> (Schema, Fields) {
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

/// Registers the tokenizers the schema names: the knowledge base's `analyzer` (returned, for
/// query parsing) and the metadata keyword tokenizer.
pub(crate) fn register_tokenizers(index: &Index, analyzer: Analyzer) -> TextAnalyzer {
    let text = analyzer.build();
    index.tokenizers().register(analyzer.tokenizer_name(), text.clone());
    index
        .tokenizers()
        .register(KEYWORD_TOKENIZER, TextAnalyzer::builder(RawTokenizer::default()).filter(LowerCaser).build());
    text
}

pub(crate) use toolgraph_embed::{decode_vector, encode_vector};

/// Metadata as the filter index sees it: every number an f64 (tantivy keeps one numeric
/// column type per path; mixing `3` and `2.5` would split it), strings as they are.
pub(crate) fn filterable(meta: &Map<String, Value>) -> std::collections::BTreeMap<String, tantivy::schema::OwnedValue> {
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
