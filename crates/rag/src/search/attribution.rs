//! Which retrieved passage a sentence draws on, by the terms they share — one rule for every
//! citer here: the grounded agents' check ([`super::grounding`]), [`super::cite`], and the
//! legal agent's `format_citation`, each with its own [`Rules`] (docs/retrieval.md, "Citations").
//!
//! - **Terms** follow the sentence's language ([`TermKind`]). In Vietnamese a word is several
//!   syllables, and single syllables ("của", "người") are everywhere: its terms are pairs of
//!   adjacent syllables, leaving out a pair of two common ones ("của các", "trong đó"; a citer
//!   adds its domain's, as the legal one "quy định"). In the
//!   other languages they are words of 3+ letters, stopwords left out, Latin accents folded and
//!   cut to five letters (a stem that takes "contenedor" for "contenedores").
//! - A shared term **weighs** more the fewer passages hold it (`ln(1 + n / df)`): a phrase every
//!   retrieved article repeats says nothing of which one a sentence came from.
//! - A passage **supports** a sentence when it holds at least [`Rules::min_shared`] of the
//!   sentence's terms and at least a share of them ([`Rules::stem_coverage`],
//!   [`Rules::pair_coverage`]): a long sentence that shares a stray phrase with a passage is not
//!   that passage's claim. Of those, the heaviest is the source (a tie goes to the
//!   better-ranked, earlier passage).
//! - A passage the sentence **names** itself (its `[label]`) stands unless another supports the
//!   sentence more than [`Rules::overrule`] times as heavily: a small model often names the wrong
//!   one of the passages it read.

use crate::index::VIETNAMESE_LETTERS;
use std::collections::{HashMap, HashSet};

/// How a language's text is cut into the terms a sentence and its source share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TermKind {
    /// Word stems (see the module docs): the languages whose words are written whole.
    Stems,
    /// Pairs of adjacent syllables: Vietnamese.
    SyllablePairs,
}

impl TermKind {
    /// The terms of sentence `text`: syllable pairs when a fifth of its words at least have a
    /// letter only Vietnamese writes (a Vietnamese sentence has more: "Chi phí là 500 nghìn
    /// đồng"; one Vietnamese name in a Spanish sentence does not make it Vietnamese).
    pub fn of_sentence(text: &str) -> Self {
        let (mut words, mut vietnamese) = (0usize, 0usize);
        for word in text.split(|c: char| !c.is_alphabetic()).filter(|w| !w.is_empty()) {
            words += 1;
            if word.chars().flat_map(char::to_lowercase).any(|c| VIETNAMESE_LETTERS.contains(c)) {
                vietnamese += 1;
            }
        }
        if words > 0 && vietnamese * 5 >= words { Self::SyllablePairs } else { Self::Stems }
    }
}

/// Thresholds and vocabulary of one citer (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Fewest terms a passage must share with a sentence to support it.
    pub min_shared: usize,
    /// Smallest share of a sentence's stems a passage must hold to support it.
    pub stem_coverage: f64,
    /// Smallest share of a sentence's syllable pairs a passage must hold to support it.
    pub pair_coverage: f64,
    /// How many times the named passage's weight another must exceed to take the citation.
    pub overrule: f64,
    /// Syllables a pair of which is evidence of nothing, besides Vietnamese's function words
    /// (a domain's own: "điều", "luật", "khoản" in law).
    pub common_syllables: &'static [&'static str],
}

impl Rules {
    /// Two terms, and three in ten of a sentence's stems or one in four of its syllable pairs
    /// (a pair is about half a word); another passage takes a named one's citation holding the
    /// sentence over twice as heavily.
    pub const DEFAULT: Self =
        Self { min_shared: 2, stem_coverage: 0.3, pair_coverage: 0.25, overrule: 2.0, common_syllables: &[] };

    fn coverage(&self, kind: TermKind) -> f64 {
        match kind {
            TermKind::Stems => self.stem_coverage,
            TermKind::SyllablePairs => self.pair_coverage,
        }
    }
}

impl Default for Rules {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A sentence's terms, of the kind its language takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentenceTerms {
    kind: TermKind,
    terms: HashSet<String>,
}

