//! Visited bits: which build rows some probe row matched, for the joins that output
//! build rows at the end (outer, semi, anti, mark, not-in on the build side). Their
//! own file because they are what every probe worker writes at once without a lock:
//! one bit per build row, set with relaxed atomics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Visited bits of one partition's build rows, set by many probe threads at once.
#[derive(Debug)]
pub(crate) struct VisitedBits {
    words: Vec<AtomicU64>,
}

impl VisitedBits {
    pub(super) fn new(rows: usize) -> Self {
        Self {
            words: (0..rows.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn bytes_for(rows: usize) -> usize {
        rows.div_ceil(64) * 8
    }

    #[inline]
    pub(super) fn set(&self, row: usize) {
        let bit = 1u64 << (row % 64);
        let word = &self.words[row / 64];
        // Skip the atomic write when the bit is set already (hot keys).
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Sets the bit and says whether it was set already.
    #[inline]
    pub(super) fn test_and_set(&self, row: usize) -> bool {
        let bit = 1u64 << (row % 64);
        let word = &self.words[row / 64];
        word.load(Ordering::Relaxed) & bit != 0 || word.fetch_or(bit, Ordering::Relaxed) & bit != 0
    }

    pub(super) fn get(&self, row: usize) -> bool {
        self.words[row / 64].load(Ordering::Relaxed) & (1 << (row % 64)) != 0
    }
}
