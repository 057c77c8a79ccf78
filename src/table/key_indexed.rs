//! The key-indexed mode: bucket `key - min` holds the chain of one-word key `key`
//! alone, so a lookup compares no key. Its own file for what only this mode does:
//! one index shared by the partitions of a build, linked by several threads at once
//! through an atomic view of the shared buckets.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

use super::{word_range, ChainedTable, Mode, MORE};

impl ChainedTable {
    /// The smallest key and the span (`max - min`) of one-word keys, if a table
    /// indexed by key suits them: the span is under twice the buckets a hashed table of
    /// as many rows would have (in a partition of a hash-partitioned build the keys
    /// of a dense column span the fan-out times its rows). The table then holds
    /// [`direct_size_for`](Self::direct_size_for) bytes.
    pub fn direct_span(words: &[u64]) -> Option<(u64, u64)> {
        Self::shared_direct_span(&[words])
    }

    /// The bytes a key-indexed table of `rows` rows whose keys span `span` holds.
    pub fn direct_size_for(span: u64, rows: usize) -> usize {
        (span as usize + 1 + rows) * std::mem::size_of::<u32>()
    }

    /// A table indexed by key (bucket `key - min`) over one-word keys whose
    /// [`direct_span`](Self::direct_span) is `(min, span)`. Every row is inserted: rows
    /// whose key can never match must not be in `words`; words outside
    /// `min..=min + span` (a caller's bug) are left out.
    pub fn build_direct(words: &[u64], min: u64, span: u64) -> Self {
        let mut buckets = vec![0u32; span as usize + 1];
        let next = link_direct(words, min, atomic_view(&mut buckets));
        Self {
            mask: 0,
            buckets: Arc::new(buckets),
            next,
            mode: Mode::KeyIndexed { min },
        }
    }

    /// The smallest key and the span of the keys of several partitions (`words` each),
    /// if one key index over all of them suits them (as
    /// [`direct_span`](Self::direct_span), for their rows together).
    pub fn shared_direct_span(words: &[&[u64]]) -> Option<(u64, u64)> {
        let rows: usize = words.iter().map(|w| w.len()).sum();
        let (min, max) = word_range(words.iter().flat_map(|w| w.iter().copied()))?;
        let span = max - min;
        (Self::direct_suits(span, rows) && words.iter().all(|w| w.len() < MORE as usize))
            .then_some((min, span))
    }

    /// Whether keys spanning `span` suit a key index over `rows` rows: the span is
    /// under twice the buckets a hashed table of as many rows would have.
    pub(super) fn direct_suits(span: u64, rows: usize) -> bool {
        span < 2 * Self::bucket_count(rows) as u64
    }

    /// One key index over the rows of several partitions, as one table per
    /// partition: they share the buckets (indexed by `key - min`, holding a row of
    /// the one partition that has the key: equal keys hash alike, so they are never
    /// in two partitions) and each has its own links. `(min, span)` is
    /// [`shared_direct_span`](Self::shared_direct_span) of `words`. `threads` link
    /// partitions at once: no two write the same bucket (were a key in two partitions,
    /// its chains would be wrong, never unsafe). Words outside `min..=min + span` (a
    /// caller's bug) are left out.
    pub fn build_shared_direct(words: &[&[u64]], min: u64, span: u64, threads: usize) -> Vec<Self> {
        let mut buckets = vec![0u32; span as usize + 1];
        let nexts: Vec<std::sync::Mutex<Vec<u32>>> =
            words.iter().map(|_| std::sync::Mutex::default()).collect();
        {
            let shared = atomic_view(&mut buckets);
            let claimed = AtomicUsize::new(0);
            std::thread::scope(|scope| {
                for _ in 0..threads.clamp(1, words.len().max(1)) {
                    scope.spawn(|| loop {
                        let p = claimed.fetch_add(1, Ordering::Relaxed);
                        let Some(words) = words.get(p) else {
                            return;
                        };
                        let next = link_direct(words, min, shared);
                        if let Ok(mut slot) = nexts[p].lock() {
                            *slot = next;
                        }
                    });
                }
            });
        }
        let buckets = Arc::new(buckets);
        nexts
            .into_iter()
            .map(|next| Self {
                mask: 0,
                buckets: Arc::clone(&buckets),
                next: next.into_inner().unwrap_or_else(|e| e.into_inner()),
                mode: Mode::KeyIndexed { min },
            })
            .collect()
    }

    /// In a key-indexed table, the first entry of `word`'s chain (0 when none).
    #[inline(always)]
    pub fn first_direct(&self, word: u64) -> u32 {
        let min = match self.mode {
            Mode::KeyIndexed { min } => min,
            _ => 0,
        };
        let offset = word.wrapping_sub(min);
        match usize::try_from(offset) {
            Ok(i) => self.buckets.get(i).copied().unwrap_or(0),
            Err(_) => 0,
        }
    }
}

/// `buckets` as atomics, for threads that each write buckets of their own.
fn atomic_view(buckets: &mut [u32]) -> &[AtomicU32] {
    // SAFETY: `AtomicU32` has the size, alignment and bit validity of `u32`, and
    // `buckets` is borrowed mutably for as long as the view lives, so every access
    // meanwhile goes through it.
    unsafe { &*(buckets as *mut [u32] as *const [AtomicU32]) }
}

/// Links one partition's rows into the shared buckets of a key index: the buckets of
/// its keys are its own (other partitions hold other keys), so relaxed loads and
/// stores suffice. Returns the partition's links.
fn link_direct(words: &[u64], min: u64, buckets: &[AtomicU32]) -> Vec<u32> {
    let mut next = vec![0u32; words.len()];
    for (row, &word) in words.iter().enumerate() {
        let Some(bucket) = usize::try_from(word.wrapping_sub(min))
            .ok()
            .and_then(|i| buckets.get(i))
        else {
            continue;
        };
        let previous = bucket.load(Ordering::Relaxed) & !MORE;
        next[row] = previous;
        bucket.store(
            (row as u32 + 1) | if previous != 0 { MORE } else { 0 },
            Ordering::Relaxed,
        );
    }
    next
}
