//! The latency benchmark's test callers: scripted calls spoken by several synthetic voices
//! (the Piper voice slower and faster, with more or less variation; espeak-ng voices at
//! other pitches and rates), with mid-sentence pauses of 0.6–1.2 s that must not end the
//! turn. Each pause falls where the sentence cannot end (after "and", "on", "to buy", in a
//! number being dictated): a pause after a complete clause ("I need to call my sister",
//! then "and then …") is a point where a listener may take the turn, and was cut off by
//! every configuration measured (version 2 of these calls). Each call is a 16 kHz WAV and a JSON file of where each turn and pause lies, made
//! once into the model cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sublet_audio::{read_wav, write_wav, Audio, SPEECH_RATE};

use crate::conditions::Condition;
use sublet_models::{ModelCache, CALLS_DIR};
use sublet_tts::{Prosody, Voice};

/// Bumped whenever a script or a voice changes.
const VERSION: &str = "3";
/// Silence after each turn: room for the slowest configuration's answer.
const REPLY_GAP_S: f64 = 9.0;
/// Silence before the first turn.
const LEAD_S: f64 = 1.0;

/// Who speaks a call.
#[derive(Debug, Clone, Copy)]
pub enum Speaker {
    Piper {
        length_scale: f32,
        noise_scale: f32,
    },
    Espeak {
        voice: &'static str,
        words_per_minute: u32,
        pitch: u32,
    },
}

