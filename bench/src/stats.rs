//! The figures, from per-turn and per-call records only, so that every number in a report
//! can be traced back to the turns and calls it summarizes.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// What a turn that failed, was refused or timed out counts as, in seconds; a reply
/// slower than this counts as timed out.
pub const FAILED_TURN_S: f64 = 30.0;

/// One caller turn, as the figures see it. Times are seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoiceTurn {
    pub call: String,
    /// The caller's utterance this turn answers (0, 1, …).
    pub utterance: usize,
    /// Caller stopped → first audio of the reply; `None`: no reply came.
    pub voice_to_voice_s: Option<f64>,
    /// The engine's first token after the transcript was ready.
    pub first_token_s: Option<f64>,
    /// The reply's first sentence after the transcript was ready.
    pub first_sentence_s: Option<f64>,
    /// Every stage's own latency (end of turn, transcript, first token, first sentence,
    /// first audio), each from the stage before.
    #[serde(default)]
    pub stages_s: Option<[f64; 5]>,
    /// What the agent heard and said, to read a slow turn by (none for a failed turn, and
    /// in runs before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub words: Option<TurnWords>,
    /// The longest silence the caller heard inside the reply, its next sentence not yet
    /// ready (`TurnRecord::reply_gap_s`; none for a failed turn, and in runs before it was
    /// kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_gap_s: Option<f64>,
}

/// A turn's words and the end-of-turn decisions behind its timing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnWords {
    /// The caller's words, as transcribed.
    pub transcript: String,
    /// What the agent said.
    pub reply: String,
    /// Smart Turn's score at the stop.
    pub end_of_turn_score: Option<f32>,
    /// The reply was started at the stop, before the end of the turn was decided.
    pub preemptive: bool,
    /// Its opening was synthesized before the end of the turn was decided.
    pub opening_ahead: bool,
}

impl VoiceTurn {
    /// Voice to voice, a missing reply, or one slower than [`FAILED_TURN_S`] (a caller
    /// would have given up: timed out), counted as [`FAILED_TURN_S`].
    pub fn scored_s(&self) -> f64 {
        self.voice_to_voice_s
            .map_or(FAILED_TURN_S, |s| s.min(FAILED_TURN_S))
    }
}

/// One coding-agent call, as the replayer saw it. Times are seconds from the round's start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCallRecord {
    pub session: String,
    pub started_s: f64,
    /// Request sent → first streamed token.
    pub first_token_s: Option<f64>,
    pub ended_s: f64,
    /// Completion tokens, as the usage record counted them.
    pub output_tokens: usize,
    /// When each streamed piece of the answer arrived (about one per token).
    #[serde(default)]
    pub token_times_s: Vec<f64>,
    pub error: Option<String>,
}

impl AgentCallRecord {
    /// The answer's tokens that had arrived by `t_s`: a call that ended by then counts
    /// its usage record, one still streaming the pieces it had sent.
    pub fn tokens_by(&self, t_s: f64) -> usize {
        if self.ended_s <= t_s {
            self.output_tokens
        } else {
            self.token_times_s.iter().filter(|at| **at <= t_s).count()
        }
    }
}

/// The nearest-rank percentile `p` (0–100) of `values`; 0 for none.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// One condition's figures (a round, or several of the same condition together).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub turns: usize,
    pub failed_turns: usize,
    pub voice_to_voice_p50_s: f64,
    pub voice_to_voice_p95_s: f64,
    /// A bootstrap 95% interval on that p95 (see [`bootstrap_p95_interval`]).
    #[serde(default)]
    pub voice_to_voice_p95_interval_s: [f64; 2],
    pub voice_to_voice_max_s: f64,
    pub first_token_p50_s: f64,
    pub first_token_p95_s: f64,
    pub first_sentence_p50_s: f64,
    pub first_sentence_p95_s: f64,
    /// Replies slower than the SLO (failed turns included).
    pub over_slo: usize,
    /// The same, as a share of the turns.
    #[serde(default)]
    pub over_slo_share: f64,
    pub agent_calls: usize,
    pub agent_errors: usize,
    /// Output tokens that arrived within the window.
    pub agent_output_tokens: usize,
    /// The same, per second of the window.
    pub agent_tokens_per_s: f64,
    pub agent_first_token_p95_s: f64,
    /// Answered replies with a silence of [`NOTICED_GAP_S`] or more inside them, and the
    /// longest silence inside any reply (none: the records do not say, an older run's).
    #[serde(default)]
    pub reply_gaps: Option<(usize, f64)>,
}

