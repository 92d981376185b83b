//! A request's arrival: what kind of request it is, and what its arrival changes before
//! the next plan (hints it supersedes, whether the step in flight is planned again); and
//! its admission, the first part of each plan (who runs now, and whom the most urgent
//! waiting request preempts for a place or for KV room).

use crate::types::{Plan, Refused, Request};
use crate::Scheduler;

/// What a request is to make-room, read from its shape (DESIGN §2: the voice agent sends
/// a one-token request for the call the moment the caller stops speaking).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// One token for a call: the caller just stopped; it computes the turn's prompt
    /// prefix early and holds less urgent prefill for `hint_hold_ms`.
    TurnHint,
    /// A call's reply.
    VoiceTurn,
    /// Anything without a call: a coding agent's request.
    Agent,
}

impl RequestKind {
    pub fn of(request: &Request) -> Self {
        match (request.call, request.max_new) {
            (Some(_), 1) => Self::TurnHint,
            (Some(_), _) => Self::VoiceTurn,
            (None, _) => Self::Agent,
        }
    }
}

/// What an accepted request's arrival asks of the engine before it goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admitted {
    /// Waiting turn hints of the same call that the arriving turn supersedes: they would
    /// only compute the prompt the turn computes itself (both arrive together when the
    /// engine was busy in a long pass). The policy has dropped them; the engine ends their
    /// streams.
    pub withdrawn_hints: Vec<u64>,
    /// With priority on, the request is more urgent than everything the last plan
    /// computes: plan again now, so it waits for the pass in flight, not for the step.
    pub replan_now: bool,
}

impl Scheduler {
    /// An engine whose readmissions reload from a cache that can lose blocks (the GPU's
    /// prefix cache: preemption there is recompute) found only `tokens` of what the plan
    /// counted on for request `id`, just admitted. It holds that much KV now; the plan's
    /// work for it is the engine's to drop (it would start past what it holds), and the
    /// next plan gives it the rest.
    pub fn reloaded(&mut self, id: u64, tokens: usize) {
        if let Some(r) = self.requests.get_mut(&id).filter(|r| r.running) {
            r.computed = r.computed.min(tokens);
        }
    }

    /// A waiting request's prefix, as the engine's cache holds it now: `tokens` its
    /// admission would reload (exactly: a retained turn of its call is among them).
    pub fn set_cached(&mut self, id: u64, tokens: usize) {
        if let Some(r) = self.requests.get_mut(&id).filter(|r| !r.running) {
            r.cached = tokens;
            r.cached_exact = true;
        }
    }

    /// The finished call turns whose KV is kept for their call's next turn: (call,
    /// request).
    pub fn retained_turns(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.retained.iter().map(|k| (k.call, k.request))
    }

    /// Takes a request arriving at `now_ms`, or refuses one the engine can never serve (a
    /// refused request changes nothing: no hold, no hint withdrawn).
    pub fn add(&mut self, request: Request, now_ms: u64) -> Result<Admitted, Refused> {
        let budget = self.config.kv_budget_tokens;
        if request.peak_kv() > budget {
            self.counters.refused += 1;
            return Err(Refused::TooLong {
                needed: request.peak_kv(),
                budget,
            });
        }
        let mut admitted = Admitted::default();
        if RequestKind::of(&request) == RequestKind::VoiceTurn {
            self.counters.turn_prompt_tokens += request.prompt_len as u64;
            self.counters.turn_cached_tokens += request.cached.min(request.prompt_len) as u64;
        }
        match (RequestKind::of(&request), request.call) {
            (RequestKind::TurnHint, _) => self.turn_hint(request.priority, now_ms),
            (RequestKind::VoiceTurn, Some(call)) if self.config.switches.turn_hint => {
                admitted.withdrawn_hints = self.withdraw_hints(call);
                self.coming.remove(&call);
            }
            _ => {}
        }
        if self.config.switches.priority
            && self
                .planned_priority
                .is_some_and(|planned| request.priority < planned)
        {
            admitted.replan_now = true;
            self.planned_priority = None;
        }
        self.requests.insert(request.id, request);
        Ok(admitted)
    }

