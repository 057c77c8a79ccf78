//! The probe phase: stream the probe input past the built tables.
//!
//! ```text
//!  probe batch ─► keys ─► hash ─► group rows by partition
//!     for each partition: walk the chain of each row's bucket
//!        hash equal? key equal? ─► candidate pair (probe row, build row)
//!     candidate pairs, at most one output batch at a time:
//!        residual filter ─► passing pairs ─► mark probe row matched / build row visited
//!                                         └► gather output (pair joins)
//!     end of batch: unmatched / semi / anti / mark / not-in probe rows
//!  end of input (all workers): unmatched / semi / anti / mark / not-in build rows
//! ```
//!
//! The built side is shared read-only by every worker; the mutable state of one
//! execution lives in [`ProbeState`] (visited bits per build row, and the facts of the
//! probe side that `NOT IN` with the build on the outer side needs).

use std::borrow::Cow;
use std::ops::{ControlFlow, Range};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use arrow_array::{Array, BooleanArray, RecordBatch, UInt32Array};
use arrow_buffer::BooleanBuffer;
use arrow_data::ArrayData;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use spilljoin_memory::MemoryReservation;
use spilljoin_spill::{SpillFile, SpillWriter};

use crate::batches::{attach_hashes, batch_bytes, lock, write_counted};
use crate::bloom::Bloom;
use crate::build::{BuiltPartition, BuiltSide, Partition, Unmatchable};
use crate::context::{Ctx, Facts, Level, LevelFiles};
use crate::error::{JoinError, Result};
use crate::gather::{gatherable, GatherBuffer, Growth};
use crate::hash::hash_keys;
use crate::join_type::BuildJoinType;
use crate::keys::{KeyEq, KeyRepr, Keys, NullEquality, NullableWordEq, RowsEq, WordEq};
use crate::output::OutputSink;
use crate::partition::{HashBits, PartitionedRows};
use crate::plan::JoinPlan;

/// Visited bits of one partition's build rows, set by many probe threads at once.
#[derive(Debug)]
pub(crate) struct VisitedBits {
    words: Vec<AtomicU64>,
}

