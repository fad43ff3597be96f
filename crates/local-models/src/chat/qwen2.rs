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
    /// How many of the last tokens are a draft ([`Qwen2::draft_logits`]) the caller has not
    /// taken yet: a prompt that parts from them goes on in this slot rather than in a copy.
    drafted: usize,
    /// The model's clock when the slot was last computed in; 0: never.
    used: u64,
}

impl KvSlot {
    fn empty(layers: usize) -> Self {
        Self {
            tokens: Vec::new(),
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            drafted: 0,
            used: 0,
        }
    }

    /// The tokens that are no draft.
    fn committed(&self) -> usize {
        self.tokens.len() - self.drafted
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
        self.drafted = self.drafted.saturating_sub(self.tokens.len().saturating_sub(len));
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
        self.drafted = other.drafted.saturating_sub(other.tokens.len() - len);
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
    pub const STATE_VERSION: &'static str = "kv3";

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
            || shape.heads / shape.kv_heads > MAX_GROUP
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

    /// The vocabulary's size: the width of a row of logits.
    pub fn vocab(&self) -> usize {
        self.lm_head.rows()
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
        Ok(self.extend(slot, tokens, 0))
    }

    /// Logits for the token after `tokens` and for the token after each longer prompt
    /// `tokens + draft[..i]`, `i = 1..=draft.len()`, computed in one pass: rows of the
    /// vocabulary's width, row `i` bit for bit what [`Self::next_logits`] gives for that prompt
    /// (every token's arithmetic is the same however many are computed together). One pass
    /// over a few tokens reads the weights once, as one token does, so a draft that is right
    /// gives its tokens for little more than one token's time (speculative decoding). The
    /// drafted tokens stay in the cache until a prompt parts from them; returns the rows and
    /// how many of `tokens` were computed.
    ///
    /// # Errors
    /// As [`Self::next_logits`], for `tokens` and `draft` together.
    pub fn draft_logits(&mut self, tokens: &[u32], draft: &[u32]) -> Result<(Vec<f32>, usize), LocalModelError> {
        let mut all = Vec::with_capacity(tokens.len() + draft.len());
        all.extend_from_slice(tokens);
        all.extend_from_slice(draft);
        if tokens.is_empty() {
            return Err(LocalModelError::Input("an empty prompt".into()));
        }
        self.check(&all)?;
        let slot = self.slot_for(tokens);
        Ok(self.extend(slot, &all, draft.len()))
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
        // A draft the prompt did not take is no other sequence.
        let diverges = self.slots[best].committed() > shared + 1;
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
        &self.slots[self.most_recent_index()]
    }

    fn most_recent_index(&self) -> usize {
        // At least one slot: `set_cache_slots` keeps one, and `load` makes one.
        self.slots.iter().enumerate().max_by_key(|(_, s)| s.used).map(|(i, _)| i).expect("the cache has a slot")
    }

    /// Computes `tokens` in `slot` after the prefix it shares with them (all but the last
    /// `drafted + 1` at most); returns the logits of the last `drafted + 1` and how many tokens
    /// before the draft were computed.
    fn extend(&mut self, slot: usize, tokens: &[u32], drafted: usize) -> (Vec<f32>, usize) {
        let kv_dim = self.shape.kv_dim();
        let committed = tokens.len() - drafted;
        let shared = self.slots[slot].shared_with(&tokens[..committed]).min(committed - 1);
        self.slots[slot].truncate(shared, kv_dim);
        let new = &tokens[shared..];
        self.forward(slot, new, shared, drafted + 1);
        let s = &mut self.slots[slot];
        s.tokens.extend_from_slice(new);
        s.drafted = drafted;
        (self.scratch.logits.clone(), committed - shared)
    }

    /// Ends a reply written with drafts: in the slot it was computed in, the drafted tokens
    /// past those `tokens` shares are dropped and the rest count as computed, so the cache holds
    /// what computing `tokens` one at a time would have left.
    pub fn settle_draft(&mut self, tokens: &[u32]) {
        let kv_dim = self.shape.kv_dim();
        let recent = self.most_recent_index();
        let s = &mut self.slots[recent];
        if s.drafted == 0 {
            return;
        }
        let keep = s.shared_with(tokens).max(s.committed());
        s.truncate(keep, kv_dim);
        s.drafted = 0;
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
        let (kept_tokens, drafted) = (s.tokens[shared..].to_vec(), s.drafted);
        let kept: Vec<(Vec<f32>, Vec<f32>)> = s
            .keys
            .iter()
            .zip(&s.values)
            .map(|(k, v)| (k[shared * kv_dim..].to_vec(), v[shared * kv_dim..].to_vec()))
            .collect();
        let (logits, _) = self.extend(slot, tokens, 0);
        let s = &mut self.slots[slot];
        s.truncate(shared, kv_dim);
        for ((k, v), (kk, kv)) in s.keys.iter_mut().zip(&mut s.values).zip(kept) {
            k.extend_from_slice(&kk);
            v.extend_from_slice(&kv);
        }
        s.tokens.extend_from_slice(&kept_tokens);
        s.drafted = drafted;
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

    /// Multiply-adds of the matrix products one prompt token costs (every projection of every
    /// layer, rows × columns; not attention, which grows with the position, nor the output
    /// head, which a prompt computes for its last token only).
    pub fn multiply_adds_per_token(&self) -> usize {
        let size = |m: &QMatrix| m.rows() * m.cols();
        self.layers
            .iter()
            .map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].into_iter().map(size).sum::<usize>())
            .sum()
    }

