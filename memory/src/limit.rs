//! The default memory limit of a process that was not given one.

/// The fraction of available memory that [`default_memory_limit_bytes`] returns.
///
/// The rest is headroom for what the pool does not see: the allocator's slack, the
/// output batches a caller still holds, the binary itself, and the page cache that
/// spill files and inputs go through.
pub const DEFAULT_MEMORY_FRACTION: f64 = 0.75;

/// The smallest default limit (64 MiB), for machines that report almost nothing free.
const DEFAULT_MEMORY_FLOOR_BYTES: u64 = 64 * 1024 * 1024;

/// The default limit when the operating system cannot tell its memory (1 GiB).
const UNKNOWN_MEMORY_DEFAULT_BYTES: u64 = 1024 * 1024 * 1024;

/// The default memory limit: [`DEFAULT_MEMORY_FRACTION`] of the memory that is
/// available to this process now, at least 64 MiB.
///
/// "Available" is the operating system's estimate of memory that can be allocated
/// without swapping (`MemAvailable` on Linux), lowered to what the process's cgroup
/// still allows when it runs in a container with a memory limit. Where the operating
/// system cannot be asked, the default is 1 GiB.
pub fn default_memory_limit_bytes() -> u64 {
    let Some(available) = available_memory_bytes() else {
        return UNKNOWN_MEMORY_DEFAULT_BYTES;
    };
    let limit = (available as f64 * DEFAULT_MEMORY_FRACTION) as u64;
    limit.max(DEFAULT_MEMORY_FLOOR_BYTES)
}

/// The memory available to this process now, as [`default_memory_limit_bytes`]
/// reads it (`MemAvailable`, lowered to what the process's cgroup still allows), or
/// `None` where the operating system cannot be asked.
pub fn available_memory_bytes() -> Option<u64> {
    let mut system = sysinfo::System::new().ok()?;
    system.refresh_memory();
    let mut available = system.available_memory();
    if let Some(cgroup) = system.cgroup_limits() {
        available = available.min(cgroup.free_memory);
    }
    Some(available)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limit_is_positive_and_below_total_memory() {
        let limit = default_memory_limit_bytes();
        let mut system = sysinfo::System::new().unwrap();
        system.refresh_memory();
        assert!(limit >= DEFAULT_MEMORY_FLOOR_BYTES);
        assert!(limit <= system.total_memory().max(DEFAULT_MEMORY_FLOOR_BYTES));
    }
}
