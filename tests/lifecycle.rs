//! However a spilling join ends — finished, failed, or its output dropped halfway —
//! its reservations are back at zero and its spill files are gone.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::ArrowError;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinError, JoinType};

fn batch(prefix: &str, start: i64, n: i64) -> RecordBatch {
    let k: Int64Array = (start..start + n).map(|i| Some(i % 5000)).collect();
    let s: StringArray = (start..start + n)
        .map(|i| Some(format!("{prefix}-{i}-{}", "p".repeat(40))))
        .collect();
    RecordBatch::try_from_iter(vec![
        (format!("{prefix}k"), Arc::new(k) as ArrayRef),
        (format!("{prefix}s"), Arc::new(s) as ArrayRef),
    ])
    .unwrap()
}

fn batches(prefix: &str, count: i64) -> Vec<Result<RecordBatch, ArrowError>> {
    (0..count)
        .map(|i| Ok(batch(prefix, i * 1000, 1000)))
        .collect()
}

struct Setup {
    pool: Arc<dyn MemoryPool>,
    spill: SpillManager,
    _root: tempfile::TempDir,
}

fn setup(limit: usize) -> Setup {
    let root = tempfile::tempdir().unwrap();
    Setup {
        pool: Arc::new(GreedyMemoryPool::new(limit)),
        spill: SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap(),
        _root: root,
    }
}

fn join(s: &Setup, join_type: JoinType) -> spilljoin::HashJoin {
    let (l, r) = (batch("l", 0, 1).schema(), batch("r", 0, 1).schema());
    HashJoinBuilder::new(l, r, [("lk", "rk")])
        .with_join_type(join_type)
        .with_memory_pool(Arc::clone(&s.pool))
        .with_spill_manager(s.spill.clone())
        .with_threads(2)
        .with_batch_size(1000)
        .build()
        .unwrap()
}

fn assert_clean(s: &Setup) {
    assert_eq!(s.pool.reserved(), 0, "reservations left");
    assert_eq!(s.spill.live_files(), 0, "spill files left");
    // (Besides the lock file that says the directory's owner is alive.)
    let left_on_disk = std::fs::read_dir(s.spill.dir())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != spilljoin::spill::OWNER_FILE_NAME)
        .count();
    assert_eq!(left_on_disk, 0, "files left in {}", s.spill.dir().display());
}

#[test]
fn finished_spilling_join_leaves_nothing() {
    let s = setup(2 << 20);
    let mut stream = join(&s, JoinType::Full)
        .execute(batches("l", 40), batches("r", 20))
        .unwrap();
    let rows: usize = stream.by_ref().map(|b| b.unwrap().num_rows()).sum();
    let m = stream.metrics();
    assert!(
        m.partitions_spilled > 0 && m.build_bytes_spilled > 0,
        "{m:?}"
    );
    // 40 000 left rows and 20 000 right rows over 5000 keys: every key has 8 left and
    // 4 right rows.
    assert_eq!(rows, 5000 * 8 * 4);
    assert_eq!(m.output_rows, rows as u64);
    drop(stream);
    assert_clean(&s);
}

#[test]
fn output_dropped_halfway_while_spilling_leaves_nothing() {
    let s = setup(2 << 20);
    let mut stream = join(&s, JoinType::Inner)
        .execute(batches("l", 40), batches("r", 20))
        .unwrap();
    for _ in 0..3 {
        stream.next().unwrap().unwrap();
    }
    assert!(
        s.spill.live_files() > 0,
        "the join should be spilling by now"
    );
    drop(stream);
    assert_clean(&s);
}

#[test]
fn failed_spilling_join_leaves_nothing() {
    let s = setup(2 << 20);
    let mut probe = batches("l", 40);
    probe[30] = Err(ArrowError::ComputeError("the probe input broke".into()));
    let results: Vec<_> = join(&s, JoinType::Left)
        .execute(probe, batches("r", 20))
        .unwrap()
        .collect();
    assert!(
        matches!(results.last(), Some(Err(JoinError::Input { .. }))),
        "{:?}",
        results.last()
    );
    assert_clean(&s);
}

#[test]
fn a_limit_below_the_floor_is_a_clear_error_and_leaves_nothing() {
    let s = setup(16 << 10);
    let results: Vec<_> = join(&s, JoinType::Inner)
        .execute(batches("l", 4), batches("r", 4))
        .unwrap()
        .collect();
    match results.last() {
        Some(Err(JoinError::ResourcesExhausted {
            consumer,
            requested_bytes,
            available_bytes,
            ..
        })) => {
            assert!(
                requested_bytes > available_bytes,
                "{consumer}: {requested_bytes} > {available_bytes}"
            );
        }
        other => panic!("expected ResourcesExhausted, got {other:?}"),
    }
    assert_clean(&s);
}

