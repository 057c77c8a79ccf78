//! The build phase: the build input, radix-partitioned into hash tables, spilling the
//! largest partitions when memory runs out.
//!
//! ```text
//!  build batches ─► keys ─► hash ─► partition (high bits) ─► per-partition buffers:
//!   (N threads pull from the input streams)                   rows gathered compactly
//!                                                              (`GatherBuffer`, every
//!                                                              type but nested ones,
//!                                                              which keep fragments),
//!                                                              with their hashes (not
//!                                                              for word keys)
//!                                                              │
//!        a reservation fails? ─► flush the buffered rows of an already spilled
//!                                partition, else spill the largest in-memory one
//!                                (IPC file, hashes kept as a column unless
//!                                the key is one word; bloom filter)
//!  end of input ─► force-spill (tests), reserve probe headroom, then give every
//!                  in-memory partition its table (spilling more if tables don't fit)
//!                  ─► BuiltSide (immutable): in-memory partitions + spilled files
//! ```
//!
//! **The spill trigger** is [`BuildCollector::reserve`]: a failed reservation is the
//! only reason to spill, and the victim is the partition holding the most buffered
//! bytes. Spilled partitions keep receiving rows, buffered a batch at a time; a full
//! buffer is taken out under the collector's lock and written after it is released
//! (each spilled partition's writer has a lock of its own), so that under a small
//! limit, where most rows are written, the workers do not queue behind each other's
//! writes.
//!
//! Rows whose key can never match (a null key under SQL equality) are not hashed into
//! any partition: joins that output unmatched build rows keep them aside (spilled like
//! a partition if memory runs out), the others drop them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{RecordBatch, UInt32Array};
use arrow_buffer::ScalarBuffer;
use arrow_data::ArrayData;
use arrow_schema::{ArrowError, DataType, SchemaRef};
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};
use spilljoin_spill::{SpillFile, SpillWriter};

use crate::batches::{
    attach_hashes, batch_bytes, lock, pieces, run_workers, write_counted, InputStreams,
};
use crate::bloom::Bloom;
use crate::bounds::{BoundsAccumulator, KeyBounds};
use crate::context::{Ctx, Level, LevelFiles};
use crate::error::{JoinError, Result};
use crate::gather::{fixed_widths, gatherable, GatherBuffer, Growth};
use crate::hash::hash_keys;
use crate::keys::KeyRepr;
use crate::partition::PartitionedRows;
use crate::plan::JoinPlan;
use crate::table::{ChainedTable, MAX_TABLE_ROWS};

/// One partition of the build side, ready to probe.
#[derive(Debug)]
pub(crate) struct BuiltPartition {
    /// The partition's rows.
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
    /// Its rows, with [`HASH_COLUMN`] last where the join spills hashes
    /// (`JoinPlan::spills_hashes`).
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

/// A partition's rows while the build input is still coming.
#[derive(Debug, Default)]
pub(crate) struct PartitionBuffer {
    /// Buffered rows and their hashes (none for word keys; not yet written, if the
    /// partition is spilled).
    fragments: Vec<(RecordBatch, Vec<u64>)>,
    /// Buffered rows gathered in the spill schema (with the hash column where spill
    /// files keep it), instead of fragments, when every column can be gathered
    /// ([`gatherable`]: not nested).
    /// Locked apart from the collector ([`Gathered`]), so that a worker copies rows in
    /// while others use the collector.
    gathered: Gathered,
    /// Rows buffered.
    rows: usize,
    /// Bytes buffered (held in the collector's reservation).
    bytes: usize,
    /// Rows in the partition in all, buffered or written.
    total_rows: u64,
    /// Set once the partition is spilled; locked apart from the collector, so that
    /// rows taken out of the buffers are written without holding the collector's lock.
    writer: Option<SharedWriter>,
    /// The bloom filter of a spilled partition's keys ([`SharedBloom`]).
    bloom: SharedBloom,
}

/// A partition's gathered rows. Lock order: the collector's state first, then these,
/// then a writer. A worker copies rows in holding only this lock: it takes it with
/// the collector's lock held, accounts for the rows there, then lets the collector's
/// lock go ([`BuildCollector::add_rows`]): whoever takes the rows out (to write them)
/// finds all of a worker's accounted rows copied in, or none. The copies were made
/// under the collector's lock before: at SF10 orders' 25% limit its two workers
/// waited for it 0.16–0.18 s of a 0.52 s build.
type Gathered = Arc<Mutex<Option<GatherBuffer>>>;

/// How long a build worker waiting for a write to end sleeps before it looks again
/// whether the join was cancelled ([`BuildCollector::wait_for_a_write`]).
const WRITE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A spilled partition's bloom filter, set when it spills. Locked last (after the
/// collector's state and the gathered rows): a worker adds its rows' hashes after
/// releasing the collector's lock. (Under it, the inserts — a cache miss each into
/// filters of up to a few MB — were most of what the workers still waited for.)
type SharedBloom = Arc<Mutex<Option<Bloom>>>;

/// A spilled partition's writer, shared between the collector and a worker writing
/// rows taken out of the partition's buffers. Lock order: the collector's state
/// first, then a writer; a worker holding a writer takes no other lock.
type SharedWriter = Arc<Mutex<SpillWriter>>;

/// A spilled partition's buffered rows, taken out under the collector's lock to be
/// written without it ([`BuildCollector::write_unwritten`]). Their bytes stay in the
/// collector's reservation, counted in `CollectorState::unwritten_bytes`, until they
/// are written: a worker short of memory with nothing else to spill waits for them.
struct Unwritten {
    writer: SharedWriter,
    gathered: Option<RecordBatch>,
    fragments: Vec<(RecordBatch, Vec<u64>)>,
    bytes: usize,
    /// The rows of a partition that has just spilled (`CollectorState::victim_writes`).
    victim: bool,
}

/// The end of a write of rows taken out of a spilled partition
/// ([`BuildCollector::write_unwritten`]), when dropped: their memory goes back and the
/// workers waiting for a write to end are woken. (The writer's lock is released by
/// then, so the collector's may be taken.)
struct WriteEnded<'c, 'a> {
    collector: &'c BuildCollector<'a>,
    bytes: usize,
    victim: bool,
}

impl Drop for WriteEnded<'_, '_> {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.collector.state);
            // Saturating: a panic here, while a panic unwinds, would abort.
            let held = state.reservation.size();
            state.reservation.shrink(self.bytes.min(held));
            state.unwritten_bytes = state.unwritten_bytes.saturating_sub(self.bytes);
            state.writes_ended += 1;
            state.victim_writes = state.victim_writes.saturating_sub(usize::from(self.victim));
        }
        self.collector.written.notify_all();
    }
}

/// Closes the file of a spilled partition whose buffers are all written: no worker
/// holds its writer any more.
fn finish_shared(writer: SharedWriter) -> Result<SpillFile> {
    let writer = Arc::try_unwrap(writer)
        .map_err(|_| JoinError::Internal("a spill writer still in use".into()))?
        .into_inner()
        .map_err(|_| JoinError::Internal("a spill writer's lock was poisoned".into()))?;
    Ok(writer.finish()?)
}

