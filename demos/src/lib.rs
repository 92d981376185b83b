//! What the demos share: how the engine's scheduler is chosen on the command line, loading
//! the voice agent on it, serving the agents' API beside the calls, the progress they print
//! and the timeline they keep as a call goes, and how they exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use sublet_agent::{AgentConfig, CallObserver, Persona, SpeechMemory, TurnRecord, VoiceAgent};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{
    deployed_make_room, Engine, EngineConfig, AGENT_PRIORITY, SHARED_COMPUTE_NICE,
};
use sublet_models::{ModelArgs, ModelCache, ModelNames};
use sublet_server::{router, serve, ConnectionLimits, Metrics, MoreMetrics, ServerConfig};
use sublet_turn_detect::TurnEvent;

mod call_limits;
mod timeline;
pub mod view;
pub use call_limits::CallLimits;
pub use sublet_agent::call_log::{read_call_record, CallLog, CallRecord};
pub use timeline::{Recorded, TimelineFile};
pub use view::{CallerRoom, ViewArgs};

/// Where calls' records go: `SUBLET_RECORDS`, else `$XDG_STATE_HOME/sublet/calls`, else
/// `~/.local/state/sublet/calls`, else `records` here.
pub fn default_records_dir() -> PathBuf {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = env("SUBLET_RECORDS") {
        return dir.into();
    }
    if let Some(state) = env("XDG_STATE_HOME") {
        return PathBuf::from(state).join("sublet/calls");
    }
    match env("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/sublet/calls"),
        None => "records".into(),
    }
}

/// The models (the user's, else the bundled ones) and the engine's scheduler: mistral.rs's
/// own (the default), or make-room's.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    #[command(flatten)]
    pub models: ModelArgs,
    /// Run make-room's scheduler with these switches: `all`, `none`, or a list of
    /// priority,kv_preemption,budget_cap,decode_hold,turn_hint,call_retention. Without it
    /// the engine schedules exactly as stock mistral.rs.
    #[arg(long, value_name = "SWITCHES")]
    pub make_room: Option<Switches>,
    /// make-room's KV budget, in tokens.
    #[arg(long, default_value_t = 4096, requires = "make_room")]
    pub kv_budget: usize,
    /// make-room's prompt chunk, in tokens per step (a voice turn's prompt runs whole).
    #[arg(long, default_value_t = 16, requires = "make_room")]
    pub chunk: usize,
    /// make-room's step budget while no voice turn is near (default: the chunk): fewer
    /// passes for agents' prompts; pair it with --turn-hints so it shrinks before a turn.
    #[arg(long, requires = "make_room")]
    pub idle_chunk: Option<usize>,
}

impl EngineArgs {
    /// The model cache with the user's models in place of the bundled ones, each checked
    /// first: a file that cannot run is refused here, naming its flag.
    pub fn models(&self) -> Result<ModelCache> {
        sublet_agent::models::choose(&self.models)
    }

    /// The cache's engine, scheduled as asked. An engine `shared` by calls and agents runs
    /// make-room with every switch unless `--make-room` says otherwise: there it is what
    /// keeps the caller's turns ahead of the agents.
    pub fn engine_config(&self, cache: &ModelCache, shared: bool) -> Result<EngineConfig> {
        let switches = match (&self.make_room, shared) {
            (Some(switches), _) => Some(switches.clone()),
            (None, true) => Some(Switches::all()),
            (None, false) => None,
        };
        Ok(EngineConfig {
            make_room: switches.map(|switches| PolicyConfig {
                switches,
                kv_budget_tokens: self.kv_budget,
                chunk_tokens: Some(self.chunk.max(1)),
                idle_chunk_tokens: self.idle_chunk.map(|c| c.max(1)),
                ..deployed_make_room()
            }),
            compute_nice: match shared {
                true => SHARED_COMPUTE_NICE,
                false => 0,
            },
            ..EngineConfig::from_cache(cache)?
        })
    }

    /// The voice agent on the chosen models, configured as given, on an engine scheduled
    /// as asked.
    pub fn voice_agent_with(&self, config: AgentConfig) -> Result<VoiceAgent> {
        Ok(self.voice_agent_sharing(config, false)?.0)
    }

    /// The same, on an engine that may be `shared` with agents, and that engine.
    pub fn voice_agent_sharing(
        &self,
        config: AgentConfig,
        shared: bool,
    ) -> Result<(VoiceAgent, Arc<Engine>)> {
        let cache = self.models()?;
        let engine = Arc::new(Engine::load(&self.engine_config(&cache, shared)?)?);
        Ok((
            VoiceAgent::with_engine(cache, engine.clone(), config),
            engine,
        ))
    }
}

