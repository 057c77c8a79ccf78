//! Radix partitioning on the high bits of the key hash.
//!
//! ```text
//!  bit 63                                                         bit 0
//!  ┌──────────────┬──────────────┬─────────────────────┬────────────────┐
//!  │ level 0 bits │ level 1 bits │ ...                 │  bucket bits   │
//!  └──────────────┴──────────────┴─────────────────────┴────────────────┘
//!   partition      repartition                          hash table buckets
//! ```
//!
//! A row's partition is taken from a [`HashBits`] range at the top of its 64-bit hash;
//! the hash tables take their buckets from the low bits, so the two never overlap for
//! any table smaller than 2^40 buckets. Recursion (repartitioning a partition that is
//! still too big) moves the range down: [`HashBits::next_level`].

use arrow_buffer::NullBuffer;

/// The most radix bits one level may use (2^8 = 256 partitions).
pub const MAX_PARTITION_BITS: u32 = 8;

/// The most hash bits all levels together may use; the rest is left for buckets.
pub const MAX_TOTAL_PARTITION_BITS: u32 = 24;

const _: () = assert!(MAX_PARTITION_BITS <= MAX_TOTAL_PARTITION_BITS);

/// A range of hash bits, counted from the top, that picks a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashBits {
    /// Bits above the range (used by earlier levels).
    skip: u32,
    /// Bits in the range.
    bits: u32,
}

impl HashBits {
    /// The first level: the top `bits` bits.
    ///
    /// # Panics
    /// If `bits` is more than [`MAX_PARTITION_BITS`].
    pub fn new(bits: u32) -> Self {
        assert!(
            bits <= MAX_PARTITION_BITS,
            "{bits} partition bits is too many"
        );
        Self { skip: 0, bits }
    }

    /// The range below this one, `bits` wide, or `None` when the hash has no more
    /// bits to give ([`MAX_TOTAL_PARTITION_BITS`]).
    pub fn next_level(self, bits: u32) -> Option<Self> {
        let skip = self.skip + self.bits;
        (bits <= MAX_PARTITION_BITS && skip + bits <= MAX_TOTAL_PARTITION_BITS)
            .then_some(Self { skip, bits })
    }

    /// How many partitions this range makes.
    #[inline]
    pub fn fan_out(self) -> usize {
        1 << self.bits
    }

    /// The number of bits in the range.
    pub fn bits(self) -> u32 {
        self.bits
    }

    /// The partition of a row with this hash.
    #[inline(always)]
    pub fn partition_of(self, hash: u64) -> usize {
        if self.bits == 0 {
            return 0;
        }
        ((hash << self.skip) >> (64 - self.bits)) as usize
    }
}

/// Row indices of one batch grouped by partition (a counting sort).
#[derive(Debug, Default)]
pub struct PartitionedRows {
    /// Row indices, partition by partition.
    pub rows: Vec<u32>,
    /// `rows[offsets[p]..offsets[p + 1]]` are the rows of partition `p`.
    pub offsets: Vec<usize>,
}

impl PartitionedRows {
    /// Groups the rows by the partition of their hash, leaving out the rows that
    /// `excluded` marks null (rows whose null key can never match).
    ///
    /// With one partition the rows are listed as they are (a spilled pair joined
    /// whole), without looking at the hashes.
    pub fn group(&mut self, bits: HashBits, hashes: &[u64], excluded: Option<&NullBuffer>) {
        let fan_out = bits.fan_out();
        let excluded = excluded.filter(|n| n.null_count() > 0);
        self.offsets.clear();
        self.offsets.resize(fan_out + 1, 0);
        self.rows.clear();
        if fan_out == 1 {
            match excluded {
                None => self.rows.extend(0..hashes.len() as u32),
                Some(nulls) => self.rows.extend(nulls.valid_indices().map(|r| r as u32)),
            }
            self.offsets[1] = self.rows.len();
            return;
        }
        match excluded {
            None => self.sort(bits, hashes, |_| true),
            Some(nulls) => self.sort(bits, hashes, |row| nulls.is_valid(row)),
        }
    }

    /// The counting sort of [`group`](Self::group) over the rows `kept` keeps.
    #[inline(always)]
    fn sort(&mut self, bits: HashBits, hashes: &[u64], kept: impl Fn(usize) -> bool) {
        let fan_out = bits.fan_out();
        for (row, &hash) in hashes.iter().enumerate() {
            if kept(row) {
                self.offsets[bits.partition_of(hash) + 1] += 1;
            }
        }
        for p in 0..fan_out {
            self.offsets[p + 1] += self.offsets[p];
        }
        self.rows.resize(self.offsets[fan_out], 0);
        let mut cursor = self.offsets[..fan_out].to_vec();
        for (row, &hash) in hashes.iter().enumerate() {
            if kept(row) {
                let p = bits.partition_of(hash);
                self.rows[cursor[p]] = row as u32;
                cursor[p] += 1;
            }
        }
    }

    /// The rows of partition `p`.
    #[inline]
    pub fn partition(&self, p: usize) -> &[u32] {
        &self.rows[self.offsets[p]..self.offsets[p + 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_take_disjoint_bits() {
        let level0 = HashBits::new(4);
        let level1 = level0.next_level(4).unwrap();
        let hash = 0xAB00_0000_0000_0000u64;
        assert_eq!(level0.partition_of(hash), 0xA);
        assert_eq!(level1.partition_of(hash), 0xB);
        assert_eq!(HashBits::new(0).partition_of(hash), 0);
        let mut deep = level1;
        let mut levels = 2;
        while let Some(next) = deep.next_level(8) {
            deep = next;
            levels += 1;
        }
        assert_eq!(levels, 2 + (MAX_TOTAL_PARTITION_BITS - 8) / 8);
    }

    #[test]
    fn grouping_is_a_stable_counting_sort() {
        let bits = HashBits::new(2);
        let hashes: Vec<u64> = (0..100u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let mut grouped = PartitionedRows::default();
        let kept: NullBuffer = (0..100).map(|row| row % 10 != 0).collect();
        grouped.group(bits, &hashes, Some(&kept));
        assert_eq!(grouped.rows.len(), 90);
        for p in 0..4 {
            let rows = grouped.partition(p);
            assert!(rows.windows(2).all(|w| w[0] < w[1]));
            assert!(rows
                .iter()
                .all(|&r| bits.partition_of(hashes[r as usize]) == p && r % 10 != 0));
        }
        // One partition: the rows as they are, or those kept.
        grouped.group(HashBits::new(0), &hashes, None);
        assert_eq!(grouped.partition(0), (0..100).collect::<Vec<u32>>());
        grouped.group(HashBits::new(0), &hashes, Some(&kept));
        let expected: Vec<u32> = (0..100).filter(|r| r % 10 != 0).collect();
        assert_eq!(grouped.partition(0), expected);
    }
}
