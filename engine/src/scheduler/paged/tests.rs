//! The paged adapter driven as mistral.rs's paged step drives it, over a real block pool
//! (`KVCacheManager` builds without CUDA) and a model that only keeps books: every KV
//! slot a pass writes records the prefix it was computed from, and every pass checks that
//! the blocks it reads hold its own prefix's KV. The simulator's random workloads and
//! switches drive it, with requests that end early and clients that leave.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::*;
use crate::make_room::sim::{self, Arrival};
use crate::make_room::{Request, Switches};

const BLOCK: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Prompt,
    Decode,
    Done,
}

#[derive(Debug)]
struct Fake {
    id: SeqId,
    tokens: Vec<u32>,
    /// `prefixes[i]`: a hash of `tokens[..=i]`, what the KV at position `i` depends on.
    prefixes: Vec<u64>,
    prompt_len: usize,
    generated: usize,
    /// Ends after this many tokens (its limit, or an early end of sequence).
    ends_after: usize,
    state: State,
    chunk: Option<(usize, usize)>,
    gone: bool,
    hint: bool,
    call: bool,
}

impl Fake {
    fn push(&mut self, token: u32) {
        let previous = self
            .prefixes
            .last()
            .copied()
            .unwrap_or(0xcbf2_9ce4_8422_2325);
        self.prefixes
            .push((previous ^ u64::from(token)).wrapping_mul(0x100_0000_01b3));
        self.tokens.push(token);
    }

    /// The token the fake model samples after `tokens[..=last]`.
    fn sample(&self) -> u32 {
        900_000_000 + (self.prefixes.last().unwrap() % 1000) as u32
    }
}

#[derive(Debug, Clone)]
struct FakeSeq(Rc<RefCell<Fake>>);

impl PagedSeq for FakeSeq {
    fn id(&self) -> SeqId {
        self.0.borrow().id
    }
    fn tokens(&self) -> Vec<u32> {
        self.0.borrow().tokens.clone()
    }
    fn len(&self) -> usize {
        self.0.borrow().tokens.len()
    }
    fn stopped(&self) -> bool {
        let f = self.0.borrow();
        f.state == State::Done || f.gone
    }
    fn failed(&self) -> bool {
        false
    }
    fn is_call(&self) -> bool {
        self.0.borrow().call
    }
    fn set_waiting(&self) {
        self.0.borrow_mut().state = State::Waiting;
    }
    fn set_prompt_chunk(&self, start: usize, end: usize) {
        let mut f = self.0.borrow_mut();
        f.chunk = Some((start, end));
        f.state = State::Prompt;
    }
    fn set_decoding(&self) {
        self.0.borrow_mut().state = State::Decode;
    }
}

/// A call's turns share their conversation's tokens; agents share a 40-token system
/// prompt, then differ.
fn prompt_tokens(r: &Request) -> Vec<u32> {
    (0..r.prompt_len)
        .map(|i| match r.call {
            Some(call) => (call as u32 + 1) * 1_000_000 + i as u32,
            None if i < 40 => 7_000_000 + i as u32,
            None => 10_000_000 + (r.id % 1000) as u32 * 10_000 + i as u32,
        })
        .collect()
}

fn fake(r: &Request) -> FakeSeq {
    let mut f = Fake {
        id: r.id as SeqId,
        tokens: Vec::new(),
        prefixes: Vec::new(),
        prompt_len: r.prompt_len,
        generated: 0,
        ends_after: if r.id % 5 == 2 {
            (r.max_new / 2).max(1)
        } else {
            r.max_new
        },
        state: State::Waiting,
        chunk: None,
        gone: false,
        hint: r.max_new == 1 && r.call.is_some(),
        call: r.call.is_some(),
    };
    for token in prompt_tokens(r) {
        f.push(token);
    }
    FakeSeq(Rc::new(RefCell::new(f)))
}

/// The tokens a request ends with when nothing goes wrong.
fn expected(r: &Request, ends_after: usize) -> Vec<u32> {
    let seq = fake(r);
    let mut f = seq.0.borrow_mut();
    for _ in 0..ends_after {
        let token = f.sample();
        f.push(token);
    }
    f.tokens.clone()
}

