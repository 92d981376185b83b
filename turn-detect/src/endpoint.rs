//! The turn-taking rules, as plain code: from per-frame speech probabilities and the
//! end-of-turn model's score to speech-started, speech-stopped and end-of-turn events.
//!
//! - Speech starts after `min_speech_s` of frames at or above `activation`.
//! - Speech stops after `min_silence_s` of frames below `deactivation` (hysteresis in between).
//!   This is the moment of the engine's turn hint; the stop is dated at the last speech frame.
//! - The turn ends `min_delay_s` after the speech stopped when the end-of-turn model is
//!   confident (score at or above `end_of_turn_threshold`, 0.8), else `max_delay_s` after
//!   it (LiveKit Agents' endpointing: 0.5 s and 3.0 s). Speech before then continues the turn,
//!   and no turn ends while a new onset is being confirmed.
//! - Dynamic endpointing (optional) adapts the unsure wait to the caller: each pause they
//!   made inside a turn (speech stopped, then resumed before the turn ended) updates a
//!   running average, and an unsure stop waits that average plus `dynamic_margin_s`, kept
//!   between the minimum and the maximum delay. A caller who pauses briefly mid-turn is
//!   answered sooner; one who pauses long is still waited for.
//! - The transcript of the speech so far, when the caller of the rules gives its cue
//!   ([`crate::transcript_cue`]): a question ends the turn at the minimum delay even when
//!   the model is unsure; a trailing "and" or "um" keeps an unsure turn open the full
//!   maximum. Words that neither ask nor trail, with the model unsure, or that end with a
//!   number, end the turn `unsure_words_delay_s` after the stop: the words show no sign of
//!   going on, and on voices it was not trained for the model is unsure of most finished
//!   turns (measured by `cargo xtask latency`). A trailing word against a sure model waits
//!   as long: longer than a mid-sentence pause, since the model hears the voice and not
//!   the words, but not the full maximum, since the transcriber often mishears the very
//!   last word ("boil an egg?" as "… the boy in a").
//! - A turn is capped at `max_turn_s` (30 s) from its start: a caller who never stops (a
//!   monologue, a television behind them) is answered then, with what they said so far,
//!   and the speech that goes on is the next turn. The turn's audio, its transcript and
//!   its prompt stay bounded however long the caller talks.

use crate::level_gate::LevelGateConfig;
use crate::transcript_cue::TranscriptCue;

/// Thresholds and delays, in seconds of audio.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    pub activation: f32,
    pub deactivation: f32,
    pub min_speech_s: f64,
    pub min_silence_s: f64,
    pub min_delay_s: f64,
    pub max_delay_s: f64,
    /// The score at which the model is sure the turn is over (0.8; Pipecat takes 0.5). On
    /// voices it was not trained for its middle scores are near chance: 0.73 at "forty two
    /// dollars and" heard as "… dollar mint." (`cargo xtask latency`, docs/latency.md).
    pub end_of_turn_threshold: f32,
    /// The wait when the model is unsure and the transcript's cue is neutral, when the
    /// words end with a number, or when they trail and the model is sure (`None`:
    /// `max_delay_s`, as with no transcript). Longer than a
    /// mid-sentence pause of 1.2 s (the transcriber can mishear the word that shows the
    /// sentence goes on: "I would like to book" as "… to work."), with no end of turn while
    /// the caller's voice has begun again; shorter than LiveKit's 3 s.
    pub unsure_words_delay_s: Option<f64>,
    /// Adapt the unsure wait to the caller's own pauses.
    pub dynamic: bool,
    /// How much longer than the caller's usual mid-turn pause an unsure stop waits.
    pub dynamic_margin_s: f64,
    /// The weight of the newest pause in the running average.
    pub dynamic_weight: f64,
    /// The longest turn, from its first speech: one still going on then is ended and
    /// answered (`None`: no cap). 30 s is Whisper's window, so the turn is transcribed
    /// in one pass.
    pub max_turn_s: Option<f64>,
    /// Frames well below the caller's own level are not the caller's speech
    /// ([`crate::level_gate`]; `None`: every frame the VAD hears is).
    pub level_gate: Option<LevelGateConfig>,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            activation: 0.5,
            deactivation: 0.35,
            min_speech_s: 0.1,
            min_silence_s: 0.4,
            min_delay_s: 0.5,
            max_delay_s: 3.0,
            end_of_turn_threshold: 0.8,
            unsure_words_delay_s: Some(1.3),
            dynamic: false,
            dynamic_margin_s: 0.5,
            dynamic_weight: 0.3,
            max_turn_s: Some(30.0),
            level_gate: Some(LevelGateConfig::default()),
        }
    }
}

