//! The spill trigger and the victim choice: a failed reservation
//! ([`BuildCollector::reserve`]) is the only reason to spill, and what it frees is
//! chosen in [`BuildCollector::spill_something`]. Also how a partition starts to
//! spill (its file and bloom filter) and how buffered rows are written to a file.
//! Its own file because these decide when and what the build writes; collecting and
//! finishing only call `reserve`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::RecordBatch;
use arrow_buffer::ScalarBuffer;
use arrow_select::concat::concat_batches;
use spilljoin_memory::MemoryReservation;
use spilljoin_spill::SpillWriter;

use super::collector::{BuildCollector, CollectorState, PartitionBuffer};
use super::write_outside_lock::Unwritten;
use crate::batches::{attach_hashes, batch_bytes, lock, write_counted};
use crate::bloom::Bloom;
use crate::error::{JoinError, Result};
use crate::gather::fixed_widths;

impl BuildCollector<'_> {
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
    /// shortage, they were written a few KiB at a time while a partition stayed in
    /// memory — one IPC message and one system call each.
    pub(super) fn spill_something(&self, keep: Option<&[bool]>) -> Result<bool> {
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
            Some(_) if keep.is_none() && state.writes.victims_under_way() => {
                self.wait_for_a_write(guard)
            }
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
            _ if state.writes.under_way() => self.wait_for_a_write(guard),
            // Nothing left to spill but the filters' memory set aside (statistics
            // that promised more rows than came): better used than refused.
            _ if state.bloom_reserve.size() > 0 => {
                state.bloom_reserve.free();
                Ok(true)
            }
            _ => Ok(false),
        }
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
    /// other workers waiting for it.
    pub(super) fn spill_partition(
        &self,
        state: &mut CollectorState,
        p: usize,
    ) -> Result<Option<Unwritten<'_>>> {
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
        let total_rows = part.total_rows;
        let bloom = self.new_bloom(state, total_rows);
        // (From now on a gathering buffer holds a batch at a time, not all the rows a
        // one-partition build expected to keep, `Level::build_rows`:
        // `PartitionBuffer::take_unwritten` sees to it.)
        let unwritten = state.take_unwritten(p, self.plan().work_rows, &self.writes_out)?;
        let Some(part) = state.partitions.get_mut(p) else {
            return Ok(unwritten);
        };
        if unwritten.is_none() {
            // No rows, perhaps an emptied buffer's capacity: nothing to write.
            state.reservation.shrink(std::mem::take(&mut part.bytes));
        }
        if let Some(mut bloom) = bloom {
            if let Some(u) = &unwritten {
                if let Err(e) = self.fill_bloom(&mut bloom, u) {
                    // The rows taken out will not be written.
                    if let Some(u) = unwritten {
                        self.abandon_write(&mut state.writes, u);
                    }
                    return Err(e);
                }
            }
            *lock(&part.bloom) = Some(bloom);
        }
        Ok(unwritten.map(|u| state.writes.mark_victim(u)))
    }

    /// The bloom filter of a partition that starts to spill holding `total_rows` rows
    /// so far, its memory taken from the filters' share set aside or else reserved;
    /// `None` when filters are off or the pool refuses it.
    fn new_bloom(&self, state: &mut CollectorState, total_rows: u64) -> Option<Bloom> {
        // The filter is sized for the partition's expected rows where the level's are
        // known; otherwise for those seen so far times the input still to come, which
        // is unknown: assume the partition doubles.
        let bloom_bytes = match self.blooms {
            Some(sizing) => sizing.bytes,
            None => Bloom::bytes_for(
                usize::try_from(total_rows)
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
        debug_assert!(bloom.as_ref().is_none_or(|b| b.size() == bloom_bytes));
        bloom
    }

    /// Adds the hashes of rows taken out of a partition that is spilling to its bloom
    /// filter. Word-key rows keep no hashes: their keys are hashed again (a transient
    /// buffer of at most a batch's rows).
    fn fill_bloom(&self, bloom: &mut Bloom, u: &Unwritten<'_>) -> Result<()> {
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
    pub(super) fn flush(
        &self,
        part: &mut PartitionBuffer,
        reservation: &mut MemoryReservation,
    ) -> Result<()> {
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
    pub(super) fn write_rows(
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
            // (A slice's view columns are written with only its rows' bytes: the
            // writer stores them as offsets.)
            for start in (0..batch.num_rows()).step_by(slice_rows.max(1)) {
                let len = slice_rows.max(1).min(batch.num_rows() - start);
                write(&batch.slice(start, len))?;
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
    pub(super) fn spill_unmatchable(
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
}

/// `batch` in zero-copy slices of at most `rows` rows.
fn slices(batch: &RecordBatch, rows: usize) -> impl Iterator<Item = RecordBatch> + '_ {
    let rows = rows.max(1);
    (0..batch.num_rows())
        .step_by(rows)
        .map(move |start| batch.slice(start, rows.min(batch.num_rows() - start)))
}

/// The values of a spill-schema batch's hash column (its last).
pub(super) fn hash_column(batch: &RecordBatch) -> Result<&ScalarBuffer<u64>> {
    batch
        .columns()
        .last()
        .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        .map(|a| a.values())
        .ok_or_else(|| JoinError::Internal("a batch without its hash column".into()))
}