    /// Drops the call's turn hints that have not started; their hold stays.
    fn withdraw_hints(&mut self, call: u64) -> Vec<u64> {
        let waiting: Vec<u64> = self
            .requests
            .values()
            .filter(|r| !r.running && r.call == Some(call))
            .filter(|r| RequestKind::of(r) == RequestKind::TurnHint)
            .map(|r| r.id)
            .collect();
        for id in &waiting {
            self.requests.remove(id);
        }
        self.counters.hints_superseded += waiting.len() as u64;
        waiting
    }
}

impl Scheduler {
    /// Admission, at the start of each plan: waiting requests in order (with priority on,
    /// most urgent first), until one does not fit (first come, first served); only the
    /// first may preempt, for a place or for KV room. `room` is the budget's free tokens.
    pub(crate) fn admit_waiting(
        &mut self,
        chunk: Option<usize>,
        room: &mut usize,
        plan: &mut Plan,
    ) {
        let switches = self.config.switches.clone();
        let mut waiting: Vec<u64> = self
            .requests
            .values()
            .filter(|r| !r.running)
            .map(|r| r.id)
            .collect();
        waiting.sort_by_key(|id| self.order_key(&self.requests[id], false));
        for (position, id) in waiting.into_iter().enumerate() {
            // Only the most urgent waiting request may preempt, here for a place.
            if self.running_len() >= self.config.max_running
                && !(switches.kv_preemption && position == 0 && self.free_a_place(id, room, plan))
            {
                break;
            }
            let r = &self.requests[&id];
            // The call's retained turn, which this request takes over (eviction spares it).
            let taken_call = r.call.filter(|&call| {
                switches.call_retention && self.retained.iter().any(|k| k.call == call)
            });
            let retained = taken_call.map_or(0, |call| {
                self.retained
                    .iter()
                    .find(|k| k.call == call)
                    .map_or(0, |k| k.tokens)
            });
            let reuse = if r.cached_exact {
                r.cached
            } else {
                r.cached.max(retained)
            }
            .min(r.target());
            let first_chunk = if self.is_call(r) {
                usize::MAX
            } else {
                chunk.unwrap_or(usize::MAX).max(1)
            };
            // Room for what it reloads and its first chunk (or its next token).
            let need = reuse + first_chunk.min(r.target() - reuse).max(1);
            // Retained KV is already counted: taking it over frees that much.
            if need > *room + retained {
                self.evict_retained(need - retained, room, taken_call);
            }
            let available = *room + retained;
            // Only the most urgent waiting request may preempt for room.
            if need > available
                && !(switches.kv_preemption
                    && position == 0
                    && self.make_room_for(id, need - available, room, plan))
            {
                break;
            }
            if let Some(i) =
                taken_call.and_then(|call| self.retained.iter().position(|k| k.call == call))
            {
                self.retained.remove(i);
                *room += retained;
                self.counters.retained_hits += 1;
            }
            let admission = self.next_admission;
            self.next_admission += 1;
            let r = self.requests.get_mut(&id).expect("waiting request exists");
            r.running = true;
            r.admission = admission;
            r.computed = reuse;
            r.cached = 0;
            *room -= reuse;
            plan.admitted.push(id);
        }
    }

    /// Preempts the newest running request less urgent than `id` (none admitted this
    /// step), so that `id` runs now rather than after some agent's reply ends; `false` if
    /// there is none.
    fn free_a_place(&mut self, id: u64, room: &mut usize, plan: &mut Plan) -> bool {
        let priority = self.requests[&id].priority;
        let victim = self
            .requests
            .values()
            .filter(|r| r.running && r.priority > priority && !plan.admitted.contains(&r.id))
            .max_by_key(|r| r.admission)
            .map(|r| r.id);
        let Some(victim) = victim else {
            return false;
        };
        *room += self.requests[&victim].computed;
        self.preempt(victim, plan);
        self.counters.slot_preemptions += 1;
        true
    }