/// What the rules decided on a frame. Times are seconds of audio from the call's start.
#[derive(Debug, Clone, PartialEq)]
pub enum EndpointEvent {
    /// Speech began at `at_s` (the first speech frame's start).
    SpeechStarted { at_s: f64 },
    /// Speech ended at `at_s` (the last speech frame's end); decided at `decided_s`.
    /// The caller of the rules should now score the turn and call
    /// [`Endpointer::set_end_of_turn_score`].
    SpeechStopped { at_s: f64, decided_s: f64 },
    /// The turn that started at `turn_start_s` is over, decided at `decided_s`.
    EndOfTurn {
        turn_start_s: f64,
        speech_end_s: f64,
        decided_s: f64,
        score: Option<f32>,
        /// Ended by the turn cap (`max_turn_s`), not by a pause.
        capped: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Silent,
    /// Frames of likely speech, not yet long enough to count.
    Onset {
        since_s: f64,
    },
    Speaking {
        last_speech_end_s: f64,
    },
    /// Speech stopped; waiting for the end-of-turn delay or for more speech.
    Stopped {
        speech_end_s: f64,
        score: Option<f32>,
        cue: Option<TranscriptCue>,
        onset_s: Option<f64>,
    },
}

/// The rules' state for one caller.
#[derive(Debug, Clone)]
pub struct Endpointer {
    config: EndpointConfig,
    state: State,
    turn_start_s: Option<f64>,
    /// The running average of the caller's pauses inside a turn.
    pause_average_s: Option<f64>,
}

impl Endpointer {
    pub fn new(config: EndpointConfig) -> Self {
        Self {
            config,
            state: State::Silent,
            turn_start_s: None,
            pause_average_s: None,
        }
    }

