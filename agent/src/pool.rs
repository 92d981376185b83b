//! Speech models kept loaded between calls.
//!
//! Each call needs a Piper voice, a turn detector (Silero VAD and Smart Turn) and Whisper
//! contexts of its own, since each holds state one call uses at a time. Loading them is
//! ONNX Runtime building its sessions: about half a CPU second per call, spent as the call
//! starts, while the other callers' turns need the same cores. A call takes loaded ones
//! from a [`Pool`] and gives them back when it ends; only a call that finds none idle loads.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;

/// Most loaded models of one kind kept idle: enough for the calls of a busy moment to start
/// without loading, without holding a spike's worth of memory (100–200 MB a call) forever.
pub const KEPT_IDLE: usize = 4;

/// Loaded models of one kind, shared by the calls of one agent (and its copies).
pub(crate) struct Pool<T> {
    idle: Arc<Mutex<Vec<T>>>,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self {
            idle: Arc::default(),
        }
    }
}

impl<T> Clone for Pool<T> {
    fn clone(&self) -> Self {
        Self {
            idle: Arc::clone(&self.idle),
        }
    }
}

impl<T> Pool<T> {
    /// An idle one, or a new one from `load` when none is idle.
    pub(crate) fn take(&self, load: impl FnOnce() -> Result<T>) -> Result<Pooled<T>> {
        let kept = lock(&self.idle).pop();
        let item = match kept {
            Some(item) => item,
            None => load()?,
        };
        Ok(Pooled {
            item: Some(item),
            home: Arc::clone(&self.idle),
        })
    }

    /// How many are idle now.
    pub(crate) fn idle(&self) -> usize {
        lock(&self.idle).len()
    }
}

/// A model one call uses; back to its pool when dropped.
pub struct Pooled<T> {
    /// `None` only while it is being dropped.
    item: Option<T>,
    home: Arc<Mutex<Vec<T>>>,
}

impl<T> Deref for Pooled<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item.as_ref().expect("held until dropped")
    }
}

impl<T> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item.as_mut().expect("held until dropped")
    }
}

impl<T> Drop for Pooled<T> {
    fn drop(&mut self) {
        let Some(item) = self.item.take() else {
            return;
        };
        let mut idle = lock(&self.home);
        if idle.len() < KEPT_IDLE {
            idle.push(item);
            return;
        }
        drop(idle);
        drop(item);
    }
}

/// A panic while a lock was held leaves only a list of whole models behind.
fn lock<T>(idle: &Mutex<Vec<T>>) -> MutexGuard<'_, Vec<T>> {
    idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_given_back_is_taken_again_without_loading() {
        let pool = Pool::default();
        let mut loads = 0;
        let first = pool
            .take(|| {
                loads += 1;
                Ok(7)
            })
            .unwrap();
        assert_eq!(*first, 7);
        assert_eq!(pool.idle(), 0);
        drop(first);
        assert_eq!(pool.idle(), 1);
        let again = pool.take(|| unreachable!("one is idle")).unwrap();
        assert_eq!(*again, 7);
        assert_eq!(loads, 1);
    }

    #[test]
    fn calls_at_once_each_load_and_at_most_kept_idle_stay() {
        let pool = Pool::default();
        let held: Vec<_> = (0..KEPT_IDLE + 2)
            .map(|n| pool.take(|| Ok(n)).unwrap())
            .collect();
        let mut seen: Vec<_> = held.iter().map(|p| **p).collect();
        seen.dedup();
        assert_eq!(seen.len(), KEPT_IDLE + 2, "each call its own model");
        drop(held);
        assert_eq!(pool.idle(), KEPT_IDLE);
    }

    #[test]
    fn a_failed_load_takes_nothing() {
        let pool: Pool<u8> = Pool::default();
        assert!(pool.take(|| anyhow::bail!("no model")).is_err());
        assert_eq!(pool.idle(), 0);
    }
}
