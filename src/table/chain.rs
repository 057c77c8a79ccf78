//! The walk along a chain, from the first entry a lookup found to the end: the same
//! loop in every mode, with what differs (a bucket flagged with `MORE`, keys exact in
//! a key index) read once per walk. Its own file because it is the probe's inner
//! loop: resumable where a caller's buffer fills, with the prefetch hints for the
//! walks to come and the test of whether they go through the rows in order.

use super::{ChainedTable, Mode, MORE};

/// Walks visit build rows in order ([`ChainedTable::walks_in_row_order`]) when at most
/// one step in this many goes back: a probe batch in key order meets the build rows
/// of two threads' runs interleaved, and still reads them ahead.
pub const IN_ORDER_MAX_BACK_STEPS: usize = 16;

impl ChainedTable {
    /// In a table looked up by key ([`by_key`](Self::by_key)), the first entry of
    /// `word`'s chain (0 when none): [`first_direct`](Self::first_direct) or
    /// [`first_ranged`](Self::first_ranged).
    #[inline(always)]
    pub fn first_by_key(&self, word: u64) -> u32 {
        match self.mode {
            Mode::KeyIndexed { .. } => self.first_direct(word),
            // (In a hashed table: bucket `word`, meaningless but never out of bounds.)
            Mode::Ranged { .. } | Mode::Hashed => self.first_ranged(word),
        }
    }

    /// The row after `row` (0-based) in its chain (1-based; 0 at the end).
    #[inline(always)]
    pub fn next(&self, row: usize) -> u32 {
        self.next[row]
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
        // per candidate otherwise, which shows in the CPU time of joins whose probe
        // rows do little more than walk (a spilled semi join).
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
