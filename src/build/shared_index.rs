//! One key index shared by all partitions: when every partition stays in memory and
//! the key is one word whose values are dense over all rows together, the tables are
//! replaced by one index by key value, so that a lookup is one bucket read. Its own
//! file because it is decided and built apart from the partitions' own tables:
//! reserved while the tables are planned ([`BuildCollector::shared_key_index`]), built
//! after every partition is finished ([`share_key_index`]).

use arrow_buffer::ScalarBuffer;
use spilljoin_memory::MemoryReservation;

use super::built::{BuiltPartition, Partition};
use super::collector::BuildCollector;
use crate::batches::lock;
use crate::keys::KeyRepr;
use crate::table::ChainedTable;

/// The most rows a partition of a shared key index may have (the buckets' top bit
/// is a flag).
const MAX_DIRECT_ROWS: usize = 1 << 31;

impl BuildCollector<'_> {
    /// Whether the partitions get one key index they share (`share_key_index`), and
    /// its `(min, span)`: when every partition with rows is in memory (`planned`), the
    /// key is one word whose rows have no nulls, and its values are dense enough for
    /// all rows together ([`ChainedTable::shared_direct_span`]; in a partition of a
    /// hash-partitioned build a dense column's keys are sparse, so each partition's
    /// own table is hashed). What its buckets take beyond the tables' buckets is
    /// reserved in `tables`; without that memory the tables are built as usual.
    pub(super) fn shared_key_index(
        &self,
        planned: &[bool],
        has_null_key: bool,
        tables: &mut MemoryReservation,
    ) -> Option<(u64, u64)> {
        let plan = self.plan();
        if !plan.keys.is_word_key() || planned.len() < 2 {
            return None;
        }
        if has_null_key && !plan.nulls_never_match() {
            return None;
        }
        let state = lock(&self.state);
        let mut rows = Vec::with_capacity(planned.len());
        for (p, part) in state.partitions.iter().enumerate() {
            if part.total_rows > 0 && !planned[p] {
                return None;
            }
            rows.push(part.rows);
        }
        drop(state);
        let (min, max) = (*lock(&self.word_bounds))?;
        let span = max - min;
        let total: usize = rows.iter().sum();
        if span >= 2 * ChainedTable::bucket_count_for(total) as u64
            || rows.iter().any(|&r| r >= MAX_DIRECT_ROWS)
        {
            return None;
        }
        let buckets_now: usize = rows
            .iter()
            .map(|&r| ChainedTable::size_for(r) - r * std::mem::size_of::<u32>())
            .sum();
        let buckets = (span as usize + 1) * std::mem::size_of::<u32>();
        tables
            .try_grow(buckets.saturating_sub(buckets_now))
            .ok()
            .map(|()| (min, span))
    }
}

/// Gives every in-memory partition (built without a table) its table over one key
/// index they all share: a lookup is then one bucket read (no key compared, no link
/// read for a unique key). Its memory was reserved with the tables'
/// (`BuildCollector::shared_key_index`). SF10 orders ⋈ lineitem in memory: the keys
/// span 60M for 15M rows.
pub(super) fn share_key_index(partitions: &mut [Partition], min: u64, span: u64, threads: usize) {
    let words: Vec<ScalarBuffer<u64>> = partitions
        .iter()
        .map(|p| match p {
            Partition::InMemory(BuiltPartition {
                keys: KeyRepr::Words { words, .. },
                ..
            }) => words.clone(),
            _ => ScalarBuffer::from(Vec::new()),
        })
        .collect();
    let slices: Vec<&[u64]> = words.iter().map(|w| &w[..]).collect();
    let tables = ChainedTable::build_shared_direct(&slices, min, span, threads);
    for (partition, table) in partitions.iter_mut().zip(tables) {
        if let Partition::InMemory(part) = partition {
            part.table = table;
        }
    }
}
