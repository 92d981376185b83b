//! A bench run as files: `summary.json` (the records and every figure computed from
//! them) and `report.md` (the figures as tables, beside the plots).

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::figures::{Figures, RoundRecord, MAKE_ROOM_OFF, MAKE_ROOM_ON};
use crate::stats::FAILED_TURN_S;

/// The acceptance targets the report checks its figures against.
pub const TARGET_P95_RATIO: f64 = 4.0;
pub const TARGET_OVER_SLO_SHARE: f64 = 0.10;
pub const TARGET_THROUGHPUT_RATIO: f64 = 0.90;
pub const TARGET_AT_BUDGET_SHARE: f64 = 0.5;

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
    pub figures: Figures,
    pub rounds: Vec<RoundRecord>,
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
    let _ = writeln!(
        md,
        "- SLO: {:.2} s (the voice-alone round's p95 voice to voice + 0.25 s); a turn with \
         no reply, or one slower than {FAILED_TURN_S:.0} s (timed out), counts as \
         {FAILED_TURN_S:.0} s; the agents' figures cover the first {:.0} s of each round.\n",
        f.slo_s, report.window_s
    );
    headline(&mut md, f);
    by_condition(&mut md, f);
    by_round(&mut md, f);
    stages(&mut md, f);
    for (title, file) in plots {
        let _ = writeln!(md, "### {title}\n\n![{title}]({file})\n");
    }
    slowest_turns(&mut md, report);
    md
}

