//! make-room's batched CPU passes on each GGUF architecture they run on (llama, qwen2 and
//! qwen3: mistralrs-core patches 5, 9, 24 and 25), on models of random weights made
//! here with the bundled tokenizer (`random_model`): sequences of different lengths
//! decoded in one pass, and prompt chunks and decodes in one mixed pass, give each
//! sequence the tokens it gets alone. Random weights answer nonsense, but the same
//! nonsense for the same prompt, token for token, which is what batching must keep.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;

use sublet_engine::make_room::PolicyConfig;
use sublet_engine::random_model::{self, Architecture, ModelShape};
use sublet_engine::{ChatRequest, Engine, EngineConfig, Message, Role, StreamEvent};
use sublet_models::ModelCache;

/// Small enough to run in a test, with two KV heads of two query heads each (grouped
/// attention), and qwen2's biases or qwen3's head norms where the architecture has them.
const SHAPE: ModelShape = ModelShape {
    hidden: 256,
    layers: 2,
    feed_forward: 512,
    heads: 4,
    kv_heads: 2,
};

/// Each reply's length: random weights rarely end a reply early, and every reply must be
/// at least `MIN_TOKENS` long for the comparison to mean something.
const MAX_TOKENS: usize = 40;
const MIN_TOKENS: usize = 8;

/// Four prompts of different lengths (after the chat template: ~30 tokens to ~90).
const PROMPTS: [&str; 4] = [
    "Hi.",
    "What is the capital of France?",
    "Name three colours of the rainbow, then say why the sky looks blue in the day.",
    "Write one sentence about a cat that sleeps on a warm windowsill in the afternoon sun, \
     and one about the dog that watches it from the garden below, then a third about the \
     bird on the fence that neither of them has noticed yet.",
];

#[test]
fn llama_decodes_sequences_of_different_lengths_in_one_pass_as_each_alone() {
    unequal_decodes(Architecture::Llama);
}

#[test]
fn qwen2_decodes_sequences_of_different_lengths_in_one_pass_as_each_alone() {
    unequal_decodes(Architecture::Qwen2);
}

#[test]
fn qwen3_decodes_sequences_of_different_lengths_in_one_pass_as_each_alone() {
    unequal_decodes(Architecture::Qwen3);
}

#[test]
fn llama_runs_prompt_chunks_and_decodes_in_one_mixed_pass_as_each_alone() {
    mixed_passes(Architecture::Llama);
}

#[test]
fn qwen2_runs_prompt_chunks_and_decodes_in_one_mixed_pass_as_each_alone() {
    mixed_passes(Architecture::Qwen2);
}

#[test]
fn qwen3_runs_prompt_chunks_and_decodes_in_one_mixed_pass_as_each_alone() {
    mixed_passes(Architecture::Qwen3);
}