impl PartitionBuffer {
    /// Takes a spilled partition's buffered rows out, to be written without the
    /// collector's lock; `None` when the partition is not spilled or holds nothing.
    ///
    /// The buffers that gather the next rows are allocated for as many rows as were
    /// taken, up to `batch_rows` (a partition is written when it holds that many):
    /// grown from nothing by doubling, they would copy what they hold once more in a
    /// dozen allocations for every batch written. (What `MutableBuffer::reallocate`
    /// still costs at SF10 orders' 25% limit, ~10% of the build's CPU, is the growth
    /// of partitions not yet spilled.)
    fn take_unwritten(&mut self, batch_rows: usize) -> Result<Option<Unwritten>> {
        let Some(writer) = self.writer.as_ref() else {
            return Ok(None);
        };
        let mut cell = lock(&self.gathered);
        let gathered = match cell.as_mut() {
            Some(g) if !g.is_empty() => {
                g.expect_rows(g.len().min(g.rows_in_bytes_of(batch_rows)));
                Some(g.finish()?)
            }
            _ => None,
        };
        if gathered.is_none() && self.fragments.is_empty() {
            return Ok(None);
        }
        let unwritten = Unwritten {
            writer: Arc::clone(writer),
            gathered,
            fragments: std::mem::take(&mut self.fragments),
            bytes: self.bytes,
            victim: false,
        };
        self.bytes = 0;
        self.rows = 0;
        Ok(Some(unwritten))
    }

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

/// One build worker's buffers, reused from batch to batch.
struct CollectScratch {
    /// Holds the batch in flight and fragments not yet handed to a partition.
    mine: MemoryReservation,
    /// Holds what a partition's gathered rows will grow by, until they do.
    pending: MemoryReservation,
    hashes: Vec<u64>,
    grouped: PartitionedRows,
    /// The partition this worker gathers into first: workers start apart, so that
    /// they seldom wait for the same partition's lock ([`Gathered`]).
    first_partition: usize,
}

/// Everything the build workers share.
struct CollectorState {
    partitions: Vec<PartitionBuffer>,
    /// The unmatchable rows (no hashes), spillable like a partition.
    unmatchable: PartitionBuffer,
    /// Holds the bytes of every buffered fragment.
    reservation: MemoryReservation,
    /// Bytes of rows taken out of spilled partitions and being written: still held in
    /// `reservation`, in no partition, and given back when written.
    unwritten_bytes: usize,
    /// How many such writes have ended (a worker waiting for memory waits for the
    /// next, not for all: others may keep taking rows out meanwhile).
    writes_ended: u64,
    /// How many of them are of partitions that have just spilled: a worker short of
    /// memory waits for such a write to end before it spills one more partition,
    /// which might not have had to spill.
    victim_writes: usize,
    /// Memory set aside, before the pool fills, for the bloom filters of the
    /// partitions expected to spill ([`BloomSizing`]): each takes its filter's bytes
    /// out of it when it spills. A partition spills when the pool is full, so a filter
    /// reserved only then was mostly refused (SF10 `NOT IN` at 25%: 36 of 64
    /// partitions without one). What is left is freed once the tables are planned.
    bloom_reserve: MemoryReservation,
}

impl CollectorState {
    /// Takes spilled partition `p`'s buffered rows out, to be written without the
    /// collector's lock ([`BuildCollector::write_unwritten`]).
    fn take_unwritten(&mut self, p: usize, batch_rows: usize) -> Result<Option<Unwritten>> {
        let unwritten = match self.partitions.get_mut(p) {
            Some(part) => part.take_unwritten(batch_rows)?,
            None => None,
        };
        if let Some(u) = &unwritten {
            self.unwritten_bytes += u.bytes;
        }
        Ok(unwritten)
    }
}

/// Collects the build input of one level into partitions, spilling as needed.
pub(crate) struct BuildCollector<'a> {
    ctx: &'a Ctx<'a>,
    level: Level,
    state: Mutex<CollectorState>,
    /// Signalled when rows taken out of a spilled partition are written
    /// (`CollectorState::writes_ended` grew).
    written: Condvar,
    base: MemoryReservation,
    spill_schema: SchemaRef,
    largest_batch_bytes: AtomicUsize,
    /// Key bounds, when the level keeps them.
    bounds: Mutex<BoundsAccumulator>,
    /// The spill schema's column widths when they are all fixed (what a row is
    /// known to take from its count).
    widths: Option<Vec<usize>>,
    /// Whether every column of the spill schema can be gathered ([`gatherable`]):
    /// partitions gather their rows in place (`PartitionBuffer::gathered`) instead
    /// of keeping fragments.
    gathers: bool,
    /// The spill files' wide schema ([`spilljoin_spill::file_schema`]), and whether
    /// spilled partitions gather in it (some column may halve): a spilled partition
    /// gathers its rows in it, halved where they fit ([`GatherBuffer::halving`]),
    /// since they are only ever written.
    file_schema: SchemaRef,
    file_halves: bool,
    /// Per column of the file schema: `Int64`, so gathered as `Int32` when a batch's
    /// values fit.
    halvable: Vec<bool>,
    /// Whether some partition has spilled (until then no batch is checked for what
    /// fits in 32 bits).
    any_spilled: AtomicBool,
    /// The smallest and largest key word of the partitioned rows (one-word keys), for
    /// a key index shared by all partitions (`share_key_index`).
    word_bounds: Mutex<Option<(u64, u64)>>,
    /// Workers started on this level (each gathers from its own first partition).
    workers: AtomicUsize,
    /// The spilled partitions' bloom filters' size, when the level's rows are known
    /// beforehand.
    blooms: Option<BloomSizing>,
    /// Where spilled partitions are written.
    files: LevelFiles,
}

/// The filters' share of the memory limit, at most: a filter skips writing, reading
/// and probing again the probe rows without a partner (SF10 `NOT IN`, 54% of them),
/// and is switched off by the probe where it skips too few (orders ⋈ lineitem, none).
const BLOOM_LIMIT_SHARE: usize = 4;

/// The fewest bits per expected row worth a filter. SF10 `NOT IN` (8.49M probe rows
/// without a partner): at 1.6 bits a row (6.5 MiB limit, 64 partitions) the filters
/// skipped 5.33M of them; at 0.8 bits (3.3 MiB, 128 partitions) 56K, while every
/// spilled build row was still inserted (0.1 s of CPU) and the probe's trial still
/// looked rows up. Below this, no partition gets one.
const MIN_BLOOM_BITS_PER_ROW: usize = 1;

/// How large the bloom filter of each spilled partition of level 0 is, when the
/// build's rows are known before it is read (statistics,
/// [`JoinPlan::build_rows_hint`]): sized for the rows a
/// partition will hold in the end, not for twice those it holds when it spills (a
/// partition of SF10 `NOT IN` at 25% spilled with ~18K of its ~134K rows), and
/// reserved before the pool fills for the partitions expected to spill.
#[derive(Debug, Clone, Copy)]
struct BloomSizing {
    /// Each filter's bytes: [`BITS_PER_ROW`](crate::bloom::BITS_PER_ROW) bits for
    /// each of a partition's expected rows, or the limit's share divided among the
    /// partitions expected to spill (all of it when none is expected), whichever is
    /// smaller; at least 1 KiB, at most 1 MiB. 0 when the limit's share gives fewer
    /// than [`MIN_BLOOM_BITS_PER_ROW`] bits a row: no partition gets a filter.
    bytes: usize,
    /// Partitions expected to spill: those that a quarter of the limit (the rest is
    /// for tables, buffers and the probe's headroom) cannot hold.
    prepaid: usize,
}

impl BloomSizing {
    fn new(plan: &JoinPlan, level: &Level, widths: Option<&[usize]>) -> Option<Self> {
        let limit = plan.pool.limit().bytes();
        if limit == usize::MAX || limit == 0 {
            return None;
        }
        // Level 0 only: below it, a pair that did not split (one key holds most of
        // it) would keep a quarter of the limit from the chunks of its fallback (a
        // harness case of a hot key under 1 MiB took 96 s instead of 30).
        if level.depth > 0 {
            return None;
        }
        let rows = plan.build_rows_hint?;
        let fan_out = level.bits.fan_out();
        if rows == 0 || fan_out < 2 {
            return None;
        }
        let row_bytes = widths.map_or(32, |widths| widths.iter().sum::<usize>()) as u64;
        let bytes = plan
            .build_bytes_hint
            .unwrap_or(rows.saturating_mul(row_bytes));
        let kept = (limit / 4) as f64 / bytes.max(1) as f64;
        let prepaid = ((1.0 - kept).max(0.0) * fan_out as f64).ceil() as usize;
        let budget = limit / BLOOM_LIMIT_SHARE / prepaid.max(1);
        let rows_each = usize::try_from(rows.div_ceil(fan_out as u64)).unwrap_or(usize::MAX);
        let bytes = Bloom::bytes_within(rows_each, budget);
        // (The limit's share, not the filter's bytes, which a partition of more than
        // 8Mi rows finds capped at 1 MiB whatever the limit.)
        if budget.max(bytes).saturating_mul(8) < rows_each.saturating_mul(MIN_BLOOM_BITS_PER_ROW) {
            // Too few bits to skip much: no filters at all.
            return Some(Self {
                bytes: 0,
                prepaid: 0,
            });
        }
        Some(Self { bytes, prepaid })
    }
}

