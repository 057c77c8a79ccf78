//! Prepared builds and the build cache: one build probed by many joins (of any type,
//! at once, under memory limits that spill) gives each the reference answer; attaching
//! a build to a join it does not fit is an error; memory and files go with the last
//! handle; output never borrows the build's buffers; the cache builds once per key,
//! shares failures and evicts what nobody holds.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use arrow_array::{
    Array, ArrayRef, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringViewArray,
};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use common::*;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{
    BuildCache, BuildKey, HashJoin, HashJoinBuilder, JoinError, JoinType, NullEquality,
    PreparedBuild,
};

fn join_of(
    left: &RecordBatch,
    right: &RecordBatch,
    join_type: JoinType,
    filter: bool,
    pool: &Arc<dyn MemoryPool>,
) -> HashJoin {
    let mut b = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
        .with_join_type(join_type)
        .with_batch_size(50)
        .with_threads(2)
        .with_memory_pool(Arc::clone(pool));
    if filter {
        b = b.with_filter(less_than_filter(&left.schema(), &right.schema()));
    }
    b.build().unwrap()
}

fn probe(join: &HashJoin, prepared: &PreparedBuild, left: &RecordBatch) -> Vec<String> {
    let (_, mut rng) = rng_for(left.num_rows() as u64);
    let input: Vec<_> = split(&mut rng, left, 30).into_iter().map(Ok).collect();
    let output: Vec<RecordBatch> = join
        .execute_prepared(prepared.clone(), input)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{}: {e}", join.join_type()));
    rendered_rows(&output)
}

fn data(seed: u64, build_rows: usize) -> (RecordBatch, RecordBatch) {
    let (_, mut rng) = rng_for(seed);
    let left = side(&mut rng, "l", &[DataType::Int64], 700, 80, 0.1);
    let right = side(&mut rng, "r", &[DataType::Int64], build_rows, 80, 0.1);
    (left, right)
}

/// Every join type attaches to one build prepared for a full join (which keeps every
/// build row), in memory and with half its partitions spilled.
#[test]
fn one_build_serves_every_join_type() {
    let (left, right) = data(1, 400);
    for force in [0.0, 0.5, 1.0] {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(usize::MAX));
        let prepared = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
            .with_join_type(JoinType::Full)
            .with_memory_pool(Arc::clone(&pool))
            .with_force_spill(force)
            .build()
            .unwrap()
            .prepare(vec![Ok(right.clone())])
            .unwrap();
        assert_eq!(prepared.num_rows(), 400);
        assert_eq!(prepared.spilled_partitions() > 0, force > 0.0);
        for join_type in JoinType::ALL {
            for filter in [false, true] {
                if filter && join_type.is_null_aware() {
                    continue;
                }
                let expected = reference_join(
                    &left,
                    &right,
                    &[(0, 0)],
                    join_type,
                    filter,
                    NullEquality::NullEqualsNothing,
                );
                let join = join_of(&left, &right, join_type, filter, &pool);
                // Twice: a probe leaves nothing behind for the next.
                for round in 0..2 {
                    assert_eq!(
                        probe(&join, &prepared, &left),
                        expected,
                        "{join_type} filter={filter} force={force} round {round}"
                    );
                }
            }
        }
        assert_eq!(prepared.handles(), 1);
        assert_eq!(pool.reserved(), prepared.memory_bytes());
        drop(prepared);
        assert_eq!(pool.reserved(), 0);
    }
}

