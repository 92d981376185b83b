//! Every figure of a bench report, computed from its rounds' records only (turns, agent
//! calls, engine samples), so that a report can be checked by recomputing it.

use serde::{Deserialize, Serialize};

use crate::stats::{slo_from_voice_alone, summarize, AgentCallRecord, Summary, VoiceTurn};

mod alone_gap;
pub use alone_gap::AloneGap;

/// The condition names, as rounds and reports spell them.
pub const VOICE_ALONE: &str = "voice alone";
pub const MAKE_ROOM_OFF: &str = "make-room off";
pub const MAKE_ROOM_ON: &str = "make-room on";
/// The agents with no callers: what they get of the engine when no call takes a share.
pub const AGENTS_ALONE: &str = "agents alone";

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
    /// Hints withdrawn before they ran, because their turn had come.
    #[serde(default)]
    pub hints_superseded: u64,
    /// Voice turns whose hold ended at their first sentence, before the token window's end.
    #[serde(default)]
    pub first_sentence_releases: u64,
    /// Steps that left the agents' prompts out to pace a call's reply.
    #[serde(default)]
    pub paced_steps: u64,
    /// Finished call turns whose KV was kept for the call's next turn.
    #[serde(default)]
    pub retained_turns: u64,
    /// Voice turns that found their call's previous turn still kept, and took it over.
    #[serde(default)]
    pub retained_hits: u64,
    /// Voice turns' prompt tokens at arrival, and those the engine's cache held.
    #[serde(default)]
    pub turn_prompt_tokens: u64,
    #[serde(default)]
    pub turn_cached_tokens: u64,
    /// Steps the scheduler planned, and the time it spent deciding them, nanoseconds.
    #[serde(default)]
    pub steps: u64,
    #[serde(default)]
    pub schedule_ns: u64,
    /// The bench process's CPU time so far (engine, voice pipeline, replayer), ms.
    #[serde(default)]
    pub cpu_ms: u64,
    /// CPU time the host took from the machine's cores so far (steal), ms; `None` where
    /// not known, and in records from before it was sampled (left out of those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steal_ms: Option<u64>,
    /// Tokens the engine computed so far, of prompts and decoded, and of those the calls'.
    #[serde(default)]
    pub prefill_tokens: u64,
    #[serde(default)]
    pub decode_tokens: u64,
    #[serde(default)]
    pub call_prefill_tokens: u64,
    #[serde(default)]
    pub call_decode_tokens: u64,
}

/// The tokens the engine computed over a round, for the calls and for the agents: prompt
/// tokens (recomputed ones too, after a preemption) and decoded ones.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EngineWork {
    pub call_prompt_tokens: u64,
    pub call_decoded_tokens: u64,
    pub agent_prompt_tokens: u64,
    pub agent_decoded_tokens: u64,
    /// The seconds the samples span.
    pub seconds: f64,
}

/// Callers in a round written before rounds recorded theirs (every such run had two).
fn two_callers() -> usize {
    2
}

/// One round's records: what every figure is computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub condition: String,
    /// The agent sessions' seed (none: voice alone, or a trace file).
    pub seed: Option<u64>,
    /// Callers at once.
    #[serde(default = "two_callers")]
    pub callers: usize,
    /// How long callers and agents kept starting calls, seconds (0: the report's window).
    #[serde(default)]
    pub window_s: f64,
    pub duration_s: f64,
    pub turns: Vec<VoiceTurn>,
    pub agent_calls: Vec<AgentCallRecord>,
    pub samples: Vec<Sample>,
}

impl RoundRecord {
    pub(crate) fn window_or(&self, default_s: f64) -> f64 {
        if self.window_s > 0.0 {
            self.window_s
        } else {
            default_s
        }
    }

    /// The agents' output tokens by `t_s` into the round.
    fn agent_tokens_by(&self, t_s: f64) -> usize {
        self.agent_calls.iter().map(|a| a.tokens_by(t_s)).sum()
    }
}

