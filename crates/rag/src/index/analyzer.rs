//! [`Analyzer`]: how text becomes index terms, per language.
//!
//! Words are runs of alphanumeric characters (as tantivy's simple tokenizer splits them), except
//! that runs of Hangul, kana or CJK ideographs become overlapping character bigrams: those
//! scripts do not separate words reliably with spaces, and bigrams are the standard
//! dictionary-free answer (Lucene's CJK analyzer does the same).

use serde::{Deserialize, Serialize};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, Stemmer, TextAnalyzer, Token, TokenStream, Tokenizer,
};

/// How text is split into terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Analyzer {
    /// Words, lowercased, English Porter stemming.
    English,
    /// Words, lowercased, Spanish stemming (accents kept: they distinguish words).
    Spanish,
    /// Syllables (Vietnamese writes one per space-separated token), lowercased, no stemming.
    Vietnamese,
    /// Hangul as character bigrams, other words lowercased, no stemming.
    Korean,
}

impl Analyzer {
    /// The tokenizer name registered with tantivy.
    pub(crate) fn tokenizer_name(self) -> &'static str {
        match self {
            Self::English => "tg_en",
            Self::Spanish => "tg_es",
            Self::Vietnamese => "tg_vi",
            Self::Korean => "tg_ko",
        }
    }

    /// The ISO 639-1 code.
    pub fn code(self) -> &'static str {
        match self {
            Self::English => "en",
            Self::Spanish => "es",
            Self::Vietnamese => "vi",
            Self::Korean => "ko",
        }
    }

    pub(crate) fn build(self) -> TextAnalyzer {
        let base = TextAnalyzer::builder(WordTokenizer).filter(RemoveLongFilter::limit(48)).filter(LowerCaser);
        match self {
            Self::English => base.filter(Stemmer::new(Language::English)).build(),
            Self::Spanish => base.filter(Stemmer::new(Language::Spanish)).build(),
            Self::Vietnamese | Self::Korean => base.build(),
        }
    }

    /// A guess from sample text: Vietnamese-only letters, then Hangul, then Spanish marks, else
    /// English.
    pub fn detect(sample: &str) -> Self {
        let lower = sample.to_lowercase();
        let letters = lower.chars().filter(|c| c.is_alphabetic()).count().max(1);
        let count = |set: &str| lower.chars().filter(|c| set.contains(*c)).count();
        // Ratios, not presence: an English abstract may cite "Nguyễn" or "Barré".
        let share = |n: usize| n as f64 / letters as f64;
        if share(count(VIETNAMESE_LETTERS)) > 0.01 {
            Self::Vietnamese
        } else if share(lower.chars().filter(|c| is_hangul(*c)).count()) > 0.1 {
            Self::Korean
        } else if count("ñ¿¡") > 0 || share(count("áéíóú")) > 0.005 {
            Self::Spanish
        } else {
            Self::English
        }
    }

    /// Parses `en`, `es`, `vi` or `ko`.
    pub fn from_code(code: &str) -> Option<Self> {
        match code {
            "en" => Some(Self::English),
            "es" => Some(Self::Spanish),
            "vi" => Some(Self::Vietnamese),
            "ko" => Some(Self::Korean),
            _ => None,
        }
    }
}

/// Letters only Vietnamese writes (among the languages here).
pub(crate) const VIETNAMESE_LETTERS: &str = "ăđơưạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ";

pub(crate) fn is_hangul(c: char) -> bool {
    matches!(c, '\u{AC00}'..='\u{D7A3}' | '\u{1100}'..='\u{11FF}' | '\u{3130}'..='\u{318F}')
}

/// Scripts written without spaces between words: bigrammed.
fn is_bigram_script(c: char) -> bool {
    is_hangul(c)
        || matches!(c, '\u{3040}'..='\u{30FF}' | '\u{3400}'..='\u{4DBF}' | '\u{4E00}'..='\u{9FFF}' | '\u{F900}'..='\u{FAFF}')
}

