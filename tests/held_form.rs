//! A build expected to spill holds its in-memory partitions in the spill files' form
//! (decimals of at most 18 digits as `Int64`, view columns as offsets), which takes a
//! third less memory for a row of strings and decimals, and widens back to the
//! input's types whatever output rows and filters take from them.
//!
//! Checked here against the nested-loop reference: every join type, with and
//! without a filter, under limits that spill some partitions and keep others; a
//! filter that reads the held columns themselves; and that the form keeps more rows
//! in memory than the input's form under the same limit.

mod common;

use std::sync::Arc;

use arrow_array::builder::{BinaryViewBuilder, StringViewBuilder};
use arrow_array::{ArrayRef, BooleanArray, Decimal128Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{ArrowError, SchemaRef};
use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool, UnboundedMemoryPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinFilter, JoinMetrics, JoinType, NullEquality, Side};

/// Rows a side.
const ROWS: usize = 3000;

/// A side of `ROWS` rows: a key with duplicates and nulls (an integer, or with
/// `text_key` its digits as `Utf8`: a key that is hashed, not compared as a word),
/// the filter's `v`, and a payload of every column the files narrow (short and long
/// views, binary views, a decimal), some nullable.
fn side(rng: &mut StdRng, p: &str, text_key: bool) -> RecordBatch {
    side_of(rng, p, text_key, ROWS)
}

/// [`side`] of `n` rows.
fn side_of(rng: &mut StdRng, p: &str, text_key: bool, n: usize) -> RecordBatch {
    let k: Vec<Option<i64>> = (0..n)
        .map(|_| (!rng.random_bool(0.03)).then(|| rng.random_range(0..2 * n as i64 / 3)))
        .collect();
    let k: ArrayRef = if text_key {
        Arc::new(
            k.iter()
                .map(|k| k.map(|k| k.to_string()))
                .collect::<StringArray>(),
        )
    } else {
        Arc::new(k.into_iter().collect::<Int64Array>())
    };
    let v: Int64Array = (0..n).map(|_| Some(rng.random_range(0..20))).collect();
    let mut short = StringViewBuilder::new();
    let mut long = StringViewBuilder::new().with_fixed_block_size(16 << 10);
    let mut binary = BinaryViewBuilder::new();
    for _ in 0..n {
        let len = rng.random_range(0..=12);
        short.append_value(random_text(rng, len));
        if rng.random_bool(0.1) {
            long.append_null();
        } else {
            let len = rng.random_range(200..=600);
            long.append_value(random_text(rng, len));
        }
        let len = rng.random_range(4..=40);
        binary.append_value(random_text(rng, len).as_bytes());
    }
    let price: Decimal128Array = (0..n)
        .map(|_| (!rng.random_bool(0.1)).then(|| rng.random_range(-99_999_999..99_999_999)))
        .collect::<Decimal128Array>()
        .with_precision_and_scale(15, 2)
        .unwrap();
    RecordBatch::try_from_iter(vec![
        (format!("{p}k"), k),
        (format!("{p}v"), Arc::new(v) as ArrayRef),
        (format!("{p}short"), Arc::new(short.finish()) as ArrayRef),
        (format!("{p}long"), Arc::new(long.finish()) as ArrayRef),
        (format!("{p}bin"), Arc::new(binary.finish()) as ArrayRef),
        (format!("{p}price"), Arc::new(price) as ArrayRef),
    ])
    .unwrap()
}

/// How one join runs.
struct Run {
    join_type: JoinType,
    filter: Option<JoinFilter>,
    limit: Option<usize>,
    /// The build's bytes as the planner is told (`with_build_size_hint`).
    hint: Option<u64>,
}

/// Runs `run` over `left` and `right` (in batches of 500 rows; the right side
/// builds) on two threads with 16 partitions; returns the output as sorted rendered
/// rows and the metrics, having checked that nothing is left reserved or on disk.
fn join(left: &RecordBatch, right: &RecordBatch, run: Run) -> (Vec<String>, JoinMetrics) {
    let root = tempfile::tempdir().unwrap();
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
    let pool: Arc<dyn MemoryPool> = match run.limit {
        Some(limit) => Arc::new(GreedyMemoryPool::new(limit)),
        None => Arc::new(UnboundedMemoryPool::new()),
    };
    let mut builder = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_join_type(run.join_type)
        .with_memory_pool(Arc::clone(&pool))
        .with_spill_manager(spill.clone())
        .with_threads(2)
        .with_partition_bits(4)
        .with_batch_size(512)
        .with_swap_spilled_pairs(false)
        .with_force_spill(0.0);
    if let Some(filter) = run.filter {
        builder = builder.with_filter(filter);
    }
    if let Some(hint) = run.hint {
        builder = builder.with_build_size_hint(hint);
    }
    let batches = |b: &RecordBatch| {
        (0..b.num_rows())
            .step_by(500)
            .map(|s| Ok::<_, ArrowError>(b.slice(s, 500.min(b.num_rows() - s))))
            .collect::<Vec<_>>()
    };
    let join = builder.build().unwrap();
    run_to_end(join, batches(left), batches(right), &pool, &spill)
}

/// The right side's bytes as Arrow holds them.
fn build_bytes(right: &RecordBatch) -> u64 {
    right.get_array_memory_size() as u64
}

