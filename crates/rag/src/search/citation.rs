//! Citations: putting `[label]` markers into an answer and checking the ones it has.
//!
//! A chunk's label comes from its metadata at ingest ([`crate::Chunk::citation`]): "Điều 5,
//! Luật Giao thông 2008", a heading path, a file name and page. [`cite`] attaches to each
//! sentence the label of the retrieved chunk it is attributed to by the shared
//! [`attribution`](super::attribution) (docs/retrieval.md, "Citations"); [`check_citations`] finds markers that point to no retrieved chunk — the
//! signature of a model inventing a source.

use super::attribution::{Attribution, Rules};
use crate::index::Chunk;
use serde::Serialize;
use std::collections::HashSet;

/// Sentence spans: up to and including `.`, `!`, `?`, `。` or a line break.
fn sentences(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let boundary = match c {
            '\n' | '。' | '!' | '?' => true,
            // A period ends a sentence only before whitespace or the end ("3.5", "v1.2" do not).
            '.' => chars.peek().is_none_or(|(_, n)| n.is_whitespace()),
            _ => false,
        };
        if boundary {
            let end = i + c.len_utf8();
            out.push((start, end));
            start = end;
        }
    }
    if start < text.len() {
        out.push((start, text.len()));
    }
    out
}

/// The answer with a `[label]` after each sentence that draws on a retrieved chunk (before
/// its final punctuation). Sentences that already carry a marker are left as they are.
pub fn cite(answer: &str, chunks: &[Chunk]) -> String {
    let texts: Vec<String> = chunks.iter().map(|c| format!("{} {}", c.title, c.text)).collect();
    let attribution = Attribution::new(&texts, Rules::DEFAULT);
    let mut out = String::with_capacity(answer.len() + 32);
    for (start, end) in sentences(answer) {
        let sentence = &answer[start..end];
        let body = sentence.trim_end();
        let trailing_ws = &sentence[body.len()..];
        let best = if body.contains('[') { None } else { attribution.attribute(&attribution.terms(body), None) };
        match best {
            Some(i) => {
                let cut = body.trim_end_matches(['.', '!', '?', '。']);
                out.push_str(cut);
                out.push_str(" [");
                out.push_str(&chunks[i].citation);
                out.push(']');
                out.push_str(&body[cut.len()..]);
                out.push_str(trailing_ws);
            }
            None => out.push_str(sentence),
        }
    }
    out
}

/// What [`check_citations`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CitationReport {
    /// Markers that match a retrieved chunk's label, in order of first appearance.
    pub cited: Vec<String>,
    /// Markers that match no retrieved chunk.
    pub unknown: Vec<String>,
}

impl CitationReport {
    /// Whether every marker points to a retrieved chunk.
    pub fn is_clean(&self) -> bool {
        self.unknown.is_empty()
    }
}

/// Finds `[label]` markers (not markdown links `[text](url)`) and sorts them into labels of
/// retrieved chunks and unknown ones. Labels compare ignoring case and surrounding space.
pub fn check_citations(answer: &str, chunks: &[Chunk]) -> CitationReport {
    let known = KnownLabels::new(chunks.iter().map(|c| c.citation.as_str()));
    let mut report = CitationReport::default();
    for label in cited_labels(answer) {
        let bucket = if known.contains(label) { &mut report.cited } else { &mut report.unknown };
        if !bucket.iter().any(|l| l == label) {
            bucket.push(label.to_owned());
        }
    }
    report
}

/// Citation labels as markers match them: ignoring case and surrounding space.
struct KnownLabels(HashSet<String>);

impl KnownLabels {
    fn new<'a>(labels: impl IntoIterator<Item = &'a str>) -> Self {
        Self(labels.into_iter().map(|l| l.trim().to_lowercase()).collect())
    }

    fn contains(&self, label: &str) -> bool {
        self.0.contains(&label.trim().to_lowercase())
    }
}

/// The labels of the `[label]` markers of `answer`, trimmed, in order (markdown links
/// `[text](url)`, empty and nested brackets are not markers).
fn cited_labels(answer: &str) -> impl Iterator<Item = &str> {
    let mut rest = answer;
    std::iter::from_fn(move || {
        loop {
            let open = rest.find('[')?;
            let after = &rest[open + 1..];
            let close = after.find(']')?;
            let label = after[..close].trim();
            let tail = &after[close + 1..];
            rest = tail;
            if !(tail.starts_with('(') || label.is_empty() || label.contains('[')) {
                return Some(label);
            }
        }
    })
}

/// Most citations [`sources_footer`] appends.
const MAX_APPENDED_CITATIONS: usize = 3;

