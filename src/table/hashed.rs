//! The hashed mode: rows chained in bucket `hash & mask`, for keys of any type and
//! spread. Its own file because it is the one mode that reads the rows' hashes, both
//! when it links them and when it is looked up.

use std::sync::Arc;

use super::{ChainedTable, Mode, MAX_TABLE_ROWS};

impl ChainedTable {
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
            buckets: Arc::new(buckets),
            next,
            mode: Mode::Hashed,
        }
    }

    /// The first row of the chain for `hash` (1-based; 0 when empty). Not for
    /// tables looked up by key ([`by_key`](Self::by_key)).
    #[inline(always)]
    pub fn first(&self, hash: u64) -> u32 {
        self.buckets[(hash & self.mask) as usize]
    }

    /// Calls `f` for each row (0-based) whose stored hash equals `hash`.
    #[inline(always)]
    pub fn for_each_candidate(
        &self,
        hash: u64,
        hashes: &[u64],
        f: impl FnMut(usize) -> std::ops::ControlFlow<()>,
    ) {
        let _ = self.for_each_candidate_from(self.first(hash), hash, hashes, true, f);
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
}
