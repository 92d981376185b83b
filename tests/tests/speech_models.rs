//! The speech models on real audio: each check can fail if its model or its plumbing is wrong.

use sublet_audio::{read_wav, SPEECH_RATE};
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_tts::Voice;
use sublet_turn_detect::{EndpointConfig, SmartTurn, TurnDetector, TurnEvent};

const JFK: &str = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country.";

fn cache() -> ModelCache {
    ModelCache::from_env()
}

fn jfk() -> Vec<f32> {
    let audio = read_wav(cache().jfk_wav().unwrap()).unwrap();
    assert_eq!(audio.rate, SPEECH_RATE);
    audio.samples
}

#[test]
fn whisper_transcribes_jfk() {
    let mut stt = Transcriber::load(&cache()).unwrap();
    let text = stt.transcribe(&jfk()).unwrap();
    let wer = word_error_rate(JFK, &text);
    println!("jfk.wav → {text:?} (WER {wer:.3})");
    assert!(wer < 0.10, "WER {wer:.3}: {text:?}");
}

#[test]
fn a_transcription_told_to_stop_gives_up_and_the_next_one_is_whole() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let mut stt = Transcriber::load(&cache()).unwrap();
    let audio = jfk();
    let started = Instant::now();
    let whole = stt.transcribe_until(&audio, None).unwrap();
    let whole_took = started.elapsed();

    let stop = Arc::new(AtomicBool::new(false));
    let setter = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::Relaxed);
        })
    };
    let started = Instant::now();
    let stopped = stt.transcribe_until(&audio, Some(&stop)).unwrap();
    let stopped_took = started.elapsed();
    setter.join().unwrap();
    println!("whole {whole_took:?}, stopped after {stopped_took:?}");
    assert_eq!(stopped, None, "a stopped transcription gives no text");
    // Whisper itself gave up, rather than the flag being read after it finished.
    assert!(
        stopped_took < whole_took / 2,
        "stopped after {stopped_took:?}; the whole took {whole_took:?}"
    );
    // The transcriber's state is whole again for the next turn.
    let again = stt.transcribe(&audio).unwrap();
    assert_eq!(Some(again), whole);
}

#[test]
fn piper_speech_is_transcribed_back() {
    // The voice samples noise inside the model (VITS), so each synthesis differs and
    // Whisper now and then mishears a word ("weather" → "water"): the median of three
    // syntheses is judged.
    let sentence = "The weather today is sunny with a light breeze from the west.";
    let mut voice = Voice::load(&cache()).unwrap();
    let mut stt = Transcriber::load(&cache()).unwrap();
    let mut wers = Vec::new();
    for _ in 0..3 {
        let speech = voice.synthesize(sentence).unwrap();
        assert_eq!(speech.rate, 22_050);
        assert!(
            speech.duration_s() > 2.0,
            "{} s of speech",
            speech.duration_s()
        );
        let text = stt
            .transcribe(&speech.resampled(SPEECH_RATE).samples)
            .unwrap();
        let wer = word_error_rate(sentence, &text);
        println!("piper → whisper: {text:?} (WER {wer:.3})");
        wers.push(wer);
    }
    wers.sort_by(f64::total_cmp);
    assert!(wers[1] < 0.20, "median WER {:.3} of {wers:?}", wers[1]);
}

#[test]
fn a_slower_prosody_set_on_the_voice_speaks_slower() {
    // A persona's `voice.length_scale` reaches Piper through `Voice::set_prosody`.
    // Piper draws each phoneme's length with noise (the voice's `noise_w`): one reading
    // each gave 3.35 s then 4.35 s once, so the lengths of three readings are compared.
    let mut voice = Voice::load(&cache()).unwrap();
    let text = "Harbour Hotel bookings, good morning. Who am I speaking with?";
    let three = |voice: &mut Voice| -> f64 {
        (0..3)
            .map(|_| voice.synthesize(text).unwrap().duration_s())
            .sum()
    };
    let own = three(&mut voice);
    let mut slower = voice.default_prosody();
    slower.length_scale *= 1.5;
    voice.set_prosody(slower);
    let slow = three(&mut voice);
    let ratio = slow / own;
    assert!((1.3..1.7).contains(&ratio), "{own:.2} s, then {slow:.2} s");
}

