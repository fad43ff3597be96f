//! AVX2 + FMA kernels, used when the CPU reports both at run time.
//!
//! Each works a whole super-block at a time in 256-bit registers: weights are widened to
//! unsigned bytes, multiplied with the signed activations in pairs (`maddubs`, which cannot
//! saturate here: at most 2 · 63 · 128), then by their sub-block scale into 32-bit sums
//! (`madd`). A k-quant's min or offset is applied once per block through the activations'
//! per-16 sums instead of per value.

use super::blocks::{BlockQ4K, BlockQ6K, BlockQ8_0, BlockQ8K, BlockQ8x32, QK_K, f16_bits};
use super::{Kernels, Out};
use std::arch::x86_64::*;

/// The AVX2 kernels, when this CPU has AVX2 and FMA.
pub(super) fn kernels() -> Option<Kernels> {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    Some(Kernels {
        q4k: q4k_rows,
        q6k: q6k_rows,
        q8_0: q8_0_rows,
        // SAFETY: AVX2 and FMA were detected just above.
        quantize_q8k: |x, out| unsafe { quantize_q8k(x, out) },
        tiled: None,
        // SAFETY: AVX2 and FMA were detected just above.
        multiply_step: Some(|n| unsafe { multiply_step(n) }),
        name: "avx2",
    })
}

/// `n` rounds of eight independent `add(madd(maddubs(w, x), scale))` steps, each `x` loaded
/// from L1 as the four-token kernels load a token's activations: 32 multiply-adds a step.
///
/// # Safety
/// AVX2 and FMA are present (as for every kernel here, so [`load`] inlines).
#[target_feature(enable = "avx2,fma")]
unsafe fn multiply_step(n: u64) -> u64 {
    let (w, scale) = (_mm256_set1_epi8(7), _mm256_set1_epi16(3));
    let mut xs = [0u8; 256];
    xs.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
    let mut acc = [_mm256_setzero_si256(); 8];
    for _ in 0..n {
        // The activations' address hidden from the optimiser, so each round loads them.
        let x = std::hint::black_box(&xs);
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `xs` has 256 bytes: offset 32k + 32 stays inside.
            let x = unsafe { load(x.as_ptr().add(32 * k)) };
            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale));
        }
    }
    std::hint::black_box(acc);
    n * 8 * 32
}

/// An item's rows times every token: up to four tokens at a time through every row (a long
/// prompt's items are sized by `matmul` to fit L1, so the rows and the group's activations stay
/// there while they are combined), a group of two or three where fewer are left (a draft's
/// pass, a prompt's tail), a lone token through the one-token kernel. One call per work item,
/// so the kernels inline here.
macro_rules! rows_times {
    ($name:ident, $w:ty, $x:ty, $one:ident, $group:ident) => {
        /// Rows times tokens with the AVX2 kernels.
        ///
        /// # Safety
        /// AVX2 and FMA are present; `out` holds every (token, row) written.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $name(w: &[$w], x: &[$x], n: usize, out: Out) {
            let (rows, tokens) = (w.len() / n, x.len() / n);
            // The group's tokens from `t` through every row, `$size` at a time.
            macro_rules! group {
                ($t:expr, $size:literal) => {{
                    let t = $t;
                    let xs: [&[$x]; $size] = std::array::from_fn(|i| &x[(t + i) * n..(t + i + 1) * n]);
                    for r in 0..rows {
                        let values = $group::<$size>(&w[r * n..(r + 1) * n], xs);
                        for (i, v) in values.into_iter().enumerate() {
                            // SAFETY: the caller's.
                            unsafe { out.write(t + i, r, v) };
                        }
                    }
                }};
            }
            let quads = tokens / 4 * 4;
            for t in (0..quads).step_by(4) {
                group!(t, 4);
            }
            match tokens - quads {
                3 => group!(quads, 3),
                2 => group!(quads, 2),
                1 => {
                    let x = &x[quads * n..];
                    for r in 0..rows {
                        // SAFETY: the caller's.
                        unsafe { out.write(quads, r, $one(&w[r * n..(r + 1) * n], x)) };
                    }
                }
                _ => {}
            }
        }
    };
}