    /// The multiply-adds per second the chosen kernels' instructions issue on `threads`
    /// threads ([`Kernels::multiply_adds_per_s`]); `None` for the portable kernels.
    pub fn multiply_adds_per_s(&self, threads: usize) -> Option<f64> {
        self.kernels.multiply_adds_per_s(threads)
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
        self.slots[lru] = KvSlot { tokens, keys, values, drafted: 0, used: self.clock };
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
    /// `slot`, and leaves the logits of the last `outputs` (at least one) in `scratch.logits`,
    /// a row each.
    fn forward(&mut self, slot: usize, tokens: &[u32], pos: usize, outputs: usize) {
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
        let outputs = outputs.clamp(1, t);
        let last = &sc.x[(t - outputs) * hidden..];
        resize(&mut sc.h, outputs * hidden);
        rms_norm(last, &self.norm, eps, &mut sc.h);
        resize(&mut sc.logits, outputs * self.lm_head.rows());
        matmul(pool, kernels, &mut sc.quantized, &sc.h, outputs, &mut [(&self.lm_head, &mut sc.logits[..])]);
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
/// one work item per token and group of query heads sharing a key-value head.
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
    // The query heads that share a key-value head go together, so each key and value comes
    // from memory once for all of them (at a thousand positions a layer's keys and values
    // outgrow L2); a group splits into parts only where there would otherwise be too few items
    // to keep every thread busy (one generated token). Each head's arithmetic is the same as
    // alone, in the same order.
    let items = t * s.kv_heads;
    let parts = pool.threads().div_ceil(items.max(1)).clamp(1, group);
    let per_part = group.div_ceil(parts);
    pool.for_each(items * parts, &|item| {
        let (i, rest) = (item / (s.kv_heads * parts), item % (s.kv_heads * parts));
        let (kv, part) = (rest / parts, rest % parts);
        let first = kv * group + part * per_part;
        let heads = first..(first + per_part).min((kv + 1) * group);
        let visible = pos + i + 1;
        let rows = HeadRows { kv_dim, offset: kv * hd, hd };
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            scores.resize(heads.len() * visible, 0.0);
            let queries = &q[i * hidden + heads.start * hd..i * hidden + heads.end * hd];
            head_scores(queries, keys, rows, visible, scale, scores);
            let mut inverse = [0f32; MAX_GROUP];
            for (h, scores) in scores.chunks_exact_mut(visible).enumerate() {
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                inverse[h] = 1.0 / exp_minus(scores, max);
            }
            // The weights in place: each is the product the sum below used to form per value.
            for (h, weights) in scores.chunks_exact_mut(visible).enumerate() {
                weights.iter_mut().for_each(|w| *w *= inverse[h]);
            }
            // SAFETY: item (i, heads) owns `out[i * hidden + head * hd..][..hd]` of its heads
            // alone, and they are contiguous.
            let out = unsafe { target.slice(i * hidden + heads.start * hd, heads.len() * hd) };
            weighted_values(scores, values, rows, visible, out);
        });
    });
}

