//! Recorded test calls of the project's own: a caller's turns spoken by espeak-ng, with
//! pauses between them for the agent to answer, at 16 kHz. Beside each WAV a JSON file
//! records where each utterance lies, so tests can check the VAD against it.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use sublet_audio::{read_wav, write_wav, Audio, SPEECH_RATE};
use sublet_models::{ModelCache, CALLS_DIR};

/// The call `cargo xtask demo` answers.
pub const DEMO_CALL: &str = "three_turns.wav";

/// Bumped whenever a call's script changes.
const CALLS_VERSION: &str = "5";

struct Script {
    file: &'static str,
    voice: &'static str,
    /// Seconds of silence before the first utterance.
    lead_s: f64,
    /// Each utterance and the silence after it.
    turns: &'static [(&'static str, f64)],
}

const SCRIPTS: &[Script] = &[
    Script {
        file: DEMO_CALL,
        voice: "en-us",
        lead_s: 1.0,
        turns: &[
            ("Hello. What is the capital of France?", 8.0),
            ("How many legs does a spider have?", 8.0),
            ("Can you tell me a fun fact about the ocean?", 8.0),
        ],
    },
    Script {
        file: "trip_planning.wav",
        voice: "en-us+f3",
        lead_s: 0.5,
        turns: &[
            ("Hi, I would like some help planning a weekend trip.", 8.0),
            ("What should I pack for two days by the sea?", 8.0),
        ],
    },
    Script {
        file: "quick_questions.wav",
        voice: "en-us+m7",
        lead_s: 1.5,
        turns: &[
            ("Good morning. Is it going to rain today?", 7.0),
            ("What is two plus two?", 7.0),
            ("Great, thanks for your help.", 6.0),
        ],
    },
    // Pieces the turn-taking tests put together: a question with a long answer, words to
    // interrupt it with, one sentence spoken in two parts with a pause between, and a
    // sound too short to interrupt.
    Script {
        file: "turn_taking.wav",
        voice: "en-us",
        lead_s: 0.5,
        turns: &[
            ("Tell me a long story about a brave little dragon.", 1.0),
            ("Wait, stop. What is the capital of Italy?", 1.0),
            ("I would like to book", 1.2),
            ("a table for two people tonight.", 1.0),
            ("Oh.", 1.0),
        ],
    },
];

pub fn ensure_calls(cache: &ModelCache) -> Result<()> {
    let dir = cache.path(CALLS_DIR);
    let stamp = dir.join("version");
    if std::fs::read_to_string(&stamp).is_ok_and(|v| v == CALLS_VERSION)
        && SCRIPTS.iter().all(|s| dir.join(s.file).is_file())
    {
        eprintln!("setup: test calls ok");
        return Ok(());
    }
    std::fs::create_dir_all(&dir)?;
    for script in SCRIPTS {
        eprintln!("setup: speaking test call {}", script.file);
        make_call(script, &dir)?;
    }
    std::fs::write(stamp, CALLS_VERSION)?;
    Ok(())
}

fn make_call(script: &Script, dir: &Path) -> Result<()> {
    let mut call = Audio::silence(script.lead_s, SPEECH_RATE);
    let mut spans = Vec::new();
    for (i, (text, pause_s)) in script.turns.iter().enumerate() {
        let speech = speak(text, script.voice, &dir.join(format!(".utterance-{i}.wav")))?;
        let start_s = call.duration_s();
        call.samples.extend_from_slice(&speech.samples);
        spans.push(serde_json::json!({
            "text": text,
            "start_s": start_s,
            "end_s": call.duration_s(),
        }));
        call.samples.extend(std::iter::repeat_n(
            0.0,
            (pause_s * SPEECH_RATE as f64) as usize,
        ));
    }
    write_wav(dir.join(script.file), &call)?;
    let json = serde_json::json!({ "voice": script.voice, "utterances": spans });
    std::fs::write(
        dir.join(script.file).with_extension("json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    Ok(())
}

/// One utterance from espeak-ng, trimmed to where the sound starts and ends, at 16 kHz.
fn speak(text: &str, voice: &str, scratch: &Path) -> Result<Audio> {
    let status = Command::new("espeak-ng")
        .args(["-v", voice, "-s", "150", "-w"])
        .arg(scratch)
        .arg(text)
        .status()
        .context("running espeak-ng: is it installed?")?;
    if !status.success() {
        bail!("espeak-ng failed ({status}) speaking {text:?}");
    }
    let audio = read_wav(scratch)?.resampled(SPEECH_RATE);
    std::fs::remove_file(scratch)?;
    Ok(audio.trimmed(0.02))
}
