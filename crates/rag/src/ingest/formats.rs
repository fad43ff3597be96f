//! File formats: markdown (with front matter), plain text, HTML, PDF; JSON and JSONL records go
//! through [`crate::RecordMapping`].
//!
//! Every parser turns bytes into [`SourceDocument`]s or a readable reason why it could not; a
//! caller skips that file with the reason and goes on (docs/retrieval.md, "Ingest").

use crate::index::RecordMapping;
use crate::ingest::{Section, SourceDocument};
use serde_json::{Map, Value};
use std::path::Path;

/// A supported input format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.md`, `.markdown`.
    Markdown,
    /// `.txt`.
    Text,
    /// `.html`, `.htm`.
    Html,
    /// `.pdf`.
    Pdf,
    /// `.json`: one record or an array of records.
    Json,
    /// `.jsonl`, `.ndjson`: one record per line.
    JsonLines,
}

impl Format {
    /// The format a file's extension says, if supported.
    pub fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        Some(match ext.as_str() {
            "md" | "markdown" => Self::Markdown,
            "txt" | "text" => Self::Text,
            "html" | "htm" => Self::Html,
            "pdf" => Self::Pdf,
            "json" => Self::Json,
            "jsonl" | "ndjson" => Self::JsonLines,
            _ => return None,
        })
    }
}

/// Parses one file's bytes. `id` is the document id for single-document formats (the path
/// relative to the ingested root); `title` the fallback title (the file name).
///
/// # Errors
/// A readable reason the file cannot be used.
pub fn parse(
    format: Format,
    bytes: &[u8],
    id: &str,
    title: &str,
    mapping: &RecordMapping,
) -> Result<Vec<SourceDocument>, String> {
    let text = || std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 text ({e})"));
    let docs = match format {
        Format::Markdown => vec![parse_markdown(text()?, id, title)?],
        Format::Text => vec![SourceDocument::plain(id, title, text()?.trim().to_owned())],
        Format::Html => vec![parse_html(text()?, id, title)],
        Format::Pdf => vec![parse_pdf(bytes, id, title)?],
        Format::Json => {
            let value: Value = serde_json::from_str(text()?).map_err(|e| format!("invalid JSON: {e}"))?;
            let records = match value {
                Value::Array(items) => items,
                other => vec![other],
            };
            mapping.apply(records.iter().enumerate().map(|(i, r)| (format!("record {}", i + 1), r)))?
        }
        Format::JsonLines => {
            let mut records = Vec::new();
            for (n, line) in text()?.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let value: Value =
                    serde_json::from_str(line).map_err(|e| format!("line {}: invalid JSON: {e}", n + 1))?;
                records.push((format!("line {}", n + 1), value));
            }
            mapping.apply(records.iter().map(|(w, r)| (w.clone(), r)))?
        }
    };
    if docs.iter().all(|d| d.sections.iter().all(|s| s.text.trim().is_empty()) && d.title.trim().is_empty())
        || docs.is_empty()
    {
        return Err("no text found".into());
    }
    Ok(docs)
}

