//! A Whisper model a user brings (`--stt`): a whisper.cpp ggml file, walked and loaded
//! before any call so that a cut-short or corrupt file is refused at start; or a
//! CTranslate2 Whisper folder, converted once into the model cache by the project's
//! converter (`sublet_models::whisper_ggml`) and used from there after.

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use sublet_models::whisper_ggml::{convert, CONVERTER_VERSION};
use sublet_models::ModelCache;

use crate::SpeechModel;

/// whisper.cpp's file magic, `ggml`, as its loader reads it (little-endian u32).
const GGML_MAGIC: u32 = 0x6767_6d6c;

/// The ggml file for `given`: itself once checked, or a CTranslate2 folder's conversion
/// (made on first use). Errors say what is wrong, for the user.
pub fn prepare_model(given: &Path, cache: &ModelCache) -> Result<PathBuf, String> {
    let ggml = if given.is_dir() {
        converted(given, cache)?
    } else if given.is_file() {
        given.to_path_buf()
    } else {
        return Err("no such file or folder".into());
    };
    check_ggml(&ggml)?;
    SpeechModel::from_file(&ggml).map_err(|e| format!("whisper.cpp cannot load it: {e:#}"))?;
    Ok(ggml)
}

/// A CTranslate2 folder's conversion in the cache, made now if it is not there yet.
fn converted(folder: &Path, cache: &ModelCache) -> Result<PathBuf, String> {
    let model = folder.join("model.bin");
    let vocabulary = ["vocabulary.json", "vocabulary.txt"]
        .map(|name| folder.join(name))
        .into_iter()
        .find(|p| p.is_file());
    let (true, Some(vocabulary)) = (model.is_file(), vocabulary) else {
        return Err(
            "a folder must be a CTranslate2 Whisper (model.bin with vocabulary.json or \
             vocabulary.txt)"
                .into(),
        );
    };
    let meta = std::fs::metadata(&model).map_err(|e| e.to_string())?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let key = fnv1a(
        format!(
            "{}|{}|{modified}|{CONVERTER_VERSION}",
            model.display(),
            meta.len()
        )
        .as_bytes(),
    );
    let name = folder
        .file_name()
        .map_or("whisper".into(), |n| n.to_string_lossy().into_owned());
    let out = cache.path(&format!("stt/converted/{name}-{key:016x}.bin"));
    if out.is_file() {
        return Ok(out);
    }
    let filters = read_filters(cache)?;
    std::fs::create_dir_all(out.parent().expect("in the cache")).map_err(|e| e.to_string())?;
    let partial = out.with_extension("partial");
    tracing::info!("converting {} into {}", folder.display(), out.display());
    convert(&model, &vocabulary, &filters, &partial).map_err(|e| {
        std::fs::remove_file(&partial).ok();
        format!("converting the CTranslate2 model: {e:#}")
    })?;
    std::fs::rename(&partial, &out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Whisper's 80-bin mel filterbank, which setup writes into the cache.
fn read_filters(cache: &ModelCache) -> Result<Vec<f32>, String> {
    let path = cache.mel_filters().map_err(|e| e.to_string())?;
    let raw = std::fs::read(&path).map_err(|e| e.to_string())?;
    Ok(raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// FNV-1a, 64 bits: a cache key that stays the same across builds.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Walks a whisper.cpp file (magic, hyper-parameters, mel filters, vocabulary, every
/// tensor) checking each length against the file's size, so that whisper.cpp, which
/// trusts them, is never handed a cut-short or corrupt file.
pub fn check_ggml(path: &Path) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut walk = Walk {
        reader: BufReader::with_capacity(1 << 20, file),
        left: len,
    };
    let magic = walk
        .i32()
        .map_err(|_| "not a whisper.cpp ggml file".to_string())? as u32;
    if magic != GGML_MAGIC {
        return Err("not a whisper.cpp ggml file (no ggml magic at its start)".into());
    }
    let mut hparams = [0i32; 11];
    for h in hparams.iter_mut() {
        *h = walk.i32()?;
    }
    let [n_vocab, _, n_audio_state, _, n_audio_layer, _, _, _, n_text_layer, n_mels, _] = hparams;
    if !(1..=1_000_000).contains(&n_vocab)
        || !(1..=100_000).contains(&n_audio_state)
        || !(1..=1_000).contains(&n_audio_layer)
        || !(1..=1_000).contains(&n_text_layer)
        || !(1..=1_000).contains(&n_mels)
    {
        return Err(format!("corrupt hyper-parameters {hparams:?}"));
    }
    let (filter_mels, filter_fft) = (walk.i32()?, walk.i32()?);
    walk.skip(4 * (filter_mels.max(0) as u64) * (filter_fft.max(0) as u64))?;
    let words = walk.i32()?;
    for _ in 0..words.max(0) {
        let n = walk.i32()?;
        walk.skip(n.max(0) as u64)?;
    }
    let mut tensors = 0;
    while walk.left > 0 {
        let (dims, name_len, kind) = (walk.i32()?, walk.i32()?, walk.i32()?);
        if !(1..=4).contains(&dims) || !(1..=256).contains(&name_len) {
            return Err(format!("corrupt tensor header after {tensors} tensors"));
        }
        let mut elements = 1u64;
        for _ in 0..dims {
            elements = elements.saturating_mul(walk.i32()?.max(0) as u64);
        }
        walk.skip(name_len as u64)?;
        let Some((block, bytes)) = ggml_type_size(kind) else {
            return Err(format!(
                "tensor {tensors} has ggml type {kind}, not one whisper.cpp reads"
            ));
        };
        walk.skip(elements.div_ceil(block).saturating_mul(bytes))?;
        tensors += 1;
    }
    if tensors == 0 {
        return Err("it holds no tensors".into());
    }
    Ok(())
}

/// (elements per block, bytes per block) of the ggml types whisper.cpp files hold.
fn ggml_type_size(kind: i32) -> Option<(u64, u64)> {
    Some(match kind {
        0 => (1, 4),
        1 => (1, 2),
        2 => (32, 18),
        3 => (32, 20),
        6 => (32, 22),
        7 => (32, 24),
        8 => (32, 34),
        _ => return None,
    })
}

struct Walk {
    reader: BufReader<std::fs::File>,
    left: u64,
}

impl Walk {
    fn i32(&mut self) -> Result<i32, String> {
        if self.left < 4 {
            return Err("cut short".into());
        }
        let mut b = [0u8; 4];
        self.reader.read_exact(&mut b).map_err(|e| e.to_string())?;
        self.left -= 4;
        Ok(i32::from_le_bytes(b))
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        if n > self.left {
            return Err(format!(
                "cut short: {n} more bytes needed, {} left",
                self.left
            ));
        }
        std::io::copy(&mut (&mut self.reader).take(n), &mut std::io::sink())
            .map_err(|e| e.to_string())?;
        self.left -= n;
        Ok(())
    }
}
