//! AVX-512 VNNI kernels, used when the CPU reports AVX-512 F, BW, VL and VNNI at run time.
//!
//! VNNI's `vpdpbusd` multiplies four unsigned bytes with four signed bytes and adds the four
//! products to a 32-bit lane: the AVX2 kernels' `maddubs`, `madd` and `add` in one instruction.
//! A prompt is read as tiles of sixteen tokens ([`TileQ8K`]): four values of a weight row,
//! broadcast to every lane, meet the same four values of sixteen tokens, so each lane sums one
//! token's products and a sub-block's scale applies to a whole register at once. A work item's
//! weight rows are unpacked to one byte per value once, for all its tokens, and four rows share
//! each load of the tokens' values.
//!
//! A token's result is computed in one order whether it comes through a tile or alone: per
//! block, the integer sums (exact in any order) become one float each, added to the token's
//! running sum by the same fused multiply-adds, block after block (Q8_0's short blocks two at
//! a time).

use super::blocks::{
    BlockQ4K, BlockQ6K, BlockQ8_0, BlockQ8K, BlockQ8x32, QK_K, TILE_TOKENS, TileQ8K, TileQ8x32, f16_bits,
};
use super::x86::{load, prefetch_ahead, q4k_mins_dot, q4k_scales_mins, q6k_groups};
use super::{Kernels, Out, TiledKernels};
use std::arch::x86_64::*;

/// The AVX-512 VNNI kernels, when this CPU has them (and AVX2 with FMA, which they also use).
pub(super) fn kernels() -> Option<Kernels> {
    let avx2 = super::x86::kernels()?;
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    vnni.then_some(Kernels {
        q4k: q4k_rows,
        q6k: q6k_rows,
        q8_0: q8_0_rows,
        quantize_q8k: avx2.quantize_q8k,
        tiled: Some(TiledKernels { q4k: q4k_tiles, q6k: q6k_tiles, q8_0: q8_0_tiles }),
        // SAFETY: AVX-512 F and VNNI were detected just above.
        multiply_step: Some(|n| unsafe { multiply_step(n) }),
        name: "avx512-vnni",
    })
}

/// `n` rounds of eight independent `vpdpbusd`s, each second operand loaded from L1 as the
/// tiles are: 64 multiply-adds an instruction.
///
/// # Safety
/// AVX-512 F and VNNI are present.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn multiply_step(n: u64) -> u64 {
    let w = _mm512_set1_epi32(0x0703_0507);
    let mut xs = [0u8; 512];
    xs.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
    let mut acc = [_mm512_setzero_si512(); 8];
    for _ in 0..n {
        let x = std::hint::black_box(&xs);
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `xs` has 512 bytes: offset 64k + 64 stays inside.
            let x = unsafe { _mm512_loadu_si512(x.as_ptr().add(64 * k).cast()) };
            *acc = _mm512_dpbusd_epi32(*acc, w, x);
        }
    }
    std::hint::black_box(acc);
    n * 8 * 64
}

/// Rows a pass computes side by side.
const ROWS: usize = 4;

/// Loads 64 bytes from `p` (no alignment needed).
///
/// # Safety
/// `p` points at 64 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
unsafe fn load64(p: *const u8) -> __m512i {
    unsafe { _mm512_loadu_si512(p.cast()) }
}

