//! Every figure of a bench report, computed from its rounds' records only (turns, agent
//! calls, engine samples), so that a report can be checked by recomputing it.

use serde::{Deserialize, Serialize};

use crate::stats::{slo_from_voice_alone, summarize, AgentCallRecord, Summary, VoiceTurn};

/// The condition names, as rounds and reports spell them.
pub const VOICE_ALONE: &str = "voice alone";
pub const MAKE_ROOM_OFF: &str = "make-room off";
pub const MAKE_ROOM_ON: &str = "make-room on";

/// KV use counts as "at the budget" from this share of it up, or whenever a request
/// waits for room (the next in line does not fit in what is left).
pub const AT_BUDGET_SHARE: f64 = 0.9;

/// The engine's state at one moment of a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds from the round's start.
    pub t_s: f64,
    pub kv_used_tokens: usize,
    pub kv_budget_tokens: usize,
    pub running: usize,
    pub waiting: usize,
    /// make-room's counters since the engine started (they only grow).
    pub kv_preemptions: u64,
    pub growth_preemptions: u64,
    pub held_request_steps: u64,
    /// Holds skipped because a request had been held its limit of steps in a row.
    #[serde(default)]
    pub hold_releases: u64,
    pub prefill_chunks: u64,
    pub hints_seen: u64,
    /// Voice turns whose hold ended at their first sentence, before the token window's end.
    #[serde(default)]
    pub first_sentence_releases: u64,
}

/// One round's records: what every figure is computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub condition: String,
    /// The agent sessions' seed (none: voice alone, or a trace file).
    pub seed: Option<u64>,
    pub duration_s: f64,
    pub turns: Vec<VoiceTurn>,
    pub agent_calls: Vec<AgentCallRecord>,
    pub samples: Vec<Sample>,
}

/// What the engine's samples show of a round's agent window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvFigures {
    /// Share of the window's samples with KV at the budget: use ≥ [`AT_BUDGET_SHARE`] of
    /// it, or a request waiting because it does not fit.
    pub at_budget_share: f64,
    /// Mean KV use over the window, as a share of the budget.
    pub mean_use: f64,
    /// What make-room's counters grew by during the round.
    pub kv_preemptions: u64,
    pub growth_preemptions: u64,
    pub held_request_steps: u64,
    #[serde(default)]
    pub hold_releases: u64,
    pub prefill_chunks: u64,
    pub hints_seen: u64,
    #[serde(default)]
    pub first_sentence_releases: u64,
}

/// One round's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundFigures {
    pub condition: String,
    pub seed: Option<u64>,
    pub summary: Summary,
    pub kv: KvFigures,
}

/// A pair of neighbouring rounds with the same seed, make-room off and on (in either order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairRatios {
    pub seed: Option<u64>,
    /// p95 voice to voice without make-room over with it (higher: make-room helps more).
    pub p95_voice_to_voice_off_over_on: f64,
    /// The agents' output-token throughput with make-room over without it.
    pub agent_throughput_on_over_off: f64,
}

/// All the rounds of one condition together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionFigures {
    pub condition: String,
    pub rounds: usize,
    /// The rounds' turns and agent calls pooled; the agents' throughput is per second of
    /// all the rounds' windows together.
    pub summary: Summary,
    /// Mean of the rounds' shares.
    pub kv_at_budget_share: f64,
    /// Each stage's mean over the answered turns (end of turn, transcript, first token,
    /// first sentence, first audio), seconds.
    pub stage_means_s: [f64; 5],
}

/// Every figure of a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// The voice-alone rounds' p95 voice to voice plus a quarter second.
    pub slo_s: f64,
    pub rounds: Vec<RoundFigures>,
    pub conditions: Vec<ConditionFigures>,
    pub pairs: Vec<PairRatios>,
}