/// What the engine's samples show of a round: KV use over the window, and what
/// make-room's counters grew by over the whole round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineFigures {
    /// Share of the window's samples with KV at the budget: use ≥ [`AT_BUDGET_SHARE`] of
    /// it, or a request waiting because it does not fit.
    pub at_budget_share: f64,
    /// Mean KV use over the window, as a share of the budget.
    pub mean_use: f64,
    pub kv_preemptions: u64,
    pub growth_preemptions: u64,
    pub held_request_steps: u64,
    pub hold_releases: u64,
    pub prefill_chunks: u64,
    pub hints_seen: u64,
    pub hints_superseded: u64,
    pub first_sentence_releases: u64,
    #[serde(default)]
    pub paced_steps: u64,
    pub retained_turns: u64,
    #[serde(default)]
    pub retained_hits: u64,
    /// The share of the voice turns' prompt tokens the engine's cache held when they
    /// arrived (the call's earlier turns, unless the agents' work pushed them out); `None`
    /// in records from before it was counted.
    #[serde(default)]
    pub turn_prompt_cached_share: Option<f64>,
    pub steps: u64,
    /// The scheduler's own time per step it planned, microseconds.
    pub scheduler_us_per_step: f64,
    /// The bench process's CPU time over the round's wall time: how many cores its work
    /// kept busy on average (AIPerf, a process of its own, not included); `None` in
    /// records from before it was sampled.
    #[serde(default)]
    pub cpu_cores: Option<f64>,
    /// The CPU time the host took from the machine over the round's wall time, in cores
    /// (of the machine's; a neighbour's burst on a shared host); `None` where not known.
    #[serde(default)]
    pub steal_cores: Option<f64>,
    /// What the engine computed, for the calls and for the agents; `None` in records from
    /// before it was counted.
    #[serde(default)]
    pub work: Option<EngineWork>,
}

/// One round's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundFigures {
    pub condition: String,
    pub seed: Option<u64>,
    pub callers: usize,
    pub summary: Summary,
    pub engine: EngineFigures,
}

/// A pair of neighbouring rounds with the same seed and callers, make-room off and on (in
/// either order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairRatios {
    pub seed: Option<u64>,
    pub callers: usize,
    /// p95 voice to voice without make-room over with it (higher: make-room helps more).
    pub p95_voice_to_voice_off_over_on: f64,
    /// The agents' output-token throughput with make-room over without it.
    pub agent_throughput_on_over_off: f64,
    /// The agents' p95 time to first token with make-room over without it.
    pub agent_first_token_p95_on_over_off: f64,
    /// The agents' throughput in each round over theirs with no callers, for the same
    /// seed (none: no agents-alone round with it): how much of it the calls take.
    #[serde(default)]
    pub agent_throughput_off_over_alone: Option<f64>,
    #[serde(default)]
    pub agent_throughput_on_over_alone: Option<f64>,
}

/// All the rounds of one condition with the same callers together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionFigures {
    pub condition: String,
    pub callers: usize,
    pub rounds: usize,
    /// The rounds' turns and agent calls pooled; the agents' throughput is per second of
    /// all the rounds' windows together.
    pub summary: Summary,
    /// Mean of the rounds' shares.
    pub kv_at_budget_share: f64,
    /// KV preemptions in all the rounds, and how many rounds had at least one.
    pub kv_preemptions: u64,
    pub rounds_with_kv_preemption: usize,
    /// Steps planned in all the rounds (none: the records predate the count), and the
    /// scheduler's time per step over them, microseconds.
    pub steps: u64,
    pub scheduler_us_per_step: f64,
    /// Each stage's mean over the answered turns (end of turn, transcript, first token,
    /// first sentence, first audio), seconds.
    pub stage_means_s: [f64; 5],
}

/// The SLO the voice-alone rounds with one number of callers set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub callers: usize,
    /// Their p95 voice to voice plus a quarter second.
    pub slo_s: f64,
    /// The voice-alone turns it rests on.
    pub turns: usize,
    /// No voice-alone round had this many callers: the SLO is every voice-alone turn's.
    pub borrowed: bool,
}

/// Every figure of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// One SLO per number of callers: rounds are held to the one of their callers (to
    /// every voice-alone turn's, for a count with no voice-alone round).
    pub slos: Vec<Slo>,
    pub rounds: Vec<RoundFigures>,
    pub conditions: Vec<ConditionFigures>,
    pub pairs: Vec<PairRatios>,
    /// make-room's turns against the same utterances alone, per number of callers.
    #[serde(default)]
    pub alone_gaps: Vec<AloneGap>,
}

impl Figures {
    /// The SLO rounds with `callers` callers are held to.
    pub fn slo_for(&self, callers: usize) -> f64 {
        self.slos
            .iter()
            .find(|s| s.callers == callers)
            .map_or(0.0, |s| s.slo_s)
    }

    /// The pooled figures of `condition` with `callers` callers.
    pub fn condition(&self, condition: &str, callers: usize) -> Option<&ConditionFigures> {
        self.conditions
            .iter()
            .find(|c| c.condition == condition && c.callers == callers)
    }

    /// Every number of callers the rounds ran with, fewest first (not the agents-alone
    /// round's none).
    pub fn caller_counts(&self) -> Vec<usize> {
        caller_counts(self.rounds.iter().map(|r| r.callers))
    }
}

