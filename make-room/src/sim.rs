//! The policy driven step by step through workloads without a model, with its invariants
//! checked after every step, and a random search for workloads that break them.
//!
//! Invariants: no stall (work to do and nothing computed for more than `window_tokens`
//! steps in a row), KV never over budget, no request lost (every admitted request
//! finishes, or is a turn hint withdrawn for its turn), no superseded hint computed (a
//! hint still waiting when its call's turn arrives never runs, with the turn hint on), no
//! request both admitted and preempted in one step, and with equal priorities the same
//! steps as with every switch off.

use std::collections::BTreeSet;

use crate::{Plan, PolicyConfig, Request, RequestKind, Scheduler, Switches};

/// Something that happens at a time in a workload.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrival {
    Request(Request),
    /// A caller of this priority stopped speaking.
    Hint(i32),
}

#[derive(Debug, Clone)]
pub struct Workload {
    /// The engine's limits; `switches` are set per run.
    pub config: PolicyConfig,
    /// (time in ms, what arrives), in time order.
    pub arrivals: Vec<(u64, Arrival)>,
}

/// How one run went.
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub steps: u64,
    pub finished: usize,
    pub refused: usize,
    /// Turn hints withdrawn because their turn arrived first.
    pub withdrawn: usize,
    /// The broken invariant, if any.
    pub violation: Option<String>,
    /// Every step's plan (only when asked for).
    pub trace: Vec<Plan>,
    /// Per request id: the simulated time its first token came.
    pub first_token_ms: Vec<(u64, u64)>,
    /// Per request id: free KV tokens when it arrived (to check a probe's condition held).
    pub kv_free_at_arrival: Vec<(u64, usize)>,
    pub counters: crate::Counters,
    pub elapsed_ms: u64,
}

/// A simple cost model of a CPU step: fixed overhead, per prompt token, per sequence decoded.
pub fn step_cost_ms(plan: &Plan) -> u64 {
    let prefill: usize = plan.prefill.iter().map(|(_, n)| n).sum();
    2 + (prefill as u64 * 2) + plan.decode.len() as u64
}

