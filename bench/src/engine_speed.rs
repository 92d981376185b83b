//! The engine's own speed, measured the way llama.cpp is measured beside it
//! (`cargo xtask engine-bench`): prompt processing, decoding one sequence and many of
//! different lengths at once, and a voice reply's inter-token gaps alone and beside
//! decoding agents.
//!
//! Every prompt opens with a tag no other request used, so that mistral.rs's prefix cache
//! never serves one measurement from another's KV. A figure is the best of its runs (the
//! machine is shared: the best run is the one least disturbed), and every run is kept.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sublet_engine::{ChatRequest, Engine, Finish, Message, Role, StreamEvent, VOICE_PRIORITY};

use crate::stats::percentile;

/// What to measure, and how much.
#[derive(Debug, Clone)]
pub struct SpeedOptions {
    /// Runs of each figure; the best is reported.
    pub repeats: usize,
    /// Prompt lengths whose processing speed is measured, in tokens (about).
    pub prefill_tokens: Vec<usize>,
    /// Tokens a single sequence decodes.
    pub decode_tokens: usize,
    /// How many sequences of different lengths decode at once, per measurement.
    pub multi: Vec<usize>,
    /// Tokens each of those sequences decodes.
    pub multi_tokens: usize,
    /// Inter-token gaps measured in a voice reply.
    pub voice_gaps: usize,
    /// Agents decoding beside the voice reply.
    pub voice_agents: usize,
}

impl Default for SpeedOptions {
    fn default() -> Self {
        Self {
            repeats: 2,
            prefill_tokens: vec![500, 2_800],
            decode_tokens: 64,
            multi: vec![4, 8],
            multi_tokens: 48,
            voice_gaps: 24,
            voice_agents: 3,
        }
    }
}

/// A chat prompt and its length as the engine counts it.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub messages: Vec<Message>,
    pub tokens: usize,
}

impl Prompt {
    /// The prompt as SmolLM2's chat template renders it (ChatML), for an engine that
    /// takes text.
    pub fn chatml(&self) -> String {
        let mut text = String::new();
        for m in &self.messages {
            let role = m.role.as_str();
            text.push_str(&format!("<|im_start|>{role}\n{}<|im_end|>\n", m.content));
        }
        text.push_str("<|im_start|>assistant\n");
        text
    }

    /// The same prompt behind a tag no request has used before.
    pub fn fresh(&self) -> Vec<Message> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let tag = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut messages = self.messages.clone();
        messages[0].content = format!("Request {tag}. {}", messages[0].content);
        messages
    }
}

/// The prompts of one run, sized on the engine's own tokenizer.
#[derive(Debug, Clone)]
pub struct Workload {
    pub prefill: Vec<Prompt>,
    pub decode: Prompt,
    /// One list of prompts (each of its own length) per entry of [`SpeedOptions::multi`].
    pub multi: Vec<Vec<Prompt>>,
}

const SYSTEM: &str = "You are a helpful assistant. Read the notes, then answer the question.";
const NOTES: &str = "The harbour town keeps a ledger of every ship that docks: its name, \
    its cargo, the day it arrived and the day it left. Fishing boats come and go each \
    morning, while the larger traders stay for a week to unload grain, timber and cloth. ";
const LONG_ANSWER: &str =
    "Write a long, detailed story about a ship's voyage from the harbour to a distant island.";

/// A prompt of about `tokens` tokens: notes repeated, then a question with a long answer.
fn sized_prompt(engine: &Engine, tokens: usize) -> Result<Prompt> {
    let build = |repeats: usize| {
        vec![
            Message::new(Role::System, SYSTEM),
            Message::new(
                Role::User,
                format!("{}\n\n{LONG_ANSWER}", NOTES.repeat(repeats)),
            ),
        ]
    };
    let count =
        |messages: Vec<Message>| engine.prompt_tokens(&sublet_engine::Prompt::Chat(messages));
    let base = count(build(0))?;
    let per_repeat = count(build(1))? - base;
    let repeats = tokens.saturating_sub(base).div_ceil(per_repeat.max(1));
    let messages = build(repeats);
    let tokens = count(messages.clone())?;
    Ok(Prompt { messages, tokens })
}