impl VisitedBits {
    fn new(rows: usize) -> Self {
        Self {
            words: (0..rows.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn bytes_for(rows: usize) -> usize {
        rows.div_ceil(64) * 8
    }

    #[inline]
    fn set(&self, row: usize) {
        let bit = 1u64 << (row % 64);
        let word = &self.words[row / 64];
        // Skip the atomic write when the bit is set already (hot keys).
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Sets the bit and says whether it was set already.
    #[inline]
    fn test_and_set(&self, row: usize) -> bool {
        let bit = 1u64 << (row % 64);
        let word = &self.words[row / 64];
        word.load(Ordering::Relaxed) & bit != 0 || word.fetch_or(bit, Ordering::Relaxed) & bit != 0
    }

    fn get(&self, row: usize) -> bool {
        self.words[row / 64].load(Ordering::Relaxed) & (1 << (row % 64)) != 0
    }
}

/// Probe rows bound for one spilled partition, buffered and written a batch at a time.
#[derive(Debug)]
pub(crate) struct ProbeSpill {
    pending: Vec<RecordBatch>,
    /// Rows gathered straight into their batch, when every column can be gathered
    /// (instead of `pending`).
    gathered: Option<GatherBuffer>,
    rows: usize,
    reservation: MemoryReservation,
}

/// One spilled partition's probe rows on their way to disk: the buffer that workers
/// append to, and the writer of its file, under locks of their own. A full buffer is
/// taken out under the first ([`ProbeState::take_full`]) and concatenated, encoded
/// and written under the second, so that while one worker writes a partition's rows
/// the others go on appending to it. (Under a limit of a few MiB, where buffers fill
/// every few batches, workers waited for the lock of a partition being written: 2.7%
/// of the samples of an SF1 right outer join at 5% were in futex calls, 1.6% after.)
///
/// Neither lock is taken while the other is held.
#[derive(Debug)]
struct SpillSlot {
    buffer: Mutex<ProbeSpill>,
    writer: Mutex<Option<SpillWriter>>,
}

/// A buffer taken out of a partition to be written outside its lock, holding the
/// memory it takes until then; counted in [`InFlight`] until dropped.
struct Full<'s> {
    rows: FullRows,
    reservation: MemoryReservation,
    in_flight: &'s InFlight,
}

/// The rows of a [`Full`] buffer.
enum FullRows {
    /// Gathered into one batch ([`GatherBuffer`]).
    Gathered(RecordBatch),
    /// Batches of nested columns, concatenated when written if there is memory for
    /// the copy.
    Pending(Vec<RecordBatch>),
}

impl Drop for Full<'_> {
    fn drop(&mut self) {
        self.reservation.free();
        self.in_flight.ended();
    }
}

/// Full buffers taken out under a partition's lock, written once it is released.
type ToWrite<'s> = Vec<Full<'s>>;

/// The [`Full`] buffers out of their partitions, not yet written. Their memory is
/// held, but no worker can free it by writing them: a worker short of memory with
/// nothing left to write waits for them ([`InFlight::wait`]) rather than call the
/// limit too small (as it waited, before, for the lock of a partition being
/// written).
#[derive(Debug, Default)]
struct InFlight {
    state: Mutex<InFlightState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct InFlightState {
    /// Buffers out.
    count: usize,
    /// Buffers out and back (written, or dropped on an error) so far.
    ended: u64,
}

/// What [`InFlight::wait`] saw.
#[derive(Debug, PartialEq, Eq)]
enum Waited {
    /// No buffer was out.
    Nothing,
    /// A buffer's memory came back.
    Ended,
    /// Buffers were out and none came back within [`WRITE_WAIT`].
    TimedOut,
}

impl InFlight {
    fn started(&self) {
        lock(&self.state).count += 1;
    }

    fn ended(&self) {
        let mut state = lock(&self.state);
        debug_assert!(state.count > 0, "a buffer ended that never started");
        state.count = state.count.saturating_sub(1);
        state.ended += 1;
        self.done.notify_all();
    }

    /// Waits until a buffer out of its partition comes back (or [`WRITE_WAIT`] has
    /// passed), then says which; [`JoinError::Cancelled`] if the join was cancelled.
    fn wait(&self, cancel: &AtomicBool) -> Result<Waited> {
        let mut state = lock(&self.state);
        if state.count == 0 {
            return Ok(Waited::Nothing);
        }
        let before = state.ended;
        let deadline = std::time::Instant::now() + WRITE_WAIT;
        while state.ended == before && state.count > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .done
                .wait_timeout(state, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        let ended = state.ended != before;
        drop(state);
        if cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        Ok(if ended {
            Waited::Ended
        } else {
            Waited::TimedOut
        })
    }
}

/// How long a probe worker waits for a buffer out of its partition to come back
/// before it counts the wait as one of its [`RESERVE_RETRIES`] ([`InFlight::wait`]).
const WRITE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The mutable state of one execution against a built side.
#[derive(Debug)]
pub(crate) struct ProbeState {
    /// Visited bits per partition, for joins that output build rows at the end.
    pub visited: Vec<VisitedBits>,
    /// Whether the probe input had any row (this level's, or inherited).
    pub probe_non_empty: AtomicBool,
    /// Whether some probe row had a null key (this level's, or inherited).
    pub probe_has_null: AtomicBool,
    /// Per partition: where probe rows of spilled partitions go.
    spills: Vec<Option<SpillSlot>>,
    /// Buffers taken out of `spills`, being written.
    in_flight: InFlight,
    spill_schema: SchemaRef,
    /// The schema its files hold ([`spilljoin_spill::file_schema`]: decimals of at
    /// most 18 digits as `Int64`), in which rows are gathered: narrowed once, as
    /// they are copied, rather than copied wide and narrowed again by the writer.
    gather_schema: SchemaRef,
    /// Whether every column of the gather schema can be gathered ([`crate::gather`]).
    gathers: bool,
    /// Per column of the gather schema: `Int64`, so gathered as `Int32` when a
    /// batch's values fit ([`GatherBuffer::halving`]).
    halvable: Vec<bool>,
    /// Where spilled partitions' probe rows are written.
    files: LevelFiles,
    _reservation: MemoryReservation,
}

impl ProbeState {
    /// Fresh state for probing `built`; visited bits are reserved in `reservation`.
    pub fn new(
        ctx: &Ctx<'_>,
        level: Level,
        built: &BuiltSide,
        mut reservation: MemoryReservation,
        facts: Facts,
    ) -> Result<Self> {
        let plan = ctx.plan;
        let rows_of = |p: &Partition| match p {
            Partition::InMemory(part) => part.batch.num_rows(),
            Partition::Spilled(_) => 0,
        };
        let visited = if plan.resolved.tracks_visited_build_rows() {
            let bytes = built
                .partitions
                .iter()
                .map(|p| VisitedBits::bytes_for(rows_of(p)))
                .sum();
            reservation.try_grow(bytes)?;
            built
                .partitions
                .iter()
                .map(|p| VisitedBits::new(rows_of(p)))
                .collect()
        } else {
            Vec::new()
        };
        let spills = built
            .partitions
            .iter()
            .map(|part| {
                matches!(part, Partition::Spilled(_)).then(|| SpillSlot {
                    buffer: Mutex::new(ProbeSpill {
                        pending: Vec::new(),
                        gathered: None,
                        rows: 0,
                        reservation: reservation.new_empty(),
                    }),
                    writer: Mutex::new(None),
                })
            })
            .collect();
        let gather_schema = spilljoin_spill::file_schema(&plan.spill_schema(false));
        Ok(Self {
            visited,
            probe_non_empty: AtomicBool::new(facts.probe_non_empty),
            probe_has_null: AtomicBool::new(facts.probe_has_null),
            spills,
            in_flight: InFlight::default(),
            spill_schema: plan.spill_schema(false),
            gather_schema: Arc::clone(&gather_schema),
            gathers: gatherable(&gather_schema),
            halvable: crate::gather::halvable(&gather_schema),
            files: LevelFiles::new(ctx, level.depth, false),
            _reservation: reservation,
        })
    }

    /// The probe facts seen so far.
    pub fn facts(&self) -> Facts {
        Facts {
            probe_non_empty: self.probe_non_empty.load(Ordering::Relaxed),
            probe_has_null: self.probe_has_null.load(Ordering::Relaxed),
        }
    }

    /// Grows a probe worker's reservation, writing buffered probe spill rows to disk
    /// first if memory is short.
    ///
    /// # Errors
    /// [`JoinError::ResourcesExhausted`] when it does not fit even then.
    pub fn reserve(
        &self,
        ctx: &Ctx<'_>,
        reservation: &mut MemoryReservation,
        bytes: usize,
    ) -> Result<()> {
        if reservation.try_grow(bytes).is_ok() {
            return Ok(());
        }
        let mut attempt = 0;
        loop {
            if self.free_buffers(ctx, || reservation.try_grow(bytes).is_ok())? {
                return Ok(());
            }
            match reservation.try_grow(bytes) {
                Ok(()) => return Ok(()),
                // Another worker may be writing buffers it took out, refilling the
                // buffers just written, or holding a piece it is about to release:
                // memory the headroom reserved for all of them. Wait for it before
                // calling the limit too small (a skewed SF10 join at 10% failed once
                // in three).
                Err(e) => self.wait_or(ctx, &mut attempt, e)?,
            }
        }
    }

    /// After a reservation failed with `e` though this worker wrote what it could
    /// (and holds no buffer out): waits for a buffer another worker took out to come
    /// back, or, when none is out, a millisecond (for memory another worker is about
    /// to release). A wait in which no buffer came back is one try of
    /// [`RESERVE_RETRIES`]; the next after the last gives up with `e`. (Waits in
    /// which one did come back are not counted: each is another worker's progress
    /// through a finite input.)
    fn wait_or(
        &self,
        ctx: &Ctx<'_>,
        attempt: &mut u32,
        e: spilljoin_memory::MemoryError,
    ) -> Result<()> {
        let waited = self.in_flight.wait(ctx.cancel)?;
        if waited == Waited::Ended {
            return Ok(());
        }

        if *attempt >= RESERVE_RETRIES {
            return Err(e.into());
        }
        *attempt += 1;
        if waited == Waited::Nothing {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        Ok(())
    }

    /// Appends probe rows (with their hashes, if spill files keep them) to partition
    /// `p`'s spill file. Rows are buffered and written a batch at a time; when memory
    /// is short, this partition's buffer and then every other partition's is written
    /// first.
    fn spill_rows(
        &self,
        ctx: &Ctx<'_>,
        p: usize,
        batch: RecordBatch,
        hashes: Vec<u64>,
    ) -> Result<()> {
        let slot = self.slot(p)?;
        let batch = attach_hashes(&batch, hashes, &self.spill_schema)?;
        let bytes = batch_bytes(&batch);
        let mut spill = lock(&slot.buffer);
        if spill.reservation.try_grow(bytes).is_err() {
            let full = self.take_full(&mut spill)?;
            drop(spill);
            self.write(ctx, p, full)?;
            spill = self.reserve_in(ctx, slot, bytes)?;
        }
        // (The bytes were reserved under this same lock: a buffer taken out meanwhile
        // would have taken them along, leaving these rows unaccounted.)
        spill.rows += batch.num_rows();
        spill.pending.push(batch);
        if spill.rows >= ctx.plan.work_rows {
            let full = self.take_full(&mut spill)?;
            drop(spill);
            self.write(ctx, p, full)?;
        }
        Ok(())
    }

    /// `slot`'s buffer, locked, with `bytes` more reserved for it: after writing
    /// other partitions' buffers (one lock at a time, so no two workers deadlock)
    /// and, as in [`reserve`](Self::reserve), waiting for the buffers other workers
    /// are writing ([`wait_or`](Self::wait_or)).
    fn reserve_in<'s>(
        &self,
        ctx: &Ctx<'_>,
        slot: &'s SpillSlot,
        bytes: usize,
    ) -> Result<std::sync::MutexGuard<'s, ProbeSpill>> {
        let mut attempt = 0;
        loop {
            let mut spill = lock(&slot.buffer);
            let e = match spill.reservation.try_grow(bytes) {
                Ok(()) => return Ok(spill),
                Err(e) => e,
            };
            drop(spill);
            // Whether it fits now; reserved for real above, under the lock the rows
            // are appended under.
            let fits = self.free_buffers(ctx, || {
                let mut spill = lock(&slot.buffer);
                let fits = spill.reservation.try_grow(bytes).is_ok();
                if fits {
                    spill.reservation.shrink(bytes);
                }
                fits
            })?;
            if !fits {
                self.wait_or(ctx, &mut attempt, e)?;
            }
        }
    }

    /// Like [`spill_rows`](Self::spill_rows) for a spill schema that can be gathered
    /// ([`gatherable`]): rows `rows` of `columns` (and their `hashes`, where spill
    /// files keep them) are copied once, into the batch that will be written.
    fn spill_gathered<'s>(
        &'s self,
        ctx: &Ctx<'_>,
        p: usize,
        columns: &[ArrayData],
        fits: &[bool],
        rows: &[u32],
        hashes: Option<&[u64]>,
    ) -> Result<()> {
        let slot = self.slot(p)?;
        // What the rows add beyond their fixed widths, measured with no lock held.
        let added = Growth::of(columns, rows);
        // Grows the reservation to what the buffers will hold with these rows (after
        // taking the buffered rows out, to be written, if they are gathered 32 bits
        // wide where these do not fit).
        type Reserved = Result<(), spilljoin_memory::MemoryError>;
        let reserve = |spill: &mut ProbeSpill, out: &mut ToWrite<'s>| -> Result<Reserved> {
            if spill
                .gathered
                .as_ref()
                .is_some_and(|g| !g.admits(fits, &added))
            {
                out.extend(self.take_full(spill)?);
            }
            let rows_now = match spill.gathered.as_mut() {
                Some(g) => g,
                None => spill
                    .gathered
                    .insert(GatherBuffer::halving(Arc::clone(&self.gather_schema))?),
            };
            rows_now.shape_for(fits);
            let need = rows_now.capacity_after(&added);
            let held = spill.reservation.size();
            Ok(spill.reservation.try_grow(need.saturating_sub(held)))
        };
        // A buffer is written when it holds the bytes of `work_rows` rows gathered
        // wide (what the build's headroom counts for it; a buffer being written
        // while the next fills is not counted there, but reserved all the same):
        // more rows when gathered 32 bits wide, so fewer, larger writes.
        // (Or a piece's bytes, with variable-width data.)
        let append = |spill: &mut ProbeSpill, out: &mut ToWrite<'s>| -> Result<()> {
            let mut full = false;
            if let Some(gathered) = spill.gathered.as_mut() {
                gathered.append(columns, rows, hashes)?;
                full = gathered.is_full(ctx.plan.work_rows, ctx.plan.piece_bytes());
            }
            spill.rows += rows.len();
            if full {
                out.extend(self.take_full(spill)?);
            }
            Ok(())
        };
        let mut out: ToWrite<'s> = Vec::new();
        let appended = {
            let mut spill = lock(&slot.buffer);
            if reserve(&mut spill, &mut out)?.is_ok() {
                append(&mut spill, &mut out)?;
                true
            } else {
                out.extend(self.take_full(&mut spill)?);
                false
            }
        };
        self.write_all(ctx, p, &mut out)?;
        if appended {
            return Ok(());
        }
        {
            let mut spill = lock(&slot.buffer);
            let appended = reserve(&mut spill, &mut out)?.is_ok();
            if appended {
                append(&mut spill, &mut out)?;
            }
            drop(spill);
            self.write_all(ctx, p, &mut out)?;
            if appended {
                return Ok(());
            }
        }
        // Free other buffers (one lock at a time, so no two workers deadlock); another
        // worker may refill them, or be writing some, meanwhile: wait and try again
        // (see `wait_or`).
        let mut attempt = 0;
        loop {
            let mut appended = None;
            self.free_buffers(ctx, || {
                let mut spill = lock(&slot.buffer);
                match reserve(&mut spill, &mut out) {
                    Ok(Ok(())) => {
                        appended = Some(append(&mut spill, &mut out));
                        true
                    }
                    Ok(Err(_)) => false,
                    Err(e) => {
                        appended = Some(Err(e));
                        true
                    }
                }
            })?;
            self.write_all(ctx, p, &mut out)?;
            if let Some(result) = appended {
                return result;
            }
            let mut spill = lock(&slot.buffer);
            match reserve(&mut spill, &mut out)? {
                Ok(()) => {
                    append(&mut spill, &mut out)?;
                    drop(spill);
                    return self.write_all(ctx, p, &mut out);
                }
                Err(e) => {
                    drop(spill);
                    self.write_all(ctx, p, &mut out)?;
                    self.wait_or(ctx, &mut attempt, e)?;
                }
            }
        }
    }