/// Splits on non-alphanumeric characters; bigram-script runs become character bigrams.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WordTokenizer;

/// The tokens of one text, computed up front (texts are chunk-sized).
pub(crate) struct VecTokenStream {
    tokens: Vec<Token>,
    next: usize,
}

impl TokenStream for VecTokenStream {
    fn advance(&mut self) -> bool {
        if self.next < self.tokens.len() {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &Token {
        // tantivy calls `token` only after `advance` returned true, so `next >= 1`.
        &self.tokens[self.next - 1]
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.next - 1]
    }
}

impl Tokenizer for WordTokenizer {
    type TokenStream<'a> = VecTokenStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> VecTokenStream {
        let mut tokens = Vec::new();
        // (start, is_bigram_script) of the current run of alphanumeric characters.
        let mut run: Option<(usize, bool)> = None;
        for (i, c) in text.char_indices() {
            let kind = c.is_alphanumeric().then(|| is_bigram_script(c));
            match run {
                Some((_, b)) if kind == Some(b) => {}
                Some((start, b)) => {
                    push_run(text, start, i, b, &mut tokens);
                    run = kind.map(|k| (i, k));
                }
                None => run = kind.map(|k| (i, k)),
            }
        }
        if let Some((start, b)) = run {
            push_run(text, start, text.len(), b, &mut tokens);
        }
        VecTokenStream { tokens, next: 0 }
    }
}

fn push_run(text: &str, start: usize, end: usize, bigram: bool, tokens: &mut Vec<Token>) {
    let mut push = |from: usize, to: usize| {
        let position = tokens.len();
        tokens.push(Token {
            offset_from: from,
            offset_to: to,
            position,
            text: text[from..to].to_owned(),
            position_length: 1,
        });
    };
    let run = &text[start..end];
    if !bigram || run.chars().nth(1).is_none() {
        push(start, end);
        return;
    }
    let chars: Vec<(usize, char)> = run.char_indices().map(|(i, c)| (start + i, c)).collect();
    for w in chars.windows(2) {
        push(w[0].0, w[1].0 + w[1].1.len_utf8());
    }
}

/// The analyzed terms of `text` (for tests and query building).
pub(crate) fn terms(analyzer: &mut TextAnalyzer, text: &str) -> Vec<String> {
    let mut stream = analyzer.token_stream(text);
    let mut out = Vec::new();
    while stream.advance() {
        out.push(stream.token().text.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn korean_runs_become_bigrams_and_other_words_stay_whole() {
        let mut a = Analyzer::Korean.build();
        assert_eq!(terms(&mut a, "도커는 Docker컨테이너!"), ["도커", "커는", "docker", "컨테", "테이", "이너"]);
        assert_eq!(terms(&mut a, "가 나"), ["가", "나"]);
    }

    #[test]
    fn spanish_stems_and_keeps_accents_vietnamese_keeps_syllables() {
        let mut es = Analyzer::Spanish.build();
        assert_eq!(terms(&mut es, "Contenedores contenedor"), ["contenedor", "contenedor"]);
        let mut vi = Analyzer::Vietnamese.build();
        assert_eq!(terms(&mut vi, "Người nghiện ma túy"), ["người", "nghiện", "ma", "túy"]);
        let mut en = Analyzer::English.build();
        assert_eq!(terms(&mut en, "vaccinated vaccines, 18-year"), ["vaccin", "vaccin", "18", "year"]);
    }

    #[test]
    fn detection() {
        assert_eq!(Analyzer::detect("Người nghiện ma túy"), Analyzer::Vietnamese);
        assert_eq!(Analyzer::detect("기말 시험은 언제입니까?"), Analyzer::Korean);
        assert_eq!(Analyzer::detect("¿Qué es Docker?"), Analyzer::Spanish);
        assert_eq!(Analyzer::detect("What is Docker?"), Analyzer::English);
    }
}