impl Workload {
    pub fn new(engine: &Engine, options: &SpeedOptions) -> Result<Self> {
        let prefill = options
            .prefill_tokens
            .iter()
            .map(|&n| sized_prompt(engine, n))
            .collect::<Result<_>>()?;
        // Different lengths, so that no two sequences share a KV length.
        let multi = options
            .multi
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|i| sized_prompt(engine, 100 + i * 110))
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            prefill,
            decode: sized_prompt(engine, 200)?,
            multi,
        })
    }
}

/// When each token of one reply arrived.
#[derive(Debug, Clone)]
struct Timed {
    sent: Instant,
    tokens: Vec<Instant>,
    finish: Finish,
}

/// Sends `request` and reads its reply to the end, timing each token.
fn timed(engine: &Engine, request: ChatRequest) -> Result<Timed> {
    let sent = Instant::now();
    let mut stream = engine.chat(request)?;
    let mut tokens = Vec::new();
    while let Some(event) = stream.next_blocking() {
        match event.context("the engine failed a request")? {
            StreamEvent::Text(_) => tokens.push(Instant::now()),
            StreamEvent::ToolCalls(_) => bail!("tool calls, though no tools were offered"),
            StreamEvent::Done(finish) => {
                return Ok(Timed {
                    sent,
                    tokens,
                    finish,
                })
            }
        }
    }
    bail!("a reply ended without finishing")
}

/// [`timed`] for several requests at once, each on its own thread.
fn timed_together(engine: &Arc<Engine>, requests: Vec<ChatRequest>) -> Result<Vec<Timed>> {
    let threads: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let engine = engine.clone();
            std::thread::spawn(move || timed(&engine, request))
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a request thread panicked"))
        .collect()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn best(runs: &[f64]) -> f64 {
    runs.iter().copied().fold(f64::NAN, f64::max)
}

/// Prompt processing speed at one prompt length.
#[derive(Debug, Clone, Serialize)]
pub struct PrefillFigure {
    pub prompt_tokens: usize,
    pub tokens_per_s: f64,
    pub runs: Vec<f64>,
}

/// Decoding speed: one sequence, or several of different lengths together.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeFigure {
    pub sequences: usize,
    pub prompt_tokens: Vec<usize>,
    /// Tokens per second over all sequences together.
    pub total_tokens_per_s: f64,
    pub runs: Vec<f64>,
}

/// A voice reply's inter-token gaps, in ms.
#[derive(Debug, Clone, Serialize)]
pub struct GapFigure {
    pub agents_decoding: usize,
    pub median_ms: f64,
    pub p95_ms: f64,
    pub gaps_ms: Vec<f64>,
}

/// The time to a reply's first token is its prompt's processing (plus one sampling).
pub fn prefill(engine: &Engine, prompt: &Prompt, repeats: usize) -> Result<PrefillFigure> {
    let mut runs = Vec::new();
    for _ in 0..repeats {
        let t = timed(engine, ChatRequest::new(prompt.fresh(), 1))?;
        let first = *t.tokens.first().context("no first token")?;
        runs.push(t.finish.prompt_tokens as f64 / secs(first - t.sent));
    }
    Ok(PrefillFigure {
        prompt_tokens: prompt.tokens,
        tokens_per_s: best(&runs),
        runs,
    })
}

/// Sequences decoding together: tokens counted over the span in which every one of them
/// was decoding (from the last first token to the first last token).
pub fn decode(
    engine: &Arc<Engine>,
    prompts: &[Prompt],
    tokens: usize,
    repeats: usize,
) -> Result<DecodeFigure> {
    let mut runs = Vec::new();
    for _ in 0..repeats {
        let requests = prompts
            .iter()
            .map(|p| ChatRequest::new(p.fresh(), tokens))
            .collect();
        let replies = timed_together(engine, requests)?;
        let start = replies.iter().filter_map(|r| r.tokens.first()).max();
        let end = replies.iter().filter_map(|r| r.tokens.last()).min();
        let (Some(&start), Some(&end)) = (start, end) else {
            bail!("a sequence produced no token");
        };
        let counted: usize = replies
            .iter()
            .map(|r| r.tokens.iter().filter(|&&t| t > start && t <= end).count())
            .sum();
        if end <= start || counted < prompts.len() {
            bail!("the sequences never decoded together: one finished before the last began");
        }
        runs.push(counted as f64 / secs(end - start));
    }
    Ok(DecodeFigure {
        sequences: prompts.len(),
        prompt_tokens: prompts.iter().map(|p| p.tokens).collect(),
        total_tokens_per_s: best(&runs),
        runs,
    })
}