impl SentenceTerms {
    /// Whether the sentence has no terms at all.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// How many distinct terms the sentence has.
    pub fn len(&self) -> usize {
        self.terms.len()
    }

    /// The kind of terms the sentence was cut into.
    pub fn kind(&self) -> TermKind {
        self.kind
    }

    /// Adds the terms of another part of the sentence (cut as this part was).
    pub fn extend(&mut self, other: SentenceTerms) {
        self.terms.extend(other.terms);
    }

    /// Keeps only the terms `keep` takes.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.terms.retain(|t| keep(t));
    }
}

/// How much of a sentence one passage holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Support {
    /// The weight of the terms they share.
    pub weight: f64,
    /// How many terms they share.
    pub shared: usize,
    /// Whether that is enough to support the sentence.
    pub supports: bool,
}

/// The terms of one text, of both kinds (a sentence in either language may be judged against it).
#[derive(Debug, Default, Clone)]
pub struct TermSet {
    stems: HashSet<String>,
    pairs: HashSet<String>,
}

impl TermSet {
    /// The terms of `text`.
    pub fn of(text: &str, rules: &Rules) -> Self {
        let mut set = Self::default();
        set.add(text, rules);
        set
    }

    /// Adds the terms of `text`.
    pub fn add(&mut self, text: &str, rules: &Rules) {
        self.stems.extend(terms(text, TermKind::Stems, rules));
        self.pairs.extend(terms(text, TermKind::SyllablePairs, rules));
    }

    fn get(&self, kind: TermKind) -> &HashSet<String> {
        match kind {
            TermKind::Stems => &self.stems,
            TermKind::SyllablePairs => &self.pairs,
        }
    }

    /// Whether this text holds `term`, a term of `kind`.
    pub fn holds(&self, kind: TermKind, term: &str) -> bool {
        self.get(kind).contains(term)
    }

    /// How many of the sentence's terms this text holds.
    pub fn shared(&self, sentence: &SentenceTerms) -> usize {
        let mine = self.get(sentence.kind);
        sentence.terms.iter().filter(|t| mine.contains(*t)).count()
    }
}

/// The passages a reply may be attributed to, with how many of them hold each term.
#[derive(Debug, Clone, Default)]
pub struct Attribution {
    rules: Rules,
    passages: Vec<TermSet>,
    /// How many passages hold each term (stems and pairs never collide: a pair has a space).
    df: HashMap<String, usize>,
}

impl Attribution {
    /// The passages' texts, best-ranked first, under `rules`.
    pub fn new<S: AsRef<str>>(passages: &[S], rules: Rules) -> Self {
        let passages: Vec<TermSet> = passages.iter().map(|p| TermSet::of(p.as_ref(), &rules)).collect();
        let mut df: HashMap<String, usize> = HashMap::new();
        for p in &passages {
            for t in p.stems.iter().chain(&p.pairs) {
                *df.entry(t.clone()).or_default() += 1;
            }
        }
        Self { rules, passages, df }
    }

    /// The rules this attribution applies.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// How many passages there are.
    pub fn len(&self) -> usize {
        self.passages.len()
    }

    /// Whether there are no passages.
    pub fn is_empty(&self) -> bool {
        self.passages.is_empty()
    }

    /// The terms of `sentence`, of the kind its language takes.
    pub fn terms(&self, sentence: &str) -> SentenceTerms {
        self.terms_as(TermKind::of_sentence(sentence), sentence)
    }

    /// The terms of `text` of `kind` (a part of a sentence, cut as the whole sentence's
    /// language takes).
    pub fn terms_as(&self, kind: TermKind, text: &str) -> SentenceTerms {
        SentenceTerms { kind, terms: terms(text, kind, &self.rules) }
    }

    /// Whether `shared` of a sentence's terms support it.
    pub fn enough(&self, shared: usize, sentence: &SentenceTerms) -> bool {
        shared >= self.rules.min_shared
            && shared as f64 >= self.rules.coverage(sentence.kind) * sentence.terms.len() as f64
    }

