//! What both adapters share: the policy, the step it planned and the passes of it not yet
//! handed out, what of it ran, the scheduler's clock, trace and published state.
//!
//! A step's life: [`Planner::finish_step`] tells the policy what the last step ran and
//! which requests stopped; [`Planner::plan`] asks for the next plan; the adapter moves its
//! sequences (and, on the paged path, their blocks) and may drop work the engine cannot
//! do; [`Planner::queue`] splits what is left into passes; [`Planner::next_pass`] hands
//! them out one per engine loop, recording what ran.

use std::collections::VecDeque;
use std::time::Instant;

use super::{passes, Batching, MakeRoomHandle, Pass, Quiet, SchedulerState, Trace};
use crate::make_room::{self, Plan, PolicyConfig, Refused, Request};

pub(super) struct Planner {
    policy: make_room::Scheduler,
    /// What of the step being run has been handed to the engine, and its passes not yet.
    executed: Plan,
    passes: VecDeque<Pass>,
    epoch: Instant,
    schedule_ns: u64,
    handle: MakeRoomHandle,
    trace: Option<Trace>,
    /// What the model computes in one pass.
    batching: Batching,
    passes_out: PassCounts,
    memory: MemorySeen,
}

/// What the scheduler sees of the engine's memory, step by step.
#[derive(Debug, Default)]
struct MemorySeen {
    /// Allocated and used bytes of the KV of the sequences the adapter holds.
    sequences_kv: (usize, usize),
    prefix_cache_kv: usize,
    step_window: crate::memory::PeakWindow,
    step_peak: Option<usize>,
}

/// What the passes handed out so far decoded.
#[derive(Debug, Clone, Copy, Default)]
struct PassCounts {
    decode_passes: u64,
    decoded_sequences: u64,
    unequal_decode_passes: u64,
    mixed_passes: u64,
}

impl Planner {
    pub fn new(config: PolicyConfig, handle: &MakeRoomHandle) -> Self {
        Self {
            policy: make_room::Scheduler::new(config),
            executed: Plan::default(),
            passes: VecDeque::new(),
            epoch: Instant::now(),
            schedule_ns: 0,
            handle: handle.clone(),
            trace: Trace::from_env(),
            batching: Batching::default(),
            passes_out: PassCounts::default(),
            memory: MemorySeen::default(),
        }
    }

    pub fn set_batching(&mut self, batching: Batching) {
        self.batching = batching;
    }

    pub fn batching(&self) -> Batching {
        self.batching
    }

    pub fn policy(&self) -> &make_room::Scheduler {
        &self.policy
    }

