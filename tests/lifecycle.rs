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
    let left_on_disk = std::fs::read_dir(s.spill.dir()).unwrap().count();
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
