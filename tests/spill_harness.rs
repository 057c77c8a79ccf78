//! The fuzzed memory-limit harness: random joins under random memory limits, each
//! compared with the nested-loop reference join as a multiset.
//!
//! Inputs: uniform keys, zipf-like keys, one hot key holding most rows, all-null keys,
//! empty sides, wide string payloads; × every join type × filter × null equality ×
//! memory limits from below the floor to unlimited × batch sizes × partition fan-outs
//! × threads. Under a limit at or above the floor the join must finish with the
//! reference's answer; below it, it may only fail with `ResourcesExhausted`. Either
//! way, every reservation and every spill file must be gone afterwards.
//!
//! The default (CI) run checks [`DEFAULT_CASES`] cases; set `SPILLJOIN_HARNESS_CASES`
//! for a long run, `SPILLJOIN_HARNESS_CASE` to replay one.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::spill::{SpillConfig, SpillManager};
use spilljoin::{HashJoinBuilder, HotKeySplit, InputStatistics, JoinError, JoinType, NullEquality};

const DEFAULT_CASES: u64 = 300;

/// The smallest limit at which every case must finish.
const FLOOR_BYTES: usize = 4 << 20;

const LIMITS: [usize; 7] = [
    64 << 10,
    256 << 10,
    1 << 20,
    FLOOR_BYTES,
    6 << 20,
    16 << 20,
    usize::MAX,
];

#[derive(Debug, Clone, Copy)]
enum KeyShape {
    Uniform,
    Zipf,
    HotKey,
    AllNull,
}

fn keys(rng: &mut StdRng, shape: KeyShape, n: usize, domain: u64) -> Int64Array {
    (0..n)
        .map(|_| match shape {
            // A few keys past 32 bits: spill files then write the key column 8
            // bytes wide from some batch on (a new segment of the file).
            KeyShape::Uniform => (!rng.random_bool(0.05)).then(|| {
                let k = rng.random_range(0..domain) as i64;
                if rng.random_bool(0.01) {
                    k + (1 << 40)
                } else {
                    k
                }
            }),
            KeyShape::Zipf => {
                let u: f64 = rng.random();
                Some((domain as f64).powf(u) as i64)
            }
            KeyShape::HotKey => Some(if rng.random_bool(0.8) {
                7
            } else {
                rng.random_range(0..domain) as i64
            }),
            KeyShape::AllNull => None,
        })
        .collect()
}

fn side(
    rng: &mut StdRng,
    prefix: &str,
    shape: KeyShape,
    n: usize,
    domain: u64,
    wide: bool,
    fixed_width: bool,
) -> RecordBatch {
    let k = keys(rng, shape, n, domain);
    let v: Int64Array = (0..n)
        .map(|_| {
            (!rng.random_bool(0.1)).then(|| {
                let v = rng.random_range(0..20);
                // Now and then a value past 32 bits (see `keys`).
                if rng.random_bool(0.005) {
                    v - (1 << 40)
                } else {
                    v
                }
            })
        })
        .collect();
    let s: StringArray = (0..n)
        .map(|i| {
            let len = if wide {
                rng.random_range(40..200)
            } else {
                rng.random_range(0..12)
            };
            Some(format!("{prefix}{i}:{}", "x".repeat(len)))
        })
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new(format!("{prefix}k"), DataType::Int64, true),
        Field::new(format!("{prefix}v"), DataType::Int64, true),
        Field::new(format!("{prefix}s"), DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(k) as ArrayRef, Arc::new(v), Arc::new(s)],
    )
    .unwrap();
    // Without the string, every column has a fixed width: spilled probe rows are
    // gathered straight into their batch (src/gather/) instead of taken and
    // concatenated.
    if fixed_width {
        batch.project(&[0, 1]).unwrap()
    } else {
        batch
    }
}

/// What one case exercised.
#[derive(Debug, Default)]
struct Tally {
    cases: u64,
    finished: u64,
    exhausted_below_floor: u64,
    spilled: u64,
    recursed: u64,
    fallbacks: u64,
    hot_key_splits: u64,
    swapped: u64,
    probe_rows_skipped_by_bloom: u64,
}

