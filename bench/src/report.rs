//! A bench run as files: `summary.json` (the records and every figure computed from
//! them) and `report.md` (the figures as tables, beside the plots).

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::figures::{
    ConditionFigures, EngineWork, Figures, RoundFigures, RoundRecord, MAKE_ROOM_OFF, MAKE_ROOM_ON,
    VOICE_ALONE,
};
use crate::stats::{FAILED_TURN_S, NOTICED_GAP_S};
use breakdown::{by_condition, by_round};

/// The acceptance targets the report checks its figures against.
pub const TARGET_P95_RATIO: f64 = 5.0;
pub const TARGET_OVER_SLO_SHARE: f64 = 0.03;
pub const TARGET_THROUGHPUT_RATIO: f64 = 0.97;
pub const TARGET_AGENT_TTFT_RATIO: f64 = 1.1;
/// Most the scheduler may spend per step with make-room beyond what it spends without.
pub const TARGET_SCHEDULER_EXTRA_US: f64 = 20.0;
/// Fewest turns each condition must have with agents, and the voice-alone SLO rests on.
pub const TARGET_TURNS: usize = 40;
pub const TARGET_SLO_TURNS: usize = 20;

/// Everything a run wrote: how it ran, its records, its figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The command line, as `cargo xtask bench …` would take it.
    pub command: String,
    /// `git describe --always --dirty` of the tree that ran, when known.
    pub commit: Option<String>,
    /// The bench's settings.
    pub config: Value,
    /// How long the agents ran in each round, seconds.
    pub window_s: f64,
    /// Computed from the rounds' records (`--render-only` computes them again).
    #[serde(default)]
    pub figures: Figures,
    pub rounds: Vec<RoundRecord>,
}

