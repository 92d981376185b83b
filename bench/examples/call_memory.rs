//! Resident memory after each of N recorded calls answered in one process, without the
//! LiveKit server the soak needs: where memory that grows with the calls is looked for.
//!
//! ```text
//! cargo run --release -p sublet-bench --example call_memory -- [CALLS] [realtime]
//! ```
//!
//! `NO_CAP=1` leaves glibc's malloc arenas uncapped (see `sublet_agent::allocator`).
use std::sync::Arc;
use sublet_agent::{AgentConfig, Pacing, Quiet, VoiceAgent};
use sublet_engine::{deployed_make_room, Engine, EngineConfig};
use sublet_models::ModelCache;

fn rss_mb() -> f64 {
    sublet_bench::resident_mb().unwrap_or(0.0)
}

fn main() -> anyhow::Result<()> {
    if std::env::var_os("NO_CAP").is_none() {
        sublet_agent::allocator::one_arena_per_core();
    }
    let n: usize = std::env::args().nth(1).map_or(8, |a| a.parse().unwrap());
    let realtime = std::env::args().nth(2).is_some_and(|a| a == "realtime");
    let cache = ModelCache::from_env();
    let engine = Arc::new(Engine::load(&EngineConfig {
        make_room: Some(deployed_make_room()),
        ..EngineConfig::from_cache(&cache)?
    })?);
    let agent = VoiceAgent::with_engine(
        cache.clone(),
        engine,
        AgentConfig {
            turn_hints: true,
            ..AgentConfig::default()
        },
    );
    let call = sublet_audio::read_wav(cache.call("three_turns.wav")?)?;
    println!("before: {:.0} MB", rss_mb());
    for i in 0..n {
        let pacing = if realtime {
            Pacing::Realtime
        } else {
            Pacing::Fast
        };
        let out = agent.answer_recording(&call, pacing, call.rate, &mut Quiet)?;
        println!("call {i}: {} turns, {:.0} MB", out.turns.len(), rss_mb());
    }
    Ok(())
}
