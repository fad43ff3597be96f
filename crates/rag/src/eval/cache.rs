//! [`EmbeddingCache`]: chunk and query vectors on disk, keyed by the model's weights and the
//! exact texts, so a second evaluation of a corpus embeds nothing (embedding a BEIR corpus
//! takes minutes; searching it, seconds).

use crate::RagError;
use crate::embed::{EmbedKind, Embedder};
use crate::index::schema::{decode_vector, encode_vector};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use toolgraph_embed::cache_root;

/// Vectors on disk, one file per (model weights, text kind, exact list of texts).
#[derive(Debug, Clone)]
pub struct EmbeddingCache {
    dir: PathBuf,
}

impl EmbeddingCache {
    /// A cache in `dir` (created on first store).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `${XDG_CACHE_HOME:-$HOME/.cache}/toolgraph/embeddings`.
    pub fn default_dir() -> PathBuf {
        cache_root().join("embeddings")
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key: the model's weights hash, the kind, and a hash of every text in order.
    pub fn key(e: &dyn Embedder, kind: EmbedKind, texts: &[String]) -> String {
        let mut h = Sha256::new();
        for t in texts {
            h.update((t.len() as u64).to_le_bytes());
            h.update(t.as_bytes());
        }
        let settings = e.settings();
        let model = settings.sha256.get(..16).unwrap_or(&settings.sha256);
        let kind = match kind {
            EmbedKind::Query => "q",
            EmbedKind::Passage => "p",
        };
        format!("{model}-{kind}-{}", hex::encode(&h.finalize()[..12]))
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.f32"))
    }

    /// The cached vectors, if present and of the expected shape.
    pub fn load(&self, key: &str, rows: usize, dim: usize) -> Option<Vec<Vec<f32>>> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        if bytes.len() != rows * dim * 4 {
            return None;
        }
        Some(bytes.chunks_exact(dim * 4).map(decode_vector).collect())
    }

    /// Stores vectors (atomically; a failure only costs the next run the embedding time).
    pub fn store(&self, key: &str, vectors: &[Vec<f32>]) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self.dir.join(format!("{key}.tmp{}", std::process::id()));
            let bytes: Vec<u8> = vectors.iter().flat_map(|v| encode_vector(v)).collect();
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, self.path(key))
        };
        if let Err(e) = write() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not cache embeddings");
        }
    }
}

/// Embeds `texts` through the cache: returns the vectors, how many texts were embedded, and
/// whether every vector came from the cache. A combined embedder's models are cached one by
/// one, so a run that adds a model to another re-uses the other's vectors.
pub(super) fn embed_cached(
    e: &dyn Embedder,
    kind: EmbedKind,
    texts: &[String],
    cache: Option<&EmbeddingCache>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Vec<Vec<f32>>, usize, bool), RagError> {
    if !e.parts().is_empty() {
        let mut out: Vec<Vec<f32>> = texts.iter().map(|_| Vec::with_capacity(e.settings().dimension)).collect();
        let (mut embedded, mut all_hit) = (0, true);
        for part in e.parts() {
            let (vectors, n, hit) = embed_cached(part.as_ref(), kind, texts, cache, progress)?;
            embedded += n;
            all_hit &= hit;
            for (o, v) in out.iter_mut().zip(vectors) {
                o.extend(v);
            }
        }
        return Ok((out, embedded, all_hit));
    }
    let key = EmbeddingCache::key(e, kind, texts);
    if let Some(v) = cache.and_then(|c| c.load(&key, texts.len(), e.settings().dimension)) {
        return Ok((v, 0, true));
    }
    let v = embed_in_batches(e, texts, kind, progress)?;
    if let Some(c) = cache {
        c.store(&key, &v);
    }
    Ok((v, texts.len(), false))
}

fn embed_in_batches(
    e: &dyn Embedder,
    texts: &[String],
    kind: EmbedKind,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Vec<f32>>, RagError> {
    // Batches big enough for the model to sort and pack by length, small enough to report.
    const BATCH: usize = 512;
    let mut out = Vec::with_capacity(texts.len());
    for batch in texts.chunks(BATCH) {
        let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
        out.extend(e.embed(&refs, kind)?);
        progress(out.len(), texts.len());
    }
    Ok(out)
}
