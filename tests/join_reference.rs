//! Differential tests: the hash join against the nested-loop reference join, over
//! random inputs × every join type × key types × null equality × filter × batch sizes
//! × threads × partition fan-outs.
//!
//! A failure prints the seed and a command that replays just that case.

mod common;

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::DataType;
use common::*;
use rand::Rng;
use spilljoin::memory::{GreedyMemoryPool, MemoryPool};
use spilljoin::{HashJoinBuilder, InputStatistics, JoinType, NullEquality};

const BATCH_SIZES: [usize; 8] = [1, 2, 7, 49, 50, 51, 100, 8192];

/// How many random cases the default run checks (override with `SPILLJOIN_CASES`).
const DEFAULT_CASES: u64 = 1500;

struct Case {
    join_type: JoinType,
    left: RecordBatch,
    right: RecordBatch,
    keys: Vec<(usize, usize)>,
    filter: bool,
    null_equality: NullEquality,
    batch_size: usize,
    threads: usize,
    partition_bits: u32,
    input_rows: usize,
    /// Fraction of partitions spilled whatever the memory (0: only what
    /// `SPILLJOIN_FORCE_SPILL` says), so half the cases run through the spill path.
    force_spill: f64,
    /// The deepest level the forced fraction applies to (0: level 0 only).
    force_spill_depth: u32,
    /// Statistics that make the left input build (a swapped plan).
    swap: bool,
}

fn random_case(case: u64) -> (u64, Case) {
    let (seed, mut rng) = rng_for(case);
    let join_type = JoinType::ALL[rng.random_range(0..JoinType::ALL.len())];
    let types = key_types();
    let num_keys = if join_type.is_null_aware() {
        1
    } else {
        rng.random_range(1..=2)
    };
    let chosen: Vec<DataType> = (0..num_keys)
        .map(|_| types[rng.random_range(0..types.len())].clone())
        .collect();
    let domain = [1, 2, 5, 20, 1000][rng.random_range(0..5)];
    let null_rate = [0.0, 0.0, 0.1, 0.5, 1.0][rng.random_range(0..5)];
    let size = |rng: &mut rand::rngs::StdRng| [0, 1, 3, 17, 40, 90][rng.random_range(0..6)];
    let (ln, rn) = (size(&mut rng), size(&mut rng));
    let left = side(&mut rng, "l", &chosen, ln, domain, null_rate);
    let right = side(&mut rng, "r", &chosen, rn, domain, null_rate);
    let null_equality = if !join_type.is_null_aware() && rng.random_bool(0.4) {
        NullEquality::NullEqualsNull
    } else {
        NullEquality::NullEqualsNothing
    };
    let filter = !join_type.is_null_aware() && rng.random_bool(0.4);
    (
        seed,
        Case {
            join_type,
            keys: (0..num_keys).map(|i| (i, i)).collect(),
            left,
            right,
            filter,
            null_equality,
            batch_size: BATCH_SIZES[rng.random_range(0..BATCH_SIZES.len())],
            threads: rng.random_range(1..=4),
            partition_bits: [0, 1, 2, 4, 8][rng.random_range(0..5)],
            input_rows: rng.random_range(1..=30),
            force_spill: [0.0, 0.0, 0.5, 1.0][rng.random_range(0..4)],
            // Not drawn from `rng`, so that every other choice stays what it was
            // for the case number.
            force_spill_depth: [0, 0, 1, spilljoin::MAX_DEPTH][(case / 11 % 4) as usize],
            swap: rng.random_bool(0.5),
        },
    )
}