    /// Whether the policy still tracks request `id`.
    pub fn knows(&self, id: u64) -> bool {
        self.policy.request(id).is_some()
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Writes a line to the scheduler trace, when one is being written.
    pub fn trace(&mut self, event: std::fmt::Arguments) {
        let at = self.now_ms();
        if let Some(trace) = &mut self.trace {
            trace.line(at, event);
        }
    }

    /// Counts time spent deciding since `started` as the scheduler's own cost.
    pub fn spent_since(&mut self, started: Instant) {
        self.schedule_ns += started.elapsed().as_nanos() as u64;
    }

    /// After the engine thread panicked: forgets every request and the step in flight,
    /// keeping the settings, the switches and the counters.
    pub fn reset(&mut self) {
        let counters = self.policy.counters.clone();
        self.policy = make_room::Scheduler::new(self.policy.config().clone());
        self.policy.counters = counters;
        self.passes.clear();
        self.executed = Plan::default();
        self.trace(format_args!("reset after an engine panic"));
        self.publish(&Plan::default());
    }

    /// Whether the step planned last has passes left to hand out.
    pub fn step_in_flight(&self) -> bool {
        !self.passes.is_empty()
    }

    /// Takes an arriving request (new switches first, when nothing is in flight):
    /// returns the waiting turn hints it withdrew, whose streams the adapter must end.
    pub fn add(&mut self, request: Request) -> Result<Vec<u64>, Refused> {
        if self.policy.is_idle() {
            if let Some(switches) = self.handle.take_switches() {
                self.policy.set_switches(switches);
            }
        }
        for (call, sent) in self.handle.take_arrivals() {
            let at = sent.saturating_duration_since(self.epoch).as_millis() as u64;
            if let Some(trace) = &mut self.trace {
                trace.line(at, format_args!("sent session={call:?}"));
            }
        }
        self.trace(format_args!(
            "add id={} priority={} session={:?} prompt={} cached={} max_new={}",
            request.id,
            request.priority,
            request.call,
            request.prompt_len,
            request.cached,
            request.max_new
        ));
        let admitted = self.policy.add(request, self.now_ms())?;
        if admitted.replan_now {
            self.passes.clear();
        }
        Ok(admitted.withdrawn_hints)
    }

    /// Tells the policy what the step ran and which requests stopped on their own (the
    /// adapter then lets go of every request the policy no longer knows).
    pub fn finish_step(&mut self, stopped: &[u64]) {
        let executed = std::mem::take(&mut self.executed);
        let finished = self.policy.finish_step(&executed, self.now_ms(), stopped);
        if !finished.is_empty() {
            self.trace(format_args!("finished {finished:?}"));
        }
    }

    /// The bytes of KV (allocated, used) the adapter's sequences hold now.
    pub fn set_sequences_kv(&mut self, bytes: (usize, usize)) {
        self.memory.sequences_kv = bytes;
    }

    /// The bytes of KV mistral.rs's prefix cache keeps now.
    pub fn set_prefix_cache_kv(&mut self, bytes: usize) {
        self.memory.prefix_cache_kv = bytes;
    }

    /// The policy's plan for the next step.
    pub fn plan(&mut self) -> Plan {
        if self.handle.take_panic_at_next_plan() {
            panic!("make-room: a panic injected by a test");
        }
        // The step that just ended: how far the heap rose while it ran.
        if let Some(rise) = self.memory.step_window.close() {
            self.memory.step_peak = self.memory.step_peak.max(Some(rise));
        }
        for call in self.handle.take_first_sentences() {
            self.policy.first_sentence_out(call);
        }
        let now_ms = self.now_ms();
        for news in self.handle.take_quiet() {
            match news {
                Quiet::Coming(call) => self.policy.turn_coming(call, now_ms),
                Quiet::Speaking(call) => self.policy.turn_not_coming(call),
            }
        }
        self.policy.schedule(now_ms)
    }

    /// What the prefix cache holds now of waiting request `id`'s tokens.
    pub fn set_cached(&mut self, id: u64, tokens: usize) {
        self.policy.set_cached(id, tokens);
    }

    /// The engine reloaded only `tokens` of what the plan counted on for `id`.
    pub fn reloaded(&mut self, id: u64, tokens: usize) {
        self.policy.reloaded(id, tokens);
    }

    /// Queues the plan's passes, publishes the state and traces the plan.
    pub fn queue(&mut self, plan: Plan) {
        self.passes = passes(&self.policy, &plan, self.batching).into();
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

    /// The next pass of the step, recorded as run.
    pub fn next_pass(&mut self) -> Option<Pass> {
        let pass = self.passes.pop_front()?;
        self.trace(format_args!("pass {pass:?}"));
        match &pass {
            Pass::Decode(ids) => {
                self.executed.decode.extend(ids);
                self.count_decode_pass(ids);
            }
            Pass::Prefill { ids, len, .. } => self
                .executed
                .prefill
                .extend(ids.iter().map(|id| (*id, *len))),
            Pass::Mixed {
                decode, ids, len, ..
            } => {
                self.executed.decode.extend(decode);
                self.count_decode_pass(decode);
                self.passes_out.mixed_passes += 1;
                self.executed
                    .prefill
                    .extend(ids.iter().map(|id| (*id, *len)));
            }
        }
        Some(pass)
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
            mixed_passes: self.passes_out.mixed_passes,
            running_by_priority: count(&|r| r.running),
            prefilling_by_priority: count(&|r| r.running && r.prefilling()),
            waiting_by_priority: count(&|r| !r.running),
            memory: crate::memory::EngineMemory {
                weights_bytes: None,
                kv_allocated_bytes: self.memory.sequences_kv.0 as u64,
                kv_used_bytes: self.memory.sequences_kv.1 as u64,
                prefix_cache_bytes: self.memory.prefix_cache_kv as u64,
                step_peak_bytes: self.memory.step_peak.map(|b| b as u64),
            },
        });
    }
}
