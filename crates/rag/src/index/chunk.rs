//! [`Chunk`]: the unit a knowledge base stores and search returns, and the [`ChunkingOptions`]
//! its manifest records. Declared with the index because every stage after ingest reads them;
//! how a document is cut into chunks is ingest's job (`ingest::chunk`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How long chunks may get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkingOptions {
    /// Words per chunk at most.
    pub max_words: usize,
    /// Words shared by consecutive sub-chunks of one unit.
    pub overlap_words: usize,
}

impl Default for ChunkingOptions {
    fn default() -> Self {
        Self { max_words: 300, overlap_words: 50 }
    }
}

/// One indexed piece of a document.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// Unique within the knowledge base: `<doc id>::<unit>.<part>`.
    pub id: String,
    /// The parent document's id (results and evaluations aggregate on it).
    pub doc_id: String,
    /// The document's title.
    pub title: String,
    /// Heading path of the unit (outermost first).
    pub headings: Vec<String>,
    /// The text.
    pub text: String,
    /// The document's metadata plus the unit's (`page`, `article_number`, `article_title`).
    pub meta: Map<String, Value>,
    /// Citation label, e.g. "Điều 5, Luật Giao thông 2008".
    pub citation: String,
    /// 0-based part within its unit, and the number of parts.
    pub part: (u32, u32),
}
