//! A BERT-layout sentence encoder on candle, shared by the e5-small (XLM-R layout) and
//! all-MiniLM-L6-v2 embedders: embeddings, post-LayerNorm transformer layers with exact-erf
//! GELU, masked mean pooling, and the length-sorted batching both embedders use.
//!
//! Weights are dequantised once at load and kept as f32, transposed to `[in, out]` so every
//! projection is one contiguous row-major matrix product over all the tokens of a batch (the
//! packed Q, K and V projection is a single product). Position ids start at 0 for both models
//! (the E5S1 file stores e5's table already shifted past XLM-R's padding offset).

mod ops;
pub mod weights;

use crate::LocalModelError;
use candle_core::{DType, Device, Tensor};
use ops::{GeluErf, MaskedSoftmax};
use std::collections::HashMap;
use toolgraph_embed::normalise;
use weights::{EmbeddingRows, EncoderShape, RawTensor, TensorData};

/// Padded tokens per forward pass: large enough for efficient matrix products, small enough
/// that a batch of 512-token windows keeps its attention scores in a few tens of MB.
const BATCH_TOKENS: usize = 8192;
const MAX_BATCH_SEQUENCES: usize = 128;

/// One sequence to encode: its framed token ids, the text it belongs to, and its weight in
/// that text's average (a text longer than the model's window is several windows).
#[derive(Debug, Clone)]
pub struct Window {
    /// Index of the text.
    pub text: usize,
    /// Framed ids (`<s> … </s>` or `[CLS] … [SEP]`).
    pub ids: Vec<u32>,
    /// Weight of this window's pooled vector in the text's vector.
    pub weight: f32,
}

struct Layer {
    qkv_w: Tensor,
    qkv_b: Tensor,
    out_w: Tensor,
    out_b: Tensor,
    attn_ln: (Tensor, Tensor),
    ffn_in_w: Tensor,
    ffn_in_b: Tensor,
    ffn_out_w: Tensor,
    ffn_out_b: Tensor,
    out_ln: (Tensor, Tensor),
}

/// The encoder's weights.
pub struct BertEncoder {
    header: EncoderShape,
    word: EmbeddingRows,
    position: Tensor,
    token_type: Tensor,
    embed_ln: (Tensor, Tensor),
    layers: Vec<Layer>,
    device: Device,
}

impl std::fmt::Debug for BertEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEncoder").field("header", &self.header).finish()
    }
}

struct Tensors {
    by_name: HashMap<String, TensorData>,
    device: Device,
}

impl Tensors {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, LocalModelError> {
        let values = self.raw(name)?.into_f32();
        let expected: usize = shape.iter().product();
        if values.len() != expected {
            return Err(LocalModelError::Format(format!(
                "tensor {name} has {} values, expected {shape:?}",
                values.len()
            )));
        }
        Ok(Tensor::from_vec(values, shape, &self.device)?)
    }

    fn raw(&mut self, name: &str) -> Result<TensorData, LocalModelError> {
        self.by_name.remove(name).ok_or_else(|| LocalModelError::Format(format!("missing tensor {name}")))
    }

    /// A `[out, in]` weight, stored transposed as a contiguous `[in, out]` matrix.
    fn weight_t(&mut self, name: &str, out: usize, inp: usize) -> Result<Tensor, LocalModelError> {
        Ok(self.take(name, &[out, inp])?.t()?.contiguous()?)
    }
}