/// Where one key-value head's rows are in the cache: position `j`'s `hd` values at `offset`
/// of its `kv_dim`.
#[derive(Clone, Copy)]
struct HeadRows {
    kv_dim: usize,
    offset: usize,
    hd: usize,
}

impl HeadRows {
    fn row(self, j: usize) -> std::ops::Range<usize> {
        j * self.kv_dim + self.offset..j * self.kv_dim + self.offset + self.hd
    }
}

/// `scores[h · visible + j] = dot_fused(query h, key j) · scale` for the heads in `queries`
/// (`hd` values each, one after another).
fn head_scores(queries: &[f32], keys: &[f32], rows: HeadRows, visible: usize, scale: f32, scores: &mut [f32]) {
    let hd = rows.hd;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if hd.is_multiple_of(32) && queries.len() / hd <= MAX_GROUP {
        // SAFETY: AVX2 and FMA are enabled for the whole build (this block's `cfg`); the
        // shapes were just checked.
        return unsafe { x86::head_scores(queries, keys, rows, visible, scale, scores) };
    }
    for j in 0..visible {
        let key = &keys[rows.row(j)];
        if let Some(ahead) = keys.get(rows.row(j + PREFETCH)) {
            prefetch(ahead);
        }
        for (h, query) in queries.chunks_exact(hd).enumerate() {
            scores[h * visible + j] = dot_fused(query, key) * scale;
        }
    }
}

/// `out[h] = Σ_j weights[h · visible + j] · value j`, each output value's fused multiply-adds
/// in the order of the positions (`out` holds the heads' `hd` values one after another).
fn weighted_values(weights: &[f32], values: &[f32], rows: HeadRows, visible: usize, out: &mut [f32]) {
    out.fill(0.0);
    let hd = rows.hd;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if hd.is_multiple_of(64) {
        // SAFETY: AVX2 and FMA are enabled for the whole build (this block's `cfg`); the
        // shapes were just checked.
        return unsafe { x86::weighted_values(weights, values, rows, visible, out) };
    }
    for j in 0..visible {
        let value = &values[rows.row(j)];
        if let Some(ahead) = values.get(rows.row(j + PREFETCH)) {
            prefetch(ahead);
        }
        for (h, out) in out.chunks_exact_mut(hd).enumerate() {
            let p = weights[h * visible + j];
            out.iter_mut().zip(value).for_each(|(o, v)| *o = p.mul_add(*v, *o));
        }
    }
}