/// Many threads probe one build at once, under a memory limit that made the build
/// spill, each with other probe rows and another join type.
#[test]
fn many_threads_probe_one_build_under_a_memory_limit() {
    let (_, mut rng) = rng_for(5);
    let right = side(&mut rng, "r", &[DataType::Int64], 6000, 500, 0.05);
    let root = tempfile::tempdir().unwrap();
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(8 << 20));
    let prepared = HashJoinBuilder::new(
        side(&mut rng, "l", &[DataType::Int64], 1, 1, 0.0).schema(),
        right.schema(),
        [("lk0", "rk0")],
    )
    .with_join_type(JoinType::Full)
    .with_memory_pool(Arc::clone(&pool))
    .with_spill_manager(spill.clone())
    .with_force_spill(0.5)
    .build()
    .unwrap()
    .prepare(vec![Ok(right.clone())])
    .unwrap();
    assert!(prepared.spilled_partitions() > 0);
    let threads = 8;
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (prepared, pool, right, barrier) = (&prepared, &pool, &right, &barrier);
            scope.spawn(move || {
                let (_, mut rng) = rng_for(100 + t as u64);
                let left = side(&mut rng, "l", &[DataType::Int64], 900, 500, 0.05);
                let join_type = JoinType::ALL[t % JoinType::ALL.len()];
                let filter = t % 3 == 0 && !join_type.is_null_aware();
                let join = join_of(&left, right, join_type, filter, pool);
                let expected = reference_join(
                    &left,
                    right,
                    &[(0, 0)],
                    join_type,
                    filter,
                    NullEquality::NullEqualsNothing,
                );
                barrier.wait();
                assert_eq!(
                    probe(&join, prepared, &left),
                    expected,
                    "{join_type} thread {t}"
                );
            });
        }
    });
    assert_eq!(pool.reserved(), prepared.memory_bytes());
    assert!(
        spill.live_files() > 0,
        "the build's spilled partitions stay for later probes"
    );
    drop(prepared);
    assert_eq!(pool.reserved(), 0);
    assert_eq!(spill.live_files(), 0);
}

#[test]
fn attaching_to_a_join_it_does_not_fit_is_an_error() {
    let (left, right) = data(2, 50);
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(usize::MAX));
    let prepared = join_of(&left, &right, JoinType::Inner, false, &pool)
        .prepare(vec![Ok(right.clone())])
        .unwrap();
    let mismatch = |join: HashJoin, what: &str| match join
        .execute_prepared(prepared.clone(), vec![Ok(left.clone())])
    {
        Err(JoinError::PreparedBuildMismatch(message)) => {
            assert!(
                message.contains(what),
                "{message:?} should mention {what:?}"
            )
        }
        Err(e) => panic!("expected a mismatch about {what}, got {e}"),
        Ok(_) => panic!("expected a mismatch about {what}"),
    };
    let builder = || HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")]);
    // Other key columns.
    mismatch(
        HashJoinBuilder::new(left.schema(), right.schema(), [("lv", "rv")])
            .build()
            .unwrap(),
        "keys",
    );
    // Other null equality.
    mismatch(
        builder()
            .with_null_equality(NullEquality::NullEqualsNull)
            .build()
            .unwrap(),
        "null equality",
    );
    // A join that outputs build rows with null keys, which an inner build dropped.
    mismatch(
        builder().with_join_type(JoinType::Right).build().unwrap(),
        "null",
    );
    // The other input builds.
    mismatch(
        builder()
            .with_statistics(
                spilljoin::InputStatistics::new(Some(1), None),
                spilljoin::InputStatistics::new(Some(2), None),
            )
            .build()
            .unwrap(),
        "input",
    );
    // Another build schema (same key).
    let (_, mut rng) = rng_for(3);
    let other = side(
        &mut rng,
        "r",
        &[DataType::Int64, DataType::Int32],
        5,
        5,
        0.0,
    );
    mismatch(
        HashJoinBuilder::new(left.schema(), other.schema(), [("lk0", "rk0")])
            .build()
            .unwrap(),
        "schema",
    );
    // A compatible join of another type and filter works.
    let expected = reference_join(
        &left,
        &right,
        &[(0, 0)],
        JoinType::LeftSemi,
        true,
        NullEquality::NullEqualsNothing,
    );
    let semi = join_of(&left, &right, JoinType::LeftSemi, true, &pool);
    assert_eq!(probe(&semi, &prepared, &left), expected);
}

/// Every buffer of an array, as address ranges, children and dictionaries included.
fn ranges(data: &ArrayData, out: &mut Vec<(usize, usize)>) {
    for b in data.buffers() {
        if !b.is_empty() {
            out.push((b.as_ptr() as usize, b.as_ptr() as usize + b.len()));
        }
    }
    for child in data.child_data() {
        ranges(child, out);
    }
}