    /// Partition `p`'s spill slot.
    fn slot(&self, p: usize) -> Result<&SpillSlot> {
        self.spills
            .get(p)
            .and_then(|s| s.as_ref())
            .ok_or_else(|| JoinError::Internal("spilling to an unspilled partition".into()))
    }

    /// Writes buffered probe rows out, the fullest buffers first, until `fits()` (or
    /// every buffer is empty): a buffer written is written as full as it has become,
    /// not half empty because memory ran out for something else. Returns whether
    /// `fits()` said yes.
    fn free_buffers(&self, ctx: &Ctx<'_>, mut fits: impl FnMut() -> bool) -> Result<bool> {
        let mut held: Vec<(usize, usize)> = self
            .spills
            .iter()
            .enumerate()
            .filter_map(|(p, slot)| Some((lock(&slot.as_ref()?.buffer).reservation.size(), p)))
            .filter(|&(bytes, _)| bytes > 0)
            .collect();
        held.sort_unstable_by(|a, b| b.cmp(a));
        for (_, p) in held {
            let full = self.take_full(&mut lock(&self.slot(p)?.buffer))?;
            self.write(ctx, p, full)?;
            if fits() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Takes what `spill` buffers out of it, as one batch, with the memory it holds;
    /// `None` when it is empty.
    fn take_full(&self, spill: &mut ProbeSpill) -> Result<Option<Full<'_>>> {
        let gathered = spill.gathered.as_ref().map_or(0, GatherBuffer::len);
        if spill.pending.is_empty() && gathered == 0 {
            return Ok(None);
        }
        let rows = match spill.gathered.as_mut() {
            Some(rows) if gathered > 0 => {
                // The next batch of this partition will likely be written as full.
                rows.expect_rows(gathered);
                FullRows::Gathered(rows.finish()?)
            }
            _ => FullRows::Pending(std::mem::take(&mut spill.pending)),
        };
        spill.rows = 0;
        self.in_flight.started();
        Ok(Some(Full {
            rows,
            reservation: spill.reservation.take(),
            in_flight: &self.in_flight,
        }))
    }

    /// Writes a buffer taken out of partition `p` to its spill file (creating the
    /// file first), then releases the buffer's memory. Call it with no lock of `p`'s
    /// buffer held.
    ///
    /// Batches of variable-width columns are concatenated into one message first
    /// when the copy's memory can be reserved; otherwise each is its own message.
    fn write(&self, ctx: &Ctx<'_>, p: usize, full: Option<Full<'_>>) -> Result<()> {
        let Some(mut full) = full else {
            return Ok(());
        };
        let merged = match &full.rows {
            FullRows::Pending(batches)
                if batches.len() > 1
                    && full.reservation.try_grow(full.reservation.size()).is_ok() =>
            {
                Some(concat_batches(&self.spill_schema, batches)?)
            }
            _ => None,
        };
        let batches = match (&merged, &full.rows) {
            (Some(merged), _) => std::slice::from_ref(merged),
            (None, FullRows::Gathered(batch)) => std::slice::from_ref(batch),
            (None, FullRows::Pending(batches)) => &batches[..],
        };
        let mut writer = lock(&self.slot(p)?.writer);
        if writer.is_none() {
            *writer = Some(
                self.files
                    .create_writer(ctx, Arc::clone(&self.spill_schema), p)?,
            );
        }
        let writer = writer
            .as_mut()
            .ok_or_else(|| JoinError::Internal("no writer".into()))?;
        let counters = ctx.metrics.spill_counters(false);
        for batch in batches {
            write_counted(writer, batch, &counters)?;
        }
        Ok(())
    }

    /// [`write`](Self::write)s every buffer in `out`, emptying it.
    fn write_all(&self, ctx: &Ctx<'_>, p: usize, out: &mut ToWrite<'_>) -> Result<()> {
        for full in out.drain(..) {
            self.write(ctx, p, Some(full))?;
        }
        Ok(())
    }

    /// Writes what is buffered and closes the probe spill files, one per spilled
    /// partition that received rows.
    pub fn finish_spills(self, ctx: &Ctx<'_>) -> Result<Vec<Option<SpillFile>>> {
        let mut files = Vec::with_capacity(self.spills.len());
        for (p, slot) in self.spills.iter().enumerate() {
            files.push(match slot {
                None => None,
                Some(slot) => {
                    let full = self.take_full(&mut lock(&slot.buffer))?;
                    self.write(ctx, p, full)?;
                    lock(&slot.writer).take().map(|w| w.finish()).transpose()?
                }
            });
        }
        Ok(files)
    }
}

/// One probe worker's buffers, reused from batch to batch.
pub(crate) struct Prober<'a> {
    plan: &'a JoinPlan,
    ctx: &'a Ctx<'a>,
    bits: HashBits,
    built: &'a BuiltSide,
    state: &'a ProbeState,
    /// Whether probe rows (unmatched, semi, anti, mark, not-in) are output per batch.
    output_probe_rows: bool,
    /// Whether a probe row that repeats the key of the row before it is dropped:
    /// where only the probe's key set counts and some partition spilled, so that a
    /// run of equal keys (the line items of an order) is written once. (Not where
    /// every partition is in memory: the repeated lookups find their buckets in
    /// cache, and finding the runs cost more than it saved — SF1 `semi`, unlimited,
    /// probe 0.075 → 0.083 s.)
    spills_key_runs_once: bool,
    /// Per probe row of the current batch: sent to a spill file, decided later?
    deferred: Vec<bool>,
    hashes: Vec<u64>,
    grouped: PartitionedRows,
    /// Per probe row of the current batch: matched (and passed the filter)?
    matched: Vec<bool>,
    /// First table entries of the rows being looked up.
    firsts: Vec<u32>,
    /// Candidate pairs not yet filtered/output.
    pair_probe: Vec<u32>,
    pair_build: Vec<u32>,
    /// What the spilled partitions' bloom filters have done for this worker, all
    /// together: keys are hash-partitioned, so a filter that rules out few probe rows
    /// of one partition rules out few of any (by the trial schedule, one tally per
    /// partition tests ~14% of the rows at 127 spilled partitions — SF10 orders ⋈
    /// lineitem at a 5% limit, where no row is ruled out — and one per worker under
    /// 2%; measured: user CPU 3.29–3.46 → 3.13–3.21 s).
    bloom_tally: BloomTally,
    /// The current batch's columns as `ArrayData`, made by the first partition that
    /// gathers rows from it ([`crate::gather`]); cleared for every batch.
    batch_data: Vec<ArrayData>,
    /// Per column of `batch_data`: gathered for a spill file as `Int32`, if it may
    /// be and all its values fit ([`GatherBuffer::halving`]).
    batch_fits: Vec<bool>,
}

