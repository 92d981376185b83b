//! make-room's KV accounting on the GPU's paged path: the blocks of mistral.rs's pool
//! (`KVCacheManager`, a port of vLLM v1's) that each sequence holds, admitted, grown,
//! preempted, retained and freed.
//!
//! There make-room's KV budget is the pool less one block of rounding for each sequence
//! that may hold blocks ([`budget_for_pool`]): a plan within it always fits. Preemption is
//! recompute, as the engine's own: the sequence's full blocks are published to the prefix
//! cache and freed, and when it is readmitted it recomputes only what the cache no longer
//! holds. A finished call turn is retained by not freeing its blocks: the call's next turn
//! finds them in the prefix cache (its prompt starts with the last turn's), and only then,
//! or under pressure, are they let go.
//!
//! Invariant (checked by the tests over random sequences of operations): every block a
//! sequence or a retained turn holds is freed exactly once, so once nothing is held the
//! pool's free blocks are all of its blocks again.

use std::collections::HashMap;
use std::sync::Arc;

use mistralrs_core::{
    compute_block_hashes, compute_new_block_hashes, BlockHash, ExtraHashKey, KVCacheManager,
};

/// A sequence, as mistral.rs numbers it.
pub(crate) type SeqId = usize;

/// What a call's blocks hash with, and the API's requests' do not: the prefix cache then
/// serves each kind only its own kind's prompts, so a client of the API that times its
/// requests cannot learn whether a call's prompt is cached (as mistralrs-core patch 26
/// does for the CPU's cache).
fn kind_keys(call: bool) -> Vec<ExtraHashKey> {
    if call {
        vec![ExtraHashKey::CacheSalt("sublet-call".into())]
    } else {
        Vec::new()
    }
}

/// The pool's bookkeeping for make-room.
pub(crate) struct PagedKv {
    manager: Arc<tokio::sync::Mutex<KVCacheManager>>,
    block_size: usize,
    /// The hashes of each live sequence's full blocks, extended as it grows, and whether
    /// it is a call's.
    hashes: HashMap<SeqId, (Vec<BlockHash>, bool)>,
    /// Finished turns whose blocks are still held, by call: the sequence that held them.
    retained: HashMap<u64, SeqId>,
}

impl PagedKv {
    pub fn new(manager: Arc<tokio::sync::Mutex<KVCacheManager>>) -> Self {
        let block_size = lock_pool(&manager).block_size();
        Self {
            manager,
            block_size,
            hashes: HashMap::new(),
            retained: HashMap::new(),
        }
    }

    pub(super) fn manager(&self) -> tokio::sync::MutexGuard<'_, KVCacheManager> {
        lock_pool(&self.manager)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pool's room in tokens (its null block aside).
    pub fn capacity_tokens(&self) -> usize {
        (self.manager().block_pool().num_gpu_blocks() - 1) * self.block_size
    }

    /// Blocks free or evictable (cached, held by no one).
    pub fn free_blocks(&self) -> usize {
        self.manager().num_free_blocks()
    }

    /// Tokens of `tokens` the prefix cache holds now for a call's sequence or another's
    /// (whole blocks, never the last token), taking nothing: what an admission would reload.
    pub fn cached_tokens(&self, tokens: &[u32], call: bool) -> usize {
        let hashes = compute_block_hashes(tokens, self.block_size, &[], &kind_keys(call));
        self.manager()
            .get_computed_blocks(&hashes, tokens.len())
            .num_computed_tokens
    }

    /// Looks a sequence's prompt up in the prefix cache and takes the blocks found there:
    /// the tokens already computed (whole blocks), or `None` (nothing taken) if the pool
    /// cannot hold them. The blocks for what it computes next come with [`Self::grow`],
    /// chunk by chunk, as make-room's plan gives it tokens.
    pub fn admit(&mut self, id: SeqId, tokens: &[u32], call: bool) -> Option<usize> {
        let hashes = compute_block_hashes(tokens, self.block_size, &[], &kind_keys(call));
        let mut manager = lock_pool(&self.manager);
        // Empty when prefix caching is off.
        let computed = manager.get_computed_blocks(&hashes, tokens.len());
        manager.allocate_slots(id, computed.num_computed_tokens, &computed.block_ids)?;
        drop(manager);
        self.hashes.insert(id, (hashes, call));
        Some(computed.num_computed_tokens)
    }

