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
//! **Dense keys.** When a one-word key's values span no more than the buckets a table
//! of that many rows would have (customer keys 1..1.5M, say), the buckets are indexed
//! by the key itself, `key - min` ([`ChainedTable::build_direct`]): no two keys share
//! a chain, so a lookup compares no key, and a bucket whose chain holds one row says
//! so (its top bit clear), so the walk reads no link either. Same arrays, no more
//! memory.
//!
//! **Clustered keys.** One-word keys too spread out for that are still bucketed by
//! value where their values spread evenly: bucket `(key - min) >> shift`, the
//! smallest shift that fits the span into a hashed table's buckets
//! ([`ChainedTable::build_ranged`]). Chains then hold nearby keys, compared as in a
//! hashed table, and a bucket says whether its chain has more than one row, as in a
//! key index; what this buys is locality. Where build and probe come in key order
//! (a fact table sorted by the key it joins on: `lineitem` by order key), successive
//! lookups read neighbouring buckets and rows instead of one cache miss each — the
//! partitions of a hash-partitioned build, whose keys span the whole column, get the
//! locality the key index gives an unpartitioned one. Keys that bunch up (chains
//! longer than [`RANGED_MAX_CHAIN`], or [`RANGED_MAX_MEAN_WALK`] rows walked on
//! average) are hashed instead.

/// Buckets per build row, rounded up to a power of two: a load factor of at most 0.5
/// keeps chains short for unique keys (measured in `benches/kernels.rs`, "probe").
const BUCKETS_PER_ROW: usize = 2;

/// The most rows one table can index (row ids are `u32`, and 0 means "none").
pub const MAX_TABLE_ROWS: usize = u32::MAX as usize - 1;

/// A chained hash table over the rows of one partition.
#[derive(Debug)]
pub struct ChainedTable {
    mask: u64,
    /// Shared by the partitions of a build when one key index serves them all
    /// ([`ChainedTable::build_shared_direct`]).
    buckets: Arc<Vec<u32>>,
    next: Vec<u32>,
    /// For a key-indexed table, the smallest key: bucket `key - min` holds the chain
    /// of `key`, with [`MORE`] set when it has more than one row.
    direct_min: Option<u64>,
    /// For a table bucketed by key value, the smallest key and the shift: bucket
    /// `(key - min) >> shift` holds the chain of `key` (and of its neighbours).
    ranged: Option<(u64, u32)>,
}

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

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// Walks visit build rows in order ([`ChainedTable::walks_in_row_order`]) when at most
/// one step in this many goes back: a probe batch in key order meets the build rows
/// of two threads' runs interleaved, and still reads them ahead.
pub const IN_ORDER_MAX_BACK_STEPS: usize = 16;

/// In the bucket of a table looked up by key (key-indexed or bucketed by value): the
/// chain has more rows than its first.
const MORE: u32 = 1 << 31;