rows_times!(q4k_rows, BlockQ4K, BlockQ8K, dot_q4k_q8k, dot_q4k_q8k_group);
rows_times!(q6k_rows, BlockQ6K, BlockQ8K, dot_q6k_q8k, dot_q6k_q8k_group);
rows_times!(q8_0_rows, BlockQ8_0, BlockQ8x32, dot_q8_0_q8x32, dot_q8_0_q8x32_group);

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// How far ahead of the block being read the kernels ask for weights: a generated token reads
/// every weight once, from memory, and a row's bytes come faster asked for this far ahead
/// than when each block's loads wait for the hardware prefetcher (the 1.5B model on a 2-core
/// AVX-512 Xeon: 11.3-12.9 → 17.5-20.0 tokens/s; 0.5, 1, 2 and 8 KiB ahead measured slower,
/// docs/benchmarks.md). The four-token prompt kernels ask too; their gain was not measured.
const PREFETCH_BYTES: usize = 4096;

/// Asks for the `LINES` cache lines [`PREFETCH_BYTES`] past `block` (a block's bytes: Q4_K 144,
/// Q6_K 210, two Q8_0 68).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn prefetch_ahead<T, const LINES: usize>(block: &T) {
    let at = std::ptr::from_ref(block).cast::<i8>().wrapping_add(PREFETCH_BYTES);
    for line in 0..LINES {
        // A prefetch never faults, whatever the address (past the weights, at the end).
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line));
    }
}

/// Loads 32 bytes from `p` (no alignment needed).
///
/// # Safety
/// `p` points at 32 readable bytes.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// A Q4_K block's eight scales and eight mins as 16-bit lanes, unpacked from their 6-bit
/// fields with word operations rather than byte by byte.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn q4k_scales_mins(w: &BlockQ4K) -> (__m128i, __m128i) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let word =
        |i: usize| u32::from_le_bytes([w.scales[4 * i], w.scales[4 * i + 1], w.scales[4 * i + 2], w.scales[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    // Sub-blocks 0–3 keep their scale and min in the low six bits of bytes 0–3 and 4–7; 4–7
    // have four bits in bytes 8–11 and their top two in the spare bits of bytes 0–7.
    let scales = [u0 & LOW6, (u2 & LOW4) | (((u0 >> 6) & TOP2) << 4)];
    let mins = [u1 & LOW6, ((u2 >> 4) & LOW4) | (((u1 >> 6) & TOP2) << 4)];
    let widen = |v: [u32; 2]| _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, v[1] as i32, v[0] as i32));
    (widen(scales), widen(mins))
}

/// `Σ min_j · (sum of x over sub-block j)` for one Q4_K block: four 32-bit partial sums.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn q4k_mins_dot(mins: __m128i, x: &BlockQ8K) -> __m128i {
    // SAFETY: `bsums` is 16 i16: two 16-byte loads.
    let (lo, hi) =
        unsafe { (_mm_loadu_si128(x.bsums.as_ptr().cast()), _mm_loadu_si128(x.bsums.as_ptr().add(8).cast())) };
    // Adjacent pairs of per-16 sums are the per-32 sums of the eight sub-blocks.
    _mm_madd_epi16(mins, _mm_hadd_epi16(lo, hi))
}

/// One Q4_K row with one token, in the same floating-point order as [`dot_q4k_q8k_group`] (mins
/// subtracted into the accumulator, then the block's sum added), so a token's result does not
/// depend on whether it came alone or in a group.
#[target_feature(enable = "avx2,fma")]
fn dot_q4k_q8k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let nibble = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        prefetch_ahead::<_, 3>(w);
        let (scales, mins) = q4k_scales_mins(w);
        let m = _mm256_cvtepi32_ps(_mm256_zextsi128_si256(q4k_mins_dot(mins, x)));
        acc = _mm256_fnmadd_ps(_mm256_set1_ps(x.d * f16_bits(w.dmin)), m, acc);
        // SAFETY: `__m128i` and `[i16; 8]` have the same size and any bits are valid for both.
        let scales: [i16; 8] = unsafe { std::mem::transmute(scales) };
        let mut sums = _mm256_setzero_si256();
        for j in 0..4 {
            // SAFETY: `qs` has 128 bytes and `x.qs` 256: offsets 32j and 64j + 32 stay inside.
            let (q, lo, hi) = unsafe {
                (
                    load(w.qs.as_ptr().add(32 * j)),
                    load(x.qs.as_ptr().add(64 * j).cast()),
                    load(x.qs.as_ptr().add(64 * j + 32).cast()),
                )
            };
            let q_lo = _mm256_and_si256(q, nibble);
            let q_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble);
            let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(q_lo, lo), _mm256_set1_epi16(scales[2 * j]));
            let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(q_hi, hi), _mm256_set1_epi16(scales[2 * j + 1]));
            sums = _mm256_add_epi32(sums, _mm256_add_epi32(p_lo, p_hi));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d * f16_bits(w.d)), _mm256_cvtepi32_ps(sums), acc);
    }
    hsum_ps(acc)
}