impl<'a> BuildCollector<'a> {
    fn new(ctx: &'a Ctx<'a>, level: Level) -> Self {
        let base = MemoryConsumer::new("spilljoin build side")
            .with_can_spill(true)
            .register(&ctx.plan.pool);
        let fan_out = level.bits.fan_out();
        let file_schema = spilljoin_spill::file_schema(&ctx.plan.spill_schema(true));
        let widths = fixed_widths(&ctx.plan.spill_schema(true));
        let blooms = BloomSizing::new(ctx.plan, &level, widths.as_deref());
        let mut bloom_reserve = base.new_empty();
        if let Some(sizing) = blooms {
            // As many whole filters as the pool grants (a limit shared with other
            // pairs may grant fewer); the others are reserved when their partitions
            // spill, if memory allows then.
            let mut count = sizing.prepaid;
            while count > 0 && bloom_reserve.try_grow(sizing.bytes * count).is_err() {
                count /= 2;
            }
        }
        Self {
            ctx,
            level,
            state: Mutex::new(CollectorState {
                partitions: (0..fan_out).map(|_| PartitionBuffer::default()).collect(),
                unmatchable: PartitionBuffer::default(),
                reservation: base.new_empty(),
                unwritten_bytes: 0,
                writes_ended: 0,
                victim_writes: 0,
                bloom_reserve,
            }),
            written: Condvar::new(),
            spill_schema: ctx.plan.spill_schema(true),
            widths,
            gathers: gatherable(&ctx.plan.spill_schema(true)),
            blooms,
            // (When no column can halve, spilled partitions keep gathering in the
            // spill schema.)
            file_halves: crate::gather::halvable(&file_schema).contains(&true),
            halvable: crate::gather::halvable(&file_schema),
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

    fn plan(&self) -> &JoinPlan {
        self.ctx.plan
    }

    /// Grows `reservation` by `bytes`, spilling buffered build rows until it fits.
    ///
    /// # Errors
    /// [`JoinError::ResourcesExhausted`] when nothing is left to spill: the limit is
    /// below what one batch in flight needs.
    pub fn reserve(&self, reservation: &mut MemoryReservation, bytes: usize) -> Result<()> {
        loop {
            match reservation.try_grow(bytes) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if !self.spill_something(None)? {
                        // Another worker may have freed memory (by spilling) while
                        // this one waited for the lock: one more try before giving up.
                        return reservation.try_grow(bytes).map_err(|_| e.into());
                    }
                }
            }
        }
    }

