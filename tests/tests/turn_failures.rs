//! A turn's failure is the turn's: a recorded call on the real models with faults injected
//! into chosen turns, and with a reply deadline no reply can meet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sublet_agent::{AgentConfig, CallOutcome, Pacing, Quiet, TurnFaults, TurnOutcome, VoiceAgent};
use sublet_audio::{read_wav, SPEECH_RATE};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{Engine, EngineConfig};
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};

#[test]
fn an_engine_or_speech_failure_is_answered_with_the_fallback_and_the_call_goes_on() {
    let cache = ModelCache::from_env();
    let config = AgentConfig {
        faults: TurnFaults {
            engine: vec![1],
            speech: vec![2],
            ..TurnFaults::default()
        },
        ..AgentConfig::default()
    };
    let fallback = config.fallback_phrase.clone();
    let agent = VoiceAgent::load(cache.clone(), config).unwrap();
    let outcome = three_turn_call(&agent);
    let turns = &outcome.turns;
    let outcomes: Vec<TurnOutcome> = turns.iter().map(|t| t.outcome).collect();
    assert_eq!(
        outcomes,
        [
            TurnOutcome::EngineFailed,
            TurnOutcome::SpeechFailed,
            TurnOutcome::Answered
        ]
    );
    for turn in turns {
        let times = turn.stage_times();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{turn:?}");
    }
    for failed in &turns[..2] {
        assert_eq!(failed.reply, fallback, "{failed:?}");
        assert!(
            failed
                .error
                .as_deref()
                .is_some_and(|e| e.contains("injected")),
            "{failed:?}"
        );
    }
    let last = &turns[2];
    assert!(
        !last.reply.is_empty() && last.reply != fallback && last.error.is_none(),
        "{last:?}"
    );
    // The caller hears the fallback phrase where the first turn's record says.
    let reply = &outcome.reply.audio;
    let start = (turns[0].first_audio_s * SPEECH_RATE as f64) as usize;
    let end = (start + 3 * SPEECH_RATE as usize).min(reply.samples.len());
    let heard = Transcriber::load(&cache)
        .unwrap()
        .transcribe(&reply.samples[start..end])
        .unwrap();
    let wer = word_error_rate(&fallback, &heard);
    assert!(wer < 0.35, "said {fallback:?}, whisper heard {heard:?}");
}

#[test]
fn a_reply_later_than_its_deadline_is_given_up_for_the_fallback() {
    let cache = ModelCache::from_env();
    // No first sentence is ready a millisecond after the end of a turn.
    let config = AgentConfig {
        reply_deadline_s: Some(0.001),
        ..AgentConfig::default()
    };
    let fallback = config.fallback_phrase.clone();
    // make-room's scheduler, whose state shows what is still running.
    let engine = Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig {
            switches: Switches::all(),
            ..PolicyConfig::default()
        }),
        ..EngineConfig::bundled(&cache).unwrap()
    })
    .unwrap();
    let agent = VoiceAgent::with_engine(cache, Arc::new(engine), config);
    let outcome = three_turn_call(&agent);
    let turns = &outcome.turns;
    for turn in turns {
        assert_eq!(turn.outcome, TurnOutcome::Late, "{turn:?}");
        assert_eq!(turn.reply, fallback, "{turn:?}");
        // Transcribed all the same: the failure came after the caller's words were known.
        assert!(!turn.transcript.is_empty(), "{turn:?}");
    }
    // Each given-up request was cancelled in the engine: nothing is left running.
    let in_engine = || {
        let state = agent.engine.scheduler_state();
        state.running + state.waiting
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_engine() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(in_engine(), 0, "{:?}", agent.engine.scheduler_state());
}

/// three_turns.wav through `agent`, turn by turn; its three turns each get a record.
fn three_turn_call(agent: &VoiceAgent) -> CallOutcome {
    let call = read_wav(agent.cache.call("three_turns.wav").unwrap()).unwrap();
    let outcome = agent
        .answer_recording(&call, Pacing::Fast, SPEECH_RATE, &mut Quiet)
        .unwrap();
    println!("{}", sublet_agent::turn_table(&outcome.turns));
    assert_eq!(outcome.turns.len(), 3, "{:#?}", outcome.turns);
    outcome
}