/// The figures of `rounds`; a round that did not record its window ran for `window_s`.
pub fn figures(rounds: &[RoundRecord], window_s: f64) -> Figures {
    let counts = caller_counts(rounds.iter().map(|r| r.callers));
    let slos = slos(rounds, &counts);
    let slo_for = |callers: usize| {
        slos.iter()
            .find(|s| s.callers == callers)
            .map_or(0.0, |s| s.slo_s)
    };
    let round_figures: Vec<RoundFigures> = rounds
        .iter()
        .map(|r| RoundFigures {
            condition: r.condition.clone(),
            seed: r.seed,
            callers: r.callers,
            summary: summarize(
                &r.turns,
                &r.agent_calls,
                r.window_or(window_s),
                slo_for(r.callers),
            ),
            engine: engine_figures(&r.samples, r.window_or(window_s)),
        })
        .collect();
    let conditions = std::iter::once((AGENTS_ALONE, 0))
        .chain(counts.iter().flat_map(|&callers| {
            [VOICE_ALONE, MAKE_ROOM_OFF, MAKE_ROOM_ON].map(move |condition| (condition, callers))
        }))
        .filter_map(|(condition, callers)| {
            let of: Vec<(&RoundRecord, &RoundFigures)> = rounds
                .iter()
                .zip(&round_figures)
                .filter(|(r, _)| r.condition == condition && r.callers == callers)
                .collect();
            pooled(&of, window_s, slo_for(callers))
        })
        .collect();
    Figures {
        slos,
        alone_gaps: alone_gap::alone_gaps(rounds, &counts),
        pairs: pairs(&round_figures, rounds, window_s),
        rounds: round_figures,
        conditions,
    }
}

