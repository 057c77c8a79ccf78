//! Collecting rows into partitions: each build worker's loop over its share of the
//! input, cutting batches into pieces, hashing and grouping each piece by partition,
//! and adding every partition's rows to its buffer — gathered in place where every
//! column can be gathered, else as fragments. Its own file because it is the hot path
//! of the build; memory it cannot reserve is freed by spilling ([`super::spill`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

use arrow_array::{RecordBatch, UInt32Array};
use arrow_buffer::NullBuffer;
use arrow_data::ArrayData;
use arrow_schema::ArrowError;
use arrow_select::take::take_record_batch;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};

use super::collector::{BuildCollector, CollectorState};
use crate::batches::{batch_bytes, lock, pieces, InputStreams};
use crate::bounds::KeyBounds;
use crate::error::{JoinError, Result};
use crate::gather::{GatherBuffer, Growth};
use crate::hash::hash_keys;
use crate::partition::PartitionedRows;
use crate::plan::JoinPlan;

/// The most rows of a build batch partitioned at a time.
const MAX_BUILD_PIECE_ROWS: usize = 64 * 1024;

/// One build worker's buffers, reused from batch to batch.
struct CollectScratch {
    /// Holds the batch in flight and fragments not yet handed to a partition.
    mine: MemoryReservation,
    /// Holds what a partition's gathered rows will grow by, until they do.
    pending: MemoryReservation,
    hashes: Vec<u64>,
    grouped: PartitionedRows,
    /// The partition this worker gathers into first: workers start apart, so that
    /// they seldom wait for the same partition's lock
    /// ([`Gathered`](super::collector::Gathered)).
    first_partition: usize,
}

