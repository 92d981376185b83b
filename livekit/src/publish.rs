//! The agent's voice in the room: audio at any rate, resampled to 48 kHz, encoded as 20 ms
//! Opus packets and sent in real time on the agent's microphone track.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use rtc::rtp::{Header, Packet};
use sublet_audio::StreamResampler;

use super::peer::OutputTrack;

const OPUS_RATE: u32 = 48_000;
/// Samples in one 20 ms Opus frame at 48 kHz.
const FRAME: usize = 960;
/// The payload type the Opus codec is registered with (`peer.rs`).
const OPUS_PAYLOAD_TYPE: u8 = 111;

/// Sends audio on a published track, paced as it would be spoken.
pub struct AudioPublisher {
    output: Arc<OutputTrack>,
    encoder: opus::Encoder,
    resampler: StreamResampler,
    pending: Vec<f32>,
    sequence: u16,
    timestamp: u32,
    /// When the next frame is due; `None` after a pause (the next frame starts a talk spurt).
    next_due: Option<Instant>,
}

impl AudioPublisher {
    pub(super) fn new(output: Arc<OutputTrack>, input_rate: u32) -> Result<Self> {
        let encoder = opus::Encoder::new(OPUS_RATE, opus::Channels::Mono, opus::Application::Voip)
            .context("creating the Opus encoder")?;
        Ok(Self {
            output,
            encoder,
            resampler: StreamResampler::new(input_rate, OPUS_RATE),
            pending: Vec::new(),
            sequence: 0,
            timestamp: 0,
            next_due: None,
        })
    }

    /// Sends `samples` (at the rate given when publishing), waiting as each 20 ms frame
    /// falls due, so the caller hears it in real time.
    pub async fn send(&mut self, samples: &[f32]) -> Result<()> {
        let resampled = self.resampler.push(samples);
        self.pending.extend_from_slice(&resampled);
        while self.pending.len() >= FRAME {
            let frame: Vec<f32> = self.pending.drain(..FRAME).collect();
            self.send_frame(&frame).await?;
        }
        Ok(())
    }

    /// Pads what is left to a whole frame and sends it; the next audio starts a new spurt.
    pub async fn finish(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            let mut frame = std::mem::take(&mut self.pending);
            frame.resize(FRAME, 0.0);
            self.send_frame(&frame).await?;
        }
        self.next_due = None;
        Ok(())
    }

    async fn send_frame(&mut self, frame: &[f32]) -> Result<()> {
        let now = Instant::now();
        let talk_spurt = self
            .next_due
            .is_none_or(|due| due + Duration::from_millis(100) < now);
        let due = if talk_spurt {
            now
        } else {
            self.next_due.unwrap_or(now)
        };
        tokio::time::sleep_until(due.into()).await;
        let payload = self
            .encoder
            .encode_vec_float(frame, 4000)
            .context("encoding Opus")?;
        let packet = Packet {
            header: Header {
                version: 2,
                marker: talk_spurt,
                payload_type: OPUS_PAYLOAD_TYPE,
                sequence_number: self.sequence,
                timestamp: self.timestamp,
                ..Default::default()
            },
            payload: Bytes::from(payload),
        };
        self.sequence = self.sequence.wrapping_add(1);
        self.timestamp = self.timestamp.wrapping_add(FRAME as u32);
        self.next_due = Some(due + Duration::from_millis(20));
        self.output.write(packet).await
    }
}