fn run_case(case: u64) {
    let (seed, c) = random_case(case);
    let seed_prefix = seed_prefix();
    let context = || {
        format!(
            "case {case} (seed {seed}): {} keys {:?} filter={} {:?} batch={} threads={} bits={} force_spill={} force_spill_depth={} swap={} left={} right={}\n\
             replay: {seed_prefix}SPILLJOIN_CASE={case} cargo test --test join_reference random_joins_match_the_reference",
            c.join_type,
            c.left.schema().fields().iter().take(c.keys.len()).map(|f| f.data_type().to_string()).collect::<Vec<_>>(),
            c.filter,
            c.null_equality,
            c.batch_size,
            c.threads,
            c.partition_bits,
            c.force_spill,
            c.force_spill_depth,
            c.swap,
            c.left.num_rows(),
            c.right.num_rows(),
        )
    };
    let expected = reference_join(
        &c.left,
        &c.right,
        &c.keys,
        c.join_type,
        c.filter,
        c.null_equality,
    );
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
    let (ls, rs) = (c.left.schema(), c.right.schema());
    let on: Vec<(String, String)> = c
        .keys
        .iter()
        .map(|&(l, r)| (ls.field(l).name().clone(), rs.field(r).name().clone()))
        .collect();
    let mut builder = HashJoinBuilder::new(ls.clone(), rs.clone(), on)
        .with_join_type(c.join_type)
        .with_null_equality(c.null_equality)
        .with_batch_size(c.batch_size)
        .with_threads(c.threads)
        .with_partition_bits(c.partition_bits)
        .with_memory_pool(Arc::clone(&pool));
    if c.filter {
        builder = builder.with_filter(less_than_filter(&ls, &rs));
    }
    if c.force_spill > 0.0 {
        builder = builder
            .with_force_spill(c.force_spill)
            .with_force_spill_depth(c.force_spill_depth);
    }
    if c.swap {
        builder = builder.with_statistics(
            InputStatistics::new(Some(1), None),
            InputStatistics::new(Some(2), None),
        );
    }
    let join = builder
        .build()
        .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let (mut lrng, mut rrng) = (rng_for(case ^ 1).1, rng_for(case ^ 2).1);
    let left_batches: Vec<_> = split(&mut lrng, &c.left, c.input_rows)
        .into_iter()
        .map(Ok)
        .collect();
    let right_batches: Vec<_> = split(&mut rrng, &c.right, c.input_rows)
        .into_iter()
        .map(Ok)
        .collect();
    let output: Vec<RecordBatch> = join
        .execute(left_batches, right_batches)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    for b in &output {
        assert!(
            b.num_rows() <= c.batch_size,
            "batch of {} rows\n{}",
            b.num_rows(),
            context()
        );
        assert!(b.num_rows() > 0, "empty output batch\n{}", context());
        assert_eq!(b.schema(), join.schema(), "{}", context());
    }
    let actual = rendered_rows(&output);
    if actual != expected {
        let missing: Vec<_> = expected
            .iter()
            .filter(|r| !actual.contains(r))
            .take(5)
            .collect();
        let extra: Vec<_> = actual
            .iter()
            .filter(|r| !expected.contains(r))
            .take(5)
            .collect();
        panic!(
            "{} rows, expected {}\nmissing (first 5): {missing:#?}\nextra (first 5): {extra:#?}\n{}",
            actual.len(),
            expected.len(),
            context()
        );
    }
    assert_eq!(
        pool.reserved(),
        0,
        "reservations left after the join\n{}",
        context()
    );
}

#[test]
fn random_joins_match_the_reference() {
    if let Some(case) = std::env::var("SPILLJOIN_CASE")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run_case(case);
        return;
    }
    let cases = std::env::var("SPILLJOIN_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    for case in 0..cases {
        run_case(case);
    }
}

/// Every join type at least once with every key type, so no combination depends on
/// the dice.
#[test]
fn every_join_type_with_every_key_type() {
    for (t, data_type) in key_types().into_iter().enumerate() {
        for (j, join_type) in JoinType::ALL.into_iter().enumerate() {
            let (_, mut rng) = rng_for((t * 100 + j) as u64 + 1_000_000);
            let left = side(&mut rng, "l", std::slice::from_ref(&data_type), 30, 8, 0.15);
            let right = side(&mut rng, "r", std::slice::from_ref(&data_type), 25, 8, 0.15);
            let expected = reference_join(
                &left,
                &right,
                &[(0, 0)],
                join_type,
                false,
                NullEquality::NullEqualsNothing,
            );
            let join = HashJoinBuilder::new(left.schema(), right.schema(), [("lk0", "rk0")])
                .with_join_type(join_type)
                .with_batch_size(7)
                .with_threads(2)
                .build()
                .unwrap();
            let output: Vec<RecordBatch> = join
                .execute(vec![Ok(left.clone())], vec![Ok(right.clone())])
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(
                rendered_rows(&output),
                expected,
                "{join_type} on {data_type}"
            );
        }
    }
}