/// Markdown: optional front matter (`---` YAML or `+++` TOML) becomes metadata; ATX and setext
/// headings build each section's heading path; fenced code is text, never a heading.
fn parse_markdown(text: &str, id: &str, fallback_title: &str) -> Result<SourceDocument, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (meta, body) = split_front_matter(text)?;
    let mut doc = SourceDocument { id: id.to_owned(), meta, ..SourceDocument::default() };
    let mut headings: Vec<(usize, String)> = Vec::new();
    let mut current = String::new();
    let mut in_fence = false;
    let lines: Vec<&str> = body.lines().collect();
    let mut first_h1: Option<String> = None;
    let flush = |current: &mut String, headings: &[(usize, String)], doc: &mut SourceDocument| {
        let text = current.trim();
        if !text.is_empty() {
            doc.sections.push(Section {
                headings: headings.iter().map(|(_, h)| h.clone()).collect(),
                page: None,
                text: text.to_owned(),
            });
        }
        current.clear();
    };
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
        }
        let heading = if in_fence {
            None
        } else if let Some(h) = atx_heading(trimmed) {
            Some(h)
        } else if !trimmed.is_empty() && i + 1 < lines.len() && !trimmed.starts_with(['-', '*', '>', '|']) {
            let under = lines[i + 1].trim();
            if !under.is_empty() && under.chars().all(|c| c == '=') {
                i += 1;
                Some((1, trimmed.trim().to_owned()))
            } else if under.len() >= 2 && under.chars().all(|c| c == '-') && current.trim().is_empty() {
                i += 1;
                Some((2, trimmed.trim().to_owned()))
            } else {
                None
            }
        } else {
            None
        };
        match heading {
            Some((level, title)) => {
                flush(&mut current, &headings, &mut doc);
                headings.retain(|(l, _)| *l < level);
                if level == 1 && first_h1.is_none() {
                    first_h1 = Some(title.clone());
                }
                headings.push((level, title));
            }
            None => {
                current.push_str(line);
                current.push('\n');
            }
        }
        i += 1;
    }
    flush(&mut current, &headings, &mut doc);
    doc.title = match doc.meta.get("title") {
        Some(Value::String(t)) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => first_h1.unwrap_or_else(|| fallback_title.to_owned()),
    };
    if let Some(Value::String(explicit)) = doc.meta.get("id") {
        doc.id = explicit.clone();
    }
    Ok(doc)
}

fn atx_heading(line: &str) -> Option<(usize, String)> {
    let level = line.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &line[level..];
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim();
    (!title.is_empty()).then(|| (level, title.to_owned()))
}

fn split_front_matter(text: &str) -> Result<(Map<String, Value>, &str), String> {
    for (fence, yaml) in [("---", true), ("+++", false)] {
        let Some(rest) = text.strip_prefix(fence).and_then(|r| r.strip_prefix('\n').or(r.strip_prefix("\r\n"))) else {
            continue;
        };
        let close = format!("\n{fence}");
        let Some(end) = rest.find(&close) else {
            return Err(format!("front matter opened with `{fence}` is never closed"));
        };
        let raw = &rest[..end];
        let after = &rest[end + close.len()..];
        let body = after.split_once('\n').map_or("", |(_, b)| b);
        let value: Value = if yaml {
            serde_norway::from_str(raw).map_err(|e| format!("front matter is not valid YAML: {e}"))?
        } else {
            let t: toml::Value = toml::from_str(raw).map_err(|e| format!("front matter is not valid TOML: {e}"))?;
            serde_json::to_value(t).map_err(|e| format!("front matter: {e}"))?
        };
        return match value {
            Value::Object(map) => Ok((map, body)),
            Value::Null => Ok((Map::new(), body)),
            _ => Err("front matter must be a mapping of keys to values".into()),
        };
    }
    Ok((Map::new(), text))
}

/// HTML: the `<title>` (or first `<h1>`) is the title; `<h1>`–`<h6>` build heading paths; the
/// text of block elements becomes paragraphs; scripts, styles and navigation are dropped.
fn parse_html(text: &str, id: &str, fallback_title: &str) -> SourceDocument {
    use scraper::{Html, Node};
    let html = Html::parse_document(text);
    let mut walker = HtmlWalker::default();
    walker.walk(html.tree.root());
    walker.flush();
    let title = html
        .tree
        .root()
        .descendants()
        .find_map(|n| match n.value() {
            Node::Element(e) if e.name() == "title" => {
                let t: String = n.descendants().filter_map(|d| d.value().as_text().map(|t| t.to_string())).collect();
                let t = collapse_ws(&t);
                (!t.is_empty()).then_some(t)
            }
            _ => None,
        })
        .or(walker.first_h1.clone())
        .unwrap_or_else(|| fallback_title.to_owned());
    SourceDocument { id: id.to_owned(), title, sections: walker.sections, ..SourceDocument::default() }
}

