//! Times Whisper on every utterance of the bundled recorded calls, with the cache's
//! converted model or the ggml file given, and prints each utterance's times and words
//! and the mean over all of them:
//!
//! ```text
//! cargo run --release -p sublet-stt --example time_utterances -- [MODEL.bin]
//! ```
//!
//! Each utterance is cut as the early transcript cuts a turn (its speech and 0.25 s
//! around it) and transcribed three times on one thread. To set two weight formats side by
//! side, alternate runs of each a few times: the machine's speed drifts within minutes.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use sublet_audio::{read_wav, SPEECH_RATE};
use sublet_models::ModelCache;
use sublet_stt::Transcriber;

const CALLS: [&str; 3] = ["three_turns", "trip_planning", "quick_questions"];
const REPEATS: usize = 3;

fn main() -> Result<()> {
    let cache = ModelCache::from_env();
    let model = match std::env::args().nth(1) {
        Some(path) => PathBuf::from(path),
        None => cache.whisper_ggml()?,
    };
    let mut stt = Transcriber::from_file(&model)?;
    let mut total_s = 0.0;
    let mut runs = 0;
    for call in CALLS {
        let audio = read_wav(cache.call(&format!("{call}.wav"))?)?.resampled(SPEECH_RATE);
        let spans: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(cache.call(&format!("{call}.json"))?)
                .context("reading the call's utterances")?,
        )?;
        let utterances = spans["utterances"].as_array().context("no utterances")?;
        for (index, utterance) in utterances.iter().enumerate() {
            let rate = f64::from(SPEECH_RATE);
            let at = |key: &str, pad_s: f64| {
                let s = utterance[key].as_f64().unwrap_or(0.0) + pad_s;
                ((s * rate).max(0.0) as usize).min(audio.samples.len())
            };
            let clip = &audio.samples[at("start_s", -0.25)..at("end_s", 0.25)];
            let mut times = Vec::new();
            let mut text = String::new();
            for _ in 0..REPEATS {
                let started = Instant::now();
                text = stt.transcribe(clip)?;
                let took = started.elapsed().as_secs_f64();
                total_s += took;
                runs += 1;
                times.push(format!("{took:.3}"));
            }
            println!(
                "{call}#{index} {:.2} s of audio  [{}] s  {text}",
                clip.len() as f64 / rate,
                times.join(", ")
            );
        }
    }
    println!(
        "{}: mean {:.3} s over {runs} transcriptions",
        model.display(),
        total_s / runs as f64
    );
    Ok(())
}