/// The four bytes at `p` in every lane.
///
/// # Safety
/// `p` points at 4 readable bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
unsafe fn broadcast4(p: *const u8) -> __m512i {
    _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// The sum of each 512-bit register's sixteen lanes, as four 128-bit partial sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn fold512(v: __m512i) -> __m128i {
    fold256(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn fold256(v: __m256i) -> __m128i {
    _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
}

/// The rows of a pass starting at `first`: the last row repeated where the rows run out (its
/// results are not written).
#[inline]
fn pass_rows(first: usize, rows: usize) -> [usize; ROWS] {
    std::array::from_fn(|i| (first + i).min(rows - 1))
}

/// Writes `acc[i]`'s lanes as tokens `first_token..` of row `first + i`, tokens past `tokens`
/// and rows past `rows` skipped.
///
/// # Safety
/// As [`Out::write`], for every (token, row) written.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
unsafe fn write_tile(out: Out, acc: &[__m512; ROWS], first: usize, rows: usize, first_token: usize, tokens: usize) {
    for (i, acc) in acc.iter().enumerate().take(rows - first) {
        let mut values = [0f32; TILE_TOKENS];
        // SAFETY: `values` is sixteen floats.
        unsafe { _mm512_storeu_ps(values.as_mut_ptr(), *acc) };
        for (l, v) in values.into_iter().enumerate().take(tokens - first_token) {
            // SAFETY: the caller's.
            unsafe { out.write(first_token + l, first + i, v) };
        }
    }
}

/// Each token through the one-row kernel `$dot`, row by row: one call per work item, so the
/// kernel inlines here.
macro_rules! rows_times {
    ($name:ident, $w:ty, $x:ty, $dot:ident) => {
        /// Rows times tokens, one token at a time.
        ///
        /// # Safety
        /// AVX-512 F, BW, VL, VNNI, AVX2 and FMA are present; `out` holds every (token, row)
        /// written.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
        unsafe fn $name(w: &[$w], x: &[$x], n: usize, out: Out) {
            for (t, x) in x.chunks_exact(n).enumerate() {
                for (r, w) in w.chunks_exact(n).enumerate() {
                    // SAFETY: the caller's.
                    unsafe { out.write(t, r, $dot(w, x)) };
                }
            }
        }
    };
}

/// One token through the one-row kernel `$dot`; several (a generated token and a draft after
/// it, too few for a tile) through `$few`, up to [`FEW`] at a time, which unpacks each weight
/// block once for all of them. One call per work item, so the kernels inline here.
macro_rules! rows_times_few {
    ($name:ident, $w:ty, $x:ty, $dot:ident, $few:ident) => {
        /// Rows times tokens: one token alone, more [`FEW`] at a time.
        ///
        /// # Safety
        /// AVX-512 F, BW, VL, VNNI, AVX2 and FMA are present; `out` holds every (token, row)
        /// written.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
        unsafe fn $name(w: &[$w], x: &[$x], n: usize, out: Out) {
            let (rows, tokens) = (w.len() / n, x.len() / n);
            if tokens == 1 {
                for (r, w) in w.chunks_exact(n).enumerate() {
                    // SAFETY: the caller's.
                    unsafe { out.write(0, r, $dot(w, x)) };
                }
                return;
            }
            let mut first = 0;
            while first < tokens {
                let group = (tokens - first).min(FEW);
                let mut xs: [&[$x]; FEW] = [&[]; FEW];
                for (i, xs) in xs.iter_mut().enumerate().take(group) {
                    *xs = &x[(first + i) * n..(first + i + 1) * n];
                }
                for r in 0..rows {
                    let values = $few(&w[r * n..(r + 1) * n], &xs[..group]);
                    for (i, &v) in values.iter().enumerate().take(group) {
                        // SAFETY: the caller's.
                        unsafe { out.write(first + i, r, v) };
                    }
                }
                first += group;
            }
        }
    };
}

/// The most tokens [`dot_q4k_few`] and [`dot_q6k_few`] take at once.
const FEW: usize = 8;

rows_times_few!(q4k_rows, BlockQ4K, BlockQ8K, dot_q4k, dot_q4k_few);
rows_times_few!(q6k_rows, BlockQ6K, BlockQ8K, dot_q6k, dot_q6k_few);

rows_times!(q8_0_rows, BlockQ8_0, BlockQ8x32, dot_q8_0);

/// The sum of the four lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn hsum128(v: __m128i) -> i32 {
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
    _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v)))
}

/// Lanes 0–7 `a`, lanes 8–15 `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn halves(a: i32, b: i32) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi32(a)), _mm256_set1_epi32(b))
}