fn run_case(case: u64, tally: &mut Tally) {
    let (seed, mut rng) = rng_for(case.wrapping_add(7_000_000));
    let join_type = JoinType::ALL[rng.random_range(0..JoinType::ALL.len())];
    let shapes = [
        KeyShape::Uniform,
        KeyShape::Zipf,
        KeyShape::HotKey,
        KeyShape::AllNull,
    ];
    let (lshape, rshape) = (
        shapes[rng.random_range(0..4)],
        shapes[rng.random_range(0..4)],
    );
    let size = |rng: &mut StdRng| [0, 1, 50, 400, 1500, 3000][rng.random_range(0..6)];
    let (ln, rn) = (size(&mut rng), size(&mut rng));
    let domain = [3, 50, 1000, 100_000][rng.random_range(0..4)];
    let wide = rng.random_bool(0.5);
    // Not drawn from `rng`, so that every other choice stays what it was for the
    // case number (the CI mode's 300 cases keep their recursions and fallbacks).
    let fixed_width = case % 5 >= 3;
    // The inputs' sizes, as statistics would give them before they are read: none,
    // right, or a thousand times too large (filters sized and reserved for rows that
    // never come). Statistics also let the smaller input build.
    let statistics = ["none", "exact", "too large"][(case / 5 % 3) as usize];
    let left = side(&mut rng, "l", lshape, ln, domain, wide, fixed_width);
    let right = side(&mut rng, "r", rshape, rn, domain, wide, fixed_width);
    let null_equality = if !join_type.is_null_aware() && rng.random_bool(0.3) {
        NullEquality::NullEqualsNull
    } else {
        NullEquality::NullEqualsNothing
    };
    let filter = !join_type.is_null_aware() && rng.random_bool(0.3);
    let limit = LIMITS[rng.random_range(0..LIMITS.len())];
    let batch_size = [1, 7, 64, 1000, 8192][rng.random_range(0..5)];
    let input_rows = [1, 13, 100, 1024][rng.random_range(0..4)];
    let threads = rng.random_range(1..=4);
    let bits = [0, 2, 4, 6][rng.random_range(0..4)];
    let force = [0.0, 0.0, 0.5, 1.0][rng.random_range(0..4)];
    let hot_split =
        [HotKeySplit::Auto, HotKeySplit::Always, HotKeySplit::Never][rng.random_range(0..3)];
    // Forced spilling also below level 0, for a quarter of the forced cases: every
    // spilled pair then repartitions, and one whose next level has one partition
    // spills that too and ends in the chunked fallback. (Not drawn from `rng`, as
    // `fixed_width`.)
    let force_depth = if force > 0.0 {
        [0, 0, 1, spilljoin::MAX_DEPTH][(case / 15 % 4) as usize]
    } else {
        0
    };
    let context = format!(
        "case {case} (seed {seed}): {join_type} {lshape:?}x{rshape:?} left={ln} right={rn} domain={domain} wide={wide} fixed_width={fixed_width} \
         {null_equality:?} filter={filter} statistics={statistics} limit={limit} batch={batch_size} input_rows={input_rows} threads={threads} bits={bits} force={force} force_depth={force_depth} hot_split={hot_split:?}\n\
         replay: {}SPILLJOIN_HARNESS_CASE={case} cargo test --release --test spill_harness",
        seed_prefix()
    );
    let expected = reference_join(&left, &right, &[(0, 0)], join_type, filter, null_equality);

    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
    let spill_root = tempfile::tempdir().unwrap();
    let spill = SpillManager::new(SpillConfig::default().with_root_dir(spill_root.path())).unwrap();
    let mut builder = HashJoinBuilder::new(left.schema(), right.schema(), [("lk", "rk")])
        .with_join_type(join_type)
        .with_null_equality(null_equality)
        .with_memory_pool(Arc::clone(&pool))
        .with_spill_manager(spill.clone())
        .with_batch_size(batch_size)
        .with_threads(threads)
        .with_partition_bits(bits)
        .with_force_spill(force)
        .with_force_spill_depth(force_depth)
        .with_hot_key_split(hot_split);
    if filter {
        builder = builder.with_filter(less_than_filter(&left.schema(), &right.schema()));
    }
    if statistics != "none" {
        let scale = if statistics == "exact" { 1 } else { 1000 };
        let of = |b: &RecordBatch| {
            InputStatistics::new(
                Some(b.get_array_memory_size() as u64 * scale),
                Some(b.num_rows() as u64 * scale),
            )
        };
        builder = builder.with_statistics(of(&left), of(&right));
    }
    let join = builder.build().unwrap();
    let chunks = |b: &RecordBatch| -> Vec<Vec<Result<RecordBatch, arrow_schema::ArrowError>>> {
        let batches: Vec<_> = (0..b.num_rows())
            .step_by(input_rows)
            .map(|o| Ok(b.slice(o, input_rows.min(b.num_rows() - o))))
            .collect();
        // Spread the batches over `threads` streams.
        let mut streams: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, batch) in batches.into_iter().enumerate() {
            streams[i % threads].push(batch);
        }
        streams
    };
    let mut stream = join
        .execute_partitioned(
            chunks(&left).into_iter().map(|s| s.into_iter()).collect(),
            chunks(&right).into_iter().map(|s| s.into_iter()).collect(),
        )
        .unwrap();
    let mut output = Vec::new();
    let mut failure = None;
    for batch in stream.by_ref() {
        match batch {
            Ok(b) => {
                assert!(
                    b.num_rows() <= batch_size,
                    "a batch of {} rows\n{context}",
                    b.num_rows()
                );
                output.push(b);
            }
            Err(e) => failure = Some(e),
        }
    }
    let metrics = stream.metrics();
    drop(stream);
    tally.cases += 1;
    tally.spilled += (metrics.partitions_spilled > 0) as u64;
    tally.recursed += (metrics.max_depth > 0) as u64;
    tally.fallbacks += (metrics.fallbacks > 0) as u64;
    tally.hot_key_splits += (metrics.hot_key_splits > 0) as u64;
    tally.swapped += (metrics.swapped_pairs > 0) as u64;
    tally.probe_rows_skipped_by_bloom += metrics.probe_rows_skipped;
    match failure {
        None => {
            tally.finished += 1;
            let actual = rendered_rows(&output);
            if actual != expected {
                let missing: Vec<_> = expected
                    .iter()
                    .filter(|r| !actual.contains(r))
                    .take(3)
                    .collect();
                let extra: Vec<_> = actual
                    .iter()
                    .filter(|r| !expected.contains(r))
                    .take(3)
                    .collect();
                panic!(
                    "{} rows, expected {}\nmissing: {missing:?}\nextra: {extra:?}\nmetrics: {metrics:?}\n{context}",
                    actual.len(),
                    expected.len()
                );
            }
        }
        Some(JoinError::ResourcesExhausted { .. }) if limit < FLOOR_BYTES => {
            tally.exhausted_below_floor += 1
        }
        Some(e) => panic!("{e} ({e:?})\n{context}"),
    }
    assert_eq!(pool.reserved(), 0, "reservations left\n{context}");
    assert_eq!(spill.live_files(), 0, "spill files left\n{context}");
}