/// Several sequences against one, measured in turn on one engine: each pair's ratio, so
/// that a slow spell of a shared machine weighs on both sides of a ratio, not on one.
#[derive(Debug, Clone, Serialize)]
pub struct PairedRatio {
    pub sequences: usize,
    /// Each pair's total tokens/s of the sequences together ÷ one sequence's.
    pub ratios: Vec<f64>,
    pub median_ratio: f64,
}

/// `pairs` turns of one sequence then each of the workload's sets of sequences, one run
/// each; a ratio a set per turn.
pub fn paired_ratios(
    engine: &Arc<Engine>,
    workload: &Workload,
    options: &SpeedOptions,
    pairs: usize,
) -> Result<Vec<PairedRatio>> {
    let mut ratios = vec![Vec::new(); workload.multi.len()];
    for _ in 0..pairs {
        let single = decode(
            engine,
            std::slice::from_ref(&workload.decode),
            options.decode_tokens,
            1,
        )?;
        for (set, prompts) in ratios.iter_mut().zip(&workload.multi) {
            let together = decode(engine, prompts, options.multi_tokens, 1)?;
            set.push(together.total_tokens_per_s / single.total_tokens_per_s);
        }
    }
    Ok(ratios
        .into_iter()
        .zip(&workload.multi)
        .map(|(ratios, prompts)| PairedRatio {
            sequences: prompts.len(),
            median_ratio: crate::stats::percentile(&ratios, 50.0),
            ratios,
        })
        .collect())
}

/// A voice reply's median gap beside decoding agents ÷ its median gap alone, measured in
/// turn (alone, then beside them) so a slow spell of a shared machine weighs on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct PairedGapRatio {
    pub agents_decoding: usize,
    /// Each pair's median gap beside the agents ÷ the median gap alone just before.
    pub ratios: Vec<f64>,
    pub median_ratio: f64,
}

/// `pairs` turns of a voice reply alone, then one beside `agents` decoding agents, under
/// the engine's current switches.
pub fn paired_voice_gaps(
    engine: &Arc<Engine>,
    workload: &Workload,
    agents: usize,
    gaps: usize,
    pairs: usize,
) -> Result<PairedGapRatio> {
    let mut ratios = Vec::new();
    for _ in 0..pairs {
        let alone = voice_gaps(engine, workload, 0, gaps)?;
        let beside = voice_gaps(engine, workload, agents, gaps)?;
        ratios.push(beside.median_ms / alone.median_ms);
    }
    Ok(PairedGapRatio {
        agents_decoding: agents,
        median_ratio: crate::stats::percentile(&ratios, 50.0),
        ratios,
    })
}