/// One Q4_K row with one token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn dot_q4k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let nibble = _mm256_set1_epi8(0xF);
    // Sub-blocks 2j and 2j + 1 share a register (the low and high nibbles of the same 32
    // bytes): their scales go to lanes 0–7 and 8–15.
    // (No closures in these kernels: one that is not inlined runs without the function's
    // target features and passes its vectors through memory.)
    let pick = [halves(0, 1), halves(2, 3), halves(4, 5), halves(6, 7)];
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        prefetch_ahead::<_, 3>(w);
        let (scales, m) = q4k_scales_mins(w);
        let mins = hsum128(q4k_mins_dot(m, x));
        let scales = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(scales));
        let mut s = _mm512_setzero_si512();
        for (j, &pick) in pick.iter().enumerate() {
            // SAFETY: `qs` has 128 bytes and `x.qs` 256: offsets 32j + 32 and 64j + 64 stay
            // inside.
            let (q, xs) = unsafe { (load(w.qs.as_ptr().add(32 * j)), load64(x.qs.as_ptr().add(64 * j).cast())) };
            let lo = _mm256_and_si256(q, nibble);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
            let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            // Each lane: four products, at most 4 · 15 · 127 in size, so the low 16 bits hold
            // it and `dpwssd` multiplies it by the scale (the high half of each scale lane is
            // zero).
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xs);
            s = _mm512_dpwssd_epi32(s, p, _mm512_permutexvar_epi32(pick, scales));
        }
        let sums = hsum128(fold512(s));
        acc = (x.d * f16_bits(w.d)).mul_add(sums as f32, acc);
        acc = (-(x.d * f16_bits(w.dmin))).mul_add(mins as f32, acc);
    }
    acc
}

/// [`dot_q4k`] of one row with up to [`FEW`] tokens: each block's values and scales are
/// unpacked once for all of them, and each token's sums and floats are [`dot_q4k`]'s, in its
/// order (the same bits as alone).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn dot_q4k_few(w: &[BlockQ4K], x: &[&[BlockQ8K]]) -> [f32; FEW] {
    let nibble = _mm256_set1_epi8(0xF);
    let pick = [halves(0, 1), halves(2, 3), halves(4, 5), halves(6, 7)];
    let mut acc = [0f32; FEW];
    for (b, w) in w.iter().enumerate() {
        prefetch_ahead::<_, 3>(w);
        let (scales, m) = q4k_scales_mins(w);
        let scales = _mm512_castsi256_si512(_mm256_cvtepi16_epi32(scales));
        let mut q = [_mm512_setzero_si512(); 4];
        let mut scale = [_mm512_setzero_si512(); 4];
        for j in 0..4 {
            // SAFETY: `qs` has 128 bytes: offset 32j + 32 stays inside.
            let bytes = unsafe { load(w.qs.as_ptr().add(32 * j)) };
            let lo = _mm256_and_si256(bytes, nibble);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), nibble);
            q[j] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            scale[j] = _mm512_permutexvar_epi32(pick[j], scales);
        }
        let (d, dmin) = (f16_bits(w.d), f16_bits(w.dmin));
        for (acc, x) in acc.iter_mut().zip(x) {
            let x = &x[b];
            let mins = hsum128(q4k_mins_dot(m, x));
            let mut s = _mm512_setzero_si512();
            for j in 0..4 {
                // SAFETY: `x.qs` has 256 bytes: offset 64j + 64 stays inside.
                let xs = unsafe { load64(x.qs.as_ptr().add(64 * j).cast()) };
                s = _mm512_dpwssd_epi32(s, _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[j], xs), scale[j]);
            }
            let sums = hsum128(fold512(s));
            *acc = (x.d * d).mul_add(sums as f32, *acc);
            *acc = (-(x.d * dmin)).mul_add(mins as f32, *acc);
        }
    }
    acc
}

/// For each of a Q6_K block's four 64-value registers, which of its sixteen scales each lane
/// takes: register z holds values 64z..64z + 64, and lane l of it covers values 64z + 4l..,
/// whose scale is number 4z + l/4.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn q6k_pick() -> [__m512i; 4] {
    let first = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let step = _mm512_set1_epi32(4);
    [
        first,
        _mm512_add_epi32(first, step),
        _mm512_add_epi32(first, _mm512_slli_epi32::<1>(step)),
        _mm512_add_epi32(first, _mm512_mullo_epi32(step, _mm512_set1_epi32(3))),
    ]
}