#[derive(Default)]
struct HtmlWalker {
    headings: Vec<(usize, String)>,
    current: String,
    sections: Vec<Section>,
    first_h1: Option<String>,
}

impl HtmlWalker {
    /// Depth-first over the tree with a stack of its own: a hostile page nests elements tens
    /// of thousands deep, which recursion would answer with a stack overflow.
    fn walk(&mut self, root: ego_tree::NodeRef<'_, scraper::Node>) {
        use scraper::Node;
        enum Step<'a> {
            Enter(ego_tree::NodeRef<'a, Node>),
            BlockEnd,
        }
        let mut stack = vec![Step::Enter(root)];
        while let Some(step) = stack.pop() {
            let node = match step {
                Step::BlockEnd => {
                    self.current.push('\n');
                    continue;
                }
                Step::Enter(node) => node,
            };
            match node.value() {
                Node::Text(t) => self.current.push_str(t),
                Node::Element(e) => {
                    let name = e.name();
                    if matches!(name, "script" | "style" | "noscript" | "template" | "head" | "nav" | "svg") {
                        continue;
                    }
                    if let Some(level) =
                        name.strip_prefix('h').and_then(|l| l.parse::<usize>().ok()).filter(|l| (1..=6).contains(l))
                    {
                        let text: String =
                            node.descendants().filter_map(|d| d.value().as_text().map(|t| t.to_string())).collect();
                        let text = collapse_ws(&text);
                        if !text.is_empty() {
                            self.flush();
                            self.headings.retain(|(l, _)| *l < level);
                            if level == 1 && self.first_h1.is_none() {
                                self.first_h1 = Some(text.clone());
                            }
                            self.headings.push((level, text));
                        }
                        continue;
                    }
                    let block = matches!(
                        name,
                        "p" | "div"
                            | "li"
                            | "tr"
                            | "td"
                            | "th"
                            | "pre"
                            | "blockquote"
                            | "dd"
                            | "dt"
                            | "section"
                            | "article"
                            | "br"
                            | "table"
                            | "ul"
                            | "ol"
                            | "figcaption"
                            | "caption"
                            | "main"
                    );
                    if block {
                        stack.push(Step::BlockEnd);
                    }
                    // Pushed last to first, so they are taken in document order.
                    stack.extend(node.children().rev().map(Step::Enter));
                }
                _ => stack.extend(node.children().rev().map(Step::Enter)),
            }
        }
    }

    fn flush(&mut self) {
        let lines: Vec<String> = self.current.lines().map(collapse_ws).filter(|l| !l.is_empty()).collect();
        if !lines.is_empty() {
            self.sections.push(Section {
                headings: self.headings.iter().map(|(_, h)| h.clone()).collect(),
                page: None,
                text: lines.join("\n"),
            });
        }
        self.current.clear();
    }
}

