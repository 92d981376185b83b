//! make-room inside mistral.rs: the engine's scheduler hook (patch 2 of the series) runs
//! [`make_room::Scheduler`] over the engine's real sequences.
//!
//! The policy plans a step; the step becomes *passes*, the forward passes the engine can
//! batch (prompt chunks in one pass start at the same token, are as long, and all sample
//! a token or none does; decodes of different KV lengths share a pass only where the
//! model takes them, as patches 5 and 25 make the GGUF llama, qwen2 and qwen3 models do
//! on the CPU and paged attention does on a GPU, else each length is a pass of its own). The engine asks for
//! work once per loop, and gets one pass at a time, most urgent first. When a step's
//! passes have all run, the policy hears what ran and which sequences stopped, and plans
//! the next ([`planner`], shared by both adapters).
//!
//! Two adapters carry the plan out, one per KV path of mistral.rs:
//! - [`MakeRoomScheduler`] (`cpu.rs`), the non-paged path: a KV copy per sequence, which
//!   a preempted sequence keeps;
//! - [`PagedMakeRoomScheduler`] (`paged.rs`), the paged path on a GPU: a pool of blocks
//!   (`blocks.rs`), preemption by recompute, prompt chunks as prefix-cache hits.

use std::sync::Mutex;

use crate::make_room::{self, Counters, Request};

mod blocks;
mod cpu;
mod handle;
mod paged;
mod passes;
mod planner;
mod trace;

pub use cpu::MakeRoomScheduler;
pub use handle::MakeRoomHandle;
use handle::Quiet;
pub use paged::PagedMakeRoomScheduler;
use passes::{passes, Pass};
use trace::Trace;

/// Most tokens a request that names no limit is assumed to generate, for KV accounting.
const DEFAULT_MAX_NEW: usize = 1024;

/// What the scheduler shows of itself after each planned step: for `/metrics` and for
/// probes that must check their condition held.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SchedulerState {
    /// Whether make-room's scheduler runs the engine at all (else mistral.rs's own does).
    pub make_room: bool,
    pub switches: make_room::Switches,
    pub counters: Counters,
    /// Time spent deciding, all steps together (the scheduler's own cost).
    pub schedule_ns: u64,
    pub kv_used_tokens: usize,
    pub kv_budget_tokens: usize,
    pub running: usize,
    pub waiting: usize,
    /// Decode passes handed to the engine, the sequences they decoded, and how many of
    /// them held sequences of different KV lengths (one pass where stock runs one per
    /// length).
    pub decode_passes: u64,
    pub decoded_sequences: u64,
    pub unequal_decode_passes: u64,
    /// Of the decode passes, those that ran inside a prompt chunk's pass
    /// ([`Batching::Mixed`]).
    pub mixed_passes: u64,
    /// Running requests per priority, most urgent first.
    pub running_by_priority: Vec<(i32, usize)>,
    /// Of those, the ones whose prompt is not yet all computed.
    pub prefilling_by_priority: Vec<(i32, usize)>,
    pub waiting_by_priority: Vec<(i32, usize)>,
    /// The KV the scheduler's sequences and the prefix cache hold, and the heap's peak per
    /// step (the engine adds its weights).
    pub memory: crate::memory::EngineMemory,
}

/// What the model computes in one forward pass, which decides how a step splits into
/// passes. On a CPU every pass reads every weight once, so fewer passes cost less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Batching {
    /// Decodes of equal KV length, prompt chunks of equal start and length (stock on a
    /// CPU, where the sequences' caches are concatenated for a pass).
    #[default]
    EqualLengths,
    /// Decodes of any KV lengths together (patches 5 and 25 of the series: the GGUF llama,
    /// qwen2 and qwen3 models on the CPU; paged attention on a GPU).
    UnequalDecodes,
    /// That, and the step's decodes inside a prompt chunk's pass (patches 24 and 25: mixed
    /// passes, the GGUF llama, qwen2 and qwen3 models on the CPU), where on a CPU a decode costs a row of the
    /// chunk's products instead of a pass of its own.
    Mixed,
}

/// What the requests in flight when the engine thread panicked are answered.
const ENGINE_FAULT: &str =
    "the engine stopped on an internal fault while this request was in flight; it was dropped (the engine restarts for the next request)";

/// make-room's request for a sequence arriving with these.
fn request_of(
    id: u64,
    priority: i32,
    session: Option<u64>,
    prompt_len: usize,
    max_new: Option<usize>,
) -> Request {
    Request::new(
        id,
        priority,
        session,
        prompt_len,
        max_new.unwrap_or(DEFAULT_MAX_NEW),
    )
}

/// Whether a sequence is done with, on either path: finished on its own (end of
/// sequence, a limit), its pass failed, or its reader is gone.
fn stopped(seq: &mistralrs_core::Sequence) -> bool {
    seq.is_finished_paged_attn()
        || matches!(seq.getstate(), mistralrs_core::SequenceState::Error)
        || seq.responder().is_closed()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