/// Spilling forced below level 0 runs the spilled pairs' own levels through their
/// spill files: every pair repartitions, and a pair whose next level has a single
/// partition spills it too and is joined by the chunked fallback. Every join type,
/// with nulls and duplicates, gives the reference's answer, and the metrics show
/// that the pairs spilled again (forced at level 0 only, they do not).
#[test]
fn spilling_forced_below_level_zero_recurses_and_falls_back_with_the_same_answer() {
    let types = [DataType::Int64, DataType::Utf8];
    for (j, join_type) in JoinType::ALL.into_iter().enumerate() {
        let (_, mut rng) = rng_for(j as u64 + 2_000_000);
        // (A null in a `NOT IN` subquery would leave no pair to join.)
        let nulls = if join_type.is_null_aware() { 0.0 } else { 0.1 };
        let left = side(&mut rng, "l", &types, 700, 150, nulls);
        let right = side(&mut rng, "r", &types, 600, 150, nulls);
        let keys: &[(usize, usize)] = if join_type.is_null_aware() {
            &[(0, 0)]
        } else {
            &[(0, 0), (1, 1)]
        };
        let on: Vec<_> = [("lk0", "rk0"), ("lk1", "rk1")][..keys.len()].to_vec();
        let expected = reference_join(
            &left,
            &right,
            keys,
            join_type,
            false,
            NullEquality::NullEqualsNothing,
        );
        // (forced depth, deepest level allowed): `with_max_depth` below the forced
        // depth sends the pairs that would go deeper to the fallback instead.
        let max = spilljoin::MAX_DEPTH;
        for (depth, max_depth) in [(0, max), (1, max), (max, max), (max, 1), (max, 0)] {
            let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
            let join = HashJoinBuilder::new(left.schema(), right.schema(), on.clone())
                .with_join_type(join_type)
                .with_batch_size(64)
                .with_threads(2)
                .with_partition_bits(2)
                .with_memory_pool(Arc::clone(&pool))
                .with_force_spill(1.0)
                .with_force_spill_depth(depth)
                .with_max_depth(max_depth)
                .build()
                .unwrap();
            let (mut lrng, mut rrng) = (rng_for(j as u64 ^ 1).1, rng_for(j as u64 ^ 2).1);
            let batches = |rng: &mut rand::rngs::StdRng, b: &RecordBatch| -> Vec<_> {
                split(rng, b, 50).into_iter().map(Ok).collect()
            };
            let mut stream = join
                .execute(batches(&mut lrng, &left), batches(&mut rrng, &right))
                .unwrap();
            let output: Vec<RecordBatch> = stream
                .by_ref()
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{join_type} forced to depth {depth}: {e}"));
            let m = stream.metrics();
            let context = format!("{join_type} forced to depth {depth}, max depth {max_depth}");
            assert_eq!(rendered_rows(&output), expected, "{context}: {m:?}");
            // Forced at level 0, the pairs are joined at depth 1 and fit; forced
            // deeper, they spill again: a level below or the fallback. No level is
            // deeper than allowed, and the pairs at the deepest allowed level go to
            // the fallback.
            assert!(m.max_depth <= u64::from(max_depth), "{context}: {m:?}");
            if depth == 0 {
                assert_eq!((m.max_depth, m.fallbacks), (1, 0), "{context}: {m:?}");
            } else if max_depth < max {
                assert!(m.fallbacks >= 1, "{context}: {m:?}");
            } else {
                assert!(m.max_depth >= 2 || m.fallbacks >= 1, "{context}: {m:?}");
            }
            drop(stream);
            assert_eq!(pool.reserved(), 0, "{context}");
        }
    }
}

/// The hash-based reference (for inputs too large for nested loops: the `join_spill`
/// fuzz target) gives the nested-loop reference's answer on the random cases, which
/// cover every join type, key types, nulls, both null equalities and the filter.
#[test]
fn the_hash_reference_agrees_with_the_nested_loop_reference() {
    for case in 0..3000 {
        let (seed, c) = random_case(case);
        for null_equality in [c.null_equality, NullEquality::NullEqualsNull] {
            if c.join_type.is_null_aware() && null_equality == NullEquality::NullEqualsNull {
                continue;
            }
            let (l, r, keys) = (&c.left, &c.right, &c.keys[..]);
            assert_eq!(
                hash_reference_join(l, r, keys, c.join_type, c.filter, null_equality),
                reference_join(l, r, keys, c.join_type, c.filter, null_equality),
                "case {case} (seed {seed}): {} {null_equality:?} filter={}",
                c.join_type,
                c.filter
            );
        }
    }
}
