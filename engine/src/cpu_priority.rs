//! The engine's threads below the voice pipeline's while a step serves no caller.
//!
//! On a CPU the engine's steps and the voice pipeline's models (Silero VAD, Smart Turn,
//! Whisper, Piper) share the same cores. make-room orders the work inside the engine, but
//! the kernel decides between the engine's threads and the pipeline's: beside agents the
//! engine is busy with their steps whenever no turn is in it, and a caller's transcript
//! and speech share the cores with those steps. So a step that computes for no voice turn
//! runs its threads at a higher nice value, and the pipeline's threads run first; a step
//! that computes a turn runs at the process's own, since there the engine is the caller's
//! wait (lowering every step was measured too: `docs/benchmarking.md`, run 12).
//!
//! Linux keeps a nice value per thread. The engine's threads here are its loop (where
//! the scheduler runs) and the compute pool (rayon's global pool, where candle's products
//! run). Raising a nice value needs no privilege; lowering it again needs `CAP_SYS_NICE`
//! or an `RLIMIT_NICE` that allows it, so the switch is tried once on a thread of its own
//! first, and where the way back is refused the engine's threads stay as they are.

use std::io;

/// The engine's threads' priority, step by step.
pub(crate) struct ThreadPriority {
    /// The nice value of steps that serve no voice turn.
    lowered: i32,
    state: State,
}

enum State {
    /// Not yet on the engine's loop.
    Unseen,
    /// The threads to set, the process's own value and the one they have now.
    Switching {
        threads: Vec<Tid>,
        own: i32,
        now: i32,
    },
    /// Nothing to do: no lowered value asked for, or no way back from one.
    Off,
}

type Tid = i32;

impl ThreadPriority {
    /// Steps that serve no voice turn run at nice value `lowered` (0: never lowered).
    pub(crate) fn new(lowered: i32) -> Self {
        Self {
            lowered,
            state: match lowered {
                0 => State::Off,
                _ => State::Unseen,
            },
        }
    }

    /// Sets the threads for the next step, lowered if it may `yield_cores`; called on the
    /// engine's loop.
    pub(crate) fn for_step(&mut self, yield_cores: bool) {
        if let State::Unseen = self.state {
            self.state = self.start();
        }
        let State::Switching { threads, own, now } = &mut self.state else {
            return;
        };
        let wanted = if yield_cores { self.lowered } else { *own };
        if wanted == *now {
            return;
        }
        for &tid in threads.iter() {
            if let Err(err) = set_nice(tid, wanted) {
                tracing::warn!("the engine's threads stay at nice {now}: {err}");
                self.state = State::Off;
                return;
            }
        }
        *now = wanted;
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
        State::Switching {
            threads,
            own,
            now: own,
        }
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

    /// Steps that serve no caller lower the loop and the pool; a caller's step restores
    /// them, where the process may lower a nice value again.
    #[test]
    fn the_engines_threads_yield_in_agents_steps_and_not_in_a_callers() {
        std::thread::spawn(|| {
            let own = thread_nice();
            let mut priority = ThreadPriority::new(own + 4);
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
            // With no lowered value nothing moves.
            let mut off = ThreadPriority::new(0);
            off.for_step(true);
            assert_eq!(thread_nice(), own);
        })
        .join()
        .unwrap();
    }
}