/// A silence inside a reply a caller notices: longer than the pause at a comma, shorter than
/// the one that tells them the agent has finished.
pub const NOTICED_GAP_S: f64 = 0.2;

/// The figures of `turns`, and of `agents` over their first `window_s` seconds, against
/// `slo_s`.
pub fn summarize(
    turns: &[VoiceTurn],
    agents: &[AgentCallRecord],
    window_s: f64,
    slo_s: f64,
) -> Summary {
    let scored: Vec<f64> = turns.iter().map(VoiceTurn::scored_s).collect();
    let present =
        |f: fn(&VoiceTurn) -> Option<f64>| -> Vec<f64> { turns.iter().filter_map(f).collect() };
    let first_token = present(|t| t.first_token_s);
    let first_sentence = present(|t| t.first_sentence_s);
    let agent_output_tokens = agents.iter().map(|a| a.tokens_by(window_s)).sum();
    let agent_first_token: Vec<f64> = agents.iter().filter_map(|a| a.first_token_s).collect();
    let gaps = present(|t| t.reply_gap_s);
    Summary {
        turns: turns.len(),
        failed_turns: turns
            .iter()
            .filter(|t| t.voice_to_voice_s.is_none())
            .count(),
        voice_to_voice_p50_s: percentile(&scored, 50.0),
        voice_to_voice_p95_s: percentile(&scored, 95.0),
        voice_to_voice_p95_interval_s: bootstrap_p95_interval(&scored),
        voice_to_voice_max_s: scored.iter().copied().fold(0.0, f64::max),
        first_token_p50_s: percentile(&first_token, 50.0),
        first_token_p95_s: percentile(&first_token, 95.0),
        first_sentence_p50_s: percentile(&first_sentence, 50.0),
        first_sentence_p95_s: percentile(&first_sentence, 95.0),
        over_slo: scored.iter().filter(|s| **s > slo_s).count(),
        over_slo_share: scored.iter().filter(|s| **s > slo_s).count() as f64
            / scored.len().max(1) as f64,
        agent_calls: agents.len(),
        agent_errors: agents.iter().filter(|a| a.error.is_some()).count(),
        agent_output_tokens,
        agent_tokens_per_s: if window_s > 0.0 {
            agent_output_tokens as f64 / window_s
        } else {
            0.0
        },
        agent_first_token_p95_s: percentile(&agent_first_token, 95.0),
        reply_gaps: (!gaps.is_empty()).then(|| {
            let noticed = gaps.iter().filter(|g| **g >= NOTICED_GAP_S).count();
            (noticed, gaps.iter().copied().fold(0.0, f64::max))
        }),
    }
}

/// Resamples a bootstrap interval draws.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// A percentile bootstrap 95% interval on the nearest-rank p95 of `values`. With few
/// values the interval is wide, which is its point: a p95 of twelve turns is their slowest.
pub fn bootstrap_p95_interval(values: &[f64]) -> [f64; 2] {
    bootstrap_interval(values, |resample| percentile(resample, 95.0))
}

/// A percentile bootstrap 95% interval on `statistic` of `values`: the 2.5th and 97.5th
/// percentiles of the statistic of [`BOOTSTRAP_RESAMPLES`] resamples drawn with
/// replacement. The generator's seed is fixed, so a report's interval can be recomputed
/// exactly from its records.
pub fn bootstrap_interval(values: &[f64], statistic: impl Fn(&[f64]) -> f64) -> [f64; 2] {
    if values.is_empty() {
        return [0.0, 0.0];
    }
    let mut rng = StdRng::seed_from_u64(0x5eed_b007);
    let mut resample = vec![0.0; values.len()];
    let statistics: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            for v in resample.iter_mut() {
                *v = values[rng.random_range(0..values.len())];
            }
            statistic(&resample)
        })
        .collect();
    [percentile(&statistics, 2.5), percentile(&statistics, 97.5)]
}

