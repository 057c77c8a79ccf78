//! The command line's allocator: the system allocator, asking the kernel for
//! transparent huge pages on large allocations.
//!
//! A join's hash tables, key arrays and build columns are hundreds of MiB read at
//! random; with 4 KiB pages nearly every probe lookup also misses the TLB. Where the
//! kernel's transparent huge pages are in `madvise` mode (a common default), memory
//! is only backed by 2 MiB pages if asked for, so every allocation of at least
//! [`HUGE_MIN_BYTES`] is advised `MADV_HUGEPAGE` before it is first touched (glibc
//! serves such sizes with fresh mappings). It changes nothing else: the memory is
//! the same and is returned as before. The library leaves allocation to its users.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at least this large are advised to use huge pages.
pub const HUGE_MIN_BYTES: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

/// [`System`], advising large allocations to use transparent huge pages.
pub struct HugePageAlloc;

fn advise(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
        let end = (ptr as usize + len) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: the range lies inside an allocation this process owns; the
            // advice only changes how the kernel backs it, never its contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

// SAFETY: every call is forwarded to `System`, which upholds `GlobalAlloc`'s contract;
// `advise` does not touch the memory.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if layout.size() >= HUGE_MIN_BYTES && !ptr.is_null() {
            advise(ptr, layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // Zeroed memory from a fresh mapping is not touched by the allocator, so the
        // advice still applies to every page.
        let ptr = System.alloc_zeroed(layout);
        if layout.size() >= HUGE_MIN_BYTES && !ptr.is_null() {
            advise(ptr, layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = System.realloc(ptr, layout, new_size);
        if new_size >= HUGE_MIN_BYTES && !new.is_null() {
            advise(new, new_size);
        }
        new
    }
}
