//! Audio plumbing shared by every stage: reading any WAV into mono samples, writing WAV,
//! and changing the sample rate.
//!
//! Samples are `f32` in [-1, 1], mono. Speech models run at [`SPEECH_RATE`]; the voice
//! speaks at its own rate and the transport resamples to whatever it needs.

use std::path::Path;

#[cfg(feature = "devices")]
pub mod device;

use rubato::{FftFixedIn, Resampler};

/// The rate the VAD, the end-of-turn model and Whisper all expect.
pub const SPEECH_RATE: u32 = 16_000;

/// Mono audio at a known rate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Audio {
    pub samples: Vec<f32>,
    pub rate: u32,
}

impl Audio {
    pub fn new(samples: Vec<f32>, rate: u32) -> Self {
        Self { samples, rate }
    }

    pub fn silence(seconds: f64, rate: u32) -> Self {
        Self::new(vec![0.0; (seconds * rate as f64).round() as usize], rate)
    }

    pub fn duration_s(&self) -> f64 {
        self.samples.len() as f64 / self.rate as f64
    }

    /// The same audio at another rate.
    pub fn resampled(&self, rate: u32) -> Audio {
        Audio::new(resample(&self.samples, self.rate, rate), rate)
    }

    /// The audio from its first to its last sample louder than `threshold` (a synthesized
    /// utterance without the silence around it).
    pub fn trimmed(&self, threshold: f32) -> Audio {
        let loud = |s: &f32| s.abs() > threshold;
        let first = self.samples.iter().position(loud).unwrap_or(0);
        let last = self
            .samples
            .iter()
            .rposition(loud)
            .map_or(self.samples.len(), |i| i + 1);
        Audio::new(self.samples[first..last.max(first)].to_vec(), self.rate)
    }
}

/// Why a file could not be read as audio.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("{path}: not a readable WAV file ({reason})")]
    NotWav { path: String, reason: String },
    #[error("{path}: WAV has no audio frames")]
    Empty { path: String },
    #[error("{path}: cannot write WAV ({reason})")]
    Write { path: String, reason: String },
}

/// The sample rates a WAV may declare: telephony's 8 kHz and below down to 1 kHz, studio
/// rates up to 384 kHz. A header can claim any 32-bit rate, and resampling from billions of
/// hertz asks for gigabytes.
pub const WAV_RATES: std::ops::RangeInclusive<u32> = 1_000..=384_000;

/// The largest WAV file read: its samples are held as f32 (up to four times its size, and
/// once more mixed down), and a recorded call of hours is far smaller.
pub const MAX_WAV_BYTES: u64 = 512 << 20;

/// The longest WAV read, in seconds: a small file at a low rate (8-bit, 1 kHz) can hold
/// days, which resampled for speech would take tens of gigabytes; a recorded call of two
/// hours takes ~460 MB at 16 kHz.
pub const MAX_WAV_SECONDS: u32 = 2 * 60 * 60;

