//! Quantised matrix products for the chat decoder: GGUF's Q4_K, Q6_K and Q8_0 weight rows times
//! activations quantised to 8 bits, on the file's own compact layout.
//!
//! Why our own rather than candle's: generation reads every weight once per token, so it is
//! bound by memory — candle's x86 path repacks Q4_K with its scales widened to `f32` (a third
//! more bytes to read per token) and waits on a pool of spinning threads besides the caller's
//! (three spinners on two cores). Here the weights stay as the file has them, the caller works
//! as one of the [`WorkerPool`]'s threads, and matrices that read the same input (query, key and
//! value; gate and up) run as one dispatch. Prompts (many tokens) go through the same kernels,
//! each weight row kept in cache while a tile of tokens passes over it.
//!
//! The SIMD kernels are chosen at run time: AVX-512 VNNI where the CPU has it ([`avx512`]: a
//! prompt's tokens regrouped sixteen to a register, so one instruction multiplies four weights
//! with sixteen tokens), else AVX2 with FMA; the portable ones in [`scalar`] are the reference
//! the tests hold them to, and what runs on other CPUs.

#[cfg(target_arch = "x86_64")]
mod avx512;
mod blocks;
mod pool;
pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use blocks::{BlockQ4K, BlockQ6K, BlockQ8_0, BlockQ8K, BlockQ8x32, QK_K, TILE_TOKENS, TileQ8K, TileQ8x32};
pub(crate) use pool::SharedMut;
pub use pool::WorkerPool;

use crate::LocalModelError;
use blocks::f16_bits;
use candle_core::quantized::{GgmlDType, QTensor};

/// The stored form of a [`QMatrix`]'s rows.
enum Rows {
    Q4K(Vec<BlockQ4K>),
    Q6K(Vec<BlockQ6K>),
    Q8_0(Vec<BlockQ8_0>),
}

/// A weight matrix of `rows × cols` in one of the formats the kernels read. Row `r` holds
/// output feature `r`: the product with an activation row is one dot product per row.
pub struct QMatrix {
    rows: usize,
    cols: usize,
    data: Rows,
}

/// Which quantised form of the activations a matrix's kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ActivationForm {
    /// 256-value blocks with per-16 sums, for the k-quants.
    Q8K,
    /// 32-value blocks, for Q8_0.
    Q8x32,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QMatrix({} × {}, {})", self.rows, self.cols, self.format())
    }
}

/// Copies `bytes` into blocks of `T` (candle's storage is not ours to keep), in one copy.
fn blocks_of<T: blocks::Block>(bytes: &[u8], name: &str) -> Result<Vec<T>, LocalModelError> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(LocalModelError::Format(format!("{name}: {} bytes is no whole number of blocks", bytes.len())));
    }
    let n = bytes.len() / size;
    let mut blocks = Vec::<T>::with_capacity(n);
    // SAFETY: the vector has room for `n` blocks (`n · size` bytes), and any bytes are a valid
    // `T` (`Block`'s contract), so all `n` are initialised once copied.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), blocks.as_mut_ptr().cast::<u8>(), n * size);
        blocks.set_len(n);
    }
    Ok(blocks)
}

impl QMatrix {
    /// The matrix of a 2-D GGUF tensor (`[rows, cols]`). Formats without a kernel here (Q5_0 in
    /// the 0.5B model, `f16`/`f32`, the other k-quants) are re-quantised to Q8_0, which keeps
    /// their precision; `requantised` counts them.
    ///
    /// # Errors
    /// A tensor that is not 2-D, whose width is not a whole number of blocks, or that candle
    /// cannot dequantise.
    pub fn from_qtensor(qt: QTensor, name: &str, requantised: &mut usize) -> Result<Self, LocalModelError> {
        let (rows, cols) = qt
            .shape()
            .dims2()
            .map_err(|_| LocalModelError::Format(format!("{name}: a matrix must be 2-D, is {:?}", qt.shape())))?;
        let qt = match qt.dtype() {
            GgmlDType::Q4K | GgmlDType::Q6K | GgmlDType::Q8_0 => qt,
            _ => {
                *requantised += 1;
                let dense = qt.dequantize(&candle_core::Device::Cpu)?;
                QTensor::quantize(&dense, GgmlDType::Q8_0)?
            }
        };
        let block = match qt.dtype() {
            GgmlDType::Q8_0 => 32,
            _ => QK_K,
        };
        if !cols.is_multiple_of(block) {
            return Err(LocalModelError::Format(format!("{name}: width {cols} is not a multiple of {block}")));
        }
        let bytes = qt.data()?;
        let data = match qt.dtype() {
            GgmlDType::Q4K => Rows::Q4K(blocks_of(&bytes, name)?),
            GgmlDType::Q6K => Rows::Q6K(blocks_of(&bytes, name)?),
            _ => Rows::Q8_0(blocks_of(&bytes, name)?),
        };
        let matrix = Self { rows, cols, data };
        if matrix.block_count() != rows * cols / block {
            return Err(LocalModelError::Format(format!(
                "{name}: {} blocks for {rows} × {cols}",
                matrix.block_count()
            )));
        }
        Ok(matrix)
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The stored format's GGUF name.
    pub fn format(&self) -> &'static str {
        match self.data {
            Rows::Q4K(_) => "Q4_K",
            Rows::Q6K(_) => "Q6_K",
            Rows::Q8_0(_) => "Q8_0",
        }
    }

