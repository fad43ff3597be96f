//! [`SourceDocument`]: a document as read from a file or a record, before chunking.
//!
//! Parsers (markdown, text, HTML, PDF, JSON records) all produce this shape: an id, a title,
//! metadata, and sections that remember where they sit (heading path, page).

use serde_json::{Map, Value};

/// A document as parsed, before chunking.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SourceDocument {
    /// Stable id; every chunk of the document carries it as its parent id.
    pub id: String,
    /// Title (file name when the document has none).
    pub title: String,
    /// Metadata (front matter, path patterns, flags, mapped record fields).
    pub meta: Map<String, Value>,
    /// The document's text, in order.
    pub sections: Vec<Section>,
    /// A citation label given by the source (a record mapping's template), used as is.
    pub citation: Option<String>,
}

/// A run of text under one heading path, on one page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Section {
    /// Headings from the outermost down (empty before the first heading).
    pub headings: Vec<String>,
    /// 1-based page, for paginated sources.
    pub page: Option<u32>,
    /// The text.
    pub text: String,
}

impl SourceDocument {
    /// A document of one untitled section.
    pub fn plain(id: impl Into<String>, title: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            title: title.into(),
            sections: vec![Section { text: text.into(), ..Section::default() }],
            ..Self::default()
        }
    }

    /// All text, sections joined by blank lines.
    pub fn full_text(&self) -> String {
        let parts: Vec<&str> = self.sections.iter().map(|s| s.text.as_str()).collect();
        parts.join("\n\n")
    }
}
