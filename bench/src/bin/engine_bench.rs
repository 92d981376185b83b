//! `cargo xtask engine-bench`: Sublet's engine against llama.cpp on the same GGUF, cores
//! and prompts, in one run (see [`sublet_bench::engine_speed`]).
//!
//! ```text
//! engine_bench [--json PATH] [--weights f32|f16|quantized] [--repeats N] [--pairs N]
//!              [--multi-tokens N] [--llama-python PYTHON] [--no-llama]
//! ```
//!
//! The engine is measured first with mistral.rs's own scheduler, then with make-room's;
//! llama.cpp (llama-cpp-python, `bench/llama_cpp/engine_bench.py`) runs after it, alone on
//! the cores. The quality line compares greedy answers with those of F32 weights, loaded
//! in a child process (candle reads its dequantization setting once per thread).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use sublet_bench::engine_speed::{self as speed, Answer, SpeedOptions, Workload};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{deployed_make_room, Engine, EngineConfig, Weights};
use sublet_models::{ModelArgs, ModelCache};

#[derive(Parser, Debug)]
#[command(name = "engine_bench")]
struct Args {
    /// Where the figures go, as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// How the engine holds its weights (default: the engine's default).
    #[arg(long, default_value_t = Weights::default())]
    weights: Weights,
    /// Runs of each figure (the best is reported, every run kept).
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// The Python with llama-cpp-python installed (`cargo xtask engine-bench` passes it).
    #[arg(long)]
    llama_python: Option<PathBuf>,
    /// llama.cpp's side, `bench/llama_cpp/engine_bench.py` (`cargo xtask engine-bench`
    /// passes it; default: the one in the checkout this binary was compiled from).
    #[arg(long)]
    llama_script: Option<PathBuf>,
    /// Tokens each of the sequences decoding together decodes (longer runs for profiling).
    #[arg(long, default_value_t = SpeedOptions::default().multi_tokens)]
    multi_tokens: usize,
    /// Turns of one sequence then each set of sequences on make-room's engine, for the
    /// ratios measured in pairs.
    #[arg(long, default_value_t = 5)]
    pairs: usize,
    /// Skip llama.cpp: the engine's figures only, without ratios.
    #[arg(long)]
    no_llama: bool,
    /// Only print the quality prompts' greedy answers as JSON (run as a child process).
    #[arg(long, hide = true)]
    answers_only: bool,
    #[command(flatten)]
    models: ModelArgs,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engine-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn progress(line: impl AsRef<str>) {
    eprintln!("engine-bench: {}", line.as_ref());
}

fn load(
    cache: &ModelCache,
    weights: Weights,
    make_room: Option<PolicyConfig>,
) -> Result<Arc<Engine>> {
    let config = EngineConfig {
        weights,
        make_room,
        ..EngineConfig::from_cache(cache)?
    };
    Ok(Arc::new(Engine::load(&config)?))
}

/// make-room with all its switches, room for every measurement, and whole prompts (so
/// that sequences started together all decode together, as under the stock scheduler).
fn make_room_config() -> PolicyConfig {
    PolicyConfig {
        kv_budget_tokens: 16_384,
        chunk_tokens: None,
        ..deployed_make_room()
    }
}

fn run(args: Args) -> Result<()> {
    let cache = sublet_agent::models::choose(&args.models)?;
    if args.answers_only {
        let engine = load(&cache, args.weights, None)?;
        println!("{}", serde_json::to_string(&speed::answers(&engine)?)?);
        return Ok(());
    }
    let options = SpeedOptions {
        repeats: args.repeats.max(1),
        multi_tokens: args.multi_tokens,
        ..SpeedOptions::default()
    };
    let llama_python = match (&args.llama_python, args.no_llama) {
        (_, true) => None,
        (Some(python), false) => Some(python.clone()),
        (None, false) => {
            bail!("--llama-python PYTHON or --no-llama (cargo xtask engine-bench sets it up)")
        }
    };

    progress(format!(
        "loading the engine ({} weights, mistral.rs's scheduler)",
        args.weights
    ));
    let engine = load(&cache, args.weights, None)?;
    let workload = Workload::new(&engine, &options)?;
    let mut prefill = Vec::new();
    for prompt in &workload.prefill {
        progress(format!(
            "prefill {} tokens ×{}",
            prompt.tokens, options.repeats
        ));
        prefill.push(speed::prefill(&engine, prompt, options.repeats)?);
    }
    progress(format!(
        "decode one sequence, {} tokens",
        options.decode_tokens
    ));
    let single = speed::decode(
        &engine,
        std::slice::from_ref(&workload.decode),
        options.decode_tokens,
        options.repeats,
    )?;
    let multi_stock = decode_multi(&engine, &workload, &options, "")?;
    progress("quality prompts");
    let answers = speed::answers(&engine)?;
    let (peak_mb, resident_mb) = speed::resident_mb();
    drop(engine);

    progress("loading the engine with make-room's scheduler");
    let engine = load(&cache, args.weights, Some(make_room_config()))?;
    let multi_make_room = decode_multi(&engine, &workload, &options, "make-room: ")?;
    progress(format!(
        "make-room: one sequence, then each set of sequences, in turn ×{}",
        args.pairs
    ));
    let paired = speed::paired_ratios(&engine, &workload, &options, args.pairs)?;
    progress("make-room: a voice reply alone");
    let voice_alone = speed::voice_gaps(&engine, &workload, 0, options.voice_gaps)?;
    // Without the decode hold the agents decode through the voice reply: the gap then
    // shows what a pass of several sequences costs.
    let mut beside = Switches::all();
    beside.decode_hold = false;
    sublet_engine::probe::wait_idle(&engine)?;
    engine.set_make_room_switches(beside);
    progress(format!(
        "make-room (no decode hold): a voice reply beside {} decoding agents",
        options.voice_agents
    ));
    let voice_beside =
        speed::voice_gaps(&engine, &workload, options.voice_agents, options.voice_gaps)?;
    sublet_engine::probe::wait_idle(&engine)?;
    engine.set_make_room_switches(Switches::all());
    progress(format!(
        "make-room (all switches): a voice reply beside {} decoding agents",
        options.voice_agents
    ));
    let voice_beside_hold =
        speed::voice_gaps(&engine, &workload, options.voice_agents, options.voice_gaps)?;
    progress(format!(
        "make-room (all switches): a voice reply alone, then beside {} decoding agents, in turn ×{}",
        options.voice_agents, args.pairs
    ));
    let voice_paired = speed::paired_voice_gaps(
        &engine,
        &workload,
        options.voice_agents,
        options.voice_gaps,
        args.pairs,
    )?;
    drop(engine);

    let reference = if args.weights == Weights::F32 {
        answers.clone()
    } else {
        progress("quality prompts with F32 weights (reference, in a child process)");
        reference_answers(&cache, Weights::F32)?
    };
    let llama = match &llama_python {
        Some(python) => Some(run_llama(
            &cache.llm_gguf()?,
            python,
            args.llama_script.as_deref(),
            &workload,
            &options,
        )?),
        None => None,
    };

    let figures = json!({
        "weights": args.weights,
        "prefill": prefill,
        "decode_1": single,
        "decode_multi_stock": multi_stock,
        "decode_multi_make_room": multi_make_room,
        "decode_multi_make_room_paired": paired,
        "voice_gap_alone": voice_alone,
        "voice_gap_beside_agents": voice_beside,
        "voice_gap_beside_agents_decode_hold": voice_beside_hold,
        "voice_gap_beside_agents_paired": voice_paired,
        "peak_resident_mb": peak_mb,
        "resident_mb": resident_mb,
    });
    let report = report(figures, &answers, &reference, llama);
    print_table(&report);
    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        progress(format!("wrote {}", path.display()));
    }
    Ok(())
}

