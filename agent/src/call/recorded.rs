//! One call from a recorded WAV: its audio paced into the turn detector, finished turns
//! answered, the agent's speech laid on the call's timeline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Result;
use sublet_audio::{Audio, SPEECH_RATE};

use super::caller::{CallClock, Caller};
use super::observer::CallObserver;
use crate::playout::Playout;
use crate::record::TurnRecord;
use crate::responder::{AudioOut, SpokenSentence};
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

/// What a call produced.
#[derive(Debug)]
pub struct CallOutcome {
    pub turns: Vec<TurnRecord>,
    pub reply: ReplyTrack,
}

impl VoiceAgent {
    /// Answers a recorded call; the reply track is at `out_rate`.
    ///
    /// In real time the call is a live one ([`VoiceAgent::answer_live`]): its audio is fed
    /// 20 ms at a time as it would be spoken, and a virtual speaker pulls the agent's voice
    /// onto the reply track as it plays, so that preemptive replies and interruptions work
    /// as on a LiveKit call.
    pub fn answer_recording(
        &self,
        call: &Audio,
        pacing: Pacing,
        out_rate: u32,
        observer: &mut dyn CallObserver,
    ) -> Result<CallOutcome> {
        let audio = call.resampled(SPEECH_RATE);
        // A trailing silence long enough for the last turn to end.
        let tail = Audio::silence(self.config.endpoint.max_delay_s + 1.0, SPEECH_RATE);
        let samples: Vec<f32> = audio.samples.iter().chain(&tail.samples).copied().collect();
        match pacing {
            Pacing::Realtime => self.play_live(&samples, out_rate, observer),
            Pacing::Fast => self.play_fast(&samples, out_rate, observer),
        }
    }

    fn play_live(
        &self,
        samples: &[f32],
        out_rate: u32,
        observer: &mut dyn CallObserver,
    ) -> Result<CallOutcome> {
        let playout = Playout::new(out_rate);
        let fed = AtomicBool::new(false);
        let (audio_tx, audio_in) = mpsc::channel::<Vec<f32>>();
        let tick = Duration::from_secs_f64(FRAME as f64 / SPEECH_RATE as f64);
        let started = Instant::now();
        std::thread::scope(|scope| {
            let feeder = scope.spawn(|| {
                for (i, frame) in samples.chunks(FRAME).enumerate() {
                    if let Some(wait) = (tick * i as u32).checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    if audio_tx.send(frame.to_vec()).is_err() {
                        break;
                    }
                }
                drop(audio_tx);
                fed.store(true, Ordering::SeqCst);
            });
            // The speaker: the track gets, at each moment, what the playout gives then.
            let speaker = scope.spawn(|| {
                let mut track = Vec::new();
                let mut piece = Vec::new();
                while !fed.load(Ordering::SeqCst) || playout.pending() {
                    let due = (started.elapsed().as_secs_f64() * out_rate as f64) as usize;
                    piece.resize(due.saturating_sub(track.len()), 0.0);
                    playout.pull(&mut piece);
                    track.extend_from_slice(&piece);
                    std::thread::sleep(tick);
                }
                track
            });
            let turns = self.answer_live(audio_in, &playout, observer);
            feeder.join().expect("the feeder thread");
            let track = speaker.join().expect("the speaker thread");
            Ok(CallOutcome {
                turns: turns?,
                reply: ReplyTrack {
                    audio: Audio::new(track, out_rate),
                },
            })
        })
    }

    /// Each turn answered before the call goes on, on the audio's clock.
    fn play_fast(
        &self,
        samples: &[f32],
        out_rate: u32,
        observer: &mut dyn CallObserver,
    ) -> Result<CallOutcome> {
        let mut responder = self.new_responder()?;
        let mut caller = Caller::new(self, &responder, CallClock::Audio, false)?;
        let mut track = ReplyTrack::new(out_rate);
        let mut turns = Vec::new();
        let mut work = Vec::new();
        for frame in samples.chunks(FRAME) {
            caller.push(frame, observer, &mut |_| {}, &mut |w| {
                work.push(w);
                Ok(())
            })?;
            for w in work.drain(..) {
                if let Some(record) = responder.handle(w, &mut track)? {
                    observer.turn_answered(&record);
                    turns.push(record);
                }
            }
        }
        Ok(CallOutcome {
            turns,
            reply: track,
        })
    }
}