/// The footer for an answer that used search results but cites none of them: their
/// citation labels (`results[].metadata.citation` of the JSON `tool_outputs`, as `rag_search`
/// returns them), first ones first, as `[label]` markers. `None` when the answer cites one
/// (as [`check_citations`] reads markers) or no output carried citations. A small model often
/// answers from the passages without saying where they came from: the reader still gets the
/// sources.
pub fn sources_footer(tool_outputs: &[&str], answer: &str) -> Option<String> {
    let mut labels: Vec<String> = Vec::new();
    for output in tool_outputs {
        let Ok(outcome) = serde_json::from_str::<serde_json::Value>(output) else { continue };
        let results = outcome.get("results").and_then(serde_json::Value::as_array).map(Vec::as_slice);
        for c in results.unwrap_or_default().iter().filter_map(|r| r.pointer("/metadata/citation")?.as_str()) {
            if !c.is_empty() && !labels.iter().any(|seen| seen == c) {
                labels.push(c.to_owned());
            }
        }
    }
    let known = KnownLabels::new(labels.iter().map(String::as_str));
    if labels.is_empty() || cited_labels(answer).any(|l| known.contains(l)) {
        return None;
    }
    let markers: Vec<String> = labels.iter().take(MAX_APPENDED_CITATIONS).map(|l| format!("[{l}]")).collect();
    Some(format!("\n\n{}", markers.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn chunk(label: &str, text: &str) -> Chunk {
        Chunk {
            id: format!("{label}::0.0"),
            doc_id: label.into(),
            title: String::new(),
            headings: vec![],
            text: text.into(),
            meta: Map::new(),
            citation: label.into(),
            part: (0, 1),
        }
    }

    #[test]
    fn cite_marks_the_sentence_with_its_source() {
        let chunks = [
            chunk("Điều 45, Luật Điện ảnh", "Chính phủ thống nhất quản lý nhà nước về điện ảnh."),
            chunk(
                "Điều 32, Luật Phòng, chống ma túy",
                "Người nghiện ma túy từ đủ 18 tuổi trở lên bị áp dụng biện pháp xử lý hành chính.",
            ),
        ];
        let answer = "Chính phủ thống nhất quản lý nhà nước về điện ảnh. Người nghiện ma túy từ đủ 18 tuổi bị áp dụng biện pháp xử lý hành chính.\nXin cảm ơn!";
        let cited = cite(answer, &chunks);
        assert_eq!(
            cited,
            "Chính phủ thống nhất quản lý nhà nước về điện ảnh [Điều 45, Luật Điện ảnh]. Người nghiện ma túy từ đủ 18 tuổi bị áp dụng biện pháp xử lý hành chính [Điều 32, Luật Phòng, chống ma túy].\nXin cảm ơn!"
        );
        let report = check_citations(&cited, &chunks);
        assert!(report.is_clean());
        assert_eq!(report.cited.len(), 2);
        assert_eq!(cite(&cited, &chunks), cited, "already-cited sentences are left alone");
    }

    #[test]
    fn checker_reports_invented_sources_and_ignores_links() {
        let chunks = [chunk("Guía IV › Evaluación", "El examen final es en enero.")];
        let answer =
            "El examen es en enero [guía iv › evaluación]. Vale el 60% [Reglamento 2019]. Ver [la web](https://x).";
        let r = check_citations(answer, &chunks);
        assert_eq!(r.cited, ["guía iv › evaluación"]);
        assert_eq!(r.unknown, ["Reglamento 2019"]);
        assert!(!r.is_clean());
    }

    #[test]
    fn decimals_do_not_end_sentences() {
        assert_eq!(sentences("Versión 3.5 estable. Fin"), vec![(0, 21), (21, 25)]);
    }

    fn search_output(citations: &[&str]) -> String {
        let results: Vec<serde_json::Value> =
            citations.iter().map(|c| serde_json::json!({"content": "…", "metadata": {"citation": c}})).collect();
        serde_json::json!({"ok": true, "results": results}).to_string()
    }

    #[test]
    fn an_answer_without_its_sources_gets_them() {
        let out = search_output(&["Guía › Evaluación", "Guía › Calendario", "Guía › Evaluación"]);
        assert_eq!(
            sources_footer(&[&out], "El 20 de enero.").as_deref(),
            Some("\n\n[Guía › Evaluación] [Guía › Calendario]")
        );
        assert_eq!(sources_footer(&[&out], "El 20 de enero [Guía › Calendario]."), None);
        assert_eq!(
            sources_footer(&[&out], "El 20 de enero [guía › calendario ]."),
            None,
            "as check_citations reads it"
        );
    }

    #[test]
    fn at_most_three_and_only_from_search_results() {
        let many = search_output(&["a", "b", "c", "d"]);
        assert_eq!(sources_footer(&[&many], "x").as_deref(), Some("\n\n[a] [b] [c]"));
        assert_eq!(sources_footer(&[r#"{"result": 7.4}"#, "not json"], "7.4"), None);
        assert_eq!(sources_footer(&[], "no search this turn"), None);
    }
}
