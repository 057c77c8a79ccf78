//! The command line's allocator policy: the system allocator, asking the kernel for
//! transparent huge pages on large allocations, and handing freed memory back to the
//! kernel when the join changes phase.
//!
//! A join's hash tables, key arrays and build columns are hundreds of MiB read at
//! random; with 4 KiB pages nearly every probe lookup also misses the TLB. Where the
//! kernel's transparent huge pages are in `madvise` mode (a common default), memory
//! is only backed by 2 MiB pages if asked for, so every allocation of at least
//! [`HUGE_MIN_BYTES`] is advised `MADV_HUGEPAGE` before it is first touched (glibc
//! serves such sizes with fresh mappings). It changes nothing else: the memory is
//! the same and is returned as before. The library leaves allocation to its users.
//!
//! glibc keeps freed small blocks (a build's per-batch partition fragments, thousands
//! of a few KiB each, freed when partitions are concatenated or spilled; builds of
//! fixed-width columns gather in place and make none) in its heap,
//! where they count in the process's RSS although the join has released them. At each
//! phase change ([`ReleaseOnPhaseChange`]) `malloc_trim` returns such free pages, so
//! RSS follows what the join's memory pool holds.

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

/// Keeps glibc from handing freed memory back to the kernel at every free, for a join
/// run without `--memory-limit` (under the default limit, most of the machine's
/// memory, whose bound's slack a few dozen MiB kept free do not matter): its output
/// makes glibc do that at every batch (the
/// coalescer's string blocks of 8 KiB to 1 MiB, and the gathered partitions' buffers,
/// came from fresh mappings or from a heap top trimmed as soon as they were freed,
/// and each was faulted in and zeroed again: joins with string columns spent a
/// large share of their time in page faults). Allocations below [`HUGE_MIN_BYTES`]
/// then come from the heap, and up to [`TRIM_THRESHOLD_BYTES`] of free memory stays
/// at its top. Under a limit the RSS bound comes first: the freed memory kept, and
/// the heap's fragmentation, took joins of wide rows under small limits past it, so
/// glibc keeps its own thresholds there.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes the allocator's thresholds (under its lock).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HUGE_MIN_BYTES as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES as libc::c_int);
    }
}

/// The free memory glibc keeps at the top of its heap before it trims, with no limit
/// ([`keep_freed_memory`]).
pub const TRIM_THRESHOLD_BYTES: usize = 64 << 20;

/// Returns free heap memory to the kernel (glibc's `malloc_trim`).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A thread that calls [`release_free_memory`] when a running join changes phase
/// (build, probe, spilled partitions), and in between whenever the process's resident
/// memory nears the bound `1.1 × limit + 64 MiB` (checked every [`TRIM_INTERVAL`]).
///
/// A build that spills frees thousands of small fragments as it goes, which glibc
/// keeps: untrimmed, the peak RSS runs far past what the pool holds. The RSS rises
/// fast while partitions are finished, so it is checked often (every 5 ms held the
/// peak lower than every 25 ms), and reading `/proc/self/statm` costs microseconds.
/// Trimming has no use far from the bound, and a freed page that is trimmed must be
/// faulted in and zeroed again when reused, so it is done only when the RSS is within
/// [`trim_margin`] of the bound. A join's heap holds more than its live memory: what
/// its threads freed since the last trim and are about to reuse. Trimming that
/// working set away over and over costs more than the trim saves: within 24 MiB, SF1
/// orders ⋈ lineitem with every column under 46 MiB took 2.4 s with 380,000 page
/// faults (100,000 untrimmed); within 12 MiB, 1.8 s and 190,000, its peak RSS
/// 106 MiB against a bound of 115.
pub struct ReleaseOnPhaseChange {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How far below the bound `1.1 × limit + 64 MiB` the resident memory is trimmed under
/// `limit_bytes`: room for what the join's threads touch in one [`TRIM_INTERVAL`],
/// which grows with the limit (the engine's pieces and batches are shares of it):
/// 10 MiB and a thirty-second of the limit. With 12 MiB for every limit, wide rows
/// (2 KB) under 256 MiB peaked 0.3 MiB below the bound.
pub fn trim_margin(limit_bytes: u64) -> u64 {
    (10 << 20) + limit_bytes / 32
}

/// How often the resident memory is checked while a join runs.
pub const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

impl ReleaseOnPhaseChange {
    /// Starts watching `metrics`; the join runs under `limit_bytes`.
    pub fn start(metrics: spilljoin::MetricsHandle, limit_bytes: u64) -> Self {
        use std::sync::atomic::Ordering;
        let bound = limit_bytes.saturating_add(limit_bytes / 10 + (64 << 20));
        let threshold = bound.saturating_sub(trim_margin(limit_bytes));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("spilljoin-trim".into())
            .spawn(move || {
                let mut phase = metrics.metrics().phase;
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TRIM_INTERVAL);
                    let now = metrics.metrics().phase;
                    if now != phase || resident_bytes().is_some_and(|rss| rss > threshold) {
                        release_free_memory();
                        phase = now;
                    }
                }
            })
            .ok();
        Self { stop, thread }
    }
}

/// The process's resident memory (Linux: `/proc/self/statm`), if known.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

impl Drop for ReleaseOnPhaseChange {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