impl BertEncoder {
    /// Builds the encoder from a parsed file (consuming its tensors).
    ///
    /// # Errors
    /// When a tensor is missing or has the wrong size.
    pub fn new(header: EncoderShape, tensors: Vec<RawTensor>) -> Result<Self, LocalModelError> {
        let device = Device::Cpu;
        let by_name = tensors.into_iter().map(|t| (t.name, t.data)).collect();
        let mut t = Tensors { by_name, device: device.clone() };
        let (h, ff) = (header.hidden, header.intermediate);
        let word = EmbeddingRows::new(t.raw("emb.word")?, h)?;
        if word.rows() != header.vocab_rows {
            return Err(LocalModelError::Format(format!(
                "word embeddings have {} rows, the header says {}",
                word.rows(),
                header.vocab_rows
            )));
        }
        let position = t.take("emb.pos", &[header.max_positions, h])?;
        // Only token type 0 is ever used: keep its row.
        let types = t.by_name.get("emb.type").map_or(0, |v| v.len() / h.max(1));
        let token_type = t.take("emb.type", &[types, h])?.narrow(0, 0, 1)?.reshape((1, 1, h))?;
        let embed_ln = (t.take("emb.ln.w", &[h])?, t.take("emb.ln.b", &[h])?);
        let mut layers = Vec::with_capacity(header.layers);
        for l in 0..header.layers {
            let p = |s: &str| format!("l{l}.{s}");
            let qkv_w = Tensor::cat(
                &[t.weight_t(&p("q.w"), h, h)?, t.weight_t(&p("k.w"), h, h)?, t.weight_t(&p("v.w"), h, h)?],
                1,
            )?;
            let qkv_b =
                Tensor::cat(&[t.take(&p("q.b"), &[h])?, t.take(&p("k.b"), &[h])?, t.take(&p("v.b"), &[h])?], 0)?;
            layers.push(Layer {
                qkv_w,
                qkv_b,
                out_w: t.weight_t(&p("ao.w"), h, h)?,
                out_b: t.take(&p("ao.b"), &[h])?,
                attn_ln: (t.take(&p("aln.w"), &[h])?, t.take(&p("aln.b"), &[h])?),
                ffn_in_w: t.weight_t(&p("fi.w"), ff, h)?,
                ffn_in_b: t.take(&p("fi.b"), &[ff])?,
                ffn_out_w: t.weight_t(&p("fo.w"), h, ff)?,
                ffn_out_b: t.take(&p("fo.b"), &[h])?,
                out_ln: (t.take(&p("oln.w"), &[h])?, t.take(&p("oln.b"), &[h])?),
            });
        }
        Ok(Self { header, word, position, token_type, embed_ln, layers, device })
    }

    /// The model's shape.
    pub fn header(&self) -> &EncoderShape {
        &self.header
    }

    /// One unit vector per text (`texts` of them) from its windows: windows are encoded in
    /// batches of similar length (longest first, so each batch pads to a length close to all
    /// of its members), pooled, and averaged per text by weight.
    ///
    /// # Errors
    /// As [`BertEncoder::pooled`].
    pub fn embed_windows(&self, windows: &[Window], texts: usize, pad: u32) -> Result<Vec<Vec<f32>>, LocalModelError> {
        let mut order: Vec<usize> = (0..windows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(windows[i].ids.len()));
        let mut sums = vec![vec![0f32; self.header.hidden]; texts];
        let mut start = 0;
        while start < order.len() {
            let longest = windows[order[start]].ids.len();
            let fit = (BATCH_TOKENS / longest.max(1)).clamp(1, MAX_BATCH_SEQUENCES);
            let end = (start + fit).min(order.len());
            let batch: Vec<&[u32]> = order[start..end].iter().map(|&i| windows[i].ids.as_slice()).collect();
            let pooled = self.pooled(&batch, pad)?;
            for (&i, vector) in order[start..end].iter().zip(pooled) {
                let w = &windows[i];
                let Some(sum) = sums.get_mut(w.text) else {
                    return Err(LocalModelError::Input(format!("window of text {} beyond {texts} texts", w.text)));
                };
                for (s, v) in sum.iter_mut().zip(vector) {
                    *s += w.weight * v;
                }
            }
            start = end;
        }
        // Dividing by the total weight does not change the direction: normalising is enough.
        sums.iter_mut().for_each(|v| normalise(v));
        Ok(sums)
    }

