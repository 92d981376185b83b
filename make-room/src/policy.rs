//! The scheduler's decisions for one engine step: who is admitted, who is preempted, who
//! gets how many prompt tokens, who decodes, who is held back.

use std::collections::BTreeMap;

use crate::types::{Counters, Plan, PolicyConfig, Request, Switches};

#[derive(Debug, Clone)]
struct Hint {
    priority: i32,
    until_ms: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Retained {
    pub(crate) call: u64,
    /// The finished request whose KV it is.
    pub(crate) request: u64,
    pub(crate) tokens: usize,
    until_ms: u64,
}

/// The scheduling state and its decisions.
#[derive(Debug, Clone)]
pub struct Scheduler {
    pub(crate) config: PolicyConfig,
    pub(crate) requests: BTreeMap<u64, Request>,
    pub(crate) next_admission: u64,
    hints: Vec<Hint>,
    /// Callers gone quiet, and until when each keeps the steps small (see
    /// [`Scheduler::turn_coming`]).
    pub(crate) coming: BTreeMap<u64, u64>,
    pub(crate) retained: Vec<Retained>,
    /// The most urgent priority the last plan computes for (see [`crate::Admitted`]).
    pub(crate) planned_priority: Option<i32>,
    pub counters: Counters,
}

impl Scheduler {
    pub fn new(config: PolicyConfig) -> Self {
        Self {
            config,
            requests: BTreeMap::new(),
            next_admission: 0,
            hints: Vec::new(),
            coming: BTreeMap::new(),
            retained: Vec::new(),
            planned_priority: None,
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Changes the switches; meant for when no request is in flight. Turning call
    /// retention off lets go of the room kept for finished call turns.
    pub fn set_switches(&mut self, switches: Switches) {
        if !switches.call_retention {
            self.retained.clear();
        }
        self.config.switches = switches;
    }

    /// A caller of `priority` stopped speaking: hold less urgent prefill for a while.
    pub fn turn_hint(&mut self, priority: i32, now_ms: u64) {
        self.counters.hints_seen += 1;
        if self.config.switches.turn_hint {
            self.hints.push(Hint {
                priority,
                until_ms: now_ms + self.config.hint_hold_ms,
            });
        }
    }

    /// The caller of `call` went quiet, and their turn may follow (the voice agent is
    /// transcribing it): with the turn hint on, steps take the small chunk for
    /// `hint_hold_ms`, so the pass in flight when the turn arrives is short. Nothing is
    /// held: a quiet moment is often a pause mid-sentence, and the turn's own arrival holds
    /// what it must. The hold ends early when the turn arrives (its request keeps the steps
    /// small from then on) or the caller speaks again ([`Scheduler::turn_not_coming`]): a
    /// hold that outlived its turn kept the agents' prompts in small chunks after the reply
    /// had its first sentence (`docs/benchmarking.md`, run 41).
    pub fn turn_coming(&mut self, call: u64, now_ms: u64) {
        if self.config.switches.turn_hint {
            self.coming.insert(call, now_ms + self.config.hint_hold_ms);
        }
    }

    /// The caller of `call` speaks again: the turn they went quiet for is not coming.
    pub fn turn_not_coming(&mut self, call: u64) {
        self.coming.remove(&call);
    }

    /// The agent of `call` has the first sentence of its reply: with
    /// `release_at_first_sentence`, the turn's hold on less urgent work ends there, before
    /// the window's end (the rest of the reply is generated while the first sentence is
    /// spoken).
    pub fn first_sentence_out(&mut self, call: u64) {
        if !self.config.release_at_first_sentence {
            return;
        }
        let window = self.config.window_tokens;
        // Only a hold that exists is released (the off baseline holds nothing).
        let switches = &self.config.switches;
        let holds = switches.decode_hold || switches.budget_cap;
        for r in self.requests.values_mut() {
            if r.call == Some(call) && !r.first_sentence_out {
                if holds && r.in_window(window) {
                    self.counters.first_sentence_releases += 1;
                }
                r.first_sentence_out = true;
            }
        }
    }

    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.requests.values()
    }

    pub fn request(&self, id: u64) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// Whether the last plan's step may yield the cores to the voice pipeline: with
    /// priority on, a step that computes for no voice turn (no request at
    /// `whole_prompt_priority` or more urgent in it) is agents' work, and the voice
    /// pipeline's models may run first; a step with a turn in it is a caller's wait (the
    /// engine's CPU adapter lowers its threads' priority for the first kind only).
    pub fn step_may_yield(&self) -> bool {
        self.config.switches.priority
            && self
                .planned_priority
                .zip(self.config.whole_prompt_priority)
                .is_none_or(|(planned, voice)| planned > voice)
    }

    pub fn is_idle(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn running_len(&self) -> usize {
        self.requests.values().filter(|r| r.running).count()
    }

    pub fn waiting_len(&self) -> usize {
        self.requests.values().filter(|r| !r.running).count()
    }

    pub fn retained_tokens(&self) -> usize {
        self.retained.iter().map(|r| r.tokens).sum()
    }

    /// KV in use: running requests' and retained call turns'.
    pub fn kv_used(&self) -> usize {
        self.requests
            .values()
            .filter(|r| r.running)
            .map(|r| r.computed)
            .sum::<usize>()
            + self.retained_tokens()
    }

    pub(crate) fn order_key(&self, r: &Request, by_admission: bool) -> (i32, u64) {
        let priority = if self.config.switches.priority {
            r.priority
        } else {
            0
        };
        (priority, if by_admission { r.admission } else { r.id })
    }

    pub(crate) fn preempt(&mut self, id: u64, plan: &mut Plan) {
        let r = self.requests.get_mut(&id).expect("victim exists");
        // The prefix cache keeps what it computed: it resumes by reloading.
        r.cached = r.computed;
        r.computed = 0;
        r.running = false;
        // Admitted in this very step, it is simply not admitted: the engine has not seen
        // it run, and a plan never both admits and preempts one request.
        match plan.admitted.iter().position(|a| *a == id) {
            Some(i) => {
                plan.admitted.remove(i);
            }
            None => plan.preempted.push(id),
        }
    }

    /// Running requests the engine would preempt to let `for_id` grow, newest first; with
    /// priority on, none more urgent than it.
    fn growth_victims(&self, for_id: u64, plan: &Plan) -> Vec<u64> {
        let me = &self.requests[&for_id];
        let scheduled =
            |id: u64| plan.decode.contains(&id) || plan.prefill.iter().any(|(p, _)| *p == id);
        let mut victims: Vec<&Request> = self
            .requests
            .values()
            .filter(|r| r.running && r.id != for_id && !scheduled(r.id) && r.computed > 0)
            .filter(|r| !self.config.switches.priority || r.priority >= me.priority)
            .collect();
        victims.sort_by_key(|r| std::cmp::Reverse(r.admission));
        victims.into_iter().map(|r| r.id).collect()
    }

    /// Frees room for `need` tokens for `for_id` by the engine's growth preemption.
    fn grow_room(&mut self, for_id: u64, need: usize, room: &mut usize, plan: &mut Plan) {
        self.evict_retained(need, room, None);
        for victim in self.growth_victims(for_id, plan) {
            if *room >= need {
                break;
            }
            *room += self.requests[&victim].computed;
            self.preempt(victim, plan);
            self.counters.growth_preemptions += 1;
        }
    }

    /// Retained call turns give way under pressure: drops them, oldest first (never the
    /// one `keep_call` is about to take over), until `room` reaches `need`.
    pub(crate) fn evict_retained(&mut self, need: usize, room: &mut usize, keep_call: Option<u64>) {
        while *room < need {
            let Some(i) = self.retained.iter().position(|k| Some(k.call) != keep_call) else {
                break;
            };
            *room += self.retained.remove(i).tokens;
        }
    }

    /// The step's token budget: small while a voice turn is near (with the budget cap or
    /// the turn hint on), else the idle chunk. Switched off, the step budget is fixed, as an
    /// engine with plain chunked prefill runs.
    ///
    /// A turn is near from its hint (or its caller going quiet) until its reply is past
    /// its window: a step then
    /// stands between the caller and the first sentence. The rest of the reply only has
    /// to keep ahead of speech, which an idle-chunk step does, so the agents' prompts go
    /// back to full steps.
    fn chunk_now(&self) -> Option<usize> {
        let window = self.config.window_tokens;
        let voice_near = !self.hints.is_empty()
            || !self.coming.is_empty()
            || self.config.switches.budget_cap
                && self
                    .requests
                    .values()
                    .any(|r| self.is_call(r) && (!r.running || r.in_window(window)));
        match voice_near {
            true => self.config.chunk_tokens,
            false => self.config.idle_chunk_tokens.or(self.config.chunk_tokens),
        }
    }

    /// Decides the next step at time `now_ms`.
    pub fn schedule(&mut self, now_ms: u64) -> Plan {
        self.counters.steps += 1;
        self.hints.retain(|h| h.until_ms > now_ms);
        self.retained.retain(|r| r.until_ms > now_ms);
        self.coming.retain(|_, until_ms| *until_ms > now_ms);
        let chunk = self.chunk_now();
        let switches = self.config.switches.clone();
        let window = self.config.window_tokens;
        let mut plan = Plan::default();
        let mut room = self.config.kv_budget_tokens.saturating_sub(self.kv_used());

        self.admit_waiting(chunk, &mut room, &mut plan);

        // The most urgent priority some running request or hint is holding room for.
        let mut holder: Option<i32> = None;
        if switches.budget_cap {
            holder = self
                .requests
                .values()
                .filter(|r| r.running && r.in_window(window))
                .map(|r| r.priority)
                .min();
        }
        if switches.turn_hint {
            holder = holder
                .into_iter()
                .chain(self.hints.iter().map(|h| h.priority))
                .min();
        }
        let held = |r: &Request| -> bool {
            holder.is_some_and(|p| r.priority > p)
                && r.generated + 1 < r.max_new
                && r.held_steps < window
        };
        // A call's reply decoding: the agents' prompts wait for its pace's step.
        let every = self.config.reply_pace_steps.max(1) as u64;
        let paced = switches.budget_cap
            && !self.counters.steps.is_multiple_of(every)
            && self
                .requests
                .values()
                .any(|r| r.running && self.is_call(r) && !r.prefilling());
        let mut paced_out: Vec<u64> = Vec::new();

        let mut order: Vec<u64> = self
            .requests
            .values()
            .filter(|r| r.running)
            .map(|r| r.id)
            .collect();
        order.sort_by_key(|id| self.order_key(&self.requests[id], true));
        // Stock: every decode, then prompt tokens. With priority on, each priority level in
        // turn (decodes, then its prompt tokens), so a turn's prefill is not starved of the
        // step's budget by less urgent decodes.
        let mut groups: Vec<Vec<u64>> = Vec::new();
        for id in order {
            let key = self.order_key(&self.requests[&id], true).0;
            match groups.last_mut() {
                Some(group) if self.order_key(&self.requests[&group[0]], true).0 == key => {
                    group.push(id)
                }
                _ => groups.push(vec![id]),
            }
        }
        let mut budget = chunk.unwrap_or(usize::MAX);
        for group in groups {
            for decoding in [true, false] {
                for &id in &group {
                    let r = &self.requests[&id];
                    if !r.running || r.prefilling() == decoding {
                        continue;
                    }
                    let hold_applies = if decoding {
                        switches.decode_hold
                    } else {
                        switches.budget_cap || switches.turn_hint
                    };
                    if hold_applies && held(r) {
                        plan.held.push(id);
                        continue;
                    }
                    if paced && !decoding && !self.is_call(r) {
                        paced_out.push(id);
                        continue;
                    }
                    self.run_request(id, &mut room, &mut budget, &mut plan);
                }
            }
        }
        // Pacing never leaves a step with nothing to compute either.
        if plan.tokens() == 0 {
            for id in std::mem::take(&mut paced_out) {
                self.run_request(id, &mut room, &mut budget, &mut plan);
            }
        }
        if !paced_out.is_empty() {
            self.counters.paced_steps += 1;
        }
        // A hold never leaves a step with nothing to compute: the request held longest goes.
        if plan.tokens() == 0 {
            let longest = plan
                .held
                .iter()
                .copied()
                .filter(|id| self.requests.get(id).is_some_and(|r| r.running))
                .max_by_key(|id| (self.requests[id].held_steps, std::cmp::Reverse(*id)));
            if let Some(id) = longest {
                plan.held.retain(|h| *h != id);
                self.counters.hold_releases += 1;
                self.run_request(id, &mut room, &mut budget, &mut plan);
            }
        }
        let releases = self
            .requests
            .values()
            .filter(|r| {
                r.running && r.held_steps >= window && holder.is_some_and(|p| r.priority > p)
            })
            .count();
        self.counters.hold_releases += releases as u64;
        self.counters.held_request_steps += plan.held.len() as u64;
        self.planned_priority = plan
            .decode
            .iter()
            .chain(plan.prefill.iter().map(|(id, _)| id))
            .filter_map(|id| self.requests.get(id))
            .map(|r| r.priority)
            .min();
        plan
    }

    /// Whether the request is a call's (at `whole_prompt_priority` or more urgent): its
    /// prompt runs whole, its nearness shrinks the agents' chunks, its reply paces them.
    pub(crate) fn is_call(&self, r: &Request) -> bool {
        self.config
            .whole_prompt_priority
            .is_some_and(|p| r.priority <= p)
    }

    /// Gives a running request its decode token or its next prompt chunk, within the step's
    /// token budget and the KV room (making room by the engine's growth preemption).
    fn run_request(&mut self, id: u64, room: &mut usize, budget: &mut usize, plan: &mut Plan) {
        let r = &self.requests[&id];
        if !r.prefilling() {
            if *budget == 0 {
                return;
            }
            if *room == 0 {
                self.grow_room(id, 1, room, plan);
            }
            if *room == 0 {
                // No one else to take room from: it steps aside itself.
                *room += self.requests[&id].computed;
                self.preempt(id, plan);
                self.counters.growth_preemptions += 1;
                return;
            }
            *room -= 1;
            *budget -= 1;
            plan.decode.push(id);
            return;
        }
        let whole = self.is_call(r);
        if whole && !plan.prefill.is_empty() {
            return;
        }
        let left = r.target() - r.computed;
        let want = if whole { left } else { left.min(*budget) };
        if want == 0 {
            return;
        }
        if want > *room {
            self.grow_room(id, want, room, plan);
        }
        let give = want.min(*room);
        if give == 0 {
            return;
        }
        *room -= give;
        *budget = budget.saturating_sub(give);
        plan.prefill.push((id, give));
    }

    /// Applies what the step computed; `stopped` lists requests that ended early (an end
    /// of sequence, a cancel). Returns the requests that finished.
    pub fn finish_step(&mut self, plan: &Plan, now_ms: u64, stopped: &[u64]) -> Vec<u64> {
        let mut progressed = Vec::with_capacity(plan.prefill.len() + plan.decode.len());
        for &(id, n) in &plan.prefill {
            if let Some(r) = self.requests.get_mut(&id) {
                r.computed += n;
                if !r.prefilling() && r.generated == 0 {
                    r.generated = 1;
                }
                progressed.push(id);
                if r.call.is_some() {
                    self.counters.call_prefill_tokens += n as u64;
                }
            }
            self.counters.prefill_chunks += 1;
            self.counters.prefill_tokens += n as u64;
        }
        for &id in &plan.decode {
            if let Some(r) = self.requests.get_mut(&id) {
                r.computed += 1;
                r.generated += 1;
                progressed.push(id);
                if r.call.is_some() {
                    self.counters.call_decode_tokens += 1;
                }
            }
            self.counters.decode_tokens += 1;
        }
        for r in self.requests.values_mut() {
            if progressed.contains(&r.id) {
                r.held_steps = 0;
            } else if plan.held.contains(&r.id) {
                r.held_steps += 1;
            }
        }
        let finished: Vec<u64> = self
            .requests
            .values()
            .filter(|r| r.running && (r.done() || stopped.contains(&r.id)))
            .map(|r| r.id)
            .collect();
        for id in &finished {
            let r = self.requests.remove(id).expect("finished request exists");
            if let (true, Some(call)) = (self.config.switches.call_retention, r.call) {
                let block = self.config.kv_block_tokens.max(1);
                let tokens = r.computed.div_ceil(block) * block;
                if self.retained_tokens() + tokens <= self.config.retain_tokens {
                    self.retained.retain(|k| k.call != call);
                    self.retained.push(Retained {
                        call,
                        request: r.id,
                        tokens,
                        until_ms: now_ms + self.config.retain_ms,
                    });
                    self.counters.retained_turns += 1;
                }
            }
        }
        // A request cancelled while waiting simply leaves.
        for id in stopped {
            if self.requests.get(id).is_some_and(|r| !r.running) {
                self.requests.remove(id);
            }
        }
        finished
    }
}

#[cfg(test)]
mod tests;
