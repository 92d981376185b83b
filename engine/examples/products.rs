//! Times the bundled model's weight products alone, per decode step, for 1–8 rows: the
//! part of a step a faster few-row kernel moves.
//!
//! `cargo build --release --workspace --examples`, then `target/release/examples/products
//! [PATH.gguf]` (`-p sublet-engine` would build mistral.rs with other features).

use candle_core::quantized::{gguf_file, QMatMul};
use candle_core::{Device, Module, Tensor};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        let models = std::env::var("SUBLET_MODELS").unwrap_or_else(|_| "models".into());
        format!("{models}/llm/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    let mut file = std::fs::File::open(&path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut products = Vec::new();
    for (name, info) in &content.tensor_infos {
        // The token embedding is also the output head (tied), so every matrix is a product.
        if info.shape.rank() != 2 {
            continue;
        }
        let tensor = content.tensor(&mut file, name, &Device::Cpu)?;
        let k = tensor.shape().dims()[1];
        products.push((QMatMul::from_qtensor(tensor)?, k));
    }
    println!("{} products", products.len());
    let only: Option<usize> = std::env::var("ROWS").ok().and_then(|v| v.parse().ok());
    for rows in [1usize, 2, 3, 4, 8] {
        if only.is_some_and(|only| only != rows) {
            continue;
        }
        let inputs: Vec<Tensor> = products
            .iter()
            .map(|(_, k)| Tensor::randn(0f32, 1.0, (rows, *k), &Device::Cpu))
            .collect::<candle_core::Result<_>>()?;
        let mut best = f64::MAX;
        for _ in 0..30 {
            let start = Instant::now();
            for ((product, _), x) in products.iter().zip(&inputs) {
                std::hint::black_box(product.forward(x)?);
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!("{rows} rows: {:.2} ms a step (best of 30)", best * 1e3);
    }
    Ok(())
}