/// How often the spilled partitions' bloom filters ruled probe rows out.
#[derive(Debug, Default, Clone, Copy)]
struct BloomTally {
    tested: u64,
    skipped: u64,
    /// Set once the filter has shown it rules out too few rows to pay for itself.
    off: bool,
    /// Rows routed since the filter was switched off.
    untested: u64,
    /// Trials in a row that switched the filter off: each doubles the rows routed
    /// before the next (up to [`BLOOM_RETRY_MAX_SHIFT`] doublings).
    failed_trials: u32,
}

/// Probe rows a bloom filter is tried on before it is judged.
const BLOOM_TRIAL_ROWS: u64 = 16 * 1024;

/// Rows routed without a switched-off filter before it is tried again: the probe
/// input may change character (rows sorted so that those without a partner come
/// last). Trials then test a fifth of the rows: a fifth of the cost of always
/// testing where the filter never helps.
const BLOOM_RETRY_ROWS: u64 = 4 * BLOOM_TRIAL_ROWS;

/// After each further trial that switches the filter off, the rows before the next
/// double, up to `BLOOM_RETRY_ROWS << BLOOM_RETRY_MAX_SHIFT` (1Mi rows): where the
/// filter never helps, tests fall from a fifth of the rows to under 2% (SF10 orders ⋈
/// lineitem at a 25% limit: the tests of a fifth took 3% of the CPU time).
const BLOOM_RETRY_MAX_SHIFT: u32 = 4;

