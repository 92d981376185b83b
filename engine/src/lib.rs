//! The LLM engine, in process: mistral.rs 0.8.1 serving the bundled SmolLM2 GGUF on CPU,
//! behind a small Rust API that streams a reply's text and cancels it when dropped.
//!
//! On CPU the weights stay as the GGUF stores them by default ([`Weights`]), multiplied
//! by f32 activations (candle patch 2): each decode step reads 96 MB instead of F32's
//! 540 MB, and the products equal the dequantized-F32 path's up to summation order. Stock
//! candle rounds the activations to 8 bits instead.

mod call_line;
mod chat;
mod cpu_priority;
mod device;
mod error;
mod grammar;
mod hub;
pub mod memory;
mod model_file;
pub mod scheduler;
mod stream;
mod tokens;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use either::Either;
use mistralrs_core::{
    AutoDeviceMapParams, Constraint, DefaultSchedulerMethod, DeviceMapSetting, DrySamplingParams,
    GGUFLoaderBuilder, GGUFSpecificConfig, MistralRs, MistralRsBuilder, ModelDType, NormalRequest,
    Request, RequestMessage, SamplingParams, SchedulerConfig, StopTokens, TokenSource,
};
use sublet_models::{MissingModel, ModelCache};

pub use call_line::CallLine;
use chat::{chat_messages, engine_tools};
pub use chat::{
    ChatRequest, Message, Prompt, Repetition, ReplyFormat, Role, Tool, ToolCall, ToolChoice,
    AGENT_PRIORITY, VOICE_PRIORITY,
};
pub use device::{Accelerator, KvPool, KV_BLOCK_TOKENS};
pub use error::{EngineError, LoadError};
pub use grammar::{CompiledSchema, GrammarCheck, GrammarRefused, GRAMMAR_BUDGET};
pub use hub::gguf_from_hub;
pub use model_file::{
    check_chat_template, inspect_gguf, GgufFacts, GgufProblem, GGUF_ARCHITECTURES,
};
use stream::StopCut;
pub use stream::{DeadlinePassed, Finish, FinishReason, ReplyStream, StreamEvent};
pub use tokens::TokenCounter;

pub use sublet_make_room as make_room;
pub mod probe;
pub mod random_model;

/// make-room as Sublet's programs run it beside a voice agent: every switch on, and a
/// call's prompts (at [`VOICE_PRIORITY`] or more urgent) computed whole. A program changes
/// from here only what it is asked for (a KV budget, a chunk size, switches from a flag).
pub fn deployed_make_room() -> make_room::PolicyConfig {
    make_room::PolicyConfig {
        switches: make_room::Switches::all(),
        whole_prompt_priority: Some(VOICE_PRIORITY),
        ..make_room::PolicyConfig::default()
    }
}

/// How the engine loads and runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The GGUF file to serve.
    pub model: PathBuf,
    /// A chat template for a GGUF that carries none (`.jinja`, or `.json` with a
    /// `chat_template` field).
    pub chat_template: Option<PathBuf>,
    /// How the GGUF's quantized weights are held in memory. candle reads the setting once
    /// per thread, so a process should load its engines with one kind of weights.
    pub weights: Weights,
    /// Most sequences the scheduler runs at once.
    pub max_running: usize,
    /// Where it runs (the CPU by default).
    pub accelerator: Accelerator,
    /// Run make-room's scheduler (its switches and the KV budget in tokens) instead of
    /// mistral.rs's default one.
    pub make_room: Option<make_room::PolicyConfig>,
    /// The nice value of the engine's threads (its loop and the compute pool) in steps that
    /// compute for no voice turn, so that the voice pipeline's models take the cores first
    /// (Linux, under make-room with priority on, on the CPU's path; see `cpu_priority.rs`).
    /// 0, the default: never lowered; [`SHARED_COMPUTE_NICE`] where calls share the engine
    /// with agents.
    pub compute_nice: i32,
    /// Under make-room on the CPU, run a step's decodes inside its prompt chunk's pass
    /// where the model takes them (the GGUF llama, qwen2 and qwen3 models; patches 24 and
    /// 25 of the series): on a CPU each pass reads every weight once. On by default; off,
    /// they are passes of their own, as stock runs them.
    pub mixed_passes: bool,
}

