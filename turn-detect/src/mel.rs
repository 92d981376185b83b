//! Whisper's log-mel spectrogram, the input of the Smart Turn model.
//!
//! 400-point periodic Hann window, hop 160, centred frames with reflect padding, power
//! spectrum, Whisper's 80-bin filterbank, log10 floored at 1e-10, clamped to (max - 8), then
//! `(x + 4) / 4`; the last frame is dropped, as Whisper's feature extractor does.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use realfft::{RealFftPlanner, RealToComplex};

pub const N_FFT: usize = 400;
pub const HOP: usize = 160;
pub const N_MELS: usize = 80;
const N_BINS: usize = N_FFT / 2 + 1;

pub struct LogMel {
    filters: Vec<f32>,
    window: Vec<f32>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl LogMel {
    /// Loads the `[80][201]` filterbank setup wrote as raw little-endian f32.
    pub fn load(filters_path: &Path) -> Result<Self> {
        let bytes = std::fs::read(filters_path)
            .with_context(|| format!("reading mel filters {}", filters_path.display()))?;
        anyhow::ensure!(
            bytes.len() == N_MELS * N_BINS * 4,
            "{}: expected {} bytes of f32 filters, found {}",
            filters_path.display(),
            N_MELS * N_BINS * 4,
            bytes.len()
        );
        let filters = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let window = (0..N_FFT)
            .map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / N_FFT as f32).cos())
            .collect();
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
        Ok(Self {
            filters,
            window,
            fft,
        })
    }

    /// Features `[80][frames]` (row-major) of `samples`, `frames = len / 160`.
    pub fn features(&self, samples: &[f32]) -> Vec<f32> {
        let pad = N_FFT / 2;
        let n = samples.len();
        // Reflect padding (numpy "reflect": the edge sample is not repeated).
        let padded: Vec<f32> = (0..n + 2 * pad)
            .map(|i| {
                let j = i as isize - pad as isize;
                let j = if j < 0 {
                    -j
                } else if j >= n as isize {
                    2 * (n as isize - 1) - j
                } else {
                    j
                };
                samples[j.clamp(0, n as isize - 1) as usize]
            })
            .collect();
        let frames = n / HOP; // 1 + n/HOP frames, minus the dropped last one
        let mut mel = vec![0f32; N_MELS * frames];
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut power = vec![0f32; N_BINS];
        for f in 0..frames {
            let start = f * HOP;
            for (k, x) in input.iter_mut().enumerate() {
                *x = padded[start + k] * self.window[k];
            }
            self.fft
                .process(&mut input, &mut spectrum)
                .expect("buffers sized by the planner");
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = c.norm_sqr();
            }
            for m in 0..N_MELS {
                let row = &self.filters[m * N_BINS..(m + 1) * N_BINS];
                let energy: f32 = row.iter().zip(&power).map(|(w, p)| w * p).sum();
                mel[m * frames + f] = energy.max(1e-10).log10();
            }
        }
        let max = mel.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for v in &mut mel {
            *v = ((*v).max(max - 8.0) + 4.0) / 4.0;
        }
        mel
    }
}