fn collapse_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// PDF: one section per page with its page number. A parser panic on a hostile file is caught
/// and reported as a reason, like any other malformed file.
fn parse_pdf(bytes: &[u8], id: &str, title: &str) -> Result<SourceDocument, String> {
    let pages = std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem_by_pages(bytes))
        .map_err(|_| "the PDF parser failed on this file (malformed PDF)".to_owned())?
        .map_err(|e| format!("not a readable PDF: {e}"))?;
    let sections: Vec<Section> = pages
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let lines: Vec<String> = text.lines().map(collapse_ws).filter(|l| !l.is_empty()).collect();
            (!lines.is_empty()).then(|| Section {
                headings: Vec::new(),
                page: Some(u32::try_from(i + 1).unwrap_or(u32::MAX)),
                text: lines.join("\n"),
            })
        })
        .collect();
    if sections.is_empty() {
        return Err("the PDF has no extractable text (a scanned image?)".into());
    }
    Ok(SourceDocument { id: id.to_owned(), title: title.to_owned(), sections, ..SourceDocument::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_front_matter_and_heading_paths() {
        let md = "---\ntitle: Guía docente IV\nasignatura: iv\nsemestre: 1\n---\n# Evaluación\nIntro.\n\n## Examen final\nEl examen es en enero.\n```\n# not a heading\n```\nSetext\n======\nBody\n";
        let doc = parse_markdown(md, "guia.md", "guia").unwrap();
        assert_eq!(doc.title, "Guía docente IV");
        assert_eq!(doc.meta["asignatura"], "iv");
        assert_eq!(doc.meta["semestre"], 1);
        let paths: Vec<Vec<String>> = doc.sections.iter().map(|s| s.headings.clone()).collect();
        assert_eq!(paths[0], ["Evaluación"]);
        assert_eq!(paths[1], ["Evaluación", "Examen final"]);
        assert!(doc.sections[1].text.contains("# not a heading"));
        assert_eq!(paths[2], ["Setext"]);
    }

    #[test]
    fn markdown_bad_front_matter_is_a_reason() {
        let err = parse_markdown("---\ntitle: [unclosed\n---\nx", "a.md", "a").unwrap_err();
        assert!(err.contains("YAML"), "{err}");
        let err = parse_markdown("---\ntitle: x\n", "a.md", "a").unwrap_err();
        assert!(err.contains("never closed"), "{err}");
        let (meta, body) = split_front_matter("+++\nasignatura = \"iv\"\n+++\nhola").unwrap();
        assert_eq!((meta["asignatura"].as_str(), body), (Some("iv"), "hola"));
    }

    #[test]
    fn html_headings_paragraphs_no_scripts() {
        let html = "<html><head><title>Normativa</title><style>p{}</style></head><body><nav>Menu</nav>\
                    <h1>Reglamento</h1><p>Texto <b>uno</b>.</p><script>alert(1)</script>\
                    <h2>Artículo 3</h2><ul><li>a</li><li>b</li></ul></body></html>";
        let doc = parse_html(html, "n.html", "n");
        assert_eq!(doc.title, "Normativa");
        assert_eq!(doc.sections.len(), 2);
        assert_eq!(doc.sections[0].text, "Texto uno.");
        assert_eq!(doc.sections[1].headings, ["Reglamento", "Artículo 3"]);
        assert_eq!(doc.sections[1].text, "a\nb");
        assert!(!doc.full_text().contains("alert") && !doc.full_text().contains("Menu"));
    }

    #[test]
    fn deeply_nested_html_is_read_without_overflowing_the_stack() {
        let depth = 20_000;
        let text = format!("{}deep text{}", "<div>".repeat(depth), "</div>".repeat(depth));
        // A small stack, as a worker thread may have: recursion would need far more.
        let doc = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || parse_html(&text, "d", "deep"))
            .unwrap()
            .join()
            .expect("no stack overflow");
        assert_eq!(doc.sections.len(), 1);
        assert_eq!(doc.sections[0].text, "deep text");
    }

    #[test]
    fn broken_inputs_give_reasons() {
        let m = RecordMapping::default();
        assert!(parse(Format::Json, b"{not json", "x", "x", &m).unwrap_err().contains("invalid JSON"));
        assert!(parse(Format::JsonLines, b"{\"text\":\"a\"}\n{", "x", "x", &m).unwrap_err().starts_with("line 2"));
        assert!(parse(Format::Text, &[0xff, 0xfe, 0x00], "x", "x", &m).unwrap_err().contains("UTF-8"));
        assert!(parse(Format::Pdf, b"%PDF-1.4 garbage", "x", "x", &m).is_err());
        assert!(parse(Format::Text, b"   ", "x", "", &m).unwrap_err().contains("no text"));
    }
}
