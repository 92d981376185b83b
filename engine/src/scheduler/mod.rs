//! make-room inside mistral.rs: the engine's scheduler hook (patch 2 of the series) runs
//! [`make_room::Scheduler`] over the engine's real sequences.
//!
//! The policy plans a step; the step becomes *passes*, the forward passes the engine can
//! batch (on the CPU path prompt chunks in one pass must start at the same token and be
//! as long; decodes of different KV lengths share a pass only where the model takes them,
//! as patch 5 makes the GGUF llama model do, else each length is a pass of its own). The engine asks for work
//! once per loop, and gets one pass at a time, most urgent first. When a step's passes have
//! all run, the policy hears what ran and which sequences stopped, and plans the next.
//!
//! A preempted sequence keeps its own KV copy (the CPU tier: on this path every sequence
//! holds one), so when it is readmitted it continues where it stopped and recomputes
//! nothing; the budget counts only the KV of running sequences, and of retained call
//! turns. A finished call turn's KV lives on in mistral.rs's prefix cache; call retention
//! keeps budget room for it until the call's next turn (which finds it there) takes it
//! over, or until it gives way to pressure or its time runs out.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mistralrs_core::{
    DefaultSchedulerOutput, IntervalLogger, KVCacheManager, Response, Scheduler, SchedulerOutput,
    Sequence, SequenceState,
};

use crate::make_room::{self, Counters, Plan, PolicyConfig, Request};

#[allow(dead_code)] // The paged adapter's scheduler is next (issue 17); its bookkeeping is tested.
mod paged;

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
    /// Running requests per priority, most urgent first.
    pub running_by_priority: Vec<(i32, usize)>,
    /// Of those, the ones whose prompt is not yet all computed.
    pub prefilling_by_priority: Vec<(i32, usize)>,
    pub waiting_by_priority: Vec<(i32, usize)>,
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
}

pub struct MakeRoomScheduler {
    policy: make_room::Scheduler,
    waiting: Vec<Sequence>,
    running: Vec<Sequence>,
    /// What of the step being run has been handed to the engine, and its passes not yet.
    executed: Plan,
    passes: VecDeque<Pass>,
    epoch: Instant,
    schedule_ns: u64,
    handle: MakeRoomHandle,
    trace: Option<Trace>,
    /// The model decodes sequences of different lengths in one pass (patch 5).
    unequal_decodes_together: bool,
    passes_out: PassCounts,
}

/// What the passes handed out so far decoded.
#[derive(Debug, Clone, Copy, Default)]
struct PassCounts {
    decode_passes: u64,
    decoded_sequences: u64,
    unequal_decode_passes: u64,
}

/// A line per event (a request added, a step planned, a pass handed out), with the
/// milliseconds since the scheduler started: where a turn's time went, step by step.
/// Written when `SUBLET_SCHEDULER_TRACE` names a file.
struct Trace(std::io::BufWriter<std::fs::File>);

impl Trace {
    const ENV: &'static str = "SUBLET_SCHEDULER_TRACE";

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

impl MakeRoomScheduler {
    /// A scheduler with the given policy, showing itself through `handle`.
    pub fn new(config: PolicyConfig, handle: &MakeRoomHandle) -> Self {
        Self {
            policy: make_room::Scheduler::new(config),
            waiting: Vec::new(),
            running: Vec::new(),
            executed: Plan::default(),
            passes: VecDeque::new(),
            epoch: Instant::now(),
            schedule_ns: 0,
            handle: handle.clone(),
            trace: Trace::from_env(),
            unequal_decodes_together: false,
            passes_out: PassCounts::default(),
        }
    }

