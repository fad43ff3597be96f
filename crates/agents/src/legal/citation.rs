//! `format_citation`: each sentence of an answer attributed to the article of law that
//! supports it, as `Theo [Điều 5, Luật Giao thông 2008], …`.
//!
//! Attribution is the retrieval crate's, as every citer's here
//! ([`toolgraph_rag::search::attribution`]): a sentence goes to the chunk that shares the most
//! syllable pairs with it, weighted by how few of the chunks hold each pair, and only when the
//! chunk holds at least two of its pairs and a quarter of them. What this module adds is the law:
//! syllables every legal text is full of ([`LEGAL_SYLLABLES`]: a pair like "quy định" or "điều
//! luật" is evidence of nothing), and how Vietnamese answers name an article. Labels come only
//! from the chunks, so an article absent from them is never cited; a bracketed citation the
//! answer already has is removed when it names none of the chunks. One that names a chunk is the
//! model's own attribution, and a small model often names the wrong one of the articles it read:
//! it stands unless another chunk clearly holds the sentence instead (more than twice the named
//! one's weight), and then that chunk is cited. A sentence that opens by naming a chunk without
//! brackets ("Theo Điều 46, Luật Điện ảnh, …", as a small model writes it) is treated the same
//! way, and the opening becomes the bracketed citation; so is one that names a chunk elsewhere
//! ("A. Điều 14, Luật Trọng tài thương mại."), and the name becomes the bracketed citation (of
//! the chunk that overruled it, if one did).

use super::Chunk;
use super::answer::NO_ANSWER;
use std::ops::Range;
use toolgraph_rag::search::attribution::{Attribution, Rules, TermKind};

/// Syllables every legal text and every answer about one is full of, besides the language's own
/// function words: a pair of two of them ("quy định", "điều luật", "câu hỏi", "không đúng") is
/// evidence of nothing.
const LEGAL_SYLLABLES: &[&str] = &[
    "quy",
    "định",
    "điều",
    "luật",
    "khoản",
    "câu",
    "hỏi",
    "trả",
    "lời",
    "đúng",
    "sai",
    "căn",
    "cứ",
    "pháp",
    "trường",
    "hợp",
    "án",
    "phương",
];

/// How an answer about the law is attributed: the shared rules with the law's syllables.
const RULES: Rules = Rules { common_syllables: LEGAL_SYLLABLES, ..Rules::DEFAULT };

/// The answer with its citations (see the module docs).
pub fn cite(answer: &str, chunks: &[Chunk]) -> String {
    let labels: Vec<String> = chunks.iter().map(|c| c.meta.label()).collect();
    let label_words: Vec<Vec<String>> =
        labels.iter().map(|l| normalize(l).split(' ').filter(|w| !w.is_empty()).map(str::to_owned).collect()).collect();
    let texts: Vec<&str> = chunks.iter().map(|c| c.text.as_str()).collect();
    let attribution = Attribution::new(&texts, RULES);
    let mut out = String::with_capacity(answer.len() + 64);
    let mut previous: Option<usize> = None;
    for (sentence, gap) in sentences(answer) {
        let (stripped, hinted) = strip_citations(sentence, &labels);
        let (text, hinted) = match (hinted, leading_citation(stripped.trim(), &label_words)) {
            (None, Some((i, rest))) => (rest, Some(i)),
            (hinted, _) => (stripped.trim(), hinted),
        };
        if text.is_empty() {
            out.push_str(gap);
            continue;
        }
        let mention = if hinted.is_none() { mentioned(text, &label_words) } else { None };
        // The answers are Vietnamese, also a sentence with no letter only Vietnamese writes
        // ("Chi phí là 500 nghìn…"): always syllable pairs.
        let pairs = |text: &str| attribution.terms_as(TermKind::SyllablePairs, text);
        let mine = match &mention {
            // A label's words name an article; they are no evidence of what one says.
            Some((_, at)) => {
                let mut mine = pairs(&text[..at.start]);
                mine.extend(pairs(&text[at.end..]));
                mine
            }
            None => pairs(text),
        };
        let source = attribution.attribute(&mine, hinted.or(mention.as_ref().map(|(i, _)| *i)));
        let at = mention.map(|(_, at)| at);
        match (source.filter(|_| !text.contains(NO_ANSWER)), at) {
            // The sentence names an article: the name becomes the citation, of the article it
            // named or of the one that overruled it (never both in one sentence).
            (Some(i), Some(at)) => out.push_str(&format!("{}[{}]{}", &text[..at.start], labels[i], &text[at.end..])),
            (Some(i), None) if previous == Some(i) => out.push_str(text),
            (Some(i), None) => out.push_str(&attributed(text, &labels[i])),
            (None, _) => out.push_str(text),
        }
        previous = source;
        out.push_str(gap);
    }
    out.trim_end().to_owned()
}

