//! Turn dispatch: what a call sends its responder as turn events arrive (pure rules).
//!
//! Every call (recorded, microphone, LiveKit) runs these rules, so that hints, preemptive
//! replies and their cancellation happen the same way everywhere:
//!
//! - **speech stopped**: with preemptive generation, start the reply now ([`Dispatch::Preempt`]);
//!   its request reaches the engine at voice priority, so it also tells make-room a turn
//!   is coming. Without it, send the one-token turn hint ([`Dispatch::Hint`]), if hints are on.
//! - **speech started** while a reply is held: the caller went on, cancel it
//!   ([`Dispatch::Discard`]).
//! - **end of turn**: answer ([`Dispatch::Answer`]), with the held reply when there is one.
//!   When no reply is held and the turn was decided [`HINT_AGAIN_AFTER_S`] or more after the
//!   stop (an unsure stop waits up to 3 s, longer than a hint holds), hint again first.
//!
//! A held reply is spoken only if it answers the words the turn ended with
//! ([`held_reply_stands`]).

use sublet_turn_detect::TurnEvent;

/// A turn decided this long after the caller stopped gets a second hint: the engine holds
/// for less than that after the first, and a second hint sent sooner only competes with the
/// first (measured: sure turns' first token 0.3 s → 0.9 s).
pub const HINT_AGAIN_AFTER_S: f64 = 1.0;

/// Which of the rules' optional parts a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispatchRules {
    /// Start the reply as the caller stops (`AgentConfig::preemptive_generation`).
    pub preemptive: bool,
    /// Send the engine turn hints (`AgentConfig::turn_hints`).
    pub turn_hints: bool,
}

/// Work for the responder (or the engine's hint), in the order it is due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dispatch {
    /// Send the call's one-token turn hint.
    Hint,
    /// Transcribe the turn up to `speech_end_s` and start its reply, held until the turn ends.
    Preempt { speech_end_s: f64 },
    /// Cancel the held reply: the caller went on.
    Discard,
    /// The turn is over: answer it.
    Answer,
}

/// The rules' state for one call.
#[derive(Debug, Clone)]
pub struct TurnDispatch {
    rules: DispatchRules,
    /// A reply was started for the turn in progress.
    preempted: bool,
}

impl TurnDispatch {
    pub fn new(rules: DispatchRules) -> Self {
        Self {
            rules,
            preempted: false,
        }
    }

    /// The work `event` calls for, in order.
    pub fn on_event(&mut self, event: &TurnEvent) -> Vec<Dispatch> {
        match *event {
            TurnEvent::SpeechStopped { at_s, .. } if self.rules.preemptive => {
                self.preempted = true;
                vec![Dispatch::Preempt { speech_end_s: at_s }]
            }
            TurnEvent::SpeechStopped { .. } if self.rules.turn_hints => vec![Dispatch::Hint],
            TurnEvent::SpeechStopped { .. } => Vec::new(),
            TurnEvent::SpeechStarted { .. } if self.preempted => {
                self.preempted = false;
                vec![Dispatch::Discard]
            }
            TurnEvent::SpeechStarted { .. } => Vec::new(),
            TurnEvent::EndOfTurn {
                speech_end_s,
                decided_s,
                ..
            } => {
                let held = std::mem::take(&mut self.preempted);
                let waited_s = decided_s - speech_end_s;
                match self.rules.turn_hints && !held && waited_s >= HINT_AGAIN_AFTER_S {
                    true => vec![Dispatch::Hint, Dispatch::Answer],
                    false => vec![Dispatch::Answer],
                }
            }
        }
    }

    /// The preempted reply could not be started (no audio, no words): nothing is held.
    pub fn preempt_failed(&mut self) {
        self.preempted = false;
    }
}

/// A quiet caller is told to the engine again this often while their turn has not reached
/// it: well inside make-room's hold on a `coming` (1.2 s by default), so that the agents'
/// steps stay small until the turn arrives however long its transcript takes.
pub const COMING_AGAIN_AFTER_S: f64 = 0.5;

/// Quiet beyond this is no turn on its way (the longest end-of-turn wait is 3 s): the
/// engine is told no more.
pub const COMING_AT_MOST_S: f64 = 3.0;

/// What to tell the engine of a caller's quiet ([`ComingHint::news`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coming {
    /// Their turn may be coming: the engine keeps its steps small (`CallLine::turn_coming`).
    Told,
    /// They speak again before their turn was sent: the turn told of is not coming, and
    /// the agents' steps need not stay small for it (`CallLine::turn_not_coming`).
    Withdrawn,
}