/// One Q6_K row with one token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn dot_q6k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let pick = q6k_pick();
    let low16 = _mm512_set1_epi32(0xFFFF);
    let mut acc = 0f32;
    for (w, x) in w.iter().zip(x) {
        prefetch_ahead::<_, 4>(w);
        // SAFETY: `bsums` is 16 i16 (32 bytes); `scales` 16 bytes.
        let (bsums, bytes) = unsafe { (load(x.bsums.as_ptr().cast()), _mm_loadu_si128(w.scales.as_ptr().cast())) };
        // The −32 offset of every value: 32 · Σ scale_i · (sum of x over 16 i).
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, _mm256_cvtepi8_epi16(bytes)));
        // Scales as the low half of each lane (high half zero), for `dpwssd`.
        let scales = _mm512_and_si512(_mm512_cvtepi8_epi32(bytes), low16);
        let (low, high) = (q6k_groups(w, 0), q6k_groups(w, 1));
        let q = [low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3]];
        let mut s = _mm512_setzero_si512();
        for z in 0..4 {
            let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q[2 * z]), q[2 * z + 1]);
            // SAFETY: `x.qs` is 256 bytes: offset 64z + 64 stays inside.
            let xs = unsafe { load64(x.qs.as_ptr().add(64 * z).cast()) };
            // Each lane at most 4 · 63 · 127 = 32,004 in size: it fits the low 16 bits.
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xs);
            s = _mm512_dpwssd_epi32(s, p, _mm512_permutexvar_epi32(pick[z], scales));
        }
        let sums = hsum128(_mm_sub_epi32(fold512(s), fold256(offset)));
        acc = (x.d * f16_bits(w.d)).mul_add(sums as f32, acc);
    }
    acc
}

/// [`dot_q6k`] of one row with up to [`FEW`] tokens, each block unpacked once for all of them;
/// each token's arithmetic is [`dot_q6k`]'s, in its order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn dot_q6k_few(w: &[BlockQ6K], x: &[&[BlockQ8K]]) -> [f32; FEW] {
    let pick = q6k_pick();
    let low16 = _mm512_set1_epi32(0xFFFF);
    let mut acc = [0f32; FEW];
    for (b, w) in w.iter().enumerate() {
        prefetch_ahead::<_, 4>(w);
        // SAFETY: `scales` is 16 bytes.
        let bytes = unsafe { _mm_loadu_si128(w.scales.as_ptr().cast()) };
        let scales16 = _mm256_cvtepi8_epi16(bytes);
        let scales = _mm512_and_si512(_mm512_cvtepi8_epi32(bytes), low16);
        let (low, high) = (q6k_groups(w, 0), q6k_groups(w, 1));
        let groups = [low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3]];
        let mut q = [_mm512_setzero_si512(); 4];
        let mut scale = [_mm512_setzero_si512(); 4];
        for z in 0..4 {
            q[z] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(groups[2 * z]), groups[2 * z + 1]);
            scale[z] = _mm512_permutexvar_epi32(pick[z], scales);
        }
        let d = f16_bits(w.d);
        for (acc, x) in acc.iter_mut().zip(x) {
            let x = &x[b];
            // SAFETY: `bsums` is 16 i16 (32 bytes).
            let bsums = unsafe { load(x.bsums.as_ptr().cast()) };
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales16));
            let mut s = _mm512_setzero_si512();
            for z in 0..4 {
                // SAFETY: `x.qs` is 256 bytes: offset 64z + 64 stays inside.
                let xs = unsafe { load64(x.qs.as_ptr().add(64 * z).cast()) };
                s = _mm512_dpwssd_epi32(s, _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[z], xs), scale[z]);
            }
            let sums = hsum128(_mm_sub_epi32(fold512(s), fold256(offset)));
            *acc = (x.d * d).mul_add(sums as f32, *acc);
        }
    }
    acc
}

/// A Q8_0 block's dot product with the 32 values `v`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn q8_0_sum(w: &BlockQ8_0, v: __m256i) -> i32 {
    // SAFETY: 32 bytes of values.
    let a = unsafe { load(w.qs.as_ptr().cast()) };
    // The multiply takes one side unsigned: |w| (−128 reads as 128), w's sign moved to x.
    hsum128(fold256(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(v, a))))
}

