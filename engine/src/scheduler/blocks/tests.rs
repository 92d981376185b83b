use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::make_room::{self, PolicyConfig};

const BLOCK: usize = 16;

fn pool(blocks: usize) -> PagedKv {
    let manager = KVCacheManager::new(blocks, BLOCK, true, vec![0]);
    PagedKv::new(Arc::new(tokio::sync::Mutex::new(manager)))
}

/// A prompt: `shared` tokens every prompt starts with, then ones of its own.
fn prompt(id: SeqId, shared: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| {
            if i < shared {
                i as u32
            } else {
                (id * 1000 + i) as u32
            }
        })
        .collect()
}

/// Free blocks and the distinct blocks live sequences and retained turns hold add up to
/// the whole pool (its null block aside): nothing leaked, nothing freed twice.
fn assert_accounted(kv: &PagedKv, holders: impl IntoIterator<Item = SeqId>) {
    let manager = kv.manager();
    let held: HashSet<usize> = holders
        .into_iter()
        .flat_map(|id| manager.get_block_ids(id).unwrap_or_default().to_vec())
        .collect();
    let total = manager.block_pool().num_gpu_blocks() - 1;
    assert_eq!(
        manager.num_free_blocks() + held.len(),
        total,
        "held {held:?}"
    );
}

#[test]
fn a_preempted_sequence_finds_its_full_blocks_when_readmitted() {
    let mut kv = pool(32);
    let tokens = prompt(1, 0, 100);
    assert_eq!(kv.admit(1, &tokens, false), Some(0));
    assert_eq!(kv.blocks_of(1), 0, "blocks come as the prompt is computed");
    assert!(kv.grow(1, 100));
    assert_eq!(kv.blocks_of(1), 7);
    kv.release(1, &tokens);
    assert_accounted(&kv, []);
    // Six full blocks of 16 are cached; the last token is always recomputed.
    assert_eq!(kv.admit(1, &tokens, false), Some(96));
    assert_eq!(kv.blocks_of(1), 6);
    kv.release(1, &tokens);
    assert_accounted(&kv, []);
}

#[test]
fn a_retained_turn_is_found_by_the_calls_next_turn_and_freed_once() {
    let mut kv = pool(32);
    let turn = prompt(1, 0, 70);
    kv.admit(1, &turn, true).unwrap();
    assert!(kv.grow(1, 70));
    kv.retain(9, 1, &turn);
    assert_accounted(&kv, [1]);
    let mut next = turn.clone();
    next.extend(500..540);
    assert_eq!(
        kv.admit(2, &next, true),
        Some(64),
        "four full blocks of the last turn"
    );
    assert!(kv.grow(2, next.len()));
    assert!(kv.drop_retained(9));
    assert!(!kv.drop_retained(9), "a retained turn is let go once");
    assert_accounted(&kv, [2]);
    kv.release(2, &next);
    assert_accounted(&kv, []);
}

#[test]
fn a_calls_blocks_serve_calls_only_and_an_api_requests_api_requests_only() {
    let mut kv = pool(32);
    let tokens = prompt(1, 0, 70);
    for (id, call) in [(1, true), (2, false)] {
        kv.admit(id, &tokens, call).unwrap();
        assert!(kv.grow(id, 70));
        kv.release(id, &tokens);
    }
    // Each kind finds its own four full blocks, never the other's.
    for call in [true, false] {
        assert_eq!(kv.cached_tokens(&tokens, call), 64, "call {call}");
    }
    // An API request with a call's prompt, after only the call ran: nothing.
    let mut kv = pool(32);
    kv.admit(1, &tokens, true).unwrap();
    assert!(kv.grow(1, 70));
    kv.release(1, &tokens);
    assert_eq!(kv.cached_tokens(&tokens, false), 0);
    assert_eq!(kv.admit(2, &tokens, false), Some(0));
    kv.release(2, &[]);
    assert_accounted(&kv, []);
}

#[test]
fn a_prompt_the_pool_cannot_hold_takes_nothing() {
    let mut kv = pool(8);
    assert_eq!(kv.capacity_tokens(), 7 * BLOCK);
    assert_eq!(kv.admit(1, &prompt(1, 0, 8 * BLOCK), false), Some(0));
    assert!(!kv.grow(1, 8 * BLOCK), "no eight blocks");
    assert_eq!(kv.blocks_of(1), 0, "a refused growth takes nothing");
    kv.release(1, &[]);
    assert_eq!(kv.free_blocks(), 7);
    assert_eq!(kv.admit(2, &prompt(2, 0, 3 * BLOCK), false), Some(0));
    assert!(kv.grow(2, 7 * BLOCK));
    assert!(!kv.grow(2, 7 * BLOCK + 1), "no eighth block");
    assert_eq!(kv.blocks_of(2), 7);
    kv.release(2, &prompt(2, 0, 7 * BLOCK));
    assert_accounted(&kv, []);
}

