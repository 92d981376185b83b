//! Which part of the program a thread is allocating for.

use std::cell::Cell;

/// The parts a large block is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Owner {
    /// Anything not marked: the runtime, sockets, the agent's audio buffers.
    Other = 0,
    /// The language model engine: weights, KV, activations.
    Engine = 1,
    /// Whisper: its weights and each transcriber's state and compute buffers.
    Whisper = 2,
    /// Silero VAD and Smart Turn (ONNX Runtime).
    TurnDetector = 3,
    /// Piper (ONNX Runtime).
    Voice = 4,
}

impl Owner {
    /// Every owner, in table order.
    pub const ALL: [Owner; 5] = [
        Owner::Other,
        Owner::Engine,
        Owner::Whisper,
        Owner::TurnDetector,
        Owner::Voice,
    ];

    /// A short lowercase name, for metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Owner::Other => "other",
            Owner::Engine => "engine",
            Owner::Whisper => "whisper",
            Owner::TurnDetector => "turn_detector",
            Owner::Voice => "voice",
        }
    }

    pub(crate) fn from_index(index: u8) -> Owner {
        Owner::ALL
            .get(index as usize)
            .copied()
            .unwrap_or(Owner::Other)
    }
}

thread_local! {
    // Const-initialized and without a destructor: read on every allocation, it must never
    // allocate or register anything itself.
    static CURRENT: Cell<Owner> = const { Cell::new(Owner::Other) };
}

pub(crate) fn current() -> Owner {
    CURRENT.try_with(Cell::get).unwrap_or(Owner::Other)
}

/// Marks this thread's allocations as `owner`'s until the guard drops (then the previous
/// owner is back). Wrap a model's load and each of its runs.
pub fn owned_by(owner: Owner) -> OwnerGuard {
    let previous = CURRENT
        .try_with(|c| c.replace(owner))
        .unwrap_or(Owner::Other);
    OwnerGuard { previous }
}

/// Marks this thread's allocations as `owner`'s for the rest of its life: for a thread
/// that works for one part only (the engine's loop).
pub fn set_thread_owner(owner: Owner) {
    let _ = CURRENT.try_with(|c| c.set(owner));
}

/// Restores the thread's previous owner when dropped.
#[must_use = "the owner is only set while the guard lives"]
pub struct OwnerGuard {
    previous: Owner,
}

impl Drop for OwnerGuard {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|c| c.set(self.previous));
    }
}