#[test]
fn held_partitions_join_exactly_under_limits() {
    let (seed, mut rng) = rng_for(0x4e1d);
    for text_key in [false, true] {
        let (left, right) = (side(&mut rng, "l", text_key), side(&mut rng, "r", text_key));
        join_every_type_under_limits(&left, &right, &format!("text key {text_key} (seed {seed})"));
    }
}

/// Every join type, with and without the filter, at a half and a third of the
/// build's bytes, against the reference join.
fn join_every_type_under_limits(left: &RecordBatch, right: &RecordBatch, case: &str) {
    let bytes = build_bytes(right);
    for join_type in JoinType::ALL {
        for filter in [false, true] {
            if filter && join_type.is_null_aware() {
                continue;
            }
            for share in [2, 3] {
                let limit = bytes as usize / share;
                let context = format!("{join_type} filter {filter} limit {limit}, {case}");
                let run = Run {
                    join_type,
                    filter: filter.then(|| less_than_filter(&left.schema(), &right.schema())),
                    limit: Some(limit),
                    hint: Some(bytes),
                };
                let (output, m) = join(left, right, run);
                let expected = reference_join(
                    left,
                    right,
                    &[(0, 0)],
                    join_type,
                    filter,
                    NullEquality::NullEqualsNothing,
                );
                assert!(output == expected, "{context}: wrong answer");
                assert!(m.peak_reserved_bytes <= limit as u64, "{context}: {m:?}");
                // Some partitions spilled and some were held: both paths ran.
                assert!(m.partitions_spilled > 0, "{context}: {m:?}");
                assert!(m.build_rows_spilled < m.build_rows, "{context}: {m:?}");
            }
        }
    }
}

/// `left.lprice < right.rprice and right.rshort >= left.lshort`: both of the build's
/// columns are held narrowed.
fn held_columns_filter(left: &SchemaRef, right: &SchemaRef) -> JoinFilter {
    let l = |name: &str| left.index_of(name).unwrap();
    let r = |name: &str| right.index_of(name).unwrap();
    JoinFilter::new(
        vec![
            (Side::Left, l("lprice")),
            (Side::Right, r("rprice")),
            (Side::Left, l("lshort")),
            (Side::Right, r("rshort")),
        ],
        |b: &RecordBatch| {
            let price = arrow_ord::cmp::lt(b.column(0), b.column(1))?;
            let short = arrow_ord::cmp::gt_eq(b.column(3), b.column(2))?;
            // (Null is false, as a join filter reads it.)
            Ok(price
                .iter()
                .zip(short.iter())
                .map(|(p, s)| Some(p == Some(true) && s == Some(true)))
                .collect::<BooleanArray>())
        },
    )
}

/// A filter on held columns answers as the same join does with every row in memory
/// in the input's form (no limit, no hint), itself checked against the reference
/// join everywhere else.
#[test]
fn a_filter_reads_held_columns_as_the_input_types() {
    let (seed, mut rng) = rng_for(0x4e1e);
    let (left, right) = (side(&mut rng, "l", false), side(&mut rng, "r", false));
    let bytes = build_bytes(&right);
    let schemas = (left.schema(), right.schema());
    for join_type in [
        JoinType::Inner,
        JoinType::Left,
        JoinType::Right,
        JoinType::Full,
        JoinType::RightSemi,
        JoinType::RightAnti,
        JoinType::LeftMark,
    ] {
        let context = format!("{join_type} (seed {seed})");
        let run = |limit, hint| Run {
            join_type,
            filter: Some(held_columns_filter(&schemas.0, &schemas.1)),
            limit,
            hint,
        };
        let (expected, unlimited) = join(&left, &right, run(None, None));
        assert_eq!(unlimited.partitions_spilled, 0, "{context}");
        let (output, m) = join(&left, &right, run(Some(bytes as usize / 4), Some(bytes)));
        assert!(m.partitions_spilled > 0, "{context}: {m:?}");
        assert!(output == expected, "{context}: wrong answer");
    }
}

/// Under the same limit, held in the files' form, fewer build rows spill than held
/// as the input's views and 16-byte decimals.
#[test]
fn held_partitions_keep_more_rows_in_memory() {
    let (seed, mut rng) = rng_for(0x4e1f);
    // Keys, `v`, short strings and decimals: 48 bytes a row as Arrow, 34 held (the
    // long strings' bytes, the same in both forms, would hide the difference).
    let narrowed = |batch: RecordBatch| batch.project(&[0, 1, 2, 5]).unwrap();
    let left = narrowed(side_of(&mut rng, "l", false, 200 * ROWS));
    let right = narrowed(side_of(&mut rng, "r", false, 200 * ROWS));
    let bytes = build_bytes(&right);
    let limit = bytes as usize / 3;
    let run = |hint| Run {
        join_type: JoinType::Inner,
        filter: None,
        limit: Some(limit),
        hint,
    };
    // (A hint under the limit keeps the input's form, with the same planning.)
    let (arrow_form, arrow) = join(&left, &right, run(Some(limit as u64 / 2)));
    let (held_form, held) = join(&left, &right, run(Some(bytes)));
    assert!(held_form == arrow_form, "seed {seed}: answers differ");
    assert!(
        held.build_rows_spilled < arrow.build_rows_spilled,
        "seed {seed}: held {held:?}\ninput form {arrow:?}"
    );
}