    /// Frees memory: first the fullest buffer of an already spilled partition (its
    /// rows are written anyway), else waits while another worker writes out a
    /// partition that has just spilled, else spills the in-memory partition (or the
    /// unmatchable rows) holding the most bytes, except `keep`. Returns false when
    /// there is nothing to free.
    ///
    /// While the build reads its input (no `keep`) and partitions are still in
    /// memory, the spilled partitions' buffers may first fill up to
    /// [`spilled_buffer_budget`](Self::spilled_buffer_budget) together: drained at every
    /// shortage, they were written a few KiB at a time (SF10 orders under a 5% limit:
    /// 35,597 writes of ~6 KiB while one partition stayed in memory) — one IPC
    /// message and one system call each.
    fn spill_something(&self, keep: Option<&[bool]>) -> Result<bool> {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let spilled_buffer = state
            .partitions
            .iter()
            .enumerate()
            .filter(|(_, p)| p.writer.is_some() && p.bytes > 0)
            .max_by_key(|(_, p)| p.bytes)
            .map(|(i, _)| i);
        let victim = state
            .partitions
            .iter()
            .enumerate()
            .filter(|(i, p)| p.writer.is_none() && p.bytes > 0 && keep.is_none_or(|k| !k[*i]))
            .max_by_key(|(_, p)| p.bytes)
            .map(|(i, p)| (i, p.bytes));
        let buffers_first = keep.is_some() || victim.is_none() || {
            let (spilled, buffered) = state
                .partitions
                .iter()
                .filter(|p| p.writer.is_some())
                .fold((0, 0), |(n, bytes), p| (n + 1, bytes + p.bytes));
            buffered >= self.spilled_buffer_budget(spilled)
        };
        if let (Some(p), true) = (spilled_buffer, buffers_first) {
            self.write_out(guard, p)?;
            return Ok(true);
        }
        let unmatchable_bytes = if state.unmatchable.writer.is_none() {
            state.unmatchable.bytes
        } else {
            0
        };
        match victim {
            // A partition that has just spilled is being written: its memory comes
            // back when that is done, and perhaps no other partition need spill.
            Some(_) if keep.is_none() && state.victim_writes > 0 => self.wait_for_a_write(guard),
            Some((p, bytes)) if bytes >= unmatchable_bytes => {
                let unwritten = self.spill_partition(state, p)?;
                drop(guard);
                if let Some(unwritten) = unwritten {
                    self.write_unwritten(unwritten)?;
                }
                Ok(true)
            }
            _ if state.unmatchable.bytes > 0 => {
                self.spill_unmatchable(&mut state.unmatchable, &mut state.reservation)?;
                Ok(true)
            }
            // Another worker is writing rows it took out of a partition: their memory
            // comes back when it is done.
            _ if state.unwritten_bytes > 0 => self.wait_for_a_write(guard),
            // Nothing left to spill but the filters' memory set aside (statistics
            // that promised more rows than came): better used than refused.
            _ if state.bloom_reserve.size() > 0 => {
                state.bloom_reserve.free();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Waits until the next write of rows taken out of a spilled partition ends (their
    /// memory is back), and says that something was freed. The wait gives up once the
    /// join is cancelled — another worker failed — and wakes every
    /// [`WRITE_WAIT`] to look: no worker waits for a write that will never end.
    ///
    /// # Errors
    /// [`JoinError::Cancelled`] when the join was cancelled meanwhile.
    fn wait_for_a_write(&self, guard: MutexGuard<'_, CollectorState>) -> Result<bool> {
        let seen = guard.writes_ended;
        let cancelled = || self.ctx.cancel.load(Ordering::Relaxed);
        let _written = self
            .written
            .wait_timeout_while(guard, WRITE_WAIT, |s| {
                s.writes_ended == seen && !cancelled()
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if cancelled() {
            return Err(JoinError::Cancelled);
        }
        Ok(true)
    }

    /// What the buffers of `spilled` spilled partitions may hold together before one
    /// is written to make room while partitions are still in memory: a quarter of a
    /// full batch each on average (a full one is written at once), and at most a
    /// quarter of the limit.
    fn spilled_buffer_budget(&self, spilled: usize) -> usize {
        let plan = self.plan();
        let row_bytes = self
            .widths
            .as_deref()
            .map_or(32, |widths| widths.iter().sum::<usize>());
        (spilled * plan.work_rows * row_bytes / 4).min(plan.pool.limit().bytes() / 4)
    }

    /// Starts spilling partition `p`: opens its file and its bloom filter (filled with
    /// the hashes of the rows it holds), and takes those rows out, to be written once
    /// the collector's lock is released ([`write_unwritten`](Self::write_unwritten);
    /// their memory stays held until then). Written under the lock, they kept the
    /// other workers waiting for it (SF10 orders' 25% limit: 57 partitions of ~1.6 MB).
    fn spill_partition(&self, state: &mut CollectorState, p: usize) -> Result<Option<Unwritten>> {
        let ctx = self.ctx;
        self.any_spilled.store(true, Ordering::Relaxed);
        let Some(part) = state.partitions.get_mut(p) else {
            return Err(JoinError::Internal(format!(
                "spilling partition {p} of {}",
                state.partitions.len()
            )));
        };
        part.writer = Some(Arc::new(Mutex::new(self.files.create_writer(
            ctx,
            Arc::clone(&self.spill_schema),
            p,
        )?)));
        ctx.metrics
            .partitions_spilled
            .fetch_add(1, Ordering::Relaxed);
        // The filter is sized for the partition's expected rows where the level's are
        // known; otherwise for those seen so far times the input still to come, which
        // is unknown: assume the partition doubles.
        let bloom_bytes = match self.blooms {
            Some(sizing) => sizing.bytes,
            None => Bloom::bytes_for(
                usize::try_from(part.total_rows)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(2),
            ),
        };
        let bloom = if bloom_bytes == 0 {
            None
        } else if state.bloom_reserve.size() >= bloom_bytes {
            let prepaid = state.bloom_reserve.split(bloom_bytes);
            state.reservation.merge(prepaid);
            Some(Bloom::with_bytes(bloom_bytes))
        } else {
            state
                .reservation
                .try_grow(bloom_bytes)
                .is_ok()
                .then(|| Bloom::with_bytes(bloom_bytes))
        };
        // (From now on a gathering buffer holds a batch at a time, not all the rows a
        // one-partition build expected to keep, `Level::build_rows`:
        // `PartitionBuffer::take_unwritten` sees to it.)
        let unwritten = state.take_unwritten(p, self.plan().work_rows)?;
        let Some(part) = state.partitions.get_mut(p) else {
            return Ok(unwritten);
        };
        if unwritten.is_none() {
            // No rows, perhaps an emptied buffer's capacity: nothing to write.
            state.reservation.shrink(std::mem::take(&mut part.bytes));
        }
        if let Some(mut bloom) = bloom {
            debug_assert_eq!(bloom.size(), bloom_bytes);
            if let Some(u) = &unwritten {
                if let Err(e) = self.fill_bloom(&mut bloom, u) {
                    // The rows taken out will not be written: no worker may wait for
                    // their write to end.
                    state.unwritten_bytes = state.unwritten_bytes.saturating_sub(u.bytes);
                    state.writes_ended += 1;
                    self.written.notify_all();
                    return Err(e);
                }
            }
            *lock(&part.bloom) = Some(bloom);
        }
        state.victim_writes += usize::from(unwritten.is_some());
        Ok(unwritten.map(|u| Unwritten { victim: true, ..u }))
    }

    /// Adds the hashes of rows taken out of a partition that is spilling to its bloom
    /// filter. Word-key rows keep no hashes: their keys are hashed again (a transient
    /// buffer of at most a batch's rows).
    fn fill_bloom(&self, bloom: &mut Bloom, u: &Unwritten) -> Result<()> {
        let mut again = Vec::new();
        for (batch, hashes) in &u.fragments {
            let hashes = if hashes.len() == batch.num_rows() {
                hashes
            } else {
                self.plan().hash_rows(batch, true, &mut again)?;
                &again
            };
            bloom.insert_all(hashes.len(), |i| hashes[i]);
        }
        if let Some(batch) = &u.gathered {
            for slice in slices(batch, self.plan().work_rows) {
                if self.plan().spills_hashes() {
                    let hashes = hash_column(&slice)?;
                    bloom.insert_all(hashes.len(), |i| hashes[i]);
                } else {
                    self.plan().hash_rows(&slice, true, &mut again)?;
                    bloom.insert_all(again.len(), |i| again[i]);
                }
            }
        }
        Ok(())
    }

    /// Writes a spilled partition's buffered rows to its file (see
    /// [`write_rows`](Self::write_rows)), giving their memory back as it goes.
    fn flush(&self, part: &mut PartitionBuffer, reservation: &mut MemoryReservation) -> Result<()> {
        if part.writer.is_none() {
            return Err(JoinError::Internal(
                "flushing an unspilled partition".into(),
            ));
        }
        let Some(Unwritten {
            writer,
            gathered,
            fragments,
            bytes: mut held,
            ..
        }) = part.take_unwritten(self.plan().work_rows)?
        else {
            reservation.shrink(std::mem::take(&mut part.bytes));
            return Ok(());
        };
        // Give the memory back as it is written, not after the whole partition: other
        // workers are waiting for it.
        let written = self.write_rows(&writer, gathered, fragments, |bytes| {
            let freed = bytes.min(held);
            reservation.shrink(freed);
            held -= freed;
        });
        reservation.shrink(held);
        written
    }

    /// Writes a spilled partition's buffered rows with its writer locked: `gathered`
    /// in slices of the batch size, `fragments` concatenated into batches of about the
    /// batch size (never one huge batch: it must be read back in little memory), each
    /// concatenation a transient copy reserved (`grow`) while it lives. Calls
    /// `written(bytes)` with the bytes of each group of fragments once written.
    fn write_rows(
        &self,
        writer: &Mutex<SpillWriter>,
        gathered: Option<RecordBatch>,
        fragments: Vec<(RecordBatch, Vec<u64>)>,
        mut written: impl FnMut(usize),
    ) -> Result<()> {
        let counters = self.ctx.metrics.spill_counters(true);
        let batch_size = self.plan().work_rows.max(1);
        let mut writer = lock(writer);
        let mut write = |batch: &RecordBatch| write_counted(&mut writer, batch, &counters);
        if let Some(batch) = gathered {
            // Slices of a work batch's bytes at the spill schema's widths: more rows
            // where the batch was gathered narrow (decimals as 8 bytes, 32-bit
            // columns), so as few writes as the bytes allow.
            let wide: usize = self.widths.iter().flatten().sum();
            let narrow: usize = fixed_widths(batch.schema_ref()).iter().flatten().sum();
            let slice_rows = if narrow > 0 && wide > narrow {
                batch_size * wide / narrow
            } else {
                batch_size
            };
            // (Each slice's view data cut to its rows': a file writes every buffer
            // an array has.)
            for start in (0..batch.num_rows()).step_by(slice_rows.max(1)) {
                let len = slice_rows.max(1).min(batch.num_rows() - start);
                write(&crate::gather::slice_batch(&batch, start, len)?)?;
            }
        }
        let mut transient = self.base.new_empty();
        let mut group: Vec<RecordBatch> = Vec::new();
        let (mut group_rows, mut group_bytes) = (0, 0);
        let last = fragments.len();
        for (i, (batch, hashes)) in fragments.into_iter().enumerate() {
            group_rows += batch.num_rows();
            group_bytes += batch_bytes(&batch) + hashes.capacity() * 8;
            group.push(attach_hashes(&batch, hashes, &self.spill_schema)?);
            if group_rows >= batch_size || group_bytes >= self.plan().piece_bytes() || i + 1 == last
            {
                if group.len() == 1 {
                    write(&group[0])?;
                } else {
                    let merged = concat_batches(&self.spill_schema, &group)?;
                    transient.grow(batch_bytes(&merged));
                    write(&merged)?;
                    transient.free();
                }
                group.clear();
                written(group_bytes);
                (group_rows, group_bytes) = (0, 0);
            }
        }
        Ok(())
    }

    /// Writes the unmatchable rows to their own file (no hash column).
    fn spill_unmatchable(
        &self,
        part: &mut PartitionBuffer,
        reservation: &mut MemoryReservation,
    ) -> Result<()> {
        let ctx = self.ctx;
        if part.writer.is_none() {
            part.writer = Some(Arc::new(Mutex::new(self.files.create_writer(
                ctx,
                Arc::clone(&ctx.plan.build_schema),
                0,
            )?)));
        }
        for (batch, _) in std::mem::take(&mut part.fragments) {
            if let Some(w) = part.writer.as_ref() {
                write_counted(&mut lock(w), &batch, &ctx.metrics.spill_counters(true))?;
            }
        }
        reservation.shrink(part.bytes);
        part.bytes = 0;
        part.rows = 0;
        Ok(())
    }

    /// Adds a fragment (reserved in `mine`) to partition `p`, with `hashes` (its rows'
    /// hashes, or none where the partition does not keep them) and `row_hashes` (its
    /// rows' hashes, for the partition's bloom filter if it has one).
    fn add(
        &self,
        p: Option<usize>,
        fragment: RecordBatch,
        hashes: Vec<u64>,
        row_hashes: impl Iterator<Item = u64>,
        bytes: usize,
        mine: &mut MemoryReservation,
    ) -> Result<()> {
        let batch_size = self.plan().work_rows;
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        state.reservation.merge(mine.split(bytes));
        let part = match p {
            Some(p) => &mut state.partitions[p],
            None => &mut state.unmatchable,
        };
        if let Some(bloom) = lock(&part.bloom).as_mut() {
            row_hashes.for_each(|h| bloom.insert(h));
        }
        part.rows += fragment.num_rows();
        part.total_rows += fragment.num_rows() as u64;
        part.bytes += bytes;
        part.fragments.push((fragment, hashes));
        // A spilled partition writes its rows a batch at a time (partitions without
        // the collector's lock held).
        if part.writer.is_some() && part.rows >= batch_size {
            match p {
                Some(p) => self.write_out(guard, p)?,
                None => self.spill_unmatchable(&mut state.unmatchable, &mut state.reservation)?,
            }
        }
        Ok(())
    }

    /// Takes spilled partition `p`'s buffered rows out under `guard` and writes them
    /// once it is released ([`write_unwritten`](Self::write_unwritten)).
    fn write_out(&self, mut guard: MutexGuard<'_, CollectorState>, p: usize) -> Result<()> {
        let unwritten = guard.take_unwritten(p, self.plan().work_rows)?;
        drop(guard);
        unwritten.map_or(Ok(()), |u| self.write_unwritten(u))
    }

    /// Writes rows taken out of a spilled partition ([`PartitionBuffer::take_unwritten`])
    /// with only its writer locked, then gives their memory back.
    fn write_unwritten(&self, unwritten: Unwritten) -> Result<()> {
        let Unwritten {
            writer,
            gathered,
            fragments,
            bytes,
            victim,
        } = unwritten;
        // Ends the write however `write_rows` returns, a panic included: workers
        // waiting for memory wait for this write to end.
        let _ended = WriteEnded {
            collector: self,
            bytes,
            victim,
        };
        self.write_rows(&writer, gathered, fragments, |_| {})
    }

    /// Reads one worker's share of the input.
    fn collect<I>(
        &self,
        input: &InputStreams<I>,
        num_rows: &AtomicU64,
        has_null_key: &AtomicBool,
    ) -> Result<()>
    where
        I: Iterator<Item = Result<RecordBatch, ArrowError>>,
    {
        let plan = self.plan();
        let ctx = self.ctx;
        let mut scratch = CollectScratch {
            mine: self.base.new_empty(),
            pending: self.base.new_empty(),
            hashes: Vec::new(),
            grouped: PartitionedRows::default(),
            first_partition: self.workers.fetch_add(1, Ordering::Relaxed)
                * self.level.bits.fan_out()
                / self.plan().threads.max(1),
        };
        let mut current = None;
        loop {
            if ctx.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            let batch = match input.next(&mut current) {
                None => return Ok(()),
                Some(item) => item.map_err(|e| ctx.input_error(plan.build_side, e))?,
            };
            self.collect_input(&batch, num_rows, has_null_key, &mut scratch)?;
        }
    }

    /// Collects one input batch, in pieces.
    fn collect_input(
        &self,
        batch: &RecordBatch,
        num_rows: &AtomicU64,
        has_null_key: &AtomicBool,
        scratch: &mut CollectScratch,
    ) -> Result<()> {
        let (plan, ctx) = (self.plan(), self.ctx);
        {
            let (batch, stored_hashes) = self.level.split_input(plan, batch, true)?;
            num_rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            if self.level.depth == 0 {
                ctx.metrics
                    .build_rows
                    .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            }
            let (piece_rows, piece_bytes) = build_piece_size(plan, &batch);
            for (piece, hashes) in pieces(&batch, stored_hashes.as_ref(), piece_rows) {
                // Wide rows bunched in one part of a batch make a piece larger than
                // its average: such a piece goes in work-row pieces after all.
                let bytes = batch_bytes(&piece);
                let work_rows = plan.piece_rows_of(piece.num_rows(), bytes);
                if piece.num_rows() > work_rows && bytes > piece_bytes {
                    for (small, hashes) in pieces(&piece, hashes.as_ref(), work_rows) {
                        let hashes = hashes.as_deref();
                        self.collect_batch(&small, None, hashes, has_null_key, scratch)?;
                    }
                } else {
                    let hashes = hashes.as_deref();
                    self.collect_batch(&piece, Some(bytes), hashes, has_null_key, scratch)?;
                }
            }
        }
        Ok(())
    }

    /// Hashes, partitions and buffers one batch of at most the batch size (of
    /// `bytes` bytes when the caller measured them).
    fn collect_batch(
        &self,
        batch: &RecordBatch,
        bytes: Option<usize>,
        stored_hashes: Option<&[u64]>,
        has_null_key: &AtomicBool,
        scratch: &mut CollectScratch,
    ) -> Result<()> {
        let plan = self.plan();
        let CollectScratch {
            mine,
            pending,
            hashes,
            grouped,
            first_partition,
        } = scratch;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        let input_bytes = bytes.unwrap_or_else(|| batch_bytes(batch));
        // The probe's headroom is sized from this: the bytes of `work_rows` rows of
        // the build (probe batches are cut to `work_rows`), not of a larger piece.
        let work_bytes = input_bytes * plan.work_rows.min(n) / n;
        self.largest_batch_bytes
            .fetch_max(work_bytes, Ordering::Relaxed);
        self.reserve(mine, input_bytes)?;
        let (columns, nulls) = plan.keys.evaluate_columns(batch, true)?;
        match stored_hashes {
            Some(stored) => {
                hashes.clear();
                hashes.extend_from_slice(stored);
            }
            None => hash_keys(&columns, n, hashes)?,
        }
        if self.level.key_bounds {
            let bounds = columns
                .iter()
                .map(KeyBounds::of)
                .collect::<Result<Vec<_>>>()?;
            lock(&self.bounds).add(bounds)?;
        }
        if plan.keys.is_word_key() && self.level.bits.fan_out() > 1 {
            // (A narrower key is widened into a transient of the batch's words.)
            let (words, _) = crate::keys::words_of(columns[0].as_ref())?;
            let valid = |row: &usize| nulls.as_ref().is_none_or(|n| n.is_valid(*row));
            let bounds = crate::table::word_range((0..n).filter(valid).map(|row| words[row]));
            if let Some((lo, hi)) = bounds {
                let mut all = lock(&self.word_bounds);
                *all = Some(all.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
            }
        }
        drop(columns);
        if nulls.is_some() {
            has_null_key.store(true, Ordering::Relaxed);
        }
        let never_matches =
            |row: usize| plan.nulls_never_match() && nulls.as_ref().is_some_and(|n| n.is_null(row));
        if plan.resolved.keeps_unmatchable_build_rows()
            && nulls.is_some()
            && plan.nulls_never_match()
        {
            let rows = crate::batches::select_rows(0..n as u32, never_matches);
            let kept = self.reserved_take(batch, &rows, input_bytes, mine)?;
            let bytes = batch_bytes(&kept);
            self.add(None, kept, Vec::new(), std::iter::empty(), bytes, mine)?;
        }
        grouped.group(
            self.level.bits,
            hashes,
            nulls.as_ref().filter(|_| plan.nulls_never_match()),
        );
        let keep_hashes = plan.spills_hashes();
        if self.gathers {
            // Every column can be gathered: each partition gathers its rows in
            // place, copied once.
            let data: Vec<ArrayData> = batch.columns().iter().map(|c| c.to_data()).collect();
            // Which columns spilled partitions may gather 32 bits wide (one pass each,
            // once a partition has spilled; a partition that spills meanwhile gathers
            // these rows wide).
            let fits = if self.any_spilled.load(Ordering::Relaxed) {
                crate::gather::halvable_fits(batch, &self.halvable)
            } else {
                Vec::new()
            };
            let fan_out = self.level.bits.fan_out();
            for p in (0..fan_out).map(|i| (*first_partition + i) % fan_out) {
                let rows = grouped.partition(p);
                if !rows.is_empty() {
                    self.add_rows(p, &data, &fits, rows, hashes, pending)?;
                }
            }
            mine.free();
            return Ok(());
        }
        for p in 0..self.level.bits.fan_out() {
            let rows = grouped.partition(p);
            if rows.is_empty() {
                continue;
            }
            let indices = UInt32Array::from(rows.to_vec());
            let fragment = self.reserved_take(batch, &indices, input_bytes, mine)?;
            // Fragments of word keys keep no hashes (see `JoinPlan::spills_hashes`).
            let fragment_hashes: Vec<u64> = if keep_hashes {
                self.reserve(mine, rows.len() * 8)?;
                rows.iter().map(|&r| hashes[r as usize]).collect()
            } else {
                Vec::new()
            };
            let bytes = batch_bytes(&fragment) + fragment_hashes.capacity() * 8;
            mine.try_resize(mine.size().max(bytes))?;
            let row_hashes = rows.iter().map(|&r| hashes[r as usize]);
            self.add(Some(p), fragment, fragment_hashes, row_hashes, bytes, mine)?;
        }
        mine.free();
        Ok(())
    }

    /// Gathers rows `rows` of `columns` (a build batch whose rows' hashes are
    /// `hashes`, and whose columns fit in 32 bits where `fits` says so) into
    /// partition `p`: in its spill files' narrow form once it has spilled. What the
    /// partition's buffers grow by is reserved first, spilling if needed, with no lock
    /// held; the rows are copied under the partition's own lock ([`Gathered`]), not
    /// the collector's.
    fn add_rows(
        &self,
        p: usize,
        columns: &[ArrayData],
        fits: &[bool],
        rows: &[u32],
        hashes: &[u64],
        pending: &mut MemoryReservation,
    ) -> Result<()> {
        // The spill schema's hash column, where it has one.
        let hash_column = self.plan().spills_hashes().then_some(hashes);
        // What the rows add beyond their fixed widths, measured with no lock held.
        let added = Growth::of(columns, rows);
        let fan_out = self.level.bits.fan_out();
        loop {
            let short = {
                let mut guard = lock(&self.state);
                let state = &mut *guard;
                let part = &mut state.partitions[p];
                let spilled = part.writer.is_some();
                let cell = Arc::clone(&part.gathered);
                let mut gathered = lock(&cell);
                // (A partition in memory is one batch: rows that its offsets or a
                // dictionary's keys cannot address are an error as they are appended.)
                if spilled && gathered.as_ref().is_some_and(|g| !g.admits(fits, &added)) {
                    // Gathered 32 bits wide where these rows do not fit (or a
                    // dictionary's keys or offsets would overflow): written first.
                    drop(gathered);
                    self.write_out(guard, p)?;
                    continue;
                }
                // Once spilled (and emptied), a partition gathers in its files' schema.
                if self.file_halves
                    && spilled
                    && gathered
                        .as_ref()
                        .is_none_or(|g| g.is_empty() && !g.is_halving())
                {
                    *gathered = Some(GatherBuffer::halving(Arc::clone(&self.file_schema))?);
                }
                let gathered_rows = match gathered.as_mut() {
                    Some(g) => g,
                    None => {
                        let mut rows = GatherBuffer::new(Arc::clone(&self.spill_schema))?;
                        // One partition of a build whose rows are known: allocated
                        // once (until it spills, `spill_partition`).
                        if let Some(all) = self.level.build_rows.filter(|_| fan_out == 1) {
                            rows.expect_rows(usize::try_from(all).unwrap_or(usize::MAX));
                        }
                        gathered.insert(rows)
                    }
                };
                gathered_rows.shape_for(fits);
                let after = gathered_rows.capacity_after(&added);
                let growth = after.saturating_sub(part.bytes);
                let held = pending.size().min(growth);
                if held == growth || state.reservation.try_grow(growth - held).is_ok() {
                    state.reservation.merge(pending.split(held));
                    pending.free();
                    part.bytes += growth;
                    part.rows += rows.len();
                    part.total_rows += rows.len() as u64;
                    // A spilled partition's filter has these rows' hashes added below.
                    let bloom = part.writer.is_some().then(|| Arc::clone(&part.bloom));
                    let spilled = part.writer.is_some();
                    // The rows are counted: copy them in with only the partition's
                    // gathered rows locked.
                    drop(guard);
                    gathered_rows.append(columns, rows, hash_column)?;
                    // A spilled partition writes its rows a batch at a time, without
                    // the collector's lock held: a work batch's fixed bytes (a buffer
                    // gathered 32 bits wide holds more rows), or a piece's bytes.
                    let plan = self.plan();
                    let full = spilled && gathered_rows.is_full(plan.work_rows, plan.piece_bytes());
                    drop(gathered);
                    if let Some(bloom) = bloom.as_deref() {
                        if let Some(bloom) = lock(bloom).as_mut() {
                            bloom.insert_all(rows.len(), |i| hashes[rows[i] as usize]);
                        }
                    }
                    if full {
                        self.write_out(lock(&self.state), p)?;
                    }
                    return Ok(());
                }
                growth - held
            };
            self.reserve(pending, short)?;
        }
    }

    /// `take` of some rows of `batch`, reserved first (by the rows' share of the
    /// batch's bytes, spilling if needed) and then corrected to what it really holds.
    fn reserved_take(
        &self,
        batch: &RecordBatch,
        rows: &UInt32Array,
        batch_bytes_total: usize,
        reservation: &mut MemoryReservation,
    ) -> Result<RecordBatch> {
        let before = reservation.size();
        let estimate = batch_bytes_total * rows.len() / batch.num_rows().max(1) + 64;
        self.reserve(reservation, estimate)?;
        // (Compacted: a take of a nested column of views or dictionaries shares its
        // input's buffers, which would be held, and written, whole.)
        let taken = crate::output::owned_batch(take_record_batch(batch, rows)?)?;
        let actual = batch_bytes(&taken);
        if actual > estimate {
            self.reserve(reservation, actual - estimate)?;
        } else {
            reservation.shrink(estimate - actual);
        }
        debug_assert_eq!(reservation.size(), before + actual);
        Ok(taken)
    }

    /// Ends the input: decides which partitions stay in memory, builds their tables,
    /// closes the spill files.
    fn finish(&self, num_rows: u64, has_null_key: bool) -> Result<BuiltSide> {
        let plan = self.plan();
        let fan_out = self.level.bits.fan_out();
        // Tests can force the spill path on any input (level 0, and deeper levels
        // down to a set depth: `ForceSpill`).
        let forced = (self.level.force_spill_fraction * fan_out as f64).ceil() as usize;
        for p in 0..forced.min(fan_out) {
            let mut guard = lock(&self.state);
            let state = &mut *guard;
            if state.partitions[p].writer.is_none() && state.partitions[p].total_rows > 0 {
                if let Some(unwritten) = self.spill_partition(state, p)? {
                    drop(guard);
                    self.write_unwritten(unwritten)?;
                }
            }
        }
        // From here on only partitions still in memory can spill, each taking one
        // filter: the filters' memory set aside for more goes back.
        {
            let mut state = lock(&self.state);
            let in_memory = state
                .partitions
                .iter()
                .filter(|p| p.writer.is_none() && p.total_rows > 0)
                .count();
            let wanted = self.blooms.map_or(0, |b| b.bytes * in_memory);
            let excess = state.bloom_reserve.size().saturating_sub(wanted);
            state.bloom_reserve.shrink(excess);
        }
        // Leave room for the probe: what each probe worker reserves (its buffers, a
        // batch in flight, and the output and spill pieces it makes from it), and
        // the output batches waiting for the caller.
        let per_worker = crate::plan::probe_worker_bytes(plan.work_rows, plan.work_rows)
            + 3 * self
                .largest_batch_bytes
                .load(Ordering::Relaxed)
                .max(16 * 1024);
        // And a write buffer for each partition spilled so far, whose probe rows are
        // buffered before they are written: without it the probe's workers find the
        // memory full at every other batch and write every buffer out half empty
        // (SF10 orders ⋈ lineitem at a 25% limit: 28,660 probe writes of ~1,900 rows
        // instead of ~6,500 of 8,192). At most a quarter of the limit.
        let spilled = lock(&self.state)
            .partitions
            .iter()
            .filter(|p| p.writer.is_some())
            .count();
        let limit = plan.pool.limit().bytes();
        let buffers = (spilled * plan.work_rows * probe_spill_row_bytes(plan)).min(limit / 4);
        let build_row_bytes =
            self.largest_batch_bytes.load(Ordering::Relaxed) / plan.work_rows.max(1);
        let workers =
            (per_worker * plan.threads + output_headroom(plan, build_row_bytes)).min(limit / 2);
        let mut headroom_reservation = self.base.new_empty();
        // The buffers are worth spilling build rows for, not failing for: near the
        // floor, where everything is spilled and still does not leave room for them,
        // the workers' part alone is reserved.
        if buffers == 0
            || self
                .reserve(
                    &mut headroom_reservation,
                    (workers + buffers).min(limit / 2),
                )
                .is_err()
        {
            self.reserve(&mut headroom_reservation, workers)?;
        }
        // Concatenating a partition's fragments needs a second copy of it while both
        // exist, and a word key's table its rows' hashes again: both transient.
        // Partitions are finished `threads` at a time when there is room for the
        // largest `threads` of these; otherwise one at a time, with room for one.
        let mut concat_reservation = self.base.new_empty();
        let finish_threads = loop {
            let mut largest: Vec<usize> = lock(&self.state)
                .partitions
                .iter()
                .filter(|p| p.writer.is_none())
                .map(|p| finish_transient_bytes(plan, p))
                .filter(|&bytes| bytes > 0)
                .collect();
            largest.sort_unstable_by(|a, b| b.cmp(a));
            let parallel: usize = largest.iter().take(plan.threads).sum();
            if concat_reservation.try_grow(parallel).is_ok() {
                break plan.threads;
            }
            let first = largest.first().copied().unwrap_or(0);
            match concat_reservation.try_grow(first) {
                Ok(()) => break 1,
                // Spilling frees memory, and may spill the very partition that
                // needed the most: look again at what is left.
                Err(e) => {
                    if !self.spill_something(None)? {
                        return Err(e.into());
                    }
                }
            }
        };
        // Tables for the in-memory partitions, smallest first; spill the largest
        // remaining partitions while they do not fit.
        let mut tables = self.base.new_empty();
        let mut planned = vec![false; fan_out];
        let mut order: Vec<usize> = (0..fan_out).collect();
        order.sort_by_key(|&p| lock(&self.state).partitions[p].bytes);
        for p in order {
            loop {
                let need = {
                    let state = lock(&self.state);
                    let part = &state.partitions[p];
                    if part.writer.is_some() || part.total_rows == 0 {
                        break;
                    }
                    finish_bytes(plan, part)
                };
                if tables.try_grow(need).is_ok() {
                    planned[p] = true;
                    break;
                }
                if !self.spill_something(Some(&planned))? {
                    return Err(tables
                        .try_grow(need)
                        .map_err(JoinError::from)
                        .err()
                        .unwrap_or_else(|| {
                            JoinError::Internal("no memory and nothing to spill".into())
                        }));
                }
            }
        }
        // One key index for all partitions, when they all stay in memory and their
        // keys are dense words: reserved on top of the tables' buckets it replaces.
        // No partition spills any more: the filters' memory not taken goes back (the
        // shared key index below is only built when none spilled).
        lock(&self.state).bloom_reserve.free();
        let shared = self.shared_key_index(&planned, has_null_key, &mut tables);
        drop(headroom_reservation);

        let state = {
            let mut state = lock(&self.state);
            CollectorState {
                partitions: std::mem::take(&mut state.partitions),
                unmatchable: std::mem::take(&mut state.unmatchable),
                reservation: state.reservation.take(),
                unwritten_bytes: 0,
                writes_ended: 0,
                victim_writes: 0,
                bloom_reserve: state.bloom_reserve.take(),
            }
        };
        let mut reservation = state.reservation;
        reservation.merge(tables.take());
        let unmatchable = self.finish_unmatchable(state.unmatchable, &mut reservation)?;
        let reservation = Mutex::new(reservation);
        let slots: Vec<Mutex<Option<PartitionBuffer>>> = state
            .partitions
            .into_iter()
            .map(|b| Mutex::new(Some(b)))
            .collect();
        let built: Vec<Mutex<Option<Partition>>> = (0..fan_out).map(|_| Mutex::default()).collect();
        let next = AtomicUsize::new(0);
        run_workers(finish_threads, self.ctx.cancel, || loop {
            let p = next.fetch_add(1, Ordering::Relaxed);
            if p >= fan_out {
                return Ok(());
            }
            if self.ctx.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            let Some(mut buffer) = lock(&slots[p]).take() else {
                continue;
            };
            let partition = match buffer.writer.take() {
                Some(writer) => {
                    buffer.writer = Some(writer);
                    {
                        let mut res = lock(&reservation);
                        self.flush(&mut buffer, &mut res)?;
                    }
                    let file = buffer
                        .writer
                        .take()
                        .map(finish_shared)
                        .transpose()?
                        .ok_or_else(|| JoinError::Internal("lost a spill writer".into()))?;
                    Partition::Spilled(SpilledPartition {
                        file,
                        bloom: lock(&buffer.bloom).take(),
                    })
                }
                None => {
                    let held = if buffer.total_rows > 0 {
                        buffer.bytes + finish_bytes(plan, &buffer)
                    } else {
                        0
                    };
                    Partition::InMemory(finish_partition(
                        plan,
                        buffer,
                        held,
                        &reservation,
                        shared.is_none(),
                    )?)
                }
            };
            *lock(&built[p]) = Some(partition);
        })?;
        drop(concat_reservation);
        let partitions = built
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .ok_or_else(|| JoinError::Internal("a partition was not built".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut partitions = partitions;
        if let Some((min, span)) = shared {
            share_key_index(&mut partitions, min, span, plan.threads);
        }
        let reservation = reservation.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(BuiltSide {
            partitions,
            unmatchable,
            num_rows,
            has_null_key,
            bounds: std::mem::take(&mut lock(&self.bounds).columns),
            _reservation: reservation,
        })
    }

    /// Whether the partitions get one key index they share (`share_key_index`), and
    /// its `(min, span)`: when every partition with rows is in memory (`planned`), the
    /// key is one word whose rows have no nulls, and its values are dense enough for
    /// all rows together ([`ChainedTable::shared_direct_span`]; in a partition of a
    /// hash-partitioned build a dense column's keys are sparse, so each partition's
    /// own table is hashed). What its buckets take beyond the tables' buckets is
    /// reserved in `tables`; without that memory the tables are built as usual.
    fn shared_key_index(
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

    /// Closes the unmatchable rows' file, or keeps them in memory.
    fn finish_unmatchable(
        &self,
        mut buffer: PartitionBuffer,
        reservation: &mut MemoryReservation,
    ) -> Result<Unmatchable> {
        if buffer.writer.is_none() {
            return Ok(Unmatchable {
                batches: buffer.fragments.into_iter().map(|(b, _)| b).collect(),
                file: None,
            });
        }
        self.spill_unmatchable(&mut buffer, reservation)?;
        let file = buffer.writer.take().map(finish_shared).transpose()?;
        Ok(Unmatchable {
            batches: Vec::new(),
            file,
        })
    }
}

/// The bytes finishing an in-memory partition needs on top of its fragments: the
/// key encoding and the table (what it needs only while it is finished,
/// [`finish_transient_bytes`], is reserved for a few partitions at a time, in
/// `finish`).
fn finish_bytes(plan: &JoinPlan, part: &PartitionBuffer) -> usize {
    let rows = part.rows;
    let keys = if plan.keys.is_word_key() {
        // 8-byte keys are read in place (`keys::words_of`); narrower ones are
        // widened to a word. Plus a validity bit.
        let in_place = keys_in_place(plan);
        (if in_place { 0 } else { rows * 8 }) + rows.div_ceil(8)
    } else {
        part.bytes / 2 + rows * 12
    };
    keys + ChainedTable::size_for(rows)
}

/// The bytes a probe row takes in a probe spill buffer: the fixed widths of its spill
/// files' schema (decimals narrowed), or a guess of 32 where some column is variable-width.
/// What output batches in flight take while the probe runs: a batch being assembled
/// per worker and the channel's two per worker, of rows about a build row and a probe
/// row wide ([`crate::channel`] reserves them, up to an eighth of the limit).
/// Without this room the output gate found the pool full at every batch, and each
/// worker waited for the caller to take one (see BENCHMARKS.md, issue 27).
fn output_headroom(plan: &JoinPlan, build_row_bytes: usize) -> usize {
    let row_bytes = build_row_bytes + probe_spill_row_bytes(plan);
    let batch_bytes = (plan.batch_size * row_bytes).min(plan.piece_bytes());
    (3 * plan.threads * batch_bytes).min(plan.pool.limit().bytes() / 8)
}

fn probe_spill_row_bytes(plan: &JoinPlan) -> usize {
    crate::gather::fixed_widths(&spilljoin_spill::file_schema(&plan.spill_schema(false)))
        .map_or(32, |widths| widths.iter().sum::<usize>())
}

/// The bytes finishing an in-memory partition needs only while it is finished: the
/// concatenated copy of its fragments, and for word keys (whose fragments keep no
/// hashes) its rows' hashes, computed again for the table.
fn finish_transient_bytes(plan: &JoinPlan, part: &PartitionBuffer) -> usize {
    let copy = if part.fragments.len() > 1 {
        part.bytes
    } else {
        0
    };
    let hashes = if plan.spills_hashes() {
        0
    } else {
        part.rows * 8
    };
    copy + hashes
}

/// Reads the whole build input of one level into partitions, spilling as needed, and
/// builds the tables of the partitions that stay in memory.
pub(crate) fn build_side<I>(ctx: &Ctx<'_>, level: Level, input: Vec<I>) -> Result<BuiltSide>
where
    I: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let collector = BuildCollector::new(ctx, level);
    let input = InputStreams::new(input);
    let num_rows = AtomicU64::new(0);
    let has_null_key = AtomicBool::new(false);
    run_workers(ctx.plan.threads, ctx.cancel, || {
        collector.collect(&input, &num_rows, &has_null_key)
    })?;
    collector.finish(num_rows.into_inner(), has_null_key.into_inner())
}

/// The rows of a build batch partitioned at a time: more than the join's work rows
/// when memory allows (up to [`MAX_BUILD_PIECE_ROWS`], and a worker's piece at most a
/// sixteenth of the limit), because every piece leaves one fragment per partition
/// behind: larger pieces mean fewer, larger fragments — fewer IPC messages when they
/// are spilled, and fewer small blocks for the allocator to keep when they are freed
/// (SF10 orders at a 50% limit read in 64Ki-row batches: peak RSS 306–322 → 253–262
/// MB).
/// Returns the piece's rows and the bytes a piece may take; a piece of more rows than
/// [`JoinPlan::piece_rows`] that takes more (wide rows bunched together) is cut to
/// that many rows.
fn build_piece_size(plan: &JoinPlan, batch: &RecordBatch) -> (usize, usize) {
    let rows = batch.num_rows();
    let max_bytes = plan.piece_bytes();
    let bytes = batch_bytes(batch);
    let work_rows = plan.piece_rows_of(rows, bytes);
    if rows <= work_rows {
        return (work_rows, max_bytes);
    }
    let row_bytes = (bytes / rows).max(1);
    let by_memory = max_bytes / row_bytes;
    (
        by_memory.clamp(work_rows, MAX_BUILD_PIECE_ROWS.max(work_rows)),
        max_bytes,
    )
}

/// Whether a word key is read from the build column itself: an 8-byte column that
/// normalization leaves as it is (not a float, which is canonicalized into a new
/// buffer, nor a dictionary, which is decoded).
fn keys_in_place(plan: &JoinPlan) -> bool {
    let key_type = &plan.keys.types[0];
    let column_type = plan
        .build_schema
        .field(plan.keys.build_columns[0])
        .data_type();
    key_type.primitive_width() == Some(8)
        && column_type == key_type
        && !matches!(key_type, DataType::Float64)
}

/// The most rows a partition of a shared key index may have (the buckets' top bit
/// is a flag).
const MAX_DIRECT_ROWS: usize = 1 << 31;

/// Gives every in-memory partition (built without a table) its table over one key
/// index they all share: a lookup is then one bucket read (no key compared, no link
/// read for a unique key). Its memory was reserved with the tables'
/// (`BuildCollector::shared_key_index`). SF10 orders ⋈ lineitem in memory: the keys
/// span 60M for 15M rows.
fn share_key_index(partitions: &mut [Partition], min: u64, span: u64, threads: usize) {
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

/// `batch` in zero-copy slices of at most `rows` rows.
fn slices(batch: &RecordBatch, rows: usize) -> impl Iterator<Item = RecordBatch> + '_ {
    let rows = rows.max(1);
    (0..batch.num_rows())
        .step_by(rows)
        .map(move |start| batch.slice(start, rows.min(batch.num_rows() - start)))
}

/// The values of a spill-schema batch's hash column (its last).
fn hash_column(batch: &RecordBatch) -> Result<&ScalarBuffer<u64>> {
    batch
        .columns()
        .last()
        .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        .map(|a| a.values())
        .ok_or_else(|| JoinError::Internal("a batch without its hash column".into()))
}

/// The most rows of a build batch partitioned at a time.
const MAX_BUILD_PIECE_ROWS: usize = 64 * 1024;

/// Concatenates a partition's fragments and builds its table. `held` bytes were
/// reserved for it in `reservation` (its fragments and what [`finish_bytes`] asked
/// for), which is corrected to what the partition really holds.
///
/// Without `index` the partition gets an empty table, and the bytes of the table it
/// would have had stay reserved: a key index shared by all partitions replaces it
/// (`share_key_index`).
pub(crate) fn finish_partition(
    plan: &JoinPlan,
    buffer: PartitionBuffer,
    held: usize,
    reservation: &Mutex<MemoryReservation>,
    index: bool,
) -> Result<BuiltPartition> {
    if buffer.rows > MAX_TABLE_ROWS {
        return Err(JoinError::InvalidJoin(format!(
            "a build partition has {} rows; at most {MAX_TABLE_ROWS} fit one table",
            buffer.rows
        )));
    }
    // What gathered buffers hold in memory (their arrays count only their lengths).
    let mut gathered_bytes = None;
    let gathered = lock(&buffer.gathered).take();
    let (batch, hashes): (RecordBatch, ScalarBuffer<u64>) = match gathered {
        // Gathered in place: the buffers become the batch, uncopied; a hash column,
        // if any, is split off.
        Some(mut gathered) if !gathered.is_empty() => {
            gathered_bytes = Some(gathered.held());
            let batch = gathered.finish()?;
            if plan.spills_hashes() {
                let hashes = hash_column(&batch)?.clone();
                let mut columns = batch.columns().to_vec();
                columns.pop();
                let batch = RecordBatch::try_new(Arc::clone(&plan.build_schema), columns)?;
                (batch, hashes)
            } else {
                (batch, ScalarBuffer::from(Vec::new()))
            }
        }
        _ => match buffer.fragments.len() {
            0 => (
                RecordBatch::new_empty(Arc::clone(&plan.build_schema)),
                ScalarBuffer::from(Vec::new()),
            ),
            1 => buffer
                .fragments
                .into_iter()
                .next()
                .map(|(batch, hashes)| (batch, ScalarBuffer::from(hashes)))
                .unwrap_or_else(|| {
                    (
                        RecordBatch::new_empty(Arc::clone(&plan.build_schema)),
                        ScalarBuffer::from(Vec::new()),
                    )
                }),
            _ => {
                let batch =
                    concat_batches(&plan.build_schema, buffer.fragments.iter().map(|(b, _)| b))?;
                let mut hashes = Vec::with_capacity(buffer.rows);
                for (_, h) in &buffer.fragments {
                    hashes.extend_from_slice(h);
                }
                (batch, ScalarBuffer::from(hashes))
            }
        },
    };
    let key_columns = plan
        .keys
        .build_columns
        .iter()
        .map(|&i| crate::keys::normalize(batch.column(i)))
        .collect::<Result<Vec<_>>>()?;
    let keys = plan.keys.keys_of(key_columns.clone())?;
    // Dense one-word keys without nulls index the table by key (no hashes needed),
    // where that takes no more than the hashed table reserved for it; evenly spread
    // ones bucket it by value (never more than a hashed table). The probe's
    // headroom is no longer held here, so nothing more is reserved. Without `index`,
    // an empty table until the shared index replaces it.
    let rows = batch.num_rows();
    let keyed = match &keys.repr {
        _ if !index => Some(ChainedTable::build(&[], |_| true)),
        KeyRepr::Words {
            words, valid: None, ..
        } => ChainedTable::build_by_key(words),
        _ => None,
    };
    let (table, hashes) = match keyed {
        Some(table) => (table, hashes),
        None => {
            let hashes = if hashes.len() == batch.num_rows() {
                hashes
            } else {
                // Word-key fragments keep no hashes: hash the keys again, once.
                let mut again = Vec::new();
                crate::hash::hash_keys(&key_columns, batch.num_rows(), &mut again)?;
                ScalarBuffer::from(again)
            };
            (ChainedTable::build(&hashes, |_| true), hashes)
        }
    };
    // Word keys are compared directly, never by their hash (`KeyEq::CHECK_HASH_FIRST`):
    // their hashes are not kept past the table (a third of a partition's overhead).
    let hashes = if plan.keys.is_word_key() {
        ScalarBuffer::from(Vec::new())
    } else {
        hashes
    };
    // A word key normalized into a new buffer (floats, dictionaries) is held too.
    // (Narrower keys are widened into words that `keys.repr.size()` counts.)
    let normalized_copy = if plan.keys.is_word_key()
        && plan.keys.types[0].primitive_width() == Some(8)
        && !keys_in_place(plan)
    {
        batch.num_rows() * 8
    } else {
        0
    };
    let table_bytes = if index {
        table.size()
    } else {
        ChainedTable::size_for(rows)
    };
    let actual = gathered_bytes.unwrap_or_else(|| batch_bytes(&batch) + hashes.len() * 8)
        + keys.repr.size()
        + table_bytes
        + normalized_copy;
    {
        let mut res = lock(reservation);
        let size = res.size();
        res.shrink(held.min(size));
        res.grow(actual);
    }
    Ok(BuiltPartition {
        batch,
        hashes,
        keys: keys.repr,
        table,
    })
}
