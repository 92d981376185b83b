//! Models made where they run: a GGUF of a chosen shape with seeded random weights, and the
//! bundled model's tokenizer and chat template.
//!
//! The GPU machine takes at most 64 MiB of files and cannot download, so the bundled GGUF
//! (96 MB) does not travel: a tokenizer-only GGUF (its metadata, no tensors, ~2 MB) does,
//! and the GPU check makes a model of the size it wants from it. Random weights answer
//! nonsense, but the same nonsense for the same seed and prompt, which is what a check of
//! batching, chunking and scheduling needs; and a model of ~1B parameters shows the GPU's
//! timings at a size where they mean something.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Which of mistral.rs's GGUF models a random model is made for (`general.architecture`).
/// Each ties its output to its embedding (no `output.weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Architecture {
    /// The bundled SmolLM2's.
    #[default]
    Llama,
    /// Biases on the query, key and value projections.
    Qwen2,
    /// An RMS norm on each query and key head.
    Qwen3,
}

impl Architecture {
    /// Its name in a GGUF, and the prefix of its metadata's keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
}

impl std::str::FromStr for Architecture {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            other => Err(format!(
                "unknown architecture {other:?} (llama, qwen2 or qwen3)"
            )),
        }
    }
}

/// The dimensions of a model (of any of the [`Architecture`]s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub hidden: usize,
    pub layers: usize,
    pub feed_forward: usize,
    pub heads: usize,
    pub kv_heads: usize,
}

impl ModelShape {
    /// The bundled SmolLM2-135M's.
    pub const SMOLLM2_135M: Self = Self {
        hidden: 576,
        layers: 30,
        feed_forward: 1536,
        heads: 9,
        kv_heads: 3,
    };
    /// Llama 3.2 1B's (with SmolLM2's 49,152-token vocabulary: ~1.07B parameters).
    pub const ONE_B: Self = Self {
        hidden: 2048,
        layers: 16,
        feed_forward: 8192,
        heads: 32,
        kv_heads: 8,
    };
    /// Small enough for a test on any machine (two layers).
    pub const TINY: Self = Self {
        hidden: 192,
        layers: 2,
        feed_forward: 384,
        heads: 3,
        kv_heads: 1,
    };

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Parameters, with a vocabulary of `vocab` tokens and the embedding tied to the output.
    pub fn parameters(&self, vocab: usize) -> usize {
        let kv = self.kv_heads * self.head_dim();
        let attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv;
        let mlp = 3 * self.hidden * self.feed_forward;
        vocab * self.hidden + self.layers * (attention + mlp + 2 * self.hidden) + self.hidden
    }
}

impl std::str::FromStr for ModelShape {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "135m" => Ok(Self::SMOLLM2_135M),
            "1b" => Ok(Self::ONE_B),
            "tiny" => Ok(Self::TINY),
            other => Err(format!("unknown model size {other:?} (135m, 1b or tiny)")),
        }
    }
}

/// Writes `template`'s metadata with no tensors: its tokenizer and chat template, small
/// enough to carry.
pub fn write_tokenizer_only(template: &Path, out: &Path) -> Result<()> {
    let content = read_metadata(template)?;
    let metadata: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .filter(|(key, _)| key.starts_with("tokenizer.") || key.starts_with("general."))
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    write_gguf(out, &metadata, &[])
}

/// Writes a llama GGUF of `shape` with random weights drawn from `seed` (Q4_1 products and
/// a Q8_0 embedding, as the bundled model's; norms of ones), taking the tokenizer and chat
/// template from `template` (a full or a tokenizer-only GGUF).
pub fn write_random_model(template: &Path, shape: ModelShape, seed: u64, out: &Path) -> Result<()> {
    write_random_model_of(Architecture::Llama, template, shape, seed, out)
}

