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
//!
//! A table has one of three modes ([`TableMode`], [`ChainedTable::mode`]), which say
//! which bucket a lookup reads and what a chain holds; the arrays are the same in all
//! three.
//!
//! **Hashed.** Bucket `hash & mask`, as drawn above ([`ChainedTable::build`]): any
//! keys, any spread.
//!
//! **Dense keys (key-indexed).** When a one-word key's values span no more than the
//! buckets a table of that many rows would have (customer keys 1..1.5M, say), the
//! buckets are indexed by the key itself, `key - min` ([`ChainedTable::build_direct`]):
//! no two keys share a chain, so a lookup compares no key, and a bucket whose chain
//! holds one row says so (its top bit clear), so the walk reads no link either. Same
//! arrays, no more memory.
//!
//! **Clustered keys (bucketed by value).** One-word keys too spread out for that are
//! still bucketed by value where their values spread evenly: bucket
//! `(key - min) >> shift`, the smallest shift that fits the span into a hashed table's
//! buckets ([`ChainedTable::build_ranged`]). Chains then hold nearby keys, compared as
//! in a hashed table, and a bucket says whether its chain has more than one row, as in
//! a key index; what this buys is locality. Where build and probe come in key order
//! (a fact table sorted by the key it joins on: `lineitem` by order key), successive
//! lookups read neighbouring buckets and rows instead of one cache miss each — the
//! partitions of a hash-partitioned build, whose keys span the whole column, get the
//! locality the key index gives an unpartitioned one. Keys that bunch up (chains
//! longer than [`RANGED_MAX_CHAIN`], or [`RANGED_MAX_MEAN_WALK`] rows walked on
//! average) are hashed instead.
//!
//! The two modes looked up by key mark a bucket whose chain has more than one row
//! with its top bit (`MORE`): an encoding of the entry, not a mode of its own.
//!
//! What each file holds:
//! - this file: [`ChainedTable`], its modes, the choice of a mode for one-word keys
//!   ([`ChainedTable::build_by_key`]) and the table's size;
//! - `hashed.rs`: the hashed mode, built and looked up by hash;
//! - `key_indexed.rs`: the key-indexed mode, one table per partition or one index
//!   shared by several, linked by several threads;
//! - `ranged.rs`: the mode bucketed by value, and the spread its keys must have;
//! - `chain.rs`: the walk along a chain from its first entry, the same in every mode
//!   (resumable, with prefetch hints and the test of whether walks go in row order);
//! - `tests.rs`: the tests of every mode.

mod chain;
mod hashed;
mod key_indexed;
mod ranged;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub(crate) use chain::prefetch;
pub use chain::IN_ORDER_MAX_BACK_STEPS;
pub use ranged::{RANGED_MAX_CHAIN, RANGED_MAX_MEAN_WALK};

/// Buckets per build row, rounded up to a power of two: a load factor of at most 0.5
/// keeps chains short for unique keys (measured in `benches/kernels.rs`, "probe").
const BUCKETS_PER_ROW: usize = 2;

/// The most rows one table can index (row ids are `u32`, and 0 means "none").
pub const MAX_TABLE_ROWS: usize = u32::MAX as usize - 1;

/// In the bucket of a table looked up by key (key-indexed or bucketed by value): the
/// chain has more rows than its first.
///
/// A data encoding, not a mode: the top bit of a bucket's entry (and of the entry a
/// resumed walk goes on from, [`ChainedTable::for_each_candidate_from`]), free because
/// such tables hold fewer than `MORE` rows. Hashed tables may hold up to
/// [`MAX_TABLE_ROWS`], so their entries use all 32 bits and never carry it.
const MORE: u32 = 1 << 31;

/// A chained hash table over the rows of one partition.
#[derive(Debug)]
pub struct ChainedTable {
    /// The bucket bits of a hash, in a hashed table (its bucket count is a power of
    /// two); 0 in the modes looked up by key. A field rather than part of
    /// [`Mode::Hashed`], so that [`first`](Self::first) reads it with no test of the
    /// mode.
    mask: u64,
    /// Shared by the partitions of a build when one key index serves them all
    /// ([`ChainedTable::build_shared_direct`]).
    buckets: Arc<Vec<u32>>,
    next: Vec<u32>,
    /// Which bucket holds a key's chain.
    mode: Mode,
}