/// A bloom filter that rules out less than `1 / BLOOM_MIN_SKIP_SHARE` of the rows it
/// tested is switched off: a test is a cache miss in a filter of up to a few MiB, paid
/// by every row, and a row it rules out saves writing, reading and probing it again —
/// worth a few tests, not dozens. (SF10 orders ⋈ lineitem at a 25% limit, where every
/// probe row has a partner: the tests took 8.5% of the CPU time and skipped nothing.)
const BLOOM_MIN_SKIP_SHARE: u64 = 4;

/// How many times a probe worker frees its spill buffers and tries a reservation
/// again, after waiting up to [`WRITE_WAIT`] for a buffer out to come back or 1 ms
/// when none is out, before the limit is called too small ([`ProbeState::wait_or`]).
const RESERVE_RETRIES: u32 = 16;

impl<'a> Prober<'a> {
    pub fn new(
        ctx: &'a Ctx<'a>,
        bits: HashBits,
        built: &'a BuiltSide,
        state: &'a ProbeState,
    ) -> Self {
        Self {
            plan: ctx.plan,
            ctx,
            bits,
            built,
            state,
            output_probe_rows: true,
            spills_key_runs_once: ctx.plan.filter.is_none()
                && ctx.plan.resolved.probe_keys_suffice()
                && built
                    .partitions
                    .iter()
                    .any(|p| matches!(p, Partition::Spilled(_))),
            deferred: Vec::new(),
            firsts: Vec::new(),
            hashes: Vec::new(),
            grouped: PartitionedRows::default(),
            matched: Vec::new(),
            pair_probe: Vec::with_capacity(ctx.plan.work_rows),
            pair_build: Vec::with_capacity(ctx.plan.work_rows),
            bloom_tally: BloomTally::default(),
            batch_data: Vec::new(),
            batch_fits: Vec::new(),
        }
    }

    /// Leaves probe rows to the caller, who reads [`matched`](Self::matched) after each
    /// batch (the chunked fallback, where a row's fate depends on every chunk).
    pub fn without_probe_row_output(mut self) -> Self {
        self.output_probe_rows = false;
        self
    }

    /// Per row of the last probed batch: matched (and passed the filter)?
    pub fn matched(&self) -> &[bool] {
        &self.matched
    }

    /// Probes one batch and sends its output.
    pub fn probe(
        &mut self,
        batch: &RecordBatch,
        stored_hashes: Option<&[u64]>,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let plan = self.plan;
        let n = batch.num_rows();
        self.matched.clear();
        self.matched.resize(n, false);
        if n == 0 {
            return Ok(());
        }
        self.state.probe_non_empty.store(true, Ordering::Relaxed);
        let keys = plan.keys.evaluate(batch, false)?;
        if keys.nulls.is_some() {
            self.state.probe_has_null.store(true, Ordering::Relaxed);
        }
        let resolved = plan.resolved;
        self.matched.clear();
        self.matched.resize(n, false);
        self.deferred.clear();
        self.deferred.resize(n, false);

        // NOT IN with the subquery on the build side: two facts decide most rows.
        let skip_lookup = resolved == BuildJoinType::ProbeNotIn
            && (self.built.num_rows == 0 || self.built.has_null_key);
        if !skip_lookup {
            // One partition whose table is looked up by key (a spilled pair joined
            // whole): no hash is ever read.
            let unhashed = self.bits.fan_out() == 1
                && matches!(&self.built.partitions[..], [Partition::InMemory(part)] if part.table.by_key());
            match stored_hashes {
                Some(stored) => {
                    self.hashes.clear();
                    self.hashes.extend_from_slice(stored);
                }
                None if unhashed => {
                    self.hashes.clear();
                    self.hashes.resize(n, 0);
                }
                None => hash_keys(&keys.columns, n, &mut self.hashes)?,
            }
            let never_matches = plan.nulls_never_match();
            let excluded = keys.nulls.as_ref().filter(|_| never_matches);
            let first_of_runs = self
                .spills_key_runs_once
                .then(|| keys.first_of_runs(excluded))
                .flatten();
            self.grouped
                .group(self.bits, &self.hashes, first_of_runs.as_ref().or(excluded));
            self.batch_data.clear();
            for p in 0..self.bits.fan_out() {
                if self.grouped.partition(p).is_empty() {
                    continue;
                }
                match &self.built.partitions[p] {
                    Partition::InMemory(_) => self.probe_partition(batch, &keys, p, sink)?,
                    Partition::Spilled(spilled) => self.route(batch, p, spilled.bloom.as_ref())?,
                }
            }
        }
        if self.output_probe_rows {
            self.emit_probe_rows(batch, &keys, sink)?;
        }
        Ok(())
    }

