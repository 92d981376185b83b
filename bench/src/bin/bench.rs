//! The evaluation: recorded calls through the voice pipeline beside replayed coding-agent
//! sessions, make-room off against on, with a voice-alone round setting the SLO.
//!
//! ```text
//! bench [--agents N] [--calls 2,4] [--rounds 2,2] [--minutes 2,1.25] [--alone-minutes 2,1.2]
//!       [--seed S] [--trace FILE] [--out DIR]
//! ```
//!
//! For each number of callers in `--calls`, fewest first: that count's pairs of rounds,
//! make-room off and on with the same seed, each after a voice-alone round (together, the
//! SLO's turns). Before the first pair, an agents-alone round (the first pair's sessions,
//! no callers) measures what the agents get of the engine when no call takes a share. The
//! order is `sublet_bench::schedule`'s.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::json;
use sublet_agent::{AgentConfig, VoiceAgent};
use sublet_bench::aiperf::AiPerf;
use sublet_bench::figures::{figures, RoundRecord, MAKE_ROOM_ON};
use sublet_bench::report::{markdown, BenchReport};
use sublet_bench::rounds::{run_round, Recording, RoundPlan};
use sublet_bench::schedule::{self, CallerCount, RoundStep, RunShape};
use sublet_bench::{agents, mooncake, plots, trace};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{deployed_make_room, Engine, EngineConfig, SHARED_COMPUTE_NICE};
use sublet_models::{ModelArgs, AIPERF_ENV};

