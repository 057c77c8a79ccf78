//! What the build hands on: the build side of one level once its input has ended,
//! immutable from then on. Its own file because the probe, the spilled pairs and the
//! fallback read these types, and none of how they were collected.

use arrow_array::RecordBatch;
use arrow_buffer::ScalarBuffer;
use spilljoin_memory::MemoryReservation;
use spilljoin_spill::SpillFile;

use crate::bloom::Bloom;
use crate::bounds::KeyBounds;
use crate::keys::KeyRepr;
use crate::table::ChainedTable;

/// One partition of the build side, ready to probe.
#[derive(Debug)]
pub(crate) struct BuiltPartition {
    /// The partition's rows, in the build's held schema: the input's types, or the
    /// spill files' narrower ones where the level was expected to spill (which
    /// whatever reads its columns widens back: `spilljoin_spill::widen_column`).
    pub batch: RecordBatch,
    /// Each row's key hash (none for word keys, which are compared directly).
    pub hashes: ScalarBuffer<u64>,
    /// Each row's key, for equality checks.
    pub keys: KeyRepr,
    /// The hash table over the rows.
    pub table: ChainedTable,
}

/// A build partition that was written to disk.
#[derive(Debug)]
pub(crate) struct SpilledPartition {
    /// Its rows, with [`HASH_COLUMN`](crate::batches::HASH_COLUMN) last where the join
    /// spills hashes (`JoinPlan::spills_hashes`).
    pub file: SpillFile,
    /// The hashes it holds, to drop probe rows that cannot match.
    pub bloom: Option<Bloom>,
}

/// A partition of the build side after the build.
#[derive(Debug)]
pub(crate) enum Partition {
    /// In memory, with its table.
    InMemory(BuiltPartition),
    /// On disk, joined after the probe input ends.
    Spilled(SpilledPartition),
}

/// Rows whose key can never match, kept for the end.
#[derive(Debug, Default)]
pub(crate) struct Unmatchable {
    /// In memory.
    pub batches: Vec<RecordBatch>,
    /// Spilled (without a hash column).
    pub file: Option<SpillFile>,
}

/// The build side of one level, immutable once built.
#[derive(Debug)]
pub(crate) struct BuiltSide {
    /// The partitions, indexed by `level.bits.partition_of(hash)`.
    pub partitions: Vec<Partition>,
    /// Rows whose key can never match.
    pub unmatchable: Unmatchable,
    /// Every build input row of this level, the unmatchable ones included.
    pub num_rows: u64,
    /// Whether some build row has a null key.
    pub has_null_key: bool,
    /// Each key column's bounds, when the level kept them (empty otherwise).
    pub bounds: Vec<Option<KeyBounds>>,
    /// Everything in memory above, reserved.
    pub _reservation: MemoryReservation,
}
