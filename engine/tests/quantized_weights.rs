//! The quantized weights' matrix products (candle patch 2): f32 activations times
//! Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K weights give the dequantized-f32 product, for one row (a
//! decode step), a few rows (a pass of a few sequences), a prompt chunk's (tiles, up to 256
//! rows) and more (a long prompt, dequantized). Stock candle rounds the activations to 8
//! bits, which misses these bounds by orders of magnitude.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Deterministic values in [-1, 1).
fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Each type the tiles take, with a row length it splits into: the legacy types' blocks are
/// 32 weights, the K-quants' 256 (576 is SmolLM2's width; 1536 splits into both).
const TYPES: [(GgmlDType, usize); 6] = [
    (GgmlDType::Q4_0, 576),
    (GgmlDType::Q4_1, 576),
    (GgmlDType::Q5_0, 576),
    (GgmlDType::Q8_0, 576),
    (GgmlDType::Q4K, 1536),
    (GgmlDType::Q6K, 1536),
];

#[test]
fn quantized_products_equal_the_dequantized_f32_products() -> candle_core::Result<()> {
    let n = 200;
    for (dtype, k) in TYPES {
        let weights = Tensor::from_vec(values(n * k, 1), (n, k), &Device::Cpu)?;
        let quantized = QTensor::quantize(&weights, dtype)?;
        let dequantized = quantized.dequantize(&Device::Cpu)?;
        for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 40, 256, 257] {
            let xs = Tensor::from_vec(values(m * k, m as u64 + 7), (1, m, k), &Device::Cpu)?;
            let got = xs.apply_op1_no_bwd(&quantized)?;
            let want = xs.broadcast_matmul(&dequantized.t()?)?;
            assert_eq!(got.dims(), &[1, m, n]);
            let got = got.flatten_all()?.to_vec1::<f32>()?;
            let want = want.flatten_all()?.to_vec1::<f32>()?;
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(
                worst <= 1e-5 * scale,
                "{dtype:?}, {m} rows: off by {worst} (largest value {scale})"
            );
        }
    }
    Ok(())
}

/// The tiles read a block's f16 scales from a table of every f16's value (candle patch 2):
/// rows of every magnitude, whose blocks' scales are zero, subnormal, normal and large f16s,
/// give each row's dequantized product to within that row's own scale.
#[test]
fn scales_of_every_magnitude_are_read_exactly() -> candle_core::Result<()> {
    let magnitudes = [0.0, 1e-9, 3e-7, 2e-5, 1e-3, 1.0, 300.0];
    let n = 3 * magnitudes.len();
    for (dtype, k) in TYPES {
        let mut rows = values(n * k, 5);
        for (row, chunk) in rows.chunks_mut(k).enumerate() {
            chunk
                .iter_mut()
                .for_each(|v| *v *= magnitudes[row % magnitudes.len()]);
        }
        let weights = Tensor::from_vec(rows, (n, k), &Device::Cpu)?;
        let quantized = QTensor::quantize(&weights, dtype)?;
        let dequantized = quantized.dequantize(&Device::Cpu)?;
        for m in [1, 4] {
            let xs = Tensor::from_vec(values(m * k, 9), (1, m, k), &Device::Cpu)?;
            let got = xs
                .apply_op1_no_bwd(&quantized)?
                .squeeze(0)?
                .to_vec2::<f32>()?;
            let want = xs
                .broadcast_matmul(&dequantized.t()?)?
                .squeeze(0)?
                .to_vec2::<f32>()?;
            for (got, want) in got.iter().zip(&want) {
                for (column, (g, w)) in got.iter().zip(want).enumerate() {
                    let scale = magnitudes[column % magnitudes.len()] * k as f32;
                    assert!(
                        (g - w).abs() <= 1e-5 * scale,
                        "{dtype:?}, {m} rows, weights of {}: {g} against {w}",
                        magnitudes[column % magnitudes.len()]
                    );
                }
            }
        }
    }
    Ok(())
}

/// Every tile (AVX-512's and AVX2's alike) sums a product in the same order, so a
/// sequence's logits do not depend on how many others share its decode pass (what lets a
/// batched greedy decode match the sequence decoded alone), nor a prompt's on how it was
/// cut into chunks of up to 256 tokens.
#[test]
fn a_rows_product_does_not_depend_on_the_rows_beside_it() -> candle_core::Result<()> {
    if !is_x86_feature_detected!("avx2") {
        eprintln!("no AVX2 here: candle's own kernels, which round the activations per row");
        return Ok(());
    }
    let n = 202;
    for (dtype, k) in TYPES {
        let weights = Tensor::from_vec(values(n * k, 3), (n, k), &Device::Cpu)?;
        let quantized = QTensor::quantize(&weights, dtype)?;
        let all = Tensor::from_vec(values(40 * k, 11), (1, 40, k), &Device::Cpu)?;
        let alone: Vec<Vec<f32>> = (0..40)
            .map(|r| {
                let row = all.narrow(1, r, 1)?.contiguous()?;
                row.apply_op1_no_bwd(&quantized)?
                    .flatten_all()?
                    .to_vec1::<f32>()
            })
            .collect::<candle_core::Result<_>>()?;
        for m in (2..=17).chain([24, 40]) {
            let rows = all.narrow(1, 0, m)?.contiguous()?;
            let together = rows
                .apply_op1_no_bwd(&quantized)?
                .squeeze(0)?
                .to_vec2::<f32>()?;
            for (r, got) in together.iter().enumerate() {
                assert!(
                    got == &alone[r],
                    "{dtype:?}: row {r} of {m} differs from alone"
                );
            }
        }
    }
    Ok(())
}