/// Attention's AVX2 loops: the same arithmetic as the portable ones, bit for bit, with fewer
/// instructions per position.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod x86 {
    use super::{HeadRows, MAX_GROUP, PREFETCH, prefetch};
    use std::arch::x86_64::*;

    /// [`super::dot_fused`]'s four eight-lane sums over whole pieces of 32, added pairwise:
    /// `(s0 + s1) + (s2 + s3)`. Written with the intrinsics: the compiler's own vectorisation
    /// of the portable loop shuffled and spilled (a third of a long prompt's time).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn lane_sums(ca: std::slice::ChunksExact<'_, f32>, cb: std::slice::ChunksExact<'_, f32>) -> __m256 {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (x, y) in ca.zip(cb) {
            for (k, acc) in acc.iter_mut().enumerate() {
                // SAFETY: `x` and `y` are 32 floats, so offset 8k + 8 stays inside.
                let (x, y) =
                    unsafe { (_mm256_loadu_ps(x.as_ptr().add(8 * k)), _mm256_loadu_ps(y.as_ptr().add(8 * k))) };
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))
    }

    /// [`super::head_scores`] for `hd` a multiple of 32 and at most [`MAX_GROUP`] heads. Each
    /// score's four eight-lane sums are [`lane_sums`], as in [`super::dot_fused`]; their lanes are then added for
    /// eight positions at once (two rounds of `hadd` and one cross-half add: the same pairs,
    /// `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`) instead of one score at a time
    /// through memory, which cost more than the products at a thousand positions.
    ///
    /// # Safety
    /// AVX2 and FMA are present; `queries` holds whole heads of `hd` values; every key row
    /// `j < visible` has `hd` values at `offset`; `scores` holds `visible` per head.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn head_scores(
        queries: &[f32],
        keys: &[f32],
        rows: HeadRows,
        visible: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let hd = rows.hd;
        let heads = queries.len() / hd;
        let mut pending = [[_mm256_setzero_ps(); 8]; MAX_GROUP];
        for j in 0..visible {
            let key = &keys[rows.row(j)];
            if let Some(ahead) = keys.get(rows.row(j + PREFETCH)) {
                prefetch(ahead);
            }
            for (h, query) in queries.chunks_exact(hd).enumerate() {
                pending[h][j % 8] = lane_sums(query.chunks_exact(32), key.chunks_exact(32));
            }
            if j % 8 == 7 || j + 1 == visible {
                let (base, count) = (j - j % 8, j % 8 + 1);
                for (h, lanes) in pending.iter_mut().enumerate().take(heads) {
                    lanes[count..].fill(_mm256_setzero_ps());
                    let h01 = _mm256_hadd_ps(lanes[0], lanes[1]);
                    let h23 = _mm256_hadd_ps(lanes[2], lanes[3]);
                    let h45 = _mm256_hadd_ps(lanes[4], lanes[5]);
                    let h67 = _mm256_hadd_ps(lanes[6], lanes[7]);
                    // `low4`: positions base..base + 4, their `(l0 + l1) + (l2 + l3)` in lanes
                    // 0–3 and `(l4 + l5) + (l6 + l7)` in lanes 4–7; `high4` the same for the
                    // next four positions.
                    let (low4, high4) = (_mm256_hadd_ps(h01, h23), _mm256_hadd_ps(h45, h67));
                    // (l0 + l1) + (l2 + l3) of the eight positions, then (l4 + l5) + (l6 + l7).
                    let first = _mm256_permute2f128_ps::<0x20>(low4, high4);
                    let second = _mm256_permute2f128_ps::<0x31>(low4, high4);
                    // `+ 0.0` as `dot_fused` adds the (empty) rest: −0 becomes +0 there too.
                    let sums = _mm256_add_ps(_mm256_add_ps(first, second), _mm256_setzero_ps());
                    let mut out = [0f32; 8];
                    // SAFETY: `out` is 8 floats.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(sums, _mm256_set1_ps(scale))) };
                    scores[h * visible + base..][..count].copy_from_slice(&out[..count]);
                }
            }
        }
    }

    /// Positions a pass of [`weighted_values`] covers: their value rows (half a kilobyte of
    /// each) stay in L1 while every head's outputs pass over them.
    const BLOCK: usize = 32;

    /// [`super::weighted_values`] for `hd` a multiple of 64: sixty-four of a head's outputs
    /// stay in registers across a block of positions, where the portable loop loads and stores
    /// every head's outputs at every position (bound by its stores).
    ///
    /// # Safety
    /// AVX2 and FMA are present; `out` holds whole heads of `hd` values; every value row
    /// `j < visible` has `hd` values at `offset`; `weights` holds `visible` per head.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_values(
        weights: &[f32],
        values: &[f32],
        rows: HeadRows,
        visible: usize,
        out: &mut [f32],
    ) {
        let hd = rows.hd;
        for start in (0..visible).step_by(BLOCK) {
            let block = start..(start + BLOCK).min(visible);
            for j in block.clone() {
                if let Some(row) = values.get(rows.row(j + BLOCK)) {
                    prefetch(row);
                }
            }
            for (h, out) in out.chunks_exact_mut(hd).enumerate() {
                let weights = &weights[h * visible..(h + 1) * visible];
                for (c, part) in out.chunks_exact_mut(64).enumerate() {
                    // SAFETY: `part` is 64 floats.
                    let mut acc: [__m256; 8] =
                        std::array::from_fn(|k| unsafe { _mm256_loadu_ps(part.as_ptr().add(8 * k)) });
                    for j in block.clone() {
                        let p = _mm256_set1_ps(weights[j]);
                        let row = &values[rows.row(j)][64 * c..][..64];
                        for (k, acc) in acc.iter_mut().enumerate() {
                            // SAFETY: `row` is 64 floats.
                            *acc = _mm256_fmadd_ps(p, unsafe { _mm256_loadu_ps(row.as_ptr().add(8 * k)) }, *acc);
                        }
                    }
                    for (k, acc) in acc.iter().enumerate() {
                        // SAFETY: `part` is 64 floats.
                        unsafe { _mm256_storeu_ps(part.as_mut_ptr().add(8 * k), *acc) };
                    }
                }
            }
        }
    }
}