/// Reads a WAV file of any rate in [`WAV_RATES`], channel count and sample format
/// (8/16/24/32-bit integer or 32-bit float), mixed down to mono. A WAV written as a stream
/// (its data length left at 0xFFFFFFFF), or cut short, is read to the end of the file.
/// Files over [`MAX_WAV_BYTES`] or [`MAX_WAV_SECONDS`] are refused.
pub fn read_wav(path: impl AsRef<Path>) -> Result<Audio, AudioError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let not_wav = |reason: String| AudioError::NotWav {
        path: shown.clone(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| not_wav(e.to_string()))?
        .len();
    if size > MAX_WAV_BYTES {
        return Err(not_wav(format!(
            "{} MiB; WAV files over {} MiB are refused",
            size >> 20,
            MAX_WAV_BYTES >> 20
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| not_wav(e.to_string()))?;
    wav_from_bytes(bytes, &shown)
}

/// Decodes a WAV file's bytes as [`read_wav`] does; `shown` names it in errors.
pub fn wav_from_bytes(bytes: Vec<u8>, shown: &str) -> Result<Audio, AudioError> {
    let not_wav = |reason: String| AudioError::NotWav {
        path: shown.to_owned(),
        reason,
    };
    let reader = hound::WavReader::new(std::io::Cursor::new(data_to_end_of_file(bytes)))
        .map_err(|e| not_wav(e.to_string()))?;
    let spec = reader.spec();
    if spec.channels == 0 {
        return Err(not_wav("zero channels".into()));
    }
    if !WAV_RATES.contains(&spec.sample_rate) {
        return Err(not_wav(format!(
            "a sample rate of {} Hz is outside {}-{} Hz",
            spec.sample_rate,
            WAV_RATES.start(),
            WAV_RATES.end()
        )));
    }
    let bits_served = match spec.sample_format {
        hound::SampleFormat::Int => (1..=32).contains(&spec.bits_per_sample),
        hound::SampleFormat::Float => spec.bits_per_sample == 32,
    };
    if !bits_served {
        return Err(not_wav(format!(
            "{} bits a sample of {:?} is not served",
            spec.bits_per_sample, spec.sample_format
        )));
    }
    let seconds = reader.duration() / spec.sample_rate;
    if seconds > MAX_WAV_SECONDS {
        return Err(not_wav(format!(
            "{seconds} s long; WAV files over {MAX_WAV_SECONDS} s are refused"
        )));
    }
    let interleaved: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .into_samples::<f32>()
            .collect::<Result<_, _>>()
            .map_err(|e| not_wav(e.to_string()))?,
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f32;
            reader
                .into_samples::<i32>()
                .map(|s| s.map(|v| v as f32 * scale))
                .collect::<Result<_, _>>()
                .map_err(|e| not_wav(e.to_string()))?
        }
    };
    let channels = spec.channels as usize;
    if interleaved.len() < channels {
        return Err(AudioError::Empty {
            path: shown.to_owned(),
        });
    }
    let samples = interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() / channels as f32)
        .collect();
    Ok(Audio::new(samples, spec.sample_rate))
}

/// `bytes` of a RIFF WAVE file with its data chunk's length set to what the file holds
/// (whole frames) when it declares 0xFFFFFFFF (a stream's header, written before its
/// length was known) or more than the file holds. Anything else is returned as it is.
fn data_to_end_of_file(mut bytes: Vec<u8>) -> Vec<u8> {
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return bytes;
    }
    let (mut at, mut frame_bytes) = (12usize, None);
    while at + 8 <= bytes.len() {
        let (id, declared, body) = (&bytes[at..at + 4], u32_at(&bytes, at + 4), at + 8);
        if id == b"fmt " && body + 14 <= bytes.len() {
            frame_bytes = Some(u16::from_le_bytes([bytes[body + 12], bytes[body + 13]]).max(1));
        }
        if id == b"data" {
            let present = bytes.len() - body;
            if let (Some(frame), true) = (
                frame_bytes,
                declared == u32::MAX || declared as usize > present,
            ) {
                let whole = present - present % frame as usize;
                let length = u32::try_from(whole).unwrap_or(u32::MAX - u32::MAX % frame as u32);
                bytes[at + 4..at + 8].copy_from_slice(&length.to_le_bytes());
                let riff = u32::try_from(body - 8 + length as usize).unwrap_or(u32::MAX);
                bytes[4..8].copy_from_slice(&riff.to_le_bytes());
            }
            break;
        }
        at = body.saturating_add(declared as usize + (declared as usize & 1));
    }
    bytes
}

/// Writes mono 16-bit PCM.
pub fn write_wav(path: impl AsRef<Path>, audio: &Audio) -> Result<(), AudioError> {
    let path = path.as_ref();
    let write_err = |e: hound::Error| AudioError::Write {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: audio.rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(path, spec).map_err(write_err)?;
    for &s in &audio.samples {
        let v = (s.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16;
        writer.write_sample(v).map_err(write_err)?;
    }
    writer.finalize().map_err(write_err)
}

/// Changes the sample rate of a whole buffer (band-limited, FFT based), keeping its
/// duration: the output has `len * to / from` samples, aligned with the input.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || samples.is_empty() {
        return samples.to_vec();
    }
    const CHUNK: usize = 1024;
    let mut resampler = FftFixedIn::<f32>::new(from as usize, to as usize, CHUNK, 2, 1)
        .expect("sample rates are positive");
    let expected = (samples.len() as u64 * to as u64 / from as u64) as usize;
    let delay = resampler.output_delay();
    let mut out = Vec::with_capacity(expected + delay + CHUNK);
    let mut rest = samples;
    // After the input runs out, zeros push the delayed tail through.
    while out.len() < expected + delay {
        let need = resampler.input_frames_next();
        let take = need.min(rest.len());
        let mut chunk = rest[..take].to_vec();
        chunk.resize(need, 0.0);
        rest = &rest[take..];
        let produced = resampler
            .process(&[chunk], None)
            .expect("one channel in, one out");
        out.extend_from_slice(&produced[0]);
    }
    out.drain(..delay.min(out.len()));
    out.truncate(expected);
    out
}

