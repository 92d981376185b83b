//! Smart Turn's score at each stop of a scripted test call (the latency benchmark's JSON
//! beside its WAV), with the model's window taken three ways, to compare them:
//!
//! - `history`: the last 8 s up to 0.4 s after the stop (what the detector did at first);
//! - `turn+0.4`: from 0.5 s before the turn's first speech to 0.4 s after the stop;
//! - `turn+0.2`: the same to 0.2 s after the stop (Pipecat's window: its VAD stops at 0.2 s).
//!
//! ```text
//! cargo run --release -p sublet-turn-detect --example score_stops -- CALL.wav
//! ```

use anyhow::{Context, Result};
use sublet_models::ModelCache;
use sublet_turn_detect::smart_turn::SmartTurn;

fn main() -> Result<()> {
    let wav = std::env::args()
        .nth(1)
        .context("usage: score_stops CALL.wav")?;
    let audio = sublet_audio::read_wav(&wav)?.resampled(16_000).samples;
    let turns: serde_json::Value = serde_json::from_slice(&std::fs::read(
        std::path::Path::new(&wav).with_extension("json"),
    )?)?;
    let mut model = SmartTurn::load(&ModelCache::from_env())?;
    let at = |s: f64| ((s.max(0.0) * 16_000.0) as usize).min(audio.len());
    println!(
        "{:<7} {:>7} {:>9} {:>9} {:>9}  text",
        "stop", "at s", "history", "turn+0.4", "turn+0.2"
    );
    for turn in turns.as_array().context("a list of turns")? {
        let start = turn["start_s"].as_f64().context("start_s")?;
        let mut stops: Vec<(f64, &str)> = turn["pauses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| (p[0].as_f64().unwrap_or(0.0), "pause"))
            .collect();
        stops.push((turn["end_s"].as_f64().context("end_s")?, "end"));
        for (stop, kind) in stops {
            let history = model.probability(&audio[at(stop + 0.4 - 8.0)..at(stop + 0.4)])?;
            let turn4 = model.probability(&audio[at(start - 0.5)..at(stop + 0.4)])?;
            let turn2 = model.probability(&audio[at(start - 0.5)..at(stop + 0.2)])?;
            println!(
                "{kind:<7} {stop:>7.2} {history:>9.3} {turn4:>9.3} {turn2:>9.3}  {}",
                turn["text"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}