/// A Q6_K block's 16 scales as 16-bit lanes, even-numbered ones in the low half and odd ones
/// in the high half, so [`q6k_group_scale`] picks a group's two with one shuffle.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q6k_paired_scales(w: &BlockQ6K) -> __m256i {
    // SAFETY: `scales` is 16 bytes.
    let bytes = unsafe { _mm_loadu_si128(w.scales.as_ptr().cast()) };
    let split = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    _mm256_cvtepi8_epi16(split)
}

/// The scales of group `k` (values 32k..32k + 32): scale 2k on the low 16 values, 2k + 1 on
/// the high 16.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q6k_group_scale(paired: __m256i, k: usize) -> __m256i {
    // Bytes 2k, 2k + 1 in every 16-bit lane: the pattern 0, 1 plus 2k (built from two
    // broadcasts: a per-byte constructor would cost 32 inserts where `k` is not a constant).
    let pick = _mm256_add_epi8(_mm256_set1_epi16(0x0100), _mm256_set1_epi8((2 * k) as i8));
    _mm256_shuffle_epi8(paired, pick)
}

/// The four groups of 32 values in half `half` (values 128·half..) of a Q6_K block, each value
/// as an unsigned byte (0..64): the low four bits from `ql`, the high two from `qh`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn q6k_groups(w: &BlockQ6K, half: usize) -> [__m256i; 4] {
    let nibble = _mm256_set1_epi8(0xF);
    let two_bits = _mm256_set1_epi8(3);
    // SAFETY: `ql` is 128 bytes and `qh` 64: offsets 64·half + 32 and 32·half stay inside.
    let (ql0, ql1, qh) = unsafe {
        (
            load(w.ql.as_ptr().add(64 * half)),
            load(w.ql.as_ptr().add(64 * half + 32)),
            load(w.qh.as_ptr().add(32 * half)),
        )
    };
    let lows = [
        _mm256_and_si256(ql0, nibble),
        _mm256_and_si256(ql1, nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), nibble),
    ];
    let highs = [qh, _mm256_srli_epi16::<2>(qh), _mm256_srli_epi16::<4>(qh), _mm256_srli_epi16::<6>(qh)];
    [0, 1, 2, 3].map(|g| _mm256_or_si256(lows[g], _mm256_slli_epi16::<4>(_mm256_and_si256(highs[g], two_bits))))
}

#[target_feature(enable = "avx2,fma")]
fn dot_q6k_q8k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        prefetch_ahead::<_, 4>(w);
        // The −32 offset of every value, once per block: 32 · Σ scale_i · (sum of x over 16 i).
        // SAFETY: `bsums` is 16 i16 (32 bytes); `scales` is 16 bytes.
        let (bsums, scales16) =
            unsafe { (load(x.bsums.as_ptr().cast()), _mm256_cvtepi8_epi16(_mm_loadu_si128(w.scales.as_ptr().cast()))) };
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales16));
        let paired = q6k_paired_scales(w);
        let mut sums = _mm256_setzero_si256();
        for half in 0..2 {
            let groups = q6k_groups(w, half);
            for (g, q) in groups.into_iter().enumerate() {
                let first = 128 * half + 32 * g;
                // SAFETY: `first + 32 ≤ 256`.
                let xs = unsafe { load(x.qs.as_ptr().add(first).cast()) };
                // Values `first..first + 16` have scale `first / 16`, the next 16 the next one.
                let scale = q6k_group_scale(paired, 4 * half + g);
                sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(q, xs), scale));
            }
        }
        let sums = _mm256_sub_epi32(sums, offset);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d * f16_bits(w.d)), _mm256_cvtepi32_ps(sums), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma")]
