//! The engine's threads below the voice pipeline's while a step serves no caller.
//!
//! On a CPU the engine's steps and the voice pipeline's models (Silero VAD, Smart Turn,
//! Whisper, Piper) share the same cores. make-room orders the work inside the engine, but
//! the kernel decides between the engine's threads and the pipeline's: beside agents the
//! engine is busy with their steps whenever no turn is in it, and a caller's transcript
//! and speech share the cores with those steps. So a step that computes for no voice turn
//! runs its threads at a higher nice value, and the pipeline's threads run first; a step
//! that computes a turn runs at the process's own, since there the engine is the caller's
//! wait (lowering every step was measured too: `docs/benchmarking.md`, run 12; lowering a
//! turn's steps after its first sentence too, runs 19–20).
//!
//! Linux keeps a nice value per thread. The engine's threads here are its loop (where
//! the scheduler runs) and the compute pool (rayon's global pool, where candle's products
//! run). Raising a nice value needs no privilege; lowering it again needs `CAP_SYS_NICE`
//! or an `RLIMIT_NICE` that allows it, so the switch is tried once on a thread of its own
//! first, and where the way back is refused the engine's threads stay as they are.

use std::io;
use std::sync::{Arc, Mutex};

/// The engine's threads' priority, step by step.
pub(crate) struct ThreadPriority {
    /// The nice value of steps that serve no voice turn.
    lowered: i32,
    state: State,
    shared: SharedPriority,
}

enum State {
    /// Not yet on the engine's loop.
    Unseen,
    /// Switching, the threads kept in `shared`.
    On,
    /// Nothing to do: no lowered value asked for, or no way back from one.
    Off,
}

/// The engine's threads as any thread can reach them: a caller's request arriving raises
/// them at once ([`SharedPriority::raise`]), since the pass in flight, which it waits for,
/// may have been lowered, and on cores the voice pipeline keeps busy a lowered pass takes
/// many times its length.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedPriority(Arc<Mutex<Shared>>);

#[derive(Debug, Default)]
struct Shared {
    switching: Option<Switching>,
    /// Raised since the last step was set: the next step keeps the process's value (its
    /// plan may have been made before the request arrived).
    raised: bool,
}

/// The threads to set, the process's own value and the one they have now.
#[derive(Debug)]
struct Switching {
    threads: Vec<Tid>,
    own: i32,
    now: i32,
}

impl Switching {
    /// Sets every thread to `nice`; false (and a warning) when the kernel refuses.
    fn set(&mut self, nice: i32) -> bool {
        if nice == self.now {
            return true;
        }
        for &tid in &self.threads {
            if let Err(err) = set_nice(tid, nice) {
                tracing::warn!("the engine's threads stay at nice {}: {err}", self.now);
                return false;
            }
        }
        self.now = nice;
        true
    }
}

impl SharedPriority {
    /// A caller's request arrived: the engine's threads go back to the process's value now,
    /// and stay there for the next step.
    pub(crate) fn raise(&self) {
        let mut shared = self.0.lock().unwrap_or_else(|e| e.into_inner());
        shared.raised = true;
        if let Some(switching) = &mut shared.switching {
            let own = switching.own;
            if !switching.set(own) {
                shared.switching = None;
            }
        }
    }
}

type Tid = i32;

impl ThreadPriority {
    /// Steps that serve no voice turn run at nice value `lowered` (0: never lowered);
    /// `shared` is how other threads raise them.
    pub(crate) fn new(lowered: i32, shared: SharedPriority) -> Self {
        let mut priority = Self {
            lowered: 0,
            state: State::Off,
            shared,
        };
        priority.set_lowered(lowered);
        priority
    }

    /// The nice value of steps that serve no voice turn from now on (0: never lowered);
    /// set before the engine's loop first steps.
    pub(crate) fn set_lowered(&mut self, lowered: i32) {
        self.lowered = lowered;
        self.state = match lowered {
            0 => State::Off,
            _ => State::Unseen,
        };
    }

