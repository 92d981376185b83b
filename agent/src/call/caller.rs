//! The caller's side of every call: their audio through the turn detector, the turn
//! transcribed as they stop, and the dispatch rules (`dispatch.rs`) turned into work for
//! the responder and turn hints for the engine. Recorded, microphone and LiveKit calls
//! all hear their caller through this.

use std::time::Instant;

use anyhow::Result;
use sublet_stt::Transcriber;
use sublet_turn_detect::{TurnDetector, TurnEvent, TURN_PAD_S};

use super::observer::CallObserver;
use crate::dispatch::{Coming, ComingHint, Dispatch, DispatchRules, TurnDispatch};
use crate::early_transcript::{same, EarlyTranscript};
use crate::pool::Pooled;
use crate::responder::{FinishedTurn, Responder, TurnHint, TurnWork};
use crate::VoiceAgent;

/// How a call tells time.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CallClock {
    /// Audio arrives as it is spoken; call time is time since this instant.
    Wall(Instant),
    /// Audio arrives as fast as it is read (a recorded call played fast): a turn ends when
    /// the detector decides it, or when its early transcript was ready, if later.
    Audio,
}

/// One caller, heard frame by frame.
pub(crate) struct Caller {
    pub(crate) detector: Pooled<TurnDetector>,
    /// The call loop's Whisper context, on a live call: the interruption checks and
    /// partial transcripts (the early transcripts have a context and thread of their own).
    pub(crate) stt: Option<Pooled<Transcriber>>,
    early: Option<EarlyTranscript>,
    dispatch: TurnDispatch,
    hint: Option<TurnHint>,
    pub(crate) clock: CallClock,
    /// When the last early transcript was ready, in call time (the audio clock).
    early_ready_s: f64,
    /// The last early transcript was started before its stop was decided.
    early_ahead: bool,
    /// When the engine hears that a turn may follow.
    coming: ComingHint,
    /// Quiet at which the early transcript starts (`AgentConfig::early_transcript_after_s`).
    early_after_s: f64,
}

impl Caller {
    /// A caller; `stt_needed` loads the loop's Whisper context (a live call's
    /// interruption checks).
    pub(crate) fn new(
        agent: &VoiceAgent,
        responder: &Responder,
        clock: CallClock,
        stt_needed: bool,
    ) -> Result<Self> {
        let config = &agent.config;
        Ok(Self {
            detector: agent.new_detector()?,
            stt: match stt_needed {
                true => Some(agent.transcriber()?),
                false => None,
            },
            early: match config.early_transcript {
                true => Some(EarlyTranscript::start(agent.transcriber()?)?),
                false => None,
            },
            dispatch: TurnDispatch::new(DispatchRules {
                preemptive: config.preemptive_generation,
                turn_hints: config.turn_hints,
            }),
            hint: config.turn_hints.then(|| responder.turn_hint()),
            clock,
            early_ready_s: 0.0,
            early_ahead: false,
            coming: ComingHint::default(),
            early_after_s: config.early_transcript_after_s,
        })
    }

    /// Feeds 16 kHz samples. Each event goes to `observer` and `seen`, then the work it
    /// calls for to `send`, in order.
    pub(crate) fn push(
        &mut self,
        samples: &[f32],
        observer: &mut dyn CallObserver,
        seen: &mut dyn FnMut(&TurnEvent),
        send: &mut dyn FnMut(TurnWork) -> Result<()>,
    ) -> Result<()> {
        for event in self.detector.push(samples)? {
            observer.turn_event(&event);
            seen(&event);
            self.carry_out(event, send)?;
        }
        self.speculate()
    }

    /// Whether the caller's speech since `since_s` held words, from the early transcript of
    /// that speech up to its latest voiced frame (started now if it was not yet, and waited
    /// for), when the turn began with this speech: `None` when there is no such transcript,
    /// and the caller must transcribe the speech themselves. An interruption's word check
    /// then costs no second transcription of the same audio beside the early one: on a
    /// recorded call that talked over a long reply, the two at once held the detector 0.43 s
    /// behind the caller at the end of the turn.
    pub(crate) fn early_words(&mut self, since_s: f64) -> Result<Option<bool>> {
        let (Some(early), Some(turn_start_s), Some(voiced_until_s)) = (
            self.early.as_mut(),
            self.detector.turn_start_s(),
            self.detector.voiced_until_s(),
        ) else {
            return Ok(None);
        };
        if !same(turn_start_s, since_s) {
            return Ok(None);
        }
        Ok(early
            .text_at(&self.detector, voiced_until_s)?
            .map(|text| !text.trim().is_empty()))
    }