/// The engine threads' nice value in steps that serve no caller, for an engine that calls
/// share with agents (the bench, and the demos with `--api`): the kernel then gives the
/// voice pipeline's threads about ten times the engine's share of a contended core (what it
/// changed: `docs/benchmarking.md`, run 12).
pub const SHARED_COMPUTE_NICE: i32 = 10;

impl EngineConfig {
    /// The cache's LLM (the user's choice, else the bundled SmolLM2-135M-Instruct), with
    /// its quantized weights.
    pub fn from_cache(cache: &ModelCache) -> Result<Self, MissingModel> {
        Ok(Self {
            model: cache.llm_gguf()?,
            chat_template: cache.chat_template().map(Path::to_path_buf),
            weights: Weights::default(),
            max_running: 16,
            accelerator: Accelerator::Cpu,
            make_room: None,
            compute_nice: 0,
            mixed_passes: true,
        })
    }
}

/// How the model's weights are held: what each decode step reads from memory, and how
/// its matrix products round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    /// As the GGUF stores them (~100 MB for SmolLM2-135M), dequantized block by block as
    /// each product streams through them; activations stay f32. On CPUs without AVX2 and
    /// for block types other than Q4_0, Q4_1 and Q8_0, candle's stock path runs instead,
    /// which rounds the activations to 8 bits.
    #[default]
    Quantized,
    /// Dequantized to F32 at load (~540 MB for SmolLM2-135M): the reference for the
    /// quantized path's answers.
    F32,
    /// Dequantized to F16 at load: activations are rounded to F16 for each product, which
    /// accumulates in F32.
    F16,
}

impl std::str::FromStr for Weights {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "quantized" => Ok(Self::Quantized),
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            other => Err(format!(
                "unknown weights {other:?} (expected quantized, f32 or f16)"
            )),
        }
    }
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Quantized => "quantized",
            Self::F32 => "f32",
            Self::F16 => "f16",
        })
    }
}

/// The engine: one model, shared by every caller and agent in the process.
pub struct Engine {
    runner: Arc<MistralRs>,
    /// make-room's side of the engine; `None` under mistral.rs's own scheduler.
    make_room: Option<scheduler::MakeRoomHandle>,
    runtime: tokio::runtime::Runtime,
    next_id: AtomicUsize,
    model_name: String,
    tokens: Option<TokenCounter>,
    grammar: Option<GrammarCheck>,
    /// The heap loading the model took (`None` off glibc).
    weights_bytes: Option<u64>,
    /// Whether the model's chat template renders system messages; if not, each is folded
    /// into the user message after it.
    system_role: bool,
}

impl Engine {
    /// Loads the model and starts the engine's scheduler thread.
    pub fn load(config: &EngineConfig) -> Result<Self, LoadError> {
        // Read by candle (once per thread) when each quantized matrix is loaded.
        let (f32_var, f16_var) = match config.weights {
            Weights::Quantized => ("0", "0"),
            Weights::F32 => ("1", "0"),
            Weights::F16 => ("0", "1"),
        };
        std::env::set_var("CANDLE_DEQUANTIZE_ALL", f32_var);
        std::env::set_var("CANDLE_DEQUANTIZE_ALL_F16", f16_var);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sublet-engine-io")
            .enable_all()
            .build()?;
        let make_room = scheduler::MakeRoomHandle::default();
        let owner = sublet_heap::owned_by(sublet_heap::Owner::Engine);
        // The header once, for the batching the model takes and its template's roles.
        let facts = inspect_gguf(&config.model, true).ok();
        let (built, weights_bytes) = memory::heap_taken_by(|| {
            runtime.block_on(build_runner(config, facts.as_ref(), &make_room))
        });
        drop(owner);
        let (runner, tokens, grammar) = built?;
        // The load's warm-up request leaves its KV in the prefix cache: not weights.
        let warm_up_kv = make_room.state().memory.prefix_cache_bytes;
        let weights_bytes = weights_bytes.map(|b| b.saturating_sub(warm_up_kv));
        let system_role = model_file::system_role(config.chat_template.as_deref(), facts);
        let model_name = config
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        Ok(Self {
            runner,
            make_room: config.make_room.is_some().then_some(make_room),
            runtime,
            next_id: AtomicUsize::new(1),
            model_name,
            tokens,
            grammar,
            weights_bytes,
            system_role,
        })
    }