/// What a process answering live calls takes: how the agent takes turns, how the engine is
/// scheduled, and the agents' API beside the calls (`room`, `worker`).
#[derive(Args, Debug, Clone)]
pub struct CallArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub limits: CallLimits,
    #[command(flatten)]
    pub records: RecordsArgs,
    #[command(flatten)]
    pub view: ViewArgs,
}

/// How often a live view gets what the caller has said so far (each costs a transcription).
pub const PARTIAL_TRANSCRIPT_EVERY_S: f64 = 1.0;

/// Where each call's record goes.
#[derive(Args, Debug, Clone, Default)]
pub struct RecordsArgs {
    /// Keep each call's turns in a JSON-lines file in DIR, each turn on disk as it ends
    /// (default: `SUBLET_RECORDS`, else `~/.local/state/sublet/calls`).
    #[arg(long, value_name = "DIR")]
    pub records: Option<PathBuf>,
}

impl RecordsArgs {
    pub fn dir(&self) -> PathBuf {
        self.records.clone().unwrap_or_else(default_records_dir)
    }

    /// A new call's record, `fields` and the models in use in its first line.
    pub fn open(
        &self,
        program: &str,
        call: &str,
        models: &ModelNames,
        mut fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<CallLog> {
        fields.insert("models".into(), models_json(models));
        CallLog::create(&self.dir(), program, call, fields)
    }
}

impl CallArgs {
    /// Each room call's options (`--media-timeout`, `--muted-timeout`, `--max-call`).
    pub fn room_options(&self) -> sublet_livekit::CallOptions {
        self.limits.room_options()
    }

    /// The agent's configuration, on an engine shared with agents when `--api` is given;
    /// with `--view`, partial transcripts each second for the page.
    pub fn config(&self) -> AgentConfig {
        let mut config = self.agent.config_sharing(self.api.shared());
        if self.view.view.is_some() {
            config.partial_transcripts_s = Some(PARTIAL_TRANSCRIPT_EVERY_S);
        }
        config
    }

    /// Loads the voice agent, starts a runtime, and serves the agents' API on it (when
    /// `--api` is given) on the calls' engine.
    pub fn start(&self, program: &'static str) -> Result<(VoiceAgent, tokio::runtime::Runtime)> {
        self.api.check()?;
        let (agent, engine) = self
            .engine
            .voice_agent_sharing(self.config(), self.api.shared())?;
        let runtime = tokio::runtime::Runtime::new()?;
        let speech = agent.with_config(agent.config.clone());
        let more = MoreMetrics(Arc::new(move || speech_metrics(&speech.speech_memory())));
        self.api
            .spawn(program, runtime.handle(), &engine, Some(more))?;
        Ok((agent, runtime))
    }
}

/// The agents' OpenAI-compatible API, served from the process that answers the calls, on
/// the same engine: the product's own shape, where make-room can protect the caller.
#[derive(Args, Debug, Clone, Default)]
pub struct ApiArgs {
    /// Also serve coding agents the OpenAI-compatible API at this address (for example
    /// 127.0.0.1:8000), on the engine the calls use. make-room (every switch) and the turn
    /// hint are then on unless `--make-room` or `--no-turn-hints` say otherwise.
    #[arg(long, value_name = "ADDR")]
    pub api: Option<SocketAddr>,
    /// Require this key as `Authorization: Bearer <key>` on the API (default:
    /// `SUBLET_API_KEY`, else none).
    #[arg(long, env = "SUBLET_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub limits: ApiLimitArgs,
}

/// How the agents' API treats its clients (`serve`, and `--api` beside the calls).
#[derive(Args, Debug, Clone)]
pub struct ApiLimitArgs {
    /// Chat requests in flight at once, waiting in the engine or running; more get 429
    /// with `Retry-After`.
    #[arg(long, default_value_t = ServerConfig::default().max_in_flight)]
    pub api_max_in_flight: usize,
    /// The most urgent priority a client may ask for (lower is more urgent: voice turns run
    /// at 0, agents at 1). Lower it only for clients trusted to outrank a caller.
    #[arg(long, default_value_t = AGENT_PRIORITY, allow_negative_numbers = true)]
    pub api_priority_floor: i32,
    /// A host name the API answers to without a key, beside 127.0.0.1, ::1 and localhost
    /// (repeatable): a request naming any other `Host` gets 403, so a web page that rebinds
    /// its own name to this machine cannot use the API. With a key any name is served.
    #[arg(long, value_name = "NAME")]
    pub api_allowed_host: Vec<String>,
}

impl Default for ApiLimitArgs {
    fn default() -> Self {
        Self {
            api_max_in_flight: ServerConfig::default().max_in_flight,
            api_priority_floor: AGENT_PRIORITY,
            api_allowed_host: Vec::new(),
        }
    }
}

impl ApiLimitArgs {
    /// The server's configuration with these limits, requiring `api_key` if given.
    pub fn server_config(&self, api_key: Option<String>) -> ServerConfig {
        let mut config = ServerConfig {
            api_key,
            max_in_flight: self.api_max_in_flight,
            allowed_hosts: self.api_allowed_host.clone(),
            ..ServerConfig::default()
        };
        let least_urgent = *config.limits.priorities.end();
        config.limits.priorities =
            self.api_priority_floor..=least_urgent.max(self.api_priority_floor);
        config
    }
}

impl ApiArgs {
    /// [`check_exposure`] for `--api`, before anything loads.
    pub fn check(&self) -> Result<()> {
        match self.api {
            Some(addr) => check_exposure("--api", addr, self.api_key.as_deref()),
            None => Ok(()),
        }
    }