#[test]
fn output_never_borrows_the_build_buffers() {
    let n = 3000;
    let keys: ArrayRef = Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 100)));
    let views: ArrayRef =
        Arc::new(StringViewArray::from_iter_values((0..n).map(|i| {
            format!("a long enough string to live in a data buffer {i}")
        })));
    let dict: ArrayRef = Arc::new(
        DictionaryArray::<arrow_array::types::Int32Type>::try_new(
            Int32Array::from_iter_values((0..n as i32).map(|i| i % 7)),
            Arc::new(arrow_array::StringArray::from_iter_values(
                (0..7).map(|i| format!("value {i}")),
            )),
        )
        .unwrap(),
    );
    let right =
        RecordBatch::try_from_iter([("rk", keys.clone()), ("rview", views), ("rdict", dict)])
            .unwrap();
    let left = RecordBatch::try_from_iter([("lk", keys)]).unwrap();
    let mut build_ranges = Vec::new();
    for c in right.columns() {
        ranges(&c.to_data(), &mut build_ranges);
    }
    let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_join_type(JoinType::Inner)
        .with_threads(2)
        .build()
        .unwrap();
    let prepared = join.prepare(vec![Ok(right.clone())]).unwrap();
    let output: Vec<RecordBatch> = join
        .execute_prepared(prepared, vec![Ok(left.clone())])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let rows: usize = output.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 100 * 30 * 30);
    for batch in &output {
        for (i, column) in batch.columns().iter().enumerate().skip(1) {
            let mut out = Vec::new();
            ranges(&column.to_data(), &mut out);
            for (a, b) in out {
                for &(c, d) in &build_ranges {
                    assert!(
                        b <= c || d <= a,
                        "output column {i} shares a buffer with the build input"
                    );
                }
            }
        }
    }
}

#[test]
fn key_bounds_and_membership() {
    let (left, right) = data(4, 300);
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(usize::MAX));
    for force in [0.0, 1.0] {
        let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
            .with_memory_pool(Arc::clone(&pool))
            .with_force_spill(force)
            .build()
            .unwrap();
        let prepared = join.prepare(vec![Ok(right.clone())]).unwrap();
        let keys = right
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let bounds = prepared.key_bounds();
        let b = bounds[0].as_ref().unwrap();
        let (min, max) = (
            keys.iter().flatten().min().unwrap(),
            keys.iter().flatten().max().unwrap(),
        );
        assert_eq!(b.min.as_ref(), &Int64Array::from(vec![min]) as &dyn Array);
        assert_eq!(b.max.as_ref(), &Int64Array::from(vec![max]) as &dyn Array);
        // Every build key is a member; null is not; far-away keys (mostly) are not.
        let members = prepared.may_contain(&[right.column(0).clone()]).unwrap();
        for r in 0..right.num_rows() {
            assert_eq!(members.value(r), keys.is_valid(r), "row {r}");
        }
        let strangers: ArrayRef = Arc::new(Int64Array::from_iter_values(1_000_000..1_010_000));
        let hits = prepared.may_contain(&[strangers]).unwrap().true_count();
        // Bloom filters: a few false positives.
        assert!(hits <= 500, "{hits} false members of 10000 (force {force})");
        assert!(prepared
            .may_contain(&[Arc::new(Int32Array::from(vec![1])) as ArrayRef])
            .is_err());
    }
}

fn small_build(seed: u64, rows: usize) -> (HashJoin, RecordBatch, Arc<dyn MemoryPool>) {
    let (left, right) = data(seed, rows);
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(usize::MAX));
    (
        join_of(&left, &right, JoinType::Inner, false, &pool),
        right,
        pool,
    )
}

