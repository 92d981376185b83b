//! make-room inside mistral.rs: the engine's scheduler hook (patch 2 of the series) runs
//! [`make_room::Scheduler`] over the engine's real sequences.
//!
//! The policy plans a step; the step becomes *passes*, the forward passes the engine can
//! batch (prompt chunks in one pass start at the same token, are as long, and all sample
//! a token or none does; decodes of different KV lengths share a pass only where the
//! model takes them, as patches 5 and 35 make the GGUF llama, qwen2 and qwen3 models do
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

use std::sync::{Arc, Mutex};

use crate::make_room::{self, Counters, Plan, Request};

mod blocks;
mod cpu;
mod paged;
mod planner;

pub use cpu::MakeRoomScheduler;
pub use paged::PagedMakeRoomScheduler;

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

/// One forward pass: sequences the engine can batch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pass {
    Decode(Vec<u64>),
    Prefill {
        ids: Vec<u64>,
        start: usize,
        len: usize,
    },
    /// A prompt chunk's pass with the step's decodes in it ([`Batching::Mixed`]).
    Mixed {
        decode: Vec<u64>,
        ids: Vec<u64>,
        start: usize,
        len: usize,
    },
}

/// What the model computes in one forward pass, which decides how a step splits into
/// passes. On a CPU every pass reads every weight once, so fewer passes cost less.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Batching {
    /// Decodes of equal KV length, prompt chunks of equal start and length (stock on a
    /// CPU, where the sequences' caches are concatenated for a pass).
    #[default]
    EqualLengths,
    /// Decodes of any KV lengths together (patches 5 and 35 of the series: the GGUF llama,
    /// qwen2 and qwen3 models on the CPU; paged attention on a GPU).
    UnequalDecodes,
    /// That, and the step's decodes inside a prompt chunk's pass (patches 32 and 36: mixed
    /// passes, the GGUF llama, qwen2 and qwen3 models on the CPU), where on a CPU a decode costs a row of the
    /// chunk's products instead of a pass of its own.
    Mixed,
}

/// A line per event (a caller's request sent, a request added, a step planned, a pass
/// handed out), with the milliseconds since the scheduler started: where a turn's time
/// went, step by step. A caller's request is `sent` when it left for the engine, a line
/// written when the scheduler next takes a request, so it may follow later lines.
/// Written when `SUBLET_SCHEDULER_TRACE` names a file.
struct Trace(std::io::BufWriter<std::fs::File>);

impl Trace {
    const ENV: &'static str = "SUBLET_SCHEDULER_TRACE";

    /// Whether this process writes a trace: read once, so that callers' requests are
    /// dated for it only then.
    fn wanted() -> bool {
        static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *WANTED.get_or_init(|| std::env::var_os(Self::ENV).is_some())
    }

    fn from_env() -> Option<Self> {
        let path = std::env::var_os(Self::ENV)?;
        match std::fs::File::create(&path) {
            Ok(file) => Some(Self(std::io::BufWriter::new(file))),
            Err(e) => {
                tracing::warn!("{}: cannot write {path:?}: {e}", Self::ENV);
                None
            }
        }
    }

    fn line(&mut self, at_ms: u64, event: std::fmt::Arguments) {
        use std::io::Write;
        let _ = writeln!(self.0, "{at_ms} {event}");
        let _ = self.0.flush();
    }
}

/// The engine's side of the scheduler: its state after each step, and the switches to
/// apply when it is next idle.
#[derive(Debug, Clone, Default)]
pub struct MakeRoomHandle {
    state: Arc<Mutex<SchedulerState>>,
    switches: Arc<Mutex<Option<make_room::Switches>>>,
    /// Calls whose reply has its first sentence since the last step was planned.
    first_sentences: Arc<Mutex<Vec<u64>>>,
    /// What callers did since the last step was planned, in order.
    quiet: Arc<Mutex<Vec<Quiet>>>,
    /// A test's fault: the engine thread panics when it next plans a step.
    panic_at_next_plan: Flag,
    /// The engine's threads, raised when a caller's request arrives (CPU path).
    engine_threads: crate::cpu_priority::SharedPriority,
    /// Callers' requests sent since the scheduler last took one, with their call: for the
    /// trace, since mistral.rs takes a request only between passes.
    arrivals: Arc<Mutex<Vec<Arrival>>>,
}

/// News of a caller's quiet for the next plan: the policy's hold on agents' chunks
/// starts or ends with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quiet {
    /// The caller of this call went quiet: their turn may be coming.
    Coming(u64),
    /// The caller of this call speaks again: the turn told of is not coming yet.
    Speaking(u64),
}

/// A caller's request sent to the engine: its call, and when.
type Arrival = (Option<u64>, std::time::Instant);

/// A signal from any thread to the engine's next plan: raised, then taken once.
#[derive(Debug, Clone, Default)]
struct Flag(Arc<std::sync::atomic::AtomicBool>);

impl Flag {
    fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::SeqCst)
    }
}

impl MakeRoomHandle {
    pub fn state(&self) -> SchedulerState {
        lock(&self.state).clone()
    }

    pub fn set_switches(&self, switches: make_room::Switches) {
        *lock(&self.switches) = Some(switches);
    }

    /// The call's reply has its first sentence: its hold on agents ends at the next step.
    pub fn first_sentence_out(&self, call: u64) {
        let mut calls = lock(&self.first_sentences);
        if !calls.contains(&call) {
            calls.push(call);
        }
    }

    /// The caller of `call` went quiet: the next steps are small
    /// (`make_room::Scheduler::turn_coming`).
    pub fn turn_coming(&self, call: u64) {
        lock(&self.quiet).push(Quiet::Coming(call));
    }

