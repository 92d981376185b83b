//! Where the memory goes, workload by workload: the process's resident memory beside what
//! each part holds, so that "the model fits" can be read against "the workload fits".
//!
//! ```text
//! memory [--agents 4] [--agents-ahead-s 20]
//! ```
//!
//! Three workloads, one after the other in one process: **idle** (the engine, Whisper and
//! one call's VAD, Smart Turn and Piper loaded, no turn yet); **one call** (a recorded call
//! of three turns in real time); **a call beside N agents** (the same call while N coding
//! agents replay their sessions through the OpenAI-compatible API). During each, a sampler
//! keeps the moment of most resident memory and shows it split, every figure in resident
//! bytes:
//! - the pages of files (the program's code, its libraries);
//! - each part's large blocks (`sublet-heap`: malloc interposed, each block attributed to
//!   the model whose code allocated it, counted by the pages it has touched): the engine
//!   (beside its own figures: weights, KV allocated and used, the prefix cache's KV),
//!   Whisper, the turn detector, Piper, and the rest of the program;
//! - the small blocks of every part (glibc's bytes in use less the large blocks');
//! - the heap freed but kept by the allocator's arenas (no trimmer runs here);
//! - what none of these accounts for (threads' stacks, the allocator's own pages), which
//!   must stay within 10% of resident memory.
//!
//! The activations and workspace of a step are transient: the heap's largest rise within
//! one scheduled step is shown on its own line (counted by the allocator this binary
//! installs); between steps that memory is free in the arenas or reused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use sublet_agent::{AgentConfig, Pacing, Quiet, SpeechMemory, VoiceAgent};
use sublet_bench::{agents, trace};
use sublet_engine::memory::{
    counted_heap, heap_figures, resident_bytes, CountingAllocator, EngineMemory, HeapFigures,
};
use sublet_engine::{deployed_make_room, Engine, EngineConfig};
use sublet_heap::{large_blocks, LargeBlocks, Owner};
use sublet_models::ModelArgs;

#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;
sublet_heap::interpose_malloc!();

/// The recorded call each workload plays.
const CALL: &str = "three_turns.wav";
/// How often the sampler looks.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// What may stay unaccounted for, as a share of resident memory.
const UNACCOUNTED_SHARE: f64 = 0.10;

#[derive(Parser, Debug)]
#[command(name = "memory")]
struct Args {
    /// Coding agents beside the call in the third workload.
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Seconds the agents run before the call starts, so that their contexts are in.
    #[arg(long, default_value_t = 20.0)]
    agents_ahead_s: f64,
    #[command(flatten)]
    models: ModelArgs,
}

/// The process at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    resident: u64,
    /// Resident pages of files: code and libraries.
    file_backed: u64,
    blocks: LargeBlocks,
    heap: HeapFigures,
    /// What Rust code holds of the heap (the counting allocator's figure).
    rust_heap: u64,
    engine: EngineMemoryCopy,
    speech: SpeechMemory,
}

/// [`EngineMemory`]'s figures, kept by value.
#[derive(Debug, Clone, Copy)]
struct EngineMemoryCopy {
    weights: u64,
    kv_allocated: u64,
    kv_used: u64,
    prefix_cache: u64,
    step_peak: Option<u64>,
}

impl From<EngineMemory> for EngineMemoryCopy {
    fn from(m: EngineMemory) -> Self {
        Self {
            weights: m.weights_bytes.unwrap_or(0),
            kv_allocated: m.kv_allocated_bytes,
            kv_used: m.kv_used_bytes,
            prefix_cache: m.prefix_cache_bytes,
            step_peak: m.step_peak_bytes,
        }
    }
}

fn sample(agent: &VoiceAgent) -> Option<Sample> {
    Some(Sample {
        resident: resident_bytes()?,
        file_backed: sublet_heap::file_backed_bytes()?,
        blocks: large_blocks()?,
        heap: heap_figures()?,
        rust_heap: counted_heap().unwrap_or(0) as u64,
        engine: agent.engine.memory().into(),
        speech: agent.speech_memory(),
    })
}