    /// Sends the rows of spilled partition `p` that may match to its probe spill file;
    /// the others cannot match and stay unmatched in this batch.
    fn route(&mut self, batch: &RecordBatch, p: usize, bloom: Option<&Bloom>) -> Result<()> {
        let tally = self.bloom_tally;
        let bloom = bloom.filter(|_| !tally.off);
        let candidates = self.grouped.partition(p);
        // Without a filter to consult, the partition's rows as grouped, not a copy.
        let rows: Cow<'_, [u32]> = match bloom {
            Some(bloom) => Cow::Owned(bloom.select(candidates, |r| self.hashes[r])),
            None => Cow::Borrowed(candidates),
        };
        let ctx = self.ctx;
        let skipped = candidates.len() - rows.len();
        {
            let tally = &mut self.bloom_tally;
            if bloom.is_some() {
                tally.tested += candidates.len() as u64;
                tally.skipped += skipped as u64;
                tally.off = tally.tested >= BLOOM_TRIAL_ROWS
                    && tally.skipped * BLOOM_MIN_SKIP_SHARE < tally.tested;
                if tally.off {
                    tally.failed_trials += 1;
                }
            } else if tally.off {
                tally.untested += candidates.len() as u64;
                let shift = tally
                    .failed_trials
                    .saturating_sub(1)
                    .min(BLOOM_RETRY_MAX_SHIFT);
                if tally.untested >= BLOOM_RETRY_ROWS << shift {
                    *tally = BloomTally {
                        failed_trials: tally.failed_trials,
                        ..BloomTally::default()
                    };
                }
            }
        }
        ctx.metrics
            .probe_rows_skipped
            .fetch_add(skipped as u64, Ordering::Relaxed);
        if rows.is_empty() {
            return Ok(());
        }
        for &r in rows.iter() {
            self.deferred[r as usize] = true;
        }
        if self.state.gathers {
            // The batch's columns as ArrayData, once per batch (not per partition).
            if self.batch_data.is_empty() {
                self.batch_data = batch.columns().iter().map(|c| c.to_data()).collect();
                self.batch_fits = crate::gather::halvable_fits(batch, &self.state.halvable);
            }
            let hashes = ctx.plan.spills_hashes().then_some(&self.hashes[..]);
            return self.state.spill_gathered(
                ctx,
                p,
                &self.batch_data,
                &self.batch_fits,
                &rows,
                hashes,
            );
        }
        let hashes: Vec<u64> = if ctx.plan.spills_hashes() {
            rows.iter().map(|&r| self.hashes[r as usize]).collect()
        } else {
            Vec::new()
        };
        // (Compacted: a take of a nested column of views or dictionaries shares its
        // input's buffers, which the file would get whole.)
        let fragment = crate::output::owned_batch(take_record_batch(
            batch,
            &UInt32Array::from(rows.into_owned()),
        )?)?;
        self.state.spill_rows(ctx, p, fragment, hashes)
    }

    fn probe_partition(
        &mut self,
        batch: &RecordBatch,
        keys: &Keys,
        p: usize,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let Partition::InMemory(part) = &self.built.partitions[p] else {
            return Err(JoinError::Internal("probing a spilled partition".into()));
        };
        match (&keys.repr, &part.keys) {
            (
                KeyRepr::Words {
                    words: pw,
                    valid: pv,
                    ..
                },
                KeyRepr::Words {
                    words: bw,
                    valid: bv,
                    ..
                },
            ) => {
                if self.plan.keys.null_equality == NullEquality::NullEqualsNull
                    && (pv.is_some() || bv.is_some())
                {
                    let eq = NullableWordEq {
                        probe: pw,
                        build: bw,
                        probe_valid: pv.as_ref(),
                        build_valid: bv.as_ref(),
                    };
                    self.lookup(batch, part, p, &eq, sink)
                } else {
                    self.lookup(
                        batch,
                        part,
                        p,
                        &WordEq {
                            probe: pw,
                            build: bw,
                        },
                        sink,
                    )
                }
            }
            (KeyRepr::Rows(pr), KeyRepr::Rows(br)) => self.lookup(
                batch,
                part,
                p,
                &RowsEq {
                    probe: pr,
                    build: br,
                },
                sink,
            ),
            _ => Err(JoinError::Internal(
                "build and probe keys differ in representation".into(),
            )),
        }
    }

    /// Finds the candidates of partition `p`'s probe rows.
    fn lookup<E: KeyEq>(
        &mut self,
        batch: &RecordBatch,
        part: &BuiltPartition,
        p: usize,
        eq: &E,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let resolved = self.plan.resolved;
        let has_filter = self.plan.filter.is_some();
        let rows = std::mem::take(&mut self.grouped.rows);
        let range = self.grouped.offsets[p]..self.grouped.offsets[p + 1];
        let mut firsts = std::mem::take(&mut self.firsts);
        // A key-indexed table (dense keys) is looked up by the key itself, and its
        // chains hold only that key: no key is compared where keys are plain words.
        // A table bucketed by key value is looked up by the key too; its chains hold
        // neighbouring keys, compared as in a hashed table.
        let direct = part.table.is_direct();
        let skip_eq = direct && E::EXACT_IN_DIRECT;
        if part.table.by_key() {
            if !E::WORDS {
                self.grouped.rows = rows;
                self.firsts = firsts;
                return Err(JoinError::Internal(
                    "a key-indexed table for keys that are not words".into(),
                ));
            }
            firsts.clear();
            firsts.extend(rows[range.clone()].iter().map(|&r| {
                eq.probe_word(r as usize)
                    .map_or(0, |word| part.table.first_by_key(word))
            }));
        } else {
            part.table.first_entries(
                rows[range.clone()].iter().map(|&r| self.hashes[r as usize]),
                &mut firsts,
            );
        }
        // The first candidates' links and keys start loading now, so the walks
        // below find them in cache (the lookups above already overlapped) — unless
        // the walks go through the build rows in order, which the processor reads
        // ahead by itself (SF10 orders ⋈ lineitem at a 25% limit, whose spilled pairs
        // come in key order, with one-row chains flagged as well: pairs phase
        // 0.68 → 0.63 s).
        if !part.table.walks_in_row_order(&firsts) {
            for &first in &firsts {
                part.table.prefetch_link(first);
                if !skip_eq {
                    if let Some(b) = part.table.first_row(first) {
                        eq.prefetch_build(b);
                    }
                }
            }
        }
        let result = (|| {
            if !has_filter && !resolved.emits_pairs() {
                // Existence only: no pair is ever materialized.
                let stop_at_first = resolved.probe_stops_at_first_match();
                for (&r, &first) in rows[range.clone()].iter().zip(&firsts) {
                    let r = r as usize;
                    let hash = self.hashes[r];
                    part.table.for_each_candidate_from(
                        first,
                        hash,
                        &part.hashes,
                        E::CHECK_HASH_FIRST,
                        |b| {
                            if !(skip_eq || eq.key_eq(r, b)) {
                                return ControlFlow::Continue(());
                            }
                            if stop_at_first {
                                self.matched[r] = true;
                                ControlFlow::Break(())
                            } else if self.state.visited[p].test_and_set(b) {
                                // Another probe row with this key is marking (or has
                                // marked) every build row of it: a hot key costs one
                                // chain walk, not one per probe row.
                                ControlFlow::Break(())
                            } else {
                                ControlFlow::Continue(())
                            }
                        },
                    );
                }
                return Ok(());
            }
            let batch_size = self.plan.work_rows;
            for (&r, &first) in rows[range.clone()].iter().zip(&firsts) {
                let r = r as usize;
                let hash = self.hashes[r];
                let mut from = first;
                // A hot key's chain may hold millions of rows: the walk stops when
                // the pair buffers are full (their reservation is for `batch_size`
                // pairs), and goes on from where it stopped once they are emptied.
                loop {
                    let mut full = false;
                    let rest = part.table.for_each_candidate_from(
                        from,
                        hash,
                        &part.hashes,
                        E::CHECK_HASH_FIRST,
                        |b| {
                            if skip_eq || eq.key_eq(r, b) {
                                self.pair_probe.push(r as u32);
                                self.pair_build.push(b as u32);
                                if self.pair_probe.len() >= batch_size {
                                    full = true;
                                    return ControlFlow::Break(());
                                }
                            }
                            ControlFlow::Continue(())
                        },
                    );
                    if full {
                        self.flush_pairs(batch, part, p, sink)?;
                    }
                    match rest {
                        Some(rest) => from = rest,
                        None => break,
                    }
                }
            }
            self.flush_pairs(batch, part, p, sink)
        })();
        self.grouped.rows = rows;
        self.firsts = firsts;
        result
    }

    /// Filters the pending candidate pairs, records matches and outputs pairs, in
    /// slices of at most one batch.
    fn flush_pairs(
        &mut self,
        batch: &RecordBatch,
        part: &BuiltPartition,
        p: usize,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let batch_size = self.plan.work_rows;
        let mut start = 0;
        while start < self.pair_probe.len() {
            let end = (start + batch_size).min(self.pair_probe.len());
            let probe_rows = UInt32Array::from(self.pair_probe[start..end].to_vec());
            let build_rows = UInt32Array::from(self.pair_build[start..end].to_vec());
            start = end;
            let (probe_rows, build_rows) = match &self.plan.filter {
                None => (probe_rows, build_rows),
                Some(filter) => {
                    let passed = filter.evaluate(batch, &probe_rows, &part.batch, &build_rows)?;
                    if passed.true_count() == 0 {
                        continue;
                    }
                    let keep = |a: &UInt32Array| -> Result<UInt32Array> {
                        let filtered = arrow_select::filter::filter(a, &passed)?;
                        Ok(filtered
                            .as_any()
                            .downcast_ref::<UInt32Array>()
                            .cloned()
                            .unwrap_or_else(|| UInt32Array::from(Vec::<u32>::new())))
                    };
                    (keep(&probe_rows)?, keep(&build_rows)?)
                }
            };
            if self.plan.resolved.tracks_matched_probe_rows() {
                for &r in probe_rows.values() {
                    self.matched[r as usize] = true;
                }
            }
            if self.plan.resolved.tracks_visited_build_rows() {
                for &b in build_rows.values() {
                    self.state.visited[p].set(b as usize);
                }
            }
            if self.plan.resolved.emits_pairs() {
                let out = self.plan.output.gather(
                    probe_rows.len(),
                    Some((batch, &probe_rows)),
                    Some((&part.batch, &build_rows)),
                    None,
                )?;
                sink.push(out)?;
            }
        }
        self.pair_probe.clear();
        self.pair_build.clear();
        Ok(())
    }

    /// Outputs the probe rows that the join type keeps once the whole batch is probed.
    fn emit_probe_rows(
        &self,
        batch: &RecordBatch,
        keys: &Keys,
        sink: &mut OutputSink,
    ) -> Result<()> {
        let n = batch.num_rows();
        let output = &self.plan.output;
        let deferred = &self.deferred;
        // Generic, not `&dyn Fn`: the test of every row inlines.
        fn select(n: usize, deferred: &[bool], keep: impl Fn(usize) -> bool) -> UInt32Array {
            crate::batches::select_rows(0..n as u32, |r| !deferred[r] & keep(r))
        }
        let rows = match self.plan.resolved {
            BuildJoinType::ProbeOuter | BuildJoinType::Full | BuildJoinType::ProbeAnti => {
                select(n, deferred, |r| !self.matched[r])
            }
            BuildJoinType::ProbeSemi => select(n, deferred, |r| self.matched[r]),
            BuildJoinType::ProbeNotIn => {
                if self.built.num_rows == 0 {
                    select(n, deferred, |_| true)
                } else if self.built.has_null_key {
                    return Ok(());
                } else {
                    select(n, deferred, |r| !self.matched[r] && !keys.is_null(r))
                }
            }
            BuildJoinType::ProbeMark => {
                let rows = select(n, deferred, |_| true);
                let marks: Vec<bool> = rows
                    .values()
                    .iter()
                    .map(|&r| self.matched[r as usize])
                    .collect();
                let mark = BooleanArray::new(BooleanBuffer::from(marks), None);
                let out = output.gather(rows.len(), Some((batch, &rows)), None, Some(&mark))?;
                return sink.push(out);
            }
            _ => return Ok(()),
        };
        if rows.is_empty() {
            return Ok(());
        }
        for start in (0..rows.len()).step_by(self.plan.batch_size) {
            let slice = rows.slice(start, self.plan.batch_size.min(rows.len() - start));
            let out = output.gather(slice.len(), Some((batch, &slice)), None, None)?;
            sink.push(out)?;
        }
        Ok(())
    }
}