/// `Σ a·b` in fused multiply-adds on four independent eight-lane sums (one chain of adds per
/// score would bound attention at a thousand positions), summed in a fixed order, then the
/// values past the last 32: the same bits for the same inputs whatever else is computed.
fn dot_fused(a: &[f32], b: &[f32]) -> f32 {
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let rest: f32 = ca.remainder().iter().zip(cb.remainder()).fold(0.0, |s, (x, y)| x.mul_add(*y, s));
    let lanes = dot_lanes(ca, cb);
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + rest
}

/// The eight lanes of [`dot_fused`]'s four sums, added pairwise: `(s0 + s1) + (s2 + s3)`.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn dot_lanes(ca: std::slice::ChunksExact<'_, f32>, cb: std::slice::ChunksExact<'_, f32>) -> [f32; 8] {
    let mut lanes = [0f32; 8];
    // SAFETY: AVX2 and FMA are enabled for the whole build (this function's `cfg`); `lanes`
    // is 8 floats.
    unsafe { std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), x86::lane_sums(ca, cb)) };
    lanes
}

/// The eight lanes of [`dot_fused`]'s four sums, added pairwise: `(s0 + s1) + (s2 + s3)`.
#[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
fn dot_lanes(ca: std::slice::ChunksExact<'_, f32>, cb: std::slice::ChunksExact<'_, f32>) -> [f32; 8] {
    let mut acc = [[0f32; 8]; 4];
    for (x, y) in ca.zip(cb) {
        for (k, acc) in acc.iter_mut().enumerate() {
            for i in 0..8 {
                acc[i] = x[8 * k + i].mul_add(y[8 * k + i], acc[i]);
            }
        }
    }
    std::array::from_fn(|i| (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]))
}

/// Positions ahead whose key or value attention asks the memory for: a head's rows are every
/// other half kilobyte of the cache, which the CPU's own prefetching did not keep up with
/// (a generated token's attention stalled on the loads).
const PREFETCH: usize = 8;

