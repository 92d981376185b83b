//! The engine's side of the scheduler: what it shows after each step, and what other
//! threads tell it (switches, callers' quiet, first sentences, callers' requests), kept in
//! one mailbox the engine's thread empties when it next plans a step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{lock, SchedulerState, Trace};
use crate::make_room;

/// The engine's side of the scheduler: its state after each step, and the news for its
/// next plan.
#[derive(Debug, Clone, Default)]
pub struct MakeRoomHandle {
    state: Arc<Mutex<SchedulerState>>,
    inbox: Arc<Mutex<Inbox>>,
    /// A test's fault: the engine thread panics when it next plans a step.
    panic_at_next_plan: Arc<AtomicBool>,
    /// The engine's threads, raised when a caller's request arrives (CPU path).
    pub(super) engine_threads: crate::cpu_priority::SharedPriority,
}

/// What other threads told the scheduler since it last planned a step.
#[derive(Debug, Default)]
struct Inbox {
    /// Switches to apply when the engine is next idle.
    switches: Option<make_room::Switches>,
    /// Calls whose reply has its first sentence.
    first_sentences: Vec<u64>,
    /// What callers did, in order.
    quiet: Vec<Quiet>,
    /// Callers' requests sent since the scheduler last took one, with their call: for the
    /// trace, since mistral.rs takes a request only between passes.
    arrivals: Vec<Arrival>,
}

/// News of a caller's quiet for the next plan: the policy's hold on agents' chunks
/// starts or ends with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quiet {
    /// The caller of this call went quiet: their turn may be coming.
    Coming(u64),
    /// The caller of this call speaks again: the turn told of is not coming yet.
    Speaking(u64),
}

/// A caller's request sent to the engine: its call, and when.
pub(super) type Arrival = (Option<u64>, Instant);

impl MakeRoomHandle {
    pub fn state(&self) -> SchedulerState {
        lock(&self.state).clone()
    }

    pub fn set_switches(&self, switches: make_room::Switches) {
        lock(&self.inbox).switches = Some(switches);
    }

    /// The call's reply has its first sentence: its hold on agents ends at the next step.
    pub fn first_sentence_out(&self, call: u64) {
        let calls = &mut lock(&self.inbox).first_sentences;
        if !calls.contains(&call) {
            calls.push(call);
        }
    }

    /// The caller of `call` went quiet: the next steps are small
    /// (`make_room::Scheduler::turn_coming`).
    pub fn turn_coming(&self, call: u64) {
        lock(&self.inbox).quiet.push(Quiet::Coming(call));
    }

    /// The caller of `call` speaks again (`make_room::Scheduler::turn_not_coming`).
    pub fn turn_not_coming(&self, call: u64) {
        lock(&self.inbox).quiet.push(Quiet::Speaking(call));
    }

    /// A caller's request (a turn or its hint) for `call`, sent at `sent`, arrived: the
    /// engine's threads go back to the process's priority now, so the pass in flight it
    /// waits for is not a lowered one.
    pub fn turn_arrived(&self, call: Option<u64>, sent: Instant) {
        self.engine_threads.raise();
        if !Trace::wanted() {
            return;
        }
        let arrivals = &mut lock(&self.inbox).arrivals;
        // Bounded: without a scheduler taking requests nothing drains them.
        if arrivals.len() < 64 {
            arrivals.push((call, sent));
        }
    }

    pub(super) fn take_arrivals(&self) -> Vec<Arrival> {
        if !Trace::wanted() {
            return Vec::new();
        }
        std::mem::take(&mut lock(&self.inbox).arrivals)
    }

    pub(super) fn take_quiet(&self) -> Vec<Quiet> {
        std::mem::take(&mut lock(&self.inbox).quiet)
    }

    /// For tests of the engine's recovery: the engine thread panics when it next plans a
    /// step, as a fault in a model or the scheduler would.
    #[doc(hidden)]
    pub fn panic_at_next_plan(&self) {
        self.panic_at_next_plan.store(true, Ordering::SeqCst);
    }

    pub(super) fn take_panic_at_next_plan(&self) -> bool {
        self.panic_at_next_plan.swap(false, Ordering::SeqCst)
    }

    pub(super) fn take_first_sentences(&self) -> Vec<u64> {
        std::mem::take(&mut lock(&self.inbox).first_sentences)
    }

    pub(super) fn take_switches(&self) -> Option<make_room::Switches> {
        lock(&self.inbox).switches.take()
    }

    pub(super) fn publish(&self, state: SchedulerState) {
        *lock(&self.state) = state;
    }
}
