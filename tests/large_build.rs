//! Build partitions large enough that their gathered columns leave the heap for
//! growing memory maps (past 4 MiB a column), joined in memory, under a limit that
//! spills some of them, and with a composite key whose hashes are gathered as a
//! column: every output row is checked against a map from key to payload.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type};
use arrow_array::{Array, ArrayRef, Decimal128Array, Int64Array, RecordBatch};
use arrow_schema::ArrowError;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool, UnboundedMemoryPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, JoinType};

/// Build rows: key `i` (null every 97th row), `b` = `i % 5`, payload `i * 3` as a
/// decimal of 18 digits (null every 11th row). 1.2M rows in 2 partitions: ~9.6 MB of keys and
/// ~19 MB of payload each.
const BUILD_ROWS: i64 = 1_200_000;
/// Probe rows: keys `(j * 7919) % (2 * BUILD_ROWS)`, so about half have a partner.
const PROBE_ROWS: i64 = 300_000;

fn build_input() -> Vec<Result<RecordBatch, ArrowError>> {
    (0..BUILD_ROWS / 60_000)
        .map(|c| {
            let range = c * 60_000..(c + 1) * 60_000;
            let key: Int64Array = range.clone().map(|i| (i % 97 != 0).then_some(i)).collect();
            let b: Int64Array = range.clone().map(|i| i % 5).collect();
            let pay: Decimal128Array = range
                .map(|i| (i % 11 != 0).then_some(i128::from(i) * 3))
                .collect::<Decimal128Array>()
                // 18 digits: spill files narrow it to 8 bytes (spill/src/narrow.rs).
                .with_precision_and_scale(18, 0)?;
            RecordBatch::try_from_iter(vec![
                ("rk", Arc::new(key) as ArrayRef),
                ("rb", Arc::new(b) as ArrayRef),
                ("rpay", Arc::new(pay) as ArrayRef),
            ])
        })
        .collect()
}

fn probe_key(j: i64) -> i64 {
    (j * 7919) % (2 * BUILD_ROWS)
}

fn probe_input() -> Vec<Result<RecordBatch, ArrowError>> {
    (0..PROBE_ROWS / 10_000)
        .map(|c| {
            let range = c * 10_000..(c + 1) * 10_000;
            let key: Int64Array = range.clone().map(probe_key).collect();
            let b: Int64Array = range.map(|j| probe_key(j) % 5).collect();
            RecordBatch::try_from_iter(vec![
                ("lk", Arc::new(key) as ArrayRef),
                ("lb", Arc::new(b) as ArrayRef),
            ])
        })
        .collect()
}

/// An output row: the probe key (None without a partner), and the build payload
/// (None without a partner; `Some(None)` for a null payload).
type Row = (Option<i64>, Option<Option<i128>>);

/// Runs the join and returns its rows.
fn run(
    join_type: JoinType,
    composite: bool,
    pool: Arc<dyn MemoryPool>,
    limited: bool,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(root.path()))?;
    let schema = |input: &[Result<RecordBatch, ArrowError>]| match input.first() {
        Some(Ok(b)) => Ok(b.schema()),
        _ => Err("no first batch"),
    };
    let on: Vec<(&str, &str)> = if composite {
        vec![("lk", "rk"), ("lb", "rb")]
    } else {
        vec![("lk", "rk")]
    };
    let mut builder = HashJoinBuilder::new(schema(&probe_input())?, schema(&build_input())?, on)
        .with_join_type(join_type)
        .with_memory_pool(pool)
        .with_spill_manager(spill)
        .with_partition_bits(1)
        .with_threads(2);
    if !limited {
        // The in-memory run, whatever `SPILLJOIN_FORCE_SPILL` says.
        builder = builder.with_force_spill(0.0);
    }
    let mut stream = builder.build()?.execute(probe_input(), build_input())?;
    let mut rows = Vec::new();
    for batch in stream.by_ref() {
        let batch = batch?;
        let key = batch
            .column_by_name("lk")
            .ok_or("no lk")?
            .as_primitive::<Int64Type>();
        let pay = batch
            .column_by_name("rpay")
            .ok_or("no rpay")?
            .as_primitive::<Decimal128Type>();
        // Never null on the build side: null here means "no partner".
        let build_b = batch
            .column_by_name("rb")
            .ok_or("no rb")?
            .as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            // A build side that is null (no partner) is told apart from a null
            // payload by `rb`.
            let build = build_b
                .is_valid(i)
                .then(|| pay.is_valid(i).then(|| pay.value(i)));
            rows.push((key.is_valid(i).then(|| key.value(i)), build));
        }
    }
    let m = stream.metrics();
    assert_eq!(m.build_rows, BUILD_ROWS as u64, "{m:?}");
    if limited {
        assert!(m.partitions_spilled >= 1, "nothing spilled: {m:?}");
    } else {
        assert_eq!(m.partitions_spilled, 0, "{m:?}");
    }
    Ok(rows)
}

/// The expected rows: every probe row with its partner (inner, left), and for
/// `right`/`full` every unmatched build row once.
fn expected(join_type: JoinType) -> Vec<Row> {
    let payload = |i: i64| (i % 11 != 0).then_some(i128::from(i) * 3);
    let has_partner = |k: i64| k < BUILD_ROWS && k % 97 != 0;
    let mut rows = Vec::new();
    let mut matched: HashMap<i64, bool> = HashMap::new();
    for j in 0..PROBE_ROWS {
        let k = probe_key(j);
        if has_partner(k) {
            rows.push((Some(k), Some(payload(k))));
            matched.insert(k, true);
        } else if matches!(join_type, JoinType::Left | JoinType::Full) {
            rows.push((Some(k), None));
        }
    }
    if matches!(join_type, JoinType::Right | JoinType::Full) {
        for i in 0..BUILD_ROWS {
            if !matched.contains_key(&i) {
                rows.push((None, Some(payload(i))));
            }
        }
    }
    rows.sort();
    rows
}

#[test]
fn large_gathered_partitions_join_in_memory_and_spilled() -> Result<(), Box<dyn std::error::Error>>
{
    let unlimited = || -> Arc<dyn MemoryPool> { Arc::new(UnboundedMemoryPool::new()) };
    // Room for about one of the two partitions: the other is spilled.
    let limited = || -> Arc<dyn MemoryPool> { Arc::new(GreedyMemoryPool::new(48 << 20)) };
    for join_type in [
        JoinType::Inner,
        JoinType::Left,
        JoinType::Right,
        JoinType::Full,
    ] {
        let want = expected(join_type);
        for (composite, pool, is_limited, label) in [
            (false, unlimited(), false, "word key, in memory"),
            (true, unlimited(), false, "composite key, in memory"),
            (false, limited(), true, "word key, 48 MiB"),
            (true, limited(), true, "composite key, 48 MiB"),
        ] {
            let mut got = run(join_type, composite, pool, is_limited)?;
            got.sort();
            assert_eq!(got.len(), want.len(), "{join_type:?}, {label}");
            assert!(got == want, "{join_type:?}, {label}: rows differ");
        }
    }
    Ok(())
}