/// Outputs the build rows `rows` (all when `None`) of in-memory partition `p` that
/// the join type keeps, once every probe worker is done. Spilled partitions are
/// output by their own level.
pub(crate) fn emit_build_rows(
    plan: &JoinPlan,
    built: &BuiltSide,
    state: &ProbeState,
    p: usize,
    rows: Option<Range<usize>>,
    sink: &mut OutputSink,
) -> Result<()> {
    let Partition::InMemory(part) = &built.partitions[p] else {
        return Ok(());
    };
    let rows = rows.unwrap_or(0..part.batch.num_rows());
    let visited = |row: usize| state.visited[p].get(row);
    let facts = state.facts();
    let keep: Box<dyn Fn(usize) -> bool> = match plan.resolved {
        BuildJoinType::BuildOuter | BuildJoinType::Full | BuildJoinType::BuildAnti => {
            Box::new(|r| !visited(r))
        }
        BuildJoinType::BuildSemi => Box::new(visited),
        BuildJoinType::BuildMark => Box::new(|_| true),
        BuildJoinType::BuildNotIn if !facts.probe_non_empty => Box::new(|_| true),
        BuildJoinType::BuildNotIn if facts.probe_has_null => return Ok(()),
        BuildJoinType::BuildNotIn => Box::new(|r| !visited(r)),
        _ => return Ok(()),
    };
    emit_rows(plan, &part.batch, rows, keep, visited, sink)
}

