//! One key that dominates the build side: repartitioning cannot split it, so its
//! partition is joined by the chunked fallback, which must stay exact for every join
//! type.

mod common;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use common::{reference_join, rendered_rows};
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::{HashJoinBuilder, JoinType, NullEquality};

fn side(prefix: &str, keys: impl Iterator<Item = Option<i64>>, pad: usize) -> RecordBatch {
    let k: Int64Array = keys.collect();
    let n = k.len();
    let v: Int64Array = (0..n as i64).map(|i| Some(i % 7)).collect();
    let s: StringArray = (0..n)
        .map(|i| Some(format!("{prefix}{i}{}", "#".repeat(pad))))
        .collect();
    RecordBatch::try_from_iter(vec![
        (format!("{prefix}k"), Arc::new(k) as ArrayRef),
        (format!("{prefix}v"), Arc::new(v) as ArrayRef),
        (format!("{prefix}s"), Arc::new(s) as ArrayRef),
    ])
    .unwrap()
}

#[test]
fn a_dominant_key_goes_to_the_fallback_and_stays_exact() {
    // Right (build): 30 000 rows of key 7 (about 4 MiB with their payload) and 2 000
    // others; left (probe): a few rows of key 7, some others, some unmatched, a null.
    let right = side(
        "r",
        (0..32_000).map(|i| Some(if i < 30_000 { 7 } else { i % 500 })),
        100,
    );
    let left = side(
        "l",
        (0..300).map(|i| {
            if i == 299 {
                None
            } else {
                Some(if i % 50 == 0 { 7 } else { i % 900 })
            }
        }),
        4,
    );
    let right_batches = || {
        (0..32)
            .map(|i| Ok(right.slice(i * 1000, 1000)))
            .collect::<Vec<_>>()
    };
    for join_type in JoinType::ALL {
        let filter = matches!(
            join_type,
            JoinType::Full | JoinType::LeftSemi | JoinType::RightAnti
        );
        let expected = reference_join(
            &left,
            &right,
            &[(0, 0)],
            join_type,
            filter,
            NullEquality::NullEqualsNothing,
        );
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(3 << 20));
        let mut builder = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
            .with_join_type(join_type)
            .with_memory_pool(Arc::clone(&pool))
            .with_threads(2)
            .with_batch_size(1000)
            // The probe side is tiny: swapping roles would avoid the fallback.
            .with_swap_spilled_pairs(false);
        if filter {
            builder =
                builder.with_filter(common::less_than_filter(&left.schema(), &right.schema()));
        }
        let mut stream = builder
            .build()
            .unwrap()
            .execute(vec![Ok(left.clone())], right_batches())
            .unwrap();
        let output: Vec<RecordBatch> = stream
            .by_ref()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{join_type}: {e}"));
        let m = stream.metrics();
        assert!(
            m.fallbacks > 0,
            "{join_type}: the hot key should need the fallback: {m:?}"
        );
        assert_eq!(
            rendered_rows(&output),
            expected,
            "{join_type} (filter {filter})"
        );
        drop(stream);
        assert_eq!(pool.reserved(), 0);
    }
}

#[test]
fn a_panic_in_the_fallback_is_an_error_not_a_short_result() {
    let right = side("r", (0..32_000).map(|_| Some(7)), 100);
    let left = side("l", (0..100).map(|_| Some(7)), 4);
    let panicking = spilljoin::JoinFilter::new(
        vec![(spilljoin::Side::Left, 1)],
        |_: &RecordBatch| -> Result<arrow_array::BooleanArray, arrow_schema::ArrowError> {
            panic!("a predicate that panics")
        },
    );
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(3 << 20));
    let results: Vec<_> = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_filter(panicking)
        .with_memory_pool(Arc::clone(&pool))
        .with_swap_spilled_pairs(false)
        .with_threads(1)
        .build()
        .unwrap()
        .execute(
            vec![Ok(left)],
            (0..32)
                .map(|i| Ok(right.slice(i * 1000, 1000)))
                .collect::<Vec<_>>(),
        )
        .unwrap()
        .collect();
    assert!(
        matches!(results.last(), Some(Err(spilljoin::JoinError::WorkerPanicked(m))) if m.contains("panics")),
        "{:?}",
        results.last()
    );
    assert_eq!(pool.reserved(), 0);
}
