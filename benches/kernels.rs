//! The join's kernels, alone and through the public API.
//!
//! Kernels (one call over 1M rows at once, buffers reused between iterations):
//! - `hash u64 1M`, `hash utf8 1M` (strings of 8-24 bytes), `hash 2 cols i32+utf8 1M`:
//!   [`hash_keys`];
//! - `table build 1M unique`: [`ChainedTable::build`] over the hashes of 1M unique keys
//!   (its two `u32` arrays are allocated inside the measurement, as in the join);
//! - `table build 1M dense (key-indexed)`: [`ChainedTable::build_direct`] over 1M
//!   unique keys 0..1M, shuffled (its bounds found inside the measurement);
//! - `partition group 1M 16-way`: [`PartitionedRows::group`] with 4 radix bits.
//!
//! Whole joins (`HashJoinBuilder` ... `.with_threads(1)`, inputs as `Vec`s of
//! 8192-row batches, the output stream drained and its rows summed). The build side
//! is the right input; its key is `u64` unless stated and its payload one `i64`, as is
//! the probe side's. Every key universe is shuffled independently per side.
//! - `build u64 1M (probe empty)`: the build phase alone, to subtract from the others;
//! - `probe u64 1M unique build 1M`: inner, every probe row matches one build row;
//! - `probe u64 1M unique build 1M dense keys`: the same with keys 0..1M, so the
//!   build is indexed by key (one key index shared by the partitions);
//! - `probe u64 4M dup=4`: build 1M unique keys, probe 4M rows (each key 4 times);
//! - `probe u64 4M dup=4 threads=2`: the same with two worker threads;
//! - `probe u64 4M dup=4 threads=2 streams=2`: the same with each input split into two
//!   streams (`execute_partitioned`): `execute` hands each input to one worker, so
//!   only this shape lets two workers read and probe at once;
//! - `probe 1:N u64 build 1M dup=4 probe 1M`: 250K keys, 4 build rows each; each probe
//!   row matches 4 build rows (4M output rows);
//! - `probe utf8 keys 1M`: as the first, with unique 8-24 byte string keys;
//! - `semi u64 4M`: left semi, the `dup=4` shape (every probe row matches);
//! - `anti u64 4M (50% match)`: left anti, 4M probe rows of which half match;
//! - `inner with filter u64 1M`: the first shape with `left.v < right.v` (about half
//!   the pairs pass);
//! - `gather 4 payload cols per side 1M`: the first shape with `i64, f64, utf8, i32`
//!   payload columns on each side (10 output columns).
//!
//! `1M` is 2^20 rows. Throughput is rows: the rows of the one input for the kernels,
//! build plus probe input rows for the whole joins.
//!
//! Run: `cargo bench --bench kernels`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_ord::cmp::lt;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use spilljoin::hash::hash_keys;
use spilljoin::partition::{HashBits, PartitionedRows};
use spilljoin::table::ChainedTable;
use spilljoin::{HashJoin, HashJoinBuilder, JoinFilter, JoinType, Side};

const SEED: u64 = 0x6B_E4E1;
const M: usize = 1 << 20;
const BATCH_ROWS: usize = 8192;

fn rng(salt: u64) -> StdRng {
    StdRng::seed_from_u64(SEED ^ salt)
}

/// Distinct, scattered `u64` key number `i` (multiplying by an odd number is a
/// bijection of `u64`).
fn key_of(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A random string of 8-24 lowercase letters.
fn text(rng: &mut StdRng) -> String {
    let len = rng.random_range(8..=24);
    (0..len)
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect()
}

/// Unique string key number `i`: 8-24 bytes, random letters ending in `i` in hex.
fn text_key(rng: &mut StdRng, i: usize) -> String {
    let len = rng.random_range(8..=24);
    let mut s: String = (0..len - 5)
        .map(|_| rng.random_range(b'a'..=b'z') as char)
        .collect();
    s.push_str(&format!("{i:05x}"));
    s
}

/// Key numbers `0..universe`, each `copies` times, shuffled.
fn shuffled(universe: usize, copies: usize, rng: &mut StdRng) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..copies).flat_map(|_| 0..universe).collect();
    ids.shuffle(rng);
    ids
}