    /// While the caller is in a turn: starts the early transcript once they have been quiet
    /// a moment, before the stop is certain (and calls off one whose stop they spoke past),
    /// and tells the engine a turn may be coming once the quiet lasts the turn's padding.
    fn speculate(&mut self) -> Result<()> {
        let Some(voiced_until_s) = self.detector.voiced_until_s() else {
            return Ok(());
        };
        let now_s = self.detector.position_s();
        let quiet_s = (now_s - voiced_until_s + 1e-9).max(0.0);
        if let Some(early) = self.early.as_mut() {
            early.call_off_before(voiced_until_s);
            if quiet_s >= self.early_after_s {
                early.speculate(&self.detector, voiced_until_s)?;
            }
        }
        // The caller went quiet: the engine clears the way for the turn now, while Whisper
        // transcribes it, and until the turn reaches it. Not while they speak: beside four
        // callers that kept the agents' prompts in small chunks most of the time, and cost
        // them throughput (`docs/benchmarking.md`, runs 33-35).
        let news = self.coming.news(voiced_until_s, quiet_s, now_s, TURN_PAD_S);
        if let (Some(news), Some(hint)) = (news, &self.hint) {
            match news {
                Coming::Told => hint.coming(),
                Coming::Withdrawn => hint.not_coming(),
            }
        }
        Ok(())
    }

    fn carry_out(
        &mut self,
        event: TurnEvent,
        send: &mut dyn FnMut(TurnWork) -> Result<()>,
    ) -> Result<()> {
        let mut early_text = None;
        if let (
            TurnEvent::SpeechStopped {
                at_s, decided_s, ..
            },
            Some(early),
        ) = (&event, self.early.as_mut())
        {
            if let Some(stop) = early.at_stop(&mut self.detector, *at_s)? {
                self.early_ready_s = decided_s + stop.after_decision_s;
                self.early_ahead = stop.ahead;
                early_text = Some(stop.text.to_owned());
            }
        }
        let work = self.dispatch.on_event(&event);
        for step in &work {
            match *step {
                Dispatch::Hint => {
                    if let Some(hint) = &self.hint {
                        hint.send()?;
                    }
                }
                Dispatch::Preempt { speech_end_s } => {
                    // Nothing to answer when the stop's transcript holds no words.
                    let audio = match early_text.as_deref() {
                        Some("") => None,
                        _ => self.detector.turn_audio(speech_end_s),
                    };
                    match audio {
                        Some(audio) => {
                            self.coming.turn_sent(speech_end_s);
                            send(TurnWork::Preempt {
                                audio,
                                transcript: early_text.take(),
                            })?
                        }
                        None => self.dispatch.preempt_failed(),
                    }
                }
                Dispatch::Discard => send(TurnWork::Discard)?,
                Dispatch::Answer => {}
            }
        }
        let TurnEvent::EndOfTurn {
            speech_end_s,
            decided_s,
            end_of_turn_score,
            capped,
            audio,
            ..
        } = event
        else {
            return Ok(());
        };
        if !work.contains(&Dispatch::Answer) {
            return Ok(());
        }
        let transcript = self.early.as_mut().and_then(|e| e.for_turn(speech_end_s));
        let transcripts_called_off = self.early.as_mut().map_or(0, |e| e.take_called_off());
        let transcript_ahead = transcript.is_some() && self.early_ahead;
        let end_of_turn_s = match self.clock {
            CallClock::Wall(started) => started.elapsed().as_secs_f64(),
            CallClock::Audio if transcript.is_some() => decided_s.max(self.early_ready_s),
            CallClock::Audio => decided_s,
        };
        self.coming.turn_sent(speech_end_s);
        send(TurnWork::Answer(FinishedTurn {
            caller_stop_s: speech_end_s,
            end_of_turn_s,
            judged_at: Instant::now(),
            end_of_turn_score,
            capped,
            audio,
            transcript,
            transcript_ahead,
            transcripts_called_off,
        }))
    }
}
