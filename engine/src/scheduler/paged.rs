//! The adapter on mistral.rs's paged path (a GPU's): make-room's plan carried out over the
//! pool of KV blocks (`blocks.rs`), in the passes mistral.rs's paged step takes (all
//! prompt chunks or all decodes; decodes of any lengths together).
//!
//! - **Budget**: at most the pool less one block of rounding for each sequence that may
//!   run ([`budget_for_pool`]; the policy counts a retained turn in whole blocks,
//!   `kv_block_tokens`), so a plan within it fits. Blocks grown for passes a new plan
//!   dropped are trimmed back before the next plan. Before each plan every waiting request is priced at what the
//!   prefix cache holds of it then, a retained turn of its call included.
//! - **Admission** takes the blocks the prefix cache holds for the sequence's tokens,
//!   before any block of the step is allocated, so it finds what it was priced at. (One
//!   that found fewer would tell the policy and sit the step out: a guard, not a path
//!   the tests reach.)
//! - **Growth**: before a step's passes run, each planned sequence's blocks grow to hold
//!   what the step computes (a held sequence grows nothing).
//! - **Preemption** is recompute, as the engine's own: the full blocks the sequence
//!   computed are published to the prefix cache and freed. Readmitted, it recomputes what
//!   the cache lost, up to its last token, and decodes on.
//! - **Prompt chunks** run as prefix-cache hits of the tokens before them (patch 14); a
//!   chunk that ends before its prompt samples nothing.
//! - **Call retention**: a finished turn the policy retains keeps its blocks, published,
//!   until the policy lets it go (its call's next turn took it over, its time ran out, or
//!   room was needed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mistralrs_core::{
    CacheConfig, IntervalLogger, KVCacheManager, PagedAttentionSchedulerOutput, Response,
    Scheduler, SchedulerOutput, Sequence, SequenceState,
};

use super::blocks::{budget_for_pool, PagedKv, SeqId};
use super::planner::Planner;
use super::{lock, request_of, stopped, Batching, MakeRoomHandle, Pass, ENGINE_FAULT};
use crate::make_room::{Plan, PolicyConfig, Refused};

/// What the adapter needs of a sequence: the engine's, behind its lock, or a test's.
pub(crate) trait PagedSeq {
    fn id(&self) -> SeqId;
    /// Every token: its prompt and what it generated.
    fn tokens(&self) -> Vec<u32>;
    /// How many tokens it holds (without copying them).
    fn len(&self) -> usize;
    /// Finished on its own (end of sequence, a limit, an error) or its reader is gone.
    fn stopped(&self) -> bool;
    /// Its last pass failed: the KV that pass was to write is not to be trusted.
    fn failed(&self) -> bool;
    /// Whether it is a call's (it names a session): its blocks hash apart from the API's.
    fn is_call(&self) -> bool;
    /// Waiting for (re)admission, holding no blocks.
    fn set_waiting(&self);
    /// The next pass computes prompt tokens `start..end` over the KV of `..start`.
    fn set_prompt_chunk(&self, start: usize, end: usize);
    /// The next pass decodes its next token.
    fn set_decoding(&self);
}

/// One pass for the engine.
pub(crate) enum PagedPass<S> {
    /// Prompt chunks, each over `cached` tokens its blocks already hold.
    Prompt {
        seqs: Vec<S>,
        cached: usize,
    },
    Decode(Vec<S>),
}

/// make-room over the block pool, for any [`PagedSeq`].
pub(crate) struct PagedSteps<S> {
    planner: Planner,
    kv: PagedKv,
    waiting: Vec<S>,
    running: Vec<S>,
    /// Tokens whose KV each running sequence's blocks hold (computed or reloaded).
    written: HashMap<SeqId, usize>,
    /// Work dropped because the pool could not hold it (the budget's rounding should
    /// make this never happen; counted so tests can say so).
    short_grows: u64,
}

fn key(id: SeqId) -> u64 {
    id as u64
}

