//! The memory floor with wide rows: a join whose input batches are several MiB each
//! finishes under a limit of twice its largest batch, on one or several threads,
//! with the reference join's answer.
//!
//! Narrow rows are covered by the harness (`spill_harness.rs`, 4 MiB floor); here a
//! thousand rows are already megabytes, so a join that processed a fixed number of
//! rows at a time would need many times its batches (before pieces were cut by
//! bytes, four threads joining 8 MiB batches of 2 KB rows needed 29 MiB).

mod common;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinType, NullEquality};

/// One side: `rows` rows in batches of `batch_rows`, keys over `domain` (some null),
/// an int payload `v` and a string payload `s` of about `width` bytes.
fn side(
    rng: &mut StdRng,
    prefix: &str,
    rows: usize,
    batch_rows: usize,
    width: usize,
    domain: i64,
) -> Vec<RecordBatch> {
    (0..rows)
        .step_by(batch_rows)
        .map(|start| {
            let n = batch_rows.min(rows - start);
            let k: Int64Array = (0..n)
                .map(|_| (!rng.random_bool(0.05)).then(|| rng.random_range(0..domain)))
                .collect();
            let v: Int64Array = (0..n).map(|_| Some(rng.random_range(0..20))).collect();
            let s: StringArray = (start..start + n)
                .map(|i| {
                    let len = rng.random_range(width / 2..=width * 3 / 2);
                    Some(format!("{prefix}{i}:{}", "w".repeat(len)))
                })
                .collect();
            RecordBatch::try_from_iter(vec![
                (format!("{prefix}k"), Arc::new(k) as ArrayRef),
                (format!("{prefix}v"), Arc::new(v) as ArrayRef),
                (format!("{prefix}s"), Arc::new(s) as ArrayRef),
            ])
            .unwrap()
        })
        .collect()
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    arrow_select::concat::concat_batches(&batches[0].schema(), batches).unwrap()
}

#[test]
fn wide_batches_join_under_twice_the_largest_batch() {
    let (seed, mut rng) = rng_for(41);
    // 3 batches a side of 400 rows of about 8 KiB: 3.1 MiB a batch, 9.4 MiB a side.
    let (rows, batch_rows, width) = (1200, 400, 8 << 10);
    let left = side(&mut rng, "l", rows, batch_rows, width, 300);
    let right = side(&mut rng, "r", rows, batch_rows, width, 300);
    let largest = left
        .iter()
        .chain(&right)
        .map(|b| b.get_array_memory_size())
        .max()
        .unwrap();
    let limit = 2 * largest;
    let (all_left, all_right) = (concat(&left), concat(&right));
    for (i, &join_type) in JoinType::ALL.iter().enumerate() {
        let filter = !join_type.is_null_aware() && i % 2 == 1;
        let expected = reference_join(
            &all_left,
            &all_right,
            &[(0, 0)],
            join_type,
            filter,
            NullEquality::NullEqualsNothing,
        );
        for threads in [1, 2, 4] {
            let context = format!(
                "{join_type} filter={filter} threads={threads} limit={limit} (largest batch {largest}, seed {seed})"
            );
            let root = tempfile::tempdir().unwrap();
            let spill =
                SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
            let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
            let mut builder =
                HashJoinBuilder::new(left[0].schema(), right[0].schema(), [("lk", "rk")])
                    .with_join_type(join_type)
                    .with_memory_pool(Arc::clone(&pool))
                    .with_spill_manager(spill.clone())
                    .with_threads(threads)
                    .with_batch_size(batch_rows);
            if filter {
                builder =
                    builder.with_filter(less_than_filter(&left[0].schema(), &right[0].schema()));
            }
            let join = builder.build().unwrap();
            let mut stream = join
                .execute(
                    left.clone().into_iter().map(Ok),
                    right.clone().into_iter().map(Ok),
                )
                .unwrap();
            let output: Vec<RecordBatch> = stream
                .by_ref()
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            let m = stream.metrics();
            assert!(
                m.partitions_spilled > 0,
                "nothing spilled: {context}: {m:?}"
            );
            assert!(m.peak_reserved_bytes <= limit as u64, "{context}: {m:?}");
            assert!(
                rendered_rows(&output) == expected,
                "{context}: wrong answer; {m:?}"
            );
            drop(stream);
            assert_eq!(pool.reserved(), 0, "reservations left: {context}");
            assert_eq!(spill.live_files(), 0, "spill files left: {context}");
        }
    }
}
