//! The caller is nearer than the room (`sublet_turn_detect::level_gate`): another voice
//! speaking 14 dB below the caller (the gate holds frames over 10 dB under the caller's
//! level for someone else's), in the caller's pauses and over the end of their last
//! question, takes no turn and keeps no turn of theirs open. Without the gate, Silero hears
//! that voice as the caller's and takes its words as turns: the test checks both. The same
//! holds for the agent's own voice echoed back on a recorded call.

use std::sync::Arc;

use sublet_agent::{AgentConfig, CallObserver, Echo, Interruption, Pacing, VoiceAgent};
use sublet_audio::{read_wav, SPEECH_RATE};
use sublet_engine::{Engine, EngineConfig};
use sublet_models::ModelCache;
use sublet_turn_detect::{EndpointConfig, LevelGateConfig, TurnDetector, TurnEvent};

/// A test call's samples at 16 kHz and its utterances' spans, in seconds.
fn call(cache: &ModelCache, name: &str) -> (Vec<f32>, Vec<(f64, f64)>) {
    let audio = read_wav(cache.call(&format!("{name}.wav")).unwrap()).unwrap();
    let script: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cache.call(&format!("{name}.json")).unwrap()).unwrap(),
    )
    .unwrap();
    let spans = script["utterances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["start_s"].as_f64().unwrap(), u["end_s"].as_f64().unwrap()))
        .collect();
    (audio.resampled(SPEECH_RATE).samples, spans)
}

/// The power of `samples` over `spans`.
fn power(samples: &[f32], spans: &[(f64, f64)]) -> f64 {
    let at = |s: f64| ((s * SPEECH_RATE as f64) as usize).min(samples.len());
    let (sum, n) = spans
        .iter()
        .flat_map(|&(from, to)| &samples[at(from)..at(to)])
        .fold((0.0, 0), |(sum, n), &s| (sum + (s as f64).powi(2), n + 1));
    sum / n.max(1) as f64
}

/// The caller's call with `other` behind it, `below_db` under the caller's speech level,
/// `delay_s` later.
fn with_voice_behind(
    (caller, caller_spans): &(Vec<f32>, Vec<(f64, f64)>),
    (other, other_spans): &(Vec<f32>, Vec<(f64, f64)>),
    below_db: f64,
    delay_s: f64,
) -> Vec<f32> {
    let gain = (power(caller, caller_spans) / power(other, other_spans)).sqrt()
        * 10f64.powf(-below_db / 20.0);
    let delay = (delay_s * SPEECH_RATE as f64) as usize;
    let mut mixed = caller.clone();
    mixed.resize(caller.len().max(other.len() + delay), 0.0);
    for (i, &s) in other.iter().enumerate() {
        mixed[i + delay] += gain as f32 * s;
    }
    mixed
}

/// Speech starts and ends of turn (their speech's end) a detector finds in `samples`.
fn turns(cache: &ModelCache, config: EndpointConfig, samples: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut detector = TurnDetector::load(cache, config).unwrap();
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    let silence = vec![0.0; 4 * SPEECH_RATE as usize];
    for chunk in samples.chunks(320).chain(silence.chunks(320)) {
        for event in detector.push(chunk).unwrap() {
            match event {
                TurnEvent::SpeechStarted { at_s } => starts.push(at_s),
                TurnEvent::EndOfTurn { speech_end_s, .. } => ends.push(speech_end_s),
                TurnEvent::SpeechStopped { .. } => {}
            }
        }
    }
    (starts, ends)
}

#[test]
fn a_voice_behind_the_caller_takes_no_turn() {
    let cache = ModelCache::from_env();
    let caller = call(&cache, "three_turns");
    // Its questions fall in the caller's pauses, and its last runs on past the caller's.
    let mixed = with_voice_behind(&caller, &call(&cache, "quick_questions"), 14.0, 4.0);
    let utterances = &caller.1;

    // Speech starts only inside the caller's utterances (again after a pause within one).
    let outside = |starts: &[f64]| {
        starts
            .iter()
            .filter(|&&at| !utterances.iter().any(|&(s, e)| at >= s - 0.15 && at <= e))
            .count()
    };
    let gated = EndpointConfig {
        level_gate: Some(LevelGateConfig::default()),
        ..EndpointConfig::default()
    };
    let (starts, ends) = turns(&cache, gated, &mixed);
    println!("gated: starts {starts:?}, ends {ends:?}");
    assert_eq!(
        outside(&starts),
        0,
        "speech started outside the caller's utterances"
    );
    assert_eq!(
        ends.len(),
        utterances.len(),
        "a turn per utterance, no more"
    );
    for (i, &(_, end)) in utterances.iter().enumerate() {
        assert!(
            ends[i] >= end - 0.15 && ends[i] <= end + 0.5,
            "utterance {i} ends at {end}, its turn's speech at {}",
            ends[i]
        );
    }

    let ungated = EndpointConfig {
        level_gate: None,
        ..EndpointConfig::default()
    };
    let (starts, ends) = turns(&cache, ungated, &mixed);
    println!("ungated: starts {starts:?}, ends {ends:?}");
    assert!(
        outside(&starts) > 0 || ends.len() > utterances.len(),
        "without the gate the voice behind should take turns of its own"
    );
}

/// Counts the times the agent was talked over.
#[derive(Default)]
struct TalkedOver(usize);

impl CallObserver for TalkedOver {
    fn interruption(&mut self, _interruption: &Interruption) {
        self.0 += 1;
    }
}

/// The agent's own voice on a recorded call played in real time, fed back 20 dB down and
/// 150 ms late (a speakerphone; `latency --conditions echo`): with the gate it talks over
/// nothing and takes no turn of its own words. Without the gate its echo is heard as the
/// caller, and the call still ends (a reply its echo left paused at the end has no one to
/// resume it: the recorded call's speaker once waited for it for ever).
#[test]
fn the_agents_echo_on_a_recorded_call_is_not_the_caller() {
    let cache = ModelCache::from_env();
    let call = read_wav(cache.call("three_turns.wav").unwrap()).unwrap();
    let echo = Echo {
        below_db: 20.0,
        delay_s: 0.15,
    };
    let engine = Arc::new(Engine::load(&EngineConfig::from_cache(&cache).unwrap()).unwrap());
    let run = |level_gate: Option<LevelGateConfig>| {
        let config = AgentConfig {
            endpoint: EndpointConfig {
                level_gate,
                ..EndpointConfig::default()
            },
            ..AgentConfig::default()
        };
        let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), config);
        let mut talked_over = TalkedOver::default();
        let outcome = agent
            .answer_recording_with(
                &call,
                Pacing::Realtime,
                call.rate,
                Some(echo),
                &mut talked_over,
            )
            .unwrap();
        let turns: Vec<String> = outcome.turns.iter().map(|t| t.transcript.clone()).collect();
        (turns, talked_over.0)
    };

    let (turns, talked_over) = run(Some(LevelGateConfig::default()));
    println!("gated: {turns:?}, talked over {talked_over} times");
    assert_eq!(talked_over, 0, "the agent's echo talked over it");
    assert_eq!(
        turns.len(),
        3,
        "a turn per question, none of the echo's: {turns:?}"
    );

    let (turns, talked_over) = run(None);
    println!("ungated: {turns:?}, talked over {talked_over} times");
    assert!(
        talked_over > 0 || turns.len() > 3,
        "without the gate the echo should be heard as the caller"
    );
}