fn dot_q8_0_q8x32(w: &[BlockQ8_0], x: &[BlockQ8x32]) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        prefetch_ahead::<_, 1>(w);
        // SAFETY: both hold 32 bytes of values.
        let (a, b) = unsafe { (load(w.qs.as_ptr().cast()), load(x.qs.as_ptr().cast())) };
        // maddubs multiplies unsigned by signed: move a's sign onto b.
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_bits(w.d) * x.d), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

/// [`dot_q4k_q8k`] of one weight row with `N` activation rows (two to four): each 32-byte piece
/// of the row's nibbles is unpacked, and its two sub-blocks' scales broadcast, once for all `N`
/// tokens (a prompt's tokens share every weight row), and their integer sums stay in registers
/// while it is used. (Unpacking a whole block first, then going token by token,
/// needs sixteen registers for the block alone: the compiler kept them on the stack and
/// reloaded two per product.)
#[target_feature(enable = "avx2,fma")]
fn dot_q4k_q8k_group<const N: usize>(w: &[BlockQ4K], x: [&[BlockQ8K]; N]) -> [f32; N] {
    let nibble = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, w) in w.iter().enumerate() {
        prefetch_ahead::<_, 3>(w);
        let (scales, mins) = q4k_scales_mins(w);
        // SAFETY: `__m128i` and `[i16; 8]` have the same size and any bits are valid for both.
        let scales: [i16; 8] = unsafe { std::mem::transmute(scales) };
        let xs: [&BlockQ8K; N] = std::array::from_fn(|t| &x[t][b]);
        let mut sums = [_mm256_setzero_si256(); N];
        // The count hidden from the optimiser: unrolled, the four pieces' loops became one
        // schedule that unpacked the whole block first and spilled it again.
        for j in 0..std::hint::black_box(4) {
            // Taken mod 4 so the loads and scales stay in bounds whatever the count.
            let j = j % 4;
            // Piece j holds sub-blocks 2j (its bytes' low nibbles) and 2j + 1 (high nibbles).
            // SAFETY: `qs` has 128 bytes: offset 32j stays inside.
            let bytes = unsafe { load(w.qs.as_ptr().add(32 * j)) };
            let q_lo = _mm256_and_si256(bytes, nibble);
            let q_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), nibble);
            let (s_lo, s_hi) = (_mm256_set1_epi16(scales[2 * j]), _mm256_set1_epi16(scales[2 * j + 1]));
            for (sum, x) in sums.iter_mut().zip(xs) {
                // SAFETY: `x.qs` has 256 bytes: offsets 64j and 64j + 32 stay inside.
                let (lo, hi) =
                    unsafe { (load(x.qs.as_ptr().add(64 * j).cast()), load(x.qs.as_ptr().add(64 * j + 32).cast())) };
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q_lo, lo), s_lo));
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q_hi, hi), s_hi));
            }
        }
        // The floats in the one-token kernel's order: the mins subtracted, then the block's sum
        // added (the integer sums are exact in any order).
        let (d, dmin) = (f16_bits(w.d), f16_bits(w.dmin));
        for t in 0..N {
            let x = xs[t];
            let m = _mm256_cvtepi32_ps(_mm256_zextsi128_si256(q4k_mins_dot(mins, x)));
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(x.d * dmin), m, acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(x.d * d), _mm256_cvtepi32_ps(sums[t]), acc[t]);
        }
    }
    acc.map(|a| hsum_ps(a))
}

/// Group `k` of a Q6_K block (values 32k..32k + 32) as unsigned bytes, the same as
/// `q6k_groups(w, k / 4)[k % 4]`, for a loop that unpacks a group where it uses it. `k` is
/// taken mod 8, so the loads stay in bounds for any `k` (the caller's count is hidden behind
/// `black_box`).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn q6k_group(w: &BlockQ6K, k: usize) -> __m256i {
    let (half, g) = (k / 4 % 2, k % 4);
    // SAFETY: `ql` is 128 bytes and `qh` 64: offsets at most 64 + 32 and 32 stay inside.
    let (ql, qh) = unsafe { (load(w.ql.as_ptr().add(64 * half + 32 * (g % 2))), load(w.qh.as_ptr().add(32 * half))) };
    let low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g / 2) as i32)), _mm256_set1_epi8(0xF));
    let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32)), _mm256_set1_epi8(3));
    _mm256_or_si256(low, _mm256_slli_epi16::<4>(high))
}

