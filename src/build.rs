//! The build phase: the build input, radix-partitioned into hash tables.
//!
//! ```text
//!  build batches ─► keys ─► hash ─► partition (high bits) ─► per-partition fragments
//!   (N threads pull from one input)                            each with its hashes,
//!                                                              reserved from the pool
//!  end of input ─► per partition (N threads): concatenate fragments into one batch,
//!                  encode keys, build the chained table ─► BuiltSide (immutable)
//! ```
//!
//! Rows whose key can never match (a null key under SQL equality) are not hashed into
//! any partition: joins that output unmatched build rows keep them aside, the others
//! drop them. The result, [`BuiltSide`], is never mutated again: everything a probe
//! changes (visited bits, null flags) lives in [`crate::probe::ProbeState`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::ArrowError;
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use spilljoin_memory::{MemoryConsumer, MemoryReservation};

use crate::error::{JoinError, Result};
use crate::hash::hash_keys;
use crate::join::InputStreams;
use crate::keys::KeyRepr;
use crate::partition::PartitionedRows;
use crate::plan::JoinPlan;
use crate::table::{ChainedTable, MAX_TABLE_ROWS};

/// One partition of the build side, ready to probe.
#[derive(Debug)]
pub(crate) struct BuiltPartition {
    /// The partition's rows.
    pub batch: RecordBatch,
    /// Each row's key hash.
    pub hashes: Vec<u64>,
    /// Each row's key, for equality checks.
    pub keys: KeyRepr,
    /// The hash table over the rows.
    pub table: ChainedTable,
}

/// The build side, immutable once built.
#[derive(Debug)]
pub(crate) struct BuiltSide {
    /// The partitions, indexed by [`crate::partition::HashBits::partition_of`].
    pub partitions: Vec<BuiltPartition>,
    /// Rows whose key can never match, kept for joins that output unmatched build rows.
    pub unmatchable: Vec<RecordBatch>,
    /// Every build input row, the unmatchable ones included.
    pub num_rows: u64,
    /// Whether some build row has a null key.
    pub has_null_key: bool,
    /// Everything above, reserved.
    _reservation: MemoryReservation,
}

/// A partition's rows while the build input is still coming.
#[derive(Debug, Default)]
struct PartitionBuffer {
    fragments: Vec<(RecordBatch, Vec<u64>)>,
    rows: usize,
}

/// Bytes of a batch, as the pool counts them.
pub(crate) fn batch_bytes(batch: &RecordBatch) -> usize {
    batch.get_array_memory_size()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means another worker panicked; that panic is reported on its
    // own (JoinError::WorkerPanicked), and the data is only read to be dropped.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `worker` on `threads` threads and returns the first error.
pub(crate) fn run_workers(
    threads: usize,
    cancel: &AtomicBool,
    worker: impl Fn() -> Result<()> + Sync,
) -> Result<()> {
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let result = worker();
                    if result.is_err() {
                        cancel.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|panic| {
                    cancel.store(true, Ordering::Relaxed);
                    Err(JoinError::WorkerPanicked(panic_message(&panic)))
                })
            })
            .collect()
    });
    // Prefer a real error over the `Cancelled` that other workers saw because of it.
    let mut first = None;
    for result in results {
        if let Err(e) = result {
            match (&first, &e) {
                (None, _) | (Some(JoinError::Cancelled), _) => first = Some(e),
                _ => {}
            }
        }
    }
    first.map_or(Ok(()), Err)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Reads the whole build input into partitions and builds their tables.