/// Runs a workload with the given switches.
pub fn run(workload: &Workload, switches: &Switches, keep_trace: bool) -> RunReport {
    let config = PolicyConfig {
        switches: switches.clone(),
        ..workload.config.clone()
    };
    let window = config.window_tokens as u64;
    let budget = config.kv_budget_tokens;
    let mut scheduler = Scheduler::new(config);
    let mut report = RunReport::default();
    let mut now = 0u64;
    let mut next = 0;
    let mut idle_steps = 0u64;
    // Hints that were waiting when their call's turn arrived, found from the scheduler's
    // state before the turn was added (not from what `add` says it withdrew).
    let mut superseded = BTreeSet::new();
    let total_work: usize = workload
        .arrivals
        .iter()
        .map(|(_, a)| match a {
            Arrival::Request(r) => r.prompt_len + r.max_new,
            Arrival::Hint(_) => 0,
        })
        .sum();
    // Generous: every token recomputed many times over still finishes well within this.
    let step_limit = 50 * (total_work as u64 + 10) * (window + 2);
    loop {
        while next < workload.arrivals.len() && workload.arrivals[next].0 <= now {
            match &workload.arrivals[next].1 {
                Arrival::Request(r) => {
                    report
                        .kv_free_at_arrival
                        .push((r.id, budget.saturating_sub(scheduler.kv_used())));
                    let hints = match RequestKind::of(r) {
                        RequestKind::VoiceTurn if switches.turn_hint => {
                            waiting_hints(&scheduler, r.call)
                        }
                        _ => Vec::new(),
                    };
                    match scheduler.add(r.clone(), now) {
                        Ok(admitted) => {
                            report.withdrawn += admitted.withdrawn_hints.len();
                            superseded.extend(hints);
                        }
                        // A refused turn changes nothing: its hint runs and finishes.
                        Err(_) => report.refused += 1,
                    }
                }
                Arrival::Hint(priority) => scheduler.turn_hint(*priority, now),
            }
            next += 1;
        }
        if scheduler.is_idle() {
            match workload.arrivals.get(next) {
                Some((at, _)) => {
                    now = (*at).max(now);
                    continue;
                }
                None => break,
            }
        }
        let plan = scheduler.schedule(now);
        report.steps += 1;
        let computed = plan
            .decode
            .iter()
            .chain(plan.prefill.iter().map(|(id, _)| id));
        if let Some(id) = computed
            .chain(&plan.admitted)
            .find(|id| superseded.contains(*id))
        {
            report.violation = Some(format!(
                "step {}: hint {id} computed after its call's turn arrived",
                report.steps
            ));
            break;
        }
        if let Some(id) = plan.admitted.iter().find(|id| plan.preempted.contains(id)) {
            report.violation = Some(format!(
                "step {}: request {id} both admitted and preempted",
                report.steps
            ));
            break;
        }
        let planned_kv = scheduler.kv_used() + plan.tokens();
        if planned_kv > budget {
            report.violation = Some(format!(
                "step {}: KV {planned_kv} over budget {budget}",
                report.steps
            ));
            break;
        }
        now += step_cost_ms(&plan);
        let before: Vec<(u64, usize)> = scheduler.requests().map(|r| (r.id, r.generated)).collect();
        let finished = scheduler.finish_step(&plan, now, &[]);
        report.finished += finished.len();
        for (id, generated) in before {
            let now_generated = scheduler.request(id).map_or(usize::MAX, |r| r.generated);
            if generated == 0 && now_generated >= 1 {
                report.first_token_ms.push((id, now));
            }
        }
        if plan.tokens() == 0 {
            idle_steps += 1;
            if idle_steps > window + 1 {
                report.violation = Some(format!(
                    "stall: {idle_steps} steps in a row with {} running and {} waiting and nothing computed",
                    scheduler.running_len(),
                    scheduler.waiting_len()
                ));
                break;
            }
            // Nothing could run: let time pass as a step would, so hints and retention expire.
            now += 1;
        } else {
            idle_steps = 0;
        }
        if keep_trace {
            report.trace.push(plan);
        }
        if report.steps > step_limit {
            report.violation = Some(format!(
                "lost: requests unfinished after {} steps",
                report.steps
            ));
            break;
        }
    }
    if report.violation.is_none() && !scheduler.is_idle() {
        report.violation = Some("lost: requests left when the workload ended".into());
    }
    report.counters = scheduler.counters.clone();
    report.elapsed_ms = now;
    report
}

/// The call's turn hints that have not started.
fn waiting_hints(scheduler: &Scheduler, call: Option<u64>) -> Vec<u64> {
    scheduler
        .requests()
        .filter(|r| !r.running && r.call == call && RequestKind::of(r) == RequestKind::TurnHint)
        .map(|r| r.id)
        .collect()
}

/// A small deterministic generator (SplitMix64), so a seed names a workload.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// Where the random workloads' hint requests number from (after every other request).
const HINT_IDS: u64 = 1_000;