impl ChainedTable {
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
            direct_min: None,
            ranged: None,
        }
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
    fn ranged_in(words: &[u64], min: u64, max: u64) -> Option<Self> {
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
            direct_min: None,
            ranged: Some((min, shift)),
        })
    }

    /// Whether the table is bucketed by key value
    /// ([`build_ranged`](Self::build_ranged)): look up with
    /// [`first_ranged`](Self::first_ranged), and compare keys along the chain.
    #[inline(always)]
    pub fn is_ranged(&self) -> bool {
        self.ranged.is_some()
    }

    /// Whether the table is looked up by key rather than by hash (key-indexed or
    /// bucketed by key value).
    #[inline(always)]
    pub fn by_key(&self) -> bool {
        self.direct_min.is_some() || self.ranged.is_some()
    }

    /// In a table looked up by key ([`by_key`](Self::by_key)), the first entry of
    /// `word`'s chain (0 when none): [`first_direct`](Self::first_direct) or
    /// [`first_ranged`](Self::first_ranged).
    #[inline(always)]
    pub fn first_by_key(&self, word: u64) -> u32 {
        if self.is_direct() {
            self.first_direct(word)
        } else {
            self.first_ranged(word)
        }
    }

    /// In a table bucketed by key value, the first entry of the chain holding `word`'s
    /// rows, if any, among others (0 when none), with the top bit (`MORE`) set when
    /// the chain has more than one row.
    #[inline(always)]
    pub fn first_ranged(&self, word: u64) -> u32 {
        let (min, shift) = self.ranged.unwrap_or((0, 0));
        match word.checked_sub(min).map(|offset| offset >> shift) {
            Some(i) => usize::try_from(i)
                .ok()
                .and_then(|i| self.buckets.get(i))
                .copied()
                .unwrap_or(0),
            None => 0,
        }
    }

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
            direct_min: Some(min),
            ranged: None,
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
    fn direct_suits(span: u64, rows: usize) -> bool {
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
                direct_min: Some(min),
                ranged: None,
            })
            .collect()
    }

    /// The bytes of this table's buckets (shared ones included).
    pub fn bucket_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u32>()
    }

    /// Whether the table is indexed by key ([`build_direct`](Self::build_direct)):
    /// look up with [`first_direct`](Self::first_direct).
    #[inline(always)]
    pub fn is_direct(&self) -> bool {
        self.direct_min.is_some()
    }

    /// In a key-indexed table, the first entry of `word`'s chain (0 when none).
    #[inline(always)]
    pub fn first_direct(&self, word: u64) -> u32 {
        let offset = word.wrapping_sub(self.direct_min.unwrap_or(0));
        match usize::try_from(offset) {
            Ok(i) => self.buckets.get(i).copied().unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// The bytes this table holds.
    pub fn size(&self) -> usize {
        (self.buckets.capacity() + self.next.capacity()) * std::mem::size_of::<u32>()
    }

    /// The first row of the chain for `hash` (1-based; 0 when empty). Not for
    /// tables looked up by key ([`by_key`](Self::by_key)).
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

    /// Asks the processor to start loading the chain link that a walk from `first`
    /// (an entry of [`first_entries`](Self::first_entries),
    /// [`first_direct`](Self::first_direct), [`first_ranged`](Self::first_ranged) or
    /// [`first_by_key`](Self::first_by_key)) will read, if it reads one (a hint: it
    /// never faults and changes nothing).
    #[inline(always)]
    pub fn prefetch_link(&self, first: u32) {
        let entry = if self.by_key() {
            if first & MORE == 0 {
                return;
            }
            first & !MORE
        } else {
            first
        };
        if let Some(link) = (entry as usize)
            .checked_sub(1)
            .and_then(|r| self.next.get(r))
        {
            prefetch(link);
        }
    }

    /// Whether walks from `firsts` (first entries of lookups in a table looked up by
    /// key, in the order they are walked) visit the build rows in order, nearly: at
    /// most one step in [`IN_ORDER_MAX_BACK_STEPS`] goes back (steps are from hit to
    /// hit: misses count neither way).
    /// So they do where probe and build both come in key order (a fact table sorted
    /// by the key it joins on, `lineitem` by order key, and a dimension table by its
    /// own key): the processor then loads the rows ahead by itself, and prefetch
    /// hints ([`prefetch_link`](Self::prefetch_link)) only cost instructions. False for
    /// a hashed table, whose buckets follow no order.
    pub fn walks_in_row_order(&self, firsts: &[u32]) -> bool {
        if !self.by_key() {
            return false;
        }
        let (mut last, mut back, mut hits) = (0u32, 0usize, 0usize);
        for &first in firsts {
            let entry = first & !MORE;
            let hit = entry != 0;
            back += usize::from(hit & (entry < last));
            hits += usize::from(hit);
            last = if hit { entry } else { last };
        }
        back * IN_ORDER_MAX_BACK_STEPS <= hits
    }

    /// The row a chain's first entry names (0-based), if any.
    #[inline(always)]
    pub fn first_row(&self, first: u32) -> Option<usize> {
        ((first & if self.by_key() { !MORE } else { u32::MAX }) as usize).checked_sub(1)
    }

    /// Like [`for_each_candidate`](Self::for_each_candidate), from a first entry
    /// already looked up. With `check_hash` false every row of the chain is a
    /// candidate (the caller compares keys, which implies equal hashes). In a
    /// key-indexed table every row of the chain has the key looked up, and `hash` is
    /// not used.
    ///
    /// When `f` breaks, returns the first entry of the rest of the chain (`None` if
    /// nothing is left), from which a later call goes on: a walk can stop when its
    /// caller's buffer is full and resume after it is emptied.
    #[inline(always)]
    pub fn for_each_candidate_from(
        &self,
        first: u32,
        hash: u64,
        hashes: &[u64],
        check_hash: bool,
        mut f: impl FnMut(usize) -> std::ops::ControlFlow<()>,
    ) -> Option<u32> {
        // One call of `f` in the loop, so that it is inlined: a walk costs a call
        // per candidate otherwise (a tenth of a spilled semi join's CPU at SF1).
        // In a table looked up by key a bucket without [`MORE`] holds its only row;
        // in a key-indexed one every row of a chain has the key: no hash is compared.
        let direct = self.is_direct();
        let flagged = self.by_key();
        let (mut entry, single) = if flagged {
            (first & !MORE, first & MORE == 0)
        } else {
            (first, false)
        };
        while entry != 0 {
            let row = entry as usize - 1;
            let next = if single { 0 } else { self.next(row) };
            if (direct || !check_hash || hashes[row] == hash) && f(row).is_break() {
                // In a table looked up by key the rest is a chain of links: flagged so.
                return (next != 0).then_some(if flagged { next | MORE } else { next });
            }
            entry = next;
        }
        None
    }
}

/// The smallest and largest of `words`, if any.
pub(crate) fn word_range(words: impl Iterator<Item = u64>) -> Option<(u64, u64)> {
    words.fold(None, |acc, w| match acc {
        None => Some((w, w)),
        Some((lo, hi)) => Some((lo.min(w), hi.max(w))),
    })
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

    /// The rows of a key-indexed table's chain for `word`, sorted.
    fn chain_rows(table: &ChainedTable, word: u64) -> Vec<usize> {
        let mut found = vec![];
        table.for_each_candidate_from(table.first_direct(word), 0, &[], false, |row| {
            found.push(row);
            ControlFlow::Continue(())
        });
        found.sort();
        found
    }

    #[test]
    fn a_key_indexed_table_finds_every_row_of_a_key_and_nothing_else() -> Result<(), &'static str> {
        let words = [107u64, 109, 107, 103, 107, 110];
        let (min, span) = ChainedTable::direct_span(&words).ok_or("not dense")?;
        assert_eq!((min, span), (103, 7));
        let table = ChainedTable::build_direct(&words, min, span);
        assert!(table.is_direct());
        assert_eq!(
            table.size(),
            ChainedTable::direct_size_for(span, words.len())
        );
        let rows_of = |word: u64| chain_rows(&table, word);
        assert_eq!(rows_of(107), [0, 2, 4]);
        assert_eq!(rows_of(109), [1]);
        assert_eq!(rows_of(110), [5]);
        for absent in [0, 102, 104, 108, 111, u64::MAX] {
            assert!(rows_of(absent).is_empty(), "{absent}");
        }
        // Stopping at the first row of a longer chain.
        let mut first = vec![];
        table.for_each_candidate_from(table.first_direct(107), 0, &[], false, |row| {
            first.push(row);
            ControlFlow::Break(())
        });
        assert_eq!(first.len(), 1);
        // One index shared by two partitions: each key's rows lie in one of them.
        let first_part = [5u64, 9, 5];
        let second_part = [7u64, 6, 7, 7];
        let (min, span) =
            ChainedTable::shared_direct_span(&[&first_part, &second_part]).ok_or("not dense")?;
        assert_eq!((min, span), (5, 4));
        let tables = ChainedTable::build_shared_direct(&[&first_part, &second_part], min, span, 2);
        let rows_in = chain_rows;
        assert_eq!(rows_in(&tables[0], 5), [0, 2]);
        assert_eq!(rows_in(&tables[0], 9), [1]);
        assert_eq!(rows_in(&tables[1], 7), [0, 2, 3]);
        assert_eq!(rows_in(&tables[1], 6), [1]);
        assert!(rows_in(&tables[1], 8).is_empty());
        // Spread-out keys are hashed instead.
        assert!(ChainedTable::direct_span(&[1, 1 << 40]).is_none());
        assert!(ChainedTable::direct_span(&[]).is_none());
        Ok(())
    }

    /// The rows of a table bucketed by key value whose key is `word`, sorted.
    fn ranged_rows(table: &ChainedTable, words: &[u64], word: u64) -> Vec<usize> {
        let mut found = vec![];
        table.for_each_candidate_from(table.first_ranged(word), 0, &[], false, |row| {
            if words[row] == word {
                found.push(row);
            }
            ControlFlow::Continue(())
        });
        found.sort();
        // A walk that stops at every row and goes on from where it stopped finds the
        // same rows: what a walk resumed after its caller's buffer filled does.
        let mut resumed = vec![];
        let mut from = Some(table.first_ranged(word));
        while let Some(entry) = from {
            from = table.for_each_candidate_from(entry, 0, &[], false, |row| {
                if words[row] == word {
                    resumed.push(row);
                }
                ControlFlow::Break(())
            });
        }
        resumed.sort();
        assert_eq!(found, resumed, "{word}");
        found
    }

    #[test]
    fn a_table_bucketed_by_value_finds_every_row_of_a_key() -> Result<(), &'static str> {
        // Every fourth key of a wide range, some twice: too sparse for a key index.
        let mut words: Vec<u64> = (0..1000u64).map(|i| 1_000_000 + i * 4096).collect();
        words.extend([1_000_000, 1_000_000 + 4096 * 500]);
        assert!(ChainedTable::direct_span(&words).is_none());
        let table = ChainedTable::build_ranged(&words).ok_or("not spread evenly")?;
        assert!(table.is_ranged() && table.by_key() && !table.is_direct());
        assert!(table.size() <= ChainedTable::size_for(words.len()));
        assert_eq!(ranged_rows(&table, &words, 1_000_000), [0, 1000]);
        assert_eq!(
            ranged_rows(&table, &words, 1_000_000 + 4096 * 500),
            [500, 1001]
        );
        for i in [1u64, 999] {
            assert_eq!(
                ranged_rows(&table, &words, 1_000_000 + i * 4096),
                [i as usize]
            );
        }
        for absent in [0, 999_999, 1_000_001, 1_000_000 + 4096 * 1000, u64::MAX] {
            assert!(ranged_rows(&table, &words, absent).is_empty(), "{absent}");
        }
        // A bucket says whether its chain has more than its first row.
        assert_eq!(table.first_ranged(1_000_000 + 4096) & MORE, 0);
        assert_eq!(table.first_ranged(1_000_000) & MORE, MORE);
        // The whole u64 range, evenly spread: the top bits bucket it.
        let spread: Vec<u64> = (0..4096u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .chain([0, u64::MAX])
            .collect();
        let table = ChainedTable::build_ranged(&spread).ok_or("not spread evenly")?;
        for (row, &word) in spread.iter().enumerate() {
            assert!(ranged_rows(&table, &spread, word).contains(&row));
        }
        // Keys that bunch up are refused: a cluster next to one far-away key, or
        // one key repeated more than a chain may hold.
        let mut bunched: Vec<u64> = (0..1000u64).collect();
        bunched.push(1 << 40);
        assert!(ChainedTable::build_ranged(&bunched).is_none());
        let mut hot = vec![7u64; RANGED_MAX_CHAIN as usize + 1];
        hot.extend(0..10_000u64);
        assert!(ChainedTable::build_ranged(&hot).is_none());
        assert!(ChainedTable::build_ranged(&[]).is_none());
        // One key, or two: spans of 0 and 1.
        assert!(ChainedTable::build_ranged(&[5]).is_some());
        assert!(ChainedTable::build_ranged(&[5, 6]).is_some());
        // A chain may hold exactly RANGED_MAX_CHAIN rows (counted in a byte).
        let mut full = vec![7u64; RANGED_MAX_CHAIN as usize];
        full.extend(100..10_100u64);
        let table = ChainedTable::build_ranged(&full).ok_or("a full chain refused")?;
        assert_eq!(
            ranged_rows(&table, &full, 7),
            (0..RANGED_MAX_CHAIN as usize).collect::<Vec<_>>()
        );
        full.push(7);
        assert!(ChainedTable::build_ranged(&full).is_none());
        Ok(())
    }

    #[test]
    fn lookups_in_key_order_walk_the_build_rows_in_order() -> Result<(), &'static str> {
        // Build rows in key order, every 64th key of a wide range on average.
        let words: Vec<u64> = (0..4096u64).map(|i| i * 64 + i % 7).collect();
        let table = ChainedTable::build_ranged(&words).ok_or("not spread evenly")?;
        let firsts = |probes: &mut dyn Iterator<Item = u64>| -> Vec<u32> {
            probes.map(|w| table.first_ranged(w)).collect()
        };
        // In key order, each key twice, with a miss (a key past the range) after
        // each: in order.
        let in_order = firsts(&mut words.iter().flat_map(|&w| [w, w, u64::MAX]));
        assert_eq!(in_order.iter().filter(|&&f| f == 0).count(), words.len());
        assert!(table.walks_in_row_order(&in_order));
        // Misses are not steps: a back step every 8 hits is out of order however
        // many misses lie between (here 64 after every 8 hits).
        let sparse_back: Vec<u64> = words
            .chunks(8)
            .flat_map(|c| [c[1], c[0]].into_iter().chain(c[2..].iter().copied()))
            .collect::<Vec<_>>()
            .chunks(8)
            .flat_map(|c| c.iter().copied().chain([u64::MAX; 64]))
            .collect();
        assert!(!table.walks_in_row_order(&firsts(&mut sparse_back.into_iter())));
        // Build rows written by two threads, groups of 64 keys each, one thread a
        // group ahead (groups 0, 2, 1, 4, 3, ...): probed in key order, a back step
        // every 128 rows.
        let groups: Vec<&[u64]> = words.chunks(64).collect();
        let mut order: Vec<usize> = vec![0];
        for g in (2..groups.len()).step_by(2) {
            order.extend([g, g - 1]);
        }
        order.push(groups.len() - 1);
        let two_threads: Vec<u64> = order.iter().flat_map(|&g| groups[g].to_vec()).collect();
        let table2 = ChainedTable::build_ranged(&two_threads).ok_or("not spread evenly")?;
        let in_key_order: Vec<u32> = words.iter().map(|&w| table2.first_ranged(w)).collect();
        assert!(table2.walks_in_row_order(&in_key_order));
        // Backwards, or every other key from the far end: not in order.
        let backwards = firsts(&mut words.iter().rev().copied());
        assert!(!table.walks_in_row_order(&backwards));
        let zigzag = firsts(
            &mut words
                .iter()
                .zip(words.iter().rev())
                .flat_map(|(&a, &b)| [a, b]),
        );
        assert!(!table.walks_in_row_order(&zigzag));
        // A hashed table's buckets follow no order.
        let hashed = ChainedTable::build(&words, |_| true);
        let hashed_firsts: Vec<u32> = words.iter().map(|&w| hashed.first(w)).collect();
        assert!(!hashed.walks_in_row_order(&hashed_firsts));
        Ok(())
    }

    #[test]
    fn one_word_keys_get_a_key_index_or_value_buckets_or_none() -> Result<(), &'static str> {
        // Dense: indexed by key, no bigger than a hashed table.
        let dense: Vec<u64> = (100..1100u64).rev().collect();
        let table = ChainedTable::build_by_key(&dense).ok_or("dense refused")?;
        assert!(table.is_direct() && table.size() <= ChainedTable::size_for(dense.len()));
        for (row, &word) in dense.iter().enumerate() {
            assert_eq!(table.first_direct(word), row as u32 + 1);
        }
        assert_eq!(table.first_direct(99), 0);
        // Sparse but even: bucketed by value.
        let sparse: Vec<u64> = (0..1000u64).map(|i| i * 4096).collect();
        let table = ChainedTable::build_by_key(&sparse).ok_or("sparse refused")?;
        assert!(table.is_ranged() && !table.is_direct());
        assert_eq!(ranged_rows(&table, &sparse, 4096 * 3), [3]);
        // Bunched: neither (the caller hashes them).
        let mut bunched: Vec<u64> = (0..1000u64).collect();
        bunched.push(1 << 40);
        assert!(ChainedTable::build_by_key(&bunched).is_none());
        assert!(ChainedTable::build_by_key(&[]).is_none());
        Ok(())
    }

    /// Walks a chain from `first`, stopping after every `step` candidates and going on
    /// from where the walk said: the rows seen, in order.
    fn walk_in_steps(
        table: &ChainedTable,
        first: u32,
        hash: u64,
        hashes: &[u64],
        step: usize,
    ) -> Vec<usize> {
        let mut seen = vec![];
        let mut from = Some(first);
        while let Some(start) = from {
            let mut taken = 0;
            from = table.for_each_candidate_from(start, hash, hashes, true, |row| {
                seen.push(row);
                taken += 1;
                if taken == step {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
        }
        seen
    }

    #[test]
    fn a_walk_stopped_anywhere_goes_on_where_it_stopped() -> Result<(), &'static str> {
        // A hot key (every third row) among others, in both kinds of table.
        let words: Vec<u64> = (0..300u64)
            .map(|i| if i % 3 == 0 { 301 } else { i })
            .collect();
        let hashes: Vec<u64> = words
            .iter()
            .map(|&w| w.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let hashed = ChainedTable::build(&hashes, |_| true);
        let (min, span) = ChainedTable::direct_span(&words).ok_or("not dense")?;
        let direct = ChainedTable::build_direct(&words, min, span);
        let hot = hashes[0];
        for (table, first) in [
            (&hashed, hashed.first(hot)),
            (&direct, direct.first_direct(301)),
        ] {
            let whole = walk_in_steps(table, first, hot, &hashes, usize::MAX);
            let mut sorted = whole.clone();
            sorted.sort();
            assert_eq!(sorted, (0..300).step_by(3).collect::<Vec<_>>());
            for step in [1, 2, 7, 99, 100, 101] {
                assert_eq!(
                    walk_in_steps(table, first, hot, &hashes, step),
                    whole,
                    "step {step}"
                );
            }
        }
        // A chain of one row, and no chain.
        let one = direct.first_direct(1);
        assert_eq!(walk_in_steps(&direct, one, 0, &[], 1), [1]);
        assert_eq!(
            walk_in_steps(&direct, direct.first_direct(3), 0, &[], 1),
            Vec::<usize>::new()
        );
        Ok(())
    }
}
