//! Batches as the join moves them around: their size as the pool counts it, the
//! hash column that spill files carry, pieces of a bounded size, and the worker
//! threads that process them.
//!
//! A spilled row keeps its key hash unless its key is one word: spill files hold the
//! input's columns followed by [`HASH_COLUMN`] (`UInt64`), attached when a batch is
//! written and split off when it is read back, so a row with a wide or composite key
//! is hashed once whatever the recursion depth. A word key is hashed again instead
//! (see `JoinPlan::spills_hashes`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use arrow_buffer::ScalarBuffer;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

use std::sync::atomic::AtomicU64;

use spilljoin_spill::SpillWriter;

use crate::error::{JoinError, Result};

/// The name of the column that carries each row's key hash in spill files.
pub const HASH_COLUMN: &str = "__spilljoin_hash";

/// The rows of `rows` that `keep`, as take indices: [`select_from`] of a range, with
/// no validity built row by row (collecting a filtered iterator into a `UInt32Array`
/// appends to a null-buffer builder for every row and grows its buffer as it goes,
/// a cost that showed in the spilled pairs of anti joins).
pub(crate) fn select_rows(rows: std::ops::Range<u32>, keep: impl Fn(usize) -> bool) -> UInt32Array {
    UInt32Array::from(select_from(rows.len(), rows, keep))
}

/// The `len` rows of `rows` that `keep`, branch-free: each row is written, and
/// counted when kept, so that a keep that is true half the time (a bloom filter's
/// answer, say) costs no mispredicted branch per row.
pub(crate) fn select_from(
    len: usize,
    rows: impl IntoIterator<Item = u32>,
    keep: impl Fn(usize) -> bool,
) -> Vec<u32> {
    let mut selected = vec![0u32; len];
    let mut kept = 0;
    for r in rows {
        if let Some(slot) = selected.get_mut(kept) {
            *slot = r;
            kept += usize::from(keep(r as usize));
        }
    }
    selected.truncate(kept);
    selected
}

/// Bytes of a batch, as the pool counts them: the bytes its rows use, so that a slice
/// of a large batch counts as its share, not as the whole. A view column's rows use
/// their views and the bytes of theirs kept outside them (arrow's slice size counts
/// the views alone); a dictionary column's rows use their keys and at most a value
/// each ([`dictionary_bytes`]).
pub(crate) fn batch_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(column_bytes).sum::<usize>() + batch.num_columns() * 64
}

/// [`batch_bytes`] of one column.
fn column_bytes(c: &ArrayRef) -> usize {
    flat_column_bytes(c.as_ref()).unwrap_or_else(|| described_column_bytes(c))
}

/// [`column_bytes`] of a column of one of the types rows are made of (numbers,
/// booleans, strings and binaries, views of them), read off the array: the same
/// figure as [`described_column_bytes`] without `to_data`, which copies an array's
/// description (its type and a vector of its buffers), a cost per call that adds up:
/// it is called several times a batch on every column, and under a small limit
/// batches are small. `None` for the other types.
fn flat_column_bytes(c: &dyn Array) -> Option<usize> {
    let len = c.len();
    // (A description drops validity without a null.)
    let validity = if c.nulls().is_some_and(|n| n.null_count() > 0) {
        len.div_ceil(8)
    } else {
        0
    };
    let data_type = c.data_type();
    if let Some(width) = data_type.primitive_width() {
        return Some(len * width + validity);
    }
    let values = match data_type {
        DataType::Boolean => len.div_ceil(8),
        DataType::Utf8 => offset_bytes(c.as_string_opt::<i32>()?.offsets()),
        DataType::LargeUtf8 => offset_bytes(c.as_string_opt::<i64>()?.offsets()),
        DataType::Binary => offset_bytes(c.as_binary_opt::<i32>()?.offsets()),
        DataType::LargeBinary => offset_bytes(c.as_binary_opt::<i64>()?.offsets()),
        DataType::Utf8View => {
            let a = c.as_string_view_opt()?;
            len * 16 + view_buffer_bytes(a.views(), a.data_buffers())
        }
        DataType::BinaryView => {
            let a = c.as_binary_view_opt()?;
            len * 16 + view_buffer_bytes(a.views(), a.data_buffers())
        }
        _ => return None,
    };
    Some(values + validity)
}

/// The bytes of an offsets column's rows: their offsets and the values between them.
fn offset_bytes<O: arrow_array::OffsetSizeTrait>(offsets: &arrow_buffer::OffsetBuffer<O>) -> usize {
    let (first, last) = (offsets.first(), offsets.last());
    let values = match (first, last) {
        (Some(first), Some(last)) => last.as_usize().saturating_sub(first.as_usize()),
        _ => 0,
    };
    offsets.len() * std::mem::size_of::<O>() + values
}

