//! Portable kernels: the reference the SIMD ones are tested against, and what runs on CPUs
//! without them. Integer sums are exact, so a SIMD kernel differs from these only by the order
//! of its final `f32` additions.

use super::Out;
use super::blocks::{BlockQ4K, BlockQ6K, BlockQ8_0, BlockQ8K, BlockQ8x32, QK_K, f16_bits};

/// A weight block and the activation block its dot product reads.
pub trait Dot<X>: Sized {
    /// `Σ w·x` over one row.
    fn dot(w: &[Self], x: &[X]) -> f32;
}

impl Dot<BlockQ8K> for BlockQ4K {
    fn dot(w: &[Self], x: &[BlockQ8K]) -> f32 {
        dot_q4k_q8k(w, x)
    }
}

impl Dot<BlockQ8K> for BlockQ6K {
    fn dot(w: &[Self], x: &[BlockQ8K]) -> f32 {
        dot_q6k_q8k(w, x)
    }
}

impl Dot<BlockQ8x32> for BlockQ8_0 {
    fn dot(w: &[Self], x: &[BlockQ8x32]) -> f32 {
        dot_q8_0_q8x32(w, x)
    }
}

/// Rows times tokens with the portable dot products (rows and tokens `n` blocks long).
///
/// # Safety
/// `out` holds every (token, row) written.
pub unsafe fn rows_times<W: Dot<X>, X>(w: &[W], x: &[X], n: usize, out: Out) {
    for (t, x) in x.chunks_exact(n).enumerate() {
        for (r, w) in w.chunks_exact(n).enumerate() {
            // SAFETY: the caller's.
            unsafe { out.write(t, r, W::dot(w, x)) };
        }
    }
}

/// Quantises `x` (a multiple of 256 long) to 8 bits per 256, with the sum of each 16.
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    for (block, out) in x.chunks_exact(QK_K).zip(out) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            *out = BlockQ8K::ZERO;
            continue;
        }
        let inv = 127.0 / amax;
        for (q, v) in out.qs.iter_mut().zip(block) {
            // |v · inv| ≤ 127 by construction of `inv`.
            *q = (v * inv).round_ties_even() as i8;
        }
        for (sum, q) in out.bsums.iter_mut().zip(out.qs.chunks_exact(16)) {
            *sum = q.iter().map(|&v| i16::from(v)).sum();
        }
        out.d = amax / 127.0;
    }
}

/// Quantises `x` (a multiple of 32 long) to 8 bits per 32.
pub fn quantize_q8x32(x: &[f32], out: &mut [BlockQ8x32]) {
    for (block, out) in x.chunks_exact(32).zip(out) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            *out = BlockQ8x32::ZERO;
            continue;
        }
        let inv = 127.0 / amax;
        for (q, v) in out.qs.iter_mut().zip(block) {
            *q = (v * inv).round_ties_even() as i8;
        }
        out.d = amax / 127.0;
    }
}

/// `Σ w·x` over one row of Q4_K weights.
pub fn dot_q4k_q8k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (w, x) in w.iter().zip(x) {
        let (mut dots, mut mins) = (0i32, 0i32);
        for j in 0..4 {
            let q = &w.qs[32 * j..32 * j + 32];
            let (lo, hi) = (&x.qs[64 * j..64 * j + 32], &x.qs[64 * j + 32..64 * j + 64]);
            let dot_lo: i32 = q.iter().zip(lo).map(|(&q, &x)| i32::from(q & 0xF) * i32::from(x)).sum();
            let dot_hi: i32 = q.iter().zip(hi).map(|(&q, &x)| i32::from(q >> 4) * i32::from(x)).sum();
            let (s_lo, m_lo) = w.scale_min(2 * j);
            let (s_hi, m_hi) = w.scale_min(2 * j + 1);
            dots += i32::from(s_lo) * dot_lo + i32::from(s_hi) * dot_hi;
            let sums = |sub: usize| i32::from(x.bsums[2 * sub]) + i32::from(x.bsums[2 * sub + 1]);
            mins += i32::from(m_lo) * sums(2 * j) + i32::from(m_hi) * sums(2 * j + 1);
        }
        sum += x.d * (f16_bits(w.d) * dots as f32 - f16_bits(w.dmin) * mins as f32);
    }
    sum
}

/// The six-bit value `i` (0..256) of a Q6_K block, unsigned (0..64; the weight is `q − 32`).
#[inline]
pub fn q6k_value(w: &BlockQ6K, i: usize) -> u8 {
    let (half, l) = (i / 128, i % 128);
    let (group, l) = (l / 32, l % 32);
    let ql = w.ql[64 * half + l + 32 * (group & 1)];
    let low = if group < 2 { ql & 0xF } else { ql >> 4 };
    let high = (w.qh[32 * half + l] >> (2 * group)) & 3;
    low | (high << 4)
}

/// `Σ w·x` over one row of Q6_K weights.
pub fn dot_q6k_q8k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (w, x) in w.iter().zip(x) {
        let mut dots = 0i32;
        for (s, (scale, xs)) in w.scales.iter().zip(x.qs.chunks_exact(16)).enumerate() {
            let dot: i32 =
                xs.iter().enumerate().map(|(l, &x)| (i32::from(q6k_value(w, 16 * s + l)) - 32) * i32::from(x)).sum();
            dots += i32::from(*scale) * dot;
        }
        sum += x.d * f16_bits(w.d) * dots as f32;
    }
    sum
}

/// `Σ w·x` over one row of Q8_0 weights.
pub fn dot_q8_0_q8x32(w: &[BlockQ8_0], x: &[BlockQ8x32]) -> f32 {
    w.iter()
        .zip(x)
        .map(|(w, x)| {
            let dot: i32 = w.qs.iter().zip(&x.qs).map(|(&a, &b)| i32::from(a) * i32::from(b)).sum();
            f16_bits(w.d) * x.d * dot as f32
        })
        .sum()
}