/// One input in batches of [`BATCH_ROWS`]; `column(c, ids)` makes column `c` of the
/// rows with key numbers `ids`. Every batch has its own buffers, as a reader's would.
fn batches(
    schema: &SchemaRef,
    ids: &[usize],
    column: impl Fn(usize, &[usize]) -> ArrayRef,
) -> Vec<RecordBatch> {
    ids.chunks(BATCH_ROWS)
        .map(|chunk| {
            let columns = (0..schema.fields().len())
                .map(|c| column(c, chunk))
                .collect();
            RecordBatch::try_new(Arc::clone(schema), columns).expect("valid batch")
        })
        .collect()
}

fn schema(fields: &[(&str, DataType)]) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .iter()
            .map(|(name, t)| Field::new(*name, t.clone(), false))
            .collect::<Vec<_>>(),
    ))
}

/// A `u64` key column and an `i64` payload column (`values[id]`).
fn u64_input(prefix: &str, ids: &[usize], values: &[i64]) -> (SchemaRef, Vec<RecordBatch>) {
    keyed_input(prefix, ids, values, key_of)
}

/// Like [`u64_input`], the key being `key(id)`.
fn keyed_input(
    prefix: &str,
    ids: &[usize],
    values: &[i64],
    key: fn(usize) -> u64,
) -> (SchemaRef, Vec<RecordBatch>) {
    let schema = schema(&[
        (&format!("{prefix}k"), DataType::UInt64),
        (&format!("{prefix}v"), DataType::Int64),
    ]);
    let batches = batches(&schema, ids, |c, chunk| match c {
        0 => Arc::new(UInt64Array::from_iter_values(chunk.iter().map(|&i| key(i)))),
        _ => Arc::new(Int64Array::from_iter_values(
            chunk.iter().map(|&i| values[i]),
        )),
    });
    (schema, batches)
}

fn random_values(n: usize, rng: &mut StdRng) -> Vec<i64> {
    (0..n).map(|_| rng.random_range(0..1_000_000)).collect()
}

/// A join of two prepared inputs and the output row count it must produce.
struct JoinCase {
    join: HashJoin,
    probe: Vec<RecordBatch>,
    build: Vec<RecordBatch>,
    output_rows: usize,
    /// Each input is split into this many streams (`execute_partitioned`) when above 1.
    streams: usize,
}

impl JoinCase {
    fn new(
        probe: (SchemaRef, Vec<RecordBatch>),
        build: (SchemaRef, Vec<RecordBatch>),
        on: (&str, &str),
        configure: impl FnOnce(HashJoinBuilder) -> HashJoinBuilder,
        output_rows: usize,
    ) -> Self {
        let join = configure(HashJoinBuilder::new(probe.0, build.0, [on]).with_threads(1))
            .build()
            .expect("valid join");
        Self {
            join,
            probe: probe.1,
            build: build.1,
            output_rows,
            streams: 1,
        }
    }

    fn input_rows(&self) -> u64 {
        self.probe
            .iter()
            .chain(&self.build)
            .map(|b| b.num_rows() as u64)
            .sum()
    }

    fn with_streams(mut self, streams: usize) -> Self {
        self.streams = streams;
        self
    }

    fn run(&self) -> usize {
        let output = if self.streams == 1 {
            let left: Vec<_> = self.probe.iter().cloned().map(Ok).collect();
            let right: Vec<_> = self.build.iter().cloned().map(Ok).collect();
            self.join.execute(left, right)
        } else {
            let split = |batches: &[RecordBatch]| -> Vec<_> {
                batches
                    .chunks(batches.len().div_ceil(self.streams).max(1))
                    .map(|chunk| {
                        chunk
                            .iter()
                            .cloned()
                            .map(Ok)
                            .collect::<Vec<_>>()
                            .into_iter()
                    })
                    .collect()
            };
            self.join
                .execute_partitioned(split(&self.probe), split(&self.build))
        };
        output
            .expect("join starts")
            .map(|batch| batch.expect("join succeeds").num_rows())
            .sum()
    }

