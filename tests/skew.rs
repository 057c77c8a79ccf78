//! One key that dominates the build side: repartitioning cannot split it, so its
//! partition goes to the fallback (chunked, or with the key split off first), which
//! must stay exact for every join type.

mod common;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use common::{reference_join, rendered_rows};
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::{HashJoinBuilder, HotKeySplit, JoinMetrics, JoinType, NullEquality};

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

/// One join of `left` (probe) and `right` (build) on their keys under `limit` bytes,
/// spilled pairs never swapped, in slices of `slice` rows; `tweak` sets the rest.
/// Checks the output against the reference join and that every reservation is
/// returned; returns the join's metrics. `context` names the case in failures.
#[allow(clippy::too_many_arguments)]
fn check_join(
    left: &RecordBatch,
    right: &RecordBatch,
    join_type: JoinType,
    filter: bool,
    null_equality: NullEquality,
    limit: usize,
    slice: usize,
    tweak: impl FnOnce(HashJoinBuilder) -> HashJoinBuilder,
    context: &str,
) -> JoinMetrics {
    let expected = reference_join(left, right, &[(0, 0)], join_type, filter, null_equality);
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
    let mut builder = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_join_type(join_type)
        .with_null_equality(null_equality)
        .with_memory_pool(Arc::clone(&pool))
        .with_batch_size(1000)
        .with_swap_spilled_pairs(false);
    if filter {
        builder = builder.with_filter(common::less_than_filter(&left.schema(), &right.schema()));
    }
    let slices = |b: &RecordBatch| {
        (0..b.num_rows().div_ceil(slice))
            .map(|i| Ok(b.slice(i * slice, (b.num_rows() - i * slice).min(slice))))
            .collect::<Vec<_>>()
    };
    let mut stream = tweak(builder)
        .build()
        .unwrap()
        .execute(slices(left), slices(right))
        .unwrap();
    let output: Vec<RecordBatch> = stream
        .by_ref()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    let m = stream.metrics();
    assert_eq!(rendered_rows(&output), expected, "{context}\n{m:?}");
    drop(stream);
    assert_eq!(pool.reserved(), 0, "{context}");
    m
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
    for join_type in JoinType::ALL {
        let filter = matches!(
            join_type,
            JoinType::Full | JoinType::LeftSemi | JoinType::RightAnti
        );
        let context = format!("{join_type} (filter {filter})");
        // The probe side is tiny: swapping roles would avoid the fallback.
        let m = check_join(
            &left,
            &right,
            join_type,
            filter,
            NullEquality::NullEqualsNothing,
            3 << 20,
            1000,
            |b| b.with_threads(2),
            &context,
        );
        assert!(
            m.fallbacks > 0,
            "{context}: the hot key should need the fallback: {m:?}"
        );
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

/// A dominant build key's pair with its hot key split off (only that key's probe rows
/// meet every build chunk; the other rows are joined like any pair): every join type
/// stays exact. (`Auto` splits only when the pair's probe file is large against its
/// build file and the memory, which takes more data than a test should.)
#[test]
fn a_dominant_key_with_a_large_probe_side_is_split_off_and_stays_exact() {
    // Right (build): 10 000 rows of key 7 (about 4 MiB with their payload) and 1 000
    // rows over 500 other keys; left (probe): 6 000 rows over 3 000 keys (some
    // unmatched), 6 of them key 7, and a null.
    let right = side(
        "r",
        (0..11_000).map(|i| Some(if i % 11 != 0 { 7 } else { 1000 + i % 500 })),
        400,
    );
    let left = side(
        "l",
        (0..6_000).map(|i| match i {
            5_999 => None,
            i if i % 1000 == 0 => Some(7),
            i => Some(1000 + i % 3000),
        }),
        4,
    );
    for join_type in JoinType::ALL {
        let filter = matches!(
            join_type,
            JoinType::Left | JoinType::RightSemi | JoinType::LeftAnti
        );
        let context = format!("{join_type} (filter {filter})");
        let m = check_join(
            &left,
            &right,
            join_type,
            filter,
            NullEquality::NullEqualsNothing,
            3 << 20,
            1000,
            // The probe side is not large enough for `Auto` to find the split worth it.
            |b| b.with_threads(2).with_hot_key_split(HotKeySplit::Always),
            &context,
        );
        assert!(
            m.hot_key_splits > 0,
            "{context}: the hot key should be split off: {m:?}"
        );
    }
}

/// Random joins whose build side has a dominant key, under limits that send it to the
/// fallback, with the hot key split off: every join type, with and without a filter,
/// both null equalities, 1 to 3 threads, hot probe rows or none — each compared with
/// the reference.
#[test]
fn random_dominant_key_splits_match_the_reference() {
    use rand::Rng;
    let mut splits = 0;
    let cases = 24;
    for case in 0..cases {
        let (seed, mut rng) = common::rng_for(case + 900_000);
        let join_type = JoinType::ALL[rng.random_range(0..JoinType::ALL.len())];
        let null_aware = join_type.is_null_aware();
        let filter = !null_aware && rng.random_bool(0.4);
        let null_equality = if !null_aware && rng.random_bool(0.3) {
            NullEquality::NullEqualsNull
        } else {
            NullEquality::NullEqualsNothing
        };
        let threads = rng.random_range(1..=3);
        let limit = [5 << 19, 3 << 20, 4 << 20][rng.random_range(0..3)];
        let hot_probe_every = [0, 500, 2000][rng.random_range(0..3)];
        let domain = [50, 3000][rng.random_range(0..2)];
        let right = side(
            "r",
            (0..11_000).map(|i| match i % 11 {
                0 if i % 77 == 0 => None,
                0 => Some(1000 + i % 500),
                _ => Some(7),
            }),
            400,
        );
        let probe_keys: Vec<Option<i64>> = (0..5_000)
            .map(|i| match i {
                i if i % 997 == 0 => None,
                i if hot_probe_every > 0 && i % hot_probe_every == 0 => Some(7),
                _ => Some(1000 + rng.random_range(0..domain)),
            })
            .collect();
        let left = side("l", probe_keys.into_iter(), 4);
        let context = format!(
            "case {case} (seed {seed}): {join_type} filter={filter} {null_equality:?} threads={threads} \
             limit={limit} hot_probe_every={hot_probe_every} domain={domain}"
        );
        let m = check_join(
            &left,
            &right,
            join_type,
            filter,
            null_equality,
            limit,
            700,
            |b| {
                b.with_threads(threads)
                    .with_hot_key_split(HotKeySplit::Always)
            },
            &context,
        );
        splits += (m.hot_key_splits > 0) as usize;
    }
    assert!(
        splits * 2 >= cases as usize,
        "only {splits} of {cases} cases split a hot key off"
    );
}

/// A spilled pair that swaps roles (its probe file is the smaller) is measured
/// against its level's probe rows, not its build rows: narrow probe rows, many of
/// them, once counted against the few wide build rows of their level, looked like a
/// pair that did not split, and went to the fallback for no reason.
#[test]
fn a_swapped_pair_is_not_taken_for_one_that_did_not_split() {
    // Build: 250 rows of about 3 KiB. Probe: 50 000 rows of key 7 (so that level 0's
    // probe file is the larger, and does not swap) and 16 rows of every key.
    let build = side("r", (0..250).map(Some), 3000);
    let probe = side(
        "l",
        std::iter::repeat_n(Some(7), 50_000).chain((0..4000).map(|i| Some(i % 250))),
        12,
    );
    let m = check_join(
        &probe,
        &build,
        JoinType::Inner,
        false,
        NullEquality::NullEqualsNothing,
        256 << 10,
        1000,
        |b| {
            b.with_swap_spilled_pairs(true)
                .with_partition_bits(0)
                .with_threads(1)
                .with_force_spill(0.0)
        },
        "swapped pairs",
    );
    assert!(m.max_depth >= 1 && m.swapped_pairs > 0, "{m:?}");
    assert_eq!(m.fallbacks, 0, "{m:?}");
}