    /// The running average of the caller's pauses inside a turn, once one was seen.
    pub fn pause_average_s(&self) -> Option<f64> {
        self.pause_average_s
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// True from speech start until the end of the turn.
    pub fn in_turn(&self) -> bool {
        self.turn_start_s.is_some()
    }

    /// The end of the latest speech frame of the speech in progress (or just stopped).
    pub fn voiced_until_s(&self) -> Option<f64> {
        match self.state {
            State::Speaking { last_speech_end_s } => Some(last_speech_end_s),
            State::Stopped { speech_end_s, .. } => Some(speech_end_s),
            State::Silent | State::Onset { .. } => None,
        }
    }

    /// Start of the turn in progress, if any.
    pub fn turn_start_s(&self) -> Option<f64> {
        self.turn_start_s
    }

    /// Feeds the speech probability of the frame `[start_s, end_s)`.
    pub fn on_frame(
        &mut self,
        start_s: f64,
        end_s: f64,
        probability: f32,
    ) -> Option<EndpointEvent> {
        if let Some(capped) = self.cap_reached(end_s) {
            return Some(capped);
        }
        let c = &self.config;
        let speech = probability >= c.activation;
        let silence = probability < c.deactivation;
        match self.state.clone() {
            State::Silent => {
                if speech {
                    self.state = State::Onset { since_s: start_s };
                    return self.confirm_onset(start_s, end_s);
                }
                None
            }
            State::Onset { since_s } => {
                if silence {
                    self.state = State::Silent;
                    return None;
                }
                self.confirm_onset(since_s, end_s)
            }
            State::Speaking { last_speech_end_s } => {
                if !silence {
                    self.state = State::Speaking {
                        last_speech_end_s: end_s,
                    };
                    None
                } else if end_s - last_speech_end_s >= c.min_silence_s {
                    self.state = State::Stopped {
                        speech_end_s: last_speech_end_s,
                        score: None,
                        cue: None,
                        onset_s: None,
                    };
                    Some(EndpointEvent::SpeechStopped {
                        at_s: last_speech_end_s,
                        decided_s: end_s,
                    })
                } else {
                    None
                }
            }
            State::Stopped {
                speech_end_s,
                score,
                cue,
                onset_s,
            } => {
                // Speech again before the turn ended: the same turn goes on.
                let onset_s = match (speech, silence, onset_s) {
                    (true, _, None) => Some(start_s),
                    (_, true, _) => None,
                    (_, _, kept) => kept,
                };
                if let Some(since) = onset_s {
                    if end_s - since >= c.min_speech_s {
                        let weight = c.dynamic_weight;
                        let pause = since - speech_end_s;
                        self.pause_average_s = Some(match self.pause_average_s {
                            Some(average) => weight * pause + (1.0 - weight) * average,
                            None => pause,
                        });
                        self.state = State::Speaking {
                            last_speech_end_s: end_s,
                        };
                        return Some(EndpointEvent::SpeechStarted { at_s: since });
                    }
                }
                self.state = State::Stopped {
                    speech_end_s,
                    score,
                    cue,
                    onset_s,
                };
                // Not while the caller's voice has begun again: it may be the turn going on.
                match onset_s {
                    Some(_) => None,
                    None => self.end_of_turn_due(end_s),
                }
            }
        }
    }

    /// The end-of-turn model's score for the speech that just stopped.
    pub fn set_end_of_turn_score(&mut self, value: f32) {
        if let State::Stopped { score, .. } = &mut self.state {
            *score = Some(value);
        }
    }

    /// The transcript's cue for the speech that stopped at `speech_end_s`; ignored when
    /// the caller has spoken again since (the cue is about older words).
    pub fn set_transcript_cue(&mut self, speech_end_s: f64, value: TranscriptCue) {
        if let State::Stopped {
            speech_end_s: end,
            cue,
            ..
        } = &mut self.state
        {
            if (*end - speech_end_s).abs() < 1e-9 {
                *cue = Some(value);
            }
        }
    }

    /// The delay after speech end the rules wait for a given score and transcript cue
    /// (`None`: not scored, or not transcribed, yet).
    pub fn delay_for(&self, score: Option<f32>, cue: Option<TranscriptCue>) -> f64 {
        let c = &self.config;
        match cue {
            Some(TranscriptCue::Question) => return c.min_delay_s,
            // Both signals say the caller goes on: the longest wait. When the model hears
            // a finished voice, the trailing word is as likely a mishearing of the last
            // word ("boil an egg?" as "the boy in a"): wait past a mid-sentence pause.
            Some(TranscriptCue::Trailing) => {
                return match score {
                    Some(s) if s >= c.end_of_turn_threshold => self.unsure_words_delay_s(),
                    _ => c.max_delay_s,
                }
            }
            Some(TranscriptCue::Number) => return self.unsure_words_delay_s(),
            Some(TranscriptCue::Neutral) | None => {}
        }
        match (score, self.pause_average_s) {
            (Some(s), _) if s >= c.end_of_turn_threshold => c.min_delay_s,
            (Some(_), _) if cue == Some(TranscriptCue::Neutral) => self.unsure_words_delay_s(),
            (_, Some(average)) if c.dynamic => {
                (average + c.dynamic_margin_s).clamp(c.min_delay_s, c.max_delay_s)
            }
            _ => c.max_delay_s,
        }
    }

    /// The wait for plain words the model is unsure of, within the delays' bounds.
    fn unsure_words_delay_s(&self) -> f64 {
        let c = &self.config;
        c.unsure_words_delay_s
            .unwrap_or(c.max_delay_s)
            .clamp(c.min_delay_s, c.max_delay_s)
    }

    fn confirm_onset(&mut self, since_s: f64, end_s: f64) -> Option<EndpointEvent> {
        if end_s - since_s + 1e-9 < self.config.min_speech_s {
            return None;
        }
        self.state = State::Speaking {
            last_speech_end_s: end_s,
        };
        if self.turn_start_s.is_none() {
            self.turn_start_s = Some(since_s);
        }
        Some(EndpointEvent::SpeechStarted { at_s: since_s })
    }

    /// Ends the turn in progress when it has reached the cap by `now_s`. Speech still going
    /// on (or an onset being confirmed) becomes the onset of the next turn, confirmed on
    /// the frames that follow as any onset is, so none of the caller's words are dropped.
    fn cap_reached(&mut self, now_s: f64) -> Option<EndpointEvent> {
        let (Some(max_turn_s), Some(turn_start_s)) = (self.config.max_turn_s, self.turn_start_s)
        else {
            return None;
        };
        if now_s + 1e-9 < turn_start_s + max_turn_s {
            return None;
        }
        let (speech_end_s, score, next) = match self.state {
            State::Speaking { last_speech_end_s } => (
                last_speech_end_s,
                None,
                State::Onset {
                    since_s: last_speech_end_s,
                },
            ),
            State::Stopped {
                speech_end_s,
                score,
                onset_s,
                ..
            } => (
                speech_end_s,
                score,
                match onset_s {
                    Some(since_s) => State::Onset { since_s },
                    None => State::Silent,
                },
            ),
            State::Silent | State::Onset { .. } => return None,
        };
        self.state = next;
        self.turn_start_s = None;
        Some(EndpointEvent::EndOfTurn {
            turn_start_s,
            speech_end_s,
            decided_s: now_s,
            score,
            capped: true,
        })
    }

    fn end_of_turn_due(&mut self, now_s: f64) -> Option<EndpointEvent> {
        let State::Stopped {
            speech_end_s,
            score,
            cue,
            ..
        } = self.state
        else {
            return None;
        };
        if now_s + 1e-9 < speech_end_s + self.delay_for(score, cue) {
            return None;
        }
        self.state = State::Silent;
        let turn_start_s = self.turn_start_s.take().unwrap_or(speech_end_s);
        Some(EndpointEvent::EndOfTurn {
            turn_start_s,
            speech_end_s,
            decided_s: now_s,
            score,
            capped: false,
        })
    }
}

#[cfg(test)]
mod tests;
