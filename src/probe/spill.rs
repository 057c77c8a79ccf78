//! Probe-side spilling: the probe rows of spilled partitions on their way to disk.
//!
//! ```text
//!  route (a worker's rows of partition p) ─► p's buffer (gathered, or pending batches)
//!     full (work_rows, or a piece's bytes) or memory short ─► taken out ─► p's file
//!  memory short with nothing of p's to write ─► other partitions' buffers, the
//!     fullest first ─► still short: wait for buffers other workers are writing
//!  end of input ─► what is buffered written, the files closed (finish_spills)
//! ```
//!
//! Each spilled partition has a buffer and a writer under locks of their own
//! ([`SpillSlot`]): a full buffer is taken out under the first and written outside it
//! (`in_flight.rs`). Before rows are routed here, the partition's bloom filter may
//! rule some out; [`BloomTally`] decides whether consulting it pays. Its own file:
//! the reservations, retries and writes of spilling have nothing to do with lookups.

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_data::ArrayData;
use arrow_select::concat::concat_batches;
use spilljoin_memory::{MemoryError, MemoryReservation};
use spilljoin_spill::{SpillFile, SpillWriter};

use super::in_flight::{Full, FullRows, ToWrite};
use super::state::ProbeState;
use crate::batches::{attach_hashes, batch_bytes, lock, write_counted};
use crate::context::Ctx;
use crate::error::{JoinError, Result};
use crate::gather::{GatherBuffer, Growth};
use crate::write_out::Waited;

/// Probe rows bound for one spilled partition, buffered and written a batch at a time.
#[derive(Debug)]
pub(super) struct ProbeSpill {
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
/// every few batches, workers otherwise wait, in futex calls, for the lock of a
/// partition being written.)
///
/// Neither lock is taken while the other is held.
#[derive(Debug)]
pub(super) struct SpillSlot {
    buffer: Mutex<ProbeSpill>,
    writer: Mutex<Option<SpillWriter>>,
}

impl SpillSlot {
    /// An empty buffer, its memory to be reserved in `reservation`, and no file yet.
    pub(super) fn new(reservation: MemoryReservation) -> Self {
        Self {
            buffer: Mutex::new(ProbeSpill {
                pending: Vec::new(),
                gathered: None,
                rows: 0,
                reservation,
            }),
            writer: Mutex::new(None),
        }
    }
}

/// Rows of a probe batch bound for one spilled partition's buffer, to be gathered
/// into it ([`ProbeState::spill_gathered`]), with what they need reserved.
struct GatheredRows<'r> {
    /// The partition, and its slot.
    p: usize,
    slot: &'r SpillSlot,
    /// The batch's columns, and per column whether its values fit in 32 bits.
    columns: &'r [ArrayData],
    fits: &'r [bool],
    /// The rows of the batch, and the batch's hashes where spill files keep them.
    rows: &'r [u32],
    hashes: Option<&'r [u64]>,
    /// What the rows add beyond their fixed widths, measured with no lock held.
    added: Growth,
}

/// Whether the memory for what was asked could be reserved.
type Reserved = std::result::Result<(), MemoryError>;