    fn bench(self, group: &mut BenchmarkGroup<'_, WallTime>, name: &str) {
        group.throughput(Throughput::Elements(self.input_rows()));
        let mut checked = false;
        group.bench_function(name, |b| {
            // Checked here rather than up front, so only when the benchmark is selected.
            if !checked {
                assert_eq!(self.run(), self.output_rows, "{name}: wrong output rows");
                checked = true;
            }
            b.iter(|| black_box(self.run()))
        });
    }
}

/// The matches of `probes` (taken in `order`) among `keys`, indexed by `table`, whose
/// first entry for probe `i` is `first(i)`: chains walked and keys compared as the
/// probe does.
fn lookups(
    table: &ChainedTable,
    keys: &[u64],
    probes: &[u64],
    order: &[usize],
    first: impl Fn(usize) -> u32,
) -> usize {
    let mut found = 0usize;
    for &i in order {
        table.for_each_candidate_from(first(i), 0, &[], false, |row| {
            found += usize::from(keys[row] == probes[i]);
            std::ops::ControlFlow::Continue(())
        });
    }
    found
}

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("kernel");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(M as u64));

    let mut r = rng(1);
    let u64s: ArrayRef = Arc::new(UInt64Array::from_iter_values((0..M).map(|_| r.random())));
    let strings: ArrayRef = Arc::new(StringArray::from_iter_values((0..M).map(|_| text(&mut r))));
    let i32s: ArrayRef = Arc::new(Int32Array::from_iter_values((0..M).map(|_| r.random())));
    let mut hashes = Vec::with_capacity(M);
    for (name, columns) in [
        ("hash u64 1M", vec![Arc::clone(&u64s)]),
        ("hash utf8 1M", vec![Arc::clone(&strings)]),
        ("hash 2 cols i32+utf8 1M", vec![i32s, Arc::clone(&strings)]),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                hash_keys(black_box(&columns), M, &mut hashes).expect("hashable");
                black_box(&hashes);
            })
        });
    }

    let unique: ArrayRef = Arc::new(UInt64Array::from_iter_values(
        shuffled(M, 1, &mut r).into_iter().map(key_of),
    ));
    hash_keys(&[unique], M, &mut hashes).expect("hashable");
    group.bench_function("table build 1M unique", |b| {
        b.iter(|| ChainedTable::build(black_box(&hashes), |_| true))
    });
    let dense: Vec<u64> = shuffled(M, 1, &mut r)
        .into_iter()
        .map(|i| i as u64)
        .collect();
    group.bench_function("table build 1M dense (key-indexed)", |b| {
        b.iter(|| {
            let (min, span) = ChainedTable::direct_span(black_box(&dense)).expect("dense keys");
            ChainedTable::build_direct(&dense, min, span)
        })
    });
    // Keys as one partition of a hash-partitioned dense column holds them: every
    // 64th value of a wide range on average, in key order (TPC-H's `lineitem` and
    // `orders` by order key), looked up in key order 4 times each.
    let mut sparse: Vec<u64> = (0..M as u64)
        .map(|i| i * 64 + r.random_range(0..64u64))
        .collect();
    sparse.sort_unstable();
    let probes: Vec<u64> = sparse.iter().flat_map(|&k| [k; 4]).collect();
    group.bench_function("table build 1M sparse (value-bucketed)", |b| {
        b.iter(|| ChainedTable::build_ranged(black_box(&sparse)).expect("evenly spread keys"))
    });
    let ranged = ChainedTable::build_ranged(&sparse).expect("evenly spread keys");
    let mut sparse_hashes = Vec::with_capacity(M);
    let sparse_column: ArrayRef = Arc::new(UInt64Array::from(sparse.clone()));
    hash_keys(&[sparse_column], M, &mut sparse_hashes).expect("hashable");
    let hashed = ChainedTable::build(&sparse_hashes, |_| true);
    let probe_column: ArrayRef = Arc::new(UInt64Array::from(probes.clone()));
    let mut probe_hashes = Vec::with_capacity(probes.len());
    hash_keys(&[probe_column], probes.len(), &mut probe_hashes).expect("hashable");
    let in_key_order: Vec<usize> = (0..probes.len()).collect();
    let mut at_random = in_key_order.clone();
    at_random.shuffle(&mut r);
    group.throughput(Throughput::Elements(probes.len() as u64));
    // The same lookups in key order and in random order (no locality for either).
    for (order_name, order) in [
        ("in key order", &in_key_order),
        ("in random order", &at_random),
    ] {
        group.bench_function(
            format!("lookup 4M {order_name}, sparse keys: value-bucketed"),
            |b| {
                b.iter(|| {
                    black_box(lookups(&ranged, &sparse, &probes, order, |i| {
                        ranged.first_ranged(probes[i])
                    }))
                })
            },
        );
        group.bench_function(
            format!("lookup 4M {order_name}, sparse keys: hashed"),
            |b| {
                b.iter(|| {
                    black_box(lookups(&hashed, &sparse, &probes, order, |i| {
                        hashed.first(probe_hashes[i])
                    }))
                })
            },
        );
    }
    group.throughput(Throughput::Elements(M as u64));
    let mut grouped = PartitionedRows::default();
    group.bench_function("partition group 1M 16-way", |b| {
        b.iter(|| {
            grouped.group(HashBits::new(4), black_box(&hashes), None);
            black_box(&grouped.rows);
        })
    });
    group.finish();
}

