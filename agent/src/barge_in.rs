//! When the caller talks over the agent, as plain rules (LiveKit Agents' conventions, with
//! the pause moved to the start of the speech so that the agent falls silent at once):
//!
//! - The moment the caller starts speaking over the agent, its audio pauses.
//! - Speech that ends before `min_speech_s` (a cough, a "mm") resumes the reply at once;
//!   nothing is cut or cancelled.
//! - When that speech stops, or `false_interruption_timeout_s` after the pause, its words
//!   are checked: words confirm the interruption (the reply is cut, its generation
//!   cancelled, and the history keeps only what was heard); no words make it a false
//!   interruption, and the reply resumes where it paused.

/// The interruption rules' settings.
#[derive(Debug, Clone, PartialEq)]
pub struct InterruptionConfig {
    /// Whether the caller can interrupt the agent at all.
    pub enabled: bool,
    /// How long the caller must speak over the agent to interrupt it; shorter speech only
    /// pauses it.
    pub min_speech_s: f64,
    /// Pause the agent as soon as the caller starts speaking (else only after
    /// `min_speech_s`, so the agent talks on for that long).
    pub pause_at_speech_start: bool,
    /// Pause first and resume if the speech held no words; off: cut at once.
    pub resume_false_interruptions: bool,
    /// How long a pause waits for the interrupting speech to end before checking it.
    pub false_interruption_timeout_s: f64,
}

impl Default for InterruptionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_speech_s: 0.5,
            pause_at_speech_start: true,
            resume_false_interruptions: true,
            false_interruption_timeout_s: 2.0,
        }
    }
}

/// The caller's speech in progress, on the call's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallerSpeech {
    /// When it began.
    pub started_s: f64,
    /// The end of its latest voiced frame: how long it has really lasted, not counting the
    /// silence the detector waits before it calls the speech stopped.
    pub voiced_until_s: f64,
}

impl CallerSpeech {
    fn duration_s(&self) -> f64 {
        self.voiced_until_s - self.started_s
    }
}

/// What the rules ask of the call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BargeInAction {
    /// Stop the agent's audio now, keeping it to resume.
    Pause,
    /// Transcribe the caller's speech since `since_s` and report whether it held words.
    CheckWords { since_s: f64 },
    /// A false interruption: play on from where the audio paused.
    Resume,
    /// A real interruption: cut the reply, cancel its generation.
    Cut,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Listening,
    /// The agent's audio is paused for speech that began at `speech_s`; `long` once that
    /// speech has lasted the minimum.
    Paused {
        speech_s: f64,
        paused_s: f64,
        long: bool,
    },
    /// Waiting for the word check asked for.
    Checking {
        speech_s: f64,
    },
    /// Settled for the speech that began at `speech_s`: it cannot interrupt again.
    Settled {
        speech_s: f64,
    },
}

/// The rules' state for one call.
#[derive(Debug, Clone)]
pub struct BargeIn {
    config: InterruptionConfig,
    state: State,
}

impl BargeIn {
    pub fn new(config: InterruptionConfig) -> Self {
        Self {
            config,
            state: State::Listening,
        }
    }

    /// True from a pause until the interruption is settled either way.
    pub fn pending(&self) -> bool {
        matches!(self.state, State::Paused { .. } | State::Checking { .. })
    }

    /// One step at call time `now_s`: `caller` is the caller's speech in progress (`None`
    /// while they are silent), `agent_speaking` whether the agent's audio is playing.
    pub fn on_frame(
        &mut self,
        now_s: f64,
        caller: Option<CallerSpeech>,
        agent_speaking: bool,
    ) -> Option<BargeInAction> {
        let caller_speech_s = caller.map(|c| c.started_s);
        let long = caller.is_some_and(|c| c.duration_s() + 1e-9 >= self.config.min_speech_s);
        if let State::Settled { speech_s } = self.state {
            if caller_speech_s == Some(speech_s) {
                return None;
            }
            self.state = State::Listening;
        }
        match self.state {
            State::Settled { .. } => None,
            State::Listening => {
                let speech_s = caller_speech_s?;
                if !self.config.enabled || !agent_speaking {
                    return None;
                }
                if long && !self.config.resume_false_interruptions {
                    self.state = State::Settled { speech_s };
                    return Some(BargeInAction::Cut);
                }
                if !long && !self.config.pause_at_speech_start {
                    return None;
                }
                self.state = State::Paused {
                    speech_s,
                    paused_s: now_s,
                    long,
                };
                Some(BargeInAction::Pause)
            }
            State::Paused {
                speech_s,
                paused_s,
                long: long_was,
            } => {
                let stopped = caller_speech_s != Some(speech_s);
                let long_now = long && !stopped;
                if !long_was {
                    if stopped {
                        // Too short to interrupt: a cough.
                        self.state = State::Settled { speech_s };
                        return Some(BargeInAction::Resume);
                    }
                    if !long_now {
                        return None;
                    }
                    if !self.config.resume_false_interruptions {
                        self.state = State::Settled { speech_s };
                        return Some(BargeInAction::Cut);
                    }
                    self.state = State::Paused {
                        speech_s,
                        paused_s: now_s,
                        long: true,
                    };
                    return None;
                }
                let waited = now_s - paused_s >= self.config.false_interruption_timeout_s;
                if stopped || waited {
                    self.state = State::Checking { speech_s };
                    return Some(BargeInAction::CheckWords { since_s: speech_s });
                }
                None
            }
            State::Checking { .. } => None,
        }
    }

