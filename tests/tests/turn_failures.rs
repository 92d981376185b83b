//! A turn's failure is the turn's: a recorded call on the real models with faults injected
//! into chosen turns, and with a reply deadline no reply can meet; a caller who talks for
//! 40 s without a pause is answered at the turn cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sublet_agent::{AgentConfig, CallOutcome, Pacing, Quiet, TurnFaults, TurnOutcome, VoiceAgent};
use sublet_audio::{read_wav, Audio, SPEECH_RATE};
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
        ..EngineConfig::from_cache(&cache).unwrap()
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

#[test]
fn a_monologue_is_answered_at_the_turn_cap_and_its_rest_as_the_next_turn() {
    let cache = ModelCache::from_env();
    // The capped turn's 30 s take Whisper seconds to transcribe beside this binary's other
    // tests on two cores; the reply deadline is not what this test is about.
    let config = AgentConfig {
        reply_deadline_s: Some(30.0),
        ..AgentConfig::default()
    };
    let agent = VoiceAgent::load(cache.clone(), config).unwrap();
    let (call, speech_s) = monologue(&cache, 40.0);
    let outcome = agent
        .answer_recording(&call, Pacing::Fast, SPEECH_RATE, &mut Quiet)
        .unwrap();
    let turns = &outcome.turns;
    println!("{}", sublet_agent::turn_table(turns));
    assert_eq!(turns.len(), 2, "{turns:#?}");
    let (capped, rest) = (&turns[0], &turns[1]);
    // The first turn ended 30 s after the speech began, the caller still speaking.
    assert!(capped.capped, "{capped:?}");
    let cut_s = capped.end_of_turn_s - speech_s.start;
    assert!(
        (29.9..30.5).contains(&cut_s),
        "cut {cut_s:.2} s into the speech"
    );
    // The rest of the speech is the next turn, ended by the caller's real stop.
    assert!(!rest.capped, "{rest:?}");
    assert!((rest.caller_stop_s - speech_s.end).abs() < 0.5, "{rest:?}");
    for turn in turns {
        assert_eq!(turn.outcome, TurnOutcome::Answered, "{turn:?}");
        assert!(!turn.reply.is_empty() && turn.transcript.split_whitespace().count() >= 10);
    }
    // Each turn heard its own part of the monologue: what the first one heard the
    // second did not (its first words are the cap's).
    assert!(
        capped.transcript.split_whitespace().count() > rest.transcript.split_whitespace().count(),
        "{turns:#?}"
    );
}

/// The bundled calls' utterances back to back, 0.1 s apart (too short a gap for the caller
/// to have stopped), until `seconds` of speech, after 1 s of silence and before 5 s.
/// Returns the call and where its speech lies.
fn monologue(cache: &ModelCache, seconds: f64) -> (Audio, std::ops::Range<f64>) {
    let mut utterances = Vec::new();
    for name in [
        "turn_taking",
        "trip_planning",
        "quick_questions",
        "three_turns",
    ] {
        let audio = read_wav(cache.call(&format!("{name}.wav")).unwrap())
            .unwrap()
            .resampled(SPEECH_RATE);
        let spans: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(cache.call(&format!("{name}.json")).unwrap()).unwrap(),
        )
        .unwrap();
        for span in spans["utterances"].as_array().unwrap() {
            let at = |key: &str| (span[key].as_f64().unwrap() * SPEECH_RATE as f64) as usize;
            let piece = Audio::new(
                audio.samples[at("start_s")..at("end_s")].to_vec(),
                SPEECH_RATE,
            );
            utterances.push(piece.trimmed(0.01).samples);
        }
    }
    let rate = SPEECH_RATE as f64;
    let mut samples = vec![0.0; SPEECH_RATE as usize];
    for piece in utterances.iter().cycle() {
        if samples.len() as f64 / rate >= 1.0 + seconds {
            break;
        }
        samples.extend_from_slice(piece);
        samples.extend(std::iter::repeat_n(0.0, SPEECH_RATE as usize / 10));
    }
    let end_s = samples.len() as f64 / rate - 0.1;
    samples.extend(std::iter::repeat_n(0.0, 5 * SPEECH_RATE as usize));
    (Audio::new(samples, SPEECH_RATE), 1.0..end_s)
}
