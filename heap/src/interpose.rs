//! The wrappers [`crate::interpose_malloc!`] installs: each calls glibc's own allocator
//! (its `__libc_*` entry points, which stay reachable when `malloc` is replaced) and
//! records or forgets large blocks. Not for direct use.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use crate::owner;
use crate::record::{self, INTERPOSED, LARGE_BLOCK};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
}

fn allocated(ptr: *mut c_void, asked: usize) -> *mut c_void {
    if asked >= LARGE_BLOCK && !ptr.is_null() {
        // SAFETY: `ptr` was just returned by glibc's allocator.
        let size = unsafe { libc::malloc_usable_size(ptr) };
        record::insert(ptr as usize, size, owner::current());
    }
    ptr
}

/// Forgets `ptr` if it may be a recorded block (its usable size says whether it can be).
fn released(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` is a live block of glibc's allocator (the caller is freeing it).
    if unsafe { libc::malloc_usable_size(ptr) } >= LARGE_BLOCK {
        record::remove(ptr as usize);
    }
}

fn started() {
    if !INTERPOSED.load(Ordering::Relaxed) {
        INTERPOSED.store(true, Ordering::Relaxed);
    }
}

/// # Safety
/// As C's `malloc`.
pub unsafe fn malloc(size: usize) -> *mut c_void {
    started();
    allocated(unsafe { __libc_malloc(size) }, size)
}

/// # Safety
/// As C's `calloc`.
pub unsafe fn calloc(count: usize, size: usize) -> *mut c_void {
    started();
    let ptr = unsafe { __libc_calloc(count, size) };
    allocated(ptr, count.saturating_mul(size))
}

/// # Safety
/// As C's `realloc`.
pub unsafe fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    started();
    // Forget the old block first: glibc may hand its address back for the new one.
    let old_size = if ptr.is_null() {
        0
    } else {
        // SAFETY: `ptr` is a live block the caller is resizing.
        unsafe { libc::malloc_usable_size(ptr) }
    };
    if old_size >= LARGE_BLOCK {
        record::remove(ptr as usize);
    }
    let new = unsafe { __libc_realloc(ptr, size) };
    if new.is_null() && size != 0 && old_size >= LARGE_BLOCK {
        // Failed: the old block is still the caller's.
        record::insert(ptr as usize, old_size, owner::current());
        return new;
    }
    allocated(new, size)
}

/// # Safety
/// As C's `free`.
pub unsafe fn free(ptr: *mut c_void) {
    released(ptr);
    unsafe { __libc_free(ptr) }
}

/// # Safety
/// As C's `memalign` and `aligned_alloc`.
pub unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
    started();
    allocated(unsafe { __libc_memalign(align, size) }, size)
}

/// # Safety
/// As C's `posix_memalign`.
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    started();
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let ptr = unsafe { __libc_memalign(align, size) };
    if ptr.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid place for the result.
    unsafe { *out = allocated(ptr, size) };
    0
}

/// # Safety
/// As C's `valloc`.
pub unsafe fn valloc(size: usize) -> *mut c_void {
    started();
    allocated(unsafe { __libc_valloc(size) }, size)
}

/// # Safety
/// As C's `pvalloc`.
pub unsafe fn pvalloc(size: usize) -> *mut c_void {
    started();
    allocated(unsafe { __libc_pvalloc(size) }, size)
}
