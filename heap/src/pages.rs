//! What the kernel says is in memory.

/// Bytes of `[addr, addr + len)` in resident pages (whole pages, so a page shared with a
/// neighbouring block counts for both); 0 where the range is not mapped any more.
pub(crate) fn resident_in(addr: usize, len: usize) -> u64 {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        // One status byte per page; a buffer on the stack, asked about in pieces.
        const PER_CALL: usize = 4096;
        let start = addr & !(PAGE - 1);
        let end = (addr + len).div_ceil(PAGE) * PAGE;
        let mut status = [0u8; PER_CALL];
        let mut resident = 0u64;
        let mut at = start;
        while at < end {
            let pages = ((end - at) / PAGE).min(PER_CALL);
            // SAFETY: `mincore` only reads the page tables and writes `pages` bytes.
            let ok = unsafe {
                libc::mincore(
                    at as *mut libc::c_void,
                    pages * PAGE,
                    status.as_mut_ptr().cast(),
                )
            } == 0;
            if !ok {
                return resident;
            }
            let here = status[..pages].iter().filter(|s| *s & 1 == 1).count();
            resident += (here * PAGE) as u64;
            at += pages * PAGE;
        }
        resident
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (addr, len);
        0
    }
}

/// Fields of `/proc/self/status`, in bytes, read in one pass.
fn status_bytes<const N: usize>(fields: [&str; N]) -> Option<[u64; N]> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let mut out = [0u64; N];
    for (value, field) in out.iter_mut().zip(fields) {
        let line = status.lines().find(|l| l.starts_with(field))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        *value = kb * 1024;
    }
    Some(out)
}

/// The process's resident memory (Linux's `VmRSS`), else `None`.
pub fn resident_bytes() -> Option<u64> {
    status_bytes(["VmRSS:"]).map(|[rss]| rss)
}

/// The process's peak resident memory so far (Linux's `VmHWM`), else `None`.
pub fn peak_resident_bytes() -> Option<u64> {
    status_bytes(["VmHWM:"]).map(|[peak]| peak)
}

/// Resident pages backed by files or shared memory (Linux's `RssFile` + `RssShmem`): the
/// program's code, its libraries, any file mapped in.
pub fn file_backed_bytes() -> Option<u64> {
    status_bytes(["RssFile:", "RssShmem:"]).map(|[file, shmem]| file + shmem)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn counts_only_the_pages_touched() {
        let len = 64 * 4096;
        // SAFETY: a fresh private anonymous mapping, unmapped at the end.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let block = addr.cast::<u8>();
        assert_eq!(resident_in(addr as usize, len), 0);
        for page in 0..16 {
            // SAFETY: within the mapping.
            unsafe { block.add(page * 4096 + 100).write(1) };
        }
        assert_eq!(resident_in(addr as usize + 10, len - 10), 16 * 4096);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(addr, len) };
        assert_eq!(resident_in(addr as usize, len), 0);
        assert!(file_backed_bytes().unwrap() > 0);
    }
}