    /// Where the engine's memory goes: its weights, the KV its sequences and its prefix
    /// cache hold, and the heap's largest rise in a step. The KV and step figures come from
    /// make-room's scheduler on the CPU's path; they read zero under mistral.rs's own
    /// scheduler and on the paged path, whose pool is allocated whole at load.
    pub fn memory(&self) -> memory::EngineMemory {
        memory::EngineMemory {
            weights_bytes: self.weights_bytes,
            ..self.scheduler_state().memory
        }
    }

    /// make-room's scheduler after its latest step: counters, KV use, queue lengths (all
    /// zero with mistral.rs's default scheduler).
    pub fn scheduler_state(&self) -> scheduler::SchedulerState {
        self.make_room
            .as_ref()
            .map(|handle| handle.state())
            .unwrap_or_default()
    }

    /// Changes make-room's switches; they apply once no request is in flight.
    pub fn set_make_room_switches(&self, switches: make_room::Switches) {
        if let Some(handle) = &self.make_room {
            handle.set_switches(switches);
        }
    }

    /// For tests of recovery: under make-room, the engine thread panics when it next
    /// plans a step, as a fault in a model or the scheduler would; the requests in flight
    /// fail with [`EngineError::Internal`] and the engine restarts for the next request.
    /// False (nothing injected) under mistral.rs's own scheduler.
    #[doc(hidden)]
    pub fn panic_at_next_step(&self) -> bool {
        match &self.make_room {
            Some(handle) => {
                handle.panic_at_next_plan();
                true
            }
            None => false,
        }
    }

    /// The served model's name (the GGUF file's stem).
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Counts a text's tokens on the caller's thread, with the model's tokenizer (`None` if
    /// the model has none mistral.rs exposes).
    pub fn token_counter(&self) -> Option<&TokenCounter> {
        self.tokens.as_ref()
    }

    /// Compiles reply formats as the engine does, on the caller's thread (`None` if the
    /// model has no tokenizer mistral.rs builds grammars for).
    pub fn grammar_check(&self) -> Option<&GrammarCheck> {
        self.grammar.as_ref()
    }

    /// Most tokens a prompt plus its reply may take, when the model says.
    pub fn max_sequence_length(&self) -> Option<usize> {
        self.runner.max_sequence_length(None).ok().flatten()
    }

    /// Starts a chat completion from a plain thread; its text streams back through the
    /// returned stream, and dropping the stream cancels it in the engine (at its next
    /// token). Must not be called from inside an async runtime: use [`Engine::chat_async`].
    pub fn chat(&self, request: ChatRequest) -> Result<ReplyStream, EngineError> {
        self.runtime.block_on(self.chat_async(request))
    }

    /// The voice-only signals of call `session` to make-room ([`CallLine`]).
    pub fn call_line(self: &Arc<Self>, session: u64) -> CallLine {
        CallLine::new(self.clone(), session)
    }

    /// [`Engine::chat`] for async callers (the HTTP server).
    pub async fn chat_async(&self, request: ChatRequest) -> Result<ReplyStream, EngineError> {
        let stop = request.stop.clone();
        let callers = request.priority <= VOICE_PRIORITY;
        let session = request.session;
        let (normal, rx) = self.normal_request(request);
        let sent = std::time::Instant::now();
        self.send(Request::Normal(Box::new(normal))).await?;
        if let (true, Some(handle)) = (callers, &self.make_room) {
            handle.turn_arrived(session, sent);
        }
        Ok(ReplyStream::spawn(
            self.runtime.handle(),
            rx,
            StopCut::new(stop),
        ))
    }