    /// KV preemption: frees `short` more tokens for the most urgent waiting request `id` by
    /// preempting at most `max_preemptions` less urgent running requests, newest first;
    /// preempts nothing if that would not be enough.
    fn make_room_for(&mut self, id: u64, short: usize, room: &mut usize, plan: &mut Plan) -> bool {
        let priority = self.requests[&id].priority;
        let mut victims: Vec<&Request> = self
            .requests
            .values()
            .filter(|r| r.running && r.priority > priority && !plan.admitted.contains(&r.id))
            .collect();
        victims.sort_by_key(|r| std::cmp::Reverse(r.admission));
        let mut chosen = Vec::new();
        let mut freed = 0;
        for v in victims.into_iter().take(self.config.max_preemptions) {
            if freed >= short {
                break;
            }
            freed += v.computed;
            chosen.push(v.id);
        }
        if freed < short {
            return false;
        }
        for victim in chosen {
            *room += self.requests[&victim].computed;
            self.preempt(victim, plan);
            self.counters.kv_preemptions += 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Plan, PolicyConfig, Switches};

    fn scheduler(switches: Switches) -> Scheduler {
        Scheduler::new(PolicyConfig {
            switches,
            ..PolicyConfig::default()
        })
    }

    #[test]
    fn a_requests_kind_is_read_from_its_call_and_length() {
        assert_eq!(
            RequestKind::of(&Request::new(1, 0, Some(7), 40, 1)),
            RequestKind::TurnHint
        );
        assert_eq!(
            RequestKind::of(&Request::new(2, 0, Some(7), 40, 48)),
            RequestKind::VoiceTurn
        );
        assert_eq!(
            RequestKind::of(&Request::new(3, 1, None, 40, 1)),
            RequestKind::Agent
        );
    }

    #[test]
    fn a_hint_its_turn_overtook_is_withdrawn_only_while_waiting() {
        let mut scheduler = scheduler(Switches::all());
        scheduler
            .add(Request::new(1, 0, Some(7), 40, 1), 0)
            .unwrap();
        assert_eq!(scheduler.counters.hints_seen, 1, "a hint request holds");
        // Another call's turn leaves it; its own call's turn withdraws it.
        let other = scheduler
            .add(Request::new(2, 0, Some(8), 50, 48), 0)
            .unwrap();
        assert!(other.withdrawn_hints.is_empty());
        let turn = scheduler
            .add(Request::new(3, 0, Some(7), 50, 48), 0)
            .unwrap();
        assert_eq!(turn.withdrawn_hints, vec![1]);
        assert!(scheduler.request(1).is_none());
        let plan = scheduler.schedule(0);
        assert!(!plan.admitted.contains(&1), "{plan:?}");
        assert_eq!(scheduler.counters.hints_superseded, 1);
        // A hint already running finishes.
        scheduler
            .add(Request::new(4, 0, Some(9), 40, 1), 0)
            .unwrap();
        scheduler.finish_step(&plan, 1, &[]);
        let plan = scheduler.schedule(1);
        assert!(plan.admitted.contains(&4), "{plan:?}");
        let turn = scheduler
            .add(Request::new(5, 0, Some(9), 50, 48), 1)
            .unwrap();
        assert!(turn.withdrawn_hints.is_empty() && scheduler.request(4).is_some());
    }

    #[test]
    fn with_the_turn_hint_off_a_hint_is_a_plain_request() {
        let mut scheduler = scheduler(Switches {
            turn_hint: false,
            ..Switches::all()
        });
        scheduler
            .add(Request::new(1, 0, Some(7), 40, 1), 0)
            .unwrap();
        let turn = scheduler
            .add(Request::new(2, 0, Some(7), 50, 48), 0)
            .unwrap();
        assert!(turn.withdrawn_hints.is_empty() && scheduler.request(1).is_some());
    }

    #[test]
    fn a_short_reload_lowers_what_the_request_holds_and_the_next_plan_gives_the_rest() {
        let mut scheduler = scheduler(Switches::all());
        let mut turn = Request::new(1, 0, Some(7), 100, 8);
        turn.cached = 96;
        scheduler.add(turn, 0).unwrap();
        let plan = scheduler.schedule(0);
        assert_eq!(plan.admitted, vec![1]);
        assert_eq!(scheduler.request(1).unwrap().computed, 96);
        scheduler.reloaded(1, 64);
        scheduler.reloaded(1, 80);
        assert_eq!(scheduler.request(1).unwrap().computed, 64, "never raised");
        // The step ran nothing for it; the next one computes the other 36 tokens.
        scheduler.finish_step(&Plan::default(), 1, &[]);
        let plan = scheduler.schedule(1);
        assert_eq!(plan.prefill, vec![(1, 36)]);
    }

    #[test]
    fn a_turns_prompt_and_what_the_cache_held_of_it_are_counted_at_arrival() {
        let mut scheduler = scheduler(Switches::all());
        let mut turn = Request::new(1, 0, Some(7), 100, 8);
        turn.cached = 96;
        scheduler.add(turn, 0).unwrap();
        // Not a hint's, nor an agent's.
        scheduler
            .add(Request::new(2, 0, Some(8), 40, 1), 0)
            .unwrap();
        let mut agent = Request::new(3, 5, None, 300, 8);
        agent.cached = 200;
        scheduler.add(agent, 0).unwrap();
        let counted = &scheduler.counters;
        assert_eq!(
            (counted.turn_prompt_tokens, counted.turn_cached_tokens),
            (100, 96)
        );
    }

    #[test]
    fn a_finished_call_turn_is_retained_for_its_call() {
        let mut scheduler = scheduler(Switches::all());
        scheduler
            .add(Request::new(1, 0, Some(7), 40, 1), 0)
            .unwrap();
        let plan = scheduler.schedule(0);
        assert_eq!(scheduler.finish_step(&plan, 1, &[]), vec![1]);
        assert_eq!(scheduler.retained_turns().collect::<Vec<_>>(), vec![(7, 1)]);
        scheduler
            .add(Request::new(2, 0, Some(7), 60, 8), 1)
            .unwrap();
        let _ = scheduler.schedule(1);
        assert_eq!(
            scheduler.retained_turns().count(),
            0,
            "its next turn took it over"
        );
    }

    #[test]
    fn a_retained_turn_is_counted_in_whole_blocks() {
        let mut scheduler = Scheduler::new(PolicyConfig {
            switches: Switches::all(),
            kv_block_tokens: 16,
            ..PolicyConfig::default()
        });
        scheduler
            .add(Request::new(1, 0, Some(7), 40, 1), 0)
            .unwrap();
        let plan = scheduler.schedule(0);
        scheduler.finish_step(&plan, 1, &[]);
        assert_eq!(
            scheduler.retained_tokens(),
            48,
            "40 tokens hold three blocks"
        );
        assert_eq!(scheduler.kv_used(), 48);
    }

    #[test]
    fn a_request_more_urgent_than_the_plan_asks_for_a_new_plan_once() {
        let mut scheduler = scheduler(Switches::all());
        scheduler.add(Request::new(1, 1, None, 40, 48), 0).unwrap();
        let _ = scheduler.schedule(0);
        let same = scheduler.add(Request::new(2, 1, None, 40, 48), 0).unwrap();
        assert!(
            !same.replan_now,
            "as urgent as the plan: it waits for the step"
        );
        let voice = scheduler
            .add(Request::new(3, 0, Some(7), 40, 48), 0)
            .unwrap();
        assert!(voice.replan_now);
        let next = scheduler
            .add(Request::new(4, 0, Some(8), 40, 48), 0)
            .unwrap();
        assert!(!next.replan_now, "the plan is already being redone");
        // With priority off, the step runs out first.
        let mut stock = self::scheduler(Switches::default());
        stock.add(Request::new(1, 1, None, 40, 48), 0).unwrap();
        let _ = stock.schedule(0);
        let voice = stock.add(Request::new(2, 0, Some(7), 40, 48), 0).unwrap();
        assert!(!voice.replan_now);
    }
}