/// The figures of `rounds`, whose agents ran for `window_s` seconds each.
pub fn figures(rounds: &[RoundRecord], window_s: f64) -> Figures {
    let voice_alone: Vec<VoiceTurn> = of_condition(rounds, VOICE_ALONE)
        .flat_map(|r| r.turns.iter().cloned())
        .collect();
    let slo_s = slo_from_voice_alone(&voice_alone);
    let round_figures: Vec<RoundFigures> = rounds
        .iter()
        .map(|r| RoundFigures {
            condition: r.condition.clone(),
            seed: r.seed,
            summary: summarize(&r.turns, &r.agent_calls, window_s, slo_s),
            kv: kv_figures(&r.samples, window_s),
        })
        .collect();
    // Neighbouring rounds with the same seed, one off and one on, in either order.
    let pairs = round_figures
        .windows(2)
        .filter_map(|p| {
            let (off, on) = match (p[0].condition.as_str(), p[1].condition.as_str()) {
                (MAKE_ROOM_OFF, MAKE_ROOM_ON) => (&p[0], &p[1]),
                (MAKE_ROOM_ON, MAKE_ROOM_OFF) => (&p[1], &p[0]),
                _ => return None,
            };
            (off.seed == on.seed).then(|| PairRatios {
                seed: off.seed,
                p95_voice_to_voice_off_over_on: off.summary.voice_to_voice_p95_s
                    / on.summary.voice_to_voice_p95_s.max(1e-9),
                agent_throughput_on_over_off: on.summary.agent_tokens_per_s
                    / off.summary.agent_tokens_per_s.max(1e-9),
            })
        })
        .collect();
    let conditions = [VOICE_ALONE, MAKE_ROOM_OFF, MAKE_ROOM_ON]
        .into_iter()
        .filter_map(|condition| {
            let of: Vec<&RoundRecord> = of_condition(rounds, condition).collect();
            let (first, n) = (of.first()?, of.len());
            let turns: Vec<VoiceTurn> = of.iter().flat_map(|r| r.turns.clone()).collect();
            let calls: Vec<AgentCallRecord> =
                of.iter().flat_map(|r| r.agent_calls.clone()).collect();
            let mut summary = summarize(&turns, &calls, window_s, slo_s);
            // Each round's calls count their own window's tokens; n windows in all.
            summary.agent_tokens_per_s /= n as f64;
            let shares: f64 = round_figures
                .iter()
                .filter(|f| f.condition == first.condition)
                .map(|f| f.kv.at_budget_share)
                .sum();
            Some(ConditionFigures {
                condition: condition.to_owned(),
                rounds: n,
                summary,
                kv_at_budget_share: shares / n as f64,
                stage_means_s: stage_means(&turns),
            })
        })
        .collect();
    Figures {
        slo_s,
        rounds: round_figures,
        conditions,
        pairs,
    }
}

fn of_condition<'a>(
    rounds: &'a [RoundRecord],
    condition: &'a str,
) -> impl Iterator<Item = &'a RoundRecord> + 'a {
    rounds.iter().filter(move |r| r.condition == condition)
}

/// KV use over the agents' window, and what the counters grew by over the whole round.
pub fn kv_figures(samples: &[Sample], window_s: f64) -> KvFigures {
    let in_window: Vec<&Sample> = samples.iter().filter(|s| s.t_s <= window_s).collect();
    let use_of = |s: &Sample| s.kv_used_tokens as f64 / s.kv_budget_tokens.max(1) as f64;
    let n = in_window.len().max(1) as f64;
    let grew = |f: fn(&Sample) -> u64| match (samples.first(), samples.last()) {
        (Some(first), Some(last)) => f(last) - f(first),
        _ => 0,
    };
    KvFigures {
        at_budget_share: in_window
            .iter()
            .filter(|s| use_of(s) >= AT_BUDGET_SHARE || s.waiting > 0)
            .count() as f64
            / n,
        mean_use: in_window.iter().map(|s| use_of(s)).sum::<f64>() / n,
        kv_preemptions: grew(|s| s.kv_preemptions),
        growth_preemptions: grew(|s| s.growth_preemptions),
        held_request_steps: grew(|s| s.held_request_steps),
        hold_releases: grew(|s| s.hold_releases),
        prefill_chunks: grew(|s| s.prefill_chunks),
        hints_seen: grew(|s| s.hints_seen),
        first_sentence_releases: grew(|s| s.first_sentence_releases),
    }
}