/// Dropped while spilled pairs are being joined: at the next level (forced at level
/// 0), or in the chunked fallback (forced at every level, allowed no recursion).
#[test]
fn output_dropped_while_joining_spilled_pairs_or_in_the_fallback_leaves_nothing() {
    for max_depth in [spilljoin::MAX_DEPTH, 0] {
        let s = setup(64 << 20);
        let (l, r) = (batch("l", 0, 1).schema(), batch("r", 0, 1).schema());
        let mut stream = HashJoinBuilder::new(l, r, [("lk", "rk")])
            .with_join_type(JoinType::Full)
            .with_memory_pool(Arc::clone(&s.pool))
            .with_spill_manager(s.spill.clone())
            .with_threads(2)
            .with_batch_size(1000)
            .with_force_spill(1.0)
            .with_force_spill_depth(spilljoin::MAX_DEPTH)
            .with_max_depth(max_depth)
            .build()
            .unwrap()
            .execute(batches("l", 40), batches("r", 20))
            .unwrap();
        // Every partition spilled: the first output comes from the spilled pairs.
        stream.next().unwrap().unwrap();
        let m = stream.metrics();
        assert_eq!(m.phase, spilljoin::JoinPhase::SpilledPairs, "{m:?}");
        if max_depth == 0 {
            assert!(m.fallbacks > 0, "{m:?}");
        }
        assert!(s.spill.live_files() > 0, "{m:?}");
        drop(stream);
        assert_clean(&s);
    }
}

#[test]
fn a_disk_quota_reached_is_a_spill_error_and_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let s = Setup {
        pool: Arc::new(GreedyMemoryPool::new(2 << 20)),
        spill: SpillManager::new(
            SpillConfig::default()
                .with_root_dir(root.path())
                .with_disk_quota_bytes(100_000),
        )
        .unwrap(),
        _root: root,
    };
    let results: Vec<_> = join(&s, JoinType::Inner)
        .execute(batches("l", 40), batches("r", 20))
        .unwrap()
        .collect();
    assert!(
        matches!(results.last(), Some(Err(JoinError::Spill(_)))),
        "{:?}",
        results.last()
    );
    assert_clean(&s);
}

#[test]
fn cancelled_from_another_thread_ends_with_cancelled_and_leaves_nothing() {
    let s = setup(2 << 20);
    let mut stream = join(&s, JoinType::Full)
        .execute(batches("l", 40), batches("r", 20))
        .unwrap();
    stream.next().unwrap().unwrap();
    let progress = stream.metrics_handle();
    assert!(progress.metrics().build_rows > 0);
    let handle = stream.cancel_handle();
    std::thread::spawn(move || handle.cancel()).join().unwrap();
    // Batches already queued may still arrive; then the error, then the end.
    let rest: Vec<_> = stream.by_ref().collect();
    assert!(
        matches!(rest.last(), Some(Err(JoinError::Cancelled))),
        "{:?}",
        rest.last()
    );
    assert!(rest.len() < 40, "the join went on after the cancel");
    assert!(stream.next().is_none());
    assert_eq!(progress.metrics().phase, spilljoin::JoinPhase::Done);
    drop(stream);
    assert_clean(&s);
}

/// Found in review: a build batch whose wide rows are bunched together is partitioned
/// in pieces small enough for the limit, as it was before pieces grew with memory.
#[test]
fn a_batch_with_bunched_wide_rows_fits_where_small_batches_do() {
    let n = 612_000usize;
    let wide = "w".repeat(2_500);
    let k: Int64Array = (0..n as i64).map(Some).collect();
    let s: StringArray = (0..n)
        .map(|i| Some(if i < 12_000 { wide.as_str() } else { "" }))
        .collect();
    let build = RecordBatch::try_from_iter(vec![
        ("rk", Arc::new(k) as ArrayRef),
        ("rs", Arc::new(s) as ArrayRef),
    ])
    .unwrap();
    let probe = batch("l", 0, 1000);
    let root = tempfile::tempdir().unwrap();
    let s = Setup {
        pool: Arc::new(GreedyMemoryPool::new(24 << 20)),
        spill: SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap(),
        _root: root,
    };
    let join = HashJoinBuilder::new(probe.schema(), build.schema(), [("lk", "rk")])
        .with_memory_pool(Arc::clone(&s.pool))
        .with_spill_manager(s.spill.clone())
        .with_threads(1)
        .build()
        .unwrap();
    let rows: usize = join
        .execute(vec![Ok(probe)], vec![Ok(build)])
        .unwrap()
        .map(|b| b.map(|b| b.num_rows()))
        .sum::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rows, 1000);
    assert_clean(&s);
}

