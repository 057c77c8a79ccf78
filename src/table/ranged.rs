//! The mode bucketed by key value: bucket `(key - min) >> shift` holds the chain of
//! one-word key `key` and its neighbours, for keys too spread out for a key index
//! but spread evenly. Its own file for the test of that spread (chain lengths and
//! the mean walk), made before anything is linked.

use std::sync::Arc;

use super::{word_range, ChainedTable, Mode, MORE};

/// The longest chain a table bucketed by key value may have
/// ([`ChainedTable::build_ranged`]); a hashed table of unique keys at a load factor of
/// 0.5 rarely has chains of more than 10.
pub const RANGED_MAX_CHAIN: u32 = 64;
// `ChainedTable::build_ranged` counts a chain's rows in a byte.
const _: () = assert!(RANGED_MAX_CHAIN <= u8::MAX as u32);

/// The most rows a lookup of a build row's key may walk on average in a table bucketed
/// by key value (the sum of its chains' squared lengths over its rows): 1.25 in a
/// hashed table of unique keys at a load factor of 0.5, 1.5 for the keys of one
/// partition of a dense column.
pub const RANGED_MAX_MEAN_WALK: f64 = 3.0;

impl ChainedTable {
    /// A table of one-word keys bucketed by value ([`ChainedTable`], "clustered
    /// keys"), if their values spread evenly enough: no chain longer than
    /// [`RANGED_MAX_CHAIN`] and at most [`RANGED_MAX_MEAN_WALK`] rows walked on
    /// average. Every row is inserted: rows whose key can never match must not be in
    /// `words`. It holds at most [`size_for`](Self::size_for) bytes.
    pub fn build_ranged(words: &[u64]) -> Option<Self> {
        let (min, max) = word_range(words.iter().copied())?;
        Self::ranged_in(words, min, max)
    }

    /// [`build_ranged`](Self::build_ranged) of `words`, whose smallest and largest
    /// values are `min` and `max`.
    pub(super) fn ranged_in(words: &[u64], min: u64, max: u64) -> Option<Self> {
        if words.is_empty() || words.len() >= MORE as usize {
            return None;
        }
        let span = max - min;
        let limit = Self::bucket_count(words.len()) as u64;
        // The smallest shift that fits the span into `limit` buckets.
        let shift = (0..64u32).find(|&s| (span >> s) < limit).unwrap_or(63);
        let bucket_count = usize::try_from(span >> shift).ok()? + 1;
        // First count each chain's rows, to judge the spread before linking: in a
        // byte a bucket (no chain may pass RANGED_MAX_CHAIN), a quarter of the
        // buckets' memory, freed before they are allocated.
        let mut counts = vec![0u8; bucket_count];
        let mut walk = 0u64;
        for &word in words {
            let count = &mut counts[((word - min) >> shift) as usize];
            if u32::from(*count) == RANGED_MAX_CHAIN {
                return None;
            }
            // (c + 1)² - c² = 2c + 1: the sum of squared chain lengths so far.
            walk += 2 * u64::from(*count) + 1;
            *count += 1;
        }
        drop(counts);
        if walk as f64 > RANGED_MAX_MEAN_WALK * words.len() as f64 {
            return None;
        }
        let mut buckets = vec![0u32; bucket_count];
        // Every row is linked, so its link is written once, never zeroed first. As in
        // a key index, a bucket whose chain holds more than one row says so
        // ([`MORE`]): a walk of a one-row chain reads no link.
        let next: Vec<u32> = words
            .iter()
            .enumerate()
            .map(|(row, &word)| {
                let bucket = &mut buckets[((word - min) >> shift) as usize];
                let previous = *bucket & !MORE;
                *bucket = (row as u32 + 1) | if previous != 0 { MORE } else { 0 };
                previous
            })
            .collect();
        Some(Self {
            mask: 0,
            buckets: Arc::new(buckets),
            next,
            mode: Mode::Ranged { min, shift },
        })
    }

    /// In a table bucketed by key value, the first entry of the chain holding `word`'s
    /// rows, if any, among others (0 when none), with the top bit (`MORE`) set when
    /// the chain has more than one row.
    #[inline(always)]
    pub fn first_ranged(&self, word: u64) -> u32 {
        let (min, shift) = match self.mode {
            Mode::Ranged { min, shift } => (min, shift),
            _ => (0, 0),
        };
        match word.checked_sub(min).map(|offset| offset >> shift) {
            Some(i) => usize::try_from(i)
                .ok()
                .and_then(|i| self.buckets.get(i))
                .copied()
                .unwrap_or(0),
            None => 0,
        }
    }
}
