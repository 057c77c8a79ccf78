//! What a spilled row costs on disk: a one-word key is hashed again when its file is
//! read back, so its spill files hold only the input's columns; wider keys keep their
//! 64-bit hash as a column, so they are hashed once whatever the depth. `Int64`
//! columns whose values fit in 32 bits are written in 4 bytes.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::ArrowError;
use spilljoin::memory::UnboundedMemoryPool;
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinMetrics, JoinType};

const ROWS: i64 = 20_000;

/// `ROWS` rows of two Int64 columns named `{prefix}a` and `{prefix}b`, no nulls.
fn input(prefix: &str) -> Vec<Result<RecordBatch, ArrowError>> {
    input_of(prefix, ROWS, 1000)
}

/// `rows` rows (`a` counts from 0, `b = 7a`) of two Int64 columns named `{prefix}a`
/// and `{prefix}b`, in batches of `batch_rows`.
fn input_of(prefix: &str, rows: i64, batch_rows: i64) -> Vec<Result<RecordBatch, ArrowError>> {
    (0..(rows + batch_rows - 1) / batch_rows)
        .map(|i| {
            let range = i * batch_rows..((i + 1) * batch_rows).min(rows);
            let a: Int64Array = range.clone().collect();
            let b: Int64Array = range.map(|v| v * 7).collect();
            Ok(RecordBatch::try_from_iter(vec![
                (format!("{prefix}a"), Arc::new(a) as ArrayRef),
                (format!("{prefix}b"), Arc::new(b) as ArrayRef),
            ])
            .unwrap())
        })
        .collect()
}

/// Joins `probe` and `build` on `on` with the builder `configure` sets up (an inner
/// join unless it says otherwise) and drains the output: its rows and the metrics.
fn drain(
    probe: Vec<Result<RecordBatch, ArrowError>>,
    build: Vec<Result<RecordBatch, ArrowError>>,
    on: (&str, &str),
    configure: impl FnOnce(HashJoinBuilder) -> HashJoinBuilder,
) -> (usize, JoinMetrics) {
    let schema = |b: &[Result<RecordBatch, ArrowError>]| b[0].as_ref().unwrap().schema();
    // (These figures count one write a row: pin forced spilling to level 0, whatever
    // `SPILLJOIN_FORCE_SPILL_DEPTH` says.)
    let builder =
        HashJoinBuilder::new(schema(&probe), schema(&build), [on]).with_force_spill_depth(0);
    let mut stream = configure(builder)
        .build()
        .unwrap()
        .execute(probe, build)
        .unwrap();
    let rows: usize = stream.by_ref().map(|b| b.unwrap().num_rows()).sum();
    (rows, stream.metrics())
}

/// Runs an inner join on `on` with every build partition spilled; returns its
/// metrics after checking that every row found its one partner.
fn spilled_join(on: &[(&str, &str)]) -> JoinMetrics {
    let root = tempfile::tempdir().unwrap();
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
    let schema = |p: &str| input(p)[0].as_ref().unwrap().schema();
    let mut stream = HashJoinBuilder::new(schema("l"), schema("r"), on.iter().copied())
        .with_join_type(JoinType::Inner)
        .with_memory_pool(Arc::new(UnboundedMemoryPool::new()))
        .with_spill_manager(spill)
        .with_force_spill(1.0)
        .with_force_spill_depth(0)
        .with_threads(1)
        .build()
        .unwrap()
        .execute(input("l"), input("r"))
        .unwrap();
    let rows: usize = stream.by_ref().map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, ROWS as usize);
    let m = stream.metrics();
    assert_eq!(m.build_rows_spilled, ROWS as u64, "{m:?}");
    m
}

#[test]
fn a_word_key_spills_only_the_input_columns() {
    let m = spilled_join(&[("la", "ra")]);
    // Two Int64 columns whose values fit in 32 bits, written as 4 bytes each: 8
    // bytes a row, plus IPC framing (a few hundred bytes a message); written 8
    // bytes wide they would take 16, and a hash column would add 8.
    let per_row = m.build_bytes_spilled as f64 / ROWS as f64;
    assert!(per_row < 10.0, "{per_row} bytes a spilled build row");
    let per_row = m.probe_bytes_spilled as f64 / m.probe_rows_spilled as f64;
    assert!(per_row < 10.0, "{per_row} bytes a spilled probe row");
}

#[test]
fn a_composite_key_spills_its_hash() {
    let m = spilled_join(&[("la", "ra"), ("lb", "rb")]);
    // The two columns in 4 bytes each, the hash in 8.
    let per_row = m.build_bytes_spilled as f64 / ROWS as f64;
    assert!(
        (16.0..19.0).contains(&per_row),
        "{per_row} bytes a spilled build row"
    );
}