#[derive(Parser, Debug)]
#[command(name = "bench")]
struct Args {
    /// Coding-agent sessions beside the calls (generated, unless --trace): enough that
    /// their contexts keep the KV budget full most of the time and a caller's turn must
    /// take room from them (five left a gap a turn fitted in at most arrivals).
    #[arg(long, default_value_t = 7)]
    agents: usize,
    /// Each generated session's calls, as one task (a session then starts over).
    #[arg(long, default_value_t = 5)]
    session_calls: usize,
    /// Tokens of shared context (the repository every generated session reads) that each
    /// session's first call opens with: computed once, each running request still holds
    /// it in its KV, so two or three requests fill the 3,584-token budget.
    #[arg(long, default_value_t = 1200)]
    shared_context: usize,
    /// A generated session's own first context after the shared one, tokens: low,high.
    #[arg(long, value_delimiter = ',', default_values_t = [100, 300])]
    first_context: Vec<usize>,
    /// The tool pause before each later call of a generated session, seconds: low,high.
    #[arg(long, value_delimiter = ',', default_values_t = [5.0, 12.0])]
    tool_pause: Vec<f64>,
    /// Callers at once, each started a few seconds after the last, replaying the
    /// recordings back to back until the window closes (`--calls-once`: one call each);
    /// a list runs the rounds once for each number.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    calls: Vec<usize>,
    /// Pairs of rounds beside the agents for each number of callers (make-room off and on
    /// with the same seed; every second pair runs on first, so two pairs balance the
    /// order); one value serves every count.
    #[arg(long, value_delimiter = ',', default_value = "2,2")]
    rounds: Vec<usize>,
    /// The voice-alone time for each number of callers, in minutes, split into one round
    /// before each of its pairs and one after the last: long enough for 20 turns (a caller
    /// takes about 8 turns in 70 s); one value serves every count.
    #[arg(long, value_delimiter = ',', default_value = "2,1.2")]
    alone_minutes: Vec<f64>,
    /// How long each pair's agents and callers keep starting calls, in minutes, for each
    /// number of callers: the agents' throughput is measured over this window (calls in
    /// progress when it closes are answered to their end). Four callers take ~20 turns a
    /// minute, two ~11, so the shorter window gives 40 turns a condition in two pairs. One
    /// value serves every count.
    #[arg(long, value_delimiter = ',', default_value = "2,1.25")]
    minutes: Vec<f64>,
    /// The agents-alone round's window, in minutes (default: the longest --minutes; 0: no
    /// such round).
    #[arg(long)]
    agents_alone_minutes: Option<f64>,
    /// The seed of the generated sessions (each pair of rounds adds its index).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Replay these sessions (JSONL, see `bench/src/trace.rs`) instead of generating them.
    #[arg(long, conflicts_with = "mooncake")]
    trace: Option<PathBuf>,
    /// Replay the sessions of this Mooncake-style trace (AIPerf's format, see
    /// `bench/src/mooncake.rs`) instead of generating them.
    #[arg(long)]
    mooncake: Option<PathBuf>,
    /// Multiply the Mooncake trace's token counts by this (a GPU-sized trace scaled down).
    #[arg(long, default_value_t = 1.0)]
    mooncake_scale: f64,
    /// What sends the agents' requests: the bench's own replayer, or AIPerf (installed by
    /// `cargo xtask bench` into the cache when this asks for it).
    #[arg(long, value_enum, default_value_t = Driver::Replayer)]
    agent_driver: Driver,
    /// make-room's switches in the "on" rounds: `all`, or a comma-separated list of
    /// priority, kv_preemption, budget_cap, decode_hold, turn_hint, call_retention.
    #[arg(long, default_value = "all")]
    on_switches: Switches,
    /// make-room's KV budget, in tokens: small enough that the agents' contexts fill it
    /// when a turn arrives, so the turn must take room (with 4,096 a make-room round in
    /// each of runs 37, 38 and 40 needed none; see `docs/benchmarking.md`, run 41).
    #[arg(long, default_value_t = 3584)]
    kv_budget: usize,
    /// make-room's prompt chunk for agent prompts while a voice turn is near, in tokens.
    #[arg(long, default_value_t = 16)]
    chunk: usize,
    /// make-room's step budget while no voice turn is near, in tokens (0: the chunk); also
    /// the fixed step budget with make-room off. A voice turn arriving waits for the pass
    /// in flight: here 128 prompt tokens of a 1,000-token context took 1-1.4 s, 64 half that.
    #[arg(long, default_value_t = 64)]
    idle_chunk: usize,
    /// make-room's window: a voice reply's first tokens (about its first sentence), during
    /// which less urgent requests are held out of the steps.
    #[arg(long, default_value_t = 32)]
    first_tokens: usize,
    /// How long make-room holds agents back after a turn hint, in ms (until the turn arrives).
    #[arg(long, default_value_t = PolicyConfig::default().hint_hold_ms)]
    hint_hold_ms: u64,
    /// End a turn's hold when the agent has the reply's first sentence, not only after
    /// `--first-tokens` (`false`: hold through `--first-tokens`).
    #[arg(long, default_value_t = PolicyConfig::default().release_at_first_sentence,
          action = clap::ArgAction::Set)]
    release_at_first_sentence: bool,
    /// While a call's reply decodes, the agents' prompt chunks go into one step of this
    /// many, so that the reply keeps ahead of its speech (1: every step, as before run 47).
    #[arg(long, default_value_t = PolicyConfig::default().reply_pace_steps)]
    reply_pace_steps: usize,
    /// The nice value of the engine's threads in steps that compute for no voice turn
    /// (Linux, make-room's priority switch on): the voice pipeline's models take the cores
    /// first (0: never lowered).
    #[arg(long, default_value_t = SHARED_COMPUTE_NICE)]
    engine_nice: i32,
    /// Run a step's decodes inside its prompt chunk's forward pass (mixed passes), off and
    /// on alike; `false`: passes of their own, as before run 48.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    mixed_passes: bool,
    /// Only write the figures, `report.md` and the plots again from the records in
    /// `--out`'s `summary.json` (after a change to the figures or the report's layout).
    #[arg(long)]
    render_only: bool,
    /// Each caller makes one call, so that voice turns come through the window's first
    /// half minute only (the default replays the recordings back to back until the window
    /// closes).
    #[arg(long)]
    calls_once: bool,
    /// Where the summary and the report go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    #[command(flatten)]
    models: ModelArgs,
}

impl Args {
    /// The agents-alone round's window in minutes, its default applied (0: none).
    fn agents_alone_minutes(&self) -> f64 {
        self.agents_alone_minutes
            .unwrap_or_else(|| self.longest_window_minutes())
    }