/// The model's side: which prefix each KV slot holds.
struct Model {
    manager: Arc<tokio::sync::Mutex<KVCacheManager>>,
    slots: HashMap<usize, u64>,
}

impl Model {
    fn slot(table: &[usize], i: usize) -> usize {
        table[i / BLOCK] * BLOCK + i % BLOCK
    }

    /// Reads the KV of `..start` and writes `start..end`, as a pass's attention does.
    fn compute(&mut self, f: &Fake, start: usize, end: usize) {
        let manager = self
            .manager
            .try_lock()
            .expect("no one holds the pool between passes");
        let table = manager.get_block_ids(f.id).unwrap_or_default();
        assert!(
            table.len() * BLOCK >= end,
            "sequence {} computes {end} tokens in {} blocks",
            f.id,
            table.len()
        );
        for i in 0..start {
            assert_eq!(
                self.slots.get(&Self::slot(table, i)),
                Some(&f.prefixes[i]),
                "sequence {} reads KV at {i} that is not its prefix's",
                f.id
            );
        }
        for i in start..end {
            self.slots.insert(Self::slot(table, i), f.prefixes[i]);
        }
    }

    fn run(&mut self, pass: PagedPass<FakeSeq>) {
        match pass {
            PagedPass::Prompt { seqs, cached } => {
                // As patch 14's engine: a pass whose chunks all end before their prompts
                // samples nothing; any other samples every sequence.
                let partial = seqs.iter().all(|seq| {
                    let f = seq.0.borrow();
                    f.chunk.is_some_and(|(_, end)| end < f.tokens.len())
                });
                for seq in seqs {
                    let mut f = seq.0.borrow_mut();
                    let (start, end) = f.chunk.take().expect("a chunk was set");
                    assert_eq!((f.state, start), (State::Prompt, cached));
                    assert!(end > start && end <= f.tokens.len());
                    self.compute(&f, start, end);
                    if !partial {
                        self.sample(&mut f);
                    }
                }
            }
            PagedPass::Decode(seqs) => {
                for seq in seqs {
                    let mut f = seq.0.borrow_mut();
                    assert_eq!(f.state, State::Decode);
                    let last = f.tokens.len() - 1;
                    assert!(f.generated > 0 || last >= f.prompt_len, "decodes a prompt");
                    self.compute(&f, last, last + 1);
                    self.sample(&mut f);
                }
            }
        }
    }

    fn sample(&mut self, f: &mut Fake) {
        let token = f.sample();
        f.push(token);
        f.generated += 1;
        if f.generated >= f.ends_after {
            f.state = State::Done;
        }
    }
}