    /// Whether agents share the engine with the calls.
    pub fn shared(&self) -> bool {
        self.api.is_some()
    }

    /// Listens on `--api`, if given, and serves the API on `runtime` until the process ends.
    pub fn spawn(
        &self,
        program: &'static str,
        runtime: &tokio::runtime::Handle,
        engine: &Arc<Engine>,
        more_metrics: Option<MoreMetrics>,
    ) -> Result<()> {
        let Some(addr) = self.api else {
            return Ok(());
        };
        let listener = runtime.block_on(listen(addr))?;
        eprintln!(
            "{program}: the agents' API ({}) on http://{}/v1",
            engine.model_name(),
            listener.local_addr()?
        );
        let config = ServerConfig {
            more_metrics,
            ..self.limits.server_config(self.api_key.clone())
        };
        let app = api_router(engine, config);
        runtime.spawn(serve(
            listener,
            app,
            ConnectionLimits::default(),
            std::future::pending(),
        ));
        Ok(())
    }
}

/// The voice agent's speech models in `/metrics`: the heap each took at its latest load;
/// and each part's large blocks, by the pages they touch.
fn speech_metrics(memory: &SpeechMemory) -> String {
    let mut out = String::new();
    let name = "sublet_speech_model_bytes";
    out.push_str(&format!(
        "# HELP {name} The heap each speech model took at its latest load.\n# TYPE {name} gauge\n"
    ));
    for (model, bytes) in [
        ("whisper", memory.whisper_bytes),
        ("turn_detector", memory.turn_detector_bytes),
        ("voice", memory.voice_bytes),
    ] {
        if let Some(bytes) = bytes {
            out.push_str(&format!("{name}{{model=\"{model}\"}} {bytes}\n"));
        }
    }
    if let Some(blocks) = sublet_heap::large_blocks() {
        let name = "sublet_heap_large_block_bytes";
        out.push_str(&format!(
            "# HELP {name} Each part's large heap blocks: allocated, and resident (pages touched).\n# TYPE {name} gauge\n"
        ));
        for owner in sublet_heap::Owner::ALL {
            let b = blocks.of(owner);
            let part = owner.name();
            out.push_str(&format!(
                "{name}{{part=\"{part}\",pages=\"allocated\"}} {}\n{name}{{part=\"{part}\",pages=\"resident\"}} {}\n",
                b.allocated, b.resident
            ));
        }
    }
    out
}

/// The models in use, as a call's record and the live page show them.
pub fn models_json(models: &ModelNames) -> serde_json::Value {
    serde_json::json!({ "llm": models.llm, "stt": models.stt, "voice": models.voice })
}

/// A listener on `addr`, or an error that names it.
pub async fn listen(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}

/// Refuses, at start, an API that anyone on the network could use: an empty key (a bare
/// `Bearer ` would match it), or a non-loopback address (`flag`'s) without a key.
pub fn check_exposure(flag: &str, addr: SocketAddr, api_key: Option<&str>) -> Result<()> {
    match api_key {
        Some("") => bail!("--api-key is empty: give a key, or none on a loopback address"),
        None if !addr.ip().is_loopback() => bail!(
            "{flag} {addr} is reachable from other machines: give --api-key KEY (or \
             SUBLET_API_KEY), or listen on 127.0.0.1"
        ),
        _ => Ok(()),
    }
}

/// The agents' API over `engine`.
pub fn api_router(engine: &Arc<Engine>, config: ServerConfig) -> axum::Router {
    router(engine.clone(), config, Arc::new(Metrics::default()))
}

/// How the agent takes turns, as the demos' flags set it.
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Send the engine a one-token turn hint when the caller stops speaking (on by default
    /// when agents share the engine).
    #[arg(long)]
    pub turn_hints: bool,
    /// No turn hints, even when agents share the engine.
    #[arg(long, conflicts_with = "turn_hints")]
    pub no_turn_hints: bool,
    /// Do not start each reply as the caller stops speaking (preemptive generation, on by
    /// default: a reply started before the end of the turn is certain, cancelled if they
    /// go on); start it at the end of the turn.
    #[arg(long)]
    pub no_preemptive: bool,
    /// Do not transcribe the turn as the caller stops (its words then neither end nor
    /// hold the turn, and the transcript is taken after the end of the turn).
    #[arg(long)]
    pub no_early_transcript: bool,
    /// Adapt the unsure end-of-turn wait to the caller's own pauses.
    #[arg(long)]
    pub dynamic_endpointing: bool,
    /// How long the caller must speak over the agent to interrupt it, in seconds.
    #[arg(long, default_value_t = 0.5)]
    pub min_interruption: f64,
    /// The caller cannot interrupt the agent.
    #[arg(long)]
    pub no_interruptions: bool,
    /// Who the agent is: its instructions, greeting, fallback phrase and voice, from a TOML
    /// file (`demos/personas/booking.toml` is an example); the built-in assistant without.
    #[arg(long, value_name = "FILE", value_parser = read_persona)]
    pub persona: Option<Persona>,
}

fn read_persona(path: &str) -> Result<Persona, String> {
    Persona::load(std::path::Path::new(path)).map_err(|e| format!("{e:#}"))
}

impl AgentArgs {
    /// The agent's configuration, for an engine of its own.
    pub fn config(&self) -> AgentConfig {
        self.config_sharing(false)
    }

