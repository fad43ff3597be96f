//! The kernels against candle's own quantisation and dequantisation (an implementation of the
//! GGUF formats written elsewhere), and the SIMD kernels against the portable ones.

use super::*;
use candle_core::{Device, Tensor};

/// Deterministic values spread like a model's weights and activations (a few large ones).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5;
            if i % 97 == 0 { u * 8.0 } else { u }
        })
        .collect()
}

fn matrix(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> (QMatrix, Vec<f32>) {
    let dense = Tensor::from_vec(values(rows * cols, seed), (rows, cols), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&dense, dtype).unwrap();
    // What the file's blocks stand for, dequantised by candle.
    let exact = qt.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut requantised = 0;
    let m = QMatrix::from_qtensor(qt, "test", &mut requantised).unwrap();
    assert_eq!(requantised, 0);
    (m, exact)
}

/// `x` as the kernels see it: quantised to 8 bits in the form `dtype`'s kernel reads, and back.
fn as_quantised(dtype: GgmlDType, x: &[f32]) -> Vec<f32> {
    if dtype == GgmlDType::Q8_0 {
        let mut q = vec![BlockQ8x32::ZERO; x.len() / 32];
        scalar::quantize_q8x32(x, &mut q);
        q.iter().flat_map(|b| b.qs.map(|v| f32::from(v) * b.d)).collect()
    } else {
        let mut q = vec![BlockQ8K::ZERO; x.len() / QK_K];
        scalar::quantize_q8k(x, &mut q);
        q.iter().flat_map(|b| b.qs.map(|v| f32::from(v) * b.d)).collect()
    }
}

/// `w · x` in f64 with the weights as candle dequantises them and the activations as the kernels
/// quantise them: what the kernels compute, up to the rounding of their f32 arithmetic.
fn reference(dtype: GgmlDType, w: &[f32], x: &[f32], rows: usize, cols: usize, tokens: usize) -> Vec<f32> {
    let x = as_quantised(dtype, x);
    let mut out = vec![0f32; tokens * rows];
    for t in 0..tokens {
        for r in 0..rows {
            out[t * rows + r] =
                (0..cols).map(|c| f64::from(w[r * cols + c]) * f64::from(x[t * cols + c])).sum::<f64>() as f32;
        }
    }
    out
}

fn run(kernels: &Kernels, pool: &WorkerPool, m: &QMatrix, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; tokens * m.rows()];
    let mut scratch = QuantizedActivations::default();
    matmul(pool, kernels, &mut scratch, x, tokens, &mut [(m, &mut out)]);
    out
}

/// The largest error relative to the largest output magnitude.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

#[test]
fn every_format_matches_the_dequantised_product() {
    let pool = WorkerPool::new(2);
    let (rows, cols) = (40, 512);
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0] {
        let (m, w) = matrix(dtype, rows, cols, 7);
        // One token, a few (one-token kernels), and a prompt: four full tiles and a partial one.
        for tokens in [1, 3, 70] {
            let x = values(tokens * cols, 11 + tokens as u64);
            let want = reference(dtype, &w, &x, rows, cols, tokens);
            for kernels in Kernels::available() {
                let got = run(&kernels, &pool, &m, &x, tokens);
                // The integer sums are exact; only f32 rounding of scales and partial sums is
                // left (a block read from the wrong place would be off by the output's size).
                let err = relative_error(&got, &want);
                assert!(err < 1e-4, "{dtype:?} {} {tokens} tokens: error {err}", kernels.name);
            }
        }
    }
}

#[test]
fn the_simd_kernels_compute_what_the_portable_ones_do() {
    let pool = WorkerPool::new(2);
    // 33 rows: passes of four rows end with a partial one.
    let (rows, cols) = (33, 1536);
    // Six tokens: AVX2's four-token kernels and one-token ones, AVX-512's few-token ones;
    // twenty: a full tile and a partial one.
    for tokens in [6, 20] {
        let x = values(tokens * cols, 5);
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0] {
            let (m, _) = matrix(dtype, rows, cols, 3);
            let portable = run(&Kernels::portable(), &pool, &m, &x, tokens);
            for kernels in Kernels::available() {
                let fast = run(&kernels, &pool, &m, &x, tokens);
                // Integer sums are exact in both; only the order of the f32 additions differs.
                let err = relative_error(&fast, &portable);
                assert!(err < 1e-5, "{dtype:?} {} {tokens} tokens: {err}", kernels.name);
            }
        }
    }
}

#[test]
fn simd_quantisation_matches_the_portable_one() {
    let x = values(1024, 9);
    for kernels in Kernels::available() {
        let (mut a, mut b) = (vec![BlockQ8K::ZERO; 4], vec![BlockQ8K::ZERO; 4]);
        (kernels.quantize_q8k)(&x, &mut a);
        scalar::quantize_q8k(&x, &mut b);
        for (a, b) in a.iter().zip(&b) {
            assert_eq!((a.d, a.qs, a.bsums), (b.d, b.qs, b.bsums), "{}", kernels.name);
        }
        // An all-zero block quantises to zeros rather than dividing by zero.
        (kernels.quantize_q8k)(&[0.0; 256], &mut a[..1]);
        assert_eq!((a[0].d, a[0].qs), (0.0, [0; 256]));
    }
}

