//! A CTranslate2 Whisper (`model.bin` and its vocabulary) into whisper.cpp's ggml file:
//! setup converts the bundled tiny.en with it, and the runtime a folder given as `--stt`.
//!
//! No package ships a ggml Whisper, but one ships the CTranslate2 conversion. The layout
//! written here is the one whisper.cpp's loader reads (see its `convert-pt-to-ggml.py`):
//! magic, eleven i32 hyper-parameters, the mel filterbank, the byte-level vocabulary, then
//! each tensor as (n_dims, name length, type, dims innermost first, name, data). The
//! matrices (attention, MLP, token embedding) are written as ggml's Q8_0, the convolutions
//! stay f16, and biases, norms and positional embeddings become f32. On one thread the
//! encoder is most of a turn's transcription; with Q8_0 the test calls' utterances took
//! 0.71-0.93 times as long as with f16 weights, in the same words but for one full stop that became a comma
//! (`sublet-stt`'s `time_utterances` example, runs of each alternated). CTranslate2 fuses the
//! self-attention q/k/v (and the cross-attention k/v) into one matrix; they are split back,
//! and the all-zero key bias (Whisper has none) is dropped.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use half::f16;

/// Bumped whenever the output changes, so setup (and the runtime's cache of converted
/// folders) redoes the conversion.
pub const CONVERTER_VERSION: &str = "2";

/// What a conversion wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Converted {
    pub tensors: usize,
    pub text_tokens: usize,
    pub n_vocab: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
}

/// A CTranslate2 variable: its shape and its raw little-endian data.
struct Variable {
    dims: Vec<usize>,
    dtype: u8,
    data: Vec<u8>,
}

const CT2_F32: u8 = 0;
const CT2_I16: u8 = 2;
const CT2_F16: u8 = 4;

fn read_ct2(path: &Path) -> Result<HashMap<String, Variable>> {
    let mut bytes = Vec::new();
    File::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .read_to_end(&mut bytes)?;
    let mut r = Reader {
        bytes: &bytes,
        at: 0,
    };
    let version = r.u32()?;
    ensure!(
        version >= 5,
        "CTranslate2 model version {version} is not supported (need 5 or later)"
    );
    let spec = r.string()?;
    ensure!(
        spec == "WhisperSpec",
        "{} holds a {spec}, not a Whisper model",
        path.display()
    );
    let _revision = r.u32()?;
    let mut vars = HashMap::new();
    for _ in 0..r.u32()? {
        let name = r.string()?;
        let rank = r.u8()? as usize;
        let dims = (0..rank)
            .map(|_| r.u32().map(|d| d as usize))
            .collect::<Result<Vec<_>>>()?;
        let dtype = r.u8()?;
        let len = r.u32()? as usize;
        let data = r.take(len)?.to_vec();
        vars.insert(name, Variable { dims, dtype, data });
    }
    Ok(vars)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        ensure!(self.at + n <= self.bytes.len(), "model file is truncated");
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    fn string(&mut self) -> Result<String> {
        let n = u16::from_le_bytes(self.take(2)?.try_into()?) as usize;
        Ok(String::from_utf8_lossy(self.take(n)?)
            .trim_end_matches('\0')
            .to_string())
    }
}

/// GPT-2's byte-to-character table, inverted: the vocabulary file spells bytes as characters.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .map(|(b, c)| (char::from_u32(c).expect("valid code point"), b as u8))
        .collect()
}

/// A tensor to write, in PyTorch order (outermost dimension first).
struct Out {
    name: String,
    dims: Vec<usize>,
    values: Values,
}

enum Values {
    F16(Vec<u8>),
    F32(Vec<f32>),
    /// ggml's Q8_0: blocks of 32 values, an f16 scale then 32 signed bytes.
    Q8_0(Vec<u8>),
}

impl Values {
    /// The tensor type whisper.cpp's loader reads (ggml_type).
    fn ggml_type(&self) -> i32 {
        match self {
            Values::F32(_) => 0,
            Values::F16(_) => 1,
            Values::Q8_0(_) => 8,
        }
    }
}

/// The file's ftype: ggml's `GGML_FTYPE_MOSTLY_Q8_0`, which makes whisper.cpp expect its
/// matrices in Q8_0 (and keeps the convolutions f16).
const FTYPE_MOSTLY_Q8_0: i32 = 7;