#[test]
fn smart_turn_tells_a_finished_sentence_from_a_cut_one() {
    let audio = jfk();
    let mut model = SmartTurn::load(&cache()).unwrap();
    let end = model.probability(&audio).unwrap();
    // Cut inside "ask not what your country | can do for you".
    let cut = (4.1 * SPEECH_RATE as f64) as usize;
    let middle = model.probability(&audio[..cut]).unwrap();
    println!("smart turn: end {end:.3}, mid-sentence {middle:.3}");
    assert!(end > 0.5, "end of utterance scored {end}");
    assert!(middle < 0.5, "mid-sentence scored {middle}");
}

#[test]
fn vad_finds_the_speech_spans_of_a_test_call() {
    let cache = cache();
    let call = read_wav(cache.call("three_turns.wav").unwrap()).unwrap();
    let script: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.call("three_turns.json").unwrap()).unwrap())
            .unwrap();
    let expected: Vec<(f64, f64)> = script["utterances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["start_s"].as_f64().unwrap(), u["end_s"].as_f64().unwrap()))
        .collect();

    let mut detector = TurnDetector::load(&cache, EndpointConfig::default()).unwrap();
    let mut starts = Vec::new();
    let mut stops = Vec::new();
    let mut turns = 0;
    for chunk in call.samples.chunks(320) {
        for event in detector.push(chunk).unwrap() {
            match event {
                TurnEvent::SpeechStarted { at_s } => starts.push(at_s),
                TurnEvent::SpeechStopped { at_s, .. } => stops.push(at_s),
                TurnEvent::EndOfTurn { .. } => turns += 1,
            }
        }
    }
    println!("expected {expected:?}\nstarts {starts:?}\nstops {stops:?}");
    assert_eq!(
        starts.len(),
        expected.len(),
        "one speech span per utterance"
    );
    assert_eq!(stops.len(), expected.len());
    assert_eq!(turns, expected.len());
    for (i, (start, end)) in expected.iter().enumerate() {
        assert!(
            (starts[i] - start).abs() <= 0.1,
            "utterance {i} starts at {start}, found {}",
            starts[i]
        );
        assert!(
            (stops[i] - end).abs() <= 0.1,
            "utterance {i} ends at {end}, found {}",
            stops[i]
        );
    }
}

/// Every event a detector reports while hearing `samples` in 20 ms pushes.
fn events_of(detector: &mut TurnDetector, samples: &[f32]) -> Vec<TurnEvent> {
    samples
        .chunks(320)
        .flat_map(|chunk| detector.push(chunk).unwrap())
        .collect()
}

/// An event without its audio, for messages.
fn brief(event: &TurnEvent) -> String {
    match event {
        TurnEvent::EndOfTurn {
            turn_start_s,
            speech_end_s,
            decided_s,
            audio,
            ..
        } => format!(
            "EndOfTurn {turn_start_s}..{speech_end_s} at {decided_s}, {} samples",
            audio.len()
        ),
        other => format!("{other:?}"),
    }
}

/// A worker keeps detectors between calls: one reset mid-speech hears the next call exactly
/// as a freshly loaded one does.
#[test]
fn a_reset_detector_hears_the_next_call_as_a_new_one() {
    let cache = cache();
    let first = read_wav(cache.call("three_turns.wav").unwrap()).unwrap();
    let next = read_wav(cache.call("quick_questions.wav").unwrap()).unwrap();

    let mut fresh = TurnDetector::load(&cache, EndpointConfig::default()).unwrap();
    let expected = events_of(&mut fresh, &next.samples);
    let turns = |events: &[TurnEvent]| {
        events
            .iter()
            .filter(|e| matches!(e, TurnEvent::EndOfTurn { .. }))
            .count()
    };
    assert!(turns(&expected) >= 2, "the next call has turns");

    // The first call, cut off one second into its second utterance.
    let mut kept = TurnDetector::load(&cache, EndpointConfig::default()).unwrap();
    let mut heard = Vec::new();
    for chunk in first.samples.chunks(320) {
        heard.extend(kept.push(chunk).unwrap());
        let second_started = heard
            .iter()
            .filter_map(|e| match e {
                TurnEvent::SpeechStarted { at_s } => Some(*at_s),
                _ => None,
            })
            .nth(1);
        if second_started.is_some_and(|at_s| kept.position_s() > at_s + 1.0) {
            break;
        }
    }
    assert!(kept.in_turn(), "cut off mid-turn");
    kept.reset(EndpointConfig::default());
    let after_reset = events_of(&mut kept, &next.samples);
    assert!(
        after_reset == expected,
        "after the reset:\n{}\nfresh:\n{}",
        after_reset.iter().map(brief).collect::<Vec<_>>().join("\n"),
        expected.iter().map(brief).collect::<Vec<_>>().join("\n"),
    );
}
