use super::*;

const FRAME: f64 = 0.032;

/// Feeds a probability per frame and returns the events with their frame index.
fn run(ep: &mut Endpointer, probs: &[f32], score: f32) -> Vec<(usize, EndpointEvent)> {
    let mut out = vec![];
    for (i, &p) in probs.iter().enumerate() {
        if let Some(e) = ep.on_frame(i as f64 * FRAME, (i + 1) as f64 * FRAME, p) {
            if matches!(e, EndpointEvent::SpeechStopped { .. }) {
                ep.set_end_of_turn_score(score);
            }
            out.push((i, e));
        }
    }
    out
}

fn frames(spec: &[(f32, usize)]) -> Vec<f32> {
    spec.iter()
        .flat_map(|&(p, n)| std::iter::repeat_n(p, n))
        .collect()
}

/// The end of turn's delay after speech end, with `cue` given at the stop.
fn delay_with_cue(score: f32, cue: Option<TranscriptCue>) -> f64 {
    let mut ep = Endpointer::new(EndpointConfig::default());
    let probs = frames(&[(0.0, 10), (0.9, 50), (0.0, 200)]);
    for (i, &p) in probs.iter().enumerate() {
        match ep.on_frame(i as f64 * FRAME, (i + 1) as f64 * FRAME, p) {
            Some(EndpointEvent::SpeechStopped { at_s, .. }) => {
                ep.set_end_of_turn_score(score);
                if let Some(cue) = cue {
                    ep.set_transcript_cue(at_s + 1.0, TranscriptCue::Neutral); // another stop's
                    ep.set_transcript_cue(at_s, cue);
                }
            }
            Some(EndpointEvent::EndOfTurn {
                decided_s,
                speech_end_s,
                ..
            }) => return decided_s - speech_end_s,
            _ => {}
        }
    }
    panic!("the turn never ended");
}

#[test]
fn a_question_ends_an_unsure_turn_at_the_minimum_delay() {
    let question = delay_with_cue(0.1, Some(TranscriptCue::Question));
    assert!((0.5..0.5 + FRAME).contains(&question), "{question}");
    let no_words = delay_with_cue(0.1, None);
    assert!((3.0..3.0 + FRAME).contains(&no_words), "{no_words}");
}

#[test]
fn plain_words_shorten_an_unsure_wait() {
    let plain = delay_with_cue(0.1, Some(TranscriptCue::Neutral));
    assert!((1.3..1.3 + FRAME).contains(&plain), "{plain}");
    // A number waits as long, however sure the model is.
    let number = delay_with_cue(0.9, Some(TranscriptCue::Number));
    assert!((1.3..1.3 + FRAME).contains(&number), "{number}");
    let trailing = delay_with_cue(0.1, Some(TranscriptCue::Trailing));
    assert!((3.0..3.0 + FRAME).contains(&trailing), "{trailing}");
}

#[test]
fn a_trailing_and_keeps_even_a_confident_turn_open_past_a_pause() {
    // The model sure, the words trailing: longer than a mid-sentence pause (1.2 s),
    // shorter than when both say the caller goes on.
    let trailing = delay_with_cue(0.9, Some(TranscriptCue::Trailing));
    assert!((1.3..1.3 + FRAME).contains(&trailing), "{trailing}");
    let confident = delay_with_cue(0.9, None);
    assert!((0.5..0.5 + FRAME).contains(&confident), "{confident}");
}

#[test]
fn confident_end_waits_the_minimum_delay() {
    let mut ep = Endpointer::new(EndpointConfig::default());
    let probs = frames(&[(0.0, 10), (0.9, 50), (0.0, 200)]);
    let events = run(&mut ep, &probs, 0.9);
    assert_eq!(events.len(), 3, "{events:?}");
    let EndpointEvent::SpeechStarted { at_s } = events[0].1 else {
        panic!()
    };
    assert!((at_s - 10.0 * FRAME).abs() < 1e-9);
    let EndpointEvent::SpeechStopped {
        at_s: stop,
        decided_s,
    } = events[1].1
    else {
        panic!()
    };
    assert!((stop - 60.0 * FRAME).abs() < 1e-9);
    assert!(decided_s - stop >= 0.4 && decided_s - stop < 0.4 + FRAME);
    let EndpointEvent::EndOfTurn {
        decided_s,
        speech_end_s,
        ..
    } = events[2].1
    else {
        panic!()
    };
    assert!(decided_s - speech_end_s >= 0.5 && decided_s - speech_end_s < 0.5 + FRAME);
}

#[test]
fn unsure_end_waits_the_maximum_delay() {
    let mut ep = Endpointer::new(EndpointConfig::default());
    let probs = frames(&[(0.9, 30), (0.0, 200)]);
    let events = run(&mut ep, &probs, 0.1);
    let EndpointEvent::EndOfTurn {
        decided_s,
        speech_end_s,
        ..
    } = events[2].1
    else {
        panic!()
    };
    assert!(decided_s - speech_end_s >= 3.0 && decided_s - speech_end_s < 3.0 + FRAME);
}

#[test]
fn a_pause_followed_by_speech_is_one_turn() {
    let mut ep = Endpointer::new(EndpointConfig::default());
    // 1 s pause (past the stop, before the 3 s maximum), then more speech.
    let probs = frames(&[(0.9, 30), (0.0, 31), (0.9, 30), (0.0, 200)]);
    let events = run(&mut ep, &probs, 0.1);
    let ends: Vec<_> = events
        .iter()
        .filter_map(|(_, e)| match e {
            EndpointEvent::EndOfTurn { turn_start_s, .. } => Some(*turn_start_s),
            _ => None,
        })
        .collect();
    assert_eq!(ends, vec![0.0], "{events:?}");
}