/// f16 values as Q8_0 blocks, as ggml's reference quantizer makes them: each block's scale
/// is its largest magnitude over 127, each value rounded to the nearest step.
fn quantize_q8_0(f16_bytes: &[u8]) -> Vec<u8> {
    let values: Vec<f32> = f16_bytes
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(scale).to_le_bytes());
        out.extend(block.iter().map(|v| (v * inverse).round() as i8 as u8));
    }
    out
}

/// Converts `model` (CTranslate2's `model.bin`) with its `vocabulary` (`vocabulary.txt`,
/// a token a line, or `vocabulary.json`, a list) and Whisper's 80-bin mel `filters`
/// (`[80][201]`) into a ggml file at `out_path`.
pub fn convert(
    model: &Path,
    vocabulary: &Path,
    filters: &[f32],
    out_path: &Path,
) -> Result<Converted> {
    let vars = read_ct2(model)?;
    let get = |name: &str| {
        vars.get(name)
            .with_context(|| format!("CTranslate2 model has no variable {name}"))
    };
    let scalar = |name: &str| -> Result<i32> {
        let v = get(name)?;
        ensure!(v.dtype == CT2_I16, "{name} is not an int16 scalar");
        Ok(i16::from_le_bytes([v.data[0], v.data[1]]) as i32)
    };
    let layers = |prefix: &str| {
        (0..)
            .take_while(|i| vars.contains_key(&format!("{prefix}/layer_{i}/ffn/linear_0/weight")))
            .count()
    };
    let embeddings = get("decoder/embeddings/weight")?;
    let enc_pos = get("encoder/position_encodings/encodings")?;
    let dec_pos = get("decoder/position_encodings/encodings")?;
    let conv1 = get("encoder/conv1/weight")?;
    let (n_vocab, n_state) = (embeddings.dims[0], embeddings.dims[1]);
    ensure!(
        conv1.dims.get(1) == Some(&80),
        "the model takes {:?} mel bins; the converter has Whisper's 80-bin filterbank only \
         (large-v3 takes 128)",
        conv1.dims.get(1)
    );
    let hparams = [
        n_vocab as i32,
        enc_pos.dims[0] as i32,
        n_state as i32,
        scalar("encoder/num_heads")?,
        layers("encoder") as i32,
        dec_pos.dims[0] as i32,
        n_state as i32,
        scalar("decoder/num_heads")?,
        layers("decoder") as i32,
        conv1.dims[1] as i32,
        FTYPE_MOSTLY_Q8_0,
    ];

    let mut tensors = Vec::new();
    // Rows [from, to) of a 2-D weight or of a 1-D bias.
    let rows = |name: &str, from: usize, to: usize| -> Result<(Vec<usize>, &[u8], u8)> {
        let v = get(name)?;
        let row_len: usize = v.dims[1..].iter().product::<usize>().max(1);
        let width = if v.dtype == CT2_F16 { 2 } else { 4 };
        let mut dims = v.dims.clone();
        dims[0] = to - from;
        Ok((
            dims,
            &v.data[from * row_len * width..to * row_len * width],
            v.dtype,
        ))
    };
    let mut push =
        |name: String, (dims, data, dtype): (Vec<usize>, &[u8], u8), f32_out: bool| -> Result<()> {
            let values = match (dtype, f32_out) {
                (CT2_F16, false) => Values::F16(data.to_vec()),
                (CT2_F16, true) => Values::F32(
                    data.chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                        .collect(),
                ),
                (CT2_F32, true) => Values::F32(
                    data.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                (CT2_F32, false) => Values::F16(
                    data.chunks_exact(4)
                        .flat_map(|b| {
                            f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                                .to_le_bytes()
                        })
                        .collect(),
                ),
                (other, _) => bail!("{name}: unsupported CTranslate2 type {other}"),
            };
            tensors.push(Out { name, dims, values });
            Ok(())
        };
    let whole = |name: &str| -> Result<(Vec<usize>, &[u8], u8)> {
        let v = get(name)?;
        Ok((v.dims.clone(), &v.data[..], v.dtype))
    };
    let conv_bias = |name: &str| -> Result<(Vec<usize>, &[u8], u8)> {
        let v = get(name)?;
        Ok((vec![v.dims[0], 1], &v.data[..], v.dtype))
    };
    let s = n_state;

    push(
        "encoder.positional_embedding".into(),
        whole("encoder/position_encodings/encodings")?,
        true,
    )?;
    push(
        "encoder.conv1.weight".into(),
        whole("encoder/conv1/weight")?,
        false,
    )?;
    push(
        "encoder.conv1.bias".into(),
        conv_bias("encoder/conv1/bias")?,
        true,
    )?;
    push(
        "encoder.conv2.weight".into(),
        whole("encoder/conv2/weight")?,
        false,
    )?;
    push(
        "encoder.conv2.bias".into(),
        conv_bias("encoder/conv2/bias")?,
        true,
    )?;
    for (side, count) in [
        ("encoder", hparams[4] as usize),
        ("decoder", hparams[8] as usize),
    ] {
        for i in 0..count {
            let ct = format!("{side}/layer_{i}");
            let gg = format!("{side}.blocks.{i}");
            let mut norm = |ct_norm: String, gg_norm: String| -> Result<()> {
                push(
                    format!("{gg_norm}.weight"),
                    whole(&format!("{ct_norm}/gamma"))?,
                    true,
                )?;
                push(
                    format!("{gg_norm}.bias"),
                    whole(&format!("{ct_norm}/beta"))?,
                    true,
                )
            };
            norm(
                format!("{ct}/self_attention/layer_norm"),
                format!("{gg}.attn_ln"),
            )?;
            norm(format!("{ct}/ffn/layer_norm"), format!("{gg}.mlp_ln"))?;
            if side == "decoder" {
                norm(
                    format!("{ct}/attention/layer_norm"),
                    format!("{gg}.cross_attn_ln"),
                )?;
            }
            let qkv = format!("{ct}/self_attention/linear_0");
            push(
                format!("{gg}.attn.query.weight"),
                rows(&format!("{qkv}/weight"), 0, s)?,
                false,
            )?;
            push(
                format!("{gg}.attn.query.bias"),
                rows(&format!("{qkv}/bias"), 0, s)?,
                true,
            )?;
            push(
                format!("{gg}.attn.key.weight"),
                rows(&format!("{qkv}/weight"), s, 2 * s)?,
                false,
            )?;
            push(
                format!("{gg}.attn.value.weight"),
                rows(&format!("{qkv}/weight"), 2 * s, 3 * s)?,
                false,
            )?;
            push(
                format!("{gg}.attn.value.bias"),
                rows(&format!("{qkv}/bias"), 2 * s, 3 * s)?,
                true,
            )?;
            push(
                format!("{gg}.attn.out.weight"),
                whole(&format!("{ct}/self_attention/linear_1/weight"))?,
                false,
            )?;
            push(
                format!("{gg}.attn.out.bias"),
                whole(&format!("{ct}/self_attention/linear_1/bias"))?,
                true,
            )?;
            if side == "decoder" {
                let (q, kv, o) = (
                    format!("{ct}/attention/linear_0"),
                    format!("{ct}/attention/linear_1"),
                    format!("{ct}/attention/linear_2"),
                );
                push(
                    format!("{gg}.cross_attn.query.weight"),
                    whole(&format!("{q}/weight"))?,
                    false,
                )?;
                push(
                    format!("{gg}.cross_attn.query.bias"),
                    whole(&format!("{q}/bias"))?,
                    true,
                )?;
                push(
                    format!("{gg}.cross_attn.key.weight"),
                    rows(&format!("{kv}/weight"), 0, s)?,
                    false,
                )?;
                push(
                    format!("{gg}.cross_attn.value.weight"),
                    rows(&format!("{kv}/weight"), s, 2 * s)?,
                    false,
                )?;
                push(
                    format!("{gg}.cross_attn.value.bias"),
                    rows(&format!("{kv}/bias"), s, 2 * s)?,
                    true,
                )?;
                push(
                    format!("{gg}.cross_attn.out.weight"),
                    whole(&format!("{o}/weight"))?,
                    false,
                )?;
                push(
                    format!("{gg}.cross_attn.out.bias"),
                    whole(&format!("{o}/bias"))?,
                    true,
                )?;
            }
            push(
                format!("{gg}.mlp.0.weight"),
                whole(&format!("{ct}/ffn/linear_0/weight"))?,
                false,
            )?;
            push(
                format!("{gg}.mlp.0.bias"),
                whole(&format!("{ct}/ffn/linear_0/bias"))?,
                true,
            )?;
            push(
                format!("{gg}.mlp.2.weight"),
                whole(&format!("{ct}/ffn/linear_1/weight"))?,
                false,
            )?;
            push(
                format!("{gg}.mlp.2.bias"),
                whole(&format!("{ct}/ffn/linear_1/bias"))?,
                true,
            )?;
        }
    }
    push(
        "encoder.ln_post.weight".into(),
        whole("encoder/layer_norm/gamma")?,
        true,
    )?;
    push(
        "encoder.ln_post.bias".into(),
        whole("encoder/layer_norm/beta")?,
        true,
    )?;
    push(
        "decoder.positional_embedding".into(),
        whole("decoder/position_encodings/encodings")?,
        true,
    )?;
    push(
        "decoder.token_embedding.weight".into(),
        whole("decoder/embeddings/weight")?,
        false,
    )?;
    push(
        "decoder.ln.weight".into(),
        whole("decoder/layer_norm/gamma")?,
        true,
    )?;
    push(
        "decoder.ln.bias".into(),
        whole("decoder/layer_norm/beta")?,
        true,
    )?;

    // Every matrix whisper.cpp makes with the file's weight type; the convolutions are
    // 3-D and stay f16.
    for t in tensors.iter_mut() {
        if let (2, Values::F16(bytes)) = (t.dims.len(), &t.values) {
            ensure!(
                t.dims[1] % 32 == 0,
                "{}: rows of {} do not split into Q8_0 blocks",
                t.name,
                t.dims[1]
            );
            t.values = Values::Q8_0(quantize_q8_0(bytes));
        }
    }

    // The text tokens, as bytes; whisper.cpp adds the special tokens itself.
    let table = unicode_to_byte();
    let tokens = read_vocabulary(vocabulary)?;
    let words: Vec<Vec<u8>> = tokens
        .iter()
        .take_while(|w| !w.starts_with("<|"))
        .map(|w| {
            w.chars()
                .map(|c| table.get(&c).copied().unwrap_or(b'?'))
                .collect()
        })
        .collect();
    ensure!(
        words.len() > 50_000,
        "vocabulary has only {} text tokens",
        words.len()
    );

    let mut w = BufWriter::new(
        File::create(out_path).with_context(|| format!("creating {}", out_path.display()))?,
    );
    let i32s = |w: &mut BufWriter<File>, values: &[i32]| -> Result<()> {
        for v in values {
            w.write_all(&v.to_le_bytes())?;
        }
        Ok(())
    };
    w.write_all(&0x6767_6d6c_u32.to_le_bytes())?;
    i32s(&mut w, &hparams)?;
    i32s(&mut w, &[80, 201])?;
    for f in filters {
        w.write_all(&f.to_le_bytes())?;
    }
    i32s(&mut w, &[words.len() as i32])?;
    for word in &words {
        i32s(&mut w, &[word.len() as i32])?;
        w.write_all(word)?;
    }
    for t in &tensors {
        i32s(
            &mut w,
            &[
                t.dims.len() as i32,
                t.name.len() as i32,
                t.values.ggml_type(),
            ],
        )?;
        let reversed: Vec<i32> = t.dims.iter().rev().map(|&d| d as i32).collect();
        i32s(&mut w, &reversed)?;
        w.write_all(t.name.as_bytes())?;
        match &t.values {
            Values::F16(bytes) | Values::Q8_0(bytes) => w.write_all(bytes)?,
            Values::F32(values) => {
                for v in values {
                    w.write_all(&v.to_le_bytes())?;
                }
            }
        }
    }
    w.flush()?;
    Ok(Converted {
        tensors: tensors.len(),
        text_tokens: words.len(),
        n_vocab,
        encoder_layers: hparams[4] as usize,
        decoder_layers: hparams[8] as usize,
    })
}

/// A CTranslate2 vocabulary: `vocabulary.json` (a list of tokens) or `vocabulary.txt`
/// (a token a line).
fn read_vocabulary(path: &Path) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "json") {
        return serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON list of tokens", path.display()));
    }
    Ok(text.lines().map(str::to_string).collect())
}