#[test]
fn the_cache_builds_each_key_once_for_concurrent_requests() {
    let (join, right, pool) = small_build(6, 2000);
    let cache = BuildCache::new(1 << 30);
    let builds = AtomicUsize::new(0);
    let barrier = Barrier::new(20);
    let results: Vec<PreparedBuild> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    cache
                        .get_or_prepare(BuildKey::new("dim", 1), || {
                            builds.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            join.prepare(vec![Ok(right.clone())])
                        })
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    // All share one build: 20 handles and the cache's.
    assert_eq!(results[0].handles(), 21);
    assert_eq!(cache.len(), 1);
    drop(results);
    drop(cache);
    assert_eq!(pool.reserved(), 0);
}

#[test]
fn a_failed_build_wakes_every_waiter_with_its_error_and_is_not_cached() {
    let cache = BuildCache::new(1 << 30);
    let builds = AtomicUsize::new(0);
    let barrier = Barrier::new(20);
    let errors: Vec<JoinError> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    cache
                        .get_or_prepare(BuildKey::new("dim", 1), || {
                            builds.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            Err(JoinError::InvalidJoin("the build input broke".into()))
                        })
                        .unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    for e in &errors {
        assert!(matches!(e, JoinError::SharedBuildFailed(_)), "{e}");
        assert!(e.to_string().contains("the build input broke"), "{e}");
    }
    assert!(cache.is_empty());
    // The next request builds again.
    let (join, right, _pool) = small_build(7, 10);
    cache
        .get_or_prepare(BuildKey::new("dim", 1), || {
            join.prepare(vec![Ok(right.clone())])
        })
        .unwrap();
    assert_eq!(cache.len(), 1);
}

#[test]
fn the_cache_evicts_least_recently_used_builds_nobody_holds() {
    let (join, right, pool) = small_build(8, 3000);
    let one = join
        .prepare(vec![Ok(right.clone())])
        .unwrap()
        .memory_bytes();
    // Room for two builds.
    let cache = BuildCache::new(one * 2 + one / 2);
    let prepare = || join.prepare(vec![Ok(right.clone())]);
    let a = cache
        .get_or_prepare(BuildKey::new("a", 1), prepare)
        .unwrap();
    drop(
        cache
            .get_or_prepare(BuildKey::new("b", 1), prepare)
            .unwrap(),
    );
    // `a` is used more recently than `b`, but it is held: `b` goes first anyway, then
    // nothing else can (c is held by the caller while inserted).
    drop(
        cache
            .get_or_prepare(BuildKey::new("c", 1), prepare)
            .unwrap(),
    );
    assert!(cache.contains(&BuildKey::new("a", 1)));
    assert!(
        !cache.contains(&BuildKey::new("b", 1)),
        "b was the least recently used"
    );
    assert!(cache.contains(&BuildKey::new("c", 1)));
    // Over the budget while everything is held; within it after a trim.
    let d = cache
        .get_or_prepare(BuildKey::new("d", 1), prepare)
        .unwrap();
    assert_eq!(
        cache.len(),
        2,
        "c (unheld, least recent) should have been evicted"
    );
    assert!(!cache.contains(&BuildKey::new("c", 1)));
    drop((a, d));
    cache.trim();
    assert!(cache.cached_bytes() <= one * 2 + one / 2);
    // A new version replaces the old one.
    cache
        .get_or_prepare(BuildKey::new("d", 2), prepare)
        .unwrap();
    assert!(!cache.contains(&BuildKey::new("d", 1)));
    cache.invalidate("d");
    assert!(!cache.contains(&BuildKey::new("d", 2)));
    drop(cache);
    assert_eq!(pool.reserved(), 0);
}