/// One scripted call: each turn is its parts, each with the pause that follows it inside
/// the turn (none after the last).
pub struct Script {
    pub name: &'static str,
    pub speaker: Speaker,
    pub turns: &'static [&'static [(&'static str, f64)]],
}

pub const SCRIPTS: &[Script] = &[
    Script {
        name: "piper_slow",
        speaker: Speaker::Piper {
            length_scale: 1.2,
            noise_scale: 0.8,
        },
        turns: &[
            &[("Hi there. What is the capital of Japan?", 0.0)],
            &[
                ("I need to call my sister and", 0.8),
                ("then book a taxi to the airport.", 0.0),
            ],
            &[("How long does it take to boil an egg?", 0.0)],
        ],
    },
    Script {
        name: "espeak_low",
        speaker: Speaker::Espeak {
            voice: "en-us+f3",
            words_per_minute: 140,
            pitch: 35,
        },
        turns: &[
            &[
                ("My phone number is five five five,", 0.9),
                ("two three four,", 0.7),
                ("six seven eight nine.", 0.0),
            ],
            &[("Can you say that number back to me?", 0.0)],
            &[("Thank you, that is all for today.", 0.0)],
        ],
    },
    Script {
        name: "piper_fast",
        speaker: Speaker::Piper {
            length_scale: 0.9,
            noise_scale: 0.5,
        },
        turns: &[
            &[
                ("I would like to order", 1.0),
                ("a large pizza with mushrooms.", 0.0),
            ],
            &[("What time do you close tonight?", 0.0)],
            &[
                ("I want three", 0.8),
                ("apples and", 0.8),
                ("a loaf of bread.", 0.0),
            ],
        ],
    },
    Script {
        name: "espeak_high",
        speaker: Speaker::Espeak {
            voice: "en-gb+m3",
            words_per_minute: 175,
            pitch: 65,
        },
        turns: &[
            &[("Tell me a short joke about cats.", 0.0)],
            &[
                ("The meeting is on", 1.2),
                ("Tuesday at half past three in the afternoon.", 0.0),
            ],
            &[("Is twelve a prime number?", 0.0)],
        ],
    },
    Script {
        name: "piper_default",
        speaker: Speaker::Piper {
            length_scale: 1.05,
            noise_scale: 0.667,
        },
        turns: &[
            &[
                ("So, um,", 1.0),
                ("what is the weather like in London in spring?", 0.0),
            ],
            &[("I am planning to visit my grandmother next weekend.", 0.0)],
            &[
                ("Could you remind me to buy", 0.6),
                ("milk and eggs on my way home?", 0.0),
            ],
        ],
    },
    Script {
        name: "espeak_mid",
        speaker: Speaker::Espeak {
            voice: "en-us+m7",
            words_per_minute: 160,
            pitch: 50,
        },
        turns: &[
            &[("How many days are there in a leap year?", 0.0)],
            &[
                ("The total comes to forty two dollars and", 0.9),
                ("fifty cents.", 0.0),
            ],
            &[("Okay, goodbye.", 0.0)],
        ],
    },
];

/// Where a scripted turn lies in its call. Times are seconds from the call's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptedTurn {
    pub text: String,
    pub start_s: f64,
    pub end_s: f64,
    /// The pauses inside the turn, as (start, end).
    pub pauses: Vec<(f64, f64)>,
}

/// A call ready to play.
#[derive(Debug, Clone)]
pub struct TestCall {
    pub name: String,
    pub wav: PathBuf,
    pub turns: Vec<ScriptedTurn>,
}

/// The test calls, spoken into the cache first if they are not there yet.
pub fn ensure(cache: &ModelCache, progress: &mut dyn FnMut(&str)) -> Result<Vec<TestCall>> {
    let scripts: Vec<&Script> = SCRIPTS.iter().collect();
    ensure_calls(cache, "latency", VERSION, &scripts, progress)
}

/// `scripts` spoken into the cache's `calls/<set>/<version>/` once, and read back. The
/// callers speak with the bundled voice whatever voice the agent was given.
pub fn ensure_calls(
    cache: &ModelCache,
    set: &str,
    version: &str,
    scripts: &[&Script],
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<TestCall>> {
    let dir = cache.path(CALLS_DIR).join(set).join(version);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut voice = None;
    let mut calls = Vec::new();
    for &script in scripts {
        let wav = dir.join(format!("{}.wav", script.name));
        let spans = wav.with_extension("json");
        if !(wav.is_file() && spans.is_file()) {
            progress(&format!("speaking test call {}", script.name));
            if voice.is_none() && matches!(script.speaker, Speaker::Piper { .. }) {
                voice = Some(Voice::load(&ModelCache::at(cache.root()))?);
            }
            let (audio, turns) = speak_call(script, voice.as_mut(), &dir)?;
            write_wav(&wav, &audio)?;
            std::fs::write(&spans, serde_json::to_string_pretty(&turns)? + "\n")?;
        }
        let turns = serde_json::from_slice(&std::fs::read(&spans)?)
            .with_context(|| format!("reading {}", spans.display()))?;
        calls.push(TestCall {
            name: script.name.to_owned(),
            wav,
            turns,
        });
    }
    Ok(calls)
}

fn speak_call(
    script: &Script,
    mut voice: Option<&mut Voice>,
    scratch: &Path,
) -> Result<(Audio, Vec<ScriptedTurn>)> {
    let mut call = Audio::silence(LEAD_S, SPEECH_RATE);
    let mut turns = Vec::new();
    for parts in script.turns {
        let start_s = call.duration_s();
        let mut pauses = Vec::new();
        let mut text = Vec::new();
        for &(part, pause_s) in parts.iter() {
            // A part the caller pauses after is spoken as a clause that goes on (a comma's
            // level pitch), not as a finished sentence: a person pausing mid-sentence does not
            // let their voice fall.
            let spoken = match pause_s > 0.0 && !part.ends_with([',', '.', '?', '!']) {
                true => format!("{part},"),
                false => part.to_owned(),
            };
            text.push(part);
            let part = spoken.as_str();
            let speech = match script.speaker {
                Speaker::Piper {
                    length_scale,
                    noise_scale,
                } => {
                    let voice = voice.as_deref_mut().context("the Piper voice")?;
                    let prosody = Prosody {
                        length_scale,
                        noise_scale,
                    };
                    voice.synthesize_with(part, prosody)?
                }
                Speaker::Espeak {
                    voice,
                    words_per_minute,
                    pitch,
                } => espeak(part, voice, words_per_minute, pitch, scratch)?,
            };
            call.samples
                .extend_from_slice(&speech.resampled(SPEECH_RATE).trimmed(0.02).samples);
            if pause_s > 0.0 {
                let at = call.duration_s();
                pauses.push((at, at + pause_s));
                call.samples.extend(silence(pause_s));
            }
        }
        turns.push(ScriptedTurn {
            text: text.join(" "),
            start_s,
            end_s: call.duration_s(),
            pauses,
        });
        call.samples.extend(silence(REPLY_GAP_S));
    }
    Ok((call, turns))
}

fn silence(seconds: f64) -> impl Iterator<Item = f32> {
    std::iter::repeat_n(0.0, (seconds * SPEECH_RATE as f64) as usize)
}

fn espeak(text: &str, voice: &str, wpm: u32, pitch: u32, scratch: &Path) -> Result<Audio> {
    let file = scratch.join(".utterance.wav");
    let status = Command::new("espeak-ng")
        .args([
            "-v",
            voice,
            "-s",
            &wpm.to_string(),
            "-p",
            &pitch.to_string(),
        ])
        .arg("-w")
        .arg(&file)
        .arg(text)
        .status()
        .context("running espeak-ng: is it installed? (cargo xtask setup)")?;
    if !status.success() {
        bail!("espeak-ng failed ({status}) speaking {text:?}");
    }
    let audio = read_wav(&file)?;
    std::fs::remove_file(&file)?;
    Ok(audio)
}

/// `calls` as heard in `condition`: each written beside its clean recording once more
/// (`<name>.<condition>.wav`), the next call the voice behind it.
pub fn heard_in(condition: Condition, calls: &[TestCall]) -> Result<Vec<TestCall>> {
    if matches!(condition, Condition::Clean | Condition::Echo { .. }) {
        return Ok(calls.to_vec());
    }
    let clean: Vec<sublet_audio::Audio> = calls
        .iter()
        .map(|call| read_wav(&call.wav))
        .collect::<Result<_, _>>()?;
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let speech: Vec<(f64, f64)> = call.turns.iter().map(|t| (t.start_s, t.end_s)).collect();
            let other = &clean[(i + 1) % clean.len()];
            let audio = condition.apply(&clean[i], &speech, other, i as u64 + 1);
            let wav = call.wav.with_extension(format!("{}.wav", condition.name()));
            write_wav(&wav, &audio)?;
            Ok(TestCall {
                wav,
                ..call.clone()
            })
        })
        .collect()
}