/// Changes the sample rate of a stream that arrives in pieces (a call's 20 ms packets):
/// the same band-limited resampling as [`resample`], keeping its state between pieces.
pub struct StreamResampler {
    resampler: Option<FftFixedIn<f32>>,
    pending: Vec<f32>,
    delay_left: usize,
}

impl StreamResampler {
    pub fn new(from: u32, to: u32) -> Self {
        let resampler = (from != to).then(|| {
            FftFixedIn::<f32>::new(from as usize, to as usize, 480, 2, 1)
                .expect("sample rates are positive")
        });
        let delay_left = resampler.as_ref().map_or(0, |r| r.output_delay());
        Self {
            resampler,
            pending: Vec::new(),
            delay_left,
        }
    }

    /// Takes the next piece; returns what can be output so far.
    pub fn push(&mut self, samples: &[f32]) -> Vec<f32> {
        let Some(resampler) = &mut self.resampler else {
            return samples.to_vec();
        };
        self.pending.extend_from_slice(samples);
        let mut out = Vec::new();
        while self.pending.len() >= resampler.input_frames_next() {
            let need = resampler.input_frames_next();
            let chunk: Vec<f32> = self.pending.drain(..need).collect();
            let produced = resampler
                .process(&[chunk], None)
                .expect("one channel in, one out");
            out.extend_from_slice(&produced[0]);
        }
        let skip = self.delay_left.min(out.len());
        self.delay_left -= skip;
        out.drain(..skip);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_resamples_in_pieces_keeping_alignment() {
        let input = tone(440.0, 48_000, 1.0);
        let reference = tone(440.0, 16_000, 1.0);
        let mut stream = StreamResampler::new(48_000, 16_000);
        let mut pieces = Vec::new();
        for piece in input.chunks(960) {
            pieces.extend(stream.push(piece));
        }
        // All but the tail still inside the filter comes out, aligned with the input.
        assert!(
            pieces.len() > 15_500 && pieces.len() <= 16_000,
            "{}",
            pieces.len()
        );
        let err: f32 = pieces[1000..15_000]
            .iter()
            .zip(&reference[1000..15_000])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 0.02, "max deviation {err}");
    }

    fn tone(freq: f32, rate: u32, seconds: f32) -> Vec<f32> {
        let n = (rate as f32 * seconds) as usize;
        (0..n)
            .map(|i| (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin() * 0.5)
            .collect()
    }

    #[test]
    fn resampling_keeps_duration_and_alignment() {
        let input = tone(440.0, 22_050, 1.0);
        let output = resample(&input, 22_050, 16_000);
        assert_eq!(output.len(), 16_000);
        // The resampled tone matches a tone generated directly at the new rate.
        let reference = tone(440.0, 16_000, 1.0);
        let err: f32 = output[1000..15000]
            .iter()
            .zip(&reference[1000..15000])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 0.02, "max deviation {err}");
    }