/// A random workload: arrivals, prompt and reply lengths, priorities, calls and hints, KV
/// and chunk budgets. About a third have one priority and no calls (the stock check).
pub fn random_workload(seed: u64) -> Workload {
    let mut rng = Rng::new(seed);
    let kv_budget_tokens = rng.range(64, 2048) as usize;
    let config = PolicyConfig {
        switches: Switches::default(),
        max_running: rng.range(1, 8) as usize,
        kv_budget_tokens,
        kv_block_tokens: 1,
        chunk_tokens: rng.chance(0.6).then(|| rng.range(1, 256) as usize),
        idle_chunk_tokens: rng.chance(0.3).then(|| rng.range(1, 512) as usize),
        whole_prompt_priority: rng.chance(0.3).then_some(0),
        window_tokens: rng.range(1, 48) as usize,
        max_preemptions: rng.range(1, 3) as usize,
        hint_hold_ms: rng.range(0, 1500),
        release_at_first_sentence: false,
        retain_tokens: rng.range(0, kv_budget_tokens as u64 / 2) as usize,
        retain_ms: rng.range(0, 2000),
        // A stream of its own, so that the other draws are each seed's as before.
        reply_pace_steps: Rng::new(seed ^ 0x9ace).range(0, 5) as usize,
    };
    let equal = rng.chance(0.33);
    let count = rng.range(1, 12);
    let mut arrivals = Vec::new();
    for id in 0..count {
        let at = rng.range(0, 1500);
        if !equal && rng.chance(0.15) {
            arrivals.push((at, Arrival::Hint(0)));
        }
        let priority = if equal { 1 } else { rng.range(0, 2) as i32 };
        let call = (!equal && priority == 0 && rng.chance(0.6)).then(|| rng.range(0, 2));
        let prompt_len = rng.range(1, (kv_budget_tokens as u64 * 3 / 4).max(1)) as usize;
        let max_new = rng.range(1, 64) as usize;
        // A voice turn's hint: one token over a prefix of its prompt, a little before it
        // (or at the same time, as when the engine was busy in a long pass).
        if call.is_some() && rng.chance(0.5) {
            let hint_at = at.saturating_sub(rng.range(0, 300));
            let prefix = rng.range(1, prompt_len as u64) as usize;
            let hint = Request::new(HINT_IDS + id, priority, call, prefix, 1);
            arrivals.push((hint_at, Arrival::Request(hint)));
        }
        arrivals.push((
            at,
            Arrival::Request(Request::new(id, priority, call, prompt_len, max_new)),
        ));
    }
    arrivals.sort_by_key(|(at, _)| *at);
    Workload { config, arrivals }
}

/// Random switches, each on with probability 0.7 (at least one on).
pub fn random_switches(seed: u64) -> Switches {
    let mut rng = Rng::new(seed ^ 0x5EED_5EED);
    let mut s = Switches {
        priority: rng.chance(0.7),
        kv_preemption: rng.chance(0.7),
        budget_cap: rng.chance(0.7),
        decode_hold: rng.chance(0.7),
        turn_hint: rng.chance(0.7),
        call_retention: rng.chance(0.7),
    };
    if s == Switches::default() {
        s.priority = true;
    }
    s
}

/// What the search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchSummary {
    pub workloads: u64,
    /// Runs that broke an invariant with the switches on but not with them off.
    pub caused_by_options: u64,
    /// Runs that broke one either way (the engine's own limits).
    pub with_options_off: u64,
    /// Equal-priority workloads scheduled differently with switches on.
    pub stock_mismatches: u64,
    /// The first seed that failed, with what failed.
    pub first_failure: Option<(u64, String)>,
}

/// Checks one seeded workload, options off against on.
pub fn check(seed: u64) -> SearchSummary {
    let workload = random_workload(seed);
    let switches = random_switches(seed);
    let equal = workload
        .arrivals
        .iter()
        .all(|(_, a)| matches!(a, Arrival::Request(r) if r.priority == 1 && r.call.is_none()));
    let off = run(&workload, &Switches::default(), equal);
    let on = run(&workload, &switches, equal);
    let mut summary = SearchSummary {
        workloads: 1,
        ..Default::default()
    };
    if off.violation.is_some() {
        summary.with_options_off = 1;
    }
    if let (Some(v), None) = (&on.violation, &off.violation) {
        summary.caused_by_options = 1;
        summary.first_failure = Some((seed, format!("{v} with {switches:?}")));
    }
    if equal && off.trace != on.trace {
        summary.stock_mismatches = 1;
        summary.first_failure.get_or_insert((
            seed,
            format!("equal priorities scheduled differently with {switches:?}"),
        ));
    }
    summary
}

/// Checks `count` workloads from `first_seed` on.
pub fn search(
    first_seed: u64,
    count: u64,
    mut progress: impl FnMut(&SearchSummary),
) -> SearchSummary {
    let mut total = SearchSummary::default();
    for seed in first_seed..first_seed + count {
        let one = check(seed);
        total.workloads += 1;
        total.caused_by_options += one.caused_by_options;
        total.with_options_off += one.with_options_off;
        total.stock_mismatches += one.stock_mismatches;
        if total.first_failure.is_none() {
            total.first_failure = one.first_failure;
        }
        if total.workloads % 10_000 == 0 {
            progress(&total);
        }
    }
    total
}

#[cfg(test)]
mod tests;