    /// Whether the model decodes sequences of different KV lengths in one forward pass
    /// (default: no, as stock on CPU, where each length is a pass of its own). With it,
    /// every step's decodes are one pass.
    pub fn unequal_decodes_together(mut self, together: bool) -> Self {
        self.unequal_decodes_together = together;
        self
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Writes a line to the scheduler trace, when one is being written.
    fn trace(&mut self, event: std::fmt::Arguments) {
        let at = self.now_ms();
        if let Some(trace) = &mut self.trace {
            trace.line(at, event);
        }
    }

    /// Tells the policy what the finished step did and which sequences stopped on their
    /// own (end of sequence, cancel, or a reader gone: a waiting request whose client left
    /// is never admitted), and lets go of every sequence the policy is done with: dropping
    /// a sequence closes its reply channel.
    fn finish_step(&mut self) {
        let stopped: Vec<u64> = self
            .running
            .iter()
            .chain(&self.waiting)
            .filter(|seq| seq.is_finished_paged_attn() || seq.responder().is_closed())
            .map(key)
            .collect();
        let executed = std::mem::take(&mut self.executed);
        let finished = self.policy.finish_step(&executed, self.now_ms(), &stopped);
        if !finished.is_empty() {
            self.trace(format_args!("finished {finished:?}"));
        }
        let policy = &self.policy;
        self.running
            .retain(|seq| policy.request(key(seq)).is_some());
        self.waiting
            .retain(|seq| policy.request(key(seq)).is_some());
    }

    /// New switches take effect when no request is in flight.
    fn apply_new_switches(&mut self) {
        if self.policy.is_idle() {
            if let Some(switches) = self.handle.take_switches() {
                self.policy.set_switches(switches);
            }
        }
    }

    /// Plans the next step and queues its passes.
    fn plan_step(&mut self) {
        for call in self.handle.take_first_sentences() {
            self.policy.first_sentence_out(call);
        }
        let plan = self.policy.schedule(self.now_ms());
        for id in &plan.preempted {
            if let Some(i) = self.running.iter().position(|s| key(s) == *id) {
                let seq = self.running.swap_remove(i);
                seq.set_state(SequenceState::Waiting);
                self.waiting.push(seq);
            }
        }
        for id in &plan.admitted {
            if let Some(i) = self.waiting.iter().position(|s| key(s) == *id) {
                let seq = self.waiting.swap_remove(i);
                seq.set_state(SequenceState::RunningPrompt);
                self.running.push(seq);
            }
        }
        self.passes = passes(&self.policy, &plan, self.unequal_decodes_together).into();
        let kv = self.policy.kv_used();
        self.trace(format_args!(
            "plan admitted={:?} preempted={:?} prefill={:?} decode={:?} held={:?} kv={kv}",
            plan.admitted, plan.preempted, plan.prefill, plan.decode, plan.held
        ));
        self.publish(&plan);
        // Progress is counted as passes are handed out; holds count for the whole step.
        self.executed = Plan {
            preempted: plan.preempted,
            admitted: plan.admitted,
            held: plan.held,
            ..Plan::default()
        };
    }

    fn count_decode_pass(&mut self, ids: &[u64]) {
        let lengths = ids
            .iter()
            .filter_map(|id| self.policy.request(*id))
            .map(|r| r.computed);
        let unequal = lengths.clone().min() != lengths.max();
        self.passes_out.decode_passes += 1;
        self.passes_out.decoded_sequences += ids.len() as u64;
        self.passes_out.unequal_decode_passes += u64::from(unequal);
    }

    fn publish(&self, plan: &Plan) {
        let count = |filter: &dyn Fn(&Request) -> bool| {
            let mut counts = Vec::<(i32, usize)>::new();
            for r in self.policy.requests().filter(|r| filter(r)) {
                match counts.iter_mut().find(|(p, _)| *p == r.priority) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((r.priority, 1)),
                }
            }
            counts.sort();
            counts
        };
        self.handle.publish(SchedulerState {
            make_room: true,
            switches: self.policy.config().switches.clone(),
            counters: self.policy.counters.clone(),
            schedule_ns: self.schedule_ns,
            kv_used_tokens: self.policy.kv_used() + plan.tokens(),
            kv_budget_tokens: self.policy.config().kv_budget_tokens,
            running: self.policy.running_len(),
            waiting: self.policy.waiting_len(),
            decode_passes: self.passes_out.decode_passes,
            decoded_sequences: self.passes_out.decoded_sequences,
            unequal_decode_passes: self.passes_out.unequal_decode_passes,
            running_by_priority: count(&|r| r.running),
            prefilling_by_priority: count(&|r| r.running && r.prefilling()),
            waiting_by_priority: count(&|r| !r.running),
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(seq: &Sequence) -> u64 {
    *seq.id() as u64
}

/// Splits a step into the passes the engine can batch: by priority, most urgent first;
/// within a priority decodes before prompt chunks (as stock runs them), and sequences
/// grouped by chunk start and length (prompts) and, unless the model decodes unequal
/// lengths together, by KV length (decodes). With `unequal_decodes_together` all the
/// step's decodes are one pass, at its most urgent decode's place: on a CPU a pass reads
/// every weight once, whatever it decodes.
fn passes(policy: &make_room::Scheduler, plan: &Plan, unequal_decodes_together: bool) -> Vec<Pass> {
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
        let found = keyed.iter_mut().find(|(p, _, pass)| {
            *p == r.priority
                && matches!(pass, Pass::Prefill { start: s, len: l, .. } if *s == start && *l == len)
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
    keyed.into_iter().map(|(_, _, pass)| pass).collect()
}

impl Scheduler for MakeRoomScheduler {
    fn schedule(&mut self, logger: &IntervalLogger) -> SchedulerOutput<'_> {
        if self.passes.is_empty() {
            let started = Instant::now();
            self.finish_step();
            self.plan_step();
            self.schedule_ns += started.elapsed().as_nanos() as u64;
        }
        logger.set_num_running(self.running.len());
        logger.set_num_waiting(self.waiting.len());
        let mut prompt = Vec::new();
        let mut completion = Vec::new();
        let pass = self.passes.pop_front();
        if let Some(pass) = &pass {
            self.trace(format_args!("pass {pass:?}"));
        }
        match &pass {
            Some(Pass::Decode(ids)) => {
                self.executed.decode.extend(ids);
                self.count_decode_pass(ids);
            }
            Some(Pass::Prefill { ids, len, .. }) => self
                .executed
                .prefill
                .extend(ids.iter().map(|id| (*id, *len))),
            None => {}
        }
        match pass {
            Some(Pass::Decode(ids)) => {
                for seq in self.running.iter_mut() {
                    if ids.contains(&key(seq)) && seq.is_running() {
                        seq.set_state(SequenceState::RunningCompletion);
                        completion.push(seq);
                    }
                }
            }
            Some(Pass::Prefill { ids, start, len }) => {
                for seq in self.running.iter_mut() {
                    if ids.contains(&key(seq)) && seq.is_running() {
                        seq.set_prompt_chunk(start, start + len);
                        seq.set_state(SequenceState::RunningPrompt);
                        prompt.push(seq);
                    }
                }
            }
            None => {}
        }
        SchedulerOutput::DefaultScheduler {
            output: DefaultSchedulerOutput {
                completion: completion.into(),
                prompt: prompt.into(),
            },
        }
    }

    fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    fn running_len(&self) -> usize {
        self.running.len()
    }

    fn add_seq(&mut self, seq: Sequence) {
        self.apply_new_switches();
        let max_new = seq.max_new_tokens().unwrap_or(DEFAULT_MAX_NEW);
        // A prefix-cache hit arrives holding the KV of its first `token_offset` tokens,
        // with only the rest of its prompt left to compute.
        let cached = seq.prefix_cache_len();
        let prompt_len = seq.token_offset() + seq.len();
        let mut request = Request::new(
            key(&seq),
            seq.priority(),
            seq.session(),
            prompt_len,
            max_new,
        );
        request.cached = cached;
        request.cached_exact = true;
        self.trace(format_args!(
            "add id={} priority={} session={:?} prompt={prompt_len} cached={cached} max_new={max_new}",
            request.id, request.priority, request.call
        ));
        match self.policy.add(request, self.now_ms()) {
            Ok(admitted) => {
                // Dropping a withdrawn hint's sequence ends its stream.
                self.waiting
                    .retain(|s| !admitted.withdrawn_hints.contains(&key(s)));
                if admitted.replan_now {
                    self.passes.clear();
                }
                seq.set_state(SequenceState::Waiting);
                self.waiting.push(seq);
            }
            Err(refused) => {
                let _ = seq
                    .responder()
                    .try_send(Response::ValidationError(refused.to_string().into()));
            }
        }
    }

    fn free_finished_sequence_groups(&mut self) {
        // Finished sequences leave when their step ends and the policy hears of them.
    }

    fn get_finished_recurrent_indices(&self) -> Vec<usize> {
        Vec::new()
    }

    fn block_size(&self) -> Option<usize> {
        None
    }

    fn kv_cache_manager(&self) -> Option<Arc<tokio::sync::Mutex<KVCacheManager>>> {
        None
    }

    fn set_prefix_caching_enabled(&mut self, _enabled: bool) {}
}

#[cfg(test)]
mod tests;