/// Found in review: large build batches do not make the build hold back more room
/// for the probe (which works in batch-size pieces): at every limit, a build read in
/// 65536-row batches spills no more than the same build read in 8192-row batches
/// under 64 KiB less. (The bug held back three whole batches per worker, megabytes
/// here. The 64 KiB: the two builds' buffers differ in size by a few KiB, and at
/// 48 MiB the 8192-row build keeps a partition by 12 KiB that the other spills.)
/// Compared by partitions spilled, and by rows within 0.5%: which of partitions of
/// nearly equal size is the largest when a reservation fails depends on how the two
/// workers' pieces interleave (the same three partitions' worth at 48 MiB spilled
/// 75068, 75209 or 75232 rows from run to run).
#[test]
fn large_build_batches_do_not_spill_what_small_ones_keep() {
    let n = 400_000i64;
    let make = |rows_per_batch: i64| -> Vec<Result<RecordBatch, ArrowError>> {
        (0..n)
            .step_by(rows_per_batch as usize)
            .map(|start| {
                let end = (start + rows_per_batch).min(n);
                let k: Int64Array = (start..end).map(Some).collect();
                let s: StringArray = (start..end).map(|i| Some(format!("{i:0100}"))).collect();
                Ok(RecordBatch::try_from_iter(vec![
                    ("rk", Arc::new(k) as ArrayRef),
                    ("rs", Arc::new(s) as ArrayRef),
                ])
                .unwrap())
            })
            .collect()
    };
    let probe = batch("l", 0, 1000);
    for limit_mib in [48, 52, 56, 60, 64, 70] {
        let mut spilled = Vec::new();
        for (rows_per_batch, limit) in [
            (8192, (limit_mib << 20) - (64 << 10)),
            (65536, limit_mib << 20),
        ] {
            let s = setup(limit);
            let build = make(rows_per_batch);
            let schema = build[0].as_ref().unwrap().schema();
            let join = HashJoinBuilder::new(probe.schema(), schema, [("lk", "rk")])
                .with_memory_pool(Arc::clone(&s.pool))
                .with_spill_manager(s.spill.clone())
                .with_threads(2)
                .build()
                .unwrap();
            let mut stream = join.execute(vec![Ok(probe.clone())], build).unwrap();
            let rows: usize = stream.by_ref().map(|b| b.unwrap().num_rows()).sum();
            assert_eq!(rows, 1000);
            let m = stream.metrics();
            spilled.push((m.partitions_spilled, m.build_rows_spilled));
            drop(stream);
            assert_clean(&s);
        }
        let ((large_parts, large_rows), (small_parts, small_rows)) = (spilled[1], spilled[0]);
        assert!(
            large_parts <= small_parts && large_rows <= small_rows + small_rows / 200,
            "at {limit_mib} MiB: 65536-row batches spilled {large_parts} partitions \
             ({large_rows} rows), 8192-row batches {small_parts} ({small_rows}) (64 KiB less)"
        );
    }
}

/// Just above the floor, a build of few partitions, each about as large as what is
/// left of the limit, must still finish: when a partition's transient copy does not
/// fit, spilling may spill that very partition, and what is needed is looked at again
/// (SF10 customer ⋈ orders at 3.4 MiB once failed here while 1.7 MiB finished).
#[test]
fn limits_just_above_the_floor_finish_with_few_large_partitions() {
    use arrow_array::Decimal128Array;
    use spilljoin::InputStatistics;
    let n = 1_500_000i64;
    let build: Vec<RecordBatch> = (0..n)
        .step_by(65536)
        .map(|start| {
            let end = (start + 65536).min(n);
            let k: Int64Array = (start..end).map(|i| Some(i * 7 % n)).collect();
            let v: Decimal128Array = (start..end).map(|i| Some(i as i128)).collect();
            RecordBatch::try_from_iter(vec![
                ("rk", Arc::new(k) as ArrayRef),
                (
                    "rv",
                    Arc::new(v.with_precision_and_scale(15, 2).unwrap()) as ArrayRef,
                ),
            ])
            .unwrap()
        })
        .collect();
    let probe: Vec<RecordBatch> = (0..n)
        .step_by(8192)
        .map(|start| {
            let end = (start + 8192).min(n);
            let k: Int64Array = (start..end).map(Some).collect();
            RecordBatch::try_from_iter(vec![("lk", Arc::new(k) as ArrayRef)]).unwrap()
        })
        .collect();
    let bytes = |batches: &[RecordBatch]| -> u64 {
        batches
            .iter()
            .map(|b| b.get_array_memory_size() as u64)
            .sum()
    };
    for limit_kib in [3072, 3328, 3515, 3840] {
        let s = setup(limit_kib << 10);
        let join = HashJoinBuilder::new(probe[0].schema(), build[0].schema(), [("lk", "rk")])
            .with_memory_pool(Arc::clone(&s.pool))
            .with_spill_manager(s.spill.clone())
            .with_threads(2)
            .with_statistics(
                InputStatistics {
                    bytes: Some(bytes(&probe)),
                    rows: Some(n as u64),
                },
                InputStatistics {
                    bytes: Some(bytes(&build)),
                    rows: Some(n as u64),
                },
            )
            .with_side_swap(false)
            .build()
            .unwrap();
        let mut stream = join
            .execute(
                probe.iter().cloned().map(Ok).collect::<Vec<_>>(),
                build.iter().cloned().map(Ok).collect::<Vec<_>>(),
            )
            .unwrap();
        let rows: usize = stream
            .by_ref()
            .map(|b| match b {
                Ok(b) => b.num_rows(),
                Err(e) => panic!("at {limit_kib} KiB: {e}"),
            })
            .sum();
        assert_eq!(rows, n as usize, "at {limit_kib} KiB");
        drop(stream);
        assert_clean(&s);
    }
}