/// `Theo [label], text`; a sentence that already begins with "Theo" keeps its words and takes
/// the label before its final punctuation.
fn attributed(text: &str, label: &str) -> String {
    let starts_with_theo = text.get(..5).is_some_and(|w| w.eq_ignore_ascii_case("theo "));
    if !starts_with_theo {
        return format!("Theo [{label}], {text}");
    }
    let end = text.trim_end_matches(['.', '!', '?', '…', ':', ';']);
    format!("{end} [{label}]{}", &text[end.len()..])
}

/// When `text` opens with "Theo " and a chunk's label without brackets ("Theo Điều 46, Luật
/// Điện ảnh, Bộ …"): that chunk, and the text after the label and its comma.
fn leading_citation<'a>(text: &'a str, labels: &[Vec<String>]) -> Option<(usize, &'a str)> {
    let after = text.get(..5).filter(|w| w.eq_ignore_ascii_case("theo ")).map(|_| &text[5..])?;
    let words = spanned_words(after);
    let (i, n) = label_at(&words, 0, labels)?;
    let rest = after[words[n - 1].1.end..].trim_start_matches([',', ':', ' ']);
    (!rest.is_empty()).then_some((i, rest))
}

/// The chunk whose label `text` names first without brackets ("A. Điều 14, Luật Trọng tài
/// thương mại."), and where the label is: a sentence that names one of the articles read is
/// about that article.
fn mentioned(text: &str, labels: &[Vec<String>]) -> Option<(usize, Range<usize>)> {
    let words = spanned_words(text);
    (0..words.len())
        .find_map(|at| label_at(&words, at, labels).map(|(i, n)| (i, words[at].1.start..words[at + n - 1].1.end)))
}

/// The words of `text` (runs of letters and digits), lowercased, each with where it is.
fn spanned_words(text: &str) -> Vec<(String, Range<usize>)> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain(std::iter::once((text.len(), ' '))) {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                words.push((text[s..i].to_lowercase(), s..i));
                start = None;
            }
            _ => {}
        }
    }
    words
}

/// The chunk whose label (as lowercased words) `words` spell from `at` on, and how many words
/// it takes: the longest that matches ("Điều 4, Luật X" is no prefix of "Điều 45, …", but a
/// law's name may be of another's).
fn label_at(words: &[(String, Range<usize>)], at: usize, labels: &[Vec<String>]) -> Option<(usize, usize)> {
    let words = words.get(at..)?;
    labels
        .iter()
        .enumerate()
        .filter(|(_, label)| {
            !label.is_empty() && label.len() <= words.len() && label.iter().zip(words).all(|(l, (w, _))| l == w)
        })
        .max_by_key(|(_, label)| label.len())
        .map(|(i, label)| (i, label.len()))
}

/// The sentences of `text`, each with the whitespace after it: a sentence ends at `.`, `!`,
/// `?` or `…` followed by whitespace, or at a line break.
fn sentences(text: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        let ends = c == '\n' || (matches!(c, '.' | '!' | '?' | '…') && (next_is_space || chars.peek().is_none()));
        if !ends {
            continue;
        }
        let end = if c == '\n' { i } else { i + c.len_utf8() };
        let mut gap_end = if c == '\n' { i + 1 } else { end };
        while let Some(&(j, n)) = chars.peek() {
            if !n.is_whitespace() {
                break;
            }
            gap_end = j + n.len_utf8();
            chars.next();
        }
        out.push((&text[start..end], &text[end..gap_end]));
        start = gap_end;
    }
    if start < text.len() {
        out.push((&text[start..], ""));
    }
    out
}