    /// Mean-pooled (not normalised) hidden states of each sequence of a batch. Every sequence
    /// is already framed (`<s> … </s>`) and at most `max_positions` long; shorter ones are
    /// padded and masked.
    ///
    /// # Errors
    /// When candle fails (shape bugs), or a sequence is longer than the position table.
    pub fn pooled(&self, sequences: &[&[u32]], pad: u32) -> Result<Vec<Vec<f32>>, LocalModelError> {
        let b = sequences.len();
        let len = sequences.iter().map(|s| s.len()).max().unwrap_or(0);
        if b == 0 || len == 0 {
            return Ok(vec![Vec::new(); b]);
        }
        if len > self.header.max_positions {
            return Err(LocalModelError::Input(format!(
                "a sequence of {len} tokens exceeds the model's {} positions",
                self.header.max_positions
            )));
        }
        let (h, heads) = (self.header.hidden, self.header.heads);
        let head_dim = h / heads;
        let mut ids = Vec::with_capacity(b * len);
        let mut mask = Vec::with_capacity(b * len);
        for s in sequences {
            ids.extend(s.iter().copied().chain(std::iter::repeat_n(pad, len - s.len())));
            mask.extend((0..len).map(|i| if i < s.len() { 1f32 } else { 0f32 }));
        }
        let softmax = MaskedSoftmax {
            lengths: sequences.iter().map(|s| s.len()).collect(),
            heads,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let mut rows = Vec::with_capacity(b * len * h);
        for &id in &ids {
            self.word.extend_row(id as usize, &mut rows)?;
        }
        let word = Tensor::from_vec(rows, (b, len, h), &self.device)?;
        let mask = Tensor::from_vec(mask, (b, len), &self.device)?;

        let x = word.broadcast_add(&self.position.narrow(0, 0, len)?.unsqueeze(0)?)?.broadcast_add(&self.token_type)?;
        let mut x = layer_norm(&x.reshape((b * len, h))?, &self.embed_ln, self.header.layer_norm_eps)?;

        for layer in &self.layers {
            let qkv = x.matmul(&layer.qkv_w)?.broadcast_add(&layer.qkv_b)?;
            let qkv = qkv.reshape((b, len, 3, heads, head_dim))?.permute((2, 0, 3, 1, 4))?;
            let q = qkv.get(0)?.contiguous()?;
            let k = qkv.get(1)?.contiguous()?;
            let v = qkv.get(2)?.contiguous()?;
            let probs = q.matmul(&k.t()?)?.apply_op1_no_bwd(&softmax)?;
            let ctx = probs.matmul(&v)?.transpose(1, 2)?.reshape((b * len, h))?;
            let attn = ctx.matmul(&layer.out_w)?.broadcast_add(&layer.out_b)?;
            x = layer_norm(&(x + attn)?, &layer.attn_ln, self.header.layer_norm_eps)?;
            let mid = x.matmul(&layer.ffn_in_w)?.broadcast_add(&layer.ffn_in_b)?.apply_op1_no_bwd(&GeluErf)?;
            let out = mid.matmul(&layer.ffn_out_w)?.broadcast_add(&layer.ffn_out_b)?;
            x = layer_norm(&(x + out)?, &layer.out_ln, self.header.layer_norm_eps)?;
        }
        let x = x.reshape((b, len, h))?;
        let m = mask.unsqueeze(2)?;
        let summed = x.broadcast_mul(&m)?.sum(1)?;
        let counts = m.sum(1)?;
        let mean = summed.broadcast_div(&counts)?;
        Ok(mean.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }
}

fn layer_norm(x: &Tensor, (w, b): &(Tensor, Tensor), eps: f32) -> Result<Tensor, LocalModelError> {
    Ok(candle_nn::ops::layer_norm(&x.contiguous()?, w, b, eps)?)
}
