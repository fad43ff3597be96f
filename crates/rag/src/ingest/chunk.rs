//! Chunking: a [`SourceDocument`] becomes citable units, and long units become overlapping,
//! word-bounded [`Chunk`]s that all carry their parent's id, metadata and citation label.
//!
//! Units follow the document's structure: a heading section, a PDF page, or a legal article
//! ("Điều N.", "Artículo N.", "Article N" at the start of a line — never inline, where laws
//! cite each other). Sizes are counted in whitespace-separated words, the unit both BM25 and a
//! reader see; a Korean or Vietnamese word is a word here too.

use crate::ingest::SourceDocument;
use regex::Regex;
use std::sync::LazyLock;

pub use crate::index::{Chunk, ChunkingOptions};

static ARTICLE: LazyLock<Regex> = LazyLock::new(|| {
    // Line start only; the number may carry a letter suffix (Điều 10a). Compiled from a
    // literal, so it cannot fail.
    Regex::new(
        r"(?m)^[ \t]*(Điều|Artículo|Articulo|ARTÍCULO|Article|ARTICLE)[ \t]+(\d+[a-zA-Z]?)\b[ \t]*[.:\-–]?[ \t]*(.*)$",
    )
    .expect("article pattern is a valid regex")
});

struct Unit {
    headings: Vec<String>,
    page: Option<u32>,
    text: String,
    article: Option<(String, String, String)>,
}

/// Splits a document into chunks. `split_articles` finds legal articles inside sections (off
/// for mapped records, which are already one article each).
pub fn chunk_document(doc: &SourceDocument, options: ChunkingOptions, split_articles: bool) -> Vec<Chunk> {
    let mut units = Vec::new();
    for section in &doc.sections {
        let heading_article = section.headings.last().and_then(|h| article_header(h));
        let starts: Vec<_> = if split_articles { ARTICLE.captures_iter(&section.text).collect() } else { Vec::new() };
        if starts.is_empty() || heading_article.is_some() {
            units.push(Unit {
                headings: section.headings.clone(),
                page: section.page,
                text: section.text.clone(),
                article: heading_article,
            });
            continue;
        }
        // Text before the first article (a preamble, a chapter title) is a unit of its own.
        let first = starts[0].get(0).map_or(0, |m| m.start());
        if !section.text[..first].trim().is_empty() {
            units.push(Unit {
                headings: section.headings.clone(),
                page: section.page,
                text: section.text[..first].trim().to_owned(),
                article: None,
            });
        }
        for (i, cap) in starts.iter().enumerate() {
            let start = cap.get(0).map_or(0, |m| m.start());
            let end = starts.get(i + 1).and_then(|c| c.get(0)).map_or(section.text.len(), |m| m.start());
            let word = cap.get(1).map_or("", |m| m.as_str());
            let number = cap.get(2).map_or("", |m| m.as_str());
            let title = cap.get(3).map_or("", |m| m.as_str().trim());
            units.push(Unit {
                headings: section.headings.clone(),
                page: section.page,
                text: section.text[start..end].trim().to_owned(),
                article: Some((normalize_article_word(word).to_owned(), number.to_owned(), title.to_owned())),
            });
        }
    }
    let mut chunks = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        let mut meta = doc.meta.clone();
        if let Some(page) = unit.page {
            meta.insert("page".into(), page.into());
        }
        if let Some((_, number, title)) = &unit.article {
            meta.insert("article_number".into(), number.clone().into());
            if !title.is_empty() {
                meta.insert("article_title".into(), title.clone().into());
            }
        }
        let citation = citation_label(doc, unit);
        let parts = split_words(&unit.text, options);
        let n = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        for (p, text) in parts.into_iter().enumerate() {
            chunks.push(Chunk {
                id: format!("{}::{u}.{p}", doc.id),
                doc_id: doc.id.clone(),
                title: doc.title.clone(),
                headings: unit.headings.clone(),
                text,
                meta: meta.clone(),
                citation: citation.clone(),
                part: (u32::try_from(p).unwrap_or(u32::MAX), n),
            });
        }
    }
    if chunks.is_empty() && !doc.title.trim().is_empty() {
        // A title-only record still deserves to be findable.
        chunks.push(Chunk {
            id: format!("{}::0.0", doc.id),
            doc_id: doc.id.clone(),
            title: doc.title.clone(),
            headings: Vec::new(),
            text: String::new(),
            meta: doc.meta.clone(),
            citation: doc.citation.clone().unwrap_or_else(|| doc.title.clone()),
            part: (0, 1),
        });
    }
    chunks
}

fn article_header(heading: &str) -> Option<(String, String, String)> {
    let cap = ARTICLE.captures(heading)?;
    Some((
        normalize_article_word(cap.get(1)?.as_str()).to_owned(),
        cap.get(2)?.as_str().to_owned(),
        cap.get(3).map_or("", |m| m.as_str()).trim().to_owned(),
    ))
}

fn normalize_article_word(w: &str) -> &'static str {
    match w {
        "Điều" => "Điều",
        "Artículo" | "Articulo" | "ARTÍCULO" => "Artículo",
        _ => "Article",
    }
}