/// How a [`ChainedTable`] finds a key's bucket (the crate's own view of
/// [`TableMode`], with what each mode needs to compute the bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Bucket `hash & mask`.
    Hashed,
    /// Key-indexed: bucket `key - min` holds the chain of `key`, with [`MORE`] set
    /// when it has more than one row.
    KeyIndexed { min: u64 },
    /// Bucketed by key value: bucket `(key - min) >> shift` holds the chain of `key`
    /// (and of its neighbours), with [`MORE`] set when it has more than one row.
    Ranged { min: u64, shift: u32 },
}

/// The mode of a [`ChainedTable`] ([`ChainedTable::mode`]): how a lookup finds the
/// first entry of a row's chain, and whether the rows along it need their keys
/// compared. A prober matches on it once per table, then runs the lookup loop of that
/// mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableMode {
    /// Indexed by hash ([`ChainedTable::build`]): look up with
    /// [`first`](ChainedTable::first) or [`first_entries`](ChainedTable::first_entries);
    /// a chain holds rows of other keys too.
    Hashed,
    /// Indexed by a one-word key ([`ChainedTable::build_direct`]): look up with
    /// [`first_direct`](ChainedTable::first_direct); every row of a chain has the key
    /// looked up.
    KeyIndexed,
    /// Bucketed by a one-word key's value ([`ChainedTable::build_ranged`]): look up
    /// with [`first_ranged`](ChainedTable::first_ranged); a chain holds neighbouring
    /// keys, compared as in a hashed table.
    Ranged,
}

impl ChainedTable {
    /// The table's mode: how to look it up.
    #[inline(always)]
    pub fn mode(&self) -> TableMode {
        match self.mode {
            Mode::Hashed => TableMode::Hashed,
            Mode::KeyIndexed { .. } => TableMode::KeyIndexed,
            Mode::Ranged { .. } => TableMode::Ranged,
        }
    }

    /// Whether the table is indexed by key ([`build_direct`](Self::build_direct)):
    /// look up with [`first_direct`](Self::first_direct).
    #[inline(always)]
    pub fn is_direct(&self) -> bool {
        matches!(self.mode, Mode::KeyIndexed { .. })
    }

    /// Whether the table is bucketed by key value
    /// ([`build_ranged`](Self::build_ranged)): look up with
    /// [`first_ranged`](Self::first_ranged), and compare keys along the chain.
    #[inline(always)]
    pub fn is_ranged(&self) -> bool {
        matches!(self.mode, Mode::Ranged { .. })
    }

    /// Whether the table is looked up by key rather than by hash (key-indexed or
    /// bucketed by key value).
    #[inline(always)]
    pub fn by_key(&self) -> bool {
        !matches!(self.mode, Mode::Hashed)
    }

    /// A table of one-word keys looked up by key, if one suits them: indexed by key
    /// ([`build_direct`](Self::build_direct)) where their [`direct_span`](Self::direct_span)
    /// allows and that takes no more than a hashed table, else bucketed by value
    /// ([`build_ranged`](Self::build_ranged)). Their range is read once, for both
    /// choices. Every row is inserted: rows whose key can never match must not be in
    /// `words`. It holds at most [`size_for`](Self::size_for) bytes.
    pub fn build_by_key(words: &[u64]) -> Option<Self> {
        let (min, max) = word_range(words.iter().copied())?;
        let span = max - min;
        let rows = words.len();
        if Self::direct_suits(span, rows)
            && rows < MORE as usize
            && Self::direct_size_for(span, rows) <= Self::size_for(rows)
        {
            return Some(Self::build_direct(words, min, span));
        }
        Self::ranged_in(words, min, max)
    }

    /// The bytes a table over `num_rows` rows holds.
    pub fn size_for(num_rows: usize) -> usize {
        (Self::bucket_count(num_rows) + num_rows) * std::mem::size_of::<u32>()
    }

    /// The buckets of a hashed table over `num_rows` rows.
    pub fn bucket_count_for(num_rows: usize) -> usize {
        Self::bucket_count(num_rows)
    }

    fn bucket_count(num_rows: usize) -> usize {
        (num_rows * BUCKETS_PER_ROW).next_power_of_two().max(1)
    }

    /// The bytes of this table's buckets (shared ones included).
    pub fn bucket_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u32>()
    }

    /// The bytes this table holds.
    pub fn size(&self) -> usize {
        (self.buckets.capacity() + self.next.capacity()) * std::mem::size_of::<u32>()
    }
}

/// The smallest and largest of `words`, if any.
pub(crate) fn word_range(words: impl Iterator<Item = u64>) -> Option<(u64, u64)> {
    words.fold(None, |acc, w| match acc {
        None => Some((w, w)),
        Some((lo, hi)) => Some((lo.min(w), hi.max(w))),
    })
}