/// `sentence` without its bracketed citations, and the chunk the first one that names a chunk
/// names. A bracket counts as a citation when it holds "Điều" or "Article"; "Theo " before a
/// removed one and ", " after it go with it.
fn strip_citations(sentence: &str, labels: &[String]) -> (String, Option<usize>) {
    let mut out = String::with_capacity(sentence.len());
    let mut hinted = None;
    let mut rest = sentence;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|c| open + c) else { break };
        let inside = &rest[open + 1..close];
        let lower = inside.to_lowercase();
        if !(lower.contains("điều") || lower.contains("article")) {
            out.push_str(&rest[..=close]);
            rest = &rest[close + 1..];
            continue;
        }
        let mut before = &rest[..open];
        let lead = before.trim_end();
        // `get`: the four bytes before may cut a multi-byte letter ("… điện ảnh [Điều 45, …]").
        if lead.len() >= 4 && lead.get(lead.len() - 4..).is_some_and(|w| w.eq_ignore_ascii_case("theo")) {
            before = &lead[..lead.len() - 4];
        }
        out.push_str(before);
        let wanted = normalize(inside);
        if hinted.is_none() {
            hinted = labels.iter().position(|l| normalize(l) == wanted);
        }
        rest = rest[close + 1..].trim_start_matches([',', ' ']);
        if rest.starts_with(['.', ',', ';', ':', '!', '?']) {
            out.truncate(out.trim_end().len());
        }
    }
    out.push_str(rest);
    (out, hinted)
}

/// A label compared without case, spacing or punctuation.
fn normalize(label: &str) -> String {
    label.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ").to_lowercase()
}

