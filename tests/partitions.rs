//! One partition of a shuffle at a time: what a distributed engine's executor does
//! with a join stage. Both inputs are hash-partitioned on the key (here by the
//! test); each partition's build and probe are joined by their own `HashJoin`, all
//! partitions side by side on one executor pool, each through a `PoolShare` of it.
//! The union of the partitions' outputs is the reference join's answer, for every
//! join type whose rows depend on one key's rows alone, under limits that make every
//! partition spill. A `NOT IN`'s answer depends on the whole subquery (a NULL or no
//! row anywhere in it): its outer side is split, and every join builds the whole
//! subquery.

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::DataType;
use arrow_select::filter::filter_record_batch;
use common::*;
use spilljoin::memory::{FairSpillPool, MemoryPool, PoolShare};
use spilljoin::{HashJoinBuilder, JoinType, NullEquality};

/// The rows of `batch` whose key (column 0) hashes to partition `p` of `parts`;
/// rows with a null key go to partition 0 (they match nothing, and an outer join
/// outputs each once).
fn partition(batch: &RecordBatch, p: usize, parts: usize) -> RecordBatch {
    let keys = batch.column(0).as_primitive::<Int64Type>();
    let mask: BooleanArray = keys
        .iter()
        .map(|k| {
            let home = k.map_or(0, |k| (k.rem_euclid(parts as i64)) as usize);
            Some(home == p)
        })
        .collect();
    filter_record_batch(batch, &mask).unwrap()
}

/// Joins each of `parts` partitions on its own thread (the whole of `right` in each
/// where `whole_right`), every join through a `PoolShare` of one pool of `limit`
/// bytes; the outputs' rows, sorted.
fn partitioned_join(
    (left, right, whole_right): (&RecordBatch, &RecordBatch, bool),
    join_type: JoinType,
    parts: usize,
    limit: usize,
) -> Vec<String> {
    let executor: Arc<dyn MemoryPool> = Arc::new(FairSpillPool::new(limit));
    let outputs: Vec<(Vec<RecordBatch>, bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..parts)
            .map(|p| {
                let l = partition(left, p, parts);
                let r = match whole_right {
                    true => right.clone(),
                    false => partition(right, p, parts),
                };
                let pool: Arc<dyn MemoryPool> =
                    Arc::new(PoolShare::new(Arc::clone(&executor), parts));
                scope.spawn(move || {
                    let join = HashJoinBuilder::new(l.schema(), r.schema(), [("lk0", "rk0")])
                        .with_join_type(join_type)
                        .with_batch_size(64)
                        .with_threads(1)
                        .with_memory_pool(pool)
                        .build()
                        .unwrap();
                    let pieces = |b: &RecordBatch| {
                        (0..b.num_rows())
                            .step_by(100)
                            .map(|at| Ok(b.slice(at, 100.min(b.num_rows() - at))))
                            .collect::<Vec<_>>()
                    };
                    let mut stream = join.execute(pieces(&l), pieces(&r)).unwrap();
                    let batches = stream.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
                    // (Without statistics the right input builds.)
                    let spilled = stream.metrics().build_rows_spilled;
                    (batches, spilled > 0 || r.num_rows() == 0)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(executor.reserved(), 0, "every partition's memory went back");
    let (outputs, spilled): (Vec<_>, Vec<bool>) = outputs.into_iter().unzip();
    if limit < SPILLS_BELOW {
        assert!(
            spilled.iter().all(|&s| s),
            "{join_type:?}: spilled {spilled:?}"
        );
    }
    rendered_rows(&outputs.concat())
}

/// Limits under which the partitions of these tests spill.
const SPILLS_BELOW: usize = 1 << 20;

/// The executor pool's limit where the tests spill: three partitions of some
/// 2,700 build rows (100 to 150 KB) each, or three builds of a whole subquery of
/// 8,000 rows.
const LIMIT: usize = 192 << 10;

#[test]
fn partitions_joined_side_by_side_give_the_whole_join() {
    let (_, mut rng) = rng_for(7);
    let left = side(&mut rng, "l", &[DataType::Int64], 20_000, 3000, 0.05);
    let right = side(&mut rng, "r", &[DataType::Int64], 8000, 3000, 0.05);
    // Every type but NOT IN (the next test).
    for join_type in JoinType::ALL.into_iter().filter(|t| !t.is_null_aware()) {
        let want = hash_reference_join(
            &left,
            &right,
            &[(0, 0)],
            join_type,
            false,
            NullEquality::NullEqualsNothing,
        );
        // Unlimited, and small enough that partitions spill.
        for limit in [usize::MAX / 2, LIMIT] {
            let got = partitioned_join((&left, &right, false), join_type, 3, limit);
            assert!(
                want == got,
                "{join_type:?} under {limit} bytes: {} rows, want {}",
                got.len(),
                want.len()
            );
        }
    }
}

#[test]
fn not_in_splits_the_outer_side_and_builds_the_whole_subquery_in_each_join() {
    let (_, mut rng) = rng_for(8);
    let outer = side(&mut rng, "l", &[DataType::Int64], 6000, 8000, 0.05);
    let no_null = side(&mut rng, "r", &[DataType::Int64], 8000, 5000, 0.0);
    let a_null = side(&mut rng, "r", &[DataType::Int64], 8000, 5000, 0.01);
    let empty = no_null.slice(0, 0);
    for (what, subquery) in [
        ("no NULL", &no_null),
        ("a NULL", &a_null),
        ("empty", &empty),
    ] {
        let want = hash_reference_join(
            &outer,
            subquery,
            &[(0, 0)],
            JoinType::LeftNotIn,
            false,
            NullEquality::NullEqualsNothing,
        );
        for limit in [usize::MAX / 2, LIMIT] {
            let got = partitioned_join((&outer, subquery, true), JoinType::LeftNotIn, 3, limit);
            assert!(
                want == got,
                "NOT IN a subquery with {what} under {limit} bytes: {} rows, want {}",
                got.len(),
                want.len()
            );
        }
    }
}
