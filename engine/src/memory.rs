//! Where the process's memory goes: the figures the engine reports of itself (weights, KV,
//! the heap a step takes for its activations and workspace) and the process-wide ones
//! they are read against (resident memory, the allocator's heap).
//!
//! The heap's peak during a step can only be seen from inside the allocator: a binary that
//! wants it installs [`CountingAllocator`] as its global allocator. Without it the step's
//! peak reads `None` and every other figure is still reported.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The system allocator, counting the bytes Rust code holds and their peak. C and C++
/// libraries (ONNX Runtime, whisper.cpp) allocate beside it and are not counted here; the
/// allocator's own figures ([`heap_figures`]) include them.
///
/// ```ignore
/// #[global_allocator]
/// static HEAP: sublet_engine::memory::CountingAllocator = sublet_engine::memory::CountingAllocator;
/// ```
pub struct CountingAllocator;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

fn grew(size: usize) {
    let now = IN_USE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed to `System` unchanged; the counters are only arithmetic.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        new
    }
}

impl CountingAllocator {
    /// Marks the counts as meaningful; `main` calls it first thing (an allocator cannot
    /// tell whether it is the global one).
    pub fn start(&self) {
        COUNTING.store(true, Ordering::Relaxed);
    }
}

/// Bytes Rust code holds now, where [`CountingAllocator`] counts them.
pub fn counted_heap() -> Option<usize> {
    COUNTING
        .load(Ordering::Relaxed)
        .then(|| IN_USE.load(Ordering::Relaxed))
}

/// A window over the counted heap's peak: each [`PeakWindow::close`] says how far the heap
/// rose above its level at the window's start, and starts the next window.
#[derive(Debug)]
pub struct PeakWindow {
    start: usize,
}

impl Default for PeakWindow {
    /// The first window opens now: what the process allocated before (a model's load)
    /// is not a step's.
    fn default() -> Self {
        let start = IN_USE.load(Ordering::Relaxed);
        PEAK.store(start, Ordering::Relaxed);
        Self { start }
    }
}

impl PeakWindow {
    /// The rise of the window that ends now (`None` without [`CountingAllocator`]). The
    /// peak is process-wide: one window at a time gives meaningful figures.
    pub fn close(&mut self) -> Option<usize> {
        let now = counted_heap()?;
        let peak = PEAK.swap(now, Ordering::Relaxed).max(now);
        let rise = peak.saturating_sub(self.start);
        self.start = now;
        Some(rise)
    }
}

/// What glibc's allocator holds, Rust's allocations and every C library's together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HeapFigures {
    /// Chunks in use in the arenas (small and mid-sized allocations).
    pub arena_in_use: u64,
    /// Chunks freed but kept by the arenas: memory the program does not use, resident
    /// unless `malloc_trim` has returned its pages (it stays counted here).
    pub arena_free: u64,
    /// Large blocks mapped on their own (freed straight back to the system); their pages
    /// count as resident only once touched.
    pub mapped: u64,
}

impl HeapFigures {
    /// Bytes allocated and not freed, however the allocator placed them.
    pub fn in_use(&self) -> u64 {
        self.arena_in_use + self.mapped
    }
}

/// The allocator's figures now (`mallinfo2`); `None` off glibc. It walks each arena's free
/// lists under their locks: for a sample, not for every step.
pub fn heap_figures() -> Option<HeapFigures> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let info = unsafe { libc::mallinfo2() };
        Some(HeapFigures {
            arena_in_use: info.uordblks as u64,
            arena_free: info.fordblks as u64,
            mapped: info.hblkhd as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

pub use sublet_heap::{peak_resident_bytes, resident_bytes};

/// A figure costly to take, taken at most once per `every` however often it is asked for,
/// the rest served from the last snapshot: the allocator's figures walk every arena under
/// its lock and the heap's block table is copied under its spin lock, so a client looping
/// on `/metrics` or the page's `/engine` would slow allocation on the voice threads.
pub struct Sampled<T> {
    every: std::time::Duration,
    last: std::sync::Mutex<Option<(std::time::Instant, T)>>,
}

impl<T: Clone> Sampled<T> {
    pub fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            last: std::sync::Mutex::new(None),
        }
    }

    /// The snapshot, taken anew by `take` if the last is `every` old (concurrent askers
    /// wait for one taking rather than each taking their own).
    pub fn get(&self, take: impl FnOnce() -> T) -> T {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some((at, value)) if at.elapsed() < self.every => value.clone(),
            _ => {
                let value = take();
                *last = Some((std::time::Instant::now(), value.clone()));
                value
            }
        }
    }
}

/// How often [`Sampled`] figures are retaken where clients may ask in a loop.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The heap that loading something took: the allocator's bytes in use after `load` less
/// before (`None` off glibc). Other threads' allocations meanwhile count too, so measure
/// loads while the process is otherwise quiet.
pub fn heap_taken_by<T>(load: impl FnOnce() -> T) -> (T, Option<u64>) {
    let before = heap_figures();
    let loaded = load();
    let after = heap_figures();
    let taken = before
        .zip(after)
        .map(|(b, a)| a.in_use().saturating_sub(b.in_use()));
    (loaded, taken)
}

/// Where the engine's memory goes, as it reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineMemory {
    /// The heap loading the model took, less the KV its warm-up left in the prefix cache:
    /// its weights as held (the quantized matrices, and the token embeddings mistral.rs
    /// dequantizes to f32), with the tokenizer (`None` off glibc).
    pub weights_bytes: Option<u64>,
    /// KV allocated by the sequences the scheduler holds, running or preempted (each
    /// keeps its own cache on the CPU, grown in steps of 512 tokens)...
    pub kv_allocated_bytes: u64,
    /// ...and of that, the bytes holding tokens.
    pub kv_used_bytes: u64,
    /// KV that mistral.rs's prefix cache keeps of finished sequences.
    pub prefix_cache_bytes: u64,
    /// The most the counted heap rose within one scheduled step, over the engine's life:
    /// the activations and workspace of its largest pass (`None` without
    /// [`CountingAllocator`]).
    pub step_peak_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_sampled_figure_is_taken_once_per_period() {
        let taken = AtomicUsize::new(0);
        let take = || taken.fetch_add(1, Ordering::SeqCst) + 1;
        let hourly = Sampled::new(Duration::from_secs(3600));
        assert_eq!(
            (hourly.get(take), hourly.get(take), hourly.get(take)),
            (1, 1, 1)
        );
        assert_eq!(taken.load(Ordering::SeqCst), 1);
        let always = Sampled::new(Duration::ZERO);
        assert_eq!((always.get(take), always.get(take)), (2, 3));
    }
}