/// When to tell the engine that a quiet caller's turn may be coming (pure rules; the
/// engine's side is `Scheduler::turn_coming`): once the quiet lasts the turn's padding,
/// then every [`COMING_AGAIN_AFTER_S`] until the turn's request is sent (a preemptive
/// reply or the answer: from then on the request itself keeps the steps small), the caller
/// speaks again (then the engine hears so), or the quiet passes [`COMING_AT_MOST_S`].
/// Told once only, a hold that ran out while Whisper still transcribed let an agent's full
/// prompt chunk start just before the turn arrived, and the turn waited for it.
#[derive(Debug, Clone, Default)]
pub struct ComingHint {
    /// The stop (the end of its speech) last told, and when (call time).
    told: Option<(f64, f64)>,
    /// The stop whose turn has reached the engine.
    sent_for: Option<f64>,
}

impl ComingHint {
    /// What to tell the engine now, if anything: the caller's speech ended at
    /// `voiced_until_s` and they have been quiet `quiet_s` at call time `now_s`; `pad_s` is
    /// the quiet from which a turn may be coming.
    pub fn news(
        &mut self,
        voiced_until_s: f64,
        quiet_s: f64,
        now_s: f64,
        pad_s: f64,
    ) -> Option<Coming> {
        if let Some((stop, _)) = self.told {
            let spoke_past = voiced_until_s > stop && self.sent_for != Some(stop);
            if spoke_past && quiet_s < pad_s {
                self.told = None;
                return Some(Coming::Withdrawn);
            }
        }
        if quiet_s < pad_s || quiet_s > COMING_AT_MOST_S || self.sent_for == Some(voiced_until_s) {
            return None;
        }
        let due = match self.told {
            Some((stop, at_s)) if stop == voiced_until_s => now_s - at_s >= COMING_AGAIN_AFTER_S,
            _ => true,
        };
        if due {
            self.told = Some((voiced_until_s, now_s));
        }
        due.then_some(Coming::Told)
    }

    /// The turn after the speech that ended at `speech_end_s` went to the engine.
    pub fn turn_sent(&mut self, speech_end_s: f64) {
        self.sent_for = Some(speech_end_s);
    }
}

