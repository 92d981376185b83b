//! The record of large blocks: a fixed open-addressing table keyed by address, in static
//! memory, behind a spin lock (the allocation path may not allocate, and may run before
//! anything else in the process is set up).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::owner::Owner;

/// Blocks of at least this many bytes are recorded one by one; smaller ones are counted
/// together, from glibc's figures.
pub const LARGE_BLOCK: usize = 64 * 1024;

/// Slots in the table: a power of two, several times the large blocks a run here holds
/// at once (~6,000 with a full prefix cache), so probes stay short.
const SLOTS: usize = 1 << 16;
const MASK: usize = SLOTS - 1;
const OWNERS: usize = Owner::ALL.len();

#[derive(Clone, Copy)]
struct Slot {
    /// 0: empty.
    addr: usize,
    size: usize,
    owner: u8,
}

struct Table {
    slots: UnsafeCell<[Slot; SLOTS]>,
    locked: AtomicBool,
}

// SAFETY: `slots` is only touched while `locked` is held (see `Table::with`).
unsafe impl Sync for Table {}

static TABLE: Table = Table {
    slots: UnsafeCell::new(
        [Slot {
            addr: 0,
            size: 0,
            owner: 0,
        }; SLOTS],
    ),
    locked: AtomicBool::new(false),
};
static LIVE: AtomicUsize = AtomicUsize::new(0);
static ALLOCATED: [AtomicU64; OWNERS] = [const { AtomicU64::new(0) }; OWNERS];
static UNRECORDED: AtomicU64 = AtomicU64::new(0);
pub(crate) static INTERPOSED: AtomicBool = AtomicBool::new(false);

impl Table {
    fn with<T>(&self, f: impl FnOnce(&mut [Slot; SLOTS]) -> T) -> T {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held until the end of this function.
        let out = f(unsafe { &mut *self.slots.get() });
        self.locked.store(false, Ordering::Release);
        out
    }
}

fn home(addr: usize) -> usize {
    // Blocks are at least 16-byte aligned and often page-aligned: mix the bits.
    ((addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize & MASK
}

/// Records a block just allocated.
pub(crate) fn insert(addr: usize, size: usize, owner: Owner) {
    let stored = TABLE.with(|slots| {
        // Keep one slot in eight free, so that every probe ends at an empty slot.
        if LIVE.load(Ordering::Relaxed) >= SLOTS - SLOTS / 8 {
            return false;
        }
        let mut i = home(addr);
        while slots[i].addr != 0 {
            i = (i + 1) & MASK;
        }
        slots[i] = Slot {
            addr,
            size,
            owner: owner as u8,
        };
        LIVE.fetch_add(1, Ordering::Relaxed);
        ALLOCATED[owner as usize].fetch_add(size as u64, Ordering::Relaxed);
        true
    });
    if !stored {
        UNRECORDED.fetch_add(size as u64, Ordering::Relaxed);
    }
}

/// Forgets a block about to be freed; a block never recorded is ignored.
pub(crate) fn remove(addr: usize) {
    TABLE.with(|slots| {
        let mut i = home(addr);
        loop {
            if slots[i].addr == 0 {
                return;
            }
            if slots[i].addr == addr {
                break;
            }
            i = (i + 1) & MASK;
        }
        let gone = slots[i];
        ALLOCATED[gone.owner as usize].fetch_sub(gone.size as u64, Ordering::Relaxed);
        LIVE.fetch_sub(1, Ordering::Relaxed);
        // Backward-shift deletion: move later entries of the run into the hole when
        // their home does not lie (cyclically) between the hole and them.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & MASK;
            if slots[j].addr == 0 {
                break;
            }
            let k = home(slots[j].addr);
            let stays = if hole <= j {
                hole < k && k <= j
            } else {
                hole < k || k <= j
            };
            if !stays {
                slots[hole] = slots[j];
                hole = j;
            }
        }
        slots[hole].addr = 0;
    });
}

/// One owner's large blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockFigures {
    /// Bytes allocated.
    pub allocated: u64,
    /// Of those, bytes in pages the process has touched and holds in memory.
    pub resident: u64,
}

/// Every owner's large blocks at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LargeBlocks {
    by_owner: [BlockFigures; OWNERS],
    /// Bytes of large blocks allocated while the table was full (not attributed).
    pub unrecorded: u64,
}

impl LargeBlocks {
    pub fn of(&self, owner: Owner) -> BlockFigures {
        self.by_owner[owner as usize]
    }

    /// Every owner's together.
    pub fn total(&self) -> BlockFigures {
        self.by_owner
            .iter()
            .fold(BlockFigures::default(), |a, b| BlockFigures {
                allocated: a.allocated + b.allocated,
                resident: a.resident + b.resident,
            })
    }
}

/// The large blocks held now, by owner, with their resident pages; `None` unless the
/// binary called [`crate::interpose_malloc!`]. It asks the kernel about every block (a
/// few milliseconds for thousands): for a sample, not for every step.
pub fn large_blocks() -> Option<LargeBlocks> {
    if !INTERPOSED.load(Ordering::Relaxed) {
        return None;
    }
    // Copy the table out before asking the kernel, so allocations do not wait on it. A
    // block freed meanwhile is skipped (its pages read as not mapped).
    let mut blocks: Vec<(usize, usize, u8)> =
        Vec::with_capacity(LIVE.load(Ordering::Relaxed) + 1024);
    TABLE.with(|slots| {
        for slot in slots.iter().filter(|s| s.addr != 0) {
            if blocks.len() == blocks.capacity() {
                break;
            }
            blocks.push((slot.addr, slot.size, slot.owner));
        }
    });
    let mut figures = LargeBlocks {
        unrecorded: UNRECORDED.load(Ordering::Relaxed),
        ..LargeBlocks::default()
    };
    for (owner, figure) in figures.by_owner.iter_mut().enumerate() {
        figure.allocated = ALLOCATED[owner].load(Ordering::Relaxed);
    }
    for (addr, size, owner) in blocks {
        figures.by_owner[Owner::from_index(owner) as usize].resident +=
            crate::pages::resident_in(addr, size);
    }
    Some(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The table is process-wide: one test drives it, with addresses no allocator gives.
    #[test]
    fn records_and_forgets_blocks_whose_homes_collide() {
        let base = 0x7000_0000_0000usize;
        // Many addresses, some sharing a home slot, inserted and removed out of order.
        let addrs: Vec<usize> = (0..5000).map(|i| base + i * 4096 * 17).collect();
        let before = ALLOCATED[Owner::Voice as usize].load(Ordering::Relaxed);
        for &a in &addrs {
            insert(a, 100_000, Owner::Voice);
        }
        assert_eq!(
            ALLOCATED[Owner::Voice as usize].load(Ordering::Relaxed) - before,
            5000 * 100_000
        );
        for &a in addrs.iter().step_by(2) {
            remove(a);
        }
        // Every odd one is still found: remove it and the count returns to where it was.
        let found = TABLE.with(|slots| {
            addrs
                .iter()
                .skip(1)
                .step_by(2)
                .filter(|&&a| {
                    let mut i = home(a);
                    while slots[i].addr != 0 {
                        if slots[i].addr == a {
                            return true;
                        }
                        i = (i + 1) & MASK;
                    }
                    false
                })
                .count()
        });
        assert_eq!(found, 2500);
        for &a in addrs.iter().skip(1).step_by(2) {
            remove(a);
        }
        remove(base + 1); // never recorded: ignored
        assert_eq!(
            ALLOCATED[Owner::Voice as usize].load(Ordering::Relaxed),
            before
        );
    }
}