#[test]
fn this_cpus_fastest_kernels_are_chosen_and_can_be_named() {
    let available = Kernels::available();
    assert_eq!(available.last().map(|k| k.name), Some("portable"));
    assert_eq!(Kernels::detect().name, available[0].name);
    // On x86-64, the AVX-512 VNNI set comes only with the AVX2 one (it uses its quantiser).
    let names: Vec<_> = available.iter().map(|k| k.name).collect();
    if names.contains(&"avx512-vnni") {
        assert_eq!(names, ["avx512-vnni", "avx2", "portable"]);
    }
    // `TOOLGRAPH_KERNELS` picks any of them by name; a name this CPU cannot run, or no set at
    // all, leaves the fastest (with a warning for the unknown name).
    for k in &available {
        assert_eq!(Kernels::choose(&available, Some(k.name)).name, k.name);
    }
    assert_eq!(Kernels::choose(&available, Some("portable ")).name, "portable");
    assert_eq!(Kernels::choose(&available, Some("neon")).name, available[0].name);
    assert_eq!(Kernels::choose(&available, None).name, available[0].name);
}

#[test]
fn outputs_of_one_dispatch_go_to_their_own_matrices() {
    let pool = WorkerPool::new(2);
    let cols = 256;
    let (a, wa) = matrix(GgmlDType::Q4K, 24, cols, 1);
    let (b, wb) = matrix(GgmlDType::Q8_0, 8, cols, 2);
    // Two tokens through the one-token kernels, ten through tiles where the kernels read them.
    for tokens in [2, 10] {
        let x = values(tokens * cols, 4);
        let (mut oa, mut ob) = (vec![0f32; tokens * 24], vec![0f32; tokens * 8]);
        let mut scratch = QuantizedActivations::default();
        matmul(&pool, &Kernels::detect(), &mut scratch, &x, tokens, &mut [(&a, &mut oa), (&b, &mut ob)]);
        assert!(relative_error(&oa, &reference(GgmlDType::Q4K, &wa, &x, 24, cols, tokens)) < 1e-4);
        assert!(relative_error(&ob, &reference(GgmlDType::Q8_0, &wb, &x, 8, cols, tokens)) < 1e-4);
    }
}

#[test]
fn other_formats_are_requantised_to_q8_0() {
    let dense = Tensor::from_vec(values(4 * 64, 1), (4, 64), &Device::Cpu).unwrap();
    let qt = QTensor::quantize(&dense, GgmlDType::Q5_0).unwrap();
    let mut requantised = 0;
    let m = QMatrix::from_qtensor(qt, "t", &mut requantised).unwrap();
    assert_eq!((requantised, m.format(), m.rows(), m.cols()), (1, "Q8_0", 4, 64));
    let not_a_matrix = QTensor::quantize(&Tensor::zeros(32, DType::F32, &Device::Cpu).unwrap(), GgmlDType::Q8_0);
    let err = QMatrix::from_qtensor(not_a_matrix.unwrap(), "bias", &mut requantised).unwrap_err();
    assert!(err.to_string().contains("bias"), "{err}");
}

use candle_core::DType;

#[test]
fn a_tokens_result_does_not_depend_on_the_tokens_computed_with_it() {
    // Tokens go through the group kernels and the one-token kernels alone; the two must agree
    // to the bit, or a prompt computed in pieces (a reused prefix) would differ from the same
    // prompt computed at once.
    // Five, six and seven tokens: AVX2's group of four and a lone one, a group of two, a group
    // of three; AVX-512's few-token kernels (a draft checked after a generated token); twenty:
    // a full tile and a partial one
    // where the kernels read tiles; split 13 + 7, a tile's worth and too few for one.
    // Q8_0 rows of 15 blocks: an odd one, where kernels that take blocks in pairs end alone.
    let pool = WorkerPool::new(2);
    for kernels in Kernels::available() {
        for (dtype, cols) in [(GgmlDType::Q4K, 512), (GgmlDType::Q6K, 512), (GgmlDType::Q8_0, 480)] {
            let (m, _) = matrix(dtype, 24, cols, 21);
            for tokens in [5, 6, 7, 20] {
                let x = values(tokens * cols, 22);
                let together = run(&kernels, &pool, &m, &x, tokens);
                for t in 0..tokens {
                    let alone = run(&kernels, &pool, &m, &x[t * cols..(t + 1) * cols], 1);
                    assert_eq!(alone, together[t * 24..(t + 1) * 24], "{dtype:?} {} token {t}", kernels.name);
                }
                let split = 13.min(tokens);
                let mut pieces = run(&kernels, &pool, &m, &x[..split * cols], split);
                pieces.extend(run(&kernels, &pool, &m, &x[split * cols..], tokens - split));
                assert_eq!(pieces, together, "{dtype:?} {} in two pieces", kernels.name);
            }
        }
    }
}

#[test]
fn a_row_reads_as_candle_dequantises_it() {
    let (rows, cols) = (5, 512);
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0] {
        let (m, exact) = matrix(dtype, rows, cols, 3);
        let mut row = vec![f32::NAN; cols];
        for r in 0..rows {
            m.row_to_f32(r, &mut row);
            let want = &exact[r * cols..(r + 1) * cols];
            // The same products in the same order as candle's: the same floats, bit for bit.
            let differ = row.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{dtype:?} row {r}: {differ} values differ");
        }
    }
}

#[test]
fn the_multiply_rate_is_measured_for_the_simd_sets_only() {
    assert_eq!(Kernels::portable().multiply_adds_per_s(1), None);
    for k in Kernels::available().into_iter().filter(|k| k.name != "portable") {
        let one = k.multiply_adds_per_s(1).unwrap_or_else(|| panic!("{}: no rate", k.name));
        // Any x86-64-v3 core issues billions a second; a step that did no work, or a count
        // that did not follow the rounds, would not.
        assert!(one > 1e9 && one.is_finite(), "{}: {one}", k.name);
    }
}
