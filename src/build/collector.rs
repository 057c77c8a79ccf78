//! The state the build workers share: the [`BuildCollector`] of one level, its locked
//! [`CollectorState`], and each partition's [`PartitionBuffer`] while the input is
//! still coming. Its own file because every step of the build (collecting, spilling,
//! finishing) works on these, and their lock order is stated here once:
//!
//! ```text
//!  CollectorState (the collector's lock) ─► a partition's Gathered ─► its SharedBloom
//!                                       └─► a partition's SharedWriter (takes no other)
//! ```

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};

use super::bloom_sizing::BloomSizing;
use super::write_outside_lock::{SharedWriter, Writes};
use crate::bloom::Bloom;
use crate::bounds::BoundsAccumulator;
use crate::context::{Ctx, Level, LevelFiles};
use crate::gather::{fixed_widths, gatherable, GatherBuffer};
use crate::plan::JoinPlan;
use crate::write_out::WritesOut;

/// A partition's rows while the build input is still coming.
#[derive(Debug, Default)]
pub(crate) struct PartitionBuffer {
    /// Buffered rows and their hashes (none for word keys; not yet written, if the
    /// partition is spilled).
    pub(super) fragments: Vec<(RecordBatch, Vec<u64>)>,
    /// Buffered rows gathered in the held schema ([`held_schema`]; with the hash
    /// column where spill files keep it) or, once spilled, the file schema, instead of
    /// fragments, when every column can be gathered ([`gatherable`]: not nested).
    /// Locked apart from the collector ([`Gathered`]), so that a worker copies rows in
    /// while others use the collector.
    pub(super) gathered: Gathered,
    /// Rows buffered.
    pub(super) rows: usize,
    /// Bytes buffered (held in the collector's reservation).
    pub(super) bytes: usize,
    /// Rows in the partition in all, buffered or written.
    pub(super) total_rows: u64,
    /// Set once the partition is spilled; locked apart from the collector, so that
    /// rows taken out of the buffers are written without holding the collector's lock.
    pub(super) writer: Option<SharedWriter>,
    /// The bloom filter of a spilled partition's keys ([`SharedBloom`]).
    pub(super) bloom: SharedBloom,
}

/// A partition's gathered rows. Lock order: the collector's state first, then these,
/// then a writer. A worker copies rows in holding only this lock: it takes it with
/// the collector's lock held, accounts for the rows there, then lets the collector's
/// lock go ([`BuildCollector::add_rows`]): whoever takes the rows out (to write them)
/// finds all of a worker's accounted rows copied in, or none. The copies were made
/// under the collector's lock before, and the workers queued behind each other for
/// it.
pub(super) type Gathered = Arc<Mutex<Option<GatherBuffer>>>;

/// A spilled partition's bloom filter, set when it spills. Locked last (after the
/// collector's state and the gathered rows): a worker adds its rows' hashes after
/// releasing the collector's lock. (Under it, the inserts — a cache miss each into
/// filters of up to a few MB — were most of what the workers still waited for.)
pub(super) type SharedBloom = Arc<Mutex<Option<Bloom>>>;

impl PartitionBuffer {
    /// Adds rows held in `bytes` of reserved memory.
    pub fn push(&mut self, batch: RecordBatch, hashes: Vec<u64>, bytes: usize) {
        self.rows += batch.num_rows();
        self.total_rows += batch.num_rows() as u64;
        self.bytes += bytes;
        self.fragments.push((batch, hashes));
    }

    /// Rows buffered.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes held for the buffered rows.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Everything the build workers share.
pub(super) struct CollectorState {
    pub(super) partitions: Vec<PartitionBuffer>,
    /// The unmatchable rows (no hashes), spillable like a partition.
    pub(super) unmatchable: PartitionBuffer,
    /// Holds the bytes of every buffered fragment.
    pub(super) reservation: MemoryReservation,
    /// The writes of rows taken out of spilled partitions that are under way
    /// ([`Writes`]): their bytes are still held in `reservation`, in no partition.
    pub(super) writes: Writes,
    /// Memory set aside, before the pool fills, for the bloom filters of the
    /// partitions expected to spill ([`BloomSizing`]): each takes its filter's bytes
    /// out of it when it spills. A partition spills when the pool is full, so a filter
    /// reserved only then was mostly refused. What is left is freed once the tables
    /// are planned.
    pub(super) bloom_reserve: MemoryReservation,
}

/// Collects the build input of one level into partitions, spilling as needed.
pub(crate) struct BuildCollector<'a> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) level: Level,
    pub(super) state: Mutex<CollectorState>,
    /// The writes of rows taken out of spilled partitions, from when they are taken
    /// out until they are written (or abandoned).
    pub(super) writes_out: WritesOut,
    pub(super) base: MemoryReservation,
    pub(super) spill_schema: SchemaRef,
    pub(super) largest_batch_bytes: AtomicUsize,
    /// Key bounds, when the level keeps them.
    pub(super) bounds: Mutex<BoundsAccumulator>,
    /// The spill schema's column widths when they are all fixed (what a row is
    /// known to take from its count).
    pub(super) widths: Option<Vec<usize>>,
    /// Whether every column of the spill schema can be gathered ([`gatherable`]):
    /// partitions gather their rows in place (`PartitionBuffer::gathered`) instead
    /// of keeping fragments.
    pub(super) gathers: bool,
    /// The spill files' wide schema ([`spilljoin_spill::file_schema`]), and whether
    /// spilled partitions gather in it (some column may halve, or the file holds it
    /// otherwise: a narrow decimal, a view column as offsets): a spilled
    /// partition gathers its rows in it, halved where they fit
    /// ([`GatherBuffer::halving`]), since they are only ever written.
    pub(super) file_schema: SchemaRef,
    pub(super) file_differs: bool,
    /// The schema in-memory partitions gather their rows in ([`held_schema`]): the
    /// spill schema, or the file schema where the level is expected to spill.
    pub(super) held_schema: SchemaRef,
    /// Per column of the file schema: `Int64`, so gathered as `Int32` when a batch's
    /// values fit.
    pub(super) halvable: Vec<bool>,
    /// Whether some partition has spilled (until then no batch is checked for what
    /// fits in 32 bits).
    pub(super) any_spilled: AtomicBool,
    /// The smallest and largest key word of the partitioned rows (one-word keys), for
    /// a key index shared by all partitions (`share_key_index`).
    pub(super) word_bounds: Mutex<Option<(u64, u64)>>,
    /// Workers started on this level (each gathers from its own first partition).
    pub(super) workers: AtomicUsize,
    /// The spilled partitions' bloom filters' size, when the level's rows are known
    /// beforehand.
    pub(super) blooms: Option<BloomSizing>,
    /// Where spilled partitions are written.
    pub(super) files: LevelFiles,
}

