//! The evaluation harness: coding-agent sessions replayed against the engine's
//! OpenAI-compatible API while recorded calls go through the voice pipeline, with
//! make-room off and on, and the figures that compare them.
//!
//! - [`trace`]: the agent-session trace format (JSONL) and a seeded generator (pure);
//!   [`mooncake`]: the Mooncake-style trace AIPerf replays, to and from it (pure);
//! - [`stats`]: percentiles and each condition's summary, from per-turn and per-call
//!   records only (pure);
//! - [`figures`]: every figure of a report, from its rounds' records only (pure);
//! - [`report`]: the run as `summary.json` and `report.md`; [`plots`]: its SVG plots;
//! - [`schedule`]: the order of a run's rounds (pure);
//! - [`agents`]: the replayer that drives the API as coding agents do; [`aiperf`]: AIPerf
//!   driving it instead, its records read back as the round's agent calls;
//! - [`engine_speed`]: the engine's own speed (`engine-bench`), beside llama.cpp's;
//! - [`test_callers`]: the latency benchmark's scripted calls in several voices, with
//!   mid-sentence pauses; [`latency`]: its figures (pure); [`room_calls`]: its calls
//!   through a LiveKit room, LiveKit's official client as the caller;
//! - [`load`]: the agents' API under load, clients of every kind over raw TCP, and the
//!   figures their outcomes make.

pub mod agents;
pub mod aiperf;
pub mod engine_speed;
pub mod figures;
pub mod latency;
pub mod load;
pub mod mooncake;
pub mod plots;
pub mod report;
pub mod room_calls;
pub mod rounds;
pub mod schedule;
pub mod soak;
pub mod stats;
pub mod test_callers;
pub mod trace;

/// The CPU time this process has used so far (user and system, every thread), in ms:
/// how much of the machine a round's work took, beside the wall clock.
pub fn process_cpu_ms() -> u64 {
    // SAFETY: `getrusage` only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(usage.ru_utime) + ms(usage.ru_stime)
}

/// This process's resident memory in MB (Linux's `/proc/self/status`), `None` elsewhere.
pub fn resident_mb() -> Option<f64> {
    Some(sublet_engine::memory::resident_bytes()? as f64 / (1024.0 * 1024.0))
}
