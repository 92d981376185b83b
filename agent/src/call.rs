//! One call from a recorded WAV: its audio paced into the turn detector, finished turns
//! answered, the agent's speech laid on the call's timeline.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use sublet_audio::{Audio, SPEECH_RATE};
use sublet_turn_detect::TurnEvent;

use crate::record::TurnRecord;
use crate::responder::{AudioOut, FinishedTurn, SpokenSentence, TurnHint};
use crate::VoiceAgent;

/// How fast the recorded call is played in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// As a live caller would: audio arrives in real time while the agent works.
    Realtime,
    /// As fast as the machine allows; each turn is answered before the call goes on and its
    /// stages are timed from its end of turn, so the latencies are the same work's.
    Fast,
}

/// Audio frames fed to the detector: 20 ms, as a WebRTC track delivers them.
const FRAME: usize = SPEECH_RATE as usize / 50;

/// The agent's side of a call as one track at a fixed rate.
#[derive(Debug, Clone)]
pub struct ReplyTrack {
    pub audio: Audio,
}

impl ReplyTrack {
    pub fn new(rate: u32) -> Self {
        Self {
            audio: Audio::new(Vec::new(), rate),
        }
    }
}

impl AudioOut for ReplyTrack {
    fn play(&mut self, at_s: f64, sentence: &SpokenSentence) {
        let audio = sentence.audio.resampled(self.audio.rate);
        let start = (at_s * self.audio.rate as f64).round().max(0.0) as usize;
        let samples = &mut self.audio.samples;
        if samples.len() < start + audio.samples.len() {
            samples.resize(start + audio.samples.len(), 0.0);
        }
        for (s, a) in samples[start..].iter_mut().zip(&audio.samples) {
            *s += a;
        }
    }
}

struct Shared(Arc<Mutex<ReplyTrack>>);

impl AudioOut for Shared {
    fn play(&mut self, at_s: f64, sentence: &SpokenSentence) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .play(at_s, sentence);
    }
}

/// What a call produced.
#[derive(Debug)]
pub struct CallOutcome {
    pub turns: Vec<TurnRecord>,
    pub reply: ReplyTrack,
}

/// Something that wants to hear about a call as it goes (progress output, a live view).
pub trait CallObserver: Send {
    fn turn_event(&mut self, _event: &TurnEvent) {}
    fn turn_answered(&mut self, _turn: &TurnRecord) {}
    /// The caller talked over the agent (a live call).
    fn interruption(&mut self, _interruption: &crate::live::Interruption) {}
    /// What the caller has said so far of the turn in progress (a live call, when
    /// `AgentConfig::partial_transcripts_s` is set).
    fn partial_transcript(&mut self, _text: &str) {}
}

/// Observes nothing.
pub struct Quiet;
impl CallObserver for Quiet {}

impl VoiceAgent {
    /// Answers a recorded call; the reply track is at `out_rate`.
    pub fn answer_recording(
        &self,
        call: &Audio,
        pacing: Pacing,
        out_rate: u32,
        observer: &mut dyn CallObserver,
    ) -> Result<CallOutcome> {
        let audio = call.resampled(SPEECH_RATE);
        let mut detector = self.new_detector()?;
        let responder = self.new_responder()?;
        let hint = self.config.turn_hints.then(|| responder.turn_hint());
        let mut early = self.new_early_transcript()?;
        // When the last early transcript was ready, in call time (fast pacing does not wait
        // for it, so a turn cannot end before it).
        let mut early_ready_s = 0.0;
        let track = Arc::new(Mutex::new(ReplyTrack::new(out_rate)));
        // A trailing silence long enough for the last turn to end.
        let tail = Audio::silence(self.config.endpoint.max_delay_s + 1.0, SPEECH_RATE);
        let samples: Vec<f32> = audio.samples.iter().chain(&tail.samples).copied().collect();

        let (turns_tx, turns_rx) = mpsc::channel::<FinishedTurn>();
        let (records_tx, records_rx) = mpsc::channel::<Result<Option<TurnRecord>>>();
        let started = Instant::now();
        std::thread::scope(|scope| -> Result<Vec<TurnRecord>> {
            // Realtime: a second thread answers while the audio keeps coming.
            let mut inline_responder = match pacing {
                Pacing::Realtime => {
                    let mut out = Shared(track.clone());
                    let mut responder = responder;
                    scope.spawn(move || {
                        for turn in turns_rx {
                            let _ = records_tx.send(responder.respond(turn, &mut out));
                        }
                    });
                    None
                }
                Pacing::Fast => {
                    drop(records_tx);
                    Some(responder)
                }
            };
            let mut records = Vec::new();
            for (i, frame) in samples.chunks(FRAME).enumerate() {
                if pacing == Pacing::Realtime {
                    let due = Duration::from_secs_f64((i * FRAME) as f64 / SPEECH_RATE as f64);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                for event in detector.push(frame)? {
                    observer.turn_event(&event);
                    if let (
                        TurnEvent::SpeechStopped {
                            at_s, decided_s, ..
                        },
                        Some(early),
                    ) = (&event, early.as_mut())
                    {
                        let started = Instant::now();
                        early.at_stop(&mut detector, *at_s)?;
                        early_ready_s = decided_s + started.elapsed().as_secs_f64();
                    }
                    // At speech-stopped, and again when an unsure stop's end of turn is
                    // decided: the hint holds less urgent prefill only for a moment.
                    let hint_now = match &event {
                        TurnEvent::SpeechStopped { .. } => true,
                        TurnEvent::EndOfTurn {
                            speech_end_s,
                            decided_s,
                            ..
                        } => TurnHint::again_at_end_of_turn(decided_s - speech_end_s),
                        _ => false,
                    };
                    if let (true, Some(hint)) = (hint_now, &hint) {
                        hint.send()?;
                    }
                    let TurnEvent::EndOfTurn {
                        speech_end_s,
                        decided_s,
                        end_of_turn_score,
                        audio,
                        ..
                    } = event
                    else {
                        continue;
                    };
                    let transcript = early.as_mut().and_then(|e| e.for_turn(speech_end_s));
                    let end_of_turn_s = match pacing {
                        Pacing::Realtime => started.elapsed().as_secs_f64(),
                        Pacing::Fast => match transcript {
                            Some(_) => decided_s.max(early_ready_s),
                            None => decided_s,
                        },
                    };
                    let turn = FinishedTurn {
                        caller_stop_s: speech_end_s,
                        end_of_turn_s,
                        judged_at: Instant::now(),
                        end_of_turn_score,
                        audio,
                        transcript,
                    };
                    match inline_responder.as_mut() {
                        None => turns_tx.send(turn)?,
                        Some(responder) => {
                            let mut out = Shared(track.clone());
                            if let Some(record) = responder.respond(turn, &mut out)? {
                                observer.turn_answered(&record);
                                records.push(record);
                            }
                        }
                    }
                }
                while let Ok(result) = records_rx.try_recv() {
                    if let Some(record) = result? {
                        observer.turn_answered(&record);
                        records.push(record);
                    }
                }
            }
            drop(turns_tx);
            for result in records_rx {
                if let Some(record) = result? {
                    observer.turn_answered(&record);
                    records.push(record);
                }
            }
            Ok(records)
        })
        .map(|turns| CallOutcome {
            turns,
            reply: Arc::try_unwrap(track)
                .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
                .unwrap_or_else(|shared| shared.lock().unwrap().clone()),
        })
    }
}
