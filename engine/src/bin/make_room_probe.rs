//! `cargo xtask probe`: make-room's probes on the real engine (see [`sublet_engine::probe`]).
//!
//! ```text
//! make_room_probe [--json PATH] [--kv-budget TOKENS] [--chunk TOKENS]
//!                 [--model MODEL.gguf] [--device cpu|cuda[:N]] [--kv-pool TOKENS|MBmb]
//! ```
//!
//! By default on the bundled model and the CPU; `gpu/check.sh` runs it on a GPU with a
//! model made there, where make-room's scheduler is the paged adapter. Exits 1 when a
//! case misses its targets (the table says which), so that a script sees it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use sublet_engine::probe::{self, CaseReport, ProbeOptions};
use sublet_engine::{Accelerator, EngineConfig};
use sublet_models::ModelCache;

const USAGE: &str = "usage: make_room_probe [--json PATH] [--kv-budget TOKENS] [--chunk TOKENS]
                       [--model MODEL.gguf] [--device cpu|cuda[:N]] [--kv-pool TOKENS|MBmb]";

fn main() -> Result<ExitCode> {
    let mut options = ProbeOptions::default();
    let mut json: Option<PathBuf> = None;
    let mut model: Option<PathBuf> = None;
    let (mut device, mut kv_pool) = ("cpu".to_string(), None::<String>);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{arg} needs a value\n{USAGE}"))?;
        match arg.as_str() {
            "--json" => json = Some(value.into()),
            "--kv-budget" => options.kv_budget_tokens = value.parse()?,
            "--chunk" => options.chunk_tokens = value.parse()?,
            "--model" => model = Some(value.into()),
            "--device" => device = value,
            "--kv-pool" => kv_pool = Some(value),
            _ => bail!("{USAGE}"),
        }
    }
    let mut config = match model {
        Some(model) => EngineConfig {
            model,
            chat_template: None,
            weights: Default::default(),
            max_running: 16,
            accelerator: Accelerator::Cpu,
            make_room: None,
            compute_nice: 0,
            mixed_passes: true,
        },
        None => EngineConfig::from_cache(&ModelCache::from_env())?,
    };
    config.accelerator =
        Accelerator::from_args(&device, kv_pool.as_deref()).map_err(anyhow::Error::msg)?;
    let report = probe::run(&config, &options, |line| eprintln!("{line}"))?;

    println!(
        "\nvoice turn alone: first token {:.0} ms, median inter-token gap {:.1} ms ({} prompt tokens)",
        report.alone.first_token_ms, report.alone.median_gap_ms, report.voice_prompt_tokens
    );
    println!(
        "{:<18} {:>10} {:>8} {:>8} {:>9} {:>9} {:>11} {:>13}",
        "case", "off ms", "on ms", "off/on", "on/alone", "gap on/", "agent tok", ""
    );
    println!(
        "{:<18} {:>10} {:>8} {:>8} {:>9} {:>9} {:>11} {:>13}",
        "", "1st token", "1st tok", "ratio", "ratio", "alone", "off / on", "targets"
    );
    let row = |name: &str, case: &CaseReport| {
        println!(
            "{:<18} {:>10.0} {:>8.0} {:>7.1}× {:>8.2}× {:>8.2}× {:>5} / {:<5} {:>13}",
            name,
            case.off.first_token_ms,
            case.on.first_token_ms,
            case.first_token_ratio_off_on,
            case.first_token_ratio_on_alone,
            case.median_gap_ratio_on_alone,
            case.off.agent_tokens,
            case.on.agent_tokens,
            if case.meets_targets { "met" } else { "MISSED" }
        )
    };
    row("kv_full", &report.kv_full);
    row("prefill_in_flight", &report.prefill_in_flight);
    println!(
        "scheduler's own cost per step on the engine: off {:.1} µs, on {:.1} µs",
        report.scheduler_us_per_step_off, report.scheduler_us_per_step_on
    );
    if let Some(path) = &json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("wrote {}", path.display());
    }
    if !report.meets_targets {
        eprintln!("make_room_probe: make-room missed its targets (MISSED above)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