/// The labels of the bracketed citations in `text` (`[Điều 5, Luật X]` → `Điều 5, Luật X`), in order.
pub fn cited_labels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|c| open + c) else { break };
        let inside = rest[open + 1..close].trim();
        if inside.to_lowercase().contains("điều") || inside.to_lowercase().contains("article") {
            out.push(inside.to_owned());
        }
        rest = &rest[close + 1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legal::ChunkMeta;

    fn chunk(law: &str, n: &str, text: &str) -> Chunk {
        Chunk {
            text: text.into(),
            meta: ChunkMeta {
                doc_id: format!("{law}#{n}"),
                article_number: n.into(),
                law: law.into(),
                ..Default::default()
            },
        }
    }

    fn chunks() -> Vec<Chunk> {
        vec![
            chunk(
                "Luật Điện ảnh",
                "45",
                "Trách nhiệm quản lý nhà nước về điện ảnh\n1. Chính phủ thống nhất quản lý nhà nước về điện ảnh.",
            ),
            chunk("Luật Du lịch", "39", "Hợp đồng lữ hành\n1. Hợp đồng lữ hành phải được lập thành văn bản."),
        ]
    }

    #[test]
    fn each_sentence_goes_to_the_article_that_supports_it() {
        let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh. Hợp đồng lữ hành phải được lập thành văn bản.";
        assert_eq!(
            cite(answer, &chunks()),
            "Theo [Điều 45, Luật Điện ảnh], Chính phủ thống nhất quản lý nhà nước về điện ảnh. \
             Theo [Điều 39, Luật Du lịch], Hợp đồng lữ hành phải được lập thành văn bản."
        );
    }

    #[test]
    fn consecutive_sentences_of_one_article_are_cited_once_and_unsupported_ones_not_at_all() {
        let answer = "Sai. Hợp đồng lữ hành phải được lập thành văn bản. Hợp đồng lữ hành không thể miệng.\nTôi hy vọng giúp được.";
        let cited = cite(answer, &chunks());
        assert_eq!(
            cited,
            "Sai. Theo [Điều 39, Luật Du lịch], Hợp đồng lữ hành phải được lập thành văn bản. Hợp đồng lữ hành \
             không thể miệng.\nTôi hy vọng giúp được."
        );
        assert_eq!(cited_labels(&cited), ["Điều 39, Luật Du lịch"]);
    }

    #[test]
    fn an_article_absent_from_the_chunks_is_never_cited() {
        let answer = "Theo [Điều 99, Luật Giao thông 2008], Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
        let cited = cite(answer, &chunks());
        assert_eq!(cited, "Theo [Điều 45, Luật Điện ảnh], Chính phủ thống nhất quản lý nhà nước về điện ảnh.");
        // A correct bracket decides the attribution even where the words would not.
        let answer = "Việc này thuộc về Chính phủ [Điều 45, Luật Điện ảnh].";
        assert_eq!(cite(answer, &chunks()), "Theo [Điều 45, Luật Điện ảnh], Việc này thuộc về Chính phủ.");
    }

    #[test]
    fn the_no_answer_sentence_and_empty_input_get_no_citation() {
        let answer = format!("{NO_ANSWER} Chính phủ thống nhất quản lý nhà nước về điện ảnh.");
        assert!(cite(&answer, &chunks()).starts_with(NO_ANSWER), "{}", cite(&answer, &chunks()));
        assert_eq!(cite("", &chunks()), "");
        assert_eq!(cite("Chính phủ thống nhất quản lý.", &[]), "Chính phủ thống nhất quản lý.");
    }

    #[test]
    fn a_sentence_opening_with_theo_takes_the_label_at_its_end() {
        let answer = "Theo quy định, hợp đồng lữ hành phải được lập thành văn bản.";
        assert_eq!(
            cite(answer, &chunks()),
            "Theo quy định, hợp đồng lữ hành phải được lập thành văn bản [Điều 39, Luật Du lịch]."
        );
    }

    #[test]
    fn a_sentence_opening_with_a_chunk_unbracketed_is_attributed_to_it() {
        let answer = "Theo Điều 45, Luật Điện ảnh, Bộ Văn hóa phối hợp.";
        assert_eq!(cite(answer, &chunks()), "Theo [Điều 45, Luật Điện ảnh], Bộ Văn hóa phối hợp.");
        // An article that is not among the chunks is no such opening.
        let answer = "Theo Điều 4, Luật Điện ảnh, Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
        assert_eq!(
            cite(answer, &chunks()),
            "Theo Điều 4, Luật Điện ảnh, Chính phủ thống nhất quản lý nhà nước về điện ảnh [Điều 45, Luật Điện ảnh]."
        );
    }

    #[test]
    fn a_citation_the_answer_wrote_yields_to_the_article_that_holds_the_sentence() {
        // The model named the tourism article for the cinema article's sentence, word for word.
        let answer = "Theo [Điều 39, Luật Du lịch], Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
        assert_eq!(
            cite(answer, &chunks()),
            "Theo [Điều 45, Luật Điện ảnh], Chính phủ thống nhất quản lý nhà nước về điện ảnh."
        );
        let answer = "Theo Điều 39, Luật Du lịch, Chính phủ thống nhất quản lý nhà nước về điện ảnh.";
        assert_eq!(
            cite(answer, &chunks()),
            "Theo [Điều 45, Luật Điện ảnh], Chính phủ thống nhất quản lý nhà nước về điện ảnh."
        );
        // Where the named article holds the sentence as well as the other, the answer's choice stands.
        let both = vec![
            chunk("Luật Viên chức", "46", "Trước 03 tháng, cơ quan quản lý viên chức ra quyết định nghỉ hưu."),
            chunk("Luật Viên chức", "56", "Trước 03 tháng, cơ quan quản lý viên chức ra quyết định nghỉ hưu sớm."),
        ];
        let answer =
            "Theo [Điều 56, Luật Viên chức], trước 03 tháng, cơ quan quản lý viên chức ra quyết định nghỉ hưu.";
        assert_eq!(cited_labels(&cite(answer, &both)), ["Điều 56, Luật Viên chức"]);
    }

    #[test]
    fn another_article_overrules_the_named_one_only_when_it_holds_the_sentence_over_twice_as_well() {
        let answer = "Theo [Điều 1, Luật A], alpha beta gamma delta epsilon zeta eta theta.";
        // The named article holds 2 of the sentence's 7 pairs, the other 3: the name stands.
        let close = vec![chunk("Luật A", "1", "alpha beta gamma"), chunk("Luật B", "2", "delta epsilon zeta eta")];
        assert_eq!(cited_labels(&cite(answer, &close)), ["Điều 1, Luật A"]);
        // The other holds 5: over twice the named one's weight.
        let clear =
            vec![chunk("Luật A", "1", "alpha beta gamma"), chunk("Luật B", "2", "gamma delta epsilon zeta eta theta")];
        assert_eq!(cited_labels(&cite(answer, &clear)), ["Điều 2, Luật B"]);
        // Holding 1 pair, too few to support the sentence alone, still counts against the other.
        let one = vec![chunk("Luật A", "1", "alpha beta"), chunk("Luật B", "2", "delta epsilon zeta")];
        assert_eq!(cited_labels(&cite(answer, &one)), ["Điều 1, Luật A"]);
    }

    #[test]
    fn a_citation_after_a_multi_byte_letter_is_read() {
        // The four bytes before the bracket cut "ả": no panic, and the bracket is the citation.
        let answer = "Chính phủ quản lý điện ảnh [Điều 45, Luật Điện ảnh].";
        assert_eq!(cite(answer, &chunks()), "Theo [Điều 45, Luật Điện ảnh], Chính phủ quản lý điện ảnh.");
    }

    #[test]
    fn a_chunk_holding_a_stray_phrase_of_a_long_sentence_does_not_support_it() {
        let medicines = vec![chunk(
            "Luật Phòng, chống ma túy",
            "15",
            "Kiểm soát hoạt động liên quan đến thuốc gây nghiện, thuốc hướng thần, tiền chất dùng làm thuốc.",
        )];
        // Two ("thuốc gây", "gây nghiện") of its two dozen pairs: not this article's claim.
        let answer = "Chất gây nghiện là chất kích thích hoặc ức chế thần kinh, dễ gây tình trạng nghiện \
                      đối với người sử dụng thuốc gây nghiện.";
        assert_eq!(cite(answer, &medicines), answer);
        // The same pairs make up a short sentence's claim.
        let answer = "Thuốc gây nghiện được kiểm soát.";
        assert_eq!(cited_labels(&cite(answer, &medicines)), ["Điều 15, Luật Phòng, chống ma túy"]);
    }

    #[test]
    fn a_sentence_naming_one_of_the_articles_is_attributed_to_it() {
        // No article holds these words; the sentence names one.
        let answer = "Việc này được quy định tại Điều 39, Luật Du lịch.";
        assert_eq!(cite(answer, &chunks()), "Việc này được quy định tại [Điều 39, Luật Du lịch].");
        // A number that only begins the label's is not the label.
        let answer = "Việc này được quy định tại Điều 391, Luật Du lịch.";
        assert_eq!(cite(answer, &chunks()), answer);
        // A name the sentence's words overrule becomes the citation of the article that holds them.
        let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh, theo Điều 39, Luật Du lịch.";
        assert_eq!(
            cite(answer, &chunks()),
            "Chính phủ thống nhất quản lý nhà nước về điện ảnh, theo [Điều 45, Luật Điện ảnh]."
        );
    }

    #[test]
    fn sentences_about_the_question_itself_are_not_attributed() {
        // Everything here is said of every article: none supports it.
        let answer = "Câu hỏi không đúng với quy định của các điều luật.";
        assert_eq!(cite(answer, &chunks()), answer);
    }

    #[test]
    fn sentences_keep_their_separators() {
        assert_eq!(sentences("A. B?\n\nC"), [("A.", " "), ("B?", "\n\n"), ("C", "")]);
        assert_eq!(sentences("Điều 5.3 nói"), [("Điều 5.3 nói", "")]);
    }
}
