//! Times the Piper voice on a few reply sentences, each three times, and prints the time,
//! the audio's length and their ratio (the real-time factor):
//!
//! ```text
//! cargo run --release -p sublet-tts --example time_sentences
//! ```

use std::time::Instant;

use anyhow::Result;
use sublet_models::ModelCache;
use sublet_tts::Voice;

const SENTENCES: [&str; 5] = [
    "Sure.",
    "I'm sorry, but",
    "The capital of France is Paris.",
    "I'm sorry, but I'm unable to assist with planning a trip.",
    "For two days by the sea, pack light clothes, a swimsuit, sunscreen, a hat and a good book.",
];

fn main() -> Result<()> {
    let cache = ModelCache::from_env();
    let mut voice = Voice::load(&cache)?;
    let (mut total_s, mut audio_total_s) = (0.0, 0.0);
    for sentence in SENTENCES {
        let mut times = Vec::new();
        let mut audio_s = 0.0;
        for _ in 0..3 {
            let started = Instant::now();
            let audio = voice.synthesize(sentence)?;
            let took = started.elapsed().as_secs_f64();
            audio_s = audio.samples.len() as f64 / audio.rate as f64;
            total_s += took;
            audio_total_s += audio_s;
            times.push(format!("{took:.3}"));
        }
        println!(
            "[{}] s for {audio_s:.2} s of audio: {sentence}",
            times.join(", ")
        );
    }
    println!("real-time factor {:.3}", total_s / audio_total_s);
    Ok(())
}