/// [`column_bytes`] from the array's description, for every type.
fn described_column_bytes(c: &ArrayRef) -> usize {
    let data = c.to_data();
    let slice = |data: &arrow_data::ArrayData| {
        data.get_slice_memory_size()
            .unwrap_or_else(|_| c.get_array_memory_size())
    };
    match c.data_type() {
        DataType::Utf8View | DataType::BinaryView => {
            let views = data
                .buffers()
                .first()
                .map_or(&[][..], |b| b.typed_data::<u128>());
            let start = data.offset().min(views.len());
            let end = (data.offset() + data.len()).min(views.len());
            slice(&data)
                + view_buffer_bytes(
                    &views[start..end],
                    data.buffers().get(1..).unwrap_or_default(),
                )
        }
        DataType::Dictionary(..) => dictionary_bytes(c.as_any_dictionary()),
        _ => slice(&data),
    }
}

/// The bytes of a view column's rows kept outside its views (`views`, the rows'
/// own, and `buffers`, its data buffers): its long values' bytes, or its data
/// buffers whole when they hold little more than its rows' values. A column read
/// back from a spill file (`spilljoin_spill::VIEW_KEY`) points into a buffer of all
/// its values, short ones too, which live as long as it does; a slice or `take` of a
/// larger array shares buffers of many more rows, counted by its own share.
fn view_buffer_bytes(views: &[u128], buffers: &[arrow_buffer::Buffer]) -> usize {
    let (long, all) = views.iter().fold((0usize, 0usize), |(long, all), &v| {
        let len = v as u32;
        let outside = if len > arrow_data::MAX_INLINE_VIEW_LEN {
            len
        } else {
            0
        };
        (long + outside as usize, all + len as usize)
    });
    let held: usize = buffers.iter().map(|b| b.len()).sum();
    if held <= all + all / 8 + 4096 {
        held.max(long)
    } else {
        long
    }
}

/// The bytes of a dictionary column's rows: their keys, and their share of the
/// values by rows, the whole values at most (arrow's slice size counts the values
/// whole). A slice of a batch shares its dictionary with the batch's other slices:
/// counted whole in each piece being probed and in each output batch, a large
/// dictionary made a join of small pieces fail above its floor (found by the
/// `join_spill` fuzz target; its input is replayed by `tests/fuzz_replay.rs`).
fn dictionary_bytes(dictionary: &dyn arrow_array::AnyDictionaryArray) -> usize {
    let keys = dictionary.keys();
    let keys_bytes = flat_column_bytes(keys).unwrap_or_else(|| keys.get_array_memory_size());
    let values = dictionary.values();
    let values_bytes = column_bytes(values);
    let share = if values.len() > keys.len() {
        values_bytes.saturating_mul(keys.len()) / values.len()
    } else {
        values_bytes
    };
    keys_bytes + share
}

/// The schema of spill files of an input: its columns and [`HASH_COLUMN`].
pub(crate) fn with_hash_column(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(HASH_COLUMN, DataType::UInt64, false));
    Arc::new(Schema::new(fields))
}

