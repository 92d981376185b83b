//! The adapter on mistral.rs's non-paged path (the CPU's): every sequence holds a KV copy
//! of its own.
//!
//! A preempted sequence keeps that copy (the CPU tier), so when it is readmitted it
//! continues where it stopped and recomputes nothing; the budget counts only the KV of
//! running sequences, and of retained call turns. A finished call turn's KV lives on in
//! mistral.rs's prefix cache; call retention keeps budget room for it until the call's
//! next turn (which finds it there) takes it over, or until it gives way to pressure or
//! its time runs out. The prefix cache itself keeps at most the budget's tokens of KV
//! besides the call turns make-room keeps room for, and with call retention it lets the
//! agents' entries go before a call's.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mistralrs_core::{
    BudgetedCaches, DefaultSchedulerOutput, IntervalLogger, KVCacheManager, Response, Scheduler,
    SchedulerOutput, Sequence, SequenceState,
};

use super::planner::Planner;
use super::{request_of, stopped, Batching, MakeRoomHandle, Pass, ENGINE_FAULT};
use crate::cpu_priority::ThreadPriority;
use crate::make_room::PolicyConfig;

pub struct MakeRoomScheduler {
    planner: Planner,
    /// The engine's threads' priority, lowered in steps that serve no caller (and raised
    /// by a caller's request through the handle).
    threads: ThreadPriority,
    waiting: Vec<Sequence>,
    running: Vec<Sequence>,
    /// Streamed replies whose reader left mid-reply, kept one more step (see
    /// [`MakeRoomScheduler::finish_step`]).
    reader_left: HashSet<u64>,
}

impl MakeRoomScheduler {
    /// A scheduler with the given policy, showing itself through `handle`.
    pub fn new(config: PolicyConfig, handle: &MakeRoomHandle) -> Self {
        Self {
            planner: Planner::new(config, handle),
            threads: ThreadPriority::new(0, handle.engine_threads.clone()),
            waiting: Vec::new(),
            running: Vec::new(),
            reader_left: HashSet::new(),
        }
    }

    /// What the model computes in one forward pass (default: decodes of equal KV length,
    /// as stock on CPU, where each length is a pass of its own); see [`Batching`].
    pub fn batching(mut self, batching: Batching) -> Self {
        self.planner.set_batching(batching);
        self
    }

    /// The nice value of the engine's threads in steps that compute for no voice turn
    /// (default 0: never lowered; see `cpu_priority.rs`).
    pub fn compute_nice(mut self, nice: i32) -> Self {
        self.threads.set_lowered(nice);
        self
    }

    /// Tells the policy what the finished step did and which sequences stopped on their
    /// own (end of sequence, cancel, a failed pass, or a reader gone: a waiting request whose client left
    /// is never admitted), and lets go of every sequence the policy is done with: dropping
    /// a sequence closes its reply channel.
    ///
    /// A streamed reply whose reader left while it decodes gets one more step: its next
    /// token finds no one listening, and mistral.rs then keeps its KV in the prefix cache
    /// (the patch series has it so), where the conversation's next request finds it. A
    /// voice agent stops reading once it has the sentences it speaks; let go here, that
    /// call's next turn computed its whole history again.
    fn finish_step(&mut self) {
        let reader_left = &mut self.reader_left;
        let stopped: Vec<u64> = self
            .running
            .iter()
            .chain(&self.waiting)
            .filter(|seq| stopped(seq) && !(decoding_unread(seq) && reader_left.insert(key(seq))))
            .map(key)
            .collect();
        self.planner.finish_step(&stopped);
        let planner = &self.planner;
        self.running.retain(|seq| planner.knows(key(seq)));
        self.waiting.retain(|seq| planner.knows(key(seq)));
        self.reader_left.retain(|&id| planner.knows(id));
        let kv = self
            .running
            .iter()
            .chain(&self.waiting)
            .fold((0, 0), |sum, seq| {
                let (allocated, used) = seq.kv_cache_bytes();
                (sum.0 + allocated, sum.1 + used)
            });
        self.planner.set_sequences_kv(kv);
    }

    /// Plans the next step and queues its passes.
    fn plan_step(&mut self) {
        let plan = self.planner.plan();
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
        self.threads
            .for_step(self.planner.policy().step_may_yield());
        self.planner.queue(plan);
    }
}

/// A streamed reply past its prompt, running, whose reader left, and not yet stopped.
fn decoding_unread(seq: &Sequence) -> bool {
    matches!(seq.getstate(), SequenceState::RunningCompletion)
        && seq.responder().is_closed()
        && seq.get_mut_group().is_streaming
}