    /// The answer to [`BargeInAction::CheckWords`].
    pub fn on_words(&mut self, words: bool) -> Option<BargeInAction> {
        let State::Checking { speech_s } = self.state else {
            return None;
        };
        self.state = State::Settled { speech_s };
        Some(if words {
            BargeInAction::Cut
        } else {
            BargeInAction::Resume
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs 20 ms frames from `from_s` to `to_s` with the caller speaking from `speech_s`
    /// until `speech_end_s`, and returns the actions with their times.
    fn run(
        rules: &mut BargeIn,
        speech: (f64, f64),
        agent_speaking: bool,
        to_s: f64,
    ) -> Vec<(f64, BargeInAction)> {
        let mut actions = Vec::new();
        let mut now = 0.0;
        while now < to_s {
            now += 0.02;
            let speaking = (now >= speech.0 && now < speech.1).then_some(CallerSpeech {
                started_s: speech.0,
                voiced_until_s: now,
            });
            if let Some(action) = rules.on_frame(now, speaking, agent_speaking) {
                actions.push(((now * 100.0).round() / 100.0, action));
            }
        }
        actions
    }

    #[test]
    fn speech_over_the_agent_pauses_it_at_once_and_words_cut_it() {
        let mut rules = BargeIn::new(InterruptionConfig::default());
        let actions = run(&mut rules, (1.0, 2.5), true, 3.0);
        assert_eq!(actions[0], (1.0, BargeInAction::Pause));
        assert_eq!(
            actions[1],
            (2.5, BargeInAction::CheckWords { since_s: 1.0 })
        );
        assert_eq!(rules.on_words(true), Some(BargeInAction::Cut));
        assert!(!rules.pending());
    }

    #[test]
    fn a_cough_only_pauses_the_agent_for_its_length() {
        let mut rules = BargeIn::new(InterruptionConfig::default());
        assert_eq!(
            run(&mut rules, (1.0, 1.3), true, 3.0),
            vec![(1.0, BargeInAction::Pause), (1.3, BargeInAction::Resume)]
        );
        assert!(!rules.pending());
    }

    #[test]
    fn without_pausing_at_the_start_a_cough_changes_nothing() {
        let mut rules = BargeIn::new(InterruptionConfig {
            pause_at_speech_start: false,
            ..InterruptionConfig::default()
        });
        assert!(run(&mut rules, (1.0, 1.3), true, 3.0).is_empty());
        let actions = run(
            &mut BargeIn::new(rules.config.clone()),
            (1.0, 2.5),
            true,
            3.0,
        );
        assert_eq!(actions[0], (1.5, BargeInAction::Pause));
    }

    #[test]
    fn only_voiced_time_counts_toward_an_interruption() {
        // 0.3 s of voice, then the detector's 0.4 s of silence before it calls it stopped:
        // still a cough.
        let mut rules = BargeIn::new(InterruptionConfig::default());
        let voiced = |now: f64| {
            Some(CallerSpeech {
                started_s: 1.0,
                voiced_until_s: now.min(1.3),
            })
        };
        assert_eq!(
            rules.on_frame(1.1, voiced(1.1), true),
            Some(BargeInAction::Pause)
        );
        assert_eq!(rules.on_frame(1.6, voiced(1.6), true), None);
        assert_eq!(rules.on_frame(1.7, None, true), Some(BargeInAction::Resume));
    }

    #[test]
    fn speech_while_the_agent_is_silent_is_no_interruption() {
        let mut rules = BargeIn::new(InterruptionConfig::default());
        assert!(run(&mut rules, (1.0, 3.0), false, 3.5).is_empty());
    }

    #[test]
    fn speech_without_words_resumes_the_reply() {
        let mut rules = BargeIn::new(InterruptionConfig::default());
        run(&mut rules, (1.0, 1.8), true, 2.0);
        assert_eq!(rules.on_words(false), Some(BargeInAction::Resume));
        assert!(!rules.pending());
    }

    #[test]
    fn long_speech_is_checked_at_the_timeout_and_interrupts_once() {
        let mut rules = BargeIn::new(InterruptionConfig::default());
        let actions = run(&mut rules, (1.0, 9.0), true, 5.0);
        assert_eq!(
            actions,
            vec![
                (1.0, BargeInAction::Pause),
                (3.5, BargeInAction::CheckWords { since_s: 1.0 })
            ]
        );
        // No words (a long noise): the reply resumes, and the same noise does not pause it
        // again; new speech can.
        assert_eq!(rules.on_words(false), Some(BargeInAction::Resume));
        let speech = |started_s, voiced_until_s| {
            Some(CallerSpeech {
                started_s,
                voiced_until_s,
            })
        };
        assert_eq!(rules.on_frame(5.0, speech(1.0, 5.0), true), None);
        assert_eq!(
            rules.on_frame(6.0, speech(5.5, 6.0), true),
            Some(BargeInAction::Pause)
        );
    }

    #[test]
    fn without_resuming_the_reply_is_cut_at_once_and_switched_off_never() {
        let mut cut = BargeIn::new(InterruptionConfig {
            resume_false_interruptions: false,
            ..InterruptionConfig::default()
        });
        assert_eq!(
            run(&mut cut, (1.0, 2.0), true, 2.5),
            vec![(1.0, BargeInAction::Pause), (1.5, BargeInAction::Cut)]
        );
        let mut off = BargeIn::new(InterruptionConfig {
            enabled: false,
            ..InterruptionConfig::default()
        });
        assert!(run(&mut off, (1.0, 3.0), true, 3.5).is_empty());
    }
}