impl ProbeState {
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
                // calling the limit too small (skewed joins otherwise failed, now and
                // then, under limits they fit in).
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
    fn wait_or(&self, ctx: &Ctx<'_>, attempt: &mut u32, e: MemoryError) -> Result<()> {
        let waited = self.writes_out.wait(ctx.cancel)?;
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
    pub(super) fn spill_rows(
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
    /// ([`gatherable`](crate::gather::gatherable)): rows `rows` of `columns` (and
    /// their `hashes`, where spill files keep them) are copied once, into the batch
    /// that will be written.
    pub(super) fn spill_gathered<'s>(
        &'s self,
        ctx: &Ctx<'_>,
        p: usize,
        columns: &[ArrayData],
        fits: &[bool],
        rows: &[u32],
        hashes: Option<&[u64]>,
    ) -> Result<()> {
        let rows = GatheredRows {
            p,
            slot: self.slot(p)?,
            columns,
            fits,
            rows,
            hashes,
            added: Growth::of(columns, rows),
        };
        let mut out: ToWrite<'s> = Vec::new();
        // Short of memory, the partition's own buffer is written first.
        if self.try_gathered(ctx, &rows, &mut out, true)?.is_ok() {
            return Ok(());
        }
        if self.try_gathered(ctx, &rows, &mut out, false)?.is_ok() {
            return Ok(());
        }
        // Free other buffers (one lock at a time, so no two workers deadlock); another
        // worker may refill them, or be writing some, meanwhile: wait and try again
        // (see `wait_or`).
        let mut attempt = 0;
        loop {
            if let Some(appended) = self.gathered_freeing(ctx, &rows, &mut out)? {
                return appended;
            }
            match self.try_gathered(ctx, &rows, &mut out, false)? {
                Ok(()) => return Ok(()),
                Err(e) => self.wait_or(ctx, &mut attempt, e)?,
            }
        }
    }

    /// One try at appending `rows` to their partition's buffer, under its lock: what
    /// the buffer will hold with them is reserved, and they are appended if it could
    /// be (if it could not and `write_own_when_short`, the rows buffered are taken out
    /// instead). What was taken out is written once the lock is released. Returns
    /// whether the memory could be reserved.
    fn try_gathered<'s>(
        &'s self,
        ctx: &Ctx<'_>,
        rows: &GatheredRows<'_>,
        out: &mut ToWrite<'s>,
        write_own_when_short: bool,
    ) -> Result<Reserved> {
        let mut spill = lock(&rows.slot.buffer);
        let reserved = self.reserve_gathered(&mut spill, rows, out)?;
        if reserved.is_ok() {
            self.append_gathered(ctx, &mut spill, rows, out)?;
        } else if write_own_when_short {
            out.extend(self.take_full(&mut spill)?);
        }
        drop(spill);
        self.write_all(ctx, rows.p, out)?;
        Ok(reserved)
    }