impl<S: PagedSeq> PagedSteps<S> {
    /// make-room over the pool `manager` keeps, with the smaller of the policy's KV budget
    /// and the pool's.
    pub fn new(
        config: PolicyConfig,
        handle: &MakeRoomHandle,
        manager: Arc<tokio::sync::Mutex<KVCacheManager>>,
    ) -> Self {
        let kv = PagedKv::new(manager);
        // Retained turns are counted in whole blocks by the policy itself.
        let pool = budget_for_pool(kv.capacity_tokens(), kv.block_size(), config.max_running);
        let config = PolicyConfig {
            kv_budget_tokens: config.kv_budget_tokens.min(pool),
            kv_block_tokens: kv.block_size(),
            ..config
        };
        let mut planner = Planner::new(config, handle);
        planner.set_batching(Batching::UnequalDecodes);
        Self {
            planner,
            kv,
            waiting: Vec::new(),
            running: Vec::new(),
            written: HashMap::new(),
            short_grows: 0,
        }
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    #[cfg(test)]
    pub fn short_grows(&self) -> u64 {
        self.short_grows
    }

    #[cfg(test)]
    pub fn kv(&self) -> &PagedKv {
        &self.kv
    }

    #[cfg(test)]
    pub fn is_idle(&self) -> bool {
        self.planner.policy().is_idle()
    }

    /// Takes an arriving sequence, or refuses one the pool can never hold.
    pub fn add(
        &mut self,
        seq: S,
        priority: i32,
        session: Option<u64>,
        max_new: Option<usize>,
    ) -> Result<(), Refused> {
        let tokens = seq.tokens();
        let mut request = request_of(key(seq.id()), priority, session, tokens.len(), max_new);
        request.cached = self.kv.cached_tokens(&tokens, session.is_some());
        request.cached_exact = true;
        let withdrawn_hints = self.planner.add(request)?;
        // Dropping a withdrawn hint's sequence ends its stream.
        self.waiting
            .retain(|s| !withdrawn_hints.contains(&key(s.id())));
        seq.set_waiting();
        self.waiting.push(seq);
        Ok(())
    }

    /// The next pass to run, planning a step when the last one's passes have all run.
    pub fn next_pass(&mut self) -> Option<PagedPass<S>>
    where
        S: Clone,
    {
        if !self.planner.step_in_flight() {
            let started = Instant::now();
            self.finish_step();
            self.plan_step();
            self.planner.spent_since(started);
        }
        let pass = self.planner.next_pass()?;
        let mut chosen = Vec::new();
        match pass {
            Pass::Decode(ids) => {
                for seq in self.running.iter().filter(|s| ids.contains(&key(s.id()))) {
                    // One that ended in an earlier pass of the step runs no more.
                    if !seq.stopped() {
                        seq.set_decoding();
                        // It computes its last token's KV and samples the next.
                        self.written.insert(seq.id(), seq.len());
                        chosen.push(seq.clone());
                    }
                }
                Some(PagedPass::Decode(chosen))
            }
            Pass::Prefill { ids, start, len } => {
                for seq in self.running.iter().filter(|s| ids.contains(&key(s.id()))) {
                    if !seq.stopped() {
                        seq.set_prompt_chunk(start, start + len);
                        self.written.insert(seq.id(), start + len);
                        chosen.push(seq.clone());
                    }
                }
                Some(PagedPass::Prompt {
                    seqs: chosen,
                    cached: start,
                })
            }
            Pass::Mixed { .. } => unreachable!("the paged path's batching has no mixed passes"),
        }
    }

    /// After the engine thread panicked: lets go of every sequence (returned, for their
    /// clients to hear of it), frees every block they and retained turns hold, and forgets
    /// every request.
    pub fn reset(&mut self) -> Vec<S> {
        let held: Vec<S> = self
            .waiting
            .drain(..)
            .chain(self.running.drain(..))
            .collect();
        for seq in &held {
            self.kv.release(seq.id(), &[]);
        }
        let calls: Vec<u64> = self.kv.retained().map(|(call, _)| call).collect();
        for call in calls {
            self.kv.drop_retained(call);
        }
        self.written.clear();
        self.planner.reset();
        held
    }

    /// Tells the policy what the step ran and which sequences stopped, and lets go of the
    /// sequences it is done with: their blocks freed, or kept for their call's next turn.
    fn finish_step(&mut self) {
        let stopped: Vec<u64> = self
            .running
            .iter()
            .chain(&self.waiting)
            .filter(|s| s.stopped())
            .map(|s| key(s.id()))
            .collect();
        self.planner.finish_step(&stopped);
        let (done, running): (Vec<S>, Vec<S>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| !self.planner.knows(key(s.id())));
        self.running = running;
        let retained: Vec<(u64, u64)> = self.planner.policy().retained_turns().collect();
        for seq in done {
            let id = seq.id();
            // A failed pass publishes nothing: what it wrote is unknown.
            let written = match seq.failed() {
                true => 0,
                false => self.written.remove(&id).unwrap_or(0),
            };
            self.written.remove(&id);
            let tokens = seq.tokens();
            let tokens = &tokens[..written.min(tokens.len())];
            match retained.iter().find(|(_, request)| *request == key(id)) {
                Some((call, _)) => self.kv.retain(*call, id, tokens),
                None => self.kv.release(id, tokens),
            }
        }
        // A waiting sequence holds no blocks.
        let planner = &self.planner;
        self.waiting.retain(|s| planner.knows(key(s.id())));
        self.let_go_of_retained();
    }

    /// Frees the retained turns the policy no longer keeps.
    fn let_go_of_retained(&mut self) {
        let kept: Vec<(u64, u64)> = self.planner.policy().retained_turns().collect();
        let gone: Vec<u64> = self
            .kv
            .retained()
            .filter(|(call, id)| !kept.contains(&(*call, key(*id))))
            .map(|(call, _)| call)
            .collect();
        for call in gone {
            self.kv.drop_retained(call);
        }
    }

    /// Plans the next step: preempts, admits and grows blocks as it says, drops the work
    /// the pool cannot do, and queues the rest's passes.
    fn plan_step(&mut self) {
        // Room grown for passes a new plan dropped (a more urgent arrival) goes back.
        for seq in &self.running {
            let written = self.written.get(&seq.id()).copied().unwrap_or(0);
            self.kv.trim(seq.id(), written);
        }
        for seq in &self.waiting {
            let cached = self.kv.cached_tokens(&seq.tokens(), seq.is_call());
            self.planner.set_cached(key(seq.id()), cached);
        }
        let mut plan = self.planner.plan();
        for id in &plan.preempted {
            let Some(i) = self.running.iter().position(|s| key(s.id()) == *id) else {
                continue;
            };
            let seq = self.running.swap_remove(i);
            let written = self.written.remove(&seq.id()).unwrap_or(0);
            let tokens = seq.tokens();
            self.kv
                .release(seq.id(), &tokens[..written.min(tokens.len())]);
            seq.set_waiting();
            self.waiting.push(seq);
        }
        let mut sitting_out = Vec::new();
        for id in &plan.admitted {
            let Some(i) = self.waiting.iter().position(|s| key(s.id()) == *id) else {
                continue;
            };
            let seq = self.waiting.swap_remove(i);
            let call = seq.is_call();
            let reloaded = self.kv.admit(seq.id(), &seq.tokens(), call).unwrap_or(0);
            let planned = self.planner.policy().request(*id).map_or(0, |r| r.computed);
            if reloaded < planned {
                self.planner.reloaded(*id, reloaded);
                sitting_out.push(*id);
            }
            self.written.insert(seq.id(), reloaded);
            self.running.push(seq);
        }
        // Turns the plan evicted or its admissions took over.
        self.let_go_of_retained();
        drop_work(&mut plan, &sitting_out);
        let mut short = Vec::new();
        let policy = self.planner.policy();
        let grows = plan
            .decode
            .iter()
            .map(|id| (*id, 1))
            .chain(plan.prefill.iter().copied());
        for (id, n) in grows {
            let target = policy.request(id).map_or(0, |r| r.computed) + n;
            if !self.kv.grow(id as SeqId, target) {
                tracing::warn!(
                    "make-room: no KV blocks for request {id} to hold {target} tokens ({} free)",
                    self.kv.free_blocks()
                );
                short.push(id);
            }
        }
        self.short_grows += short.len() as u64;
        drop_work(&mut plan, &short);
        self.planner.queue(plan);
    }
}

/// Takes `ids` out of the step's work (they stay admitted and running).
fn drop_work(plan: &mut Plan, ids: &[u64]) {
    plan.prefill.retain(|(id, _)| !ids.contains(id));
    plan.decode.retain(|id| !ids.contains(id));
}

/// An engine sequence, shared with the engine's paged step.
#[derive(Clone)]
struct EngineSeq(Arc<Mutex<Sequence>>);

impl PagedSeq for EngineSeq {
    fn id(&self) -> SeqId {
        *lock(&self.0).id()
    }