/// [`dot_q6k_q8k`] of one weight row with `N` activation rows (two to four): each group of the
/// row is unpacked, and its scales picked, once for all `N` tokens, which keep their integer
/// sums in registers meanwhile (as in [`dot_q4k_q8k_group`]).
#[target_feature(enable = "avx2,fma")]
fn dot_q6k_q8k_group<const N: usize>(w: &[BlockQ6K], x: [&[BlockQ8K]; N]) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, w) in w.iter().enumerate() {
        prefetch_ahead::<_, 4>(w);
        // SAFETY: `scales` is 16 bytes.
        let scales16 = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(w.scales.as_ptr().cast()) });
        let paired = q6k_paired_scales(w);
        let xs: [&BlockQ8K; N] = std::array::from_fn(|t| &x[t][b]);
        // Each token's sum starts at minus its offset (the values are stored plus 32).
        let mut sums = xs.map(|x| {
            // SAFETY: `bsums` is 16 i16 (32 bytes).
            let bsums = unsafe { load(x.bsums.as_ptr().cast()) };
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales16));
            _mm256_sub_epi32(_mm256_setzero_si256(), offset)
        });
        // The count hidden from the optimiser, as in the Q4_K kernel.
        for k in 0..std::hint::black_box(8) {
            let (q, s) = (q6k_group(w, k), q6k_group_scale(paired, k));
            for (sum, x) in sums.iter_mut().zip(xs) {
                // SAFETY: `x.qs` has 256 bytes: offset 32 · (k % 8) stays inside.
                let v = unsafe { load(x.qs.as_ptr().add(32 * (k % 8)).cast()) };
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, v), s));
            }
        }
        let d = f16_bits(w.d);
        for t in 0..N {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(xs[t].d * d), _mm256_cvtepi32_ps(sums[t]), acc[t]);
        }
    }
    acc.map(|a| hsum_ps(a))
}

/// [`dot_q8_0_q8x32`] of one weight row with `N` activation rows (two to four).
#[target_feature(enable = "avx2,fma")]
fn dot_q8_0_q8x32_group<const N: usize>(w: &[BlockQ8_0], x: [&[BlockQ8x32]; N]) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, w) in w.iter().enumerate() {
        // SAFETY: 32 bytes of values.
        let a = unsafe { load(w.qs.as_ptr().cast()) };
        let abs = _mm256_sign_epi8(a, a);
        let d = f16_bits(w.d);
        for t in 0..N {
            let x = &x[t][b];
            // SAFETY: 32 bytes of values.
            let v = unsafe { load(x.qs.as_ptr().cast()) };
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(abs, _mm256_sign_epi8(v, a)), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    acc.map(|a| hsum_ps(a))
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for (block, out) in x.chunks_exact(QK_K).zip(out) {
        let mut max = _mm256_setzero_ps();
        for v in block.chunks_exact(8) {
            // SAFETY: `v` is 8 floats.
            max = _mm256_max_ps(max, _mm256_and_ps(unsafe { _mm256_loadu_ps(v.as_ptr()) }, abs_mask));
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps::<1>(max));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        if amax == 0.0 {
            *out = BlockQ8K::ZERO;
            continue;
        }
        let inv = _mm256_set1_ps(127.0 / amax);
        for (chunk, q) in block.chunks_exact(32).zip(out.qs.chunks_exact_mut(32)) {
            let mut ints = [_mm256_setzero_si256(); 4];
            for (i, v) in ints.iter_mut().enumerate() {
                // SAFETY: `chunk` is 32 floats.
                let f = _mm256_mul_ps(unsafe { _mm256_loadu_ps(chunk.as_ptr().add(8 * i)) }, inv);
                // Rounds half to even, as the portable kernel does.
                *v = _mm256_cvtps_epi32(f);
            }
            // Pack 32 × i32 to i8; the packs interleave 128-bit lanes, the permute restores order.
            let w16a = _mm256_packs_epi32(ints[0], ints[1]);
            let w16b = _mm256_packs_epi32(ints[2], ints[3]);
            let bytes = _mm256_packs_epi16(w16a, w16b);
            let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            // SAFETY: `q` is 32 bytes.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes) };
        }
        for (sum, q) in out.bsums.iter_mut().zip(out.qs.chunks_exact(16)) {
            *sum = q.iter().map(|&v| i16::from(v)).sum();
        }
        out.d = amax / 127.0;
    }
}
