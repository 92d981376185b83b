//! A recorded call through the LiveKit path's audio coding, without a room: 16 kHz up to
//! 48 kHz, Opus in 20 ms frames (VoIP, the encoder's default bitrate), decoded and back to
//! 16 kHz with the resamplers the agent uses in a room. The result, beside its scripted
//! turns (the JSON is copied), is for `score_stops` to compare Smart Turn's scores against
//! the WAV played in directly.
//!
//! ```text
//! cargo run --release -p sublet-livekit --example opus_round_trip -- CALL.wav OUT.wav [BITRATE]
//! ```

use anyhow::{Context, Result};
use sublet_audio::{read_wav, write_wav, Audio, StreamResampler, SPEECH_RATE};

const OPUS_RATE: u32 = 48_000;
const FRAME: usize = OPUS_RATE as usize / 50;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: opus_round_trip CALL.wav OUT.wav [BITRATE]";
    let (input, output) = (args.next().context(usage)?, args.next().context(usage)?);
    let bitrate: Option<i32> = args.next().map(|b| b.parse()).transpose()?;
    let call = read_wav(&input)?.resampled(SPEECH_RATE);
    let mut up = StreamResampler::new(SPEECH_RATE, OPUS_RATE);
    let mut down = StreamResampler::new(OPUS_RATE, SPEECH_RATE);
    let mut encoder = opus::Encoder::new(OPUS_RATE, opus::Channels::Mono, opus::Application::Voip)?;
    if let Some(bits) = bitrate {
        encoder.set_bitrate(opus::Bitrate::Bits(bits))?;
    }
    let mut decoder = opus::Decoder::new(OPUS_RATE, opus::Channels::Mono)?;
    let mut pending = Vec::new();
    let mut out = Vec::new();
    let mut pcm = vec![0f32; 5760];
    let mut bytes = 0usize;
    for piece in call.samples.chunks(SPEECH_RATE as usize / 50) {
        pending.extend(up.push(piece));
        while pending.len() >= FRAME {
            let frame: Vec<f32> = pending.drain(..FRAME).collect();
            let packet = encoder.encode_vec_float(&frame, 4000)?;
            bytes += packet.len();
            let n = decoder.decode_float(&packet, &mut pcm, false)?;
            out.extend(down.push(&pcm[..n]));
        }
    }
    let seconds = call.duration_s();
    write_wav(&output, &Audio::new(out, SPEECH_RATE))?;
    let spans = std::path::Path::new(&input).with_extension("json");
    if spans.is_file() {
        std::fs::copy(&spans, std::path::Path::new(&output).with_extension("json"))?;
    }
    eprintln!(
        "{output}: {seconds:.1} s through Opus at {:.0} kbit/s",
        bytes as f64 * 8.0 / seconds / 1000.0
    );
    Ok(())
}