/// Asks for `row`'s cache lines ahead of their use.
#[inline]
fn prefetch(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in row.chunks(16) {
        // SAFETY: a prefetch reads nothing into the program and cannot fault; the address is
        // inside `row`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// The most query heads that share one key-value head (Qwen2.5's models have 6 or 7).
const MAX_GROUP: usize = 16;

/// Replaces each score `v` with `e^(v − max)` and returns their sum, eight at a time: a libm
/// `exp` per score was a tenth of a long prompt's time. Scores are at most `max`, so every
/// argument is ≤ 0; the result is within 2 ulp of `f32::exp` (tested).
fn exp_minus(scores: &mut [f32], max: f32) -> f32 {
    let mut sums = [0f32; 8];
    let mut chunks = scores.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let x: [f32; 8] = std::array::from_fn(|i| chunk[i] - max);
        let e = exp8(x);
        chunk.copy_from_slice(&e);
        for i in 0..8 {
            sums[i] += e[i];
        }
    }
    let rest = chunks.into_remainder();
    let mut x = [f32::NEG_INFINITY; 8];
    for (x, v) in x.iter_mut().zip(rest.iter()) {
        *x = v - max;
    }
    let e = exp8(x);
    for (i, v) in rest.iter_mut().enumerate() {
        *v = e[i];
        sums[i] += e[i];
    }
    ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]))
}

