//! Spilled rows with variable-width payloads cost their own bytes on disk, at every
//! level, however the input arrays share their buffers.
//!
//! A slice of a batch, or a `take` from it, keeps every data buffer of the batch it
//! came from: a view array of 100 rows can reference megabytes. Written as it is, each
//! spilled batch carries all of those bytes again (TPC-H SF1 `lineitem ⋈ orders` with
//! every column once wrote 1.8 KB a build row for rows of under 200 bytes). Here the
//! bytes written a row are checked against the compact Arrow bytes of the input's rows
//! (offsets or views, the value bytes views do not inline, keys of dictionaries), for
//! every payload layout, with inputs sliced and taken from larger batches, with
//! forced spilling at level 0 and below, and the answers against the reference join.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;

use arrow_array::builder::{BinaryViewBuilder, StringViewBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, DictionaryArray, Int64Array, LargeStringArray, RecordBatch,
    StringArray, UInt32Array,
};
use arrow_schema::{ArrowError, DataType};
use common::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool, TrackConsumersPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinMetrics, JoinType, NullEquality};

/// Rows a side.
const ROWS: usize = 4000;

/// One side as one batch: key `{p}k` (nullable, duplicates), `{p}v` (the reference's
/// filter column) and a payload column of every variable-width layout.
fn side(rng: &mut StdRng, p: &str) -> RecordBatch {
    let n = ROWS;
    let k: Int64Array = (0..n)
        .map(|_| (!rng.random_bool(0.03)).then(|| rng.random_range(0..3000)))
        .collect();
    let v: Int64Array = (0..n).map(|_| Some(rng.random_range(0..20))).collect();
    let mut long = StringViewBuilder::new().with_fixed_block_size(16 << 10);
    let mut short = StringViewBuilder::new();
    let mut binary_view = BinaryViewBuilder::new();
    for _ in 0..n {
        if rng.random_bool(0.1) {
            long.append_null();
        } else {
            let len = rng.random_range(40..=120);
            long.append_value(random_text(rng, len));
        }
        let len = rng.random_range(0..=12);
        short.append_value(random_text(rng, len));
        let len = rng.random_range(8..=60);
        binary_view.append_value(random_text(rng, len).as_bytes());
    }
    let utf8: StringArray = (0..n)
        .map(|_| {
            let len = rng.random_range(20..=80);
            Some(random_text(rng, len))
        })
        .collect();
    let large: LargeStringArray = (0..n)
        .map(|_| {
            (!rng.random_bool(0.2)).then(|| {
                let len = rng.random_range(20..=80);
                random_text(rng, len)
            })
        })
        .collect();
    let binary: BinaryArray = (0..n)
        .map(|_| {
            let len = rng.random_range(10..=60);
            Some(random_text(rng, len).into_bytes())
        })
        .collect();
    let words: Vec<String> = (0..50)
        .map(|_| {
            let len = rng.random_range(20..=40);
            random_text(rng, len)
        })
        .collect();
    let dict: DictionaryArray<Int32Type> = (0..n)
        .map(|_| (!rng.random_bool(0.05)).then(|| words[rng.random_range(0..50)].as_str()))
        .collect();
    RecordBatch::try_from_iter(vec![
        (format!("{p}k"), Arc::new(k) as ArrayRef),
        (format!("{p}v"), Arc::new(v) as ArrayRef),
        (format!("{p}long"), Arc::new(long.finish()) as ArrayRef),
        (format!("{p}short"), Arc::new(short.finish()) as ArrayRef),
        (format!("{p}utf8"), Arc::new(utf8) as ArrayRef),
        (format!("{p}large"), Arc::new(large) as ArrayRef),
        (format!("{p}bin"), Arc::new(binary) as ArrayRef),
        (
            format!("{p}binview"),
            Arc::new(binary_view.finish()) as ArrayRef,
        ),
        (format!("{p}dict"), Arc::new(dict) as ArrayRef),
    ])
    .unwrap()
}