/// The SLO a voice-alone round sets: its p95 voice to voice plus a quarter second.
pub fn slo_from_voice_alone(turns: &[VoiceTurn]) -> f64 {
    let scored: Vec<f64> = turns.iter().map(VoiceTurn::scored_s).collect();
    percentile(&scored, 95.0) + 0.25
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(v2v: Option<f64>) -> VoiceTurn {
        VoiceTurn {
            call: "c".into(),
            utterance: 0,
            voice_to_voice_s: v2v,
            first_token_s: v2v.map(|v| v / 4.0),
            first_sentence_s: v2v.map(|v| v / 2.0),
            stages_s: None,
            words: None,
            reply_gap_s: v2v.map(|v| v / 8.0),
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&values, 95.0), 19.0);
        assert_eq!(percentile(&values, 50.0), 10.0);
        assert_eq!(percentile(&values, 100.0), 20.0);
        assert_eq!(percentile(&[3.0], 95.0), 3.0);
        assert_eq!(percentile(&[], 95.0), 0.0);
    }

    #[test]
    fn a_missing_or_timed_out_reply_counts_as_thirty_seconds() {
        let turns = vec![
            turn(Some(1.0)),
            turn(Some(2.0)),
            turn(None),
            turn(Some(95.0)),
        ];
        let agents = vec![AgentCallRecord {
            session: "a".into(),
            started_s: 0.0,
            first_token_s: Some(0.5),
            ended_s: 4.0,
            output_tokens: 40,
            token_times_s: Vec::new(),
            error: None,
        }];
        let summary = summarize(&turns, &agents, 10.0, 2.5);
        assert_eq!(summary.failed_turns, 1);
        assert_eq!(summary.voice_to_voice_max_s, FAILED_TURN_S);
        assert_eq!(summary.voice_to_voice_p50_s, 2.0);
        assert_eq!(summary.over_slo, 2);
        assert_eq!(summary.over_slo_share, 0.5);
        assert_eq!(summary.agent_tokens_per_s, 4.0);
        assert_eq!(summary.first_token_p95_s, 95.0 / 4.0);
        // Silences inside the replies of 0.125, 0.25 and 11.875 s: two a caller notices.
        assert_eq!(summary.reply_gaps, Some((2, 95.0 / 8.0)));
        assert_eq!(summarize(&turns[2..3], &agents, 10.0, 2.5).reply_gaps, None);
        assert_eq!(slo_from_voice_alone(&turns[..2]), 2.25);
    }

    #[test]
    fn the_p95_interval_holds_the_p95_and_narrows_with_more_turns() {
        let few: Vec<f64> = (1..=12).map(f64::from).collect();
        let [lo, hi] = bootstrap_p95_interval(&few);
        assert!(lo <= percentile(&few, 95.0) && percentile(&few, 95.0) <= hi);
        assert_eq!(hi, 12.0);
        // The same values four times over: the same p95, a narrower interval.
        let many: Vec<f64> = (0..4).flat_map(|_| few.clone()).collect();
        let [lo4, hi4] = bootstrap_p95_interval(&many);
        assert!(hi4 - lo4 < hi - lo, "{lo4}..{hi4} against {lo}..{hi}");
        assert_eq!(bootstrap_p95_interval(&few), [lo, hi], "a fixed seed");
        assert_eq!(bootstrap_p95_interval(&[]), [0.0, 0.0]);
    }

    #[test]
    fn a_call_streaming_past_the_window_counts_what_arrived_within_it() {
        let call = AgentCallRecord {
            session: "a".into(),
            started_s: 8.0,
            first_token_s: Some(0.5),
            ended_s: 12.0,
            output_tokens: 5,
            token_times_s: vec![8.5, 9.0, 9.5, 10.5, 11.5],
            error: None,
        };
        assert_eq!(call.tokens_by(10.0), 3);
        assert_eq!(call.tokens_by(12.0), 5);
        let summary = summarize(&[], &[call], 10.0, 2.5);
        assert_eq!(summary.agent_output_tokens, 3);
        assert_eq!(summary.agent_tokens_per_s, 0.3);
    }
}