/// A spilled partition's bloom filter keeps ruling out probe rows that cannot match
/// for as long as it rules out many (it is switched off only when it rules out few).
#[test]
fn a_selective_bloom_filter_keeps_probe_rows_off_disk() {
    let root = tempfile::tempdir().unwrap();
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
    // Build keys 0, 100, 200, ...; probe keys 0..400 000: 1% have a partner.
    let build: Vec<Result<RecordBatch, ArrowError>> = (0..4)
        .map(|i| {
            let k: Int64Array = (i * 1000..(i + 1) * 1000).map(|v| v * 100).collect();
            Ok(RecordBatch::try_from_iter(vec![("rk", Arc::new(k) as ArrayRef)]).unwrap())
        })
        .collect();
    let probe: Vec<Result<RecordBatch, ArrowError>> = (0..50)
        .map(|i| {
            let k: Int64Array = (i * 8000..(i + 1) * 8000).collect();
            Ok(RecordBatch::try_from_iter(vec![("lk", Arc::new(k) as ArrayRef)]).unwrap())
        })
        .collect();
    let (rows, m) = drain(probe, build, ("lk", "rk"), |b| {
        b.with_memory_pool(Arc::new(UnboundedMemoryPool::new()))
            .with_spill_manager(spill)
            .with_force_spill(1.0)
            .with_partition_bits(1)
            .with_threads(1)
    });
    assert_eq!(rows, 4000);
    // 396 000 probe rows cannot match; a 1%-false-positive filter lets few through,
    // over 200 000 rows a partition (well past the filter's trial).
    assert!(m.probe_rows_skipped > 380_000, "{m:?}");
    assert!(m.probe_rows_spilled < 20_000, "{m:?}");
}

/// Under a small limit, spilled partitions' build rows are written in batches of
/// many rows, not drained a few rows at a time whenever memory runs short while
/// other partitions are still in memory (each batch is one IPC message and one
/// write).
#[test]
fn spilled_build_rows_are_not_written_a_few_at_a_time() {
    const BUILD_ROWS: i64 = 2_000_000;
    let root = tempfile::tempdir().unwrap();
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
    let (probe, build) = (
        input_of("l", BUILD_ROWS, 8192),
        input_of("r", BUILD_ROWS, 8192),
    );
    // 32 MB of build rows in 128 partitions under 4 MiB.
    let pool = spilljoin::memory::GreedyMemoryPool::new(4 << 20);
    let (rows, m) = drain(probe, build, ("la", "ra"), |b| {
        b.with_memory_pool(Arc::new(pool))
            .with_spill_manager(spill)
            .with_partition_bits(7)
            .with_threads(1)
    });
    assert_eq!(rows, BUILD_ROWS as usize);
    assert!(m.build_rows_spilled > BUILD_ROWS as u64 / 2, "{m:?}");
    let per_batch = m.build_rows_spilled / m.build_batches_spilled.max(1);
    // Drained at every shortage, they were written 128 rows at a time (15,039
    // batches); filled to a budget first, ~750 (2,623 batches); gathered 4 bytes a
    // value once spilled (the budget is in bytes), ~1,330 (1,464 batches).
    assert!(
        per_batch >= 1024,
        "{per_batch} rows a build batch written: {m:?}"
    );
}

