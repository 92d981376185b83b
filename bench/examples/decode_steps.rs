//! Sequences decoding, again and again, for a profiler to watch: engine-bench's
//! single-sequence decode (its prompt, mistral.rs's own scheduler, greedy), or with `SEQS`
//! = N its N sequences of different lengths on make-room's scheduler, repeated for `ROUNDS`
//! rounds with each round's median step printed.
//!
//! ```text
//! cargo build --release --workspace --examples
//! $CARGO_TARGET_DIR/release/examples/decode_steps [--llm FILE]
//! perf record -g -p PID   # while it runs
//! ```
//!
//! `ROUNDS` (20) rounds of `TOKENS` (64) tokens each. With `CACHED=1` every round sends the
//! same prompts, so that after the first the prefix cache holds them and a profile of the
//! rounds sees decode steps, not prompt passes.

use std::time::Instant;

use clap::Parser;
use sublet_bench::engine_speed::Prompt;
use sublet_bench::engine_speed::{SpeedOptions, Workload};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{ChatRequest, Engine, EngineConfig, StreamEvent, VOICE_PRIORITY};
use sublet_models::ModelArgs;

#[derive(Parser, Debug)]
struct Args {
    #[command(flatten)]
    models: ModelArgs,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One request's token arrival times.
fn arrivals(
    engine: &Engine,
    prompt: &Prompt,
    tokens: usize,
    cached: bool,
) -> anyhow::Result<Vec<Instant>> {
    let messages = match cached {
        true => prompt.messages.clone(),
        false => prompt.fresh(),
    };
    let mut stream = engine.chat(ChatRequest::new(messages, tokens))?;
    let mut arrivals = Vec::new();
    while let Some(event) = stream.next_blocking() {
        match event? {
            StreamEvent::Text(_) => arrivals.push(Instant::now()),
            StreamEvent::Done(_) => break,
            StreamEvent::ToolCalls(_) => {}
        }
    }
    Ok(arrivals)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cache = sublet_agent::models::choose(&args.models)?;
    let sequences = env_or("SEQS", 1).max(1);
    // As engine-bench: one sequence on mistral.rs's scheduler, several on make-room's.
    let make_room = (sequences > 1).then(|| PolicyConfig {
        switches: Switches::all(),
        kv_budget_tokens: 16_384,
        chunk_tokens: None,
        whole_prompt_priority: Some(VOICE_PRIORITY),
        ..PolicyConfig::default()
    });
    let engine = std::sync::Arc::new(Engine::load(&EngineConfig {
        make_room,
        ..EngineConfig::from_cache(&cache)?
    })?);
    let options = SpeedOptions {
        prefill_tokens: Vec::new(),
        multi: vec![sequences],
        ..SpeedOptions::default()
    };
    let workload = Workload::new(&engine, &options)?;
    let prompts = match sequences {
        1 => vec![workload.decode],
        _ => workload.multi.into_iter().next().unwrap_or_default(),
    };
    let tokens = env_or("TOKENS", options.decode_tokens);
    let cached = env_or("CACHED", 0) == 1;
    let lengths: Vec<usize> = prompts.iter().map(|p| p.tokens).collect();
    println!("pid {}, prompts of {lengths:?} tokens", std::process::id());
    for round in 0..env_or("ROUNDS", 20) {
        let threads: Vec<_> = prompts
            .iter()
            .cloned()
            .map(|prompt| {
                let engine = engine.clone();
                std::thread::spawn(move || arrivals(&engine, &prompt, tokens, cached))
            })
            .collect();
        // The first sequence's gaps: one step of the pass all of them share.
        let mut first = Vec::new();
        for (i, thread) in threads.into_iter().enumerate() {
            let got = thread.join().expect("a request thread panicked")?;
            if i == 0 {
                first = got;
            }
        }
        let mut gaps: Vec<f64> = first
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
            .collect();
        gaps.sort_by(f64::total_cmp);
        if let Some(median) = gaps.get(gaps.len() / 2) {
            println!(
                "round {round}: {} tokens, median step {median:.2} ms",
                first.len()
            );
        }
    }
    Ok(())
}