    /// Each passage's [`Support`] for `sentence`.
    pub fn support(&self, sentence: &SentenceTerms) -> Vec<Support> {
        let n = self.passages.len() as f64;
        self.passages
            .iter()
            .map(|p| {
                let theirs = p.get(sentence.kind);
                let shared: Vec<&String> = sentence.terms.iter().filter(|t| theirs.contains(*t)).collect();
                Support {
                    weight: shared.iter().map(|t| (1.0 + n / self.df.get(*t).copied().unwrap_or(1) as f64).ln()).sum(),
                    shared: shared.len(),
                    supports: self.enough(shared.len(), sentence),
                }
            })
            .collect()
    }

    /// The passage `sentence` is attributed to: `named` (one its own marker names) unless
    /// another clearly holds the sentence instead, else the one that supports it best.
    pub fn attribute(&self, sentence: &SentenceTerms, named: Option<usize>) -> Option<usize> {
        let support = self.support(sentence);
        let best = best_of(&support);
        match (named, best) {
            // The named passage's own weight counts even where it is too little to support the
            // sentence by itself: the other must hold it clearly better.
            (Some(named), Some(other)) if other != named => {
                let theirs = support.get(named).map_or(0.0, |n| n.weight);
                Some(if support[other].weight > self.rules.overrule * theirs { other } else { named })
            }
            (Some(named), _) => Some(named),
            (None, best) => best,
        }
    }
}

/// The passage of `support` that supports its sentence best, if any does; ties go to the
/// better-ranked (earlier) one.
fn best_of(support: &[Support]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, s) in support.iter().enumerate() {
        if s.supports && best.is_none_or(|b| s.weight > support[b].weight) {
            best = Some(i);
        }
    }
    best
}

/// Vietnamese syllables every text is full of: a pair of two of them ("của các", "trong đó")
/// is evidence of nothing.
const VIETNAMESE_COMMON: &[&str] = &[
    "của", "và", "các", "là", "được", "có", "không", "trong", "theo", "với", "cho", "này", "đó", "những", "một", "khi",
    "thì", "để", "về", "từ", "đến", "do", "bị", "hoặc", "tại", "trên", "phải", "nếu", "đã", "sẽ", "như", "mà", "vì",
    "nào", "gì", "the", "of", "and", "to", "in", "is", "a",
];

/// Words of 3+ letters that say nothing of where a sentence came from.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "was", "were", "with", "that", "this", "from", "have", "has", "you", "your", "can",
    "its", "their", "which", "what", "when", "where", "who", "how", "not", "but", "also", "will", "there", "para",
    "los", "las", "del", "con", "que", "una", "por", "como", "esta", "este", "más", "mas", "muy", "sus", "son", "hay",
    "ser", "está", "también", "puedes", "puede", "les", "des", "pour", "est", "dans", "une",
];

/// The terms of `text` of `kind` (see the module docs).
fn terms(text: &str, kind: TermKind, rules: &Rules) -> HashSet<String> {
    let words = text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty());
    match kind {
        TermKind::Stems => words
            .filter(|w| w.chars().count() >= 3 && !w.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_lowercase)
            .filter(|w| !STOPWORDS.contains(&w.as_str()))
            .map(|w| w.chars().map(fold_accent).take(5).collect())
            .collect(),
        TermKind::SyllablePairs => {
            let common = |w: &str| VIETNAMESE_COMMON.contains(&w) || rules.common_syllables.contains(&w);
            let words: Vec<String> = words.map(str::to_lowercase).collect();
            words
                .windows(2)
                .filter(|w| !(common(&w[0]) && common(&w[1])))
                .map(|w| format!("{} {}", w[0], w[1]))
                .collect()
        }
    }
}

