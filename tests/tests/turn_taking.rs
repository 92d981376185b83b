//! Turn-taking on a live call, driven by recorded speech: a caller who talks over the
//! agent stops it and is answered, a cough does not cut the reply, the agent's own echo
//! neither, and a pause in the middle of a sentence does not end the turn. The caller's audio is fed in real time and
//! a virtual speaker pulls the agent's voice in real time, as a sound card would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sublet_agent::{
    AgentConfig, CallObserver, Interruption, InterruptionOutcome, Playout, TurnRecord, VoiceAgent,
    WordCheck,
};
use sublet_audio::{read_wav, SPEECH_RATE};
use sublet_models::ModelCache;
use sublet_stt::{word_error_rate, Transcriber};
use sublet_turn_detect::{EndpointConfig, LevelGateConfig, TurnDetector, TurnEvent};

const FRAME: usize = SPEECH_RATE as usize / 50;
const TICK: Duration = Duration::from_millis(20);

/// The pieces of `turn_taking.wav`, by their text's first words.
fn utterance(cache: &ModelCache, starts_with: &str) -> Vec<f32> {
    let call = read_wav(cache.call("turn_taking.wav").unwrap()).unwrap();
    let spans: Value = serde_json::from_str(
        &std::fs::read_to_string(cache.call("turn_taking.json").unwrap()).unwrap(),
    )
    .unwrap();
    let span = spans["utterances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["text"].as_str().unwrap().starts_with(starts_with))
        .unwrap();
    let at = |key: &str| (span[key].as_f64().unwrap() * call.rate as f64) as usize;
    call.resampled(SPEECH_RATE).samples[at("start_s")..at("end_s")].to_vec()
}

fn silence(seconds: f64) -> Vec<f32> {
    vec![0.0; (seconds * SPEECH_RATE as f64) as usize]
}

/// What the caller does, in order.
enum Step {
    Say(Vec<f32>),
    /// Silence until the agent has been speaking for this long.
    AfterAgentSpeaks(Duration),
}

#[derive(Default)]
struct Seen {
    turns: Vec<TurnRecord>,
    interruptions: Vec<Interruption>,
}

struct Recorder(Arc<Mutex<Seen>>);

impl CallObserver for Recorder {
    fn turn_answered(&mut self, turn: &TurnRecord) {
        self.0.lock().unwrap().turns.push(turn.clone());
    }
    fn interruption(&mut self, interruption: &Interruption) {
        self.0
            .lock()
            .unwrap()
            .interruptions
            .push(interruption.clone());
    }
}

/// A live call run by `steps`, then `tail_s` of silence.
struct LiveRun {
    seen: Seen,
    /// Each 20 ms the speaker pulled: when, and whether it held the agent's speech.
    played: Vec<(Instant, bool)>,
    /// Everything the speaker played, 16 kHz.
    heard: Vec<f32>,
    /// When each `Say` step's first frame was sent.
    said_at: Vec<Instant>,
    /// What the caller heard of the first reply, by the playout's account.
    heard_first_reply: String,
}

/// The agent's voice heard back in the caller's microphone (a speakerphone's echo).
#[derive(Clone, Copy)]
struct Echo {
    below_db: f64,
    delay: Duration,
}

fn live_call(agent: &VoiceAgent, steps: Vec<Step>, tail_s: f64) -> LiveRun {
    live_call_with(agent, steps, tail_s, None)
}

/// [`live_call`], with the speaker's audio fed back into the caller's frames when `echo`.
fn live_call_with(
    agent: &VoiceAgent,
    steps: Vec<Step>,
    tail_s: f64,
    echo: Option<Echo>,
) -> LiveRun {
    // One call at a time: the tests time the agent in real time on two cores.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let playout = Playout::new(SPEECH_RATE);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let done = AtomicBool::new(false);
    let (audio_tx, audio_in) = mpsc::channel::<Vec<f32>>();
    // Every frame the speaker played, for the echo.
    let speaker_frames = Mutex::new(Vec::<Vec<f32>>::new());
    let (played, heard, said_at) = std::thread::scope(|scope| {
        let speaker = scope.spawn(|| {
            let (mut played, mut heard) = (Vec::new(), Vec::new());
            let mut frame = vec![0.0; FRAME];
            let mut next = Instant::now();
            while !done.load(Ordering::Relaxed) || playout.pending() {
                let spoke = playout.pull(&mut frame);
                played.push((Instant::now(), spoke));
                heard.extend_from_slice(&frame);
                speaker_frames.lock().unwrap().push(frame.clone());
                next += TICK;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            (played, heard)
        });
        let feeder = scope.spawn(|| {
            let mut said_at = Vec::new();
            let mut next = Instant::now();
            let mut sent = 0usize;
            let mut send = |frame: &[f32]| {
                let mut frame = frame.to_vec();
                if let Some(echo) = echo {
                    // The speaker's frame of `delay` ago, `below_db` down.
                    let back = (echo.delay.as_secs_f64() / TICK.as_secs_f64()).round() as usize;
                    let gain = 10f32.powf(-echo.below_db as f32 / 20.0);
                    let speaker = speaker_frames.lock().unwrap();
                    if let Some(played) = sent.checked_sub(back).and_then(|i| speaker.get(i)) {
                        frame
                            .iter_mut()
                            .zip(played)
                            .for_each(|(s, p)| *s += gain * p);
                    }
                }
                sent += 1;
                audio_tx.send(frame).unwrap();
                next += TICK;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            };
            for step in steps {
                match step {
                    Step::Say(audio) => {
                        said_at.push(Instant::now());
                        audio.chunks(FRAME).for_each(&mut send);
                    }
                    Step::AfterAgentSpeaks(wait) => {
                        let quiet = vec![0.0; FRAME];
                        let limit = Instant::now() + Duration::from_secs(30);
                        while !playout.speaking() {
                            assert!(Instant::now() < limit, "the agent never spoke");
                            send(&quiet);
                        }
                        let until = Instant::now() + wait;
                        while Instant::now() < until {
                            send(&quiet);
                        }
                    }
                }
            }
            silence(tail_s).chunks(FRAME).for_each(&mut send);
            drop(audio_tx);
            said_at
        });
        let mut observer = Recorder(seen.clone());
        agent
            .answer_live(audio_in, &playout, &mut observer)
            .expect("the call");
        let said_at = feeder.join().unwrap();
        done.store(true, Ordering::Relaxed);
        let (played, heard) = speaker.join().unwrap();
        (played, heard, said_at)
    });
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    LiveRun {
        seen,
        played,
        heard,
        said_at,
        heard_first_reply: playout.heard(1),
    }
}

fn agent(cache: &ModelCache) -> VoiceAgent {
    VoiceAgent::load(cache.clone(), AgentConfig::default()).unwrap()
}

/// A speakerphone: the agent's reply comes back into the caller's microphone 20 dB down,
/// 150 ms late, while the caller listens. The level gate holds it for someone else's
/// speech (the caller set their level when they asked), so it neither pauses the reply nor
/// becomes a turn; without the gate the detector hears the same echo as speech.
#[test]
fn the_agents_own_echo_neither_interrupts_it_nor_takes_a_turn() {
    let cache = ModelCache::from_env();
    let echo = Some(Echo {
        below_db: 20.0,
        delay: Duration::from_millis(150),
    });
    let steps = || {
        vec![
            Step::Say(utterance(&cache, "Tell me a long story")),
            Step::AfterAgentSpeaks(Duration::from_secs(6)),
        ]
    };
    let mut config = AgentConfig::default();
    config.endpoint.level_gate = Some(LevelGateConfig::default());
    let gated_agent = VoiceAgent::load(cache.clone(), config.clone()).unwrap();
    let gated = live_call_with(&gated_agent, steps(), 3.0, echo);
    eprintln!("gated: turns {:#?}", gated.seen.turns);
    eprintln!("gated: interruptions {:?}", gated.seen.interruptions);
    assert!(gated.seen.interruptions.is_empty());
    assert_eq!(gated.seen.turns.len(), 1);
    let spoke = gated.played.iter().filter(|(_, spoke)| *spoke).count();
    assert!(spoke * 20 >= 6_000, "the reply played {} ms", spoke * 20);

    // The same caller and echo heard by a detector with and without the gate: without it,
    // the echo is speech. (A live call without the gate pauses on its echo and never ends.)
    let question = utterance(&cache, "Tell me a long story");
    let back = (0.15 * SPEECH_RATE as f64) as usize;
    let mut heard = question.clone();
    heard.resize(gated.heard.len() + back, 0.0);
    for (i, &played) in gated.heard.iter().enumerate() {
        heard[i + back] += 0.1 * played;
    }
    let starts_after_question = |config: EndpointConfig| {
        let mut detector = TurnDetector::load(&cache, config).unwrap();
        let asked_s = question.len() as f64 / SPEECH_RATE as f64;
        heard
            .chunks(FRAME)
            .flat_map(|chunk| detector.push(chunk).unwrap())
            .filter(|e| matches!(e, TurnEvent::SpeechStarted { at_s } if *at_s > asked_s + 0.5))
            .count()
    };
    assert_eq!(starts_after_question(config.endpoint.clone()), 0);
    let ungated = EndpointConfig {
        level_gate: None,
        ..EndpointConfig::default()
    };
    assert!(
        starts_after_question(ungated) > 0,
        "without the gate the echo should be heard as speech"
    );
}

#[test]
fn talking_over_the_agent_stops_it_and_gets_an_answer() {
    let cache = ModelCache::from_env();
    let agent = agent(&cache);
    let interruption = utterance(&cache, "Wait, stop.");
    let onset = interruption
        .iter()
        .position(|s| s.abs() > 0.02)
        .unwrap_or(0);
    let run = live_call(
        &agent,
        vec![
            Step::Say(utterance(&cache, "Tell me a long story")),
            Step::AfterAgentSpeaks(Duration::from_millis(800)),
            Step::Say(interruption.clone()),
        ],
        10.0,
    );
    let seen = &run.seen;
    eprintln!("turns: {:#?}", seen.turns);
    eprintln!("interruptions: {:?}", seen.interruptions);
    let cut = seen
        .interruptions
        .iter()
        .find_map(|i| match &i.outcome {
            InterruptionOutcome::Cut { turn, heard } => Some((i, *turn, heard.clone())),
            _ => None,
        })
        .expect("the reply was cut");
    let (event, turn, heard) = cut;
    assert_eq!(turn, 1);
    // Its words came from the transcript its stop takes anyway, not a second one beside it.
    assert_eq!(event.words_checked, Some(WordCheck::EarlyTranscript));
    let reply = &seen.turns[0].reply;
    // The history keeps what was heard: a start of the reply, not all of it.
    let heard_words: Vec<&str> = heard.split_whitespace().collect();
    let reply_words: Vec<&str> = reply.split_whitespace().collect();
    assert!(
        heard_words.len() < reply_words.len(),
        "{heard:?} of {reply:?}"
    );
    assert_eq!(
        heard_words,
        reply_words[..heard_words.len()],
        "{heard:?} of {reply:?}"
    );
    // The agent's audio stopped while the caller was still speaking.
    let spoke_at = run.said_at[1] + Duration::from_secs_f64(onset as f64 / SPEECH_RATE as f64);
    let interruption_ends =
        run.said_at[1] + Duration::from_secs_f64(interruption.len() as f64 / SPEECH_RATE as f64);
    let last_spoken = run
        .played
        .iter()
        .filter(|(at, spoke)| *spoke && *at >= spoke_at && *at < interruption_ends)
        .map(|(at, _)| *at)
        .max();
    let kept_talking = last_spoken.map_or(Duration::ZERO, |at| at + TICK - spoke_at);
    eprintln!(
        "the agent kept talking {:.0} ms after the caller began (rules: speech at {:.2} s, audio stopped at {:.2} s of the caller's audio)",
        kept_talking.as_secs_f64() * 1000.0,
        event.speech_s,
        event.stopped_s
    );
    assert!(kept_talking < interruption_ends - spoke_at);
    // And the interruption was answered as the next turn.
    assert_eq!(seen.turns.len(), 2, "{:?}", seen.turns);
    let wer = word_error_rate(
        "Wait, stop. What is the capital of Italy?",
        &seen.turns[1].transcript,
    );
    assert!(wer < 0.35, "{:?}", seen.turns[1].transcript);
}

/// The caller makes `sound` while the agent tells its story: the reply must not be cut,
/// and the caller hears all of it.
fn sound_over_the_reply(cache: &ModelCache, sound: Vec<f32>) -> LiveRun {
    let agent = agent(cache);
    let run = live_call(
        &agent,
        vec![
            Step::Say(utterance(cache, "Tell me a long story")),
            Step::AfterAgentSpeaks(Duration::from_millis(800)),
            Step::Say(sound),
        ],
        12.0,
    );
    let seen = &run.seen;
    eprintln!("interruptions: {:?}", seen.interruptions);
    assert!(
        !seen
            .interruptions
            .iter()
            .any(|i| matches!(i.outcome, InterruptionOutcome::Cut { .. })),
        "{:?}",
        seen.interruptions
    );
    let reply = &seen.turns[0].reply;
    let words = |text: &str| text.split_whitespace().count();
    assert_eq!(
        words(&run.heard_first_reply),
        words(reply),
        "heard {:?} of {reply:?}",
        run.heard_first_reply
    );
    run
}

#[test]
fn a_cough_does_not_cut_the_reply() {
    let cache = ModelCache::from_env();
    // 250 ms of a cough-like burst: noise under a fast-decaying envelope.
    let mut seed = 12345u32;
    let cough: Vec<f32> = (0..SPEECH_RATE as usize / 4)
        .map(|n| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let noise = (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
            let t = n as f32 / SPEECH_RATE as f32;
            0.5 * noise * (-t * 14.0).exp()
        })
        .collect();
    let run = sound_over_the_reply(&cache, cough);
    // And, by ear: the speaker played the whole reply (the cough made no turn of its own).
    let reply = &run.seen.turns[0].reply;
    let heard = Transcriber::load(&cache)
        .unwrap()
        .transcribe(&run.heard)
        .unwrap();
    let wer = word_error_rate(reply, &heard);
    eprintln!("reply {reply:?}; heard {heard:?} (WER {wer:.3})");
    assert!(wer < 0.35, "heard {heard:?} of {reply:?}");
}

#[test]
fn a_short_word_over_the_agent_only_pauses_it() {
    let cache = ModelCache::from_env();
    // "Oh." (0.33 s): heard as speech, too short to interrupt.
    let interruptions = sound_over_the_reply(&cache, utterance(&cache, "Oh."))
        .seen
        .interruptions;
    assert!(
        interruptions
            .iter()
            .any(|i| i.outcome == InterruptionOutcome::Resumed),
        "the agent never paused: {interruptions:?}"
    );
}

/// "I would like to book" … `pause_s` … "a table for two people tonight.": one turn, whose
/// transcript holds both halves.
fn sentence_with_a_pause(agent: &VoiceAgent, cache: &ModelCache, pause_s: f64) -> TurnRecord {
    let run = live_call(
        agent,
        vec![
            Step::Say(utterance(cache, "I would like to book")),
            Step::Say(silence(pause_s)),
            Step::Say(utterance(cache, "a table for two")),
        ],
        6.0,
    );
    let turns = &run.seen.turns;
    eprintln!("{turns:#?}");
    assert_eq!(turns.len(), 1, "{turns:?}");
    let transcript = turns[0].transcript.to_lowercase();
    assert!(
        transcript.contains("would like") && transcript.contains("table for two"),
        "{transcript:?}"
    );
    turns[0].clone()
}

#[test]
fn a_pause_in_the_middle_of_a_sentence_does_not_end_the_turn() {
    let cache = ModelCache::from_env();
    let mut agent = agent(&cache);
    agent.config.preemptive_generation = false;
    sentence_with_a_pause(&agent, &cache, 1.2);
}

fn preemptive_agent(cache: &ModelCache) -> VoiceAgent {
    let mut agent = agent(cache);
    agent.config.preemptive_generation = true;
    agent
}

#[test]
fn a_reply_started_as_the_caller_stops_is_kept_when_the_turn_ends_there() {
    let cache = ModelCache::from_env();
    let question = || vec![Step::Say(utterance(&cache, "Wait, stop."))];
    let mut agent = agent(&cache);
    agent.config.preemptive_generation = false;
    let without = live_call(&agent, question(), 6.0).seen.turns;
    agent.config.preemptive_generation = true;
    let turns = live_call(&agent, question(), 6.0).seen.turns;
    eprintln!("{turns:#?}");
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert!(turns[0].preemptive);
    assert!(!without[0].preemptive);
    assert!(!turns[0].reply.is_empty());
    eprintln!(
        "voice to voice {:.2} s with the reply started as the caller stopped, {:.2} s without (end of turn {:.2} s after the stop)",
        turns[0].voice_to_voice_s(),
        without[0].voice_to_voice_s(),
        turns[0].stage_latencies()[0]
    );
}

#[test]
fn a_turn_is_transcribed_before_its_stop_is_certain() {
    let cache = ModelCache::from_env();
    // The transcript is started at the first tenth of a second of quiet, before the detector
    // confirms the stop (0.4 s) and scores it; the words after a pause still count.
    let turn = sentence_with_a_pause(&agent(&cache), &cache, 1.2);
    assert!(turn.transcript_ahead, "{turn:?}");
    let mut agent = agent(&cache);
    agent.config.early_transcript = false;
    let question = vec![Step::Say(utterance(&cache, "Wait, stop."))];
    let turns = live_call(&agent, question, 6.0).seen.turns;
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert!(!turns[0].transcript_ahead, "{turns:?}");
}

#[test]
fn a_transcript_started_at_a_breath_is_called_off_when_the_caller_goes_on() {
    let cache = ModelCache::from_env();
    // A fifth of a second between two halves of a sentence: long enough that the turn so
    // far is sent to Whisper (at 0.1 s of quiet), too short for it to be done when the
    // caller goes on. That transcription is called off; the turn's is of the whole.
    let mut agent = agent(&cache);
    agent.config.preemptive_generation = false;
    let turn = sentence_with_a_pause(&agent, &cache, 0.2);
    assert!(turn.transcripts_called_off >= 1, "{turn:?}");
    assert!(turn.transcript_ahead, "{turn:?}");
}

#[test]
fn a_reply_started_at_a_pause_is_cancelled_when_the_caller_goes_on() {
    let cache = ModelCache::from_env();
    let turn = sentence_with_a_pause(&preemptive_agent(&cache), &cache, 1.2);
    // The reply started at the pause was cancelled; the one given answers the whole
    // sentence (itself started when the caller stopped the second time).
    assert_eq!(turn.preemptive_discarded, 1, "{turn:?}");
}

#[test]
fn a_reply_started_at_the_stop_is_ready_to_play_when_an_unsure_turn_ends() {
    let cache = ModelCache::from_env();
    // Half a sentence ("I would like to book", which Whisper hears as "… to work.") waits
    // before its turn ends (its last words hold it open; Smart Turn's score of it swings
    // between 0.5 and 0.9 with the window's last 16 ms): meanwhile the reply's first
    // sentence is made and synthesized, and goes out as the turn ends.
    // The unsure wait is made 2 s here (1.3 s by default): on 2 cores the opening was ready
    // within 50 ms of the default's end, so the test would measure the machine's speed.
    let unfinished = || vec![Step::Say(utterance(&cache, "I would like to book"))];
    let mut preemptive = preemptive_agent(&cache);
    preemptive.config.endpoint.unsure_words_delay_s = Some(2.0);
    let turns = live_call(&preemptive, unfinished(), 6.0).seen.turns;
    eprintln!("{turns:#?}");
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert!(turns[0].preemptive, "{turns:?}");
    assert!(turns[0].opening_ahead, "{turns:?}");
    let mut agent = agent(&cache);
    agent.config.preemptive_generation = false;
    let without = live_call(&agent, unfinished(), 6.0).seen.turns;
    assert!(!without[0].opening_ahead, "{without:?}");
    eprintln!(
        "first audio {:.3} s after the end of the turn with the opening made ahead, {:.3} s without",
        turns[0].first_audio_s - turns[0].end_of_turn_s,
        without[0].first_audio_s - without[0].end_of_turn_s
    );
}
