//! The WAV reader against hostile input, property-tested: any bytes, and a valid file with
//! any header field rewritten, give audio or a clear error, never a panic, and the audio
//! they give is bounded by the file.

use proptest::prelude::*;
use sublet_audio::{wav_from_bytes, write_wav, Audio, AudioError, WAV_RATES};

/// A valid 16-bit mono WAV of `samples` samples at 16 kHz, as bytes.
fn valid_wav(samples: usize) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("sublet-wav-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("valid-{samples}.wav"));
    let tone = (0..samples)
        .map(|i| ((i as f32) * 0.05).sin() * 0.5)
        .collect();
    write_wav(&path, &Audio::new(tone, 16_000)).unwrap();
    std::fs::read(&path).unwrap()
}

/// What any decoded audio must be, from `bytes` of input.
fn check(result: Result<Audio, AudioError>, bytes: usize) -> Result<(), TestCaseError> {
    match result {
        Ok(audio) => {
            prop_assert!(WAV_RATES.contains(&audio.rate), "rate {}", audio.rate);
            // At least a byte a sample in the file (8-bit mono is the densest).
            prop_assert!(
                audio.samples.len() <= bytes,
                "{} samples",
                audio.samples.len()
            );
            prop_assert!(audio.samples.iter().all(|s| s.is_finite()));
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_are_audio_or_a_clear_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let len = bytes.len();
        check(wav_from_bytes(bytes, "fuzz"), len)?;
    }

    #[test]
    fn a_header_field_rewritten_is_audio_or_a_clear_error(
        at in 0usize..44,
        value in prop_oneof![
            any::<u32>(),
            Just(0u32),
            Just(u32::MAX),
            Just(0xFFFE_0001), // WAVE_FORMAT_EXTENSIBLE, one channel
            (0u32..128).prop_map(|bits| bits << 16 | 1), // bits a sample, block align
        ],
        width in prop_oneof![Just(2usize), Just(4usize)],
        samples in 0usize..400,
    ) {
        let mut bytes = valid_wav(samples);
        let end = (at + width).min(bytes.len());
        let value = value.to_le_bytes();
        bytes[at..end].copy_from_slice(&value[..end - at]);
        let len = bytes.len();
        check(wav_from_bytes(bytes, "fuzz"), len)?;
    }

    #[test]
    fn an_extensible_header_with_any_bits_is_audio_or_a_clear_error(
        container in 0u16..80,
        valid in 0u16..200,
        channels in 0u16..4,
    ) {
        // fmt chunk of WAVE_FORMAT_EXTENSIBLE (40 bytes) with PCM's sub-format GUID.
        let block = (container / 8).max(1) * channels.max(1);
        let mut fmt = Vec::new();
        fmt.extend_from_slice(&0xFFFEu16.to_le_bytes());
        fmt.extend_from_slice(&channels.to_le_bytes());
        fmt.extend_from_slice(&16_000u32.to_le_bytes());
        fmt.extend_from_slice(&(16_000 * block as u32).to_le_bytes());
        fmt.extend_from_slice(&block.to_le_bytes());
        fmt.extend_from_slice(&container.to_le_bytes());
        fmt.extend_from_slice(&22u16.to_le_bytes());
        fmt.extend_from_slice(&valid.to_le_bytes());
        fmt.extend_from_slice(&0u32.to_le_bytes());
        fmt.extend_from_slice(&[
            0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38,
            0x9B, 0x71,
        ]);
        let data = vec![0x11u8; 64];
        let mut bytes = b"RIFF".to_vec();
        bytes.extend_from_slice(&(4 + 8 + fmt.len() as u32 + 8 + data.len() as u32).to_le_bytes());
        bytes.extend_from_slice(b"WAVEfmt ");
        bytes.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&fmt);
        bytes.extend_from_slice(b"data");
        bytes.extend_from_slice(&(data.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&data);
        let len = bytes.len();
        check(wav_from_bytes(bytes, "fuzz"), len)?;
    }
}
