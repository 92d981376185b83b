//! The engine's part of `gpu/check.sh`, also run on a CPU by the tests:
//!
//! ```text
//! gpu_check tokenizer --from MODEL.gguf --out TOKENIZER.gguf
//! gpu_check model --template TOKENIZER.gguf --size 135m|1b|tiny [--seed 1] --out MODEL.gguf
//! gpu_check smoke --model MODEL.gguf [--device cpu|cuda] [--kv-pool 262144|4096mb] [--json PATH]
//! ```
//!
//! `smoke` asks prompts of different lengths one at a time, then all at once, greedily,
//! under mistral.rs's own scheduler and under make-room's (whole prompts and decodes of
//! every length in one pass; then prompts in chunks), and fails unless each answer's
//! first tokens are the same every way: batching and chunking on the device must not
//! change a sequence's tokens. It reports where each answer first differs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sublet_engine::make_room::PolicyConfig;
use sublet_engine::random_model::{self, ModelShape};
use sublet_engine::{
    Accelerator, ChatRequest, Engine, EngineConfig, Message, Role, StreamEvent, AGENT_PRIORITY,
    VOICE_PRIORITY,
};

const USAGE: &str = "usage:
  gpu_check tokenizer --from MODEL.gguf --out TOKENIZER.gguf
  gpu_check model --template TOKENIZER.gguf --size 135m|1b|tiny [--seed 1] --out MODEL.gguf
  gpu_check smoke --model MODEL.gguf [--device cpu|cuda] [--kv-pool 262144|4096mb] [--json PATH]";

/// Prompts of different lengths (and so different KV lengths while they decode together).
const PROMPTS: &[&str] = &[
    "Hi.",
    "What is the capital of France?",
    "Write one sentence about the sea, the wind, and a small boat leaving the harbour at dawn.",
    "List three colours, three animals, three cities and three numbers, each with a short reason why you chose it, in one paragraph.",
];
const REPLY_TOKENS: usize = 24;
/// make-room's prompt chunks in the smoke test: small, so every prompt is split.
const SMOKE_CHUNK_TOKENS: usize = 8;
/// The tokens of each answer that must be the same alone and together. A batching or
/// scheduling fault (a wrong KV block, a position off, a sequence run twice) changes an
/// answer within its first tokens; later, reduced precision on a GPU (BF16) can flip a
/// near-tie between the likeliest tokens when another batch sums in another order, which
/// is reported, not failed. (On a CPU every answer is identical: the tests hold that.)
const HELD_TOKENS: usize = 8;

struct Args(std::collections::HashMap<String, String>);