    #[test]
    fn hostile_or_streamed_wav_headers() {
        let dir = std::env::temp_dir().join(format!("sublet-wav-headers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("call.wav");
        write_wav(&path, &Audio::new(vec![0.25; 1600], 16_000)).unwrap();
        let plain = std::fs::read(&path).unwrap();
        let with = |at: usize, value: &[u8]| {
            let mut bytes = plain.clone();
            bytes[at..at + value.len()].copy_from_slice(value);
            std::fs::write(&path, &bytes).unwrap();
            read_wav(&path)
        };
        // A consistent header (8-bit mono: a byte a frame) that claims 4,294,967,291 Hz is
        // refused, not resampled.
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: 8,
            sample_format: hound::SampleFormat::Int,
        };
        let mut eight_bit = hound::WavWriter::create(&path, spec).unwrap();
        (0..1600).for_each(|_| eight_bit.write_sample(32i8).unwrap());
        eight_bit.finalize().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        for at in [24, 28] {
            bytes[at..at + 4].copy_from_slice(&4_294_967_291u32.to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let absurd = read_wav(&path).unwrap_err();
        assert!(absurd.to_string().contains("4294967291 Hz"), "{absurd}");
        std::fs::write(&path, &plain).unwrap();
        // Bits a sample no integer path can scale.
        assert!(with(34, &0u16.to_le_bytes()).is_err());
        assert!(with(34, &65u16.to_le_bytes()).is_err());
        // A stream's header: the data's length unknown, read to the end of the file.
        let streamed = with(40, &u32::MAX.to_le_bytes()).unwrap();
        assert_eq!((streamed.rate, streamed.samples.len()), (16_000, 1600));
        assert!((streamed.samples[800] - 0.25).abs() < 1e-3);
        // Cut short mid-frame: the whole frames that are there.
        std::fs::write(&path, &plain[..plain.len() - 101]).unwrap();
        assert_eq!(read_wav(&path).unwrap().samples.len(), 1600 - 51);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An 8-bit mono PCM WAV at 1 kHz, `seconds` long: a byte a second's thousandth.
    fn eight_bit_1khz(seconds: u32) -> Vec<u8> {
        let data = seconds * 1000;
        let mut bytes = b"RIFF".to_vec();
        bytes.extend((36 + data).to_le_bytes());
        bytes.extend(b"WAVEfmt ");
        bytes.extend(16u32.to_le_bytes());
        bytes.extend(1u16.to_le_bytes()); // PCM
        bytes.extend(1u16.to_le_bytes()); // mono
        bytes.extend(1000u32.to_le_bytes()); // rate
        bytes.extend(1000u32.to_le_bytes()); // bytes a second
        bytes.extend(1u16.to_le_bytes()); // bytes a frame
        bytes.extend(8u16.to_le_bytes()); // bits a sample
        bytes.extend(b"data");
        bytes.extend(data.to_le_bytes());
        bytes.resize(bytes.len() + data as usize, 128);
        bytes
    }

    #[test]
    fn a_wav_longer_than_the_cap_is_refused_before_it_is_decoded() {
        let at_cap = wav_from_bytes(eight_bit_1khz(MAX_WAV_SECONDS), "cap.wav").unwrap();
        assert_eq!(at_cap.duration_s(), MAX_WAV_SECONDS as f64);
        let over = wav_from_bytes(eight_bit_1khz(MAX_WAV_SECONDS + 1), "long.wav").unwrap_err();
        assert!(over.to_string().contains("7201 s long"), "{over}");
    }

    #[test]
    fn wav_round_trip_any_layout() {
        let dir = std::env::temp_dir().join(format!("sublet-audio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Stereo float at 44.1 kHz with opposite channels mixes down to silence.
        let path = dir.join("stereo.wav");
        let spec = hound::WavSpec {
            channels: 2,
            sample_rate: 44_100,
            bits_per_sample: 32,
            sample_format: hound::SampleFormat::Float,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        for _ in 0..100 {
            w.write_sample(0.5f32).unwrap();
            w.write_sample(-0.5f32).unwrap();
        }
        w.finalize().unwrap();
        let audio = read_wav(&path).unwrap();
        assert_eq!((audio.rate, audio.samples.len()), (44_100, 100));
        assert!(audio.samples.iter().all(|s| s.abs() < 1e-6));

        let mono = dir.join("mono.wav");
        write_wav(&mono, &Audio::new(vec![0.25, -0.5], 16_000)).unwrap();
        let back = read_wav(&mono).unwrap();
        assert!((back.samples[0] - 0.25).abs() < 1e-3 && (back.samples[1] + 0.5).abs() < 1e-3);
    }

    #[test]
    fn refuses_what_is_not_wav() {
        let dir = std::env::temp_dir().join(format!("sublet-audio-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("notes.wav");
        std::fs::write(&text, "this is not audio").unwrap();
        let err = read_wav(&text).unwrap_err().to_string();
        assert!(err.contains("not a readable WAV"), "{err}");
        // A real header cut short: the data chunk promises more than the file holds.
        let good = dir.join("good.wav");
        write_wav(&good, &Audio::new(vec![0.1; 4000], 16_000)).unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let cut = dir.join("cut.wav");
        std::fs::write(&cut, &bytes[..30]).unwrap();
        assert!(read_wav(&cut).is_err());
    }
}
