//! What the demos share: how the engine's scheduler is chosen on the command line, loading
//! the voice agent on it, the progress they print as a call goes, and how they exit.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use sublet_agent::{AgentConfig, CallObserver, TurnRecord, VoiceAgent};
use sublet_engine::make_room::{PolicyConfig, Switches};
use sublet_engine::{Engine, EngineConfig, VOICE_PRIORITY};
use sublet_models::ModelCache;
use sublet_turn_detect::TurnEvent;

/// The engine's scheduler: mistral.rs's own (the default), or make-room's.
#[derive(Args, Debug, Clone)]
pub struct SchedulerArgs {
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

impl SchedulerArgs {
    /// The bundled engine, scheduled as asked.
    pub fn engine_config(&self, cache: &ModelCache) -> Result<EngineConfig> {
        Ok(EngineConfig {
            make_room: self.make_room.clone().map(|switches| PolicyConfig {
                switches,
                kv_budget_tokens: self.kv_budget,
                chunk_tokens: Some(self.chunk.max(1)),
                idle_chunk_tokens: self.idle_chunk.map(|c| c.max(1)),
                whole_prompt_priority: Some(VOICE_PRIORITY),
                ..PolicyConfig::default()
            }),
            ..EngineConfig::bundled(cache)?
        })
    }

    /// The bundled voice agent, configured as given, on an engine scheduled as asked.
    pub fn voice_agent_with(&self, config: AgentConfig) -> Result<VoiceAgent> {
        let cache = ModelCache::from_env();
        let engine = Arc::new(Engine::load(&self.engine_config(&cache)?)?);
        Ok(VoiceAgent::with_engine(cache, engine, config))
    }
}

/// How the agent takes turns, as the demos' flags set it.
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Send the engine a one-token turn hint when the caller stops speaking.
    #[arg(long)]
    pub turn_hints: bool,
    /// Start each reply as soon as the caller stops speaking, before the end of their turn
    /// is certain; it is cancelled if they go on (live calls).
    #[arg(long)]
    pub preemptive: bool,
    /// Adapt the unsure end-of-turn wait to the caller's own pauses.
    #[arg(long)]
    pub dynamic_endpointing: bool,
    /// How long the caller must speak over the agent to interrupt it, in seconds.
    #[arg(long, default_value_t = 0.5)]
    pub min_interruption: f64,
    /// The caller cannot interrupt the agent.
    #[arg(long)]
    pub no_interruptions: bool,
}

impl AgentArgs {
    pub fn config(&self) -> AgentConfig {
        let defaults = AgentConfig::default();
        AgentConfig {
            turn_hints: self.turn_hints,
            preemptive_generation: self.preemptive,
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
        }
    }
}

/// A demo's exit: success, or its error (with causes) after its name, and a failing status.
pub fn exit(program: &str, result: Result<()>) -> ExitCode {
    match result {
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
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        scheduler: SchedulerArgs,
    }

    #[test]
    fn switches_parse_from_the_command_line() {
        let cli = Cli::try_parse_from(["x", "--make-room", "priority,kv_preemption"]).unwrap();
        let switches = cli.scheduler.make_room.unwrap();
        assert!(switches.priority && switches.kv_preemption && !switches.budget_cap);
        let cli = Cli::try_parse_from(["x", "--make-room", "all", "--kv-budget", "2048"]).unwrap();
        assert_eq!(cli.scheduler.make_room, Some(Switches::all()));
        assert_eq!(cli.scheduler.kv_budget, 2048);
        assert!(Cli::try_parse_from(["x", "--make-room", "fastest"]).is_err());
        // A budget means nothing without make-room's scheduler.
        assert!(Cli::try_parse_from(["x", "--kv-budget", "2048"]).is_err());
        assert_eq!(
            Cli::try_parse_from(["x"]).unwrap().scheduler.make_room,
            None
        );
    }
}
