//! The hash table of one build partition: chained row indices.
//!
//! ```text
//!  build rows:  0    1    2    3    4          hashes kept beside the rows
//!  keys:        7    9    7    3    7
//!  buckets[h(k) & mask] holds 1 + the last row inserted with that bucket (0 = empty)
//!  next[row] holds 1 + the previous row in the same bucket (0 = end of chain)
//!
//!  buckets[h(7)] = 5 ─► row 4 ─next─► row 2 ─next─► row 0 ─next─► end
//! ```
//!
//! A lookup walks the chain of its bucket, comparing the stored 64-bit hash first and
//! the key only when the hashes are equal. Two flat `u32` arrays make the table's size
//! a formula, known before anything is allocated: [`ChainedTable::size_for`].

/// Buckets per build row, rounded up to a power of two: a load factor of at most 0.5
/// keeps chains short for unique keys (measured in `benches/kernels.rs`, "probe").
const BUCKETS_PER_ROW: usize = 2;

/// The most rows one table can index (row ids are `u32`, and 0 means "none").
pub const MAX_TABLE_ROWS: usize = u32::MAX as usize - 1;

/// A chained hash table over the rows of one partition.
#[derive(Debug)]
pub struct ChainedTable {
    mask: u64,
    buckets: Vec<u32>,
    next: Vec<u32>,
}

impl ChainedTable {
    /// The bytes a table over `num_rows` rows holds.
    pub fn size_for(num_rows: usize) -> usize {
        (Self::bucket_count(num_rows) + num_rows) * std::mem::size_of::<u32>()
    }

    fn bucket_count(num_rows: usize) -> usize {
        (num_rows * BUCKETS_PER_ROW).next_power_of_two().max(1)
    }

    /// Indexes the rows whose `insert(row)` is true, by their hashes.
    ///
    /// # Panics
    /// If there are more than [`MAX_TABLE_ROWS`] rows; callers split partitions first.
    pub fn build(hashes: &[u64], insert: impl Fn(usize) -> bool) -> Self {
        assert!(
            hashes.len() <= MAX_TABLE_ROWS,
            "partition too large for one table"
        );
        let bucket_count = Self::bucket_count(hashes.len());
        let mask = bucket_count as u64 - 1;
        let mut buckets = vec![0u32; bucket_count];
        let mut next = vec![0u32; hashes.len()];
        for (row, &hash) in hashes.iter().enumerate() {
            if insert(row) {
                let bucket = &mut buckets[(hash & mask) as usize];
                next[row] = *bucket;
                *bucket = row as u32 + 1;
            }
        }
        Self {
            mask,
            buckets,
            next,
        }
    }

    /// The bytes this table holds.
    pub fn size(&self) -> usize {
        (self.buckets.capacity() + self.next.capacity()) * std::mem::size_of::<u32>()
    }

    /// The first row of the chain for `hash` (1-based; 0 when empty).
    #[inline(always)]
    pub fn first(&self, hash: u64) -> u32 {
        self.buckets[(hash & self.mask) as usize]
    }

    /// The row after `row` (0-based) in its chain (1-based; 0 at the end).
    #[inline(always)]
    pub fn next(&self, row: usize) -> u32 {
        self.next[row]
    }

    /// Calls `f` for each row (0-based) whose stored hash equals `hash`.
    #[inline(always)]
    pub fn for_each_candidate(
        &self,
        hash: u64,
        hashes: &[u64],
        f: impl FnMut(usize) -> std::ops::ControlFlow<()>,
    ) {
        self.for_each_candidate_from(self.first(hash), hash, hashes, true, f)
    }

    /// Looks up the first entries of many hashes at once. The loads are independent,
    /// so the processor overlaps their cache misses; walking the chains afterwards
    /// ([`for_each_candidate_from`](Self::for_each_candidate_from)) then starts from
    /// entries already loaded.
    #[inline]
    pub fn first_entries(&self, hashes: impl Iterator<Item = u64>, out: &mut Vec<u32>) {
        out.clear();
        out.extend(hashes.map(|h| self.first(h)));
    }

    /// Asks the processor to start loading row `row`'s chain link, which a walk from
    /// `row + 1` will read (a hint: it never faults and changes nothing).
    #[inline(always)]
    pub fn prefetch_link(&self, row: usize) {
        if let Some(link) = self.next.get(row) {
            prefetch(link);
        }
    }

    /// Like [`for_each_candidate`](Self::for_each_candidate), from a first entry
    /// already looked up. With `check_hash` false every row of the chain is a
    /// candidate (the caller compares keys, which implies equal hashes).
    #[inline(always)]
    pub fn for_each_candidate_from(
        &self,
        first: u32,
        hash: u64,
        hashes: &[u64],
        check_hash: bool,
        mut f: impl FnMut(usize) -> std::ops::ControlFlow<()>,
    ) {
        let mut entry = first;
        while entry != 0 {
            let row = entry as usize - 1;
            if (!check_hash || hashes[row] == hash) && f(row).is_break() {
                return;
            }
            entry = self.next(row);
        }
    }
}

/// A prefetch hint for the cache line holding `value`.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults and has no visible effect;
        // the pointer comes from a live reference anyway. SSE is part of the x86_64
        // baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::ControlFlow;

    #[test]
    fn finds_every_duplicate_and_skips_excluded_rows() {
        let hashes = [7u64, 9, 7, 3, 7, 7];
        let table = ChainedTable::build(&hashes, |row| row != 5);
        let mut found = vec![];
        table.for_each_candidate(7, &hashes, |row| {
            found.push(row);
            ControlFlow::Continue(())
        });
        found.sort();
        assert_eq!(found, [0, 2, 4]);
        let mut first = vec![];
        table.for_each_candidate(7, &hashes, |row| {
            first.push(row);
            ControlFlow::Break(())
        });
        assert_eq!(first.len(), 1);
        table.for_each_candidate(42, &hashes, |_| panic!("no such hash"));
        assert_eq!(table.size(), ChainedTable::size_for(hashes.len()));
    }
}
