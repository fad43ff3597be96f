//! A Qwen2 decoder over GGUF weights, on candle's quantised matrix kernels.
//!
//! Written here rather than taken from `candle-transformers` for two reasons the local chat
//! model needs: the KV cache is ours, so a new prompt reuses the cached state of the prefix it
//! shares with the previous one (system prompt + tool list) and only the rest is computed; and
//! tensors in formats without a SIMD kernel (Q5_0, which the 0.5B model uses for 133 tensors
//! because its width 896 is not a multiple of 256) are re-quantised to Q8_0 at load.

use crate::LocalModelError;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{DType, Device, Module, Tensor};
use std::collections::HashMap;
use std::path::Path;

struct Layer {
    attn_norm: Tensor,
    q: QMatMul,
    k: QMatMul,
    v: QMatMul,
    q_bias: Tensor,
    k_bias: Tensor,
    v_bias: Tensor,
    o: QMatMul,
    ffn_norm: Tensor,
    gate: QMatMul,
    up: QMatMul,
    down: QMatMul,
}

/// Model shape from the GGUF metadata.
#[derive(Debug, Clone, Copy)]
pub struct Qwen2Shape {
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention).
    pub kv_heads: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE base.
    pub rope_theta: f32,
    /// Longest context this instance allocates rotary tables for.
    pub max_context: usize,
}

/// A loaded Qwen2 model with its KV cache.
pub struct Qwen2 {
    shape: Qwen2Shape,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: QMatMul,
    cos: Tensor,
    sin: Tensor,
    cache: Vec<Option<(Tensor, Tensor)>>,
    cached_tokens: Vec<u32>,
    device: Device,
    /// Tensors re-quantised to Q8_0 at load.
    pub requantised: usize,
}

impl std::fmt::Debug for Qwen2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen2").field("shape", &self.shape).field("cached", &self.cached_tokens.len()).finish()
    }
}

fn md_usize(ct: &gguf_file::Content, key: &str) -> Result<usize, LocalModelError> {
    ct.metadata
        .get(key)
        .and_then(|v| v.to_u32().ok())
        .map(|v| v as usize)
        .ok_or_else(|| LocalModelError::Format(format!("GGUF metadata lacks {key}")))
}

fn md_f32(ct: &gguf_file::Content, key: &str) -> Result<f32, LocalModelError> {
    ct.metadata
        .get(key)
        .and_then(|v| v.to_f32().ok())
        .ok_or_else(|| LocalModelError::Format(format!("GGUF metadata lacks {key}")))
}