    /// Bytes the weights take (what one product over all rows reads).
    pub fn bytes(&self) -> usize {
        match &self.data {
            Rows::Q4K(b) => std::mem::size_of_val(b.as_slice()),
            Rows::Q6K(b) => std::mem::size_of_val(b.as_slice()),
            Rows::Q8_0(b) => std::mem::size_of_val(b.as_slice()),
        }
    }

    fn block_count(&self) -> usize {
        match &self.data {
            Rows::Q4K(b) => b.len(),
            Rows::Q6K(b) => b.len(),
            Rows::Q8_0(b) => b.len(),
        }
    }

    fn form(&self) -> ActivationForm {
        match self.data {
            Rows::Q8_0(_) => ActivationForm::Q8x32,
            _ => ActivationForm::Q8K,
        }
    }

    /// `out[t][r] = row r · x[t]` for `rows` in `[first, end)` and every token of `x`.
    fn rows_times(&self, kernels: &Kernels, x: &QuantizedActivations, first: usize, end: usize, out: Out) {
        let out = out.starting_at_row(first);
        // SAFETY (all six): `kernels` were chosen for this CPU, and `out` covers
        // `tokens × stride` floats (checked in `matmul`) of which these rows are this call's;
        // the tiles, when built, hold the same tokens as the blocks.
        if let (Some(tiled), true) = (kernels.tiled, x.tiled) {
            let tokens = x.tokens;
            match &self.data {
                Rows::Q4K(b) => {
                    let n = self.cols / QK_K;
                    unsafe { (tiled.q4k)(&b[first * n..end * n], &x.q8k_tiles, n, tokens, out) }
                }
                Rows::Q6K(b) => {
                    let n = self.cols / QK_K;
                    unsafe { (tiled.q6k)(&b[first * n..end * n], &x.q8k_tiles, n, tokens, out) }
                }
                Rows::Q8_0(b) => {
                    let n = self.cols / 32;
                    unsafe { (tiled.q8_0)(&b[first * n..end * n], &x.q8x32_tiles, n, tokens, out) }
                }
            }
            return;
        }
        match &self.data {
            Rows::Q4K(b) => {
                let n = self.cols / QK_K;
                unsafe { (kernels.q4k)(&b[first * n..end * n], &x.q8k[..x.tokens * n], n, out) }
            }
            Rows::Q6K(b) => {
                let n = self.cols / QK_K;
                unsafe { (kernels.q6k)(&b[first * n..end * n], &x.q8k[..x.tokens * n], n, out) }
            }
            Rows::Q8_0(b) => {
                let n = self.cols / 32;
                unsafe { (kernels.q8_0)(&b[first * n..end * n], &x.q8x32[..x.tokens * n], n, out) }
            }
        }
    }