fn key(seq: &Sequence) -> u64 {
    *seq.id() as u64
}

impl Scheduler for MakeRoomScheduler {
    fn schedule(&mut self, logger: &IntervalLogger) -> SchedulerOutput<'_> {
        // Everything the engine's loop allocates is the engine's (see sublet-heap).
        sublet_heap::set_thread_owner(sublet_heap::Owner::Engine);
        if !self.planner.step_in_flight() {
            let started = Instant::now();
            self.finish_step();
            self.plan_step();
            self.planner.spent_since(started);
        }
        logger.set_num_running(self.running.len());
        logger.set_num_waiting(self.waiting.len());
        let mut prompt = Vec::new();
        let mut completion = Vec::new();
        match self.planner.next_pass() {
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
            // Both lists at once: the engine runs them as one pass (`runs_mixed_passes`).
            Some(Pass::Mixed {
                decode,
                ids,
                start,
                len,
            }) => {
                for seq in self.running.iter_mut() {
                    if !seq.is_running() {
                        continue;
                    }
                    if ids.contains(&key(seq)) {
                        seq.set_prompt_chunk(start, start + len);
                        seq.set_state(SequenceState::RunningPrompt);
                        prompt.push(seq);
                    } else if decode.contains(&key(seq)) {
                        seq.set_state(SequenceState::RunningCompletion);
                        completion.push(seq);
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

    fn runs_mixed_passes(&self) -> bool {
        self.planner.batching() == Batching::Mixed
    }

    fn running_len(&self) -> usize {
        self.running.len()
    }

    fn add_seq(&mut self, seq: Sequence) {
        // A prefix-cache hit arrives holding the KV of its first `token_offset` tokens,
        // with only the rest of its prompt left to compute.
        let mut request = request_of(
            key(&seq),
            seq.priority(),
            seq.session(),
            seq.token_offset() + seq.len(),
            seq.max_new_tokens(),
        );
        request.cached = seq.prefix_cache_len();
        request.cached_exact = true;
        match self.planner.add(request) {
            Ok(withdrawn_hints) => {
                // Dropping a withdrawn hint's sequence ends its stream.
                self.waiting.retain(|s| !withdrawn_hints.contains(&key(s)));
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

    /// The prefix cache keeps at most as many tokens as the running sequences may hold (its
    /// KV is the finished sequences', outside the budget): without this bound it kept the
    /// last 16 sequences whatever their length, ~1.5 GB of agents' contexts under a soak.
    fn prefix_cache_max_tokens(&self) -> Option<usize> {
        Some(self.planner.policy().config().kv_budget_tokens)
    }

    fn prefix_cache_holds(&mut self, bytes: usize) {
        self.planner.set_prefix_cache_kv(bytes);
    }

    /// With call retention, a call's last finished turn outlives the agents' contexts
    /// that finish after it in the prefix cache (agents' entries go first when it is over
    /// its bound), for as long as make-room retains it, so the call's next turn computes
    /// only what the caller just said. Oldest first otherwise, as stock.
    fn prefix_cache_by_priority(&self) -> Option<Duration> {
        let config = self.planner.policy().config();
        config
            .switches
            .call_retention
            .then(|| Duration::from_millis(config.retain_ms))
    }

    /// With call retention, the calls' turns that keep their priority in the prefix cache
    /// are left out of its token bound, up to the room make-room keeps for them: that room
    /// is in the budget already, and counted in the cache's bound as well, four callers'
    /// turns (each kept in a buffer grown to 512 tokens) took half of the agents' room
    /// there, and the agents computed their contexts again.
    fn prefix_cache_budgeted(&self) -> Option<BudgetedCaches> {
        let config = self.planner.policy().config();
        config.switches.call_retention.then_some(BudgetedCaches {
            priority: crate::VOICE_PRIORITY,
            max_tokens: config.retain_tokens,
        })
    }

    /// Answers every held request with the fault and forgets it: the engine is rebuilt
    /// with this scheduler for the next request.
    fn engine_panicked(&mut self) {
        let held: Vec<Sequence> = self
            .waiting
            .drain(..)
            .chain(self.running.drain(..))
            .collect();
        tracing::warn!(
            "make-room: the engine thread panicked; failing the {} requests it held",
            held.len()
        );
        for seq in held {
            let _ = seq
                .responder()
                .try_send(Response::InternalError(ENGINE_FAULT.into()));
        }
        self.planner.reset();
    }
}