impl Qwen2 {
    /// Loads the weights of `ct` from `reader`, with rotary tables for `max_context` tokens.
    ///
    /// # Errors
    /// Missing tensors or metadata, or I/O failures.
    pub fn load<R: std::io::Read + std::io::Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        max_context: usize,
    ) -> Result<Self, LocalModelError> {
        let device = Device::Cpu;
        let shape = Qwen2Shape {
            layers: md_usize(ct, "qwen2.block_count")?,
            hidden: md_usize(ct, "qwen2.embedding_length")?,
            heads: md_usize(ct, "qwen2.attention.head_count")?,
            kv_heads: md_usize(ct, "qwen2.attention.head_count_kv")?,
            eps: f64::from(md_f32(ct, "qwen2.attention.layer_norm_rms_epsilon")?),
            rope_theta: md_f32(ct, "qwen2.rope.freq_base").unwrap_or(10_000.0),
            max_context: max_context.min(md_usize(ct, "qwen2.context_length").unwrap_or(max_context)),
        };
        if shape.heads == 0
            || shape.kv_heads == 0
            || !shape.hidden.is_multiple_of(shape.heads)
            || !shape.heads.is_multiple_of(shape.kv_heads)
        {
            return Err(LocalModelError::Format(format!("unsupported attention shape {shape:?}")));
        }
        let mut requantised = 0;
        let mut raw = |name: &str| -> Result<QTensor, LocalModelError> {
            ct.tensor(reader, name, &device).map_err(|e| LocalModelError::Format(format!("tensor {name}: {e}")))
        };
        let matmul = |qt: QTensor, count: &mut usize| -> Result<QMatMul, LocalModelError> {
            // candle's Q5_0 dot product is scalar; Q8_0 has an AVX2 kernel and keeps the precision.
            let qt = if qt.dtype() == GgmlDType::Q5_0 {
                *count += 1;
                QTensor::quantize(&qt.dequantize(&device)?, GgmlDType::Q8_0)?
            } else {
                qt
            };
            Ok(QMatMul::from_qtensor(qt)?)
        };
        let embed_q = raw("token_embd.weight")?;
        // f16 halves the table (151,936 × 896) against f32; rows are widened per lookup.
        let embed = embed_q.dequantize(&device)?.to_dtype(DType::F16)?;
        let lm_head = match ct.tensor_infos.contains_key("output.weight") {
            true => matmul(raw("output.weight")?, &mut requantised)?,
            false => matmul(embed_q, &mut requantised)?,
        };
        let norm = raw("output_norm.weight")?.dequantize(&device)?;
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let vec = |raw: &mut dyn FnMut(&str) -> Result<QTensor, LocalModelError>,
                       s: &str|
             -> Result<Tensor, LocalModelError> { Ok(raw(&p(s))?.dequantize(&device)?) };
            let attn_norm = vec(&mut raw, "attn_norm.weight")?;
            let ffn_norm = vec(&mut raw, "ffn_norm.weight")?;
            let q_bias = vec(&mut raw, "attn_q.bias")?;
            let k_bias = vec(&mut raw, "attn_k.bias")?;
            let v_bias = vec(&mut raw, "attn_v.bias")?;
            layers.push(Layer {
                attn_norm,
                q: matmul(raw(&p("attn_q.weight"))?, &mut requantised)?,
                k: matmul(raw(&p("attn_k.weight"))?, &mut requantised)?,
                v: matmul(raw(&p("attn_v.weight"))?, &mut requantised)?,
                q_bias,
                k_bias,
                v_bias,
                o: matmul(raw(&p("attn_output.weight"))?, &mut requantised)?,
                ffn_norm,
                gate: matmul(raw(&p("ffn_gate.weight"))?, &mut requantised)?,
                up: matmul(raw(&p("ffn_up.weight"))?, &mut requantised)?,
                down: matmul(raw(&p("ffn_down.weight"))?, &mut requantised)?,
            });
        }
        let head_dim = shape.hidden / shape.heads;
        let inv: Vec<f32> =
            (0..head_dim / 2).map(|i| 1.0 / shape.rope_theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
        let inv = Tensor::from_vec(inv, (1, head_dim / 2), &device)?;
        let t = Tensor::arange(0u32, shape.max_context as u32, &device)?
            .to_dtype(DType::F32)?
            .reshape((shape.max_context, 1))?;
        let freqs = t.matmul(&inv)?;
        Ok(Self {
            cos: freqs.cos()?,
            sin: freqs.sin()?,
            cache: vec![None; shape.layers],
            cached_tokens: Vec::new(),
            shape,
            embed,
            layers,
            norm,
            lm_head,
            device,
            requantised,
        })
    }

    /// The shape.
    pub fn shape(&self) -> Qwen2Shape {
        self.shape
    }

    /// Logits for the token after `tokens` (the whole prompt so far). The KV state of the
    /// longest prefix shared with the previous call is reused; returns the logits and how
    /// many tokens had to be computed.
    ///
    /// # Errors
    /// When the prompt is empty or longer than the context, or candle fails.
    pub fn next_logits(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, usize), LocalModelError> {
        if tokens.is_empty() || tokens.len() > self.shape.max_context {
            return Err(LocalModelError::Input(format!(
                "prompt of {} tokens (the context holds {})",
                tokens.len(),
                self.shape.max_context
            )));
        }
        // Keep at least the last token to compute, so there are logits to return.
        let shared = self.cached_tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
        if shared < self.cached_tokens.len() {
            for slot in &mut self.cache {
                if let Some((k, v)) = slot.take() {
                    *slot = if shared == 0 { None } else { Some((k.narrow(2, 0, shared)?, v.narrow(2, 0, shared)?)) };
                }
            }
            self.cached_tokens.truncate(shared);
        }
        let new = &tokens[shared..];
        let logits = self.forward(new, shared)?;
        self.cached_tokens.extend_from_slice(new);
        Ok((logits, new.len()))
    }

    /// Bytes of weights one generated token reads: every projection matrix of every layer and
    /// the output head in their stored (quantised) form, the norms and biases, and one row of
    /// the embedding table. Decoding is bound by reading these once per token.
    pub fn weight_bytes_per_token(&self) -> usize {
        fn qm(m: &QMatMul) -> usize {
            match m {
                QMatMul::QTensor(t) => t.storage_size_in_bytes(),
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.elem_count() * t.dtype().size_in_bytes(),
            }
        }
        fn dense(t: &Tensor) -> usize {
            t.elem_count() * t.dtype().size_in_bytes()
        }
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].into_iter().map(qm).sum::<usize>()
                    + [&l.attn_norm, &l.ffn_norm, &l.q_bias, &l.k_bias, &l.v_bias].into_iter().map(dense).sum::<usize>()
            })
            .sum();
        layers + qm(&self.lm_head) + dense(&self.norm) + self.shape.hidden * DType::F16.size_in_bytes()
    }

    /// Writes the first `len` cached tokens and their KV state to `path` (safetensors), so a
    /// later process can [`load_prefix`](Self::load_prefix) them instead of computing them.
    /// Written to a temporary file and renamed: a reader never sees half a file.
    ///
    /// # Errors
    /// Fewer than `len` tokens cached; the file cannot be written.
    pub fn save_prefix(&self, path: &Path, len: usize) -> Result<(), LocalModelError> {
        if len == 0 || len > self.cached_tokens.len() {
            return Err(LocalModelError::Input(format!("{len} tokens asked, {} cached", self.cached_tokens.len())));
        }
        let mut tensors = HashMap::new();
        tensors.insert("tokens".to_owned(), Tensor::new(&self.cached_tokens[..len], &self.device)?);
        for (i, slot) in self.cache.iter().enumerate() {
            let Some((k, v)) = slot else {
                return Err(LocalModelError::Input(format!("layer {i} has no cached state")));
            };
            tensors.insert(format!("k.{i}"), k.narrow(2, 0, len)?.contiguous()?);
            tensors.insert(format!("v.{i}"), v.narrow(2, 0, len)?.contiguous()?);
        }
        let io = |e: std::io::Error| LocalModelError::Io { path: path.display().to_string(), reason: e.to_string() };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let partial = path.with_extension(format!("partial-{}", std::process::id()));
        candle_core::safetensors::save(&tensors, &partial)?;
        std::fs::rename(&partial, path).map_err(io)
    }

    /// Replaces the KV cache with the prefix [`save_prefix`](Self::save_prefix) wrote to
    /// `path`; returns how many tokens it holds. The next prompt reuses them as far as it shares
    /// them (the tokens are compared, so a prefix of other text is simply not reused).
    ///
    /// # Errors
    /// An unreadable file, or one whose state does not fit this model's shape.
    pub fn load_prefix(&mut self, path: &Path) -> Result<usize, LocalModelError> {
        let mut tensors = candle_core::safetensors::load(path, &self.device)?;
        let bad = |why: String| LocalModelError::Format(format!("{}: {why}", path.display()));
        let tokens: Vec<u32> = tensors.remove("tokens").ok_or_else(|| bad("no tokens".into()))?.to_vec1()?;
        let s = self.shape;
        let expected = [1, s.kv_heads, tokens.len(), s.hidden / s.heads];
        let mut cache = Vec::with_capacity(s.layers);
        for i in 0..s.layers {
            let (Some(k), Some(v)) = (tensors.remove(&format!("k.{i}")), tensors.remove(&format!("v.{i}"))) else {
                return Err(bad(format!("layer {i} missing")));
            };
            if k.dims() != expected || v.dims() != expected {
                return Err(bad(format!("layer {i} is {:?}, this model needs {expected:?}", k.dims())));
            }
            cache.push(Some((k, v)));
        }
        if tokens.is_empty() || tokens.len() >= s.max_context {
            return Err(bad(format!("{} tokens", tokens.len())));
        }
        self.cache = cache;
        self.cached_tokens = tokens;
        Ok(self.cached_tokens.len())
    }

    /// How many tokens the KV cache holds.
    pub fn cached_len(&self) -> usize {
        self.cached_tokens.len()
    }

    /// Forgets the KV cache.
    pub fn clear_cache(&mut self) {
        self.cache.iter_mut().for_each(|c| *c = None);
        self.cached_tokens.clear();
    }

    fn forward(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<f32>, LocalModelError> {
        let s = self.shape;
        let (t, head_dim) = (tokens.len(), s.hidden / s.heads);
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?.to_dtype(DType::F32)?.unsqueeze(0)?;
        let cos = self.cos.narrow(0, pos, t)?;
        let sin = self.sin.narrow(0, pos, t)?;
        let mask = (t > 1)
            .then(|| {
                let m: Vec<f32> = (0..t)
                    .flat_map(|i| (0..pos + t).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }))
                    .collect();
                Tensor::from_vec(m, (1, 1, t, pos + t), &self.device)
            })
            .transpose()?;
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (head_dim as f64).sqrt();
        for (layer, cache) in self.layers.iter().zip(self.cache.iter_mut()) {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, s.eps as f32)?;
            let q = layer.q.forward(&h)?.broadcast_add(&layer.q_bias)?;
            let k = layer.k.forward(&h)?.broadcast_add(&layer.k_bias)?;
            let v = layer.v.forward(&h)?.broadcast_add(&layer.v_bias)?;
            let q = q.reshape((1, t, s.heads, head_dim))?.transpose(1, 2)?.contiguous()?;
            let k = k.reshape((1, t, s.kv_heads, head_dim))?.transpose(1, 2)?.contiguous()?;
            let v = v.reshape((1, t, s.kv_heads, head_dim))?.transpose(1, 2)?.contiguous()?;
            let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
            let (k, v) = match cache.take() {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                None => (k, v),
            };
            let total = k.dim(2)?;
            // Grouped-query attention without copying the cache per query head: query head
            // `kv * group + g` reads key/value head `kv`, so the `group` query heads of one kv
            // head become extra rows of one product against that head's keys and values.
            let q = q.reshape((1, s.kv_heads, group * t, head_dim))?;
            let mut att = (q.matmul(&k.t()?)? * scale)?;
            if let Some(m) = &mask {
                att = att.reshape((1, s.kv_heads, group, t, total))?.broadcast_add(&m.unsqueeze(1)?)?;
            }
            let att = candle_nn::ops::softmax_last_dim(&att)?.reshape((1, s.kv_heads, group * t, total))?;
            let out = att.matmul(&v)?.reshape((1, s.heads, t, head_dim))?.transpose(1, 2)?.reshape((1, t, s.hidden))?;
            *cache = Some((k, v));
            x = (x + layer.o.forward(&out)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, s.eps as f32)?;
            let ffn =
                layer.down.forward(&(candle_nn::ops::silu(&layer.gate.forward(&h)?)? * layer.up.forward(&h)?)?)?;
            x = (x + ffn)?;
        }
        let last = x.narrow(1, t - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, s.eps as f32)?;
        let logits = self.lm_head.forward(&last)?.squeeze(0)?.squeeze(0)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec1::<f32>()?)
    }
}

/// The index of the largest logit (greedy decoding).
pub fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}