#[derive(Debug, Clone)]
enum Op {
    Admit {
        id: usize,
        shared: usize,
        len: usize,
    },
    Grow {
        id: usize,
        by: usize,
    },
    Preempt {
        id: usize,
    },
    Finish {
        id: usize,
        retain_for: Option<u64>,
    },
    DropRetained {
        call: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..8usize, 0..64usize, 1..120usize).prop_map(|(id, shared, len)| Op::Admit {
            id,
            shared,
            len
        }),
        (0..8usize, 1..40usize).prop_map(|(id, by)| Op::Grow { id, by }),
        (0..8usize).prop_map(|id| Op::Preempt { id }),
        (0..8usize, proptest::option::of(0..3u64))
            .prop_map(|(id, retain_for)| Op::Finish { id, retain_for }),
        (0..3u64).prop_map(|call| Op::DropRetained { call }),
    ]
}

proptest! {
    /// Any sequence of admissions, growth, preemptions, finishes, retentions and releases
    /// keeps every block accounted for, and leaves the whole pool free at the end.
    #[test]
    fn no_sequence_of_operations_leaks_a_block(ops in proptest::collection::vec(op(), 1..80)) {
        let mut kv = pool(24);
        // Live sequences and their tokens; retained turns by call.
        let mut live: BTreeMap<SeqId, Vec<u32>> = BTreeMap::new();
        let mut retained: BTreeMap<u64, SeqId> = BTreeMap::new();
        for op in ops {
            match op {
                // mistral.rs never gives two requests one id: a live or retained id is
                // not admitted again.
                Op::Admit { id, shared, len }
                    if !live.contains_key(&id) && !retained.values().any(|r| *r == id) =>
                {
                    let tokens = prompt(id, shared.min(len), len);
                    if let Some(cached) = kv.admit(id, &tokens, false) {
                        prop_assert!(cached < tokens.len());
                        if kv.grow(id, tokens.len()) {
                            live.insert(id, tokens);
                        } else {
                            kv.release(id, &tokens[..cached]);
                        }
                    }
                    prop_assert_eq!(kv.blocks_of(id) > 0, live.contains_key(&id) && !tokens_empty(&live, id));
                }
                Op::Grow { id, by } => {
                    if let Some(tokens) = live.get_mut(&id) {
                        let len = tokens.len() + by;
                        if kv.grow(id, len) {
                            tokens.extend((tokens.len()..len).map(|i| (id * 7000 + i) as u32));
                            kv.publish(id, tokens);
                        }
                    }
                }
                Op::Preempt { id } => {
                    if let Some(tokens) = live.remove(&id) {
                        kv.release(id, &tokens);
                    }
                }
                Op::Finish { id, retain_for } => {
                    if let Some(tokens) = live.remove(&id) {
                        match retain_for {
                            Some(call) => {
                                kv.retain(call, id, &tokens);
                                retained.insert(call, id);
                            }
                            None => kv.release(id, &tokens),
                        }
                    }
                }
                Op::DropRetained { call } => {
                    prop_assert_eq!(kv.drop_retained(call), retained.remove(&call).is_some());
                }
                Op::Admit { .. } => {}
            }
            let holders: Vec<SeqId> = live.keys().copied().chain(retained.values().copied()).collect();
            assert_accounted(&kv, holders);
        }
        for (id, tokens) in std::mem::take(&mut live) {
            kv.release(id, &tokens);
        }
        for call in retained.keys() {
            kv.drop_retained(*call);
        }
        assert_accounted(&kv, []);
    }
}

fn tokens_empty(live: &BTreeMap<SeqId, Vec<u32>>, id: SeqId) -> bool {
    live.get(&id).is_none_or(|t| t.is_empty())
}