/// "Điều 5, Luật Giao thông 2008"; "Guía IV › Evaluación › Examen"; "manual.pdf, p. 3".
fn citation_label(doc: &SourceDocument, unit: &Unit) -> String {
    if let Some(explicit) = &doc.citation {
        return explicit.clone();
    }
    let mut parts: Vec<&str> = Vec::new();
    if !doc.title.is_empty() {
        parts.push(&doc.title);
    }
    for h in &unit.headings {
        if parts.last() != Some(&h.as_str()) && article_header(h).is_none() {
            parts.push(h);
        }
    }
    let mut label = parts.join(" › ");
    if let Some((word, number, _)) = &unit.article {
        label = if label.is_empty() { format!("{word} {number}") } else { format!("{word} {number}, {label}") };
    }
    if let Some(page) = unit.page {
        label = format!("{label}, p. {page}");
    }
    if label.is_empty() { doc.id.clone() } else { label }
}

/// Word windows of at most `max_words`, consecutive windows sharing `overlap_words`; the text
/// of a window is the original text between its first and last word (line breaks kept).
fn split_words(text: &str, options: ChunkingOptions) -> Vec<String> {
    let spans: Vec<(usize, usize)> = word_spans(text);
    if spans.is_empty() {
        return Vec::new();
    }
    let max = options.max_words.max(1);
    if spans.len() <= max {
        return vec![text.trim().to_owned()];
    }
    let step = max.saturating_sub(options.overlap_words).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let end = (start + max).min(spans.len());
        out.push(text[spans[start].0..spans[end - 1].1].to_owned());
        if end == spans.len() {
            break;
        }
        start += step;
    }
    out
}

fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                spans.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push((s, text.len()));
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::Section;

    #[test]
    fn long_units_split_with_overlap_and_inherit_metadata() {
        let words: Vec<String> = (0..700).map(|i| format!("w{i}")).collect();
        let mut doc = SourceDocument::plain("law#1", "Phạm vi", words.join(" "));
        doc.meta.insert("law".into(), "Luật X".into());
        doc.citation = Some("Điều 1, Luật X".into());
        let chunks = chunk_document(&doc, ChunkingOptions { max_words: 300, overlap_words: 50 }, false);
        assert_eq!(chunks.len(), 3, "700 words, windows of 300 stepping 250");
        assert!(chunks[0].text.starts_with("w0 ") && chunks[0].text.ends_with(" w299"));
        assert!(chunks[1].text.starts_with("w250 "), "50 words of overlap");
        assert!(chunks[2].text.ends_with("w699"));
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.doc_id, "law#1");
            assert_eq!(c.meta["law"], "Luật X");
            assert_eq!(c.citation, "Điều 1, Luật X");
            assert_eq!(c.part, (i as u32, 3));
        }
        let ids: std::collections::HashSet<_> = chunks.iter().map(|c| &c.id).collect();
        assert_eq!(ids.len(), 3);
    }

    #[test]
    fn articles_split_at_line_starts_only() {
        let text = "LUẬT GIAO THÔNG\nĐiều 1. Phạm vi điều chỉnh\nLuật này quy định, theo Điều 5 và Điều 6, ...\nĐiều 2. Đối tượng áp dụng\nCá nhân.";
        let doc = SourceDocument::plain("gt.txt", "Luật Giao thông 2008", text);
        let chunks = chunk_document(&doc, ChunkingOptions::default(), true);
        assert_eq!(chunks.len(), 3, "{chunks:#?}");
        assert_eq!(chunks[0].text, "LUẬT GIAO THÔNG");
        assert_eq!(chunks[1].meta["article_number"], "1");
        assert_eq!(chunks[1].meta["article_title"], "Phạm vi điều chỉnh");
        assert!(chunks[1].text.contains("theo Điều 5 và Điều 6"), "inline references stay inside");
        assert_eq!(chunks[1].citation, "Điều 1, Luật Giao thông 2008");
        assert_eq!(chunks[2].citation, "Điều 2, Luật Giao thông 2008");
        let records = chunk_document(&doc, ChunkingOptions::default(), false);
        assert_eq!(records.len(), 1, "mapped records are not split");
    }

    #[test]
    fn labels_from_headings_and_pages() {
        let doc = SourceDocument {
            id: "guia.md".into(),
            title: "Guía IV".into(),
            sections: vec![
                Section {
                    headings: vec!["Evaluación".into(), "Examen final".into()],
                    page: None,
                    text: "Enero.".into(),
                },
                Section { headings: vec!["Artículo 3. Objeto".into()], page: None, text: "El objeto.".into() },
                Section { headings: vec![], page: Some(4), text: "Página cuatro.".into() },
            ],
            ..SourceDocument::default()
        };
        let c = chunk_document(&doc, ChunkingOptions::default(), true);
        assert_eq!(c[0].citation, "Guía IV › Evaluación › Examen final");
        assert_eq!(c[1].citation, "Artículo 3, Guía IV");
        assert_eq!(c[1].meta["article_title"], "Objeto");
        assert_eq!(c[2].citation, "Guía IV, p. 4");
        assert_eq!(c[2].meta["page"], 4);
    }
}
