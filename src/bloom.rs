//! Bloom filters over the key hashes of spilled build partitions.
//!
//! When a build partition is spilled, its rows' hashes also go into a small bloom
//! filter that stays in memory. A probe row routed to that partition whose hash the
//! filter has never seen cannot match: it is not written to the probe spill file
//! (inner and semi joins drop it; outer, anti and mark joins output it at once as
//! unmatched). A false positive only costs a row written to disk.
//!
//! The filter is *blocked*: both probe bits of a hash fall in one 64-bit word, so a
//! lookup touches one cache line. Bits come from the low half of the hash, which the
//! partition bits (taken from the top) never use.

/// The filter's size for a partition, in 64-bit words: `BITS_PER_ROW` bits per
/// expected row, between 1 KiB and 1 MiB. A filter that sees more rows than expected
/// only grows its false-positive rate.
const BITS_PER_ROW: usize = 8;
const MIN_WORDS: usize = 128;
const MAX_WORDS: usize = 128 * 1024;

/// A blocked bloom filter over 64-bit hashes.
#[derive(Debug, Clone)]
pub(crate) struct Bloom {
    words: Vec<u64>,
    mask: usize,
}

impl Bloom {
    /// The bytes a filter for about `rows` rows holds.
    pub fn bytes_for(rows: usize) -> usize {
        Self::words_for(rows) * 8
    }

    fn words_for(rows: usize) -> usize {
        (rows * BITS_PER_ROW / 64)
            .clamp(MIN_WORDS, MAX_WORDS)
            .next_power_of_two()
    }

    /// An empty filter sized for about `rows` rows.
    pub fn new(rows: usize) -> Self {
        Self::with_words(Self::words_for(rows))
    }

    /// The bytes of a membership filter over a whole build of `rows` rows
    /// ([`Self::membership`]): `BITS_PER_ROW` bits a row, no 1 MiB cap.
    pub fn membership_bytes_for(rows: usize) -> usize {
        Self::membership_words_for(rows) * 8
    }

    fn membership_words_for(rows: usize) -> usize {
        (rows * BITS_PER_ROW / 64)
            .max(MIN_WORDS)
            .next_power_of_two()
    }

    /// An empty filter for a whole build of about `rows` rows: small enough to stay
    /// in cache where the build's tables do not, so a probe scan can test keys
    /// cheaply before it decodes the rest of their rows.
    pub fn membership(rows: usize) -> Self {
        Self::with_words(Self::membership_words_for(rows))
    }

    fn with_words(words: usize) -> Self {
        Self {
            words: vec![0; words],
            mask: words - 1,
        }
    }

    /// The bytes this filter holds.
    pub fn size(&self) -> usize {
        self.words.len() * 8
    }

    #[inline(always)]
    fn position(&self, hash: u64) -> (usize, u64) {
        // Low 32 bits: word index (the mask keeps it in range) and two bit positions.
        let word = (hash as usize >> 12) & self.mask;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let hash = |i: u64| xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes());
        let mut bloom = Bloom::new(10_000);
        for i in 0..10_000 {
            bloom.insert(hash(i));
        }
        assert!((0..10_000).all(|i| bloom.may_contain(hash(i))));
        let false_positives = (10_000..110_000)
            .filter(|&i| bloom.may_contain(hash(i)))
            .count();
        assert!(false_positives < 10_000, "{false_positives} of 100000");
        assert_eq!(bloom.size(), Bloom::bytes_for(10_000));
    }
}
