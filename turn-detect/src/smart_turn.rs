//! Smart Turn v3.2: the probability that the caller has finished their turn, judged from
//! the sound of the last 8 s (intonation, pace, a trailing "um"), not the words.

use anyhow::Result;
use ort::session::Session;
use ort::value::Tensor;
use sublet_models::{onnx_session, ModelCache};

use crate::mel::{LogMel, N_MELS};

/// Seconds of audio the model looks at.
pub const WINDOW_S: usize = 8;
const WINDOW: usize = WINDOW_S * 16_000;

pub struct SmartTurn {
    session: Session,
    mel: LogMel,
}

impl SmartTurn {
    pub fn load(cache: &ModelCache) -> Result<Self> {
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::TurnDetector);
        let path = cache.smart_turn()?;
        let session = onnx_session(cache, &path, 2).map_err(anyhow::Error::msg)?;
        Ok(Self {
            session,
            mel: LogMel::load(&cache.mel_filters()?)?,
        })
    }

    /// End-of-turn probability for 16 kHz audio that ends where the caller stopped; only
    /// the last 8 s count, shorter audio is zero-padded at the front.
    pub fn probability(&mut self, audio: &[f32]) -> Result<f32> {
        let tail = &audio[audio.len().saturating_sub(WINDOW)..];
        let mut window = vec![0f32; WINDOW - tail.len()];
        window.extend_from_slice(tail);
        // Zero mean, unit variance over the whole window, padding included.
        // Accumulated in f64: the model is int8-quantized and a 1e-4 error in the scale
        // (f32 sums over 128,000 samples) moved its score on jfk.wav from 0.85 to 0.76.
        let mean = window.iter().map(|&x| x as f64).sum::<f64>() / WINDOW as f64;
        let var = window
            .iter()
            .map(|&x| (x as f64 - mean).powi(2))
            .sum::<f64>()
            / WINDOW as f64;
        let scale = 1.0 / (var + 1e-7).sqrt();
        for x in &mut window {
            *x = ((*x as f64 - mean) * scale) as f32;
        }
        let features = self.mel.features(&window);
        let frames = features.len() / N_MELS;
        let input = Tensor::from_array(([1usize, N_MELS, frames], features))?;
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::TurnDetector);
        let outputs = self.session.run(ort::inputs!["input_features" => input])?;
        let (_, out) = outputs[0].try_extract_tensor::<f32>()?;
        Ok(out[0])
    }
}