/// Appends `hashes` to `batch` as [`HASH_COLUMN`], when `schema` (a spill schema) has
/// that column; otherwise the batch is written as it is.
pub(crate) fn attach_hashes(
    batch: &RecordBatch,
    hashes: Vec<u64>,
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    if schema.fields().len() == batch.num_columns() {
        return Ok(batch.clone());
    }
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(UInt64Array::from(hashes)));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Splits [`HASH_COLUMN`] off a batch read from a spill file.
pub(crate) fn detach_hashes(batch: &RecordBatch) -> Result<(RecordBatch, ScalarBuffer<u64>)> {
    let last = batch
        .num_columns()
        .checked_sub(1)
        .ok_or_else(|| JoinError::Internal("a spilled batch has no hash column".into()))?;
    let hashes = batch
        .column(last)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .filter(|h| h.null_count() == 0)
        .ok_or_else(|| JoinError::Internal("a spilled batch has a bad hash column".into()))?
        .values()
        .clone();
    let columns: Vec<usize> = (0..last).collect();
    Ok((batch.project(&columns)?, hashes))
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means another worker panicked; that panic is reported on its
    // own (JoinError::WorkerPanicked) and the join stops.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `worker` on `threads` threads (the calling thread one of them) and returns
/// the error that is the root cause when any failed: one that is not `Cancelled` nor
/// a writer's "failed earlier" over those (ties go to the calling thread's).
///
/// The calling thread works too: a spilled pair's level runs three or four phases of
/// workers, and a pair joined on one thread (side by side with others) then spawns
/// none.
pub(crate) fn run_workers(
    threads: usize,
    cancel: &AtomicBool,
    worker: impl Fn() -> Result<()> + Sync,
) -> Result<()> {
    let run = || {
        let result = catch_unwind(AssertUnwindSafe(&worker))
            .unwrap_or_else(|panic| Err(JoinError::WorkerPanicked(panic_message(&panic))));
        if result.is_err() {
            cancel.store(true, Ordering::Relaxed);
        }
        result
    };
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..threads.max(1)).map(|_| scope.spawn(run)).collect();
        let mine = run();
        std::iter::once(mine)
            .chain(handles.into_iter().map(|h| {
                // (`run` catches the worker's panics: only a panic outside it, in
                // the thread's own start-up or teardown, ends up here.)
                h.join().unwrap_or_else(|panic| {
                    cancel.store(true, Ordering::Relaxed);
                    Err(JoinError::WorkerPanicked(panic_message(&panic)))
                })
            }))
            .collect()
    });
    // Prefer the root cause over what other workers saw because of it: `Cancelled`,
    // and a spill writer that "failed earlier" (another worker's write failed).
    let rank = |e: &JoinError| match e {
        JoinError::Cancelled => 0,
        JoinError::Spill(spilljoin_spill::SpillError::WriterFailed { .. }) => 1,
        _ => 2,
    };
    let mut first: Option<JoinError> = None;
    for result in results {
        if let Err(e) = result {
            if first.as_ref().is_none_or(|f| rank(&e) > rank(f)) {
                first = Some(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// A batch in pieces of at most `rows` rows (zero-copy slices), with the matching
/// slices of its stored hashes: a caller's huge batch is reserved a piece at a time.
pub(crate) fn pieces<'a>(
    batch: &'a RecordBatch,
    hashes: Option<&'a ScalarBuffer<u64>>,
    rows: usize,
) -> impl Iterator<Item = (RecordBatch, Option<ScalarBuffer<u64>>)> + 'a {
    let n = batch.num_rows();
    let rows = rows.max(1);
    // An empty batch still counts as one (empty) piece.
    (0..n.max(1)).step_by(rows).map(move |offset| {
        let len = rows.min(n - offset.min(n));
        (
            batch.slice(offset.min(n), len),
            hashes.map(|h| h.slice(offset.min(n), len)),
        )
    })
}

/// Writes `batch` to a spill file and adds its rows, the bytes written and one batch
/// to `counters` (the build's or the probe's).
///
/// # Errors
/// The writer's error (disk full, quota reached).
pub(crate) fn write_counted(
    writer: &mut SpillWriter,
    batch: &RecordBatch,
    counters: &SpillCounters<'_>,
) -> Result<()> {
    let before = writer.bytes_written();
    writer.write(batch)?;
    counters
        .bytes
        .fetch_add(writer.bytes_written() - before, Ordering::Relaxed);
    counters
        .rows
        .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
    counters.batches.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// What writes to one side's spill files add to: its rows, bytes and batches
/// ([`crate::context::SharedMetrics::spill_counters`]).
pub(crate) struct SpillCounters<'a> {
    pub rows: &'a AtomicU64,
    pub bytes: &'a AtomicU64,
    pub batches: &'a AtomicU64,
}

/// Several streams of one input, read by many workers.
///
/// Each worker starts on its own stream (round robin) and pulls one batch at a time
/// under that stream's lock; when its stream ends it moves on to the next one that has
/// not, so workers share streams when there are fewer streams than workers. With one
/// stream per worker (the CLI splits Parquet row groups that way) decoding runs in
/// parallel; with a single stream, decoding is serialized but probing still uses
/// every worker.
pub(crate) struct InputStreams<I> {
    streams: Vec<Mutex<Option<I>>>,
    next_start: std::sync::atomic::AtomicUsize,
}

impl<I: Iterator<Item = Result<RecordBatch, ArrowError>>> InputStreams<I> {
    pub fn new(streams: Vec<I>) -> Self {
        Self {
            streams: streams.into_iter().map(|s| Mutex::new(Some(s))).collect(),
            next_start: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The next batch for a worker whose current stream is `current` (start with
    /// `None`); `None` when every stream has ended.
    pub fn next(&self, current: &mut Option<usize>) -> Option<Result<RecordBatch, ArrowError>> {
        let n = self.streams.len();
        if n == 0 {
            return None;
        }
        let mut index =
            *current.get_or_insert_with(|| self.next_start.fetch_add(1, Ordering::Relaxed) % n);
        for _ in 0..n {
            let mut slot = self.streams[index]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(stream) = slot.as_mut() {
                match stream.next() {
                    Some(item) => {
                        *current = Some(index);
                        return Some(item);
                    }
                    None => *slot = None,
                }
            }
            index = (index + 1) % n;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice of a dictionary column counts its keys and its rows' share of the
    /// values, not the whole dictionary; a dictionary no longer than its rows counts
    /// whole.
    #[test]
    fn a_slice_of_a_dictionary_column_counts_its_share_of_the_values() {
        use arrow_array::types::Int32Type;
        use arrow_array::DictionaryArray;
        let slice_bytes = |a: &dyn Array| a.to_data().get_slice_memory_size().unwrap();
        let values: Vec<String> = (0..100_000).map(|i| format!("value-{i:08}")).collect();
        let big: DictionaryArray<Int32Type> = values.iter().map(String::as_str).collect();
        let big_values = slice_bytes(big.values().as_ref());
        assert!(big_values > 100_000 * 14);
        let batch = RecordBatch::try_from_iter([("k", Arc::new(big) as ArrayRef)]).unwrap();
        let ten = batch.slice(500, 10);
        assert_eq!(batch_bytes(&ten), 10 * 4 + big_values * 10 / 100_000 + 64);
        let small: DictionaryArray<Int32Type> = (0..1000).map(|i| ["a", "b"][i % 2]).collect();
        let small_values = slice_bytes(small.values().as_ref());
        let batch = RecordBatch::try_from_iter([("k", Arc::new(small) as ArrayRef)]).unwrap();
        assert_eq!(batch_bytes(&batch.slice(0, 10)), 10 * 4 + small_values + 64);
    }

    /// The figure read off an array is the one from its description, for every type
    /// read off, sliced or not, with nulls or without.
    #[test]
    fn column_bytes_read_off_the_array_are_those_of_its_description() {
        use arrow_array::builder::{BinaryViewBuilder, StringViewBuilder};
        use arrow_array::{
            BinaryArray, BooleanArray, Decimal128Array, Float64Array, Int16Array, LargeBinaryArray,
            LargeStringArray, StringArray, TimestampMicrosecondArray,
        };
        let text = |i: usize| (i % 7 != 3).then(|| "x".repeat(i % 40));
        let mut views = StringViewBuilder::new();
        let mut binary_views = BinaryViewBuilder::new();
        for i in 0..300 {
            views.append_option(text(i));
            binary_views.append_value(vec![i as u8; i % 30]);
        }
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(Int16Array::from_iter(
                (0..300).map(|i| (i % 5 != 0).then_some(i as i16)),
            )),
            Arc::new(Float64Array::from_iter_values((0..300).map(f64::from))),
            Arc::new(Decimal128Array::from_iter_values(0..300)),
            Arc::new(TimestampMicrosecondArray::from_iter_values(0..300)),
            Arc::new(BooleanArray::from_iter(
                (0..300).map(|i| (i % 3 != 0).then_some(i % 2 == 0)),
            )),
            Arc::new(StringArray::from_iter((0..300).map(text))),
            Arc::new(LargeStringArray::from_iter((0..300).map(text))),
            Arc::new(BinaryArray::from_iter_values(
                (0..300).map(|i| vec![1u8; i % 9]),
            )),
            Arc::new(LargeBinaryArray::from_iter_values(
                (0..300).map(|i| vec![1u8; i % 9]),
            )),
            Arc::new(views.finish()),
            Arc::new(binary_views.finish()),
        ];
        for array in &arrays {
            for (offset, len) in [(0, 300), (0, 0), (17, 100), (299, 1), (150, 150)] {
                let slice = array.slice(offset, len);
                assert_eq!(
                    flat_column_bytes(slice.as_ref()),
                    Some(described_column_bytes(&slice)),
                    "{} [{offset}, +{len})",
                    array.data_type()
                );
            }
        }
    }

    #[test]
    fn selection_keeps_exactly_the_rows_a_filter_would() {
        // Patterns: none, all, alternate, runs, and a pseudo-random half.
        let patterns: Vec<Box<dyn Fn(usize) -> bool>> = vec![
            Box::new(|_| false),
            Box::new(|_| true),
            Box::new(|r| r % 2 == 1),
            Box::new(|r| (r / 7) % 3 == 0),
            Box::new(|r| (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63 == 1),
        ];
        for keep in &patterns {
            for (start, end) in [(0u32, 0u32), (0, 1), (5, 6), (3, 1000), (0, 8192)] {
                let expected: Vec<u32> = (start..end).filter(|&r| keep(r as usize)).collect();
                let rows = select_rows(start..end, keep);
                assert_eq!(rows.values().to_vec(), expected);
                assert_eq!(rows.null_count(), 0);
                // From a list of rows rather than a range.
                let listed: Vec<u32> = (start..end).rev().step_by(3).collect();
                let expected: Vec<u32> = listed
                    .iter()
                    .copied()
                    .filter(|&r| keep(r as usize))
                    .collect();
                assert_eq!(
                    select_from(listed.len(), listed.iter().copied(), keep),
                    expected
                );
            }
        }
    }
}