impl<'a> BuildCollector<'a> {
    pub(super) fn new(ctx: &'a Ctx<'a>, level: Level) -> Self {
        let base = MemoryConsumer::new("spilljoin build side")
            .with_can_spill(true)
            .register(&ctx.plan.pool);
        let fan_out = level.bits.fan_out();
        let file_schema = spilljoin_spill::file_schema(&ctx.plan.spill_schema(true));
        let widths = fixed_widths(&ctx.plan.spill_schema(true));
        let blooms = BloomSizing::new(ctx.plan, &level, widths.as_deref());
        let bloom_reserve = BloomSizing::set_aside(blooms, &base);
        let held_schema = held_schema(ctx.plan, &level, &file_schema);
        Self {
            ctx,
            level,
            state: Mutex::new(CollectorState {
                partitions: (0..fan_out).map(|_| PartitionBuffer::default()).collect(),
                unmatchable: PartitionBuffer::default(),
                reservation: base.new_empty(),
                writes: Writes::default(),
                bloom_reserve,
            }),
            writes_out: WritesOut::default(),
            spill_schema: ctx.plan.spill_schema(true),
            widths,
            gathers: gatherable(&ctx.plan.spill_schema(true)),
            blooms,
            // (When no column can halve or is stored otherwise, spilled partitions
            // keep gathering in the spill schema.)
            file_differs: crate::gather::halvable(&file_schema).contains(&true)
                || file_schema != ctx.plan.spill_schema(true),
            halvable: crate::gather::halvable(&file_schema),
            held_schema,
            file_schema,
            word_bounds: Mutex::new(None),
            workers: AtomicUsize::new(0),
            any_spilled: AtomicBool::new(false),
            base,
            largest_batch_bytes: AtomicUsize::new(0),
            bounds: Mutex::default(),
            files: LevelFiles::new(ctx, level.depth, true),
        }
    }

    pub(super) fn plan(&self) -> &JoinPlan {
        self.ctx.plan
    }
}

/// The schema a level's in-memory partitions gather their rows in: the spill files'
/// (decimals of at most 18 digits as `Int64`, view columns as offsets, none halved)
/// where the level is expected to spill, else the spill schema.
///
/// A row of strings and decimals takes up to a third less memory held so (a view is
/// 16 bytes, an offset 4; BENCHMARKS.md has the measured rows), so more partitions
/// stay in memory under the same limit, and less of both inputs is written and read
/// back. Output rows then widen what they take from those partitions
/// (`OutputLayout::gather`), which a join that fits does not pay: it keeps the spill
/// schema. Level 0 only, where the build's bytes are known beforehand
/// (`JoinPlan::build_bytes_hint`); limits under 2 GiB only; and only when every
/// column gathers and no key column narrows, since keys are read from the rows as
/// they are held.
fn held_schema(plan: &JoinPlan, level: &Level, file_schema: &SchemaRef) -> SchemaRef {
    let spill_schema = plan.spill_schema(true);
    let limit = plan.pool.limit().bytes();
    // (Under 2 GiB, since a held view column's offsets are 32-bit and a partition
    // that stays in memory is one batch: its bytes are reserved, so within the limit.
    // Views start a new data block where offsets would overflow.)
    let spills = level.depth == 0
        && limit <= i32::MAX as usize
        && plan
            .build_bytes_hint
            .is_some_and(|bytes| bytes > limit as u64);
    let keys_stay = plan.keys.build_columns.iter().all(|&k| {
        spill_schema.fields().get(k).map(|f| f.data_type())
            == file_schema.fields().get(k).map(|f| f.data_type())
    });
    if spills && keys_stay && gatherable(&spill_schema) {
        Arc::clone(file_schema)
    } else {
        spill_schema
    }
}