    /// Writes other partitions' buffers, the fullest first
    /// ([`free_buffers`](Self::free_buffers)), trying after each to append `rows` to
    /// their own partition's: `Some` of the outcome once there was memory for them
    /// (or the append failed), `None` when there was not even with every buffer
    /// written.
    fn gathered_freeing<'s>(
        &'s self,
        ctx: &Ctx<'_>,
        rows: &GatheredRows<'_>,
        out: &mut ToWrite<'s>,
    ) -> Result<Option<Result<()>>> {
        let mut appended = None;
        self.free_buffers(ctx, || {
            let mut spill = lock(&rows.slot.buffer);
            match self.reserve_gathered(&mut spill, rows, out) {
                Ok(Ok(())) => {
                    appended = Some(self.append_gathered(ctx, &mut spill, rows, out));
                    true
                }
                Ok(Err(_)) => false,
                Err(e) => {
                    appended = Some(Err(e));
                    true
                }
            }
        })?;
        self.write_all(ctx, rows.p, out)?;
        Ok(appended)
    }

    /// Grows the reservation of `spill` (the locked buffer of `rows`' partition) to
    /// what it will hold with `rows` (after taking the buffered rows out into `out`,
    /// to be written, if they are gathered 32 bits wide where these do not fit).
    /// Returns whether the memory was there.
    fn reserve_gathered<'s>(
        &'s self,
        spill: &mut ProbeSpill,
        rows: &GatheredRows<'_>,
        out: &mut ToWrite<'s>,
    ) -> Result<Reserved> {
        if spill
            .gathered
            .as_ref()
            .is_some_and(|g| !g.admits(rows.fits, &rows.added))
        {
            out.extend(self.take_full(spill)?);
        }
        let rows_now = match spill.gathered.as_mut() {
            Some(g) => g,
            None => spill
                .gathered
                .insert(GatherBuffer::halving(Arc::clone(&self.gather_schema))?),
        };
        rows_now.shape_for(rows.fits);
        let need = rows_now.capacity_after(&rows.added);
        let held = spill.reservation.size();
        Ok(spill.reservation.try_grow(need.saturating_sub(held)))
    }

    /// Appends `rows` to `spill` (their partition's buffer, locked, with the memory
    /// reserved by [`reserve_gathered`](Self::reserve_gathered)), and takes the
    /// buffer out into `out` if it is full.
    ///
    /// A buffer is written when it holds the bytes of `work_rows` rows gathered wide
    /// (what the build's headroom counts for it; a buffer being written while the
    /// next fills is not counted there, but reserved all the same): more rows when
    /// gathered 32 bits wide, so fewer, larger writes. (Or a piece's bytes, with
    /// variable-width data.)
    fn append_gathered<'s>(
        &'s self,
        ctx: &Ctx<'_>,
        spill: &mut ProbeSpill,
        rows: &GatheredRows<'_>,
        out: &mut ToWrite<'s>,
    ) -> Result<()> {
        let mut full = false;
        if let Some(gathered) = spill.gathered.as_mut() {
            gathered.append(rows.columns, rows.rows, rows.hashes)?;
            full = gathered.is_full(ctx.plan.work_rows, ctx.plan.piece_bytes());
        }
        spill.rows += rows.rows.len();
        if full {
            out.extend(self.take_full(spill)?);
        }
        Ok(())
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
        Ok(Some(Full {
            rows,
            reservation: spill.reservation.take(),
            _out: self.writes_out.start(),
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
/// How often the spilled partitions' bloom filters ruled probe rows out.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BloomTally {
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

impl BloomTally {
    /// Whether the filter is to be consulted (it has not been switched off).
    pub(super) fn consults(&self) -> bool {
        !self.off
    }

    /// Counts `candidates` rows routed, `skipped` of them ruled out by the filter
    /// when it was `consulted`: switches the filter off once a trial shows it rules
    /// out too few ([`BLOOM_MIN_SKIP_SHARE`]), and on again, for another trial, after
    /// [`BLOOM_RETRY_ROWS`] (doubled for each failed trial) rows routed without it.
    pub(super) fn count(&mut self, consulted: bool, candidates: usize, skipped: usize) {
        if consulted {
            self.tested += candidates as u64;
            self.skipped += skipped as u64;
            self.off = self.tested >= BLOOM_TRIAL_ROWS
                && self.skipped * BLOOM_MIN_SKIP_SHARE < self.tested;
            if self.off {
                self.failed_trials += 1;
            }
        } else if self.off {
            self.untested += candidates as u64;
            let shift = self
                .failed_trials
                .saturating_sub(1)
                .min(BLOOM_RETRY_MAX_SHIFT);
            if self.untested >= BLOOM_RETRY_ROWS << shift {
                *self = BloomTally {
                    failed_trials: self.failed_trials,
                    ..BloomTally::default()
                };
            }
        }
    }
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
/// filter never helps, tests fall from a fifth of the rows to under 2% (the tests of
/// a fifth showed in the CPU time of joins whose every probe row has a partner).
const BLOOM_RETRY_MAX_SHIFT: u32 = 4;

/// A bloom filter that rules out less than `1 / BLOOM_MIN_SKIP_SHARE` of the rows it
/// tested is switched off: a test is a cache miss in a filter of up to a few MiB, paid
/// by every row, and a row it rules out saves writing, reading and probing it again —
/// worth a few tests, not dozens. (Where every probe row has a partner, the tests
/// take a noticeable share of the CPU time and skip nothing.)
const BLOOM_MIN_SKIP_SHARE: u64 = 4;

/// How many times a probe worker frees its spill buffers and tries a reservation
/// again, after waiting up to [`WRITE_WAIT`](crate::write_out::WRITE_WAIT) for a
/// buffer out to come back or 1 ms when none is out, before the limit is called too
/// small ([`ProbeState::wait_or`]).
pub(super) const RESERVE_RETRIES: u32 = 16;
