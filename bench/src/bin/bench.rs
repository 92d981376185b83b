//! The evaluation: recorded calls through the voice pipeline beside replayed coding-agent
//! sessions, make-room off against on, with a voice-alone round setting the SLO.
//!
//! ```text
//! bench [--agents N] [--calls M] [--rounds R] [--minutes T] [--seed S] [--trace FILE] [--out DIR]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use sublet_agent::{AgentConfig, Pacing, Quiet, TurnRecord, VoiceAgent};
use sublet_bench::stats::{slo_from_voice_alone, summarize, AgentCallRecord, Summary, VoiceTurn};
use sublet_bench::{agents, trace};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::server::{router, Metrics, ServerConfig};
use sublet_engine::{Engine, EngineConfig, VOICE_PRIORITY};
use sublet_models::ModelCache;

#[derive(Parser, Debug)]
#[command(name = "bench")]
struct Args {
    /// Coding-agent sessions beside the calls (generated, unless --trace).
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Recorded calls at once, each started a few seconds after the last.
    #[arg(long, default_value_t = 2)]
    calls: usize,
    /// Pairs of rounds beside the agents (make-room off, then on, with the same seed).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// How long the agents run in each round, in minutes: their throughput is measured over
    /// this window, the same in every round (the calls start at its beginning and are
    /// always answered to the end).
    #[arg(long, default_value_t = 2.0)]
    minutes: f64,
    /// The seed of the generated sessions (each pair of rounds adds its index).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replay these sessions (JSONL, see `bench/src/trace.rs`) instead of generating them.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// make-room's KV budget, in tokens.
    #[arg(long, default_value_t = 4096)]
    kv_budget: usize,
    /// make-room's prompt chunk for agent prompts while a voice turn is near, in tokens.
    #[arg(long, default_value_t = 16)]
    chunk: usize,
    /// make-room's step budget while no voice turn is near, in tokens (0: the chunk).
    #[arg(long, default_value_t = 128)]
    idle_chunk: usize,
    /// Where the summary and the report go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

/// The recorded calls the rounds replay, in turn.
const CALLS: [&str; 3] = [
    "three_turns.wav",
    "quick_questions.wav",
    "trip_planning.wav",
];
/// Calls start this far apart.
const CALL_STAGGER_S: f64 = 3.0;
/// The engine's state is sampled this often through every round.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// One round's records.
struct Round {
    condition: &'static str,
    seed: Option<u64>,
    duration_s: f64,
    turns: Vec<VoiceTurn>,
    agents: Vec<AgentCallRecord>,
    samples: Vec<Value>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let cache = ModelCache::from_env();
    let engine = Arc::new(Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig {
            switches: Switches::all(),
            kv_budget_tokens: args.kv_budget,
            chunk_tokens: Some(args.chunk.max(1)),
            idle_chunk_tokens: (args.idle_chunk > 0).then_some(args.idle_chunk),
            whole_prompt_priority: Some(VOICE_PRIORITY),
            ..PolicyConfig::default()
        }),
        ..EngineConfig::bundled(&cache)?
    })?);
    // Turn hints tell make-room a turn is coming, so that agent chunks shrink before it.
    let config = AgentConfig {
        turn_hints: true,
        ..AgentConfig::default()
    };
    let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), config);
    let runtime = tokio::runtime::Runtime::new()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base_url = format!("http://{}", listener.local_addr()?);
    let app = router(
        engine.clone(),
        ServerConfig::default(),
        Arc::new(Metrics::default()),
    );
    runtime.spawn(async move { axum::serve(listener, app).await });
    let trace_file = match &args.trace {
        Some(path) => Some(trace::parse(
            &std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
        )?),
        None => None,
    };
    let sessions_for = |seed: u64| match &trace_file {
        Some(calls) => calls.clone(),
        None => trace::generate(
            seed,
            &trace::GeneratorConfig {
                sessions: args.agents,
                ..trace::GeneratorConfig::default()
            },
        ),
    };
    let limit = Duration::from_secs_f64(args.minutes * 60.0);
    let started = Instant::now();
    let mut rounds = Vec::new();
    let plan: Vec<(&'static str, Option<u64>)> = std::iter::once(("voice alone", None))
        .chain((0..args.rounds).flat_map(|r| {
            let seed = args.seed + r as u64;
            [("make-room off", Some(seed)), ("make-room on", Some(seed))]
        }))
        .collect();
    for (n, (condition, seed)) in plan.iter().enumerate() {
        eprintln!(
            "bench: round {}/{}: {condition}{} ({:.0} s so far)",
            n + 1,
            plan.len(),
            seed.map(|s| format!(", seed {s}")).unwrap_or_default(),
            started.elapsed().as_secs_f64()
        );
        let switches = if *condition == "make-room off" {
            Switches::default()
        } else {
            Switches::all()
        };
        wait_idle(&engine)?;
        engine.set_make_room_switches(switches);
        let sessions = seed.map(sessions_for).unwrap_or_default();
        let round = run_round(
            &agent, &engine, &base_url, &cache, args.calls, &sessions, limit, condition, *seed,
        )?;
        let done = round
            .turns
            .iter()
            .filter(|t| t.voice_to_voice_s.is_some())
            .count();
        eprintln!(
            "bench:   {} turns answered of {}, {} agent calls, {:.0} s",
            done,
            round.turns.len(),
            round.agents.len(),
            round.duration_s
        );
        rounds.push(round);
    }
    report(&args, &rounds)
}

