//! Bloom filters over the key hashes of spilled build partitions.
//!
//! When a build partition is spilled, its rows' hashes also go into a small bloom
//! filter that stays in memory. A probe row routed to that partition whose hash the
//! filter has never seen cannot match: it is not written to the probe spill file
//! (inner and semi joins drop it; outer, anti and mark joins output it at once as
//! unmatched). A false positive only costs a row written to disk.
//!
//! The filter is *blocked*: both probe bits of a hash fall in one 64-bit word, so a
//! lookup touches one cache line. Bits come from the low 40 bits of the hash, which
//! the partition bits (at most the top 24, `MAX_TOTAL_PARTITION_BITS`) never use: all
//! rows of one partition share those, at any depth. The word is picked by
//! multiplying 28 of those bits by the word count (a range reduction, not a mask), so
//! a filter takes exactly the bytes it was given: rounded up to a power of two, a
//! filter sized for 8 bits a row took anywhere from 8 to 16.

/// The filter's size for a partition, in 64-bit words: `BITS_PER_ROW` bits per
/// expected row, between 1 KiB and 1 MiB. A filter that sees more rows than expected
/// only grows its false-positive rate (5.3% at 8 bits a row, 16% at 4, 40% at 2: 100K hashes, 1M tested).
pub const BITS_PER_ROW: usize = 8;
const MIN_WORDS: usize = 128;
const MAX_WORDS: usize = 128 * 1024;

/// The 28 hash bits that pick a filter's word.
const WORD_BITS_MASK: u64 = (1 << 28) - 1;

/// A blocked bloom filter over 64-bit hashes.
#[derive(Debug, Clone)]
pub(crate) struct Bloom {
    words: Vec<u64>,
}

impl Bloom {
    /// The bytes a filter for about `rows` rows holds.
    pub fn bytes_for(rows: usize) -> usize {
        Self::words_for(rows) * 8
    }

    fn words_for(rows: usize) -> usize {
        (rows.saturating_mul(BITS_PER_ROW) / 64).clamp(MIN_WORDS, MAX_WORDS)
    }

    /// The bytes of a partition's filter that may take at most `budget` bytes and
    /// would take [`bytes_for`](Self::bytes_for)`(rows)` if it could: the smaller,
    /// but never less than the least a filter takes (1 KiB).
    pub fn bytes_within(rows: usize, budget: usize) -> usize {
        (budget / 8).clamp(MIN_WORDS, Self::words_for(rows)) * 8
    }

    /// An empty filter of `bytes` bytes (rounded down to whole words, at least 1 KiB,
    /// at most 1 MiB): what [`bytes_within`](Self::bytes_within) chose.
    pub fn with_bytes(bytes: usize) -> Self {
        Self::with_words((bytes / 8).clamp(MIN_WORDS, MAX_WORDS))
    }

    /// The bytes of a membership filter over a whole build of `rows` rows
    /// ([`Self::membership`]): `BITS_PER_ROW` bits a row, no 1 MiB cap.
    pub fn membership_bytes_for(rows: usize) -> usize {
        Self::membership_words_for(rows) * 8
    }

    fn membership_words_for(rows: usize) -> usize {
        (rows.saturating_mul(BITS_PER_ROW) / 64).max(MIN_WORDS)
    }

    /// An empty filter for a whole build of about `rows` rows: small enough to stay
    /// in cache where the build's tables do not, so a probe scan can test keys
    /// cheaply before it decodes the rest of their rows.
    pub fn membership(rows: usize) -> Self {
        Self::with_words(Self::membership_words_for(rows))
    }

    fn with_words(words: usize) -> Self {
        Self {
            words: vec![0; words.max(1)],
        }
    }

    /// The bytes this filter holds.
    pub fn size(&self) -> usize {
        self.words.len() * 8
    }

    #[inline(always)]
    fn position(&self, hash: u64) -> (usize, u64) {
        // Bits 0-11: two bit positions; bits 12-39, scaled to the word count (at most
        // 2^28 words, 2 GiB): the word.
        let word = ((((hash >> 12) & WORD_BITS_MASK) * self.words.len() as u64) >> 28) as usize;
        let bits = (1u64 << (hash & 63)) | (1u64 << ((hash >> 6) & 63));
        (word, bits)
    }

    /// Adds a hash.
    #[inline]
    pub fn insert(&mut self, hash: u64) {
        let (word, bits) = self.position(hash);
        self.words[word] |= bits;
    }