/// The simulator's workloads through the adapter and the bookkeeping model: every
/// request ends with the tokens it would have alone (a partial chunk samples nothing, a
/// readmission resamples nothing), every pass reads only KV of its own prefix, no planned
/// work finds the pool short, and afterwards only retained turns hold blocks.
#[test]
fn workloads_run_over_the_pool_as_if_each_request_ran_alone() {
    let mut fired = (0u64, 0u64, 0u64);
    for seed in 0..150u64 {
        let workload = sim::random_workload(seed);
        let config = PolicyConfig {
            switches: sim::random_switches(seed),
            ..workload.config.clone()
        };
        let max_running = config.max_running;
        let blocks = (config.kv_budget_tokens + 2 * max_running * (BLOCK - 1)).div_ceil(BLOCK) + 1;
        let manager = Arc::new(tokio::sync::Mutex::new(KVCacheManager::new(
            blocks,
            BLOCK,
            true,
            vec![0],
        )));
        let handle = MakeRoomHandle::default();
        let mut steps = PagedSteps::<FakeSeq>::new(config, &handle, manager.clone());
        let mut model = Model {
            manager,
            slots: HashMap::new(),
        };
        let mut added: Vec<(Request, FakeSeq, Option<u64>)> = Vec::new();
        let (mut now, mut next, mut passes) = (0u64, 0usize, 0u64);
        loop {
            while next < workload.arrivals.len() && workload.arrivals[next].0 <= now {
                if let Arrival::Request(r) = &workload.arrivals[next].1 {
                    let seq = fake(r);
                    if steps
                        .add(seq.clone(), r.priority, r.call, Some(r.max_new))
                        .is_ok()
                    {
                        // Some clients leave a few passes in.
                        let leaves = (r.id % 7 == 3).then_some(passes + 3);
                        added.push((r.clone(), seq, leaves));
                    }
                }
                next += 1;
            }
            for (_, seq, leaves) in &added {
                if leaves.is_some_and(|at| passes >= at) {
                    seq.0.borrow_mut().gone = true;
                }
            }
            match steps.next_pass() {
                Some(pass) => {
                    model.run(pass);
                    passes += 1;
                    now += 2;
                    assert!(passes < 200_000, "seed {seed}: no end");
                }
                None if steps.is_idle() => match workload.arrivals.get(next) {
                    Some((at, _)) => now = (*at).max(now + 1),
                    None => break,
                },
                None => now += 1,
            }
        }
        assert_eq!(steps.short_grows(), 0, "seed {seed}: the pool was short");
        for (r, seq, _) in &added {
            let f = seq.0.borrow();
            if f.gone || (f.hint && f.generated == 0) {
                continue;
            }
            assert_eq!(
                f.state,
                State::Done,
                "seed {seed}: request {} unfinished: {f:?}",
                r.id
            );
            assert!(
                f.tokens == expected(r, f.ends_after),
                "seed {seed}: request {} ended with other tokens",
                r.id
            );
        }
        // Only retained turns hold blocks now.
        let kv = steps.kv();
        let manager = kv.manager();
        let held: HashSet<usize> = kv
            .retained()
            .flat_map(|(_, id)| manager.get_block_ids(id).unwrap_or_default().to_vec())
            .collect();
        assert_eq!(
            manager.num_free_blocks() + held.len(),
            blocks - 1,
            "seed {seed}: blocks leaked"
        );
        drop(manager);
        let counters = &handle.state().counters;
        fired.0 += counters.kv_preemptions + counters.growth_preemptions;
        fired.1 += counters.retained_hits;
        fired.2 += counters.prefill_chunks;
    }
    // The workloads exercised what the adapter must get right.
    let (preemptions, retained_hits, chunks) = fired;
    assert!(
        preemptions > 0 && retained_hits > 0 && chunks > 0,
        "{fired:?}"
    );
}

/// Runs passes until the adapter has none (nothing left or everything held).
fn run_all(steps: &mut PagedSteps<FakeSeq>, model: &mut Model) -> Vec<(bool, usize, Vec<SeqId>)> {
    let mut ran = Vec::new();
    while let Some(pass) = steps.next_pass() {
        let summary = match &pass {
            PagedPass::Prompt { seqs, cached } => {
                (true, *cached, seqs.iter().map(PagedSeq::id).collect())
            }
            PagedPass::Decode(seqs) => (false, 0, seqs.iter().map(PagedSeq::id).collect()),
        };
        model.run(pass);
        ran.push(summary);
    }
    ran
}

fn adapter(blocks: usize, switches: Switches) -> (PagedSteps<FakeSeq>, Model) {
    let manager = Arc::new(tokio::sync::Mutex::new(KVCacheManager::new(
        blocks,
        BLOCK,
        true,
        vec![0],
    )));
    let config = PolicyConfig {
        switches,
        max_running: 2,
        ..PolicyConfig::default()
    };
    let steps = PagedSteps::new(config, &MakeRoomHandle::default(), manager.clone());
    let model = Model {
        manager,
        slots: HashMap::new(),
    };
    (steps, model)
}

