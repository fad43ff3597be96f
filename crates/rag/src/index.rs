//! [`KeywordIndex`]: BM25 over tantivy, with one analyzer per language.

use crate::{Document, RagError};
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing, TextOptions, Value};
use tantivy::tokenizer::{Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, TextAnalyzer};
use tantivy::{Index, IndexReader, TantivyDocument, doc};

/// How text is split into terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analyzer {
    /// Words, lowercased, English Porter stemming.
    English,
    /// Words, lowercased, Spanish stemming (accents kept: they distinguish words).
    Spanish,
    /// Syllables (Vietnamese writes one per space-separated token), lowercased, no stemming.
    Vietnamese,
}

impl Analyzer {
    fn name(self) -> &'static str {
        match self {
            Self::English => "tg_en",
            Self::Spanish => "tg_es",
            Self::Vietnamese => "tg_vi",
        }
    }

    fn build(self) -> TextAnalyzer {
        let base =
            TextAnalyzer::builder(SimpleTokenizer::default()).filter(RemoveLongFilter::limit(48)).filter(LowerCaser);
        match self {
            Self::English => base.filter(Stemmer::new(Language::English)).build(),
            Self::Spanish => base.filter(Stemmer::new(Language::Spanish)).build(),
            Self::Vietnamese => base.build(),
        }
    }

    /// A guess from sample text: Vietnamese-only letters, then Spanish marks, else English.
    pub fn detect(sample: &str) -> Self {
        let lower = sample.to_lowercase();
        if lower.chars().any(|c| "ăđơưạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ".contains(c))
        {
            Self::Vietnamese
        } else if lower.chars().any(|c| "ñ¿¡".contains(c)) {
            Self::Spanish
        } else {
            Self::English
        }
    }

    /// Parses `en`, `es` or `vi`.
    pub fn from_code(code: &str) -> Option<Self> {
        match code {
            "en" => Some(Self::English),
            "es" => Some(Self::Spanish),
            "vi" => Some(Self::Vietnamese),
            _ => None,
        }
    }
}

/// A BM25 keyword index over documents' titles and texts.
pub struct KeywordIndex {
    reader: IndexReader,
    id: Field,
    parser: QueryParser,
}

impl KeywordIndex {
    /// Indexes `docs` in memory.
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn build_in_ram<'a>(
        analyzer: Analyzer,
        docs: impl IntoIterator<Item = &'a Document>,
    ) -> Result<Self, RagError> {
        let mut schema = Schema::builder();
        let text_options = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(analyzer.name())
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        );
        let id = schema.add_text_field("id", STRING | STORED);
        let title = schema.add_text_field("title", text_options.clone());
        let text = schema.add_text_field("text", text_options);
        let index = Index::create_in_ram(schema.build());
        index.tokenizers().register(analyzer.name(), analyzer.build());
        let mut writer = index.writer_with_num_threads(1, 64_000_000)?;
        for d in docs {
            writer.add_document(doc!(id => d.id.clone(), title => d.title.clone(), text => d.text.clone()))?;
        }
        writer.commit()?;
        let reader = index.reader()?;
        let parser = QueryParser::for_index(&index, vec![title, text]);
        Ok(Self { reader, id, parser })
    }

    /// The `k` best documents for `query` as `(id, score)`; query syntax is not interpreted
    /// (a question mark or a quote in a user's question is just text).
    ///
    /// # Errors
    /// When tantivy fails.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<(String, f32)>, RagError> {
        let cleaned: String = query.chars().map(|c| if c.is_alphanumeric() { c } else { ' ' }).collect();
        let (q, _ignored) = self.parser.parse_query_lenient(&cleaned);
        let searcher = self.reader.searcher();
        let top = searcher.search(&q, &TopDocs::with_limit(k.max(1)))?;
        let mut out = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let doc: TantivyDocument = searcher.doc(addr)?;
            if let Some(id) = doc.get_first(self.id).and_then(|v| v.as_str()) {
                out.push((id.to_owned(), score));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, title: &str, text: &str) -> Document {
        Document { id: id.into(), title: title.into(), text: text.into() }
    }

    #[test]
    fn english_stemming_matches_word_forms() {
        let docs = [d("1", "Vaccines", "Vaccination reduces infections."), d("2", "Cats", "Cats sleep a lot.")];
        let idx = KeywordIndex::build_in_ram(Analyzer::English, &docs).unwrap();
        assert_eq!(idx.search("vaccinated infection?", 5).unwrap()[0].0, "1");
    }

    #[test]
    fn vietnamese_syllables_match_with_diacritics() {
        let docs = [
            d(
                "ma-tuy#32",
                "Điều 32",
                "Người nghiện ma túy từ đủ 18 tuổi trở lên bị áp dụng biện pháp xử lý hành chính",
            ),
            d("dien-anh#45", "Điều 45", "Chính phủ thống nhất quản lý nhà nước về điện ảnh"),
        ];
        let idx = KeywordIndex::build_in_ram(Analyzer::Vietnamese, &docs).unwrap();
        assert_eq!(idx.search("Cơ quan nào quản lý nhà nước về điện ảnh?", 5).unwrap()[0].0, "dien-anh#45");
        assert_eq!(Analyzer::detect("Người nghiện ma túy"), Analyzer::Vietnamese);
        assert_eq!(Analyzer::detect("¿Qué es Docker?"), Analyzer::Spanish);
        assert_eq!(Analyzer::detect("What is Docker?"), Analyzer::English);
    }

    #[test]
    fn query_syntax_in_questions_is_just_text() {
        let docs = [d("1", "", "AND OR NOT title:x \"quoted\"")];
        let idx = KeywordIndex::build_in_ram(Analyzer::English, &docs).unwrap();
        assert!(idx.search("title:(x AND \"unclosed", 5).is_ok());
    }
}