/// [`write_random_model`] for `arch`: qwen2's projection biases and qwen3's head norms are
/// drawn from `seed` too (after each layer's other weights), so a llama model is the same
/// file whichever function made it.
pub fn write_random_model_of(
    arch: Architecture,
    template: &Path,
    shape: ModelShape,
    seed: u64,
    out: &Path,
) -> Result<()> {
    if !shape.hidden.is_multiple_of(shape.heads) || !shape.heads.is_multiple_of(shape.kv_heads) {
        bail!("{shape:?}: heads must divide the width, and KV heads the heads");
    }
    let content = read_metadata(template)?;
    let vocab = match content.metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(tokens)) => tokens.len(),
        _ => bail!("{} holds no tokenizer", template.display()),
    };
    let u32_value = |v: usize| Value::U32(v as u32);
    // The keys each of mistral.rs's loaders reads, under the architecture's prefix (qwen2's
    // and qwen3's read no `rope.dimension_count` nor `feed_forward_length`: harmless).
    let dims = [
        ("block_count", u32_value(shape.layers)),
        ("context_length", u32_value(8192)),
        ("embedding_length", u32_value(shape.hidden)),
        ("feed_forward_length", u32_value(shape.feed_forward)),
        ("attention.head_count", u32_value(shape.heads)),
        ("attention.head_count_kv", u32_value(shape.kv_heads)),
        ("rope.dimension_count", u32_value(shape.head_dim())),
        ("rope.freq_base", Value::F32(100_000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("vocab_size", u32_value(vocab)),
    ]
    .map(|(key, value)| (format!("{}.{key}", arch.name()), value));
    let model = match arch {
        Architecture::Llama => String::new(),
        other => format!("{}-", other.name()),
    };
    let general = [
        ("general.architecture", Value::String(arch.name().into())),
        (
            "general.name",
            Value::String(format!(
                "random-{model}{}M-seed{seed}",
                shape.parameters(vocab) / 1_000_000
            )),
        ),
    ];
    let mut metadata: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .filter(|(key, _)| key.starts_with("tokenizer."))
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    metadata.extend(dims.iter().map(|(key, value)| (key.as_str(), value)));
    metadata.extend(general.iter().map(|(key, value)| (*key, value)));

    let mut random = SplitMix64(seed);
    let kv = shape.kv_heads * shape.head_dim();
    let (h, f) = (shape.hidden, shape.feed_forward);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    tensors.push((
        "token_embd.weight".into(),
        random.matrix(vocab, h, GgmlDType::Q8_0)?,
    ));
    for layer in 0..shape.layers {
        let name = |part: &str| format!("blk.{layer}.{part}.weight");
        tensors.push((name("attn_norm"), ones(h)?));
        tensors.push((name("attn_q"), random.matrix(h, h, GgmlDType::Q4_1)?));
        tensors.push((name("attn_k"), random.matrix(kv, h, GgmlDType::Q4_1)?));
        tensors.push((name("attn_v"), random.matrix(kv, h, GgmlDType::Q4_1)?));
        tensors.push((name("attn_output"), random.matrix(h, h, GgmlDType::Q4_1)?));
        tensors.push((name("ffn_norm"), ones(h)?));
        tensors.push((name("ffn_gate"), random.matrix(f, h, GgmlDType::Q4_1)?));
        tensors.push((name("ffn_up"), random.matrix(f, h, GgmlDType::Q4_1)?));
        tensors.push((name("ffn_down"), random.matrix(h, f, GgmlDType::Q4_1)?));
        match arch {
            Architecture::Llama => {}
            Architecture::Qwen2 => {
                let bias = |part: &str| format!("blk.{layer}.{part}.bias");
                tensors.push((bias("attn_q"), random.vector(h, 0.0, 0.5)?));
                tensors.push((bias("attn_k"), random.vector(kv, 0.0, 0.5)?));
                tensors.push((bias("attn_v"), random.vector(kv, 0.0, 0.5)?));
            }
            Architecture::Qwen3 => {
                let d = shape.head_dim();
                tensors.push((name("attn_q_norm"), random.vector(d, 1.0, 0.5)?));
                tensors.push((name("attn_k_norm"), random.vector(d, 1.0, 0.5)?));
            }
        }
    }
    tensors.push(("output_norm.weight".into(), ones(h)?));
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write_gguf(out, &metadata, &tensors)
}

fn read_metadata(path: &Path) -> Result<gguf_file::Content> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    gguf_file::Content::read(&mut file).with_context(|| format!("reading {}", path.display()))
}

/// Writes a GGUF, its metadata in key order (a file made twice is the same file).
fn write_gguf(out: &Path, metadata: &[(&str, &Value)], tensors: &[(&str, &QTensor)]) -> Result<()> {
    let mut metadata = metadata.to_vec();
    metadata.sort_by_key(|(key, _)| *key);
    let partial = out.with_extension("gguf.partial");
    let mut file = BufWriter::new(
        std::fs::File::create(&partial)
            .with_context(|| format!("creating {}", partial.display()))?,
    );
    gguf_file::write(&mut file, &metadata, tensors)?;
    file.flush()?;
    drop(file);
    std::fs::rename(&partial, out)?;
    Ok(())
}

fn ones(len: usize) -> Result<QTensor> {
    let t = Tensor::ones(len, candle_core::DType::F32, &Device::Cpu)?;
    Ok(QTensor::quantize(&t, GgmlDType::F32)?)
}

/// A small, seedable generator (SplitMix64): the same seed gives the same model anywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `len` values uniform in `mean ± spread`, unquantized (a bias, a norm's weights).
    fn vector(&mut self, len: usize, mean: f32, spread: f32) -> Result<QTensor> {
        let values: Vec<f32> = (0..len)
            .map(|_| mean + (2.0 * self.unit() - 1.0) * spread)
            .collect();
        let t = Tensor::from_vec(values, len, &Device::Cpu)?;
        Ok(QTensor::quantize(&t, GgmlDType::F32)?)
    }

    /// Uniform in [0, 1), 24 bits of it.
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A `rows × columns` matrix (rows are output features), uniform with the spread of
    /// a trained model's weights (standard deviation ~1/√columns).
    fn matrix(&mut self, rows: usize, columns: usize, dtype: GgmlDType) -> Result<QTensor> {
        let scale = (3.0 / columns as f64).sqrt() as f32;
        let values: Vec<f32> = (0..rows * columns)
            .map(|_| (2.0 * self.unit() - 1.0) * scale)
            .collect();
        let t = Tensor::from_vec(values, (rows, columns), &Device::Cpu)?;
        Ok(QTensor::quantize(&t, dtype)?)
    }
}