    /// Room for a running sequence to hold `len` tokens (its next decoded token, or the
    /// next prompt chunk): false, with nothing taken, if the pool has none.
    pub fn grow(&mut self, id: SeqId, len: usize) -> bool {
        self.manager().allocate_slots(id, len, &[]).is_some()
    }

    /// Lets go of the blocks past `tokens` that a running sequence holds: room grown for a
    /// step whose passes were dropped for a new plan.
    pub fn trim(&mut self, id: SeqId, tokens: usize) {
        self.manager().trim_request_to_num_tokens(id, tokens);
    }

    /// Publishes a sequence's full blocks to the prefix cache once `tokens` are computed
    /// (no further than the blocks it holds: the pool would index past them).
    pub fn publish(&mut self, id: SeqId, tokens: &[u32]) {
        let mut manager = lock_pool(&self.manager);
        let held = manager.num_blocks_for_request(id) * self.block_size;
        let tokens = &tokens[..tokens.len().min(held)];
        let (hashes, call) = self.hashes.entry(id).or_default();
        let keys = kind_keys(*call);
        let new = compute_new_block_hashes(tokens, self.block_size, hashes, &[], &keys);
        hashes.extend(new);
        manager.cache_blocks(id, hashes, tokens.len());
    }

    /// Lets a sequence's blocks go (preempted, finished or cancelled) after publishing its
    /// computed full blocks, so a readmission or a later request can find them.
    pub fn release(&mut self, id: SeqId, computed: &[u32]) {
        self.publish(id, computed);
        self.hashes.remove(&id);
        self.manager().free(id);
    }

    /// Keeps a finished turn's blocks for its call's next turn (published, not freed). A
    /// turn already retained for the call is let go.
    pub fn retain(&mut self, call: u64, id: SeqId, computed: &[u32]) {
        self.publish(id, computed);
        self.hashes.remove(&id);
        if let Some(previous) = self.retained.insert(call, id) {
            self.manager().free(previous);
        }
    }

    /// Lets a retained turn's blocks go (its next turn arrived, its time ran out, or the
    /// pool needs them). False if the call had none.
    pub fn drop_retained(&mut self, call: u64) -> bool {
        match self.retained.remove(&call) {
            Some(id) => {
                self.manager().free(id);
                true
            }
            None => false,
        }
    }

    /// The retained turns: (call, the sequence that held them).
    pub fn retained(&self) -> impl Iterator<Item = (u64, SeqId)> + '_ {
        self.retained.iter().map(|(call, id)| (*call, *id))
    }

    /// Blocks a sequence (or a retained turn) holds.
    #[cfg(test)]
    pub fn blocks_of(&self, id: SeqId) -> usize {
        self.manager().num_blocks_for_request(id)
    }
}

/// The pool's lock, taken from the engine's thread, which runs inside its async runtime
/// (where tokio's `blocking_lock` panics): a spin on `try_lock`, as mistral.rs's own
/// `get_mut_arcmutex!`. The engine takes this lock only on the same thread, between
/// scheduling calls, so the spin ends at once.
fn lock_pool(
    manager: &tokio::sync::Mutex<KVCacheManager>,
) -> tokio::sync::MutexGuard<'_, KVCacheManager> {
    loop {
        if let Ok(guard) = manager.try_lock() {
            return guard;
        }
        std::thread::yield_now();
    }
}

/// make-room's KV budget over a pool of `pool_tokens` in blocks of `block_size`: the pool
/// less one block of rounding for each sequence that may hold part of a block (`holders`:
/// the most running at once; the policy counts retained turns in whole blocks). A plan
/// within this budget always fits the pool: a sequence of `t` tokens holds at most
/// `t + block_size - 1` tokens' worth of blocks.
pub(crate) fn budget_for_pool(pool_tokens: usize, block_size: usize, holders: usize) -> usize {
    pool_tokens.saturating_sub(holders * (block_size - 1))
}

#[cfg(test)]
mod tests;