/// Each stage's mean over the turns that have stages.
pub fn stage_means(turns: &[VoiceTurn]) -> [f64; 5] {
    let staged: Vec<[f64; 5]> = turns.iter().filter_map(|t| t.stages_s).collect();
    let mut means = [0.0; 5];
    for stages in &staged {
        for (mean, stage) in means.iter_mut().zip(stages) {
            *mean += stage / staged.len() as f64;
        }
    }
    means
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(v2v: f64) -> VoiceTurn {
        VoiceTurn {
            call: "c".into(),
            utterance: 0,
            voice_to_voice_s: Some(v2v),
            first_token_s: Some(0.2),
            first_sentence_s: Some(0.5),
            stages_s: Some([1.0, 0.2, 0.2, 0.3, v2v - 1.7]),
        }
    }

    fn sample(t_s: f64, kv: usize, held: u64, waiting: usize) -> Sample {
        Sample {
            t_s,
            kv_used_tokens: kv,
            kv_budget_tokens: 100,
            running: 1,
            waiting,
            kv_preemptions: 0,
            growth_preemptions: 0,
            held_request_steps: held,
            hold_releases: 0,
            prefill_chunks: 0,
            hints_seen: 0,
            first_sentence_releases: 0,
        }
    }

    fn round(condition: &str, seed: Option<u64>, v2v: &[f64], tokens: usize) -> RoundRecord {
        RoundRecord {
            condition: condition.into(),
            seed,
            duration_s: 12.0,
            turns: v2v.iter().map(|v| turn(*v)).collect(),
            agent_calls: vec![AgentCallRecord {
                session: "a".into(),
                started_s: 0.0,
                first_token_s: Some(1.0),
                ended_s: 5.0,
                output_tokens: tokens,
                token_times_s: Vec::new(),
                error: None,
            }],
            samples: vec![
                sample(0.0, 95, 10, 0),
                sample(5.0, 50, 12, 0),
                sample(7.0, 60, 12, 1),
                sample(9.0, 40, 12, 0),
                sample(11.0, 99, 20, 0),
            ],
        }
    }

    #[test]
    fn rounds_pair_by_seed_and_conditions_pool() {
        let rounds = vec![
            round(VOICE_ALONE, None, &[2.0, 3.0], 0),
            round(MAKE_ROOM_OFF, Some(1), &[10.0, 20.0], 100),
            round(MAKE_ROOM_ON, Some(1), &[2.0, 4.0], 90),
            // The second pair runs on first (so a drifting machine favours neither).
            round(MAKE_ROOM_ON, Some(2), &[3.0, 3.0], 80),
            round(MAKE_ROOM_OFF, Some(2), &[8.0, 6.0], 100),
        ];
        let figures = figures(&rounds, 10.0);
        assert_eq!(figures.slo_s, 3.25);
        assert_eq!(figures.pairs.len(), 2);
        assert_eq!(figures.pairs[0].p95_voice_to_voice_off_over_on, 5.0);
        assert!((figures.pairs[1].agent_throughput_on_over_off - 0.8).abs() < 1e-12);
        let on = &figures.conditions[2];
        assert_eq!((on.condition.as_str(), on.rounds), (MAKE_ROOM_ON, 2));
        assert_eq!(on.summary.turns, 4);
        assert_eq!(on.summary.over_slo, 1);
        assert!((on.summary.agent_tokens_per_s - 8.5).abs() < 1e-12);
        // At the budget: 95% used, or a request waiting for room. Samples after the 10 s
        // window do not count toward KV use; counters span the round.
        let kv = &figures.rounds[1].kv;
        assert_eq!((kv.at_budget_share, kv.held_request_steps), (0.5, 10));
        assert!((kv.mean_use - 0.6125).abs() < 1e-12);
        assert!((on.stage_means_s[4] - 1.3).abs() < 1e-12);
    }

    #[test]
    fn an_unpaired_round_has_no_ratio() {
        let rounds = vec![
            round(VOICE_ALONE, None, &[2.0], 0),
            round(MAKE_ROOM_OFF, Some(1), &[10.0], 100),
            round(MAKE_ROOM_ON, Some(2), &[2.0], 90),
        ];
        assert!(figures(&rounds, 10.0).pairs.is_empty());
    }
}
