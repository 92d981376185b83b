//! The process's allocator, set for a long-lived voice agent.
//!
//! Each call runs on threads of its own (the live loop, the responder, the early
//! transcript, ONNX Runtime's sessions), and glibc gives new threads arenas of their own,
//! up to eight per core, each keeping its high-water mark after its thread ends: resident
//! memory then grows call after call (about 80 MB a call here) though nothing leaks.
//! One arena per core is as many as can be in use at once.

/// Caps glibc's malloc arenas at one per core. Call it first thing in `main`, before any
/// thread starts; elsewhere than glibc it does nothing.
pub fn one_arena_per_core() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let arenas = i32::try_from(cores).unwrap_or(i32::MAX).max(2);
        // SAFETY: mallopt only sets a parameter of the allocator; before other threads
        // allocate, nothing observes the change midway.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
        if set != 1 {
            tracing::warn!(arenas, "glibc refused the cap on malloc arenas");
        }
    }
}

/// What the allocator holds for the program, in bytes: glibc's `mallinfo2`, the chunks in
/// use plus the blocks mapped on their own. Resident memory less this is what the
/// allocator keeps free (fragmentation, arenas' high-water marks). `None` off glibc.
pub fn heap_in_use_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}
