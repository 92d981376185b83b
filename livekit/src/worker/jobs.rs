//! The worker's count of its calls, as plain rules over offers, assignments and ends, so
//! that the load it reports and the offers it takes stay honest whatever the server does:
//!
//! - An offer taken counts toward the load until its assignment comes, or until
//!   [`OFFER_TIMEOUT`] passes without one (the server gave the job to another worker, or
//!   lost it): then its slot is free again.
//! - An assignment starts a call only once: a job id already running is refused, so a
//!   duplicate cannot orphan the first call's hang-up switch. One that was not offered,
//!   or whose offer timed out, starts only if the worker has room and is not draining.
//! - A call counts until its thread reports it ended, however it ended.
//! - Draining declines every offer and assignment; it is complete once no call runs.
//!
//! Time is passed in, so the rules are tested without waiting.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long an accepted offer waits for its assignment (LiveKit's own workers wait 7.5 s).
pub(crate) const OFFER_TIMEOUT: Duration = Duration::from_millis(7500);

/// Why an assignment did not start a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A call with that job id is already running.
    Duplicate,
    /// Not offered (or its offer timed out) and the worker is at `max_calls`.
    Full,
    Draining,
}

impl Refusal {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::Duplicate => "a call for this job is already running on this worker",
            Refusal::Full => "the worker was not offered this job and has no room for it",
            Refusal::Draining => "the worker is draining",
        }
    }
}

/// The calls a worker has taken on.
#[derive(Debug)]
pub(crate) struct Jobs {
    max_calls: usize,
    offer_timeout: Duration,
    /// Offers accepted and not yet assigned, with when each was accepted.
    offered: HashMap<String, Instant>,
    running: HashSet<String>,
    draining: bool,
    declined: usize,
}

impl Jobs {
    pub(crate) fn new(max_calls: usize, offer_timeout: Duration) -> Self {
        Self {
            max_calls,
            offer_timeout,
            offered: HashMap::new(),
            running: HashSet::new(),
            draining: false,
            declined: 0,
        }
    }

    /// Calls running and offers awaiting their assignment, at `now`.
    pub(crate) fn load(&mut self, now: Instant) -> usize {
        self.expire(now);
        self.running.len() + self.offered.len()
    }

    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn full(&mut self, now: Instant) -> bool {
        self.draining || self.load(now) >= self.max_calls
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// Offers declined so far.
    pub(crate) fn declined(&self) -> usize {
        self.declined
    }

    /// Whether to take the job offered; a job taken holds a slot until it is assigned or
    /// its offer times out.
    pub(crate) fn offer(&mut self, job_id: &str, now: Instant) -> bool {
        if self.full(now) || self.running.contains(job_id) {
            self.declined += 1;
            return false;
        }
        self.offered.insert(job_id.to_owned(), now);
        true
    }

    /// Whether the assignment of `job_id` starts a call.
    pub(crate) fn assign(&mut self, job_id: &str, now: Instant) -> Result<(), Refusal> {
        self.expire(now);
        if self.running.contains(job_id) {
            return Err(Refusal::Duplicate);
        }
        let was_offered = self.offered.remove(job_id).is_some();
        if self.draining {
            return Err(Refusal::Draining);
        }
        if !was_offered && self.running.len() + self.offered.len() >= self.max_calls {
            return Err(Refusal::Full);
        }
        self.running.insert(job_id.to_owned());
        Ok(())
    }

    /// The call of `job_id` ended (answered, failed or panicked).
    pub(crate) fn ended(&mut self, job_id: &str) {
        self.running.remove(job_id);
    }

    pub(crate) fn drain(&mut self) {
        self.draining = true;
    }

    /// Draining, and no call runs any more.
    pub(crate) fn drained(&self) -> bool {
        self.draining && self.running.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        let timeout = self.offer_timeout;
        self.offered
            .retain(|_, at| now.saturating_duration_since(*at) < timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(max_calls: usize) -> (Jobs, Instant) {
        (Jobs::new(max_calls, OFFER_TIMEOUT), Instant::now())
    }

    #[test]
    fn an_offer_never_assigned_frees_its_slot_after_the_timeout() {
        let (mut jobs, t0) = jobs(1);
        assert!(jobs.offer("a", t0));
        // Held: the worker is full while the assignment may still come.
        assert!(!jobs.offer("b", t0 + Duration::from_secs(1)));
        assert_eq!(jobs.load(t0 + Duration::from_secs(7)), 1);
        // Never assigned: the slot is free again.
        let later = t0 + OFFER_TIMEOUT;
        assert_eq!(jobs.load(later), 0);
        assert!(jobs.offer("c", later));
        assert_eq!(jobs.declined(), 1);
    }

    #[test]
    fn an_assignment_starts_one_call_once() {
        let (mut jobs, t0) = jobs(2);
        assert!(jobs.offer("a", t0));
        assert_eq!(jobs.assign("a", t0), Ok(()));
        assert_eq!(jobs.assign("a", t0), Err(Refusal::Duplicate));
        assert_eq!((jobs.running(), jobs.load(t0)), (1, 1));
        // An offer for a job already running is declined too.
        assert!(!jobs.offer("a", t0));
    }

    #[test]
    fn an_unoffered_or_late_assignment_starts_only_with_room() {
        let (mut jobs, t0) = jobs(1);
        // Late (its offer timed out), with room: taken, the caller is waiting.
        assert!(jobs.offer("a", t0));
        assert_eq!(jobs.assign("a", t0 + Duration::from_secs(9)), Ok(()));
        // Never offered, and no room: refused.
        assert_eq!(jobs.assign("b", t0), Err(Refusal::Full));
        assert_eq!(jobs.running(), 1);
        jobs.ended("a");
        assert_eq!(jobs.assign("b", t0), Ok(()));
    }

    #[test]
    fn a_drain_declines_everything_and_completes_when_the_calls_end() {
        let (mut jobs, t0) = jobs(3);
        assert!(jobs.offer("a", t0));
        assert_eq!(jobs.assign("a", t0), Ok(()));
        assert!(jobs.offer("b", t0));
        jobs.drain();
        assert!(jobs.full(t0) && !jobs.offer("c", t0));
        // An offer taken before the drain is not started after it, nor waited for.
        assert_eq!(jobs.assign("b", t0), Err(Refusal::Draining));
        assert!(!jobs.drained());
        jobs.ended("a");
        assert!(jobs.drained());
        // A call that failed or panicked ends the same way: ended, then drained.
        let (mut other, t0) = (Jobs::new(1, OFFER_TIMEOUT), t0);
        assert!(other.offer("x", t0));
        assert_eq!(other.assign("x", t0), Ok(()));
        other.drain();
        other.ended("x");
        assert!(other.drained() && other.load(t0) == 0);
    }
}