fn joins(c: &mut Criterion) {
    let mut group = c.benchmark_group("join");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    let mut r = rng(2);
    let inner = |builder: HashJoinBuilder| builder;
    let on = ("pk", "bk");

    // Build 1M unique keys; their payload values.
    let build_ids = shuffled(M, 1, &mut r);
    let build_values = random_values(M, &mut r);
    let build_1m = || u64_input("b", &build_ids, &build_values);
    let probe_values = random_values(3 * M, &mut r);

    JoinCase::new(u64_input("p", &[], &probe_values), build_1m(), on, inner, 0)
        .bench(&mut group, "build u64 1M (probe empty)");

    let probe_1m = shuffled(M, 1, &mut r);
    JoinCase::new(
        u64_input("p", &probe_1m, &probe_values),
        build_1m(),
        on,
        inner,
        M,
    )
    .bench(&mut group, "probe u64 1M unique build 1M");

    // The same with dense keys (the ids themselves): the build gets a key index.
    let dense = |i: usize| i as u64;
    JoinCase::new(
        keyed_input("p", &probe_1m, &probe_values, dense),
        keyed_input("b", &build_ids, &build_values, dense),
        on,
        inner,
        M,
    )
    .bench(&mut group, "probe u64 1M unique build 1M dense keys");

    let probe_4m = shuffled(M, 4, &mut r);
    for (threads, streams) in [(1, 1), (2, 1), (2, 2)] {
        let name = match (threads, streams) {
            (1, 1) => "probe u64 4M dup=4".to_string(),
            (t, 1) => format!("probe u64 4M dup=4 threads={t}"),
            (t, s) => format!("probe u64 4M dup=4 threads={t} streams={s}"),
        };
        JoinCase::new(
            u64_input("p", &probe_4m, &probe_values),
            build_1m(),
            on,
            |b| b.with_threads(threads),
            4 * M,
        )
        .with_streams(streams)
        .bench(&mut group, &name);
    }

    let build_dup = shuffled(M / 4, 4, &mut r);
    let probe_dup = shuffled(M / 4, 4, &mut r);
    JoinCase::new(
        u64_input("p", &probe_dup, &probe_values),
        u64_input("b", &build_dup, &build_values),
        on,
        inner,
        4 * M,
    )
    .bench(&mut group, "probe 1:N u64 build 1M dup=4 probe 1M");

    {
        let texts: Vec<String> = (0..M).map(|i| text_key(&mut r, i)).collect();
        let utf8_input = |prefix: &str, ids: &[usize], values: &[i64]| {
            let schema = schema(&[
                (&format!("{prefix}k"), DataType::Utf8),
                (&format!("{prefix}v"), DataType::Int64),
            ]);
            let batches = batches(&schema, ids, |c, chunk| match c {
                0 => Arc::new(StringArray::from_iter_values(
                    chunk.iter().map(|&i| &texts[i]),
                )),
                _ => Arc::new(Int64Array::from_iter_values(
                    chunk.iter().map(|&i| values[i]),
                )),
            });
            (schema, batches)
        };
        JoinCase::new(
            utf8_input("p", &probe_1m, &probe_values),
            utf8_input("b", &build_ids, &build_values),
            on,
            inner,
            M,
        )
        .bench(&mut group, "probe utf8 keys 1M");
    }

    JoinCase::new(
        u64_input("p", &probe_4m, &probe_values),
        build_1m(),
        on,
        |b| b.with_join_type(JoinType::LeftSemi),
        4 * M,
    )
    .bench(&mut group, "semi u64 4M");

    // Key numbers M..3M are not in the build side: each of the 2M probe rows with
    // them is output, the 2M with a key number below M (each twice) are not.
    let mut probe_anti = shuffled(M, 2, &mut r);
    probe_anti.extend(M..3 * M);
    probe_anti.shuffle(&mut r);
    JoinCase::new(
        u64_input("p", &probe_anti, &probe_values),
        build_1m(),
        on,
        |b| b.with_join_type(JoinType::LeftAnti),
        2 * M,
    )
    .bench(&mut group, "anti u64 4M (50% match)");

    let passing = (0..M)
        .filter(|&i| probe_values[i] < build_values[i])
        .count();
    JoinCase::new(
        u64_input("p", &probe_1m, &probe_values),
        build_1m(),
        on,
        |b| {
            b.with_filter(JoinFilter::new(
                vec![(Side::Left, 1), (Side::Right, 1)],
                |batch: &RecordBatch| lt(batch.column(0), batch.column(1)),
            ))
        },
        passing,
    )
    .bench(&mut group, "inner with filter u64 1M");

    {
        // Payload per key number, the same on both sides.
        let a: Vec<i64> = (0..M).map(|_| r.random()).collect();
        let f: Vec<f64> = (0..M).map(|_| r.random()).collect();
        let s: Vec<String> = (0..M).map(|_| text(&mut r)).collect();
        let n: Vec<i32> = (0..M).map(|_| r.random()).collect();
        let wide_input = |prefix: &str, ids: &[usize]| {
            let schema = schema(&[
                (&format!("{prefix}k"), DataType::UInt64),
                (&format!("{prefix}a"), DataType::Int64),
                (&format!("{prefix}f"), DataType::Float64),
                (&format!("{prefix}s"), DataType::Utf8),
                (&format!("{prefix}n"), DataType::Int32),
            ]);
            let batches = batches(&schema, ids, |c, chunk| -> ArrayRef {
                let ids = chunk.iter().copied();
                match c {
                    0 => Arc::new(UInt64Array::from_iter_values(ids.map(key_of))),
                    1 => Arc::new(Int64Array::from_iter_values(ids.map(|i| a[i]))),
                    2 => Arc::new(Float64Array::from_iter_values(ids.map(|i| f[i]))),
                    3 => Arc::new(StringArray::from_iter_values(ids.map(|i| &s[i]))),
                    _ => Arc::new(Int32Array::from_iter_values(ids.map(|i| n[i]))),
                }
            });
            (schema, batches)
        };
        JoinCase::new(
            wide_input("p", &probe_1m),
            wide_input("b", &build_ids),
            on,
            inner,
            M,
        )
        .bench(&mut group, "gather 4 payload cols per side 1M");
    }
    group.finish();
}

criterion_group!(benches, kernels, joins);
criterion_main!(benches);