/// `á` as `a`, `ñ` as `n` … (Spanish, French, Portuguese, German); other letters as they are.
pub fn fold_accent(c: char) -> char {
    match c {
        'á' | 'à' | 'â' | 'ä' | 'ã' => 'a',
        'é' | 'è' | 'ê' | 'ë' => 'e',
        'í' | 'ì' | 'î' | 'ï' => 'i',
        'ó' | 'ò' | 'ô' | 'ö' | 'õ' => 'o',
        'ú' | 'ù' | 'û' | 'ü' => 'u',
        'ñ' => 'n',
        'ç' => 'c',
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARTICLES: [&str; 3] = [
        "Trách nhiệm quản lý nhà nước về điện ảnh. Chính phủ thống nhất quản lý nhà nước về điện ảnh.",
        "Hợp đồng lữ hành phải được lập thành văn bản. Chính phủ quy định chi tiết.",
        "Kiểm soát hoạt động liên quan đến thuốc gây nghiện, thuốc hướng thần, tiền chất dùng làm thuốc.",
    ];

    #[test]
    fn vietnamese_is_cut_into_syllable_pairs_and_other_languages_into_stems() {
        let a = Attribution::new(&ARTICLES, Rules::default());
        let vi = a.terms("Của các hợp đồng lữ hành.");
        assert_eq!(vi.kind, TermKind::SyllablePairs);
        assert!(vi.terms.contains("hợp đồng") && vi.terms.contains("lữ hành"), "{vi:?}");
        assert!(!vi.terms.contains("của các"), "a pair of two common syllables: {vi:?}");
        let es = a.terms("Los contenedores se ejecutan.");
        assert_eq!(es.kind, TermKind::Stems);
        assert_eq!(es.terms, HashSet::from(["conte".to_owned(), "ejecu".to_owned()]));
    }

    #[test]
    fn a_sentence_goes_to_the_passage_holding_its_rarer_terms() {
        let a = Attribution::new(&ARTICLES, Rules::default());
        // "chính phủ" is in two articles; "lữ hành" and "văn bản" only in the second.
        let s = a.terms("Chính phủ yêu cầu hợp đồng lữ hành lập thành văn bản.");
        assert_eq!(a.attribute(&s, None), Some(1));
        let support = a.support(&s);
        assert!(support[1].weight > support[0].weight && support[0].shared >= 1, "{support:?}");
        // A stray phrase of a long sentence supports nothing (2 of its many pairs).
        let long = a.terms(
            "Chất gây nghiện là chất kích thích hoặc ức chế thần kinh, dễ gây tình trạng nghiện đối với người sử dụng \
             thuốc gây nghiện.",
        );
        assert_eq!(a.attribute(&long, None), None);
        assert_eq!(a.attribute(&a.terms("Thuốc gây nghiện được kiểm soát."), None), Some(2));
    }

    #[test]
    fn a_named_passage_stands_unless_another_holds_the_sentence_over_twice_as_well() {
        let a = Attribution::new(&["alpha beta gamma", "delta epsilon zeta eta"], Rules::default());
        let s = a.terms("alpha beta gamma delta epsilon zeta eta theta");
        // Stems: the first holds 3, the second 4 of 8: not twice, the name stands.
        assert_eq!(a.attribute(&s, Some(0)), Some(0));
        let clear = Attribution::new(&["alpha beta", "gamma delta epsilon zeta eta theta"], Rules::default());
        assert_eq!(clear.attribute(&clear.terms("alpha beta gamma delta epsilon zeta eta theta"), Some(0)), Some(1));
        // A name that holds nothing stands where no other passage supports the sentence.
        assert_eq!(a.attribute(&a.terms("omicron sigma"), Some(1)), Some(1));
        assert_eq!(a.attribute(&a.terms("omicron sigma"), None), None);
    }

    #[test]
    fn a_sentence_is_vietnamese_by_its_words_not_by_one_name() {
        assert_eq!(TermKind::of_sentence("Thi cuối kỳ diễn ra vào ngày 20 tháng 1."), TermKind::SyllablePairs);
        assert_eq!(TermKind::of_sentence("Chi phí là 500 nghìn đồng."), TermKind::SyllablePairs);
        assert_eq!(
            TermKind::of_sentence("El profesor Nguyễn atiende las tutorías los martes en su despacho."),
            TermKind::Stems
        );
        assert_eq!(TermKind::of_sentence("42."), TermKind::Stems);
    }

    #[test]
    fn a_domains_common_syllables_count_for_nothing() {
        let law = Rules { common_syllables: &["quy", "định", "điều", "luật"], ..Rules::default() };
        let a = Attribution::new(&ARTICLES, law);
        assert!(!a.terms("Theo quy định của điều luật.").terms.contains("quy định"));
        assert!(Attribution::new(&ARTICLES, Rules::default()).terms("Theo quy định.").terms.contains("quy định"));
    }
}