pub(crate) fn build_side<I>(
    plan: &JoinPlan,
    input: Vec<I>,
    cancel: &AtomicBool,
) -> Result<BuiltSide>
where
    I: Iterator<Item = Result<RecordBatch, ArrowError>> + Send,
{
    let fan_out = plan.bits.fan_out();
    let base = MemoryConsumer::new("spilljoin build side")
        .with_can_spill(true)
        .register(&plan.pool);
    let input = InputStreams::new(input);
    let buffers: Vec<Mutex<PartitionBuffer>> = (0..fan_out).map(|_| Mutex::default()).collect();
    let unmatchable = Mutex::new(Vec::new());
    let reservation = Mutex::new(base.new_empty());
    let num_rows = AtomicU64::new(0);
    let has_null_key = AtomicBool::new(false);
    let keep_unmatchable = plan.resolved.keeps_unmatchable_build_rows();

    run_workers(plan.threads, cancel, || {
        let mut mine = base.new_empty();
        let mut current = None;
        let mut hashes = Vec::new();
        let mut grouped = PartitionedRows::default();
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(JoinError::Cancelled);
            }
            let batch = match input.next(&mut current) {
                None => return Ok(()),
                Some(Err(source)) => {
                    return Err(JoinError::Input {
                        side: plan.build_side,
                        source,
                    })
                }
                Some(Ok(batch)) => batch,
            };
            plan.check_batch(&batch, true)?;
            let n = batch.num_rows();
            num_rows.fetch_add(n as u64, Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let input_bytes = batch_bytes(&batch);
            mine.try_grow(input_bytes)?;
            let keys = plan.keys.evaluate(&batch, true)?;
            hash_keys(&keys.columns, n, &mut hashes)?;
            if keys.nulls.is_some() {
                has_null_key.store(true, Ordering::Relaxed);
            }
            let never_matches = |row: usize| plan.nulls_never_match() && keys.is_null(row);
            if keep_unmatchable && keys.nulls.is_some() && plan.nulls_never_match() {
                let rows: UInt32Array = (0..n as u32)
                    .filter(|&r| never_matches(r as usize))
                    .collect();
                let kept = reserved_take(&batch, &rows, input_bytes, &mut mine)?;
                lock(&reservation).merge(mine.split(batch_bytes(&kept)));
                lock(&unmatchable).push(kept);
            }
            grouped.group(plan.bits, &hashes, |row| !never_matches(row));
            for (p, buffer) in buffers.iter().enumerate() {
                let rows = grouped.partition(p);
                if rows.is_empty() {
                    continue;
                }
                let indices = UInt32Array::from(rows.to_vec());
                let fragment = reserved_take(&batch, &indices, input_bytes, &mut mine)?;
                let fragment_hashes: Vec<u64> = rows.iter().map(|&r| hashes[r as usize]).collect();
                mine.try_grow(fragment_hashes.capacity() * 8)?;
                let bytes = batch_bytes(&fragment) + fragment_hashes.capacity() * 8;
                lock(&reservation).merge(mine.split(bytes));
                let mut buffer = lock(buffer);
                buffer.rows += rows.len();
                buffer.fragments.push((fragment, fragment_hashes));
            }
            drop(keys);
            mine.shrink(input_bytes);
        }
    })?;

    let mut reservation = reservation.into_inner().unwrap_or_else(|p| p.into_inner());
    let built: Vec<Mutex<Option<BuiltPartition>>> =
        (0..fan_out).map(|_| Mutex::default()).collect();
    let next_partition = AtomicUsize::new(0);
    let shared_reservation = Mutex::new(&mut reservation);
    run_workers(plan.threads, cancel, || loop {
        let p = next_partition.fetch_add(1, Ordering::Relaxed);
        if p >= fan_out {
            return Ok(());
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(JoinError::Cancelled);
        }
        let buffer = std::mem::take(&mut *lock(&buffers[p]));
        let mut mine = base.new_empty();
        let partition = finish_partition(plan, buffer, &mut mine, &shared_reservation)?;
        lock(&shared_reservation).merge(mine.take());
        *lock(&built[p]) = Some(partition);
    })?;
    let partitions = built
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .ok_or_else(|| JoinError::InvalidJoin("internal: a partition was not built".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(BuiltSide {
        partitions,
        unmatchable: unmatchable.into_inner().unwrap_or_else(|p| p.into_inner()),
        num_rows: num_rows.into_inner(),
        has_null_key: has_null_key.into_inner(),
        _reservation: reservation,
    })
}

/// `take` of some rows of `batch`, reserved first (by the rows' share of the batch's
/// bytes) and then corrected to the bytes it really holds.
fn reserved_take(
    batch: &RecordBatch,
    rows: &UInt32Array,
    batch_bytes_total: usize,
    reservation: &mut MemoryReservation,
) -> Result<RecordBatch> {
    let before = reservation.size();
    let estimate = batch_bytes_total * rows.len() / batch.num_rows().max(1) + 64;
    reservation.try_grow(estimate)?;
    let taken = take_record_batch(batch, rows)?;
    reservation.try_resize(before + batch_bytes(&taken))?;
    Ok(taken)
}

/// Concatenates a partition's fragments and builds its table. Memory for the new
/// buffers is reserved in `mine` before they are made; the fragments' bytes are given
/// back (from the shared reservation that holds them) once they are dropped.
fn finish_partition(
    plan: &JoinPlan,
    buffer: PartitionBuffer,
    mine: &mut MemoryReservation,
    shared: &Mutex<&mut MemoryReservation>,
) -> Result<BuiltPartition> {
    if buffer.rows > MAX_TABLE_ROWS {
        return Err(JoinError::InvalidJoin(format!(
            "a build partition has {} rows; at most {MAX_TABLE_ROWS} fit one table",
            buffer.rows
        )));
    }
    let fragment_bytes: usize = buffer
        .fragments
        .iter()
        .map(|(b, h)| batch_bytes(b) + h.capacity() * 8)
        .sum();
    let (batch, hashes) = match buffer.fragments.len() {
        0 => (
            RecordBatch::new_empty(Arc::clone(&plan.build_schema)),
            Vec::new(),
        ),
        1 => buffer.fragments.into_iter().next().unwrap_or_else(|| {
            (
                RecordBatch::new_empty(Arc::clone(&plan.build_schema)),
                Vec::new(),
            )
        }),
        _ => {
            mine.try_grow(fragment_bytes + buffer.rows * 8)?;
            let batch =
                concat_batches(&plan.build_schema, buffer.fragments.iter().map(|(b, _)| b))?;
            let mut hashes = Vec::with_capacity(buffer.rows);
            for (_, h) in &buffer.fragments {
                hashes.extend_from_slice(h);
            }
            drop(buffer.fragments);
            lock(shared).shrink(fragment_bytes);
            mine.try_resize(batch_bytes(&batch) + hashes.capacity() * 8)?;
            (batch, hashes)
        }
    };
    let key_columns = plan
        .keys
        .build_columns
        .iter()
        .map(|&i| crate::keys::normalize(batch.column(i)))
        .collect::<Result<Vec<_>>>()?;
    let before = mine.size();
    mine.try_grow(KeyRepr::estimate_size(&key_columns, batch.num_rows()))?;
    let keys = plan.keys.keys_of(key_columns)?;
    mine.try_resize(before + keys.repr.size())?;
    mine.try_grow(ChainedTable::size_for(hashes.len()))?;
    let table = ChainedTable::build(&hashes, |_| true);
    Ok(BuiltPartition {
        batch,
        hashes,
        keys: keys.repr,
        table,
    })
}