/// Each of the workload's sets of sequences of different lengths, decoding together.
fn decode_multi(
    engine: &Arc<Engine>,
    workload: &Workload,
    options: &SpeedOptions,
    label: &str,
) -> Result<Vec<speed::DecodeFigure>> {
    let mut figures = Vec::new();
    for prompts in &workload.multi {
        progress(format!(
            "{label}decode {} sequences of different lengths",
            prompts.len()
        ));
        figures.push(speed::decode(
            engine,
            prompts,
            options.multi_tokens,
            options.repeats,
        )?);
    }
    Ok(figures)
}

fn reference_answers(cache: &ModelCache, weights: Weights) -> Result<Vec<Answer>> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command.args(["--answers-only", "--weights", &weights.to_string()]);
    command.env("SUBLET_LLM", cache.llm_gguf()?);
    if let Some(template) = cache.chat_template() {
        command.env("SUBLET_CHAT_TEMPLATE", template);
    }
    let output = command.output().context("running the reference engine")?;
    if !output.status.success() {
        bail!(
            "the reference engine failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("reading the reference answers")
}

/// Runs the llama.cpp side on the same prompts (as ChatML text) and reads its figures.
fn run_llama(
    model: &Path,
    python: &Path,
    script: Option<&Path>,
    workload: &Workload,
    options: &SpeedOptions,
) -> Result<Value> {
    let dir = std::env::temp_dir().join(format!("sublet-engine-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("workload.json");
    let output = dir.join("llama.json");
    let spec = json!({
        "prefill_prompts": workload.prefill.iter().map(|p| p.chatml()).collect::<Vec<_>>(),
        "decode_prompt": workload.decode.chatml(),
        "decode_tokens": options.decode_tokens,
        "multi": workload.multi.iter().map(|prompts| json!({
            "prompts": prompts.iter().map(|p| p.chatml()).collect::<Vec<_>>(),
            "tokens": options.multi_tokens,
        })).collect::<Vec<_>>(),
        "repeats": options.repeats,
    });
    std::fs::write(&input, serde_json::to_string(&spec)?)?;
    let script = match script {
        Some(script) => script.to_path_buf(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("llama_cpp/engine_bench.py"),
    };
    progress("llama.cpp on the same prompts");
    let status = Command::new(python)
        .arg(&script)
        .arg("--model")
        .arg(model)
        .arg("--workload")
        .arg(&input)
        .arg("--json")
        .arg(&output)
        .arg("--threads")
        .arg(threads().to_string())
        .status()
        .with_context(|| format!("running {}", python.display()))?;
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        match status.signal() {
            Some(signal) => bail!(
                "the reference, llama.cpp, crashed (signal {signal}{}) on {}: its figures are \
                 missing, not Sublet's; `--no-llama` measures the engine alone",
                if signal == 11 { ", SIGSEGV" } else { "" },
                model.display()
            ),
            None => bail!("llama.cpp's side failed ({status})"),
        }
    }
    let text = std::fs::read_to_string(&output)?;
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_str(&text).context("reading llama.cpp's figures")
}

/// The cores the engine uses (candle's own count), given to llama.cpp too.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The engine's figures, llama.cpp's, their ratios and the quality line.
fn report(
    mut figures: Value,
    answers: &[Answer],
    reference: &[Answer],
    llama: Option<Value>,
) -> Value {
    let identical = answers
        .iter()
        .zip(reference)
        .filter(|(a, r)| a.text == r.text)
        .count();
    let facts = |list: &[Answer]| list.iter().filter(|a| a.correct == Some(true)).count();
    let factual = answers.iter().filter(|a| a.correct.is_some()).count();
    figures["quality"] = json!({
        "prompts": answers.len(),
        "identical_to_f32": identical,
        "factual_prompts": factual,
        "factual_correct": facts(answers),
        "factual_correct_f32": facts(reference),
        "answers": answers,
        "answers_f32": reference,
    });
    let single_step_ms = 1000.0
        / figures["decode_1"]["total_tokens_per_s"]
            .as_f64()
            .unwrap_or(f64::NAN);
    figures["single_step_ms"] = json!(single_step_ms);
    figures["voice_gap_beside_agents_ratio_to_single_step"] = json!(
        figures["voice_gap_beside_agents"]["median_ms"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / single_step_ms
    );
    let single = figures["decode_1"]["total_tokens_per_s"]
        .as_f64()
        .unwrap_or(f64::NAN);
    for key in ["decode_multi_stock", "decode_multi_make_room"] {
        if let Some(list) = figures[key].as_array_mut() {
            for entry in list {
                let total = entry["total_tokens_per_s"].as_f64().unwrap_or(f64::NAN);
                entry["ratio_to_single"] = json!(total / single);
            }
        }
    }
    if let Some(llama) = llama {
        let ratio = |ours: &Value, theirs: &Value| {
            json!(ours.as_f64().unwrap_or(f64::NAN) / theirs.as_f64().unwrap_or(f64::NAN))
        };
        let mut ratios = serde_json::Map::new();
        for (i, ours) in figures["prefill"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let theirs = &llama["prefill"][i]["tokens_per_s"];
            let n = ours["prompt_tokens"].as_u64().unwrap_or(0);
            ratios.insert(
                format!("prefill_{n}_ratio"),
                ratio(&ours["tokens_per_s"], theirs),
            );
        }
        ratios.insert(
            "decode_1_ratio".into(),
            ratio(
                &figures["decode_1"]["total_tokens_per_s"],
                &llama["decode_1"]["tokens_per_s"],
            ),
        );
        for (i, ours) in figures["decode_multi_stock"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let n = ours["sequences"].as_u64().unwrap_or(0);
            let theirs = &llama["multi"][i]["total_tokens_per_s"];
            ratios.insert(
                format!("decode_{n}_ratio"),
                ratio(&ours["total_tokens_per_s"], theirs),
            );
            let ours_mr = &figures["decode_multi_make_room"][i]["total_tokens_per_s"];
            ratios.insert(
                format!("decode_{n}_make_room_ratio"),
                ratio(ours_mr, theirs),
            );
        }
        ratios.insert(
            "resident_mb_ratio".into(),
            ratio(&figures["peak_resident_mb"], &llama["rss_mb"]),
        );
        figures["llama_cpp"] = llama;
        figures["ratios_to_llama_cpp"] = Value::Object(ratios);
    }
    figures
}

fn print_table(report: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let llama = report.get("llama_cpp");
    println!(
        "\n{:<44} {:>10} {:>10} {:>7}",
        "figure", "sublet", "llama.cpp", "ratio"
    );
    let row = |name: String, ours: f64, theirs: Option<f64>| match theirs {
        Some(t) => println!("{name:<44} {ours:>10.1} {t:>10.1} {:>6.2}×", ours / t),
        None => println!("{name:<44} {ours:>10.1} {:>10} {:>7}", "-", "-"),
    };
    for (i, p) in report["prefill"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        row(
            format!("prefill tokens/s, {} tokens", p["prompt_tokens"]),
            f(&p["tokens_per_s"]),
            llama.map(|l| f(&l["prefill"][i]["tokens_per_s"])),
        );
    }
    row(
        "decode tokens/s, one sequence".into(),
        f(&report["decode_1"]["total_tokens_per_s"]),
        llama.map(|l| f(&l["decode_1"]["tokens_per_s"])),
    );
    for (i, m) in report["decode_multi_stock"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let n = &m["sequences"];
        let theirs = llama.map(|l| f(&l["multi"][i]["total_tokens_per_s"]));
        row(
            format!("decode tokens/s, {n} sequences (stock)"),
            f(&m["total_tokens_per_s"]),
            theirs,
        );
        let mr = &report["decode_multi_make_room"][i];
        row(
            format!("decode tokens/s, {n} sequences (make-room)"),
            f(&mr["total_tokens_per_s"]),
            theirs,
        );
        println!(
            "{:<44} {:>10.2}× stock, {:.2}× make-room",
            format!("  {n} sequences ÷ one sequence"),
            f(&m["ratio_to_single"]),
            f(&mr["ratio_to_single"])
        );
        let paired = &report["decode_multi_make_room_paired"][i];
        if let Some((pairs, low, high)) = spread(paired) {
            println!(
                "{:<44} {:>10.2}× median of {pairs} (make-room, {low:.2}–{high:.2})",
                format!("  {n} ÷ one, measured in turn"),
                f(&paired["median_ratio"]),
            );
        }
    }
    row(
        "resident memory, peak MB".into(),
        f(&report["peak_resident_mb"]),
        llama.map(|l| f(&l["rss_mb"])),
    );
    println!("\nvoice reply inside the engine (make-room), inter-token gap ms:");
    for (name, key) in [
        ("alone", "voice_gap_alone"),
        ("beside agents, no decode hold", "voice_gap_beside_agents"),
        (
            "beside agents, all switches",
            "voice_gap_beside_agents_decode_hold",
        ),
    ] {
        let g = &report[key];
        println!(
            "  {name:<32} median {:>6.1}  p95 {:>6.1}  ({} agents decoding)",
            f(&g["median_ms"]),
            f(&g["p95_ms"]),
            g["agents_decoding"]
        );
    }
    println!(
        "  single-sequence step {:.1} ms; beside agents ÷ single step {:.2}×",
        f(&report["single_step_ms"]),
        f(&report["voice_gap_beside_agents_ratio_to_single_step"])
    );
    let paired = &report["voice_gap_beside_agents_paired"];
    if let Some((pairs, low, high)) = spread(paired) {
        println!(
            "  beside agents ÷ alone, in turn  {:.2}× median of {pairs} (all switches, {low:.2}–{high:.2})",
            f(&paired["median_ratio"]),
        );
    }
    let q = &report["quality"];
    println!(
        "\nquality ({} weights): {} of {} answers identical to F32's; factual prompts right {} of {} (F32: {})",
        report["weights"].as_str().unwrap_or("?"),
        q["identical_to_f32"],
        q["prompts"],
        q["factual_correct"],
        q["factual_prompts"],
        q["factual_correct_f32"]
    );
}

/// A figure measured in pairs: how many ratios, the smallest and the largest; `None` when
/// it has none.
fn spread(paired: &Value) -> Option<(usize, f64, f64)> {
    let ratios: Vec<f64> = paired["ratios"]
        .as_array()?
        .iter()
        .map(|v| v.as_f64().unwrap_or(f64::NAN))
        .collect();
    let low = ratios.iter().copied().reduce(f64::min)?;
    let high = ratios.iter().copied().reduce(f64::max)?;
    Some((ratios.len(), low, high))
}