/// One Q8_0 row with one token. A Q8_0 block is short (32 values): one dependent add per
/// block would bound the kernel, so blocks are taken in pairs, each pair's two products summed
/// first and then added to the row's sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
fn dot_q8_0(w: &[BlockQ8_0], x: &[BlockQ8x32]) -> f32 {
    let mut acc = 0f32;
    let pairs = w.len() / 2 * 2;
    for b in (0..pairs).step_by(2) {
        let (w0, w1, x0, x1) = (&w[b], &w[b + 1], &x[b], &x[b + 1]);
        prefetch_ahead::<_, 2>(w0);
        // SAFETY: 32 bytes of values each.
        let (v0, v1) = unsafe { (load(x0.qs.as_ptr().cast()), load(x1.qs.as_ptr().cast())) };
        let first = (x0.d * f16_bits(w0.d)) * q8_0_sum(w0, v0) as f32;
        acc += (x1.d * f16_bits(w1.d)).mul_add(q8_0_sum(w1, v1) as f32, first);
    }
    if let (Some(w), Some(x)) = (w.get(pairs), x.get(pairs)) {
        // SAFETY: 32 bytes of values.
        let v = unsafe { load(x.qs.as_ptr().cast()) };
        acc = (x.d * f16_bits(w.d)).mul_add(q8_0_sum(w, v) as f32, acc);
    }
    acc
}

/// What a k-quant block's tile kernel needs besides its values, one byte each.
#[derive(Clone, Copy, Default)]
struct BlockScales {
    /// The scale of each group of values (Q4_K: 8 groups of 32; Q6_K: 16 of 16).
    scales: [i32; 16],
    /// Two `i16` per lane, multiplied with a tile's pairs of per-16 sums: Q4_K's min of each
    /// 32 twice, Q6_K's scales 2p and 2p + 1.
    pairs: [i32; 8],
    d: f32,
    /// Q4_K's scale of the mins (Q6_K has none).
    dmin: f32,
}

/// How a block's two integer sums — `A = Σ scale · (values · x)` and `P = Σ pair · (x's sums)`
/// — become its float, as the one-token kernels make it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Offset {
    /// Q4_K: `d·A`, then `− dmin·P`, two fused adds.
    Mins,
    /// Q6_K: `d·(A − 32·P)`, one.
    ThirtyTwo,
}

thread_local! {
    /// A work item's rows unpacked to a byte per value, and their blocks' scales: kept per
    /// thread, so a prompt's many work items do not allocate them again.
    static UNPACKED: std::cell::Cell<(Vec<u8>, Vec<BlockScales>)> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// Q4_K rows times tiles of tokens.
///
/// # Safety
/// AVX-512 F, BW, VL, VNNI, AVX2 and FMA are present; `out` holds every (token, row) written.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn q4k_tiles(w: &[BlockQ4K], tiles: &[TileQ8K], n: usize, tokens: usize, out: Out) {
    let nibble = _mm256_set1_epi8(0xF);
    let (mut values, mut scales) = UNPACKED.take();
    values.resize(w.len() * QK_K, 0);
    scales.resize(w.len(), BlockScales::default());
    for ((block, v), s) in w.iter().zip(values.chunks_exact_mut(QK_K)).zip(&mut scales) {
        for j in 0..4 {
            // SAFETY: `qs` has 128 bytes and `v` 256: offsets 32j + 32 and 64j + 64 stay inside.
            unsafe {
                let q = load(block.qs.as_ptr().add(32 * j));
                _mm256_storeu_si256(v.as_mut_ptr().add(64 * j).cast(), _mm256_and_si256(q, nibble));
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
                _mm256_storeu_si256(v.as_mut_ptr().add(64 * j + 32).cast(), hi);
            }
        }
        for j in 0..8 {
            let (scale, min) = block.scale_min(j);
            s.scales[j] = i32::from(scale);
            s.pairs[j] = i32::from(min) * 0x0001_0001;
        }
        (s.d, s.dmin) = (f16_bits(block.d), f16_bits(block.dmin));
    }
    // SAFETY: the caller's.
    unsafe { kquant_tiles::<32>(&values, &scales, Offset::Mins, tiles, n, tokens, out) };
    UNPACKED.set((values, scales));
}