/// A build whose rows are known beforehand (statistics) spills under a limit it
/// outgrows as it is read; every spilled partition gets a bloom filter sized for the
/// rows it ends with — reserved before the pool is full — so nearly all probe rows
/// without a partner stay off disk. Sized by what a partition held when it spilled
/// (the rows are not known), a filter that spilled early holds many times the rows it
/// was made for, or there was no memory left for it.
#[test]
fn known_build_rows_size_every_spilled_partitions_filter() {
    use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
    use spilljoin::InputStatistics;
    const BUILD: i64 = 1 << 20;
    // Build keys 0, 10, 20, ...; probe keys 0..BUILD * 2: 1 in 10 has a partner.
    let build = || -> Vec<Result<RecordBatch, ArrowError>> {
        (0..BUILD / 8192)
            .map(|i| {
                let k: Int64Array = (i * 8192..(i + 1) * 8192).map(|v| v * 10).collect();
                Ok(RecordBatch::try_from_iter(vec![("rk", Arc::new(k) as ArrayRef)]).unwrap())
            })
            .collect()
    };
    let probe = || -> Vec<Result<RecordBatch, ArrowError>> {
        (0..BUILD * 2 / 8192)
            .map(|i| {
                let k: Int64Array = (i * 8192..(i + 1) * 8192).collect();
                Ok(RecordBatch::try_from_iter(vec![("lk", Arc::new(k) as ArrayRef)]).unwrap())
            })
            .collect()
    };
    // `statistics`: the inputs' rows and bytes as told to the join, as a multiple of
    // the real ones (none: not told).
    let run = |statistics: Option<u64>, partition_bits: Option<u32>| {
        let root = tempfile::tempdir().unwrap();
        let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
        drain(probe(), build(), ("lk", "rk"), |b| {
            let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(4 << 20));
            let b = b
                .with_join_type(JoinType::LeftAnti)
                .with_memory_pool(pool)
                .with_spill_manager(spill)
                .with_threads(2);
            let b = match partition_bits {
                Some(bits) => b.with_partition_bits(bits),
                None => b,
            };
            match statistics {
                Some(times) => b.with_statistics(
                    InputStatistics::new(
                        Some(BUILD as u64 * 16 * times),
                        Some(BUILD as u64 * 2 * times),
                    ),
                    InputStatistics::new(
                        Some(BUILD as u64 * 8 * times),
                        Some(BUILD as u64 * times),
                    ),
                ),
                None => b,
            }
        })
    };
    let without_a_partner = (BUILD * 2 - ((BUILD * 2 - 1) / 10 + 1)) as u64;
    let (rows, known) = run(Some(1), None);
    assert_eq!(rows as u64, without_a_partner);
    assert!(known.partitions_spilled > 4, "{known:?}");
    let skipped = |m: &JoinMetrics| m.probe_rows_skipped as f64 / without_a_partner as f64;
    // 8 bits a spilled row here (the limit's quarter would allow more), about 5%
    // false positives; the rest of those rows are in partitions kept in memory (and
    // a partition that spilled beyond those expected may have no filter).
    let spilled_share = known.build_rows_spilled as f64 / BUILD as f64;
    assert!(
        skipped(&known) > 0.8 * spilled_share,
        "skipped {:.3} of {spilled_share:.3}: {known:?}",
        skipped(&known)
    );
    let (rows, unknown) = run(None, None);
    assert_eq!(rows as u64, without_a_partner);
    assert!(skipped(&unknown) < skipped(&known), "{unknown:?}");
    // Told of 16 times the rows, the limit's quarter gives filters of under one bit a
    // row: none is made, and the answer is the same (the sides as before: the right
    // builds). The fan-out is pinned to what exact statistics choose, which the
    // inflated ones would raise; the probe's trial counts every row a filter skips,
    // so any filter at all would show.
    let exact_bits =
        spilljoin::partition_bits_for(Some(BUILD as u64 * 8), Some(BUILD as u64), 4 << 20, 2, 8192);
    let (rows, thin) = run(Some(16), Some(exact_bits));
    assert_eq!(rows as u64, without_a_partner);
    assert!(thin.partitions_spilled > 4, "{thin:?}");
    assert_eq!(thin.build_rows, BUILD as u64, "{thin:?}");
    assert_eq!(thin.probe_rows_skipped, 0, "{thin:?}");
}