    /// Whether a hash may have been added (false: it certainly was not).
    #[inline]
    pub fn may_contain(&self, hash: u64) -> bool {
        let (word, bits) = self.position(hash);
        self.words[word] & bits == bits
    }

    /// Asks for the cache line a hash's lookup or insert touches.
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        if let Some(word) = self.words.get(self.position(hash).0) {
            crate::table::prefetch(word);
        }
    }

    /// Adds the hashes `hash_of(i)` for `i` in `0..len`, each word asked for
    /// [`PREFETCH_AHEAD`] hashes before it is written.
    #[inline]
    pub fn insert_all(&mut self, len: usize, hash_of: impl Fn(usize) -> u64) {
        for i in 0..len.min(PREFETCH_AHEAD) {
            self.prefetch(hash_of(i));
        }
        for i in 0..len {
            if i + PREFETCH_AHEAD < len {
                self.prefetch(hash_of(i + PREFETCH_AHEAD));
            }
            self.insert(hash_of(i));
        }
    }

    /// The rows among `rows` whose hash (`hash_of(row)`) may have been added, in
    /// order, branch-free, each word asked for [`PREFETCH_AHEAD`] rows before it is
    /// read.
    pub fn select(&self, rows: &[u32], hash_of: impl Fn(usize) -> u64) -> Vec<u32> {
        for &r in rows.iter().take(PREFETCH_AHEAD) {
            self.prefetch(hash_of(r as usize));
        }
        crate::batches::select_from(
            rows.len(),
            rows.iter().enumerate().map(|(i, &r)| {
                if let Some(&next) = rows.get(i + PREFETCH_AHEAD) {
                    self.prefetch(hash_of(next as usize));
                }
                r
            }),
            |r| self.may_contain(hash_of(r)),
        )
    }
}

/// How many hashes ahead of its lookup or insert a filter's word is asked for: a
/// filter of a few MiB misses the core's caches at nearly every lookup, and the
/// misses of one row after another overlap only this way (without it, the filters'
/// loads were a large share of an anti join's profile).
const PREFETCH_AHEAD: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(i: u64) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes())
    }

    /// False positives among 100,000 hashes never added, of a filter of `bytes`
    /// holding `rows` hashes (after checking that every added one is found).
    fn false_positives(bytes: usize, rows: u64) -> usize {
        let mut bloom = Bloom::with_bytes(bytes);
        assert_eq!(bloom.size(), bytes);
        bloom.insert_all(rows as usize, |i| hash(i as u64));
        assert!((0..rows).all(|i| bloom.may_contain(hash(i))));
        (rows..rows + 100_000)
            .filter(|&i| bloom.may_contain(hash(i)))
            .count()
    }

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let bytes = Bloom::bytes_for(10_000);
        assert_eq!(bytes, 10_000 * BITS_PER_ROW / 8);
        // 8 bits a row: about 5% (blocked: a little more than an unblocked filter).
        let fp = false_positives(bytes, 10_000);
        assert!(fp < 8_000, "{fp} of 100000");
        // A size that is no power of two fills evenly: 4 bits a row, about 17%.
        let fp = false_positives(Bloom::bytes_within(30_000, 15_000), 30_000);
        assert!((12_000..24_000).contains(&fp), "{fp} of 100000");
    }

    #[test]
    fn sizes_within_a_budget() {
        assert_eq!(Bloom::bytes_within(100_000, usize::MAX), 100_000);
        assert_eq!(Bloom::bytes_within(100_000, 40_004), 40_000);
        assert_eq!(Bloom::bytes_within(100_000, 10), MIN_WORDS * 8);
        assert_eq!(Bloom::bytes_within(usize::MAX, usize::MAX), MAX_WORDS * 8);
        assert_eq!(Bloom::bytes_for(1), MIN_WORDS * 8);
    }

    #[test]
    fn select_keeps_exactly_the_rows_that_may_match() {
        let mut bloom = Bloom::with_bytes(2048);
        bloom.insert_all(500, |i| hash(i as u64 * 2));
        for len in [0, 1, 15, 16, 17, 1000] {
            let rows: Vec<u32> = (0..len).rev().collect();
            let want: Vec<u32> = rows
                .iter()
                .copied()
                .filter(|&r| bloom.may_contain(hash(r as u64)))
                .collect();
            assert_eq!(bloom.select(&rows, |r| hash(r as u64)), want);
            if len == 1000 {
                assert!(want.len() >= 250 && want.len() < 1000, "{}", want.len());
            }
        }
    }
}