    /// Row `r` as `f32` into `out` (`cols` long), each weight computed as the format defines it
    /// (as llama.cpp's and candle's dequantisation do): a token's embedding read from the
    /// quantised table, so the table is never held as floats.
    ///
    /// # Panics
    /// When `r` is not a row or `out` is not `cols` long: the caller checks the token id
    /// against [`QMatrix::rows`] first.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols, "row {r} of {self:?} into {} floats", out.len());
        match &self.data {
            Rows::Q4K(b) => {
                let n = self.cols / QK_K;
                for (block, out) in b[r * n..(r + 1) * n].iter().zip(out.chunks_exact_mut(QK_K)) {
                    let (d, dmin) = (f16_bits(block.d), f16_bits(block.dmin));
                    for j in 0..QK_K / 32 {
                        let (scale, min) = block.scale_min(j);
                        let (scale, min) = (d * f32::from(scale), dmin * f32::from(min));
                        let q = &block.qs[32 * (j / 2)..32 * (j / 2) + 32];
                        let shift = 4 * (j % 2);
                        for (o, &q) in out[32 * j..32 * j + 32].iter_mut().zip(q) {
                            *o = scale * f32::from((q >> shift) & 0xF) - min;
                        }
                    }
                }
            }
            Rows::Q6K(b) => {
                let n = self.cols / QK_K;
                for (block, out) in b[r * n..(r + 1) * n].iter().zip(out.chunks_exact_mut(QK_K)) {
                    let d = f16_bits(block.d);
                    for (i, o) in out.iter_mut().enumerate() {
                        let q = i32::from(scalar::q6k_value(block, i)) - 32;
                        *o = d * f32::from(block.scales[i / 16]) * q as f32;
                    }
                }
            }
            Rows::Q8_0(b) => {
                let n = self.cols / 32;
                for (block, out) in b[r * n..(r + 1) * n].iter().zip(out.chunks_exact_mut(32)) {
                    let d = f16_bits(block.d);
                    for (o, &q) in out.iter_mut().zip(&block.qs) {
                        *o = d * f32::from(q);
                    }
                }
            }
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.bytes() / self.rows.max(1)
    }
}

/// Where a product's results go: a token-major buffer shared by the pool's threads, each of
/// which writes its own rows (each row of a matrix is given to one work item).
#[derive(Clone, Copy)]
pub(crate) struct Out {
    buffer: SharedMut,
    stride: usize,
    offset: usize,
}

impl Out {
    /// The same buffer with row 0 at row `first`.
    fn starting_at_row(self, first: usize) -> Self {
        Self { offset: self.offset + first, ..self }
    }

    /// Writes token `t`'s value for row `r`.
    ///
    /// # Safety
    /// `t * stride + offset + r` is inside the buffer and no other thread writes it.
    pub(crate) unsafe fn write(self, t: usize, r: usize, value: f32) {
        unsafe { self.buffer.write(t * self.stride + self.offset + r, value) };
    }
}

/// Rows (each `n` blocks, laid end to end) times every token's activations (each `n` blocks),
/// written to `out` (row 0 of the slice at `out`'s row 0).
///
/// # Safety
/// The kernel's CPU features are present, and `out` holds every (token, row) written.
type RowsTimes<W, X> = unsafe fn(&[W], &[X], usize, Out);

/// Rows (each `n` blocks) times the first `tokens` tokens of `tiles` (`n` tiles per group of
/// [`TILE_TOKENS`] tokens), written to `out` as [`RowsTimes`] writes.
///
/// # Safety
/// As [`RowsTimes`].
type TilesTimes<W, T> = unsafe fn(&[W], &[T], usize, usize, Out);

/// Kernels that read a prompt's tokens as tiles, and must give every token the result the same
/// set's one-token kernels give it, bit for bit (a prompt computed in pieces, a reused prefix
/// and the rest, must equal the prompt computed at once).
#[derive(Clone, Copy)]
struct TiledKernels {
    q4k: TilesTimes<BlockQ4K, TileQ8K>,
    q6k: TilesTimes<BlockQ6K, TileQ8K>,
    q8_0: TilesTimes<BlockQ8_0, TileQ8x32>,
}

/// Prompts of at least this many tokens go through the tiled kernels: below it, a tile's empty
/// lanes would cost more than the one-token kernels do.
const TILED_FROM: usize = 8;

/// The dot products this CPU runs best, chosen once.
#[derive(Clone, Copy)]
pub struct Kernels {
    q4k: RowsTimes<BlockQ4K, BlockQ8K>,
    q6k: RowsTimes<BlockQ6K, BlockQ8K>,
    q8_0: RowsTimes<BlockQ8_0, BlockQ8x32>,
    quantize_q8k: fn(&[f32], &mut [BlockQ8K]),
    tiled: Option<TiledKernels>,
    /// `n` rounds of the prompt kernels' integer multiply step on one core, as fast as it
    /// issues; returns the multiply-adds done ([`Kernels::multiply_adds_per_s`]).
    multiply_step: Option<fn(u64) -> u64>,
    /// What was chosen, for logs and the benchmark's report.
    pub name: &'static str,
}