/// Whether a reply started at the stop still answers the turn: its transcript is the one
/// the turn ended with (compared as words, ignoring case and punctuation). Without a final
/// transcript the held one is the turn's.
pub fn held_reply_stands(held: &str, final_transcript: Option<&str>) -> bool {
    let words = |text: &str| -> Vec<String> {
        text.split_whitespace()
            .map(|w| {
                w.chars()
                    .filter(|c| c.is_alphanumeric())
                    .flat_map(char::to_lowercase)
                    .collect::<String>()
            })
            .filter(|w| !w.is_empty())
            .collect()
    };
    final_transcript.is_none_or(|text| words(text) == words(held))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(at_s: f64) -> TurnEvent {
        TurnEvent::SpeechStopped {
            at_s,
            decided_s: at_s + 0.4,
            end_of_turn_score: 0.2,
        }
    }

    fn started(at_s: f64) -> TurnEvent {
        TurnEvent::SpeechStarted { at_s }
    }

    fn end_of_turn(speech_end_s: f64, decided_s: f64) -> TurnEvent {
        TurnEvent::EndOfTurn {
            turn_start_s: 0.0,
            speech_end_s,
            decided_s,
            end_of_turn_score: Some(0.2),
            capped: false,
            audio: Vec::new(),
        }
    }

    const ALL: DispatchRules = DispatchRules {
        preemptive: true,
        turn_hints: true,
    };
    const HINTS: DispatchRules = DispatchRules {
        preemptive: false,
        turn_hints: true,
    };

    #[test]
    fn without_options_a_turn_is_only_answered() {
        let mut dispatch = TurnDispatch::new(DispatchRules::default());
        assert!(dispatch.on_event(&started(0.0)).is_empty());
        assert!(dispatch.on_event(&stopped(2.0)).is_empty());
        assert_eq!(
            dispatch.on_event(&end_of_turn(2.0, 5.0)),
            vec![Dispatch::Answer]
        );
    }

    #[test]
    fn a_stop_hints_and_an_unsure_end_hints_again() {
        let mut dispatch = TurnDispatch::new(HINTS);
        assert_eq!(dispatch.on_event(&stopped(2.0)), vec![Dispatch::Hint]);
        // Decided soon after the stop: the first hint still holds.
        assert_eq!(
            dispatch.on_event(&end_of_turn(2.0, 2.5)),
            vec![Dispatch::Answer]
        );
        dispatch.on_event(&stopped(8.0));
        assert_eq!(
            dispatch.on_event(&end_of_turn(8.0, 11.0)),
            vec![Dispatch::Hint, Dispatch::Answer]
        );
    }

    #[test]
    fn a_preempted_reply_is_discarded_when_the_caller_goes_on() {
        let mut dispatch = TurnDispatch::new(ALL);
        assert_eq!(
            dispatch.on_event(&stopped(2.0)),
            vec![Dispatch::Preempt { speech_end_s: 2.0 }]
        );
        assert_eq!(dispatch.on_event(&started(2.8)), vec![Dispatch::Discard]);
        // Speech again with nothing held: nothing to cancel.
        assert!(dispatch.on_event(&started(3.0)).is_empty());
        assert_eq!(
            dispatch.on_event(&stopped(4.0)),
            vec![Dispatch::Preempt { speech_end_s: 4.0 }]
        );
        // The held reply serves as the hint, even after a long wait.
        assert_eq!(
            dispatch.on_event(&end_of_turn(4.0, 7.0)),
            vec![Dispatch::Answer]
        );
        // The next turn starts with nothing held.
        assert!(dispatch.on_event(&started(9.0)).is_empty());
    }

    #[test]
    fn a_failed_preempt_holds_nothing() {
        let mut dispatch = TurnDispatch::new(ALL);
        dispatch.on_event(&stopped(2.0));
        dispatch.preempt_failed();
        assert!(dispatch.on_event(&started(2.5)).is_empty());
        dispatch.on_event(&stopped(4.0));
        dispatch.preempt_failed();
        assert_eq!(
            dispatch.on_event(&end_of_turn(4.0, 7.0)),
            vec![Dispatch::Hint, Dispatch::Answer]
        );
    }

    #[test]
    fn a_quiet_caller_is_told_again_until_the_turn_is_sent() {
        let mut coming = ComingHint::default();
        let news = |c: &mut ComingHint, quiet: f64| c.news(2.0, quiet, 2.0 + quiet, 0.25);
        assert_eq!(news(&mut coming, 0.1), None, "a breath is no turn");
        assert_eq!(news(&mut coming, 0.25), Some(Coming::Told));
        assert_eq!(news(&mut coming, 0.5), None, "told 0.25 s ago");
        assert_eq!(
            news(&mut coming, 0.8),
            Some(Coming::Told),
            "the hold would run out: told again"
        );
        coming.turn_sent(2.0);
        assert_eq!(
            news(&mut coming, 1.5),
            None,
            "the request holds the steps now"
        );
        // The caller spoke again after the turn was sent: nothing to withdraw.
        assert_eq!(coming.news(3.0, 0.0, 3.0, 0.25), None);
        // ... and stopped: a new stop is told, and told again.
        assert_eq!(coming.news(4.0, 0.3, 4.3, 0.25), Some(Coming::Told));
        assert_eq!(coming.news(4.0, 0.9, 4.9, 0.25), Some(Coming::Told));
        assert_eq!(
            coming.news(4.0, 3.2, 7.2, 0.25),
            None,
            "no turn comes after 3 s of quiet"
        );
    }

    #[test]
    fn a_caller_who_speaks_again_withdraws_the_turn_told_of() {
        let mut coming = ComingHint::default();
        assert_eq!(coming.news(2.0, 0.3, 2.3, 0.25), Some(Coming::Told));
        // A pause mid-sentence: speech again, past the stop told of.
        assert_eq!(coming.news(2.5, 0.0, 2.5, 0.25), Some(Coming::Withdrawn));
        assert_eq!(coming.news(2.7, 0.0, 2.7, 0.25), None, "withdrawn once");
        assert_eq!(coming.news(2.7, 0.3, 3.0, 0.25), Some(Coming::Told));
    }

    #[test]
    fn a_held_reply_stands_only_for_the_same_words() {
        assert!(held_reply_stands("What is two plus two?", None));
        assert!(held_reply_stands(
            "What is two plus two?",
            Some("what is two plus two")
        ));
        assert!(!held_reply_stands(
            "What is two plus",
            Some("What is two plus two?")
        ));
        assert!(!held_reply_stands("I would like to book", Some("")));
    }
}
