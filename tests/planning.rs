//! Planning: the smaller input builds, and a swapped join gives exactly the output of
//! the unswapped one (same rows, same columns in the same order) for every join type,
//! with and without a residual filter, in memory and under limits that spill.

mod common;

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::DataType;
use common::*;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::{HashJoin, HashJoinBuilder, InputStatistics, JoinType, NullEquality, Side};

fn builder(left: &RecordBatch, right: &RecordBatch, join_type: JoinType) -> HashJoinBuilder {
    HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
        .with_join_type(join_type)
        .with_batch_size(64)
        .with_threads(2)
}

fn run(join: &HashJoin, left: &RecordBatch, right: &RecordBatch) -> Vec<RecordBatch> {
    let (mut lrng, mut rrng) = (rng_for(7).1, rng_for(8).1);
    let l: Vec<_> = split(&mut lrng, left, 40).into_iter().map(Ok).collect();
    let r: Vec<_> = split(&mut rrng, right, 40).into_iter().map(Ok).collect();
    join.execute(l, r)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{} building {:?}: {e}", join.join_type(), join.build_side()))
}

/// The left input is the smaller by statistics, so it builds unless swapping is off.
fn small_left() -> (InputStatistics, InputStatistics) {
    (
        InputStatistics::new(Some(1_000), Some(10)),
        InputStatistics::new(Some(50_000), Some(500)),
    )
}

#[test]
fn swapped_and_unswapped_joins_give_the_same_output() {
    let (_, mut rng) = rng_for(42);
    // Duplicates, nulls and strings on both sides; the left is the larger in truth,
    // which the statistics below deny: a wrong estimate costs time, not the answer.
    let left = side(&mut rng, "l", &[DataType::Int64], 900, 60, 0.1);
    let right = side(&mut rng, "r", &[DataType::Int64], 500, 60, 0.1);
    for join_type in JoinType::ALL {
        for filter in [false, true] {
            if filter && join_type.is_null_aware() {
                continue;
            }
            // In memory, under a small limit with half the partitions spilled, and with
            // every partition spilled.
            for (limit, force) in [(usize::MAX, 0.0), (512 * 1024, 0.5), (usize::MAX, 1.0)] {
                let expected = reference_join(
                    &left,
                    &right,
                    &[(0, 0)],
                    join_type,
                    filter,
                    NullEquality::NullEqualsNothing,
                );
                let mut outputs = Vec::new();
                for swap in [false, true] {
                    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
                    let (ls, rs) = small_left();
                    let mut b = builder(&left, &right, join_type)
                        .with_statistics(ls, rs)
                        .with_side_swap(swap)
                        .with_memory_pool(Arc::clone(&pool))
                        .with_force_spill(force);
                    if filter {
                        b = b.with_filter(less_than_filter(&left.schema(), &right.schema()));
                    }
                    let join = b.build().unwrap();
                    let want = if swap { Side::Left } else { Side::Right };
                    assert_eq!(
                        join.build_side(),
                        want,
                        "{join_type}: {}",
                        join.build_side_reason()
                    );
                    let output = run(&join, &left, &right);
                    for batch in &output {
                        assert_eq!(batch.schema(), join.schema());
                    }
                    assert_eq!(pool.reserved(), 0, "{join_type}: reservations left");
                    outputs.push((join.schema(), rendered_rows(&output)));
                }
                let context = format!("{join_type} filter={filter} limit={limit} force={force}");
                assert_eq!(outputs[0].0, outputs[1].0, "columns differ: {context}");
                assert_eq!(outputs[0].1, expected, "unswapped: {context}");
                assert_eq!(outputs[1].1, expected, "swapped: {context}");
            }
        }
    }
}

#[test]
fn the_smaller_input_builds_by_bytes_then_rows() {
    let (_, mut rng) = rng_for(1);
    let left = side(&mut rng, "l", &[DataType::Int64], 5, 5, 0.0);
    let right = side(&mut rng, "r", &[DataType::Int64], 5, 5, 0.0);
    let side_for = |l: InputStatistics, r: InputStatistics| {
        let join = builder(&left, &right, JoinType::Inner)
            .with_statistics(l, r)
            .build()
            .unwrap();
        assert!(!join.build_side_reason().is_empty());
        join.build_side()
    };
    let known = |bytes, rows| InputStatistics::new(bytes, rows);
    // Nothing known: no swap.
    assert_eq!(
        side_for(InputStatistics::unknown(), InputStatistics::unknown()),
        Side::Right
    );
    // Bytes decide when both sides have them, even against the rows.
    assert_eq!(
        side_for(known(Some(10), Some(1000)), known(Some(20), Some(1))),
        Side::Left
    );
    assert_eq!(
        side_for(known(Some(30), Some(1)), known(Some(20), Some(1000))),
        Side::Right
    );
    // Rows decide when bytes are known for one side only.
    assert_eq!(
        side_for(known(Some(10), Some(5)), known(None, Some(9))),
        Side::Left
    );
    // One side unknown: no swap. Equal sizes: no swap.
    assert_eq!(
        side_for(known(Some(10), None), InputStatistics::unknown()),
        Side::Right
    );
    assert_eq!(
        side_for(known(Some(10), None), known(Some(10), None)),
        Side::Right
    );
}

/// A spilled pair is joined beside another only when its rows, their table and a
/// probe worker's batches fit its share, counted at their width in memory: one
/// `Int64` key column spills in 4 bytes a row while its values fit, but takes 8 in
/// memory, 8 more for its hashes and ~12 for its table. Judged by its file's bytes,
/// each of these 250K-row pairs seemed to fit a share of 4.5 MiB and was joined in
/// chunks when it did not; joined alone with the whole limit, it fits.
#[test]
fn spilled_pairs_are_sized_by_their_rows_in_memory_not_their_files() {
    use arrow_array::{ArrayRef, Int64Array};
    const ROWS: i64 = 1_000_000;
    let batches = |name: &str, stride: i64| -> Vec<Result<RecordBatch, arrow_schema::ArrowError>> {
        (0..ROWS / 8192 + 1)
            .map(|i| {
                let keys: Int64Array = (i * 8192..((i + 1) * 8192).min(ROWS))
                    .map(|k| (k * stride) % (ROWS * 7))
                    .collect();
                RecordBatch::try_from_iter([(name, Arc::new(keys) as ArrayRef)])
            })
            .collect()
    };
    let probe = batches("p", 7);
    let build = batches("b", 7);
    let schema = |b: &[Result<RecordBatch, _>]| b[0].as_ref().map(|b| b.schema()).ok();
    let (Some(ps), Some(bs)) = (schema(&probe), schema(&build)) else {
        panic!("no batches")
    };
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(9 << 20));
    let mut stream = HashJoinBuilder::new(ps, bs, [("p", "b")])
        .with_join_type(JoinType::Inner)
        .with_memory_pool(pool)
        .with_partition_bits(2)
        .with_threads(2)
        // (Spilling forced below level 0, `SPILLJOIN_FORCE_SPILL_DEPTH`, would send
        // every pair to the fallback whatever its size.)
        .with_force_spill_depth(0)
        .build()
        .and_then(|join| join.execute(probe, build))
        .unwrap_or_else(|e| panic!("{e}"));
    let rows: usize = stream
        .by_ref()
        .map(|b| b.map(|b| b.num_rows()).unwrap_or_else(|e| panic!("{e}")))
        .sum();
    assert_eq!(rows, ROWS as usize);
    let m = stream.metrics();
    assert!(m.partitions_spilled > 0, "{m:?}");
    assert_eq!(m.fallbacks, 0, "{m:?}");
}