/// The compact Arrow bytes of a batch's rows: values (or views, offsets, keys), the
/// bytes views do not inline, validity bitmaps; a dictionary's values once.
fn compact_bytes(batch: &RecordBatch) -> usize {
    let n = batch.num_rows();
    batch
        .columns()
        .iter()
        .map(|c| {
            let nulls = if c.null_count() > 0 { n.div_ceil(8) } else { 0 };
            let data = c.to_data();
            let values = match c.data_type() {
                DataType::Int64 => 8 * n,
                DataType::Utf8 | DataType::Binary => 4 * (n + 1) + data.buffers()[1].len(),
                DataType::LargeUtf8 => 8 * (n + 1) + data.buffers()[1].len(),
                DataType::Utf8View | DataType::BinaryView => {
                    let views = data.buffers()[0].typed_data::<u128>();
                    let outside: usize = views
                        .iter()
                        .map(|v| *v as u32 as usize)
                        .filter(|&len| len > 12)
                        .sum();
                    16 * n + outside
                }
                DataType::Dictionary(_, _) => 4 * n + data.child_data()[0].buffers()[1].len(),
                other => panic!("no compact size for {other}"),
            };
            nulls + values
        })
        .sum()
}

/// The input shapes: slices of the side's one batch, and batches taken from it in
/// random order (both keep the whole batch's data buffers).
#[derive(Debug, Clone, Copy)]
enum Shape {
    Sliced,
    Taken,
}

fn batches(rng: &mut StdRng, batch: &RecordBatch, shape: Shape) -> Vec<RecordBatch> {
    match shape {
        Shape::Sliced => split(rng, batch, 300),
        Shape::Taken => {
            let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
            order.shuffle(rng);
            order
                .chunks(250)
                .map(|chunk| {
                    let indices = UInt32Array::from(chunk.to_vec());
                    let columns = batch
                        .columns()
                        .iter()
                        .map(|c| arrow_select::take::take(c, &indices, None).unwrap())
                        .collect();
                    RecordBatch::try_new(batch.schema(), columns).unwrap()
                })
                .collect()
        }
    }
}

/// Runs `join_type` with every build partition spilled down to `depth`; returns its
/// output rendered and its metrics, after checking nothing was left behind.
fn spilled_join(
    left: &[RecordBatch],
    right: &[RecordBatch],
    join_type: JoinType,
    depth: u32,
    limit: Option<usize>,
) -> (Vec<String>, JoinMetrics) {
    spilled_join_io(left, right, join_type, depth, limit, 2, false)
}

/// [`spilled_join`] on `threads` threads, its spill files written and read with
/// direct I/O if `direct`.
fn spilled_join_io(
    left: &[RecordBatch],
    right: &[RecordBatch],
    join_type: JoinType,
    depth: u32,
    limit: Option<usize>,
    threads: usize,
    direct: bool,
) -> (Vec<String>, JoinMetrics) {
    let root = tempfile::tempdir().unwrap();
    let config = SpillConfig::default()
        .with_root_dir(root.path())
        .with_direct_io(direct);
    let spill = SpillManager::new(config).unwrap();
    let pool: Arc<dyn MemoryPool> = match limit {
        // (Tracked, so that a failure names what held the memory.)
        Some(limit) => Arc::new(TrackConsumersPool::new(
            GreedyMemoryPool::new(limit),
            NonZeroUsize::new(8).unwrap(),
        )),
        None => Arc::new(spilljoin::memory::UnboundedMemoryPool::new()),
    };
    let mut builder = HashJoinBuilder::new(left[0].schema(), right[0].schema(), [("lk", "rk")])
        .with_join_type(join_type)
        .with_memory_pool(Arc::clone(&pool))
        .with_spill_manager(spill.clone())
        .with_threads(threads)
        // (The right input builds at every level, so that each side's bytes are
        // checked against its own rows.)
        .with_swap_spilled_pairs(false)
        .with_force_spill_depth(depth);
    if limit.is_none() {
        builder = builder.with_force_spill(1.0);
    }
    let input = |b: &[RecordBatch]| {
        b.iter()
            .cloned()
            .map(Ok::<_, ArrowError>)
            .collect::<Vec<_>>()
    };
    let join = builder.build().unwrap();
    run_to_end(join, input(left), input(right), &pool, &spill)
}