    fn tokens(&self) -> Vec<u32> {
        lock(&self.0).get_toks().to_vec()
    }

    fn len(&self) -> usize {
        lock(&self.0).get_toks().len()
    }

    fn stopped(&self) -> bool {
        stopped(&lock(&self.0))
    }

    fn failed(&self) -> bool {
        matches!(lock(&self.0).getstate(), SequenceState::Error)
    }

    fn is_call(&self) -> bool {
        lock(&self.0).session().is_some()
    }

    fn set_waiting(&self) {
        let mut seq = lock(&self.0);
        seq.set_state(SequenceState::Waiting);
        seq.set_prefix_cache_len(0);
    }

    fn set_prompt_chunk(&self, start: usize, end: usize) {
        let mut seq = lock(&self.0);
        seq.set_paged_prompt_chunk(start, end);
        seq.set_state(SequenceState::RunningPrompt);
    }

    fn set_decoding(&self) {
        lock(&self.0).set_state(SequenceState::RunningCompletion);
    }
}

/// make-room as mistral.rs's scheduler on the paged path.
pub struct PagedMakeRoomScheduler {
    steps: PagedSteps<EngineSeq>,
    manager: Arc<tokio::sync::Mutex<KVCacheManager>>,
    block_size: usize,
}

impl PagedMakeRoomScheduler {
    /// make-room over a block pool of the pipeline's `cache` (its blocks and their size);
    /// the policy's KV budget is at most the pool's.
    pub fn new(config: PolicyConfig, handle: &MakeRoomHandle, cache: &CacheConfig) -> Self {
        let manager = Arc::new(tokio::sync::Mutex::new(KVCacheManager::new(
            cache.num_gpu_blocks,
            cache.block_size,
            true,
            vec![0],
        )));
        Self {
            steps: PagedSteps::new(config, handle, manager.clone()),
            manager,
            block_size: cache.block_size,
        }
    }
}

impl Scheduler for PagedMakeRoomScheduler {
    fn schedule(&mut self, logger: &IntervalLogger) -> SchedulerOutput<'_> {
        // Everything the engine's loop allocates is the engine's (see sublet-heap).
        sublet_heap::set_thread_owner(sublet_heap::Owner::Engine);
        let pass = self.steps.next_pass();
        logger.set_num_running(self.steps.running_len());
        logger.set_num_waiting(self.steps.waiting_len());
        let (scheduled, num_cached_tokens) = match pass {
            Some(PagedPass::Prompt { seqs, cached }) => {
                let cached = vec![cached; seqs.len()];
                (seqs, cached)
            }
            Some(PagedPass::Decode(seqs)) => (seqs, Vec::new()),
            None => (Vec::new(), Vec::new()),
        };
        SchedulerOutput::PagedAttention {
            output: PagedAttentionSchedulerOutput {
                scheduled: scheduled.into_iter().map(|s| s.0).collect(),
                num_cached_tokens,
            },
        }
    }