/// Where only the probe side's key set counts (build-side semi, anti, mark and `NOT
/// IN`, with no residual filter), probe rows that repeat the key of the row before
/// them — the line items of one order, say — are not spilled: each run of equal keys
/// is written once. Joins that output or filter probe rows write every row.
#[test]
fn build_side_existence_joins_spill_a_run_of_equal_probe_keys_once() {
    use spilljoin::{JoinFilter, Side};
    const PROBE: i64 = 40_000;
    // Probe keys 0, 0, 0, 0, 1, 1, 1, 1, ...: 10 000 keys, each in a run of four.
    let probe = || -> Vec<Result<RecordBatch, ArrowError>> {
        (0..PROBE / 1000)
            .map(|i| {
                let range = i * 1000..(i + 1) * 1000;
                let k: Int64Array = range.clone().map(|v| v / 4).collect();
                let v: Int64Array = range.collect();
                Ok(RecordBatch::try_from_iter(vec![
                    ("la", Arc::new(k) as ArrayRef),
                    ("lb", Arc::new(v) as ArrayRef),
                ])
                .unwrap())
            })
            .collect()
    };
    let run = |join_type: JoinType, filter: bool| {
        let root = tempfile::tempdir().unwrap();
        let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path())).unwrap();
        drain(probe(), input("r"), ("la", "ra"), |b| {
            let b = b
                .with_join_type(join_type)
                .with_memory_pool(Arc::new(UnboundedMemoryPool::new()))
                .with_spill_manager(spill)
                .with_force_spill(1.0)
                .with_partition_bits(2)
                .with_threads(2);
            if filter {
                // `lb >= 0`: passes every pair, but reads the probe row.
                b.with_filter(JoinFilter::new(vec![(Side::Left, 1)], |b: &RecordBatch| {
                    arrow_ord::cmp::gt_eq(b.column(0), &Int64Array::new_scalar(0))
                }))
            } else {
                b
            }
        })
    };
    let keys = PROBE as u64 / 4;
    for (join_type, rows) in [
        (JoinType::RightSemi, keys),
        (JoinType::RightAnti, ROWS as u64 - keys),
        (JoinType::RightNotIn, ROWS as u64 - keys),
        (JoinType::LeftMark, PROBE as u64),
    ] {
        let (out, m) = run(join_type, false);
        assert_eq!(out as u64, rows, "{join_type}: {m:?}");
        let spilled = if join_type == JoinType::LeftMark {
            // (Its probe rows are output: every one is spilled.)
            PROBE as u64
        } else {
            keys
        };
        assert_eq!(m.probe_rows_spilled, spilled, "{join_type}: {m:?}");
        if join_type.is_null_aware() {
            continue; // (`NOT IN` takes no residual filter.)
        }
        let (out, m) = run(join_type, true);
        assert_eq!(out as u64, rows, "{join_type} with a filter: {m:?}");
        assert_eq!(m.probe_rows_spilled, PROBE as u64, "{join_type}: {m:?}");
    }
    // Pairs need every probe row.
    let (out, m) = run(JoinType::Inner, false);
    assert_eq!(
        (out, m.probe_rows_spilled),
        (PROBE as usize, PROBE as u64),
        "{m:?}"
    );
}

/// NULL keys that can never match do not pile into one partition: a build side
/// whose keys are all NULL, several times the limit, is kept aside (a build-
/// preserving join outputs it at the end) or dropped (inner) without being
/// partitioned, so nothing repartitions or falls back. With nulls equal to nulls
/// the same rows are one ordinary key: they are partitioned, their partition spills,
/// and its pair is joined building on its 10 probe rows.
#[test]
fn null_keys_that_never_match_are_not_partitioned() {
    use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
    use spilljoin::NullEquality;
    let build_rows = 200_000;
    let nulls = |prefix: &str, rows: usize, null_every: usize| -> Vec<_> {
        (0..rows)
            .step_by(8192)
            .map(|start| {
                let range = start..(start + 8192).min(rows);
                let a: Int64Array = range
                    .clone()
                    .map(|i| (i % null_every != 0).then_some(i as i64))
                    .collect();
                let b: Int64Array = range.map(|i| i as i64).collect();
                Ok(RecordBatch::try_from_iter(vec![
                    (format!("{prefix}a"), Arc::new(a) as ArrayRef),
                    (format!("{prefix}b"), Arc::new(b) as ArrayRef),
                ])
                .unwrap())
            })
            .collect()
    };
    // 3.2 MB of build rows, every key NULL, under 1 MiB; 20 000 probe rows of which
    // every 2000th has a NULL key.
    let run = |join_type: JoinType, null_equality: NullEquality| {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 20));
        let result = drain(
            nulls("l", 20_000, 2000),
            nulls("r", build_rows, 1),
            ("la", "ra"),
            |b| {
                b.with_join_type(join_type)
                    .with_null_equality(null_equality)
                    .with_memory_pool(Arc::clone(&pool))
                    .with_force_spill(0.0)
                    .with_threads(2)
            },
        );
        assert_eq!(pool.reserved(), 0);
        result
    };
    // The right input builds: `right` keeps its rows, `inner` drops them.
    let (rows, m) = run(JoinType::Right, NullEquality::NullEqualsNothing);
    assert_eq!(rows, build_rows, "{m:?}");
    assert_eq!(
        (m.partitions_spilled, m.max_depth, m.fallbacks),
        (0, 0, 0),
        "{m:?}"
    );
    let (rows, m) = run(JoinType::Inner, NullEquality::NullEqualsNothing);
    assert_eq!(rows, 0, "{m:?}");
    assert_eq!(
        (m.build_rows_spilled, m.partitions_spilled),
        (0, 0),
        "{m:?}"
    );
    // Nulls equal: every build row meets each of the 10 NULL probe rows.
    let (rows, m) = run(JoinType::Inner, NullEquality::NullEqualsNull);
    assert_eq!(rows, build_rows * 10, "{m:?}");
    assert!(m.partitions_spilled > 0 && m.swapped_pairs > 0, "{m:?}");
}