    /// The caller of `call` speaks again (`make_room::Scheduler::turn_not_coming`).
    pub fn turn_not_coming(&self, call: u64) {
        lock(&self.quiet).push(Quiet::Speaking(call));
    }

    /// A caller's request (a turn or its hint) for `call`, sent at `sent`, arrived: the
    /// engine's threads go back to the process's priority now, so the pass in flight it
    /// waits for is not a lowered one.
    pub fn turn_arrived(&self, call: Option<u64>, sent: std::time::Instant) {
        self.engine_threads.raise();
        if !Trace::wanted() {
            return;
        }
        let mut arrivals = lock(&self.arrivals);
        // Bounded: without a scheduler taking requests nothing drains them.
        if arrivals.len() < 64 {
            arrivals.push((call, sent));
        }
    }

    fn take_arrivals(&self) -> Vec<Arrival> {
        if !Trace::wanted() {
            return Vec::new();
        }
        std::mem::take(&mut *lock(&self.arrivals))
    }

    fn take_quiet(&self) -> Vec<Quiet> {
        std::mem::take(&mut *lock(&self.quiet))
    }

    /// For tests of the engine's recovery: the engine thread panics when it next plans a
    /// step, as a fault in a model or the scheduler would.
    #[doc(hidden)]
    pub fn panic_at_next_plan(&self) {
        self.panic_at_next_plan.raise();
    }

    fn take_panic_at_next_plan(&self) -> bool {
        self.panic_at_next_plan.take()
    }

    fn take_first_sentences(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.first_sentences))
    }

    fn take_switches(&self) -> Option<make_room::Switches> {
        lock(&self.switches).take()
    }

    fn publish(&self, state: SchedulerState) {
        *lock(&self.state) = state;
    }
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

/// Splits a step into the passes the engine can batch: by priority, most urgent first;
/// within a priority decodes before prompt chunks (as stock runs them), and sequences
/// grouped by chunk start, length and whether it samples (prompts) and, unless the model
/// decodes unequal lengths together, by KV length (decodes). From
/// [`Batching::UnequalDecodes`] all the step's decodes are one pass, at its most urgent
/// decode's place: on a CPU a pass reads every weight once, whatever it decodes. With
/// [`Batching::Mixed`] that pass goes into the step's last prompt pass, unless that
/// prompt is more urgent than every decode (a call's prompt is never slowed by the
/// agents' decodes).
fn passes(policy: &make_room::Scheduler, plan: &Plan, batching: Batching) -> Vec<Pass> {
    let unequal_decodes_together = batching != Batching::EqualLengths;
    let request = |id: u64| policy.request(id).expect("planned request exists");
    // (priority, first id, pass)
    let mut keyed: Vec<(i32, u64, Pass)> = Vec::new();
    for &id in &plan.decode {
        let r = request(id);
        let found = keyed.iter_mut().find(|(p, _, pass)| {
            matches!(pass, Pass::Decode(ids) if unequal_decodes_together
                || (*p == r.priority && request(ids[0]).computed == r.computed))
        });
        match found {
            Some((p, _, Pass::Decode(ids))) => {
                ids.push(id);
                *p = (*p).min(r.priority);
            }
            _ => keyed.push((r.priority, id, Pass::Decode(vec![id]))),
        }
    }
    for &(id, n) in &plan.prefill {
        let r = request(id);
        let (start, len) = (r.computed, n);
        // A chunk that ends a prompt samples a token; one that does not, or one that
        // recomputes a preempted reply's KV up to its last token, samples nothing, which
        // the engine decides for a whole pass.
        let samples =
            |r: &Request, start: usize, len: usize| r.generated == 0 && start + len >= r.target();
        let found = keyed.iter_mut().find(|(p, _, pass)| {
            *p == r.priority
                && matches!(pass, Pass::Prefill { ids, start: s, len: l }
                    if *s == start && *l == len && samples(request(ids[0]), start, len) == samples(r, start, len))
        });
        match found {
            Some((_, _, Pass::Prefill { ids, .. })) => ids.push(id),
            _ => keyed.push((
                r.priority,
                id,
                Pass::Prefill {
                    ids: vec![id],
                    start,
                    len,
                },
            )),
        }
    }
    // Stable: decodes stay ahead of prompt chunks within a priority.
    keyed.sort_by_key(|(priority, _, pass)| (*priority, matches!(pass, Pass::Prefill { .. })));
    if batching == Batching::Mixed {
        mix_decodes_into_last_prompt(&mut keyed);
    }
    keyed.into_iter().map(|(_, _, pass)| pass).collect()
}

/// [`Batching::Mixed`]: the step's one decode pass joins its last (least urgent) prompt
/// pass, if that prompt is not more urgent than the decodes.
fn mix_decodes_into_last_prompt(keyed: &mut Vec<(i32, u64, Pass)>) {
    let decode = keyed
        .iter()
        .position(|(_, _, pass)| matches!(pass, Pass::Decode(_)));
    let prompt = keyed
        .iter()
        .rposition(|(_, _, pass)| matches!(pass, Pass::Prefill { .. }));
    let (Some(d), Some(p)) = (decode, prompt) else {
        return;
    };
    if keyed[p].0 < keyed[d].0 {
        return;
    }
    let (_, _, Pass::Decode(decode)) = keyed.remove(d) else {
        unreachable!("found as a decode pass")
    };
    let p = if d < p { p - 1 } else { p };
    let entry = &mut keyed[p].2;
    if let Pass::Prefill { ids, start, len } = entry {
        *entry = Pass::Mixed {
            decode,
            ids: std::mem::take(ids),
            start: *start,
            len: *len,
        };
    }
}

#[cfg(test)]
mod tests;