    fn waiting_len(&self) -> usize {
        self.steps.waiting_len()
    }

    fn running_len(&self) -> usize {
        self.steps.running_len()
    }

    fn add_seq(&mut self, seq: Sequence) {
        let (priority, session, max_new) = (seq.priority(), seq.session(), seq.max_new_tokens());
        let responder = seq.responder();
        let seq = EngineSeq(Arc::new(Mutex::new(seq)));
        if let Err(refused) = self.steps.add(seq, priority, session, max_new) {
            let _ = responder.try_send(Response::ValidationError(refused.to_string().into()));
        }
    }

    fn free_finished_sequence_groups(&mut self) {
        // Finished sequences leave when their step ends and the policy hears of them.
    }

    fn get_finished_recurrent_indices(&self) -> Vec<usize> {
        Vec::new()
    }

    fn block_size(&self) -> Option<usize> {
        Some(self.block_size)
    }

    fn kv_cache_manager(&self) -> Option<Arc<tokio::sync::Mutex<KVCacheManager>>> {
        Some(self.manager.clone())
    }

    /// The prefix cache stays on: preemption and call retention rely on it.
    fn set_prefix_caching_enabled(&mut self, _enabled: bool) {}

    /// Answers every held request with the fault and frees its blocks: the engine is
    /// rebuilt with this scheduler for the next request.
    fn engine_panicked(&mut self) {
        let held = self.steps.reset();
        tracing::warn!(
            "make-room: the engine thread panicked; failing the {} requests it held",
            held.len()
        );
        for seq in held {
            let _ = lock(&seq.0)
                .responder()
                .try_send(Response::InternalError(ENGINE_FAULT.into()));
        }
    }
}

#[cfg(test)]
mod tests;
