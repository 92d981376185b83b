//! Times a model's weight products alone, per decode step, for 1–8 rows, each block type
//! apart: the part of a step a faster few-row kernel moves.
//!
//! `cargo build --release --workspace --examples`, then `target/release/examples/products
//! [PATH.gguf]` (`-p sublet-engine` would build mistral.rs with other features); `ROWS=N`
//! times N rows only.

use candle_core::quantized::{gguf_file, QMatMul};
use candle_core::{Device, Module, Tensor};
use std::collections::BTreeMap;
use std::time::Instant;

/// A block type's products: each weight matrix with its row length, and its weights.
#[derive(Default)]
struct Products {
    matrices: Vec<(QMatMul, usize)>,
    weights: usize,
}

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        let models = std::env::var("SUBLET_MODELS").unwrap_or_else(|_| "models".into());
        format!("{models}/llm/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    // The token embedding is a product only where it is also the output head (tied).
    let tied = !content.tensor_infos.contains_key("output.weight");
    let mut types: BTreeMap<String, Products> = BTreeMap::new();
    for (name, info) in &content.tensor_infos {
        if info.shape.rank() != 2 || (name == "token_embd.weight" && !tied) {
            continue;
        }
        let tensor = content.tensor(&mut file, name, &Device::Cpu)?;
        let k = tensor.shape().dims()[1];
        let products = types.entry(format!("{:?}", tensor.dtype())).or_default();
        products.weights += tensor.shape().elem_count();
        products.matrices.push((QMatMul::from_qtensor(tensor)?, k));
    }
    let only: Option<usize> = std::env::var("ROWS").ok().and_then(|v| v.parse().ok());
    for rows in [1usize, 2, 3, 4, 8] {
        if only.is_some_and(|only| only != rows) {
            continue;
        }
        let mut step = 0.0;
        for (dtype, products) in &types {
            let inputs: Vec<Tensor> = products
                .matrices
                .iter()
                .map(|(_, k)| Tensor::randn(0f32, 1.0, (rows, *k), &Device::Cpu))
                .collect::<candle_core::Result<_>>()?;
            let mut best = f64::MAX;
            for _ in 0..30 {
                let start = Instant::now();
                for ((product, _), x) in products.matrices.iter().zip(&inputs) {
                    std::hint::black_box(product.forward(x)?);
                }
                best = best.min(start.elapsed().as_secs_f64());
            }
            step += best;
            println!(
                "  {dtype}: {} products, {:.1} M weights, {:.2} ms ({:.1} G weights/s)",
                products.matrices.len(),
                products.weights as f64 / 1e6,
                best * 1e3,
                products.weights as f64 / best / 1e9
            );
        }
        println!(
            "{rows} rows: {:.2} ms a step (each type's best of 30)",
            step * 1e3
        );
    }
    Ok(())
}