/// The distinct numbers of callers, fewest first, none left out.
fn caller_counts(callers: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut counts: Vec<usize> = callers.filter(|&n| n > 0).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// Each number of callers' SLO, from its voice-alone rounds (from every voice-alone round
/// for a count that has none: then marked so).
fn slos(rounds: &[RoundRecord], counts: &[usize]) -> Vec<Slo> {
    let voice_alone_turns = |callers: Option<usize>| -> Vec<VoiceTurn> {
        rounds
            .iter()
            .filter(|r| r.condition == VOICE_ALONE && callers.is_none_or(|c| r.callers == c))
            .flat_map(|r| r.turns.iter().cloned())
            .collect()
    };
    counts
        .iter()
        .map(|&callers| {
            let own = voice_alone_turns(Some(callers));
            let borrowed = own.is_empty();
            let turns = if borrowed {
                voice_alone_turns(None)
            } else {
                own
            };
            Slo {
                callers,
                slo_s: slo_from_voice_alone(&turns),
                turns: turns.len(),
                borrowed,
            }
        })
        .collect()
}

/// The agents' throughput in the agents-alone round with `seed`, over its first `window_s`
/// (a pair's window, which may be shorter than its own: the sessions' first calls find
/// an empty queue, so a shorter window's rate is not the longer one's).
fn agents_alone_rate(rounds: &[RoundRecord], seed: Option<u64>, window_s: f64) -> Option<f64> {
    let alone = rounds
        .iter()
        .find(|r| r.condition == AGENTS_ALONE && r.seed == seed)?;
    let window_s = alone.window_or(window_s).min(window_s);
    let tokens = alone.agent_tokens_by(window_s);
    (tokens > 0 && window_s > 0.0).then(|| tokens as f64 / window_s)
}

/// Neighbouring rounds with the same seed and callers, one off and one on, either order;
/// `records` are the rounds' records, in the same order (a round without a window of its
/// own ran for `window_s`).
fn pairs(rounds: &[RoundFigures], records: &[RoundRecord], window_s: f64) -> Vec<PairRatios> {
    rounds
        .windows(2)
        .zip(records)
        .filter_map(|(p, record)| {
            let window_s = record.window_or(window_s);
            let (off, on) = match (p[0].condition.as_str(), p[1].condition.as_str()) {
                (MAKE_ROOM_OFF, MAKE_ROOM_ON) => (&p[0], &p[1]),
                (MAKE_ROOM_ON, MAKE_ROOM_OFF) => (&p[1], &p[0]),
                _ => return None,
            };
            let over_alone = |r: &RoundFigures| {
                agents_alone_rate(records, r.seed, window_s)
                    .map(|alone| r.summary.agent_tokens_per_s / alone)
            };
            (off.seed == on.seed && off.callers == on.callers).then(|| PairRatios {
                seed: off.seed,
                callers: off.callers,
                p95_voice_to_voice_off_over_on: off.summary.voice_to_voice_p95_s
                    / on.summary.voice_to_voice_p95_s.max(1e-9),
                agent_throughput_on_over_off: on.summary.agent_tokens_per_s
                    / off.summary.agent_tokens_per_s.max(1e-9),
                agent_first_token_p95_on_over_off: on.summary.agent_first_token_p95_s
                    / off.summary.agent_first_token_p95_s.max(1e-9),
                agent_throughput_off_over_alone: over_alone(off),
                agent_throughput_on_over_alone: over_alone(on),
            })
        })
        .collect()
}

/// The rounds `of` one condition and number of callers together (none: no figures).
fn pooled(
    of: &[(&RoundRecord, &RoundFigures)],
    window_s: f64,
    slo_s: f64,
) -> Option<ConditionFigures> {
    let (first, _) = of.first()?;
    let n = of.len();
    let turns: Vec<VoiceTurn> = of.iter().flat_map(|(r, _)| r.turns.clone()).collect();
    // Each round's calls count their own window's tokens, per second of all the windows.
    let windows_s: f64 = of.iter().map(|(r, _)| r.window_or(window_s)).sum();
    let tokens: usize = of
        .iter()
        .map(|(r, _)| r.agent_tokens_by(r.window_or(window_s)))
        .sum();
    let calls: Vec<AgentCallRecord> = of.iter().flat_map(|(r, _)| r.agent_calls.clone()).collect();
    let mut summary = summarize(&turns, &calls, f64::INFINITY, slo_s);
    summary.agent_output_tokens = tokens;
    summary.agent_tokens_per_s = tokens as f64 / windows_s.max(1e-9);
    let engines = || of.iter().map(|(_, f)| &f.engine);
    let steps: u64 = engines().map(|e| e.steps).sum();
    let schedule_us: f64 = engines()
        .map(|e| e.scheduler_us_per_step * e.steps as f64)
        .sum();
    Some(ConditionFigures {
        condition: first.condition.clone(),
        callers: first.callers,
        rounds: n,
        summary,
        kv_at_budget_share: engines().map(|e| e.at_budget_share).sum::<f64>() / n as f64,
        kv_preemptions: engines().map(|e| e.kv_preemptions).sum(),
        rounds_with_kv_preemption: engines().filter(|e| e.kv_preemptions > 0).count(),
        steps,
        scheduler_us_per_step: schedule_us / steps.max(1) as f64,
        stage_means_s: stage_means(&turns),
    })
}

/// KV use over the round's window, and what the counters grew by over the whole round.
pub fn engine_figures(samples: &[Sample], window_s: f64) -> EngineFigures {
    let in_window: Vec<&Sample> = samples.iter().filter(|s| s.t_s <= window_s).collect();
    let use_of = |s: &Sample| s.kv_used_tokens as f64 / s.kv_budget_tokens.max(1) as f64;
    let n = in_window.len().max(1) as f64;
    let grew = |f: fn(&Sample) -> u64| match (samples.first(), samples.last()) {
        (Some(first), Some(last)) => f(last).saturating_sub(f(first)),
        _ => 0,
    };
    let steps = grew(|s| s.steps);
    // The wall time the samples span, for the CPU figures per second of it.
    let span_s = match (samples.first(), samples.last()) {
        (Some(first), Some(last)) if last.t_s > first.t_s => Some(last.t_s - first.t_s),
        _ => None,
    };
    EngineFigures {
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
        hints_superseded: grew(|s| s.hints_superseded),
        first_sentence_releases: grew(|s| s.first_sentence_releases),
        paced_steps: grew(|s| s.paced_steps),
        retained_turns: grew(|s| s.retained_turns),
        retained_hits: grew(|s| s.retained_hits),
        turn_prompt_cached_share: match grew(|s| s.turn_prompt_tokens) {
            0 => None,
            prompt => Some(grew(|s| s.turn_cached_tokens) as f64 / prompt as f64),
        },
        steps,
        scheduler_us_per_step: grew(|s| s.schedule_ns) as f64 / 1000.0 / steps.max(1) as f64,
        cpu_cores: span_s
            .filter(|_| samples.last().is_some_and(|last| last.cpu_ms > 0))
            .map(|span_s| grew(|s| s.cpu_ms) as f64 / 1000.0 / span_s),
        steal_cores: span_s.and_then(|span_s| {
            let (first, last) = (samples.first()?, samples.last()?);
            Some(last.steal_ms?.saturating_sub(first.steal_ms?) as f64 / 1000.0 / span_s)
        }),
        work: match (samples.first(), samples.last()) {
            (Some(first), Some(last)) if grew(|s| s.prefill_tokens) > 0 => {
                let (call_prompt, call_decoded) = (
                    grew(|s| s.call_prefill_tokens),
                    grew(|s| s.call_decode_tokens),
                );
                Some(EngineWork {
                    call_prompt_tokens: call_prompt,
                    call_decoded_tokens: call_decoded,
                    agent_prompt_tokens: grew(|s| s.prefill_tokens).saturating_sub(call_prompt),
                    agent_decoded_tokens: grew(|s| s.decode_tokens).saturating_sub(call_decoded),
                    seconds: last.t_s - first.t_s,
                })
            }
            _ => None,
        },
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
mod tests;