/// `e^x` for eight arguments ≤ 0 (−∞ and anything below −87.3 give 0): `x = n·ln 2 + r` with
/// |r| ≤ ln 2 / 2, a degree-6 polynomial for `e^r`, and `2^n` put into the exponent bits.
fn exp8(x: [f32; 8]) -> [f32; 8] {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, so `n · LN2_HI` is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    std::array::from_fn(|i| {
        let v = x[i].max(-87.3);
        let n = (v * LOG2E).round_ties_even();
        let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, v));
        // Taylor coefficients 1/k! up to k = 6 (error < 2e-8 on |r| ≤ 0.35).
        let p = r.mul_add(1.0 / 720.0, 1.0 / 120.0);
        let p = r.mul_add(p, 1.0 / 24.0);
        let p = r.mul_add(p, 1.0 / 6.0);
        let p = r.mul_add(p, 0.5);
        let p = r.mul_add(p, 1.0);
        let p = r.mul_add(p, 1.0);
        // n ≥ −126 here (x ≥ −87.3), so 2^n is a normal float.
        let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
        if x[i] <= -87.3 { 0.0 } else { p * scale }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn exp_of_scores_is_within_two_ulp_of_libm() {
        let mut worst = 0f64;
        for k in 0..=200_000 {
            let x = -87.0 * k as f32 / 200_000.0;
            let got = exp8([x; 8])[0];
            let want = f64::from(x).exp();
            worst = worst.max((f64::from(got) - want).abs() / want);
        }
        // Two ulp of f32 are 2.4e-7 relative.
        assert!(worst < 2.4e-7, "worst relative error {worst}");
        assert_eq!(exp8([0.0, -1e-30, f32::NEG_INFINITY, -90.0, -87.3, 0.0, 0.0, 0.0])[..4], [1.0, 1.0, 0.0, 0.0]);
        // The sum covers every score, the remainder after whole eights included.
        let mut scores = values(21, 7);
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let want: f64 = scores.iter().map(|&v| f64::from(v - max).exp()).sum();
        let sum = exp_minus(&mut scores, max);
        assert!((f64::from(sum) - want).abs() < 1e-5 * want, "{sum} against {want}");
        assert!(scores.iter().all(|&v| v > 0.0 && v <= 1.0));
    }

    #[test]
    fn fused_dot_products_match_the_exact_sum() {
        for len in [128, 64, 13, 0] {
            let (a, b) = (values(len, 1), values(len, 2));
            let want: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            let got = dot_fused(&a, &b);
            assert!((f64::from(got) - want).abs() < 1e-5, "length {len}: {got} against {want}");
        }
    }

    /// Attention as it was written before its SIMD loops: each score through `dot_fused`, each
    /// position's weighted value added to every head's outputs in turn.
    fn attention_one_position_at_a_time(
        s: Qwen2Shape,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        pos: usize,
        t: usize,
    ) -> Vec<f32> {
        let (hd, kv_dim, hidden, group) = (s.head_dim(), s.kv_dim(), s.hidden, s.heads / s.kv_heads);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; t * hidden];
        for i in 0..t {
            let visible = pos + i + 1;
            for head in 0..s.heads {
                let kv = head / group;
                let row = |j: usize| j * kv_dim + kv * hd..j * kv_dim + (kv + 1) * hd;
                let query = &q[i * hidden + head * hd..][..hd];
                let mut scores: Vec<f32> = (0..visible).map(|j| dot_fused(query, &keys[row(j)]) * scale).collect();
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let inverse = 1.0 / exp_minus(&mut scores, max);
                let out = &mut out[i * hidden + head * hd..][..hd];
                for (j, score) in scores.iter().enumerate() {
                    let p = score * inverse;
                    out.iter_mut().zip(&values[row(j)]).for_each(|(o, v)| *o = p.mul_add(*v, *o));
                }
            }
        }
        out
    }

    #[test]
    fn attention_of_the_shipped_shapes_keeps_the_bits_of_one_position_at_a_time() {
        // The 1.5B's heads (twelve of 128 values, six per key-value head) and the 0.5B's
        // (fourteen of 64, seven per key-value head); positions that fill no whole group of
        // eight or block of 32, with a generated token's single query among them.
        for (heads, hd) in [(12, 128), (14, 64)] {
            let s = Qwen2Shape {
                layers: 1,
                hidden: heads * hd,
                heads,
                kv_heads: 2,
                eps: 1e-6,
                rope_theta: 10_000.0,
                max_context: 128,
            };
            let pool = WorkerPool::new(2);
            for (pos, t) in [(0, 1), (37, 11), (70, 1), (3, 40)] {
                let q = values(t * s.hidden, 7);
                let kv_len = (pos + t) * s.kv_dim();
                let (keys, vals) = (values(kv_len, 8), values(kv_len, 9));
                let mut got = vec![f32::NAN; t * s.hidden];
                attention(&pool, s, &q, &keys, &vals, pos, t, &mut got);
                let want = attention_one_position_at_a_time(s, &q, &keys, &vals, pos, t);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{heads} heads of {hd}, {t} tokens after {pos}");
            }
        }
    }

    #[test]
    fn attention_gives_each_token_the_bits_it_gets_alone_and_the_exact_result() {
        // Seven query heads per key-value head (the 0.5B's grouping), 19 tokens after 5 cached
        // positions.
        let s = Qwen2Shape {
            layers: 1,
            hidden: 14 * 16,
            heads: 14,
            kv_heads: 2,
            eps: 1e-6,
            rope_theta: 10_000.0,
            max_context: 64,
        };
        let (pos, t, hd, kv_dim) = (5, 19, s.head_dim(), s.kv_dim());
        let q = values(t * s.hidden, 3);
        let (keys, vals) = (values((pos + t) * kv_dim, 4), values((pos + t) * kv_dim, 5));
        let pool = WorkerPool::new(2);
        let mut together = vec![f32::NAN; t * s.hidden];
        attention(&pool, s, &q, &keys, &vals, pos, t, &mut together);
        for i in 0..t {
            let mut alone = vec![f32::NAN; s.hidden];
            let query = &q[i * s.hidden..(i + 1) * s.hidden];
            attention(&pool, s, query, &keys, &vals, pos + i, 1, &mut alone);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone), bits(&together[i * s.hidden..(i + 1) * s.hidden]), "token {i}");
            // Against softmax(q·k / √d)·v in f64.
            for head in 0..s.heads {
                let kv = head / (s.heads / s.kv_heads);
                let query = &q[i * s.hidden + head * hd..][..hd];
                let scores: Vec<f64> = (0..pos + i + 1)
                    .map(|j| {
                        let key = &keys[j * kv_dim + kv * hd..][..hd];
                        query.iter().zip(key).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for d in 0..hd {
                    let want: f64 = weights
                        .iter()
                        .enumerate()
                        .map(|(j, w)| w / total * f64::from(vals[j * kv_dim + kv * hd + d]))
                        .sum();
                    let got = f64::from(together[i * s.hidden + head * hd + d]);
                    assert!((got - want).abs() < 1e-5, "token {i} head {head} dim {d}: {got} against {want}");
                }
            }
        }
    }
}