/// Three turns, each with a 0.64 s pause inside, then an unsure stop: how long after
/// the last stop the turn ended.
fn last_unsure_wait(config: EndpointConfig) -> f64 {
    let mut ep = Endpointer::new(config);
    let turn = frames(&[(0.9, 30), (0.0, 20), (0.9, 30), (0.0, 120)]);
    let probs: Vec<f32> = (0..3).flat_map(|_| turn.clone()).collect();
    let events = run(&mut ep, &probs, 0.1);
    let EndpointEvent::EndOfTurn {
        decided_s,
        speech_end_s,
        ..
    } = events.last().unwrap().1
    else {
        panic!("{events:?}")
    };
    decided_s - speech_end_s
}

#[test]
fn dynamic_endpointing_waits_about_as_long_as_the_caller_pauses() {
    let fixed = last_unsure_wait(EndpointConfig::default());
    let dynamic = last_unsure_wait(EndpointConfig {
        dynamic: true,
        ..EndpointConfig::default()
    });
    assert!((fixed - 3.0).abs() < FRAME, "{fixed}");
    // 0.64 s pauses and a 0.5 s margin: about 1.14 s.
    assert!((dynamic - 1.14).abs() < 2.0 * FRAME, "{dynamic}");
}

#[test]
fn dynamic_endpointing_stays_within_the_delays() {
    let mut ep = Endpointer::new(EndpointConfig {
        dynamic: true,
        ..EndpointConfig::default()
    });
    assert_eq!(ep.delay_for(Some(0.1), None), 3.0); // nothing learned yet
    ep.pause_average_s = Some(0.01);
    assert!((ep.delay_for(Some(0.1), None) - 0.51).abs() < 1e-9);
    ep.pause_average_s = Some(9.0);
    assert_eq!(ep.delay_for(Some(0.1), None), 3.0);
    assert_eq!(ep.delay_for(Some(0.9), None), 0.5);
}

#[test]
fn a_blip_shorter_than_the_minimum_is_not_speech() {
    let mut ep = Endpointer::new(EndpointConfig::default());
    let probs = frames(&[(0.9, 2), (0.0, 100)]);
    assert!(run(&mut ep, &probs, 0.9).is_empty());
    assert!(!ep.in_turn());
}

#[test]
fn hysteresis_keeps_speech_through_middling_frames() {
    let mut ep = Endpointer::new(EndpointConfig::default());
    let probs = frames(&[(0.9, 10), (0.4, 40), (0.9, 10), (0.0, 200)]);
    let events = run(&mut ep, &probs, 0.9);
    assert_eq!(events.len(), 3, "{events:?}");
}

#[test]
fn a_turn_that_never_pauses_is_ended_at_the_cap_and_goes_on_as_the_next() {
    let mut ep = Endpointer::new(EndpointConfig::default());
    // 40 s of speech from 0.32 s, then silence.
    let probs = frames(&[(0.0, 10), (0.9, 1250), (0.0, 200)]);
    let events = run(&mut ep, &probs, 0.1);
    let ends: Vec<_> = events
        .iter()
        .filter_map(|(_, e)| match *e {
            EndpointEvent::EndOfTurn {
                turn_start_s,
                speech_end_s,
                decided_s,
                capped,
                ..
            } => Some((turn_start_s, speech_end_s, decided_s, capped)),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 2, "{events:?}");
    let (start, end, decided, capped) = ends[0];
    assert!(capped && (start - 10.0 * FRAME).abs() < 1e-9, "{ends:?}");
    assert!((decided - (start + 30.0)).abs() <= FRAME, "{ends:?}");
    assert!(decided - end <= 2.0 * FRAME, "{ends:?}");
    // The speech that went on is the next turn, from where the first one was cut, to
    // the caller's real stop, ended by the pause as any turn is.
    let (next_start, next_end, _, next_capped) = ends[1];
    assert!(!next_capped && (next_start - end).abs() < 1e-9, "{ends:?}");
    assert!((next_end - 1260.0 * FRAME).abs() < 1e-9, "{ends:?}");
    let started = events
        .iter()
        .filter(|(_, e)| matches!(e, EndpointEvent::SpeechStarted { .. }))
        .count();
    assert_eq!(started, 2, "{events:?}");
}

#[test]
fn a_pause_at_the_cap_ends_the_turn_there_and_no_cap_means_none() {
    // 29.6 s of speech, then quiet: the cap comes before the stop is even decided.
    let probs = frames(&[(0.9, 925), (0.0, 200)]);
    let mut ep = Endpointer::new(EndpointConfig::default());
    let events = run(&mut ep, &probs, 0.1);
    let Some((
        _,
        EndpointEvent::EndOfTurn {
            decided_s, capped, ..
        },
    )) = events.last()
    else {
        panic!("{events:?}")
    };
    assert!(*capped && (*decided_s - 30.0).abs() <= FRAME, "{events:?}");
    assert!(!ep.in_turn());
    // With no cap, a minute of speech is one turn still going on.
    let mut uncapped = Endpointer::new(EndpointConfig {
        max_turn_s: None,
        ..EndpointConfig::default()
    });
    let events = run(&mut uncapped, &frames(&[(0.9, 1900)]), 0.1);
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(uncapped.in_turn());
}