/// Waits for the engine to finish what the last round left running.
fn wait_idle(engine: &Engine) -> Result<()> {
    let until = Instant::now() + Duration::from_secs(300);
    loop {
        let state = engine.scheduler_state();
        if state.running == 0 && state.waiting == 0 {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("the engine did not go idle in 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[allow(clippy::too_many_arguments)]
fn run_round(
    agent: &VoiceAgent,
    engine: &Engine,
    base_url: &str,
    cache: &ModelCache,
    calls: usize,
    sessions: &[trace::AgentCall],
    limit: Duration,
    condition: &'static str,
    seed: Option<u64>,
) -> Result<Round> {
    let round_start = Instant::now();
    let stop = AtomicBool::new(false);
    let calls_done = AtomicBool::new(false);
    let samples = Mutex::new(Vec::new());
    let (turns, agent_calls) = std::thread::scope(|scope| -> Result<_> {
        scope.spawn(|| {
            while !calls_done.load(Ordering::Relaxed) {
                let state = engine.scheduler_state();
                samples.lock().unwrap().push(json!({
                    "t_s": round_start.elapsed().as_secs_f64(),
                    "kv_used_tokens": state.kv_used_tokens,
                    "kv_budget_tokens": state.kv_budget_tokens,
                    "running": state.running,
                    "waiting": state.waiting,
                    "kv_preemptions": state.counters.kv_preemptions,
                    "held_request_steps": state.counters.held_request_steps,
                    "prefill_chunks": state.counters.prefill_chunks,
                    "hints_seen": state.counters.hints_seen,
                }));
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        let replayer = (!sessions.is_empty())
            .then(|| scope.spawn(|| agents::replay(base_url, sessions, &stop, round_start)));
        let callers: Vec<_> = (0..calls)
            .map(|i| {
                let name = CALLS[i % CALLS.len()];
                scope.spawn(move || -> Result<Vec<VoiceTurn>> {
                    std::thread::sleep(Duration::from_secs_f64(i as f64 * CALL_STAGGER_S));
                    let audio = sublet_audio::read_wav(cache.call(name)?)?;
                    let utterances = utterance_ends(cache, name)?;
                    let outcome = agent
                        .answer_recording(&audio, Pacing::Realtime, 16_000, &mut Quiet)?
                        .turns;
                    Ok(match_turns(&format!("{name}#{i}"), &utterances, &outcome))
                })
            })
            .collect();
        // The agents stop starting calls when the window closes; the calls run to their end.
        let window_ends = round_start + limit;
        let mut turns = Vec::new();
        for caller in callers {
            while !caller.is_finished() {
                if Instant::now() >= window_ends {
                    stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            turns.extend(
                caller
                    .join()
                    .map_err(|_| anyhow::anyhow!("a call panicked"))??,
            );
        }
        if replayer.is_some() {
            while Instant::now() < window_ends {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        stop.store(true, Ordering::Relaxed);
        calls_done.store(true, Ordering::Relaxed);
        let agent_calls = replayer
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default();
        Ok((turns, agent_calls))
    })?;
    Ok(Round {
        condition,
        seed,
        duration_s: round_start.elapsed().as_secs_f64(),
        turns,
        agents: agent_calls,
        samples: samples.into_inner().unwrap(),
    })
}

/// Where each utterance of a recorded call ends, from the JSON beside it.
fn utterance_ends(cache: &ModelCache, call: &str) -> Result<Vec<f64>> {
    let json = cache.call(&call.replace(".wav", ".json"))?;
    let spans: Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    Ok(spans["utterances"]
        .as_array()
        .context("no utterances")?
        .iter()
        .filter_map(|u| u["end_s"].as_f64())
        .collect())
}

/// Each utterance's turn: the first answered turn whose caller stop is near the
/// utterance's end; none is a failed turn.
fn match_turns(call: &str, utterance_ends: &[f64], turns: &[TurnRecord]) -> Vec<VoiceTurn> {
    utterance_ends
        .iter()
        .enumerate()
        .map(|(utterance, end_s)| {
            let turn = turns.iter().find(|t| (t.caller_stop_s - end_s).abs() < 1.0);
            VoiceTurn {
                call: call.to_owned(),
                utterance,
                voice_to_voice_s: turn.map(|t| t.voice_to_voice_s()),
                first_token_s: turn.map(|t| t.first_token_s - t.transcript_s),
                first_sentence_s: turn.map(|t| t.first_sentence_s - t.transcript_s),
                stages_s: turn.map(|t| t.stage_latencies()),
            }
        })
        .collect()
}

fn report(args: &Args, rounds: &[Round]) -> Result<()> {
    let voice_alone: Vec<VoiceTurn> = rounds
        .iter()
        .filter(|r| r.condition == "voice alone")
        .flat_map(|r| r.turns.clone())
        .collect();
    let slo_s = slo_from_voice_alone(&voice_alone);
    // The agents' figures count the calls that ended within the window, over the window.
    let window_s = args.minutes * 60.0;
    let summaries: Vec<(&Round, Summary)> = rounds
        .iter()
        .map(|r| {
            let in_window: Vec<AgentCallRecord> = r
                .agents
                .iter()
                .filter(|a| a.ended_s <= window_s)
                .cloned()
                .collect();
            (r, summarize(&r.turns, &in_window, window_s, slo_s))
        })
        .collect();
    let ratios: Vec<Value> = summaries
        .get(1..)
        .unwrap_or_default()
        .chunks(2)
        .filter(|pair| pair.len() == 2 && pair[0].0.condition == "make-room off")
        .map(|pair| {
            let (off, on) = (&pair[0].1, &pair[1].1);
            json!({
                "seed": pair[0].0.seed,
                "p95_voice_to_voice_off_over_on": off.voice_to_voice_p95_s / on.voice_to_voice_p95_s.max(1e-9),
                "agent_throughput_on_over_off": on.agent_tokens_per_s / off.agent_tokens_per_s.max(1e-9),
            })
        })
        .collect();
    let summary = json!({
        "config": {
            "agents": args.agents, "calls": args.calls, "rounds": args.rounds,
            "minutes": args.minutes, "seed": args.seed, "kv_budget": args.kv_budget,
            "chunk": args.chunk, "idle_chunk": args.idle_chunk, "turn_hints": true,
            "trace": args.trace.as_ref().map(|p| p.display().to_string()),
        },
        "slo_s": slo_s,
        "rounds": summaries.iter().map(|(r, s)| json!({
            "condition": r.condition,
            "seed": r.seed,
            "duration_s": r.duration_s,
            "summary": s,
            "turns": r.turns,
            "agent_calls": r.agents,
            "samples": r.samples,
        })).collect::<Vec<_>>(),
        "ratios_by_round": ratios,
    });
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)? + "\n")?;
    println!("SLO (voice alone p95 + 0.25 s): {slo_s:.2} s");
    println!(
        "{:<16} {:>6} {:>8} {:>8} {:>8} {:>9} {:>8} {:>11} {:>10}",
        "round",
        "turns",
        "v2v p50",
        "v2v p95",
        "v2v max",
        "over SLO",
        "1st tok",
        "agent tok/s",
        "agent TTFT"
    );
    for (round, s) in &summaries {
        println!(
            "{:<16} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>9} {:>8.2} {:>11.1} {:>10.2}",
            round.condition,
            s.turns,
            s.voice_to_voice_p50_s,
            s.voice_to_voice_p95_s,
            s.voice_to_voice_max_s,
            s.over_slo,
            s.first_token_p95_s,
            s.agent_tokens_per_s,
            s.agent_first_token_p95_s
        );
    }
    for ratio in &ratios {
        println!("{ratio}");
    }
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}
