//! Who holds the heap, counted by the pages it touches.
//!
//! glibc's own figures (`mallinfo2`) say how many bytes are allocated, not how many are
//! resident: whisper.cpp and ONNX Runtime allocate large buffers and touch a fraction of
//! them, so during one call the heap "in use" read 2.4 GB while the process held 0.8 GB.
//! This crate answers the two questions those figures cannot:
//!
//! - **Whose is a block?** A binary that calls [`interpose_malloc!`] replaces `malloc` and
//!   its relatives with thin wrappers around glibc's own, for Rust and every C library in
//!   the process. Each large block (≥ [`LARGE_BLOCK`] bytes) is recorded with the
//!   [`Owner`] its thread was working for when it was allocated (set by [`owned_by`] around
//!   a model's load and runs, or [`set_thread_owner`] for a thread that works for one owner
//!   only).
//! - **How much of it is resident?** [`large_blocks`] asks the kernel (`mincore`) which
//!   pages of each recorded block are in memory.
//!
//! Without the wrappers every call here is cheap and harmless: owners are still set, and
//! [`large_blocks`] returns `None`. Small blocks are not recorded one by one (their bytes
//! are glibc's figure less the large blocks'), and are taken as resident.
//!
//! Invariant: nothing on the allocation path allocates. The record of large blocks is a
//! fixed table in static memory behind a spin lock, and a full table drops records
//! (counted in [`LargeBlocks::unrecorded`]) rather than failing an allocation.

mod owner;
mod pages;
mod record;

#[doc(hidden)]
pub mod interpose;

pub use owner::{owned_by, set_thread_owner, Owner, OwnerGuard};
pub use pages::{file_backed_bytes, peak_resident_bytes, resident_bytes};
pub use record::{large_blocks, BlockFigures, LargeBlocks, LARGE_BLOCK};

/// Replaces the process's `malloc`, `calloc`, `realloc`, `free` and the aligned allocators
/// with wrappers around glibc's that record large blocks by owner. Call it once, at the
/// top level of the binary's crate (or a library every binary of a program links); on
/// anything but Linux with glibc it expands to nothing.
#[macro_export]
macro_rules! interpose_malloc {
    () => {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        const _: () = {
            use ::std::ffi::{c_int, c_void};
            use $crate::interpose as heap;

            #[no_mangle]
            pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
                unsafe { heap::malloc(size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
                unsafe { heap::calloc(count, size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
                unsafe { heap::realloc(ptr, size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn free(ptr: *mut c_void) {
                unsafe { heap::free(ptr) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn posix_memalign(
                out: *mut *mut c_void,
                align: usize,
                size: usize,
            ) -> c_int {
                unsafe { heap::posix_memalign(out, align, size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
                unsafe { heap::memalign(align, size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
                unsafe { heap::memalign(align, size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
                unsafe { heap::valloc(size) }
            }
            #[no_mangle]
            pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
                unsafe { heap::pvalloc(size) }
            }
        };
    };
}
