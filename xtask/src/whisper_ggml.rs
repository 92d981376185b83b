//! The bundled Whisper tiny.en, converted from its CTranslate2 weights into whisper.cpp's
//! ggml file by the converter in `sublet-models` (which the runtime also runs on a
//! CTranslate2 folder given as `--stt`), and Whisper's mel filterbank for it.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use sublet_models::whisper_ggml::{convert, CONVERTER_VERSION};
use sublet_models::{ModelCache, MEL_FILTERS_F32, WHISPER_GGML};

pub fn ensure_converted(cache: &ModelCache) -> Result<()> {
    let out = cache.path(WHISPER_GGML);
    let stamp = out.with_extension("version");
    if out.is_file()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s == CONVERTER_VERSION)
        && cache.path(MEL_FILTERS_F32).is_file()
    {
        eprintln!("setup: {WHISPER_GGML} ok");
        return Ok(());
    }
    eprintln!("setup: converting Whisper tiny.en (CTranslate2) into {WHISPER_GGML}");
    let filters = read_mel_filters(&cache.path("stt/mel_filters.npz"))?;
    let raw: Vec<u8> = filters.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(cache.path(MEL_FILTERS_F32), raw)?;
    let partial = out.with_extension("partial");
    let done = convert(
        &cache.path("stt/ct2-tiny.en/model.bin"),
        &cache.path("stt/ct2-tiny.en/vocabulary.txt"),
        &filters,
        &partial,
    )?;
    eprintln!(
        "setup: wrote {} tensors, {} text tokens (vocab {}, {} + {} layers)",
        done.tensors, done.text_tokens, done.n_vocab, done.encoder_layers, done.decoder_layers
    );
    std::fs::rename(&partial, &out)?;
    std::fs::write(stamp, CONVERTER_VERSION)?;
    Ok(())
}

/// Whisper's 80-bin filterbank, `[80][201]`, from `mel_filters.npz` (a zip of `.npy`).
pub fn read_mel_filters(npz: &Path) -> Result<Vec<f32>> {
    let mut zip = zip::ZipArchive::new(
        File::open(npz).with_context(|| format!("opening {}", npz.display()))?,
    )?;
    let mut npy = Vec::new();
    zip.by_name("mel_80.npy")?.read_to_end(&mut npy)?;
    ensure!(
        npy.starts_with(b"\x93NUMPY"),
        "mel_80.npy is not a .npy array"
    );
    let header_len = u16::from_le_bytes([npy[8], npy[9]]) as usize;
    let header = String::from_utf8_lossy(&npy[10..10 + header_len]);
    ensure!(
        header.contains("'<f4'")
            && header.contains("(80, 201)")
            && header.contains("'fortran_order': False"),
        "unexpected mel filter layout: {header}"
    );
    let data = &npy[10 + header_len..];
    ensure!(
        data.len() == 80 * 201 * 4,
        "mel_80.npy holds {} bytes, expected {}",
        data.len(),
        80 * 201 * 4
    );
    Ok(data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