/// Q6_K rows times tiles of tokens.
///
/// # Safety
/// As [`q4k_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn q6k_tiles(w: &[BlockQ6K], tiles: &[TileQ8K], n: usize, tokens: usize, out: Out) {
    let (mut values, mut scales) = UNPACKED.take();
    values.resize(w.len() * QK_K, 0);
    scales.resize(w.len(), BlockScales::default());
    for ((block, v), s) in w.iter().zip(values.chunks_exact_mut(QK_K)).zip(&mut scales) {
        for half in 0..2 {
            for (g, q) in q6k_groups(block, half).into_iter().enumerate() {
                // SAFETY: `v` is 256 bytes: offset 128·half + 32g + 32 stays inside.
                unsafe { _mm256_storeu_si256(v.as_mut_ptr().add(128 * half + 32 * g).cast(), q) };
            }
        }
        for (i, &scale) in block.scales.iter().enumerate() {
            s.scales[i] = i32::from(scale);
        }
        for (p, pair) in block.scales.chunks_exact(2).enumerate() {
            // `as u16` sign-extends each `i8` to the `i16` it stands for.
            s.pairs[p] = (u32::from(pair[0] as u16) | (u32::from(pair[1] as u16) << 16)) as i32;
        }
        s.d = f16_bits(block.d);
    }
    // SAFETY: the caller's.
    unsafe { kquant_tiles::<16>(&values, &scales, Offset::ThirtyTwo, tiles, n, tokens, out) };
    UNPACKED.set((values, scales));
}

/// Rows of unpacked k-quant blocks (`values`, a byte per value, and `scales`, `n` blocks per
/// row) times tiles of tokens, groups of `GROUP` values sharing a scale.
///
/// # Safety
/// As [`q4k_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn kquant_tiles<const GROUP: usize>(
    values: &[u8],
    scales: &[BlockScales],
    offset: Offset,
    tiles: &[TileQ8K],
    n: usize,
    tokens: usize,
    out: Out,
) {
    let rows = scales.len() / n;
    for (g, group) in tiles.chunks_exact(n).enumerate() {
        for first in (0..rows).step_by(ROWS) {
            let r = pass_rows(first, rows);
            let mut acc = [_mm512_setzero_ps(); ROWS];
            for (b, tile) in group.iter().enumerate() {
                let at = r.map(|r| (r * n + b) * QK_K);
                let s = r.map(|r| &scales[r * n + b]);
                let mut sums = [_mm512_setzero_si512(); ROWS];
                for part in 0..QK_K / GROUP {
                    let mut sub = [_mm512_setzero_si512(); ROWS];
                    for k in 0..GROUP / 4 {
                        let at_value = GROUP * part + 4 * k;
                        // SAFETY: `tile.qs` has 64 rows of 64 bytes; each row's values are 256
                        // bytes from `at`, of which `at_value + 4` stays inside.
                        let xv = unsafe { load64(tile.qs[at_value / 4].as_ptr().cast()) };
                        for i in 0..ROWS {
                            let wv = unsafe { broadcast4(values.as_ptr().add(at[i] + at_value)) };
                            sub[i] = _mm512_dpbusd_epi32(sub[i], wv, xv);
                        }
                    }
                    for i in 0..ROWS {
                        let scaled = _mm512_mullo_epi32(sub[i], _mm512_set1_epi32(s[i].scales[part]));
                        sums[i] = _mm512_add_epi32(sums[i], scaled);
                    }
                }
                let mut paired = [_mm512_setzero_si512(); ROWS];
                for (p, pairs) in tile.bsums.iter().enumerate() {
                    // SAFETY: a row of 16 lanes is 64 bytes.
                    let pairs = unsafe { load64(pairs.as_ptr().cast()) };
                    for i in 0..ROWS {
                        paired[i] = _mm512_dpwssd_epi32(paired[i], pairs, _mm512_set1_epi32(s[i].pairs[p]));
                    }
                }
                // SAFETY: sixteen floats.
                let dx = unsafe { _mm512_loadu_ps(tile.d.as_ptr()) };
                for i in 0..ROWS {
                    let scaled = _mm512_mul_ps(dx, _mm512_set1_ps(s[i].d));
                    if offset == Offset::Mins {
                        acc[i] = _mm512_fmadd_ps(scaled, _mm512_cvtepi32_ps(sums[i]), acc[i]);
                        let mins = _mm512_mul_ps(dx, _mm512_set1_ps(s[i].dmin));
                        acc[i] = _mm512_fnmadd_ps(mins, _mm512_cvtepi32_ps(paired[i]), acc[i]);
                    } else {
                        let total = _mm512_sub_epi32(sums[i], _mm512_slli_epi32::<5>(paired[i]));
                        acc[i] = _mm512_fmadd_ps(scaled, _mm512_cvtepi32_ps(total), acc[i]);
                    }
                }
            }
            // SAFETY: the caller's.
            unsafe { write_tile(out, &acc, first, rows, g * TILE_TOKENS, tokens) };
        }
    }
}