/// Patch 5 (and 25 for the qwen models) with the adapter's `Batching::UnequalDecodes`:
/// the four requests, sent together, decode in passes over sequences of different lengths,
/// each attending over its own cache.
fn unequal_decodes(arch: Architecture) {
    let model = RandomModel::new(arch, "unequal");
    let engine = model.engine(None, false);
    let alone: Vec<String> = PROMPTS.iter().map(|p| reply(&engine, p, None)).collect();
    let before = engine.scheduler_state();
    assert_eq!(before.unequal_decode_passes, 0, "one at a time: {before:?}");

    let together: Vec<String> = PROMPTS
        .iter()
        .map(|p| {
            let (engine, prompt) = (engine.clone(), p.to_string());
            std::thread::spawn(move || reply(&engine, &prompt, None))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let after = engine.scheduler_state();
    println!("{arch:?}\n{alone:#?}\n{together:#?}\n{after:?}");
    assert!(
        after.unequal_decode_passes > 0,
        "{arch:?}: no pass decoded unequal lengths: {after:?}"
    );
    assert_eq!(after.mixed_passes, 0, "{arch:?}: mixed passes are off");
    assert!(
        after.decoded_sequences - before.decoded_sequences
            > after.decode_passes - before.decode_passes
    );
    assert_eq!(together, alone, "{arch:?}");
}

/// Patch 24 (and 25 for the qwen models) with the adapter's `Batching::Mixed`: with
/// 16-token chunks, each request is sent once the one before has its first token, so its
/// prompt's chunks run in passes beside the earlier ones' decodes. Two engines, so that
/// the second finds none of the prompts in its prefix cache.
fn mixed_passes(arch: Architecture) {
    let model = RandomModel::new(arch, "mixed");
    let one_at_a_time = model.engine(Some(16), true);
    let alone: Vec<String> = PROMPTS
        .iter()
        .map(|p| reply(&one_at_a_time, p, None))
        .collect();
    let alone_state = one_at_a_time.scheduler_state();
    assert_eq!(
        alone_state.mixed_passes, 0,
        "one at a time: {alone_state:?}"
    );
    drop(one_at_a_time);

    let engine = model.engine(Some(16), true);
    let mut threads = Vec::new();
    for prompt in PROMPTS {
        let (first_tx, first_rx) = mpsc::channel();
        let engine = engine.clone();
        threads.push(std::thread::spawn(move || {
            reply(&engine, prompt, Some(first_tx))
        }));
        // The next arrives while this one decodes (or once it ended without text).
        let _ = first_rx.recv();
    }
    let together: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let after = engine.scheduler_state();
    println!("{arch:?}\n{alone:#?}\n{together:#?}\n{after:?}");
    assert!(
        after.mixed_passes >= 2,
        "{arch:?}: too few mixed passes: {after:?}"
    );
    assert_eq!(together, alone, "{arch:?}");
}

/// A random model of `SHAPE` written to a temporary file for one test, removed after it.
struct RandomModel {
    path: PathBuf,
    cache: ModelCache,
}

impl RandomModel {
    fn new(arch: Architecture, test: &str) -> Self {
        let cache = ModelCache::from_env();
        let template = cache.llm_gguf().expect("cargo xtask setup");
        let path = std::env::temp_dir().join(format!(
            "sublet-{}-{test}-{}.gguf",
            arch.name(),
            std::process::id()
        ));
        random_model::write_random_model_of(arch, &template, SHAPE, 7, &path).unwrap();
        Self { path, cache }
    }

    /// An engine on the model under make-room, with `chunk_tokens`, mixed passes or not.
    fn engine(&self, chunk_tokens: Option<usize>, mixed_passes: bool) -> Arc<Engine> {
        Arc::new(
            Engine::load(&EngineConfig {
                model: self.path.clone(),
                make_room: Some(PolicyConfig {
                    chunk_tokens,
                    ..PolicyConfig::default()
                }),
                mixed_passes,
                ..EngineConfig::from_cache(&self.cache).unwrap()
            })
            .unwrap(),
        )
    }
}

impl Drop for RandomModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A greedy reply of `MAX_TOKENS` tokens to one user message; `first` hears of its first
/// piece of text.
fn reply(engine: &Engine, prompt: &str, first: Option<mpsc::Sender<()>>) -> String {
    let request = ChatRequest::new(vec![Message::new(Role::User, prompt)], MAX_TOKENS);
    let mut stream = engine.chat(request).unwrap();
    let mut first = first;
    let mut text = String::new();
    while let Some(event) = stream.next_blocking() {
        match event.unwrap() {
            StreamEvent::Text(piece) => {
                text.push_str(&piece);
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
            }
            StreamEvent::ToolCalls(_) => {}
            StreamEvent::Done(finish) => {
                assert!(
                    finish.completion_tokens >= MIN_TOKENS,
                    "{prompt:?}: {text:?} {finish:?}"
                );
                return text;
            }
        }
    }
    panic!("{prompt:?}: the stream ended without a result");
}
