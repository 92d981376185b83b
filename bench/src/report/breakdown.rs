//! The report's tables by condition and by round.

use super::*;

pub(super) fn by_condition(md: &mut String, f: &Figures) {
    let _ = writeln!(md, "## By condition (rounds pooled)\n");
    let _ = writeln!(
        md,
        "| condition | callers | rounds | turns | failed | v2v p50 | v2v p95 [95% interval] | \
         v2v max | over SLO | first token p50 / p95 | first sentence p50 / p95 | replies with a \
         gap (longest) | agent calls | agent errors | agent tok/s | agent TTFT p95 | KV at budget \
         | KV preemptions | scheduler per step |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in &f.conditions {
        let s = &c.summary;
        let [lo, hi] = s.voice_to_voice_p95_interval_s;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} s | {:.2} s [{lo:.2}, {hi:.2}] | {:.2} s | {} \
             ({:.1}%) | {:.2} / {:.2} s | {:.2} / {:.2} s | {} | {} | {} | {:.2} | {:.2} s | \
             {:.0}% | {} | {:.1} µs |",
            c.condition,
            c.callers,
            c.rounds,
            s.turns,
            s.failed_turns,
            s.voice_to_voice_p50_s,
            s.voice_to_voice_p95_s,
            s.voice_to_voice_max_s,
            s.over_slo,
            s.over_slo_share * 100.0,
            s.first_token_p50_s,
            s.first_token_p95_s,
            s.first_sentence_p50_s,
            s.first_sentence_p95_s,
            s.reply_gaps
                .map_or("–".to_owned(), |(n, max)| format!("{n} ({max:.2} s)")),
            s.agent_calls,
            s.agent_errors,
            s.agent_tokens_per_s,
            s.agent_first_token_p95_s,
            c.kv_at_budget_share * 100.0,
            c.kv_preemptions,
            c.scheduler_us_per_step,
        );
    }
    let _ = writeln!(
        md,
        "\nReplies with a gap: answered replies inside which the caller heard {NOTICED_GAP_S} s \
         or more of silence, a sentence over and the next not yet synthesized (–: not recorded \
         in this run).\n"
    );
}

pub(super) fn by_round(md: &mut String, f: &Figures) {
    let _ = writeln!(md, "## By round\n");
    let _ = writeln!(
        md,
        "| # | condition | callers | seed | turns | v2v p95 | over SLO | agent tok/s | agent \
         TTFT p95 | KV at budget | KV mean | KV preemptions | growth preemptions | held \
         request-steps | hold releases | first-sentence releases | paced steps | prefill chunks \
         | turn hints \
         | hints withdrawn | retained turns | retained hits | turn prompts cached | steps | \
         scheduler per step | CPU, cores | host steal, cores |"
    );
    let _ = writeln!(
        md,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (n, r) in f.rounds.iter().enumerate() {
        let (s, e) = (&r.summary, &r.engine);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} s | {} | {:.2} | {:.2} s | {:.0}% | {:.0}% | {} | \
             {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} µs | {} | {} |",
            n + 1,
            r.condition,
            r.callers,
            r.seed.map(|s| s.to_string()).unwrap_or_else(|| "–".into()),
            s.turns,
            s.voice_to_voice_p95_s,
            s.over_slo,
            s.agent_tokens_per_s,
            s.agent_first_token_p95_s,
            e.at_budget_share * 100.0,
            e.mean_use * 100.0,
            e.kv_preemptions,
            e.growth_preemptions,
            e.held_request_steps,
            e.hold_releases,
            e.first_sentence_releases,
            e.paced_steps,
            e.prefill_chunks,
            e.hints_seen,
            e.hints_superseded,
            e.retained_turns,
            e.retained_hits,
            e.turn_prompt_cached_share
                .map_or("–".into(), |s| format!("{:.0}%", s * 100.0)),
            e.steps,
            e.scheduler_us_per_step,
            e.cpu_cores.map_or("–".into(), |c| format!("{c:.2}")),
            e.steal_cores.map_or("–".into(), |c| format!("{c:.2}")),
        );
    }
    let _ = writeln!(
        md,
        "\nCPU, cores: the bench process's CPU time (engine, voice pipeline, replayer; not \
         AIPerf) over the round's wall time. Host steal, cores: the CPU time the host took \
         from this machine's cores over the round (Linux's steal time; – where not \
         recorded): a round with steal is not comparable with one without.\n"
    );
    if !f.pairs.is_empty() {
        let _ = writeln!(
            md,
            "| pair (seed) | callers | p95 v2v off ÷ on | agent tok/s on ÷ off | agent TTFT p95 \
             on ÷ off | agent tok/s off ÷ alone | agent tok/s on ÷ alone |\n\
             |---|---:|---:|---:|---:|---:|---:|"
        );
        let or_dash = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
        for p in &f.pairs {
            let _ = writeln!(
                md,
                "| {} | {} | {:.2}× | {:.2} | {:.2} | {} | {} |",
                p.seed.map(|s| s.to_string()).unwrap_or_else(|| "–".into()),
                p.callers,
                p.p95_voice_to_voice_off_over_on,
                p.agent_throughput_on_over_off,
                p.agent_first_token_p95_on_over_off,
                or_dash(p.agent_throughput_off_over_alone),
                or_dash(p.agent_throughput_on_over_alone),
            );
        }
        let _ = writeln!(
            md,
            "\nalone: the agents-alone round with the pair's seed (the same sessions, no \
             callers), over as much of its window as the pair's."
        );
        let _ = writeln!(md);
    }
}
