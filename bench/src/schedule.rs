//! The order of a run's rounds (pure).
//!
//! This machine's speed drifts by a third over minutes (a shared host), so a figure that
//! compares two rounds compares two moments too. Hence: a pair's two rounds run back to
//! back with the same seed, every second pair on first; and a number of callers' voice-alone
//! time (the SLO's turns) is split into rounds before, between and after its pairs, so that
//! every pair is held to an SLO measured on both sides of it: from the same stretch of the
//! run, whichever way the machine drifts while the pair runs.

use std::time::Duration;

use crate::figures::{AGENTS_ALONE, MAKE_ROOM_OFF, MAKE_ROOM_ON, VOICE_ALONE};

/// What a run asks for, per number of callers.
#[derive(Debug, Clone)]
pub struct RunShape {
    /// One entry per number of callers: the count, its pairs of rounds beside the agents,
    /// their rounds' window, and its voice-alone time in minutes (split into one round more
    /// than it has pairs).
    pub counts: Vec<CallerCount>,
    /// The agents-alone round's window, minutes (0: none).
    pub agents_alone_minutes: f64,
    /// The first pair's seed; each later pair of a count adds its index.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallerCount {
    pub callers: usize,
    pub pairs: usize,
    /// The window of each of its pairs' rounds, minutes.
    pub minutes: f64,
    pub alone_minutes: f64,
}

/// One round of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundStep {
    pub condition: &'static str,
    pub seed: Option<u64>,
    pub callers: usize,
    pub window: Duration,
}

/// The rounds in order: for each number of callers, fewest first, its pairs, each between
/// two voice-alone rounds, the count's voice-alone time split evenly over them (all of it
/// in one round when the count has no pairs); an agents-alone round (the first pair's
/// sessions, no callers) before the run's first pair.
pub fn rounds(shape: &RunShape) -> Vec<RoundStep> {
    let mut counts = shape.counts.clone();
    counts.sort_by_key(|c| c.callers);
    let minutes = |m: f64| Duration::from_secs_f64(m * 60.0);
    let mut steps = Vec::new();
    for count in &counts {
        let alone = RoundStep {
            condition: VOICE_ALONE,
            seed: None,
            callers: count.callers,
            window: minutes(count.alone_minutes / (count.pairs + 1) as f64),
        };
        steps.push(alone);
        for r in 0..count.pairs {
            if shape.agents_alone_minutes > 0.0 && !steps.iter().any(|s| s.callers == 0) {
                steps.push(RoundStep {
                    condition: AGENTS_ALONE,
                    seed: Some(shape.seed),
                    callers: 0,
                    window: minutes(shape.agents_alone_minutes),
                });
            }
            let seed = Some(shape.seed + r as u64);
            let order = match r % 2 {
                0 => [MAKE_ROOM_OFF, MAKE_ROOM_ON],
                _ => [MAKE_ROOM_ON, MAKE_ROOM_OFF],
            };
            for condition in order {
                steps.push(RoundStep {
                    condition,
                    seed,
                    callers: count.callers,
                    window: minutes(count.minutes),
                });
            }
            steps.push(alone);
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(agents_alone_minutes: f64) -> RunShape {
        RunShape {
            counts: vec![
                CallerCount {
                    callers: 4,
                    pairs: 1,
                    minutes: 1.5,
                    alone_minutes: 1.0,
                },
                CallerCount {
                    callers: 2,
                    pairs: 2,
                    minutes: 2.0,
                    alone_minutes: 1.5,
                },
            ],
            agents_alone_minutes,
            seed: 7,
        }
    }

    fn names(steps: &[RoundStep]) -> Vec<(usize, &'static str, Option<u64>, u64)> {
        steps
            .iter()
            .map(|s| (s.callers, s.condition, s.seed, s.window.as_secs()))
            .collect()
    }

    #[test]
    fn each_pair_runs_between_two_shares_of_the_voice_alone_time() {
        assert_eq!(
            names(&rounds(&shape(2.0))),
            [
                (2, VOICE_ALONE, None, 30),
                (0, AGENTS_ALONE, Some(7), 120),
                (2, MAKE_ROOM_OFF, Some(7), 120),
                (2, MAKE_ROOM_ON, Some(7), 120),
                (2, VOICE_ALONE, None, 30),
                (2, MAKE_ROOM_ON, Some(8), 120),
                (2, MAKE_ROOM_OFF, Some(8), 120),
                (2, VOICE_ALONE, None, 30),
                (4, VOICE_ALONE, None, 30),
                (4, MAKE_ROOM_OFF, Some(7), 90),
                (4, MAKE_ROOM_ON, Some(7), 90),
                (4, VOICE_ALONE, None, 30),
            ]
        );
    }

    #[test]
    fn a_count_without_pairs_has_its_voice_alone_time_in_one_round() {
        let mut shape = shape(0.0);
        shape.counts[1].pairs = 0;
        assert_eq!(
            names(&rounds(&shape)),
            [
                (2, VOICE_ALONE, None, 90),
                (4, VOICE_ALONE, None, 30),
                (4, MAKE_ROOM_OFF, Some(7), 90),
                (4, MAKE_ROOM_ON, Some(7), 90),
                (4, VOICE_ALONE, None, 30),
            ]
        );
    }
}
