//! A Qwen2 decoder over GGUF weights, on our own quantised kernels ([`super::kernels`]).
//!
//! Written here rather than taken from `candle-transformers` because the local chat model needs
//! what a generic implementation does not give: the KV cache is ours, so a new prompt reuses the
//! cached state of the longest prefix it shares with a cached one (system prompt + tool list)
//! and only the rest is computed, several prompts stay cached side by side (slots), and the
//! state of a prefix can be kept on disk; and a generated
//! token allocates only the logits it returns (and, now and then, room for the KV cache to
//! grow) and runs its products on the compact weights, fused where they read the same input,
//! which is what makes generation fast (docs/benchmarks.md). candle reads the GGUF file and
//! dequantises the small tensors at load.

use super::kernels::{Kernels, QMatrix, QuantizedActivations, SharedMut, WorkerPool, matmul};
use crate::LocalModelError;
use candle_core::quantized::{QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use half::f16;
use std::collections::HashMap;
use std::path::Path;
use toolgraph_embed::dot;

struct Layer {
    attn_norm: Vec<f32>,
    q: QMatrix,
    k: QMatrix,
    v: QMatrix,
    q_bias: Vec<f32>,
    k_bias: Vec<f32>,
    v_bias: Vec<f32>,
    o: QMatrix,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
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

impl Qwen2Shape {
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim()
    }
}

/// The buffers one forward pass works in, kept across calls, so a generated token does not
/// allocate them again.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attended: Vec<f32>,
    projected: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    quantized: QuantizedActivations,
}

/// A loaded Qwen2 model with its KV cache.
pub struct Qwen2 {
    shape: Qwen2Shape,
    /// The token embedding table, `vocab × hidden`, quantised as the file stores it; `None`
    /// when it is the output head's (tied weights, as in the Qwen2.5 models shipped). A token's
    /// row is dequantised when it is read: a table of `f16` would take 0.27 GB (0.5B) to 0.47 GB
    /// (1.5B), twice that while made, and seconds of every load (docs/benchmarks.md).
    embed: Option<QMatrix>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: QMatrix,
    /// `max_context × head_dim / 2` rotary tables.
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// The KV cache: one or more cached token sequences ([`Self::set_cache_slots`]).
    slots: Vec<KvSlot>,
    /// Counts slot uses, for least-recently-used eviction.
    clock: u64,
    kernels: Kernels,
    pool: &'static WorkerPool,
    scratch: Scratch,
    /// Tensors re-quantised to Q8_0 at load.
    pub requantised: usize,
}

/// One cached token sequence and, per layer, the keys and values of each of its tokens,
/// token-major (`[token][kv_head][head_dim]`): appending a token is a copy to the end.
#[derive(Default)]
struct KvSlot {
    tokens: Vec<u32>,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// The model's clock when the slot was last computed in; 0: never.
    used: u64,
}

impl KvSlot {
    fn empty(layers: usize) -> Self {
        Self { tokens: Vec::new(), keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers], used: 0 }
    }

    /// How many of `tokens` this slot holds from the start.
    fn shared_with(&self, tokens: &[u32]) -> usize {
        self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count()
    }

    fn truncate(&mut self, len: usize, kv_dim: usize) {
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
            k.truncate(len * kv_dim);
            v.truncate(len * kv_dim);
        }
        self.tokens.truncate(len);
    }

    /// Makes this slot hold `other`'s first `len` tokens (its buffers reused).
    fn copy_prefix(&mut self, other: &KvSlot, len: usize, kv_dim: usize) {
        self.truncate(0, kv_dim);
        for ((k, v), (ok, ov)) in self.keys.iter_mut().zip(&mut self.values).zip(other.keys.iter().zip(&other.values)) {
            k.extend_from_slice(&ok[..len * kv_dim]);
            v.extend_from_slice(&ov[..len * kv_dim]);
        }
        self.tokens.extend_from_slice(&other.tokens[..len]);
    }
}

impl std::fmt::Debug for Qwen2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen2").field("shape", &self.shape).field("cached", &self.cached_len()).finish()
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