/// Outputs the build rows whose key can never match (unmatched by definition), from
/// memory and from their spill file.
pub(crate) fn emit_unmatchable(
    plan: &JoinPlan,
    unmatchable: &Unmatchable,
    facts: Facts,
    sink: &mut OutputSink,
) -> Result<()> {
    let keep = match plan.resolved {
        BuildJoinType::BuildNotIn => !facts.probe_non_empty,
        other => other.keeps_unmatchable_build_rows(),
    };
    if !keep {
        return Ok(());
    }
    for batch in &unmatchable.batches {
        emit_rows(plan, batch, 0..batch.num_rows(), |_| true, |_| false, sink)?;
    }
    if let Some(file) = &unmatchable.file {
        for batch in file.reader()? {
            let batch = batch?;
            emit_rows(plan, &batch, 0..batch.num_rows(), |_| true, |_| false, sink)?;
        }
    }
    Ok(())
}

/// Outputs the rows `rows` of `batch` that `keep`, a batch at a time (with their
/// `mark` for a mark join).
fn emit_rows(
    plan: &JoinPlan,
    batch: &RecordBatch,
    rows: Range<usize>,
    keep: impl Fn(usize) -> bool,
    mark: impl Fn(usize) -> bool,
    sink: &mut OutputSink,
) -> Result<()> {
    let n = rows.end.min(batch.num_rows());
    let batch_size = plan.batch_size;
    for start in (rows.start..n).step_by(batch_size.max(1)) {
        let end = (start + batch_size).min(n);
        let rows = crate::batches::select_rows(start as u32..end as u32, &keep);
        if rows.is_empty() {
            continue;
        }
        let marks = (plan.resolved == BuildJoinType::BuildMark).then(|| {
            BooleanArray::from(
                rows.values()
                    .iter()
                    .map(|&r| mark(r as usize))
                    .collect::<Vec<_>>(),
            )
        });
        let out = plan
            .output
            .gather(rows.len(), None, Some((batch, &rows)), marks.as_ref())?;
        sink.push(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_for_buffers_out_says_whether_one_came_back() -> Result<()> {
        let in_flight = InFlight::default();
        let cancel = AtomicBool::new(false);
        assert_eq!(in_flight.wait(&cancel)?, Waited::Nothing);
        in_flight.started();
        assert_eq!(in_flight.wait(&cancel)?, Waited::TimedOut);
        // Buffers coming back while a worker waits: it sees one come back (however
        // the two threads are scheduled, as buffers keep coming back until it does).
        for _ in 0..100_000 {
            in_flight.started();
        }
        let waiting = AtomicBool::new(true);
        std::thread::scope(|scope| -> Result<()> {
            let waiter = scope.spawn(|| {
                let waited = (0..100)
                    .map(|_| in_flight.wait(&cancel))
                    .find(|w| !matches!(w, Ok(Waited::TimedOut)));
                waiting.store(false, Ordering::Relaxed);
                waited
            });
            while waiting.load(Ordering::Relaxed) {
                in_flight.ended();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let waited = waiter
                .join()
                .map_err(|_| JoinError::InvalidJoin("the waiter panicked".into()))?;
            assert!(matches!(waited, Some(Ok(Waited::Ended))), "{waited:?}");
            Ok(())
        })?;
        while lock(&in_flight.state).count > 1 {
            in_flight.ended();
        }
        // One is still out; a cancelled join stops waiting for it.
        cancel.store(true, Ordering::Relaxed);
        assert!(matches!(in_flight.wait(&cancel), Err(JoinError::Cancelled)));
        in_flight.ended();
        assert_eq!(in_flight.wait(&cancel)?, Waited::Nothing);
        Ok(())
    }
}
