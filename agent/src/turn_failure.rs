//! A turn's failure is the turn's, not the call's: which stage failed, the faults tests
//! and the soak inject, and the deadline a reply must meet.
//!
//! The responder turns any [`TurnFailure`] into a [`TurnOutcome`] on the turn's record,
//! says `AgentConfig::fallback_phrase` when nothing of the reply was said yet, and listens
//! on; the failed turn leaves the call's history as if it had not been asked.

use std::fmt::Display;

use crate::record::TurnOutcome;

/// Why a turn's reply stopped, and the message for its record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TurnFailure {
    pub outcome: TurnOutcome,
    pub error: String,
}

impl TurnFailure {
    pub fn late(deadline_s: f64) -> Self {
        Self {
            outcome: TurnOutcome::Late,
            error: format!("no first sentence within {deadline_s:.1} s of the end of the turn"),
        }
    }
}

/// Tags a stage's error with the outcome it gives the turn.
pub(crate) trait AtStage<T> {
    fn at(self, outcome: TurnOutcome) -> Result<T, TurnFailure>;
}

impl<T, E: Display> AtStage<T> for Result<T, E> {
    fn at(self, outcome: TurnOutcome) -> Result<T, TurnFailure> {
        self.map_err(|e| TurnFailure {
            outcome,
            error: format!("{e:#}"),
        })
    }
}

/// Turns made to fail at one stage, by their number in the call (1, 2, …): for tests and
/// the soak, which must show a call surviving each fault. Empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnFaults {
    /// The transcriber fails on these turns' audio.
    pub transcript: Vec<usize>,
    /// The engine refuses these turns' requests.
    pub engine: Vec<usize>,
    /// Synthesis fails on these turns' reply sentences.
    pub speech: Vec<usize>,
}

impl TurnFaults {
    /// The injected failure of `turn` at the stage `outcome` names, if one is set.
    pub(crate) fn check(&self, turn: usize, outcome: TurnOutcome) -> Result<(), TurnFailure> {
        let turns = match outcome {
            TurnOutcome::TranscriptFailed => &self.transcript,
            TurnOutcome::EngineFailed => &self.engine,
            TurnOutcome::SpeechFailed => &self.speech,
            TurnOutcome::Answered | TurnOutcome::Late => return Ok(()),
        };
        match turns.contains(&turn) {
            true => Err(TurnFailure {
                outcome,
                error: format!("injected fault in turn {turn}"),
            }),
            false => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_fail_only_their_turn_and_stage() {
        let faults = TurnFaults {
            engine: vec![2],
            ..TurnFaults::default()
        };
        assert!(faults.check(1, TurnOutcome::EngineFailed).is_ok());
        assert!(faults.check(2, TurnOutcome::TranscriptFailed).is_ok());
        let failure = faults.check(2, TurnOutcome::EngineFailed).unwrap_err();
        assert_eq!(failure.outcome, TurnOutcome::EngineFailed);
        assert!(failure.error.contains("turn 2"));
    }

    #[test]
    fn a_stage_error_carries_its_outcome_and_message() {
        let refused: Result<(), String> = Err("prompt too long".into());
        let failure = refused.at(TurnOutcome::EngineFailed).unwrap_err();
        assert_eq!(failure.outcome, TurnOutcome::EngineFailed);
        assert_eq!(failure.error, "prompt too long");
        assert_eq!(TurnFailure::late(8.0).outcome, TurnOutcome::Late);
    }
}