/// Runs `work` while a sampler keeps the sample of most resident memory.
fn peak_during<T>(agent: &VoiceAgent, work: impl FnOnce() -> Result<T>) -> Result<(T, Sample)> {
    let done = AtomicBool::new(false);
    let peak: Mutex<Option<Sample>> = Mutex::new(sample(agent));
    let keep = |s: Sample| {
        let mut peak = peak.lock().unwrap_or_else(|e| e.into_inner());
        if peak.is_none_or(|p| s.resident > p.resident) {
            *peak = Some(s);
        }
    };
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            sublet_bench::sample_until(&done, SAMPLE_EVERY, || {
                if let Some(s) = sample(agent) {
                    keep(s);
                }
            })
        });
        let out = work();
        done.store(true, Ordering::Relaxed);
        out
    })?;
    if let Some(s) = sample(agent) {
        keep(s);
    }
    let peak = peak.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok((
        out,
        peak.context("no memory figures here (Linux with glibc only)")?,
    ))
}

fn run(args: Args) -> Result<()> {
    anyhow::ensure!(
        large_blocks().is_some(),
        "no figures of large blocks here (Linux with glibc only)"
    );
    let cache = sublet_agent::models::choose(&args.models)?;
    eprintln!("memory: loading the engine");
    let engine = Arc::new(Engine::load(&EngineConfig {
        make_room: Some(deployed_make_room()),
        ..EngineConfig::from_cache(&cache)?
    })?);
    let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), AgentConfig::default());
    let call = sublet_audio::read_wav(cache.call(CALL)?)?;
    let mut columns: Vec<(String, Sample)> = Vec::new();

    eprintln!("memory: idle, the models of a call loaded");
    let detector = agent.new_detector()?;
    let responder = agent.new_responder()?;
    let idle = sample(&agent).context("no memory figures here (Linux with glibc only)")?;
    drop((detector, responder));
    columns.push(("idle".into(), idle));

    eprintln!("memory: one call ({CALL}, {:.0} s)", call.duration_s());
    let play = || agent.answer_recording(&call, Pacing::Realtime, call.rate, &mut Quiet);
    let (outcome, one_call) = peak_during(&agent, play)?;
    eprintln!("memory:   {} turns answered", outcome.turns.len());
    columns.push(("one call".into(), one_call));

    let runtime = tokio::runtime::Runtime::new()?;
    let base_url = agents::serve_api(&engine, &runtime)?;
    let sessions = trace::generate(
        1,
        &trace::GeneratorConfig {
            sessions: args.agents,
            stagger_s: 1.0,
            ..trace::GeneratorConfig::default()
        },
    );
    eprintln!(
        "memory: the call beside {} agents (they start {:.0} s ahead)",
        args.agents, args.agents_ahead_s
    );
    let stop = AtomicBool::new(false);
    let beside = std::thread::scope(|scope| -> Result<Sample> {
        let replay = scope.spawn(|| agents::replay(&base_url, &sessions, &stop, Instant::now(), 0));
        let ahead = Duration::from_secs_f64(args.agents_ahead_s);
        let played = peak_during(&agent, || {
            std::thread::sleep(ahead);
            play()
        });
        stop.store(true, Ordering::Relaxed);
        let agent_calls = replay
            .join()
            .map_err(|_| anyhow::anyhow!("the agents panicked"))?;
        let (outcome, beside) = played?;
        eprintln!(
            "memory:   {} turns answered; the agents made {} requests",
            outcome.turns.len(),
            agent_calls.len()
        );
        Ok(beside)
    })?;
    columns.push((format!("call + {} agents", args.agents), beside));

    let within = print_table(&columns);
    anyhow::ensure!(
        within,
        "more than {:.0}% of resident memory is not accounted for",
        UNACCOUNTED_SHARE * 100.0
    );
    Ok(())
}

/// The small blocks of every part: glibc's bytes in use less the large blocks'.
fn small_blocks(s: &Sample) -> u64 {
    s.heap
        .in_use()
        .saturating_sub(s.blocks.total().allocated + s.blocks.unrecorded)
}

/// Resident memory less every part the table shows.
fn unaccounted(s: &Sample) -> i64 {
    let parts = s.file_backed + s.blocks.total().resident + small_blocks(s) + s.heap.arena_free;
    s.resident as i64 - parts as i64
}

