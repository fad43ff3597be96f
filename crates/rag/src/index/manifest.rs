//! [`KbManifest`]: what a knowledge base records about itself in `kb.json`, so every later
//! ingest and search uses the analyzer, chunking, record mapping and embedding model it was
//! built with. Written atomically (a temporary file renamed over the old one).

use super::io_err;
use crate::RagError;
use crate::index::{Analyzer, ChunkingOptions, RecordMapping};
use serde::{Deserialize, Serialize};
use std::path::Path;
use toolgraph_embed::EmbeddingSettings;

/// The manifest format this build writes and reads (2: chunks may carry embedding vectors).
pub const KB_FORMAT: u32 = 2;

/// What a knowledge base records about itself (`kb.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbManifest {
    /// Manifest format version.
    pub format: u32,
    /// Owning tenant.
    pub tenant: String,
    /// Name.
    pub name: String,
    /// Keyword analyzer (fixed at creation: the index's terms depend on it).
    pub analyzer: Analyzer,
    /// Chunk sizes.
    pub chunking: ChunkingOptions,
    /// How JSON records map to documents, reused by later ingests.
    #[serde(default, skip_serializing_if = "RecordMapping::is_default")]
    pub mapping: RecordMapping,
    /// Dense embedding settings, once the knowledge base has vectors.
    #[serde(default)]
    pub embedding: Option<EmbeddingSettings>,
    /// Creation time, seconds since the Unix epoch.
    pub created_at: u64,
}

impl KbManifest {
    /// A new manifest with default chunking and mapping.
    pub fn new(tenant: &str, name: &str, analyzer: Analyzer) -> Self {
        Self {
            format: KB_FORMAT,
            tenant: tenant.to_owned(),
            name: name.to_owned(),
            analyzer,
            chunking: ChunkingOptions::default(),
            mapping: RecordMapping::default(),
            embedding: None,
            created_at: now_secs(),
        }
    }
}

/// Checks a tenant or knowledge-base name: 1–64 of `A-Za-z0-9_.-`, not starting with a dot
/// (names become directories).
///
/// # Errors
/// [`RagError::InvalidName`].
pub fn validate_name(what: &str, name: &str) -> Result<(), RagError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(RagError::InvalidName(format!(
            "{what} `{name}`: use 1-64 letters, digits, `_`, `-` or `.`, not starting with `.`"
        )))
    }
}

/// Reads `<dir>/kb.json` of `tenant`'s knowledge base `name`, refusing a manifest this build
/// cannot use.
///
/// # Errors
/// [`RagError::UnknownKb`] without a manifest; [`RagError::Manifest`] for one that does not
/// parse, describes inconsistent embeddings, or has another format.
pub(super) fn read_manifest(dir: &Path, tenant: &str, name: &str) -> Result<KbManifest, RagError> {
    let manifest_path = dir.join("kb.json");
    let raw = match std::fs::read_to_string(&manifest_path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RagError::UnknownKb { tenant: tenant.to_owned(), name: name.to_owned() });
        }
        Err(e) => return Err(io_err(&manifest_path, &e)),
    };
    let manifest: KbManifest = serde_json::from_str(&raw)
        .map_err(|e| RagError::Manifest { path: manifest_path.display().to_string(), reason: e.to_string() })?;
    if let Some(reason) = manifest.embedding.as_ref().and_then(EmbeddingSettings::inconsistency) {
        return Err(RagError::Manifest { path: manifest_path.display().to_string(), reason });
    }
    if manifest.format != KB_FORMAT {
        let reason = if manifest.format > KB_FORMAT {
            format!("format {} is newer than this build reads ({KB_FORMAT}); upgrade toolgraph", manifest.format)
        } else {
            format!(
                "format {} predates this build's format {KB_FORMAT} (chunks with embeddings); delete {} and ingest \
                     the documents again",
                manifest.format,
                dir.display()
            )
        };
        return Err(RagError::Manifest { path: manifest_path.display().to_string(), reason });
    }
    Ok(manifest)
}

/// Writes `<dir>/kb.json` through a renamed temporary file: a crash leaves the old manifest or
/// the new one, never half of one.
pub(super) fn write_manifest(dir: &Path, manifest: &KbManifest) -> Result<(), RagError> {
    let path = dir.join("kb.json");
    let tmp = dir.join("kb.json.tmp");
    let body = serde_json::to_vec_pretty(manifest)
        .map_err(|e| RagError::Manifest { path: path.display().to_string(), reason: e.to_string() })?;
    std::fs::write(&tmp, body).map_err(|e| io_err(&tmp, &e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, &e))
}

/// Seconds since the Unix epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