/// The reference answer of `join_type` on the key columns, SQL equality.
fn expected(left: &RecordBatch, right: &RecordBatch, join_type: JoinType) -> Vec<String> {
    let equality = NullEquality::NullEqualsNothing;
    reference_join(left, right, &[(0, 0)], join_type, false, equality)
}

/// A batch's compact Arrow bytes a row.
fn per_row(batch: &RecordBatch) -> f64 {
    compact_bytes(batch) as f64 / batch.num_rows() as f64
}

/// The bytes a spilled row took on each side, against its compact Arrow bytes.
fn check_bytes(m: &JoinMetrics, build_row: f64, probe_row: f64, context: &str) {
    assert!(
        m.build_rows_spilled > 0,
        "nothing spilled: {context}: {m:?}"
    );
    let build = m.build_bytes_spilled as f64 / m.build_rows_spilled as f64;
    assert!(
        build <= 1.25 * build_row,
        "{build:.0} bytes a spilled build row, {build_row:.0} in Arrow: {context}: {m:?}"
    );
    if m.probe_rows_spilled > 0 {
        let probe = m.probe_bytes_spilled as f64 / m.probe_rows_spilled as f64;
        assert!(
            probe <= 1.25 * probe_row,
            "{probe:.0} bytes a spilled probe row, {probe_row:.0} in Arrow: {context}: {m:?}"
        );
    }
}

#[test]
fn spilled_string_rows_cost_their_own_bytes_at_every_level() {
    let (seed, mut rng) = rng_for(71);
    let (left, right) = (side(&mut rng, "l"), side(&mut rng, "r"));
    let (left_row, right_row) = (per_row(&left), per_row(&right));
    let cases = [
        (JoinType::Inner, 0),
        (JoinType::Full, 1),
        (JoinType::LeftAnti, 2),
        (JoinType::Right, 3),
    ];
    for shape in [Shape::Sliced, Shape::Taken] {
        let (l, r) = (
            batches(&mut rng, &left, shape),
            batches(&mut rng, &right, shape),
        );
        for (join_type, depth) in cases {
            let context = format!("{join_type} depth {depth} {shape:?} (seed {seed})");
            let expected = expected(&left, &right, join_type);
            let (output, m) = spilled_join(&l, &r, join_type, depth, None);
            assert!(output == expected, "wrong answer: {context}: {m:?}");
            // (Below level 1 a pair may end in the fallback, which writes nothing.)
            assert!(m.max_depth >= depth.min(1) as u64, "{context}: {m:?}");
            check_bytes(&m, right_row, left_row, &context);
        }
    }
}

/// The same under a real limit: spilled because memory ran out, not by force. (The
/// input batches, slices of or views into one batch of 1.7 MB, hold that batch.)
#[test]
fn string_rows_spilled_under_a_limit_cost_their_own_bytes() {
    let (seed, mut rng) = rng_for(72);
    let (left, right) = (side(&mut rng, "l"), side(&mut rng, "r"));
    for shape in [Shape::Sliced, Shape::Taken] {
        let (l, r) = (
            batches(&mut rng, &left, shape),
            batches(&mut rng, &right, shape),
        );
        // (Below the 1.7 MB of a side's rows, which fit in memory under 2.5 MiB.)
        for (join_type, limit) in [
            (JoinType::Inner, 1 << 20),
            (JoinType::Left, 1 << 20),
            (JoinType::Inner, 3 << 19),
            (JoinType::Left, 3 << 19),
        ] {
            let context = format!("{join_type} {shape:?} limit {limit} (seed {seed})");
            let expected = expected(&left, &right, join_type);
            let (output, m) = spilled_join(&l, &r, join_type, 0, Some(limit));
            assert!(output == expected, "wrong answer: {context}: {m:?}");
            assert!(m.peak_reserved_bytes <= limit as u64, "{context}: {m:?}");
            check_bytes(&m, per_row(&right), per_row(&left), &context);
        }
    }
}