/// Synthetic token `i` of request `id`: its prompt's, then its reply's. Requests of one
/// call share their prompts' first half (a call's turns repeat its conversation).
fn token(r: &make_room::Request, i: usize) -> u32 {
    let prompt_shared = r.prompt_len / 2;
    match (r.call, i) {
        (Some(call), i) if i < prompt_shared => (call * 1_000_000) as u32 + i as u32,
        _ => (r.id * 1_000_000 + 500_000) as u32 + i as u32,
    }
}

/// make-room's plans over the real block pool, for the simulator's random workloads and
/// switches: with the budget [`budget_for_pool`] gives, every block a plan needs (a
/// readmission's, a prompt chunk's, a decoded token's) is there, and the pool is accounted
/// for after every step. Finished turns are let go here (retention's blocks are the
/// adapter's to keep; `a_retained_turn_…` covers their bookkeeping).
#[test]
fn make_rooms_plans_always_fit_a_pool_of_its_budget() {
    use crate::make_room::sim::{self, Arrival};
    for seed in 0..200u64 {
        let workload = sim::random_workload(seed);
        let switches = sim::random_switches(seed);
        let max_running = workload.config.max_running;
        let blocks = (workload.config.kv_budget_tokens + max_running * (BLOCK - 1)).div_ceil(BLOCK);
        let mut kv = pool(blocks + 1);
        let budget = budget_for_pool(kv.capacity_tokens(), BLOCK, max_running);
        assert!(budget >= workload.config.kv_budget_tokens);
        let mut policy = make_room::Scheduler::new(PolicyConfig {
            switches,
            kv_budget_tokens: budget,
            ..workload.config.clone()
        });
        let mut requests: BTreeMap<u64, make_room::Request> = BTreeMap::new();
        // Tokens each running request's blocks hold.
        let mut held: BTreeMap<u64, usize> = BTreeMap::new();
        let tokens =
            |r: &make_room::Request, n: usize| (0..n).map(|i| token(r, i)).collect::<Vec<_>>();
        let (mut now, mut next, mut steps) = (0u64, 0usize, 0u64);
        loop {
            while next < workload.arrivals.len() && workload.arrivals[next].0 <= now {
                match &workload.arrivals[next].1 {
                    Arrival::Request(r) => {
                        if policy.add(r.clone(), now).is_ok() {
                            requests.insert(r.id, r.clone());
                        }
                    }
                    Arrival::Hint(priority) => policy.turn_hint(*priority, now),
                }
                next += 1;
            }
            if policy.is_idle() {
                match workload.arrivals.get(next) {
                    Some((at, _)) => {
                        now = (*at).max(now);
                        continue;
                    }
                    None => break,
                }
            }
            let plan = policy.schedule(now);
            steps += 1;
            assert!(steps < 200_000, "seed {seed}: no end");
            for id in &plan.preempted {
                let n = held.remove(id).unwrap_or_else(|| {
                    panic!("seed {seed} step {steps}: preempted {id} was not running: {plan:?}")
                });
                kv.release(*id as usize, &tokens(&requests[id], n));
            }
            for id in &plan.admitted {
                let r = &requests[id];
                let prompt = tokens(r, r.prompt_len);
                kv.admit(*id as usize, &prompt, false)
                    .expect("admission finds room for its cached blocks");
                held.insert(*id, 0);
            }
            // What the step computes on top of what each request holds (a readmitted
            // request's reloaded tokens among it).
            let mut targets: BTreeMap<u64, usize> = BTreeMap::new();
            for id in plan
                .admitted
                .iter()
                .chain(&plan.decode)
                .chain(plan.prefill.iter().map(|(id, _)| id))
            {
                targets.insert(*id, policy.request(*id).expect("planned").computed);
            }
            for (id, n) in &plan.prefill {
                *targets.get_mut(id).unwrap() += n;
            }
            for id in &plan.decode {
                *targets.get_mut(id).unwrap() += 1;
            }
            for (id, target) in &targets {
                assert!(
                    kv.grow(*id as usize, *target),
                    "seed {seed} step {steps}: no room for request {id} to hold {target} tokens ({} blocks free)",
                    kv.free_blocks()
                );
                held.insert(*id, *target);
            }
            now += sim::step_cost_ms(&plan).max(1);
            for id in policy.finish_step(&plan, now, &[]) {
                let n = held.remove(&id).unwrap_or(0);
                kv.release(id as usize, &tokens(&requests[&id], n));
            }
            assert_accounted(&kv, held.keys().map(|id| *id as usize));
        }
        assert!(held.is_empty(), "seed {seed}: {held:?} still held");
        assert_accounted(&kv, []);
    }
}