    /// How many tokens `prompt` takes (a chat's with the chat template applied).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<usize, EngineError> {
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let request = Request::Tokenize(mistralrs_core::TokenizationRequest {
            text: match prompt {
                Prompt::Chat(messages) => Either::Left(chat_messages(messages)),
                Prompt::Text(text) => Either::Right(text.clone()),
            },
            tools: None,
            add_generation_prompt: true,
            add_special_tokens: true,
            enable_thinking: None,
            reasoning_effort: None,
            response: tx,
        });
        self.runtime.block_on(async {
            self.send(request).await?;
            match rx.recv().await {
                Some(Ok(tokens)) => Ok(tokens.len()),
                Some(Err(e)) => Err(EngineError::InvalidRequest(format!("{e:#}"))),
                None => Err(EngineError::Stopped),
            }
        })
    }

    /// Sends a request into the engine's thread. A thread that stopped on a panic is
    /// rebuilt when asked for its channel once it has ended; one still unwinding refuses
    /// the request, which is sent again until the new thread takes it.
    async fn send(&self, mut request: Request) -> Result<(), EngineError> {
        const RESTART_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
        let deadline = std::time::Instant::now() + RESTART_WAIT;
        loop {
            let sender = self
                .runner
                .get_sender(None)
                .map_err(|_| EngineError::Stopped)?;
            match sender.send(request).await {
                Ok(()) => return Ok(()),
                Err(refused) if std::time::Instant::now() < deadline => {
                    request = refused.0;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                Err(_) => return Err(EngineError::Stopped),
            }
        }
    }

    fn normal_request(
        &self,
        request: ChatRequest,
    ) -> (
        NormalRequest,
        tokio::sync::mpsc::Receiver<mistralrs_core::Response>,
    ) {
        let messages = match request.prompt {
            Prompt::Chat(messages) if !self.system_role => RequestMessage::Chat {
                messages: chat_messages(&chat::fold_system_messages(&messages)),
                enable_thinking: request.thinking,
                reasoning_effort: None,
            },
            Prompt::Chat(messages) => RequestMessage::Chat {
                messages: chat_messages(&messages),
                enable_thinking: request.thinking,
                reasoning_effort: None,
            },
            Prompt::Text(text) => RequestMessage::Completion {
                text,
                echo_prompt: false,
                best_of: None,
            },
        };
        let (tools, tool_choice) = engine_tools(&request.tools, &request.tool_choice);
        let mut sampling = SamplingParams::deterministic();
        sampling.max_len = Some(request.max_tokens);
        sampling.seed = request.seed;
        if !request.stop.is_empty() {
            sampling.stop_toks = Some(StopTokens::Seqs(request.stop.clone()));
        }
        if let Some(t) = request.temperature.filter(|t| *t > 0.0) {
            sampling.temperature = Some(t);
            sampling.top_k = request.top_k;
            sampling.top_p = request.top_p;
        }
        let repetition = request.repetition;
        sampling.frequency_penalty = repetition.frequency_penalty;
        sampling.presence_penalty = repetition.presence_penalty;
        sampling.dry_params = repetition
            .dry_multiplier
            .map(|multiplier| DrySamplingParams {
                multiplier,
                ..DrySamplingParams::default()
            });
        let constraint = match request.format {
            ReplyFormat::Text => Constraint::None,
            ReplyFormat::JsonSchema(schema) => Constraint::JsonSchema(schema),
            ReplyFormat::Compiled(compiled) => Constraint::Compiled(compiled.grammar),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let normal = NormalRequest {
            messages,
            sampling_params: sampling,
            response: tx,
            return_logprobs: false,
            is_streaming: true,
            id,
            constraint,
            suffix: None,
            tools,
            tool_choice,
            logits_processors: None,
            return_raw_logits: false,
            web_search_options: None,
            model_id: None,
            truncate_sequence: false,
            priority: request.priority,
            session: request.session,
        };
        (normal, rx)
    }
}

async fn build_runner(
    config: &EngineConfig,
    facts: Option<&GgufFacts>,
    make_room: &scheduler::MakeRoomHandle,
) -> Result<(Arc<MistralRs>, Option<TokenCounter>, Option<GrammarCheck>), LoadError> {
    let model = &config.model;
    let dir = model.parent().unwrap_or(Path::new("."));
    let (Some(file), true) = (model.file_name(), model.is_file()) else {
        return Err(LoadError::NoFile(model.clone()));
    };
    let file = file.to_string_lossy().into_owned();
    let settings = config.accelerator.load_settings()?;
    // mistral.rs takes a Jinja template as its "explicit" one and a JSON file as a
    // tokenizer config holding `chat_template`.
    let template = config
        .chat_template
        .as_ref()
        .map(|path| path.to_string_lossy().into_owned());
    let (json_template, jinja_template) = match &template {
        Some(t) if t.ends_with(".jinja") => (None, Some(t.clone())),
        other => (other.clone(), None),
    };
    let loader = GGUFLoaderBuilder::new(
        json_template,
        None,
        dir.to_string_lossy().into_owned(),
        vec![file],
        GGUFSpecificConfig { topology: None },
        false,
        jinja_template,
    )
    .build();
    let pipeline = loader
        .load_model_from_hf(
            None,
            TokenSource::None,
            &model_dtype(settings.dtype),
            &settings.device,
            true,
            DeviceMapSetting::Auto(AutoDeviceMapParams::default_text()),
            None,
            settings.paged,
        )
        .map_err(|e| LoadError::Model {
            path: model.clone(),
            source: e.into(),
        })?;
    let tokens = pipeline.lock().await.tokenizer().map(|tokenizer| {
        let longest = tokenizer.get_vocab(true).keys().map(String::len).max();
        let whole = tokenizer.clone();
        let count = move |text: &str| tokenizer.encode(text, false).ok().map(|e| e.len());
        TokenCounter::new(count, longest.unwrap_or(1))
            .with_json(move || whole.to_string(false).ok())
    });
    let grammar = pipeline.lock().await.get_metadata().llg_factory.clone();
    let grammar = grammar.map(GrammarCheck::new);
    let max_running: std::num::NonZeroUsize =
        config.max_running.max(1).try_into().expect("at least one");
    let paged_cache = pipeline.lock().await.get_metadata().cache_config.clone();
    let Some(policy) = &config.make_room else {
        let scheduler = match paged_cache {
            Some(config) => SchedulerConfig::PagedAttentionMeta {
                max_num_seqs: max_running.get(),
                config,
            },
            None => SchedulerConfig::DefaultScheduler {
                method: DefaultSchedulerMethod::Fixed(max_running),
            },
        };
        let runner = MistralRsBuilder::new(pipeline, scheduler, false, None)
            .build()
            .await;
        return Ok((runner, tokens, grammar));
    };
    let policy = make_room::PolicyConfig {
        max_running: config.max_running.max(1),
        ..policy.clone()
    };
    let scheduler: Arc<tokio::sync::Mutex<dyn mistralrs_core::Scheduler>> = match &paged_cache {
        Some(cache) => Arc::new(tokio::sync::Mutex::new(
            scheduler::PagedMakeRoomScheduler::new(policy, make_room, cache),
        )),
        None => Arc::new(tokio::sync::Mutex::new(
            scheduler::MakeRoomScheduler::new(policy, make_room)
                .batching(
                    match (
                        model_file::batches_unequal_lengths(facts),
                        config.mixed_passes,
                    ) {
                        (false, _) => scheduler::Batching::EqualLengths,
                        (true, false) => scheduler::Batching::UnequalDecodes,
                        (true, true) => scheduler::Batching::Mixed,
                    },
                )
                .compute_nice(config.compute_nice),
        )),
    };
    // mistral.rs's own prefix cache stays on, as stock: a request that shares a prefix
    // with a finished one (a call's next turn, an agent's next call) starts from its KV.
    let runner = MistralRsBuilder::new(pipeline, SchedulerConfig::Custom(scheduler), false, None)
        .build()
        .await;
    Ok((runner, tokens, grammar))
}

fn model_dtype(dtype: candle_core::DType) -> ModelDType {
    match dtype {
        candle_core::DType::BF16 => ModelDType::BF16,
        candle_core::DType::F16 => ModelDType::F16,
        _ => ModelDType::F32,
    }
}

#[cfg(test)]
mod tests;