/// The windows of the rounds beside the agents, by number of callers ("120 s with 2
/// callers, 75 s with 4"); the report's one window where the rounds did not record theirs.
fn windows(report: &BenchReport) -> String {
    let mut seen: Vec<(usize, f64)> = Vec::new();
    for r in &report.rounds {
        let window_s = r.window_or(report.window_s);
        if r.condition != VOICE_ALONE && !seen.contains(&(r.callers, window_s)) {
            seen.push((r.callers, window_s));
        }
    }
    match seen.first() {
        None => format!("{:.0} s", report.window_s),
        Some((_, first_s)) if seen.iter().all(|(_, s)| s == first_s) => format!("{first_s:.0} s"),
        _ => seen
            .iter()
            .filter(|(callers, _)| *callers > 0)
            .map(|(callers, window_s)| format!("{window_s:.0} s with {callers} callers"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The five stages of a turn, in order, as `VoiceTurn::stages_s` holds them.
pub const STAGES: [&str; 5] = [
    "end of turn",
    "transcript",
    "first token",
    "first sentence",
    "first audio",
];

/// The report as Markdown; the plots are linked by their file names.
pub fn markdown(report: &BenchReport, plots: &[(&str, &str)]) -> String {
    let f = &report.figures;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Bench: recorded calls beside coding agents, make-room off against on\n"
    );
    let _ = writeln!(md, "- Command: `{}`", report.command);
    if let Some(commit) = &report.commit {
        let _ = writeln!(md, "- Commit: `{commit}`");
    }
    let _ = writeln!(md, "- Settings: `{}`", report.config);
    let slos: Vec<String> = f
        .slos
        .iter()
        .map(|s| {
            format!(
                "{:.2} s with {} callers (from {} voice-alone turns{})",
                s.slo_s,
                s.callers,
                s.turns,
                if s.borrowed {
                    ", of other numbers of callers"
                } else {
                    ""
                }
            )
        })
        .collect();
    let _ = writeln!(
        md,
        "- SLO: {}, each the voice-alone p95 voice to voice + 0.25 s; a turn with no reply, \
         or one slower than {FAILED_TURN_S:.0} s (timed out), counts as {FAILED_TURN_S:.0} s; \
         the agents' figures cover each round's window ({} beside the agents).\n",
        slos.join("; "),
        windows(report)
    );
    headline(&mut md, f);
    by_condition(&mut md, f);
    by_round(&mut md, f);
    engine_work(&mut md, f);
    stages(&mut md, f);
    alone_gaps(&mut md, f);
    for (title, file) in plots {
        let _ = writeln!(md, "### {title}\n\n![{title}]({file})\n");
    }
    slowest_turns(&mut md, report);
    md
}

/// Values as "2 callers: a; 4 callers: b".
fn per_callers(values: &[(usize, String)]) -> String {
    values
        .iter()
        .map(|(callers, v)| format!("{callers} callers: {v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `a ÷ b`, or NaN (never meeting a target) when `b` was not measured.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

fn headline(md: &mut String, f: &Figures) {
    let _ = writeln!(md, "## Headline\n");
    let _ = writeln!(md, "| figure | measured | target | |\n|---|---|---|---|");
    preemption_row(md, f);
    turns_row(md, f);
    // (callers, off, on) for each number of callers that ran both conditions.
    let both: Vec<(usize, &ConditionFigures, &ConditionFigures)> = f
        .caller_counts()
        .into_iter()
        .filter_map(|n| {
            Some((
                n,
                f.condition(MAKE_ROOM_OFF, n)?,
                f.condition(MAKE_ROOM_ON, n)?,
            ))
        })
        .collect();
    let ratio_row = |md: &mut String,
                     figure: &str,
                     of: &dyn Fn(&ConditionFigures, &ConditionFigures) -> f64,
                     unit: &str,
                     target: String,
                     met: &dyn Fn(f64) -> bool| {
        let values: Vec<(usize, f64)> = both.iter().map(|(n, off, on)| (*n, of(off, on))).collect();
        let measured: Vec<(usize, String)> = values
            .iter()
            .map(|(n, v)| (*n, format!("{v:.2}{unit}")))
            .collect();
        let met = !values.is_empty() && values.iter().all(|(_, v)| met(*v));
        target_row(md, figure, per_callers(&measured), target, met);
    };
    ratio_row(
        md,
        "p95 voice to voice, off ÷ on (each condition's rounds pooled)",
        &|off, on| {
            ratio(
                off.summary.voice_to_voice_p95_s,
                on.summary.voice_to_voice_p95_s,
            )
        },
        "×",
        format!("≥ {TARGET_P95_RATIO}×"),
        &|v| v >= TARGET_P95_RATIO,
    );
    let over: Vec<(usize, String)> = both
        .iter()
        .map(|(n, _, on)| {
            let s = &on.summary;
            let share = s.over_slo_share * 100.0;
            (*n, format!("{} of {} ({share:.1}%)", s.over_slo, s.turns))
        })
        .collect();
    target_row(
        md,
        "replies over the SLO with make-room",
        per_callers(&over),
        format!("≤ {:.0}%", TARGET_OVER_SLO_SHARE * 100.0),
        !both.is_empty()
            && both
                .iter()
                .all(|(_, _, on)| on.summary.over_slo_share <= TARGET_OVER_SLO_SHARE),
    );
    ratio_row(
        md,
        "agents' output tokens/s, on ÷ off",
        &|off, on| {
            ratio(
                on.summary.agent_tokens_per_s,
                off.summary.agent_tokens_per_s,
            )
        },
        "",
        format!("≥ {TARGET_THROUGHPUT_RATIO}"),
        &|v| v >= TARGET_THROUGHPUT_RATIO,
    );
    ratio_row(
        md,
        "agents' p95 time to first token, on ÷ off",
        &|off, on| {
            ratio(
                on.summary.agent_first_token_p95_s,
                off.summary.agent_first_token_p95_s,
            )
        },
        "",
        format!("≤ {TARGET_AGENT_TTFT_RATIO}"),
        &|v| v <= TARGET_AGENT_TTFT_RATIO,
    );
    ratio_row(
        md,
        "the scheduler's time per step, on − off",
        &|off, on| {
            if off.steps > 0 && on.steps > 0 {
                on.scheduler_us_per_step - off.scheduler_us_per_step
            } else {
                f64::NAN
            }
        },
        " µs",
        format!("≤ {TARGET_SCHEDULER_EXTRA_US} µs"),
        &|v| v <= TARGET_SCHEDULER_EXTRA_US,
    );
    let _ = writeln!(md);
}

/// KV preemptions in every make-room round, by number of callers.
fn preemption_row(md: &mut String, f: &Figures) {
    let on_rounds = || f.rounds.iter().filter(|r| r.condition == MAKE_ROOM_ON);
    let counts: Vec<(usize, String)> = f
        .caller_counts()
        .into_iter()
        .map(|n| {
            let list: Vec<String> = on_rounds()
                .filter(|r| r.callers == n)
                .map(|r| r.engine.kv_preemptions.to_string())
                .collect();
            (n, list.join(", "))
        })
        .filter(|(_, list)| !list.is_empty())
        .collect();
    target_row(
        md,
        "KV preemptions in each make-room round",
        per_callers(&counts),
        "≥ 1 in every round".into(),
        on_rounds().count() > 0 && on_rounds().all(|r| r.engine.kv_preemptions > 0),
    );
}

/// Turns per condition and number of callers; the SLO's must be the count's own.
fn turns_row(md: &mut String, f: &Figures) {
    let counts = f.caller_counts();
    let turns_of = |c: &str, n: usize| f.condition(c, n).map_or(0, |c| c.summary.turns);
    let turns: Vec<(usize, String)> = counts
        .iter()
        .map(|&n| {
            let [alone, off, on] =
                [VOICE_ALONE, MAKE_ROOM_OFF, MAKE_ROOM_ON].map(|c| turns_of(c, n));
            (n, format!("alone {alone}, off {off}, on {on}"))
        })
        .collect();
    let enough = counts.iter().all(|&n| {
        turns_of(VOICE_ALONE, n) >= TARGET_SLO_TURNS
            && turns_of(MAKE_ROOM_OFF, n) >= TARGET_TURNS
            && turns_of(MAKE_ROOM_ON, n) >= TARGET_TURNS
    });
    target_row(
        md,
        "turns per condition",
        per_callers(&turns),
        format!("≥ {TARGET_SLO_TURNS} alone, ≥ {TARGET_TURNS} beside agents"),
        !counts.is_empty() && enough,
    );
}

/// One headline row: the figure, what was measured, the target, and whether it was met.
fn target_row(md: &mut String, figure: &str, measured: String, target: String, met: bool) {
    let verdict = if met { "met" } else { "**not met**" };
    let _ = writeln!(md, "| {figure} | {measured} | {target} | {verdict} |");
}

/// What the engine computed in each round, for the calls and for the agents.
fn engine_work(md: &mut String, f: &Figures) {
    let rounds: Vec<(usize, &RoundFigures, EngineWork)> = f
        .rounds
        .iter()
        .enumerate()
        .filter_map(|(n, r)| Some((n + 1, r, r.engine.work?)))
        .collect();
    if rounds.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Where the engine's work goes (tokens computed over each round)\n"
    );
    let _ = writeln!(
        md,
        "| # | condition | callers | seed | calls' prompt tokens | calls' decoded | agents' \
         prompt tokens | agents' decoded | prompt tokens/s, all | decoded/s, all | calls' share \
         of decoded |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (n, r, w) in rounds {
        let seconds = w.seconds.max(1e-9);
        let decoded = w.call_decoded_tokens + w.agent_decoded_tokens;
        let _ = writeln!(
            md,
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.0}% |",
            r.condition,
            r.callers,
            r.seed.map(|s| s.to_string()).unwrap_or_else(|| "–".into()),
            w.call_prompt_tokens,
            w.call_decoded_tokens,
            w.agent_prompt_tokens,
            w.agent_decoded_tokens,
            (w.call_prompt_tokens + w.agent_prompt_tokens) as f64 / seconds,
            decoded as f64 / seconds,
            w.call_decoded_tokens as f64 / decoded.max(1) as f64 * 100.0,
        );
    }
    let _ = writeln!(
        md,
        "\nOver the whole round (the window and the calls still in progress after it). \
         Prompt tokens are those computed: a context the prefix cache no longer held counts \
         again. A call's tokens include its turn hints.\n"
    );
}

fn stages(md: &mut String, f: &Figures) {
    let _ = writeln!(
        md,
        "## Where a turn's time goes (mean seconds, and share of the turn)\n"
    );
    let _ = writeln!(md, "| condition | {} |", STAGES.join(" | "));
    let _ = writeln!(md, "|---|{}", "---:|".repeat(STAGES.len()));
    for c in f.conditions.iter().filter(|c| c.summary.turns > 0) {
        let total: f64 = c.stage_means_s.iter().sum::<f64>().max(1e-9);
        let cells: Vec<String> = c
            .stage_means_s
            .iter()
            .map(|s| format!("{s:.2} s ({:.0}%)", s / total * 100.0))
            .collect();
        let _ = writeln!(
            md,
            "| {}, {} callers | {} |",
            c.condition,
            c.callers,
            cells.join(" | ")
        );
    }
    let _ = writeln!(md);
}

fn alone_gaps(md: &mut String, f: &Figures) {
    if f.alone_gaps.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## make-room against the same utterances alone (mean seconds more)\n\n\
         Each answered make-room turn minus the mean of the same recording's same utterance \
         answered in the voice-alone rounds with as many callers.\n"
    );
    let _ = writeln!(
        md,
        "| callers | turns | voice to voice [95% interval] | {} |",
        STAGES.join(" | ")
    );
    let _ = writeln!(md, "|---:|---:|---:|{}", "---:|".repeat(STAGES.len()));
    for g in &f.alone_gaps {
        let stages: Vec<String> = g
            .stage_means_s
            .iter()
            .map(|s| format!("{s:+.2} s"))
            .collect();
        let [low, high] = g.voice_to_voice_interval_s;
        let _ = writeln!(
            md,
            "| {} | {} | {:+.2} s [{low:+.2}, {high:+.2}] | {} |",
            g.callers,
            g.turns,
            g.voice_to_voice_mean_s,
            stages.join(" | ")
        );
    }
    let _ = writeln!(md);
}

fn slowest_turns(md: &mut String, report: &BenchReport) {
    let _ = writeln!(md, "## The slowest turns of each round\n");
    let _ = writeln!(
        md,
        "| # | condition | call | utterance | voice to voice | {} | heard | Smart Turn | reply started at the stop | reply |",
        STAGES.join(" | ")
    );
    let _ = writeln!(
        md,
        "|---:|---|---|---:|---:|{}---|---:|---|---|",
        "---:|".repeat(STAGES.len())
    );
    for (n, round) in report.rounds.iter().enumerate() {
        let mut turns: Vec<_> = round.turns.iter().collect();
        // Slowest as measured (not as scored: every turn past 30 s scores the same).
        let measured = |t: &crate::stats::VoiceTurn| t.voice_to_voice_s.unwrap_or(f64::INFINITY);
        turns.sort_by(|a, b| measured(b).total_cmp(&measured(a)));
        for turn in turns.iter().take(2) {
            let stages = turn.stages_s.map_or_else(
                || vec!["–".to_owned(); STAGES.len()],
                |s| s.iter().map(|v| format!("{v:.2}")).collect(),
            );
            let v2v = turn
                .voice_to_voice_s
                .map_or_else(|| "no reply".to_owned(), |v| format!("{v:.2} s"));
            let words = turn.words.as_ref().map_or_else(
                || {
                    [
                        "–".to_owned(),
                        "–".to_owned(),
                        "–".to_owned(),
                        "–".to_owned(),
                    ]
                },
                |w| {
                    let held = match (w.preemptive, w.opening_ahead) {
                        (false, _) => "no",
                        (true, false) => "yes",
                        (true, true) => "yes, opening ready",
                    };
                    [
                        quoted(&w.transcript),
                        w.end_of_turn_score
                            .map_or_else(|| "–".to_owned(), |s| format!("{s:.2}")),
                        held.to_owned(),
                        quoted(&w.reply),
                    ]
                },
            );
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {v2v} | {} | {} |",
                n + 1,
                round.condition,
                turn.call,
                turn.utterance,
                stages.join(" | "),
                words.join(" | ")
            );
        }
    }
    let _ = writeln!(md);
}

/// `text` in quotes for a table cell: its first 60 characters, no pipes.
fn quoted(text: &str) -> String {
    format!("\"{}\"", sublet_agent::clip(text, 60).replace('|', "/"))
}

mod breakdown;
#[cfg(test)]
mod tests;