/// Where the join says unmatchable probe rows may be skipped, dropping the rows that
/// `may_contain` rules out gives the reference answer.
#[test]
fn skipping_unmatchable_probe_rows_keeps_the_answer_where_allowed() {
    let (left, right) = data(9, 200);
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(usize::MAX));
    for join_type in JoinType::ALL {
        for build_left in [false, true] {
            let stats = |small: bool| {
                spilljoin::InputStatistics::new(Some(if small { 1 } else { 2 }), None)
            };
            let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
                .with_join_type(join_type)
                .with_statistics(stats(build_left), stats(!build_left))
                .with_memory_pool(Arc::clone(&pool))
                .build()
                .unwrap();
            let (build, probe_batch) = if build_left {
                (&left, &right)
            } else {
                (&right, &left)
            };
            let prepared = join.prepare(vec![Ok(build.clone())]).unwrap();
            let keep = prepared
                .may_contain(&[probe_batch.column(0).clone()])
                .unwrap();
            let pruned = arrow_select::filter::filter_record_batch(probe_batch, &keep).unwrap();
            let (l, r) = if build_left {
                (build.clone(), pruned)
            } else {
                (pruned, build.clone())
            };
            let expected = reference_join(
                &left,
                &right,
                &[(0, 0)],
                join_type,
                false,
                NullEquality::NullEqualsNothing,
            );
            let with_pruned = reference_join(
                &l,
                &r,
                &[(0, 0)],
                join_type,
                false,
                NullEquality::NullEqualsNothing,
            );
            if join.may_skip_unmatchable_probe_rows() {
                assert_eq!(
                    with_pruned,
                    expected,
                    "{join_type} building {}",
                    if build_left { "left" } else { "right" }
                );
            }
        }
    }
}

/// `execute_partitioned_observed` shows the build before the probe is read: a probe
/// input opened lazily can drop what cannot match, and the answer is the reference's.
#[test]
fn an_observed_build_lets_a_lazy_probe_skip_rows() {
    use std::sync::OnceLock;
    let (left, right) = data(10, 300);
    for (join_type, force) in [
        (JoinType::Inner, 0.0),
        (JoinType::Right, 1.0),
        (JoinType::Left, 0.5),
    ] {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(usize::MAX));
        let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
            .with_join_type(join_type)
            .with_memory_pool(Arc::clone(&pool))
            .with_force_spill(force)
            .build()
            .unwrap();
        let slot: Arc<OnceLock<PreparedBuild>> = Arc::new(OnceLock::new());
        let skip = join.may_skip_unmatchable_probe_rows();
        let probe = {
            let (slot, left) = (Arc::clone(&slot), left.clone());
            let mut done = false;
            std::iter::from_fn(move || {
                if done {
                    return None;
                }
                done = true;
                let build = slot
                    .get()
                    .expect("the build is shown before the probe is read");
                assert!(build.key_bounds()[0].is_some());
                if !skip {
                    return Some(Ok(left.clone()));
                }
                let keep = build.may_contain(&[left.column(0).clone()]).unwrap();
                Some(Ok(
                    arrow_select::filter::filter_record_batch(&left, &keep).unwrap()
                ))
            })
        };
        let slot_for_build = Arc::clone(&slot);
        let output: Vec<RecordBatch> = join
            .execute_partitioned_observed(
                vec![probe],
                vec![vec![Ok(right.clone())].into_iter()],
                move |b| {
                    let _ = slot_for_build.set(b.clone());
                },
            )
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected = reference_join(
            &left,
            &right,
            &[(0, 0)],
            join_type,
            false,
            NullEquality::NullEqualsNothing,
        );
        assert_eq!(rendered_rows(&output), expected, "{join_type}");
        drop(slot);
        assert_eq!(pool.reserved(), 0, "{join_type}");
    }
}

/// An older version that arrives after a newer one is cached is handed out, not
/// cached next to it.
#[test]
fn the_cache_keeps_the_newest_version() {
    let (join, right, _pool) = small_build(11, 100);
    let cache = BuildCache::new(1 << 30);
    let prepare = || join.prepare(vec![Ok(right.clone())]);
    cache
        .get_or_prepare(BuildKey::new("t", 2), prepare)
        .unwrap();
    let old = cache
        .get_or_prepare(BuildKey::new("t", 1), prepare)
        .unwrap();
    assert_eq!(old.num_rows(), 100);
    assert!(cache.contains(&BuildKey::new("t", 2)));
    assert!(!cache.contains(&BuildKey::new("t", 1)));
    assert_eq!(cache.len(), 1);
}