    /// Sets the threads for the next step, lowered if it may `yield_cores` and no caller's
    /// request arrived since the last step; called on the engine's loop.
    pub(crate) fn for_step(&mut self, yield_cores: bool) {
        if let State::Unseen = self.state {
            self.state = self.start();
        }
        if let State::Off = self.state {
            return;
        }
        let mut shared = self.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        let raised = std::mem::take(&mut shared.raised);
        let Some(switching) = &mut shared.switching else {
            self.state = State::Off;
            return;
        };
        let wanted = match yield_cores && !raised {
            true => self.lowered,
            false => switching.own,
        };
        if !switching.set(wanted) {
            shared.switching = None;
            self.state = State::Off;
        }
    }

    fn start(&self) -> State {
        let own = thread_nice();
        if self.lowered <= own {
            return State::Off;
        }
        if let Err(err) = way_back(own, self.lowered) {
            tracing::warn!(
                "the engine's threads keep the process's priority: nice {} and back to {own} \
                 is refused ({err}); it needs CAP_SYS_NICE or RLIMIT_NICE",
                self.lowered
            );
            return State::Off;
        }
        let mut threads = vec![this_thread()];
        threads.extend(rayon::broadcast(|_| this_thread()));
        let mut shared = self.shared.0.lock().unwrap_or_else(|e| e.into_inner());
        shared.switching = Some(Switching {
            threads,
            own,
            now: own,
        });
        State::On
    }
}

/// Whether a thread may go from nice `own` to `lowered` and back, tried on a thread of its
/// own.
fn way_back(own: i32, lowered: i32) -> io::Result<()> {
    std::thread::spawn(move || {
        let tid = this_thread();
        set_nice(tid, lowered)?;
        set_nice(tid, own)
    })
    .join()
    .unwrap_or_else(|_| Err(io::Error::other("the trial thread panicked")))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn this_thread() -> Tid {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn this_thread() -> Tid {
    0
}

/// The calling thread's nice value (0 off Linux).
fn thread_nice() -> i32 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: getpriority only reads; -1 is a value as well as the error return, so
        // errno is cleared first and read after.
        unsafe {
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, this_thread() as libc::id_t);
            match *libc::__errno_location() {
                0 => nice,
                _ => 0,
            }
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

fn set_nice(tid: Tid, nice: i32) -> io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: setpriority on a thread id changes only that thread (Linux keeps the
        // nice value per thread).
        let done = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (tid, nice);
    Ok(())
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn pool_nice() -> Vec<i32> {
        rayon::broadcast(|_| thread_nice())
    }

    /// Steps that serve no caller lower the loop and the pool; a caller's step, or a
    /// caller's request arriving, restores them, where the process may lower a nice value
    /// again.
    #[test]
    fn the_engines_threads_yield_in_agents_steps_and_not_in_a_callers() {
        std::thread::spawn(|| {
            let own = thread_nice();
            let shared = SharedPriority::default();
            let mut priority = ThreadPriority::new(own + 4, shared.clone());
            if way_back(own, own + 4).is_err() {
                // Without the way back, the engine's threads are never lowered.
                priority.for_step(true);
                assert_eq!(thread_nice(), own);
                assert!(pool_nice().iter().all(|n| *n == own), "{:?}", pool_nice());
                return;
            }
            priority.for_step(true);
            assert_eq!(thread_nice(), own + 4);
            assert!(
                pool_nice().iter().all(|n| *n == own + 4),
                "{:?}",
                pool_nice()
            );
            priority.for_step(false);
            assert_eq!(thread_nice(), own);
            assert!(pool_nice().iter().all(|n| *n == own), "{:?}", pool_nice());
            // A caller's request raises a lowered step's threads from another thread, and
            // the step planned next keeps them raised; the one after yields again.
            priority.for_step(true);
            let raiser = shared.clone();
            std::thread::spawn(move || raiser.raise()).join().unwrap();
            assert_eq!(thread_nice(), own);
            assert!(pool_nice().iter().all(|n| *n == own), "{:?}", pool_nice());
            priority.for_step(true);
            assert_eq!(thread_nice(), own, "the step after the request's arrival");
            priority.for_step(true);
            assert_eq!(thread_nice(), own + 4);
            priority.for_step(false);
            // With no lowered value nothing moves.
            let mut off = ThreadPriority::new(0, SharedPriority::default());
            off.for_step(true);
            assert_eq!(thread_nice(), own);
        })
        .join()
        .unwrap();
    }
}