/// Q8_0 rows times tiles of tokens (whose values carry a +128 offset).
///
/// # Safety
/// As [`q4k_tiles`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn q8_0_tiles(w: &[BlockQ8_0], tiles: &[TileQ8x32], n: usize, tokens: usize, out: Out) {
    let rows = w.len() / n;
    // 128 · Σ w per block: what the activations' offset adds to each dot product.
    let offsets: Vec<i32> = w.iter().map(|b| 128 * b.qs.iter().map(|&v| i32::from(v)).sum::<i32>()).collect();
    for (g, group) in tiles.chunks_exact(n).enumerate() {
        for first in (0..rows).step_by(ROWS) {
            let r = pass_rows(first, rows);
            let mut acc = [_mm512_setzero_ps(); ROWS];
            // Blocks in pairs, as `dot_q8_0` takes them.
            for b in (0..n).step_by(2) {
                let first_of_pair = q8_0_tile_products(w, &offsets, &group[b], r, n, b);
                if b + 1 < n {
                    let (sums, scales) = q8_0_tile_products(w, &offsets, &group[b + 1], r, n, b + 1);
                    for i in 0..ROWS {
                        let first = _mm512_mul_ps(first_of_pair.1[i], first_of_pair.0[i]);
                        acc[i] = _mm512_add_ps(acc[i], _mm512_fmadd_ps(scales[i], sums[i], first));
                    }
                } else {
                    let (sums, scales) = first_of_pair;
                    for i in 0..ROWS {
                        acc[i] = _mm512_fmadd_ps(scales[i], sums[i], acc[i]);
                    }
                }
            }
            // SAFETY: the caller's.
            unsafe { write_tile(out, &acc, first, rows, g * TILE_TOKENS, tokens) };
        }
    }
}

/// Block `b` of rows `r` times one tile: each row's sixteen dot products as floats, and the
/// sixteen products of the tokens' and the block's scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn q8_0_tile_products(
    w: &[BlockQ8_0],
    offsets: &[i32],
    tile: &TileQ8x32,
    r: [usize; ROWS],
    n: usize,
    b: usize,
) -> ([__m512; ROWS], [__m512; ROWS]) {
    let mut sums = [_mm512_setzero_si512(); ROWS];
    for k in 0..8 {
        // SAFETY: a row of 16 lanes is 64 bytes; a block's values are 32 bytes.
        let xv = unsafe { load64(tile.qs[k].as_ptr().cast()) };
        for i in 0..ROWS {
            let wv = unsafe { broadcast4(w[r[i] * n + b].qs.as_ptr().add(4 * k).cast()) };
            sums[i] = _mm512_dpbusd_epi32(sums[i], xv, wv);
        }
    }
    // SAFETY: sixteen floats.
    let dx = unsafe { _mm512_loadu_ps(tile.d.as_ptr()) };
    let mut floats = [_mm512_setzero_ps(); ROWS];
    let mut scales = [_mm512_setzero_ps(); ROWS];
    for i in 0..ROWS {
        let total = _mm512_sub_epi32(sums[i], _mm512_set1_epi32(offsets[r[i] * n + b]));
        floats[i] = _mm512_cvtepi32_ps(total);
        scales[i] = _mm512_mul_ps(dx, _mm512_set1_ps(f16_bits(w[r[i] * n + b].d)));
    }
    (floats, scales)
}