impl Kernels {
    /// The fastest kernels the CPU supports, or the set `TOOLGRAPH_KERNELS` names (`avx512-vnni`,
    /// `avx2`, `portable`: for comparing them on one machine) when this CPU supports it.
    pub fn detect() -> Self {
        Self::choose(&Self::available(), std::env::var("TOOLGRAPH_KERNELS").ok().as_deref())
    }

    /// The set named `wanted` among `available` (fastest first, never empty), else the fastest,
    /// with a warning when a name was given.
    fn choose(available: &[Self], wanted: Option<&str>) -> Self {
        let fastest = available[0];
        let Some(wanted) = wanted else { return fastest };
        match available.iter().find(|k| k.name == wanted.trim()) {
            Some(k) => *k,
            None => {
                let names: Vec<_> = available.iter().map(|k| k.name).collect();
                tracing::warn!(
                    "TOOLGRAPH_KERNELS={wanted:?} is not a kernel set this CPU runs ({}); using {}",
                    names.join(", "),
                    fastest.name
                );
                fastest
            }
        }
    }

    /// The 8-bit multiply-adds per second this CPU's cores issue in these kernels' own
    /// instructions (AVX2: `maddubs`, `madd` with the scales and the add, as the prompt
    /// kernels do per 32 values and token; AVX-512 VNNI: `vpdpbusd`), each of `threads`
    /// threads on independent sums, activations loaded from L1 as the kernels load them; the
    /// best of three runs of ~0.1 s. A ceiling for a prompt's matrix products: their kernels
    /// also unpack weights, apply scales in floats and wait on memory. `None` for the portable set.
    pub fn multiply_adds_per_s(&self, threads: usize) -> Option<f64> {
        let step = self.multiply_step?;
        let rounds = {
            // Sized so one thread's run takes ~0.1 s on this CPU, in floats (a clock that saw
            // no time pass must not overflow the count), at most 2^30 rounds.
            const PROBE: u64 = 1 << 16;
            let t = std::time::Instant::now();
            step(PROBE);
            let seconds = t.elapsed().as_secs_f64().max(1e-6);
            ((0.1 / seconds * PROBE as f64) as u64).clamp(PROBE, 1 << 30)
        };
        Some(super::best_rate_on_threads(threads, |_| step(rounds)))
    }

    /// Every set this CPU supports, fastest first, the portable one last.
    pub fn available() -> Vec<Self> {
        let mut sets = Vec::new();
        #[cfg(target_arch = "x86_64")]
        sets.extend(avx512::kernels());
        #[cfg(target_arch = "x86_64")]
        sets.extend(x86::kernels());
        sets.push(Self::portable());
        sets
    }

    /// The portable kernels.
    pub fn portable() -> Self {
        Self {
            q4k: scalar::rows_times::<BlockQ4K, BlockQ8K>,
            q6k: scalar::rows_times::<BlockQ6K, BlockQ8K>,
            q8_0: scalar::rows_times::<BlockQ8_0, BlockQ8x32>,
            quantize_q8k: scalar::quantize_q8k,
            tiled: None,
            multiply_step: None,
            name: "portable",
        }
    }
}

/// Activation rows quantised for the kernels: buffers kept across calls so a generated token
/// allocates nothing.
#[derive(Default)]
pub struct QuantizedActivations {
    tokens: usize,
    q8k: Vec<BlockQ8K>,
    q8x32: Vec<BlockQ8x32>,
    /// Whether the tiles below hold this input (the kernels read tiles, and the input has at
    /// least [`TILED_FROM`] tokens).
    tiled: bool,
    q8k_tiles: Vec<TileQ8K>,
    q8x32_tiles: Vec<TileQ8x32>,
}

impl QuantizedActivations {
    /// Quantises `tokens` rows of `x` (each `cols` wide) in the forms asked for.
    fn prepare(&mut self, kernels: &Kernels, x: &[f32], tokens: usize, cols: usize, q8k: bool, q8x32: bool) {
        debug_assert_eq!(x.len(), tokens * cols);
        self.tokens = tokens;
        self.tiled = kernels.tiled.is_some() && tokens >= TILED_FROM;
        if q8k {
            let n = cols / QK_K;
            self.q8k.resize(tokens * n, BlockQ8K::ZERO);
            for (row, out) in x.chunks_exact(cols).zip(self.q8k.chunks_exact_mut(n)) {
                (kernels.quantize_q8k)(row, out);
            }
            if self.tiled {
                blocks::tile_q8k(&self.q8k, tokens, n, &mut self.q8k_tiles);
            }
        }
        if q8x32 {
            let n = cols / 32;
            self.q8x32.resize(tokens * n, BlockQ8x32::ZERO);
            for (row, out) in x.chunks_exact(cols).zip(self.q8x32.chunks_exact_mut(n)) {
                scalar::quantize_q8x32(row, out);
            }
            if self.tiled {
                blocks::tile_q8x32(&self.q8x32, tokens, n, &mut self.q8x32_tiles);
            }
        }
    }
}

