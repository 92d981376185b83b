//! Silero VAD v6: the probability that a 32 ms frame holds speech.

use anyhow::Result;
use ort::session::Session;
use ort::value::Tensor;
use sublet_models::{onnx_session, ModelCache};

/// Samples per frame at 16 kHz (32 ms).
pub const VAD_FRAME: usize = 512;
/// Samples of the previous frame the model sees before each new one.
const CONTEXT: usize = 64;
const STATE_LEN: usize = 2 * 128;

/// One caller's VAD: the model session and the recurrent state it carries across frames.
pub struct SileroVad {
    session: Session,
    state: Vec<f32>,
    context: [f32; CONTEXT],
}

impl SileroVad {
    pub fn load(cache: &ModelCache) -> Result<Self> {
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::TurnDetector);
        let path = cache.silero_vad()?;
        let session = onnx_session(cache, &path, 1).map_err(anyhow::Error::msg)?;
        Ok(Self {
            session,
            state: vec![0.0; STATE_LEN],
            context: [0.0; CONTEXT],
        })
    }

    /// Forgets the audio seen so far (a new call).
    pub fn reset(&mut self) {
        self.state.fill(0.0);
        self.context = [0.0; CONTEXT];
    }

    /// The speech probability of the next frame of exactly [`VAD_FRAME`] samples.
    pub fn process(&mut self, frame: &[f32]) -> Result<f32> {
        anyhow::ensure!(
            frame.len() == VAD_FRAME,
            "VAD frames are {VAD_FRAME} samples, got {}",
            frame.len()
        );
        let mut input = Vec::with_capacity(CONTEXT + VAD_FRAME);
        input.extend_from_slice(&self.context);
        input.extend_from_slice(frame);
        self.context.copy_from_slice(&frame[VAD_FRAME - CONTEXT..]);

        let input = Tensor::from_array(([1usize, CONTEXT + VAD_FRAME], input))?;
        let state = Tensor::from_array(([2usize, 1, 128], self.state.clone()))?;
        let rate = Tensor::from_array(((), vec![16_000i64]))?;
        let _owner = sublet_heap::owned_by(sublet_heap::Owner::TurnDetector);
        let outputs = self
            .session
            .run(ort::inputs!["input" => input, "state" => state, "sr" => rate])?;
        let (_, probability) = outputs["output"].try_extract_tensor::<f32>()?;
        let probability = probability[0];
        let (_, next_state) = outputs["stateN"].try_extract_tensor::<f32>()?;
        self.state.copy_from_slice(next_state);
        Ok(probability)
    }
}