/// A voice reply's gaps, with `agents` agent requests already decoding beside it.
pub fn voice_gaps(
    engine: &Arc<Engine>,
    workload: &Workload,
    agents: usize,
    gaps: usize,
) -> Result<GapFigure> {
    static NEXT_CALL: AtomicU64 = AtomicU64::new(1);
    sublet_engine::probe::wait_idle(engine)?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let agent_threads: Vec<_> = (0..agents)
        .map(|i| {
            let prompt = workload
                .multi
                .last()
                .and_then(|m| m.get(i))
                .unwrap_or(&workload.decode);
            let request = ChatRequest::new(prompt.fresh(), 4 * gaps + 256);
            let (engine, stop, started) = (engine.clone(), stop.clone(), started.clone());
            std::thread::spawn(move || -> Result<()> {
                let mut stream = engine.chat(request)?;
                let mut first = true;
                while !stop.load(Ordering::SeqCst) {
                    match stream.next_blocking() {
                        Some(Ok(StreamEvent::Text(_))) if first => {
                            first = false;
                            started.fetch_add(1, Ordering::SeqCst);
                        }
                        Some(Ok(StreamEvent::Text(_))) => {}
                        _ => break,
                    }
                }
                Ok(())
            })
        })
        .collect();
    let waited = Instant::now();
    while started.load(Ordering::SeqCst) < agents {
        if waited.elapsed() > Duration::from_secs(300) {
            bail!("the agents never all started decoding");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let voice = ChatRequest {
        priority: VOICE_PRIORITY,
        session: Some(1_000_000 + NEXT_CALL.fetch_add(1, Ordering::Relaxed)),
        ..ChatRequest::new(workload.decode.fresh(), gaps + 1)
    };
    let reply = timed(engine, voice);
    stop.store(true, Ordering::SeqCst);
    for thread in agent_threads {
        thread.join().expect("an agent thread panicked")?;
    }
    let reply = reply?;
    let gaps_ms: Vec<f64> = reply
        .tokens
        .windows(2)
        .map(|w| secs(w[1] - w[0]) * 1000.0)
        .collect();
    if gaps_ms.len() < gaps / 2 {
        bail!(
            "the voice reply stopped after {} tokens",
            reply.tokens.len()
        );
    }
    Ok(GapFigure {
        agents_decoding: agents,
        median_ms: percentile(&gaps_ms, 50.0),
        p95_ms: percentile(&gaps_ms, 95.0),
        gaps_ms,
    })
}

/// The process's peak and current resident memory, in MB (NaN where unknown).
pub fn resident_mb() -> (f64, f64) {
    let mb = |bytes: Option<u64>| bytes.map_or(f64::NAN, |b| b as f64 / (1024.0 * 1024.0));
    (
        mb(sublet_engine::memory::peak_resident_bytes()),
        mb(sublet_engine::memory::resident_bytes()),
    )
}

/// One prompt of the quality line, and what a right answer must contain (any of).
pub struct QualityPrompt {
    pub question: &'static str,
    pub expect: &'static [&'static str],
}

/// Ten fixed prompts: eight with a fact to get right, two open ones.
pub const QUALITY_PROMPTS: &[QualityPrompt] = &[
    QualityPrompt {
        question: "What is the capital of France?",
        expect: &["Paris"],
    },
    QualityPrompt {
        question: "How many days are there in a week?",
        expect: &["seven", "7"],
    },
    QualityPrompt {
        question: "What color is the sky on a clear day?",
        expect: &["blue"],
    },
    QualityPrompt {
        question: "What is the largest planet in our solar system?",
        expect: &["Jupiter"],
    },
    QualityPrompt {
        question: "Who wrote Romeo and Juliet?",
        expect: &["Shakespeare"],
    },
    QualityPrompt {
        question: "What is the boiling point of water in degrees Celsius?",
        expect: &["100"],
    },
    QualityPrompt {
        question: "What language is spoken in Spain?",
        expect: &["Spanish"],
    },
    QualityPrompt {
        question: "What is the opposite of hot?",
        expect: &["cold"],
    },
    QualityPrompt {
        question: "Write a haiku about the sea.",
        expect: &[],
    },
    QualityPrompt {
        question: "Give me two tips for a job interview.",
        expect: &[],
    },
];

/// A greedy answer to one quality prompt, and whether it holds the expected fact.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Answer {
    pub question: String,
    pub text: String,
    /// `None` for open prompts.
    pub correct: Option<bool>,
}

/// The greedy answers to [`QUALITY_PROMPTS`], 48 tokens each.
pub fn answers(engine: &Engine) -> Result<Vec<Answer>> {
    QUALITY_PROMPTS
        .iter()
        .map(|p| {
            let request = ChatRequest::new(vec![Message::new(Role::User, p.question)], 48);
            let (text, _) = engine.chat(request)?.collect_blocking()?;
            let lower = text.to_lowercase();
            let correct = (!p.expect.is_empty())
                .then(|| p.expect.iter().any(|e| lower.contains(&e.to_lowercase())));
            Ok(Answer {
                question: p.question.into(),
                text,
                correct,
            })
        })
        .collect()
}