/// Multiplies `x` (`tokens × cols`, token-major) by each matrix of `products` on `pool`: the
/// matrices read the same input, which is quantised once, and run as one dispatch. Each
/// product's output is `tokens × rows`, token-major.
///
/// # Panics
/// When a matrix's width is not `cols` or an output is not `tokens × rows` long: the decoder
/// sizes both from the model's shape, so a mismatch is a bug, not bad input.
pub fn matmul(
    pool: &WorkerPool,
    kernels: &Kernels,
    scratch: &mut QuantizedActivations,
    x: &[f32],
    tokens: usize,
    products: &mut [(&QMatrix, &mut [f32])],
) {
    let cols = products.first().map_or(0, |(m, _)| m.cols);
    assert_eq!(x.len(), tokens * cols, "input is not tokens × cols");
    assert!(products.len() <= MAX_PRODUCTS, "at most {MAX_PRODUCTS} matrices per dispatch");
    let reads = |form| products.iter().any(|(m, _)| m.form() == form);
    scratch.prepare(kernels, x, tokens, cols, reads(ActivationForm::Q8K), reads(ActivationForm::Q8x32));
    // Work items are chunks of rows of one matrix, small enough that the threads finish
    // together, large enough that taking one costs nothing against its work.
    // One token, or a draft's few (up to eight, not tiled): ~16 items per thread, each a
    // multiple of 16 rows (a cache line of output), so handing them out (an atomic add on a
    // shared line) stays negligible and each item streams its rows from memory in one run;
    // the few-token kernels take at most two passes over an item, the second from L2. (Items
    // of 16 KB made a pass over a token and one drafted cost 2.1-2.8x a plain pass, with them
    // 1.5x: docs/benchmarks.md.) A longer prompt: as many rows as fit in 16 KB, half of L1, so
    // they stay there while every token passes over them.
    // Each matrix's items follow the previous one's: `first_item` says where its own begin, so
    // the items need no list (a generated token allocates nothing here).
    let total_rows: usize = products.iter().map(|(m, _)| m.rows).sum();
    let mut parts: [Option<Part>; MAX_PRODUCTS] = [None; MAX_PRODUCTS];
    let mut items = 0;
    for ((m, out), part) in products.iter_mut().zip(&mut parts) {
        assert_eq!(m.cols, cols, "matrices of one dispatch read the same input");
        assert_eq!(out.len(), tokens * m.rows, "output is not tokens × rows");
        let chunk = match tokens {
            1..=8 if !scratch.tiled => (total_rows / (pool.threads() * 16)).max(16).next_multiple_of(16),
            // The tiled kernels unpack an item's rows once for all its tokens and pass over
            // them four at a time: 16 rows (at most 16 × 8,960 bytes unpacked, in L2), fewer
            // where a matrix would otherwise give each thread under four items.
            _ if scratch.tiled => (m.rows / (pool.threads() * 4)).clamp(4, 16) / 4 * 4,
            _ => (16 * 1024 / m.row_bytes().max(1)).clamp(2, 16),
        };
        let out = Out { buffer: SharedMut::new(out), stride: m.rows, offset: 0 };
        *part = Some(Part { matrix: m, out, chunk, first_item: items });
        items += m.rows.div_ceil(chunk);
    }
    let scratch = &*scratch;
    pool.for_each(items, &|item| {
        // The last part whose items begin at or before `item` holds it.
        let Some(p) = parts.iter().flatten().rev().find(|p| p.first_item <= item) else { return };
        let first = (item - p.first_item) * p.chunk;
        p.matrix.rows_times(kernels, scratch, first, (first + p.chunk).min(p.matrix.rows), p.out);
    });
}

/// The most matrices one [`matmul`] runs (the decoder's largest dispatch is query, key and value).
const MAX_PRODUCTS: usize = 4;

/// One matrix of a dispatch: where its output goes, its rows per work item, and the index of
/// its first work item.
#[derive(Clone, Copy)]
struct Part<'a> {
    matrix: &'a QMatrix,
    out: Out,
    chunk: usize,
    first_item: usize,
}

#[cfg(test)]
mod tests;
