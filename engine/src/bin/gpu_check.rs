//! The engine's part of `gpu/check.sh`, also run on a CPU by the tests:
//!
//! ```text
//! gpu_check tokenizer --from MODEL.gguf --out TOKENIZER.gguf
//! gpu_check model --template TOKENIZER.gguf --size 135m|1b|tiny [--seed 1] --out MODEL.gguf
//! gpu_check smoke --model MODEL.gguf [--device cpu|cuda] [--kv-pool 262144|4096mb] [--json PATH]
//! ```
//!
//! `smoke` asks prompts of different lengths one at a time, then all at once, greedily,
//! and fails unless each answer's first tokens are the same both ways: batching on the
//! device must not change a sequence's tokens. It reports where each pair first differs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sublet_engine::random_model::{self, ModelShape};
use sublet_engine::{
    Accelerator, ChatRequest, Engine, EngineConfig, KvPool, Message, Role, StreamEvent,
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
            StreamEvent::Done(_) => return Ok(pieces),
        }
    }
    bail!("the reply ended without a result")
}

fn smoke(args: &Args) -> Result<()> {
    let accelerator = match args.get("device").unwrap_or("cpu") {
        "cpu" => Accelerator::Cpu,
        "cuda" => Accelerator::Cuda {
            ordinal: 0,
            kv_pool: match args.get("kv-pool") {
                Some(pool) => pool.parse().map_err(anyhow::Error::msg)?,
                None => KvPool::default(),
            },
        },
        other => bail!("--device {other:?}: cpu or cuda"),
    };
    let started = Instant::now();
    let engine = Engine::load(&EngineConfig {
        model: args.path("model")?,
        weights: Default::default(),
        max_running: PROMPTS.len(),
        accelerator,
        make_room: None,
    })?;
    eprintln!(
        "gpu_check: {} loaded on {accelerator} in {:.1} s",
        engine.model_name(),
        started.elapsed().as_secs_f64()
    );
    let request =
        |prompt: &str| ChatRequest::new(vec![Message::new(Role::User, prompt)], REPLY_TOKENS);

    let started = Instant::now();
    let mut alone = Vec::new();
    for prompt in PROMPTS {
        alone.push(pieces(engine.chat(request(prompt))?)?);
    }
    let alone_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let streams: Vec<_> = PROMPTS
        .iter()
        .map(|prompt| engine.chat(request(prompt)))
        .collect::<Result<_, _>>()?;
    let together: Vec<Vec<String>> = streams.into_iter().map(pieces).collect::<Result<_>>()?;
    let together_s = started.elapsed().as_secs_f64();

    // Where each pair first differs (`None`: not at all).
    let first_difference: Vec<Option<usize>> = alone
        .iter()
        .zip(&together)
        .map(|(a, t)| (0..a.len().max(t.len())).find(|&i| a.get(i) != t.get(i)))
        .collect();
    let identical = first_difference.iter().filter(|d| d.is_none()).count();
    let early: Vec<usize> = first_difference
        .iter()
        .flatten()
        .copied()
        .filter(|&i| i < HELD_TOKENS)
        .collect();
    let report = serde_json::json!({
        "device": accelerator.to_string(),
        "model": engine.model_name(),
        "prompts": PROMPTS.len(),
        "reply_tokens": REPLY_TOKENS,
        "held_tokens": HELD_TOKENS,
        "alone_s": alone_s,
        "together_s": together_s,
        "identical": identical,
        "first_difference": first_difference,
        "alone": alone.iter().map(|p| p.concat()).collect::<Vec<_>>(),
        "together": together.iter().map(|p| p.concat()).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(path) = args.get("json") {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    if !early.is_empty() {
        bail!(
            "answers changed within their first {HELD_TOKENS} tokens when the prompts ran together (at tokens {early:?})"
        );
    }
    match first_difference.iter().flatten().min() {
        None => eprintln!(
            "gpu_check: smoke ok: all {identical} answers identical alone and together ({alone_s:.2} s one by one, {together_s:.2} s together)"
        ),
        Some(first) => eprintln!(
            "gpu_check: smoke ok: {identical} of {} answers identical alone and together, the others from token {first} on ({alone_s:.2} s one by one, {together_s:.2} s together)",
            PROMPTS.len()
        ),
    }
    Ok(())
}
