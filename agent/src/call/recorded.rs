//! One call from a recorded WAV: its audio paced into the turn detector, finished turns
//! answered, the agent's speech laid on the call's timeline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
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

/// The agent's own voice heard back in the caller's microphone (a speakerphone), for a
/// recording played in real time: its reply track `delay_s` late, `below_db` down.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Echo {
    pub below_db: f64,
    pub delay_s: f64,
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
        self.answer_recording_with(call, pacing, out_rate, None, observer)
    }

    /// [`VoiceAgent::answer_recording`], the agent's voice echoed into the call when
    /// `echo` (in real time only: an echo needs the reply as it plays).
    pub fn answer_recording_with(
        &self,
        call: &Audio,
        pacing: Pacing,
        out_rate: u32,
        echo: Option<Echo>,
        observer: &mut dyn CallObserver,
    ) -> Result<CallOutcome> {
        let audio = call.resampled(SPEECH_RATE);
        // A trailing silence long enough for the last turn to end.
        let tail = Audio::silence(self.config.endpoint.max_delay_s + 1.0, SPEECH_RATE);
        let samples: Vec<f32> = audio.samples.iter().chain(&tail.samples).copied().collect();
        match (pacing, echo) {
            (Pacing::Realtime, _) => self.play_live(&samples, out_rate, echo, observer),
            (Pacing::Fast, None) => self.play_fast(&samples, out_rate, observer),
            (Pacing::Fast, Some(_)) => bail!("an echo needs the call played in real time"),
        }
    }

    fn play_live(
        &self,
        samples: &[f32],
        out_rate: u32,
        echo: Option<Echo>,
        observer: &mut dyn CallObserver,
    ) -> Result<CallOutcome> {
        let playout = Playout::new(out_rate);
        let answered = AtomicBool::new(false);
        let (audio_tx, audio_in) = mpsc::channel::<Vec<f32>>();
        let tick = Duration::from_secs_f64(FRAME as f64 / SPEECH_RATE as f64);
        let started = Instant::now();
        // The reply track as it has played so far.
        let track = Mutex::new(Vec::<f32>::new());
        std::thread::scope(|scope| {
            let feeder = scope.spawn(|| {
                for (i, frame) in samples.chunks(FRAME).enumerate() {
                    if let Some(wait) = (tick * i as u32).checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    let mut frame = frame.to_vec();
                    if let Some(echo) = echo {
                        let played = track.lock().unwrap_or_else(|e| e.into_inner());
                        add_echo(&mut frame, i * FRAME, &played, out_rate, echo);
                    }
                    if audio_tx.send(frame).is_err() {
                        break;
                    }
                }
                drop(audio_tx);
            });
            // The speaker: the track gets, at each moment, what the playout gives then, until
            // the call is over and what is queued has played. Queued speech left paused
            // (the caller spoke over it at the end) has no one left to resume it.
            let speaker = scope.spawn(|| {
                let mut piece = Vec::new();
                while !answered.load(Ordering::SeqCst) || playout.speaking() {
                    let due = (started.elapsed().as_secs_f64() * out_rate as f64) as usize;
                    {
                        let mut track = track.lock().unwrap_or_else(|e| e.into_inner());
                        piece.resize(due.saturating_sub(track.len()), 0.0);
                        playout.pull(&mut piece);
                        track.extend_from_slice(&piece);
                    }
                    std::thread::sleep(tick);
                }
            });
            let turns = self.answer_live(audio_in, &playout, observer);
            answered.store(true, Ordering::SeqCst);
            feeder.join().expect("the feeder thread");
            speaker.join().expect("the speaker thread");
            let track = std::mem::take(&mut *track.lock().unwrap_or_else(|e| e.into_inner()));
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

/// Adds to `frame` (16 kHz, starting `at` samples into the call) the reply track
/// (`played`, at `rate`) as it was `echo.delay_s` before, `echo.below_db` down.
fn add_echo(frame: &mut [f32], at: usize, played: &[f32], rate: u32, echo: Echo) {
    let gain = 10f64.powf(-echo.below_db / 20.0) as f32;
    for (j, sample) in frame.iter_mut().enumerate() {
        let t = (at + j) as f64 / SPEECH_RATE as f64 - echo.delay_s;
        if t < 0.0 {
            continue;
        }
        if let Some(&back) = played.get((t * rate as f64) as usize) {
            *sample += gain * back;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_echo_is_the_reply_late_and_down() {
        let echo = Echo {
            below_db: 20.0,
            delay_s: 0.01,
        };
        // The reply at 16 kHz: 0.5 from the 100th sample on.
        let played: Vec<f32> = (0..400).map(|i| if i >= 100 { 0.5 } else { 0.0 }).collect();
        let mut frame = vec![0.0; FRAME];
        add_echo(&mut frame, 0, &played, SPEECH_RATE, echo);
        // 10 ms (160 samples) late: nothing before sample 260, a tenth of it from there.
        assert!(frame[..260].iter().all(|&s| s == 0.0));
        assert!(frame[260..].iter().all(|&s| (s - 0.05).abs() < 1e-6));
        // Past what has played, nothing.
        let mut later = vec![0.0; FRAME];
        add_echo(&mut later, 10 * FRAME, &played, SPEECH_RATE, echo);
        assert!(later.iter().all(|&s| s == 0.0));
    }
}