/// Prints the table; whether every workload's figures add up to its resident memory
/// within [`UNACCOUNTED_SHARE`].
fn print_table(columns: &[(String, Sample)]) -> bool {
    let mb = |bytes: u64| format!("{:.0}", bytes as f64 / (1024.0 * 1024.0));
    let owned = move |owner: Owner| {
        move |s: &Sample| {
            let b = s.blocks.of(owner);
            format!("{} of {}", mb(b.resident), mb(b.allocated))
        }
    };
    type Cell = Box<dyn Fn(&Sample) -> String>;
    let rows: Vec<(&str, Cell)> = vec![
        (
            "resident memory",
            Box::new(move |s: &Sample| mb(s.resident)),
        ),
        (
            "  code and libraries (pages of files)",
            Box::new(move |s: &Sample| mb(s.file_backed)),
        ),
        (
            "  engine's large blocks: resident of allocated",
            Box::new(owned(Owner::Engine)),
        ),
        (
            "    its weights (SmolLM2-135M, as held)",
            Box::new(move |s: &Sample| mb(s.engine.weights)),
        ),
        (
            "    KV of requests: allocated / used",
            Box::new(move |s: &Sample| {
                format!("{} / {}", mb(s.engine.kv_allocated), mb(s.engine.kv_used))
            }),
        ),
        (
            "    KV in the prefix cache",
            Box::new(move |s: &Sample| mb(s.engine.prefix_cache)),
        ),
        (
            "  Whisper: model and transcribers' state",
            Box::new(owned(Owner::Whisper)),
        ),
        (
            "    of which its load (weights)",
            Box::new(move |s: &Sample| mb(s.speech.whisper_bytes.unwrap_or(0))),
        ),
        (
            "  VAD and Smart Turn (ONNX Runtime)",
            Box::new(owned(Owner::TurnDetector)),
        ),
        (
            "    of which their load (weights)",
            Box::new(move |s: &Sample| mb(s.speech.turn_detector_bytes.unwrap_or(0))),
        ),
        ("  Piper (ONNX Runtime)", Box::new(owned(Owner::Voice))),
        (
            "    of which its load (weights)",
            Box::new(move |s: &Sample| mb(s.speech.voice_bytes.unwrap_or(0))),
        ),
        (
            "  other large blocks (runtime, audio, HTTP)",
            Box::new(owned(Owner::Other)),
        ),
        (
            "  small blocks, every part's",
            Box::new(move |s: &Sample| mb(small_blocks(s))),
        ),
        (
            "  heap freed, kept by the arenas",
            Box::new(move |s: &Sample| mb(s.heap.arena_free)),
        ),
        (
            "  not accounted for (stacks, allocator)",
            Box::new(move |s: &Sample| {
                let gap = unaccounted(s);
                format!(
                    "{:.0} ({:+.1}%)",
                    gap as f64 / (1024.0 * 1024.0),
                    100.0 * gap as f64 / s.resident as f64
                )
            }),
        ),
        (
            "activations and workspace: most in a step",
            Box::new(move |s: &Sample| s.engine.step_peak.map_or("-".into(), mb)),
        ),
        (
            "heap allocated, touched or not (glibc)",
            Box::new(move |s: &Sample| mb(s.heap.in_use())),
        ),
        (
            "  of which Rust's allocations",
            Box::new(move |s: &Sample| mb(s.rust_heap)),
        ),
    ];
    let width = 20;
    let header: String = columns
        .iter()
        .map(|(n, _)| format!("{n:>width$}"))
        .collect();
    println!("\nwhere the memory goes, at each workload's most resident moment (MB)");
    println!("{:<48}{header}", "");
    for (label, cell) in &rows {
        let cells: String = columns
            .iter()
            .map(|(_, s)| format!("{:>width$}", cell(s)))
            .collect();
        println!("{label:<48}{cells}");
    }
    let within = columns.iter().all(|(_, s)| {
        (unaccounted(s).unsigned_abs() as f64) <= UNACCOUNTED_SHARE * s.resident as f64
    });
    println!(
        "\nthe parts add up to resident memory within {:.0}%: {}",
        UNACCOUNTED_SHARE * 100.0,
        if within { "yes" } else { "no" }
    );
    within
}

fn main() -> std::process::ExitCode {
    HEAP.start();
    // Calls run here, each on threads of its own; no trimmer, so that the arenas' free
    // memory stays resident and counted.
    sublet_agent::allocator::one_arena_per_core();
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memory: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
