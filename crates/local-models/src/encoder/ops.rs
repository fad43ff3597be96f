//! Two fused CPU kernels for the encoder, where candle's generic ops cost more than the
//! arithmetic: exact-erf GELU over both cores, and the attention softmax with its scale and
//! key-padding mask folded in (one pass over the scores instead of three).

use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use rayon::prelude::*;

/// Elements per parallel task: large enough to amortise scheduling.
const PAR_CHUNK: usize = 16 * 1024;

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else { candle_core::bail!("{op}: expected f32") };
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("{op}: input must be contiguous"),
    }
}

/// `e^x` to within 2e-7 relative for x in [-87, 88] (below: the smallest normal float).
/// Branch-free so loops over it vectorise; libm's `expf` is a call per element.
#[inline(always)]
fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let k = (x * std::f32::consts::LOG2_E).round();
    // ln 2 split in two so `k * ln2` stays exact in f32.
    let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// `erf` with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26), below f32 resolution near 1.
#[inline]
fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_72) * t + 0.254_829_6) * t;
    let y = 1.0 - poly * exp(-a * a);
    y.copysign(x)
}

/// GELU with the exact (erf) form, as BERT/XLM-R are trained.
pub struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "e5-gelu-erf"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let src = contiguous(storage, layout, self.name())?;
        let mut dst = Vec::with_capacity(src.len());
        src.par_iter()
            .with_min_len(PAR_CHUNK)
            .map(|&x| 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)))
            .collect_into_vec(&mut dst);
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

/// Softmax over the last dimension of `[batch, heads, queries, keys]` attention scores, each
/// score first multiplied by `scale`; keys at or beyond the sequence's length get weight 0.
pub struct MaskedSoftmax {
    /// Real length of each batch member.
    pub lengths: Vec<usize>,
    /// Attention heads.
    pub heads: usize,
    /// `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl CustomOp1 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "e5-masked-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let src = contiguous(storage, layout, self.name())?;
        let dims = layout.shape().dims();
        let [batch, heads, queries, keys] = dims else { candle_core::bail!("{}: expected 4 dimensions", self.name()) };
        if *batch != self.lengths.len() || *heads != self.heads || keys == &0 {
            candle_core::bail!("{}: shape {dims:?} does not match {} sequences", self.name(), self.lengths.len());
        }
        let rows_per_member = heads * queries;
        let mut dst = vec![0f32; src.len()];
        dst.par_chunks_mut(*keys).zip(src.par_chunks(*keys)).enumerate().for_each(|(row, (d, s))| {
            let valid = self.lengths[row / rows_per_member].clamp(1, *keys);
            let max = s[..valid].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) * self.scale;
            for (d, &x) in d[..valid].iter_mut().zip(&s[..valid]) {
                *d = exp(x * self.scale - max);
            }
            let inv = 1.0 / d[..valid].iter().sum::<f32>();
            d[..valid].iter_mut().for_each(|x| *x *= inv);
        });
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn fast_exp_is_accurate_over_the_softmax_range() {
        let mut worst = 0f32;
        for i in 0..=20_000 {
            let x = -80.0 + i as f32 * 0.0045;
            worst = worst.max(((exp(x) - x.exp()) / x.exp()).abs());
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) >= 0.0);
    }

    #[test]
    fn erf_matches_reference_values() {
        // erf(0.5), erf(1), erf(2) to 7 digits; odd symmetry.
        for (x, want) in [(0.0, 0.0), (0.5, 0.520_499_9), (1.0, 0.842_700_8), (2.0, 0.995_322_3), (-1.0, -0.842_700_8)]
        {
            assert!((erf(x) - want).abs() < 3e-7, "erf({x}) = {} want {want}", erf(x));
        }
    }

    #[test]
    fn gelu_matches_candles_exact_form() {
        let x = Tensor::arange(-600i64, 600, &Device::Cpu).unwrap().to_dtype(candle_core::DType::F32).unwrap();
        let x = (x / 100.0).unwrap();
        let ours: Vec<f32> = x.apply_op1_no_bwd(&GeluErf).unwrap().to_vec1().unwrap();
        let candle: Vec<f32> = x.gelu_erf().unwrap().to_vec1().unwrap();
        let worst = ours.iter().zip(&candle).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-6, "max difference {worst}");
    }

    #[test]
    fn masked_softmax_equals_scaled_softmax_over_the_valid_keys() {
        let scores: Vec<f32> = (0..2 * 3 * 4).map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0).collect();
        let t = Tensor::from_vec(scores.clone(), (2, 1, 3, 4), &Device::Cpu).unwrap();
        let op = MaskedSoftmax { lengths: vec![4, 2], heads: 1, scale: 0.5 };
        let p: Vec<f32> = t.apply_op1_no_bwd(&op).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        for row in 0..6 {
            let valid = if row < 3 { 4 } else { 2 };
            let s = &scores[row * 4..row * 4 + 4];
            let z: f32 = s[..valid].iter().map(|x| (x * 0.5).exp()).sum();
            for k in 0..4 {
                let want = if k < valid { (s[k] * 0.5).exp() / z } else { 0.0 };
                assert!((p[row * 4 + k] - want).abs() < 1e-6, "row {row} key {k}");
            }
        }
    }
}