/// With direct I/O the same answers and the same bytes: under limits and with
/// every partition spilled down to depth 2, on one and two threads.
#[test]
fn string_rows_spilled_with_direct_io_are_exact() {
    let (seed, mut rng) = rng_for(74);
    let (left, right) = (side(&mut rng, "l"), side(&mut rng, "r"));
    let (l, r) = (
        batches(&mut rng, &left, Shape::Taken),
        batches(&mut rng, &right, Shape::Sliced),
    );
    let cases = [
        (JoinType::Inner, 0, Some(1 << 20), 2),
        (JoinType::Full, 0, Some(3 << 19), 1),
        (JoinType::LeftSemi, 2, None, 2),
        (JoinType::RightAnti, 1, None, 1),
    ];
    for (join_type, depth, limit, threads) in cases {
        let context = format!("{join_type} depth {depth} limit {limit:?} (seed {seed})");
        let expected = expected(&left, &right, join_type);
        let (output, m) = spilled_join_io(&l, &r, join_type, depth, limit, threads, true);
        assert!(output == expected, "wrong answer: {context}: {m:?}");
        check_bytes(&m, per_row(&right), per_row(&left), &context);
    }
}

/// A side without its dictionary column: rows a spilled pair counts as they read back
/// (an uncompressed file, one word key), so that a pair that fits is joined in one
/// table, one level of one partition.
fn without_dictionary(batch: &RecordBatch) -> RecordBatch {
    let columns: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| !matches!(batch.column(i).data_type(), DataType::Dictionary(..)))
        .collect();
    batch.project(&columns).unwrap()
}

/// Both sides of test `case` without their dictionary columns, whole and as batches of
/// `shape`, and the seed.
fn sides_without_dictionary(
    case: u64,
    shape: Shape,
) -> (
    u64,
    RecordBatch,
    RecordBatch,
    Vec<RecordBatch>,
    Vec<RecordBatch>,
) {
    let (seed, mut rng) = rng_for(case);
    let left = without_dictionary(&side(&mut rng, "l"));
    let right = without_dictionary(&side(&mut rng, "r"));
    let (l, r) = (
        batches(&mut rng, &left, shape),
        batches(&mut rng, &right, shape),
    );
    (seed, left, right, l, r)
}

/// A pair joined in one table whose level spills all the same (forced) cannot split:
/// it is joined in chunks, exactly.
#[test]
fn string_pairs_joined_in_one_table_are_exact_when_their_level_spills() {
    let (seed, left, right, l, r) = sides_without_dictionary(73, Shape::Sliced);
    for threads in [2, 4] {
        for join_type in [
            JoinType::Inner,
            JoinType::Full,
            JoinType::LeftAnti,
            JoinType::Right,
        ] {
            let context = format!("{join_type} {threads} threads (seed {seed})");
            let (output, m) = spilled_join_io(&l, &r, join_type, 1, None, threads, false);
            assert!(
                output == expected(&left, &right, join_type),
                "wrong answer: {context}: {m:?}"
            );
            assert!(
                m.fallbacks > 0,
                "no pair joined in one table: {context}: {m:?}"
            );
        }
    }
}

/// Under real limits, on two and four threads: exact, inside the limit, and no pair
/// of such rows taken for one that fits one table and then spilled (its level could
/// only join it in chunks).
#[test]
fn string_pairs_under_a_limit_are_exact_and_not_joined_in_chunks() {
    let (seed, left, right, l, r) = sides_without_dictionary(74, Shape::Taken);
    for threads in [2, 4] {
        for (join_type, limit) in [(JoinType::Inner, 1 << 20), (JoinType::Left, 3 << 19)] {
            let context = format!("{join_type} {threads} threads, limit {limit} (seed {seed})");
            let (output, m) = spilled_join_io(&l, &r, join_type, 0, Some(limit), threads, false);
            assert!(
                output == expected(&left, &right, join_type),
                "wrong answer: {context}: {m:?}"
            );
            assert!(m.peak_reserved_bytes <= limit as u64, "{context}: {m:?}");
            assert!(
                m.build_rows_spilled > 0,
                "nothing spilled: {context}: {m:?}"
            );
            assert_eq!(m.fallbacks, 0, "{context}: {m:?}");
        }
    }
}
