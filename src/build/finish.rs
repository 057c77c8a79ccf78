//! The end of the build input: forced spills (tests), the probe's headroom, which
//! partitions keep a table in memory (spilling the largest while the tables do not
//! fit), and finishing every partition — its table built, or its file closed. Its own
//! file because it runs once, after the workers have collected everything, and
//! decides by memory figures that collecting never needs.
//!
//! ```text
//!  force_spill ─► shrink_bloom_reserve ─► reserve_probe_headroom
//!   ─► reserve_finish_transients (threads) ─► plan_tables (spilling while short)
//!   ─► shared_key_index? ─► finish_unmatchable ─► finish_partitions (workers)
//!   ─► share_key_index ─► BuiltSide
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use spilljoin_memory::{MemoryConsumer, MemoryReservation};

use super::built::{BuiltSide, Partition, SpilledPartition, Unmatchable};
use super::collector::{BuildCollector, PartitionBuffer};
use super::finish_partition::{finish_partition, keys_in_place};
use super::shared_index::share_key_index;
use super::write_outside_lock::finish_shared;
use crate::batches::{lock, run_workers};
use crate::error::{JoinError, Result};
use crate::plan::JoinPlan;
use crate::table::ChainedTable;

impl BuildCollector<'_> {
    /// Ends the input: decides which partitions stay in memory, builds their tables,
    /// closes the spill files.
    pub(super) fn finish(&self, num_rows: u64, has_null_key: bool) -> Result<BuiltSide> {
        self.force_spill()?;
        self.shrink_bloom_reserve();
        let headroom = self.reserve_probe_headroom()?;
        let (finish_threads, transients) = self.reserve_finish_transients()?;
        let (mut tables, planned) = self.plan_tables()?;
        // One key index for all partitions, when they all stay in memory and their
        // keys are dense words: reserved on top of the tables' buckets it replaces.
        // No partition spills any more: the filters' memory not taken goes back (the
        // shared key index below is only built when none spilled).
        lock(&self.state).bloom_reserve.free();
        let shared = self.shared_key_index(&planned, has_null_key, &mut tables);
        drop(headroom);

        let (buffers, unmatchable, mut reservation) = self.take_buffers();
        reservation.merge(tables.take());
        let unmatchable = self.finish_unmatchable(unmatchable, &mut reservation)?;
        let reservation = Mutex::new(reservation);
        let mut partitions =
            self.finish_partitions(buffers, &reservation, finish_threads, shared.is_none())?;
        drop(transients);
        if let Some((min, span)) = shared {
            share_key_index(&mut partitions, min, span, self.plan().threads);
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

    /// Spills the level's forced share of its partitions that hold rows: tests can
    /// force the spill path on any input (level 0, and deeper levels down to a set
    /// depth: `ForceSpill`).
    fn force_spill(&self) -> Result<()> {
        let fan_out = self.level.bits.fan_out();
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
        Ok(())
    }

    /// From here on only partitions still in memory can spill, each taking one
    /// filter: the filters' memory set aside for more goes back.
    fn shrink_bloom_reserve(&self) {
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

    /// Leaves room for the probe, held while the tables are planned: what each probe
    /// worker reserves (its buffers, a batch in flight, and the output and spill
    /// pieces it makes from it), and the output batches waiting for the caller.
    fn reserve_probe_headroom(&self) -> Result<MemoryReservation> {
        let plan = self.plan();
        let largest_batch_bytes = self.largest_batch_bytes.load(Ordering::Relaxed);
        // And a write buffer for each partition spilled so far, whose probe rows are
        // buffered before they are written: without it the probe's workers find the
        // memory full at every other batch and write every buffer out half empty, a
        // few times as many writes of a fraction of the rows. At most a quarter of
        // the limit.
        let spilled = lock(&self.state)
            .partitions
            .iter()
            .filter(|p| p.writer.is_some())
            .count();
        let limit = plan.pool.limit().bytes();
        let buffers = (spilled * plan.work_rows * probe_spill_row_bytes(plan)).min(limit / 4);
        let workers = plan.probe_shape().workers_headroom(
            largest_batch_bytes,
            largest_batch_bytes / plan.work_rows.max(1),
            probe_spill_row_bytes(plan),
        );
        // The probe's working set, not build rows that could spill: a pool that
        // shares among spilling consumers (DataFusion's fair pool) serves it first.
        let mut headroom_reservation =
            MemoryConsumer::new("spilljoin probe headroom").register(&plan.pool);
        // The buffers are worth spilling build rows for, not failing for: near the
        // floor, where everything is spilled and still does not leave room for them,
        // the workers' part alone is reserved. (Only a refusal of the memory falls
        // back: a spill write that failed on the way ends the join, with its cause.)
        if buffers > 0 {
            let all = (workers + buffers).min(limit / 2);
            match self.reserve(&mut headroom_reservation, all) {
                Ok(()) => return Ok(headroom_reservation),
                Err(JoinError::ResourcesExhausted { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.reserve(&mut headroom_reservation, workers)?;
        Ok(headroom_reservation)
    }

    /// Reserves what finishing partitions needs only while they are finished, and
    /// returns how many are finished at a time with that reservation.
    ///
    /// Concatenating a partition's fragments needs a second copy of it while both
    /// exist, and a word key's table its rows' hashes again: both transient.
    /// Partitions are finished `threads` at a time when there is room for the
    /// largest `threads` of these; otherwise one at a time, with room for one.
    fn reserve_finish_transients(&self) -> Result<(usize, MemoryReservation)> {
        let plan = self.plan();
        // Working memory of the finish, which cannot be spilled (see the headroom).
        let mut concat_reservation =
            MemoryConsumer::new("spilljoin build finish").register(&plan.pool);
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
        Ok((finish_threads, concat_reservation))
    }

    /// Reserves the tables of the in-memory partitions, smallest first, spilling the
    /// largest remaining partitions while they do not fit. Returns the tables'
    /// reservation and which partitions got one.
    fn plan_tables(&self) -> Result<(MemoryReservation, Vec<bool>)> {
        let plan = self.plan();
        let fan_out = self.level.bits.fan_out();
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
        Ok((tables, planned))
    }

    /// The partitions' buffers, the unmatchable rows' buffer and the reservation that
    /// holds them, taken out of the collector's state: no worker adds to them now.
    fn take_buffers(&self) -> (Vec<PartitionBuffer>, PartitionBuffer, MemoryReservation) {
        let mut state = lock(&self.state);
        (
            std::mem::take(&mut state.partitions),
            std::mem::take(&mut state.unmatchable),
            state.reservation.take(),
        )
    }

    /// Finishes every partition, `threads` at a time ([`finish_one`](Self::finish_one)),
    /// their memory held in `reservation`.
    fn finish_partitions(
        &self,
        buffers: Vec<PartitionBuffer>,
        reservation: &Mutex<MemoryReservation>,
        threads: usize,
        index: bool,
    ) -> Result<Vec<Partition>> {
        let fan_out = self.level.bits.fan_out();
        let slots: Vec<Mutex<Option<PartitionBuffer>>> =
            buffers.into_iter().map(|b| Mutex::new(Some(b))).collect();
        let built: Vec<Mutex<Option<Partition>>> = (0..fan_out).map(|_| Mutex::default()).collect();
        let next = AtomicUsize::new(0);
        run_workers(threads, self.ctx.cancel, || loop {
            let p = next.fetch_add(1, Ordering::Relaxed);
            if p >= fan_out {
                return Ok(());
            }
            if self.ctx.cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            let Some(buffer) = lock(&slots[p]).take() else {
                continue;
            };
            let partition = self.finish_one(buffer, reservation, index)?;
            *lock(&built[p]) = Some(partition);
        })?;
        built
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .ok_or_else(|| JoinError::Internal("a partition was not built".into()))
            })
            .collect()
    }

    /// Finishes one partition: a spilled one has its last rows written and its file
    /// closed; an in-memory one gets its table ([`finish_partition`]; an empty one
    /// where `index` is false, for the shared key index to replace).
    fn finish_one(
        &self,
        mut buffer: PartitionBuffer,
        reservation: &Mutex<MemoryReservation>,
        index: bool,
    ) -> Result<Partition> {
        let plan = self.plan();
        if buffer.writer.is_none() {
            let held = if buffer.total_rows > 0 {
                buffer.bytes + finish_bytes(plan, &buffer)
            } else {
                0
            };
            let part = finish_partition(plan, buffer, held, reservation, index)?;
            return Ok(Partition::InMemory(part));
        }
        self.flush(&mut buffer, &mut lock(reservation))?;
        let file = buffer
            .writer
            .take()
            .map(finish_shared)
            .transpose()?
            .ok_or_else(|| JoinError::Internal("lost a spill writer".into()))?;
        Ok(Partition::Spilled(SpilledPartition {
            file,
            bloom: lock(&buffer.bloom).take(),
        }))
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

/// The bytes a probe row takes in a probe spill buffer: the fixed widths of its spill
/// files' schema (decimals narrowed), or a guess of 32 where some column is
/// variable-width.
fn probe_spill_row_bytes(plan: &JoinPlan) -> usize {
    crate::gather::fixed_widths(&spilljoin_spill::file_schema(&plan.spill_schema(false)))
        .map_or(32, |widths| widths.iter().sum::<usize>())
}
