//! Text to speech: the Piper voice `en_US-joe-medium` through ONNX Runtime, its phonemes
//! from espeak-ng.
//!
//! A sentence is synthesized whole (Piper is a non-autoregressive VITS model: 3.5 s of
//! speech takes about a quarter of a second here), which is why the agent hands it the
//! first complete sentence as soon as one exists.

mod phonemes;

use std::collections::HashMap;

use anyhow::{Context, Result};
use ort::session::Session;
use ort::value::Tensor;
use serde::Deserialize;
use sublet_audio::Audio;
use sublet_models::{onnx_session, ModelCache};

pub use phonemes::phonemize;

#[derive(Debug, Deserialize)]
struct VoiceConfig {
    audio: AudioConfig,
    espeak: EspeakConfig,
    inference: InferenceConfig,
    phoneme_id_map: HashMap<String, Vec<i64>>,
}

#[derive(Debug, Deserialize)]
struct AudioConfig {
    sample_rate: u32,
}

#[derive(Debug, Deserialize)]
struct EspeakConfig {
    voice: String,
}

#[derive(Debug, Deserialize)]
struct InferenceConfig {
    noise_scale: f32,
    length_scale: f32,
    noise_w: f32,
}

/// How Piper speaks: `length_scale` stretches every phoneme (above 1 is slower),
/// `noise_scale` varies the voice's pitch and energy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prosody {
    pub length_scale: f32,
    pub noise_scale: f32,
}

/// A loaded Piper voice.
pub struct Voice {
    session: Session,
    config: VoiceConfig,
    ids: HashMap<char, i64>,
    /// How [`Voice::synthesize`] speaks: the voice's own prosody unless set.
    prosody: Prosody,
}

/// Checks the cache's voice (a user's `--voice`) before any call: its configuration beside
/// it, espeak-ng's voice for it, and a sentence spoken.
pub fn check_voice(cache: &ModelCache) -> Result<()> {
    let config = cache.piper_config()?;
    anyhow::ensure!(
        config.is_file(),
        "its configuration {} is missing (a Piper voice is an .onnx with its .onnx.json)",
        config.display()
    );
    let mut voice = Voice::load(cache)?;
    let audio = voice
        .synthesize("Hello.")
        .context("speaking a test sentence")?;
    anyhow::ensure!(!audio.samples.is_empty(), "it spoke no audio");
    Ok(())
}

impl Voice {
    pub fn load(cache: &ModelCache) -> Result<Self> {
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::Voice);
        let config_path = cache.piper_config()?;
        let config: VoiceConfig = serde_json::from_slice(&std::fs::read(&config_path)?)
            .with_context(|| format!("reading voice config {}", config_path.display()))?;
        let model = cache.piper_voice()?;
        let session = onnx_session(cache, &model, 2).map_err(anyhow::Error::msg)?;
        let ids = config
            .phoneme_id_map
            .iter()
            .filter_map(|(k, v)| {
                let mut chars = k.chars();
                match (chars.next(), chars.next(), v.first()) {
                    (Some(c), None, Some(&id)) => Some((c, id)),
                    _ => None,
                }
            })
            .collect();
        let prosody = Prosody {
            length_scale: config.inference.length_scale,
            noise_scale: config.inference.noise_scale,
        };
        Ok(Self {
            session,
            config,
            ids,
            prosody,
        })
    }

    /// Speaks slower or faster, more or less varied, from now on (a persona's voice).
    pub fn set_prosody(&mut self, prosody: Prosody) {
        self.prosody = prosody;
    }

    /// The rate of the audio [`Voice::synthesize`] returns (22050 Hz for this voice).
    pub fn sample_rate(&self) -> u32 {
        self.config.audio.sample_rate
    }

    /// Piper's input: BOS, then each phoneme followed by the pad, then EOS; phonemes the
    /// voice does not know are skipped.
    fn phoneme_ids(&self, phonemes: &str) -> Vec<i64> {
        let id = |c: char| self.ids.get(&c).copied();
        let pad = id('_').unwrap_or(0);
        let mut out = vec![id('^').unwrap_or(1), pad];
        for c in phonemes.chars() {
            if let Some(i) = id(c) {
                out.push(i);
                out.push(pad);
            }
        }
        out.push(id('$').unwrap_or(2));
        out
    }

    /// The voice's own prosody, from its config.
    pub fn default_prosody(&self) -> Prosody {
        Prosody {
            length_scale: self.config.inference.length_scale,
            noise_scale: self.config.inference.noise_scale,
        }
    }

    /// Speaks `text` with the prosody set (the voice's own by default), from its first
    /// sound: Piper opens every utterance with 40–70 ms of near-silence, which a caller
    /// would only hear as a longer wait. Empty audio for text with nothing to say.
    pub fn synthesize(&mut self, text: &str) -> Result<Audio> {
        let audio = self.synthesize_with(text, self.prosody)?;
        let from = first_sound(&audio.samples, audio.rate);
        Ok(Audio::new(audio.samples[from..].to_vec(), audio.rate))
    }

    /// Speaks `text` slower or faster and more or less varied than the voice's default (the
    /// evaluation's test callers).
    pub fn synthesize_with(&mut self, text: &str, prosody: Prosody) -> Result<Audio> {
        let rate = self.sample_rate();
        let phonemes = phonemize(text, &self.config.espeak.voice)?;
        let ids = self.phoneme_ids(&phonemes);
        if ids.len() <= 3 {
            return Ok(Audio::new(Vec::new(), rate));
        }
        let inference = &self.config.inference;
        let scales = vec![prosody.noise_scale, prosody.length_scale, inference.noise_w];
        let length = ids.len();
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::Voice);
        let outputs = self.session.run(ort::inputs![
            "input" => Tensor::from_array(([1usize, length], ids))?,
            "input_lengths" => Tensor::from_array(([1usize], vec![length as i64]))?,
            "scales" => Tensor::from_array(([3usize], scales))?,
        ])?;
        let (_, samples) = outputs[0].try_extract_tensor::<f32>()?;
        Ok(Audio::new(samples.to_vec(), rate))
    }
}

/// Where speech starts in `samples`: 10 ms before the first 5 ms window louder than
/// -46 dBFS (RMS 0.005), the onset's soft edge kept; 0 when none is.
fn first_sound(samples: &[f32], rate: u32) -> usize {
    const LOUDER_THAN: f32 = 0.005;
    let window = (rate as usize / 200).max(1);
    let keep = rate as usize / 100;
    samples
        .chunks(window)
        .position(|w| (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt() > LOUDER_THAN)
        .map_or(0, |i| (i * window).saturating_sub(keep))
}

#[cfg(test)]
mod tests {
    use super::first_sound;

    #[test]
    fn speech_starts_at_its_first_sound() {
        let rate = 22_050;
        // 60 ms of faint noise, then a tone.
        let mut samples: Vec<f32> = (0..1323).map(|i| 0.001 * ((i % 7) as f32 - 3.0)).collect();
        samples.extend((0..2205).map(|i| 0.3 * (i as f32 * 0.06).sin()));
        let from = first_sound(&samples, rate);
        // The 5 ms window holding the tone's start, less 10 ms.
        assert!((1323 - 110 - 220..=1323 - 220).contains(&from), "{from}");
        assert_eq!(first_sound(&samples[1323..], rate), 0);
        assert_eq!(first_sound(&vec![0.0; 500], rate), 0);
    }
}
