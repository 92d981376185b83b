//! The mechanism around the rules: frames audio for the VAD, keeps the audio of the turn in
//! progress, runs Smart Turn when speech stops, and hands out the turn's audio at its end.

use anyhow::Result;
use sublet_models::ModelCache;

use crate::endpoint::{EndpointConfig, EndpointEvent, Endpointer};
use crate::level_gate::LevelGate;
use crate::smart_turn::{SmartTurn, WINDOW_S};
use crate::vad::{SileroVad, VAD_FRAME};

const RATE: f64 = 16_000.0;
/// Audio kept before the detected start of speech and after its end, for the transcriber.
pub const TURN_PAD_S: f64 = 0.25;

/// A turn-taking event. Times are seconds of audio from the call's start.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEvent {
    SpeechStarted {
        at_s: f64,
    },
    /// The caller stopped speaking at `at_s` (decided at `decided_s`): the turn-hint moment.
    SpeechStopped {
        at_s: f64,
        decided_s: f64,
        end_of_turn_score: f32,
    },
    /// The caller's turn is over; `audio` holds it at 16 kHz, padded slightly on both sides.
    EndOfTurn {
        turn_start_s: f64,
        speech_end_s: f64,
        decided_s: f64,
        end_of_turn_score: Option<f32>,
        /// Ended by the turn cap while the caller still spoke (`EndpointConfig::max_turn_s`).
        capped: bool,
        audio: Vec<f32>,
    },
}

/// Turn detection for one caller's 16 kHz audio stream.
pub struct TurnDetector {
    vad: SileroVad,
    smart_turn: SmartTurn,
    rules: Endpointer,
    /// Frames well below the caller's level dropped, when the configuration asks.
    gate: Option<LevelGate>,
    /// Samples not yet a whole VAD frame.
    pending: Vec<f32>,
    /// Recent audio; `history[0]` is sample number `history_start` of the call.
    history: Vec<f32>,
    history_start: usize,
    /// Samples consumed by the VAD so far.
    consumed: usize,
}

impl TurnDetector {
    pub fn load(cache: &ModelCache, config: EndpointConfig) -> Result<Self> {
        Ok(Self {
            vad: SileroVad::load(cache)?,
            smart_turn: SmartTurn::load(cache)?,
            gate: config.level_gate.clone().map(LevelGate::new),
            rules: Endpointer::new(config),
            pending: Vec::with_capacity(VAD_FRAME),
            history: Vec::new(),
            history_start: 0,
            consumed: 0,
        })
    }

    /// The same models ready for a new call under `config`: nothing heard yet. Loading
    /// takes ONNX Runtime a fraction of a CPU second; a worker keeps detectors between calls.
    pub fn reset(&mut self, config: EndpointConfig) {
        self.vad.reset();
        self.gate = config.level_gate.clone().map(LevelGate::new);
        self.rules = Endpointer::new(config);
        self.pending.clear();
        self.history.clear();
        self.history_start = 0;
        self.consumed = 0;
    }

    /// Seconds of audio consumed so far.
    pub fn position_s(&self) -> f64 {
        self.consumed as f64 / RATE
    }

    pub fn in_turn(&self) -> bool {
        self.rules.in_turn()
    }

    /// The end of the caller's latest speech frame, while they speak (or just stopped).
    pub fn voiced_until_s(&self) -> Option<f64> {
        self.rules.voiced_until_s()
    }

    /// When the turn in progress began (its first speech), while there is one.
    pub fn turn_start_s(&self) -> Option<f64> {
        self.rules.turn_start_s()
    }

    /// Feeds 16 kHz samples of any length; returns the events they caused, in order.
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<TurnEvent>> {
        let mut events = Vec::new();
        self.pending.extend_from_slice(samples);
        let whole = self.pending.len() / VAD_FRAME * VAD_FRAME;
        let frames: Vec<f32> = self.pending.drain(..whole).collect();
        for frame in frames.chunks_exact(VAD_FRAME) {
            let mut probability = self.vad.process(frame)?;
            let kept = self.history.len();
            self.history.extend_from_slice(frame);
            if let Some(gate) = &mut self.gate {
                // Someone else's speech: not a turn, and turned down for the models after.
                let gated = gate.frame(frame, RATE, probability);
                probability = gated.probability;
                LevelGate::apply(&mut self.history[kept..], gated.gain);
            }
            let start_s = self.consumed as f64 / RATE;
            self.consumed += VAD_FRAME;
            let end_s = self.consumed as f64 / RATE;
            if let Some(event) = self.rules.on_frame(start_s, end_s, probability) {
                events.push(self.handle(event)?);
            }
            self.trim_history();
        }
        Ok(events)
    }

    fn handle(&mut self, event: EndpointEvent) -> Result<TurnEvent> {
        Ok(match event {
            EndpointEvent::SpeechStarted { at_s } => TurnEvent::SpeechStarted { at_s },
            EndpointEvent::SpeechStopped { at_s, decided_s } => {
                let heard = self.audio_between(decided_s - WINDOW_S as f64, decided_s);
                let score = self.smart_turn.probability(&heard)?;
                self.rules.set_end_of_turn_score(score);
                TurnEvent::SpeechStopped {
                    at_s,
                    decided_s,
                    end_of_turn_score: score,
                }
            }
            EndpointEvent::EndOfTurn {
                turn_start_s,
                speech_end_s,
                decided_s,
                score,
                capped,
            } => TurnEvent::EndOfTurn {
                turn_start_s,
                speech_end_s,
                decided_s,
                end_of_turn_score: score,
                capped,
                audio: self.audio_between(turn_start_s - TURN_PAD_S, speech_end_s + TURN_PAD_S),
            },
        })
    }

    /// The transcript's cue for the speech that stopped at `speech_end_s` (see
    /// [`Endpointer::set_transcript_cue`]).
    pub fn set_transcript_cue(&mut self, speech_end_s: f64, cue: crate::TranscriptCue) {
        self.rules.set_transcript_cue(speech_end_s, cue);
    }

    /// The audio of the turn in progress up to speech that ended at `speech_end_s`, padded
    /// as the end-of-turn event's is: for work that starts before the turn is over.
    pub fn turn_audio(&self, speech_end_s: f64) -> Option<Vec<f32>> {
        let start_s = self.rules.turn_start_s()?;
        Some(self.audio_between(start_s - TURN_PAD_S, speech_end_s + TURN_PAD_S))
    }

    /// The kept audio between two call times (clipped to what is kept).
    fn audio_between(&self, from_s: f64, to_s: f64) -> Vec<f32> {
        let to_index = |s: f64| {
            ((s.max(0.0) * RATE) as usize)
                .saturating_sub(self.history_start)
                .min(self.history.len())
        };
        self.history[to_index(from_s)..to_index(to_s)].to_vec()
    }

    /// Outside a turn only the last Smart Turn window is needed.
    fn trim_history(&mut self) {
        let keep = (WINDOW_S as f64 * RATE) as usize;
        if !self.rules.in_turn() && self.history.len() > 2 * keep {
            let drop = self.history.len() - keep;
            self.history.drain(..drop);
            self.history_start += drop;
        }
    }
}