/// The longest one case may take (they take milliseconds) before the harness calls it
/// hung.
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Watches the case number stored in what it returns: a case that runs for longer
/// than [`CASE_TIMEOUT`] ends the process with its replay command, so that a join that
/// never ends fails the harness instead of running until CI's own limit.
/// `u64::MAX` means "no case running".
fn watchdog() -> Arc<AtomicU64> {
    let current = Arc::new(AtomicU64::new(u64::MAX));
    let watched = Arc::clone(&current);
    std::thread::spawn(move || {
        let mut seen = (u64::MAX, Instant::now());
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let case = watched.load(Ordering::Relaxed);
            if case != seen.0 {
                seen = (case, Instant::now());
            } else if case != u64::MAX && seen.1.elapsed() > CASE_TIMEOUT {
                // Straight to stderr: the test's captured output dies with the process.
                let _ = writeln!(
                    std::io::stderr(),
                    "case {case} still running after {CASE_TIMEOUT:?}: a hang\n\
                     replay: {}SPILLJOIN_HARNESS_CASE={case} cargo test --release --test spill_harness",
                    seed_prefix()
                );
                std::process::exit(101);
            }
        }
    });
    current
}

#[test]
fn random_joins_under_random_memory_limits_match_the_reference() {
    let mut tally = Tally::default();
    if let Some(case) = std::env::var("SPILLJOIN_HARNESS_CASE")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run_case(case, &mut tally);
        eprintln!("{tally:?}");
        return;
    }
    let cases = std::env::var("SPILLJOIN_HARNESS_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let current = watchdog();
    for case in 0..cases {
        current.store(case, Ordering::Relaxed);
        run_case(case, &mut tally);
    }
    current.store(u64::MAX, Ordering::Relaxed);
    eprintln!("{tally:?}");
    // The harness must keep exercising every path, whatever the dice say.
    assert!(
        tally.spilled * 5 >= tally.cases,
        "too few cases spilled: {tally:?}"
    );
    assert!(
        tally.recursed > 0 && tally.fallbacks > 0,
        "no recursion or no fallback: {tally:?}"
    );
    assert!(
        tally.swapped > 0,
        "no spilled pair swapped roles: {tally:?}"
    );
    assert!(
        tally.finished * 2 >= tally.cases,
        "too many cases failed below the floor: {tally:?}"
    );
}