    /// The agent's configuration, for an engine that may be `shared` with agents: there
    /// the turn hint is on unless `--no-turn-hints`.
    pub fn config_sharing(&self, shared: bool) -> AgentConfig {
        let defaults = AgentConfig::default();
        let config = AgentConfig {
            turn_hints: self.turn_hints || (shared && !self.no_turn_hints),
            preemptive_generation: !self.no_preemptive,
            early_transcript: !self.no_early_transcript,
            endpoint: sublet_turn_detect::EndpointConfig {
                dynamic: self.dynamic_endpointing,
                ..defaults.endpoint.clone()
            },
            interruptions: sublet_agent::InterruptionConfig {
                enabled: !self.no_interruptions,
                min_speech_s: self.min_interruption,
                ..defaults.interruptions.clone()
            },
            ..defaults
        };
        match &self.persona {
            Some(persona) => persona.apply(config),
            None => config,
        }
    }
}

/// Counts the heap, so that the engine reports the most a step took (`/metrics`, the page).
#[global_allocator]
static HEAP: sublet_engine::memory::CountingAllocator = sublet_engine::memory::CountingAllocator;
// Large blocks by owner and by resident pages, for `/metrics` and the live page.
sublet_heap::interpose_malloc!();

/// Runs a demo: the libraries' warnings (through `tracing`) printed on stderr, then `run`;
/// success, or its error (with causes) after the demo's name and a failing status.
pub fn main(program: &str, run: impl FnOnce() -> Result<()>) -> ExitCode {
    HEAP.start();
    sublet_agent::allocator::for_long_running_process();
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .without_time()
        .try_init();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints each turn-taking event and each answered turn as the call goes, each line
/// after `label` (the room's name when a worker runs several calls at once).
#[derive(Default)]
pub struct Progress {
    pub label: String,
}

impl CallObserver for Progress {
    fn turn_event(&mut self, event: &TurnEvent) {
        let label = &self.label;
        match event {
            TurnEvent::SpeechStarted { at_s } => {
                eprintln!("{label}  {at_s:7.2}s  caller speaking")
            }
            TurnEvent::SpeechStopped {
                at_s,
                end_of_turn_score,
                ..
            } => eprintln!(
                "{label}  {at_s:7.2}s  caller stopped (end-of-turn score {end_of_turn_score:.2})"
            ),
            TurnEvent::EndOfTurn { decided_s, .. } => {
                eprintln!("{label}  {decided_s:7.2}s  end of turn")
            }
        }
    }

    fn turn_answered(&mut self, turn: &TurnRecord) {
        eprintln!(
            "{}  turn {}: {:?} → {:?} ({:.2}s voice to voice)",
            self.label,
            turn.index,
            turn.transcript,
            turn.reply,
            turn.voice_to_voice_s()
        );
    }
}

#[cfg(test)]
mod tests;