/// Found in review: a prepared join's output copies only the dictionary values its
/// keys use, not the whole dictionary per batch.
#[test]
fn prepared_output_copies_only_the_dictionary_values_it_uses() {
    let n = 50_000;
    let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n));
    let dict: ArrayRef = Arc::new(
        DictionaryArray::<arrow_array::types::Int32Type>::try_new(
            Int32Array::from_iter_values(0..n as i32),
            Arc::new(arrow_array::StringArray::from_iter_values(
                (0..n).map(|i| format!("value {i}")),
            )),
        )
        .unwrap(),
    );
    let right = RecordBatch::try_from_iter([("rk", keys.clone()), ("rdict", dict)]).unwrap();
    let left = RecordBatch::try_from_iter([("lk", keys)]).unwrap();
    let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_batch_size(1000)
        .build()
        .unwrap();
    let prepared = join.prepare(vec![Ok(right)]).unwrap();
    let output: Vec<RecordBatch> = join
        .execute_prepared(prepared, vec![Ok(left)])
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        output.iter().map(|b| b.num_rows()).sum::<usize>(),
        n as usize
    );
    for batch in &output {
        let values = batch
            .column(2)
            .as_any()
            .downcast_ref::<DictionaryArray<arrow_array::types::Int32Type>>()
            .unwrap()
            .values()
            .len();
        assert!(
            values <= batch.num_rows(),
            "{values} values for {} rows",
            batch.num_rows()
        );
    }
}

/// Found in review: key columns of different lengths are an error, not a panic.
#[test]
fn may_contain_rejects_columns_of_different_lengths() {
    let (_, mut rng) = rng_for(12);
    let right = side(
        &mut rng,
        "r",
        &[DataType::Int64, DataType::Utf8],
        20,
        5,
        0.0,
    );
    let left = side(
        &mut rng,
        "l",
        &[DataType::Int64, DataType::Utf8],
        20,
        5,
        0.0,
    );
    let join = HashJoinBuilder::new(
        left.schema(),
        right.schema(),
        [("lk0", "rk0"), ("lk1", "rk1")],
    )
    .build()
    .unwrap();
    let prepared = join.prepare(vec![Ok(right)]).unwrap();
    let err = prepared
        .may_contain(&[
            Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            Arc::new(arrow_array::StringArray::from(vec!["a", "b"])) as ArrayRef,
        ])
        .unwrap_err();
    assert!(err.to_string().contains("different lengths"), "{err}");
}

/// Found in review: key bounds of view-typed keys keep nothing of the input alive.
#[test]
fn bounds_of_view_keys_are_small() {
    let n = 20_000;
    let keys: ArrayRef =
        Arc::new(StringViewArray::from_iter_values((0..n).map(|i| {
            format!("a string long enough to be out of line {i:06}")
        })));
    let right = RecordBatch::try_from_iter([("rk", keys.clone())]).unwrap();
    let left = RecordBatch::try_from_iter([("lk", keys)]).unwrap();
    let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .build()
        .unwrap();
    let prepared = join.prepare(vec![Ok(right)]).unwrap();
    let bounds = prepared.key_bounds();
    let b = bounds[0].as_ref().unwrap();
    assert!(
        b.min.get_array_memory_size() < 4096,
        "{}",
        b.min.get_array_memory_size()
    );
    assert!(
        b.max.get_array_memory_size() < 4096,
        "{}",
        b.max.get_array_memory_size()
    );
}

/// Found in review: a build of an identity invalidated while it is built is handed to
/// the requests waiting for it, but not cached.
#[test]
fn a_build_invalidated_while_building_is_not_cached() {
    let (join, right, _pool) = small_build(13, 100);
    let cache = BuildCache::new(1 << 30);
    let started = Barrier::new(2);
    std::thread::scope(|scope| {
        let handle = scope.spawn(|| {
            cache.get_or_prepare(BuildKey::new("t", 1), || {
                started.wait();
                std::thread::sleep(std::time::Duration::from_millis(100));
                join.prepare(vec![Ok(right.clone())])
            })
        });
        started.wait();
        cache.invalidate("t");
        assert_eq!(handle.join().unwrap().unwrap().num_rows(), 100);
    });
    assert!(!cache.contains(&BuildKey::new("t", 1)));
}