fn headline(md: &mut String, f: &Figures) {
    let list = |values: Vec<f64>, digits: usize| {
        values
            .iter()
            .map(|v| format!("{v:.digits$}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let p95 = f
        .pairs
        .iter()
        .map(|p| p.p95_voice_to_voice_off_over_on)
        .collect::<Vec<_>>();
    let throughput = f
        .pairs
        .iter()
        .map(|p| p.agent_throughput_on_over_off)
        .collect::<Vec<_>>();
    let on = f.conditions.iter().find(|c| c.condition == MAKE_ROOM_ON);
    let (over, turns) = on.map_or((0, 0), |c| (c.summary.over_slo, c.summary.turns));
    let over_share = over as f64 / turns.max(1) as f64;
    let at_budget = |condition: &str| {
        f.rounds
            .iter()
            .filter(|r| r.condition == condition)
            .map(|r| r.kv.at_budget_share * 100.0)
            .collect::<Vec<_>>()
    };
    let all_at_budget: Vec<f64> = [at_budget(MAKE_ROOM_OFF), at_budget(MAKE_ROOM_ON)].concat();
    let all_at_least =
        |values: &[f64], target: f64| !values.is_empty() && values.iter().all(|v| *v >= target);
    let _ = writeln!(md, "## Headline\n");
    let _ = writeln!(md, "| figure | measured | target | |\n|---|---|---|---|");
    target_row(
        md,
        "p95 voice to voice, off ÷ on, each pair",
        format!("{}×", list(p95.clone(), 2)),
        format!("≥ {TARGET_P95_RATIO}×"),
        all_at_least(&p95, TARGET_P95_RATIO),
    );
    target_row(
        md,
        "replies over the SLO with make-room",
        format!("{over} of {turns} ({:.0}%)", over_share * 100.0),
        format!("≤ {:.0}%", TARGET_OVER_SLO_SHARE * 100.0),
        turns > 0 && over_share <= TARGET_OVER_SLO_SHARE,
    );
    target_row(
        md,
        "agents' output tokens/s, on ÷ off, each pair",
        list(throughput.clone(), 2),
        format!("≥ {TARGET_THROUGHPUT_RATIO}"),
        all_at_least(&throughput, TARGET_THROUGHPUT_RATIO),
    );
    target_row(
        md,
        "KV at the budget (≥ 90% used, or a request waiting for room), share of each agent \
         round (off…, on…)",
        format!("{}%", list(all_at_budget.clone(), 0)),
        format!("> {:.0}%", TARGET_AT_BUDGET_SHARE * 100.0),
        !all_at_budget.is_empty()
            && all_at_budget
                .iter()
                .all(|s| *s > TARGET_AT_BUDGET_SHARE * 100.0),
    );
    let _ = writeln!(md);
}

/// One headline row: the figure, what was measured, the target, and whether it was met.
fn target_row(md: &mut String, figure: &str, measured: String, target: String, met: bool) {
    let verdict = if met { "met" } else { "**not met**" };
    let _ = writeln!(md, "| {figure} | {measured} | {target} | {verdict} |");
}

fn by_condition(md: &mut String, f: &Figures) {
    let _ = writeln!(md, "## By condition (rounds pooled)\n");
    let _ = writeln!(
        md,
        "| condition | rounds | turns | failed | v2v p50 | v2v p95 | v2v max | over SLO | \
         first token p50 / p95 | first sentence p50 / p95 | agent calls | agent errors | \
         agent tok/s | agent TTFT p95 | KV at budget |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for c in &f.conditions {
        let s = &c.summary;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} s | {:.2} s | {:.2} s | {} | {:.2} / {:.2} s | \
             {:.2} / {:.2} s | {} | {} | {:.2} | {:.2} s | {:.0}% |",
            c.condition,
            c.rounds,
            s.turns,
            s.failed_turns,
            s.voice_to_voice_p50_s,
            s.voice_to_voice_p95_s,
            s.voice_to_voice_max_s,
            s.over_slo,
            s.first_token_p50_s,
            s.first_token_p95_s,
            s.first_sentence_p50_s,
            s.first_sentence_p95_s,
            s.agent_calls,
            s.agent_errors,
            s.agent_tokens_per_s,
            s.agent_first_token_p95_s,
            c.kv_at_budget_share * 100.0
        );
    }
    let _ = writeln!(md);
}

fn by_round(md: &mut String, f: &Figures) {
    let _ = writeln!(md, "## By round\n");
    let _ = writeln!(
        md,
        "| # | condition | seed | turns | v2v p95 | over SLO | agent tok/s | agent TTFT p95 | \
         KV at budget | KV mean | KV preemptions | held request-steps | hold releases | first-sentence releases | prefill chunks | turn hints |"
    );
    let _ = writeln!(
        md,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (n, r) in f.rounds.iter().enumerate() {
        let (s, kv) = (&r.summary, &r.kv);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.2} s | {} | {:.2} | {:.2} s | {:.0}% | {:.0}% | {} | {} | {} | {} | {} | {} |",
            n + 1,
            r.condition,
            r.seed.map(|s| s.to_string()).unwrap_or_else(|| "–".into()),
            s.turns,
            s.voice_to_voice_p95_s,
            s.over_slo,
            s.agent_tokens_per_s,
            s.agent_first_token_p95_s,
            kv.at_budget_share * 100.0,
            kv.mean_use * 100.0,
            kv.kv_preemptions,
            kv.held_request_steps,
            kv.hold_releases,
            kv.first_sentence_releases,
            kv.prefill_chunks,
            kv.hints_seen
        );
    }
    let _ = writeln!(md);
    if !f.pairs.is_empty() {
        let _ = writeln!(
            md,
            "| pair (seed) | p95 v2v off ÷ on | agent tok/s on ÷ off |\n|---|---:|---:|"
        );
        for p in &f.pairs {
            let _ = writeln!(
                md,
                "| {} | {:.2}× | {:.2} |",
                p.seed.map(|s| s.to_string()).unwrap_or_else(|| "–".into()),
                p.p95_voice_to_voice_off_over_on,
                p.agent_throughput_on_over_off
            );
        }
        let _ = writeln!(md);
    }
}

fn stages(md: &mut String, f: &Figures) {
    let _ = writeln!(
        md,
        "## Where a turn's time goes (mean seconds, and share of the turn)\n"
    );
    let _ = writeln!(md, "| condition | {} |", STAGES.join(" | "));
    let _ = writeln!(md, "|---|{}", "---:|".repeat(STAGES.len()));
    for c in &f.conditions {
        let total: f64 = c.stage_means_s.iter().sum::<f64>().max(1e-9);
        let cells: Vec<String> = c
            .stage_means_s
            .iter()
            .map(|s| format!("{s:.2} s ({:.0}%)", s / total * 100.0))
            .collect();
        let _ = writeln!(md, "| {} | {} |", c.condition, cells.join(" | "));
    }
    let _ = writeln!(md);
}

fn slowest_turns(md: &mut String, report: &BenchReport) {
    let _ = writeln!(md, "## The slowest turns of each round\n");
    let _ = writeln!(
        md,
        "| # | condition | call | utterance | voice to voice | {} |",
        STAGES.join(" | ")
    );
    let _ = writeln!(
        md,
        "|---:|---|---|---:|---:|{}",
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
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {v2v} | {} |",
                n + 1,
                round.condition,
                turn.call,
                turn.utterance,
                stages.join(" | ")
            );
        }
    }
    let _ = writeln!(md);
}