impl Args {
    fn parse(args: &[String]) -> Result<Self> {
        let mut map = std::collections::HashMap::new();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let name = flag
                .strip_prefix("--")
                .with_context(|| format!("{flag}?\n{USAGE}"))?;
            let value = it.next().with_context(|| format!("{flag} needs a value"))?;
            map.insert(name.to_string(), value.clone());
        }
        Ok(Self(map))
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        self.0
            .get(name)
            .map(PathBuf::from)
            .with_context(|| format!("--{name} is required\n{USAGE}"))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

fn main() -> ExitCode {
    // mistral.rs's warnings (a sequence it gave up on, a KV pool that does not fit).
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("tokenizer") => Args::parse(&args[1..])
            .and_then(|a| random_model::write_tokenizer_only(&a.path("from")?, &a.path("out")?)),
        Some("model") => Args::parse(&args[1..]).and_then(|a| make_model(&a)),
        Some("smoke") => Args::parse(&args[1..]).and_then(|a| smoke(&a)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_check: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn make_model(args: &Args) -> Result<()> {
    let shape: ModelShape = args
        .get("size")
        .unwrap_or("135m")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let seed: u64 = args.get("seed").unwrap_or("1").parse()?;
    let out = args.path("out")?;
    let started = Instant::now();
    random_model::write_random_model(&args.path("template")?, shape, seed, &out)?;
    eprintln!(
        "gpu_check: {} ({shape:?}, seed {seed}) in {:.1} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A reply's pieces of text, one per token as the engine streams them.
fn pieces(mut stream: sublet_engine::ReplyStream) -> Result<Vec<String>> {
    let mut pieces = Vec::new();
    while let Some(event) = stream.next_blocking() {
        match event? {
            StreamEvent::Text(text) => pieces.push(text),
            StreamEvent::ToolCalls(_) => bail!("tool calls, though no tools were offered"),
            StreamEvent::Done(_) => return Ok(pieces),
        }
    }
    bail!("the reply ended without a result")
}

/// The same prompts run together, and how their answers compare with each alone.
#[derive(serde::Serialize)]
struct Together {
    name: &'static str,
    /// What it exercises.
    what: &'static str,
    seconds: f64,
    answers: Vec<String>,
    /// Where each answer first differs from the same prompt's alone (`None`: nowhere).
    first_difference: Vec<Option<usize>>,
    identical: usize,
    /// Prompt chunks make-room's scheduler ran meanwhile (0 under mistral.rs's own).
    prefill_chunks: u64,
}

fn together(
    engine: &Engine,
    name: &'static str,
    what: &'static str,
    priority: i32,
    alone: &[Vec<String>],
) -> Result<Together> {
    let chunks_before = engine.scheduler_state().counters.prefill_chunks;
    let started = Instant::now();
    let streams: Vec<_> = PROMPTS
        .iter()
        .map(|prompt| engine.chat(request(prompt, priority)))
        .collect::<Result<_, _>>()?;
    let answers: Vec<Vec<String>> = streams.into_iter().map(pieces).collect::<Result<_>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let first_difference: Vec<Option<usize>> = alone
        .iter()
        .zip(&answers)
        .map(|(a, t)| (0..a.len().max(t.len())).find(|&i| a.get(i) != t.get(i)))
        .collect();
    Ok(Together {
        name,
        what,
        seconds,
        identical: first_difference.iter().filter(|d| d.is_none()).count(),
        prefill_chunks: engine.scheduler_state().counters.prefill_chunks - chunks_before,
        answers: answers.iter().map(|p| p.concat()).collect(),
        first_difference,
    })
}

fn request(prompt: &str, priority: i32) -> ChatRequest {
    ChatRequest {
        priority,
        ..ChatRequest::new(vec![Message::new(Role::User, prompt)], REPLY_TOKENS)
    }
}

fn smoke(args: &Args) -> Result<()> {
    let accelerator =
        Accelerator::from_args(args.get("device").unwrap_or("cpu"), args.get("kv-pool"))
            .map_err(anyhow::Error::msg)?;
    let model = args.path("model")?;
    let load = |make_room: Option<PolicyConfig>| -> Result<Engine> {
        let started = Instant::now();
        let engine = Engine::load(&EngineConfig {
            model: model.clone(),
            chat_template: None,
            weights: Default::default(),
            max_running: PROMPTS.len(),
            accelerator,
            make_room,
            compute_nice: 0,
            mixed_passes: true,
        })?;
        eprintln!(
            "gpu_check: {} loaded on {accelerator} in {:.1} s",
            engine.model_name(),
            started.elapsed().as_secs_f64()
        );
        Ok(engine)
    };

    // mistral.rs's own scheduler: each prompt alone (the reference), then all together.
    let engine = load(None)?;
    let model_name = engine.model_name().to_string();
    let started = Instant::now();
    let mut alone = Vec::new();
    for prompt in PROMPTS {
        alone.push(pieces(engine.chat(request(prompt, AGENT_PRIORITY))?)?);
    }
    let alone_s = started.elapsed().as_secs_f64();
    let mut runs = vec![together(
        &engine,
        "stock",
        "mistral.rs's own scheduler",
        AGENT_PRIORITY,
        &alone,
    )?];
    drop(engine);

    // make-room's, on an engine of its own whose prefix cache is empty: agents' prompts
    // in chunks first (so every prompt is computed chunk by chunk), then voice turns'
    // prompts whole, with every decode of a step in one pass (four lengths together).
    let engine = load(Some(PolicyConfig {
        chunk_tokens: Some(SMOKE_CHUNK_TOKENS),
        whole_prompt_priority: Some(VOICE_PRIORITY),
        max_running: PROMPTS.len(),
        ..PolicyConfig::default()
    }))?;
    runs.push(together(
        &engine,
        "make_room_chunked",
        "make-room: prompts in chunks of 8 tokens beside the others' decodes",
        AGENT_PRIORITY,
        &alone,
    )?);
    runs.push(together(
        &engine,
        "make_room",
        "make-room: whole prompts, decodes of different lengths in one pass",
        VOICE_PRIORITY,
        &alone,
    )?);

    let report = serde_json::json!({
        "device": accelerator.to_string(),
        "model": model_name,
        "prompts": PROMPTS.len(),
        "reply_tokens": REPLY_TOKENS,
        "held_tokens": HELD_TOKENS,
        "alone_s": alone_s,
        "alone": alone.iter().map(|p| p.concat()).collect::<Vec<_>>(),
        "together": runs,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(path) = args.get("json") {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    let mut early = Vec::new();
    for run in &runs {
        let changed: Vec<usize> = run
            .first_difference
            .iter()
            .flatten()
            .copied()
            .filter(|&i| i < HELD_TOKENS)
            .collect();
        match (changed.is_empty(), run.first_difference.iter().flatten().min()) {
            (false, _) => early.push(format!("{} (at tokens {changed:?})", run.name)),
            (true, None) => eprintln!(
                "gpu_check: {}: all {} answers identical alone and together ({alone_s:.2} s one by one, {:.2} s together)",
                run.name, run.identical, run.seconds
            ),
            (true, Some(first)) => eprintln!(
                "gpu_check: {}: {} of {} answers identical alone and together, the others from token {first} on",
                run.name,
                run.identical,
                PROMPTS.len()
            ),
        }
    }
    if !early.is_empty() {
        bail!(
            "answers changed within their first {HELD_TOKENS} tokens when the prompts ran together: {}",
            early.join(", ")
        );
    }
    Ok(())
}