/// A 1-D tensor as `f32` values of the expected length.
fn vector(qt: QTensor, name: &str, len: usize) -> Result<Vec<f32>, LocalModelError> {
    let v = qt.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
    if v.len() != len {
        return Err(LocalModelError::Format(format!("{name} has {} values, the model needs {len}", v.len())));
    }
    Ok(v)
}

impl Qwen2 {
    /// Names the numerics of the kept KV state: a prefix computed by another version of the
    /// kernels is computed again rather than mixed with this one's.
    pub const STATE_VERSION: &'static str = "kv2";

    /// Loads the weights of `ct` from `reader`, with rotary tables for `max_context` tokens.
    ///
    /// # Errors
    /// Missing tensors or metadata, shapes that do not fit the metadata, or I/O failures.
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
            || !shape.head_dim().is_multiple_of(2)
        {
            return Err(LocalModelError::Format(format!("unsupported attention shape {shape:?}")));
        }
        let (hidden, kv_dim) = (shape.hidden, shape.kv_dim());
        let mut requantised = 0;
        let mut raw = |name: &str| -> Result<QTensor, LocalModelError> {
            ct.tensor(reader, name, &device).map_err(|e| LocalModelError::Format(format!("tensor {name}: {e}")))
        };
        let table = QMatrix::from_qtensor(raw("token_embd.weight")?, "token_embd.weight", &mut requantised)?;
        if table.rows() == 0 || table.cols() != hidden {
            return Err(LocalModelError::Format(format!("token_embd.weight is not vocab × {hidden}")));
        }
        let (embed, lm_head) = match ct.tensor_infos.contains_key("output.weight") {
            true => (Some(table), QMatrix::from_qtensor(raw("output.weight")?, "output.weight", &mut requantised)?),
            false => (None, table),
        };
        let norm = vector(raw("output_norm.weight")?, "output_norm.weight", hidden)?;
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let mut vec = |s: &str, len: usize| vector(raw(&p(s))?, &p(s), len);
            let (attn_norm, ffn_norm) = (vec("attn_norm.weight", hidden)?, vec("ffn_norm.weight", hidden)?);
            let (q_bias, k_bias, v_bias) =
                (vec("attn_q.bias", hidden)?, vec("attn_k.bias", kv_dim)?, vec("attn_v.bias", kv_dim)?);
            let gate = QMatrix::from_qtensor(raw(&p("ffn_gate.weight"))?, &p("ffn_gate.weight"), &mut requantised)?;
            let ffn = gate.rows();
            let mut matrix = |s: &str, rows: usize, cols: usize| -> Result<QMatrix, LocalModelError> {
                let m = QMatrix::from_qtensor(raw(&p(s))?, &p(s), &mut requantised)?;
                if (m.rows(), m.cols()) != (rows, cols) {
                    return Err(LocalModelError::Format(format!(
                        "{} is {} × {}, the model needs {rows} × {cols}",
                        p(s),
                        m.rows(),
                        m.cols()
                    )));
                }
                Ok(m)
            };
            layers.push(Layer {
                attn_norm,
                q: matrix("attn_q.weight", hidden, hidden)?,
                k: matrix("attn_k.weight", kv_dim, hidden)?,
                v: matrix("attn_v.weight", kv_dim, hidden)?,
                q_bias,
                k_bias,
                v_bias,
                o: matrix("attn_output.weight", hidden, hidden)?,
                ffn_norm,
                up: matrix("ffn_up.weight", ffn, hidden)?,
                down: matrix("ffn_down.weight", hidden, ffn)?,
                gate,
            });
        }
        if lm_head.cols() != hidden || embed.as_ref().is_some_and(|e| e.rows() != lm_head.rows()) {
            return Err(LocalModelError::Format("the output head does not fit the embedding table".into()));
        }
        let half = shape.head_dim() / 2;
        let inv: Vec<f32> =
            (0..half).map(|i| 1.0 / shape.rope_theta.powf(2.0 * i as f32 / shape.head_dim() as f32)).collect();
        let angles = |f: fn(f32) -> f32| -> Vec<f32> {
            (0..shape.max_context).flat_map(|p| inv.iter().map(move |w| f(p as f32 * w))).collect()
        };
        Ok(Self {
            cos: angles(f32::cos),
            sin: angles(f32::sin),
            slots: vec![KvSlot::empty(shape.layers)],
            clock: 0,
            shape,
            embed,
            layers,
            norm,
            lm_head,
            kernels: Kernels::detect(),
            pool: WorkerPool::global(),
            scratch: Scratch::default(),
            requantised,
        })
    }

    /// The shape.
    pub fn shape(&self) -> Qwen2Shape {
        self.shape
    }

    /// Which kernels the products run on (`avx512-vnni`, `avx2`, `portable`).
    pub fn kernels(&self) -> &'static str {
        self.kernels.name
    }

    /// How many token sequences the KV cache keeps (at least 1; a model loads with 1). With
    /// more, prompts that alternate — an agent and a tool that asks the same model, two agents
    /// of one service — each find their own state instead of computing over the other's.
    /// Fewer than before drops the least recently used.
    pub fn set_cache_slots(&mut self, slots: usize) {
        let slots = slots.max(1);
        self.slots.sort_by_key(|s| std::cmp::Reverse(s.used));
        self.slots.truncate(slots);
        let layers = self.shape.layers;
        self.slots.resize_with(slots, || KvSlot::empty(layers));
    }

    /// How many token sequences the KV cache keeps.
    pub fn cache_slots(&self) -> usize {
        self.slots.len()
    }

    /// The token sequences the KV cache holds (empty slots left out).
    pub fn cached_sequences(&self) -> impl Iterator<Item = &[u32]> {
        self.slots.iter().map(|s| s.tokens.as_slice()).filter(|t| !t.is_empty())
    }

    /// How many of `tokens`, from the start, the KV cache holds: what [`Self::next_logits`]
    /// would not compute (but the last).
    pub fn cached_prefix(&self, tokens: &[u32]) -> usize {
        self.best_slot(tokens).1
    }

    /// Logits for the token after `tokens` (the whole prompt so far). The KV state of the
    /// longest prefix any cache slot shares with it is reused; returns the logits and how
    /// many tokens had to be computed.
    ///
    /// # Errors
    /// When the prompt is empty or longer than the context, or holds a token outside the
    /// vocabulary.
    pub fn next_logits(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, usize), LocalModelError> {
        self.check(tokens)?;
        let slot = self.slot_for(tokens);
        Ok(self.extend(slot, tokens))
    }

    fn check(&self, tokens: &[u32]) -> Result<(), LocalModelError> {
        if tokens.is_empty() || tokens.len() > self.shape.max_context {
            return Err(LocalModelError::Input(format!(
                "prompt of {} tokens (the context holds {})",
                tokens.len(),
                self.shape.max_context
            )));
        }
        let vocab = self.lm_head.rows();
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(LocalModelError::Input(format!("token {bad} is outside the vocabulary of {vocab}")));
        }
        Ok(())
    }

    /// The slot holding the longest prefix of `tokens` (the most recently used among equals),
    /// and that prefix's length.
    fn best_slot(&self, tokens: &[u32]) -> (usize, usize) {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.shared_with(tokens), s.used))
            .max_by_key(|&(_, shared, used)| (shared, used))
            .map_or((0, 0), |(i, shared, _)| (i, shared))
    }

    /// The slot `tokens` is computed in, holding the longest prefix of them that any slot
    /// holds. A slot whose tokens go on past that prefix (another conversation, or the tool
    /// call this one is continuing after) is left as it is: the prefix is copied into the
    /// least recently used slot, a copy of memory where computing it would take seconds.
    fn slot_for(&mut self, tokens: &[u32]) -> usize {
        let kv_dim = self.shape.kv_dim();
        let (best, shared) = self.best_slot(tokens);
        // The last token is always computed (its logits are the answer).
        let shared = shared.min(tokens.len() - 1);
        // Losing one token (the same prompt again, or one token changed) is not worth a slot.
        let diverges = self.slots[best].tokens.len() > shared + 1;
        let target = if diverges { self.least_recent() } else { best };
        if target == best {
            self.slots[best].truncate(shared, kv_dim);
        } else {
            let (src, dst) = if best < target {
                let (a, b) = self.slots.split_at_mut(target);
                (&a[best], &mut b[0])
            } else {
                let (a, b) = self.slots.split_at_mut(best);
                (&b[0], &mut a[target])
            };
            dst.copy_prefix(src, shared, kv_dim);
        }
        self.clock += 1;
        self.slots[target].used = self.clock;
        target
    }

    /// The least recently used slot (a never used one first).
    fn least_recent(&self) -> usize {
        self.slots.iter().enumerate().min_by_key(|(_, s)| s.used).map_or(0, |(i, _)| i)
    }

    /// The slot the last prompt was computed in (or loaded into).
    fn most_recent(&self) -> &KvSlot {
        // At least one slot: `set_cache_slots` keeps one, and `load` makes one.
        self.slots.iter().max_by_key(|s| s.used).expect("the cache has a slot")
    }

    /// Computes `tokens` in `slot` after the prefix it shares with them (all but the last at
    /// most); returns the logits and how many tokens were computed.
    fn extend(&mut self, slot: usize, tokens: &[u32]) -> (Vec<f32>, usize) {
        let kv_dim = self.shape.kv_dim();
        let shared = self.slots[slot].shared_with(tokens).min(tokens.len() - 1);
        self.slots[slot].truncate(shared, kv_dim);
        let new = &tokens[shared..];
        self.forward(slot, new, shared);
        self.slots[slot].tokens.extend_from_slice(new);
        (self.scratch.logits.clone(), new.len())
    }

    /// The logits after `tokens`, leaving the cache as it was: in the slot holding most of
    /// them, the cached tokens past the part `tokens` shares are set aside, `tokens` computed,
    /// then the slot put back. Costs the tokens past the shared part, and a copy of the cached
    /// rows after it.
    ///
    /// # Errors
    /// As [`Self::next_logits`].
    pub fn probe_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>, LocalModelError> {
        self.check(tokens)?;
        let (slot, shared) = self.best_slot(tokens);
        let kv_dim = self.shape.kv_dim();
        let s = &self.slots[slot];
        let kept_tokens = s.tokens[shared..].to_vec();
        let kept: Vec<(Vec<f32>, Vec<f32>)> = s
            .keys
            .iter()
            .zip(&s.values)
            .map(|(k, v)| (k[shared * kv_dim..].to_vec(), v[shared * kv_dim..].to_vec()))
            .collect();
        let (logits, _) = self.extend(slot, tokens);
        let s = &mut self.slots[slot];
        s.truncate(shared, kv_dim);
        for ((k, v), (kk, kv)) in s.keys.iter_mut().zip(&mut s.values).zip(kept) {
            k.extend_from_slice(&kk);
            v.extend_from_slice(&kv);
        }
        s.tokens.extend_from_slice(&kept_tokens);
        Ok(logits)
    }

    /// Bytes of weights one generated token reads: every projection matrix of every layer and
    /// the output head in their stored (quantised) form, the norms and biases, and one row of
    /// the embedding table. Decoding is bound by reading these once per token.
    pub fn weight_bytes_per_token(&self) -> usize {
        let floats = |v: &Vec<f32>| v.len() * 4;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].into_iter().map(QMatrix::bytes).sum::<usize>()
                    + [&l.attn_norm, &l.ffn_norm, &l.q_bias, &l.k_bias, &l.v_bias]
                        .into_iter()
                        .map(floats)
                        .sum::<usize>()
            })
            .sum();
        layers + self.lm_head.bytes() + floats(&self.norm) + self.embed.as_ref().unwrap_or(&self.lm_head).row_bytes()
    }

    /// Writes the first `len` cached tokens and their KV state to `path` (safetensors, each
    /// layer's keys and values as `[1, kv_heads, len, head_dim]`), so a later process can
    /// [`load_prefix`](Self::load_prefix) them instead of computing them. Written to a
    /// temporary file and renamed: a reader never sees half a file.
    ///
    /// # Errors
    /// Fewer than `len` tokens cached; the file cannot be written.
    pub fn save_prefix(&self, path: &Path, len: usize) -> Result<(), LocalModelError> {
        let slot = self.most_recent();
        if len == 0 || len > slot.tokens.len() {
            return Err(LocalModelError::Input(format!("{len} tokens asked, {} cached", slot.tokens.len())));
        }
        let s = self.shape;
        let (hd, kv_dim) = (s.head_dim(), s.kv_dim());
        // Token-major in memory, head-major in the file.
        let head_major = |cache: &[f32]| -> Result<Tensor, LocalModelError> {
            let mut out = Vec::with_capacity(len * kv_dim);
            for head in 0..s.kv_heads {
                for t in 0..len {
                    out.extend_from_slice(&cache[t * kv_dim + head * hd..t * kv_dim + (head + 1) * hd]);
                }
            }
            Ok(Tensor::from_vec(out, (1, s.kv_heads, len, hd), &Device::Cpu)?)
        };
        let mut tensors = HashMap::new();
        tensors.insert("tokens".to_owned(), Tensor::new(&slot.tokens[..len], &Device::Cpu)?);
        for (i, (k, v)) in slot.keys.iter().zip(&slot.values).enumerate() {
            tensors.insert(format!("k.{i}"), head_major(k)?);
            tensors.insert(format!("v.{i}"), head_major(v)?);
        }
        let io = |e: std::io::Error| LocalModelError::Io { path: path.display().to_string(), reason: e.to_string() };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let partial = path.with_extension(format!("partial-{}", std::process::id()));
        candle_core::safetensors::save(&tensors, &partial)?;
        std::fs::rename(&partial, path).map_err(io)
    }

    /// Puts the prefix [`save_prefix`](Self::save_prefix) wrote to `path` in the least
    /// recently used cache slot, as the most recent; returns how many tokens it holds. The next prompt reuses them as far as it shares
    /// them (the tokens are compared, so a prefix of other text is simply not reused).
    ///
    /// # Errors
    /// An unreadable file, or one whose state does not fit this model's shape; the cache is
    /// then left as it was.
    pub fn load_prefix(&mut self, path: &Path) -> Result<usize, LocalModelError> {
        let mut tensors = candle_core::safetensors::load(path, &Device::Cpu)?;
        let bad = |why: String| LocalModelError::Format(format!("{}: {why}", path.display()));
        let tokens: Vec<u32> = tensors.remove("tokens").ok_or_else(|| bad("no tokens".into()))?.to_vec1()?;
        let s = self.shape;
        if tokens.is_empty() || tokens.len() >= s.max_context {
            return Err(bad(format!("{} tokens", tokens.len())));
        }
        let (hd, kv_dim, len) = (s.head_dim(), s.kv_dim(), tokens.len());
        let expected = [1, s.kv_heads, len, hd];
        let token_major = |t: &Tensor| -> Result<Vec<f32>, LocalModelError> {
            let head_major = t.flatten_all()?.to_vec1::<f32>()?;
            let mut out = vec![0f32; len * kv_dim];
            for head in 0..s.kv_heads {
                for t in 0..len {
                    out[t * kv_dim + head * hd..t * kv_dim + (head + 1) * hd]
                        .copy_from_slice(&head_major[(head * len + t) * hd..(head * len + t + 1) * hd]);
                }
            }
            Ok(out)
        };
        let (mut keys, mut values) = (Vec::with_capacity(s.layers), Vec::with_capacity(s.layers));
        for i in 0..s.layers {
            let (Some(k), Some(v)) = (tensors.remove(&format!("k.{i}")), tensors.remove(&format!("v.{i}"))) else {
                return Err(bad(format!("layer {i} missing")));
            };
            if k.dims() != expected || v.dims() != expected || k.dtype() != DType::F32 || v.dtype() != DType::F32 {
                return Err(bad(format!("layer {i} is {:?}, this model needs {expected:?} f32", k.dims())));
            }
            keys.push(token_major(&k)?);
            values.push(token_major(&v)?);
        }
        let lru = self.least_recent();
        self.clock += 1;
        self.slots[lru] = KvSlot { tokens, keys, values, used: self.clock };
        Ok(len)
    }

    /// How many tokens the cache slot of the last prompt holds.
    pub fn cached_len(&self) -> usize {
        self.most_recent().tokens.len()
    }

    /// Forgets the KV cache, every slot of it.
    pub fn clear_cache(&mut self) {
        let kv_dim = self.shape.kv_dim();
        for slot in &mut self.slots {
            slot.truncate(0, kv_dim);
            slot.used = 0;
        }
    }

    /// Runs `tokens` at positions `pos..`, appending their keys and values to cache slot
    /// `slot`, and leaves the logits of the last one in `scratch.logits`.
    fn forward(&mut self, slot: usize, tokens: &[u32], pos: usize) {
        let s = self.shape;
        let (t, hidden, hd, kv_dim) = (tokens.len(), s.hidden, s.head_dim(), s.kv_dim());
        let eps = s.eps as f32;
        let (pool, kernels) = (self.pool, &self.kernels);
        let sc = &mut self.scratch;
        sc.x.clear();
        for &token in tokens {
            let start = sc.x.len();
            sc.x.resize(start + hidden, 0.0);
            let row = &mut sc.x[start..];
            // In range: `next_logits` checked every token against the vocabulary.
            self.embed.as_ref().unwrap_or(&self.lm_head).row_to_f32(token as usize, row);
            // Rounded to f16: the numerics the tool-call accuracy in docs/benchmarks.md was
            // measured with, when the table was kept as f16.
            row.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
        }
        resize(&mut sc.h, t * hidden);
        resize(&mut sc.q, t * hidden);
        resize(&mut sc.k, t * kv_dim);
        resize(&mut sc.v, t * kv_dim);
        resize(&mut sc.attended, t * hidden);
        resize(&mut sc.projected, t * hidden);
        let ffn = self.layers.first().map_or(0, |l| l.gate.rows());
        resize(&mut sc.gate, t * ffn);
        resize(&mut sc.up, t * ffn);
        let slot = &mut self.slots[slot];
        for ((layer, keys), values) in self.layers.iter().zip(&mut slot.keys).zip(&mut slot.values) {
            rms_norm(&sc.x, &layer.attn_norm, eps, &mut sc.h);
            matmul(
                pool,
                kernels,
                &mut sc.quantized,
                &sc.h,
                t,
                &mut [(&layer.q, &mut sc.q[..]), (&layer.k, &mut sc.k[..]), (&layer.v, &mut sc.v[..])],
            );
            add_rows(&mut sc.q, &layer.q_bias);
            add_rows(&mut sc.k, &layer.k_bias);
            add_rows(&mut sc.v, &layer.v_bias);
            for i in 0..t {
                let (cos, sin) = (&self.cos[(pos + i) * hd / 2..], &self.sin[(pos + i) * hd / 2..]);
                sc.q[i * hidden..(i + 1) * hidden].chunks_exact_mut(hd).for_each(|h| rope(h, cos, sin));
                sc.k[i * kv_dim..(i + 1) * kv_dim].chunks_exact_mut(hd).for_each(|h| rope(h, cos, sin));
            }
            keys.extend_from_slice(&sc.k);
            values.extend_from_slice(&sc.v);
            attention(pool, s, &sc.q, keys, values, pos, t, &mut sc.attended);
            matmul(pool, kernels, &mut sc.quantized, &sc.attended, t, &mut [(&layer.o, &mut sc.projected[..])]);
            add_to(&mut sc.x, &sc.projected);
            rms_norm(&sc.x, &layer.ffn_norm, eps, &mut sc.h);
            matmul(
                pool,
                kernels,
                &mut sc.quantized,
                &sc.h,
                t,
                &mut [(&layer.gate, &mut sc.gate[..]), (&layer.up, &mut sc.up[..])],
            );
            swiglu(pool, &mut sc.gate, &sc.up);
            matmul(pool, kernels, &mut sc.quantized, &sc.gate, t, &mut [(&layer.down, &mut sc.projected[..])]);
            add_to(&mut sc.x, &sc.projected);
        }
        let last = &sc.x[(t - 1) * hidden..];
        resize(&mut sc.h, hidden);
        rms_norm(last, &self.norm, eps, &mut sc.h);
        resize(&mut sc.logits, self.lm_head.rows());
        matmul(pool, kernels, &mut sc.quantized, &sc.h, 1, &mut [(&self.lm_head, &mut sc.logits[..])]);
    }
}

