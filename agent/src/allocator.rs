//! The process's allocator, set for a long-lived voice agent.
//!
//! Each call runs on threads of its own (the live loop, the responder, the early
//! transcript, ONNX Runtime's sessions), and glibc gives new threads arenas of their own,
//! up to eight per core, each keeping its high-water mark after its thread ends: resident
//! memory then grows call after call (about 80 MB a call here) though nothing leaks.
//! One arena per core is as many as can be in use at once.
//!
//! Within an arena, freed chunks stay resident: glibc gives back only the free memory at
//! a heap's top. The engine's KV (its prefix cache above all) is freed and allocated again
//! in pieces of every size, so the arenas' free memory grew under a soak to ~1 GB of the
//! process's ~2.9 GB while the memory in use stayed level; a thread that asks glibc to
//! return its free pages (`malloc_trim`) every few seconds keeps it from accumulating.

use std::time::Duration;

/// How often [`for_long_running_process`]'s trimmer returns the arenas' free pages.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// What a process that answers calls for hours sets first in `main`, before any thread
/// starts: [`one_arena_per_core`], and a thread that returns the arenas' free pages to the
/// system every [`TRIM_EVERY`] ([`return_free_memory_every`]).
pub fn for_long_running_process() {
    one_arena_per_core();
    return_free_memory_every(TRIM_EVERY);
}

/// The longest [`return_free_memory_every`]'s trims took, µs: while one runs, a thread
/// that allocates in the arena being trimmed waits.
static LONGEST_TRIM_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the trimmer trims; a benchmark turns it off to measure what it costs.
static TRIMMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns [`return_free_memory_every`]'s trims on or off (on by default), so that a
/// benchmark can compare turns with and without them in one process.
pub fn set_trimming(on: bool) {
    TRIMMING.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The longest a trim has taken so far (zero before the first, or off glibc).
pub fn longest_trim() -> Duration {
    Duration::from_micros(LONGEST_TRIM_US.load(std::sync::atomic::Ordering::Relaxed))
}

/// Starts a thread that hands the arenas' free pages back to the system every `period`
/// (glibc's `malloc_trim`); elsewhere than glibc it does nothing.
pub fn return_free_memory_every(period: Duration) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let started = std::thread::Builder::new()
            .name("sublet-trim".into())
            .spawn(move || loop {
                std::thread::sleep(period);
                if !TRIMMING.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                let at = std::time::Instant::now();
                // SAFETY: malloc_trim only returns free memory; it takes each arena's lock.
                unsafe { libc::malloc_trim(0) };
                let took_us = at.elapsed().as_micros() as u64;
                LONGEST_TRIM_US.fetch_max(took_us, std::sync::atomic::Ordering::Relaxed);
                tracing::trace!(took_us, "malloc_trim");
            });
        if let Err(e) = started {
            tracing::warn!("the thread that returns free memory did not start: {e}");
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = period;
}

/// Caps glibc's malloc arenas at one per core. Call it first thing in `main`, before any
/// thread starts; elsewhere than glibc it does nothing.
pub fn one_arena_per_core() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let arenas = i32::try_from(cores).unwrap_or(i32::MAX).max(2);
        // SAFETY: mallopt only sets a parameter of the allocator; before other threads
        // allocate, nothing observes the change midway.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
        if set != 1 {
            tracing::warn!(arenas, "glibc refused the cap on malloc arenas");
        }
    }
}

pub use sublet_engine::memory::{heap_figures, HeapFigures};