#[test]
fn a_calls_next_turn_computes_only_what_its_last_turn_did_not() {
    for retention in [false, true] {
        let switches = Switches {
            call_retention: retention,
            ..Switches::all()
        };
        let (mut steps, mut model) = adapter(64, switches);
        let first = Request::new(1, 0, Some(7), 100, 4);
        steps.add(fake(&first), 0, Some(7), Some(4)).unwrap();
        run_all(&mut steps, &mut model);
        let retained: Vec<_> = steps.kv().retained().collect();
        assert_eq!(retained.len(), usize::from(retention), "{retained:?}");
        let next = Request::new(5, 0, Some(7), 150, 4);
        let seq = fake(&next);
        steps.add(seq.clone(), 0, Some(7), Some(4)).unwrap();
        let ran = run_all(&mut steps, &mut model);
        // Six full blocks of the first turn's prompt are found, as KV of its own prefix.
        assert_eq!(
            ran[0],
            (true, 96, vec![5]),
            "retention {retention}: {ran:?}"
        );
        let f = seq.0.borrow();
        assert_eq!(
            (f.generated, f.state, f.tokens.len()),
            (4, State::Done, 154),
            "{ran:?}"
        );
        assert!(f.tokens == expected(&next, 4));
    }
}

#[test]
fn a_preempted_agent_resumes_from_what_the_cache_kept_without_sampling_again() {
    // A pool of 20 blocks: two agents decode; a voice turn that needs the room preempts
    // the newer one, which later re-prefills only what the prefix cache lost and ends
    // with the tokens it would have had alone.
    let (mut steps, mut model) = adapter(21, Switches::all());
    let agents = [
        Request::new(1, 1, None, 120, 40),
        Request::new(4, 1, None, 120, 40),
    ];
    let seqs: Vec<FakeSeq> = agents.iter().map(fake).collect();
    for (r, seq) in agents.iter().zip(&seqs) {
        steps.add(seq.clone(), 1, None, Some(r.max_new)).unwrap();
    }
    for _ in 0..6 {
        model.run(steps.next_pass().expect("agents run"));
    }
    let voice = Request::new(3, 0, Some(9), 100, 8);
    let turn = fake(&voice);
    steps.add(turn.clone(), 0, Some(9), Some(8)).unwrap();
    let ran = run_all(&mut steps, &mut model);
    let counters = steps.planner.policy().counters.clone();
    assert!(
        counters.kv_preemptions + counters.growth_preemptions >= 1,
        "{counters:?}"
    );
    assert!(turn.0.borrow().tokens == expected(&voice, 8));
    for (r, seq) in agents.iter().zip(&seqs) {
        assert!(
            seq.0.borrow().tokens == expected(r, r.max_new),
            "agent {}",
            r.id
        );
    }
    // The victim came back through a prompt chunk over cached blocks.
    assert!(
        ran.iter()
            .any(|(prompt, cached, ids)| *prompt && *cached > 0 && ids.iter().any(|id| *id != 3)),
        "{ran:?}"
    );
    assert_eq!(steps.short_grows(), 0);
}

#[test]
fn after_an_engine_panic_nothing_is_held_and_the_next_request_runs() {
    let (mut steps, mut model) = adapter(40, Switches::all());
    let turn = Request::new(1, 0, Some(7), 100, 4);
    steps.add(fake(&turn), 0, Some(7), Some(4)).unwrap();
    run_all(&mut steps, &mut model);
    let agent = Request::new(4, 1, None, 120, 40);
    steps.add(fake(&agent), 1, None, Some(40)).unwrap();
    for _ in 0..3 {
        model.run(steps.next_pass().expect("the agent runs"));
    }
    let held = steps.reset();
    assert_eq!(held.iter().map(PagedSeq::id).collect::<Vec<_>>(), vec![4]);
    assert!(steps.is_idle() && steps.kv().retained().next().is_none());
    assert_eq!(steps.kv().free_blocks(), 39, "every block free");
    let next = Request::new(5, 1, None, 60, 6);
    let seq = fake(&next);
    steps.add(seq.clone(), 1, None, Some(6)).unwrap();
    run_all(&mut steps, &mut model);
    assert!(seq.0.borrow().tokens == expected(&next, 6));
}

/// mistral.rs calls its scheduler from inside the engine thread's async runtime, where a
/// blocking lock panics.
#[test]
fn the_adapter_runs_inside_the_engines_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut steps, mut model) = adapter(40, Switches::all());
        let turn = Request::new(1, 0, Some(7), 100, 4);
        let seq = fake(&turn);
        steps.add(seq.clone(), 0, Some(7), Some(4)).unwrap();
        run_all(&mut steps, &mut model);
        assert!(seq.0.borrow().tokens == expected(&turn, 4));
    });
}
