//! [`RecordMapping`]: how JSON records become documents, declared rather than coded. Declared
//! and parsed here because the manifest records it for later ingests; `ingest::mapping` applies
//! it to records.
//!
//! Values are templates: literal text with `{path}` placeholders. A path is a dotted field path
//! in the current record; each leading `^` steps out to the enclosing record (the law around an
//! article). `{$first_line}` is the first non-empty line of the mapped text. A metadata
//! template that is one placeholder keeps the value's JSON type (numbers stay numbers).
//!
//! ALQAC's `law.json` (`[{id: law, articles: [{id: number, text}]}]`):
//!
//! ```toml
//! records = "articles"
//! id = "{^id}#{id}"
//! title = "{$first_line}"
//! citation = "Điều {id}, {^id}"
//! [meta]
//! law = "{^id}"
//! article_number = "{id}"
//! article_title = "{$first_line}"
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A declarative mapping from JSON records to documents. The default reads BEIR-style records:
/// `_id` (or `id`), `title`, `text` (or `content`/`body`), and `metadata` plus every other
/// scalar field as metadata.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordMapping {
    /// Slash-separated path of nested arrays whose items are the documents (`articles`,
    /// `chapters/articles`); absent: each top-level record is a document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<String>,
    /// Document id template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Text template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Title template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Citation label template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub citation: Option<String>,
    /// Metadata: name → template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
}

impl RecordMapping {
    /// Parses a mapping from TOML text.
    ///
    /// # Errors
    /// A readable reason (unknown key, bad template).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let m: Self = toml::from_str(text).map_err(|e| format!("record mapping: {e}"))?;
        m.validate()?;
        Ok(m)
    }

    /// Sets one key from a command-line `key=value` (`meta.NAME=template` for metadata).
    ///
    /// # Errors
    /// An unknown key or a missing `=`.
    pub fn set(&mut self, pair: &str) -> Result<(), String> {
        let (key, value) = pair.split_once('=').ok_or_else(|| format!("--map `{pair}`: expected KEY=TEMPLATE"))?;
        let value = value.to_owned();
        match key.trim() {
            "records" => self.records = Some(value),
            "id" => self.id = Some(value),
            "text" => self.text = Some(value),
            "title" => self.title = Some(value),
            "citation" => self.citation = Some(value),
            k => match k.strip_prefix("meta.") {
                Some(name) if !name.is_empty() => {
                    self.meta.insert(name.to_owned(), value);
                }
                _ => {
                    return Err(format!("--map `{k}`: unknown key (records, id, text, title, citation, meta.NAME)"));
                }
            },
        }
        self.validate()
    }

    /// Whether this is the default mapping.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    fn validate(&self) -> Result<(), String> {
        self.compile().map(|_| ())
    }

    /// The templates, parsed once for all records.
    pub(crate) fn compile(&self) -> Result<Compiled<'_>, String> {
        fn parse(t: &Option<String>) -> Result<Option<Template<'_>>, String> {
            t.as_deref().map(Template::parse).transpose()
        }
        Ok(Compiled {
            levels: self
                .records
                .as_deref()
                .map(|r| r.split('/').filter(|s| !s.is_empty()).collect())
                .unwrap_or_default(),
            id: parse(&self.id)?,
            text: parse(&self.text)?,
            title: parse(&self.title)?,
            citation: parse(&self.citation)?,
            meta: self
                .meta
                .iter()
                .map(|(k, t)| Ok((k.as_str(), Template::parse(t)?)))
                .collect::<Result<_, String>>()?,
        })
    }
}

/// A [`RecordMapping`] with its templates parsed.
pub(crate) struct Compiled<'m> {
    pub(crate) levels: Vec<&'m str>,
    pub(crate) id: Option<Template<'m>>,
    pub(crate) text: Option<Template<'m>>,
    pub(crate) title: Option<Template<'m>>,
    pub(crate) citation: Option<Template<'m>>,
    pub(crate) meta: Vec<(&'m str, Template<'m>)>,
}

/// A piece of a template.
pub(crate) enum Part<'t> {
    /// Text as written.
    Literal(&'t str),
    /// `{path}`, with a `^` per record stepped out of (`up`).
    Field { up: usize, path: &'t str },
    /// `{$first_line}`.
    FirstLine,
}

/// A parsed template.
pub(crate) struct Template<'t> {
    pub(crate) parts: Vec<Part<'t>>,
}

impl<'t> Template<'t> {
    pub(crate) fn parse(t: &'t str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = t;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(&rest[..open]));
            }
            let close = rest[open..].find('}').ok_or_else(|| format!("template `{t}`: `{{` without `}}`"))? + open;
            let inner = rest[open + 1..close].trim();
            if inner == "$first_line" {
                parts.push(Part::FirstLine);
            } else {
                let up = inner.chars().take_while(|c| *c == '^').count();
                let path = &inner[up..];
                if path.is_empty() || path.starts_with('$') {
                    return Err(format!("template `{t}`: `{{{inner}}}` names no field"));
                }
                parts.push(Part::Field { up, path });
            }
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest));
        }
        Ok(Self { parts })
    }
}