impl BuildCollector<'_> {
    /// Reads one worker's share of the input.
    pub(super) fn collect<I>(
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
            // The batch in flight is working memory, not rows that can spill (see
            // `add`): pools that share among spilling consumers serve it first.
            mine: MemoryConsumer::new("spilljoin build side").register(&plan.pool),
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
        self.reserve(&mut scratch.mine, input_bytes)?;
        let nulls = self.hash_keys_of(batch, stored_hashes, &mut scratch.hashes)?;
        if nulls.is_some() {
            has_null_key.store(true, Ordering::Relaxed);
        }
        self.keep_unmatchable(batch, nulls.as_ref(), input_bytes, &mut scratch.mine)?;
        scratch.grouped.group(
            self.level.bits,
            &scratch.hashes,
            nulls.as_ref().filter(|_| plan.nulls_never_match()),
        );
        if self.gathers {
            self.gather_partitions(batch, scratch)?;
        } else {
            self.fragment_partitions(batch, input_bytes, scratch)?;
        }
        scratch.mine.free();
        Ok(())
    }

    /// Evaluates `batch`'s keys: puts its rows' hashes in `hashes` (the `stored`
    /// ones where the input carried them), adds the keys to the level's bounds and to
    /// the word bounds of a shared key index, and returns the keys' nulls.
    fn hash_keys_of(
        &self,
        batch: &RecordBatch,
        stored: Option<&[u64]>,
        hashes: &mut Vec<u64>,
    ) -> Result<Option<NullBuffer>> {
        let plan = self.plan();
        let n = batch.num_rows();
        let (columns, nulls) = plan.keys.evaluate_columns(batch, true)?;
        match stored {
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
        Ok(nulls)
    }

    /// Keeps aside the rows of `batch` (of `input_bytes`) whose key can never match,
    /// where the join outputs them; reserved in `mine` until they are handed over.
    fn keep_unmatchable(
        &self,
        batch: &RecordBatch,
        nulls: Option<&NullBuffer>,
        input_bytes: usize,
        mine: &mut MemoryReservation,
    ) -> Result<()> {
        let plan = self.plan();
        let never_matches =
            |row: usize| plan.nulls_never_match() && nulls.is_some_and(|n| n.is_null(row));
        if plan.resolved.keeps_unmatchable_build_rows()
            && nulls.is_some()
            && plan.nulls_never_match()
        {
            let rows = crate::batches::select_rows(0..batch.num_rows() as u32, never_matches);
            let kept = self.reserved_take(batch, &rows, input_bytes, mine)?;
            let bytes = batch_bytes(&kept);
            self.add(None, kept, Vec::new(), std::iter::empty(), bytes, mine)?;
        }
        Ok(())
    }

    /// Every column can be gathered: each partition gathers its rows of `batch`
    /// (grouped in `scratch`) in place, copied once.
    fn gather_partitions(&self, batch: &RecordBatch, scratch: &mut CollectScratch) -> Result<()> {
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
        for p in (0..fan_out).map(|i| (scratch.first_partition + i) % fan_out) {
            let rows = scratch.grouped.partition(p);
            if !rows.is_empty() {
                self.add_rows(p, &data, &fits, rows, &scratch.hashes, &mut scratch.pending)?;
            }
        }
        Ok(())
    }

    /// Some column cannot be gathered: each partition's rows of `batch` (of
    /// `input_bytes`, grouped in `scratch`) are taken into a fragment of their own.
    fn fragment_partitions(
        &self,
        batch: &RecordBatch,
        input_bytes: usize,
        scratch: &mut CollectScratch,
    ) -> Result<()> {
        let keep_hashes = self.plan().spills_hashes();
        let CollectScratch {
            mine,
            hashes,
            grouped,
            ..
        } = scratch;
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
        Ok(())
    }

    /// Gathers rows `rows` of `columns` (a build batch whose rows' hashes are
    /// `hashes`, and whose columns fit in 32 bits where `fits` says so) into
    /// partition `p`: in its spill files' narrow form once it has spilled. What the
    /// partition's buffers grow by is reserved first, spilling if needed, with no lock
    /// held; the rows are copied under the partition's own lock
    /// ([`Gathered`](super::collector::Gathered)), not the collector's.
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
        loop {
            let mut guard = lock(&self.state);
            let cell = Arc::clone(&guard.partitions[p].gathered);
            let spilled = guard.partitions[p].writer.is_some();
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
            let buffer = self.gather_buffer(&mut gathered, spilled)?;
            buffer.shape_for(fits);
            let after = buffer.capacity_after(&added);
            if let Some(short) = guard.account_growth(p, after, rows.len(), pending) {
                drop(gathered);
                drop(guard);
                self.reserve(pending, short)?;
                continue;
            }
            // A spilled partition's filter has these rows' hashes added below.
            let bloom = spilled.then(|| Arc::clone(&guard.partitions[p].bloom));
            // The rows are counted: copy them in with only the partition's gathered
            // rows locked.
            drop(guard);
            buffer.append(columns, rows, hash_column)?;
            // A spilled partition writes its rows a batch at a time, without the
            // collector's lock held: a work batch's fixed bytes (a buffer gathered 32
            // bits wide holds more rows), or a piece's bytes.
            let plan = self.plan();
            let full = spilled && buffer.is_full(plan.work_rows, plan.piece_bytes());
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
    }

    /// Whether `rows` gather in the spill files' form: the file schema (which is
    /// the spill schema itself when nothing but `Int64` columns narrow), halving
    /// where a column can.
    fn in_file_form(&self, rows: &GatherBuffer) -> bool {
        Arc::ptr_eq(rows.schema(), &self.file_schema)
            && (rows.is_halving() || !self.halvable.contains(&true))
    }

    /// The buffer a partition (`spilled` or not) gathers its rows in, created where
    /// it has none: once spilled (and emptied), in its files' schema.
    fn gather_buffer<'g>(
        &self,
        gathered: &'g mut MutexGuard<'_, Option<GatherBuffer>>,
        spilled: bool,
    ) -> Result<&'g mut GatherBuffer> {
        if self.file_differs
            && spilled
            && gathered
                .as_ref()
                .is_none_or(|g| g.is_empty() && !self.in_file_form(g))
        {
            **gathered = Some(GatherBuffer::halving(Arc::clone(&self.file_schema))?);
        }
        Ok(match &mut **gathered {
            Some(g) => g,
            slot => {
                let mut rows = GatherBuffer::new(Arc::clone(&self.held_schema))?;
                // One partition of a build whose rows are known: allocated
                // once (until it spills, `spill_partition`).
                if let Some(all) = self
                    .level
                    .build_rows
                    .filter(|_| self.level.bits.fan_out() == 1)
                {
                    rows.expect_rows(usize::try_from(all).unwrap_or(usize::MAX));
                }
                slot.insert(rows)
            }
        })
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
        // From the batch in flight to the partitions' rows, another consumer: grown
        // there before it is given back here, so the pool never sees it unreserved.
        state.reservation.grow(bytes);
        mine.shrink(bytes);
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
}

impl CollectorState {
    /// Accounts for partition `p`'s gathered rows growing to `after` bytes of
    /// capacity with `rows` more rows: what the worker reserved for it in `pending`
    /// first, the rest from the collector's reservation. Returns the bytes short,
    /// and accounts for nothing, when the pool does not grant the rest.
    fn account_growth(
        &mut self,
        p: usize,
        after: usize,
        rows: usize,
        pending: &mut MemoryReservation,
    ) -> Option<usize> {
        let part = &mut self.partitions[p];
        let growth = after.saturating_sub(part.bytes);
        let held = pending.size().min(growth);
        if held != growth && self.reservation.try_grow(growth - held).is_err() {
            return Some(growth - held);
        }
        self.reservation.merge(pending.split(held));
        pending.free();
        part.bytes += growth;
        part.rows += rows;
        part.total_rows += rows as u64;
        None
    }
}

/// The rows of a build batch partitioned at a time: more than the join's work rows
/// when memory allows (up to [`MAX_BUILD_PIECE_ROWS`], and a worker's piece at most a
/// sixteenth of the limit), because every piece leaves one fragment per partition
/// behind: larger pieces mean fewer, larger fragments — fewer IPC messages when they
/// are spilled, and fewer small blocks for the allocator to keep when they are freed
/// (a lower peak RSS where the input comes in large batches).
/// Returns the piece's rows and the bytes a piece may take; a piece of more rows than
/// [`JoinPlan::piece_rows_of`] that takes more (wide rows bunched together) is cut to
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