    /// The longest of the pairs' windows, in minutes.
    fn longest_window_minutes(&self) -> f64 {
        self.minutes.iter().copied().fold(0.0, f64::max)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Driver {
    Replayer,
    Aiperf,
}

/// The recorded calls the rounds replay, in turn.
const CALLS: [&str; 3] = [
    "three_turns.wav",
    "quick_questions.wav",
    "trip_planning.wav",
];
fn main() -> ExitCode {
    // Calls run here, each on threads of its own.
    sublet_agent::allocator::for_long_running_process();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    anyhow::ensure!(
        args.first_context.len() == 2 && args.tool_pause.len() == 2,
        "--first-context and --tool-pause each take a range: low,high"
    );
    if args.render_only {
        let path = args.out.join("summary.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        // The records only: the figures are computed again (an older run's may lack some).
        let mut value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove("figures");
        }
        let mut report: BenchReport = serde_json::from_value(value)
            .with_context(|| format!("{} is not a bench summary", path.display()))?;
        report.figures = figures(&report.rounds, report.window_s);
        return write_report(&report, &args.out);
    }
    // The tree as it is when the run starts: edits made while it runs are not what ran.
    let commit = commit();
    let cache = sublet_agent::models::choose(&args.models)?;
    let engine = Arc::new(Engine::load(&EngineConfig {
        make_room: Some(PolicyConfig {
            kv_budget_tokens: args.kv_budget,
            chunk_tokens: Some(args.chunk.max(1)),
            idle_chunk_tokens: (args.idle_chunk > 0).then_some(args.idle_chunk),
            window_tokens: args.first_tokens.max(1),
            hint_hold_ms: args.hint_hold_ms,
            release_at_first_sentence: args.release_at_first_sentence,
            reply_pace_steps: args.reply_pace_steps,
            ..deployed_make_room()
        }),
        compute_nice: args.engine_nice,
        mixed_passes: args.mixed_passes,
        ..EngineConfig::from_cache(&cache)?
    })?);
    // Turn hints tell make-room a turn is coming, so that agent chunks shrink before it.
    let config = AgentConfig {
        turn_hints: true,
        ..AgentConfig::default()
    };
    let agent = VoiceAgent::with_engine(cache.clone(), engine.clone(), config);
    let recordings = CALLS
        .iter()
        .map(|name| Recording::load(&cache, name))
        .collect::<Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let base_url = agents::serve_api(&engine, &runtime)?;
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    let trace_file = match (&args.trace, &args.mooncake) {
        (Some(path), _) => Some(trace::parse(&read(path)?)?),
        (None, Some(path)) => Some(mooncake::from_mooncake(&read(path)?, args.mooncake_scale)?),
        (None, None) => None,
    };
    let aiperf = match args.agent_driver {
        Driver::Replayer => None,
        Driver::Aiperf => {
            let tokenizer = engine
                .token_counter()
                .and_then(|t| t.tokenizer_json())
                .context("the model's tokenizer cannot be written out for AIPerf")?;
            Some(AiPerf::prepare(
                &cache.path(AIPERF_ENV).join("bin/aiperf"),
                &args.out.join("aiperf"),
                &tokenizer,
                engine.model_name(),
            )?)
        }
    };
    let sessions_for = |seed: u64| match &trace_file {
        Some(calls) => calls.clone(),
        None => trace::generate(
            seed,
            &trace::GeneratorConfig {
                sessions: args.agents,
                calls_per_session: args.session_calls,
                shared_context: args.shared_context,
                first_context: (args.first_context[0], args.first_context[1]),
                pause_s: (args.tool_pause[0], args.tool_pause[1]),
                ..trace::GeneratorConfig::default()
            },
        ),
    };
    let plan = plan(&args)?;
    let started = Instant::now();
    let mut rounds = Vec::new();
    for (n, step) in plan.iter().enumerate() {
        let RoundStep {
            condition,
            seed,
            callers,
            window,
        } = *step;
        eprintln!(
            "bench: round {}/{}: {condition}, {callers} callers{}, {:.0} s window ({:.0} s so far)",
            n + 1,
            plan.len(),
            seed.map(|s| format!(", seed {s}")).unwrap_or_default(),
            window.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        let switches = if condition != MAKE_ROOM_ON {
            Switches::default()
        } else {
            args.on_switches.clone()
        };
        wait_idle(&engine)?;
        engine.set_make_room_switches(switches);
        let sessions = seed.map(sessions_for).unwrap_or_default();
        let round = run_round(&RoundPlan {
            agent: &agent,
            base_url: &base_url,
            recordings: &recordings,
            calls: callers,
            sessions: &sessions,
            window,
            condition,
            seed,
            index: n,
            fill_window: !args.calls_once,
            aiperf: aiperf.as_ref(),
        })?;
        let done = round
            .turns
            .iter()
            .filter(|t| t.voice_to_voice_s.is_some())
            .count();
        eprintln!(
            "bench:   {} turns answered of {}, {} agent calls, {:.0} s",
            done,
            round.turns.len(),
            round.agent_calls.len(),
            round.duration_s
        );
        rounds.push(round);
    }
    report(&args, commit, rounds)
}

/// The rounds `args` ask for (see [`schedule::rounds`]).
fn plan(args: &Args) -> Result<Vec<RoundStep>> {
    let mut sorted = args.calls.clone();
    sorted.sort_unstable();
    if sorted.is_empty() || sorted.contains(&0) || sorted.windows(2).any(|w| w[0] == w[1]) {
        bail!("--calls wants distinct numbers of callers, each at least 1");
    }
    fn for_count<T: Copy>(list: &[T], calls: usize, what: &str, i: usize) -> Result<T> {
        match list {
            [one] => Ok(*one),
            _ if list.len() == calls => Ok(list[i]),
            _ => bail!("--{what} wants one value, or one for each of --calls"),
        }
    }
    // The lists follow --calls as given.
    let counts = (args.calls.iter().enumerate())
        .map(|(i, &callers)| {
            let n = args.calls.len();
            Ok(CallerCount {
                callers,
                pairs: for_count(&args.rounds, n, "rounds", i)?,
                minutes: for_count(&args.minutes, n, "minutes", i)?,
                alone_minutes: for_count(&args.alone_minutes, n, "alone-minutes", i)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(schedule::rounds(&RunShape {
        counts,
        agents_alone_minutes: args.agents_alone_minutes(),
        seed: args.seed,
    }))
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

fn report(args: &Args, commit: Option<String>, rounds: Vec<RoundRecord>) -> Result<()> {
    // Each round records its own window; this one is only a summary's fallback.
    let window_s = args.longest_window_minutes() * 60.0;
    let report = BenchReport {
        command: std::iter::once("cargo xtask bench".to_owned())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        commit,
        config: json!({
            "agents": args.agents, "session_calls": args.session_calls,
            "shared_context": args.shared_context, "first_context": args.first_context,
            "tool_pause_s": args.tool_pause, "calls": args.calls, "rounds": args.rounds,
            "minutes": args.minutes, "alone_minutes": args.alone_minutes, "seed": args.seed,
            "agents_alone_minutes": args.agents_alone_minutes(),
            "kv_budget": args.kv_budget, "chunk": args.chunk, "idle_chunk": args.idle_chunk,
            "turn_hints": true, "first_tokens": args.first_tokens,
            "calls_fill_window": !args.calls_once, "on_switches": &args.on_switches,
            "hint_hold_ms": args.hint_hold_ms,
            "release_at_first_sentence": args.release_at_first_sentence,
            "reply_pace_steps": args.reply_pace_steps,
            "engine_nice": args.engine_nice,
            "mixed_passes": args.mixed_passes,
            "trace": args.trace.as_ref().or(args.mooncake.as_ref()).map(|p| p.display().to_string()),
            "mooncake_scale": args.mooncake.as_ref().map(|_| args.mooncake_scale),
            "agent_driver": format!("{:?}", args.agent_driver).to_lowercase(),
        }),
        window_s,
        figures: figures(&rounds, window_s),
        rounds,
    };
    std::fs::create_dir_all(&args.out)?;
    write_report(&report, &args.out)
}

/// `summary.json` (whole or not at all: written beside it, then renamed), `report.md` and
/// the plots into `dir`, and the table on standard output.
fn write_report(report: &BenchReport, dir: &std::path::Path) -> Result<()> {
    let summary = dir.join("summary.json");
    let partial = summary.with_extension("json.partial");
    std::fs::write(&partial, serde_json::to_string_pretty(report)? + "\n")?;
    std::fs::rename(&partial, &summary)?;
    plots::draw_all(report, dir)?;
    std::fs::write(dir.join("report.md"), markdown(report, &plots::PLOTS))?;
    print_table(report);
    eprintln!(
        "bench: wrote {}: summary.json, report.md and the plots",
        dir.display()
    );
    Ok(())
}

/// The tree that ran, when this runs inside a git checkout.
fn commit() -> Option<String> {
    let output = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()?;
    let described = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !described.trim().is_empty()).then(|| described.trim().to_owned())
}

fn print_table(report: &BenchReport) {
    let f = &report.figures;
    for slo in &f.slos {
        println!(
            "SLO with {} callers (voice alone p95 + 0.25 s, {} turns): {:.2} s",
            slo.callers, slo.turns, slo.slo_s
        );
    }
    println!(
        "{:<16} {:>7} {:>6} {:>8} {:>8} {:>8} {:>9} {:>8} {:>11} {:>10} {:>7} {:>8} {:>9}",
        "round",
        "callers",
        "turns",
        "v2v p50",
        "v2v p95",
        "v2v max",
        "over SLO",
        "1st tok",
        "agent tok/s",
        "agent TTFT",
        "KV full",
        "KV pre.",
        "µs/step"
    );
    let rows = f.rounds.iter().map(|r| {
        (
            &r.condition,
            r.callers,
            &r.summary,
            r.engine.at_budget_share,
            r.engine.kv_preemptions,
            r.engine.scheduler_us_per_step,
        )
    });
    let pooled = f.conditions.iter().map(|c| {
        (
            &c.condition,
            c.callers,
            &c.summary,
            c.kv_at_budget_share,
            c.kv_preemptions,
            c.scheduler_us_per_step,
        )
    });
    for (n, (condition, callers, s, at_budget, preemptions, us)) in rows.chain(pooled).enumerate() {
        if n == f.rounds.len() {
            println!("all rounds of each condition:");
        }
        println!(
            "{:<16} {:>7} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>9} {:>8.2} {:>11.2} {:>10.2} {:>6.0}% {:>8} {:>9.1}",
            condition,
            callers,
            s.turns,
            s.voice_to_voice_p50_s,
            s.voice_to_voice_p95_s,
            s.voice_to_voice_max_s,
            s.over_slo,
            s.first_token_p95_s,
            s.agent_tokens_per_s,
            s.agent_first_token_p95_s,
            at_budget * 100.0,
            preemptions,
            us
        );
    }
    // A neighbour's burst on a shared host slows a whole round: say which rounds had one.
    let steal: Vec<String> = f
        .rounds
        .iter()
        .map(|r| {
            r.engine
                .steal_cores
                .map_or("–".into(), |c| format!("{c:.2}"))
        })
        .collect();
    println!("host steal by round, cores: {}", steal.join(" "));
    for p in &f.pairs {
        println!(
            "pair seed {}, {} callers: p95 voice to voice off/on {:.2}x, agent throughput on/off \
             {:.2}, agent TTFT p95 on/off {:.2}",
            p.seed.unwrap_or_default(),
            p.callers,
            p.p95_voice_to_voice_off_over_on,
            p.agent_throughput_on_over_off,
            p.agent_first_token_p95_on_over_off
        );
    }
    for g in &f.alone_gaps {
        let [low, high] = g.voice_to_voice_interval_s;
        println!(
            "{} callers: make-room's turns against the same utterances alone {:+.2} s \
             [{low:+.2}, {high:+.2}] ({} turns)",
            g.callers, g.voice_to_voice_mean_s, g.turns
        );
    }
}