/// Sets `v`'s length to `len`; its contents are overwritten before they are read.
fn resize(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

/// `out[i] = x[i] / rms(x's row) · weight`, row by row.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (row, out) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = dot(row, row) / n as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, x), w) in out.iter_mut().zip(row).zip(weight) {
            *o = x * scale * w;
        }
    }
}

/// Adds `bias` to every row of `x`.
fn add_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    }
}

fn add_to(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

/// Rotates one head by its position's angles (the halves layout Qwen2 uses).
fn rope(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = head.len() / 2;
    let (a, b) = head.split_at_mut(half);
    for i in 0..half {
        let (x1, x2) = (a[i], b[i]);
        a[i] = x1 * cos[i] - x2 * sin[i];
        b[i] = x1 * sin[i] + x2 * cos[i];
    }
}

/// Causal attention of the `t` new queries (positions `pos..pos + t`) over every cached key,
/// one work item per query head and token.
#[allow(clippy::too_many_arguments)]
fn attention(
    pool: &WorkerPool,
    s: Qwen2Shape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    pos: usize,
    t: usize,
    out: &mut [f32],
) {
    let (hd, kv_dim, hidden, group) = (s.head_dim(), s.kv_dim(), s.hidden, s.heads / s.kv_heads);
    let scale = 1.0 / (hd as f32).sqrt();
    let target = SharedMut::new(out);
    thread_local! {
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    pool.for_each(s.heads * t, &|item| {
        let (i, head) = (item / s.heads, item % s.heads);
        let kv = head / group;
        let query = &q[i * hidden + head * hd..i * hidden + (head + 1) * hd];
        let visible = pos + i + 1;
        // SAFETY: item (i, head) owns `out[i * hidden + head * hd..][..hd]` alone.
        let out = unsafe { target.slice(i * hidden + head * hd, hd) };
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            scores.extend(
                (0..visible).map(|j| dot(query, &keys[j * kv_dim + kv * hd..j * kv_dim + (kv + 1) * hd]) * scale),
            );
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mut sum = 0.0;
            for v in scores.iter_mut() {
                *v = (*v - max).exp();
                sum += *v;
            }
            out.fill(0.0);
            for (j, p) in scores.iter().enumerate() {
                let p = p / sum;
                let value = &values[j * kv_dim + kv * hd..j * kv_dim + (kv + 1) * hd];
                out.iter_mut().zip(value).for_each(|(o, v)| *o += p * v);
            }
        });
    });
}

/// `gate = silu(gate) · up`, element-wise, in chunks across the pool.
fn swiglu(pool: &WorkerPool, gate: &mut [f32], up: &[f32]) {
    const CHUNK: usize = 2048;
    let n = gate.len();
    let target = SharedMut::new(gate);
    pool.for_each(n.div_ceil(CHUNK), &|c| {
        let range = c * CHUNK..((c + 1) * CHUNK).min(n);
        // SAFETY: chunk `c` owns this range of `gate` alone.
        let g = unsafe { target.slice(range.start, range.len()) };
        for (g, u) in g.iter_mut().zip(&up[range]) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
    });
}

/// The index of the largest logit (greedy decoding).
pub fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}
