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
//!   mid-sentence pauses; [`conditions`]: the same calls heard over a phone line, in noise,
//!   or with other voices behind the caller (pure); [`latency`]: its figures (pure); [`room_calls`]: its calls
//!   through a LiveKit room, LiveKit's official client as the caller;
//! - [`load`]: the agents' API under load, clients of every kind over raw TCP, and the
//!   figures their outcomes make.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub mod agents;
pub mod aiperf;
pub mod conditions;
pub mod engine_speed;
pub mod figures;
pub mod latency;
pub mod load;
pub mod mooncake;
pub mod plots;
pub mod quality;
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

/// CPU time the host has taken from this machine's cores so far (Linux's steal time, all
/// cores), in ms; `None` where `/proc/stat` does not say. On a shared virtual machine a
/// neighbour's burst slows every stage at once: a round it falls on is not comparable.
pub fn host_steal_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = steal_ticks(stat.lines().next()?)?;
    (ticks_per_s > 0).then(|| ticks * 1000 / ticks_per_s as u64)
}

/// The steal field of `/proc/stat`'s summary line (`cpu user nice system idle iowait irq
/// softirq steal …`, in clock ticks).
fn steal_ticks(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    (fields.next()? == "cpu").then_some(())?;
    fields.nth(7)?.parse().ok()
}

/// This process's resident memory in MB (Linux's `/proc/self/status`), `None` elsewhere.
/// Calls `sample` now and every `every` after until `stop` is raised, which is checked at
/// least every 200 ms so that a long period does not hold a run's end back: the one
/// sampling loop of the commands that watch the process while it works (`soak`, `memory`).
pub fn sample_until(stop: &AtomicBool, every: Duration, mut sample: impl FnMut()) {
    while !stop.load(Ordering::Relaxed) {
        sample();
        let until = Instant::now() + every;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(every.min(Duration::from_millis(200)));
        }
    }
}

pub fn resident_mb() -> Option<f64> {
    Some(sublet_engine::memory::resident_bytes()? as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_runs_until_stopped_and_no_longer() {
        let stop = AtomicBool::new(false);
        let mut samples = 0;
        sample_until(&stop, Duration::from_millis(1), || {
            samples += 1;
            if samples == 3 {
                stop.store(true, Ordering::Relaxed);
            }
        });
        assert_eq!(samples, 3);
        // Stopped before it starts, it takes no sample.
        sample_until(&stop, Duration::from_secs(3600), || samples += 1);
        assert_eq!(samples, 3);
    }

    #[test]
    fn steal_is_the_eighth_figure_of_the_summary_line() {
        let line = "cpu  6761321 931826 411260 4270252 14395 0 34817 103257 0 0";
        assert_eq!(super::steal_ticks(line), Some(103257));
        assert_eq!(super::steal_ticks("cpu0 1 2 3 4 5 6 7 8 9 10"), None);
        assert_eq!(super::steal_ticks("cpu  1 2 3"), None);
    }
}
